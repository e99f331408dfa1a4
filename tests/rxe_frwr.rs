//! Fast registration, local invalidation and SEND with invalidate on the software RoCE
//! device, between two devices on the in-memory segment: a region registered by a work
//! request under a new key, reached remotely at its IOVA, invalidated locally or by the
//! peer's SEND (the receive completion naming the key), and the hostile cases — a SEND whose
//! IETH names a key of another PD, a registered region's, a window of another QP, or nothing
//! — which fail at both ends, flush every other request once and invalidate nothing.

mod common;
mod mw_common;
mod pair;

use bareverbs::verbs::*;
use mw_common::*;
use pair::on_rxe;

const IOVA: u64 = 0x7_0000_0000;
const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

#[test]
fn fast_registration_then_remote_access_then_local_invalidation() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let data = pb.register(8192, AccessFlags::LOCAL_WRITE).unwrap();
        let mut frmr = pb.alloc_fast_reg_mr(2).unwrap();
        assert_eq!(frmr.max_pages(), 2);
        let old = frmr.key();
        let reg = FastReg {
            sge: data.sge(4096, 4096).unwrap(),
            iova: IOVA,
            access: RW,
        };
        let mut batch = qb.send_batch();
        let key = batch.reg_mr(1, SIG, &mut frmr, 0x5A, &reg).unwrap();
        batch.finish();
        assert_eq!((key & !0xFF, key & 0xFF), (old & !0xFF, 0x5A));
        assert_eq!(frmr.key(), key);
        let c = wait(e, &cb, 1);
        assert_eq!(
            (c[0].wr_id, c[0].opcode, c[0].status),
            (1, WcOpcode::RegMr, WcStatus::Success)
        );

        // A writes at the IOVA: the bytes land in B's data region, 4096 further on.
        let mut local = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        local.as_mut_slice()[..6].copy_from_slice(b"frwr!!");
        write(&mut qa, 10, (IOVA + 16, key), &local, 6);
        assert_eq!(wait(e, &ca, 1)[0].status, WcStatus::Success);
        assert_eq!(&data.as_slice()[4096 + 16..4096 + 22], b"frwr!!");
        local.as_mut_slice()[..6].fill(0);
        read(&mut qa, 11, (IOVA + 16, key), &local, 6);
        assert_eq!(wait(e, &ca, 1)[0].status, WcStatus::Success);
        assert_eq!(&local.as_slice()[..6], b"frwr!!");
        // The data region cannot go while the registration maps it.
        let (data, err) = data.destroy().unwrap_err();
        assert!(
            matches!(err, bareverbs::Error::InUse { count: 1, .. }),
            "{err:?}"
        );

        let mut batch = qb.send_batch();
        batch.local_inv(2, SIG, key).unwrap();
        batch.finish();
        let c = wait(e, &cb, 1);
        assert_eq!(
            (c[0].wr_id, c[0].opcode, c[0].status),
            (2, WcOpcode::LocalInv, WcStatus::Success)
        );
        write(&mut qa, 12, (IOVA + 16, key), &local, 6);
        let c = wait(e, &ca, 1);
        assert_eq!((c[0].wr_id, c[0].status), (12, WcStatus::RemAccessErr));
        drop(frmr);
        data.destroy().unwrap();
    });
}

#[test]
fn an_invalid_registration_completes_in_error_and_flushes_the_rest_once() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (_qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let data = pb.register(3 * 4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mut frmr = pb.alloc_fast_reg_mr(2).unwrap();
        // Three pages into a region of two.
        let reg = FastReg {
            sge: data.sge(0, 3 * 4096).unwrap(),
            iova: IOVA,
            access: RW,
        };
        let mut batch = qb.send_batch();
        batch.reg_mr(1, SIG, &mut frmr, 1, &reg).unwrap();
        // SAFETY: flushed; `data` is left alone meanwhile.
        unsafe { batch.send(2, SIG, &[data.sge(0, 8).unwrap()]).unwrap() };
        batch.local_inv(3, SIG, frmr.key()).unwrap();
        batch.finish();
        let c = settle_all(e, &cb);
        assert_eq!(c.len(), 3, "{c:?}");
        assert_eq!(
            (one(&c, 1).opcode, one(&c, 1).status),
            (WcOpcode::RegMr, WcStatus::LocQpOpErr)
        );
        assert_eq!(one(&c, 2).status, WcStatus::WrFlushErr);
        assert_eq!(one(&c, 3).status, WcStatus::WrFlushErr);
        assert_eq!(state(&qb), QpState::Err);
        drop(frmr);
        data.destroy().unwrap(); // nothing maps it
    });
}

