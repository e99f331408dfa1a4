//! A virtio-blk disk as a [`BlockDevice`], over virtio-drivers' split virtqueue and PCI
//! transport and the HAL's DMA memory (the virtio-net NIC's [`Bridge`]).
//!
//! virtio-drivers' own `VirtIOBlk` waits for the device without a bound and shares buffers
//! from the stack (its flush), which the identity HAL cannot translate; this driver speaks the
//! request protocol itself on virtio-drivers' `VirtQueue`: one request at a time, from one
//! block of DMA memory (the 16-byte request header and the status byte on its first page, up
//! to [`CHUNK`] bytes of data on the next pages), each wait bounded by a clock. Requests
//! larger than [`CHUNK`] go as several. A device that does not answer in time, or answers
//! with a request it was not given, leaves the disk broken: every later request fails with
//! [`BlockError::Io`] (the device may still write into the DMA block, never into the
//! caller's buffers; the block goes back to the HAL only after the device was reset).
//!
//! A request is complete when the device returned it with status OK: a write is then in the
//! device (on the medium, or in its write-back cache), and the caller's answer waits for it.
//! Flush is the device's own (`VIRTIO_BLK_T_FLUSH`), offered as the FLUSH feature; the cache
//! mode is read from the configuration (CONFIG_WCE) when offered, else deduced from FLUSH,
//! and reported as [`BlockDevice::volatile_cache`]. virtio-blk has no write with Force Unit
//! Access: the trait's default (write, then flush) gives it.
//!
//! The protocol (request header `{type u32, reserved u32, sector u64}`, device-written data,
//! a one-byte status; types In 0, Out 1, Flush 4) is the virtio specification's block device.

use core::ptr::NonNull;

use bareverbs::hal::virtio_net::virtio_drivers;
use bareverbs::hal::virtio_net::{self, Bridge, StaticHal};
use bareverbs::hal::{ConfigRegionAccess, DmaBlock, Hal, PAGE_SIZE, PciAddress};
use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::pci::PciTransport;
use virtio_drivers::transport::{DeviceType, Transport};

pub use crate::block::{BlockDevice, BlockError};

/// The virtio PCI vendor.
pub const VENDOR: u16 = 0x1AF4;
/// A transitional virtio-blk function.
pub const DEVICE_TRANSITIONAL: u16 = 0x1001;
/// A modern-only virtio-blk function (0x1040 + device type 2).
pub const DEVICE_MODERN: u16 = 0x1042;
/// Bytes of one sector, the unit of the protocol and this disk's block size.
pub const SECTOR: usize = 512;
/// The most data one request carries.
pub const CHUNK: usize = 64 * 1024;
/// Milliseconds a request may take before the disk is declared broken.
pub const TIMEOUT_MS: u64 = 10_000;

const QUEUE: u16 = 0;
/// Descriptors of the queue: a request takes three (header, data, status), one at a time.
const QUEUE_SIZE: usize = 4;
const PAGES: usize = 1 + CHUNK / PAGE_SIZE;
/// Where the status byte lies on the first page (the header takes bytes 0..16).
const STATUS_AT: usize = 64;
const REQ_IN: u32 = 0;
const REQ_OUT: u32 = 1;
const REQ_FLUSH: u32 = 4;
/// Where the `writeback` byte lies in the configuration space (after capacity 0..8,
/// size_max, seg_max, geometry, blk_size and the topology fields 24..32).
const CONFIG_WRITEBACK: usize = 32;

bareverbs::bitflags::bitflags! {
    /// The feature bits this driver negotiates.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Features: u64 {
        /// The disk is read-only.
        const RO = 1 << 5;
        /// The device has a write cache: Flush makes writes durable.
        const FLUSH = 1 << 9;
        /// The cache mode is in the configuration space (`writeback`, byte 32: 1 write-back,
        /// 0 write-through).
        const CONFIG_WCE = 1 << 11;
        /// The modern interface (a driver must take it when offered).
        const VERSION_1 = 1 << 32;
    }
}

/// Why a virtio-blk disk could not be brought up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VirtioBlkError {
    /// The [`StaticHal`] has no HAL installed yet.
    NoHal,
    /// No virtio-blk function there.
    NoDevice,
    /// The PCI transport could not be set up (capabilities, BARs).
    Transport(virtio_drivers::transport::pci::VirtioPciError),
    /// The device refused the driver (queue size, configuration space).
    Device(virtio_drivers::Error),
    /// DMA memory for the queue or the buffers is exhausted.
    OutOfDma,
}

