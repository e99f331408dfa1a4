//! Completion-queue sizing on the software RoCE device, as the verbs have it: a QP is never
//! refused for its CQ's size (`ibv_rc_pingpong` and rdma-core's own fixtures size CQs below
//! their QPs' queues); room is taken when requests are posted and given back as their
//! completions are polled, so a CQ never holds more than it can; a post that would overflow
//! it is refused whole with `QueueFull { Cq }`; a shared receive queue reserves room once per
//! receive CQ, and its completions are never dropped.

mod common;

use bareverbs::Context;
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::error::{Error, Param, Queue};
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};
use common::{drain, rc_to_rts, recvs};

type R = Rxe<Model, MemLink, TestClock>;

const IP: [u8; 4] = [10, 0, 0, 2];
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

struct Lab {
    ctx: Context<R>,
    clk: TestClock,
    _seg: Segment,
}

fn lab() -> Lab {
    let seg = Segment::new();
    let link = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let clk = TestClock::default();
    let rxe = Rxe::new(
        Model::new(ModelConfig::default()),
        link,
        clk.clone(),
        Config { ip: IP },
    );
    Lab {
        ctx: Context::new(rxe.unwrap()),
        clk,
        _seg: seg,
    }
}

fn caps(send: u32, recv: u32) -> QpCaps {
    QpCaps {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Brings `q` to RTS towards `peer` on this device (loopback), waiting for receivers.
fn up<'a>(q: QueuePair<'a, R, Rc, Reset>, peer: u32) -> QueuePair<'a, R, Rc, Rts> {
    let init = ConnectedInit {
        access: ALL,
        ..Default::default()
    };
    let mut rtr = ConnectedRtr::new(peer, 0, AddressVector::new(Gid::from_ipv4(IP), 1));
    rtr.min_rnr_timer = 1;
    let mut rts = ConnectedRts::new(0);
    (rts.timeout, rts.rnr_retry) = (8, 7);
    rc_to_rts(q, &init, &rtr, &rts)
}

#[test]
fn rc_pingpong_sizing_and_rdma_cores_fixtures_create_their_qps() {
    let l = lab();
    let pd = l.ctx.alloc_pd().unwrap();
    // ibv_rc_pingpong: a CQ of rx_depth + 1 = 501 under 1 send and 500 receives.
    let cq = l.ctx.create_cq(501).unwrap();
    let qp = pd.qp_builder(&cq, &cq).caps(caps(1, 500)).build::<Rc>();
    let qp = qp.unwrap();
    assert!(qp.caps().max_recv_wr >= 500 && qp.caps().max_send_wr >= 1);
    // rdma-core's tests: a CQ of 100 under a QP of 512 + 512 requests.
    let small = l.ctx.create_cq(100).unwrap();
    let big = pd
        .qp_builder(&small, &small)
        .caps(caps(512, 512))
        .build::<Rc>();
    assert_eq!(big.map(|q| q.caps().max_send_wr).ok(), Some(512));
}

#[test]
fn a_post_beyond_the_cqs_room_is_refused_whole_and_fits_again_after_a_poll() {
    let l = lab();
    let pd = l.ctx.alloc_pd().unwrap();
    let mr = pd.register(4096, ALL).unwrap();
    let sge = mr.sge(0, 64).unwrap();
    let cq = l.ctx.create_cq(100).unwrap();
    let room = cq.entries();
    assert!(room >= 100);
    let qp = pd.qp_builder(&cq, &cq).caps(caps(512, 512)).build::<Rc>();
    let mut qp = qp.unwrap().init(&ConnectedInit::default()).unwrap();
    recvs(&mut qp, 0, u64::from(room), sge).unwrap();
    let full = Err(Error::QueueFull {
        queue: Queue::Cq,
        free: 0,
    });
    assert_eq!(recvs(&mut qp, 1000, 1, sge), full);
    // A batch that would cross the room leaves nothing behind (dropped unfinished).
    assert_eq!(recvs(&mut qp, 2000, 3, sge), full);
    // Every request posted completes once (flushed): exactly `room`, none of the refused.
    let mut qp = qp.to_error().unwrap();
    let got = drain(&cq);
    assert_eq!(got.len(), room as usize);
    assert!(got.iter().all(|w| w.wr_id < u64::from(room)), "{got:?}");
    assert!(got.iter().all(|w| w.status == WcStatus::WrFlushErr));
    // Polled: the room is back (posted in ERROR, they complete flushed at once).
    recvs(&mut qp, 0, u64::from(room), sge).unwrap();
    assert_eq!(drain(&cq).len(), room as usize);
}