#[test]
fn registering_a_registered_region_again_needs_an_invalidation() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (_qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let data = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mut frmr = pb.alloc_fast_reg_mr(1).unwrap();
        let reg = FastReg {
            sge: data.sge(0, 4096).unwrap(),
            iova: IOVA,
            access: RW,
        };
        let mut batch = qb.send_batch();
        let k1 = batch.reg_mr(1, SIG, &mut frmr, 1, &reg).unwrap();
        batch.local_inv(2, SIG, k1).unwrap();
        batch.reg_mr(3, SIG, &mut frmr, 2, &reg).unwrap();
        batch.reg_mr(4, SIG, &mut frmr, 3, &reg).unwrap(); // still registered
        batch.finish();
        let c = settle_all(e, &cb);
        let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            got,
            [
                (1, WcStatus::Success),
                (2, WcStatus::Success),
                (3, WcStatus::Success),
                (4, WcStatus::LocQpOpErr)
            ]
        );
    });
}

/// Posts a receive on `qb` and a SEND with invalidate of `rkey` on `qa`, with three more
/// requests behind each, which the error (if any) flushes.
fn send_with_inv(
    qa: &mut RcQp<'_>,
    qb: &mut RcQp<'_>,
    rkey: u32,
    (src, dst): (&MemoryRegion<'_, pair::R>, &MemoryRegion<'_, pair::R>),
) {
    // SAFETY: the buffers are left alone until every completion was polled.
    unsafe {
        let mut r = qb.recv_batch();
        for i in 0..4 {
            r.recv(100 + i, &[dst.sge(64 * i as u32, 64).unwrap()])
                .unwrap();
        }
        r.finish();
        let mut s = qa.send_batch();
        s.send_with_inv(1, SIG, rkey, &[src.sge(0, 16).unwrap()])
            .unwrap();
        for i in 2..5 {
            s.send(i, SIG, &[src.sge(0, 16).unwrap()]).unwrap();
        }
        s.finish();
    }
}

#[test]
fn send_with_invalidate_invalidates_the_peers_registration() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let data = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mut frmr = pb.alloc_fast_reg_mr(1).unwrap();
        let reg = FastReg {
            sge: data.sge(0, 4096).unwrap(),
            iova: IOVA,
            access: RW,
        };
        let mut batch = qb.send_batch();
        let key = batch.reg_mr(1, SIG, &mut frmr, 9, &reg).unwrap();
        batch.finish();
        assert_eq!(wait(e, &cb, 1)[0].status, WcStatus::Success);
        let mut src = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        src.as_mut_slice()[..16].copy_from_slice(b"invalidate this!");
        let dst = pb.register(256, AccessFlags::LOCAL_WRITE).unwrap();
        send_with_inv(&mut qa, &mut qb, key, (&src, &dst));
        let sent = wait(e, &ca, 4);
        assert!(
            sent.iter().all(|c| c.status == WcStatus::Success),
            "{sent:?}"
        );
        assert_eq!(one(&sent, 1).opcode, WcOpcode::Send);
        let got = wait(e, &cb, 4);
        let r = one(&got, 100);
        assert_eq!(
            (r.status, r.opcode, r.byte_len),
            (WcStatus::Success, WcOpcode::Recv, 16)
        );
        assert!(r.flags.contains(WcFlags::WITH_INV) && !r.flags.contains(WcFlags::WITH_IMM));
        assert_eq!(r.invalidated_rkey(), Some(key));
        assert_eq!(&dst.as_slice()[..16], b"invalidate this!");
        assert_eq!(one(&got, 101).invalidated_rkey(), None, "a plain SEND");
        // The key is dead: A's write through it fails.
        write(&mut qa, 20, (IOVA, key), &src, 8);
        assert_eq!(one(&wait(e, &ca, 1), 20).status, WcStatus::RemAccessErr);
    });
}

