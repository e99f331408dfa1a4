//! The same data-path scenarios on the PVRDMA device model (`Semantics::Verbs`, one device in
//! loopback) and on two software RoCE devices on the in-memory Ethernet segment: every
//! completion (`wr_id`, status, opcode, and `byte_len` where the verbs define it), the QPs'
//! states afterwards and the bytes in both ends' memory must be identical.
//!
//! Scenarios: SEND/RECV (with immediate), RDMA WRITE (with immediate), RDMA READ, a bad rkey,
//! a key beyond its region, a region without the right, a responder QP without the right or
//! with READ depth 0, receiver not ready, a receive too small, the flush of everything behind a
//! failure (the QP in ERROR), receives through an SRQ, and UD datagrams (delivered, no receive,
//! wrong Q_Key); then proptest draws sequences of these.
//!
//! Known device differences, named where they are met (`KNOWN`):
//! - atomics: PVRDMA has none (QEMU advertises `atomic_ops` 0): the post is a typed
//!   `Unsupported`; rxe runs them;
//! - receiver not ready: the model does not retry (it fails at once, as QEMU's host QP does
//!   when its RNR retries run out); the rxe QPs here are brought up with `rnr_retry` 0, which
//!   fails on the first RNR NAK the same way;
//! - `byte_len` of an error completion is undefined in the verbs (only `wr_id`, status, QP and
//!   vendor detail are): compared only on success;
//! - what a failed request leaves in memory is undefined too (rxe has written the packets of
//!   a multi-packet WRITE before the one that fails, the model writes nothing): memory is
//!   compared when every request succeeded.

use bareverbs::error::{Error, Feature, Unsupported};
use bareverbs::verbs::*;
use bareverbs_model::{CapsConfig, ModelConfig};
use common::{caps, drain, rc_to_rts, ud_to_rts};
use pair::{Ends, Pv, on_rxe};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngAlgorithm, TestRng, TestRunner};

mod common;
mod pair;

/// The known differences between the devices (device, what, why).
const KNOWN: &[(&str, &str, &str)] = &[
    (
        "pvrdma",
        "atomics",
        "QEMU advertises atomic_ops 0: the post is a typed Unsupported",
    ),
    (
        "pvrdma",
        "RNR retries",
        "the model fails an RNR at once: rxe runs here with rnr_retry 0",
    ),
];

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;
const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);
const SIG: SendFlags = SendFlags::SIGNALED;
/// Each end's region; B's remote target lies at `TARGET` in it.
const MR_LEN: usize = 16384;
const TARGET: u64 = 8192;

/// Which remote key a WRITE or READ uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    /// B's region, with every right.
    Good,
    /// A key nobody registered.
    Bad,
    /// B's region, but running past its end.
    Beyond,
    /// B's second region, registered without remote write.
    ReadOnly,
}

/// One step of a scenario: A is the requester, B the responder.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// A receive at B (on its SRQ if it has one) of `len` bytes.
    Recv { len: u32 },
    /// A SEND of `len` bytes from A (with immediate data when `imm`).
    Send { len: u32, imm: bool },
    /// An RDMA WRITE of `len` bytes from A (with immediate data when `imm`).
    Write { len: u32, key: Key, imm: bool },
    /// An RDMA READ of `len` bytes into A.
    Read { len: u32, key: Key },
}

/// An RC scenario.
#[derive(Clone, Debug)]
struct Scenario {
    /// B's QP access flags.
    b_access: AccessFlags,
    /// B's `max_dest_rd_atomic`.
    b_depth: u8,
    /// B's receives through an SRQ.
    srq: bool,
    ops: Vec<Op>,
}

/// A completion as compared: `byte_len` only on success.
type Wc = (u64, WcStatus, WcOpcode, Option<u32>);

/// What a device made of a scenario.
#[derive(Debug, PartialEq)]
struct Outcome {
    a: Vec<Wc>,
    b: Vec<Wc>,
    states: (QpState, QpState),
    /// A's region and B's, afterwards.
    memory: (Vec<u8>, Vec<u8>),
}

impl Outcome {
    /// Whether memory is defined: every request succeeded.
    fn defined(&self) -> bool {
        self.a
            .iter()
            .chain(&self.b)
            .all(|w| w.1 == WcStatus::Success)
    }
}

fn wc(w: &WorkCompletion) -> Wc {
    let len = (w.status == WcStatus::Success).then_some(w.byte_len);
    (w.wr_id, w.status, w.opcode, len)
}