impl core::fmt::Display for VirtioBlkError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            VirtioBlkError::NoHal => write!(f, "no HAL installed for virtio-drivers"),
            VirtioBlkError::NoDevice => write!(f, "no virtio-blk function there"),
            VirtioBlkError::Transport(e) => write!(f, "virtio PCI transport: {e}"),
            VirtioBlkError::Device(e) => write!(f, "virtio-blk device: {e}"),
            VirtioBlkError::OutOfDma => write!(f, "DMA memory exhausted"),
        }
    }
}

/// Whether a vendor/device ID pair is a virtio-blk function.
pub fn is_virtio_blk(vendor: u16, device: u16) -> bool {
    vendor == VENDOR && (device == DEVICE_TRANSITIONAL || device == DEVICE_MODERN)
}

/// The `n`th virtio-blk function on segment 0 (from 0), in address order.
pub fn find_nth<C: ConfigRegionAccess>(access: &C, n: usize) -> Option<PciAddress> {
    (0u32..256 * 32 * 8)
        .map(|i| PciAddress::new(0, (i >> 8) as u8, ((i >> 3) & 31) as u8, (i & 7) as u8))
        .filter(|&a| {
            // SAFETY: offset 0 exists in every function's configuration header; a read of an
            // absent function returns all-ones without side effects.
            let id = unsafe { access.read(a, 0) };
            is_virtio_blk(id as u16, (id >> 16) as u16)
        })
        .nth(n)
}

/// The first virtio-blk function on segment 0, in address order.
pub fn find<C: ConfigRegionAccess>(access: &C) -> Option<PciAddress> {
    virtio_net::find_with(access, is_virtio_blk)
}

/// Requests and failures counted by a [`VirtioBlk`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkStats {
    /// Requests the device completed with status OK.
    pub requests: u64,
    /// Bytes read from the disk.
    pub read: u64,
    /// Bytes written to the disk.
    pub written: u64,
    /// Flushes done.
    pub flushes: u64,
}

/// A virtio-blk disk: 512-byte blocks, one request at a time, polled.
pub struct VirtioBlk<S: StaticHal, T: Transport> {
    // Declared first: dropped first, so the device is reset (virtio-drivers' transports reset
    // it on drop) before the queue's rings and the buffers return to the HAL.
    transport: T,
    queue: VirtQueue<Bridge<S>, QUEUE_SIZE>,
    dma: Dma<S>,
    sectors: u64,
    features: Features,
    /// Whether the device caches writes until a flush (see [`VirtioBlk::volatile_cache`]).
    writeback: bool,
    clock: fn() -> u64,
    broken: bool,
    stats: BlkStats,
}

impl<S: StaticHal> VirtioBlk<S, PciTransport> {
    /// Brings up the virtio-blk function at `address` (memory decoding and bus mastering on,
    /// virtio-drivers' PCI transport over BARs the firmware assigned). `clock` gives
    /// milliseconds, for the bound on each request. On failure the command register is
    /// restored and everything allocated returned.
    ///
    /// # Safety
    ///
    /// As [`virtio_net::PciConfig::new`] for `pci`; the function at `address` is driven by nothing else
    /// while the value lives; its BARs lie where [`StaticHal::mmio_virt`] maps them.
    pub unsafe fn new_pci<C: ConfigRegionAccess>(
        pci: &C,
        address: PciAddress,
        clock: fn() -> u64,
    ) -> Result<Self, VirtioBlkError> {
        S::hal().ok_or(VirtioBlkError::NoHal)?;
        // SAFETY: our caller's promise.
        unsafe {
            virtio_net::with_function(pci, address, is_virtio_blk, |root, df| {
                PciTransport::new::<Bridge<S>, _>(root, df)
                    .map_err(VirtioBlkError::Transport)
                    .and_then(|t| Self::new(t, clock))
            })
        }
        .unwrap_or(Err(VirtioBlkError::NoDevice))
    }
}

