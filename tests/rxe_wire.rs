//! The RoCEv2 wire format of the software device (`src/device/rxe/wire`): frames built byte
//! for byte as Linux's rxe builds them (the vectors of `docs/roce-v2.md` §4.4, which were
//! cross-checked against rxe's method and an independent implementation), parsed back, and
//! hostile frames (truncated, bit-flipped, random) refused with a typed reason, never a panic.

use bareverbs::device::rxe::wire::Discard;
use bareverbs::device::rxe::wire::addr::{rc_source_port, ud_source_port};
use bareverbs::device::rxe::wire::bth::{
    Aeth, AtomicEth, Bth, DEFAULT_PKEY, Deth, Headers, Layout, Reth, opcode,
};
use bareverbs::device::rxe::wire::eth::{Arp, ArpOp, BROADCAST};
use bareverbs::device::rxe::wire::icrc::icrc;
use bareverbs::device::rxe::wire::packet::{Frame, Route, build, parse};
use bareverbs::verbs::Gid;
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

const MAC_A: [u8; 6] = [0x52, 0x54, 0x00, 0x00, 0x00, 0x0A];
const MAC_B: [u8; 6] = [0x52, 0x54, 0x00, 0x00, 0x00, 0x14];
const IP_A: [u8; 4] = [192, 168, 122, 10];
const IP_B: [u8; 4] = [192, 168, 122, 20];

/// §4.4 V1: IPv4 RC SEND_ONLY "hello", .10 → .20.
const V1: &str = "45 00 00 34 12 34 40 00 40 11 b3 15 c0 a8 7a 0a c0 a8 7a 14
                  c1 32 12 b7 00 20 00 00
                  04 30 ff ff 00 00 00 12 80 00 ab cd
                  68 65 6c 6c 6f 00 00 00
                  61 8a 90 8b";
/// §4.4 V2: the RC ACKNOWLEDGE back.
const V2: &str = "45 00 00 30 00 01 40 00 40 11 c5 4c c0 a8 7a 14 c0 a8 7a 0a
                  c1 32 12 b7 00 1c 00 00
                  11 00 ff ff 00 00 00 11 00 00 ab cd
                  1f 00 00 01
                  da 06 9f f6";
/// §4.4 V3: IPv6 UD SEND_ONLY "ping".
const V3: &str = "60 00 00 00 00 24 11 40 fe80 0000 0000 0000 5054 00ff fe00 0001
                  fe80 0000 0000 0000 5054 00ff fe00 0002
                  df 94 12 b7 00 24 00 00
                  64 00 ff ff 00 00 00 12 00 00 00 01
                  11 11 11 11 00 00 00 11
                  70 69 6e 67
                  50 e5 0b 57";

fn route(src: ([u8; 6], [u8; 4]), dst: ([u8; 6], [u8; 4]), sport: u16) -> Route {
    Route {
        src_mac: src.0,
        dst_mac: dst.0,
        src_ip: src.1,
        dst_ip: dst.1,
        tos: 0,
        ttl: 64,
        src_port: sport,
    }
}

fn bth(op: u8, dest_qp: u32, psn: u32, ack_req: bool) -> Bth {
    Bth {
        opcode: op,
        se: false,
        pad: 0,
        pkey: DEFAULT_PKEY,
        dest_qp,
        ack_req,
        psn,
    }
}

fn v1_frame() -> Vec<u8> {
    let mut buf = [0u8; 128];
    let h = Headers::new(bth(opcode::RC_SEND_ONLY, 0x12, 0xABCD, true));
    let r = route((MAC_A, IP_A), (MAC_B, IP_B), rc_source_port(0x11, 0x12, 0));
    let n = build(&mut buf, &r, 0x1234, &h, b"hello").expect("fits");
    buf[..n].to_vec()
}

#[test]
fn frames_are_built_byte_for_byte_as_linux_rxe_builds_them() {
    let f = v1_frame();
    assert_eq!(&f[..6], &MAC_B);
    assert_eq!(&f[6..12], &MAC_A);
    assert_eq!(&f[12..14], &[0x08, 0x00]);
    assert_eq!(
        f[14..],
        hex(V1)[..],
        "V1: IPv4 RC SEND_ONLY, pad 3, ICRC 0x8B908A61"
    );

    let mut buf = [0u8; 128];
    let mut h = Headers::new(bth(opcode::RC_ACK, 0x11, 0xABCD, false));
    h.aeth = Some(Aeth {
        syndrome: 0x1F,
        msn: 1,
    });
    let r = route((MAC_B, IP_B), (MAC_A, IP_A), rc_source_port(0x12, 0x11, 0));
    let n = build(&mut buf, &r, 0x0001, &h, &[]).unwrap();
    assert_eq!(buf[14..n], hex(V2)[..], "V2: the ACK, AETH 0x1F MSN 1");
}

