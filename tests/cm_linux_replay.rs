//! Linux's CM messages, recorded in the RoCE lab, replayed against bareverbs' CM.
//!
//! `tests/data/rxe/linux-cm-rping.pcap` is what QEMU's `filter-dump` saw on the unikernel's NIC
//! in `qemu/roce/lab.sh` (`BAREVERBS_ROCE_ONLY=rping-server,rping-client`): unmodified
//! `rping -s` (Linux 6.1's rdma_cm on 10.0.0.1 serving, the unikernel connecting) and then
//! `rping -c` (Linux connecting to the unikernel on 10.0.0.2), cut to the ARP frames and the
//! management datagrams to QP1: REQ, REP, RTU, DREQ, DREP each way, and the two REJs
//! "invalid service ID" Linux sent while its server was not listening yet.
//!
//! - Linux's messages decode as Linux meant them (rdma_cm's service ID, its header, rping's
//!   depths and retries, Linux 6.1's timeouts and MTU).
//! - bareverbs' CM, on a device set up as the unikernel's (its MAC, so its CA GUID, and its
//!   address), fed Linux's frames in their order, answers with the unikernel's frames byte for
//!   byte, Ethernet to ICRC. The values the unikernel drew from its seed differ by
//!   construction (its communication ID, transaction ID and rdma_cm source port, its QP's
//!   number and starting PSN) and so does the IPv4 identification (a per-device counter):
//!   the test writes bareverbs' values into the recorded frame (and its checksums anew), and
//!   writes bareverbs' IDs into Linux's answers before it injects them, as Linux would have
//!   sent them to this CM.

use bareverbs::Context;
use bareverbs::cm::mad::Mad;
use bareverbs::cm::msg::{self, CmaHeader, Rep, Req};
use bareverbs::cm::{AcceptParams, Cm, CmConfig, CmEvent, ConnectParams, Failure, Service};
use bareverbs::device::rxe::wire::packet::{Frame, ROCE_OFFSET, finish, parse};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

const LINUX_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const UK_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];
const UK_IP: [u8; 4] = [10, 0, 0, 2];
const LINUX_IP: [u8; 4] = [10, 0, 0, 1];
/// Where the MAD starts in a UD frame to QP1: after the BTH and the DETH.
const MAD_AT: usize = ROCE_OFFSET + 12 + 8;

type R = Rxe<Model, MemLink, TestClock>;

/// The frames of a classic pcap file, in order.
fn pcap(bytes: &[u8]) -> Vec<Vec<u8>> {
    assert_eq!(
        &bytes[..4],
        &[0xd4, 0xc3, 0xb2, 0xa1],
        "a little-endian pcap"
    );
    let mut at = 24;
    let mut frames = Vec::new();
    while at + 16 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        frames.push(bytes[at + 16..at + 16 + len].to_vec());
        at += 16 + len;
    }
    frames
}

/// The recording, without the copies of the unikernel's own frames that the multicast
/// segment hands back to its NIC (identical bytes).
fn recording() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for f in pcap(include_bytes!("data/rxe/linux-cm-rping.pcap")) {
        if f[6..12] == UK_MAC && out.iter().rev().take(4).any(|g| *g == f) {
            continue;
        }
        out.push(f);
    }
    out
}

/// The CM messages of the recording: (sent by Linux, attribute, frame).
fn mads(frames: &[Vec<u8>]) -> Vec<(bool, u16, Vec<u8>)> {
    frames
        .iter()
        .filter(|f| matches!(parse(f), Ok(Frame::Roce(_))))
        .filter(|f| f[ROCE_OFFSET + 5..ROCE_OFFSET + 8] == [0, 0, 1])
        .map(|f| {
            let m = mad(f);
            (f[6..12] == LINUX_MAC, m.attr(), f.clone())
        })
        .collect()
}

fn mad(f: &[u8]) -> Mad {
    Mad::parse(&f[MAD_AT..MAD_AT + 256]).expect("a CM MAD")
}

/// The `n`-th (from 0) message with attribute `attr` sent by Linux (`linux`) or the unikernel.
fn find(all: &[(bool, u16, Vec<u8>)], linux: bool, attr: u16, n: usize) -> Vec<u8> {
    all.iter()
        .filter(|(l, a, _)| *l == linux && *a == attr)
        .nth(n)
        .unwrap_or_else(|| panic!("message {attr:#x} #{n} from linux={linux}"))
        .2
        .clone()
}

