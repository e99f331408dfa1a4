//! Peer mode on the software RoCE device: the unikernel plays the other side of unmodified
//! Linux programs on a Linux `rdma_rxe` across a real Ethernet segment (`qemu/roce/lab.sh`),
//! and answers their TCP exchange itself ([`crate::tcp`] over the device's
//! [`stack`](bareverbs::device::rxe::Rxe::stack) link).
//!
//! The kernel command line names the address and the cases:
//!
//! ```text
//! bvroce=10.0.0.2/24 bvroce.peer=10.0.0.1 bvroce.cases=rc-server,-s,4096,-n,200+read,-s,65536,-n,1000
//! ```
//!
//! and `bvroce.ip6=fd00::2` a global IPv6 address for the IPv6 cases. The lab passes the
//! cases another way, since its whole list outgrows the 4 KiB that QEMU's PVH boot takes on a
//! command line: `bvroce.cases.fw_cfg=opt/bareverbs/roce-cases` names a fw_cfg file (QEMU's
//! `-fw_cfg name=opt/bareverbs/roce-cases,file=PATH`) that holds the list in the same form, up
//! to [`CASES_MAX`] bytes (`bareverbs_platform::fw_cfg`; `docs/testing.md`).
//!
//! A case is the Linux program's role and options, with `,` for spaces; cases are joined by
//! `+` and run in that order, each printing one line: `roce-uk <case>: ok …`,
//! `roce-uk <case>: FAIL …`, or `roce-uk <case>: REFUSED …` for a case the peer does not run
//! (a program it does not speak, options it does not take). A refused case's Linux program is
//! told at once where it meets the peer over TCP ([`crate::tcp::refuse`]), and the peer goes
//! on to the next case.
//!
//! | case | Linux runs | the unikernel |
//! | --- | --- | --- |
//! | `rc-server`, `ud-server` | `ibv_{rc,ud}_pingpong` as the server | connects, then ping-pongs ([`crate::peer::run_case`]) |
//! | `rc-client`, `ud-client` | the same as the client | listens, answers once at RTS |
//! | `rc6-server`, `rc6-client`, and perftest's `…-v6-server`, `…-v6-client` | the same over IPv6: Linux's program with its IPv6 GID | the same from the IPv6 GID of `bvroce.ip6=` ([`crate::gids::Gids::pick`]) |
//! | `write` | `ib_write_bw` as the server | the client: RDMA WRITEs `-n` × `-s` bytes into the server's buffer and sends the report Linux prints |
//! | `read` | `ib_read_bw` as the client | the server: its buffer answers the READs |
//! | `atomic` | `ib_atomic_bw` as the client | the server: its buffer takes the atomics; the words they changed are counted |
//! | `ib_read_lat-client` | `ib_read_lat` as the client | the server ([`perftest::run_lat`]): its buffer answers the READs, checked unchanged after |
//! | `ib_atomic_lat-client` | `ib_atomic_lat` as the client | the server: its buffer takes the fetch-and-adds, which must add up to `-n` |
//! | `ib_read_lat-server`, `ib_atomic_lat-server` | the same as the server | the client: READs (each bringing the first one's bytes) or fetch-and-adds (each returning the one before plus one), one at a time |
//! | `ib_write_lat-client`, `-server` | `ib_write_lat` as the client / server | the other role ([`perftest::Latency::Write`]): a WRITE each way per round, the server first; every WRITE Linux made has its count in its last byte and zeroes before it |
//! | `ib_send_lat-client`, `-server` | `ib_send_lat` as the client / server | the other role ([`perftest::Latency::Send`]): a SEND each way per round, the client first; every SEND Linux made has `-s` bytes, the first one's |
//! | `ib_write_bw-<word>-server`, `-client` (no `-R`), `-q N` (up to 4), `-b` | `ib_write_bw` as the server / client | the other role: the unikernel WRITEs `-n` × `-s` bytes on every QP, and where Linux WRITEs (its client, or `-b`), every QP's target is overwritten and nothing around the targets touched |
//! | `ib_read_bw-<word>-client`, `ib_atomic_bw-<word>-client` (no `-R`), `-q N` (up to 4) | `ib_read_bw` / `ib_atomic_bw` as the client | the server: its buffer answers the READs on every QP (checked unchanged after), or takes the fetch-and-adds, which must add up to `-n` times the QPs |
//! | `ib_read_bw-<word>-server`, `ib_atomic_bw-<word>-server` (no `-R`), `-q N`, `-b` | `ib_read_bw` / `ib_atomic_bw` as the server | the client: READs on every QP (each bringing the first one's bytes) or fetch-and-adds of 1 (each returning the one before plus one); with `-b` also the server's part above, both at once |
//! | `ib_send_bw-<word>-server`, `-client` (no `-R`), `-q N`, `-b` | `ib_send_bw` as the server / client | the other role ([`perftest::run_send`]): the unikernel SENDs `-n` × `-s` bytes on every QP, and where Linux SENDs, every message has its size and the bytes of the first at its place of perftest's cycle |
//! | `…-server,-R`, `…-client,-R` of a latency program | `ib_*_lat -R` | the other role through the CM ([`crate::cm_peer`]); one with options the peer does not take is refused on perftest's control connection ([`crate::cm_peer::refuse_perftest`]) |

use core::cell::Cell;
use core::fmt::Write;

use bareverbs::Context;
use bareverbs::device::rxe::Rxe;
use bareverbs::hal::{Clock, Hal, Link};
use bareverbs::verbs::*;

use crate::peer::{Case, CaseError, Dest, Exchange};
use crate::tcp::perftest::{self, Agreed, Hooks, Key, Local, MAX_QPS, Report, Role};
use crate::tcp::refuse::{LinuxSide, refuse};
use crate::tcp::{self, FlowError, NetConfig, Retry, Stack, Storage};
use crate::{Failure, Step};

/// Bytes of a case list read from a fw_cfg file at most (the lab's whole matrix is some
/// 4,700).
pub const CASES_MAX: usize = 64 * 1024;
/// Milliseconds one case may take at most, its exchange and data phase together.
pub const CASE_MS: u64 = 120_000;
/// How long the unikernel keeps trying to reach a Linux server (it may start later).
pub const CONNECT_RETRY: Retry = Retry {
    tries: 120,
    pause_ms: 500,
};
/// The GID index of the device's IPv4-mapped GID.
const GID_INDEX: u32 = 1;
/// WRITEs kept in flight by the `write` case (perftest's default `-t`).
const TX_DEPTH: u32 = 128;

/// What the kernel command line asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options<'a> {
    /// The interface's address (`bvroce=A.B.C.D/N`).
    pub net: NetConfig,
    /// The Linux side (`bvroce.peer=A.B.C.D`).
    pub peer: [u8; 4],
    /// The cases (`bvroce.cases=…`), as on the command line.
    pub cases: &'a str,
    /// The fw_cfg file that holds the cases instead (`bvroce.cases.fw_cfg=opt/…`): a list in
    /// the same form, of any length (the command line ends at 4 KiB; `docs/testing.md`).
    pub cases_fw_cfg: Option<&'a str>,
    /// A global IPv6 address of the interface (`bvroce.ip6=fd00::2`): its GID is the one the
    /// IPv6 cases connect from.
    pub ip6: Option<[u8; 16]>,
}

impl<'a> Options<'a> {
    /// Reads `bvroce=`, `bvroce.peer=`, `bvroce.cases=`, `bvroce.cases.fw_cfg=` and
    /// `bvroce.ip6=` from `cmdline`; `None` without `bvroce=`, with a word that does not parse,
    /// or with both forms of the cases.
    pub fn parse(cmdline: &'a str, seed: u64) -> Option<Options<'a>> {
        let word = |key: &str| {
            cmdline
                .split_ascii_whitespace()
                .find_map(|w| w.strip_prefix(key))
        };
        let cases_fw_cfg = word("bvroce.cases.fw_cfg=");
        let cases = word("bvroce.cases=");
        if cases.is_some() && cases_fw_cfg.is_some() {
            return None;
        }
        Some(Options {
            net: NetConfig::from_cidr(word("bvroce=")?, seed)
                .filter(|n| (1..=32).contains(&n.prefix))?,
            peer: tcp::stack::parse_ipv4(word("bvroce.peer=")?)?,
            cases: cases.unwrap_or(""),
            cases_fw_cfg,
            ip6: match word("bvroce.ip6=") {
                Some(a) => Some(tcp::parse_ipv6(a)?),
                None => None,
            },
        })
    }
}

/// A perftest bandwidth case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerfKind {
    /// `ib_write_bw`, Linux serving.
    Write,
    /// `ib_read_bw`, Linux the client.
    Read,
    /// `ib_atomic_bw`, Linux the client.
    Atomic,
    /// `ib_read_lat`, Linux the client.
    ReadLat,
    /// `ib_atomic_lat`, Linux the client.
    AtomicLat,
    /// `ib_read_lat`, Linux serving: the unikernel READs, one at a time.
    ReadLatReq,
    /// `ib_atomic_lat`, Linux serving: the unikernel's fetch-and-adds, one at a time.
    AtomicLatReq,
    /// `ib_write_lat`: WRITEs each way, one at a time; `linux_serves`: Linux is perftest's
    /// server (it writes first), the unikernel its client.
    WriteLat {
        /// Linux serves.
        linux_serves: bool,
    },
    /// `ib_send_lat`: SENDs each way, one at a time; `linux_serves`: Linux is perftest's
    /// server, the unikernel its client (which sends first).
    SendLat {
        /// Linux serves.
        linux_serves: bool,
    },
    /// `ib_write_bw` over TCP by its own name (`ib_write_bw-q2-server`), with `-q`: Linux
    /// serving, the unikernel WRITEs `-n` × `-s` bytes on each QP; Linux the client, its
    /// WRITEs land in the unikernel's buffer of each QP.
    WriteBw {
        /// Linux serves.
        linux_serves: bool,
        /// QPs (`-q`).
        qps: u8,
        /// Both sides WRITE at once (`-b`).
        duplex: bool,
    },
    /// `ib_read_bw` over TCP by its own name (`ib_read_bw-q2-client`), with `-q` and `-b`:
    /// Linux the client, its READs of the unikernel's buffer on each QP (the buffer unchanged
    /// after); Linux serving, the unikernel READs `-n` × `-s` bytes of its buffer on each QP,
    /// each READ the first one's bytes (with `-b` both).
    ReadBw {
        /// Linux serves.
        linux_serves: bool,
        /// QPs (`-q`).
        qps: u8,
        /// Both sides READ at once (`-b`).
        duplex: bool,
    },
    /// `ib_atomic_bw` over TCP by its own name (`ib_atomic_bw-q2-client`), with `-q` and `-b`:
    /// Linux the client, its fetch-and-adds on the unikernel's zeroed buffer on each QP, which
    /// must add up to `-n` times the QPs; Linux serving, the unikernel's fetch-and-adds of 1 on
    /// each QP, each returning the one before plus one (with `-b` both).
    AtomicBw {
        /// Linux serves.
        linux_serves: bool,
        /// QPs (`-q`).
        qps: u8,
        /// Both sides operate at once (`-b`).
        duplex: bool,
    },
    /// `ib_send_bw` over TCP (`ib_send_bw-q2-server`), with `-q` and `-b`: Linux serving, the
    /// unikernel SENDs `-n` × `-s` bytes on each QP; Linux the client, the unikernel receives
    /// them (with `-b` both).
    SendBw {
        /// Linux serves.
        linux_serves: bool,
        /// QPs (`-q`).
        qps: u8,
        /// Both sides SEND at once (`-b`).
        duplex: bool,
    },
}

impl PerfKind {
    /// An atomics case (8-byte operations on zeroed words).
    fn atomics(self) -> bool {
        matches!(
            self,
            PerfKind::Atomic
                | PerfKind::AtomicLat
                | PerfKind::AtomicLatReq
                | PerfKind::AtomicBw { .. }
        )
    }

    /// A latency program's case (perftest's latency exchange, [`perftest::run_lat`]).
    fn latency(self) -> Option<perftest::Latency> {
        match self {
            PerfKind::ReadLat
            | PerfKind::AtomicLat
            | PerfKind::ReadLatReq
            | PerfKind::AtomicLatReq => Some(perftest::Latency::ReadAtomic),
            PerfKind::WriteLat { .. } => Some(perftest::Latency::Write),
            PerfKind::SendLat { .. } => Some(perftest::Latency::Send),
            PerfKind::Write
            | PerfKind::Read
            | PerfKind::Atomic
            | PerfKind::ReadBw { .. }
            | PerfKind::AtomicBw { .. }
            | PerfKind::WriteBw { .. }
            | PerfKind::SendBw { .. } => None,
        }
    }

    /// QPs (`-q`).
    fn qps(self) -> usize {
        match self {
            PerfKind::WriteBw { qps, .. }
            | PerfKind::SendBw { qps, .. }
            | PerfKind::ReadBw { qps, .. }
            | PerfKind::AtomicBw { qps, .. } => usize::from(qps),
            _ => 1,
        }
    }

    /// The unikernel WRITEs: as perftest's client (Linux serves `ib_write_bw`), or both sides
    /// with `-b`.
    fn writes(self) -> bool {
        match self {
            PerfKind::Write => true,
            PerfKind::WriteBw {
                linux_serves,
                duplex,
                ..
            } => linux_serves || duplex,
            _ => false,
        }
    }

