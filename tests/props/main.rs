//! Property tests of the verbs contract on the device model: proptest generates sequences of
//! operations over a fixed topology of queue pairs (two RC pairs, two UD QPs, an RC pair on a
//! shared receive queue; four CQs, some shared, some not; a buffer pool for the safe path) and
//! a reference model kept here predicts what every operation and every completion must be.
//!
//! Properties, checked after every operation and at the end of each case:
//! - every posted work request completes exactly once: with the status the device's execution
//!   gives it (success or an error), or `WrFlushErr` only once its QP went to ERR, or never
//!   after a RESET or destroy of its QP (discarded);
//! - the completions of one work queue arrive in posting order (SRQ receives: any outstanding
//!   one, once, on the QP that consumed it), with every field of the work completion right;
//! - every poll gives exactly the completion due next, and "nothing" only when nothing is due:
//!   CQEs in the order the device wrote them (those of destroyed QPs and discarded requests
//!   dropped), `poll_one` stopping at another QP's CQE as documented, flushes once the ring is
//!   empty;
//! - no safe-path buffer is lost or duplicated: `free_count()` is always the pool size minus
//!   the buffers the test holds and those inside QPs; a received buffer holds the bytes sent,
//!   and buffers the test holds are never written by the device;
//! - capacities hold: posting beyond `max_send_wr` / `max_recv_wr` outstanding (posted and not
//!   yet polled; an SRQ: beyond `max_wr`) is `QueueFull` with nothing posted, and room comes
//!   back with completions;
//! - after a full drain nothing is left that should have completed; at the end every QP,
//!   object and DMA page is gone and the model saw no violation.
//!
//! The reference mirrors the model's loopback execution (`tests/model/src/datapath.rs`) under
//! the strict `Semantics::Verbs` (a failed RC request moves its QP to ERROR, and so does a
//! fault the responder found, the responder's: the device then flushes the QP's later sends,
//! its receives, at once for a responder and after the send queue's run for a requester, and
//! every receive posted after; a request to a QP in ERROR runs out of retries; a one-packet
//! WRITE with immediate meets RNR before its key is checked; RESET starts the QP over) and
//! under `Semantics::LooseVerbs` (a failed request leaves its QPs in RTS), which
//! runs every send inside its doorbell: an RC SEND with no receive posted at the peer completes
//! with `RnrRetryExcErr` (the model does not retry), to a destroyed peer with `RetryExcErr`; a
//! UD send that finds no receive, no QP or a wrong Q_Key is dropped and completes successfully;
//! a receive too small is `LocLenErr` at the receiver and `RemInvReqErr` at the sender. Under
//! `Semantics::Qemu` every opcode runs as SEND (RDMA WRITE/READ consume a receive at the peer)
//! and no immediate data is delivered.
//!
//! Runs: a fixed seed per semantics (deterministic in CI), no failure-persistence files;
//! `PROPTEST_CASES` sets the number of cases (default 2000 each), `PROPS_SEED` another seed. A
//! failure prints the shrunk case. The steps that hit the driver bugs this suite found
//! (reproduced by the tests at the end: late receives after a flush or a reset, SRQ credit) are
//! generated too; `PROPS_KNOWN_BUGS=none` skips them.

#[path = "../common/mod.rs"]
mod common;

use std::collections::VecDeque;

use bareverbs::Error;
use bareverbs::error::{Attr, Feature, Op as DevOp, Param, Queue, Unsupported};
use bareverbs::verbs::*;
use bareverbs_model::{Model, ModelConfig, Semantics};
use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngAlgorithm, TestCaseError, TestRng, TestRunner};

type P = bareverbs::device::pvrdma::Pvrdma<Model>;

// ---------------------------------------------------------------------------------------------
// The topology

const N_QP: usize = 8;
const N_CQ: usize = 4;
/// Safe-path buffers, and their size.
const POOL_N: u32 = 32;
const BUF: u32 = 256;
/// The raw path's memory: every raw request gets bytes of its own, never reused.
const RAW_LEN: usize = 256 * 1024;
/// The RDMA target region (Verbs semantics).
const RDMA_LEN: usize = 4096;
const SGE_MAX: u32 = 2;
const QKEY: u32 = 0x1111_2222;
const BAD_QKEY: u32 = 0x0BAD_0000;
/// A QP number no QP has.
const NOWHERE: u32 = 0x00AB_CDEF;
/// Bytes of GRH in front of a UD receive.
const GRH: usize = 40;
/// XOR-ed into a key to make it name no region.
const BAD_KEY: u32 = 0x00F0_0000;
const MAX_STEPS: usize = 96;

