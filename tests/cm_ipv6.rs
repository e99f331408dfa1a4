//! The connection manager over IPv6 between two software RoCE devices on an in-memory segment
//! (each with a global IPv6 address beside its IPv4 one): RC connections by IPv6 address both
//! ways with data (SEND, WRITE, READ) and a disconnection, all of it RoCEv2 over IPv6 on the
//! wire; SIDR for a UD service by IPv6 address and a datagram to it; a third station's DREQ
//! and REJ with the connection's IDs ignored; REQs whose rdma_cm header does not fit refused
//! with a REJ and counted, never reported.

mod cm_common;

use bareverbs::cm::msg::{
    self, CmaAddrs, CmaHeader, CmaHeader6, CmaHeaderError, Ids, Private, Rej, Req, about,
    encode_dreq, pdata, reason,
};
use bareverbs::cm::{
    CmAddr, CmConfig, CmError, CmEvent, ConnectParams, Failure, GSI_QKEY, Service,
    mad::{Mad, attr},
    msg::UDP_QKEY,
};
use bareverbs::verbs::*;
use bareverbs_model::link::Faults;
use cm_common::*;

fn v6(last: u8) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..2].copy_from_slice(&[0xfd, 0x00]);
    a[15] = last;
    a
}

const A6: u8 = 2;
const B6: u8 = 3;
const C6: u8 = 4;

/// The three devices, each with its global IPv6 address (GID index 2).
fn lab6(seeds: (u64, u64)) -> Lab {
    let l = lab(Faults::default(), seeds);
    assert_eq!(l.a.provider().add_ipv6(v6(A6)), Ok(2));
    assert_eq!(l.b.provider().add_ipv6(v6(B6)), Ok(2));
    assert_eq!(l.c.provider().add_ipv6(v6(C6)), Ok(2));
    l
}

/// Frames from `from` on in the segment's record: (IPv6, IPv4) counts of RoCEv2 frames.
fn roce_frames(l: &Lab, from: usize) -> (usize, usize) {
    let sent = l.seg.sent();
    let roce = |f: &Vec<u8>, at: usize| f.len() > at + 4 && f[at..at + 2] == [0x12, 0xB7];
    let six = sent[from..]
        .iter()
        .filter(|(_, f)| f[12..14] == [0x86, 0xDD] && roce(f, 14 + 40 + 2))
        .count();
    let four = sent[from..]
        .iter()
        .filter(|(_, f)| f[12..14] == [0x08, 0x00] && roce(f, 14 + 20 + 2))
        .count();
    (six, four)
}

