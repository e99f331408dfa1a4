//! A virtio-net NIC as a [`Link`]: the `virtio-drivers` crate's PCI transport, and the link's
//! own split virtqueues (no heap).
//!
//! [`VirtioNet`] keeps [`RX_BUFFERS`] receive buffers posted and transmits through a pool of
//! [`TX_BUFFERS`] transmit buffers, all [`BUFFER_SIZE`] bytes, in one block of DMA memory
//! allocated once at bring-up. Frames cross the seam without the virtio-net header: it is
//! stripped on receive and written in front of the frame on transmit. Frames are built in the
//! transmit buffer ([`Link::transmit_with`]) and looked at in the receive buffer
//! ([`Link::receive_with`], [`Link::receive_if`]): the plain `transmit` and `receive` copy.
//! Each descriptor names one buffer for good (module `ring`), so a frame costs one entry of
//! each ring, not virtio-drivers' general chain bookkeeping. The link polls; a driver
//! that halts while it waits routes the NIC's interrupts to itself first
//! ([`VirtioNet::route_interrupts`], through MSI-X: virtio-drivers assigns no vector).
//!
//! The receive filter: when the device offers the control queue and its receive-mode commands
//! (`VIRTIO_NET_F_CTRL_VQ`, `VIRTIO_NET_F_CTRL_RX`), bring-up turns promiscuous mode off
//! (`VIRTIO_NET_CTRL_RX_PROMISC`, 0) and all-multicast on (`VIRTIO_NET_CTRL_RX_ALLMULTI`, 1),
//! so the device hands on only frames to this MAC, broadcast and multicast (IPv6 neighbour
//! discovery's solicited-node groups among them) ([`VirtioNet::filters`]). A virtio-net device starts promiscuous, and QEMU's socket
//! and multicast netdevs echo every frame back to its sender: without the filter, each frame
//! the link sends comes back as one more to receive and drop.
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
//! What the link negotiates: MAC, STATUS, the control queue with its receive-mode commands, and
//! version 1; no event index, no indirect descriptors, no checksum offload, no segmentation
//! offload, no mergeable receive buffers: every frame fits in one buffer and is complete.

mod bridge;
mod buffers;
mod msix;
mod pci;
mod ring;

use core::ops::Range;

use pci_types::{ConfigRegionAccess, PciAddress};
use virtio_drivers::transport::pci::bus::{DeviceFunction, PciRoot};
use virtio_drivers::transport::pci::{PciTransport, VirtioPciError};
use virtio_drivers::transport::{DeviceStatus, Transport};

use buffers::{Pages, Slots, frame_range};
use ring::{F_WRITE, Ring};

pub use bridge::{Bridge, GlobalIdentity, StaticHal};
pub use msix::MsixError;
pub use pci::{
    DEVICE_MODERN, DEVICE_TRANSITIONAL, PciConfig, VENDOR, find, find_with, is_virtio_net,
    with_function,
};
/// The crate this module drives the device with (its error types appear in
/// [`VirtioNetError`]).
pub use virtio_drivers;

use crate::{Link, LinkError, PAGE_SIZE};

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

/// A virtio-net PCI function, as a [`Link`]: virtio-drivers' PCI transport (capabilities,
/// feature negotiation, queue registers), and the link's own split virtqueues
/// (module `ring`), each descriptor bound to one buffer for good.
///
/// Dropping it resets the device (virtio-drivers' transport does) before the queues and the
/// buffers return to the HAL.
pub struct VirtioNet<S: StaticHal> {
    // Declared first: dropped first, so the device is reset before the memory goes.
    transport: PciTransport,
    /// The queues' pages (receive, transmit, control), reached through `rxq` and `txq`; held
    /// for their return to the HAL.
    _queues: Pages<S>,
    buffers: Pages<S>,
    rxq: Ring,
    txq: Ring,
    rx: Slots<RX_BUFFERS>,
    tx: Slots<TX_BUFFERS>,
    address: PciAddress,
    mac: [u8; 6],
    /// Whether the device filters frames to this MAC and broadcast (promiscuous mode off
    /// through the control queue), or hands on every frame of the segment.
    filters: bool,
    /// The device broke the queue protocol (an unknown buffer, a used index out of range):
    /// the link is dead.
    broken: bool,
    stats: LinkStats,
}

/// The features asked for: the MAC, the link status, the control queue and its receive-mode
/// commands, virtio 1.0. No offloads, no mergeable buffers, no event index, no indirect
/// descriptors: every frame fits one buffer.
const FEATURES: u64 = F_MAC | F_STATUS | F_CTRL_VQ | F_CTRL_RX | F_VERSION_1;
const F_MAC: u64 = 1 << 5;
const F_STATUS: u64 = 1 << 16;
const F_CTRL_VQ: u64 = 1 << 17;
const F_CTRL_RX: u64 = 1 << 18;
const F_VERSION_1: u64 = 1 << 32;
/// Queue indices: receive, transmit, control (no multiqueue).
const RX_QUEUE: u16 = 0;
const TX_QUEUE: u16 = 1;
const CTRL_QUEUE: u16 = 2;
/// The virtio-net header in front of every frame (`struct virtio_net_hdr` with
/// `num_buffers`, as virtio 1.0 has it): all zeros on transmit.
const HDR: usize = 12;
/// Polls for the control queue's answer before going on promiscuous.
const CTRL_POLLS: u32 = 1 << 22;

