//! perftest's `-R` mode (`ib_send_bw`, `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw` and the
//! latency programs of perftest 4.5-0.17, Debian 12's), both roles: everything goes through
//! rdma_cm, nothing over TCP (`docs/cm.md`, "perftest -R", has the exchange as read from
//! perftest's source).
//!
//! - A control connection to port 18515 (RC, depths 0, retry and RNR retry counts 7, no
//!   private data) carries every exchange as a SEND into the peer's one 56-byte receive; the
//!   side that connected sends first, then waits for the answer; the other side the other way.
//! - Versions (16 bytes, `"6.06"` NUL-padded), page size and cache line (4 bytes each,
//!   big-endian), the MTU (`"3\0"`), then a blank `pingpong_dest` each way (56 bytes, zero
//!   but for padding), the data connection to the same port (depths perftest's outstanding
//!   reads for `ib_read_bw`, else 0; retries 7), a second blank one, then the data QP's
//!   `pingpong_dest` three times.
//! - `ib_send_bw`: receives posted, a fourth, the SENDs, a fifth. `ib_write_bw`,
//!   `ib_read_bw`: the WRITEs or READs, a fourth, the five words of the report (the client's
//!   own; the server's are uninitialized memory in perftest), a fifth.
//! - The end: the client disconnects the data connection, the server's exit takes both
//!   down (DREQs from its kernel).
//! - `-b` (`ib_send_bw`, `ib_write_bw`, `ib_read_bw`): a fourth `pingpong_dest` before both
//!   sides run the data phase at once, then both reports (each side's own), a fifth.
//! - `-q N`: N data connections, asked for at once by the client, accepted in the order they
//!   come; each QP's `pingpong_dest` in turn, each again, then the first QP's (`ib_send_bw`:
//!   the first QP's between the two rounds); the client's
//!   report counts every QP's operations. The QPs' data phases run one after the other here
//!   (a QP's SENDs wait in their receives, or are refused with RNR and sent again).
//!
//! Checked here: every byte of every control message but the four bytes of a
//! `pingpong_dest`'s padding and the words of a Linux server's report; the SENDs each the
//! bytes of the one before at the same place of the sender's cycle (`ib_send_bw` sends from
//! one buffer that never changes), each READ the bytes of the first (all from one address);
//! the WRITE target of `ib_write_bw` overwritten whole and nothing around it touched (the
//! data is perftest's `rand()`).

use bareverbs::cm::{AcceptParams, ConnectParams};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use super::{CaseError, CmCase, Done, Program, Session};
use crate::Step;
use crate::tcp::perftest::{MIN_VERSION, Report, VERSION, VERSION_LEN, parse_version};

mod ctl;
mod data;
mod lat;
mod msg;

use data::Lane;
pub use msg::{DEST_LEN, Dest};

/// perftest's port (every connection).
pub const PT_PORT: u16 = 18515;
/// The most data QPs (`-q`) a case takes: each its own connection.
pub const MAX_QPS: usize = 4;
/// The largest `-s` a case may ask for.
pub const MAX_PT_SIZE: u32 = 8 * 1024 * 1024;
/// The largest page size (perftest's cycle buffer) taken from the peer.
const MAX_CYCLE: u32 = 64 * 1024;
/// Work requests in flight in the data phase (receives, SENDs, WRITEs or READs).
const WINDOW: u32 = 16;
/// Bytes of receive or READ slots at most: messages of more than a sixteenth of this have
/// fewer slots (two of 8 MiB), so that a case's region fits the kernel's DMA memory.
const SLOT_BYTES: u32 = 16 * 1024 * 1024;
/// READs/atomics this side offers and asks for on `ib_read_bw`'s data connection (the CM
/// clamps it to the device's limit).
const DEPTH: u8 = 16;
/// The page size and cache line this side announces.
const PAGE: u32 = 4096;
const LINE: u32 = 64;
/// The path MTU this side announces (`ibv_mtu` 3: 1024, rxe's on a 1500-byte link).
const MTU: u8 = 3;
/// The GID index of the unikernel's IPv4-mapped GID (what its `pingpong_dest` names).
const GID_INDEX: u32 = 1;
/// Where the control messages sit in the region; the data area follows.
const CTL_RECV_AT: u32 = 0;
const CTL_SEND_AT: u32 = 64;
const DATA_AT: u32 = 128;
/// Bytes after the WRITE target that must stay untouched.
const GUARD: u32 = 4096;
/// What the data area holds before the peer writes it.
const SENTINEL: u8 = 0xEE;
/// What the cases say they checked.
const EVERY_DEFINED: &str = "every byte received that perftest defines checked";
const EVERY_DEFINED_AND_UNCHANGED: &str = "every byte received that perftest defines checked, every READ the first one's bytes, the buffer the peer READs unchanged";
const EVERY_DEFINED_AND_ADDED: &str = "every byte received that perftest defines checked, the peer's fetch-and-adds adding up to its count";
const EVERY_DEFINED_AND_RETURNED: &str = "every byte received that perftest defines checked, every fetch-and-add returning the one before plus one";
const EVERY_DEFINED_RETURNED_AND_ADDED: &str = "every byte received that perftest defines checked, every fetch-and-add returning the one before plus one, the peer's adding up to its count";
const EVERY_DEFINED_AND_READ_FROM: &str =
    "every byte received that perftest defines checked, the buffer the peer READs unchanged";
const EVERY_DEFINED_AND_TARGET: &str = "every byte received that perftest defines checked, the WRITE target overwritten whole and nothing around it touched";

/// The perftest program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtVerb {
    /// `ib_send_bw`: the client SENDs, the server receives.
    Send,
    /// `ib_write_bw`: the client WRITEs into the server's buffer.
    Write,
    /// `ib_read_bw`: the client READs the server's buffer.
    Read,
    /// `ib_send_lat`: a SEND each way per round, the client first.
    SendLat,
    /// `ib_write_lat`: a WRITE each way per round, the server first.
    WriteLat,
    /// `ib_read_lat`: the client READs the server's buffer, one at a time.
    ReadLat,
    /// `ib_atomic_lat`: the client's fetch-and-adds of 1 on the server's word, one at a time.
    AtomicLat,
    /// `ib_write_bw -b`: both sides WRITE into each other's buffer at once.
    WriteBoth,
    /// `ib_send_bw -b`: both sides SEND at once.
    SendBoth,
    /// `ib_read_bw -b`: both sides READ each other's buffer at once.
    ReadBoth,
    /// `ib_atomic_bw`: the client's fetch-and-adds of 1 on the server's buffer.
    AtomicBw,
    /// `ib_atomic_bw -b`: both sides fetch-and-add on each other's buffer at once.
    AtomicBoth,
}

