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

fn sges() -> impl Strategy<Value = u8> {
    prop_oneof![6 => 1u8..=2, 1 => Just(0u8), 1 => Just(3u8)]
}

fn send_item() -> impl Strategy<Value = SendItem> {
    let kind = prop_oneof![
        4 => Just(Kind::Send),
        1 => Just(Kind::SendImm),
        1 => Just(Kind::Write),
        1 => Just(Kind::WriteImm),
        1 => Just(Kind::Read),
    ];
    let len = prop_oneof![3 => 0u16..=16, 3 => 0u16..=256, 1 => 200u16..=320];
    let remote = prop_oneof![
        6 => Just(Remote::Good),
        1 => Just(Remote::BadKey),
        1 => Just(Remote::OutOfRange),
    ];
    let to = prop_oneof![
        3 => Just(UdTo::U0),
        3 => Just(UdTo::U1),
        1 => Just(UdTo::Rc0),
        1 => Just(UdTo::Nowhere),
    ];
    let qkey = prop_oneof![4 => Just(Qkey::Right), 1 => Just(Qkey::Wrong), 2 => Just(Qkey::Own)];
    (
        kind,
        len,
        sges(),
        prop::bool::weighted(0.1),
        remote,
        any::<u16>(),
        to,
        qkey,
        any::<u32>(),
        0u8..8,
    )
        .prop_map(
            |(kind, len, sges, bad_lkey, remote, off, to, qkey, imm, flags)| SendItem {
                kind,
                len,
                sges,
                bad_lkey,
                remote,
                off,
                to,
                qkey,
                imm,
                flags,
            },
        )
}

fn recv_item() -> impl Strategy<Value = RecvItem> {
    let room = prop_oneof![2 => 0u16..=64, 3 => 0u16..=320, 3 => Just(320u16)];
    (room, sges(), prop::bool::weighted(0.1)).prop_map(|(room, sges, bad_lkey)| RecvItem {
        room,
        sges,
        bad_lkey,
    })
}

/// A QP for a safe-path step: mostly one built with the pool.
fn safe_qp() -> impl Strategy<Value = usize> {
    prop_oneof![4 => prop::sample::select(vec![0usize, 1, 4, 6]), 1 => 0..N_QP]
}

