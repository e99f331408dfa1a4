//! A virtio-net NIC as a [`Link`], through the `virtio-drivers` crate (`VirtIONetRaw`: no heap).
//!
//! [`VirtioNet`] keeps [`RX_BUFFERS`] receive buffers posted and transmits through a pool of
//! [`TX_BUFFERS`] transmit buffers, all [`BUFFER_SIZE`] bytes, in one block of DMA memory
//! allocated once at bring-up. Frames cross the seam without the virtio-net header: it is
//! stripped on receive and written in front of the frame on transmit. The link polls; a driver
//! that halts while it waits routes the NIC's interrupts to itself first
//! ([`VirtioNet::route_interrupts`], through MSI-X: virtio-drivers assigns no vector).
//!
//! The NIC stays promiscuous: virtio-drivers 0.13 negotiates no control queue, so the receive
//! filter cannot be set through it. A NIC that can filter (virtio-net's `VIRTIO_NET_F_CTRL_RX`
//! with `VIRTIO_NET_CTRL_RX_PROMISC` off) should take only its own MAC, broadcast and the
//! multicast groups asked for.
//!
//! virtio-drivers reaches DMA and MMIO through associated functions, so the bareverbs HAL must
//! be reachable from a static: a [`StaticHal`] names it, and [`GlobalIdentity`] is the ready
//! one for [`IdentityHal`](crate::IdentityHal). Bring-up, with the `x86_64` feature's port-I/O
//! configuration access:
//!
//! ```ignore
//! // SAFETY: RAM for DMA that nothing else uses, identity-mapped (offset 0).
//! let hal = unsafe { GlobalIdentity::install(paddr, vaddr, pages, 0) }.unwrap();
//! // SAFETY: a PC has configuration mechanism #1; this kernel is its only user.
//! let pci = unsafe { PortIoConfig::new() };
//! let address = virtio_net::find(&pci).ok_or(VirtioNetError::NoDevice)?;
//! // SAFETY: the function at `address` is a virtio-net NIC nothing else drives, its BARs
//! // assigned by the firmware and inside the HAL's MMIO mapping.
//! let mut nic = unsafe { VirtioNet::<GlobalIdentity>::new(&pci, address) }?;
//! nic.transmit(&frame)?;
//! ```
//!
//! What virtio-drivers 0.13 negotiates: MAC, STATUS, event index and version 1; no checksum
//! offload, no segmentation offload, no mergeable receive buffers: every frame fits in one
//! buffer and is complete.

mod bridge;
mod msix;
mod pci;

use core::ops::Range;
use core::ptr::NonNull;

use pci_types::{ConfigRegionAccess, PciAddress};
use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::pci::bus::{DeviceFunction, PciRoot};
use virtio_drivers::transport::pci::{PciTransport, VirtioPciError};

pub use bridge::{Bridge, GlobalIdentity, StaticHal};
pub use msix::MsixError;
pub use pci::{
    DEVICE_MODERN, DEVICE_TRANSITIONAL, PciConfig, VENDOR, find, find_with, is_virtio_net,
    with_function,
};
/// The crate this module drives the device with (its error types appear in
/// [`VirtioNetError`]).
pub use virtio_drivers;

use crate::{DmaBlock, Hal, Link, LinkError, PAGE_SIZE};

/// Receive buffers kept posted.
pub const RX_BUFFERS: usize = 64;
/// Transmit buffers: frames in flight at most.
pub const TX_BUFFERS: usize = 32;
/// Bytes of each buffer: the largest header (12) plus a 1514-byte frame fits, and two share a
/// page. virtio-drivers wants at least 1526 for a receive buffer.
pub const BUFFER_SIZE: usize = 2048;
/// Entries of each virtqueue (a power of two, at least as many as buffers: each takes one
/// descriptor).
pub const QUEUE_SIZE: usize = 64;
/// The largest frame carried (1500-byte IP MTU plus the 14-byte Ethernet header).
pub const MAX_FRAME: usize = 1514;
/// Frames shorter than this are padded with zeros (Ethernet's minimum without FCS).
pub const MIN_FRAME: usize = 60;

