//! The software RoCE device against the other stations on its segment: every frame is an
//! attacker's input (`docs/security.md`). Two devices, A (10.0.0.2) and B (10.0.0.3), talk
//! over RC; a third station on the in-memory segment, at its own IP and MAC (10.0.0.66), or
//! writing the peer's addresses where a test says so, forges frames with valid ICRCs.
//!
//! One test per defect the threat model names, each failing before its fix, and the property:
//! no frame from anyone but a QP's peer changes any state of that QP.

mod common;

use std::collections::BTreeMap;

use bareverbs::Context;
use bareverbs::device::rxe::wire::bth::{
    Aeth, AtomicEth, Bth, DEFAULT_PKEY, Deth, Headers, Reth, opcode,
};
use bareverbs::device::rxe::wire::packet::{Frame, ROCE_OFFSET, Route, build, parse};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};
use common::{drain, rc_to_rts};

type R = Rxe<Model, MemLink, TestClock>;
type Ctx = Context<R>;
type RcQp<'a> = QueuePair<'a, R, Rc, Rts>;

const IP_A: [u8; 4] = [10, 0, 0, 2];
const IP_B: [u8; 4] = [10, 0, 0, 3];
const IP_S: [u8; 4] = [10, 0, 0, 66];
const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];
const MAC_B: [u8; 6] = [0x52, 0x54, 0, 0, 0, 3];
const MAC_S: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0x42];
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
const SIG: SendFlags = SendFlags::SIGNALED;

/// Two devices and a stranger's station on one segment.
struct Lab {
    seg: Segment,
    clk: TestClock,
    a: Ctx,
    b: Ctx,
    /// The stranger's link index (what `Segment::sent` names it by).
    s: usize,
    /// The devices' link indices.
    la: usize,
    lb: usize,
    _s_link: MemLink,
}

fn lab() -> Lab {
    let model = Model::new(ModelConfig::default());
    let seg = Segment::new();
    let clk = TestClock::default();
    let la = seg.attach(MAC_A, 1514);
    let lb = seg.attach(MAC_B, 1514);
    let s_link = seg.attach(MAC_S, 1514);
    let (ia, ib) = (la.id(), lb.id());
    let a = Context::new(Rxe::new(model.clone(), la, clk.clone(), Config { ip: IP_A }).unwrap());
    let b = Context::new(Rxe::new(model, lb, clk.clone(), Config { ip: IP_B }).unwrap());
    Lab {
        seg,
        clk,
        a,
        b,
        s: s_link.id(),
        la: ia,
        lb: ib,
        _s_link: s_link,
    }
}

impl Lab {
    /// Both devices, `rounds` rounds of `step` µs.
    fn run(&self, rounds: u32, step: u64) {
        for _ in 0..rounds {
            self.clk.advance(step);
            self.a.process_events();
            self.b.process_events();
        }
    }

    /// Puts a forged frame on the segment from the stranger's station.
    fn forge(&self, from: ([u8; 6], [u8; 4]), to: ([u8; 6], [u8; 4]), h: &Headers, payload: &[u8]) {
        assert!(self.try_forge(from, to, h, payload), "a frame");
    }

    /// [`Lab::forge`]; `false` when the headers make no frame (an extended header missing).
    fn try_forge(
        &self,
        from: ([u8; 6], [u8; 4]),
        to: ([u8; 6], [u8; 4]),
        h: &Headers,
        payload: &[u8],
    ) -> bool {
        let route = Route {
            src_mac: from.0,
            dst_mac: to.0,
            src_ip: from.1,
            dst_ip: to.1,
            tos: 0,
            ttl: 64,
            src_port: 0xC123,
        };
        let mut buf = vec![0u8; 1600];
        let Some(n) = build(&mut buf, &route, 9, h, payload) else {
            return false;
        };
        self.seg.inject(self.s, &buf[..n]);
        true
    }

    /// The RoCE frames link `from` sent since `start`: (destination MAC, opcode, QPN, PSN,
    /// AETH syndrome).
    fn roce_sent(&self, start: usize, from: usize) -> Vec<([u8; 6], u8, u32, u32, u8)> {
        self.seg.sent()[start..]
            .iter()
            .filter(|(f, _)| *f == from)
            .filter_map(|(_, f)| match parse(f) {
                Ok(Frame::Roce(p)) => Some((
                    f[..6].try_into().unwrap(),
                    p.headers.bth.opcode,
                    p.headers.bth.dest_qp,
                    p.headers.bth.psn,
                    p.headers.aeth.map_or(0, |a| a.syndrome),
                )),
                _ => None,
            })
            .collect()
    }

    fn mark(&self) -> usize {
        self.seg.sent().len()
    }
}

fn bth(opcode: u8, qpn: u32, psn: u32) -> Headers {
    Headers::new(Bth {
        opcode,
        se: false,
        pad: 0,
        pkey: DEFAULT_PKEY,
        dest_qp: qpn,
        ack_req: true,
        psn: psn & 0xFF_FFFF,
    })
}

fn mk<'a>(
    pd: &'a ProtectionDomain<'a, R>,
    cq: &'a CompletionQueue<'a, R>,
) -> QueuePair<'a, R, Rc, Reset> {
    pd.qp_builder(cq, cq).caps(caps(32)).build::<Rc>().unwrap()
}

/// An ACK or NAK (AETH `syndrome`) for `psn` to `qpn`.
fn answer(qpn: u32, psn: u32, syndrome: u8) -> Headers {
    let mut h = bth(opcode::RC_ACK, qpn, psn);
    h.aeth = Some(Aeth { syndrome, msn: 0 });
    h
}

/// A READ request of `len` bytes at (`va`, `rkey`).
fn read_request(qpn: u32, psn: u32, (va, rkey): (u64, u32), len: u32) -> Headers {
    let mut h = bth(opcode::RC_READ_REQUEST, qpn, psn);
    h.reth = Some(Reth { va, rkey, len });
    h
}