fn rc_up<'a, P: Provider>(
    qp: QueuePair<'a, P, Rc, Reset>,
    peer: u32,
    av: AddressVector,
    access: AccessFlags,
    depth: u8,
) -> QueuePair<'a, P, Rc, Rts> {
    let init = ConnectedInit {
        access,
        ..Default::default()
    };
    let mut rtr = ConnectedRtr::new(peer, 0, av);
    rtr.max_dest_rd_atomic = depth;
    rtr.min_rnr_timer = 1;
    let mut rts = ConnectedRts::new(0);
    (rts.max_rd_atomic, rts.timeout, rts.retry_cnt, rts.rnr_retry) = (1, 8, 7, 0);
    rc_to_rts(qp, &init, &rtr, &rts)
}

/// Runs an RC scenario on `e`.
fn run_rc<P: Provider>(e: &Ends<'_, P>, s: &Scenario) -> Outcome {
    let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
    let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
    let srq = s.srq.then(|| {
        pb.create_srq(SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap()
    });
    let qa = pa
        .qp_builder(&ca, &ca)
        .caps(caps(16, 16, 1))
        .build::<Rc>()
        .unwrap();
    let mut bb = pb.qp_builder(&cb, &cb).caps(caps(16, 16, 1));
    if let Some(srq) = &srq {
        bb = bb.srq(srq);
    }
    let qb = bb.build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let mut qa = rc_up(qa, nb, e.to_b, RW, 1);
    let mut qb = rc_up(qb, na, e.to_a, s.b_access, s.b_depth);
    let mut ma = pa.register(MR_LEN, RW).unwrap();
    for (k, b) in ma.as_mut_slice()[..4096].iter_mut().enumerate() {
        *b = (k as u8).wrapping_mul(7).wrapping_add(1);
    }
    let mut mb = pb.register(MR_LEN, RW).unwrap();
    for (k, b) in mb.as_mut_slice()[TARGET as usize..].iter_mut().enumerate() {
        *b = (k as u8).wrapping_mul(13).wrapping_add(5);
    }
    let ro = pb
        .register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    for (i, op) in s.ops.iter().enumerate() {
        let id = i as u64 + 1;
        let remote = |key: Key, len: u32| match key {
            Key::Good => (mb.addr() + TARGET, mb.rkey()),
            Key::Bad => (mb.addr() + TARGET, mb.rkey() ^ 0x8000_0000),
            Key::Beyond => (mb.addr() + MR_LEN as u64 - u64::from(len) / 2, mb.rkey()),
            Key::ReadOnly => (ro.addr(), ro.rkey()),
        };
        // SAFETY: every region outlives the QPs (dropped after them below); the CPU reads
        // them only once everything has completed.
        unsafe {
            match *op {
                Op::Recv { len } => {
                    let sge = mb.sge((i as u32 % 8) * 512, len).unwrap();
                    match &srq {
                        Some(srq) => srq
                            .post_recv_raw(&[RecvWr {
                                wr_id: 100 + id,
                                sg_list: &[sge],
                            }])
                            .unwrap(),
                        None => qb.post_recv_raw(100 + id, &[sge]).unwrap(),
                    }
                }
                Op::Send { len, imm } => {
                    let sge = ma.sge(0, len).unwrap();
                    let mut sb = qa.send_batch();
                    match imm {
                        true => sb.send_imm(id, SIG, 0x1000 + id as u32, &[sge]).unwrap(),
                        false => sb.send(id, SIG, &[sge]).unwrap(),
                    }
                    sb.finish();
                }
                Op::Write { len, key, imm } => {
                    let sge = ma.sge(0, len).unwrap();
                    let to = remote(key, len);
                    let mut sb = qa.send_batch();
                    match imm {
                        true => sb.rdma_write_imm(id, SIG, to, 7, &[sge]).unwrap(),
                        false => sb.rdma_write(id, SIG, to, &[sge]).unwrap(),
                    }
                    sb.finish();
                }
                Op::Read { len, key } => {
                    let sge = ma.sge(8192, len).unwrap();
                    let mut sb = qa.send_batch();
                    sb.rdma_read(id, SIG, remote(key, len), &[sge]).unwrap();
                    sb.finish();
                }
            }
        }
        (e.settle)();
        got_a.extend(drain(&ca).iter().map(wc));
        got_b.extend(drain(&cb).iter().map(wc));
    }
    let states = (qa.query().unwrap().state, qb.query().unwrap().state);
    drop((qa, qb));
    let memory = (ma.as_slice().to_vec(), mb.as_slice().to_vec());
    Outcome {
        a: got_a,
        b: got_b,
        states,
        memory,
    }
}

/// The PVRDMA model (strict verbs) with a device limit on the READ depths, so that the depth
/// asked reaches it (with QEMU's 0 the driver gives every QP 1).
fn pvrdma_config() -> ModelConfig {
    ModelConfig {
        caps: CapsConfig {
            rd_atom: (16, 16),
            ..CapsConfig::default()
        },
        ..ModelConfig::default()
    }
}

fn on_pvrdma<T>(f: impl FnOnce(&Ends<'_, Pv>) -> T) -> T {
    pair::on_pvrdma(pvrdma_config(), f)
}

/// Runs `s` on both and requires identical outcomes; gives the outcome.
fn same(s: &Scenario) -> Outcome {
    let pv = on_pvrdma(|e| run_rc(e, s));
    let rx = on_rxe(|e| run_rc(e, s));
    assert_eq!(pv.a, rx.a, "A's completions differ (pvrdma, rxe) in {s:?}");
    assert_eq!(pv.b, rx.b, "B's completions differ (pvrdma, rxe) in {s:?}");
    assert_eq!(pv.states, rx.states, "QP states differ in {s:?}");
    assert!(
        !pv.defined() || pv.memory == rx.memory,
        "memory differs in {s:?}"
    );
    pv
}

fn scenario(ops: Vec<Op>) -> Scenario {
    Scenario {
        b_access: RW,
        b_depth: 1,
        srq: false,
        ops,
    }
}

use WcOpcode as O;
use WcStatus as S;

#[test]
fn send_write_and_read_complete_alike() {
    let o = same(&scenario(vec![
        Op::Recv { len: 512 },
        Op::Recv { len: 512 },
        Op::Recv { len: 512 },
        Op::Send {
            len: 100,
            imm: false,
        },
        Op::Send { len: 1, imm: true },
        Op::Write {
            len: 3000,
            key: Key::Good,
            imm: false,
        },
        Op::Write {
            len: 64,
            key: Key::Good,
            imm: true,
        },
        Op::Read {
            len: 2500,
            key: Key::Good,
        },
    ]));
    assert_eq!(
        o.a,
        [
            (4, S::Success, O::Send, Some(100)),
            (5, S::Success, O::Send, Some(1)),
            (6, S::Success, O::RdmaWrite, Some(3000)),
            (7, S::Success, O::RdmaWrite, Some(64)),
            (8, S::Success, O::RdmaRead, Some(2500)),
        ]
    );
    assert_eq!(
        o.b,
        [
            (101, S::Success, O::Recv, Some(100)),
            (102, S::Success, O::Recv, Some(1)),
            (103, S::Success, O::RecvRdmaWithImm, Some(64)),
        ]
    );
    assert_eq!(o.states, (QpState::Rts, QpState::Rts));
}

#[test]
fn remote_faults_fail_the_request_and_put_both_qps_in_error() {
    let write = |key| Op::Write {
        len: 64,
        key,
        imm: false,
    };
    for (key, status) in [
        (Key::Bad, S::RemAccessErr),
        (Key::Beyond, S::RemAccessErr),
        (Key::ReadOnly, S::RemAccessErr),
    ] {
        let o = same(&scenario(vec![
            Op::Recv { len: 64 },
            write(key),
            write(Key::Good),
            Op::Recv { len: 64 },
        ]));
        // The failure, then the flush behind it; B's receives flushed at its move to ERROR,
        // and the one posted after.
        assert_eq!(
            o.a,
            [
                (2, status, O::RdmaWrite, None),
                (3, S::WrFlushErr, O::RdmaWrite, None)
            ],
            "{key:?}"
        );
        assert_eq!(
            o.b,
            [
                (101, S::WrFlushErr, O::Recv, None),
                (104, S::WrFlushErr, O::Recv, None)
            ],
            "{key:?}"
        );
        assert_eq!(o.states, (QpState::Err, QpState::Err), "{key:?}");
    }
}

#[test]
fn a_responder_without_the_right_or_the_depth_refuses_as_an_invalid_request() {
    let read = Op::Read {
        len: 64,
        key: Key::Good,
    };
    let write = Op::Write {
        len: 64,
        key: Key::Good,
        imm: false,
    };
    let cases = [
        (
            "no remote write",
            LOCAL | AccessFlags::REMOTE_READ,
            1,
            write,
        ),
        ("no remote read", LOCAL | AccessFlags::REMOTE_WRITE, 1, read),
        ("no rights at all", AccessFlags::empty(), 1, write),
        ("READ depth 0", RW, 0, read),
    ];
    for (what, b_access, b_depth, op) in cases {
        let o = same(&Scenario {
            b_access,
            b_depth,
            srq: false,
            ops: vec![op, Op::Send { len: 8, imm: false }],
        });
        assert_eq!(o.a[0].1, S::RemInvReqErr, "{what}");
        assert_eq!(o.a[1].1, S::WrFlushErr, "{what}");
        assert_eq!(o.states, (QpState::Err, QpState::Err), "{what}");
    }
    // The rights that are there work.
    let o = same(&Scenario {
        b_access: LOCAL | AccessFlags::REMOTE_READ,
        b_depth: 1,
        srq: false,
        ops: vec![read],
    });
    assert_eq!(o.a, [(1, S::Success, O::RdmaRead, Some(64))]);
}

#[test]
fn rnr_a_short_receive_and_the_flush_on_error() {
    // No receive: RNR (see KNOWN), then the requester alone is in ERROR.
    let o = same(&scenario(vec![
        Op::Send { len: 8, imm: false },
        Op::Send { len: 8, imm: false },
        Op::Recv { len: 64 },
    ]));
    assert_eq!(
        o.a,
        [
            (1, S::RnrRetryExcErr, O::Send, None),
            (2, S::WrFlushErr, O::Send, None)
        ]
    );
    assert_eq!(o.states, (QpState::Err, QpState::Rts));
    assert_eq!(o.b, [], "B's receive stays posted");
    // A receive too small: LocLenErr at B, RemInvReqErr at A, both in ERROR.
    let o = same(&scenario(vec![
        Op::Recv { len: 16 },
        Op::Recv { len: 512 },
        Op::Send {
            len: 100,
            imm: false,
        },
    ]));
    assert_eq!(o.a, [(3, S::RemInvReqErr, O::Send, None)]);
    assert_eq!(
        o.b,
        [
            (101, S::LocLenErr, O::Recv, None),
            (102, S::WrFlushErr, O::Recv, None)
        ]
    );
    assert_eq!(o.states, (QpState::Err, QpState::Err));
}

#[test]
fn srq_receives_complete_alike_and_are_not_flushed_with_a_qp() {
    let o = same(&Scenario {
        b_access: RW,
        b_depth: 1,
        srq: true,
        ops: vec![
            Op::Recv { len: 256 },
            Op::Recv { len: 256 },
            Op::Send {
                len: 200,
                imm: true,
            },
            Op::Write {
                len: 8,
                key: Key::Bad,
                imm: false,
            },
        ],
    });
    assert_eq!(o.b, [(101, S::Success, O::Recv, Some(200))]);
    assert_eq!(o.states, (QpState::Err, QpState::Err));
}

fn ud<'a, P: Provider>(
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    qkey: u32,
) -> QueuePair<'a, P, Ud, Rts> {
    let q = pd
        .qp_builder(cq, cq)
        .caps(caps(16, 16, 1))
        .build::<Ud>()
        .unwrap();
    ud_to_rts(q, qkey)
}

