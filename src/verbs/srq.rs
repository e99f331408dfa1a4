//! Shared receive queues (`ibv_create_srq` / `ibv_post_srq_recv` / `ibv_modify_srq` /
//! `ibv_destroy_srq`).

use core::marker::PhantomData;
use core::mem::ManuallyDrop;

use super::{Context, ProtectionDomain, Provider, RecvWr, SrqAttr};
use crate::error::{Error, Result};

impl<'c, P: Provider> ProtectionDomain<'c, P> {
    /// Creates a shared receive queue (`ibv_create_srq`); its actual attributes are
    /// [`SharedReceiveQueue::attr`] (each ≥ the request).
    pub fn create_srq(&self, attr: SrqAttr) -> Result<SharedReceiveQueue<'_, P>> {
        let ctx = self.context();
        // SAFETY: owned by a SharedReceiveQueue that borrows this PD and the context; destroyed
        // or leaked when it is dropped.
        let raw = unsafe { ctx.provider().create_srq(self.raw(), &attr)? };
        Ok(SharedReceiveQueue {
            ctx,
            raw: ManuallyDrop::new(raw),
            _pd: PhantomData,
        })
    }
}

/// A shared receive queue (`ibv_srq`).
pub struct SharedReceiveQueue<'a, P: Provider> {
    ctx: &'a Context<P>,
    raw: ManuallyDrop<P::Srq>,
    _pd: PhantomData<&'a P::Pd>,
}

/// Its attributes: what `unwrap` and `expect` print of a hand-back besides the error.
impl<P: Provider> core::fmt::Debug for SharedReceiveQueue<'_, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("attr", &self.attr())
            .finish()
    }
}

impl<'a, P: Provider> SharedReceiveQueue<'a, P> {
    /// The actual attributes (each ≥ the request).
    pub fn attr(&self) -> SrqAttr {
        self.ctx.provider().srq_attr(&self.raw)
    }

    /// The provider's object.
    pub fn raw(&self) -> &P::Srq {
        &self.raw
    }

    /// Posts receive work requests (`ibv_post_srq_recv`): all or none, one doorbell.
    ///
    /// # Safety
    ///
    /// As [`SendBatch::send`](super::SendBatch::send).
    pub unsafe fn post_recv_raw(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        // SAFETY: forwarded from our caller.
        unsafe { self.ctx.provider().post_srq_recv(&self.raw, wrs) }
    }

    /// Arms the SRQ limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): once fewer than `limit`
    /// receives are posted, the device raises the SRQ_LIMIT_REACHED async event and disarms
    /// (0 disarms now).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a limit above the SRQ's size
    /// ([`Param::SrqLimit`](crate::error::Param::SrqLimit));
    /// [`Error::Unsupported`] with [`Feature::SrqModify`](crate::error::Feature::SrqModify) on
    /// a device that cannot arm it (QEMU's PVRDMA); the device's error otherwise.
    pub fn modify(&self, limit: u32) -> Result<()> {
        self.ctx.provider().modify_srq(&self.raw, limit)
    }

    /// Resizes the SRQ to at least `max_wr` receives (`ibv_modify_srq` with
    /// `IBV_SRQ_MAX_WR`), keeping the receives posted, in order; returns the size it has now
    /// (also [`attr`](Self::attr)'s and [`query`](Self::query)'s `max_wr`). It may shrink, to
    /// no fewer than the receives outstanding. On rxe the room the SRQ's receive CQs reserve
    /// for it follows the new depth (as much as each CQ has free, as at creation).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for more than the device's `max_srq_wr`
    /// ([`Param::SrqMaxWr`](crate::error::Param::SrqMaxWr)), fewer than the receives posted
    /// and not yet taken ([`Param::SrqWrInUse`](crate::error::Param::SrqWrInUse)) or than the
    /// armed limit ([`Param::SrqLimit`](crate::error::Param::SrqLimit)): nothing changed;
    /// [`Error::Unsupported`] with [`Feature::SrqModify`](crate::error::Feature::SrqModify) on
    /// a device that cannot resize (QEMU's PVRDMA); [`Error::Resource`] when the new ring's
    /// memory cannot be had.
    ///
    /// # Example
    ///
    /// ```
    /// # include!("../doctests.rs");
    /// # fn main() -> bareverbs::Result<()> {
    /// use bareverbs::error::{Error, ErrorKind, Param};
    /// use bareverbs::verbs::*;
    ///
    /// /// Grows `srq` to `want` receives where the device can; the size it has.
    /// fn grow<P: Provider>(srq: &SharedReceiveQueue<'_, P>, want: u32) -> bareverbs::Result<u32> {
    ///     match srq.resize(want) {
    ///         Err(e) if e.kind() == ErrorKind::Unsupported => Ok(srq.attr().max_wr),
    ///         r => r,
    ///     }
    /// }
    ///
    /// let (_machine, ctx) = pvrdma()?;
    /// let pd = ctx.alloc_pd()?;
    /// let srq = pd.create_srq(SrqAttr { max_wr: 16, max_sge: 1, srq_limit: 0 })?;
    /// // QEMU's PVRDMA cannot resize an SRQ: it keeps its size (rxe grows it to 64).
    /// assert_eq!(grow(&srq, 64)?, srq.attr().max_wr);
    /// // Beyond the device is refused before the device is asked, on every device.
    /// let too_many = ctx.caps().max_srq_wr + 1;
    /// assert!(matches!(
    ///     srq.resize(too_many),
    ///     Err(Error::InvalidInput { param: Param::SrqMaxWr, .. }) | Err(Error::Unsupported(_))
    /// ));
    /// # Ok(()) }
    /// ```
    pub fn resize(&self, max_wr: u32) -> Result<u32> {
        self.ctx.provider().resize_srq(&self.raw, max_wr)
    }

    /// The SRQ's attributes now (`ibv_query_srq`): its size, SGEs and armed limit (0 when
    /// not armed), from the device, or from the driver where the device cannot be asked (see
    /// the provider).
    pub fn query(&self) -> Result<SrqAttr> {
        self.ctx.provider().query_srq(&self.raw)
    }

    /// Destroys the SRQ (`ibv_destroy_srq`), handing it back on failure.
    pub fn destroy(self) -> Result<(), (Self, Error)> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `raw` is taken once; `this` is not dropped as a whole, and is rebuilt with
        // the raw SRQ on failure.
        let raw = unsafe { ManuallyDrop::take(&mut this.raw) };
        match this.ctx.provider().destroy_srq(raw) {
            Ok(()) => Ok(()),
            Err((raw, e)) => {
                this.raw = ManuallyDrop::new(raw);
                Err((ManuallyDrop::into_inner(this), e))
            }
        }
    }
}

impl<P: Provider> Drop for SharedReceiveQueue<'_, P> {
    fn drop(&mut self) {
        // SAFETY: `raw` is taken once, here.
        let raw = unsafe { ManuallyDrop::take(&mut self.raw) };
        if let Err((raw, e)) = self.ctx.provider().destroy_srq(raw) {
            crate::error::warn("SRQ not destroyed (", &e, "); its memory is leaked");
            core::mem::forget(raw);
        }
    }
}
