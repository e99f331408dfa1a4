//! Software RoCEv2 over a plain Ethernet NIC (a `hal::Link`), interoperating with Linux's
//! `rdma_rxe`: what `rdma_rxe` is for Linux, without an OS.
//!
//! Built in layers, each with every fact of its own (`docs/roce-v2.md`):
//! - [`wire`]: the frames — Ethernet, ARP, IPv4, UDP 4791, the base transport header and its
//!   extended headers, the ICRC — parsed with every length checked and built byte for byte as
//!   Linux builds them;
//! - [`port`]: the interface — its addresses and GIDs, the neighbour cache (ARP answered,
//!   resolved and learnt from, nothing else), and the demultiplexing of received frames
//!   between RoCE and the IP stack (frames to other MACs and from martian sources dropped);
//! - [`seq`]: PSN arithmetic and how a message is cut into packets at a path MTU;
//! - the device, [`Rxe`]: the verbs [`Provider`](crate::verbs::Provider) — memory regions
//!   with keys and access checks, completion queues, RC and UD queue pairs, shared receive
//!   queues — and the reliable transport: a requester (segmentation, the PSN window, go-back-N
//!   retransmission on a timer, RNR waits), a completer (coalesced ACKs, NAKs, READ responses,
//!   atomic acknowledges) and a responder (in-order PSNs, one NAK per gap, duplicate and
//!   READ/atomic replay, RNR NAKs, access and bounds checks). Before a queue pair sees a
//!   packet, `check.rs` makes rxe's receive checks: the opcode's transport is the QP's, and a
//!   connected QP's packet comes from its peer. Answers go along the QP's path.
//!
//! Every frame is an attacker's input: what a station on the segment can and cannot do, and
//! what the embedder must do, is in `docs/security.md`.
//!
//! There is no thread: the transport runs inside the verbs calls. Posting sends what the
//! window allows; polling a CQ first takes the frames the NIC received and runs the timers.
//! The embedder's IP stack shares the NIC through [`Rxe::stack`].
//!
//! # What must run
//!
//! A device's frames are taken, and its timers run, only inside calls into that device:
//! [`Provider::progress`](crate::verbs::Provider::progress) ([`Rxe::progress`],
//! [`Context::progress`](crate::Context::progress)), which every wait the crate offers runs —
//! a future of a completion queue or a completion channel, each time it is polled;
//! [`Context::block_on`](crate::Context::block_on) between polls; a completion channel's
//! `get_cq_event`; the CM's `poll` and `next_event`; the NVMe-oF target's and host's loops —
//! and any poll of one of its completion queues, and [`Context::interrupt`](crate::Context::interrupt)
//! from the NIC's interrupt.
//!
//! So a **passive peer** — one whose memory a peer READs and WRITEs while it posts nothing —
//! is served as long as its application waits on one of those, or calls `progress` from its
//! own loop. One that waits on anything else (a lock, a flag, another device) serves nothing
//! until it calls into the device again: the peer's requests wait, and after its retry count
//! they fail. The **active side** needs its device to run too: for its address resolution
//! (ARP), for the acknowledgements that free its window, and for its retransmissions.

mod busy;
mod busy_bit;
mod check;
mod cq;
mod cq_resize;
mod datagram;
mod dev_lock;
mod dispatch;
mod keys;
mod local;
mod mcast;
mod mem;
mod net;
mod pace;
mod post;
mod post_ext;
mod provider;
mod qp;
mod qp_lock;
mod qp_state;
mod reply;
mod requester;
mod responder;
mod rings;
mod rx6;
mod srq;
mod srq_resize;
mod tables;
mod wqe;

pub mod port;
pub mod seq;
pub mod wire;

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bareverbs_hal::{Clock, Hal, Link, LinkError, PAGE_SIZE};

use crate::dma::Dma;
use crate::error::{Error, Result};
use crate::events::EventHub;
use crate::verbs::{DeviceCaps, Gid};

