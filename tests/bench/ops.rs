//! Data-path operations for instruction counting (`tests/bench.sh` runs this under
//! `valgrind --tool=callgrind`, counting only inside the `bench_<key>` functions), scenario for
//! scenario with rdma-core's harness (`tests/bench/rdma_core_harness.c`).
//!
//! Each `bench_<key>` function does one measured call of the driver's API, inlined into it as
//! in an application; everything else runs outside the count. The device is the model with its
//! UAR (BAR2) mapped as a plain page of memory (`Model::set_plain_uar`), as rdma-core's
//! harness's fake UAR: a doorbell from the driver is a store there (behind the one test that
//! tells the HAL's plain page from the model's registers), unseen by the model, so the figures
//! are the driver's own instructions. After each measured call the harness checks the doorbell
//! word the driver wrote, as rdma-core's harness does. Between measured calls the harness plays
//! the device for real, outside the count: it rings the model's doorbell itself
//! (`Model::doorbell`), so the model takes the posted receives, executes the posted sends (loopback: the RC QPs are connected to themselves, the UD QP sends to
//! itself) and writes the CQEs, which the harness then polls. The driver's rings and its
//! completion counters stay as they are in real use: every request completes once, in order,
//! and every CQE carries the `wr_id` of the next outstanding request of its queue. The poll
//! scenarios put their CQEs in place with `Model::inject_cqe` (a successful SEND completion,
//! as rdma-core's harness writes) for sends posted beforehand and marked consumed with
//! `Model::consume_rings`, so a poll finds exactly the completions it is to return.
//!
//! Objects: an RC QP connected to itself (64 send / 64 receive slots, 1 SGE each way), a UD
//! QP, both on one CQ of 4096 entries; for the safe path, an RC QP (the same capacities) with
//! a buffer pool of 64-byte buffers, on its own CQ (a safe QP's poll stops at another QP's
//! completion). Every send is SIGNALED and carries 64 bytes in 1 SGE.
//!
//!   ops <key>     runs scenario <key> REPS times (what callgrind measures)
//!   ops all       runs every scenario REPS times (a self-check; also what `cargo bench` runs)
//!   ops sizes     prints `size <Object> <bytes>` of the public objects (P = Pvrdma<IdentityHal>)

use std::hint::black_box;

use bareverbs::Context;
use bareverbs::device::pvrdma::regs::db;
use bareverbs::device::pvrdma::{Config, Opcodes, Pvrdma};
use bareverbs::hal::IdentityHal;
use bareverbs::verbs::*;
use bareverbs_model::Model;

type P = Pvrdma<Model>;

/// Repetitions of each scenario.
pub const REPS: usize = 1000;
/// The UD QP's Q_Key.
const QKEY: u32 = 0x1111;
/// Bytes per SGE and per pool buffer.
const LEN: u32 = 64;

struct Bench<'a> {
    model: &'a Model,
    qp: QueuePair<'a, P, Rc, Rts>,
    ud: QueuePair<'a, P, Ud, Rts>,
    /// The safe-path QP (with a buffer pool), on `scq`.
    sqp: QueuePair<'a, P, Rc, Rts>,
    cq: &'a CompletionQueue<'a, P>,
    scq: &'a CompletionQueue<'a, P>,
    ah: &'a AddressHandle<'a, P>,
    pool: &'a BufferPool<'a, P>,
    /// 16 SGEs of 64 bytes in one MR.
    sges: [Sge; 16],
    /// Where the RDMA WRITEs go (the second half of the MR) and its rkey.
    remote: u64,
    rkey: u32,
    /// The UD destination: the UD QP itself.
    ud_qpn: u32,
    qkey: u32,
    /// The wr_id of the single-request scenarios, read from memory as an application's would
    /// be (the batches number theirs 0..16 from their loop counter).
    wr_id: u64,
    wc: [WorkCompletion; 16],
}

