//! The software RoCE device talking to itself: frames to its own address are looped back at
//! the interface (as Linux's rxe loops them), built byte for byte as for the wire and taken
//! through the same receive checks, never put on the segment. A CM connection from the device
//! to its own address (listen and connect on one CM) carrying SEND, WRITE and READ, then a
//! disconnection; UD datagrams in order; an RC stream on a lossy segment (the loopback is not
//! the segment: nothing lost, nothing resent) that overflows the loopback queue (the sender
//! waits and nothing is lost); and the same addresses forged from the wire, still dropped.

mod cm_common;

use bareverbs::cm::msg::{self, CmaHeader, Private, Req, pdata};
use bareverbs::cm::{AcceptParams, CmConfig, CmEvent, ConnectParams, Service};
use bareverbs::device::rxe::LOOPBACK_FRAMES;
use bareverbs::verbs::*;
use bareverbs_model::link::Faults;
use cm_common::*;

const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];
const MAC_C: [u8; 6] = [0x52, 0x54, 0, 0, 0, 4];
const SIG: SendFlags = SendFlags::SIGNALED;

fn pattern(seed: u32, n: usize) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(7)) as u8)
        .collect()
}

/// Whether device A put anything on the segment (link 0 is A's).
fn a_sent_nothing(l: &Lab) -> bool {
    l.seg.sent().iter().all(|(from, _)| *from != 0)
}

/// Runs the one CM (1 ms a round, at most `rounds`), collecting its events, until `done`.
fn run_until<'a>(
    l: &Lab,
    c: &mut TestCm<'a>,
    evs: &mut Events<'a>,
    rounds: u32,
    done: impl Fn(&Events<'a>) -> bool,
) -> bool {
    for _ in 0..rounds {
        if done(evs) {
            return true;
        }
        l.clk.advance(1000);
        while let Some(e) = c.poll() {
            evs.push(e);
        }
    }
    done(evs)
}

/// Polls `cq` (the device progresses with it) until it holds `n` completions.
fn wait(l: &Lab, cq: &CompletionQueue<'_, R>, n: usize) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    let mut wc = [WorkCompletion::default(); 16];
    for _ in 0..100_000 {
        if got.len() >= n {
            break;
        }
        l.clk.advance(10);
        let k = cq.poll(&mut wc).unwrap();
        got.extend_from_slice(&wc[..k]);
    }
    assert_eq!(got.len(), n, "{got:?}");
    got
}

