//! One queue of the target: its RC QP, one registered region (receive buffers, response
//! buffers, data buffers), and the state of each command.
//!
//! Region layout: `depth` receive buffers of `capsule` bytes (a 64-byte SQE and in-capsule
//! data), then `depth` 16-byte response buffers, then `slots` data buffers of `slot_len`.
//! A command keeps its receive buffer until its response is posted; a response buffer is
//! busy until its SEND completes (with it the RDMA WRITE before it, RC completing in
//! order), and so is the data buffer that WRITE read from.

use bareverbs::cm::ConnId;
use bareverbs::verbs::{MemoryRegion, Provider, QueuePair, Rc, Rts, SendFlags, Sge};

use super::counts::IoCounts;
use super::remote::{self, Pieces, Remote};
use crate::wire::{CQE_LEN, Cqe, SQE_LEN, Sgl, Sqe};

/// What a work request was, in its ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Recv,
    Read,
    Send,
}

/// Work-request ID: queue (8 bits), generation (16), kind (8), slot (16).
pub(crate) fn encode(q: usize, epoch: u16, kind: Kind, slot: u16) -> u64 {
    let k = match kind {
        Kind::Recv => 1u64,
        Kind::Read => 2,
        Kind::Send => 3,
    };
    ((q as u64 & 0xFF) << 48) | (u64::from(epoch) << 32) | (k << 16) | u64::from(slot)
}

/// The parts of a work-request ID, or `None` for one this code never made.
pub(crate) fn decode(id: u64) -> Option<(usize, u16, Kind, u16)> {
    if id >> 56 != 0 {
        return None;
    }
    let kind = match (id >> 16) & 0xFFFF {
        1 => Kind::Recv,
        2 => Kind::Read,
        3 => Kind::Send,
        _ => return None,
    };
    Some((
        ((id >> 48) & 0xFF) as usize,
        (id >> 32) as u16,
        kind,
        id as u16,
    ))
}

/// Where a command is.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) enum Cmd {
    /// No command in this receive buffer (a receive is posted).
    #[default]
    Idle,
    /// Waits for a data buffer.
    WaitSlot,
    /// RDMA READ of the host's data (`.1` bytes) into data buffer `.0` posted.
    Reading(u16, u32),
    /// Executed; the response waits for a response buffer.
    Respond(Reply),
    /// An asynchronous event request held open.
    Held,
    /// A Connect a poll group passed on to core 0, with the data buffer it used.
    Connecting(Option<u16>),
}

/// A response to send: the CQE, the data buffer it used, the RDMA WRITE to do first.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Reply {
    pub cqe: Cqe,
    pub data: Option<u16>,
    /// Where to write the data buffer's bytes before the response.
    pub write: Option<Remote>,
}

/// A response buffer: free, or busy with the data buffer to free after it.
const RESP_FREE: u16 = u16::MAX;
const RESP_NO_DATA: u16 = u16::MAX - 1;

pub(crate) struct Queue<'a, P: Provider, const D: usize> {
    // The QP goes before its buffers (dropped first: the device stops using them).
    pub qp: Option<QueuePair<'a, P, Rc, Rts>>,
    pub mr: Option<MemoryRegion<'a, P>>,
    pub conn: ConnId,
    pub epoch: u16,
    pub qid: u16,
    pub ctrl: Option<usize>,
    pub depth: u16,
    pub capsule: u32,
    pub slots: u16,
    pub slot_len: u32,
    pub sq_head: u16,
    /// When the connection was accepted (µs): a queue without a controller long after is
    /// ended.
    pub opened_us: u64,
    /// The station the connection came from (the CM request's source address).
    pub station: [u8; 4],
    /// Where the search for a free response buffer starts.
    resp_cursor: u16,
    /// Some command waits for a buffer (the poll's retry pass skips the queue otherwise).
    pub pending: bool,
    pub cmds: [Cmd; D],
    resp: [u16; D],
    data_busy: [bool; D],
    /// Responses sent with Invalidate, over every connection this queue slot carried.
    pub invalidated: u64,
    /// This connection's counts.
    pub counts: IoCounts,
    /// When each command's capsule was taken (µs of the target's clock, low 32 bits).
    pub since: [u32; D],
    /// Commands counted outstanding on the controller (busy time): I/O commands that
    /// arrived on the queue bound to it, until their response.
    pub counted: [bool; D],
    /// How many of `counted` are set.
    pub busy: u32,
    /// On core 0, a queue a poll group serves: the group (this entry is its placeholder: no
    /// QP, no region here).
    pub remote: Option<u8>,
    /// In a poll group, the queue's place and generation in core 0's table.
    pub origin: Option<(u8, u16)>,
}

