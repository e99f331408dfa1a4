//! The storage behind a namespace: [`BlockDevice`], and [`RamDisk`], one in memory the
//! embedder lends.

/// Why a block device failed a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockError {
    /// The blocks asked for lie past the device's capacity.
    OutOfRange,
    /// The buffer is not a whole number of blocks.
    Misaligned,
    /// The device failed (it reports it; the data may be lost).
    Io,
}

impl core::fmt::Display for BlockError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            BlockError::OutOfRange => "block device: past the capacity",
            BlockError::Misaligned => "block device: not a whole number of blocks",
            BlockError::Io => "block device: I/O error",
        })
    }
}

impl core::error::Error for BlockError {}

/// A block device a namespace serves: synchronous reads and writes by LBA.
///
/// The target checks every range against [`capacity`](Self::capacity) before it calls, and
/// passes whole blocks; an implementation still checks (it may be used on its own).
pub trait BlockDevice {
    /// Bytes per block (a power of two, 512 to 4096 for the hosts of `docs/nvmeof.md`).
    fn block_size(&self) -> u32;
    /// Blocks on the device.
    fn capacity(&self) -> u64;
    /// Reads `buf.len() / block_size()` blocks from `lba` into `buf`.
    ///
    /// # Errors
    ///
    /// [`BlockError`].
    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), BlockError>;
    /// Writes `buf` (whole blocks) at `lba`.
    ///
    /// # Errors
    ///
    /// [`BlockError`].
    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<(), BlockError>;
    /// Makes every completed write durable: returns only once the medium's own flush (if
    /// it has a cache) completed.
    ///
    /// # Errors
    ///
    /// [`BlockError::Io`]: the medium failed the flush (what it held may be lost).
    fn flush(&mut self) -> Result<(), BlockError>;
    /// Whether a completed write may sit in a volatile cache until [`flush`](Self::flush)
    /// (a disk with a write-back cache). `false`: a completed write is on the medium (a RAM
    /// disk: the memory is the medium, there is nothing in between). The target reports it
    /// in Identify Controller's Volatile Write Cache bit, and makes writes with Force Unit
    /// Access durable by a flush only where it is `true`.
    ///
    /// The default is `true`, the safe answer for a device that does not say: hosts then
    /// flush, and a write with Force Unit Access costs a flush.
    fn volatile_cache(&self) -> bool {
        true
    }
    /// Writes `buf` at `lba` and returns only once it is on stable media (Force Unit
    /// Access): the default writes, then flushes when [`volatile_cache`](Self::volatile_cache)
    /// says there is a cache. A device with a cheaper way (a FUA write of its own) overrides
    /// it.
    ///
    /// # Errors
    ///
    /// [`BlockError`] of the write or of the flush.
    fn write_fua(&mut self, lba: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.write(lba, buf)?;
        if self.volatile_cache() {
            self.flush()?;
        }
        Ok(())
    }
    /// Writes `blocks` blocks of zeroes from `lba`.
    ///
    /// # Errors
    ///
    /// [`BlockError`].
    fn write_zeroes(&mut self, lba: u64, blocks: u64) -> Result<(), BlockError>;
    /// Reads into `buf` as [`read`](Self::read) does, where `buf` lies in memory the embedder
    /// lent for DMA: for the NVMe-oF target, a data buffer of a queue's registered region,
    /// the one its RDMA WRITE then sends to the host. A device whose controller can reach
    /// that memory (and was allowed to: see the device's own documentation) has it write
    /// there by DMA, without a copy. Returns the bytes the CPU copied between the medium and
    /// `buf`: 0 on such a path.
    ///
    /// The default reads with [`read`](Self::read) and counts every byte as copied (a RAM
    /// disk's copy from its memory, a driver's bounce buffer).
    ///
    /// # Errors
    ///
    /// [`BlockError`].
    fn read_dma(&mut self, lba: u64, buf: &mut [u8]) -> Result<usize, BlockError> {
        self.read(lba, buf)?;
        Ok(buf.len())
    }
    /// Writes `buf` as [`write`](Self::write) does (as [`write_fua`](Self::write_fua) when
    /// `fua`), where `buf` lies in memory the embedder lent for DMA: for the NVMe-oF target,
    /// the data buffer its RDMA READ of the host's data landed in. Returns the bytes the CPU
    /// copied between `buf` and the medium (see [`read_dma`](Self::read_dma)).
    ///
    /// # Errors
    ///
    /// [`BlockError`] of the write or of the flush.
    fn write_dma(&mut self, lba: u64, buf: &[u8], fua: bool) -> Result<usize, BlockError> {
        if fua {
            self.write_fua(lba, buf)?;
        } else {
            self.write(lba, buf)?;
        }
        Ok(buf.len())
    }
}

/// The byte range of `blocks` blocks at `lba` on a device of `capacity` blocks of `bs` bytes,
/// or why not.
pub fn byte_range(
    lba: u64,
    blocks: u64,
    bs: u32,
    capacity: u64,
) -> Result<(usize, usize), BlockError> {
    let end = lba.checked_add(blocks).ok_or(BlockError::OutOfRange)?;
    if end > capacity {
        return Err(BlockError::OutOfRange);
    }
    let start = usize::try_from(lba * u64::from(bs)).map_err(|_| BlockError::OutOfRange)?;
    let len = usize::try_from(blocks * u64::from(bs)).map_err(|_| BlockError::OutOfRange)?;
    Ok((start, len))
}

/// A RAM disk over memory the embedder lends (a static buffer, or a test's vector).
pub struct RamDisk<'m> {
    mem: &'m mut [u8],
    block_size: u32,
    flushes: u64,
}

impl<'m> RamDisk<'m> {
    /// A disk of `mem.len() / block_size` blocks; `block_size` is rounded to a power of two
    /// in 512..=4096.
    pub fn new(mem: &'m mut [u8], block_size: u32) -> RamDisk<'m> {
        let block_size = block_size.clamp(512, 4096).next_power_of_two().min(4096);
        RamDisk {
            mem,
            block_size,
            flushes: 0,
        }
    }
    /// The disk's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.mem
    }
    /// Flushes done so far.
    pub fn flushes(&self) -> u64 {
        self.flushes
    }
    fn range(&self, lba: u64, len: usize) -> Result<(usize, usize), BlockError> {
        if !len.is_multiple_of(self.block_size as usize) {
            return Err(BlockError::Misaligned);
        }
        let blocks = (len / self.block_size as usize) as u64;
        byte_range(lba, blocks, self.block_size, self.capacity())
    }
}

impl BlockDevice for RamDisk<'_> {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn capacity(&self) -> u64 {
        (self.mem.len() / self.block_size as usize) as u64
    }
    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let (at, len) = self.range(lba, buf.len())?;
        buf.copy_from_slice(&self.mem[at..at + len]);
        Ok(())
    }
    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<(), BlockError> {
        let (at, len) = self.range(lba, buf.len())?;
        self.mem[at..at + len].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), BlockError> {
        self.flushes += 1;
        Ok(())
    }
    /// No cache: a completed write is in the memory that is the disk (which does not survive
    /// a power loss anyway: a RAM disk is not durable storage).
    fn volatile_cache(&self) -> bool {
        false
    }
    fn write_zeroes(&mut self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        let (at, len) = byte_range(lba, blocks, self.block_size, self.capacity())?;
        self.mem[at..at + len].fill(0);
        Ok(())
    }
}