/// Posts one receive of 256 bytes of `mr` on `q`.
fn recv_one(q: &mut RcQp<'_>, mr: &MemoryRegion<'_, R>, id: u64) {
    // SAFETY: the tests keep their regions registered until their QPs are gone.
    unsafe {
        let mut r = q.recv_batch();
        r.recv(id, &[mr.sge(0, 256).unwrap()]).unwrap();
        r.finish();
    }
}

fn caps(depth: u32) -> QpCaps {
    QpCaps {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Brings an RC QP to RTS towards (`peer`, `ip`) at `mtu` with `rd` READs/atomics each way,
/// starting PSNs `psns` (send, receive).
fn up<'a>(
    qp: QueuePair<'a, R, Rc, Reset>,
    peer: u32,
    ip: [u8; 4],
    mtu: Mtu,
    rd: u8,
    psns: (u32, u32),
) -> RcQp<'a> {
    let init = ConnectedInit {
        access: ALL,
        ..Default::default()
    };
    let mut rtr = ConnectedRtr::new(peer, psns.1, AddressVector::new(Gid::from_ipv4(ip), 1));
    (rtr.path_mtu, rtr.max_dest_rd_atomic) = (mtu, rd);
    let mut rts = ConnectedRts::new(psns.0);
    (rts.max_rd_atomic, rts.timeout, rts.retry_cnt) = (rd, 8, 3);
    rc_to_rts(qp, &init, &rtr, &rts)
}

/// Runs both devices until the request outstanding on `cq`'s QP had time to complete, and
/// checks that it did, successfully, once.
fn one_success(l: &Lab, cq: &CompletionQueue<'_, R>) {
    l.run(20, 10);
    let got = drain(cq);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].status, WcStatus::Success);
}

/// What a test can see of a QP: state, send PSN, expected PSN.
fn seen(q: &RcQp<'_>) -> (QpState, u32, u32) {
    let a = q.query().unwrap();
    (a.state, a.sq_psn, a.rq_psn)
}

/// A connected pair A <-> B at MTU 256 with 4 READs/atomics, and one exchange done (each side
/// knows the other's MAC from ARP), with a region on each side.
macro_rules! connected {
    ($l:ident, $pa:ident, $pb:ident, $ca:ident, $cb:ident, $qa:ident, $qb:ident, $ma:ident, $mb:ident) => {
        let $pa = $l.a.alloc_pd().unwrap();
        let $pb = $l.b.alloc_pd().unwrap();
        let $ca = $l.a.create_cq(256).unwrap();
        let $cb = $l.b.create_cq(256).unwrap();
        let qa = $pa
            .qp_builder(&$ca, &$ca)
            .caps(caps(32))
            .build::<Rc>()
            .unwrap();
        let qb = $pb
            .qp_builder(&$cb, &$cb)
            .caps(caps(32))
            .build::<Rc>()
            .unwrap();
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        let (pa_, pb_) = ($l.a.random_psn(), $l.b.random_psn());
        #[allow(unused_mut)]
        let mut $qa = up(qa, nb, IP_B, Mtu::Mtu256, 4, (pa_, pb_));
        #[allow(unused_mut)]
        let mut $qb = up(qb, na, IP_A, Mtu::Mtu256, 4, (pb_, pa_));
        let $ma = $pa.register(8192, ALL).unwrap();
        let $mb = $pb.register(8192, ALL).unwrap();
        // SAFETY: the regions outlive the requests (completed below).
        unsafe {
            let mut r = $qb.recv_batch();
            r.recv(1, &[$mb.sge(0, 256).unwrap()]).unwrap();
            r.finish();
            let mut s = $qa.send_batch();
            s.send(2, SIG, &[$ma.sge(0, 16).unwrap()]).unwrap();
            s.finish();
        }
        $l.run(20, 10);
        assert_eq!(drain(&$ca).len(), 1, "the first SEND completes");
        assert_eq!(drain(&$cb).len(), 1, "and is received");
    };
}

#[test]
fn a_stranger_at_its_own_addresses_changes_nothing_on_either_side() {
    let l = lab();
    connected!(l, pa, pb, ca, cb, qa, qb, ma, mb);
    recv_one(&mut qb, &mb, 3);
    let before_b = seen(&qb);
    let epsn = before_b.2;
    let stranger = (MAC_S, IP_S);
    let to_b = (MAC_B, IP_B);
    let start = l.mark();
    // A SEND into B's posted receive, at the PSN B expects.
    l.forge(
        stranger,
        to_b,
        &bth(opcode::RC_SEND_ONLY, qb.qp_num(), epsn),
        b"stolen",
    );
    // A WRITE into B's region with its key.
    let mut h = bth(opcode::RC_WRITE_ONLY, qb.qp_num(), epsn);
    h.reth = Some(Reth {
        va: mb.addr() + 1024,
        rkey: mb.rkey(),
        len: 4,
    });
    l.forge(stranger, to_b, &h, b"evil");
    // A bad key, which moves the peer's QP to ERROR.
    h.reth = Some(Reth {
        va: 0,
        rkey: 0xDEAD,
        len: 4,
    });
    l.forge(stranger, to_b, &h, b"evil");
    l.run(3, 10);
    assert_eq!(seen(&qb), before_b, "B's QP unchanged");
    assert!(drain(&cb).is_empty(), "nothing received from a stranger");
    assert_eq!(mb.as_slice()[1024..1028], [0; 4], "nothing written");
    assert!(
        l.roce_sent(start, l.lb).is_empty(),
        "no answer (no PSN learnt, nothing reflected)"
    );
    // The requester: an ACK for A's outstanding SEND, from the stranger, while B is silent.
    // SAFETY: as above.
    unsafe {
        let mut s = qa.send_batch();
        s.send(4, SIG, &[ma.sge(0, 16).unwrap()]).unwrap();
        s.finish();
    }
    l.a.process_events();
    let sent_psn = seen(&qa).1.wrapping_sub(1) & 0xFF_FFFF;
    let ack = answer(qa.qp_num(), sent_psn, 0x1F);
    l.forge(stranger, (MAC_A, IP_A), &ack, &[]);
    let nak = answer(qa.qp_num(), sent_psn, 0x62);
    l.forge(stranger, (MAC_A, IP_A), &nak, &[]);
    l.a.process_events();
    assert!(
        drain(&ca).is_empty(),
        "a stranger's ACK or NAK completes nothing"
    );
    assert_eq!(seen(&qa).0, QpState::Rts);
    // The real peer's traffic goes on: both complete.
    one_success(&l, &ca);
    drop((qa, qb, ma, mb));
}

