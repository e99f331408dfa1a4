//! qperf's RC tests against the unikernel as qperf's server: Linux runs
//! `qperf <unikernel> -cm1 -t 2 rc_bw` (or `rc_lat`, `rc_rdma_write_bw`, `rc_rdma_read_bw`),
//! then `qperf <unikernel> quit` (`qemu/roce/qperf.sh`). qperf's control connection is
//! [`crate::tcp::qperf`]; its QP comes through the CM ([`bareverbs::cm`]) to the port the
//! unikernel names there. `docs/qperf.md` has the protocol and the tests.
//!
//! | case | the unikernel, for `-t` seconds | what it checks |
//! | --- | --- | --- |
//! | `qperf-rc_bw-client` | takes the client's SENDs (receives posted, each reposted once checked) | every message `-m` bytes, every byte zero (qperf's client sends its zeroed buffer) |
//! | `qperf-rc_rdma_write_bw-client` | takes the WRITEs with immediate into its buffer (a receive each) | each a receive of `-m` bytes with immediate 0; the buffer overwritten with the client's zeros, the bytes after it untouched |
//! | `qperf-rc_rdma_read_bw-client` | lets the client READ its buffer | nothing completes on its CQ; its buffer and the bytes after it unchanged |
//! | `qperf-rc_lat-client` | answers each SEND with one, as qperf's server does | every message `-m` bytes, every byte zero |
//!
//! Every case also checks the request (the test its name says, `-cm1`, the options it takes:
//! [`Request::test`](crate::tcp::qperf::Request::test)), the CM's REQ (from Linux, to the port
//! named, depths 1/1, retries 7/7, no private data) and qperf's synchronizations, and ends
//! with the client's DREQ and its `quit`. A request the peer does not run is refused with a
//! typed error and the connection reset; the case fails and the next one goes on.

use core::fmt::Write;

use bareverbs::Context;
use bareverbs::cm::{
    AcceptParams, Cm, CmConfig, CmError, CmEvent, ConnId, ConnectRequest, Service,
};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;
use bareverbs_hal::Link;

use crate::tcp::Stack;
use crate::tcp::qperf::{self, Failure as QFailure, Hooks, Node, Request, Stat, Test};
use crate::{Failure, Step};

/// The port the unikernel's CM listens on for qperf's QP (qperf's server takes any free one
/// and names it on the control connection).
pub const CM_PORT: u16 = 19766;
/// Receives posted at once (`rc_bw`, `rc_rdma_write_bw`).
const MAX_RECVS: u32 = 16;
/// Bytes the receive slots take at most.
const RECV_BYTES: u32 = 1 << 20;
/// Bytes after the buffer that must stay untouched.
const GUARD: u32 = 64;
/// What the guard and unreceived slots hold.
const SENTINEL: u8 = 0xEE;
/// Connection entries of the CM (the CM cases' one size: the kernel keeps one copy of it).
const CONNS: usize = 128;
/// Work request IDs: receives from `RECV_BASE` (+ slot), the one send.
const RECV_BASE: u64 = 0x100;
const SEND_ID: u64 = 1;
/// Milliseconds the client's `quit` may take to come after the test.
const QUIT_MS: u64 = 30_000;

/// A qperf case: the test the Linux client runs against the unikernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QperfCase {
    /// The test.
    pub test: Test,
}

impl QperfCase {
    /// A case of `bvroce.cases=` (`qperf-rc_bw-client,-cm1,-t,2`; a word may come between
    /// the test and the role): `None` for anything else, a case with Linux as the server
    /// included (the unikernel is not qperf's client).
    pub fn parse(spec: &str) -> Option<QperfCase> {
        let name = spec.split(',').next()?;
        let rest = name.strip_prefix("qperf-")?.strip_suffix("-client")?;
        let test = Test::from_name(rest.split('-').next()?)?;
        (test != Test::Quit).then_some(QperfCase { test })
    }
}

