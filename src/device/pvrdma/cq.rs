//! Completion queues: the ring of 64-byte CQEs the device produces (`shared/pvrdma-abi.md`
//! §10), polled into the caller's slice; each CQE checked and matched to its request
//! (`check_cqe`, shared with the cursor of `cursor.rs`), and the flush completions the driver
//! makes for a QP that went to the error state.
//!
//! Consumer protocol (L-CQ, RC-CQ): read prod_tail (acquire), read the CQEs, store cons_head
//! (release). When the ring looks empty, the POLL doorbell makes QEMU harvest what its host
//! has, and the ring is looked at again (§10.3).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use bareverbs_hal::{Hal, Mmio};

use super::abi::{self, wc_opcode};
use super::pdir::QueueMem;
use super::qptable::QpCtl;
use super::regs::db;
use super::ring::Ring;
use super::{CQES_PER_PAGE, Pvrdma};
use crate::error::{Error, Op, Queue, Result};
use crate::verbs::{WcFlags, WcOpcode, WcStatus, WorkCompletion};

/// A completion queue on a PVRDMA device.
pub struct Cq<H: Hal> {
    pub(crate) handle: u32,
    pub(crate) entries: u32,
    pub(crate) ring: Ring,
    pub(crate) mem: QueueMem<H>,
    pub(crate) poll: spin::Mutex<PollState>,
    /// CQEs reserved by the work queues that complete here (≤ entries).
    pub(crate) reserved: AtomicU32,
    /// Work queues attached here with requests left to flush.
    pub(crate) flushing: AtomicU32,
    /// QPs that complete here.
    pub(crate) users: AtomicU32,
    /// 1 while a refused CQE waits to be reported by the next poll.
    pub(crate) deferred: AtomicU32,
    /// CQEs of destroyed QPs still in the ring: they keep their room reserved until a poll
    /// drops them.
    pub(crate) stale: AtomicU32,
    /// The POLL doorbell word (`handle | CQ_POLL`).
    poll_bell: u32,
}

// SAFETY: the ring points into the CQ's own DMA memory; the consumer side is written only
// under `poll`, the rest is atomic.
unsafe impl<H: Hal + Send> Send for Cq<H> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync> Sync for Cq<H> {}

/// What the poll lock protects.
pub(crate) struct PollState {
    /// The consumer's free-running counter.
    pub(crate) head: u32,
    /// The last QP a CQE named.
    pub(crate) last: Last,
    /// A refusal met after good completions, reported by the next poll.
    pub(crate) deferred: Option<Error>,
}

// SAFETY: `last` points at a control block that is only dereferenced under the poll lock,
// which QP creation and destruction also take.
unsafe impl Send for PollState {}

/// A poller's cache of the last QP a CQE named: the table's answer for it on this CQ.
#[derive(Clone, Copy)]
pub(crate) struct Last {
    /// The CQE `qp` value it answers (meaningless while `roles` is 0).
    qp: u64,
    /// The QP's control block (dangling while `roles` is 0).
    ctl: NonNull<QpCtl>,
    /// [`SENDS`], [`RECVS`], [`OWN_RECVS`]: which of its completions come to this CQ.
    roles: u32,
    /// The QP number its completions report.
    qpn: u32,
}

/// The QP's send completions come to this CQ.
const SENDS: u32 = 1;
/// Its receive completions come to this CQ.
const RECVS: u32 = 2;
/// Its receive completions come to this CQ, from its own receive queue (not an SRQ).
const OWN_RECVS: u32 = 4;

impl Last {
    /// No QP cached: no CQE matches (`roles` 0).
    const NONE: Last = Last {
        qp: u64::MAX,
        ctl: NonNull::dangling(),
        roles: 0,
        qpn: 0,
    };

