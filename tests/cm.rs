//! The connection manager between two software RoCE devices on an in-memory segment: connect
//! through the CM both ways, exchange data, disconnect; rejects; a peer that answers nothing;
//! a lossy segment (REQ, REP, RTU, DREQ lost or duplicated) over which every connection still
//! comes up once.

mod cm_common;

use bareverbs::cm::{
    AcceptParams, CmConfig, CmEvent, ConnectParams, Failure, SIDR_TIMEOUT, Service, msg::UDP_QKEY,
};
use bareverbs::verbs::*;
use bareverbs_model::link::Faults;
use cm_common::*;
use std::pin::Pin;

/// Both sides up through the CM: `from` connects to `to`'s port 7174, `to` accepts; data
/// both ways (SEND from the active side, RDMA WRITE from the passive side) with every byte
/// checked; then `closer` disconnects and both sides see it and leave TIME_WAIT.
fn connect_exchange_disconnect(faults: Faults, active_is_a: bool, closer_is_active: bool) -> u64 {
    let l = lab(faults, (11, 22));
    let (pa, pb, ma, mb, da, db) = sides(&l);
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    let (act, pas, act_pd, pas_pd, act_cq, pas_cq, pas_ip) = if active_is_a {
        (&mut cma, &mut cmb, &pa, &pb, &da, &db, IP_B)
    } else {
        (&mut cmb, &mut cma, &pb, &pa, &db, &da, IP_A)
    };
    pas.listen(None, 7174, Service::Rc).unwrap();
    let qa = rc_qp(act_pd, act_cq);
    let act_qpn = qa.qp_num();
    let act_psn = qa.local_psn();
    let params = ConnectParams {
        private_data: b"hello from the active side",
        ..ConnectParams::default()
    };
    let id = act.connect(qa, pas_ip, 7174, &params).unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    // The passive side sees the request.
    assert!(pump(
        &l.clk,
        act,
        pas,
        &mut ea,
        &mut eb,
        1000,
        100_000,
        |_, b| { !b.is_empty() }
    ));
    let CmEvent::ConnectRequest(req) = eb.remove(0) else {
        panic!("not a request: {eb:?}")
    };
    assert_eq!(req.src_ip, act.ip());
    assert_eq!(req.dst_ip, pas_ip);
    assert_eq!(req.dst_port, 7174);
    assert!((32768..=60999).contains(&req.src_port));
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
    assert_eq!(
        &req.private_data.as_slice()[..26],
        b"hello from the active side"
    );
    assert!(req.private_data.as_slice()[26..].iter().all(|&b| b == 0));
    let qb = rc_qp(pas_pd, pas_cq);
    let pas_psn = qb.local_psn();
    let accept = AcceptParams {
        private_data: b"welcome",
        ..AcceptParams::default()
    };
    let mut qb = pas.accept(req.id, qb, &accept).unwrap();
    let at = qb.query().unwrap();
    assert_eq!(
        at.state,
        QpState::Rts,
        "the passive QP is in RTS before the REP goes"
    );
    assert_eq!(
        (at.dest_qpn, at.sq_psn, at.rq_psn),
        (act_qpn, act_psn, pas_psn)
    );
    assert!(pump(
        &l.clk,
        act,
        pas,
        &mut ea,
        &mut eb,
        1000,
        100_000,
        |a, b| { !a.is_empty() && !b.is_empty() }
    ));
    let CmEvent::Established {
        id: got,
        qp: Some(mut qa),
        private_data,
    } = ea.remove(0)
    else {
        panic!("active: {ea:?}")
    };
    assert_eq!(got, id);
    assert_eq!(&private_data.as_slice()[..7], b"welcome");
    let at = qa.query().unwrap();
    assert_eq!((at.state, at.dest_qpn), (QpState::Rts, qb.qp_num()));
    assert_eq!((at.sq_psn, at.rq_psn), (pas_psn, act_psn));
    assert_eq!((at.max_rd_atomic, at.max_dest_rd_atomic), (1, 1));
    let CmEvent::Established {
        id: pid, qp: None, ..
    } = eb.remove(0)
    else {
        panic!("passive: {eb:?}")
    };
    assert_eq!(pid, req.id);
    assert!(
        ea.is_empty() && eb.is_empty(),
        "one event each: {ea:?} {eb:?}"
    );

    // Data both ways.
    let mut mra = act_pd.register(8192, ALL).unwrap();
    let mut mrb = pas_pd.register(8192, ALL).unwrap();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 13 + 7) as u8).collect();
    mra.as_mut_slice()[..3000].copy_from_slice(&data);
    mrb.as_mut_slice()[4096..7096].copy_from_slice(&data[..]);
    mrb.as_mut_slice()[4096..4100].copy_from_slice(b"back");
    // SAFETY: the regions stay registered and untouched until the completions.
    unsafe {
        let mut r = qb.recv_batch();
        r.recv(1, &[mrb.sge(0, 4096).unwrap()]).unwrap();
        r.finish();
        let mut s = qa.send_batch();
        s.send(2, SendFlags::SIGNALED, &[mra.sge(0, 3000).unwrap()])
            .unwrap();
        s.finish();
        let mut s = qb.send_batch();
        s.rdma_write(
            3,
            SendFlags::SIGNALED,
            (mra.addr() + 4096, mra.rkey()),
            &[mrb.sge(4096, 3000).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    let (wa, wb) = completions(&l, act_cq, pas_cq, 1, 2);
    assert_eq!((wa[0].wr_id, wa[0].status), (2, WcStatus::Success));
    assert!(wb.iter().all(|w| w.status == WcStatus::Success), "{wb:?}");
    let recv = wb.iter().find(|w| w.wr_id == 1).unwrap();
    assert_eq!(recv.byte_len, 3000);
    assert_eq!(&mrb.as_slice()[..3000], &data[..]);
    assert_eq!(&mra.as_slice()[4096..4100], b"back");
    assert_eq!(&mra.as_slice()[4100..7096], &data[4..]);

    // Disconnect.
    let (closer, other, cid, oid) = if closer_is_active {
        (&mut *act, &mut *pas, id, req.id)
    } else {
        (&mut *pas, &mut *act, req.id, id)
    };
    closer.disconnect(cid).unwrap();
    let (mut ec, mut eo) = (Vec::new(), Vec::new());
    assert!(pump(
        &l.clk,
        closer,
        other,
        &mut ec,
        &mut eo,
        3000,
        100_000,
        |c, o| { c.len() >= 2 && o.len() >= 2 }
    ));
    for (evs, me) in [(&ec, cid), (&eo, oid)] {
        assert!(
            matches!(evs[0], CmEvent::Disconnected { id } if id == me),
            "{evs:?}"
        );
        assert!(
            matches!(evs[1], CmEvent::TimeWaitExit { id } if id == me),
            "{evs:?}"
        );
    }
    assert_eq!((closer.in_use(), other.in_use()), (0, 0));
    assert_eq!(ec.len() + eo.len(), 4, "{ec:?} {eo:?}");
    assert_eq!(
        closer.disconnect(cid),
        Err(bareverbs::cm::CmError::UnknownConnection)
    );
    drop((qa, qb));
    closer.counts().resent + other.counts().resent
}

#[test]
fn a_connects_to_b_exchanges_data_and_disconnects() {
    assert_eq!(
        connect_exchange_disconnect(Faults::default(), true, true),
        0
    );
}

#[test]
fn b_connects_to_a_and_the_passive_side_disconnects() {
    assert_eq!(
        connect_exchange_disconnect(Faults::default(), false, false),
        0
    );
}

#[test]
fn a_lossy_segment_still_connects_once_and_disconnects() {
    let mut resent = 0;
    for seed in 1..=6 {
        resent += connect_exchange_disconnect(
            Faults {
                drop: 150,
                duplicate: 150,
                reorder: 100,
                seed,
            },
            seed % 2 == 0,
            seed % 3 != 0,
        );
    }
    assert!(resent > 0, "the losses reached the CM's messages");
}

#[test]
fn a_reject_reaches_the_active_side_with_its_private_data_and_the_qp_comes_back() {
    let l = lab(Faults::default(), (1, 2));
    let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let (ma, mb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
    let da = l.a.create_cq(64).unwrap();
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    cmb.listen(Some(IP_B), 4420, Service::Rc).unwrap();
    let qp = rc_qp(&pa, &da);
    let qpn = qp.qp_num();
    let id = cma
        .connect(qp, IP_B, 4420, &ConnectParams::default())
        .unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        1000,
        1000,
        |_, b| { !b.is_empty() }
    ));
    let CmEvent::ConnectRequest(req) = eb.remove(0) else {
        panic!()
    };
    cmb.reject(req.id, b"go away").unwrap();
    assert_eq!(
        cmb.reject(req.id, b""),
        Err(bareverbs::cm::CmError::UnknownConnection)
    );
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        1000,
        1000,
        |a, _| { !a.is_empty() }
    ));
    let CmEvent::Failed {
        id: got,
        failure,
        private_data,
        qp: Some(qp),
    } = ea.remove(0)
    else {
        panic!("{ea:?}")
    };
    assert_eq!(got, id);
    assert_eq!(failure, Failure::Rejected { reason: 28 });
    assert_eq!(&private_data.as_slice()[..7], b"go away");
    assert_eq!(
        (qp.qp_num(), qp.query().unwrap().state),
        (qpn, QpState::Reset)
    );
    assert_eq!((cma.in_use(), cmb.in_use()), (0, 0));

    // Nobody listens on 4421: REJ "invalid service ID" at once.
    let id = cma
        .connect(qp, IP_B, 4421, &ConnectParams::default())
        .unwrap();
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        1000,
        1000,
        |a, _| { !a.is_empty() }
    ));
    let CmEvent::Failed {
        id: got, failure, ..
    } = ea.remove(0)
    else {
        panic!()
    };
    assert_eq!((got, failure), (id, Failure::Rejected { reason: 8 }));
    assert!(eb.is_empty(), "{eb:?}");
}

