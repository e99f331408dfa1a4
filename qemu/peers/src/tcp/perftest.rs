//! perftest's socket-mode exchange (no `-R`/`-z`), as perftest 4.5-0.17 (Debian bookworm's
//! 4.5+0.17-1, `-V` prints 6.06) runs it in `ib_write_bw`, `ib_read_bw` and `ib_atomic_bw`.
//!
//! Read from `src/write_bw.c`, `read_bw.c`, `atomic_bw.c` and `perftest_communication.c`
//! of tag v4.5-0.17 (line numbers of that tag). The three programs run the same TCP
//! sequence for a bandwidth test with one QP, not bidirectional: only the RDMA between the
//! barriers differs. Every step is `ctx_xchg_data`/`ctx_hand_shake` (comm.c 1380–1613): the
//! **client writes its part, then reads** the server's; the **server reads, then writes**.
//! Each read is a single `read()` that must return the full size (comm.c 1583, 342, 368), so
//! every message here leaves in one segment.
//!
//! | # | bytes each way | content | source |
//! |---|---|---|---|
//! | 1 | 16 | version: `"6.06"` NUL-padded (`MAX_VERSION` 16); a peer below 5.70 makes perftest exit | comm.c 1786, 1799; parameters.h 320; write_bw.c 126–127 |
//! | 2 | 4 | page size (`cycle_buffer`, 4096), big-endian int; both keep the larger | comm.c 1811–1849 (sent when the peer's version ≥ 5.32) |
//! | 3 | 4 | L1 cache line size (64), big-endian int; larger kept | same |
//! | 4 | 2 | MTU: `sprintf("%d")` of the `ibv_mtu` enum, 2 bytes (`"3\0"` = 1024); smaller kept | comm.c 1852–1881 (peer ≥ 5.1; 2 bytes when ≥ 5.31) |
//! | 5 | 108 | the first key message, below | write_bw.c 179–185; comm.c 288–429 |
//! | — | | GID kinds must match (both IPv4-mapped or both not), then each side's QP → RTR → RTS | write_bw.c 187–200; comm.c 1967 |
//! | 6 | 108 | key message again (each side prints the remote's data) | write_bw.c 218–226 |
//! | 7 | 108 | key message again: "after moving the QP to RTR"; the client starts its RDMA right after | write_bw.c 229 |
//! | — | | data phase: the client posts its WRITEs / READs / atomics; the server's CPU does nothing and waits in step 8 | write_bw.c 248–250, 349 |
//! | 8 | 108 | key message: the client finished | write_bw.c 250 (server), 396 (client) |
//! | 9 | 8, 8, 8, 8, 8 | report, five exchanges: size (`unsigned long`), iters (u64 when the peer ≥ 5.33), bw_peak, bw_avg, msgRate_avg (doubles); all big-endian | comm.c 1615–1707; write_bw.c 255, 401 |
//! | 10 | 108 | key message (closing barrier) | comm.c 1759–1766 |
//! | 11 | 5 | `done` + NUL: **each side writes, nobody reads**; then close | comm.c 1768–1778 |
//!
//! The key message, 107 characters and a NUL, all lower-case hex:
//! `%04x:%04x:%06x:%06x:%08x:%016llx:` (LID, out_reads, QPN, PSN, R_Key, VA) then 16 ×
//! `%02x:` (the GID's bytes in order) then `%08x:` (SRQ number) (comm.h 75–83). Its fields
//! are identical in all five exchanges. out_reads is 1 for `ib_write_bw` and the device's
//! outstanding-read limit (or `-o`) for `ib_read_bw` and `ib_atomic_bw`: each side uses the
//! peer's value as its own RTS `max_rd_atomic`. VA is where the peer may write / read /
//! operate; R_Key the key of that buffer.
//!
//! The bandwidth figures of the report are in the sender's units (MiB/s unless
//! `--report_gbits`, then Gb/s) and msgRate in Mpps; the Linux *server* prints the client's
//! report as its result, the client ignores the server's.
//!
//! # The Linux side
//!
//! - Linux serves: `ib_write_bw -d rxe0 -x <GID index of its ::ffff:IPv4 GID> -s SIZE -n ITERS`
//!   (no host), the unikernel is [`Role::Client`]; Linux is the client: the same plus the
//!   unikernel's address (`… 10.0.0.2`), the unikernel is [`Role::Server`] (listening before
//!   Linux starts: perftest's connect is tried once).
//! - `-q N` ([`Local::with_qps`], up to [`MAX_QPS`]): step 5 is each QP's key message in
//!   order, then after the QPs connect each QP's again (step 6) and the first's (step 7); the
//!   other barriers are the first QP's (`write_bw.c` 179–229).
//! - `-b` ([`run_bidirectional`]): both sides run the data phase, after a sync barrier where
//!   step 8 was; the reports are each side's own.
//! - The latency programs: [`run_latency`].
//! - Not supported here: `-R`/`-z` (rdma_cm; `crate::cm_peer` speaks it), `--report-per-port`
//!   (four more doubles in step 9), and `--dont_xchg_versions` (6.06 then compares an empty
//!   version with 5.70 and exits).
//! - `-m` is optional: the agreed MTU is the smaller of both ([`Agreed::mtu`]); rxe's active
//!   MTU on a 1500-byte link is 1024 (`3`).
//! - Sizes and counts are never exchanged: the unikernel runs what the Linux side was given.

