//! The connection manager on PVRDMA's GSI QP: two PVRDMA model machines attached to one
//! rdmacm-mux (two guests of one host, as QEMU relays their MADs) connect RC through the CM
//! (REQ, REP, RTU; DREQ, DREP) and resolve a UD service (SIDR_REQ, SIDR_REP). The model sends
//! a MAD as QEMU does (two SGEs, at most 256 bytes, routed by the mux) and delivers it as QEMU
//! does (a GRH with the sender's GID, the length without the GRH, source QP 0).

mod common;

use bareverbs::Context;
use bareverbs::cm::{AcceptParams, Cm, CmConfig, CmEvent, ConnectParams, Service};
use bareverbs::device::pvrdma::Pvrdma;
use bareverbs::verbs::*;
use bareverbs_model::link::TestClock;
use bareverbs_model::{Model, ModelConfig, Mux};
use common::{caps, up};

type P = Pvrdma<Model>;
type TestCm<'a> = Cm<'a, P, TestClock, 8>;
type Events<'a> = Vec<CmEvent<'a, P>>;

/// A guest with the PVRDMA model attached to `mux`, its GID `::ffff:ip` bound at index 0.
fn guest(mux: &Mux) -> (Model, Context<P>) {
    let model = Model::new(ModelConfig::default());
    model.attach_mux(mux);
    let ctx = up(&model);
    (model, ctx)
}

fn pump<'a>(
    clk: &TestClock,
    a: &mut TestCm<'a>,
    b: &mut TestCm<'a>,
    ea: &mut Events<'a>,
    eb: &mut Events<'a>,
    mut done: impl FnMut(&Events<'a>, &Events<'a>) -> bool,
) -> bool {
    for _ in 0..2000 {
        if done(ea, eb) {
            return true;
        }
        clk.advance(1000);
        while let Some(e) = a.poll() {
            ea.push(e);
        }
        while let Some(e) = b.poll() {
            eb.push(e);
        }
    }
    done(ea, eb)
}

/// RC through the CM between two guests at `ips`, then a disconnect from the active side.
fn rc_connect_disconnect(ips: ([u8; 4], [u8; 4])) {
    let mux = Mux::new();
    let (ma, a) = guest(&mux);
    let (mb, b) = guest(&mux);
    rc_body(&mux, &a, &b, ips);
    common::teardown(&ma, a);
    common::teardown(&mb, b);
}

