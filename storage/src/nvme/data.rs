//! The data path of [`Nvme`]: a transfer's range checked against its namespace, its PRP
//! entries (two, or a list in the queue's list page), through the bounce buffer or the
//! caller's own pages, and Flush, Write Zeroes and Dataset Management.

use core::ptr::NonNull;

use bareverbs_hal::{Hal, PAGE_SIZE};

use super::regs::{Command, io};
use super::{
    BOUNCE_PAGES, MAX_IO_QUEUES, Namespace, Nvme, NvmeError, PG_BOUNCE, PG_DSM, PG_IO,
    PRP_LIST_ENTRIES, Pages, State, Unsupported,
};

impl<H: Hal> Nvme<H> {
    /// The namespace and the check of `blocks` blocks at `lba` against it.
    pub(super) fn span(&self, nsid: u32, lba: u64, blocks: u64) -> Result<Namespace, NvmeError> {
        let ns = self.namespace(nsid).ok_or(NvmeError::NoNamespace)?;
        let end = lba.checked_add(blocks).ok_or(NvmeError::OutOfRange)?;
        if end > ns.blocks {
            return Err(NvmeError::OutOfRange);
        }
        Ok(ns)
    }

    /// Blocks of `len` bytes on `ns`, or `InvalidArgument` for a partial block.
    fn blocks_of(ns: &Namespace, len: usize) -> Result<u64, NvmeError> {
        let bs = ns.block_size as usize;
        if len == 0 || !len.is_multiple_of(bs) {
            return Err(NvmeError::InvalidArgument);
        }
        Ok((len / bs) as u64)
    }

    /// PRP1 and PRP2 for `len` bytes on `pages`, the list (if any) in I/O queue `io`'s list
    /// page.
    fn prps(&mut self, io: usize, pages: Pages<'_>, len: usize) -> Result<(u64, u64), NvmeError> {
        let page = PAGE_SIZE as u64;
        let offset = (pages.first % page) as usize;
        if len == 0 || !pages.first.is_multiple_of(4) || pages.first == 0 {
            return Err(NvmeError::InvalidArgument);
        }
        let count = (offset + len).div_ceil(PAGE_SIZE);
        if count != 1 + pages.rest.len()
            || pages.rest.len() > PRP_LIST_ENTRIES
            || pages
                .rest
                .iter()
                .any(|p| !p.is_multiple_of(page) || *p == 0)
        {
            return Err(NvmeError::InvalidArgument);
        }
        Ok(match pages.rest {
            [] => (pages.first, 0),
            [second] => (pages.first, *second),
            rest => {
                if io >= MAX_IO_QUEUES as usize {
                    return Err(NvmeError::InvalidArgument);
                }
                let (list, list_pa) = self.page(PG_IO + 3 * io + 2);
                for (i, p) in rest.iter().enumerate() {
                    // SAFETY: i < PRP_LIST_ENTRIES: inside the queue's list page, which only
                    // this queue's one command in flight uses.
                    unsafe { list.cast::<u64>().add(i).write_volatile(p.to_le()) };
                }
                (pages.first, list_pa)
            }
        })
    }

    /// One Read or Write of `len` bytes at `lba` of `nsid` on `pages`.
    pub(super) fn rw(
        &mut self,
        io: usize,
        opcode: u8,
        nsid: u32,
        lba: u64,
        pages: Pages<'_>,
        len: usize,
    ) -> Result<(), NvmeError> {
        self.check_rw(io, nsid, lba, len)?;
        let (prp1, prp2) = self.prps(io, pages, len)?;
        self.rw_prps(io, opcode, nsid, lba, len, prp1, prp2)
    }

    /// Checks a Read or Write of `len` bytes at `lba` of `nsid` on I/O queue `io`.
    fn check_rw(&self, io: usize, nsid: u32, lba: u64, len: usize) -> Result<u64, NvmeError> {
        let ns = self.span(nsid, lba, 0)?;
        let blocks = Self::blocks_of(&ns, len)?;
        self.span(nsid, lba, blocks)?;
        if len > self.info.max_transfer.max(PAGE_SIZE) || blocks > 1 << 16 {
            return Err(NvmeError::InvalidArgument);
        }
        // A stopped controller has no I/O queues to name (a reset that failed left none).
        if self.state != State::Ready {
            return Err(NvmeError::Stopped);
        }
        if self.io.get(io).is_none_or(Option::is_none) {
            return Err(NvmeError::InvalidArgument);
        }
        Ok(blocks)
    }

