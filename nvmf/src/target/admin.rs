//! Admin and fabrics commands: Connect, Property Get/Set, Identify, Set/Get Features, Keep
//! Alive, Get Log Page, Abort (the asynchronous event request is held in `exec.rs`, a
//! controller reset by CC.EN = 0 done in `mod.rs`).

use bareverbs::hal::Clock;
use bareverbs::verbs::Provider;

use super::ana::{self, ANA_GROUPS, ANACAP, ANATT_S};
use super::ctrl::{Ctrl, ERROR_LOG_ENTRIES, ErrorLog, Which};
use super::exec::{Dir, Fail};
use super::{ADMIN_DEPTH, AER_HELD, Subsystem, Target, TargetConfig};
use crate::wire::fabrics::{
    CNTLID_DYNAMIC, Connect, ConnectData, DISCOVERY_NQN, Nqn, Property, invalid,
};
use crate::wire::identify::{IDENTIFY_LEN, IdCtrl, IdNs, cns, cntrltype};
use crate::wire::{Sqe, Status, fctype, feature, le16, log, opcode, prop};

/// NVMe version the controllers report (1.3).
pub const VERSION: u32 = 0x0001_0300;
/// Keep-alive granularity reported (100 ms units).
const KAS: u16 = 10;
/// Keep-alive timeout of a discovery controller whose Connect asked for none (ms; at most
/// [`TargetConfig::max_kato_ms`]).
pub const DISCOVERY_KATO_MS: u32 = 120_000;

/// The keep-alive timeout granted for `asked` ms (a Connect's KATO, or Set Features'): none
/// asked, the default (`discovery`: [`DISCOVERY_KATO_MS`]); else the value rounded up to the
/// granularity reported (KAS: 1 s); never more than the maximum, never 0.
pub(super) fn grant_kato(cfg: &TargetConfig, asked: u32, discovery: bool) -> u32 {
    let step = u32::from(KAS) * 100;
    let want = match (asked, discovery) {
        (0, true) => DISCOVERY_KATO_MS,
        (0, false) => cfg.default_kato_ms,
        (k, _) => k.div_ceil(step).saturating_mul(step),
    };
    want.min(cfg.max_kato_ms).max(1)
}
/// Highest controller ID there is (the range above is reserved).
pub(super) const CNTLID_MAX: u16 = 0xFFEF;

/// What an admin command may touch.
pub(super) struct Cx<'x, 's> {
    pub ctrl: &'x mut Ctrl,
    pub subsystems: &'x mut [Subsystem<'s>],
    pub cfg: &'x TargetConfig,
    pub ip: [u8; 4],
    /// The controller's counts (its queues summed), for the SMART log (only for Get Log
    /// Page: summed on demand, nothing on other commands' way).
    pub io: Option<&'x super::IoCounts>,
    /// The target's clock as last read, and when the target was made (µs).
    pub now_us: u64,
    pub born_us: u64,
}

/// Which way an admin command's data goes (Connect is handled before).
pub(super) fn direction(sqe: &Sqe) -> Result<Dir, Status> {
    Ok(match sqe.opcode() {
        opcode::FABRICS => match sqe.fctype() {
            fctype::PROPERTY_GET | fctype::PROPERTY_SET => Dir::None,
            _ => return Err(Status::INVALID_OPCODE),
        },
        opcode::IDENTIFY => Dir::ToHost(IDENTIFY_LEN as u32),
        opcode::GET_LOG_PAGE => {
            let numd = (u32::from(le16(&sqe.0, 44)) << 16) | u32::from(le16(&sqe.0, 42));
            // NUMD is 0's based: at most 2^32 dwords; the caller bounds it by the buffer.
            let bytes = (u64::from(numd) + 1) * 4;
            Dir::ToHost(u32::try_from(bytes).map_err(|_| Status::INVALID_FIELD)?)
        }
        opcode::SET_FEATURES | opcode::GET_FEATURES | opcode::KEEP_ALIVE | opcode::ABORT => {
            Dir::None
        }
        opcode::ASYNC_EVENT => Dir::None,
        _ => return Err(Status::INVALID_OPCODE),
    })
}

