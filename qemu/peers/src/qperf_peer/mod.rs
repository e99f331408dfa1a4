//! qperf's RC tests against the unikernel in both roles. As qperf's server (`…-client`
//! cases): Linux runs `qperf <unikernel> -cm1 -t 2 rc_bw` (or any other of qperf's ten RC
//! tests), then `qperf <unikernel> quit` (`qemu/roce/qperf.sh`); as its client
//! (`…-server` cases, `client.rs`): Linux runs `qperf`, the unikernel the test and `quit`.
//! qperf's control connection is [`crate::tcp::qperf`]; its QP comes through the CM
//! ([`bareverbs::cm`]) to the port the server names there. `docs/qperf.md` has the protocol
//! and the tests. The unikernel as the server (`server.rs`):
//!
//! | case | the unikernel, for `-t` seconds | what it checks |
//! | --- | --- | --- |
//! | `qperf-rc_bw-client` | takes the client's SENDs (receives posted, each reposted once checked) | every message `-m` bytes, every byte zero (qperf's client sends its zeroed buffer) |
//! | `qperf-rc_rdma_write_bw-client` | takes the WRITEs with immediate into its buffer (a receive each) | each a receive of `-m` bytes with immediate 0; the buffer overwritten with the client's zeros, the bytes after it untouched |
//! | `qperf-rc_rdma_read_bw-client` | lets the client READ its buffer | nothing completes on its CQ; its buffer and the bytes after it unchanged |
//! | `qperf-rc_lat-client` | answers each SEND with one, as qperf's server does | every message `-m` bytes, every byte zero |
//! | `qperf-rc_bi_bw-client` | takes the client's SENDs as for `rc_bw` while SENDing its own zeros (4 in flight) | as `rc_bw` |
//! | `qperf-rc_rdma_write_lat-client` | answers each WRITE with immediate with one into the client's buffer | each a receive of `-m` bytes with immediate 0; its buffer the client's zeros, the bytes after it untouched |
//! | `qperf-rc_rdma_write_poll_lat-client` | polls its buffer for the client's mark (`0x55`) at both ends, then WRITEs its own (`0xAA`) into the client's | zeros between the marks; nothing else on its CQ; the bytes after the buffer untouched |
//! | `qperf-rc_rdma_read_lat-client` | lets the client READ its buffer, one READ at a time | as `rc_rdma_read_bw` |
//! | `qperf-rc_compare_swap_mr-client`, `qperf-rc_fetch_add_mr-client` | lets the client's atomics (compare 0 swap 0, add 0) work on its 8-byte word | nothing completes on its CQ; the word still zero (what qperf's atomics leave), the bytes after it untouched |
//!
//! Every case also checks the request (the test its name says, `-cm1`, the options it takes:
//! [`Request::test`](crate::tcp::qperf::Request::test)), the CM's REQ (from Linux, to the port
//! named, depths 1/1, retries 7/7, no private data) and qperf's synchronizations, and ends
//! with the client's DREQ and its `quit`. A request the peer does not run is refused with a
//! typed error and the connection reset; the case fails and the next one goes on.

use core::fmt::Write;

use bareverbs::Context;
use bareverbs::cm::CmError;
use bareverbs::hal::Clock;
use bareverbs::verbs::*;
use bareverbs_hal::Link;

use crate::Failure;
use crate::tcp::Stack;
use crate::tcp::qperf::{self, Failure as QFailure, Test};

mod client;
mod server;

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
/// Where the send buffer starts at the latest: after a message of up to 1 MiB (or the
/// receive slots) and its guard.
const SEND_AT_MOST: u32 = qperf::MAX_MSG + GUARD;
/// The byte qperf's client writes at both ends of its message in `rc_rdma_write_poll_lat`
/// (any other than the server's: qperf's are these).
const CLIENT_MARK: u8 = 0x55;
/// The server's byte there.
const SERVER_MARK: u8 = 0xAA;
// Connection entries of the CM: the CM cases' one size, so the kernel keeps one copy of it.
use crate::cm_peer::CONNS;
/// Work request IDs: receives from `RECV_BASE` (+ slot), the one send.
const RECV_BASE: u64 = 0x100;
const SEND_ID: u64 = 1;
/// Milliseconds the client's `quit` may take to come after the test.
const QUIT_MS: u64 = 30_000;

