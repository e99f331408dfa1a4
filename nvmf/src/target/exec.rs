//! A command's way through a queue: its capsule checked, its data located (in the capsule,
//! or fetched by RDMA READ into a data buffer), executed, and answered (after an RDMA WRITE
//! of the data it returns).

use bareverbs::hal::Clock;
use bareverbs::verbs::Provider;

use super::ctrl::Which;
use super::queue::{Cmd, Reply};
use super::remote::{self, Remote};
use super::{AER_HELD, Target, admin, io};
use crate::wire::log::{ErrorEntry, NO_LOCATION};
use crate::wire::{Cqe, SQE_LEN, Sgl, Sqe, Status, fctype, le16, opcode, prop};

/// A command's failure: its status, and dword 0 of its response (where a Connect's invalid
/// parameter is; 0 otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Fail {
    pub status: Status,
    pub dw0: u32,
}

impl From<Status> for Fail {
    fn from(status: Status) -> Fail {
        Fail { status, dw0: 0 }
    }
}

/// The byte of the command a status blames (the Error Information log's parameter error
/// location), when one field is the cause: the opcode, the namespace, the data pointer, the
/// starting LBA, a Connect's field in the command.
fn location(sqe: &Sqe, f: Fail) -> u16 {
    match f.status {
        Status::INVALID_OPCODE => 0,
        Status::INVALID_NS => 4,
        Status::SGL_LENGTH_INVALID
        | Status::SGL_COUNT_INVALID
        | Status::SGL_TYPE_INVALID
        | Status::SGL_OFFSET_INVALID => 24,
        Status::LBA_RANGE if is_rw(sqe) => 40,
        Status::CONNECT_FORMAT => 40,
        Status::CONNECT_INVALID_PARAM if f.dw0 >> 16 == 0 && f.dw0 != 0 => f.dw0 as u16,
        _ => NO_LOCATION,
    }
}

/// Whether `sqe` is an NVM command with a starting LBA.
fn is_rw(sqe: &Sqe) -> bool {
    matches!(
        sqe.opcode(),
        opcode::READ | opcode::WRITE | opcode::WRITE_ZEROES
    )
}

/// Which way a command's data goes, and how much.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dir {
    None,
    ToHost(u32),
    FromHost(u32),
}

/// Where a command's data is, once its capsule is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    NoData,
    /// In the receive buffer, at this offset of the region.
    InCapsule(usize, u32),
    /// The host's memory, `.1` bytes, read before executing.
    FromHost(Remote, u32),
    /// The host's memory, `.1` bytes, written after executing.
    ToHost(Remote, u32),
}

impl<P: Provider, K: Clock, const Q: usize, const D: usize> Target<'_, '_, P, K, Q, D> {
    /// A capsule arrived in receive buffer `slot` of queue `q`.
    pub(super) fn on_capsule(&mut self, q: usize, slot: u16, byte_len: u32) {
        let bytes = self.queues[q].capsule_bytes(slot, byte_len);
        let Some(sqe) = Sqe::parse(bytes) else {
            // Shorter than an SQE: answered (with the command ID if it got that far), the
            // queue kept.
            let cid = if bytes.len() >= 4 { le16(bytes, 2) } else { 0 };
            self.finish(
                q,
                slot,
                (cid, None),
                Err(Status::INVALID_FIELD.into()),
                None,
                None,
            );
            return;
        };
        // The time it is taken at: the clock as last read (at the start of this poll, or at
        // the last response), no read of its own.
        let now = self.now_us;
        let queue = &mut self.queues[q];
        if let Some(t) = queue.since.get_mut(usize::from(slot)) {
            *t = now as u32;
        }
        if let Some(c) = queue.ctrl
            && let Some(ctrl) = self.ctrls[c].as_mut()
        {
            ctrl.longest_idle_us = ctrl.longest_idle_us.max(now.saturating_sub(ctrl.last_us));
            ctrl.last_us = now;
            // An I/O command of a controller: it is busy until the response.
            if queue.qid != 0
                && let Some(k) = queue.counted.get_mut(usize::from(slot))
                && !*k
            {
                *k = true;
                queue.busy += 1;
                ctrl.busy_begin(now);
            }
        }
        self.start(q, slot, &sqe, byte_len);
    }

