//! Memory windows on the software RoCE device, between two devices on the in-memory
//! segment: type 1 and type 2 binds, remote READ/WRITE through a window inside and outside
//! its range, rights narrower than the region's, rebinding, a type 2 window serving only its
//! QP, deallocation while bound, and bind errors; PVRDMA refuses windows with a typed error.

mod common;
mod mw_common;
mod pair;

use bareverbs::error::{Error, Feature, Holder, Op, Unsupported};
use bareverbs::verbs::*;
use mw_common::*;
use pair::{on_pvrdma, on_rxe};

/// B's region for windows: bindable, locally writable, no remote right of its own.
const BINDABLE: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::MW_BIND);

#[test]
fn type1_window_read_write_inside_its_range_and_not_outside() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let mut mr = pb.register(4096, BINDABLE).unwrap();
        mr.as_mut_slice()[1024..1032].copy_from_slice(b"windowed");
        let mut mw = pb.alloc_mw(MwType::Type1).unwrap();
        let first = mw.rkey();
        let rw = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let rkey = qb
            .bind_mw(1, SIG, &mut mw, &mr.window(1024, 1024, rw).unwrap())
            .unwrap();
        assert_eq!(rkey, mw.rkey());
        assert_eq!(
            rkey & 0xFF,
            (first as u8).wrapping_add(1) as u32,
            "ibv_inc_rkey"
        );
        assert_eq!(rkey & !0xFF, first & !0xFF);
        let c = wait(e, &cb, 1);
        assert_eq!(
            (c[0].wr_id, c[0].opcode, c[0].status),
            (1, WcOpcode::BindMw, WcStatus::Success)
        );

        // The region's own rkey grants nothing remotely; the window does.
        let mut local = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        read(&mut qa, 10, (mr.addr() + 1024, rkey), &local, 8);
        let c = wait(e, &ca, 1);
        assert_eq!((c[0].wr_id, c[0].status), (10, WcStatus::Success));
        assert_eq!(&local.as_slice()[..8], b"windowed");
        local.as_mut_slice()[..4].copy_from_slice(b"WIND");
        write(&mut qa, 11, (mr.addr() + 2044, rkey), &local, 4); // the window's last 4 bytes
        let c = wait(e, &ca, 1);
        assert_eq!((c[0].wr_id, c[0].status), (11, WcStatus::Success));
        assert_eq!(&mr.as_slice()[2044..2048], b"WIND");

        // Past its end (the region goes on; the window does not): remote access error.
        write(&mut qa, 12, (mr.addr() + 2046, rkey), &local, 4);
        let c = wait(e, &ca, 1);
        assert_eq!((c[0].wr_id, c[0].status), (12, WcStatus::RemAccessErr));
        assert_eq!(&mr.as_slice()[2046..2050], b"ND\0\0", "nothing written");
        assert_eq!(state(&qa), QpState::Err);
        assert!(
            settle_all(e, &cb).is_empty(),
            "B's side completes nothing for it"
        );
        drop((qa, qb));
        drop(mw);
        mr.destroy().unwrap();
    });
}

#[test]
fn type1_window_before_its_start_is_refused() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let mr = pb.register(4096, BINDABLE).unwrap();
        let mut mw = pb.alloc_mw(MwType::Type1).unwrap();
        let bind = mr.window(1024, 1024, AccessFlags::REMOTE_READ).unwrap();
        let rkey = qb.bind_mw(1, SIG, &mut mw, &bind).unwrap();
        wait(e, &cb, 1);
        let local = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        read(&mut qa, 10, (mr.addr() + 1020, rkey), &local, 8);
        let c = wait(e, &ca, 1);
        assert_eq!((c[0].wr_id, c[0].status), (10, WcStatus::RemAccessErr));
    });
}

#[test]
fn window_rights_narrower_than_the_region() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        // The region grants remote writes through its own key; the window reads only.
        let mr = pb.register(4096, BINDABLE | REMOTE).unwrap();
        let mut mw = pb.alloc_mw(MwType::Type1).unwrap();
        let bind = mr.window(0, 4096, AccessFlags::REMOTE_READ).unwrap();
        let rkey = qb.bind_mw(1, SIG, &mut mw, &bind).unwrap();
        wait(e, &cb, 1);
        let local = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        read(&mut qa, 10, (mr.addr(), rkey), &local, 8);
        assert_eq!(wait(e, &ca, 1)[0].status, WcStatus::Success);
        write(&mut qa, 11, (mr.addr(), rkey), &local, 8);
        let c = wait(e, &ca, 1);
        assert_eq!((c[0].wr_id, c[0].status), (11, WcStatus::RemAccessErr));
    });
}

