//! IPv6 neighbour discovery (RFC 4861 §4.3, §4.4, §7): Neighbor Solicitations and
//! Advertisements with their link-layer address options, checked as §7.1.1 and §7.1.2 ask
//! (hop limit 255, code 0, the ICMPv6 checksum over the pseudo-header, lengths, option
//! lengths not zero, targets not multicast) and built as a host sends them.

use super::eth::{ETH_LEN, EthHeader, Mac};
use super::ip6::{ETHERTYPE_IPV6, IPV6_LEN, Ip6, Ipv6Header, PROTO_ICMPV6, pseudo_sum, sum16};
use super::{Discard, chunk, put};

/// ICMPv6 type of a Neighbor Solicitation.
pub const NS: u8 = 135;
/// ICMPv6 type of a Neighbor Advertisement.
pub const NA: u8 = 136;
/// Bytes of a solicitation or advertisement before its options.
const ND_LEN: usize = 24;
/// Bytes of a link-layer address option for Ethernet.
const OPT_LEN: usize = 8;
/// Bytes of the frames [`Nd::frame`] builds: Ethernet, IPv6, the message and one option.
pub const ND_FRAME_LEN: usize = ETH_LEN + IPV6_LEN + ND_LEN + OPT_LEN;

/// The solicited-node multicast address of `ip`: ff02::1:ffXX:XXXX with its low 24 bits.
pub fn solicited_node(ip: &Ip6) -> Ip6 {
    let mut a = [0u8; 16];
    a[0] = 0xFF;
    a[1] = 0x02;
    a[11] = 0x01;
    a[12] = 0xFF;
    a[13..].copy_from_slice(&ip[13..]);
    a
}

/// The Ethernet multicast MAC of an IPv6 multicast address: 33:33 and its low 32 bits
/// (RFC 2464 §7).
pub fn multicast_mac(ip: &Ip6) -> Mac {
    [0x33, 0x33, ip[12], ip[13], ip[14], ip[15]]
}

/// The all-nodes multicast address ff02::1.
pub const ALL_NODES: Ip6 = [0xFF, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// A solicitation or an advertisement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nd {
    /// [`NS`] or [`NA`].
    pub kind: u8,
    /// The IPv6 source.
    pub src: Ip6,
    /// The IPv6 destination.
    pub dst: Ip6,
    /// The address asked about, or advertised.
    pub target: Ip6,
    /// The link-layer address option: the source's (a solicitation) or the target's (an
    /// advertisement), when present.
    pub lladdr: Option<Mac>,
    /// Advertisement flags: router (bit 31), solicited (30), override (29).
    pub flags: u32,
}

/// The advertisement's solicited flag.
pub const SOLICITED: u32 = 1 << 30;
/// The advertisement's override flag.
pub const OVERRIDE: u32 = 1 << 29;

impl Nd {
    /// The solicitation or advertisement in an IPv6 packet (`body`: the frame after
    /// Ethernet). `Ok(None)` for any other IPv6 packet (for the IP stack); `Err` for one that
    /// fails RFC 4861's validity checks (silently discarded, as the RFC asks).
    pub fn parse(body: &[u8]) -> Result<Option<Self>, Discard> {
        let ip = match Ipv6Header::parse(body) {
            Ok(ip) => ip,
            Err(Discard::NotRoce) => return Ok(None),
            Err(d) => return Err(d),
        };
        if ip.next_header != PROTO_ICMPV6 {
            return Ok(None);
        }
        let msg = body
            .get(IPV6_LEN..IPV6_LEN + usize::from(ip.payload_len))
            .ok_or(Discard::Truncated)?;
        let kind = match msg.first() {
            Some(&k @ (NS | NA)) => k,
            _ => return Ok(None),
        };
        if ip.hop_limit != 255 || msg.get(1) != Some(&0) {
            return Err(Discard::BadIp);
        }
        if msg.len() < ND_LEN {
            return Err(Discard::Truncated);
        }
        let sum = pseudo_sum(&ip.src, &ip.dst, msg.len() as u32, PROTO_ICMPV6);
        if sum16(sum, msg) != 0xFFFF {
            return Err(Discard::BadUdpChecksum);
        }
        let target: Ip6 = *chunk(msg, 8);
        if target[0] == 0xFF {
            return Err(Discard::BadIp);
        }
        let flags = u32::from_be_bytes(*chunk(msg, 4));
        // Options: each at least 8 bytes (a zero length is invalid), bounded by the message.
        let want = if kind == NS { 1 } else { 2 };
        let mut lladdr = None;
        let mut at = ND_LEN;
        while at < msg.len() {
            let opt = msg.get(at..at + 2).ok_or(Discard::Truncated)?;
            let len = usize::from(opt[1]) * 8;
            if len == 0 {
                return Err(Discard::BadIp);
            }
            let o = msg.get(at..at + len).ok_or(Discard::Truncated)?;
            if o[0] == want && len == OPT_LEN {
                lladdr = Some(*chunk(o, 2));
            }
            at += len;
        }
        let unspecified = ip.src == [0; 16];
        if kind == NS
            && unspecified
            && (lladdr.is_some() || ip.dst[..13] != solicited_node(&target)[..13])
        {
            // Duplicate address detection: to the solicited-node group, without an option.
            return Err(Discard::BadIp);
        }
        if kind == NA && ip.dst[0] == 0xFF && flags & SOLICITED != 0 {
            return Err(Discard::BadIp);
        }
        Ok(Some(Nd {
            kind,
            src: ip.src,
            dst: ip.dst,
            target,
            lladdr,
            flags: if kind == NA { flags & 0xE000_0000 } else { 0 },
        }))
    }