    /// `ib_send_bw`: whether the unikernel SENDs, and whether it receives.
    fn send_bw(self) -> Option<(bool, bool)> {
        match self {
            PerfKind::SendBw {
                linux_serves,
                duplex,
                ..
            } => Some((linux_serves || duplex, !linux_serves || duplex)),
            _ => None,
        }
    }

    /// Linux WRITEs into the unikernel's buffer (`ib_write_bw` as perftest's client, or
    /// either side with `-b`).
    fn written(self) -> bool {
        match self {
            PerfKind::WriteBw {
                linux_serves,
                duplex,
                ..
            } => !linux_serves || duplex,
            _ => false,
        }
    }

    /// `ib_read_bw`: whether the unikernel READs, and whether Linux READs its buffer.
    fn read_bw(self) -> Option<(bool, bool)> {
        match self {
            PerfKind::ReadBw {
                linux_serves,
                duplex,
                ..
            } => Some((linux_serves || duplex, !linux_serves || duplex)),
            _ => None,
        }
    }

    /// `ib_atomic_bw`: whether the unikernel operates on Linux's buffer, and whether Linux
    /// operates on its own.
    fn atomic_bw(self) -> Option<(bool, bool)> {
        match self {
            PerfKind::AtomicBw {
                linux_serves,
                duplex,
                ..
            } => Some((linux_serves || duplex, !linux_serves || duplex)),
            _ => None,
        }
    }

    /// Whether the unikernel plays perftest's client (Linux serves).
    fn uni_client(self) -> bool {
        match self {
            PerfKind::Write | PerfKind::ReadLatReq | PerfKind::AtomicLatReq => true,
            PerfKind::WriteLat { linux_serves }
            | PerfKind::SendLat { linux_serves }
            | PerfKind::WriteBw { linux_serves, .. }
            | PerfKind::SendBw { linux_serves, .. } => linux_serves,
            PerfKind::Read | PerfKind::Atomic | PerfKind::ReadLat | PerfKind::AtomicLat => false,
            PerfKind::ReadBw { linux_serves, .. } | PerfKind::AtomicBw { linux_serves, .. } => {
                linux_serves
            }
        }
    }
}

/// One case of the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerCase {
    /// A pingpong program.
    Ping(Case),
    /// A perftest program: which, bytes per operation (`-s`), operations (`-n`).
    Perf(PerfKind, u32, u32),
    /// An rdma_cm program, connected through the CM ([`crate::cm_peer`]).
    Cm(crate::cm_peer::CmCase),
}

impl PeerCase {
    /// Largest `-s` of a perftest case (the buffer is twice that).
    pub const MAX_PERF_SIZE: u32 = 1 << 20;
    /// The rdma_cm programs' name prefixes ([`crate::cm_peer`]).
    pub const CM_PROGRAMS: [&'static str; 12] = [
        "rping-",
        "rping6-",
        "ucmatose-",
        "ucmatose6-",
        "udaddy-",
        "udaddy6-",
        "cmtime-",
        "cmtime6-",
        "ib_send_bw-",
        "ib_write_bw-",
        "ib_read_bw-",
        "ib_atomic_bw-",
    ];

    /// perftest's latency programs, which go through the CM with `-R`.
    const LAT_PROGRAMS: [&'static str; 4] = [
        "ib_read_lat-",
        "ib_atomic_lat-",
        "ib_write_lat-",
        "ib_send_lat-",
    ];

    /// `ib_write_lat` / `ib_send_lat` by its case name: the program, a word or none, the
    /// Linux program's role.
    /// A perftest program's case in `role`, with a word or none between the program and the
    /// role (`ib_read_bw-q2-client`, `ib_read_bw-client`).
    fn tagged(name: &str, role: &str) -> bool {
        let Some((_, rest)) = name.split_once('-') else {
            return false;
        };
        match rest.strip_suffix(role) {
            Some("") => true,
            Some(w) => w
                .strip_suffix('-')
                .is_some_and(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric())),
            None => false,
        }
    }

    fn ping_pong_kind(name: &str) -> Option<PerfKind> {
        let (program, rest) = name.split_once('-')?;
        let role = rest.rsplit('-').next()?;
        let linux_serves = match role {
            "server" => true,
            "client" => false,
            _ => return None,
        };
        let word = rest.strip_suffix(role)?;
        let ok = match word.strip_suffix('-') {
            None => word.is_empty(),
            Some(w) => !w.is_empty() && !w.contains('-'),
        };
        if !ok {
            return None;
        }
        match program {
            "ib_write_lat" => Some(PerfKind::WriteLat { linux_serves }),
            "ib_send_lat" => Some(PerfKind::SendLat { linux_serves }),
            _ => None,
        }
    }

    /// Parses one case, `,` standing for spaces: `rc-server,-s,4096` or `write,-s,65536,-n,1000`
    /// (perftest's defaults: 65536 bytes, 8 for atomics; 5000 iterations).
    pub fn parse(spec: &str) -> Option<PeerCase> {
        let mut words = spec.split(',').filter(|w| !w.is_empty());
        let rdma_cm = spec.split(',').any(|o| o == "-R" || o == "--rdma_cm");
        let kind = match words.next()? {
            // A latency program with -R: the CM's.
            w if rdma_cm && Self::LAT_PROGRAMS.iter().any(|p| w.starts_with(p)) => {
                return crate::cm_peer::CmCase::parse(spec).map(PeerCase::Cm);
            }
            "write" => PerfKind::Write,
            "read" => PerfKind::Read,
            "atomic" => PerfKind::Atomic,
            "ib_read_lat-client" => PerfKind::ReadLat,
            "ib_atomic_lat-client" => PerfKind::AtomicLat,
            "ib_read_lat-server" => PerfKind::ReadLatReq,
            "ib_atomic_lat-server" => PerfKind::AtomicLatReq,
            // (A word between the program and the role only tells cases apart:
            // ib_write_lat-1m-server.)
            w if Self::ping_pong_kind(w).is_some() => Self::ping_pong_kind(w)?,
            // ib_read_bw and ib_atomic_bw over TCP by their own names, both roles.
            w if (w.starts_with("ib_read_bw-") || w.starts_with("ib_atomic_bw-")) && !rdma_cm => {
                let linux_serves = match w.rsplit('-').next() {
                    Some("server") => true,
                    Some("client") => false,
                    _ => return None,
                };
                if !Self::tagged(w, if linux_serves { "server" } else { "client" }) {
                    return None;
                }
                if w.starts_with("ib_atomic_bw-") {
                    PerfKind::AtomicBw {
                        linux_serves,
                        qps: 1,
                        duplex: false,
                    }
                } else {
                    PerfKind::ReadBw {
                        linux_serves,
                        qps: 1,
                        duplex: false,
                    }
                }
            }
            // ib_write_bw and ib_send_bw over TCP (with -R: the CM's).
            w if (w.starts_with("ib_write_bw-") || w.starts_with("ib_send_bw-"))
                && !spec.split(',').any(|o| o == "-R" || o == "--rdma_cm") =>
            {
                let linux_serves = match w.rsplit('-').next() {
                    Some("server") => true,
                    Some("client") => false,
                    _ => return None,
                };
                if w.starts_with("ib_send_bw-") {
                    PerfKind::SendBw {
                        linux_serves,
                        qps: 1,
                        duplex: false,
                    }
                } else {
                    PerfKind::WriteBw {
                        linux_serves,
                        qps: 1,
                        duplex: false,
                    }
                }
            }
            w if Self::CM_PROGRAMS.iter().any(|p| w.starts_with(p)) => {
                return crate::cm_peer::CmCase::parse(spec).map(PeerCase::Cm);
            }
            _ => {
                let mut buf = [0u8; 128];
                let text = buf.get_mut(..spec.len())?;
                for (t, &c) in text.iter_mut().zip(spec.as_bytes()) {
                    *t = if c == b',' { b' ' } else { c };
                }
                return Case::parse(core::str::from_utf8(text).ok()?).map(PeerCase::Ping);
            }
        };
        // (perftest's latency programs: 2 bytes, 1000 iterations.)
        let (mut size, mut iters) = match kind {
            PerfKind::Atomic | PerfKind::AtomicBw { .. } => (8, 5000),
            PerfKind::AtomicLat | PerfKind::AtomicLatReq => (8, 1000),
            PerfKind::ReadLat
            | PerfKind::ReadLatReq
            | PerfKind::WriteLat { .. }
            | PerfKind::SendLat { .. } => (2, 1000),
            _ => (65536, 5000),
        };
        let mut kind = kind;
        while let Some(w) = words.next() {
            if let (
                "-b" | "--bidirectional",
                PerfKind::WriteBw { duplex, .. }
                | PerfKind::SendBw { duplex, .. }
                | PerfKind::ReadBw { duplex, .. }
                | PerfKind::AtomicBw { duplex, .. },
            ) = (w, &mut kind)
            {
                *duplex = true;
                continue;
            }
            let v: u32 = words.next()?.parse().ok()?;
            match (w, &mut kind) {
                ("-s" | "--size", _) => size = v,
                ("-n" | "--iters", _) => iters = v,
                (
                    "-q" | "--qp",
                    PerfKind::WriteBw { qps, .. }
                    | PerfKind::SendBw { qps, .. }
                    | PerfKind::ReadBw { qps, .. }
                    | PerfKind::AtomicBw { qps, .. },
                ) => {
                    *qps = u8::try_from(v)
                        .ok()
                        .filter(|&q| (1..=MAX_QPS as u8).contains(&q))?
                }
                _ => return None,
            }
        }
        // (ib_send_bw's work request IDs hold a QP's count in 24 bits.)
        let ok = (1..=Self::MAX_PERF_SIZE).contains(&size)
            && iters >= 1
            && (kind.send_bw().is_none() || iters < 1 << 24)
            && (!kind.atomics() || size == 8);
        ok.then_some(PeerCase::Perf(kind, size, iters))
    }

    /// The case's name.
    pub fn name(&self) -> &'static str {
        match self {
            PeerCase::Ping(c) => c.name(),
            PeerCase::Perf(PerfKind::Write, ..) => "write",
            PeerCase::Perf(PerfKind::Read, ..) => "read",
            PeerCase::Perf(PerfKind::Atomic, ..) => "atomic",
            PeerCase::Perf(PerfKind::ReadBw { linux_serves, .. }, ..) => {
                if *linux_serves {
                    "ib_read_bw-server"
                } else {
                    "ib_read_bw-client"
                }
            }
            PeerCase::Perf(PerfKind::AtomicBw { linux_serves, .. }, ..) => {
                if *linux_serves {
                    "ib_atomic_bw-server"
                } else {
                    "ib_atomic_bw-client"
                }
            }
            PeerCase::Perf(PerfKind::ReadLat, ..) => "ib_read_lat-client",
            PeerCase::Perf(PerfKind::AtomicLat, ..) => "ib_atomic_lat-client",
            PeerCase::Perf(PerfKind::ReadLatReq, ..) => "ib_read_lat-server",
            PeerCase::Perf(PerfKind::AtomicLatReq, ..) => "ib_atomic_lat-server",
            PeerCase::Perf(PerfKind::WriteLat { linux_serves }, ..) => {
                if *linux_serves {
                    "ib_write_lat-server"
                } else {
                    "ib_write_lat-client"
                }
            }
            PeerCase::Perf(PerfKind::SendLat { linux_serves }, ..) => {
                if *linux_serves {
                    "ib_send_lat-server"
                } else {
                    "ib_send_lat-client"
                }
            }
            PeerCase::Perf(PerfKind::WriteBw { linux_serves, .. }, ..) => {
                if *linux_serves {
                    "ib_write_bw-server"
                } else {
                    "ib_write_bw-client"
                }
            }
            PeerCase::Perf(PerfKind::SendBw { linux_serves, .. }, ..) => {
                if *linux_serves {
                    "ib_send_bw-server"
                } else {
                    "ib_send_bw-client"
                }
            }
            PeerCase::Cm(c) => c.name(),
        }
    }
}

/// How a session went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Cases run.
    pub cases: u32,
    /// Cases that failed (the refused ones too).
    pub failed: u32,
    /// Cases refused: the peer does not run their program or options.
    pub refused: u32,
}

/// Milliseconds the peer waits for the Linux side of a case it refuses (to accept or make the
/// one connection it resets).
pub const REFUSE_MS: u64 = 60_000;
/// Milliseconds without a new connection after which a refused case's Linux client is taken
/// to have given up (the lab runs a client again 0.5 s after a failed connect).
pub const REFUSE_QUIET_MS: u64 = 5_000;

/// A case the peer does not run, as it reports it: `roce-uk <name>: REFUSED <why>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused<'a> {
    /// The case's name (its first word).
    pub name: &'a str,
    /// Why, in words.
    pub why: &'static str,
    /// How the Linux program meets the peer over TCP, when it does ([`refuse`] ends its
    /// attempt); `None` for the rdma_cm programs (their connection goes through the CM) and
    /// for a name whose role is unknown.
    pub side: Option<LinuxSide>,
    /// How a perftest `-R` program meets the peer through the CM, when it does
    /// ([`crate::cm_peer::refuse_perftest`] tells it on its control connection); `None` for
    /// the other rdma_cm programs (they run out their own time) and for any case over TCP.
    pub cm_side: Option<LinuxSide>,
}

