//! The software RoCE device's port (`src/device/rxe/port.rs`) on an in-memory Ethernet
//! segment: ARP answered and resolved with bounded retries, the neighbour cache bounded and
//! learnt from ARP only, received frames split between the transport and the IP stack, frames
//! to other MACs and from martian sources dropped.

use bareverbs::ErrorKind;
use bareverbs::device::rxe::port::{ARP_RETRY_US, ARP_TRIES, NEIGHBOURS, Port, Rx};
use bareverbs::device::rxe::wire::Discard;
use bareverbs::device::rxe::wire::bth::{Bth, DEFAULT_PKEY, Headers, opcode};
use bareverbs::device::rxe::wire::eth::{Arp, ArpOp, BROADCAST};
use bareverbs::device::rxe::wire::packet::{Frame, Route, build, parse};
use bareverbs::hal::Link;
use bareverbs::verbs::Gid;
use bareverbs_model::link::{MemLink, Segment};

const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xA];
const MAC_B: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xB];
const IP_A: [u8; 4] = [10, 0, 0, 1];
const IP_B: [u8; 4] = [10, 0, 0, 2];

fn recv(link: &mut MemLink) -> Option<Vec<u8>> {
    let mut buf = [0u8; 1600];
    link.receive(&mut buf).map(|n| buf[..n].to_vec())
}

/// A RoCE SEND_ONLY from (`mac`, `ip`) to `dst` (at MAC_A).
fn roce_from(mac: [u8; 6], ip: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    roce_to(MAC_A, mac, ip, dst)
}

/// A RoCE SEND_ONLY from (`mac`, `ip`) to (`dst_mac`, `dst`).
fn roce_to(dst_mac: [u8; 6], mac: [u8; 6], ip: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let h = Headers::new(Bth {
        opcode: opcode::RC_SEND_ONLY,
        se: false,
        pad: 0,
        pkey: DEFAULT_PKEY,
        dest_qp: 0x11,
        ack_req: true,
        psn: 7,
    });
    let r = Route {
        src_mac: mac,
        dst_mac,
        src_ip: ip,
        dst_ip: dst,
        tos: 0,
        ttl: 64,
        src_port: 0xC000,
    };
    let mut buf = [0u8; 256];
    let n = build(&mut buf, &r, 1, &h, b"data").unwrap();
    buf[..n].to_vec()
}

#[test]
fn two_ports_resolve_each_other_with_one_request_and_one_answer() {
    let seg = Segment::new();
    let (mut la, mut lb) = (seg.attach(MAC_A, 1514), seg.attach(MAC_B, 1514));
    let (mut a, mut b) = (Port::new(MAC_A, IP_A), Port::new(MAC_B, IP_B));
    assert_eq!(
        a.resolve(&mut la, IP_B, 0).unwrap(),
        None,
        "asked, not known yet"
    );
    assert_eq!(
        a.resolve(&mut la, IP_B, 10).unwrap(),
        None,
        "no second request so soon"
    );
    assert_eq!(seg.sent().len(), 1);
    let req = recv(&mut lb).unwrap();
    assert_eq!(&req[..6], &BROADCAST);
    assert_eq!(
        b.receive(&mut lb, &req, 20),
        Rx::Stack,
        "ARP goes on to the IP stack too"
    );
    assert_eq!(b.counts().arp_answered, 1);
    let reply = recv(&mut la).expect("B answered");
    let Ok(Frame::Arp(r)) = parse(&reply) else {
        panic!()
    };
    assert_eq!(
        (r.op, r.sender_mac, r.sender_ip),
        (ArpOp::Reply, MAC_B, IP_B)
    );
    assert_eq!(a.receive(&mut la, &reply, 30), Rx::Stack);
    assert_eq!(a.resolve(&mut la, IP_B, 40).unwrap(), Some(MAC_B));
    // B learnt A from the request it answered: no ARP of its own.
    assert_eq!(b.resolve(&mut lb, IP_A, 50).unwrap(), Some(MAC_A));
    assert_eq!(seg.sent().len(), 2, "one request, one reply");
    assert_eq!((a.counts().arp_sent, b.counts().arp_sent), (1, 0));
}