impl PtVerb {
    /// Every program, in the order [`parse`] tries them.
    const ALL: [PtVerb; 8] = [
        PtVerb::Send,
        PtVerb::Write,
        PtVerb::Read,
        PtVerb::AtomicBw,
        PtVerb::SendLat,
        PtVerb::WriteLat,
        PtVerb::ReadLat,
        PtVerb::AtomicLat,
    ];

    /// The case's name: the program, then the Linux side's role.
    pub fn case_name(self, linux_serves: bool) -> &'static str {
        match (self, linux_serves) {
            (PtVerb::Send | PtVerb::SendBoth, true) => "ib_send_bw-server",
            (PtVerb::Send | PtVerb::SendBoth, false) => "ib_send_bw-client",
            (PtVerb::Write | PtVerb::WriteBoth, true) => "ib_write_bw-server",
            (PtVerb::Write | PtVerb::WriteBoth, false) => "ib_write_bw-client",
            (PtVerb::Read | PtVerb::ReadBoth, true) => "ib_read_bw-server",
            (PtVerb::Read | PtVerb::ReadBoth, false) => "ib_read_bw-client",
            (PtVerb::AtomicBw | PtVerb::AtomicBoth, true) => "ib_atomic_bw-server",
            (PtVerb::AtomicBw | PtVerb::AtomicBoth, false) => "ib_atomic_bw-client",
            (PtVerb::SendLat, true) => "ib_send_lat-server",
            (PtVerb::SendLat, false) => "ib_send_lat-client",
            (PtVerb::WriteLat, true) => "ib_write_lat-server",
            (PtVerb::WriteLat, false) => "ib_write_lat-client",
            (PtVerb::ReadLat, true) => "ib_read_lat-server",
            (PtVerb::ReadLat, false) => "ib_read_lat-client",
            (PtVerb::AtomicLat, true) => "ib_atomic_lat-server",
            (PtVerb::AtomicLat, false) => "ib_atomic_lat-client",
        }
    }

    fn op(self) -> &'static str {
        match self {
            PtVerb::Send => "SENDs",
            PtVerb::Write => "RDMA WRITEs",
            PtVerb::WriteBoth => "RDMA WRITEs each way",
            PtVerb::SendBoth => "SENDs each way",
            PtVerb::Read => "RDMA READs",
            PtVerb::ReadBoth => "RDMA READs each way",
            PtVerb::AtomicBw => "fetch-and-adds",
            PtVerb::AtomicBoth => "fetch-and-adds each way",
            PtVerb::SendLat => "rounds of a SEND each way",
            PtVerb::WriteLat => "rounds of an RDMA WRITE each way",
            PtVerb::ReadLat => "RDMA READs one at a time",
            PtVerb::AtomicLat => "fetch-and-adds one at a time",
        }
    }

    /// A latency program.
    pub fn latency(self) -> bool {
        matches!(
            self,
            PtVerb::SendLat | PtVerb::WriteLat | PtVerb::ReadLat | PtVerb::AtomicLat
        )
    }

    /// The program READs or operates on the peer's memory: its data connection asks for
    /// perftest's outstanding reads both ways (`out_reads`), the others for none.
    fn reads(self) -> bool {
        matches!(
            self,
            PtVerb::Read | PtVerb::ReadBoth | PtVerb::ReadLat | PtVerb::AtomicLat
        ) || self.atomics()
    }

    /// The program's operations are 8-byte atomics.
    pub fn atomics(self) -> bool {
        matches!(
            self,
            PtVerb::AtomicLat | PtVerb::AtomicBw | PtVerb::AtomicBoth
        )
    }

    /// perftest's default `-s` and `-n`: 65536 bytes and 1000 iterations for the bandwidth
    /// programs, 2 bytes (8 for atomics) and 1000 for the latency ones.
    fn defaults(self) -> (u32, u32) {
        match self {
            v if v.atomics() => (8, 1000),
            v if v.latency() => (2, 1000),
            _ => (65536, 1000),
        }
    }
}

/// Parses `ib_send_bw-server,-R,-s,4096,-n,200` (`,` for spaces): `None` for another
/// program, without `-R`, or with options that do not parse ([`PtVerb::defaults`] where
/// none is given; `ib_atomic_lat` takes 8 bytes only, as perftest's atomics are).
pub(super) fn parse(spec: &str) -> Option<CmCase> {
    let mut words = spec.split(',').filter(|w| !w.is_empty());
    let name = untagged(words.next()?)?;
    let (verb, linux_serves) = PtVerb::ALL
        .iter()
        .flat_map(|&v| [(v, true), (v, false)])
        .find(|&(v, s)| v.case_name(s).split_once('-') == Some(name))?;
    let (mut size, mut iters) = verb.defaults();
    let (mut rdma_cm, mut verb, mut qps) = (false, verb, 1u8);
    while let Some(w) = words.next() {
        match w {
            "-R" | "--rdma_cm" => rdma_cm = true,
            // The bandwidth programs' -q: a data connection per QP.
            "-q" | "--qp" => qps = words.next()?.parse().ok()?,
            // perftest's outstanding READs (its data connection's depths both ways), within
            // what this side offers: the connection's own depths are checked as they come.
            "-o" | "--outs" if verb.reads() => {
                let o: u8 = words.next()?.parse().ok()?;
                (1..=DEPTH).contains(&o).then_some(())?
            }
            // ib_write_bw's -b: both sides WRITE.
            "-b" | "--bidirectional" if verb == PtVerb::Write => verb = PtVerb::WriteBoth,
            "-b" | "--bidirectional" if verb == PtVerb::Send => verb = PtVerb::SendBoth,
            "-b" | "--bidirectional" if verb == PtVerb::Read => verb = PtVerb::ReadBoth,
            "-b" | "--bidirectional" if verb == PtVerb::AtomicBw => verb = PtVerb::AtomicBoth,
            "-s" | "--size" => size = words.next()?.parse().ok()?,
            "-n" | "--iters" => iters = words.next()?.parse().ok()?,
            _ => return None,
        }
    }
    let ok = rdma_cm
        && (1..=MAX_PT_SIZE).contains(&size)
        && (1..=1_000_000).contains(&iters)
        && (!verb.atomics() || size == 8)
        && (1..=MAX_QPS as u8).contains(&qps)
        && (qps == 1
            || (matches!(
                verb,
                PtVerb::Send | PtVerb::Write | PtVerb::Read | PtVerb::AtomicBw
            ) && u64::from(qps) * u64::from(size) <= u64::from(SLOT_BYTES / 4)));
    let program = if qps == 1 {
        Program::Perftest { verb, linux_serves }
    } else {
        Program::PerftestQps {
            verb,
            linux_serves,
            qps,
        }
    };
    ok.then_some(CmCase {
        program,
        size,
        count: iters,
    })
}