#[test]
fn a_batch_dropped_unfinished_gives_its_room_back_at_the_next_batch() {
    let l = lab();
    let pd = l.ctx.alloc_pd().unwrap();
    let mr = pd.register(4096, ALL).unwrap();
    let sge = mr.sge(0, 64).unwrap();
    let cq = l.ctx.create_cq(16).unwrap();
    let room = u64::from(cq.entries());
    let qp = pd.qp_builder(&cq, &cq).caps(caps(64, 64)).build::<Rc>();
    let mut qp = qp.unwrap().init(&ConnectedInit::default()).unwrap();
    {
        let mut b = qp.recv_batch();
        for i in 0..room {
            // SAFETY: the region outlives the QP.
            unsafe { b.recv(i, &[sge]) }.unwrap();
        }
        // Dropped without `finish`: nothing posted.
    }
    recvs(&mut qp, 100, room, sge).unwrap();
    let qp = qp.to_error().unwrap();
    let ids: Vec<u64> = drain(&cq).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (100..100 + room).collect::<Vec<_>>());
    drop(qp);
}

#[test]
fn no_qp_waits_for_anothers_room_longer_than_one_poll() {
    let l = lab();
    let pd = l.ctx.alloc_pd().unwrap();
    let mr = pd.register(4096, ALL).unwrap();
    let sge = mr.sge(0, 64).unwrap();
    let cq = l.ctx.create_cq(16).unwrap();
    let room = u64::from(cq.entries());
    let init = ConnectedInit::default();
    let a = pd.qp_builder(&cq, &cq).caps(caps(64, 64)).build::<Rc>();
    let b = pd.qp_builder(&cq, &cq).caps(caps(64, 64)).build::<Rc>();
    let mut a = a.unwrap().init(&init).unwrap();
    let mut b = b.unwrap().init(&init).unwrap();
    recvs(&mut a, 0, room, sge).unwrap();
    assert!(matches!(
        recvs(&mut b, 0, 1, sge),
        Err(Error::QueueFull {
            queue: Queue::Cq,
            ..
        })
    ));
    let a = a.to_error().unwrap();
    let mut wc = vec![WorkCompletion::default(); room as usize];
    assert_eq!(cq.poll(&mut wc).unwrap(), room as usize);
    // One poll later, B has the whole CQ.
    recvs(&mut b, 0, room, sge).unwrap();
    drop((a, b));
}

#[test]
fn unsignaled_requests_give_their_room_back_when_they_retire() {
    let l = lab();
    let pd = l.ctx.alloc_pd().unwrap();
    let mr = pd.register(4096, ALL).unwrap();
    let sge = mr.sge(0, 64).unwrap();
    let cq = l.ctx.create_cq(4).unwrap();
    let room = u64::from(cq.entries());
    let other = l.ctx.create_cq(4).unwrap();
    let x = pd
        .qp_builder(&cq, &cq)
        .caps(caps(64, 1))
        .build::<Rc>()
        .unwrap();
    let y = pd
        .qp_builder(&other, &other)
        .caps(caps(1, 1))
        .build::<Rc>()
        .unwrap();
    let (nx, ny) = (x.qp_num(), y.qp_num());
    let (mut x, _y) = (up(x, ny), up(y, nx));
    // Many more unsignaled WRITEs than the CQ holds, none polled: each gives back its
    // room when acknowledged.
    let mut posted = 0;
    for _ in 0..10_000 {
        if posted == 40 * room {
            break;
        }
        let mut b = x.send_batch();
        // SAFETY: the region outlives the QPs.
        match unsafe {
            b.rdma_write(
                posted,
                SendFlags::empty(),
                (mr.addr() + 2048, mr.rkey()),
                &[sge],
            )
        } {
            Ok(()) => {
                b.finish();
                posted += 1;
            }
            Err(Error::QueueFull {
                queue: Queue::Cq, ..
            }) => drop(b),
            Err(e) => panic!("{e}"),
        }
        l.clk.advance(10);
        l.ctx.process_events();
    }
    assert_eq!(posted, 40 * room);
    assert!(drain(&cq).is_empty(), "unsignaled: no completion");
}

