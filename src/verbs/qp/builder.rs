//! Queue-pair creation (`ibv_create_qp` / `ibv_create_qp_ex`): one builder, compiled once per
//! provider (the transport only picks the type tag of the result).

use core::marker::PhantomData;
use core::mem::ManuallyDrop;

use super::super::qp_types::*;
use super::super::{
    BufferPool, CompletionQueue, Context, ProtectionDomain, Provider, SharedReceiveQueue,
};
use super::{QpInner, QueuePair, Reset, Transport};
use crate::error::{Error, Feature, Result, Unsupported};

/// Builds a queue pair (`ibv_create_qp` / `ibv_create_qp_ex`).
///
/// Made by [`ProtectionDomain::qp_builder`]; the transport is a type parameter of
/// [`build`](Self::build), and the QP starts in RESET with capacities at least those asked for.
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
/// let (send_cq, recv_cq) = (ctx.create_cq(512)?, ctx.create_cq(512)?);
/// let pool = pd.buffer_pool(64, 2048)?;
/// let caps = QpCaps {
///     max_send_wr: 100,
///     max_recv_wr: 100,
///     max_send_sge: 2,
///     max_recv_sge: 2,
///     max_inline_data: 0,
/// };
/// let rc = pd
///     .qp_builder(&send_cq, &recv_cq)
///     .caps(caps)
///     .pool(&pool) // the safe path: post_send / post_recv of the pool's buffers
///     .build::<Rc>()?;
/// assert_eq!(rc.state(), QpState::Reset);
/// assert!(rc.caps().max_send_wr >= 100); // devices round up: 128 here
///
/// // A datagram QP goes from RESET to RTS in one step, with its Q_Key.
/// let ud = pd.qp_builder(&send_cq, &recv_cq).build::<Ud>()?;
/// let ud = ud.ready(0x1111, 0)?;
/// assert_eq!(ud.query()?.qkey, 0x1111);
/// # Ok(()) }
/// ```
pub struct QpBuilder<'a, P: Provider> {
    ctx: &'a Context<P>,
    pd: &'a P::Pd,
    send_cq: &'a P::Cq,
    recv_cq: &'a P::Cq,
    srq: Option<&'a P::Srq>,
    pool: Option<&'a BufferPool<'a, P>>,
    caps: QpCaps,
    sq_sig_all: bool,
    user_context: u64,
    ex: QpInitEx<'a>,
}

impl<'c, P: Provider> ProtectionDomain<'c, P> {
    /// Starts building a queue pair in this protection domain, completing sends to `send_cq`
    /// and receives to `recv_cq` (which may be the same CQ). Capacities default to
    /// [`QpCaps::default()`]: 16 work requests outstanding and 1 scatter/gather entry each
    /// way, no inline data; [`QpBuilder::caps`] asks for others.
    #[inline(never)]
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
            pool: None,
            caps: QpCaps::DEFAULT,
            sq_sig_all: false,
            user_context: 0,
            ex: QpInitEx::default(),
        }
    }
}

impl<'a, P: Provider> QpBuilder<'a, P> {
    /// The requested capacities (the minimums: the QP gets at least these). Without this call,
    /// [`QpCaps::default()`]: 16 requests outstanding each way, 1 scatter/gather entry each,
    /// no inline data. A post beyond the depth is refused whole with
    /// [`Error::QueueFull`].
    #[inline(never)]
    pub fn caps(mut self, caps: QpCaps) -> Self {
        self.caps = caps;
        self
    }

    /// Whether every send generates a completion (else only those flagged SIGNALED).
    #[inline(never)]
    pub fn sq_sig_all(mut self, on: bool) -> Self {
        self.sq_sig_all = on;
        self
    }

    /// A value kept with the QP (`qp_context`).
    #[inline(never)]
    pub fn user_context(mut self, value: u64) -> Self {
        self.user_context = value;
        self
    }

    /// Receives come from `srq` (RC and UD only); the receive capacities are then ignored and
    /// reported as 0.
    #[inline(never)]
    pub fn srq(mut self, srq: &'a SharedReceiveQueue<'_, P>) -> Self {
        self.srq = Some(srq.raw());
        self
    }

    /// Enables the safe path with buffers of `pool`: [`QueuePair::post_send`] and
    /// [`QueuePair::post_recv`] take its [`Buf`](super::super::Buf)s (16 bytes of driver-side
    /// bookkeeping per ring slot, in driver-private memory).
    #[inline(never)]
    pub fn pool(mut self, pool: &'a BufferPool<'a, P>) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The `_ex` attributes (`ibv_create_qp_ex`).
    #[inline(never)]
    pub fn ex(mut self, ex: QpInitEx<'a>) -> Self {
        self.ex = ex;
        self
    }

    /// Creates the queue pair, in RESET.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for capacities beyond the device's limits (naming the
    /// parameter and the limit), [`Error::QueueFull`] on PVRDMA when a completion queue
    /// cannot hold a completion for every request the QP can have outstanding (the software
    /// RoCE device never refuses a QP for its CQs' size: it takes their room when requests
    /// are posted, and refuses a post beyond it), [`Unsupported`] for a type
    /// or feature the device lacks, and the device's errors; nothing is left behind on
    /// failure.
    pub fn build<T: Transport>(self) -> Result<QueuePair<'a, P, T, Reset>> {
        Ok(QueuePair {
            inner: self.build_inner(T::TYPE)?,
            _t: PhantomData,
        })
    }

    /// The part of `build` that does not depend on `T`.
    #[inline(never)]
    fn build_inner(self, qp_type: QpType) -> Result<QpInner<'a, P>> {
        let has_srq = self.srq.is_some();
        if has_srq && !qp_type.may_use_srq() {
            return Err(Error::Unsupported(Unsupported::Feature(
                Feature::SrqOnQpType,
            )));
        }
        let init = QpInit {
            qp_type,
            caps: self.caps,
            sq_sig_all: self.sq_sig_all,
            has_srq,
            ex: self.ex,
            safe: self.pool.map(BufferPool::release_hook),
        };
        let provider = self.ctx.provider();
        let (pd, cqs, srq) = (self.pd, (self.send_cq, self.recv_cq), self.srq);
        let raw = {
            // SAFETY: the QP is owned by a QueuePair that borrows the context (and PD, CQs,
            // SRQ, pool), which therefore outlive it and cannot move; it is destroyed or leaked
            // when that is dropped.
            unsafe { provider.create_qp(pd, cqs.0, cqs.1, srq, &init)? }
        };
        let caps = provider.qp_caps(&raw);
        if let Some(p) = self.pool {
            p.hold();
        }
        Ok(QpInner {
            ctx: self.ctx,
            raw: ManuallyDrop::new(raw),
            caps,
            user_context: self.user_context,
            mcast: 0,
            psn: self.ctx.random_psn(),
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            pool: self.pool,
            _borrows: PhantomData,
        })
    }
}
