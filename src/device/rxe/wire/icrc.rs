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

/// Bytes of the ICRC.
pub const ICRC_LEN: usize = 4;
/// Bytes of an IPv6 header.
const IPV6_LEN: usize = 40;

/// The 8 bytes of 0xFF, the IP, UDP and base transport headers (IPv6), and up to a block of
/// what follows them: the blocks the CRC starts with.
const STAGED: usize = (8 + IPV6_LEN + UDP_LEN + BTH_LEN).div_ceil(16);

/// The ICRC of `packet`: the IP packet from its header up to the end of the pad (the ICRC
/// itself excluded), IPv4 without options or IPv6. `None` when the packet is too short to
/// hold the IP, UDP and base transport headers, or is not IPv4 or IPv6.
pub fn icrc(packet: &[u8]) -> Option<u32> {
    let ip_len = match packet.first()? >> 4 {
        4 => IPV4_LEN,
        6 => IPV6_LEN,
        _ => return None,
    };
    let fixed = ip_len + UDP_LEN + BTH_LEN;
    if packet.len() < fixed {
        return None;
    }
    // The 8 bytes of 0xFF, then the IP, UDP and base transport headers, masked, then the
    // packet's next bytes up to a whole block: the CRC runs over these blocks and the rest of
    // the packet in one pass.
    let mut blocks = [[0xFFu8; 16]; STAGED];
    let staged = blocks.as_flattened_mut();
    let h = &mut staged[8..8 + fixed];
    h.copy_from_slice(&packet[..fixed]);
    if ip_len == IPV4_LEN {
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
    h[ip_len + 6] = 0xFF; // UDP checksum
    h[ip_len + 7] = 0xFF;
    h[ip_len + UDP_LEN + 4] = 0xFF; // FECN, BECN, reserved
    let head = 8 + fixed;
    let more = (head.next_multiple_of(16) - head).min(packet.len() - fixed);
    staged[head..head + more].copy_from_slice(&packet[fixed..fixed + more]);
    let end = head + more;
    let r = if end.is_multiple_of(16) {
        crc32::update_blocks(crc32::INIT, &blocks[..end / 16], &packet[fixed + more..])
    } else {
        // The packet ends inside the staged bytes.
        crc32::update(crc32::INIT, &staged[..end])
    };
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
