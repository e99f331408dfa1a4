//! The invariant CRC (`docs/roce-v2.md` §4): CRC-32 (IEEE 802.3) over 8 bytes of 0xFF, the
//! IP and UDP headers and the transport packet, with the fields routers may change masked to
//! all-ones; stored least-significant byte first after the pad.
//!
//! The CRC itself is [`crc32`]: carry-less multiplication folding where the processor has
//! PCLMULQDQ, slice-by-16 otherwise, chosen once; one pass over the packet in place, the
//! masks ORed onto its header blocks as they are read, the 8 bytes of 0xFF a constant
//! register.

pub mod crc32;

use super::bth::BTH_LEN;
use super::ip::{IPV4_LEN, UDP_LEN};

/// Bytes of the ICRC.
pub const ICRC_LEN: usize = 4;
/// Bytes of an IPv6 header.
const IPV6_LEN: usize = 40;

/// The ICRC of `packet`: the IP packet from its header up to the end of the pad (the ICRC
/// itself excluded), IPv4 without options or IPv6. `None` when the packet is too short to
/// hold the IP, UDP and base transport headers, or is not IPv4 or IPv6.
pub fn icrc(packet: &[u8]) -> Option<u32> {
    match packet.first()? >> 4 {
        4 => icrc_v4(packet),
        6 => masked::<{ IPV6_LEN + UDP_LEN + BTH_LEN }, 4>(packet, &MASK_V6.0),
        _ => None,
    }
}

/// [`icrc`] of an IPv4 packet (the version is not looked at). `None` as [`icrc`].
#[inline(always)]
pub fn icrc_v4(packet: &[u8]) -> Option<u32> {
    masked::<{ IPV4_LEN + UDP_LEN + BTH_LEN }, 3>(packet, &MASK_V4.0)
}

/// The register after the 8 bytes of 0xFF that precede the packet.
const ONES: u32 = crc32::bytewise(crc32::INIT, &[0xFF; 8]);

/// The fields routers may change, as the blocks ORed onto the packet's first bytes: TOS,
/// TTL and header checksum of IPv4, the UDP checksum, BTH byte 4 (FECN, BECN, reserved).
static MASK_V4: Aligned<[[u8; 16]; 3]> = Aligned(mask(
    &[
        1,
        8,
        10,
        11,
        IPV4_LEN + 6,
        IPV4_LEN + 7,
        IPV4_LEN + UDP_LEN + 4,
    ],
    0,
));

/// As [`MASK_V4`] for IPv6: traffic class and flow label (the version stays), hop limit.
static MASK_V6: Aligned<[[u8; 16]; 4]> = Aligned(mask(
    &[
        1,
        2,
        3,
        7,
        IPV6_LEN + 6,
        IPV6_LEN + 7,
        IPV6_LEN + UDP_LEN + 4,
    ],
    0x0F,
));

/// Masks on a 16-byte boundary: the folding ORs them on straight from memory.
#[repr(C, align(16))]
struct Aligned<T>(T);

/// Blocks with 0xFF at the bytes `at` and `first` in byte 0.
const fn mask<const B: usize>(at: &[usize], first: u8) -> [[u8; 16]; B] {
    let mut m = [[0; 16]; B];
    m[0][0] = first;
    let mut i = 0;
    while i < at.len() {
        m[at[i] / 16][at[i] % 16] = 0xFF;
        i += 1;
    }
    m
}

/// [`icrc`] with `FIXED` bytes of IP, UDP and base transport headers, masked by `mask`.
#[inline(always)]
fn masked<const FIXED: usize, const B: usize>(packet: &[u8], mask: &[[u8; 16]; B]) -> Option<u32> {
    packet.first_chunk::<FIXED>()?;
    Some(!crc32::update_masked(ONES, mask, packet))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, byte by byte: 8 bytes of 0xFF, the masked headers, the rest.
    fn reference(packet: &[u8], ip_len: usize, masked: &[usize]) -> u32 {
        let mut bytes = std::vec![0xFFu8; 8];
        bytes.extend_from_slice(packet);
        for &at in masked {
            bytes[8 + at] = 0xFF;
        }
        if ip_len == IPV6_LEN {
            bytes[8] = packet[0] | 0x0F;
        }
        !crc32::bytewise(crc32::INIT, &bytes)
    }

    /// Every length from nothing to well past the masked blocks, IPv4 and IPv6, several
    /// random packets each (every byte random but the version nibble: any opcode, any field,
    /// the masked ones too): the ICRC by the dispatch (the folding, on a processor with
    /// PCLMULQDQ) and by the tables both equal the definition; a packet shorter than its
    /// headers has none.
    #[test]
    fn one_pass_equals_the_definition() {
        let v4 = [
            1,
            8,
            10,
            11,
            IPV4_LEN + 6,
            IPV4_LEN + 7,
            IPV4_LEN + UDP_LEN + 4,
        ];
        let v6 = [
            1,
            2,
            3,
            7,
            IPV6_LEN + 6,
            IPV6_LEN + 7,
            IPV6_LEN + UDP_LEN + 4,
        ];
        let (seeds, longest): (u32, usize) = if cfg!(miri) { (1, 100) } else { (8, 420) };
        for seed in 0..seeds {
            let mut s: u32 = 0x2545_F491 ^ seed.wrapping_mul(0x9E37_79B9);
            let body: std::vec::Vec<u8> = (0..longest)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 17;
                    s ^= s << 5;
                    s as u8
                })
                .collect();
            let v4_case = (0x40, IPV4_LEN, &v4[..], MASK_V4.0.as_slice());
            for (version, ip_len, masked, mask) in [v4_case, (0x60, IPV6_LEN, &v6, &MASK_V6.0)] {
                for len in 0..=longest {
                    let mut p = body[..len].to_vec();
                    if let Some(b) = p.first_mut() {
                        *b = version | (*b & 0x0F);
                    }
                    let what = std::format!("{version:#x} seed {seed} len {len}");
                    if len < ip_len + UDP_LEN + BTH_LEN {
                        assert_eq!(icrc(&p), None, "{what}");
                        continue;
                    }
                    let want = reference(&p, ip_len, masked);
                    assert_eq!(icrc(&p), Some(want), "{what}");
                    assert_eq!(!crc32::soft_masked(ONES, mask, &p), want, "tables {what}");
                }
            }
        }
    }
}