fn step() -> impl Strategy<Value = Step> {
    let qp = 0..N_QP;
    let cq = 0..N_CQ;
    let to = prop_oneof![
        Just(UdTo::U0),
        Just(UdTo::U1),
        Just(UdTo::Rc0),
        Just(UdTo::Nowhere)
    ];
    let qkey = prop_oneof![4 => Just(Qkey::Right), 1 => Just(Qkey::Wrong), 1 => Just(Qkey::Own)];
    prop_oneof![
        8 => (qp.clone(), prop::collection::vec(send_item(), 1..=4), prop::bool::weighted(0.85))
            .prop_map(|(qp, items, finish)| Step::RawSend { qp, items, finish }),
        8 => (qp.clone(), prop::collection::vec(recv_item(), 1..=4), prop::bool::weighted(0.85), any::<bool>())
            .prop_map(|(qp, items, finish, single)| Step::RawRecv { qp, items, finish, single }),
        6 => (safe_qp(), 0u16..=256, to, qkey, any::<bool>(), prop::bool::weighted(0.05))
            .prop_map(|(qp, len, to, qkey, reuse, no_dest)| Step::SafeSend { qp, len, to, qkey, reuse, no_dest }),
        7 => (safe_qp(), any::<bool>()).prop_map(|(qp, reuse)| Step::SafeRecv { qp, reuse }),
        4 => prop::collection::vec(recv_item(), 0..=3).prop_map(|items| Step::SrqRecv { items }),
        8 => (qp.clone(), 1u8..=4, any::<bool>()).prop_map(|(qp, max, keep)| Step::PollQp { qp, max, keep }),
        6 => (cq.clone(), 1u8..=8).prop_map(|(cq, n)| Step::PollCq { cq, n }),
        4 => (cq, 1u8..=4).prop_map(|(cq, max)| Step::Cursor { cq, max }),
        1 => Just(Step::Drain),
        1 => qp.clone().prop_map(|qp| Step::ToError { qp }),
        1 => qp.clone().prop_map(|qp| Step::Reset { qp }),
        1 => qp.clone().prop_map(|qp| Step::Destroy { qp }),
        1 => qp.clone().prop_map(|qp| Step::Reinit { qp }),
        1 => Just(Step::Hold),
        1 => any::<u8>().prop_map(|i| Step::Release { i }),
        1 => (qp, any::<bool>()).prop_map(|(qp, send)| Step::Foreign { qp, send }),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((1u32..=6, 1u32..=6), N_QP),
        prop::collection::vec(any::<bool>(), N_QP),
        1u32..=8,
        prop::collection::vec(step(), 1..=MAX_STEPS),
    )
        .prop_map(|(caps, sig_all, srq_wr, steps)| Case {
            caps,
            sig_all,
            srq_wr,
            steps,
        })
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

impl Ref {
    fn wr_id(&mut self) -> u64 {
        // Distinct (an odd multiplier is a bijection) and using all 64 bits.
        self.next_wr += 1;
        self.next_wr.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    fn qp_by_qpn(&self, qpn: u32) -> Option<usize> {
        self.qps
            .iter()
            .position(|q| q.qpn == qpn && q.st != St::Gone)
    }

    /// What writing send request number `pending` of a batch must give.
    fn expect_sq_write(&self, q: usize, pending: usize, nsge: usize) -> Result<(), Error> {
        let p = &self.qps[q];
        if p.sq.len() + pending >= p.caps.max_send_wr as usize {
            return Err(Error::QueueFull {
                queue: Queue::Send,
                free: 0,
            });
        }
        if nsge > p.caps.max_send_sge as usize {
            return Err(Error::InvalidInput {
                param: Param::NumSge,
                value: nsge as u64,
                max: p.caps.max_send_sge.into(),
            });
        }
        Ok(())
    }

    fn expect_rq_write(&self, q: usize, pending: usize, nsge: usize) -> Result<(), Error> {
        let p = &self.qps[q];
        let full = Error::QueueFull {
            queue: Queue::Recv,
            free: 0,
        };
        if TOPO[q].srq || p.rq.len() + pending >= p.caps.max_recv_wr as usize {
            return Err(full);
        }
        if nsge > p.caps.max_recv_sge as usize {
            return Err(Error::InvalidInput {
                param: Param::NumSge,
                value: nsge as u64,
                max: p.caps.max_recv_sge.into(),
            });
        }
        Ok(())
    }

    /// Whether a send to `j` would consume a receive the driver already completed or
    /// discarded (the device still holds it: see `late_receive_*` below).
    fn late_risk(&self, j: usize) -> bool {
        !TOPO[j].srq
            && self.qps[j]
                .dev_rq
                .front()
                .is_some_and(|&w| self.wrs[w].done)
    }

    fn post_recv(
        &mut self,
        q: usize,
        wr_id: u64,
        room: u32,
        bad_lkey: bool,
        raw: Option<usize>,
        buf: Option<u32>,
    ) {
        let w = self.wrs.len();
        self.wrs.push(Wr {
            wq: if q == usize::MAX { Wq::Srq } else { Wq::Rq },
            wr_id,
            buf,
            room,
            bad_lkey,
            raw,
            exec: None,
            done: false,
            parked: false,
        });
        if buf.is_some() {
            self.in_qps += 1;
        }
        if q == usize::MAX {
            self.srq_out.push(w);
            self.srq_dev.push_back(w);
        } else {
            self.qps[q].rq.push_back(w);
            self.qps[q].dev_rq.push_back(w);
            if self.qps[q].dev_err {
                // Taken at the doorbell by a QP in ERROR: flushed there.
                self.flush_dev_rq(q);
            }
        }
    }

    fn pop_recv(&mut self, j: usize) -> Option<usize> {
        if TOPO[j].srq {
            self.srq_dev.pop_front()
        } else {
            self.qps[j].dev_rq.pop_front()
        }
    }

    /// A receive executed: its CQE goes to its consumer's receive CQ.
    fn deliver(&mut self, r: usize, e: Exec) {
        let q = e.consumer;
        self.wrs[r].exec = Some(e);
        self.rings[TOPO[q].rcq].push_back((q, r));
    }

    /// A send published at the doorbell: the model runs it there and then.
    fn post_send(&mut self, q: usize, wr_id: u64, s: &Resolved) {
        let w = self.wrs.len();
        self.wrs.push(Wr {
            wq: Wq::Sq,
            wr_id,
            buf: s.buf,
            room: 0,
            bad_lkey: false,
            raw: s.raw,
            exec: None,
            done: false,
            parked: false,
        });
        if s.buf.is_some() {
            self.in_qps += 1;
        }
        self.qps[q].sq.push_back(w);
        let e = self.execute(q, wr_id, s);
        self.wrs[w].exec = Some(e);
        self.rings[TOPO[q].scq].push_back((q, w));
    }

    /// The model's run of one send WQE (tests/model/src/datapath.rs), as the reference sees
    /// it: flushed on a QP the device moved to ERROR, else executed; a failed RC request
    /// moves its QP to ERROR (`Semantics::Verbs`).
    fn execute(&mut self, q: usize, wr_id: u64, s: &Resolved) -> Exec {
        if self.qps[q].dev_err {
            let op = match s.kind {
                Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
                Kind::Read => WcOpcode::RdmaRead,
                Kind::Send | Kind::SendImm => WcOpcode::Send,
            };
            return Exec {
                wc: WorkCompletion {
                    opcode: op,
                    ..flush_wc(wr_id, self.qps[q].qpn, false)
                },
                vendor_err: 0,
                consumer: q,
                data: None,
                grh: false,
            };
        }
        let e = self.run(q, wr_id, s);
        if e.wc.status != WcStatus::Success {
            self.enter_error(q, false);
        }
        e
    }

    /// `Semantics::Verbs`: RC QP `q` goes to ERROR (the model's `enter_error`); a responder's
    /// receives the device holds are flushed at once, a requester's when its send queue's run
    /// ends ([`end_run`](Self::end_run)).
    fn enter_error(&mut self, q: usize, responder: bool) {
        if !self.strict || TOPO[q].ud {
            return;
        }
        self.qps[q].dev_err = true;
        if responder {
            self.flush_dev_rq(q);
        } else {
            self.qps[q].flush_rq = true;
        }
    }

    /// Completes every receive QP `q`'s device holds (not its SRQ's) as flushed.
    fn flush_dev_rq(&mut self, q: usize) {
        self.qps[q].flush_rq = false;
        let qpn = self.qps[q].qpn;
        while let Some(r) = self.qps[q].dev_rq.pop_front() {
            let wc = flush_wc(self.wrs[r].wr_id, qpn, true);
            self.deliver(
                r,
                Exec {
                    wc,
                    vendor_err: 0,
                    consumer: q,
                    data: None,
                    grh: false,
                },
            );
        }
    }

    /// The end of a send doorbell's run on QP `q`: a requester that failed in it has its
    /// receives flushed now (the order rxe flushes in).
    fn end_run(&mut self, q: usize) {
        if self.qps[q].flush_rq {
            self.flush_dev_rq(q);
        }
    }

    /// The model's `execute` (tests/model/src/datapath.rs), as the reference sees it.
    fn run(&mut self, q: usize, wr_id: u64, s: &Resolved) -> Exec {
        let me = self.qps[q].qpn;
        let kind = if self.qemu { Kind::Send } else { s.kind };
        let sender = |status: WcStatus, opcode: WcOpcode, byte_len: u32| Exec {
            wc: WorkCompletion {
                wr_id,
                byte_len,
                qp_num: me,
                status,
                opcode,
                ..WorkCompletion::default()
            },
            vendor_err: if status == WcStatus::Success {
                0
            } else {
                0x201
            },
            consumer: q,
            data: None,
            grh: false,
        };
        // The gather list (an RDMA READ gathers nothing).
        let data = if kind == Kind::Read {
            Vec::new()
        } else if s.bad_lkey && s.nsge > 0 {
            // With the completion opcode of the work request, as rxe gives it.
            let op = match kind {
                Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
                _ => WcOpcode::Send,
            };
            return sender(WcStatus::LocProtErr, op, 0);
        } else {
            s.payload.clone()
        };
        // The destination.
        let (dest, ud) = match s.ud {
            Some((qpn, qkey)) => match self.qp_by_qpn(qpn) {
                Some(j) if TOPO[j].ud && qkey == QKEY => (j, true),
                // Nowhere, not UD, wrong Q_Key: dropped on the wire.
                _ => return sender(WcStatus::Success, WcOpcode::Send, data.len() as u32),
            },
            None => {
                let j = TOPO[q].peer;
                if self.qps[j].st == St::Gone {
                    return sender(WcStatus::RetryExcErr, WcOpcode::Send, 0);
                }
                if self.qps[j].dev_err {
                    // A responder in ERROR drops every request: the retries run out.
                    let op = match kind {
                        Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
                        Kind::Read => WcOpcode::RdmaRead,
                        Kind::Send | Kind::SendImm => WcOpcode::Send,
                    };
                    return sender(WcStatus::RetryExcErr, op, 0);
                }
                (j, false)
            }
        };
        let dest_qpn = self.qps[dest].qpn;
        let len = data.len();
        match kind {
            Kind::Write | Kind::WriteImm => {
                let has_recv = if TOPO[dest].srq {
                    !self.srq_dev.is_empty()
                } else {
                    !self.qps[dest].dev_rq.is_empty()
                };
                if self.strict && kind == Kind::WriteImm && len <= PATH_MTU && !has_recv {
                    // A one-packet WRITE with immediate: rxe checks for the receive (RNR)
                    // before the key (a longer one has its key checked by its first packet).
                    return sender(WcStatus::RnrRetryExcErr, WcOpcode::RdmaWrite, 0);
                }
                if !s.remote_ok {
                    self.enter_error(dest, true);
                    return sender(WcStatus::RemAccessErr, WcOpcode::RdmaWrite, 0);
                }
                if kind == Kind::WriteImm {
                    let Some(r) = self.pop_recv(dest) else {
                        return sender(WcStatus::RnrRetryExcErr, WcOpcode::RdmaWrite, 0);
                    };
                    self.deliver(
                        r,
                        Exec {
                            wc: WorkCompletion {
                                wr_id: self.wrs[r].wr_id,
                                byte_len: len as u32,
                                imm: s.imm,
                                qp_num: dest_qpn,
                                src_qp: me,
                                status: WcStatus::Success,
                                opcode: WcOpcode::RecvRdmaWithImm,
                                flags: WcFlags::WITH_IMM,
                            },
                            vendor_err: 0,
                            consumer: dest,
                            data: None,
                            grh: false,
                        },
                    );
                }
                self.shadow[s.remote_off..s.remote_off + len].copy_from_slice(&data);
                sender(WcStatus::Success, WcOpcode::RdmaWrite, len as u32)
            }
            Kind::Read => {
                let len = s.payload.len();
                if !s.remote_ok {
                    self.enter_error(dest, true);
                    return sender(WcStatus::RemAccessErr, WcOpcode::RdmaRead, 0);
                }
                if s.bad_lkey && len > 0 {
                    return sender(WcStatus::LocProtErr, WcOpcode::RdmaRead, 0);
                }
                let bytes = self.shadow[s.remote_off..s.remote_off + len].to_vec();
                Exec {
                    data: Some(bytes),
                    ..sender(WcStatus::Success, WcOpcode::RdmaRead, len as u32)
                }
            }
            Kind::Send | Kind::SendImm => {
                let Some(r) = self.pop_recv(dest) else {
                    return match ud {
                        true => sender(WcStatus::Success, WcOpcode::Send, len as u32),
                        false => sender(WcStatus::RnrRetryExcErr, WcOpcode::Send, 0),
                    };
                };
                let plen = len + if ud { GRH } else { 0 };
                let (room, bad) = (self.wrs[r].room as usize, self.wrs[r].bad_lkey);
                let recv_err = if room < plen {
                    Some(WcStatus::LocLenErr)
                } else if bad && plen > 0 {
                    Some(WcStatus::LocProtErr)
                } else {
                    None
                };
                let r_id = self.wrs[r].wr_id;
                match recv_err {
                    Some(st) => {
                        self.deliver(
                            r,
                            Exec {
                                wc: WorkCompletion {
                                    wr_id: r_id,
                                    qp_num: dest_qpn,
                                    src_qp: me,
                                    status: st,
                                    opcode: WcOpcode::Recv,
                                    ..WorkCompletion::default()
                                },
                                vendor_err: 0x201,
                                consumer: dest,
                                data: None,
                                grh: false,
                            },
                        );
                        self.enter_error(dest, true);
                        sender(WcStatus::RemInvReqErr, WcOpcode::Send, 0)
                    }
                    None => {
                        let mut flags = WcFlags::empty();
                        // QEMU passes rxe's completion through: GRH on RC receives too.
                        if ud || self.qemu {
                            flags |= WcFlags::GRH;
                        }
                        if kind == Kind::SendImm {
                            flags |= WcFlags::WITH_IMM;
                        }
                        let imm = if flags.contains(WcFlags::WITH_IMM) {
                            s.imm
                        } else {
                            0
                        };
                        self.deliver(
                            r,
                            Exec {
                                wc: WorkCompletion {
                                    wr_id: r_id,
                                    byte_len: plen as u32,
                                    imm,
                                    qp_num: dest_qpn,
                                    // ... and source QP 0 on RC receives.
                                    src_qp: if self.qemu && !ud { 0 } else { me },
                                    status: WcStatus::Success,
                                    opcode: WcOpcode::Recv,
                                    flags,
                                },
                                vendor_err: 0,
                                consumer: dest,
                                data: Some(data),
                                grh: ud,
                            },
                        );
                        sender(WcStatus::Success, WcOpcode::Send, len as u32)
                    }
                }
            }
        }
    }

    /// Whether a queue in ERR on CQ `c` (of QP `only`, if given) has a request to flush.
    fn flush_due(&self, c: usize, only: Option<usize>) -> bool {
        let unexecuted =
            |f: &VecDeque<usize>| f.front().is_some_and(|&w| self.wrs[w].exec.is_none());
        self.qps.iter().enumerate().any(|(p, x)| {
            x.st == St::Err
                && only.is_none_or(|q| q == p)
                && ((TOPO[p].scq == c && unexecuted(&x.sq))
                    || (TOPO[p].rcq == c && !TOPO[p].srq && unexecuted(&x.rq)))
        })
    }

    /// The next completion `CompletionQueue::poll` must give on CQ `c` (dropping the CQEs
    /// nobody gets, as the driver does).
    fn next_on_cq(&mut self, c: usize) -> Option<Next> {
        while let Some(&(p, w)) = self.rings[c].front() {
            if self.qps[p].st != St::Gone && !self.wrs[w].done {
                return Some(Next::Hw(c, p, w));
            }
            self.rings[c].pop_front();
        }
        self.flush_due(c, None).then_some(Next::Flush)
    }

    /// The next completion `poll_one` of QP `q` must give: from its send CQ, then its receive
    /// CQ, each up to the first CQE of another QP (left for that QP's poll).
    fn next_on_qp(&mut self, q: usize) -> Option<Next> {
        let (s, r) = (TOPO[q].scq, TOPO[q].rcq);
        for c in if s == r { vec![s] } else { vec![s, r] } {
            while let Some(&(p, w)) = self.rings[c].front() {
                if p != q || !self.wrs[w].done {
                    break;
                }
                self.rings[c].pop_front();
            }
            match self.rings[c].front() {
                Some(&(p, w)) if p == q => return Some(Next::Hw(c, p, w)),
                Some(_) => {}
                None if self.flush_due(c, Some(q)) => return Some(Next::Flush),
                None => {}
            }
        }
        None
    }

    /// Checks a completion the driver returned; gives the request it completes.
    fn complete(
        &mut self,
        wc: &WorkCompletion,
        vendor_err: Option<u32>,
        via: Via,
    ) -> Result<usize, String> {
        let next = match via {
            Via::Qp(q) => self.next_on_qp(q),
            Via::Cq(c) => self.next_on_cq(c),
        };
        match next {
            None => return Err(format!("{via:?}: a completion when none was due: {wc:?}")),
            Some(Next::Hw(c, p, w)) => {
                ensure_eq!(
                    (wc.qp_num, wc.wr_id),
                    (self.qps[p].qpn, self.wrs[w].wr_id),
                    "{via:?}: not the CQE at the head of CQ {c} ({wc:?})"
                );
                self.rings[c].pop_front();
            }
            Some(Next::Flush) => ensure_eq!(
                wc.status,
                WcStatus::WrFlushErr,
                "{via:?}: the ring is empty, only a flush is due ({wc:?})"
            ),
        }
        let q = self
            .qp_by_qpn(wc.qp_num)
            .ok_or_else(|| format!("completion for no live QP: {wc:?}"))?;
        let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        if let Via::Cq(c) = via {
            let want = if recv { TOPO[q].rcq } else { TOPO[q].scq };
            ensure!(
                c == want,
                "completion of QP {q} on CQ {c}, not its CQ {want}: {wc:?}"
            );
        }
        let w = if recv && TOPO[q].srq {
            let pos = self
                .srq_out
                .iter()
                .position(|&w| self.wrs[w].wr_id == wc.wr_id)
                .ok_or_else(|| format!("SRQ completion for no outstanding SRQ request: {wc:?}"))?;
            self.srq_out.remove(pos)
        } else {
            let fifo = if recv {
                &mut self.qps[q].rq
            } else {
                &mut self.qps[q].sq
            };
            let Some(&head) = fifo.front() else {
                return Err(format!(
                    "completion on QP {q} ({}) with nothing outstanding: {wc:?}",
                    if recv { "RQ" } else { "SQ" }
                ));
            };
            ensure_eq!(
                wc.wr_id,
                self.wrs[head].wr_id,
                "QP {q}: completion out of posting order ({wc:?})"
            );
            fifo.pop_front();
            head
        };
        let st = self.qps[q].st;
        let wr = &mut self.wrs[w];
        let (want, want_vendor) = match &wr.exec {
            Some(e) => {
                ensure_eq!(e.consumer, q, "completion on the wrong QP");
                (e.wc, e.vendor_err)
            }
            None => {
                ensure!(
                    st == St::Err && wr.wq != Wq::Srq,
                    "QP {q} ({st:?}): completion of a request the device never executed: {wc:?}"
                );
                (flush_wc(wr.wr_id, wc.qp_num, recv), 0)
            }
        };
        ensure_eq!(*wc, want, "QP {q}: work completion");
        if let Some(v) = vendor_err {
            ensure_eq!(v, want_vendor, "QP {q}: vendor_err of {wc:?}");
        }
        // The device took every published receive at its doorbell (the model, as QEMU).
        let held = recv && wr.exec.is_none() && wr.wq == Wq::Rq;
        let wr = &mut self.wrs[w];
        wr.done = true;
        if wr.buf.is_some() {
            if held {
                // Flushed while the device holds it: parked until the QP is destroyed.
                wr.parked = true;
                self.qps[q].parked.push(w);
            } else {
                self.in_qps -= 1;
            }
        }
        Ok(w)
    }

    /// RESET or destroy: outstanding requests are dropped without completions.
    fn discard(&mut self, q: usize) {
        // The QP's CQEs still in the rings go with it (the driver removes them): the requests
        // they completed are done, their buffers free.
        let mut completed = Vec::new();
        for ring in &mut self.rings {
            ring.retain(|&(p, w)| {
                if p == q {
                    completed.push(w);
                }
                p != q
            });
        }
        // SRQ receives among them: completed for the SRQ, never to be polled.
        for &w in &completed {
            if self.wrs[w].wq == Wq::Srq {
                self.wrs[w].done = true;
                self.srq_out.retain(|&x| x != w);
            }
        }
        let p = &mut self.qps[q];
        let ws: Vec<usize> = p.sq.drain(..).chain(p.rq.drain(..)).collect();
        for w in ws {
            self.wrs[w].done = true;
            if self.wrs[w].buf.is_some() {
                if self.wrs[w].wq == Wq::Rq && !completed.contains(&w) {
                    // Discarded after the device took it (at its doorbell; its completion, if
                    // any, is discarded too): parked until the QP is destroyed.
                    self.wrs[w].parked = true;
                    self.qps[q].parked.push(w);
                } else {
                    self.in_qps -= 1;
                }
            }
        }
    }

    fn on_destroy(&mut self, q: usize) {
        self.discard(q);
        // The device dropped the QP: the parked buffers come back.
        for w in std::mem::take(&mut self.qps[q].parked) {
            self.wrs[w].parked = false;
            self.in_qps -= 1;
        }
        self.qps[q].dev_rq.clear();
        self.qps[q].st = St::Gone;
        // SRQ receives it consumed whose completions were not polled: gone with its CQEs.
        let wrs = &mut self.wrs;
        self.srq_out.retain(|&w| {
            let lost = wrs[w].exec.as_ref().is_some_and(|e| e.consumer == q);
            if lost {
                wrs[w].done = true;
            }
            !lost
        });
    }

    /// After every CQ was polled empty: nothing that should have completed is left.
    fn check_drained(&self) -> Result<(), String> {
        for (q, p) in self.qps.iter().enumerate() {
            if p.st == St::Gone {
                continue;
            }
            ensure!(
                p.sq.is_empty(),
                "QP {q} ({:?}): sends never completed: {:?}",
                p.st,
                p.sq.iter().map(|&w| &self.wrs[w]).collect::<Vec<_>>()
            );
            if p.st == St::Err {
                ensure!(
                    p.rq.is_empty(),
                    "QP {q} in ERR: receives never flushed: {:?}",
                    p.rq.iter().map(|&w| &self.wrs[w]).collect::<Vec<_>>()
                );
            }
            for &w in &p.rq {
                ensure!(
                    self.wrs[w].exec.is_none(),
                    "QP {q}: receive executed but its completion never came: {:?}",
                    self.wrs[w]
                );
            }
        }
        for &w in &self.srq_out {
            ensure!(
                self.wrs[w].exec.is_none(),
                "SRQ receive executed but its completion never came: {:?}",
                self.wrs[w]
            );
        }
        Ok(())
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

impl<'a> World<'a> {
    fn raw_alloc(&mut self, len: usize) -> usize {
        let off = self.raw_next;
        self.raw_next += len.next_multiple_of(64).max(64);
        assert!(
            self.raw_next <= RAW_LEN,
            "raw region too small for the steps"
        );
        off
    }

    fn seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Raw gather/scatter entries over `len` fresh bytes (filled with `fill`).
    fn raw_sges(&mut self, len: usize, n: usize, bad_lkey: bool, fill: &[u8]) -> (usize, Vec<Sge>) {
        let off = self.raw_alloc(len);
        self.raw.as_mut_slice()[off..off + fill.len()].copy_from_slice(fill);
        let (addr, lkey) = (
            self.raw.addr(),
            self.raw.lkey() ^ if bad_lkey { BAD_KEY } else { 0 },
        );
        let mut at = off;
        let sges = split(len, n)
            .into_iter()
            .map(|l| {
                let s = Sge {
                    addr: addr + at as u64,
                    length: l as u32,
                    lkey,
                };
                at += l;
                s
            })
            .collect();
        (off, sges)
    }

    fn expected_free(&self) -> u32 {
        POOL_N - self.held.len() as u32 - self.r.in_qps
    }

    /// A pool buffer for a post: a held one (`reuse`) or a new one; None when the pool is
    /// empty (checked against the reference).
    fn take_buf(&mut self, reuse: bool) -> Result<Option<Buf<'a, P>>, String> {
        if reuse && !self.held.is_empty() {
            return Ok(Some(self.held.remove(0).0));
        }
        let b = self.pool.alloc();
        ensure_eq!(
            b.is_none(),
            self.expected_free() == 0,
            "pool.alloc() with {} buffers expected free",
            self.expected_free()
        );
        Ok(b)
    }

    fn ud_target(&self, to: UdTo, qkey: Qkey) -> (u32, u32, u32) {
        let qpn = match to {
            UdTo::U0 => self.r.qps[4].qpn,
            UdTo::U1 => self.r.qps[5].qpn,
            UdTo::Rc0 => self.r.qps[0].qpn,
            UdTo::Nowhere => NOWHERE,
        };
        let (given, seen) = match qkey {
            Qkey::Right => (QKEY, QKEY),
            Qkey::Wrong => (BAD_QKEY, BAD_QKEY),
            Qkey::Own => (0x8000_0000, QKEY),
        };
        (qpn, given, seen)
    }

    /// The QP a send of QP `q` reaches (None: no QP).
    fn dest_of(&self, q: usize, ud: Option<u32>) -> Option<usize> {
        match ud {
            Some(qpn) => self.r.qp_by_qpn(qpn),
            None => Some(TOPO[q].peer),
        }
    }

    /// Whether a send to these destinations is to be skipped (known driver bug, see the top).
    fn skip_late(&self, q: usize, dests: &[Option<u32>]) -> bool {
        !self.known_bugs.late_recv
            && dests
                .iter()
                .filter_map(|&d| self.dest_of(q, d))
                .any(|j| self.r.late_risk(j))
    }

    fn step(&mut self, step: &Step) -> Result<(), String> {
        match step {
            Step::RawSend { qp, items, finish } => self.raw_send(*qp, items, *finish),
            Step::RawRecv {
                qp,
                items,
                finish,
                single,
            } => self.raw_recv(*qp, items, *finish, *single),
            Step::SafeSend {
                qp,
                len,
                to,
                qkey,
                reuse,
                no_dest,
            } => self.safe_send(*qp, *len, *to, *qkey, *reuse, *no_dest),
            Step::SafeRecv { qp, reuse } => self.safe_recv(*qp, *reuse),
            Step::SrqRecv { items } => self.srq_recv(items),
            Step::PollQp { qp, max, keep } => self.poll_qp(*qp, *max, *keep),
            Step::PollCq { cq, n } => self.poll_cq(*cq, *n as usize).map(|_| ()),
            Step::Cursor { cq, max } => self.cursor(*cq, *max),
            Step::Drain => self.drain(),
            Step::ToError { qp } => self.transition(*qp, St::Err),
            Step::Reset { qp } => self.transition(*qp, St::Reset),
            Step::Destroy { qp } => self.transition(*qp, St::Gone),
            Step::Reinit { qp } => self.transition(*qp, St::Rts),
            Step::Hold => {
                if let Some(mut b) = self.take_buf(false)? {
                    let s = self.seq();
                    let bytes = payload(s, b.len() as usize);
                    b.as_mut_slice().copy_from_slice(&bytes);
                    self.held.push((b, bytes));
                }
                Ok(())
            }
            Step::Release { i } => {
                if !self.held.is_empty() {
                    let i = *i as usize % self.held.len();
                    self.held.remove(i);
                }
                Ok(())
            }
            Step::Foreign { qp, send } => self.foreign(*qp, *send),
        }
    }

    fn raw_send(&mut self, q: usize, items: &[SendItem], finish: bool) -> Result<(), String> {
        if self.r.qps[q].st != St::Rts {
            return Ok(());
        }
        let spec = TOPO[q];
        // Resolve every item: its bytes, its gather list, where it goes.
        let mut prepared = Vec::new();
        for it in items {
            let kind = match (spec.ud, it.kind) {
                (true, Kind::SendImm | Kind::WriteImm) => Kind::SendImm,
                (true, _) => Kind::Send,
                (false, k) => k,
            };
            let nsge = it.sges as usize;
            let len = if nsge == 0 { 0 } else { it.len as usize };
            let s = self.seq();
            let bytes = payload(s, len);
            let (off, sges) = self.raw_sges(len, nsge, it.bad_lkey, &bytes);
            let remote_off = match it.remote {
                Remote::OutOfRange => RDMA_LEN - len + 1,
                _ => it.off as usize % (RDMA_LEN - len + 1),
            };
            let rkey = self.rdma.rkey()
                ^ if it.remote == Remote::BadKey {
                    BAD_KEY
                } else {
                    0
                };
            let ud = spec.ud.then(|| self.ud_target(it.to, it.qkey));
            let flags = SendFlags::from_bits_truncate(it.flags.into())
                & (SendFlags::SIGNALED | SendFlags::SOLICITED | SendFlags::FENCE);
            let res = Resolved {
                kind,
                payload: bytes,
                nsge,
                bad_lkey: it.bad_lkey,
                remote_ok: it.remote == Remote::Good,
                remote_off,
                ud: ud.map(|(qpn, _, seen)| (qpn, seen)),
                imm: it.imm,
                raw: Some(off),
                buf: None,
            };
            prepared.push((
                res,
                sges,
                (self.rdma.addr() + remote_off as u64, rkey),
                ud,
                flags,
            ));
        }
        let dests: Vec<_> = prepared.iter().map(|p| p.0.ud.map(|u| u.0)).collect();
        if self.skip_late(q, &dests) {
            return Ok(());
        }
        let World { qps, r, ah, .. } = self;
        let ah: &AddressHandle<'_, P> = ah;
        let mut posted = Vec::new();
        macro_rules! batch {
            ($b:ident, |$res:ident, $sges:ident, $remote:ident, $ud:ident, $flags:ident, $wr_id:ident| $write:expr) => {{
                for ($res, $sges, $remote, $ud, $flags) in &prepared {
                    let $wr_id = r.wr_id();
                    let want = r.expect_sq_write(q, posted.len(), $sges.len());
                    // SAFETY: the bytes named are the raw region's, never reused nor touched
                    // by the CPU after this (each request has its own).
                    let got = unsafe { $write };
                    ensure_eq!(got, want, "QP {q}: writing send {:?}", $res.kind);
                    if got.is_ok() {
                        posted.push(($wr_id, $res.clone()));
                    }
                }
                if finish {
                    $b.finish();
                } else {
                    drop($b);
                    posted.clear();
                }
            }};
        }
        match &mut qps[q] {
            AnyQp::Rc(Slot::Rts(qp)) => {
                let mut b = qp.send_batch();
                batch!(b, |res, sges, remote, _ud, flags, wr_id| match res.kind {
                    Kind::Send => b.send(wr_id, *flags, sges),
                    Kind::SendImm => b.send_imm(wr_id, *flags, res.imm, sges),
                    Kind::Write => b.rdma_write(wr_id, *flags, *remote, sges),
                    Kind::WriteImm => b.rdma_write_imm(wr_id, *flags, *remote, res.imm, sges),
                    Kind::Read => b.rdma_read(wr_id, *flags, *remote, sges),
                })
            }
            AnyQp::Ud(Slot::Rts(qp)) => {
                let mut b = qp.send_batch();
                batch!(b, |res, sges, _remote, ud, flags, wr_id| {
                    let (qpn, qkey, _) = ud.expect("UD target");
                    match res.kind {
                        Kind::SendImm => {
                            b.send_to_imm(wr_id, *flags, (ah, qpn, qkey), res.imm, sges)
                        }
                        _ => b.send_to(wr_id, *flags, (ah, qpn, qkey), sges),
                    }
                })
            }
            _ => unreachable!("state mismatch"),
        }
        for (wr_id, res) in posted {
            r.post_send(q, wr_id, &res);
        }
        r.end_run(q);
        Ok(())
    }

    fn raw_recv(
        &mut self,
        q: usize,
        items: &[RecvItem],
        finish: bool,
        single: bool,
    ) -> Result<(), String> {
        if self.r.qps[q].st != St::Rts {
            return Ok(());
        }
        let mut prepared = Vec::new();
        for it in items {
            let nsge = it.sges as usize;
            let room = if nsge == 0 { 0 } else { it.room as usize };
            let (off, sges) = self.raw_sges(room, nsge, it.bad_lkey, &[]);
            prepared.push((it, room, off, sges));
        }
        let World { qps, r, .. } = self;
        let mut posted = Vec::new();
        let single = single && prepared.len() == 1;
        let p = &prepared;
        match &mut qps[q] {
            AnyQp::Rc(Slot::Rts(qp)) => post_recvs(qp, r, q, p, single, finish, &mut posted)?,
            AnyQp::Ud(Slot::Rts(qp)) => post_recvs(qp, r, q, p, single, finish, &mut posted)?,
            _ => unreachable!("state mismatch"),
        }
        for (wr_id, room, bad, off) in posted {
            r.post_recv(q, wr_id, room as u32, bad, Some(off), None);
        }
        Ok(())
    }

    fn safe_send(
        &mut self,
        q: usize,
        len: u16,
        to: UdTo,
        qkey: Qkey,
        reuse: bool,
        no_dest: bool,
    ) -> Result<(), String> {
        if self.r.qps[q].st != St::Rts {
            return Ok(());
        }
        let spec = TOPO[q];
        let ud = spec.ud.then(|| self.ud_target(to, qkey));
        if self.skip_late(q, &[ud.map(|u| u.0)]) {
            return Ok(());
        }
        let Some(mut buf) = self.take_buf(reuse)? else {
            return Ok(());
        };
        let s = self.seq();
        buf.set_len((len as u32).min(buf.capacity()))
            .map_err(|e| format!("set_len: {e:?}"))?;
        let bytes = payload(s, buf.len() as usize);
        buf.as_mut_slice().copy_from_slice(&bytes);
        let index = buf.index();
        let want = if !spec.safe {
            Err(Error::InvalidInput {
                param: Param::Pool,
                value: index.into(),
                max: 0,
            })
        } else {
            match self.r.expect_sq_write(q, 0, 1) {
                Ok(()) if spec.ud && no_dest => Err(Error::MissingAttribute {
                    op: DevOp::PostSend,
                    attr: Attr::UdDest,
                }),
                other => other,
            }
        };
        let wr_id = self.r.wr_id();
        let ah: &AddressHandle<'_, P> = self.ah;
        let got = match &mut self.qps[q] {
            AnyQp::Rc(Slot::Rts(qp)) => qp.post_send(wr_id, buf),
            AnyQp::Ud(Slot::Rts(qp)) if no_dest => qp.post_send(wr_id, buf),
            AnyQp::Ud(Slot::Rts(qp)) => {
                let (qpn, given, _) = ud.expect("UD target");
                qp.post_send_to(wr_id, buf, (ah, qpn, given))
            }
            _ => unreachable!("state mismatch"),
        };
        match got {
            Ok(()) => {
                ensure!(
                    want.is_ok(),
                    "QP {q}: post_send accepted, expected {want:?}"
                );
                let res = Resolved {
                    kind: Kind::Send,
                    payload: bytes,
                    nsge: 1,
                    bad_lkey: false,
                    remote_ok: false,
                    remote_off: 0,
                    ud: ud.map(|(qpn, _, seen)| (qpn, seen)),
                    imm: 0,
                    raw: None,
                    buf: Some(index),
                };
                self.r.post_send(q, wr_id, &res);
                self.r.end_run(q);
            }
            Err((buf, e)) => {
                ensure_eq!(Err::<(), _>(e), want, "QP {q}: post_send");
                ensure_eq!(buf.index(), index, "buffer handed back");
                ensure_eq!(buf.as_slice(), &bytes[..], "buffer handed back");
                self.held.push((buf, bytes));
            }
        }
        Ok(())
    }

    fn safe_recv(&mut self, q: usize, reuse: bool) -> Result<(), String> {
        if self.r.qps[q].st != St::Rts {
            return Ok(());
        }
        let Some(buf) = self.take_buf(reuse)? else {
            return Ok(());
        };
        let index = buf.index();
        let kept = buf.as_slice().to_vec();
        let want = if !TOPO[q].safe {
            Err(Error::InvalidInput {
                param: Param::Pool,
                value: index.into(),
                max: 0,
            })
        } else {
            self.r.expect_rq_write(q, 0, 1)
        };
        let wr_id = self.r.wr_id();
        let got = rts!(&mut self.qps[q], |qp| qp.post_recv(wr_id, buf)).expect("state mismatch");
        match got {
            Ok(()) => {
                ensure!(
                    want.is_ok(),
                    "QP {q}: post_recv accepted, expected {want:?}"
                );
                self.r.post_recv(q, wr_id, BUF, false, None, Some(index));
            }
            Err((buf, e)) => {
                ensure_eq!(Err::<(), _>(e), want, "QP {q}: post_recv");
                ensure_eq!(buf.index(), index, "buffer handed back");
                self.held.push((buf, kept));
            }
        }
        Ok(())
    }

    fn srq_recv(&mut self, items: &[RecvItem]) -> Result<(), String> {
        let out = self.r.srq_out.len() as u32;
        let n = items.len() as u32;
        let too_many = items
            .iter()
            .position(|it| u32::from(it.sges) > self.r.srq_sge);
        // The SRQ holds at most max_wr requests not yet completed: that is all a CQ was
        // reserved for (see `srq_overflow` below for what the driver does instead).
        if !self.known_bugs.srq_credit && too_many.is_none() && out > 0 && out + n > self.r.srq_max
        {
            return Ok(());
        }
        let mut prepared = Vec::new();
        for it in items {
            let nsge = it.sges as usize;
            let room = if nsge == 0 { 0 } else { it.room as usize };
            let (off, sges) = self.raw_sges(room, nsge, it.bad_lkey, &[]);
            prepared.push((self.r.wr_id(), room, it.bad_lkey, off, sges));
        }
        let want = if let Some(i) = too_many {
            Err(Error::InvalidInput {
                param: Param::NumSge,
                value: items[i].sges.into(),
                max: self.r.srq_sge.into(),
            })
        } else if out + n > self.r.srq_max {
            Err(Error::QueueFull {
                queue: Queue::Srq,
                free: self.r.srq_max - out,
            })
        } else {
            Ok(())
        };
        let wrs: Vec<RecvWr<'_>> = prepared
            .iter()
            .map(|(wr_id, _, _, _, sges)| RecvWr {
                wr_id: *wr_id,
                sg_list: sges,
            })
            .collect();
        // SAFETY: fresh bytes of the raw region, untouched until the completions.
        let got = unsafe { self.srq.post_recv_raw(&wrs) };
        ensure_eq!(got, want, "SRQ post of {n} with {out} outstanding");
        if got.is_ok() {
            for (wr_id, room, bad, off, _) in &prepared {
                self.r
                    .post_recv(usize::MAX, *wr_id, *room as u32, *bad, Some(*off), None);
            }
        }
        Ok(())
    }

    /// The bytes a successful receive (or RDMA READ) must have put where it landed.
    fn check_data(&self, w: usize, buf: Option<&Buf<'a, P>>) -> Result<(), String> {
        let wr = &self.r.wrs[w];
        let Some(e) = &wr.exec else { return Ok(()) };
        let (Some(data), WcStatus::Success) = (&e.data, e.wc.status) else {
            return Ok(());
        };
        let start = if e.grh { GRH } else { 0 };
        let got: &[u8] = match (buf, wr.raw) {
            (Some(b), _) => b.as_slice(),
            (None, Some(off)) => &self.raw.as_slice()[off..off + start + data.len()],
            (None, None) => return Ok(()),
        };
        ensure!(
            got.len() >= start + data.len(),
            "received {} bytes, expected {}",
            got.len(),
            start + data.len()
        );
        ensure_eq!(
            &got[start..start + data.len()],
            &data[..],
            "bytes received by {:?}",
            e.wc
        );
        Ok(())
    }

    fn poll_qp(&mut self, q: usize, max: u8, keep: bool) -> Result<(), String> {
        for _ in 0..max {
            let Some(got) = any_state!(&mut self.qps[q], |qp| qp.poll_one()) else {
                return Ok(());
            };
            let c = match got {
                Ok(Some(c)) => c,
                Ok(None) => {
                    let next = self.r.next_on_qp(q);
                    ensure!(
                        next.is_none(),
                        "poll_one of QP {q} gave nothing, {next:?} was due"
                    );
                    return Ok(());
                }
                Err(e) => return fail(&format!("QP {q}: poll_one"), e),
            };
            ensure_eq!(
                c.wc.qp_num,
                self.r.qps[q].qpn,
                "poll_one of QP {q} gave another QP's"
            );
            let w = self.r.complete(&c.wc, None, Via::Qp(q))?;
            let wr = &self.r.wrs[w];
            ensure_eq!(
                c.buf.as_ref().map(|b| b.index()),
                if wr.parked { None } else { wr.buf },
                "buffer of {:?}",
                c.wc
            );
            if let Some(b) = &c.buf {
                let recv = wr.wq != Wq::Sq;
                let len = if recv { c.wc.byte_len.min(BUF) } else { BUF };
                ensure_eq!(b.len(), len, "length of the buffer of {:?}", c.wc);
            }
            self.check_data(w, c.buf.as_ref())?;
            if let (true, Some(b)) = (keep, c.buf) {
                let bytes = b.as_slice().to_vec();
                self.held.push((b, bytes));
            }
        }
        Ok(())
    }

    fn poll_cq(&mut self, cq: usize, n: usize) -> Result<usize, String> {
        let mut out = [WorkCompletion::default(); 16];
        let k = match self.cqs[cq].poll(&mut out[..n]) {
            Ok(k) => k,
            Err(e) => return fail(&format!("CQ {cq}: poll"), e),
        };
        ensure!(k <= n, "poll returned {k} > {n}");
        for wc in &out[..k] {
            let w = self.r.complete(wc, None, Via::Cq(cq))?;
            self.check_data(w, None)?;
        }
        if k < n {
            self.nothing_due(cq, "poll")?;
        }
        Ok(k)
    }

    fn cursor(&mut self, cq: usize, max: u8) -> Result<(), String> {
        let cqs = self.cqs;
        let mut c = match cqs[cq].start_poll() {
            Ok(Some(c)) => c,
            Ok(None) => return self.nothing_due(cq, "start_poll"),
            Err(e) => return fail(&format!("CQ {cq}: start_poll"), e),
        };
        for i in 0..max {
            let wc = WorkCompletion {
                wr_id: c.wr_id(),
                byte_len: c.byte_len(),
                imm: c.imm(),
                qp_num: c.qp_num(),
                src_qp: c.src_qp(),
                status: c.status(),
                opcode: c.opcode(),
                flags: c.flags(),
            };
            let w = self.r.complete(&wc, Some(c.vendor_err()), Via::Cq(cq))?;
            self.check_data(w, None)?;
            if i + 1 == max {
                break;
            }
            match c.next_poll() {
                Ok(true) => {}
                Ok(false) => {
                    drop(c);
                    return self.nothing_due(cq, "the cursor");
                }
                Err(e) => return fail(&format!("CQ {cq}: cursor next"), e),
            }
        }
        Ok(())
    }

    /// A poll of CQ `cq` found nothing more: nothing may be due there.
    fn nothing_due(&mut self, cq: usize, what: &str) -> Result<(), String> {
        let next = self.r.next_on_cq(cq);
        ensure!(
            next.is_none(),
            "CQ {cq}: {what} found nothing, {next:?} was due"
        );
        Ok(())
    }

    fn drain(&mut self) -> Result<(), String> {
        loop {
            let mut n = 0;
            for cq in 0..N_CQ {
                loop {
                    let k = self.poll_cq(cq, 16)?;
                    n += k;
                    if k == 0 {
                        break;
                    }
                }
            }
            if n == 0 {
                break;
            }
        }
        self.r.check_drained()
    }

    fn transition(&mut self, q: usize, to: St) -> Result<(), String> {
        let st = self.r.qps[q].st;
        if st == St::Gone || (to == St::Rts && st != St::Reset) {
            return Ok(());
        }
        let slot = std::mem::replace(&mut self.qps[q], AnyQp::Rc(Slot::Gone));
        self.qps[q] = match (slot, to) {
            (AnyQp::Rc(s), St::Err) => AnyQp::Rc(s.into_error()?),
            (AnyQp::Ud(s), St::Err) => AnyQp::Ud(s.into_error()?),
            (AnyQp::Rc(s), St::Reset) => AnyQp::Rc(s.reset()?),
            (AnyQp::Ud(s), St::Reset) => AnyQp::Ud(s.reset()?),
            (AnyQp::Rc(s), St::Rts) => AnyQp::Rc(s.reinit(&rc_init())?),
            (AnyQp::Ud(s), St::Rts) => AnyQp::Ud(s.reinit(&DatagramInit::new(QKEY))?),
            (AnyQp::Rc(s), _) => {
                s.destroy()?;
                AnyQp::Rc(Slot::Gone)
            }
            (AnyQp::Ud(s), _) => {
                s.destroy()?;
                AnyQp::Ud(Slot::Gone)
            }
        };
        match to {
            St::Err => self.r.qps[q].st = St::Err,
            St::Reset => {
                self.r.discard(q);
                // (A QP the device moved to ERROR starts over.)
                let p = &mut self.r.qps[q];
                (p.st, p.dev_err, p.flush_rq) = (St::Reset, false, false);
            }
            St::Gone => self.r.on_destroy(q),
            St::Rts => {}
        }
        Ok(())
    }

    fn foreign(&mut self, q: usize, send: bool) -> Result<(), String> {
        if self.r.qps[q].st != St::Rts {
            return Ok(());
        }
        let buf = self.pool2.alloc().ok_or("second pool empty")?;
        let want = Error::InvalidInput {
            param: Param::Pool,
            value: buf.index().into(),
            max: 0,
        };
        let wr_id = self.r.wr_id();
        let ah: &AddressHandle<'_, P> = self.ah;
        let got = match &mut self.qps[q] {
            AnyQp::Rc(Slot::Rts(qp)) if send => qp.post_send(wr_id, buf),
            AnyQp::Ud(Slot::Rts(qp)) if send => qp.post_send_to(wr_id, buf, (ah, NOWHERE, QKEY)),
            AnyQp::Rc(Slot::Rts(qp)) => qp.post_recv(wr_id, buf),
            AnyQp::Ud(Slot::Rts(qp)) => qp.post_recv(wr_id, buf),
            _ => unreachable!("state mismatch"),
        };
        match got {
            Ok(()) => Err(format!("QP {q}: a buffer of another pool was posted")),
            Err((_, e)) => {
                ensure_eq!(e, want, "QP {q}: foreign buffer");
                Ok(())
            }
        }
    }

    /// What holds after every step.
    fn invariants(&self) -> Result<(), String> {
        let v = self.model.violations();
        ensure!(v.is_empty(), "model violations: {v:#?}");
        ensure_eq!(
            self.pool.free_count(),
            self.expected_free(),
            "pool.free_count()"
        );
        ensure_eq!(self.pool2.free_count(), 2, "second pool's free_count()");
        for (b, bytes) in &self.held {
            ensure_eq!(
                b.as_slice(),
                &bytes[..],
                "held buffer {} changed",
                b.index()
            );
        }
        ensure!(
            self.rdma.as_slice() == &self.r.shadow[..],
            "RDMA region differs from the reference"
        );
        Ok(())
    }
}

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

// ---------------------------------------------------------------------------------------------
// Driver bugs found by the properties, reduced to their shortest form. Each fails today; the
// property run skips the steps that reach them unless `PROPS_KNOWN_BUGS` says otherwise.

/// An RC pair on one CQ (both with the safe path), in RTS, and what they were built from.
struct Pair<'a> {
    a: QueuePair<'a, P, Rc, Rts>,
    b: QueuePair<'a, P, Rc, Rts>,
}

fn pair<'a>(
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    pool: &'a BufferPool<'a, P>,
    gid: Gid,
) -> Pair<'a> {
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 2,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let a = pd
        .qp_builder(cq, cq)
        .caps(caps)
        .pool(pool)
        .build::<Rc>()
        .unwrap();
    let b = pd
        .qp_builder(cq, cq)
        .caps(caps)
        .pool(pool)
        .build::<Rc>()
        .unwrap();
    let (qa, qb) = (a.qp_num(), b.qp_num());
    let up = |qp: QueuePair<'a, P, Rc, Reset>, peer: u32| {
        let qp = qp.init(&rc_init()).map_err(|(_, e)| e).unwrap();
        let rtr = ConnectedRtr::new(peer, 0, AddressVector::new(gid, 0));
        let qp = qp.rtr(&rtr).map_err(|(_, e)| e).unwrap();
        qp.rts(&ConnectedRts::new(0)).map_err(|(_, e)| e).unwrap()
    };
    Pair {
        a: up(a, qb),
        b: up(b, qa),
    }
}