#[test]
fn the_icrc_matches_the_vectors_for_ipv4_and_ipv6() {
    for (name, v, want) in [
        ("V1", V1, 0x8B90_8A61u32),
        ("V2", V2, 0xF69F_06DA),
        ("V3", V3, 0x570B_E550),
    ] {
        let b = hex(v);
        let (covered, sent) = b.split_at(b.len() - 4);
        assert_eq!(icrc(covered), Some(want), "{name}");
        assert_eq!(
            sent,
            want.to_le_bytes(),
            "{name}: stored least-significant byte first"
        );
    }
    // Masked fields do not change it; covered ones do.
    let b = hex(V1);
    let covered = &b[..b.len() - 4];
    let base = icrc(covered);
    for (at, masked) in [
        (1, true),
        (8, true),
        (10, true),
        (11, true),
        (26, true),
        (27, true),
    ] {
        let mut m = covered.to_vec();
        m[at] ^= 0x5A;
        assert_eq!(icrc(&m) == base, masked, "IPv4/UDP byte {at}");
    }
    let mut m = covered.to_vec();
    m[28 + 4] ^= 0xC0; // FECN/BECN
    assert_eq!(icrc(&m), base, "BTH byte 4 is masked");
    m[28 + 8] ^= 0x80; // AckReq is not
    assert_ne!(icrc(&m), base);
    assert_eq!(icrc(&covered[..39]), None, "shorter than IP + UDP + BTH");
    assert_eq!(icrc(&[0x50; 64]), None, "neither IPv4 nor IPv6");
}

#[test]
fn source_ports_and_gids_are_derived_as_linux_derives_them() {
    assert_eq!(rc_source_port(0x11, 0x12, 0), 0xC132);
    assert_eq!(rc_source_port(0x12, 0x11, 0), 0xC132, "symmetric");
    assert_eq!(ud_source_port(0x11), 0xDF94);
    // A flow label is used as it is: 0xABCDE → 0xC000 | (0x3CDE ^ 0x2A).
    assert_eq!(rc_source_port(1, 2, 0xABCDE), 0xC000 | (0x3CDE ^ 0x2A));
    let g = Gid::from_ipv4([10, 0, 2, 15]);
    assert_eq!(g.ipv4(), Some([10, 0, 2, 15]));
    assert_eq!(Gid::link_local_from_mac(MAC_A).ipv4(), None);
}

#[test]
fn a_built_frame_parses_back_to_what_was_sent() {
    let f = v1_frame();
    let Ok(Frame::Roce(p)) = parse(&f) else {
        panic!("{:?}", parse(&f))
    };
    assert_eq!(p.src_mac, MAC_A);
    assert_eq!(
        (p.ip.src, p.ip.dst, p.ip.ttl, p.ip.id),
        (IP_A, IP_B, 64, 0x1234)
    );
    assert_eq!((p.udp.src_port, p.udp.dst_port), (0xC132, 4791));
    assert_eq!(p.headers.bth.opcode, opcode::RC_SEND_ONLY);
    assert_eq!((p.headers.bth.dest_qp, p.headers.bth.psn), (0x12, 0xABCD));
    assert!(p.headers.bth.ack_req);
    assert_eq!(p.payload, b"hello");
    // Ethernet padding to 60 bytes and beyond is ignored (the IP and UDP lengths rule).
    let mut padded = f.clone();
    padded.resize(f.len() + 17, 0xEE);
    assert_eq!(parse(&padded), parse(&f));
}

/// Headers of `op` with every extended header it needs, from `seed`.
fn headers_for(op: u8, seed: u64) -> Headers {
    let mut h = Headers::new(bth(
        op,
        (seed as u32) & 0xFF_FFFF,
        (seed >> 24) as u32 & 0xFF_FFFF,
        seed & 1 == 0,
    ));
    h.bth.se = seed & 2 != 0;
    h.deth = Some(Deth {
        qkey: 0x1111_1111,
        src_qp: (seed >> 8) as u32 & 0xFF_FFFF,
    });
    h.reth = Some(Reth {
        va: seed.rotate_left(7),
        rkey: seed as u32 ^ 0xA5A5,
        len: (seed >> 3) as u32,
    });
    h.atomic = Some(AtomicEth {
        va: seed & !7,
        rkey: 0x1234,
        swap_add: seed.wrapping_mul(3),
        compare: !seed,
    });
    h.aeth = Some(Aeth {
        syndrome: (seed >> 5) as u8,
        msn: (seed >> 11) as u32 & 0xFF_FFFF,
    });
    h.atomic_ack = Some(seed ^ 0xDEAD_BEEF);
    h.imm = Some(seed as u32);
    h
}

