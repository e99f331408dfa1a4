//! The virtio-blk boot check (`bvblk` on the kernel command line): a known pattern written
//! through a [`BlockDevice`], read back in other pieces, flushed; the lab then reads the same
//! pattern from the disk image on the host, after the kernel has powered off.
//!
//! Sector `s` of the pattern holds the line `bareverbs virtio-blk sector SSSSSSSS\n` (the
//! number in 8 decimal digits) padded with `.` to 512 bytes.

use core::fmt::Write;

use bareverbs_platform::block::{BlockDevice, BlockError};

/// The first sector of the pattern.
pub const FIRST: u64 = 8;
/// Sectors of the pattern (160 KiB: more than two of the driver's 64 KiB requests).
pub const SECTORS: usize = 320;
/// Bytes of a sector.
const SECTOR: usize = 512;

/// What the check did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checked {
    /// The disk's capacity in blocks.
    pub capacity: u64,
    /// Bytes written and read back.
    pub bytes: usize,
}

/// Fills `buf` (a whole sector) with sector `s`'s pattern.
pub fn pattern(s: u64, buf: &mut [u8]) {
    buf.fill(b'.');
    let mut w = Cursor { buf, at: 0 };
    let _ = writeln!(w, "bareverbs virtio-blk sector {s:08}");
}

struct Cursor<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Write for Cursor<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.at + s.len();
        let dst = self.buf.get_mut(self.at..end).ok_or(core::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.at = end;
        Ok(())
    }
}

/// Writes the pattern in one call, reads it back in three unequal pieces and compares, then
/// flushes and checks that a read past the end is refused. `scratch` must hold
/// [`SECTORS`] sectors.
pub fn run<D: BlockDevice>(disk: &mut D, scratch: &mut [u8]) -> Result<Checked, &'static str> {
    let bytes = SECTORS * SECTOR;
    if disk.block_size() as usize != SECTOR {
        return Err("the disk's blocks are not 512 bytes");
    }
    if disk.capacity() < FIRST + SECTORS as u64 {
        return Err("the disk is smaller than the pattern");
    }
    let buf = scratch
        .get_mut(..bytes)
        .ok_or("scratch smaller than the pattern")?;
    for (i, sector) in buf.chunks_mut(SECTOR).enumerate() {
        pattern(FIRST + i as u64, sector);
    }
    disk.write(FIRST, buf).map_err(|_| "write failed")?;
    buf.fill(0);
    // Pieces that do not fall on the driver's request boundaries.
    let (a, rest) = buf.split_at_mut(3 * SECTOR);
    let (b, c) = rest.split_at_mut(150 * SECTOR);
    disk.read(FIRST, a).map_err(|_| "read failed")?;
    disk.read(FIRST + 3, b).map_err(|_| "read failed")?;
    disk.read(FIRST + 153, c).map_err(|_| "read failed")?;
    let mut want = [0u8; SECTOR];
    for (i, sector) in buf.chunks(SECTOR).enumerate() {
        pattern(FIRST + i as u64, &mut want);
        if sector != want {
            return Err("read back differs from what was written");
        }
    }
    disk.flush().map_err(|_| "flush failed")?;
    let end = disk.capacity();
    if disk.read(end, &mut want) != Err(BlockError::OutOfRange) {
        return Err("a read past the end was not refused as out of range");
    }
    if disk.read(0, &mut want[..100]) != Err(BlockError::Misaligned) {
        return Err("a read of part of a block was not refused");
    }
    Ok(Checked {
        capacity: disk.capacity(),
        bytes,
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    /// A disk in memory (the check's logic, without a device).
    struct Mem(std::vec::Vec<u8>, u32);

    impl BlockDevice for Mem {
        fn block_size(&self) -> u32 {
            512
        }
        fn capacity(&self) -> u64 {
            (self.0.len() / 512) as u64
        }
        fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), BlockError> {
            if !buf.len().is_multiple_of(512) {
                return Err(BlockError::Misaligned);
            }
            let at = lba as usize * 512;
            let src = self
                .0
                .get(at..at + buf.len())
                .ok_or(BlockError::OutOfRange)?;
            buf.copy_from_slice(src);
            Ok(())
        }
        fn write(&mut self, lba: u64, buf: &[u8]) -> Result<(), BlockError> {
            let at = lba as usize * 512;
            let dst = self
                .0
                .get_mut(at..at + buf.len())
                .ok_or(BlockError::OutOfRange)?;
            dst.copy_from_slice(buf);
            // The second argument: a byte to corrupt after each write (0: none).
            if self.1 != 0 {
                self.0[at + 700] ^= self.1 as u8;
            }
            Ok(())
        }
        fn flush(&mut self) -> Result<(), BlockError> {
            Ok(())
        }
        fn write_zeroes(&mut self, _lba: u64, _blocks: u64) -> Result<(), BlockError> {
            Ok(())
        }
    }

    #[test]
    fn pattern_lands_on_the_disk() {
        let mut disk = Mem(std::vec![0; 1024 * 512], 0);
        let mut scratch = std::vec![0; SECTORS * SECTOR];
        let c = run(&mut disk, &mut scratch).unwrap();
        assert_eq!(
            c,
            Checked {
                capacity: 1024,
                bytes: SECTORS * 512
            }
        );
        let s9 = &disk.0[9 * 512..10 * 512];
        assert_eq!(&s9[..37], b"bareverbs virtio-blk sector 00000009\n");
        assert!(s9[37..].iter().all(|&b| b == b'.'));
        assert!(
            disk.0[..FIRST as usize * 512].iter().all(|&b| b == 0),
            "nothing before"
        );
    }

    #[test]
    fn a_disk_that_loses_a_byte_fails() {
        let mut disk = Mem(std::vec![0; 1024 * 512], 0x20);
        let mut scratch = std::vec![0; SECTORS * SECTOR];
        assert_eq!(
            run(&mut disk, &mut scratch),
            Err("read back differs from what was written")
        );
    }

    #[test]
    fn a_small_disk_is_refused() {
        let mut disk = Mem(std::vec![0; 100 * 512], 0);
        let mut scratch = std::vec![0; SECTORS * SECTOR];
        assert_eq!(
            run(&mut disk, &mut scratch),
            Err("the disk is smaller than the pattern")
        );
    }
}