    fn start(&mut self, q: usize, slot: u16, sqe: &Sqe, byte_len: u32) {
        match self.plan(q, slot, sqe, byte_len) {
            Err(st) => self.finish(q, slot, (sqe.cid(), Some(sqe)), Err(st.into()), None, None),
            Ok(Plan::NoData) => self.execute(q, slot, sqe, None, None, None),
            Ok(Plan::InCapsule(at, len)) => self.execute(q, slot, sqe, Some((at, len)), None, None),
            Ok(Plan::FromHost(from, len)) => {
                let Some(ds) = self.queues[q].alloc_data() else {
                    self.queues[q].cmds[usize::from(slot)] = Cmd::WaitSlot;
                    self.queues[q].pending = true;
                    return;
                };
                if self.queues[q].post_read(q, slot, ds, from, len).is_err() {
                    self.end_queue(q, true);
                }
            }
            Ok(Plan::ToHost(to, len)) => {
                let Some(ds) = self.queues[q].alloc_data() else {
                    self.queues[q].cmds[usize::from(slot)] = Cmd::WaitSlot;
                    self.queues[q].pending = true;
                    return;
                };
                let at = self.queues[q].data_at(ds);
                self.execute(q, slot, sqe, Some((at, len)), Some(ds), Some(to));
            }
        }
    }