/// Keeps only the extended headers `op` has (what a parse gives back).
fn only_its_own(h: Headers) -> Headers {
    let mut buf = [0u8; 128];
    let n = h.write(&mut buf).unwrap();
    let (parsed, layout) = Headers::parse(&buf[..n]).unwrap();
    assert_eq!(layout.header_len(), n);
    Headers {
        bth: h.bth,
        deth: h.deth.filter(|_| parsed.deth.is_some()),
        reth: h.reth.filter(|_| parsed.reth.is_some()),
        atomic: h.atomic.filter(|_| parsed.atomic.is_some()),
        aeth: h.aeth.filter(|_| parsed.aeth.is_some()),
        atomic_ack: h.atomic_ack.filter(|_| parsed.atomic_ack.is_some()),
        imm: h.imm.filter(|_| parsed.imm.is_some()),
    }
}

const OPCODES: [u8; 23] = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x64, 0x65,
];

#[test]
fn every_opcode_round_trips_with_its_headers_lengths_and_pad() {
    let expect_len = |op: u8| match op {
        0x00..=0x02 | 0x04 | 0x07 | 0x08 | 0x0E => 12,
        0x03 | 0x05 | 0x09 | 0x0D | 0x0F | 0x10 | 0x11 => 16,
        0x06 | 0x0A | 0x0C => 28,
        0x0B => 32,
        0x12 => 24,
        0x13 | 0x14 => 40,
        0x64 => 20,
        0x65 => 24,
        _ => unreachable!(),
    };
    for (i, &op) in OPCODES.iter().enumerate() {
        let layout = Layout::of(op).unwrap();
        assert_eq!(layout.header_len(), expect_len(op), "opcode {op:#x}");
        let h = only_its_own(headers_for(op, 0x0123_4567_89AB_CDEF ^ i as u64));
        let sizes: &[usize] = if layout.payload() {
            &[0, 1, 2, 3, 4, 5, 1024]
        } else {
            &[0]
        };
        for &len in sizes {
            let payload: Vec<u8> = (0..len).map(|k| (k * 7 + op as usize) as u8).collect();
            let mut buf = [0u8; 1200];
            let r = route((MAC_A, IP_A), (MAC_B, IP_B), 0xC000 + op as u16);
            let n = build(&mut buf, &r, i as u16, &h, &payload).unwrap();
            assert_eq!(
                n,
                14 + 20 + 8 + expect_len(op) + len + (len.wrapping_neg() & 3) + 4
            );
            let Ok(Frame::Roce(p)) = parse(&buf[..n]) else {
                panic!("opcode {op:#x} len {len}: {:?}", parse(&buf[..n]))
            };
            let mut want = h;
            want.bth.pad = (len.wrapping_neg() & 3) as u8;
            assert_eq!(p.headers, want, "opcode {op:#x}");
            assert_eq!(p.payload, &payload[..]);
        }
    }
    for op in [0x15, 0x18, 0x1C, 0x20, 0x40, 0x66, 0x80, 0x81, 0xFF] {
        assert_eq!(Layout::of(op), None, "opcode {op:#x} is not spoken");
    }
    // An extended header the opcode needs and the headers lack: nothing is built.
    let mut buf = [0u8; 128];
    let r = route((MAC_A, IP_A), (MAC_B, IP_B), 1);
    let no_reth = Headers::new(bth(opcode::RC_WRITE_ONLY, 1, 1, true));
    assert_eq!(build(&mut buf, &r, 0, &no_reth, b"x"), None);
    // Too small a buffer: nothing is built.
    let h = Headers::new(bth(opcode::RC_SEND_ONLY, 1, 1, true));
    assert_eq!(build(&mut buf[..60], &r, 0, &h, &[0; 8]), None);
}