/// A UD scenario: a datagram delivered, one with no receive posted, one with the wrong
/// Q_Key (both dropped: the sender still completes).
fn run_ud<P: Provider>(e: &Ends<'_, P>) -> (Vec<Wc>, Vec<Wc>) {
    const QKEY: u32 = 0x1111_1111;
    let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
    let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
    let (mut qa, mut qb) = (ud(&pa, &ca, QKEY), ud(&pb, &cb, QKEY));
    let ma = pa.register(4096, RW).unwrap();
    let mb = pb.register(4096, RW).unwrap();
    let ah = pa.create_ah(&e.to_b).unwrap();
    let nb = qb.qp_num();
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    // SAFETY: the regions outlive the QPs.
    unsafe {
        qb.post_recv_raw(100, &[mb.sge(0, 1024).unwrap()]).unwrap();
        let mut sb = qa.send_batch();
        sb.send_to(1, SIG, (&ah, nb, QKEY), &[ma.sge(0, 100).unwrap()])
            .unwrap();
        sb.send_to_imm(2, SIG, (&ah, nb, QKEY), 9, &[ma.sge(0, 10).unwrap()])
            .unwrap();
        sb.send_to(3, SIG, (&ah, nb, QKEY ^ 1), &[ma.sge(0, 10).unwrap()])
            .unwrap();
        sb.finish();
    }
    (e.settle)();
    got_a.extend(drain(&ca).iter().map(wc));
    got_b.extend(drain(&cb).iter().map(wc));
    (got_a, got_b)
}

