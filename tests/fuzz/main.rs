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

/// The frames of a backtrace that are this project's code (needs line tables), as
/// "function at file:line" lines.
fn own_frames() -> Vec<String> {
    let bt = std::backtrace::Backtrace::force_capture().to_string();
    let lines: Vec<&str> = bt.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let l = l.trim();
        if l.starts_with("at ")
            && (l.contains("/src/") || l.contains("/tests/"))
            && !l.contains("/rustc/")
            && !l.contains("/.cargo/")
        {
            let f = lines[i.saturating_sub(1)].trim();
            let f = f.split_once(": ").map_or(f, |(_, f)| f);
            if f != "own_frames" && f != "panic_hook" {
                out.push(format!("{f} {l}"));
            }
        }
    }
    out
}

/// Counts the driver's warnings: it logs one each time it keeps memory on purpose.
struct Logger;

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }

    fn log(&self, r: &log::Record<'_>) {
        if r.level() <= log::Level::Warn && r.target().starts_with("bareverbs") {
            WARNINGS.with(|w| w.set(w.get() + 1));
        }
    }

    fn flush(&self) {}
}

static LOGGER: Logger = Logger;

fn panic_hook(info: &panic::PanicHookInfo<'_>) {
    let msg = info
        .payload()
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| info.payload().downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(non-string panic)".into());
    let mut at = info
        .location()
        .map_or_else(String::new, |l| format!("{}:{}", l.file(), l.line()));
    let traced = BACKTRACE.with(Cell::get);
    let frames = if traced || at.contains("/rustc/") {
        own_frames()
    } else {
        Vec::new()
    };
    if at.contains("/rustc/") {
        // A panic inside core (an overflow in a method): name the project's caller.
        if let Some(f) = frames.iter().find(|f| !f.contains("tests/fuzz.rs")) {
            let site = f.rsplit("at ./").next().unwrap_or(f);
            at = format!("{} in core", site.rsplit_once(':').map_or(site, |(a, _)| a));
        }
    }
    let mut text = format!("{msg} (at {at})");
    if traced {
        text.push_str("\n    backtrace (this project's frames):");
        for f in &frames {
            text.push_str("\n      ");
            text.push_str(f);
        }
    }
    PANIC.with(|p| {
        let mut p = p.borrow_mut();
        if p.is_some() {
            // A panic while unwinding from another: the process aborts next. Say which seed.
            let seed = SEED.with(Cell::get);
            eprintln!(
                "fuzz: seed {seed}: panic while panicking ({text}; first: {}): aborting; \
                 replay with tests/fuzz.sh 1 {seed}",
                p.as_deref().unwrap_or("")
            );
        } else {
            *p = Some(text);
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Objects with stable addresses: queue pairs keep pointers to their PD, CQs and SRQ (the
// provider contract) and borrow them, so those are boxed and handed out as references whose
// lifetime this file vouches for with a count of users.

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

impl<'c> World<'c> {
    fn new(ctx: &'c Ctx, honest: bool, plain: bool) -> Self {
        World {
            ctx,
            honest,
            plain: honest && plain,
            posted: BTreeMap::new(),
            dead: BTreeMap::new(),
            strict: Vec::new(),
            pds: Vec::new(),
            cqs: Vec::new(),
            srqs: Vec::new(),
            mrs: Vec::new(),
            gids: Vec::new(),
            qps: Vec::new(),
            raw_qps: Vec::new(),
            unknown: false,
            leaked: false,
            complaints: Vec::new(),
        }
    }

    /// Looks at an error: kind and Display must work; an unknown outcome is remembered.
    fn err(&mut self, t: &mut Trace, e: &Error) {
        let _ = e.kind();
        let _ = write!(Sink, "{e}");
        self.unknown |= outcome_unknown(e);
        note!(t, "    -> Err({e:?})");
        // The driver checks every limit the device has before asking it to create anything:
        // an honest device that refuses a create was asked for something the driver let
        // through.
        if let Error::Device {
            op: op @ (Op::CreateQp | Op::CreateCq | Op::CreateSrq | Op::CreateMr | Op::CreatePd),
            ..
        } = e
            && self.honest
        {
            self.complain(t, format!("{op:?} refused by an honest device: {e:?}"));
        }
    }

    fn res<T: std::fmt::Debug>(&mut self, t: &mut Trace, r: &Result<T, Error>) {
        match r {
            Ok(v) => note!(t, "    -> Ok({v:?})"),
            Err(e) => self.err(t, e),
        }
    }

    fn complain(&mut self, t: &mut Trace, what: String) {
        note!(t, "    !! {what}");
        self.complaints.push(what);
    }

    /// An error where nothing can have gone wrong (a plain honest machine) is wrong.
    /// (A CQ without room for a new QP's completions is the driver's own refusal: the CQs of
    /// an execution fill up with the reservations of the QPs already on them.)
    fn must(&mut self, t: &mut Trace, what: &str, e: &Error) {
        self.err(t, e);
        let cq_room = matches!(
            e,
            Error::QueueFull {
                queue: bareverbs::error::Queue::Cq,
                ..
            }
        );
        if self.plain && !cq_room {
            self.complain(t, format!("{what} failed on a plain honest device: {e:?}"));
        }
    }

    /// Work requests posted to QP `qpn` (or to an SRQ: [`ANY_QP`]): each must complete once.
    fn posted<'a>(&mut self, qpn: u32, ids: impl Iterator<Item = &'a u64>) {
        for &id in ids {
            *self.posted.entry((qpn, id)).or_default() += 1;
        }
    }

    /// QP `qpn` was reset or destroyed: its requests not completed are dead (none of them may
    /// complete any more, on any QP).
    fn kill(&mut self, qpn: u32) {
        let gone: Vec<(u32, u64)> = self
            .posted
            .range((qpn, 0)..=(qpn, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            let n = self.posted.remove(&k).unwrap_or(0);
            *self.dead.entry(k).or_default() += n;
        }
    }

    /// A complaint that stands unless the device lied about a command's outcome: on an honest
    /// device at once, otherwise decided at the end of the execution.
    fn complain_strict(&mut self, t: &mut Trace, what: String) {
        if self.honest {
            self.complain(t, what);
        } else {
            note!(
                t,
                "    !! (unless a command's outcome was lied about) {what}"
            );
            self.strict.push(what);
        }
    }

    /// A completion polled must be of a request posted to its QP (or its SRQ) and not yet
    /// completed, whatever the device wrote: a wr_id never posted, one already completed, and
    /// one of a QP reset or destroyed since are wrong.
    fn completed(&mut self, t: &mut Trace, wc: &WorkCompletion) {
        let key = (wc.qp_num, wc.wr_id);
        let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        for k in [Some(key), recv.then_some((ANY_QP, wc.wr_id))]
            .into_iter()
            .flatten()
        {
            if let Some(n) = self.posted.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.posted.remove(&k);
                }
                return;
            }
        }
        let what = if self.dead.contains_key(&key) {
            "of a request its QP lost to a reset or a destroy"
        } else {
            "not posted or already completed"
        };
        self.complain_strict(
            t,
            format!(
                "a completion for wr_id {:#x} on QP {}, {what}",
                wc.wr_id, wc.qp_num
            ),
        );
    }

    /// A poll (or a future) failed: on an honest device no completion is ever refused.
    fn poll_failed(&mut self, t: &mut Trace, e: &Error) {
        self.err(t, e);
        if self.honest && matches!(e, Error::Protocol { .. }) {
            self.complain(
                t,
                format!("a completion refused on an honest device: {e:?}"),
            );
        }
    }

    fn pd(&self, i: usize) -> &'c Pd<'c> {
        // SAFETY: callers register as users before keeping the reference.
        unsafe { self.pds[i].as_ref().expect("live PD").get() }
    }

    fn cq(&self, i: usize) -> &'c Cq<'c> {
        // SAFETY: as for `pd`.
        unsafe { self.cqs[i].as_ref().expect("live CQ").get() }
    }

    fn srq(&self, i: usize) -> &'c Srq<'c> {
        // SAFETY: as for `pd`.
        unsafe { self.srqs[i].as_ref().expect("live SRQ").0.get() }
    }

    fn use_pd(&mut self, i: usize, d: i32) {
        let o = self.pds[i].as_mut().expect("live PD");
        o.users = o.users.checked_add_signed(d).expect("PD users");
    }

    fn use_cq(&mut self, i: usize, d: i32) {
        let o = self.cqs[i].as_mut().expect("live CQ");
        o.users = o.users.checked_add_signed(d).expect("CQ users");
    }

    fn use_srq(&mut self, i: usize, d: i32) {
        let o = &mut self.srqs[i].as_mut().expect("live SRQ").0;
        o.users = o.users.checked_add_signed(d).expect("SRQ users");
    }

    fn bound_gid(&self, r: &mut Rng) -> Option<(u8, Gid)> {
        if self.gids.is_empty() {
            return None;
        }
        let g = &self.gids[r.below(self.gids.len() as u64) as usize];
        Some((g.index().min(255) as u8, g.gid()))
    }

    // -----------------------------------------------------------------------------------------
    // Operations.

    fn step(&mut self, r: &mut Rng, t: &mut Trace) {
        match r.below(100) {
            0..=1 => self.query_port(r, t),
            2 => self.query_pkey(r, t),
            3..=6 => self.alloc_pd(t),
            7..=8 => self.destroy_pd(r, t),
            9..=12 => self.create_cq(r, t),
            13..=14 => self.destroy_cq(r, t),
            15..=17 => self.bind_gid(r, t),
            18 => self.unbind_gid(r, t),
            19..=24 => self.register_mr(r, t),
            25..=26 => self.destroy_mr(r, t),
            27..=32 => self.create_qp(r, t),
            33..=34 => self.raw_qp(r, t),
            35..=41 => self.modify_qp(r, t),
            42..=43 => self.query_qp(r, t),
            44..=46 => self.destroy_qp(r, t),
            47..=49 => self.create_srq(r, t),
            50 => self.destroy_srq(r, t),
            51..=57 => self.connect(r, t),
            _ => data::op(self, r, t),
        }
    }

    fn query_port(&mut self, r: &mut Rng, t: &mut Trace) {
        let port = r.pick(&[1, 1, 1, 1, 1, 0, 2, 255]);
        note!(t, "query_port({port})");
        let res = self.ctx.query_port(port);
        self.res(t, &res);
    }

    fn query_pkey(&mut self, r: &mut Rng, t: &mut Trace) {
        let port = r.pick(&[1, 1, 1, 0, 2]);
        let index = r.pick(&[0, 0, 0, 0, 0, 1, 255, 256, u16::MAX]);
        note!(t, "query_pkey({port}, {index})");
        let res = self.ctx.query_pkey(port, index);
        self.res(t, &res);
    }

    fn alloc_pd(&mut self, t: &mut Trace) {
        note!(t, "alloc_pd() = #{}", self.pds.len());
        match self.ctx.alloc_pd() {
            Ok(pd) => {
                note!(t, "    -> Ok(handle {})", pd.raw().handle());
                self.pds.push(Some(Owned::new(pd)));
            }
            Err(e) => self.err(t, &e),
        }
    }

    fn destroy_pd(&mut self, r: &mut Rng, t: &mut Trace) {
        let Some(i) = pick_live(r, &self.pds).filter(|&i| self.pds[i].as_ref().unwrap().users == 0)
        else {
            return;
        };
        let explicit = r.below(2) == 0;
        note!(t, "destroy_pd(#{i}, explicit {explicit})");
        let pd = self.pds[i].take().unwrap().take();
        if explicit {
            if let Err((pd, e)) = pd.destroy() {
                self.err(t, &e);
                self.pds[i] = Some(Owned::new(pd));
            }
        } else {
            drop(pd);
        }
    }

    fn create_cq(&mut self, r: &mut Rng, t: &mut Trace) {
        let max = self.ctx.caps().max_cqe;
        let entries = count(
            r,
            300,
            &[
                0,
                1,
                63,
                64,
                65,
                4095,
                4096,
                4097,
                8192,
                max,
                max.wrapping_add(1),
                u32::MAX,
                0x8000_0000,
            ],
        );
        note!(t, "create_cq({entries}) = #{}", self.cqs.len());
        match self.ctx.create_cq(entries) {
            Ok(cq) => {
                let n = cq.entries();
                note!(t, "    -> Ok(entries {n}, handle {})", cq.raw().handle());
                if n < entries.max(1) || !n.is_power_of_two() {
                    self.complain(t, format!("create_cq({entries}) gave {n} entries"));
                }
                self.cqs.push(Some(Owned::new(cq)));
            }
            Err(e) => self.err(t, &e),
        }
    }

    fn destroy_cq(&mut self, r: &mut Rng, t: &mut Trace) {
        let Some(i) = pick_live(r, &self.cqs).filter(|&i| self.cqs[i].as_ref().unwrap().users == 0)
        else {
            return;
        };
        let explicit = r.below(2) == 0;
        note!(t, "destroy_cq(#{i}, explicit {explicit})");
        let cq = self.cqs[i].take().unwrap().take();
        if explicit {
            if let Err((cq, e)) = cq.destroy() {
                self.err(t, &e);
                self.cqs[i] = Some(Owned::new(cq));
            }
        } else {
            drop(cq);
        }
    }

    fn bind_gid(&mut self, r: &mut Rng, t: &mut Trace) {
        let len = self.ctx.caps().gid_tbl_len;
        let index = count(r, 3, &[254, 255, 256, len.wrapping_sub(1), len, u32::MAX]);
        let mut gid = Gid::link_local_from_mac([0x52, 0x54, 0, 0x12, 0x34, r.below(256) as u8]);
        if r.below(4) == 0 {
            gid = Gid(r.next_u64().to_le_bytes().repeat(2).try_into().unwrap());
        }
        note!(t, "bind_gid({index}, {:02x?})", gid.0);
        match self.ctx.bind_gid(index, gid) {
            Ok(g) => {
                note!(t, "    -> Ok");
                self.gids.push(g);
            }
            Err(e) => self.err(t, &e),
        }
    }

    fn unbind_gid(&mut self, r: &mut Rng, t: &mut Trace) {
        if self.gids.is_empty() {
            return;
        }
        let i = r.below(self.gids.len() as u64) as usize;
        let g = self.gids.swap_remove(i);
        let explicit = r.below(2) == 0;
        note!(t, "unbind_gid(index {}, explicit {explicit})", g.index());
        if explicit {
            let res = g.unbind();
            self.res(t, &res);
        } else {
            drop(g);
        }
    }

    fn register_mr(&mut self, r: &mut Rng, t: &mut Trace) {
        let Some(pd) = pick_live(r, &self.pds) else {
            return;
        };
        let max = usize::try_from(self.ctx.caps().max_mr_size).unwrap_or(usize::MAX);
        // Mostly small; the large edges are rare (a region of max_mr_size costs milliseconds).
        let len = match r.below(100) {
            0..=79 => 1 + r.below(3 * 4096) as usize,
            80..=97 => r.pick(&[0, 1, 4095, 4096, 4097, 64 << 10]),
            _ => r.pick(&[max, max.wrapping_add(1), 1 << 30, (1 << 30) + 1, usize::MAX]),
        };
        let access = AccessFlags::from_bits_truncate(r.below(32) as u32);
        note!(
            t,
            "register_mr(pd #{pd}, {len}, {access:?}) = #{}",
            self.mrs.len()
        );
        match self.pd(pd).register(len, access) {
            Ok(mr) => {
                note!(
                    t,
                    "    -> Ok(lkey {:#x}, rkey {:#x}, addr {:#x})",
                    mr.lkey(),
                    mr.rkey(),
                    mr.addr()
                );
                self.use_pd(pd, 1);
                self.mrs.push((mr, pd));
            }
            Err(e) => self.err(t, &e),
        }
    }

    fn destroy_mr(&mut self, r: &mut Rng, t: &mut Trace) {
        if self.mrs.is_empty() {
            return;
        }
        let i = r.below(self.mrs.len() as u64) as usize;
        let (mr, pd) = self.mrs.swap_remove(i);
        let explicit = r.below(2) == 0;
        note!(t, "destroy_mr(lkey {:#x}, explicit {explicit})", mr.lkey());
        if explicit {
            if let Err((mr, e)) = mr.destroy() {
                self.err(t, &e);
                self.mrs.push((mr, pd));
                return;
            }
        } else {
            drop(mr);
        }
        self.use_pd(pd, -1);
    }

    fn qp_caps(&self, r: &mut Rng) -> QpCaps {
        let c = self.ctx.caps();
        let wr = |r: &mut Rng| {
            count(
                r,
                16,
                &[
                    17,
                    100,
                    2048,
                    2049,
                    4096,
                    c.max_qp_wr,
                    c.max_qp_wr.wrapping_add(1),
                    u32::MAX,
                    0x8000_0000,
                ],
            )
        };
        let sge = |r: &mut Rng| {
            count(
                r,
                4,
                &[
                    5,
                    c.max_sge,
                    c.max_sge.wrapping_add(1),
                    256,
                    4096,
                    0x1_0000,
                    0x0100_0000,
                    0x0800_0000,
                    0x1000_0000,
                    u32::MAX / 16,
                    u32::MAX,
                ],
            )
        };
        QpCaps {
            max_send_wr: wr(r),
            max_recv_wr: wr(r),
            max_send_sge: sge(r),
            max_recv_sge: sge(r),
            max_inline_data: if r.below(64) == 0 { 1 } else { 0 },
        }
    }

    /// A PD, two CQs and maybe an SRQ for a new QP (all of the same world).
    fn qp_parts(&self, r: &mut Rng) -> Option<(usize, usize, usize, Option<usize>)> {
        let pd = pick_live(r, &self.pds)?;
        let scq = pick_live(r, &self.cqs)?;
        let rcq = if r.below(2) == 0 {
            scq
        } else {
            pick_live(r, &self.cqs)?
        };
        let srq = if r.below(5) == 0 {
            pick_live(r, &self.srqs)
        } else {
            None
        };
        Some((pd, scq, rcq, srq))
    }

    fn add_users(&mut self, pd: usize, scq: usize, rcq: usize, srq: Option<usize>, d: i32) {
        self.use_pd(pd, d);
        self.use_cq(scq, d);
        self.use_cq(rcq, d);
        if let Some(s) = srq {
            self.use_srq(s, d);
        }
    }

    fn create_qp(&mut self, r: &mut Rng, t: &mut Trace) {
        let Some((pd, scq, rcq, srq)) = self.qp_parts(r) else {
            return;
        };
        let caps = self.qp_caps(r);
        let ty = r.below(24);
        let sig = r.below(2) == 0;
        let mut ex = QpInitEx::default();
        match r.below(64) {
            0 => ex.create_flags = CreateFlags::SCATTER_FCS,
            1 => ex.source_qpn = Some(5),
            2 => ex.max_tso_header = 64,
            3 => ex.xrcd = Some(1),
            _ => {}
        }
        note!(
            t,
            "create_qp(type {ty}, pd #{pd}, cqs #{scq} #{rcq}, srq {srq:?}, {caps:?}, \
             sig_all {sig}, {ex:?}) = #{}",
            self.qps.len()
        );
        let mut b = self
            .pd(pd)
            .qp_builder(self.cq(scq), self.cq(rcq))
            .caps(caps)
            .sq_sig_all(sig)
            .ex(ex);
        if let Some(s) = srq {
            b = b.srq(self.srq(s));
        }
        let res = match ty {
            0..=10 => b.build::<Rc>().map(|q| AnyQp::Rc(St::Reset(q))),
            11..=19 => b.build::<Ud>().map(|q| AnyQp::Ud(St::Reset(q))),
            20..=22 => b.build::<Gsi>().map(|q| AnyQp::Gsi(St::Reset(q))),
            _ => match b.build::<Uc>() {
                Ok(q) => {
                    drop(q);
                    self.complain(t, "a UC QP was created".into());
                    return;
                }
                Err(e) => Err(e),
            },
        };
        match res {
            Ok(q) => {
                let (qpn, got) = on_qp!(&q, s => on_st!(s, q => (q.qp_num(), q.caps())));
                note!(t, "    -> Ok(qpn {qpn}, {got:?})");
                let short = got.max_send_wr < caps.max_send_wr.max(1)
                    || got.max_send_sge < caps.max_send_sge.max(1)
                    || (srq.is_none()
                        && (got.max_recv_wr < caps.max_recv_wr.max(1)
                            || got.max_recv_sge < caps.max_recv_sge.max(1)));
                if short {
                    self.complain(t, format!("QP caps {got:?} for a request of {caps:?}"));
                }
                self.add_users(pd, scq, rcq, srq, 1);
                self.qps.push(QpEntry {
                    qp: Some(q),
                    pd,
                    scq,
                    rcq,
                    srq,
                    qpn,
                    qkey: 0,
                    held: Vec::new(),
                });
            }
            Err(e) => self.err(t, &e),
        }
    }

    /// A QP created, modified, queried and destroyed at the provider level: no bookkeeping
    /// capacity, so the device's largest queues too.
    fn raw_qp(&mut self, r: &mut Rng, t: &mut Trace) {
        let p = self.ctx.provider();
        if !self.raw_qps.is_empty() && r.below(2) == 0 {
            let i = r.below(self.raw_qps.len() as u64) as usize;
            let state = self.raw_qps[i].state;
            let to = match r.below(6) {
                0 => QpState::Reset,
                1 => QpState::Err,
                _ => match state {
                    QpState::Reset => QpState::Init,
                    QpState::Init => QpState::Rtr,
                    QpState::Rtr => QpState::Rts,
                    _ => QpState::Reset,
                },
            };
            let Some(qp) = self.raw_qps[i].qp.as_mut() else {
                return;
            };
            if r.below(3) == 0 {
                note!(t, "raw query_qp(#{i})");
                let res = p.query_qp(qp);
                self.res(t, &res);
                return;
            }
            note!(t, "raw modify_qp(#{i}, {state:?} -> {to:?})");
            let res = p.modify_qp(qp, &ModifyAttr::to_state(to));
            if res.is_ok() {
                self.raw_qps[i].state = to;
            }
            self.res(t, &res);
            return;
        }
        let Some((pd, scq, rcq, srq)) = self.qp_parts(r) else {
            return;
        };
        let mut caps = self.qp_caps(r);
        if r.below(2) == 0 {
            caps.max_send_wr = r.pick(&[64, 512, 1024, 2048, 4096, 8192]);
            caps.max_recv_wr = r.pick(&[64, 512, 1024, 2048, 4096, 8192]);
        }
        let qp_type = r.pick(&[QpType::Rc, QpType::Ud, QpType::Gsi, QpType::Uc]);
        let init = QpInit {
            qp_type,
            caps,
            sq_sig_all: r.below(2) == 0,
            has_srq: srq.is_some(),
            ex: QpInitEx::default(),
            safe: None,
        };
        note!(t, "raw create_qp({init:?}) = #{}", self.raw_qps.len());
        let plan = p.plan_qp(&init);
        self.res(t, &plan);
        if plan.is_err() && r.below(4) != 0 {
            return;
        }
        let (pdr, scqr, rcqr) = (self.pd(pd).raw(), self.cq(scq).raw(), self.cq(rcq).raw());
        let srqr = srq.map(|s| self.srq(s).raw());
        // SAFETY: the PD, CQs and SRQ are boxed (they do not move) and count this QP as a user
        // until it is destroyed (or leaked), which happens before the context goes.
        let res = unsafe { p.create_qp(pdr, scqr, rcqr, srqr, &init) };
        match res {
            Ok(qp) => {
                note!(t, "    -> Ok(qpn {}, {:?})", p.qp_num(&qp), p.qp_caps(&qp));
                self.add_users(pd, scq, rcq, srq, 1);
                self.raw_qps.push(RawQp {
                    qp: Some(qp),
                    state: QpState::Reset,
                    pd,
                    scq,
                    rcq,
                    srq,
                });
            }
            Err(e) => self.err(t, &e),
        }
    }

    fn attrs(&self, r: &mut Rng, peer: Option<u32>) -> Attrs {
        let good = r.below(4) != 0;
        let psn = |r: &mut Rng| {
            if good {
                r.below(1 << 24) as u32
            } else {
                r.pick(&[0, 0x00FF_FFFF, 0x0100_0000, u32::MAX])
            }
        };
        let port = if good { 1 } else { r.pick(&[0, 1, 2, 255]) };
        let pkey_index = if good {
            0
        } else {
            r.pick(&[0, 1, 2, u16::MAX])
        };
        let (sgid, dgid) = self
            .bound_gid(r)
            .filter(|_| good)
            .unwrap_or_else(|| (r.pick(&[0, 1, 254, 255]), Gid([0xFE; 16])));
        let mut av = AddressVector::new(dgid, sgid);
        if !good {
            av.flow_label = r.pick(&[0, 0xF_FFFF, 0x10_0000, u32::MAX]);
            av.hop_limit = r.pick(&[0, 1, 255]);
            av.traffic_class = r.below(256) as u8;
        }
        let dest = match peer {
            Some(q) if good => q,
            _ => r.pick(&[0, 1, 0x11, 0x00FF_FFFF, 0x0100_0000]),
        };
        let mut crtr = ConnectedRtr::new(dest, psn(r), av);
        if !good {
            crtr.path_mtu = r.pick(&[Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096]);
            crtr.max_dest_rd_atomic = r.pick(&[0, 1, 16, 255]);
            crtr.min_rnr_timer = r.below(256) as u8;
        }
        let mut crts = ConnectedRts::new(psn(r));
        if !good {
            crts.max_rd_atomic = r.pick(&[0, 1, 16, 255]);
            crts.timeout = r.below(256) as u8;
            crts.retry_cnt = r.below(256) as u8;
            crts.rnr_retry = r.below(256) as u8;
        }
        let any = r.next_u64() as u32;
        let qkey = r.pick(&[0x1111_1111, 0, 0x8000_0000, u32::MAX, any]);
        Attrs {
            cinit: ConnectedInit {
                port,
                pkey_index,
                access: AccessFlags::from_bits_truncate(r.below(32) as u32),
            },
            crtr,
            crts,
            dinit: DatagramInit {
                port,
                pkey_index,
                qkey,
            },
            drts: DatagramRts { sq_psn: psn(r) },
        }
    }

    /// Modifies QP `i`; returns the result.
    fn modify(&mut self, t: &mut Trace, i: usize, m: Move, a: &Attrs) -> bool {
        let Some(q) = self.qps[i].qp.take() else {
            return false;
        };
        note!(t, "modify_qp(#{i}, {m:?})");
        let before = on_qp!(&q, s => s.state());
        let (q, res) = match q {
            AnyQp::Rc(s) => {
                let (s, res) = rc_move(s, m, a);
                (AnyQp::Rc(s), res)
            }
            AnyQp::Ud(s) => {
                let (s, res) = dg_move(s, m, a);
                (AnyQp::Ud(s), res)
            }
            AnyQp::Gsi(s) => {
                let (s, res) = dg_move(s, m, a);
                (AnyQp::Gsi(s), res)
            }
        };
        let state = on_qp!(&q, s => s.state());
        note!(t, "    now {state:?}");
        self.qps[i].qp = Some(q);
        if state == QpState::Reset && before != QpState::Reset {
            // The reset drops the requests outstanding: none of them completes.
            self.kill(self.qps[i].qpn);
        }
        if res.is_ok() && matches!(m, Move::Next | Move::Ready) {
            self.qps[i].qkey = a.dinit.qkey;
        }
        self.res(t, &res);
        res.is_ok()
    }

    fn modify_qp(&mut self, r: &mut Rng, t: &mut Trace) {
        if self.qps.is_empty() {
            return;
        }
        let i = r.below(self.qps.len() as u64) as usize;
        let m = match r.below(10) {
            0 => Move::Reset,
            1 => Move::Error,
            2 => Move::Ready,
            _ => Move::Next,
        };
        let peer =
            (!self.qps.is_empty()).then(|| self.qps[r.below(self.qps.len() as u64) as usize].qpn);
        let a = self.attrs(r, peer);
        self.modify(t, i, m, &a);
    }

    fn query_qp(&mut self, r: &mut Rng, t: &mut Trace) {
        if self.qps.is_empty() {
            return;
        }
        let i = r.below(self.qps.len() as u64) as usize;
        let Some(q) = self.qps[i].qp.as_ref() else {
            return;
        };
        let (res, state, qpn) = on_qp!(q, s => (s.query(), s.state(), s.qp_num()));
        note!(t, "query_qp(#{i}) in {state:?}");
        // A device moves a connected QP to ERROR on its own when a request fails (the
        // model's `Semantics::Verbs`, as rxe and hardware): that is no lie.
        let failed = a_failed(&res, state);
        if let Ok(a) = &res
            && self.honest
            && !failed
            && (a.state != state || a.qp_num != qpn)
        {
            self.complain(
                t,
                format!("query_qp in {state:?} (qpn {qpn}) says {a:?} on an honest device"),
            );
        }
        self.res(t, &res);
    }

    fn drop_qp_entry(&mut self, e: QpEntry<'c>) {
        self.kill(e.qpn);
        self.add_users(e.pd, e.scq, e.rcq, e.srq, -1);
        for pd in e.held {
            self.use_pd(pd, -1);
        }
    }

    fn destroy_qp(&mut self, r: &mut Rng, t: &mut Trace) {
        if !self.raw_qps.is_empty() && r.below(3) == 0 {
            let i = r.below(self.raw_qps.len() as u64) as usize;
            self.destroy_raw_qp(t, i);
            return;
        }
        if self.qps.is_empty() {
            return;
        }
        let i = r.below(self.qps.len() as u64) as usize;
        let explicit = r.below(2) == 0;
        note!(t, "destroy_qp(#{i}, explicit {explicit})");
        let Some(q) = self.qps[i].qp.take() else {
            return;
        };
        if explicit {
            let res = match q {
                AnyQp::Rc(s) => s.destroy().map_err(|(s, e)| (AnyQp::Rc(s), e)),
                AnyQp::Ud(s) => s.destroy().map_err(|(s, e)| (AnyQp::Ud(s), e)),
                AnyQp::Gsi(s) => s.destroy().map_err(|(s, e)| (AnyQp::Gsi(s), e)),
            };
            if let Err((q, e)) = res {
                self.err(t, &e);
                self.qps[i].qp = Some(q);
                return;
            }
        } else {
            drop(q);
        }
        let e = self.qps.swap_remove(i);
        self.drop_qp_entry(e);
    }

    fn destroy_raw_qp(&mut self, t: &mut Trace, i: usize) {
        note!(t, "raw destroy_qp(#{i})");
        let Some(qp) = self.raw_qps[i].qp.take() else {
            return;
        };
        if let Err((qp, e)) = self.ctx.provider().destroy_qp(qp) {
            self.err(t, &e);
            // As the verbs layer's Drop does: the device may still use it; keep its memory.
            std::mem::forget(qp);
            self.leaked = true;
        }
        let q = self.raw_qps.swap_remove(i);
        self.add_users(q.pd, q.scq, q.rcq, q.srq, -1);
    }

    fn create_srq(&mut self, r: &mut Rng, t: &mut Trace) {
        let Some(pd) = pick_live(r, &self.pds) else {
            return;
        };
        let c = self.ctx.caps();
        let attr = SrqAttr {
            max_wr: count(
                r,
                64,
                &[
                    65,
                    128,
                    4096,
                    c.max_srq_wr,
                    c.max_srq_wr.wrapping_add(1),
                    u32::MAX,
                ],
            ),
            max_sge: count(
                r,
                4,
                &[
                    5,
                    c.max_srq_sge,
                    c.max_srq_sge.wrapping_add(1),
                    256,
                    0x0100_0000,
                    0x1000_0000,
                    u32::MAX,
                ],
            ),
            srq_limit: count(r, 4, &[64, 65, u32::MAX]),
        };
        note!(t, "create_srq(pd #{pd}, {attr:?}) = #{}", self.srqs.len());
        match self.pd(pd).create_srq(attr) {
            Ok(s) => {
                let got = s.attr();
                note!(t, "    -> Ok({got:?})");
                if got.max_wr < attr.max_wr.max(1) || got.max_sge < attr.max_sge.max(1) {
                    self.complain(t, format!("SRQ attr {got:?} for a request of {attr:?}"));
                }
                self.use_pd(pd, 1);
                self.srqs.push(Some((Owned::new(s), pd)));
            }
            Err(e) => self.err(t, &e),
        }
    }

    fn destroy_srq(&mut self, r: &mut Rng, t: &mut Trace) {
        let Some(i) =
            pick_live(r, &self.srqs).filter(|&i| self.srqs[i].as_ref().unwrap().0.users == 0)
        else {
            return;
        };
        let explicit = r.below(2) == 0;
        note!(t, "destroy_srq(#{i}, explicit {explicit})");
        let (s, pd) = self.srqs[i].take().unwrap();
        let s = s.take();
        if explicit {
            if let Err((s, e)) = s.destroy() {
                self.err(t, &e);
                self.srqs[i] = Some((Owned::new(s), pd));
                return;
            }
        } else {
            drop(s);
        }
        self.use_pd(pd, -1);
    }

    /// Sets up what traffic needs: a bound GID, a PD, a CQ, and either two RC QPs connected to
    /// each other or a UD QP, all the way to RTS.
    fn connect(&mut self, r: &mut Rng, t: &mut Trace) {
        note!(t, "connect:");
        if self.gids.is_empty() {
            let gid = Gid::link_local_from_mac([0x52, 0x54, 0, 0x12, 0x34, 0x57]);
            note!(t, "  bind_gid(0)");
            match self.ctx.bind_gid(0, gid) {
                Ok(g) => self.gids.push(g),
                Err(e) => return self.must(t, "bind_gid(0)", &e),
            }
        }
        if live(&self.pds).is_empty() {
            note!(t, "  alloc_pd()");
            match self.ctx.alloc_pd() {
                Ok(pd) => self.pds.push(Some(Owned::new(pd))),
                Err(e) => return self.must(t, "alloc_pd", &e),
            }
        }
        if live(&self.cqs).is_empty() {
            note!(t, "  create_cq(256)");
            match self.ctx.create_cq(256) {
                Ok(cq) => self.cqs.push(Some(Owned::new(cq))),
                Err(e) => return self.must(t, "create_cq(256)", &e),
            }
        }
        let first = self.qps.len();
        let ud = r.below(3) == 0;
        for _ in 0..if ud { 1 } else { 2 } {
            let Some((pd, scq, rcq, _)) = self.qp_parts(r) else {
                return;
            };
            let caps = QpCaps {
                max_send_wr: 1 + r.below(16) as u32,
                max_recv_wr: 1 + r.below(16) as u32,
                max_send_sge: 1 + r.below(4) as u32,
                max_recv_sge: 1 + r.below(4) as u32,
                max_inline_data: 0,
            };
            note!(
                t,
                "  create_qp(ud {ud}, pd #{pd}, cqs #{scq} #{rcq}, {caps:?})"
            );
            let b = self
                .pd(pd)
                .qp_builder(self.cq(scq), self.cq(rcq))
                .caps(caps);
            let res = if ud {
                b.build::<Ud>().map(|q| AnyQp::Ud(St::Reset(q)))
            } else {
                b.build::<Rc>().map(|q| AnyQp::Rc(St::Reset(q)))
            };
            match res {
                Ok(q) => {
                    let qpn = on_qp!(&q, s => s.qp_num());
                    self.add_users(pd, scq, rcq, None, 1);
                    self.qps.push(QpEntry {
                        qp: Some(q),
                        pd,
                        scq,
                        rcq,
                        srq: None,
                        qpn,
                        qkey: 0,
                        held: Vec::new(),
                    });
                }
                Err(e) => return self.must(t, "create_qp", &e),
            }
        }
        let n = self.qps.len() - first;
        for k in 0..n {
            let i = first + k;
            let peer = self.qps[first + (k + 1) % n].qpn;
            let mut a = self.attrs(r, Some(peer));
            // Good values throughout (`attrs` makes a quarter of them edges).
            if let Some((sgid, gid)) = self.bound_gid(r) {
                a.crtr = ConnectedRtr::new(peer, 0, AddressVector::new(gid, sgid));
            }
            a.cinit = ConnectedInit {
                access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
                ..Default::default()
            };
            a.crts = ConnectedRts::new(0);
            a.dinit = DatagramInit::new(0x1111_1111);
            a.drts = DatagramRts { sq_psn: 0 };
            let moves: &[Move] = if ud {
                &[Move::Ready]
            } else {
                &[Move::Next, Move::Next, Move::Next]
            };
            for &m in moves {
                if !self.modify(t, i, m, &a) {
                    if self.plain {
                        self.complain(t, format!("{m:?} failed on a plain honest device"));
                    }
                    break;
                }
            }
        }
    }

    /// Drops everything, dependents first, each class in a random order, explicitly or not.
    fn teardown(mut self, r: &mut Rng, t: &mut Trace) -> (bool, bool, Vec<String>, Vec<String>) {
        note!(t, "teardown");
        if self.honest {
            self.flush_all(r, t);
        }
        while !self.raw_qps.is_empty() {
            let i = r.below(self.raw_qps.len() as u64) as usize;
            self.destroy_raw_qp(t, i);
        }
        while !self.qps.is_empty() {
            let i = r.below(self.qps.len() as u64) as usize;
            if r.below(2) == 0 {
                self.destroy_qp_at(t, i);
            } else {
                let mut e = self.qps.swap_remove(i);
                drop(e.qp.take());
                self.drop_qp_entry(e);
            }
        }
        while !self.mrs.is_empty() {
            let (mr, pd) = self
                .mrs
                .swap_remove(r.below(self.mrs.len() as u64) as usize);
            drop(mr);
            self.use_pd(pd, -1);
        }
        for i in live(&self.srqs) {
            let (s, pd) = self.srqs[i].take().unwrap();
            drop(s.take());
            self.use_pd(pd, -1);
        }
        for i in live(&self.cqs) {
            drop(self.cqs[i].take().unwrap().take());
        }
        for i in live(&self.pds) {
            drop(self.pds[i].take().unwrap().take());
        }
        while !self.gids.is_empty() {
            drop(
                self.gids
                    .swap_remove(r.below(self.gids.len() as u64) as usize),
            );
        }
        (
            self.unknown,
            self.leaked,
            std::mem::take(&mut self.complaints),
            std::mem::take(&mut self.strict),
        )
    }

    /// Exactly once, on an honest device: every QP goes to ERR and every CQ is polled dry;
    /// then every request posted to those QPs has completed (once: `completed` checks that).
    fn flush_all(&mut self, r: &mut Rng, t: &mut Trace) {
        note!(t, "flush every QP");
        let a = self.attrs(r, None);
        for i in 0..self.qps.len() {
            let s = self.qps[i].qp.as_ref().map(|q| on_qp!(q, s => s.state()));
            if s.is_some_and(|s| s != QpState::Err) {
                self.modify(t, i, Move::Error, &a);
            }
        }
        for _ in 0..64 {
            let mut any = false;
            for i in live(&self.cqs) {
                let mut wc = [WorkCompletion::default(); 16];
                match self.cq(i).poll(&mut wc) {
                    Ok(k) => {
                        note!(t, "  poll_cq(#{i}) {:?}", &wc[..k]);
                        for c in &wc[..k] {
                            self.completed(t, c);
                        }
                        any |= k > 0;
                    }
                    Err(e) => {
                        self.poll_failed(t, &e);
                        any = true;
                    }
                }
            }
            if !any {
                break;
            }
        }
        let flushed: Vec<u32> = self
            .qps
            .iter()
            .filter(|e| {
                e.qp.as_ref()
                    .is_some_and(|q| on_qp!(q, s => s.state()) == QpState::Err)
            })
            .map(|e| e.qpn)
            .collect();
        let left: Vec<(u32, u64)> = self
            .posted
            .keys()
            .filter(|k| flushed.contains(&k.0))
            .copied()
            .collect();
        if let Some(&(qpn, id)) = left.first() {
            self.complain(
                t,
                format!(
                    "every QP flushed and every CQ polled dry, {} requests never completed \
                     (wr_id {id:#x} on QP {qpn}, ...)",
                    left.len()
                ),
            );
        }
    }

    /// Explicitly destroys QP `i` (teardown: a failure drops it, which keeps its memory).
    fn destroy_qp_at(&mut self, t: &mut Trace, i: usize) {
        note!(t, "destroy_qp(#{i})");
        if let Some(q) = self.qps[i].qp.take() {
            let res = on_qp!(q, s => s.destroy().map_err(|(s, e)| {
                drop(s);
                e
            }));
            if let Err(e) = res {
                self.err(t, &e);
            }
        }
        let e = self.qps.swap_remove(i);
        self.drop_qp_entry(e);
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
// The data path: every posting and polling call of this file is here, so that a new data-path
// API is a change of this module only.

mod data {
    use super::*;

    pub(super) fn op(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
        match r.below(20) {
            0..=5 => post_send(w, r, t),
            6..=8 => post_recv(w, r, t),
            9 => srq_recv(w, r, t),
            10..=11 => safe_post(w, r, t),
            12..=14 => poll_cq(w, r, t),
            15 => churn(w, r, t),
            16 => await_cq(w, r, t),
            17..=18 => poll_qp(w, r, t),
            _ => arm(w, r, t),
        }
    }

    /// `n` scatter/gather entries: mostly inside regions of `pd`, sometimes anywhere.
    fn sges(w: &World<'_>, r: &mut Rng, pd: usize, n: u32) -> Vec<Sge> {
        let own: Vec<usize> = (0..w.mrs.len()).filter(|&i| w.mrs[i].1 == pd).collect();
        (0..n)
            .map(|_| {
                let pool = if own.is_empty() || r.below(8) == 0 {
                    (0..w.mrs.len()).collect()
                } else {
                    own.clone()
                };
                if pool.is_empty() || r.below(16) == 0 {
                    return Sge {
                        addr: r.next_u64(),
                        length: r.below(8192) as u32,
                        lkey: r.next_u64() as u32,
                    };
                }
                let mr = &w.mrs[r.pick(&pool)].0;
                let len = mr.len() as u64;
                let off = r.below(len.min(1 << 16) + 1);
                // Payloads stay small (the model copies them); the edges are beyond the region.
                let length = if r.below(10) == 0 {
                    r.pick(&[0, u32::MAX, len as u32 + 1])
                } else {
                    r.below((len - off).min(1 << 14) + 1) as u32
                };
                Sge {
                    addr: mr.addr().wrapping_add(off),
                    length,
                    lkey: mr.lkey(),
                }
            })
            .collect()
    }

    fn wr_id(r: &mut Rng) -> u64 {
        // The full 64 bits are the caller's.
        r.next_u64()
    }

    /// A UD destination: an address handle (its source GID index sometimes made up: the
    /// driver must refuse what it cannot send from), a QP number and a Q_Key.
    fn ud_dest(w: &World<'_>, r: &mut Rng) -> (AddressVector, u32, u32) {
        let (mut sgid, gid) = w.bound_gid(r).unwrap_or((0, Gid([0; 16])));
        if r.below(16) == 0 {
            // A source GID index the caller made up.
            sgid = r.pick(&[1, 7, 200, 254, 255]);
        }
        let uds: Vec<&QpEntry<'_>> = w
            .qps
            .iter()
            .filter(|e| matches!(e.qp, Some(AnyQp::Ud(_))))
            .collect();
        let (qpn, qkey) = if uds.is_empty() || r.below(6) == 0 {
            (r.pick(&[0, 1, 0x00FF_FFFF, u32::MAX]), r.next_u64() as u32)
        } else {
            let e = uds[r.below(uds.len() as u64) as usize];
            (e.qpn, if r.below(4) == 0 { 0x8000_0000 } else { e.qkey })
        };
        (AddressVector::new(gid, sgid), qpn, qkey)
    }

    /// A remote address and key: mostly a region of this world, sometimes anything.
    fn remote(w: &World<'_>, r: &mut Rng) -> (u64, u32) {
        match w.mrs.get(r.below(w.mrs.len() as u64 + 1) as usize) {
            Some((mr, _)) => (mr.addr() + r.below(64), mr.rkey()),
            None => (r.next_u64(), r.next_u64() as u32),
        }
    }

    /// A QP (index) in a state matching `want`.
    fn qp_where(w: &World<'_>, r: &mut Rng, want: impl Fn(QpState) -> bool) -> Option<usize> {
        let ok: Vec<usize> = (0..w.qps.len())
            .filter(|&i| {
                w.qps[i]
                    .qp
                    .as_ref()
                    .is_some_and(|q| want(on_qp!(q, s => s.state())))
            })
            .collect();
        (!ok.is_empty()).then(|| r.pick(&ok))
    }

    /// Scatter lists for `nwr` requests on QP `i` (sometimes one SGE too many).
    fn lists(w: &World<'_>, r: &mut Rng, i: usize, max: u32, nwr: usize) -> Vec<Vec<Sge>> {
        // (Lists stay short whatever the QP allows.)
        let max = max.min(16);
        (0..nwr)
            .map(|_| {
                let n = if r.below(16) == 0 {
                    max + 1
                } else {
                    r.below(u64::from(max) + 1) as u32
                };
                sges(w, r, w.qps[i].pd, n)
            })
            .collect()
    }

    /// A batch of raw sends, every opcode the transport has; finished or dropped.
    fn post_send(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
        let Some(i) = qp_where(w, r, |s| s == QpState::Rts) else {
            return;
        };
        let max = on_qp!(w.qps[i].qp.as_ref().unwrap(), s => on_st!(s, q => q.caps().max_send_sge));
        let nwr = 1 + r.below(4) as usize;
        let lists = lists(w, r, i, max, nwr);
        let finish = r.below(8) != 0;
        let pd = w.qps[i].pd;
        let dest = ud_dest(w, r);
        let ah = w.pd(pd).create_ah(&dest.0);
        note!(
            t,
            "send batch(#{i}, {nwr} WRs, finish {finish}), ah {:?}",
            ah.as_ref().err()
        );
        if let Err(e) = &ah {
            w.err(t, e);
        }
        let plan: Vec<(u64, u64, SendFlags, (u64, u32))> = (0..nwr)
            .map(|_| {
                let flags = SendFlags::from_bits_truncate(r.below(16) as u32 & !8);
                (wr_id(r), r.below(10), flags, remote(w, r))
            })
            .collect();
        let (mut ok, mut errs) = (Vec::new(), Vec::new());
        macro_rules! connected {
            ($q:expr) => {{
                let mut b = $q.send_batch();
                for (l, &(id, kind, flags, rem)) in lists.iter().zip(&plan) {
                    // SAFETY: the buffers are regions of this world, or name none. A region may
                    // be destroyed while a request names it (the contract's letter is broken),
                    // but the device is the model: it reaches memory only through live regions
                    // and the machine's allocation table, and never reuses a physical address.
                    let res = unsafe {
                        match kind {
                            0..=3 => b.send(id, flags, l),
                            4 => b.send_imm(id, flags, 7, l),
                            5 => b.rdma_write(id, flags, rem, l),
                            6 => b.rdma_write_imm(id, flags, rem, 7, l),
                            7 | 8 => b.rdma_read(id, flags, rem, l),
                            _ => match l.first() {
                                Some(s) => b.atomic_fetch_add(id, flags, rem, 1, s),
                                None => b.send_inline(id, flags, b"inline"),
                            },
                        }
                    };
                    note!(t, "    wr {id:#x} kind {kind}: {res:?}");
                    match res {
                        Ok(()) => ok.push(id),
                        Err(e) => errs.push(e),
                    }
                }
                if finish {
                    b.finish();
                }
            }};
        }
        macro_rules! datagram {
            ($q:expr) => {{
                let Ok(ah) = &ah else {
                    return;
                };
                let mut b = $q.send_batch();
                for (l, &(id, kind, flags, _)) in lists.iter().zip(&plan) {
                    let to = (ah, dest.1, dest.2);
                    // SAFETY: as for connected QPs.
                    let res = unsafe {
                        if kind == 4 {
                            b.send_to_imm(id, flags, to, 9, l)
                        } else {
                            b.send_to(id, flags, to, l)
                        }
                    };
                    note!(t, "    wr {id:#x} to {dest:?}: {res:?}");
                    match res {
                        Ok(()) => ok.push(id),
                        Err(e) => errs.push(e),
                    }
                }
                if finish {
                    b.finish();
                }
            }};
        }
        match w.qps[i].qp.as_mut().unwrap() {
            AnyQp::Rc(St::Rts(q)) => connected!(q),
            AnyQp::Ud(St::Rts(q)) => datagram!(q),
            AnyQp::Gsi(St::Rts(q)) => datagram!(q),
            _ => return,
        }
        for e in &errs {
            w.err(t, e);
        }
        if finish {
            let qpn = w.qps[i].qpn;
            w.posted(qpn, ok.iter());
        }
    }

    /// A batch of raw receives; finished or dropped.
    fn post_recv(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
        let Some(i) = qp_where(w, r, |s| {
            matches!(s, QpState::Init | QpState::Rtr | QpState::Rts)
        }) else {
            return;
        };
        let max = on_qp!(w.qps[i].qp.as_ref().unwrap(), s => on_st!(s, q => q.caps().max_recv_sge));
        let nwr = 1 + r.below(4) as usize;
        let lists = lists(w, r, i, max, nwr);
        let ids: Vec<u64> = (0..nwr).map(|_| wr_id(r)).collect();
        let finish = r.below(8) != 0;
        note!(t, "recv batch(#{i}, {lists:?}, finish {finish})");
        let (mut ok, mut errs) = (Vec::new(), Vec::new());
        macro_rules! recv {
            ($q:expr) => {{
                let mut b = $q.recv_batch();
                for (l, &id) in lists.iter().zip(&ids) {
                    // SAFETY: as in `post_send`.
                    match unsafe { b.recv(id, l) } {
                        Ok(()) => ok.push(id),
                        Err(e) => errs.push(e),
                    }
                }
                if finish {
                    b.finish();
                }
            }};
        }
        match w.qps[i].qp.as_mut().unwrap() {
            AnyQp::Rc(St::Init(q)) => recv!(q),
            AnyQp::Rc(St::Rtr(q)) => recv!(q),
            AnyQp::Rc(St::Rts(q)) => recv!(q),
            AnyQp::Ud(St::Init(q)) => recv!(q),
            AnyQp::Ud(St::Rtr(q)) => recv!(q),
            AnyQp::Ud(St::Rts(q)) => recv!(q),
            AnyQp::Gsi(St::Init(q)) => recv!(q),
            AnyQp::Gsi(St::Rtr(q)) => recv!(q),
            AnyQp::Gsi(St::Rts(q)) => recv!(q),
            _ => return,
        }
        for e in &errs {
            w.err(t, e);
        }
        if finish {
            let qpn = w.qps[i].qpn;
            w.posted(qpn, ok.iter());
        }
    }

    fn srq_recv(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
        let Some(i) = pick_live(r, &w.srqs) else {
            return;
        };
        let (srq, pd) = (w.srq(i), w.srqs[i].as_ref().unwrap().1);
        let max = srq.attr().max_sge.min(16);
        let lists: Vec<Vec<Sge>> = (0..1 + r.below(4))
            .map(|_| {
                let n = r.below(u64::from(max) + 1) as u32 + u32::from(r.below(16) == 0);
                sges(w, r, pd, n)
            })
            .collect();
        let wrs: Vec<RecvWr<'_>> = lists
            .iter()
            .map(|l| RecvWr {
                wr_id: wr_id(r),
                sg_list: l,
            })
            .collect();
        note!(t, "srq post_recv_raw(#{i}, {wrs:?})");
        // SAFETY: as in `post_send`.
        let res = unsafe { srq.post_recv_raw(&wrs) };
        if res.is_ok() {
            w.posted(ANY_QP, wrs.iter().map(|w| &w.wr_id));
        }
        w.res(t, &res);
    }

    /// The safe path, whole: a pool, a QP of its own on this world's CQs (connected to itself,
    /// or UD), safe posts and polls through the QP, then the QP and the pool go. Every buffer
    /// must be back in the pool at the end.
    fn safe_post(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
        let (Some(pd), Some(cq)) = (pick_live(r, &w.pds), pick_live(r, &w.cqs)) else {
            return;
        };
        let (count, size) = (1 + r.below(8) as u32, r.pick(&[1, 64, 256, 4096, 1 << 20]));
        note!(t, "safe path: pool({count} x {size}) in pd #{pd}, cq #{cq}");
        let pool = match w.pd(pd).buffer_pool(count, size) {
            Ok(p) => p,
            Err(e) => return w.err(t, &e),
        };
        let ud = r.below(2) == 0;
        let caps = QpCaps {
            max_send_wr: 1 + r.below(4) as u32,
            max_recv_wr: 1 + r.below(4) as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let b = || {
            w.pd(pd)
                .qp_builder(w.cq(cq), w.cq(cq))
                .caps(caps)
                .pool(&pool)
        };
        let sends = 1 + r.below(4);
        let after_err = r.below(6);
        // wr_ids of its own (bit 63 clear: the fuzzer's books), sends at base + k, receives at
        // base + 2^40 + k.
        let base = r.next_u64() >> 24;
        let mut books = PoolBooks::default();
        // One round: a receive and a send posted (each with a buffer of the pool), then up to
        // two polls through the QP; the pool's books checked after each step.
        macro_rules! round {
            ($qpv:ident, $qpn:expr, $k:expr, $q:ident, $kk:ident, $buf:ident => $post:expr) => {{
                let k: u64 = $k;
                if let Some(mut buf) = pool.alloc() {
                    books.handed_out(w, t, buf.index());
                    if let Some(rb) = pool.alloc() {
                        books.handed_out(w, t, rb.index());
                        let (id, index) = (base + (1 << 40) + k, rb.index());
                        let res = $qpv.post_recv(id, rb);
                        books.posted(w, t, ($qpn, id, index), res);
                        // (The send's buffer is still in hand.)
                        books.check(w, t, &pool, 1, "a safe receive");
                    }
                    let _ = buf.set_len(r.below(u64::from(buf.capacity()) + 1) as u32);
                    let (id, index) = (base + k, buf.index());
                    let res = {
                        let ($q, $kk, $buf) = (&mut $qpv, id, buf);
                        $post
                    };
                    books.posted(w, t, ($qpn, id, index), res);
                    books.check(w, t, &pool, 0, "a safe send");
                }
                for _ in 0..r.below(3) {
                    match $qpv.poll_one() {
                        Ok(Some(c)) => {
                            note!(t, "    -> {:?} with buffer {}", c.wc, c.buf.is_some());
                            w.completed(t, &c.wc);
                            books.completed(w, t, c.wc.wr_id, c.buf.as_ref().map(|b| b.index()));
                            drop(c);
                        }
                        Ok(None) => {}
                        Err(e) => w.poll_failed(t, &e),
                    }
                    books.check(w, t, &pool, 0, "a poll");
                }
            }};
        }
        macro_rules! exercise {
            ($qp:expr, $q:ident, $kk:ident, $buf:ident => $post:expr) => {{
                let mut qp = $qp;
                let qpn = qp.qp_num();
                for k in 0..sends {
                    round!(qp, qpn, k, $q, $kk, $buf => $post);
                }
                if r.below(3) == 0 {
                    note!(t, "    to_error, then {after_err} rounds in ERR");
                    match qp.to_error() {
                        Ok(mut q) => {
                            // Posts and polls go on in ERR: the flushed requests' slots are
                            // used again.
                            for k in sends..sends + after_err {
                                round!(q, qpn, k, $q, $kk, $buf => $post);
                            }
                            drop(q);
                        }
                        Err((q, e)) => {
                            w.err(t, &e);
                            drop(q);
                        }
                    }
                } else {
                    drop(qp);
                }
                w.kill(qpn);
            }};
        }
        if ud {
            let dest = ud_dest(w, r);
            let ah = match w.pd(pd).create_ah(&dest.0) {
                Ok(a) => a,
                Err(e) => return w.err(t, &e),
            };
            let qp = match b().build::<Ud>() {
                Ok(q) => q,
                Err(e) => return w.err(t, &e),
            };
            let qp = match qp.ready(0x1234, 0) {
                Ok(q) => q,
                Err((_, e)) => return w.err(t, &e),
            };
            exercise!(qp, q, id, buf => q.post_send_to(id, buf, (&ah, dest.1, dest.2)));
        } else {
            let qp = match b().build::<Rc>() {
                Ok(q) => q,
                Err(e) => return w.err(t, &e),
            };
            let qpn = qp.qp_num();
            let Some((sgid, gid)) = w.bound_gid(r) else {
                return;
            };
            let qp = match qp.init(&ConnectedInit::default()) {
                Ok(q) => q,
                Err((_, e)) => return w.err(t, &e),
            };
            let qp = match qp.rtr(&ConnectedRtr::new(qpn, 0, AddressVector::new(gid, sgid))) {
                Ok(q) => q,
                Err((_, e)) => return w.err(t, &e),
            };
            let qp = match qp.rts(&ConnectedRts::new(0)) {
                Ok(q) => q,
                Err((_, e)) => return w.err(t, &e),
            };
            exercise!(qp, q, id, buf => q.post_send(id, buf));
        }
        // The QP is gone: every buffer is back (a raw poll, a flush or the destroy returned
        // the rest) — unless the device lied about the destroy, which keeps them.
        if pool.free_count() != pool.count() {
            let (free, count) = (pool.free_count(), pool.count());
            w.complain_strict(
                t,
                format!("pool: {free} of {count} buffers back after the QP went"),
            );
        }
    }

    fn poll_cq(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
        let Some(i) = pick_live(r, &w.cqs) else {
            return;
        };
        let mut wc = [WorkCompletion::default(); 8];
        let n = r.below(9) as usize;
        note!(t, "poll_cq(#{i}, {n})");
        let res = w.cq(i).poll(&mut wc[..n]);
        if let Ok(k) = res {
            if k > n {
                w.complain(t, format!("poll returned {k} completions into {n} slots"));
            }
            note!(t, "    {:?}", &wc[..k.min(n)]);
            for c in &wc[..k.min(n)] {
                w.completed(t, c);
            }
        }
        match &res {
            Ok(k) => note!(t, "    -> Ok({k})"),
            Err(e) => w.poll_failed(t, e),
        }
    }

    /// Lifecycles on one CQ: a datagram QP (GSI or UD) sends to itself, its CQEs sometimes
    /// left in the ring, then is reset and brought up again (GSI: the same QP) or destroyed
    /// and made again (GSI: the same handle, 1); two to four lives. Every completion polled
    /// is checked against the books: none of an earlier life may appear, and on an honest
    /// device none is refused.
    fn churn(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
        let (Some(pd), Some(cq), Some((sgid, gid))) =
            (pick_live(r, &w.pds), pick_live(r, &w.cqs), w.bound_gid(r))
        else {
            return;
        };
        let gsi = r.below(2) == 0;
        let lives = 2 + r.below(3);
        note!(t, "churn(pd #{pd}, cq #{cq}, gsi {gsi}, {lives} lives)");
        let ah = match w.pd(pd).create_ah(&AddressVector::new(gid, sgid)) {
            Ok(a) => a,
            Err(e) => return w.err(t, &e),
        };
        let qkey = 0x1111_0000;
        macro_rules! lives {
            ($ty:ty) => {{
                let (pdr, cqr) = (w.pd(pd), w.cq(cq));
                let build = || {
                    pdr.qp_builder(cqr, cqr)
                        .caps(QpCaps {
                            max_send_wr: 4,
                            max_recv_wr: 4,
                            max_send_sge: 1,
                            max_recv_sge: 1,
                            max_inline_data: 0,
                        })
                        .build::<$ty>()
                };
                let mut qp = match build() {
                    Ok(q) => q,
                    Err(e) => return w.err(t, &e),
                };
                for life in 0..lives {
                    let qpn = qp.qp_num();
                    let mut up = match qp.ready(qkey, 0) {
                        Ok(q) => q,
                        Err((_, e)) => return w.err(t, &e),
                    };
                    let n = 1 + r.below(3);
                    let ids: Vec<u64> = (0..2 * n).map(|_| wr_id(r)).collect();
                    let mut b = up.recv_batch();
                    // SAFETY: no SGE: the requests name no memory.
                    let recvs: Vec<u64> = ids[..n as usize]
                        .iter()
                        .filter(|&&id| unsafe { b.recv(id, &[]) }.is_ok())
                        .copied()
                        .collect();
                    b.finish();
                    w.posted(qpn, recvs.iter());
                    let mut b = up.send_batch();
                    let to = (&ah, qpn, qkey);
                    // SAFETY: as above.
                    let sends: Vec<u64> = ids[n as usize..]
                        .iter()
                        .filter(|&&id| {
                            unsafe { b.send_to(id, SendFlags::SIGNALED, to, &[]) }.is_ok()
                        })
                        .copied()
                        .collect();
                    b.finish();
                    w.posted(qpn, sends.iter());
                    note!(
                        t,
                        "  life {life} of QP {qpn}: recvs {recvs:x?}, sends {sends:x?}"
                    );
                    for _ in 0..r.below(3) {
                        let mut wc = [WorkCompletion::default(); 2];
                        match w.cq(cq).poll(&mut wc) {
                            Ok(k) => {
                                note!(t, "    {:?}", &wc[..k]);
                                for c in &wc[..k] {
                                    w.completed(t, c);
                                }
                            }
                            Err(e) => w.poll_failed(t, &e),
                        }
                    }
                    if gsi && r.below(2) == 0 {
                        note!(t, "  reset");
                        qp = match up.reset() {
                            Ok(q) => q,
                            Err((q, e)) => {
                                w.err(t, &e);
                                drop(q);
                                w.kill(qpn);
                                return;
                            }
                        };
                        w.kill(qpn);
                    } else {
                        note!(t, "  destroy, build again");
                        drop(up);
                        w.kill(qpn);
                        qp = match build() {
                            Ok(q) => q,
                            Err(e) => return w.err(t, &e),
                        };
                    }
                }
                let qpn = qp.qp_num();
                drop(qp);
                w.kill(qpn);
            }};
        }
        if gsi {
            lives!(Gsi);
        } else {
            lives!(Ud);
        }
        // What is left in the CQ: nothing of those lives may come out.
        let mut wc = [WorkCompletion::default(); 8];
        match w.cq(cq).poll(&mut wc) {
            Ok(k) => {
                for c in &wc[..k] {
                    w.completed(t, c);
                }
            }
            Err(e) => w.poll_failed(t, &e),
        }
    }

    /// The futures: `next_completion` (or `ready`) polled up to three times with a waker that
    /// does nothing. Each poll must return (an unbounded loop is the watchdog's); a
    /// completion it gives is checked as a poll's.
    fn await_cq(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
        use std::future::Future;
        use std::task::{Context as TaskContext, Poll as TaskPoll, Waker};
        let Some(i) = pick_live(r, &w.cqs) else {
            return;
        };
        let mut cx = TaskContext::from_waker(Waker::noop());
        let tries = 1 + r.below(3);
        let cq = w.cq(i);
        if r.below(4) == 0 {
            note!(t, "ready(#{i}) x{tries}");
            let mut f = std::pin::pin!(cq.ready());
            for _ in 0..tries {
                match f.as_mut().poll(&mut cx) {
                    TaskPoll::Ready(Ok(())) => return note!(t, "    -> ready"),
                    TaskPoll::Ready(Err(e)) => return w.err(t, &e),
                    TaskPoll::Pending => note!(t, "    -> pending"),
                }
            }
            return;
        }
        note!(t, "next_completion(#{i}) x{tries}");
        let mut f = std::pin::pin!(cq.next_completion());
        for _ in 0..tries {
            match f.as_mut().poll(&mut cx) {
                TaskPoll::Ready(Ok(wc)) => {
                    note!(t, "    -> {wc:?}");
                    return w.completed(t, &wc);
                }
                TaskPoll::Ready(Err(e)) => return w.poll_failed(t, &e),
                TaskPoll::Pending => note!(t, "    -> pending"),
            }
        }
    }

    fn poll_qp(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
        if w.qps.is_empty() {
            return;
        }
        let i = r.below(w.qps.len() as u64) as usize;
        note!(t, "poll_one(#{i})");
        let Some(q) = w.qps[i].qp.as_mut() else {
            return;
        };
        let res = on_qp!(q, s => on_st!(s, q => q.poll_one()));
        match res {
            Ok(Some(c)) => {
                note!(t, "    -> {:?} with buffer {}", c.wc, c.buf.is_some());
                w.completed(t, &c.wc);
            }
            Ok(None) => note!(t, "    -> None"),
            Err(e) => w.poll_failed(t, &e),
        }
    }

    fn arm(w: &mut World<'_>, r: &mut Rng, t: &mut Trace) {
        let Some(i) = pick_live(r, &w.cqs) else {
            return;
        };
        let sol = r.below(2) == 0;
        note!(t, "arm(#{i}, solicited {sol})");
        let _ = w.cq(i).req_notify(sol);
    }
}

// ---------------------------------------------------------------------------------------------
// One execution.

/// The machine of an execution; whether it is honest (it tells no lie); whether it is plain
/// (default limits, plenty of DMA memory); and its description.
/// Which devices the executions get (`FUZZ_MODE`): `honest` (no lie; faults injected as
/// usual), `hostile` (every one lies somewhere), anything else a mix (one in eight honest).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Mixed,
    Honest,
    Hostile,
}

fn mode() -> Mode {
    static MODE: std::sync::OnceLock<Mode> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("FUZZ_MODE").as_deref() {
        Ok("honest") => Mode::Honest,
        Ok("hostile") => Mode::Hostile,
        _ => Mode::Mixed,
    })
}

fn machine(r: &mut Rng) -> (ModelConfig, bool, bool, String) {
    let mut cfg = ModelConfig {
        version: r.pick(&[17, 17, 17, 17, 17, 18, 19, 20]),
        bar2_64bit: r.below(8) == 0,
        port_active: r.below(4) != 0,
        semantics: if r.below(4) == 0 {
            Semantics::Qemu
        } else {
            Semantics::Verbs
        },
        ..Default::default()
    };
    if r.below(6) == 0 {
        let c = &mut cfg.caps;
        c.max_pd = 1 + r.below(4) as u32;
        c.max_cq = 1 + r.below(4) as u32;
        c.max_qp = 1 + r.below(6) as u32;
        c.max_mr = 1 + r.below(4) as u32;
        c.max_srq = 1 + r.below(3) as u32;
    }
    if r.below(10) == 0 {
        cfg.dma_pages = 10 + r.below(300) as usize;
    }
    let mut odd = "";
    if r.below(8) == 0 {
        // An honest device with odd limits: the driver must cope without being lied to.
        let c = &mut cfg.caps;
        let big = [
            1,
            2,
            3,
            5,
            255,
            256,
            0x0100_0000,
            0x0800_0000,
            0x0FFF_FFFF,
            u32::MAX,
        ];
        odd = match r.below(8) {
            0 => {
                c.max_sge = r.pick(&big);
                "max_sge"
            }
            1 => {
                c.max_qp_wr = r.pick(&big);
                "max_qp_wr"
            }
            2 => {
                c.max_cqe = r.pick(&big);
                "max_cqe"
            }
            3 => {
                c.max_srq_sge = r.pick(&big);
                c.max_srq_wr = r.pick(&big);
                "max_srq_sge, max_srq_wr"
            }
            4 => {
                c.gid_tbl_len = r.pick(&big);
                "gid_tbl_len"
            }
            5 => {
                c.max_mr_size = r.pick(&[1, 4096, 4097, 1 << 30, u64::MAX]);
                "max_mr_size"
            }
            6 => {
                c.phys_port_cnt = r.pick(&[2, 255]);
                "phys_port_cnt"
            }
            _ => {
                c.max_qp = r.pick(&big);
                c.max_cq = r.pick(&big);
                c.max_pd = r.pick(&big);
                "max_qp, max_cq, max_pd"
            }
        };
    }
    let mut rate = r.pick(&[0, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 512, 4096, 0, 16]);
    match mode() {
        Mode::Honest => rate = 0,
        Mode::Hostile if rate == 0 => rate = 16,
        _ => {}
    }
    let points = if r.below(3) == 0 {
        point::ALL
    } else {
        (r.next_u64() as u32 & point::ALL).max(1 << r.below(9))
    };
    if rate != 0 {
        let mut h = Hostile::new(r.next_u64(), rate).at(points);
        if r.below(3) == 0 {
            // Some points lie at their own rate.
            for p in 0..9 {
                if r.below(3) == 0 {
                    h = h.rate_at(1 << p, r.pick(&[1, 2, 4, 16, 256]));
                }
            }
        }
        cfg.hostile = Some(h);
    }
    let desc = format!(
        "version {}, bar2_64bit {}, semantics {:?}, dma_pages {}, small tables {}, \
         odd caps [{odd}] {:?}, hostile {:?}",
        cfg.version,
        cfg.bar2_64bit,
        cfg.semantics,
        cfg.dma_pages,
        cfg.caps.max_pd < 1024,
        cfg.caps,
        cfg.hostile
    );
    let plain = odd.is_empty() && cfg.caps.max_pd == 1024 && cfg.dma_pages >= 1 << 20;
    (cfg, rate == 0, plain, desc)
}

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
