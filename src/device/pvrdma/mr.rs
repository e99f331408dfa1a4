//! Memory regions (CREATE_MR / DESTROY_MR; `docs/pvrdma.md` §5.3, §8.8): a page
//! directory over the region's pages, `start` the address SGEs use.

use core::ptr::NonNull;

use bareverbs_hal::{Hal, PAGE_SIZE};

use super::abi::{self, opcode};
use super::pdir::{self, PageDir};
use super::{Pd, Pvrdma, regs};
use crate::dma::Dma;
use crate::error::{Error, Feature, Object, Op, Param, Result, Unsupported};
use crate::verbs::AccessFlags;

/// A memory region on a PVRDMA device, with the memory it covers when the driver allocated it.
pub struct Mr<H: Hal> {
    handle: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) len: usize,
    /// The region's first address (what SGEs use).
    pub(crate) addr: u64,
    /// Where the CPU reaches it.
    pub(crate) ptr: NonNull<u8>,
    _mem: Option<Dma<H>>,
    _pdir: PageDir<H>,
    pd: NonNull<Pd>,
}

// SAFETY: the region's memory is owned (or, for the embedder's memory, was promised) for as
// long as the region exists; `pd` is only used to count users, atomically.
unsafe impl<H: Hal + Send> Send for Mr<H> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync> Sync for Mr<H> {}

impl<H: Hal> Mr<H> {
    /// The device's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }
}

impl<H: Hal> Pvrdma<H> {
    fn mr_limit(&self, len: usize) -> Result<()> {
        let max = self
            .caps
            .max_mr_size
            .min((pdir::MAX_PAGES * PAGE_SIZE) as u64);
        if len == 0 || len as u64 > max {
            return Err(Error::invalid(Param::MrLength, len as u64, max));
        }
        Ok(())
    }

    /// Registers `len` bytes at `addr` (the region's first address; page `i` of the region at
    /// `pages(i)`), with the memory `mem` if the driver owns it.
    fn register(
        &self,
        pd: &Pd,
        (addr, ptr, len): (u64, NonNull<u8>, usize),
        pdir: PageDir<H>,
        npages: usize,
        mem: Option<Dma<H>>,
        access: AccessFlags,
    ) -> Result<Mr<H>> {
        let op = Op::CreateMr;
        let mut st = self.state.lock();
        st.room_for(Object::Mr, self.caps.max_mr)?;
        let req: &mut abi::CreateMr = st.chan.slot(opcode::CREATE_MR);
        (req.start, req.length, req.pdir_dma) = (addr, len as u64, pdir.paddr());
        (req.pd_handle, req.access_flags) = (pd.handle, pvrdma_access(access));
        req.nchunks = npages as u32;
        if let Err((e, kept)) = st.run_create(&self.regs, Object::Mr, op, opcode::CREATE_MR) {
            if kept {
                // The device may have registered it: its memory is kept, its PD stays busy for
                // good.
                core::mem::forget((mem, pdir));
                pd.users.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
            }
            return Err(e);
        }
        let r: abi::CreateMrResp = st.chan.answer();
        let mr = Mr {
            handle: r.mr_handle,
            lkey: r.lkey,
            rkey: r.rkey,
            len,
            addr,
            ptr,
            _mem: mem,
            _pdir: pdir,
            pd: NonNull::from(pd),
        };
        pd.users.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        drop(st);
        if let Err(e) = check_answer(r.mr_handle, r.lkey) {
            // The device answered success, with values that cannot be right: it may map the
            // memory under some handle, and no destroy can be trusted to name it (QEMU's
            // DESTROY_MR succeeds for any handle). Keep the memory, the table slot and the
            // PD's use, for good.
            self.quarantine(mr);
            return Err(e);
        }
        Ok(mr)
    }

    /// Keeps a region whose outcome is unknown: its memory stays allocated (the device may
    /// use it), it stays counted, and its PD stays in use.
    fn quarantine(&self, mr: Mr<H>) {
        crate::error::warn_msg("a memory region the device answered garbage for is kept");
        core::mem::forget(mr);
    }

    pub(crate) fn create_mr_impl(&self, pd: &Pd, len: usize, access: AccessFlags) -> Result<Mr<H>> {
        self.mr_limit(len)?;
        let pages = len.div_ceil(PAGE_SIZE);
        let mem = Dma::new(&self.hal, pages)?;
        let pdir = PageDir::new(&self.hal, &mem)?;
        let (addr, ptr) = (mem.paddr(), mem.base());
        self.register(pd, (addr, ptr, len), pdir, pages, Some(mem), access)
    }

