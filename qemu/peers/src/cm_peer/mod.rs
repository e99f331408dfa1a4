//! CM peer mode: unmodified Linux `rdma_cm` programs against the unikernel, connected through
//! [`bareverbs::cm`] on QP1 (REQ/REP/RTU, DREQ/DREP) instead of a TCP side channel. A case of
//! `bvroce.cases=` (see [`crate::roce_peer`]) names the Linux program's role:
//!
//! | case | Linux runs | the unikernel |
//! | --- | --- | --- |
//! | `rping-server` | `rping -s` | the client: connects to port 7174, advertises its ping buffer (SEND), lets the server READ it, advertises its sink (SEND), lets the server WRITE the ping back, checks every byte, then disconnects (`rping.rs`) |
//! | `rping-client` | `rping -c -a <unikernel> -V` | the server: accepts, READs the client's ping buffer and checks every byte against rping's pattern, WRITEs it back into the client's sink (the client compares with `-V`) |
//! | `ucmatose-server` | `ucmatose` | the client: takes the server's SENDs, answers as many (`cmatose.rs`) |
//! | `ucmatose-client` | `ucmatose -s <unikernel>` | the server: SENDs its messages, takes the answers, disconnects |
//! | `udaddy-server` | `udaddy` | the client: resolves the UD service through SIDR, sends its datagrams, takes the answers (`udaddy.rs`) |
//! | `udaddy-client` | `udaddy -s <unikernel>` | the UD service: answers the SIDR_REQ, takes the datagrams, answers each |
//! | `mckey-server`, `mckey-client` | `mckey`, `mckey -s` | multicast: sends to the group, or takes what Linux sends to it, its QP attached directly (`mckey.rs`) |
//! | `rping6-…`, `ucmatose6-…`, `udaddy6-…` | the same by IPv6 address (`rping -a fd00::…`, `-s`/`-b`) | the same over RoCEv2 over IPv6, Linux at `fd00::D` in this side's /64 (D its IPv4 address's last byte), the CM's datagrams and the data both |
//! | `ucmatose-…`, `udaddy-…` with `-c N` | the same with `-c N` | the same on N connections (UD endpoints) at once, each its own QP and message slots (`many.rs`) |
//! | `ib_send_bw-server`, `ib_write_bw-server`, `ib_read_bw-server` | `ib_{send,write,read}_bw -R` | the client: perftest's control connection and its data connection through the CM, then SENDs, WRITEs or READs (`perftest.rs`) |
//! | `ib_send_bw-client`, `ib_write_bw-client`, `ib_read_bw-client` | the same with `<unikernel>` | the server: takes the SENDs, the WRITEs or the READs |
//! | `ib_write_bw-<word>-server`, `-client` with `-b` | `ib_write_bw -R -b` | the other role: both sides WRITE at once, each sends its own report; Linux's WRITE target overwritten whole and nothing around it touched |
//! | `ib_atomic_bw-server`, `ib_atomic_bw-client` | `ib_atomic_bw -R` | the other role: the unikernel's fetch-and-adds each returning the one before plus one, or Linux's adding up to `-n` on its zeroed buffer |
//! | `ib_send_bw-<word>-…`, `ib_read_bw-<word>-…`, `ib_atomic_bw-<word>-…` with `-b` | `ib_send_bw -R -b`, `ib_read_bw -R -b`, `ib_atomic_bw -R -b` | the other role: both sides SEND or READ at once, each sends its own report; Linux's SENDs checked, or this side's READs and its buffer unchanged by Linux's |
//! | `ib_send_bw-<word>-…`, `ib_write_bw-<word>-…`, `ib_read_bw-<word>-…` with `-q N` (up to 4) | the same with `-R -q N` | the other role on N data connections at once (one per QP, all to perftest's port), each QP's data checked as with one |
//! | `ib_send_lat-…`, `ib_write_lat-…`, `ib_read_lat-…`, `ib_atomic_lat-…` (`-server`, `-client`) | `ib_{send,write,read,atomic}_lat -R` | the other role, the same two connections: a SEND or WRITE each way per round, or the client's READs or fetch-and-adds one at a time (`perftest/lat.rs`) |
//!
//! rping's exchange (librdmacm-utils' `rping.c`): every message is a SEND of 16 bytes, the
//! buffer's address (u64), rkey (u32) and size (u32), big-endian; per ping the client sends
//! its ping buffer's, the server READs it and answers with a 16-byte "go ahead" (zeros: the
//! server never fills its send buffer), the client sends its sink's, the server WRITEs the
//! ping there (its length up to and including the terminating NUL) and sends "go ahead"
//! again. A ping is `rdma-ping-<n>: ` then letters from `A` + n (mod 58) cycling through
//! `A`..`z`, NUL-terminated, `-S` bytes in all. Options: `-S size` (64), `-C count`.

use core::fmt::Write;

use bareverbs::Context;
use bareverbs::cm::{
    AcceptParams, Cm, CmAddr, CmConfig, CmError, CmEvent, ConnId, ConnectRequest,
    Failure as CmFailure, Service,
};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use crate::{Failure, Step};

mod cmatose;
mod cmtime;
mod many;
pub mod mckey;
mod perftest;
mod rping;
mod udaddy;

pub use perftest::{PT_PORT, PtVerb};

