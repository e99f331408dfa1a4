//! Unreliable datagrams over IPv6 on the software RoCE device, on an in-memory Ethernet
//! segment: an address handle to an IPv6 GID holds an IPv6 path (bounded, given back when the
//! handle is dropped), its datagrams go as RoCEv2 over IPv6, and a datagram that comes over
//! IPv6 on a held path lands with the IPv6 header in its GRH slot (the answer's address
//! handle made from it reaches the sender). A datagram over IPv6 from an address with no held
//! path is delivered on a path held for its delivery alone (the GSI QP's too: the CM speaks
//! IPv6), or dropped when the path table is full.

use bareverbs::Context;
use bareverbs::device::rxe::port::PATHS6;
use bareverbs::device::rxe::wire::bth::{Bth, DEFAULT_PKEY, Deth, Headers, opcode};
use bareverbs::device::rxe::wire::ip6::{Ip6, Ipv6Route, build6, parse6};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::error::{Error, Object, Resource};
use bareverbs::hal::Link;
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

type R = Rxe<Model, MemLink, TestClock>;

const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xA];
const MAC_B: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xB];
const MAC_X: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0x66];
const QKEY: u32 = 0x1111_2222;

fn global(last: u8) -> Ip6 {
    let mut a = [0u8; 16];
    a[..4].copy_from_slice(&[0xfd, 0, 0, 0]);
    a[15] = last;
    a
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

struct Lab {
    seg: Segment,
    clk: TestClock,
    lx: MemLink,
    a: Context<R>,
    b: Context<R>,
}

fn lab() -> Lab {
    let model = Model::new(ModelConfig::default());
    let seg = Segment::new();
    let clk = TestClock::default();
    let la = seg.attach(MAC_A, 1514);
    let lb = seg.attach(MAC_B, 1514);
    let lx = seg.attach(MAC_X, 1514);
    let da = Rxe::new(model.clone(), la, clk.clone(), Config { ip: [10, 0, 0, 1] }).unwrap();
    let db = Rxe::new(model, lb, clk.clone(), Config { ip: [10, 0, 0, 2] }).unwrap();
    assert_eq!(da.add_ipv6(global(1)), Ok(2));
    assert_eq!(db.add_ipv6(global(2)), Ok(2));
    Lab {
        seg,
        clk,
        lx,
        a: Context::new(da),
        b: Context::new(db),
    }
}

impl Lab {
    fn step(&self, n: usize) {
        for _ in 0..n {
            self.clk.advance(100);
            self.a.process_events();
            self.b.process_events();
        }
    }
}

/// A sends B a datagram by B's global IPv6 GID, B answers with the address handle made
/// from the completion and its GRH slot: both go as RoCEv2 over IPv6 between the two global
/// addresses (with the handle's traffic class and hop limit), both land whole with the
/// sender's QPN, and each GRH slot holds the IPv6 header from the sender to the receiver.
#[test]
fn datagrams_go_both_ways_by_ipv6_gids() {
    let lab = lab();
    let (a, b) = (&lab.a, &lab.b);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let qa = pa.qp_builder(&ca, &ca).caps(caps()).build::<Ud>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).caps(caps()).build::<Ud>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let mut qa = qa.ready(QKEY, 7).unwrap();
    let mut qb = qb.ready(QKEY, 9).unwrap();
    let mut ma = pa.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut mb = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let msg: Vec<u8> = (0..300u32).map(|i| (i * 5 + 1) as u8).collect();
    let reply: Vec<u8> = (0..200u32).map(|i| (i * 11 + 3) as u8).collect();
    ma.as_mut_slice()[..300].copy_from_slice(&msg);
    mb.as_mut_slice()[2048..2248].copy_from_slice(&reply);
    let mut av = AddressVector::new(Gid(global(2)), 2);
    (av.traffic_class, av.hop_limit) = (0x20, 9);
    let ah = pa.create_ah(&av).unwrap();
    let start = lab.seg.sent_count();
    // SAFETY: the regions stay registered and untouched until the completions.
    unsafe {
        let mut r = qb.recv_batch();
        r.recv(1, &[mb.sge(0, 40 + 300).unwrap()]).unwrap();
        r.finish();
        let mut r = qa.recv_batch();
        r.recv(2, &[ma.sge(1024, 40 + 200).unwrap()]).unwrap();
        r.finish();
        let mut s = qa.send_batch();
        s.send_to(
            3,
            SendFlags::SIGNALED,
            (&ah, nb, QKEY),
            &[ma.sge(0, 300).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    let mut wc = [WorkCompletion::default(); 4];
    let mut got_b = Vec::new();
    for _ in 0..500 {
        lab.step(1);
        let n = cb.poll(&mut wc).unwrap();
        got_b.extend_from_slice(&wc[..n]);
        if !got_b.is_empty() {
            break;
        }
    }
    assert_eq!(got_b.len(), 1, "B's receive");
    let w = got_b[0];
    assert_eq!(
        (w.wr_id, w.status, w.byte_len, w.src_qp),
        (1, WcStatus::Success, 340, na)
    );
    assert!(w.flags.contains(WcFlags::GRH));
    let grh = &mb.as_slice()[..40];
    assert_eq!(grh[0] >> 4, 6, "an IPv6 header in the GRH slot");
    assert_eq!((grh[6], grh[7]), (17, 9), "UDP, the hop limit");
    assert_eq!(u16::from_be_bytes([grh[4], grh[5]]), 8 + 12 + 8 + 300 + 4);
    assert_eq!(&grh[8..24], &global(1));
    assert_eq!(&grh[24..40], &global(2));
    assert_eq!(&mb.as_slice()[40..340], &msg[..]);
    // B answers along the completion.
    let back = pb.create_ah_from_wc(1, &w, &mb.as_slice()[..40]).unwrap();
    // SAFETY: as above.
    unsafe {
        let mut s = qb.send_batch();
        s.send_to(
            4,
            SendFlags::SIGNALED,
            (&back, na, QKEY),
            &[mb.sge(2048, 200).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    let mut got_a = Vec::new();
    for _ in 0..500 {
        lab.step(1);
        let n = ca.poll(&mut wc).unwrap();
        got_a.extend_from_slice(&wc[..n]);
        if got_a.len() == 2 {
            break;
        }
    }
    got_a.sort_by_key(|w| w.wr_id);
    let ids: Vec<_> = got_a.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(ids, [(2, WcStatus::Success), (3, WcStatus::Success)]);
    assert_eq!((got_a[0].byte_len, got_a[0].src_qp), (240, nb));
    let grh = &ma.as_slice()[1024..1064];
    assert_eq!(grh[0] >> 4, 6);
    assert_eq!(
        (&grh[8..24], &grh[24..40]),
        (&global(2)[..], &global(1)[..])
    );
    assert_eq!(&ma.as_slice()[1064..1264], &reply[..]);
    // On the wire between A and B: RoCEv2 over IPv6 only (and neighbour discovery).
    let mut roce6 = 0;
    for (from, f) in lab.seg.sent_since(start) {
        assert_ne!(&f[12..14], &[8, 0], "an IPv4 frame between IPv6 peers");
        if let Ok(Some(p)) = parse6(&f) {
            roce6 += 1;
            let (src, dst) = if from == 0 {
                (global(1), global(2))
            } else {
                (global(2), global(1))
            };
            assert_eq!((p.ip.src, p.ip.dst), (src, dst));
            if from == 0 {
                assert_eq!((p.ip.traffic_class, p.ip.hop_limit), (0x20, 9));
            }
        }
    }
    assert_eq!(roce6, 2);
    drop((ah, back));
    drop((qa, qb));
}

/// An address vector to `dgid` from the global source GID with flow label `flow` (a path of
/// its own per flow label).
fn flow_to(dgid: Ip6, flow: u32) -> AddressVector {
    let mut v = AddressVector::new(Gid(dgid), 2);
    v.flow_label = flow;
    v
}

/// An address handle's IPv6 path is held while it lives: [`PATHS6`] handles to distinct
/// peers at once, the next refused with `Ipv6Path`; dropping one lets the next in, and once
/// all are dropped the table is whole again. Handles to the same path share it.
#[test]
fn address_handles_give_their_ipv6_paths_back() {
    let lab = lab();
    let pd = lab.a.alloc_pd().unwrap();
    // Distinct paths by flow label, to one peer (PATHS6 is more than a byte's worth of
    // addresses past the lab's own).
    let to = |flow: u32| {
        let mut v = AddressVector::new(Gid(global(200)), 2);
        v.flow_label = flow;
        v
    };
    let full = Error::Resource(Resource::Objects {
        object: Object::Ipv6Path,
        limit: PATHS6 as u32,
    });
    for round in 0..2 {
        let mut ahs: Vec<_> = (0..PATHS6 as u32)
            .map(|i| pd.create_ah(&to(10 + i)).unwrap())
            .collect();
        // The same paths again: nothing more taken.
        let shared: Vec<_> = (0..4u32)
            .map(|i| pd.create_ah(&to(10 + i)).unwrap())
            .collect();
        assert_eq!(pd.create_ah(&to(9999)).err(), Some(full), "round {round}");
        drop(ahs.pop());
        let next = pd.create_ah(&to(9999)).unwrap();
        assert_eq!(pd.create_ah(&to(9998)).err(), Some(full));
        // A shared path stays while one handle holds it.
        drop(ahs.remove(0));
        assert_eq!(pd.create_ah(&to(9998)).err(), Some(full));
        drop(shared);
        let last = pd.create_ah(&to(9998)).unwrap();
        drop((ahs, next, last));
    }
    // IPv4 handles hold no path.
    let v4: Vec<_> = (0..PATHS6 + 8)
        .map(|i| {
            let ip = [10, 1, (i / 200) as u8, (i % 200) as u8 + 20];
            pd.create_ah(&AddressVector::new(Gid::from_ipv4(ip), 1))
                .unwrap()
        })
        .collect();
    assert!(pd.create_ah(&to(10)).is_ok());
    drop(v4);
}

/// Datagrams over IPv6 from X, a station B holds no path to, as any peer may send them
/// (UD takes a datagram from anyone with the Q_Key, as rxe does): to the UD QP it lands, its
/// GRH slot naming X, and leaves no path held (B can still hold [`PATHS6`] paths of its
/// own); with B's path table full it is dropped, to the UD QP and to the GSI QP alike; with
/// room again, the GSI QP takes X's datagram (the CM's MADs over IPv6), from X with a path
/// held or without, its GRH slot naming X.
#[test]
fn datagrams_over_ipv6_from_a_peer_without_a_path() {
    let mut lab = lab();
    let b = &lab.b;
    let pb = b.alloc_pd().unwrap();
    let cb = b.create_cq(16).unwrap();
    let qb = pb.qp_builder(&cb, &cb).caps(caps()).build::<Ud>().unwrap();
    let nb = qb.qp_num();
    let mut qb = qb.ready(QKEY, 9).unwrap();
    let gsi = pb.qp_builder(&cb, &cb).caps(caps()).build::<Gsi>().unwrap();
    let mut gsi = gsi.ready(0, 0).unwrap();
    let mb = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: the region stays registered until the end.
    unsafe {
        let mut r = qb.recv_batch();
        r.recv(1, &[mb.sge(0, 512).unwrap()]).unwrap();
        r.recv(3, &[mb.sge(2048, 512).unwrap()]).unwrap();
        r.finish();
        let mut r = gsi.recv_batch();
        r.recv(2, &[mb.sge(1024, 512).unwrap()]).unwrap();
        r.finish();
    }
    let forge = |lx: &mut MemLink, dest_qp: u32, qkey: u32| {
        let mut h = Headers::new(Bth {
            opcode: opcode::UD_SEND_ONLY,
            se: false,
            pad: 0,
            pkey: DEFAULT_PKEY,
            dest_qp,
            ack_req: false,
            psn: 1,
        });
        h.deth = Some(Deth { qkey, src_qp: 0x77 });
        let route = Ipv6Route {
            src_mac: MAC_X,
            dst_mac: MAC_B,
            src: global(0x66),
            dst: global(2),
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
            src_port: 0xC000,
        };
        let mut buf = [0u8; 512];
        let n = build6(&mut buf, &route, &h, b"datagram").unwrap();
        lx.transmit(&buf[..n]).unwrap();
    };
    let mut wc = [WorkCompletion::default(); 4];
    forge(&mut lab.lx, nb, QKEY);
    lab.step(20);
    assert_eq!(cb.poll(&mut wc).unwrap(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].src_qp, wc[0].byte_len),
        (1, WcStatus::Success, 0x77, 48)
    );
    assert_eq!(&mb.as_slice()[8..24], &global(0x66));
    assert_eq!(&mb.as_slice()[24..40], &global(2));
    assert_eq!(&mb.as_slice()[40..48], b"datagram");
    // No path left behind: B's own PATHS6 handles all fit.
    let ahs: Vec<_> = (0..PATHS6 as u32)
        .map(|i| pb.create_ah(&flow_to(global(200), i)).unwrap())
        .collect();
    // With the table full, X's next datagram has no path to go by: dropped.
    let before = b.provider().port_counts();
    forge(&mut lab.lx, nb, QKEY);
    // To QP1: dropped too, the table full.
    forge(&mut lab.lx, 1, 0x8001_0000);
    lab.step(20);
    assert_eq!(cb.poll(&mut wc).unwrap(), 0, "a datagram was taken");
    let after = b.provider().port_counts();
    assert_eq!(after.roce6 - before.roce6, 2, "both checked at the port");
    assert_eq!(after.dropped - before.dropped, 2, "both dropped");
    drop(ahs);
    // Room again: QP1 takes X's datagram on a path of its own, then (with a receive posted
    // again) on the path B holds to X.
    forge(&mut lab.lx, 1, 0x8001_0000);
    lab.step(20);
    assert_eq!(
        cb.poll(&mut wc).unwrap(),
        1,
        "QP1 took no datagram over IPv6"
    );
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::Success));
    assert_eq!(&mb.as_slice()[1024 + 8..1024 + 24], &global(0x66));
    let to_x = pb
        .create_ah(&AddressVector::new(Gid(global(0x66)), 2))
        .unwrap();
    // SAFETY: as above.
    unsafe {
        let mut r = gsi.recv_batch();
        r.recv(4, &[mb.sge(1536, 512).unwrap()]).unwrap();
        r.finish();
    }
    forge(&mut lab.lx, 1, 0x8001_0000);
    lab.step(20);
    assert_eq!(
        cb.poll(&mut wc).unwrap(),
        1,
        "QP1 took no datagram on a path"
    );
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].src_qp),
        (4, WcStatus::Success, 0x77)
    );
    assert_eq!(&mb.as_slice()[1536 + 8..1536 + 24], &global(0x66));
    assert_eq!(&mb.as_slice()[1536 + 40..1536 + 48], b"datagram");
    drop(to_x);
    // No path left behind by the datagram taken without one: all PATHS6 fit again.
    let ahs: Vec<_> = (0..PATHS6 as u32)
        .map(|i| pb.create_ah(&flow_to(global(200), i)).unwrap())
        .collect();
    drop(ahs);
    drop((qb, gsi));
}

