//! Exactly once through every lifecycle, on the PVRDMA model: what a destroy, a RESET and the
//! error state leave behind on the CQs (nothing of the QP's earlier life may complete later,
//! and a CQ with nothing to report reads empty), the safe path's buffers across flushes and
//! reused ring slots, and what a device that rewrites the memory it was given can and cannot
//! make the driver do.
//!
//! Every test runs in `lab`, which ends with every DMA page back and no violation of what QEMU
//! would mishandle.

mod common;

use core::future::Future;
use core::task::{Context as TaskContext, Poll, Waker};

use bareverbs::verbs::*;
use common::*;

type RcQp<'a> = QueuePair<'a, P, Rc, Rts>;

/// Polls `f` once with a waker that does nothing.
fn once<F: Future>(f: F) -> Poll<F::Output> {
    let mut cx = TaskContext::from_waker(Waker::noop());
    core::pin::pin!(f).poll(&mut cx)
}

/// An RC QP on `cq` (both roles), connected to itself.
fn rc_self<'a>(
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    gid: Gid,
    c: QpCaps,
) -> RcQp<'a> {
    let qp = pd.qp_builder(cq, cq).caps(c).build::<Rc>().unwrap();
    let qpn = qp.qp_num();
    rc_up(qp, qpn, gid, AccessFlags::empty())
}

// ---------------------------------------------------------------------------------------------
// Destroy

#[test]
fn a_qp_destroyed_in_err_leaves_its_cq_quiet() {
    lab(|_, _, pd, cq, gid| {
        let qp = rc_self(pd, cq, gid, caps(4, 4, 1));
        let qp = qp.to_error().unwrap();
        // Destroyed before any poll took its (empty) flush.
        qp.destroy().unwrap();
        assert!(drain(cq).is_empty());
        assert!(
            once(cq.ready()).is_pending(),
            "the CQ reads ready with nothing to report"
        );
        assert!(once(cq.next_completion()).is_pending());
    });
}

// ---------------------------------------------------------------------------------------------
// A device that rewrites memory it was given

#[test]
fn a_rewritten_cq_consumer_index_neither_makes_the_cq_ready_nor_a_waiter_spin() {
    lab(|model, _, pd, cq, gid| {
        let qp = rc_self(pd, cq, gid, caps(4, 4, 1));
        // The word only the driver writes, rewritten: readiness is the driver's own business.
        model.set_cq_cons(cq.raw().handle(), 5);
        assert!(
            once(cq.ready()).is_pending(),
            "the CQ reads ready with nothing to report"
        );
        assert!(once(cq.next_completion()).is_pending());
        assert!(drain(cq).is_empty());
        drop(qp);
        // The driver hands back its own index again at its next poll: put the word back as
        // it was so that the model's teardown checks see a sane ring.
        model.set_cq_cons(cq.raw().handle(), 0);
    });
}

/// A receive CQE of QP `handle` with `wr_id`, as the device would write it.
fn recv_cqe(handle: u32, wr_id: u64) -> [u8; 64] {
    let mut e = [0u8; 64];
    e[0..8].copy_from_slice(&wr_id.to_le_bytes());
    e[8..16].copy_from_slice(&u64::from(handle).to_le_bytes());
    e[0x10..0x14].copy_from_slice(&128u32.to_le_bytes()); // RECV
    e
}

#[test]
fn a_wr_id_the_device_rewrote_in_the_ring_never_reaches_the_application() {
    const FORGED: u64 = 0xF0F0_0BAD;
    lab(|model, _, pd, cq, gid| {
        let mut qp = rc_self(pd, cq, gid, caps(4, 4, 1));
        let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let sge = mr.sge(0, 64).unwrap();
        let mut b = qp.recv_batch();
        // SAFETY: the region outlives the request (it completes or is flushed below).
        unsafe { b.recv(0x1111, &[sge]).unwrap() };
        b.finish();
        // The device rewrites the request's wr_id in the ring and completes it with that.
        let handle = qp.raw().handle();
        model.set_wqe_wr_id(handle, true, 0, FORGED);
        model.inject_raw_cqe(cq.raw().handle(), recv_cqe(handle, FORGED));
        let mut wc = [WorkCompletion::default(); 4];
        let got = cq.poll(&mut wc);
        if let Ok(n) = got {
            assert!(
                wc[..n].iter().all(|c| c.wr_id != FORGED),
                "a forged wr_id reached the application: {:?}",
                &wc[..n]
            );
        }
        let qp = qp.to_error().unwrap();
        // The request completes once, flushed, with the wr_id it was posted with.
        let ids: Vec<u64> = drain(cq).iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, [0x1111]);
        drop(qp);
        drop(mr);
    });
}

