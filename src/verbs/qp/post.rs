//! The raw fast path, after `ibv_wr_*`: a batch borrows the queue pair, each per-opcode method
//! writes its request straight into the ring slot, and [`SendBatch::finish`] publishes the
//! batch with one doorbell. A batch dropped unfinished posts nothing. `wr_id` is the caller's,
//! all 64 bits.
//!
//! The methods are `unsafe` because the device reads and writes the named memory after they
//! return: every buffer stays allocated, registered and untouched by the CPU until its
//! completion has been polled (or the QP reset or destroyed).

use core::marker::PhantomData;

use super::super::qp_types::QpState;
use super::super::{AddressHandle, ExtWqe, Provider, SendFlags, SendWqe, Sge, UdTarget, WrOpcode};
use super::{CanRecv, CanSend, Datagram, QueuePair, Rc, State, Transport, Uc};
use crate::error::Result;

/// Send requests being written into a queue pair's send queue (`ibv_wr_start` …
/// `ibv_wr_complete`).
///
/// The raw path: each request is written straight into its ring slot, naming memory by
/// scatter/gather entries ([`MemoryRegion::sge`](crate::verbs::MemoryRegion::sge)), and
/// [`finish`](Self::finish) publishes the batch with one doorbell. A batch dropped unfinished
/// posts nothing. [`RecvBatch`] is the same for receives.
///
/// # Example
///
/// ```
/// # include!("../../doctests.rs");
/// # fn main() -> bareverbs::Result<()> {
/// use bareverbs::verbs::*;
/// let (_machine, ctx) = pvrdma()?;
/// let gid = ctx.bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64)?;
/// let pool = pd.buffer_pool(1, 64)?;
/// let (mut a, mut b) = rc_pair(&pd, &cq, &pool, gid.gid())?;
///
/// let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE)?;
/// mr.as_mut_slice()[..6].copy_from_slice(b"batch!");
/// let out = mr.sge(0, 6)?;
/// let inbox = [mr.sge(2048, 1024)?, mr.sge(3072, 1024)?];
/// // SAFETY: the CPU leaves `mr` alone until every completion below is polled.
/// unsafe {
///     let mut recvs = b.recv_batch();
///     recvs.recv(10, &inbox[..1])?;
///     recvs.recv(11, &inbox[1..])?;
///     recvs.finish(); // one doorbell for both
///     let mut sends = a.send_batch();
///     sends.send(20, SendFlags::SIGNALED, &[out])?;
///     sends.send(21, SendFlags::SIGNALED, &[out])?;
///     sends.finish();
/// }
/// let mut wc = [WorkCompletion::default(); 4];
/// let mut n = 0;
/// while n < 4 {
///     n += cq.poll(&mut wc[n..])?;
/// }
/// assert!(wc.iter().all(|c| c.status == WcStatus::Success));
/// assert_eq!(&mr.as_slice()[2048..2054], b"batch!");
/// assert_eq!(&mr.as_slice()[3072..3078], b"batch!");
/// # Ok(()) }
/// ```
///
/// A datagram QP's sends name their destination: `send` on one does not compile ("`Ud` is a
/// datagram transport", E0277), `send_to` is its method:
///
/// ```compile_fail,E0277
/// # use bareverbs::verbs::*;
/// # fn f<'a, P: Provider>(mut qp: QueuePair<'a, P, Ud, Rts>, sge: Sge) -> bareverbs::Result<()> {
/// let mut batch = qp.send_batch();
/// // SAFETY: (the module's contract for the memory named)
/// unsafe { batch.send(1, SendFlags::SIGNALED, &[sge])? }; // error: no destination
/// # Ok(()) }
/// ```
pub struct SendBatch<'q, P: Provider, T> {
    provider: &'q P,
    qp: &'q mut P::Qp,
    cursor: P::Cursor,
    /// The QP is in ERROR: the requests complete flushed, the device never sees them.
    flushed: bool,
    _t: PhantomData<T>,
}

// The state bounds sit on the methods, not on the blocks: a post in the wrong state is then an
// unmet bound (E0277) that `CanSend`'s and `CanRecv`'s messages explain, not a missing method.
impl<'a, P: Provider, T: Transport, S: State> QueuePair<'a, P, T, S> {
    /// Starts a batch of send requests (`ibv_wr_start`). In ERROR, the requests complete with
    /// [`WcStatus::WrFlushErr`](crate::verbs::WcStatus::WrFlushErr), each once, and the device
    /// never sees them.
    #[inline]
    pub fn send_batch(&mut self) -> SendBatch<'_, P, T>
    where
        S: CanSend,
    {
        let provider = self.inner.ctx.provider();
        SendBatch {
            provider,
            cursor: provider.sq_start(&self.inner.raw),
            qp: &mut self.inner.raw,
            flushed: S::STATE == QpState::Err,
            _t: PhantomData,
        }
    }
}

