//! `endpoint()` and `handshake()`: two software RoCE devices on an in-memory segment, and the
//! PVRDMA model in loopback, connect in one call each with the defaults, and then RDMA works
//! (WRITE and READ on rxe, whose depth defaults to at least 1).

mod common;
mod pair;

use bareverbs::verbs::*;
use common::{caps, poll_until};
use pair::rxe_pair;

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

fn wait<P: Provider>(
    tick: &mut dyn FnMut(),
    cq: &CompletionQueue<'_, P>,
    n: usize,
) -> Vec<WorkCompletion> {
    let got = poll_until(tick, cq, n, 10_000);
    if got.len() >= n {
        return got;
    }
    panic!("{} of {n} completions: {got:?}", got.len());
}

#[test]
fn two_rxe_devices_connect_by_handshake_and_write_and_read() {
    let (_model, clk, a, b) = rxe_pair(Some((1, 2)));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
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
    let (ea, eb) = (qa.endpoint().unwrap(), qb.endpoint().unwrap());
    // What a side channel would carry: 24 bytes each way.
    let ea = Endpoint::from_bytes(&ea.to_bytes()).unwrap();
    let eb = Endpoint::from_bytes(&eb.to_bytes()).unwrap();
    assert_eq!(ea.gid, Gid::from_ipv4([10, 0, 0, 2]));
    assert_eq!(ea.mtu, Mtu::Mtu1024);
    assert_eq!((ea.qpn, ea.psn), (qa.qp_num(), qa.local_psn()));
    assert_ne!(ea.psn, eb.psn, "PSNs come from each context's entropy");
    let mut qa = qa.handshake(&eb).unwrap();
    let mut qb = qb.handshake(&ea).unwrap();
    // The defaults: RDMA allowed, depth at least 1, PSNs as advertised.
    let at = qa.query().unwrap();
    assert!(
        at.access
            .contains(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE)
    );
    assert!(
        at.max_rd_atomic >= 1 && at.max_dest_rd_atomic >= 1,
        "{at:?}"
    );
    assert_eq!(at.max_rd_atomic, DEFAULT_RD_ATOMIC);
    assert_eq!((at.rq_psn, at.sq_psn), (ea.psn, eb.psn));
    assert_eq!(at.dest_qpn, eb.qpn);

    let mut ma = pa.register(4096, ALL).unwrap();
    let mb = pb.register(4096, ALL).unwrap();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
    ma.as_mut_slice()[..3000].copy_from_slice(&data);
    let mut tick = || {
        clk.advance(100);
        a.process_events();
        b.process_events();
    };
    // SAFETY: the regions stay registered and untouched until the completions.
    unsafe {
        let mut s = qa.send_batch();
        let sge = ma.sge(0, 3000).unwrap();
        s.rdma_write(1, SendFlags::SIGNALED, (mb.addr(), mb.rkey()), &[sge])
            .unwrap();
        s.finish();
    }
    let w = wait(&mut tick, &ca, 1);
    assert_eq!((w[0].wr_id, w[0].status), (1, WcStatus::Success));
    assert_eq!(&mb.as_slice()[..3000], &data[..]);
    // B reads it back into the upper half of its region.
    // SAFETY: as above.
    unsafe {
        let mut s = qb.send_batch();
        let sge = mb.sge(2048, 1500).unwrap();
        s.rdma_read(2, SendFlags::SIGNALED, (ma.addr() + 100, ma.rkey()), &[sge])
            .unwrap();
        s.finish();
    }
    let mut tick = || {
        clk.advance(100);
        a.process_events();
        b.process_events();
    };
    let r = wait(&mut tick, &cb, 1);
    assert_eq!((r[0].wr_id, r[0].status), (2, WcStatus::Success));
    assert_eq!(&mb.as_slice()[2048..3548], &data[100..1600]);
}

#[test]
fn the_same_seeds_give_the_same_psns_and_other_seeds_others() {
    let psns = |seed| {
        let (_m, _c, a, b) = rxe_pair(Some(seed));
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq(8).unwrap(), b.create_cq(8).unwrap());
        let qa = pa.qp_builder(&ca, &ca).build::<Rc>().unwrap();
        let qb = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
        (qa.local_psn(), qb.local_psn())
    };
    assert_eq!(psns((5, 6)), psns((5, 6)));
    assert_ne!(psns((5, 6)), psns((7, 8)));
}

