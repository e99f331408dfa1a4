//! The software RoCE device on several cores: posting to a queue pair takes that QP's lock,
//! polling a CQ its own; only the NIC and the tables are shared (the device lock, which a
//! post only tries). Two devices on the model's in-memory segment.
//!
//! - A post and a poll on one QP and its CQ go through while another thread holds the device
//!   lock (stuck inside the NIC's transmit): they do not wait for it.
//! - Two threads, each with its own QP and CQs on both devices, SENDing to each other's
//!   device: both finish, every completion exactly once, every byte where it belongs.

mod common;
mod pair;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use bareverbs::Context;
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::hal::{Link, LinkError};
use bareverbs::verbs::*;
use bareverbs_model::link::{MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};
use pair::{IP_A, IP_B, rxe_rc_up};

/// A NIC whose transmit can be made to stop, inside the call, until the test lets it go:
/// the thread in it holds the device lock all that time.
struct GateLink {
    inner: MemLink,
    /// OPEN; ARMED: the next transmit stops; STUCK: a transmit is stopped.
    gate: Arc<AtomicU8>,
}

const OPEN: u8 = 0;
const ARMED: u8 = 1;
const STUCK: u8 = 2;

impl Link for GateLink {
    fn mac(&self) -> [u8; 6] {
        self.inner.mac()
    }

    fn max_frame(&self) -> usize {
        self.inner.max_frame()
    }

    fn transmit(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        if self
            .gate
            .compare_exchange(ARMED, STUCK, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // Bounded by the test: it opens the gate (after at most its timeout).
            while self.gate.load(Ordering::Acquire) == STUCK {
                std::thread::yield_now();
            }
        }
        self.inner.transmit(frame)
    }

    fn tx_ready(&mut self) -> bool {
        self.inner.tx_ready()
    }

    fn receive(&mut self, buf: &mut [u8]) -> Option<usize> {
        self.inner.receive(buf)
    }
}

type R = Rxe<Model, GateLink, TestClock>;

const DEPTH: u32 = 8;
/// Bytes of each message (its sequence number first).
const MSG: usize = 64;

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: DEPTH,
        max_recv_wr: DEPTH,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Two devices on one segment (A's NIC is its link 0), A's NIC gated (open).
fn devices() -> (Context<R>, Context<R>, Arc<AtomicU8>, Segment) {
    let seg = Segment::new();
    let model = Model::new(ModelConfig::default());
    let clock = TestClock::default();
    let gate = Arc::new(AtomicU8::new(OPEN));
    let dev = |mac, ip, gate: &Arc<AtomicU8>| {
        let link = GateLink {
            inner: seg.attach(mac, 1514),
            gate: gate.clone(),
        };
        Context::new(Rxe::new(model.clone(), link, clock.clone(), Config { ip }).unwrap())
    };
    let a = dev([0x52, 0x54, 0, 0, 0, 2], IP_A, &gate);
    let b = dev(
        [0x52, 0x54, 0, 0, 0, 3],
        IP_B,
        &Arc::new(AtomicU8::new(OPEN)),
    );
    (a, b, gate, seg)
}

/// Polls `cq` once (its device runs first), collecting (wr_id, byte_len), checking success.
fn poll(cq: &CompletionQueue<'_, R>, into: &mut Vec<(u64, u32)>) {
    let mut wc = [WorkCompletion::default(); 4];
    let n = cq.poll(&mut wc).unwrap();
    for w in &wc[..n] {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
        into.push((w.wr_id, w.byte_len));
    }
}

#[test]
fn a_post_and_a_poll_do_not_wait_for_the_device_lock() {
    let (a, b, gate, _) = devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let ca = [a.create_cq(16).unwrap(), a.create_cq(16).unwrap()];
    let cb = b.create_cq(16).unwrap();
    let ma = pa.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mb = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let build_a = |cq| pa.qp_builder(cq, cq).caps(caps()).build::<Rc>().unwrap();
    let (qa0, qa1) = (build_a(&ca[0]), build_a(&ca[1]));
    let qb0 = pb.qp_builder(&cb, &cb).caps(caps()).build::<Rc>().unwrap();
    let qb1 = pb.qp_builder(&cb, &cb).caps(caps()).build::<Rc>().unwrap();
    let (na, nb) = ([qa0.qp_num(), qa1.qp_num()], [qb0.qp_num(), qb1.qp_num()]);
    let (mut qa0, mut qa1) = (rxe_rc_up(qa0, nb[0], IP_B), rxe_rc_up(qa1, nb[1], IP_B));
    let (mut qb0, mut qb1) = (rxe_rc_up(qb0, na[0], IP_A), rxe_rc_up(qb1, na[1], IP_A));
    let sge_b = |k: u32| mb.sge(k * MSG as u32, MSG as u32).unwrap();
    // SAFETY (all posts below): the regions outlive the QPs and their completions.
    unsafe {
        qb0.post_recv_raw(10, &[sge_b(0)]).unwrap();
        qb1.post_recv_raw(11, &[sge_b(1)]).unwrap();
    }
    let sge_a = |k: u32| ma.sge(k * MSG as u32, MSG as u32).unwrap();
    // Addresses resolved first (ARP both ways), so that QP 0's post sends its frame at once.
    for _ in 0..4 {
        a.process_events();
        b.process_events();
    }
    let (tx, rx) = mpsc::channel();
    gate.store(ARMED, Ordering::Release);
    std::thread::scope(|s| {
        // QP 0's post sends its frame itself: the NIC stops it inside transmit, with the
        // device lock held, until the gate opens.
        s.spawn(|| {
            let mut bt = qa0.send_batch();
            unsafe { bt.send(0, SendFlags::SIGNALED, &[sge_a(0)]) }.unwrap();
            bt.finish();
        });
        // Bounded: the transmit above stops within the scope's first steps.
        let start = std::time::Instant::now();
        while gate.load(Ordering::Acquire) != STUCK {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "QP 0 sent nothing"
            );
            std::thread::yield_now();
        }
        // Meanwhile, QP 1 posts a send and a receive and polls its CQ.
        let (qa1, ca1, tx) = (&mut qa1, &ca[1], tx);
        s.spawn(move || {
            let mut bt = qa1.send_batch();
            unsafe { bt.send(1, SendFlags::SIGNALED, &[sge_a(1)]) }.unwrap();
            bt.finish();
            unsafe { qa1.post_recv_raw(2, &[sge_a(2)]) }.unwrap();
            let mut got = Vec::new();
            poll(ca1, &mut got);
            tx.send(got.len()).unwrap();
        });
        let done = rx.recv_timeout(Duration::from_secs(10));
        gate.store(OPEN, Ordering::Release);
        assert!(
            done.is_ok(),
            "QP 1's post and poll waited for the device lock QP 0's transmit held"
        );
    });
    // The gate open, everything completes, once: both sends on A, both receives on B.
    let (mut sa, mut sb) = (vec![Vec::new(), Vec::new()], Vec::new());
    // Bounded: a few rounds move two messages and their ACKs.
    for _ in 0..100 {
        if sa[0].len() + sa[1].len() == 2 && sb.len() == 2 {
            break;
        }
        poll(&cb, &mut sb);
        poll(&ca[0], &mut sa[0]);
        poll(&ca[1], &mut sa[1]);
    }
    assert_eq!(sa, [vec![(0, MSG as u32)], vec![(1, MSG as u32)]]);
    sb.sort_unstable();
    assert_eq!(sb, [(10, MSG as u32), (11, MSG as u32)]);
    let _ = (&mut qb0, &mut qb1);
}

