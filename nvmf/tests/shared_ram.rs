//! The RAM disk several cores share (`SharedRam`, a handle per core): what one handle writes
//! another reads back, at every offset and length of whole blocks, into and from buffers at
//! any alignment; requests past the end or of part of a block are refused and change
//! nothing; two threads writing and reading their own blocks at once each find their own
//! bytes.

use bareverbs_nvmf::block::{BlockDevice, BlockError, SharedRam};

/// The byte at `i` of block `lba` of a pattern (`seed` tells writers apart).
fn byte(lba: u64, i: usize, seed: u8) -> u8 {
    (lba as u8).wrapping_mul(31) ^ (i as u8).wrapping_mul(7) ^ (i >> 8) as u8 ^ seed
}

fn fill(lba: u64, buf: &mut [u8], seed: u8) {
    for (k, block) in buf.chunks_mut(512).enumerate() {
        for (i, b) in block.iter_mut().enumerate() {
            *b = byte(lba + k as u64, i, seed);
        }
    }
}

fn memory(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes / 8]
}

#[test]
fn what_one_handle_writes_another_reads_back_at_any_alignment() {
    let mut mem = memory(64 * 1024);
    // SAFETY: the vector's bytes, borrowed mutably for as long as the view lives.
    let bytes = unsafe { std::slice::from_raw_parts_mut(mem.as_mut_ptr().cast::<u8>(), 64 * 1024) };
    let ram = SharedRam::new(bytes, 512).unwrap();
    let (mut w, mut r) = (ram.handle(), ram.handle());
    assert_eq!(w.capacity(), 128);
    // Buffers at offsets 0..8 of an allocation: the copies take any alignment.
    let mut src = vec![0u8; 8 * 1024 + 8];
    let mut dst = vec![0u8; 8 * 1024 + 8];
    for (lba, blocks, off) in [
        (0u64, 1usize, 0usize),
        (1, 8, 1),
        (17, 16, 3),
        (100, 5, 7),
        (127, 1, 5),
    ] {
        let len = blocks * 512;
        fill(lba, &mut src[off..off + len], 0x5a);
        w.write(lba, &src[off..off + len]).unwrap();
        dst.fill(0xee);
        r.read(lba, &mut dst[off..off + len]).unwrap();
        assert_eq!(
            &dst[off..off + len],
            &src[off..off + len],
            "lba {lba}, {blocks} blocks, offset {off}"
        );
        // Nothing past the request was written.
        assert!(
            dst[..off].iter().all(|&b| b == 0xee) && dst[off + len..].iter().all(|&b| b == 0xee)
        );
    }
    // The blocks around a write are untouched: block 9 (after the 8 at 1) is still zero.
    let mut one = [0xffu8; 512];
    r.read(9, &mut one).unwrap();
    assert!(one.iter().all(|&b| b == 0));
    // Refused: past the end, part of a block; the disk unchanged.
    assert_eq!(w.write(127, &src[..1024]), Err(BlockError::OutOfRange));
    assert_eq!(w.write(3, &src[..100]), Err(BlockError::Misaligned));
    assert_eq!(r.read(128, &mut one), Err(BlockError::OutOfRange));
    r.read(127, &mut one).unwrap();
    let mut want = [0u8; 512];
    fill(127, &mut want, 0x5a);
    assert_eq!(one, want);
}

#[test]
fn two_threads_writing_their_own_blocks_at_once_each_read_their_own_bytes() {
    let mut mem = memory(256 * 1024);
    // SAFETY: the vector's bytes, borrowed mutably for as long as the view lives.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(mem.as_mut_ptr().cast::<u8>(), 256 * 1024) };
    let ram = SharedRam::new(bytes, 512).unwrap();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let mut h = ram.handle();
            s.spawn(move || {
                let mut buf = vec![0u8; 4096];
                let mut back = vec![0u8; 4096];
                for round in 0..200u64 {
                    // Thread t owns the 4 KiB chunks of its parity.
                    let lba = ((round * 2 + t) % 64) * 8;
                    fill(lba, &mut buf, round as u8 ^ t as u8);
                    h.write(lba, &buf).unwrap();
                    h.read(lba, &mut back).unwrap();
                    assert_eq!(back, buf, "thread {t}, round {round}");
                }
            });
        }
    });
}
