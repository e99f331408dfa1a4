//! The rest of the verbs surface: every attribute `query_qp` reports, the GID query
//! and table listing, SRQ modify and query with the SRQ-limit event, CQ resize, and posting to
//! a queue pair in the error state — on the model, as VMware's device would answer and as
//! QEMU's does.

mod common;

use bareverbs::Error;
use bareverbs::error::{Feature, Param, Unsupported};
use bareverbs::verbs::*;
use bareverbs_model::{Model, ModelConfig, Semantics};
use common::*;

fn qemu_model() -> Model {
    Model::new(ModelConfig {
        semantics: Semantics::Qemu,
        ..ModelConfig::default()
    })
}

fn unsupported(f: Feature) -> Error {
    Error::Unsupported(Unsupported::Feature(f))
}

const RW: AccessFlags = AccessFlags::LOCAL_WRITE;

fn gid0() -> Gid {
    Gid::link_local_from_mac(ModelConfig::default().mac)
}

// ---------------------------------------------------------------------------------------------
// query_qp

#[test]
fn query_qp_reports_the_device_values_and_the_attributes_last_set() {
    let model = model();
    let ctx = up(&model);
    let _g = ctx.bind_gid(0, gid0()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd
        .qp_builder(&cq, &cq)
        .sq_sig_all(true)
        .build::<Rc>()
        .unwrap();
    let a = qp.query().unwrap();
    assert_eq!((a.state, a.cur_state), (QpState::Reset, QpState::Reset));
    assert_eq!(
        (a.qp_type, a.has_srq, a.sq_sig_all),
        (QpType::Rc, false, true)
    );
    assert_eq!(a.caps, qp.caps());
    assert_eq!(a.av, None);

    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let qp = qp
        .init(&ConnectedInit {
            access,
            ..Default::default()
        })
        .unwrap();
    let peer = Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
    let av = AddressVector {
        traffic_class: 3,
        flow_label: 0x1234,
        sl: 2,
        hop_limit: 9,
        ..AddressVector::new(peer, 0)
    };
    let rtr = ConnectedRtr {
        path_mtu: Mtu::Mtu4096,
        min_rnr_timer: 17,
        max_dest_rd_atomic: 4,
        ..ConnectedRtr::new(0x123, 0x777, av)
    };
    let qp = qp.rtr(&rtr).unwrap();
    let rts = ConnectedRts {
        timeout: 18,
        retry_cnt: 5,
        rnr_retry: 3,
        max_rd_atomic: 2,
        ..ConnectedRts::new(0x999)
    };
    let qp = qp.rts(&rts).unwrap();
    let a = qp.query().unwrap();
    assert_eq!((a.state, a.cur_state), (QpState::Rts, QpState::Rts));
    // From the device (QEMU's host QP): PSNs and peer, MTU forced to 1024, access flags 0.
    assert_eq!((a.rq_psn, a.sq_psn, a.dest_qpn), (0x777, 0x999, 0x123));
    assert_eq!(a.path_mtu, Mtu::Mtu1024, "the device's path MTU");
    assert_eq!(
        a.access,
        AccessFlags::empty(),
        "QEMU gives RC host QPs no access"
    );
    // From the driver's record: what QEMU answers in another layout.
    assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (18, 5, 3));
    assert_eq!((a.min_rnr_timer, a.pkey_index, a.port), (17, 0, 1));
    assert_eq!(a.av, Some(av));
    // The model advertises no rd_atomic limit: 1 as QEMU gives every RC host QP.
    assert_eq!((a.max_rd_atomic, a.max_dest_rd_atomic), (1, 1));
    assert!(!a.sq_draining);
    assert_eq!(a.qp_num, qp.qp_num());

    let qp = qp.to_error().unwrap();
    let a = qp.query().unwrap();
    assert_eq!((a.state, a.cur_state), (QpState::Err, QpState::Err));
    assert_eq!(a.av, Some(av), "the record survives the state change");
    drop(qp);
    drop((cq, pd, _g));
    teardown(&model, ctx);
}