impl<'a> Refused<'a> {
    /// What the peer says of `spec`, a case [`PeerCase::parse`] does not take.
    pub fn of(spec: &'a str) -> Refused<'a> {
        let name = spec.split(',').next().unwrap_or(spec);
        let cm = PeerCase::CM_PROGRAMS
            .iter()
            .any(|p| !p.starts_with("ib_") && name.starts_with(p))
            || spec.split(',').any(|w| w == "-R" || w == "--rdma_cm");
        // A latency program's name: the program, a word or none, the role.
        let lat = PeerCase::LAT_PROGRAMS.iter().any(|p| {
            name.strip_prefix(p).is_some_and(|r| {
                let word = r
                    .strip_suffix("client")
                    .or_else(|| r.strip_suffix("server"));
                word.is_some_and(|w| {
                    w.is_empty()
                        || w.strip_suffix('-')
                            .is_some_and(|w| !w.is_empty() && !w.contains('-'))
                })
            })
        });
        let known = matches!(name, "write" | "read" | "atomic")
            || ["rc", "ud", "rc6", "ud6"].iter().any(|t| {
                name.strip_prefix(t)
                    .is_some_and(|r| r == "-server" || r == "-client")
            })
            || lat
            || (!cm && (name.starts_with("ib_write_bw-") || name.starts_with("ib_send_bw-")))
            || (!cm && (name.starts_with("ib_read_bw-") || name.starts_with("ib_atomic_bw-")))
            || (cm && PeerCase::CM_PROGRAMS.iter().any(|p| name.starts_with(p)));
        let why = if known {
            "options the peer does not take"
        } else {
            "a program the peer does not speak"
        };
        let role = if name == "write" || name.ends_with("-server") {
            Some(LinuxSide::Listens)
        } else if matches!(name, "read" | "atomic") || name.ends_with("-client") {
            Some(LinuxSide::Connects)
        } else {
            None
        };
        let (side, cm_side) = if !cm {
            (role, None)
        } else if name.starts_with("ib_") {
            (None, role)
        } else {
            (None, None)
        };
        Refused {
            name,
            why,
            side,
            cm_side,
        }
    }
}

/// Why a session could not run its cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionError {
    /// A verbs call of the session's own objects failed.
    Verbs(Failure),
    /// The TCP stack refused the configuration.
    Net(tcp::Error),
    /// The device refused the IPv6 address (`bvroce.ip6=`).
    Ipv6(bareverbs::device::rxe::port::AddrRefused),
}

impl core::fmt::Display for SessionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SessionError::Verbs(v) => write!(f, "{v}"),
            SessionError::Net(e) => write!(f, "TCP stack: {e}"),
            SessionError::Ipv6(e) => write!(f, "the IPv6 address refused: {e:?}"),
        }
    }
}

impl From<Failure> for SessionError {
    fn from(f: Failure) -> Self {
        SessionError::Verbs(f)
    }
}

pub use bareverbs_platform::machine::IDLE_MS;

/// How a waiting unikernel idles.
#[derive(Clone, Copy)]
pub struct Idle<'a> {
    /// Halts the CPU until the next interrupt (the timer's tick at the latest).
    pub halt: &'a dyn Fn(),
    /// Whether the NIC interrupts on a received frame and on a completed transmission: a wait
    /// then halts as soon as a round took no frame in; else only after [`IDLE_MS`] without one.
    pub nic_interrupts: bool,
}

/// Runs the cases of `opts` on `dev` against the Linux side; `clock_ms` is the time in
/// milliseconds. Each case's result is printed on `out`.
///
/// Every wait of a case reads the clock once a round, after the round polled the device, so
/// the clock is the idle hook: when no frame came in since the previous read (with the NIC's
/// interrupts; else for [`IDLE_MS`]), a read of the clock first halts the CPU until the next
/// interrupt, instead of spinning. An idle unikernel (between cases, waiting for Linux) leaves
/// the CPU to the other guests.
pub fn serve<H: Hal, L: Link, C: Clock>(
    dev: Rxe<H, L, C>,
    out: &mut dyn Write,
    opts: &Options<'_>,
    clock_ms: &dyn Fn() -> u64,
    idle: Idle<'_>,
) -> Result<Outcome, SessionError> {
    let ip6 = match opts.ip6 {
        Some(a) => Some(dev.add_ipv6(a).map_err(SessionError::Ipv6)?),
        None => None,
    };
    let ctx = Context::new(dev);
    // Frames the device has taken from the NIC so far (RoCE, the IP stack's, ARP, dropped).
    let frames_in = || {
        let c = ctx.provider().port_counts();
        c.roce + c.stack + c.dropped + c.arp_answered
    };
    // (frames in, when that count last changed)
    let seen = Cell::new((frames_in(), clock_ms()));
    // Halts (and clock reads: the rounds of the waits) so far.
    let halts = Cell::new((0u64, 0u64));
    let idle_clock = || {
        let now = clock_ms();
        let frames = frames_in();
        let (before, since) = seen.get();
        let (h, rounds) = halts.get();
        halts.set((h, rounds + 1));
        if frames != before {
            seen.set((frames, now));
        } else if idle.nic_interrupts || now.saturating_sub(since) >= IDLE_MS {
            (idle.halt)();
            halts.set((h + 1, rounds + 1));
            return clock_ms();
        }
        now
    };
    let clock_ms: &dyn Fn() -> u64 = &idle_clock;
    let gid = ctx.query_gid(1, GID_INDEX).at("roce peer: query GID")?;
    let gids = crate::gids::Gids {
        v4: (gid, GID_INDEX),
        v6: match ip6 {
            Some(i) => Some((ctx.query_gid(1, i).at("roce peer: query GID")?, i)),
            None => None,
        },
    };
    let pd = ctx.alloc_pd().at("roce peer: alloc PD")?;
    let mut storage = Storage::new();
    let mut stack = Stack::new(ctx.provider().stack(), &mut storage, opts.net, clock_ms())
        .map_err(SessionError::Net)?;
    let [a, b, c, d] = opts.net.ip;
    let _ = write!(
        out,
        "roce peer: {a}.{b}.{c}.{d}/{} GID[{GID_INDEX}] {}",
        opts.net.prefix,
        crate::DisplayGid(gid),
    );
    if let Some((g6, i)) = gids.v6 {
        let _ = write!(out, " GID[{i}] {}", crate::DisplayGid(g6));
    }
    let [a, b, c, d] = opts.peer;
    let _ = writeln!(out, ", Linux at {a}.{b}.{c}.{d}");
    let mut outcome = Outcome::default();
    for spec in opts.cases.split('+').filter(|s| !s.is_empty()) {
        outcome.cases += 1;
        let t0 = clock_ms();
        let deadline = t0 + CASE_MS;
        // mckey: multicast, no CM connection (cm_peer/mckey.rs).
        if let Some(c) = crate::cm_peer::mckey::McCase::parse(spec) {
            let name = spec.split(',').next().unwrap_or(spec);
            let passed = crate::cm_peer::mckey::run_case(
                &ctx, &pd, opts.peer, name, &c, deadline, clock_ms, out,
            );
            outcome.failed += u32::from(!passed);
            continue;
        }
        // qperf: its TCP control connection, its QP through the CM (qperf_peer.rs).
        if let Some(c) = crate::qperf_peer::QperfCase::parse(spec) {
            let name = spec.split(',').next().unwrap_or(spec);
            let passed = crate::qperf_peer::run_case(
                &ctx, &pd, &mut stack, opts.peer, name, &c, deadline, clock_ms, out,
            );
            if !passed {
                stack.abort();
                stack.poll(clock_ms());
            }
            outcome.failed += u32::from(!passed);
            continue;
        }
        let Some(case) = PeerCase::parse(spec) else {
            outcome.failed += 1;
            outcome.refused += 1;
            let r = Refused::of(spec);
            let told = match r.side {
                Some(side) => {
                    let clock = clock_ms;
                    match refuse(
                        &mut stack,
                        side,
                        opts.peer,
                        CONNECT_RETRY,
                        REFUSE_QUIET_MS,
                        t0 + REFUSE_MS,
                        &mut || clock(),
                    ) {
                        Ok(1) if side == LinuxSide::Connects => "its connection accepted and reset",
                        Ok(_) if side == LinuxSide::Connects => {
                            "its connections (it ran again) accepted and reset"
                        }
                        Ok(_) => "connected to and the connection reset",
                        Err(_) => "it did not show up",
                    }
                }
                None if r.cm_side.is_some() => {
                    let linux_serves = r.cm_side == Some(LinuxSide::Listens);
                    match crate::cm_peer::refuse_perftest(
                        &ctx,
                        &pd,
                        opts.peer,
                        linux_serves,
                        t0 + REFUSE_MS,
                        clock_ms,
                    ) {
                        Ok(()) => {
                            "told on its control connection (rdma_cm): a version it does not take"
                        }
                        Err(_) => "not told: its control connection (rdma_cm) did not come up",
                    }
                }
                None => "not told (rdma_cm: it runs out its own time)",
            };
            let _ = writeln!(
                out,
                "roce-uk {}: REFUSED {}; Linux's program: {told}",
                r.name, r.why
            );
            continue;
        };
        if let PeerCase::Cm(c) = case {
            let name = spec.split(',').next().unwrap_or(spec);
            let t0 = ctx.provider().transport_counts();
            let passed =
                crate::cm_peer::run_case(&ctx, &pd, opts.peer, name, &c, deadline, clock_ms, out);
            outcome.failed += u32::from(!passed);
            // What the transport did meanwhile: requests the peer asked again (its
            // retransmissions), the READ answers the pace held back, and the READs and
            // atomics beyond the depth the peer was given, sent back with a sequence NAK.
            let t1 = ctx.provider().transport_counts();
            let _ = writeln!(
                out,
                "roce-uk-transport {name}: duplicate requests {}, out of sequence {}, READs paced {}, \
                 READs/atomics beyond the depth {}, sequence NAKs {}",
                t1.duplicates - t0.duplicates,
                t1.out_of_sequence - t0.out_of_sequence,
                t1.reads_paced - t0.reads_paced,
                t1.rd_atomic_deferred - t0.rd_atomic_deferred,
                t1.seq_naks_sent - t0.seq_naks_sent
            );
            continue;
        }
        let counts0 = ctx.provider().port_counts();
        let halts0 = halts.get();
        let r = match case {
            PeerCase::Ping(p) => {
                let mut x = TcpExchange {
                    stack: &mut stack,
                    peer: opts.peer,
                    deadline,
                    clock_ms,
                    out: &mut *out,
                };
                let r = crate::peer::run_case(&ctx, &pd, &gids, &p, &mut x);
                r.map(|bytes| Detail::Ping(p.iters, p.size, bytes))
            }
            PeerCase::Cm(_) => continue,
            PeerCase::Perf(kind, size, iters) => {
                // perftest's exchange sends the unikernel's GID before it has Linux's: the
                // case's name says the family (`ib_send_bw-v6-server`).
                let name = spec.split(',').next().unwrap_or(spec);
                let Some(me) = gids.pick(name.contains("-v6-"), None) else {
                    outcome.failed += 1;
                    let _ = writeln!(out, "roce-uk {name}: FAIL {}", CaseError::GidFamily);
                    continue;
                };
                window(kind, false);
                let r = perf(
                    &ctx,
                    &pd,
                    me,
                    &mut stack,
                    opts.peer,
                    (kind, size, iters),
                    deadline,
                    clock_ms,
                );
                window(kind, true);
                r
            }
        };
        if r.is_err() {
            // Whatever the case left of its connection goes.
            stack.abort();
            stack.poll(clock_ms());
        }
        let ms = clock_ms() - t0;
        let n = ctx.provider().port_counts();
        let roce = n.roce - counts0.roce;
        match r {
            Ok(detail) => {
                let _ = writeln!(
                    out,
                    "roce-uk {}: ok {detail}; {roce} RoCE frames in, {ms} ms, {} of {} rounds halted",
                    spec.split(',').next().unwrap_or(spec),
                    halts.get().0 - halts0.0,
                    halts.get().1 - halts0.1
                );
            }
            Err(e) => {
                outcome.failed += 1;
                let name = spec.split(',').next().unwrap_or(spec);
                let _ = writeln!(out, "roce-uk {name}: FAIL {e} (after {ms} ms)");
            }
        }
    }
    drop(stack);
    pd.destroy().at("roce peer: destroy PD")?;
    Ok(outcome)
}

pub use bareverbs_platform::mark;

/// Opens (`end` false) or closes a perftest case's counting window: code `0x00KK` and
/// `0x01KK`, KK 1 for `write`, 2 for `read`, 3 for `atomic` (as `qemu/roce/linux.sh` marks
/// Linux B's).
fn window(kind: PerfKind, end: bool) {
    match (kind, end) {
        (PerfKind::Write, false) => mark::<0x0001>(),
        (PerfKind::Read, false) => mark::<0x0002>(),
        (PerfKind::Atomic, false) => mark::<0x0003>(),
        (PerfKind::Write, true) => mark::<0x0101>(),
        (PerfKind::Read, true) => mark::<0x0102>(),
        (PerfKind::Atomic, true) => mark::<0x0103>(),
        // (Not counted.)
        (_, _) => {}
    }
}

