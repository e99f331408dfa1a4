//! The software RoCEv2 device end to end: two `Rxe` endpoints on an in-memory Ethernet
//! segment, driven through the verbs API — every opcode, the errors a peer reports (bad key,
//! rights, alignment, no receive posted), and a lossy segment (drop, duplicate, reorder) over
//! which every request still completes exactly once with the right bytes.

mod common;

use bareverbs::Context;
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_model::link::{Faults, MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};
use common::{drain, rc_to_rts};

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

#[test]
fn ud_datagrams_carry_a_grh_and_a_wrong_qkey_is_dropped() {
    let l = lab(Faults::default());
    {
        let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let (ca, cb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        let mut qa = ud_up(&pa, &ca);
        let mut qb = ud_up(&pb, &cb);
        let mut ma = pa.register(4096, ALL).unwrap();
        let mb = pb.register(4096, ALL).unwrap();
        ma.as_mut_slice()[..100].copy_from_slice(&pattern(1, 100));
        let ah = pa
            .create_ah(&AddressVector::new(Gid::from_ipv4(IP_B), 1))
            .unwrap();
        // SAFETY: the buffers stay registered until the completions.
        unsafe {
            let mut r = qb.recv_batch();
            r.recv(5, &[mb.sge(0, 4096).unwrap()]).unwrap();
            r.finish();
            let mut s = qa.send_batch();
            s.send_to(
                1,
                SIG,
                (&ah, qb.qp_num(), 0x2222_2222),
                &[ma.sge(0, 100).unwrap()],
            )
            .unwrap();
            s.send_to_imm(
                2,
                SIG,
                (&ah, qb.qp_num(), 0x1111_1111),
                77,
                &[ma.sge(0, 100).unwrap()],
            )
            .unwrap();
            s.finish();
        }
        let (mut wa, mut wb) = (Vec::new(), Vec::new());
        assert!(l.pump(100, || {
            wa.extend(drain(&ca));
            wb.extend(drain(&cb));
            wa.len() == 2 && !wb.is_empty()
        }));
        l.run(2000);
        wb.extend(drain(&cb));
        assert_eq!(
            wb.len(),
            1,
            "the wrong Q_Key's datagram was dropped: {wb:?}"
        );
        let r = wb[0];
        assert_eq!(
            (r.wr_id, r.byte_len, r.src_qp, r.imm),
            (5, 140, qa.qp_num(), 77)
        );
        assert!(r.flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
        let b = mb.as_slice();
        assert_eq!(&b[..20], &[0u8; 20], "20 zero bytes, then the IPv4 header");
        assert_eq!(b[20] >> 4, 4);
        assert_eq!(&b[32..36], &IP_A, "the IPv4 source in the GRH slot");
        assert_eq!(&b[40..140], &pattern(1, 100)[..]);
    }
    teardown(l);
}

fn ud_up<'a>(
    pd: &'a ProtectionDomain<'a, R>,
    cq: &'a CompletionQueue<'a, R>,
) -> QueuePair<'a, R, Ud, Rts> {
    let q = pd.qp_builder(cq, cq).caps(caps(8)).build::<Ud>().unwrap();
    let q = q
        .init(&DatagramInit::new(0x1111_1111))
        .map_err(|(_, e)| e)
        .unwrap();
    let q = q.rtr(&()).map_err(|(_, e)| e).unwrap();
    q.rts(&DatagramRts { sq_psn: 0 })
        .map_err(|(_, e)| e)
        .unwrap()
}

