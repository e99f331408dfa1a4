//! Multicast on the software RoCE device (`docs/multicast.md`): UD queue pairs attached to an
//! IPv4 group (`ibv_attach_mcast`) take the datagrams sent to it, as Linux's `mckey` sends
//! them (SEND with immediate to QPN 0xFFFFFF, Q_Key 0x01234567, at the group's MAC); the
//! device tells the segment with IGMPv2. A sender A (10.0.0.2), two receivers B (10.0.0.3)
//! and C (10.0.0.4), and a stranger's station that forges frames, on the in-memory segment.

mod common;

use bareverbs::Context;
use bareverbs::Error;
use bareverbs::device::rxe::wire::bth::{Bth, DEFAULT_PKEY, Deth, Headers, opcode};
use bareverbs::device::rxe::wire::igmp;
use bareverbs::device::rxe::wire::packet::{Frame, Route, build, parse};
use bareverbs::device::rxe::{Config, MAX_MCAST_GRP, MCAST_QPN, Rxe};
use bareverbs::error::{Feature, NotFound, Object, Op, Param, Resource, Unsupported};
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};
use common::drain;

type R = Rxe<Model, MemLink, TestClock>;
type Ctx = Context<R>;

const IP_A: [u8; 4] = [10, 0, 0, 2];
const IP_B: [u8; 4] = [10, 0, 0, 3];
const IP_C: [u8; 4] = [10, 0, 0, 4];
const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];
const MAC_B: [u8; 6] = [0x52, 0x54, 0, 0, 0, 3];
const MAC_C: [u8; 6] = [0x52, 0x54, 0, 0, 0, 4];
const MAC_S: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0x42];
/// The group (bit 23 set: its MAC drops it) and the Q_Key Linux's CM gives RDMA_PS_UDP.
const GROUP: [u8; 4] = [239, 129, 2, 3];
const QKEY: u32 = 0x0123_4567;
const RW: AccessFlags = AccessFlags::LOCAL_WRITE;
const SIG: SendFlags = SendFlags::SIGNALED;

struct Lab {
    seg: Segment,
    clk: TestClock,
    a: Ctx,
    b: Ctx,
    c: Ctx,
    la: usize,
    lb: usize,
    s: usize,
    _s_link: MemLink,
}

fn lab() -> Lab {
    let model = Model::new(ModelConfig::default());
    let (seg, clk) = (Segment::new(), TestClock::default());
    let (la, lb, lc) = (
        seg.attach(MAC_A, 1514),
        seg.attach(MAC_B, 1514),
        seg.attach(MAC_C, 1514),
    );
    let s_link = seg.attach(MAC_S, 1514);
    let (ia, ib) = (la.id(), lb.id());
    let dev = |l, ip| Context::new(Rxe::new(model.clone(), l, clk.clone(), Config { ip }).unwrap());
    Lab {
        a: dev(la, IP_A),
        b: dev(lb, IP_B),
        c: dev(lc, IP_C),
        seg,
        clk,
        la: ia,
        lb: ib,
        s: s_link.id(),
        _s_link: s_link,
    }
}

impl Lab {
    fn run(&self) {
        for _ in 0..20 {
            self.clk.advance(100);
            self.a.process_events();
            self.b.process_events();
            self.c.process_events();
        }
    }

    /// The IGMP messages link `from` sent since `start`: (type, group, IP destination).
    fn igmp_sent(&self, start: usize, from: usize) -> Vec<(u8, [u8; 4], [u8; 4])> {
        self.seg.sent()[start..]
            .iter()
            .filter(|(f, b)| *f == from && b.len() >= 46 && b[23] == igmp::PROTOCOL)
            .map(|(_, b)| {
                // The destination MAC is the IP destination's group MAC.
                let dst = [b[30], b[31], b[32], b[33]];
                assert_eq!(b[..6], igmp::multicast_mac(dst));
                (b[38], [b[42], b[43], b[44], b[45]], dst)
            })
            .collect()
    }

    /// Puts a frame from the stranger's station on the segment.
    fn forge(&self, dst_mac: [u8; 6], dst_ip: [u8; 4], h: &Headers, payload: &[u8]) {
        let route = Route {
            src_mac: MAC_S,
            dst_mac,
            src_ip: [10, 0, 0, 66],
            dst_ip,
            tos: 0,
            ttl: 64,
            src_port: 0xC123,
        };
        let mut buf = vec![0u8; 1600];
        let n = build(&mut buf, &route, 9, h, payload).expect("a frame");
        self.seg.inject(self.s, &buf[..n]);
    }
}

fn group_gid() -> Gid {
    Gid::from_ipv4(GROUP)
}

