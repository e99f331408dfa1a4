//! The network is not trusted: a seeded mutation fuzzer on a third station of the segment.
//! It takes the two endpoints' own recent frames, or forges valid requests at the PSNs the
//! responders expect next (learnt from the wire), mangles their transport headers (opcode,
//! QPN, PSN, keys, addresses, lengths, syndromes) and lengths, sends them from the peers'
//! addresses or from foreign ones (its own, half-spoofed, martian, to another MAC), and
//! reseals the ICRC half the time (so that half pass the wire checks and reach the transport,
//! half exercise the parser). Since a connected QP takes packets from its peer only, a good
//! share of the frames are forged *as the peer*: its MAC, IPv4 address, UDP source port and
//! the destination QPN it uses, at the PSNs live on the connection (requests at the PSN the
//! responder expects next, responses at the PSNs the requester has outstanding), so that they
//! pass the peer check and reach the requester's and the responder's state machines.
//! A few frames a round go over IPv6: recorded frames between IPv6 addresses, neighbour
//! discovery, and UD SENDs to a UD QP of B's (and its GSI QP), which B takes on an IPv6 path
//! held for each datagram's delivery alone: at the end of a storm no such path is held.
//! Whatever it sends, the devices never panic, never write outside the memory they own (the
//! model's guard pages), complete every posted request exactly once, and give every page back.
//!
//! What the storms reached is counted from what the devices did, not estimated: QPs found in
//! the error state (queried each round) and the QP error events the devices raised,
//! completions by status as polled from the CQs (successes, flushes, errors), and the NAKs
//! the endpoints put on the segment.
//!
//! `a_hostile_station_cannot_make_the_devices_misbehave` runs a small fixed budget with the
//! suite; `the_mutation_fuzzer` runs the budget `RXE_FUZZ_FRAMES` from the seed
//! `RXE_FUZZ_SEED` in storms of [`STORM`] frames (seeds SEED, SEED+1, ...), counts the
//! storms that failed, and prints
//! `rxe-fuzz: N frames, F failures; QP errors X, flushes Y, completions Z, NAKs W, …, seed S`
//! (`tests/rxe_fuzz.sh` runs it in release and holds the counts to its floors).

use std::collections::HashMap;

mod fuzz_budget;

use bareverbs::Context;
use bareverbs::device::rxe::port::PATHS6;
use bareverbs::device::rxe::wire::bth::{
    AtomicEth, Bth, DEFAULT_PKEY, Deth, Headers, Reth, opcode,
};
use bareverbs::device::rxe::wire::icrc::icrc;
use bareverbs::device::rxe::wire::ip6::{Ip6, Ipv6Route, build6};
use bareverbs::device::rxe::wire::nd::{self, Nd, multicast_mac, solicited_node};
use bareverbs::device::rxe::wire::packet::{Frame, ROCE_OFFSET, Route, build, finish, parse};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig, Rng};

type R = Rxe<Model, MemLink, TestClock>;

/// Frames of one storm in the fuzzer (each storm: two fresh devices, a fresh segment).
const STORM: u32 = 20_000;
/// The stranger's own addresses.
const EVIL_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 66];
const EVIL_IP: [u8; 4] = [10, 0, 0, 66];

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
const SIG: SendFlags = SendFlags::SIGNALED;

/// What a storm reached, counted from what the devices did.
#[derive(Clone, Copy, Debug, Default)]
struct Reach {
    /// QPs found in the error state by a query (each QP once per time it was found there,
    /// before it was reset and connected again).
    qp_errors: u64,
    /// QP error events raised (fatal, request error, access error).
    qp_events: u64,
    /// Completions polled with the status "flushed".
    flushes: u64,
    /// Completions polled with the status "success".
    completions: u64,
    /// Completions polled with another error status.
    error_completions: u64,
    /// NAKs (AETH syndrome 011xxxxx) the endpoints sent.
    naks: u64,
    /// RNR NAKs (AETH syndrome 001xxxxx) the endpoints sent.
    rnr_naks: u64,
    /// Frames forged as the peer, at a live PSN.
    as_peer: u64,
    /// IPv6 frames sent (RoCEv2 over IPv6 and neighbour discovery, mangled or not).
    ipv6_sent: u64,
    /// RoCEv2 packets over IPv6 the ports checked whole (to one of their addresses).
    roce6_checked: u64,
    /// Neighbor Solicitations the devices answered.
    nd_answered: u64,
    /// Neighbour discovery messages the ports refused (RFC 4861's checks).
    nd_refused: u64,
    /// UD SENDs over IPv6 forged to B's UD QP (or its GSI QP), mangled or not.
    ud6_sent: u64,
    /// Of those, the ones B's UD QP took (completed successfully).
    ud6_taken: u64,
}