#[test]
fn ud_datagrams_complete_alike() {
    let pv = on_pvrdma(run_ud);
    let rx = on_rxe(run_ud);
    assert_eq!(pv, rx);
    assert_eq!(
        pv.0,
        [
            (1, S::Success, O::Send, Some(100)),
            (2, S::Success, O::Send, Some(10)),
            (3, S::Success, O::Send, Some(10)),
        ]
    );
    // The GRH's 40 bytes, then the payload.
    assert_eq!(pv.1, [(100, S::Success, O::Recv, Some(140))]);
}

/// An atomic on each: rxe runs it, PVRDMA refuses the post (`KNOWN`).
fn try_atomic<P: Provider>(e: &Ends<'_, P>) -> Result<Vec<Wc>, Error> {
    let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
    let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
    let qa = pa
        .qp_builder(&ca, &ca)
        .caps(caps(16, 16, 1))
        .build::<Rc>()
        .unwrap();
    let qb = pb
        .qp_builder(&cb, &cb)
        .caps(caps(16, 16, 1))
        .build::<Rc>()
        .unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let all = RW | AccessFlags::REMOTE_ATOMIC;
    let mut qa = rc_up(qa, nb, e.to_b, all, 1);
    let _qb = rc_up(qb, na, e.to_a, all, 1);
    let ma = pa.register(4096, all).unwrap();
    let mb = pb.register(4096, all).unwrap();
    // SAFETY: the regions outlive the QPs.
    unsafe {
        let mut sb = qa.send_batch();
        sb.atomic_fetch_add(1, SIG, (mb.addr(), mb.rkey()), 5, &ma.sge(0, 8).unwrap())?;
        sb.finish();
    }
    (e.settle)();
    let mut got = Vec::new();
    got.extend(drain(&ca).iter().map(wc));
    Ok(got)
}