impl<P: Provider, T> SendBatch<'_, P, T> {
    /// Writes one request.
    ///
    /// # Safety
    ///
    /// The module's contract for the buffers named.
    #[inline(always)]
    unsafe fn push(&mut self, w: SendWqe<'_, P::Ah>) -> Result<()> {
        // SAFETY: forwarded from our caller.
        unsafe { self.provider.sq_write(self.qp, &mut self.cursor, &w) }
    }

    /// Writes one work request on a key (memory windows, fast registration, invalidation).
    ///
    /// # Safety
    ///
    /// The module's contract for the buffers named.
    pub(crate) unsafe fn push_ext(&mut self, w: &ExtWqe<'_>) -> Result<()> {
        // SAFETY: forwarded from our caller.
        unsafe { self.provider.sq_write_ext(self.qp, &mut self.cursor, w) }
    }

    /// Publishes every request written, with one doorbell (`ibv_wr_complete`). A batch
    /// dropped without it posts nothing.
    #[inline]
    pub fn finish(self) {
        if self.flushed {
            self.provider.sq_commit_flushed(self.qp, &self.cursor);
        } else {
            self.provider.sq_commit(self.qp, &self.cursor);
        }
    }
}

impl<P: Provider, T> Drop for SendBatch<'_, P, T> {
    /// A batch dropped unfinished leaves nothing to undo: its requests stay unpublished, past
    /// the index the device reads, and the QP's position never moved.
    #[inline(always)]
    fn drop(&mut self) {}
}

/// Transports whose sends name no destination (connected: RC, UC).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is a datagram transport: its sends name an address (`send_to`)",
    label = "a connected QP (`Rc`, `Uc`) is needed here",
    note = "a datagram QP posts with `post_send_to`, or `send_batch().send_to(..)`"
)]
pub trait Connected: Transport {}
impl Connected for Rc {}
impl Connected for Uc {}