#[test]
fn two_queue_pairs_of_one_device_talk_through_loopback() {
    let l = lab(Faults::default());
    {
        let pd = l.a.alloc_pd().unwrap();
        let cq = l.a.create_cq(64).unwrap();
        let x = pd.qp_builder(&cq, &cq).caps(caps(8)).build::<Rc>().unwrap();
        let y = pd.qp_builder(&cq, &cq).caps(caps(8)).build::<Rc>().unwrap();
        let (nx, ny) = (x.qp_num(), y.qp_num());
        let (p1, p2) = (l.a.random_psn(), l.a.random_psn());
        let mut x = up(x, ny, IP_A, Mtu::Mtu1024, (p1, p2));
        let mut y = up(y, nx, IP_A, Mtu::Mtu1024, (p2, p1));
        let mut m = pd.register(16384, ALL).unwrap();
        m.as_mut_slice()[..3000].copy_from_slice(&pattern(9, 3000));
        // SAFETY: the region stays registered until the completions.
        unsafe {
            let mut r = y.recv_batch();
            r.recv(1, &[m.sge(4096, 4096).unwrap()]).unwrap();
            r.finish();
            let mut s = x.send_batch();
            s.send(2, SIG, &[m.sge(0, 3000).unwrap()]).unwrap();
            s.rdma_read(3, SIG, (m.addr(), m.rkey()), &[m.sge(8192, 3000).unwrap()])
                .unwrap();
            s.finish();
        }
        let mut got = Vec::new();
        assert!(l.pump(10, || {
            got.extend(drain(&cq));
            got.len() == 3
        }));
        got.sort_by_key(|w| w.wr_id);
        let ids: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(
            ids,
            [
                (1, WcStatus::Success),
                (2, WcStatus::Success),
                (3, WcStatus::Success)
            ]
        );
        assert_eq!(&m.as_slice()[4096..7096], &pattern(9, 3000)[..]);
        assert_eq!(&m.as_slice()[8192..11192], &pattern(9, 3000)[..]);
        assert!(
            l.seg.sent().iter().all(|(_, f)| f[12..14] != [8, 0]),
            "nothing on the wire"
        );
    }
    teardown(l);
}

