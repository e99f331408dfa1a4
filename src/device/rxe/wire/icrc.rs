//! The invariant CRC (`docs/roce-v2.md`): CRC-32 (IEEE 802.3) over 8 bytes of 0xFF, the
//! IP and UDP headers and the transport packet, with the fields routers may change masked to
//! all-ones; stored least-significant byte first after the pad.
//!
//! The CRC itself is [`crc32`]: carry-less multiplication folding where the processor has
//! PCLMULQDQ, slice-by-16 otherwise, chosen once. The 8 bytes of 0xFF are the same in every
//! ICRC: the register after them is computed at compile time.

pub mod crc32;

use super::bth::BTH_LEN;
use super::ip::{IPV4_LEN, UDP_LEN};

/// Bytes of the ICRC.
pub const ICRC_LEN: usize = 4;
/// Bytes of an IPv6 header.
const IPV6_LEN: usize = 40;

/// The CRC-32 register after the 8 bytes of 0xFF that open every ICRC's input.
const AFTER_ONES: u32 = crc32::bytewise(crc32::INIT, &[0xFF; 8]);

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
    // The IP, UDP and base transport headers, masked.
    let mut h = [0u8; IPV6_LEN + UDP_LEN + BTH_LEN];
    let h = &mut h[..fixed];
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
    let r = crc32::update(AFTER_ONES, h);
    Some(!crc32::update(r, &packet[fixed..]))
}