    /// The table's answer for QP `handle` on CQ `cq`; `None` when none of its completions
    /// come here (or it does not exist).
    #[inline(never)]
    fn lookup<H: Hal>(dev: &Pvrdma<H>, cq: &Cq<H>, handle: u32) -> Option<Last> {
        let (ctl, send, recv) = dev.qps.lookup(handle, cq.id())?;
        // SAFETY: the table named this CQ for the QP, so the control block lives while the
        // caller holds the CQ's poll lock.
        let c = unsafe { ctl.as_ref() };
        let (srq, qpn) = (c.srq, c.qpn);
        let roles = if send { SENDS } else { 0 }
            | if recv { RECVS } else { 0 }
            | if recv && !srq { OWN_RECVS } else { 0 };
        Some(Last {
            qp: u64::from(handle),
            ctl,
            roles,
            qpn,
        })
    }
}

impl PollState {
    pub(crate) fn new() -> Self {
        PollState {
            head: 0,
            last: Last::NONE,
            deferred: None,
        }
    }

    /// The consumer's position.
    pub(crate) fn head(&self) -> u32 {
        self.head
    }

    /// Forgets a cached control block (its QP is going away).
    pub(crate) fn forget(&mut self, ctl: NonNull<QpCtl>) {
        if self.last.ctl == ctl {
            self.last = Last::NONE;
        }
    }
}

/// How many times taking a poll lock is tried before the operation answers `Busy` (a poller
/// holds it only for a poll, or while its cursor lives).
const LOCK_TRIES: u32 = 1 << 16;

/// The poll locks of a QP's send and receive CQs (one when they are the same), taken in
/// address order and bounded: what creating, resetting, erroring and destroying a QP hold
/// while they change what the CQs' pollers read (the QP table and the QP's counters).
pub(crate) struct CqLocks<'a, H: Hal> {
    pub(crate) s: &'a Cq<H>,
    pub(crate) r: &'a Cq<H>,
    first: spin::MutexGuard<'a, PollState>,
    second: Option<spin::MutexGuard<'a, PollState>>,
}

impl<'a, H: Hal> CqLocks<'a, H> {
    /// Takes both locks, or answers `Busy` for `op` (nothing held).
    pub(crate) fn take(s: &'a Cq<H>, r: &'a Cq<H>, op: Op) -> Result<Self> {
        let lock = |cq: &'a Cq<H>| {
            (0..LOCK_TRIES)
                .find_map(|_| {
                    let g = cq.poll.try_lock();
                    if g.is_none() {
                        core::hint::spin_loop();
                    }
                    g
                })
                .ok_or(Error::Busy { op })
        };
        let (a, b) = if (s as *const Cq<H>) <= (r as *const Cq<H>) {
            (s, r)
        } else {
            (r, s)
        };
        let first = lock(a)?;
        let second = if core::ptr::eq(a, b) {
            None
        } else {
            Some(lock(b)?)
        };
        Ok(CqLocks {
            s,
            r,
            first,
            second,
        })
    }

    /// The consumer positions of the send and the receive CQ.
    pub(crate) fn heads(&self) -> (u32, u32) {
        let first = self.first.head();
        let second = self.second.as_ref().map_or(first, |g| g.head());
        if (self.s as *const Cq<H>) <= (self.r as *const Cq<H>) {
            (first, second)
        } else {
            (second, first)
        }
    }

    /// Forgets a control block the pollers cached (its QP is going away).
    pub(crate) fn forget(&mut self, ctl: NonNull<QpCtl>) {
        self.first.forget(ctl);
        if let Some(g) = self.second.as_mut() {
            g.forget(ctl);
        }
    }
}

impl<H: Hal> Cq<H> {
    /// The device's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Pages of ring memory, the ring-state page included.
    pub fn pages(&self) -> usize {
        self.mem.data.pages()
    }

    /// This CQ's identity in the QP table: its ring's physical address (unique while it lives).
    pub(crate) fn id(&self) -> u64 {
        self.mem.data.paddr()
    }

