//! rdma-core's traffic cases (its `tests/test_qpex.py`, `test_srq.py` and `test_mr.py`'s
//! re-registrations of access), translated onto the
//! public API with their fixtures (`TrafficResources`: a CQ of 1000 entries, 1000 WRs each
//! way on the extended QPs, 1024-byte messages, 10 iterations; 100 and two QPs on an SRQ of
//! 2000 for the SRQ cases) and assertions (every completion a success, the bytes as
//! `validate` has them), between a client and a server: on the PVRDMA model (one device, in
//! loopback) and on two software RoCE devices on the in-memory segment.
//!
//! The extended post API (`ibv_wr_*`) and the classic one post the same work requests: here
//! both are the batch API. A typed `Unsupported` counts as rdma-core's skip; so would an SRQ
//! larger than the device's `max_srq_wr` (rxe's is 4096, the fixture asks 2000). An SRQ
//! deeper than its receive CQ's room (the fixture's CQ holds 10) is metered: on PVRDMA each
//! receive takes its CQ room when posted, on rxe when it is matched; its QPs are made and its
//! cases run like any other.
//!
//! Not expressible: posting on a QP in RESET (`test_post_{send,receive}_qp_state_bad_flow`:
//! ruled out by the types), XRC, FLUSH, ATOMIC WRITE and memory-window binds (not in the API);
//! of `test_mr.py`, re-registration of address or PD (the API changes access only).

mod common;
mod pair;

use bareverbs::error::{Error, ErrorKind, Queue};
use bareverbs::verbs::*;
use bareverbs_model::ModelConfig;
use common::{rc_to_rts, ud_to_rts};
use pair::{Ends, on_pvrdma, on_rxe};

const NUM_MSGS: u32 = 1000;
const MSG_SIZE: u32 = 1024;
const ITERS: u32 = 10;
const SRQ_ITERS: u32 = 100;
const GRH: u32 = 40;
const IMM_DATA: u32 = 1234;
const UD_QKEY: u32 = 0x1111_1111;
const SIG: SendFlags = SendFlags::SIGNALED;

/// What a case did.
#[derive(Debug, PartialEq)]
enum Outcome {
    Pass,
    Skip(&'static str),
}

/// A creation that failed: rdma-core's skip, or a failure (no QP is refused for its CQ's
/// size, an SRQ's included).
fn refused(e: &Error) -> Outcome {
    match e {
        e if e.kind() == ErrorKind::Unsupported => Outcome::Skip("unsupported"),
        e => panic!("creation failed: {e}"),
    }
}

/// `poll_cq`: one completion, a success (with `imm` when given).
fn poll<P: Provider>(e: &Ends<'_, P>, cq: &CompletionQueue<'_, P>, imm: Option<u32>) {
    (e.settle)();
    let mut wc = [WorkCompletion::default(); 2];
    let n = cq.poll(&mut wc).unwrap();
    assert_eq!(n, 1, "one completion: {:?}", &wc[..n]);
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    if let Some(imm) = imm {
        assert!(wc[0].flags.contains(WcFlags::WITH_IMM), "{:?}", wc[0]);
        assert_eq!(wc[0].imm, imm);
    }
}

/// The scatter/gather list of a message of `len` bytes at `off` (none for 0 bytes).
fn sgl<P: Provider>(mr: &MemoryRegion<'_, P>, off: u32, len: u32) -> Vec<Sge> {
    match len {
        0 => Vec::new(),
        n => vec![mr.sge(off, n).unwrap()],
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    CmpSwp,
    FetchAdd,
}

fn rc_up<'a, P: Provider>(
    qp: QueuePair<'a, P, Rc, Reset>,
    peer: u32,
    av: AddressVector,
    access: AccessFlags,
) -> QueuePair<'a, P, Rc, Rts> {
    let init = ConnectedInit {
        access,
        ..Default::default()
    };
    // RCResources.to_rts: ibv_rc_pingpong's values.
    let mut rtr = ConnectedRtr::new(peer, 0, av);
    rtr.path_mtu = Mtu::Mtu1024;
    (rtr.max_dest_rd_atomic, rtr.min_rnr_timer) = (1, 12);
    let mut rts = ConnectedRts::new(0);
    (rts.max_rd_atomic, rts.timeout, rts.retry_cnt, rts.rnr_retry) = (1, 14, 7, 7);
    rc_to_rts(qp, &init, &rtr, &rts)
}

/// `create_qp_ex`'s caps: `num_msgs` WRs each way.
const QPEX_CAPS: QpCaps = QpCaps {
    max_send_wr: NUM_MSGS,
    max_recv_wr: NUM_MSGS,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
};

