//! Driver bugs found by the properties, reduced to their shortest form. Each failed when
//! found; the property run skips the steps that reach them unless `PROPS_KNOWN_BUGS` says
//! otherwise.

use super::*;

/// An RC pair on one CQ (both with the safe path), in RTS, and what they were built from.
struct Pair<'a> {
    a: QueuePair<'a, P, Rc, Rts>,
    b: QueuePair<'a, P, Rc, Rts>,
}

fn pair<'a>(
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    pool: &'a BufferPool<'a, P>,
    gid: Gid,
) -> Pair<'a> {
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 2,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let a = pd
        .qp_builder(cq, cq)
        .caps(caps)
        .pool(pool)
        .build::<Rc>()
        .unwrap();
    let b = pd
        .qp_builder(cq, cq)
        .caps(caps)
        .pool(pool)
        .build::<Rc>()
        .unwrap();
    let (qa, qb) = (a.qp_num(), b.qp_num());
    let up = |qp: QueuePair<'a, P, Rc, Reset>, peer: u32| {
        let qp = qp.init(&rc_init()).unwrap();
        let rtr = ConnectedRtr::new(peer, 0, AddressVector::new(gid, 0));
        let qp = qp.rtr(&rtr).unwrap();
        qp.rts(&ConnectedRts::new(0)).unwrap()
    };
    Pair {
        a: up(a, qb),
        b: up(b, qa),
    }
}

/// Takes buffers from `pool` until it has the one numbered `index`; fills all with 0xAA.
/// Takes every buffer the pool hands out, filled with 0xAA; the buffer of the flushed or
/// discarded receive (`index`, which the device still holds) must not be among them.
fn take_until<'p>(pool: &'p BufferPool<'p, P>, index: u32) -> Vec<Buf<'p, P>> {
    let mut held = Vec::new();
    while let Some(mut b) = pool.alloc() {
        b.as_mut_slice().fill(0xAA);
        held.push(b);
    }
    assert!(
        held.iter().all(|b| b.index() != index),
        "buffer {index} handed out again while the device holds its receive"
    );
    held
}

/// A raw SEND of `bytes` from `qp` (the bytes in their own region).
fn raw_send(
    qp: &mut QueuePair<'_, P, Rc, Rts>,
    mr: &mut MemoryRegion<'_, P>,
    wr_id: u64,
    bytes: &[u8],
) {
    mr.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
    let sge = mr.sge(0, bytes.len() as u32).unwrap();
    let mut b = qp.send_batch();
    // SAFETY: the region outlives the request and is not touched until its completion.
    unsafe { b.send(wr_id, SendFlags::SIGNALED, &[sge]).unwrap() };
    b.finish();
}

/// Driver bug: a receive completed as flushed (`to_error()`, then a poll) hands its buffer back
/// to the pool, but the device still holds the receive: QEMU only records ERR, its host QP
/// keeps it (the model does the same). The next SEND from the peer lands in the buffer after
/// the pool has handed it out again. (Property: a buffer the CPU holds is never written by the
/// device; shrunk from `SafeRecv, ToError, PollCq, <take the buffer>, RawSend from the peer`.)
#[test]
fn late_receive_after_error_writes_a_reused_buffer() {
    let model = model();
    let ctx = up(&model);
    {
        let gid = ctx
            .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let pool = pd.buffer_pool(4, 256).unwrap();
        let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let Pair { mut a, mut b } = pair(&pd, &cq, &pool, gid.gid());

        let r = pool.alloc().unwrap();
        let index = r.index();
        b.post_recv(1, r).unwrap();
        let mut b = b.to_error().unwrap();
        let c = b.poll_one().unwrap().expect("the flush");
        assert_eq!((c.wc.wr_id, c.wc.status), (1, WcStatus::WrFlushErr));
        drop(c); // no buffer: the device took the receive, so it stays parked
        let held = take_until(&pool, index);

        raw_send(&mut a, &mut mr, 2, b"late");
        // The device consumed the flushed receive: the send succeeded (the receive's late CQE
        // is dropped)...
        let mut wc = [WorkCompletion::default(); 4];
        let n = cq.poll(&mut wc).unwrap();
        let got: Vec<_> = wc[..n].iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(got, [(2, WcStatus::Success)]);
        // ...and wrote into a buffer the test owns.
        for h in &held {
            assert!(
                h.as_slice().iter().all(|&x| x == 0xAA),
                "buffer {} written by the device after its receive was flushed: {:?}",
                h.index(),
                &h.as_slice()[..8]
            );
        }
    }
    teardown(&model, ctx);
}