#[test]
fn the_safe_path_and_a_shared_receive_queue_work_over_rxe() {
    let l = lab(Faults::default());
    {
        let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let (ca, cb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        // A: the safe path (a buffer pool); B: receives through an SRQ, posted raw.
        let pool = pa.buffer_pool(4, 2048).unwrap();
        let srq = pb
            .create_srq(SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let qa = pa
            .qp_builder(&ca, &ca)
            .caps(caps(8))
            .pool(&pool)
            .build::<Rc>()
            .unwrap();
        let qb = pb
            .qp_builder(&cb, &cb)
            .caps(caps(8))
            .srq(&srq)
            .build::<Rc>()
            .unwrap();
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        let (p1, p2) = (l.a.random_psn(), l.b.random_psn());
        let mut qa = up(qa, nb, IP_B, Mtu::Mtu1024, (p1, p2));
        let _qb = up(qb, na, IP_A, Mtu::Mtu1024, (p2, p1));
        let mb = pb.register(8192, ALL).unwrap();
        let sges = [mb.sge(0, 4096).unwrap(), mb.sge(4096, 4096).unwrap()];
        // SAFETY: `mb` stays registered until the completions.
        unsafe {
            srq.post_recv_raw(&[
                RecvWr {
                    wr_id: 70,
                    sg_list: &sges[..1],
                },
                RecvWr {
                    wr_id: 71,
                    sg_list: &sges[1..],
                },
            ])
            .unwrap();
        }
        for (i, len) in [(0u64, 1500usize), (1, 2048)] {
            let mut b = pool.alloc().unwrap();
            b.set_len(len as u32).unwrap();
            b.as_mut_slice().copy_from_slice(&pattern(i as u32, len));
            qa.post_send(i, b).map_err(|(_, e)| e).unwrap();
        }
        assert_eq!(pool.free_count(), 2, "two buffers moved into the QP");
        let mut got_a = Vec::new();
        let mut got_b = Vec::new();
        assert!(l.pump(50, || {
            while let Some(c) = qa.poll_one().unwrap() {
                assert_eq!(c.wc.status, WcStatus::Success);
                got_a.push((c.wc.wr_id, c.buf.is_some()));
            }
            got_b.extend(drain(&cb));
            got_a.len() == 2 && got_b.len() == 2
        }));
        assert_eq!(
            got_a,
            [(0, true), (1, true)],
            "each send's buffer came back with it"
        );
        assert_eq!(pool.free_count(), 4, "and went back to the pool");
        let r: Vec<_> = got_b.iter().map(|w| (w.wr_id, w.byte_len)).collect();
        assert_eq!(r, [(70, 1500), (71, 2048)]);
        assert_eq!(&mb.as_slice()[..1500], &pattern(0, 1500)[..]);
        assert_eq!(&mb.as_slice()[4096..4096 + 2048], &pattern(1, 2048)[..]);
    }
    teardown(l);
}

#[test]
fn a_send_from_memory_it_may_not_read_fails_in_order_with_a_local_protection_error() {
    let l = lab(Faults::default());
    {
        let pds = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let cqs = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        let ma = pds.0.register(4096, ALL).unwrap();
        let mb = pds.1.register(4096, ALL).unwrap();
        let mut p = pair(&l, &pds, &cqs, ALL, (7, 7));
        let mut bad = ma.sge(0, 64).unwrap();
        bad.lkey ^= 0x100; // nobody's key
        // SAFETY: the regions stay registered until the completions.
        unsafe {
            let mut s = p.qa.send_batch();
            s.rdma_write(1, SIG, (mb.addr(), mb.rkey()), &[ma.sge(0, 64).unwrap()])
                .unwrap();
            s.rdma_write(2, SIG, (mb.addr(), mb.rkey()), &[bad])
                .unwrap();
            s.rdma_write(3, SIG, (mb.addr(), mb.rkey()), &[ma.sge(0, 64).unwrap()])
                .unwrap();
            s.finish();
        }
        let got = wait_a(&l, &p, 3);
        let ids: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(
            ids,
            [
                (1, WcStatus::WrFlushErr),
                (2, WcStatus::LocProtErr),
                (3, WcStatus::WrFlushErr)
            ]
        );
        assert_eq!(p.qa.query().unwrap().state, QpState::Err);
    }
    teardown(l);
}

#[test]
fn the_devices_objects_fit_any_stack() {
    use core::mem::size_of;
    let sizes = [
        ("Rxe", size_of::<R>()),
        ("Context", size_of::<Ctx>()),
        ("QueuePair", size_of::<QueuePair<'static, R, Rc, Rts>>()),
        ("CompletionQueue", size_of::<CompletionQueue<'static, R>>()),
        ("MemoryRegion", size_of::<MemoryRegion<'static, R>>()),
        (
            "SharedReceiveQueue",
            size_of::<SharedReceiveQueue<'static, R>>(),
        ),
    ];
    for (what, n) in sizes {
        assert!(n <= 512, "{what} is {n} bytes: {sizes:?}");
        println!("size {what} {n}");
    }
}

#[test]
fn an_srq_below_its_limit_raises_the_async_event_once() {
    let l = lab(Faults::default());
    {
        let pds = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let cqs = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        let srq = pds
            .1
            .create_srq(SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let qa = pds
            .0
            .qp_builder(&cqs.0, &cqs.0)
            .caps(caps(8))
            .build::<Rc>()
            .unwrap();
        let qb = pds
            .1
            .qp_builder(&cqs.1, &cqs.1)
            .caps(caps(8))
            .srq(&srq)
            .build::<Rc>()
            .unwrap();
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        let (p1, p2) = (l.a.random_psn(), l.b.random_psn());
        let mut qa = up(qa, nb, IP_B, Mtu::Mtu1024, (p1, p2));
        let _qb = up(qb, na, IP_A, Mtu::Mtu1024, (p2, p1));
        let ma = pds.0.register(4096, ALL).unwrap();
        let mb = pds.1.register(4096, ALL).unwrap();
        let sge = [mb.sge(0, 64).unwrap()];
        let wrs: Vec<_> = (0..4)
            .map(|i| RecvWr {
                wr_id: 100 + i,
                sg_list: &sge,
            })
            .collect();
        // SAFETY: `mb` stays registered until the QPs are gone.
        unsafe { srq.post_recv_raw(&wrs).unwrap() };
        srq.modify(3).unwrap();
        assert_eq!(l.b.get_async_event(), None);
        let send = |qa: &mut RcQp<'_>, id| {
            // SAFETY: `ma` stays registered until the completion.
            unsafe {
                let mut s = qa.send_batch();
                s.send(id, SIG, &[ma.sge(0, 8).unwrap()]).unwrap();
                s.finish();
            }
        };
        // 4 posted, limit 3: the first receive leaves 3 (not below), the second leaves 2.
        let mut got = Vec::new();
        for (id, event) in [(1u64, false), (2, true), (3, false)] {
            send(&mut qa, id);
            assert!(l.pump(50, || {
                got.extend(drain(&cqs.0));
                got.len() == id as usize
            }));
            let want = event.then(|| AsyncEvent::SrqLimitReached(srq.raw().number()));
            assert_eq!(l.b.get_async_event(), want, "after receive {id}");
        }
        assert!(got.iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(
            srq.query().unwrap().srq_limit,
            0,
            "the event disarmed the limit"
        );
    }
    teardown(l);
}

/// The base transport header's opcode and PSN of a RoCE frame (IPv4, no options).
fn bth_of(f: &[u8]) -> (u8, u32) {
    let b = &f[bareverbs::device::rxe::wire::packet::ROCE_OFFSET..];
    (b[0], u32::from_be_bytes([0, b[9], b[10], b[11]]))
}

#[test]
fn a_duplicate_atomic_is_answered_from_the_replay_cache_not_executed_again() {
    // RC opcodes (IBA 9.2): FETCH_ADD request, ATOMIC_ACKNOWLEDGE.
    const FETCH_ADD: u8 = 0x14;
    const ATOMIC_ACK: u8 = 0x12;
    let l = lab(Faults::default());
    {
        let pds = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
        let cqs = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
        let mut ma = pds.0.register(4096, ALL).unwrap();
        let mut rw = pds.1.register(4096, ALL).unwrap();
        rw.as_mut_slice()[..8].copy_from_slice(&40u64.to_le_bytes());
        let mut p = pair(&l, &pds, &cqs, ALL, (7, 7));
        // SAFETY: `ma` stays registered and unread until the completion.
        unsafe {
            let mut s = p.qa.send_batch();
            s.atomic_fetch_add(1, SIG, (rw.addr(), rw.rkey()), 2, &ma.sge(0, 8).unwrap())
                .unwrap();
            s.finish();
        }
        let got = wait_a(&l, &p, 1);
        assert_eq!((got[0].wr_id, got[0].status), (1, WcStatus::Success));
        assert_eq!(
            ma.as_slice()[..8],
            40u64.to_le_bytes(),
            "the original value"
        );
        assert_eq!(rw.as_slice()[..8], 42u64.to_le_bytes(), "added once");

        let sent = l.seg.sent();
        let (from_a, request) = sent
            .iter()
            .find(|(_, f)| f.len() > 60 && bth_of(f).0 == FETCH_ADD)
            .cloned()
            .expect("A's FETCH_ADD on the segment");
        let acks = |sent: &[(usize, Vec<u8>)]| -> Vec<Vec<u8>> {
            sent.iter()
                .filter(|(from, f)| *from != from_a && f.len() > 60 && bth_of(f).0 == ATOMIC_ACK)
                .map(|(_, f)| f.clone())
                .collect()
        };
        let first = acks(&sent);
        assert_eq!(first.len(), 1, "one atomic acknowledgement");
        // The request again, as a retransmission after a lost acknowledgement would bring it.
        ma.as_mut_slice()[..8].fill(0);
        l.seg.inject(from_a, &request);
        l.run(20);
        let again = acks(&l.seg.sent());
        assert_eq!(again.len(), 2, "the duplicate is answered");
        let ack_psn = |f: &[u8]| bth_of(f).1;
        assert_eq!(ack_psn(&again[1]), ack_psn(&first[0]), "for the same PSN");
        // AETH (4 bytes), then AtomicAckETH: the original value, big-endian.
        let orig = |f: &[u8]| {
            let at = bareverbs::device::rxe::wire::packet::ROCE_OFFSET + 12 + 4;
            u64::from_be_bytes(f[at..at + 8].try_into().unwrap())
        };
        assert_eq!(
            orig(&again[1]),
            40,
            "the value the first execution returned"
        );
        assert_eq!(rw.as_slice()[..8], 42u64.to_le_bytes(), "not added twice");
        // A took the duplicate acknowledgement for nothing: no completion, still RTS.
        let mut more = Vec::new();
        more.extend(drain(p.ca));
        assert!(more.is_empty(), "no second completion: {more:?}");
        assert_eq!(ma.as_slice()[..8], [0; 8], "nothing written again");
        assert_eq!(p.qa.query().unwrap().state, QpState::Rts);
        assert_eq!(p.qb.query().unwrap().state, QpState::Rts);
        drop(p);
    }
    teardown(l);
}

// RC opcodes (IBA 9.2) and AETH syndromes the READ-ordering tests below look for.
const READ_REQUEST: u8 = 0x0C;
const READ_RESPONSE_LAST: u8 = 0x0F;
const ACKNOWLEDGE: u8 = 0x11;
const SYN_ACK: u8 = 0x1F;
/// An RNR NAK's syndrome (timer code 1).
const SYN_RNR_NAK: u8 = 0x21;
/// Bytes the READ-ordering tests read: 16 packets at MTU 1024.
const READ_LEN: usize = 16384;

/// The READ-ordering tests' set-up: A and B connected (unlimited retries), B's region holding a
/// pattern in its first [`READ_LEN`] bytes and 4096 more after them, one WRITE exchanged so the
/// peers know each other's MAC; then `f` with the pair, A's region and B's region.
fn read_setup(
    l: &Lab,
    f: impl for<'a> FnOnce(&mut Pair<'a>, &MemoryRegion<'a, R>, &MemoryRegion<'a, R>),
) {
    let pds = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let cqs = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
    let ma = pds.0.register(READ_LEN + 4096, ALL).unwrap();
    let mut mb = pds.1.register(READ_LEN + 4096, ALL).unwrap();
    for (i, b) in mb.as_mut_slice()[..READ_LEN].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let mut p = pair(l, &pds, &cqs, ALL, (7, 7));
    // SAFETY: the buffers stay registered and untouched until the completion.
    unsafe {
        let mut s = p.qa.send_batch();
        s.rdma_write(
            0,
            SIG,
            (mb.addr() + READ_LEN as u64, mb.rkey()),
            &[ma.sge(0, 8).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    assert_eq!(wait_a(l, &p, 1)[0].status, WcStatus::Success);
    f(&mut p, &ma, &mb);
}

/// The RoCE frames link `from` sent from `l.seg.sent()[start]` on: opcode, PSN, and the AETH
/// syndrome of an acknowledge (0 for other opcodes).
fn roce_sent(l: &Lab, start: usize, from: usize) -> Vec<(u8, u32, u8)> {
    let aeth = bareverbs::device::rxe::wire::packet::ROCE_OFFSET + 12;
    l.seg.sent()[start..]
        .iter()
        .filter(|(by, f)| {
            *by == from && f.len() > 60 && f[12..14] == [8, 0] && f[36..38] == [0x12, 0xB7]
        })
        .map(|(_, f)| {
            let (op, psn) = bth_of(f);
            (op, psn, if op == ACKNOWLEDGE { f[aeth] } else { 0 })
        })
        .collect()
}

/// The PSNs of the READ requests A sent from `start` on.
fn read_requests(l: &Lab, start: usize) -> Vec<u32> {
    let a = roce_sent(l, start, 0).into_iter();
    a.filter(|f| f.0 == READ_REQUEST).map(|f| f.1).collect()
}

/// Checks that B sent no acknowledge (ACK or NAK) before the last response of the READ that
/// started at `read_psn`, and then the acknowledge `(PSN, syndrome)` `after`.
fn acknowledged_after_the_read(l: &Lab, start: usize, read_psn: u32, after: (u32, u8)) {
    let last = (read_psn + (READ_LEN as u32).div_ceil(1024) - 1) & 0xFF_FFFF;
    let b = roce_sent(l, start, 1);
    let end = b
        .iter()
        .position(|&(op, psn, _)| op == READ_RESPONSE_LAST && psn == last)
        .unwrap_or_else(|| panic!("the READ's last response (PSN {last}) in {b:?}"));
    assert!(
        b[..end].iter().all(|&(op, _, _)| op != ACKNOWLEDGE),
        "an acknowledge of a later request went out before the READ's responses: {b:?}"
    );
    assert!(
        b[end..].contains(&(ACKNOWLEDGE, after.0, after.1)),
        "the acknowledge {after:?} after them: {b:?}"
    );
}

/// The PSN that follows the READ-ordering tests' READ, which started at `read_psn` (its 16
/// responses take 16 PSNs).
fn after_the_read(read_psn: u32) -> u32 {
    (read_psn + (READ_LEN as u32).div_ceil(1024)) & 0xFF_FFFF
}

/// Posts on B the receive (wr_id 9) that A's SEND lands in.
fn post_b_recv(p: &mut Pair<'_>, mb: &MemoryRegion<'_, R>) {
    // SAFETY: the buffer stays registered and untouched until the completion.
    unsafe {
        let mut r = p.qb.recv_batch();
        r.recv(9, &[mb.sge(READ_LEN as u32, 4096).unwrap()])
            .unwrap();
        r.finish();
    }
}

/// Posts on A the READ (wr_id 1) of B's first [`READ_LEN`] bytes into A's.
fn post_a_read(p: &mut Pair<'_>, (ma, mb): (&MemoryRegion<'_, R>, &MemoryRegion<'_, R>)) {
    // SAFETY: both buffers stay registered and untouched until the completion.
    unsafe {
        let mut s = p.qa.send_batch();
        s.rdma_read(
            1,
            SIG,
            (mb.addr(), mb.rkey()),
            &[ma.sge(0, READ_LEN as u32).unwrap()],
        )
        .unwrap();
        s.finish();
    }
}

/// Posts on A the SEND (wr_id 2) of 64 bytes from past the READ's.
fn post_a_send(p: &mut Pair<'_>, ma: &MemoryRegion<'_, R>) {
    // SAFETY: the buffer stays registered and untouched until the completion.
    unsafe {
        let mut s = p.qa.send_batch();
        s.send(2, SIG, &[ma.sge(READ_LEN as u32, 64).unwrap()])
            .unwrap();
        s.finish();
    }
}

/// Checks A's two completions (the READ, wr_id 1, then the SEND, wr_id 2) and the bytes read.
fn read_and_send_done(got: &[WorkCompletion], ma: &MemoryRegion<'_, R>, mb: &MemoryRegion<'_, R>) {
    let st: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(st, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(
        ma.as_slice()[..READ_LEN],
        mb.as_slice()[..READ_LEN],
        "the bytes read"
    );
}

/// With B's NIC taking two frames a round (its transmit ring full otherwise): A reads
/// [`READ_LEN`] bytes of B's region, B answers in part, then A sends 64 bytes while the rest of
/// the READ waits for room. Runs up to 400 rounds until A has both completions, calling
/// `each_round` with the pair and those so far before every round; checks them and the bytes read. Returns
/// where in `l.seg.sent()` the exchange started.
fn throttled_read_then_send<'a>(
    l: &Lab,
    p: &mut Pair<'a>,
    (ma, mb): (&MemoryRegion<'a, R>, &MemoryRegion<'a, R>),
    mut each_round: impl FnMut(&mut Pair<'a>, &[WorkCompletion]),
) -> usize {
    let start = l.seg.sent().len();
    let round = || {
        l.seg.set_tx_credit(1, Some(2));
        l.run(1);
    };
    post_a_read(p, (ma, mb));
    round();
    post_a_send(p, ma);
    let mut got = Vec::new();
    for _ in 0..400 {
        got.extend(drain(p.ca));
        if got.len() >= 2 {
            break;
        }
        each_round(p, &got);
        round();
    }
    l.seg.set_tx_credit(1, None);
    read_and_send_done(&got, ma, mb);
    start
}

#[test]
fn an_acknowledgement_waits_behind_the_read_responses_the_nic_had_no_room_for() {
    let l = lab(Faults::default());
    read_setup(&l, |p, ma, mb| {
        post_b_recv(p, mb);
        let start = throttled_read_then_send(&l, p, (ma, mb), |_, _| {});
        let mut rb = Vec::new();
        rb.extend(drain(p.cb));
        assert_eq!(rb.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [9]);

        let reads = read_requests(&l, start);
        assert_eq!(reads.len(), 1, "A asked once (no retry): {reads:?}");
        // The READ takes PSNs first..=last; the SEND's PSN follows: ACKed after them.
        let send = after_the_read(reads[0]);
        acknowledged_after_the_read(&l, start, reads[0], (send, SYN_ACK));
    });
    teardown(l);
}

#[test]
fn a_nak_past_an_unanswered_read_asks_for_the_read_again_from_its_first_psn() {
    use bareverbs::device::rxe::wire::packet::{Frame, Route, build, parse};
    let l = lab(Faults::default());
    read_setup(&l, |p, ma, mb| {
        // B's ACK of the set-up's WRITE: the template of the NAK forged below.
        let (_, template) = l
            .seg
            .sent()
            .into_iter()
            .rev()
            .find(|(from, _)| *from == 1)
            .unwrap();
        let start = l.seg.sent().len();
        // B's NIC sends nothing for now: the READ goes unanswered.
        l.seg.set_tx_credit(1, Some(0));
        post_b_recv(p, mb);
        post_a_read(p, (ma, mb));
        post_a_send(p, ma);
        l.run(1);
        let read_psn = read_requests(&l, start)[0];
        let send_psn = after_the_read(read_psn);
        let first = roce_sent(&l, start, 0);
        assert!(
            first.contains(&(4, send_psn, 0)),
            "A sent the SEND after the READ: {first:?}"
        );
        // An RNR NAK for the SEND reaches A before any of the READ's responses (as from a
        // responder that lost them or let the NAK overtake them).
        let Ok(Frame::Roce(t)) = parse(&template) else {
            panic!("B's ACK parses");
        };
        let route = Route {
            src_mac: t.src_mac,
            dst_mac: template[..6].try_into().unwrap(),
            src_ip: t.ip.src,
            dst_ip: t.ip.dst,
            tos: 0,
            ttl: 64,
            src_port: t.udp.src_port,
        };
        let mut h = t.headers;
        h.bth.psn = send_psn;
        h.aeth.as_mut().unwrap().syndrome = SYN_RNR_NAK;
        let mut buf = vec![0u8; 1600];
        let n = build(&mut buf, &route, 7, &h, &[]).unwrap();
        l.seg.inject(1, &buf[..n]);
        l.run(1);
        l.seg.set_tx_credit(1, None);
        read_and_send_done(&wait_a(&l, p, 2), ma, mb);
        // Every READ request A sent names the READ's own first PSN: nothing of it came back,
        // so it is asked again whole (not from the NAK's PSN, which is the SEND's).
        let reads = read_requests(&l, start);
        assert!(
            reads.len() >= 2 && reads.iter().all(|&psn| psn == read_psn),
            "A asked for the READ again from PSN {read_psn}: {reads:?}"
        );
    });
    teardown(l);
}

#[test]
fn a_receiver_not_ready_nak_waits_behind_the_read_responses_the_nic_had_no_room_for() {
    let l = lab(Faults::default());
    read_setup(&l, |p, ma, mb| {
        // No receive posted when the SEND comes in: B answers it with an RNR NAK. The receive
        // is posted once the READ has completed.
        let mut posted = false;
        let start = throttled_read_then_send(&l, p, (ma, mb), |p, got| {
            if !posted && got.iter().any(|w| w.wr_id == 1) {
                post_b_recv(p, mb);
                posted = true;
            }
        });

        let reads = read_requests(&l, start);
        assert_eq!(reads.len(), 1, "A asked once (no retry): {reads:?}");
        // The SEND refused with an RNR NAK, after the READ's responses.
        let send = after_the_read(reads[0]);
        acknowledged_after_the_read(&l, start, reads[0], (send, SYN_RNR_NAK));
    });
    teardown(l);
}