/// rping's default port.
pub const RPING_PORT: u16 = 7174;
/// Bytes of a `struct rping_rdma_info`.
const INFO: u32 = 16;
/// rping's largest `-S` (`RPING_BUFSIZE - 1`).
pub const MAX_SIZE: u32 = 64 * 1024 - 1;
/// The smallest `-S` rping takes (the text and a number).
pub const MIN_SIZE: u32 = 26;
/// Where the receive and send buffers and the two data buffers sit in the one region.
const RECV_AT: u32 = 0;
const SEND_AT: u32 = 16;
const DATA_AT: u32 = 64;
/// Work request IDs.
const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;
/// What a data buffer holds before the peer fills it: a byte rping's pattern never has.
const SENTINEL: u8 = 0xEE;
/// Largest `-S` of ucmatose and udaddy cases (a UD datagram within a 1024-byte MTU).
pub const MAX_MESSAGE: u32 = 1024;
/// Largest `-C` of ucmatose and udaddy cases (each message has its own receive buffer).
pub const MAX_MESSAGES: u32 = 32;
/// Connection entries of every case's CM: cmtime's connections (at most
/// [`cmtime::MAX_CONNS`]) and those still in TIME_WAIT. One size for every case, so that the
/// kernel holds one copy of the CM's code, not one per table size (qperf's peer uses it too).
pub(crate) const CONNS: usize = 128;
/// Milliseconds between two connection attempts while Linux's server is not listening yet.
const RETRY_MS: u64 = 500;

/// The Linux program and its role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// `rping -s`: the unikernel connects.
    RpingServer,
    /// `rping -c`: the unikernel listens.
    RpingClient,
    /// `ucmatose` (the server): the unikernel connects.
    UcmatoseServer,
    /// `ucmatose -s`: the unikernel listens.
    UcmatoseClient,
    /// `udaddy` (the server): the unikernel resolves its UD service through SIDR.
    UdaddyServer,
    /// `udaddy -s`: the unikernel serves the UD port.
    UdaddyClient,
    /// perftest with `-R`: `ib_send_bw`, `ib_write_bw`, `ib_read_bw` or a latency program
    /// (`ib_send_lat`, `ib_write_lat`, `ib_read_lat`, `ib_atomic_lat`); the unikernel connects
    /// when Linux serves (the `…-server` cases), else it listens.
    Perftest {
        /// The program.
        verb: PtVerb,
        /// Linux runs the server.
        linux_serves: bool,
    },
    /// `cmtime`: the unikernel makes `-c` connections at once when Linux serves (`cmtime`),
    /// else it accepts them (`cmtime -s`); `cmtime.rs`.
    Cmtime {
        /// Linux runs the server.
        linux_serves: bool,
    },
    /// `ucmatose -c N` or `udaddy -c N` (N from 2 to 8, `many.rs`'s `MAX_CONNS`): the
    /// unikernel connects (or resolves) N times when Linux serves, else it serves N
    /// connections; `many.rs`.
    Many {
        /// udaddy's (UD through SIDR), else ucmatose's (RC).
        udaddy: bool,
        /// Linux runs the server.
        linux_serves: bool,
        /// Connections.
        conns: u32,
    },
    /// perftest with `-R` and `-q N` (N from 2 to 4): `ib_send_bw`, `ib_write_bw`,
    /// `ib_read_bw` or `ib_atomic_bw`, each data QP its own connection to perftest's port.
    PerftestQps {
        /// The program.
        verb: PtVerb,
        /// Linux runs the server.
        linux_serves: bool,
        /// Data QPs (`-q`).
        qps: u8,
    },
    /// A perftest `-R` case this peer does not run (options it does not take): it is told so
    /// on perftest's control connection ([`refuse_perftest`]).
    PerftestRefused {
        /// Linux runs the server.
        linux_serves: bool,
    },
}

/// A CM case: the program, its `-S` and `-C` (perftest's `-s` and `-n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmCase {
    /// The Linux program's role.
    pub program: Program,
    /// Bytes of a ping or message (`-S`; perftest's `-s`).
    pub size: u32,
    /// Pings or messages (`-C`; perftest's iterations, `-n`).
    pub count: u32,
}

impl CmCase {
    /// Parses `rping-server,-S,64,-C,100,-V` (`,` for spaces); `None` for another program or
    /// options that do not parse. `-V` and `-v` are the Linux side's (the unikernel checks
    /// every byte anyway). The defaults are the programs': rping 64 bytes, ucmatose and
    /// udaddy 10 messages of 100 bytes.
    pub fn parse(spec: &str) -> Option<CmCase> {
        if let Some(c) = perftest::parse(spec) {
            return Some(c);
        }
        let mut words = spec.split(',').filter(|w| !w.is_empty());
        let first = words.next()?;
        let v6 = over_ipv6(first);
        let program = match if v6 { plain_name(first) } else { first } {
            "rping-server" => Program::RpingServer,
            "rping-client" => Program::RpingClient,
            "ucmatose-server" => Program::UcmatoseServer,
            "ucmatose-client" => Program::UcmatoseClient,
            "udaddy-server" => Program::UdaddyServer,
            "udaddy-client" => Program::UdaddyClient,
            plain @ ("cmtime-server" | "cmtime-client") => {
                return cmtime_case(plain == "cmtime-server", words);
            }
            _ => return None,
        };
        let rping = matches!(program, Program::RpingServer | Program::RpingClient);
        let (mut size, mut count) = if rping { (64, 1) } else { (100, 10) };
        let mut conns = 1;
        while let Some(w) = words.next() {
            match w {
                "-V" | "-v" => continue,
                "-S" => size = words.next()?.parse().ok()?,
                "-C" => count = words.next()?.parse().ok()?,
                // Connections: ucmatose's and udaddy's (`many.rs`).
                "-c" if !rping => conns = words.next()?.parse().ok()?,
                _ => return None,
            }
        }
        if !(1..=many::MAX_CONNS).contains(&conns) {
            return None;
        }
        let program = match program {
            _ if conns == 1 => program,
            p => Program::Many {
                udaddy: matches!(p, Program::UdaddyServer | Program::UdaddyClient),
                linux_serves: matches!(p, Program::UcmatoseServer | Program::UdaddyServer),
                conns,
            },
        };
        let ok = if rping {
            (MIN_SIZE..=MAX_SIZE).contains(&size) && count >= 1
        } else {
            // A UD message fits the 1024-byte path MTU with room for nothing else.
            (1..=MAX_MESSAGE).contains(&size) && (1..=MAX_MESSAGES).contains(&count)
        };
        ok.then_some(CmCase {
            program,
            size,
            count,
        })
    }

