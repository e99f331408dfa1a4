//! RoCEv2 over IPv6 (`docs/roce-v2.md` §1, §4, §5): the IPv6 header (no extension headers,
//! as RoCE sends it), whole frames built from an [`Ipv6Route`] and parsed with the checks
//! the IPv4 path makes: every length a peer wrote bounded before use, a non-zero UDP
//! checksum verified over the IPv6 pseudo-header, the BTH checked, the ICRC with IPv6's mask.
//!
//! The IPv4 path keeps its fixed-offset builders and its parse ([`super::packet`]); this
//! one is apart, so that IPv4 frames cost what they did.

use super::bth::{BTH_LEN, Headers};
use super::eth::ETHERTYPE_IPV4;
use super::eth::{ETH_LEN, EthHeader, Mac};
use super::icrc::{ICRC_LEN, icrc, icrc_v4};
use super::ip::{IPV4_LEN, Ipv4Header, PROTO_UDP, ROCE_PORT, UDP_LEN, UdpHeader};
use super::{Discard, be16, be32, chunk, put};

/// Bytes of an IPv6 header (extension headers apart; RoCE sends none).
pub const IPV6_LEN: usize = 40;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;
/// Next-header number of ICMPv6.
pub const PROTO_ICMPV6: u8 = 58;
/// Bytes before the transport headers of a RoCEv2 frame over IPv6.
pub const ROCE6_OFFSET: usize = ETH_LEN + IPV6_LEN + UDP_LEN;

/// An IPv6 address.
pub type Ip6 = [u8; 16];

/// The fields of an IPv6 header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv6Header {
    /// Traffic class (the address vector's).
    pub traffic_class: u8,
    /// Flow label (20 bits; the address vector's).
    pub flow_label: u32,
    /// Payload length: the bytes after this header.
    pub payload_len: u16,
    /// Next header (17: UDP, 58: ICMPv6).
    pub next_header: u8,
    /// Hop limit (the address vector's).
    pub hop_limit: u8,
    /// Source address.
    pub src: Ip6,
    /// Destination address.
    pub dst: Ip6,
}

impl Ipv6Header {
    /// The header at the start of `packet` (the frame after Ethernet): version 6, with a
    /// payload length the packet holds ([`Discard::Truncated`] otherwise; trailing Ethernet
    /// padding is allowed). A version other than 6 is [`Discard::NotRoce`].
    pub fn parse(packet: &[u8]) -> Result<Self, Discard> {
        let h = packet.first_chunk::<IPV6_LEN>().ok_or(Discard::Truncated)?;
        if h[0] >> 4 != 6 {
            return Err(Discard::NotRoce);
        }
        let payload_len = be16(h, 4);
        if usize::from(payload_len) > packet.len() - IPV6_LEN {
            return Err(Discard::Truncated);
        }
        let first = be32(h, 0);
        Ok(Ipv6Header {
            traffic_class: (first >> 20) as u8,
            flow_label: first & 0xF_FFFF,
            payload_len,
            next_header: h[6],
            hop_limit: h[7],
            src: *chunk(h, 8),
            dst: *chunk(h, 24),
        })
    }

    /// Writes the header into `out` (the flow label's low 20 bits).
    pub fn write(&self, out: &mut [u8; IPV6_LEN]) {
        let first = 6 << 28 | u32::from(self.traffic_class) << 20 | self.flow_label & 0xF_FFFF;
        put(out, 0, first.to_be_bytes());
        put(out, 4, self.payload_len.to_be_bytes());
        out[6] = self.next_header;
        out[7] = self.hop_limit;
        put(out, 8, self.src);
        put(out, 24, self.dst);
    }
}

/// The Internet checksum's ones'-complement sum of `bytes` (16-bit big-endian words, an odd
/// last byte the high half of one) added to `sum`, folded to 16 bits, not complemented. The
/// IPv6 path's own (the IPv4 path's [`super::ip::ones_sum`] stays inlined where it is used).
pub fn sum16(sum: u32, bytes: &[u8]) -> u32 {
    let mut s = u64::from(sum);
    let mut words = bytes.chunks_exact(2);
    for w in &mut words {
        s += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        s += u64::from(*last) << 8;
    }
    // Bounded: each fold at least halves the bits above 16.
    while s > 0xFFFF {
        s = (s & 0xFFFF) + (s >> 16);
    }
    s as u32
}

