//! Peer mode: the unikernel plays the other side of Debian's unmodified `ibv_rc_pingpong` and
//! `ibv_ud_pingpong` (ibverbs-utils 44.0), which run in the lab's outer guest on rxe0.
//!
//! Those programs swap their connection data over TCP; the unikernel has no TCP, so the lab's
//! bridge (`qemu/lab/bridge.py`) carries it over the serial console, one `\n`-terminated line
//! per message, each starting with `@@BV ` so that no log line can be taken for one:
//!
//! | direction | line |
//! | --- | --- |
//! | guest → bridge | `@@BV HELLO` (peer mode is up), `@@BV ADDR <51 chars>`, `@@BV DONE ok <sends> <receives> <bytes>` or `@@BV DONE fail <reason>` |
//! | bridge → guest | `@@BV CASE <case> [-s SIZE] [-n ITERS] [-r RX_DEPTH] [-c]`, `@@BV PEER <51 chars>`, `@@BV ABORT`, `@@BV END` |
//!
//! `<51 chars>` is the pingpong programs' own text, `LLLL:QQQQQQ:PPPPPP:` and the GID's 16
//! bytes in network order as 32 hex digits. `<case>` names the Linux program's role:
//! `rc-server` / `ud-server` (Linux listens, the unikernel is the client and prints its
//! address first) and `rc-client` / `ud-client` (the unikernel is the server: it connects with
//! the client's address, reaches RTS, and only then prints its own, as Linux's server does).
//! The options are the Linux program's, so both sides run the same sizes and counts.
//!
//! Each case then runs the programs' exchange: the same QP attributes (`docs/roce-v2.md`
//! §10.2, §10.4), receives posted before the exchange, one SIGNALED SEND outstanding, the same
//! completion accounting (a SEND and a RECV per iteration before the next SEND; receives
//! refilled to the depth when one or none is left), and the server echoing. Every received
//! message is checked: the unikernel sends message *i* with [`Case::pattern`] *i*, so as the client
//! it must get its own message back, and as the server it must get the Linux client's initial
//! buffer (0x7b; zeros at page offsets with `-c`) first and then its own previous reply, which
//! the client's single buffer received and sends on.

use core::fmt::Write;

use bareverbs::Context;
use bareverbs::device::pvrdma::{self, Config, Pvrdma};
use bareverbs::hal::{ConfigRegionAccess, Hal};
use bareverbs::verbs::*;

use super::{Failure, Step};
pub use crate::tcp::pingpong::Dest;

/// The Q_Key `ibv_ud_pingpong` gives its QP and sends with.
pub const UD_QKEY: u32 = 0x1111_1111;
/// The guest GID index the unikernel's IPv4-mapped GID is bound at.
pub const GID_INDEX: u32 = 1;
/// Bytes of the GRH area at the start of every UD receive buffer.
pub const GRH_LEN: usize = 40;
/// The byte `ibv_*_pingpong` fills its buffer with.
pub const LINUX_FILL: u8 = 0x7B;

const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;

/// The serial line to the bridge: a `Write` sink that can also be read without blocking.
pub trait Line: Write {
    /// The next received byte, if one is waiting (never blocks).
    fn try_get(&mut self) -> Option<u8>;
}

/// The transport of a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `ibv_rc_pingpong`.
    Rc,
    /// `ibv_ud_pingpong`.
    Ud,
}

/// One exchange with a Linux program, as the bridge names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    /// RC or UD.
    pub kind: Kind,
    /// The Linux program is the server (the unikernel connects as the client).
    pub linux_server: bool,
    /// Bytes per message (`-s`; defaults 4096 RC, 1024 UD).
    pub size: u32,
    /// Messages each way (`-n`; default 1000).
    pub iters: u32,
    /// Receives kept posted (`-r`; default 500).
    pub rx_depth: u32,
    /// `-c`: the client zeroes every page offset of its messages; the server checks them.
    pub chk: bool,
    /// RoCEv2 over IPv6 (`rc6-server`, `ud6-client`): the Linux program runs with its global
    /// IPv6 GID, and the unikernel connects from its own (see [`Gids::pick`](crate::gids::Gids::pick)).
    pub v6: bool,
}

