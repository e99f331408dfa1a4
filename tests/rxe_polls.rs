//! Polling the software RoCEv2 device's completion queues: a poll gives back the room of the
//! completions it takes (a CQ far smaller than the traffic never fills), through the CQ's poll
//! (`ibv_poll_cq`) and through a queue pair's own poll on the safe path; a QP's poll takes its
//! own completions only, leaving another QP's that comes first where it is.

mod common;
mod pair;

use bareverbs::Context;
use bareverbs::verbs::*;
use bareverbs_model::link::TestClock;
use bareverbs_model::{Model, ModelConfig};
use pair::{IP_A, IP_B, R, rxe_devices, rxe_rc_up};

fn step(clk: &TestClock, a: &Context<R>, b: &Context<R>) {
    clk.advance(100);
    a.process_events();
    b.process_events();
}

#[test]
fn polls_give_back_the_room_of_the_completions_they_take() {
    let (a, b, clk, _seg) = rxe_devices(&Model::new(ModelConfig::default()));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    // Four entries each: the traffic below is ten times that.
    let (ca, cb) = (a.create_cq(4).unwrap(), b.create_cq(4).unwrap());
    assert_eq!(ca.entries(), 4);
    let pool = pa.buffer_pool(2, 64).unwrap();
    let qa = pa.qp_builder(&ca, &ca).pool(&pool).build::<Rc>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let mut qa = rxe_rc_up(qa, nb, IP_B);
    let mut qb = rxe_rc_up(qb, na, IP_A);
    let mb = pb.register(64, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..40u64 {
        // SAFETY: `mb` stays registered until the receive's completion, taken below.
        unsafe { qb.post_recv_raw(i, &[mb.sge(0, 64).unwrap()]) }.unwrap();
        let buf = pool.alloc().expect("every buffer came back");
        qa.post_send(i, buf).unwrap();
        let (mut sent, mut received) = (None, None);
        let mut wc = [WorkCompletion::default(); 4];
        for _ in 0..1000 {
            if sent.is_none() {
                sent = qa.poll_one().unwrap().map(|c| (c.wc.wr_id, c.wc.status));
            }
            if received.is_none() {
                let n = cb.poll(&mut wc).unwrap();
                assert!(n <= 1);
                received = (n == 1).then(|| (wc[0].wr_id, wc[0].status));
            }
            if sent.is_some() && received.is_some() {
                break;
            }
            step(&clk, &a, &b);
        }
        assert_eq!(sent, Some((i, WcStatus::Success)), "message {i}: the send");
        assert_eq!(
            received,
            Some((i, WcStatus::Success)),
            "message {i}: the receive"
        );
    }
    assert_eq!(pool.free_count(), 2);
}

#[test]
fn a_queue_pairs_poll_leaves_another_qps_completion_that_comes_first() {
    let (a, b, clk, _seg) = rxe_devices(&Model::new(ModelConfig::default()));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(8).unwrap(), b.create_cq(8).unwrap());
    let pool = pa.buffer_pool(4, 64).unwrap();
    // Two QPs of A on one CQ, each to its own QP of B.
    let q1 = pa.qp_builder(&ca, &ca).pool(&pool).build::<Rc>().unwrap();
    let q2 = pa.qp_builder(&ca, &ca).pool(&pool).build::<Rc>().unwrap();
    let r1 = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
    let r2 = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
    let (n1, n2, m1, m2) = (q1.qp_num(), q2.qp_num(), r1.qp_num(), r2.qp_num());
    let (mut q1, mut q2) = (rxe_rc_up(q1, m1, IP_B), rxe_rc_up(q2, m2, IP_B));
    let (mut r1, mut r2) = (rxe_rc_up(r1, n1, IP_A), rxe_rc_up(r2, n2, IP_A));
    let mb = pb.register(128, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: `mb` stays registered until the receives' completions (drained below).
    unsafe {
        r1.post_recv_raw(1, &[mb.sge(0, 64).unwrap()]).unwrap();
        r2.post_recv_raw(2, &[mb.sge(64, 64).unwrap()]).unwrap();
    }
    // Q2's send completes first, then Q1's.
    q2.post_send(20, pool.alloc().unwrap()).unwrap();
    for _ in 0..100 {
        step(&clk, &a, &b);
    }
    q1.post_send(10, pool.alloc().unwrap()).unwrap();
    for _ in 0..100 {
        step(&clk, &a, &b);
    }
    assert!(q1.poll_one().unwrap().is_none(), "Q2's completion is first");
    let c2 = q2.poll_one().unwrap().expect("Q2's completion");
    assert_eq!(
        (c2.wc.wr_id, c2.wc.qp_num, c2.buf.is_some()),
        (20, n2, true)
    );
    assert!(q2.poll_one().unwrap().is_none(), "Q1's completion is next");
    let c1 = q1.poll_one().unwrap().expect("Q1's completion");
    assert_eq!(
        (c1.wc.wr_id, c1.wc.qp_num, c1.buf.is_some()),
        (10, n1, true)
    );
    assert!(q1.poll_one().unwrap().is_none());
    assert_eq!(ca.poll(&mut [WorkCompletion::default(); 4]).unwrap(), 0);
    drop((c1, c2));
    assert_eq!(pool.free_count(), 4);
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(cb.poll(&mut wc).unwrap(), 2);
}