/// The ones'-complement sum of the IPv6 pseudo-header (RFC 8200 §8.1) of an upper-layer
/// packet of `len` bytes with next header `next` from `src` to `dst`, not complemented.
pub fn pseudo_sum(src: &Ip6, dst: &Ip6, len: u32, next: u8) -> u32 {
    let s = sum16(0, src);
    let s = sum16(s, dst);
    let s = sum16(s, &len.to_be_bytes());
    sum16(s, &[0, 0, 0, next])
}

/// Where a RoCEv2 frame over IPv6 goes and what its outer headers carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv6Route {
    /// The sender's MAC.
    pub src_mac: Mac,
    /// The next hop's MAC.
    pub dst_mac: Mac,
    /// The sender's IPv6 address (its GID).
    pub src: Ip6,
    /// The receiver's IPv6 address (the destination GID).
    pub dst: Ip6,
    /// Traffic class (the address vector's).
    pub traffic_class: u8,
    /// Flow label (the address vector's, 20 bits).
    pub flow_label: u32,
    /// Hop limit (the address vector's).
    pub hop_limit: u8,
    /// The UDP source port ([`super::addr`]).
    pub src_port: u16,
}

/// Builds a whole RoCEv2 frame over IPv6 with `headers` and `payload` into `buf` (the BTH's
/// pad count set from the payload's length; the UDP checksum 0, as rxe sends it) and
/// returns its length. `None` when the headers cannot be written (an extended header the
/// opcode needs is absent) or the frame would not fit `buf` or an IPv6 payload length.
pub fn build6(
    buf: &mut [u8],
    route: &Ipv6Route,
    headers: &Headers,
    payload: &[u8],
) -> Option<usize> {
    let pad = payload.len().wrapping_neg() & 3;
    let transport = buf.get_mut(ROCE6_OFFSET..)?;
    let hlen = headers.write(transport)?;
    transport[1] = (transport[1] & !0x30) | (pad as u8) << 4;
    let udp_len = UDP_LEN + hlen + payload.len() + pad + ICRC_LEN;
    let end = ETH_LEN + IPV6_LEN + udp_len;
    if end > buf.len() || udp_len > usize::from(u16::MAX) {
        return None;
    }
    let at = ROCE6_OFFSET + hlen;
    buf.get_mut(at..at + payload.len())?
        .copy_from_slice(payload);
    buf.get_mut(at + payload.len()..end - ICRC_LEN)?.fill(0);
    EthHeader {
        dst: route.dst_mac,
        src: route.src_mac,
        ethertype: ETHERTYPE_IPV6,
    }
    .write(buf.first_chunk_mut()?);
    Ipv6Header {
        traffic_class: route.traffic_class,
        flow_label: route.flow_label,
        payload_len: udp_len as u16,
        next_header: PROTO_UDP,
        hop_limit: route.hop_limit,
        src: route.src,
        dst: route.dst,
    }
    .write(buf.get_mut(ETH_LEN..)?.first_chunk_mut()?);
    UdpHeader {
        src_port: route.src_port,
        dst_port: ROCE_PORT,
        len: udp_len as u16,
        checksum: 0,
    }
    .write(buf.get_mut(ETH_LEN + IPV6_LEN..)?.first_chunk_mut()?);
    let crc = icrc(buf.get(ETH_LEN..end - ICRC_LEN)?)?;
    put(buf, end - ICRC_LEN, crc.to_le_bytes());
    Some(end)
}

/// A RoCEv2 packet over IPv6, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet6<'a> {
    /// The sender's MAC.
    pub src_mac: Mac,
    /// The destination MAC.
    pub dst_mac: Mac,
    /// The IPv6 header.
    pub ip: Ipv6Header,
    /// The UDP header.
    pub udp: UdpHeader,
    /// The base transport header and its extended headers.
    pub headers: Headers,
    /// The payload, without pad and ICRC.
    pub payload: &'a [u8],
}