/// The one's-complement sum of 16-bit words, folded.
fn ones_sum(header: &[u8]) -> u16 {
    let sum = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = (sum & 0xFFFF) + (sum >> 16);
    ((sum & 0xFFFF) + (sum >> 16)) as u16
}

/// `f` with `patches` (offset in the MAD, bytes) written into its MAD, the IPv4
/// identification `ip_id` (if any), and its IPv4 checksum and ICRC computed anew.
fn patched(f: &[u8], patches: &[(usize, &[u8])], ip_id: Option<[u8; 2]>) -> Vec<u8> {
    let mut g = f.to_vec();
    for (at, bytes) in patches {
        g[MAD_AT + at..MAD_AT + at + bytes.len()].copy_from_slice(bytes);
    }
    if let Some(id) = ip_id {
        g[18..20].copy_from_slice(&id);
        g[24..26].fill(0);
        let sum = !ones_sum(&g[14..34]);
        g[24..26].copy_from_slice(&sum.to_be_bytes());
    }
    let n = g.len();
    g[n - 4..].fill(0);
    assert_eq!(finish(&mut g), Some(n));
    g
}

/// A device set up as the unikernel's, on a fresh segment with Linux's station beside it,
/// which knows Linux's MAC from the recording's ARP frames.
fn unikernel(frames: &[Vec<u8>]) -> (Context<R>, Segment, usize, TestClock) {
    let model = Model::new(ModelConfig::default());
    let seg = Segment::new();
    let clock = TestClock::default();
    let link = seg.attach(UK_MAC, 1514);
    let linux = seg.attach(LINUX_MAC, 1514).id();
    let ctx = Context::new(Rxe::new(model, link, clock.clone(), Config { ip: UK_IP }).unwrap());
    for f in frames
        .iter()
        .filter(|f| f[6..12] == LINUX_MAC && f[12..14] == [8, 6])
    {
        seg.inject(linux, f);
    }
    ctx.provider().progress();
    (ctx, seg, linux, clock)
}

/// The CM messages bareverbs has sent on `seg` so far.
fn sent(seg: &Segment, linux: usize) -> Vec<Vec<u8>> {
    seg.sent()
        .into_iter()
        .filter(|(from, f)| *from != linux && matches!(parse(f), Ok(Frame::Roce(_))))
        .map(|(_, f)| f)
        .filter(|f| f[ROCE_OFFSET + 5..ROCE_OFFSET + 8] == [0, 0, 1])
        .collect()
}

/// Polls `cm` until it has an event (the clock moving on a little each time).
fn event<'a, const N: usize>(
    cm: &mut Cm<'a, R, TestClock, N>,
    clock: &TestClock,
) -> CmEvent<'a, R> {
    for _ in 0..100 {
        if let Some(e) = cm.poll() {
            return e;
        }
        clock.advance(100);
    }
    panic!("no CM event")
}

#[test]
fn linux_messages_decode_as_linux_meant_them() {
    let all = mads(&recording());
    // rping -c's REQ (Linux active): rdma_cm's service ID for port 7174, its header, rping's
    // connection parameters, Linux 6.1's timeouts on RoCE.
    let f = find(&all, true, 0x0010, 0);
    let m = mad(&f);
    assert_eq!(
        (m.u8(0), m.u8(1), m.u8(2), m.u8(3)),
        (1, 7, 2, 3),
        "MAD header"
    );
    // Linux 6.1's TID: its MAD agent's number, then the comm ID's bytes in the CPU's
    // (little-endian) order (not checked by anyone: messages are matched by comm IDs).
    assert_eq!(m.tid() as u32, m.u32(24).swap_bytes(), "the REQ's TID");
    let req = Req::decode(&m);
    assert_eq!(req.service_id, msg::service_id(msg::PS_TCP, 7174));
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
    assert_eq!(
        (
            req.remote_cm_response_timeout,
            req.local_cm_response_timeout
        ),
        (20, 20)
    );
    assert_eq!(
        (req.max_cm_retries, req.mtu, req.pkey, req.transport),
        (15, 3, 0xFFFF, 0)
    );
    assert_eq!(
        req.local_ack_timeout, 19,
        "Linux 6.1: rxe's ACK delay 15, packet life 18"
    );
    assert_eq!(req.hop_limit, 64);
    assert_eq!(req.local_gid, Gid::from_ipv4(LINUX_IP).0);
    assert_eq!(req.remote_gid, Gid::from_ipv4(UK_IP).0);
    let hdr = CmaHeader::parse(req.private.as_slice()).expect("rdma_cm's header");
    assert_eq!((hdr.src_ip, hdr.dst_ip), (LINUX_IP, UK_IP));
    assert_eq!(
        req.flow_label,
        (u32::from(hdr.src_port) * 31 + 7174) & 0xF_FFFF,
        "rdma_cm's RoCEv2 flow label"
    );
    assert!(
        req.private.as_slice()[msg::CMA_HDR..]
            .iter()
            .all(|&b| b == 0)
    );
    // rping -s's REP (Linux passive): it names the unikernel's REQ, rxe's ACK delay.
    let f = find(&all, true, 0x0013, 0);
    let rep = Rep::decode(&mad(&f));
    // (The third REQ: the first two got REJ "invalid service ID".)
    let uk_req = mad(&find(&all, false, 0x0010, 2));
    assert_eq!(rep.remote_comm_id, uk_req.u32(24));
    assert_eq!(mad(&f).tid(), uk_req.tid(), "the REP echoes the REQ's TID");
    assert_eq!((rep.responder_resources, rep.initiator_depth), (1, 1));
    assert_eq!((rep.target_ack_delay, rep.rnr_retry_count), (15, 7));
    assert!(rep.private.as_slice().iter().all(|&b| b == 0));
}