const PAGES: usize = (RX_BUFFERS + TX_BUFFERS) * BUFFER_SIZE / PAGE_SIZE;
const _: () = assert!(
    RX_BUFFERS <= QUEUE_SIZE
        && TX_BUFFERS <= QUEUE_SIZE
        && PAGE_SIZE.is_multiple_of(BUFFER_SIZE)
        && BUFFER_SIZE >= 1526
        && BUFFER_SIZE <= u16::MAX as usize
);

/// Why a virtio-net NIC could not be brought up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VirtioNetError {
    /// The [`StaticHal`] has no HAL installed yet.
    NoHal,
    /// No virtio-net function at that address.
    NoDevice,
    /// The PCI transport could not be set up (capabilities, BARs).
    Transport(VirtioPciError),
    /// The device refused the driver (features, queue sizes, configuration space).
    Device(virtio_drivers::Error),
    /// DMA memory for the rings or the buffers is exhausted.
    OutOfDma,
}

impl core::fmt::Display for VirtioNetError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            VirtioNetError::NoHal => write!(f, "no HAL installed for virtio-drivers"),
            VirtioNetError::NoDevice => write!(f, "no virtio-net function there"),
            VirtioNetError::Transport(e) => write!(f, "virtio PCI transport: {e}"),
            VirtioNetError::Device(e) => write!(f, "virtio-net device: {e}"),
            VirtioNetError::OutOfDma => write!(f, "DMA memory exhausted"),
        }
    }
}

/// Frames counted by a [`VirtioNet`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames handed to the caller.
    pub received: u64,
    /// Frames handed to the device.
    pub transmitted: u64,
    /// Frames received but dropped: longer than the caller's buffer, or a length the device
    /// got wrong.
    pub dropped: u64,
}

/// A virtio-net PCI function driven through virtio-drivers' `VirtIONetRaw`, as a [`Link`].
///
/// Dropping it resets the device (virtio-drivers' transport does) before the buffers return to
/// the HAL.
pub struct VirtioNet<S: StaticHal> {
    // Declared first: dropped first, so the device is reset before the buffers go.
    raw: VirtIONetRaw<Bridge<S>, PciTransport, QUEUE_SIZE>,
    buffers: Buffers<S>,
    rx: Slots<RX_BUFFERS>,
    tx: Slots<TX_BUFFERS>,
    address: PciAddress,
    mac: [u8; 6],
    /// The device broke the queue protocol (an unknown token): the link is dead.
    broken: bool,
    stats: LinkStats,
}

impl<S: StaticHal> VirtioNet<S> {
    /// Brings up the virtio-net function at `address`: enables memory decoding and bus
    /// mastering, builds virtio-drivers' PCI transport (the BARs must already be assigned, as
    /// firmware does), negotiates, allocates the rings and buffers, and posts every receive
    /// buffer. On failure everything allocated is returned and the command register restored.
    ///
    /// # Safety
    ///
    /// As [`PciConfig::new`] for `pci`; the function at `address` is driven by nothing else
    /// while the value lives; its BARs lie where [`StaticHal::mmio_virt`] maps them.
    pub unsafe fn new<C: ConfigRegionAccess>(
        pci: &C,
        address: PciAddress,
    ) -> Result<Self, VirtioNetError> {
        let hal = S::hal().ok_or(VirtioNetError::NoHal)?;
        // SAFETY: our caller's promise.
        unsafe {
            pci::with_function(pci, address, is_virtio_net, |root, df| {
                Self::bring_up(hal, root, df, address)
            })
        }
        .unwrap_or(Err(VirtioNetError::NoDevice))
    }