#[test]
fn answers_go_along_the_path_not_to_the_frames_source_mac() {
    let l = lab();
    connected!(l, pa, pb, ca, cb, qa, qb, ma, mb);
    let epsn = seen(&qb).2;
    let start = l.mark();
    // The peer's IP with the stranger's MAC: a READ of B's region.
    let h = read_request(qb.qp_num(), epsn, (mb.addr(), mb.rkey()), 64);
    l.forge((MAC_S, IP_A), (MAC_B, IP_B), &h, &[]);
    l.run(3, 10);
    let to_stranger: Vec<_> = l
        .roce_sent(start, l.lb)
        .into_iter()
        .filter(|f| f.0 == MAC_S)
        .collect();
    assert!(
        to_stranger.is_empty(),
        "READ data reflected: {to_stranger:?}"
    );
    // B still sends to A's MAC.
    let start = l.mark();
    // SAFETY: the regions outlive the requests.
    unsafe {
        let mut s = qb.send_batch();
        s.rdma_write(5, SIG, (ma.addr(), ma.rkey()), &[mb.sge(0, 8).unwrap()])
            .unwrap();
        s.finish();
    }
    l.run(10, 10);
    let sent = l.roce_sent(start, l.lb);
    assert!(
        !sent.is_empty() && sent.iter().all(|f| f.0 == MAC_A),
        "{sent:?}"
    );
    assert_eq!(drain(&cb).len(), 1);
    drop((qa, qb, ma, mb));
}

#[test]
fn an_answer_waits_for_the_peers_mac_from_arp_and_goes_there() {
    // B's QP is connected to A's address, but A has not answered B's ARP yet (A does not run):
    // a READ with A's IP from the stranger's MAC is taken on the IP alone, and its answer
    // waits for ARP, then goes to A, never to the MAC the frame came from.
    let l = lab();
    let pb = l.b.alloc_pd().unwrap();
    let cb = l.b.create_cq(64).unwrap();
    let qb = pb.qp_builder(&cb, &cb).caps(caps(8)).build::<Rc>().unwrap();
    let psn = l.b.random_psn();
    let qb = up(qb, 99, IP_A, Mtu::Mtu256, 4, (psn, psn));
    let mb = pb.register(4096, ALL).unwrap();
    let start = l.mark();
    let h = read_request(qb.qp_num(), psn, (mb.addr(), mb.rkey()), 64);
    l.forge((MAC_S, IP_A), (MAC_B, IP_B), &h, &[]);
    for _ in 0..5 {
        l.clk.advance(10);
        l.b.process_events();
    }
    let sent = l.roce_sent(start, l.lb);
    assert!(sent.is_empty(), "no answer before ARP: {sent:x?}");
    // A answers ARP now: the READ's response goes to A's MAC.
    l.run(5, 10);
    let sent = l.roce_sent(start, l.lb);
    assert!(
        !sent.is_empty() && sent.iter().all(|f| f.0 == MAC_A),
        "{sent:x?}"
    );
    drop((qb, mb));
}

#[test]
fn a_ud_opcode_to_an_rc_queue_pair_is_dropped_silently() {
    let l = lab();
    connected!(l, pa, pb, ca, cb, qa, qb, ma, mb);
    let before = seen(&qb);
    let start = l.mark();
    let mut h = bth(opcode::UD_SEND_ONLY, qb.qp_num(), before.2);
    h.bth.ack_req = false;
    h.deth = Some(Deth {
        qkey: 0x1111_1111,
        src_qp: qa.qp_num(),
    });
    // From the peer's own addresses.
    l.forge((MAC_A, IP_A), (MAC_B, IP_B), &h, b"datagram");
    l.run(3, 10);
    assert!(l.roce_sent(start, l.lb).is_empty(), "no NAK");
    assert_eq!(seen(&qb), before, "no ERROR, no PSN moved");
    drop((qa, qb, ma, mb));
}

#[test]
fn a_frame_to_another_stations_mac_is_not_taken() {
    let l = lab();
    connected!(l, pa, pb, ca, cb, qa, qb, ma, mb);
    recv_one(&mut qb, &mb, 3);
    let before = seen(&qb);
    // The peer's addresses, B's IP, the stranger's MAC as the destination (the in-memory
    // segment, like QEMU's virtio-net, hands every frame to every NIC).
    l.forge(
        (MAC_A, IP_A),
        (MAC_S, IP_B),
        &bth(opcode::RC_SEND_ONLY, qb.qp_num(), before.2),
        b"not yours",
    );
    l.run(3, 10);
    assert_eq!(seen(&qb), before);
    assert!(drain(&cb).is_empty());
    drop((qa, qb, ma, mb));
}

