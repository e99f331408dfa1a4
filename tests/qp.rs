//! Queue pairs and shared receive queues: the `ibv_create_qp` / `ibv_create_qp_ex` /
//! `ibv_destroy_qp` contract (the man pages `ibv_create_qp(3)` and `ibv_create_qp_ex(3)`, and the
//! cases rdma-core's tests/test_qp.py, test_qpex.py, test_srq.py and test_pd.py check, except
//! posting, which the data-path tests cover), PVRDMA's sizing rules and limits; the failure paths
//! are `qp_failures.rs`'s.

mod common;

use bareverbs::Error;
use bareverbs::device::pvrdma::Pvrdma;
use bareverbs::error::{Attr, DeviceStatus, Feature, Object, Op, Param, Resource, Unsupported};
use bareverbs::verbs::*;
use bareverbs_model::Model;
use common::*;

type P = Pvrdma<Model>;

fn caps(sw: u32, rw: u32, ss: u32, rs: u32) -> QpCaps {
    QpCaps {
        max_send_wr: sw,
        max_recv_wr: rw,
        max_send_sge: ss,
        max_recv_sge: rs,
        max_inline_data: 0,
    }
}

/// Binds the port's GID at index 0 (what a RoCE port has for its MAC).
fn gid(ctx: &Ctx) -> GidBinding<'_, P> {
    let g = Gid::link_local_from_mac(model().config().mac);
    ctx.bind_gid(0, g).unwrap()
}

use bareverbs::verbs::GidBinding;

#[test]
fn case1_rc_and_ud_are_created_in_reset_uc_raw_and_xrc_are_unsupported() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let rc = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let ud = pd.qp_builder(&cq, &cq).build::<Ud>().unwrap();
    for (qpn, ty) in [(rc.qp_num(), 2), (ud.qp_num(), 4)] {
        let m = model.qp(qpn).expect("on the device");
        assert_eq!((m.qp_type, m.state, m.host_state), (ty, 0, 0));
    }
    assert_ne!(rc.qp_num(), ud.qp_num());
    assert_eq!((rc.state(), rc.qp_type()), (QpState::Reset, QpType::Rc));
    assert_eq!(rc.query().unwrap().state, QpState::Reset);
    assert_eq!(ud.query().unwrap().state, QpState::Reset);

    let before = (model.commands(), model.outstanding_pages());
    let e = pd.qp_builder(&cq, &cq).build::<Uc>().err();
    assert_eq!(e, Some(Error::Unsupported(Unsupported::QpType(QpType::Uc))));
    let e = pd.qp_builder(&cq, &cq).build::<RawPacket>().err();
    assert_eq!(
        e,
        Some(Error::Unsupported(Unsupported::QpType(QpType::RawPacket)))
    );
    let xrc = QpInitEx {
        xrcd: Some(1),
        ..Default::default()
    };
    let e = pd.qp_builder(&cq, &cq).ex(xrc).build::<Rc>().err();
    assert_eq!(e, Some(unsupported(Feature::Xrc)));
    assert_eq!(
        (model.commands(), model.outstanding_pages()),
        before,
        "the device never asked"
    );
    drop(rc);
    drop(ud);
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}

