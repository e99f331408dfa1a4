//! Queue pairs and shared receive queues: `ibv_create_qp[_ex]` / `ibv_destroy_qp` semantics with
//! the connection state machine as typestate.
//!
//! A [`QueuePair`] is typed by its transport (`T`: [`Rc`], [`Uc`], [`Ud`], [`Gsi`],
//! [`RawPacket`]) and its state (`S`: [`Reset`], [`Init`], [`Rtr`], [`Rts`], [`ErrState`]), and
//! carries the compile-time capacity of its driver-side work-queue bookkeeping (`SQ`, `RQ`:
//! powers of two). It borrows its protection domain, completion queues and shared receive queue,
//! so none of them can be destroyed while it exists:
//!
//! ```compile_fail
//! # use bareverbs::verbs::*;
//! # fn f<P: Provider>(ctx: &Context<P>) -> bareverbs::Result<()> {
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(16)?;
//! let qp = pd.qp_builder(&cq, &cq).build::<Rc, 16, 16>()?;
//! drop(pd); // error: `pd` is borrowed by `qp`
//! drop(qp);
//! # Ok(()) }
//! ```
//!
//! and a transition exists only from the state it starts in:
//!
//! ```compile_fail
//! # use bareverbs::verbs::*;
//! # fn f<P: Provider>(ctx: &Context<P>) -> bareverbs::Result<()> {
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(16)?;
//! let qp = pd.qp_builder(&cq, &cq).build::<Rc, 16, 16>()?;
//! let qp = qp.rts(&ConnectedRts::new(0)); // error: no `rts` on a QP in RESET
//! # Ok(()) }
//! ```
//!
//! Posting exists only in the states that allow it: sends in RTS, receives from INIT on
//! (case 8 of the acceptance list — posting in RESET fails — at compile time):
//!
//! ```compile_fail
//! # use bareverbs::verbs::*;
//! # fn f<'a, P: Provider>(
//! #     pd: &'a ProtectionDomain<'a, P>,
//! #     mut qp: QueuePair<'a, P, Rc, Reset, 16, 16>,
//! # ) -> bareverbs::Result<()> {
//! let mr = pd.register(64, AccessFlags::LOCAL_WRITE)?;
//! qp.post_recv(RecvRequest { wr_id: 1, mr, offset: 0, len: 64 }).map_err(|(_, e)| e)?;
//! # Ok(()) }
//! ```
//!
//! ```compile_fail
//! # use bareverbs::verbs::*;
//! # fn f<'a, P: Provider>(
//! #     pd: &'a ProtectionDomain<'a, P>,
//! #     mut qp: QueuePair<'a, P, Rc, Init, 16, 16>,
//! # ) -> bareverbs::Result<()> {
//! let mr = pd.register(64, AccessFlags::LOCAL_WRITE)?;
//! qp.post_send(SendRequest::send(1, mr, 0, 64)).map_err(|(_, e)| e)?;
//! # Ok(()) }
//! ```
//!
//! (The README's lifecycle example is the compiling counterpart of all of these.)

use core::marker::PhantomData;
use core::mem::ManuallyDrop;

use super::qp_types::*;
use super::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, WorkCompletion};
use super::{CompletionQueue, Context, Gid, MemoryRegion, Mtu, ProtectionDomain, Provider};
use crate::error::{Error, Fault, Feature, Op, Param, Queue, Result, Unsupported};

/// Largest packet sequence number or QP number (24 bits).
const MAX_24BIT: u32 = 0x00FF_FFFF;

/// A queue pair's transport, at the type level.
pub trait Transport: sealed::Sealed {
    /// The runtime type.
    const TYPE: QpType;
    /// What the RESET → INIT transition needs.
    type InitAttr;
    /// What the INIT → RTR transition needs.
    type RtrAttr;
    /// What the RTR → RTS transition needs.
    type RtsAttr;
    #[doc(hidden)]
    fn init_modify(attr: &Self::InitAttr) -> ModifyAttr;
    #[doc(hidden)]
    fn rtr_modify(attr: &Self::RtrAttr) -> ModifyAttr;
    #[doc(hidden)]
    fn rts_modify(attr: &Self::RtsAttr) -> ModifyAttr;
}

mod sealed {
    pub trait Sealed {}
}

/// RESET → INIT of a connected QP (RC, UC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectedInit {
    /// Port (1-based).
    pub port: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// What remote peers may do.
    pub access: AccessFlags,
}

impl Default for ConnectedInit {
    fn default() -> Self {
        ConnectedInit {
            port: 1,
            pkey_index: 0,
            access: AccessFlags::empty(),
        }
    }
}

/// INIT → RTR of a connected QP: the peer's address and QP number (RoCE: always a GRH).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectedRtr {
    /// The peer's QP number.
    pub dest_qpn: u32,
    /// The first PSN expected from the peer.
    pub rq_psn: u32,
    /// The path to the peer.
    pub av: AddressVector,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Outstanding RDMA reads/atomics accepted from the peer.
    pub max_dest_rd_atomic: u8,
    /// Receiver-not-ready NAK timer code.
    pub min_rnr_timer: u8,
}

