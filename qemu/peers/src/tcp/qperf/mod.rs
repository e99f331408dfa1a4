//! qperf's control connection (Debian's qperf 0.4.11-3), the server's side: what a Linux
//! `qperf <unikernel> -cm1 … rc_bw` sends on TCP port 19765 and what it expects back.
//! `docs/qperf.md` describes the protocol and each test; in short:
//!
//! | # | direction | bytes | content |
//! |---|---|---|---|
//! | 1 | client → server | 200 | the request ([`Request`]): every integer little-endian, no padding |
//! | 2 | server → client | 4 | with `-cm1` (RC tests): the port the server's rdma_cm listens on, u32 LE |
//! | — | | | the client connects its QP through the CM to that port |
//! | 3 | both ways | 40 | the node ([`Node`]): buffer address, R_Key, … (36 bytes, 4 of padding) |
//! | 4 | both ways | 27 | `synchronization before test`; each side's timer starts |
//! | — | | | the test, `-t` seconds (or `-n` messages) |
//! | 5 | server → client | 256 | the server's statistics ([`Stat`]; 252 bytes, 4 of padding) |
//! | 6 | client → server | 26 | `synchronization after test`; then the client disconnects the QP |
//!
//! Every step writes whole then reads (both sides write first where both write), so nothing
//! here depends on how the peer's messages are cut into segments. `quit` (`qperf <host> quit`)
//! is step 1, then step 4, then the client closes.

use super::Error as TcpError;

mod flow;

pub use flow::{ClientHooks, Failure, Hooks, quit, run_client, serve};

/// qperf's TCP port (`-lp`).
pub const PORT: u16 = 19765;
/// The version the request must carry: 0.4 (the increment is not compared, as qperf's own
/// server does not).
pub const VERSION: (u16, u16) = (0, 4);
/// Bytes of the request.
pub const REQ_LEN: usize = 200;
/// Bytes of a node message.
pub const NODE_LEN: usize = 40;
/// Bytes of the statistics message.
pub const STAT_LEN: usize = 256;
/// The synchronization before a test.
pub const SYNC_BEFORE: &[u8] = b"synchronization before test";
/// The synchronization after a test.
pub const SYNC_AFTER: &[u8] = b"synchronization after test";
/// The longest test the peer runs (`-t`, seconds).
pub const MAX_TIME_S: u32 = 60;
/// The largest message the peer takes (`-m`).
pub const MAX_MSG: u32 = 1 << 20;
/// The clock ticks per second the statistics count in.
pub const TICKS: u32 = 100;

/// The tests the peer runs, and `quit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// `quit`: the server exits.
    Quit,
    /// `rc_bw`: the client SENDs, the server receives.
    RcBw,
    /// `rc_lat`: one SEND each way per round, the client first.
    RcLat,
    /// `rc_rdma_read_bw`: the client READs the server's buffer.
    RcRdmaReadBw,
    /// `rc_rdma_write_bw`: the client WRITEs (with immediate) into the server's buffer.
    RcRdmaWriteBw,
    /// `rc_bi_bw`: both sides SEND at once, each receiving the other's.
    RcBiBw,
    /// `rc_rdma_write_lat`: one WRITE with immediate each way per round, the client first.
    RcRdmaWriteLat,
    /// `rc_rdma_write_poll_lat`: one WRITE each way per round, each side polling its buffer
    /// for the other's mark (no receives, no immediate).
    RcRdmaWritePollLat,
    /// `rc_rdma_read_lat`: the client READs the server's buffer, one READ at a time.
    RcRdmaReadLat,
    /// `rc_compare_swap_mr`: the client's compare-and-swaps (compare 0, swap 0) on the
    /// server's 8-byte buffer.
    RcCompareSwapMr,
    /// `rc_fetch_add_mr`: the client's fetch-and-adds (of 0) on the server's 8-byte buffer.
    RcFetchAddMr,
}

