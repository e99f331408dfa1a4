//! The address layer: the TCP exchange that unmodified Linux RDMA test programs run before
//! any RDMA traffic, answered by the unikernel itself over the NIC its software RoCE device
//! uses.
//!
//! `ibv_rc_pingpong`, `ibv_ud_pingpong` (rdma-core 44.0) and perftest's `ib_write_bw`,
//! `ib_read_bw`, `ib_atomic_bw` (perftest 4.5-0.17, version "6.06") swap their QP numbers,
//! PSNs, GIDs and memory keys over TCP port 18515. The RoCE port hands every frame that is
//! not RoCE (ARP included) to "the IP stack": a [`Link`](bareverbs_hal::Link) that is the
//! stack's view of the NIC. This module is that stack and the two protocols:
//!
//! - [`device`](crate::tcp::device): smoltcp's `phy::Device` over any `Link` (fixed frame buffers, no heap; a busy
//!   transmit ring defers the frame instead of losing it).
//! - [`stack`](crate::tcp::stack): [`Stack`](crate::tcp::Stack), one IPv4 interface (static address, default 10.0.0.2/24) with one
//!   TCP socket: accept one connection, connect with bounded retries, read exactly N bytes,
//!   write a message in one segment, close. Every wait ends at the caller's deadline.
//! - [`pingpong`](crate::tcp::pingpong): the 52-byte `LLLL:QQQQQQ:PPPPPP:<32 hex>` message and the exchange in both
//!   roles (the same for rc and ud).
//! - [`perftest`](crate::tcp::perftest): perftest's socket-mode exchange (version, page size, cache line, MTU, the
//!   108-byte key message, barriers, reports, `done`) in both roles.
//!
//! smoltcp 0.14 runs without `alloc`: the socket slot and the TCP buffers live in a
//! [`Storage`](crate::tcp::Storage) the caller lends, the frame buffers in the device, the interface's tables are
//! fixed-size.
//!
//! # Clock and idle hook
//!
//! Nothing here has a clock or a thread. Every blocking call takes `deadline` (milliseconds)
//! and `now: &mut dyn FnMut() -> u64`, which it calls once per polling round: return the time
//! in milliseconds, and do there whatever else must go on meanwhile — poll the software RoCE
//! device (its transport runs from its own calls, and perftest's server waits here while the
//! Linux client's RDMA traffic flows), or halt until the next interrupt.
//!
//! # Next to the RoCE port
//!
//! - The stack's address is the RoCE port's IPv4 address: the GID in every message is
//!   `::ffff:` + that address, and rxe checks RoCE packets against it.
//! - The port answers ARP requests itself and then passes them on; smoltcp answers them too
//!   (two identical replies, harmless) and learns the asker, so the first SYN needs no ARP.
//! - Listen ([`Stack::listen`](crate::tcp::Stack::listen)) before a Linux client starts: the C
//!   clients connect once and give up on a reset.
//! - After a flow returns, polling the stack now and then (from the same idle hook) lets TCP
//!   finish the close (a lost last ACK is then repeated); nothing depends on it.
//!
//! # Usage sketch
//!
//! ```ignore
//! use bareverbs_unikernel::tcp::{self, Stack, Storage, NetConfig, pingpong, perftest};
//!
//! let mut storage = Storage::new();
//! let mut net = Stack::new(ip_link, &mut storage, NetConfig::default(), clock_ms())?;
//! let mut now = || { roce.poll(); clock_ms() };   // the idle hook
//! let deadline = clock_ms() + 120_000;
//!
//! // ibv_rc_pingpong as the client (`ibv_rc_pingpong -g 1 10.0.0.2`): the unikernel serves,
//! // and moves its QP to RTR/RTS before it replies, as the C server does.
//! let me = pingpong::Dest { lid: 0, qpn: qp.qp_num(), psn, gid: port_gid };
//! let peer = pingpong::serve(&mut net, tcp::PORT, &me, deadline, &mut now, |peer| {
//!     connect_qp(&mut qp, peer)                       // INIT → RTR → RTS
//! })?;
//!
//! // ibv_rc_pingpong as the server: the unikernel connects (with retries), then moves its QP.
//! let peer = pingpong::connect(&mut net, [10, 0, 0, 1], tcp::PORT, Retry::default(),
//!                              &me, deadline, &mut now)?;
//!
//! // ib_write_bw as the server (`ib_write_bw -x 1 …`): the unikernel is the client.
//! let role = perftest::Role::Client { server: [10, 0, 0, 1], retry: Retry::default() };
//! let out = perftest::run(&mut net, role, tcp::PORT, &local, &mut hooks, deadline, &mut now)?;
//! ```
//!
//! The Linux side's flags and the exact bytes of each exchange are in the two modules' docs.