pub use cq::{Cq, Poll};
pub use mem::{Mem, Mr};
pub use post::Cursor;
pub use qp::Qp;
pub use srq::Srq;

pub use mcast::MAX_MCAST_GRP;
pub use port::TransportCounts;
use port::{Port, PortCounts};
use tables::Tables;

/// Queue pairs the device holds; numbered from [`FIRST_QPN`] (rxe's numbering: 1 is GSI).
pub const MAX_QP: usize = 128;
/// The number of the first queue pair.
pub const FIRST_QPN: u32 = 16;
/// The GSI queue pair's number (QP1: management datagrams, the CM's MADs).
pub const GSI_QPN: u32 = 1;
/// The Q_Key of every datagram to and from QP1 (`IB_QP1_QKEY`): the GSI QP sends with it
/// whatever its work request names, and takes only datagrams that carry it.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The destination QPN of a datagram to a multicast group (`IB_MULTICAST_QPN`): it reaches
/// every queue pair of the device attached to the group of its destination address.
pub const MCAST_QPN: u32 = 0xFF_FFFF;
/// Memory regions the device holds.
pub const MAX_MR: usize = 256;
/// Work requests per queue.
pub const MAX_WR: u32 = 1024;
/// Receive requests per shared receive queue (rdma-core's SRQ fixtures ask 2000).
pub const MAX_SRQ_WR: u32 = 4096;
/// Scatter/gather entries per work request.
pub const MAX_SGE: u32 = 4;
/// Bytes of inline data a send request carries.
pub const MAX_INLINE: u32 = 64;
/// READ and atomic requests a queue pair keeps for replay, and the most it has outstanding.
pub const MAX_RD_ATOMIC: u32 = 16;
/// Frames of the IP stack kept until it reads them (more are dropped, as a full NIC would).
pub const STACK_FRAMES: usize = 8;
/// Frames to the device's own address queued for it (loopback); a sender that finds the
/// queue full tries again at a later turn, as when the NIC has no transmit room.
pub const LOOPBACK_FRAMES: usize = 4;
/// The largest frame the device handles (a 4096-byte path MTU with every header).
pub const FRAME: usize = 4096 + wire::packet::MAX_OVERHEAD;
/// Frames taken from the link per progress call, at most (bounded work per verbs call).
const RX_BUDGET: usize = 64;
/// Tries the progress makes for a queue pair's lock before it leaves that QP for the next
/// progress (a post holds it for well under this many spins on another core).
const QP_SPINS: u32 = 1 << 10;

/// How the device is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// The interface's static IPv4 address.
    pub ip: [u8; 4],
}

/// The software RoCEv2 device over the NIC `L`, with DMA memory from `H` and time from `C`.
pub struct Rxe<H: Hal, L: Link, C: Clock> {
    hal: H,
    clock: C,
    caps: DeviceCaps,
    mac: [u8; 6],
    ip: [u8; 4],
    /// Largest path MTU the link carries, in bytes.
    mtu: u32,
    /// The device block: the event hub, the tables, the receive buffer.
    _block: Dma<H>,
    hub: NonNull<EventHub>,
    /// The queue pairs the progress visits: those that may have work without a frame
    /// arriving (sends waiting, a timer running, answers held back); bit `i % 64` of word
    /// `i / 64` is table slot `i`, [`busy_bit::GSI_BIT`] the GSI QP. A QP joins it under its own lock when it may have
    /// gained such work, and leaves it under its own lock (in the progress) once it has none:
    /// an idle QP costs a poll nothing, and no request is missed.
    busy: [AtomicU64; busy_bit::BUSY_WORDS],
    /// Whether posts and polls leave the transport to [`progress`](Self::progress) calls
    /// ([`set_progress_only`](Self::set_progress_only)). Written once, before the device is
    /// shared; read on every post and poll (a line no post writes).
    progress_only: AtomicBool,
    /// The device lock: the NIC, the tables, the frame buffers (`docs/architecture.md` has
    /// which lock guards what, and their order).
    core: dev_lock::DevLock<Core<L>>,
}