/// `from`'s CM connects to `to`'s by IPv6 address, `to` accepts; data both ways (SEND from
/// the active side, WRITE and READ from the passive side), every byte checked; then the
/// active side disconnects. Every RoCEv2 frame on the segment is IPv6.
fn rc_over_ipv6(active_is_a: bool) {
    let l = lab6((41, 42));
    let (pa, pb, ma, mb, da, db) = sides(&l);
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    assert_eq!((cma.ip6(), cmb.ip6()), (Some(v6(A6)), Some(v6(B6))));
    let (act, pas, act_pd, pas_pd, act_cq, pas_cq, act6, pas6) = if active_is_a {
        (&mut cma, &mut cmb, &pa, &pb, &da, &db, v6(A6), v6(B6))
    } else {
        (&mut cmb, &mut cma, &pb, &pa, &db, &da, v6(B6), v6(A6))
    };
    pas.listen_at(Some(pas6.into()), 7174, Service::Rc).unwrap();
    let start = l.seg.sent().len();
    let qa = rc_qp(act_pd, act_cq);
    let act_qpn = qa.qp_num();
    let params = ConnectParams {
        private_data: b"over ipv6",
        ..ConnectParams::default()
    };
    let id = act.connect(qa, pas6, 7174, &params).unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let ok = pump(&l.clk, act, pas, &mut ea, &mut eb, 1000, 1000, |_, b| {
        !b.is_empty()
    });
    assert!(ok, "no request: {:?} {:?}", act.counts(), pas.counts());
    let CmEvent::ConnectRequest(req) = eb.remove(0) else {
        panic!("not a request: {eb:?}")
    };
    assert_eq!((req.src_addr, req.dst_addr), (act6.into(), pas6.into()));
    assert_eq!((req.src_ip, req.dst_ip), ([0; 4], [0; 4]));
    assert!(req.src_addr.is_ipv6() && req.src_addr == act6);
    assert_eq!(req.dst_port, 7174);
    assert_eq!(&req.private_data.as_slice()[..9], b"over ipv6");
    let qb = rc_qp(pas_pd, pas_cq);
    let mut qb = pas.accept(req.id, qb, &Default::default()).unwrap();
    let at = qb.query().unwrap();
    assert_eq!((at.state, at.dest_qpn), (QpState::Rts, act_qpn));
    assert!(pump(
        &l.clk,
        act,
        pas,
        &mut ea,
        &mut eb,
        1000,
        1000,
        |a, b| { !a.is_empty() && !b.is_empty() }
    ));
    let CmEvent::Established {
        id: got,
        qp: Some(mut qa),
        ..
    } = ea.remove(0)
    else {
        panic!("active: {ea:?}")
    };
    assert_eq!(got, id);
    assert!(matches!(
        eb.remove(0),
        CmEvent::Established { qp: None, .. }
    ));
    assert_eq!(qa.query().unwrap().dest_qpn, qb.qp_num());

    let mut mra = act_pd.register(8192, ALL).unwrap();
    let mut mrb = pas_pd.register(8192, ALL).unwrap();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 29 + 5) as u8).collect();
    mra.as_mut_slice()[..3000].copy_from_slice(&data);
    mrb.as_mut_slice()[4096..7096].copy_from_slice(&data);
    mrb.as_mut_slice()[4096..4100].copy_from_slice(b"back");
    // SAFETY: the regions stay registered and untouched until the completions.
    unsafe {
        let mut r = qb.recv_batch();
        r.recv(1, &[mrb.sge(0, 4096).unwrap()]).unwrap();
        r.finish();
        let mut s = qa.send_batch();
        s.send(2, SendFlags::SIGNALED, &[mra.sge(0, 3000).unwrap()])
            .unwrap();
        s.finish();
        let mut s = qb.send_batch();
        s.rdma_write(
            3,
            SendFlags::SIGNALED,
            (mra.addr() + 4096, mra.rkey()),
            &[mrb.sge(4096, 3000).unwrap()],
        )
        .unwrap();
        s.rdma_read(
            4,
            SendFlags::SIGNALED,
            (mra.addr() + 1000, mra.rkey()),
            &[mrb.sge(7168, 1000).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    let (wa, wb) = completions(&l, act_cq, pas_cq, 1, 3);
    assert_eq!((wa[0].wr_id, wa[0].status), (2, WcStatus::Success));
    assert!(wb.iter().all(|w| w.status == WcStatus::Success), "{wb:?}");
    assert_eq!(wb.iter().find(|w| w.wr_id == 1).unwrap().byte_len, 3000);
    assert_eq!(&mrb.as_slice()[..3000], &data[..]);
    assert_eq!(&mra.as_slice()[4096..4100], b"back");
    assert_eq!(&mra.as_slice()[4100..7096], &data[4..]);
    assert_eq!(&mrb.as_slice()[7168..8168], &data[1000..2000]);

    act.disconnect(id).unwrap();
    let (mut ec, mut eo) = (Vec::new(), Vec::new());
    assert!(pump(
        &l.clk,
        act,
        pas,
        &mut ec,
        &mut eo,
        3000,
        100_000,
        |c, o| { c.len() >= 2 && o.len() >= 2 }
    ));
    assert!(matches!(ec[0], CmEvent::Disconnected { id: x } if x == id));
    assert!(matches!(eo[0], CmEvent::Disconnected { id: x } if x == req.id));
    assert!(matches!(ec[1], CmEvent::TimeWaitExit { .. }));
    assert!(matches!(eo[1], CmEvent::TimeWaitExit { .. }));
    assert_eq!((act.in_use(), pas.in_use()), (0, 0));
    // The CM's datagrams and the connection's packets: RoCEv2 over IPv6, none over IPv4.
    let (six, four) = roce_frames(&l, start);
    assert!(six >= 10, "{six} RoCEv2 frames over IPv6");
    assert_eq!(four, 0, "RoCEv2 frames over IPv4");
    assert_eq!(act.counts().malformed + pas.counts().malformed, 0);
    drop((qa, qb));
}

#[test]
fn a_connects_to_b_by_ipv6_with_data_and_disconnects() {
    rc_over_ipv6(true);
}

#[test]
fn b_connects_to_a_by_ipv6_with_data_and_disconnects() {
    rc_over_ipv6(false);
}

/// One CM holds an IPv4 and an IPv6 connection to the same peer at once, each on its own
/// family, and a listener at B's IPv4 address refuses a request to its IPv6 one.
#[test]
fn ipv4_and_ipv6_connections_side_by_side_and_a_listener_keeps_its_address() {
    let l = lab6((43, 44));
    let (pa, pb, ma, mb, da, db) = sides(&l);
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    cmb.listen(None, 7174, Service::Rc).unwrap();
    cmb.listen(Some(IP_B), 7175, Service::Rc).unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let i4 = cma
        .connect(rc_qp(&pa, &da), IP_B, 7174, &ConnectParams::default())
        .unwrap();
    let i6 = cma
        .connect(rc_qp(&pa, &da), v6(B6), 7174, &ConnectParams::default())
        .unwrap();
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        1000,
        1000,
        |_, b| { b.len() >= 2 }
    ));
    let mut qbs = Vec::new();
    for e in eb.drain(..) {
        let CmEvent::ConnectRequest(r) = e else {
            panic!("{e:?}")
        };
        qbs.push(
            cmb.accept(r.id, rc_qp(&pb, &db), &Default::default())
                .unwrap(),
        );
    }
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        1000,
        1000,
        |a, b| { a.len() >= 2 && b.len() >= 2 }
    ));
    let up: Vec<_> = ea
        .iter()
        .filter_map(|e| match e {
            CmEvent::Established {
                id, qp: Some(_), ..
            } => Some(*id),
            _ => None,
        })
        .collect();
    assert!(up.contains(&i4) && up.contains(&i6), "{ea:?}");
    // To the IPv4-only listener by IPv6: refused (the header's destination is not its).
    let before = cmb.counts().bad_header;
    let id = cma
        .connect(rc_qp(&pa, &da), v6(B6), 7175, &ConnectParams::default())
        .unwrap();
    ea.clear();
    eb.clear();
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        1000,
        1000,
        |a, _| { !a.is_empty() }
    ));
    assert!(eb.is_empty(), "{eb:?}");
    assert!(
        matches!(ea[0], CmEvent::Failed { id: x, failure: Failure::Rejected { reason: 28 }, qp: Some(_), .. } if x == id),
        "{ea:?}"
    );
    assert_eq!(cmb.counts().bad_header, before + 1);
    drop(qbs);
}

