//! The software RoCE device's port over IPv6 on an in-memory Ethernet segment: the GID
//! table with the link-local and global addresses, neighbour discovery (solicitations
//! answered, peers resolved with bounded retries), the trust rules ARP has (a stranger's
//! advertisement teaches nothing unasked, our own addresses are never learnt, invalid
//! messages are counted and dropped), and RoCEv2 over IPv6 checked at the port.

use bareverbs::ErrorKind;
use bareverbs::device::rxe::port::{
    ARP_RETRY_US, ARP_TRIES, AddrRefused, GLOBALS6, NEIGHBOURS6, Port, Rx,
};
use bareverbs::device::rxe::wire::Discard;
use bareverbs::device::rxe::wire::bth::{Bth, DEFAULT_PKEY, Deth, Headers, opcode};
use bareverbs::device::rxe::wire::eth::ETH_LEN;
use bareverbs::device::rxe::wire::ip6::{Ip6, Ipv6Route, build6, parse6};
use bareverbs::device::rxe::wire::nd::{
    self, ALL_NODES, NA, NS, Nd, OVERRIDE, SOLICITED, multicast_mac, solicited_node,
};
use bareverbs::hal::Link;
use bareverbs::verbs::Gid;
use bareverbs_model::link::{MemLink, Segment};

const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xA];
const MAC_B: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xB];
const MAC_X: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0x66];
const IP_A: [u8; 4] = [10, 0, 0, 1];
const IP_B: [u8; 4] = [10, 0, 0, 2];

fn ll(mac: [u8; 6]) -> Ip6 {
    Gid::link_local_from_mac(mac).0
}