impl<S: StaticHal, T: Transport> VirtioBlk<S, T> {
    /// Negotiates with the virtio-blk device behind `transport` and sets up its queue.
    pub fn new(mut transport: T, clock: fn() -> u64) -> Result<Self, VirtioBlkError> {
        let hal = S::hal().ok_or(VirtioBlkError::NoHal)?;
        if transport.device_type() != DeviceType::Block {
            return Err(VirtioBlkError::NoDevice);
        }
        // The DMA block first: dropped last on failure too (after the transport reset).
        let block = hal.dma_alloc(PAGES).map_err(|_| VirtioBlkError::OutOfDma)?;
        let dma = Dma::<S> {
            vaddr: block.vaddr,
            paddr: block.paddr,
            _hal: core::marker::PhantomData,
        };
        let features = transport.begin_init(Features::all());
        // Capacity: sectors, a u64 at configuration offset 0 (two u32 halves).
        let sectors = transport
            .read_consistent(|| {
                let lo = transport.read_config_space::<u32>(0)?;
                let hi = transport.read_config_space::<u32>(4)?;
                Ok(u64::from(lo) | u64::from(hi) << 32)
            })
            .map_err(VirtioBlkError::Device)?;
        // The cache mode, as the virtio specification has the driver deduce it: the
        // `writeback` byte when the device offers it; otherwise a cache exactly when the
        // device offers Flush.
        let writeback = if features.contains(Features::CONFIG_WCE) {
            transport
                .read_config_space::<u8>(CONFIG_WRITEBACK)
                .map_err(VirtioBlkError::Device)?
                != 0
        } else {
            features.contains(Features::FLUSH)
        };
        let queue = VirtQueue::new(&mut transport, QUEUE, false, false).map_err(|e| match e {
            virtio_drivers::Error::DmaError => VirtioBlkError::OutOfDma,
            e => VirtioBlkError::Device(e),
        })?;
        transport.finish_init();
        let mut disk = VirtioBlk {
            transport,
            queue,
            dma,
            sectors,
            features,
            writeback,
            clock,
            broken: false,
            stats: BlkStats::default(),
        };
        // Polled: no interrupts wanted.
        disk.queue.set_dev_notify(false);
        Ok(disk)
    }

    /// Whether the device is read-only.
    pub fn read_only(&self) -> bool {
        self.features.contains(Features::RO)
    }

    /// Whether the device has a write cache that Flush empties.
    pub fn has_flush(&self) -> bool {
        self.features.contains(Features::FLUSH)
    }

    /// Whether completed writes may sit in the device's volatile cache until a flush: the
    /// configuration's `writeback` byte when the device offers it, else whether it offers
    /// Flush (no Flush, no cache: writes go through).
    pub fn volatile_cache(&self) -> bool {
        self.writeback
    }

    /// Whether the device broke the protocol or stopped answering (the disk is dead then).
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Requests counted so far.
    pub fn stats(&self) -> BlkStats {
        self.stats
    }

    /// One request: `kind` at `sector`, with `len` bytes of the DMA block's data area (read by
    /// the device for Out, written by it for In), waited for at most [`TIMEOUT_MS`].
    fn request(&mut self, kind: u32, sector: u64, len: usize) -> Result<(), BlockError> {
        if self.broken {
            return Err(BlockError::Io);
        }
        debug_assert!(len <= CHUNK);
        let base = self.dma.vaddr.as_ptr();
        // SAFETY: the first page of the DMA block, which this value owns; no request is in
        // flight (one at a time, and a timed-out one leaves `broken` set), so the device does
        // not touch it now. Header at 0..16, status at STATUS_AT.
        let (hdr, status) = unsafe {
            let hdr = core::slice::from_raw_parts_mut(base, 16);
            hdr[0..4].copy_from_slice(&kind.to_le_bytes());
            hdr[4..8].fill(0);
            hdr[8..16].copy_from_slice(&sector.to_le_bytes());
            let status = core::slice::from_raw_parts_mut(base.add(STATUS_AT), 1);
            status[0] = 0xFF;
            (&*hdr, status)
        };
        // SAFETY: `len` <= CHUNK bytes from the second page: inside the block (PAGES pages).
        let data = unsafe { core::slice::from_raw_parts_mut(base.add(PAGE_SIZE), len) };
        let dev_writes = kind == REQ_IN;
        // SAFETY: the buffers lie in the DMA block, which outlives the request (dropped after
        // the device's reset), and are not touched by the CPU until `pop_used` returns them
        // (or ever again, if the device does not).
        let added = unsafe {
            match (len, dev_writes) {
                (0, _) => self.queue.add(&[hdr], &mut [&mut *status]),
                (_, true) => self.queue.add(&[hdr], &mut [&mut *data, &mut *status]),
                (_, false) => self.queue.add(&[hdr, &*data], &mut [&mut *status]),
            }
        };
        let token = added.map_err(|_| BlockError::Io)?;
        if self.queue.should_notify() {
            self.transport.notify(QUEUE);
        }
        let start = (self.clock)();
        loop {
            match self.queue.peek_used() {
                Some(t) if t == token => break,
                // A request nobody gave it: the device broke the protocol.
                Some(_) => {
                    self.broken = true;
                    return Err(BlockError::Io);
                }
                None => {}
            }
            if (self.clock)().wrapping_sub(start) > TIMEOUT_MS {
                self.broken = true;
                return Err(BlockError::Io);
            }
            core::hint::spin_loop();
        }
        // SAFETY: the very buffers `add` was given with this token.
        let popped = unsafe {
            match (len, dev_writes) {
                (0, _) => self.queue.pop_used(token, &[hdr], &mut [&mut *status]),
                (_, true) => self
                    .queue
                    .pop_used(token, &[hdr], &mut [&mut *data, &mut *status]),
                (_, false) => self
                    .queue
                    .pop_used(token, &[hdr, &*data], &mut [&mut *status]),
            }
        };
        if popped.is_err() {
            self.broken = true;
            return Err(BlockError::Io);
        }
        // SAFETY: the device returned the status byte (`pop_used` succeeded); read once.
        let st = unsafe { base.add(STATUS_AT).read_volatile() };
        if st != 0 {
            return Err(BlockError::Io);
        }
        self.stats.requests += 1;
        Ok(())
    }

