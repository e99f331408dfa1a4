//! CRC-32 of IEEE 802.3 (Ethernet's, the one the ICRC uses: polynomial 0x04C11DB7, bits
//! reflected, register preset to all-ones and inverted at the end), in two algorithms:
//!
//! - carry-less multiplication (PCLMULQDQ) folding 64 bytes per step (one or two blocks of
//!   16 per step on short runs), a tail of `t` bytes folded on by x^(8t), then a Barrett
//!   reduction, on x86_64 processors that have the instruction (about 0.4 instructions a
//!   byte); the same code in the AVX encoding where the processor has AVX and the system has
//!   turned its register state on (three-operand forms: no register copy before each
//!   multiplication, the data's unaligned loads folded into the XORs; about 0.3 a byte);
//! - slice-by-16 everywhere else and for short runs: 16 tables of 256 words (16 KiB, built at
//!   compile time), 16 bytes per step (about 3 instructions a byte).
//!
//! Which one runs is decided explicitly: at compile time when the target has `pclmulqdq` (and
//! `avx`), otherwise by one CPUID query (and XGETBV, for the AVX state) at the first CRC,
//! remembered. Every constant is derived below
//! from the polynomial by the definitions of the folding method, none typed in.
//!
//! The functions work on the raw register: start from [`INIT`], feed [`update`] (or
//! [`update_masked`], which ORs a mask onto the data's first blocks as it reads them: the
//! ICRC's fields routers may change), and invert the result.

use core::sync::atomic::{AtomicU8, Ordering};

/// The register before the first byte.
pub const INIT: u32 = !0;

/// The polynomial, bits reflected (x^0 in the most significant bit).
const POLY: u32 = 0xEDB8_8320;

/// The register after `data`, from `r`.
pub fn update(r: u32, data: &[u8]) -> u32 {
    update_masked(r, &[], data)
}

/// The register after `data` with its bytes ORed with `mask` (block `i` of `data` with
/// `mask[i]`; mask bytes past `data`'s end ignored), from `r`: the ICRC's masked headers read
/// in place, with no copy.
#[inline(always)]
pub fn update_masked<const B: usize>(r: u32, mask: &[[u8; 16]; B], data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= clmul::MIN.max(16 * B.saturating_sub(1)) {
        match level() {
            // SAFETY: the processor has PCLMULQDQ and AVX, and the system keeps the AVX
            // state (`level`); SSE2 is part of x86_64.
            AVX => return unsafe { clmul::update_masked_avx(r, mask, data) },
            // SAFETY: the processor has PCLMULQDQ (`level`); SSE2 is part of x86_64.
            CLMUL => return unsafe { clmul::update_masked(r, mask, data) },
            _ => {}
        }
    }
    soft_masked(r, mask, data)
}

/// [`update_masked`] by the tables (the processors without PCLMULQDQ).
pub(super) fn soft_masked(mut r: u32, mask: &[[u8; 16]], data: &[u8]) -> u32 {
    let (blocks, tail) = data.as_chunks::<16>();
    let n = mask.len().min(blocks.len());
    for (b, m) in blocks[..n].iter().zip(mask) {
        let v: [u8; 16] = core::array::from_fn(|i| b[i] | m[i]);
        r = slice16(r, &v);
    }
    r = slice16(r, blocks[n..].as_flattened());
    match mask.get(blocks.len()) {
        Some(m) => tail.iter().zip(m).fold(r, |r, (&b, &m)| step(r, b | m)),
        None => slice16(r, tail),
    }
}

/// [`level`]: the tables only.
const TABLES_ONLY: u8 = 1;
/// [`level`]: PCLMULQDQ.
const CLMUL: u8 = 2;
/// [`level`]: PCLMULQDQ, and AVX with its state kept by the system.
const AVX: u8 = 3;

/// Whether [`update`] folds with PCLMULQDQ on this processor.
#[inline(always)]
pub fn accelerated() -> bool {
    level() >= CLMUL
}

/// Whether [`update`] folds with PCLMULQDQ in the AVX encoding on this processor.
#[inline(always)]
pub fn accelerated_avx() -> bool {
    level() == AVX
}

/// What the processor has: [`TABLES_ONLY`], [`CLMUL`] or [`AVX`].
#[inline(always)]
fn level() -> u8 {
    /// 0: not asked yet, else the level.
    static HAS: AtomicU8 = AtomicU8::new(0);
    if cfg!(all(
        target_arch = "x86_64",
        target_feature = "pclmulqdq",
        target_feature = "avx"
    )) {
        return AVX;
    }
    match HAS.load(Ordering::Relaxed) {
        0 => {
            let has = detect();
            HAS.store(has, Ordering::Relaxed);
            has
        }
        v => v,
    }
}

