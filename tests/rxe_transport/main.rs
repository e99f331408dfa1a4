//! The software RoCEv2 device end to end: two `Rxe` endpoints on an in-memory Ethernet
//! segment, driven through the verbs API — every opcode, the errors a peer reports (bad key,
//! rights, alignment, no receive posted), and a lossy segment (drop, duplicate, reorder) over
//! which every request still completes exactly once with the right bytes.

#[path = "../common/mod.rs"]
mod common;

use bareverbs::Context;
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_model::link::{Faults, MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};
use common::{drain, rc_to_rts, ud_to_rts};

// The tests by behaviour (this file: the set-up, every opcode, a lossy segment, the errors a
// peer reports, retries and the PSN window).
mod datagrams_and_queues;
mod read_ordering;
mod replay_and_events;

type R = Rxe<Model, MemLink, TestClock>;
type Ctx = Context<R>;
type RcQp<'a> = QueuePair<'a, R, Rc, Rts>;

const IP_A: [u8; 4] = [10, 0, 0, 2];
const IP_B: [u8; 4] = [10, 0, 0, 3];
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
const SIG: SendFlags = SendFlags::SIGNALED;

struct Lab {
    model: Model,
    seg: Segment,
    clk: TestClock,
    a: Ctx,
    b: Ctx,
}

fn lab(faults: Faults) -> Lab {
    let model = Model::new(ModelConfig::default());
    let seg = Segment::new();
    let clk = TestClock::default();
    let la = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let lb = seg.attach([0x52, 0x54, 0, 0, 0, 3], 1514);
    seg.set_faults(faults);
    let a = Context::new(Rxe::new(model.clone(), la, clk.clone(), Config { ip: IP_A }).unwrap());
    let b = Context::new(Rxe::new(model.clone(), lb, clk.clone(), Config { ip: IP_B }).unwrap());
    Lab {
        model,
        seg,
        clk,
        a,
        b,
    }
}

impl Lab {
    /// Runs both endpoints (time moving `step` µs a round) until `done` or the bound.
    fn pump(&self, step: u64, mut done: impl FnMut() -> bool) -> bool {
        for _ in 0..200_000 {
            if done() {
                return true;
            }
            self.clk.advance(step);
            self.a.process_events();
            self.b.process_events();
        }
        done()
    }

    /// Runs both endpoints for `rounds` rounds of 100 µs.
    fn run(&self, rounds: u32) {
        for _ in 0..rounds {
            self.clk.advance(100);
            self.a.process_events();
            self.b.process_events();
        }
    }
}

/// Brings an RC QP to RTS towards `peer` (QPN, IP) with `mtu`.
fn up<'a>(
    qp: QueuePair<'a, R, Rc, Reset>,
    peer: u32,
    ip: [u8; 4],
    mtu: Mtu,
    psns: (u32, u32),
) -> RcQp<'a> {
    let init = ConnectedInit {
        access: ALL,
        ..Default::default()
    };
    let mut rtr = ConnectedRtr::new(peer, psns.1, AddressVector::new(Gid::from_ipv4(ip), 1));
    rtr.path_mtu = mtu;
    rtr.max_dest_rd_atomic = 4;
    let mut rts = ConnectedRts::new(psns.0);
    rts.max_rd_atomic = 4;
    rts.timeout = 8; // about 1 ms
    rc_to_rts(qp, &init, &rtr, &rts)
}

fn caps(depth: u32) -> QpCaps {
    QpCaps {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    }
}

/// The bytes of message `i` of length `len`.
fn pattern(i: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u32).wrapping_mul(31).wrapping_add(i * 7) as u8)
        .collect()
}