#[test]
fn frames_from_the_devices_own_address_off_the_wire_are_dropped() {
    let l = lab();
    let pb = l.b.alloc_pd().unwrap();
    let cb = l.b.create_cq(64).unwrap();
    let q1 = pb.qp_builder(&cb, &cb).caps(caps(8)).build::<Rc>().unwrap();
    let q2 = pb.qp_builder(&cb, &cb).caps(caps(8)).build::<Rc>().unwrap();
    let (n1, n2) = (q1.qp_num(), q2.qp_num());
    let (p1, p2) = (l.b.random_psn(), l.b.random_psn());
    let q1 = up(q1, n2, IP_B, Mtu::Mtu256, 4, (p1, p2));
    let mut q2 = up(q2, n1, IP_B, Mtu::Mtu256, 4, (p2, p1));
    let mb = pb.register(4096, ALL).unwrap();
    recv_one(&mut q2, &mb, 1);
    let before = seen(&q2);
    // B's own IP and MAC as the source, from the wire: a martian.
    l.forge(
        (MAC_B, IP_B),
        (MAC_B, IP_B),
        &bth(opcode::RC_SEND_ONLY, n2, before.2),
        b"loopback?",
    );
    l.run(3, 10);
    assert_eq!(seen(&q2), before);
    assert!(drain(&cb).is_empty());
    drop((q1, q2, mb));
}

#[test]
fn a_nak_older_than_the_oldest_outstanding_request_is_ignored() {
    let l = lab();
    connected!(l, pa, pb, ca, cb, qa, qb, ma, mb);
    // SAFETY: the regions outlive the requests.
    recv_one(&mut qb, &mb, 3);
    // SAFETY: the regions outlive the requests.
    unsafe {
        let mut s = qa.send_batch();
        s.send(4, SIG, &[ma.sge(0, 16).unwrap()]).unwrap();
        s.finish();
    }
    l.a.process_events();
    let una = seen(&qa).1.wrapping_sub(1) & 0xFF_FFFF;
    let start = l.mark();
    // From the peer: sequence NAKs for the PSN before the oldest outstanding one (answers to
    // requests already acknowledged), more of them than the retries.
    let nak = answer(qa.qp_num(), una.wrapping_sub(1), 0x60);
    for _ in 0..5 {
        l.forge((MAC_B, IP_B), (MAC_A, IP_A), &nak, &[]);
        l.a.process_events();
    }
    assert!(
        l.roce_sent(start, l.la).is_empty(),
        "no retransmission for an old NAK"
    );
    assert!(drain(&ca).is_empty(), "no retry exhausted");
    one_success(&l, &ca);
    drop((qa, qb, ma, mb));
}

#[test]
fn repeated_sequence_naks_start_one_retry_at_a_time() {
    let l = lab();
    connected!(l, pa, pb, ca, cb, qa, qb, ma, mb);
    // SAFETY: the regions outlive the requests.
    unsafe {
        let mut s = qa.send_batch();
        for i in 0..16 {
            s.rdma_write(
                10 + i,
                SIG,
                (mb.addr(), mb.rkey()),
                &[ma.sge(0, 16).unwrap()],
            )
            .unwrap();
        }
        s.finish();
    }
    l.a.process_events();
    let first = seen(&qa).1.wrapping_sub(16) & 0xFF_FFFF;
    let start = l.mark();
    let nak = answer(qa.qp_num(), first, 0x60);
    for _ in 0..200 {
        l.forge((MAC_B, IP_B), (MAC_A, IP_A), &nak, &[]);
        l.a.process_events();
    }
    let again = l.roce_sent(start, l.la).len();
    assert!(again <= 16, "{again} frames for 200 NAKs of one gap");
    l.run(30, 10);
    assert_eq!(drain(&ca).len(), 16);
    drop((qa, qb, ma, mb));
}

#[test]
fn a_read_beyond_max_dest_rd_atomic_waits_for_the_answers_before_it() {
    let l = lab();
    connected!(l, pa, pb, ca, cb, qa, qb, ma, mb);
    let epsn = seen(&qb).2;
    let deferred0 = l.b.provider().transport_counts().rd_atomic_deferred;
    // B's NIC full: nothing it answers goes out, so the READs stay in flight at B. Then a
    // flood of READs beyond its 4 (a requester deeper than it was given, or a hostile one).
    l.seg.set_tx_credit(l.lb, Some(0));
    for k in 0..1000 {
        let h = read_request(
            qb.qp_num(),
            epsn + k,
            (mb.addr() + 64 * (k % 4) as u64, mb.rkey()),
            64,
        );
        l.forge((MAC_A, IP_A), (MAC_B, IP_B), &h, &[]);
        if k % 64 == 0 {
            l.b.process_events();
        }
    }
    l.b.process_events();
    let t = l.b.provider().transport_counts();
    assert_eq!(
        t.rd_atomic_deferred - deferred0,
        1,
        "the fifth is not taken"
    );
    assert_eq!(seen(&qb).0, QpState::Rts, "the QP goes on");
    assert_eq!(
        seen(&qb).2,
        (epsn + 4) & 0xFF_FFFF,
        "the fifth's PSN still expected"
    );
    let start = l.mark();
    l.seg.set_tx_credit(l.lb, None);
    l.b.process_events();
    l.b.process_events();
    let sent = l.roce_sent(start, l.lb);
    let psn = |k: u32| (epsn + k) & 0xFF_FFFF;
    let expect: Vec<(u8, u32, u8)> = (0..4)
        .map(|k| (opcode::RC_READ_RESPONSE_ONLY, psn(k), 0x1F))
        .chain([(opcode::RC_ACK, psn(4), 0x60)])
        .collect();
    let got: Vec<(u8, u32, u8)> = sent.iter().map(|f| (f.1, f.3, f.4)).collect();
    assert_eq!(
        got, expect,
        "the four kept READs answered once each, in order, then one sequence NAK of the fifth"
    );
    // Asked for again, the fifth is taken and answered.
    let start = l.mark();
    let h = read_request(qb.qp_num(), epsn + 4, (mb.addr(), mb.rkey()), 64);
    l.forge((MAC_A, IP_A), (MAC_B, IP_B), &h, &[]);
    l.b.process_events();
    let sent = l.roce_sent(start, l.lb);
    assert_eq!(
        sent.iter().map(|f| (f.1, f.3)).collect::<Vec<_>>(),
        [(opcode::RC_READ_RESPONSE_ONLY, psn(4))]
    );
    assert_eq!(seen(&qb).2, psn(5));
    drop((qa, qb, ma, mb));
}

