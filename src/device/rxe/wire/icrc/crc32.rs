//! CRC-32 of IEEE 802.3 (Ethernet's, the one the ICRC uses: polynomial 0x04C11DB7, bits
//! reflected, register preset to all-ones and inverted at the end), in two algorithms:
//!
//! - carry-less multiplication (PCLMULQDQ) folding 64 bytes per step, then a Barrett
//!   reduction, on x86_64 processors that have the instruction (about 0.4 instructions a byte);
//! - slice-by-16 everywhere else and for short runs: 16 tables of 256 words (16 KiB, built at
//!   compile time), 16 bytes per step (about 3 instructions a byte).
//!
//! Which one runs is decided explicitly: at compile time when the target has `pclmulqdq`,
//! otherwise by one CPUID query at the first CRC, remembered. Every constant is derived below
//! from the polynomial by the definitions of the folding method, none typed in.
//!
//! The functions work on the raw register: start from [`INIT`], feed [`update`], and invert
//! the result.

use core::sync::atomic::{AtomicU8, Ordering};

/// The register before the first byte.
pub const INIT: u32 = !0;

/// The polynomial, bits reflected (x^0 in the most significant bit).
const POLY: u32 = 0xEDB8_8320;

/// The register after `data`, from `r`.
pub fn update(r: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= clmul::MIN && accelerated() {
        // SAFETY: the processor has PCLMULQDQ (`accelerated`); SSE2 is part of x86_64.
        return unsafe { clmul::update(r, &[], data) };
    }
    slice16(r, data)
}

/// The register after the bytes of `head`, then `data`, from `r`: one pass over both (with
/// the folding, one reduction at the end, none between them).
#[inline(always)]
pub fn update_blocks(r: u32, head: &[[u8; 16]], data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if head.len() * 16 + data.len() >= clmul::MIN && accelerated() {
        // SAFETY: as in `update`.
        return unsafe { clmul::update(r, head, data) };
    }
    slice16(slice16(r, head.as_flattened()), data)
}

/// Whether [`update`] folds with PCLMULQDQ on this processor.
#[inline(always)]
pub fn accelerated() -> bool {
    /// 0: not asked yet, 1: no, 2: yes.
    static HAS: AtomicU8 = AtomicU8::new(0);
    if cfg!(all(target_arch = "x86_64", target_feature = "pclmulqdq")) {
        return true;
    }
    match HAS.load(Ordering::Relaxed) {
        0 => {
            let has = detect();
            HAS.store(if has { 2 } else { 1 }, Ordering::Relaxed);
            has
        }
        v => v == 2,
    }
}

/// CPUID leaf 1, ECX bit 1: PCLMULQDQ. Not under Miri, which runs no CPUID.
#[cold]
fn detect() -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // CPUID exists on every x86_64 processor; leaf 1 always.
        let leaf1 = core::arch::x86_64::__cpuid(1);
        leaf1.ecx & (1 << 1) != 0
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        false
    }
}

/// `TABLES[k][b]`: the register's contribution of byte value `b` followed by `k` zero bytes.
static TABLES: [[u32; 256]; 16] = tables();

const fn tables() -> [[u32; 256]; 16] {
    let mut t = [[0u32; 256]; 16];
    let mut b = 0;
    while b < 256 {
        let mut r = b as u32;
        let mut bit = 0;
        while bit < 8 {
            r = if r & 1 != 0 { (r >> 1) ^ POLY } else { r >> 1 };
            bit += 1;
        }
        t[0][b] = r;
        b += 1;
    }
    let mut k = 1;
    while k < 16 {
        let mut b = 0;
        while b < 256 {
            let prev = t[k - 1][b];
            t[k][b] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            b += 1;
        }
        k += 1;
    }
    t
}

/// The register after `data`, one byte at a time (compile-time use, and the reference).
pub const fn bytewise(mut r: u32, data: &[u8]) -> u32 {
    let mut i = 0;
    while i < data.len() {
        r = TABLES[0][((r ^ data[i] as u32) & 0xFF) as usize] ^ (r >> 8);
        i += 1;
    }
    r
}

/// Slice-by-16: 16 bytes per step, each through its own table.
fn slice16(mut r: u32, data: &[u8]) -> u32 {
    let t = &TABLES;
    let (blocks, tail) = data.as_chunks::<16>();
    for c in blocks {
        let w = |i: usize| u32::from_le_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
        let (a, b, c, d) = (w(0) ^ r, w(4), w(8), w(12));
        let at = |k: usize, v: u32, byte: u32| t[k][((v >> (8 * byte)) & 0xFF) as usize];
        r = at(15, a, 0) ^ at(14, a, 1) ^ at(13, a, 2) ^ at(12, a, 3);
        r ^= at(11, b, 0) ^ at(10, b, 1) ^ at(9, b, 2) ^ at(8, b, 3);
        r ^= at(7, c, 0) ^ at(6, c, 1) ^ at(5, c, 2) ^ at(4, c, 3);
        r ^= at(3, d, 0) ^ at(2, d, 1) ^ at(1, d, 2) ^ at(0, d, 3);
    }
    for &b in tail {
        r = t[0][((r ^ u32::from(b)) & 0xFF) as usize] ^ (r >> 8);
    }
    r
}