/// Every opcode between two endpoints at `mtu` on a segment with `faults`; checks the bytes
/// and that each request completes once.
fn every_opcode(faults: Faults, mtu: Mtu, rounds: u32) -> Lab {
    let l = lab(faults);
    {
        let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let (ca, cb) = (l.a.create_cq(512).unwrap(), l.b.create_cq(512).unwrap());
        let qa = pa
            .qp_builder(&ca, &ca)
            .caps(caps(64))
            .build::<Rc>()
            .unwrap();
        let qb = pb
            .qp_builder(&cb, &cb)
            .caps(caps(64))
            .build::<Rc>()
            .unwrap();
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        let mut qa = up(qa, nb, IP_B, mtu, (100, 0xFF_FFF0));
        let mut qb = up(qb, na, IP_A, mtu, (0xFF_FFF0, 100));
        let mut ma = pa.register(64 * 1024, ALL).unwrap();
        let mut mb = pb.register(64 * 1024, ALL).unwrap();
        let (mut wa, mut wb) = (Vec::new(), Vec::new());
        for i in 0..rounds {
            let len = [0usize, 1, 255, 256, 1000, 1024, 3000, 5000][i as usize % 8];
            let data = pattern(i, len);
            // SEND (with immediate on odd rounds) A → B into a posted receive.
            ma.as_mut_slice()[..len].copy_from_slice(&data);
            mb.as_mut_slice()[8192..8192 + 8192].fill(0);
            // SAFETY: the buffers stay registered and untouched until their completions.
            unsafe {
                let mut r = qb.recv_batch();
                r.recv(1000 + u64::from(i), &[mb.sge(8192, 8192).unwrap()])
                    .unwrap();
                r.finish();
                let mut s = qa.send_batch();
                let sge = ma.sge(0, len as u32).unwrap();
                if i % 2 == 1 {
                    s.send_imm(u64::from(i), SIG, 0xABCD_0000 | i, &[sge])
                        .unwrap();
                } else {
                    s.send(u64::from(i), SIG, &[sge]).unwrap();
                }
                s.finish();
            }
            assert!(
                l.pump(50, || {
                    wa.extend(drain(&ca));
                    wb.extend(drain(&cb));
                    wa.len() == 1 && wb.len() == 1
                }),
                "round {i}: SEND did not complete ({wa:?} {wb:?})"
            );
            let (s, r) = (wa.remove(0), wb.remove(0));
            assert_eq!(
                (s.wr_id, s.status, s.opcode),
                (u64::from(i), WcStatus::Success, WcOpcode::Send)
            );
            assert_eq!(
                (r.wr_id, r.status, r.opcode, r.byte_len),
                (
                    1000 + u64::from(i),
                    WcStatus::Success,
                    WcOpcode::Recv,
                    len as u32
                )
            );
            assert_eq!(r.flags.contains(WcFlags::WITH_IMM), i % 2 == 1);
            if i % 2 == 1 {
                assert_eq!(r.imm, 0xABCD_0000 | i);
            }
            assert_eq!(
                &mb.as_slice()[8192..8192 + len],
                &data[..],
                "round {i}: SEND bytes"
            );

            // RDMA WRITE A → B (with immediate on odd rounds), then READ it back B → A.
            let data = pattern(i + 100, len);
            ma.as_mut_slice()[..len].copy_from_slice(&data);
            let remote = mb.addr() + 16384;
            // SAFETY: as above.
            unsafe {
                if i % 2 == 1 {
                    let mut r = qb.recv_batch();
                    r.recv(2000 + u64::from(i), &[mb.sge(0, 16).unwrap()])
                        .unwrap();
                    r.finish();
                }
                let mut s = qa.send_batch();
                let sge = ma.sge(0, len as u32).unwrap();
                if i % 2 == 1 {
                    s.rdma_write_imm(10 + u64::from(i), SIG, (remote, mb.rkey()), i, &[sge])
                        .unwrap();
                } else {
                    s.rdma_write(10 + u64::from(i), SIG, (remote, mb.rkey()), &[sge])
                        .unwrap();
                }
                s.finish();
            }
            let want_b = usize::from(i % 2 == 1);
            assert!(
                l.pump(50, || {
                    wa.extend(drain(&ca));
                    wb.extend(drain(&cb));
                    wa.len() == 1 && wb.len() == want_b
                }),
                "round {i}: WRITE did not complete ({wa:?} {wb:?})"
            );
            let w = wa.remove(0);
            assert_eq!(
                (w.status, w.opcode),
                (WcStatus::Success, WcOpcode::RdmaWrite)
            );
            if want_b == 1 {
                let r = wb.remove(0);
                assert_eq!(
                    (r.opcode, r.byte_len, r.imm),
                    (WcOpcode::RecvRdmaWithImm, len as u32, i)
                );
            }
            assert_eq!(
                &mb.as_slice()[16384..16384 + len],
                &data[..],
                "round {i}: WRITE bytes"
            );

            ma.as_mut_slice()[32768..32768 + len].fill(0);
            // SAFETY: as above.
            unsafe {
                let mut s = qa.send_batch();
                s.rdma_read(
                    20 + u64::from(i),
                    SIG,
                    (remote, mb.rkey()),
                    &[ma.sge(32768, len as u32).unwrap()],
                )
                .unwrap();
                s.finish();
            }
            assert!(
                l.pump(50, || {
                    wa.extend(drain(&ca));
                    wa.len() == 1
                }),
                "round {i}: READ did not complete"
            );
            let r = wa.remove(0);
            assert_eq!(
                (r.wr_id, r.status, r.opcode, r.byte_len),
                (
                    20 + u64::from(i),
                    WcStatus::Success,
                    WcOpcode::RdmaRead,
                    len as u32
                )
            );
            assert_eq!(
                &ma.as_slice()[32768..32768 + len],
                &data[..],
                "round {i}: READ bytes"
            );

            // Atomics: fetch-and-add then compare-and-swap on 8 bytes of B.
            let at = mb.addr() + 40960;
            let before = u64::from_ne_bytes(mb.as_slice()[40960..40968].try_into().unwrap());
            // SAFETY: as above.
            unsafe {
                let mut s = qa.send_batch();
                s.atomic_fetch_add(
                    30 + u64::from(i),
                    SIG,
                    (at, mb.rkey()),
                    5,
                    &ma.sge(48 * 1024, 8).unwrap(),
                )
                .unwrap();
                s.atomic_cmp_swp(
                    40 + u64::from(i),
                    SIG,
                    (at, mb.rkey()),
                    (before + 5, 7 * u64::from(i)),
                    &ma.sge(48 * 1024 + 8, 8).unwrap(),
                )
                .unwrap();
                s.finish();
            }
            assert!(
                l.pump(50, || {
                    wa.extend(drain(&ca));
                    wa.len() == 2
                }),
                "round {i}: atomics did not complete"
            );
            let (f, c) = (wa.remove(0), wa.remove(0));
            assert_eq!(
                (f.wr_id, f.status, f.opcode),
                (30 + u64::from(i), WcStatus::Success, WcOpcode::FetchAdd)
            );
            assert_eq!(
                (c.wr_id, c.status, c.opcode),
                (40 + u64::from(i), WcStatus::Success, WcOpcode::CompSwap)
            );
            let got = |o: usize| u64::from_ne_bytes(ma.as_slice()[o..o + 8].try_into().unwrap());
            assert_eq!(got(48 * 1024), before, "round {i}: fetch-and-add original");
            assert_eq!(
                got(48 * 1024 + 8),
                before + 5,
                "round {i}: compare-and-swap original"
            );
            let now = u64::from_ne_bytes(mb.as_slice()[40960..40968].try_into().unwrap());
            assert_eq!(now, 7 * u64::from(i), "round {i}: executed once each");
        }
        assert!(wa.is_empty() && wb.is_empty(), "no completion twice");
        drop((qa, qb));
    }
    l
}

