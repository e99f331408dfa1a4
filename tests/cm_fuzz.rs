//! The CM under hostile MADs: a seeded fuzzer. A and B (CMs on software RoCE devices on the
//! in-memory segment) hold a long-lived connection (the bystander) and, one after another,
//! make short ones: A connects, B accepts or rejects as planned, one side disconnects. A
//! third station injects mutated CM messages (REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR,
//! taken from what A and B sent, their attribute, IDs, transaction ID, fields and private
//! data mangled, resealed so that they reach the CM) during each short connection:
//! - in a stranger's episode, from the stranger's own addresses (or martian ones), to A or
//!   B, naming any connection, the bystander's too;
//! - in a peer's episode, from the peer's own addresses (its MAC and IP: what a station that
//!   spoofs the peer can send), never naming the bystander;
//! - in a stranger's episode, a quarter of them over IPv6 (every station has an IPv6 address
//!   beside its IPv4 one), from the stranger's IPv6 address or one nobody has, their REQs and
//!   SIDR_REQs often given rdma_cm's IPv6 header (addresses the stranger's, the peers', or
//!   any; the IP version mangled now and then).
//!
//! The oracles: no panic; every wait bounded (each episode ends within a bound of the test
//! clock: its connection established and disconnected, rejected, or timed out); nothing a
//! stranger sends changes another connection's state (a stranger's episode ends exactly as
//! planned, the bystander never sees an event and still carries data at the end, then
//! disconnects cleanly); the CMs' tables come back to the bystander alone.
//!
//! `a_hostile_station_cannot_disturb_the_cm` runs a small budget with the suite;
//! `the_cm_fuzzer` runs `CM_FUZZ_MADS` from `CM_FUZZ_SEED` in sessions of [`SESSION`] MADs
//! (seeds SEED, SEED+1, ...) and prints what it reached (`tests/cm_fuzz.sh` runs it in
//! release).

mod cm_common;
mod fuzz_budget;

use std::collections::HashMap;

use bareverbs::cm::{AcceptParams, CmConfig, CmEvent, ConnId, ConnectParams, Failure, Service};
use bareverbs::device::rxe::wire::bth::{Bth, DEFAULT_PKEY, Deth, Headers, opcode};
use bareverbs::device::rxe::wire::ip6::{Ipv6Route, build6};
use bareverbs::device::rxe::wire::packet::finish;
use bareverbs::verbs::*;
use bareverbs_model::Rng;
use bareverbs_model::link::Faults;
use cm_common::*;

/// MADs of one session.
const SESSION: u64 = 20_000;
/// Rounds (of 1 ms) an episode has before it must have ended (a stranger's) or is drained:
/// room for a resend (the CM's response timeout, 4.096 s), for a stranger that provokes
/// answers can keep the CM's send buffers busy, so that a message waits for its resend.
const ROUNDS: u32 = 10_000;
/// Rounds of 1 s a peer's episode may take to end once nothing more is injected (an MRA
/// asks for at most 2^23 ms, about 2.3 h; the retries after it a few minutes).
const DRAIN: u32 = 4 * 3600;
const MAC_C: [u8; 6] = [0x52, 0x54, 0, 0, 0, 4];

/// The stations' IPv6 addresses: `fd00::` and the last byte of their IPv4 one.
fn v6(last: u8) -> [u8; 16] {
    let mut a = [0u8; 16];
    (a[0], a[15]) = (0xfd, last);
    a
}

/// What the fuzzer reached, counted from the CMs' events and counters.
#[derive(Clone, Copy, Debug, Default)]
struct Reach {
    mads: u64,
    from_stranger: u64,
    from_peer: u64,
    episodes: u64,
    established: u64,
    rejected: u64,
    disconnected: u64,
    timeouts: u64,
    /// Other failures (a QP that could not be moved, a stale connection).
    other_failures: u64,
    /// Requests B refused that were not A's episode's (mutated or forged REQs).
    strange_requests: u64,
    /// MADs the CMs dropped: malformed, or matching no connection, peer or state.
    dropped: u64,
    /// MADs the CMs took.
    received: u64,
    /// Peer's episodes that needed the drain (a long MRA wait, retries).
    drained: u64,
    /// Messages the CMs could not send at once for lack of a send buffer, and resends.
    send_dropped: u64,
    /// A stranger's episodes that ran late because the stranger's answers held the send
    /// buffers answers may use (B's REJ dropped: A's REQ retried until it gave up).
    starved: u64,
    /// Episodes that waited for free entries in A's or B's table.
    table_full: u64,
    resent: u64,
    /// The stranger's MADs sent over IPv6, and the REQs and SIDR_REQs among them given an
    /// rdma_cm header of IP version 6 (or a mangled one).
    over_ipv6: u64,
    v6_headers: u64,
    /// Requests over IPv6 B reported (a stranger's REQ whose header fitted: refused).
    ipv6_requests: u64,
    /// Requests the CMs refused for their rdma_cm header (`CmCounts::bad_header`).
    bad_header: u64,
}