#[test]
fn case2_rc_reaches_init_ud_reaches_rts() {
    let model = model();
    let ctx = up(&model);
    let _gid = gid(&ctx);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let rc = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let rc = rc
        .init(&ConnectedInit {
            access,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(rc.state(), QpState::Init);
    assert_eq!(rc.query().unwrap().state, QpState::Init);
    assert_eq!(model.qp(rc.qp_num()).unwrap().host_state, 1);

    let ud = pd.qp_builder(&cq, &cq).build::<Ud>().unwrap();
    let ud = ud.ready(0x1111_1111, 77).unwrap();
    assert_eq!(ud.state(), QpState::Rts);
    let m = model.qp(ud.qp_num()).unwrap();
    assert_eq!(
        (m.state, m.host_state, m.qkey, m.sq_psn),
        (3, 3, 0x1111_1111, 77)
    );
    assert_eq!(m.sgid_index, 0, "the driver supplied its bound GID for RTR");
    drop(rc);
    drop(ud);
    drop(cq);
    drop(pd);
    drop(_gid);
    teardown(&model, ctx);
}

#[test]
fn ud_rtr_without_a_bound_gid_says_so_and_hands_the_qp_back_in_reset() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let ud = pd.qp_builder(&cq, &cq).build::<Ud>().unwrap();
    let (ud, e) = ud.ready(1, 0).err().unwrap();
    assert_eq!(
        e,
        Error::MissingAttribute {
            op: Op::ModifyQp,
            attr: Attr::SourceGid
        }
    );
    assert_eq!(ud.state(), QpState::Reset);
    assert_eq!(
        model.qp(ud.qp_num()).unwrap().state,
        0,
        "reset again on the device"
    );
    drop(ud);
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}

#[test]
fn case3_ex_attributes_are_refused_typed_never_ignored() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let key = [0u8; 40];
    let cases: [(QpInitEx<'_>, Feature); 5] = [
        (
            QpInitEx {
                create_flags: CreateFlags::SCATTER_FCS,
                ..Default::default()
            },
            Feature::CreateFlags,
        ),
        (
            QpInitEx {
                create_flags: CreateFlags::SOURCE_QPN,
                source_qpn: Some(0x42),
                ..Default::default()
            },
            Feature::CreateFlags,
        ),
        (
            QpInitEx {
                source_qpn: Some(0x42),
                ..Default::default()
            },
            Feature::SourceQpn,
        ),
        (
            QpInitEx {
                rx_hash: Some(RxHashConf {
                    function: 1,
                    key: &key,
                    fields_mask: 0x3,
                    ind_table: 0,
                }),
                ..Default::default()
            },
            Feature::Rss,
        ),
        (
            QpInitEx {
                max_tso_header: 64,
                ..Default::default()
            },
            Feature::Tso,
        ),
    ];
    let commands = model.commands();
    for (ex, feature) in cases {
        let e = pd.qp_builder(&cq, &cq).ex(ex).build::<Ud>().err();
        assert_eq!(e, Some(unsupported(feature)), "{ex:?}");
    }
    assert_eq!(model.commands(), commands);
    // sq_sig_all, drawn at random as the rdma-core test does, goes to the device and back.
    let mut seed = 0x9E37_79B9u32;
    for _ in 0..8 {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let sig = seed & 1 == 1;
        let qp = pd
            .qp_builder(&cq, &cq)
            .sq_sig_all(sig)
            .ex(QpInitEx::default())
            .user_context(u64::from(seed))
            .build::<Rc>()
            .unwrap();
        assert_eq!(qp.query().unwrap().sq_sig_all, sig);
        assert_eq!(model.qp(qp.qp_num()).unwrap().sq_sig_all, sig);
        assert_eq!(qp.user_context(), u64::from(seed));
    }
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}

#[test]
fn case4_illegal_caps_fail_before_the_device_is_touched() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    // The largest CQ: the valid 2048-WR create below reserves 2048 + 1 of its entries.
    let cq = ctx.create_cq(4096).unwrap();
    let small = ctx.create_cq(16).unwrap();
    let before = (model.commands(), model.outstanding_pages());
    let try_caps = |c: QpCaps| pd.qp_builder(&cq, &cq).caps(c).build::<Rc>().err();
    // max_qp_wr is 10467, but a 1-SGE send queue (128-byte WQEs) fits 4096 in 128 pages.
    assert_eq!(
        try_caps(caps(u32::MAX, 1, 1, 1)),
        Some(invalid(Param::MaxSendWr, u32::MAX.into(), 4096))
    );
    assert_eq!(
        try_caps(caps(1, u32::MAX, 1, 1)),
        Some(invalid(Param::MaxRecvWr, u32::MAX.into(), 10467))
    );
    assert_eq!(
        try_caps(caps(1, 1, 0xFFFF, 1)),
        Some(invalid(Param::MaxSendSge, 0xFFFF, 4))
    );
    assert_eq!(
        try_caps(caps(1, 1, 1, 0xFFFF)),
        Some(invalid(Param::MaxRecvSge, 0xFFFF, 4))
    );
    assert_eq!(
        try_caps(caps(1, 1, 5, 1)),
        Some(invalid(Param::MaxSendSge, 5, 4))
    );
    // QEMU's 128 data pages per queue: 4 SGEs make 256-byte WQEs, so 2048 send WRs at most.
    assert_eq!(
        try_caps(caps(2049, 1, 4, 1)),
        Some(invalid(Param::MaxSendWr, 2049, 2048))
    );
    assert!(try_caps(caps(2048, 1, 4, 1)).is_none());
    // The completion queues' room is no limit on creation (the verbs never refuse a QP for
    // its CQ's size): a queue whose depth does not fit its CQ takes room as its requests are
    // posted (`tests/pvrdma_sizing.rs`). 17 send WRs round up to 32 slots on a 16-entry CQ.
    let on_small = |c: QpCaps| pd.qp_builder(&small, &small).caps(c).build::<Rc>().err();
    assert_eq!(on_small(caps(17, 1, 1, 1)), None);
    assert_eq!(on_small(caps(1, 16, 1, 1)), None);
    let e = pd
        .qp_builder(&cq, &small)
        .caps(caps(1, 17, 1, 1))
        .build::<Rc>()
        .err();
    assert_eq!(e, None);
    assert!(on_small(caps(8, 8, 1, 1)).is_none());
    // No inline data on PVRDMA: a request for any is refused, not silently dropped.
    assert_eq!(
        try_caps(QpCaps {
            max_inline_data: 1,
            ..caps(1, 1, 1, 1)
        }),
        Some(unsupported(Feature::InlineData))
    );
    assert_eq!(
        model.commands(),
        before.0 + 10,
        "only the five valid creates (and their destroys)"
    );
    assert_eq!(model.outstanding_pages(), before.1);
    drop(small);
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}