use bareverbs::verbs::Gid;
use bareverbs_hal::Link;

use super::pingpong::finish;
use super::stack::{Retry, Stack};
use super::{Error, Field, FlowError, field, is_ipv4_mapped, put_hex};

/// Bytes of the key message, NUL included.
pub const KEY_LEN: usize = 108;
/// Bytes of the version message.
pub const VERSION_LEN: usize = 16;
/// The version the unikernel announces.
pub const VERSION: &str = "6.06";
/// The oldest peer version perftest 6.06 works with, in hundredths.
pub const MIN_VERSION: u32 = 570;
/// What each side writes last.
pub const DONE: &[u8; 5] = b"done\0";

/// One QP's data, as the key message carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// RDMA reads / atomics this side accepts in flight (the peer's `max_rd_atomic`).
    pub out_reads: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial PSN (24 bits).
    pub psn: u32,
    /// R_Key of the buffer the peer targets.
    pub rkey: u32,
    /// Its virtual address.
    pub vaddr: u64,
    /// GID, bytes in network order.
    pub gid: Gid,
    /// SRQ number (XRC/DC only; 0 otherwise).
    pub srqn: u32,
}

impl Key {
    /// The 108-byte message. [`Error::Malformed`] for a QPN or PSN above 24 bits.
    pub fn encode(&self) -> Result<[u8; KEY_LEN], Error> {
        if self.qpn > 0xFF_FFFF {
            return Err(Error::Malformed(Field::Qpn));
        }
        if self.psn > 0xFF_FFFF {
            return Err(Error::Malformed(Field::Psn));
        }
        let mut m = [b':'; KEY_LEN];
        put_hex(&mut m[0..4], self.lid.into());
        put_hex(&mut m[5..9], self.out_reads.into());
        put_hex(&mut m[10..16], self.qpn.into());
        put_hex(&mut m[17..23], self.psn.into());
        put_hex(&mut m[24..32], self.rkey.into());
        put_hex(&mut m[33..49], self.vaddr);
        for (i, b) in self.gid.0.iter().enumerate() {
            put_hex(&mut m[50 + 3 * i..52 + 3 * i], (*b).into());
        }
        put_hex(&mut m[98..106], self.srqn.into());
        m[KEY_LEN - 1] = 0;
        Ok(m)
    }

    /// Parses a 108-byte key message (hex digits in either case).
    pub fn parse(m: &[u8]) -> Result<Key, Error> {
        if m.len() != KEY_LEN {
            return Err(Error::Malformed(Field::Length));
        }
        if m[KEY_LEN - 1] != 0 {
            return Err(Error::Malformed(Field::Terminator));
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = field(m, 50 + 3 * i, 2, true, Field::Gid)? as u8;
        }
        Ok(Key {
            lid: field(m, 0, 4, true, Field::Lid)? as u16,
            out_reads: field(m, 5, 4, true, Field::OutReads)? as u16,
            qpn: field(m, 10, 6, true, Field::Qpn)? as u32,
            psn: field(m, 17, 6, true, Field::Psn)? as u32,
            rkey: field(m, 24, 8, true, Field::Rkey)? as u32,
            vaddr: field(m, 33, 16, true, Field::Vaddr)?,
            gid: Gid(gid),
            srqn: field(m, 98, 8, true, Field::Srqn)? as u32,
        })
    }
}