    fn bring_up<C: virtio_drivers::transport::pci::bus::ConfigurationAccess>(
        hal: &'static S::Hal,
        root: &mut PciRoot<C>,
        df: DeviceFunction,
        address: PciAddress,
    ) -> Result<Self, VirtioNetError> {
        // Buffers first: dropped last on failure too (after the transport reset the device).
        let block = hal.dma_alloc(PAGES).map_err(|_| VirtioNetError::OutOfDma)?;
        let buffers = Buffers::<S> {
            paddr: block.paddr,
            vaddr: block.vaddr,
            _hal: core::marker::PhantomData,
        };
        let transport =
            PciTransport::new::<Bridge<S>, C>(root, df).map_err(VirtioNetError::Transport)?;
        let raw = VirtIONetRaw::new(transport).map_err(|e| match e {
            virtio_drivers::Error::DmaError => VirtioNetError::OutOfDma,
            e => VirtioNetError::Device(e),
        })?;
        let mut net = VirtioNet {
            mac: raw.mac_address(),
            raw,
            buffers,
            rx: Slots::new(),
            tx: Slots::new(),
            address,
            broken: false,
            stats: LinkStats::default(),
        };
        net.raw.disable_interrupts();
        net.refill();
        if net.rx.held() != RX_BUFFERS {
            return Err(VirtioNetError::Device(virtio_drivers::Error::QueueFull));
        }
        Ok(net)
    }

    /// Routes the NIC's interrupts, a received frame and a completed transmission alike, to
    /// the MSI message `msg` (MSI-X table entry 0, named as the vector of both queues), so that
    /// a CPU halted while it waits wakes on the next frame. The device signals the first used
    /// buffer after those the link has taken: halt only after [`Link::receive`] found none.
    ///
    /// # Safety
    ///
    /// `pci` reaches this NIC's function as the one given to [`VirtioNet::new`]; nothing else
    /// uses the function's MSI-X table meanwhile.
    pub unsafe fn route_interrupts<C: ConfigRegionAccess>(
        &mut self,
        pci: &C,
        msg: crate::MsiMessage,
    ) -> Result<(), MsixError> {
        // SAFETY: the caller's promise; the queues exist since bring-up, and this value drives
        // the function.
        unsafe { msix::route::<S, C>(pci, self.address, msg) }?;
        self.raw.enable_interrupts();
        Ok(())
    }

    /// Where the function is.
    pub fn address(&self) -> PciAddress {
        self.address
    }

    /// Frames counted so far.
    pub fn stats(&self) -> LinkStats {
        self.stats
    }

    /// Whether the device broke the queue protocol (the link then sends and receives nothing).
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Posts every receive buffer the device does not hold.
    fn refill(&mut self) {
        while let Some(slot) = self.rx.idle() {
            let buf = self.buffers.slot(slot);
            // SAFETY: the slot is idle: nothing else refers to its buffer until
            // `receive_complete` with the token returned here, which `receive` calls with the
            // same buffer (recorded in `self.rx`).
            match unsafe { self.raw.receive_begin(buf) } {
                Ok(token) => self.rx.hold(slot, token, BUFFER_SIZE as u16),
                Err(_) => return,
            }
        }
    }

    /// Takes back every transmit buffer the device is done with.
    fn reclaim(&mut self) -> Result<(), LinkError> {
        while let Some(token) = self.raw.poll_transmit() {
            let Some((slot, len)) = self.tx.find(token) else {
                self.broken = true;
                return Err(LinkError::Device);
            };
            let buf = &self.buffers.slot(RX_BUFFERS + slot)[..len];
            // SAFETY: the buffer handed to `transmit_begin` with this token (same slot, same
            // length).
            if unsafe { self.raw.transmit_complete(token, buf) }.is_err() {
                // The used ring changed under us: a device breaking the protocol.
                self.broken = true;
                return Err(LinkError::Device);
            }
            self.tx.release(slot);
        }
        Ok(())
    }
}