/// The exact PVRDMA sizing: (requested wr, sge) → (slots, sge, stride, data pages), the CQ
/// entries each queue reserves, and the driver's memory for the QP.
#[test]
fn pvrdma_rounding_is_exact() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    // One CQ per direction, each the largest: the last row reserves 2048 + 4096 entries.
    let (scq, rcq) = (ctx.create_cq(4096).unwrap(), ctx.create_cq(4096).unwrap());
    let pool = pd.buffer_pool(1, 64).unwrap();
    // send: stride pow2(80 + 16 sge); recv: stride pow2(16 + 16 sge)
    let table = [
        // (swr, ssge, rwr, rsge) => (sslots, sstride, spages, rslots, rstride, rpages)
        ((0, 0, 0, 0), (1, 128, 1, 1, 32, 1)),
        ((1, 1, 1, 1), (1, 128, 1, 1, 32, 1)),
        ((3, 2, 3, 2), (4, 128, 1, 4, 64, 1)),
        ((3, 3, 5, 3), (4, 128, 1, 8, 64, 1)),
        ((100, 4, 100, 4), (128, 256, 8, 128, 128, 4)),
        ((33, 1, 1000, 1), (64, 128, 2, 1024, 32, 8)),
        ((2048, 4, 4096, 4), (2048, 256, 128, 4096, 128, 128)),
    ];
    for ((sw, ss, rw, rs), (sslots, sstride, spages, rslots, rstride, rpages)) in table {
        for safe in [false, true] {
            let base = model.outstanding_pages();
            let b = pd.qp_builder(&scq, &rcq).caps(caps(sw, rw, ss, rs));
            let b = if safe { b.pool(&pool) } else { b };
            let qp = b.build::<Rc>().unwrap();
            let c = qp.caps();
            assert_eq!(
                (c.max_send_wr, c.max_send_sge, c.max_recv_wr, c.max_recv_sge),
                (sslots, ss.max(1), rslots, rs.max(1)),
                "request {:?}",
                (sw, ss, rw, rs)
            );
            assert_eq!(qp.raw().strides(), (sstride, rstride));
            assert_eq!(qp.raw().queue_pages(), (spages, rpages));
            assert_eq!(
                qp.raw().pages() as u32,
                1 + spages + rpages,
                "ring-state page included"
            );
            // Every ring slot is accounted for: each queue reserved a CQE per slot.
            assert_eq!(
                (reserved(&pd, &scq, &rcq), reserved(&pd, &rcq, &scq)),
                (sslots, rslots)
            );
            // The rings, their directory and table, and the control block completions are
            // matched with: one page, plus 16 bytes per ring slot (every QP keeps its
            // requests' wr_ids in private memory), plus with a pool a bit per buffer.
            let shadow = 16 * (sslots + rslots)
                + if safe {
                    pool.count().div_ceil(64) * 8
                } else {
                    0
                };
            assert_eq!(
                model.outstanding_pages() - base,
                qp.raw().pages() + 2 + 1 + shadow as usize / 4096,
                "request {:?}, pool: {safe}",
                (sw, ss, rw, rs)
            );
            let m = model.qp(qp.qp_num()).unwrap();
            assert_eq!(
                m.caps,
                [sslots, rslots, ss.max(1), rs.max(1), 0],
                "what the device was told"
            );
        }
    }
    assert_eq!(reserved(&pd, &scq, &rcq), 0, "given back with each QP");
    drop(pool);
    drop((scq, rcq));
    drop(pd);
    teardown(&model, ctx);
}

