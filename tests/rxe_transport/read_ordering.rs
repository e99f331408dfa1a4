//! READ ordering: acknowledgements and NAKs wait behind the READ responses the NIC had no room
//! for, and a NAK past an unanswered READ asks for the READ again from its first PSN.

use super::*;

// RC opcodes (IBA 9.2) and AETH syndromes the READ-ordering tests below look for.
const READ_REQUEST: u8 = 0x0C;
const READ_RESPONSE_LAST: u8 = 0x0F;
const ACKNOWLEDGE: u8 = 0x11;
const SYN_ACK: u8 = 0x1F;
/// An RNR NAK's syndrome (timer code 1).
const SYN_RNR_NAK: u8 = 0x21;
/// Bytes the READ-ordering tests read: 16 packets at MTU 1024.
const READ_LEN: usize = 16384;

/// The READ-ordering tests' set-up: A and B connected (unlimited retries), B's region holding a
/// pattern in its first [`READ_LEN`] bytes and 4096 more after them, one WRITE exchanged so the
/// peers know each other's MAC; then `f` with the pair, A's region and B's region.
fn read_setup(
    l: &Lab,
    f: impl for<'a> FnOnce(&mut Pair<'a>, &MemoryRegion<'a, R>, &MemoryRegion<'a, R>),
) {
    let pds = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let cqs = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
    let ma = pds.0.register(READ_LEN + 4096, ALL).unwrap();
    let mut mb = pds.1.register(READ_LEN + 4096, ALL).unwrap();
    for (i, b) in mb.as_mut_slice()[..READ_LEN].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let mut p = pair(l, &pds, &cqs, ALL, (7, 7));
    // SAFETY: the buffers stay registered and untouched until the completion.
    unsafe {
        let mut s = p.qa.send_batch();
        s.rdma_write(
            0,
            SIG,
            (mb.addr() + READ_LEN as u64, mb.rkey()),
            &[ma.sge(0, 8).unwrap()],
        )
        .unwrap();
        s.finish();
    }
    assert_eq!(wait_a(l, &p, 1)[0].status, WcStatus::Success);
    f(&mut p, &ma, &mb);
}

/// The RoCE frames link `from` sent from `l.seg.sent()[start]` on: opcode, PSN, and the AETH
/// syndrome of an acknowledge (0 for other opcodes).
fn roce_sent(l: &Lab, start: usize, from: usize) -> Vec<(u8, u32, u8)> {
    let aeth = bareverbs::device::rxe::wire::packet::ROCE_OFFSET + 12;
    l.seg.sent()[start..]
        .iter()
        .filter(|(by, f)| {
            *by == from && f.len() > 60 && f[12..14] == [8, 0] && f[36..38] == [0x12, 0xB7]
        })
        .map(|(_, f)| {
            let (op, psn) = bth_of(f);
            (op, psn, if op == ACKNOWLEDGE { f[aeth] } else { 0 })
        })
        .collect()
}

/// The PSNs of the READ requests A sent from `start` on.
fn read_requests(l: &Lab, start: usize) -> Vec<u32> {
    let a = roce_sent(l, start, 0).into_iter();
    a.filter(|f| f.0 == READ_REQUEST).map(|f| f.1).collect()
}

/// Checks that B sent no acknowledge (ACK or NAK) before the last response of the READ that
/// started at `read_psn`, and then the acknowledge `(PSN, syndrome)` `after`.
fn acknowledged_after_the_read(l: &Lab, start: usize, read_psn: u32, after: (u32, u8)) {
    let last = (read_psn + (READ_LEN as u32).div_ceil(1024) - 1) & 0xFF_FFFF;
    let b = roce_sent(l, start, 1);
    let end = b
        .iter()
        .position(|&(op, psn, _)| op == READ_RESPONSE_LAST && psn == last)
        .unwrap_or_else(|| panic!("the READ's last response (PSN {last}) in {b:?}"));
    assert!(
        b[..end].iter().all(|&(op, _, _)| op != ACKNOWLEDGE),
        "an acknowledge of a later request went out before the READ's responses: {b:?}"
    );
    assert!(
        b[end..].contains(&(ACKNOWLEDGE, after.0, after.1)),
        "the acknowledge {after:?} after them: {b:?}"
    );
}