impl<S: StaticHal> VirtioNet<S> {
    /// Brings up the virtio-net function at `address`: enables memory decoding and bus
    /// mastering, builds virtio-drivers' PCI transport (the BARs must already be assigned, as
    /// firmware does), negotiates, sets up the queues and buffers, posts every receive buffer
    /// and turns promiscuous mode off when the device has the control queue. On failure
    /// everything allocated is returned and the command register restored.
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
        use virtio_drivers::Error as E;
        // Memory first: dropped last on failure too (after the transport reset the device).
        let buffers = Pages::<S>::new(hal, PAGES)?;
        let rings = Pages::<S>::new(hal, 3)?;
        let mut transport =
            PciTransport::new::<Bridge<S>, C>(root, df).map_err(VirtioNetError::Transport)?;
        transport.set_status(DeviceStatus::empty());
        transport.set_status(DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER);
        let features = transport.read_device_features() & FEATURES;
        if features & F_VERSION_1 == 0 {
            return Err(VirtioNetError::Device(E::Unsupported));
        }
        transport.write_driver_features(features);
        let ok = DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER | DeviceStatus::FEATURES_OK;
        transport.set_status(ok);
        if !transport.get_status().contains(DeviceStatus::FEATURES_OK) {
            return Err(VirtioNetError::Device(E::NotReady));
        }
        let ctrl = features & (F_CTRL_VQ | F_CTRL_RX) == F_CTRL_VQ | F_CTRL_RX;
        // SAFETY: three pages of `rings`, one per queue, owned by the value built below and
        // returned only after the transport reset the device.
        let (mut rxq, mut txq, mut ctrlq) = unsafe {
            (
                Ring::new(rings.page(0), rings.paddr(0)),
                Ring::new(rings.page(1), rings.paddr(1)),
                Ring::new(rings.page(2), rings.paddr(2)),
            )
        };
        let queues: &[(u16, &Ring)] = if ctrl {
            &[(RX_QUEUE, &rxq), (TX_QUEUE, &txq), (CTRL_QUEUE, &ctrlq)]
        } else {
            &[(RX_QUEUE, &rxq), (TX_QUEUE, &txq)]
        };
        for &(q, ring) in queues {
            if transport.queue_used(q) {
                return Err(VirtioNetError::Device(E::AlreadyUsed));
            }
            if (transport.max_queue_size(q) as usize) < QUEUE_SIZE {
                return Err(VirtioNetError::Device(E::InvalidParam));
            }
            let (desc, driver, device) = ring.areas();
            transport.queue_set(q, QUEUE_SIZE as u32, desc, driver, device);
        }
        // Each descriptor names its buffer for good: receive slot i is descriptor i of the
        // receive queue, transmit slot j descriptor j of the transmit queue.
        for i in 0..RX_BUFFERS {
            rxq.describe(
                i,
                buffers.paddr_at(i * BUFFER_SIZE),
                BUFFER_SIZE as u32,
                F_WRITE,
                0,
            );
        }
        for j in 0..TX_BUFFERS {
            let at = (RX_BUFFERS + j) * BUFFER_SIZE;
            txq.describe(j, buffers.paddr_at(at), 0, 0, 0);
        }
        rxq.set_interrupts(false);
        txq.set_interrupts(false);
        ctrlq.set_interrupts(false);
        transport.finish_init();
        let mac = transport
            .read_config_space::<[u8; 6]>(0)
            .map_err(VirtioNetError::Device)?;
        let mut net = VirtioNet {
            transport,
            _queues: rings,
            buffers,
            rxq,
            txq,
            rx: Slots::new(),
            tx: Slots::new(),
            address,
            mac,
            filters: false,
            broken: false,
            stats: LinkStats::default(),
        };
        net.refill();
        if ctrl {
            net.filters = net.promiscuous_off(&mut ctrlq);
        }
        Ok(net)
    }

    /// Turns promiscuous mode off (`VIRTIO_NET_CTRL_RX_PROMISC`, 0) through the control
    /// queue, then all-multicast on (`VIRTIO_NET_CTRL_RX_ALLMULTI`, 1: IPv6 neighbour
    /// discovery comes to solicited-node groups, and the device keeps no group table here;
    /// the transport drops the groups it did not join): whether the device acknowledged
    /// both. Unanswered after [`CTRL_POLLS`] looks, the link stays promiscuous (the
    /// commands' buffers are never reused).
    fn promiscuous_off(&mut self, ctrlq: &mut Ring) -> bool {
        self.rx_mode(ctrlq, 0, 0, 0) && self.rx_mode(ctrlq, 1, 1, 1)
    }

    /// Sends the receive-mode command `command` (class `VIRTIO_NET_CTRL_RX`, 0) with `value`
    /// through the control queue, in the command place `slot` (descriptors `2 * slot` and
    /// `2 * slot + 1`, bytes of the queue's page past its structures): whether the device
    /// acknowledged it.
    fn rx_mode(&mut self, ctrlq: &mut Ring, slot: usize, command: u8, value: u8) -> bool {
        let at = ring::END + 16 * slot;
        let (Some((cmd, cmd_paddr)), Some((ack, ack_paddr))) =
            (ctrlq.spare(at), ctrlq.spare(at + 8))
        else {
            return false;
        };
        // SAFETY: bytes of the control queue's page past its structures, the driver's until
        // the command is posted below; read back only after the device used the chain.
        unsafe {
            cmd.cast::<[u8; 3]>().write_volatile([0, command, value]);
            ack.write_volatile(0xff);
        }
        let head = 2 * slot;
        ctrlq.describe(head, cmd_paddr, 3, ring::F_NEXT, head as u16 + 1);
        ctrlq.describe(head + 1, ack_paddr, 1, F_WRITE, 0);
        ctrlq.publish(head as u16);
        self.transport.notify(CTRL_QUEUE);
        for _ in 0..CTRL_POLLS {
            match ctrlq.pop() {
                None => core::hint::spin_loop(),
                Some(Ok((id, _))) if id as usize == head => {
                    // SAFETY: the device used the chain: the byte is the driver's again.
                    return unsafe { ack.read_volatile() } == 0;
                }
                Some(_) => return false,
            }
        }
        false
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
        self.rxq.set_interrupts(true);
        self.txq.set_interrupts(true);
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

    /// Whether the device filters the frames it hands on (this MAC, broadcast), or is
    /// promiscuous: without the control queue, or if it did not acknowledge the command.
    pub fn filters(&self) -> bool {
        self.filters
    }

    /// Posts every receive buffer the device does not hold.
    fn refill(&mut self) {
        let mut posted = false;
        while let Some(slot) = self.rx.idle() {
            // The slot is idle: its buffer is the CPU's; from here the device's, until the
            // used ring gives descriptor `slot` back (`next_frame`).
            self.rxq.publish(slot as u16);
            self.rx.hold(slot, BUFFER_SIZE as u16);
            posted = true;
        }
        if posted && self.rxq.wants_notify() {
            self.transport.notify(RX_QUEUE);
        }
    }

    /// Takes back every transmit buffer the device is done with.
    fn reclaim(&mut self) -> Result<(), LinkError> {
        // At most a ring's worth: a device cannot hold the caller.
        for _ in 0..QUEUE_SIZE {
            let Some(used) = self.txq.pop() else {
                return Ok(());
            };
            // A buffer the device does not hold (an id out of range, or not posted): broken.
            let slot = used.ok().and_then(|(id, _)| {
                let id = u16::try_from(id).ok()?;
                self.tx.find(id).map(|(slot, _)| slot)
            });
            let Some(slot) = slot else {
                self.broken = true;
                return Err(LinkError::Device);
            };
            self.tx.release(slot);
        }
        Ok(())
    }
}