#[test]
fn case5_query_after_create_is_reset_with_caps_at_least_the_request() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let req = caps(10, 20, 3, 2);
    let qp = pd.qp_builder(&cq, &cq).caps(req).build::<Rc>().unwrap();
    let a = qp.query().unwrap();
    assert_eq!(a.state, QpState::Reset);
    assert_eq!(a.qp_num, qp.qp_num());
    // QEMU answers the query in the host's layout beyond offset 0x33: the caps must come from
    // what the driver created, not from those bytes.
    assert_eq!(a.caps, qp.caps());
    assert!(a.caps.max_send_wr >= 10 && a.caps.max_recv_wr >= 20);
    assert!(a.caps.max_send_sge >= 3 && a.caps.max_recv_sge >= 2);
    assert_eq!(a.caps.max_inline_data, 0);
    drop(qp);
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}

/// rdma-core's random-caps test: wr ∈ [1, max_qp_wr/8], sge ∈ [1, max_sge/2] always succeed,
/// with actual ≥ requested and PVRDMA's exact rounding.
#[test]
fn case6_random_caps_always_succeed_with_exact_rounding() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let dc = *ctx.caps();
    let (wr_max, sge_max) = (dc.max_qp_wr / 8, dc.max_sge / 2);
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut draw = |lo: u32, hi: u32| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        lo + (s % u64::from(hi - lo + 1)) as u32
    };
    for _ in 0..300 {
        let req = caps(
            draw(1, wr_max),
            draw(1, wr_max),
            draw(1, sge_max),
            draw(1, sge_max),
        );
        let qp = pd
            .qp_builder(&cq, &cq)
            .caps(req)
            .build::<Ud>()
            .unwrap_or_else(|e| panic!("{req:?}: {e}"));
        let c = qp.caps();
        assert_eq!(c.max_send_wr, req.max_send_wr.next_power_of_two());
        assert_eq!(c.max_recv_wr, req.max_recv_wr.next_power_of_two());
        assert_eq!(
            (c.max_send_sge, c.max_recv_sge),
            (req.max_send_sge, req.max_recv_sge)
        );
        let sstride = (80 + 16 * c.max_send_sge).next_power_of_two();
        let rstride = (16 + 16 * c.max_recv_sge).next_power_of_two();
        assert_eq!(qp.raw().strides(), (sstride, rstride));
        assert_eq!(
            qp.raw().queue_pages(),
            (
                (c.max_send_wr * sstride).div_ceil(4096),
                (c.max_recv_wr * rstride).div_ceil(4096)
            )
        );
        qp.destroy().unwrap();
    }
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}

