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
use super::qptable::{QpCtl, QueueView};
use super::regs::db;
use super::ring::Ring;
use super::{CQES_PER_PAGE, Pvrdma};
use crate::error::{Error, Op, Queue, Result};
use crate::verbs::{PollCq, WcFlags, WcOpcode, WcStatus};

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
            let (opcode, recv) = match raw_op {
                wc_opcode::SEND => (WcOpcode::Send, false),
                wc_opcode::RDMA_WRITE => (WcOpcode::RdmaWrite, false),
                wc_opcode::RDMA_READ => (WcOpcode::RdmaRead, false),
                wc_opcode::COMP_SWAP => (WcOpcode::CompSwap, false),
                wc_opcode::FETCH_ADD => (WcOpcode::FetchAdd, false),
                wc_opcode::RECV => (WcOpcode::Recv, true),
                wc_opcode::RECV_RDMA_WITH_IMM => (WcOpcode::RecvRdmaWithImm, true),
                other => return Err(self.refuse("CQE opcode", other.into())),
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
                self.consume();
                continue;
            };
            self.st.last = Some((handle, ctl));
            // SAFETY: the table named this CQ for the QP, so the control block lives while
            // this poll holds the CQ's lock.
            let ctl = unsafe { ctl.as_ref() };
            self.qpn = ctl.qpn;
            self.release = ctl.release;
            let tag = if recv && ctl.srq {
                // A receive from the shared queue: no order to check, nothing of ours to match;
                // the SRQ gets its credit back.
                if let Some(c) = ctl.srq_done {
                    // SAFETY: the SRQ outlives the QPs that receive from it (the provider
                    // contract of create_qp), and this QP is alive (the table rule).
                    if !unsafe { c.as_ref() }.complete() {
                        // No receive outstanding on the SRQ: a CQE the device invented.
                        self.consume();
                        continue;
                    }
                }
                0
            } else {
                let q: &QueueView = if recv { &ctl.rq } else { &ctl.sq };
                let done = q.ctl.done.load(Ordering::Relaxed);
                if done == q.ctl.tail.load(Ordering::Acquire) {
                    // Nothing outstanding: a late CQE for a request already flushed (or one
                    // the device invented). Every request completes once: drop it.
                    self.consume();
                    continue;
                }
                let (posted, tag) = q.posted(done);
                if posted != wr_id {
                    if q.ctl.flush.load(Ordering::Acquire) != 0 {
                        // The queue is being flushed: a late CQE for a request already
                        // flushed. Every request completes once: drop it.
                        self.consume();
                        continue;
                    }
                    return Err(self.refuse("CQE wr_id (not the next request)", wr_id));
                }
                q.ctl.done.store(done.wrapping_add(1), Ordering::Release);
                tag
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
        if self.cq.flushing.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut found = None;
        let (id, only) = (self.cq.id(), self.only);
        self.dev.qps.for_each_on(id, |ctl, send, recv| {
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
                if done == q.ctl.tail.load(Ordering::Acquire) {
                    q.ctl.flush.store(0, Ordering::Release);
                    self.cq.flushing.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
                if only.is_some_and(|h| h != ctl.handle) {
                    continue;
                }
                let (wr_id, mut tag) = q.posted(done);
                let tail = q.ctl.tail.load(Ordering::Acquire);
                if opcode == WcOpcode::Recv && tag != 0 && q.consumed(done, done, tail) {
                    // The device took this receive and may still write its buffer (QEMU's
                    // host QP keeps it): the buffer is parked until the QP is destroyed.
                    q.park(done);
                    tag = 0;
                }
                q.ctl.done.store(done.wrapping_add(1), Ordering::Release);
                found = Some((wr_id, tag, ctl.qpn, opcode, ctl.release));
                return;
            }
        });
        let (wr_id, tag, qpn, opcode, release) = found?;
        self.cur = Current::Flush;
        (self.wr_id, self.qpn, self.opcode) = (wr_id, qpn, opcode);
        (self.status, self.tag, self.release) = (WcStatus::WrFlushErr, tag, release);
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