impl Case {
    /// Largest message accepted (the example's buffers; `ibv_ud_pingpong` stops at the
    /// port's MTU anyway).
    pub const MAX_SIZE: u32 = 1 << 20;
    /// Largest receive depth accepted.
    pub const MAX_RX_DEPTH: u32 = 1024;

    /// Parses `rc-server -s 4096 -n 200 -c` (the case name, then the Linux program's
    /// options; `-e`, `-g N`, `-d DEV`, `-p PORT` and `-l SL` are the Linux side's business
    /// and skipped).
    pub fn parse(s: &str) -> Option<Case> {
        let mut words = s.split_ascii_whitespace();
        let name = words.next()?;
        let (program, role) = name.split_once('-')?;
        let (kind, v6) = match program {
            "rc" => (Kind::Rc, false),
            "rc6" => (Kind::Rc, true),
            "ud" => (Kind::Ud, false),
            "ud6" => (Kind::Ud, true),
            _ => return None,
        };
        let linux_server = match role {
            "server" => true,
            "client" => false,
            _ => return None,
        };
        let mut case = Case {
            kind,
            linux_server,
            size: if kind == Kind::Rc { 4096 } else { 1024 },
            iters: 1000,
            rx_depth: 500,
            chk: false,
            v6,
        };
        while let Some(w) = words.next() {
            let mut num = || words.next().and_then(|v| v.parse::<u32>().ok());
            match w {
                "-s" | "--size" => case.size = num()?,
                "-n" | "--iters" => case.iters = num()?,
                "-r" | "--rx-depth" => case.rx_depth = num()?,
                "-c" | "--chk" => case.chk = true,
                "-e" | "--events" => {}
                "-g" | "-d" | "-p" | "-l" | "--gid-idx" | "--ib-dev" | "--port" | "--sl" => {
                    words.next()?;
                }
                _ => return None,
            }
        }
        let ok = (1..=Self::MAX_SIZE).contains(&case.size)
            && case.iters >= 1
            && (2..=Self::MAX_RX_DEPTH).contains(&case.rx_depth);
        ok.then_some(case)
    }

    /// The case's name: the Linux program's transport and role.
    pub fn name(&self) -> &'static str {
        match (self.kind, self.v6, self.linux_server) {
            (Kind::Rc, false, true) => "rc-server",
            (Kind::Rc, false, false) => "rc-client",
            (Kind::Ud, false, true) => "ud-server",
            (Kind::Ud, false, false) => "ud-client",
            (Kind::Rc, true, true) => "rc6-server",
            (Kind::Rc, true, false) => "rc6-client",
            (Kind::Ud, true, true) => "ud6-server",
            (Kind::Ud, true, false) => "ud6-client",
        }
    }

    /// Where the payload starts in a receive buffer (after the GRH area on UD).
    pub fn payload_offset(&self) -> usize {
        match self.kind {
            Kind::Rc => 0,
            Kind::Ud => GRH_LEN,
        }
    }

    /// The byte `k` of the message the unikernel sends in iteration `i`.
    pub fn pattern(&self, i: u32, k: usize) -> u8 {
        if self.chk && k.is_multiple_of(4096) {
            0
        } else {
            (k as u32)
                .wrapping_mul(7)
                .wrapping_add(i.wrapping_mul(13))
                .wrapping_add(1) as u8
        }
    }

    /// The byte `k` the unikernel must find in the `r`-th message it receives: as the client,
    /// its own message `r` echoed; as the server, the Linux client's initial buffer first,
    /// then its own previous reply.
    pub fn expected(&self, r: u32, k: usize) -> u8 {
        match (self.linux_server, r) {
            (true, _) => self.pattern(r, k),
            (false, 0) if self.chk && k.is_multiple_of(4096) => 0,
            (false, 0) => LINUX_FILL,
            (false, _) => self.pattern(r - 1, k),
        }
    }
}