    /// The case's name.
    pub fn name(&self) -> &'static str {
        match self.program {
            Program::RpingServer => "rping-server",
            Program::RpingClient => "rping-client",
            Program::UcmatoseServer => "ucmatose-server",
            Program::UcmatoseClient => "ucmatose-client",
            Program::Many {
                udaddy,
                linux_serves,
                ..
            } => match (udaddy, linux_serves) {
                (false, true) => "ucmatose-server",
                (false, false) => "ucmatose-client",
                (true, true) => "udaddy-server",
                (true, false) => "udaddy-client",
            },
            Program::UdaddyServer => "udaddy-server",
            Program::UdaddyClient => "udaddy-client",
            Program::Cmtime { linux_serves: true } => "cmtime-server",
            Program::Cmtime {
                linux_serves: false,
            } => "cmtime-client",
            Program::Perftest { verb, linux_serves }
            | Program::PerftestQps {
                verb, linux_serves, ..
            } => verb.case_name(linux_serves),
            Program::PerftestRefused { .. } => "perftest -R, refused",
        }
    }
}

/// The IPv6 cases of the rdma_cm programs: the same exchange as the case without the `6`
/// (with the same options, `-c N` included), by IPv6 address.
const V6_CASES: [(&str, &str); 8] = [
    ("rping6-server", "rping-server"),
    ("rping6-client", "rping-client"),
    ("ucmatose6-server", "ucmatose-server"),
    ("ucmatose6-client", "ucmatose-client"),
    ("udaddy6-server", "udaddy-server"),
    ("udaddy6-client", "udaddy-client"),
    ("cmtime6-server", "cmtime-server"),
    ("cmtime6-client", "cmtime-client"),
];

/// Whether the case named `name` (`rping6-server` …) runs over IPv6.
pub fn over_ipv6(name: &str) -> bool {
    V6_CASES.iter().any(|(six, _)| *six == name)
}

/// The name of an IPv6 case's IPv4 twin (`rping6-server`: `rping-server`), or `name`.
fn plain_name(name: &str) -> &str {
    V6_CASES
        .iter()
        .find(|(six, _)| *six == name)
        .map_or(name, |(_, four)| four)
}

/// Linux's IPv6 address in the lab: in this side's /64, the interface identifier its IPv4
/// address's last byte (`fd00::1` for 10.0.0.1 beside the unikernel's `fd00::2`;
/// `qemu/roce/linux.sh` gives each guest that address).
fn linux_ipv6(me: [u8; 16], linux: [u8; 4]) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..8].copy_from_slice(&me[..8]);
    a[15] = linux[3];
    a
}

/// Linux's address in a case: its IPv4 address, or when `v6` its IPv6 one beside this
/// side's ([`linux_ipv6`]); an error if this side has no IPv6 address.
fn linux_addr<P: Provider, C: Clock, const N: usize>(
    cm: &Cm<'_, P, C, N>,
    linux: [u8; 4],
    v6: bool,
) -> Result<CmAddr, CaseError> {
    match (v6, cm.ip6()) {
        (false, _) => Ok(CmAddr::from(linux)),
        (true, Some(me)) => Ok(CmAddr::from(linux_ipv6(me, linux))),
        (true, None) => Err(CaseError::Request("an IPv6 address of this side")),
    }
}

/// A cmtime case's options: `-c N` (100 by default, at most [`cmtime::MAX_CONNS`]).
fn cmtime_case<'w>(linux_serves: bool, mut words: impl Iterator<Item = &'w str>) -> Option<CmCase> {
    let mut count = 100;
    while let Some(w) = words.next() {
        match w {
            "-c" => count = words.next()?.parse().ok()?,
            _ => return None,
        }
    }
    (1..=cmtime::MAX_CONNS).contains(&count).then_some(CmCase {
        program: Program::Cmtime { linux_serves },
        size: 0,
        count,
    })
}