impl<S: StaticHal> Link for VirtioNet<S> {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn paces_itself(&self) -> bool {
        // The device sends from its own thread, what the ring holds at most.
        true
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
        // Built in place: the slot is idle, so its buffer is the CPU's alone.
        // (Stores, not a `memset` call: the header is 12 bytes.)
        if let Some(h) = buf.first_chunk_mut::<HDR>() {
            *h = [0; HDR];
        }
        let Some(n) = build(&mut buf[HDR..HDR + MAX_FRAME]) else {
            return Ok(None);
        };
        if n == 0 || n > MAX_FRAME {
            return Err(LinkError::Size);
        }
        let len = HDR + n.max(MIN_FRAME);
        if n < MIN_FRAME {
            buf[HDR + n..len].fill(0);
        }
        // The slot's descriptor names its buffer; from here the device's until `reclaim`.
        self.txq.set_len(slot, len as u32);
        self.txq.publish(slot as u16);
        self.tx.hold(slot, len as u16);
        self.stats.transmitted += 1;
        if self.txq.wants_notify() {
            self.transport.notify(TX_QUEUE);
        }
        Ok(Some(n))
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
            let used = self.rxq.pop()?;
            // A buffer the device does not hold (an id out of range, or not posted): broken.
            let got = used.ok().and_then(|(id, len)| {
                let id = u16::try_from(id).ok()?;
                let (slot, _) = self.rx.find(id)?;
                Some((slot, len))
            });
            let Some((slot, len)) = got else {
                self.broken = true;
                return None;
            };
            self.rx.release(slot);
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            let range = len
                .checked_sub(HDR)
                .and_then(|n| frame_range(HDR, n, BUFFER_SIZE, MAX_FRAME));
            match range {
                Some(range) => return Some((slot, range)),
                None => self.stats.dropped += 1,
            }
        }
        None
    }
}