/// Whether the 40-byte GRH area of a UD receive is the header of a packet from `src` to
/// `dst`. Between IPv4-mapped GIDs (RoCE v2 over IPv4, as rxe writes it): 20 zero bytes,
/// then the IPv4 header — version 4, IHL 5, protocol UDP, source and destination addresses.
/// Otherwise an IPv6 header: version 6, next header UDP, the two GIDs.
pub fn grh_ok(grh: &[u8], src: &Gid, dst: &Gid) -> bool {
    fn v4(g: &Gid) -> Option<&[u8]> {
        (g.0[..10] == [0; 10] && g.0[10..12] == [0xFF; 2]).then_some(&g.0[12..])
    }
    if grh.len() < GRH_LEN {
        return false;
    }
    match (v4(src), v4(dst)) {
        (Some(s), Some(d)) => {
            let ip = &grh[20..40];
            grh[..20] == [0; 20]
                && ip[0] == 0x45
                && ip[9] == 17
                && &ip[12..16] == s
                && &ip[16..20] == d
        }
        _ => grh[0] >> 4 == 6 && grh[6] == 17 && grh[8..24] == src.0 && grh[24..40] == dst.0,
    }
}

/// How a case ended when it did not pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaseError {
    /// A verbs call failed.
    Verbs(Failure),
    /// The bridge said ABORT.
    Aborted,
    /// The case's deadline passed while its messages were being polled.
    Deadline,
    /// A step ran out of its order (a hook called twice, or before the QP existed).
    OutOfOrder,
    /// The atomics the peer ran did not add up to its count (one executed twice, or lost).
    Atomics {
        /// What the buffer's words added up to.
        sum: u64,
        /// Atomics the case ran.
        iters: u32,
    },
    /// A buffer the peer may only read changed (the first changed byte's offset).
    Changed(u32),
    /// An RDMA READ of the same bytes, or a SEND of the same buffer, brought others (its
    /// index).
    Differs(u32),
    /// A line from the bridge that is not what the step expects.
    BadLine,
    /// The TCP exchange failed (software RoCE: the unikernel answers it itself).
    Exchange(crate::tcp::Error),
    /// A completion with an error status.
    Status(WcStatus, u64),
    /// Received messages that differ from what the exchange must deliver: how many, and
    /// the first one's (index, byte offset or length).
    Data {
        /// Messages with a wrong length or byte.
        bad: u32,
        /// The first bad message.
        first: u32,
        /// Its first wrong byte (u32::MAX: its length was wrong).
        at: u32,
    },
    /// A UD receive from another QP than the peer's.
    Source(u32),
    /// UD receives whose GRH area is not the packet's header from the peer to us (see
    /// [`grh_ok`]): how many, and the first one's index.
    Grh {
        /// Receives with a wrong GRH area.
        bad: u32,
        /// The first one.
        first: u32,
    },
    /// The case's GID family (IPv4-mapped or IPv6) is not the unikernel's (it has no IPv6
    /// address) or not the one Linux sent.
    GidFamily,
}

impl From<crate::tcp::Error> for CaseError {
    fn from(e: crate::tcp::Error) -> Self {
        CaseError::Exchange(e)
    }
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
            CaseError::Aborted => f.write_str("aborted by the bridge"),
            CaseError::Deadline => f.write_str("the case's deadline passed"),
            CaseError::OutOfOrder => f.write_str("a step ran out of order"),
            CaseError::Changed(at) => write!(f, "a buffer only read changed at byte {at}"),
            CaseError::Differs(i) => write!(
                f,
                "message {i} (an RDMA READ's answer or a SEND) brought other bytes than the first"
            ),
            CaseError::Atomics { sum, iters } => {
                write!(f, "{iters} fetch-and-adds of 1 left {sum} in the buffer")
            }
            CaseError::BadLine => f.write_str("unexpected line from the bridge"),
            CaseError::Exchange(e) => write!(f, "TCP exchange: {e}"),
            CaseError::Status(s, id) => write!(f, "completion status {s:?} for wr_id {id}"),
            CaseError::Data { bad, first, at } if *at == u32::MAX => {
                write!(f, "{bad} bad messages, first #{first}: wrong length")
            }
            CaseError::Data { bad, first, at } => {
                write!(f, "{bad} bad messages, first #{first} at byte {at}")
            }
            CaseError::Source(q) => write!(f, "UD receive from QP {q:#x}, not the peer's"),
            CaseError::GidFamily => f.write_str(
                "the GID family (IPv4-mapped or IPv6) is not Linux's, or the unikernel has none of it",
            ),
            CaseError::Grh { bad, first } => {
                write!(f, "{bad} UD receives with a wrong GRH area, first #{first}")
            }
        }
    }
}