#[test]
fn overrides_are_applied_and_a_failed_handshake_hands_the_qp_back_in_reset() {
    let (_model, _clk, a, b) = rxe_pair(Some((3, 4)));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
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
    let eb = qb.endpoint().unwrap();
    // An MTU above what the link carries: RTR fails, the QP comes back in RESET.
    let opts = Handshake {
        path_mtu: Some(Mtu::Mtu4096),
        ..Handshake::default()
    };
    let (qa, e) = match qa.handshake_with(&eb, &opts) {
        Ok(_) => panic!("an MTU of 4096 over a 1500-byte link was accepted"),
        Err(x) => x,
    };
    assert_eq!(
        e,
        bareverbs::Error::InvalidInput {
            param: bareverbs::error::Param::PathMtu,
            value: 5,
            max: 4
        }
    );
    assert_eq!(qa.query().unwrap().state, QpState::Reset);
    // Every override taken (GID 1 is the IPv4-mapped one).
    let opts = Handshake {
        sgid_index: Some(1),
        max_rd_atomic: Some(2),
        max_dest_rd_atomic: Some(200),
        path_mtu: Some(Mtu::Mtu512),
        access: AccessFlags::REMOTE_WRITE,
        timeout: 9,
        ..Handshake::default()
    };
    let qa = qa.handshake_with(&eb, &opts).unwrap();
    let at = qa.query().unwrap();
    assert_eq!(at.max_rd_atomic, 2);
    assert_eq!(at.max_dest_rd_atomic, 16, "clamped to the device's limit");
    assert_eq!(at.path_mtu, Mtu::Mtu512);
    assert_eq!(at.access, AccessFlags::REMOTE_WRITE);
    assert_eq!(at.timeout, 9);
}

#[test]
fn a_uc_qp_connects_with_no_read_depth() {
    let (_model, _clk, a, b) = rxe_pair(Some((9, 10)));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa = pa
        .qp_builder(&ca, &ca)
        .caps(caps(16, 16, 1))
        .build::<Uc>()
        .unwrap();
    let qb = pb
        .qp_builder(&cb, &cb)
        .caps(caps(16, 16, 1))
        .build::<Uc>()
        .unwrap();
    let eb = qb.endpoint().unwrap();
    let qa = qa.handshake(&eb).unwrap();
    let at = qa.query().unwrap();
    assert_eq!((at.max_rd_atomic, at.max_dest_rd_atomic), (0, 0));
    assert_eq!(at.state, QpState::Rts);
}

#[test]
fn pvrdma_connects_by_handshake_with_the_depth_clamped_to_its_zero() {
    let model = common::model();
    let ctx = common::up(&model);
    {
        let gid = Gid::from_ipv4([192, 168, 1, 5]);
        let _g = ctx.bind_gid(0, gid).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let qa = pd
            .qp_builder(&cq, &cq)
            .caps(caps(16, 16, 1))
            .build::<Rc>()
            .unwrap();
        let qb = pd
            .qp_builder(&cq, &cq)
            .caps(caps(16, 16, 1))
            .build::<Rc>()
            .unwrap();
        let (ea, eb) = (qa.endpoint().unwrap(), qb.endpoint().unwrap());
        assert_eq!(ea.gid, gid);
        let mut qa = qa.handshake(&eb).unwrap();
        let qb = qb.handshake(&ea).unwrap();
        let at = qa.query().unwrap();
        assert_eq!(ctx.caps().max_qp_init_rd_atom, 0);
        // (QEMU's query answers 1 for both depths whatever was set, and the model with it.)
        assert_eq!(at.dest_qpn, eb.qpn);
        assert_eq!((at.rq_psn, at.sq_psn), (ea.psn, eb.psn));
        assert_eq!(at.state, QpState::Rts);
        // A WRITE goes through in loopback.
        let mut m = pd.register(4096, ALL).unwrap();
        m.as_mut_slice()[..4].copy_from_slice(b"ping");
        // SAFETY: the region stays registered and untouched until the completion.
        unsafe {
            let mut s = qa.send_batch();
            let sge = m.sge(0, 4).unwrap();
            s.rdma_write(7, SendFlags::SIGNALED, (m.addr() + 1024, m.rkey()), &[sge])
                .unwrap();
            s.finish();
        }
        let w = wait(&mut || ctx.process_events(), &cq, 1);
        assert_eq!((w[0].wr_id, w[0].status), (7, WcStatus::Success));
        assert_eq!(&m.as_slice()[1024..1028], b"ping");
        drop((qa, qb));
    }
    common::teardown(&model, ctx);
}
