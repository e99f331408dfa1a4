//! The initiator depth (`max_rd_atomic`, set at RTS): a READ or atomic posted on an RC queue
//! pair whose depth, as the device applied it, is 0 is refused at post time with
//! `Attr::InitiatorDepth`, and posts nothing; the step-by-step defaults give depth 1, so a READ
//! works after `ConnectedRtr::new` / `ConnectedRts::new` on both devices.

mod common;
mod pair;

use bareverbs::error::{Attr, Error, Op};
use bareverbs::verbs::*;
use bareverbs_model::{Model, ModelConfig};
use common::{poll_until, rc_to_rts, teardown, up};
use pair::rxe_pair;

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

const REFUSED: Error = Error::MissingAttribute {
    op: Op::PostSend,
    attr: Attr::InitiatorDepth,
};

/// RESET → RTS towards `peer` (its GID `dgid`) with the step-by-step defaults, the initiator
/// depth replaced by `depth` when given.
fn connect<'a, P: Provider>(
    qp: QueuePair<'a, P, Rc, Reset>,
    peer: u32,
    dgid: Gid,
    sgid_index: u8,
    depth: Option<u8>,
) -> QueuePair<'a, P, Rc, Rts> {
    let init = ConnectedInit {
        access: ALL,
        ..Default::default()
    };
    let mut av = AddressVector::new(dgid, sgid_index);
    av.hop_limit = 64;
    let mut rts = ConnectedRts::new(0);
    if let Some(d) = depth {
        rts.max_rd_atomic = d;
    }
    rc_to_rts(qp, &init, &ConnectedRtr::new(peer, 0, av), &rts)
}

#[test]
fn step_by_step_defaults_give_depth_one_each_way() {
    let (_m, _clk, a, b) = rxe_pair(None);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa = pa.qp_builder(&ca, &ca).build::<Rc>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let qa = connect(qa, nb, Gid::from_ipv4([10, 0, 0, 3]), 0, None);
    let _qb = connect(qb, na, Gid::from_ipv4([10, 0, 0, 2]), 0, None);
    let at = qa.query().unwrap();
    assert_eq!((at.max_rd_atomic, at.max_dest_rd_atomic), (1, 1));
}

#[test]
fn rxe_refuses_read_and_atomics_on_a_depth_zero_qp_and_posts_nothing() {
    let (_m, clk, a, b) = rxe_pair(None);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa = pa.qp_builder(&ca, &ca).build::<Rc>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let mut qa = connect(qa, nb, Gid::from_ipv4([10, 0, 0, 3]), 0, Some(0));
    let mut qb = connect(qb, na, Gid::from_ipv4([10, 0, 0, 2]), 0, None);
    assert_eq!(qa.query().unwrap().max_rd_atomic, 0);

    let local = pa.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut remote = pb.register(4096, ALL).unwrap();
    remote.as_mut_slice()[..8].copy_from_slice(b"remote!!");
    let target = (remote.addr(), remote.rkey());
    let sge = local.sge(0, 8).unwrap();
    // SAFETY: `local` stays registered and untouched until every completion is polled (none
    // is expected: each request is refused).
    unsafe {
        let mut batch = qa.send_batch();
        assert_eq!(
            batch.rdma_read(1, SendFlags::SIGNALED, target, &[sge]),
            Err(REFUSED)
        );
        assert_eq!(
            batch.atomic_fetch_add(2, SendFlags::SIGNALED, target, 1, &sge),
            Err(REFUSED)
        );
        assert_eq!(
            batch.atomic_cmp_swp(3, SendFlags::SIGNALED, target, (0, 1), &sge),
            Err(REFUSED)
        );
        batch.finish();
    }
    let tick = &mut || {
        clk.advance(100);
        a.process_events();
        b.process_events();
    };
    assert!(
        poll_until(tick, &ca, usize::MAX, 2_000).is_empty(),
        "a refused request posted something"
    );
    assert_eq!(
        &remote.as_slice()[..8],
        b"remote!!",
        "an atomic reached the peer"
    );
    assert_eq!(&local.as_slice()[..8], &[0; 8], "a READ reached the peer");
    // The peer with depth 1 (the defaults) reads, and the depth-0 QP still sends.
    let back = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut lw = pa.register(4096, ALL).unwrap();
    lw.as_mut_slice()[..4].copy_from_slice(b"data");
    // SAFETY: `back` and `lw` stay registered and untouched until the completion is polled.
    unsafe {
        qb.post_send_raw_read(7, (lw.addr(), lw.rkey()), &[back.sge(0, 4).unwrap()]);
    }
    let got = poll_until(tick, &cb, usize::MAX, 2_000);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].status, WcStatus::Success);
    assert_eq!(&back.as_slice()[..4], b"data");
}

