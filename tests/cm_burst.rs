//! The connection manager under a burst, as `cmtime` makes one: many connections ended at
//! once. The passive side takes more DREQs in one poll than it has send buffers; every one
//! is answered at once (the datagrams wait in their receive buffers until a send buffer is
//! free), none is dropped for want of a buffer, and the active side sees every connection
//! end long before its DREQ would be sent again.

mod cm_common;

use bareverbs::cm::{AcceptParams, Cm, CmConfig, CmEvent, ConnId, Service};
use bareverbs_model::link::{Faults, TestClock};
use cm_common::*;

/// Connections of the burst: more than the CM's 16 send buffers.
const CONNS: usize = 24;

type BigCm<'a> = Cm<'a, R, TestClock, 32>;

fn poll_all<'a>(cm: &mut BigCm<'a>, evs: &mut Vec<CmEvent<'a, R>>) {
    while let Some(e) = cm.poll() {
        evs.push(e);
    }
}

#[test]
fn a_burst_of_dreqs_beyond_the_send_buffers_is_answered_at_once() {
    let l = lab(Faults::default(), (11, 22));
    let (pa, pb, ma, mb, da, db) = sides(&l);
    let mut cma: BigCm<'_> = Cm::new(&pa, &ma, l.clk.clone(), CmConfig::default()).unwrap();
    let mut cmb: BigCm<'_> = Cm::new(&pb, &mb, l.clk.clone(), CmConfig::default()).unwrap();
    cmb.listen(None, 7174, Service::Rc).unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let mut a_qps = Vec::new();
    let mut b_qps = Vec::new();
    let mut ids: Vec<ConnId> = Vec::new();
    // Up one at a time.
    for k in 0..CONNS {
        let id = cma
            .connect(rc_qp(&pa, &da), IP_B, 7174, &Default::default())
            .map_err(|(_, e)| e)
            .unwrap();
        ids.push(id);
        let mut up = false;
        for _ in 0..1000 {
            l.clk.advance(1000);
            poll_all(&mut cma, &mut ea);
            poll_all(&mut cmb, &mut eb);
            for e in eb.drain(..) {
                if let CmEvent::ConnectRequest(r) = e {
                    let q = cmb
                        .accept(r.id, rc_qp(&pb, &db), &AcceptParams::default())
                        .map_err(|(_, e)| e)
                        .unwrap();
                    b_qps.push(q);
                }
            }
            if let Some(i) = ea
                .iter()
                .position(|e| matches!(e, CmEvent::Established { id: x, .. } if *x == id))
            {
                let CmEvent::Established { qp: Some(q), .. } = ea.remove(i) else {
                    panic!("the active side's QP")
                };
                a_qps.push(q);
                up = true;
                break;
            }
        }
        assert!(up, "connection {k} up");
    }
    // Let every RTU land.
    for _ in 0..50 {
        l.clk.advance(1000);
        poll_all(&mut cma, &mut ea);
        poll_all(&mut cmb, &mut eb);
    }
    eb.clear();
    ea.clear();
    let dropped_before = cmb.counts().send_dropped;
    // A sends every DREQ before B polls at all: 16, then (A's send buffers back) the rest.
    let mut a_qps: Vec<_> = a_qps.into_iter().map(|q| q.to_error().unwrap()).collect();
    for (k, id) in ids.iter().enumerate() {
        if k == 16 {
            // A's sends complete (its device transmits): its buffers are free again.
            for _ in 0..4 {
                poll_all(&mut cma, &mut ea);
            }
        }
        cma.disconnect(*id).unwrap();
    }
    for _ in 0..4 {
        poll_all(&mut cma, &mut ea);
    }
    assert_eq!(cma.counts().send_dropped, 0, "A sent every DREQ");
    // B's one poll takes the 24 DREQs: each is answered.
    let t0 = l.clk_now();
    let mut ended = 0;
    for _ in 0..200 {
        l.clk.advance(1000);
        poll_all(&mut cmb, &mut eb);
        poll_all(&mut cma, &mut ea);
        ended = ea
            .iter()
            .filter(|e| matches!(e, CmEvent::Disconnected { .. }))
            .count();
        if ended == CONNS {
            break;
        }
    }
    let took_ms = (l.clk_now() - t0) / 1000;
    assert_eq!(ended, CONNS, "every DREQ answered");
    assert_eq!(
        eb.iter()
            .filter(|e| matches!(e, CmEvent::Disconnected { .. }))
            .count(),
        CONNS,
        "B saw every DREQ"
    );
    assert_eq!(
        cmb.counts().send_dropped - dropped_before,
        0,
        "no DREP dropped for want of a send buffer"
    );
    assert_eq!(cma.counts().resent, 0, "no DREQ sent again");
    assert!(
        took_ms < 100,
        "answered in {took_ms} ms, not after a DREQ's timeout"
    );
    for q in a_qps.drain(..) {
        q.destroy().unwrap();
    }
    for q in b_qps {
        q.to_error().unwrap().destroy().unwrap();
    }
}