#[test]
fn rebinding_a_type1_window_kills_its_old_key() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let mut mr = pb.register(4096, BINDABLE).unwrap();
        mr.as_mut_slice()[3000..3004].copy_from_slice(b"two!");
        let mut mw = pb.alloc_mw(MwType::Type1).unwrap();
        let r = AccessFlags::REMOTE_READ;
        let old = qb
            .bind_mw(1, SIG, &mut mw, &mr.window(0, 1024, r).unwrap())
            .unwrap();
        let new = qb
            .bind_mw(2, SIG, &mut mw, &mr.window(2048, 2048, r).unwrap())
            .unwrap();
        assert_ne!(old, new);
        let c = wait(e, &cb, 2);
        assert!(
            c.iter()
                .all(|c| c.opcode == WcOpcode::BindMw && c.status == WcStatus::Success)
        );
        let local = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        read(&mut qa, 10, (mr.addr() + 3000, new), &local, 4);
        assert_eq!(wait(e, &ca, 1)[0].status, WcStatus::Success);
        assert_eq!(&local.as_slice()[..4], b"two!");
        read(&mut qa, 11, (mr.addr(), old), &local, 4);
        let c = wait(e, &ca, 1);
        assert_eq!((c[0].wr_id, c[0].status), (11, WcStatus::RemAccessErr));
    });
}

#[test]
fn type2_window_serves_only_the_qp_it_is_bound_to() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa1, mut qb1) = pair(e, (&pa, &ca), (&pb, &cb));
        let (mut qa2, _qb2) = pair(e, (&pa, &ca), (&pb, &cb));
        let mut mr = pb.register(4096, BINDABLE).unwrap();
        mr.as_mut_slice()[..4].copy_from_slice(b"mine");
        let mut mw = pb.alloc_mw(MwType::Type2).unwrap();
        let bind = mr.window(0, 4096, AccessFlags::REMOTE_READ).unwrap();
        // A type 1 bind call refuses a type 2 window, and the batch's bind a type 1 one.
        let e1 = qb1.bind_mw(1, SIG, &mut mw, &bind).unwrap_err();
        assert!(matches!(e1, Error::InvalidInput { .. }), "{e1:?}");
        let mut batch = qb1.send_batch();
        let rkey = batch.bind_mw(1, SIG, &mut mw, 0xA5, &bind).unwrap();
        batch.finish();
        assert_eq!(rkey & 0xFF, 0xA5);
        let c = wait(e, &cb, 1);
        assert_eq!(
            (c[0].opcode, c[0].status),
            (WcOpcode::BindMw, WcStatus::Success)
        );
        let local = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        read(&mut qa1, 10, (mr.addr(), rkey), &local, 4);
        assert_eq!(wait(e, &ca, 1)[0].status, WcStatus::Success);
        assert_eq!(&local.as_slice()[..4], b"mine");
        // The other QP of the same PD: not the window's.
        read(&mut qa2, 11, (mr.addr(), rkey), &local, 4);
        let c = wait(e, &ca, 1);
        assert_eq!((c[0].wr_id, c[0].status), (11, WcStatus::RemAccessErr));
        // Bound while bound: a type 2 window is bound again only after an invalidation.
        let mut batch = qb1.send_batch();
        batch.bind_mw(2, SIG, &mut mw, 0xA6, &bind).unwrap();
        batch.finish();
        let c = wait(e, &cb, 1);
        assert_eq!(
            (c[0].wr_id, c[0].opcode, c[0].status),
            (2, WcOpcode::BindMw, WcStatus::MwBindErr)
        );
        assert_eq!(state(&qb1), QpState::Err);
    });
}