#[test]
fn resolution_retries_then_fails_with_a_timeout_and_starts_over() {
    let seg = Segment::new();
    let (mut la, _lb) = (seg.attach(MAC_A, 1514), seg.attach(MAC_B, 1514));
    let mut a = Port::new(MAC_A, IP_A);
    let ghost = [10, 0, 0, 99];
    let mut t = 0;
    for i in 1..=u64::from(ARP_TRIES) {
        assert_eq!(a.resolve(&mut la, ghost, t).unwrap(), None);
        assert_eq!(a.counts().arp_sent, i);
        assert_eq!(
            a.resolve(&mut la, ghost, t + ARP_RETRY_US - 1).unwrap(),
            None
        );
        assert_eq!(a.counts().arp_sent, i, "not before the retry interval");
        t += ARP_RETRY_US;
    }
    let e = a.resolve(&mut la, ghost, t).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(
        a.resolve(&mut la, ghost, t + 1).unwrap(),
        None,
        "starts over"
    );
    assert_eq!(a.counts().arp_sent, u64::from(ARP_TRIES) + 1);
}

#[test]
fn frames_are_split_between_the_transport_and_the_ip_stack() {
    let seg = Segment::new();
    let mut la = seg.attach(MAC_A, 1514);
    let mut a = Port::new(MAC_A, IP_A);
    let f = roce_from(MAC_B, IP_B, IP_A);
    match a.receive(&mut la, &f, 0) {
        Rx::Roce(p) => assert_eq!(p.payload, b"data"),
        other => panic!("{other:?}"),
    }
    // Neighbours are learnt from ARP only, as Linux learns them: the MAC a RoCE frame comes
    // from is whatever its sender wrote (a stranger could re-bind a peer's address with it).
    assert_eq!(
        a.resolve(&mut la, IP_B, 1).unwrap(),
        None,
        "not learnt from the packet: asked"
    );
    assert_eq!(a.counts().arp_sent, 1);
    let other = roce_from(MAC_B, IP_B, [10, 0, 0, 77]);
    assert_eq!(a.receive(&mut la, &other, 2), Rx::Dropped(Discard::NotRoce));
    let mut bad = f.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert_eq!(a.receive(&mut la, &bad, 3), Rx::Dropped(Discard::BadIcrc));
    let mut tcp = f.clone();
    tcp[14 + 9] = 6;
    assert_eq!(a.receive(&mut la, &tcp, 4), Rx::Stack);
    let c = a.counts();
    assert_eq!((c.roce, c.dropped, c.stack), (1, 2, 1));
}

#[test]
fn arp_for_someone_else_is_not_answered_and_does_not_fill_the_cache() {
    let seg = Segment::new();
    let (mut la, mut lb) = (seg.attach(MAC_A, 1514), seg.attach(MAC_B, 1514));
    let mut a = Port::new(MAC_A, IP_A);
    let req = Arp {
        op: ArpOp::Request,
        sender_mac: MAC_B,
        sender_ip: IP_B,
        target_mac: [0; 6],
        target_ip: [10, 0, 0, 3],
    };
    assert_eq!(a.receive(&mut la, &req.frame(MAC_B), 0), Rx::Stack);
    assert_eq!(a.counts().arp_answered, 0);
    assert!(recv(&mut lb).is_none(), "nothing answered");
    assert_eq!(
        a.resolve(&mut la, IP_B, 1).unwrap(),
        None,
        "not learnt: asks"
    );
    // ...but an ARP from a neighbour being resolved answers the question.
    assert_eq!(a.receive(&mut la, &req.frame(MAC_B), 2), Rx::Stack);
    assert_eq!(a.resolve(&mut la, IP_B, 3).unwrap(), Some(MAC_B));
}

#[test]
fn the_neighbour_cache_is_bounded_and_forgets_the_oldest() {
    let seg = Segment::new();
    let mut la = seg.attach(MAC_A, 1514);
    let mut a = Port::new(MAC_A, IP_A);
    let n = NEIGHBOURS as u8 + 4;
    for i in 0..n {
        // Asked by each of them: the asker is remembered.
        let req = Arp {
            op: ArpOp::Request,
            sender_mac: [2, 0, 0, 0, 0, i],
            sender_ip: [10, 0, 1, i],
            target_mac: [0; 6],
            target_ip: IP_A,
        };
        let f = req.frame([2, 0, 0, 0, 0, i]);
        assert_eq!(a.receive(&mut la, &f, u64::from(i)), Rx::Stack);
    }
    let now = 1000;
    assert_eq!(
        a.resolve(&mut la, [10, 0, 1, n - 1], now).unwrap(),
        Some([2, 0, 0, 0, 0, n - 1])
    );
    assert_eq!(
        a.resolve(&mut la, [10, 0, 1, 0], now).unwrap(),
        None,
        "forgotten"
    );
    assert_eq!(a.counts().arp_sent, 1);
}