/// qperf's tests in the order of its table (a request carries the index): 0.4.11 built with
/// RDMA support. XRC's three come last only when built with them; the peer runs none.
pub const TESTS: [&str; 33] = [
    "conf",
    "quit",
    "rds_bw",
    "rds_lat",
    "sctp_bw",
    "sctp_lat",
    "sdp_bw",
    "sdp_lat",
    "tcp_bw",
    "tcp_lat",
    "udp_bw",
    "udp_lat",
    "rc_bi_bw",
    "rc_bw",
    "rc_compare_swap_mr",
    "rc_fetch_add_mr",
    "rc_lat",
    "rc_rdma_read_bw",
    "rc_rdma_read_lat",
    "rc_rdma_write_bw",
    "rc_rdma_write_lat",
    "rc_rdma_write_poll_lat",
    "uc_bi_bw",
    "uc_bw",
    "uc_lat",
    "uc_rdma_write_bw",
    "uc_rdma_write_lat",
    "uc_rdma_write_poll_lat",
    "ud_bi_bw",
    "ud_bw",
    "ud_lat",
    "ver_rc_compare_swap",
    "ver_rc_fetch_add",
];

impl Test {
    /// The test of a name (`rc_bw`), if the peer runs it.
    pub fn from_name(name: &str) -> Option<Test> {
        Some(match name {
            "quit" => Test::Quit,
            "rc_bw" => Test::RcBw,
            "rc_lat" => Test::RcLat,
            "rc_rdma_read_bw" => Test::RcRdmaReadBw,
            "rc_rdma_write_bw" => Test::RcRdmaWriteBw,
            "rc_bi_bw" => Test::RcBiBw,
            "rc_rdma_write_lat" => Test::RcRdmaWriteLat,
            "rc_rdma_write_poll_lat" => Test::RcRdmaWritePollLat,
            "rc_rdma_read_lat" => Test::RcRdmaReadLat,
            "rc_compare_swap_mr" => Test::RcCompareSwapMr,
            "rc_fetch_add_mr" => Test::RcFetchAddMr,
            _ => return None,
        })
    }

    /// Its name, as qperf's command line has it.
    pub fn name(self) -> &'static str {
        match self {
            Test::Quit => "quit",
            Test::RcBw => "rc_bw",
            Test::RcLat => "rc_lat",
            Test::RcRdmaReadBw => "rc_rdma_read_bw",
            Test::RcRdmaWriteBw => "rc_rdma_write_bw",
            Test::RcBiBw => "rc_bi_bw",
            Test::RcRdmaWriteLat => "rc_rdma_write_lat",
            Test::RcRdmaWritePollLat => "rc_rdma_write_poll_lat",
            Test::RcRdmaReadLat => "rc_rdma_read_lat",
            Test::RcCompareSwapMr => "rc_compare_swap_mr",
            Test::RcFetchAddMr => "rc_fetch_add_mr",
        }
    }

    /// An atomic test: qperf's client sends no message size (`-m` is not one of its
    /// options), both sides use an 8-byte buffer.
    pub fn atomic(self) -> bool {
        matches!(self, Test::RcCompareSwapMr | Test::RcFetchAddMr)
    }

    /// The message size qperf's client sends without `-m`: 64 KiB for the bandwidth tests,
    /// 1 byte for the latency ones, none (0) for the atomics.
    pub fn default_size(self) -> u32 {
        match self {
            Test::RcBw | Test::RcBiBw | Test::RcRdmaReadBw | Test::RcRdmaWriteBw => 64 * 1024,
            Test::RcCompareSwapMr | Test::RcFetchAddMr | Test::Quit => 0,
            _ => 1,
        }
    }
}