/// SIDR by IPv6 address: B's UD service is found (QPN, Q_Key, private data both ways), and a
/// datagram sent to it by the answer goes over IPv6 and lands with the IPv6 header.
#[test]
fn sidr_resolves_a_ud_service_by_ipv6_and_a_datagram_reaches_it() {
    let l = lab6((45, 46));
    let (pa, pb, ma, mb, da, db) = sides(&l);
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    cmb.listen(None, 7174, Service::Ud).unwrap();
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let ub = pb.qp_builder(&db, &db).caps(caps).build::<Ud>().unwrap();
    let ub_qpn = ub.qp_num();
    let mut ub = ub.ready(UDP_QKEY, 0).unwrap();
    let ua = pa.qp_builder(&da, &da).caps(caps).build::<Ud>().unwrap();
    let mut ua = ua.ready(UDP_QKEY, 0).unwrap();
    let start = l.seg.sent().len();
    let id = cma.sidr_resolve(v6(B6), 7174, b"udaddy6").unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        1000,
        1000,
        |_, b| { !b.is_empty() }
    ));
    let CmEvent::SidrRequest(r) = eb.remove(0) else {
        panic!("{eb:?}")
    };
    assert_eq!(
        (r.src_addr, r.src_ip, r.dst_port),
        (v6(A6).into(), [0; 4], 7174)
    );
    assert_eq!(&r.private_data.as_slice()[..7], b"udaddy6");
    cmb.sidr_reply(r.id, ub_qpn, UDP_QKEY, b"here").unwrap();
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        1000,
        1000,
        |a, _| { !a.is_empty() }
    ));
    let CmEvent::SidrResolved {
        id: got,
        result,
        private_data,
    } = ea.remove(0)
    else {
        panic!("{ea:?}")
    };
    assert_eq!((got, result), (id, Ok((ub_qpn, UDP_QKEY))));
    assert_eq!(&private_data.as_slice()[..4], b"here");
    // The datagram, by the address handle to B's IPv6 GID.
    let mut mra = pa.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mrb = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    mra.as_mut_slice()[..100].copy_from_slice(&[0x5A; 100]);
    let ah = pa.create_ah(&AddressVector::new(Gid(v6(B6)), 2)).unwrap();
    // SAFETY: the regions stay registered and untouched until the completions.
    unsafe {
        let mut rb = ub.recv_batch();
        rb.recv(1, &[mrb.sge(0, 40 + 100).unwrap()]).unwrap();
        rb.finish();
        let mut s = ua.send_batch();
        s.send_to(
            2,
            SendFlags::SIGNALED,
            (&ah, ub_qpn, UDP_QKEY),
            &[mra.sge(0, 100).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    let (wa, wb) = completions(&l, &da, &db, 1, 1);
    assert_eq!((wa[0].wr_id, wa[0].status), (2, WcStatus::Success));
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].byte_len),
        (1, WcStatus::Success, 140)
    );
    assert_eq!(&mrb.as_slice()[8..24], &v6(A6));
    assert_eq!(&mrb.as_slice()[40..140], &[0x5A; 100]);
    let (six, four) = roce_frames(&l, start);
    assert!(six >= 3, "{six}");
    assert_eq!(four, 0);
    assert_eq!((cma.in_use(), cmb.in_use()), (0, 0));
    drop(ah);
}