/// Parses a version message (the text before the first NUL, as `atof` reads `"6.06"`) into
/// hundredths: `"6.06"` → 606, `"5.7"` → 570.
pub fn parse_version(m: &[u8]) -> Result<u32, Error> {
    let bad = Error::Malformed(Field::Version);
    let text = m.split(|&b| b == 0).next().unwrap_or(&[]);
    if text.len() == m.len() {
        // No NUL within the 16 bytes.
        return Err(bad);
    }
    let (int, frac) = match text.iter().position(|&b| b == b'.') {
        Some(p) => (&text[..p], &text[p + 1..]),
        None => (text, &[][..]),
    };
    let digits = |s: &[u8]| !s.is_empty() && s.len() <= 4 && s.iter().all(u8::is_ascii_digit);
    if !digits(int) || !(frac.is_empty() || frac.iter().all(u8::is_ascii_digit)) {
        return Err(bad);
    }
    let n = |s: &[u8]| s.iter().fold(0u32, |n, &c| n * 10 + u32::from(c - b'0'));
    let f0 = frac.first().map_or(0, |&c| u32::from(c - b'0'));
    let f1 = frac.get(1).map_or(0, |&c| u32::from(c - b'0'));
    Ok(n(int) * 100 + f0 * 10 + f1)
}

/// QPs a bandwidth test may have (perftest's `-q`).
pub const MAX_QPS: usize = 4;

/// This side's part of the exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Local {
    /// The key message of each QP (the first `qps`), in order; the first QP's is the one
    /// of the barriers.
    pub keys: [Key; MAX_QPS],
    /// QPs (`-q`, 1 to [`MAX_QPS`]; a latency test has one).
    pub qps: usize,
    /// The path MTU as the `ibv_mtu` enum (1 = 256 … 5 = 4096).
    pub mtu: u8,
    /// Page size announced (perftest's `cycle_buffer`).
    pub page_size: u32,
    /// Cache line size announced.
    pub cache_line: u32,
}

impl Local {
    /// One QP's `key` with MTU 1024 (`3`), page size 4096 and a 64-byte cache line.
    pub fn new(key: Key) -> Self {
        Local {
            keys: [key; MAX_QPS],
            qps: 1,
            mtu: 3,
            page_size: 4096,
            cache_line: 64,
        }
    }

    /// As [`Local::new`] with a QP per key (`-q keys.len()`); `None` for none or more than
    /// [`MAX_QPS`].
    pub fn with_qps(keys: &[Key]) -> Option<Self> {
        let first = *keys.first()?;
        if keys.len() > MAX_QPS {
            return None;
        }
        let mut l = Local::new(first);
        l.keys[..keys.len()].copy_from_slice(keys);
        l.qps = keys.len();
        Some(l)
    }
}

/// What both sides settled on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agreed {
    /// The peer's version, in hundredths.
    pub peer_version: u32,
    /// The larger page size.
    pub page_size: u32,
    /// The larger cache line.
    pub cache_line: u32,
    /// The smaller MTU (`ibv_mtu` enum): the path MTU both QPs use.
    pub mtu: u8,
}

/// The end-of-test report (perftest's `bw_report_data`, as exchanged).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Report {
    /// Message size in bytes.
    pub size: u64,
    /// Iterations measured.
    pub iters: u64,
    /// Peak bandwidth (MiB/s, or Gb/s with `--report_gbits`).
    pub bw_peak: f64,
    /// Average bandwidth (same unit).
    pub bw_avg: f64,
    /// Average message rate (Mpps).
    pub msg_rate: f64,
}

impl Report {
    /// The five words as exchanged, in order (the doubles' bits).
    pub fn words(&self) -> [u64; 5] {
        [
            self.size,
            self.iters,
            self.bw_peak.to_bits(),
            self.bw_avg.to_bits(),
            self.msg_rate.to_bits(),
        ]
    }

    /// The report from the five words.
    pub fn from_words(w: [u64; 5]) -> Report {
        Report {
            size: w[0],
            iters: w[1],
            bw_peak: f64::from_bits(w[2]),
            bw_avg: f64::from_bits(w[3]),
            msg_rate: f64::from_bits(w[4]),
        }
    }
}

/// Where the RoCE code takes over during the exchange.
pub trait Hooks {
    /// The hooks' error.
    type Error;

