//! What a connected QP's frames carry. Their outer headers follow its path: made once from the
//! address vector and the peer's MAC, and made again after a modify that changes them (another
//! peer, another traffic class and hop limit), for the requester's SENDs and the responder's
//! ACKs. Their payload comes from the request's gather list, checked as the packet is built.

mod common;

use bareverbs::Context;
use bareverbs::device::rxe::wire::packet::{Frame, Packet, parse};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_model::link::{Faults, MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};
use common::{caps, rc_to_rts};

type R = Rxe<Model, MemLink, TestClock>;
type Ctx = Context<R>;

const MACS: [[u8; 6]; 3] = [
    [0x52, 0x54, 0, 0, 0, 2],
    [0x52, 0x54, 0, 0, 0, 3],
    [0x52, 0x54, 0, 0, 0, 4],
];
const IPS: [[u8; 4]; 3] = [[10, 0, 0, 2], [10, 0, 0, 3], [10, 0, 0, 4]];
const SEND: u8 = 0x04;
const ACK: u8 = 0x11;

struct Lab {
    seg: Segment,
    clk: TestClock,
    ctx: Vec<Ctx>,
}

fn lab() -> Lab {
    let model = Model::new(ModelConfig::default());
    let seg = Segment::new();
    let clk = TestClock::default();
    let ctx = (0..3)
        .map(|i| {
            let link = seg.attach(MACS[i], 1514);
            let rxe = Rxe::new(model.clone(), link, clk.clone(), Config { ip: IPS[i] });
            Context::new(rxe.unwrap())
        })
        .collect();
    seg.set_faults(Faults::default());
    Lab { seg, clk, ctx }
}

impl Lab {
    fn run(&self, rounds: u32) {
        for _ in 0..rounds {
            self.clk.advance(100);
            for c in &self.ctx {
                c.process_events();
            }
        }
    }

    /// The RoCE packets endpoint `from` sent from `l.seg.sent()[start]` on, with their
    /// destination MACs.
    fn sent(&self, start: usize, from: usize) -> Vec<([u8; 6], Packet<'static>)> {
        let frames = self.seg.sent();
        frames[start..]
            .iter()
            .filter(|(by, _)| *by == from)
            .filter_map(|(_, f)| {
                let f: &'static [u8] = Vec::leak(f.clone());
                match parse(f) {
                    Ok(Frame::Roce(p)) => Some((f[..6].try_into().unwrap(), p)),
                    _ => None,
                }
            })
            .collect()
    }
}

/// Brings `qp` from Reset to RTS towards `peer` (its QPN, its endpoint) with traffic class
/// `tc` and hop limit `hops`.
fn connect<'a>(
    qp: QueuePair<'a, R, Rc, Reset>,
    (qpn, at): (u32, usize),
    (tc, hops): (u8, u8),
) -> QueuePair<'a, R, Rc, Rts> {
    let mut av = AddressVector::new(Gid::from_ipv4(IPS[at]), 1);
    (av.traffic_class, av.hop_limit) = (tc, hops);
    rc_to_rts(
        qp,
        &ConnectedInit::default(),
        &ConnectedRtr::new(qpn, 0, av),
        &ConnectedRts::new(0),
    )
}

/// Posts one signaled SEND of 16 bytes from `mr` and runs until `cq` has its completion.
fn send_one(
    l: &Lab,
    qp: &mut QueuePair<'_, R, Rc, Rts>,
    cq: &CompletionQueue<'_, R>,
    mr: &MemoryRegion<'_, R>,
) {
    assert_eq!(send(l, qp, cq, mr.sge(0, 16).unwrap()), WcStatus::Success);
}

/// Posts one signaled SEND of `sge` and runs until `cq` has its completion: its status.
fn send(
    l: &Lab,
    qp: &mut QueuePair<'_, R, Rc, Rts>,
    cq: &CompletionQueue<'_, R>,
    sge: Sge,
) -> WcStatus {
    // SAFETY: the buffer stays registered and untouched until the completion (or it names
    // no memory the device may read: the request fails).
    unsafe {
        let mut s = qp.send_batch();
        s.send(7, SendFlags::SIGNALED, &[sge]).unwrap();
        s.finish();
    }
    let mut wc = [WorkCompletion::default(); 1];
    for _ in 0..200 {
        l.run(1);
        if cq.poll(&mut wc).unwrap() == 1 {
            assert_eq!(wc[0].wr_id, 7);
            return wc[0].status;
        }
    }
    panic!("no completion");
}

/// Checks that endpoint `from` sent, from `start` on, a packet of `opcode` to endpoint `to`
/// along the path (`tc`, `hops`), and only to it.
fn along(l: &Lab, start: usize, (from, to): (usize, usize), opcode: u8, (tc, hops): (u8, u8)) {
    let sent = l.sent(start, from);
    assert!(
        sent.iter().any(|(_, p)| p.headers.bth.opcode == opcode),
        "{sent:?}"
    );
    for (mac, p) in &sent {
        assert_eq!((*mac, p.ip.src, p.ip.dst), (MACS[to], IPS[from], IPS[to]));
        assert_eq!((p.ip.tos, p.ip.ttl), (tc, hops));
    }
}