#[test]
fn arp_requests_are_answered_and_replies_understood() {
    let req = Arp {
        op: ArpOp::Request,
        sender_mac: MAC_B,
        sender_ip: IP_B,
        target_mac: [0; 6],
        target_ip: IP_A,
    };
    let f = req.frame(MAC_B);
    assert_eq!(&f[..6], &BROADCAST);
    assert_eq!(&f[12..14], &[0x08, 0x06]);
    let Ok(Frame::Arp(got)) = parse(&f) else {
        panic!()
    };
    assert_eq!(got, req);
    let reply = got.answer(MAC_A, IP_A).expect("asks for IP_A");
    assert_eq!(got.answer(MAC_A, [1, 2, 3, 4]), None, "not ours");
    assert_eq!(reply.answer(MAC_A, IP_A), None, "a reply is not answered");
    let rf = reply.frame(MAC_A);
    assert_eq!(&rf[..6], &MAC_B, "unicast to the asker");
    let Ok(Frame::Arp(back)) = parse(&rf) else {
        panic!()
    };
    assert_eq!(
        (back.op, back.sender_mac, back.sender_ip, back.target_ip),
        (ArpOp::Reply, MAC_A, IP_A, IP_B)
    );
    // Not Ethernet/IPv4 ARP (hardware type 6): left to others.
    let mut odd = f;
    odd[15] = 6;
    assert_eq!(parse(&odd), Ok(Frame::Other));
}

#[test]
fn non_roce_frames_are_left_to_the_ip_stack() {
    let mut f = v1_frame();
    f[14 + 9] = 6; // TCP
    assert_eq!(parse(&f), Ok(Frame::Other));
    let mut f = v1_frame();
    f[14 + 22..14 + 24].copy_from_slice(&53u16.to_be_bytes()); // UDP to port 53
    assert_eq!(parse(&f), Ok(Frame::Other));
    let mut f = v1_frame();
    f[12..14].copy_from_slice(&[0x86, 0xDD]);
    assert_eq!(parse(&f), Ok(Frame::Other), "IPv6 is not spoken yet");
}

/// What a parse made of a frame.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Roce,
    Arp,
    Other,
}

fn kind(r: Result<Frame<'_>, Discard>) -> Result<Kind, Discard> {
    r.map(|f| match f {
        Frame::Roce(_) => Kind::Roce,
        Frame::Arp(_) => Kind::Arp,
        Frame::Other => Kind::Other,
    })
}

#[test]
fn damaged_roce_frames_are_discarded_with_their_reason() {
    let f = v1_frame();
    let with = |at: usize, x: u8| {
        let mut g = f.clone();
        g[at] ^= x;
        kind(parse(&g))
    };
    assert_eq!(
        with(14 + 1, 0x04),
        Err(Discard::BadIp),
        "TOS: the IP checksum"
    );
    // A RoCE packet with IP options (4 NOPs): the ICRC could not be right, refused.
    let mut opt = f.clone();
    opt.splice(34..34, [1u8; 4]);
    opt[14] = 0x46;
    let total = u16::from_be_bytes([opt[16], opt[17]]) + 4;
    opt[16..18].copy_from_slice(&total.to_be_bytes());
    opt[24..26].fill(0);
    let sum = !(bareverbs::device::rxe::wire::ip::ones_sum(0, &opt[14..38]) as u16);
    opt[24..26].copy_from_slice(&sum.to_be_bytes());
    assert_eq!(kind(parse(&opt)), Err(Discard::BadIp), "IP options");
    assert_eq!(with(14 + 6, 0x20), Err(Discard::BadIp), "more fragments");
    assert_eq!(
        with(14 + 26, 0x01),
        Err(Discard::BadUdpChecksum),
        "a wrong UDP checksum"
    );
    assert_eq!(with(42 + 1, 0x01), Err(Discard::BadBth), "TVer 1");
    assert_eq!(with(42 + 3, 0x80), Err(Discard::BadBth), "P_Key 0xFF7F");
    assert_eq!(
        with(42, 0x40),
        Err(Discard::UnknownOpcode),
        "UD 0x44... is RD"
    );
    assert_eq!(with(42 + 9, 0x01), Err(Discard::BadIcrc), "a PSN bit");
    assert_eq!(
        with(f.len() - 6, 0x01),
        Err(Discard::BadIcrc),
        "a payload bit"
    );
    assert_eq!(
        with(f.len() - 1, 0x01),
        Err(Discard::BadIcrc),
        "an ICRC bit"
    );
    let mut partial = f.clone();
    partial[42 + 2] = 0x7F; // limited membership
    assert!(
        matches!(parse(&partial), Err(Discard::BadIcrc)),
        "accepted up to the ICRC"
    );
    // A UDP checksum that is right is accepted.
    let mut g = f.clone();
    let udp_len = 0x20usize;
    let mut sum = bareverbs::device::rxe::wire::ip::ones_sum(0, &IP_A);
    sum = bareverbs::device::rxe::wire::ip::ones_sum(sum, &IP_B);
    sum = bareverbs::device::rxe::wire::ip::ones_sum(sum, &[0, 17, 0, udp_len as u8]);
    sum = bareverbs::device::rxe::wire::ip::ones_sum(sum, &g[34..34 + udp_len]);
    g[40..42].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    assert!(matches!(parse(&g), Ok(Frame::Roce(_))), "{:?}", parse(&g));
    // Every truncation: refused (or, cut inside the Ethernet padding-free frame, never Ok).
    for n in 0..f.len() {
        match parse(&f[..n]) {
            Ok(Frame::Roce(_)) => panic!("a frame cut to {n} bytes was accepted"),
            Ok(Frame::Arp(_)) => panic!("ARP from a cut RoCE frame"),
            Ok(Frame::Other) | Err(_) => {}
        }
    }
    // Every single-bit flip from the IP header on: refused, except the bits the ICRC masks
    // and nothing checks (FECN, BECN and reserved bits of BTH byte 4).
    for at in 14..f.len() {
        for bit in 0..8 {
            let r = with(at, 1 << bit);
            if at == 42 + 4 {
                assert_eq!(r, Ok(Kind::Roce), "BTH byte 4 bit {bit}");
            } else if at == 42 + 2 && bit == 7 {
                // P_Key 0x7FFF (limited membership) is a legal P_Key: the ICRC refuses it.
                assert_eq!(r, Err(Discard::BadIcrc));
            } else {
                assert_ne!(r, Ok(Kind::Roce), "byte {at} bit {bit} accepted");
            }
        }
    }
}