impl Reach {
    fn add(&mut self, o: &Reach) {
        self.mads += o.mads;
        self.from_stranger += o.from_stranger;
        self.from_peer += o.from_peer;
        self.episodes += o.episodes;
        self.established += o.established;
        self.rejected += o.rejected;
        self.disconnected += o.disconnected;
        self.timeouts += o.timeouts;
        self.other_failures += o.other_failures;
        self.strange_requests += o.strange_requests;
        self.dropped += o.dropped;
        self.received += o.received;
        self.drained += o.drained;
        self.send_dropped += o.send_dropped;
        self.starved += o.starved;
        self.table_full += o.table_full;
        self.resent += o.resent;
        self.over_ipv6 += o.over_ipv6;
        self.v6_headers += o.v6_headers;
        self.ipv6_requests += o.ipv6_requests;
        self.bad_header += o.bad_header;
    }
}

/// The IPv4 header checksum of `f`'s header, made valid again.
fn reseal_ip(f: &mut [u8]) {
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

/// The communication IDs a CM MAD names (local, remote).
fn ids(f: &[u8]) -> (u32, u32) {
    let m = &f[62..];
    (
        u32::from_be_bytes(m[24..28].try_into().unwrap()),
        u32::from_be_bytes(m[28..32].try_into().unwrap()),
    )
}

/// `template` (a CM MAD frame A or B sent) with its MAD mangled.
fn mangle(rng: &mut Rng, template: &[u8]) -> Vec<u8> {
    let mut f = template.to_vec();
    let m = 62;
    const ATTRS: [u16; 11] = [
        0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A,
    ];
    for _ in 0..1 + rng.below(3) {
        match rng.below(10) {
            // Another message kind with the same body.
            0 | 1 => f[m + 16..m + 18]
                .copy_from_slice(&ATTRS[rng.below(ATTRS.len() as u64) as usize].to_be_bytes()),
            // The IDs swapped, or one of them changed.
            2 => {
                let (a, b) = ids(&f);
                f[m + 24..m + 28].copy_from_slice(&b.to_be_bytes());
                f[m + 28..m + 32].copy_from_slice(&a.to_be_bytes());
            }
            3 => {
                let at = m + 24 + 4 * rng.below(2) as usize;
                let v = match rng.below(3) {
                    0 => 0,
                    1 => rng.next_u64() as u32,
                    _ => u32::from_be_bytes(f[at..at + 4].try_into().unwrap()) ^ 1,
                };
                f[at..at + 4].copy_from_slice(&v.to_be_bytes());
            }
            // Another transaction ID.
            4 => f[m + 8..m + 16].copy_from_slice(&rng.next_u64().to_be_bytes()),
            // The header (version, class, method, status) now and then.
            5 if rng.below(4) == 0 => {
                let at = m + rng.below(8) as usize;
                f[at] = rng.next_u64() as u8;
            }
            // Fields of the message: QPNs, PSNs, timeouts, sizes, the rdma_cm header.
            _ => {
                for _ in 0..1 + rng.below(4) {
                    let at = m + 32 + rng.below(224) as usize;
                    f[at] = rng.next_u64() as u8;
                }
            }
        }
    }
    f
}

/// The MAD of `frame` (a mangled IPv4 CM frame) as the stranger sends it over IPv6, to A's or
/// B's IPv6 address as the frame was addressed, from the stranger's own IPv6 address (or one
/// nobody has, or a martian one the port drops); a REQ's or SIDR_REQ's rdma_cm header made
/// one of IP version 6 more often than not. Counts what it sent in `reach`.
fn over_ipv6(rng: &mut Rng, frame: &[u8], reach: &mut Reach) -> Vec<u8> {
    let mut mad = frame[62..62 + 256].to_vec();
    let to_b = frame[30..34] == IP_B;
    let (dst_mac, dst) = if to_b {
        ([0x52, 0x54, 0, 0, 0, 3], v6(3))
    } else {
        ([0x52, 0x54, 0, 0, 0, 2], v6(2))
    };
    // The private data of a REQ (at 164) or a SIDR_REQ (at 40): rdma_cm's header.
    let hdr_at = match u16::from_be_bytes([mad[16], mad[17]]) {
        0x10 => Some(164),
        0x17 => Some(40),
        _ => None,
    };
    if let Some(at) = hdr_at.filter(|_| rng.below(4) != 0) {
        let pick = |rng: &mut Rng| match rng.below(5) {
            0 => v6(2),
            1 => v6(3),
            2 => {
                let mut a = [0u8; 16];
                a.iter_mut().for_each(|b| *b = rng.next_u64() as u8);
                a
            }
            _ => v6(4),
        };
        let (src, to) = (pick(rng), if rng.below(4) == 0 { pick(rng) } else { dst });
        mad[at] = 0;
        mad[at + 1] = if rng.below(8) == 0 {
            rng.next_u64() as u8
        } else {
            0x60
        };
        mad[at + 4..at + 20].copy_from_slice(&src);
        mad[at + 20..at + 36].copy_from_slice(&to);
        reach.v6_headers += 1;
    }
    let src = match rng.below(8) {
        0 => v6(99),
        1 => [0; 16],
        _ => v6(4),
    };
    let mut h = Headers::new(Bth {
        opcode: opcode::UD_SEND_ONLY,
        se: false,
        pad: 0,
        pkey: DEFAULT_PKEY,
        dest_qp: 1,
        ack_req: false,
        psn: rng.next_u64() as u32 & 0xFF_FFFF,
    });
    h.deth = Some(Deth {
        qkey: bareverbs::cm::GSI_QKEY,
        src_qp: 1,
    });
    let route = Ipv6Route {
        src_mac: MAC_C,
        dst_mac,
        src,
        dst,
        traffic_class: 0,
        flow_label: 0,
        hop_limit: 64,
        src_port: 0xC000 | rng.below(0x4000) as u16,
    };
    let mut buf = vec![0u8; 512];
    let n = build6(&mut buf, &route, &h, &mad).expect("a MAD fits a frame");
    buf.truncate(n);
    reach.over_ipv6 += 1;
    buf
}

#[test]
fn a_hostile_station_cannot_disturb_the_cm() {
    let mut reach = Reach::default();
    for seed in [1u64, 20261125] {
        reach.add(&session(seed, 2_000));
    }
    assert!(reach.established > 0 && reach.rejected > 0, "{reach:?}");
    assert!(reach.disconnected > 0 && reach.dropped > 0, "{reach:?}");
    assert!(reach.over_ipv6 > 0 && reach.v6_headers > 0, "{reach:?}");
    assert!(reach.bad_header > 0, "{reach:?}");
}

/// The fuzzer: `CM_FUZZ_MADS` MADs (default 4,000) from `CM_FUZZ_SEED` (default 1), in
/// sessions of [`SESSION`] MADs; each failed session prints the seed that replays it.
#[test]
fn the_cm_fuzzer() {
    let mut reach = Reach::default();
    let spent = fuzz_budget::spend(
        "cm-fuzz",
        "session",
        "cm_fuzz.sh",
        ("CM_FUZZ_MADS", 4_000),
        "CM_FUZZ_SEED",
        SESSION,
        session,
        |r| reach.add(&r),
    );
    let fuzz_budget::Spent {
        seed,
        done,
        failures,
        secs,
    } = spent;
    eprintln!(
        "cm-fuzz: {:.0} MADs/s ({done} MADs in {secs:.1} s); from the stranger {}, from the \
         peer's addresses {}; episodes {}, drained {}; requests refused as not the episode's {}, \
         other failures {}, MADs taken {}, sends deferred for lack of a buffer {}, resends {}, \
         stranger's episodes late for lack of a send buffer {}, waits for a free entry {}; \
         over IPv6 {}, of which REQs/SIDR_REQs with an IPv6 rdma_cm header {}, requests over \
         IPv6 reported {}, requests refused for their rdma_cm header {}",
        done as f64 / secs.max(1e-9),
        reach.from_stranger,
        reach.from_peer,
        reach.episodes,
        reach.drained,
        reach.strange_requests,
        reach.other_failures,
        reach.received,
        reach.send_dropped,
        reach.resent,
        reach.starved,
        reach.table_full,
        reach.over_ipv6,
        reach.v6_headers,
        reach.ipv6_requests,
        reach.bad_header,
    );
    println!(
        "cm-fuzz: {} MADs, {failures} failures; established {}, rejected {}, disconnected {}, \
         timeouts {}, dropped {}, seed {seed}",
        reach.mads,
        reach.established,
        reach.rejected,
        reach.disconnected,
        reach.timeouts,
        reach.dropped
    );
    assert_eq!(failures, 0, "cm-fuzz: {failures} sessions failed");
}

/// One side's view of an episode's connection.
#[derive(Default, Debug)]
struct Side {
    id: Option<ConnId>,
    established: bool,
    failed: Option<Failure>,
    disconnected: bool,
    /// The end: failed, disconnected, or (B) never took the request / refused it.
    over: bool,
}

fn session(seed: u64, mads: u64) -> Reach {
    let l = lab(
        Faults::default(),
        (seed.wrapping_mul(2) | 1, seed.wrapping_mul(2) + 2),
    );
    for (d, last) in [(&l.a, 2), (&l.b, 3), (&l.c, 4)] {
        d.provider().add_ipv6(v6(last)).unwrap();
    }
    let (pa, pb, ma, mb, da, db) = sides(&l);
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    cmb.listen(None, 7174, Service::Rc).unwrap();
    let mut rng = Rng::new(seed);
    let mut reach = Reach::default();
    // The bystander.
    let x_a = connect_to_b(&mut cma, rc_qp(&pa, &da));
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let (r, mut xqb) = accept_request(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        rc_qp(&pb, &db),
        |a, b| !a.is_empty() && !b.is_empty(),
    );
    let x_b = r.id;
    let CmEvent::Established {
        qp: Some(mut xqa), ..
    } = ea.remove(0)
    else {
        panic!("seed {seed}: the bystander: {ea:?}")
    };
    let x_ids = |f: &[u8]| {
        let (p, q) = ids(f);
        [p, q].iter().any(|v| *v == x_a.0 || *v == x_b.0)
    };
    let x_qps = [xqa.qp_num(), xqb.qp_num()].map(|q| {
        let b = q.to_be_bytes();
        [b[1], b[2], b[3]]
    });
    let x_qpn = |f: &[u8]| {
        f[62 + 24..]
            .windows(3)
            .any(|w| x_qps.iter().any(|q| w == q))
    };
    let base = (cma.counts(), cmb.counts());
    // The CM MADs A and B sent: the material (a ring of 64).
    let mut seen = l.seg.sent().len();
    let mut recorded: Vec<Vec<u8>> = Vec::new();
    let mut next = 0usize;
    let mut record = |recorded: &mut Vec<Vec<u8>>, seen: &mut usize| {
        let fresh = l.seg.sent_since(*seen);
        *seen += fresh.len();
        for (from, f) in fresh {
            if from < 2 && (0x10..=0x18).any(|a| is_mad(&f, a)) {
                if recorded.len() < 64 {
                    recorded.push(f);
                } else {
                    recorded[next % 64] = f;
                }
                next += 1;
            }
        }
    };
    record(&mut recorded, &mut seen);
    let mut episode = 0u64;
    // The A-side QPs of episodes: kept until their connection is over.
    let mut held_a: HashMap<ConnId, QueuePair<'_, R, Rc, Rts>> = HashMap::new();
    let mut held_b: HashMap<ConnId, QueuePair<'_, R, Rc, Rts>> = HashMap::new();
    while reach.mads < mads {
        episode += 1;
        reach.episodes += 1;
        let stranger = rng.below(2) == 0;
        // A stranger's episode starts with room in both tables (a peer's episode can leave
        // entries that end on their own timers: a REP resent until its RTU comes or the
        // retries run out), so that a refusal "no resources" is never the previous
        // episode's doing.
        let mut waited = 0u32;
        while stranger && (cma.in_use() > 4 || cmb.in_use() > 4) && waited < 600 {
            if waited == 0 {
                reach.table_full += 1;
            }
            waited += 1;
            l.clk.advance(1_000_000);
            l.c.process_events();
            while cma.poll().is_some() {}
            while let Some(e) = cmb.poll() {
                if let CmEvent::ConnectRequest(r) = e {
                    let _ = cmb.reject(r.id, &[]);
                }
            }
        }
        let accept = rng.below(4) != 0;
        let a_closes = rng.below(2) == 0;
        let hold = 5 + rng.below(50) as u32;
        let tag = episode.to_le_bytes();
        let params = ConnectParams {
            private_data: &tag,
            ..ConnectParams::default()
        };
        // A's table may be full of connections still ending (a DREQ resent until its DREP
        // comes or the retries run out): time runs on, nothing injected, until one is free.
        let mut waited = 0u32;
        let a_id = loop {
            match cma.connect(rc_qp(&pa, &da), IP_B, 7174, &params) {
                Ok(id) => break id,
                Err((_, bareverbs::cm::CmError::TableFull)) if waited < 600 => {
                    if waited == 0 {
                        reach.table_full += 1;
                    }
                    waited += 1;
                    l.clk.advance(1_000_000);
                    l.c.process_events();
                    while cma.poll().is_some() {}
                    while let Some(e) = cmb.poll() {
                        if let CmEvent::ConnectRequest(r) = e {
                            let _ = cmb.reject(r.id, &[]);
                        }
                    }
                }
                Err((_, e)) => panic!("seed {seed}: episode {episode}: connect: {e:?}"),
            }
        };
        let starved_at = cma.counts().send_dropped + cmb.counts().send_dropped;
        let mut starved = false;
        let mut a = Side {
            id: Some(a_id),
            ..Side::default()
        };
        let mut b = Side::default();
        let mut est_at: Option<u32> = None;
        let mut round = 0u32;
        let mut drained = false;
        loop {
            round += 1;
            let injecting = round <= ROUNDS;
            if injecting && reach.mads < mads && !recorded.is_empty() {
                for _ in 0..1 + rng.below(3) {
                    let t = &recorded[rng.below(recorded.len() as u64) as usize];
                    if !stranger && x_ids(t) {
                        continue;
                    }
                    let mut f = mangle(&mut rng, t);
                    // The peer's never name the bystander: by its IDs, or by a QP number of
                    // it (a REQ from a QP of a live connection makes it stale).
                    if !stranger && (x_ids(&f) || x_qpn(&f)) {
                        continue;
                    }
                    if stranger && rng.below(4) == 0 {
                        // Over IPv6, from the stranger's IPv6 address (or nobody's).
                        let f6 = over_ipv6(&mut rng, &f, &mut reach);
                        reach.from_stranger += 1;
                        l.seg.inject(2, &f6);
                        reach.mads += 1;
                        continue;
                    }
                    if stranger {
                        // From the stranger (or a martian source), to either side.
                        f[6..12].copy_from_slice(&MAC_C);
                        let src = match rng.below(8) {
                            0 => [0, 0, 0, 0],
                            1 => [10, 0, 0, 99],
                            _ => IP_C,
                        };
                        f[26..30].copy_from_slice(&src);
                        if rng.below(2) == 0 {
                            let (mac, ip) = if f[30..34] == IP_A {
                                ([0x52, 0x54, 0, 0, 0, 3], IP_B)
                            } else {
                                ([0x52, 0x54, 0, 0, 0, 2], IP_A)
                            };
                            f[..6].copy_from_slice(&mac);
                            f[30..34].copy_from_slice(&ip);
                        }
                        reseal_ip(&mut f);
                        reach.from_stranger += 1;
                    } else {
                        reach.from_peer += 1;
                    }
                    let _ = finish(&mut f);
                    l.seg.inject(2, &f);
                    reach.mads += 1;
                }
            }
            // 1 ms a round while injecting; 1 s a round in the drain.
            l.clk.advance(if injecting { 1000 } else { 1_000_000 });
            l.c.process_events();
            while let Some(e) = cma.poll() {
                match e {
                    CmEvent::Established { id, qp, .. } if Some(id) == a.id => {
                        assert!(!a.established, "seed {seed}: A established twice");
                        a.established = true;
                        reach.established += 1;
                        if let Some(q) = qp {
                            held_a.insert(id, q);
                        }
                    }
                    CmEvent::Failed { id, failure, .. } if Some(id) == a.id => {
                        assert!(!a.over, "seed {seed}: A's connection ended twice");
                        match failure {
                            Failure::Rejected { .. } => reach.rejected += 1,
                            Failure::Timeout => reach.timeouts += 1,
                            _ => reach.other_failures += 1,
                        }
                        (a.failed, a.over) = (Some(failure), true);
                        held_a.remove(&id);
                    }
                    CmEvent::Disconnected { id } if Some(id) == a.id => {
                        assert!(!a.over, "seed {seed}: A's connection ended twice");
                        (a.disconnected, a.over) = (true, true);
                        reach.disconnected += 1;
                        held_a.remove(&id);
                    }
                    e @ (CmEvent::Established { .. }
                    | CmEvent::Failed { .. }
                    | CmEvent::Disconnected { .. })
                        if matches!(e, CmEvent::Established { id, .. }
                            | CmEvent::Failed { id, .. }
                            | CmEvent::Disconnected { id } if id == x_a) =>
                    {
                        panic!(
                            "seed {seed}: the bystander's A side saw {e:?} in episode \
                             {episode} (a stranger's: {stranger})"
                        )
                    }
                    CmEvent::ConnectRequest(r) => {
                        // A listens nowhere: never.
                        panic!("seed {seed}: A got a request: {r:?}")
                    }
                    _ => {}
                }
            }
            while let Some(e) = cmb.poll() {
                match e {
                    CmEvent::ConnectRequest(r)
                        if b.id.is_none()
                            && r.src_ip == IP_A
                            && r.private_data.as_slice().starts_with(&tag) =>
                    {
                        b.id = Some(r.id);
                        if accept {
                            cmb.accept(r.id, rc_qp(&pb, &db), &AcceptParams::default())
                                .map_err(|(_, e)| e)
                                .unwrap_or_else(|e| panic!("seed {seed}: accept: {e:?}"));
                        } else {
                            cmb.reject(r.id, &[]).unwrap();
                            b.over = true;
                        }
                    }
                    CmEvent::ConnectRequest(r) => {
                        reach.strange_requests += 1;
                        reach.ipv6_requests += u64::from(r.src_addr.is_ipv6());
                        let _ = cmb.reject(r.id, &[]);
                    }
                    CmEvent::Established { id, qp, .. } if Some(id) == b.id => {
                        assert!(!b.established, "seed {seed}: B established twice");
                        b.established = true;
                        if let Some(q) = qp {
                            held_b.insert(id, q);
                        }
                    }
                    CmEvent::Failed { id, failure, .. } if Some(id) == b.id => {
                        assert!(!b.over, "seed {seed}: B's connection ended twice");
                        (b.failed, b.over) = (Some(failure), true);
                        held_b.remove(&id);
                    }
                    CmEvent::Disconnected { id } if Some(id) == b.id => {
                        assert!(!b.over, "seed {seed}: B's connection ended twice");
                        (b.disconnected, b.over) = (true, true);
                        reach.disconnected += 1;
                        held_b.remove(&id);
                    }
                    e @ (CmEvent::Established { .. }
                    | CmEvent::Failed { .. }
                    | CmEvent::Disconnected { .. })
                        if matches!(e, CmEvent::Established { id, .. }
                            | CmEvent::Failed { id, .. }
                            | CmEvent::Disconnected { id } if id == x_b) =>
                    {
                        panic!(
                            "seed {seed}: the bystander's B side saw {e:?} in episode \
                             {episode} (a stranger's: {stranger})"
                        )
                    }
                    _ => {}
                }
            }
            record(&mut recorded, &mut seen);
            // Established on both sides: held a while, then closed by the planned side.
            if a.established && b.established && !a.over && !b.over {
                let at = *est_at.get_or_insert(round);
                if round == at + hold {
                    if a_closes {
                        let _ = cma.disconnect(a_id);
                    } else {
                        let _ = cmb.disconnect(b.id.unwrap());
                    }
                }
            }
            // Over: A's side ended, and B's (or B never saw the request: A's REQ was lost to
            // a peer's forged answer, a timeout).
            if a.over && (b.over || b.id.is_none() || b.failed.is_some()) {
                break;
            }
            if a.over && round > ROUNDS {
                // B holds a connection A gave up on (a peer's REJ or DREQ in A's name can do
                // that): B's own timers end it.
                if b.over || round > ROUNDS + DRAIN {
                    break;
                }
            }
            if !injecting && !drained {
                drained = true;
                reach.drained += 1;
                // A stranger's episode late: only if the stranger's answers filled the
                // buffers they may hold, so that one of the episode's own answers (B's REJ)
                // was dropped and A waits for its REQ's retries to run out.
                starved = cma.counts().send_dropped + cmb.counts().send_dropped > starved_at;
                assert!(
                    !stranger || starved,
                    "seed {seed}: a stranger's episode {episode} not over in {ROUNDS} ms: A \
                     {a:?} B {b:?}"
                );
                if stranger {
                    reach.starved += 1;
                }
            }
            assert!(
                round <= ROUNDS + DRAIN,
                "seed {seed}: episode {episode} not over in {} s of drain: A {a:?} B {b:?}",
                DRAIN
            );
        }
        if stranger && !starved {
            // Nothing the stranger sent changed the episode: it ended as planned.
            if accept {
                assert!(
                    a.established && b.established && a.disconnected && b.disconnected,
                    "seed {seed}: a stranger's episode {episode} (accepted) ended as A {a:?} B \
                     {b:?}"
                );
            } else {
                assert!(
                    matches!(a.failed, Some(Failure::Rejected { reason: 28 })),
                    "seed {seed}: a stranger's episode {episode} (rejected) ended as A {a:?} B \
                     {b:?}"
                );
            }
        }
    }
    // Every episode's connection is over: the tables hold the bystander (and ended entries
    // whose TIME_WAIT runs out).
    for _ in 0..200 {
        l.clk.advance(10_000);
        while cma.poll().is_some() {}
        while let Some(e) = cmb.poll() {
            if let CmEvent::ConnectRequest(r) = e {
                let _ = cmb.reject(r.id, &[]);
            }
        }
    }
    drop(held_a);
    drop(held_b);
    assert_eq!(
        (cma.in_use(), cmb.in_use()),
        (1, 1),
        "seed {seed}: the tables hold more than the bystander"
    );
    let (ca, cb) = (cma.counts(), cmb.counts());
    reach.dropped = (ca.malformed + ca.unmatched + cb.malformed + cb.unmatched)
        - (base.0.malformed + base.0.unmatched + base.1.malformed + base.1.unmatched);
    reach.received = ca.received + cb.received - base.0.received - base.1.received;
    reach.send_dropped =
        ca.send_dropped + cb.send_dropped - base.0.send_dropped - base.1.send_dropped;
    reach.resent = ca.resent + cb.resent - base.0.resent - base.1.resent;
    reach.bad_header = ca.bad_header + cb.bad_header - base.0.bad_header - base.1.bad_header;
    // The bystander still carries data, and disconnects cleanly.
    let mut m1 = pa.register(4096, ALL).unwrap();
    let m2 = pb.register(4096, ALL).unwrap();
    m1.as_mut_slice()[..5].copy_from_slice(b"alive");
    // SAFETY: the regions stay registered and untouched until the completions.
    unsafe {
        let mut r = xqb.recv_batch();
        r.recv(1, &[m2.sge(0, 64).unwrap()]).unwrap();
        r.finish();
        let mut s = xqa.send_batch();
        s.send(2, SendFlags::SIGNALED, &[m1.sge(0, 5).unwrap()])
            .unwrap();
        s.finish();
    }
    let (wa, wb) = completions(&l, &da, &db, 1, 1);
    assert_eq!(
        (wa[0].status, wb[0].status),
        (WcStatus::Success, WcStatus::Success),
        "seed {seed}: the bystander's SEND"
    );
    assert_eq!(&m2.as_slice()[..5], b"alive");
    cma.disconnect(x_a).unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        3000,
        1000,
        |a, b| {
            a.iter()
                .any(|e| matches!(e, CmEvent::Disconnected { id } if *id == x_a))
                && b.iter()
                    .any(|e| matches!(e, CmEvent::Disconnected { id } if *id == x_b))
        }
    ));
    drop((xqa, xqb, m1, m2));
    reach
}
