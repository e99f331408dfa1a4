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