    /// The whole frame carrying this message from `src_mac` to `dst_mac` (hop limit 255,
    /// its checksum, the link-layer address option with `lladdr` when present).
    pub fn frame(&self, src_mac: Mac, dst_mac: Mac) -> ([u8; ND_FRAME_LEN], usize) {
        let mut f = [0u8; ND_FRAME_LEN];
        let len = ND_LEN + if self.lladdr.is_some() { OPT_LEN } else { 0 };
        if let Some(eth) = f.first_chunk_mut::<ETH_LEN>() {
            EthHeader {
                dst: dst_mac,
                src: src_mac,
                ethertype: ETHERTYPE_IPV6,
            }
            .write(eth);
        }
        let mut ip = [0u8; IPV6_LEN];
        Ipv6Header {
            traffic_class: 0,
            flow_label: 0,
            payload_len: len as u16,
            next_header: PROTO_ICMPV6,
            hop_limit: 255,
            src: self.src,
            dst: self.dst,
        }
        .write(&mut ip);
        put(&mut f, ETH_LEN, ip);
        let m = ETH_LEN + IPV6_LEN;
        f[m] = self.kind;
        put(&mut f, m + 4, self.flags.to_be_bytes());
        put(&mut f, m + 8, self.target);
        if let Some(mac) = self.lladdr {
            f[m + ND_LEN] = if self.kind == NS { 1 } else { 2 };
            f[m + ND_LEN + 1] = 1;
            put(&mut f, m + ND_LEN + 2, mac);
        }
        let sum = pseudo_sum(&self.src, &self.dst, len as u32, PROTO_ICMPV6);
        let sum = !(sum16(sum, &f[m..m + len]) as u16);
        put(&mut f, m + 2, sum.to_be_bytes());
        (f, m + len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ll(last: u8) -> Ip6 {
        let mut a = [0u8; 16];
        a[0] = 0xFE;
        a[1] = 0x80;
        a[8..].copy_from_slice(&[0x50, 0x54, 0, 0xFF, 0xFE, 0, 0, last]);
        a
    }

    /// A solicitation and an advertisement built and parsed back; the solicited-node group
    /// and its MAC as RFC 4291 and RFC 2464 give them.
    #[test]
    fn messages_round_trip() {
        let ns = Nd {
            kind: NS,
            src: ll(1),
            dst: solicited_node(&ll(2)),
            target: ll(2),
            lladdr: Some([0x52, 0x54, 0, 0, 0, 1]),
            flags: 0,
        };
        assert_eq!(
            ns.dst,
            [0xFF, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xFF, 0, 0, 2]
        );
        assert_eq!(multicast_mac(&ns.dst), [0x33, 0x33, 0xFF, 0, 0, 2]);
        let (f, n) = ns.frame([0x52, 0x54, 0, 0, 0, 1], multicast_mac(&ns.dst));
        assert_eq!(n, ND_FRAME_LEN);
        assert_eq!(Nd::parse(&f[ETH_LEN..n]), Ok(Some(ns)));
        let na = Nd {
            kind: NA,
            src: ll(2),
            dst: ll(1),
            target: ll(2),
            lladdr: Some([0x52, 0x54, 0, 0, 0, 2]),
            flags: SOLICITED | OVERRIDE,
        };
        let (f, n) = na.frame([0x52, 0x54, 0, 0, 0, 2], [0x52, 0x54, 0, 0, 0, 1]);
        assert_eq!(Nd::parse(&f[ETH_LEN..n]), Ok(Some(na)));
    }

    /// RFC 4861 §7.1's checks: a hop limit below 255 (sent from off the link), a code other
    /// than 0, a wrong checksum, a zero-length option, a multicast target, a solicited
    /// advertisement to a group, duplicate address detection with an option: all refused;
    /// every cut of the frame refused or left alone, never read past.
    #[test]
    fn invalid_messages_are_refused() {
        let ns = Nd {
            kind: NS,
            src: ll(1),
            dst: solicited_node(&ll(2)),
            target: ll(2),
            lladdr: Some([2, 0, 0, 0, 0, 1]),
            flags: 0,
        };
        let (f, n) = ns.frame([2, 0, 0, 0, 0, 1], [0x33, 0x33, 0xFF, 0, 0, 2]);
        let body = &f[ETH_LEN..n];
        let mut g = body.to_vec();
        g[7] = 64;
        assert_eq!(Nd::parse(&g), Err(Discard::BadIp));
        let mut g = body.to_vec();
        g[IPV6_LEN + 1] = 1;
        assert_eq!(Nd::parse(&g), Err(Discard::BadIp));
        let mut g = body.to_vec();
        g[IPV6_LEN + 30] ^= 1;
        assert_eq!(Nd::parse(&g), Err(Discard::BadUdpChecksum));
        // A zero-length option, the checksum made right for it.
        let mut bad = ns;
        bad.lladdr = None;
        let (mut z, zn) = bad.frame([2, 0, 0, 0, 0, 1], [0x33, 0x33, 0xFF, 0, 0, 2]);
        let _ = zn;
        let m = ETH_LEN + IPV6_LEN;
        z[ETH_LEN + 5] = (ND_LEN + OPT_LEN) as u8;
        z[m + ND_LEN] = 1;
        z[m + 2..m + 4].fill(0);
        let s = pseudo_sum(&ns.src, &ns.dst, (ND_LEN + OPT_LEN) as u32, PROTO_ICMPV6);
        let s = !(sum16(s, &z[m..m + ND_LEN + OPT_LEN]) as u16);
        z[m + 2..m + 4].copy_from_slice(&s.to_be_bytes());
        assert_eq!(Nd::parse(&z[ETH_LEN..]), Err(Discard::BadIp));
        // Multicast target.
        let mut mt = ns;
        mt.target = ALL_NODES;
        let (f2, n2) = mt.frame([2, 0, 0, 0, 0, 1], [0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(Nd::parse(&f2[ETH_LEN..n2]), Err(Discard::BadIp));
        // A solicited advertisement to all nodes.
        let na = Nd {
            kind: NA,
            src: ll(2),
            dst: ALL_NODES,
            target: ll(2),
            lladdr: Some([2, 0, 0, 0, 0, 2]),
            flags: SOLICITED,
        };
        let (f3, n3) = na.frame([2, 0, 0, 0, 0, 2], [0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(Nd::parse(&f3[ETH_LEN..n3]), Err(Discard::BadIp));
        // Duplicate address detection with a link-layer option.
        let mut dad = ns;
        dad.src = [0; 16];
        let (f4, n4) = dad.frame([2, 0, 0, 0, 0, 1], [0x33, 0x33, 0xFF, 0, 0, 2]);
        assert_eq!(Nd::parse(&f4[ETH_LEN..n4]), Err(Discard::BadIp));
        dad.lladdr = None;
        let (f5, n5) = dad.frame([2, 0, 0, 0, 0, 1], [0x33, 0x33, 0xFF, 0, 0, 2]);
        assert!(Nd::parse(&f5[ETH_LEN..n5]).unwrap().is_some());
        let (mut refused, mut other) = (0, 0);
        for len in 0..body.len() {
            match Nd::parse(&body[..len]) {
                Err(_) => refused += 1,
                Ok(None) => other += 1,
                Ok(Some(_)) => panic!("a cut message was taken at {len}"),
            }
        }
        assert_eq!(refused + other, body.len());
        assert!(refused > 0);
    }
}
