//! Messages far beyond the requester's window of unacknowledged packets between two software
//! RoCE devices on the in-memory segment: RDMA WRITEs, SENDs and READs of 132 packets, 1 MiB
//! and 8 MiB at path MTU 1024 and 4096; with a responder that acknowledges only the packets
//! that ask for it (as every responder must, and Linux's rxe does), with the acknowledgements
//! it does send thinned out (coalesced), and with loss, duplication and reordering on the
//! segment. Every posted request completes exactly once, and the bytes arrive intact.

mod common;
mod pair;

use bareverbs::Context;
use bareverbs::device::rxe::wire::bth::{Bth, DEFAULT_PKEY, Headers, Reth, opcode};
use bareverbs::device::rxe::wire::packet::{Route, build};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_hal::{Clock, Link, LinkError};
use bareverbs_model::link::{Faults, MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};
use pair::{IP_A, IP_B};

/// A link that may drop some of the plain acknowledgements its device sends (never a NAK, a
/// READ response or an atomic acknowledge): a responder that coalesces its ACKs, answering
/// only one in `keep` of those it would send.
struct Thin {
    inner: MemLink,
    /// Keep one ACK in this many (1: all).
    keep: u32,
    seen: u32,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// A slow receiver, when set: frames wait in a buffer of bounded size and come out at a
    /// bounded rate.
    slow: Option<Slow>,
    /// What `paces_itself` says (a NIC that spaces out what it sends, as virtio-net's device).
    self_paced: bool,
}

/// A receiver slower than the segment, as a guest under emulation is: what arrives goes into
/// a buffer of `room` frames (its ring and the socket before it; the rest of a burst is
/// dropped), from which the device takes `per_ms` frames a millisecond of the test clock.
struct Slow {
    room: usize,
    per_ms: u64,
    clk: TestClock,
    /// Frames taken so far, and the time counting started.
    taken: u64,
    since: u64,
    buffer: std::collections::VecDeque<Vec<u8>>,
    /// Frames the full buffer dropped.
    overflow: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// READ responses the device took from the buffer, by PSN.
    responses: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
}

/// The BTH opcode of an IPv4 RoCEv2 frame (Ethernet 14 + IPv4 20 + UDP 8), and its AETH
/// syndrome when it is an ACK.
fn ack_syndrome(frame: &[u8]) -> Option<u8> {
    const BTH: usize = 14 + 20 + 8;
    let op = *frame.get(BTH)?;
    (op == 0x11).then(|| frame.get(BTH + 12).copied()).flatten()
}