#[test]
fn case7_ud_qkey_and_sq_psn_read_back_and_rts_to_reset_works() {
    let model = model();
    let ctx = up(&model);
    let _g = gid(&ctx);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let ud = pd.qp_builder(&cq, &cq).build::<Ud>().unwrap();
    let ud = ud.init(&DatagramInit::new(0xABCD)).unwrap();
    assert_eq!(ud.query().unwrap().qkey, 0xABCD);
    let ud = ud.rtr(&()).unwrap();
    let ud = ud.rts(&DatagramRts { sq_psn: 0x12_3456 }).unwrap();
    let a = ud.query().unwrap();
    assert_eq!(
        (a.state, a.qkey, a.sq_psn),
        (QpState::Rts, 0xABCD, 0x12_3456)
    );
    let ud = ud.reset().unwrap();
    assert_eq!(ud.state(), QpState::Reset);
    // QEMU only records RESET (its host QP stays in RTS); the query still says RESET.
    let m = model.qp(ud.qp_num()).unwrap();
    assert_eq!((m.state, m.host_state), (0, 3));
    assert_eq!(ud.query().unwrap().state, QpState::Reset);
    // So INIT again would fail on QEMU (EIO): the driver refuses it before the device, and
    // hands the QP back in RESET.
    let commands = model.commands();
    let (ud, e) = ud.init(&DatagramInit::new(0xABCD)).err().unwrap();
    assert_eq!(e, unsupported(Feature::ReinitAfterReset));
    assert_eq!(model.commands(), commands, "the device was not asked");
    assert_eq!(ud.query().unwrap().state, QpState::Reset);
    let ud = ud.to_error().unwrap();
    assert_eq!(ud.query().unwrap().state, QpState::Err);
    drop(ud);
    drop(cq);
    drop(pd);
    drop(_g);
    teardown(&model, ctx);
}

fn connect<'a>(
    qp: QueuePair<'a, P, Rc, Reset>,
    peer: u32,
    psn: u32,
    gid: Gid,
) -> QueuePair<'a, P, Rc, Rts> {
    let av = AddressVector::new(gid, 0);
    rc_to_rts(
        qp,
        &ConnectedInit::default(),
        &ConnectedRtr::new(peer, psn, av),
        &ConnectedRts::new(psn),
    )
}

#[test]
fn rc_pair_connects_over_roce() {
    let model = model();
    let ctx = up(&model);
    let g = gid(&ctx);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let a = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let b = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let (qa, qb) = (a.qp_num(), b.qp_num());
    let connect = |qp, peer, psn| connect(qp, peer, psn, g.gid());
    let a = connect(a, qb, 100);
    let b = connect(b, qa, 200);
    for (qp, peer, psn) in [(&a, qb, 100), (&b, qa, 200)] {
        let m = model.qp(qp.qp_num()).unwrap();
        assert_eq!((m.state, m.host_state), (3, 3));
        assert_eq!((m.dest_qpn, m.rq_psn, m.sq_psn), (peer, psn, psn));
        assert_eq!(m.dgid, g.gid().0);
        let q = qp.query().unwrap();
        assert_eq!((q.state, q.dest_qpn), (QpState::Rts, peer));
    }
    drop(a);
    drop(b);
    drop(cq);
    drop(pd);
    drop(g);
    teardown(&model, ctx);
}

