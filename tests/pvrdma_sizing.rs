//! Completion-queue sizing on PVRDMA, as the verbs have it: a QP is never refused for its
//! CQ's size (`ibv_rc_pingpong` and rdma-core's own fixtures size CQs below their QPs'
//! queues). QEMU drops CQEs silently on a full CQ, so the driver still never lets a CQ get
//! more completions than it holds: a work queue whose depth does not fit its CQ takes room as
//! requests are posted and gives it back as their completions are polled; a post that would
//! overflow the CQ is refused whole with `QueueFull { Cq }`; a shared receive queue reserves
//! its depth once per receive CQ, however many QPs it feeds, and where its depth does not fit
//! a receive CQ, each receive posted to it takes room on every such CQ (it may complete on
//! any of them).

mod common;

use bareverbs::error::{Error, Queue};
use bareverbs::verbs::*;
use bareverbs_model::{Model, ModelConfig};
use common::{P, drain, rc_up, recvs, teardown, up};

const RW: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

fn caps(send: u32, recv: u32) -> QpCaps {
    QpCaps {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// A context with a bound GID on a fresh model: runs `f`, then checks every page came back.
fn lab(f: impl FnOnce(&common::Ctx, Gid)) {
    let cfg = ModelConfig::default();
    let model = Model::new(cfg);
    let ctx = up(&model);
    let g = ctx.bind_gid(0, Gid::link_local_from_mac(cfg.mac)).unwrap();
    f(&ctx, g.gid());
    drop(g);
    teardown(&model, ctx);
}

fn cq_full(e: Result<(), Error>) -> bool {
    matches!(
        e,
        Err(Error::QueueFull {
            queue: Queue::Cq,
            ..
        })
    )
}

#[test]
fn rc_pingpong_sizing_and_rdma_cores_fixture_create_their_qps() {
    lab(|ctx, gid| {
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.register(8192, RW).unwrap();
        // ibv_rc_pingpong: a CQ of rx_depth + 1 = 501 under 1 send and 500 receives, all
        // 500 receives posted at once, then a SEND to itself.
        let cq = ctx.create_cq(501).unwrap();
        let qp = pd.qp_builder(&cq, &cq).caps(caps(1, 500)).build::<Rc>();
        let qp = qp.unwrap();
        let c = qp.caps();
        assert!(c.max_recv_wr >= 500 && c.max_send_wr >= 1, "{c:?}");
        let n = qp.qp_num();
        let mut qp = rc_up(qp, n, gid, RW);
        recvs(&mut qp, 0, 500, mr.sge(0, 64).unwrap()).unwrap();
        let mut b = qp.send_batch();
        // SAFETY: the region outlives the QP.
        unsafe { b.send(7, SendFlags::SIGNALED, &[mr.sge(4096, 16).unwrap()]) }.unwrap();
        b.finish();
        let got = drain(&cq);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.iter().all(|w| w.status == WcStatus::Success));
        // rdma-core's tests: a CQ of 100 under a QP of 512 + 512 requests.
        let small = ctx.create_cq(100).unwrap();
        let big = pd
            .qp_builder(&small, &small)
            .caps(caps(512, 512))
            .build::<Rc>()
            .unwrap();
        assert!(big.caps().max_send_wr >= 512 && big.caps().max_recv_wr >= 512);
        drop((qp, big));
    });
}

#[test]
fn a_post_beyond_the_cqs_room_is_refused_whole_and_fits_again_after_a_poll() {
    lab(|ctx, _| {
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.register(4096, RW).unwrap();
        let sge = mr.sge(0, 64).unwrap();
        let cq = ctx.create_cq(100).unwrap();
        let room = u64::from(cq.entries());
        assert!(room >= 100);
        let qp = pd.qp_builder(&cq, &cq).caps(caps(512, 512)).build::<Rc>();
        let mut qp = qp.unwrap().init(&ConnectedInit::default()).unwrap();
        recvs(&mut qp, 0, room, sge).unwrap();
        assert!(cq_full(recvs(&mut qp, 1000, 1, sge)));
        // A batch that would cross the room posts nothing.
        assert!(cq_full(recvs(&mut qp, 2000, 3, sge)));
        let qp = qp.to_error().unwrap();
        let got = drain(&cq);
        assert_eq!(got.len(), room as usize);
        assert!(got.iter().all(|w| w.wr_id < room), "{got:?}");
        assert!(got.iter().all(|w| w.status == WcStatus::WrFlushErr));
        // The device took those receives (QEMU hands them to its host QP, which only the
        // QP's destruction stops): their room is held until then, and free after.
        drop(qp);
        let qp = pd.qp_builder(&cq, &cq).caps(caps(512, 512)).build::<Rc>();
        let mut qp = qp.unwrap().init(&ConnectedInit::default()).unwrap();
        recvs(&mut qp, 0, room, sge).unwrap();
        drop(qp);
    });
}

#[test]
fn a_batch_dropped_unfinished_leaves_room_for_the_next() {
    lab(|ctx, _| {
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.register(4096, RW).unwrap();
        let sge = mr.sge(0, 64).unwrap();
        let cq = ctx.create_cq(16).unwrap();
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
    });
}

#[test]
fn no_qp_waits_for_anothers_room_longer_than_one_poll() {
    lab(|ctx, gid| {
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.register(4096, RW).unwrap();
        let sge = mr.sge(0, 64).unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let room = u64::from(cq.entries());
        let mk = || pd.qp_builder(&cq, &cq).caps(caps(64, 64)).build::<Rc>();
        let (a, b) = (mk().unwrap(), mk().unwrap());
        let (na, nb) = (a.qp_num(), b.qp_num());
        let (mut a, mut b) = (rc_up(a, nb, gid, RW), rc_up(b, na, gid, RW));
        // A sends B `room` messages: B's receives and A's sends share the CQ's room.
        recvs(&mut b, 0, room / 2, sge).unwrap();
        let mut s = a.send_batch();
        for i in 0..room / 2 {
            // SAFETY: the region outlives the QPs.
            unsafe { s.send(i, SendFlags::SIGNALED, &[sge]) }.unwrap();
        }
        s.finish();
        // The CQ is full of completions: nothing more fits, on either QP.
        assert!(cq_full(recvs(&mut a, 0, 1, sge)));
        assert!(cq_full(recvs(&mut b, 100, 1, sge)));
        // One poll takes them all: the whole room is B's.
        let mut wc = vec![WorkCompletion::default(); room as usize];
        assert_eq!(cq.poll(&mut wc).unwrap(), room as usize);
        assert!(wc.iter().all(|w| w.status == WcStatus::Success));
        recvs(&mut b, 100, room, sge).unwrap();
        assert!(cq_full(recvs(&mut a, 0, 1, sge)));
        drop((a, b));
    });
}

#[test]
fn an_srq_reserves_its_depth_once_per_cq_and_never_drops_a_completion() {
    lab(|ctx, gid| {
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.register(4096, RW).unwrap();
        let cq = ctx.create_cq(4096).unwrap();
        let scq = ctx.create_cq(4096).unwrap();
        let attr = SrqAttr {
            max_wr: 2000,
            max_sge: 1,
            srq_limit: 0,
        };
        let srq = pd.create_srq(attr).unwrap();
        // Many QPs on one SRQ of 2000 (2048 slots) and one CQ of 4096: its depth is
        // reserved once, every QP is created.
        let mk = || {
            pd.qp_builder(&scq, &cq)
                .srq(&srq)
                .caps(caps(16, 0))
                .build::<Rc>()
                .unwrap()
        };
        let rs: Vec<_> = (0..8).map(|_| mk()).collect();
        let ss: Vec<_> = (0..8)
            .map(|_| {
                pd.qp_builder(&scq, &scq)
                    .caps(caps(256, 1))
                    .build::<Rc>()
                    .unwrap()
            })
            .collect();
        let (rn, sn): (Vec<u32>, Vec<u32>) = (
            rs.iter().map(|q| q.qp_num()).collect(),
            ss.iter().map(|q| q.qp_num()).collect(),
        );
        let rs: Vec<_> = rs
            .into_iter()
            .zip(&sn)
            .map(|(q, &p)| rc_up(q, p, gid, RW))
            .collect();
        let mut ss: Vec<_> = ss
            .into_iter()
            .zip(&rn)
            .map(|(q, &p)| rc_up(q, p, gid, RW))
            .collect();
        // A second SRQ of the same depth fits the CQ's other half; a third does not: its QP
        // is made all the same, and the SRQ's receives are metered on the CQ (none fits now).
        let srq2 = pd.create_srq(attr).unwrap();
        let srq3 = pd.create_srq(attr).unwrap();
        let on = |s| {
            pd.qp_builder(&scq, &cq)
                .srq(s)
                .caps(caps(1, 0))
                .build::<Rc>()
        };
        let q2 = on(&srq2).unwrap();
        let q3 = on(&srq3).unwrap();
        let sge3 = mr.sge(0, 64).unwrap();
        let one3 = [RecvWr {
            wr_id: 7,
            sg_list: std::slice::from_ref(&sge3),
        }];
        // SAFETY: the region outlives the SRQ.
        let e = unsafe { srq3.post_recv_raw(&one3) }.unwrap_err();
        assert_eq!(
            e,
            Error::QueueFull {
                queue: Queue::Cq,
                free: 0
            }
        );
        // Every one of the SRQ's 2000 receives completes once, whichever QP takes it.
        let sge = mr.sge(0, 64).unwrap();
        let sges = vec![sge; 2000];
        let wrs: Vec<RecvWr<'_>> = (0..2000)
            .map(|i| RecvWr {
                wr_id: i as u64,
                sg_list: std::slice::from_ref(&sges[i]),
            })
            .collect();
        // SAFETY: the region outlives the SRQ.
        unsafe { srq.post_recv_raw(&wrs) }.unwrap();
        let one = mr.sge(2048, 8).unwrap();
        for round in 0..(2000 / 250) {
            for (k, q) in ss.iter_mut().enumerate() {
                let mut b = q.send_batch();
                for i in 0..250 / 8 + u64::from(k < 250 % 8) {
                    // SAFETY: as above.
                    unsafe { b.send(i, SendFlags::SIGNALED, &[one]) }.unwrap();
                }
                b.finish();
            }
            drain(&scq);
            let _ = round;
        }
        let mut ids: Vec<u64> = drain(&cq)
            .iter()
            .inspect(|w| assert_eq!(w.status, WcStatus::Success, "{w:?}"))
            .map(|w| w.wr_id)
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..2000).collect::<Vec<_>>(), "every SRQ receive once");
        // The pair's last QP gives the reservation back: the third SRQ's receives fit then.
        drop(rs);
        // SAFETY: as above.
        unsafe { srq3.post_recv_raw(&one3) }.unwrap();
        drop((ss, q2, q3));
    });
}