fn ud<'a>(
    pd: &'a ProtectionDomain<'a, R>,
    cq: &'a CompletionQueue<'a, R>,
    qkey: u32,
) -> QueuePair<'a, R, Ud, Rts> {
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    match pd
        .qp_builder(cq, cq)
        .caps(caps)
        .build::<Ud>()
        .unwrap()
        .ready(qkey, 0)
    {
        Ok(q) => q,
        Err((_, e)) => panic!("UD QP not ready: {e}"),
    }
}

/// Posts `n` receives of 40 + 128 bytes each into `mr`, one after the other.
fn recvs(q: &mut QueuePair<'_, R, Ud, Rts>, mr: &MemoryRegion<'_, R>, n: u32) {
    // SAFETY: the region outlives the completions the tests poll.
    unsafe {
        let mut rb = q.recv_batch();
        for i in 0..n {
            rb.recv(u64::from(i), &[mr.sge(i * 168, 168).unwrap()])
                .unwrap();
        }
        rb.finish();
    }
}

/// Sends `n` messages of `bytes` from `q` to the group with Q_Key `qkey`, immediate = its QPN.
fn send_group(
    l: &Lab,
    q: &mut QueuePair<'_, R, Ud, Rts>,
    pd: &ProtectionDomain<'_, R>,
    bytes: &[u8],
    n: u32,
    qkey: u32,
) {
    let ah = pd.create_ah(&AddressVector::new(group_gid(), 1)).unwrap();
    let mut src = pd.register(4096, RW).unwrap();
    src.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
    let imm = q.qp_num().to_be();
    // SAFETY: the region outlives the completions polled below.
    unsafe {
        let mut sb = q.send_batch();
        for i in 0..n {
            let to = (&ah, MCAST_QPN, qkey);
            sb.send_to_imm(
                u64::from(i),
                SIG,
                to,
                imm,
                &[src.sge(0, bytes.len() as u32).unwrap()],
            )
            .unwrap();
        }
        sb.finish();
    }
    l.run();
}

/// The receive completions of `qpn` in `wcs`: (status, bytes, immediate, source QPN).
fn got(wcs: &[WorkCompletion], qpn: u32) -> Vec<(WcStatus, u32, u32, u32)> {
    wcs.iter()
        .filter(|w| w.qp_num == qpn && w.opcode == WcOpcode::Recv)
        .map(|w| (w.status, w.byte_len, w.imm, w.src_qp))
        .collect()
}

#[test]
fn a_datagram_to_the_group_reaches_every_attached_qp_and_no_other() {
    let l = lab();
    let (pa, pb, pc) = (
        l.a.alloc_pd().unwrap(),
        l.b.alloc_pd().unwrap(),
        l.c.alloc_pd().unwrap(),
    );
    let (ca, cb, cc) = (
        l.a.create_cq(64).unwrap(),
        l.b.create_cq(64).unwrap(),
        l.c.create_cq(64).unwrap(),
    );
    let mut s = ud(&pa, &ca, QKEY);
    let (mut b1, mut b2, mut c1, mut c2) = (
        ud(&pb, &cb, QKEY),
        ud(&pb, &cb, QKEY),
        ud(&pc, &cc, QKEY),
        ud(&pc, &cc, QKEY),
    );
    let mrs: Vec<_> = (0..2)
        .map(|_| pb.register(4096, RW).unwrap())
        .chain((0..2).map(|_| pc.register(4096, RW).unwrap()))
        .collect();
    for (q, mr) in [&mut b1, &mut b2, &mut c1, &mut c2].into_iter().zip(&mrs) {
        recvs(q, mr, 3);
    }
    let mark = l.seg.sent().len();
    b1.attach_mcast(group_gid(), 0).unwrap();
    b2.attach_mcast(group_gid(), 0).unwrap();
    c1.attach_mcast(group_gid(), 0).unwrap();
    // One report per device (its first member), to the group; C's second QP stays out.
    assert_eq!(l.igmp_sent(mark, l.lb), [(igmp::REPORT_V2, GROUP, GROUP)]);
    assert_eq!(l.b.provider().mcast_groups(), 1);
    let mark = l.seg.sent().len();
    send_group(&l, &mut s, &pa, b"to every member of 239.129.2.3", 3, QKEY);
    // On the wire: three datagrams to the group's MAC and address, QPN 0xFFFFFF.
    let on_wire: Vec<_> = l.seg.sent()[mark..]
        .iter()
        .filter(|(f, _)| *f == l.la)
        .filter_map(|(_, b)| match parse(b) {
            Ok(Frame::Roce(p)) => Some((
                b[..6].to_vec(),
                p.ip.dst,
                p.headers.bth.dest_qp,
                p.headers.deth.map(|d| d.qkey),
            )),
            _ => None,
        })
        .collect();
    let want = (
        vec![0x01, 0x00, 0x5E, 0x01, 2, 3],
        GROUP,
        MCAST_QPN,
        Some(QKEY),
    );
    assert_eq!(on_wire, vec![want.clone(), want.clone(), want]);
    assert!(drain(&ca).iter().all(|w| w.status == WcStatus::Success));
    let (wb, wc) = (drain(&cb), drain(&cc));
    let one = (WcStatus::Success, 40 + 30, s.qp_num().to_be(), s.qp_num());
    for (wcs, q) in [(&wb, &b1), (&wb, &b2), (&wc, &c1)] {
        assert_eq!(got(wcs, q.qp_num()), vec![one; 3], "QP {}", q.qp_num());
    }
    assert_eq!(got(&wc, c2.qp_num()), vec![]);
    for mr in &mrs[..3] {
        assert_eq!(&mr.as_slice()[40..70], b"to every member of 239.129.2.3");
        // The GRH slot holds the IPv4 header: to the group.
        assert_eq!(&mr.as_slice()[36..40], &GROUP);
    }
    assert_eq!(&mrs[3].as_slice()[40..70], &[0u8; 30]);
}