impl ConnectedRtr {
    /// RTR towards `dest_qpn` at `av`, expecting PSN `rq_psn`; MTU 1024, no RDMA reads
    /// accepted, RNR timer code 12.
    pub fn new(dest_qpn: u32, rq_psn: u32, av: AddressVector) -> Self {
        ConnectedRtr {
            dest_qpn,
            rq_psn,
            av,
            path_mtu: Mtu::Mtu1024,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 12,
        }
    }
}

/// RTR → RTS of a connected QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectedRts {
    /// The first PSN sent.
    pub sq_psn: u32,
    /// Local ACK timeout code.
    pub timeout: u8,
    /// Retries on timeout.
    pub retry_cnt: u8,
    /// Retries on receiver-not-ready (7: infinite).
    pub rnr_retry: u8,
    /// Outstanding RDMA reads/atomics this QP initiates.
    pub max_rd_atomic: u8,
}

impl ConnectedRts {
    /// RTS sending from PSN `sq_psn`; timeout 14, 7 retries, no RDMA reads initiated.
    pub fn new(sq_psn: u32) -> Self {
        ConnectedRts {
            sq_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 0,
        }
    }
}

/// RESET → INIT of a datagram QP (UD, GSI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatagramInit {
    /// Port (1-based).
    pub port: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Q_Key.
    pub qkey: u32,
}

impl DatagramInit {
    /// INIT on port 1, P_Key index 0, with `qkey`.
    pub fn new(qkey: u32) -> Self {
        DatagramInit {
            port: 1,
            pkey_index: 0,
            qkey,
        }
    }
}

/// RTR → RTS of a datagram QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatagramRts {
    /// The first PSN sent.
    pub sq_psn: u32,
}

fn connected_init(a: &ConnectedInit) -> ModifyAttr {
    let mut m = ModifyAttr::to_state(QpState::Init);
    m.mask |= QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    (m.port, m.pkey_index, m.access) = (a.port, a.pkey_index, a.access);
    m
}

fn connected_rtr(a: &ConnectedRtr) -> ModifyAttr {
    let mut m = ModifyAttr::to_state(QpState::Rtr);
    m.mask |= QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    m.av = Some(a.av);
    (m.path_mtu, m.dest_qpn, m.rq_psn) = (a.path_mtu, a.dest_qpn, a.rq_psn);
    (m.max_dest_rd_atomic, m.min_rnr_timer) = (a.max_dest_rd_atomic, a.min_rnr_timer);
    m
}

fn connected_rts(a: &ConnectedRts) -> ModifyAttr {
    let mut m = ModifyAttr::to_state(QpState::Rts);
    m.mask |= QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::SQ_PSN
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    (m.sq_psn, m.timeout, m.retry_cnt) = (a.sq_psn, a.timeout, a.retry_cnt);
    (m.rnr_retry, m.max_rd_atomic) = (a.rnr_retry, a.max_rd_atomic);
    m
}

fn datagram_init(a: &DatagramInit) -> ModifyAttr {
    let mut m = ModifyAttr::to_state(QpState::Init);
    m.mask |= QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
    (m.port, m.pkey_index, m.qkey) = (a.port, a.pkey_index, a.qkey);
    m
}

fn datagram_rts(a: &DatagramRts) -> ModifyAttr {
    let mut m = ModifyAttr::to_state(QpState::Rts);
    m.mask |= QpAttrMask::SQ_PSN;
    m.sq_psn = a.sq_psn;
    m
}

