//! What the CM tests share: two (or three) software RoCE devices on an in-memory segment, a
//! CM on a device, RC QPs, and a loop that runs both CMs until a condition holds.
#![allow(dead_code)] // each test binary uses a different subset

use bareverbs::Context;
use bareverbs::cm::{AcceptParams, Cm, CmConfig, CmEvent, ConnId, ConnectParams, ConnectRequest};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::verbs::*;
use bareverbs_model::link::{Faults, MemLink, Segment, TestClock};
use bareverbs_model::{Model, ModelConfig};

pub type R = Rxe<Model, MemLink, TestClock>;
pub type TestCm<'a> = Cm<'a, R, TestClock, 8>;
pub type Pd<'a> = ProtectionDomain<'a, R>;
pub type Cq<'a> = CompletionQueue<'a, R>;
pub type Events<'a> = Vec<CmEvent<'a, R>>;

pub const IP_A: [u8; 4] = [10, 0, 0, 2];
pub const IP_B: [u8; 4] = [10, 0, 0, 3];
pub const IP_C: [u8; 4] = [10, 0, 0, 4];
pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

pub struct Lab {
    pub model: Model,
    pub seg: Segment,
    pub clk: TestClock,
    pub a: Context<R>,
    pub b: Context<R>,
    /// A third station (the hostile one).
    pub c: Context<R>,
}

impl Lab {
    pub fn clk_now(&self) -> u64 {
        use bareverbs::hal::Clock;
        self.clk.now_us()
    }
}

/// Three devices (A, B, C), A and B seeded with `seeds` (their IDs and PSNs replay).
pub fn lab(faults: Faults, seeds: (u64, u64)) -> Lab {
    lab_seeded(faults, [seeds.0, seeds.1, seeds.1 ^ 0x5A5A])
}

/// Three devices (A, B, C) on one segment with `faults`, each seeded with its own of
/// `seeds` (their IDs and PSNs replay). The NVMe-oF tests' lab too (`nvmf/tests/common`).
pub fn lab_seeded(faults: Faults, seeds: [u64; 3]) -> Lab {
    let model = Model::new(ModelConfig::default());
    let seg = Segment::new();
    let clk = TestClock::default();
    let la = seg.attach([0x52, 0x54, 0, 0, 0, 2], 1514);
    let lb = seg.attach([0x52, 0x54, 0, 0, 0, 3], 1514);
    let lc = seg.attach([0x52, 0x54, 0, 0, 0, 4], 1514);
    seg.set_faults(faults);
    let dev = |l, ip| Rxe::new(model.clone(), l, clk.clone(), Config { ip }).unwrap();
    model.set_seed(seeds[0]);
    let a = Context::new(dev(la, IP_A));
    model.set_seed(seeds[1]);
    let b = Context::new(dev(lb, IP_B));
    model.set_seed(seeds[2]);
    let c = Context::new(dev(lc, IP_C));
    Lab {
        model,
        seg,
        clk,
        a,
        b,
        c,
    }
}

/// Each side's protection domain, CM completion queue and data completion queue, made in
/// that order: `(pa, pb, ma, mb, da, db)`.
pub fn sides(l: &Lab) -> (Pd<'_>, Pd<'_>, Cq<'_>, Cq<'_>, Cq<'_>, Cq<'_>) {
    let (pa, pb) = (l.a.alloc_pd().unwrap(), l.b.alloc_pd().unwrap());
    let (ma, mb) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
    let (da, db) = (l.a.create_cq(64).unwrap(), l.b.create_cq(64).unwrap());
    (pa, pb, ma, mb, da, db)
}

pub fn cm<'a>(
    pd: &'a ProtectionDomain<'a, R>,
    cq: &'a CompletionQueue<'a, R>,
    clk: &TestClock,
    cfg: CmConfig,
) -> TestCm<'a> {
    Cm::new(pd, cq, clk.clone(), cfg).unwrap()
}

pub fn rc_qp<'a>(
    pd: &'a ProtectionDomain<'a, R>,
    cq: &'a CompletionQueue<'a, R>,
) -> QueuePair<'a, R, Rc, Reset> {
    pd.qp_builder(cq, cq)
        .caps(QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .build::<Rc>()
        .unwrap()
}

/// A connects `qa` to B's port 7174 with the default parameters.
pub fn connect_to_b<'a>(a: &mut TestCm<'a>, qa: QueuePair<'a, R, Rc, Reset>) -> ConnId {
    a.connect(qa, IP_B, 7174, &ConnectParams::default())
        .unwrap()
}

/// Runs both CMs (time moving `step` µs a round, at most `rounds` rounds), collecting their
/// events, until `done`.
#[allow(clippy::too_many_arguments)]
pub fn pump<'a>(
    clk: &TestClock,
    a: &mut TestCm<'a>,
    b: &mut TestCm<'a>,
    ea: &mut Events<'a>,
    eb: &mut Events<'a>,
    rounds: u32,
    step: u64,
    mut done: impl FnMut(&Events<'a>, &Events<'a>) -> bool,
) -> bool {
    for _ in 0..rounds {
        if done(ea, eb) {
            return true;
        }
        clk.advance(step);
        while let Some(e) = a.poll() {
            ea.push(e);
        }
        while let Some(e) = b.poll() {
            eb.push(e);
        }
    }
    done(ea, eb)
}