/// What a peer-mode session did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Cases run.
    pub cases: u32,
    /// Cases that failed.
    pub failed: u32,
}

/// A line being received from the bridge.
pub struct LineBuf {
    buf: [u8; 160],
    len: usize,
    overflow: bool,
}

impl Default for LineBuf {
    fn default() -> Self {
        LineBuf {
            buf: [0; 160],
            len: 0,
            overflow: false,
        }
    }
}

impl LineBuf {
    /// Takes the bytes waiting on `line`; returns the length of a completed protocol line
    /// (without `\r\n`), if one completed. Lines without the prefix, and lines too long for
    /// the buffer, are dropped.
    pub fn poll<L: Line>(&mut self, line: &mut L) -> Option<usize> {
        while let Some(b) = line.try_get() {
            match b {
                b'\n' => {
                    let (len, overflow) = (self.len, self.overflow);
                    (self.len, self.overflow) = (0, false);
                    if !overflow && self.buf[..len].starts_with(b"@@BV ") {
                        return Some(len);
                    }
                }
                b'\r' => {}
                _ if self.len < self.buf.len() => {
                    self.buf[self.len] = b;
                    self.len += 1;
                }
                _ => self.overflow = true,
            }
        }
        None
    }

    /// The text of the protocol line `poll` completed (after `@@BV `), or "" if not UTF-8.
    pub fn text(&self, len: usize) -> &str {
        core::str::from_utf8(&self.buf[5..len]).unwrap_or("")
    }

    /// Waits for the next protocol line; returns its length for [`text`](Self::text).
    pub fn wait<L: Line>(&mut self, line: &mut L) -> usize {
        loop {
            if let Some(n) = self.poll(line) {
                return n;
            }
            core::hint::spin_loop();
        }
    }
}

/// Brings the device up again, binds `::ffff:ip` at [`GID_INDEX`], says `@@BV HELLO`, and runs
/// the cases the bridge names until it says `@@BV END`. A case that fails is reported
/// (`@@BV DONE fail …`) and the session goes on; a failure of the session's own objects ends it.
pub fn serve<H: Hal, C: ConfigRegionAccess, L: Line>(
    hal: H,
    pci: &C,
    line: &mut L,
    config: Config,
    ip: [u8; 4],
) -> Result<Outcome, Failure> {
    let address = pvrdma::find(pci).ok_or(Failure {
        step: "peer: find PVRDMA",
        error: bareverbs::error::Error::NotFound(bareverbs::error::NotFound::Device),
    })?;
    let ctx = Context::new(Pvrdma::new(hal, pci, address, config).at("peer: bring-up")?);
    let gid = ctx
        .bind_gid(GID_INDEX, Gid::from_ipv4(ip))
        .at("peer: bind GID")?;
    let pd = ctx.alloc_pd().at("peer: alloc PD")?;
    let [a, b, c, d] = ip;
    let _ = writeln!(
        line,
        "peer mode: GID[{GID_INDEX}] ::ffff:{a}.{b}.{c}.{d} bound, PD {}",
        pd.raw().handle()
    );
    let _ = writeln!(line, "@@BV HELLO");
    let mut lb = LineBuf::default();
    let mut outcome = Outcome::default();
    loop {
        let n = lb.wait(line);
        let text = lb.text(n);
        if text == "END" {
            break;
        }
        let Some(case) = text.strip_prefix("CASE ").and_then(Case::parse) else {
            // ABORT of a case already over, or a stray line: not a case to run.
            continue;
        };
        outcome.cases += 1;
        let tsc0 = rdtsc();
        let mut x = BridgeExchange {
            line,
            lb: &mut lb,
            polls: 0,
        };
        match run_case(
            &ctx,
            &pd,
            &crate::gids::Gids {
                v4: (gid.gid(), gid.index()),
                v6: None,
            },
            &case,
            &mut x,
        ) {
            Ok(bytes) => {
                let _ = writeln!(
                    line,
                    "peer {}: {} iters of {} bytes each way, every message checked ({} Mcycles)",
                    case.name(),
                    case.iters,
                    case.size,
                    (rdtsc() - tsc0) / 1_000_000
                );
                let _ = writeln!(line, "@@BV DONE ok {0} {0} {bytes}", case.iters);
            }
            Err(e) => {
                outcome.failed += 1;
                let _ = writeln!(line, "peer {}: FAIL {e}", case.name());
                let _ = writeln!(line, "@@BV DONE fail {e}");
            }
        }
    }
    pd.destroy().at("peer: destroy PD")?;
    gid.unbind().at("peer: unbind GID")?;
    drop(ctx);
    Ok(outcome)
}

