//! A page allocator over memory the embedder hands over, and the identity-mapped HAL built on it.

use core::ptr::NonNull;

use crate::{DmaBlock, DmaError, Hal, Mmio, PAGE_SIZE};

/// How many pages one [`DmaRegion`] manages at most (a fixed bitmap, no heap): 128 MiB.
pub const MAX_REGION_PAGES: usize = BITMAP_WORDS * 64;
const BITMAP_WORDS: usize = 512;

/// A first-fit page allocator over one physically contiguous memory range.
///
/// Keeps a fixed-size bitmap (one bit a page, no heap) behind a spin lock, so a `&DmaRegion`
/// can be shared by every object of a driver. Allocations are zero-filled.
pub struct DmaRegion {
    paddr: u64,
    vaddr: NonNull<u8>,
    pages: usize,
    used: spin::Mutex<[u64; BITMAP_WORDS]>,
}

// SAFETY: the region's memory is only reached through allocations that the bitmap (behind a
// lock) hands out exclusively; the raw pointer is never dereferenced without owning the page.
unsafe impl Send for DmaRegion {}
// SAFETY: as above; all mutation of shared state goes through the spin lock.
unsafe impl Sync for DmaRegion {}

impl DmaRegion {
    /// Takes over `pages` pages starting at physical address `paddr`, reachable by the CPU at
    /// `vaddr`. Pages beyond [`MAX_REGION_PAGES`] are ignored.
    ///
    /// # Safety
    ///
    /// `paddr` and `vaddr` are page-aligned, `paddr` is not 0, and the range is normal RAM that
    /// devices reach by DMA at `paddr` and the CPU reaches at `vaddr`, that nothing else uses for
    /// as long as the region (and every block allocated from it) lives.
    pub unsafe fn new(paddr: u64, vaddr: NonNull<u8>, pages: usize) -> Self {
        DmaRegion {
            paddr,
            vaddr,
            pages: pages.min(MAX_REGION_PAGES),
            used: spin::Mutex::new([0; BITMAP_WORDS]),
        }
    }

    /// Pages managed.
    pub fn total_pages(&self) -> usize {
        self.pages
    }

    /// Pages not allocated now.
    pub fn free_pages(&self) -> usize {
        let used = self.used.lock();
        self.pages - used.iter().map(|w| w.count_ones() as usize).sum::<usize>()
    }

    /// Allocates `pages` contiguous zeroed pages (first fit).
    pub fn alloc(&self, pages: usize) -> Result<DmaBlock, DmaError> {
        if pages == 0 {
            return Err(DmaError::ZeroSize);
        }
        let mut used = self.used.lock();
        let is_used = |used: &[u64; BITMAP_WORDS], i: usize| used[i / 64] & (1 << (i % 64)) != 0;
        let mut start = 0;
        while start + pages <= self.pages {
            match (start..start + pages).rev().find(|&i| is_used(&used, i)) {
                // Skip past the last used page inside the window.
                Some(busy) => start = busy + 1,
                None => {
                    for i in start..start + pages {
                        used[i / 64] |= 1 << (i % 64);
                    }
                    drop(used);
                    let offset = start * PAGE_SIZE;
                    // SAFETY: `offset` lies inside the region (start + pages <= self.pages), so
                    // the pointer stays within the memory handed over in `new`.
                    let vaddr = unsafe { self.vaddr.add(offset) };
                    // SAFETY: the pages were just marked used, so nothing else touches them; the
                    // range is inside the region and writable per `new`'s contract.
                    unsafe { core::ptr::write_bytes(vaddr.as_ptr(), 0, pages * PAGE_SIZE) };
                    return Ok(DmaBlock {
                        paddr: self.paddr + offset as u64,
                        vaddr,
                        pages,
                    });
                }
            }
        }
        Err(DmaError::Exhausted { requested: pages })
    }

    /// Returns a block. Blocks that do not belong to this region are ignored.
    ///
    /// # Safety
    ///
    /// `block` came from [`alloc`](Self::alloc) of this region, is returned once, and is no
    /// longer accessed by the CPU or any device.
    pub unsafe fn dealloc(&self, block: DmaBlock) {
        let Some(first) = block
            .paddr
            .checked_sub(self.paddr)
            .map(|o| o as usize / PAGE_SIZE)
        else {
            return;
        };
        let mut used = self.used.lock();
        for i in first..(first + block.pages).min(self.pages) {
            used[i / 64] &= !(1 << (i % 64));
        }
    }
}