/// CPUID leaf 1, ECX bit 1: PCLMULQDQ (or the target has it); then bit 28, AVX, with bit 27,
/// OSXSAVE (the system turned XSAVE on: XGETBV may run), and XCR0 bits 1 and 2 (the system
/// keeps the SSE and AVX registers' state). Not under Miri, which runs no CPUID.
#[cold]
fn detect() -> u8 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // CPUID exists on every x86_64 processor; leaf 1 always.
        let leaf1 = core::arch::x86_64::__cpuid(1);
        let clmul = cfg!(target_feature = "pclmulqdq") || leaf1.ecx & (1 << 1) != 0;
        if !clmul {
            return TABLES_ONLY;
        }
        let (osxsave, avx) = (1 << 27, 1 << 28);
        if leaf1.ecx & (osxsave | avx) != osxsave | avx {
            return CLMUL;
        }
        // SAFETY: OSXSAVE is set: the system enabled XSAVE, so XGETBV (register 0) runs.
        let xcr0 = unsafe { core::arch::x86_64::_xgetbv(0) };
        if xcr0 & 0b110 == 0b110 { AVX } else { CLMUL }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        TABLES_ONLY
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

/// The register after one byte.
#[inline(always)]
fn step(r: u32, b: u8) -> u32 {
    TABLES[0][((r ^ u32::from(b)) & 0xFF) as usize] ^ (r >> 8)
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
    tail.iter().fold(r, |r, &b| step(r, b))
}

// ---- The folding constants, from the polynomial. ----

/// x^n mod P, in the polynomial's normal bit order (x^31 in the most significant bit); `n`
/// may be negative (P's constant term is 1, so x has an inverse modulo P).
const fn xpow_mod(n: i32) -> u32 {
    let normal = POLY.reverse_bits();
    let mut r: u32 = 1;
    let mut i = 0;
    while i < n.unsigned_abs() {
        r = if n > 0 {
            // Times x: the x^32 that leaves the register is replaced by P's lower terms.
            let carry = r & 0x8000_0000 != 0;
            (r << 1) ^ if carry { normal } else { 0 }
        } else if r & 1 != 0 {
            // Divided by x: r + P is divisible by x, and P's x^32 term becomes x^31.
            ((r ^ normal) >> 1) | 0x8000_0000
        } else {
            r >> 1
        };
        i += 1;
    }
    r
}