proptest! {
    /// Random frames and random damage to a good one: classified or refused, never a panic,
    /// and a RoCE packet accepted only with its lengths inside the frame.
    #[test]
    fn hostile_frames_never_panic(
        noise in proptest::collection::vec(any::<u8>(), 0..200),
        edits in proptest::collection::vec((0usize..120, any::<u8>()), 0..8),
        cut in 0usize..120,
    ) {
        let _ = parse(&noise);
        let mut f = v1_frame();
        for (at, x) in edits {
            if let Some(b) = f.get_mut(at) {
                *b ^= x;
            }
        }
        let cut = cut.min(f.len());
        if let Ok(Frame::Roce(p)) = parse(&f[..cut]) {
            prop_assert!(p.payload.len() <= cut);
            prop_assert!(usize::from(p.ip.total_len) + 14 <= cut);
        }
    }
}

/// The packet read in place gives, for every opcode, the extended headers its layout
/// has — where the general parse (each header after the ones before it) finds them —
/// and no others, from frames whose every header byte differs.
#[test]
fn view_reads_what_the_general_parse_reads() {
    let route = Route {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_ip: [10, 0, 0, 1],
        dst_ip: [10, 0, 0, 2],
        tos: 0,
        ttl: 64,
        src_port: 0xC000,
    };
    let mut seen = 0;
    for op in 0..=255u8 {
        let Some(layout) = Layout::lookup(op) else {
            continue;
        };
        let mut h = Headers::new(Bth {
            opcode: op,
            se: op & 1 == 1,
            pad: 0,
            pkey: 0xFFFF,
            dest_qp: 0x12_3456,
            ack_req: op & 2 == 2,
            psn: 0xAB_CDEF,
        });
        h.deth = Some(Deth {
            qkey: 0x0102_0304,
            src_qp: 0x05_0607,
        });
        h.reth = Some(Reth {
            va: 0x1112_1314_1516_1718,
            rkey: 0x191A_1B1C,
            len: 0x1D1E_1F20,
        });
        h.atomic = Some(AtomicEth {
            va: 0x2122_2324_2526_2728,
            rkey: 0x292A_2B2C,
            swap_add: 0x3132_3334_3536_3738,
            compare: 0x393A_3B3C_3D3E_3F40,
        });
        h.aeth = Some(Aeth {
            syndrome: 0x41,
            msn: 0x42_4344,
        });
        h.atomic_ack = Some(0x5152_5354_5556_5758);
        h.imm = Some(0x6162_6364);
        let payload: &[u8] = if layout.payload() { b"abcde" } else { b"" };
        let mut buf = [0u8; 256];
        let n = build(&mut buf, &route, 7, &h, payload).unwrap();
        let Ok(Frame::Roce(p)) = parse(&buf[..n]) else {
            panic!("{op:#x}");
        };
        let (general, _) = Headers::parse(&buf[42..n]).unwrap();
        assert_eq!(p.headers, general, "{op:#x}");
        assert_eq!(p.payload, payload, "{op:#x}");
        // Each header present is the one written, and only those the layout has.
        let some = [
            p.headers.deth.map(|d| d == h.deth.unwrap()),
            p.headers.reth.map(|r| r == h.reth.unwrap()),
            p.headers.atomic.map(|a| a == h.atomic.unwrap()),
            p.headers.aeth.map(|a| a == h.aeth.unwrap()),
            p.headers.atomic_ack.map(|a| a == h.atomic_ack.unwrap()),
            p.headers.imm.map(|i| i == h.imm.unwrap()),
        ];
        assert!(some.iter().all(|s| *s != Some(false)), "{op:#x}");
        let lens = [8, 16, 28, 4, 8, 4];
        let ext: usize = some
            .iter()
            .zip(lens)
            .filter(|(s, _)| s.is_some())
            .map(|(_, l)| l)
            .sum();
        assert_eq!(12 + ext, layout.header_bytes(), "{op:#x}");
        seen += 1;
    }
    assert_eq!(seen, 25);
}