    /// The DMA block's data area, `len` (<= [`CHUNK`]) bytes, for the CPU between requests.
    fn data(&mut self, len: usize) -> &mut [u8] {
        let len = len.min(CHUNK);
        // SAFETY: inside the block (second page on); no request in flight (`request` returns
        // only once the device gave the buffers back, or leaves the disk broken, after which
        // no path reads the data area for the caller).
        unsafe { core::slice::from_raw_parts_mut(self.dma.vaddr.as_ptr().add(PAGE_SIZE), len) }
    }

    /// The sectors of `len` bytes at `lba`, checked against the disk.
    fn span(&self, lba: u64, len: usize) -> Result<(), BlockError> {
        if !len.is_multiple_of(SECTOR) {
            return Err(BlockError::Misaligned);
        }
        let end = lba
            .checked_add((len / SECTOR) as u64)
            .ok_or(BlockError::OutOfRange)?;
        if end > self.sectors {
            return Err(BlockError::OutOfRange);
        }
        Ok(())
    }
}

impl<S: StaticHal, T: Transport> BlockDevice for VirtioBlk<S, T> {
    fn block_size(&self) -> u32 {
        SECTOR as u32
    }

    fn capacity(&self) -> u64 {
        self.sectors
    }

    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        self.span(lba, buf.len())?;
        for (i, part) in buf.chunks_mut(CHUNK).enumerate() {
            let sector = lba + (i * CHUNK / SECTOR) as u64;
            self.request(REQ_IN, sector, part.len())?;
            part.copy_from_slice(self.data(part.len()));
            self.stats.read += part.len() as u64;
        }
        Ok(())
    }

    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.span(lba, buf.len())?;
        if self.read_only() {
            return Err(BlockError::Io);
        }
        for (i, part) in buf.chunks(CHUNK).enumerate() {
            let sector = lba + (i * CHUNK / SECTOR) as u64;
            self.data(part.len()).copy_from_slice(part);
            self.request(REQ_OUT, sector, part.len())?;
            self.stats.written += part.len() as u64;
        }
        Ok(())
    }

    /// Returns once the device completed its Flush request (when it offers Flush; without
    /// it writes go through and there is nothing to flush). A failed or unanswered flush is
    /// [`BlockError::Io`].
    fn flush(&mut self) -> Result<(), BlockError> {
        if self.has_flush() {
            self.request(REQ_FLUSH, 0, 0)?;
            self.stats.flushes += 1;
        }
        Ok(())
    }

    fn volatile_cache(&self) -> bool {
        self.writeback
    }

    fn write_zeroes(&mut self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        let bytes = blocks
            .checked_mul(SECTOR as u64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or(BlockError::OutOfRange)?;
        self.span(lba, bytes)?;
        if self.read_only() {
            return Err(BlockError::Io);
        }
        self.data(CHUNK).fill(0);
        let mut done = 0;
        while done < bytes {
            let n = (bytes - done).min(CHUNK);
            self.request(REQ_OUT, lba + (done / SECTOR) as u64, n)?;
            self.stats.written += n as u64;
            done += n;
        }
        Ok(())
    }
}

/// The DMA block of a [`VirtioBlk`].
struct Dma<S: StaticHal> {
    vaddr: NonNull<u8>,
    paddr: u64,
    _hal: core::marker::PhantomData<S>,
}

impl<S: StaticHal> Drop for Dma<S> {
    fn drop(&mut self) {
        if let Some(hal) = S::hal() {
            // SAFETY: the block came from this HAL (`StaticHal` returns the same one), is
            // returned once, after the device was reset (the `VirtioBlk` field order, or no
            // device was set up yet).
            unsafe {
                hal.dma_dealloc(DmaBlock {
                    paddr: self.paddr,
                    vaddr: self.vaddr,
                    pages: PAGES,
                })
            }
        }
    }
}
