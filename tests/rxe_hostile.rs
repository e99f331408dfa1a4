//! The network is not trusted: a seeded mutation fuzzer on a third station of the segment.
//! It takes the two endpoints' own recent frames, or forges valid requests at the PSNs the
//! responders expect next (learnt from the wire), mangles their transport headers (opcode,
//! QPN, PSN, keys, addresses, lengths, syndromes) and lengths, sends them from the peers'
//! addresses or from foreign ones (its own, half-spoofed, martian, to another MAC), and
//! reseals the ICRC half the time (so that half pass the wire checks and reach the transport,
//! half exercise the parser). Whatever it sends, the devices never panic, never write outside
//! the memory they own (the model's guard pages), complete every posted request exactly once,
//! and give every page back.
//!
//! `a_hostile_station_cannot_make_the_devices_misbehave` runs a small fixed budget with the
//! suite; `the_mutation_fuzzer` runs the budget `RXE_FUZZ_FRAMES` from the seed
//! `RXE_FUZZ_SEED` in storms of [`STORM`] frames (seeds SEED, SEED+1, ...), counts the
//! storms that failed, and prints `rxe-fuzz: N frames, F failures, seed S` (`tests/rxe_fuzz.sh`
//! runs it in release).

use std::collections::HashMap;

use bareverbs::Context;
use bareverbs::device::rxe::wire::bth::{AtomicEth, Reth, opcode};
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
    h.bth.psn = (h.bth.psn + 1) & 0xFF_FFFF;
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

#[test]
fn a_hostile_station_cannot_make_the_devices_misbehave() {
    for seed in [1u64, 42, 20261123] {
        storm(seed, 10_000);
    }
}

/// The fuzzer: `RXE_FUZZ_FRAMES` frames (default 20,000) from `RXE_FUZZ_SEED` (default 1), in
/// storms of [`STORM`] frames; each failed storm prints the seed that replays it.
#[test]
fn the_mutation_fuzzer() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let budget = env("RXE_FUZZ_FRAMES", 20_000);
    let seed = env("RXE_FUZZ_SEED", 1);
    let t0 = std::time::Instant::now();
    let (mut done, mut failures, mut k) = (0u64, 0u64, 0u64);
    // Bounded: the budget is finite and each storm spends at least one frame of it.
    while done < budget {
        let n = (budget - done).min(u64::from(STORM)) as u32;
        let s = seed.wrapping_add(k);
        let r = std::panic::catch_unwind(|| storm(s, n));
        if r.is_err() {
            failures += 1;
            eprintln!("rxe-fuzz: storm failed; replay with tests/rxe_fuzz.sh {n} {s}");
        }
        done += u64::from(n.max(1));
        k += 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "rxe-fuzz: {:.0} frames/s ({done} frames in {secs:.1} s)",
        done as f64 / secs.max(1e-9)
    );
    println!("rxe-fuzz: {done} frames, {failures} failures, seed {seed}");
    assert_eq!(failures, 0, "rxe-fuzz: {failures} storms failed");
}

fn storm(seed: u64, frames: u32) {
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
    let pump = |n: u32| {
        for _ in 0..n {
            clk.advance(200);
            a.process_events();
            b.process_events();
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
        let mut wc = [WorkCompletion::default(); 16];
        let mut take = |cq: &CompletionQueue<'_, R>, done: &mut HashMap<u64, u32>| loop {
            let n = cq.poll(&mut wc).unwrap();
            if n == 0 {
                break;
            }
            for w in &wc[..n] {
                *done.entry(w.wr_id).or_default() += 1;
            }
        };
        let mut id = 0u64;
        let mut resets = 0u32;
        let mut recorded: Vec<Vec<u8>> = Vec::new();
        let (mut seen, mut next) = (0usize, 0usize);
        for round in 0..frames.div_ceil(50) {
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
            pump(5);
            // What the endpoints sent since the last round: the recent ones are kept (a ring
            // of 256) as the material to mangle, at PSNs near the live ones.
            let fresh = seg.sent_since(seen);
            seen += fresh.len();
            for (from, f) in fresh {
                if from < 2 && f.len() > ROCE_OFFSET && f[12..14] == [8, 0] {
                    if recorded.len() < 256 {
                        recorded.push(f);
                    } else {
                        recorded[next % 256] = f;
                    }
                    next += 1;
                }
            }
            // The latest request an endpoint sent: the base of forged ones at the PSN its
            // responder expects next.
            let latest = recorded
                .iter()
                .rev()
                .take(16)
                .find(|f| f.len() > ROCE_OFFSET + 12 && f[ROCE_OFFSET] < 0x11)
                .cloned();
            for _ in 0..50 {
                if recorded.is_empty() {
                    break;
                }
                let f = &recorded[rng.below(recorded.len() as u64) as usize];
                let mut frame = match &latest {
                    Some(l) if rng.below(2) == 0 => {
                        let mut g = forge(&mut rng, l).unwrap_or_else(|| l.clone());
                        // A forged frame is mangled too, now and then.
                        if rng.below(4) == 0 {
                            g = mangle(&mut rng, &g);
                        }
                        g
                    }
                    _ => mangle(&mut rng, f),
                };
                disguise(&mut rng, &mut frame);
                // The ICRC resealed half the time: those reach the transport, the others
                // test the parser.
                if rng.below(2) == 0 {
                    let _ = finish(&mut frame);
                }
                seg.inject(2, &frame);
                if rng.below(4) == 0 {
                    pump(1);
                }
            }
            pump(5);
            take(&ca, &mut done);
            take(&cb, &mut done);
            // A QP the storm put in error: flushed (its completions counted), reset, and
            // connected again, so that the storm keeps reaching live QPs.
            let err = |q: &QueuePair<'_, R, Rc, Rts>| q.query().unwrap().state == QpState::Err;
            if err(&qa) || err(&qb) {
                let ea = qa.to_error().map_err(|(_, e)| e).unwrap();
                let eb = qb.to_error().map_err(|(_, e)| e).unwrap();
                pump(2);
                take(&ca, &mut done);
                take(&cb, &mut done);
                resets += 1;
                let (psn_a, psn_b) = (a.random_psn(), b.random_psn());
                let ea = ea.reset().map_err(|(_, e)| e).unwrap();
                let eb = eb.reset().map_err(|(_, e)| e).unwrap();
                qa = up(ea, nb, [10, 0, 0, 3], (psn_a, psn_b));
                qb = up(eb, na, [10, 0, 0, 2], (psn_b, psn_a));
            }
        }
        assert!(
            resets > 0,
            "seed {seed}: the storm never broke a connection"
        );
        // The storm reached the transports (a valid ICRC), not only the wire checks.
        let (ra, rb) = (a.provider().port_counts(), b.provider().port_counts());
        assert!(
            ra.roce + rb.roce > u64::from(frames / 8),
            "seed {seed}: {ra:?} {rb:?}"
        );
        // The end: both QPs to ERROR; whatever is outstanding completes, flushed.
        let qa = qa.to_error().map_err(|(_, e)| e).unwrap();
        let qb = qb.to_error().map_err(|(_, e)| e).unwrap();
        pump(10);
        take(&ca, &mut done);
        take(&cb, &mut done);
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
        drop((qa, qb, ma, mb));
    }
    drop(a);
    drop(b);
    assert_eq!(model.outstanding_pages(), 0, "seed {seed}: every page back");
    assert!(
        model.check_guards(),
        "seed {seed}: nothing written outside the DMA blocks"
    );
}