impl Link for Thin {
    fn mac(&self) -> [u8; 6] {
        self.inner.mac()
    }
    fn max_frame(&self) -> usize {
        self.inner.max_frame()
    }
    fn transmit(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        if self.thins(frame) {
            return Ok(());
        }
        self.inner.transmit(frame)
    }
    fn transmit_with<F>(&mut self, buf: &mut [u8], build: F) -> Result<Option<usize>, LinkError>
    where
        F: FnOnce(&mut [u8]) -> Option<usize>,
    {
        let mut frame = vec![0; self.inner.max_frame()];
        let Some(n) = build(&mut frame) else {
            return Ok(None);
        };
        if n == 0 || n > frame.len() {
            return Err(LinkError::Size);
        }
        if self.thins(&frame[..n]) {
            return Ok(Some(n));
        }
        let _ = buf;
        self.inner.transmit(&frame[..n]).map(|()| Some(n))
    }
    fn tx_ready(&mut self) -> bool {
        self.inner.tx_ready()
    }
    fn paces_itself(&self) -> bool {
        self.self_paced
    }
    fn receive(&mut self, buf: &mut [u8]) -> Option<usize> {
        let Some(s) = self.slow.as_mut() else {
            return self.inner.receive(buf);
        };
        // Everything the segment delivered so far arrives; what does not fit is lost.
        let mut f = vec![0; self.inner.max_frame()];
        while let Some(n) = self.inner.receive(&mut f) {
            if s.buffer.len() < s.room {
                s.buffer.push_back(f[..n].to_vec());
            } else {
                s.overflow
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let now = s.clk.now_us();
        if s.buffer.is_empty() {
            // Idle: the rate counts from the next arrival.
            (s.since, s.taken) = (now, 0);
            return None;
        }
        if s.taken > (now - s.since) * s.per_ms / 1000 {
            return None;
        }
        let frame = s.buffer.pop_front()?;
        s.taken += 1;
        const BTH: usize = 14 + 20 + 8;
        if is_roce(&frame) && (0x0D..=0x0F).contains(&frame[BTH]) {
            let psn = u32::from_be_bytes([0, frame[BTH + 9], frame[BTH + 10], frame[BTH + 11]]);
            s.responses.lock().unwrap().push(psn);
        }
        buf.get_mut(..frame.len())?.copy_from_slice(&frame);
        Some(frame.len())
    }
}

impl Thin {
    /// Whether `frame` is a plain ACK this link drops.
    fn thins(&mut self, frame: &[u8]) -> bool {
        // A plain ACK: syndrome 0b000xxxxx (NAKs and RNR NAKs pass).
        if ack_syndrome(frame).is_none_or(|s| s >> 5 != 0) {
            return false;
        }
        self.seen += 1;
        if self.seen.is_multiple_of(self.keep) {
            return false;
        }
        self.dropped
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        true
    }
}

/// An IPv4 UDP frame to the RoCEv2 port.
fn is_roce(f: &[u8]) -> bool {
    f.len() > 42 && f[12..14] == [8, 0] && f[23] == 17 && f[36..38] == [0x12, 0xb7]
}

type Dev = Rxe<Model, Thin, TestClock>;

/// Two devices on one segment able to carry MTU 4096 (A at `IP_A`, B at `IP_B`); B's link
/// keeps one ACK in `keep`.
struct Bed {
    a: Context<Dev>,
    b: Context<Dev>,
    clk: TestClock,
    seg: Segment,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Frames the slow receiver's full buffer dropped.
    overflow: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// READ responses A's slow receiver took, by PSN.
    responses: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
}

/// A's receiver slow ([`Slow`]): its room in frames and the frames it takes a millisecond.
type SlowRx = Option<(usize, u64)>;

fn bed(model: &Model, keep_a: u32, keep_b: u32, slow_a: SlowRx) -> Bed {
    bed_with(model, keep_a, keep_b, slow_a, false)
}

/// [`bed`], B's link saying it paces itself when `b_self_paced`.
fn bed_with(model: &Model, keep_a: u32, keep_b: u32, slow_a: SlowRx, b_self_paced: bool) -> Bed {
    let (seg, clk) = (Segment::new(), TestClock::default());
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let overflow = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let responses = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let frame = bareverbs::device::rxe::FRAME;
    let thin = |mac: [u8; 6], keep: u32| Thin {
        inner: seg.attach(mac, frame),
        keep,
        seen: 0,
        dropped: dropped.clone(),
        slow: None,
        self_paced: false,
    };
    let mut la = thin([0x52, 0x54, 0, 0, 0, 2], keep_a);
    la.slow = slow_a.map(|(room, per_ms)| Slow {
        room,
        per_ms,
        clk: clk.clone(),
        taken: 0,
        since: 0,
        buffer: Default::default(),
        overflow: overflow.clone(),
        responses: responses.clone(),
    });
    let mut lb = thin([0x52, 0x54, 0, 0, 0, 3], keep_b);
    lb.self_paced = b_self_paced;
    let a = Context::new(Rxe::new(model.clone(), la, clk.clone(), Config { ip: IP_A }).unwrap());
    let b = Context::new(Rxe::new(model.clone(), lb, clk.clone(), Config { ip: IP_B }).unwrap());
    Bed {
        a,
        b,
        clk,
        seg,
        dropped,
        overflow,
        responses,
    }
}

fn up<'a>(
    q: QueuePair<'a, Dev, Rc, Reset>,
    peer: u32,
    ip: [u8; 4],
    mtu: Mtu,
) -> QueuePair<'a, Dev, Rc, Rts> {
    let init = ConnectedInit {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..Default::default()
    };
    let q = q.init(&init).map_err(|(_, e)| e).unwrap();
    let mut rtr = ConnectedRtr::new(peer, 0x00ff_ff00, AddressVector::new(Gid::from_ipv4(ip), 1));
    rtr.path_mtu = mtu;
    rtr.max_dest_rd_atomic = 4;
    rtr.min_rnr_timer = 1;
    let q = q.rtr(&rtr).map_err(|(_, e)| e).unwrap();
    // The send PSN near the top of the 24-bit space: long messages wrap it.
    let mut rts = ConnectedRts::new(0x00ff_ff00);
    (rts.max_rd_atomic, rts.timeout, rts.retry_cnt, rts.rnr_retry) = (4, 14, 7, 7);
    q.rts(&rts).map_err(|(_, e)| e).unwrap()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Write,
    Send,
    Read,
}