macro_rules! transport {
    ($(#[$doc:meta])* $name:ident, $ty:expr, connected) => {
        transport!(@def $(#[$doc])* $name, $ty, ConnectedInit, ConnectedRtr, ConnectedRts,
            connected_init, connected_rtr, connected_rts);
    };
    ($(#[$doc:meta])* $name:ident, $ty:expr, datagram) => {
        transport!(@def $(#[$doc])* $name, $ty, DatagramInit, (), DatagramRts,
            datagram_init, (|_: &()| ModifyAttr::to_state(QpState::Rtr)), datagram_rts);
        impl Datagram for $name {}
    };
    (@def $(#[$doc:meta])* $name:ident, $ty:expr, $i:ty, $r:ty, $s:ty, $fi:expr, $fr:expr, $fs:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl Transport for $name {
            const TYPE: QpType = $ty;
            type InitAttr = $i;
            type RtrAttr = $r;
            type RtsAttr = $s;
            fn init_modify(a: &$i) -> ModifyAttr { ($fi)(a) }
            fn rtr_modify(a: &$r) -> ModifyAttr { ($fr)(a) }
            fn rts_modify(a: &$s) -> ModifyAttr { ($fs)(a) }
        }
    };
}

/// Datagram transports: INIT takes a Q_Key, RTR nothing, and [`QueuePair::ready`] goes
/// straight from RESET to RTS.
pub trait Datagram:
    Transport<InitAttr = DatagramInit, RtrAttr = (), RtsAttr = DatagramRts>
{
}

transport!(
    /// Reliable connected.
    Rc, QpType::Rc, connected);
transport!(
    /// Unreliable connected.
    Uc, QpType::Uc, connected);
transport!(
    /// Unreliable datagram.
    Ud, QpType::Ud, datagram);
transport!(
    /// The GSI QP (QP1).
    Gsi, QpType::Gsi, datagram);
transport!(
    /// Raw Ethernet packets.
    RawPacket, QpType::RawPacket, datagram);

/// A queue pair state, at the type level.
pub trait State: sealed::Sealed {
    /// The runtime state.
    const STATE: QpState;
}

macro_rules! states {
    ($($(#[$doc:meta])* $name:ident => $s:expr),*) => { $(
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl State for $name { const STATE: QpState = $s; }
    )* };
}
states!(
    /// RESET.
    Reset => QpState::Reset,
    /// INIT.
    Init => QpState::Init,
    /// Ready to receive.
    Rtr => QpState::Rtr,
    /// Ready to send.
    Rts => QpState::Rts,
    /// ERROR.
    ErrState => QpState::Err
);

/// `wr_id` bit marking a work request posted by the safe path: the rest is a storage slot.
const SAFE: u64 = 1 << 63;
/// With [`SAFE`]: the slot is a receive queue's.
const SAFE_RECV: u64 = 1 << 62;

/// Refuses `wr_id`s that the safe path reserves (bit 63 set): a raw completion must never be
/// taken for a safe slot.
fn raw_wr_ids(mut ids: impl Iterator<Item = u64>) -> Result<()> {
    match ids.find(|id| id & SAFE != 0) {
        Some(id) => Err(Error::invalid(Param::WrId, id, SAFE - 1)),
        None => Ok(()),
    }
}

/// A buffer the device may use, held until its completion.
struct Posted<'a, P: Provider> {
    wr_id: u64,
    mr: MemoryRegion<'a, P>,
}

/// Driver-side bookkeeping of one work queue: storage for `N` posted buffers (fixed, no heap).
struct Slots<'a, P: Provider, const N: usize> {
    held: [Option<Posted<'a, P>>; N],
    /// Where the search for a free slot starts.
    next: usize,
    /// Ring slots of the device queue (≤ N).
    ring: u32,
}

impl<'a, P: Provider, const N: usize> Slots<'a, P, N> {
    const POWER_OF_TWO: () = assert!(
        N.is_power_of_two() && N <= 1 << 24,
        "work-queue capacity must be a power of two"
    );

    fn new(ring: u32) -> Self {
        let () = Self::POWER_OF_TWO;
        Slots {
            held: core::array::from_fn(|_| None),
            next: 0,
            ring,
        }
    }

    /// Finds `K` free slots (all or none).
    fn free<const K: usize>(&mut self) -> Option<[usize; K]> {
        let mut found = [0; K];
        let mut n = 0;
        for i in 0..N {
            if n == K {
                break;
            }
            let slot = (self.next + i) % N;
            if self.held[slot].is_none() {
                found[n] = slot;
                n += 1;
            }
        }
        (n == K).then(|| {
            self.next = (found[K.saturating_sub(1)] + 1) % N;
            found
        })
    }

    fn free_count(&self) -> u32 {
        self.held.iter().filter(|h| h.is_none()).count() as u32
    }
}

/// A safe send: the buffer (a whole memory region) moves into the queue pair and comes back
/// with the completion.
pub struct SendRequest<'a, P: Provider> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The buffer.
    pub mr: MemoryRegion<'a, P>,
    /// First byte sent.
    pub offset: u32,
    /// Bytes sent (for RDMA READ: received).
    pub len: u32,
    /// The operation.
    pub op: SendOp,
    /// Flags (the safe path always adds SIGNALED: every buffer comes back).
    pub flags: SendFlags,
    /// UD destination.
    pub ud: Option<UdDest>,
}

impl<'a, P: Provider> SendRequest<'a, P> {
    /// A SEND of `len` bytes of `mr` from `offset`.
    pub fn send(wr_id: u64, mr: MemoryRegion<'a, P>, offset: u32, len: u32) -> Self {
        SendRequest {
            wr_id,
            mr,
            offset,
            len,
            op: SendOp::Send,
            flags: SendFlags::empty(),
            ud: None,
        }
    }
}

/// A safe receive: the buffer moves into the queue pair and comes back with the completion.
pub struct RecvRequest<'a, P: Provider> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The buffer.
    pub mr: MemoryRegion<'a, P>,
    /// First byte written.
    pub offset: u32,
    /// Room for this many bytes.
    pub len: u32,
}

/// A completion from [`QueuePair::poll`]: the work completion and, for a safe post, its
/// buffer handed back.
pub struct Completion<'a, P: Provider> {
    /// The work completion (`wr_id` as the request gave it).
    pub wc: WorkCompletion,
    /// The buffer, for work requests posted by the safe path.
    pub mr: Option<MemoryRegion<'a, P>>,
}

/// States in which receives may be posted (INIT, RTR, RTS).
pub trait CanRecv: State {}
impl CanRecv for Init {}
impl CanRecv for Rtr {}
impl CanRecv for Rts {}

/// Builds a queue pair (`ibv_create_qp` / `ibv_create_qp_ex`).
pub struct QpBuilder<'a, P: Provider> {
    ctx: &'a Context<P>,
    pd: &'a P::Pd,
    send_cq: &'a P::Cq,
    recv_cq: &'a P::Cq,
    srq: Option<&'a P::Srq>,
    caps: QpCaps,
    sq_sig_all: bool,
    user_context: u64,
    ex: QpInitEx<'a>,
}