/// Why a qperf case failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaseError {
    /// A verbs call failed.
    Verbs(Failure),
    /// The CM refused a call.
    Cm(&'static str, CmError),
    /// The case's deadline passed while waiting for this.
    Deadline(&'static str),
    /// The client disconnected while the test ran.
    Disconnected,
    /// A connection request that is not qperf's (which field).
    Request(&'static str),
    /// A completion with an error status (and its work request).
    Status(WcStatus, u64),
    /// A completion the test does not expect (its opcode, its work request).
    Unexpected(WcOpcode, u64),
    /// A message of another length than `-m` (its length).
    Length(u32),
    /// Bytes not what the client sends, or changed where nobody may write (what, offset).
    Bytes(&'static str, u32),
    /// The client asked for another test than the case's (its name).
    OtherTest(&'static str),
}

impl From<Failure> for CaseError {
    fn from(f: Failure) -> Self {
        CaseError::Verbs(f)
    }
}

impl core::fmt::Display for CaseError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CaseError::Verbs(v) => write!(f, "{v}"),
            CaseError::Cm(step, e) => write!(f, "{step}: {e}"),
            CaseError::Deadline(what) => write!(f, "deadline passed waiting for {what}"),
            CaseError::Disconnected => f.write_str("the client disconnected during the test"),
            CaseError::Request(what) => write!(f, "connection request: unexpected {what}"),
            CaseError::Status(s, id) => write!(f, "completion {s:?} for work request {id}"),
            CaseError::Unexpected(op, id) => {
                write!(f, "unexpected completion {op:?} for work request {id}")
            }
            CaseError::Length(n) => write!(f, "a message of {n} bytes, not -m"),
            CaseError::Bytes(what, at) => write!(f, "{what}: wrong byte at {at}"),
            CaseError::OtherTest(t) => write!(f, "the client asked for {t}"),
        }
    }
}

/// The CM's clock: the case's millisecond clock.
struct Ms<'c>(&'c dyn Fn() -> u64);

impl Clock for Ms<'_> {
    fn now_us(&self) -> u64 {
        (self.0)().saturating_mul(1000)
    }
}

/// Runs one qperf case: serves the test (then the client's `quit`) and prints its `roce-uk`
/// line under `name`; `true` if it passed.
#[allow(clippy::too_many_arguments)]
pub fn run_case<P: Provider, L: Link>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    stack: &mut Stack<'_, L>,
    linux: [u8; 4],
    name: &str,
    case: &QperfCase,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
    out: &mut dyn Write,
) -> bool {
    let t0 = clock_ms();
    let r = serve_test(ctx, pd, stack, linux, case, deadline, clock_ms);
    // The client's `quit` comes after its test whatever happened to it: taken here, so that
    // the next case's listener does not get it.
    let quit = quit(stack, deadline.max(clock_ms() + QUIT_MS), clock_ms);
    let ms = clock_ms() - t0;
    match (r, quit) {
        (Ok((req, stat, checked)), Ok(())) => {
            let what = match case.test {
                Test::RcRdmaReadBw => "its buffer READ, nothing on its CQ",
                Test::RcLat => "SENDs answered",
                _ => "messages received",
            };
            let _ = writeln!(
                out,
                "roce-uk {name}: ok {} -m {} -t {}: {} {what} ({} bytes) in {} ms, {checked} bytes checked, quit taken; {ms} ms in all",
                case.test.name(),
                req.msg_size,
                req.time,
                stat.received.msgs,
                stat.received.bytes,
                stat.elapsed_ms
            );
            true
        }
        (Err(e), _) => {
            let _ = writeln!(out, "roce-uk {name}: FAIL {e} (after {ms} ms)");
            false
        }
        (Ok(_), Err(e)) => {
            let _ = writeln!(out, "roce-uk {name}: FAIL quit: {e} (after {ms} ms)");
            false
        }
    }
}

/// A case's failure: qperf's exchange or the verbs side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// qperf's exchange failed, or its request was refused.
    Qperf(qperf::Error),
    /// The verbs / CM side failed.
    Case(CaseError),
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Qperf(e) => write!(f, "{e}"),
            Error::Case(e) => write!(f, "{e}"),
        }
    }
}

impl From<QFailure<CaseError>> for Error {
    fn from(f: QFailure<CaseError>) -> Self {
        match f {
            QFailure::Qperf(e) => Error::Qperf(e),
            QFailure::Hook(e) => Error::Case(e),
        }
    }
}