/// The multiplier that moves a 64-bit half of the reflected register `n` bits on: x^n mod P,
/// reflected, shifted left by one (a reflected carry-less product comes out one bit low).
const fn key(n: i32) -> u64 {
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
        _mm_loadu_si128, _mm_or_si128, _mm_set_epi32, _mm_set_epi64x, _mm_setzero_si128,
        _mm_srli_si128, _mm_xor_si128,
    };

    use super::{P_REFLECTED, key, mu};

    /// The shortest run folded (shorter ones cost less by the tables).
    pub(super) const MIN: usize = 32;

    /// Four blocks on (512 bits): the low half's multiplier, then the high half's.
    const K_FOLD4: (u64, u64) = (key(4 * 128 + 32), key(4 * 128 - 32));
    /// One block on (128 bits).
    const K_FOLD1: (u64, u64) = (key(128 + 32), key(128 - 32));
    /// Two blocks on (256 bits).
    const K_FOLD2: (u64, u64) = (key(2 * 128 + 32), key(2 * 128 - 32));
    /// For a tail of `t` bytes (`TAIL[t]`, `t` below 16): the multipliers that move the state
    /// `t` bytes on, and the mask that keeps the last `t` bytes of a block. One aligned
    /// entry: both loads from one address.
    #[repr(C, align(16))]
    struct Tail {
        keys: [u64; 2],
        keep: [u8; 16],
    }
    static TAIL: [Tail; 16] = {
        let mut all = [const {
            Tail {
                keys: [0; 2],
                keep: [0; 16],
            }
        }; 16];
        let mut t = 0;
        while t < 16 {
            all[t].keys = [key(8 * t as i32 + 32), key(8 * t as i32 - 32)];
            let mut i = 16 - t;
            while i < 16 {
                all[t].keep[i] = 0xFF;
                i += 1;
            }
            t += 1;
        }
        all
    };
    /// 64 bits on, for the reduction to 64 bits.
    const K_64: u64 = key(64);
    const MU: u64 = mu();

    /// The folding function `$name`, compiled for the processor features `$features`: the
    /// same source for the SSE and the AVX encodings.
    macro_rules! folding {
        ($(#[$doc:meta])* $name:ident, $features:literal) => {
            $(#[$doc])*
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<const B: usize>(
                r: u32,
                mask: &[[u8; 16]; B],
                data: &[u8],
            ) -> u32 {
        let n = data.len();
        if n < 16 * B.saturating_sub(1).max(1) {
            return super::soft_masked(r, mask, data);
        }
        let (blocks, t) = (n / 16, n % 16);
        let p = data.as_ptr();
        // The 16 bytes of `data` from `$at`, which is at most `n - 16`.
        macro_rules! at {
            ($at:expr) => {{
                let at: usize = $at;
                debug_assert!(at + 16 <= n);
                // SAFETY: `at + 16 <= n` (each use says why): the bytes lie within `data`.
                unsafe { _mm_loadu_si128(p.add(at).cast::<__m128i>()) }
            }};
        }
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
        let zero = _mm_setzero_si128();
        let k1 = _mm_set_epi64x(K_FOLD1.1 as i64, K_FOLD1.0 as i64);
        // The register enters as the first four bytes' complement (`n >= 16`).
        let first = _mm_or_si128(at!(0), mask.first().map_or(zero, |m| load!(m)));
        let mut x = _mm_xor_si128(first, _mm_cvtsi32_si128(r as i32));
        // Block `i` and its mask next.
        let mut i = 1;
        macro_rules! masked {
            ($m:expr) => {
                x = _mm_xor_si128(fold!(x, k1), _mm_or_si128(at!(16 * i), load!($m)));
                i += 1;
            };
        }
        // The masked blocks: all but the last whole (`n >= 16 * (B - 1)`, so `16 * i + 16 <=
        // n`), the first two of them without a loop (`i` and `B` constants there), any more
        // in one; the last where it is whole (`i < blocks`).
        if i + 1 < B {
            masked!(&mask[i]);
        }
        if i + 1 < B {
            masked!(&mask[i]);
        }
        while i + 1 < B {
            masked!(&mask[i]);
        }
        if let Some(m) = mask.get(i)
            && i < blocks
        {
            masked!(m);
        }
        // The rest, where there is one (a short packet ends in its masked blocks).
        if i < blocks {
            // Four at a time from eight blocks on: four running states, the first `x`, over
            // whole groups of four (one offset and one end a step), the last few one at a
            // time.
            if blocks - i >= 8 {
                let mut a = 16 * i;
                // `a + 48 <= n - 16` (eight blocks left).
                let (mut x1, mut x2, mut x3) = (at!(a), at!(a + 16), at!(a + 32));
                a += 48;
                // At least one group (five blocks left at least).
                let end = a + (16 * blocks - a) / 64 * 64;
                let k4 = _mm_set_epi64x(K_FOLD4.1 as i64, K_FOLD4.0 as i64);
                loop {
                    // `a + 64 <= end <= 16 * blocks <= n`.
                    x = _mm_xor_si128(fold!(x, k4), at!(a));
                    x1 = _mm_xor_si128(fold!(x1, k4), at!(a + 16));
                    x2 = _mm_xor_si128(fold!(x2, k4), at!(a + 32));
                    x3 = _mm_xor_si128(fold!(x3, k4), at!(a + 48));
                    a += 64;
                    if a == end {
                        break;
                    }
                }
                x = _mm_xor_si128(fold!(x, k1), x1);
                x = _mm_xor_si128(fold!(x, k1), x2);
                x = _mm_xor_si128(fold!(x, k1), x3);
                // `a + 16 <= 16 * blocks <= n`.
                while a < 16 * blocks {
                    x = _mm_xor_si128(fold!(x, k1), at!(a));
                    a += 16;
                }
            } else {
                // Fewer: two at a time (`i + 2 <= blocks`), then the last one.
                let k2 = _mm_set_epi64x(K_FOLD2.1 as i64, K_FOLD2.0 as i64);
                while blocks - i >= 2 {
                    let b = _mm_xor_si128(fold!(at!(16 * i), k1), at!(16 * i + 16));
                    x = _mm_xor_si128(fold!(x, k2), b);
                    i += 2;
                }
                if i < blocks {
                    x = _mm_xor_si128(fold!(x, k1), at!(16 * i));
                }
            }
        }
        // A tail of `t` bytes: the state moved `t` bytes on, plus the tail as the end of a
        // block: the end of the data's last 16 bytes (`n >= 16`), with the mask of the same
        // bytes where the mask reaches that far.
        if t != 0 {
            let at = n - 16;
            let m = mask
                .as_flattened()
                .get(at..)
                .and_then(|m| m.first_chunk::<16>());
            let last = _mm_or_si128(at!(at), m.map_or(zero, |m| load!(m)));
            let Tail { keys, keep } = &TAIL[t];
            let last = _mm_and_si128(last, load!(keep));
            // SAFETY: an unaligned 16-byte load from a `[u64; 2]`.
            let keys = unsafe { _mm_loadu_si128(keys.as_ptr().cast::<__m128i>()) };
            x = _mm_xor_si128(fold!(x, keys), last);
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
        _mm_cvtsi128_si32(_mm_srli_si128(_mm_xor_si128(x, t2), 4)) as u32
    }
        };
    }

    folding!(
        /// [`super::update_masked`] by folding.
        ///
        /// # Safety
        ///
        /// The processor has PCLMULQDQ.
        update_masked,
        "pclmulqdq"
    );

    folding!(
        /// [`super::update_masked`] by folding, in the AVX encoding.
        ///
        /// # Safety
        ///
        /// The processor has PCLMULQDQ and AVX, and the system keeps the AVX state (XCR0).
        update_masked_avx,
        "pclmulqdq,avx"
    );
}

#[cfg(test)]
#[path = "crc32_tests.rs"]
mod tests;