/// Posts receives `ids` to `srq` in one call, each of `sge`.
fn srq_recvs(
    srq: &SharedReceiveQueue<'_, P>,
    ids: std::ops::Range<u64>,
    sge: Sge,
) -> Result<(), Error> {
    let sges = vec![sge; ids.clone().count()];
    let wrs: Vec<RecvWr<'_>> = ids
        .zip(&sges)
        .map(|(wr_id, s)| RecvWr {
            wr_id,
            sg_list: std::slice::from_ref(s),
        })
        .collect();
    // SAFETY: the tests' regions outlive their SRQs.
    unsafe { srq.post_recv_raw(&wrs) }
}

/// `n` SENDs on `q`, signaled, of `one`.
fn sends<S: CanSend>(q: &mut QueuePair<'_, P, Rc, S>, n: u64, one: Sge) {
    let mut b = q.send_batch();
    for i in 0..n {
        // SAFETY: the region outlives the QPs of the test.
        unsafe { b.send(i, SendFlags::SIGNALED, &[one]) }.unwrap();
    }
    b.finish();
}

#[test]
fn an_srq_deeper_than_its_cqs_is_metered_on_each_and_never_drops_a_completion() {
    lab(|ctx, gid| {
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.register(4096, RW).unwrap();
        let (sge, one) = (mr.sge(0, 64).unwrap(), mr.sge(2048, 8).unwrap());
        let scq = ctx.create_cq(1024).unwrap();
        // Two receive CQs, both shallower than the SRQ: neither QP on it is refused.
        let (c1, c2) = (ctx.create_cq(16).unwrap(), ctx.create_cq(32).unwrap());
        let c3 = ctx.create_cq(1).unwrap();
        let srq = pd
            .create_srq(SrqAttr {
                max_wr: 256,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let on = |c| {
            pd.qp_builder(&scq, c)
                .srq(&srq)
                .caps(caps(1, 0))
                .build::<Rc>()
        };
        let (r1, r2) = (on(&c1).unwrap(), on(&c2).unwrap());
        let mk = || {
            pd.qp_builder(&scq, &scq)
                .caps(caps(64, 1))
                .build::<Rc>()
                .unwrap()
        };
        let (s1, s2) = (mk(), mk());
        let (n1, n2, m1, m2) = (r1.qp_num(), r2.qp_num(), s1.qp_num(), s2.qp_num());
        let (_r1, _r2) = (rc_up(r1, m1, gid, RW), rc_up(r2, m2, gid, RW));
        let (mut s1, mut s2) = (rc_up(s1, n1, gid, RW), rc_up(s2, n2, gid, RW));
        // A receive may complete on either CQ: the smaller one's room is the SRQ's.
        let room = u64::from(c1.entries().min(c2.entries()));
        assert!(room < 256, "the SRQ is deeper than its CQs");
        srq_recvs(&srq, 0..room - 1, sge).unwrap();
        // Two more do not fit: refused whole (nothing posted), one does.
        let full = srq_recvs(&srq, 1000..1002, sge);
        assert_eq!(
            full,
            Err(Error::QueueFull {
                queue: Queue::Cq,
                free: 1
            })
        );
        srq_recvs(&srq, room - 1..room, sge).unwrap();
        assert!(cq_full(srq_recvs(&srq, 1000..1001, sge)));
        // Half arrive through each receiver: each CQ holds its half.
        let half = room / 2;
        sends(&mut s1, half, one);
        sends(&mut s2, room - half, one);
        assert_eq!(drain(&scq).len() as u64, room);
        // Still full until a poll: one poll of one CQ gives its receives' room back on both.
        assert!(cq_full(srq_recvs(&srq, 1000..1001, sge)));
        let mut got: Vec<WorkCompletion> = drain(&c1);
        assert_eq!(got.len() as u64, half);
        srq_recvs(&srq, room..room + half, sge).unwrap();
        assert!(cq_full(srq_recvs(&srq, 1000..1001, sge)));
        got.extend(drain(&c2));
        // Those receives complete too, on the smaller CQ, and fill it exactly.
        srq_recvs(&srq, room + half..2 * room, sge).unwrap();
        sends(&mut s1, room, one);
        assert_eq!(drain(&scq).len() as u64, room);
        got.extend(drain(&c1));
        let mut ids: Vec<u64> = got
            .iter()
            .inspect(|w| assert_eq!(w.status, WcStatus::Success, "{w:?}"))
            .map(|w| w.wr_id)
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..2 * room).collect::<Vec<_>>(), "every receive once");
        // A third receive CQ attached while receives are outstanding takes room for them.
        srq_recvs(&srq, 3000..3000 + room, sge).unwrap();
        assert!(u64::from(c3.entries()) < room);
        let e = on(&c3).map(|_| ()).unwrap_err();
        assert!(
            matches!(
                e,
                Error::QueueFull {
                    queue: Queue::Cq,
                    ..
                }
            ),
            "{e:?}"
        );
        drop((s1, s2, _r1, _r2));
    });
}