/// The time-stamp counter (0 off x86_64): a seed for PSNs and TCP's initial sequence numbers.
pub fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC reads the time-stamp counter; no memory is touched.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// How a case's two sides swap their [`Dest`]s and what the case may be stopped by: the
/// bridge's serial lines here (PVRDMA lab), TCP on the software RoCE device
/// (`crate::roce_peer`).
pub trait Exchange {
    /// The Linux program serves: sends `me`, returns the server's data (the server is at
    /// RTS before it answers).
    fn to_server(&mut self, me: &Dest) -> Result<Dest, CaseError>;
    /// The Linux program is the client: waits for its data.
    fn client_data(&mut self) -> Result<Dest, CaseError>;
    /// Answers the client with `me`, once the QP is at RTS.
    fn answer(&mut self, me: &Dest) -> Result<(), CaseError>;
    /// Asked now and then while the case polls its completions: a reason to stop it now.
    fn interrupt(&mut self) -> Option<CaseError>;
    /// Where the case's log lines go.
    fn log(&mut self) -> &mut dyn Write;
}

/// The bridge's side of [`Exchange`]: `@@BV ADDR` out, `@@BV PEER` / `@@BV ABORT` in.
pub struct BridgeExchange<'l, L: Line> {
    line: &'l mut L,
    lb: &'l mut LineBuf,
    polls: u32,
}

impl<L: Line> BridgeExchange<'_, L> {
    fn addr(&mut self, me: &Dest) -> Result<(), CaseError> {
        let m = me.encode()?;
        let text = core::str::from_utf8(&m[..m.len() - 1]).map_err(|_| CaseError::BadLine)?;
        let _ = writeln!(self.line, "@@BV ADDR {text}");
        Ok(())
    }
}

impl<L: Line> Exchange for BridgeExchange<'_, L> {
    fn to_server(&mut self, me: &Dest) -> Result<Dest, CaseError> {
        self.addr(me)?;
        self.client_data()
    }

    fn client_data(&mut self) -> Result<Dest, CaseError> {
        let n = self.lb.wait(self.line);
        let text = self.lb.text(n);
        if text == "ABORT" {
            return Err(CaseError::Aborted);
        }
        let t = text.strip_prefix("PEER ").ok_or(CaseError::BadLine)?;
        let mut m = [0u8; crate::tcp::pingpong::MSG_LEN];
        let body = m.get_mut(..t.len()).ok_or(CaseError::BadLine)?;
        body.copy_from_slice(t.as_bytes());
        Dest::parse(&m).map_err(|_| CaseError::BadLine)
    }

    fn answer(&mut self, me: &Dest) -> Result<(), CaseError> {
        self.addr(me)
    }

    fn interrupt(&mut self) -> Option<CaseError> {
        self.polls = self.polls.wrapping_add(1);
        let aborted = self.polls.is_multiple_of(4096)
            && self
                .lb
                .poll(self.line)
                .is_some_and(|n| self.lb.text(n) == "ABORT");
        aborted.then_some(CaseError::Aborted)
    }

    fn log(&mut self) -> &mut dyn Write {
        self.line
    }
}