/// A case's name as its program and role, without the tag that tells two cases of one
/// program apart (`ib_write_bw-8m-server` is `ib_write_bw`, `server`): a word of letters and
/// digits between the program and the role. `None` for a malformed tag.
fn untagged(name: &str) -> Option<(&str, &str)> {
    let (program, rest) = name.split_once('-')?;
    let role = match rest.rsplit_once('-') {
        Some((tag, role)) => {
            let ok = !tag.is_empty() && tag.bytes().all(|b| b.is_ascii_alphanumeric());
            ok.then_some(role)?
        }
        None => rest,
    };
    Some((program, role))
}

/// Bytes of a refused case's region: the control messages only.
pub(super) const REFUSE_LEN: u32 = DATA_AT;
/// The version a refused case announces: below perftest's oldest peer ([`MIN_VERSION`]).
const REFUSING_VERSION: &[u8] = b"0";

/// A receive or READ slot: the message rounded up to a cache line.
fn stride(size: u32) -> u32 {
    size.next_multiple_of(LINE)
}

/// Receive or READ slots of messages of `size` bytes: [`WINDOW`], fewer for large messages
/// (at least one).
fn slots(size: u32) -> u32 {
    (SLOT_BYTES / stride(size)).clamp(1, WINDOW)
}

/// Bytes of the case's region: the control messages, then the data area of the role (with
/// `qps` data QPs: the receive slots shared among them, an image of the sender's cycle
/// buffer and a WRITE target each).
pub(super) fn region_len(verb: PtVerb, linux_serves: bool, case: &CmCase, qps: u8) -> u32 {
    let size = case.size;
    let qps = u32::from(qps.max(1));
    let data = match (verb, linux_serves) {
        // Receive slots and the image of the sender's cycle buffer (one per QP).
        (PtVerb::Send, false) => {
            qps * lane_slots(size, qps) * stride(size) + qps * size.max(MAX_CYCLE)
        }
        // READ slots and the first READ's bytes.
        (PtVerb::Read, true) => (slots(size) + 1) * stride(size),
        (PtVerb::Write, false) => qps * target_len(size),
        // The target, then the source.
        (PtVerb::WriteBoth, _) => size.max(MAX_CYCLE) + GUARD + size,
        // Receive slots, the image of the sender's cycle buffer, the source.
        (PtVerb::SendBoth, _) => slots(size) * stride(size) + size.max(MAX_CYCLE) + size,
        (PtVerb::Read, false) => size.max(MAX_CYCLE),
        // The buffer the peer READs (or adds to), then the READ (result) slots and the first
        // one's bytes.
        (PtVerb::ReadBoth | PtVerb::AtomicBoth, _) => {
            size.max(MAX_CYCLE) + (slots(size) + 1) * stride(size)
        }
        // The words the peer's fetch-and-adds land on (a cache line each, through its cycle),
        // or the results' slots and the first result.
        (PtVerb::AtomicBw, false) => MAX_CYCLE,
        (PtVerb::AtomicBw, true) => (slots(size) + 1) * stride(size),
        // What the unikernel SENDs or WRITEs.
        (PtVerb::Send | PtVerb::Write, true) => size,
        // The source, the target (the peer's WRITE) or two receive slots, the first SEND's
        // bytes.
        (PtVerb::SendLat | PtVerb::WriteLat, _) => 4 * stride(size),
        // The READ slot and the first READ's bytes, or the buffer the peer READs.
        (PtVerb::ReadLat, _) => 2 * stride(size),
        // The fetch-and-add's result, or the word the peer's land on (and a line around it).
        (PtVerb::AtomicLat, _) => LINE,
    };
    DATA_AT + data
}

/// Receive slots of each of `qps` data QPs: [`slots`] shared among them, one each at least.
fn lane_slots(size: u32, qps: u32) -> u32 {
    (slots(size) / qps.max(1)).max(1)
}

/// Bytes of a WRITE target and the guard after it.
fn target_len(size: u32) -> u32 {
    size.max(MAX_CYCLE) + GUARD
}

/// Where perftest's sender puts operation `i` in its cycle buffer: with messages of at most
/// half the cycle, at `i mod period` steps of `INC(size)` (`size` rounded up to the cache
/// line), else always at the start. Returns `(period, step)`.
pub fn cycle_steps(size: u32, cycle: u32, line: u32) -> (u32, u32) {
    if size <= cycle / 2 {
        let step = size.next_multiple_of(line.max(1)).max(line);
        ((cycle / step).max(1), step)
    } else {
        (1, 0)
    }
}

/// Where in the region the peer's WRITEs or READs or atomics go (what this side's
/// `pingpong_dest` names): `ib_write_lat`'s target follows its source; the others' the data
/// area's start.
/// With `-q`, `ib_write_bw`'s QP `k` has its own target, after QP `k - 1`'s guard.
fn target_at(verb: PtVerb, size: u32, k: u32) -> u32 {
    match verb {
        PtVerb::WriteLat => DATA_AT + stride(size),
        PtVerb::Write => DATA_AT + k * target_len(size),
        _ => DATA_AT,
    }
}

/// What both sides settled on in the first messages.
#[derive(Clone, Copy, Debug)]
struct Agreed {
    /// The larger page size: perftest's cycle buffer.
    cycle: u32,
    /// The larger cache line.
    line: u32,
}

