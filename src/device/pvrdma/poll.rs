//! Polling a completion queue (`docs/pvrdma.md` §10): the ring's CQEs taken into the
//! caller's slice, each checked and matched to its request (`check_cqe`, shared with the
//! cursor of `cursor.rs`); the straight-line path for the common CQE; and the flush
//! completions the driver makes for a QP that went to the error state.
//!
//! Consumer protocol (L-CQ, RC-CQ): read prod_tail (acquire), read the CQEs, store cons_head
//! (release). When the ring looks empty, the POLL doorbell makes QEMU harvest what its host
//! has, and the ring is looked at again (§10.3).

use core::sync::atomic::Ordering;

use bareverbs_hal::{Hal, Mmio};

use super::Pvrdma;
use super::abi::{self, wc_opcode};
use super::cq::{Cq, FAST_SENDS, GSI_QPN, Last, OWN_RECVS, PollState, RECVS, SENDS, decode_opcode};
use super::regs::db;
use super::ring::Ring;
use crate::error::{Error, Op, Result};
use crate::verbs::{WcFlags, WcOpcode, WcStatus, WorkCompletion};

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
        if cq.looks_empty()
            && cq.flushing.load(Ordering::Relaxed) | cq.deferred.load(Ordering::Relaxed) == 0
        {
            self.kick(cq);
            if cq.looks_empty() {
                return Ok(0);
            }
        }
        match out {
            // One completion asked for (the latency case): inline, straight-line.
            [wc] => self.poll_first(cq, core::slice::from_mut(wc)),
            _ => self.poll_ready(cq, out),
        }
    }

    /// Rings `cq`'s POLL doorbell (the device harvests what its host has), where it may be
    /// rung (`Cq::poll_bell`).
    #[inline(always)]
    pub(crate) fn kick(&self, cq: &Cq<H>) {
        if cq.poll_bell != 0 {
            self.uar.write32(db::CQ, cq.poll_bell);
        }
    }

    /// Whether a poll of `cq` would find something now: a CQE in the ring, a flush or a
    /// refusal to report. It does not ring the POLL doorbell (a waiter relies on the device's
    /// own completion thread and its interrupt; a poll rings it).
    pub(crate) fn cq_ready_impl(&self, cq: &Cq<H>) -> bool {
        cq.ring.prod().load(Ordering::Acquire) != cq.cons_index.load(Ordering::Relaxed)
            || cq.flushing.load(Ordering::Acquire) | cq.deferred.load(Ordering::Acquire) != 0
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
            return self.poll_contended(cq, out);
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
        cq.hand_back(guard.head);
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
            return self.poll_contended(cq, out);
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
            cq.hand_back(guard.head);
        }
        Ok(n)
    }

    /// A poll that found another thread polling `cq`: it waits for that poll a bounded
    /// number of spins ([`Cq::poll_lock`]), then polls through the general loop, or finds
    /// nothing if the other still holds the CQ (it takes the completions there are).
    #[cold]
    #[inline(never)]
    fn poll_contended(&self, cq: &Cq<H>, out: &mut [WorkCompletion]) -> Result<usize> {
        match cq.poll_lock() {
            Some(guard) => self.harvest(cq, guard, out, 0),
            None => Ok(0),
        }
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
                cq.hand_back(st.head);
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
            if qpn == GSI_QPN && opcode == WcOpcode::Recv {
                // QEMU counts a received MAD without the 40-byte GRH it writes before it;
                // libibverbs (and the CM) count the GRH slot (`docs/pvrdma.md`).
                out[n].byte_len = out[n].byte_len.saturating_add(40);
            }
            n += 1;
        }
        st.head = head;
        cq.hand_back(head);
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
            // A flush may have made CQEs of the queue's earlier life due: the cache is looked
            // up anew (see `Last::lookup`).
            st.last = Last::NONE;
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
        if last.roles & FAST_SENDS == 0 {
            return None;
        }
        // SAFETY: as above (the FAST_SENDS role).
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

/// The refusal of an impossible producer index.
#[cold]
#[inline(never)]
pub(crate) fn bad_prod(ring: &Ring) -> Error {
    let v = ring.prod().load(Ordering::Relaxed);
    Error::bad_value(Op::PollCq, &"CQ prod_tail", v)
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
        return Checked::Bad(Error::bad_value(op, &"CQE opcode", raw_op));
    };
    if qp > u64::from(db::HANDLE_MASK) {
        return Checked::Bad(Error::bad_value(op, &"CQE qp", qp));
    }
    let handle = qp as u32;
    if only.is_some_and(|q| q != handle) {
        return Checked::Other;
    }
    // CQE status values are InfiniBand's (L-ABI `enum pvrdma_wc_status`).
    let raw_status = get!(status);
    let Some(status) = WcStatus::from_raw(raw_status) else {
        return Checked::Bad(Error::bad_value(op, &"CQE status", raw_status));
    };
    let wr_id = get!(wr_id);
    if last.qp != qp || last.roles == 0 {
        *last = Last::lookup(dev, cq, handle).unwrap_or(Last::NONE);
    }
    if last.roles & if recv { RECVS } else { SENDS } == 0 {
        // A QP that is gone, or whose completions of this kind go to another CQ.
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
        Ok(None) => {
            // Dropped: perhaps the last CQE of the QP's earlier life, after which the
            // straight-line poll may take its CQEs again (the cache is looked up anew).
            *last = Last::NONE;
            Checked::Skip
        }
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
                q.ctl.flush.store(0, Ordering::SeqCst);
                cq.flushing.fetch_sub(1, Ordering::AcqRel);
                // A post to the queue in ERR (`commit_flushed`) may have raced with this: it
                // publishes its tail, then sets the flag. Either the tail read now shows it,
                // or its flag comes after the store above (sequential consistency).
                if q.ctl.tail.load(Ordering::SeqCst) != done
                    && q.ctl.flush.swap(1, Ordering::SeqCst) == 0
                {
                    cq.flushing.fetch_add(1, Ordering::AcqRel);
                }
                continue;
            }
            if only.is_some_and(|h| h != ctl.handle) {
                continue;
            }
            let (wr_id, mut tag) = q.posted(done);
            if q.consumed(done, done) {
                // The device took this request: its own CQE may still come, to be dropped
                // (`QueueCtl::late`). A receive's buffer it may still write (QEMU's host QP
                // keeps it): parked until the QP is destroyed.
                q.ctl.late.fetch_add(1, Ordering::Relaxed);
                if opcode == WcOpcode::Recv && tag != 0 {
                    q.park(done);
                    tag = 0;
                }
            } else {
                // No CQE will come for it: its room is free.
                q.give_room(1);
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
