//! The safe path: buffers of the QP's [`BufferPool`](super::super::BufferPool) move into the
//! queue pair when posted and come back with their completion, polled through the QP.
//!
//! Completions of other QPs sharing a CQ are left for them: a QP's poll stops at the first one
//! (one CQ per safe QP avoids that head-of-line wait).

use super::super::qp_types::QpState;
use super::super::{AddressHandle, UdTarget};
use super::super::{
    Buf, BufferPool, Provider, SendFlags, SendWqe, WcOpcode, WorkCompletion, WrOpcode,
};
use super::{CanRecv, CanSend, Datagram, QpInner, QueuePair, State, Transport};
use crate::error::{Error, Param, Result};

/// A completion from [`QueuePair::poll_one`]: the work completion and, for a safe post, its
/// buffer handed back (after a receive, its length is what arrived; after a send, the whole
/// buffer).
pub struct Completion<'p, P: Provider> {
    /// The work completion (`wr_id` as the request gave it).
    pub wc: WorkCompletion,
    /// The buffer, for work requests posted by the safe path.
    pub buf: Option<Buf<'p, P>>,
}

/// The refusal of a buffer from another pool (or of a QP built without one).
#[cold]
fn not_own(index: u32) -> Error {
    Error::invalid(Param::Pool, index, 0u32)
}

impl<'a, P: Provider> QpInner<'a, P> {
    /// Checks that `buf` comes from this QP's pool.
    #[inline]
    fn own(&self, buf: &Buf<'a, P>) -> Result<()> {
        // One compare: a QP without a pool has none (null), and a buffer always has one.
        let pool = self
            .pool
            .map_or(core::ptr::null(), |p| p as *const BufferPool<'a, P>);
        if !core::ptr::eq(pool, buf.pool()) {
            return Err(not_own(buf.index()));
        }
        Ok(())
    }

    #[inline]
    fn poll_one(&mut self) -> Result<Option<Completion<'a, P>>> {
        let provider = self.ctx.provider();
        let mut wc = WorkCompletion::default();
        let tag = match provider.poll_qp(self.send_cq, &self.raw, &mut wc)? {
            Some(t) => t,
            None if core::ptr::eq(self.send_cq, self.recv_cq) => return Ok(None),
            None => match self.poll_recv_cq(&mut wc)? {
                Some(t) => t,
                None => return Ok(None),
            },
        };
        let buf = match (tag.checked_sub(1), self.pool) {
            (Some(i), Some(pool)) => {
                let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
                let len = if recv { wc.byte_len } else { pool.buf_size() };
                pool.reclaim(i, len)
            }
            _ => None,
        };
        Ok(Some(Completion { wc, buf }))
    }

    /// The receive CQ's part of [`poll_one`](Self::poll_one), when it is not the send CQ (out
    /// of line: the common case of one CQ keeps one inlined poll).
    #[inline(never)]
    fn poll_recv_cq(&self, wc: &mut WorkCompletion) -> Result<Option<u32>> {
        self.ctx.provider().poll_qp(self.recv_cq, &self.raw, wc)
    }

    #[inline(always)]
    fn post_send_wqe(
        &mut self,
        wr_id: u64,
        buf: Buf<'a, P>,
        ud: Option<UdTarget<'_, P::Ah>>,
        flushed: bool,
    ) -> Result<(), (Buf<'a, P>, Error)> {
        if let Err(e) = self.own(&buf) {
            return Err((buf, e));
        }
        let sge = buf.sge();
        let w = SendWqe {
            ud,
            tag: buf.index() + 1,
            ..SendWqe::new(
                wr_id,
                WrOpcode::Send,
                SendFlags::SIGNALED,
                core::slice::from_ref(&sge),
            )
        };
        let provider = self.ctx.provider();
        let mut c = provider.sq_start(&self.raw);
        // SAFETY: the buffer moves into the QP right after (its handle is given up), so the
        // CPU no longer reaches it; it comes back only with its completion.
        if let Err(e) = unsafe { provider.sq_write(&mut self.raw, &mut c, &w) } {
            return Err((buf, e));
        }
        if flushed {
            provider.sq_commit_flushed(&mut self.raw, &c);
        } else {
            provider.sq_commit(&mut self.raw, &c);
        }
        buf.into_tag();
        Ok(())
    }

