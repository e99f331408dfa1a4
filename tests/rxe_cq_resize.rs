//! Resizing the software RoCEv2 device's completion queues (`ibv_resize_cq`): a larger size
//! moves the completions waiting into the new ring in their order (across the old ring's wrap)
//! and the CQ then takes as many completions as it says; a size below the CQEs it must keep
//! room for is refused with nothing changed; a smaller one it can hold keeps the ring.

mod common;
mod pair;

use bareverbs::Context;
use bareverbs::error::{Error, ErrorKind, Param};
use bareverbs::verbs::*;
use bareverbs_model::link::TestClock;
use bareverbs_model::{Model, ModelConfig};
use pair::{IP_A, IP_B, R, rxe_devices, rxe_rc_up};

fn settle(clk: &TestClock, a: &Context<R>, b: &Context<R>) {
    for _ in 0..200 {
        clk.advance(100);
        a.process_events();
        b.process_events();
    }
}

/// Sends `ids` from a fresh QP of A on `ca` to a fresh QP of B (its receives posted), all
/// signaled, and runs the devices until they completed; both QPs are destroyed after, so the
/// completions wait on `ca` with no QP holding it. Returns B's receive completions' IDs.
fn send_and_leave(
    (a, b, clk): (&Context<R>, &Context<R>, &TestClock),
    ca: &CompletionQueue<'_, R>,
    ids: core::ops::Range<u64>,
) -> Vec<u64> {
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let cb = b.create_cq(64).unwrap();
    let caps = QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        ..QpCaps::default()
    };
    let qa = pa.qp_builder(ca, ca).caps(caps).build::<Rc>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).caps(caps).build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let mut qa = rxe_rc_up(qa, nb, IP_B);
    let mut qb = rxe_rc_up(qb, na, IP_A);
    let ma = pa.register(64, AccessFlags::LOCAL_WRITE).unwrap();
    let mb = pb.register(64 * 32, AccessFlags::LOCAL_WRITE).unwrap();
    for (k, id) in ids.clone().enumerate() {
        // SAFETY: both regions stay registered until the QPs are destroyed below, after
        // every request completed.
        unsafe {
            qb.post_recv_raw(id, &[mb.sge(64 * k as u32, 64).unwrap()])
                .unwrap();
            let mut s = qa.send_batch();
            s.send(id, SendFlags::SIGNALED, &[ma.sge(0, 64).unwrap()])
                .unwrap();
            s.finish();
        }
    }
    settle(clk, a, b);
    let mut got = Vec::new();
    let mut wc = [WorkCompletion::default(); 8];
    loop {
        let n = cb.poll(&mut wc).unwrap();
        if n == 0 {
            break;
        }
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success);
            got.push(w.wr_id);
        }
    }
    qa.destroy().unwrap();
    qb.destroy().unwrap();
    ma.destroy().unwrap();
    mb.destroy().unwrap();
    cb.destroy().unwrap();
    pa.destroy().unwrap();
    pb.destroy().unwrap();
    got
}

/// Every completion on `cq` now: (wr_id, status), in order.
fn drain(cq: &CompletionQueue<'_, R>) -> Vec<(u64, WcStatus)> {
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 3];
    loop {
        let n = cq.poll(&mut wc).unwrap();
        if n == 0 {
            return out;
        }
        out.extend(wc[..n].iter().map(|w| (w.wr_id, w.status)));
    }
}

#[test]
fn growing_keeps_the_waiting_completions_in_order_and_takes_more() {
    let (a, b, clk, _seg) = rxe_devices(&Model::new(ModelConfig::default()));
    let mut ca = a.create_cq(4).unwrap();
    assert_eq!(ca.entries(), 4);
    // Three completions taken, so that the next four wrap round the 4-entry ring.
    assert_eq!(send_and_leave((&a, &b, &clk), &ca, 0..3), [0, 1, 2]);
    assert_eq!(drain(&ca).len(), 3);
    assert_eq!(send_and_leave((&a, &b, &clk), &ca, 3..7), [3, 4, 5, 6]);
    // The ring is full; it grows to 16 with the four waiting.
    ca.resize(10).unwrap();
    assert_eq!(ca.entries(), 16);
    let ok = |r: core::ops::Range<u64>| r.map(|i| (i, WcStatus::Success)).collect::<Vec<_>>();
    assert_eq!(drain(&ca), ok(3..7));
    // Sixteen completions now wait at once, four times what the CQ held before.
    assert_eq!(
        send_and_leave((&a, &b, &clk), &ca, 100..116),
        (100..116).collect::<Vec<_>>()
    );
    assert_eq!(drain(&ca), ok(100..116));
    // Grown again, with completions waiting across the 16-entry ring's wrap.
    send_and_leave((&a, &b, &clk), &ca, 200..212);
    ca.resize(64).unwrap();
    assert_eq!(ca.entries(), 64);
    assert_eq!(drain(&ca), ok(200..212));
    ca.destroy().unwrap();
}

#[test]
fn a_size_below_the_waiting_completions_is_refused_and_a_smaller_one_kept() {
    let model = Model::new(ModelConfig::default());
    let (a, b, clk, _seg) = rxe_devices(&model);
    let mut ca = a.create_cq(8).unwrap();
    send_and_leave((&a, &b, &clk), &ca, 0..6);
    let e = ca.resize(4).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidInput {
                param: Param::CqEntriesInUse,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(ca.entries(), 8);
    // At least as many as wait: the ring it has does.
    ca.resize(6).unwrap();
    assert_eq!(ca.entries(), 8);
    let waiting: Vec<u64> = drain(&ca).into_iter().map(|(id, _)| id).collect();
    assert_eq!(waiting, [0, 1, 2, 3, 4, 5]);
    // Nothing waits now: any size from one up.
    ca.resize(1).unwrap();
    assert!(ca.entries() >= 1);
    for bad in [0, 16384 + 1] {
        let e = ca.resize(bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad}: {e}");
        assert!(
            matches!(
                e,
                Error::InvalidInput {
                    param: Param::CqEntries,
                    ..
                }
            ),
            "{bad}: {e}"
        );
    }
    assert_eq!(ca.entries(), 8);
    ca.resize(16384).unwrap();
    assert_eq!(ca.entries(), 16384);
    ca.destroy().unwrap();
    drop((a, b));
    assert_eq!(model.outstanding_pages(), 0, "DMA pages leaked");
}