/// What a run saw.
#[derive(Debug)]
struct Seen {
    /// Test-clock microseconds until every completion was in (printed).
    #[allow(dead_code)]
    us: u64,
    /// RoCE frames on the segment (ARP apart).
    frames: usize,
    /// ACKs the thinning links dropped.
    thinned: u64,
    /// Segment damage (dropped, duplicated, reordered).
    damage: (u64, u64, u64),
    /// Frames a slow receiver's full buffer dropped.
    overflow: u64,
}

/// Runs `count` `op`s of `len` bytes from A to B (a READ: A reads B's memory) at `mtu`,
/// with B's ACKs thinned to one in `keep` and `faults` on the segment; checks that every
/// request completes exactly once, successfully, and the bytes arrived.
fn run(op: Op, len: u32, mtu: Mtu, count: u32, keep: u32, faults: Faults) -> Seen {
    run_from(false, op, (len, mtu, count), keep, faults, None)
}

/// [`run`], with B as the requester when `b_asks` (A answers, its ACKs thinned).
fn run_from(
    b_asks: bool,
    op: Op,
    (len, mtu, count): (u32, Mtu, u32),
    keep: u32,
    faults: Faults,
    slow_a: SlowRx,
) -> Seen {
    let model = Model::new(ModelConfig::default());
    let t = if b_asks {
        bed(&model, keep, 1, slow_a)
    } else {
        bed(&model, 1, keep, slow_a)
    };
    let (a, b) = if b_asks { (&t.b, &t.a) } else { (&t.a, &t.b) };
    let (ip_a, ip_b) = if b_asks { (IP_B, IP_A) } else { (IP_A, IP_B) };
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa = pa.qp_builder(&ca, &ca).build::<Rc>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let mut qa = up(qa, nb, ip_b, mtu);
    let mut qb = up(qb, na, ip_a, mtu);
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut ma = pa.register(len as usize, rw).unwrap();
    let mut mb = pb.register(len as usize, rw).unwrap();
    let pattern = |k: usize, salt: u8| (k as u8).wrapping_mul(31) ^ (k >> 9) as u8 ^ salt;
    let (src, dst) = match op {
        Op::Read => (&mut mb, &mut ma),
        _ => (&mut ma, &mut mb),
    };
    for (k, x) in src.as_mut_slice().iter_mut().enumerate() {
        *x = pattern(k, 0x5a);
    }
    dst.as_mut_slice().fill(0);
    t.seg.set_faults(faults);
    let (mut a_done, mut b_done) = (Vec::new(), Vec::new());
    let start = t.seg.sent_count();
    let mut us = 0u64;
    for i in 0..count {
        let id = 1 + u64::from(i);
        // SAFETY: both regions outlive the QPs' use of them: every request completes (checked
        // below) before they are read or dropped.
        unsafe {
            if op == Op::Send {
                qb.post_recv_raw(100 + id, &[mb.sge(0, len).unwrap()])
                    .unwrap();
            }
            let sge = ma.sge(0, len).unwrap();
            let mut sb = qa.send_batch();
            match op {
                Op::Write => sb
                    .rdma_write(id, SendFlags::SIGNALED, (mb.addr(), mb.rkey()), &[sge])
                    .unwrap(),
                Op::Send => sb.send(id, SendFlags::SIGNALED, &[sge]).unwrap(),
                Op::Read => sb
                    .rdma_read(id, SendFlags::SIGNALED, (mb.addr(), mb.rkey()), &[sge])
                    .unwrap(),
            }
            sb.finish();
        }
        let want_b = usize::from(op == Op::Send);
        let mut wc = [WorkCompletion::default(); 8];
        // Bounded: 600 s of the test clock at 100 µs a step.
        for _ in 0..6_000_000 {
            let n = ca.poll(&mut wc).unwrap();
            a_done.extend(wc[..n].iter().map(|w| (w.wr_id, w.status, w.byte_len)));
            let n = cb.poll(&mut wc).unwrap();
            b_done.extend(wc[..n].iter().map(|w| (w.wr_id, w.status, w.byte_len)));
            if a_done.len() > i as usize && b_done.len() >= want_b * (i as usize + 1) {
                break;
            }
            t.clk.advance(100);
            us += 100;
            a.process_events();
            b.process_events();
        }
        assert!(
            a_done.len() > i as usize,
            "{op:?} {len} B at {mtu:?} (ACKs kept 1 in {keep}, {faults:?}): request {id} \
             not completed in {} s of the test clock; A's QP {:?}, B's {:?}; {} frames",
            us / 1_000_000,
            qa.query().map(|q| q.state),
            qb.query().map(|q| q.state),
            t.seg.sent_count() - start,
        );
    }
    // Settle: nothing more may complete (exactly once).
    for _ in 0..2_000 {
        t.clk.advance(100);
        a.process_events();
        b.process_events();
    }
    let mut wc = [WorkCompletion::default(); 8];
    let n = ca.poll(&mut wc).unwrap();
    a_done.extend(wc[..n].iter().map(|w| (w.wr_id, w.status, w.byte_len)));
    let n = cb.poll(&mut wc).unwrap();
    b_done.extend(wc[..n].iter().map(|w| (w.wr_id, w.status, w.byte_len)));
    let want_a: Vec<_> = (1..=u64::from(count))
        .map(|id| {
            let n = if op == Op::Read { len } else { 0 };
            (id, WcStatus::Success, n)
        })
        .collect();
    let got_a: Vec<_> = a_done
        .iter()
        .map(|&(id, s, n)| (id, s, if op == Op::Read { n } else { 0 }))
        .collect();
    assert_eq!(got_a, want_a, "{op:?} {len}: A's completions");
    if op == Op::Send {
        let want_b: Vec<_> = (1..=u64::from(count))
            .map(|id| (100 + id, WcStatus::Success, len))
            .collect();
        assert_eq!(b_done, want_b, "{op:?} {len}: B's completions");
    } else {
        assert!(b_done.is_empty(), "{op:?}: B completed {b_done:?}");
    }
    let (src, dst) = match op {
        Op::Read => (&mb, &ma),
        _ => (&ma, &mb),
    };
    let bad = src
        .as_slice()
        .iter()
        .zip(dst.as_slice())
        .position(|(x, y)| x != y);
    assert_eq!(
        bad, None,
        "{op:?} {len}: the bytes differ from offset {bad:?}"
    );
    assert_eq!(qa.query().unwrap().state, QpState::Rts);
    assert_eq!(qb.query().unwrap().state, QpState::Rts);
    let seen = Seen {
        us,
        frames: t
            .seg
            .sent_since(start)
            .iter()
            .filter(|(_, f)| is_roce(f))
            .count(),
        thinned: t.dropped.load(std::sync::atomic::Ordering::Relaxed),
        damage: t.seg.damage(),
        overflow: t.overflow.load(std::sync::atomic::Ordering::Relaxed),
    };
    eprintln!(
        "{op:?} {len} B x{count} at {mtu:?} (B asks: {b_asks}), ACKs 1 in {keep}, {faults:?}: \
         {seen:?}"
    );
    drop((qa, qb, ma, mb));
    seen
}