    /// Reserves `n` CQEs for a work queue, or says how many are left.
    pub(crate) fn reserve(&self, n: u32) -> Result<()> {
        let r = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                r.checked_add(n).filter(|&t| t <= self.entries)
            });
        r.map(|_| ()).map_err(|r| Error::QueueFull {
            queue: Queue::Cq,
            free: self.entries.saturating_sub(r),
        })
    }

    /// Reserves `n` CQEs for good (a QP whose creation had an unknown outcome may complete
    /// here), even beyond the CQ's size: the CQ then refuses every new QP.
    pub(crate) fn reserve_forever(&self, n: u32) {
        self.reserved.fetch_add(n, Ordering::AcqRel);
    }

    /// How many CQEs of QP `handle` (only receives, with `recv_only`) wait in the ring from the
    /// consumer position `head` (the caller holds the poll lock). An impossible producer index
    /// counts none.
    pub(crate) fn cqes_of(&self, head: u32, handle: u32, recv_only: bool) -> u32 {
        let ring = self.ring;
        let ready = ring.ready(head).unwrap_or(0);
        (0..ready)
            .filter(|&i| {
                let c = ring.slot(head.wrapping_add(i)).cast::<abi::Cqe>();
                // SAFETY: a CQE slot of the ring, published by the prod_tail read (acquire) in
                // `ready`; read as plain data.
                let (qp, op) = unsafe {
                    (
                        core::ptr::addr_of!((*c).qp).read_volatile(),
                        core::ptr::addr_of!((*c).opcode).read_volatile(),
                    )
                };
                qp == u64::from(handle)
                    && decode_opcode(op).is_some_and(|(_, recv)| recv || !recv_only)
            })
            .count() as u32
    }

    /// A CQE of a QP that is gone was dropped: if it was one a destroy left reserved, its room
    /// comes back.
    #[cold]
    pub(crate) fn drop_stale(&self) {
        if self
            .stale
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            self.unreserve(1);
        }
    }

    /// Gives back `n` reserved CQEs.
    pub(crate) fn unreserve(&self, n: u32) {
        let _ = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(n))
            });
    }
}

impl<H: Hal> Pvrdma<H> {
    /// Polls up to `out.len()` completions straight into `out` (`ibv_poll_cq`); a safe
    /// buffer whose completion is taken here goes back to its pool.
    ///
    /// Inline, only the emptiness test: a ring that looks empty, with no flushes and no
    /// refusal pending, gets the POLL doorbell (the device harvests what its host has) and one
    /// more look (§10.3); anything there goes to [`poll_first`](Self::poll_first) (one
    /// completion asked for) or [`poll_ready`](Self::poll_ready).
    #[inline(always)]
    pub(crate) fn poll_into(&self, cq: &Cq<H>, out: &mut [WorkCompletion]) -> Result<usize> {
        let ring = &cq.ring;
        if ring.prod().load(Ordering::Relaxed) == ring.cons().load(Ordering::Relaxed)
            && cq.flushing.load(Ordering::Relaxed) | cq.deferred.load(Ordering::Relaxed) == 0
        {
            self.uar.write32(db::CQ, cq.poll_bell);
            if ring.prod().load(Ordering::Relaxed) == ring.cons().load(Ordering::Relaxed) {
                return Ok(0);
            }
        }
        match out {
            // One completion asked for (the latency case): inline, straight-line.
            [wc] => self.poll_first(cq, core::slice::from_mut(wc)),
            _ => self.poll_ready(cq, out),
        }
    }

    /// The poll of one completion (`out` has one entry) on a CQ with something to report,
    /// inline and straight-line: the ring's index checked, the CQE taken if it is one of the
    /// cached QP that is the next outstanding request of its queue (`fast_cqe`). Every other
    /// case — a CQ with flushes or a refusal pending, an index that cannot be right, a CQE of
    /// another QP, of an SRQ, of a safe request, a mismatch — goes, with the lock, to
    /// [`harvest`](Self::harvest), the general loop.
    #[inline(always)]
    fn poll_first(&self, cq: &Cq<H>, out: &mut [WorkCompletion]) -> Result<usize> {
        let Some(mut guard) = cq.poll.try_lock() else {
            return busy();
        };
        let ring = &cq.ring;
        if cq.flushing.load(Ordering::Relaxed) | cq.deferred.load(Ordering::Relaxed) != 0 {
            return self.harvest(cq, guard, out, 0);
        }
        let head = guard.head;
        let Some(ready) = ring.ready(head) else {
            return self.harvest(cq, guard, out, 0);
        };
        let Some(first) = out.first_mut().filter(|_| ready != 0) else {
            return Ok(0);
        };
        if !fast_cqe(&guard.last, ring.cqe(head), None, first) {
            return self.harvest(cq, guard, out, 0);
        }
        guard.head = head.wrapping_add(1);
        // The CQE was read before its slot is handed back (release).
        ring.cons().store(ring.index(guard.head), Ordering::Release);
        Ok(1)
    }