/// One side's turn: `from` (whose region is `mf`, filled with `mine`) sends `op` of `msg`
/// bytes to the other (region `mt`), and both check what rdma-core checks.
#[allow(clippy::too_many_arguments)]
fn rc_turn<P: Provider>(
    e: &Ends<'_, P>,
    op: Op,
    msg: u32,
    (from, cf, mf): (
        &mut QueuePair<'_, P, Rc, Rts>,
        &CompletionQueue<'_, P>,
        &mut MemoryRegion<'_, P>,
    ),
    (to, ct, mt): (
        &mut QueuePair<'_, P, Rc, Rts>,
        &CompletionQueue<'_, P>,
        &mut MemoryRegion<'_, P>,
    ),
    (mine, theirs): (u8, u8),
) {
    let n = msg as usize;
    let remote = (mt.addr(), mt.rkey());
    // SAFETY: both regions outlive the QPs; the CPU touches them only between completions.
    unsafe {
        match op {
            Op::Send | Op::SendImm | Op::WriteImm => {
                mf.as_mut_slice()[..n].fill(mine);
                let mut sb = from.send_batch();
                let s = sgl(mf, 0, msg);
                match op {
                    Op::Send => sb.send(1, SIG, &s).unwrap(),
                    Op::SendImm => sb.send_imm(1, SIG, IMM_DATA, &s).unwrap(),
                    _ => sb.rdma_write_imm(1, SIG, remote, IMM_DATA, &s).unwrap(),
                }
                sb.finish();
                poll(e, cf, None);
                poll(e, ct, (op != Op::Send).then_some(IMM_DATA));
                to.post_recv_raw(2, &sgl(mt, 0, msg)).unwrap();
                assert!(mt.as_slice()[..n].iter().all(|&b| b == mine));
            }
            Op::Write | Op::Read => {
                // prepare_validate_data: each side's own letter.
                mf.as_mut_slice()[..n].fill(mine);
                mt.as_mut_slice()[..n].fill(theirs);
                let mut sb = from.send_batch();
                match op {
                    Op::Write => sb.rdma_write(1, SIG, remote, &sgl(mf, 0, msg)).unwrap(),
                    _ => sb.rdma_read(1, SIG, remote, &sgl(mf, 0, msg)).unwrap(),
                }
                sb.finish();
                poll(e, cf, None);
                let (got, want) = match op {
                    Op::Write => (&mt.as_slice()[..n], mine),
                    _ => (&mf.as_slice()[..n], theirs),
                };
                assert!(got.iter().all(|&b| b == want), "{op:?}");
            }
            Op::CmpSwp | Op::FetchAdd => {
                // atomic_traffic: sender 2s, receiver 1s; compare/add 2, swap 0.
                mf.as_mut_slice()[..8].fill(2);
                mt.as_mut_slice()[..8].fill(1);
                let receiver = u64::from_ne_bytes([1; 8]);
                let sge = mf.sge(0, 8).unwrap();
                let mut sb = from.send_batch();
                let r = match op {
                    Op::CmpSwp => sb.atomic_cmp_swp(1, SIG, remote, (2, 0), &sge),
                    _ => sb.atomic_fetch_add(1, SIG, remote, 2, &sge),
                };
                r.unwrap();
                sb.finish();
                poll(e, cf, None);
                let word = |m: &MemoryRegion<'_, P>| {
                    u64::from_ne_bytes(m.as_slice()[..8].try_into().unwrap())
                };
                let expected = match op {
                    Op::CmpSwp if receiver == 2 => 0,
                    Op::CmpSwp => receiver,
                    _ => receiver + 2,
                };
                assert_eq!(word(mf), receiver, "the original value comes back");
                assert_eq!(word(mt), expected, "{op:?} at the receiver");
            }
        }
    }
}