/// Driver bug, same cause as above after RESET: the receives are discarded (buffers back to the
/// pool, rings restarted) but QEMU keeps them in its host QP.
#[test]
fn late_receive_after_reset_writes_a_reused_buffer() {
    let model = model();
    let ctx = up(&model);
    {
        let gid = ctx
            .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let pool = pd.buffer_pool(4, 256).unwrap();
        let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let Pair { mut a, b } = pair(&pd, &cq, &pool, gid.gid());

        let r = pool.alloc().unwrap();
        let index = r.index();
        let mut b = b;
        b.post_recv(1, r).unwrap();
        let _b = b.reset().unwrap();
        assert_eq!(
            pool.free_count(),
            3,
            "RESET keeps the buffer the device took (parked until the QP is destroyed)"
        );
        let held = take_until(&pool, index);

        raw_send(&mut a, &mut mr, 2, b"late");
        let mut wc = [WorkCompletion::default(); 4];
        let n = cq.poll(&mut wc).unwrap();
        let got: Vec<_> = wc[..n].iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(
            got,
            [(2, WcStatus::Success)],
            "the device consumed the discarded receive"
        );
        for h in &held {
            assert!(
                h.as_slice().iter().all(|&x| x == 0xAA),
                "buffer {} written by the device after its receive was discarded: {:?}",
                h.index(),
                &h.as_slice()[..8]
            );
        }
    }
    teardown(&model, ctx);
}

/// Driver bug, same cause, seen from the poller: after part of the receive queue was flushed,
/// the device's CQE for the receive it still held (the oldest, already reported flushed) is
/// refused as `Protocol` ("CQE wr_id (not the next request)") instead of being dropped as late.
#[test]
fn late_receive_after_partial_flush_is_refused() {
    let model = model();
    let ctx = up(&model);
    {
        let gid = ctx
            .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let pool = pd.buffer_pool(4, 256).unwrap();
        let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let recv_mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let Pair { mut a, mut b } = pair(&pd, &cq, &pool, gid.gid());

        // SAFETY: the region outlives the QP and is not touched while the receives are posted.
        unsafe {
            b.post_recv_raw(1, &[recv_mr.sge(0, 64).unwrap()]).unwrap();
            b.post_recv_raw(2, &[recv_mr.sge(64, 64).unwrap()]).unwrap();
        }
        let _b = b.to_error().unwrap();
        let mut wc = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut wc[..1]).unwrap(), 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::WrFlushErr));

        raw_send(&mut a, &mut mr, 3, b"late"); // consumes receive 1 on the device
        let n = cq
            .poll(&mut wc)
            .expect("the late CQE of receive 1 is dropped, not refused");
        let got: Vec<_> = wc[..n].iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(got, [(3, WcStatus::Success), (2, WcStatus::WrFlushErr)]);
    }
    teardown(&model, ctx);
}

/// Driver bug: an SRQ takes more receives than `max_wr` outstanding. Its credit is the ring's
/// free slots, but the device (QEMU, and the model) drains the ring at every doorbell, so the
/// driver never says `QueueFull` while completions are still to come, and the CQ room reserved
/// for the SRQ (`max_wr` per QP) is too small: with `max_wr` 1, a 1-entry receive CQ, and one
/// receive posted before each SEND from the peer, the second and third receives are consumed
/// but their CQEs dropped on the full CQ (model: "CQ full: QEMU drops the CQE silently"); they
/// never complete. (Property: caps hold — at most `max_wr` outstanding; shrunk from
/// `srq_wr: 1, SrqRecv x1, SrqRecv x1`.)
#[test]
fn srq_accepts_more_than_max_wr_outstanding() {
    let model = model();
    let ctx = up(&model);
    {
        let _gid = ctx
            .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let srq = pd
            .create_srq(SrqAttr {
                max_wr: 1,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        fn wr(wr_id: u64, sg_list: &[Sge]) -> RecvWr<'_> {
            RecvWr { wr_id, sg_list }
        }
        let (s1, s2) = ([mr.sge(0, 64).unwrap()], [mr.sge(64, 64).unwrap()]);
        // SAFETY: the region outlives the SRQ and is not touched while the receives are posted.
        unsafe { srq.post_recv_raw(&[wr(1, &s1)]).unwrap() };
        // One receive outstanding (no completion yet) in an SRQ of one.
        let r = unsafe { srq.post_recv_raw(&[wr(2, &s2)]) };
        assert_eq!(
            r,
            Err(Error::QueueFull {
                queue: Queue::Srq,
                free: 0
            })
        );
    }
    teardown(&model, ctx);
}