/// The path to the peer as the pingpong programs set it: a GRH to its GID from ours, hop
/// limit 1, flow label and traffic class 0, SL 0.
fn path_to(peer: &Dest, sgid_index: u32) -> AddressVector {
    AddressVector {
        dgid: peer.gid,
        sgid_index: sgid_index as u8,
        hop_limit: 1,
        traffic_class: 0,
        flow_label: 0,
        sl: 0,
    }
}

/// Runs one case from one of the unikernel's GIDs ([`Gids::pick`](crate::gids::Gids::pick)), swapping the connection
/// data through `x`; returns the bytes moved (size · iters · 2, as Linux's summary counts
/// them). Linux's GID must be of the family the unikernel connects from
/// ([`CaseError::GidFamily`]).
pub fn run_case<P: Provider, X: Exchange>(
    ctx: &Context<P>,
    pd: &ProtectionDomain<'_, P>,
    gids: &crate::gids::Gids,
    case: &Case,
    x: &mut X,
) -> Result<u64, CaseError> {
    // As the client the unikernel sends its GID first: the case's family; as the server it
    // answers in Linux's.
    let first = if case.linux_server {
        Some(gids.pick(case.v6, None).ok_or(CaseError::GidFamily)?)
    } else {
        None
    };
    let exchange = |x: &mut X, me: &mut Dest| -> Result<(Dest, u32), CaseError> {
        let peer = match first {
            Some(_) => x.to_server(me)?,
            None => x.client_data()?,
        };
        let (gid, index) = match first {
            Some(f) => f,
            None => gids
                .pick(case.v6, Some(&peer.gid))
                .ok_or(CaseError::GidFamily)?,
        };
        me.gid = gid;
        if crate::tcp::is_ipv4_mapped(&peer.gid.0) != crate::tcp::is_ipv4_mapped(&gid.0) {
            return Err(CaseError::GidFamily);
        }
        Ok((peer, index))
    };
    let gid = first.map_or(gids.v4.0, |f| f.0);
    // The programs' resources: a QP of 1 send and rx_depth receives of one SGE, on one CQ;
    // here the receive buffers come from a pool (rx_depth + the send buffer + one in hand),
    // each as large as a message (plus the GRH area on UD). The CQ is the programs' own,
    // rx_depth + 1 entries: the driver never refuses a QP for its CQ's size (a queue whose
    // rounded depth does not fit takes CQ room as its requests are posted).
    let cq = ctx.create_cq(case.rx_depth + 1).at("peer: create CQ")?;
    let buf_size = case.size + case.payload_offset() as u32;
    let pool = pd
        .buffer_pool(case.rx_depth + 2, buf_size)
        .at("peer: buffer pool")?;
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: case.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let builder = || pd.qp_builder(&cq, &cq).caps(caps).pool(&pool);
    // Drawn from the HAL's seed, as the programs draw theirs at random (docs/security.md).
    let psn = ctx.random_psn();
    let bytes = u64::from(case.size) * u64::from(case.iters) * 2;
    match case.kind {
        Kind::Rc => {
            let qp = builder().build::<Rc>().at("peer: create RC QP")?;
            // RESET → INIT: P_Key index 0, port 1, no remote access (rc_pingpong's values).
            let init = ConnectedInit {
                port: 1,
                pkey_index: 0,
                access: AccessFlags::empty(),
            };
            let mut qp = qp.init(&init).at("peer: RC INIT")?;
            let routs = post_recvs(&mut qp, &pool, case.rx_depth)?;
            let mut me = Dest {
                lid: 0,
                qpn: qp.qp_num(),
                psn,
                gid,
            };
            let (peer, gid_index) = exchange(x, &mut me)?;
            let rtr = ConnectedRtr {
                dest_qpn: peer.qpn,
                rq_psn: peer.psn,
                av: path_to(&peer, gid_index),
                path_mtu: Mtu::Mtu1024,
                max_dest_rd_atomic: 1,
                min_rnr_timer: 12,
            };
            let qp = qp.rtr(&rtr).at("peer: RC RTR")?;
            let rts = ConnectedRts {
                sq_psn: psn,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 1,
            };
            let mut qp = qp.rts(&rts).at("peer: RC RTS")?;
            if !case.linux_server {
                x.answer(&me)?;
            }
            let r = pingpong(&mut qp, &pool, case, (&me, &peer), routs, x, |q, id, b| {
                q.post_send(id, b)
            });
            qp.destroy().at("peer: destroy RC QP")?;
            r?;
        }
        Kind::Ud => {
            let qp = builder().build::<Ud>().at("peer: create UD QP")?;
            let mut qp = qp.init(&DatagramInit::new(UD_QKEY)).at("peer: UD INIT")?;
            let routs = post_recvs(&mut qp, &pool, case.rx_depth)?;
            let mut me = Dest {
                lid: 0,
                qpn: qp.qp_num(),
                psn,
                gid,
            };
            // ud_pingpong: RTR with the state only, RTS with its PSN, then the AH; the
            // server does all of it before it answers (UD has no retransmission).
            let (peer, gid_index) = exchange(x, &mut me)?;
            let qp = qp.rtr(&()).at("peer: UD RTR")?;
            let mut qp = qp.rts(&DatagramRts { sq_psn: psn }).at("peer: UD RTS")?;
            let ah = pd
                .create_ah(&path_to(&peer, gid_index))
                .at("peer: create AH")?;
            if !case.linux_server {
                x.answer(&me)?;
            }
            let r = pingpong(&mut qp, &pool, case, (&me, &peer), routs, x, |q, id, b| {
                q.post_send_to(id, b, (&ah, peer.qpn, UD_QKEY))
            });
            qp.destroy().at("peer: destroy UD QP")?;
            drop(ah);
            r?;
        }
    }
    drop(pool);
    cq.destroy().at("peer: destroy CQ")?;
    Ok(bytes)
}