/// Why a request is refused, or the exchange failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The TCP exchange failed.
    Tcp(TcpError),
    /// Another major or minor version than 0.4 (major, minor, increment).
    Version(u16, u16, u16),
    /// A test index beyond qperf 0.4.11's table.
    Index(u16),
    /// A test the peer does not run (its name).
    Unsupported(&'static str),
    /// An RC test without `-cm1`: on RoCE qperf's own exchange gives no GID, and Linux
    /// refuses the QP's address without one.
    NoCm,
    /// An option the peer does not take, or a value out of its range (which).
    Option(&'static str),
    /// A synchronization message that is not qperf's.
    Sync,
    /// A CM port of 0 or beyond 16 bits from the server.
    Port(u32),
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Tcp(e) => write!(f, "{e}"),
            Error::Version(a, b, c) => write!(f, "qperf version {a}.{b}.{c}, not 0.4"),
            Error::Index(i) => write!(f, "test index {i} beyond qperf 0.4.11's table"),
            Error::Unsupported(t) => write!(f, "test {t} not run by this peer"),
            Error::NoCm => f.write_str("RC test without -cm1 (no GID on RoCE without the CM)"),
            Error::Option(o) => write!(f, "option {o} not taken"),
            Error::Sync => f.write_str("synchronization message not qperf's"),
            Error::Port(p) => write!(f, "CM port {p} from the server"),
        }
    }
}

impl From<TcpError> for Error {
    fn from(e: TcpError) -> Self {
        Error::Tcp(e)
    }
}

/// Little-endian reader over a fixed message.
struct Le<'b>(&'b [u8]);

impl Le<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let n = N.min(self.0.len());
        a[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        a
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

/// The client's request (qperf's `REQ`, its remote parameters: what `-t`, `-m`, `-cm1` … set
/// for the server).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Major, minor, incremental version.
    pub version: (u16, u16, u16),
    /// The test's index in [`TESTS`].
    pub index: u16,
    /// `-ar`: touch the data after receiving.
    pub access_recv: u32,
    /// `-a`: processor affinity.
    pub affinity: u32,
    /// `-ap`: alternate path port.
    pub alt_port: u32,
    /// `-f`: sender and receiver swapped.
    pub flip: u32,
    /// `-m`: message size (0: the test's default).
    pub msg_size: u32,
    /// `-mt`: path MTU (non-CM only).
    pub mtu_size: u32,
    /// `-n`: messages (0: time-based).
    pub no_msgs: u32,
    /// `-cp`: poll the CQ instead of waiting for events.
    pub poll_mode: u32,
    /// `-ip`: the port of the IP tests.
    pub port: u32,
    /// `-nr`: RDMA reads / atomics in flight.
    pub rd_atomic: u32,
    /// `-sl`: service level.
    pub sl: u32,
    /// `-sb`: socket buffer size.
    pub sock_buf_size: u32,
    /// `-sp`: source path bits.
    pub src_path_bits: u32,
    /// `-t`: seconds.
    pub time: u32,
    /// `-to`: seconds a control message may take.
    pub timeout: u32,
    /// `-cm`: connect through rdma_cm.
    pub use_cm: u32,
    /// `-i`: device (and port), NUL-padded.
    pub id: [u8; 64],
    /// `-sr`: static rate, NUL-padded.
    pub static_rate: [u8; 64],
}

impl Request {
    /// What qperf 0.4.11's client sends for `test` with `-cm1 -m msg_size -t time -to
    /// timeout`: every other parameter zero (its defaults), the strings empty.
    pub fn new(test: Test, msg_size: u32, time: u32, timeout: u32) -> Request {
        let index = TESTS.iter().position(|&t| t == test.name()).unwrap_or(0);
        Request {
            version: (0, 4, 11),
            index: index as u16,
            access_recv: 0,
            affinity: 0,
            alt_port: 0,
            flip: 0,
            msg_size,
            mtu_size: 0,
            no_msgs: 0,
            poll_mode: 0,
            port: 0,
            rd_atomic: 0,
            sl: 0,
            sock_buf_size: 0,
            src_path_bits: 0,
            time,
            timeout,
            use_cm: u32::from(test != Test::Quit),
            id: [0; 64],
            static_rate: [0; 64],
        }
    }

