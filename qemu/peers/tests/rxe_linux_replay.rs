//! A recorded exchange with Linux's `rdma_rxe`, replayed byte for byte.
//!
//! `tests/data/rxe/linux-rc-ud.pcap` is what QEMU's `filter-dump` saw on the unikernel's NIC in
//! `qemu/roce/lab.sh` (`BAREVERBS_ROCE_ONLY=rc-server,ud-client`): unmodified
//! `ibv_rc_pingpong -s 4096` (Linux serving) and `ibv_ud_pingpong -s 1024` (Linux the client)
//! against the unikernel, Linux 6.1's rxe on 10.0.0.1, the unikernel on 10.0.0.2. Only the
//! first messages of each are kept (ARP and RoCE frames; the TCP exchange is left out).
//!
//! - Every RoCE frame Linux sent parses, its IPv4 header checksum is valid, and the ICRC
//!   bareverbs computes over Linux's headers and payload is the one Linux sent.
//! - bareverbs, set up as the unikernel was (its QPN, both PSNs), fed Linux's frames in their
//!   order, sends byte for byte what the unikernel sent: the RC SEND of 4096 bytes in four
//!   packets and its acknowledgements, and takes Linux's messages into its receives.
//! - The same for the UD half: bareverbs answers Linux's UD SENDs with the unikernel's
//!   frames. One field differs by construction: the IPv4 identification, a per-device
//!   counter that had reached 1008 in the unikernel (the 200 RC messages before) and starts
//!   at 0 here. The test sets the recorded identification into bareverbs' frame, recomputes
//!   the two checksums it covers, and then compares every byte.

use bareverbs::Context;
use bareverbs::device::rxe::wire::packet::{Frame, ROCE_OFFSET, finish, parse};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

const LINUX_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const UK_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];
const UK_IP: [u8; 4] = [10, 0, 0, 2];
const LINUX_IP: [u8; 4] = [10, 0, 0, 1];

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
/// segment hands back to its NIC (identical bytes: a retransmission would carry a new IPv4
/// identification).
fn recording() -> Vec<Vec<u8>> {
    let all = pcap(include_bytes!("../../../tests/data/rxe/linux-rc-ud.pcap"));
    let mut out: Vec<Vec<u8>> = Vec::new();
    for f in all {
        if f[6..12] == UK_MAC && out.iter().rev().take(8).any(|g| *g == f) {
            continue;
        }
        out.push(f);
    }
    out
}

fn is_roce(f: &[u8]) -> bool {
    matches!(parse(f), Ok(Frame::Roce(_)))
}

fn bth(f: &[u8]) -> (u8, u32, u32) {
    let b = &f[ROCE_OFFSET..];
    (
        b[0],
        u32::from_be_bytes([0, b[5], b[6], b[7]]),
        u32::from_be_bytes([0, b[9], b[10], b[11]]),
    )
}

#[test]
fn linux_frames_check_as_bareverbs_computes_them() {
    let frames = recording();
    let linux: Vec<_> = frames
        .iter()
        .filter(|f| f[6..12] == LINUX_MAC && f[12..14] == [8, 0])
        .collect();
    let roce = linux.iter().filter(|f| is_roce(f)).count();
    assert!(
        roce >= 7,
        "the recording holds Linux's RoCE frames ({roce})"
    );
    let mut ud = 0;
    for f in linux.iter().filter(|f| is_roce(f)) {
        // The IPv4 header checksum Linux wrote is valid (the one's-complement sum of the
        // header is all ones), and the ICRC bareverbs computes over Linux's headers and
        // payload is the one Linux sent.
        assert!(ipv4_sum_ok(&f[14..34]), "IPv4 checksum");
        let mut g = f.to_vec();
        let n = g.len();
        g[n - 4..].fill(0);
        assert_eq!(finish(&mut g), Some(n));
        assert_eq!(&g, *f, "Linux's frame {:x?}", bth(f));
        ud += usize::from(bth(f).0 == 0x64);
    }
    assert!(ud >= 2, "UD SEND-only frames with their DETH ({ud})");
}

type R = Rxe<Model, MemLink, TestClock>;

/// The queue pairs' capacities: the few messages of the recording.
const CAPS: QpCaps = QpCaps {
    max_send_wr: 4,
    max_recv_wr: 4,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
};