#[test]
fn a_peer_that_answers_nothing_times_the_request_out_after_its_retries() {
    let l = lab(Faults::default(), (5, 6));
    let pa = l.a.alloc_pd().unwrap();
    let (ma, da) = (l.a.create_cq(64).unwrap(), l.a.create_cq(64).unwrap());
    let cfg = CmConfig {
        max_retries: 2,
        ..CmConfig::default()
    };
    let mut cma = cm(&pa, &ma, &l.clk, cfg);
    // B's device answers ARP but has no QP1: every REQ is dropped there.
    let qp = rc_qp(&pa, &da);
    let id = connect_to_b(&mut cma, qp);
    // Linux's wait per REQ: 2 × 1.024 s (packet life 18) + 4.096 s (response timeout 20).
    let period = 6_144_000;
    let mut events = Vec::new();
    let mut reqs_at = Vec::new();
    let mut seen = 0;
    for _ in 0..400 {
        l.clk.advance(100_000);
        l.b.process_events();
        while let Some(e) = cma.poll() {
            events.push((l.clk_now(), e));
        }
        let sent = l.seg.sent();
        for (_, f) in &sent[seen..] {
            if is_mad(f, 0x0010) {
                reqs_at.push(l.clk_now());
            }
        }
        seen = sent.len();
    }
    assert_eq!(reqs_at.len(), 3, "the REQ and its two resends");
    assert!(
        // (Observed at 100 ms granularity; the first REQ waited for ARP.)
        reqs_at
            .windows(2)
            .all(|w| w[1] - w[0] + 100_000 >= period && w[1] - w[0] <= period + 100_000),
        "{reqs_at:?}"
    );
    assert_eq!(events.len(), 1, "{events:?}");
    let (
        at,
        CmEvent::Failed {
            id: got,
            failure: Failure::Timeout,
            qp: Some(qp),
            ..
        },
    ) = events.remove(0)
    else {
        panic!()
    };
    assert_eq!(got, id);
    assert!(at >= reqs_at[2] + period && at <= reqs_at[2] + period + 100_000);
    assert_eq!(qp.query().unwrap().state, QpState::Reset);
    assert_eq!(cma.in_use(), 0);
    assert_eq!(cma.counts().resent, 2);
    // A REJ "timeout" told the peer this side gave up.
    assert!(l.seg.sent().iter().any(|(_, f)| is_mad(f, 0x0012)));
}