#[test]
fn the_passive_cm_answers_linux_byte_for_byte() {
    let frames = recording();
    let all = mads(&frames);
    let (ctx, seg, linux, clock) = unikernel(&frames);
    let pd = ctx.alloc_pd().unwrap();
    let (cm_cq, cq) = (ctx.create_cq(32).unwrap(), ctx.create_cq(8).unwrap());
    let mut cm: Cm<'_, R, TestClock, 2> =
        Cm::new(&pd, &cm_cq, clock.clone(), CmConfig::default()).unwrap();
    cm.listen(None, 7174, Service::Rc).unwrap();
    let linux_req = find(&all, true, 0x0010, 0);
    seg.inject(linux, &linux_req);
    let CmEvent::ConnectRequest(r) = event(&mut cm, &clock) else {
        panic!("not a request")
    };
    assert_eq!((r.src_ip, r.dst_ip, r.dst_port), (LINUX_IP, UK_IP, 7174));
    let qp = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let psn = qp.local_psn();
    let qp = cm.accept(r.id, qp, &AcceptParams::default()).unwrap();
    // The REP: the unikernel's, with this CM's comm ID, QPN and PSN.
    let ours = sent(&seg, linux);
    assert_eq!(ours.len(), 1, "one REP");
    let id = r.id.0.to_be_bytes();
    let qpn = qp.qp_num().to_be_bytes();
    let want = patched(
        &find(&all, false, 0x0013, 0),
        &[(24, &id), (36, &qpn[1..]), (44, &psn.to_be_bytes()[1..])],
        Some([ours[0][18], ours[0][19]]),
    );
    assert_eq!(ours[0], want, "the REP");
    // Linux's RTU, to this CM's ID: established; the QP talks to Linux's.
    seg.inject(
        linux,
        &patched(&find(&all, true, 0x0014, 0), &[(28, &id)], None),
    );
    assert!(matches!(
        event(&mut cm, &clock),
        CmEvent::Established { qp: None, .. }
    ));
    let linux_qpn = Req::decode(&mad(&linux_req)).local_qpn;
    assert_eq!(qp.query().unwrap().dest_qpn, linux_qpn);
    // Linux's DREQ (to this CM's ID and QP): disconnected, and the unikernel's DREP.
    let dreq = find(&all, true, 0x0015, 0);
    seg.inject(linux, &patched(&dreq, &[(28, &id), (32, &qpn[1..])], None));
    assert!(matches!(
        event(&mut cm, &clock),
        CmEvent::Disconnected { .. }
    ));
    let ours = sent(&seg, linux);
    assert_eq!(ours.len(), 2, "the DREP");
    let want = patched(
        &find(&all, false, 0x0016, 0),
        &[(24, &id)],
        Some([ours[1][18], ours[1][19]]),
    );
    assert_eq!(ours[1], want, "the DREP");
}