// ---- The folding constants, from the polynomial. ----

/// x^n mod P, in the polynomial's normal bit order (x^31 in the most significant bit).
const fn xpow_mod(n: u32) -> u32 {
    let mut r: u32 = 1;
    let mut i = 0;
    while i < n {
        let carry = r & 0x8000_0000 != 0;
        r <<= 1;
        if carry {
            r ^= POLY.reverse_bits();
        }
        i += 1;
    }
    r
}

/// The multiplier that moves a 64-bit half of the reflected register `n` bits on: x^n mod P,
/// reflected, shifted left by one (a reflected carry-less product comes out one bit low).
const fn key(n: u32) -> u64 {
    (xpow_mod(n).reverse_bits() as u64) << 1
}

/// floor(x^64 / P), the Barrett constant: 33 bits, reflected.
const fn mu() -> u64 {
    let p = (1u64 << 32) | POLY.reverse_bits() as u64;
    // Long division of x^64 by P: a 65-bit dividend, one quotient bit per step from x^64 down
    // to x^32; `rem` holds the dividend's bits from the current one down (the lower ones are
    // all zero).
    let mut q: u64 = 0;
    let mut rem: u64 = 1 << 32; // x^64, seen from bit 32 down
    let mut i = 64;
    while i >= 32 {
        if rem & (1 << 32) != 0 {
            rem ^= p;
            q |= 1 << (i - 32);
        }
        rem <<= 1;
        i -= 1;
    }
    q.reverse_bits() >> 31
}

/// P with its x^32 term, 33 bits, reflected.
const P_REFLECTED: u64 = (((1u64 << 32) | POLY.reverse_bits() as u64).reverse_bits()) >> 31;

#[cfg(target_arch = "x86_64")]
mod clmul {
    use core::arch::x86_64::{
        __m128i, _mm_and_si128, _mm_clmulepi64_si128, _mm_cvtsi32_si128, _mm_cvtsi128_si32,
        _mm_loadu_si128, _mm_set_epi32, _mm_set_epi64x, _mm_srli_si128, _mm_xor_si128,
    };

    use super::{P_REFLECTED, key, mu, slice16};

    /// The shortest run folded (shorter ones cost less by the tables).
    pub(super) const MIN: usize = 32;

    /// Four blocks on (512 bits): the low half's multiplier, then the high half's.
    const K_FOLD4: (u64, u64) = (key(4 * 128 + 32), key(4 * 128 - 32));
    /// One block on (128 bits).
    const K_FOLD1: (u64, u64) = (key(128 + 32), key(128 - 32));
    /// 64 bits on, for the reduction to 64 bits.
    const K_64: u64 = key(64);
    const MU: u64 = mu();