fn rc_body(mux: &Mux, a: &Context<P>, b: &Context<P>, ips: ([u8; 4], [u8; 4])) {
    let _ga = a.bind_gid(0, Gid::from_ipv4(ips.0)).unwrap();
    let _gb = b.bind_gid(0, Gid::from_ipv4(ips.1)).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ga, gb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let (da, db) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let clk = TestClock::default();
    let mut cma: TestCm<'_> = Cm::new(&pa, &ga, clk.clone(), CmConfig::default()).unwrap();
    let mut cmb: TestCm<'_> = Cm::new(&pb, &gb, clk.clone(), CmConfig::default()).unwrap();
    assert_eq!((cma.ip(), cmb.ip()), ips);
    cmb.listen(None, 7174, Service::Rc).unwrap();
    let qa = pa
        .qp_builder(&da, &da)
        .caps(caps(4, 4, 1))
        .build::<Rc>()
        .unwrap();
    let qa_num = qa.qp_num();
    let params = ConnectParams {
        private_data: b"over QP1 of a PVRDMA",
        ..ConnectParams::default()
    };
    let id_a = cma.connect(qa, ips.1, 7174, &params).unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    assert!(
        pump(&clk, &mut cma, &mut cmb, &mut ea, &mut eb, |_, b| !b
            .is_empty()),
        "no request reached B: {:?} (mux dropped {})",
        cma.counts(),
        mux.dropped()
    );
    let CmEvent::ConnectRequest(req) = eb.remove(0) else {
        panic!("not a request: {eb:?}")
    };
    assert_eq!((req.src_ip, req.dst_ip, req.dst_port), (ips.0, ips.1, 7174));
    assert_eq!(&req.private_data.as_slice()[..20], b"over QP1 of a PVRDMA");
    let qb = pb
        .qp_builder(&db, &db)
        .caps(caps(4, 4, 1))
        .build::<Rc>()
        .unwrap();
    let qb_num = qb.qp_num();
    let qb = cmb.accept(req.id, qb, &AcceptParams::default()).unwrap();
    assert!(pump(&clk, &mut cma, &mut cmb, &mut ea, &mut eb, |a, b| {
        a.iter().any(|e| matches!(e, CmEvent::Established { .. }))
            && b.iter().any(|e| matches!(e, CmEvent::Established { .. }))
    }));
    let Some(CmEvent::Established {
        id, qp: Some(qa), ..
    }) = ea.pop()
    else {
        panic!("A: {ea:?}")
    };
    assert_eq!(id, id_a);
    let (at, bt) = (qa.query().unwrap(), qb.query().unwrap());
    assert_eq!((at.state, bt.state), (QpState::Rts, QpState::Rts));
    assert_eq!((at.dest_qpn, bt.dest_qpn), (qb_num, qa_num));
    eb.clear();
    // A disconnects: DREQ, DREP, both sides in TIME_WAIT and out of it.
    let qa = qa.to_error().unwrap();
    cma.disconnect(id_a).unwrap();
    assert!(pump(&clk, &mut cma, &mut cmb, &mut ea, &mut eb, |a, b| {
        let out = |v: &Events<'_>| v.iter().any(|e| matches!(e, CmEvent::TimeWaitExit { .. }));
        out(a) && out(b)
    }));
    assert!(eb.iter().any(|e| matches!(e, CmEvent::Disconnected { .. })));
    assert_eq!(cma.counts().malformed + cmb.counts().malformed, 0);
    assert_eq!(mux.dropped(), 0);
    // REQ, REP, RTU, DREQ, DREP.
    assert!(mux.relayed() >= 5, "{}", mux.relayed());
    drop((qa, qb));
}

#[test]
fn two_pvrdma_guests_connect_rc_and_disconnect_through_the_cm() {
    rc_connect_disconnect(([10, 0, 0, 2], [10, 0, 0, 3]));
}

/// QEMU's GRH has version 0: a source address in 64.0.0.0/4 puts 0x4_ where an IPv4 header's
/// version would be, and must still be read as a GID.
#[test]
fn a_source_in_64_slash_4_is_read_from_qemus_grh_as_a_gid() {
    rc_connect_disconnect(([70, 0, 0, 2], [70, 0, 0, 3]));
}

#[test]
fn two_pvrdma_guests_resolve_a_ud_service_through_sidr() {
    let mux = Mux::new();
    let (ma, a) = guest(&mux);
    let (mb, b) = guest(&mux);
    sidr_body(&mux, &a, &b);
    common::teardown(&ma, a);
    common::teardown(&mb, b);
}

fn sidr_body(mux: &Mux, a: &Context<P>, b: &Context<P>) {
    let _ga = a.bind_gid(0, Gid::from_ipv4([10, 0, 0, 2])).unwrap();
    let _gb = b.bind_gid(0, Gid::from_ipv4([10, 0, 0, 3])).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ga, gb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let clk = TestClock::default();
    let mut cma: TestCm<'_> = Cm::new(&pa, &ga, clk.clone(), CmConfig::default()).unwrap();
    let mut cmb: TestCm<'_> = Cm::new(&pb, &gb, clk.clone(), CmConfig::default()).unwrap();
    cmb.listen(None, 7175, Service::Ud).unwrap();
    let id = cma.sidr_resolve([10, 0, 0, 3], 7175, b"which QP?").unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    assert!(pump(&clk, &mut cma, &mut cmb, &mut ea, &mut eb, |_, b| !b
        .is_empty()));
    let CmEvent::SidrRequest(r) = eb.remove(0) else {
        panic!("B: {eb:?}")
    };
    assert_eq!((r.src_ip, r.dst_port), ([10, 0, 0, 2], 7175));
    assert_eq!(&r.private_data.as_slice()[..9], b"which QP?");
    cmb.sidr_reply(r.id, 0x42, 0x0123_4567, b"this one")
        .unwrap();
    assert!(pump(&clk, &mut cma, &mut cmb, &mut ea, &mut eb, |a, _| !a
        .is_empty()));
    let CmEvent::SidrResolved {
        id: got,
        result,
        private_data,
    } = ea.remove(0)
    else {
        panic!("A: {ea:?}")
    };
    assert_eq!(got, id);
    assert_eq!(result, Ok((0x42, 0x0123_4567)));
    assert_eq!(&private_data.as_slice()[..8], b"this one");
    assert_eq!(mux.relayed(), 2);
}