const KIB: u32 = 1024;
const MIB: u32 = 1024 * 1024;
const CLEAN: Faults = Faults {
    drop: 0,
    duplicate: 0,
    reorder: 0,
    seed: 0,
};

#[test]
fn a_write_of_132_packets_completes() {
    run(Op::Write, 132 * KIB, Mtu::Mtu1024, 2, 1, CLEAN);
}

#[test]
fn a_send_of_132_packets_completes() {
    run(Op::Send, 132 * KIB, Mtu::Mtu1024, 2, 1, CLEAN);
}

/// Under memcheck (`tests/memcheck.sh` sets `BAREVERBS_MEMCHECK`), 1 MiB messages only:
/// valgrind runs a test about forty times slower, and the 8 MiB cases took minutes there.
fn under_memcheck() -> bool {
    std::env::var_os("BAREVERBS_MEMCHECK").is_some()
}

/// `op` at 1 MiB and 8 MiB (1 MiB alone under memcheck), MTU 1024 and 4096, ACKs kept one
/// in `keep`, on `faults`.
fn sizes(op: Op, keep: u32, faults: Faults) -> Vec<Seen> {
    let mut out = Vec::new();
    let lens: &[(u32, u32)] = if under_memcheck() {
        &[(MIB, 3)]
    } else {
        &[(MIB, 3), (8 * MIB, 1)]
    };
    for mtu in [Mtu::Mtu1024, Mtu::Mtu4096] {
        for &(len, count) in lens {
            out.push(run(op, len, mtu, count, keep, faults));
        }
    }
    out
}

