//! Tests of `ip6.rs`: the IPv6 UD SEND of `docs/roce-v2.md` §4 (V3) built byte for byte and
//! parsed back; every hostile variant refused with its reason.

use super::*;
use crate::device::rxe::wire::bth::{Bth, Deth, opcode};

fn v3_route() -> Ipv6Route {
    let mut src = [0u8; 16];
    src[..2].copy_from_slice(&[0xFE, 0x80]);
    src[8..].copy_from_slice(&[0x50, 0x54, 0x00, 0xFF, 0xFE, 0x00, 0x00, 0x01]);
    let mut dst = src;
    dst[15] = 2;
    Ipv6Route {
        src_mac: [0x52, 0x54, 0, 0, 0, 1],
        dst_mac: [0x52, 0x54, 0, 0, 0, 2],
        src,
        dst,
        traffic_class: 0,
        flow_label: 0,
        hop_limit: 64,
        src_port: 0xDF94,
    }
}

fn v3_headers() -> Headers {
    let mut h = Headers::new(Bth {
        opcode: opcode::UD_SEND_ONLY,
        se: false,
        pad: 0,
        pkey: 0xFFFF,
        dest_qp: 0x12,
        ack_req: false,
        psn: 1,
    });
    h.deth = Some(Deth {
        qkey: 0x1111_1111,
        src_qp: 0x11,
    });
    h
}

/// The V3 frame: the bytes after Ethernet as `docs/roce-v2.md` §4 gives them.
const V3: [u8; 76] = [
    0x60, 0x00, 0x00, 0x00, 0x00, 0x24, 0x11, 0x40, //
    0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0x00, 0xff, 0xfe, 0x00, 0x00, 0x01, //
    0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0x00, 0xff, 0xfe, 0x00, 0x00, 0x02, //
    0xdf, 0x94, 0x12, 0xb7, 0x00, 0x24, 0x00, 0x00, //
    0x64, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x00, 0x00, 0x00, 0x01, //
    0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x11, //
    0x70, 0x69, 0x6e, 0x67, //
    0x50, 0xe5, 0x0b, 0x57,
];

fn v3_frame() -> std::vec::Vec<u8> {
    let mut b = [0xA5u8; 256];
    let n = build6(&mut b, &v3_route(), &v3_headers(), b"ping").unwrap();
    b[..n].to_vec()
}

/// The V3 vector built byte for byte (the ICRC 0x570BE550 with IPv6's mask) and parsed
/// back as the same headers, addresses and payload.
#[test]
fn the_v3_vector_builds_and_parses() {
    let f = v3_frame();
    assert_eq!(f.len(), ETH_LEN + V3.len());
    assert_eq!(&f[12..14], &[0x86, 0xDD]);
    assert_eq!(&f[ETH_LEN..], &V3[..]);
    let p = parse6(&f).unwrap().unwrap();
    assert_eq!(p.headers, v3_headers());
    assert_eq!(p.payload, b"ping");
    assert_eq!(p.ip.src, v3_route().src);
    assert_eq!(p.ip.dst, v3_route().dst);
    assert_eq!(p.ip.hop_limit, 64);
    assert_eq!(p.udp.src_port, 0xDF94);
    assert_eq!(p.src_mac, v3_route().src_mac);
}

/// The masked fields (traffic class, flow label, hop limit) leave the ICRC as it was; the
/// addresses, the payload length and the payload do not.
#[test]
fn the_icrc_masks_what_routers_change_only() {
    let f = v3_frame();
    let crc = &f[f.len() - 4..];
    let mut r = v3_route();
    r.traffic_class = 0xB8;
    r.flow_label = 0xF_FFFF;
    r.hop_limit = 1;
    let mut b = [0u8; 256];
    let n = build6(&mut b, &r, &v3_headers(), b"ping").unwrap();
    assert_eq!(&b[n - 4..n], crc);
    assert_eq!(b[ETH_LEN], 0x6B);
    assert_eq!(&b[ETH_LEN + 1..ETH_LEN + 4], &[0x8F, 0xFF, 0xFF]);
    let p = parse6(&b[..n]).unwrap().unwrap();
    assert_eq!(
        (p.ip.traffic_class, p.ip.flow_label, p.ip.hop_limit),
        (0xB8, 0xF_FFFF, 1)
    );
    // Hop limit rewritten on the way (a router): still good.
    let mut g = f.clone();
    g[ETH_LEN + 7] = 3;
    assert!(parse6(&g).unwrap().is_some());
    for at in [
        ETH_LEN + 8,
        ETH_LEN + 39,
        ETH_LEN + 40,
        ETH_LEN + 60,
        ETH_LEN + 70,
    ] {
        let mut g = f.clone();
        g[at] ^= 0x01;
        assert_eq!(parse6(&g), Err(Discard::BadIcrc), "byte {at}");
    }
}