fn cap(cfg: &TargetConfig) -> u64 {
    // MQES (0's based: the I/O queue depth the CM accepts), CQR, TO = 15 (7.5 s), CSS bit
    // 37 (NVM command set).
    u64::from(cfg.io_depth.saturating_sub(1)) | (1 << 16) | (15 << 24) | (1 << 37)
}

fn csts(cc: u32) -> u32 {
    let mut v = 0;
    if cc & prop::CC_EN != 0 {
        v |= prop::CSTS_RDY;
    }
    if cc & prop::CC_SHN_MASK != 0 {
        v |= prop::CSTS_SHST_DONE;
    }
    v
}

/// Runs an admin command with its data buffer `buf`.
pub(super) fn run(cx: &mut Cx<'_, '_>, sqe: &Sqe, buf: &mut [u8]) -> Result<u64, Status> {
    match sqe.opcode() {
        opcode::FABRICS => property(cx, sqe),
        opcode::IDENTIFY => identify(cx, sqe, buf),
        opcode::GET_LOG_PAGE => get_log_page(cx, sqe, buf),
        opcode::SET_FEATURES => set_features(cx, sqe),
        opcode::GET_FEATURES => get_features(cx, sqe),
        opcode::KEEP_ALIVE => Ok(0),
        // Abort: never performed (Dword 0 bit 0 set: "not aborted", which the specification
        // allows); commands here finish on their own. Not a discovery controller's command.
        opcode::ABORT if cx.ctrl.which != Which::Discovery => Ok(1),
        _ => Err(Status::INVALID_OPCODE),
    }
}

fn property(cx: &mut Cx<'_, '_>, sqe: &Sqe) -> Result<u64, Status> {
    let p = Property::parse(sqe).ok_or(Status::INVALID_FIELD)?;
    if sqe.fctype() == fctype::PROPERTY_GET {
        return match (p.offset, p.size8) {
            (prop::CAP, _) => Ok(cap(cx.cfg)),
            (prop::VS, false) => Ok(u64::from(VERSION)),
            (prop::CC, false) => Ok(u64::from(cx.ctrl.cc)),
            (prop::CSTS, false) => Ok(u64::from(csts(cx.ctrl.cc))),
            _ => Err(Status::INVALID_FIELD),
        };
    }
    match (p.offset, p.size8) {
        (prop::CC, false) => {
            cx.ctrl.cc = p.value as u32;
            Ok(0)
        }
        _ => Err(Status::INVALID_FIELD),
    }
}