#[test]
fn sidr_resolves_a_ud_service_and_refuses_an_unknown_port_and_times_out_on_silence() {
    let l = lab(Faults::default(), (7, 8));
    let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let (ma, mb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
    let cfg = CmConfig {
        max_retries: 1,
        ..CmConfig::default()
    };
    let mut cma = cm(&pa, &ma, &l.clk, cfg);
    let mut cmb = cm(&pb, &mb, &l.clk, cfg);
    cmb.listen(None, 7174, Service::Ud).unwrap();
    let id = cma.sidr_resolve(IP_B, 7174, b"udaddy").unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        1000,
        1000,
        |_, b| { !b.is_empty() }
    ));
    let CmEvent::SidrRequest(r) = eb.remove(0) else {
        panic!()
    };
    assert_eq!((r.src_ip, r.dst_port), (IP_A, 7174));
    assert_eq!(&r.private_data.as_slice()[..6], b"udaddy");
    cmb.sidr_reply(r.id, 0x77, UDP_QKEY, b"ok").unwrap();
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        1000,
        1000,
        |a, _| { !a.is_empty() }
    ));
    let CmEvent::SidrResolved {
        id: got,
        result,
        private_data,
    } = ea.remove(0)
    else {
        panic!()
    };
    assert_eq!((got, result), (id, Ok((0x77, UDP_QKEY))));
    assert_eq!(&private_data.as_slice()[..2], b"ok");
    // A port nobody serves.
    let id = cma.sidr_resolve(IP_B, 9, b"").unwrap();
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        1000,
        1000,
        |a, _| { !a.is_empty() }
    ));
    let CmEvent::SidrResolved {
        id: got, result, ..
    } = ea.remove(0)
    else {
        panic!()
    };
    assert_eq!((got, result), (id, Err(1)));
    // Nobody at all: the SIDR_REQ and one resend, then the timeout.
    let id = cma.sidr_resolve([10, 0, 0, 99], 7174, b"").unwrap();
    let mut evs = run_alone(&l.clk, &mut cma, 200, 100_000);
    assert_eq!(evs.len(), 1, "{evs:?}");
    let CmEvent::SidrResolved {
        id: got, result, ..
    } = evs.remove(0)
    else {
        panic!()
    };
    assert_eq!((got, result), (id, Err(SIDR_TIMEOUT)));
    assert_eq!((cma.in_use(), cmb.in_use()), (0, 0));
}