/// A [`Hal`] for an identity-style mapping: DMA from a [`DmaRegion`], and device registers
/// reached at `physical address + phys_offset` (0 for an identity map).
#[derive(Clone, Copy)]
pub struct IdentityHal<'a> {
    dma: &'a DmaRegion,
    phys_offset: usize,
    /// MSI routing, packed to keep the handle small (the driver clones it into every object
    /// that owns DMA memory): message address << 32 | data of vector 0; 0 for none.
    msi: u64,
}

impl<'a> IdentityHal<'a> {
    /// A HAL that allocates from `dma` and maps MMIO at `paddr + phys_offset`.
    ///
    /// # Safety
    ///
    /// Every physical MMIO address the driver will map (the device's BARs) is mapped, uncached,
    /// at `paddr + phys_offset` in the current address space for as long as the HAL is used;
    /// and RAM the embedder registers (outside `dma`) is mapped the same way: the CPU reaches
    /// physical address `p` at `p + phys_offset`.
    pub unsafe fn new(dma: &'a DmaRegion, phys_offset: usize) -> Self {
        IdentityHal {
            dma,
            phys_offset,
            msi: 0,
        }
    }

    /// The same HAL, routing device interrupt vector `v` as the message (`address`,
    /// `first_data + v`): on x86 `address` is `0xFEE0_0000 | apic_id << 12` (a 32-bit
    /// address: x86's xAPIC window) and `first_data` the CPU vector the device's vector 0
    /// arrives at (its vectors then follow). An `address` of 0 routes nothing.
    pub fn with_msi(mut self, address: u32, first_data: u32) -> Self {
        self.msi = u64::from(address) << 32 | u64::from(first_data);
        self
    }

    /// The DMA region this HAL allocates from.
    pub fn region(&self) -> &'a DmaRegion {
        self.dma
    }
}

// SAFETY: DMA blocks come from a DmaRegion, whose contract (set by the embedder in
// `DmaRegion::new`) gives zeroed, contiguous, device-reachable pages handed out once; MMIO is
// reached uncached per `IdentityHal::new`'s contract.
unsafe impl Hal for IdentityHal<'_> {
    type Mmio = MmioRegion;

    fn dma_alloc(&self, pages: usize) -> Result<DmaBlock, DmaError> {
        self.dma.alloc(pages)
    }

    unsafe fn dma_dealloc(&self, block: DmaBlock) {
        // SAFETY: forwarded from our caller, who returns a block of this region once.
        unsafe { self.dma.dealloc(block) }
    }

    unsafe fn map_mmio(&self, paddr: u64, size: usize) -> Option<MmioRegion> {
        let vaddr = usize::try_from(paddr).ok()?.checked_add(self.phys_offset)?;
        let base = NonNull::new(vaddr as *mut u32)?;
        // SAFETY: the caller promises a real register window; `IdentityHal::new`'s contract
        // promises it is mapped uncached at this address.
        Some(unsafe { MmioRegion::new(base, size) })
    }

    fn virt_to_phys(&self, vaddr: NonNull<u8>) -> Option<u64> {
        let v = vaddr.as_ptr() as usize;
        let base = self.dma.vaddr.as_ptr() as usize;
        if (base..base + self.dma.pages * PAGE_SIZE).contains(&v) {
            return Some(self.dma.paddr + (v - base) as u64);
        }
        v.checked_sub(self.phys_offset)
            .filter(|&p| p != 0)
            .map(|p| p as u64)
    }

    fn msi_message(&self, vector: u16) -> Option<crate::MsiMessage> {
        let address = self.msi >> 32;
        if address == 0 {
            return None;
        }
        Some(crate::MsiMessage {
            address,
            data: (self.msi as u32).checked_add(u32::from(vector))?,
        })
    }
}

/// A register window reached with volatile 32-bit accesses.
pub struct MmioRegion {
    base: NonNull<u32>,
    size: usize,
}

// SAFETY: MMIO registers have no thread affinity; the driver serialises what needs it.
unsafe impl Send for MmioRegion {}
// SAFETY: each access is a single volatile 32-bit load or store, which the hardware serialises.
unsafe impl Sync for MmioRegion {}