#[test]
fn a_detached_qp_takes_nothing_and_the_last_one_out_sends_a_leave() {
    let l = lab();
    let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let (ca, cb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
    let mut s = ud(&pa, &ca, QKEY);
    let (mut b1, mut b2) = (ud(&pb, &cb, QKEY), ud(&pb, &cb, QKEY));
    let (m1, m2) = (
        pb.register(4096, RW).unwrap(),
        pb.register(4096, RW).unwrap(),
    );
    recvs(&mut b1, &m1, 2);
    recvs(&mut b2, &m2, 2);
    b1.attach_mcast(group_gid(), 0).unwrap();
    b2.attach_mcast(group_gid(), 0).unwrap();
    let mark = l.seg.sent().len();
    b1.detach_mcast(group_gid(), 0).unwrap();
    // B2 is still in: no leave yet.
    assert_eq!(l.igmp_sent(mark, l.lb), []);
    send_group(&l, &mut s, &pa, b"one", 1, QKEY);
    let wb = drain(&cb);
    assert_eq!(got(&wb, b1.qp_num()), vec![]);
    assert_eq!(got(&wb, b2.qp_num()).len(), 1);
    b2.detach_mcast(group_gid(), 0).unwrap();
    assert_eq!(
        l.igmp_sent(mark, l.lb),
        [(igmp::LEAVE, GROUP, igmp::ALL_ROUTERS)]
    );
    assert_eq!(l.b.provider().mcast_groups(), 0);
    let dropped = l.b.provider().port_counts().dropped;
    send_group(&l, &mut s, &pa, b"two", 1, QKEY);
    assert_eq!(got(&drain(&cb), b2.qp_num()), vec![]);
    // Nobody is in the group any more: the port drops the datagram.
    assert_eq!(l.b.provider().port_counts().dropped, dropped + 1);
    // Detaching again: not a member.
    let e = b2.detach_mcast(group_gid(), 0).unwrap_err();
    assert_eq!(
        e,
        Error::NotFound(NotFound::McastMember { gid: group_gid() })
    );
}

#[test]
fn a_wrong_q_key_or_a_forged_frame_reaches_no_member() {
    let l = lab();
    let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let (ca, cb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
    let mut s = ud(&pa, &ca, QKEY);
    let mut b1 = ud(&pb, &cb, QKEY);
    let m1 = pb.register(4096, RW).unwrap();
    recvs(&mut b1, &m1, 4);
    b1.attach_mcast(group_gid(), 0).unwrap();
    send_group(&l, &mut s, &pa, b"wrong key", 2, 0x1111_1111);
    assert_eq!(got(&drain(&cb), b1.qp_num()), vec![]);
    // Forged by a stranger: a valid datagram with the right Q_Key is taken (anyone on the
    // segment may send to a group); the same to the group's address at another group's
    // MAC, to a unicast QPN at the group, or to a group nobody joined, is not.
    let dg = |qpn: u32| {
        let mut h = Headers::new(Bth {
            opcode: opcode::UD_SEND_ONLY,
            se: false,
            pad: 0,
            pkey: DEFAULT_PKEY,
            dest_qp: qpn,
            ack_req: false,
            psn: 0,
        });
        h.deth = Some(Deth {
            qkey: QKEY,
            src_qp: 77,
        });
        h
    };
    let gmac = igmp::multicast_mac(GROUP);
    l.forge(
        igmp::multicast_mac([239, 1, 2, 4]),
        GROUP,
        &dg(MCAST_QPN),
        b"bad mac",
    );
    l.forge(gmac, GROUP, &dg(b1.qp_num()), b"unicast qpn");
    l.forge(
        igmp::multicast_mac([239, 9, 9, 9]),
        [239, 9, 9, 9],
        &dg(MCAST_QPN),
        b"no member",
    );
    l.forge(MAC_B, GROUP, &dg(MCAST_QPN), b"unicast mac");
    l.run();
    assert_eq!(got(&drain(&cb), b1.qp_num()), vec![]);
    l.forge(gmac, GROUP, &dg(MCAST_QPN), b"forged");
    l.run();
    assert_eq!(
        got(&drain(&cb), b1.qp_num()),
        vec![(WcStatus::Success, 40 + 6, 0, 77)]
    );
}

#[test]
fn attaching_is_bounded_and_checked_with_typed_errors() {
    let l = lab();
    let pb = l.b.alloc_pd().unwrap();
    let cb = l.b.create_cq(64).unwrap();
    let mut q = ud(&pb, &cb, QKEY);
    assert_eq!(l.b.caps().max_mcast_grp, MAX_MCAST_GRP as u32);
    let mark = l.seg.sent().len();
    for i in 0..MAX_MCAST_GRP as u8 {
        q.attach_mcast(Gid::from_ipv4([239, 0, 0, i]), 0).unwrap();
    }
    assert_eq!(l.igmp_sent(mark, l.lb).len(), MAX_MCAST_GRP);
    let full = q
        .attach_mcast(Gid::from_ipv4([239, 0, 0, 200]), 0)
        .unwrap_err();
    assert_eq!(
        full,
        Error::Resource(Resource::Objects {
            object: Object::McastGroup,
            limit: MAX_MCAST_GRP as u32
        })
    );
    let twice = q
        .attach_mcast(Gid::from_ipv4([239, 0, 0, 1]), 0)
        .unwrap_err();
    assert_eq!(
        twice,
        Error::Busy {
            op: Op::AttachMcast
        }
    );
    let unicast = q
        .attach_mcast(Gid::from_ipv4([10, 0, 0, 9]), 0)
        .unwrap_err();
    assert_eq!(
        unicast,
        Error::InvalidInput {
            param: Param::McastGid,
            value: 0x0A00_0009,
            max: 0xEFFF_FFFF
        }
    );
    let mut v6 = [0u8; 16];
    v6[0] = 0xFF;
    v6[1] = 0x0E;
    let ipv6 = q.attach_mcast(Gid(v6), 0).unwrap_err();
    assert_eq!(
        ipv6,
        Error::Unsupported(Unsupported::Feature(Feature::Ipv6))
    );
    // An RC queue pair takes no datagrams.
    let rc = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
    let mut rc = rc;
    let e = rc
        .attach_mcast(Gid::from_ipv4([239, 0, 0, 1]), 0)
        .unwrap_err();
    assert_eq!(
        e,
        Error::Unsupported(Unsupported::Feature(Feature::Multicast))
    );
    // A group left makes room.
    q.detach_mcast(Gid::from_ipv4([239, 0, 0, 3]), 0).unwrap();
    q.attach_mcast(Gid::from_ipv4([239, 0, 0, 200]), 0).unwrap();
    assert_eq!(l.b.provider().mcast_groups(), MAX_MCAST_GRP);
}

#[test]
fn a_qp_destroyed_while_attached_leaves_its_groups() {
    let l = lab();
    let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let (ca, cb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
    let mut s = ud(&pa, &ca, QKEY);
    let mut q = ud(&pb, &cb, QKEY);
    let qpn = q.qp_num();
    q.attach_mcast(group_gid(), 0).unwrap();
    q.attach_mcast(Gid::from_ipv4([239, 0, 0, 7]), 0).unwrap();
    // The typed destroy refuses while attached (ibv_destroy_qp's EBUSY) and hands it back.
    let Err((mut q, e)) = q.destroy() else {
        panic!("destroyed while attached")
    };
    assert_eq!(e.kind(), bareverbs::error::ErrorKind::Busy);
    q.detach_mcast(Gid::from_ipv4([239, 0, 0, 7]), 0).unwrap();
    let mark = l.seg.sent().len();
    // Dropped while still in the group: the device forgets it, and leaves.
    drop(q);
    assert_eq!(l.b.provider().mcast_groups(), 0);
    assert_eq!(
        l.igmp_sent(mark, l.lb),
        [(igmp::LEAVE, GROUP, igmp::ALL_ROUTERS)]
    );
    // A new QP that gets the same number is in no group.
    let mut q2 = ud(&pb, &cb, QKEY);
    assert_eq!(q2.qp_num(), qpn);
    let m = pb.register(4096, RW).unwrap();
    recvs(&mut q2, &m, 1);
    send_group(&l, &mut s, &pa, b"after", 1, QKEY);
    assert_eq!(got(&drain(&cb), qpn), vec![]);
}