#[test]
fn the_same_seeds_replay_the_same_exchange_byte_for_byte() {
    let run = |seeds| {
        let l = lab(Faults::default(), seeds);
        let (pa, pb, ma, mb, da, db) = sides(&l);
        let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
        let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
        cmb.listen(None, 7174, Service::Rc).unwrap();
        connect_to_b(&mut cma, rc_qp(&pa, &da));
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        let (_, qb) = accept_request(
            &l.clk,
            &mut cma,
            &mut cmb,
            &mut ea,
            &mut eb,
            rc_qp(&pb, &db),
            |a, b| !a.is_empty() && !b.is_empty(),
        );
        drop((ea, eb, qb));
        l.seg
            .sent()
            .into_iter()
            .filter(|(_, f)| is_mad(f, 0x0010) || is_mad(f, 0x0013) || is_mad(f, 0x0014))
            .map(|(_, f)| f)
            .collect::<Vec<_>>()
    };
    let one = run((3, 4));
    assert_eq!(one.len(), 3, "REQ, REP, RTU");
    assert_eq!(one, run((3, 4)));
    assert_ne!(one, run((3, 5)), "another seed, other IDs and PSNs");
}

#[test]
fn a_rebooted_peer_reusing_its_qp_number_is_refused_as_stale_and_the_old_connection_dropped() {
    let l = lab(Faults::default(), (13, 14));
    let (pa, pb, ma, mb, da, db) = sides(&l);
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    cmb.listen(None, 7174, Service::Rc).unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let (old_qpn, old_b_id, qb) = {
        // A's first life: connected to B, then gone without a word (its CM and QP dropped).
        let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
        let qa = rc_qp(&pa, &da);
        let qpn = qa.qp_num();
        connect_to_b(&mut cma, qa);
        let (r, qb) = accept_request(
            &l.clk,
            &mut cma,
            &mut cmb,
            &mut ea,
            &mut eb,
            rc_qp(&pb, &db),
            |a, b| !a.is_empty() && !b.is_empty(),
        );
        ea.clear();
        eb.clear();
        (qpn, r.id, qb)
    };
    // Its second life: the same CA GUID, the same QP number, a new comm ID.
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    let qa = rc_qp(&pa, &da);
    assert_eq!(qa.qp_num(), old_qpn);
    let id = connect_to_b(&mut cma, qa);
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        3000,
        1000,
        |a, b| { !a.is_empty() && b.len() >= 2 }
    ));
    let CmEvent::Failed {
        id: got,
        failure,
        qp: Some(_),
        ..
    } = ea.remove(0)
    else {
        panic!("{ea:?}")
    };
    assert_eq!((got, failure), (id, Failure::Rejected { reason: 10 }));
    // B dropped the old connection: its DREQ went to the new A, which answered for an ID it
    // does not know; B left TIME_WAIT.
    assert!(
        matches!(eb[0], CmEvent::Disconnected { id } if id == old_b_id),
        "{eb:?}"
    );
    assert!(
        matches!(eb[1], CmEvent::TimeWaitExit { id } if id == old_b_id),
        "{eb:?}"
    );
    assert_eq!(cmb.in_use(), 0);
    drop(qb);
}