// ---- The measured functions: one API call each, the driver inlined. ----

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_empty(b: &mut Bench<'_>) {
    let _ = b;
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_post_send_1(b: &mut Bench<'_>) {
    let mut s = b.qp.send_batch();
    // SAFETY: the MR lives for the whole benchmark; the CPU never touches its bytes.
    unsafe { s.send(b.wr_id, SendFlags::SIGNALED, &b.sges[..1]) }.unwrap();
    s.finish();
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_post_send_16(b: &mut Bench<'_>) {
    let mut s = b.qp.send_batch();
    for (i, sge) in b.sges.iter().enumerate() {
        // SAFETY: as above.
        unsafe { s.send(i as u64, SendFlags::SIGNALED, core::slice::from_ref(sge)) }.unwrap();
    }
    s.finish();
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_write_16(b: &mut Bench<'_>) {
    let (remote, rkey) = (b.remote, b.rkey);
    let mut s = b.qp.send_batch();
    for (i, sge) in b.sges.iter().enumerate() {
        let to = (remote + i as u64 * u64::from(LEN), rkey);
        // SAFETY: as above.
        unsafe {
            s.rdma_write(
                i as u64,
                SendFlags::SIGNALED,
                to,
                core::slice::from_ref(sge),
            )
        }
        .unwrap();
    }
    s.finish();
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_post_send_ud_1(b: &mut Bench<'_>) {
    let dest = (b.ah, b.ud_qpn, b.qkey);
    let mut s = b.ud.send_batch();
    // SAFETY: as above.
    unsafe { s.send_to(b.wr_id, SendFlags::SIGNALED, dest, &b.sges[..1]) }.unwrap();
    s.finish();
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_post_recv_1(b: &mut Bench<'_>) {
    // SAFETY: as above.
    unsafe { b.qp.post_recv_raw(b.wr_id, &b.sges[..1]) }.unwrap();
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_post_recv_16(b: &mut Bench<'_>) {
    let mut r = b.qp.recv_batch();
    for (i, sge) in b.sges.iter().enumerate() {
        // SAFETY: as above.
        unsafe { r.recv(i as u64, core::slice::from_ref(sge)) }.unwrap();
    }
    r.finish();
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_poll_1(b: &mut Bench<'_>) -> usize {
    b.cq.poll(&mut b.wc[..1]).unwrap()
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_poll_16(b: &mut Bench<'_>) -> usize {
    b.cq.poll(&mut b.wc).unwrap()
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_poll_empty(b: &mut Bench<'_>) -> usize {
    b.cq.poll(&mut b.wc).unwrap()
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_safe_post_send_1<'a>(b: &mut Bench<'a>, buf: Buf<'a, P>) {
    b.sqp.post_send(b.wr_id, buf).unwrap();
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_safe_post_recv_1<'a>(b: &mut Bench<'a>, buf: Buf<'a, P>) {
    b.sqp.post_recv(b.wr_id, buf).unwrap();
}

#[unsafe(no_mangle)]
#[inline(never)]
fn bench_safe_poll_1<'a>(b: &mut Bench<'a>) -> Option<Completion<'a, P>> {
    b.sqp.poll_one().unwrap()
}

// ---- Everything below runs outside the count. ----

/// wr_ids of the requests the harness posts itself (the measured ones use 0..16).
const OTHER: u64 = 1000;

impl<'a> Bench<'a> {
    /// Rings QP `handle`'s doorbell for real: the model takes the receives (`db::QP_RECV`) or
    /// executes the sends (`db::QP_SEND`) posted since, and writes their CQEs.
    fn ring(&self, handle: u32, bits: u32) {
        self.model.doorbell(db::QP, handle | bits);
    }

    /// Forgets the doorbell words written so far (before a measured call).
    fn clear_bells(&self) {
        self.model.take_uar_word(db::QP);
        self.model.take_uar_word(db::CQ);
    }

    /// Checks the doorbell words the measured call wrote in the plain UAR page: `qp` at the
    /// QP doorbell, `cq` at the CQ doorbell (0: none).
    fn rang(&self, qp: u32, cq: u32) {
        let got = (
            self.model.take_uar_word(db::QP),
            self.model.take_uar_word(db::CQ),
        );
        assert_eq!(got, (qp, cq), "doorbell words (QP, CQ)");
    }

    fn ring_rc(&self, bits: u32) {
        self.ring(self.qp.raw().handle(), bits);
    }

    fn ring_safe(&self, bits: u32) {
        self.ring(self.sqp.raw().handle(), bits);
    }

    /// Posts `n` receives on the RC QP (wr_ids OTHER..).
    fn recvs(&mut self, n: usize) {
        let mut r = self.qp.recv_batch();
        for (i, sge) in self.sges[..n].iter().enumerate() {
            // SAFETY: the MR outlives the benchmark.
            unsafe { r.recv(OTHER + i as u64, core::slice::from_ref(sge)) }.unwrap();
        }
        r.finish();
    }

    /// Posts `n` SENDs on the RC QP (wr_ids OTHER..).
    fn sends(&mut self, n: usize) {
        let mut s = self.qp.send_batch();
        for (i, sge) in self.sges[..n].iter().enumerate() {
            // SAFETY: as above.
            unsafe {
                s.send(
                    OTHER + i as u64,
                    SendFlags::SIGNALED,
                    core::slice::from_ref(sge),
                )
            }
            .unwrap();
        }
        s.finish();
    }

    /// Polls the shared CQ until `n` completions are taken; checks that each succeeded and
    /// that the receives and the sends came back with these wr_ids, in order.
    fn drain(&mut self, n: usize, recv_ids: &[u64], send_ids: &[u64], send_op: WcOpcode) {
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            let k = self.cq.poll(&mut self.wc).unwrap();
            assert!(k > 0, "{} completions of {n}", got.len());
            got.extend_from_slice(&self.wc[..k]);
        }
        assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
        let ids = |op: WcOpcode| -> Vec<u64> {
            got.iter()
                .filter(|c| c.opcode == op)
                .map(|c| c.wr_id)
                .collect()
        };
        assert_eq!(ids(WcOpcode::Recv), recv_ids, "{got:?}");
        assert_eq!(ids(send_op), send_ids, "{got:?}");
        assert_eq!(
            self.cq.poll(&mut self.wc).unwrap(),
            0,
            "a completion too many"
        );
    }

    /// Takes `n` completions of the safe QP, their buffers back to the pool.
    fn drain_safe(&mut self, n: usize) {
        for _ in 0..n {
            let c = self.sqp.poll_one().unwrap().expect("a completion");
            assert_eq!(c.wc.status, WcStatus::Success);
            assert!(c.buf.is_some(), "a safe completion without its buffer");
        }
        assert!(
            self.sqp.poll_one().unwrap().is_none(),
            "a completion too many"
        );
        assert_eq!(
            self.pool.free_count(),
            self.pool.count(),
            "a buffer not back"
        );
    }

    /// A buffer of the pool, `LEN` bytes in use.
    fn buf(&self) -> Buf<'a, P> {
        let mut b = self.pool.alloc().expect("a free buffer");
        b.set_len(LEN).unwrap();
        b
    }

    /// Puts the send completions of `ids` (posted on QP `qp` and not executed) in CQ `cq`.
    fn inject(&self, cq: u32, qp: u32, ids: impl IntoIterator<Item = u64>) {
        self.model.consume_rings(qp);
        for id in ids {
            self.model.inject_cqe(cq, qp, id);
        }
    }
}

fn ids(base: u64, n: usize) -> Vec<u64> {
    (base..base + n as u64).collect()
}

/// One repetition of scenario `key`: the device's part, the measured call, the checks.
fn run_once(key: &str, b: &mut Bench<'_>) {
    let rc = b.qp.raw().handle();
    let safe = b.sqp.raw().handle();
    match key {
        // Called through a pointer: a direct call of a function without effects is dropped.
        "empty" => black_box(bench_empty as fn(&mut Bench<'_>))(b),
        "post_send_1" | "post_send_16" => {
            let n = if key == "post_send_1" { 1 } else { 16 };
            b.recvs(n);
            b.ring_rc(db::QP_RECV);
            b.clear_bells();
            if n == 1 {
                bench_post_send_1(b);
            } else {
                bench_post_send_16(b);
            }
            b.rang(rc | db::QP_SEND, 0);
            b.ring_rc(db::QP_SEND);
            b.drain(2 * n, &ids(OTHER, n), &ids(0, n), WcOpcode::Send);
        }
        "post_recv_1" | "post_recv_16" => {
            let n = if key == "post_recv_1" { 1 } else { 16 };
            b.clear_bells();
            if n == 1 {
                bench_post_recv_1(b);
            } else {
                bench_post_recv_16(b);
            }
            b.rang(rc | db::QP_RECV, 0);
            b.ring_rc(db::QP_RECV);
            b.sends(n);
            b.ring_rc(db::QP_SEND);
            b.drain(2 * n, &ids(0, n), &ids(OTHER, n), WcOpcode::Send);
        }
        "write_16" => {
            b.clear_bells();
            bench_write_16(b);
            b.rang(rc | db::QP_SEND, 0);
            b.ring_rc(db::QP_SEND);
            b.drain(16, &[], &ids(0, 16), WcOpcode::RdmaWrite);
        }
        "post_send_ud_1" => {
            let ud = b.ud.raw().handle();
            b.clear_bells();
            bench_post_send_ud_1(b);
            b.rang(ud | db::QP_SEND, 0);
            // No receive posted: the datagram is dropped, the send completes.
            b.ring(ud, db::QP_SEND);
            b.drain(1, &[], &[0], WcOpcode::Send);
        }
        "poll_1" | "poll_16" => {
            let n = if key == "poll_1" { 1 } else { 16 };
            b.sends(n);
            b.inject(b.cq.raw().handle(), b.qp.qp_num(), ids(OTHER, n));
            b.clear_bells();
            let got = if n == 1 {
                bench_poll_1(b)
            } else {
                bench_poll_16(b)
            };
            b.rang(0, 0);
            assert_eq!(got, n);
            let wc = &b.wc[..n];
            assert!(wc.iter().all(|c| c.status == WcStatus::Success));
            assert_eq!(
                wc.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
                ids(OTHER, n)
            );
        }
        "poll_empty" => {
            b.clear_bells();
            assert_eq!(bench_poll_empty(b), 0);
            // The POLL doorbell: the device harvests its host CQ (§10.3).
            b.rang(0, b.cq.raw().handle() | db::CQ_POLL);
        }
        "safe_post_send_1" => {
            let r = b.buf();
            b.sqp.post_recv(OTHER, r).unwrap();
            b.ring_safe(db::QP_RECV);
            let s = b.buf();
            b.clear_bells();
            bench_safe_post_send_1(b, s);
            b.rang(safe | db::QP_SEND, 0);
            b.ring_safe(db::QP_SEND);
            b.drain_safe(2);
        }
        "safe_post_recv_1" => {
            let r = b.buf();
            b.clear_bells();
            bench_safe_post_recv_1(b, r);
            b.rang(safe | db::QP_RECV, 0);
            b.ring_safe(db::QP_RECV);
            let s = b.buf();
            b.sqp.post_send(OTHER, s).unwrap();
            b.ring_safe(db::QP_SEND);
            b.drain_safe(2);
        }
        "safe_poll_1" => {
            let s = b.buf();
            b.sqp.post_send(OTHER, s).unwrap();
            b.inject(b.scq.raw().handle(), b.sqp.qp_num(), [OTHER]);
            b.clear_bells();
            let c = bench_safe_poll_1(b).expect("a completion");
            b.rang(0, 0);
            assert_eq!((c.wc.wr_id, c.wc.status), (OTHER, WcStatus::Success));
            assert!(c.buf.is_some(), "the send's buffer not handed back");
            drop(c);
            assert_eq!(b.pool.free_count(), b.pool.count());
        }
        other => panic!("unknown scenario {other}"),
    }
}

const KEYS: [&str; 13] = [
    "post_send_1",
    "post_send_16",
    "post_recv_1",
    "post_recv_16",
    "poll_1",
    "poll_16",
    "poll_empty",
    "post_send_ud_1",
    "write_16",
    "safe_post_send_1",
    "safe_post_recv_1",
    "safe_poll_1",
    "empty",
];

/// `size <Object> <bytes>` of the public objects, for the example kernel's HAL.
fn sizes() {
    type H = IdentityHal<'static>;
    type Q = Pvrdma<H>;
    let rows: [(&str, usize); 10] = [
        ("QueuePair", size_of::<QueuePair<'static, Q, Rc, Rts>>()),
        ("CompletionQueue", size_of::<CompletionQueue<'static, Q>>()),
        (
            "SharedReceiveQueue",
            size_of::<SharedReceiveQueue<'static, Q>>(),
        ),
        ("MemoryRegion", size_of::<MemoryRegion<'static, Q>>()),
        (
            "ProtectionDomain",
            size_of::<ProtectionDomain<'static, Q>>(),
        ),
        ("BufferPool", size_of::<BufferPool<'static, Q>>()),
        ("Buf", size_of::<Buf<'static, Q>>()),
        ("AddressHandle", size_of::<AddressHandle<'static, Q>>()),
        ("Context", size_of::<Context<Q>>()),
        ("Pvrdma", size_of::<Q>()),
    ];
    for (name, n) in rows {
        println!("size {name} {n}");
    }
}

/// An RC QP in RTS connected to itself, on `cq`, with the safe path when `pool` is given.
fn rc_to_itself<'a>(
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    caps: QpCaps,
    av: AddressVector,
    pool: Option<&'a BufferPool<'a, P>>,
) -> QueuePair<'a, P, Rc, Rts> {
    let mut builder = pd.qp_builder(cq, cq).caps(caps);
    if let Some(p) = pool {
        builder = builder.pool(p);
    }
    let qp = builder.build::<Rc>().unwrap();
    let qpn = qp.qp_num();
    let init = ConnectedInit {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        ..ConnectedInit::default()
    };
    let qp = qp.init(&init).unwrap();
    let qp = qp.rtr(&ConnectedRtr::new(qpn, 0, av)).unwrap();
    qp.rts(&ConnectedRts::new(0)).unwrap()
}

fn main() {
    let scenario = std::env::args()
        .nth(1)
        .filter(|a| !a.starts_with("--"))
        .unwrap_or_else(|| "all".into());
    if scenario == "sizes" {
        sizes();
        return;
    }
    assert!(
        scenario == "all" || KEYS.contains(&scenario.as_str()),
        "unknown scenario {scenario}"
    );
    let model = Model::default();
    // The UAR the driver maps is a plain page (see the module's documentation).
    model.set_plain_uar(true);
    let config = Config {
        opcodes: Opcodes::All,
        ..Config::default()
    };
    let ctx = Context::new(Pvrdma::probe(model.clone(), &model, config).unwrap());
    let gid = ctx
        .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let scq = ctx.create_cq(256).unwrap();
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut mr = pd
        .register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    // Distinct bytes in the first half (the SGEs), zeros in the second (the WRITEs' target).
    for (i, x) in mr.as_mut_slice()[..2048].iter_mut().enumerate() {
        *x = i as u8 | 1;
    }
    let pool = pd.buffer_pool(64, LEN).unwrap();
    let av = AddressVector::new(gid.gid(), 0);
    let ah = pd.create_ah(&av).unwrap();

    let qp = rc_to_itself(&pd, &cq, caps, av, None);
    let sqp = rc_to_itself(&pd, &scq, caps, av, Some(&pool));
    let ud = pd
        .qp_builder(&cq, &cq)
        .caps(caps)
        .build::<Ud>()
        .unwrap()
        .ready(QKEY, 0)
        .unwrap();
    let sges: [Sge; 16] = core::array::from_fn(|i| mr.sge(i as u32 * LEN, LEN).unwrap());
    let mut b = Bench {
        model: &model,
        ud_qpn: ud.qp_num(),
        qp,
        ud,
        sqp,
        cq: &cq,
        scq: &scq,
        ah: &ah,
        pool: &pool,
        sges,
        remote: mr.addr() + 2048,
        rkey: mr.rkey(),
        qkey: black_box(QKEY),
        wr_id: black_box(0),
        wc: [WorkCompletion::default(); 16],
    };
    for key in KEYS {
        if scenario == "all" || scenario == key {
            for _ in 0..REPS {
                run_once(key, &mut b);
            }
        }
    }
    // What the RDMA WRITEs wrote: the bytes of the first half, in the second.
    if scenario == "all" || scenario == "write_16" {
        let bytes = mr.as_slice();
        assert_eq!(bytes[2048..3072], bytes[..1024]);
    }
    drop(b);
    drop(pool);
    drop(mr);
    drop(scq);
    drop(cq);
    drop(ah);
    drop(pd);
    drop(gid);
    drop(ctx);
    assert_eq!(model.outstanding_pages(), 0);
    assert!(model.violations().is_empty(), "{:?}", model.violations());
    let (doorbells, cqes, _) = model.counters();
    println!("scenario {scenario}: ok ({doorbells} doorbells rung by the harness, {cqes} CQEs)");
}