/// `traffic`, `rdma_traffic` or `atomic_traffic` between two extended RC QPs.
fn rc_traffic<P: Provider>(e: &Ends<'_, P>, op: Op, msg: u32) -> Outcome {
    let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
    let (ca, cb) = (
        e.a.create_cq(NUM_MSGS).unwrap(),
        e.b.create_cq(NUM_MSGS).unwrap(),
    );
    let build = |pd: &ProtectionDomain<'_, P>, cq| {
        pd.qp_builder(cq, cq)
            .caps(QPEX_CAPS)
            .build::<Rc>()
            .map(|q| q.qp_num())
            .err()
    };
    if let Some(err) = build(&pa, &ca) {
        return refused(&err);
    }
    let qa = pa.qp_builder(&ca, &ca).caps(QPEX_CAPS).build::<Rc>();
    let qb = pb.qp_builder(&cb, &cb).caps(QPEX_CAPS).build::<Rc>();
    let (qa, qb) = match (qa, qb) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(err), _) | (_, Err(err)) => return refused(&err),
    };
    // create_qp_ex's QP rights; create_custom_mr's regions.
    let rights = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let extra = match op {
        Op::Write | Op::WriteImm => AccessFlags::REMOTE_WRITE,
        Op::Read => AccessFlags::REMOTE_READ,
        Op::CmpSwp | Op::FetchAdd => AccessFlags::REMOTE_ATOMIC,
        Op::Send | Op::SendImm => AccessFlags::empty(),
    };
    let access = AccessFlags::LOCAL_WRITE | extra;
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let mut qa = rc_up(qa, nb, e.to_b, rights);
    let mut qb = rc_up(qb, na, e.to_a, rights);
    let mut ma = match pa.register(MSG_SIZE as usize, access) {
        Ok(m) => m,
        Err(err) => return refused(&err),
    };
    let mut mb = pb.register(MSG_SIZE as usize, access).unwrap();
    if matches!(op, Op::CmpSwp | Op::FetchAdd) {
        // The device may refuse atomics at post (PVRDMA: typed Unsupported).
        // SAFETY: nothing is posted: the batch is dropped unfinished.
        let r = unsafe {
            qa.send_batch().atomic_fetch_add(
                0,
                SIG,
                (mb.addr(), mb.rkey()),
                0,
                &ma.sge(0, 8).unwrap(),
            )
        };
        if let Err(err) = r {
            assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
            return Outcome::Skip("atomics unsupported");
        }
    }
    if matches!(op, Op::Send | Op::SendImm | Op::WriteImm) {
        // SAFETY: the regions outlive the QPs.
        unsafe {
            qa.post_recv_raw(2, &sgl(&ma, 0, msg)).unwrap();
            qb.post_recv_raw(2, &sgl(&mb, 0, msg)).unwrap();
        }
    }
    for _ in 0..ITERS {
        rc_turn(
            e,
            op,
            msg,
            (&mut qa, &ca, &mut ma),
            (&mut qb, &cb, &mut mb),
            (b'c', b's'),
        );
        rc_turn(
            e,
            op,
            msg,
            (&mut qb, &cb, &mut mb),
            (&mut qa, &ca, &mut ma),
            (b's', b'c'),
        );
    }
    Outcome::Pass
}

/// `traffic` between two extended UD QPs (the received bytes after the 40-byte GRH).
fn ud_traffic<P: Provider>(e: &Ends<'_, P>, imm: bool, msg: u32) -> Outcome {
    let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
    let (ca, cb) = (
        e.a.create_cq(NUM_MSGS).unwrap(),
        e.b.create_cq(NUM_MSGS).unwrap(),
    );
    let (qa, qb) = match (ud_qp(&pa, &ca), ud_qp(&pb, &cb)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(o), _) | (_, Err(o)) => return o,
    };
    let (mut qa, mut qb) = (qa, qb);
    let len = (msg + GRH) as usize;
    let mut ma = pa.register(len, AccessFlags::LOCAL_WRITE).unwrap();
    let mut mb = pb.register(len, AccessFlags::LOCAL_WRITE).unwrap();
    let (aha, ahb) = (
        pa.create_ah(&e.to_b).unwrap(),
        pb.create_ah(&e.to_a).unwrap(),
    );
    // SAFETY: the regions outlive the QPs; the CPU touches them only between completions.
    unsafe {
        qa.post_recv_raw(2, &[ma.sge(0, msg + GRH).unwrap()])
            .unwrap();
        qb.post_recv_raw(2, &[mb.sge(0, msg + GRH).unwrap()])
            .unwrap();
    }
    for _ in 0..ITERS {
        let t = (imm, msg);
        ud_turn(
            e,
            t,
            (&mut qa, &ca, &mut ma, &aha),
            (&mut qb, &cb, &mut mb),
            b'c',
        );
        ud_turn(
            e,
            t,
            (&mut qb, &cb, &mut mb, &ahb),
            (&mut qa, &ca, &mut ma),
            b's',
        );
    }
    Outcome::Pass
}