#[test]
fn send_with_invalidate_of_a_key_not_the_receivers_fails_at_both_ends() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let other_pd = e.b.alloc_pd().unwrap();
        let (ca, cb) = (e.a.create_cq(256).unwrap(), e.b.create_cq(256).unwrap());
        let src = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        let dst = pb.register(256, AccessFlags::LOCAL_WRITE).unwrap();
        let local = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        // A registered region of B's PD (its rkey is valid, but not invalidatable).
        let plain = pb.register(4096, RW | AccessFlags::MW_BIND).unwrap();
        // A fast registration in another PD of B.
        let other_data = other_pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mut other_frmr = other_pd.alloc_fast_reg_mr(1).unwrap();
        let (_oa, mut ob) = pair(e, (&pa, &ca), (&other_pd, &cb));
        let reg = FastReg {
            sge: other_data.sge(0, 4096).unwrap(),
            iova: IOVA,
            access: RW,
        };
        let mut batch = ob.send_batch();
        let other_key = batch.reg_mr(1, SIG, &mut other_frmr, 1, &reg).unwrap();
        batch.finish();
        assert_eq!(wait(e, &cb, 1)[0].status, WcStatus::Success);
        // A type 2 window of B's PD bound to another QP than the receiver.
        let (mut qa_w, mut qb_w) = pair(e, (&pa, &ca), (&pb, &cb));
        let mut mw = pb.alloc_mw(MwType::Type2).unwrap();
        let bind = plain.window(0, 4096, AccessFlags::REMOTE_READ).unwrap();
        let mut batch = qb_w.send_batch();
        let mw_key = batch.bind_mw(1, SIG, &mut mw, 7, &bind).unwrap();
        batch.finish();
        assert_eq!(wait(e, &cb, 1)[0].status, WcStatus::Success);

        // A fast registration of B's own PD: keys that name its slot but not it.
        let own_data = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mut own = pb.alloc_fast_reg_mr(1).unwrap();
        let reg_own = FastReg {
            sge: own_data.sge(0, 4096).unwrap(),
            iova: IOVA,
            access: RW,
        };
        let mut batch = qb_w.send_batch();
        let own_key = batch.reg_mr(2, SIG, &mut own, 0x44, &reg_own).unwrap();
        batch.finish();
        assert_eq!(wait(e, &cb, 1)[0].status, WcStatus::Success);
        let cases = [
            ("its slot, another low byte", own_key ^ 0x01),
            ("its slot, other high bits", own_key ^ 0x0001_0000),
            ("a registered region's rkey", plain.rkey()),
            ("another PD's fast registration", other_key),
            ("a type 2 window of another QP", mw_key),
            ("nothing", 0xDEAD_BE00 | 0x33),
            ("key 0", 0),
        ];
        for (what, rkey) in cases {
            let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
            send_with_inv(&mut qa, &mut qb, rkey, (&src, &dst));
            let sent = settle_all(e, &ca);
            let got = settle_all(e, &cb);
            assert_eq!(
                one(&sent, 1).status,
                WcStatus::RemInvReqErr,
                "{what}: {sent:?}"
            );
            for i in 2..5 {
                assert_eq!(one(&sent, i).status, WcStatus::WrFlushErr, "{what}");
            }
            assert_eq!(sent.len(), 4, "{what}: each once");
            assert_eq!(
                one(&got, 100).status,
                WcStatus::RemInvReqErr,
                "{what}: {got:?}"
            );
            assert!(!one(&got, 100).flags.contains(WcFlags::WITH_INV));
            for i in 101..104 {
                assert_eq!(one(&got, i).status, WcStatus::WrFlushErr, "{what}");
            }
            assert_eq!(got.len(), 4, "{what}: each once");
            assert_eq!(
                (state(&qa), state(&qb)),
                (QpState::Err, QpState::Err),
                "{what}"
            );
        }
        // Nothing was invalidated: the window still serves its QP, the registration its PD.
        read(&mut qa_w, 30, (plain.addr(), mw_key), &local, 8);
        assert_eq!(one(&wait(e, &ca, 1), 30).status, WcStatus::Success);
        let (mut oa2, _ob2) = pair(e, (&pa, &ca), (&other_pd, &cb));
        read(&mut oa2, 31, (IOVA, other_key), &local, 8);
        assert_eq!(one(&wait(e, &ca, 1), 31).status, WcStatus::Success);
        read(&mut qa_w, 32, (plain.addr(), plain.rkey()), &local, 8);
        assert_eq!(one(&wait(e, &ca, 1), 32).status, WcStatus::Success);
        read(&mut qa_w, 33, (IOVA, own_key), &local, 8);
        assert_eq!(one(&wait(e, &ca, 1), 33).status, WcStatus::Success);
    });
}