#[test]
fn failed_transitions_hand_the_qp_back_with_the_attribute_named() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let (qp, e) = qp
        .init(&ConnectedInit {
            port: 2,
            ..Default::default()
        })
        .err()
        .unwrap();
    assert_eq!(e, invalid(Param::Port, 2, 1));
    let qp = qp.init(&ConnectedInit::default()).unwrap();
    let dgid = Gid([7; 16]);
    // No GID bound yet: the device could not resolve the source GID, and the error names
    // the path's index.
    let (qp, e) = qp
        .rtr(&ConnectedRtr::new(5, 0, AddressVector::new(dgid, 0)))
        .err()
        .unwrap();
    assert_eq!(
        e,
        Error::MissingAttribute {
            op: Op::ModifyQp,
            attr: Attr::BoundGid { index: 0 }
        }
    );
    assert_eq!(
        e.to_string(),
        "modifying a queue pair needs a GID bound at index 0 of port 1's table (the path's \
         sgid_index); bind one there or name a bound index"
    );
    let (qp, e) = qp
        .rtr(&ConnectedRtr::new(
            0x100_0000,
            0,
            AddressVector::new(dgid, 0),
        ))
        .err()
        .unwrap();
    assert_eq!(e, invalid(Param::QpNumber, 0x100_0000, 0xFF_FFFF));
    // (max_dest_rd_atomic above what QEMU reports is clamped, not refused: tests/contract.rs.)
    let g = ctx.bind_gid(3, Gid::from_ipv4([10, 0, 2, 15])).unwrap();
    let (qp, e) = qp
        .rtr(&ConnectedRtr::new(
            5,
            0x100_0000,
            AddressVector::new(dgid, 3),
        ))
        .err()
        .unwrap();
    assert_eq!(e, invalid(Param::Psn, 0x100_0000, 0xFF_FFFF));
    model.fail_command(1, 5);
    let (qp, e) = qp
        .rtr(&ConnectedRtr::new(5, 0, AddressVector::new(dgid, 3)))
        .err()
        .unwrap();
    assert_eq!(
        e,
        Error::Device {
            op: Op::ModifyQp,
            status: DeviceStatus::Errno(5)
        }
    );
    assert_eq!(qp.state(), QpState::Init, "handed back unchanged");
    let qp = qp
        .rtr(&ConnectedRtr::new(5, 0, AddressVector::new(dgid, 3)))
        .unwrap();
    assert_eq!(model.qp(qp.qp_num()).unwrap().sgid_index, 3);
    drop(qp);
    drop(g);
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}

#[test]
fn case9_two_rc_qps_share_one_srq_and_srq_limits_hold() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    // The SRQ's depth (128) is reserved once on the receive CQ its QPs share, however many
    // they are: three QPs hold 128 + their send queues (8, and the default 16 twice).
    let cq = ctx.create_cq(512).unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 100,
            max_sge: 3,
            srq_limit: 0,
        })
        .unwrap();
    assert_eq!(
        srq.attr(),
        SrqAttr {
            max_wr: 128,
            max_sge: 3,
            srq_limit: 0
        }
    );
    assert_eq!(srq.raw().stride(), 64);
    assert_eq!(
        srq.raw().pages(),
        1 + 2,
        "128 x 64 B = 2 data pages + the ring-state page"
    );
    let a = pd
        .qp_builder(&cq, &cq)
        .srq(&srq)
        .caps(caps(8, 1000, 1, 4)) // receive caps are ignored with an SRQ
        .build::<Rc>()
        .unwrap();
    let b = pd.qp_builder(&cq, &cq).srq(&srq).build::<Rc>().unwrap();
    let u = pd.qp_builder(&cq, &cq).srq(&srq).build::<Ud>().unwrap();
    for qp_caps in [a.caps(), b.caps(), u.caps()] {
        assert_eq!((qp_caps.max_recv_wr, qp_caps.max_recv_sge), (0, 0));
    }
    assert_eq!(a.raw().queue_pages().1, 0, "no receive ring");
    assert_eq!(model.objects().srqs, 1);
    // Receives complete to the receive CQ whichever QP the SRQ hands them to: the SRQ's 128
    // reserved there once for the three, besides their send queues.
    let other = ctx.create_cq(1).unwrap();
    assert_eq!(reserved(&pd, &cq, &other), 128 + 8 + 16 + 16);
    drop(other);
    let e = pd.qp_builder(&cq, &cq).srq(&srq).build::<Gsi>().err();
    assert_eq!(e, Some(unsupported(Feature::SrqOnQpType)));
    // SRQ limits.
    let e = pd.create_srq(SrqAttr {
        max_wr: 12289,
        max_sge: 1,
        srq_limit: 0,
    });
    assert_eq!(e.err(), Some(invalid(Param::SrqMaxWr, 12289, 8192)));
    let e = pd.create_srq(SrqAttr {
        max_wr: 16,
        max_sge: 5,
        srq_limit: 0,
    });
    assert_eq!(e.err(), Some(invalid(Param::SrqMaxSge, 5, 4)));
    // QEMU's 128 pages per SRQ (its ring-state page included) are a limit too (they replace
    // the old compile-time bookkeeping capacity): 4 SGEs make 128-byte WQEs, 127 data pages
    // hold 4064 of them, so 2048 at most (a power of two).
    let e = pd.create_srq(SrqAttr {
        max_wr: 2049,
        max_sge: 4,
        srq_limit: 0,
    });
    assert_eq!(e.err(), Some(invalid(Param::SrqMaxWr, 2049, 2048)));
    assert_eq!(
        pd.create_srq(SrqAttr {
            max_wr: 2048,
            max_sge: 4,
            srq_limit: 0,
        })
        .map(|s| s.attr().max_wr)
        .map_err(|e| e.to_string()),
        Ok(2048)
    );
    let e = pd.create_srq(SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 17,
    });
    assert_eq!(e.err(), Some(invalid(Param::SrqLimit, 17, 16)));
    drop(a);
    drop(b);
    drop(u);
    srq.destroy().unwrap();
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}