/// A REQ to an address no guest of the mux has goes nowhere (QEMU addresses every MAD to
/// the sender's own GID: the mux is the only way out, and it knows only its guests).
#[test]
fn a_req_to_an_address_no_guest_has_is_dropped_by_the_mux() {
    let mux = Mux::new();
    let (ma, a) = guest(&mux);
    lonely_body(&mux, &a);
    common::teardown(&ma, a);
}

fn lonely_body(mux: &Mux, a: &Context<P>) {
    let _ga = a.bind_gid(0, Gid::from_ipv4([10, 0, 0, 2])).unwrap();
    let pa = a.alloc_pd().unwrap();
    let (ga, da) = (a.create_cq(64).unwrap(), a.create_cq(16).unwrap());
    let clk = TestClock::default();
    let mut cma: TestCm<'_> = Cm::new(&pa, &ga, clk.clone(), CmConfig::default()).unwrap();
    let qa = pa
        .qp_builder(&da, &da)
        .caps(caps(4, 4, 1))
        .build::<Rc>()
        .unwrap();
    cma.connect(qa, [10, 0, 0, 9], 7174, &ConnectParams::default())
        .unwrap();
    for _ in 0..10 {
        clk.advance(1000);
        while cma.poll().is_some() {}
    }
    assert_eq!((mux.relayed(), mux.dropped()), (0, 1));
    assert_eq!(cma.counts().sent, 1);
}

/// QP1 as QEMU runs it, seen from the verbs API: a MAD of two SGEs goes through the mux and
/// lands after QEMU's GRH (payload length, the sender's GID, `0::<interface ID>`), its length
/// reported with the GRH slot counted (the provider adds the 40 bytes QEMU leaves out); a MAD
/// of one SGE completes with a general error; an MRA is dropped by the mux.
#[test]
fn a_mad_lands_after_qemus_grh_with_the_grh_slot_counted() {
    let mux = Mux::new();
    let (ma, a) = guest(&mux);
    let (mb, b) = guest(&mux);
    raw_body(&a, &b);
    assert_eq!((mux.relayed(), mux.dropped()), (2, 1));
    common::teardown(&ma, a);
    common::teardown(&mb, b);
}

