//! The software RoCE device with every queue pair it holds in use: `MAX_QP` (128) QPs on each
//! side, one more refused with the limit named, and traffic on QPs in every word of the
//! device's busy set (slots 0, 63, 64, 127 and those around them) left to the progress
//! (`set_progress_only`), so that each QP's sends go out only through the busy set's
//! visits, in rotation. What `cmtime` (100 connections at once) needs of the device.

mod common;
mod pair;

use bareverbs::device::rxe::MAX_QP;
use bareverbs::error::{Error, Object, Resource};
use bareverbs::verbs::*;
use bareverbs_model::{Model, ModelConfig};
use pair::{IP_A, IP_B, rxe_devices, rxe_rc_up};

/// The table slots whose QPs carry messages: both ends of each busy word and their
/// neighbours.
const BUSY: [usize; 8] = [0, 1, 62, 63, 64, 65, 126, 127];

#[test]
fn every_queue_pair_slot_is_served_and_one_more_is_refused_with_the_limit() {
    assert_eq!(MAX_QP, 128, "the busy set's words this test spans");
    let (a, b, clk, _seg) = rxe_devices(&Model::new(ModelConfig::default()));
    a.provider().set_progress_only(true);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 2,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qa = Vec::new();
    let mut qb = Vec::new();
    for _ in 0..MAX_QP {
        qa.push(pa.qp_builder(&ca, &ca).caps(caps).build::<Rc>().unwrap());
        qb.push(pb.qp_builder(&cb, &cb).caps(caps).build::<Rc>().unwrap());
    }
    let numbers: Vec<u32> = qa.iter().map(|q| q.qp_num()).collect();
    let mut sorted = numbers.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), MAX_QP, "every QP has its own number");
    match pa.qp_builder(&ca, &ca).caps(caps).build::<Rc>() {
        Err(Error::Resource(Resource::Objects {
            object: Object::Qp,
            limit,
        })) => assert_eq!(limit, MAX_QP as u32),
        other => panic!("QP {} of {MAX_QP}: {:?}", MAX_QP + 1, other.err()),
    }
    // Slot i of each side: A's QP i with B's QP i, for the slots of `BUSY`.
    let mut pairs = Vec::new();
    for (i, (x, y)) in qa.into_iter().zip(qb).enumerate() {
        if BUSY.contains(&i) {
            let (nx, ny) = (x.qp_num(), y.qp_num());
            pairs.push((i, rxe_rc_up(x, ny, IP_B), rxe_rc_up(y, nx, IP_A)));
        }
    }
    let ma = pa
        .register(64 * BUSY.len(), AccessFlags::LOCAL_WRITE)
        .unwrap();
    let mb = pb
        .register(64 * BUSY.len(), AccessFlags::LOCAL_WRITE)
        .unwrap();
    for (k, (i, x, y)) in pairs.iter_mut().enumerate() {
        let at = (64 * k) as u32;
        // SAFETY: both regions stay registered until every completion below is taken.
        unsafe {
            y.post_recv_raw(*i as u64, &[mb.sge(at, 64).unwrap()])
                .unwrap();
        }
        let sge = ma.sge(at, 64).unwrap();
        let mut sb = x.send_batch();
        // SAFETY: as above.
        unsafe { sb.send(*i as u64, SendFlags::SIGNALED, &[sge]) }.unwrap();
        sb.finish();
    }
    let (mut sent, mut received) = (Vec::new(), Vec::new());
    let mut wc = [WorkCompletion::default(); 16];
    for _ in 0..2000 {
        clk.advance(100);
        a.process_events();
        b.process_events();
        let n = ca.poll(&mut wc).unwrap();
        sent.extend(wc[..n].iter().map(|c| (c.wr_id, c.status)));
        let n = cb.poll(&mut wc).unwrap();
        received.extend(wc[..n].iter().map(|c| (c.wr_id, c.status)));
        if sent.len() == BUSY.len() && received.len() == BUSY.len() {
            break;
        }
    }
    sent.sort_by_key(|c| c.0);
    received.sort_by_key(|c| c.0);
    let want: Vec<(u64, WcStatus)> = BUSY
        .iter()
        .map(|&i| (i as u64, WcStatus::Success))
        .collect();
    assert_eq!(sent, want, "every slot's send completed, once");
    assert_eq!(received, want, "every slot's message arrived, once");
}
