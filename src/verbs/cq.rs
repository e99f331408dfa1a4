//! Completion queues: polling into a slice of small completions (`ibv_poll_cq`), or through a
//! cursor that reads each field on demand (`ibv_start_poll` / `ibv_next_poll` /
//! `ibv_end_poll` with the `ibv_wc_read_*` accessors).

use core::mem::ManuallyDrop;

use super::{Context, CqId, PollCq, Provider, WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::error::Result;

/// A completion queue (`ibv_cq`).
pub struct CompletionQueue<'c, P: Provider> {
    pub(super) ctx: &'c Context<P>,
    pub(super) raw: ManuallyDrop<P::Cq>,
}

impl<'c, P: Provider> CompletionQueue<'c, P> {
    /// Polls up to `out.len()` completions of any QP into `out` (`ibv_poll_cq`); returns how
    /// many. A safe post's buffer whose completion is polled here goes back to its pool.
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`](crate::Error::Protocol) for a CQE that cannot be right (consumed;
    /// reported by the poll after the one that returned the good completions before it).
    /// A poll that meets another thread's poll of this CQ waits for it a bounded number of
    /// spins (neither device has a clock), then returns 0 if it still holds the CQ (it takes
    /// the completions there are).
    #[inline]
    ///
    /// # Example
    ///
    /// ```
    /// # include!("../doctests.rs");
    /// # fn main() -> bareverbs::Result<()> {
    /// use bareverbs::verbs::*;
    /// let (_machine, ctx) = pvrdma()?;
    /// let gid = ctx.bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))?;
    /// let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq(64)?;
    /// let pool = pd.buffer_pool(4, 64)?;
    /// let (mut a, mut b) = rc_pair(&pd, &cq, &pool, gid.gid())?;
    /// b.post_recv(1, pool.alloc().expect("a free buffer"))?;
    /// a.post_send(2, pool.alloc().expect("a free buffer"))?;
    ///
    /// let mut wc = [WorkCompletion::default(); 8];
    /// let n = cq.poll(&mut wc)?; // both QPs' completions, in the caller's array
    /// assert_eq!(n, 2);
    /// let mut ids: Vec<u64> = wc[..n].iter().map(|c| c.wr_id).collect();
    /// ids.sort();
    /// assert_eq!(ids, [1, 2]);
    /// assert_eq!(pool.free_count(), 4, "raw polls hand safe buffers back");
    /// assert_eq!(cq.poll(&mut wc)?, 0);
    /// # Ok(()) }
    /// ```
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        self.ctx.provider().poll_cq(&self.raw, out)
    }

    /// Starts a poll (`ibv_start_poll`): `None` when there is nothing to poll, else a cursor on
    /// the first completion. Fields are read from the device's entry only when asked.
    ///
    /// # Example
    ///
    /// ```
    /// # include!("../doctests.rs");
    /// # fn main() -> bareverbs::Result<()> {
    /// use bareverbs::verbs::*;
    /// let (_machine, ctx) = pvrdma()?;
    /// let gid = ctx.bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))?;
    /// let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq(64)?;
    /// let pool = pd.buffer_pool(8, 64)?;
    /// let (mut a, mut b) = rc_pair(&pd, &cq, &pool, gid.gid())?;
    /// for i in 0..3 {
    ///     b.post_recv(i, pool.alloc().expect("a free buffer"))?;
    ///     a.post_send(10 + i, pool.alloc().expect("a free buffer"))?;
    /// }
    /// let mut received = 0;
    /// if let Some(mut c) = cq.start_poll()? {
    ///     loop {
    ///         // Only the fields asked for are read.
    ///         if c.status() == WcStatus::Success && c.opcode() == WcOpcode::Recv {
    ///             received += c.byte_len();
    ///         }
    ///         if !c.next_poll()? {
    ///             break;
    ///         }
    ///     }
    /// } // the cursor's end hands the entries back to the device (`ibv_end_poll`)
    /// assert_eq!(received, 3 * 64);
    /// assert!(cq.start_poll()?.is_none());
    /// # Ok(()) }
    /// ```
    pub fn start_poll(&self) -> Result<Option<PollCursor<'_, P>>> {
        let Some(mut p) = self.ctx.provider().start_poll(&self.raw, None)? else {
            return Ok(None);
        };
        Ok(p.advance()?.then_some(PollCursor { p }))
    }

    /// Arms the CQ for one event at its next completion (`solicited_only`: its next
    /// solicited or error completion) (`ibv_req_notify_cq`). The event goes to the CQ's
    /// channel and wakes a task waiting on it; completions that arrived before the arm raise
    /// none, so poll once more after arming. A device that cannot tell solicited completions
    /// apart (QEMU's PVRDMA) raises the event at the next completion of any kind.
    ///
    /// # Errors
    ///
    /// [`Resource::Objects`](crate::error::Resource) for
    /// [`Object::CqEventSlot`](crate::error::Object::CqEventSlot): the CQ was created when
    /// [`CQ_SLOTS`](crate::events::CQ_SLOTS) CQs took part in events already.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.ctx.provider().req_notify_cq(&self.raw, solicited_only)
    }

    /// Acknowledges `n` events taken from the CQ's channel (`ibv_ack_cq_events`): the CQ
    /// cannot be destroyed while an event taken is not acknowledged.
    pub fn ack_events(&self, n: u32) {
        let p = self.ctx.provider();
        if let Some(slot) = p.cq_slot(&self.raw) {
            p.events().ack(slot, n);
        }
    }

    /// The CQ's identity in events ([`CompletionChannel::get_cq_event`](super::CompletionChannel::get_cq_event) names it).
    pub fn id(&self) -> CqId {
        self.ctx.provider().cq_id(&self.raw)
    }

    /// The number of entries (≥ the request: devices round up).
    pub fn entries(&self) -> u32 {
        self.ctx.provider().cq_entries(&self.raw)
    }

    /// The context it belongs to.
    pub fn context(&self) -> &'c Context<P> {
        self.ctx
    }

    /// The provider's object.
    pub fn raw(&self) -> &P::Cq {
        &self.raw
    }
}
destroy_and_drop!(CompletionQueue, destroy_cq, "completion queue");