impl<'c, P: Provider> ProtectionDomain<'c, P> {
    /// Starts building a queue pair in this protection domain, completing sends to `send_cq`
    /// and receives to `recv_cq` (which may be the same CQ). Capacities default to 1 work
    /// request and 1 scatter/gather entry each way.
    pub fn qp_builder<'a>(
        &'a self,
        send_cq: &'a CompletionQueue<'_, P>,
        recv_cq: &'a CompletionQueue<'_, P>,
    ) -> QpBuilder<'a, P> {
        QpBuilder {
            ctx: self.context(),
            pd: self.raw(),
            send_cq: send_cq.raw(),
            recv_cq: recv_cq.raw(),
            srq: None,
            caps: QpCaps {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            user_context: 0,
            ex: QpInitEx::default(),
        }
    }

    /// Creates a shared receive queue (`ibv_create_srq`) whose driver-side bookkeeping holds
    /// `N` work requests (a power of two).
    pub fn create_srq<const N: usize>(
        &self,
        attr: SrqAttr,
    ) -> Result<SharedReceiveQueue<'_, P, N>> {
        let ctx = self.context();
        let actual = ctx.provider().plan_srq(&attr)?;
        if actual.max_wr as usize > N {
            return Err(Error::invalid(Param::SrqMaxWr, attr.max_wr, N as u64));
        }
        // SAFETY: owned by a SharedReceiveQueue that borrows this PD and the context; destroyed
        // or leaked when it is dropped.
        let raw = unsafe { ctx.provider().create_srq(self.raw(), &attr)? };
        Ok(SharedReceiveQueue {
            ctx,
            raw: ManuallyDrop::new(raw),
            _pd: PhantomData,
            _capacity: PhantomData,
        })
    }
}

impl<'a, P: Provider> QpBuilder<'a, P> {
    /// The requested capacities (the minimums: the QP gets at least these).
    pub fn caps(mut self, caps: QpCaps) -> Self {
        self.caps = caps;
        self
    }

    /// Whether every send generates a completion (else only those flagged SIGNALED).
    pub fn sq_sig_all(mut self, on: bool) -> Self {
        self.sq_sig_all = on;
        self
    }

    /// A value kept with the QP (`qp_context`).
    pub fn user_context(mut self, value: u64) -> Self {
        self.user_context = value;
        self
    }

    /// Receives come from `srq` (RC and UD only); the receive capacities are then ignored and
    /// reported as 0.
    pub fn srq<const N: usize>(mut self, srq: &'a SharedReceiveQueue<'_, P, N>) -> Self {
        self.srq = Some(srq.raw());
        self
    }

    /// The `_ex` attributes (`ibv_create_qp_ex`).
    pub fn ex(mut self, ex: QpInitEx<'a>) -> Self {
        self.ex = ex;
        self
    }

    /// Creates the queue pair, in RESET, with driver-side work-queue capacity `SQ` and `RQ`
    /// (powers of two: compile-time checked).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for capacities beyond the device's limits or beyond `SQ` / `RQ`
    /// (naming the parameter and the limit), [`Unsupported`] for a type or feature the device
    /// lacks, and the device's errors; nothing is left behind on failure.
    pub fn build<T: Transport, const SQ: usize, const RQ: usize>(
        self,
    ) -> Result<QueuePair<'a, P, T, Reset, SQ, RQ>> {
        let has_srq = self.srq.is_some();
        if has_srq && !T::TYPE.may_use_srq() {
            return Err(Error::Unsupported(Unsupported::Feature(
                Feature::SrqOnQpType,
            )));
        }
        let init = QpInit {
            qp_type: T::TYPE,
            caps: self.caps,
            sq_sig_all: self.sq_sig_all,
            has_srq,
            ex: self.ex,
        };
        let provider = self.ctx.provider();
        let actual = provider.plan_qp(&init)?;
        if actual.max_send_wr as usize > SQ {
            return Err(Error::invalid(
                Param::MaxSendWr,
                self.caps.max_send_wr,
                SQ as u64,
            ));
        }
        if actual.max_recv_wr as usize > RQ {
            return Err(Error::invalid(
                Param::MaxRecvWr,
                self.caps.max_recv_wr,
                RQ as u64,
            ));
        }
        // SAFETY: the QP is owned by a QueuePair that borrows the context (and PD, CQs, SRQ);
        // it is destroyed or leaked when that is dropped.
        let raw =
            unsafe { provider.create_qp(self.pd, self.send_cq, self.recv_cq, self.srq, &init)? };
        let caps = provider.qp_caps(&raw);
        Ok(QueuePair {
            inner: QpInner {
                ctx: self.ctx,
                raw: ManuallyDrop::new(raw),
                caps,
                user_context: self.user_context,
                mcast: 0,
                send_cq: self.send_cq,
                recv_cq: self.recv_cq,
                sq: ManuallyDrop::new(Slots::new(caps.max_send_wr)),
                rq: ManuallyDrop::new(Slots::new(caps.max_recv_wr)),
                _borrows: PhantomData,
            },
            _t: PhantomData,
        })
    }
}