#[test]
fn an_srq_completion_reports_only_a_wr_id_posted_to_the_srq() {
    const FORGED: u64 = 0xF0F0_0BAD;
    lab(|model, _, pd, cq, gid| {
        let srq = pd
            .create_srq(SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let qp = pd
            .qp_builder(cq, cq)
            .caps(caps(4, 0, 1))
            .srq(&srq)
            .build::<Rc>()
            .unwrap();
        let qpn = qp.qp_num();
        let qp = rc_up(qp, qpn, gid, AccessFlags::empty());
        let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let sge = mr.sge(0, 64).unwrap();
        let wrs = [RecvWr {
            wr_id: 0x5,
            sg_list: core::slice::from_ref(&sge),
        }];
        // SAFETY: the region outlives the request (dropped last).
        unsafe { srq.post_recv_raw(&wrs).unwrap() };
        // A receive CQE for the QP with a wr_id never posted: refused, not reported.
        let handle = qp.raw().handle();
        model.inject_raw_cqe(cq.raw().handle(), recv_cqe(handle, FORGED));
        let mut wc = [WorkCompletion::default(); 2];
        match cq.poll(&mut wc) {
            Ok(n) => assert!(
                wc[..n].iter().all(|c| c.wr_id != FORGED),
                "a forged wr_id reached the application: {:?}",
                &wc[..n]
            ),
            Err(e) => assert!(matches!(e, bareverbs::Error::Protocol { .. }), "{e:?}"),
        }
        // The receive posted completes, once.
        model.inject_raw_cqe(cq.raw().handle(), recv_cqe(handle, 0x5));
        let got: Vec<u64> = drain(cq).iter().map(|c| c.wr_id).collect();
        assert_eq!(got, [0x5]);
        model.inject_raw_cqe(cq.raw().handle(), recv_cqe(handle, 0x5));
        assert!(
            cq.poll(&mut wc).is_err(),
            "a second completion of one receive"
        );
        drop(qp);
        drop(srq);
        drop(mr);
    });
}

// ---------------------------------------------------------------------------------------------
// The safe path's buffers

#[test]
fn a_parked_receive_buffer_comes_back_at_destroy_even_after_its_slot_is_reused() {
    lab(|_, _, pd, cq, gid| {
        let pool = pd.buffer_pool(4, 256).unwrap();
        let qp = pd
            .qp_builder(cq, cq)
            .caps(caps(1, 1, 1))
            .pool(&pool)
            .build::<Rc>()
            .unwrap();
        let qpn = qp.qp_num();
        let mut qp = rc_up(qp, qpn, gid, AccessFlags::empty());
        // The device takes the receive (no send ever comes for it).
        qp.post_recv(1, pool.alloc().unwrap()).unwrap();
        let mut qp = qp.to_error().unwrap();
        // Flushed: its buffer stays out of the pool (the device may still write it).
        let c = qp.poll_one().unwrap().expect("the flush");
        assert_eq!((c.wc.wr_id, c.wc.status), (1, WcStatus::WrFlushErr));
        assert!(c.buf.is_none());
        assert_eq!(pool.free_count(), 3);
        // The same ring slot again, in ERR: flushed with its buffer.
        qp.post_recv(2, pool.alloc().unwrap()).unwrap();
        let c = qp.poll_one().unwrap().expect("the flush");
        assert_eq!(c.wc.wr_id, 2);
        drop(c);
        assert_eq!(pool.free_count(), 3);
        qp.destroy().unwrap();
        assert_eq!(pool.free_count(), 4, "a parked buffer was lost");
    });
}

// ---------------------------------------------------------------------------------------------
// RESET and destroy: nothing of a QP's earlier life completes later

const QKEY: u32 = 0x1111_0000;

/// Posts a signaled SEND without data from datagram QP `qp` to itself.
fn send_self<T: Datagram>(
    qp: &mut QueuePair<'_, P, T, Rts>,
    ah: &AddressHandle<'_, P>,
    wr_id: u64,
) {
    let qpn = qp.qp_num();
    let mut b = qp.send_batch();
    // SAFETY: no SGE: the request names no memory.
    unsafe {
        b.send_to(wr_id, SendFlags::SIGNALED, (ah, qpn, QKEY), &[])
            .unwrap()
    };
    b.finish();
}

/// Posts a receive without buffers to `qp`.
fn recv_none<T: Transport, S: CanRecv>(qp: &mut QueuePair<'_, P, T, S>, wr_id: u64) {
    let mut b = qp.recv_batch();
    // SAFETY: no SGE: the request names no memory.
    unsafe { b.recv(wr_id, &[]).unwrap() };
    b.finish();
}

fn gsi<'a>(
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
) -> QueuePair<'a, P, Gsi, Reset> {
    pd.qp_builder(cq, cq)
        .caps(caps(4, 4, 1))
        .build::<Gsi>()
        .unwrap()
}