/// A poll in progress (`ibv_start_poll` … `ibv_end_poll`), on one completion at a time. The
/// entries read are handed back to the device when it is dropped.
pub struct PollCursor<'c, P: Provider + 'c> {
    p: P::Poll<'c>,
}

impl<'c, P: Provider + 'c> PollCursor<'c, P> {
    /// Moves to the next completion (`ibv_next_poll`); `false` when there is none (the
    /// completion before stays valid until then).
    pub fn next_poll(&mut self) -> Result<bool> {
        self.p.advance()
    }

    /// `wr_id` of the current completion.
    pub fn wr_id(&self) -> u64 {
        self.p.wr_id()
    }

    /// Status.
    pub fn status(&self) -> WcStatus {
        self.p.status()
    }

    /// Operation.
    pub fn opcode(&self) -> WcOpcode {
        self.p.opcode()
    }

    /// The local QP number.
    pub fn qp_num(&self) -> u32 {
        self.p.qp_num()
    }

    /// Bytes received.
    pub fn byte_len(&self) -> u32 {
        self.p.byte_len()
    }

    /// Flags.
    pub fn flags(&self) -> WcFlags {
        self.p.flags()
    }

    /// Immediate data (0 without [`WcFlags::WITH_IMM`]).
    pub fn imm(&self) -> u32 {
        self.p.imm()
    }

    /// The sender's QP number (UD receives).
    pub fn src_qp(&self) -> u32 {
        self.p.src_qp()
    }

    /// The device's detail of an error.
    pub fn vendor_err(&self) -> u32 {
        self.p.vendor_err()
    }
}