/// A bareverbs RoCE device on a fresh in-memory segment, as the unikernel's: its MAC and IPv4
/// address, Linux's station beside it. Returns the context, the segment and Linux's port.
fn unikernel() -> (Context<R>, Segment, usize) {
    let model = Model::new(ModelConfig::default());
    let seg = Segment::new();
    let link = seg.attach(UK_MAC, 1514);
    let linux = seg.attach(LINUX_MAC, 1514).id();
    let ctx = Context::new(
        Rxe::new(
            model.clone(),
            link,
            TestClock::default(),
            Config { ip: UK_IP },
        )
        .unwrap(),
    );
    (ctx, seg, linux)
}

/// The RoCE frames bareverbs has sent on `seg` (not those of Linux's port `linux`).
fn sent_by_us(seg: &Segment, linux: usize) -> Vec<Vec<u8>> {
    seg.sent()
        .into_iter()
        .filter(|(from, f)| *from != linux && is_roce(f))
        .map(|(_, f)| f)
        .collect()
}

/// Linux's ARP frames of the recording, injected first: the unikernel knew Linux's MAC
/// before its first RoCE frame.
fn learn_linux(ctx: &Context<R>, seg: &Segment, linux: usize, frames: &[Vec<u8>]) {
    for f in frames
        .iter()
        .filter(|f| f[6..12] == LINUX_MAC && f[12..14] == [8, 6])
    {
        seg.inject(linux, f);
    }
    ctx.provider().progress();
}

/// The one's-complement sum of an IPv4 header's 16-bit words, folded to 16 bits.
fn ones_sum(header: &[u8]) -> u16 {
    let sum = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = (sum & 0xFFFF) + (sum >> 16);
    ((sum & 0xFFFF) + (sum >> 16)) as u16
}

/// Whether an IPv4 header's checksum is valid (its one's-complement sum is all ones).
fn ipv4_sum_ok(header: &[u8]) -> bool {
    ones_sum(header) == 0xFFFF
}

/// `f` with the IPv4 identification `id`, its IPv4 header checksum and its ICRC recomputed.
fn with_ip_id(f: &[u8], id: [u8; 2]) -> Vec<u8> {
    let mut g = f.to_vec();
    g[18..20].copy_from_slice(&id);
    g[24..26].fill(0);
    let sum = !ones_sum(&g[14..34]);
    g[24..26].copy_from_slice(&sum.to_be_bytes());
    let n = g.len();
    g[n - 4..].fill(0);
    assert_eq!(finish(&mut g), Some(n));
    g
}