/// What a case that passed did.
enum Detail {
    /// Messages each way, bytes each, bytes moved in all.
    Ping(u32, u32, u64),
    /// `write`: operations, bytes each, the bandwidth reported to Linux (MiB/s).
    Wrote(u64, u32, f64),
    /// `read`: the READs the Linux client reported, bytes each.
    Read(u64, u32),
    /// `atomic`: the 8-byte words changed and the sum of what was added to them.
    Atomics(u32, u64),
    /// `ib_read_lat`: the READs the Linux client was told to make (`-n`), bytes each.
    ReadLat(u32, u32),
    /// `ib_read_bw` with `-q`: the READs the client reported, bytes each, QPs.
    ReadQps(u64, u32, u8),
    /// `ib_read_lat` / `ib_atomic_lat` with Linux serving: the operations, bytes each, the
    /// median round trip (microseconds, the clock's resolution), what was checked.
    Requested(u32, u32, u64, &'static str),
    /// `ib_write_lat` / `ib_send_lat`: rounds, bytes each way, the average round
    /// (microseconds), what was checked.
    Rounds(u32, u32, u64, &'static str),
    /// `ib_write_bw` with Linux serving, `-q`: WRITEs completed on all QPs, bytes each, the
    /// bandwidth reported (MiB/s), QPs.
    WroteQps(u64, u32, f64, u8),
    /// `ib_write_bw` with Linux the client, `-q`: QPs, bytes of each WRITE, the WRITEs Linux
    /// reported (perftest's iterations times its QPs).
    Written(u8, u32, u64),
    /// `ib_write_bw -b`: as [`Detail::WroteQps`] and [`Detail::Written`] at once.
    Both(u64, u32, f64, u8, u64),
    /// `ib_send_bw`: SENDs completed, Linux's received, bytes each, QPs.
    Sends(u64, u64, u32, u8),
    /// `ib_atomic_bw` with Linux serving: fetch-and-adds completed, QPs, the bandwidth
    /// reported.
    AtomicsDone(u64, u8, f64),
    /// `ib_atomic_bw -b`: as [`Detail::AtomicsDone`] and [`Detail::Atomics`] at once.
    AtomicsBoth(u64, u8, f64, u32, u64),
    /// `ib_read_bw` with Linux serving (or `-b`): READs completed, bytes each, the
    /// bandwidth reported, QPs, and with `-b` the READs Linux reported.
    ReadsDone(u64, u32, f64, u8, Option<u64>),
}

impl core::fmt::Display for Detail {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Detail::Ping(n, s, b) => write!(
                f,
                "{n} messages of {s} bytes each way, every one checked ({b} bytes)"
            ),
            Detail::Wrote(n, s, bw) => write!(
                f,
                "{n} RDMA WRITEs of {s} bytes completed, {bw:.2} MiB/s reported"
            ),
            Detail::Read(n, s) => write!(f, "answered the client's {n} RDMA READs of {s} bytes"),
            Detail::ReadQps(n, s, q) => write!(
                f,
                "answered the client's {n} RDMA READs of {s} bytes on {q} QPs, the buffer unchanged"
            ),
            Detail::ReadLat(n, s) => write!(
                f,
                "served the client's {n} RDMA READs of {s} bytes, the buffer unchanged"
            ),
            Detail::Requested(n, s, us, what) => write!(
                f,
                "{n} of {s} bytes, one at a time, {us} us each on average (the clock ticks every 16 ms), {what}"
            ),
            Detail::Rounds(n, s, us, what) => write!(
                f,
                "{n} rounds of {s} bytes, one at a time, {us} us a round on average (the clock ticks every 16 ms), {what}"
            ),
            Detail::AtomicsDone(n, q, bw) => write!(
                f,
                "{n} fetch-and-adds of 1 completed on {q} QP(s), each returning the one before plus one, {bw:.2} MiB/s reported"
            ),
            Detail::AtomicsBoth(n, q, bw, words, sum) => write!(
                f,
                "both ways at once on {q} QP(s): {n} fetch-and-adds of 1 completed, each returning the one before plus one, {bw:.2} MiB/s reported; Linux's changed {words} words of the buffer, adding {sum} in all"
            ),
            Detail::ReadsDone(n, s, bw, q, served) => {
                write!(
                    f,
                    "{n} RDMA READs of {s} bytes completed on {q} QP(s), each the first one's bytes, {bw:.2} MiB/s reported"
                )?;
                match served {
                    Some(m) => write!(
                        f,
                        "; answered Linux's {m} READs, the buffer unchanged (READs of Linux's buffer may bring these bytes back)"
                    ),
                    None => Ok(()),
                }
            }
            Detail::WroteQps(n, s, bw, q) => write!(
                f,
                "{n} RDMA WRITEs of {s} bytes completed on {q} QP(s), {bw:.2} MiB/s reported"
            ),
            Detail::Written(q, s, n) => write!(
                f,
                "the client's RDMA WRITEs of {s} bytes ({n} in all, as it reported) on {q} QP(s): every QP's target overwritten and nothing around the targets touched"
            ),
            Detail::Both(n, s, bw, q, theirs) => write!(
                f,
                "both ways at once on {q} QP(s): {n} RDMA WRITEs of {s} bytes completed, {bw:.2} MiB/s reported; Linux's ({theirs} in all, as it reported) overwrote every QP's target and nothing around the targets"
            ),
            Detail::Sends(sent, 0, s, q) => {
                write!(f, "{sent} SENDs of {s} bytes completed on {q} QP(s)")
            }
            Detail::Sends(0, got, s, q) => write!(
                f,
                "{got} of Linux's SENDs of {s} bytes received on {q} QP(s), every one of that size and the bytes of the first at its place of Linux's cycle"
            ),
            Detail::Sends(sent, got, s, q) => write!(
                f,
                "{sent} SENDs of {s} bytes completed and {got} of Linux's received on {q} QP(s), every one of that size and the bytes of the first at its place of Linux's cycle"
            ),
            Detail::Atomics(words, sum) => write!(
                f,
                "atomics changed {words} words of the buffer, adding {sum} in all"
            ),
        }
    }
}

/// The pingpong exchange over TCP.
struct TcpExchange<'s, 'a, L: Link> {
    stack: &'s mut Stack<'a, L>,
    peer: [u8; 4],
    deadline: u64,
    clock_ms: &'s dyn Fn() -> u64,
    out: &'s mut dyn Write,
}

impl<L: Link> Exchange for TcpExchange<'_, '_, L> {
    fn to_server(&mut self, me: &Dest) -> Result<Dest, CaseError> {
        let clock = self.clock_ms;
        Ok(tcp::pingpong::connect(
            self.stack,
            self.peer,
            tcp::PORT,
            CONNECT_RETRY,
            me,
            self.deadline,
            &mut || clock(),
        )?)
    }

    fn client_data(&mut self) -> Result<Dest, CaseError> {
        let clock = self.clock_ms;
        Ok(tcp::pingpong::accept_peer(
            self.stack,
            tcp::PORT,
            self.deadline,
            &mut || clock(),
        )?)
    }

    fn answer(&mut self, me: &Dest) -> Result<(), CaseError> {
        let clock = self.clock_ms;
        Ok(tcp::pingpong::reply(
            self.stack,
            me,
            self.deadline,
            &mut || clock(),
        )?)
    }

    fn interrupt(&mut self) -> Option<CaseError> {
        ((self.clock_ms)() > self.deadline).then_some(CaseError::Deadline)
    }

    fn log(&mut self) -> &mut dyn Write {
        self.out
    }
}

/// A perftest case's QP, through its states (the hooks move it).
enum Qp<'a, P: Provider> {
    Init(QueuePair<'a, P, Rc, Init>),
    Rtr(QueuePair<'a, P, Rc, Rtr>),
    Rts(QueuePair<'a, P, Rc, Rts>),
    Gone,
}

impl<P: Provider> Qp<'_, P> {
    /// Its number (0 once gone).
    fn qp_num(&self) -> u32 {
        match self {
            Qp::Init(q) => q.qp_num(),
            Qp::Rtr(q) => q.qp_num(),
            Qp::Rts(q) => q.qp_num(),
            Qp::Gone => 0,
        }
    }

    fn destroy(self) -> Result<(), Failure> {
        match self {
            Qp::Init(q) => q.destroy().at("perftest: destroy QP"),
            Qp::Rtr(q) => q.destroy().at("perftest: destroy QP"),
            Qp::Rts(q) => q.destroy().at("perftest: destroy QP"),
            Qp::Gone => Ok(()),
        }
    }
}

/// The RoCE side of a perftest exchange.
struct Perf<'a, 'm, 'r, P: Provider> {
    kind: PerfKind,
    /// The GID index the QPs connect from.
    gid_index: u8,
    size: u32,
    iters: u32,
    qp: Qp<'a, P>,
    /// With `-q N`: QPs 1 to N - 1.
    more: [Qp<'a, P>; MAX_QPS - 1],
    cq: &'a CompletionQueue<'a, P>,
    mr: &'m mut MemoryRegion<'r, P>,
    /// What the exchange settled on (once connected).
    agreed: Option<Agreed>,
    /// Where the second half of the buffer starts: what the peer WRITEs into (`ib_write_lat`)
    /// or SENDs land in (`ib_send_lat`); the first half is what this side sends from.
    half: u32,
    psn: u32,
    out_reads: u8,
    deadline: u64,
    clock_ms: &'m dyn Fn() -> u64,
    /// `write`: the WRITEs completed and the bandwidth reported.
    wrote: (u64, f64),
    /// A latency program's client: the average round trip (microseconds).
    requested: u64,
    /// `ib_send_lat`: receives posted so far.
    recvs_posted: u32,
    /// `ib_send_bw`: each QP's receives posted and taken, and the digests of the first
    /// message at each place of Linux's cycle.
    rx: [SendRx; MAX_QPS],
    /// `ib_send_bw`: receive slots per QP, and their stride.
    slots: (u32, u32),
    /// `ib_read_bw`: where this side's READ slots start in the buffer.
    read_at: u32,
    /// `ib_send_bw`: SENDs completed, messages received.
    sent: (u64, u64),
}

/// `ib_read_bw`'s READ slots per QP at most, and what a slot holds before its READ lands.
const READ_SLOTS: u32 = 16;
const READ_SENTINEL: u8 = 0xEE;

/// Places of the sender's cycle whose first message is kept (as a digest).
const MAX_PLACES: usize = 64;
/// `ib_send_bw`: receive slots per QP at most, and their bytes per QP at most.
const SEND_SLOTS: u32 = 16;
const SEND_SLOT_BYTES: u32 = 1 << 20;

/// One QP's receives of `ib_send_bw`.
#[derive(Clone, Copy)]
struct SendRx {
    posted: u32,
    received: u32,
    places: [u64; MAX_PLACES],
}

impl<P: Provider> Hooks for Perf<'_, '_, '_, P> {
    type Error = CaseError;

    fn connect(&mut self, peers: &[Key], agreed: &Agreed) -> Result<(), CaseError> {
        if peers.len() != self.kind.qps() {
            return Err(CaseError::OutOfOrder);
        }
        self.agreed = Some(*agreed);
        for (i, peer) in peers.iter().enumerate() {
            self.connect_one(i, peer, agreed)?;
        }
        // ib_send_lat: the receives are posted before the barrier after which Linux sends.
        if matches!(self.kind, PerfKind::SendLat { .. }) {
            for _ in 0..RECV_DEPTH.min(self.iters) {
                self.post_recv()?;
            }
        }
        // ib_send_bw: every slot of every QP, before the sync barrier.
        if let Some((_, true)) = self.kind.send_bw() {
            for i in 0..peers.len() {
                for _ in 0..self.slots.0.min(self.iters) {
                    self.post_slot(i)?;
                }
            }
        }
        Ok(())
    }

    fn data_phase(&mut self, peers: &[Key]) -> Result<Report, CaseError> {
        let peer = peers.first().ok_or(CaseError::OutOfOrder)?;
        if matches!(self.kind, PerfKind::ReadLatReq | PerfKind::AtomicLatReq) {
            return self.one_at_a_time(peer);
        }
        if matches!(
            self.kind,
            PerfKind::WriteLat { .. } | PerfKind::SendLat { .. }
        ) {
            return self.ping_pong(peer);
        }
        if let Some((send, recv)) = self.kind.send_bw() {
            return self.send_phase(peers.len(), send, recv);
        }
        let reads = self.kind.read_bw().is_some_and(|(r, _)| r)
            || self.kind.atomic_bw().is_some_and(|(r, _)| r);
        if !self.kind.writes() && !reads {
            // The server's part ran while the exchange waited for the client's "finished".
            return Ok(Report {
                size: self.size.into(),
                iters: self.iters.into(),
                ..Report::default()
            });
        }
        let t0 = (self.clock_ms)();
        let mut done = 0u64;
        for (i, peer) in peers.iter().enumerate() {
            done += u64::from(if reads {
                self.read_all(i, peer)?
            } else {
                self.write_all(i, peer)?
            });
        }
        // The clock ticks every 16 ms: a run shorter than a tick counts as one.
        let ms = ((self.clock_ms)() - t0).max(16);
        let bytes = u64::from(self.size) * done;
        let secs = ms as f64 / 1000.0;
        let bw = bytes as f64 / secs / (1u64 << 20) as f64;
        self.wrote = (done, bw);
        // (perftest reports its iterations times its QPs.)
        Ok(Report {
            size: self.size.into(),
            iters: done,
            bw_peak: bw,
            bw_avg: bw,
            msg_rate: done as f64 / secs / 1e6,
        })
    }
}