impl<P: Provider, T> SendBatch<'_, P, T> {
    /// SEND of the bytes in `sges`.
    ///
    /// # Safety
    ///
    /// The buffers stay allocated, registered and untouched by the CPU until the completion
    /// has been polled (or the QP reset or destroyed).
    #[inline(always)]
    pub unsafe fn send(&mut self, wr_id: u64, flags: SendFlags, sges: &[Sge]) -> Result<()>
    where
        T: Connected,
    {
        // SAFETY: forwarded from our caller.
        unsafe { self.push(SendWqe::new(wr_id, WrOpcode::Send, flags, sges)) }
    }

    /// SEND with immediate data.
    ///
    /// # Safety
    ///
    /// As [`send`](Self::send).
    #[inline(always)]
    pub unsafe fn send_imm(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        imm: u32,
        sges: &[Sge],
    ) -> Result<()>
    where
        T: Connected,
    {
        let w = SendWqe {
            imm,
            ..SendWqe::new(wr_id, WrOpcode::SendWithImm, flags, sges)
        };
        // SAFETY: forwarded from our caller.
        unsafe { self.push(w) }
    }

    /// SEND of the bytes in `sges` that invalidates the peer's key `rkey`
    /// (`IBV_WR_SEND_WITH_INV`): a fast-registered region's or a type 2 window's of the
    /// receiving QP's PD (the window bound to that QP). The peer's receive completion carries
    /// [`WcFlags::WITH_INV`](crate::verbs::WcFlags::WITH_INV) and the key; a key the peer may
    /// not invalidate fails the SEND at both ends (remote invalid request) and both QPs enter
    /// ERROR.
    ///
    /// # Safety
    ///
    /// As [`send`](Self::send).
    pub unsafe fn send_with_inv(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        rkey: u32,
        sges: &[Sge],
    ) -> Result<()>
    where
        T: Connected,
    {
        let w = ExtWqe {
            wr_id,
            flags,
            op: crate::verbs::ExtOp::SendWithInv { rkey, sges },
        };
        // SAFETY: forwarded from our caller.
        unsafe { self.push_ext(&w) }
    }

    /// RDMA WRITE of `sges` to `remote_addr` in the peer's region keyed `rkey`.
    ///
    /// # Safety
    ///
    /// As [`send`](Self::send).
    #[inline(always)]
    pub unsafe fn rdma_write(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        (remote_addr, rkey): (u64, u32),
        sges: &[Sge],
    ) -> Result<()>
    where
        T: Connected,
    {
        let w = SendWqe {
            remote_addr,
            rkey,
            ..SendWqe::new(wr_id, WrOpcode::RdmaWrite, flags, sges)
        };
        // SAFETY: forwarded from our caller.
        unsafe { self.push(w) }
    }

    /// RDMA WRITE with immediate data (consumes a receive at the peer).
    ///
    /// # Safety
    ///
    /// As [`send`](Self::send).
    #[inline(always)]
    pub unsafe fn rdma_write_imm(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        (remote_addr, rkey): (u64, u32),
        imm: u32,
        sges: &[Sge],
    ) -> Result<()>
    where
        T: Connected,
    {
        let w = SendWqe {
            remote_addr,
            rkey,
            imm,
            ..SendWqe::new(wr_id, WrOpcode::RdmaWriteWithImm, flags, sges)
        };
        // SAFETY: forwarded from our caller.
        unsafe { self.push(w) }
    }

    /// RDMA READ from `remote_addr` (keyed `rkey`) into `sges`.
    ///
    /// # Safety
    ///
    /// As [`send`](Self::send).
    #[inline(always)]
    pub unsafe fn rdma_read(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        (remote_addr, rkey): (u64, u32),
        sges: &[Sge],
    ) -> Result<()>
    where
        T: Connected,
    {
        let w = SendWqe {
            remote_addr,
            rkey,
            ..SendWqe::new(wr_id, WrOpcode::RdmaRead, flags, sges)
        };
        // SAFETY: forwarded from our caller.
        unsafe { self.push(w) }
    }

    /// Atomic compare-and-swap of the 8 bytes at `remote_addr`; the old value lands in `sge`.
    ///
    /// # Safety
    ///
    /// As [`send`](Self::send).
    #[inline(always)]
    pub unsafe fn atomic_cmp_swp(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        (remote_addr, rkey): (u64, u32),
        (compare, swap): (u64, u64),
        sge: &Sge,
    ) -> Result<()>
    where
        T: Connected,
    {
        let w = SendWqe {
            remote_addr,
            rkey,
            compare_add: compare,
            swap,
            ..SendWqe::new(
                wr_id,
                WrOpcode::AtomicCmpSwap,
                flags,
                core::slice::from_ref(sge),
            )
        };
        // SAFETY: forwarded from our caller.
        unsafe { self.push(w) }
    }

    /// Atomic fetch-and-add of `add` to the 8 bytes at `remote_addr`; the old value lands in
    /// `sge`.
    ///
    /// # Safety
    ///
    /// As [`send`](Self::send).
    #[inline(always)]
    pub unsafe fn atomic_fetch_add(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        (remote_addr, rkey): (u64, u32),
        add: u64,
        sge: &Sge,
    ) -> Result<()>
    where
        T: Connected,
    {
        let w = SendWqe {
            remote_addr,
            rkey,
            compare_add: add,
            ..SendWqe::new(
                wr_id,
                WrOpcode::AtomicFetchAdd,
                flags,
                core::slice::from_ref(sge),
            )
        };
        // SAFETY: forwarded from our caller.
        unsafe { self.push(w) }
    }

    /// SEND of `data` copied into the request (inline): safe, the bytes are the device's as
    /// soon as this returns.
    #[inline]
    pub fn send_inline(&mut self, wr_id: u64, flags: SendFlags, data: &[u8]) -> Result<()>
    where
        T: Connected,
    {
        let sge = Sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        };
        let w = SendWqe::new(
            wr_id,
            WrOpcode::Send,
            flags | SendFlags::INLINE,
            core::slice::from_ref(&sge),
        );
        // SAFETY: an inline request copies its bytes into the WQE before `sq_write` returns
        // (a provider without inline data refuses it without reading them).
        unsafe { self.push(w) }
    }
}