#[test]
fn type2_window_invalidated_locally_then_bound_again() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let mr = pb.register(4096, BINDABLE).unwrap();
        let mut mw = pb.alloc_mw(MwType::Type2).unwrap();
        let bind = mr.window(0, 64, AccessFlags::REMOTE_READ).unwrap();
        let mut batch = qb.send_batch();
        let k1 = batch.bind_mw(1, SIG, &mut mw, 1, &bind).unwrap();
        batch.local_inv(2, SIG, k1).unwrap();
        let k2 = batch.bind_mw(3, SIG, &mut mw, 2, &bind).unwrap();
        batch.finish();
        let c = wait(e, &cb, 3);
        let ops: Vec<_> = c.iter().map(|c| (c.wr_id, c.opcode, c.status)).collect();
        assert_eq!(
            ops,
            [
                (1, WcOpcode::BindMw, WcStatus::Success),
                (2, WcOpcode::LocalInv, WcStatus::Success),
                (3, WcOpcode::BindMw, WcStatus::Success)
            ]
        );
        let local = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        read(&mut qa, 10, (mr.addr(), k2), &local, 4);
        assert_eq!(wait(e, &ca, 1)[0].status, WcStatus::Success);
        read(&mut qa, 11, (mr.addr(), k1), &local, 4);
        assert_eq!(wait(e, &ca, 1)[0].status, WcStatus::RemAccessErr);
    });
}

#[test]
fn a_region_with_a_bound_window_is_not_deregistered_and_dealloc_ends_access() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let mr = pb.register(4096, BINDABLE).unwrap();
        let mut mw = pb.alloc_mw(MwType::Type1).unwrap();
        let bind = mr.window(0, 4096, AccessFlags::REMOTE_READ).unwrap();
        let rkey = qb.bind_mw(1, SIG, &mut mw, &bind).unwrap();
        wait(e, &cb, 1);
        let (mr, err) = mr.destroy().unwrap_err();
        let want = Error::InUse {
            op: Op::DestroyMr,
            holder: Holder::Windows,
            count: 1,
        };
        assert_eq!(err, want);
        assert!(err.to_string().contains("invalidate"), "{err}");
        mw.dealloc().unwrap();
        let local = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        read(&mut qa, 10, (mr.addr(), rkey), &local, 4);
        assert_eq!(wait(e, &ca, 1)[0].status, WcStatus::RemAccessErr);
        mr.destroy().unwrap();
    });
}

#[test]
fn bind_over_a_region_without_mw_bind_fails_and_flushes_the_rest_once() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (_qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let mr = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mut mw = pb.alloc_mw(MwType::Type1).unwrap();
        let bind = mr.window(0, 64, AccessFlags::REMOTE_READ).unwrap();
        qb.bind_mw(1, SIG, &mut mw, &bind).unwrap();
        let mut batch = qb.send_batch();
        batch.local_inv(2, SIG, 0x1234_5678).unwrap();
        batch.finish();
        let c = settle_all(e, &cb);
        assert_eq!(one(&c, 1).status, WcStatus::MwBindErr);
        assert_eq!(one(&c, 1).opcode, WcOpcode::BindMw);
        assert_eq!(
            (one(&c, 2).status, one(&c, 2).opcode),
            (WcStatus::WrFlushErr, WcOpcode::LocalInv)
        );
        assert_eq!(c.len(), 2);
        assert_eq!(state(&qb), QpState::Err);
        // The region was not touched: it goes.
        drop(mw);
        mr.destroy().unwrap();
    });
}

#[test]
fn a_window_key_is_no_local_key() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (_qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let mr = pb.register(4096, BINDABLE).unwrap();
        let mut mw = pb.alloc_mw(MwType::Type1).unwrap();
        let bind = mr.window(0, 4096, AccessFlags::REMOTE_READ).unwrap();
        let rkey = qb.bind_mw(1, SIG, &mut mw, &bind).unwrap();
        wait(e, &cb, 1);
        let sge = Sge {
            addr: mr.addr(),
            length: 8,
            lkey: rkey,
        };
        // SAFETY: the SEND is refused before a byte moves.
        unsafe {
            let mut b = qb.send_batch();
            b.send(2, SIG, &[sge]).unwrap();
            b.finish();
        }
        let c = settle_all(e, &cb);
        assert_eq!(one(&c, 2).status, WcStatus::LocProtErr);
    });
}