/// The state-independent part of a queue pair; it owns the device object and the buffers
/// posted by the safe path.
struct QpInner<'a, P: Provider, const SQ: usize, const RQ: usize> {
    ctx: &'a Context<P>,
    raw: ManuallyDrop<P::Qp>,
    caps: QpCaps,
    user_context: u64,
    mcast: u32,
    send_cq: &'a P::Cq,
    recv_cq: &'a P::Cq,
    sq: ManuallyDrop<Slots<'a, P, SQ>>,
    rq: ManuallyDrop<Slots<'a, P, RQ>>,
    _borrows: PhantomData<(&'a P::Pd, &'a P::Srq)>,
}

impl<'a, P: Provider, const SQ: usize, const RQ: usize> QpInner<'a, P, SQ, RQ> {
    /// Destroys the device QP; then (only then) the held buffers may go. On failure the QP is
    /// handed back with its buffers.
    fn destroy_raw(&mut self) -> Result<(), Error> {
        // SAFETY: `raw` is taken here and put back on failure; on success the caller never
        // touches it again (it forgets or drops `self` without running Drop's destroy).
        let raw = unsafe { ManuallyDrop::take(&mut self.raw) };
        match self.ctx.provider().destroy_qp(raw) {
            Ok(()) => {
                // SAFETY: the device no longer uses the QP, so its buffers may be freed; each
                // field is dropped once and never used again.
                unsafe {
                    ManuallyDrop::drop(&mut self.sq);
                    ManuallyDrop::drop(&mut self.rq);
                }
                Ok(())
            }
            Err((raw, e)) => {
                self.raw = ManuallyDrop::new(raw);
                Err(e)
            }
        }
    }
}

impl<P: Provider, const SQ: usize, const RQ: usize> Drop for QpInner<'_, P, SQ, RQ> {
    fn drop(&mut self) {
        if let Err(e) = self.destroy_raw() {
            // The device may still use the rings and the posted buffers: keep them all.
            log::warn!("bareverbs: queue pair not destroyed ({e}); its memory is leaked");
        }
    }
}

/// A queue pair of transport `T` in state `S`, with work-queue bookkeeping for `SQ` send and
/// `RQ` receive work requests.
pub struct QueuePair<'a, P: Provider, T: Transport, S: State, const SQ: usize, const RQ: usize> {
    inner: QpInner<'a, P, SQ, RQ>,
    _t: PhantomData<(T, S)>,
}