/// B takes the request A has sent and accepts it: runs both CMs (1000 rounds of 1 ms) until
/// B has an event, which must be the request, accepts it on `qb` with the default parameters,
/// then runs them again (1000 rounds of 1 ms) until `done`. Returns the request and B's QP.
#[allow(clippy::too_many_arguments)]
pub fn accept_request<'a>(
    clk: &TestClock,
    a: &mut TestCm<'a>,
    b: &mut TestCm<'a>,
    ea: &mut Events<'a>,
    eb: &mut Events<'a>,
    qb: QueuePair<'a, R, Rc, Reset>,
    done: impl FnMut(&Events<'a>, &Events<'a>) -> bool,
) -> (ConnectRequest, QueuePair<'a, R, Rc, Rts>) {
    assert!(pump(clk, a, b, ea, eb, 1000, 1000, |_, b| {
        !b.is_empty()
    }));
    let CmEvent::ConnectRequest(r) = eb.remove(0) else {
        panic!()
    };
    let qb = b.accept(r.id, qb, &AcceptParams::default()).unwrap();
    assert!(pump(clk, a, b, ea, eb, 1000, 1000, done));
    (r, qb)
}

/// Runs one CM alone (time moving `step` µs a round) for `rounds` rounds, collecting its
/// events.
pub fn run_alone<'a>(clk: &TestClock, cm: &mut TestCm<'a>, rounds: u32, step: u64) -> Events<'a> {
    let mut evs = Vec::new();
    for _ in 0..rounds {
        clk.advance(step);
        while let Some(e) = cm.poll() {
            evs.push(e);
        }
    }
    evs
}

/// Polls both data CQs (the devices progress with them) until `na` and `nb` completions.
pub fn completions(
    l: &Lab,
    a: &CompletionQueue<'_, R>,
    b: &CompletionQueue<'_, R>,
    na: usize,
    nb: usize,
) -> (Vec<WorkCompletion>, Vec<WorkCompletion>) {
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let mut wc = [WorkCompletion::default(); 8];
    for _ in 0..100_000 {
        if wa.len() >= na && wb.len() >= nb {
            break;
        }
        l.clk.advance(100);
        let n = a.poll(&mut wc).unwrap();
        wa.extend_from_slice(&wc[..n]);
        let n = b.poll(&mut wc).unwrap();
        wb.extend_from_slice(&wc[..n]);
    }
    assert!(wa.len() >= na && wb.len() >= nb, "{wa:?} {wb:?}");
    (wa, wb)
}

/// Whether `f` is a CM MAD of attribute `attr` to QP1 (IPv4, UDP 4791).
pub fn is_mad(f: &[u8], attr: u16) -> bool {
    f.len() >= 62 + 256
        && f[12..14] == [8, 0]
        && f[36..38] == [0x12, 0xB7]
        && f[47..50] == [0, 0, 1]
        && f[62 + 1] == 7
        && f[62 + 16..62 + 18] == attr.to_be_bytes()
}

/// Sends each of `mads` (any bytes, any length up to 256) from station C's QP1 to QP1 at
/// `dst`, and runs C until they left.
pub fn send_from_c(l: &Lab, dst: [u8; 4], mads: &[Vec<u8>]) {
    let pd = l.c.alloc_pd().unwrap();
    let cq = l.c.create_cq(64).unwrap();
    let qp = pd
        .qp_builder(&cq, &cq)
        .caps(QpCaps {
            max_send_wr: 32,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .build::<Gsi>()
        .unwrap();
    let mut qp = qp.ready(0x8001_0000, 0).unwrap();
    let mut mr = pd.register(256 * 32, AccessFlags::LOCAL_WRITE).unwrap();
    let ah = pd
        .create_ah(&AddressVector::new(Gid::from_ipv4(dst), 1))
        .unwrap();
    let mut wc = [WorkCompletion::default(); 8];
    for chunk in mads.chunks(32) {
        for (k, m) in chunk.iter().enumerate() {
            mr.as_mut_slice()[k * 256..k * 256 + m.len()].copy_from_slice(m);
        }
        // SAFETY: the region stays registered and untouched until the completions.
        unsafe {
            let mut s = qp.send_batch();
            for (k, m) in chunk.iter().enumerate() {
                let sge = mr.sge(k as u32 * 256, m.len() as u32).unwrap();
                s.send_to(k as u64, SendFlags::SIGNALED, (&ah, 1, 0x8001_0000), &[sge])
                    .unwrap();
            }
            s.finish();
        }
        let mut done = 0;
        for _ in 0..10_000 {
            l.clk.advance(10);
            // The others answer C's ARP; their CMs take the datagrams when next polled.
            l.a.process_events();
            l.b.process_events();
            done += cq.poll(&mut wc).unwrap();
            if done >= chunk.len() {
                break;
            }
        }
        assert_eq!(done, chunk.len());
    }
}