/// Hostile frames: lengths past the frame, a wrong non-zero UDP checksum, a bad BTH, an
/// unknown opcode; and what is not RoCE over IPv6 goes to the IP stack (`Ok(None)`).
#[test]
fn hostile_frames_are_refused_with_their_reason() {
    let f = v3_frame();
    // Payload length past the frame.
    let mut g = f.clone();
    g[ETH_LEN + 5] = 0x40;
    assert_eq!(parse6(&g), Err(Discard::Truncated));
    // UDP length past the IP payload.
    let mut g = f.clone();
    g[ETH_LEN + 45] = 0x30;
    assert_eq!(parse6(&g), Err(Discard::Truncated));
    // UDP length shorter than its header.
    let mut g = f.clone();
    g[ETH_LEN + 45] = 4;
    assert_eq!(parse6(&g), Err(Discard::Truncated));
    // A non-zero UDP checksum that is wrong, then one made right.
    let mut g = f.clone();
    g[ETH_LEN + 46] = 0x12;
    assert_eq!(parse6(&g), Err(Discard::BadUdpChecksum));
    g[ETH_LEN + 46..ETH_LEN + 48].fill(0);
    let s = pseudo_sum(&v3_route().src, &v3_route().dst, 36, PROTO_UDP);
    let sum = !(sum16(s, &g[ETH_LEN + 40..ETH_LEN + 76]) as u16);
    g[ETH_LEN + 46..ETH_LEN + 48].copy_from_slice(&sum.to_be_bytes());
    assert!(parse6(&g).unwrap().is_some());
    // Transport version not 0; a P_Key not the default one.
    let mut g = f.clone();
    g[ETH_LEN + 49] = 0x01;
    assert_eq!(parse6(&g), Err(Discard::BadBth));
    let mut g = f.clone();
    g[ETH_LEN + 51] = 0x00;
    assert_eq!(parse6(&g), Err(Discard::BadBth));
    // RD opcode.
    let mut g = f.clone();
    g[ETH_LEN + 48] = 0x44;
    assert_eq!(parse6(&g), Err(Discard::UnknownOpcode));
    // Not UDP, not port 4791, not IPv6, not version 6: for the IP stack.
    let mut g = f.clone();
    g[ETH_LEN + 6] = PROTO_ICMPV6;
    assert_eq!(parse6(&g), Ok(None));
    let mut g = f.clone();
    g[ETH_LEN + 43] = 0xB8;
    assert_eq!(parse6(&g), Ok(None));
    let mut g = f.clone();
    g[12..14].copy_from_slice(&[8, 0]);
    assert_eq!(parse6(&g), Ok(None));
    let mut g = f.clone();
    g[ETH_LEN] = 0x40;
    assert_eq!(parse6(&g), Ok(None));
    // Ethernet padding after the IP packet is allowed.
    let mut g = f.clone();
    g.extend_from_slice(&[0; 6]);
    assert_eq!(parse6(&g).unwrap().unwrap().payload, b"ping");
}

/// Every truncation and every single-byte change of the frame is either refused, left to
/// the stack, or a packet whose lengths lie inside the frame: never a panic; the counts say
/// what was reached.
#[test]
fn every_cut_and_flip_is_bounded() {
    let f = v3_frame();
    let (mut refused, mut other, mut taken) = (0, 0, 0);
    for len in 0..f.len() {
        match parse6(&f[..len]) {
            Err(_) => refused += 1,
            Ok(None) => other += 1,
            Ok(Some(_)) => taken += 1,
        }
    }
    assert_eq!(taken, 0, "a cut frame was taken");
    for at in 0..f.len() {
        for bit in 0..8 {
            let mut g = f.clone();
            g[at] ^= 1 << bit;
            match parse6(&g) {
                Err(_) => refused += 1,
                Ok(None) => other += 1,
                Ok(Some(p)) => {
                    taken += 1;
                    assert!(p.payload.len() <= g.len());
                }
            }
        }
    }
    // Flips of the MACs, the masked fields and the ICRC-covered bytes: some taken (masked
    // or MAC), most refused, some left to the stack (EtherType, version, next header, port).
    assert!(refused > 400, "{refused}");
    assert!(other > 10, "{other}");
    assert!(taken > 100, "{taken}");
}

