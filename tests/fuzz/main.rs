//! The hostile-device fuzzer: the driver against a model that lies.
//!
//! Run it with `tests/fuzz.sh [N] [SEED]` (a release build with overflow checks and debug
//! assertions on, in its own target directory). It is a `harness = false` test target that
//! `cargo test` does not run by default; by hand: `cargo test --release --test fuzz -- N SEED`.
//!
//! Execution `i` uses seed `SEED + i`. From the seed come the machine (QEMU's version or a
//! later one, 32/64-bit BAR2, verbs or QEMU semantics, sometimes tiny object tables, little DMA
//! memory or honestly odd limits — a max_sge of 2^24, a gid_tbl_len of 1 —, sometimes an
//! injected errno or DMA failure) and how hostile the device is: one lie in `rate` at a random
//! subset of the model's mutation points (`bareverbs_model::hostile`), some points at their own
//! rate, one execution in eight fully honest. The driver is brought up
//! on it (usually at the PVRDMA's address, sometimes by a full bus scan) and runs 1–30
//! operations: port and P_Key queries, PDs, CQs of edge sizes, GID bindings, memory regions,
//! RC/UD/GSI (and refused UC/raw) QPs with edge capacities through every state, QPs created at
//! the provider level (no bookkeeping limit), SRQs, connected pairs, and the data path (raw and
//! safe posts, polls, the futures, arming, QPs reset or destroyed and made again on one CQ),
//! then every QP goes to ERR, every CQ is polled dry, and everything is dropped.
//! `FUZZ_MODE=honest` (no device lies) or `hostile` (every device lies) narrows the mix.
//!
//! A failure is:
//! - a panic, anywhere (the driver, the model, this file);
//! - an execution that takes over 2 s (every wait and every poll of a future must be bounded; a
//!   watchdog reports one that makes no progress for 5 s);
//! - a `Memory` violation: the device handed an address the driver does not own, a block freed
//!   that was not allocated as such, or a write into a DMA block's guard pages — always;
//! - a `UseAfterFree` violation, unless the device lied about a command's outcome (a response
//!   field, ERR, silence, VERSION) or an errno was injected: after such a lie the driver's view
//!   of what the device holds may rightly be wrong;
//! - a `Qemu` violation (something QEMU would mishandle), unless the model says a lie that was
//!   told may lead a correct driver to it (`Violation::excused_by`): lied caps excuse a table
//!   overflow or too many SGEs, lied outcomes a doorbell for an unknown object, spurious CQEs a
//!   full CQ; nothing excuses a ring whose pages do not hold its WQEs, or an unknown doorbell;
//! - DMA pages left after everything was dropped, when the command channel was honest; with a
//!   lying channel, pages may stay only if the driver had a reason to keep them: a command whose
//!   outcome it could not know (Timeout, or Protocol on a command) or a destroy that failed
//!   (the driver logs a warning when it leaks on purpose; this file counts them);
//! - the device left active after the context was dropped;
//! - any object whose reported size is below the request;
//! - unless the device lied about a command's outcome (whatever it wrote to rings, WQEs and
//!   CQEs): a completion that is not of a request posted to its QP (or its SRQ) and still
//!   outstanding — a forged wr_id, a second completion, one of a request its QP lost to a
//!   reset or a destroy; a safe pool whose buffers in use are not exactly those posted and
//!   parked, at every step, a buffer handed out while posted, or a buffer not back once the
//!   QP is gone;
//! - in an honest execution (no lie, no injected errno): a driver answer that contradicts the
//!   device (a queried state or QP number); a completion refused (a poll error); once every QP
//!   was flushed and every CQ polled dry, a request of a QP in ERR that never completed
//!   (exactly once); a create the device refuses (the driver promises to check every limit
//!   first); and on a plain one (default limits, enough memory), a connected pair that does
//!   not come up.
//!
//! Every error must be a `bareverbs::Error` (the type system sees to it); each one's kind and
//! Display are exercised.