/// A qperf case: the test, the roles, and (for the unikernel as the client) the options it
/// runs the test with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QperfCase {
    /// The test.
    pub test: Test,
    /// Linux runs qperf's server (`…-server`): the unikernel is the client.
    pub linux_serves: bool,
    /// `-m` (the test's default without it: 64 KiB for the bandwidth tests, 1 byte for the
    /// latency ones, none for the atomics: [`Test::default_size`]).
    pub msg_size: u32,
    /// `-t` (2 s without it).
    pub time: u32,
    /// `-to` (5 s without it).
    pub timeout: u32,
}

impl QperfCase {
    /// A case of `bvroce.cases=` (`qperf-rc_bw-client,-cm1,-t,2`; a word may come between
    /// the test and the role), with qperf's options `-cm1`, `-t`, `-m`, `-to`: `None` for
    /// anything else (another option, a test the peer does not run, a value out of
    /// [`Request::test`](crate::tcp::qperf::Request::test)'s range).
    pub fn parse(spec: &str) -> Option<QperfCase> {
        let mut words = spec.split(',');
        let name = words.next()?.strip_prefix("qperf-")?;
        let (rest, linux_serves) = match name.strip_suffix("-client") {
            Some(r) => (r, false),
            None => (name.strip_suffix("-server")?, true),
        };
        let test = Test::from_name(rest.split('-').next()?)?;
        if test == Test::Quit {
            return None;
        }
        let mut c = QperfCase {
            test,
            linux_serves,
            msg_size: test.default_size(),
            time: 2,
            timeout: 5,
        };
        let mut cm = false;
        while let Some(w) = words.next() {
            match w {
                "-cm1" => cm = true,
                "-t" | "-m" | "-to" => {
                    let v: u32 = words.next()?.parse().ok()?;
                    match w {
                        "-t" => c.time = v,
                        "-m" => c.msg_size = v,
                        _ => c.timeout = v,
                    }
                }
                _ => return None,
            }
        }
        (cm && c.request().test() == Ok(test)).then_some(c)
    }

