//! The machine's DMA memory: page-aligned host allocations with "physical" addresses.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::BTreeMap;
use std::ptr::NonNull;

use bareverbs_hal::{DmaBlock, DmaError};

const PAGE: usize = 4096;
/// Physical addresses start above 4 GiB, so DSRHIGH and every high half matter.
const PHYS_BASE: u64 = 0x1_0000_0000;

struct Block {
    ptr: NonNull<u8>,
    pages: usize,
}

pub(crate) struct Memory {
    blocks: BTreeMap<u64, Block>,
    next: u64,
    limit_pages: usize,
    pub(crate) allocs: u64,
    fail_at: Option<u64>,
}

// SAFETY: the blocks are plain heap memory owned by this value; the pointers are only used
// under the model's mutex (and by the driver, which owns the block it was handed).
unsafe impl Send for Memory {}

impl Memory {
    pub(crate) fn new(limit_pages: usize) -> Self {
        Memory {
            blocks: BTreeMap::new(),
            next: PHYS_BASE,
            limit_pages,
            allocs: 0,
            fail_at: None,
        }
    }

    pub(crate) fn outstanding_pages(&self) -> usize {
        self.blocks.values().map(|b| b.pages).sum()
    }

    pub(crate) fn fail_nth(&mut self, nth: u64) {
        self.fail_at = Some(self.allocs + nth);
    }

    pub(crate) fn alloc(&mut self, pages: usize) -> Result<DmaBlock, DmaError> {
        if pages == 0 {
            return Err(DmaError::ZeroSize);
        }
        self.allocs += 1;
        if self.fail_at == Some(self.allocs) || self.outstanding_pages() + pages > self.limit_pages
        {
            return Err(DmaError::Exhausted { requested: pages });
        }
        let layout = Layout::from_size_align(pages * PAGE, PAGE).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).expect("host out of memory");
        let paddr = self.next;
        // One unallocated guard page between blocks: nothing is contiguous by accident.
        self.next += ((pages + 1) * PAGE) as u64;
        self.blocks.insert(paddr, Block { ptr, pages });
        Ok(DmaBlock {
            paddr,
            vaddr: ptr,
            pages,
        })
    }

    pub(crate) fn free(&mut self, block: DmaBlock) -> Result<(), String> {
        match self.blocks.get(&block.paddr) {
            Some(b) if b.pages == block.pages && b.ptr == block.vaddr => {
                let b = self.blocks.remove(&block.paddr).expect("present");
                let layout = Layout::from_size_align(b.pages * PAGE, PAGE).expect("layout");
                // SAFETY: allocated in `alloc` with this layout, removed from the map once.
                unsafe { dealloc(b.ptr.as_ptr(), layout) };
                Ok(())
            }
            _ => Err(format!(
                "freed a DMA block that was not allocated as such: {:#x} (+{} pages)",
                block.paddr, block.pages
            )),
        }
    }

    /// A host pointer to `len` bytes at `pa`, if they lie inside one allocated block.
    fn ptr(&self, pa: u64, len: usize) -> Option<*mut u8> {
        let (&base, b) = self.blocks.range(..=pa).next_back()?;
        let off = (pa - base) as usize;
        (off + len <= b.pages * PAGE)
            // SAFETY: off + len lies inside the block.
            .then(|| unsafe { b.ptr.as_ptr().add(off) })
    }

    /// The "physical" address of a host pointer inside an allocated block.
    pub(crate) fn virt_to_phys(&self, v: *const u8) -> Option<u64> {
        self.blocks.iter().find_map(|(&pa, b)| {
            let base = b.ptr.as_ptr() as usize;
            let v = v as usize;
            (base..base + b.pages * PAGE)
                .contains(&v)
                .then(|| pa + (v - base) as u64)
        })
    }

    pub(crate) fn read(&self, pa: u64, len: usize) -> Option<Vec<u8>> {
        let p = self.ptr(pa, len)?;
        let mut v = vec![0u8; len];
        // SAFETY: `ptr` checked the range; the driver may write it concurrently only through
        // volatile accesses, and the test is single-threaded against the model.
        unsafe { std::ptr::copy_nonoverlapping(p, v.as_mut_ptr(), len) };
        Some(v)
    }

    pub(crate) fn write(&mut self, pa: u64, bytes: &[u8]) -> bool {
        match self.ptr(pa, bytes.len()) {
            Some(p) => {
                // SAFETY: `ptr` checked the range.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
                true
            }
            None => false,
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        for (_, b) in std::mem::take(&mut self.blocks) {
            let layout = Layout::from_size_align(b.pages * PAGE, PAGE).expect("layout");
            // SAFETY: allocated in `alloc` with this layout; freed once, here.
            unsafe { dealloc(b.ptr.as_ptr(), layout) };
        }
    }
}
