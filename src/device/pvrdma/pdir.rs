//! Page directories: how PVRDMA learns which pages make up a ring or region.
//!
//! Three levels of 4 KiB pages (L-API `PVRDMA_PDIR_*`, L-MISC `pvrdma_page_dir_init`): a
//! directory page whose u64 entries point to table pages, whose u64 entries point to data
//! pages. Page `i` is table `i >> 9`, entry `i & 511`.

use bareverbs_hal::{Hal, PAGE_SIZE};

use crate::dma::Dma;
use crate::error::Result;

/// Entries per directory or table page.
const ENTRIES: usize = PAGE_SIZE / 8;

/// Most pages one directory can describe with QEMU (only `dir[0]` of rings is read, but memory
/// regions may use every table).
pub(crate) const MAX_PAGES: usize = ENTRIES * ENTRIES;

/// A directory page followed by its table pages, in one contiguous DMA block.
pub(crate) struct PageDir<H: Hal> {
    dma: Dma<H>,
}

impl<H: Hal> PageDir<H> {
    /// A directory over every page of `data`, in order.
    pub(crate) fn new(hal: &H, data: &Dma<H>) -> Result<Self> {
        Self::over(hal, data.pages(), |i| data.page_paddr(i))
    }

    /// A directory over `npages` pages (≤ [`MAX_PAGES`]), page `i` at `paddr(i)`.
    #[inline(never)]
    pub(crate) fn over(hal: &H, npages: usize, paddr: impl Fn(usize) -> u64) -> Result<Self> {
        assert!(npages <= MAX_PAGES, "page directory too large");
        let tables = npages.div_ceil(ENTRIES);
        let dma = Dma::new(hal, 1 + tables)?;
        for t in 0..tables {
            dma.write::<u64>(t * 8, dma.page_paddr(1 + t));
        }
        for i in 0..npages {
            dma.write::<u64>((1 + i / ENTRIES) * PAGE_SIZE + (i % ENTRIES) * 8, paddr(i));
        }
        Ok(PageDir { dma })
    }

    /// Physical address of the directory page.
    pub(crate) fn paddr(&self) -> u64 {
        self.dma.paddr()
    }
}

/// Ring or queue memory the device reaches through a page directory: contiguous data pages
/// (page 0 is the ring-state page where the object has one) and their directory.
pub(crate) struct QueueMem<H: Hal> {
    pub(crate) data: Dma<H>,
    pub(crate) pdir: PageDir<H>,
}

impl<H: Hal> QueueMem<H> {
    /// Allocates `pages` zeroed pages and their directory.
    #[inline(never)]
    pub(crate) fn new(hal: &H, pages: usize) -> Result<Self> {
        let data = Dma::new(hal, pages)?;
        let pdir = PageDir::new(hal, &data)?;
        Ok(QueueMem { data, pdir })
    }
}