/// Why a CM case failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaseError {
    /// A verbs call failed.
    Verbs(Failure),
    /// The CM refused a call.
    Cm(&'static str, CmError),
    /// The connection was not established.
    Connect(CmFailure),
    /// The case's deadline passed while waiting for this.
    Deadline(&'static str),
    /// A completion with an error status (and its work request).
    Status(WcStatus, u64),
    /// The peer disconnected while this was awaited.
    Disconnected(&'static str),
    /// A connection request that is not rping's (which field).
    Request(&'static str),
    /// A perftest message or data that is not what perftest sends: which, its index, the
    /// first wrong byte (`u32::MAX`: the length).
    Message {
        /// What was checked.
        what: &'static str,
        /// Its index among its kind (from 0).
        index: u32,
        /// The first wrong byte's offset, or `u32::MAX` for a wrong length.
        at: u32,
    },
    /// A received message or buffer that is not what rping sends: which, in which ping, the
    /// first wrong byte (`u32::MAX`: the length).
    Bytes {
        /// What was checked.
        what: &'static str,
        /// The ping (from 0).
        ping: u32,
        /// The first wrong byte's offset, or `u32::MAX` for a wrong length.
        at: u32,
    },
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
            CaseError::Connect(c) => write!(f, "not connected: {c:?}"),
            CaseError::Deadline(what) => write!(f, "deadline passed waiting for {what}"),
            CaseError::Status(s, id) => write!(f, "completion {s:?} for work request {id}"),
            CaseError::Disconnected(what) => write!(f, "peer disconnected before {what}"),
            CaseError::Request(what) => write!(f, "connection request: unexpected {what}"),
            CaseError::Message { what, index, at } if *at == u32::MAX => {
                write!(f, "{what}, number {index}: wrong length")
            }
            CaseError::Message { what, index, at } => {
                write!(f, "{what}, number {index}: wrong byte at {at}")
            }
            CaseError::Bytes { what, ping, at } if *at == u32::MAX => {
                write!(f, "{what} of ping {ping}: wrong length")
            }
            CaseError::Bytes { what, ping, at } => {
                write!(f, "{what} of ping {ping}: wrong byte at {at}")
            }
        }
    }
}

/// What a case that passed did.
struct Done {
    /// Pings or messages each way.
    count: u32,
    /// `pings` or `messages`.
    unit: &'static str,
    /// Bytes each.
    size: u32,
    /// Bytes the unikernel received and checked, every one (data READ or WRITTEN into it,
    /// messages, GRH areas).
    checked: u64,
    /// Milliseconds from the REQ or SIDR_REQ (sent or received) to the connection being up
    /// (the clock ticks every 16 ms); perftest's two connections: the sum.
    connect_ms: u64,
    /// What was checked of what arrived ([`EVERY_BYTE`] but for perftest's WRITE target).
    how: &'static str,
}

/// What the cases check of what they receive.
const EVERY_BYTE: &str = "every byte received checked";

/// The CM's clock: the case's millisecond clock.
struct Ms<'c>(&'c dyn Fn() -> u64);

impl Clock for Ms<'_> {
    fn now_us(&self) -> u64 {
        (self.0)().saturating_mul(1000)
    }
}

/// Runs one CM case against the Linux side at `linux` and prints its `roce-uk` line under
/// `name` (the case's name as the lab wrote it, a tag included); `true` if it passed.
#[allow(clippy::too_many_arguments)]
pub fn run_case<P: Provider>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    linux: [u8; 4],
    name: &str,
    case: &CmCase,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
    out: &mut dyn Write,
) -> bool {
    let v6 = over_ipv6(name);
    if let Program::Cmtime { linux_serves } = case.program {
        return cmtime::run_case(
            ctx,
            pd,
            (linux, v6),
            name,
            case,
            linux_serves,
            deadline,
            clock_ms,
            out,
        );
    }
    let t0 = clock_ms();
    let (r, conns) = match case.program {
        Program::Many { conns, .. } => (
            many::run(ctx, pd, (linux, v6), case, deadline, clock_ms),
            conns,
        ),
        _ => (run(ctx, pd, (linux, v6), case, deadline, clock_ms), 1),
    };
    let ms = clock_ms() - t0;
    match r {
        Ok(d) if conns > 1 => {
            let _ = writeln!(
                out,
                "roce-uk {name}: ok {conns} connections, {} {} of {} bytes each way on each, {} ({} bytes), all up {} ms after the first request; {ms} ms in all",
                d.count, d.unit, d.size, d.how, d.checked, d.connect_ms
            );
            true
        }
        Ok(d) => {
            let _ = writeln!(
                out,
                "roce-uk {name}: ok {} {} of {} bytes, {} ({} bytes), connected in {} ms; {ms} ms in all",
                d.count, d.unit, d.size, d.how, d.checked, d.connect_ms
            );
            true
        }
        Err(e) => {
            let _ = writeln!(out, "roce-uk {name}: FAIL {e} (after {ms} ms)");
            false
        }
    }
}

/// Tells the Linux side of a perftest `-R` case this peer does not run that it is refused,
/// on perftest's own control connection: the unikernel makes or accepts it as perftest
/// does, and answers the version exchange with `"0"`, a version older than any perftest
/// works with (it exits at once: "not compatible with versions older than 5.70"). Its
/// kernel's DREQ then ends the connection. `Ok` once the version went out.
pub fn refuse_perftest<P: Provider>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    linux: [u8; 4],
    linux_serves: bool,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
) -> Result<(), CaseError> {
    let case = CmCase {
        program: Program::PerftestRefused { linux_serves },
        size: 0,
        count: 0,
    };
    run(ctx, pd, (linux, false), &case, deadline, clock_ms).map(|_| ())
}