    /// The poll of any number of completions on a CQ with something to report, out of line
    /// (the caller's code stays small: an empty poll runs without a stack frame): the ring's
    /// index checked, then each CQE of the cached QP that is the next outstanding request of
    /// its queue taken (`fast_cqe`); every other case goes to [`harvest`](Self::harvest) from
    /// where the fast loop stopped.
    #[inline(never)]
    fn poll_ready(&self, cq: &Cq<H>, out: &mut [WorkCompletion]) -> Result<usize> {
        let Some(mut guard) = cq.poll.try_lock() else {
            return busy();
        };
        // A copy: the completions written may alias the CQ for the compiler.
        let ring = cq.ring;
        if cq.flushing.load(Ordering::Relaxed) | cq.deferred.load(Ordering::Relaxed) != 0 {
            return self.harvest(cq, guard, out, 0);
        }
        let head = guard.head;
        let Some(ready) = ring.ready(head) else {
            return self.harvest(cq, guard, out, 0);
        };
        let want = (ready as usize).min(out.len());
        let last = guard.last;
        let mut n = 0;
        while n < want {
            if !fast_cqe(
                &last,
                ring.cqe(head.wrapping_add(n as u32)),
                None,
                &mut out[n],
            ) {
                break;
            }
            n += 1;
        }
        guard.head = head.wrapping_add(n as u32);
        if n < want {
            return self.harvest(cq, guard, out, n);
        }
        if n != 0 {
            // The CQEs were read before their slots are handed back (release).
            ring.cons().store(ring.index(guard.head), Ordering::Release);
        }
        Ok(n)
    }

    /// The general loop of [`poll_into`](Self::poll_into), under the CQ's poll lock (`guard`,
    /// released at the end), filling `out` from `out[n]` on (the fast loop took the `n`
    /// before; the consumer position is past them): each CQE checked and matched to the next
    /// outstanding request of its work queue, then the flushes.
    #[cold]
    #[inline(never)]
    fn harvest(
        &self,
        cq: &Cq<H>,
        mut guard: spin::MutexGuard<'_, PollState>,
        out: &mut [WorkCompletion],
        mut n: usize,
    ) -> Result<usize> {
        let st = &mut *guard;
        if n == 0 && st.deferred.is_some() {
            cq.deferred.store(0, Ordering::Relaxed);
            if let Some(e) = st.deferred.take() {
                return Err(e);
            }
        }
        let ring = cq.ring;
        let Some(ready) = ring.ready(st.head) else {
            if n != 0 {
                // Good completions first: the fast loop's, their CQEs handed back.
                ring.cons().store(ring.index(st.head), Ordering::Release);
                return Ok(n);
            }
            return Err(bad_prod(&ring));
        };
        let end = st.head.wrapping_add(ready);
        let mut head = st.head;
        let mut refused = None;
        while head != end && n < out.len() {
            let c = ring.slot(head).cast::<abi::Cqe>();
            head = head.wrapping_add(1);
            let (wr_id, opcode, status, qpn) = match check_cqe(self, cq, &mut st.last, c, None) {
                Checked::Done {
                    wr_id,
                    opcode,
                    status,
                    qpn,
                    tag,
                    release,
                } => {
                    if let (Some(i), Some(r)) = (tag.checked_sub(1), release) {
                        // SAFETY: the tag of a safe request of this QP, completed once, here.
                        unsafe { r.release(i) };
                    }
                    (wr_id, opcode, status, qpn)
                }
                Checked::Skip | Checked::Other => continue,
                Checked::Bad(e) => {
                    refused = Some(e);
                    break;
                }
            };
            // SAFETY: the slot `check_cqe` read, still the poll's (cons_head is stored after
            // the loop).
            out[n] = unsafe { completion(c, wr_id, opcode, status, qpn) };
            n += 1;
        }
        st.head = head;
        // The CQEs were read before their slots are handed back (release).
        ring.cons().store(ring.index(head), Ordering::Release);
        if let Some(e) = refused {
            if n == 0 {
                return Err(e);
            }
            // Good completions first; the refusal (its CQE consumed) comes next time.
            st.deferred = Some(e);
            cq.deferred.store(1, Ordering::Relaxed);
            return Ok(n);
        }
        if n < out.len() && head == end && cq.flushing.load(Ordering::Relaxed) != 0 {
            n += self.fill_flushes(cq, &mut out[n..]);
        }
        Ok(n)
    }