/// One side's UD turn: a datagram of `msg` bytes of `letter` from `from` to `to`.
#[allow(clippy::type_complexity)]
fn ud_turn<P: Provider>(
    e: &Ends<'_, P>,
    (imm, msg): (bool, u32),
    (from, cf, mf, ah): (
        &mut QueuePair<'_, P, Ud, Rts>,
        &CompletionQueue<'_, P>,
        &mut MemoryRegion<'_, P>,
        &AddressHandle<'_, P>,
    ),
    (to, ct, mt): (
        &mut QueuePair<'_, P, Ud, Rts>,
        &CompletionQueue<'_, P>,
        &mut MemoryRegion<'_, P>,
    ),
    letter: u8,
) {
    let n = msg as usize;
    mf.as_mut_slice()[..n].fill(letter);
    let dest = (ah, to.qp_num(), UD_QKEY);
    // SAFETY: the regions outlive the QPs; the CPU touches them only between completions.
    unsafe {
        let mut sb = from.send_batch();
        match imm {
            true => sb
                .send_to_imm(1, SIG, dest, IMM_DATA, &sgl(mf, 0, msg))
                .unwrap(),
            false => sb.send_to(1, SIG, dest, &sgl(mf, 0, msg)).unwrap(),
        }
        sb.finish();
    }
    poll(e, cf, None);
    poll(e, ct, imm.then_some(IMM_DATA));
    // SAFETY: as above.
    unsafe {
        to.post_recv_raw(2, &[mt.sge(0, msg + GRH).unwrap()])
            .unwrap()
    };
    let got = &mt.as_slice()[GRH as usize..GRH as usize + n];
    assert!(got.iter().all(|&b| b == letter));
}

/// `QpExUDSend`'s QP: `num_msgs` WRs each way, Q_Key 0x11111111, at RTS.
fn ud_qp<'a, P: Provider>(
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
) -> Result<QueuePair<'a, P, Ud, Rts>, Outcome> {
    let q = pd
        .qp_builder(cq, cq)
        .caps(QPEX_CAPS)
        .build::<Ud>()
        .map_err(|e| refused(&e))?;
    Ok(ud_to_rts(q, UD_QKEY))
}