fn teardown(l: Lab) {
    let Lab { model, a, b, .. } = l;
    drop(a);
    drop(b);
    assert_eq!(model.outstanding_pages(), 0, "every DMA page back");
    assert!(model.check_guards());
}

#[test]
fn every_opcode_completes_once_with_the_right_bytes_at_each_mtu() {
    for mtu in [Mtu::Mtu256, Mtu::Mtu1024] {
        let l = every_opcode(Faults::default(), mtu, 8);
        teardown(l);
    }
}

#[test]
fn a_lossy_segment_loses_and_duplicates_nothing() {
    for seed in [1u64, 7, 2026] {
        let f = Faults {
            drop: 80,
            duplicate: 50,
            reorder: 50,
            seed,
        };
        let l = every_opcode(f, Mtu::Mtu1024, 16);
        let (dropped, duplicated, reordered) = l.seg.damage();
        assert!(
            dropped > 0 && duplicated > 0 && reordered > 0,
            "the segment did damage: {:?}",
            l.seg.damage()
        );
        teardown(l);
    }
}

/// Two connected RC QPs (A → B) with `timeout`/`retry`/`rnr_retry`, and B's access rights.
struct Pair<'a> {
    qa: RcQp<'a>,
    qb: RcQp<'a>,
    ca: &'a CompletionQueue<'a, R>,
    cb: &'a CompletionQueue<'a, R>,
}