    /// Fills `out` with the driver's flush completions for `cq` (the poll lock is held).
    #[cold]
    #[inline(never)]
    fn fill_flushes(&self, cq: &Cq<H>, out: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(f) = take_flush(self, cq, None) else {
                break;
            };
            if let (Some(i), Some(r)) = (f.tag.checked_sub(1), f.release) {
                // SAFETY: a safe request flushed once, here.
                unsafe { r.release(i) };
            }
            out[n] = WorkCompletion {
                wr_id: f.wr_id,
                qp_num: f.qpn,
                status: WcStatus::WrFlushErr,
                opcode: f.opcode,
                ..WorkCompletion::default()
            };
            n += 1;
        }
        n
    }
}

/// A CQE opcode as a completion opcode, and whether it completes a receive.
#[inline(always)]
pub(crate) fn decode_opcode(raw: u32) -> Option<(WcOpcode, bool)> {
    Some(match raw {
        wc_opcode::SEND => (WcOpcode::Send, false),
        wc_opcode::RDMA_WRITE => (WcOpcode::RdmaWrite, false),
        wc_opcode::RDMA_READ => (WcOpcode::RdmaRead, false),
        wc_opcode::COMP_SWAP => (WcOpcode::CompSwap, false),
        wc_opcode::FETCH_ADD => (WcOpcode::FetchAdd, false),
        wc_opcode::RECV => (WcOpcode::Recv, true),
        wc_opcode::RECV_RDMA_WITH_IMM => (WcOpcode::RecvRdmaWithImm, true),
        _ => return None,
    })
}

/// The common case of [`check_cqe`], with no effect otherwise: the CQE at `c` is for the QP
/// `last` caches (and `only` names, if given), on a queue of it that completes here from its
/// own ring, with a valid opcode and status, and completes that queue's next outstanding
/// request (its `wr_id`), a request without a safe buffer (`only`: with or without). Writes
/// the completion to `out` and gives the request's tag (the safe path's buffer tag + 1, or
/// 0); `None` leaves the CQE to `check_cqe` and `out` as it was.
///
/// The caller holds `cq`'s poll lock, `last` is its cache, and `c` is a CQE of its ring
/// published by a prod_tail read (acquire).
#[inline(always)]
pub(crate) fn fast_cqe_tag(
    last: &Last,
    c: *const abi::Cqe,
    only: Option<u32>,
    out: &mut WorkCompletion,
) -> Option<u32> {
    macro_rules! get {
        ($f:ident) => {
            // SAFETY: the caller's slot: a published CQE of the ring; read as plain data,
            // each field once.
            unsafe { core::ptr::addr_of!((*c).$f).read_volatile() }
        };
    }
    let qp = get!(qp);
    if qp != last.qp || only.is_some_and(|h| u64::from(h) != qp) {
        return None;
    }
    let raw_op = get!(opcode);
    // SAFETY: `roles` is not 0 only for a control block the table names for this CQ: it
    // lives while the caller holds the CQ's lock (and `roles` is checked below before any
    // use).
    let ctl = last.ctl.as_ptr();
    let (opcode, q) = if raw_op <= wc_opcode::FETCH_ADD {
        if last.roles & SENDS == 0 {
            return None;
        }
        // SAFETY: as above (the SENDS role).
        (send_opcode(raw_op), unsafe { &(*ctl).sq })
    } else if raw_op.wrapping_sub(wc_opcode::RECV) <= 1 {
        if last.roles & OWN_RECVS == 0 {
            return None;
        }
        let opcode = if raw_op == wc_opcode::RECV {
            WcOpcode::Recv
        } else {
            WcOpcode::RecvRdmaWithImm
        };
        // SAFETY: as above (the OWN_RECVS role).
        (opcode, unsafe { &(*ctl).rq })
    } else {
        return None;
    };
    let status = WcStatus::from_raw(get!(status))?;
    let wr_id = get!(wr_id);
    // What is known goes to `out` at once (fewer values held across the match; `out` is the
    // caller's, and a CQE left to the general loop is written again there).
    (out.wr_id, out.status, out.opcode) = (wr_id, status, opcode);
    let tag = q.take_next(wr_id, only.is_some())?;
    // QEMU passes the host's flags: bits 0–1 agree with PVRDMA's, the rest do not (§10.1).
    let flags = WcFlags::from_bits_truncate((get!(wc_flags) & 0x3) as u8);
    out.flags = flags;
    out.byte_len = get!(byte_len);
    out.imm = if flags.contains(WcFlags::WITH_IMM) {
        get!(imm_data)
    } else {
        0
    };
    out.src_qp = get!(src_qp);
    out.qp_num = last.qpn;
    Some(tag)
}