    pub(crate) fn create_user_mr_impl(
        &self,
        pd: &Pd,
        ptr: NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr<H>> {
        self.mr_limit(len)?;
        let unsupported = Error::Unsupported(Unsupported::Feature(Feature::UserMemory));
        // The device maps whole pages: the region starts at its first page, the SGEs use the
        // CPU's addresses (as user-space verbs do), and QEMU wants a page-aligned start.
        let v = ptr.as_ptr() as usize;
        let first = v & !(PAGE_SIZE - 1);
        let Some(end) = v.checked_add(len) else {
            return Err(Error::invalid(Param::MrLength, len as u64, 0u64));
        };
        let npages = (end - first).div_ceil(PAGE_SIZE);
        if npages > pdir::MAX_PAGES {
            return Err(Error::invalid(Param::MrLength, len as u64, 0u64));
        }
        let phys = |i: usize| {
            let page = NonNull::new((first + i * PAGE_SIZE) as *mut u8)?;
            self.hal
                .virt_to_phys(page)
                .filter(|p| p % PAGE_SIZE as u64 == 0 && *p != 0)
        };
        // Every page must translate before the device hears of any.
        for i in 0..npages {
            phys(i).ok_or(unsupported)?;
        }
        // Cacheable memory on a non-coherent platform: written back and dropped from the caches
        // before the device can reach it (the HAL's "Ordering and coherence").
        self.hal.dma_clean(ptr, len);
        self.hal.dma_invalidate(ptr, len);
        let pdir = PageDir::over(&self.hal, npages, |i| phys(i).unwrap_or(0))?;
        let span = (first as u64, ptr, end - first);
        self.register(pd, span, pdir, npages, None, access)
            .map(|mut mr| {
                // SGEs name the embedder's bytes by their CPU addresses, from `ptr`.
                (mr.addr, mr.len) = (v as u64, len);
                mr
            })
    }

    pub(crate) fn destroy_mr_impl(&self, mr: Mr<H>) -> Result<(), (Mr<H>, Error)> {
        let code = (Op::DestroyMr, opcode::DESTROY_MR);
        let (handle, pd) = (mr.handle, mr.pd);
        if let Err(e) = self
            .state
            .lock()
            .run_destroy(&self.regs, Object::Mr, code, handle)
        {
            return Err((mr, e));
        }
        // SAFETY: the PD outlives its regions (the provider contract of create_mr).
        unsafe { pd.as_ref() }
            .users
            .fetch_sub(1, core::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// Checks a CREATE_MR answer for a mapped (non-DMA) region (§5.3, §8.8): the handle travels
/// in 24-bit fields like every other; the lkey is never 0, which is what a DMA region gets —
/// unless it is the handle itself (QEMU's legacy build keys regions by their handle, and
/// handles start at 0). The rkey is not checked: any 32-bit value is a key somewhere, and
/// QEMU answers 0xFFFFFFFF for every region.
fn check_answer(handle: u32, lkey: u32) -> Result<()> {
    let op = Op::CreateMr;
    if handle > regs::db::HANDLE_MASK {
        return Err(Error::bad_value(op, &"mr_handle", handle));
    }
    if lkey == 0 && handle != 0 {
        return Err(Error::bad_value(op, &"lkey", lkey));
    }
    Ok(())
}

/// PVRDMA's access bits (L-VRB `enum pvrdma_access_flags`).
/// Access flags from PVRDMA's bits (a device's value: bits it does not define are ignored).
pub(crate) fn access_from_pvrdma(bits: u32) -> AccessFlags {
    // PVRDMA numbers the five flags as ibverbs does (`pvrdma_access`).
    AccessFlags::from_bits_truncate(bits & 0x1F)
}

pub(crate) fn pvrdma_access(a: AccessFlags) -> u32 {
    const MAP: [(AccessFlags, u32); 5] = [
        (AccessFlags::LOCAL_WRITE, 1 << 0),
        (AccessFlags::REMOTE_WRITE, 1 << 1),
        (AccessFlags::REMOTE_READ, 1 << 2),
        (AccessFlags::REMOTE_ATOMIC, 1 << 3),
        (AccessFlags::MW_BIND, 1 << 4),
    ];
    MAP.iter()
        .filter(|(f, _)| a.contains(*f))
        .fold(0, |acc, (_, b)| acc | b)
}