#[test]
fn writes_of_1_and_8_mib_complete() {
    let seen = sizes(Op::Write, 1, CLEAN);
    // Lossless: no packet twice (no timeout fired), one ACK per 64 packets.
    // 3 x 1 MiB at MTU 1024: 3072 packets and 48 ACKs.
    assert_eq!(seen[0].frames, 3 * 1024 + 3 * 16, "{:?}", seen[0]);
}

#[test]
fn sends_of_1_and_8_mib_complete() {
    let seen = sizes(Op::Send, 1, CLEAN);
    assert_eq!(seen[0].frames, 3 * 1024 + 3 * 16, "{:?}", seen[0]);
}

#[test]
fn reads_of_1_and_8_mib_complete_both_ways() {
    sizes(Op::Read, 1, CLEAN);
    let len = if under_memcheck() { MIB } else { 8 * MIB };
    for mtu in [Mtu::Mtu1024, Mtu::Mtu4096] {
        run_from(true, Op::Read, (len, mtu, 1), 1, CLEAN, None);
        run_from(true, Op::Write, (len, mtu, 1), 1, CLEAN, None);
    }
}

/// A responder whose ACKs mostly do not arrive (one in three kept, the rest as if
/// coalesced away): the requester goes on with the ones that come, and its timer covers the
/// window's end when the one it waits for is dropped.
#[test]
fn large_messages_complete_when_most_acks_are_coalesced_away() {
    for op in [Op::Write, Op::Send, Op::Read] {
        let seen = sizes(op, 3, CLEAN);
        if op != Op::Read {
            assert!(seen.iter().all(|s| s.thinned > 0), "{seen:?}");
        }
    }
}