impl<'a, P: Provider> Perf<'a, '_, '_, P> {
    /// QP `i`.
    fn qp_mut(&mut self, i: usize) -> Result<&mut Qp<'a, P>, CaseError> {
        match i {
            0 => Ok(&mut self.qp),
            _ => self.more.get_mut(i - 1).ok_or(CaseError::OutOfOrder),
        }
    }

    /// QP `i` to RTR and RTS, connected to `peer`.
    fn connect_one(&mut self, i: usize, peer: &Key, agreed: &Agreed) -> Result<(), CaseError> {
        let out_reads = self.out_reads;
        let (psn, gid_index) = (self.psn, self.gid_index);
        let slot = self.qp_mut(i)?;
        let Qp::Init(qp) = core::mem::replace(slot, Qp::Gone) else {
            return Err(CaseError::OutOfOrder);
        };
        let mut av = AddressVector::new(peer.gid, gid_index);
        av.hop_limit = 1;
        let mut rtr = ConnectedRtr::new(peer.qpn, peer.psn, av);
        rtr.path_mtu = Mtu::from_raw(agreed.mtu.into()).unwrap_or(Mtu::Mtu1024);
        rtr.max_dest_rd_atomic = out_reads;
        let qp = match qp.rtr(&rtr) {
            Ok(q) => q,
            Err((q, e)) => {
                *slot = Qp::Init(q);
                return Err(Failure {
                    step: "perftest: RTR",
                    error: e,
                }
                .into());
            }
        };
        let mut rts = ConnectedRts::new(psn);
        rts.max_rd_atomic = peer.out_reads.min(u16::from(out_reads)) as u8;
        match qp.rts(&rts) {
            Ok(q) => *slot = Qp::Rts(q),
            Err((q, e)) => {
                *slot = Qp::Rtr(q);
                return Err(Failure {
                    step: "perftest: RTS",
                    error: e,
                }
                .into());
            }
        }
        Ok(())
    }

    /// perftest's client's WRITEs on QP `i`: `iters` of `size` bytes to `peer`'s buffer, up to
    /// [`TX_DEPTH`] in flight. Returns how many completed.
    fn write_all(&mut self, i: usize, peer: &Key) -> Result<u32, CaseError> {
        let sge = self.mr.sge(0, self.size).at("perftest: sge")?;
        let (iters, cq, deadline, clock) = (self.iters, self.cq, self.deadline, self.clock_ms);
        let Qp::Rts(qp) = self.qp_mut(i)? else {
            return Err(CaseError::OutOfOrder);
        };
        let (mut posted, mut done) = (0u32, 0u32);
        let mut wcs = [WorkCompletion::default(); 16];
        while done < iters {
            if posted < iters && posted - done < TX_DEPTH {
                let n = (iters - posted).min(TX_DEPTH - (posted - done));
                // `perf` destroys the QP before it drops the region, on every path.
                // SAFETY: the region stays registered and untouched by the CPU while WRITEs fly.
                unsafe {
                    let mut b = qp.send_batch();
                    for k in 0..n {
                        b.rdma_write(
                            u64::from(posted + k),
                            SendFlags::SIGNALED,
                            (peer.vaddr, peer.rkey),
                            &[sge],
                        )
                        .at("perftest: post WRITE")?;
                    }
                    b.finish();
                }
                posted += n;
            }
            let got = cq.poll(&mut wcs).at("perftest: poll")?;
            if let Some(w) = wcs[..got].iter().find(|w| w.status != WcStatus::Success) {
                return Err(CaseError::Status(w.status, w.wr_id));
            }
            done += got as u32;
            if got == 0 && clock() > deadline {
                return Err(CaseError::Deadline);
            }
        }
        Ok(done)
    }
}

impl<P: Provider> Perf<'_, '_, '_, P> {
    /// `ib_read_bw`'s READs on QP `i` as perftest's client (Linux serving, or `-b`): `iters`
    /// of `size` bytes from the start of `peer`'s buffer, up to the smaller of both sides'
    /// outstanding reads (and [`READ_SLOTS`]) in flight, each into its slot after the halves
    /// (the sentinel first). Every READ must bring the first one's bytes (nothing else of
    /// Linux's writes that buffer); with `-b` a byte may also be this side's own at that place
    /// (Linux's READs of this side's buffer may land where this side READs). Returns how many
    /// completed.
    ///
    /// `ib_atomic_bw`'s fetch-and-adds of 1 the same way (Linux serving): each must return the
    /// one before plus one (one QP at a time, each executed once, in order).
    fn read_all(&mut self, i: usize, peer: &Key) -> Result<u32, CaseError> {
        let atomic = self.kind.atomics();
        let (size, iters, base) = (self.size as usize, self.iters, self.read_at as usize);
        let stride = self.size.next_multiple_of(64) as usize;
        let first = base + READ_SLOTS as usize * stride;
        let window = u32::from(self.out_reads)
            .min(u32::from(peer.out_reads))
            .clamp(1, READ_SLOTS);
        let duplex = matches!(self.kind, PerfKind::ReadBw { duplex: true, .. });
        let (cq, deadline, clock) = (self.cq, self.deadline, self.clock_ms);
        let (mut posted, mut done) = (0u32, 0u32);
        let mut wcs = [WorkCompletion::default(); 16];
        while done < iters {
            while posted < iters && posted - done < window {
                let at = base + (posted % window) as usize * stride;
                self.mr.as_mut_slice()[at..at + size].fill(READ_SENTINEL);
                let sge = self.mr.sge(at as u32, self.size).at("perftest: sge")?;
                let Qp::Rts(qp) = self.qp_mut(i)? else {
                    return Err(CaseError::OutOfOrder);
                };
                // `perf` destroys the QP before it drops the region, on every path; the CPU
                // reads a slot only once its READ completed, and fills it again only then.
                // SAFETY: the region stays registered and the slot untouched while it flies.
                unsafe {
                    let mut b = qp.send_batch();
                    let to = (peer.vaddr, peer.rkey);
                    if atomic {
                        b.atomic_fetch_add(u64::from(posted), SendFlags::SIGNALED, to, 1, &sge)
                    } else {
                        b.rdma_read(u64::from(posted), SendFlags::SIGNALED, to, &[sge])
                    }
                    .at("perftest: post READ or atomic")?;
                    b.finish();
                }
                posted += 1;
            }
            let got = cq.poll(&mut wcs).at("perftest: poll")?;
            for w in &wcs[..got] {
                if w.status != WcStatus::Success {
                    return Err(CaseError::Status(w.status, w.wr_id));
                }
                // An RC QP completes its READs in order.
                if w.wr_id != u64::from(done) {
                    return Err(CaseError::OutOfOrder);
                }
                let at = base + (done % window) as usize * stride;
                let buf = self.mr.as_mut_slice();
                if atomic {
                    let v = u64::from_ne_bytes(buf[at..at + 8].try_into().unwrap_or([0; 8]));
                    if done == 0 {
                        buf[first..first + 8].copy_from_slice(&v.to_ne_bytes());
                    } else {
                        let v0 =
                            u64::from_ne_bytes(buf[first..first + 8].try_into().unwrap_or([0; 8]));
                        if v != v0.wrapping_add(u64::from(done)) {
                            return Err(CaseError::Atomics {
                                sum: v.wrapping_sub(v0),
                                iters: done,
                            });
                        }
                    }
                } else if done == 0 {
                    buf.copy_within(at..at + size, first);
                } else if let Some(j) = (0..size).find(|&j| {
                    let b = buf[at + j];
                    b != buf[first + j] && !(duplex && b == j as u8)
                }) {
                    return Err(CaseError::Data {
                        bad: 1,
                        first: done,
                        at: j as u32,
                    });
                }
                done += 1;
            }
            if got == 0 && clock() > deadline {
                return Err(CaseError::Deadline);
            }
        }
        Ok(done)
    }

    /// The latency programs' client: `iters` READs of `size` bytes (or fetch-and-adds of 1)
    /// to the Linux server's buffer, each posted once the one before completed. Checked: every
    /// READ brings the first one's bytes (the server's buffer does not change; compared by a
    /// 64-bit digest), every
    /// fetch-and-add the value before it plus one (each executed once, in order).
    fn one_at_a_time(&mut self, peer: &Key) -> Result<Report, CaseError> {
        let Qp::Rts(qp) = &mut self.qp else {
            return Err(CaseError::OutOfOrder);
        };
        let atomic = self.kind == PerfKind::AtomicLatReq;
        let size = if atomic { 8 } else { self.size };
        // The target at the region's start.
        let sge = self.mr.sge(0, size).at("perftest: sge")?;
        let t0 = (self.clock_ms)();
        let mut first = 0u64;
        let mut wcs = [WorkCompletion::default(); 1];
        for i in 0..self.iters {
            // `perf` destroys the QP before it drops the region, on every path; the CPU reads
            // the region only between two operations, none in flight.
            // SAFETY: the region stays registered and untouched while the operation flies.
            unsafe {
                let mut b = qp.send_batch();
                if atomic {
                    b.atomic_fetch_add(
                        u64::from(i),
                        SendFlags::SIGNALED,
                        (peer.vaddr, peer.rkey),
                        1,
                        &sge,
                    )
                } else {
                    b.rdma_read(
                        u64::from(i),
                        SendFlags::SIGNALED,
                        (peer.vaddr, peer.rkey),
                        &[sge],
                    )
                }
                .at("perftest: post")?;
                b.finish();
            }
            loop {
                let got = self.cq.poll(&mut wcs).at("perftest: poll")?;
                if got == 1 {
                    if wcs[0].status != WcStatus::Success {
                        return Err(CaseError::Status(wcs[0].status, wcs[0].wr_id));
                    }
                    break;
                }
                if (self.clock_ms)() > self.deadline {
                    return Err(CaseError::Deadline);
                }
            }
            let buf = self.mr.as_slice();
            let at = size as usize;
            if atomic {
                let v = u64::from_ne_bytes(buf[..8].try_into().unwrap_or([0; 8]));
                if i == 0 {
                    first = v;
                } else if v != first.wrapping_add(u64::from(i)) {
                    return Err(CaseError::Atomics {
                        sum: v.wrapping_sub(first),
                        iters: i,
                    });
                }
            } else {
                // The first READ's bytes, as a 64-bit FNV-1a digest (no room kept for a copy).
                let digest = buf[..at].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                });
                if i == 0 {
                    first = digest;
                } else if digest != first {
                    return Err(CaseError::Differs(i));
                }
            }
        }
        let us = ((self.clock_ms)() - t0).max(16) * 1000 / u64::from(self.iters.max(1));
        self.requested = us;
        Ok(Report::default())
    }
}

/// Receives `ib_send_lat`'s side keeps posted (one message each way is in flight at a time;
/// the second lets Linux's next SEND find one while the first is being checked).
const RECV_DEPTH: u32 = 2;
/// The `wr_id` bit of a receive (the CQ holds both queues' completions).
const RECV_ID: u64 = 1 << 32;

/// How far `ib_write_lat`'s and `ib_send_lat`'s ping-pong has come.
#[derive(Default)]
struct Rounds {
    /// This side's messages completed.
    sent: u32,
    /// Linux's messages received and checked.
    received: u32,
    /// `ib_send_lat`: the digest of the first SEND's bytes.
    first: u64,
}