/// `full_rq_bad_flow`: posting `max_recv_wr` + 1 receives fails (ENOMEM).
fn full_rq_bad_flow<P: Provider>(e: &Ends<'_, P>) -> Outcome {
    let pb = e.b.alloc_pd().unwrap();
    let cb = e.b.create_cq(NUM_MSGS).unwrap();
    let mut qb = match ud_qp(&pb, &cb) {
        Ok(q) => q,
        Err(o) => return o,
    };
    let mb = pb
        .register((MSG_SIZE + GRH) as usize, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let max = qb.query().unwrap().caps.max_recv_wr;
    let sge = [mb.sge(0, MSG_SIZE + GRH).unwrap()];
    // SAFETY: the region outlives the QP.
    let r = (0..=max).try_for_each(|i| unsafe { qb.post_recv_raw(u64::from(i), &sge) });
    let err = r.expect_err("a receive beyond max_recv_wr");
    assert!(
        matches!(
            err,
            Error::QueueFull {
                queue: Queue::Recv,
                ..
            }
        ),
        "ENOMEM: {err}"
    );
    Outcome::Pass
}

/// `create_rq_with_larger_sgl_bad_flow`: a receive with `max_recv_sge` + 1 entries fails
/// (EINVAL).
fn rq_with_larger_sgl_bad_flow<P: Provider>(e: &Ends<'_, P>) -> Outcome {
    let pb = e.b.alloc_pd().unwrap();
    let cb = e.b.create_cq(NUM_MSGS).unwrap();
    let mut qb = match ud_qp(&pb, &cb) {
        Ok(q) => q,
        Err(o) => return o,
    };
    let mb = pb
        .register((MSG_SIZE + GRH) as usize, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let max = qb.query().unwrap().caps.max_recv_sge;
    let len = MSG_SIZE / (max + 1);
    let sgl: Vec<Sge> = (0..=max).map(|i| mb.sge(i * len, len).unwrap()).collect();
    // SAFETY: the region outlives the QP.
    let err = unsafe { qb.post_recv_raw(1, &sgl) }.expect_err("too many SGEs");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "EINVAL: {err}");
    Outcome::Pass
}

/// `SrqTestCase`'s players: on each side a CQ of 1000, an SRQ of 2000 and two RC QPs of one
/// send and 1000 receives on it, connected pairwise; `f` runs the case.
fn srq_players<P: Provider>(
    e: &Ends<'_, P>,
    f: impl FnOnce(&mut SrqPlayers<'_, '_, P>) -> Outcome,
) -> Outcome {
    let max_wr = NUM_MSGS * 2;
    for ctx in [e.a, e.b] {
        if max_wr > ctx.caps().max_srq_wr {
            return Outcome::Skip("an SRQ of 2000 WRs is beyond the device's max_srq_wr");
        }
    }
    let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
    let (ca, cb) = (
        e.a.create_cq(NUM_MSGS).unwrap(),
        e.b.create_cq(NUM_MSGS).unwrap(),
    );
    let attr = SrqAttr {
        max_wr,
        max_sge: 1,
        srq_limit: 0,
    };
    let (sa, sb) = (pa.create_srq(attr).unwrap(), pb.create_srq(attr).unwrap());
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: NUM_MSGS,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut client = Vec::new();
    let mut server = Vec::new();
    for _ in 0..2 {
        let a = pa.qp_builder(&ca, &ca).caps(caps).srq(&sa).build::<Rc>();
        let b = pb.qp_builder(&cb, &cb).caps(caps).srq(&sb).build::<Rc>();
        let (a, b) = match (a, b) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(err), _) | (_, Err(err)) => return refused(&err),
        };
        let (na, nb) = (a.qp_num(), b.qp_num());
        // QPAttr's access flags: none.
        client.push(rc_up(a, nb, e.to_b, AccessFlags::empty()));
        server.push(rc_up(b, na, e.to_a, AccessFlags::empty()));
    }
    let ma = pa
        .register(MSG_SIZE as usize, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let mb = pb
        .register(MSG_SIZE as usize, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let mut p = SrqPlayers {
        e,
        client: (client, &ca, &sa, ma),
        server: (server, &cb, &sb, mb),
    };
    f(&mut p)
}

type Side<'a, 'b, P> = (
    Vec<QueuePair<'a, P, Rc, Rts>>,
    &'b CompletionQueue<'a, P>,
    &'b SharedReceiveQueue<'a, P>,
    MemoryRegion<'a, P>,
);

struct SrqPlayers<'a, 'b, P: Provider> {
    e: &'b Ends<'b, P>,
    client: Side<'a, 'b, P>,
    server: Side<'a, 'b, P>,
}

/// Posts a receive of the whole region to `side`'s SRQ.
fn srq_recv<P: Provider>(side: &Side<'_, '_, P>) {
    let sge = [side.3.sge(0, MSG_SIZE).unwrap()];
    // SAFETY: the region outlives the QPs.
    unsafe {
        side.2
            .post_recv_raw(&[RecvWr {
                wr_id: 2,
                sg_list: &sge,
            }])
            .unwrap()
    };
}

/// A SEND of the whole region on QP `i` of `side`.
fn srq_send<P: Provider>(side: &mut Side<'_, '_, P>, i: usize, letter: u8) {
    side.3.as_mut_slice().fill(letter);
    let sge = [side.3.sge(0, MSG_SIZE).unwrap()];
    // SAFETY: the region outlives the QPs.
    unsafe {
        let mut sb = side.0[i].send_batch();
        sb.send(1, SIG, &sge).unwrap();
        sb.finish();
    }
}

/// `test_rc_srq_traffic`: `traffic` over both QPs, the receives on the SRQs.
fn test_rc_srq_traffic<P: Provider>(e: &Ends<'_, P>) -> Outcome {
    srq_players(e, |p| {
        for _ in 0..2 {
            srq_recv(&p.client);
            srq_recv(&p.server);
        }
        for _ in 0..SRQ_ITERS {
            for i in 0..2 {
                srq_send(&mut p.client, i, b'c');
                poll(p.e, p.client.1, None);
                poll(p.e, p.server.1, None);
                srq_recv(&p.server);
                assert!(p.server.3.as_slice().iter().all(|&b| b == b'c'));
                srq_send(&mut p.server, i, b's');
                poll(p.e, p.server.1, None);
                poll(p.e, p.client.1, None);
                srq_recv(&p.client);
                assert!(p.client.3.as_slice().iter().all(|&b| b == b's'));
            }
        }
        Outcome::Pass
    })
}

/// `test_resize_srq`: the server's SRQ to twice its size (within the device's `max_srq_wr`),
/// read back exactly; a device that cannot resize is rdma-core's skip. (The API resizes
/// `max_wr` only: the SGEs stay as created.)
fn test_resize_srq<P: Provider>(e: &Ends<'_, P>) -> Outcome {
    srq_players(e, |p| {
        let srq = p.server.2;
        let want = e.b.caps().max_srq_wr.min(srq.query().unwrap().max_wr * 2);
        match srq.resize(want) {
            Err(err) if err.kind() == ErrorKind::Unsupported => {
                return Outcome::Skip("SRQ resize unsupported");
            }
            r => assert_eq!(r, Ok(want)),
        }
        assert_eq!(srq.query().unwrap().max_wr, want, "Resize SRQ failed");
        Outcome::Pass
    })
}

/// `test_modify_srq_limit`: 10 receives, the limit armed at 7 and read back; four SENDs
/// leave 6: the server's context reports SRQ_LIMIT_REACHED.
fn test_modify_srq_limit<P: Provider>(e: &Ends<'_, P>) -> Outcome {
    srq_players(e, |p| {
        for _ in 0..10 {
            srq_recv(&p.server);
        }
        match p.server.2.modify(7) {
            Err(err) if err.kind() == ErrorKind::Unsupported => {
                return Outcome::Skip("SRQ limit unsupported");
            }
            r => r.unwrap(),
        }
        assert_eq!(
            p.server.2.query().unwrap().srq_limit,
            7,
            "Modify SRQ failed"
        );
        for _ in 0..4 {
            srq_send(&mut p.client, 0, b'c');
            poll(p.e, p.client.1, None);
            poll(p.e, p.server.1, None);
        }
        let event = p.e.b.get_async_event();
        assert!(
            matches!(event, Some(AsyncEvent::SrqLimitReached(_))),
            "{event:?}"
        );
        Outcome::Pass
    })
}

// --- test_mr.py's re-registration cases (`MRRes`: RCResources with QP rights local write,
// remote write and remote atomic)

/// A connected RC pair.
type RcPair<'a, P> = (QueuePair<'a, P, Rc, Rts>, QueuePair<'a, P, Rc, Rts>);

/// `MRRes`'s QP pair, connected (1 send, 1000 receives, on CQs of 1000).
fn mr_pair<'a, P: Provider>(
    e: &Ends<'_, P>,
    (pa, pb): (&'a ProtectionDomain<'a, P>, &'a ProtectionDomain<'a, P>),
    (ca, cb): (&'a CompletionQueue<'a, P>, &'a CompletionQueue<'a, P>),
) -> Result<RcPair<'a, P>, Outcome> {
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: NUM_MSGS,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let a = pa.qp_builder(ca, ca).caps(caps).build::<Rc>();
    let b = pb.qp_builder(cb, cb).caps(caps).build::<Rc>();
    let (a, b) = match (a, b) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(err), _) | (_, Err(err)) => return Err(refused(&err)),
    };
    Ok(connect_mr_pair(e, a, b))
}

