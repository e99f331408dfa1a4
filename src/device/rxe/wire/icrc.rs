//! The invariant CRC (`docs/roce-v2.md` §4): CRC-32 (IEEE 802.3) over 8 bytes of 0xFF, the
//! IP and UDP headers and the transport packet, with the fields routers may change masked to
//! all-ones; stored least-significant byte first after the pad.
//!
//! The CRC itself is [`crc32`]: carry-less multiplication folding where the processor has
//! PCLMULQDQ, slice-by-16 otherwise, chosen once; one pass over the masked headers (staged
//! with the 8 bytes of 0xFF into whole 16-byte blocks) and the rest of the packet.

pub mod crc32;

use super::bth::BTH_LEN;
use super::ip::{IPV4_LEN, UDP_LEN};
use super::{chunk, put};

/// Bytes of the ICRC.
pub const ICRC_LEN: usize = 4;
/// Bytes of an IPv6 header.
const IPV6_LEN: usize = 40;

/// The ICRC of `packet`: the IP packet from its header up to the end of the pad (the ICRC
/// itself excluded), IPv4 without options or IPv6. `None` when the packet is too short to
/// hold the IP, UDP and base transport headers, or is not IPv4 or IPv6.
///
/// One pass, with no partial block at either end: the CRC register that starts all-ones and
/// takes 8 bytes of 0xFF equals the one that starts at zero and takes `00 00 00 00 FF FF FF
/// FF` (the start value is the same as the complement of the first four bytes), and a
/// register at zero stays zero over zero bytes. So the masked headers are staged after as
/// many zero bytes as make the whole stream end on a block boundary; the CRC folds the
/// staged blocks, then the rest of the packet in place, in whole blocks.
pub fn icrc(packet: &[u8]) -> Option<u32> {
    match packet.first()? >> 4 {
        4 => icrc_v4(packet),
        6 => staged::<IPV6_LEN, { IPV6_LEN + UDP_LEN + BTH_LEN }, 7>(packet),
        _ => None,
    }
}

/// [`icrc`] of an IPv4 packet, inlined where it is called: for a frame of a length known
/// there (an acknowledgement's), the staging's offsets are constants. `None` as [`icrc`].
#[inline(always)]
pub fn icrc_v4(packet: &[u8]) -> Option<u32> {
    staged::<IPV4_LEN, { IPV4_LEN + UDP_LEN + BTH_LEN }, 5>(packet)
}

/// [`icrc`] for an IP header of `IP` bytes; `FIXED` is the IP, UDP and base transport
/// headers' length, `BLOCKS` the staged blocks (up to 23 bytes before the packet, `FIXED`
/// bytes and a block after them: `(23 + FIXED + 16).div_ceil(16)`).
#[inline(always)]
fn staged<const IP: usize, const FIXED: usize, const BLOCKS: usize>(packet: &[u8]) -> Option<u32> {
    const { assert!(BLOCKS * 16 >= 23 + FIXED + 16 && FIXED >= 16) };
    let len = packet.len();
    let headers = packet.first_chunk::<FIXED>()?;
    // Where the packet starts in the staged blocks: 8 to 23, so that `at + len` is a whole
    // number of blocks.
    let at = 8 + (len + 8).wrapping_neg() % 16;
    // The staged blocks end after the headers, on a block boundary; `at + len` is one too
    // and not below it, so the packet holds the `staged` bytes (FIXED to FIXED + 15).
    let end = (at + FIXED).next_multiple_of(16);
    let staged = end - at;
    // Zeroed as one fixed-size value (at opt-level "z" an array repeat is a store loop).
    let mut blocks = const { [[0u8; 16]; BLOCKS] };
    let b = blocks.as_flattened_mut();
    put(b, at - 4, [0xFF; 4]);
    // The staged bytes as two fixed-size copies: the headers, and the 16 bytes that end
    // the staged part (overlapping the headers when fewer than 16 follow them).
    put(b, at + staged - 16, *chunk::<16>(packet, staged - 16));
    // The headers as an array: the masks below are stores at fixed offsets, no bounds check.
    let h = b.get_mut(at..)?.first_chunk_mut::<FIXED>()?;
    *h = *headers;
    if IP == IPV4_LEN {
        h[1] = 0xFF; // TOS
        h[8] = 0xFF; // TTL
        h[10] = 0xFF; // header checksum
        h[11] = 0xFF;
    } else {
        h[0] |= 0x0F; // traffic class and flow label (the version stays)
        h[1] = 0xFF;
        h[2] = 0xFF;
        h[3] = 0xFF;
        h[7] = 0xFF; // hop limit
    }
    h[IP + 6] = 0xFF; // UDP checksum
    h[IP + 7] = 0xFF;
    h[IP + UDP_LEN + 4] = 0xFF; // FECN, BECN, reserved
    let r = crc32::update_blocks(0, blocks.get(..end / 16)?, packet.get(staged..)?);
    Some(!r)
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

    /// Every length from the bare headers to well past the staged blocks, IPv4 and IPv6: the
    /// one-pass CRC over the staged headers equals the definition.
    #[test]
    fn one_pass_equals_the_definition() {
        let mut s: u32 = 0x2545_F491;
        let body: std::vec::Vec<u8> = (0..400)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                s as u8
            })
            .collect();
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
        for (version, ip_len, masked) in [(0x45u8, IPV4_LEN, &v4), (0x60, IPV6_LEN, &v6)] {
            let fixed = ip_len + UDP_LEN + BTH_LEN;
            for len in fixed..fixed + if cfg!(miri) { 40 } else { 300 } {
                let mut p = body[..len].to_vec();
                p[0] = version;
                assert_eq!(
                    icrc(&p),
                    Some(reference(&p, ip_len, masked)),
                    "{version:#x} {len}"
                );
            }
        }
    }
}