impl Reach {
    fn add(&mut self, o: &Reach) {
        self.qp_errors += o.qp_errors;
        self.qp_events += o.qp_events;
        self.flushes += o.flushes;
        self.completions += o.completions;
        self.error_completions += o.error_completions;
        self.naks += o.naks;
        self.rnr_naks += o.rnr_naks;
        self.as_peer += o.as_peer;
        self.ipv6_sent += o.ipv6_sent;
        self.roce6_checked += o.roce6_checked;
        self.nd_answered += o.nd_answered;
        self.nd_refused += o.nd_refused;
        self.ud6_sent += o.ud6_sent;
        self.ud6_taken += o.ud6_taken;
    }
}

/// Counts the (N)AKs among `frame` if it is an endpoint's acknowledge.
fn count_ack(reach: &mut Reach, frame: &[u8]) {
    if let Ok(Frame::Roce(p)) = parse(frame)
        && let Some(a) = p.headers.aeth
    {
        match a.syndrome >> 5 {
            0b011 => reach.naks += 1,
            0b001 => reach.rnr_naks += 1,
            _ => {}
        }
    }
}

fn up<'a>(
    qp: QueuePair<'a, R, Rc, Reset>,
    peer: u32,
    ip: [u8; 4],
    (sq, rq): (u32, u32),
) -> QueuePair<'a, R, Rc, Rts> {
    let init = ConnectedInit {
        access: ALL,
        ..Default::default()
    };
    let qp = qp.init(&init).map_err(|(_, e)| e).unwrap();
    let mut rtr = ConnectedRtr::new(peer, rq, AddressVector::new(Gid::from_ipv4(ip), 1));
    (rtr.path_mtu, rtr.max_dest_rd_atomic) = (Mtu::Mtu256, 4);
    let qp = qp.rtr(&rtr).map_err(|(_, e)| e).unwrap();
    let mut rts = ConnectedRts::new(sq);
    (rts.max_rd_atomic, rts.timeout, rts.retry_cnt) = (4, 6, 3);
    qp.rts(&rts).map_err(|(_, e)| e).unwrap()
}

/// A frame with its transport header and lengths mangled (the ICRC left as it was: the
/// caller reseals it or not).
fn mangle(rng: &mut Rng, frame: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = ROCE_OFFSET + rng.below(40) as usize;
        if at < f.len() {
            f[at] = rng.next_u64() as u8;
        }
    }
    match rng.below(8) {
        // A payload cut short or grown (IPv4 and UDP lengths follow, or not).
        0 => {
            let n = f
                .len()
                .saturating_sub(rng.below(300) as usize)
                .max(ROCE_OFFSET + 12);
            f.truncate(n);
        }
        1 => f.extend((0..rng.below(600)).map(|_| rng.next_u64() as u8)),
        2 => {
            let at = 14 + 2 + rng.below(2) as usize * 22; // IPv4 total or UDP length
            f[at] = rng.next_u64() as u8;
        }
        _ => {}
    }
    f
}