impl MmioRegion {
    /// A window of `size` bytes at `base`.
    ///
    /// # Safety
    ///
    /// `base..base + size` is mapped device memory (uncached) for as long as the value lives,
    /// and `base` is 4-byte aligned.
    pub unsafe fn new(base: NonNull<u32>, size: usize) -> Self {
        MmioRegion { base, size }
    }

    fn slot(&self, offset: usize) -> Option<*mut u32> {
        (offset.is_multiple_of(4) && offset.checked_add(4)? <= self.size)
            // SAFETY: offset + 4 <= size, so the pointer stays inside the mapped window.
            .then(|| unsafe { self.base.as_ptr().byte_add(offset) })
    }
}

// SAFETY: every access is bounds- and alignment-checked against the window by `slot`.
unsafe impl Mmio for MmioRegion {
    fn size(&self) -> usize {
        self.size
    }

    fn read32(&self, offset: usize) -> u32 {
        match self.slot(offset) {
            // SAFETY: `slot` checked the offset; the window is mapped device memory.
            Some(p) => unsafe { p.read_volatile() },
            None => u32::MAX,
        }
    }

    fn write32(&self, offset: usize, value: u32) {
        if let Some(p) = self.slot(offset) {
            // SAFETY: `slot` checked the offset; the window is mapped device memory.
            unsafe { p.write_volatile(value) }
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;

    #[repr(C, align(4096))]
    struct Page([u8; PAGE_SIZE]);

    fn region(pages: usize) -> (std::vec::Vec<Page>, DmaRegion) {
        let mut mem: std::vec::Vec<Page> = (0..pages).map(|_| Page([0xEE; PAGE_SIZE])).collect();
        let ptr = NonNull::new(mem.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: the vector's memory is page-aligned, outlives the region in every test, and is
        // used by nothing else.
        let r = unsafe { DmaRegion::new(0x10_0000, ptr, pages) };
        (mem, r)
    }

    #[test]
    fn first_fit_zeroes_and_frees() {
        let (_mem, r) = region(8);
        let a = r.alloc(3).unwrap();
        assert_eq!(a.paddr, 0x10_0000);
        // SAFETY: the block is 3 pages of the test's memory.
        let bytes = unsafe { core::slice::from_raw_parts(a.vaddr.as_ptr(), 3 * PAGE_SIZE) };
        assert!(bytes.iter().all(|&b| b == 0));
        let b = r.alloc(4).unwrap();
        assert_eq!(b.paddr, 0x10_0000 + 3 * PAGE_SIZE as u64);
        assert_eq!(r.alloc(2), Err(DmaError::Exhausted { requested: 2 }));
        assert_eq!(r.free_pages(), 1);
        // SAFETY: `a` came from `r` and is returned once.
        unsafe { r.dealloc(a) };
        let c = r.alloc(2).unwrap();
        assert_eq!(c.paddr, 0x10_0000);
        assert_eq!(r.alloc(0), Err(DmaError::ZeroSize));
        // SAFETY: returned once each.
        unsafe {
            r.dealloc(b);
            r.dealloc(c);
        }
        assert_eq!(r.free_pages(), 8);
    }

    #[test]
    fn fragmentation_is_skipped() {
        let (_mem, r) = region(6);
        let blocks: vec::Vec<_> = (0..6).map(|_| r.alloc(1).unwrap()).collect();
        let mut it = blocks.into_iter();
        let (p0, p1, p2) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        // SAFETY: each block came from `r` and is returned once.
        unsafe {
            r.dealloc(p0);
            r.dealloc(p2);
        }
        assert!(
            r.alloc(2).is_err(),
            "pages 0 and 2 are free but not adjacent"
        );
        // SAFETY: as above.
        unsafe { r.dealloc(p1) };
        assert_eq!(r.alloc(3).unwrap().paddr, 0x10_0000);
        drop(it);
    }

    #[test]
    fn mmio_refuses_out_of_window() {
        let mut regs = [0u32; 4];
        // SAFETY: the array stands in for a 16-byte window and outlives the region.
        let m = unsafe { MmioRegion::new(NonNull::new(regs.as_mut_ptr()).unwrap(), 16) };
        m.write32(12, 7);
        m.write32(16, 9);
        m.write32(2, 9);
        assert_eq!(m.read32(12), 7);
        assert_eq!(m.read32(16), u32::MAX);
        assert_eq!(m.read32(usize::MAX - 1), u32::MAX);
        assert_eq!(regs, [0, 0, 0, 7]);
    }
}