fn pair<'a>(
    l: &'a Lab,
    pds: &'a (ProtectionDomain<'a, R>, ProtectionDomain<'a, R>),
    cqs: &'a (CompletionQueue<'a, R>, CompletionQueue<'a, R>),
    b_access: AccessFlags,
    (retry, rnr_retry): (u8, u8),
) -> Pair<'a> {
    // Starting PSNs drawn as an application draws them (each side's send PSN is the other's
    // expected PSN).
    let (psn_a, psn_b) = (l.a.random_psn(), l.b.random_psn());
    let qa = pds
        .0
        .qp_builder(&cqs.0, &cqs.0)
        .caps(caps(16))
        .build::<Rc>()
        .unwrap();
    let qb = pds
        .1
        .qp_builder(&cqs.1, &cqs.1)
        .caps(caps(16))
        .build::<Rc>()
        .unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let bring = |qp: QueuePair<'a, R, Rc, Reset>, peer, ip, access, (sq, rq): (u32, u32)| {
        let init = ConnectedInit {
            access,
            ..Default::default()
        };
        let mut rtr = ConnectedRtr::new(peer, rq, AddressVector::new(Gid::from_ipv4(ip), 1));
        rtr.max_dest_rd_atomic = 1;
        rtr.min_rnr_timer = 1;
        let mut rts = ConnectedRts::new(sq);
        (rts.max_rd_atomic, rts.timeout, rts.retry_cnt, rts.rnr_retry) = (1, 8, retry, rnr_retry);
        rc_to_rts(qp, &init, &rtr, &rts)
    };
    Pair {
        qa: bring(qa, nb, IP_B, ALL, (psn_a, psn_b)),
        qb: bring(qb, na, IP_A, b_access, (psn_b, psn_a)),
        ca: &cqs.0,
        cb: &cqs.1,
    }
}

/// Runs until A's CQ has `n` completions; returns them.
fn wait_a(l: &Lab, p: &Pair<'_>, n: usize) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    assert!(
        l.pump(100, || {
            got.extend(drain(p.ca));
            got.len() >= n
        }),
        "{n} completions expected, got {got:?}"
    );
    got
}