#[test]
fn send_with_invalidate_is_rc_only_and_never_inline() {
    on_rxe(|e| {
        let pa = e.a.alloc_pd().unwrap();
        let ca = e.a.create_cq(16).unwrap();
        let mr = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
        let uc = pa.qp_builder(&ca, &ca).build::<Uc>().unwrap();
        let av = e.to_b;
        let uc = uc.init(&ConnectedInit::default()).unwrap();
        let uc = uc.rtr(&ConnectedRtr::new(0x100, 0, av)).unwrap();
        let mut uc = uc.rts(&ConnectedRts::new(0)).unwrap();
        let mut b = uc.send_batch();
        // SAFETY: refused before the device sees it.
        let r = unsafe { b.send_with_inv(1, SIG, 0x100, &[mr.sge(0, 8).unwrap()]) };
        let want = bareverbs::error::Feature::OpcodeForQpType;
        assert_eq!(
            r.err(),
            Some(bareverbs::Error::Unsupported(
                bareverbs::error::Unsupported::Feature(want)
            ))
        );
        b.finish();
    });
}

#[test]
fn send_with_invalidate_headers_are_laid_out_as_linux_rxe_lays_them_out() {
    use bareverbs::device::rxe::wire::bth::{Bth, DEFAULT_PKEY, Headers, Layout, opcode};
    // ib_pack.h: SEND_LAST_WITH_INVALIDATE 0x16, SEND_ONLY_WITH_INVALIDATE 0x17 (RC); rxe's
    // opcode table: BTH then the 4-byte IETH (the rkey, big-endian), then the payload.
    assert_eq!(
        (opcode::RC_SEND_LAST_INV, opcode::RC_SEND_ONLY_INV),
        (0x16, 0x17)
    );
    for op in [0x16, 0x17] {
        let layout = Layout::of(op).unwrap();
        assert_eq!(layout.header_len(), 16, "opcode {op:#x}");
        assert!(layout.payload());
    }
    let mut h = Headers::new(Bth {
        opcode: opcode::RC_SEND_ONLY_INV,
        se: false,
        pad: 0,
        pkey: DEFAULT_PKEY,
        dest_qp: 0x12,
        ack_req: true,
        psn: 0xABCD,
    });
    h.imm = Some(0x1122_3344);
    let mut out = [0u8; 64];
    let n = h.write(&mut out).unwrap();
    #[rustfmt::skip]
    let want: [u8; 16] = [
        0x17, 0x00, 0xFF, 0xFF, // opcode, SE/M/pad/TVer, P_Key
        0x00, 0x00, 0x00, 0x12, // reserved, destination QP
        0x80, 0x00, 0xAB, 0xCD, // AckReq, PSN
        0x11, 0x22, 0x33, 0x44, // IETH: the rkey
    ];
    assert_eq!(&out[..n], &want);
    let (back, _) = Headers::parse(&want).unwrap();
    assert_eq!(back, h);
}