#[test]
fn the_gid_table_is_laid_out_as_rxe_lays_it_out() {
    let a = Port::new(MAC_A, IP_A);
    assert_eq!(a.gid(0), Some(Gid::link_local_from_mac(MAC_A)));
    assert_eq!(a.gid(1), Some(Gid::from_ipv4(IP_A)));
    assert_eq!(a.gid(2), None);
}

#[test]
fn the_lossy_segment_drops_duplicates_and_reorders_repeatably() {
    use bareverbs_model::link::Faults;
    let run = |faults: Faults| {
        let seg = Segment::new();
        let (mut la, mut lb) = (seg.attach(MAC_A, 1514), seg.attach(MAC_B, 1514));
        seg.set_faults(faults);
        for i in 0..200u8 {
            la.transmit(&[i; 60]).unwrap();
        }
        let mut got = Vec::new();
        while let Some(f) = recv(&mut lb) {
            got.push(f[0]);
        }
        (got, seg.damage())
    };
    let all = |per_mille| Faults {
        drop: per_mille,
        ..Faults::default()
    };
    assert_eq!(run(Faults::default()).0, (0..200).collect::<Vec<u8>>());
    assert!(run(all(1000)).0.is_empty());
    let f = Faults {
        drop: 100,
        duplicate: 100,
        reorder: 100,
        seed: 7,
    };
    let (got, (d, u, r)) = run(f);
    assert!(
        d > 0 && u > 0 && r > 0,
        "each kind of damage happened: {d} {u} {r}"
    );
    assert_eq!(got.len() as u64, 200 - d + u);
    assert_ne!(got, {
        let mut s = got.clone();
        s.sort();
        s
    });
    assert_eq!(run(f), (got, (d, u, r)), "the same seed, the same damage");
    assert_eq!(seg_refuses_oversize(), Err(bareverbs::hal::LinkError::Size));
}

fn seg_refuses_oversize() -> Result<(), bareverbs::hal::LinkError> {
    Segment::new().attach(MAC_A, 100).transmit(&[0; 101])
}

#[test]
fn roce_frames_to_another_mac_or_from_a_martian_source_are_dropped() {
    let seg = Segment::new();
    let mut la = seg.attach(MAC_A, 1514);
    let mut a = Port::new(MAC_A, IP_A);
    // To this interface's address but another station's MAC (a promiscuous NIC passes it up).
    let f = roce_to(MAC_B, MAC_B, IP_B, IP_A);
    assert_eq!(a.receive(&mut la, &f, 0), Rx::Dropped(Discard::NotForUs));
    let f = roce_to(BROADCAST, MAC_B, IP_B, IP_A);
    assert_eq!(a.receive(&mut la, &f, 0), Rx::Dropped(Discard::NotForUs));
    // From the wire with this interface's own address as its source, or one no station has.
    for src in [
        IP_A,
        [0, 0, 0, 0],
        [0, 9, 9, 9],
        [127, 0, 0, 1],
        [224, 0, 0, 1],
        [239, 1, 1, 1],
        [240, 0, 0, 1],
        [255; 4],
    ] {
        let f = roce_from(MAC_B, src, IP_A);
        assert_eq!(
            a.receive(&mut la, &f, 0),
            Rx::Dropped(Discard::Martian),
            "{src:?}"
        );
    }
    // The first bytes either side of those ranges are stations' addresses.
    for src in [
        [1, 0, 0, 1],
        [126, 9, 9, 9],
        [128, 0, 0, 1],
        [223, 255, 255, 254],
    ] {
        let f = roce_from(MAC_B, src, IP_A);
        assert!(matches!(a.receive(&mut la, &f, 0), Rx::Roce(_)), "{src:?}");
    }
    // Another frame to another station's unicast MAC does not reach the IP stack either; a
    // broadcast one does.
    let mut tcp = roce_to(MAC_B, MAC_B, IP_B, IP_A);
    tcp[14 + 9] = 6;
    assert_eq!(a.receive(&mut la, &tcp, 0), Rx::Dropped(Discard::NotForUs));
    tcp[..6].copy_from_slice(&BROADCAST);
    assert_eq!(a.receive(&mut la, &tcp, 0), Rx::Stack);
    assert_eq!(a.counts().roce, 4);
}