    /// Decodes the 200 bytes (every one has a meaning; nothing to reject here).
    pub fn decode(b: &[u8; REQ_LEN]) -> Request {
        let mut r = Le(b);
        Request {
            version: (r.u16(), r.u16(), r.u16()),
            index: r.u16(),
            access_recv: r.u32(),
            affinity: r.u32(),
            alt_port: r.u32(),
            flip: r.u32(),
            msg_size: r.u32(),
            mtu_size: r.u32(),
            no_msgs: r.u32(),
            poll_mode: r.u32(),
            port: r.u32(),
            rd_atomic: r.u32(),
            sl: r.u32(),
            sock_buf_size: r.u32(),
            src_path_bits: r.u32(),
            time: r.u32(),
            timeout: r.u32(),
            use_cm: r.u32(),
            id: r.take(),
            static_rate: r.take(),
        }
    }

    /// Encodes it as qperf's client does (for tests).
    pub fn encode(&self) -> [u8; REQ_LEN] {
        let mut b = [0u8; REQ_LEN];
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            b[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        for v in [self.version.0, self.version.1, self.version.2, self.index] {
            put(&v.to_le_bytes());
        }
        for v in [
            self.access_recv,
            self.affinity,
            self.alt_port,
            self.flip,
            self.msg_size,
            self.mtu_size,
            self.no_msgs,
            self.poll_mode,
            self.port,
            self.rd_atomic,
            self.sl,
            self.sock_buf_size,
            self.src_path_bits,
            self.time,
            self.timeout,
            self.use_cm,
        ] {
            put(&v.to_le_bytes());
        }
        put(&self.id);
        put(&self.static_rate);
        b
    }

    /// The test it asks for, if the peer runs it with these parameters: version 0.4, an RC
    /// test with `-cm1` (or `quit`), no flip (`-f`), no alternate path, a message of 1 byte
    /// to [`MAX_MSG`] (any up to it for the atomics, whose buffer is 8 bytes whatever it
    /// says), 1 to [`MAX_TIME_S`] seconds unless counted (`-n`, `rc_bw` only).
    pub fn test(&self) -> Result<Test, Error> {
        let (maj, min, inc) = self.version;
        if (maj, min) != VERSION {
            return Err(Error::Version(maj, min, inc));
        }
        let name = *TESTS
            .get(usize::from(self.index))
            .ok_or(Error::Index(self.index))?;
        let test = Test::from_name(name).ok_or(Error::Unsupported(name))?;
        if test == Test::Quit {
            return Ok(test);
        }
        if self.use_cm != 1 {
            return Err(Error::NoCm);
        }
        if self.flip != 0 {
            return Err(Error::Option("-f (flip)"));
        }
        if self.alt_port != 0 {
            return Err(Error::Option("-ap (alternate path)"));
        }
        let least = u32::from(!test.atomic());
        if !(least..=MAX_MSG).contains(&self.msg_size) {
            return Err(Error::Option("-m (message size)"));
        }
        if self.no_msgs != 0 && test != Test::RcBw {
            return Err(Error::Option("-n (qperf counts only rc_bw's messages)"));
        }
        if self.no_msgs == 0 && !(1..=MAX_TIME_S).contains(&self.time) {
            return Err(Error::Option("-t (seconds)"));
        }
        Ok(test)
    }
}

/// One side's node message (qperf's `NODE`): with `-cm1` only the buffer's address and key
/// matter (the CM carries the QP numbers and PSNs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Node {
    /// The buffer's address.
    pub vaddr: u64,
    /// LID (0 on RoCE).
    pub lid: u32,
    /// QP number (0 with the CM).
    pub qpn: u32,
    /// PSN (0 with the CM).
    pub psn: u32,
    /// SRQ number (XRC only).
    pub srqn: u32,
    /// The buffer's R_Key.
    pub rkey: u32,
    /// Alternate path LID.
    pub alt_lid: u32,
    /// READs / atomics this side takes in flight (the device's limit).
    pub rd_atomic: u32,
}