#[test]
fn an_srq_reserves_its_depth_once_per_cq_and_never_drops_a_completion() {
    let l = lab();
    let pd = l.ctx.alloc_pd().unwrap();
    let mr = pd.register(8192, ALL).unwrap();
    let cq = l.ctx.create_cq(16).unwrap();
    let room = cq.entries();
    let scq = l.ctx.create_cq(256).unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: room,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    // Two QPs on one SRQ and one small CQ: the SRQ's depth is reserved once, both created.
    let mk = || {
        pd.qp_builder(&scq, &cq)
            .srq(&srq)
            .caps(caps(1, 0))
            .build::<Rc>()
            .unwrap()
    };
    let (r1, r2) = (mk(), mk());
    let s1 = pd
        .qp_builder(&scq, &scq)
        .caps(caps(16, 1))
        .build::<Rc>()
        .unwrap();
    let s2 = pd
        .qp_builder(&scq, &scq)
        .caps(caps(16, 1))
        .build::<Rc>()
        .unwrap();
    let (n1, n2, m1, m2) = (r1.qp_num(), r2.qp_num(), s1.qp_num(), s2.qp_num());
    let (r1, r2) = (up(r1, m1), up(r2, m2));
    let (mut s1, mut s2) = (up(s1, n1), up(s2, n2));
    let srq_recvs = |first: u64| {
        let sges: Vec<Sge> = (0..room).map(|i| mr.sge(i * 64, 64).unwrap()).collect();
        let wrs: Vec<RecvWr<'_>> = (0..room as usize)
            .map(|i| RecvWr {
                wr_id: first + i as u64,
                sg_list: std::slice::from_ref(&sges[i]),
            })
            .collect();
        // SAFETY: the region outlives the SRQ.
        unsafe { srq.post_recv_raw(&wrs) }.unwrap();
    };
    let sge = mr.sge(4096, 16).unwrap();
    let mut send = |n: u64| {
        for i in 0..n {
            let q = if i % 2 == 0 { &mut s1 } else { &mut s2 };
            let mut b = q.send_batch();
            // SAFETY: the region outlives the QPs.
            unsafe { b.send(i, SendFlags::SIGNALED, &[sge]) }.unwrap();
            b.finish();
        }
    };
    // The CQ's room fills with the SRQ's completions; the SRQ is filled again (unpolled) and
    // as many more SENDs arrive: they wait (receiver not ready), none is dropped.
    srq_recvs(0);
    send(u64::from(room));
    for _ in 0..200 {
        l.clk.advance(100);
        l.ctx.process_events();
    }
    srq_recvs(1000);
    let n = u64::from(room);
    let mut i = 0;
    while i < n {
        let q = if i % 2 == 0 { &mut s1 } else { &mut s2 };
        let mut b = q.send_batch();
        // SAFETY: as above.
        unsafe { b.send(100 + i, SendFlags::SIGNALED, &[sge]) }.unwrap();
        b.finish();
        i += 1;
    }
    for _ in 0..200 {
        l.clk.advance(100);
        l.ctx.process_events();
    }
    let mut got = drain(&cq);
    for _ in 0..20_000 {
        if got.len() >= 2 * room as usize {
            break;
        }
        l.clk.advance(1000);
        l.ctx.process_events();
        got.extend(drain(&cq));
    }
    let mut ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
    ids.sort();
    let want: Vec<u64> = (0..n).chain(1000..1000 + n).collect();
    assert_eq!(ids, want, "every SRQ receive completes once");
    assert!(got.iter().all(|w| w.status == WcStatus::Success));
    // The last QP of the pair gives the reservation back: a QP of its own fills the CQ.
    drop((r1, r2, s1, s2));
    let own = pd
        .qp_builder(&cq, &cq)
        .caps(caps(1, 64))
        .build::<Rc>()
        .unwrap();
    let mut own = own.init(&ConnectedInit::default()).unwrap();
    recvs(&mut own, 0, u64::from(room), mr.sge(0, 8).unwrap()).unwrap();
}