#[test]
fn query_qp_of_ud_and_gsi_takes_what_qemu_does_not_report_from_the_record() {
    let model = model();
    let ctx = up(&model);
    let _g = ctx.bind_gid(0, gid0()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let ud = pd.qp_builder(&cq, &cq).build::<Ud>().unwrap();
    let ud = ud.ready(0x1111_2222, 0x55).unwrap();
    let a = ud.query().unwrap();
    assert_eq!(
        (a.state, a.qkey, a.sq_psn),
        (QpState::Rts, 0x1111_2222, 0x55)
    );
    assert_eq!((a.qp_type, a.av, a.port), (QpType::Ud, None, 1));
    assert_eq!(
        a.path_mtu,
        Mtu::Mtu1024,
        "no MTU from the device: the record's"
    );

    // QP1: QEMU answers only its state (RTS, whatever was asked).
    let gsi = pd.qp_builder(&cq, &cq).build::<Gsi>().unwrap();
    let gsi = gsi.init(&DatagramInit::new(0x8001_0000)).unwrap();
    let a = gsi.query().unwrap();
    assert_eq!((a.state, a.cur_state), (QpState::Init, QpState::Init));
    assert_eq!((a.qkey, a.qp_type), (0x8001_0000, QpType::Gsi));
    drop(gsi);
    drop(ud);
    drop((cq, pd, _g));
    teardown(&model, ctx);
}

// ---------------------------------------------------------------------------------------------
// GID query and listing

#[test]
fn query_gid_answers_what_was_bound_zero_where_nothing_is_and_refuses_out_of_range() {
    let model = model();
    let ctx = up(&model);
    let len = ctx.query_port(1).unwrap().gid_tbl_len.min(255);
    assert_eq!(ctx.query_gid(1, 0).unwrap(), Gid([0; 16]));
    assert_eq!(ctx.gid_table(1).unwrap().count(), 0);
    let a = Gid::from_ipv4([10, 0, 2, 15]);
    let b = Gid::from_ipv4([10, 0, 2, 16]);
    let ga = ctx.bind_gid(0, gid0()).unwrap();
    let gb = ctx.bind_gid(7, a).unwrap();
    let gc = ctx.bind_gid(len - 1, b).unwrap();
    assert_eq!(
        model.outstanding_pages(),
        DEVICE_PAGES,
        "no allocation: bring-up's page"
    );
    assert_eq!(ctx.query_gid(1, 0).unwrap(), gid0());
    assert_eq!(ctx.query_gid(1, 7).unwrap(), a);
    assert_eq!(ctx.query_gid(1, len - 1).unwrap(), b);
    assert_eq!(
        ctx.query_gid(1, 1).unwrap(),
        Gid([0; 16]),
        "unbound, in range"
    );
    let commands = model.commands();
    let e = ctx.query_gid(1, len).unwrap_err();
    assert_eq!(
        e,
        Error::InvalidInput {
            param: Param::GidIndex,
            value: u64::from(len),
            max: u64::from(len - 1)
        }
    );
    let e = ctx.query_gid(2, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidInput {
                param: Param::Port,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(matches!(
        ctx.query_gid(0, 0),
        Err(Error::InvalidInput {
            param: Param::Port,
            ..
        })
    ));
    assert!(ctx.gid_table(2).is_err());
    assert_eq!(
        model.commands(),
        commands,
        "PVRDMA has no query command: none sent"
    );

    let all: Vec<_> = ctx.gid_table(1).unwrap().collect();
    assert_eq!(all, [(0, gid0()), (7, a), (len - 1, b)]);
    let mut two = [(0, Gid([0; 16])); 2];
    // Too short for the 3 bound: an error naming the length needed (what fits is written).
    assert_eq!(
        ctx.bound_gids(1, &mut two),
        Err(Error::InvalidInput {
            param: Param::GidTableBuffer,
            value: 2,
            max: 3
        })
    );
    assert_eq!(two, [(0, gid0()), (7, a)]);
    let mut many = [(0, Gid([0; 16])); 8];
    assert_eq!(ctx.bound_gids(1, &mut many).unwrap(), 3);

    gb.unbind().unwrap();
    assert_eq!(ctx.query_gid(1, 7).unwrap(), Gid([0; 16]));
    let all: Vec<_> = ctx.gid_table(1).unwrap().map(|(i, _)| i).collect();
    assert_eq!(all, [0, len - 1]);
    // A bind the device refuses is not remembered.
    model.fail_command(1, 22);
    assert!(ctx.bind_gid(9, a).is_err());
    assert_eq!(ctx.query_gid(1, 9).unwrap(), Gid([0; 16]));
    drop((ga, gc));
    assert_eq!(ctx.gid_table(1).unwrap().next(), None);
    teardown(&model, ctx);
}

// ---------------------------------------------------------------------------------------------
// SRQ modify and query, the SRQ limit

fn caps(wr: u32) -> QpCaps {
    QpCaps {
        max_send_wr: wr,
        max_recv_wr: wr,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

fn srq_attr(max_wr: u32) -> SrqAttr {
    SrqAttr {
        max_wr,
        max_sge: 1,
        srq_limit: 0,
    }
}

#[test]
fn srq_limit_arms_raises_srq_limit_reached_once_and_disarms() {
    let model = model();
    let ctx = up(&model);
    let _g = ctx.bind_gid(0, gid0()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let srq = pd.create_srq(srq_attr(16)).unwrap();
    assert_eq!(srq.query().unwrap(), srq.attr());
    assert_eq!(
        srq.modify(17).unwrap_err(),
        Error::InvalidInput {
            param: Param::SrqLimit,
            value: 17,
            max: 16
        }
    );
    srq.modify(3).unwrap();
    assert_eq!(srq.query().unwrap().srq_limit, 3, "the device's answer");
    let a = pd.qp_builder(&cq, &cq).caps(caps(8)).build::<Rc>().unwrap();
    let b = pd
        .qp_builder(&cq, &cq)
        .caps(caps(8))
        .srq(&srq)
        .build::<Rc>()
        .unwrap();
    let (an, bn) = (a.qp_num(), b.qp_num());
    let mut a = rc_up(a, bn, gid0(), RW);
    let b = rc_up(b, an, gid0(), RW);
    let mr = pd.register(4096, RW).unwrap();
    let sges: Vec<_> = (0..5).map(|i| mr.sge(i * 64, 64).unwrap()).collect();
    let wrs: Vec<_> = (0..5)
        .map(|i| RecvWr {
            wr_id: 10 + i as u64,
            sg_list: &sges[i..=i],
        })
        .collect();
    // SAFETY: the region outlives the completions, polled below.
    unsafe { srq.post_recv_raw(&wrs).unwrap() };
    let events = model.async_events();
    let send = |a: &mut QueuePair<'_, P, Rc, Rts>, id| {
        // SAFETY: as above.
        unsafe {
            let mut s = a.send_batch();
            s.send(id, SendFlags::SIGNALED, &sges[..1]).unwrap();
            s.finish();
        }
    };
    // 5 posted, limit 3: the second receive taken leaves 3 (not below), the third leaves 2.
    send(&mut a, 1);
    send(&mut a, 2);
    assert_eq!(model.async_events(), events, "not below the limit yet");
    send(&mut a, 3);
    assert_eq!(model.async_events(), events + 1);
    assert_eq!(
        model.last_async_event(),
        Some((15, srq.raw().handle())),
        "SRQ_LIMIT_REACHED, info = the SRQ"
    );
    assert_eq!(
        ctx.get_async_event(),
        Some(AsyncEvent::SrqLimitReached(srq.raw().handle())),
        "the driver reads it, typed"
    );
    assert_eq!(ctx.get_async_event(), None);
    assert_eq!(srq.query().unwrap().srq_limit, 0, "disarmed");
    send(&mut a, 4);
    assert_eq!(model.async_events(), events + 1, "once");
    let mut wcs = [WorkCompletion::default(); 16];
    let n = cq.poll(&mut wcs).unwrap();
    assert_eq!(n, 8);
    assert!(wcs[..n].iter().all(|w| w.status == WcStatus::Success));
    drop((a, b));
    srq.destroy().unwrap();
    drop(mr);
    drop((cq, pd, _g));
    teardown(&model, ctx);
}

#[test]
fn on_qemu_srq_modify_is_unsupported_and_query_answers_from_the_driver() {
    let model = qemu_model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            srq_limit: 2,
            ..srq_attr(8)
        })
        .unwrap();
    let commands = model.commands();
    // MODIFY_SRQ runs QEMU's query handler, acknowledged as QUERY_SRQ: recognised.
    assert_eq!(srq.modify(4).unwrap_err(), unsupported(Feature::SrqModify));
    assert_eq!(model.commands(), commands + 1);
    // Remembered: neither command is sent again, the query is the driver's.
    assert_eq!(srq.modify(4).unwrap_err(), unsupported(Feature::SrqModify));
    let q = srq.query().unwrap();
    assert_eq!(
        q,
        srq.attr(),
        "size and SGEs as created, the limit given at creation"
    );
    assert_eq!(q.srq_limit, 2);
    assert_eq!(model.commands(), commands + 1);
    assert!(model.violations().is_empty());
    drop(srq);
    // A query first (on a new device): QEMU runs its modify handler (EINVAL, acked as
    // MODIFY_SRQ); the driver answers from what it knows.
    drop(pd);
    teardown(&model, ctx);
    let model = qemu_model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let srq = pd.create_srq(srq_attr(8)).unwrap();
    assert_eq!(srq.query().unwrap(), srq.attr());
    let commands = model.commands();
    assert_eq!(srq.modify(1).unwrap_err(), unsupported(Feature::SrqModify));
    assert_eq!(
        model.commands(),
        commands,
        "known from the query: no command"
    );
    drop(srq);
    drop(pd);
    teardown(&model, ctx);
}

// ---------------------------------------------------------------------------------------------
// CQ resize

#[test]
fn cq_resize_keeps_a_size_it_has_refuses_less_than_in_use_and_qemu_cannot_grow() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let mut cq = ctx.create_cq(64).unwrap();
    let entries = cq.entries();
    let commands = model.commands();
    cq.resize(1).unwrap();
    cq.resize(entries).unwrap();
    assert_eq!(
        (cq.entries(), model.commands()),
        (entries, commands),
        "no command"
    );
    let max = ctx.caps().max_cqe;
    assert!(matches!(
        cq.resize(max + 1).unwrap_err(),
        Error::InvalidInput {
            param: Param::CqEntries,
            ..
        }
    ));
    // A larger size: RESIZE_CQ, which QEMU (and the model) does not implement.
    assert_eq!(
        cq.resize(entries + 1).unwrap_err(),
        unsupported(Feature::ResizeCq)
    );
    assert_eq!(model.commands(), commands + 1);
    assert_eq!(cq.entries(), entries);
    // A QP leaked on the CQ keeps its CQEs reserved for good: fewer is refused.
    let qp = pd
        .qp_builder(&cq, &cq)
        .caps(QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .build::<Ud>()
        .unwrap();
    core::mem::forget(qp);
    let e = cq.resize(8).unwrap_err();
    assert_eq!(
        e,
        Error::InvalidInput {
            param: Param::CqEntriesInUse,
            value: 32,
            max: 8
        }
    );
    cq.resize(32).unwrap();
    assert!(model.violations().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Posting to a QP in ERR

#[test]
fn posting_to_a_qp_in_err_flushes_each_request_once_without_the_device() {
    for semantics in [Semantics::Verbs, Semantics::Qemu] {
        let model = Model::new(ModelConfig {
            semantics,
            ..ModelConfig::default()
        });
        let ctx = up(&model);
        let _g = ctx.bind_gid(0, gid0()).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let pool = pd.buffer_pool(8, 64).unwrap();
        let a = pd
            .qp_builder(&cq, &cq)
            .caps(caps(8))
            .pool(&pool)
            .build::<Rc>()
            .unwrap();
        let an = a.qp_num();
        let a = rc_up(a, an, gid0(), RW);
        let mut a = a.to_error().unwrap();
        let mr = pd.register(4096, RW).unwrap();
        let sge = mr.sge(0, 64).unwrap();
        let (doorbells, _, _) = model.counters();
        let commands = model.commands();
        // Raw sends and receives, a batch of two and one; then the safe path.
        // SAFETY: the region outlives the completions polled below.
        unsafe {
            let mut s = a.send_batch();
            s.send(1, SendFlags::SIGNALED, &[sge]).unwrap();
            s.send(2, SendFlags::empty(), &[sge]).unwrap();
            s.finish();
            a.post_recv_raw(3, &[sge]).unwrap();
        }
        a.post_send(4, pool.alloc().unwrap()).unwrap();
        a.post_recv(5, pool.alloc().unwrap()).unwrap();
        assert_eq!(pool.free_count(), 6);
        let (doorbells_after, _, _) = model.counters();
        assert_eq!(doorbells_after, doorbells, "the device was not rung");
        assert_eq!(model.commands(), commands);
        let view = model.qp(an).unwrap();
        assert_eq!(view.state, 6, "the device has the QP in ERR");
        let mut wcs = [WorkCompletion::default(); 16];
        let n = cq.poll(&mut wcs).unwrap();
        let mut got: Vec<_> = wcs[..n].iter().map(|w| (w.wr_id, w.status)).collect();
        got.sort_by_key(|w| w.0);
        let flushed = |id| (id, WcStatus::WrFlushErr);
        assert_eq!(got, [1, 2, 3, 4, 5].map(flushed), "{semantics:?}");
        assert!(wcs[..n].iter().all(|w| w.qp_num == an));
        assert_eq!(cq.poll(&mut wcs).unwrap(), 0, "once");
        assert_eq!(pool.free_count(), 8, "the safe buffers came back");
        // Again, after the queue drained (the flag was cleared), through the QP's own poll.
        a.post_send(6, pool.alloc().unwrap()).unwrap();
        let c = a.poll_one().unwrap().expect("flushed");
        assert_eq!((c.wc.wr_id, c.wc.status), (6, WcStatus::WrFlushErr));
        assert!(c.buf.is_some(), "the buffer, with its completion");
        drop(c);
        assert!(a.poll_one().unwrap().is_none());
        // Reset: the ring starts over, the QP works again from INIT.
        let a = a.reset().unwrap();
        drop(a);
        drop((mr, pool));
        drop((cq, pd, _g));
        teardown(&model, ctx);
    }
}

#[test]
fn a_qp_in_err_posts_no_more_than_its_queue_holds() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd
        .qp_builder(&cq, &cq)
        .caps(QpCaps {
            max_send_wr: 2,
            max_recv_wr: 2,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .build::<Ud>()
        .unwrap();
    let mut qp = qp.to_error().unwrap();
    let mr = pd.register(4096, RW).unwrap();
    let sge = mr.sge(0, 64).unwrap();
    // SAFETY: the region outlives the completions polled below.
    unsafe {
        qp.post_recv_raw(1, &[sge]).unwrap();
        qp.post_recv_raw(2, &[sge]).unwrap();
        assert!(matches!(
            qp.post_recv_raw(3, &[sge]),
            Err(Error::QueueFull { .. })
        ));
    }
    let mut wcs = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut wcs).unwrap(), 2);
    // The credit came back with the flushes.
    // SAFETY: as above.
    unsafe { qp.post_recv_raw(3, &[sge]).unwrap() };
    assert_eq!(cq.poll(&mut wcs).unwrap(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (3, WcStatus::WrFlushErr));
    drop((qp, mr));
    drop((cq, pd));
    teardown(&model, ctx);
}