#[test]
fn a_new_path_after_a_modify_is_the_one_the_frames_take() {
    let l = lab();
    let pds: Vec<_> = l.ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
    let cqs: Vec<_> = l.ctx.iter().map(|c| c.create_cq(8).unwrap()).collect();
    let qps: Vec<_> = (0..3)
        .map(|i| {
            let b = pds[i].qp_builder(&cqs[i], &cqs[i]).caps(caps(4, 4, 1));
            b.build::<Rc>().unwrap()
        })
        .collect();
    let qpns: Vec<u32> = qps.iter().map(|q| q.qp_num()).collect();
    let mrs: Vec<_> = pds
        .iter()
        .map(|pd| pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap())
        .collect();
    let mut qps = qps.into_iter();
    let (qa, qb, qc) = (
        qps.next().unwrap(),
        qps.next().unwrap(),
        qps.next().unwrap(),
    );
    let mut qa = connect(qa, (qpns[1], 1), (0, 64));
    let mut qb = connect(qb, (qpns[0], 0), (0x20, 9));
    let mut qc = connect(qc, (qpns[0], 0), (0x48, 5));
    for (qp, mr) in [(&mut qb, &mrs[1]), (&mut qc, &mrs[2])] {
        // SAFETY: the buffers stay registered and untouched until the test ends.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(1, &[mr.sge(0, 64).unwrap()]).unwrap();
            r.recv(2, &[mr.sge(64, 64).unwrap()]).unwrap();
            r.finish();
        }
    }

    let start = l.seg.sent().len();
    send_one(&l, &mut qa, &cqs[0], &mrs[0]);
    along(&l, start, (0, 1), SEND, (0, 64));
    along(&l, start, (1, 0), ACK, (0x20, 9));

    // A's QP turned to C, with another traffic class and hop limit.
    let qa = qa.reset().unwrap();
    let mut qa = connect(qa, (qpns[2], 2), (0x88, 3));
    let start = l.seg.sent().len();
    send_one(&l, &mut qa, &cqs[0], &mrs[0]);
    along(&l, start, (0, 2), SEND, (0x88, 3));
    along(&l, start, (2, 0), ACK, (0x48, 5));
    assert!(l.sent(start, 1).is_empty(), "B is not part of it");
    drop((qb, qc));
}

#[test]
fn a_gather_entry_is_read_where_it_points_and_refused_past_its_region() {
    let l = lab();
    let pds: Vec<_> = l.ctx[..2].iter().map(|c| c.alloc_pd().unwrap()).collect();
    let cqs: Vec<_> = l.ctx[..2].iter().map(|c| c.create_cq(8).unwrap()).collect();
    let qa = pds[0].qp_builder(&cqs[0], &cqs[0]).caps(caps(4, 4, 1));
    let qb = pds[1].qp_builder(&cqs[1], &cqs[1]).caps(caps(4, 4, 1));
    let (qa, qb) = (qa.build::<Rc>().unwrap(), qb.build::<Rc>().unwrap());
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let mut qa = connect(qa, (nb, 1), (0, 64));
    let mut qb = connect(qb, (na, 0), (0, 64));
    let mut ma = pds[0].register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mb = pds[1].register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    for (i, b) in ma.as_mut_slice().iter_mut().enumerate() {
        *b = (i * 7) as u8;
    }
    // SAFETY: the buffer stays registered and untouched until the test ends.
    unsafe {
        let mut r = qb.recv_batch();
        r.recv(1, &[mb.sge(0, 64).unwrap()]).unwrap();
        r.recv(2, &[mb.sge(64, 64).unwrap()]).unwrap();
        r.finish();
    }
    // 60 bytes from offset 4000: where the entry points, the pad after them.
    let sge = ma.sge(4000, 60).unwrap();
    assert_eq!(send(&l, &mut qa, &cqs[0], sge), WcStatus::Success);
    assert_eq!(mb.as_slice()[..60], ma.as_slice()[4000..4060]);
    // No bytes: nothing is read, whatever the entry names.
    let none = Sge {
        addr: 0,
        length: 0,
        lkey: ma.lkey() ^ 0x100,
    };
    assert_eq!(send(&l, &mut qa, &cqs[0], none), WcStatus::Success);
    // 64 bytes from 32 before the region's end: refused, the QP in error.
    let past = Sge {
        addr: ma.addr() + 4096 - 32,
        length: 64,
        lkey: ma.lkey(),
    };
    assert_eq!(send(&l, &mut qa, &cqs[0], past), WcStatus::LocProtErr);
    assert_eq!(qa.query().unwrap().state, QpState::Err);
}