/// Connects (or, from RESET again, restates: `restate_qps`) `MRRes`'s pair.
fn connect_mr_pair<'a, P: Provider>(
    e: &Ends<'_, P>,
    a: QueuePair<'a, P, Rc, Reset>,
    b: QueuePair<'a, P, Rc, Reset>,
) -> RcPair<'a, P> {
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    let (na, nb) = (a.qp_num(), b.qp_num());
    (rc_up(a, nb, e.to_b, rights), rc_up(b, na, e.to_a, rights))
}

/// One request of `op` (WRITE or fetch-and-add) from `from` to `mt`: its status.
fn one_status<P: Provider>(
    e: &Ends<'_, P>,
    op: Op,
    (from, cf, mf): (
        &mut QueuePair<'_, P, Rc, Rts>,
        &CompletionQueue<'_, P>,
        &MemoryRegion<'_, P>,
    ),
    mt: &MemoryRegion<'_, P>,
) -> WcStatus {
    let remote = (mt.addr(), mt.rkey());
    // SAFETY: both regions outlive the QPs.
    unsafe {
        let mut sb = from.send_batch();
        match op {
            Op::Write => sb
                .rdma_write(1, SIG, remote, &sgl(mf, 0, MSG_SIZE))
                .unwrap(),
            _ => sb
                .atomic_fetch_add(1, SIG, remote, 2, &mf.sge(0, 8).unwrap())
                .unwrap(),
        }
        sb.finish();
    }
    (e.settle)();
    let mut wc = [WorkCompletion::default(); 2];
    assert_eq!(cf.poll(&mut wc).unwrap(), 1, "{:?}", wc[0]);
    wc[0].status
}

/// `validate_rereg_access` (`test_mr_rereg_access`, `test_mrex_rereg_access`): regions of
/// local write, re-registered with remote write, take `rdma_traffic`'s WRITEs.
fn rereg_access<P: Provider>(e: &Ends<'_, P>) -> Outcome {
    let pds = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
    let cqs = (
        e.a.create_cq(NUM_MSGS).unwrap(),
        e.b.create_cq(NUM_MSGS).unwrap(),
    );
    let (mut qa, mut qb) = match mr_pair(e, (&pds.0, &pds.1), (&cqs.0, &cqs.1)) {
        Ok(p) => p,
        Err(o) => return o,
    };
    let local = AccessFlags::LOCAL_WRITE;
    let mut ma = pds.0.register(MSG_SIZE as usize, local).unwrap();
    let mut mb = pds.1.register(MSG_SIZE as usize, local).unwrap();
    for m in [&mut ma, &mut mb] {
        match m.rereg_access(local | AccessFlags::REMOTE_WRITE) {
            Err(err) if err.kind() == ErrorKind::Unsupported => {
                return Outcome::Skip("rereg MR unsupported");
            }
            r => r.unwrap(),
        }
    }
    for _ in 0..ITERS {
        let (ca, cb) = (&cqs.0, &cqs.1);
        rc_turn(
            e,
            Op::Write,
            MSG_SIZE,
            (&mut qa, ca, &mut ma),
            (&mut qb, cb, &mut mb),
            (b'c', b's'),
        );
        rc_turn(
            e,
            Op::Write,
            MSG_SIZE,
            (&mut qb, cb, &mut mb),
            (&mut qa, ca, &mut ma),
            (b's', b'c'),
        );
    }
    Outcome::Pass
}

