//! The software RoCEv2 device end to end: two `Rxe` endpoints on an in-memory Ethernet
//! segment, driven through the verbs API — every opcode, the errors a peer reports (bad key,
//! rights, alignment, no receive posted), and a lossy segment (drop, duplicate, reorder) over
//! which every request still completes exactly once with the right bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bareverbs::Context;
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;
use bareverbs_model::link::{Faults, MemLink, Segment};
use bareverbs_model::{Model, ModelConfig};

/// A clock the test moves.
#[derive(Clone, Default)]
struct Clk(Arc<AtomicU64>);

impl Clock for Clk {
    fn now_us(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

type R = Rxe<Model, MemLink, Clk>;
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
    clk: Clk,
    a: Ctx,
    b: Ctx,
}

fn lab(faults: Faults) -> Lab {
    let model = Model::new(ModelConfig::default());
    let seg = Segment::new();
    let clk = Clk::default();
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
            self.clk.0.fetch_add(step, Ordering::Relaxed);
            self.a.process_events();
            self.b.process_events();
        }
        done()
    }
}

fn drain<P: Provider>(cq: &CompletionQueue<'_, P>, into: &mut Vec<WorkCompletion>) {
    let mut wc = [WorkCompletion::default(); 8];
    loop {
        let n = cq.poll(&mut wc).unwrap();
        if n == 0 {
            return;
        }
        into.extend_from_slice(&wc[..n]);
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
    let qp = qp
        .init(&ConnectedInit {
            access: ALL,
            ..Default::default()
        })
        .map_err(|(_, e)| e)
        .unwrap();
    let mut rtr = ConnectedRtr::new(peer, psns.1, AddressVector::new(Gid::from_ipv4(ip), 1));
    rtr.path_mtu = mtu;
    rtr.max_dest_rd_atomic = 4;
    let qp = qp.rtr(&rtr).map_err(|(_, e)| e).unwrap();
    let mut rts = ConnectedRts::new(psns.0);
    rts.max_rd_atomic = 4;
    rts.timeout = 8; // about 1 ms
    qp.rts(&rts).map_err(|(_, e)| e).unwrap()
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
                    drain(&ca, &mut wa);
                    drain(&cb, &mut wb);
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
                    drain(&ca, &mut wa);
                    drain(&cb, &mut wb);
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
                    drain(&ca, &mut wa);
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
                    drain(&ca, &mut wa);
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