/// Takes buffers from `pool` until it has the one numbered `index`; fills all with 0xAA.
/// Takes every buffer the pool hands out, filled with 0xAA; the buffer of the flushed or
/// discarded receive (`index`, which the device still holds) must not be among them.
fn take_until<'p>(pool: &'p BufferPool<'p, P>, index: u32) -> Vec<Buf<'p, P>> {
    let mut held = Vec::new();
    while let Some(mut b) = pool.alloc() {
        b.as_mut_slice().fill(0xAA);
        held.push(b);
    }
    assert!(
        held.iter().all(|b| b.index() != index),
        "buffer {index} handed out again while the device holds its receive"
    );
    held
}

/// A raw SEND of `bytes` from `qp` (the bytes in their own region).
fn raw_send(
    qp: &mut QueuePair<'_, P, Rc, Rts>,
    mr: &mut MemoryRegion<'_, P>,
    wr_id: u64,
    bytes: &[u8],
) {
    mr.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
    let sge = mr.sge(0, bytes.len() as u32).unwrap();
    let mut b = qp.send_batch();
    // SAFETY: the region outlives the request and is not touched until its completion.
    unsafe { b.send(wr_id, SendFlags::SIGNALED, &[sge]).unwrap() };
    b.finish();
}

/// Driver bug: a receive completed as flushed (`to_error()`, then a poll) hands its buffer back
/// to the pool, but the device still holds the receive: QEMU only records ERR, its host QP
/// keeps it (the model does the same). The next SEND from the peer lands in the buffer after
/// the pool has handed it out again. (Property: a buffer the CPU holds is never written by the
/// device; shrunk from `SafeRecv, ToError, PollCq, <take the buffer>, RawSend from the peer`.)
#[test]
fn late_receive_after_error_writes_a_reused_buffer() {
    let model = model();
    let ctx = up(&model);
    {
        let gid = ctx
            .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let pool = pd.buffer_pool(4, 256).unwrap();
        let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let Pair { mut a, mut b } = pair(&pd, &cq, &pool, gid.gid());

        let r = pool.alloc().unwrap();
        let index = r.index();
        b.post_recv(1, r).map_err(|(_, e)| e).unwrap();
        let mut b = b.to_error().map_err(|(_, e)| e).unwrap();
        let c = b.poll_one().unwrap().expect("the flush");
        assert_eq!((c.wc.wr_id, c.wc.status), (1, WcStatus::WrFlushErr));
        drop(c); // no buffer: the device took the receive, so it stays parked
        let held = take_until(&pool, index);

        raw_send(&mut a, &mut mr, 2, b"late");
        // The device consumed the flushed receive: the send succeeded (the receive's late CQE
        // is dropped)...
        let mut wc = [WorkCompletion::default(); 4];
        let n = cq.poll(&mut wc).unwrap();
        let got: Vec<_> = wc[..n].iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(got, [(2, WcStatus::Success)]);
        // ...and wrote into a buffer the test owns.
        for h in &held {
            assert!(
                h.as_slice().iter().all(|&x| x == 0xAA),
                "buffer {} written by the device after its receive was flushed: {:?}",
                h.index(),
                &h.as_slice()[..8]
            );
        }
    }
    teardown(&model, ctx);
}

