//! The invariant CRC (`docs/roce-v2.md`): CRC-32 (IEEE 802.3) over 8 bytes of 0xFF, the
//! IP and UDP headers and the transport packet, with the fields routers may change masked to
//! all-ones; stored least-significant byte first after the pad.
//!
//! The CRC itself comes from the `crc` crate (its IEEE 802.3 algorithm, a 1 KiB table built
//! at compile time): a well-kept implementation, checked against the sheet's vectors.

use crc::{CRC_32_ISO_HDLC, Crc};

use super::bth::BTH_LEN;
use super::ip::{IPV4_LEN, UDP_LEN};

/// Bytes of the ICRC.
pub const ICRC_LEN: usize = 4;
/// Bytes of an IPv6 header.
const IPV6_LEN: usize = 40;

const CRC32: Crc<u32> = Crc::<u32>::new(&CRC_32_ISO_HDLC);

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
    let mut d = CRC32.digest();
    d.update(&[0xFF; 8]);
    d.update(h);
    d.update(&packet[fixed..]);
    Some(d.finalize())
}