/// A waker that records that it was woken.
struct Flag(std::sync::atomic::AtomicBool);

impl std::task::Wake for Flag {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn the_next_event_future_is_woken_by_a_request_and_resolves_to_it() {
    use std::future::Future;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::task::{Context as TaskCx, Poll, Waker};

    let l = lab(Faults::default(), (17, 18));
    let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let (ma, mb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
    let da = l.a.create_cq(64).unwrap();
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    cmb.listen(None, 7174, Service::Rc).unwrap();
    assert_eq!(cmb.next_deadline(), None);
    let flag = Arc::new(Flag(false.into()));
    let waker = Waker::from(flag.clone());
    let mut cx = TaskCx::from_waker(&waker);
    {
        let mut fut = cmb.next_event();
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
    }
    connect_to_b(&mut cma, rc_qp(&pa, &da));
    assert!(cma.next_deadline().is_some(), "the REQ's resend is timed");
    // The request reaches B when B's device runs (its interrupt, or its polling loop).
    for _ in 0..100 {
        l.clk.advance(100);
        while cma.poll().is_some() {}
        l.b.process_events();
        if flag.0.load(Ordering::SeqCst) {
            break;
        }
    }
    assert!(flag.0.load(Ordering::SeqCst), "woken by the REQ's arrival");
    let mut fut = cmb.next_event();
    let Poll::Ready(Ok(CmEvent::ConnectRequest(r))) = Pin::new(&mut fut).poll(&mut cx) else {
        panic!("not ready with the request")
    };
    assert_eq!(r.src_ip, IP_A);
}

#[test]
fn the_cm_is_a_fixed_size_value() {
    // No heap: everything the CM keeps is in its table. Printed for the record.
    let size = std::mem::size_of::<TestCm<'static>>();
    println!("Cm with 8 entries: {size} bytes");
    assert!(size < 16 * 1024, "{size}");
}

#[test]
fn a_repeated_rep_gets_the_rtu_again_and_a_repeated_dreq_the_drep_again_with_no_new_event() {
    let l = lab(Faults::default(), (19, 20));
    let (pa, pb, ma, mb, da, db) = sides(&l);
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    cmb.listen(None, 7174, Service::Rc).unwrap();
    let id = connect_to_b(&mut cma, rc_qp(&pa, &da));
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let (_, _qb) = accept_request(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        rc_qp(&pb, &db),
        |a, b| !a.is_empty() && !b.is_empty(),
    );
    let frame_of = |from: usize, attr: u16| {
        l.seg
            .sent()
            .into_iter()
            .find(|(link, f)| *link == from && is_mad(f, attr))
            .map(|(_, f)| f)
            .unwrap()
    };
    let count = |from: usize, attr: u16| {
        l.seg
            .sent()
            .iter()
            .filter(|(link, f)| *link == from && is_mad(f, attr))
            .count()
    };
    // B's REP again (as if B had not seen the RTU): A answers with the RTU, nothing more.
    assert_eq!(count(0, 0x0014), 1);
    l.seg.inject(1, &frame_of(1, 0x0013));
    assert!(!pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        50,
        100,
        |a, b| { a.len() > 1 || b.len() > 1 }
    ));
    assert_eq!(count(0, 0x0014), 2, "the RTU again");
    assert_eq!((ea.len(), eb.len()), (1, 1), "{ea:?} {eb:?}");
    ea.clear();
    eb.clear();
    // A disconnects; the DREQ again while B is in TIME_WAIT: the DREP again, no new event.
    cma.disconnect(id).unwrap();
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        100,
        100,
        |a, b| { !a.is_empty() && !b.is_empty() }
    ));
    assert_eq!(count(1, 0x0016), 1);
    l.seg.inject(0, &frame_of(0, 0x0015));
    pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        5,
        100,
        |_, _| false,
    );
    assert_eq!(count(1, 0x0016), 2, "the DREP again");
    assert_eq!((ea.len(), eb.len()), (1, 1), "{ea:?} {eb:?}");
    assert!(matches!(eb[0], CmEvent::Disconnected { .. }));
}

