//! Queue pairs and shared receive queues: `ibv_create_qp[_ex]` / `ibv_destroy_qp` semantics with
//! the connection state machine as typestate.
//!
//! A [`QueuePair`] is typed by its transport (`T`: [`Rc`], [`Uc`], [`Ud`], [`Gsi`],
//! [`RawPacket`]) and its state (`S`: [`Reset`], [`Init`], [`Rtr`], [`Rts`], [`ErrState`]); its
//! size does not depend on its queue depth (the queues live in memory from the HAL). The
//! compile-time rules, with examples, are on [`QueuePair`].

mod builder;
mod handshake;
mod post;
mod safe;
mod typestate;

use core::marker::PhantomData;
use core::mem::ManuallyDrop;

pub use builder::QpBuilder;
pub use handshake::{DEFAULT_RD_ATOMIC, Endpoint, Handshake};
pub use post::{RecvBatch, SendBatch};
pub use safe::Completion;
pub use typestate::*;

use super::qp_types::*;
use super::{BufferPool, Context, Gid, Provider};
use crate::error::{Attr, Error, Holder, Op, Result};

/// The state-independent part of a queue pair; it owns the device object.
struct QpInner<'a, P: Provider> {
    ctx: &'a Context<P>,
    raw: ManuallyDrop<P::Qp>,
    caps: QpCaps,
    user_context: u64,
    mcast: u32,
    /// The starting PSN drawn at creation (what the QP expects first; see `handshake`).
    psn: u32,
    send_cq: &'a P::Cq,
    recv_cq: &'a P::Cq,
    pool: Option<&'a BufferPool<'a, P>>,
    _borrows: PhantomData<(&'a P::Pd, &'a P::Srq)>,
}