#[test]
fn pvrdma_has_no_windows_fast_registration_or_invalidation() {
    on_pvrdma(Default::default(), |e| {
        let pd = e.a.alloc_pd().unwrap();
        let cq = e.a.create_cq(16).unwrap();
        let unsupported = |f| Error::Unsupported(Unsupported::Feature(f));
        let err = pd.alloc_mw(MwType::Type1).err().unwrap();
        assert_eq!(err, unsupported(Feature::MemoryWindows));
        assert!(err.to_string().contains("rkey"), "{err}");
        assert_eq!(
            pd.alloc_mw(MwType::Type2).err(),
            Some(unsupported(Feature::MemoryWindows))
        );
        assert_eq!(
            pd.alloc_fast_reg_mr(4).err(),
            Some(unsupported(Feature::FastRegistration))
        );
        let a = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
        let b = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
        let (na, nb) = (a.qp_num(), b.qp_num());
        let gid = e.to_b.dgid;
        let mut a = common::rc_up(a, nb, gid, AccessFlags::empty());
        let _b = common::rc_up(b, na, gid, AccessFlags::empty());
        let mr = pd.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        let mut batch = a.send_batch();
        assert_eq!(
            batch.local_inv(1, SIG, 0x100).err(),
            Some(unsupported(Feature::Invalidation))
        );
        // SAFETY: refused before the device sees it.
        let r = unsafe { batch.send_with_inv(2, SIG, 0x100, &[mr.sge(0, 8).unwrap()]) };
        assert_eq!(r.err(), Some(unsupported(Feature::Invalidation)));
        batch.finish();
        assert_eq!(
            cq.poll(&mut [WorkCompletion::default(); 4]).unwrap(),
            0,
            "nothing posted"
        );
    });
}

#[test]
fn atomics_through_a_window_inside_its_range_and_with_its_right_only() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let mut mr = pb.register(4096, BINDABLE).unwrap();
        mr.as_mut_slice()[64..72].copy_from_slice(&40u64.to_ne_bytes());
        let mut mw = pb.alloc_mw(MwType::Type1).unwrap();
        let at = AccessFlags::REMOTE_ATOMIC;
        let rkey = qb
            .bind_mw(1, SIG, &mut mw, &mr.window(64, 8, at).unwrap())
            .unwrap();
        wait(e, &cb, 1);
        let local = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        let fetch = |qa: &mut RcQp<'_>, wr_id, addr| {
            // SAFETY: `local` is left alone until the completion is polled.
            unsafe {
                let mut b = qa.send_batch();
                b.atomic_fetch_add(wr_id, SIG, (addr, rkey), 2, &local.sge(0, 8).unwrap())
                    .unwrap();
                b.finish();
            }
        };
        fetch(&mut qa, 10, mr.addr() + 64);
        assert_eq!(one(&wait(e, &ca, 1), 10).status, WcStatus::Success);
        assert_eq!(&local.as_slice()[..8], &40u64.to_ne_bytes());
        assert_eq!(&mr.as_slice()[64..72], &42u64.to_ne_bytes());
        // The next 8 bytes are the region's, not the window's.
        fetch(&mut qa, 11, mr.addr() + 72);
        assert_eq!(one(&wait(e, &ca, 1), 11).status, WcStatus::RemAccessErr);
        assert_eq!(&mr.as_slice()[72..80], &[0; 8]);
        // A window without REMOTE_WRITE refuses a WRITE over the same bytes.
        let (mut qa2, _qb2) = pair(e, (&pa, &ca), (&pb, &cb));
        write(&mut qa2, 12, (mr.addr() + 64, rkey), &local, 8);
        assert_eq!(one(&wait(e, &ca, 1), 12).status, WcStatus::RemAccessErr);
        assert_eq!(&mr.as_slice()[64..72], &42u64.to_ne_bytes());
    });
}

#[test]
fn a_zero_length_bind_unbinds_a_type1_window_and_frees_its_region() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let mr = pb.register(4096, BINDABLE).unwrap();
        let mut mw = pb.alloc_mw(MwType::Type1).unwrap();
        let r = AccessFlags::REMOTE_READ;
        let bound = qb
            .bind_mw(1, SIG, &mut mw, &mr.window(0, 4096, r).unwrap())
            .unwrap();
        let unbound = qb
            .bind_mw(2, SIG, &mut mw, &mr.window(0, 0, r).unwrap())
            .unwrap();
        assert_ne!(bound, unbound);
        let c = wait(e, &cb, 2);
        assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
        let local = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        read(&mut qa, 10, (mr.addr(), unbound), &local, 4);
        assert_eq!(one(&wait(e, &ca, 1), 10).status, WcStatus::RemAccessErr);
        // Nothing holds the region any more.
        mr.destroy().unwrap();
    });
}