/// A frame is taken for RoCE (checked strictly: accepted or refused) exactly when it is
/// IPv4 UDP to port 4791 and not a fragment's tail — options or not, whatever its length —
/// and left to the IP stack otherwise; on frames mutated in the bytes that decide it.
#[test]
fn roce_is_told_from_the_rest_as_defined() {
    let be16 = |b: &[u8], at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
    // None: shorter than an Ethernet header (refused as truncated).
    let spec = |f: &[u8]| -> Option<bool> {
        if f.len() < 14 {
            return None;
        }
        let Some(body) = f.get(14..).filter(|_| be16(f, 12) == 0x0800) else {
            return Some(false);
        };
        let ihl = usize::from(body.first().map_or(0, |b| b & 0xF)) * 4;
        Some(
            body.len() >= ihl + 8
                && ihl >= 20
                && body[0] >> 4 == 4
                && body[9] == 17
                && be16(body, 6) & 0x1FFF == 0
                && be16(body, ihl + 2) == 4791,
        )
    };
    let route = Route {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_ip: [10, 0, 0, 1],
        dst_ip: [10, 0, 0, 2],
        tos: 0,
        ttl: 64,
        src_port: 0xC000,
    };
    let h = Headers::new(Bth {
        opcode: opcode::RC_SEND_ONLY,
        se: false,
        pad: 0,
        pkey: 0xFFFF,
        dest_qp: 17,
        ack_req: true,
        psn: 5,
    });
    let mut good = [0u8; 128];
    let n = build(&mut good, &route, 1, &h, b"payload!").unwrap();
    // The bytes that decide: version and IHL, protocol, flags and offset, the port at
    // every IHL, and the frame's length.
    let (mut x, mut roce, mut other) = (0x1234_5678u32, 0, 0);
    for _ in 0..20_000 {
        let mut f = good;
        for _ in 0..2 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let at = [14, 14, 23, 20, 21, 36, 37, 40, 41, 44, 45, 12, 13][x as usize % 13];
            let v = [
                0x45, 0x46, 0x4F, 0x55, 0x44, 17, 6, 0, 0x12, 0xB7, 0x20, 0x40, 0x08,
            ][(x >> 8) as usize % 13];
            f[at] = v;
        }
        let len = if x >> 20 & 1 == 0 {
            n
        } else {
            (x >> 21) as usize % (n + 1)
        };
        let f = &f[..len];
        let got = parse(f);
        match spec(f) {
            None => assert_eq!(got, Err(Discard::Truncated), "{f:?}"),
            Some(true) => {
                roce += 1;
                assert!(
                    !matches!(got, Ok(Frame::Other | Frame::Arp(_))),
                    "{f:?} {got:?}"
                );
            }
            Some(false) => {
                other += 1;
                assert_eq!(got, Ok(Frame::Other), "{f:?}");
            }
        }
    }
    assert!(roce > 1000 && other > 1000, "{roce} {other}");
}