impl<S: StaticHal> Link for VirtioNet<S> {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn max_frame(&self) -> usize {
        MAX_FRAME
    }

    fn transmit(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        if frame.is_empty() || frame.len() > MAX_FRAME {
            return Err(LinkError::Size);
        }
        self.transmit_with(&mut [], |buf| {
            buf.get_mut(..frame.len())?.copy_from_slice(frame);
            Some(frame.len())
        })
        .map(|_| ())
    }

    fn transmit_with<F>(&mut self, _: &mut [u8], build: F) -> Result<Option<usize>, LinkError>
    where
        F: FnOnce(&mut [u8]) -> Option<usize>,
    {
        if self.broken {
            return Err(LinkError::Device);
        }
        // Sent buffers are taken back only when every slot is in use: one pass over the used
        // ring per ring's worth of frames, not an empty look per frame.
        let slot = match self.tx.idle() {
            Some(slot) => slot,
            None => {
                self.reclaim()?;
                self.tx.idle().ok_or(LinkError::Busy)?
            }
        };
        let buf = self.buffers.slot(RX_BUFFERS + slot);
        let hdr = self
            .raw
            .fill_buffer_header(buf)
            .map_err(|_| LinkError::Device)?;
        // Built in place: the slot is idle, so its buffer is the CPU's alone.
        let Some(room) = buf.get_mut(hdr..hdr + MAX_FRAME) else {
            return Err(LinkError::Device);
        };
        let Some(n) = build(room) else {
            return Ok(None);
        };
        if n == 0 || n > MAX_FRAME {
            return Err(LinkError::Size);
        }
        let len = hdr + n.max(MIN_FRAME);
        buf[hdr + n..len].fill(0);
        let buf = &buf[..len];
        // SAFETY: the slot is idle; its buffer is not touched again until `reclaim` passes it
        // (same slot, same length, recorded in `self.tx`) to `transmit_complete`.
        match unsafe { self.raw.transmit_begin(buf) } {
            Ok(token) => {
                self.tx.hold(slot, token, len as u16);
                self.stats.transmitted += 1;
                Ok(Some(n))
            }
            Err(virtio_drivers::Error::QueueFull) => Err(LinkError::Busy),
            Err(_) => Err(LinkError::Device),
        }
    }

    fn tx_ready(&mut self) -> bool {
        !self.broken
            && (self.tx.idle().is_some() || (self.reclaim().is_ok() && self.tx.idle().is_some()))
    }

    fn receive(&mut self, buf: &mut [u8]) -> Option<usize> {
        // At most one pass over the ring: a flood of frames too long cannot hold the caller.
        for _ in 0..QUEUE_SIZE {
            match self.receive_if(buf, |_| true)? {
                Some(n) => return Some(n),
                None => continue,
            }
        }
        None
    }

    fn receive_with<R, F>(&mut self, _: &mut [u8], f: F) -> Option<R>
    where
        F: FnOnce(&[u8]) -> R,
    {
        let (slot, range) = self.next_frame()?;
        let r = f(&self.buffers.slot(slot)[range]);
        self.stats.received += 1;
        self.refill();
        Some(r)
    }

    fn receive_if<F>(&mut self, buf: &mut [u8], want: F) -> Option<Option<usize>>
    where
        F: FnOnce(&[u8]) -> bool,
    {
        let got = self.receive_with(&mut [], |frame| crate::copy_if(frame, buf, want))?;
        if got.is_none() {
            // Shown, then refused (or too long for `buf`): dropped, not handed on.
            self.stats.received -= 1;
            self.stats.dropped += 1;
        }
        Some(got)
    }
}