/// [`fast_cqe_tag`] for a raw poll (any QP, requests without a safe buffer): whether the CQE
/// was taken.
#[inline(always)]
fn fast_cqe(last: &Last, c: *const abi::Cqe, only: Option<u32>, out: &mut WorkCompletion) -> bool {
    fast_cqe_tag(last, c, only, out).is_some()
}

/// The completion of the checked CQE at `c`.
///
/// # Safety
///
/// `c` is a CQE of a ring published by a prod_tail read (acquire), not yet handed back.
#[inline(always)]
unsafe fn completion(
    c: *const abi::Cqe,
    wr_id: u64,
    opcode: WcOpcode,
    status: WcStatus,
    qp_num: u32,
) -> WorkCompletion {
    macro_rules! get {
        ($f:ident) => {
            // SAFETY: the caller's contract.
            unsafe { core::ptr::addr_of!((*c).$f).read_volatile() }
        };
    }
    // QEMU passes the host's flags: bits 0–1 agree with PVRDMA's, the rest do not (§10.1).
    let flags = WcFlags::from_bits_truncate((get!(wc_flags) & 0x3) as u8);
    WorkCompletion {
        wr_id,
        byte_len: get!(byte_len),
        imm: if flags.contains(WcFlags::WITH_IMM) {
            get!(imm_data)
        } else {
            0
        },
        qp_num,
        src_qp: get!(src_qp),
        status,
        opcode,
        flags,
    }
}

/// A send CQE opcode (≤ `FETCH_ADD`) as a completion opcode.
#[inline(always)]
fn send_opcode(raw: u32) -> WcOpcode {
    const ALL: [WcOpcode; 5] = [
        WcOpcode::Send,
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaRead,
        WcOpcode::CompSwap,
        WcOpcode::FetchAdd,
    ];
    // The CQE's numbering is the completion's for these (checked at compile time).
    const _: () = {
        let mut i = 0;
        while i < ALL.len() {
            assert!(ALL[i] as usize == i);
            i += 1;
        }
        assert!(wc_opcode::FETCH_ADD as usize == ALL.len() - 1);
    };
    debug_assert!(raw <= wc_opcode::FETCH_ADD);
    // SAFETY: `WcOpcode` is `repr(u8)`; `raw` ≤ FETCH_ADD (the caller's check) is one of the
    // discriminants 0..=4 listed above.
    unsafe { core::mem::transmute::<u8, WcOpcode>(raw as u8) }
}

/// A poll that found the lock taken (a whole result, so that the refusal is a tail call).
#[cold]
#[inline(never)]
fn busy() -> Result<usize> {
    Err(Error::Busy { op: Op::PollCq })
}

/// The refusal of an impossible producer index.
#[cold]
#[inline(never)]
pub(crate) fn bad_prod(ring: &Ring) -> Error {
    let v = ring.prod().load(Ordering::Relaxed);
    Error::bad_value(Op::PollCq, "CQ prod_tail", v)
}