/// The PSN that follows the READ-ordering tests' READ, which started at `read_psn` (its 16
/// responses take 16 PSNs).
fn after_the_read(read_psn: u32) -> u32 {
    (read_psn + (READ_LEN as u32).div_ceil(1024)) & 0xFF_FFFF
}

/// Posts on B the receive (wr_id 9) that A's SEND lands in.
fn post_b_recv(p: &mut Pair<'_>, mb: &MemoryRegion<'_, R>) {
    // SAFETY: the buffer stays registered and untouched until the completion.
    unsafe {
        let mut r = p.qb.recv_batch();
        r.recv(9, &[mb.sge(READ_LEN as u32, 4096).unwrap()])
            .unwrap();
        r.finish();
    }
}

/// Posts on A the READ (wr_id 1) of B's first [`READ_LEN`] bytes into A's.
fn post_a_read(p: &mut Pair<'_>, (ma, mb): (&MemoryRegion<'_, R>, &MemoryRegion<'_, R>)) {
    // SAFETY: both buffers stay registered and untouched until the completion.
    unsafe {
        let mut s = p.qa.send_batch();
        s.rdma_read(
            1,
            SIG,
            (mb.addr(), mb.rkey()),
            &[ma.sge(0, READ_LEN as u32).unwrap()],
        )
        .unwrap();
        s.finish();
    }
}

/// Posts on A the SEND (wr_id 2) of 64 bytes from past the READ's.
fn post_a_send(p: &mut Pair<'_>, ma: &MemoryRegion<'_, R>) {
    // SAFETY: the buffer stays registered and untouched until the completion.
    unsafe {
        let mut s = p.qa.send_batch();
        s.send(2, SIG, &[ma.sge(READ_LEN as u32, 64).unwrap()])
            .unwrap();
        s.finish();
    }
}