/// A device with no IPv6 address: a connection or SIDR request to an IPv6 address is refused
/// with a typed error, the QP handed back.
#[test]
fn no_ipv6_address_no_ipv6_connection() {
    let l = lab(Faults::default(), (47, 48));
    let (pa, _pb, ma, _mb, da, _db) = sides(&l);
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    assert_eq!(cma.ip6(), None);
    let Err((qp, e)) = cma.connect(rc_qp(&pa, &da), v6(B6), 7174, &ConnectParams::default()) else {
        panic!()
    };
    assert_eq!(e, CmError::NoAddress);
    assert_eq!(qp.query().unwrap().state, QpState::Reset);
    assert_eq!(cma.sidr_resolve(v6(B6), 7174, b""), Err(CmError::NoAddress));
    assert_eq!(cma.in_use(), 0);
}

/// Station C speaks raw MADs from its own QP1 (no CM): sends `m` to `dst` over IPv6.
struct Station<'a> {
    qp: QueuePair<'a, R, Gsi, Rts>,
    cq: &'a CompletionQueue<'a, R>,
    mr: MemoryRegion<'a, R>,
    pd: &'a ProtectionDomain<'a, R>,
    posted: u64,
    /// The address handles of C's sends (each holds its IPv6 path while its send waits for
    /// neighbour discovery); one path per destination, shared.
    ahs: Vec<AddressHandle<'a, R>>,
    sent: u64,
}

