//! The data phase of perftest's latency programs with `-R` (`ib_send_lat`, `ib_write_lat`,
//! `ib_read_lat`, `ib_atomic_lat`): one operation in flight at a time.
//!
//! After the data QP's `pingpong_dest` three times (as the bandwidth programs), perftest's
//! `main` of each sends it again as follows (`ctx_hand_shake`; `ctx_close_connection` is one
//! more and, with `-R`, no `done`):
//!
//! | program | before the data phase | after |
//! |---|---|---|
//! | `ib_read_lat`, `ib_atomic_lat` | a fourth | a fifth (the server sends it at once: only the client operates) |
//! | `ib_write_lat` | a fourth | none |
//! | `ib_send_lat` | a fourth, once each side's receives are posted | a fifth |

use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use super::super::{CaseError, CmCase, RECV_BASE, SEND_BASE, Seen, Session, seen_slot};
use super::msg::{self, prefill};
use super::{DATA_AT, Dest, PtVerb, SENTINEL, region_len, stride};
use crate::Step;

/// The `pingpong_dest` exchange after the data QP's three ([`Session::dest`] with its index).
pub(super) type NextDest<'f, S> = dyn FnMut(&mut S, u32) -> Result<(), CaseError> + 'f;

/// Receives `ib_send_lat`'s side keeps posted: one message each way is in flight at a time;
/// the second lets the peer's next SEND find one while the last is checked.
const RECVS: u32 = 2;

/// How far the ping-pong has come.
#[derive(Clone, Copy, Debug, Default)]
struct Rounds {
    /// This side's messages completed.
    sent: u32,
    /// The peer's messages received and checked.
    received: u32,
    /// `ib_send_lat`: receives posted.
    posted: u32,
}

const READS: &str =
    "every byte received that perftest defines checked, every READ bringing the first one's bytes";
const ADDS: &str = "every byte received that perftest defines checked, every fetch-and-add returning the one before plus one";
const READ_FROM: &str =
    "every byte received that perftest defines checked, the buffer the peer READs unchanged";
const ADDED_TO: &str =
    "every byte received that perftest defines checked, the peer's fetch-and-adds adding up to -n";
const WRITES: &str = "every byte received that perftest defines checked, every WRITE of the peer's with its round's number in its last byte and zeroes before it";
const SENDS: &str = "every byte received that perftest defines checked, every SEND of the peer's of -s bytes and the first one's bytes";

