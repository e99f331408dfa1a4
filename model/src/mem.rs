//! The machine's DMA memory: page-aligned host allocations with "physical" addresses.
//!
//! Each block is allocated with a guard page on either side, filled with a pattern: a driver
//! that writes just outside the memory it owns damages a guard, which is checked when the
//! block is freed and by [`Memory::check_guards`]. (Physical addresses have an unallocated page
//! between blocks too, so the device side never finds two blocks contiguous by accident.)

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::ptr::NonNull;

use bareverbs_hal::{DmaBlock, DmaError};

const PAGE: usize = 4096;
/// Physical addresses start above 4 GiB, so DSRHIGH and every high half matter.
const PHYS_BASE: u64 = 0x1_0000_0000;
/// What guard pages hold.
const GUARD: u8 = 0xC7;
/// An intact guard page, to compare with (one memcmp, fast even unoptimized).
static GUARD_PAGE: [u8; PAGE] = [GUARD; PAGE];

struct Block {
    /// The host allocation.
    raw: NonNull<u8>,
    /// The first byte handed out: page-aligned, one guard page into the allocation.
    ptr: NonNull<u8>,
    pages: usize,
}

impl Block {
    /// The block, its guard pages, and room to align: with a small alignment the allocator
    /// zeroes through calloc, so large blocks come as lazily zeroed pages (a page-aligned
    /// layout would be memset in full, whatever its size).
    fn layout(pages: usize) -> Layout {
        Layout::from_size_align((pages + 3) * PAGE, 16).expect("layout")
    }

    /// Both guard pages, as slices.
    fn guards(&self) -> [&[u8]; 2] {
        // SAFETY: the guard pages lie inside the allocation, before and after the block; the
        // driver has no business writing them (that is what is being checked).
        unsafe {
            [
                std::slice::from_raw_parts(self.ptr.as_ptr().sub(PAGE), PAGE),
                std::slice::from_raw_parts(self.ptr.as_ptr().add(self.pages * PAGE), PAGE),
            ]
        }
    }

    /// A message if a guard page was written.
    fn damage(&self, paddr: u64) -> Option<String> {
        let [before, after] = self.guards();
        let bad = |g: &[u8]| {
            (g != GUARD_PAGE.as_slice())
                .then(|| g.iter().position(|&b| b != GUARD))
                .flatten()
        };
        match (bad(before), bad(after)) {
            (None, None) => None,
            (b, a) => Some(format!(
                "the driver wrote outside DMA block {paddr:#x} (+{} pages): {}",
                self.pages,
                match (b, a) {
                    (Some(i), _) => format!("{} bytes before its start", PAGE - i),
                    (_, Some(i)) => format!("{i} bytes past its end"),
                    _ => unreachable!(),
                }
            )),
        }
    }
}

pub(crate) struct Memory {
    blocks: BTreeMap<u64, Block>,
    /// The two blocks found last (start, end, host pointer): page directories are read entry
    /// by entry, alternating between the table's block and the data's.
    last: [Cell<(u64, u64, *mut u8)>; 2],
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
            last: [const { Cell::new((0, 0, std::ptr::null_mut())) }; 2],
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
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(Block::layout(pages)) };
        let raw = NonNull::new(raw).expect("host out of memory");
        // SAFETY: from the first page boundary, the allocation holds the guard page, the block,
        // and the guard page.
        let ptr = unsafe {
            let guard = raw.add(raw.as_ptr().align_offset(PAGE));
            let end = guard.as_ptr().add((pages + 1) * PAGE);
            std::ptr::copy_nonoverlapping(GUARD_PAGE.as_ptr(), guard.as_ptr(), PAGE);
            std::ptr::copy_nonoverlapping(GUARD_PAGE.as_ptr(), end, PAGE);
            guard.add(PAGE)
        };
        let paddr = self.next;
        // One unallocated guard page between blocks: nothing is contiguous by accident.
        self.next += ((pages + 1) * PAGE) as u64;
        self.blocks.insert(paddr, Block { raw, ptr, pages });
        Ok(DmaBlock {
            paddr,
            vaddr: ptr,
            pages,
        })
    }

    /// Frees a block; an error names a block that was not allocated as such, or a damaged guard.
    pub(crate) fn free(&mut self, block: DmaBlock) -> Result<(), String> {
        match self.blocks.get(&block.paddr) {
            Some(b) if b.pages == block.pages && b.ptr == block.vaddr => {
                let b = self.blocks.remove(&block.paddr).expect("present");
                for last in &self.last {
                    last.set((0, 0, std::ptr::null_mut()));
                }
                let damage = b.damage(block.paddr);
                // SAFETY: allocated in `alloc` with this layout, removed from the map once.
                unsafe { dealloc(b.raw.as_ptr(), Block::layout(b.pages)) };
                damage.map_or(Ok(()), Err)
            }
            _ => Err(format!(
                "freed a DMA block that was not allocated as such: {:#x} (+{} pages)",
                block.paddr, block.pages
            )),
        }
    }

    /// A message for each live block whose guard pages were written.
    pub(crate) fn check_guards(&self) -> Vec<String> {
        self.blocks
            .iter()
            .filter_map(|(&pa, b)| b.damage(pa))
            .collect()
    }

    /// A host pointer to `len` bytes at `pa`, if they lie inside one allocated block.
    fn ptr(&self, pa: u64, len: usize) -> Option<*mut u8> {
        for last in &self.last {
            let (start, end, p) = last.get();
            if end > start && pa >= start && (pa - start).checked_add(len as u64)? <= end - start {
                // SAFETY: inside a block found recently, still allocated (`free` forgets them).
                return Some(unsafe { p.add((pa - start) as usize) });
            }
        }
        let (&base, b) = self.blocks.range(..=pa).next_back()?;
        let off = usize::try_from(pa - base).ok()?;
        let size = b.pages * PAGE;
        self.last[1].set(self.last[0].get());
        self.last[0].set((base, base + size as u64, b.ptr.as_ptr()));
        (off.checked_add(len)? <= size)
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

    /// Whether `len` bytes at `pa` lie inside one allocated block.
    pub(crate) fn contains(&self, pa: u64, len: usize) -> bool {
        self.ptr(pa, len).is_some()
    }

    /// The little-endian u64 at `pa` (no allocation: page directories are read a lot).
    pub(crate) fn read_u64(&self, pa: u64) -> Option<u64> {
        let p = self.ptr(pa, 8)?;
        // SAFETY: `ptr` checked the range; unaligned is fine.
        Some(u64::from_le(unsafe { p.cast::<u64>().read_unaligned() }))
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
            // SAFETY: allocated in `alloc` with this layout; freed once, here.
            unsafe { dealloc(b.raw.as_ptr(), Block::layout(b.pages)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_just_outside_a_block_are_caught() {
        let mut m = Memory::new(16);
        let b = m.alloc(2).unwrap();
        assert!(m.check_guards().is_empty());
        // SAFETY: the guard page after the block is part of the host allocation.
        unsafe { b.vaddr.as_ptr().add(2 * PAGE + 3).write(0) };
        let damage = m.check_guards();
        assert_eq!(damage.len(), 1);
        assert!(damage[0].contains("3 bytes past its end"), "{damage:?}");
        assert!(m.free(b).is_err(), "freeing reports it too");

        let b = m.alloc(1).unwrap();
        // SAFETY: the guard page before the block is part of the host allocation.
        unsafe { b.vaddr.as_ptr().sub(1).write(0) };
        assert!(m.free(b).unwrap_err().contains("1 bytes before its start"));
    }
}