    /// One Read or Write with PRP1 and PRP2 as given.
    #[allow(clippy::too_many_arguments)] // the command's fields
    fn rw_prps(
        &mut self,
        io: usize,
        opcode: u8,
        nsid: u32,
        lba: u64,
        len: usize,
        prp1: u64,
        prp2: u64,
    ) -> Result<(), NvmeError> {
        let blocks = self.check_rw(io, nsid, lba, len)?;
        let mut c = Command {
            cdw0: u32::from(opcode),
            nsid,
            prp1,
            prp2,
            ..Command::default()
        };
        c.cdw10[0] = lba as u32;
        c.cdw10[1] = (lba >> 32) as u32;
        c.cdw10[2] = (blocks - 1) as u32;
        self.run(Some(io), c)?;
        if opcode == io::READ {
            self.stats.read += len as u64;
        } else {
            self.stats.written += len as u64;
        }
        Ok(())
    }

    /// Reads (`write` false) or writes `len` bytes (whole blocks) at `lba` of `nsid` through
    /// I/O queue `io` with the caller's own PRP entries, laid out as the specification's
    /// section 4.3 says: `prp1` the first byte (dword-aligned), `prp2` the second page when
    /// the transfer ends there, or the address of the caller's PRP list when it needs more.
    /// No copy, and no list built by the driver: the form for buffers whose page list the
    /// caller keeps already (a registered memory region's).
    ///
    /// # Errors
    ///
    /// As [`read_pages`](Self::read_pages); a `prp1` of 0 or not dword-aligned is
    /// `InvalidArgument`.
    ///
    /// # Safety
    ///
    /// `prp1`, `prp2` and the list they lead to describe `len` bytes of memory the controller
    /// may reach by DMA (written for a read, read for a write), which nothing else uses until
    /// this returns, or for good if the controller is then [`State::Wedged`]; a list lies in
    /// such memory too and ends where the transfer does.
    #[allow(clippy::too_many_arguments)] // the command's fields
    pub unsafe fn transfer_prps(
        &mut self,
        io: usize,
        write: bool,
        nsid: u32,
        lba: u64,
        len: usize,
        prp1: u64,
        prp2: u64,
    ) -> Result<(), NvmeError> {
        if prp1 == 0 || !prp1.is_multiple_of(4) {
            return Err(NvmeError::InvalidArgument);
        }
        let opcode = if write { io::WRITE } else { io::READ };
        self.rw_prps(io, opcode, nsid, lba, len, prp1, prp2)
    }

    /// Reads `len` bytes (whole blocks, at most [`ControllerInfo::max_transfer`](super::ControllerInfo::max_transfer)) at `lba`
    /// of namespace `nsid` into the caller's pages, through I/O queue `io` (from 0): no copy.
    ///
    /// # Errors
    ///
    /// [`NvmeError`]; after `Timeout` or `Protocol` the controller is stopped and (unless it
    /// is [`State::Wedged`]) no longer writes the pages.
    ///
    /// # Safety
    ///
    /// `pages` describe memory the controller may write by DMA (reached at those physical
    /// addresses), which nothing else uses until this returns, or for good if the
    /// controller is then [`State::Wedged`].
    pub unsafe fn read_pages(
        &mut self,
        io: usize,
        nsid: u32,
        lba: u64,
        pages: Pages<'_>,
        len: usize,
    ) -> Result<(), NvmeError> {
        self.rw(io, io::READ, nsid, lba, pages, len)
    }

    /// Writes `len` bytes (whole blocks) from the caller's pages at `lba` of `nsid`, through
    /// I/O queue `io`: no copy.
    ///
    /// # Errors
    ///
    /// As [`read_pages`](Self::read_pages).
    ///
    /// # Safety
    ///
    /// `pages` describe memory the controller may read by DMA, which nothing changes until
    /// this returns (or for good if the controller is then [`State::Wedged`]).
    pub unsafe fn write_pages(
        &mut self,
        io: usize,
        nsid: u32,
        lba: u64,
        pages: Pages<'_>,
        len: usize,
    ) -> Result<(), NvmeError> {
        self.rw(io, io::WRITE, nsid, lba, pages, len)
    }