    /// The register after the bytes of `head`, then `data`, from `r`.
    ///
    /// # Safety
    ///
    /// The processor has PCLMULQDQ.
    #[target_feature(enable = "pclmulqdq")]
    pub(super) unsafe fn update(r: u32, head: &[[u8; 16]], data: &[u8]) -> u32 {
        let (blocks, tail) = data.as_chunks::<16>();
        // One block into a register.
        macro_rules! load {
            ($b:expr) => {{
                let b: &[u8; 16] = $b;
                // SAFETY: an unaligned 16-byte load from a `[u8; 16]`.
                unsafe { _mm_loadu_si128(b.as_ptr().cast::<__m128i>()) }
            }};
        }
        // `x` times the multiplier pair `k`: the block's product, `k`'s bits on.
        macro_rules! fold {
            ($x:expr, $k:expr) => {
                _mm_xor_si128(
                    _mm_clmulepi64_si128($x, $k, 0x00),
                    _mm_clmulepi64_si128($x, $k, 0x11),
                )
            };
        }
        let (first, head, mut rest) = match (head.split_first(), blocks.split_first()) {
            (Some((first, head)), _) => (first, head, blocks),
            (None, Some((first, rest))) => (first, head, rest),
            (None, None) => return slice16(r, data),
        };
        // The register enters as the first four bytes' complement.
        let mut x = _mm_xor_si128(load!(first), _mm_cvtsi32_si128(r as i32));
        let k1 = _mm_set_epi64x(K_FOLD1.1 as i64, K_FOLD1.0 as i64);
        for b in head {
            x = _mm_xor_si128(fold!(x, k1), load!(b));
        }
        if let [b1, b2, b3, more @ ..] = rest {
            let (mut x1, mut x2, mut x3) = (load!(b1), load!(b2), load!(b3));
            let k4 = _mm_set_epi64x(K_FOLD4.1 as i64, K_FOLD4.0 as i64);
            rest = more;
            while let [b0, b1, b2, b3, more @ ..] = rest {
                x = _mm_xor_si128(fold!(x, k4), load!(b0));
                x1 = _mm_xor_si128(fold!(x1, k4), load!(b1));
                x2 = _mm_xor_si128(fold!(x2, k4), load!(b2));
                x3 = _mm_xor_si128(fold!(x3, k4), load!(b3));
                rest = more;
            }
            x = _mm_xor_si128(fold!(x, k1), x1);
            x = _mm_xor_si128(fold!(x, k1), x2);
            x = _mm_xor_si128(fold!(x, k1), x3);
        }
        for b in rest {
            x = _mm_xor_si128(fold!(x, k1), load!(b));
        }
        // 128 bits to 96: the low half moved 64 bits on into the high half.
        let x = _mm_xor_si128(_mm_clmulepi64_si128(x, k1, 0x10), _mm_srli_si128(x, 8));
        // 96 to 64: the low 32 bits moved 32 bits on.
        let low32 = _mm_set_epi32(0, 0, 0, !0);
        let k64 = _mm_set_epi64x(0, K_64 as i64);
        let x = _mm_xor_si128(
            _mm_clmulepi64_si128(_mm_and_si128(x, low32), k64, 0x00),
            _mm_srli_si128(x, 4),
        );
        // Barrett: the quotient's estimate from the low 32 bits times mu, its low 32 bits
        // times P, added; the remainder is in bits 32..64.
        let pmu = _mm_set_epi64x(MU as i64, P_REFLECTED as i64);
        let t1 = _mm_clmulepi64_si128(_mm_and_si128(x, low32), pmu, 0x10);
        let t2 = _mm_clmulepi64_si128(_mm_and_si128(t1, low32), pmu, 0x00);
        let r = _mm_cvtsi128_si32(_mm_srli_si128(_mm_xor_si128(x, t2), 4)) as u32;
        if tail.is_empty() { r } else { slice16(r, tail) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest run the exhaustive tests try (shorter under Miri, which is slow).
    const LONGEST: usize = if cfg!(miri) { 40 } else { 300 };

    /// The check value of CRC-32/ISO-HDLC: the CRC of "123456789".
    #[test]
    fn check_value() {
        assert_eq!(!slice16(INIT, b"123456789"), 0xCBF4_3926);
        assert_eq!(!bytewise(INIT, b"123456789"), 0xCBF4_3926);
        assert_eq!(!update(INIT, b"123456789"), 0xCBF4_3926);
    }

    /// The derived constants are the ones the folding method publishes for this polynomial.
    #[test]
    fn constants() {
        assert_eq!(key(4 * 128 + 32), 0x1_5444_2BD4);
        assert_eq!(key(4 * 128 - 32), 0x1_C6E4_1596);
        assert_eq!(key(128 + 32), 0x1_7519_97D0);
        assert_eq!(key(128 - 32), 0x0_CCAA_009E);
        assert_eq!(key(64), 0x1_63CD_6124);
        assert_eq!(mu(), 0x1_F701_1641);
        assert_eq!(P_REFLECTED, 0x1_DB71_0641);
    }

    /// Every algorithm agrees with the byte-at-a-time one, over every length up to `LONGEST` and
    /// every start within a word, from several registers.
    #[test]
    fn algorithms_agree() {
        let data: [u8; 320] =
            core::array::from_fn(|i| (i as u32).wrapping_mul(2_654_435_761) as u8 ^ (i >> 3) as u8);
        for start in 0..8 {
            for len in 0..=LONGEST {
                let d = &data[start..start + len];
                for r in [INIT, 0, 0x1234_5678] {
                    let want = bytewise(r, d);
                    assert_eq!(slice16(r, d), want, "slice16 start {start} len {len}");
                    assert_eq!(update(r, d), want, "update start {start} len {len}");
                    #[cfg(target_arch = "x86_64")]
                    if len >= 16 && accelerated() {
                        // SAFETY: the processor has PCLMULQDQ.
                        let folded = unsafe { clmul::update(r, &[], d) };
                        assert_eq!(folded, want, "clmul start {start} len {len}");
                    }
                    // The same bytes as whole blocks of a head, then the rest.
                    let (head, _) = d.as_chunks::<16>();
                    for h in 0..=head.len().min(6) {
                        let got = update_blocks(r, &head[..h], &d[h * 16..]);
                        assert_eq!(got, want, "head of {h} start {start} len {len}");
                    }
                }
            }
        }
    }

    /// The folding runs wherever the processor has the instruction (here: the host's).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn folding_where_the_processor_has_it() {
        assert_eq!(accelerated(), std::is_x86_feature_detected!("pclmulqdq"));
    }

    /// Against an independent implementation (`crc32fast`), over long runs of every length
    /// class the folding has (4-block steps, single blocks, a tail).
    #[test]
    fn agrees_with_crc32fast() {
        let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
        let data: Vec<u8> = (0..9000)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect();
        for len in (0..2 * LONGEST).chain([1024, 1500, 4096, 4111, 8999, 9000]) {
            for start in [0, 1, 7] {
                let d = &data[start..(start + len).min(data.len())];
                assert_eq!(
                    !update(INIT, d),
                    crc32fast::hash(d),
                    "len {len} start {start}"
                );
            }
        }
    }
}