/// A 64-bit FNV-1a digest of `bytes`.
fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl<P: Provider> Perf<'_, '_, '_, P> {
    /// Posts one receive of `size` bytes into the buffer's second half (`ib_send_lat`).
    fn post_recv(&mut self) -> Result<(), CaseError> {
        let Qp::Rts(qp) = &mut self.qp else {
            return Err(CaseError::OutOfOrder);
        };
        let sge = self.mr.sge(self.half, self.size).at("perftest: sge")?;
        // `perf` destroys the QP before it drops the region, on every path; the CPU reads the
        // receive's bytes only once it completed, and Linux sends the next only once it has
        // this side's answer, which goes after that read.
        // SAFETY: the region stays registered and unwritten by the CPU while the receive waits.
        unsafe { qp.post_recv_raw(RECV_ID | u64::from(self.recvs_posted), &[sge]) }
            .at("perftest: post receive")?;
        self.recvs_posted += 1;
        Ok(())
    }

    /// One poll of the CQ (which runs the software device), and what it brought: this
    /// side's completions, Linux's SENDs (each checked: `-s` bytes, the same as the first;
    /// a receive posted again while more are to come), or Linux's WRITE of the next round (its
    /// last byte the round's number, as perftest's `run_iter_lat_write` polls it, the bytes
    /// before it zero: perftest's ib_write_lat buffer is zeroed).
    fn progress(&mut self, write: bool, r: &mut Rounds) -> Result<(), CaseError> {
        let mut wcs = [WorkCompletion::default(); 4];
        let got = self.cq.poll(&mut wcs).at("perftest: poll")?;
        let (half, size) = (self.half as usize, self.size as usize);
        for w in &wcs[..got] {
            if w.status != WcStatus::Success {
                return Err(CaseError::Status(w.status, w.wr_id));
            }
            if w.wr_id & RECV_ID == 0 {
                r.sent += 1;
                continue;
            }
            let bad = |at| CaseError::Data {
                bad: 1,
                first: r.received,
                at,
            };
            if write || w.byte_len != self.size {
                return Err(bad(u32::MAX));
            }
            let d = digest(&self.mr.as_slice()[half..half + size]);
            if r.received == 0 {
                r.first = d;
            } else if d != r.first {
                return Err(CaseError::Differs(r.received));
            }
            r.received += 1;
            if self.recvs_posted < self.iters {
                self.post_recv()?;
            }
        }
        if write {
            // The software device writes the region only inside a call of ours (the poll
            // above): the CPU reads it between two.
            let buf = &self.mr.as_slice()[half..half + size];
            if buf[size - 1] == (r.received + 1) as u8 {
                if let Some(at) = buf[..size - 1].iter().position(|&b| b != 0) {
                    return Err(CaseError::Data {
                        bad: 1,
                        first: r.received,
                        at: at as u32,
                    });
                }
                r.received += 1;
            }
        }
        if got == 0 && (self.clock_ms)() > self.deadline {
            return Err(CaseError::Deadline);
        }
        Ok(())
    }

    /// `ib_write_lat` and `ib_send_lat`: `iters` rounds of one message each way, one at a
    /// time, perftest's starter (ib_write_lat's server, ib_send_lat's client) first in each.
    /// This side's WRITEs carry what perftest's do (zeroes, the round's number in the last
    /// byte); its SENDs the first half of its buffer.
    fn ping_pong(&mut self, peer: &Key) -> Result<Report, CaseError> {
        let (write, linux_serves) = match self.kind {
            PerfKind::WriteLat { linux_serves } => (true, linux_serves),
            PerfKind::SendLat { linux_serves } => (false, linux_serves),
            _ => return Err(CaseError::OutOfOrder),
        };
        let first = if write { !linux_serves } else { linux_serves };
        let size = self.size;
        let sge = self.mr.sge(0, size).at("perftest: sge")?;
        let t0 = (self.clock_ms)();
        let mut r = Rounds::default();
        for k in 1..=self.iters {
            while !first && r.received < k {
                self.progress(write, &mut r)?;
            }
            if write {
                // The WRITE before this one completed: the CPU may change its bytes.
                self.mr.as_mut_slice()[size as usize - 1] = k as u8;
            }
            let Qp::Rts(qp) = &mut self.qp else {
                return Err(CaseError::OutOfOrder);
            };
            // `perf` destroys the QP before it drops the region, on every path; the CPU
            // changes the bytes sent only once the message before completed.
            // SAFETY: the region stays registered and untouched while the message flies.
            unsafe {
                let mut b = qp.send_batch();
                if write {
                    b.rdma_write(
                        u64::from(k),
                        SendFlags::SIGNALED,
                        (peer.vaddr, peer.rkey),
                        &[sge],
                    )
                } else {
                    b.send(u64::from(k), SendFlags::SIGNALED, &[sge])
                }
                .at("perftest: post")?;
                b.finish();
            }
            while r.sent < k || (first && r.received < k) {
                self.progress(write, &mut r)?;
            }
        }
        let us = ((self.clock_ms)() - t0).max(16) * 1000 / u64::from(self.iters.max(1));
        self.requested = us;
        Ok(Report::default())
    }
}

/// The longest run of pre-fill bytes a WRITE target may still hold by chance (perftest
/// writes `rand()` bytes: a run of 8 has odds of 2^-64 at each place).
const PREFILL_RUN: usize = 8;

/// `ib_write_bw`'s targets after its client's WRITEs on `qps` QPs: QP `i`'s at `half` × (i + 1)
/// of `buf` (pre-filled with each byte's offset), where perftest's client puts WRITE `k` at
/// `k mod period` steps of `size` rounded up to the cache line when `size` is at most half
/// its cycle buffer (the page size), else always at the start (`increase_rem_addr` in
/// `perftest_resources.c`). Every place written holds no run of [`PREFILL_RUN`] pre-fill
/// bytes, every other byte of the buffer its pre-fill.
fn check_write_targets(
    buf: &[u8],
    half: u32,
    size: u32,
    iters: u32,
    qps: u8,
    agreed: &Agreed,
) -> Result<(), CaseError> {
    let (half, size) = (half as usize, size as usize);
    let (cycle, line) = (agreed.page_size as usize, agreed.cache_line.max(1) as usize);
    let (places, step) = if size <= cycle / 2 {
        let step = size.next_multiple_of(line).max(line);
        ((cycle / step).max(1).min(iters as usize), step)
    } else {
        (1, 0)
    };
    let written = |j: usize| {
        let q = j / half;
        if q == 0 || q > usize::from(qps) {
            return false;
        }
        let at = j % half;
        if step == 0 {
            at < size
        } else {
            at < places * step && at % step < size
        }
    };
    let mut run = 0;
    for (j, &b) in buf.iter().enumerate() {
        let pre = b == j as u8;
        if written(j) {
            run = if pre { run + 1 } else { 0 };
            if run >= PREFILL_RUN {
                return Err(CaseError::Data {
                    bad: 1,
                    first: (j / half) as u32 - 1,
                    at: (j % half + 1 - PREFILL_RUN) as u32,
                });
            }
        } else {
            run = 0;
            if !pre {
                return Err(CaseError::Changed(j as u32));
            }
        }
    }
    Ok(())
}

impl<P: Provider> Perf<'_, '_, '_, P> {
    /// Posts receive `rx[i].posted` of QP `i` into its slot (`ib_send_bw`): the slots of QP
    /// `i` follow the source half, `slots.0` of `slots.1` bytes each, used in turn.
    fn post_slot(&mut self, i: usize) -> Result<(), CaseError> {
        let (count, stride) = self.slots;
        let n = self.rx[i].posted;
        let at = self.half + (i as u32 * count + n % count) * stride;
        let sge = self.mr.sge(at, self.size).at("perftest: sge")?;
        let Qp::Rts(qp) = self.qp_mut(i)? else {
            return Err(CaseError::OutOfOrder);
        };
        let id = RECV_ID | ((i as u64) << 24) | u64::from(n);
        // `perf` destroys the QPs before it drops the region, on every path; the CPU reads a
        // slot only once its receive completed, and posts it again after.
        // SAFETY: the region stays registered and unwritten by the CPU while the receive waits.
        unsafe { qp.post_recv_raw(id, &[sge]) }.at("perftest: post receive")?;
        self.rx[i].posted += 1;
        Ok(())
    }

    /// `ib_send_bw`'s data phase: with `send`, `iters` SENDs of `size` bytes on each of `n`
    /// QPs (the source half, up to [`TX_DEPTH`] in flight in all); with `recv`, Linux's
    /// `iters` on each, every one checked: `size` bytes, and the bytes of the first message
    /// at the same place of Linux's cycle (perftest's sender puts message `m` at `m mod
    /// period` steps when `size` is at most half its cycle buffer; its buffer never changes).
    fn send_phase(&mut self, n: usize, send: bool, recv: bool) -> Result<Report, CaseError> {
        let agreed = self.agreed.ok_or(CaseError::OutOfOrder)?;
        let (cycle, line) = (agreed.page_size, agreed.cache_line.max(1));
        let period = if self.size <= cycle / 2 {
            let step = self.size.next_multiple_of(line).max(line);
            (cycle / step).max(1)
        } else {
            1
        };
        let sge = self.mr.sge(0, self.size).at("perftest: sge")?;
        let iters = self.iters;
        let want = u64::from(iters) * n as u64;
        let mut posted = [0u32; MAX_QPS];
        let (mut done, mut received) = (0u64, 0u64);
        let per_qp = (TX_DEPTH / n as u32).max(1);
        let t0 = (self.clock_ms)();
        let mut wcs = [WorkCompletion::default(); 16];
        let mut in_flight = [0u32; MAX_QPS];
        while (send && done < want) || (recv && received < want) {
            for i in 0..n {
                if !send || posted[i] >= iters || in_flight[i] >= per_qp {
                    continue;
                }
                let k = (iters - posted[i]).min(per_qp - in_flight[i]);
                let Qp::Rts(qp) = self.qp_mut(i)? else {
                    return Err(CaseError::OutOfOrder);
                };
                // `perf` destroys the QPs before it drops the region, on every path.
                // SAFETY: the source half stays registered and untouched by the CPU.
                unsafe {
                    let mut b = qp.send_batch();
                    for j in 0..k {
                        let id = ((i as u64) << 24) | u64::from(posted[i] + j);
                        b.send(id, SendFlags::SIGNALED, &[sge])
                            .at("perftest: post SEND")?;
                    }
                    b.finish();
                }
                posted[i] += k;
                in_flight[i] += k;
            }
            let got = self.cq.poll(&mut wcs).at("perftest: poll")?;
            for w in &wcs[..got] {
                if w.status != WcStatus::Success {
                    return Err(CaseError::Status(w.status, w.wr_id));
                }
                let i = ((w.wr_id >> 24) & 0xff) as usize;
                if i >= n {
                    return Err(CaseError::Status(WcStatus::GeneralErr, w.wr_id));
                }
                if w.wr_id & RECV_ID == 0 {
                    in_flight[i] = in_flight[i].saturating_sub(1);
                    done += 1;
                    continue;
                }
                let m = self.rx[i].received;
                let bad = |at| CaseError::Data {
                    bad: 1,
                    first: m,
                    at,
                };
                if !recv || w.byte_len != self.size {
                    return Err(bad(u32::MAX));
                }
                let (count, stride) = self.slots;
                let at = (self.half + (i as u32 * count + m % count) * stride) as usize;
                let d = digest(&self.mr.as_slice()[at..at + self.size as usize]);
                let place = (m % period) as usize;
                if place < MAX_PLACES {
                    if m < period {
                        self.rx[i].places[place] = d;
                    } else if self.rx[i].places[place] != d {
                        return Err(CaseError::Differs(m));
                    }
                }
                self.rx[i].received += 1;
                received += 1;
                if self.rx[i].posted < iters {
                    self.post_slot(i)?;
                }
            }
            if got == 0 && (self.clock_ms)() > self.deadline {
                return Err(CaseError::Deadline);
            }
        }
        let ms = ((self.clock_ms)() - t0).max(16);
        let secs = ms as f64 / 1000.0;
        let bw = (u64::from(self.size) * done) as f64 / secs / (1u64 << 20) as f64;
        self.sent = (done, received);
        self.wrote = (done, bw);
        Ok(Report {
            size: self.size.into(),
            iters: done,
            bw_peak: bw,
            bw_avg: bw,
            msg_rate: done as f64 / secs / 1e6,
        })
    }
}