    /// The bounce buffer's pages for `len` bytes (<= its size).
    pub(super) fn bounce(&self, len: usize, list: &mut [u64; BOUNCE_PAGES]) -> usize {
        let n = len.div_ceil(PAGE_SIZE).min(BOUNCE_PAGES);
        for (i, p) in list.iter_mut().enumerate().take(n) {
            *p = self.page_pa(PG_BOUNCE + i);
        }
        n
    }

    /// The bounce buffer, `len` (<= its size) bytes, for the CPU between commands.
    pub(super) fn bounce_bytes(&mut self, len: usize) -> &mut [u8] {
        let len = len.min(BOUNCE_PAGES * PAGE_SIZE);
        // SAFETY: inside the block; no command in flight uses the bounce buffer (commands run
        // one at a time, and after a failure the controller is disabled, or wedged and then
        // no command runs again).
        unsafe { core::slice::from_raw_parts_mut(self.page(PG_BOUNCE).0.as_ptr(), len) }
    }

    /// The largest copied chunk on `ns`: whole blocks, within one command.
    pub(super) fn chunk(&self, ns: &Namespace) -> usize {
        let bs = ns.block_size as usize;
        (self.info.max_transfer.min(BOUNCE_PAGES * PAGE_SIZE) / bs).max(1) * bs
    }

    /// Reads `buf.len()` bytes (whole blocks) at `lba` of `nsid`, through the bounce buffer.
    ///
    /// # Errors
    ///
    /// [`NvmeError`].
    pub fn read(&mut self, nsid: u32, lba: u64, buf: &mut [u8]) -> Result<(), NvmeError> {
        let at = NonNull::from(&mut *buf).cast::<u8>();
        // SAFETY: `buf` is the caller's, writable, `buf.len()` bytes; not handed to the
        // controller (copied: `direct` false).
        unsafe { self.transfer(false, nsid, lba, at, buf.len(), false) }.map(|_| ())
    }

    /// Writes `buf` (whole blocks) at `lba` of `nsid`, through the bounce buffer.
    ///
    /// # Errors
    ///
    /// [`NvmeError`].
    pub fn write(&mut self, nsid: u32, lba: u64, buf: &[u8]) -> Result<(), NvmeError> {
        let at = NonNull::from(buf).cast::<u8>();
        // SAFETY: `buf` is the caller's, `buf.len()` bytes, only read (a write); not handed
        // to the controller.
        unsafe { self.transfer(true, nsid, lba, at, buf.len(), false) }.map(|_| ())
    }

    /// Reads `buf.len()` bytes (whole blocks) at `lba` of `nsid` by DMA straight into `buf`:
    /// each page of `buf` translated by the HAL's [`virt_to_phys`](Hal::virt_to_phys) into
    /// the command's PRP entries (a list for more than two pages), `buf` invalidated from
    /// the CPU's caches around the command ([`Hal::dma_invalidate`]). A part of `buf` that
    /// cannot be put in PRP entries (a page the HAL cannot translate, a first byte off a
    /// dword boundary, a page that does not start on a page boundary) goes through the
    /// bounce buffer instead. Returns the bytes copied (0 when every part went by DMA).
    ///
    /// # Errors
    ///
    /// As [`read_pages`](Self::read_pages).
    ///
    /// # Safety
    ///
    /// The controller may write `buf` by DMA at the addresses the HAL gives, and `buf` is
    /// memory where such a write can only change data, never the program's state (DMA
    /// memory the embedder lent, not the stack nor a Rust object's fields): after a command
    /// that timed out the controller is disabled, but one that is then [`State::Wedged`]
    /// (it did not stop) may still write there later.
    pub unsafe fn read_direct(
        &mut self,
        nsid: u32,
        lba: u64,
        buf: &mut [u8],
    ) -> Result<usize, NvmeError> {
        let at = NonNull::from(&mut *buf).cast::<u8>();
        // SAFETY: `buf` is the caller's, writable; the caller lets the controller reach it.
        unsafe { self.transfer(false, nsid, lba, at, buf.len(), true) }
    }