pub mod device;
pub mod perftest;
pub mod pingpong;
pub mod qperf;
pub mod refuse;
pub mod stack;

pub use device::LinkDevice;
pub use stack::{NetConfig, Retry, Stack, Storage};

/// The TCP port every one of the programs uses by default (`-p`).
pub const PORT: u16 = 18515;

/// Which blocking step failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Listening for and accepting the connection.
    Accept,
    /// Connecting.
    Connect,
    /// Reading a message.
    Read,
    /// Writing a message.
    Write,
    /// Closing the connection.
    Close,
}

/// A field of a message that did not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// The message has the wrong length.
    Length,
    /// The terminating NUL is missing.
    Terminator,
    /// A `:` separator is missing.
    Separator,
    /// LID.
    Lid,
    /// Outstanding reads (perftest).
    OutReads,
    /// QP number.
    Qpn,
    /// PSN.
    Psn,
    /// R_Key (perftest).
    Rkey,
    /// Virtual address (perftest).
    Vaddr,
    /// GID.
    Gid,
    /// SRQ number (perftest).
    Srqn,
    /// perftest's version string.
    Version,
    /// perftest's MTU string.
    Mtu,
    /// The closing `done` + NUL.
    Done,
}

/// What went wrong in the exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The MAC, address, prefix or gateway cannot be used.
    Config,
    /// The socket is in use: close it first.
    Busy,
    /// smoltcp refused to listen or connect (invalid state or address).
    Socket(Step),
    /// The deadline passed.
    Timeout(Step),
    /// The peer closed or reset the connection.
    Closed(Step),
    /// Every connection attempt was refused (nobody listened).
    Refused,
    /// A message too large to leave in one segment.
    TooLarge,
    /// The caller's clock stood still for [`stack::STUCK_ROUNDS`] rounds of a wait.
    ClockStuck,
    /// The peer's message does not parse.
    Malformed(Field),
    /// The peer's perftest version (in hundredths: 570 = "5.70") is older than the 5.70 that
    /// 6.06 accepts.
    Version(u32),
    /// One GID is IPv4-mapped and the other is not: perftest refuses to connect them.
    GidFamily,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Config => f.write_str("unusable network configuration"),
            Error::Busy => f.write_str("TCP socket in use"),
            Error::Socket(s) => write!(f, "TCP socket refused ({s:?})"),
            Error::Timeout(s) => write!(f, "timed out ({s:?})"),
            Error::Closed(s) => write!(f, "connection closed by the peer ({s:?})"),
            Error::Refused => f.write_str("connection refused"),
            Error::TooLarge => f.write_str("message larger than one segment"),
            Error::ClockStuck => f.write_str("the clock does not advance"),
            Error::Malformed(field) => write!(f, "malformed message ({field:?})"),
            Error::Version(v) => write!(f, "perftest version {}.{:02} < 5.70", v / 100, v % 100),
            Error::GidFamily => f.write_str("GID families differ (IPv4-mapped vs not)"),
        }
    }
}

/// A flow's failure: the exchange's, or the caller's hook's (moving the QP, the data phase).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowError<E> {
    /// The TCP exchange failed.
    Exchange(Error),
    /// The caller's hook failed; the connection was reset.
    Hook(E),
}

impl<E> From<Error> for FlowError<E> {
    fn from(e: Error) -> Self {
        FlowError::Exchange(e)
    }
}

/// Writes `value` as `out.len()` lower-case hex digits, zero-padded (the high digits of a
/// value that does not fit are lost: callers check the range first).
fn put_hex(out: &mut [u8], value: u64) {
    let mut v = value;
    for d in out.iter_mut().rev() {
        *d = b"0123456789abcdef"[(v & 0xF) as usize];
        v >>= 4;
    }
}