/// A case's running tally.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Bytes received and checked.
    checked: u64,
}

impl<'a, P: Provider, C: Clock> Session<'_, 'a, P, C> {
    /// One perftest `-R` case; `linux_serves`: the unikernel is the client.
    pub(super) fn perftest(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: [u8; 4],
        case: &CmCase,
        (verb, qps): (PtVerb, u8),
        linux_serves: bool,
    ) -> Result<Done, CaseError> {
        let client = linux_serves;
        let mut tally = Tally::default();
        if !client {
            // Every connection comes to this port: listen once, before anything is sent.
            // perftest's client asks for its data connections all at once: as many requests
            // may wait (its rdma_listen's backlog is its -q).
            self.listen(PT_PORT)?;
            self.backlog = usize::from(qps.max(1));
        }
        let ctl_params = ConnectParams {
            responder_resources: 0,
            initiator_depth: 0,
            ..ConnectParams::default()
        };
        let (mut ctl, ctl_t) = if client {
            let qp = self.qp(pd)?;
            let (q, ms) = self.connect_retrying_with(qp, linux, PT_PORT, &ctl_params)?;
            (q, Ok(ms))
        } else {
            let (q, t, _) = self.accept_next(
                pd,
                linux,
                PT_PORT,
                &|r, i| (r, i) == (0, 0),
                (7, 7),
                &AcceptParams::default(),
            )?;
            (q, Err(t))
        };
        self.post_ctl_recv(&mut ctl)?;
        let r = self.perftest_on(pd, linux, case, (verb, qps), client, &mut ctl, &mut tally);
        // The control connection's end: Linux's kernel sends a DREQ when the program exits;
        // this side's DREQ crosses it or finds it gone (then a DREP for the unknown ID).
        let r = r.and_then(|(data_ms, data_qp)| {
            let ctl_ms = match ctl_t {
                Ok(ms) => ms,
                Err(t) => self.established.ok_or(CaseError::Deadline("the RTU"))? - t,
            };
            Ok((ctl_ms + data_ms, data_qp))
        });
        let ctl = ctl.to_error().at("cm: QP to ERROR")?;
        let mut r = r;
        if let Some(id) = self.id
            && !self.disconnected
            && let Err(e) = self.cm.disconnect(id)
        {
            r = r.and(Err(CaseError::Cm("disconnect", e)));
        }
        while !self.disconnected && self.now() <= self.deadline {
            let _ = self.cm_event();
        }
        self.drain();
        ctl.destroy().at("cm: destroy QP")?;
        let (connect_ms, how) = r?;
        Ok(Done {
            count: case.count * u32::from(qps.max(1)),
            unit: verb.op(),
            size: case.size,
            checked: tally.checked,
            connect_ms,
            how,
        })
    }

    /// A refused `-R` case ([`super::refuse_perftest`]): perftest's control connection, and
    /// the version exchange with a version perftest does not take.
    pub(super) fn perftest_refuse(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: [u8; 4],
        linux_serves: bool,
    ) -> Result<Done, CaseError> {
        let client = linux_serves;
        let mut ctl = if client {
            let params = ConnectParams {
                responder_resources: 0,
                initiator_depth: 0,
                ..ConnectParams::default()
            };
            let qp = self.qp(pd)?;
            self.connect_retrying_with(qp, linux, PT_PORT, &params)?.0
        } else {
            self.listen(PT_PORT)?;
            let any_depths = |_: u8, _: u8| true;
            let params = AcceptParams::default();
            self.accept_next(pd, linux, PT_PORT, &any_depths, (7, 7), &params)?
                .0
        };
        self.post_ctl_recv(&mut ctl)?;
        let mut v = [0u8; VERSION_LEN];
        v[..REFUSING_VERSION.len()].copy_from_slice(REFUSING_VERSION);
        let r = match self.xchg(&mut ctl, client, &v, VERSION_LEN as u32, "the version") {
            Ok(_) => Ok(()),
            // As the server this side's version goes last: perftest may exit before its rxe
            // acknowledged it, and its kernel's DREQ come first.
            Err(CaseError::Disconnected(_)) if !client => Ok(()),
            Err(e) => Err(e),
        };
        let ctl = ctl.to_error().at("cm: QP to ERROR")?;
        let mut r = r;
        if let Some(id) = self.id
            && !self.disconnected
            && let Err(e) = self.cm.disconnect(id)
        {
            r = r.and(Err(CaseError::Cm("disconnect", e)));
        }
        while !self.disconnected && self.now() <= self.deadline {
            let _ = self.cm_event();
        }
        self.drain();
        ctl.destroy().at("cm: destroy QP")?;
        r.map(|()| Done {
            count: 0,
            unit: "refused",
            size: 0,
            checked: 0,
            connect_ms: 0,
            how: "",
        })
    }

    /// The exchange after the control connection is up: the data connections (one per data
    /// QP, `-q`), the data phase, the data connections' end. Returns the data connections'
    /// connect times (their sum) and what the case checked.
    #[allow(clippy::too_many_arguments)]
    fn perftest_on(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: [u8; 4],
        case: &CmCase,
        (verb, qps): (PtVerb, u8),
        client: bool,
        ctl: &mut QueuePair<'a, P, Rc, Rts>,
        tally: &mut Tally,
    ) -> Result<(u64, &'static str), CaseError> {
        let agreed = self.preamble(ctl, client, tally)?;
        // The first blank pingpong_dest, then the data connections.
        self.blank(ctl, client, tally, "the first blank pingpong_dest")?;
        let n = usize::from(qps).clamp(1, MAX_QPS);
        let depth = if verb.reads() { DEPTH } else { 0 };
        let ctl_id = self.id.take();
        let mut data: [Option<QueuePair<'a, P, Rc, Rts>>; MAX_QPS] = core::array::from_fn(|_| None);
        // The client's connect times, or when the server saw each request.
        let mut t = [0u64; MAX_QPS];
        let mut req_depth = None;
        let mut r = Ok(());
        // perftest's client connects its QPs in order, each as its route resolves (all at
        // once); its server accepts the requests as they come, QP `k` the `k`-th.
        for (k, (slot, t)) in data.iter_mut().zip(&mut t).take(n).enumerate() {
            let c = if client {
                let params = ConnectParams {
                    responder_resources: depth,
                    initiator_depth: depth,
                    ..ConnectParams::default()
                };
                match self.qp(pd) {
                    Ok(qp) => self.connect_retrying_with(qp, linux, PT_PORT, &params),
                    Err(e) => Err(e.into()),
                }
            } else {
                let params = AcceptParams {
                    responder_resources: depth,
                    initiator_depth: depth,
                    ..AcceptParams::default()
                };
                // ib_read_bw, ib_read_lat and ib_atomic_lat ask for their outstanding reads
                // both ways, the others for none; every QP the same.
                let depths_ok = move |r: u8, i: u8| {
                    if depth == 0 {
                        (r, i) == (0, 0)
                    } else {
                        r == i && r >= 1 && req_depth.is_none_or(|d| d == i)
                    }
                };
                self.accept_next(pd, linux, PT_PORT, &depths_ok, (7, 7), &params)
                    .map(|(q, t, req)| {
                        req_depth = Some(req.initiator_depth);
                        (q, t)
                    })
            };
            self.data[k] = self.id.take();
            match c {
                Ok((q, ms)) => {
                    *slot = Some(q);
                    *t = ms;
                }
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
        self.id = ctl_id;
        let r = r.and_then(|()| {
            self.perftest_data(
                ctl,
                &mut data[..n],
                (case, verb, client, linux),
                agreed,
                req_depth,
                tally,
            )
        });
        // The client disconnects the data connections; the server's come down with its exit.
        let mut r = r.and_then(|how| {
            let mut ms = 0;
            for (k, &t) in t.iter().enumerate().take(n) {
                ms += if client {
                    t
                } else {
                    self.data_established[k].ok_or(CaseError::Deadline("the RTU"))? - t
                };
            }
            Ok((ms, how))
        });
        let mut dead: [Option<_>; MAX_QPS] = core::array::from_fn(|_| None);
        for (d, q) in dead.iter_mut().zip(&mut data) {
            if let Some(q) = q.take() {
                *d = Some(q.to_error().at("cm: QP to ERROR")?);
            }
        }
        for k in 0..n {
            if client
                && let Some(id) = self.data[k]
                && !self.data_disconnected[k]
                && let Err(e) = self.cm.disconnect(id)
            {
                r = r.and(Err(CaseError::Cm("disconnect", e)));
            }
        }
        while r.is_ok() && (0..n).any(|k| !self.data_disconnected[k]) {
            let _ = self.cm_event();
            if self.now() > self.deadline {
                r = Err(CaseError::Deadline("the data connections' end"));
            }
        }
        self.drain();
        for q in dead.into_iter().flatten() {
            q.destroy().at("cm: destroy QP")?;
        }
        r
    }

    /// Versions, page size and cache line, MTU.
    fn preamble(
        &mut self,
        ctl: &mut QueuePair<'a, P, Rc, Rts>,
        client: bool,
        tally: &mut Tally,
    ) -> Result<Agreed, CaseError> {
        let mut v = [0u8; VERSION_LEN];
        v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let m = self.xchg(ctl, client, &v, VERSION_LEN as u32, "the version")?;
        msg::check_version(&m[..VERSION_LEN])?;
        tally.checked += VERSION_LEN as u64;
        let m = self.xchg(ctl, client, &PAGE.to_be_bytes(), 4, "the page size")?;
        let page = msg::check_power(&m, PAGE..=MAX_CYCLE, "the page size")?;
        let m = self.xchg(ctl, client, &LINE.to_be_bytes(), 4, "the cache line")?;
        let line = msg::check_power(&m, 16..=PAGE, "the cache line")?;
        let m = self.xchg(ctl, client, &[b'0' + MTU, 0], 2, "the MTU")?;
        msg::check_mtu(&m)?;
        tally.checked += 4 + 4 + 2;
        Ok(Agreed {
            cycle: page.max(PAGE),
            line: line.max(LINE),
        })
    }

    /// A blank `pingpong_dest` each way (perftest's before and after the data connection).
    fn blank(
        &mut self,
        ctl: &mut QueuePair<'a, P, Rc, Rts>,
        client: bool,
        tally: &mut Tally,
        what: &'static str,
    ) -> Result<(), CaseError> {
        let m = self.xchg(ctl, client, &[0; DEST_LEN], DEST_LEN as u32, what)?;
        msg::check_blank(&m, what)?;
        tally.checked += msg::DEFINED as u64;
        Ok(())
    }

    /// The second blank message, the data QP's `pingpong_dest` three times, the data phase
    /// with its barrier and reports, the closing barrier.
    #[allow(clippy::too_many_arguments)]
    fn perftest_data(
        &mut self,
        ctl: &mut QueuePair<'a, P, Rc, Rts>,
        qps: &mut [Option<QueuePair<'a, P, Rc, Rts>>],
        (case, verb, client, linux): (&CmCase, PtVerb, bool, [u8; 4]),
        agreed: Agreed,
        req_depth: Option<u8>,
        tally: &mut Tally,
    ) -> Result<&'static str, CaseError> {
        self.blank(ctl, client, tally, "the second blank pingpong_dest")?;
        let n = qps.len().clamp(1, MAX_QPS);
        let mut mines = [[0u8; DEST_LEN]; MAX_QPS];
        let mut expects = [None; MAX_QPS];
        let mut attr = None;
        for (k, q) in qps.iter_mut().enumerate().take(n) {
            let qp = q.as_mut().ok_or(CaseError::Deadline("a data QP"))?;
            let a = qp.query().at("perftest: query QP")?;
            mines[k] = Dest {
                lid: 0,
                out_reads: if verb.reads() {
                    u32::from(a.max_dest_rd_atomic.max(1))
                } else {
                    1
                },
                qpn: qp.qp_num(),
                psn: a.rq_psn & 0xFF_FFFF,
                rkey: self.mr.rkey(),
                vaddr: self.mr.addr() + u64::from(target_at(verb, case.size, k as u32)),
                gid: Gid::from_ipv4(self.cm.ip()).0,
                srqn: 0,
                gid_index: GID_INDEX,
            }
            .encode();
            expects[k] = Some(msg::Expect {
                qpn: a.dest_qpn,
                gid: Gid::from_ipv4(linux).0,
                out_reads: match (verb.reads(), req_depth) {
                    (true, Some(d)) => Some(u32::from(d)),
                    (true, None) => None,
                    _ => Some(1),
                },
            });
            attr = attr.or(Some(a));
        }
        let attr = attr.ok_or(CaseError::Deadline("a data QP"))?;
        // Each QP's pingpong_dest in turn, then each again, then the first QP's; ib_send_bw
        // sends the first QP's between the two rounds instead.
        let once = if matches!(verb, PtVerb::Send | PtVerb::SendBoth) {
            1
        } else {
            2
        };
        let mut firsts: [Option<[u8; DEST_LEN]>; MAX_QPS] = [None; MAX_QPS];
        let mut peers = [None; MAX_QPS];
        for step in 0..3 {
            for k in 0..if step == once { 1 } else { n } {
                let expect = expects[k].ok_or(CaseError::Deadline("a data QP"))?;
                let d = self.dest(ctl, client, &mines[k], &expect, &mut firsts[k], step, tally)?;
                peers[k] = Some(d);
            }
        }
        let (mine, expect) = (
            mines[0],
            expects[0].ok_or(CaseError::Deadline("a data QP"))?,
        );
        let mut first = firsts[0];
        let peer = peers[0].ok_or(CaseError::Deadline("the peer's pingpong_dest"))?;
        // The report counts every QP's operations.
        let total = CmCase {
            count: case.count * n as u32,
            ..*case
        };
        let (qp, rest) = qps
            .split_first_mut()
            .ok_or(CaseError::Deadline("a data QP"))?;
        let qp = qp.as_mut().ok_or(CaseError::Deadline("a data QP"))?;
        // QP `k` of the `n`.
        macro_rules! qp_k {
            ($k:expr) => {
                match $k {
                    0 => &mut *qp,
                    k => rest
                        .get_mut(k - 1)
                        .and_then(Option::as_mut)
                        .ok_or(CaseError::Deadline("a data QP"))?,
                }
            };
        }
        if verb.latency() {
            let mut next = |s: &mut Self, k| {
                s.dest(ctl, client, &mine, &expect, &mut first, k, tally)
                    .map(|_| ())
            };
            let (checked, how) = self.latency(qp, (case, verb, client), &peer, &mut next)?;
            tally.checked += checked;
            return Ok(how);
        }
        let mut how = EVERY_DEFINED;
        match (verb, client) {
            (PtVerb::Send, true) => {
                self.dest(ctl, client, &mine, &expect, &mut first, 3, tally)?;
                // Each QP's SENDs in turn: perftest's server has its receives posted on all.
                for k in 0..n {
                    self.send_all(qp_k!(k), case, DATA_AT)?;
                }
            }
            (PtVerb::SendBoth, _) => {
                // Both sides' receives posted before the sync, then both SEND at once: the
                // peer's SENDs wait in the receives (or for them: RNR, retried) while this
                // side's go out, then are taken and checked in order.
                let lane = Lane::of(case.size, 0, 1);
                self.post_slots(qp, case.size, lane, case.count)?;
                self.dest(ctl, client, &mine, &expect, &mut first, 3, tally)?;
                let ms = self.now();
                let src = region_len(verb, client, case, 1) - case.size;
                self.send_all(qp, case, src)?;
                tally.checked += self.receive_all(qp, case, agreed, lane)?;
                self.reports(ctl, client, true, case, self.now() - ms, tally)?;
            }
            (PtVerb::Send, false) => {
                // Every QP's receives before the sync; then the QPs' SENDs taken one QP after
                // the other (the peer's SENDs on the others wait in their receives, or for
                // them: RNR, retried).
                for k in 0..n {
                    let lane = Lane::of(case.size, k as u32, n as u32);
                    self.post_slots(qp_k!(k), case.size, lane, case.count)?;
                }
                self.dest(ctl, client, &mine, &expect, &mut first, 3, tally)?;
                for k in 0..n {
                    let lane = Lane::of(case.size, k as u32, n as u32);
                    tally.checked += self.receive_all(qp_k!(k), case, agreed, lane)?;
                }
            }
            (PtVerb::WriteBoth, _) => {
                // The area the peer WRITEs: the pre-fill; this side WRITEs from after it.
                let at = DATA_AT as usize;
                let len = case.size.max(MAX_CYCLE) + GUARD;
                for (j, b) in self.mr.as_mut_slice()[at..at + len as usize]
                    .iter_mut()
                    .enumerate()
                {
                    *b = msg::prefill(j);
                }
                // The sync before both sides WRITE.
                self.dest(ctl, client, &mine, &expect, &mut first, 3, tally)?;
                let ms = self.now();
                self.write_all(qp, case, &peer, DATA_AT + len)?;
                // Each side's own report; the peer's WRITEs completed before it sent its own.
                self.reports(ctl, client, true, case, self.now() - ms, tally)?;
                let area = &self.mr.as_slice()[at..at + len as usize];
                msg::check_write_target(area, case.size, case.count, agreed)?;
                how = EVERY_DEFINED_AND_TARGET;
            }
            (PtVerb::ReadBoth | PtVerb::AtomicBoth, _) => {
                // The buffer the peer READs (the pre-fill) or adds to (zero), then nothing of
                // this side's touches it; this side's READ or result slots follow it.
                let atomic = verb.atomics();
                let at = DATA_AT as usize;
                let len = case.size.max(MAX_CYCLE);
                for (j, b) in self.mr.as_mut_slice()[at..at + len as usize]
                    .iter_mut()
                    .enumerate()
                {
                    *b = if atomic { 0 } else { msg::prefill(j) };
                }
                // The sync before both sides operate.
                self.dest(ctl, client, &mine, &expect, &mut first, 3, tally)?;
                let ms = self.now();
                let window = slots(case.size).min(u32::from(attr.max_rd_atomic.max(1)));
                tally.checked += if atomic {
                    self.add_all(qp, case, &peer, window, DATA_AT + len)?
                } else {
                    self.read_all(qp, case, &peer, window, DATA_AT + len)?
                };
                // Each side's own report; the peer's operations completed before it sent its
                // own.
                self.reports(ctl, client, true, case, self.now() - ms, tally)?;
                if atomic {
                    let area = &self.mr.as_slice()[at..at + len as usize];
                    msg::check_added(area, case.count)?;
                    how = EVERY_DEFINED_RETURNED_AND_ADDED;
                } else if let Some(j) =
                    (0..len as usize).find(|&j| self.mr.as_slice()[at + j] != msg::prefill(j))
                {
                    return Err(CaseError::Message {
                        what: "the buffer the peer READs (changed)",
                        index: 0,
                        at: j as u32,
                    });
                } else {
                    how = EVERY_DEFINED_AND_UNCHANGED;
                }
            }
            (_, true) => {
                // Each QP's WRITEs or READs in turn, to the buffer its peer QP named.
                let ms = self.now();
                for (k, peer) in peers.iter().enumerate().take(n) {
                    let peer = peer.ok_or(CaseError::Deadline("the peer's pingpong_dest"))?;
                    if verb == PtVerb::Write {
                        self.write_all(qp_k!(k), case, &peer, DATA_AT)?;
                    } else if verb.atomics() {
                        let window = slots(case.size).min(u32::from(attr.max_rd_atomic.max(1)));
                        tally.checked += self.add_all(qp_k!(k), case, &peer, window, DATA_AT)?;
                        how = EVERY_DEFINED_AND_RETURNED;
                    } else {
                        let window = slots(case.size).min(u32::from(attr.max_rd_atomic.max(1)));
                        tally.checked += self.read_all(qp_k!(k), case, &peer, window, DATA_AT)?;
                    }
                }
                self.dest(ctl, client, &mine, &expect, &mut first, 3, tally)?;
                self.reports(ctl, client, false, &total, self.now() - ms, tally)?;
            }
            (_, false) => {
                // The areas the peer WRITEs (a target per QP) or READs: the pre-fill, then
                // nothing touches them.
                let at = DATA_AT as usize;
                let len = region_len(verb, false, case, n as u8) - DATA_AT;
                let each = if verb == PtVerb::Write {
                    target_len(case.size)
                } else {
                    len
                };
                for (j, b) in self.mr.as_mut_slice()[at..at + len as usize]
                    .iter_mut()
                    .enumerate()
                {
                    *b = if verb.atomics() {
                        0
                    } else {
                        msg::prefill(j % each as usize)
                    };
                }
                self.dest(ctl, client, &mine, &expect, &mut first, 3, tally)?;
                self.reports(ctl, client, false, &total, 0, tally)?;
                if verb == PtVerb::Write {
                    for k in 0..n {
                        let at = at + k * each as usize;
                        let area = &self.mr.as_slice()[at..at + each as usize];
                        msg::check_write_target(area, case.size, case.count, agreed)?;
                    }
                    how = EVERY_DEFINED_AND_TARGET;
                } else if verb.atomics() {
                    // Every QP's fetch-and-adds land in the one area: -n times the QPs.
                    let area = &self.mr.as_slice()[at..at + len as usize];
                    msg::check_added(area, total.count)?;
                    how = EVERY_DEFINED_AND_ADDED;
                } else if let Some(j) =
                    (0..len as usize).find(|&j| self.mr.as_slice()[at + j] != msg::prefill(j))
                {
                    return Err(CaseError::Message {
                        what: "the buffer the peer READs (changed)",
                        index: 0,
                        at: j as u32,
                    });
                } else {
                    how = EVERY_DEFINED_AND_READ_FROM;
                }
            }
        }
        self.dest(ctl, client, &mine, &expect, &mut first, 4, tally)?;
        Ok(how)
    }

    /// One `pingpong_dest` each way (`index` from 0): checked, and the same bytes each time.
    #[allow(clippy::too_many_arguments)]
    fn dest(
        &mut self,
        ctl: &mut QueuePair<'a, P, Rc, Rts>,
        client: bool,
        mine: &[u8; DEST_LEN],
        expect: &msg::Expect,
        first: &mut Option<[u8; DEST_LEN]>,
        index: u32,
        tally: &mut Tally,
    ) -> Result<Dest, CaseError> {
        let m = self.xchg(ctl, client, mine, DEST_LEN as u32, "a pingpong_dest")?;
        let d = msg::check_dest(&m, expect, first, index)?;
        tally.checked += msg::DEFINED as u64;
        Ok(d)
    }

    /// The five words of the report each way: the client's own (size, iterations, peak and
    /// average bandwidth in MiB/s, message rate in Mpps; `ms` its data phase), checked as
    /// the server takes them; the server's are not perftest-defined. With `duplex` (`-b`)
    /// each side sends its own and checks the peer's.
    fn reports(
        &mut self,
        ctl: &mut QueuePair<'a, P, Rc, Rts>,
        client: bool,
        duplex: bool,
        case: &CmCase,
        ms: u64,
        tally: &mut Tally,
    ) -> Result<(), CaseError> {
        let secs = ms.max(16) as f64 / 1000.0;
        let bw = f64::from(case.size) * f64::from(case.count) / secs / (1u64 << 20) as f64;
        let mine = if client || duplex {
            Report {
                size: case.size.into(),
                iters: case.count.into(),
                bw_peak: bw,
                bw_avg: bw,
                msg_rate: f64::from(case.count) / secs / 1e6,
            }
        } else {
            Report::default()
        };
        let mut words = [0u64; 5];
        for (w, theirs) in mine.words().iter().zip(words.iter_mut()) {
            let m = self.xchg(ctl, client, &w.to_be_bytes(), 8, "a report word")?;
            let mut b = [0u8; 8];
            b.copy_from_slice(&m[..8]);
            *theirs = u64::from_be_bytes(b);
        }
        if !client || duplex {
            msg::check_report(&Report::from_words(words), case)?;
            tally.checked += 40;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_parse_as_perftests_options() {
        let c = parse("ib_read_bw-client,-R,-s,4096,-n,200").expect("parses");
        assert_eq!(
            (c.program, c.size, c.count),
            (
                Program::Perftest {
                    verb: PtVerb::Read,
                    linux_serves: false
                },
                4096,
                200
            )
        );
        let d = parse("ib_send_bw-server,-R").expect("defaults");
        assert_eq!((d.size, d.count), (65536, 1000));
        assert_eq!(PtVerb::Send.case_name(true), "ib_send_bw-server");
        // -R is what these cases are; sizes within the region's bounds.
        assert_eq!(parse("ib_send_bw-server,-s,4096"), None);
        assert_eq!(parse("ib_send_bw-server,-R,-s,8388609"), None);
        // A tag tells cases of one program apart.
        let t = parse("ib_write_bw-8m-server,-R,-s,8388608,-n,5").expect("tagged");
        assert_eq!(
            (t.program, t.size, t.count),
            (
                Program::Perftest {
                    verb: PtVerb::Write,
                    linux_serves: true
                },
                8 << 20,
                5
            )
        );
        assert_eq!(parse("ib_write_bw-8-m-server,-R"), None);
        assert_eq!(parse("ib_write_bw--server,-R"), None);
        assert_eq!(parse("ib_send_bw-server,-R,-n,0"), None);
        assert_eq!(parse("ib_send_bw-server,-R,-x,1"), None);
        // ib_atomic_bw: 8 bytes only, -b and -q too.
        assert_eq!(parse("ib_atomic_bw-server,-R,-s,16"), None);
        let a = parse("ib_atomic_bw-cmb-client,-R,-b,-n,200").expect("atomics");
        assert_eq!(
            (a.program, a.size, a.count),
            (
                Program::Perftest {
                    verb: PtVerb::AtomicBoth,
                    linux_serves: false
                },
                8,
                200
            )
        );
        assert_eq!(
            parse("ib_atomic_bw-cmq2-server,-R,-q,2").map(|c| c.program),
            Some(Program::PerftestQps {
                verb: PtVerb::AtomicBw,
                linux_serves: true,
                qps: 2
            })
        );
        assert_eq!(
            region_len(
                PtVerb::AtomicBoth,
                true,
                &parse("ib_atomic_bw-server,-R").unwrap(),
                1
            ),
            DATA_AT + MAX_CYCLE + 17 * 64
        );
        // The latency programs: their defaults, atomics of 8 bytes only.
        let l = parse("ib_write_lat-cm-client,-R").expect("latency");
        assert_eq!(
            (l.program, l.size, l.count),
            (
                Program::Perftest {
                    verb: PtVerb::WriteLat,
                    linux_serves: false
                },
                2,
                1000
            )
        );
        assert_eq!(parse("ib_atomic_lat-server,-R").map(|c| c.size), Some(8));
        assert_eq!(parse("ib_atomic_lat-server,-R,-s,16"), None);
        assert_eq!(parse("ib_read_lat-server,-s,2"), None);
        // Every program's names parse back to it, in both roles.
        for v in PtVerb::ALL {
            for serves in [true, false] {
                let name = v.case_name(serves);
                let mut buf = [0u8; 32];
                buf[..name.len()].copy_from_slice(name.as_bytes());
                buf[name.len()..name.len() + 3].copy_from_slice(b",-R");
                let spec = core::str::from_utf8(&buf[..name.len() + 3]).expect("text");
                let c = parse(spec).expect("name");
                assert_eq!(
                    c.program,
                    Program::Perftest {
                        verb: v,
                        linux_serves: serves
                    }
                );
            }
        }
        // The regions hold what each role touches.
        let case = |size| CmCase {
            program: Program::Perftest {
                verb: PtVerb::SendLat,
                linux_serves: true,
            },
            size,
            count: 1,
        };
        assert_eq!(
            region_len(PtVerb::SendLat, true, &case(2), 1),
            DATA_AT + 4 * 64
        );
        assert_eq!(
            region_len(PtVerb::ReadLat, false, &case(100), 1),
            DATA_AT + 2 * 128
        );
        assert_eq!(
            region_len(PtVerb::AtomicLat, true, &case(8), 1),
            DATA_AT + 64
        );
        assert_eq!(target_at(PtVerb::WriteLat, 2, 0), DATA_AT + 64);
        assert_eq!(target_at(PtVerb::Write, 2, 0), DATA_AT);
        // -q: a WRITE target and its guard per QP; the receive slots shared, an image each.
        assert_eq!(target_at(PtVerb::Write, 2, 1), DATA_AT + 64 * 1024 + GUARD);
        assert_eq!(
            region_len(PtVerb::Write, false, &case(4096), 2),
            DATA_AT + 2 * (64 * 1024 + GUARD)
        );
        assert_eq!(
            region_len(PtVerb::Send, false, &case(4096), 2),
            DATA_AT + 2 * 8 * 4096 + 2 * 64 * 1024
        );
        assert_eq!(lane_slots(4096, 2), 8);
        assert_eq!(lane_slots(8 << 20, 2), 1);
        // -o: within the depth this side offers, for the programs that READ.
        assert!(CmCase::parse("ib_read_bw-cmb-server,-R,-b,-o,16").is_some());
        assert!(CmCase::parse("ib_read_bw-cmb-server,-R,-b,-o,17").is_none());
        assert!(CmCase::parse("ib_write_bw-server,-R,-o,16").is_none());
        // -q: ib_send_bw, ib_write_bw and ib_read_bw, up to four QPs.
        for (spec, verb) in [
            (
                "ib_write_bw-cmq2-client,-R,-q,2,-s,4096,-n,200",
                PtVerb::Write,
            ),
            (
                "ib_send_bw-cmq2-server,-R,-q,2,-s,4096,-n,200",
                PtVerb::Send,
            ),
            ("ib_read_bw-cmq4-client,-R,-q,4", PtVerb::Read),
        ] {
            let c = CmCase::parse(spec).expect(spec);
            let Program::PerftestQps { verb: v, qps, .. } = c.program else {
                panic!("{spec}: {:?}", c.program);
            };
            assert_eq!(v, verb, "{spec}");
            assert_eq!(qps, if spec.contains("-q,4") { 4 } else { 2 }, "{spec}");
        }
        for bad in [
            "ib_write_bw-cmq5-client,-R,-q,5",
            "ib_write_bw-cmq0-client,-R,-q,0",
            "ib_write_bw-cmqb-client,-R,-q,2,-b",
            "ib_write_bw-cmq2-client,-R,-q,2,-s,8388608",
        ] {
            assert_eq!(CmCase::parse(bad), None, "{bad}");
        }
        assert_eq!(
            CmCase::parse("ib_write_bw-server,-R,-s,4096,-n,200").map(|c| c.program),
            Some(Program::Perftest {
                verb: PtVerb::Write,
                linux_serves: true
            })
        );
    }
}