impl<P: Provider, T> SendBatch<'_, P, T> {
    /// SEND of `sges` to QP `remote_qpn` (Q_Key `remote_qkey`; bit 31 set: the QP's own) at
    /// the address `ah`.
    ///
    /// # Safety
    ///
    /// As [`send`](SendBatch::send).
    #[inline(always)]
    pub unsafe fn send_to(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        (ah, remote_qpn, remote_qkey): (&AddressHandle<'_, P>, u32, u32),
        sges: &[Sge],
    ) -> Result<()>
    where
        T: Datagram,
    {
        let w = SendWqe {
            ud: Some(UdTarget {
                ah: ah.raw(),
                remote_qpn,
                remote_qkey,
            }),
            ..SendWqe::new(wr_id, WrOpcode::Send, flags, sges)
        };
        // SAFETY: forwarded from our caller.
        unsafe { self.push(w) }
    }

    /// SEND with immediate data to a UD destination.
    ///
    /// # Safety
    ///
    /// As [`send`](SendBatch::send).
    #[inline(always)]
    pub unsafe fn send_to_imm(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        (ah, remote_qpn, remote_qkey): (&AddressHandle<'_, P>, u32, u32),
        imm: u32,
        sges: &[Sge],
    ) -> Result<()>
    where
        T: Datagram,
    {
        let w = SendWqe {
            imm,
            ud: Some(UdTarget {
                ah: ah.raw(),
                remote_qpn,
                remote_qkey,
            }),
            ..SendWqe::new(wr_id, WrOpcode::SendWithImm, flags, sges)
        };
        // SAFETY: forwarded from our caller.
        unsafe { self.push(w) }
    }
}

/// Receive requests being written into a queue pair's receive queue (the raw path: see
/// [`SendBatch`], whose example posts both).
///
/// # Example
///
/// ```
/// # include!("../../doctests.rs");
/// # fn main() -> bareverbs::Result<()> {
/// use bareverbs::verbs::*;
/// let (_machine, ctx) = pvrdma()?;
/// let _gid = ctx.bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))?; // UD needs one
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64)?;
/// let caps = QpCaps {
///     max_send_wr: 1,
///     max_recv_wr: 16,
///     max_send_sge: 1,
///     max_recv_sge: 1,
///     max_inline_data: 0,
/// };
/// let qp = pd.qp_builder(&cq, &cq).caps(caps).build::<Ud>()?;
/// let mut qp = qp.ready(0x1111, 0)?;
/// let depth = qp.caps().max_recv_wr; // 16 or more
/// let mr = pd.register(depth as usize * 64, AccessFlags::LOCAL_WRITE)?;
/// // SAFETY: the CPU leaves `mr` alone while the receives are posted.
/// unsafe {
///     let mut batch = qp.recv_batch();
///     for i in 0..depth {
///         batch.recv(u64::from(i), &[mr.sge(i * 64, 64)?])?;
///     }
///     batch.finish();
/// }
/// // The queue is full: one more is refused, typed.
/// // SAFETY: as above.
/// let e = unsafe { qp.post_recv_raw(99, &[mr.sge(0, 64)?]) };
/// assert!(matches!(e, Err(bareverbs::Error::QueueFull { .. })));
/// # drop(qp);
/// # Ok(()) }
/// ```
pub struct RecvBatch<'q, P: Provider> {
    provider: &'q P,
    qp: &'q mut P::Qp,
    cursor: P::Cursor,
    /// The QP is in ERROR (as in [`SendBatch`]).
    flushed: bool,
}

impl<'a, P: Provider, T: Transport, S: State> QueuePair<'a, P, T, S> {
    /// Starts a batch of receive requests (in ERROR they complete flushed, as sends do).
    #[inline]
    pub fn recv_batch(&mut self) -> RecvBatch<'_, P>
    where
        S: CanRecv,
    {
        let provider = self.inner.ctx.provider();
        RecvBatch {
            provider,
            cursor: provider.rq_start(&self.inner.raw),
            qp: &mut self.inner.raw,
            flushed: S::STATE == QpState::Err,
        }
    }

    /// Posts one receive request (`ibv_post_recv` of one WR).
    ///
    /// # Safety
    ///
    /// As [`SendBatch::send`].
    #[inline]
    pub unsafe fn post_recv_raw(&mut self, wr_id: u64, sges: &[Sge]) -> Result<()>
    where
        S: CanRecv,
    {
        let mut b = self.recv_batch();
        // SAFETY: forwarded from our caller.
        unsafe { b.recv(wr_id, sges)? };
        b.finish();
        Ok(())
    }
}

impl<P: Provider> RecvBatch<'_, P> {
    /// A receive into `sges`.
    ///
    /// # Safety
    ///
    /// As [`SendBatch::send`]: the buffers stay untouched until the completion.
    #[inline(always)]
    pub unsafe fn recv(&mut self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        // SAFETY: forwarded from our caller.
        unsafe {
            self.provider
                .rq_write(self.qp, &mut self.cursor, wr_id, sges, 0)
        }
    }

    /// Publishes every request written, with one doorbell. A batch dropped without it posts
    /// nothing.
    #[inline]
    pub fn finish(self) {
        if self.flushed {
            self.provider.rq_commit_flushed(self.qp, &self.cursor);
        } else {
            self.provider.rq_commit(self.qp, &self.cursor);
        }
    }
}

impl<P: Provider> Drop for RecvBatch<'_, P> {
    /// As for [`SendBatch`]: nothing to undo.
    #[inline(always)]
    fn drop(&mut self) {}
}
