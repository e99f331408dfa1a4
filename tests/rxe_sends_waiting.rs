//! `Rxe::sends_waiting`: what a core that runs the device's progress for other cores' posts
//! (`set_progress_only`) asks before it halts. It says whether the next progress has frames
//! to send now: a post left to the progress does, a request sent and awaiting its
//! acknowledgement (a timer only) does not, and neither does a device that transmits from the
//! post itself.

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

/// Sends 3 messages from A to B, each checked the same way; `progress_only` on A or not.
fn run(progress_only: bool) {
    let (a, b, clk, _seg) = rxe_devices(&Model::new(ModelConfig::default()));
    a.provider().set_progress_only(progress_only);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(8).unwrap(), b.create_cq(8).unwrap());
    let pool = pa.buffer_pool(2, 64).unwrap();
    let qa = pa.qp_builder(&ca, &ca).pool(&pool).build::<Rc>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let mut qa = rxe_rc_up(qa, nb, IP_B);
    let mut qb = rxe_rc_up(qb, na, IP_A);
    let mb = pb.register(64, AccessFlags::LOCAL_WRITE).unwrap();
    // The QPs' state changes put them in the busy set for one visit, with nothing to send.
    assert!(!a.provider().sends_waiting(), "idle QPs");
    step(&clk, &a, &b);
    assert!(!a.provider().sends_waiting(), "idle QPs after a progress");
    for i in 0..3u64 {
        // SAFETY: `mb` stays registered until the receive's completion, taken below.
        unsafe { qb.post_recv_raw(i, &[mb.sge(0, 64).unwrap()]) }.unwrap();
        let buf = pool.alloc().expect("every buffer came back");
        qa.post_send(i, buf).unwrap();
        // Left to the progress: waiting; transmitted from the post: not.
        assert_eq!(
            a.provider().sends_waiting(),
            progress_only,
            "message {i}: just posted"
        );
        // The progress sends it; it now only awaits its acknowledgement (the frame is on
        // the segment, B has not run).
        a.provider().progress();
        assert!(
            !a.provider().sends_waiting(),
            "message {i}: sent, awaiting its acknowledgement"
        );
        let (mut sent, mut received) = (None, None);
        let mut wc = [WorkCompletion::default(); 4];
        for _ in 0..1000 {
            if sent.is_none() {
                sent = qa.poll_one().unwrap().map(|c| (c.wc.wr_id, c.wc.status));
            }
            if received.is_none() {
                let n = cb.poll(&mut wc).unwrap();
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
        assert!(!a.provider().sends_waiting(), "message {i}: acknowledged");
    }
}

#[test]
fn a_post_left_to_the_progress_is_waiting_until_the_progress_sends_it() {
    run(true);
}

#[test]
fn a_post_that_transmits_at_once_leaves_nothing_waiting() {
    run(false);
}