impl<'a, P: Provider, T: Transport, S: State, const SQ: usize, const RQ: usize>
    QueuePair<'a, P, T, S, SQ, RQ>
{
    /// The QP number (`qp_num`).
    pub fn qp_num(&self) -> u32 {
        self.inner.ctx.provider().qp_num(&self.inner.raw)
    }

    /// The actual capacities, each ≥ the request.
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        T::TYPE
    }

    /// The state, as the type says.
    pub fn state(&self) -> QpState {
        S::STATE
    }

    /// The value given to [`QpBuilder::user_context`].
    pub fn user_context(&self) -> u64 {
        self.inner.user_context
    }

    /// Ring slots of the send and receive queues (≤ `SQ`, `RQ`).
    pub fn work_queue_slots(&self) -> (u32, u32) {
        (self.inner.sq.ring, self.inner.rq.ring)
    }

    /// Polls this QP's completions (from its send CQ, then its receive CQ), handing back the
    /// buffers of safe posts. Completions of other QPs sharing a CQ are left for them: polling
    /// stops at the first one.
    pub fn poll_one(&mut self) -> Result<Option<Completion<'a, P>>> {
        let provider = self.inner.ctx.provider();
        let cqs = [self.inner.send_cq, self.inner.recv_cq];
        let same = core::ptr::eq(cqs[0], cqs[1]);
        for cq in &cqs[..if same { 1 } else { 2 }] {
            let mut wc = [WorkCompletion::default()];
            if provider.poll_cq(cq, Some(&self.inner.raw), &mut wc)? == 1 {
                return self.resolve(wc[0]).map(Some);
            }
        }
        Ok(None)
    }

    /// Polls up to `K` completions into `out` (appended); returns how many.
    pub fn poll<const K: usize>(
        &mut self,
        out: &mut heapless::Vec<Completion<'a, P>, K>,
    ) -> Result<usize> {
        let mut n = 0;
        while !out.is_full() {
            match self.poll_one()? {
                Some(c) => {
                    // Cannot fail: checked `is_full` above.
                    let _ = out.push(c);
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }

    /// Maps a completion back to its request: a safe post's slot gives back the `wr_id` and
    /// the buffer. A slot that is out of range or not in use is the device's error, never an
    /// index.
    fn resolve(&mut self, mut wc: WorkCompletion) -> Result<Completion<'a, P>> {
        if wc.wr_id & SAFE == 0 {
            return Ok(Completion { wc, mr: None });
        }
        let slot = (wc.wr_id & !(SAFE | SAFE_RECV)) as usize;
        let held = if wc.wr_id & SAFE_RECV != 0 {
            self.inner.rq.held.get_mut(slot)
        } else {
            self.inner.sq.held.get_mut(slot)
        };
        let Some(posted) = held.and_then(Option::take) else {
            let fault = Fault::Value {
                field: "completion wr_id",
                value: wc.wr_id,
            };
            return Err(Error::Protocol {
                op: Op::PollCq,
                fault,
            });
        };
        wc.wr_id = posted.wr_id;
        Ok(Completion {
            wc,
            mr: Some(posted.mr),
        })
    }

    /// The provider's object.
    pub fn raw(&self) -> &P::Qp {
        &self.inner.raw
    }

    /// Queries the device (`ibv_query_qp`).
    pub fn query(&self) -> Result<QpAttr> {
        self.inner.ctx.provider().query_qp(&self.inner.raw)
    }

    /// Joins a multicast group (`ibv_attach_mcast`).
    pub fn attach_mcast(&mut self, gid: Gid, lid: u16) -> Result<()> {
        self.inner
            .ctx
            .provider()
            .attach_mcast(&self.inner.raw, gid, lid)?;
        self.inner.mcast += 1;
        Ok(())
    }

    /// Leaves a multicast group (`ibv_detach_mcast`).
    pub fn detach_mcast(&mut self, gid: Gid, lid: u16) -> Result<()> {
        self.inner
            .ctx
            .provider()
            .detach_mcast(&self.inner.raw, gid, lid)?;
        self.inner.mcast = self.inner.mcast.saturating_sub(1);
        Ok(())
    }

    /// Destroys the queue pair (`ibv_destroy_qp`). Fails with [`Error::Busy`] while it is
    /// attached to a multicast group, or with the device's error, handing the QP back.
    pub fn destroy(self) -> Result<(), (Self, Error)> {
        if self.inner.mcast > 0 {
            return Err((self, Error::Busy { op: Op::DestroyQp }));
        }
        let mut this = ManuallyDrop::new(self);
        match this.inner.destroy_raw() {
            // Destroyed, buffers freed: forget the rest (references and counters only).
            Ok(()) => Ok(()),
            Err(e) => Err((ManuallyDrop::into_inner(this), e)),
        }
    }

    fn modify<S2: State>(
        mut self,
        attr: &ModifyAttr,
    ) -> Result<QueuePair<'a, P, T, S2, SQ, RQ>, (Self, Error)> {
        let provider = self.inner.ctx.provider();
        if let Err(e) = validate(provider.caps(), attr) {
            return Err((self, e));
        }
        match provider.modify_qp(&mut self.inner.raw, attr) {
            Ok(()) => Ok(QueuePair {
                inner: self.inner,
                _t: PhantomData,
            }),
            Err(e) => Err((self, e)),
        }
    }

    /// Any state → RESET.
    pub fn reset(self) -> Result<QueuePair<'a, P, T, Reset, SQ, RQ>, (Self, Error)> {
        self.modify(&ModifyAttr::to_state(QpState::Reset))
    }

    /// Any state → ERROR (outstanding work requests complete flushed).
    pub fn to_error(self) -> Result<QueuePair<'a, P, T, ErrState, SQ, RQ>, (Self, Error)> {
        self.modify(&ModifyAttr::to_state(QpState::Err))
    }
}