#[test]
fn a_cm_connection_to_the_devices_own_address_carries_send_write_read_and_disconnects() {
    let l = lab(Faults::default(), (11, 22));
    let pd = l.a.alloc_pd().unwrap();
    let mq = l.a.create_cq(64).unwrap();
    let (dq, pq) = (l.a.create_cq(64).unwrap(), l.a.create_cq(64).unwrap());
    let mut c = cm(&pd, &mq, &l.clk, CmConfig::default());
    c.listen(None, 7174, Service::Rc).unwrap();
    let qa = rc_qp(&pd, &dq);
    let act_qpn = qa.qp_num();
    let params = ConnectParams {
        private_data: b"to myself",
        ..ConnectParams::default()
    };
    let id = c.connect(qa, IP_A, 7174, &params).unwrap();
    let mut evs = Vec::new();
    assert!(run_until(&l, &mut c, &mut evs, 100, |e| !e.is_empty()));
    let CmEvent::ConnectRequest(req) = evs.remove(0) else {
        panic!("not a request: {evs:?}")
    };
    assert_ne!(req.id, id, "the passive side has its own communication ID");
    assert_eq!((req.src_ip, req.dst_ip, req.dst_port), (IP_A, IP_A, 7174));
    assert_eq!(&req.private_data.as_slice()[..9], b"to myself");
    let qb = rc_qp(&pd, &pq);
    let accept = AcceptParams {
        private_data: b"hello me",
        ..AcceptParams::default()
    };
    let mut qb = c.accept(req.id, qb, &accept).unwrap();
    assert!(run_until(&l, &mut c, &mut evs, 100, |e| e.len() >= 2));
    let mut qa = None;
    for e in evs.drain(..) {
        match e {
            CmEvent::Established {
                id: got,
                qp: Some(q),
                private_data,
            } => {
                assert_eq!(got, id);
                assert_eq!(&private_data.as_slice()[..8], b"hello me");
                qa = Some(q);
            }
            CmEvent::Established {
                id: got, qp: None, ..
            } => assert_eq!(got, req.id),
            e => panic!("{e:?}"),
        }
    }
    let mut qa = qa.expect("the active side's QP");
    assert_eq!(qa.query().unwrap().dest_qpn, qb.qp_num());
    assert_eq!(qb.query().unwrap().dest_qpn, act_qpn);

    // SEND from the active QP, WRITE from the passive one, READ by the active one back.
    let mut ma = pd.register(16384, ALL).unwrap();
    let mut mb = pd.register(16384, ALL).unwrap();
    let data = pattern(5, 3000);
    ma.as_mut_slice()[..3000].copy_from_slice(&data);
    mb.as_mut_slice()[8192..11000].copy_from_slice(&pattern(6, 2808));
    // SAFETY: the regions stay registered and untouched until the completions.
    unsafe {
        let mut r = qb.recv_batch();
        r.recv(1, &[mb.sge(0, 4096).unwrap()]).unwrap();
        r.finish();
        let mut s = qa.send_batch();
        s.send(2, SIG, &[ma.sge(0, 3000).unwrap()]).unwrap();
        s.finish();
        let mut s = qb.send_batch();
        s.rdma_write(
            3,
            SIG,
            (ma.addr() + 4096, ma.rkey()),
            &[mb.sge(8192, 2808).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    let (wa, wb) = (wait(&l, &dq, 1), wait(&l, &pq, 2));
    assert_eq!((wa[0].wr_id, wa[0].status), (2, WcStatus::Success));
    assert!(wb.iter().all(|w| w.status == WcStatus::Success), "{wb:?}");
    let recv = wb.iter().find(|w| w.wr_id == 1).unwrap();
    assert_eq!(recv.byte_len, 3000);
    assert_eq!(&mb.as_slice()[..3000], &data[..]);
    assert_eq!(&ma.as_slice()[4096..6904], &pattern(6, 2808)[..]);
    // SAFETY: as above.
    unsafe {
        let mut s = qa.send_batch();
        s.rdma_read(
            4,
            SIG,
            (mb.addr(), mb.rkey()),
            &[ma.sge(8192, 3000).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    let wa = wait(&l, &dq, 1);
    assert_eq!((wa[0].wr_id, wa[0].status), (4, WcStatus::Success));
    assert_eq!(&ma.as_slice()[8192..11192], &data[..]);

    // The active side disconnects; both ends see it and leave TIME_WAIT.
    c.disconnect(id).unwrap();
    assert!(run_until(&l, &mut c, &mut evs, 3000, |e| e.len() >= 4));
    let mut seen: Vec<_> = evs
        .iter()
        .map(|e| match e {
            CmEvent::Disconnected { id: x } => (0, x.0),
            CmEvent::TimeWaitExit { id: x } => (1, x.0),
            e => panic!("{e:?}"),
        })
        .collect();
    seen.sort();
    let (lo, hi) = (id.0.min(req.id.0), id.0.max(req.id.0));
    assert_eq!(seen, [(0, lo), (0, hi), (1, lo), (1, hi)]);
    assert_eq!(c.in_use(), 0);
    let n = c.counts();
    assert_eq!((n.resent, n.malformed, n.send_dropped), (0, 0, 0), "{n:?}");
    // REQ, REP, RTU, DREQ, DREP: each sent once and received once, by the same CM.
    assert_eq!((n.sent, n.received), (5, 5), "{n:?}");
    let p = l.a.provider().port_counts();
    assert_eq!((p.dropped, p.arp_sent), (0, 0), "{p:?}");
    assert_eq!(l.a.provider().transport_counts().timeouts, 0);
    assert!(a_sent_nothing(&l), "loopback: nothing on the wire");
    drop((qa, qb, ma, mb));
}

#[test]
fn ud_datagrams_to_the_devices_own_address_arrive_in_order_past_the_queues_size() {
    let l = lab(Faults::default(), (1, 2));
    let pd = l.a.alloc_pd().unwrap();
    let cq = l.a.create_cq(64).unwrap();
    let rq = l.a.create_cq(64).unwrap();
    let caps = QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mk = |cq| {
        let q = pd.qp_builder(cq, cq).caps(caps).build::<Ud>().unwrap();
        q.ready(0x1111_1111, 0).unwrap()
    };
    let (mut u, mut v) = (mk(&cq), mk(&rq));
    let ah = pd
        .create_ah(&AddressVector::new(Gid::from_ipv4(IP_A), 1))
        .unwrap();
    const N: usize = 4 * LOOPBACK_FRAMES;
    let mut m = pd.register(N * 1024 * 2, ALL).unwrap();
    for k in 0..N {
        m.as_mut_slice()[k * 1024..k * 1024 + 600].copy_from_slice(&pattern(k as u32, 600));
    }
    let rx = N * 1024;
    // SAFETY: the region stays registered and untouched until the completions.
    unsafe {
        let mut r = v.recv_batch();
        for k in 0..N {
            let at = (rx + k * 1024) as u32;
            r.recv(k as u64, &[m.sge(at, 1024).unwrap()]).unwrap();
        }
        r.finish();
        let mut s = u.send_batch();
        for k in 0..N {
            let sge = m.sge((k * 1024) as u32, 600).unwrap();
            s.send_to(100 + k as u64, SIG, (&ah, v.qp_num(), 0x1111_1111), &[sge])
                .unwrap();
        }
        s.finish();
    }
    let sent = wait(&l, &cq, N);
    assert!(sent.iter().all(|w| w.status == WcStatus::Success));
    let got = wait(&l, &rq, N);
    // In the order sent: receive k holds datagram k.
    for (k, w) in got.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.byte_len, w.src_qp),
            (k as u64, WcStatus::Success, 640, u.qp_num())
        );
        let b = &m.as_slice()[rx + k * 1024..];
        assert_eq!(&b[32..36], &IP_A, "the IPv4 source in the GRH slot");
        assert_eq!(&b[40..640], &pattern(k as u32, 600)[..]);
    }
    let p = l.a.provider().port_counts();
    assert!(p.loopback_full > 0, "the queue filled: {p:?}");
    assert_eq!((p.roce, p.dropped), (N as u64, 0), "{p:?}");
    assert!(a_sent_nothing(&l));
    drop((u, v, m));
}

#[test]
fn an_rc_stream_to_itself_on_a_lossy_segment_loses_nothing_and_waits_when_the_queue_is_full() {
    let l = lab(
        Faults {
            drop: 80,
            duplicate: 50,
            reorder: 50,
            seed: 7,
        },
        (3, 4),
    );
    let pd = l.a.alloc_pd().unwrap();
    let cq = l.a.create_cq(128).unwrap();
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let x = pd.qp_builder(&cq, &cq).caps(caps).build::<Rc>().unwrap();
    let y = pd.qp_builder(&cq, &cq).caps(caps).build::<Rc>().unwrap();
    let (nx, ny) = (x.qp_num(), y.qp_num());
    let (px, py) = (l.a.random_psn(), l.a.random_psn());
    let mut x = up(x, ny, (px, py));
    let mut y = up(y, nx, (py, px));
    // 24 SENDs of 3 packets each, then a WRITE and a READ of 8 packets: far more than the
    // loopback queue holds at once.
    const SENDS: usize = 24;
    let mut m = pd.register(SENDS * 4096 * 2 + 32768, ALL).unwrap();
    for k in 0..SENDS {
        m.as_mut_slice()[k * 4096..k * 4096 + 3000].copy_from_slice(&pattern(k as u32, 3000));
    }
    let rx = SENDS * 4096;
    let big = 2 * rx;
    m.as_mut_slice()[big..big + 8192].copy_from_slice(&pattern(99, 8192));
    // SAFETY: the region stays registered and untouched until the completions.
    unsafe {
        let mut r = y.recv_batch();
        for k in 0..SENDS {
            let at = (rx + k * 4096) as u32;
            r.recv(k as u64, &[m.sge(at, 4096).unwrap()]).unwrap();
        }
        r.finish();
        let mut s = x.send_batch();
        for k in 0..SENDS {
            let sge = m.sge((k * 4096) as u32, 3000).unwrap();
            s.send(100 + k as u64, SIG, &[sge]).unwrap();
        }
        let base = m.addr() + big as u64;
        s.rdma_write(
            200,
            SIG,
            (base + 8192, m.rkey()),
            &[m.sge(big as u32, 8192).unwrap()],
        )
        .unwrap();
        s.rdma_read(
            201,
            SIG,
            (base + 8192, m.rkey()),
            &[m.sge((big + 16384) as u32, 8192).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    let got = wait(&l, &cq, 2 * SENDS + 2);
    assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
    let recvs: Vec<_> = got.iter().filter(|w| w.wr_id < 100).collect();
    let sends: Vec<_> = got.iter().filter(|w| w.wr_id >= 100).collect();
    // Each in the order posted, each once.
    assert_eq!(
        recvs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (0..SENDS as u64).collect::<Vec<_>>()
    );
    assert_eq!(
        sends.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (100..100 + SENDS as u64)
            .chain([200, 201])
            .collect::<Vec<_>>()
    );
    for (k, w) in recvs.iter().enumerate() {
        assert_eq!(w.byte_len, 3000);
        let at = rx + k * 4096;
        assert_eq!(&m.as_slice()[at..at + 3000], &pattern(k as u32, 3000)[..]);
    }
    assert_eq!(
        &m.as_slice()[big + 8192..big + 16384],
        &pattern(99, 8192)[..]
    );
    assert_eq!(
        &m.as_slice()[big + 16384..big + 24576],
        &pattern(99, 8192)[..]
    );
    let p = l.a.provider().port_counts();
    assert!(p.loopback_full > 0, "the queue filled: {p:?}");
    assert_eq!(p.dropped, 0, "{p:?}");
    let t = l.a.provider().transport_counts();
    assert_eq!(
        (t.timeouts, t.duplicates, t.out_of_sequence, t.seq_naks_sent),
        (0, 0, 0, 0),
        "lossless: {t:?}"
    );
    assert!(a_sent_nothing(&l));
    drop((x, y, m));
}

/// Brings `q` to RTS towards `peer` on this device (A's own address), at MTU 1024.
fn up<'a>(
    q: QueuePair<'a, R, Rc, Reset>,
    peer: u32,
    (sq, rq): (u32, u32),
) -> QueuePair<'a, R, Rc, Rts> {
    let q = q
        .init(&ConnectedInit {
            access: ALL,
            ..Default::default()
        })
        .unwrap();
    let mut rtr = ConnectedRtr::new(peer, rq, AddressVector::new(Gid::from_ipv4(IP_A), 1));
    (rtr.path_mtu, rtr.max_dest_rd_atomic) = (Mtu::Mtu1024, 4);
    let mut rts = ConnectedRts::new(sq);
    rts.max_rd_atomic = 4;
    q.rtr(&rtr).unwrap().rts(&rts).unwrap()
}

/// A REQ to A's port 7174 as a station would send it from `src_ip`.
fn req_from(src_ip: [u8; 4]) -> Vec<u8> {
    let mut private = [0u8; pdata::REQ];
    private[..36].copy_from_slice(
        &CmaHeader {
            src_port: 40000,
            src_ip,
            dst_ip: IP_A,
        }
        .to_bytes(),
    );
    Req {
        local_comm_id: 0x4242,
        service_id: msg::service_id(msg::PS_TCP, 7174),
        local_ca_guid: 0x5054_00FF_FE00_0004,
        local_qpn: 0x40,
        responder_resources: 1,
        initiator_depth: 1,
        remote_cm_response_timeout: 20,
        transport: 0,
        flow_control: false,
        starting_psn: 1,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xFFFF,
        mtu: 3,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        local_gid: Gid::from_ipv4(src_ip).0,
        remote_gid: Gid::from_ipv4(IP_A).0,
        flow_label: 0,
        traffic_class: 0,
        hop_limit: 64,
        local_ack_timeout: 14,
        private: Private {
            bytes: private,
            len: pdata::REQ,
        },
    }
    .encode(7)
    .0
    .to_vec()
}

/// Puts on the segment, from station C's link, a datagram to A's QP1 from (`mac`, `ip`).
fn forge_to_a(l: &Lab, (mac, ip): ([u8; 6], [u8; 4]), mad: &[u8]) {
    use bareverbs::device::rxe::wire::bth::{Bth, Deth, Headers, opcode};
    use bareverbs::device::rxe::wire::packet::{Route, build};
    let route = Route {
        src_mac: mac,
        dst_mac: MAC_A,
        src_ip: ip,
        dst_ip: IP_A,
        tos: 0,
        ttl: 64,
        src_port: 0xC000,
    };
    let mut h = Headers::new(Bth {
        opcode: opcode::UD_SEND_ONLY,
        se: false,
        pad: 0,
        pkey: 0xFFFF,
        dest_qp: 1,
        ack_req: false,
        psn: 0,
    });
    h.deth = Some(Deth {
        qkey: 0x8001_0000,
        src_qp: 1,
    });
    let mut buf = vec![0u8; 1600];
    let n = build(&mut buf, &route, 1, &h, mad).unwrap();
    l.seg.inject(2, &buf[..n]);
}

#[test]
fn a_req_off_the_wire_from_the_devices_own_address_is_dropped_as_before() {
    let l = lab(Faults::default(), (5, 6));
    let pd = l.a.alloc_pd().unwrap();
    let mq = l.a.create_cq(64).unwrap();
    let mut c = cm(&pd, &mq, &l.clk, CmConfig::default());
    c.listen(None, 7174, Service::Rc).unwrap();
    // A's own address as the source, with A's MAC or with the sender's: a martian source,
    // dropped at the port before QP1 sees it, however well formed the REQ.
    for mac in [MAC_A, MAC_C] {
        forge_to_a(&l, (mac, IP_A), &req_from(IP_A));
    }
    let mut evs = Vec::new();
    assert!(!run_until(&l, &mut c, &mut evs, 50, |e| !e.is_empty()));
    let p = l.a.provider().port_counts();
    assert_eq!((p.roce, p.dropped), (0, 2), "{p:?}");
    assert_eq!(c.counts().received, 0);
    // The same REQ from C's address is a request: the drop was the source's doing.
    forge_to_a(&l, (MAC_C, IP_C), &req_from(IP_C));
    assert!(run_until(&l, &mut c, &mut evs, 50, |e| !e.is_empty()));
    let [CmEvent::ConnectRequest(r)] = &evs[..] else {
        panic!("{evs:?}")
    };
    assert_eq!((r.src_ip, r.dst_port), (IP_C, 7174));
    assert_eq!(l.a.provider().port_counts().roce, 1);
}