#[test]
fn an_active_side_that_gives_up_tells_the_passive_side_which_drops_the_request() {
    let l = lab(Faults::default(), (23, 24));
    let (pa, pb, ma, mb, da, db) = sides(&l);
    let once = CmConfig {
        max_retries: 0,
        ..CmConfig::default()
    };
    let mut cma = cm(&pa, &ma, &l.clk, once);
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    cmb.listen(None, 7174, Service::Rc).unwrap();
    let id = connect_to_b(&mut cma, rc_qp(&pa, &da));
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    // B's user never answers; A's REQ times out (6.144 s, no resend).
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        100,
        100_000,
        |a, b| { !a.is_empty() && b.len() >= 2 }
    ));
    assert!(
        matches!(ea[0], CmEvent::Failed { id: got, failure: Failure::Timeout, .. } if got == id),
        "{ea:?}"
    );
    let CmEvent::ConnectRequest(r) = &eb[0] else {
        panic!("{eb:?}")
    };
    assert!(
        matches!(eb[1], CmEvent::Failed { id, failure: Failure::Rejected { reason: 4 }, qp: None, .. } if id == r.id),
        "{eb:?}"
    );
    assert_eq!(cmb.in_use(), 0);
    let late = cmb.accept(r.id, rc_qp(&pb, &db), &AcceptParams::default());
    assert_eq!(
        late.map(|_| ()).map_err(|(_, e)| e),
        Err(bareverbs::cm::CmError::UnknownConnection)
    );
}