/// Driver bug, same cause as above after RESET: the receives are discarded (buffers back to the
/// pool, rings restarted) but QEMU keeps them in its host QP.
#[test]
fn late_receive_after_reset_writes_a_reused_buffer() {
    let model = model();
    let ctx = up(&model);
    {
        let gid = ctx
            .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let pool = pd.buffer_pool(4, 256).unwrap();
        let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let Pair { mut a, b } = pair(&pd, &cq, &pool, gid.gid());

        let r = pool.alloc().unwrap();
        let index = r.index();
        let mut b = b;
        b.post_recv(1, r).map_err(|(_, e)| e).unwrap();
        let _b = b.reset().map_err(|(_, e)| e).unwrap();
        assert_eq!(
            pool.free_count(),
            3,
            "RESET keeps the buffer the device took (parked until the QP is destroyed)"
        );
        let held = take_until(&pool, index);

        raw_send(&mut a, &mut mr, 2, b"late");
        let mut wc = [WorkCompletion::default(); 4];
        let n = cq.poll(&mut wc).unwrap();
        let got: Vec<_> = wc[..n].iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(
            got,
            [(2, WcStatus::Success)],
            "the device consumed the discarded receive"
        );
        for h in &held {
            assert!(
                h.as_slice().iter().all(|&x| x == 0xAA),
                "buffer {} written by the device after its receive was discarded: {:?}",
                h.index(),
                &h.as_slice()[..8]
            );
        }
    }
    teardown(&model, ctx);
}

