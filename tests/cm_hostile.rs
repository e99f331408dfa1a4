//! The CM against hostile input from a third station (C) on the segment, while A and B hold a
//! connection: short and malformed datagrams, wrong class, version, method or attribute,
//! unknown communication IDs, a REP for a REQ never sent, a DREQ for somebody else's
//! connection, a REQ flood past the table's capacity, answers provoked from an address that
//! never resolves. In every case: bounded work, no panic, and the A–B connection undisturbed
//! (it still carries data and disconnects cleanly).

mod cm_common;

use bareverbs::cm::msg::{
    self, CmaHeader, Ids, Private, Rej, Rep, Req, about, encode_dreq, encode_simple, pdata,
};
use bareverbs::cm::{CmConfig, CmEvent, ConnId, Service, mad::attr};
use bareverbs::verbs::*;
use bareverbs_model::link::Faults;
use cm_common::*;

/// A and B connected through the CM (A active): the IDs of both sides, both QPs.
struct Up<'a> {
    a_id: ConnId,
    b_id: ConnId,
    qa: QueuePair<'a, R, Rc, Rts>,
    qb: QueuePair<'a, R, Rc, Rts>,
}

fn up<'a>(
    l: &Lab,
    cma: &mut TestCm<'a>,
    cmb: &mut TestCm<'a>,
    qa: QueuePair<'a, R, Rc, Reset>,
    qb: QueuePair<'a, R, Rc, Reset>,
) -> Up<'a> {
    cmb.listen(None, 7174, Service::Rc).unwrap();
    let a_id = connect_to_b(cma, qa);
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let (r, qb) = accept_request(&l.clk, cma, cmb, &mut ea, &mut eb, qb, |a, b| {
        !a.is_empty() && !b.is_empty()
    });
    let CmEvent::Established { qp: Some(qa), .. } = ea.remove(0) else {
        panic!()
    };
    Up {
        a_id,
        b_id: r.id,
        qa,
        qb,
    }
}

/// The A–B connection still carries a SEND, then disconnects with one event each side.
fn still_fine<'a>(
    l: &Lab,
    cma: &mut TestCm<'a>,
    cmb: &mut TestCm<'a>,
    mut u: Up<'a>,
    pa: &'a ProtectionDomain<'a, R>,
    pb: &'a ProtectionDomain<'a, R>,
    (da, db): (&CompletionQueue<'a, R>, &CompletionQueue<'a, R>),
) {
    let mut ma = pa.register(4096, ALL).unwrap();
    let mb = pb.register(4096, ALL).unwrap();
    ma.as_mut_slice()[..5].copy_from_slice(b"alive");
    // SAFETY: the regions stay registered and untouched until the completions.
    unsafe {
        let mut r = u.qb.recv_batch();
        r.recv(1, &[mb.sge(0, 64).unwrap()]).unwrap();
        r.finish();
        let mut s = u.qa.send_batch();
        s.send(2, SendFlags::SIGNALED, &[ma.sge(0, 5).unwrap()])
            .unwrap();
        s.finish();
    }
    let (wa, wb) = completions(l, da, db, 1, 1);
    assert_eq!(
        (wa[0].status, wb[0].status),
        (WcStatus::Success, WcStatus::Success)
    );
    assert_eq!(&mb.as_slice()[..5], b"alive");
    cma.disconnect(u.a_id).unwrap();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    assert!(pump(
        &l.clk,
        cma,
        cmb,
        &mut ea,
        &mut eb,
        3000,
        1000,
        |a, b| { a.len() >= 2 && b.len() >= 2 }
    ));
    assert!(
        matches!(ea[0], CmEvent::Disconnected { id } if id == u.a_id),
        "{ea:?}"
    );
    assert!(
        matches!(eb[0], CmEvent::Disconnected { id } if id == u.b_id),
        "{eb:?}"
    );
    assert_eq!(ea.len() + eb.len(), 4, "{ea:?} {eb:?}");
}