// SAFETY: everything the raw pointers reach is in `block`, owned by the device; the hub is
// only touched through atomics, the tables and buffers only under `core`'s lock, a queue
// pair's core only under its own lock.
unsafe impl<H: Hal + Send, L: Link + Send, C: Clock + Send> Send for Rxe<H, L, C> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync, L: Link + Send, C: Clock + Sync> Sync for Rxe<H, L, C> {}

/// What the device lock guards: the NIC, the tables (in the device block) and the receive
/// buffer.
pub(crate) struct Core<L> {
    pub(crate) link: L,
    t: NonNull<Tables>,
    rx: NonNull<u8>,
    tx: NonNull<u8>,
    /// The length of a RoCE frame in the receive buffer whose queue pair's lock was held
    /// (0: none): it goes to its QP first at the next progress, before any other frame.
    held: usize,
}

impl<L> Core<L> {
    /// The tables (the lock is held: `&mut self`).
    pub(crate) fn tables(&mut self) -> &mut Tables {
        // SAFETY: `t` points into the device block, written in `Rxe::new`; the block lives as
        // long as the device, and is reached only through the locked core.
        unsafe { self.t.as_mut() }
    }

    /// The link and the tables at once.
    pub(crate) fn parts(&mut self) -> (&mut L, &mut Tables) {
        // SAFETY: as in `tables`; the link is a separate field.
        (&mut self.link, unsafe { self.t.as_mut() })
    }
}

/// Byte offsets in the device block.
const HUB_AT: usize = 0;
const TABLES_AT: usize = round_up(HUB_AT + size_of::<EventHub>());
const RX_AT: usize = round_up(TABLES_AT + size_of::<Tables>());
const TX_AT: usize = round_up(RX_AT + FRAME);
const BLOCK_BYTES: usize = TX_AT + FRAME;