/// Runs a single-connection case against Linux at `linux`, by its IPv6 address (in the lab's
/// plan, [`linux_ipv6`]) when `v6`.
fn run<P: Provider>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    (linux, v6): ([u8; 4], bool),
    case: &CmCase,
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
) -> Result<Done, CaseError> {
    let cm_cq = ctx.create_cq(32).at("cm: create CM CQ")?;
    // Room for every send and receive of the largest case.
    let cq = ctx
        .create_cq(2 * (16 + MAX_MESSAGES) + 4)
        .at("cm: create CQ")?;
    let mut access =
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    if let Program::Perftest { verb, .. } | Program::PerftestQps { verb, .. } = case.program
        && verb.atomics()
    {
        access |= AccessFlags::REMOTE_ATOMIC;
    }
    let len = match case.program {
        Program::RpingServer | Program::RpingClient => DATA_AT + 2 * case.size,
        Program::Perftest { verb, linux_serves } => {
            perftest::region_len(verb, linux_serves, case, 1)
        }
        Program::PerftestQps {
            verb,
            linux_serves,
            qps,
        } => perftest::region_len(verb, linux_serves, case, qps),
        Program::PerftestRefused { .. } => perftest::REFUSE_LEN,
        Program::Cmtime { .. } => 0,
        _ => (case.count + 1) * cmatose::slot(case.size),
    };
    let mut mr = pd.register(len as usize, access).at("cm: register")?;
    let r = {
        let mut cm: Cm<'_, P, Ms<'_>, CONNS> =
            Cm::new(pd, &cm_cq, Ms(clock_ms), CmConfig::default())
                .map_err(|e| CaseError::Cm("CM over QP1", e))?;
        let peer = linux_addr(&cm, linux, v6)?;
        let mut s = Session {
            cm: &mut cm,
            cq: &cq,
            mr: &mut mr,
            deadline,
            clock_ms,
            seen: [None; SEEN],
            id: None,
            established: None,
            disconnected: false,
            data: [None; perftest::MAX_QPS],
            data_established: [None; perftest::MAX_QPS],
            data_disconnected: [false; perftest::MAX_QPS],
            request: [None; perftest::MAX_QPS],
            backlog: 1,
        };
        match case.program {
            Program::RpingServer => s.rping_client(pd, peer, case),
            Program::RpingClient => s.rping_server(pd, peer, case),
            Program::UcmatoseServer => s.ucmatose_client(pd, peer, case),
            Program::UcmatoseClient => s.ucmatose_server(pd, peer, case),
            Program::UdaddyServer => s.udaddy_client(pd, peer, case),
            Program::UdaddyClient => s.udaddy_server(pd, peer, case),
            Program::Perftest { verb, linux_serves } => {
                s.perftest(pd, linux, case, (verb, 1), linux_serves)
            }
            Program::PerftestQps {
                verb,
                linux_serves,
                qps,
            } => s.perftest(pd, linux, case, (verb, qps), linux_serves),
            Program::PerftestRefused { linux_serves } => s.perftest_refuse(pd, linux, linux_serves),
            Program::Cmtime { .. } => Err(CaseError::Request("cmtime outside its own run")),
            Program::Many { .. } => Err(CaseError::Request("-c outside its own run")),
        }
    };
    // The region and the CQs go when they drop (the session's borrows tie them to it).
    r
}

/// An accepted connection: its QP, when the request came (ms), the request.
type Accepted<'a, P> = (QueuePair<'a, P, Rc, Rts>, u64, ConnectRequest);

/// One connection's case: the CM, the data QP's CQ, the region, what was seen.
struct Session<'s, 'a, P: Provider, C: Clock> {
    cm: &'s mut Cm<'a, P, C, CONNS>,
    cq: &'a CompletionQueue<'a, P>,
    mr: &'s mut MemoryRegion<'a, P>,
    deadline: u64,
    clock_ms: &'s dyn Fn() -> u64,
    /// Completions taken while waiting for another one, by [`seen_slot`].
    seen: [Option<Seen>; SEEN],
    /// The connection.
    id: Option<ConnId>,
    /// When the passive side saw the RTU (ms).
    established: Option<u64>,
    /// The peer's DREQ (or the answer to this side's).
    disconnected: bool,
    /// Further connections (perftest's data QPs, one per `-q`; `id` is its control
    /// connection).
    data: [Option<ConnId>; perftest::MAX_QPS],
    /// When the passive side saw each further connection's RTU (ms).
    data_established: [Option<u64>; perftest::MAX_QPS],
    /// Each further connection's DREQ (or the answer to this side's).
    data_disconnected: [bool; perftest::MAX_QPS],
    /// Connection requests not taken yet, oldest first, and when each came (ms).
    request: [Option<(ConnectRequest, u64)>; perftest::MAX_QPS],
    /// How many requests may wait at once (perftest's `-q` on a listening side); one more is
    /// rejected.
    backlog: usize,
}

impl<'s, 'a, P: Provider, C: Clock> Session<'s, 'a, P, C> {
    fn now(&self) -> u64 {
        (self.clock_ms)()
    }

    fn qp(&self, pd: &'a ProtectionDomain<'a, P>) -> Result<QueuePair<'a, P, Rc, Reset>, Failure> {
        let caps = QpCaps {
            max_send_wr: 16 + MAX_MESSAGES,
            max_recv_wr: 2 + MAX_MESSAGES,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        pd.qp_builder(self.cq, self.cq)
            .caps(caps)
            .build::<Rc>()
            .at("cm: create QP")
    }