#[test]
fn bareverbs_answers_linux_byte_for_byte() {
    let frames = recording();
    let roce: Vec<_> = frames.iter().filter(|f| is_roce(f)).collect();
    // The RC exchange: the unikernel's first frame is its first SEND; the frames that name
    // the other QP are Linux's.
    let first = roce
        .iter()
        .find(|f| f[6..12] == UK_MAC && bth(f).0 == 0x00)
        .expect("the unikernel's first SEND");
    let (_, linux_qpn, sq_psn) = bth(first);
    let linux_first = roce
        .iter()
        .find(|f| f[6..12] == LINUX_MAC && bth(f).0 == 0x00)
        .expect("Linux's first SEND");
    let (_, uk_qpn, rq_psn) = bth(linux_first);
    // Both directions of the RC messages, up to the first UD frame.
    let rc: Vec<&Vec<u8>> = roce
        .iter()
        .copied()
        .take_while(|f| bth(f).0 < 0x60)
        .collect();

    let (ctx, seg, linux) = unikernel();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let mut mr = pd.register(4 * 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let qp = pd.qp_builder(&cq, &cq).caps(CAPS).build::<Rc>().unwrap();
    assert_eq!(qp.qp_num(), uk_qpn, "the QPN the unikernel had");
    let qp = qp.init(&ConnectedInit::default()).unwrap();
    let mut rtr = ConnectedRtr::new(
        linux_qpn,
        rq_psn,
        AddressVector::new(Gid::from_ipv4(LINUX_IP), 1),
    );
    rtr.max_dest_rd_atomic = 1;
    let qp = qp.rtr(&rtr).unwrap();
    let mut rts = ConnectedRts::new(sq_psn);
    rts.max_rd_atomic = 1;
    let mut qp = qp.rts(&rts).unwrap();
    learn_linux(&ctx, &seg, linux, &frames);
    // The unikernel's messages are the pingpong pattern (peer.rs): message i, byte k.
    let case = bareverbs_lab_peers::peer::Case::parse("rc-server -s 4096").unwrap();
    let m = mr.as_mut_slice();
    for (k, b) in m[..4096].iter_mut().enumerate() {
        *b = case.pattern(0, k);
    }
    let sent_by_us = |seg: &Segment| sent_by_us(seg, linux);
    // SAFETY: the region stays registered and untouched until the completions.
    unsafe {
        let mut r = qp.recv_batch();
        r.recv(1, &[mr.sge(4096, 4096).unwrap()]).unwrap();
        r.recv(2, &[mr.sge(8192, 4096).unwrap()]).unwrap();
        r.finish();
        let mut s = qp.send_batch();
        s.send(3, SendFlags::SIGNALED, &[mr.sge(0, 4096).unwrap()])
            .unwrap();
        s.finish();
    }
    let mut wcs = [WorkCompletion::default(); 8];
    let mut got = Vec::new();
    let mut expected_ours = 0;
    let mut received = Vec::new();
    for f in &rc {
        if f[6..12] == UK_MAC {
            expected_ours += 1;
            // Our frame must have gone out by now, the same bytes.
            for _ in 0..100 {
                if sent_by_us(&seg).len() >= expected_ours {
                    break;
                }
                ctx.provider().progress();
            }
            let ours = sent_by_us(&seg);
            assert!(
                ours.len() >= expected_ours,
                "bareverbs sent {} RoCE frames, the unikernel {expected_ours} by now",
                ours.len()
            );
            assert_eq!(
                &ours[expected_ours - 1],
                *f,
                "frame {expected_ours} of ours, recorded {:x?}",
                bth(f)
            );
        } else {
            seg.inject(linux, f);
            ctx.provider().progress();
        }
        let n = cq.poll(&mut wcs).unwrap();
        got.extend_from_slice(&wcs[..n]);
        for w in &wcs[..n] {
            if w.opcode == WcOpcode::Recv {
                received.push((w.wr_id, w.byte_len, w.status));
            }
        }
    }
    assert!(
        expected_ours >= 5,
        "the recording's frames of ours ({expected_ours})"
    );
    let send = got
        .iter()
        .find(|w| w.wr_id == 3)
        .expect("the SEND completed");
    assert_eq!(send.status, WcStatus::Success);
    assert_eq!(received.first(), Some(&(1, 4096, WcStatus::Success)));
    // Linux echoes: its first message is the unikernel's first (rc_pingpong's server sends
    // back what its one buffer received).
    let m = mr.as_slice();
    assert!((0..4096).all(|k| m[4096 + k] == case.pattern(0, k)));
    drop(qp);
    assert_eq!(
        sent_by_us(&seg).len(),
        expected_ours,
        "nothing more was sent"
    );
}

#[test]
fn bareverbs_answers_linux_ud_byte_for_byte() {
    let frames = recording();
    let ud: Vec<_> = frames
        .iter()
        .filter(|f| is_roce(f) && bth(f).0 == 0x64)
        .collect();
    // ud-client: Linux is the client and sends first; the unikernel answers each message.
    let linux_first = ud
        .iter()
        .find(|f| f[6..12] == LINUX_MAC)
        .expect("Linux's first UD SEND");
    let (_, uk_qpn, _) = bth(linux_first);
    let ours_first = ud
        .iter()
        .find(|f| f[6..12] == UK_MAC)
        .expect("the unikernel's first UD SEND");
    let (_, linux_qpn, sq_psn) = bth(ours_first);
    // The Q_Key ibv_ud_pingpong uses, from the DETH of the unikernel's frame.
    let qkey = u32::from_be_bytes(
        ours_first[ROCE_OFFSET + 12..ROCE_OFFSET + 16]
            .try_into()
            .unwrap(),
    );
    assert_eq!(qkey, 0x1111_1111);

    let (ctx, seg, linux) = unikernel();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let mut mr = pd.register(4 * 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let qp = pd.qp_builder(&cq, &cq).caps(CAPS).build::<Ud>().unwrap();
    assert_eq!(qp.qp_num(), uk_qpn, "the QPN the unikernel had");
    let qp = qp.init(&DatagramInit::new(qkey)).unwrap();
    let qp = qp.rtr(&()).unwrap();
    let mut qp = qp.rts(&DatagramRts { sq_psn }).unwrap();
    let ah = pd
        .create_ah(&AddressVector::new(Gid::from_ipv4(LINUX_IP), 1))
        .unwrap();
    learn_linux(&ctx, &seg, linux, &frames);

    let case = bareverbs_lab_peers::peer::Case::parse("ud-client -s 1024").unwrap();
    let size = case.size as usize;
    let grh = case.payload_offset();
    let slot = 4096;
    // Receives: the GRH area, then the message.
    let mut next_recv = 0u64;
    let mut post_recv = |qp: &mut QueuePair<'_, R, Ud, Rts>, mr: &MemoryRegion<'_, R>| {
        let at = (next_recv as usize % 2) * slot;
        // SAFETY: the region stays registered, and the test reads a receive's bytes only
        // after its completion.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(
                next_recv,
                &[mr.sge(at as u32, (grh + size) as u32).unwrap()],
            )
            .unwrap();
            r.finish();
        }
        next_recv += 1;
    };
    post_recv(&mut qp, &mr);
    post_recv(&mut qp, &mr);

    let mut wcs = [WorkCompletion::default(); 8];
    let (mut received, mut sent) = (0u32, 0u32);
    let mut sends_done = 0u32;
    for f in &ud {
        if f[6..12] == LINUX_MAC {
            seg.inject(linux, f);
            ctx.provider().progress();
            let n = cq.poll(&mut wcs).unwrap();
            let recv = wcs[..n]
                .iter()
                .find(|w| w.opcode == WcOpcode::Recv)
                .expect("Linux's UD SEND completed a receive");
            assert_eq!(recv.status, WcStatus::Success);
            assert_eq!(recv.byte_len as usize, grh + size);
            assert_eq!(recv.src_qp, linux_qpn, "the sender's QPN from the DETH");
            sends_done += wcs[..n]
                .iter()
                .filter(|w| w.opcode == WcOpcode::Send)
                .count() as u32;
            let at = (recv.wr_id as usize % 2) * slot;
            let m = &mr.as_slice()[at..at + grh + size];
            assert!(
                bareverbs_lab_peers::peer::grh_ok(
                    &m[..grh],
                    &Gid::from_ipv4(LINUX_IP),
                    &Gid::from_ipv4(UK_IP)
                ),
                "the GRH area holds Linux's IPv4 header"
            );
            assert!(
                (0..size).all(|k| m[grh + k] == case.expected(received, k)),
                "message {received} is what Linux's ud_pingpong sends"
            );
            received += 1;
            post_recv(&mut qp, &mr);
        } else {
            // The unikernel's answer: message `sent` of the pingpong pattern, from the third
            // 4 KiB of the region.
            let m = mr.as_mut_slice();
            for k in 0..size {
                m[2 * slot + k] = case.pattern(sent, k);
            }
            // SAFETY: the region stays registered and this slice untouched until the SEND's
            // completion (polled below before the slice is rewritten).
            unsafe {
                let mut s = qp.send_batch();
                s.send_to(
                    100 + u64::from(sent),
                    SendFlags::SIGNALED,
                    (&ah, linux_qpn, qkey),
                    &[mr.sge(2 * slot as u32, size as u32).unwrap()],
                )
                .unwrap();
                s.finish();
            }
            sent += 1;
            ctx.provider().progress();
            let ours = sent_by_us(&seg, linux);
            assert_eq!(ours.len() as u32, sent, "one frame per UD SEND");
            let mine = ours.last().unwrap();
            assert!(ipv4_sum_ok(&mine[14..34]), "our IPv4 checksum");
            assert_eq!(
                with_ip_id(mine, [f[18], f[19]]),
                **f,
                "UD SEND {sent} of ours, the recorded identification set into it"
            );
            let n = cq.poll(&mut wcs).unwrap();
            sends_done += wcs[..n]
                .iter()
                .filter(|w| w.opcode == WcOpcode::Send && w.status == WcStatus::Success)
                .count() as u32;
            assert_eq!(sends_done, sent, "the SEND completed");
        }
    }
    assert!(
        received >= 2 && sent >= 2,
        "the recording's UD messages ({received} in, {sent} out)"
    );
    drop(qp);
}