const fn round_up(n: usize) -> usize {
    (n + 63) & !63
}

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    /// Opens the device over `link`, with the static address of `config`.
    ///
    /// # Errors
    ///
    /// [`Error::Resource`] when the HAL has no memory for the device block;
    /// [`Error::InvalidInput`] for a link whose frames cannot carry the smallest path MTU.
    ///
    /// # Example
    ///
    /// Two devices on the model's in-memory Ethernet segment (on a machine: one device over
    /// the NIC, its peer Linux's `rdma_rxe` or another machine), an RC connection between
    /// them, and a message. The transport runs inside the verbs calls: waiting, each side
    /// processes its frames and timers ([`Context::process_events`](crate::Context::process_events)).
    ///
    /// ```
    /// use bareverbs::Context;
    /// use bareverbs::device::rxe::{Config, Rxe};
    /// use bareverbs::verbs::*;
    /// use bareverbs_model::Model;
    /// use bareverbs_model::link::{Segment, TestClock};
    ///
    /// // Each side addresses the other by its IPv4 GID (index 1: the device's own).
    /// fn connect<'a, P: Provider>(
    ///     qp: QueuePair<'a, P, Rc, Reset>,
    ///     peer: u32,
    ///     ip: [u8; 4],
    /// ) -> bareverbs::Result<QueuePair<'a, P, Rc, Rts>> {
    ///     let qp = qp.init(&ConnectedInit::default())?;
    ///     let av = AddressVector::new(Gid::from_ipv4(ip), 1);
    ///     let qp = qp.rtr(&ConnectedRtr::new(peer, 0, av))?;
    ///     Ok(qp.rts(&ConnectedRts::new(0))?)
    /// }
    ///
    /// # fn main() -> bareverbs::Result<()> {
    /// let machine = Model::default(); // DMA memory
    /// let (wire, clock) = (Segment::new(), TestClock::default());
    /// let nic_a = wire.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    /// let nic_b = wire.attach([0x52, 0x54, 0, 0, 0, 3], 1514);
    /// let (ip_a, ip_b) = ([10, 0, 0, 2], [10, 0, 0, 3]);
    /// let a = Context::new(Rxe::new(machine.clone(), nic_a, clock.clone(), Config { ip: ip_a })?);
    /// let b = Context::new(Rxe::new(machine.clone(), nic_b, clock.clone(), Config { ip: ip_b })?);
    ///
    /// let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
    /// let (cq_a, cq_b) = (a.create_cq(16)?, b.create_cq(16)?);
    /// let (pool_a, pool_b) = (pd_a.buffer_pool(4, 1024)?, pd_b.buffer_pool(4, 1024)?);
    /// let qa = pd_a.qp_builder(&cq_a, &cq_a).pool(&pool_a).build::<Rc>()?;
    /// let qb = pd_b.qp_builder(&cq_b, &cq_b).pool(&pool_b).build::<Rc>()?;
    /// let (qpn_a, qpn_b) = (qa.qp_num(), qb.qp_num());
    /// let mut qa = connect(qa, qpn_b, ip_b)?;
    /// let mut qb = connect(qb, qpn_a, ip_a)?;
    ///
    /// qb.post_recv(1, pool_b.alloc().expect("a free buffer"))?;
    /// let mut buf = pool_a.alloc().expect("a free buffer");
    /// buf.set_len(11)?;
    /// buf.as_mut_slice().copy_from_slice(b"over RoCEv2");
    /// qa.post_send(2, buf)?;
    /// // Wait for B's receive: between polls, time moves and both sides run.
    /// let step = || {
    ///     clock.advance(100);
    ///     a.process_events();
    ///     b.process_events();
    /// };
    /// let wc = bareverbs::block_on_with(cq_b.next_completion(), step)?;
    /// assert_eq!((wc.wr_id, wc.status, wc.byte_len), (1, WcStatus::Success, 11));
    /// # let _ = (&mut qa, &mut qb);
    /// # Ok(()) }
    /// ```
    pub fn new(hal: H, link: L, clock: C, config: Config) -> Result<Self> {
        let mut link = link;
        let mac = link.mac();
        // Solicitations for the link-local address (GID 0) come to its solicited-node group.
        let ll = Gid::link_local_from_mac(mac).0;
        link.join_multicast(wire::nd::multicast_mac(&wire::nd::solicited_node(&ll)));
        let max = link.max_frame();
        let self_paced = link.paces_itself();
        let Some(mtu) = seq::MTUS
            .iter()
            .rev()
            .copied()
            .find(|&m| m as usize + wire::packet::MAX_OVERHEAD <= max.min(FRAME))
        else {
            return Err(Error::invalid(
                crate::error::Param::PathMtu,
                max as u64,
                FRAME as u64,
            ));
        };
        let block = Dma::new(&hal, BLOCK_BYTES.div_ceil(PAGE_SIZE))?;
        let base = block.base();
        // SAFETY: the block is BLOCK_BYTES long, zeroed, page-aligned, and the four regions
        // do not overlap; each is written here before any reference to it exists.
        let (hub, t, rx, tx) = unsafe {
            let hub = base.add(HUB_AT).cast::<EventHub>();
            hub.write(EventHub::new());
            let t = base.add(TABLES_AT).cast::<Tables>();
            Tables::init(t, Port::new(mac, config.ip), hal.seed());
            // A NIC that spaces out what it sends needs no pace of the device's own. (The
            // tables were just set up at `t`; no reference to them exists yet.)
            (*t.as_ptr()).pace.off = self_paced;
            (hub, t, base.add(RX_AT), base.add(TX_AT))
        };
        let caps = provider::caps_of(mac);
        Ok(Rxe {
            hal,
            clock,
            caps,
            mac,
            ip: config.ip,
            mtu,
            _block: block,
            hub,
            busy: [const { AtomicU64::new(0) }; busy_bit::BUSY_WORDS],
            progress_only: AtomicBool::new(false),
            core: dev_lock::DevLock::new(Core {
                link,
                t,
                rx,
                tx,
                held: 0,
            }),
        })
    }

    /// The interface's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The interface's IPv4 address.
    pub fn ip(&self) -> [u8; 4] {
        self.ip
    }

    /// The largest path MTU the link carries (the port's active MTU), in bytes.
    pub fn active_mtu(&self) -> u32 {
        self.mtu
    }

    /// The GID at `index` (0: link-local from the MAC; 1: the IPv4-mapped GID RoCEv2 over
    /// IPv4 uses; 2 and up: the global IPv6 addresses given with [`Rxe::add_ipv6`]).
    pub fn gid(&self, index: u32) -> Option<Gid> {
        match index {
            0 | 1 => port::gid(self.mac, self.ip, index),
            _ => self.core.lock().tables().port.gid(index),
        }
    }

    /// Gives the interface the global IPv6 address `addr` (up to [`port::GLOBALS6`] of
    /// them): its GID index, 2 and up in the order of addition. The NIC joins the address's
    /// solicited-node group, and the port answers neighbour solicitations for it. RC and UC
    /// queue pairs connect from it (source GID index) to an IPv6 peer, and address handles
    /// (UD) to an IPv6 GID go from it.
    pub fn add_ipv6(&self, addr: [u8; 16]) -> core::result::Result<u32, port::AddrRefused> {
        let mut core = self.core.lock();
        let (link, t) = core.parts();
        let index = t.port.add_ipv6(addr)?;
        link.join_multicast(wire::nd::multicast_mac(&wire::nd::solicited_node(&addr)));
        Ok(index)
    }

    /// Frames the port handled, by outcome.
    pub fn port_counts(&self) -> PortCounts {
        let mut core = self.core.lock();
        let t = core.tables();
        PortCounts {
            loopback_full: t.loopback.full,
            ..t.port.counts()
        }
    }

    /// What the reliable transport counted: retransmission timeouts, NAKs sent and
    /// received, duplicate and out-of-sequence requests.
    pub fn transport_counts(&self) -> TransportCounts {
        self.core.lock().tables().transport
    }

    /// Runs the transport now: takes what the NIC received (answering ARP, queueing the IP
    /// stack's frames) and runs the retransmission timers. Polling a CQ does this too; an
    /// embedder that only waits calls it from its loop. Never waits (another thread in the
    /// device makes it a no-op).
    pub fn progress(&self) {
        if let Some(mut core) = self.core.try_lock() {
            self.progress_locked(&mut core);
        }
    }

    /// With `on`, posts and CQ polls never take the device lock: a post publishes its
    /// requests under its queue pair's lock and leaves them to the next
    /// [`progress`](Self::progress), and a poll takes only what the CQ holds, without running
    /// the transport first. Only [`progress`](Self::progress) (and
    /// [`Provider::progress`](crate::verbs::Provider::progress), the NIC's interrupt) then
    /// transmits, receives and runs the timers. An embedder with several cores sets it when
    /// one core runs the device's progress and the others each poll their own queue pairs:
    /// their posts and polls then write no line the device's other queue pairs write, but
    /// for the busy set (an atomic word a QP sets when it gains work for the progress). Off
    /// (the default): a post transmits at once when the device lock is free, and a poll runs
    /// the transport first, which suits one core.
    pub fn set_progress_only(&self, on: bool) {
        self.progress_only.store(on, Ordering::Relaxed);
    }

    /// Whether [`set_progress_only`](Self::set_progress_only) is on.
    #[inline(always)]
    pub(crate) fn progress_only(&self) -> bool {
        self.progress_only.load(Ordering::Relaxed)
    }

    /// The progress a poll runs before it looks at its CQ (none with
    /// [`set_progress_only`](Self::set_progress_only)).
    #[inline(always)]
    pub(crate) fn poll_progress(&self) {
        if !self.progress_only() {
            self.progress();
        }
    }

    /// `(acquisitions, attempts that found it held)` of the device lock so far: what the
    /// `lock-count` feature counts, for tests that show which paths take the lock every queue
    /// pair of the device shares.
    #[cfg(feature = "lock-count")]
    pub fn device_lock_counts(&self) -> (u64, u64) {
        self.core.counts()
    }

    pub(crate) fn now(&self) -> u64 {
        self.clock.now_us()
    }

    pub(crate) fn hub(&self) -> &EventHub {
        // SAFETY: written in `new`; the block lives as long as `self`; only shared references
        // to the hub are ever made (it is all atomics).
        unsafe { self.hub.as_ref() }
    }

    pub(crate) fn lock(&self) -> spin::MutexGuard<'_, Core<L>> {
        self.core.lock()
    }

    fn progress_locked(&self, core: &mut Core<L>) {
        let now = self.now();
        // Bounded: RX_BUDGET frames a call, however many the segment sends.
        for _ in 0..RX_BUDGET {
            // SAFETY: the receive buffer is FRAME bytes of the device block, reached only
            // through the locked core (`core` is borrowed mutably here).
            let rx = unsafe { core::slice::from_raw_parts_mut(core.rx.as_ptr(), FRAME) };
            // A frame kept for its QP first (it is still in the buffer), then looped-back
            // frames, then the NIC's.
            let kept = core::mem::take(&mut core.held);
            let looped = if kept != 0 {
                Some(kept)
            } else {
                core.tables().loopback.pop(rx)
            };
            let n = match looped {
                Some(n) => n,
                None => {
                    // Looked at in the NIC's buffer: a frame not for this interface is
                    // dropped there, uncopied and unchecked.
                    let (link, t) = core.parts();
                    match link.receive_if(rx, |f| t.port.wants(f)) {
                        Some(Some(n)) => n,
                        Some(None) => continue,
                        None => break,
                    }
                }
            };
            let Some(frame) = rx.get(..n) else { continue };
            let (link, t) = core.parts();
            // One call site: the port's classification is inlined here once. A kept frame
            // passed the port's checks already; its source may be this interface only if it
            // was looped back, which the port then allowed.
            match t.port.take(link, frame, now, looped.is_some()) {
                Ok(Some(p)) => {
                    if !self.dispatch(core, &p, now) {
                        // Its QP is locked elsewhere: kept, in order, for the next progress,
                        // and not counted as handed to the transport yet.
                        core.tables().port.unhand();
                        core.held = n;
                        break;
                    }
                }
                Ok(None) => self.for_stack(core, n, now),
                Err(_) => {}
            }
        }
        self.run_timers(core, now);
    }

    /// The IP stack's view of the NIC: frames that are not RoCE to this interface, and
    /// transmission of the stack's own frames (for example smoltcp's, through its `Device`).
    pub fn stack(&self) -> StackLink<'_, H, L, C> {
        StackLink { dev: self }
    }
}