#[test]
fn large_messages_complete_on_a_lossy_segment() {
    for (i, op) in [Op::Write, Op::Send, Op::Read].into_iter().enumerate() {
        let faults = Faults {
            drop: 3,
            duplicate: 5,
            reorder: 10,
            seed: 0x1234_5678 + i as u64,
        };
        let seen = sizes(op, 2, faults);
        assert!(
            seen.iter()
                .all(|s| s.damage.0 > 0 && s.damage.1 > 0 && s.damage.2 > 0),
            "{seen:?}"
        );
    }
}

/// A requester whose receiver is slower than the segment, as a guest under emulation is (a
/// buffer of 150 frames, 100 frames a millisecond taken from it), reading from a responder that
/// answers each request whole at once (as Linux's rxe does): the requester asks for a long
/// READ in parts of 64 packets, at most a window of responses in flight, so its buffer never
/// overflows and nothing is sent twice. (Asked for whole, 3 READs of 1 MiB put 13,823 frames
/// on the segment and 9,124 overflowed.)
#[test]
fn reads_in_parts_keep_a_slow_requester_from_overflowing() {
    let lens: &[(u32, u32)] = if under_memcheck() {
        &[(MIB, 2)]
    } else {
        &[(MIB, 3), (8 * MIB, 1)]
    };
    for &(len, count) in lens {
        let seen = run_from(
            false,
            Op::Read,
            (len, Mtu::Mtu1024, count),
            1,
            CLEAN,
            Some((150, 100)),
        );
        let packets = (len / 1024 * count) as usize;
        let requests = packets / 64;
        assert_eq!(seen.overflow, 0, "{seen:?}");
        // Every response once, and one request per part.
        assert_eq!(seen.frames, packets + requests, "{seen:?}");
    }
}

/// A requester that asks for a whole long READ at once, as Linux's rxe does (it does not ask
/// in parts), from a responder on this device, its receiver slower than the segment (a buffer
/// of 90 frames, QEMU's socket on the lab's segment, and 40 frames a millisecond taken from
/// it): the responder paces its answers (64 KiB back to back at most, 32 KiB a millisecond),
/// so nothing overflows and every response goes once. (Unpaced, the 1 MiB READ put its 1,024
/// responses on the segment at once, 32 a progress, and 817 of them overflowed.)
#[test]
fn a_whole_read_asked_at_once_is_paced_for_a_slow_requester() {
    let lens: &[u32] = if under_memcheck() {
        &[MIB]
    } else {
        &[MIB, 8 * MIB]
    };
    for &len in lens {
        let (paced, overflow, taken) = whole_read(len, (90, 40), false);
        let packets = (len / 1024) as usize;
        assert_eq!(overflow, 0, "{len} B: {taken} of {packets} taken");
        assert_eq!(taken, packets, "{len} B");
        assert!(paced > 0, "{len} B: the pace never held an answer back");
    }
}

/// Over a NIC that says it spaces out what it sends itself (`Link::paces_itself`, as
/// virtio-net's device does), the device adds no pace of its own: the same whole READ leaves
/// unpaced (and this segment, which spaces out nothing, overflows the slow receiver).
#[test]
fn a_nic_that_paces_itself_gets_no_pace_on_top() {
    let (paced, overflow, _) = whole_read(MIB, (90, 40), true);
    assert_eq!(paced, 0);
    assert!(overflow > 0, "{overflow}");
}