/// `test_mr_rereg_access_bad_flow`: WRITEs to a region of remote write pass; re-registered
/// with local write only, a WRITE to it fails with a remote access error.
fn test_mr_rereg_access_bad_flow<P: Provider>(e: &Ends<'_, P>) -> Outcome {
    let pds = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
    let cqs = (
        e.a.create_cq(NUM_MSGS).unwrap(),
        e.b.create_cq(NUM_MSGS).unwrap(),
    );
    let (mut qa, mut qb) = match mr_pair(e, (&pds.0, &pds.1), (&cqs.0, &cqs.1)) {
        Ok(p) => p,
        Err(o) => return o,
    };
    let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mut ma = pds.0.register(MSG_SIZE as usize, remote).unwrap();
    let mut mb = pds.1.register(MSG_SIZE as usize, remote).unwrap();
    let (ca, cb) = (&cqs.0, &cqs.1);
    for _ in 0..ITERS {
        rc_turn(
            e,
            Op::Write,
            MSG_SIZE,
            (&mut qa, ca, &mut ma),
            (&mut qb, cb, &mut mb),
            (b'c', b's'),
        );
        rc_turn(
            e,
            Op::Write,
            MSG_SIZE,
            (&mut qb, cb, &mut mb),
            (&mut qa, ca, &mut ma),
            (b's', b'c'),
        );
    }
    match mb.rereg_access(AccessFlags::LOCAL_WRITE) {
        Err(err) if err.kind() == ErrorKind::Unsupported => {
            return Outcome::Skip("rereg MR unsupported");
        }
        r => r.unwrap(),
    }
    let st = one_status(e, Op::Write, (&mut qa, ca, &ma), &mb);
    assert_eq!(st, WcStatus::RemAccessErr, "Remote access error");
    Outcome::Pass
}

/// `test_mr_rereg_atomic`: regions of remote atomic re-registered without it fail a
/// fetch-and-add with a remote access error; the QPs restated (RESET, then RTS), the
/// regions given atomic access again, `atomic_traffic` passes.
fn test_mr_rereg_atomic<P: Provider>(e: &Ends<'_, P>) -> Outcome {
    let pds = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
    let cqs = (
        e.a.create_cq(NUM_MSGS).unwrap(),
        e.b.create_cq(NUM_MSGS).unwrap(),
    );
    let (mut qa, qb) = match mr_pair(e, (&pds.0, &pds.1), (&cqs.0, &cqs.1)) {
        Ok(p) => p,
        Err(o) => return o,
    };
    let atomic = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
    let mut ma = match pds.0.register(MSG_SIZE as usize, atomic) {
        Ok(m) => m,
        Err(err) if err.kind() == ErrorKind::Unsupported => {
            return Outcome::Skip("atomic MR unsupported");
        }
        Err(err) => panic!("{err}"),
    };
    let mut mb = pds.1.register(MSG_SIZE as usize, atomic).unwrap();
    for m in [&mut ma, &mut mb] {
        match m.rereg_access(AccessFlags::LOCAL_WRITE) {
            Err(err) if err.kind() == ErrorKind::Unsupported => {
                return Outcome::Skip("rereg MR unsupported");
            }
            r => r.unwrap(),
        }
    }
    // SAFETY: nothing is posted: the batch is dropped unfinished.
    let probe = unsafe {
        qa.send_batch()
            .atomic_fetch_add(0, SIG, (mb.addr(), mb.rkey()), 0, &ma.sge(0, 8).unwrap())
    };
    if let Err(err) = probe {
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        return Outcome::Skip("atomics unsupported");
    }
    let st = one_status(e, Op::FetchAdd, (&mut qa, &cqs.0, &ma), &mb);
    assert_eq!(st, WcStatus::RemAccessErr, "Remote access error");
    let (qa, qb) = (qa.reset().unwrap(), qb.reset().unwrap());
    let (mut qa, mut qb) = connect_mr_pair(e, qa, qb);
    for m in [&mut ma, &mut mb] {
        m.rereg_access(atomic).unwrap();
    }
    let (ca, cb) = (&cqs.0, &cqs.1);
    for _ in 0..ITERS {
        rc_turn(
            e,
            Op::FetchAdd,
            8,
            (&mut qa, ca, &mut ma),
            (&mut qb, cb, &mut mb),
            (2, 1),
        );
        rc_turn(
            e,
            Op::FetchAdd,
            8,
            (&mut qb, cb, &mut mb),
            (&mut qa, ca, &mut ma),
            (2, 1),
        );
    }
    Outcome::Pass
}