/// Looks at an Ethernet frame as RoCEv2 over IPv6: `Ok(None)` when it is not IPv6 UDP to
/// port 4791 (for the IP stack: ICMPv6, other UDP, extension headers); `Ok(Some)` a packet
/// whose every length, the UDP checksum when it is not zero, the BTH and the ICRC were
/// checked; `Err` the reason such a packet is dropped.
pub fn parse6(frame: &[u8]) -> Result<Option<Packet6<'_>>, Discard> {
    let eth = EthHeader::parse(frame)?;
    if eth.ethertype != ETHERTYPE_IPV6 {
        return Ok(None);
    }
    let body = frame.get(ETH_LEN..).ok_or(Discard::Truncated)?;
    let ip = match Ipv6Header::parse(body) {
        Ok(ip) => ip,
        Err(Discard::NotRoce) => return Ok(None),
        Err(d) => return Err(d),
    };
    if ip.next_header != PROTO_UDP {
        return Ok(None);
    }
    // The IP payload exactly as long as the header says (Ethernet padding cut off).
    let datagram = body
        .get(IPV6_LEN..IPV6_LEN + usize::from(ip.payload_len))
        .ok_or(Discard::Truncated)?;
    let Some(u) = datagram.first_chunk::<UDP_LEN>() else {
        return Ok(None);
    };
    if be16(u, 2) != ROCE_PORT {
        return Ok(None);
    }
    let udp = UdpHeader {
        src_port: be16(u, 0),
        dst_port: ROCE_PORT,
        len: be16(u, 4),
        checksum: be16(u, 6),
    };
    let udp_len = usize::from(udp.len);
    if udp_len < UDP_LEN || udp_len > datagram.len() {
        return Err(Discard::Truncated);
    }
    // RoCEv2 sends 0 (no checksum) over IPv6 too; a non-zero one must be right.
    if udp.checksum != 0 {
        let s = pseudo_sum(&ip.src, &ip.dst, udp_len as u32, PROTO_UDP);
        if sum16(s, &datagram[..udp_len]) != 0xFFFF {
            return Err(Discard::BadUdpChecksum);
        }
    }
    let transport = datagram.get(UDP_LEN..udp_len).ok_or(Discard::Truncated)?;
    let bth = transport
        .first_chunk::<BTH_LEN>()
        .ok_or(Discard::Truncated)?;
    if bth[1] & 0xF != 0 || be16(bth, 2) & 0x7FFF != 0x7FFF {
        return Err(Discard::BadBth);
    }
    let (headers, layout) = Headers::parse(transport)?;
    let hlen = layout.header_bytes();
    let body_len = transport
        .len()
        .checked_sub(hlen + ICRC_LEN)
        .ok_or(Discard::Truncated)?;
    let pad = usize::from(headers.bth.pad);
    if body_len < pad || (!layout.payload() && body_len != 0) {
        return Err(Discard::Truncated);
    }
    let end = transport.len() - ICRC_LEN;
    let sent = u32::from_le_bytes(*chunk::<ICRC_LEN>(transport, end));
    let covered = body
        .get(..IPV6_LEN + UDP_LEN + end)
        .ok_or(Discard::Truncated)?;
    if icrc(covered) != Some(sent) {
        return Err(Discard::BadIcrc);
    }
    Ok(Some(Packet6 {
        src_mac: eth.src,
        dst_mac: eth.dst,
        ip,
        udp,
        headers,
        payload: transport.get(hlen..end - pad).ok_or(Discard::Truncated)?,
    }))
}

/// Bytes an IPv6 frame has beyond the IPv4 frame of the same packet.
pub const V6_EXTRA: usize = IPV6_LEN - IPV4_LEN;

/// Makes the RoCEv2 frame over IPv4 at `f[V6_EXTRA..V6_EXTRA + n]` (as the IPv4 builders
/// write it, its UDP header and transport packet already where an IPv6 frame has them) the
/// same packet over IPv6 from `src` to `dst` with flow label `flow`: the MACs kept, the
/// IPv4 TOS as the traffic class and the TTL as the hop limit, the payload length the UDP
/// length, the ICRC made again with IPv6's mask. Returns the frame's length (`n +
/// V6_EXTRA`); `None` when `f` does not hold such a frame.
pub fn ipv4_to_ipv6(f: &mut [u8], n: usize, src: &Ip6, dst: &Ip6, flow: u32) -> Option<usize> {
    let v4 = f.get(V6_EXTRA..V6_EXTRA + n)?;
    let head = v4.get(..ETH_LEN + IPV4_LEN + UDP_LEN)?;
    let macs = *chunk::<12>(head, 0);
    let (tos, ttl) = (head[ETH_LEN + 1], head[ETH_LEN + 8]);
    let udp_len = be16(head, ETH_LEN + IPV4_LEN + 4);
    let end = n + V6_EXTRA;
    if ROCE6_OFFSET - UDP_LEN + usize::from(udp_len) != end {
        return None;
    }
    put(f, 0, macs);
    put(f, 12, ETHERTYPE_IPV6.to_be_bytes());
    let mut ip = [0u8; IPV6_LEN];
    Ipv6Header {
        traffic_class: tos,
        flow_label: flow,
        payload_len: udp_len,
        next_header: PROTO_UDP,
        hop_limit: ttl,
        src: *src,
        dst: *dst,
    }
    .write(&mut ip);
    put(f, ETH_LEN, ip);
    let crc = icrc(f.get(ETH_LEN..end - ICRC_LEN)?)?;
    put(f, end - ICRC_LEN, crc.to_le_bytes());
    Some(end)
}