impl<P: Provider> QpInner<'_, P> {
    /// Checks and applies a modify (compiled once per provider, whatever the states).
    #[inline(never)]
    fn modify(&mut self, attr: &ModifyAttr) -> Result<()> {
        let provider = self.ctx.provider();
        validate(provider.caps(), attr)?;
        provider
            .modify_qp(&mut self.raw, attr)
            .map_err(|e| match (e, attr.av) {
                // The device names no index: the path's says which one is unbound.
                (
                    Error::MissingAttribute {
                        op,
                        attr: Attr::SourceGid,
                    },
                    Some(av),
                ) => Error::MissingAttribute {
                    op,
                    attr: Attr::BoundGid {
                        index: av.sgid_index,
                    },
                },
                (e, _) => e,
            })
    }

    /// `destroy` without the typestate.
    #[inline(never)]
    fn destroy(&mut self) -> Result<()> {
        if self.mcast > 0 {
            return Err(Error::InUse {
                op: Op::DestroyQp,
                holder: Holder::McastGroups,
                count: self.mcast,
            });
        }
        self.destroy_raw()
    }

    /// Destroys the device QP (its outstanding safe buffers go back to their pool). On
    /// failure the QP is kept.
    fn destroy_raw(&mut self) -> Result<(), Error> {
        // SAFETY: `raw` is taken here and put back on failure; on success the caller never
        // touches it again (it forgets or drops `self` without running Drop's destroy).
        let raw = unsafe { ManuallyDrop::take(&mut self.raw) };
        match self.ctx.provider().destroy_qp(raw) {
            Ok(()) => {
                if let Some(p) = self.pool {
                    p.release();
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

impl<P: Provider> Drop for QpInner<'_, P> {
    fn drop(&mut self) {
        if let Err(e) = self.destroy_raw() {
            // The device may still use the rings and the posted buffers: keep them all.
            let leaked = "); its memory is leaked";
            crate::error::warn("queue pair not destroyed (", &e, leaked);
        }
    }
}

/// A queue pair of transport `T` ([`Rc`], [`Uc`], [`Ud`], [`Gsi`], [`RawPacket`]) in state `S`
/// ([`Reset`], [`Init`], [`Rtr`], [`Rts`], [`ErrState`]): `ibv_qp` with the connection state
/// machine as typestate. Created by a [`QpBuilder`], in RESET.
///
/// Its size does not depend on its queue depth (the queues live in memory from the HAL). It
/// borrows its protection domain, completion queues, shared receive queue and buffer pool, so
/// none of them can be destroyed while it exists. A transition exists only from the state it
/// starts in, and consumes the QP: on failure it hands the QP back, unchanged, with the error.
///
/// # Example
///
/// RESET → INIT → RTR → RTS, then a message from `a` to `b` on the safe path (buffers of a
/// [`BufferPool`] move into the QP when posted and come back with the completion):
///
/// ```
/// # include!("../../doctests.rs");
/// # fn main() -> bareverbs::Result<()> {
/// use bareverbs::verbs::*;
/// let (_machine, ctx) = pvrdma()?;
/// let gid = ctx.bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64)?;
/// let pool = pd.buffer_pool(8, 256)?;
/// let a = pd.qp_builder(&cq, &cq).pool(&pool).build::<Rc>()?;
/// let b = pd.qp_builder(&cq, &cq).pool(&pool).build::<Rc>()?;
/// assert_eq!(a.state(), QpState::Reset);
/// let (qpn_a, qpn_b) = (a.qp_num(), b.qp_num());
/// let av = AddressVector::new(gid.gid(), gid.index() as u8); // the peer's GID: here, ours
///
/// let a = a.init(&ConnectedInit::default())?;
/// let a = a.rtr(&ConnectedRtr::new(qpn_b, 0, av))?;
/// let mut a = a.rts(&ConnectedRts::new(0))?;
/// let b = b.init(&ConnectedInit::default())?;
/// let b = b.rtr(&ConnectedRtr::new(qpn_a, 0, av))?;
/// let mut b = b.rts(&ConnectedRts::new(0))?;
///
/// b.post_recv(1, pool.alloc().expect("a free buffer"))?;
/// let mut buf = pool.alloc().expect("a free buffer");
/// buf.set_len(5)?;
/// buf.as_mut_slice().copy_from_slice(b"hello");
/// a.post_send(2, buf)?;
/// let got = b.poll_one()?.expect("a receive completion");
/// assert_eq!((got.wc.wr_id, got.wc.byte_len), (1, 5));
/// assert_eq!(got.buf.expect("the buffer").as_slice(), b"hello");
/// let sent = a.poll_one()?.expect("a send completion");
/// assert_eq!(sent.wc.status, WcStatus::Success);
/// # Ok(()) }
/// ```
///
/// # What does not compile
///
/// A transition from a state it does not start in:
///
/// ```compile_fail,E0599
/// # use bareverbs::verbs::*;
/// # fn f<P: Provider>(ctx: &Context<P>) -> bareverbs::Result<()> {
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(16)?;
/// let qp = pd.qp_builder(&cq, &cq).build::<Rc>()?;
/// let qp = qp.rts(&ConnectedRts::new(0)); // error: no `rts` on a QP in RESET
/// # Ok(()) }
/// ```
///
/// A send before RTS: "post sends only on an RTS queue pair" (E0277, at the call):
///
/// ```compile_fail,E0277
/// # use bareverbs::verbs::*;
/// # fn f<'a, P: Provider>(
/// #     pool: &'a BufferPool<'a, P>,
/// #     mut qp: QueuePair<'a, P, Rc, Init>,
/// # ) -> bareverbs::Result<()> {
/// let buf = pool.alloc().expect("a free buffer");
/// qp.post_send(1, buf)?; // error: the QP is in INIT
/// # Ok(()) }
/// ```
///
/// A receive in RESET: "post receives only on a queue pair in INIT, RTR or RTS" (E0277):
///
/// ```compile_fail,E0277
/// # use bareverbs::verbs::*;
/// # fn f<'a, P: Provider>(
/// #     pool: &'a BufferPool<'a, P>,
/// #     mut qp: QueuePair<'a, P, Rc, Reset>,
/// # ) -> bareverbs::Result<()> {
/// let buf = pool.alloc().expect("a free buffer");
/// qp.post_recv(1, buf)?; // error: the QP is in RESET
/// # Ok(()) }
/// ```
///
/// A raw send batch before RTS, the same way:
///
/// ```compile_fail,E0277
/// # use bareverbs::verbs::*;
/// # fn f<'a, P: Provider>(mut qp: QueuePair<'a, P, Rc, Rtr>) {
/// let batch = qp.send_batch(); // error: the QP is in RTR
/// # }
/// ```
///
/// An addressed send on a connected QP: "`Rc` is a connected transport" (E0277):
///
/// ```compile_fail,E0277
/// # use bareverbs::verbs::*;
/// # fn f<'a, P: Provider>(
/// #     pool: &'a BufferPool<'a, P>,
/// #     ah: &AddressHandle<'_, P>,
/// #     mut qp: QueuePair<'a, P, Rc, Rts>,
/// # ) -> bareverbs::Result<()> {
/// let buf = pool.alloc().expect("a free buffer");
/// qp.post_send_to(1, buf, (ah, 7, 0x1111))?; // error: RC has one peer
/// # Ok(()) }
/// ```
///
/// Destroying what a QP borrows while it lives:
///
/// ```compile_fail,E0505
/// # use bareverbs::verbs::*;
/// # fn f<P: Provider>(ctx: &Context<P>) -> bareverbs::Result<()> {
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(16)?;
/// let qp = pd.qp_builder(&cq, &cq).build::<Rc>()?;
/// drop(pd); // error: `pd` is borrowed by `qp`
/// drop(qp);
/// # Ok(()) }
/// ```
pub struct QueuePair<'a, P: Provider, T: Transport, S: State> {
    inner: QpInner<'a, P>,
    _t: PhantomData<(T, S)>,
}

/// Its number, transport and state: what `unwrap` and `expect` print of a hand-back
/// (`Err((qp, error))`) besides the error.
impl<P: Provider, T: Transport, S: State> core::fmt::Debug for QueuePair<'_, P, T, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num())
            .field("qp_type", &T::TYPE)
            .field("state", &S::STATE)
            .finish()
    }
}