/// A UD destination prepared once: the peer's IPv4 address and the outer header values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ah {
    pub(crate) ip: [u8; 4],
    pub(crate) tos: u8,
    pub(crate) ttl: u8,
}

/// The IP stack's side of the NIC the device shares ([`Rxe::stack`]), as a [`Link`].
pub struct StackLink<'d, H: Hal, L: Link, C: Clock> {
    dev: &'d Rxe<H, L, C>,
}

impl<H: Hal, L: Link, C: Clock> Link for StackLink<'_, H, L, C> {
    fn mac(&self) -> [u8; 6] {
        self.dev.mac
    }

    fn max_frame(&self) -> usize {
        self.dev.core.lock().link.max_frame()
    }

    fn transmit(&mut self, frame: &[u8]) -> core::result::Result<(), LinkError> {
        self.dev.core.lock().link.transmit(frame)
    }

    fn tx_ready(&mut self) -> bool {
        self.dev.core.lock().link.tx_ready()
    }

    fn receive(&mut self, buf: &mut [u8]) -> Option<usize> {
        let mut core = self.dev.core.lock();
        if let Some(n) = core.tables().stack.pop(buf) {
            return Some(n);
        }
        self.dev.progress_locked(&mut core);
        core.tables().stack.pop(buf)
    }
}