/// A send naming an address handle that is dropped before the send goes (its peer not
/// resolved yet), its path slot then taken by a handle to another peer: the send never goes
/// to the new peer; it completes in error (its path is gone), and the new handle's send goes
/// to its own peer.
#[test]
fn a_send_outliving_its_address_handle_goes_nowhere() {
    let lab = lab();
    let a = &lab.a;
    let pa = a.alloc_pd().unwrap();
    let ca = a.create_cq(16).unwrap();
    let qa = pa.qp_builder(&ca, &ca).caps(caps()).build::<Ud>().unwrap();
    let mut qa = qa.ready(QKEY, 7).unwrap();
    let ma = pa.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // Nobody answers for ::77: the send waits on neighbour discovery.
    let gone = pa
        .create_ah(&AddressVector::new(Gid(global(0x77)), 2))
        .unwrap();
    // SAFETY: the region stays registered until the completions.
    unsafe {
        let mut s = qa.send_batch();
        s.send_to(
            1,
            SendFlags::SIGNALED,
            (&gone, 0x42, QKEY),
            &[ma.sge(0, 64).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    lab.step(1);
    drop(gone);
    // The same slot, the next generation: B's address.
    let to_b = pa
        .create_ah(&AddressVector::new(Gid(global(2)), 2))
        .unwrap();
    // SAFETY: as above.
    unsafe {
        let mut s = qa.send_batch();
        s.send_to(
            2,
            SendFlags::SIGNALED,
            (&to_b, 0x43, QKEY),
            &[ma.sge(0, 64).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    let start = lab.seg.sent_count();
    let mut wc = [WorkCompletion::default(); 4];
    let mut got = Vec::new();
    for _ in 0..200 {
        lab.step(1);
        let n = ca.poll(&mut wc).unwrap();
        got.extend(wc[..n].iter().map(|w| (w.wr_id, w.status)));
        if got.len() == 2 {
            break;
        }
    }
    got.sort_by_key(|g| g.0);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0, 1);
    assert_ne!(got[0].1, WcStatus::Success, "the orphaned send");
    assert_eq!(got[1], (2, WcStatus::Success));
    // One datagram on the wire to B: the second send's, to its QPN.
    let to_b: Vec<_> = lab
        .seg
        .sent_since(start)
        .into_iter()
        .filter_map(|(_, f)| parse6(&f).ok().flatten().map(|p| p.headers.bth.dest_qp))
        .collect();
    assert_eq!(to_b, [0x43]);
    drop(qa);
}
