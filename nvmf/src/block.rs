//! The storage behind a namespace: [`BlockDevice`], and [`RamDisk`], one in memory the
//! embedder lends.

use core::sync::atomic::{AtomicU64, Ordering};

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

/// The memory of a RAM disk several cores serve at once (one poll group each,
/// `docs/percore.md`): each core reads and writes it through a [`SharedRamDisk`] of its own,
/// with no lock. The memory is held as 8-byte atomic words, read and written with relaxed
/// loads and stores (plain moves on x86-64): two cores that write the same block at once
/// leave it with either's bytes in each word (NVMe leaves the result of overlapping writes
/// on two queues to the host's ordering); nothing is undefined in the program.
pub struct SharedRam<'m> {
    words: &'m [AtomicU64],
    block_size: u32,
}

/// Why memory cannot be a [`SharedRam`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedRamError {
    /// The memory does not start on an 8-byte boundary.
    Unaligned,
}

impl core::fmt::Display for SharedRamError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("shared RAM disk: memory not aligned to 8 bytes")
    }
}

impl core::error::Error for SharedRamError {}

impl<'m> SharedRam<'m> {
    /// The disk over `mem` (its whole blocks; `block_size` rounded as [`RamDisk::new`]
    /// rounds it).
    ///
    /// # Errors
    ///
    /// [`SharedRamError::Unaligned`] when `mem` does not start on an 8-byte boundary.
    pub fn new(mem: &'m mut [u8], block_size: u32) -> Result<SharedRam<'m>, SharedRamError> {
        let block_size = block_size.clamp(512, 4096).next_power_of_two().min(4096);
        if !mem.as_ptr().cast::<u64>().is_aligned() {
            return Err(SharedRamError::Unaligned);
        }
        let n = mem.len() / block_size as usize * block_size as usize / 8;
        // SAFETY: `mem` is borrowed mutably for 'm, so nothing else reaches these bytes
        // while the words live; its start is 8-byte aligned (checked) and the `n` words lie
        // within it; `AtomicU64` has the size and alignment of `u64`, and every bit pattern
        // is a valid one. From here on the bytes are reached only as these atomics.
        let words = unsafe { core::slice::from_raw_parts(mem.as_mut_ptr().cast::<AtomicU64>(), n) };
        Ok(SharedRam { words, block_size })
    }

    /// A handle of the disk for one core's use (as many as there are cores).
    pub fn handle(&self) -> SharedRamDisk<'m> {
        SharedRamDisk {
            words: self.words,
            block_size: self.block_size,
            flushes: 0,
        }
    }
}

/// One core's handle of a [`SharedRam`]: a [`BlockDevice`] over the memory every handle
/// shares.
pub struct SharedRamDisk<'m> {
    words: &'m [AtomicU64],
    block_size: u32,
    flushes: u64,
}

impl SharedRamDisk<'_> {
    /// The words of `len` bytes at `lba`, checked.
    fn words(&self, lba: u64, len: usize) -> Result<&[AtomicU64], BlockError> {
        if !len.is_multiple_of(self.block_size as usize) {
            return Err(BlockError::Misaligned);
        }
        let blocks = (len / self.block_size as usize) as u64;
        let (at, len) = byte_range(lba, blocks, self.block_size, self.capacity())?;
        Ok(&self.words[at / 8..(at + len) / 8])
    }

    /// Flushes done through this handle so far.
    pub fn flushes(&self) -> u64 {
        self.flushes
    }
}

/// Copies `words` 8-byte words forward from `src` to `dst` with one string copy (`rep
/// movsq`: the instruction the single-core [`RamDisk`]'s `memcpy` uses, where a loop of
/// relaxed loads or stores costs 5 instructions a word).
///
/// # Safety
///
/// `src` must be valid for reads and `dst` for writes of `words * 8` bytes. Where either side
/// is atomic words other cores may access meanwhile, the copy's reads and writes of them are
/// those of the relaxed loads or stores it stands for: each byte some core's value, the CPU
/// choosing the order and width of a string copy's accesses (Intel SDM vol. 1 §7.3.9.3,
/// vol. 3 §9.2.4); nothing else may reach a non-atomic side.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn copy_words(dst: *mut u8, src: *const u8, words: usize) {
    // SAFETY: the caller's bounds; `rep movsq` copies forward (the direction flag is clear at
    // every `asm!`'s entry) and uses no flag or stack.
    unsafe {
        core::arch::asm!(
            "rep movsq",
            inout("rcx") words => _,
            inout("rsi") src => _,
            inout("rdi") dst => _,
            options(nostack, preserves_flags)
        );
    }
}

/// Copies the first `min(src.len(), dst.len() / 8)` words of `src` into `dst`: on x86-64 one
/// string copy ([`copy_words`]), elsewhere a relaxed load each.
#[inline]
fn load_words(dst: &mut [u8], src: &[AtomicU64]) {
    let n = src.len().min(dst.len() / 8);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `n` words of `src` and `n * 8` bytes of `dst` are in bounds (`n` is the smaller
    // length); `dst` is borrowed mutably, so nothing else reaches it; `src`'s words are
    // atomics, read as relaxed loads would read them.
    unsafe {
        copy_words(dst.as_mut_ptr(), src.as_ptr().cast(), n);
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (b, w) in dst.chunks_exact_mut(8).zip(&src[..n]) {
        b.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
    }
}

/// Copies the first `min(dst.len(), src.len() / 8)` words of `src` into `dst`'s words, as
/// [`load_words`] the other way (each word's bytes as a relaxed store would leave them).
#[inline]
fn store_words(dst: &[AtomicU64], src: &[u8]) {
    let n = dst.len().min(src.len() / 8);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `n * 8` bytes of `src` (only read) and `n` words of `dst` are in bounds;
    // `dst`'s words are atomics (shared mutability is theirs to allow), stored as relaxed
    // stores would store them, other cores' accesses racing only as theirs would.
    unsafe {
        copy_words(dst.as_ptr().cast_mut().cast(), src.as_ptr(), n);
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (b, w) in src.chunks_exact(8).zip(&dst[..n]) {
        let mut v = [0u8; 8];
        v.copy_from_slice(b);
        w.store(u64::from_ne_bytes(v), Ordering::Relaxed);
    }
}

impl BlockDevice for SharedRamDisk<'_> {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn capacity(&self) -> u64 {
        (self.words.len() * 8 / self.block_size as usize) as u64
    }
    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let words = self.words(lba, buf.len())?;
        load_words(buf, words);
        Ok(())
    }
    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<(), BlockError> {
        let words = self.words(lba, buf.len())?;
        store_words(words, buf);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), BlockError> {
        self.flushes += 1;
        Ok(())
    }
    /// No cache, as [`RamDisk`]'s.
    fn volatile_cache(&self) -> bool {
        false
    }
    fn write_zeroes(&mut self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        let (at, len) = byte_range(lba, blocks, self.block_size, self.capacity())?;
        for w in &self.words[at / 8..(at + len) / 8] {
            w.store(0, Ordering::Relaxed);
        }
        Ok(())
    }
}