#[test]
fn after_a_reset_no_completion_of_the_qps_earlier_life_appears() {
    lab(|_, _, pd, cq, gid| {
        let ah = pd.create_ah(&AddressVector::new(gid, 0)).unwrap();
        let mut qp = gsi(pd, cq).ready(QKEY, 0).unwrap();
        // A completion left in the CQ, and a receive the device took and never completed.
        send_self(&mut qp, &ah, 0x51);
        let qp = qp.reset().unwrap();
        let mut qp = qp.ready(QKEY, 0).unwrap();
        send_self(&mut qp, &ah, 0x52);
        let got: Vec<u64> = drain(cq).iter().map(|c| c.wr_id).collect();
        assert_eq!(got, [0x52], "only the new life's completion");
        drop(qp);
    });
}

#[test]
fn the_completion_owed_for_a_flushed_receive_is_not_taken_for_a_later_one() {
    lab(|_, _, pd, cq, gid| {
        let ah = pd.create_ah(&AddressVector::new(gid, 0)).unwrap();
        let ud = || {
            pd.qp_builder(cq, cq)
                .caps(caps(4, 4, 1))
                .build::<Ud>()
                .unwrap()
                .ready(QKEY, 0)
                .unwrap()
        };
        let (mut a, mut b) = (ud(), ud());
        let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let sge = mr.sge(0, 4096).unwrap();
        // B's receive: the device takes it; B goes to ERR and the driver flushes it.
        let mut batch = b.recv_batch();
        // SAFETY: the region outlives every request naming it (dropped last).
        unsafe { batch.recv(7, &[sge]).unwrap() };
        batch.finish();
        let mut b = b.to_error().unwrap();
        let got: Vec<(u64, WcStatus)> = drain(cq).iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(got, [(7, WcStatus::WrFlushErr)]);
        // Another receive with the same wr_id, posted in ERR (never shown to the device).
        recv_none(&mut b, 7);
        // The device now completes the receive it took: that CQE belongs to the first one.
        let (bqpn, _) = (b.qp_num(), ());
        let mut batch = a.send_batch();
        // SAFETY: no SGE: the request names no memory.
        unsafe {
            batch
                .send_to(0xA, SendFlags::SIGNALED, (&ah, bqpn, QKEY), &[])
                .unwrap()
        };
        batch.finish();
        let got: Vec<(u64, WcStatus)> = drain(cq).iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            got,
            [(0xA, WcStatus::Success), (7, WcStatus::WrFlushErr)],
            "the second receive must complete once, flushed"
        );
        drop((a, b));
        drop(mr);
    });
}