#[derive(Clone, Copy, Debug)]
struct Spec {
    ud: bool,
    /// Built with the buffer pool (safe path); the others are raw-only.
    safe: bool,
    srq: bool,
    /// RC: the QP it is connected to.
    peer: usize,
    scq: usize,
    rcq: usize,
}

const fn rc(safe: bool, srq: bool, peer: usize, scq: usize, rcq: usize) -> Spec {
    Spec {
        ud: false,
        safe,
        srq,
        peer,
        scq,
        rcq,
    }
}

const fn ud(safe: bool, scq: usize, rcq: usize) -> Spec {
    Spec {
        ud: true,
        safe,
        srq: false,
        peer: usize::MAX,
        scq,
        rcq,
    }
}

/// 0–1: an RC pair with the safe path; 2–3: a raw-only RC pair; 4–5: UD (4 safe); 6–7: an RC
/// pair receiving from the SRQ (6 safe). CQ 0 is shared by four QPs, QP 0 sends and receives
/// on it, QP 1 sends there and receives on CQ 1, and so on.
const TOPO: [Spec; N_QP] = [
    rc(true, false, 1, 0, 0),
    rc(true, false, 0, 0, 1),
    rc(false, false, 3, 1, 2),
    rc(false, false, 2, 2, 2),
    ud(true, 0, 3),
    ud(false, 3, 3),
    rc(true, true, 7, 3, 0),
    rc(false, true, 6, 1, 3),
];

// ---------------------------------------------------------------------------------------------
// Generated operations

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Remote {
    Good,
    BadKey,
    OutOfRange,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UdTo {
    U0,
    U1,
    /// An RC QP (not UD: dropped).
    Rc0,
    Nowhere,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Qkey {
    Right,
    Wrong,
    /// Bit 31: the sender's own Q_Key.
    Own,
}

#[derive(Clone, Debug)]
struct SendItem {
    kind: Kind,
    len: u16,
    /// 0..=3 (3 is one more than the QPs have).
    sges: u8,
    bad_lkey: bool,
    remote: Remote,
    off: u16,
    to: UdTo,
    qkey: Qkey,
    imm: u32,
    flags: u8,
}

#[derive(Clone, Debug)]
struct RecvItem {
    room: u16,
    sges: u8,
    bad_lkey: bool,
}

#[derive(Clone, Debug)]
enum Step {
    /// A raw send batch, published (`finish`) or dropped.
    RawSend {
        qp: usize,
        items: Vec<SendItem>,
        finish: bool,
    },
    /// A raw receive batch (`single`: through `post_recv_raw`).
    RawRecv {
        qp: usize,
        items: Vec<RecvItem>,
        finish: bool,
        single: bool,
    },
    /// A safe SEND of a pool buffer (UD: to `to`; `no_dest`: through `post_send`).
    SafeSend {
        qp: usize,
        len: u16,
        to: UdTo,
        qkey: Qkey,
        reuse: bool,
        no_dest: bool,
    },
    SafeRecv {
        qp: usize,
        reuse: bool,
    },
    SrqRecv {
        items: Vec<RecvItem>,
    },
    /// `poll_one` up to `max` times (`keep`: hold the buffers handed back).
    PollQp {
        qp: usize,
        max: u8,
        keep: bool,
    },
    /// `CompletionQueue::poll` into `n` slots.
    PollCq {
        cq: usize,
        n: u8,
    },
    /// The cursor, up to `max` completions.
    Cursor {
        cq: usize,
        max: u8,
    },
    /// Every CQ polled until empty, then the liveness check.
    Drain,
    ToError {
        qp: usize,
    },
    Reset {
        qp: usize,
    },
    Destroy {
        qp: usize,
    },
    /// INIT after RESET (refused by the driver: QEMU cannot do it).
    Reinit {
        qp: usize,
    },
    /// Take a pool buffer and hold it.
    Hold,
    Release {
        i: u8,
    },
    /// Post a buffer of another pool (or to a QP without one).
    Foreign {
        qp: usize,
        send: bool,
    },
}

#[derive(Clone, Debug)]
struct Case {
    /// (max_send_wr, max_recv_wr) requested per QP.
    caps: Vec<(u32, u32)>,
    sig_all: Vec<bool>,
    srq_wr: u32,
    steps: Vec<Step>,
}

// ---------------------------------------------------------------------------------------------
// The reference model

macro_rules! ensure {
    ($c:expr, $($fmt:tt)*) => {
        if !$c {
            return Err(format!($($fmt)*));
        }
    };
}

macro_rules! ensure_eq {
    ($a:expr, $b:expr, $($fmt:tt)*) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(format!("{}:\n  got      {:?}\n  expected {:?}", format!($($fmt)*), a, b));
        }
    }};
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Rts,
    Err,
    Reset,
    Gone,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wq {
    Sq,
    Rq,
    Srq,
}