    /// One CM event, if any; the connection's own ones are noted. A connection request is
    /// kept for [`Self::accept_next`] (whatever wait polls the CM when it comes: perftest's
    /// client connects its data QPs while this side still waits for a SEND's completion), up
    /// to [`Self::backlog`] at once; one more meanwhile is rejected.
    fn cm_event(&mut self) -> Option<CmEvent<'a, P>> {
        let ev = self.cm.poll()?;
        if let CmEvent::ConnectRequest(r) = ev {
            let now = self.now();
            let backlog = self.backlog.clamp(1, self.request.len());
            match self.request[..backlog].iter_mut().find(|q| q.is_none()) {
                Some(free) => *free = Some((r, now)),
                None => {
                    let _ = self.cm.reject(r.id, &[]);
                }
            }
            return None;
        }
        match &ev {
            CmEvent::Established { id, qp: None, .. } if Some(*id) == self.id => {
                self.established = Some(self.now());
            }
            CmEvent::Disconnected { id } if Some(*id) == self.id => self.disconnected = true,
            CmEvent::Established { id, qp: None, .. } => {
                if let Some(k) = self.data.iter().position(|d| *d == Some(*id)) {
                    self.data_established[k] = Some(self.now());
                }
            }
            CmEvent::Disconnected { id } => {
                if let Some(k) = self.data.iter().position(|d| *d == Some(*id)) {
                    self.data_disconnected[k] = true;
                }
            }
            _ => {}
        }
        Some(ev)
    }

    /// The server's side of an RC connection: listens on `port`, waits (until the deadline)
    /// for the request, checks that it comes from `linux` to `port` with depths 1/1, the retry
    /// and RNR retry counts `retries` and no private data (rejecting it otherwise), and
    /// accepts it on a new QP. Returns the QP and when the request came (ms).
    fn accept_checked(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: CmAddr,
        port: u16,
        retries: (u8, u8),
    ) -> Result<(QueuePair<'a, P, Rc, Rts>, u64), CaseError> {
        self.listen(port)?;
        let (qp, t_req, _) = self.accept_next(
            pd,
            linux,
            port,
            &|r, i| (r, i) == (1, 1),
            retries,
            &AcceptParams::default(),
        )?;
        Ok((qp, t_req))
    }

    /// Listens on `port` (rdma_cm's TCP port space, any address).
    fn listen(&mut self, port: u16) -> Result<(), CaseError> {
        self.cm
            .listen(None, port, Service::Rc)
            .map_err(|e| CaseError::Cm("listen", e))
    }

    /// Waits (until the deadline) for the next request to the listening `port`, checks it as
    /// [`Self::accept_checked`] does, its depths (responder resources, initiator depth) with
    /// `depths_ok`, and accepts it with `params` on a new QP. Returns the QP, when the
    /// request came (ms) and the request.
    fn accept_next(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: impl Into<CmAddr>,
        port: u16,
        depths_ok: &dyn Fn(u8, u8) -> bool,
        retries: (u8, u8),
        params: &AcceptParams<'_>,
    ) -> Result<Accepted<'a, P>, CaseError> {
        let linux = linux.into();
        let (req, t_req) = loop {
            if let Some(r) = self.request[0].take() {
                // The next oldest first.
                self.request.rotate_left(1);
                break r;
            }
            let _ = self.cm_event();
            if self.now() > self.deadline {
                return Err(CaseError::Deadline("the REQ"));
            }
        };
        self.id = Some(req.id);
        let checks = [
            (req.src_addr == linux, "source address"),
            (req.dst_port == port, "port"),
            (
                depths_ok(req.responder_resources, req.initiator_depth),
                "depths",
            ),
            ((req.retry_count, req.rnr_retry_count) == retries, "retries"),
            (
                req.private_data.as_slice().iter().all(|&b| b == 0),
                "private data",
            ),
        ];
        if let Some((_, what)) = checks.iter().find(|(ok, _)| !ok) {
            let _ = self.cm.reject(req.id, &[]);
            return Err(CaseError::Request(what));
        }
        let qp = self.qp(pd)?;
        let rts = self
            .cm
            .accept(req.id, qp, params)
            .map_err(|(_, e)| CaseError::Cm("accept", e))?;
        Ok((rts, t_req, req))
    }

    /// Runs the CM until the peer's DREQ came, failing with `what` past the deadline.
    fn wait_disconnected(&mut self, what: &'static str) -> Result<(), CaseError> {
        while !self.disconnected {
            let _ = self.cm_event();
            if self.now() > self.deadline {
                return Err(CaseError::Deadline(what));
            }
        }
        Ok(())
    }

    /// Waits for the completion of work request `wr_id` (the CM polled meanwhile).
    fn wait(&mut self, wr_id: u64, what: &'static str) -> Result<Seen, CaseError> {
        let slot = seen_slot(wr_id).ok_or(CaseError::Status(WcStatus::GeneralErr, wr_id))?;
        loop {
            if let Some(w) = self.seen[slot].take() {
                return Ok(w);
            }
            self.poll_once(what)?;
        }
    }

    /// Waits for the completion of work request `wr_id`, or for the peer's DREQ: `false` when
    /// the DREQ came first. For a peer that disconnects once it has taken this side's last
    /// message: its QP goes to ERROR before it disconnects, which may be before its rxe
    /// acknowledged the message (rxe acknowledges lazily), so this side's completion comes
    /// only with the flush (Linux's own programs never wait for it).
    fn wait_unless_disconnected(
        &mut self,
        wr_id: u64,
        what: &'static str,
    ) -> Result<bool, CaseError> {
        match self.wait(wr_id, what) {
            Ok(_) => Ok(true),
            Err(CaseError::Disconnected(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Keeps polling (the CQ's device progress and the CM) for `ms` milliseconds.
    fn linger(&mut self, ms: u64) {
        let until = self.now() + ms;
        while self.now() < until {
            let mut wcs = [WorkCompletion::default(); 4];
            let _ = self.cq.poll(&mut wcs);
            let _ = self.cm_event();
        }
    }

    /// Takes one CM event and the completions there are; an error status ends the case. (The
    /// CM first: its poll reads the clock, and a read that follows one with no frame in
    /// between may halt the CPU until the next interrupt (`roce_peer::serve`); so the poll of
    /// the CQ after it runs the device once more, sending what the frames taken asked for,
    /// before this round's own read of the clock.)
    fn poll_once(&mut self, what: &'static str) -> Result<(), CaseError> {
        let _ = self.cm_event();
        let mut wcs = [WorkCompletion::default(); 4];
        let n = self.cq.poll(&mut wcs).at("cm: poll CQ")?;
        for w in &wcs[..n] {
            let slot = seen_slot(w.wr_id).filter(|&s| self.seen[s].is_none());
            match slot {
                Some(s) if w.status == WcStatus::Success => self.seen[s] = Some(Seen::from(w)),
                _ => return Err(CaseError::Status(w.status, w.wr_id)),
            }
        }
        if n == 0 && self.disconnected {
            return Err(CaseError::Disconnected(what));
        }
        if n == 0 && self.now() > self.deadline {
            return Err(CaseError::Deadline(what));
        }
        Ok(())
    }

    /// Takes what is left on the CQ (flushed work requests) and the CM's last events.
    fn drain(&mut self) {
        let mut wcs = [WorkCompletion::default(); 4];
        for _ in 0..8 {
            let n = self.cq.poll(&mut wcs).unwrap_or(0);
            let _ = self.cm_event();
            if n == 0 {
                break;
            }
        }
        self.seen = [None; SEEN];
    }
}

/// Completion slots: rping's four work requests, then ucmatose's and udaddy's receives and
/// sends (one each per message).
const SEEN: usize = 4 + 2 * MAX_MESSAGES as usize;
/// Work request IDs of the per-message receives and sends.
const RECV_BASE: u64 = 0x100;
const SEND_BASE: u64 = 0x200;

/// The slot of `seen` a work request's completion goes to.
fn seen_slot(wr_id: u64) -> Option<usize> {
    let per = u64::from(MAX_MESSAGES);
    match wr_id {
        WR_RECV..=WR_WRITE => Some((wr_id - WR_RECV) as usize),
        _ if (RECV_BASE..RECV_BASE + per).contains(&wr_id) => {
            Some((4 + wr_id - RECV_BASE) as usize)
        }
        _ if (SEND_BASE..SEND_BASE + per).contains(&wr_id) => {
            Some((4 + per + wr_id - SEND_BASE) as usize)
        }
        _ => None,
    }
}

/// What the case keeps of a completion.
#[derive(Clone, Copy, Debug)]
struct Seen {
    byte_len: u32,
    imm: u32,
    src_qp: u32,
    opcode: WcOpcode,
    flags: WcFlags,
}

impl From<&WorkCompletion> for Seen {
    fn from(w: &WorkCompletion) -> Self {
        Seen {
            byte_len: w.byte_len,
            imm: w.imm,
            src_qp: w.src_qp,
            opcode: w.opcode,
            flags: w.flags,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_parse_as_rpings_options() {
        assert_eq!(
            CmCase::parse("rping-server,-S,64,-C,100,-V"),
            Some(CmCase {
                program: Program::RpingServer,
                size: 64,
                count: 100
            })
        );
        let c = CmCase::parse("rping-client").expect("defaults");
        assert_eq!((c.program, c.size, c.count), (Program::RpingClient, 64, 1));
        assert_eq!(CmCase::parse("rping-client,-S,8"), None);
        assert_eq!(CmCase::parse("rping-client,-S,65536"), None);
        // rping's largest ping, both roles.
        for (spec, program) in [
            ("rping-server,-S,65535,-C,10,-V", Program::RpingServer),
            ("rping-client,-S,65535,-C,10,-V", Program::RpingClient),
        ] {
            assert_eq!(
                CmCase::parse(spec),
                Some(CmCase {
                    program,
                    size: MAX_SIZE,
                    count: 10
                })
            );
        }
        assert_eq!(CmCase::parse("rping-client,-C,0"), None);
        assert_eq!(CmCase::parse("rping-client,-x"), None);
        assert_eq!(CmCase::parse("rc-server"), None);
    }

    #[test]
    fn ucmatose_cases_take_a_connection_count() {
        assert_eq!(
            CmCase::parse("ucmatose-server,-c,4,-C,10,-S,100"),
            Some(CmCase {
                program: Program::Many {
                    udaddy: false,
                    linux_serves: true,
                    conns: 4
                },
                size: 100,
                count: 10
            })
        );
        let c = CmCase::parse("ucmatose-client,-c,8").expect("the most, default messages");
        assert_eq!(
            (c.program, c.size, c.count, c.name()),
            (
                Program::Many {
                    udaddy: false,
                    linux_serves: false,
                    conns: 8
                },
                100,
                10,
                "ucmatose-client"
            )
        );
        // One connection is the single-connection case.
        let c = CmCase::parse("ucmatose-client,-c,1,-C,10,-S,100").expect("one");
        assert_eq!(c.program, Program::UcmatoseClient);
        assert_eq!(CmCase::parse("ucmatose-client,-c,9"), None);
        assert_eq!(CmCase::parse("ucmatose-server,-c,0"), None);
        assert_eq!(CmCase::parse("ucmatose-server,-c"), None);
        assert_eq!(CmCase::parse("ucmatose-server,-c,4,-C,33"), None);
        // -c is ucmatose's and udaddy's, not rping's.
        assert_eq!(CmCase::parse("rping-client,-c,4"), None);
        let c = CmCase::parse("udaddy-server,-c,4,-C,10,-S,100").expect("udaddy");
        assert_eq!(
            (c.program, c.name()),
            (
                Program::Many {
                    udaddy: true,
                    linux_serves: true,
                    conns: 4
                },
                "udaddy-server"
            )
        );
        let c = CmCase::parse("udaddy-client,-c,2").expect("udaddy");
        assert_eq!(
            (c.program, c.name()),
            (
                Program::Many {
                    udaddy: true,
                    linux_serves: false,
                    conns: 2
                },
                "udaddy-client"
            )
        );
        assert_eq!(CmCase::parse("udaddy-client,-c,9"), None);
    }

    #[test]
    fn the_peer_takes_the_labs_new_cases_and_refuses_more_connections() {
        use crate::roce_peer::{PeerCase, Refused};
        // The lines of qemu/roce/cases, as the lab hands them over (`,` for spaces).
        for (spec, name) in [
            ("rping-server,-S,65535,-C,10,-V", "rping-server"),
            ("rping-client,-S,65535,-C,10,-V", "rping-client"),
            ("ucmatose-server,-c,4,-C,10,-S,100", "ucmatose-server"),
            ("ucmatose-client,-c,4,-C,10,-S,100", "ucmatose-client"),
            ("udaddy-server,-c,4,-C,10,-S,100", "udaddy-server"),
            ("udaddy-client,-c,4,-C,10,-S,100", "udaddy-client"),
        ] {
            let c = PeerCase::parse(spec).expect(spec);
            assert_eq!(c.name(), name, "{spec}");
            assert!(matches!(c, PeerCase::Cm(_)), "{spec}");
        }
        // More connections than the peer holds: refused as options it does not take, the
        // Linux program left to its own time (it goes through the CM, not over TCP).
        for spec in ["ucmatose-server,-c,9,-C,10,-S,100", "udaddy-client,-c,64"] {
            assert_eq!(PeerCase::parse(spec), None, "{spec}");
            let r = Refused::of(spec);
            assert_eq!(
                (r.why, r.side, r.cm_side),
                ("options the peer does not take", None, None),
                "{spec}"
            );
        }
    }

    #[test]
    fn ipv6_cases_are_their_ipv4_twins_by_ipv6_address() {
        use crate::roce_peer::PeerCase;
        for (spec, program) in [
            ("rping6-server,-S,64,-C,100,-V", Program::RpingServer),
            ("rping6-client,-S,64,-C,100,-V", Program::RpingClient),
            ("ucmatose6-server,-C,10,-S,100", Program::UcmatoseServer),
            ("ucmatose6-client,-C,10,-S,100", Program::UcmatoseClient),
            ("udaddy6-server,-C,10,-S,100", Program::UdaddyServer),
            ("udaddy6-client,-C,10,-S,100", Program::UdaddyClient),
        ] {
            let name = spec.split(',').next().unwrap();
            let c = CmCase::parse(spec).expect(spec);
            assert_eq!(c.program, program, "{spec}");
            assert!(over_ipv6(name), "{spec}");
            assert!(!over_ipv6(plain_name(name)), "{spec}");
            assert!(
                matches!(PeerCase::parse(spec), Some(PeerCase::Cm(_))),
                "{spec}"
            );
        }
        // Several connections at once and cmtime: the IPv4 twin's program and options.
        for (spec, program, count) in [
            (
                "ucmatose6-client,-c,4,-C,10,-S,100",
                Program::Many {
                    udaddy: false,
                    linux_serves: false,
                    conns: 4,
                },
                10,
            ),
            (
                "udaddy6-server,-c,4,-C,10,-S,100",
                Program::Many {
                    udaddy: true,
                    linux_serves: true,
                    conns: 4,
                },
                10,
            ),
            (
                "cmtime6-server,-c,100",
                Program::Cmtime { linux_serves: true },
                100,
            ),
            (
                "cmtime6-client,-c,100",
                Program::Cmtime {
                    linux_serves: false,
                },
                100,
            ),
        ] {
            let c = CmCase::parse(spec).expect(spec);
            assert_eq!((c.program, c.count), (program, count), "{spec}");
            assert!(over_ipv6(spec.split(',').next().unwrap()), "{spec}");
            assert!(
                matches!(PeerCase::parse(spec), Some(PeerCase::Cm(_))),
                "{spec}"
            );
        }
        // The same bounds as over IPv4: refused, and told so through the CM (no TCP side).
        for spec in [
            "ucmatose6-client,-c,9",
            "udaddy6-server,-c,0",
            "cmtime6-server,-c,129",
            "rping6-client,-c,4",
        ] {
            assert_eq!(CmCase::parse(spec), None, "{spec}");
            let r = crate::roce_peer::Refused::of(spec);
            assert_eq!(
                (r.why, r.side, r.cm_side),
                ("options the peer does not take", None, None),
                "{spec}"
            );
        }
        // Other names are not IPv6 cases.
        assert!(!over_ipv6("rping-server") && !over_ipv6("rc6-server"));
        assert!(!over_ipv6("cmtime-client") && !over_ipv6("ib_write_bw-cm6-server"));
        // Linux's address: this side's /64, its IPv4 address's last byte.
        let mut me = [0u8; 16];
        (me[0], me[1], me[15]) = (0xfd, 0, 2);
        let mut want = me;
        want[15] = 1;
        assert_eq!(linux_ipv6(me, [10, 0, 0, 1]), want);
    }

    #[test]
    fn cmtime_cases_take_a_connection_count_within_the_device() {
        let c = CmCase::parse("cmtime-client").expect("defaults");
        assert_eq!(
            (c.program, c.count),
            (
                Program::Cmtime {
                    linux_serves: false
                },
                100
            )
        );
        let c = CmCase::parse("cmtime-server,-c,120").expect("the most");
        assert_eq!(
            (c.program, c.count, c.name()),
            (Program::Cmtime { linux_serves: true }, 120, "cmtime-server")
        );
        assert_eq!(CmCase::parse("cmtime-server,-c,121"), None);
        assert_eq!(CmCase::parse("cmtime-server,-c,0"), None);
        assert_eq!(CmCase::parse("cmtime-server,-p,7000"), None);
    }
}