/// CM MADs B sent from `from` on in the segment's record, by attribute.
fn b_sent(l: &Lab, from: usize) -> Vec<u16> {
    l.seg.sent()[from..]
        .iter()
        .filter(|(link, f)| *link == 1 && f.len() >= 62 + 256 && f[36..38] == [0x12, 0xB7])
        .filter(|(_, f)| f[47..50] == [0, 0, 1])
        .map(|(_, f)| u16::from_be_bytes([f[62 + 16], f[62 + 17]]))
        .collect()
}

/// Runs B's CM (and A's) a few rounds, returning B's events.
fn settle<'a>(l: &Lab, cma: &mut TestCm<'a>, cmb: &mut TestCm<'a>) -> Events<'a> {
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    pump(&l.clk, cma, cmb, &mut ea, &mut eb, 50, 100, |_, _| false);
    assert!(ea.is_empty(), "A saw: {ea:?}");
    eb
}

fn a_req(comm_id: u32, qpn: u32, src_ip: [u8; 4]) -> Req {
    let mut private = [0u8; pdata::REQ];
    private[..36].copy_from_slice(
        &CmaHeader {
            src_port: 40000,
            src_ip,
            dst_ip: IP_B,
        }
        .to_bytes(),
    );
    Req {
        local_comm_id: comm_id,
        service_id: msg::service_id(msg::PS_TCP, 7174),
        local_ca_guid: 0x5054_00FF_FE00_0004,
        local_qpn: qpn,
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
        remote_gid: Gid::from_ipv4(IP_B).0,
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

macro_rules! setup {
    ($l:ident, $pa:ident, $pb:ident, $da:ident, $db:ident, $cma:ident, $cmb:ident, $u:ident) => {
        let $l = lab(Faults::default(), (31, 32));
        let ($pa, $pb, ma, mb, $da, $db) = sides(&$l);
        let mut $cma = cm(&$pa, &ma, &$l.clk, CmConfig::default());
        let mut $cmb = cm(&$pb, &mb, &$l.clk, CmConfig::default());
        let $u = up(
            &$l,
            &mut $cma,
            &mut $cmb,
            rc_qp(&$pa, &$da),
            rc_qp(&$pb, &$db),
        );
    };
}

#[test]
fn malformed_datagrams_are_counted_and_dropped_without_an_answer() {
    setup!(l, pa, pb, da, db, cma, cmb, u);
    let good = msg::encode_simple(
        attr::RTU,
        Ids {
            local: 1,
            remote: 2,
        },
        &[],
        9,
    )
    .0;
    let with = |at: usize, v: u8| {
        let mut m = good;
        m[at] = v;
        m.to_vec()
    };
    let mut lap = good;
    lap[16..18].copy_from_slice(&0x0019u16.to_be_bytes());
    let mut cpi = good;
    cpi[16..18].copy_from_slice(&0x0001u16.to_be_bytes());
    let bad = vec![
        vec![1],
        good[..100].to_vec(),
        good[..255].to_vec(),
        with(0, 2),    // base version
        with(1, 0x04), // class (SM)
        with(2, 1),    // class version
        with(3, 0x81), // method GetResp
        lap.to_vec(),  // LAP: not on RoCE
        cpi.to_vec(),  // ClassPortInfo
        vec![0xFF; 256],
    ];
    let before = (cmb.counts(), l.seg.sent().len());
    send_from_c(&l, IP_B, &bad);
    let eb = settle(&l, &mut cma, &mut cmb);
    assert!(eb.is_empty(), "{eb:?}");
    let after = cmb.counts();
    assert_eq!(after.malformed - before.0.malformed, bad.len() as u64);
    assert_eq!(after.received, before.0.received);
    assert_eq!(b_sent(&l, before.1), Vec::<u16>::new(), "no answer to any");
    assert_eq!(cmb.in_use(), 1);
    still_fine(&l, &mut cma, &mut cmb, u, &pa, &pb, (&da, &db));
}

#[test]
fn unknown_communication_ids_are_ignored_and_an_unknown_dreq_gets_a_drep() {
    setup!(l, pa, pb, da, db, cma, cmb, u);
    let ids = Ids {
        local: 0x1234_5678,
        remote: 0x9ABC_DEF0,
    };
    let rej = Rej {
        ids,
        rejected: about::REP,
        ari_len: 0,
        reason: 28,
        private: Private::empty(),
    };
    let mra = msg::Mra {
        ids,
        mraed: about::REQ,
        service_timeout: 31,
    };
    let rep = Rep {
        local_comm_id: ids.local,
        remote_comm_id: ids.remote,
        local_qpn: 0x99,
        starting_psn: 0,
        responder_resources: 0,
        initiator_depth: 0,
        target_ack_delay: 0,
        flow_control: false,
        rnr_retry_count: 0,
        srq: false,
        local_ca_guid: 1,
        private: Private::empty(),
    };
    let mads = [
        encode_simple(attr::RTU, ids, &[], 1).0.to_vec(),
        encode_simple(attr::DREP, ids, &[], 2).0.to_vec(),
        rej.encode(3).0.to_vec(),
        mra.encode(4).0.to_vec(),
        rep.encode(5).0.to_vec(),
    ];
    let before = (cmb.counts(), l.seg.sent().len());
    send_from_c(&l, IP_B, &mads);
    assert!(settle(&l, &mut cma, &mut cmb).is_empty());
    let after = cmb.counts();
    assert_eq!(after.unmatched - before.0.unmatched, 5);
    assert_eq!(b_sent(&l, before.1), Vec::<u16>::new());
    // A DREQ for a connection B does not know: a DREP, IDs swapped, and nothing else.
    let start = l.seg.sent().len();
    send_from_c(&l, IP_B, &[encode_dreq(ids, 0x99, 6).0.to_vec()]);
    assert!(settle(&l, &mut cma, &mut cmb).is_empty());
    assert_eq!(b_sent(&l, start), vec![attr::DREP]);
    let drep = l.seg.sent()[start..]
        .iter()
        .find(|(link, f)| *link == 1 && is_mad(f, attr::DREP))
        .map(|(_, f)| f[62..].to_vec())
        .unwrap();
    assert_eq!(
        &drep[24..32],
        &[0x9A, 0xBC, 0xDE, 0xF0, 0x12, 0x34, 0x56, 0x78]
    );
    assert_eq!(
        &drep[8..16],
        &6u64.to_be_bytes(),
        "the DREQ's transaction ID"
    );
    still_fine(&l, &mut cma, &mut cmb, u, &pa, &pb, (&da, &db));
}

#[test]
fn a_dreq_for_somebody_elses_connection_is_dropped() {
    setup!(l, pa, pb, da, db, cma, cmb, u);
    // C knows both IDs and B's QP number, but is not A.
    let ids = Ids {
        local: u.a_id.0,
        remote: u.b_id.0,
    };
    let start = l.seg.sent().len();
    let before = cmb.counts();
    send_from_c(&l, IP_B, &[encode_dreq(ids, u.qb.qp_num(), 7).0.to_vec()]);
    assert!(settle(&l, &mut cma, &mut cmb).is_empty(), "no Disconnected");
    assert_eq!(cmb.counts().unmatched - before.unmatched, 1);
    assert_eq!(b_sent(&l, start), Vec::<u16>::new(), "no DREP");
    // Nor may a REJ or an RTU from C touch it.
    let rej = Rej {
        ids,
        rejected: about::OTHER,
        ari_len: 0,
        reason: 28,
        private: Private::empty(),
    };
    send_from_c(&l, IP_B, &[rej.encode(8).0.to_vec()]);
    send_from_c(&l, IP_A, &[rej.encode(8).0.to_vec()]);
    assert!(settle(&l, &mut cma, &mut cmb).is_empty());
    still_fine(&l, &mut cma, &mut cmb, u, &pa, &pb, (&da, &db));
}

#[test]
fn a_rep_for_a_req_never_sent_or_from_another_station_is_ignored() {
    let l = lab(Faults::default(), (41, 42));
    let (pa, pb, ma, mb, da, db) = sides(&l);
    let mut cma = cm(&pa, &ma, &l.clk, CmConfig::default());
    let mut cmb = cm(&pb, &mb, &l.clk, CmConfig::default());
    cmb.listen(None, 7174, Service::Rc).unwrap();
    let a_id = connect_to_b(&mut cma, rc_qp(&pa, &da));
    let forged = |remote: u32| Rep {
        local_comm_id: 0x4444,
        remote_comm_id: remote,
        local_qpn: 0x55,
        starting_psn: 0,
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 15,
        flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0x77,
        private: Private::empty(),
    };
    // To A (whose REQ is out to B, not yet answered): a REP naming a REQ A never sent, and
    // one naming A's real REQ but coming from C.
    let start = l.seg.sent().len();
    send_from_c(
        &l,
        IP_A,
        &[
            forged(a_id.0 ^ 1).encode(1).0.to_vec(),
            forged(a_id.0).encode(2).0.to_vec(),
        ],
    );
    let evs = run_alone(&l.clk, &mut cma, 20, 100);
    assert!(evs.is_empty(), "{evs:?}");
    assert_eq!(cma.counts().unmatched, 2);
    let rtus = l.seg.sent()[start..]
        .iter()
        .filter(|(link, f)| *link == 0 && is_mad(f, attr::RTU))
        .count();
    assert_eq!(rtus, 0);
    // B's real answer still connects A, to B's QP.
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let (_, qb) = accept_request(
        &l.clk,
        &mut cma,
        &mut cmb,
        &mut ea,
        &mut eb,
        rc_qp(&pb, &db),
        |a, _| !a.is_empty(),
    );
    let CmEvent::Established { qp: Some(qa), .. } = ea.remove(0) else {
        panic!("{ea:?}")
    };
    assert_eq!(qa.query().unwrap().dest_qpn, qb.qp_num());
}

#[test]
fn a_req_flood_past_the_table_evicts_the_oldest_half_open_and_spares_the_connection() {
    setup!(l, pa, pb, da, db, cma, cmb, u);
    // B's table has 8 entries, one of them the A–B connection. 20 REQs from C, in rounds
    // small enough for QP1's receive buffers.
    let start = l.seg.sent().len();
    let mut reqs = Vec::new();
    for k in 0..20u32 {
        reqs.push(
            a_req(0x1000 + k, 0x100 + k, IP_C)
                .encode(u64::from(k))
                .0
                .to_vec(),
        );
    }
    let mut eb = Vec::new();
    for chunk in reqs.chunks(4) {
        send_from_c(&l, IP_B, chunk);
        eb.extend(settle(&l, &mut cma, &mut cmb));
    }
    assert_eq!(cmb.in_use(), 8, "the table is full, no more");
    assert_eq!(cmb.counts().evicted, 13);
    let sent = b_sent(&l, start);
    assert_eq!(sent.iter().filter(|&&a| a == attr::REJ).count(), 13);
    assert_eq!(sent.len(), 13, "{sent:?}");
    // Every REJ is "no resources", to a request that was waiting.
    for (_, f) in l.seg.sent()[start..]
        .iter()
        .filter(|(link, f)| *link == 1 && is_mad(f, attr::REJ))
    {
        assert_eq!(&f[62 + 34..62 + 36], &[0, 3]);
    }
    // B reported each request it held when polled; the last 7 are still waiting.
    let requests: Vec<u32> = eb
        .iter()
        .filter_map(|e| match e {
            CmEvent::ConnectRequest(r) => Some(r.private_data.len as u32),
            _ => None,
        })
        .collect();
    assert!(requests.len() >= 7, "{eb:?}");
    // A REQ whose rdma_cm header names another source than the sender: REJ 28, no entry.
    let start = l.seg.sent().len();
    send_from_c(
        &l,
        IP_B,
        &[a_req(0x2000, 0x200, IP_A).encode(99).0.to_vec()],
    );
    assert!(settle(&l, &mut cma, &mut cmb).is_empty());
    assert_eq!(b_sent(&l, start), vec![attr::REJ]);
    assert_eq!(cmb.counts().evicted, 13);
    still_fine(&l, &mut cma, &mut cmb, u, &pa, &pb, (&da, &db));
}

#[test]
fn a_duplicate_req_gets_an_mra_and_a_req_with_a_connections_qp_from_elsewhere_is_new() {
    setup!(l, pa, pb, da, db, cma, cmb, u);
    let req = a_req(0x3000, 0x300, IP_C).encode(5).0.to_vec();
    send_from_c(&l, IP_B, std::slice::from_ref(&req));
    let eb = settle(&l, &mut cma, &mut cmb);
    let [CmEvent::ConnectRequest(r)] = &eb[..] else {
        panic!("{eb:?}")
    };
    let start = l.seg.sent().len();
    send_from_c(&l, IP_B, &[req]);
    assert!(settle(&l, &mut cma, &mut cmb).is_empty(), "reported once");
    assert_eq!(b_sent(&l, start), vec![attr::MRA]);
    assert_eq!(cmb.in_use(), 2);
    cmb.reject(r.id, &[]).unwrap();
    // The values of A's connection (its QP and CA GUID) in a REQ from C: a new request,
    // not a stale one: the A–B connection is not disconnected.
    let qpn = u.qa.qp_num();
    let guid = {
        let f = l.seg.sent();
        let (_, req) = f
            .iter()
            .find(|(link, f)| *link == 0 && is_mad(f, attr::REQ))
            .unwrap();
        u64::from_be_bytes(req[62 + 40..62 + 48].try_into().unwrap())
    };
    let start = l.seg.sent().len();
    let mut from_c = a_req(0x3002, qpn, IP_C);
    from_c.local_ca_guid = guid;
    send_from_c(&l, IP_B, &[from_c.encode(6).0.to_vec()]);
    let eb = settle(&l, &mut cma, &mut cmb);
    assert_eq!(eb.len(), 1, "a new request, not a stale one: {eb:?}");
    assert!(!b_sent(&l, start).contains(&attr::DREQ));
    still_fine(&l, &mut cma, &mut cmb, u, &pa, &pb, (&da, &db));
}

/// A CM datagram to QP1 at B, forged from `src_ip` (with C's MAC), on the wire as it is.
fn forged_to_b(l: &Lab, src_ip: [u8; 4], mad: &[u8]) {
    use bareverbs::device::rxe::wire::bth::{Bth, Deth, Headers, opcode};
    use bareverbs::device::rxe::wire::packet::{Route, build};
    let route = Route {
        src_mac: [0x52, 0x54, 0, 0, 0, 4],
        dst_mac: [0x52, 0x54, 0, 0, 0, 3],
        src_ip,
        dst_ip: IP_B,
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
fn answers_to_a_stranger_whose_address_does_not_resolve_do_not_hold_up_a_disconnection() {
    setup!(l, pa, pb, da, db, cma, cmb, u);
    let _ = (&pa, &pb, &da, &db);
    // A stranger on an address nobody answers ARP for keeps B answering: DREQs for
    // connections B does not know (each gets a DREP, which waits for the address to
    // resolve). B's own DREQ to A, and A's DREP, still get through.
    let mut ea = Vec::new();
    let mut eb = Vec::new();
    let mut k = 0u32;
    for round in 0..5000u32 {
        for _ in 0..4 {
            k += 1;
            let ids = Ids {
                local: 0x7000_0000 + k,
                remote: 0x0100_0000 + k,
            };
            forged_to_b(&l, [10, 0, 0, 99], &encode_dreq(ids, 0x77, u64::from(k)).0);
        }
        if round == 100 {
            cmb.disconnect(u.b_id).unwrap();
        }
        l.clk.advance(1000);
        while let Some(e) = cma.poll() {
            ea.push(e);
        }
        while let Some(e) = cmb.poll() {
            eb.push(e);
        }
        if !ea.is_empty() && !eb.is_empty() {
            break;
        }
    }
    assert!(
        matches!(ea[..], [CmEvent::Disconnected { id }] if id == u.a_id),
        "A: {ea:?} (B sent {} answers, deferred {})",
        cmb.counts().sent,
        cmb.counts().send_dropped
    );
    assert!(
        matches!(eb[..], [CmEvent::Disconnected { id }] if id == u.b_id),
        "{eb:?}"
    );
    assert!(
        cmb.counts().send_dropped > 0,
        "the answers did fill their buffers"
    );
    drop(u);
}