/// The IPv4 header checksum of `f`'s header, made valid again.
fn reseal_ip(f: &mut [u8]) {
    if f.len() < 34 {
        return;
    }
    f[24..26].fill(0);
    let mut sum: u32 = f[14..34]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    f[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

/// Who the frame seems to come from (and go to): the peer's own addresses half the time, else
/// the stranger's, a half-spoof (the peer's IP with the stranger's MAC, or the reverse), a
/// martian source (the receiver's own IP, 0.0.0.0, multicast), or another destination MAC.
fn disguise(rng: &mut Rng, f: &mut [u8]) {
    if f.len() < 34 || rng.below(2) == 0 {
        return;
    }
    let dst_ip: [u8; 4] = f[30..34].try_into().unwrap();
    match rng.below(6) {
        0 => {
            f[6..12].copy_from_slice(&EVIL_MAC);
            f[26..30].copy_from_slice(&EVIL_IP);
        }
        1 => f[6..12].copy_from_slice(&EVIL_MAC),
        2 => f[26..30].copy_from_slice(&EVIL_IP),
        3 => f[26..30].copy_from_slice(&dst_ip),
        4 => f[26..30].copy_from_slice(
            &[[0, 0, 0, 0], [224, 0, 0, 1], [127, 0, 0, 1]][rng.below(3) as usize],
        ),
        _ => f[..6].copy_from_slice(&EVIL_MAC),
    }
    // The IPv4 checksum made valid again most of the time (else the IP check drops it).
    if rng.below(4) != 0 {
        reseal_ip(f);
    }
}

/// A frame forged from the latest request `seen` on the wire: the PSN its responder expects
/// next, a random request opcode, and remote addresses, keys and lengths near the real ones
/// (or anywhere).
fn forge(rng: &mut Rng, seen: &[u8]) -> Option<Vec<u8>> {
    let Ok(Frame::Roce(p)) = parse(seen) else {
        return None;
    };
    let route = Route {
        src_mac: p.src_mac,
        dst_mac: seen[..6].try_into().ok()?,
        src_ip: p.ip.src,
        dst_ip: p.ip.dst,
        tos: 0,
        ttl: 64,
        src_port: p.udp.src_port,
    };
    let mut h = p.headers;
    // The PSN the responder expects next: after a READ request, one past the responses it
    // asked for (256-byte MTU).
    let step = match (h.bth.opcode, h.reth) {
        (opcode::RC_READ_REQUEST, Some(r)) => r.len.div_ceil(256).max(1),
        _ => 1,
    };
    h.bth.psn = h.bth.psn.wrapping_add(step) & 0xFF_FFFF;
    const OPS: [u8; 12] = [
        opcode::RC_SEND_FIRST,
        opcode::RC_SEND_MIDDLE,
        opcode::RC_SEND_LAST,
        opcode::RC_SEND_ONLY_IMM,
        opcode::RC_WRITE_FIRST,
        opcode::RC_WRITE_MIDDLE,
        opcode::RC_WRITE_LAST_IMM,
        opcode::RC_WRITE_ONLY,
        opcode::RC_READ_REQUEST,
        opcode::RC_COMPARE_SWAP,
        opcode::RC_FETCH_ADD,
        opcode::RC_ACK,
    ];
    h.bth.opcode = OPS[rng.below(OPS.len() as u64) as usize];
    let (va, rkey) = match (h.reth, h.atomic) {
        (Some(r), _) => (r.va, r.rkey),
        (_, Some(a)) => (a.va, a.rkey),
        _ => (rng.next_u64(), rng.next_u64() as u32),
    };
    let near = |rng: &mut Rng| match rng.below(3) {
        0 => rng.next_u64(),
        1 => va.wrapping_add(rng.below(16384)).wrapping_sub(8192),
        _ => va.wrapping_add(rng.below(64)),
    };
    let key = |rng: &mut Rng| {
        if rng.below(4) == 0 {
            rng.next_u64() as u32
        } else {
            rkey
        }
    };
    let len = [0u32, 1, 8, 255, 256, 4096, 0x7FFF_FFFF, u32::MAX][rng.below(8) as usize];
    h.reth = matches!(h.bth.opcode, 0x06 | 0x0A | 0x0B | 0x0C).then(|| Reth {
        va: near(rng),
        rkey: key(rng),
        len,
    });
    h.atomic = matches!(h.bth.opcode, 0x13 | 0x14).then(|| AtomicEth {
        va: near(rng),
        rkey: key(rng),
        swap_add: rng.next_u64(),
        compare: rng.next_u64(),
    });
    h.imm = matches!(h.bth.opcode, 0x03 | 0x09 | 0x05 | 0x0B).then(|| rng.next_u64() as u32);
    h.aeth = (h.bth.opcode == opcode::RC_ACK).then(|| bareverbs::device::rxe::wire::bth::Aeth {
        syndrome: rng.next_u64() as u8,
        msn: 0,
    });
    h.deth = None;
    h.atomic_ack = None;
    let payload: Vec<u8> = match h.bth.opcode {
        0x0C..=0x14 => Vec::new(),
        _ => (0..[0usize, 1, 100, 256, 257][rng.below(5) as usize])
            .map(|_| rng.next_u64() as u8)
            .collect(),
    };
    let mut buf = vec![0u8; 1600];
    let n = build(&mut buf, &route, 7, &h, &payload)?;
    buf.truncate(n);
    Some(buf)
}

/// A response forged as the responder: the route and destination QPN of `resp` (the latest
/// frame the responder sent the requester: its MAC, IPv4 address, UDP source port), at a PSN
/// the requester has outstanding (that of `req`, the latest request, or a little before), a
/// random response opcode and syndrome (ACK, RNR NAK, the NAK codes, or anything), an MSN near
/// the live one, and a payload of a READ response's sizes.
fn forge_response(rng: &mut Rng, req: &[u8], resp: &[u8]) -> Option<Vec<u8>> {
    let (Ok(Frame::Roce(q)), Ok(Frame::Roce(r))) = (parse(req), parse(resp)) else {
        return None;
    };
    let route = Route {
        src_mac: r.src_mac,
        dst_mac: resp[..6].try_into().ok()?,
        src_ip: r.ip.src,
        dst_ip: r.ip.dst,
        tos: 0,
        ttl: 64,
        src_port: r.udp.src_port,
    };
    let mut h = bareverbs::device::rxe::wire::bth::Headers::new(r.headers.bth);
    // The requester's outstanding PSNs end at the latest request's last one.
    let last = match (q.headers.bth.opcode, q.headers.reth) {
        (opcode::RC_READ_REQUEST, Some(x)) => x.len.div_ceil(256).max(1) - 1,
        _ => 0,
    };
    let back = rng.below(4) as u32;
    h.bth.psn = q.headers.bth.psn.wrapping_add(last).wrapping_sub(back) & 0xFF_FFFF;
    if rng.below(8) == 0 {
        h.bth.psn = rng.next_u64() as u32 & 0xFF_FFFF;
    }
    const OPS: [u8; 6] = [
        opcode::RC_READ_RESPONSE_FIRST,
        opcode::RC_READ_RESPONSE_MIDDLE,
        opcode::RC_READ_RESPONSE_LAST,
        opcode::RC_READ_RESPONSE_ONLY,
        opcode::RC_ACK,
        opcode::RC_ATOMIC_ACK,
    ];
    h.bth.opcode = OPS[rng.below(OPS.len() as u64) as usize];
    h.bth.ack_req = false;
    let msn = r.headers.aeth.map_or(0, |a| a.msn);
    let syndrome = match rng.below(10) {
        0 => rng.below(32) as u8,           // ACK with credits
        1 => 0x1F,                          // ACK, credits invalid
        2 => 0x20 | rng.below(32) as u8,    // RNR NAK
        3..=7 => 0x60 | rng.below(5) as u8, // NAK: sequence, invalid, access, op, RD
        _ => rng.next_u64() as u8,          // anything
    };
    h.aeth = matches!(h.bth.opcode, 0x0D | 0x0F | 0x10 | 0x11 | 0x12).then(|| {
        bareverbs::device::rxe::wire::bth::Aeth {
            syndrome,
            msn: match rng.below(3) {
                0 => msn,
                1 => msn.wrapping_add(1 + rng.below(3) as u32) & 0xFF_FFFF,
                _ => rng.next_u64() as u32 & 0xFF_FFFF,
            },
        }
    });
    h.atomic_ack = (h.bth.opcode == opcode::RC_ATOMIC_ACK).then(|| rng.next_u64());
    let payload: Vec<u8> = match h.bth.opcode {
        0x0D..=0x10 => (0..[0usize, 1, 100, 255, 256, 257][rng.below(6) as usize])
            .map(|_| rng.next_u64() as u8)
            .collect(),
        _ => Vec::new(),
    };
    let mut buf = vec![0u8; 1600];
    let n = build(&mut buf, &route, 7, &h, &payload)?;
    buf.truncate(n);
    Some(buf)
}

#[test]
fn a_hostile_station_cannot_make_the_devices_misbehave() {
    let mut reach = Reach::default();
    for seed in [1u64, 42, 20261123] {
        reach.add(&storm(seed, 10_000));
    }
    // Frames forged as the peer reach both state machines: QPs break, requests flush.
    assert!(reach.qp_errors > 0 && reach.flushes > 0, "{reach:?}");
    assert!(reach.naks > 0 && reach.completions > 0, "{reach:?}");
}

/// The fuzzer: `RXE_FUZZ_FRAMES` frames (default 20,000) from `RXE_FUZZ_SEED` (default 1), in
/// storms of [`STORM`] frames; each failed storm prints the seed that replays it.
#[test]
fn the_mutation_fuzzer() {
    let mut reach = Reach::default();
    let spent = fuzz_budget::spend(
        "rxe-fuzz",
        "storm",
        "rxe_fuzz.sh",
        ("RXE_FUZZ_FRAMES", 20_000),
        "RXE_FUZZ_SEED",
        u64::from(STORM),
        // At most STORM frames a storm: the count fits its u32.
        |s, n| storm(s, n as u32),
        |r| reach.add(&r),
    );
    let fuzz_budget::Spent {
        seed,
        done,
        failures,
        secs,
    } = spent;
    eprintln!(
        "rxe-fuzz: {:.0} frames/s ({done} frames in {secs:.1} s); {} forged as the peer at live \
         PSNs, QP error events {}, error completions {}, RNR NAKs {}",
        done as f64 / secs.max(1e-9),
        reach.as_peer,
        reach.qp_events,
        reach.error_completions,
        reach.rnr_naks,
    );
    println!(
        "rxe-fuzz: {done} frames, {failures} failures; QP errors {}, flushes {}, completions {}, \
         NAKs {}, IPv6 frames {}, IPv6 RoCE checked {}, ND answered {}, ND refused {}, \
         UD6 sent {}, UD6 taken {}, seed {seed}",
        reach.qp_errors,
        reach.flushes,
        reach.completions,
        reach.naks,
        reach.ipv6_sent,
        reach.roce6_checked,
        reach.nd_answered,
        reach.nd_refused,
        reach.ud6_sent,
        reach.ud6_taken
    );
    assert_eq!(failures, 0, "rxe-fuzz: {failures} storms failed");
}

/// The endpoints' frames since the last look: kept as material (a ring of 256), the latest
/// request of the requester (A, station 0) and the latest response of the responder (B,
/// station 1) remembered, the NAKs counted.
#[derive(Default)]
struct Wire {
    seen: usize,
    next: usize,
    recorded: Vec<Vec<u8>>,
    last_req: Option<Vec<u8>>,
    last_resp: Option<Vec<u8>>,
}

impl Wire {
    fn look(&mut self, seg: &Segment, reach: &mut Reach) {
        let fresh = seg.sent_since(self.seen);
        self.seen += fresh.len();
        for (from, f) in fresh {
            if from >= 2 || f.len() <= ROCE_OFFSET + 12 || f[12..14] != [8, 0] {
                continue;
            }
            count_ack(reach, &f);
            let op = f[ROCE_OFFSET];
            if from == 0 && (op < 0x0D || op == 0x13 || op == 0x14) {
                self.last_req = Some(f.clone());
            }
            if from == 1 && (0x0D..=0x12).contains(&op) {
                self.last_resp = Some(f.clone());
            }
            if self.recorded.len() < 256 {
                self.recorded.push(f);
            } else {
                self.recorded[self.next % 256] = f;
            }
            self.next += 1;
        }
    }
}

/// The devices' MACs (A, B) and a global IPv6 address each has.
const MACS: [[u8; 6]; 2] = [[0x52, 0x54, 0, 0, 0, 2], [0x52, 0x54, 0, 0, 0, 3]];

fn global6(last: u8) -> Ip6 {
    let mut a = [0u8; 16];
    a[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    a[15] = last;
    a
}

/// An IPv6 address from the devices', the stranger's, or one no station has.
fn addr6(rng: &mut Rng) -> Ip6 {
    match rng.below(6) {
        0 => Gid::link_local_from_mac(MACS[0]).0,
        1 => Gid::link_local_from_mac(MACS[1]).0,
        2 => global6(2 + rng.below(2) as u8),
        3 => Gid::link_local_from_mac(EVIL_MAC).0,
        4 => [[0; 16], nd::ALL_NODES, Gid::from_ipv4(EVIL_IP).0][rng.below(3) as usize],
        _ => {
            let mut a = global6(0);
            a[8..].copy_from_slice(&rng.next_u64().to_be_bytes());
            a
        }
    }
}

/// An IPv6 frame from the stranger: a recorded RoCEv2 frame carried over IPv6 between
/// addresses [`addr6`] picks (with traffic class, flow label and hop limit at random), or a
/// Neighbor Solicitation or Advertisement about them; then bytes flipped and lengths
/// changed now and then, the ICRC or the ICMPv6 checksum made right again half the time.
fn ipv6_frame(rng: &mut Rng, recorded: &[u8]) -> Vec<u8> {
    let dst_mac = if rng.below(4) == 0 {
        [0x33, 0x33, 0xFF, 0, 0, rng.below(4) as u8]
    } else {
        MACS[rng.below(2) as usize]
    };
    let src_mac = if rng.below(2) == 0 {
        EVIL_MAC
    } else {
        MACS[rng.below(2) as usize]
    };
    let mut f = if rng.below(2) == 0 {
        let Ok(Frame::Roce(p)) = parse(recorded) else {
            return Vec::new();
        };
        let route = Ipv6Route {
            src_mac,
            dst_mac,
            src: addr6(rng),
            dst: addr6(rng),
            traffic_class: rng.next_u64() as u8,
            flow_label: rng.next_u64() as u32,
            hop_limit: rng.next_u64() as u8,
            src_port: p.udp.src_port,
        };
        let mut buf = vec![0u8; 2048];
        let Some(n) = build6(&mut buf, &route, &p.headers, p.payload) else {
            return Vec::new();
        };
        buf.truncate(n);
        buf
    } else {
        let target = addr6(rng);
        let m = Nd {
            kind: if rng.below(2) == 0 { nd::NS } else { nd::NA },
            src: addr6(rng),
            dst: if rng.below(2) == 0 {
                solicited_node(&target)
            } else {
                addr6(rng)
            },
            target,
            lladdr: (rng.below(4) != 0).then_some(src_mac),
            flags: (rng.next_u64() as u32) & 0xE000_0000,
        };
        let dst_mac = if rng.below(2) == 0 {
            multicast_mac(&solicited_node(&target))
        } else {
            dst_mac
        };
        let (b, n) = m.frame(src_mac, dst_mac);
        b[..n].to_vec()
    };
    let icmp = f.get(20) == Some(&58);
    mangle6(rng, &mut f, icmp);
    f
}

/// A UD SEND over IPv6 from the stranger to B's global address (now and then another
/// [`addr6`]), to B's UD QP `qpn` or its GSI QP, with its Q_Key or another, from an address
/// [`addr6`] picks; mangled as [`ipv6_frame`] mangles.
fn ud6_frame(rng: &mut Rng, qpn: u32, qkey: u32) -> Vec<u8> {
    let mut h = Headers::new(Bth {
        opcode: [opcode::UD_SEND_ONLY, opcode::UD_SEND_ONLY_IMM][rng.below(2) as usize],
        se: false,
        pad: 0,
        pkey: DEFAULT_PKEY,
        dest_qp: if rng.below(8) == 0 { 1 } else { qpn },
        ack_req: false,
        psn: rng.next_u64() as u32 & 0xFF_FFFF,
    });
    h.deth = Some(Deth {
        qkey: if rng.below(4) == 0 { 0x8001_0000 } else { qkey },
        src_qp: rng.next_u64() as u32 & 0xFF_FFFF,
    });
    h.imm = Some(rng.next_u64() as u32);
    let route = Ipv6Route {
        src_mac: EVIL_MAC,
        dst_mac: MACS[1],
        src: addr6(rng),
        dst: if rng.below(4) == 0 {
            addr6(rng)
        } else {
            global6(3)
        },
        traffic_class: rng.next_u64() as u8,
        flow_label: rng.next_u64() as u32,
        hop_limit: rng.next_u64() as u8,
        src_port: 0xC000 | rng.next_u64() as u16,
    };
    let payload: Vec<u8> = (0..rng.below(600)).map(|i| i as u8).collect();
    let mut buf = vec![0u8; 2048];
    let Some(n) = build6(&mut buf, &route, &h, &payload) else {
        return Vec::new();
    };
    buf.truncate(n);
    if rng.below(2) == 0 {
        mangle6(rng, &mut buf, false);
    }
    buf
}

/// Bytes flipped and lengths changed half the time, the ICRC or the ICMPv6 checksum made
/// right again half of those.
fn mangle6(rng: &mut Rng, f: &mut Vec<u8>, icmp: bool) {
    if rng.below(2) == 0 {
        for _ in 0..1 + rng.below(3) {
            let at = 14 + rng.below(f.len().saturating_sub(14) as u64) as usize;
            if at < f.len() {
                f[at] = rng.next_u64() as u8;
            }
        }
        match rng.below(6) {
            0 => f.truncate(f.len().saturating_sub(rng.below(40) as usize).max(14)),
            1 => f.extend((0..rng.below(64)).map(|_| rng.next_u64() as u8)),
            2 if f.len() > 60 => {
                // The IPv6 payload length or the UDP (or ICMPv6) bytes after the addresses.
                let at = [18, 19, 58, 59][rng.below(4) as usize];
                f[at] = rng.next_u64() as u8;
            }
            _ => {}
        }
        if rng.below(2) == 0 {
            reseal6(f, icmp);
        }
    }
}

/// The ICRC (RoCEv2) or the ICMPv6 checksum (neighbour discovery) of an IPv6 frame made
/// right again for what it now holds (by the IPv6 payload length, when the frame has it).
fn reseal6(f: &mut [u8], icmp: bool) {
    if f.len() < 54 + 8 {
        return;
    }
    let end = (54 + usize::from(u16::from_be_bytes([f[18], f[19]]))).min(f.len());
    if icmp {
        f[56..58].fill(0);
        let mut sum: u32 = 0;
        let mut add = |b: &[u8]| {
            for w in b.chunks(2) {
                sum += u32::from(w[0]) << 8 | u32::from(*w.get(1).unwrap_or(&0));
            }
        };
        add(&f[22..54]);
        add(&((end - 54) as u32).to_be_bytes());
        add(&[0, 0, 0, 58]);
        add(&f[54..end]);
        while sum > 0xFFFF {
            sum = (sum & 0xFFFF) + (sum >> 16);
        }
        f[56..58].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    } else if end >= 54 + 8 + 12 + 4
        && let Some(c) = icrc(&f[14..end - 4])
    {
        f[end - 4..end].copy_from_slice(&c.to_le_bytes());
    }
}

fn storm(seed: u64, frames: u32) -> Reach {
    let model = Model::new(ModelConfig::default());
    // The devices' seeds (keys, PSNs) follow the storm's.
    model.set_seed(seed);
    let seg = Segment::new();
    let clk = TestClock::default();
    let la = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let lb = seg.attach([0x52, 0x54, 0, 0, 0, 3], 1514);
    let _evil = seg.attach(EVIL_MAC, 1514);
    let a = Context::new(
        Rxe::new(model.clone(), la, clk.clone(), Config { ip: [10, 0, 0, 2] }).unwrap(),
    );
    let b = Context::new(
        Rxe::new(model.clone(), lb, clk.clone(), Config { ip: [10, 0, 0, 3] }).unwrap(),
    );
    assert_eq!(a.provider().add_ipv6(global6(2)), Ok(2));
    assert_eq!(b.provider().add_ipv6(global6(3)), Ok(2));
    let mut reach = Reach::default();
    let mut wire = Wire::default();
    let pump = |n: u32| {
        for _ in 0..n {
            clk.advance(200);
            a.process_events();
            b.process_events();
        }
    };
    let events = |reach: &mut Reach| {
        for ctx in [&a, &b] {
            // Bounded: the hub holds a finite number of events.
            for _ in 0..1024 {
                match ctx.get_async_event() {
                    Some(
                        AsyncEvent::QpFatal(_)
                        | AsyncEvent::QpRequestError(_)
                        | AsyncEvent::QpAccessError(_),
                    ) => reach.qp_events += 1,
                    Some(_) => {}
                    None => break,
                }
            }
        }
    };
    let mut rng = Rng::new(seed);
    let mut posted: HashMap<u64, u32> = HashMap::new();
    let mut done: HashMap<u64, u32> = HashMap::new();
    {
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
        let caps = QpCaps {
            max_send_wr: 32,
            max_recv_wr: 32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qa = pa.qp_builder(&ca, &ca).caps(caps).build::<Rc>().unwrap();
        let qb = pb.qp_builder(&cb, &cb).caps(caps).build::<Rc>().unwrap();
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        let (psn_a, psn_b) = (a.random_psn(), b.random_psn());
        let mut qa = up(qa, nb, [10, 0, 0, 3], (psn_a, psn_b));
        let mut qb = up(qb, na, [10, 0, 0, 2], (psn_b, psn_a));
        let ma = pa.register(8192, ALL).unwrap();
        let mb = pb.register(8192, ALL).unwrap();
        // B's UD QP, on a CQ of its own, for the datagrams over IPv6 (no address handle: B
        // holds no IPv6 path, each datagram goes by one of its own for its delivery).
        let cu = b.create_cq(64).unwrap();
        let ub = pb.qp_builder(&cu, &cu).caps(caps).build::<Ud>().unwrap();
        let nu = ub.qp_num();
        let mut ub = ub.ready(0x0DD6_0000, 0).unwrap();
        let mu = pb.register(2048, ALL).unwrap();
        let mut wc = [WorkCompletion::default(); 16];
        let mut take =
            |cq: &CompletionQueue<'_, R>, done: &mut HashMap<u64, u32>, reach: &mut Reach| loop {
                let n = cq.poll(&mut wc).unwrap();
                if n == 0 {
                    break;
                }
                for w in &wc[..n] {
                    *done.entry(w.wr_id).or_default() += 1;
                    match w.status {
                        WcStatus::Success => reach.completions += 1,
                        WcStatus::WrFlushErr => reach.flushes += 1,
                        _ => reach.error_completions += 1,
                    }
                }
            };
        let mut id = 0u64;
        let take_ud = |done: &mut HashMap<u64, u32>, reach: &mut Reach| {
            let mut wu = [WorkCompletion::default(); 16];
            loop {
                let n = cu.poll(&mut wu).unwrap();
                if n == 0 {
                    break;
                }
                for w in &wu[..n] {
                    *done.entry(w.wr_id).or_default() += 1;
                    match w.status {
                        WcStatus::Success => reach.ud6_taken += 1,
                        WcStatus::WrFlushErr => reach.flushes += 1,
                        _ => reach.error_completions += 1,
                    }
                }
            }
        };
        for round in 0..frames.div_ceil(50) {
            // SAFETY: the region stays registered until the QP is destroyed.
            unsafe {
                let mut r = ub.recv_batch();
                id += 1;
                if r.recv(id, &[mu.sge(0, 2048).unwrap()]).is_ok() {
                    posted.insert(id, 1);
                }
                r.finish();
            }
            // Legitimate traffic, while the queues have room (an errored QP flushes it).
            // SAFETY: the regions stay registered until the QPs are destroyed.
            unsafe {
                let mut r = qb.recv_batch();
                id += 1;
                if r.recv(id, &[mb.sge(0, 2048).unwrap()]).is_ok() {
                    posted.insert(id, 1);
                }
                r.finish();
                let mut s = qa.send_batch();
                for k in 0..3u64 {
                    id += 1;
                    let len = rng.below(1500) as u32;
                    let ok = match (round as u64 + k) % 4 {
                        0 => s.send(id, SIG, &[ma.sge(0, len).unwrap()]),
                        1 => s.rdma_write(
                            id,
                            SIG,
                            (mb.addr() + 4096, mb.rkey()),
                            &[ma.sge(0, len).unwrap()],
                        ),
                        2 => s.rdma_read(
                            id,
                            SIG,
                            (mb.addr(), mb.rkey()),
                            &[ma.sge(4096, len).unwrap()],
                        ),
                        _ => s.atomic_fetch_add(
                            id,
                            SIG,
                            (mb.addr() + 8000, mb.rkey()),
                            1,
                            &ma.sge(8000, 8).unwrap(),
                        ),
                    };
                    if ok.is_ok() {
                        posted.insert(id, 1);
                    }
                }
                s.finish();
            }
            // The requests go out, and part of them is answered: the storm comes while
            // the rest is in flight (its PSNs outstanding).
            pump(1 + rng.below(3) as u32);
            wire.look(&seg, &mut reach);
            for _ in 0..50 {
                if wire.recorded.is_empty() {
                    break;
                }
                let (mut frame, peer) = match rng.below(8) {
                    // A request as the requester, at the PSN its responder expects next.
                    0..=1 if wire.last_req.is_some() => {
                        let l = wire.last_req.as_ref().unwrap();
                        (forge(&mut rng, l).unwrap_or_else(|| l.clone()), true)
                    }
                    // A response as the responder, at a PSN the requester has outstanding.
                    2..=3 if wire.last_req.is_some() && wire.last_resp.is_some() => {
                        let (q, r) = (wire.last_req.as_ref(), wire.last_resp.as_ref());
                        let g = forge_response(&mut rng, q.unwrap(), r.unwrap());
                        (g.unwrap_or_else(|| r.unwrap().clone()), true)
                    }
                    _ => {
                        let f = &wire.recorded[rng.below(wire.recorded.len() as u64) as usize];
                        (mangle(&mut rng, f), false)
                    }
                };
                if peer {
                    // As the peer: sealed and from its addresses, mangled now and then.
                    reach.as_peer += 1;
                    if rng.below(8) == 0 {
                        frame = mangle(&mut rng, &frame);
                        let _ = finish(&mut frame);
                    }
                } else {
                    disguise(&mut rng, &mut frame);
                    // The ICRC resealed half the time: those reach the transport, the others
                    // test the parser.
                    if rng.below(2) == 0 {
                        let _ = finish(&mut frame);
                    }
                }
                seg.inject(2, &frame);
                if rng.below(4) == 0 {
                    pump(1);
                    wire.look(&seg, &mut reach);
                }
            }
            // A few IPv6 frames a round: RoCEv2 over IPv6 and neighbour discovery.
            for _ in 0..4 {
                let i = rng.below(wire.recorded.len().max(1) as u64) as usize;
                let f = ipv6_frame(&mut rng, wire.recorded.get(i).map_or(&[][..], |v| v));
                if f.len() >= 14 {
                    seg.inject(2, &f);
                    reach.ipv6_sent += 1;
                }
            }
            // And a UD SEND over IPv6 to B's UD QP.
            let f = ud6_frame(&mut rng, nu, 0x0DD6_0000);
            if f.len() >= 14 {
                seg.inject(2, &f);
                reach.ud6_sent += 1;
            }
            pump(5);
            wire.look(&seg, &mut reach);
            take(&ca, &mut done, &mut reach);
            take(&cb, &mut done, &mut reach);
            take_ud(&mut done, &mut reach);
            events(&mut reach);
            // A QP the storm put in error: flushed (its completions counted), reset, and
            // connected again, so that the storm keeps reaching live QPs.
            let err = |q: &QueuePair<'_, R, Rc, Rts>| q.query().unwrap().state == QpState::Err;
            let (ea, eb) = (err(&qa), err(&qb));
            if ea || eb {
                reach.qp_errors += u64::from(ea) + u64::from(eb);
                let ea = qa.to_error().map_err(|(_, e)| e).unwrap();
                let eb = qb.to_error().map_err(|(_, e)| e).unwrap();
                pump(2);
                wire.look(&seg, &mut reach);
                take(&ca, &mut done, &mut reach);
                take(&cb, &mut done, &mut reach);
                let (psn_a, psn_b) = (a.random_psn(), b.random_psn());
                let ea = ea.reset().map_err(|(_, e)| e).unwrap();
                let eb = eb.reset().map_err(|(_, e)| e).unwrap();
                qa = up(ea, nb, [10, 0, 0, 3], (psn_a, psn_b));
                qb = up(eb, na, [10, 0, 0, 2], (psn_b, psn_a));
                // The new connection's PSNs are learnt from its own frames.
                (wire.last_req, wire.last_resp) = (None, None);
            }
        }
        assert!(
            reach.qp_errors > 0,
            "seed {seed}: the storm never broke a connection"
        );
        // The storm reached the transports (a valid ICRC), not only the wire checks.
        let (ra, rb) = (a.provider().port_counts(), b.provider().port_counts());
        reach.roce6_checked = ra.roce6 + rb.roce6;
        reach.nd_answered = ra.nd_answered + rb.nd_answered;
        reach.nd_refused = ra.nd_invalid + rb.nd_invalid;
        assert!(
            ra.roce + rb.roce > u64::from(frames / 8),
            "seed {seed}: {ra:?} {rb:?}"
        );
        // No IPv6 path left held by the datagrams: B makes PATHS6 handles of its own.
        let ahs: Vec<_> = (0..PATHS6 as u32)
            .map(|i| {
                let mut v = AddressVector::new(Gid(global6(200)), 2);
                v.flow_label = i;
                pb.create_ah(&v)
            })
            .collect();
        assert!(
            ahs.iter().all(Result::is_ok),
            "seed {seed}: an IPv6 path was left held"
        );
        drop(ahs);
        // The end: the QPs to ERROR; whatever is outstanding completes, flushed.
        let qa = qa.to_error().map_err(|(_, e)| e).unwrap();
        let qb = qb.to_error().map_err(|(_, e)| e).unwrap();
        let ub = ub.to_error().map_err(|(_, e)| e).unwrap();
        pump(10);
        wire.look(&seg, &mut reach);
        take(&ca, &mut done, &mut reach);
        take(&cb, &mut done, &mut reach);
        take_ud(&mut done, &mut reach);
        events(&mut reach);
        let twice: Vec<_> = done.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "seed {seed}: completed more than once: {twice:?}"
        );
        let missing: Vec<_> = posted.keys().filter(|k| !done.contains_key(k)).collect();
        assert!(
            missing.is_empty(),
            "seed {seed}: never completed: {missing:?}"
        );
        let extra: Vec<_> = done.keys().filter(|k| !posted.contains_key(k)).collect();
        assert!(
            extra.is_empty(),
            "seed {seed}: completions of nothing posted: {extra:?}"
        );
        drop((qa, qb, ub, ma, mb, mu));
    }
    drop(a);
    drop(b);
    assert_eq!(model.outstanding_pages(), 0, "seed {seed}: every page back");
    assert!(
        model.check_guards(),
        "seed {seed}: nothing written outside the DMA blocks"
    );
    reach
}