fn raw_body(a: &Context<P>, b: &Context<P>) {
    let (gid_a, gid_b) = (Gid::from_ipv4([10, 0, 0, 2]), Gid::from_ipv4([10, 0, 0, 3]));
    let _ga = a.bind_gid(0, gid_a).unwrap();
    let _gb = b.bind_gid(0, gid_b).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 2,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qa = pa.qp_builder(&ca, &ca).caps(caps).build::<Gsi>().unwrap();
    let mut qa = qa.ready(0x8001_0000, 0).unwrap();
    let qb = pb.qp_builder(&cb, &cb).caps(caps).build::<Gsi>().unwrap();
    let mut qb = qb.ready(0x8001_0000, 0).unwrap();
    let ah = pa.create_ah(&AddressVector::new(gid_b, 0)).unwrap();
    let mut ma = pa.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mb = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // A REQ as far as the mux looks: attribute 0x0010, comm ID, primary remote GID.
    let mut mad = [0u8; 256];
    (mad[0], mad[1], mad[2], mad[3]) = (1, 7, 2, 3);
    mad[16..18].copy_from_slice(&0x0010u16.to_be_bytes());
    mad[24..28].copy_from_slice(&[1, 2, 3, 4]);
    mad[96..112].copy_from_slice(&gid_b.0);
    mad[200] = 0xA5;
    ma.as_mut_slice()[..256].copy_from_slice(&mad);
    // SAFETY: the regions stay registered and untouched until the completions are polled.
    unsafe {
        qb.post_recv_raw(7, &[mb.sge(0, 296).unwrap()]).unwrap();
        let mut s = qa.send_batch();
        let parts = [ma.sge(0, 24).unwrap(), ma.sge(24, 232).unwrap()];
        s.send_to(1, SendFlags::SIGNALED, (&ah, 1, 0x8001_0000), &parts)
            .unwrap();
        s.send_to(
            2,
            SendFlags::SIGNALED,
            (&ah, 1, 0x8001_0000),
            &[ma.sge(0, 256).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    let mut wc = [WorkCompletion::default(); 4];
    let n = ca.poll(&mut wc).unwrap();
    assert_eq!(n, 2, "{:?}", &wc[..n]);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    assert_eq!((wc[1].wr_id, wc[1].status), (2, WcStatus::GeneralErr));
    // The cursor poll reads the same length.
    let mut cur = cb.start_poll().unwrap().expect("a completion");
    assert_eq!((cur.wr_id(), cur.byte_len()), (7, 296));
    assert!(!cur.next_poll().unwrap());
    drop(cur);
    // SAFETY: as above; the buffer is read only after the completion.
    unsafe { qb.post_recv_raw(8, &[mb.sge(0, 296).unwrap()]).unwrap() };
    // SAFETY: as above.
    unsafe { send_mad(&mut qa, &ah, &ma, 3) };
    assert_eq!(ca.poll(&mut wc).unwrap(), 1);
    let n = cb.poll(&mut wc).unwrap();
    assert_eq!(n, 1);
    let w = wc[0];
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (8, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(w.byte_len, 296, "the MAD and the GRH slot before it");
    assert_eq!(w.src_qp, 0, "QEMU reports no source QP");
    assert!(w.flags.contains(WcFlags::GRH));
    let got = &mb.as_slice()[..296];
    assert_eq!(&got[..4], &[0; 4]);
    assert_eq!(&got[4..6], &256u16.to_be_bytes(), "payload length");
    assert_eq!(&got[6..8], &[0; 2]);
    assert_eq!(&got[8..24], &gid_a.0, "source GID");
    assert_eq!(&got[24..32], &[0; 8], "destination: no subnet prefix");
    assert_eq!(&got[32..40], &gid_b.0[8..], "destination: the interface ID");
    assert_eq!(&got[40..], &mad[..]);
    // An MRA: the mux routes no such attribute. Sent (the mux took it), never received.
    ma.as_mut_slice()[16..18].copy_from_slice(&0x0011u16.to_be_bytes());
    // SAFETY: as above.
    unsafe {
        qb.post_recv_raw(9, &[mb.sge(0, 296).unwrap()]).unwrap();
        send_mad(&mut qa, &ah, &ma, 4);
    }
    assert_eq!(ca.poll(&mut wc).unwrap(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (4, WcStatus::Success));
    assert_eq!(cb.poll(&mut wc).unwrap(), 0);
    drop((qa, qb, ah));
}

/// Sends the 256 bytes at the start of `mr` from QP1 as QEMU wants a MAD: the 24-byte header
/// and the rest, two SGEs.
///
/// # Safety
///
/// `mr` stays registered and untouched until the completion is polled.
unsafe fn send_mad(
    qp: &mut QueuePair<'_, P, Gsi, Rts>,
    ah: &AddressHandle<'_, P>,
    mr: &MemoryRegion<'_, P>,
    wr_id: u64,
) {
    let mut s = qp.send_batch();
    let parts = [mr.sge(0, 24).unwrap(), mr.sge(24, 232).unwrap()];
    // SAFETY: forwarded from our caller.
    unsafe { s.send_to(wr_id, SendFlags::SIGNALED, (ah, 1, 0x8001_0000), &parts) }.unwrap();
    s.finish();
}