/// Checks A's two completions (the READ, wr_id 1, then the SEND, wr_id 2) and the bytes read.
fn read_and_send_done(got: &[WorkCompletion], ma: &MemoryRegion<'_, R>, mb: &MemoryRegion<'_, R>) {
    let st: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(st, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(
        ma.as_slice()[..READ_LEN],
        mb.as_slice()[..READ_LEN],
        "the bytes read"
    );
}

/// With B's NIC taking two frames a round (its transmit ring full otherwise): A reads
/// [`READ_LEN`] bytes of B's region, B answers in part, then A sends 64 bytes while the rest of
/// the READ waits for room. Runs up to 400 rounds until A has both completions, calling
/// `each_round` with the pair and those so far before every round; checks them and the bytes read. Returns
/// where in `l.seg.sent()` the exchange started.
fn throttled_read_then_send<'a>(
    l: &Lab,
    p: &mut Pair<'a>,
    (ma, mb): (&MemoryRegion<'a, R>, &MemoryRegion<'a, R>),
    mut each_round: impl FnMut(&mut Pair<'a>, &[WorkCompletion]),
) -> usize {
    let start = l.seg.sent().len();
    let round = || {
        l.seg.set_tx_credit(1, Some(2));
        l.run(1);
    };
    post_a_read(p, (ma, mb));
    round();
    post_a_send(p, ma);
    let mut got = Vec::new();
    for _ in 0..400 {
        got.extend(drain(p.ca));
        if got.len() >= 2 {
            break;
        }
        each_round(p, &got);
        round();
    }
    l.seg.set_tx_credit(1, None);
    read_and_send_done(&got, ma, mb);
    start
}

#[test]
fn an_acknowledgement_waits_behind_the_read_responses_the_nic_had_no_room_for() {
    let l = lab(Faults::default());
    read_setup(&l, |p, ma, mb| {
        post_b_recv(p, mb);
        let start = throttled_read_then_send(&l, p, (ma, mb), |_, _| {});
        let mut rb = Vec::new();
        rb.extend(drain(p.cb));
        assert_eq!(rb.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [9]);

        let reads = read_requests(&l, start);
        assert_eq!(reads.len(), 1, "A asked once (no retry): {reads:?}");
        // The READ takes PSNs first..=last; the SEND's PSN follows: ACKed after them.
        let send = after_the_read(reads[0]);
        acknowledged_after_the_read(&l, start, reads[0], (send, SYN_ACK));
    });
    teardown(l);
}

#[test]
fn a_nak_past_an_unanswered_read_asks_for_the_read_again_from_its_first_psn() {
    use bareverbs::device::rxe::wire::packet::{Frame, Route, build, parse};
    let l = lab(Faults::default());
    read_setup(&l, |p, ma, mb| {
        // B's ACK of the set-up's WRITE: the template of the NAK forged below.
        let (_, template) = l
            .seg
            .sent()
            .into_iter()
            .rev()
            .find(|(from, _)| *from == 1)
            .unwrap();
        let start = l.seg.sent().len();
        // B's NIC sends nothing for now: the READ goes unanswered.
        l.seg.set_tx_credit(1, Some(0));
        post_b_recv(p, mb);
        post_a_read(p, (ma, mb));
        post_a_send(p, ma);
        l.run(1);
        let read_psn = read_requests(&l, start)[0];
        let send_psn = after_the_read(read_psn);
        let first = roce_sent(&l, start, 0);
        assert!(
            first.contains(&(4, send_psn, 0)),
            "A sent the SEND after the READ: {first:?}"
        );
        // An RNR NAK for the SEND reaches A before any of the READ's responses (as from a
        // responder that lost them or let the NAK overtake them).
        let Ok(Frame::Roce(t)) = parse(&template) else {
            panic!("B's ACK parses");
        };
        let route = Route {
            src_mac: t.src_mac,
            dst_mac: template[..6].try_into().unwrap(),
            src_ip: t.ip.src,
            dst_ip: t.ip.dst,
            tos: 0,
            ttl: 64,
            src_port: t.udp.src_port,
        };
        let mut h = t.headers;
        h.bth.psn = send_psn;
        h.aeth.as_mut().unwrap().syndrome = SYN_RNR_NAK;
        let mut buf = vec![0u8; 1600];
        let n = build(&mut buf, &route, 7, &h, &[]).unwrap();
        l.seg.inject(1, &buf[..n]);
        l.run(1);
        l.seg.set_tx_credit(1, None);
        read_and_send_done(&wait_a(&l, p, 2), ma, mb);
        // Every READ request A sent names the READ's own first PSN: nothing of it came back,
        // so it is asked again whole (not from the NAK's PSN, which is the SEND's).
        let reads = read_requests(&l, start);
        assert!(
            reads.len() >= 2 && reads.iter().all(|&psn| psn == read_psn),
            "A asked for the READ again from PSN {read_psn}: {reads:?}"
        );
    });
    teardown(l);
}

#[test]
fn a_receiver_not_ready_nak_waits_behind_the_read_responses_the_nic_had_no_room_for() {
    let l = lab(Faults::default());
    read_setup(&l, |p, ma, mb| {
        // No receive posted when the SEND comes in: B answers it with an RNR NAK. The receive
        // is posted once the READ has completed.
        let mut posted = false;
        let start = throttled_read_then_send(&l, p, (ma, mb), |p, got| {
            if !posted && got.iter().any(|w| w.wr_id == 1) {
                post_b_recv(p, mb);
                posted = true;
            }
        });

        let reads = read_requests(&l, start);
        assert_eq!(reads.len(), 1, "A asked once (no retry): {reads:?}");
        // The SEND refused with an RNR NAK, after the READ's responses.
        let send = after_the_read(reads[0]);
        acknowledged_after_the_read(&l, start, reads[0], (send, SYN_RNR_NAK));
    });
    teardown(l);
}