/// One perftest case: the buffer, the QP and the exchange in the unikernel's role.
#[allow(clippy::too_many_arguments)]
fn perf<P: Provider, L: Link>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    (gid, gid_index): (Gid, u32),
    stack: &mut Stack<'_, L>,
    linux: [u8; 4],
    (kind, size, iters): (PerfKind, u32, u32),
    deadline: u64,
    clock_ms: &dyn Fn() -> u64,
) -> Result<Detail, CaseError> {
    // perftest's buffer: twice the larger of the message and its cycle buffer (a page);
    // the Linux client's addresses stay inside it.
    // With -q N the WRITE targets of Linux's client are one such half per QP, after the
    // first.
    let half = size.max(4096);
    let n = kind.qps();
    // ib_send_bw's receive slots: up to 16 a QP, 1 MiB a QP at most (one at least).
    let stride = size.next_multiple_of(64);
    let slots = (SEND_SLOT_BYTES / stride).clamp(1, SEND_SLOTS);
    let len = match kind.send_bw() {
        Some(_) => half as usize + n * (slots * stride) as usize,
        // ib_read_bw's READ slots after the halves, and the first READ's bytes.
        None if kind.read_bw().is_some_and(|(reads, _)| reads)
            || kind.atomic_bw().is_some_and(|(ops, _)| ops) =>
        {
            (n + 1) * half as usize + ((READ_SLOTS + 1) * stride) as usize
        }
        None => (n + 1) * half as usize,
    };
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mut mr = pd.register(len, access).at("perftest: register")?;
    // (ib_write_lat's buffer is zeroed, as perftest's.)
    let zero = kind.atomics() || matches!(kind, PerfKind::WriteLat { .. });
    for (i, b) in mr.as_mut_slice().iter_mut().enumerate() {
        *b = if zero { 0 } else { i as u8 };
    }
    let cq = ctx.create_cq(2 * TX_DEPTH).at("perftest: create CQ")?;
    let caps = QpCaps {
        max_send_wr: TX_DEPTH,
        max_recv_wr: if kind.send_bw().is_some() {
            slots
        } else {
            RECV_DEPTH
        },
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let init = ConnectedInit {
        port: 1,
        pkey_index: 0,
        access,
    };
    let mut qps: [Qp<'_, P>; MAX_QPS] = core::array::from_fn(|_| Qp::Gone);
    for q in &mut qps[..n] {
        let qp = pd
            .qp_builder(&cq, &cq)
            .caps(caps)
            .build::<Rc>()
            .at("perftest: create QP")?;
        *q = Qp::Init(qp.init(&init).at("perftest: INIT")?);
    }
    let out_reads = ctx.caps().max_qp_rd_atom.clamp(1, 16) as u8;
    // From the device's seed (the Linux peer learns it over the TCP exchange).
    let psn = ctx.random_psn();
    let write_bw = matches!(kind, PerfKind::Write | PerfKind::WriteBw { .. });
    let mut keys = [Key {
        lid: 0,
        out_reads: if write_bw { 1 } else { out_reads.into() },
        qpn: 0,
        psn,
        rkey: mr.rkey(),
        vaddr: mr.addr(),
        gid,
        srqn: 0,
    }; MAX_QPS];
    for (i, (k, q)) in keys.iter_mut().zip(&qps).enumerate().take(n) {
        k.qpn = q.qp_num();
        // ib_write_lat's peer WRITEs into the second half (as perftest's own key says),
        // ib_write_bw's client into a half of each QP's after the first.
        if matches!(kind, PerfKind::WriteLat { .. } | PerfKind::WriteBw { .. }) {
            k.vaddr = mr.addr() + u64::from(half) * (i as u64 + 1);
        }
    }
    let role = if kind.uni_client() {
        Role::Client {
            server: linux,
            retry: CONNECT_RETRY,
        }
    } else {
        Role::Server
    };
    let [q0, q1, q2, q3] = { qps };
    let mut hooks = Perf {
        kind,
        gid_index: u8::try_from(gid_index).map_err(|_| CaseError::GidFamily)?,
        size,
        iters,
        qp: q0,
        more: [q1, q2, q3],
        cq: &cq,
        mr: &mut mr,
        agreed: None,
        half,
        psn,
        out_reads,
        deadline,
        clock_ms,
        wrote: (0, 0.0),
        requested: 0,
        recvs_posted: 0,
        rx: [SendRx {
            posted: 0,
            received: 0,
            places: [0; MAX_PLACES],
        }; MAX_QPS],
        slots: (slots, stride),
        read_at: (n as u32 + 1) * half,
        sent: (0, 0),
    };
    let local = Local::with_qps(&keys[..n]).ok_or(CaseError::OutOfOrder)?;
    let r = match kind.latency() {
        Some(which) => perftest::run_latency(
            stack,
            role,
            tcp::PORT,
            &local,
            &mut hooks,
            which,
            deadline,
            &mut || clock_ms(),
        ),
        None if kind.send_bw().is_some() => perftest::run_send(
            stack,
            role,
            tcp::PORT,
            &local,
            &mut hooks,
            matches!(kind, PerfKind::SendBw { duplex: true, .. }),
            deadline,
            &mut || clock_ms(),
        ),
        None if matches!(
            kind,
            PerfKind::WriteBw { duplex: true, .. }
                | PerfKind::ReadBw { duplex: true, .. }
                | PerfKind::AtomicBw { duplex: true, .. }
        ) =>
        {
            perftest::run_bidirectional(
                stack,
                role,
                tcp::PORT,
                &local,
                &mut hooks,
                deadline,
                &mut || clock_ms(),
            )
        }
        None => perftest::run(
            stack,
            role,
            tcp::PORT,
            &local,
            &mut hooks,
            deadline,
            &mut || clock_ms(),
        ),
    };
    let sent = hooks.sent;
    let (qp, more, wrote, requested, agreed) = (
        core::mem::replace(&mut hooks.qp, Qp::Gone),
        core::mem::replace(&mut hooks.more, core::array::from_fn(|_| Qp::Gone)),
        hooks.wrote,
        hooks.requested,
        hooks.agreed,
    );
    drop(hooks);
    qp.destroy()?;
    for q in more {
        q.destroy()?;
    }
    let detail = match r {
        Ok(o) => match kind {
            PerfKind::Write => Detail::Wrote(wrote.0, size, wrote.1),
            PerfKind::SendBw { qps, .. } => Detail::Sends(sent.0, sent.1, size, qps),
            PerfKind::WriteBw { qps, .. } => {
                if kind.written() {
                    let agreed = agreed.ok_or(CaseError::OutOfOrder)?;
                    check_write_targets(mr.as_slice(), half, size, iters, qps, &agreed)?;
                }
                match (kind.writes(), kind.written()) {
                    (true, true) => Detail::Both(wrote.0, size, wrote.1, qps, o.peer_report.iters),
                    (true, false) => Detail::WroteQps(wrote.0, size, wrote.1, qps),
                    _ => Detail::Written(qps, size, o.peer_report.iters),
                }
            }
            PerfKind::Read => Detail::Read(o.peer_report.iters, size),
            PerfKind::ReadBw { qps, .. } => {
                let (reads, read_from) = kind.read_bw().unwrap_or((false, true));
                // Linux's READs read; nothing of the halves may have changed.
                let halves = (n + 1) * half as usize;
                if read_from
                    && let Some(at) = mr.as_slice()[..halves]
                        .iter()
                        .enumerate()
                        .position(|(i, &b)| b != i as u8)
                {
                    return Err(CaseError::Changed(at as u32));
                }
                match (reads, read_from) {
                    (false, _) => Detail::ReadQps(o.peer_report.iters, size, qps),
                    (true, served) => Detail::ReadsDone(
                        wrote.0,
                        size,
                        wrote.1,
                        qps,
                        served.then_some(o.peer_report.iters),
                    ),
                }
            }
            PerfKind::ReadLatReq => Detail::Requested(
                iters,
                size,
                requested,
                "RDMA READs, each bringing the first one's bytes",
            ),
            PerfKind::AtomicLatReq => Detail::Requested(
                iters,
                8,
                requested,
                "fetch-and-adds of 1, each returning the one before plus one",
            ),
            PerfKind::WriteLat { .. } => Detail::Rounds(
                iters,
                size,
                requested,
                "RDMA WRITEs each way, every one of Linux's with its round's number in its last byte and zeroes before it",
            ),
            PerfKind::SendLat { .. } => Detail::Rounds(
                iters,
                size,
                requested,
                "SENDs each way, every one of Linux's of that size and the first one's bytes",
            ),
            PerfKind::ReadLat => {
                // READs read; nothing of the buffer may have changed.
                if let Some(at) = mr
                    .as_slice()
                    .iter()
                    .enumerate()
                    .position(|(i, &b)| b != i as u8)
                {
                    return Err(CaseError::Changed(at as u32));
                }
                Detail::ReadLat(iters, size)
            }
            PerfKind::AtomicBw {
                linux_serves: true,
                qps,
                duplex: false,
            } => Detail::AtomicsDone(wrote.0, qps, wrote.1),
            PerfKind::Atomic | PerfKind::AtomicLat | PerfKind::AtomicBw { .. } => {
                // Linux's fetch-and-adds land in the halves; with -b this side's own results
                // land after them (its READ slots), and are not Linux's.
                let words = mr
                    .as_slice()
                    .get(..(n + 1) * half as usize)
                    .unwrap_or(mr.as_slice())
                    .chunks_exact(8)
                    .map(|w| u64::from_ne_bytes(w.try_into().unwrap_or([0; 8])));
                let (n, sum) = words
                    .filter(|&w| w != 0)
                    .fold((0u32, 0u64), |(n, s), w| (n + 1, s.wrapping_add(w)));
                // ib_atomic_bw's fetch-and-add adds 1 each time: the words must hold
                // exactly the client's count (on each QP), each atomic executed once.
                let iters = iters.saturating_mul(kind.qps() as u32);
                if sum != u64::from(iters) {
                    return Err(CaseError::Atomics { sum, iters });
                }
                match kind {
                    PerfKind::AtomicBw {
                        duplex: true, qps, ..
                    } => Detail::AtomicsBoth(wrote.0, qps, wrote.1, n, sum),
                    _ => Detail::Atomics(n, sum),
                }
            }
        },
        Err(FlowError::Exchange(e)) => return Err(e.into()),
        Err(FlowError::Hook(e)) => return Err(e),
    };
    cq.destroy().at("perftest: destroy CQ")?;
    mr.destroy().at("perftest: destroy MR")?;
    Ok(detail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::Kind;

    #[test]
    fn options_from_the_command_line() {
        let line = "bvirq bvroce=10.0.0.2/24 bvroce.peer=10.0.0.1 bvroce.cases=rc-server,-n,5+read";
        let o = Options::parse(line, 7).expect("parses");
        assert_eq!((o.net.ip, o.net.prefix), ([10, 0, 0, 2], 24));
        assert_eq!(o.peer, [10, 0, 0, 1]);
        assert_eq!(o.cases, "rc-server,-n,5+read");
        assert_eq!(o.cases_fw_cfg, None);
        assert_eq!(o.ip6, None);
        // The cases in a fw_cfg file: its name, and no list on the command line.
        let f = Options::parse(
            "bvroce=10.0.0.2/24 bvroce.peer=10.0.0.1 bvroce.cases.fw_cfg=opt/bareverbs/roce-cases",
            7,
        )
        .expect("parses");
        assert_eq!(
            (f.cases, f.cases_fw_cfg),
            ("", Some("opt/bareverbs/roce-cases"))
        );
        // Both forms at once: which list runs would be a guess.
        assert_eq!(
            Options::parse(
                "bvroce=10.0.0.2/24 bvroce.peer=10.0.0.1 bvroce.cases=read bvroce.cases.fw_cfg=opt/x",
                7
            ),
            None
        );
        let o6 = Options::parse(
            "bvroce=10.0.0.2/24 bvroce.peer=10.0.0.1 bvroce.ip6=fd00::2",
            7,
        );
        let mut fd2 = [0u8; 16];
        (fd2[0], fd2[15]) = (0xFD, 2);
        assert_eq!(o6.expect("parses").ip6, Some(fd2));
        assert_eq!(
            Options::parse(
                "bvroce=10.0.0.2/24 bvroce.peer=10.0.0.1 bvroce.ip6=fd00:2",
                7
            ),
            None
        );
        assert_eq!(Options::parse("bvroce.peer=10.0.0.1", 7), None);
        assert_eq!(Options::parse("bvroce=10.0.0.2/24", 7), None);
        assert_eq!(
            Options::parse("bvroce=10.0.0.2/33 bvroce.peer=10.0.0.1", 7),
            None
        );
        assert_eq!(
            Options::parse("bvroce=10.0.0.2/24 bvroce.peer=10.0.1", 7),
            None
        );
    }

    #[test]
    fn cases_parse_as_the_linux_programs_options() {
        let Some(PeerCase::Ping(c)) = PeerCase::parse("ud-client,-s,1024,-n,200") else {
            panic!("a pingpong case")
        };
        assert_eq!(
            (c.kind, c.linux_server, c.size, c.iters, c.v6),
            (Kind::Ud, false, 1024, 200, false)
        );
        // Over IPv6: the same programs, named apart.
        for (spec, kind, server, name) in [
            ("rc6-server,-n,5", Kind::Rc, true, "rc6-server"),
            ("rc6-client", Kind::Rc, false, "rc6-client"),
            ("ud6-server", Kind::Ud, true, "ud6-server"),
            ("ud6-client,-s,512", Kind::Ud, false, "ud6-client"),
        ] {
            let Some(PeerCase::Ping(c)) = PeerCase::parse(spec) else {
                panic!("{spec}: a pingpong case")
            };
            assert_eq!(
                (c.kind, c.linux_server, c.v6, c.name()),
                (kind, server, true, name)
            );
        }
        for bad in ["rc7-server", "rc6-both", "rc6", "rc-6-server"] {
            assert_eq!(PeerCase::parse(bad), None, "{bad}");
        }
        assert_eq!(
            PeerCase::parse("write,-s,65536,-n,1000"),
            Some(PeerCase::Perf(PerfKind::Write, 65536, 1000))
        );
        assert_eq!(
            PeerCase::parse("read"),
            Some(PeerCase::Perf(PerfKind::Read, 65536, 5000))
        );
        assert_eq!(
            PeerCase::parse("atomic,-n,10"),
            Some(PeerCase::Perf(PerfKind::Atomic, 8, 10))
        );
        assert_eq!(PeerCase::parse("atomic,-s,16"), None);
        assert_eq!(
            PeerCase::parse("ib_read_lat-client,-s,2,-n,200"),
            Some(PeerCase::Perf(PerfKind::ReadLat, 2, 200))
        );
        assert_eq!(
            PeerCase::parse("ib_read_lat-client"),
            Some(PeerCase::Perf(PerfKind::ReadLat, 2, 1000))
        );
        assert_eq!(
            PeerCase::parse("ib_atomic_lat-client,-n,200"),
            Some(PeerCase::Perf(PerfKind::AtomicLat, 8, 200))
        );
        assert_eq!(PeerCase::parse("ib_atomic_lat-client,-s,2"), None);
        assert_eq!(
            PeerCase::parse("ib_read_lat-server,-s,64,-n,10"),
            Some(PeerCase::Perf(PerfKind::ReadLatReq, 64, 10))
        );
        assert_eq!(
            PeerCase::parse("ib_atomic_lat-server"),
            Some(PeerCase::Perf(PerfKind::AtomicLatReq, 8, 1000))
        );
        assert_eq!(PeerCase::parse("ib_atomic_lat-server,-s,16"), None);
        assert_eq!(
            PeerCase::parse("ib_write_lat-server,-s,2,-n,200"),
            Some(PeerCase::Perf(
                PerfKind::WriteLat { linux_serves: true },
                2,
                200
            ))
        );
        assert_eq!(
            PeerCase::parse("ib_write_lat-client,-s,1048576,-n,20"),
            Some(PeerCase::Perf(
                PerfKind::WriteLat {
                    linux_serves: false
                },
                1 << 20,
                20
            ))
        );
        assert_eq!(
            PeerCase::parse("ib_send_lat-client"),
            Some(PeerCase::Perf(
                PerfKind::SendLat {
                    linux_serves: false
                },
                2,
                1000
            ))
        );
        assert_eq!(
            PeerCase::parse("ib_send_lat-server,-n,5"),
            Some(PeerCase::Perf(
                PerfKind::SendLat { linux_serves: true },
                2,
                5
            ))
        );
        assert_eq!(PeerCase::parse("ib_send_lat-server,-q,2"), None);
        assert_eq!(
            PeerCase::parse("ib_write_lat-1m-server,-s,1048576"),
            Some(PeerCase::Perf(
                PerfKind::WriteLat { linux_serves: true },
                1 << 20,
                1000
            ))
        );
        assert_eq!(PeerCase::parse("ib_write_lat-a-b-server"), None);
        assert_eq!(
            PeerCase::parse("ib_write_bw-q2-server,-q,2,-s,65536,-n,200"),
            Some(PeerCase::Perf(
                PerfKind::WriteBw {
                    linux_serves: true,
                    qps: 2,
                    duplex: false
                },
                65536,
                200
            ))
        );
        assert_eq!(
            PeerCase::parse("ib_write_bw-q4-client,-q,4"),
            Some(PeerCase::Perf(
                PerfKind::WriteBw {
                    linux_serves: false,
                    qps: 4,
                    duplex: false
                },
                65536,
                5000
            ))
        );
        assert_eq!(PeerCase::parse("ib_write_bw-q5-client,-q,5"), None);
        assert_eq!(
            PeerCase::parse("ib_write_bw-b-client,-b,-s,4096,-n,100"),
            Some(PeerCase::Perf(
                PerfKind::WriteBw {
                    linux_serves: false,
                    qps: 1,
                    duplex: true
                },
                4096,
                100
            ))
        );
        assert_eq!(PeerCase::parse("ib_send_lat-client,-b"), None);
        assert_eq!(
            PeerCase::parse("ib_send_bw-q2b-server,-q,2,-b,-s,4096,-n,100"),
            Some(PeerCase::Perf(
                PerfKind::SendBw {
                    linux_serves: true,
                    qps: 2,
                    duplex: true
                },
                4096,
                100
            ))
        );
        assert_eq!(
            PeerCase::parse("ib_send_bw-q2-client,-q,2").map(|c| c.name()),
            Some("ib_send_bw-client")
        );
        assert_eq!(PeerCase::parse("ib_send_bw-client,-n,16777216"), None);
        assert_eq!(PeerCase::parse("ib_write_bw-q0-client,-q,0"), None);
        assert_eq!(PeerCase::parse("ib_write_bw-x-sever,-q,2"), None);
        assert_eq!(PeerCase::parse("write,-q,2"), None);
        assert_eq!(PeerCase::parse("ib_send_lat-client,-q,2"), None);
        assert_eq!(PeerCase::parse("ib_write_lat--server"), None);
        assert_eq!(PeerCase::parse("ib_write_lat-serve"), None);
        // ib_read_bw over TCP by its names, both roles, -q up to 4 and -b; ib_atomic_bw's
        // client with -q.
        let rb = |linux_serves, qps, duplex| PerfKind::ReadBw {
            linux_serves,
            qps,
            duplex,
        };
        assert_eq!(
            PeerCase::parse("ib_read_bw-q2-client,-q,2,-s,4096,-n,200"),
            Some(PeerCase::Perf(rb(false, 2, false), 4096, 200))
        );
        assert_eq!(
            PeerCase::parse("ib_read_bw-q2-server,-q,2,-s,4096,-n,200"),
            Some(PeerCase::Perf(rb(true, 2, false), 4096, 200))
        );
        assert_eq!(
            PeerCase::parse("ib_read_bw-b-server,-b"),
            Some(PeerCase::Perf(rb(true, 1, true), 65536, 5000))
        );
        assert_eq!(
            PeerCase::parse("ib_read_bw-client"),
            Some(PeerCase::Perf(rb(false, 1, false), 65536, 5000))
        );
        assert_eq!(
            PeerCase::parse("ib_atomic_bw-q2-client,-q,2,-n,200"),
            Some(PeerCase::Perf(
                PerfKind::AtomicBw {
                    linux_serves: false,
                    qps: 2,
                    duplex: false
                },
                8,
                200
            ))
        );
        assert_eq!(
            PeerCase::parse("ib_atomic_bw-q2-server,-q,2,-n,200"),
            Some(PeerCase::Perf(
                PerfKind::AtomicBw {
                    linux_serves: true,
                    qps: 2,
                    duplex: false
                },
                8,
                200
            ))
        );
        assert_eq!(
            PeerCase::parse("ib_read_bw-q2-server,-q,2").map(|c| c.name()),
            Some("ib_read_bw-server")
        );
        // ib_atomic_bw -b: both sides operate, in either role, with -q too.
        for (spec, linux_serves, qps) in [
            ("ib_atomic_bw-b-client,-b,-n,200", false, 1),
            ("ib_atomic_bw-b-server,-b,-n,200", true, 1),
            ("ib_atomic_bw-q2b-server,-q,2,-b,-n,200", true, 2),
        ] {
            let kind = PerfKind::AtomicBw {
                linux_serves,
                qps,
                duplex: true,
            };
            assert_eq!(
                PeerCase::parse(spec),
                Some(PeerCase::Perf(kind, 8, 200)),
                "{spec}"
            );
            assert_eq!(kind.atomic_bw(), Some((true, true)));
        }
        assert_eq!(
            PerfKind::AtomicBw {
                linux_serves: true,
                qps: 1,
                duplex: false
            }
            .atomic_bw(),
            Some((true, false))
        );
        for bad in [
            "ib_read_bw-q5-client,-q,5",
            "ib_atomic_bw-q2-client,-q,2,-s,16",
            "ib_atomic_bw-b-client,-b,-s,16",
            "ib_read_bw-x-y-client,-q,2",
            "ib_read_bw-b-sever,-b",
            "ib_read_bw-q5-client,-q,5,-R",
        ] {
            assert_eq!(PeerCase::parse(bad), None, "{bad}");
        }
        // -q with -R: the CM's, a data connection per QP.
        assert!(matches!(
            PeerCase::parse("ib_read_bw-q2-client,-q,2,-R"),
            Some(PeerCase::Cm(_))
        ));
        assert_eq!(
            Refused::of("ib_atomic_bw-b-client,-b,-s,16").why,
            "options the peer does not take"
        );
        // The latency programs with -R go through the CM, with the options it takes.
        assert!(matches!(
            PeerCase::parse("ib_write_lat-client,-R"),
            Some(PeerCase::Cm(_))
        ));
        assert!(matches!(
            PeerCase::parse("ib_atomic_lat-cm-server,-R,-n,200"),
            Some(PeerCase::Cm(_))
        ));
        assert_eq!(PeerCase::parse("ib_read_lat-client,-R,-q,2"), None);
        assert_eq!(PeerCase::parse("ib_atomic_lat-client,-R,-s,2"), None);
        assert_eq!(PeerCase::parse("write,-s,0"), None);
        assert_eq!(PeerCase::parse("write,-b"), None);
        assert_eq!(PeerCase::parse("rc-server,-x"), None);
        assert_eq!(PeerCase::parse("lat"), None);
        assert_eq!(PeerCase::parse(&"rc-server,-n,1".repeat(20)), None);
        let name = |s| PeerCase::parse(s).map(|c| c.name());
        assert_eq!(name("rc-server,-n,3"), Some("rc-server"));
        assert_eq!(name("atomic"), Some("atomic"));
        assert_eq!(name("ib_read_lat-client,-n,5"), Some("ib_read_lat-client"));
        for n in [
            "ib_write_lat-client",
            "ib_write_lat-server",
            "ib_send_lat-client",
            "ib_send_lat-server",
        ] {
            assert_eq!(name(n), Some(n));
        }
        assert_eq!(name("rping-client,-C,3"), Some("rping-client"));
        assert_eq!(name("udaddy-server,-C,10,-S,100"), Some("udaddy-server"));
        assert_eq!(name("ucmatose-client,-S,2000"), None);
    }

    #[test]
    fn write_targets_overwritten_and_nothing_around_them() {
        let agreed = Agreed {
            peer_version: 606,
            page_size: 4096,
            cache_line: 64,
            mtu: 3,
        };
        let half = 4096u32;
        let fresh = || {
            let mut b = [0u8; 3 * 4096];
            for (j, x) in b.iter_mut().enumerate() {
                *x = j as u8;
            }
            b
        };
        // -q 2, WRITEs of 1000 bytes: at 0, 1024, 2048, 3072 of each QP's target (the cycle's
        // four places of 1000 rounded up to the line).
        let mut buf = fresh();
        for q in 1..3 {
            for place in 0..4 {
                let at = q * half as usize + place * 1024;
                buf[at..at + 1000].fill(0xA5);
            }
        }
        assert_eq!(
            check_write_targets(&buf, half, 1000, 10, 2, &agreed),
            Ok(())
        );
        // A place not written: its pre-fill is still there.
        let mut b = buf;
        let at = 2 * half as usize + 3072;
        for (j, x) in b[at..at + 1000].iter_mut().enumerate() {
            *x = (at + j) as u8;
        }
        assert_eq!(
            check_write_targets(&b, half, 1000, 10, 2, &agreed),
            Err(CaseError::Data {
                bad: 1,
                first: 1,
                at: 3072
            })
        );
        // A byte between two places, or in the source half, touched.
        let mut b = buf;
        b[half as usize + 1000] ^= 1;
        assert_eq!(
            check_write_targets(&b, half, 1000, 10, 2, &agreed),
            Err(CaseError::Changed(half + 1000))
        );
        let mut b = buf;
        b[7] ^= 1;
        assert_eq!(
            check_write_targets(&b, half, 1000, 10, 2, &agreed),
            Err(CaseError::Changed(7))
        );
        // Messages of more than half the cycle go to the start every time.
        let mut b = fresh();
        b[half as usize..half as usize + 3000].fill(0);
        assert_eq!(check_write_targets(&b, half, 3000, 10, 1, &agreed), Ok(()));
    }

    #[test]
    fn a_refused_case_is_named_and_its_linux_side_known() {
        let r = |s| {
            assert_eq!(PeerCase::parse(s), None, "{s} parses");
            let r = Refused::of(s);
            (r.name, r.why, r.side)
        };
        let speak = "a program the peer does not speak";
        let take = "options the peer does not take";
        assert_eq!(
            r("ib_send_bw-server,-x,1"),
            ("ib_send_bw-server", take, Some(LinuxSide::Listens))
        );
        assert_eq!(
            r("ib_atomic_bw-server,-s,16"),
            ("ib_atomic_bw-server", take, Some(LinuxSide::Listens))
        );
        assert_eq!(
            r("ib_atomic_bw-server,-R,-s,16"),
            ("ib_atomic_bw-server", take, None)
        );
        assert_eq!(
            r("ib_bogus_bw-server,-R"),
            ("ib_bogus_bw-server", speak, None)
        );
        assert_eq!(
            r("ib_write_lat-client,-b"),
            ("ib_write_lat-client", take, Some(LinuxSide::Connects))
        );
        assert_eq!(
            r("ib_send_lat-server,-q,2"),
            ("ib_send_lat-server", take, Some(LinuxSide::Listens))
        );
        assert_eq!(
            r("ib_send_lat-1m-x-server"),
            ("ib_send_lat-1m-x-server", speak, Some(LinuxSide::Listens))
        );
        assert_eq!(
            r("ib_write_lat-client,-R,-q,2"),
            ("ib_write_lat-client", take, None)
        );
        // perftest's -R programs are told through the CM, in their role; the others are not.
        let cm = |s| Refused::of(s).cm_side;
        assert_eq!(
            cm("ib_write_lat-cm-client,-R,-s,2"),
            Some(LinuxSide::Connects)
        );
        assert_eq!(cm("ib_read_lat-cm-server,-R"), Some(LinuxSide::Listens));
        assert_eq!(
            Refused::of("ib_send_lat-cm-server,-R,-b").why,
            take,
            "a tagged name"
        );
        assert_eq!(
            cm("ib_write_bw-q5-server,-R,-q,5"),
            Some(LinuxSide::Listens)
        );
        assert_eq!(cm("rping-client,-S,99999999"), None);
        assert_eq!(cm("ib_write_lat-client,-b"), None);
        assert_eq!(r("write,-q,2"), ("write", take, Some(LinuxSide::Listens)));
        assert_eq!(
            r("rc6-server,-x"),
            ("rc6-server", take, Some(LinuxSide::Listens))
        );
        assert_eq!(
            r("ud6-client,-q"),
            ("ud6-client", take, Some(LinuxSide::Connects))
        );
        assert_eq!(r("read,-b"), ("read", take, Some(LinuxSide::Connects)));
        assert_eq!(
            r("atomic,-s,16"),
            ("atomic", take, Some(LinuxSide::Connects))
        );
        assert_eq!(
            r("rc-server,-x"),
            ("rc-server", take, Some(LinuxSide::Listens))
        );
        assert_eq!(
            r("ud-client,-q"),
            ("ud-client", take, Some(LinuxSide::Connects))
        );
        assert_eq!(
            r("ib_write_bw-q5-server,-R,-q,5"),
            ("ib_write_bw-q5-server", take, None)
        );
        assert_eq!(r("rping-client,-S,99999999"), ("rping-client", take, None));
        assert_eq!(r("lat"), ("lat", speak, None));
    }
}