impl<'a, P: Provider, C: Clock> Session<'_, 'a, P, C> {
    /// The latency program's messages after the data QP's third `pingpong_dest` and its data
    /// phase (`next`: the next `pingpong_dest` each way, by its index). Returns the data
    /// bytes checked and what was checked.
    pub(super) fn latency(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        (case, verb, client): (&CmCase, PtVerb, bool),
        peer: &Dest,
        next: &mut NextDest<'_, Self>,
    ) -> Result<(u64, &'static str), CaseError> {
        match verb {
            PtVerb::ReadLat | PtVerb::AtomicLat => {
                let atomic = verb == PtVerb::AtomicLat;
                if client {
                    next(self, 3)?;
                    let checked = self.one_at_a_time(qp, case, peer, atomic)?;
                    next(self, 4)?;
                    return Ok((checked, if atomic { ADDS } else { READS }));
                }
                // The buffer the peer READs (the pre-fill) or adds to (zero), then nothing
                // of this side's touches it.
                let len = (region_len(verb, false, case, 1) - DATA_AT) as usize;
                let at = DATA_AT as usize;
                for (j, b) in self.mr.as_mut_slice()[at..at + len].iter_mut().enumerate() {
                    *b = if atomic { 0 } else { prefill(j) };
                }
                next(self, 3)?;
                next(self, 4)?;
                let area = &self.mr.as_slice()[at..at + len];
                if atomic {
                    msg::check_added(area, case.count)?;
                    Ok((len as u64, ADDED_TO))
                } else {
                    msg::check_prefill(area, "the buffer the peer READs (changed)")?;
                    Ok((len as u64, READ_FROM))
                }
            }
            PtVerb::WriteLat => {
                next(self, 3)?;
                // perftest's server WRITEs first.
                let checked = self.ping_pong(qp, case, peer, true, !client)?;
                Ok((checked, WRITES))
            }
            PtVerb::SendLat => {
                let mut r = Rounds::default();
                while r.posted < RECVS.min(case.count) {
                    self.post_lat_recv(qp, case.size, r.posted % RECVS)?;
                    r.posted += 1;
                }
                next(self, 3)?;
                // perftest's client SENDs first.
                let checked = self.ping_pong_from(qp, case, peer, false, client, r)?;
                next(self, 4)?;
                Ok((checked, SENDS))
            }
            _ => Err(CaseError::Request(
                "a bandwidth program in the latency exchange",
            )),
        }
    }

    /// The client of `ib_read_lat` / `ib_atomic_lat`: `-n` READs of `-s` bytes (or
    /// fetch-and-adds of 1) from the start of the peer's buffer, each posted once the one
    /// before completed. Every READ must bring the first one's bytes (the peer's buffer does
    /// not change), every fetch-and-add return the one before plus one (each executed once,
    /// in order). Returns the bytes checked.
    fn one_at_a_time(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
        peer: &Dest,
        atomic: bool,
    ) -> Result<u64, CaseError> {
        let size = if atomic { 8 } else { case.size };
        let (at, first_at) = (DATA_AT as usize, (DATA_AT + stride(size)) as usize);
        let sge = self.mr.sge(DATA_AT, size).at("perftest: sge")?;
        let to = (peer.vaddr, peer.rkey);
        let mut first = 0u64;
        for i in 0..case.count {
            self.mr.as_mut_slice()[at..at + size as usize].fill(SENTINEL);
            // SAFETY: the region outlives the QP (destroyed first on every path of the case);
            // the CPU reads the slot only once the operation completed, none in flight then.
            unsafe {
                let mut b = qp.send_batch();
                if atomic {
                    b.atomic_fetch_add(SEND_BASE, SendFlags::SIGNALED, to, 1, &sge)
                } else {
                    b.rdma_read(SEND_BASE, SendFlags::SIGNALED, to, &[sge])
                }
                .at("perftest: post")?;
                b.finish();
            }
            let what = if atomic {
                "a fetch-and-add's completion"
            } else {
                "a READ's completion"
            };
            self.wait(SEND_BASE, what)?;
            let buf = self.mr.as_mut_slice();
            if atomic {
                let v = u64::from_ne_bytes(buf[at..at + 8].try_into().unwrap_or([0; 8]));
                if i == 0 {
                    first = v;
                } else if v != first.wrapping_add(u64::from(i)) {
                    return Err(CaseError::Message {
                        what: "a fetch-and-add's result (not the one before plus one)",
                        index: i,
                        at: 0,
                    });
                }
            } else if i == 0 {
                buf.copy_within(at..at + size as usize, first_at);
            } else if let Some(j) = (0..size as usize).find(|&j| buf[at + j] != buf[first_at + j]) {
                return Err(CaseError::Message {
                    what: "a READ (not the first READ's bytes)",
                    index: i,
                    at: j as u32,
                });
            }
        }
        Ok(u64::from(case.count) * u64::from(size))
    }

    /// Posts the receive of `ib_send_lat`'s slot `k` (`size` bytes after the source), the
    /// sentinel in it first.
    fn post_lat_recv(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        size: u32,
        k: u32,
    ) -> Result<(), CaseError> {
        let at = DATA_AT + (1 + k) * stride(size);
        self.mr.as_mut_slice()[at as usize..(at + size) as usize].fill(SENTINEL);
        let sge = self.mr.sge(at, size).at("perftest: sge")?;
        // SAFETY: as in `one_at_a_time`; the CPU reads a slot only after its receive completed
        // and posts it again only once it is read.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(RECV_BASE + u64::from(k), &[sge])
                .at("perftest: post receive")?;
            r.finish();
        }
        Ok(())
    }

    /// `ib_write_lat`'s ping-pong ([`Self::ping_pong_from`] with no receives).
    fn ping_pong(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
        peer: &Dest,
        write: bool,
        first: bool,
    ) -> Result<u64, CaseError> {
        self.ping_pong_from(qp, case, peer, write, first, Rounds::default())
    }

    /// `-n` rounds of one message each way, one at a time, this side first in each when
    /// `first`. This side's WRITEs carry what perftest's do (zeroes, the round's number in the
    /// last byte, as `run_iter_lat_write` sets it and polls it), its SENDs the pre-fill.
    /// Returns the bytes of the peer's messages checked.
    fn ping_pong_from(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
        peer: &Dest,
        write: bool,
        first: bool,
        mut r: Rounds,
    ) -> Result<u64, CaseError> {
        let size = case.size;
        let (src, target) = (DATA_AT as usize, (DATA_AT + stride(size)) as usize);
        let buf = self.mr.as_mut_slice();
        for (j, b) in buf[src..src + size as usize].iter_mut().enumerate() {
            *b = if write { 0 } else { prefill(j) };
        }
        if write {
            buf[target..target + size as usize].fill(0);
        }
        let sge = self.mr.sge(DATA_AT, size).at("perftest: sge")?;
        let to = (peer.vaddr, peer.rkey);
        for k in 1..=case.count {
            while !first && r.received < k {
                self.round_progress(qp, case, write, &mut r)?;
            }
            if write {
                // The WRITE before this one completed: the CPU may change its bytes.
                self.mr.as_mut_slice()[src + size as usize - 1] = k as u8;
            }
            // SAFETY: as in `one_at_a_time`; the CPU changes the bytes sent only once the
            // message before completed.
            unsafe {
                let mut b = qp.send_batch();
                if write {
                    b.rdma_write(SEND_BASE, SendFlags::SIGNALED, to, &[sge])
                } else {
                    b.send(SEND_BASE, SendFlags::SIGNALED, &[sge])
                }
                .at("perftest: post")?;
                b.finish();
            }
            while r.sent < k || (first && r.received < k) {
                self.round_progress(qp, case, write, &mut r)?;
            }
        }
        Ok(u64::from(r.received) * u64::from(size))
    }

    /// One poll, and what it brought: this side's message completed, the peer's SENDs (each
    /// checked; the slot posted again while more are to come), or the peer's WRITE of the
    /// next round (its last byte the round's number, the bytes before it zero: perftest's
    /// `ib_write_lat` buffer is zeroed).
    fn round_progress(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
        write: bool,
        r: &mut Rounds,
    ) -> Result<(), CaseError> {
        // The CM and the CQ (not `poll_once`): the clock is read only in a round that brought
        // nothing, so that the peer's WRITE or SEND taken in this round is answered before
        // the CPU may halt (a read of the clock that follows one with no frame in between
        // halts until the next interrupt: `roce_peer::serve`).
        let before = *r;
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
        self.take_round(qp, case, write, r)?;
        if n == 0 && (r.sent, r.received) == (before.sent, before.received) {
            if self.disconnected {
                return Err(CaseError::Disconnected("the peer's message of a round"));
            }
            if self.now() > self.deadline {
                return Err(CaseError::Deadline("the peer's message of a round"));
            }
        }
        Ok(())
    }

    /// What the last poll brought: this side's message completed, the peer's WRITE of the
    /// next round, or its SENDs.
    fn take_round(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
        write: bool,
        r: &mut Rounds,
    ) -> Result<(), CaseError> {
        let size = case.size as usize;
        if self.take_seen(SEND_BASE).is_some() {
            r.sent += 1;
        }
        let st = stride(case.size) as usize;
        let (target, first_at) = (DATA_AT as usize + st, DATA_AT as usize + 3 * st);
        if write {
            // The software device writes the region only inside a call of ours (the poll
            // above): the CPU reads it between two.
            let buf = &self.mr.as_slice()[target..target + size];
            if buf[size - 1] == (r.received + 1) as u8 {
                msg::check_round_write(buf, r.received)?;
                r.received += 1;
            }
            return Ok(());
        }
        // Receives complete in order: the next one is slot `received mod RECVS`.
        while let Some(w) = self.take_seen(RECV_BASE + u64::from(r.received % RECVS)) {
            let i = r.received;
            if w.byte_len != case.size
                || w.opcode != WcOpcode::Recv
                || w.flags.contains(WcFlags::WITH_IMM)
            {
                return Err(CaseError::Message {
                    what: "a SEND",
                    index: i,
                    at: u32::MAX,
                });
            }
            let slot = target + (i % RECVS) as usize * st;
            let buf = self.mr.as_mut_slice();
            if i == 0 {
                buf.copy_within(slot..slot + size, first_at);
            } else if let Some(at) = (0..size).find(|&j| buf[slot + j] != buf[first_at + j]) {
                return Err(CaseError::Message {
                    what: "a SEND (not the first one's bytes)",
                    index: i,
                    at: at as u32,
                });
            }
            r.received += 1;
            if r.posted < case.count {
                self.post_lat_recv(qp, case.size, i % RECVS)?;
                r.posted += 1;
            }
        }
        Ok(())
    }

    /// The completion of `wr_id` taken already, if any (not waiting).
    fn take_seen(&mut self, wr_id: u64) -> Option<Seen> {
        self.seen[seen_slot(wr_id)?].take()
    }
}