impl Node {
    /// The 40 bytes (the last 4: the structure's padding, zero here).
    pub fn encode(&self) -> [u8; NODE_LEN] {
        let mut b = [0u8; NODE_LEN];
        b[..8].copy_from_slice(&self.vaddr.to_le_bytes());
        let words = [
            self.lid,
            self.qpn,
            self.psn,
            self.srqn,
            self.rkey,
            self.alt_lid,
            self.rd_atomic,
        ];
        for (i, w) in words.iter().enumerate() {
            b[8 + 4 * i..12 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// Decodes one (the padding ignored, as qperf does: its bytes are whatever its stack held).
    pub fn decode(b: &[u8; NODE_LEN]) -> Node {
        let mut r = Le(b);
        Node {
            vaddr: r.u64(),
            lid: r.u32(),
            qpn: r.u32(),
            psn: r.u32(),
            srqn: r.u32(),
            rkey: r.u32(),
            alt_lid: r.u32(),
            rd_atomic: r.u32(),
        }
    }
}

/// Bytes, messages and errors one way (qperf's `USTAT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Bytes.
    pub bytes: u64,
    /// Messages.
    pub msgs: u64,
    /// Errors.
    pub errs: u64,
}

/// The server's statistics (qperf's `STAT`) as the peer fills them: one CPU, [`TICKS`] a
/// second, the test's real time in ticks (no CPU times: the client then shows no CPU use
/// for the server), what it sent and received.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// Most completions one poll of the CQ returned.
    pub max_cqes: u32,
    /// The test's length in milliseconds.
    pub elapsed_ms: u64,
    /// What this side sent.
    pub sent: Counts,
    /// What this side received.
    pub received: Counts,
}

impl Stat {
    /// The 256 bytes: `no_cpus`, `no_ticks`, `max_cqes` (u32), 9 start and 9 end times
    /// (u64: real, user, nice, kernel, idle, iowait, irq, softirq, steal), then send,
    /// receive, remote send, remote receive counts (3 × u64 each), 4 bytes of padding.
    pub fn encode(&self) -> [u8; STAT_LEN] {
        let mut b = [0u8; STAT_LEN];
        b[0..4].copy_from_slice(&1u32.to_le_bytes());
        b[4..8].copy_from_slice(&TICKS.to_le_bytes());
        b[8..12].copy_from_slice(&self.max_cqes.to_le_bytes());
        // time_s[..] all 0; time_e[real] the elapsed ticks.
        let end = 12 + 9 * 8;
        let ticks = self.elapsed_ms * u64::from(TICKS) / 1000;
        b[end..end + 8].copy_from_slice(&ticks.to_le_bytes());
        let counts = 12 + 18 * 8;
        for (i, c) in [self.sent, self.received].iter().enumerate() {
            let at = counts + 24 * i;
            b[at..at + 8].copy_from_slice(&c.bytes.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&c.msgs.to_le_bytes());
            b[at + 16..at + 24].copy_from_slice(&c.errs.to_le_bytes());
        }
        b
    }

    /// Decodes a peer's statistics: its most CQEs per poll, its real time (its end less its
    /// start, in its own ticks: 0 when it gives no ticks), what it sent and received. Every
    /// value is the peer's: nothing here is sized or looped by them.
    pub fn decode(b: &[u8; STAT_LEN]) -> Stat {
        let mut r = Le(b);
        let _cpus = r.u32();
        let ticks = r.u32();
        let max_cqes = r.u32();
        // Packed, as qperf encodes it: the start times from byte 12, the end times from 84.
        let start = r.u64();
        let mut e = Le(&b[12 + 9 * 8..]);
        let end = e.u64();
        let mut c = Le(&b[12 + 18 * 8..]);
        let mut counts = || Counts {
            bytes: c.u64(),
            msgs: c.u64(),
            errs: c.u64(),
        };
        let sent = counts();
        let received = counts();
        let elapsed_ms = match ticks {
            0 => 0,
            t => end.saturating_sub(start).saturating_mul(1000) / u64::from(t),
        };
        Stat {
            max_cqes,
            elapsed_ms,
            sent,
            received,
        }
    }
}

#[cfg(test)]
mod tests;