fn global(last: u8) -> Ip6 {
    let mut a = [0u8; 16];
    a[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    a[15] = last;
    a
}

fn recv(link: &mut MemLink) -> Option<Vec<u8>> {
    let mut buf = [0u8; 1600];
    link.receive(&mut buf).map(|n| buf[..n].to_vec())
}

fn nd_of(frame: &[u8]) -> Nd {
    Nd::parse(&frame[ETH_LEN..]).unwrap().unwrap()
}

/// Hands every frame waiting on `link` to `port`; returns how many.
fn drain(port: &mut Port, link: &mut MemLink, now: u64) -> usize {
    let mut n = 0;
    while let Some(f) = recv(link) {
        let _ = port.receive(link, &f, now);
        n += 1;
    }
    n
}

/// The table as rxe lays it out: 0 the MAC's link-local GID, 1 the IPv4-mapped one, then
/// the global addresses in the order given; what no station can have is refused.
#[test]
fn the_gid_table_holds_the_link_local_ipv4_and_global_addresses() {
    let mut a = Port::new(MAC_A, IP_A);
    let lla = ll(MAC_A);
    assert_eq!(
        lla,
        [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0, 0, 0xA
        ]
    );
    assert_eq!(a.gid(0), Some(Gid(lla)));
    assert_eq!(a.gid(1), Some(Gid::from_ipv4(IP_A)));
    assert_eq!(a.gid(2), None);
    assert_eq!(a.add_ipv6(global(1)), Ok(2));
    assert_eq!(a.add_ipv6(global(2)), Ok(3));
    assert_eq!(a.gid(2), Some(Gid(global(1))));
    assert_eq!(a.gid(3), Some(Gid(global(2))));
    assert_eq!(a.add_ipv6(global(1)), Err(AddrRefused::Duplicate));
    assert_eq!(a.add_ipv6(ll(MAC_B)), Err(AddrRefused::LinkLocal));
    assert_eq!(a.add_ipv6(ALL_NODES), Err(AddrRefused::Martian));
    assert_eq!(a.add_ipv6([0; 16]), Err(AddrRefused::Martian));
    assert_eq!(
        a.add_ipv6(Gid::from_ipv4(IP_B).0),
        Err(AddrRefused::Martian)
    );
    for i in 2..GLOBALS6 as u8 {
        assert!(a.add_ipv6(global(10 + i)).is_ok());
    }
    assert_eq!(a.add_ipv6(global(99)), Err(AddrRefused::Full));
    assert_eq!(a.gid(2 + GLOBALS6 as u32), None);
    let all: Vec<Ip6> = a.ipv6().collect();
    assert_eq!(all.len(), 1 + GLOBALS6);
    assert_eq!(all[0], lla);
    assert!(a.has_ipv6(&global(2)) && !a.has_ipv6(&global(99)));
}

/// Two ports resolve each other by link-local and by global address: one solicitation to
/// the target's solicited-node group, one advertisement back to the asker's MAC, and the
/// answerer learns the asker from its option.
#[test]
fn two_ports_resolve_each_other_by_ipv6() {
    let seg = Segment::new();
    let (mut la, mut lb) = (seg.attach(MAC_A, 1514), seg.attach(MAC_B, 1514));
    let (mut a, mut b) = (Port::new(MAC_A, IP_A), Port::new(MAC_B, IP_B));
    assert_eq!(b.add_ipv6(global(2)), Ok(2));
    assert_eq!(a.add_ipv6(global(1)), Ok(2));
    for (target, src) in [(ll(MAC_B), ll(MAC_A)), (global(2), global(1))] {
        assert_eq!(a.resolve6(&mut la, target, 0).unwrap(), None);
        let ns = recv(&mut lb).expect("a solicitation");
        assert_eq!(&ns[..6], &multicast_mac(&solicited_node(&target)));
        assert_eq!(&ns[..3], &[0x33, 0x33, 0xFF]);
        let m = nd_of(&ns);
        assert_eq!((m.kind, m.target, m.src), (NS, target, src));
        assert_eq!(m.dst, solicited_node(&target));
        assert_eq!(m.lladdr, Some(MAC_A));
        assert_eq!(b.receive(&mut lb, &ns, 0), Rx::Stack);
        assert_eq!(b.lookup6(&src), Some(MAC_A), "the asker learnt");
        let na = recv(&mut la).expect("an advertisement");
        assert_eq!(&na[..6], &MAC_A);
        let m = nd_of(&na);
        assert_eq!((m.kind, m.target, m.src, m.dst), (NA, target, target, src));
        assert_eq!(m.flags, SOLICITED | OVERRIDE);
        assert_eq!(m.lladdr, Some(MAC_B));
        assert_eq!(a.receive(&mut la, &na, 1), Rx::Stack);
        assert_eq!(a.resolve6(&mut la, target, 2).unwrap(), Some(MAC_B));
        assert_eq!(a.lookup6(&target), Some(MAC_B));
    }
    assert_eq!((a.counts().nd_sent, b.counts().nd_answered), (2, 2));
    assert_eq!(a.counts().arp_sent, 0);
    // Our own addresses resolve to ourselves, with nothing sent.
    assert_eq!(a.resolve6(&mut la, ll(MAC_A), 3).unwrap(), Some(MAC_A));
    assert!(recv(&mut lb).is_none());
}

/// No answer: a solicitation every retry interval, [`ARP_TRIES`] of them, then a timeout,
/// then a fresh start.
#[test]
fn ipv6_resolution_retries_then_times_out() {
    let seg = Segment::new();
    let (mut la, mut lb) = (seg.attach(MAC_A, 1514), seg.attach(MAC_B, 1514));
    let mut a = Port::new(MAC_A, IP_A);
    let ghost = global(0x99);
    let mut t = 0;
    for i in 1..=u64::from(ARP_TRIES) {
        assert_eq!(a.resolve6(&mut la, ghost, t).unwrap(), None);
        assert_eq!(a.counts().nd_sent, i);
        assert_eq!(
            a.resolve6(&mut la, ghost, t + ARP_RETRY_US - 1).unwrap(),
            None
        );
        assert_eq!(a.counts().nd_sent, i, "not before the retry interval");
        t += ARP_RETRY_US;
    }
    assert_eq!(
        drain(&mut Port::new(MAC_B, IP_B), &mut lb, t),
        ARP_TRIES as usize
    );
    let e = a.resolve6(&mut la, ghost, t).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(
        a.resolve6(&mut la, ghost, t + 1).unwrap(),
        None,
        "starts over"
    );
}

/// What a stranger on the segment can do with neighbour discovery, against the ARP rules:
/// an unasked advertisement teaches nothing; one for an address being resolved binds it (as
/// ARP would: unauthenticated), and a later one re-binds it; no message teaches anything
/// about our own addresses; a solicitation for another station's address gets no answer;
/// a message from off the link (hop limit not 255) or with a bad checksum is counted and
/// dropped; a solicitation from a multicast source is not answered.
#[test]
fn forged_neighbour_discovery_follows_the_arp_rules() {
    let seg = Segment::new();
    let (mut la, mut lx) = (seg.attach(MAC_A, 1514), seg.attach(MAC_X, 1514));
    let mut a = Port::new(MAC_A, IP_A);
    let send = |lx: &mut MemLink, m: Nd, dst_mac: [u8; 6]| {
        let (f, n) = m.frame(MAC_X, dst_mac);
        lx.transmit(&f[..n]).unwrap();
    };
    let na = |target: Ip6, mac: [u8; 6]| Nd {
        kind: NA,
        src: target,
        dst: ALL_NODES,
        target,
        lladdr: Some(mac),
        flags: OVERRIDE,
    };
    // Unasked: nothing learnt.
    send(&mut lx, na(ll(MAC_B), MAC_X), multicast_mac(&ALL_NODES));
    drain(&mut a, &mut la, 0);
    assert_eq!(a.lookup6(&ll(MAC_B)), None);
    // Our own address claimed: nothing learnt, and we still resolve to ourselves.
    send(&mut lx, na(ll(MAC_A), MAC_X), multicast_mac(&ALL_NODES));
    drain(&mut a, &mut la, 0);
    assert_eq!(a.lookup6(&ll(MAC_A)), Some(MAC_A));
    // A solicitation for another station's address: no answer.
    let ns = |src: Ip6, target: Ip6| Nd {
        kind: NS,
        src,
        dst: solicited_node(&target),
        target,
        lladdr: Some(MAC_X),
        flags: 0,
    };
    send(
        &mut lx,
        ns(ll(MAC_X), ll(MAC_B)),
        multicast_mac(&solicited_node(&ll(MAC_B))),
    );
    drain(&mut a, &mut la, 0);
    assert!(recv(&mut lx).is_none());
    assert_eq!(a.counts().nd_answered, 0);
    // From a multicast source: neither answered nor learnt.
    send(
        &mut lx,
        ns(ALL_NODES, ll(MAC_A)),
        multicast_mac(&solicited_node(&ll(MAC_A))),
    );
    drain(&mut a, &mut la, 0);
    assert!(recv(&mut lx).is_none());
    assert_eq!(a.lookup6(&ALL_NODES), None);
    // From off the link, and with a bad checksum: counted, dropped, not answered.
    let (mut f, n) = ns(ll(MAC_X), ll(MAC_A)).frame(MAC_X, MAC_A);
    f[ETH_LEN + 7] = 64;
    assert_eq!(a.receive(&mut la, &f[..n], 0), Rx::Dropped(Discard::BadIp));
    let (mut f, n) = ns(ll(MAC_X), ll(MAC_A)).frame(MAC_X, MAC_A);
    f[n - 1] ^= 1;
    assert_eq!(a.receive(&mut la, &f[..n], 0), Rx::Dropped(Discard::BadIp));
    assert_eq!(a.counts().nd_invalid, 2);
    assert!(recv(&mut lx).is_none());
    // Being resolved: the advertisement binds it (as an ARP reply would), a later one
    // re-binds it.
    assert_eq!(a.resolve6(&mut la, ll(MAC_B), 0).unwrap(), None);
    assert!(recv(&mut lx).is_some(), "the solicitation");
    send(&mut lx, na(ll(MAC_B), MAC_X), multicast_mac(&ALL_NODES));
    drain(&mut a, &mut la, 1);
    assert_eq!(a.lookup6(&ll(MAC_B)), Some(MAC_X));
    send(&mut lx, na(ll(MAC_B), MAC_B), multicast_mac(&ALL_NODES));
    drain(&mut a, &mut la, 2);
    assert_eq!(a.lookup6(&ll(MAC_B)), Some(MAC_B));
    // A proper solicitation for our address is answered once, to the asker.
    send(&mut lx, ns(ll(MAC_X), ll(MAC_A)), MAC_A);
    drain(&mut a, &mut la, 3);
    let ans = recv(&mut lx).expect("answered");
    assert_eq!(&ans[..6], &MAC_X);
    assert_eq!(nd_of(&ans).target, ll(MAC_A));
    assert_eq!(a.counts().nd_answered, 1);
    assert_eq!(a.lookup6(&ll(MAC_X)), Some(MAC_X), "the asker learnt");
}

/// Duplicate address detection (a solicitation from ::) for our address is answered to all
/// nodes, unsolicited, and teaches nothing.
#[test]
fn duplicate_address_detection_is_answered_to_all_nodes() {
    let seg = Segment::new();
    let (mut la, mut lx) = (seg.attach(MAC_A, 1514), seg.attach(MAC_X, 1514));
    let mut a = Port::new(MAC_A, IP_A);
    let target = ll(MAC_A);
    let dad = Nd {
        kind: NS,
        src: [0; 16],
        dst: solicited_node(&target),
        target,
        lladdr: None,
        flags: 0,
    };
    let (f, n) = dad.frame(MAC_X, multicast_mac(&dad.dst));
    assert_eq!(a.receive(&mut la, &f[..n], 0), Rx::Stack);
    let ans = recv(&mut lx).expect("answered");
    assert_eq!(&ans[..6], &multicast_mac(&ALL_NODES));
    let m = nd_of(&ans);
    assert_eq!(
        (m.dst, m.flags, m.lladdr),
        (ALL_NODES, nd::OVERRIDE, Some(MAC_A))
    );
    assert_eq!(a.lookup6(&[0; 16]), None);
}

/// The IPv6 neighbour cache is bounded: more peers than it holds, the oldest forgotten.
#[test]
fn the_ipv6_neighbour_cache_is_bounded() {
    let seg = Segment::new();
    let (mut la, mut lx) = (seg.attach(MAC_A, 1514), seg.attach(MAC_X, 1514));
    let mut a = Port::new(MAC_A, IP_A);
    for i in 0..(NEIGHBOURS6 + 4) as u64 {
        let peer = global(i as u8 + 1);
        let ns = Nd {
            kind: NS,
            src: peer,
            dst: solicited_node(&ll(MAC_A)),
            target: ll(MAC_A),
            lladdr: Some([2, 0, 0, 0, 1, i as u8]),
            flags: 0,
        };
        let (f, n) = ns.frame(MAC_X, multicast_mac(&ns.dst));
        assert_eq!(a.receive(&mut la, &f[..n], i), Rx::Stack);
    }
    assert_eq!(
        drain(&mut Port::new(MAC_X, IP_B), &mut lx, 0),
        NEIGHBOURS6 + 4
    );
    let known = (0..(NEIGHBOURS6 + 4) as u8)
        .filter(|&i| a.lookup6(&global(i + 1)).is_some())
        .count();
    assert_eq!(known, NEIGHBOURS6);
    assert_eq!(a.lookup6(&global(1)), None, "the oldest forgotten");
    assert_eq!(
        a.lookup6(&global(NEIGHBOURS6 as u8 + 4)),
        Some([2, 0, 0, 0, 1, NEIGHBOURS6 as u8 + 3])
    );
}

/// RoCEv2 over IPv6 reaches the port checked (counted when it is to one of our addresses
/// from a station's address), and is dropped there: the transport speaks IPv4. Damaged ones
/// are dropped with their reason.
#[test]
fn roce_over_ipv6_is_checked_at_the_port() {
    let seg = Segment::new();
    let mut la = seg.attach(MAC_A, 1514);
    let mut a = Port::new(MAC_A, IP_A);
    let mut h = Headers::new(Bth {
        opcode: opcode::UD_SEND_ONLY,
        se: false,
        pad: 0,
        pkey: DEFAULT_PKEY,
        dest_qp: 0x11,
        ack_req: false,
        psn: 1,
    });
    h.deth = Some(Deth {
        qkey: 0x1111_1111,
        src_qp: 0x12,
    });
    let route = Ipv6Route {
        src_mac: MAC_B,
        dst_mac: MAC_A,
        src: ll(MAC_B),
        dst: ll(MAC_A),
        traffic_class: 0x20,
        flow_label: 0x12345,
        hop_limit: 64,
        src_port: 0xC001,
    };
    let mut buf = [0u8; 256];
    let n = build6(&mut buf, &route, &h, b"hello").unwrap();
    assert_eq!(parse6(&buf[..n]).unwrap().unwrap().payload, b"hello");
    assert_eq!(
        a.receive(&mut la, &buf[..n], 0),
        Rx::Dropped(Discard::NotRoce)
    );
    assert_eq!(a.counts().roce6, 1);
    let mut bad = buf;
    bad[n - 1] ^= 1;
    assert_eq!(
        a.receive(&mut la, &bad[..n], 0),
        Rx::Dropped(Discard::BadIcrc)
    );
    let mut other = route;
    other.dst = global(5);
    let n = build6(&mut buf, &other, &h, b"hello").unwrap();
    assert_eq!(
        a.receive(&mut la, &buf[..n], 0),
        Rx::Dropped(Discard::NotRoce)
    );
    assert_eq!(a.counts().roce6, 1, "not to one of our addresses");
}

mod device {
    use super::*;
    use bareverbs::Context;
    use bareverbs::device::rxe::{Config, Rxe};
    use bareverbs::error::{Error, Feature, Param, Unsupported};
    use bareverbs::verbs::*;
    use bareverbs_model::link::TestClock;
    use bareverbs_model::{Model, ModelConfig};

    /// A device's GID table lists the link-local, IPv4-mapped and global GIDs; the device
    /// answers solicitations for its IPv6 addresses from its progress; an address handle
    /// (UD) to an IPv4-mapped GID from an IPv6 source, or to an IPv6 GID from the
    /// IPv4-mapped source, is refused with `Feature::Ipv6`, and a source index past the table
    /// with the table's size; one to an IPv6 GID from an IPv6 source is made
    /// (`tests/rxe_ipv6_ud.rs`).
    #[test]
    fn a_device_lists_its_ipv6_gids_and_answers_for_them() {
        let model = Model::new(ModelConfig::default());
        let seg = Segment::new();
        let clk = TestClock::default();
        let la = seg.attach(MAC_A, 1514);
        let mut lx = seg.attach(MAC_X, 1514);
        let dev = Rxe::new(model.clone(), la, clk.clone(), Config { ip: IP_A }).unwrap();
        assert_eq!(dev.add_ipv6(global(1)), Ok(2));
        assert_eq!(dev.add_ipv6(ll(MAC_B)), Err(AddrRefused::LinkLocal));
        assert_eq!(dev.gid(2), Some(Gid(global(1))));
        let ctx = Context::new(dev);
        assert_eq!(ctx.query_gid(1, 0).unwrap(), Gid(ll(MAC_A)));
        assert_eq!(ctx.query_gid(1, 1).unwrap(), Gid::from_ipv4(IP_A));
        assert_eq!(ctx.query_gid(1, 2).unwrap(), Gid(global(1)));
        assert_eq!(
            ctx.query_gid(1, 3).unwrap(),
            Gid::default(),
            "in the table, empty"
        );
        assert!(ctx.query_gid(1, 5).is_err());
        let table: Vec<(u32, Gid)> = ctx.gid_table(1).unwrap().collect();
        assert_eq!(
            table,
            vec![
                (0, Gid(ll(MAC_A))),
                (1, Gid::from_ipv4(IP_A)),
                (2, Gid(global(1)))
            ]
        );
        let binding = ctx.bind_gid(2, Gid(global(1))).unwrap();
        assert_eq!(binding.gid(), Gid(global(1)));
        assert!(ctx.bind_gid(2, Gid(global(2))).is_err());
        // A station resolves both addresses of the device.
        let mut x = Port::new(MAC_X, IP_B);
        for (i, target) in [global(1), ll(MAC_A)].into_iter().enumerate() {
            assert_eq!(x.resolve6(&mut lx, target, i as u64).unwrap(), None);
            ctx.process_events();
            assert!(drain(&mut x, &mut lx, i as u64) >= 1);
            assert_eq!(x.lookup6(&target), Some(MAC_A), "{i}");
        }
        let counts = ctx.provider().port_counts();
        assert_eq!((counts.nd_answered, counts.nd_invalid), (2, 0));
        // A mix of families in an address vector is refused.
        let pd = ctx.alloc_pd().unwrap();
        let ipv6 = Error::Unsupported(Unsupported::Feature(Feature::Ipv6));
        let e = pd.create_ah(&AddressVector::new(Gid(ll(MAC_X)), 1)).err();
        assert_eq!(e, Some(ipv6));
        assert!(pd.create_ah(&AddressVector::new(Gid(ll(MAC_X)), 0)).is_ok());
        let e = pd
            .create_ah(&AddressVector::new(Gid::from_ipv4(IP_B), 2))
            .err();
        assert_eq!(e, Some(ipv6));
        let e = pd
            .create_ah(&AddressVector::new(Gid::from_ipv4(IP_B), 9))
            .err();
        assert_eq!(
            e,
            Some(Error::InvalidInput {
                param: Param::GidIndex,
                value: 9,
                max: 4
            })
        );
        assert!(
            pd.create_ah(&AddressVector::new(Gid::from_ipv4(IP_B), 1))
                .is_ok()
        );
    }

    type R = Rxe<Model, MemLink, TestClock>;

    const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::REMOTE_ATOMIC);

    fn connect<'a>(
        qp: QueuePair<'a, R, Rc, Reset>,
        peer: u32,
        av: AddressVector,
        (sq, rq): (u32, u32),
    ) -> QueuePair<'a, R, Rc, Rts> {
        let init = ConnectedInit {
            access: ALL,
            ..Default::default()
        };
        let qp = qp.init(&init).map_err(|(_, e)| e).unwrap();
        let mut rtr = ConnectedRtr::new(peer, rq, av);
        (rtr.path_mtu, rtr.max_dest_rd_atomic) = (Mtu::Mtu1024, 4);
        let qp = qp.rtr(&rtr).map_err(|(_, e)| e).unwrap();
        let mut rts = ConnectedRts::new(sq);
        (rts.max_rd_atomic, rts.timeout, rts.retry_cnt) = (4, 10, 7);
        qp.rts(&rts).map_err(|(_, e)| e).unwrap()
    }

    /// Two devices connect RC queue pairs by IPv6 GIDs (the link-local ones, then the global
    /// ones with a flow label): the peers are resolved by neighbour discovery, every frame
    /// on the segment between them is RoCEv2 over IPv6 with the address vector's traffic
    /// class, flow label and hop limit, and SEND, RDMA WRITE (several packets), RDMA READ
    /// and an atomic complete with the bytes where they belong. A stranger's frames on the
    /// same IPv6 path (its own MAC, or another source address) change nothing.
    #[test]
    fn rc_traffic_between_two_devices_by_ipv6_gids() {
        let model = Model::new(ModelConfig::default());
        let seg = Segment::new();
        let clk = TestClock::default();
        let la = seg.attach(MAC_A, 1514);
        let lb = seg.attach(MAC_B, 1514);
        let mut lx = seg.attach(MAC_X, 1514);
        let da = Rxe::new(model.clone(), la, clk.clone(), Config { ip: IP_A }).unwrap();
        let db = Rxe::new(model.clone(), lb, clk.clone(), Config { ip: IP_B }).unwrap();
        assert_eq!(da.add_ipv6(global(1)), Ok(2));
        assert_eq!(db.add_ipv6(global(2)), Ok(2));
        let (a, b) = (Context::new(da), Context::new(db));
        let step = || {
            clk.advance(100);
            a.process_events();
            b.process_events();
        };
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
        let mut ma = pa.register(16384, ALL).unwrap();
        let mut mb = pb.register(16384, ALL).unwrap();
        for (round, (ga, gb, sgid, flow)) in [
            (ll(MAC_A), ll(MAC_B), 0u8, 0u32),
            (global(1), global(2), 2, 0x5_4321),
        ]
        .into_iter()
        .enumerate()
        {
            let qa = pa.qp_builder(&ca, &ca).build::<Rc>().unwrap();
            let qb = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
            let (na, nb) = (qa.qp_num(), qb.qp_num());
            let av = |dgid: Ip6| {
                let mut v = AddressVector::new(Gid(dgid), sgid);
                (v.hop_limit, v.traffic_class, v.flow_label) = (7, 0x28, flow);
                v
            };
            let start = seg.sent_count();
            let mut qa = connect(qa, nb, av(gb), (100, 200));
            let mut qb = connect(qb, na, av(ga), (200, 100));
            let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + round as u32) as u8).collect();
            ma.as_mut_slice()[..5000].copy_from_slice(&data);
            ma.as_mut_slice()[8000..8008].copy_from_slice(&41u64.to_ne_bytes());
            mb.as_mut_slice()[12000..12100].fill(0xC3);
            mb.as_mut_slice()[9200..9208].copy_from_slice(&1000u64.to_ne_bytes());
            // SAFETY: the regions stay registered until the QPs are gone.
            unsafe {
                let mut r = qb.recv_batch();
                r.recv(1, &[mb.sge(0, 2048).unwrap()]).unwrap();
                r.finish();
                let mut s = qa.send_batch();
                s.send(2, SendFlags::SIGNALED, &[ma.sge(0, 1500).unwrap()])
                    .unwrap();
                s.rdma_write(
                    3,
                    SendFlags::SIGNALED,
                    (mb.addr() + 4096, mb.rkey()),
                    &[ma.sge(0, 5000).unwrap()],
                )
                .unwrap();
                s.rdma_read(
                    4,
                    SendFlags::SIGNALED,
                    (mb.addr() + 12000, mb.rkey()),
                    &[ma.sge(10000, 100).unwrap()],
                )
                .unwrap();
                s.atomic_fetch_add(
                    5,
                    SendFlags::SIGNALED,
                    (mb.addr() + 9200, mb.rkey()),
                    5,
                    &ma.sge(8000, 8).unwrap(),
                )
                .unwrap();
                s.finish();
            }
            let mut wc = [WorkCompletion::default(); 8];
            let mut got = Vec::new();
            for _ in 0..2000 {
                step();
                for cq in [&ca, &cb] {
                    let n = cq.poll(&mut wc).unwrap();
                    got.extend(wc[..n].iter().map(|w| (w.wr_id, w.status)));
                }
                if got.len() == 5 {
                    break;
                }
            }
            got.sort_by_key(|g| g.0);
            let ok = WcStatus::Success;
            assert_eq!(
                got,
                vec![(1, ok), (2, ok), (3, ok), (4, ok), (5, ok)],
                "round {round}"
            );
            assert!(mb.as_slice()[..1500] == data[..1500], "the SEND's bytes");
            assert!(
                mb.as_slice()[4096..4096 + 5000] == data[..],
                "the WRITE's bytes"
            );
            assert_eq!(ma.as_slice()[10000..10100], [0xC3; 100]);
            assert_eq!(ma.as_slice()[8000..8008], 1000u64.to_ne_bytes());
            assert_eq!(mb.as_slice()[9200..9208], 1005u64.to_ne_bytes());
            // What went on the wire between A and B: RoCEv2 over IPv6 only (and neighbour
            // discovery), with the address vector's fields.
            let (mut roce6, mut nd) = (0, 0);
            for (from, f) in seg.sent_since(start) {
                assert!(from < 2);
                assert_ne!(&f[12..14], &[8, 0], "an IPv4 frame between IPv6 peers");
                match parse6(&f) {
                    Ok(Some(p)) => {
                        roce6 += 1;
                        let (src, dst) = if from == 0 { (ga, gb) } else { (gb, ga) };
                        assert_eq!((p.ip.src, p.ip.dst), (src, dst));
                        assert_eq!(
                            (p.ip.traffic_class, p.ip.flow_label, p.ip.hop_limit),
                            (0x28, flow, 7)
                        );
                    }
                    Ok(None) => nd += 1,
                    Err(e) => panic!("{e:?}"),
                }
            }
            assert!(roce6 >= 10, "{roce6}");
            assert!(nd >= 2 || round == 1, "{nd}");
            // A stranger on the path: the peer's IPv6 source from its own MAC, and another
            // source from the peer's MAC, each a SEND at the PSN B expects: both dropped.
            let before = b.provider().port_counts();
            let mut h = Headers::new(Bth {
                opcode: opcode::RC_SEND_ONLY,
                se: false,
                pad: 0,
                pkey: DEFAULT_PKEY,
                dest_qp: nb,
                ack_req: true,
                psn: 100 + 4 + 5,
            });
            h.deth = None;
            // SAFETY: as above.
            unsafe {
                let mut r = qb.recv_batch();
                r.recv(9, &[mb.sge(0, 64).unwrap()]).unwrap();
                r.finish();
            }
            for (mac, src) in [(MAC_X, ga), (MAC_A, global(0x66))] {
                let route = Ipv6Route {
                    src_mac: mac,
                    dst_mac: MAC_B,
                    src,
                    dst: gb,
                    traffic_class: 0,
                    flow_label: flow,
                    hop_limit: 64,
                    src_port: 0xC000,
                };
                let mut buf = [0u8; 256];
                let n = build6(&mut buf, &route, &h, b"forged").unwrap();
                lx.transmit(&buf[..n]).unwrap();
                for _ in 0..20 {
                    step();
                }
            }
            assert_eq!(cb.poll(&mut wc).unwrap(), 0, "a forged SEND was taken");
            let after = b.provider().port_counts();
            assert_eq!(after.roce6 - before.roce6, 2, "both checked at the port");
            drop((qa, qb));
        }
    }

    /// Several connections between the same two IPv6 addresses, each with its own flow
    /// label on A (A holds a path per flow label), while B sends every frame with flow label
    /// 0 (as Linux's rxe does, whatever the QP's address vector says): A's port names each
    /// frame by its first path to B, and each of A's QPs still takes its own peer's frames,
    /// on the other path between the same two addresses. SENDs both ways on every
    /// connection complete, their bytes where they belong.
    #[test]
    fn connections_on_paths_differing_by_flow_label_take_their_peers_frames() {
        let model = Model::new(ModelConfig::default());
        let seg = Segment::new();
        let clk = TestClock::default();
        let la = seg.attach(MAC_A, 1514);
        let lb = seg.attach(MAC_B, 1514);
        let da = Rxe::new(model.clone(), la, clk.clone(), Config { ip: IP_A }).unwrap();
        let db = Rxe::new(model.clone(), lb, clk.clone(), Config { ip: IP_B }).unwrap();
        assert_eq!(da.add_ipv6(global(1)), Ok(2));
        assert_eq!(db.add_ipv6(global(2)), Ok(2));
        let (a, b) = (Context::new(da), Context::new(db));
        let step = || {
            clk.advance(100);
            a.process_events();
            b.process_events();
        };
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
        let mut ma = pa.register(16384, ALL).unwrap();
        let mut mb = pb.register(16384, ALL).unwrap();
        let av = |dgid: Ip6, flow: u32| {
            let mut v = AddressVector::new(Gid(dgid), 2);
            v.flow_label = flow;
            v
        };
        const N: usize = 4;
        let mut conns = Vec::new();
        for k in 0..N {
            let qa = pa.qp_builder(&ca, &ca).build::<Rc>().unwrap();
            let qb = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
            let (na, nb) = (qa.qp_num(), qb.qp_num());
            // A's flow labels 1..=N: N paths to B; B's all 0: one path to A.
            let qa = connect(qa, nb, av(global(2), 1 + k as u32), (100, 200));
            let qb = connect(qb, na, av(global(1), 0), (200, 100));
            conns.push((qa, qb));
        }
        for (k, (qa, qb)) in conns.iter_mut().enumerate() {
            let (at, k64) = (k as u32 * 1024, k as u64);
            ma.as_mut_slice()[at as usize + 8192..][..512].fill(0xA0 + k as u8);
            mb.as_mut_slice()[at as usize + 8192..][..512].fill(0xB0 + k as u8);
            // SAFETY: the regions stay registered until the QPs are gone.
            unsafe {
                let mut r = qa.recv_batch();
                r.recv(100 + k64, &[ma.sge(at, 1024).unwrap()]).unwrap();
                r.finish();
                let mut r = qb.recv_batch();
                r.recv(200 + k64, &[mb.sge(at, 1024).unwrap()]).unwrap();
                r.finish();
                let mut s = qa.send_batch();
                s.send(
                    300 + k64,
                    SendFlags::SIGNALED,
                    &[ma.sge(at + 8192, 512).unwrap()],
                )
                .unwrap();
                s.finish();
                let mut s = qb.send_batch();
                s.send(
                    400 + k64,
                    SendFlags::SIGNALED,
                    &[mb.sge(at + 8192, 512).unwrap()],
                )
                .unwrap();
                s.finish();
            }
        }
        let mut wc = [WorkCompletion::default(); 16];
        let mut got = Vec::new();
        for _ in 0..4000 {
            step();
            for cq in [&ca, &cb] {
                let n = cq.poll(&mut wc).unwrap();
                got.extend(wc[..n].iter().map(|w| (w.wr_id, w.status)));
            }
            if got.len() == 4 * N {
                break;
            }
        }
        got.sort_by_key(|g| g.0);
        let want: Vec<_> = [100u64, 200, 300, 400]
            .iter()
            .flat_map(|&base| (0..N as u64).map(move |k| (base + k, WcStatus::Success)))
            .collect();
        assert_eq!(got, want, "every SEND and receive of every connection");
        for k in 0..N {
            let at = k * 1024;
            assert_eq!(
                mb.as_slice()[at..at + 512],
                [0xA0 + k as u8; 512],
                "A's SEND {k}"
            );
            assert_eq!(
                ma.as_slice()[at..at + 512],
                [0xB0 + k as u8; 512],
                "B's SEND {k}"
            );
        }
        drop(conns);
    }

    /// What a connected QP is refused over IPv6, and the bounded paths: an IPv4-mapped
    /// source for an IPv6 peer, loopback to an own IPv6 address, a multicast peer, a source
    /// index with no address (`Feature::Ipv6` or the GID index); [`PATHS6`] distinct paths at
    /// once (more than the device's QPs: every QP may have one of its own), the next refused
    /// with `Ipv6Path`, one given back at reset and one at destroy.
    #[test]
    fn ipv6_paths_are_checked_and_bounded() {
        use bareverbs::device::rxe::port::PATHS6;
        use bareverbs::error::{Object, Resource};
        let model = Model::new(ModelConfig::default());
        let seg = Segment::new();
        let clk = TestClock::default();
        let la = seg.attach(MAC_A, 1514);
        let a =
            Context::new(Rxe::new(model.clone(), la, clk.clone(), Config { ip: IP_A }).unwrap());
        let pd = a.alloc_pd().unwrap();
        let cq = a.create_cq(64).unwrap();
        let ipv6 = Error::Unsupported(Unsupported::Feature(Feature::Ipv6));
        type Connected<'a> = Result<QueuePair<'a, R, Rc, Rtr>, (QueuePair<'a, R, Rc, Init>, Error)>;
        #[allow(clippy::result_large_err)] // the QP comes back by value, as the verbs API does
        fn rtr<'a>(qp: QueuePair<'a, R, Rc, Reset>, av: AddressVector) -> Connected<'a> {
            let qp = qp
                .init(&ConnectedInit {
                    access: ALL,
                    ..Default::default()
                })
                .map_err(|(_, e)| e)
                .unwrap();
            let mut r = ConnectedRtr::new(0x11, 0, av);
            r.path_mtu = Mtu::Mtu1024;
            qp.rtr(&r)
        }
        for (av, want) in [
            (AddressVector::new(Gid(ll(MAC_B)), 1), ipv6),
            (AddressVector::new(Gid(ll(MAC_A)), 0), ipv6),
            (AddressVector::new(Gid(ALL_NODES), 0), ipv6),
            (
                AddressVector::new(Gid(ll(MAC_B)), 3),
                Error::InvalidInput {
                    param: Param::GidIndex,
                    value: 3,
                    max: 4,
                },
            ),
        ] {
            let qp = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
            assert_eq!(rtr(qp, av).err().map(|(_, e)| e), Some(want));
        }
        let to = |flow: u32| {
            let mut v = AddressVector::new(Gid(ll(MAC_B)), 0);
            v.flow_label = flow;
            v
        };
        // Every path held: by the device's QPs but two (each on a flow label of its own, as
        // rdma_cm gives each connection), the rest by address handles.
        let qps = bareverbs::device::rxe::MAX_QP as u32 - 2;
        let mut held = Vec::new();
        for flow in 0..qps {
            let qp = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
            held.push(rtr(qp, to(flow)).map_err(|(_, e)| e).unwrap());
        }
        let ahs: Vec<_> = (qps..PATHS6 as u32)
            .map(|flow| pd.create_ah(&to(flow)).unwrap())
            .collect();
        // The same path again is shared, not a new one.
        let same = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
        let same = rtr(same, to(0)).map_err(|(_, e)| e).unwrap();
        let full = Error::Resource(Resource::Objects {
            object: Object::Ipv6Path,
            limit: PATHS6 as u32,
        });
        let qp = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
        let (qp, e) = rtr(qp, to(999)).err().unwrap();
        assert_eq!(e, full);
        // A path shared by two QPs stays until both give it back.
        drop(same);
        let (qp, e) = rtr(qp.reset().map_err(|(_, e)| e).unwrap(), to(999))
            .err()
            .unwrap();
        assert_eq!(e, full);
        // Reset gives one back; destroy another.
        let first = held.remove(0).reset().map_err(|(_, e)| e).unwrap();
        let qp = rtr(qp.reset().map_err(|(_, e)| e).unwrap(), to(999))
            .map_err(|(_, e)| e)
            .unwrap();
        let (first, e) = rtr(first, to(1000)).err().unwrap();
        assert_eq!(e, full);
        drop(held.remove(0));
        let again = rtr(first.reset().map_err(|(_, e)| e).unwrap(), to(1000));
        assert!(again.is_ok());
        drop((qp, again, held, ahs));
    }

    /// A live RC connection over IPv6 under a storm: copies of the frames A and B exchange,
    /// mangled (bytes of the headers and the transport flipped, lengths changed), sent by a
    /// stranger from the peer's MAC and address or its own, the ICRC made right again half
    /// the time. Nothing panics, every request completes exactly once (successfully, or with
    /// an error, or flushed once a QP is in error), and the counts say what was reached.
    #[test]
    fn a_storm_on_a_connection_over_ipv6() {
        use bareverbs::device::rxe::wire::icrc::icrc;
        use bareverbs_model::Rng;
        use std::collections::HashMap;
        for seed in [1u64, 2, 3] {
            let model = Model::new(ModelConfig::default());
            model.set_seed(seed);
            let seg = Segment::new();
            let clk = TestClock::default();
            let la = seg.attach(MAC_A, 1514);
            let lb = seg.attach(MAC_B, 1514);
            let mut lx = seg.attach(MAC_X, 1514);
            let a = Context::new(
                Rxe::new(model.clone(), la, clk.clone(), Config { ip: IP_A }).unwrap(),
            );
            let b = Context::new(
                Rxe::new(model.clone(), lb, clk.clone(), Config { ip: IP_B }).unwrap(),
            );
            let step = || {
                clk.advance(200);
                a.process_events();
                b.process_events();
            };
            let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
            let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
            let ma = pa.register(8192, ALL).unwrap();
            let mb = pb.register(8192, ALL).unwrap();
            let qa = pa.qp_builder(&ca, &ca).build::<Rc>().unwrap();
            let qb = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
            let (na, nb) = (qa.qp_num(), qb.qp_num());
            let (psn_a, psn_b) = (a.random_psn(), b.random_psn());
            let mut qa = connect(
                qa,
                nb,
                AddressVector::new(Gid(ll(MAC_B)), 0),
                (psn_a, psn_b),
            );
            let mut qb = connect(
                qb,
                na,
                AddressVector::new(Gid(ll(MAC_A)), 0),
                (psn_b, psn_a),
            );
            let mut rng = Rng::new(seed);
            let mut posted: HashMap<u64, u32> = HashMap::new();
            let mut done: HashMap<u64, u32> = HashMap::new();
            let (mut ok, mut failed, mut injected, mut seen) = (0u64, 0u64, 0u64, 0usize);
            let mut recorded: Vec<Vec<u8>> = Vec::new();
            let mut wc = [WorkCompletion::default(); 32];
            let mut id = 0u64;
            let mut take = |cq: &CompletionQueue<'_, R>, done: &mut HashMap<u64, u32>| loop {
                let n = cq.poll(&mut wc).unwrap();
                if n == 0 {
                    break;
                }
                for w in &wc[..n] {
                    *done.entry(w.wr_id).or_default() += 1;
                    if w.status == WcStatus::Success {
                        ok += 1;
                    } else {
                        failed += 1;
                    }
                }
            };
            for _ in 0..60 {
                // SAFETY: the regions stay registered until the QPs are gone.
                unsafe {
                    let mut r = qb.recv_batch();
                    id += 1;
                    if r.recv(id, &[mb.sge(0, 2048).unwrap()]).is_ok() {
                        posted.insert(id, 1);
                    }
                    r.finish();
                    let mut s = qa.send_batch();
                    id += 1;
                    let len = rng.below(1500) as u32;
                    let r = if id.is_multiple_of(3) {
                        s.rdma_read(
                            id,
                            SendFlags::SIGNALED,
                            (mb.addr(), mb.rkey()),
                            &[ma.sge(4096, len).unwrap()],
                        )
                    } else if id % 3 == 1 {
                        s.send(id, SendFlags::SIGNALED, &[ma.sge(0, len).unwrap()])
                    } else {
                        s.rdma_write(
                            id,
                            SendFlags::SIGNALED,
                            (mb.addr() + 4096, mb.rkey()),
                            &[ma.sge(0, len).unwrap()],
                        )
                    };
                    if r.is_ok() {
                        posted.insert(id, 1);
                    }
                    s.finish();
                }
                step();
                for (from, f) in seg.sent_since(seen) {
                    seen += 1;
                    if from < 2 && parse6(&f).is_ok_and(|p| p.is_some()) && recorded.len() < 64 {
                        recorded.push(f);
                    }
                }
                for _ in 0..12 {
                    let Some(f) = recorded.get(rng.below(recorded.len() as u64) as usize) else {
                        break;
                    };
                    let mut g = f.clone();
                    for _ in 0..1 + rng.below(3) {
                        let at = 54 + rng.below(g.len().saturating_sub(54) as u64) as usize;
                        if at < g.len() {
                            g[at] = rng.next_u64() as u8;
                        }
                    }
                    match rng.below(5) {
                        0 => g.truncate(g.len().saturating_sub(rng.below(60) as usize).max(14)),
                        1 => g.extend((0..rng.below(80)).map(|_| rng.next_u64() as u8)),
                        2 => g[18 + rng.below(2) as usize] = rng.next_u64() as u8,
                        _ => {}
                    }
                    if rng.one_in(2) {
                        g[6..12].copy_from_slice(&MAC_X);
                    }
                    if rng.one_in(2) && g.len() > 66 {
                        let end =
                            (54 + usize::from(u16::from_be_bytes([g[18], g[19]]))).min(g.len());
                        if end > 66
                            && let Some(c) = icrc(&g[14..end - 4])
                        {
                            g[end - 4..end].copy_from_slice(&c.to_le_bytes());
                        }
                    }
                    lx.transmit(&g).unwrap();
                    injected += 1;
                }
                step();
                take(&ca, &mut done);
                take(&cb, &mut done);
            }
            for _ in 0..400 {
                step();
            }
            let qa = qa.to_error().map_err(|(_, e)| e).unwrap();
            let qb = qb.to_error().map_err(|(_, e)| e).unwrap();
            for _ in 0..20 {
                step();
            }
            take(&ca, &mut done);
            take(&cb, &mut done);
            let twice: Vec<_> = done.iter().filter(|(_, n)| **n > 1).collect();
            assert!(twice.is_empty(), "seed {seed}: completed twice: {twice:?}");
            let missing: Vec<_> = posted.keys().filter(|k| !done.contains_key(k)).collect();
            assert!(
                missing.is_empty(),
                "seed {seed}: never completed: {missing:?}"
            );
            let (pa_, pb_) = (a.provider().port_counts(), b.provider().port_counts());
            eprintln!(
                "ipv6 storm seed {seed}: {injected} frames injected; completions {ok} ok, {failed} \
                 failed or flushed; IPv6 RoCE checked {} and {}, dropped {} and {}",
                pa_.roce6, pb_.roce6, pa_.dropped, pb_.dropped
            );
            assert!(
                ok > 20,
                "seed {seed}: the connection carried traffic ({ok})"
            );
            assert!(
                pa_.dropped + pb_.dropped > injected / 4,
                "seed {seed}: {pa_:?} {pb_:?}"
            );
            drop((qa, qb, ma, mb));
        }
    }
}