/// Driver bug, same cause, seen from the poller: after part of the receive queue was flushed,
/// the device's CQE for the receive it still held (the oldest, already reported flushed) is
/// refused as `Protocol` ("CQE wr_id (not the next request)") instead of being dropped as late.
#[test]
fn late_receive_after_partial_flush_is_refused() {
    let model = model();
    let ctx = up(&model);
    {
        let gid = ctx
            .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let pool = pd.buffer_pool(4, 256).unwrap();
        let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let recv_mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let Pair { mut a, mut b } = pair(&pd, &cq, &pool, gid.gid());

        // SAFETY: the region outlives the QP and is not touched while the receives are posted.
        unsafe {
            b.post_recv_raw(1, &[recv_mr.sge(0, 64).unwrap()]).unwrap();
            b.post_recv_raw(2, &[recv_mr.sge(64, 64).unwrap()]).unwrap();
        }
        let _b = b.to_error().map_err(|(_, e)| e).unwrap();
        let mut wc = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut wc[..1]).unwrap(), 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::WrFlushErr));

        raw_send(&mut a, &mut mr, 3, b"late"); // consumes receive 1 on the device
        let n = cq
            .poll(&mut wc)
            .expect("the late CQE of receive 1 is dropped, not refused");
        let got: Vec<_> = wc[..n].iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(got, [(3, WcStatus::Success), (2, WcStatus::WrFlushErr)]);
    }
    teardown(&model, ctx);
}