#[test]
fn gsi_is_offered_once() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let gsi = pd.qp_builder(&cq, &cq).build::<Gsi>().unwrap();
    assert_eq!(gsi.qp_num(), 1);
    let e = pd.qp_builder(&cq, &cq).build::<Gsi>().err();
    assert_eq!(e, Some(Error::Busy { op: Op::CreateQp }));
    let gsi = gsi.ready(0x8001_0000, 0).unwrap();
    assert_eq!(gsi.query().unwrap().state, QpState::Rts);
    drop(gsi);
    let again = pd.qp_builder(&cq, &cq).build::<Gsi>().unwrap();
    drop(again);
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}

#[test]
fn case10_create_destroy_loops_of_pds_cqs_srqs_and_qps_leave_nothing() {
    let model = model();
    let ctx = up(&model);
    for n in 1..=200usize {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(32).unwrap();
        let srq = pd
            .create_srq(SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let k = 1 + n % 7;
        let qps: Vec<_> = (0..k)
            .map(|i| {
                let b = pd
                    .qp_builder(&cq, &cq)
                    .caps(caps(4, 4, 1 + (i as u32 % 4), 1));
                if i % 2 == 0 {
                    b.build::<Rc>().unwrap().qp_num()
                } else {
                    b.srq(&srq).build::<Rc>().unwrap().qp_num()
                }
            })
            .collect();
        // Each QP above was dropped (destroyed) at the end of its closure call.
        assert_eq!(qps.len(), k);
        assert_eq!(model.objects().qps, 0);
        srq.destroy().unwrap();
        drop(cq);
        drop(pd);
        assert_eq!(model.outstanding_pages(), DEVICE_PAGES, "loop {n}");
    }
    let pd = ctx.alloc_pd().unwrap();
    // 200 live QPs of 1 send + 1 receive slot reserve 400 CQ entries.
    let cq = ctx.create_cq(512).unwrap();
    for n in [1usize, 17, 200] {
        let qps: Vec<_> = (0..n)
            .map(|_| pd.qp_builder(&cq, &cq).build::<Ud>().unwrap())
            .collect();
        assert_eq!(model.objects().qps, n);
        for qp in qps {
            qp.destroy().unwrap();
        }
        assert_eq!(model.objects().qps, 0);
    }
    drop(cq);
    drop(pd);
    teardown(&model, ctx);
}

#[test]
fn the_devices_1024_qps_can_be_created_and_the_next_is_refused_cleanly() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    // 1024 QPs of 1 send + 1 receive slot reserve 2048 CQ entries; a larger CQ, so that the
    // 1025th is refused for the QP count, not for the CQ's room.
    let cq = ctx.create_cq(4096).unwrap();
    let qps: Vec<_> = (0..1024)
        .map(|_| pd.qp_builder(&cq, &cq).build::<Ud>().unwrap())
        .collect();
    assert_eq!(model.objects().qps, 1024);
    let (commands, pages) = (model.commands(), model.outstanding_pages());
    let e = pd.qp_builder(&cq, &cq).build::<Ud>().err();
    assert_eq!(
        e,
        Some(Error::Resource(Resource::Objects {
            object: Object::Qp,
            limit: 1024
        }))
    );
    assert_eq!(
        (model.commands(), model.outstanding_pages()),
        (commands, pages)
    );
    drop(qps);
    assert_eq!(model.objects().qps, 0);
    drop(cq);
    drop(pd);
    teardown(&model, ctx); // no table overflow was ever asked of the device
}
