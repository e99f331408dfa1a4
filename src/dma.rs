//! DMA memory owned by the driver: an RAII owner over a [`Hal`] block, with volatile and atomic
//! accessors for memory the device reads and writes.

use core::ptr::NonNull;

use bareverbs_hal::{DmaBlock, Hal, PAGE_SIZE};

use crate::error::{Error, Resource, Result};

/// Plain old data: a type that every bit pattern inhabits, without padding that matters, so it
/// can be copied to and from device memory.
///
/// # Safety
///
/// Implementers are `#[repr(C)]` (or primitive) types made only of integers and arrays of
/// integers, valid for every bit pattern.
pub(crate) unsafe trait Pod: Copy {}

macro_rules! pod {
    ($($t:ty),* $(,)?) => { $(
        // SAFETY: the type is an integer, an integer array, or a #[repr(C)] struct of them.
        unsafe impl $crate::dma::Pod for $t {}
    )* };
}
pub(crate) use pod;
pod!(u8, u16, u32, u64, [u8; 16]);

/// Physically contiguous, zeroed DMA pages, returned to the HAL on drop.
pub(crate) struct Dma<H: Hal> {
    hal: H,
    paddr: u64,
    vaddr: NonNull<u8>,
    pages: usize,
}

// SAFETY: the memory is owned exclusively by this value (the HAL hands a block out once); the
// handle `H` is itself Send when the HAL is.
unsafe impl<H: Hal + Send> Send for Dma<H> {}
// SAFETY: shared access only performs volatile or atomic accesses of Pod values.
unsafe impl<H: Hal + Sync> Sync for Dma<H> {}

impl<H: Hal> Dma<H> {
    /// Allocates `pages` zeroed pages.
    pub(crate) fn new(hal: &H, pages: usize) -> Result<Self> {
        let block = hal
            .dma_alloc(pages)
            .map_err(|_| Error::Resource(Resource::Dma { pages }))?;
        if block.pages != pages || block.paddr == 0 || !block.paddr.is_multiple_of(PAGE_SIZE as u64)
        {
            // A HAL that breaks its contract: hand the block back and refuse it.
            // SAFETY: the block came from this HAL and is returned once, untouched.
            unsafe { hal.dma_dealloc(block) };
            return Err(Error::Resource(Resource::Dma { pages }));
        }
        Ok(Dma {
            hal: hal.clone(),
            paddr: block.paddr,
            vaddr: block.vaddr,
            pages,
        })
    }

    /// Physical address of the first page.
    pub(crate) fn paddr(&self) -> u64 {
        self.paddr
    }

    /// Physical address of page `i`.
    pub(crate) fn page_paddr(&self, i: usize) -> u64 {
        debug_assert!(i < self.pages);
        self.paddr + (i * PAGE_SIZE) as u64
    }

    /// The HAL the memory came from (for its barriers: [`Hal::publish_barrier`]).
    pub(crate) fn hal(&self) -> &H {
        &self.hal
    }

    /// Length in pages.
    pub(crate) fn pages(&self) -> usize {
        self.pages
    }

    /// Where the CPU reaches the first byte. Accesses through it are the caller's to bound.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.vaddr
    }

    fn ptr<T>(&self, offset: usize) -> *mut T {
        // Offsets are computed by the driver from validated sizes, never taken from the device:
        // a violation is a driver bug.
        assert!(
            offset + size_of::<T>() <= self.pages * PAGE_SIZE,
            "DMA access out of bounds"
        );
        debug_assert!(offset.is_multiple_of(align_of::<T>()));
        // SAFETY: checked just above to lie inside the allocation.
        unsafe { self.vaddr.as_ptr().add(offset).cast() }
    }

    /// Reads a `T` at byte `offset` (volatile: the device may have written it).
    pub(crate) fn read<T: Pod>(&self, offset: usize) -> T {
        // SAFETY: in bounds and aligned (checked by `ptr`); T is Pod so any bytes are valid.
        unsafe { self.ptr::<T>(offset).read_volatile() }
    }

    /// Writes a `T` at byte `offset` (volatile: the device will read it).
    pub(crate) fn write<T: Pod>(&self, offset: usize, value: T) {
        // SAFETY: in bounds and aligned (checked by `ptr`); the memory is ours, and concurrent
        // device reads of plain memory are what DMA memory is for.
        unsafe { self.ptr::<T>(offset).write_volatile(value) }
    }

    /// Reads a `T` at byte `offset` through one out-of-line volatile byte copy (a message the
    /// device wrote: no plain load races with it, and the copy is compiled once, not per `T`).
    pub(crate) fn get<T: Pod>(&self, offset: usize) -> T {
        let mut out = core::mem::MaybeUninit::<T>::uninit();
        self.copy_out(offset, out.as_mut_ptr().cast(), size_of::<T>());
        // SAFETY: every byte of `out` was written by `copy_out`; T is Pod, valid for any bytes.
        unsafe { out.assume_init() }
    }

    #[inline(never)]
    fn copy_out(&self, offset: usize, dst: *mut u8, len: usize) {
        let src = self.ptr::<u8>(offset);
        assert!(
            offset + len <= self.pages * PAGE_SIZE,
            "DMA access out of bounds"
        );
        for i in 0..len {
            // SAFETY: the source range was checked to lie inside the allocation; `dst` is the
            // caller's `len`-byte buffer.
            unsafe { dst.add(i).write(src.add(i).read_volatile()) }
        }
    }

    /// Zeroes `len` bytes from `offset`.
    pub(crate) fn zero(&self, offset: usize, len: usize) {
        let p = self.ptr::<u8>(offset);
        assert!(
            offset + len <= self.pages * PAGE_SIZE,
            "DMA access out of bounds"
        );
        // SAFETY: the range was checked to lie inside the allocation.
        unsafe { core::ptr::write_bytes(p, 0, len) }
    }
}

impl<H: Hal> Drop for Dma<H> {
    fn drop(&mut self) {
        let block = DmaBlock {
            paddr: self.paddr,
            vaddr: self.vaddr,
            pages: self.pages,
        };
        // SAFETY: the block came from this HAL in `new` and is returned exactly once; owners
        // drop their Dma only after the device was told to stop using it.
        unsafe { self.hal.dma_dealloc(block) }
    }
}