#![allow(clippy::too_many_lines)]

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::mem::ManuallyDrop;
use std::panic::{self, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bareverbs::Error;
use bareverbs::device::pvrdma::{self, Config, Opcodes, Pvrdma};
use bareverbs::error::Op;
use bareverbs::hal::PciAddress;
use bareverbs::verbs::*;
use bareverbs_model::hostile::point;
use bareverbs_model::{Hostile, Model, ModelConfig, Rng, Semantics, ViolationKind};

type P = Pvrdma<Model>;
type Ctx = Context<P>;
type Pd<'c> = ProtectionDomain<'c, P>;
type Cq<'c> = CompletionQueue<'c, P>;
type Mr<'c> = MemoryRegion<'c, P>;
type Srq<'c> = SharedReceiveQueue<'c, P>;
type Q<'c, T, S> = QueuePair<'c, P, T, S>;

/// Polls per command wait: a silent device costs this many reads.
const POLL_LIMIT: u32 = 64;
/// The QP number under which receives posted to an SRQ are booked (any of its QPs may
/// complete them).
const ANY_QP: u32 = u32::MAX;
/// An execution slower than this is a failure (an unbounded wait, or close to one).
const SLOW: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// Tracing: executions run untraced; a failing one is replayed with the trace on.

struct Trace {
    on: bool,
    lines: Vec<String>,
}

macro_rules! note {
    ($t:expr, $($a:tt)*) => {
        if $t.on {
            $t.lines.push(format!($($a)*));
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Per-thread observations: the driver's leak warnings and the last panic.

thread_local! {
    static WARNINGS: Cell<u32> = const { Cell::new(0) };
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
    static SEED: Cell<u64> = const { Cell::new(0) };
    /// Whether a panic should come with the project's frames of its backtrace (on replays:
    /// symbolizing costs milliseconds).
    static BACKTRACE: Cell<bool> = const { Cell::new(false) };
    /// This thread's machine, rebuilt for each execution: memory the driver leaked on purpose
    /// keeps a handle to its machine, and with a machine per execution every one of those
    /// would stay allocated for good.
    static MODEL: Model = Model::default();
}

struct Owned<T> {
    ptr: NonNull<T>,
    users: u32,
}

impl<T> Owned<T> {
    fn new(v: T) -> Self {
        Owned {
            ptr: NonNull::from(Box::leak(Box::new(v))),
            users: 0,
        }
    }

    /// # Safety
    ///
    /// The object is not taken while the reference is in use: every holder of one counts in
    /// `users`, and `take` is called only at zero users.
    unsafe fn get<'a>(&self) -> &'a T {
        // SAFETY: the box lives until `take` (or forever, if the execution panicked).
        unsafe { &*self.ptr.as_ptr() }
    }

    fn take(self) -> T {
        assert_eq!(self.users, 0, "fuzz bookkeeping: object taken while in use");
        // SAFETY: leaked from a Box in `new`, taken back once.
        *unsafe { Box::from_raw(self.ptr.as_ptr()) }
    }
}

// ---------------------------------------------------------------------------------------------
// Queue pairs of every transport in every state.

enum St<'c, T: Transport> {
    Reset(Q<'c, T, Reset>),
    Init(Q<'c, T, Init>),
    Rtr(Q<'c, T, Rtr>),
    Rts(Q<'c, T, Rts>),
    Err(Q<'c, T, ErrState>),
}

macro_rules! on_st {
    ($st:expr, $q:pat => $e:expr) => {
        match $st {
            St::Reset($q) => $e,
            St::Init($q) => $e,
            St::Rtr($q) => $e,
            St::Rts($q) => $e,
            St::Err($q) => $e,
        }
    };
}

macro_rules! st_from {
    ($($s:ident => $v:ident),*) => { $(
        impl<'c, T: Transport> From<Q<'c, T, $s>> for St<'c, T> {
            fn from(q: Q<'c, T, $s>) -> Self {
                St::$v(q)
            }
        }
    )* };
}
st_from!(Reset => Reset, Init => Init, Rtr => Rtr, Rts => Rts, ErrState => Err);

type Step<'c, T> = (St<'c, T>, Result<(), Error>);

/// A transition's outcome as (the QP in whichever state it ended, the result).
fn lift<'c, T: Transport, A, B>(r: Result<Q<'c, T, B>, (Q<'c, T, A>, Error)>) -> Step<'c, T>
where
    A: State,
    B: State,
    St<'c, T>: From<Q<'c, T, A>> + From<Q<'c, T, B>>,
{
    match r {
        Ok(q) => (q.into(), Ok(())),
        Err((q, e)) => (q.into(), Err(e)),
    }
}

impl<'c, T: Transport> St<'c, T> {
    fn state(&self) -> QpState {
        on_st!(self, q => q.state())
    }

    fn reset(self) -> Step<'c, T> {
        on_st!(self, q => lift(q.reset()))
    }

    #[allow(clippy::wrong_self_convention)] // named after the QP transition it makes
    fn to_error(self) -> Step<'c, T> {
        on_st!(self, q => lift(q.to_error()))
    }

    #[allow(clippy::result_large_err)] // the QP comes back by value, as the verbs API does
    fn destroy(self) -> Result<(), (Self, Error)> {
        on_st!(self, q => q.destroy().map_err(|(q, e)| (q.into(), e)))
    }

    fn query(&self) -> Result<QpAttr, Error> {
        on_st!(self, q => q.query())
    }

    fn qp_num(&self) -> u32 {
        on_st!(self, q => q.qp_num())
    }
}

enum AnyQp<'c> {
    Rc(St<'c, Rc>),
    Ud(St<'c, Ud>),
    Gsi(St<'c, Gsi>),
}

macro_rules! on_qp {
    ($any:expr, $s:pat => $e:expr) => {
        match $any {
            AnyQp::Rc($s) => $e,
            AnyQp::Ud($s) => $e,
            AnyQp::Gsi($s) => $e,
        }
    };
}

// The fuzzer's parts (this file: the world's types, one execution, the runner and its report).
mod data;
mod machine;
mod objects;
mod qps;
mod trace;

use machine::*;
use trace::*;

/// What a modify asks for.
#[derive(Clone, Copy, Debug)]
enum Move {
    /// The next state along RESET → INIT → RTR → RTS (RTS and ERR go back to RESET).
    Next,
    Reset,
    Error,
    /// Datagram QPs: RESET → RTS in one call.
    Ready,
}

/// Attributes for every transition, good or edge values.
#[derive(Clone, Copy, Debug)]
struct Attrs {
    cinit: ConnectedInit,
    crtr: ConnectedRtr,
    crts: ConnectedRts,
    dinit: DatagramInit,
    drts: DatagramRts,
}

fn rc_move<'c>(s: St<'c, Rc>, m: Move, a: &Attrs) -> Step<'c, Rc> {
    match (m, s) {
        (Move::Reset, s) => s.reset(),
        (Move::Error, s) => s.to_error(),
        (_, St::Reset(q)) => lift(q.init(&a.cinit)),
        (_, St::Init(q)) => lift(q.rtr(&a.crtr)),
        (_, St::Rtr(q)) => lift(q.rts(&a.crts)),
        (_, s) => s.reset(),
    }
}

fn dg_move<'c, T: Datagram>(s: St<'c, T>, m: Move, a: &Attrs) -> Step<'c, T> {
    match (m, s) {
        (Move::Reset, s) => s.reset(),
        (Move::Error, s) => s.to_error(),
        (Move::Ready, St::Reset(q)) => lift(q.ready(a.dinit.qkey, a.drts.sq_psn)),
        (_, St::Reset(q)) => lift(q.init(&a.dinit)),
        (_, St::Init(q)) => lift(q.rtr(&())),
        (_, St::Rtr(q)) => lift(q.rts(&a.drts)),
        (_, s) => s.reset(),
    }
}

struct QpEntry<'c> {
    qp: Option<AnyQp<'c>>,
    pd: usize,
    scq: usize,
    rcq: usize,
    srq: Option<usize>,
    qpn: u32,
    /// The Q_Key last given (UD destinations use it).
    qkey: u32,
    /// PDs of the memory regions moved into the QP by safe posts.
    held: Vec<usize>,
}

/// A QP created through the provider directly: no driver-side bookkeeping, so any size.
struct RawQp {
    qp: Option<pvrdma::Qp<Model>>,
    state: QpState,
    pd: usize,
    scq: usize,
    rcq: usize,
    srq: Option<usize>,
}

// ---------------------------------------------------------------------------------------------
// The world of one execution.

struct World<'c> {
    ctx: &'c Ctx,
    /// No lie, no injected errno: the driver's answers must agree with the device.
    honest: bool,
    /// Honest, with default limits and plenty of DMA memory: what must work, works.
    plain: bool,
    /// Work requests posted and not yet completed, by (QP number, wr_id) (SRQ receives under
    /// [`ANY_QP`]), with their multiplicity.
    posted: BTreeMap<(u32, u64), u32>,
    /// Requests of QPs reset or destroyed before they completed: none may complete any more.
    dead: BTreeMap<(u32, u64), u32>,
    /// Complaints that stand unless the device lied about a command's outcome (checked at the
    /// end of the execution, when the lies told are known).
    strict: Vec<String>,
    pds: Vec<Option<Owned<Pd<'c>>>>,
    cqs: Vec<Option<Owned<Cq<'c>>>>,
    srqs: Vec<Option<(Owned<Srq<'c>>, usize)>>,
    mrs: Vec<(Mr<'c>, usize)>,
    gids: Vec<GidBinding<'c, P>>,
    qps: Vec<QpEntry<'c>>,
    raw_qps: Vec<RawQp>,
    /// A command whose outcome the driver could not know (it keeps memory then).
    unknown: bool,
    /// Objects this file leaked on purpose (a provider-level destroy that failed).
    leaked: bool,
    /// What the execution found wrong besides panics and the model's checks.
    complaints: Vec<String>,
}

/// Whether an error says that a command may have taken effect although it failed.
fn outcome_unknown(e: &Error) -> bool {
    match e {
        Error::Timeout { .. } => true,
        Error::Protocol { op, .. } => !matches!(op, Op::PostSend | Op::PostRecv | Op::PollCq),
        _ => false,
    }
}

/// A sink for Display: formats everything, keeps nothing.
struct Sink;

impl std::fmt::Write for Sink {
    fn write_str(&mut self, _: &str) -> std::fmt::Result {
        Ok(())
    }
}

fn live<T>(v: &[Option<T>]) -> Vec<usize> {
    (0..v.len()).filter(|&i| v[i].is_some()).collect()
}

fn pick_live<T>(r: &mut Rng, v: &[Option<T>]) -> Option<usize> {
    let l = live(v);
    (!l.is_empty()).then(|| r.pick(&l))
}

/// A count: mostly small, sometimes an edge.
fn count(r: &mut Rng, small: u32, edges: &[u32]) -> u32 {
    if r.below(8) != 0 {
        r.below(u64::from(small) + 1) as u32
    } else {
        r.pick(edges)
    }
}

/// The fuzzer's books of one buffer pool while its QP lives: which buffers are posted (by
/// wr_id), and how many the driver keeps after their request was flushed (a receive the
/// device took may still be written: parked until the QP is destroyed). At every step the
/// pool's buffers in use are exactly those; none is handed out while posted.
#[derive(Default)]
struct PoolBooks {
    out: BTreeMap<u64, u32>,
    parked: u32,
}

impl PoolBooks {
    /// A safe post of buffer `index` as request `id` on QP `qpn` returned `res` (on failure the
    /// buffer comes back in it, and goes back to the pool here).
    fn posted<B>(
        &mut self,
        w: &mut World<'_>,
        t: &mut Trace,
        (qpn, id, index): (u32, u64, u32),
        res: Result<(), (B, Error)>,
    ) {
        match res {
            Ok(()) => {
                w.posted(qpn, [id].iter());
                self.out.insert(id, index);
            }
            Err((b, e)) => {
                drop(b);
                w.err(t, &e);
            }
        }
    }

    fn handed_out(&mut self, w: &mut World<'_>, t: &mut Trace, index: u32) {
        if self.out.values().any(|&i| i == index) {
            w.complain_strict(
                t,
                format!("pool handed out buffer {index} while it is posted"),
            );
        }
    }

    fn completed(&mut self, w: &mut World<'_>, t: &mut Trace, wr_id: u64, buf: Option<u32>) {
        match (self.out.remove(&wr_id), buf) {
            (Some(i), Some(b)) if i != b => w.complain_strict(
                t,
                format!("the completion of wr_id {wr_id:#x} gave buffer {b}, posted {i}"),
            ),
            (Some(_), None) => self.parked += 1,
            (None, _) => w.complain_strict(
                t,
                format!("a safe completion for wr_id {wr_id:#x}, posted with no buffer"),
            ),
            _ => {}
        }
    }

    /// (`held`: buffers in the fuzzer's hands now.)
    fn check(
        &self,
        w: &mut World<'_>,
        t: &mut Trace,
        pool: &BufferPool<'_, P>,
        held: u32,
        after: &str,
    ) {
        let in_use = pool.count() - pool.free_count();
        let booked = self.out.len() as u32 + self.parked + held;
        if in_use != booked {
            w.complain_strict(
                t,
                format!(
                    "pool after {after}: {in_use} buffers in use, {} posted and {} parked",
                    self.out.len(),
                    self.parked
                ),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One execution.

/// What one execution found.
struct Found {
    /// A short, seed-independent description (to count distinct failures).
    signature: String,
    /// Everything about it.
    detail: String,
}

/// Replaces the digits of a message, so that one failure with different values counts once.
fn shape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        let hex = b[i] == b'0' && b.get(i + 1) == Some(&b'x');
        if hex || b[i].is_ascii_digit() {
            i += if hex { 2 } else { 0 };
            while i < b.len() && (b[i].is_ascii_digit() || (hex && b[i].is_ascii_hexdigit())) {
                i += 1;
            }
            out.push('#');
        } else {
            let c = s[i..].chars().next().expect("a char");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn execute(seed: u64, t: &mut Trace) -> Option<Found> {
    SEED.with(|s| s.set(seed));
    WARNINGS.with(|w| w.set(0));
    PANIC.with(|p| p.borrow_mut().take());
    let started = Instant::now();
    let mut r = Rng::new(seed ^ 0x5EED_F022_u64.rotate_left(17));
    let (cfg, honest, plain, desc) = machine(&mut r);
    note!(t, "machine: {desc}");
    let model = MODEL.with(Model::clone);
    // SAFETY: nothing of the previous execution is used again: its driver objects were dropped,
    // or leaked (forgotten, or abandoned by a panic) and never touched after.
    unsafe { model.reset(cfg) };
    let mut faulted = false;
    if r.below(8) == 0 {
        let nth = 1 + r.below(40);
        let errno = r.pick(&[1, 5, 11, 12, 16, 22, 28, 95]);
        note!(t, "inject: command {nth} fails with errno {errno}");
        model.fail_command(nth, errno);
        faulted = true;
    }
    let mut plain = plain;
    if r.below(8) == 0 {
        let nth = 1 + r.below(40);
        note!(t, "inject: DMA allocation {nth} fails");
        model.fail_dma_alloc(nth);
        plain = false;
    }
    let honest = honest && !faulted;

    let opcodes = if r.below(2) == 0 {
        Opcodes::All
    } else {
        Opcodes::SendOnly
    };
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        let config = Config {
            poll_limit: POLL_LIMIT,
            opcodes,
            interrupts: false,
        };
        let dev = if r.below(32) == 0 {
            note!(t, "probe (bus scan)");
            Pvrdma::probe(model.clone(), &model, config)
        } else {
            let (b, d, f) = bareverbs_model::PVRDMA_ADDRESS;
            note!(t, "new at {b:02x}:{d:02x}.{f}");
            Pvrdma::new(model.clone(), &model, PciAddress::new(0, b, d, f), config)
        };
        let dev = match dev {
            Ok(d) => d,
            Err(e) => {
                let _ = e.kind();
                let _ = write!(Sink, "{e}");
                note!(t, "    -> Err({e:?})");
                return (outcome_unknown(&e), false, Vec::new(), Vec::new());
            }
        };
        note!(
            t,
            "    -> Ok(version {}, caps {:?})",
            dev.version(),
            dev_caps(&dev)
        );
        // On a panic nothing below is dropped: leaking is safer than unwinding through drops.
        let ctx = ManuallyDrop::new(Context::new(dev));
        let mut w = ManuallyDrop::new(World::new(&ctx, honest, plain));
        let ops = 1 + r.below(30);
        if r.below(2) == 0 {
            // Most of the data path needs a connected pair: often start with one.
            w.connect(&mut r, t);
            for _ in 0..r.below(3) {
                w.register_mr(&mut r, t);
            }
        }
        for _ in 0..ops {
            w.step(&mut r, t);
        }
        let res = ManuallyDrop::into_inner(w).teardown(&mut r, t);
        drop(ManuallyDrop::into_inner(ctx));
        res
    }));
    let elapsed = started.elapsed();
    let lies = model.lies();
    note!(t, "lies told: {lies:?}");
    let problem = |sig: String, what: String| {
        Some(Found {
            signature: sig,
            detail: format!("{what}\n  machine: {desc}\n  lies: {lies:?}"),
        })
    };
    let (unknown, leaked, complaints, strict) = match outcome {
        Ok(v) => v,
        Err(_) => {
            let msg = PANIC.with(|p| p.borrow_mut().take()).unwrap_or_default();
            let first = msg.lines().next().unwrap_or("");
            let at = first.rsplit(" (at ").next().unwrap_or("").to_owned();
            return problem(
                format!(
                    "panic: {} (at {at}",
                    shape(first.split(" (at ").next().unwrap_or(""))
                ),
                format!("panic: {msg}"),
            );
        }
    };
    if elapsed > SLOW {
        return problem("slow execution".into(), format!("took {elapsed:?}"));
    }
    model.check_guards();
    // The lies told (an injected errno counts as one about a command's outcome); a violation
    // counts unless one of them may have led a correct driver to it.
    let mut told = lies.mask() | if faulted { point::PROTOCOL } else { 0 };
    if lies.write > 0 {
        // Rewritten ring indices and CQEs are lies about rings and CQEs.
        told |= point::RING | point::CQE;
    }
    for v in model.violation_records() {
        if v.excused_by & told == 0 || v.kind == ViolationKind::Memory {
            return problem(
                format!("{:?} violation: {}", v.kind, shape(&v.message)),
                format!("{:?} violation: {}", v.kind, v.message),
            );
        }
    }
    let pages = model.outstanding_pages();
    let warnings = WARNINGS.with(Cell::get);
    if pages > 0 {
        let channel_lied = lies.protocol() || faulted;
        if !channel_lied {
            return problem(
                "DMA pages leaked with an honest command channel".into(),
                format!("{pages} DMA pages never returned"),
            );
        }
        if !unknown && !leaked && warnings == 0 {
            return problem(
                "DMA pages leaked with no reason to keep them".into(),
                format!(
                    "{pages} DMA pages never returned, though no command's outcome was \
                     unknown and no destroy failed"
                ),
            );
        }
        if !leaked && warnings == 0 {
            // The driver keeps memory on purpose only with a warning (the fuzzer's own
            // forgotten objects aside).
            return problem(
                "DMA pages kept without a warning".into(),
                format!("{pages} DMA pages never returned, and the driver logged no warning"),
            );
        }
    }
    if model.active() {
        return problem(
            "device left active".into(),
            "the device is still active after the context was dropped".into(),
        );
    }
    if let Some(c) = complaints.first() {
        return problem(format!("wrong answer: {}", shape(c)), c.clone());
    }
    // What holds whatever the device wrote to memory or CQEs, unless it lied about a command's
    // outcome (then the driver's idea of which QPs exist may rightly differ from the model's).
    if let Some(c) = strict.first()
        && !lies.protocol()
        && !faulted
    {
        return problem(
            format!("wrong answer (lying device): {}", shape(c)),
            c.clone(),
        );
    }
    None
}

fn dev_caps(d: &P) -> String {
    let c = d.caps();
    format!(
        "max_qp {} max_qp_wr {} max_sge {} max_cq {} max_cqe {} max_pd {} max_mr {} \
         max_srq {} max_srq_wr {} max_srq_sge {} gid_tbl_len {} max_pkeys {} ports {} \
         max_mr_size {:#x}",
        c.max_qp,
        c.max_qp_wr,
        c.max_sge,
        c.max_cq,
        c.max_cqe,
        c.max_pd,
        c.max_mr,
        c.max_srq,
        c.max_srq_wr,
        c.max_srq_sge,
        c.gid_tbl_len,
        c.max_pkeys,
        c.phys_port_cnt,
        c.max_mr_size
    )
}

// ---------------------------------------------------------------------------------------------
// The run: N executions over worker threads, a watchdog, a report.

struct Failures {
    /// Signature → (count, first seed, detail of the first).
    distinct: BTreeMap<String, (u64, u64, String)>,
    total: u64,
    printed: u64,
}

/// Distinct failures reported in full (with their replayed trace).
const FULL_REPORTS: usize = 8;
/// One-line reports of further failures, unless FUZZ_LINES says otherwise.
const MAX_LINES: u64 = 100;

fn parse(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Keeps freed memory in the process (glibc): the model allocates and frees every DMA block of
/// every execution, and returning those pages to the kernel each time made page faults most of
/// the cost of an execution.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    unsafe extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    // SAFETY: mallopt only tunes the allocator; called before any worker thread exists.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 64 << 20);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

fn main() {
    keep_freed_memory();
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let env = |k: &str| std::env::var(k).ok().and_then(|v| parse(&v));
    let n = args
        .first()
        .and_then(|a| parse(a))
        .or_else(|| env("FUZZ_N"))
        .unwrap_or(200_000);
    let base = args
        .get(1)
        .and_then(|a| parse(a))
        .or_else(|| env("FUZZ_SEED"))
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            (now.as_secs() << 20) ^ u64::from(now.subsec_nanos())
        });
    let threads = env("FUZZ_THREADS").unwrap_or(2).clamp(1, 64);
    let verbose = env("FUZZ_VERBOSE").unwrap_or(0) != 0;

    log::set_logger(&LOGGER).expect("logger");
    log::set_max_level(log::LevelFilter::Warn);
    panic::set_hook(Box::new(panic_hook));

    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Mutex::new(Failures {
        distinct: BTreeMap::new(),
        total: 0,
        printed: 0,
    }));
    let current: Arc<Vec<AtomicU64>> = Arc::new((0..threads).map(|_| AtomicU64::new(0)).collect());
    let heartbeat: Arc<Vec<AtomicU64>> =
        Arc::new((0..threads).map(|_| AtomicU64::new(0)).collect());
    let started = Instant::now();

    let workers: Vec<_> = (0..threads as usize)
        .map(|k| {
            let (next, done, failures) = (next.clone(), done.clone(), failures.clone());
            let (current, heartbeat) = (current.clone(), heartbeat.clone());
            std::thread::Builder::new()
                .name(format!("fuzz-{k}"))
                .stack_size(8 << 20)
                .spawn(move || {
                    const CHUNK: u64 = 64;
                    let mut quiet = Trace {
                        on: verbose,
                        lines: Vec::new(),
                    };
                    loop {
                        let from = next.fetch_add(CHUNK, Ordering::Relaxed);
                        if from >= n {
                            break;
                        }
                        for i in from..(from + CHUNK).min(n) {
                            let seed = base.wrapping_add(i);
                            current[k].store(seed, Ordering::Relaxed);
                            quiet.lines.clear();
                            let found = execute(seed, &mut quiet);
                            if verbose {
                                eprintln!("seed {seed}:\n  {}", quiet.lines.join("\n  "));
                            }
                            heartbeat[k].fetch_add(1, Ordering::Relaxed);
                            done.fetch_add(1, Ordering::Relaxed);
                            if let Some(f) = found {
                                report(&failures, seed, f);
                            }
                        }
                    }
                })
                .expect("spawn")
        })
        .collect();

    // Progress and the watchdog: an execution that makes no progress for a long time is a wait
    // without a bound.
    let mut last = vec![0u64; threads as usize];
    let mut stalled = vec![0u32; threads as usize];
    let mut last_print = Instant::now();
    while workers.iter().any(|w| !w.is_finished()) {
        std::thread::sleep(Duration::from_millis(100));
        for k in 0..threads as usize {
            let h = heartbeat[k].load(Ordering::Relaxed);
            if h == last[k] && !workers[k].is_finished() {
                stalled[k] += 1;
            } else {
                stalled[k] = 0;
            }
            last[k] = h;
            if stalled[k] >= 50 {
                let seed = current[k].load(Ordering::Relaxed);
                let f = failures.lock().unwrap_or_else(|p| p.into_inner()).total + 1;
                println!(
                    "FAIL seed {seed}: no progress for 5 s (an unbounded wait?)\n  replay: \
                     tests/fuzz.sh 1 {seed}"
                );
                println!(
                    "fuzz: {} executions, {f} failures, seed {base}",
                    done.load(Ordering::Relaxed)
                );
                std::process::exit(1);
            }
        }
        if last_print.elapsed() > Duration::from_secs(30) {
            last_print = Instant::now();
            let d = done.load(Ordering::Relaxed);
            let f = failures.lock().unwrap_or_else(|p| p.into_inner()).total;
            eprintln!(
                "fuzz: {d}/{n} executions, {f} failures, {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    for w in workers {
        w.join().expect("worker");
    }
    let f = failures.lock().unwrap_or_else(|p| p.into_inner());
    if !f.distinct.is_empty() {
        println!("distinct failures (count, first seed):");
        for (sig, (count, seed, _)) in &f.distinct {
            println!("  {count:>8}  seed {seed:<22} {sig}");
        }
    }
    eprintln!(
        "fuzz: {:.1} s, {:.1} µs per execution per thread",
        started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64() * 1e6 * threads as f64 / n.max(1) as f64
    );
    println!("fuzz: {n} executions, {} failures, seed {base}", f.total);
    if f.total > 0 {
        std::process::exit(1);
    }
}

fn report(failures: &Mutex<Failures>, seed: u64, found: Found) {
    let mut f = failures.lock().unwrap_or_else(|p| p.into_inner());
    f.total += 1;
    let distinct = f.distinct.len();
    let entry = f.distinct.entry(found.signature.clone());
    let new = matches!(entry, std::collections::btree_map::Entry::Vacant(_));
    let e = entry.or_insert((0, seed, found.detail.clone()));
    e.0 += 1;
    if new && distinct < FULL_REPORTS {
        drop(f);
        // Replay with the trace on (executions are deterministic).
        let mut t = Trace {
            on: true,
            lines: Vec::new(),
        };
        BACKTRACE.with(|b| b.set(true));
        let again = execute(seed, &mut t);
        BACKTRACE.with(|b| b.set(false));
        let detail = match &again {
            Some(f) => f.detail.clone(),
            None => found.detail.clone(),
        };
        println!(
            "FAIL seed {seed}: {}\n  {}\n  replay: tests/fuzz.sh 1 {seed}\n  trace:\n    {}{}",
            found.signature,
            detail.replace('\n', "\n  "),
            t.lines.join("\n    "),
            if again.is_none() {
                "\n  (the replay did not fail: not deterministic?)"
            } else {
                ""
            }
        );
        failures.lock().unwrap_or_else(|p| p.into_inner()).printed += 1;
    } else if f.printed
        < std::env::var("FUZZ_LINES")
            .ok()
            .and_then(|v| parse(&v))
            .unwrap_or(MAX_LINES)
    {
        f.printed += 1;
        println!("FAIL seed {seed}: {}", found.signature);
    }
}

/// Whether a QP the driver holds in `state` reads as ERROR because the device moved it
/// there (from RTR or RTS, as a failed request does).
fn a_failed(res: &bareverbs::error::Result<QpAttr>, state: QpState) -> bool {
    matches!(res, Ok(a) if a.state == QpState::Err && matches!(state, QpState::Rtr | QpState::Rts))
}