#[test]
fn after_a_destroy_the_next_qp_under_its_handle_sees_none_of_its_completions() {
    lab(|_, _, pd, cq, gid| {
        let ah = pd.create_ah(&AddressVector::new(gid, 0)).unwrap();
        let mut qp = gsi(pd, cq).ready(QKEY, 0).unwrap();
        send_self(&mut qp, &ah, 0x61);
        send_self(&mut qp, &ah, 0x62);
        let handle = qp.raw().handle();
        drop(qp);
        // GSI: the same handle again.
        let mut qp = gsi(pd, cq).ready(QKEY, 0).unwrap();
        assert_eq!(qp.raw().handle(), handle);
        send_self(&mut qp, &ah, 0x63);
        let got: Vec<u64> = drain(cq).iter().map(|c| c.wr_id).collect();
        assert_eq!(got, [0x63]);
        drop(qp);
        // All the room the QPs held on the CQ is free: a QP needing the whole CQ fits.
        let big = pd.qp_builder(cq, cq).caps(caps(32, 32, 1)).build::<Ud>();
        assert!(big.is_ok(), "{:?}", big.err());
    });
}

// ---------------------------------------------------------------------------------------------
// Deliberate leaks are logged

std::thread_local! {
    static WARNINGS: core::cell::Cell<u32> = const { core::cell::Cell::new(0) };
}

/// Counts the driver's warnings on the calling thread.
struct Warnings;

impl log::Log for Warnings {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }

    fn log(&self, r: &log::Record<'_>) {
        if r.level() <= log::Level::Warn {
            WARNINGS.with(|w| w.set(w.get() + 1));
        }
    }

    fn flush(&self) {}
}

static LOGGER: Warnings = Warnings;

fn warnings() -> u32 {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        log::set_logger(&LOGGER).expect("one logger");
        log::set_max_level(log::LevelFilter::Warn);
    });
    WARNINGS.with(core::cell::Cell::get)
}

#[test]
fn a_cq_answered_with_garbage_and_not_destroyed_is_kept_with_a_warning() {
    let model = common::model();
    let ctx = up(&model);
    let before = warnings();
    // CREATE_CQ answered with garbage, then the DESTROY_CQ that undoes it fails.
    model.garbage_next(bareverbs_model::Garbage::Payload);
    model.fail_command(2, 5);
    assert!(ctx.create_cq(16).is_err());
    assert_eq!(
        warnings() - before,
        1,
        "a deliberate leak without its warning"
    );
    drop(ctx);
    // (The CQ's pages are kept on purpose: the device may use them.)
    assert!(model.outstanding_pages() > 0);
}

// ---------------------------------------------------------------------------------------------
// A GID whose unbind had an unknown outcome

#[test]
fn a_gid_whose_unbind_timed_out_is_not_sent_from() {
    lab(|model, ctx, pd, cq, _| {
        let gid = Gid::link_local_from_mac([0x52, 0x54, 0, 0, 0, 0x77]);
        let g = ctx.bind_gid(1, gid).unwrap();
        let ah = pd.create_ah(&AddressVector::new(gid, 1)).unwrap();
        let mut qp = pd
            .qp_builder(cq, cq)
            .caps(caps(4, 4, 1))
            .build::<Ud>()
            .unwrap()
            .ready(QKEY, 0)
            .unwrap();
        // DESTROY_BIND gets no answer: the device may or may not have unbound the GID.
        model.set_silent(true);
        let e = g.unbind().unwrap_err();
        model.set_silent(false);
        assert!(matches!(e, bareverbs::Error::Timeout { .. }), "{e:?}");
        let qpn = qp.qp_num();
        let mut b = qp.send_batch();
        // SAFETY: no SGE: the request names no memory.
        let r = unsafe { b.send_to(1, SendFlags::SIGNALED, (&ah, qpn, QKEY), &[]) };
        assert!(r.is_err(), "a send from a GID perhaps unbound was posted");
        drop(b);
        drop(qp);
    });
}