/// The martian sources: unspecified, loopback, multicast, IPv4-mapped; link-local and
/// global ones are not.
#[test]
fn martian_sources() {
    let mut a = [0u8; 16];
    assert!(martian6(&a));
    a[15] = 1;
    assert!(martian6(&a));
    a[15] = 2;
    assert!(!martian6(&a));
    let mut m = [0u8; 16];
    m[0] = 0xFF;
    m[1] = 0x02;
    assert!(martian6(&m));
    let mut v4 = [0u8; 16];
    v4[10] = 0xFF;
    v4[11] = 0xFF;
    v4[12] = 10;
    assert!(martian6(&v4));
    assert!(!martian6(&v3_route().src));
    let mut g = [0u8; 16];
    g[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    g[15] = 5;
    assert!(!martian6(&g));
}

/// The IPv4 frame of a packet made the IPv6 one is the frame built whole over IPv6, byte for
/// byte (the V3 packet, and one with traffic class, flow label and hop limit set); made back
/// it parses as the same headers and payload between the IPv4 addresses given.
#[test]
fn frames_convert_between_ipv4_and_ipv6() {
    use crate::device::rxe::wire::packet::{Frame, Route, build, parse};
    for (tc, flow, hop) in [(0u8, 0u32, 64u8), (0xB8, 0xABCDE, 3)] {
        let mut r6 = v3_route();
        (r6.traffic_class, r6.flow_label, r6.hop_limit) = (tc, flow, hop);
        let r4 = Route {
            src_mac: r6.src_mac,
            dst_mac: r6.dst_mac,
            src_ip: [10, 0, 0, 1],
            dst_ip: [0, 0x86, 0xDD, 0],
            tos: tc,
            ttl: hop,
            src_port: r6.src_port,
        };
        let mut want = [0u8; 256];
        let n6 = build6(&mut want, &r6, &v3_headers(), b"ping").unwrap();
        let mut f = [0x5Au8; 256];
        let n4 = build(&mut f[V6_EXTRA..], &r4, 7, &v3_headers(), b"ping").unwrap();
        let n = ipv4_to_ipv6(&mut f, n4, &r6.src, &r6.dst, flow).unwrap();
        assert_eq!(n, n6);
        assert_eq!(f[..n], want[..n6]);
        // A length that disagrees with the UDP header is refused.
        assert_eq!(
            ipv4_to_ipv6(&mut f.clone(), n4 - 1, &r6.src, &r6.dst, flow),
            None
        );
        let m = ipv6_to_ipv4(&mut f[..n], [0, 0x86, 0xDD, 3], [10, 0, 0, 9]).unwrap();
        assert_eq!(m, n4);
        match parse(&f[..m]) {
            Ok(Frame::Roce(p)) => {
                assert_eq!(p.headers, v3_headers());
                assert_eq!(p.payload, b"ping");
                assert_eq!((p.ip.src, p.ip.dst), ([0, 0x86, 0xDD, 3], [10, 0, 0, 9]));
                assert_eq!((p.ip.tos, p.ip.ttl), (tc, hop));
            }
            other => panic!("{other:?}"),
        }
    }
    // A packet sent with a UDP checksum (over the IPv6 pseudo-header): the IPv4 frame has
    // none, and parses.
    let mut f = v3_frame();
    let s = pseudo_sum(&v3_route().src, &v3_route().dst, 36, PROTO_UDP);
    let sum = !(sum16(s, &f[ETH_LEN + 40..ETH_LEN + 76]) as u16);
    f[ETH_LEN + 46..ETH_LEN + 48].copy_from_slice(&sum.to_be_bytes());
    assert!(parse6(&f).unwrap().is_some());
    let m = ipv6_to_ipv4(&mut f, [0, 0x86, 0xDD, 1], [10, 0, 0, 9]).unwrap();
    assert_eq!(&f[ETH_LEN + 26..ETH_LEN + 28], &[0, 0]);
    assert!(matches!(parse(&f[..m]), Ok(Frame::Roce(_))));
    // A UDP length past the frame, or too short for a BTH: refused, nothing moved.
    let mut f = v3_frame();
    f[ETH_LEN + 45] = 0xFF;
    assert_eq!(ipv6_to_ipv4(&mut f, [0; 4], [0; 4]), None);
    f[ETH_LEN + 44] = 0;
    f[ETH_LEN + 45] = 8;
    assert_eq!(ipv6_to_ipv4(&mut f, [0; 4], [0; 4]), None);
}

/// The IPv6 path's sum equals the IPv4 path's at every length and starting sum, all-ones
/// bytes (the carries) included.
#[test]
fn the_two_sums_agree() {
    use crate::device::rxe::wire::ip::ones_sum;
    let mut x: u32 = 0x9E37_79B9;
    let bytes: std::vec::Vec<u8> = (0..80)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    for data in [&bytes[..], &[0xFFu8; 80][..]] {
        for len in 0..data.len() {
            for start in [0, 1, 0x1234, 0xFFFF] {
                assert_eq!(
                    sum16(start, &data[..len]),
                    ones_sum(start, &data[..len]),
                    "{len}"
                );
            }
        }
    }
}