/// Parses hex digits (either case, 1 to 16 of them).
fn get_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    s.iter().try_fold(0u64, |n, &c| {
        let d = (c as char).to_digit(16)?;
        Some(n << 4 | u64::from(d))
    })
}

/// Parses the fixed-width hex field `s[at..at + len]` followed by a `:` (when `colon`),
/// failing with `field`.
fn field(s: &[u8], at: usize, len: usize, colon: bool, which: Field) -> Result<u64, Error> {
    if colon && s.get(at + len) != Some(&b':') {
        return Err(Error::Malformed(Field::Separator));
    }
    s.get(at..at + len)
        .and_then(get_hex)
        .ok_or(Error::Malformed(which))
}

/// Whether `gid` is IPv4-mapped (`::ffff:a.b.c.d`), as perftest tells the two GID kinds apart.
pub fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xFF && gid[11] == 0xFF
}

/// Parses an IPv6 address in text (`fd00::2`, `fd00:0:0:0:0:0:0:2`): eight groups of one to
/// four hex digits, or fewer with one `::` standing for the zero groups left out. No
/// embedded IPv4 form, no zone. `None` for anything else.
pub fn parse_ipv6(s: &str) -> Option<[u8; 16]> {
    fn groups(part: &str, out: &mut [u16; 8]) -> Option<usize> {
        if part.is_empty() {
            return Some(0);
        }
        let mut n = 0;
        for g in part.split(':') {
            let slot = out.get_mut(n)?;
            if g.is_empty() || g.len() > 4 {
                return None;
            }
            *slot = u16::from_str_radix(g, 16).ok()?;
            n += 1;
        }
        Some(n)
    }
    let (mut head, mut tail) = ([0u16; 8], [0u16; 8]);
    let words = match s.split_once("::") {
        None => {
            (groups(s, &mut head)? == 8).then_some(())?;
            head
        }
        Some((h, t)) => {
            let (nh, nt) = (groups(h, &mut head)?, groups(t, &mut tail)?);
            (nh + nt <= 7).then_some(())?;
            let mut w = head;
            w[8 - nt..].copy_from_slice(&tail[..nt]);
            w
        }
    };
    let mut a = [0u8; 16];
    for (b, w) in a.chunks_exact_mut(2).zip(words) {
        b.copy_from_slice(&w.to_be_bytes());
    }
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_text() {
        let mut two = [0u8; 16];
        two[0] = 0xFD;
        two[15] = 2;
        assert_eq!(parse_ipv6("fd00::2"), Some(two));
        assert_eq!(parse_ipv6("FD00:0:0:0:0:0:0:2"), Some(two));
        assert_eq!(parse_ipv6("fd00:0:0::0:2"), Some(two));
        assert_eq!(parse_ipv6("::"), Some([0; 16]));
        let mut one = [0u8; 16];
        one[15] = 1;
        assert_eq!(parse_ipv6("::1"), Some(one));
        for bad in [
            "",
            "fd00",
            "fd00::2::3",
            ":::",
            "fd00:0:0:0:0:0:0:0:2",
            "1:2:3:4:5:6:7:8::",
            "fd000::2",
            "fd00::g",
            "fd00:::2",
            "fd00::2%eth0",
            "::ffff:10.0.0.2",
            "1:2:3:4:5:6:7",
        ] {
            assert_eq!(parse_ipv6(bad), None, "{bad}");
        }
    }

    #[test]
    fn hex_round_trip_and_rejects() {
        let mut b = [0u8; 6];
        put_hex(&mut b, 0xAB_CDEF);
        assert_eq!(&b, b"abcdef");
        assert_eq!(get_hex(b"ABcdEF"), Some(0xAB_CDEF));
        assert_eq!(get_hex(b""), None);
        assert_eq!(get_hex(b"12g4"), None);
        assert_eq!(get_hex(b"+1"), None);
        assert_eq!(get_hex(&[b'f'; 17]), None);
        assert_eq!(get_hex(&[b'f'; 16]), Some(u64::MAX));
    }

    #[test]
    fn ipv4_mapped() {
        let mut g = [0u8; 16];
        g[10] = 0xFF;
        g[11] = 0xFF;
        g[12..].copy_from_slice(&[10, 0, 0, 2]);
        assert!(is_ipv4_mapped(&g));
        g[0] = 0xFE;
        assert!(!is_ipv4_mapped(&g));
    }
}