#[test]
fn an_error_nak_follows_the_answers_to_the_reads_taken_before_it() {
    let l = lab();
    connected!(l, pa, pb, ca, cb, qa, qb, ma, mb);
    let epsn = seen(&qb).2;
    let psn = |k: u32| (epsn + k) & 0xFF_FFFF;
    // Two READs B takes while its NIC is full, then one with a key B never gave.
    l.seg.set_tx_credit(l.lb, Some(0));
    for k in 0..2 {
        let h = read_request(qb.qp_num(), epsn + k, (mb.addr(), mb.rkey()), 64);
        l.forge((MAC_A, IP_A), (MAC_B, IP_B), &h, &[]);
    }
    let h = read_request(qb.qp_num(), epsn + 2, (mb.addr(), mb.rkey() ^ 0x100), 64);
    l.forge((MAC_A, IP_A), (MAC_B, IP_B), &h, &[]);
    l.b.process_events();
    assert_eq!(seen(&qb).0, QpState::Err);
    let start = l.mark();
    l.seg.set_tx_credit(l.lb, None);
    l.b.process_events();
    l.b.process_events();
    let got: Vec<(u8, u32, u8)> = l
        .roce_sent(start, l.lb)
        .iter()
        .map(|f| (f.1, f.3, f.4))
        .collect();
    // Ahead of the responses, the NAK would tell a requester they were lost (Linux's rxe
    // then asks again rather than failing the READ, and the QP in ERROR never answers).
    assert_eq!(
        got,
        [
            (opcode::RC_READ_RESPONSE_ONLY, psn(0), 0x1F),
            (opcode::RC_READ_RESPONSE_ONLY, psn(1), 0x1F),
            (opcode::RC_ACK, psn(2), 0x62),
        ]
    );
    // Nothing more: the QP is in ERROR.
    let start = l.mark();
    l.run(10, 10);
    assert!(l.roce_sent(start, l.lb).is_empty());
    drop((qa, qb, ma, mb));
}

#[test]
fn a_retry_of_many_reads_at_once_has_each_answered_again_in_order() {
    let l = lab();
    let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let (ca, cb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
    let qa = pa.qp_builder(&ca, &ca).caps(caps(8)).build::<Rc>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).caps(caps(8)).build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let (p1, p2) = (l.a.random_psn(), l.b.random_psn());
    let qa = up(qa, nb, IP_B, Mtu::Mtu256, 16, (p1, p2));
    let qb = up(qb, na, IP_A, Mtu::Mtu256, 16, (p2, p1));
    let mb = pb.register(16 * 1024, ALL).unwrap();
    l.run(5, 10);
    let e = seen(&qb).2;
    // 12 READs of 4 packets each, answered (more than one turn's 32 answers).
    let read = |k: u32| {
        let h = read_request(
            nb,
            e + 4 * k,
            (mb.addr() + 1024 * u64::from(k), mb.rkey()),
            1024,
        );
        l.forge((MAC_A, IP_A), (MAC_B, IP_B), &h, &[]);
    };
    (0..12).for_each(read);
    for _ in 0..4 {
        l.b.process_events();
    }
    assert_eq!(seen(&qb).2, (e + 48) & 0xFF_FFFF);
    // The requester asks for all 12 again, back to back (a retry from the first), while B's
    // NIC has room for 6 frames: the second READ's answers stop half way.
    let start = l.mark();
    l.seg.set_tx_credit(l.lb, Some(6));
    (0..12).for_each(read);
    l.b.process_events();
    l.seg.set_tx_credit(l.lb, None);
    for _ in 0..4 {
        l.b.process_events();
    }
    let firsts: Vec<u32> = l
        .roce_sent(start, l.lb)
        .iter()
        .filter(|f| f.1 == opcode::RC_READ_RESPONSE_FIRST)
        .map(|f| f.3.wrapping_sub(e) & 0xFF_FFFF)
        .collect();
    assert_eq!(
        firsts,
        (0..12).map(|k| 4 * k).collect::<Vec<_>>(),
        "each READ answered again once, in order"
    );
    drop((qa, qb, mb));
}

#[test]
fn fetch_adds_beyond_max_dest_rd_atomic_are_not_executed_until_taken() {
    let l = lab();
    connected!(l, pa, pb, ca, cb, qa, qb, ma, mb);
    let epsn = seen(&qb).2;
    let word = mb.addr() + 4096;
    // SAFETY: the region is registered and nothing else touches it now.
    unsafe { (word as *mut u64).write_volatile(0) };
    let add = |psn: u32| {
        let mut h = bth(opcode::RC_FETCH_ADD, qb.qp_num(), psn);
        h.atomic = Some(AtomicEth {
            va: word,
            rkey: mb.rkey(),
            swap_add: 1,
            compare: 0,
        });
        l.forge((MAC_A, IP_A), (MAC_B, IP_B), &h, &[]);
    };
    l.seg.set_tx_credit(l.lb, Some(0));
    // A flood of 500 fetch-and-adds, then those beyond the depth again: only the 4 B has
    // room for are executed, once each.
    for k in (0..500).chain(4..500) {
        add(epsn + k);
        if k % 32 == 0 {
            l.b.process_events();
        }
    }
    l.b.process_events();
    // SAFETY: as above.
    let v = unsafe { (word as *const u64).read_volatile() };
    assert_eq!(v, 4, "four taken, none beyond");
    let start = l.mark();
    l.seg.set_tx_credit(l.lb, None);
    l.b.process_events();
    l.b.process_events();
    let sent = l.roce_sent(start, l.lb);
    let acks = sent.iter().filter(|f| f.1 == opcode::RC_ATOMIC_ACK).count();
    let naks: Vec<_> = sent.iter().filter(|f| f.1 == opcode::RC_ACK).collect();
    assert_eq!(acks, 4);
    assert_eq!(naks.len(), 1, "{naks:x?}");
    assert_eq!((naks[0].3, naks[0].4), ((epsn + 4) & 0xFF_FFFF, 0x60));
    // The requester goes on from the fifth: it is executed now.
    for k in 4..8 {
        add(epsn + k);
    }
    l.b.process_events();
    // SAFETY: as above.
    let v = unsafe { (word as *const u64).read_volatile() };
    assert_eq!(v, 8);
    assert_eq!(seen(&qb).0, QpState::Rts);
    drop((qa, qb, ma, mb));
}