/// Completions seen, as (wr_id, byte_len), in the order polled.
type Completions = Vec<(u64, u32)>;

/// Messages each thread sends.
const MESSAGES: u64 = 2000;

#[test]
fn two_threads_on_two_qps_and_cqs_both_progress_and_complete_everything_once() {
    let (a, b, _, _) = devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let ca = [a.create_cq(32).unwrap(), a.create_cq(32).unwrap()];
    let cb = [b.create_cq(32).unwrap(), b.create_cq(32).unwrap()];
    // One region per thread and side: DEPTH slots of MSG bytes.
    let bytes = DEPTH as usize * MSG;
    let ma = [
        pa.register(bytes, AccessFlags::LOCAL_WRITE).unwrap(),
        pa.register(bytes, AccessFlags::LOCAL_WRITE).unwrap(),
    ];
    let mb = [
        pb.register(bytes, AccessFlags::LOCAL_WRITE).unwrap(),
        pb.register(bytes, AccessFlags::LOCAL_WRITE).unwrap(),
    ];
    let qa = [0, 1].map(|i| {
        pa.qp_builder(&ca[i], &ca[i])
            .caps(caps())
            .build::<Rc>()
            .unwrap()
    });
    let qb = [0, 1].map(|i| {
        pb.qp_builder(&cb[i], &cb[i])
            .caps(caps())
            .build::<Rc>()
            .unwrap()
    });
    let (na, nb) = (
        qa.each_ref().map(|q| q.qp_num()),
        qb.each_ref().map(|q| q.qp_num()),
    );
    let [qa0, qa1] = qa;
    let [qb0, qb1] = qb;
    let pairs = [
        (rxe_rc_up(qa0, nb[0], IP_B), rxe_rc_up(qb0, na[0], IP_A)),
        (rxe_rc_up(qa1, nb[1], IP_B), rxe_rc_up(qb1, na[1], IP_A)),
    ];
    let [ma0, ma1] = ma;
    let [mb0, mb1] = mb;
    let regions = [(ma0, mb0), (ma1, mb1)];
    let results: Vec<(Completions, Completions)> = std::thread::scope(|s| {
        let handles: Vec<_> = pairs
            .into_iter()
            .zip(regions)
            .enumerate()
            .map(|(me, ((mut qa, mut qb), (mut ma, mb)))| {
                let (ca, cb) = (&ca[me], &cb[me]);
                s.spawn(move || {
                    let (mut sent, mut recvd) = (Vec::new(), Vec::new());
                    let (mut posted, mut recv_posted) = (0u64, 0u64);
                    // Bounded: each round posts what the window allows and polls both CQs.
                    for _ in 0..1_000_000 {
                        if sent.len() as u64 == MESSAGES && recvd.len() as u64 == MESSAGES {
                            break;
                        }
                        // Receives first (B's side), at most DEPTH outstanding.
                        while recv_posted < MESSAGES && recv_posted - (recvd.len() as u64) < 4 {
                            let k = (recv_posted % u64::from(DEPTH)) as u32;
                            let sge = mb.sge(k * MSG as u32, MSG as u32).unwrap();
                            unsafe { qb.post_recv_raw(recv_posted, &[sge]) }.unwrap();
                            recv_posted += 1;
                        }
                        // Then sends, never more than the receives posted for them.
                        while posted < recv_posted && posted - (sent.len() as u64) < 4 {
                            let k = (posted % u64::from(DEPTH)) as usize;
                            let slot = &mut ma.as_mut_slice()[k * MSG..][..MSG];
                            slot.fill(me as u8);
                            slot[..8].copy_from_slice(&posted.to_le_bytes());
                            let sge = ma.sge((k * MSG) as u32, MSG as u32).unwrap();
                            let mut bt = qa.send_batch();
                            unsafe { bt.send(posted, SendFlags::SIGNALED, &[sge]) }.unwrap();
                            bt.finish();
                            posted += 1;
                        }
                        let before = recvd.len();
                        poll(cb, &mut recvd);
                        // Each receive's bytes, checked as it completes (its slot is not
                        // reused before: at most 4 receives outstanding of DEPTH slots).
                        for &(wr, _) in &recvd[before..] {
                            let k = (wr % u64::from(DEPTH)) as usize;
                            let slot = &mb.as_slice()[k * MSG..][..MSG];
                            assert_eq!(slot[..8], wr.to_le_bytes(), "thread {me} message {wr}");
                            assert!(slot[8..].iter().all(|&x| x == me as u8));
                        }
                        poll(ca, &mut sent);
                    }
                    drop((qa, qb));
                    (sent, recvd)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want: Vec<(u64, u32)> = (0..MESSAGES).map(|k| (k, MSG as u32)).collect();
    for (me, (sent, recvd)) in results.iter().enumerate() {
        // In order, each once, none missing: RC completes in order on both sides.
        assert_eq!(*sent, want, "thread {me}'s send completions");
        assert_eq!(*recvd, want, "thread {me}'s receive completions");
    }
}

/// The IPv4 identifications of the RoCE frames A's NIC (link 0) sent from `start` on.
fn ids_from_a(seg: &Segment, start: usize) -> Vec<u16> {
    seg.sent_since(start)
        .iter()
        .filter(|(from, f)| *from == 0 && f.len() > 34 && f[12..14] == [8, 0])
        .map(|(_, f)| u16::from_be_bytes([f[18], f[19]]))
        .collect()
}

#[test]
fn a_full_nic_is_asked_before_a_frame_is_built() {
    let (a, b, _, seg) = devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let ma = pa.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mb = pb.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let qa = pa.qp_builder(&ca, &ca).caps(caps()).build::<Rc>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).caps(caps()).build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let (mut qa, mut qb) = (rxe_rc_up(qa, nb, IP_B), rxe_rc_up(qb, na, IP_A));
    let (sa, sb) = (
        ma.sge(0, MSG as u32).unwrap(),
        mb.sge(0, MSG as u32).unwrap(),
    );
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let mut send = |k: u64, full: bool| {
        // SAFETY: the regions outlive the QPs and their completions.
        unsafe { qb.post_recv_raw(k, &[sb]) }.unwrap();
        if full {
            seg.set_tx_credit(0, Some(0));
        }
        let mut bt = qa.send_batch();
        unsafe { bt.send(k, SendFlags::SIGNALED, &[sa]) }.unwrap();
        bt.finish();
        // While A's NIC is full, every progress has the requester try again.
        for _ in 0..10 {
            a.process_events();
        }
        seg.set_tx_credit(0, None);
        // Bounded: a few rounds move one message and its ACK.
        for _ in 0..100 {
            if wa.len() as u64 == k + 1 && wb.len() as u64 == k + 1 {
                break;
            }
            poll(&cb, &mut wb);
            poll(&ca, &mut wa);
        }
        assert_eq!((wa.len(), wb.len()), (k as usize + 1, k as usize + 1));
    };
    for _ in 0..4 {
        a.process_events();
        b.process_events();
    }
    let start = seg.sent_count();
    send(0, false);
    send(1, true);
    // Each frame built takes the next IPv4 identification: the refused tries took none.
    let ids = ids_from_a(&seg, start);
    assert_eq!(ids.len(), 2, "one frame per SEND: {ids:?}");
    assert_eq!(
        ids[1],
        ids[0].wrapping_add(1),
        "frames built for a full NIC"
    );
}
