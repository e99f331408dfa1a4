//! Tests of `crc32.rs`: the CRC-32 encodings against the bitwise reference.

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
                if len >= 16 {
                    let (sse, avx) = folded(r, &[], d);
                    assert_eq!(sse.unwrap_or(want), want, "clmul start {start} len {len}");
                    assert_eq!(avx.unwrap_or(want), want, "avx start {start} len {len}");
                }
            }
        }
    }
}

/// With a mask over the first blocks, every algorithm equals the byte-at-a-time CRC of
/// the data with the mask ORed on, for every length up to `LONGEST`, every mask length
/// (none, shorter than the data, reaching past its end).
#[test]
fn masked_equals_the_bytes_masked() {
    let data: [u8; 320] =
        core::array::from_fn(|i| (i as u32).wrapping_mul(0x9E37_79B1) as u8 ^ (i >> 5) as u8);
    let mask: [[u8; 16]; 5] = core::array::from_fn(|b| {
        core::array::from_fn(|i| [0, 0xFF, 0x0F, 0x81][(b * 7 + i * 3 + i / 5) % 4])
    });
    for len in 0..=LONGEST {
        let d = &data[..len];
        masked_agree::<0>(d, &[]);
        masked_agree::<1>(d, mask.first_chunk().unwrap());
        masked_agree::<2>(d, mask.first_chunk().unwrap());
        masked_agree::<3>(d, mask.first_chunk().unwrap());
        masked_agree::<4>(d, mask.first_chunk().unwrap());
        masked_agree::<5>(d, &mask);
    }
}

/// [`masked_equals_the_bytes_masked`] for one mask.
fn masked_agree<const B: usize>(d: &[u8], m: &[[u8; 16]; B]) {
    let or: Vec<u8> = d
        .iter()
        .enumerate()
        .map(|(i, &b)| b | m.as_flattened().get(i).copied().unwrap_or(0))
        .collect();
    for r in [INIT, 0, 0x1234_5678] {
        let want = bytewise(r, &or);
        let what = format!("len {} mask {B} r {r:#x}", d.len());
        assert_eq!(soft_masked(r, m, d), want, "tables {what}");
        assert_eq!(update_masked(r, m, d), want, "update_masked {what}");
        #[cfg(target_arch = "x86_64")]
        if d.len() >= 16 * B.saturating_sub(1).max(1) {
            let (sse, avx) = folded(r, m, d);
            assert_eq!(sse.unwrap_or(want), want, "clmul {what}");
            assert_eq!(avx.unwrap_or(want), want, "avx {what}");
        }
    }
}

/// The register after `data` (`mask` ORed on) by each folding the processor runs: the
/// SSE encoding's, then the AVX encoding's (`None` for one it does not run).
#[cfg(target_arch = "x86_64")]
fn folded<const B: usize>(r: u32, mask: &[[u8; 16]; B], data: &[u8]) -> (Option<u32>, Option<u32>) {
    // SAFETY: each runs only where `level` found what it needs.
    unsafe {
        (
            accelerated().then(|| clmul::update_masked(r, mask, data)),
            accelerated_avx().then(|| clmul::update_masked_avx(r, mask, data)),
        )
    }
}

/// The folding runs wherever the processor has the instruction (here: the host's), in the
/// AVX encoding where it has AVX too and the system keeps its state.
#[cfg(target_arch = "x86_64")]
#[test]
fn folding_where_the_processor_has_it() {
    let clmul = std::is_x86_feature_detected!("pclmulqdq");
    assert_eq!(accelerated(), clmul);
    assert_eq!(
        accelerated_avx(),
        clmul && std::is_x86_feature_detected!("avx")
    );
}

/// Every length from nothing to past a jumbo frame's payload, at every start within 16
/// bytes (every alignment of the loads), from two registers: the dispatch and each folding
/// the processor runs equal the byte-at-a-time CRC (computed along, one byte more each
/// length).
#[test]
fn every_length_and_alignment() {
    let longest = if cfg!(miri) { 64 } else { 4200 };
    let mut s: u32 = 0x1234_5678;
    let data: Vec<u8> = (0..longest + 16)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s as u8
        })
        .collect();
    let mut reached = 0;
    for start in 0..16 {
        for r in [INIT, 0x0BAD_F00D] {
            let mut want = r;
            for len in 0..=longest {
                let d = &data[start..start + len];
                assert_eq!(update(r, d), want, "update start {start} len {len}");
                #[cfg(target_arch = "x86_64")]
                if len >= 16 {
                    let (sse, avx) = folded(r, &[], d);
                    assert_eq!(sse.unwrap_or(want), want, "clmul start {start} len {len}");
                    assert_eq!(avx.unwrap_or(want), want, "avx start {start} len {len}");
                    reached += usize::from(sse.is_some()) + usize::from(avx.is_some());
                }
                if let Some(&b) = data.get(start + len) {
                    want = step(want, b);
                }
            }
        }
    }
    // The foldings ran wherever the processor has them (the host's: both, on any x86_64
    // processor of the last decade).
    #[cfg(target_arch = "x86_64")]
    if !cfg!(miri) {
        let each = 16 * 2 * (longest + 1 - 16);
        let runs = usize::from(accelerated()) + usize::from(accelerated_avx());
        assert_eq!(reached, each * runs);
    }
    let _ = reached;
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