fn identify(cx: &mut Cx<'_, '_>, sqe: &Sqe, buf: &mut [u8]) -> Result<u64, Status> {
    if buf.len() < IDENTIFY_LEN {
        return Err(Status::INVALID_FIELD);
    }
    let cns = sqe.cdw(10) as u8;
    let sub = match cx.ctrl.which {
        Which::Discovery => {
            if cns != cns::CONTROLLER {
                return Err(Status::INVALID_FIELD);
            }
            let disc = IdCtrl {
                serial: "bareverbs-discovery",
                model: "bareverbs",
                firmware: env!("CARGO_PKG_VERSION"),
                mdts: 0,
                cntlid: cx.ctrl.cntlid,
                ver: VERSION,
                cntrltype: cntrltype::DISCOVERY,
                aerl: AER_HELD - 1,
                maxcmd: ADMIN_DEPTH,
                sgls: 0x5,
                subnqn: DISCOVERY_NQN.as_bytes(),
                ioccsz: 4,
                iorcsz: 1,
                msdbd: 1,
                ..IdCtrl::default()
            };
            disc.write(buf);
            return Ok(0);
        }
        Which::Nvm(k) => cx.subsystems.get_mut(k).ok_or(Status::INTERNAL)?,
    };
    let nn = sub.namespaces.len() as u32;
    let nsid = sqe.nsid();
    match cns {
        cns::CONTROLLER => {
            let mdts = (cx.cfg.max_transfer / 4096).trailing_zeros() as u8;
            let inline = cx.cfg.inline_data;
            IdCtrl {
                serial: sub.serial,
                model: "bareverbs",
                firmware: env!("CARGO_PKG_VERSION"),
                // Several ports and controllers; ANA reported where there is a namespace
                // (Linux wants MNAN, which is NN here, to be 1 or more with ANA).
                cmic: if nn > 0 { 0x0B } else { 0x03 },
                oaes: crate::wire::ana::AEN_ANA_CHANGE,
                anatt: ANATT_S,
                anacap: ANACAP,
                anagrpmax: ANA_GROUPS,
                nanagrpid: ANA_GROUPS,
                mnan: nn,
                mdts,
                cntlid: cx.ctrl.cntlid,
                ver: VERSION,
                cntrltype: cntrltype::IO,
                acl: 3,
                aerl: AER_HELD - 1,
                elpe: (ERROR_LOG_ENTRIES - 1) as u8,
                kas: KAS,
                maxcmd: cx.cfg.io_depth,
                nn,
                oncs: 1 << 3,
                // Set where a namespace of the subsystem has a volatile cache (flush
                // behaviour bits 2:1 left 00b: not indicated, as a 1.3 controller).
                vwc: u8::from(sub.volatile_cache()),
                sgls: 0x5 | if inline > 0 { 1 << 20 } else { 0 },
                subnqn: sub.nqn.as_bytes(),
                ioccsz: (64 + inline) / 16,
                iorcsz: 1,
                // A descriptor list travels in the capsule: only with in-capsule data.
                msdbd: if inline >= 16 { super::MSDBD } else { 1 },
                ..IdCtrl::default()
            }
            .write(buf);
        }
        cns::NAMESPACE => {
            let ns = ns_index(nsid, nn)?;
            let dev = &sub.namespaces[ns];
            let blocks = dev.capacity();
            IdNs {
                nsze: blocks,
                ncap: blocks,
                nuse: blocks,
                lbads: dev.block_size().trailing_zeros() as u8,
                // May be shared: several controllers (appliances) serve it.
                nmic: 1,
                anagrpid: ana::anagrpid(sub, nsid),
                nguid: ns_nguid(sub, nsid),
                eui64: sub.multipath.ns(nsid).eui64.unwrap_or_default(),
            }
            .write(buf);
        }
        cns::ACTIVE_NS_LIST => {
            let buf = &mut buf[..IDENTIFY_LEN];
            buf.fill(0);
            let mut at = 0;
            for id in (nsid.saturating_add(1)..=nn).take(IDENTIFY_LEN / 4) {
                buf[at..at + 4].copy_from_slice(&id.to_le_bytes());
                at += 4;
            }
        }
        cns::NS_DESC_LIST => {
            ns_index(nsid, nn)?;
            ana::ns_desc_list(sub, nsid, ns_nguid(sub, nsid), &mut buf[..IDENTIFY_LEN]);
        }
        _ => return Err(Status::INVALID_FIELD),
    }
    Ok(0)
}

/// `nsid` (1-based) as an index, or Invalid Namespace.
pub(super) fn ns_index(nsid: u32, nn: u32) -> Result<usize, Status> {
    if nsid == 0 || nsid > nn {
        return Err(Status::INVALID_NS);
    }
    Ok((nsid - 1) as usize)
}

/// Namespace `nsid`'s GUID: the configured one, else [`nguid`]'s.
fn ns_nguid(sub: &Subsystem<'_>, nsid: u32) -> [u8; 16] {
    sub.multipath
        .ns(nsid)
        .nguid
        .unwrap_or_else(|| nguid(sub.nqn, nsid))
}

/// A namespace GUID from the subsystem's NQN and the NSID (FNV-1a, both halves), stable
/// across restarts and distinct between subsystems.
fn nguid(nqn: &str, nsid: u32) -> [u8; 16] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in nqn.bytes().chain(nsid.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&h.to_be_bytes());
    g[8..].copy_from_slice(&(h.rotate_left(29) ^ 0x6261_7265_7665_7262).to_be_bytes());
    g
}

fn get_log_page(cx: &mut Cx<'_, '_>, sqe: &Sqe, buf: &mut [u8]) -> Result<u64, Status> {
    let lid = sqe.0[40];
    let lpo = crate::wire::le64(&sqe.0, 48);
    if !lpo.is_multiple_of(4) {
        return Err(Status::INVALID_FIELD);
    }
    buf.fill(0);
    match (cx.ctrl.which, lid) {
        (Which::Discovery, log::DISCOVERY) => ana::discovery_log(cx, lpo, buf),
        (Which::Nvm(_), log::SMART) => copy_from(&smart_log(cx), lpo, buf),
        (Which::Nvm(_), log::ERROR) => error_log(&cx.ctrl.errors, lpo, buf),
        (Which::Nvm(k), log::ANA) => ana::log_page(cx, k, sqe, lpo, buf),
        _ => Err(Status::INVALID_LOG_PAGE),
    }
}