#[test]
fn local_requests_complete_in_order_behind_writes_and_reads() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, _qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let remote = pb.register(4096, RW).unwrap();
        let local = pa.register(8192, AccessFlags::LOCAL_WRITE).unwrap();
        let mut frmr = pa.alloc_fast_reg_mr(1).unwrap();
        let reg = FastReg {
            sge: local.sge(4096, 4096).unwrap(),
            iova: IOVA,
            access: AccessFlags::LOCAL_WRITE,
        };
        let target = (remote.addr(), remote.rkey());
        let mut b = qa.send_batch();
        // SAFETY: the buffers are left alone until every completion was polled.
        unsafe {
            b.rdma_write(1, SIG, target, &[local.sge(0, 3000).unwrap()])
                .unwrap();
            let k1 = b.reg_mr(2, SIG, &mut frmr, 1, &reg).unwrap();
            // A READ into the fast-registered memory, by its key and IOVA.
            let into = Sge {
                addr: IOVA + 8,
                length: 100,
                lkey: k1,
            };
            b.rdma_read(3, SIG, target, &[into]).unwrap();
            b.local_inv(4, SIG, k1).unwrap();
            b.rdma_write(5, SIG, target, &[local.sge(0, 10).unwrap()])
                .unwrap();
            b.local_inv(6, SIG | SendFlags::FENCE, k1).unwrap(); // already invalid: allowed
        }
        b.finish();
        let c = wait(e, &ca, 6);
        let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.opcode, c.status)).collect();
        use WcOpcode::*;
        let ok = WcStatus::Success;
        assert_eq!(
            got,
            [
                (1, RdmaWrite, ok),
                (2, RegMr, ok),
                (3, RdmaRead, ok),
                (4, LocalInv, ok),
                (5, RdmaWrite, ok),
                (6, LocalInv, ok)
            ]
        );
        assert_eq!(
            &local.as_slice()[4096 + 8..4096 + 108],
            &remote.as_slice()[..100]
        );
    });
}

#[test]
fn a_multi_packet_send_with_invalidate_carries_the_ieth_on_its_last_packet() {
    on_rxe(|e| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let data = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mut frmr = pb.alloc_fast_reg_mr(1).unwrap();
        let reg = FastReg {
            sge: data.sge(0, 4096).unwrap(),
            iova: IOVA,
            access: RW,
        };
        let mut batch = qb.send_batch();
        let key = batch.reg_mr(1, SIG, &mut frmr, 3, &reg).unwrap();
        batch.finish();
        assert_eq!(wait(e, &cb, 1)[0].status, WcStatus::Success);
        let mut src = pa.register(3000, AccessFlags::LOCAL_WRITE).unwrap();
        for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let dst = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        // SAFETY: the buffers are left alone until the completions were polled.
        unsafe {
            let mut r = qb.recv_batch();
            r.recv(100, &[dst.sge(0, 4096).unwrap()]).unwrap();
            r.finish();
            let mut s = qa.send_batch();
            s.send_with_inv(1, SIG, key, &[src.sge(0, 3000).unwrap()])
                .unwrap();
            s.finish();
        }
        assert_eq!(one(&wait(e, &ca, 1), 1).status, WcStatus::Success);
        let r = one(&wait(e, &cb, 1), 100);
        assert_eq!(
            (r.status, r.byte_len, r.invalidated_rkey()),
            (WcStatus::Success, 3000, Some(key))
        );
        assert_eq!(&dst.as_slice()[..3000], &src.as_slice()[..3000]);
        write(&mut qa, 2, (IOVA, key), &src, 8);
        assert_eq!(one(&wait(e, &ca, 1), 2).status, WcStatus::RemAccessErr);
    });
}
