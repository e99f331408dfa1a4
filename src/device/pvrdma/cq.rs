//! Completion queues: the ring of 64-byte CQEs the device produces (`shared/pvrdma-abi.md`
//! §10), polled through a cursor that reads CQE fields on demand, and the flush completions
//! the driver makes for a QP that went to the error state.
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
use crate::verbs::{PollCq, WcFlags, WcOpcode, WcStatus, WorkCompletion};

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
    deferred: AtomicU32,
    /// CQEs of destroyed QPs still in the ring: they keep their room reserved until a poll
    /// drops them.
    pub(crate) stale: AtomicU32,
}

// SAFETY: the ring points into the CQ's own DMA memory; the consumer side is written only
// under `poll`, the rest is atomic.
unsafe impl<H: Hal + Send> Send for Cq<H> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync> Sync for Cq<H> {}

/// What the poll lock protects.
pub(crate) struct PollState {
    /// The consumer's free-running counter.
    head: u32,
    /// The last QP a CQE named, and its control block.
    last: Option<(u32, NonNull<QpCtl>)>,
    /// A refusal met after good completions, reported by the next poll.
    deferred: Option<Error>,
}

// SAFETY: `last` points at a control block that is only dereferenced under the poll lock,
// which QP creation and destruction also take.
unsafe impl Send for PollState {}

impl PollState {
    pub(crate) fn new() -> Self {
        PollState {
            head: 0,
            last: None,
            deferred: None,
        }
    }

    /// The consumer's position.
    pub(crate) fn head(&self) -> u32 {
        self.head
    }

    /// Forgets a cached control block (its QP is going away).
    pub(crate) fn forget(&mut self, ctl: NonNull<QpCtl>) {
        if self.last.is_some_and(|(_, c)| c == ctl) {
            self.last = None;
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

/// Where the current completion comes from.
#[derive(Clone, Copy)]
enum Current {
    None,
    /// A CQE in the ring (checked: QP, opcode, status, `wr_id`).
    Hw(NonNull<abi::Cqe>),
    /// A flush the driver made.
    Flush,
}

/// A poll in progress on one CQ (`ibv_start_poll` … `ibv_end_poll`): holds the CQ's poll lock,
/// hands back the CQEs it consumed when dropped.
pub struct Poll<'c, H: Hal> {
    dev: &'c Pvrdma<H>,
    cq: &'c Cq<H>,
    st: spin::MutexGuard<'c, PollState>,
    /// Only this QP's completions (stop at another's).
    only: Option<u32>,
    /// CQEs known ready in the ring.
    ready: u32,
    /// Whether the POLL doorbell was rung in this poll.
    kicked: bool,
    cur: Current,
    wr_id: u64,
    qpn: u32,
    opcode: WcOpcode,
    status: WcStatus,
    /// The current completion's buffer tag + 1 (0: none), until taken.
    tag: u32,
    release: Option<crate::verbs::BufRelease>,
    start: u32,
    /// Completions returned by this poll.
    taken: u32,
}

impl<H: Hal> Pvrdma<H> {
    /// Starts a poll, or says at once (without the lock) that there is nothing to poll.
    #[inline]
    pub(crate) fn start_poll<'c>(
        &'c self,
        cq: &'c Cq<H>,
        only: Option<u32>,
    ) -> Result<Option<Poll<'c, H>>> {
        let ring = &cq.ring;
        if ring.prod().load(Ordering::Relaxed) == ring.cons().load(Ordering::Relaxed)
            && cq.flushing.load(Ordering::Relaxed) == 0
            && cq.deferred.load(Ordering::Relaxed) == 0
        {
            // Looks empty: let the device harvest what it has, then look again (§10.3). A
            // racing poller can only make this poll find nothing, as any poll may.
            self.uar.write32(db::CQ, cq.handle | db::CQ_POLL);
            if ring.prod().load(Ordering::Relaxed) == ring.cons().load(Ordering::Relaxed) {
                return Ok(None);
            }
        }
        let mut st = cq.poll.try_lock().ok_or(Error::Busy { op: Op::PollCq })?;
        if let Some(e) = st.deferred.take() {
            cq.deferred.store(0, Ordering::Relaxed);
            return Err(e);
        }
        let start = st.head;
        Ok(Some(Poll {
            dev: self,
            cq,
            st,
            only,
            ready: 0,
            kicked: true,
            cur: Current::None,
            wr_id: 0,
            qpn: 0,
            opcode: WcOpcode::Send,
            status: WcStatus::Success,
            tag: 0,
            release: None,
            start,
            taken: 0,
        }))
    }
}

