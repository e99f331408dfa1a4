//! [`NsDisk`]: one namespace of a shared [`Nvme`] as the NVMe-oF target's [`BlockDevice`].

use core::cell::RefCell;
use core::ptr::NonNull;

use bareverbs_hal::Hal;
use bareverbs_nvmf::{BlockDevice, BlockError};

use super::regs::io;
use super::{BOUNCE_PAGES, Namespace, Nvme, NvmeError, Pages, Unsupported};

/// One namespace of a shared [`Nvme`] as a [`BlockDevice`]: reads and writes copy through the
/// driver's bounce buffer; Flush is the controller's when it has a volatile write cache;
/// Write Zeroes is the controller's command when ONCS has it, else written zeroes.
///
/// [`read_dma`](BlockDevice::read_dma) and [`write_dma`](BlockDevice::write_dma) (what the
/// NVMe-oF target calls with its registered buffers) copy too, unless the embedder allowed
/// DMA to those buffers ([`allow_dma`](Self::allow_dma)): then the controller reads and
/// writes them directly ([`Nvme::read_direct`], [`Nvme::write_direct`]), and only a part
/// the HAL cannot translate is copied.
pub struct NsDisk<'c, H: Hal> {
    nvme: &'c RefCell<Nvme<H>>,
    ns: Namespace,
    vwc: bool,
    dma: bool,
}

impl<'c, H: Hal> NsDisk<'c, H> {
    /// Namespace `nsid` of `nvme`, if served.
    pub fn new(nvme: &'c RefCell<Nvme<H>>, nsid: u32) -> Option<Self> {
        let n = nvme.try_borrow().ok()?;
        let ns = n.namespace(nsid)?;
        let vwc = n.info().vwc;
        Some(NsDisk {
            nvme,
            ns,
            vwc,
            dma: false,
        })
    }

    /// Lets [`read_dma`](BlockDevice::read_dma) and [`write_dma`](BlockDevice::write_dma)
    /// have the controller reach their buffers by DMA, with no copy.
    ///
    /// # Safety
    ///
    /// Every buffer given to those two from now on is memory the controller may reach as
    /// [`Nvme::read_direct`] says: at the addresses the HAL's
    /// [`virt_to_phys`](Hal::virt_to_phys) gives, and memory where a late write of a
    /// controller that would not stop changes data, never the program's state (the NVMe-oF
    /// target's registered regions, carved from the embedder's DMA memory).
    pub unsafe fn allow_dma(&mut self) {
        self.dma = true;
    }

    /// Whether [`allow_dma`](Self::allow_dma) was called.
    pub fn dma_allowed(&self) -> bool {
        self.dma
    }

    /// The namespace.
    pub fn namespace(&self) -> Namespace {
        self.ns
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Nvme<H>) -> Result<T, NvmeError>,
    ) -> Result<T, BlockError> {
        // A borrow already taken (a re-entrant call) is a failed request, not a panic.
        let mut n = self.nvme.try_borrow_mut().map_err(|_| BlockError::Io)?;
        f(&mut n).map_err(BlockError::from)
    }
}

impl<H: Hal> BlockDevice for NsDisk<'_, H> {
    fn block_size(&self) -> u32 {
        self.ns.block_size
    }

    fn capacity(&self) -> u64 {
        self.ns.blocks
    }

    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let nsid = self.ns.nsid;
        self.with(|n| n.read(nsid, lba, buf))
    }

    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<(), BlockError> {
        let nsid = self.ns.nsid;
        self.with(|n| n.write(nsid, lba, buf))
    }

    fn read_dma(&mut self, lba: u64, buf: &mut [u8]) -> Result<usize, BlockError> {
        let (nsid, dma) = (self.ns.nsid, self.dma);
        let at = NonNull::from(&mut *buf).cast::<u8>();
        let len = buf.len();
        // SAFETY: `buf` is ours for the call, writable; only with `allow_dma` (whose caller
        // promised what the controller's reach needs) is it handed to the controller.
        self.with(|n| unsafe { n.transfer(false, nsid, lba, at, len, dma) })
    }

    fn write_dma(&mut self, lba: u64, buf: &[u8], fua: bool) -> Result<usize, BlockError> {
        let (nsid, dma) = (self.ns.nsid, self.dma);
        let at = NonNull::from(buf).cast::<u8>();
        // SAFETY: `buf` is ours for the call, only read; handed to the controller only with
        // `allow_dma`.
        let copied = self.with(|n| unsafe { n.transfer(true, nsid, lba, at, buf.len(), dma) })?;
        if fua && self.vwc {
            self.flush()?;
        }
        Ok(copied)
    }

    fn flush(&mut self) -> Result<(), BlockError> {
        let nsid = self.ns.nsid;
        self.with(|n| n.flush(nsid))
    }

    fn volatile_cache(&self) -> bool {
        self.vwc
    }

    fn write_zeroes(&mut self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        let nsid = self.ns.nsid;
        self.with(|n| match n.write_zeroes(nsid, lba, blocks) {
            Err(NvmeError::Unsupported(Unsupported::WriteZeroes)) => {
                // Without the command: zeroes written from the bounce buffer.
                let ns = n.span(nsid, lba, blocks)?;
                let chunk = n.chunk(&ns);
                let per = (chunk / ns.block_size as usize) as u64;
                n.bounce_bytes(chunk).fill(0);
                let mut list = [0u64; BOUNCE_PAGES];
                let mut done = 0;
                while done < blocks {
                    let k = (blocks - done).min(per);
                    let len = k as usize * ns.block_size as usize;
                    let cnt = n.bounce(len, &mut list);
                    let pages = Pages {
                        first: list[0],
                        rest: &list[1..cnt],
                    };
                    n.rw(0, io::WRITE, nsid, lba + done, pages, len)?;
                    done += k;
                }
                Ok(())
            }
            other => other,
        })
    }
}