/// Driver bug: an SRQ takes more receives than `max_wr` outstanding. Its credit is the ring's
/// free slots, but the device (QEMU, and the model) drains the ring at every doorbell, so the
/// driver never says `QueueFull` while completions are still to come, and the CQ room reserved
/// for the SRQ (`max_wr` per QP) is too small: with `max_wr` 1, a 1-entry receive CQ, and one
/// receive posted before each SEND from the peer, the second and third receives are consumed
/// but their CQEs dropped on the full CQ (model: "CQ full: QEMU drops the CQE silently"); they
/// never complete. (Property: caps hold — at most `max_wr` outstanding; shrunk from
/// `srq_wr: 1, SrqRecv x1, SrqRecv x1`.)
#[test]
fn srq_accepts_more_than_max_wr_outstanding() {
    let model = model();
    let ctx = up(&model);
    {
        let _gid = ctx
            .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let srq = pd
            .create_srq(SrqAttr {
                max_wr: 1,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        fn wr(wr_id: u64, sg_list: &[Sge]) -> RecvWr<'_> {
            RecvWr { wr_id, sg_list }
        }
        let (s1, s2) = ([mr.sge(0, 64).unwrap()], [mr.sge(64, 64).unwrap()]);
        // SAFETY: the region outlives the SRQ and is not touched while the receives are posted.
        unsafe { srq.post_recv_raw(&[wr(1, &s1)]).unwrap() };
        // One receive outstanding (no completion yet) in an SRQ of one.
        let r = unsafe { srq.post_recv_raw(&[wr(2, &s2)]) };
        assert_eq!(
            r,
            Err(Error::QueueFull {
                queue: Queue::Srq,
                free: 0
            })
        );
    }
    teardown(&model, ctx);
}