/// Takes the client's `quit` (a test request meanwhile is refused: the case is over).
fn quit<L: Link>(
    stack: &mut Stack<'_, L>,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
) -> Result<(), Error> {
    let mut h = NoTest(clock_ms);
    match qperf::serve(stack, &mut h, deadline) {
        Ok((_, Test::Quit, _)) => Ok(()),
        Ok((_, t, _)) => Err(Error::Case(CaseError::OtherTest(t.name()))),
        Err(e) => Err(e.into()),
    }
}

/// Hooks that run no test (for `quit`).
struct NoTest<'c>(&'c dyn Fn() -> u64);

impl Hooks for NoTest<'_> {
    type Error = CaseError;
    fn now(&mut self) -> u64 {
        (self.0)()
    }
    fn listen(&mut self, test: Test, _: &Request) -> Result<u16, CaseError> {
        Err(CaseError::OtherTest(test.name()))
    }
    fn accept(&mut self) -> Result<Node, CaseError> {
        Err(CaseError::OtherTest("a test"))
    }
    fn run(&mut self, _: &Node) -> Result<Stat, CaseError> {
        Err(CaseError::OtherTest("a test"))
    }
    fn finish(&mut self) -> Result<(), CaseError> {
        Ok(())
    }
}

/// Serves the case's test (a leftover `quit` of an earlier case taken first).
fn serve_test<P: Provider, L: Link>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    stack: &mut Stack<'_, L>,
    linux: [u8; 4],
    case: &QperfCase,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
) -> Result<(Request, Stat, u64), Error> {
    let cm_cq = ctx
        .create_cq(32)
        .at("qperf: create CM CQ")
        .map_err(|f| Error::Case(f.into()))?;
    let cq = ctx
        .create_cq(2 * MAX_RECVS + 4)
        .at("qperf: create CQ")
        .map_err(|f| Error::Case(f.into()))?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    // The largest layout: 16 receive slots of up to 1 MiB in all, or a buffer of -m (up to
    // 1 MiB) with its guard and a second one (rc_lat's send buffer).
    let len = 2 * qperf::MAX_MSG + 2 * GUARD;
    let mut mr = pd
        .register(len as usize, access)
        .at("qperf: register")
        .map_err(|f| Error::Case(f.into()))?;
    let mut cm: Cm<'_, P, Ms<'_>, CONNS> =
        Cm::new(pd, &cm_cq, Ms(clock_ms), CmConfig::default())
            .map_err(|e| Error::Case(CaseError::Cm("CM over QP1", e)))?;
    let mut s = Server {
        cm: &mut cm,
        pd,
        cq: &cq,
        mr: &mut mr,
        clock_ms,
        deadline,
        linux,
        want: case.test,
        test: None,
        request: None,
        listening: false,
        id: None,
        qp: None,
        disconnected: false,
        checked: 0,
    };
    let r = loop {
        match qperf::serve(stack, &mut s, deadline) {
            // A `quit` left from an earlier case: the test comes next.
            Ok((_, Test::Quit, _)) => continue,
            Ok((req, _, Some(stat))) => break Ok((req, stat, s.checked)),
            Ok((_, t, None)) => break Err(Error::Case(CaseError::OtherTest(t.name()))),
            Err(e) => break Err(e.into()),
        }
    };
    s.cleanup();
    r
}

/// The verbs and CM side of one test.
struct Server<'s, 'a, P: Provider, C: Clock> {
    cm: &'s mut Cm<'a, P, C, CONNS>,
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    mr: &'s mut MemoryRegion<'a, P>,
    clock_ms: &'s dyn Fn() -> u64,
    deadline: u64,
    linux: [u8; 4],
    /// The case's test.
    want: Test,
    /// The test and its request, once taken.
    test: Option<(Test, Request)>,
    /// The CM's connection request, until taken.
    request: Option<ConnectRequest>,
    listening: bool,
    id: Option<ConnId>,
    qp: Option<QueuePair<'a, P, Rc, Rts>>,
    disconnected: bool,
    /// Bytes received (or left in the buffer) checked.
    checked: u64,
}