#[test]
fn the_active_cm_connects_to_linux_byte_for_byte() {
    let frames = recording();
    let all = mads(&frames);
    let (ctx, seg, linux, clock) = unikernel(&frames);
    let pd = ctx.alloc_pd().unwrap();
    let (cm_cq, cq) = (ctx.create_cq(32).unwrap(), ctx.create_cq(8).unwrap());
    let mut cm: Cm<'_, R, TestClock, 2> =
        Cm::new(&pd, &cm_cq, clock.clone(), CmConfig::default()).unwrap();
    let qp = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let (qpn, psn) = (qp.qp_num().to_be_bytes(), qp.local_psn().to_be_bytes());
    // The REQ as the unikernel's `n`-th: with this CM's TID, comm ID, QPN, PSN, rdma_cm
    // source port and the flow label that follows from it.
    let check_req = |f: &[u8], n: usize| {
        let m = mad(f);
        let want = patched(
            &find(&all, false, 0x0010, n),
            &[
                (8, &m.tid().to_be_bytes()),
                (24, &m.0[24..28]),
                (56, &qpn[1..]),
                (68, &psn[1..]),
                (112, &m.0[112..115]),
                (166, &m.0[166..168]),
            ],
            Some([f[18], f[19]]),
        );
        assert_eq!(f, &want[..], "REQ #{n}");
    };
    // Linux's server was not listening yet: twice its REJ "invalid service ID" handed the
    // QP back, and the unikernel tried again (each REQ one PSN further on QP1).
    let mut qp = Some(qp);
    let mut round = |n: usize| {
        let id = cm
            .connect(
                qp.take().unwrap(),
                LINUX_IP,
                7174,
                &ConnectParams::default(),
            )
            .unwrap();
        let ours = sent(&seg, linux);
        assert_eq!(ours.len(), n + 1, "REQ #{n}");
        check_req(&ours[n], n);
        let tid = mad(&ours[n]).tid().to_be_bytes();
        if n < 2 {
            let rej = find(&all, true, 0x0012, n);
            assert_eq!(msg::Rej::decode(&mad(&rej)).reason, 8);
            seg.inject(
                linux,
                &patched(&rej, &[(8, &tid), (28, &id.0.to_be_bytes())], None),
            );
            let CmEvent::Failed {
                failure: Failure::Rejected { reason: 8 },
                qp: q,
                ..
            } = event(&mut cm, &clock)
            else {
                panic!("not rejected")
            };
            qp = q;
        }
        (id, tid)
    };
    round(0);
    round(1);
    let (id, tid) = round(2);
    let cid = id.0.to_be_bytes();
    // Linux's REP to this REQ: established, the QP in RTS towards Linux's QP.
    let rep = find(&all, true, 0x0013, 0);
    seg.inject(linux, &patched(&rep, &[(8, &tid), (28, &cid)], None));
    let CmEvent::Established { qp: Some(qp), .. } = event(&mut cm, &clock) else {
        panic!("not established")
    };
    let rep = Rep::decode(&mad(&rep));
    let attr = qp.query().unwrap();
    assert_eq!(
        (attr.dest_qpn, attr.sq_psn),
        (rep.local_qpn, rep.starting_psn)
    );
    // The RTU: the unikernel's.
    let ours = sent(&seg, linux);
    assert_eq!(ours.len(), 4, "the RTU");
    let want = patched(
        &find(&all, false, 0x0014, 0),
        &[(8, &tid), (24, &cid)],
        Some([ours[3][18], ours[3][19]]),
    );
    assert_eq!(ours[3], want, "the RTU");
    // The unikernel disconnects: its DREQ (a TID of its own), Linux's DREP ends it.
    let qp = qp.to_error().unwrap();
    cm.disconnect(id).unwrap();
    let ours = sent(&seg, linux);
    assert_eq!(ours.len(), 5, "the DREQ");
    let dtid = mad(&ours[4]).tid().to_be_bytes();
    let want = patched(
        &find(&all, false, 0x0015, 0),
        &[(8, &dtid), (24, &cid)],
        Some([ours[4][18], ours[4][19]]),
    );
    assert_eq!(ours[4], want, "the DREQ");
    let drep = find(&all, true, 0x0016, 0);
    seg.inject(linux, &patched(&drep, &[(8, &dtid), (28, &cid)], None));
    assert!(matches!(
        event(&mut cm, &clock),
        CmEvent::Disconnected { .. }
    ));
    drop(qp);
}