    /// The checks before any data moves: the queue connected, the opcode known, the
    /// namespace and range valid, the SGL's type, length and offset.
    fn plan(&self, q: usize, slot: u16, sqe: &Sqe, byte_len: u32) -> Result<Plan, Status> {
        let queue = &self.queues[q];
        let connect = sqe.opcode() == opcode::FABRICS && sqe.fctype() == fctype::CONNECT;
        if queue.ctrl.is_none() != connect {
            // Connect first, and once.
            return Err(Status::SEQUENCE_ERROR);
        }
        // An I/O controller runs commands other than the fabrics ones only while enabled
        // (CC.EN set, no shutdown asked), as nvmet; a discovery controller at any time.
        let ctrl = queue.ctrl.and_then(|c| self.ctrls[c].as_ref());
        if let Some(c) = ctrl
            && c.which != Which::Discovery
            && sqe.opcode() != opcode::FABRICS
            && (c.cc & prop::CC_EN == 0 || c.cc & prop::CC_SHN_MASK != 0)
        {
            return Err(Status::SEQUENCE_ERROR);
        }
        let dir = if connect {
            Dir::FromHost(crate::wire::fabrics::CONNECT_DATA_LEN as u32)
        } else if queue.qid == 0 {
            admin::direction(sqe)?
        } else {
            io::direction(sqe, ctrl, self.subsystems)?
        };
        let need = match dir {
            Dir::None => return Ok(Plan::NoData),
            Dir::ToHost(n) | Dir::FromHost(n) => n,
        };
        if need > queue.slot_len {
            return Err(Status::INVALID_FIELD);
        }
        let sgl = sqe.sgl()?;
        let list = matches!(sgl, Sgl::LastSegment { .. });
        if !list && sgl.len() != need {
            return Err(Status::SGL_LENGTH_INVALID);
        }
        // In-capsule bytes at `offset`, `len` of them, within what was received: their
        // place in the region.
        let in_capsule = |offset: u64, len: u32| -> Result<usize, Status> {
            let room = u64::from(byte_len.min(queue.capsule).saturating_sub(SQE_LEN as u32));
            if offset
                .checked_add(u64::from(len))
                .is_none_or(|end| end > room)
            {
                return Err(Status::SGL_OFFSET_INVALID);
            }
            Ok(usize::from(slot) * queue.capsule as usize + SQE_LEN + offset as usize)
        };
        match (sgl, dir) {
            (Sgl::Keyed { addr, key, len, .. }, Dir::ToHost(_)) => {
                Ok(Plan::ToHost(Remote::One(addr, key, len), len))
            }
            (Sgl::Keyed { addr, key, len, .. }, _) => {
                Ok(Plan::FromHost(Remote::One(addr, key, len), len))
            }
            (Sgl::InCapsule { offset, len }, Dir::FromHost(_)) => {
                Ok(Plan::InCapsule(in_capsule(offset, len)?, len))
            }
            // A list of keyed descriptors in the capsule (a Last Segment): checked whole
            // before any data moves.
            (Sgl::LastSegment { offset, len }, _) => {
                if len == 0 || !len.is_multiple_of(16) || len / 16 > u32::from(remote::MSDBD) {
                    return Err(Status::SGL_COUNT_INVALID);
                }
                let at = in_capsule(offset, len)?;
                let bytes = queue.capsule_bytes(slot, byte_len);
                let from = at - usize::from(slot) * queue.capsule as usize;
                let n =
                    remote::check_list(bytes.get(from..from + len as usize).unwrap_or(&[]), need)?;
                let r = Remote::List { at: at as u32, n };
                Ok(match dir {
                    Dir::ToHost(_) => Plan::ToHost(r, need),
                    _ => Plan::FromHost(r, need),
                })
            }
            // In-capsule data for a command that returns data, or no data where some is due.
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// The RDMA READ of command `slot` completed: execute it.
    pub(super) fn on_read_done(&mut self, q: usize, slot: u16) {
        let Some(Cmd::Reading(ds, len)) = self.queues[q].cmds.get(usize::from(slot)).copied()
        else {
            return;
        };
        let bytes = self.queues[q].capsule_bytes(slot, SQE_LEN as u32);
        let Some(sqe) = Sqe::parse(bytes) else { return };
        let at = self.queues[q].data_at(ds);
        self.execute(q, slot, &sqe, Some((at, len)), Some(ds), None);
    }

    /// Commands that wait for a data buffer or a response buffer, tried again.
    pub(super) fn retry_waiting(&mut self, q: usize) {
        if !self.queues[q].pending {
            return;
        }
        // Set again by whatever still waits after this pass.
        self.queues[q].pending = false;
        for slot in 0..self.queues[q].depth {
            if !self.queues[q].in_use() {
                return;
            }
            let cmd = self.queues[q].cmds[usize::from(slot)];
            match cmd {
                Cmd::WaitSlot => {
                    let bytes = self.queues[q].capsule_bytes(slot, self.queues[q].capsule);
                    let Some(sqe) = Sqe::parse(bytes) else {
                        continue;
                    };
                    let len = bytes.len() as u32;
                    self.queues[q].cmds[usize::from(slot)] = Cmd::Idle;
                    self.start(q, slot, &sqe, len);
                }
                Cmd::Respond(reply) if self.queues[q].respond(q, slot, reply).is_err() => {
                    self.end_queue(q, true);
                }
                _ => {}
            }
        }
    }

    /// Executes command `slot` with its data at `data` (`(offset in the region, bytes)`),
    /// then answers.
    fn execute(
        &mut self,
        q: usize,
        slot: u16,
        sqe: &Sqe,
        data: Option<(usize, u32)>,
        ds: Option<u16>,
        write: Option<Remote>,
    ) {
        let qid = self.queues[q].qid;
        let mut enabled = false;
        let res = if sqe.opcode() == opcode::FABRICS && sqe.fctype() == fctype::CONNECT {
            let mut d = [0u8; crate::wire::fabrics::CONNECT_DATA_LEN];
            if let Some((at, len)) = data {
                let n = (len as usize).min(d.len());
                d[..n].copy_from_slice(&self.queues[q].bytes_mut(at, n)[..n]);
            }
            // A poll group's queue: core 0 holds the controllers, and checks and binds it.
            if self.queues[q].origin.is_some() {
                if self.pass_connect(q, slot, sqe, &d, ds) {
                    return;
                }
                self.finish(
                    q,
                    slot,
                    (sqe.cid(), Some(sqe)),
                    Err(Status::CONNECT_BUSY.into()),
                    ds,
                    None,
                );
                return;
            }
            let r = self.connect(q, sqe, &d);
            if let Err(f) = r {
                // Every refused Connect is logged with its reason and the host it named.
                let host = d
                    .get(512..768)
                    .and_then(crate::wire::fabrics::Nqn::from_field);
                let station = self.queues[q].station;
                self.refuse(
                    station,
                    super::RefusalReason::Connect(f.status, f.dw0),
                    host,
                );
            }
            r
        } else if qid == 0 && sqe.opcode() == opcode::ASYNC_EVENT {
            let held = self.queues[q]
                .ctrl
                .and_then(|c| self.ctrls[c].as_mut())
                .filter(|c| c.aers < AER_HELD)
                .map(|c| c.aers += 1)
                .is_some();
            if held {
                self.queues[q].cmds[usize::from(slot)] = Cmd::Held;
                // A notice waiting for a request goes out on this one.
                if let Some(c) = self.queues[q].ctrl {
                    self.deliver_aen(c);
                }
                return;
            }
            Err(Status::AER_LIMIT.into())
        } else {
            // The SMART log's counts: the controller's queues summed (only for Get Log Page).
            let io = match (qid, sqe.opcode(), self.queues[q].ctrl) {
                (0, opcode::GET_LOG_PAGE, Some(c)) => Some(self.ctrl_io(c)),
                _ => None,
            };
            let (now_us, born_us) = (self.now_us, self.born_us);
            let Target {
                queues,
                ctrls,
                subsystems,
                cfg,
                ip,
                ..
            } = self;
            let queue = &mut queues[q];
            let c = queue.ctrl;
            enabled = c
                .and_then(|c| ctrls[c].as_ref())
                .is_some_and(|x| x.cc & prop::CC_EN != 0);
            let buf = match data {
                Some((at, len)) => queue.bytes_mut(at, len as usize),
                None => &mut [],
            };
            match c.and_then(|c| ctrls[c].as_mut()) {
                None => Err(Status::SEQUENCE_ERROR),
                Some(ctrl) if qid == 0 => {
                    let mut cx = admin::Cx {
                        ctrl,
                        subsystems,
                        cfg,
                        ip: *ip,
                        io: io.as_ref(),
                        now_us,
                        born_us,
                    };
                    admin::run(&mut cx, sqe, buf)
                }
                Some(ctrl) => {
                    let len = buf.len() as u64;
                    let r = io::run(ctrl, subsystems, sqe, buf);
                    if let Ok(done) = r {
                        let c = &mut queue.counts;
                        c.medium_flushes += u64::from(done.flushes);
                        c.bytes_copied += done.copied;
                        match sqe.opcode() {
                            opcode::READ => {
                                c.reads += 1;
                                c.bytes_read += len;
                                c.units_read += len / 512;
                            }
                            opcode::WRITE => {
                                c.writes += 1;
                                c.bytes_written += len;
                                c.units_written += len / 512;
                            }
                            _ => {}
                        }
                    }
                    r.map(|_| 0)
                }
            }
            .map_err(Fail::from)
        };
        // An admin command may have made a controller or set its keep-alive timeout: its
        // deadline may come before the bound the poll keeps.
        if qid == 0 {
            self.kato_check_us = 0;
        }
        // A Property Set that cleared CC.EN resets the controller (before its own answer).
        if enabled
            && qid == 0
            && let Some(c) = self.queues[q].ctrl
            && self.ctrls[c]
                .as_ref()
                .is_some_and(|x| x.cc & prop::CC_EN == 0)
        {
            self.reset_ctrl(c);
        }
        self.finish(q, slot, (sqe.cid(), Some(sqe)), res, ds, write);
    }

    /// Logs failure `f` of command `cid` (`sqe`) on queue `q` in the error log of the queue's
    /// controller (a queue without one, before its Connect or after a refused one, has no
    /// log to write: nothing a stranger sends reaches another host's log).
    fn log_error(&mut self, q: usize, cid: u16, sqe: Option<&Sqe>, f: Fail) {
        let sqid = self.queues[q].qid;
        let Some(ctrl) = self.queues[q].ctrl.and_then(|c| self.ctrls[c].as_mut()) else {
            return;
        };
        let (location, lba, nsid) = match sqe {
            Some(s) => (
                location(s, f),
                if sqid != 0 && is_rw(s) { s.slba() } else { 0 },
                s.nsid(),
            ),
            None => (NO_LOCATION, 0, 0),
        };
        let entry = ErrorEntry {
            count: 0,
            sqid,
            cid,
            status: f.status,
            location,
            lba,
            nsid,
        };
        ctrl.errors.record(entry);
        // A poll group's copy of the controller: the log is core 0's.
        let cntlid = ctrl.cntlid;
        if self.queues[q].origin.is_some() {
            self.pass_error(cntlid, entry);
        }
    }

    /// Answers the asynchronous event requests queue `q` holds with `status` (their receive
    /// buffers go back to the host's use); returns how many.
    pub(super) fn release_held(&mut self, q: usize, status: Status) -> usize {
        let mut n = 0;
        for slot in 0..self.queues[q].depth {
            if !self.queues[q].in_use() {
                break;
            }
            if !matches!(self.queues[q].cmds[usize::from(slot)], Cmd::Held) {
                continue;
            }
            let sqe = Sqe::parse(self.queues[q].capsule_bytes(slot, SQE_LEN as u32));
            let cid = sqe.map_or(0, |s| s.cid());
            self.queues[q].cmds[usize::from(slot)] = Cmd::Idle;
            self.finish(q, slot, (cid, sqe.as_ref()), Err(status.into()), None, None);
            n += 1;
        }
        n
    }

    /// Answers command `slot` (its ID, and the command when its capsule held one): on
    /// success with the data write, on failure without (its data buffer freed), the failure
    /// logged in its controller's error log.
    pub(super) fn finish(
        &mut self,
        q: usize,
        slot: u16,
        (cid, sqe): (u16, Option<&Sqe>),
        res: Result<u64, Fail>,
        ds: Option<u16>,
        write: Option<Remote>,
    ) {
        self.counts.commands += 1;
        if self.queues[q].qid != 0 {
            self.io_commands += 1;
        }
        // The clock read once per command, here: its latency, and the time the next
        // capsules of this poll are taken at.
        let now = self.clock.now_us();
        self.now_us = now;
        let queue = &mut self.queues[q];
        let s = usize::from(slot);
        let c = &mut queue.counts;
        c.commands += 1;
        if let Err(f) = res {
            c.error(f.status);
            if matches!(f.status, Status::MEDIA_ERROR | Status::WRITE_FAULT) {
                c.media_errors += 1;
            }
        }
        let held = queue.qid == 0 && sqe.is_some_and(|x| x.opcode() == opcode::ASYNC_EVENT);
        if !held && let Some(&t) = queue.since.get(s) {
            c.latency[super::latency_bucket(u64::from((now as u32).wrapping_sub(t)))] += 1;
        }
        if let Some(k) = queue.counted.get_mut(s)
            && *k
        {
            *k = false;
            queue.busy = queue.busy.saturating_sub(1);
            if let Some(x) = queue.ctrl.and_then(|c| self.ctrls[c].as_mut()) {
                x.busy_end(1, now);
            }
        }
        let (result, status, data, write) = match res {
            Ok(v) => (v, Status::SUCCESS, ds, write),
            Err(f) => {
                self.counts.errors += 1;
                if let Some(ds) = ds {
                    self.queues[q].free_data(ds);
                }
                self.log_error(q, cid, sqe, f);
                (u64::from(f.dw0), f.status, None, None)
            }
        };
        let reply = Reply {
            cqe: Cqe {
                result,
                cid,
                status,
                ..Cqe::default()
            },
            data: if write.is_some() { data } else { None },
            write,
        };
        if write.is_none()
            && let Some(ds) = data
        {
            self.queues[q].free_data(ds);
        }
        if self.queues[q].respond(q, slot, reply).is_err() {
            self.end_queue(q, true);
        }
    }
}