impl<'a, P: Provider, T: Transport, S: State> QueuePair<'a, P, T, S> {
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
    #[inline(never)]
    pub fn destroy(self) -> Result<(), (Self, Error)> {
        let mut this = ManuallyDrop::new(self);
        match this.inner.destroy() {
            // Destroyed: forget the rest (references and counters only).
            Ok(()) => Ok(()),
            Err(e) => Err((ManuallyDrop::into_inner(this), e)),
        }
    }

    #[inline(never)]
    fn modify<S2: State>(
        mut self,
        attr: &ModifyAttr,
    ) -> Result<QueuePair<'a, P, T, S2>, (Self, Error)> {
        match self.inner.modify(attr) {
            Ok(()) => Ok(QueuePair {
                inner: self.inner,
                _t: PhantomData,
            }),
            Err(e) => Err((self, e)),
        }
    }

    /// Any state → RESET: outstanding work requests are discarded without completions (their
    /// safe buffers go back to the pool).
    pub fn reset(self) -> Result<QueuePair<'a, P, T, Reset>, (Self, Error)> {
        self.modify(&ModifyAttr::to_state(QpState::Reset))
    }

    /// Any state → ERROR: every outstanding work request completes with
    /// [`WcStatus::WrFlushErr`](super::WcStatus::WrFlushErr), once.
    pub fn to_error(self) -> Result<QueuePair<'a, P, T, ErrState>, (Self, Error)> {
        self.modify(&ModifyAttr::to_state(QpState::Err))
    }
}

impl<'a, P: Provider, T: Transport> QueuePair<'a, P, T, Reset> {
    /// RESET → INIT.
    pub fn init(self, attr: &T::InitAttr) -> Result<QueuePair<'a, P, T, Init>, (Self, Error)> {
        self.modify(&T::init_modify(attr))
    }
}

impl<'a, P: Provider, T: Transport> QueuePair<'a, P, T, Init> {
    /// INIT → RTR.
    pub fn rtr(self, attr: &T::RtrAttr) -> Result<QueuePair<'a, P, T, Rtr>, (Self, Error)> {
        self.modify(&T::rtr_modify(attr))
    }
}

impl<'a, P: Provider, T: Transport> QueuePair<'a, P, T, Rtr> {
    /// RTR → RTS.
    pub fn rts(self, attr: &T::RtsAttr) -> Result<QueuePair<'a, P, T, Rts>, (Self, Error)> {
        self.modify(&T::rts_modify(attr))
    }
}

impl<'a, P: Provider, T: Datagram> QueuePair<'a, P, T, Reset> {
    /// RESET → INIT → RTR → RTS in one call, for datagram QPs (port 1, P_Key index 0).
    /// On failure the QP is reset and handed back in RESET.
    pub fn ready(self, qkey: u32, sq_psn: u32) -> Result<QueuePair<'a, P, T, Rts>, (Self, Error)> {
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
fn back_to_reset<'a, P: Provider, T: Transport, S: State>(
    qp: QueuePair<'a, P, T, S>,
) -> QueuePair<'a, P, T, Reset> {
    match qp.reset() {
        Ok(q) => q,
        Err((q, e)) => {
            let failed = "QP could not be reset after a failed transition: ";
            crate::error::warn(failed, &e, "");
            QueuePair {
                inner: q.inner,
                _t: PhantomData,
            }
        }
    }
}