impl<S: StaticHal> VirtioNet<S> {
    /// The next frame the device returned: its receive slot (taken from the device, not
    /// reposted: the caller reads it, then calls `refill`) and where the frame lies in it.
    /// Buffers with lengths the device got wrong are reposted, counted as dropped, and the
    /// next one looked at, one pass over the ring at most. `None`: nothing arrived (or the
    /// device broke the queue protocol).
    fn next_frame(&mut self) -> Option<(usize, Range<usize>)> {
        for _ in 0..QUEUE_SIZE {
            if self.broken {
                return None;
            }
            self.refill();
            let token = self.raw.poll_receive()?;
            let Some((slot, _)) = self.rx.find(token) else {
                self.broken = true;
                return None;
            };
            let rx = self.buffers.slot(slot);
            // SAFETY: the buffer handed to `receive_begin` with this token (recorded in
            // `self.rx`).
            let lengths = match unsafe { self.raw.receive_complete(token, rx) } {
                Ok(l) => Some(l),
                // Recycled, but shorter than a header.
                Err(virtio_drivers::Error::IoError) => None,
                Err(_) => {
                    self.broken = true;
                    return None;
                }
            };
            let buffer_len = rx.len();
            self.rx.release(slot);
            match lengths.and_then(|(hdr, len)| frame_range(hdr, len, buffer_len, MAX_FRAME)) {
                Some(range) => return Some((slot, range)),
                None => self.stats.dropped += 1,
            }
        }
        None
    }
}

/// Where the frame lies in a receive buffer of `buffer_len` bytes, given the header and packet
/// lengths the device reported, if it is a frame at all and fits the caller's `room`.
fn frame_range(hdr: usize, len: usize, buffer_len: usize, room: usize) -> Option<Range<usize>> {
    let end = hdr.checked_add(len)?;
    (len > 0 && end <= buffer_len && len <= room).then_some(hdr..end)
}

/// The DMA block holding every buffer: receive slots first, then transmit slots.
struct Buffers<S: StaticHal> {
    paddr: u64,
    vaddr: NonNull<u8>,
    _hal: core::marker::PhantomData<S>,
}

impl<S: StaticHal> Buffers<S> {
    /// Buffer `i` (receive slots `0..RX_BUFFERS`, then transmit slots).
    fn slot(&mut self, i: usize) -> &mut [u8] {
        assert!(i < RX_BUFFERS + TX_BUFFERS);
        // SAFETY: `i` is in range, so the slice lies inside the block of `PAGES` pages, which
        // this value owns; `&mut self` makes it the only reference the CPU holds (the device
        // may hold the buffer: the callers' virtio-drivers contracts keep the CPU off it then).
        unsafe {
            core::slice::from_raw_parts_mut(self.vaddr.as_ptr().add(i * BUFFER_SIZE), BUFFER_SIZE)
        }
    }
}

