//! Memory regions: DMA memory the driver allocates and registers, that work requests name.

use core::marker::PhantomData;
use core::mem::ManuallyDrop;

use super::{AccessFlags, Context, ProtectionDomain, Provider, Sge};
use crate::error::{Attr, Error, Op, Param, Result};

/// A registered memory region (`ibv_mr`) that owns its memory: `len` bytes of DMA memory the
/// device can reach through the region's keys.
///
/// The CPU reaches the bytes through [`as_slice`](Self::as_slice) /
/// [`as_mut_slice`](Self::as_mut_slice) (regions over the embedder's memory: through that
/// memory). Work requests name them by [`sge`](Self::sge) on the raw path; the safe path uses
/// a [`BufferPool`](super::BufferPool), whose buffers move into a queue pair when posted, so
/// no code can touch a buffer the device may be using until its completion hands it back:
///
/// ```compile_fail,E0382
/// # use bareverbs::verbs::*;
/// # fn f<'a, P: Provider>(
/// #     pool: &'a BufferPool<'a, P>,
/// #     mut qp: QueuePair<'a, P, Rc, Rts>,
/// # ) -> bareverbs::Result<()> {
/// let mut buf = pool.alloc().expect("a free buffer");
/// buf.as_mut_slice()[..5].copy_from_slice(b"hello");
/// qp.post_send(1, buf)?;
/// buf.as_mut_slice()[0] = b'j'; // error: `buf` was moved into the queue pair
/// # Ok(()) }
/// ```
pub struct MemoryRegion<'a, P: Provider> {
    pub(super) ctx: &'a Context<P>,
    raw: ManuallyDrop<P::Mr>,
    _pd: PhantomData<&'a P::Pd>,
}

/// Its length and keys: what `unwrap` and `expect` print of a hand-back
/// (`Err((mr, error))`) besides the error.
impl<P: Provider> core::fmt::Debug for MemoryRegion<'_, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .finish()
    }
}

/// ib_core's rule for every memory registration (EINVAL there): memory that peers may write,
/// or use atomically, must be locally writable too.
fn check_access(access: AccessFlags) -> Result<()> {
    let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if access.intersects(remote) && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(Error::MissingAttribute {
            op: Op::CreateMr,
            attr: Attr::LocalWrite,
        });
    }
    Ok(())
}