#[test]
fn a_requester_deeper_than_the_responder_gets_every_read_answered() {
    let l = lab();
    let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let (ca, cb) = (l.a.create_cq(256).unwrap(), l.b.create_cq(256).unwrap());
    let qa = pa
        .qp_builder(&ca, &ca)
        .caps(caps(64))
        .build::<Rc>()
        .unwrap();
    let qb = pb
        .qp_builder(&cb, &cb)
        .caps(caps(64))
        .build::<Rc>()
        .unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let (p1, p2) = (l.a.random_psn(), l.b.random_psn());
    // A keeps 16 READs in flight; B takes 4 (as Linux's passive rdma_cm against the device).
    let mut qa = up(qa, nb, IP_B, Mtu::Mtu256, 16, (p1, p2));
    let qb = up(qb, na, IP_A, Mtu::Mtu256, 4, (p2, p1));
    let ma = pa.register(32 * 512, ALL).unwrap();
    let mb = pb.register(32 * 512, ALL).unwrap();
    // SAFETY: B's region is registered and nothing else touches it now.
    unsafe {
        for i in 0..32 * 512 {
            (mb.addr() as *mut u8).add(i).write((i * 7 % 251) as u8);
        }
    }
    l.run(5, 10);
    let deferred0 = l.b.provider().transport_counts().rd_atomic_deferred;
    // SAFETY: the regions outlive the requests (completed below).
    unsafe {
        let mut s = qa.send_batch();
        for i in 0..32u32 {
            s.rdma_read(
                u64::from(i),
                SIG,
                (mb.addr() + u64::from(i) * 512, mb.rkey()),
                &[ma.sge(i * 512, 512).unwrap()],
            )
            .unwrap();
        }
        s.finish();
    }
    // B's NIC takes 3 frames a round: its answers fall behind, the READs beyond 4 wait.
    let mut got = Vec::new();
    for _ in 0..3000 {
        l.seg.set_tx_credit(l.lb, Some(3));
        l.run(1, 10);
        got.extend(drain(&ca));
        if got.len() == 32 {
            break;
        }
    }
    l.seg.set_tx_credit(l.lb, None);
    assert_eq!(got.len(), 32, "{got:?}");
    assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
    let mut ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..32).collect::<Vec<_>>(), "each READ once");
    // SAFETY: the READs completed; A's region holds what they brought.
    let a = unsafe { std::slice::from_raw_parts(ma.addr() as *const u8, 32 * 512) };
    assert!(a.iter().enumerate().all(|(i, &b)| b == (i * 7 % 251) as u8));
    let deferred = l.b.provider().transport_counts().rd_atomic_deferred - deferred0;
    assert!(deferred > 0, "B had READs beyond its depth to send back");
    assert_eq!(seen(&qb).0, QpState::Rts);
    drop((qa, qb, ma, mb));
}

#[test]
fn a_read_flood_on_one_queue_pair_does_not_hold_back_another_ones_acks() {
    let l = lab();
    let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let (ca, cb) = (l.a.create_cq(256).unwrap(), l.b.create_cq(256).unwrap());
    let (qa1, qa2, qb1, qb2) = (mk(&pa, &ca), mk(&pa, &ca), mk(&pb, &cb), mk(&pb, &cb));
    let (na1, na2, nb1, nb2) = (qa1.qp_num(), qa2.qp_num(), qb1.qp_num(), qb2.qp_num());
    let ps: [u32; 4] = core::array::from_fn(|_| l.a.random_psn());
    let mut qa1 = up(qa1, nb1, IP_B, Mtu::Mtu256, 4, (ps[0], ps[1]));
    let mut qa2 = up(qa2, nb2, IP_B, Mtu::Mtu256, 4, (ps[2], ps[3]));
    let qb1 = up(qb1, na1, IP_A, Mtu::Mtu256, 4, (ps[1], ps[0]));
    let mut qb2 = up(qb2, na2, IP_A, Mtu::Mtu256, 4, (ps[3], ps[2]));
    let ma = pa.register(65536, ALL).unwrap();
    let mb = pb.register(65536, ALL).unwrap();
    l.run(5, 1);
    // SAFETY: the regions outlive the requests.
    unsafe {
        let mut r = qb2.recv_batch();
        for i in 0..20 {
            r.recv(100 + i, &[mb.sge(0, 64).unwrap()]).unwrap();
        }
        r.finish();
    }
    // B's NIC is full while A's requests arrive: 4 READs of 16 KiB (256 responses) on one
    // connection, 20 SENDs on the other.
    l.seg.set_tx_credit(l.lb, Some(0));
    // SAFETY: as above.
    unsafe {
        let mut s = qa1.send_batch();
        for i in 0..4u64 {
            s.rdma_read(
                i,
                SIG,
                (mb.addr(), mb.rkey()),
                &[ma.sge(16384 * i as u32, 16384).unwrap()],
            )
            .unwrap();
        }
        s.finish();
        let mut s = qa2.send_batch();
        for i in 0..20 {
            s.send(200 + i, SIG, &[ma.sge(0, 8).unwrap()]).unwrap();
        }
        s.finish();
    }
    l.run(5, 1);
    // Then room for 8 frames a round, for less than A's retransmission timeout (about 1 ms):
    // B's answers to the READ flood and its ACKs to the SENDs share it.
    let start = l.mark();
    let mut acked_during_flood = false;
    for _ in 0..40 {
        l.seg.set_tx_credit(l.lb, Some(8));
        l.run(1, 1);
        let sent = l.roce_sent(start, l.lb);
        let responses = sent
            .iter()
            .filter(|f| f.2 == na1 && f.1 != opcode::RC_ACK)
            .count();
        if responses < 256 && sent.iter().any(|f| f.2 == na2 && f.1 == opcode::RC_ACK) {
            acked_during_flood = true;
        }
    }
    assert!(
        acked_during_flood,
        "the second connection's ACK went out during the flood"
    );
    l.seg.set_tx_credit(l.lb, None);
    l.run(100, 10);
    assert_eq!(drain(&ca).len(), 24, "everything completes");
    drop((qa1, qa2, qb1, qb2, ma, mb));
}