#[test]
fn an_srq_resized_keeps_its_receives_in_order_and_never_drops_a_completion() {
    let l = lab();
    let pd = l.ctx.alloc_pd().unwrap();
    let mr = pd.register(8192, ALL).unwrap();
    let cq = l.ctx.create_cq(16).unwrap();
    let room = cq.entries();
    let scq = l.ctx.create_cq(256).unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let r = pd
        .qp_builder(&scq, &cq)
        .srq(&srq)
        .caps(caps(1, 0))
        .build::<Rc>()
        .unwrap();
    let s = pd
        .qp_builder(&scq, &scq)
        .caps(caps(128, 1))
        .build::<Rc>()
        .unwrap();
    let (rn, sn) = (r.qp_num(), s.qp_num());
    let (_r, mut s) = (up(r, sn), up(s, rn));
    let post = |ids: std::ops::Range<u64>| {
        let sges: Vec<Sge> = ids
            .clone()
            .map(|i| mr.sge((i % 64) as u32 * 64, 64).unwrap())
            .collect();
        let wrs: Vec<RecvWr<'_>> = ids
            .zip(&sges)
            .map(|(wr_id, g)| RecvWr {
                wr_id,
                sg_list: std::slice::from_ref(g),
            })
            .collect();
        // SAFETY: the region outlives the SRQ.
        unsafe { srq.post_recv_raw(&wrs) }
    };
    let sge = mr.sge(4096, 16).unwrap();
    // Sends `n` messages and polls the receive CQ until `n` receives have completed.
    let mut exchange = |n: u64| {
        for i in 0..n {
            let mut b = s.send_batch();
            // SAFETY: the region outlives the QPs.
            unsafe { b.send(i, SendFlags::SIGNALED, &[sge]) }.unwrap();
            b.finish();
        }
        let mut got = Vec::new();
        for _ in 0..20_000 {
            l.clk.advance(1000);
            l.ctx.process_events();
            got.extend(drain(&cq));
            drain(&scq);
            if got.len() as u64 >= n {
                break;
            }
        }
        assert!(got.iter().all(|w| w.status == WcStatus::Success));
        got.iter().map(|w| w.wr_id).collect::<Vec<u64>>()
    };
    // Four posted, two taken: the ring's positions have moved on; two more wrap it.
    post(0..4).unwrap();
    assert_eq!(exchange(2), [0, 1]);
    post(4..6).unwrap();
    assert_eq!(
        post(6..7),
        Err(Error::QueueFull {
            queue: Queue::Srq,
            free: 0
        })
    );
    // Below the four outstanding: refused, nothing changed.
    assert_eq!(
        srq.resize(3),
        Err(Error::InvalidInput {
            param: Param::SrqWrInUse,
            value: 4,
            max: 3
        })
    );
    assert_eq!(srq.attr().max_wr, 4);
    // Beyond the CQ's room: the SRQ grows, its receives kept in order; those posted after the
    // resize complete too, and none is dropped though the CQ holds fewer than the SRQ.
    let n = 2 * room;
    assert_eq!(srq.resize(n), Ok(n));
    assert_eq!((srq.attr().max_wr, srq.query().unwrap().max_wr), (n, n));
    post(6..u64::from(n) + 2).unwrap();
    assert!(post(1000..1001).is_err(), "full at its new size");
    let ids = exchange(u64::from(n));
    assert_eq!(
        ids,
        (2..u64::from(n) + 2).collect::<Vec<_>>(),
        "in order, each once"
    );
    // Empty again: it shrinks back.
    assert_eq!(srq.resize(4), Ok(4));
    post(0..4).unwrap();
    assert_eq!(exchange(4), [0, 1, 2, 3]);
}

#[test]
fn an_srq_deeper_than_its_cqs_room_leaves_the_cqs_other_queues_their_room() {
    // rdma-core's SRQ fixture: a CQ of 10 for both queues of QPs on an SRQ of 2000. The SRQ
    // is not reserved (it does not fit), so the sends keep the CQ's room, and the SRQ's
    // receives take room one at a time as they complete.
    let l = lab();
    let pd = l.ctx.alloc_pd().unwrap();
    let mr = pd.register(4096, ALL).unwrap();
    let cq = l.ctx.create_cq(10).unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 2000,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let a = pd
        .qp_builder(&cq, &cq)
        .srq(&srq)
        .caps(caps(4, 0))
        .build::<Rc>()
        .unwrap();
    let b = pd
        .qp_builder(&cq, &cq)
        .srq(&srq)
        .caps(caps(4, 0))
        .build::<Rc>()
        .unwrap();
    let (na, nb) = (a.qp_num(), b.qp_num());
    let (mut a, _b) = (up(a, nb), up(b, na));
    let sge = mr.sge(0, 64).unwrap();
    let wrs: Vec<RecvWr<'_>> = (0..20u64)
        .map(|i| RecvWr {
            wr_id: 100 + i,
            sg_list: core::slice::from_ref(&sge),
        })
        .collect();
    // SAFETY: the region outlives the QPs of the test.
    unsafe { srq.post_recv_raw(&wrs) }.unwrap();
    for round in 0..3u64 {
        let mut s = a.send_batch();
        // SAFETY: as above.
        unsafe { s.send(round, SendFlags::SIGNALED, &[sge]) }
            .unwrap_or_else(|e| panic!("round {round}: the send found no room: {e}"));
        s.finish();
        let mut got = Vec::new();
        for _ in 0..1000 {
            l.clk.advance(100);
            got.extend(drain(&cq));
            if got.len() == 2 {
                break;
            }
        }
        assert_eq!(
            got.len(),
            2,
            "the SEND's and its receive's completions: {got:?}"
        );
        assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
        assert!(
            got.iter()
                .any(|w| w.wr_id == round && w.opcode == WcOpcode::Send)
        );
        assert!(
            got.iter()
                .any(|w| w.wr_id == 100 + round && w.opcode == WcOpcode::Recv)
        );
    }
}