impl<'a> Station<'a> {
    fn new(pd: &'a ProtectionDomain<'a, R>, cq: &'a CompletionQueue<'a, R>) -> Self {
        let caps = QpCaps {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd.qp_builder(cq, cq).caps(caps).build::<Gsi>().unwrap();
        let mut s = Station {
            qp: qp.ready(GSI_QKEY, 0).unwrap(),
            cq,
            mr: pd
                .register(8 * 512 + 256, AccessFlags::LOCAL_WRITE)
                .unwrap(),
            pd,
            posted: 0,
            ahs: Vec::new(),
            sent: 0,
        };
        for i in 0..8 {
            s.post(i);
        }
        s
    }

    fn post(&mut self, slot: u64) {
        let sge = self.mr.sge((slot * 512) as u32, 40 + 256).unwrap();
        // SAFETY: the region outlives the QP; a slot is read only after its completion.
        unsafe {
            let mut r = self.qp.recv_batch();
            r.recv(slot, &[sge]).unwrap();
            r.finish();
        }
    }

    /// Sends `m` to QP1 at `dst` (one send at a time: the last one completed, see
    /// [`Self::received`]).
    fn send(&mut self, dst: [u8; 16], m: &Mad) {
        assert_eq!(self.sent, self.posted, "C's last send still out");
        let at = 8 * 512;
        self.mr.as_mut_slice()[at..at + 256].copy_from_slice(&m.0);
        let ah = self.pd.create_ah(&AddressVector::new(Gid(dst), 2)).unwrap();
        self.posted += 1;
        // SAFETY: as in `post`; the send buffer is not written again before its completion.
        unsafe {
            let mut s = self.qp.send_batch();
            s.send_to(
                100 + self.posted,
                SendFlags::SIGNALED,
                (&ah, 1, GSI_QKEY),
                &[self.mr.sge(at as u32, 256).unwrap()],
            )
            .unwrap();
            s.finish();
        }
        self.ahs.push(ah);
    }

    /// The MADs C received so far (each with the source address in its GRH slot).
    fn received(&mut self) -> Vec<([u8; 16], Mad)> {
        let mut out = Vec::new();
        let mut wc = [WorkCompletion::default(); 8];
        loop {
            let n = self.cq.poll(&mut wc).unwrap();
            if n == 0 {
                return out;
            }
            for w in &wc[..n] {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                if w.wr_id > 100 {
                    self.sent += 1;
                    continue;
                }
                assert!(w.wr_id < 8, "{w:?}");
                let at = w.wr_id as usize * 512;
                let b = &self.mr.as_slice()[at..at + 40 + 256];
                out.push((b[8..24].try_into().unwrap(), Mad::parse(&b[40..]).unwrap()));
                self.post(w.wr_id);
            }
        }
    }
}

/// Runs both CMs and C for `rounds` rounds of 1 ms; returns B's events and what C got.
fn run<'a>(
    l: &Lab,
    cma: &mut TestCm<'a>,
    cmb: &mut TestCm<'a>,
    c: &mut Station<'_>,
    rounds: u32,
) -> (Events<'a>, Events<'a>, Vec<([u8; 16], Mad)>) {
    let (mut ea, mut eb, mut got) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        pump(&l.clk, cma, cmb, &mut ea, &mut eb, 1, 1000, |_, _| false);
        got.extend(c.received());
    }
    (ea, eb, got)
}

fn req6(comm_id: u32, hdr: [u8; 36]) -> Req {
    let mut private = [0u8; pdata::REQ];
    private[..36].copy_from_slice(&hdr);
    Req {
        local_comm_id: comm_id,
        service_id: msg::service_id(msg::PS_TCP, 7174),
        local_ca_guid: 0x5054_00FF_FE00_0004,
        local_qpn: 0x33,
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
        local_gid: v6(C6),
        remote_gid: v6(B6),
        flow_label: 0,
        traffic_class: 0,
        hop_limit: 64,
        local_ack_timeout: 14,
        private: Private {
            bytes: private,
            len: pdata::REQ,
        },
    }
}