#[test]
fn the_backlog_answers_each_kept_request_once_whatever_their_psns_span() {
    let l = lab();
    let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let (ca, cb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
    let qa = pa.qp_builder(&ca, &ca).caps(caps(8)).build::<Rc>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).caps(caps(8)).build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let (p1, p2) = (l.a.random_psn(), l.b.random_psn());
    let qa = up(qa, nb, IP_B, Mtu::Mtu256, 16, (p1, p2));
    let qb = up(qb, na, IP_A, Mtu::Mtu256, 16, (p2, p1));
    l.run(5, 10);
    let small = pb.register(64, ALL).unwrap();
    // 1 GiB that is never touched (the READs' responses are never sent: the region goes away
    // before B has room): address space only.
    let mut big = vec![0u8; 1 << 30];
    // SAFETY: `big` outlives the region (dropped after it) and is not touched while it is
    // registered.
    let big_mr = unsafe {
        pb.register_user(
            core::ptr::NonNull::new(big.as_mut_ptr()).unwrap(),
            1 << 30,
            ALL,
        )
        .unwrap()
    };
    let n = (1u32 << 30) / 256; // PSNs of one READ at MTU 256
    let e = seen(&qb).2;
    l.seg.set_tx_credit(l.lb, Some(0));
    let atomic = |psn: u32| {
        let mut h = bth(opcode::RC_FETCH_ADD, nb, psn);
        h.atomic = Some(AtomicEth {
            va: small.addr(),
            rkey: small.rkey(),
            swap_add: 1,
            compare: 0,
        });
        l.forge((MAC_A, IP_A), (MAC_B, IP_B), &h, &[]);
    };
    let read = |psn: u32| {
        let h = read_request(nb, psn, (big_mr.addr(), big_mr.rkey()), 1 << 30);
        l.forge((MAC_A, IP_A), (MAC_B, IP_B), &h, &[]);
    };
    // Five requests whose PSNs span more than 2^23.
    atomic(e);
    read(e + 1);
    atomic(e + 1 + n);
    read(e + 2 + n);
    atomic(e + 2 + 2 * n);
    l.b.process_events();
    assert_eq!(seen(&qb).2, (e + 3 + 2 * n) & 0xFF_FFFF, "all five taken");
    drop(big_mr);
    let start = l.mark();
    l.seg.set_tx_credit(l.lb, Some(10_000));
    l.b.process_events();
    l.b.process_events();
    let acks = l
        .roce_sent(start, l.lb)
        .into_iter()
        .filter(|f| f.1 == opcode::RC_ATOMIC_ACK)
        .count();
    assert_eq!(acks, 3, "each atomic answered once");
    drop(big);
    drop((qa, qb, small));
}

#[test]
fn keys_carry_bits_from_the_devices_seed() {
    let key_of = |seed: u64| {
        let model = Model::new(ModelConfig::default());
        model.set_seed(seed);
        let seg = Segment::new();
        let ctx = Context::new(
            Rxe::new(
                model,
                seg.attach(MAC_A, 1514),
                TestClock::default(),
                Config { ip: IP_A },
            )
            .unwrap(),
        );
        let pd = ctx.alloc_pd().unwrap();
        let keys: Vec<u32> = (0..4)
            .map(|_| pd.register(64, ALL).unwrap())
            .map(|m| {
                let k = m.rkey();
                drop(m);
                k
            })
            .collect();
        keys
    };
    let (a, b) = (key_of(1), key_of(2));
    assert_eq!(
        a,
        key_of(1),
        "the same seed gives the same keys (tests replay)"
    );
    assert_ne!(a, b, "another seed, other keys");
    assert!(a.iter().all(|k| k >> 16 != 0) || b.iter().all(|k| k >> 16 != 0));
    // A slot used again never gives the key it gave before.
    let mut seen = a.clone();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), a.len(), "{a:x?}");
}

/// What a stranger learns by listening: for each (IPv4 destination, QPN) the PSNs seen.
fn learn(seg: &Segment, from: usize) -> BTreeMap<([u8; 4], u32), Vec<u32>> {
    let mut out: BTreeMap<([u8; 4], u32), Vec<u32>> = BTreeMap::new();
    for (who, f) in seg.sent() {
        if who == from {
            continue;
        }
        if let Ok(Frame::Roce(p)) = parse(&f) {
            out.entry((p.ip.dst, p.headers.bth.dest_qp))
                .or_default()
                .push(p.headers.bth.psn);
        }
    }
    out
}

