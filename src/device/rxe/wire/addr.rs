//! Addresses derived as Linux derives them (`docs/roce-v2.md`): the UDP source
//! ports of RC and UD queue pairs. GIDs themselves are [`Gid`](crate::verbs::Gid)'s
//! (`from_ipv4`, `link_local_from_mac`, `ipv4`).

/// The UDP source port of an RC or UC QP `local` connected to `remote`: `0xC000 | (fl[13:0] ^
/// fl[19:14])`, where `fl` is the address vector's flow label or, when that is 0, the
/// product of the two QPNs folded to 20 bits. Symmetric in the two QPNs, so both directions
/// of a connection hash alike.
pub fn rc_source_port(local: u32, remote: u32, flow_label: u32) -> u16 {
    let fl = if flow_label & 0xF_FFFF != 0 {
        flow_label & 0xF_FFFF
    } else {
        let mut v = u64::from(local) * u64::from(remote);
        v ^= v >> 20;
        v ^= v >> 40;
        (v & 0xF_FFFF) as u32
    };
    0xC000 | ((fl & 0x3FFF) ^ (fl >> 14)) as u16
}

/// The UDP source port of a UD QP (and of an RC QP before it has a peer): `0xC000` plus the
/// top 14 bits of `qpn × 0x61C88647` (the kernel's 32-bit multiplicative hash).
pub fn ud_source_port(qpn: u32) -> u16 {
    0xC000 + (qpn.wrapping_mul(0x61C8_8647) >> 18) as u16
}