/// REQs over IPv6 from C whose rdma_cm header does not fit: C's address claimed by another
/// (A's), a destination other than B's, IP version 5, header version 1, an IPv4 header over
/// IPv6, a multicast source, a well-formed one to another port. Each is refused with a REJ
/// (reason 28, "consumer defined"; 8, "invalid service ID", for the port nobody serves) to
/// C, counted as a bad header, never reported to B's user; the well-formed one from C
/// itself is reported, its address C's.
#[test]
fn reqs_over_ipv6_with_a_bad_rdma_cm_header_are_refused_and_counted() {
    let l = lab6((49, 50));
    let (pa, pb, ma, mb, _da, _db) = sides(&l);
    let pc = l.c.alloc_pd().unwrap();
    let cc = l.c.create_cq(32).unwrap();
    let mut c = Station::new(&pc, &cc);
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    cmb.listen(None, 7174, Service::Rc).unwrap();
    let h6 = |src: [u8; 16], dst: [u8; 16]| {
        CmaHeader6 {
            src_port: 40000,
            src_ip: src,
            dst_ip: dst,
        }
        .to_bytes()
    };
    let good = h6(v6(C6), v6(B6));
    let mut ipv5 = good;
    ipv5[1] = 0x50;
    let mut version1 = good;
    version1[0] = 1;
    let mut multicast = v6(C6);
    multicast[0] = 0xFF;
    let four = CmaHeader {
        src_port: 40000,
        src_ip: IP_C,
        dst_ip: IP_B,
    }
    .to_bytes();
    let bad = [
        h6(v6(A6), v6(B6)),
        h6(v6(C6), v6(9)),
        ipv5,
        version1,
        four,
        h6(multicast, v6(B6)),
    ];
    // The parser's own verdicts on them.
    assert_eq!(CmaAddrs::parse(&ipv5), Err(CmaHeaderError::IpVersion(5)));
    assert_eq!(CmaAddrs::parse(&version1), Err(CmaHeaderError::Version(1)));
    assert_eq!(CmaAddrs::parse(&good[..35]), Err(CmaHeaderError::Short));
    assert_eq!(CmaAddrs::parse(&bad[5]), Err(CmaHeaderError::NoStation));
    assert_eq!(
        CmaAddrs::parse(&good).map(|h| (h.src_port, h.src, h.dst)),
        Ok((40000, CmAddr::from(v6(C6)), CmAddr::from(v6(B6))))
    );
    for (i, h) in bad.iter().enumerate() {
        let comm = 0x100 + i as u32;
        c.send(v6(B6), &req6(comm, *h).encode(0x77_0000 + u64::from(comm)));
        let (ea, eb, got) = run(&l, &mut cma, &mut cmb, &mut c, 30);
        assert!(ea.is_empty() && eb.is_empty(), "case {i}: {ea:?} {eb:?}");
        assert_eq!(got.len(), 1, "case {i}: one answer");
        let (from, m) = &got[0];
        assert_eq!((*from, m.attr()), (v6(B6), attr::REJ), "case {i}");
        let rej = Rej::decode(m);
        assert_eq!(
            (rej.ids.remote, rej.rejected, rej.reason),
            (comm, about::REQ, reason::CONSUMER)
        );
        assert_eq!(cmb.counts().bad_header, i as u64 + 1, "case {i}");
    }
    // To a port nobody serves: "invalid service ID", not a header's fault.
    let mut other = req6(0x200, good);
    other.service_id = msg::service_id(msg::PS_TCP, 9);
    c.send(v6(B6), &other.encode(0x77_0200));
    let (_, eb, got) = run(&l, &mut cma, &mut cmb, &mut c, 30);
    assert!(eb.is_empty());
    assert_eq!(Rej::decode(&got[0].1).reason, reason::INVALID_SERVICE_ID);
    assert_eq!(cmb.counts().bad_header, bad.len() as u64);
    // The well-formed one from C: a request, from C's IPv6 address.
    c.send(v6(B6), &req6(0x300, good).encode(0x77_0300));
    let (_, eb, got) = run(&l, &mut cma, &mut cmb, &mut c, 30);
    assert!(got.is_empty(), "{got:?}");
    let [CmEvent::ConnectRequest(r)] = &eb[..] else {
        panic!("{eb:?}")
    };
    assert_eq!(
        (r.src_addr, r.dst_addr, r.src_port),
        (v6(C6).into(), v6(B6).into(), 40000)
    );
    cmb.reject(r.id, b"no").unwrap();
    let (_, _, got) = run(&l, &mut cma, &mut cmb, &mut c, 30);
    assert_eq!(Rej::decode(&got[0].1).ids.remote, 0x300);
    assert_eq!(cmb.in_use(), 0);
}