/// Every RC, UC and UD opcode the wire knows, with the extended headers it needs.
fn every_opcode(qpn: u32, psn: u32, va: u64, rkey: u32) -> Vec<(Headers, Vec<u8>)> {
    let mut out = Vec::new();
    for op in (0x00..=0x14).chain(0x20..=0x2B).chain([0x64, 0x65]) {
        let mut h = bth(op, qpn, psn);
        let t = op & 0x1F;
        if matches!(t, 0x06 | 0x0A | 0x0B | 0x0C) {
            h.reth = Some(Reth { va, rkey, len: 8 });
        }
        if matches!(t, 0x13 | 0x14) {
            h.atomic = Some(AtomicEth {
                va,
                rkey,
                swap_add: 0xEE,
                compare: 0,
            });
        }
        if matches!(t, 0x03 | 0x05 | 0x09 | 0x0B) {
            h.imm = Some(0xBAD);
        }
        if matches!(op, 0x0D..=0x12) {
            h.aeth = Some(Aeth {
                syndrome: if op == 0x11 { 0x60 } else { 0x1F },
                msn: 0,
            });
        }
        if op == 0x12 {
            h.atomic_ack = Some(0xBAD);
        }
        if op >= 0x64 {
            h.deth = Some(Deth { qkey: 0, src_qp: 1 });
        }
        let payload = match t {
            0x0A | 0x0C..=0x12 | 0x13 | 0x14 if op < 0x60 => Vec::new(),
            0x00 | 0x01 | 0x06 | 0x07 => vec![0xEE; 256],
            _ => vec![0xEE; 8],
        };
        out.push((h, payload));
    }
    out
}

#[test]
fn a_stranger_flooding_every_opcode_at_every_live_qp_changes_nothing() {
    let l = lab();
    connected!(l, pa, pb, ca, cb, qa, qb, ma, mb);
    // The connection mid-stream: READs, WRITEs and atomics both ways, all complete.
    // SAFETY: the regions outlive the requests.
    unsafe {
        let mut s = qa.send_batch();
        s.rdma_read(
            20,
            SIG,
            (mb.addr(), mb.rkey()),
            &[ma.sge(4096, 600).unwrap()],
        )
        .unwrap();
        s.rdma_write(
            21,
            SIG,
            (mb.addr() + 2048, mb.rkey()),
            &[ma.sge(0, 700).unwrap()],
        )
        .unwrap();
        s.atomic_fetch_add(
            22,
            SIG,
            (mb.addr() + 8000, mb.rkey()),
            5,
            &ma.sge(8000, 8).unwrap(),
        )
        .unwrap();
        s.finish();
        let mut s = qb.send_batch();
        s.rdma_write(
            23,
            SIG,
            (ma.addr() + 2048, ma.rkey()),
            &[mb.sge(0, 300).unwrap()],
        )
        .unwrap();
        s.finish();
        let mut r = qb.recv_batch();
        r.recv(24, &[mb.sge(0, 256).unwrap()]).unwrap();
        r.finish();
        let mut r = qa.recv_batch();
        r.recv(25, &[ma.sge(0, 256).unwrap()]).unwrap();
        r.finish();
    }
    l.run(30, 10);
    assert_eq!(drain(&ca).len(), 3);
    assert_eq!(drain(&cb).len(), 1);
    let before = (
        seen(&qa),
        seen(&qb),
        ma.as_slice().to_vec(),
        mb.as_slice().to_vec(),
    );
    let start = l.mark();
    // The stranger listens, then floods: every opcode, at every QPN it saw, at each PSN it
    // saw and the ones next to it, from its own addresses and from half-spoofed ones (the
    // peer's IP with its own MAC, its own IP with the peer's MAC).
    let heard = learn(&l.seg, l.s);
    assert!(heard.len() >= 2, "both QPs heard: {heard:?}");
    let mut frames = 0u32;
    for ((ip, qpn), psns) in &heard {
        let (mac, peer, peer_mac, region) = if *ip == IP_A {
            (MAC_A, IP_B, MAC_B, &ma)
        } else {
            (MAC_B, IP_A, MAC_A, &mb)
        };
        let mut psns: Vec<u32> = psns
            .iter()
            .flat_map(|&p| [p, p + 1, p.wrapping_sub(1)])
            .collect();
        psns.sort_unstable();
        psns.dedup();
        for &psn in psns.iter().rev().take(12) {
            for (h, payload) in every_opcode(*qpn, psn, region.addr() + 64, region.rkey()) {
                for from in [(MAC_S, IP_S), (MAC_S, peer), (peer_mac, IP_S)] {
                    frames += u32::from(l.try_forge(from, (mac, *ip), &h, &payload));
                }
            }
            l.run(1, 10);
        }
    }
    l.run(10, 10);
    assert!(frames > 1000, "{frames} frames");
    let after = (
        seen(&qa),
        seen(&qb),
        ma.as_slice().to_vec(),
        mb.as_slice().to_vec(),
    );
    assert_eq!(after.0, before.0, "A's QP unchanged");
    assert_eq!(after.1, before.1, "B's QP unchanged");
    assert!(
        after.2 == before.2 && after.3 == before.3,
        "memory unchanged"
    );
    assert!(
        drain(&ca).is_empty() && drain(&cb).is_empty(),
        "no completion"
    );
    let answered: Vec<_> = l
        .roce_sent(start, l.la)
        .into_iter()
        .chain(l.roce_sent(start, l.lb))
        .collect();
    assert!(answered.is_empty(), "nothing answered: {answered:x?}");
    // The real peers still talk.
    // SAFETY: as above.
    unsafe {
        let mut s = qa.send_batch();
        s.send(30, SIG, &[ma.sge(0, 100).unwrap()]).unwrap();
        s.finish();
    }
    l.run(20, 10);
    assert_eq!(drain(&ca).len(), 1);
    assert_eq!(drain(&cb).len(), 1);
    let _ = ROCE_OFFSET;
    drop((qa, qb, ma, mb));
}