/// B answers one READ of `len` bytes at MTU 1024 that A's station asks for whole (a request
/// put on the segment from A's addresses, to B's QP), A's receiver slow (`slow`: room and
/// frames a millisecond), B's link pacing itself when `b_self_paced`. Returns the times B's
/// pace held the READ back, the frames A's receiver dropped, and the responses it took (each
/// PSN once, in order, when none overflowed: checked).
fn whole_read(len: u32, slow: (usize, u64), b_self_paced: bool) -> (u64, u64, usize) {
    let model = Model::new(ModelConfig::default());
    let t = bed_with(&model, 1, 1, Some(slow), b_self_paced);
    let (pa, pb) = (t.a.alloc_pd().unwrap(), t.b.alloc_pd().unwrap());
    let (ca, cb) = (t.a.create_cq(64).unwrap(), t.b.create_cq(64).unwrap());
    let qa = pa.qp_builder(&ca, &ca).build::<Rc>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let mut qa = up(qa, nb, IP_B, Mtu::Mtu1024);
    let qb = up(qb, na, IP_A, Mtu::Mtu1024);
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let ma = pa.register(1024, rw).unwrap();
    let mb = pb.register(len as usize, rw).unwrap();
    // A READ of one packet through the verbs first: each side learns the other's MAC.
    // SAFETY: both regions outlive the request, which completes below before they go.
    unsafe {
        let mut sb = qa.send_batch();
        sb.rdma_read(
            1,
            SendFlags::SIGNALED,
            (mb.addr(), mb.rkey()),
            &[ma.sge(0, 1024).unwrap()],
        )
        .unwrap();
        sb.finish();
    }
    let mut wc = [WorkCompletion::default(); 4];
    let mut done = 0;
    for _ in 0..10_000 {
        done += ca.poll(&mut wc).unwrap();
        if done > 0 {
            break;
        }
        t.clk.advance(100);
        t.b.process_events();
    }
    assert_eq!(done, 1, "the first READ");
    assert_eq!(wc[0].status, WcStatus::Success);
    let from_a = t
        .seg
        .sent()
        .iter()
        .find(|(_, f)| is_roce(f) && f[6..12] == [0x52, 0x54, 0, 0, 0, 2])
        .map(|(id, _)| *id)
        .expect("A sent its request");
    // The request as a Linux requester sends it: the whole READ, at the PSN B expects next.
    let psn = 0x00ff_ff01;
    let mut h = Headers::new(Bth {
        opcode: opcode::RC_READ_REQUEST,
        se: false,
        pad: 0,
        pkey: DEFAULT_PKEY,
        dest_qp: nb,
        ack_req: true,
        psn,
    });
    h.reth = Some(Reth {
        va: mb.addr(),
        rkey: mb.rkey(),
        len,
    });
    let route = Route {
        src_mac: [0x52, 0x54, 0, 0, 0, 2],
        dst_mac: [0x52, 0x54, 0, 0, 0, 3],
        src_ip: IP_A,
        dst_ip: IP_B,
        tos: 0,
        ttl: 64,
        src_port: 0xC000,
    };
    let mut frame = [0u8; 128];
    let n = build(&mut frame, &route, 7, &h, &[]).unwrap();
    let before = t.b.provider().transport_counts().reads_paced;
    t.responses.lock().unwrap().clear();
    t.seg.inject(from_a, &frame[..n]);
    let packets = (len / 1024) as usize;
    // Bounded: 10 s of the test clock at 100 µs a step (the pace sends 8 MiB in 256 ms).
    for _ in 0..100_000 {
        t.b.process_events();
        t.a.process_events();
        if t.responses.lock().unwrap().len() >= packets {
            break;
        }
        t.clk.advance(100);
    }
    // A little longer: whatever else was coming arrives.
    for _ in 0..1_000 {
        t.clk.advance(100);
        t.b.process_events();
        t.a.process_events();
    }
    let got = t.responses.lock().unwrap().clone();
    let want: Vec<u32> = (0..packets as u32)
        .map(|k| (psn + k) & 0x00ff_ffff)
        .collect();
    let overflow = t.overflow.load(std::sync::atomic::Ordering::Relaxed);
    if overflow == 0 {
        assert_eq!(got, want, "{len} B: the responses, in order, once each");
    }
    let paced = t.b.provider().transport_counts().reads_paced - before;
    eprintln!(
        "whole READ of {len} B: paced {paced} times, {overflow} frames overflowed, {} responses taken",
        got.len()
    );
    drop((qa, qb, ma, mb));
    (paced, overflow, got.len())
}