/// A and B connected over IPv6; C, a third station, sends B a DREQ and A a REJ with the
/// connection's own IDs and QP number (as a station that sniffed them would) from its own
/// IPv6 address: both are ignored (counted unmatched, no event), and the connection still
/// carries data and disconnects.
#[test]
fn a_third_stations_dreq_and_rej_over_ipv6_are_ignored() {
    let l = lab6((51, 52));
    let (pa, pb, ma, mb, da, db) = sides(&l);
    let pc = l.c.alloc_pd().unwrap();
    let cc = l.c.create_cq(32).unwrap();
    let mut c = Station::new(&pc, &cc);
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    cmb.listen(None, 7174, Service::Rc).unwrap();
    let qa = rc_qp(&pa, &da);
    let qa_num = qa.qp_num();
    let a_id = cma
        .connect(qa, v6(B6), 7174, &ConnectParams::default())
        .unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let (r, mut qb) = accept_request(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        rc_qp(&pb, &db),
        |a, b| !a.is_empty() && !b.is_empty(),
    );
    let CmEvent::Established {
        qp: Some(mut qa), ..
    } = ea.remove(0)
    else {
        panic!("{ea:?}")
    };
    assert!(matches!(eb.remove(0), CmEvent::Established { .. }));
    let b_id = r.id;
    let (ua, ub) = (cma.counts().unmatched, cmb.counts().unmatched);
    // B's view of the IDs: local B, remote A; the DREQ names B's QP.
    let ids_from_a = Ids {
        local: a_id.0,
        remote: b_id.0,
    };
    c.send(v6(B6), &encode_dreq(ids_from_a, qb.qp_num(), 0x99));
    let rej = Rej {
        ids: Ids {
            local: b_id.0,
            remote: a_id.0,
        },
        rejected: about::REP,
        ari_len: 0,
        reason: reason::CONSUMER,
        private: Private::empty(),
    };
    let (ea, eb, mut got) = run(&l, &mut cma, &mut cmb, &mut c, 50);
    assert!(ea.is_empty() && eb.is_empty(), "{ea:?} {eb:?}");
    c.send(v6(A6), &rej.encode(0x9A));
    let (ea, eb, more) = run(&l, &mut cma, &mut cmb, &mut c, 50);
    assert!(ea.is_empty() && eb.is_empty(), "{ea:?} {eb:?}");
    got.extend(more);
    assert!(
        got.iter().all(|(_, m)| m.attr() != attr::DREP),
        "B answered C's DREQ"
    );
    assert_eq!(
        (cma.counts().unmatched, cmb.counts().unmatched),
        (ua + 1, ub + 1)
    );
    assert_eq!(qa.query().unwrap().state, QpState::Rts);
    assert_eq!(qb.query().unwrap().state, QpState::Rts);
    // Still carries data.
    let mut mra = pa.register(4096, ALL).unwrap();
    let mrb = pb.register(4096, ALL).unwrap();
    mra.as_mut_slice()[..64].copy_from_slice(&[7; 64]);
    // SAFETY: the regions stay registered and untouched until the completions.
    unsafe {
        let mut rb = qb.recv_batch();
        rb.recv(1, &[mrb.sge(0, 64).unwrap()]).unwrap();
        rb.finish();
        let mut s = qa.send_batch();
        s.send(2, SendFlags::SIGNALED, &[mra.sge(0, 64).unwrap()])
            .unwrap();
        s.finish();
    }
    let (wa, wb) = completions(&l, &da, &db, 1, 1);
    assert_eq!(
        (wa[0].status, wb[0].status),
        (WcStatus::Success, WcStatus::Success)
    );
    assert_eq!(&mrb.as_slice()[..64], &[7; 64]);
    assert_eq!(qa_num, qa.qp_num());
    // And disconnects, one event pair each side.
    cma.disconnect(a_id).unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    assert!(pump(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        3000,
        100_000,
        |a, b| { a.len() >= 2 && b.len() >= 2 }
    ));
    assert!(matches!(eb[0], CmEvent::Disconnected { id } if id == b_id));
    drop((qa, qb));
}

/// `CmAddr`: IPv4 kept as its IPv4-mapped GID (one comparison for both families), printed as
/// each family is written.
#[test]
fn addresses_compare_by_family_and_print_as_written() {
    let four = CmAddr::from([10, 0, 0, 3]);
    assert_eq!(four, CmAddr::from(Gid::from_ipv4([10, 0, 0, 3])));
    let mut mapped = [0u8; 16];
    mapped[10..].copy_from_slice(&[0xFF, 0xFF, 10, 0, 0, 3]);
    assert_eq!(
        four,
        CmAddr::from(mapped),
        "an IPv4-mapped IPv6 address is the IPv4 one"
    );
    assert_eq!(
        (four.ipv4(), four.ipv6(), four.is_ipv6()),
        (Some([10, 0, 0, 3]), None, false)
    );
    assert!(four == [10, 0, 0, 3] && four != v6(3));
    let six = CmAddr::from(v6(3));
    assert_eq!(
        (six.ipv4(), six.ipv6(), six.is_ipv6()),
        (None, Some(v6(3)), true)
    );
    assert!(six == v6(3) && six != [0, 0, 0, 3] && six != four);
    assert_eq!(six.gid(), Gid(v6(3)));
    let mut fe80 = [0u8; 16];
    fe80[..2].copy_from_slice(&[0xfe, 0x80]);
    fe80[8..].copy_from_slice(&[0x50, 0x54, 0, 0xff, 0xfe, 0, 0, 2]);
    let mut mid = v6(1);
    mid[7] = 0xab;
    for (a, text) in [
        (four, "10.0.0.3"),
        (six, "fd00::3"),
        (CmAddr::from([0u8; 16]), "::"),
        (CmAddr::from(fe80), "fe80::5054:ff:fe00:2"),
        (CmAddr::from(mid), "fd00:0:0:ab::1"),
        (CmAddr::UNSPECIFIED, "0.0.0.0"),
    ] {
        assert_eq!(a.to_string(), text);
    }
}