impl<'a, P: Provider, C: Clock> Server<'_, 'a, P, C> {
    fn time(&self) -> u64 {
        (self.clock_ms)()
    }

    fn size(&self) -> u32 {
        self.test.map_or(1, |(_, r)| r.msg_size)
    }

    /// Receive slots (`rc_bw`): as many `-m` slots as fit, at most [`MAX_RECVS`].
    fn slots(&self) -> u32 {
        (RECV_BYTES / self.size()).clamp(1, MAX_RECVS)
    }

    /// Runs the CM once: the first connection request is kept (whichever wait polls when
    /// it comes), a further one rejected; the client's DREQ noted.
    fn cm_event(&mut self) {
        match self.cm.poll() {
            Some(CmEvent::Disconnected { id }) if Some(id) == self.id => self.disconnected = true,
            Some(CmEvent::ConnectRequest(r)) => {
                if self.id.is_none() && self.request.is_none() && self.listening {
                    self.request = Some(r);
                } else {
                    let _ = self.cm.reject(r.id, &[]);
                }
            }
            _ => {}
        }
    }

    fn post_recv(&mut self, slot: u32) -> Result<(), CaseError> {
        let size = self.size();
        let (at, len) = match self.test {
            Some((Test::RcRdmaWriteBw, _)) => (size + GUARD, GUARD),
            _ => (slot * size, size),
        };
        let sge = self.mr.sge(at, len).at("qperf: sge")?;
        let qp = self.qp.as_mut().ok_or(CaseError::Disconnected)?;
        // SAFETY: the region outlives the QP (destroyed in `cleanup`, before the region
        // goes); the CPU reads a slot only after its receive completed.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(RECV_BASE + u64::from(slot), &[sge])
                .at("qperf: post receive")?;
            r.finish();
        }
        Ok(())
    }

    fn post_send(&mut self) -> Result<(), CaseError> {
        let size = self.size();
        // rc_lat's send buffer: after the receive slot and its guard, zeros.
        let sge = self.mr.sge(size + GUARD, size).at("qperf: sge")?;
        let qp = self.qp.as_mut().ok_or(CaseError::Disconnected)?;
        // SAFETY: as in `post_recv`; the send buffer is never written while a SEND is posted.
        unsafe {
            let mut s = qp.send_batch();
            s.send(SEND_ID, SendFlags::SIGNALED, &[sge])
                .at("qperf: post SEND")?;
            s.finish();
        }
        Ok(())
    }

    /// Checks that `len` bytes at `at` all are `want`.
    fn expect(&mut self, at: u32, len: u32, want: u8, what: &'static str) -> Result<(), CaseError> {
        let b = &self.mr.as_slice()[at as usize..(at + len) as usize];
        if let Some(i) = b.iter().position(|&x| x != want) {
            return Err(CaseError::Bytes(what, i as u32));
        }
        self.checked += u64::from(len);
        Ok(())
    }

    /// A receive's completion: of `-m` bytes (and for `rc_bw` / `rc_lat` zeros in its
    /// slot, which then holds the sentinel again).
    fn received(&mut self, test: Test, w: &WorkCompletion) -> Result<(), CaseError> {
        let size = self.size();
        let want = match test {
            Test::RcRdmaWriteBw => WcOpcode::RecvRdmaWithImm,
            _ => WcOpcode::Recv,
        };
        if w.opcode != want {
            return Err(CaseError::Unexpected(w.opcode, w.wr_id));
        }
        if w.byte_len != size {
            return Err(CaseError::Length(w.byte_len));
        }
        if test == Test::RcRdmaWriteBw {
            if w.imm != 0 || !w.flags.contains(WcFlags::WITH_IMM) {
                return Err(CaseError::Bytes("the WRITE's immediate", 0));
            }
            return Ok(());
        }
        let slot = (w.wr_id - RECV_BASE) as u32;
        self.expect(slot * size, size, 0, "a message")?;
        let at = (slot * size) as usize;
        self.mr.as_mut_slice()[at..at + size as usize].fill(SENTINEL);
        Ok(())
    }

    /// The test's loop, until its time is over (or `-n` messages came).
    fn test_loop(&mut self, test: Test, req: &Request) -> Result<Stat, CaseError> {
        let t0 = self.time();
        let end = if req.no_msgs == 0 {
            t0 + u64::from(req.time) * 1000
        } else {
            self.deadline
        };
        let mut stat = Stat::default();
        // rc_lat: 1 once this side's SEND completed, 2 once the client's came (the server
        // starts with its "send" done, as qperf's does).
        let mut done = 1u8;
        let mut wcs = [WorkCompletion::default(); 16];
        loop {
            let now = self.time();
            if now >= end {
                break;
            }
            if now > self.deadline {
                return Err(CaseError::Deadline("the test's end"));
            }
            self.cm_event();
            if self.disconnected {
                return Err(CaseError::Disconnected);
            }
            let n = self.cq.poll(&mut wcs).at("qperf: poll CQ")?;
            stat.max_cqes = stat.max_cqes.max(n as u32);
            for w in &wcs[..n] {
                if w.status != WcStatus::Success {
                    return Err(CaseError::Status(w.status, w.wr_id));
                }
                match (test, w.wr_id) {
                    (Test::RcLat, SEND_ID) => done |= 1,
                    (Test::RcBw | Test::RcRdmaWriteBw | Test::RcLat, id)
                        if (RECV_BASE..RECV_BASE + u64::from(MAX_RECVS)).contains(&id) =>
                    {
                        self.received(test, w)?;
                        stat.received.msgs += 1;
                        stat.received.bytes += u64::from(self.size());
                        if req.no_msgs == 0 || stat.received.msgs < u64::from(req.no_msgs) {
                            self.post_recv((id - RECV_BASE) as u32)?;
                        }
                        done |= 2;
                    }
                    _ => return Err(CaseError::Unexpected(w.opcode, w.wr_id)),
                }
            }
            if test == Test::RcLat && done == 3 {
                self.post_send()?;
                stat.sent.msgs += 1;
                stat.sent.bytes += u64::from(self.size());
                done = 0;
            }
            if req.no_msgs != 0 && stat.received.msgs >= u64::from(req.no_msgs) {
                break;
            }
        }
        stat.elapsed_ms = self.time() - t0;
        let size = self.size();
        match test {
            // The client's zeros over the sentinel (once a WRITE came), the guard untouched.
            Test::RcRdmaWriteBw if stat.received.msgs > 0 => {
                self.expect(0, size, 0, "the WRITE target")?
            }
            Test::RcRdmaReadBw => {
                let b = &self.mr.as_slice()[..size as usize];
                if let Some(i) = b.iter().enumerate().position(|(i, &x)| x != pattern(i)) {
                    return Err(CaseError::Bytes("the READ buffer", i as u32));
                }
                self.checked += u64::from(size);
            }
            _ => {}
        }
        if test != Test::RcBw {
            self.expect(size, GUARD, SENTINEL, "the guard after the buffer")?;
        }
        Ok(stat)
    }

    /// The QP to ERROR, its flushed work requests taken, destroyed; the listener gone.
    fn cleanup(&mut self) {
        if let Some(qp) = self.qp.take() {
            match qp.to_error() {
                Ok(e) => {
                    self.drain();
                    let _ = e.destroy();
                }
                Err((qp, _)) => {
                    let _ = qp.destroy();
                }
            }
        }
        self.drain();
        if self.listening {
            self.cm.unlisten(CM_PORT, Service::Rc);
            self.listening = false;
        }
        self.id = None;
        if let Some(r) = self.request.take() {
            let _ = self.cm.reject(r.id, &[]);
        }
    }

    fn drain(&mut self) {
        let mut wcs = [WorkCompletion::default(); 16];
        for _ in 0..8 {
            let n = self.cq.poll(&mut wcs).unwrap_or(0);
            self.cm_event();
            if n == 0 {
                break;
            }
        }
    }
}