    /// Writes `buf` (whole blocks) at `lba` of `nsid` by DMA straight from `buf`, cleaned
    /// from the CPU's caches first ([`Hal::dma_clean`]); as [`read_direct`](Self::read_direct)
    /// otherwise. Returns the bytes copied.
    ///
    /// # Errors
    ///
    /// As [`read_pages`](Self::read_pages).
    ///
    /// # Safety
    ///
    /// The controller may read `buf` by DMA at the addresses the HAL gives; a controller
    /// that is [`State::Wedged`] after the call may still read it later (it reads, never
    /// writes, for a write command).
    pub unsafe fn write_direct(
        &mut self,
        nsid: u32,
        lba: u64,
        buf: &[u8],
    ) -> Result<usize, NvmeError> {
        let at = NonNull::from(buf).cast::<u8>();
        // SAFETY: `buf` is the caller's, only read; the caller lets the controller reach it.
        unsafe { self.transfer(true, nsid, lba, at, buf.len(), true) }
    }

    /// The PRP entries of `len` bytes (one command's) at `at`, in `out`: their count, or
    /// `None` when they cannot be expressed so. The buffer is walked by physical pages: the
    /// first entry is the first byte's address (dword-aligned: the specification's rule for
    /// PRP1), each later one the address the buffer continues at, which must start a page;
    /// where a virtual page boundary falls inside a physical page, the HAL must place the
    /// next byte right after the previous one. `None` also for a page the HAL does not
    /// translate or more pages than `out` holds.
    fn translate(&self, at: NonNull<u8>, len: usize, out: &mut [u64]) -> Option<usize> {
        let page = PAGE_SIZE as u64;
        let (mut n, mut done) = (0, 0);
        while done < len {
            // Inside the buffer: done < len.
            let v = at.as_ptr().wrapping_add(done);
            let pa = self.hal.virt_to_phys(NonNull::new(v)?)?;
            let aligned = if n == 0 {
                pa.is_multiple_of(4)
            } else {
                pa.is_multiple_of(page)
            };
            if pa == 0 || !aligned {
                return None;
            }
            let seg = (PAGE_SIZE - (pa % page) as usize).min(len - done);
            let to_virtual_page = PAGE_SIZE - v as usize % PAGE_SIZE;
            if to_virtual_page < seg {
                let next = NonNull::new(v.wrapping_add(to_virtual_page))?;
                if self.hal.virt_to_phys(next)? != pa + to_virtual_page as u64 {
                    return None;
                }
            }
            *out.get_mut(n)? = pa;
            n += 1;
            done += seg;
        }
        Some(n)
    }