#[test]
fn atomics_are_a_named_difference() {
    assert!(KNOWN.iter().any(|k| k.1 == "atomics"));
    assert_eq!(
        on_pvrdma(try_atomic),
        Err(Error::Unsupported(Unsupported::Feature(Feature::Atomics)))
    );
    assert_eq!(
        on_rxe(try_atomic),
        Ok(vec![(1, S::Success, O::FetchAdd, Some(8))])
    );
}

// ---------------------------------------------------------------------------------------------
// Drawn sequences

fn op() -> impl Strategy<Value = Op> {
    let len = prop_oneof![Just(1u32), Just(64), 1u32..600, Just(2048), Just(4096)];
    let key = prop_oneof![
        6 => Just(Key::Good),
        1 => Just(Key::Bad),
        1 => Just(Key::Beyond),
        1 => Just(Key::ReadOnly),
    ];
    prop_oneof![
        3 => (16u32..600).prop_map(|len| Op::Recv { len }),
        3 => (len.clone(), any::<bool>()).prop_map(|(len, imm)| Op::Send { len: len.min(600), imm }),
        2 => (len.clone(), key.clone(), any::<bool>())
            .prop_map(|(len, key, imm)| Op::Write { len, key, imm }),
        2 => (len, key).prop_map(|(len, key)| Op::Read { len, key }),
    ]
}

fn scenarios() -> impl Strategy<Value = Scenario> {
    let access = prop_oneof![
        6 => Just(RW),
        1 => Just(LOCAL | AccessFlags::REMOTE_READ),
        1 => Just(LOCAL | AccessFlags::REMOTE_WRITE),
        1 => Just(AccessFlags::empty()),
    ];
    (
        access,
        prop_oneof![5 => Just(1u8), 1 => Just(0u8)],
        any::<bool>(),
        prop::collection::vec(op(), 1..10),
    )
        .prop_map(|(b_access, b_depth, srq, ops)| Scenario {
            b_access,
            b_depth,
            srq,
            ops,
        })
}

#[test]
fn drawn_sequences_complete_alike() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let config = PtConfig {
        cases,
        failure_persistence: None,
        ..PtConfig::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]));
    let ran = std::cell::Cell::new(0u32);
    runner
        .run(&scenarios(), |s| {
            ran.set(ran.get() + 1);
            let pv = on_pvrdma(|e| run_rc(e, &s));
            let rx = on_rxe(|e| run_rc(e, &s));
            prop_assert_eq!(&pv.a, &rx.a, "A's completions (pvrdma, rxe)");
            prop_assert_eq!(&pv.b, &rx.b, "B's completions (pvrdma, rxe)");
            prop_assert_eq!(pv.states, rx.states, "QP states (pvrdma, rxe)");
            prop_assert!(!pv.defined() || pv.memory == rx.memory, "memory differs");
            Ok(())
        })
        .unwrap();
    assert_eq!(ran.get(), cases, "every drawn case ran");
}
