//! Memory regions: DMA memory the driver allocates and registers, that work requests name.

use core::marker::PhantomData;
use core::mem::ManuallyDrop;

use super::{AccessFlags, Context, ProtectionDomain, Provider, Sge};
use crate::error::{Error, Param, Result};

/// A registered memory region (`ibv_mr`) that owns its memory: `len` bytes of DMA memory the
/// device can reach through the region's keys.
///
/// The CPU reaches the bytes through [`as_slice`](Self::as_slice) /
/// [`as_mut_slice`](Self::as_mut_slice). A region moved into a queue pair by a safe post
/// ([`QueuePair::post_send`](super::QueuePair::post_send)) is out of reach until its
/// completion hands it back:
///
/// ```compile_fail
/// # use bareverbs::verbs::*;
/// # fn f<'a, P: Provider>(
/// #     pd: &'a ProtectionDomain<'a, P>,
/// #     mut qp: QueuePair<'a, P, Rc, Rts, 16, 16>,
/// # ) -> bareverbs::Result<()> {
/// let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE)?;
/// mr.as_mut_slice()[..5].copy_from_slice(b"hello");
/// qp.post_send(SendRequest::send(1, mr, 0, 5)).map_err(|(_, e)| e)?;
/// mr.as_mut_slice()[0] = b'j'; // error: `mr` was moved into the queue pair
/// # Ok(()) }
/// ```
pub struct MemoryRegion<'a, P: Provider> {
    ctx: &'a Context<P>,
    raw: ManuallyDrop<P::Mr>,
    _pd: PhantomData<&'a P::Pd>,
}

impl<'c, P: Provider> ProtectionDomain<'c, P> {
    /// Allocates `len` bytes of DMA memory (zeroed) and registers them in this PD with
    /// `access` (`ibv_reg_mr` over driver-allocated memory).
    pub fn register(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion<'_, P>> {
        if len == 0 {
            return Err(Error::invalid(Param::MrLength, 0u64, u64::MAX));
        }
        let ctx = self.context();
        // SAFETY: owned by a MemoryRegion that borrows this PD and the context; destroyed or
        // leaked when it is dropped.
        let raw = unsafe { ctx.provider().create_mr(self.raw(), len, access)? };
        Ok(MemoryRegion {
            ctx,
            raw: ManuallyDrop::new(raw),
            _pd: PhantomData,
        })
    }
}

impl<'a, P: Provider> MemoryRegion<'a, P> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.ctx.provider().mr_info(&self.raw).1
    }

    /// Whether it is empty (never: registration refuses length 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.ctx.provider().mr_info(&self.raw).2
    }

    /// The remote key (what a peer puts in RDMA operations).
    pub fn rkey(&self) -> u32 {
        self.ctx.provider().mr_info(&self.raw).3
    }

    /// The address of the first byte in the region's address space (what SGEs and remote
    /// addresses use).
    pub fn addr(&self) -> u64 {
        self.ctx.provider().mr_info(&self.raw).0
    }

    /// A scatter/gather entry for `len` bytes from `offset`, or an error if that runs past the
    /// region.
    pub fn sge(&self, offset: u32, len: u32) -> Result<Sge> {
        let (addr, size, lkey, _) = self.ctx.provider().mr_info(&self.raw);
        let end = u64::from(offset) + u64::from(len);
        if end > size as u64 {
            return Err(Error::invalid(Param::BufferRange, end, size as u64));
        }
        Ok(Sge {
            addr: addr + u64::from(offset),
            length: len,
            lkey,
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        let ptr = self.ctx.provider().mr_ptr(&self.raw);
        // The device writes these bytes only for work requests that name them: a safe post moves
        // the region into the QP (unreachable here), a raw poster promised not to touch it.
        // SAFETY: the provider's memory is `len()` bytes, allocated while the region exists.
        unsafe { core::slice::from_raw_parts(ptr.as_ptr(), self.len()) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let ptr = self.ctx.provider().mr_ptr(&self.raw);
        // SAFETY: as in `as_slice`; `&mut self` makes the CPU access exclusive.
        unsafe { core::slice::from_raw_parts_mut(ptr.as_ptr(), self.len()) }
    }

    /// The provider's object.
    pub fn raw(&self) -> &P::Mr {
        &self.raw
    }

    /// Deregisters the region (`ibv_dereg_mr`), handing it back on failure.
    pub fn destroy(self) -> Result<(), (Self, Error)> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `raw` is taken once; `this` is not dropped as a whole and is rebuilt with
        // the raw region on failure.
        let raw = unsafe { ManuallyDrop::take(&mut this.raw) };
        match this.ctx.provider().destroy_mr(raw) {
            Ok(()) => Ok(()),
            Err((raw, e)) => {
                this.raw = ManuallyDrop::new(raw);
                Err((ManuallyDrop::into_inner(this), e))
            }
        }
    }
}

impl<P: Provider> Drop for MemoryRegion<'_, P> {
    fn drop(&mut self) {
        // SAFETY: `raw` is taken once, here.
        let raw = unsafe { ManuallyDrop::take(&mut self.raw) };
        if let Err((raw, e)) = self.ctx.provider().destroy_mr(raw) {
            log::warn!("bareverbs: memory region not deregistered ({e}); its memory is leaked");
            core::mem::forget(raw);
        }
    }
}