impl<H: Hal> Pvrdma<H> {
    /// Polls up to `out.len()` completions straight into `out` (`ibv_poll_cq`); a safe
    /// buffer whose completion is taken here goes back to its pool.
    #[inline]
    pub(crate) fn poll_into(&self, cq: &Cq<H>, out: &mut [WorkCompletion]) -> Result<usize> {
        let ring = &cq.ring;
        if ring.prod().load(Ordering::Relaxed) == ring.cons().load(Ordering::Relaxed)
            && cq.flushing.load(Ordering::Relaxed) | cq.deferred.load(Ordering::Relaxed) == 0
        {
            // Looks empty: let the device harvest what it has, then look again (§10.3).
            self.uar.write32(db::CQ, cq.handle | db::CQ_POLL);
            if ring.prod().load(Ordering::Relaxed) == ring.cons().load(Ordering::Relaxed) {
                return Ok(0);
            }
        }
        self.harvest(cq, out)
    }

    /// The loop of [`poll_into`](Self::poll_into), under the CQ's poll lock: each CQE checked
    /// and matched to the next outstanding request of its work queue.
    #[inline(never)]
    fn harvest(&self, cq: &Cq<H>, out: &mut [WorkCompletion]) -> Result<usize> {
        let op = Op::PollCq;
        let mut st = cq.poll.try_lock().ok_or(Error::Busy { op })?;
        if st.deferred.is_some() {
            cq.deferred.store(0, Ordering::Relaxed);
            if let Some(e) = st.deferred.take() {
                return Err(e);
            }
        }
        let ring = cq.ring;
        let Some(ready) = ring.ready(st.head) else {
            let v = ring.prod().load(Ordering::Relaxed);
            return Err(Error::bad_value(op, "CQ prod_tail", v));
        };
        let (start, end) = (st.head, st.head.wrapping_add(ready));
        let mut head = start;
        let mut n = 0;
        let mut refused = None;
        while head != end && n < out.len() {
            let c = ring.slot(head).cast::<abi::Cqe>();
            head = head.wrapping_add(1);
            macro_rules! get {
                ($f:ident) => {
                    // SAFETY: a CQE slot of the ring, published by the prod_tail read (acquire)
                    // in `ready`; read as plain data.
                    unsafe { core::ptr::addr_of!((*c).$f).read_volatile() }
                };
            }
            let (qp, raw_op, raw_status) = (get!(qp), get!(opcode), get!(status));
            let Some((opcode, recv)) = decode_opcode(raw_op) else {
                refused = Some(Error::bad_value(op, "CQE opcode", raw_op));
                break;
            };
            if qp > u64::from(db::HANDLE_MASK) {
                refused = Some(Error::bad_value(op, "CQE qp", qp));
                break;
            }
            let Some(status) = WcStatus::from_raw(raw_status) else {
                refused = Some(Error::bad_value(op, "CQE status", raw_status));
                break;
            };
            let (handle, wr_id) = (qp as u32, get!(wr_id));
            let ctl = match st.last {
                Some((h, c)) if h == handle => c,
                _ => match self.qps.lookup(handle, cq.id(), recv) {
                    Some(c) => {
                        st.last = Some((handle, c));
                        c
                    }
                    // A QP that is gone (or never completes here): drop its CQE.
                    None => {
                        cq.drop_stale();
                        continue;
                    }
                },
            };
            // SAFETY: the table named this CQ for the QP, so the control block lives while
            // this poll holds the CQ's lock.
            let ctl = unsafe { ctl.as_ref() };
            match ctl.match_cqe(recv, wr_id) {
                Ok(Some(tag)) => {
                    if let (Some(i), Some(r)) = (tag.checked_sub(1), ctl.release) {
                        // SAFETY: the tag of a safe request of this QP, completed once, here.
                        unsafe { r.release(i) };
                    }
                }
                Ok(None) => continue,
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
            let flags = WcFlags::from_bits_truncate((get!(wc_flags) & 0x3) as u8);
            out[n] = WorkCompletion {
                wr_id,
                byte_len: get!(byte_len),
                imm: if flags.contains(WcFlags::WITH_IMM) {
                    get!(imm_data)
                } else {
                    0
                },
                qp_num: ctl.qpn,
                src_qp: get!(src_qp),
                status,
                opcode,
                flags,
            };
            n += 1;
        }
        if head != start {
            st.head = head;
            // The CQEs were read before their slots are handed back (release).
            ring.cons().store(ring.index(head), Ordering::Release);
        }
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
fn decode_opcode(raw: u32) -> Option<(WcOpcode, bool)> {
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

impl<H: Hal> Poll<'_, H> {
    /// Hands the current completion's safe buffer back, unless it was taken.
    #[inline]
    fn release_current(&mut self) {
        if self.tag != 0 {
            if let Some(r) = self.release {
                // SAFETY: the tag came from this QP's shadow, recorded at a safe post whose
                // buffer moved into the QP; its completion is taken once, here.
                unsafe { r.release(self.tag - 1) };
            }
            self.tag = 0;
        }
    }

    /// The device's CQE ring: the next CQE, checked and matched to its request.
    fn next_hw(&mut self) -> Result<Option<bool>> {
        let op = Op::PollCq;
        let ring = self.cq.ring;
        loop {
            if self.ready == 0 {
                match ring.ready(self.st.head) {
                    None => {
                        let v = ring.prod().load(Ordering::Relaxed);
                        return Err(Error::bad_value(op, "CQ prod_tail", v));
                    }
                    Some(0) if !self.kicked => {
                        self.kicked = true;
                        self.dev.uar.write32(db::CQ, self.cq.handle | db::CQ_POLL);
                        continue;
                    }
                    Some(0) => return Ok(None),
                    Some(n) => self.ready = n,
                }
            }
            let c = ring.slot(self.st.head).cast::<abi::Cqe>();
            macro_rules! get {
                ($f:ident) => {
                    // SAFETY: a CQE slot of the ring, published by the prod_tail read
                    // (acquire) in `ready`; read as plain data.
                    unsafe { core::ptr::addr_of!((*c).$f).read_volatile() }
                };
            }
            let qp = get!(qp);
            let raw_op = get!(opcode);
            let Some((opcode, recv)) = decode_opcode(raw_op) else {
                return Err(self.refuse("CQE opcode", raw_op.into()));
            };
            if qp > u64::from(db::HANDLE_MASK) {
                return Err(self.refuse("CQE qp", qp));
            }
            let handle = qp as u32;
            if self.only.is_some_and(|q| q != handle) {
                // Another QP's completion: left for its own poll.
                return Ok(None);
            }
            // CQE status values are InfiniBand's (L-ABI `enum pvrdma_wc_status`).
            let raw_status = get!(status);
            let Some(status) = WcStatus::from_raw(raw_status) else {
                return Err(self.refuse("CQE status", raw_status.into()));
            };
            let wr_id = get!(wr_id);
            let ctl = match self.st.last {
                Some((h, c)) if h == handle => Some(c),
                _ => self.dev.qps.lookup(handle, self.cq.id(), recv),
            };
            let Some(ctl) = ctl else {
                // A QP that is gone (or never completes here): nothing to give its CQE to.
                self.cq.drop_stale();
                self.consume();
                continue;
            };
            self.st.last = Some((handle, ctl));
            // SAFETY: the table named this CQ for the QP, so the control block lives while
            // this poll holds the CQ's lock.
            let ctl = unsafe { ctl.as_ref() };
            self.qpn = ctl.qpn;
            self.release = ctl.release;
            let tag = match ctl.match_cqe(recv, wr_id) {
                Ok(Some(tag)) => tag,
                Ok(None) => {
                    self.consume();
                    continue;
                }
                Err(e) => {
                    self.consume();
                    return Err(e);
                }
            };
            self.consume();
            self.cur = Current::Hw(NonNull::new(c).expect("ring slot"));
            (self.wr_id, self.opcode, self.status, self.tag) = (wr_id, opcode, status, tag);
            return Ok(Some(true));
        }
    }

    /// Consumes the CQE at the head and says why it could not be used.
    #[cold]
    fn refuse(&mut self, field: &'static str, value: u64) -> Error {
        self.consume();
        Error::bad_value(Op::PollCq, field, value)
    }

    #[inline]
    fn consume(&mut self) {
        self.st.head = self.st.head.wrapping_add(1);
        self.ready -= 1;
    }

    /// The driver's flushes: the next outstanding request of a work queue in the error state.
    #[cold]
    fn next_flush(&mut self) -> Option<bool> {
        let f = take_flush(self.dev, self.cq, self.only)?;
        self.cur = Current::Flush;
        (self.wr_id, self.qpn, self.opcode) = (f.wr_id, f.qpn, f.opcode);
        (self.status, self.tag, self.release) = (WcStatus::WrFlushErr, f.tag, f.release);
        Some(true)
    }

    /// Reads a field of the current CQE (0 for a flush).
    #[inline]
    fn cqe<T: Default>(&self, f: impl FnOnce(*const abi::Cqe) -> T) -> T {
        match self.cur {
            Current::Hw(c) => f(c.as_ptr()),
            _ => T::default(),
        }
    }
}

macro_rules! cqe_field {
    ($self:ident, $f:ident) => {
        // SAFETY: the current CQE's slot: consumed by this poll, not handed back to the device
        // until the poll ends (cons_head is stored at drop).
        $self.cqe(|c| unsafe { core::ptr::addr_of!((*c).$f).read_volatile() })
    };
}

/// A flush completion the driver made.
struct Flush {
    wr_id: u64,
    tag: u32,
    qpn: u32,
    opcode: WcOpcode,
    release: Option<crate::verbs::BufRelease>,
}

/// The next outstanding request of a work queue in the error state that completes to `cq`
/// (of QP `only`, if given), taken as flushed. The caller holds `cq`'s poll lock.
#[cold]
#[inline(never)]
fn take_flush<H: Hal>(dev: &Pvrdma<H>, cq: &Cq<H>, only: Option<u32>) -> Option<Flush> {
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

impl<H: Hal> PollCq for Poll<'_, H> {
    #[inline]
    fn advance(&mut self) -> Result<bool> {
        self.release_current();
        self.cur = Current::None;
        let more = match self.next_hw() {
            Ok(Some(_)) => true,
            Ok(None) if self.only.is_some() && self.ready > 0 => false,
            Ok(None) => self.next_flush().is_some(),
            // Good completions go first; the refusal (its CQE consumed) comes next time.
            Err(e) if self.taken > 0 => {
                self.st.deferred = Some(e);
                self.cq.deferred.store(1, Ordering::Relaxed);
                false
            }
            Err(e) => return Err(e),
        };
        self.taken += u32::from(more);
        Ok(more)
    }

    #[inline]
    fn wr_id(&self) -> u64 {
        self.wr_id
    }

    #[inline]
    fn status(&self) -> WcStatus {
        self.status
    }

    #[inline]
    fn opcode(&self) -> WcOpcode {
        self.opcode
    }

    #[inline]
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    #[inline]
    fn byte_len(&self) -> u32 {
        cqe_field!(self, byte_len)
    }

    #[inline]
    fn flags(&self) -> WcFlags {
        // QEMU passes the host's flags: bits 0–1 agree with PVRDMA's, the rest do not (§10.1).
        WcFlags::from_bits_truncate((cqe_field!(self, wc_flags) & 0x3) as u8)
    }

    #[inline]
    fn imm(&self) -> u32 {
        if self.flags().contains(WcFlags::WITH_IMM) {
            cqe_field!(self, imm_data)
        } else {
            0
        }
    }

    #[inline]
    fn src_qp(&self) -> u32 {
        cqe_field!(self, src_qp)
    }

    #[inline]
    fn vendor_err(&self) -> u32 {
        cqe_field!(self, vendor_err)
    }

    #[inline]
    fn take_tag(&mut self) -> Option<u32> {
        let t = core::mem::take(&mut self.tag);
        t.checked_sub(1)
    }
}

impl<H: Hal> Drop for Poll<'_, H> {
    #[inline]
    fn drop(&mut self) {
        self.release_current();
        if self.st.head != self.start {
            // The CQEs were read before their slots are handed back (release).
            let ring = self.cq.ring;
            ring.cons()
                .store(ring.index(self.st.head), Ordering::Release);
        }
    }
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