#[test]
fn the_peer_refuses_bad_keys_missing_rights_and_misaligned_atomics() {
    let l = lab(Faults::default());
    {
        let pds = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let cqs = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        let ma = pds.0.register(4096, ALL).unwrap();
        let ro = pds
            .1
            .register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
        let cases: [(&str, AccessFlags, u8, WcStatus); 4] = [
            (
                "write to a region without remote write",
                ALL,
                0,
                WcStatus::RemAccessErr,
            ),
            (
                "write with a key nobody registered",
                ALL,
                1,
                WcStatus::RemAccessErr,
            ),
            ("write beyond the region", ALL, 2, WcStatus::RemAccessErr),
            (
                "write to a QP without remote write",
                AccessFlags::REMOTE_READ,
                3,
                WcStatus::RemInvReqErr,
            ),
        ];
        for (what, qp_access, case, want) in cases {
            let mut p = pair(&l, &pds, &cqs, qp_access, (7, 7));
            let (addr, key) = match case {
                1 => (ro.addr(), ro.rkey() ^ 0x100),
                2 => (ro.addr() + 4000, ro.rkey()),
                _ => (ro.addr(), ro.rkey()),
            };
            let region = if case == 0 { ro.rkey() } else { key };
            // SAFETY: `ma` stays registered until the completion.
            unsafe {
                let mut s = p.qa.send_batch();
                s.rdma_write(1, SIG, (addr, region), &[ma.sge(0, 256).unwrap()])
                    .unwrap();
                s.rdma_write(2, SIG, (ro.addr(), ro.rkey()), &[ma.sge(0, 8).unwrap()])
                    .unwrap();
                s.finish();
            }
            let got = wait_a(&l, &p, 2);
            assert_eq!((got[0].wr_id, got[0].status), (1, want), "{what}");
            assert_eq!(
                (got[1].wr_id, got[1].status),
                (2, WcStatus::WrFlushErr),
                "{what}: the rest flushed"
            );
            assert_eq!(
                p.qa.query().unwrap().state,
                QpState::Err,
                "{what}: the requester is in error"
            );
            assert_eq!(
                p.qb.query().unwrap().state,
                QpState::Err,
                "{what}: so is the responder"
            );
            drop(p);
        }
        // A misaligned atomic: invalid request.
        let rw = pds.1.register(4096, ALL).unwrap();
        let mut p = pair(&l, &pds, &cqs, ALL, (7, 7));
        // SAFETY: as above.
        unsafe {
            let mut s = p.qa.send_batch();
            s.atomic_fetch_add(
                9,
                SIG,
                (rw.addr() + 4, rw.rkey()),
                1,
                &ma.sge(0, 8).unwrap(),
            )
            .unwrap();
            s.finish();
        }
        let got = wait_a(&l, &p, 1);
        assert_eq!((got[0].wr_id, got[0].status), (9, WcStatus::RemInvReqErr));
        drop(p);
    }
    teardown(l);
}

#[test]
fn receiver_not_ready_waits_for_a_receive_or_fails_when_retries_run_out() {
    let l = lab(Faults::default());
    {
        let pds = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let cqs = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        let ma = pds.0.register(4096, ALL).unwrap();
        let mb = pds.1.register(4096, ALL).unwrap();
        // Infinite RNR retries: the SEND waits until B posts a receive, then lands once.
        let mut p = pair(&l, &pds, &cqs, ALL, (7, 7));
        // SAFETY: the buffers stay registered until the completions.
        unsafe {
            let mut s = p.qa.send_batch();
            s.send(1, SIG, &[ma.sge(0, 100).unwrap()]).unwrap();
            s.finish();
        }
        let mut got = Vec::new();
        l.run(2000);
        got.extend(drain(p.ca));
        assert!(
            got.is_empty(),
            "no completion while B has no receive: {got:?}"
        );
        let b_port = l.b.provider().port_counts();
        assert!(
            b_port.roce > 10,
            "A kept retrying after RNR NAKs ({b_port:?})"
        );
        // SAFETY: as above.
        unsafe {
            let mut r = p.qb.recv_batch();
            r.recv(7, &[mb.sge(0, 4096).unwrap()]).unwrap();
            r.finish();
        }
        let got = wait_a(&l, &p, 1);
        assert_eq!((got[0].wr_id, got[0].status), (1, WcStatus::Success));
        let mut rb = Vec::new();
        rb.extend(drain(p.cb));
        assert_eq!(rb.len(), 1, "received once: {rb:?}");
        assert_eq!((rb[0].wr_id, rb[0].byte_len), (7, 100));
        drop(p);
        // Two RNR retries: the third RNR NAK fails the request.
        let mut p = pair(&l, &pds, &cqs, ALL, (7, 2));
        // SAFETY: as above.
        unsafe {
            let mut s = p.qa.send_batch();
            s.send(2, SIG, &[ma.sge(0, 100).unwrap()]).unwrap();
            s.finish();
        }
        let got = wait_a(&l, &p, 1);
        assert_eq!((got[0].wr_id, got[0].status), (2, WcStatus::RnrRetryExcErr));
        drop(p);
    }
    teardown(l);
}