impl<'a, P: Provider, T: Transport, const SQ: usize, const RQ: usize>
    QueuePair<'a, P, T, Rts, SQ, RQ>
{
    /// Posts send work requests as given (`ibv_post_send`): all or none, written to the ring
    /// and published with one index store and one doorbell.
    ///
    /// # Errors
    ///
    /// [`Error::QueueFull`] when the batch does not fit (nothing posted), `InvalidInput` for
    /// more SGEs than the QP's `max_send_sge` or a `wr_id` with bit 63 set (reserved for the
    /// safe path), `Unsupported` for operations the device or transport lacks.
    ///
    /// # Safety
    ///
    /// Every buffer the requests name stays allocated, registered, and untouched by the CPU
    /// until its completion has been polled (or the QP destroyed).
    pub unsafe fn post_send_raw(&mut self, wrs: &[SendWr<'_>]) -> Result<()> {
        raw_wr_ids(wrs.iter().map(|w| w.wr_id))?;
        // SAFETY: forwarded from our caller.
        unsafe {
            self.inner
                .ctx
                .provider()
                .post_send(&mut self.inner.raw, wrs)
        }
    }

    /// Posts one safe send: the buffer moves into the QP until its completion.
    pub fn post_send(
        &mut self,
        req: SendRequest<'a, P>,
    ) -> Result<(), (SendRequest<'a, P>, Error)> {
        self.post_send_batch([req]).map_err(|([r], e)| (r, e))
    }

    /// Posts `K` safe sends with one doorbell, all or none: on failure every request (with its
    /// buffer) is handed back.
    pub fn post_send_batch<const K: usize>(
        &mut self,
        reqs: [SendRequest<'a, P>; K],
    ) -> Result<(), ([SendRequest<'a, P>; K], Error)> {
        let Some(slots) = self.inner.sq.free::<K>() else {
            let free = self.inner.sq.free_count();
            return Err((
                reqs,
                Error::QueueFull {
                    queue: Queue::Send,
                    free,
                },
            ));
        };
        let mut sges = [Sge::default(); K];
        for (sge, r) in sges.iter_mut().zip(&reqs) {
            match r.mr.sge(r.offset, r.len) {
                Ok(s) => *sge = s,
                Err(e) => return Err((reqs, e)),
            }
        }
        let wrs: [SendWr<'_>; K] = core::array::from_fn(|i| SendWr {
            wr_id: SAFE | slots[i] as u64,
            sg_list: core::slice::from_ref(&sges[i]),
            op: reqs[i].op,
            flags: reqs[i].flags | SendFlags::SIGNALED,
            ud: reqs[i].ud,
        });
        let provider = self.inner.ctx.provider();
        // SAFETY: each buffer moves into the QP's storage below, before anything else can
        // reach it, and leaves it only with its completion (or after the QP is destroyed).
        if let Err(e) = unsafe { provider.post_send(&mut self.inner.raw, &wrs) } {
            return Err((reqs, e));
        }
        for (slot, r) in slots.into_iter().zip(reqs) {
            self.inner.sq.held[slot] = Some(Posted {
                wr_id: r.wr_id,
                mr: r.mr,
            });
        }
        Ok(())
    }
}

impl<'a, P: Provider, T: Transport, S: CanRecv, const SQ: usize, const RQ: usize>
    QueuePair<'a, P, T, S, SQ, RQ>
{
    /// Posts receive work requests as given (`ibv_post_recv`): all or none, one doorbell.
    ///
    /// # Errors
    ///
    /// As [`post_send_raw`](QueuePair::post_send_raw), for the receive queue.
    ///
    /// # Safety
    ///
    /// As [`post_send_raw`](QueuePair::post_send_raw).
    pub unsafe fn post_recv_raw(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        raw_wr_ids(wrs.iter().map(|w| w.wr_id))?;
        // SAFETY: forwarded from our caller.
        unsafe {
            self.inner
                .ctx
                .provider()
                .post_recv(&mut self.inner.raw, wrs)
        }
    }

    /// Posts one safe receive: the buffer moves into the QP until its completion.
    pub fn post_recv(
        &mut self,
        req: RecvRequest<'a, P>,
    ) -> Result<(), (RecvRequest<'a, P>, Error)> {
        let Some([slot]) = self.inner.rq.free::<1>() else {
            let free = self.inner.rq.free_count();
            return Err((
                req,
                Error::QueueFull {
                    queue: Queue::Recv,
                    free,
                },
            ));
        };
        let sge = match req.mr.sge(req.offset, req.len) {
            Ok(s) => s,
            Err(e) => return Err((req, e)),
        };
        let wr = RecvWr {
            wr_id: SAFE | SAFE_RECV | slot as u64,
            sg_list: core::slice::from_ref(&sge),
        };
        let provider = self.inner.ctx.provider();
        // SAFETY: the buffer moves into the QP's storage right after, and leaves it only with
        // its completion (or after the QP is destroyed).
        if let Err(e) = unsafe { provider.post_recv(&mut self.inner.raw, &[wr]) } {
            return Err((req, e));
        }
        self.inner.rq.held[slot] = Some(Posted {
            wr_id: req.wr_id,
            mr: req.mr,
        });
        Ok(())
    }
}

/// Checks a modify's values against the device's limits before the device sees them.
fn validate(caps: &super::DeviceCaps, m: &ModifyAttr) -> Result<()> {
    let has = |bit: QpAttrMask| m.mask.contains(bit);
    if has(QpAttrMask::PORT) && (m.port == 0 || m.port > caps.phys_port_cnt) {
        return Err(Error::invalid(Param::Port, m.port, caps.phys_port_cnt));
    }
    if has(QpAttrMask::PKEY_INDEX) && m.pkey_index >= caps.max_pkeys {
        let max = caps.max_pkeys.saturating_sub(1);
        return Err(Error::invalid(Param::PkeyIndex, m.pkey_index, max));
    }
    for (bit, param, v) in [
        (QpAttrMask::SQ_PSN, Param::Psn, m.sq_psn),
        (QpAttrMask::RQ_PSN, Param::Psn, m.rq_psn),
        (QpAttrMask::DEST_QPN, Param::QpNumber, m.dest_qpn),
    ] {
        if has(bit) && v > MAX_24BIT {
            return Err(Error::invalid(param, v, MAX_24BIT));
        }
    }
    if has(QpAttrMask::MAX_QP_RD_ATOMIC) && u32::from(m.max_rd_atomic) > caps.max_qp_init_rd_atom {
        let max = caps.max_qp_init_rd_atom;
        return Err(Error::invalid(Param::MaxRdAtomic, m.max_rd_atomic, max));
    }
    if has(QpAttrMask::MAX_DEST_RD_ATOMIC) && u32::from(m.max_dest_rd_atomic) > caps.max_qp_rd_atom
    {
        let max = caps.max_qp_rd_atom;
        return Err(Error::invalid(
            Param::MaxRdAtomic,
            m.max_dest_rd_atomic,
            max,
        ));
    }
    if let (true, Some(av)) = (has(QpAttrMask::AV), m.av) {
        let max = caps.gid_tbl_len.saturating_sub(1);
        if u32::from(av.sgid_index) > max {
            return Err(Error::invalid(Param::GidIndex, av.sgid_index, max));
        }
        if av.flow_label > 0xF_FFFF {
            return Err(Error::invalid(Param::FlowLabel, av.flow_label, 0xF_FFFFu32));
        }
    }
    Ok(())
}

impl<'a, P: Provider, T: Transport, const SQ: usize, const RQ: usize>
    QueuePair<'a, P, T, Reset, SQ, RQ>
{
    /// RESET → INIT.
    pub fn init(
        self,
        attr: &T::InitAttr,
    ) -> Result<QueuePair<'a, P, T, Init, SQ, RQ>, (Self, Error)> {
        self.modify(&T::init_modify(attr))
    }
}

impl<'a, P: Provider, T: Transport, const SQ: usize, const RQ: usize>
    QueuePair<'a, P, T, Init, SQ, RQ>
{
    /// INIT → RTR.
    pub fn rtr(self, attr: &T::RtrAttr) -> Result<QueuePair<'a, P, T, Rtr, SQ, RQ>, (Self, Error)> {
        self.modify(&T::rtr_modify(attr))
    }
}