    #[inline(always)]
    fn post_recv(
        &mut self,
        wr_id: u64,
        buf: Buf<'a, P>,
        flushed: bool,
    ) -> Result<(), (Buf<'a, P>, Error)> {
        if let Err(e) = self.own(&buf) {
            return Err((buf, e));
        }
        let sge = buf.room();
        let provider = self.ctx.provider();
        let sges = core::slice::from_ref(&sge);
        let (mut c, tag) = (provider.rq_start(&self.raw), buf.index() + 1);
        // SAFETY: as in `post_send_wqe`: the buffer moves into the QP right after.
        if let Err(e) = unsafe { provider.rq_write(&mut self.raw, &mut c, wr_id, sges, tag) } {
            return Err((buf, e));
        }
        if flushed {
            provider.rq_commit_flushed(&mut self.raw, &c);
        } else {
            provider.rq_commit(&mut self.raw, &c);
        }
        buf.into_tag();
        Ok(())
    }
}

impl<'a, P: Provider, T: Transport, S: super::State> QueuePair<'a, P, T, S> {
    /// Polls this QP's next completion (from its send CQ, then its receive CQ), handing back
    /// the buffer of a safe post.
    #[inline]
    pub fn poll_one(&mut self) -> Result<Option<Completion<'a, P>>> {
        self.inner.poll_one()
    }

    /// Polls up to `K - out.len()` completions into `out`; returns how many.
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
}

// The bounds on the methods: see `post.rs`.
impl<'a, P: Provider, T: Transport, S: State> QueuePair<'a, P, T, S> {
    /// Posts a SEND of the buffer's bytes (connected transports); the buffer moves into the QP
    /// until its completion. On failure the buffer is handed back with the error. In ERROR it
    /// completes flushed and the device never sees it.
    #[inline]
    pub fn post_send(&mut self, wr_id: u64, buf: Buf<'a, P>) -> Result<(), (Buf<'a, P>, Error)>
    where
        S: CanSend,
    {
        let flushed = S::STATE == QpState::Err;
        self.inner.post_send_wqe(wr_id, buf, None, flushed)
    }
}

impl<'a, P: Provider, T: Transport, S: State> QueuePair<'a, P, T, S> {
    /// Posts a SEND of the buffer's bytes to QP `remote_qpn` (Q_Key `remote_qkey`) at `ah`.
    #[inline]
    pub fn post_send_to(
        &mut self,
        wr_id: u64,
        buf: Buf<'a, P>,
        (ah, remote_qpn, remote_qkey): (&AddressHandle<'_, P>, u32, u32),
    ) -> Result<(), (Buf<'a, P>, Error)>
    where
        T: Datagram,
        S: CanSend,
    {
        let ud = UdTarget {
            ah: ah.raw(),
            remote_qpn,
            remote_qkey,
        };
        let flushed = S::STATE == QpState::Err;
        self.inner.post_send_wqe(wr_id, buf, Some(ud), flushed)
    }
}

impl<'a, P: Provider, T: Transport, S: State> QueuePair<'a, P, T, S> {
    /// Posts a receive into the whole buffer; it moves into the QP until its completion. On
    /// failure the buffer is handed back with the error. In ERROR it completes flushed.
    #[inline]
    pub fn post_recv(&mut self, wr_id: u64, buf: Buf<'a, P>) -> Result<(), (Buf<'a, P>, Error)>
    where
        S: CanRecv,
    {
        let flushed = S::STATE == QpState::Err;
        self.inner.post_recv(wr_id, buf, flushed)
    }
}