impl<'a, P: Provider, const D: usize> Queue<'a, P, D> {
    pub fn free() -> Self {
        Queue {
            qp: None,
            mr: None,
            conn: ConnId(0),
            epoch: 0,
            qid: 0,
            ctrl: None,
            depth: 0,
            capsule: 0,
            slots: 0,
            slot_len: 0,
            sq_head: 0,
            opened_us: 0,
            station: [0; 4],
            resp_cursor: 0,
            pending: false,
            cmds: [Cmd::Idle; D],
            resp: [RESP_FREE; D],
            data_busy: [false; D],
            invalidated: 0,
            counts: IoCounts::default(),
            since: [0; D],
            counted: [false; D],
            busy: 0,
            remote: None,
            origin: None,
        }
    }

    pub fn in_use(&self) -> bool {
        self.qp.is_some() || self.remote.is_some()
    }

    pub fn region_len(depth: u16, capsule: u32, slots: u16, slot_len: u32) -> usize {
        let d = usize::from(depth);
        d * capsule as usize + d * CQE_LEN + usize::from(slots) * slot_len as usize
    }

    #[allow(clippy::too_many_arguments)]
    pub fn open(
        &mut self,
        conn: ConnId,
        qid: u16,
        depth: u16,
        capsule: u32,
        slots: u16,
        slot_len: u32,
        qp: QueuePair<'a, P, Rc, Rts>,
        mr: MemoryRegion<'a, P>,
    ) {
        let (epoch, invalidated) = (self.epoch, self.invalidated);
        *self = Queue::free();
        (self.epoch, self.invalidated) = (epoch, invalidated);
        self.conn = conn;
        self.qid = qid;
        self.depth = depth.min(D as u16);
        self.capsule = capsule;
        self.slots = slots.min(D as u16);
        self.slot_len = slot_len;
        self.qp = Some(qp);
        self.mr = Some(mr);
    }

    /// Core 0's placeholder of a queue poll group `group` serves (see `open`).
    #[allow(clippy::too_many_arguments)]
    pub fn open_remote(
        &mut self,
        conn: ConnId,
        qid: u16,
        depth: u16,
        capsule: u32,
        slots: u16,
        slot_len: u32,
        group: u8,
    ) {
        let (epoch, invalidated) = (self.epoch, self.invalidated);
        *self = Queue::free();
        (self.epoch, self.invalidated) = (epoch, invalidated);
        self.conn = conn;
        self.qid = qid;
        self.depth = depth.min(D as u16);
        self.capsule = capsule;
        self.slots = slots.min(D as u16);
        self.slot_len = slot_len;
        self.remote = Some(group);
    }

    /// Destroys the QP, then the region; later completions of this generation are void.
    pub fn close(&mut self) {
        drop(self.qp.take());
        drop(self.mr.take());
        self.epoch = self.epoch.wrapping_add(1);
        self.ctrl = None;
        self.remote = None;
        self.origin = None;
    }

    fn recv_at(&self, slot: u16) -> usize {
        usize::from(slot) * self.capsule as usize
    }
    fn resp_at(&self, r: u16) -> usize {
        usize::from(self.depth) * self.capsule as usize + usize::from(r) * CQE_LEN
    }
    pub fn data_at(&self, ds: u16) -> usize {
        self.resp_at(self.depth) + usize::from(ds) * self.slot_len as usize
    }

    /// The receive buffer of `slot`, `len` bytes (clamped to the buffer).
    pub fn capsule_bytes(&self, slot: u16, len: u32) -> &[u8] {
        let at = self.recv_at(slot);
        let len = len.min(self.capsule) as usize;
        self.mr
            .as_ref()
            .and_then(|m| m.as_slice().get(at..at + len))
            .unwrap_or(&[])
    }

