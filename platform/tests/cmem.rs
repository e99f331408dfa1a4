//! The kernel's memory functions (`src/cmem.rs`), compiled into this test binary as into the
//! kernel: their exported symbols take the place of the C library's here too, so the test
//! harness itself runs on them. Each result is checked against values computed from the
//! buffer's pattern, never against another copy (which would call the function under test).

#[path = "../src/cmem.rs"]
mod cmem;

use std::hint::black_box;

/// The byte the pattern puts at index `i`.
fn pat(i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(3)
}

fn patterned(len: usize) -> Vec<u8> {
    (0..len).map(pat).collect()
}

/// Every offset pair and length up to a few words past a page of words, overlapping both ways.
#[test]
fn memmove_every_overlap() {
    const LEN: usize = 96;
    for n in 0..=40 {
        for s in 0..=LEN - n {
            for d in 0..=LEN - n {
                let mut buf = patterned(LEN);
                let base = buf.as_mut_ptr();
                // SAFETY: both ranges lie within `buf`.
                let r = unsafe { cmem::memmove(base.add(d), base.add(s), black_box(n)) };
                assert_eq!(r, base.wrapping_add(d));
                for (j, &x) in buf.iter().enumerate() {
                    let want = if (d..d + n).contains(&j) {
                        pat(s + j - d)
                    } else {
                        pat(j)
                    };
                    assert_eq!(x, want, "memmove(d {d}, s {s}, n {n}) at {j}");
                }
            }
        }
    }
}

#[test]
fn memcpy_lengths_and_alignments() {
    for n in (0..=70).chain([1000, 4096, 4099, 65536 + 5]) {
        for off in 0..8 {
            let src = patterned(n + off);
            let mut dst = vec![0xEEu8; n + 16];
            // SAFETY: `src` holds `n` bytes from `off`, `dst` `n` bytes from 3 (apart).
            let r = unsafe { cmem::memcpy(dst.as_mut_ptr().add(3), src.as_ptr().add(off), n) };
            assert_eq!(r, dst.as_mut_ptr().wrapping_add(3));
            for (j, &x) in dst.iter().enumerate() {
                let want = if (3..3 + n).contains(&j) {
                    pat(off + j - 3)
                } else {
                    0xEE
                };
                assert_eq!(x, want, "memcpy(n {n}, off {off}) at {j}");
            }
        }
    }
}

#[test]
fn memset_lengths_and_alignments() {
    for n in (0..=70).chain([1000, 4097]) {
        for off in 0..8 {
            let mut buf = patterned(n + 16);
            // SAFETY: `buf` holds `n` bytes from `off`.
            let r = unsafe { cmem::memset(buf.as_mut_ptr().add(off), 0x1A5, n) };
            assert_eq!(r, buf.as_mut_ptr().wrapping_add(off));
            for (j, &x) in buf.iter().enumerate() {
                let want = if (off..off + n).contains(&j) {
                    0xA5
                } else {
                    pat(j)
                };
                assert_eq!(x, want, "memset(n {n}, off {off}) at {j}");
            }
        }
    }
}

#[test]
fn memcmp_orders_by_first_difference() {
    let a = patterned(64);
    let mut b = a.clone();
    // SAFETY: both are 64 bytes long.
    unsafe {
        assert_eq!(cmem::memcmp(a.as_ptr(), b.as_ptr(), 64), 0);
        b[40] = a[40].wrapping_add(1);
        assert!(cmem::memcmp(a.as_ptr(), b.as_ptr(), 64) < 0);
        assert!(cmem::bcmp(b.as_ptr(), a.as_ptr(), 64) > 0);
        assert_eq!(cmem::memcmp(a.as_ptr(), b.as_ptr(), 40), 0);
    }
}