/// Runs every case on `run`'s device; returns (passed, skipped) after printing each.
fn run_all<P: Provider>(
    dev: &str,
    run: impl Fn(&dyn Fn(&Ends<'_, P>) -> Outcome) -> Outcome,
) -> (usize, usize) {
    type Case<P> = (&'static str, fn(&Ends<'_, P>) -> Outcome);
    let cases: Vec<Case<P>> = vec![
        ("test_qpex::test_qp_ex_ud_send", |e| {
            ud_traffic(e, false, MSG_SIZE)
        }),
        ("test_qpex::test_qp_ex_ud_zero_size", |e| {
            ud_traffic(e, false, 0)
        }),
        ("test_qpex::test_qp_ex_rc_send", |e| {
            rc_traffic(e, Op::Send, MSG_SIZE)
        }),
        ("test_qpex::test_qp_ex_ud_send_imm", |e| {
            ud_traffic(e, true, MSG_SIZE)
        }),
        ("test_qpex::test_qp_ex_rc_send_imm", |e| {
            rc_traffic(e, Op::SendImm, MSG_SIZE)
        }),
        ("test_qpex::test_qp_ex_rc_rdma_write", |e| {
            rc_traffic(e, Op::Write, MSG_SIZE)
        }),
        ("test_qpex::test_qp_ex_rc_rdma_write_imm", |e| {
            rc_traffic(e, Op::WriteImm, MSG_SIZE)
        }),
        ("test_qpex::test_qp_ex_rc_rdma_write_zero_size", |e| {
            rc_traffic(e, Op::Write, 0)
        }),
        ("test_qpex::test_qp_ex_rc_rdma_read", |e| {
            rc_traffic(e, Op::Read, MSG_SIZE)
        }),
        ("test_qpex::test_qp_ex_rc_rdma_read_zero_size", |e| {
            rc_traffic(e, Op::Read, 0)
        }),
        ("test_qpex::test_qp_ex_rc_atomic_cmp_swp", |e| {
            rc_traffic(e, Op::CmpSwp, 8)
        }),
        ("test_qpex::test_qp_ex_rc_atomic_fetch_add", |e| {
            rc_traffic(e, Op::FetchAdd, 8)
        }),
        ("test_qpex::test_full_rq_bad_flow", full_rq_bad_flow),
        (
            "test_qpex::test_rq_with_larger_sgl_bad_flow",
            rq_with_larger_sgl_bad_flow,
        ),
        ("test_srq::test_rc_srq_traffic", test_rc_srq_traffic),
        ("test_srq::test_resize_srq", test_resize_srq),
        ("test_srq::test_modify_srq_limit", test_modify_srq_limit),
        ("test_mr::test_mr_rereg_access", rereg_access),
        ("test_mr::test_mrex_rereg_access", rereg_access),
        (
            "test_mr::test_mr_rereg_access_bad_flow",
            test_mr_rereg_access_bad_flow,
        ),
        ("test_mr::test_mr_rereg_atomic", test_mr_rereg_atomic),
    ];
    let (mut pass, mut skip) = (0, 0);
    for (name, case) in &cases {
        match run(case) {
            Outcome::Pass => pass += 1,
            Outcome::Skip(why) => {
                println!("{dev}: {name}: skipped ({why})");
                skip += 1;
            }
        }
    }
    println!("{dev}: {pass} passed, {skip} skipped, of {}", cases.len());
    assert_eq!(pass + skip, cases.len());
    (pass, skip)
}

#[test]
fn rdma_cores_traffic_cases_on_the_software_roce_device() {
    let (_, skip) = run_all("rxe", |case| on_rxe(|e| case(e)));
    // Every case runs: SRQ resize and the SRQ cases' 2000 WRs included.
    assert_eq!(skip, 0);
}

#[test]
fn rdma_cores_traffic_cases_on_the_pvrdma_model() {
    let (pass, skip) = run_all("pvrdma", |case| {
        on_pvrdma(ModelConfig::default(), |e| case(e))
    });
    // QEMU's PVRDMA has no atomics, no MR re-registration and no SRQ resize (typed
    // Unsupported: rdma-core's skip); every other case passes, both SRQ cases on an SRQ of
    // 2000 WRs behind a CQ of 1000 included (its receives metered).
    assert_eq!((pass, skip), (14, 7));
}
