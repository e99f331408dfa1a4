//! The rest of the verbs surface (issue 11): every attribute `query_qp` reports, the GID query
//! and table listing, SRQ modify and query with the SRQ-limit event, CQ resize, and posting to
//! a queue pair in the error state — on the model, as VMware's device would answer and as
//! QEMU's does.

mod common;

use bareverbs::verbs::*;
use bareverbs_model::ModelConfig;
use common::*;

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
        .map_err(|(_, e)| e)
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
    let qp = qp.rtr(&rtr).map_err(|(_, e)| e).unwrap();
    let rts = ConnectedRts {
        timeout: 18,
        retry_cnt: 5,
        rnr_retry: 3,
        max_rd_atomic: 2,
        ..ConnectedRts::new(0x999)
    };
    let qp = qp.rts(&rts).map_err(|(_, e)| e).unwrap();
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

    let qp = qp.to_error().map_err(|(_, e)| e).unwrap();
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
    let ud = ud.ready(0x1111_2222, 0x55).map_err(|(_, e)| e).unwrap();
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
    let gsi = gsi
        .init(&DatagramInit::new(0x8001_0000))
        .map_err(|(_, e)| e)
        .unwrap();
    let a = gsi.query().unwrap();
    assert_eq!((a.state, a.cur_state), (QpState::Init, QpState::Init));
    assert_eq!((a.qkey, a.qp_type), (0x8001_0000, QpType::Gsi));
    drop(gsi);
    drop(ud);
    drop((cq, pd, _g));
    teardown(&model, ctx);
}