/// The SMART / Health Information log of the controller (the same for any NSID: the
/// host's, over the lives of its controllers on this subsystem, of this host's commands only;
/// other hosts' traffic is not theirs to read: a reconnecting host reads on from where its
/// last controller stopped, `HostHistories`). Filled: Data Units Read and Written (thousands of 512-byte units, rounded
/// up), Host Read and Write Commands (Reads and Writes completed successfully), Controller
/// Busy Time (minutes with an I/O command outstanding), Power On Hours (since the target
/// started), Media and Data Integrity Errors (commands the medium failed), and the number of
/// Error Information log entries. The rest is 0: no temperature sensor, no spare, no wear.
fn smart_log(cx: &Cx<'_, '_>) -> [u8; log::SMART_LEN] {
    let mut page = [0u8; log::SMART_LEN];
    let none = super::IoCounts::default();
    // This controller's counts on top of what its host's controllers before it counted.
    let carried = &cx.ctrl.carried;
    let mut io = carried.io;
    io.add(cx.io.unwrap_or(&none));
    let io = &io;
    let hours = cx.now_us.saturating_sub(cx.born_us) / 3_600_000_000;
    let busy = cx
        .ctrl
        .busy_time_us(cx.now_us)
        .saturating_add(carried.busy_us);
    let minutes = busy / 60_000_000;
    for (at, v) in [
        (
            log::SMART_DATA_UNITS_READ,
            super::IoCounts::data_units(io.units_read),
        ),
        (
            log::SMART_DATA_UNITS_WRITTEN,
            super::IoCounts::data_units(io.units_written),
        ),
        (log::SMART_HOST_READS, io.reads),
        (log::SMART_HOST_WRITES, io.writes),
        (log::SMART_BUSY_MINUTES, minutes),
        (log::SMART_POWER_ON_HOURS, hours),
        (log::SMART_MEDIA_ERRORS, io.media_errors),
        (
            log::SMART_ERROR_ENTRIES,
            cx.ctrl.errors.count().saturating_add(carried.errors),
        ),
    ] {
        page[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    page
}

/// Bytes of `page` from `lpo` into `buf` (the rest of `buf` zero); an offset past the page is
/// an invalid field.
fn copy_from(page: &[u8], lpo: u64, buf: &mut [u8]) -> Result<u64, Status> {
    let from = usize::try_from(lpo)
        .ok()
        .filter(|&f| f <= page.len())
        .ok_or(Status::INVALID_FIELD)?;
    let src = &page[from..];
    let n = src.len().min(buf.len());
    buf[..n].copy_from_slice(&src[..n]);
    Ok(0)
}

/// The Error Information log from byte `lpo`: one 64-byte entry per error kept, the newest
/// first (as nvmet orders them), then empty entries (error count 0) up to the
/// [`ERROR_LOG_ENTRIES`] Identify Controller's ELPE announces.
fn error_log(errors: &ErrorLog, lpo: u64, buf: &mut [u8]) -> Result<u64, Status> {
    let mut page = [0u8; ERROR_LOG_ENTRIES * log::ERROR_ENTRY_LEN];
    for (k, slot) in page.chunks_exact_mut(log::ERROR_ENTRY_LEN).enumerate() {
        if let Some(e) = errors.newest(k) {
            e.write(slot);
        }
    }
    copy_from(&page, lpo, buf)
}

fn set_features(cx: &mut Cx<'_, '_>, sqe: &Sqe) -> Result<u64, Status> {
    if sqe.cdw(10) & (1 << 31) != 0 {
        return Err(Status::FEATURE_NOT_SAVEABLE);
    }
    let v = sqe.cdw(11);
    match sqe.cdw(10) as u8 {
        feature::NUM_QUEUES if cx.ctrl.which != Which::Discovery => {
            let (nsq, ncq) = (v & 0xFFFF, v >> 16);
            if nsq == 0xFFFF || ncq == 0xFFFF {
                return Err(Status::INVALID_FIELD);
            }
            let n = (nsq.min(ncq) + 1).min(u32::from(cx.cfg.max_io_queues)) as u16;
            cx.ctrl.io_granted = n;
            Ok(num_queues(n))
        }
        // The timeout asked for, within the target's bounds (Get Features tells the host
        // what it got).
        feature::KEEP_ALIVE => {
            cx.ctrl.kato_ms = grant_kato(cx.cfg, v, cx.ctrl.which == Which::Discovery);
            Ok(0)
        }
        feature::ASYNC_EVENT => {
            cx.ctrl.aec = v;
            Ok(0)
        }
        // Where the subsystem has a volatile cache: off, this controller's writes are
        // written through (each made durable before its answer).
        feature::VOLATILE_WC if has_cache(cx) => {
            cx.ctrl.wce = v & 1 != 0;
            Ok(0)
        }
        _ => Err(Status::INVALID_FIELD),
    }
}

/// Whether the controller's subsystem has a volatile write cache (Identify's VWC bit).
fn has_cache(cx: &Cx<'_, '_>) -> bool {
    match cx.ctrl.which {
        Which::Nvm(k) => cx.subsystems.get(k).is_some_and(|s| s.volatile_cache()),
        Which::Discovery => false,
    }
}

fn num_queues(n: u16) -> u64 {
    let z = u64::from(n.max(1) - 1);
    z | (z << 16)
}

fn get_features(cx: &mut Cx<'_, '_>, sqe: &Sqe) -> Result<u64, Status> {
    match sqe.cdw(10) as u8 {
        feature::NUM_QUEUES if cx.ctrl.which != Which::Discovery => {
            let n = if cx.ctrl.io_granted == 0 {
                cx.cfg.max_io_queues
            } else {
                cx.ctrl.io_granted
            };
            Ok(num_queues(n))
        }
        feature::KEEP_ALIVE => Ok(u64::from(cx.ctrl.kato_ms)),
        feature::ASYNC_EVENT => Ok(u64::from(cx.ctrl.aec)),
        feature::VOLATILE_WC if has_cache(cx) => Ok(u64::from(cx.ctrl.wce)),
        _ => Err(Status::INVALID_FIELD),
    }
}

impl<P: Provider, K: Clock, const Q: usize, const D: usize> Target<'_, '_, P, K, Q, D> {
    /// Connect on queue `q` with its 1024 bytes of data `d`: on the admin queue a new
    /// controller, on an I/O queue the binding to the host's controller. A refusal for an
    /// invalid parameter names it in dword 0 ([`invalid`]).
    pub(super) fn connect(&mut self, q: usize, sqe: &Sqe, d: &[u8]) -> Result<u64, Fail> {
        let c = Connect::parse(sqe);
        if c.recfmt != 0 {
            return Err(Status::CONNECT_FORMAT.into());
        }
        let param = |dw0: u32| Fail {
            status: Status::CONNECT_INVALID_PARAM,
            dw0,
        };
        let data = ConnectData::parse(d).ok_or_else(|| {
            let subnqn_ok = d.get(256..512).and_then(Nqn::from_field).is_some();
            param(invalid::data(if subnqn_ok {
                invalid::HOSTNQN
            } else {
                invalid::SUBNQN
            }))
        })?;
        let queue = &self.queues[q];
        if c.qid != queue.qid {
            return Err(param(invalid::sqe(invalid::QID)));
        }
        if c.sqsize == 0 || c.sqsize >= queue.depth {
            return Err(param(invalid::sqe(invalid::SQSIZE)));
        }
        let which = if data.subnqn.as_str() == DISCOVERY_NQN {
            Which::Discovery
        } else {
            let k = self
                .subsystems
                .iter()
                .position(|s| s.nqn == data.subnqn.as_str())
                .ok_or(param(invalid::data(invalid::SUBNQN)))?;
            if !self.subsystems[k].allows(data.hostnqn.as_str()) {
                return Err(Status::CONNECT_INVALID_HOST.into());
            }
            // An I/O queue a poll group serves, for a subsystem the groups cannot reach: its
            // connection request named another controller than this Connect does (the
            // placement followed the request). Answered as a controller that does not exist.
            if c.qid != 0 && queue.remote.is_some() && self.subsystems[k].core0_only {
                return Err(param(invalid::data(invalid::CNTLID)));
            }
            Which::Nvm(k)
        };
        if c.qid == 0 {
            return self.new_ctrl(q, which, &c, &data);
        }
        // An I/O queue: the controller the admin Connect made, for the same subsystem and
        // host (NQN and host ID), from the same station as its admin queue. Anything else is
        // answered as a controller ID that does not exist (nvmet's answer to one): a stranger
        // learns nothing of the controllers others have, and takes no part in them.
        let station = queue.station;
        let idx = self
            .ctrls
            .iter()
            .position(|x| {
                x.as_ref().is_some_and(|x| {
                    x.cntlid == data.cntlid
                        && x.which == which
                        && x.hostnqn == data.hostnqn
                        && x.hostid == data.hostid
                        && x.station == station
                })
            })
            .ok_or(param(invalid::data(invalid::CNTLID)))?;
        let ctrl = self.ctrls[idx].as_mut().ok_or(Status::INTERNAL)?;
        let limit = if ctrl.io_granted == 0 {
            self.cfg.max_io_queues
        } else {
            ctrl.io_granted
        };
        let dup = self
            .queues
            .iter()
            .any(|o| o.in_use() && o.ctrl == Some(idx) && o.qid == c.qid);
        if which == Which::Discovery || c.qid > limit || dup {
            return Err(param(invalid::sqe(invalid::QID)));
        }
        ctrl.io_queues += 1;
        self.queues[q].ctrl = Some(idx);
        Ok(u64::from(ctrl.cntlid))
    }

    fn new_ctrl(
        &mut self,
        q: usize,
        which: Which,
        c: &Connect,
        data: &ConnectData,
    ) -> Result<u64, Fail> {
        if data.cntlid != CNTLID_DYNAMIC {
            return Err(Fail {
                status: Status::CONNECT_INVALID_PARAM,
                dw0: invalid::data(invalid::CNTLID),
            });
        }
        let slot = self
            .ctrls
            .iter()
            .position(|x| x.is_none())
            .ok_or(Status::CONNECT_BUSY)?;
        // The next ID of the configured range no live controller has (the table has Q
        // entries: Q + 1 tries find one in a range that large; a smaller range may be full).
        let (lo, hi) = (self.cfg.cntlid_min, self.cfg.cntlid_max);
        let after = |id: u16| if id >= hi || id < lo { lo } else { id + 1 };
        let mut cntlid = self.next_cntlid.clamp(lo, hi);
        let tries = usize::from(hi - lo).saturating_add(1).min(Q + 1);
        let mut found = false;
        for _ in 0..tries {
            if !self.ctrls.iter().flatten().any(|x| x.cntlid == cntlid) {
                found = true;
                break;
            }
            cntlid = after(cntlid);
        }
        if !found {
            return Err(Status::CONNECT_BUSY.into());
        }
        self.next_cntlid = after(cntlid);
        // No timeout asked: the configured default for an I/O controller, two minutes for a
        // discovery controller (nvmet's); any timeout at most the configured maximum. So a
        // controller whose host vanished never stays beyond that.
        let kato_ms = grant_kato(&self.cfg, c.kato_ms, which == Which::Discovery);
        // Its host's SMART counts so far (an I/O controller's): taken from the table, given
        // back when it ends.
        let carried = match which {
            Which::Nvm(k) => self.histories.take(k, &data.hostnqn, &data.hostid),
            Which::Discovery => super::Carried::default(),
        };
        self.ctrls[slot] = Some(Ctrl {
            cntlid,
            which,
            hostnqn: data.hostnqn,
            hostid: data.hostid,
            station: self.queues[q].station,
            kato_ms,
            last_us: self.now_us,
            longest_idle_us: 0,
            cc: 0,
            io_granted: 0,
            io_queues: 0,
            aers: 0,
            aec: 0,
            ana_pending: false,
            ana_masked: false,
            errors: ErrorLog::default(),
            wce: true,
            outstanding: 0,
            busy_since_us: 0,
            busy_us: 0,
            retired: super::IoCounts::default(),
            carried,
        });
        self.counts.controllers += 1;
        self.queues[q].ctrl = Some(slot);
        Ok(u64::from(cntlid))
    }
}