/// Posts `n` receives of whole pool buffers; returns how many were posted.
fn post_recvs<'a, P: Provider, T: Transport, S: CanRecv>(
    qp: &mut QueuePair<'a, P, T, S>,
    pool: &'a BufferPool<'a, P>,
    n: u32,
) -> Result<u32, CaseError> {
    for _ in 0..n {
        let buf = pool.alloc().ok_or(CaseError::Verbs(Failure {
            step: "peer: buffer pool empty",
            error: bareverbs::error::Error::Resource(bareverbs::error::Resource::Dma { pages: 1 }),
        }))?;
        qp.post_recv(WR_RECV, buf).at("peer: post_recv")?;
    }
    Ok(n)
}

/// The programs' ping-pong loop (`docs/roce-v2.md` §10.3): `routs` receives are posted;
/// the client sends first; each side sends its next message once its previous SEND and a
/// RECV have completed; receives are refilled to the depth when at most one is left; the
/// loop ends when both counts reach `iters`. Every receive is checked.
#[allow(clippy::too_many_arguments)]
fn pingpong<'a, P: Provider, T: Transport, X: Exchange>(
    qp: &mut QueuePair<'a, P, T, Rts>,
    pool: &'a BufferPool<'a, P>,
    case: &Case,
    (me, peer): (&Dest, &Dest),
    mut routs: u32,
    x: &mut X,
    mut send: impl FnMut(
        &mut QueuePair<'a, P, T, Rts>,
        u64,
        Buf<'a, P>,
    ) -> Result<(), (Buf<'a, P>, bareverbs::error::Error)>,
) -> Result<(), CaseError> {
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let (mut bad, mut first, mut at) = (0u32, 0u32, 0u32);
    let (mut grh_bad, mut grh_first) = (0u32, 0u32);
    let off = case.payload_offset();
    let mut post = |qp: &mut QueuePair<'a, P, T, Rts>, i: u32| -> Result<(), CaseError> {
        let mut buf = pool.alloc().ok_or(CaseError::Verbs(Failure {
            step: "peer: buffer pool empty",
            error: bareverbs::error::Error::Resource(bareverbs::error::Resource::Dma { pages: 1 }),
        }))?;
        buf.set_len(case.size).at("peer: send length")?;
        for (k, x) in buf.as_mut_slice().iter_mut().enumerate() {
            *x = case.pattern(i, k);
        }
        Ok(send(qp, WR_SEND, buf).at("peer: post_send")?)
    };
    let mut pending = WR_RECV;
    if case.linux_server {
        post(qp, 0)?;
        pending |= WR_SEND;
    }
    while rcnt < case.iters || scnt < case.iters {
        let Some(c) = qp.poll_one().at("peer: poll")? else {
            if let Some(e) = x.interrupt() {
                return Err(e);
            }
            core::hint::spin_loop();
            continue;
        };
        if c.wc.status != WcStatus::Success {
            return Err(CaseError::Status(c.wc.status, c.wc.wr_id));
        }
        let id = c.wc.wr_id;
        match id {
            WR_SEND => {
                drop(c);
                scnt += 1;
            }
            WR_RECV => {
                if rcnt == 0 {
                    report_first(x.log(), case, &c);
                }
                if case.kind == Kind::Ud && c.wc.src_qp != peer.qpn {
                    return Err(CaseError::Source(c.wc.src_qp));
                }
                if let (Kind::Ud, Some(b)) = (case.kind, &c.buf)
                    && !grh_ok(b.as_slice(), &peer.gid, &me.gid)
                {
                    if grh_bad == 0 {
                        grh_first = rcnt;
                    }
                    grh_bad += 1;
                }
                let want = case.size as usize + off;
                let wrong = match &c.buf {
                    Some(b) if c.wc.byte_len as usize == want => b.as_slice()[off..want]
                        .iter()
                        .enumerate()
                        .find(|&(k, &x)| x != case.expected(rcnt, k))
                        .map(|(k, _)| k as u32),
                    _ => Some(u32::MAX),
                };
                if let Some(k) = wrong {
                    if bad == 0 {
                        (first, at) = (rcnt, k);
                    }
                    bad += 1;
                }
                drop(c);
                routs -= 1;
                if routs <= 1 {
                    routs += post_recvs(qp, pool, case.rx_depth - routs)?;
                }
                rcnt += 1;
            }
            _ => return Err(CaseError::Status(WcStatus::GeneralErr, id)),
        }
        pending &= !id;
        if scnt < case.iters && pending == 0 {
            post(qp, scnt)?;
            pending = WR_RECV | WR_SEND;
        }
    }
    if bad > 0 {
        return Err(CaseError::Data { bad, first, at });
    }
    if grh_bad > 0 {
        return Err(CaseError::Grh {
            bad: grh_bad,
            first: grh_first,
        });
    }
    Ok(())
}

/// Logs what the first receive of a case looked like: its completion's fields and, on UD, the
/// 40-byte GRH area the real stack wrote.
fn report_first<P: Provider>(line: &mut dyn Write, case: &Case, c: &Completion<'_, P>) {
    let _ = write!(
        line,
        "peer {}: first receive: byte_len {} src_qp {:#x} flags {:?}",
        case.name(),
        c.wc.byte_len,
        c.wc.src_qp,
        c.wc.flags
    );
    if let (Kind::Ud, Some(b)) = (case.kind, &c.buf) {
        let _ = write!(line, " grh ");
        for x in &b.as_slice()[..GRH_LEN] {
            let _ = write!(line, "{x:02x}");
        }
    }
    let _ = writeln!(line);
}