/// What the device did with a request: the completion it makes, and for a receive (or an RDMA
/// READ) the bytes that landed.
#[derive(Clone, Debug)]
struct Exec {
    wc: WorkCompletion,
    vendor_err: u32,
    /// The QP whose completion it is (an SRQ receive: the consumer).
    consumer: usize,
    data: Option<Vec<u8>>,
    grh: bool,
}

#[derive(Clone, Debug)]
struct Wr {
    wq: Wq,
    wr_id: u64,
    /// The safe path's buffer index.
    buf: Option<u32>,
    /// A receive's room, and whether its key is bad.
    room: u32,
    bad_lkey: bool,
    /// Where a raw receive (or an RDMA READ) lands in the raw region.
    raw: Option<usize>,
    exec: Option<Exec>,
    /// Completed, or discarded (RESET, destroy).
    done: bool,
    /// A safe receive flushed or discarded after the device took it: its buffer stays in the
    /// driver until the QP is destroyed (the device may still write it).
    parked: bool,
}

#[derive(Clone, Debug)]
struct RQp {
    st: St,
    qpn: u32,
    caps: QpCaps,
    /// Outstanding requests (posted, not yet completed), in posting order.
    sq: VecDeque<usize>,
    rq: VecDeque<usize>,
    /// Receives the device holds (taken at the doorbell, not yet consumed by a send). The model
    /// keeps them through ERR and RESET as QEMU does (it records those states only).
    dev_rq: VecDeque<usize>,
    /// Safe receives whose buffers the driver keeps until the QP is destroyed.
    parked: Vec<usize>,
    /// `Semantics::Verbs`: the device moved this RC QP to ERROR (a request of it failed, or
    /// one to it did): its later sends and receives complete flushed, by the device.
    dev_err: bool,
    /// Its receives the device holds are flushed once the send queue's run ends (it failed
    /// as a requester).
    flush_rq: bool,
}

/// A send as it reaches the device.
#[derive(Clone, Debug)]
struct Resolved {
    kind: Kind,
    /// The bytes of the local gather list (an RDMA READ: what its target held before).
    payload: Vec<u8>,
    nsge: usize,
    bad_lkey: bool,
    remote_ok: bool,
    remote_off: usize,
    /// UD: (destination QPN, Q_Key as the device sees it).
    ud: Option<(u32, u32)>,
    imm: u32,
    raw: Option<usize>,
    buf: Option<u32>,
}

/// The QPs' path MTU in bytes (`ConnectedRtr`'s default, 1024).
const PATH_MTU: usize = 1024;

struct Ref {
    qemu: bool,
    /// `Semantics::Verbs`: failed RC requests move QPs to ERROR.
    strict: bool,
    qps: Vec<RQp>,
    wrs: Vec<Wr>,
    srq_dev: VecDeque<usize>,
    /// SRQ receives posted and not yet completed.
    srq_out: Vec<usize>,
    srq_max: u32,
    srq_sge: u32,
    shadow: Vec<u8>,
    next_wr: u64,
    /// Safe buffers inside QPs.
    in_qps: u32,
    /// Each CQ's ring as the device filled it: (QP, request) per CQE, oldest first. Entries of
    /// destroyed QPs and of requests already discarded are the driver's to drop.
    rings: Vec<VecDeque<(usize, usize)>>,
}

/// What the next completion of a poll must be.
#[derive(Clone, Copy, Debug)]
enum Next {
    /// The CQE at the head of CQ `.0`'s ring: QP `.1`, request `.2`.
    Hw(usize, usize, usize),
    /// A flush the driver makes (the ring is empty, a queue in ERR has requests left).
    Flush,
}