/// What the CQE in a ring slot is, once checked and matched to its request.
pub(crate) enum Checked {
    /// A completion of the next outstanding request of its work queue.
    Done {
        wr_id: u64,
        opcode: WcOpcode,
        status: WcStatus,
        qpn: u32,
        /// The safe path's buffer tag + 1 (0: none), and where it goes back.
        tag: u32,
        release: Option<crate::verbs::BufRelease>,
    },
    /// Nothing to give it to (a QP that is gone, a late or invented CQE): drop it.
    Skip,
    /// Another QP's completion (a poll for `only`): leave it in the ring.
    Other,
    /// A value that cannot be right: drop it and report this.
    Bad(Error),
}

/// Checks the CQE at `c` — opcode, QP, status — and matches it to the next outstanding
/// request of its work queue (`QpCtl::match_cqe`). Device values are compared, never used as
/// indices. The caller holds `cq`'s poll lock (`last` is its cache of the last QP named).
#[inline(always)]
pub(crate) fn check_cqe<H: Hal>(
    dev: &Pvrdma<H>,
    cq: &Cq<H>,
    last: &mut Last,
    c: *const abi::Cqe,
    only: Option<u32>,
) -> Checked {
    let op = Op::PollCq;
    macro_rules! get {
        ($f:ident) => {
            // SAFETY: the caller's slot: a CQE of the ring published by the prod_tail read
            // (acquire) it made; read as plain data.
            unsafe { core::ptr::addr_of!((*c).$f).read_volatile() }
        };
    }
    let (qp, raw_op) = (get!(qp), get!(opcode));
    let Some((opcode, recv)) = decode_opcode(raw_op) else {
        return Checked::Bad(Error::bad_value(op, "CQE opcode", raw_op));
    };
    if qp > u64::from(db::HANDLE_MASK) {
        return Checked::Bad(Error::bad_value(op, "CQE qp", qp));
    }
    let handle = qp as u32;
    if only.is_some_and(|q| q != handle) {
        return Checked::Other;
    }
    // CQE status values are InfiniBand's (L-ABI `enum pvrdma_wc_status`).
    let raw_status = get!(status);
    let Some(status) = WcStatus::from_raw(raw_status) else {
        return Checked::Bad(Error::bad_value(op, "CQE status", raw_status));
    };
    let wr_id = get!(wr_id);
    if last.qp != qp || last.roles == 0 {
        *last = Last::lookup(dev, cq, handle).unwrap_or(Last::NONE);
    }
    if last.roles & if recv { RECVS } else { SENDS } == 0 {
        // A QP that is gone, or whose completions of this kind go to another CQ.
        cq.drop_stale();
        return Checked::Skip;
    }
    // SAFETY: the table named this CQ for the QP (`roles` is not 0), so the control block
    // lives while the caller holds the CQ's lock.
    let ctl = unsafe { last.ctl.as_ref() };
    match ctl.match_cqe(recv, wr_id) {
        Ok(Some(tag)) => Checked::Done {
            wr_id,
            opcode,
            status,
            qpn: ctl.qpn,
            tag,
            release: ctl.release,
        },
        Ok(None) => Checked::Skip,
        Err(e) => Checked::Bad(e),
    }
}

/// A flush completion the driver made.
pub(crate) struct Flush {
    pub(crate) wr_id: u64,
    pub(crate) tag: u32,
    pub(crate) qpn: u32,
    pub(crate) opcode: WcOpcode,
    pub(crate) release: Option<crate::verbs::BufRelease>,
}