impl<'c, P: Provider> ProtectionDomain<'c, P> {
    /// Allocates `len` bytes of DMA memory (zeroed) and registers them in this PD with
    /// `access` (`ibv_reg_mr` over driver-allocated memory).
    ///
    /// # Example
    ///
    /// ```
    /// # include!("../doctests.rs");
    /// # fn main() -> bareverbs::Result<()> {
    /// use bareverbs::verbs::AccessFlags;
    /// let (_machine, ctx) = pvrdma()?;
    /// let pd = ctx.alloc_pd()?;
    /// let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    /// let mut mr = pd.register(8192, access)?;
    /// mr.as_mut_slice()[..4].copy_from_slice(b"data");
    /// let sge = mr.sge(0, 4)?; // what a raw work request names
    /// assert_eq!((sge.addr, sge.length, sge.lkey), (mr.addr(), 4, mr.lkey()));
    /// assert!(mr.sge(8190, 4).is_err(), "outside the region");
    /// // A peer may read it: it needs `rkey` and `addr` (sent to it out of band).
    /// let _for_the_peer = (mr.rkey(), mr.addr());
    /// # Ok(()) }
    /// ```
    pub fn register(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion<'_, P>> {
        if len == 0 {
            return Err(Error::invalid(Param::MrLength, 0u64, u64::MAX));
        }
        check_access(access)?;
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

impl<'c, P: Provider> ProtectionDomain<'c, P> {
    /// Registers memory the embedder owns for as long as the program runs (zero-copy), with
    /// `access`; SGEs name it by its CPU addresses ([`MemoryRegion::addr`] is `buf`'s). The
    /// HAL translates each page ([`Hal::virt_to_phys`](crate::hal::Hal::virt_to_phys)).
    ///
    /// # Errors
    ///
    /// [`Unsupported`](crate::Error::Unsupported) for
    /// [`Feature::UserMemory`](crate::error::Feature::UserMemory) when the HAL cannot translate
    /// a page (the device model translates only its own memory:
    /// `Model::alloc_user_memory` hands some out).
    ///
    /// # Example
    ///
    /// ```
    /// # include!("../doctests.rs");
    /// # fn main() -> bareverbs::Result<()> {
    /// use bareverbs::verbs::AccessFlags;
    /// let (machine, ctx) = pvrdma()?;
    /// let pd = ctx.alloc_pd()?;
    /// // On a machine: a `static mut` buffer, or memory the embedder's allocator leaked.
    /// let buf: &'static mut [u8] = machine.alloc_user_memory(4096).leak();
    /// buf[..2].copy_from_slice(b"hi");
    /// let addr = buf.as_ptr() as u64;
    /// let mr = pd.register_static(buf, AccessFlags::LOCAL_WRITE)?;
    /// assert_eq!(mr.addr(), addr); // SGEs name the memory by its CPU address
    /// assert_eq!(&mr.as_slice()[..2], b"hi");
    /// # Ok(()) }
    /// ```
    pub fn register_static(
        &self,
        buf: &'static mut [u8],
        access: AccessFlags,
    ) -> Result<MemoryRegion<'_, P>> {
        let Some(ptr) = core::ptr::NonNull::new(buf.as_mut_ptr()) else {
            return Err(Error::invalid(Param::MrLength, 0u64, u64::MAX));
        };
        // SAFETY: the memory is `'static` and exclusively ours (the `&mut` is given up here
        // for good): it outlives the region and nothing else uses it.
        unsafe { self.register_user(ptr, buf.len(), access) }
    }

    /// Registers `len` bytes of the embedder's memory at `addr` with `access`
    /// (`ibv_reg_mr`); SGEs name it by its CPU addresses.
    ///
    /// # Safety
    ///
    /// The memory stays allocated and is not reached by the CPU in ways that race with the
    /// device (no access to bytes a posted work request names until its completion) until the
    /// region is destroyed; [`MemoryRegion::as_slice`] must not be used while such a request
    /// is outstanding.
    ///
    /// # Errors
    ///
    /// As [`register_static`](Self::register_static).
    ///
    /// # Example
    ///
    /// ```
    /// # include!("../doctests.rs");
    /// # fn main() -> bareverbs::Result<()> {
    /// use bareverbs::verbs::AccessFlags;
    /// use bareverbs::error::{Error, Feature, Unsupported};
    /// let (machine, ctx) = pvrdma()?;
    /// let pd = ctx.alloc_pd()?;
    /// let mem = machine.alloc_user_memory(10_000); // memory the model's HAL translates
    /// // SAFETY: `mem` outlives the region (dropped after it); the CPU leaves it alone while
    /// // requests naming it are outstanding.
    /// let mr = unsafe { pd.register_user(mem.as_ptr(), mem.len(), AccessFlags::LOCAL_WRITE)? };
    /// assert_eq!(mr.len(), 10_000);
    /// drop(mr);
    /// drop(mem);
    ///
    /// // Memory the HAL cannot translate (here: the test program's heap) is refused.
    /// let mut own = vec![0u8; 4096];
    /// let ptr = core::ptr::NonNull::new(own.as_mut_ptr()).unwrap();
    /// // SAFETY: as above (and the registration fails).
    /// let e = unsafe { pd.register_user(ptr, own.len(), AccessFlags::LOCAL_WRITE) }.err();
    /// assert_eq!(e, Some(Error::Unsupported(Unsupported::Feature(Feature::UserMemory))));
    /// # Ok(()) }
    /// ```
    pub unsafe fn register_user(
        &self,
        addr: core::ptr::NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion<'_, P>> {
        if len == 0 {
            return Err(Error::invalid(Param::MrLength, 0u64, u64::MAX));
        }
        check_access(access)?;
        let ctx = self.context();
        // SAFETY: the caller's contract covers the memory; the region is owned by a
        // MemoryRegion borrowing this PD and is destroyed or leaked when that is dropped.
        let raw = unsafe {
            ctx.provider()
                .create_user_mr(self.raw(), addr, len, access)?
        };
        Ok(MemoryRegion {
            ctx,
            raw: ManuallyDrop::new(raw),
            _pd: PhantomData,
        })
    }
}

impl<'a, P: Provider> MemoryRegion<'a, P> {
    /// Changes the region's access rights in place (`ibv_rereg_mr` with
    /// `IBV_REREG_MR_CHANGE_ACCESS`); its keys, bounds and PD stay. Requests already posted
    /// or in flight may see either rights.
    ///
    /// # Errors
    ///
    /// [`Error::MissingAttribute`] with [`Attr::LocalWrite`] as for a registration; a typed
    /// [`Unsupported`](crate::error::Unsupported) on a device that cannot
    /// ([`Feature::ReregMr`](crate::error::Feature::ReregMr)).
    pub fn rereg_access(&mut self, access: AccessFlags) -> Result<()> {
        check_access(access)?;
        self.ctx.provider().rereg_mr_access(&mut self.raw, access)
    }

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
            let leaked = "); its memory is leaked";
            crate::error::warn("memory region not deregistered (", &e, leaked);
            core::mem::forget(raw);
        }
    }
}