/// The one READ the peer posts.
trait ReadOne {
    /// Posts one signaled READ.
    ///
    /// # Safety
    ///
    /// As `SendBatch::rdma_read`.
    unsafe fn post_send_raw_read(&mut self, wr_id: u64, at: (u64, u32), sges: &[Sge]);
}

impl<P: Provider> ReadOne for QueuePair<'_, P, Rc, Rts> {
    unsafe fn post_send_raw_read(&mut self, wr_id: u64, at: (u64, u32), sges: &[Sge]) {
        let mut b = self.send_batch();
        // SAFETY: forwarded from our caller.
        unsafe { b.rdma_read(wr_id, SendFlags::SIGNALED, at, sges).unwrap() };
        b.finish();
    }
}

/// The PVRDMA model, with a device that reports READ resources (`rd_atom` (4, 2)): depth 0
/// as asked is refused at post time; the default depth 1 reads. With QEMU's caps (0 reported),
/// the QP has the 1 QEMU applies, and the READ is not refused for depth.
#[test]
fn pvrdma_refuses_a_read_on_a_depth_zero_qp_as_the_device_applied_it() {
    for (rd_atom, depth, refused) in [
        ((4, 2), Some(0), true),
        ((4, 2), None, false),
        ((0, 0), Some(0), false), // QEMU: every RC QP gets 1 whatever is asked
    ] {
        let mut cfg = ModelConfig::default();
        cfg.caps.rd_atom = rd_atom;
        let model = Model::new(cfg);
        let ctx = up(&model);
        let g = ctx
            .bind_gid(
                0,
                Gid::link_local_from_mac([0x52, 0x54, 0, 0x12, 0x34, 0x57]),
            )
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let a = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
        let b = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
        let (na, nb) = (a.qp_num(), b.qp_num());
        let mut a = connect(a, nb, g.gid(), 0, depth);
        let b = connect(b, na, g.gid(), 0, None);
        let mut mr = pd.register(4096, ALL).unwrap();
        mr.as_mut_slice()[..4].copy_from_slice(b"pvrd");
        let sge = mr.sge(2048, 4).unwrap();
        let at = (mr.addr(), mr.rkey());
        // SAFETY: `mr` stays registered and untouched until the completion is polled.
        let r = unsafe {
            let mut batch = a.send_batch();
            let r = batch.rdma_read(1, SendFlags::SIGNALED, at, &[sge]);
            batch.finish();
            r
        };
        let got = poll_until(&mut || {}, &cq, usize::MAX, 2_000);
        if refused {
            assert_eq!(r, Err(REFUSED), "caps {rd_atom:?}, depth {depth:?}");
            assert!(got.is_empty(), "{got:?}");
        } else {
            assert_eq!(r, Ok(()), "caps {rd_atom:?}, depth {depth:?}");
            assert_eq!(got.len(), 1, "{got:?}");
            assert_eq!(got[0].status, WcStatus::Success);
            assert_eq!(&mr.as_slice()[2048..2052], b"pvrd");
        }
        drop((a, b, mr));
        drop(cq);
        drop(pd);
        drop(g);
        teardown(&model, ctx);
    }
}

#[test]
fn the_refusal_reads_clearly() {
    let text = REFUSED.to_string();
    assert!(text.contains("initiator depth"), "{text}");
    assert!(text.contains("max_rd_atomic"), "{text}");
}