    /// After the first key exchange: move the QP to RTR (path MTU `agreed.mtu`, the peer's
    /// QPN and PSN, `max_dest_rd_atomic` = own out_reads, GRH to `peer.gid`) and RTS (own PSN,
    /// `max_rd_atomic` = `peer.out_reads`). The peer may send as soon as the next two
    /// barriers are through, so post receives / expose the buffer here too.
    /// With `-q N` the peer's keys of all N QPs, in order: QP `i` connects to `peers[i]`.
    fn connect(&mut self, peers: &[Key], agreed: &Agreed) -> Result<(), Self::Error>;

    /// The data phase. As the client: run the test (WRITEs, READs or atomics to
    /// `peer.vaddr` with `peer.rkey`) and return the report the Linux server prints. As the
    /// server: called once the client said it finished (step 8); return this side's report (the
    /// Linux client ignores it).
    fn data_phase(&mut self, peers: &[Key]) -> Result<Report, Self::Error>;
}

/// Which side the unikernel plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The unikernel connects; the Linux program serves at `server`.
    Client {
        /// The Linux side's IPv4 address.
        server: [u8; 4],
        /// Connection attempts while the Linux side is not up yet.
        retry: Retry,
    },
    /// The unikernel listens; the Linux program connects.
    Server,
}

/// What the exchange gave.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    /// The peer's key message (its first QP's).
    pub peer: Key,
    /// Its key messages of every QP (the first [`Local::qps`]).
    pub peers: [Key; MAX_QPS],
    /// The settled parameters.
    pub agreed: Agreed,
    /// The peer's report.
    pub peer_report: Report,
}