/// How a completion was polled.
#[derive(Clone, Copy, Debug)]
enum Via {
    /// `QueuePair::poll_one` of this QP.
    Qp(usize),
    /// `CompletionQueue::poll` or the cursor on this CQ.
    Cq(usize),
}

fn flush_wc(wr_id: u64, qpn: u32, recv: bool) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        qp_num: qpn,
        status: WcStatus::WrFlushErr,
        opcode: if recv { WcOpcode::Recv } else { WcOpcode::Send },
        ..WorkCompletion::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The harness: the driver's objects, typestate per QP

enum Slot<'a, T: Transport> {
    Rts(QueuePair<'a, P, T, Rts>),
    Err(QueuePair<'a, P, T, ErrState>),
    Reset(QueuePair<'a, P, T, Reset>),
    Gone,
}

enum AnyQp<'a> {
    Rc(Slot<'a, Rc>),
    Ud(Slot<'a, Ud>),
}

/// Runs `$body` with `$q` bound to the QP whatever its transport and state (None if gone).
macro_rules! any_state {
    ($qp:expr, |$q:ident| $body:expr) => {
        match $qp {
            AnyQp::Rc(Slot::Rts($q)) => Some($body),
            AnyQp::Rc(Slot::Err($q)) => Some($body),
            AnyQp::Rc(Slot::Reset($q)) => Some($body),
            AnyQp::Ud(Slot::Rts($q)) => Some($body),
            AnyQp::Ud(Slot::Err($q)) => Some($body),
            AnyQp::Ud(Slot::Reset($q)) => Some($body),
            AnyQp::Rc(Slot::Gone) | AnyQp::Ud(Slot::Gone) => None,
        }
    };
}

/// Runs `$body` with `$q` bound to the QP in RTS, whatever its transport.
macro_rules! rts {
    ($qp:expr, |$q:ident| $body:expr) => {
        match $qp {
            AnyQp::Rc(Slot::Rts($q)) => Some($body),
            AnyQp::Ud(Slot::Rts($q)) => Some($body),
            _ => None,
        }
    };
}

fn fail<T>(what: &str, e: Error) -> Result<T, String> {
    Err(format!("{what}: {e:?}"))
}

impl<'a, T: Transport> Slot<'a, T> {
    fn into_error(self) -> Result<Self, String> {
        match self {
            Slot::Rts(q) => q
                .to_error()
                .map(Slot::Err)
                .or_else(|(_, e)| fail("to_error", e)),
            Slot::Err(q) => q
                .to_error()
                .map(Slot::Err)
                .or_else(|(_, e)| fail("to_error", e)),
            Slot::Reset(q) => q
                .to_error()
                .map(Slot::Err)
                .or_else(|(_, e)| fail("to_error", e)),
            Slot::Gone => Ok(Slot::Gone),
        }
    }

    fn reset(self) -> Result<Self, String> {
        match self {
            Slot::Rts(q) => q
                .reset()
                .map(Slot::Reset)
                .or_else(|(_, e)| fail("reset", e)),
            Slot::Err(q) => q
                .reset()
                .map(Slot::Reset)
                .or_else(|(_, e)| fail("reset", e)),
            Slot::Reset(q) => q
                .reset()
                .map(Slot::Reset)
                .or_else(|(_, e)| fail("reset", e)),
            Slot::Gone => Ok(Slot::Gone),
        }
    }

    fn destroy(self) -> Result<(), String> {
        match self {
            Slot::Rts(q) => q.destroy().or_else(|(_, e)| fail("destroy", e)),
            Slot::Err(q) => q.destroy().or_else(|(_, e)| fail("destroy", e)),
            Slot::Reset(q) => q.destroy().or_else(|(_, e)| fail("destroy", e)),
            Slot::Gone => Ok(()),
        }
    }

    /// INIT after RESET: refused, the QP handed back in RESET.
    fn reinit(self, attr: &T::InitAttr) -> Result<Self, String> {
        match self {
            Slot::Reset(q) => match q.init(attr) {
                Ok(_) => Err("INIT after RESET accepted".into()),
                Err((q, e)) => {
                    let want = Error::Unsupported(Unsupported::Feature(Feature::ReinitAfterReset));
                    ensure_eq!(e, want, "INIT after RESET");
                    Ok(Slot::Reset(q))
                }
            },
            other => Ok(other),
        }
    }
}

fn payload(seq: u64, len: usize) -> Vec<u8> {
    let s = seq.wrapping_mul(0x2545_F491_4F6C_DD1D);
    (0..len)
        .map(|i| (s.rotate_left((i % 64) as u32) >> 7) as u8 ^ (i as u8).wrapping_mul(31))
        .collect()
}

/// `len` split into `n` gather entries.
fn split(len: usize, n: usize) -> Vec<usize> {
    match n {
        0 => vec![],
        1 => vec![len],
        n => {
            let part = len / n;
            let mut v = vec![part; n - 1];
            v.push(len - part * (n - 1));
            v
        }
    }
}

struct World<'a> {
    model: &'a Model,
    known_bugs: Bugs,
    cqs: &'a [CompletionQueue<'a, P>],
    pool: &'a BufferPool<'a, P>,
    pool2: &'a BufferPool<'a, P>,
    srq: &'a SharedReceiveQueue<'a, P>,
    ah: &'a AddressHandle<'a, P>,
    raw: MemoryRegion<'a, P>,
    rdma: MemoryRegion<'a, P>,
    raw_next: usize,
    qps: Vec<AnyQp<'a>>,
    /// Pool buffers the test holds, with the bytes they must still have.
    held: Vec<(Buf<'a, P>, Vec<u8>)>,
    seq: u64,
    r: Ref,
}

// The suite's parts (this file: the topology, the steps, the reference's and the harness's
// types, a session and the runs).
mod known_bugs;
mod reference;
mod strategy;
mod world;

use strategy::*;

/// Posts raw receives through `post_recv_raw` (`single`) or a batch, checking each result;
/// `posted` gets (wr_id, room, bad key, offset) of what was published.
fn post_recvs<T: Transport>(
    qp: &mut QueuePair<'_, P, T, Rts>,
    r: &mut Ref,
    q: usize,
    prepared: &[(&RecvItem, usize, usize, Vec<Sge>)],
    single: bool,
    finish: bool,
    posted: &mut Vec<(u64, usize, bool, usize)>,
) -> Result<(), String> {
    if single {
        let (it, room, off, sges) = &prepared[0];
        let wr_id = r.wr_id();
        let want = r.expect_rq_write(q, 0, sges.len());
        // SAFETY: fresh bytes of the raw region, untouched until the completion.
        let got = unsafe { qp.post_recv_raw(wr_id, sges) };
        ensure_eq!(got, want, "QP {q}: post_recv_raw");
        if got.is_ok() {
            posted.push((wr_id, *room, it.bad_lkey, *off));
        }
        return Ok(());
    }
    let mut b = qp.recv_batch();
    for (it, room, off, sges) in prepared {
        let wr_id = r.wr_id();
        let want = r.expect_rq_write(q, posted.len(), sges.len());
        // SAFETY: as above.
        let got = unsafe { b.recv(wr_id, sges) };
        ensure_eq!(got, want, "QP {q}: writing a receive");
        if got.is_ok() {
            posted.push((wr_id, *room, it.bad_lkey, *off));
        }
    }
    if finish {
        b.finish();
    } else {
        drop(b);
        posted.clear();
    }
    Ok(())
}

fn rc_init() -> ConnectedInit {
    ConnectedInit {
        access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..ConnectedInit::default()
    }
}

fn slots(n: u32) -> u32 {
    n.max(1).next_power_of_two()
}

// ---------------------------------------------------------------------------------------------
// One case

fn session(model: &Model, ctx: &Ctx, case: &Case, known_bugs: Bugs) -> Result<(), String> {
    let e = |what: &'static str| move |e: Error| format!("{what}: {e:?}");
    let gid = ctx
        .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
        .map_err(e("bind_gid"))?;
    let pd = ctx.alloc_pd().map_err(e("alloc_pd"))?;
    let srq_attr = SrqAttr {
        max_wr: case.srq_wr,
        max_sge: SGE_MAX,
        srq_limit: 0,
    };
    // Every CQ exactly as large as what its queues reserve.
    let srq_slots = slots(case.srq_wr);
    let mut need = [0u32; N_CQ];
    for (i, s) in TOPO.iter().enumerate() {
        need[s.scq] += slots(case.caps[i].0);
        need[s.rcq] += if s.srq {
            srq_slots
        } else {
            slots(case.caps[i].1)
        };
    }
    let cqs = need
        .iter()
        .map(|&n| ctx.create_cq(n))
        .collect::<Result<Vec<_>, _>>()
        .map_err(e("create_cq"))?;
    let srq = pd.create_srq(srq_attr).map_err(e("create_srq"))?;
    ensure_eq!(srq.attr().max_wr, srq_slots, "SRQ max_wr");
    let pool = pd.buffer_pool(POOL_N, BUF).map_err(e("buffer_pool"))?;
    let pool2 = pd.buffer_pool(2, 64).map_err(e("buffer_pool"))?;
    let raw = pd
        .register(RAW_LEN, AccessFlags::LOCAL_WRITE)
        .map_err(e("register"))?;
    let rdma = pd
        .register(
            RDMA_LEN,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .map_err(e("register"))?;
    let ah = pd
        .create_ah(&AddressVector::new(gid.gid(), 0))
        .map_err(e("create_ah"))?;

    // The QPs, in RESET, then up.
    let mut built = Vec::new();
    for (i, s) in TOPO.iter().enumerate() {
        let mut b = pd
            .qp_builder(&cqs[s.scq], &cqs[s.rcq])
            .caps(QpCaps {
                max_send_wr: case.caps[i].0,
                max_recv_wr: case.caps[i].1,
                max_send_sge: SGE_MAX,
                max_recv_sge: SGE_MAX,
                max_inline_data: 0,
            })
            .sq_sig_all(case.sig_all[i]);
        if s.safe {
            b = b.pool(&pool);
        }
        if s.srq {
            b = b.srq(&srq);
        }
        built.push(if s.ud {
            AnyQp::Ud(Slot::Reset(b.build::<Ud>().map_err(e("build UD"))?))
        } else {
            AnyQp::Rc(Slot::Reset(b.build::<Rc>().map_err(e("build RC"))?))
        });
    }
    let qpns: Vec<u32> = built
        .iter()
        .map(|q| any_state!(q, |q| q.qp_num()).expect("built"))
        .collect();
    let mut rqps = Vec::new();
    let mut qps = Vec::new();
    for (i, q) in built.into_iter().enumerate() {
        let caps = any_state!(&q, |q| q.caps()).expect("built");
        let want = QpCaps {
            max_send_wr: slots(case.caps[i].0),
            max_recv_wr: if TOPO[i].srq {
                0
            } else {
                slots(case.caps[i].1)
            },
            max_send_sge: SGE_MAX,
            max_recv_sge: if TOPO[i].srq { 0 } else { SGE_MAX },
            max_inline_data: 0,
        };
        ensure_eq!(caps, want, "QP {i} caps");
        let up = match q {
            AnyQp::Rc(Slot::Reset(q)) => {
                let av = AddressVector::new(gid.gid(), 0);
                let q = q.init(&rc_init()).map_err(|(_, x)| x).map_err(e("init"))?;
                let rtr = ConnectedRtr::new(qpns[TOPO[i].peer], 0, av);
                let q = q.rtr(&rtr).map_err(|(_, x)| x).map_err(e("rtr"))?;
                let q = q
                    .rts(&ConnectedRts::new(0))
                    .map_err(|(_, x)| x)
                    .map_err(e("rts"))?;
                AnyQp::Rc(Slot::Rts(q))
            }
            AnyQp::Ud(Slot::Reset(q)) => {
                let q = q.ready(QKEY, 0).map_err(|(_, x)| x).map_err(e("ready"))?;
                AnyQp::Ud(Slot::Rts(q))
            }
            _ => unreachable!(),
        };
        qps.push(up);
        rqps.push(RQp {
            st: St::Rts,
            qpn: qpns[i],
            caps,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            dev_rq: VecDeque::new(),
            parked: Vec::new(),
            dev_err: false,
            flush_rq: false,
        });
    }

    let mut w = World {
        model,
        known_bugs,
        cqs: &cqs,
        pool: &pool,
        pool2: &pool2,
        srq: &srq,
        ah: &ah,
        raw,
        rdma,
        raw_next: 0,
        qps,
        held: Vec::new(),
        seq: 0,
        r: Ref {
            qemu: model.config().semantics == Semantics::Qemu,
            strict: model.config().semantics == Semantics::Verbs,
            qps: rqps,
            wrs: Vec::new(),
            srq_dev: VecDeque::new(),
            srq_out: Vec::new(),
            srq_max: srq_slots,
            srq_sge: SGE_MAX,
            shadow: vec![0; RDMA_LEN],
            next_wr: 0,
            in_qps: 0,
            rings: vec![VecDeque::new(); N_CQ],
        },
    };
    w.invariants()?;
    for (i, s) in case.steps.iter().enumerate() {
        w.step(s)
            .and_then(|()| w.invariants())
            .map_err(|m| format!("step {i} {s:?}: {m}"))?;
    }

    // The end: drain, destroy everything, nothing left anywhere.
    w.drain().map_err(|m| format!("final drain: {m}"))?;
    w.invariants()
        .map_err(|m| format!("after the final drain: {m}"))?;
    for q in 0..N_QP {
        w.transition(q, St::Gone)?;
        w.invariants()
            .map_err(|m| format!("after destroying QP {q}: {m}"))?;
    }
    for cq in 0..N_CQ {
        let k = w.poll_cq(cq, 16)?;
        ensure_eq!(k, 0, "CQ {cq}: completions after every QP was destroyed");
    }
    ensure_eq!(w.r.in_qps, 0, "buffers still in QPs (reference)");
    w.held.clear();
    ensure_eq!(pool.free_count(), POOL_N, "pool.free_count() at the end");
    ensure_eq!(model.objects().qps, 0, "QPs left on the device");
    drop(w);
    drop(pool);
    drop(pool2);
    drop(srq);
    drop(cqs);
    drop(ah);
    drop(pd);
    drop(gid);
    let o = model.objects();
    ensure_eq!(
        (o.pds, o.cqs, o.qps, o.srqs, o.mrs, o.gids),
        (0, 0, 0, 0, 0, 0),
        "objects left on the device"
    );
    Ok(())
}

fn run_case(sem: Semantics, case: &Case, known_bugs: Bugs) -> Result<(), String> {
    let model = Model::new(ModelConfig {
        semantics: sem,
        ..ModelConfig::default()
    });
    let ctx = up(&model);
    let r = session(&model, &ctx, case, known_bugs);
    drop(ctx);
    r?;
    ensure_eq!(model.outstanding_pages(), 0, "DMA pages leaked");
    ensure!(!model.active(), "device not reset at teardown");
    let v = model.violations();
    ensure!(v.is_empty(), "model violations at teardown: {v:#?}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The properties

/// Cases per semantics unless `PROPTEST_CASES` says otherwise.
const DEFAULT_CASES: u32 = 2000;

/// Which once-buggy operations the generated steps may use (`PROPS_KNOWN_BUGS`: `all`, the
/// default, or `1`, or a comma-separated list of `late-recv`, `srq-credit`; anything else,
/// e.g. `none`, skips them).
#[derive(Clone, Copy, Debug, Default)]
struct Bugs {
    late_recv: bool,
    srq_credit: bool,
}

impl Bugs {
    fn from_env() -> Self {
        let v = std::env::var("PROPS_KNOWN_BUGS").unwrap_or_else(|_| "all".into());
        let on = |name: &str| v == "1" || v == "all" || v.split(',').any(|x| x.trim() == name);
        Bugs {
            late_recv: on("late-recv"),
            srq_credit: on("srq-credit"),
        }
    }
}

fn run(sem: Semantics, salt: u8) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let seed: u64 = std::env::var("PROPS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED_B4E5);
    let mut bytes = [salt; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let known_bugs = Bugs::from_env();
    let config = PtConfig {
        cases,
        failure_persistence: None,
        ..PtConfig::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let result = runner.run(&case(), |c| {
        run_case(sem, &c, known_bugs).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{sem:?} semantics, seed {seed}: {e}");
    }
}

#[test]
fn verbs_contract_verbs_semantics() {
    // The strict verbs: a failed RC request moves its QP (and, for a fault the responder
    // found, the responder) to ERROR, whose later requests and receives the device flushes.
    run(Semantics::Verbs, 1);
}

#[test]
fn verbs_contract_loose_verbs_semantics() {
    // The model's looser verbs: a failed request leaves both QPs as they were.
    run(Semantics::LooseVerbs, 3);
}

#[test]
fn verbs_contract_qemu_semantics() {
    run(Semantics::Qemu, 2);
}