impl<'a, P: Provider, T: Transport, const SQ: usize, const RQ: usize>
    QueuePair<'a, P, T, Rtr, SQ, RQ>
{
    /// RTR → RTS.
    pub fn rts(self, attr: &T::RtsAttr) -> Result<QueuePair<'a, P, T, Rts, SQ, RQ>, (Self, Error)> {
        self.modify(&T::rts_modify(attr))
    }
}

impl<'a, P: Provider, T: Datagram, const SQ: usize, const RQ: usize>
    QueuePair<'a, P, T, Reset, SQ, RQ>
{
    /// RESET → INIT → RTR → RTS in one call, for datagram QPs (port 1, P_Key index 0).
    /// On failure the QP is reset and handed back in RESET.
    pub fn ready(
        self,
        qkey: u32,
        sq_psn: u32,
    ) -> Result<QueuePair<'a, P, T, Rts, SQ, RQ>, (Self, Error)> {
        let init = self.init(&DatagramInit::new(qkey))?;
        let rtr = match init.rtr(&()) {
            Ok(q) => q,
            Err((q, e)) => return Err((back_to_reset(q), e)),
        };
        match rtr.rts(&DatagramRts { sq_psn }) {
            Ok(q) => Ok(q),
            Err((q, e)) => Err((back_to_reset(q), e)),
        }
    }
}

/// Resets a QP whose multi-step transition failed half-way. If even that fails the QP is
/// returned typed as RESET anyway (the caller only gets a QP that it can destroy or retry).
fn back_to_reset<'a, P: Provider, T: Transport, S: State, const SQ: usize, const RQ: usize>(
    qp: QueuePair<'a, P, T, S, SQ, RQ>,
) -> QueuePair<'a, P, T, Reset, SQ, RQ> {
    match qp.reset() {
        Ok(q) => q,
        Err((q, e)) => {
            log::warn!("bareverbs: QP could not be reset after a failed transition: {e}");
            QueuePair {
                inner: q.inner,
                _t: PhantomData,
            }
        }
    }
}

/// A shared receive queue (`ibv_srq`) with driver-side bookkeeping for `N` work requests.
pub struct SharedReceiveQueue<'a, P: Provider, const N: usize> {
    ctx: &'a Context<P>,
    raw: ManuallyDrop<P::Srq>,
    _pd: PhantomData<&'a P::Pd>,
    _capacity: PhantomData<[u64; N]>,
}

impl<'a, P: Provider, const N: usize> SharedReceiveQueue<'a, P, N> {
    /// The actual attributes (each ≥ the request).
    pub fn attr(&self) -> SrqAttr {
        self.ctx.provider().srq_attr(&self.raw)
    }

    /// The provider's object.
    pub fn raw(&self) -> &P::Srq {
        &self.raw
    }

    /// Posts receive work requests (`ibv_post_srq_recv`): all or none, one doorbell.
    ///
    /// # Safety
    ///
    /// As [`QueuePair::post_send_raw`].
    pub unsafe fn post_recv_raw(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        // SAFETY: forwarded from our caller.
        unsafe { self.ctx.provider().post_srq_recv(&self.raw, wrs) }
    }

    /// Destroys the SRQ (`ibv_destroy_srq`), handing it back on failure.
    pub fn destroy(self) -> Result<(), (Self, Error)> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `raw` is taken once; `this` is not dropped as a whole, and is rebuilt with
        // the raw SRQ on failure.
        let raw = unsafe { ManuallyDrop::take(&mut this.raw) };
        match this.ctx.provider().destroy_srq(raw) {
            Ok(()) => Ok(()),
            Err((raw, e)) => {
                this.raw = ManuallyDrop::new(raw);
                Err((ManuallyDrop::into_inner(this), e))
            }
        }
    }
}

impl<P: Provider, const N: usize> Drop for SharedReceiveQueue<'_, P, N> {
    fn drop(&mut self) {
        // SAFETY: `raw` is taken once, here.
        let raw = unsafe { ManuallyDrop::take(&mut self.raw) };
        if let Err((raw, e)) = self.ctx.provider().destroy_srq(raw) {
            log::warn!("bareverbs: SRQ not destroyed ({e}); its memory is leaked");
            core::mem::forget(raw);
        }
    }
}