/// Makes the RoCEv2 frame over IPv6 of `f` (checked by [`parse6`]) the same packet over
/// IPv4 from `src` to `dst`, in place: the traffic class as the TOS, the hop limit as the
/// TTL, the UDP header (its checksum made 0) and the transport packet moved up, the ICRC
/// made again with IPv4's mask (the IPv6 one was checked). Returns the frame's length; `None` when `f` does not
/// hold an IPv6 frame with a UDP datagram that long.
pub fn ipv6_to_ipv4(f: &mut [u8], src: [u8; 4], dst: [u8; 4]) -> Option<usize> {
    let h = f.get(..ROCE6_OFFSET)?;
    let tos = (be32(h, ETH_LEN) >> 20) as u8;
    let ttl = h[ETH_LEN + 7];
    let udp_len = usize::from(be16(h, ETH_LEN + IPV6_LEN + 4));
    let end6 = ETH_LEN + IPV6_LEN + udp_len;
    if udp_len < UDP_LEN + BTH_LEN + ICRC_LEN || end6 > f.len() {
        return None;
    }
    f.copy_within(ETH_LEN + IPV6_LEN..end6, ETH_LEN + IPV4_LEN);
    // The UDP checksum (0 as RoCEv2 sends it, or one checked over the IPv6 pseudo-header)
    // made 0: the IPv4 frame carries none.
    put(f, ETH_LEN + IPV4_LEN + 6, [0, 0]);
    put(f, 12, ETHERTYPE_IPV4.to_be_bytes());
    let mut ip = [0u8; IPV4_LEN];
    Ipv4Header {
        tos,
        total_len: (IPV4_LEN + udp_len) as u16,
        id: 0,
        ttl,
        protocol: PROTO_UDP,
        src,
        dst,
    }
    .write(&mut ip);
    put(f, ETH_LEN, ip);
    let end = ETH_LEN + IPV4_LEN + udp_len;
    let crc = icrc_v4(f.get(ETH_LEN..end - ICRC_LEN)?)?;
    put(f, end - ICRC_LEN, crc.to_le_bytes());
    Some(end)
}

/// The GRH slot of a UD datagram that came over IPv6 from `src` to `dst` and was made the
/// IPv4 packet whose header is `v4` ([`ipv6_to_ipv4`]): the IPv6 header again, as rxe
/// writes it into the receive buffer — the traffic class from the TOS, the hop limit from
/// the TTL, the payload length from the total length; the flow label, which the IPv4 form
/// does not keep, 0 (rxe sends 0).
pub fn grh6(v4: &[u8; IPV4_LEN], src: &Ip6, dst: &Ip6) -> [u8; IPV6_LEN] {
    let total = be16(v4, 2);
    let mut out = [0u8; IPV6_LEN];
    Ipv6Header {
        traffic_class: v4[1],
        flow_label: 0,
        payload_len: total.saturating_sub(IPV4_LEN as u16),
        next_header: PROTO_UDP,
        hop_limit: v4[8],
        src: *src,
        dst: *dst,
    }
    .write(&mut out);
    out
}

/// Whether `ip` is an address no station on the segment sends from: unspecified (::),
/// loopback (::1), multicast (ff00::/8), or IPv4-mapped (::ffff:0:0/96, which goes as IPv4).
pub fn martian6(ip: &Ip6) -> bool {
    let zero_head = ip[..10].iter().all(|&b| b == 0);
    ip[0] == 0xFF
        || (zero_head && ip[10..12] == [0xFF, 0xFF])
        || (zero_head && ip[10..15].iter().all(|&b| b == 0) && ip[15] <= 1)
}

#[cfg(test)]
#[path = "ip6_tests.rs"]
mod tests;