/// The next outstanding request of a work queue in the error state that completes to `cq`
/// (of QP `only`, if given), taken as flushed. The caller holds `cq`'s poll lock.
#[cold]
#[inline(never)]
pub(crate) fn take_flush<H: Hal>(dev: &Pvrdma<H>, cq: &Cq<H>, only: Option<u32>) -> Option<Flush> {
    if cq.flushing.load(Ordering::Acquire) == 0 {
        return None;
    }
    let mut found = None;
    dev.qps.for_each_on(cq.id(), |ctl, send, recv| {
        if found.is_some() {
            return;
        }
        for (q, here, opcode) in [
            (&ctl.sq, send, WcOpcode::Send),
            (&ctl.rq, recv && !ctl.srq, WcOpcode::Recv),
        ] {
            if !here || q.ctl.flush.load(Ordering::Acquire) == 0 {
                continue;
            }
            let done = q.ctl.done.load(Ordering::Relaxed);
            let tail = q.ctl.tail.load(Ordering::Acquire);
            if done == tail {
                q.ctl.flush.store(0, Ordering::Release);
                cq.flushing.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            if only.is_some_and(|h| h != ctl.handle) {
                continue;
            }
            let (wr_id, mut tag) = q.posted(done);
            if opcode == WcOpcode::Recv && tag != 0 && q.consumed(done, done, tail) {
                // The device took this receive and may still write its buffer (QEMU's host
                // QP keeps it): the buffer is parked until the QP is destroyed.
                q.park(done);
                tag = 0;
            }
            q.ctl.done.store(done.wrapping_add(1), Ordering::Release);
            found = Some(Flush {
                wr_id,
                tag,
                qpn: ctl.qpn,
                opcode,
                release: ctl.release,
            });
            return;
        }
    });
    found
}

impl<H: Hal> Pvrdma<H> {
    pub(crate) fn create_cq_impl(&self, entries: u32) -> Result<Cq<H>> {
        let op = Op::CreateCq;
        let max = self.max_cq_entries();
        if entries > max {
            return Err(Error::invalid(crate::error::Param::CqEntries, entries, max));
        }
        // A power of two (QEMU and Linux require it), at least 1.
        let cqe = entries.max(1).next_power_of_two();
        let pages = 1 + cqe.div_ceil(CQES_PER_PAGE);
        let mut st = self.state.lock();
        st.room_for(crate::error::Object::Cq, self.caps.max_cq)?;
        let mem = QueueMem::new(&self.hal, pages as usize)?;
        let req = abi::CreateCq {
            pdir_dma: mem.pdir.paddr(),
            ctx_handle: 0,
            cqe,
            nchunks: pages,
            ..Default::default()
        };
        let code = (op, abi::opcode::CREATE_CQ);
        let (r, mem): (abi::CreateCqResp, _) =
            st.create(&self.regs, crate::error::Object::Cq, code, req, mem)?;
        drop(st);
        let cq = Cq {
            handle: r.cq_handle,
            entries: cqe,
            ring: Ring::new(&mem.data, abi::RING_STATE_RX, 1, cqe, abi::CQE_SIZE as u32),
            mem,
            poll: spin::Mutex::new(PollState::new()),
            reserved: AtomicU32::new(0),
            flushing: AtomicU32::new(0),
            users: AtomicU32::new(0),
            deferred: AtomicU32::new(0),
            stale: AtomicU32::new(0),
            poll_bell: r.cq_handle | db::CQ_POLL,
        };
        if r.cqe != cqe || r.cq_handle > db::HANDLE_MASK {
            // Garbage: the CQ cannot be used as the device described it. Undo, best effort.
            let (field, value) = if r.cqe != cqe {
                ("cqe", r.cqe)
            } else {
                ("cq_handle", r.cq_handle)
            };
            if let Err((cq, _)) = self.destroy_cq_impl(cq) {
                core::mem::forget(cq);
            }
            return Err(Error::bad_value(op, field, value));
        }
        Ok(cq)
    }

    pub(crate) fn destroy_cq_impl(&self, cq: Cq<H>) -> Result<(), (Cq<H>, Error)> {
        if cq.users.load(Ordering::Relaxed) != 0 {
            // A QP (perhaps one leaked with mem::forget) still completes here.
            return Err((cq, Error::Busy { op: Op::DestroyCq }));
        }
        let code = (Op::DestroyCq, abi::opcode::DESTROY_CQ);
        let handle = cq.handle;
        self.state
            .lock()
            .destroy(&self.regs, crate::error::Object::Cq, code, handle, cq)
    }
}