#[test]
fn a_silent_peer_exhausts_the_retries() {
    let l = lab(Faults::default());
    {
        let pds = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let cqs = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        let ma = pds.0.register(4096, ALL).unwrap();
        let mut p = pair(&l, &pds, &cqs, ALL, (3, 7));
        // One exchange first: the peers know each other's MAC.
        let mb = pds.1.register(4096, ALL).unwrap();
        // SAFETY: the buffers stay registered until the completions.
        unsafe {
            let mut s = p.qa.send_batch();
            s.rdma_write(0, SIG, (mb.addr(), mb.rkey()), &[ma.sge(0, 64).unwrap()])
                .unwrap();
            s.finish();
        }
        assert_eq!(wait_a(&l, &p, 1)[0].status, WcStatus::Success);
        // Everything from now on is lost.
        l.seg.set_faults(Faults {
            drop: 1000,
            seed: 3,
            ..Default::default()
        });
        let roce = || {
            l.seg
                .sent()
                .iter()
                .filter(|(_, f)| f.len() > 42 && f[12..14] == [8, 0] && f[36..38] == [0x12, 0xB7])
                .count()
        };
        let before = roce();
        // SAFETY: as above.
        unsafe {
            let mut s = p.qa.send_batch();
            s.send(1, SIG, &[ma.sge(0, 64).unwrap()]).unwrap();
            s.finish();
        }
        let got = wait_a(&l, &p, 1);
        assert_eq!((got[0].wr_id, got[0].status), (1, WcStatus::RetryExcErr));
        // The first try and three retries.
        let tries = roce() - before;
        assert_eq!(tries, 4, "the first send and three retries: {tries}");
        drop(p);
    }
    teardown(l);
}

#[test]
fn a_long_batch_goes_through_the_psn_window_and_completes_in_order() {
    for faults in [
        Faults::default(),
        Faults {
            drop: 30,
            duplicate: 30,
            reorder: 30,
            seed: 11,
        },
    ] {
        let l = lab(faults);
        {
            let pds = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
            let cqs = (l.a.create_cq(256).unwrap(), l.b.create_cq(256).unwrap());
            let mut ma = pds.0.register(64 * 1024, ALL).unwrap();
            let mb = pds.1.register(64 * 1024, ALL).unwrap();
            let data = pattern(3, 64 * 1024);
            ma.as_mut_slice().copy_from_slice(&data);
            let mut p = pair(&l, &pds, &cqs, ALL, (7, 7));
            // 16 WRITEs of 4 KiB at MTU 1024: 64 packets; then 16 more: beyond any one window.
            for round in 0..2u64 {
                // SAFETY: the buffers stay registered until the completions.
                unsafe {
                    let mut s = p.qa.send_batch();
                    for k in 0..16u32 {
                        let off = k * 4096;
                        s.rdma_write(
                            round * 16 + u64::from(k),
                            SIG,
                            (mb.addr() + u64::from(off), mb.rkey()),
                            &[ma.sge(off, 4096).unwrap()],
                        )
                        .unwrap();
                    }
                    s.finish();
                }
                let got = wait_a(&l, &p, 16);
                let ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
                assert_eq!(
                    ids,
                    (round * 16..round * 16 + 16).collect::<Vec<_>>(),
                    "in order, once each"
                );
                assert!(got.iter().all(|w| w.status == WcStatus::Success));
            }
            assert_eq!(mb.as_slice(), &data[..]);
            drop(p);
        }
        teardown(l);
    }
}

/// The base transport header's opcode and PSN of a RoCE frame (IPv4, no options).
fn bth_of(f: &[u8]) -> (u8, u32) {
    let b = &f[bareverbs::device::rxe::wire::packet::ROCE_OFFSET..];
    (b[0], u32::from_be_bytes([0, b[9], b[10], b[11]]))
}