    /// The request qperf's client sends for it.
    pub fn request(&self) -> qperf::Request {
        qperf::Request::new(self.test, self.msg_size, self.time, self.timeout)
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
    /// The server's statistics disagree with what this side did (which figure, its value).
    Stats(&'static str, u64),
    /// The connection was not established (the CM's reason).
    Connect(bareverbs::cm::Failure),
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
            CaseError::Stats(what, v) => write!(f, "the server's statistics: {what} {v}"),
            CaseError::Connect(c) => write!(f, "not connected: {c:?}"),
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
    if case.linux_serves {
        return client::run_case(ctx, pd, stack, linux, name, case, deadline, clock_ms, out);
    }
    let t0 = clock_ms();
    let r = server::serve_test(ctx, pd, stack, linux, case, deadline, clock_ms);
    // The client's `quit` comes after its test whatever happened to it: taken here, so that
    // the next case's listener does not get it.
    let quit = server::quit(stack, deadline.max(clock_ms() + QUIT_MS), clock_ms);
    let ms = clock_ms() - t0;
    match (r, quit) {
        (Ok((req, stat, checked)), Ok(())) => {
            let n = stat.received.msgs;
            let what = match case.test {
                Test::RcRdmaReadBw | Test::RcRdmaReadLat => {
                    "its buffer READ, nothing on its CQ".into()
                }
                t if t.atomic() => "its word's atomics done, nothing on its CQ".into(),
                Test::RcLat => Line::Counted(n, "SENDs answered"),
                Test::RcRdmaWriteLat | Test::RcRdmaWritePollLat => {
                    Line::Counted(n, "WRITEs answered")
                }
                Test::RcBiBw => Line::Both(n, stat.sent.msgs),
                _ => Line::Counted(n, "messages received"),
            };
            let _ = writeln!(
                out,
                "roce-uk {name}: ok {} -m {} -t {}: {what} in {} ms, {checked} bytes checked, quit taken; {ms} ms in all",
                case.test.name(),
                req.msg_size,
                req.time,
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

/// What a case's line says it did.
enum Line {
    /// A count of something.
    Counted(u64, &'static str),
    /// Words.
    Said(&'static str),
    /// Messages received and SENT (`rc_bi_bw`).
    Both(u64, u64),
}

impl From<&'static str> for Line {
    fn from(s: &'static str) -> Self {
        Line::Said(s)
    }
}

impl core::fmt::Display for Line {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Line::Counted(n, what) => write!(f, "{n} {what}"),
            Line::Said(s) => f.write_str(s),
            Line::Both(r, s) => write!(f, "{r} messages received, {s} SENT"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_name_the_test_the_roles_and_qperfs_options() {
        for (spec, test) in [
            ("qperf-rc_bw-client,-cm1,-t,2", Test::RcBw),
            ("qperf-rc_lat-client,-cm1", Test::RcLat),
            (
                "qperf-rc_rdma_write_bw-4k-client,-cm1,-m,4096",
                Test::RcRdmaWriteBw,
            ),
            (
                "qperf-rc_rdma_read_bw-client,-cm1,-to,20",
                Test::RcRdmaReadBw,
            ),
            ("qperf-rc_bi_bw-client,-cm1", Test::RcBiBw),
            ("qperf-rc_rdma_read_lat-client,-cm1", Test::RcRdmaReadLat),
            ("qperf-rc_rdma_write_lat-client,-cm1", Test::RcRdmaWriteLat),
            (
                "qperf-rc_rdma_write_poll_lat-client,-cm1",
                Test::RcRdmaWritePollLat,
            ),
            (
                "qperf-rc_compare_swap_mr-client,-cm1",
                Test::RcCompareSwapMr,
            ),
            ("qperf-rc_fetch_add_mr-client,-cm1", Test::RcFetchAddMr),
        ] {
            let c = QperfCase::parse(spec).expect(spec);
            assert_eq!((c.test, c.linux_serves), (test, false), "{spec}");
        }
        let c = QperfCase::parse("qperf-rc_lat-server,-cm1,-t,3,-to,20").expect("server");
        assert_eq!(
            c,
            QperfCase {
                test: Test::RcLat,
                linux_serves: true,
                msg_size: 1,
                time: 3,
                timeout: 20
            }
        );
        // qperf's defaults: 64 KiB, 1 byte, no size for the atomics.
        for (spec, size) in [
            ("qperf-rc_bi_bw-server,-cm1", 65536),
            ("qperf-rc_rdma_write_poll_lat-server,-cm1", 1),
            ("qperf-rc_fetch_add_mr-server,-cm1,-t,2", 0),
        ] {
            assert_eq!(QperfCase::parse(spec).map(|c| c.msg_size), Some(size));
        }
        for spec in [
            "qperf-rc_bi_bw-server,-cm1,-m,0",
            "qperf-rc_rdma_read_lat-client,-cm1,-m,0",
            "qperf-uc_bi_bw-client,-cm1",
            "qperf-ver_rc_fetch_add-client,-cm1",
            "qperf-rc_bw-client",
            "qperf-rc_bw-client,-t,2",
            "qperf-rc_bw-server,-cm1,-t,0",
            "qperf-rc_bw-server,-cm1,-m,0",
            "qperf-rc_bw-server,-cm1,-t",
            "qperf-rc_bw-server,-cm1,-v",
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