/// Byte `i` of the buffer `rc_rdma_read_bw`'s client READs.
fn pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

impl<'a, P: Provider, C: Clock> Hooks for Server<'_, 'a, P, C> {
    type Error = CaseError;

    fn now(&mut self) -> u64 {
        self.cm_event();
        self.time()
    }

    fn listen(&mut self, test: Test, req: &Request) -> Result<u16, CaseError> {
        if test != self.want {
            return Err(CaseError::OtherTest(test.name()));
        }
        self.cleanup();
        self.test = Some((test, *req));
        self.disconnected = false;
        self.checked = 0;
        self.cm
            .listen(None, CM_PORT, Service::Rc)
            .map_err(|e| CaseError::Cm("listen", e))?;
        self.listening = true;
        Ok(CM_PORT)
    }

    fn accept(&mut self) -> Result<Node, CaseError> {
        let req: ConnectRequest = loop {
            if let Some(r) = self.request.take() {
                break r;
            }
            self.cm_event();
            if self.time() > self.deadline {
                return Err(CaseError::Deadline("the CM's REQ"));
            }
        };
        // qperf's rdma_connect: depths 1/1, retry and RNR retry counts 7, no private data.
        let checks = [
            (req.src_ip == self.linux, "source address"),
            (req.dst_port == CM_PORT, "port"),
            (
                (req.responder_resources, req.initiator_depth) == (1, 1),
                "depths",
            ),
            ((req.retry_count, req.rnr_retry_count) == (7, 7), "retries"),
            (
                req.private_data.as_slice().iter().all(|&b| b == 0),
                "private data",
            ),
        ];
        if let Some((_, what)) = checks.iter().find(|(ok, _)| !ok) {
            let _ = self.cm.reject(req.id, &[]);
            return Err(CaseError::Request(what));
        }
        let caps = QpCaps {
            max_send_wr: 4,
            max_recv_wr: MAX_RECVS,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = self
            .pd
            .qp_builder(self.cq, self.cq)
            .caps(caps)
            .build::<Rc>()
            .at("qperf: create QP")?;
        self.id = Some(req.id);
        let rts = self
            .cm
            .accept(req.id, qp, &AcceptParams::default())
            .map_err(|(_, e)| CaseError::Cm("accept", e))?;
        self.qp = Some(rts);
        // The buffer: the sentinel everywhere, the READ pattern for rc_rdma_read_bw, zeros
        // in rc_lat's send buffer; the receives posted before qperf's synchronization, as
        // qperf's server posts them.
        let (test, _) = self.test.ok_or(CaseError::Deadline("the request"))?;
        let size = self.size();
        let buf = self.mr.as_mut_slice();
        buf.fill(SENTINEL);
        match test {
            Test::RcRdmaReadBw => {
                for (i, b) in buf[..size as usize].iter_mut().enumerate() {
                    *b = pattern(i);
                }
            }
            Test::RcLat => {
                let at = (size + GUARD) as usize;
                buf[at..at + size as usize].fill(0);
            }
            _ => {}
        }
        let recvs = match test {
            Test::RcBw | Test::RcRdmaWriteBw => self.slots(),
            Test::RcLat => 1,
            _ => 0,
        };
        for slot in 0..recvs {
            self.post_recv(slot)?;
        }
        Ok(Node {
            vaddr: self.mr.addr(),
            rkey: self.mr.rkey(),
            rd_atomic: 1,
            ..Node::default()
        })
    }

    fn run(&mut self, _peer: &Node) -> Result<Stat, CaseError> {
        let (test, req) = self.test.ok_or(CaseError::Deadline("the request"))?;
        self.test_loop(test, &req)
    }

    fn finish(&mut self) -> Result<(), CaseError> {
        while !self.disconnected {
            self.cm_event();
            if self.time() > self.deadline {
                return Err(CaseError::Deadline("the client's DREQ"));
            }
        }
        self.cleanup();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_name_the_test_and_linux_as_the_client() {
        for (spec, test) in [
            ("qperf-rc_bw-client,-cm1,-t,2", Test::RcBw),
            ("qperf-rc_lat-client", Test::RcLat),
            (
                "qperf-rc_rdma_write_bw-4k-client,-m,4096",
                Test::RcRdmaWriteBw,
            ),
            ("qperf-rc_rdma_read_bw-client", Test::RcRdmaReadBw),
        ] {
            assert_eq!(QperfCase::parse(spec), Some(QperfCase { test }), "{spec}");
        }
        for spec in [
            "qperf-rc_bw-server",
            "qperf-ud_bw-client",
            "qperf-quit-client",
            "qperf-client",
            "rc_bw-client",
            "ib_write_bw-client",
        ] {
            assert_eq!(QperfCase::parse(spec), None, "{spec}");
        }
    }
}
