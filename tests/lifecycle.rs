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

use bareverbs::device::pvrdma::Pvrdma;
use bareverbs::verbs::*;
use bareverbs_model::{Model, ModelConfig};
use common::*;

type RcQp<'a> = QueuePair<'a, P, Rc, Rts>;

fn caps(send: u32, recv: u32, sge: u32) -> QpCaps {
    QpCaps {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: sge,
        max_recv_sge: sge,
        max_inline_data: 0,
    }
}

/// Polls `f` once with a waker that does nothing.
fn once<F: Future>(f: F) -> Poll<F::Output> {
    let mut cx = TaskContext::from_waker(Waker::noop());
    core::pin::pin!(f).poll(&mut cx)
}

/// Everything the CQ has now.
fn drain(cq: &CompletionQueue<'_, P>) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 4];
    loop {
        let n = cq.poll(&mut wc).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&wc[..n]);
    }
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

/// A context on a fresh model with `cfg`, a bound GID, a PD and a 64-entry CQ; runs `f` and
/// tears everything down.
fn lab_with(
    cfg: ModelConfig,
    f: impl FnOnce(&Model, &Ctx, &ProtectionDomain<'_, P>, &CompletionQueue<'_, P>, Gid),
) {
    let model = Model::new(cfg);
    let ctx = bareverbs::Context::new(Pvrdma::probe(model.clone(), &model, CONFIG).unwrap());
    let g = ctx.bind_gid(0, Gid::link_local_from_mac(cfg.mac)).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    f(&model, &ctx, &pd, &cq, g.gid());
    drop(cq);
    drop(pd);
    drop(g);
    teardown(&model, ctx);
}

fn lab(f: impl FnOnce(&Model, &Ctx, &ProtectionDomain<'_, P>, &CompletionQueue<'_, P>, Gid)) {
    lab_with(ModelConfig::default(), f)
}

// ---------------------------------------------------------------------------------------------
// Destroy

#[test]
fn a_qp_destroyed_in_err_leaves_its_cq_quiet() {
    lab(|_, _, pd, cq, gid| {
        let qp = rc_self(pd, cq, gid, caps(4, 4, 1));
        let qp = qp.to_error().map_err(|(_, e)| e).unwrap();
        // Destroyed before any poll took its (empty) flush.
        qp.destroy().map_err(|(_, e)| e).unwrap();
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
        let qp = qp.to_error().map_err(|(_, e)| e).unwrap();
        // The request completes once, flushed, with the wr_id it was posted with.
        let ids: Vec<u64> = drain(cq).iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, [0x1111]);
        drop(qp);
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
        qp.post_recv(1, pool.alloc().unwrap())
            .map_err(|(_, e)| e)
            .unwrap();
        let mut qp = qp.to_error().map_err(|(_, e)| e).unwrap();
        // Flushed: its buffer stays out of the pool (the device may still write it).
        let c = qp.poll_one().unwrap().expect("the flush");
        assert_eq!((c.wc.wr_id, c.wc.status), (1, WcStatus::WrFlushErr));
        assert!(c.buf.is_none());
        assert_eq!(pool.free_count(), 3);
        // The same ring slot again, in ERR: flushed with its buffer.
        qp.post_recv(2, pool.alloc().unwrap())
            .map_err(|(_, e)| e)
            .unwrap();
        let c = qp.poll_one().unwrap().expect("the flush");
        assert_eq!(c.wc.wr_id, 2);
        drop(c);
        assert_eq!(pool.free_count(), 3);
        qp.destroy().map_err(|(_, e)| e).unwrap();
        assert_eq!(pool.free_count(), 4, "a parked buffer was lost");
    });
}