    /// `len` bytes of memory at `at` of the region, writable.
    pub fn bytes_mut(&mut self, at: usize, len: usize) -> &mut [u8] {
        match self.mr.as_mut() {
            Some(m) => m.as_mut_slice().get_mut(at..at + len).unwrap_or(&mut []),
            None => &mut [],
        }
    }

    pub fn post_all_recvs(&mut self, q: usize) -> Result<(), ()> {
        for s in 0..self.depth {
            self.post_recv(q, s)?;
        }
        Ok(())
    }

    pub fn post_recv(&mut self, q: usize, slot: u16) -> Result<(), ()> {
        let at = self.recv_at(slot) as u32;
        let (Some(qp), Some(mr)) = (self.qp.as_mut(), self.mr.as_ref()) else {
            return Err(());
        };
        let sge = mr.sge(at, self.capsule).map_err(|_| ())?;
        self.cmds[usize::from(slot)] = Cmd::Idle;
        // SAFETY: the region outlives the QP (`close` destroys the QP first), and the CPU
        // does not touch a receive buffer between this post and its completion.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(encode(q, self.epoch, Kind::Recv, slot), &[sge])
                .map_err(|_| ())?;
            r.finish();
        }
        Ok(())
    }

    pub fn alloc_data(&mut self) -> Option<u16> {
        let n = usize::from(self.slots);
        let k = self.data_busy[..n].iter().position(|b| !b)?;
        self.data_busy[k] = true;
        Some(k as u16)
    }

    pub fn free_data(&mut self, ds: u16) {
        if let Some(b) = self.data_busy.get_mut(usize::from(ds)) {
            *b = false;
        }
    }

    /// The pieces of `r`, in order (a list read from the region).
    fn pieces(&self, r: Remote) -> Pieces {
        match r {
            Remote::One(addr, key, len) => {
                let mut p = [(0, 0, 0); remote::MSDBD as usize];
                p[0] = (addr, key, len);
                (p, 1)
            }
            Remote::List { at, n } => {
                let len = usize::from(n.min(remote::MSDBD)) * 16;
                let at = at as usize;
                let list = self
                    .mr
                    .as_ref()
                    .and_then(|m| m.as_slice().get(at..at + len))
                    .unwrap_or(&[]);
                remote::pieces(list)
            }
        }
    }

    /// RDMA READs of the host's data at `from` (`len` bytes) into data buffer `ds`, one per
    /// piece, for command `slot`; the last one signalled (RC completes them in order).
    pub fn post_read(
        &mut self,
        q: usize,
        slot: u16,
        ds: u16,
        from: Remote,
        len: u32,
    ) -> Result<(), ()> {
        let at = self.data_at(ds) as u32;
        let (pieces, n) = self.pieces(from);
        let slot_len = self.slot_len;
        let epoch = self.epoch;
        let (Some(qp), Some(mr)) = (self.qp.as_mut(), self.mr.as_ref()) else {
            return Err(());
        };
        // SAFETY: as in `post_recv`: the data buffer is not touched until the completion.
        unsafe {
            let mut s = qp.send_batch();
            let mut off = 0u32;
            for (i, &(addr, key, plen)) in pieces[..n].iter().enumerate() {
                let plen = plen.min(slot_len - off);
                let sge = mr.sge(at + off, plen).map_err(|_| ())?;
                let flags = if i + 1 == n {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::empty()
                };
                s.rdma_read(
                    encode(q, epoch, Kind::Read, slot),
                    flags,
                    (addr, key),
                    &[sge],
                )
                .map_err(|_| ())?;
                off += plen;
            }
            s.finish();
        }
        self.cmds[usize::from(slot)] = Cmd::Reading(ds, len);
        Ok(())
    }

    /// The R_Key command `slot` asks to have invalidated with its response: its data
    /// pointer is one keyed data block with the invalidate subtype. (Linux's host asks so for
    /// the keys of its fast registrations.)
    fn invalidate_key(&self, slot: u16) -> Option<u32> {
        let sqe = Sqe::parse(self.capsule_bytes(slot, SQE_LEN as u32))?;
        match sqe.sgl() {
            Ok(Sgl::Keyed {
                key,
                invalidate: true,
                ..
            }) => Some(key),
            _ => None,
        }
    }

    /// Sends `reply` for command `slot` if a response buffer is free (re-posting the
    /// command's receive buffer first): `Ok(true)` sent, `Ok(false)` kept for later.
    pub fn respond(&mut self, q: usize, slot: u16, mut reply: Reply) -> Result<bool, ()> {
        // The next free response buffer from where the last one was taken: buffers free in
        // about the order they were taken, so the search usually stops at once.
        let d = usize::from(self.depth).max(1);
        let start = usize::from(self.resp_cursor) % d;
        let Some(r) = (0..d)
            .map(|k| (start + k) % d)
            .find(|&i| self.resp[i] == RESP_FREE)
        else {
            self.cmds[usize::from(slot)] = Cmd::Respond(reply);
            self.pending = true;
            return Ok(false);
        };
        self.resp_cursor = ((r + 1) % d) as u16;
        let r = r as u16;
        reply.cqe.sq_id = self.qid;
        self.sq_head = (self.sq_head + 1) % self.depth.max(1);
        reply.cqe.sq_head = self.sq_head;
        let at = self.resp_at(r);
        self.bytes_mut(at, CQE_LEN)
            .copy_from_slice(&reply.cqe.to_bytes());
        // The pieces to write, read before the receive buffer (where a list is) goes back.
        let (pieces, n) = match reply.write {
            Some(w) => self.pieces(w),
            None => ([(0, 0, 0); remote::MSDBD as usize], 0),
        };
        // The key the host asked to have invalidated with the response, read from the
        // command (still in its receive buffer) before that buffer goes back.
        let invalidate = self.invalidate_key(slot);
        self.post_recv(q, slot)?;
        let epoch = self.epoch;
        let data_at = reply.data.map(|ds| self.data_at(ds) as u32);
        let (Some(qp), Some(mr)) = (self.qp.as_mut(), self.mr.as_ref()) else {
            return Err(());
        };
        let cqe = mr.sge(at as u32, CQE_LEN as u32).map_err(|_| ())?;
        let mut writes: [Option<(Sge, u64, u32)>; remote::MSDBD as usize] = Default::default();
        if let Some(from) = data_at {
            let mut off = 0u32;
            for (w, &(addr, key, len)) in writes.iter_mut().zip(&pieces[..n]) {
                *w = Some((mr.sge(from + off, len).map_err(|_| ())?, addr, key));
                off = off.saturating_add(len);
            }
        }
        // SAFETY: as in `post_recv`: the response buffer and the data buffer are not written
        // again until the SEND's completion frees them.
        unsafe {
            let mut s = qp.send_batch();
            for &(sge, addr, key) in writes.iter().flatten() {
                s.rdma_write(
                    encode(q, epoch, Kind::Send, u16::MAX),
                    SendFlags::empty(),
                    (addr, key),
                    &[sge],
                )
                .map_err(|_| ())?;
            }
            // A command whose keyed descriptor asked for invalidation (subtype 0xF) is
            // answered with a SEND with Invalidate of that key, as nvmet-rdma answers, which
            // saves the host its own LOCAL_INV; never a key the host did not name (the peer
            // would fail the SEND and both QPs go to ERROR). A device without the operation
            // answers with a plain SEND: the host then invalidates the key itself.
            let wr_id = encode(q, epoch, Kind::Send, r);
            let with_inv =
                invalidate.map(|key| s.send_with_inv(wr_id, SendFlags::SIGNALED, key, &[cqe]));
            match with_inv {
                Some(Ok(())) => self.invalidated += 1,
                None | Some(Err(bareverbs::Error::Unsupported(_))) => {
                    s.send(wr_id, SendFlags::SIGNALED, &[cqe]).map_err(|_| ())?
                }
                Some(Err(_)) => return Err(()),
            }
            s.finish();
        }
        self.resp[usize::from(r)] = reply.data.unwrap_or(RESP_NO_DATA);
        Ok(true)
    }

    /// A SEND completed: its response buffer (and data buffer) are free.
    pub fn send_done(&mut self, r: u16) {
        let Some(x) = self.resp.get_mut(usize::from(r)) else {
            return;
        };
        let ds = *x;
        *x = RESP_FREE;
        if ds != RESP_NO_DATA && ds != RESP_FREE {
            self.free_data(ds);
        }
    }
}
