//! The poll cursor (`ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll`): one completion at a
//! time, under the CQ's poll lock, its fields read from the CQE when asked. Checking and
//! matching are `poll::check_cqe`'s, as for the slice poll.

use core::sync::atomic::Ordering;

use bareverbs_hal::Hal;

use super::Pvrdma;
use super::abi;
use super::cq::{Cq, GSI_QPN, PollState};
use super::poll::{Checked, check_cqe, fast_cqe_tag, take_flush};
use crate::error::{Error, Op, Result};
use crate::verbs::{PollCq, WcFlags, WcOpcode, WcStatus, WorkCompletion};

/// Where the current completion comes from.
#[derive(Clone, Copy)]
enum Current {
    None,
    /// A CQE in the ring (checked: QP, opcode, status, `wr_id`).
    Hw(*const abi::Cqe),
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
    /// Takes the next completion of QP `handle` from `cq` into `wc` (`Provider::poll_qp`):
    /// the common case here — the ring's next CQE is this QP's, passes `poll::fast_cqe` — and
    /// everything else through a cursor with `only` ([`poll_qp_cursor`](Self::poll_qp_cursor)).
    #[inline]
    pub(crate) fn poll_qp(
        &self,
        cq: &Cq<H>,
        handle: u32,
        wc: &mut WorkCompletion,
    ) -> Result<Option<u32>> {
        let ring = &cq.ring;
        if !cq.looks_empty()
            && let Some(mut guard) = cq.poll.try_lock()
        {
            let st = &mut *guard;
            if cq.flushing.load(Ordering::Relaxed) | cq.deferred.load(Ordering::Relaxed) == 0
                && ring.ready(st.head).is_some_and(|r| r != 0)
            {
                let c = ring.cqe(st.head);
                if let Some(tag) = fast_cqe_tag(&st.last, c, Some(handle), wc) {
                    st.head = st.head.wrapping_add(1);
                    cq.hand_back(st.head);
                    return Ok(Some(tag));
                }
            }
        }
        self.poll_qp_cursor(cq, handle, wc)
    }

    /// [`poll_qp`](Self::poll_qp) through a cursor: empty rings (with the POLL doorbell),
    /// other QPs' completions, flushes, refusals, a busy lock.
    #[cold]
    #[inline(never)]
    fn poll_qp_cursor(
        &self,
        cq: &Cq<H>,
        handle: u32,
        wc: &mut WorkCompletion,
    ) -> Result<Option<u32>> {
        let Some(mut p) = self.start_poll(cq, Some(handle))? else {
            return Ok(None);
        };
        if !p.advance()? {
            return Ok(None);
        }
        *wc = WorkCompletion {
            wr_id: p.wr_id(),
            byte_len: p.byte_len(),
            imm: p.imm(),
            qp_num: p.qp_num(),
            src_qp: p.src_qp(),
            status: p.status(),
            opcode: p.opcode(),
            flags: p.flags(),
        };
        Ok(Some(p.take_tag().map_or(0, |t| t + 1)))
    }

    /// Starts a poll, or says at once (without the lock) that there is nothing to poll.
    #[inline]
    pub(crate) fn start_poll<'c>(
        &'c self,
        cq: &'c Cq<H>,
        only: Option<u32>,
    ) -> Result<Option<Poll<'c, H>>> {
        if cq.looks_empty()
            && cq.flushing.load(Ordering::Relaxed) == 0
            && cq.deferred.load(Ordering::Relaxed) == 0
        {
            // Looks empty: let the device harvest what it has, then look again (§10.3). A
            // racing poller can only make this poll find nothing, as any poll may.
            self.kick(cq);
            if cq.looks_empty() {
                return Ok(None);
            }
        }
        // Another poller that holds the lock through every spin takes what there is.
        let Some(mut st) = cq.poll_lock() else {
            return Ok(None);
        };
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
                        return Err(Error::bad_value(op, &"CQ prod_tail", v));
                    }
                    Some(0) if !self.kicked => {
                        self.kicked = true;
                        self.dev.kick(self.cq);
                        continue;
                    }
                    Some(0) => return Ok(None),
                    Some(n) => self.ready = n,
                }
            }
            let c = ring.slot(self.st.head).cast::<abi::Cqe>();
            match check_cqe(self.dev, self.cq, &mut self.st.last, c, self.only) {
                // Another QP's completion: left for its own poll.
                Checked::Other => return Ok(None),
                Checked::Skip => self.consume(),
                Checked::Bad(e) => {
                    self.consume();
                    return Err(e);
                }
                Checked::Done {
                    wr_id,
                    opcode,
                    status,
                    qpn,
                    tag,
                    release,
                } => {
                    self.consume();
                    self.cur = Current::Hw(c);
                    (self.wr_id, self.opcode, self.status) = (wr_id, opcode, status);
                    (self.qpn, self.tag, self.release) = (qpn, tag, release);
                    return Ok(Some(true));
                }
            }
        }
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
        // A flush may have made CQEs of the queue's earlier life due (see `Last::lookup`).
        self.st.last = super::cq::Last::NONE;
        self.cur = Current::Flush;
        (self.wr_id, self.qpn, self.opcode) = (f.wr_id, f.qpn, f.opcode);
        (self.status, self.tag, self.release) = (WcStatus::WrFlushErr, f.tag, f.release);
        Some(true)
    }

    /// Reads a field of the current CQE (0 for a flush).
    #[inline]
    fn cqe<T: Default>(&self, f: impl FnOnce(*const abi::Cqe) -> T) -> T {
        match self.cur {
            Current::Hw(c) => f(c),
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
        let n: u32 = cqe_field!(self, byte_len);
        // QEMU leaves the GRH slot out of a GSI receive's length (as in the slice poll).
        if self.qpn == GSI_QPN && self.opcode == WcOpcode::Recv {
            n.saturating_add(40)
        } else {
            n
        }
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
            self.cq.hand_back(self.st.head);
        }
    }
}
