//! Shared receive queues (`ibv_create_srq` / `ibv_post_srq_recv` / `ibv_destroy_srq`).

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