    /// Reads (`write` false) or writes `len` bytes (whole blocks) at `lba` of `nsid` from or
    /// to the caller's memory at `at`, in commands of at most the copied chunk: by DMA
    /// straight to the caller's memory when `direct` and the part translates, through the
    /// bounce buffer otherwise. Returns the bytes copied.
    ///
    /// # Safety
    ///
    /// `at` is `len` bytes of the caller's (writable unless `write`); with `direct`, the
    /// controller may reach them as [`read_direct`](Self::read_direct) says.
    pub(super) unsafe fn transfer(
        &mut self,
        write: bool,
        nsid: u32,
        lba: u64,
        at: NonNull<u8>,
        len: usize,
        direct: bool,
    ) -> Result<usize, NvmeError> {
        if self.state == State::Wedged {
            return Err(NvmeError::Stopped);
        }
        let ns = self.span(nsid, lba, 0)?;
        let blocks = Self::blocks_of(&ns, len)?;
        self.span(nsid, lba, blocks)?;
        self.stats.transfers += 1;
        let opcode = if write { io::WRITE } else { io::READ };
        let chunk = self.chunk(&ns);
        let bs = ns.block_size as usize;
        let mut list = [0u64; BOUNCE_PAGES + 1];
        let mut copied = 0;
        let mut done = 0;
        while done < len {
            let part = chunk.min(len - done);
            // SAFETY: done < len: inside the caller's bytes.
            let p = unsafe { at.add(done) };
            let lba = lba + (done / bs) as u64;
            match direct.then(|| self.translate(p, part, &mut list)).flatten() {
                Some(n) => {
                    let pages = Pages {
                        first: list[0],
                        rest: &list[1..n],
                    };
                    // The controller reads what the CPU wrote, and the CPU then reads what
                    // the controller wrote, not stale lines (the HAL's coherence duties for
                    // memory not from its DMA allocator).
                    if write {
                        self.hal.dma_clean(p, part);
                    } else {
                        self.hal.dma_invalidate(p, part);
                    }
                    let r = self.rw(0, opcode, nsid, lba, pages, part);
                    if !write {
                        self.hal.dma_invalidate(p, part);
                    }
                    r?;
                    self.stats.direct += part as u64;
                }
                None => {
                    if write {
                        let b = self.bounce_bytes(part);
                        // SAFETY: `part` bytes of the caller's at `p`, and as many of the
                        // bounce buffer (part <= chunk <= its size): distinct memory.
                        unsafe { core::ptr::copy_nonoverlapping(p.as_ptr(), b.as_mut_ptr(), part) };
                    }
                    let mut pl = [0u64; BOUNCE_PAGES];
                    let n = self.bounce(part, &mut pl);
                    let pages = Pages {
                        first: pl[0],
                        rest: &pl[1..n],
                    };
                    self.rw(0, opcode, nsid, lba, pages, part)?;
                    if !write {
                        let b = self.bounce_bytes(part);
                        // SAFETY: as above; `p` is writable for a read.
                        unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), p.as_ptr(), part) };
                    }
                    copied += part;
                    self.stats.copied += part as u64;
                }
            }
            done += part;
        }
        Ok(copied)
    }

    /// Makes completed writes to `nsid` durable: a Flush command when the controller has a
    /// volatile write cache; without one writes are durable when complete, and nothing is
    /// sent.
    ///
    /// # Errors
    ///
    /// [`NvmeError`].
    pub fn flush(&mut self, nsid: u32) -> Result<(), NvmeError> {
        self.namespace(nsid).ok_or(NvmeError::NoNamespace)?;
        if !self.info.vwc {
            return Ok(());
        }
        let c = Command {
            cdw0: u32::from(io::FLUSH),
            nsid,
            ..Command::default()
        };
        self.run(Some(0), c)?;
        self.stats.flushes += 1;
        Ok(())
    }

    /// Zeroes `blocks` blocks at `lba` of `nsid` with Write Zeroes commands.
    ///
    /// # Errors
    ///
    /// `Unsupported(WriteZeroes)` when ONCS does not have it; [`NvmeError`].
    pub fn write_zeroes(&mut self, nsid: u32, lba: u64, blocks: u64) -> Result<(), NvmeError> {
        self.span(nsid, lba, blocks)?;
        if !self.info.write_zeroes() {
            return Err(NvmeError::Unsupported(Unsupported::WriteZeroes));
        }
        let mut done = 0;
        while done < blocks {
            let n = (blocks - done).min(1 << 16);
            let at = lba + done;
            let mut c = Command {
                cdw0: u32::from(io::WRITE_ZEROES),
                nsid,
                ..Command::default()
            };
            c.cdw10[0] = at as u32;
            c.cdw10[1] = (at >> 32) as u32;
            c.cdw10[2] = (n - 1) as u32;
            self.run(Some(0), c)?;
            done += n;
        }
        Ok(())
    }

    /// Deallocates (discards) `ranges` (start block, block count) of `nsid` with one Dataset
    /// Management command (at most 256 ranges, each of 1 to 2^32 - 1 blocks).
    ///
    /// # Errors
    ///
    /// `Unsupported(DatasetManagement)` when ONCS does not have it; [`NvmeError`].
    pub fn deallocate(&mut self, nsid: u32, ranges: &[(u64, u32)]) -> Result<(), NvmeError> {
        if ranges.is_empty() || ranges.len() > 256 {
            return Err(NvmeError::InvalidArgument);
        }
        for &(lba, n) in ranges {
            if n == 0 {
                return Err(NvmeError::InvalidArgument);
            }
            self.span(nsid, lba, u64::from(n))?;
        }
        if !self.info.dataset_management() {
            return Err(NvmeError::Unsupported(Unsupported::DatasetManagement));
        }
        let (page, pa) = self.page(PG_DSM);
        for (i, &(lba, n)) in ranges.iter().enumerate() {
            let e = page.cast::<[u32; 4]>();
            let entry = [0, n, lba as u32, (lba >> 32) as u32].map(u32::to_le);
            // SAFETY: i < 256 entries of 16 bytes: inside the range page, which only this
            // command (one at a time) uses.
            unsafe { e.add(i).write_volatile(entry) };
        }
        let mut c = Command {
            cdw0: u32::from(io::DSM),
            nsid,
            prp1: pa,
            ..Command::default()
        };
        c.cdw10[0] = ranges.len() as u32 - 1;
        // Attribute: deallocate.
        c.cdw10[1] = 1 << 2;
        self.run(Some(0), c).map(|_| ())
    }
}