impl<S: StaticHal> Drop for Buffers<S> {
    fn drop(&mut self) {
        if let Some(hal) = S::hal() {
            // SAFETY: the block came from this HAL (`StaticHal` returns the same one), is
            // returned once, and the device was reset before (the `VirtioNet` field order, or
            // no device was set up yet).
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

/// Which buffer slots the device holds: the virtqueue token each was posted with, and the
/// length handed over. Every operation is O(1) (a per-frame linear scan of the slots was the
/// largest cost of the RoCE lab's READ responder: docs/measurements.md): an idle-slot bit mask,
/// and the slot of each token (virtio-drivers' token is the chain's first descriptor, below
/// [`QUEUE_SIZE`]; a larger one, which a device cannot make it report, is looked for in turn).
struct Slots<const N: usize> {
    held: [Option<(u16, u16)>; N],
    /// Bit `i` set: slot `i` is idle.
    idle: u64,
    /// Per token below [`QUEUE_SIZE`]: the slot last held with it.
    by_token: [u8; QUEUE_SIZE],
}

impl<const N: usize> Slots<N> {
    const ALL: u64 = if N == 64 { u64::MAX } else { (1u64 << N) - 1 };
    const FITS: () = assert!(N >= 1 && N <= 64 && N <= u8::MAX as usize);

    fn new() -> Self {
        let () = Self::FITS;
        Slots {
            held: [None; N],
            idle: Self::ALL,
            by_token: [0; QUEUE_SIZE],
        }
    }

    /// The first slot the device does not hold.
    fn idle(&self) -> Option<usize> {
        (self.idle != 0).then(|| self.idle.trailing_zeros() as usize)
    }

    fn hold(&mut self, slot: usize, token: u16, len: u16) {
        self.held[slot] = Some((token, len));
        self.idle &= !(1u64 << slot);
        if let Some(s) = self.by_token.get_mut(usize::from(token)) {
            *s = slot as u8;
        }
    }

    /// The slot posted with `token` (a value the device reports: unknown ones give `None`),
    /// and its length.
    fn find(&self, token: u16) -> Option<(usize, usize)> {
        let is = |i: usize| match self.held.get(i) {
            Some(Some((t, len))) if *t == token => Some((i, usize::from(*len))),
            _ => None,
        };
        match self.by_token.get(usize::from(token)) {
            Some(&slot) => is(usize::from(slot)),
            None => (0..N).find_map(is),
        }
    }

    fn release(&mut self, slot: usize) {
        self.held[slot] = None;
        self.idle |= 1u64 << slot;
    }

    fn held(&self) -> usize {
        N - self.idle.count_ones() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_track_tokens() {
        let mut s = Slots::<3>::new();
        assert_eq!(s.idle(), Some(0));
        s.hold(0, 7, 100);
        s.hold(1, 2, 60);
        assert_eq!(s.idle(), Some(2));
        assert_eq!(s.held(), 2);
        assert_eq!(s.find(2), Some((1, 60)));
        assert_eq!(s.find(7), Some((0, 100)));
        assert_eq!(s.find(3), None, "a token nobody posted");
        s.hold(2, 3, 1);
        assert_eq!(s.idle(), None);
        s.release(0);
        assert_eq!(s.idle(), Some(0));
        assert_eq!(
            s.find(7),
            None,
            "a released slot no longer answers its token"
        );
        assert_eq!(s.held(), 2);
    }

    #[test]
    fn slots_reuse_tokens_and_refuse_stale_ones() {
        let mut s = Slots::<RX_BUFFERS>::new();
        for i in 0..RX_BUFFERS {
            assert_eq!(s.idle(), Some(i));
            s.hold(i, i as u16, 1);
        }
        assert_eq!(s.idle(), None);
        assert_eq!(s.held(), RX_BUFFERS);
        // The device hands buffers back out of order; virtio-drivers reuses their tokens.
        s.release(5);
        s.release(2);
        assert_eq!(s.idle(), Some(2), "the lowest idle slot first");
        s.hold(2, 5, 9);
        assert_eq!(s.find(5), Some((2, 9)), "token 5 now names slot 2");
        assert_eq!(s.find(2), None, "slot 2's old token is stale");
        assert_eq!(s.idle(), Some(5));
        assert_eq!(s.find(u16::MAX), None, "a token beyond the queue");
        let mut t = Slots::<2>::new();
        t.hold(1, 1000, 3);
        assert_eq!(t.find(1000), Some((1, 3)), "a token beyond the queue, held");
    }

    #[test]
    fn frame_range_checks_device_lengths() {
        assert_eq!(frame_range(12, 42, 2048, 1514), Some(12..54));
        assert_eq!(frame_range(12, 2036, 2048, 4096), Some(12..2048));
        assert_eq!(frame_range(12, 2037, 2048, 4096), None, "beyond the buffer");
        assert_eq!(
            frame_range(12, 100, 2048, 99),
            None,
            "longer than the caller's room"
        );
        assert_eq!(frame_range(12, 0, 2048, 1514), None, "empty");
        assert_eq!(frame_range(usize::MAX, 1, 2048, 1514), None, "overflow");
        assert_eq!(frame_range(10, 1514, 2048, 1514), Some(10..1524));
    }
}