/// One step: the client writes `mine` then reads `theirs` whole; the server the other way.
fn xchg<L: Link>(
    stack: &mut Stack<'_, L>,
    client: bool,
    mine: &[u8],
    theirs: &mut [u8],
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<(), Error> {
    if client {
        stack.write_message(mine, deadline, now)?;
        stack.read_exact(theirs, deadline, now)
    } else {
        stack.read_exact(theirs, deadline, now)?;
        stack.write_message(mine, deadline, now)
    }
}

/// Runs the whole exchange of one bandwidth test on `port` in `role` (see the module docs
/// for the order), calling `hooks` where the QP is connected and where the data phase
/// runs. `deadline` bounds all of it, the data phase included. On any failure the
/// connection is reset.
pub fn run<L: Link, H: Hooks>(
    stack: &mut Stack<'_, L>,
    role: Role,
    port: u16,
    local: &Local,
    hooks: &mut H,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<Outcome, FlowError<H::Error>> {
    run_flow(
        stack, role, port, local, hooks, None, false, false, deadline, now,
    )
}

/// The exchange of a bidirectional bandwidth test (`-b`: `ib_write_bw -b`), where both sides
/// run the test at once: as [`run`] to the barrier after the QPs reach RTR, then a barrier
/// more (the duplex sync), [`Hooks::data_phase`] on both sides, no "finished" barrier (step
/// 8), the five report words each way (each side's own; Linux prints the sum), the closing
/// barrier and `done` (`write_bw.c`: the duplex sync before `run_iter_bw`, the finished
/// barrier only for a client that is not duplex).
pub fn run_bidirectional<L: Link, H: Hooks>(
    stack: &mut Stack<'_, L>,
    role: Role,
    port: u16,
    local: &Local,
    hooks: &mut H,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<Outcome, FlowError<H::Error>> {
    run_flow(
        stack, role, port, local, hooks, None, true, false, deadline, now,
    )
}

/// The exchange of `ib_read_lat` and `ib_atomic_lat` ([`Latency::ReadAtomic`]).
pub fn run_lat<L: Link, H: Hooks>(
    stack: &mut Stack<'_, L>,
    role: Role,
    port: u16,
    local: &Local,
    hooks: &mut H,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<Outcome, FlowError<H::Error>> {
    run_latency(
        stack,
        role,
        port,
        local,
        hooks,
        Latency::ReadAtomic,
        deadline,
        now,
    )
}

/// Which latency program's exchange (`read_lat.c`, `atomic_lat.c`, `write_lat.c`,
/// `send_lat.c` of the same tag, one QP). They differ from a bandwidth test's in having no
/// step 8 or 9 (no "finished" barrier, no reports), and among themselves in how many key
/// messages go before and after the QPs connect, who runs a data phase, and whether a
/// closing barrier and `done` end it.
///
/// | program | keys before connecting | keys after | data phase | closing barrier, `done` |
/// |---|---|---|---|---|
/// | `ib_read_lat`, `ib_atomic_lat` | 2 (the test's, then the QP's) | 2 | the client only | yes |
/// | `ib_write_lat` | 2 | 2 | both sides (ping-pong) | no: each side just ends |
/// | `ib_send_lat` | 1 (the QP's) | 3 (the last once the receives are posted) | both sides (ping-pong) | yes |
///
/// In the ping-pong of `ib_write_lat` the **server** writes first; in `ib_send_lat` the
/// **client** sends first (`run_iter_lat_write` and `run_iter_lat_send` in
/// `perftest_resources.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Latency {
    /// `ib_read_lat`, `ib_atomic_lat`: the client READs or operates, the server's CPU waits.
    ReadAtomic,
    /// `ib_write_lat`: RDMA WRITEs each way, each side polling the last byte of its buffer.
    Write,
    /// `ib_send_lat`: SENDs each way.
    Send,
}

impl Latency {
    /// Key messages before and after the QPs connect.
    fn keys(self) -> (usize, usize) {
        match self {
            Latency::ReadAtomic | Latency::Write => (2, 2),
            Latency::Send => (1, 3),
        }
    }
}

/// The exchange of a latency program (see [`Latency`] for how they differ). The client's
/// test (and with `ib_write_lat` and `ib_send_lat` the server's part of the ping-pong) runs in
/// [`Hooks::data_phase`] after the last barrier; [`Outcome::peer_report`] is empty. With
/// [`Latency::ReadAtomic`] the server goes straight to the closing barrier, which the client
/// reaches once it finished, so the server's CPU does nothing meanwhile, and its
/// [`Hooks::data_phase`] is not called.
#[allow(clippy::too_many_arguments)]
pub fn run_latency<L: Link, H: Hooks>(
    stack: &mut Stack<'_, L>,
    role: Role,
    port: u16,
    local: &Local,
    hooks: &mut H,
    which: Latency,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<Outcome, FlowError<H::Error>> {
    run_flow(
        stack,
        role,
        port,
        local,
        hooks,
        Some(which),
        false,
        false,
        deadline,
        now,
    )
}

/// The exchange of `ib_send_bw` (`send_bw.c` of the same tag): each QP's key before the QPs
/// connect, then the first's, each QP's again, and (the receives posted) a sync barrier on
/// the first's; the data phase on both sides ([`Hooks::data_phase`]: the client SENDs, the
/// server receives; with `duplex`, `-b`, both), the reports only with `duplex` (each side's
/// own), the closing barrier and `done`. No "finished" barrier.
#[allow(clippy::too_many_arguments)]
pub fn run_send<L: Link, H: Hooks>(
    stack: &mut Stack<'_, L>,
    role: Role,
    port: u16,
    local: &Local,
    hooks: &mut H,
    duplex: bool,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<Outcome, FlowError<H::Error>> {
    run_flow(
        stack, role, port, local, hooks, None, duplex, true, deadline, now,
    )
}

#[allow(clippy::too_many_arguments)]
fn run_flow<L: Link, H: Hooks>(
    stack: &mut Stack<'_, L>,
    role: Role,
    port: u16,
    local: &Local,
    hooks: &mut H,
    lat: Option<Latency>,
    duplex: bool,
    send: bool,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<Outcome, FlowError<H::Error>> {
    let n = local.qps;
    // A latency test has one QP.
    if !(1..=MAX_QPS).contains(&n) || (lat.is_some() && n != 1) {
        return Err(Error::Malformed(Field::Qpn).into());
    }
    let mut keys = [[0u8; KEY_LEN]; MAX_QPS];
    for (m, k) in keys.iter_mut().zip(&local.keys[..n]) {
        *m = k.encode()?;
    }
    let key = keys[0];
    if !(1..=5).contains(&local.mtu) {
        return Err(Error::Malformed(Field::Mtu).into());
    }
    let client = matches!(role, Role::Client { .. });
    let r = (|| {
        match role {
            Role::Client { server, retry } => stack.connect(server, port, retry, deadline, now)?,
            Role::Server => {
                stack.accept(port, deadline, now)?;
            }
        }
        let mut x = |stack: &mut Stack<'_, L>, mine: &[u8], theirs: &mut [u8]| {
            xchg(stack, client, mine, theirs, deadline, now)
        };
        // 1. Versions.
        let mut version = [0u8; VERSION_LEN];
        version[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let mut theirs = [0u8; VERSION_LEN];
        x(stack, &version, &mut theirs)?;
        let peer_version = parse_version(&theirs)?;
        if peer_version < MIN_VERSION {
            return Err(Error::Version(peer_version).into());
        }
        // 2, 3. Page size and cache line, big-endian; the larger wins.
        let mut w = [0u8; 4];
        x(stack, &local.page_size.to_be_bytes(), &mut w)?;
        let page_size = local.page_size.max(u32::from_be_bytes(w));
        x(stack, &local.cache_line.to_be_bytes(), &mut w)?;
        let cache_line = local.cache_line.max(u32::from_be_bytes(w));
        // 4. MTU, "3\0"; the smaller wins.
        let mut m = [0u8; 2];
        x(stack, &[b'0' + local.mtu, 0], &mut m)?;
        if !(b'1'..=b'5').contains(&m[0]) || m[1] != 0 {
            return Err(Error::Malformed(Field::Mtu).into());
        }
        let agreed = Agreed {
            peer_version,
            page_size,
            cache_line,
            mtu: local.mtu.min(m[0] - b'0'),
        };
        // 5. The key messages (ib_read_lat, ib_atomic_lat, ib_write_lat: the test's, then
        // the QP's; a bandwidth test: each QP's); then connect.
        let mut k = [0u8; KEY_LEN];
        let mut peers = [Key::parse(&key)?; MAX_QPS];
        let peer = if let Some(which) = lat {
            let (before, _) = which.keys();
            x(stack, &key, &mut k)?;
            let peer = Key::parse(&k)?;
            for _ in 1..before {
                x(stack, &key, &mut k)?;
                // The same QP's every time.
                if Key::parse(&k)? != peer {
                    return Err(Error::Malformed(Field::Qpn).into());
                }
            }
            peers[0] = peer;
            peer
        } else {
            for (mine, theirs) in keys[..n].iter().zip(peers.iter_mut()) {
                x(stack, mine, &mut k)?;
                *theirs = Key::parse(&k)?;
            }
            peers[0]
        };
        if is_ipv4_mapped(&peer.gid.0) != is_ipv4_mapped(&local.keys[0].gid.0) {
            return Err(Error::GidFamily.into());
        }
        hooks
            .connect(&peers[..n], &agreed)
            .map_err(FlowError::Hook)?;
        if send {
            // The first QP's key, each QP's, the sync (the receives are posted by now).
            x(stack, &key, &mut k)?;
            Key::parse(&k)?;
            for mine in &keys[..n] {
                x(stack, mine, &mut k)?;
                Key::parse(&k)?;
            }
            x(stack, &key, &mut k)?;
            Key::parse(&k)?;
            let report = hooks.data_phase(&peers[..n]).map_err(FlowError::Hook)?;
            let mut words = [0u64; 5];
            if duplex {
                for (mine, theirs) in report.words().iter().zip(words.iter_mut()) {
                    let mut b = [0u8; 8];
                    x(stack, &mine.to_be_bytes(), &mut b)?;
                    *theirs = u64::from_be_bytes(b);
                }
            }
            x(stack, &key, &mut k)?;
            Key::parse(&k)?;
            stack.write_message(DONE, deadline, now)?;
            return Ok(Outcome {
                peer,
                peers,
                agreed,
                peer_report: Report::from_words(words),
            });
        }
        // 6, 7. Each QP's key again (a bandwidth test), then the barrier after RTR: the
        // first QP's (the same messages; they must still parse).
        let after = match lat {
            Some(which) => which.keys().1,
            None => {
                for mine in &keys[..n] {
                    x(stack, mine, &mut k)?;
                    Key::parse(&k)?;
                }
                1
            }
        };
        for _ in 0..after {
            x(stack, &key, &mut k)?;
            Key::parse(&k)?;
        }
        if let Some(which) = lat {
            // The test, then straight to the closing barrier: no step 8 or 9.
            if client || which != Latency::ReadAtomic {
                hooks.data_phase(&peers[..1]).map_err(FlowError::Hook)?;
            }
            if which != Latency::Write {
                x(stack, &key, &mut k)?;
                Key::parse(&k)?;
                stack.write_message(DONE, deadline, now)?;
            }
            return Ok(Outcome {
                peer,
                peers,
                agreed,
                peer_report: Report::default(),
            });
        }
        // The data phase, and 8: the client's "finished" (bidirectional: a sync before the
        // data phase instead).
        let report = if duplex {
            x(stack, &key, &mut k)?;
            hooks.data_phase(&peers[..n]).map_err(FlowError::Hook)?
        } else if client {
            let r = hooks.data_phase(&peers[..n]).map_err(FlowError::Hook)?;
            x(stack, &key, &mut k)?;
            r
        } else {
            x(stack, &key, &mut k)?;
            hooks.data_phase(&peers[..n]).map_err(FlowError::Hook)?
        };
        Key::parse(&k)?;
        // 9. Reports, five words.
        let mut words = [0u64; 5];
        for (mine, theirs) in report.words().iter().zip(words.iter_mut()) {
            let mut b = [0u8; 8];
            x(stack, &mine.to_be_bytes(), &mut b)?;
            *theirs = u64::from_be_bytes(b);
        }
        // 10, 11. The closing barrier and "done" (the peer's "done" is drained by the close).
        x(stack, &key, &mut k)?;
        Key::parse(&k)?;
        stack.write_message(DONE, deadline, now)?;
        Ok(Outcome {
            peer,
            peers,
            agreed,
            peer_report: Report::from_words(words),
        })
    })();
    finish(stack, r, deadline, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Key {
        Key {
            lid: 0,
            out_reads: 0x80,
            qpn: 0x11,
            psn: 0xAB_CDEF,
            rkey: 0x1234_5678,
            vaddr: 0x7F12_3456_7000,
            gid: Gid::from_ipv4([10, 0, 0, 1]),
            srqn: 0,
        }
    }

    #[test]
    fn key_encodes_the_c_layout() {
        let m = sample().encode().unwrap();
        let text = "0000:0080:000011:abcdef:12345678:00007f1234567000:\
                    00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01:00000000:";
        assert_eq!(text.len(), 107);
        assert_eq!(&m[..107], text.as_bytes());
        assert_eq!(m[107], 0);
        assert_eq!(Key::parse(&m), Ok(sample()));
    }

    #[test]
    fn key_rejects_malformed() {
        let good = sample().encode().unwrap();
        let bad = |at: usize, b: u8| {
            let mut m = good;
            m[at] = b;
            Key::parse(&m)
        };
        assert_eq!(Key::parse(&good[1..]), Err(Error::Malformed(Field::Length)));
        assert_eq!(bad(107, b'x'), Err(Error::Malformed(Field::Terminator)));
        assert_eq!(bad(4, b'.'), Err(Error::Malformed(Field::Separator)));
        assert_eq!(bad(0, b'z'), Err(Error::Malformed(Field::Lid)));
        assert_eq!(bad(6, b'z'), Err(Error::Malformed(Field::OutReads)));
        assert_eq!(bad(12, b'z'), Err(Error::Malformed(Field::Qpn)));
        assert_eq!(bad(20, b'z'), Err(Error::Malformed(Field::Psn)));
        assert_eq!(bad(30, b'z'), Err(Error::Malformed(Field::Rkey)));
        assert_eq!(bad(40, b'z'), Err(Error::Malformed(Field::Vaddr)));
        assert_eq!(bad(51, b'z'), Err(Error::Malformed(Field::Gid)));
        assert_eq!(bad(97, b'.'), Err(Error::Malformed(Field::Separator)));
        assert_eq!(bad(100, b'z'), Err(Error::Malformed(Field::Srqn)));
    }

    #[test]
    fn versions() {
        let v = |s: &[u8]| {
            let mut m = [0u8; VERSION_LEN];
            m[..s.len()].copy_from_slice(s);
            parse_version(&m)
        };
        assert_eq!(v(b"6.06"), Ok(606));
        assert_eq!(v(b"5.7"), Ok(570));
        assert_eq!(v(b"5.70"), Ok(570));
        assert_eq!(v(b"6"), Ok(600));
        assert_eq!(v(b""), Err(Error::Malformed(Field::Version)));
        assert_eq!(v(b"x.1"), Err(Error::Malformed(Field::Version)));
        assert_eq!(v(b"6.0a"), Err(Error::Malformed(Field::Version)));
        assert_eq!(
            parse_version(&[b'6'; VERSION_LEN]),
            Err(Error::Malformed(Field::Version))
        );
    }
}
