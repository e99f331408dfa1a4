//! Completion events of the software RoCEv2 device: a CQ armed for its next completion raises
//! one event at it; armed for solicited completions, one at the next solicited or failed
//! completion and none at others; an arm is used up by its event; a CQ never armed raises
//! none; a CQ on no channel still completes (and its arm is accepted).

mod common;
mod pair;

use bareverbs::Context;
use bareverbs::verbs::*;
use bareverbs_model::link::TestClock;
use bareverbs_model::{Model, ModelConfig};
use pair::{IP_A, IP_B, R, rxe_devices, rxe_rc_up};

const SIG: SendFlags = SendFlags::SIGNALED;

/// Runs both devices until `cq` has a completion, and takes it.
fn next(
    clk: &TestClock,
    a: &Context<R>,
    b: &Context<R>,
    cq: &CompletionQueue<'_, R>,
) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    for _ in 0..10_000 {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        clk.advance(100);
        a.process_events();
        b.process_events();
    }
    panic!("no completion");
}

#[test]
fn arms_raise_one_event_each_at_the_completions_they_name() {
    let model = Model::new(ModelConfig::default());
    let (a, b, clk, _seg) = rxe_devices(&model);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cha, chb) = (
        a.create_comp_channel().unwrap(),
        b.create_comp_channel().unwrap(),
    );
    let ca = a.create_cq_with_channel(16, &cha).unwrap();
    let cb = b.create_cq_with_channel(16, &chb).unwrap();
    // A CQ on no channel: A's receive CQ, never receiving here.
    let plain = a.create_cq(16).unwrap();
    let qa = pa.qp_builder(&ca, &plain).build::<Rc>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let mut qa = rxe_rc_up(qa, nb, IP_B);
    let mut qb = rxe_rc_up(qb, na, IP_A);
    let ma = pa.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mb = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();

    // One SEND from A to B into a posted receive; B's receive completion and A's send
    // completion taken.
    let mut wr = 0;
    let mut send = |flags: SendFlags,
                    qa: &mut QueuePair<'_, R, Rc, Rts>,
                    qb: &mut QueuePair<'_, R, Rc, Rts>| {
        wr += 1;
        // SAFETY: both regions stay registered until the completions, taken below.
        unsafe {
            qb.post_recv_raw(wr, &[mb.sge(0, 64).unwrap()]).unwrap();
            let mut s = qa.send_batch();
            s.send(wr, flags, &[ma.sge(0, 64).unwrap()]).unwrap();
            s.finish();
        }
        let r = next(&clk, &a, &b, &cb);
        assert_eq!((r.wr_id, r.status), (wr, WcStatus::Success));
        let s = next(&clk, &a, &b, &ca);
        assert_eq!((s.wr_id, s.status), (wr, WcStatus::Success));
    };

    // Never armed: no event.
    send(SIG, &mut qa, &mut qb);
    assert_eq!(chb.get_cq_event(), None);
    assert_eq!(cha.get_cq_event(), None);

    // Armed for solicited completions: none for a SEND without the solicited bit (nor for
    // A's successful send completion), one for a solicited SEND.
    cb.req_notify(true).unwrap();
    ca.req_notify(true).unwrap();
    send(SIG, &mut qa, &mut qb);
    assert_eq!(chb.get_cq_event(), None, "an unsolicited receive");
    assert_eq!(cha.get_cq_event(), None, "a successful send");
    send(SIG | SendFlags::SOLICITED, &mut qa, &mut qb);
    assert_eq!(chb.get_cq_event(), Some(cb.id()));
    assert_eq!(chb.get_cq_event(), None, "one event an arm");
    cb.ack_events(1);
    assert_eq!(
        cha.get_cq_event(),
        None,
        "the send completion is not solicited"
    );

    // The arm was used up: no event at the next solicited SEND.
    send(SIG | SendFlags::SOLICITED, &mut qa, &mut qb);
    assert_eq!(chb.get_cq_event(), None, "an arm used up");

    // Armed for the next completion: one event at any.
    cb.req_notify(false).unwrap();
    send(SIG, &mut qa, &mut qb);
    assert_eq!(chb.get_cq_event(), Some(cb.id()));
    cb.ack_events(1);

    // Armed for solicited completions, an error completion raises one: A's send from a key
    // nobody has fails locally.
    let mut bad = ma.sge(0, 64).unwrap();
    bad.lkey ^= 0x100;
    // SAFETY: nothing is read from the bad key; the request fails.
    unsafe {
        let mut s = qa.send_batch();
        s.send(99, SIG, &[bad]).unwrap();
        s.finish();
    }
    let f = next(&clk, &a, &b, &ca);
    assert_eq!((f.wr_id, f.status), (99, WcStatus::LocProtErr));
    assert_eq!(cha.get_cq_event(), Some(ca.id()), "an error completion");
    ca.ack_events(1);

    // A CQ on no channel takes an arm and still completes.
    plain.req_notify(false).unwrap();
    assert_eq!(plain.poll(&mut [WorkCompletion::default(); 1]).unwrap(), 0);
}
