//! The storage seam of the appliance: what a namespace reads and writes (the NVMe-oF library
//! defines the same trait; this copy stands until the kernel depends on it).

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

/// A block device: synchronous reads and writes by LBA.
pub trait BlockDevice {
    /// Bytes per block.
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
    /// Makes every completed write durable.
    ///
    /// # Errors
    ///
    /// [`BlockError::Io`].
    fn flush(&mut self) -> Result<(), BlockError>;
    /// Writes `blocks` blocks of zeroes from `lba`.
    ///
    /// # Errors
    ///
    /// [`BlockError`].
    fn write_zeroes(&mut self, lba: u64, blocks: u64) -> Result<(), BlockError>;
}
