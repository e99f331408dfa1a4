//! A queue pair's state in HAL memory: the send and receive rings, the requester's and the
//! responder's progress, and what completes, flushes or discards its requests.

use core::ptr::NonNull;

use super::MAX_RD_ATOMIC;
use super::cq::{CqRing, Cqe};
use super::rings::AsyncRing;
use super::srq::SrqCore;
use super::wire::eth::Mac;
use super::wire::template::Template;
use super::wqe::{Inbound, RdResource, RqEntry, SqEntry, flushed, op};
use crate::events::EventHub;
use crate::verbs::{
    AccessFlags, BufRelease, ModifyAttr, QpCaps, QpState, QpType, WcOpcode, WcStatus,
    WorkCompletion,
};

/// A queue pair's whole state, at the start of its block (the rings follow).
pub(crate) struct QpCore {
    pub(crate) qpn: u32,
    /// Its place in the device's busy set (`Tables::bit` of `qpn`), kept from creation: the
    /// marks read it on every post and every frame.
    pub(crate) busy_bit: super::busy_bit::BusyBit,
    pub(crate) qp_type: QpType,
    pub(crate) pd: u32,
    pub(crate) sig_all: bool,
    pub(crate) state: QpState,
    /// The attributes of every modify, folded.
    pub(crate) attr: ModifyAttr,
    pub(crate) caps: QpCaps,
    pub(crate) send_cq: NonNull<CqRing>,
    pub(crate) recv_cq: NonNull<CqRing>,
    pub(crate) srq: Option<NonNull<SrqCore>>,
    /// The SRQ's reservation in the receive CQ this QP holds for its (SRQ, CQ) pair: taken
    /// by the pair's first QP, handed to another of the pair when it leaves, given back by the
    /// last.
    pub(crate) srq_reserved: u32,
    /// Completion-queue room taken by requests written and not yet published (a batch
    /// dropped unfinished): given back when the next batch starts writing, or at destroy.
    pub(crate) sq_pending: u32,
    pub(crate) rq_pending: u32,
    pub(crate) release: Option<BufRelease>,
    // The path (connected QPs, from RTR).
    pub(crate) peer_ip: [u8; 4],
    pub(crate) peer_mac: Option<Mac>,
    pub(crate) src_port: u16,
    /// The outer headers of the frames to the peer, made once its MAC is known
    /// ([`Net::path`](super::net::Net::path)); dropped at every modify (the path, the address
    /// vector or the peer may change).
    pub(crate) hdr: Option<Template>,
    pub(crate) mtu: u32,
    // The send queue and the requester. The rings (`sq`, `rq`: set at creation, in the QP's
    // block) are reached through `sq()` and `rq()` only.
    pub(crate) sq: NonNull<SqEntry>,
    pub(crate) sq_cap: u32,
    /// The send ring's slots less one (a power of two less one, at least `sq_cap - 1`): the
    /// slot of count `i` is `i & sq_mask`.
    pub(crate) sq_mask: u32,
    /// Requests posted, completed, and started (counts; slot = count % cap).
    pub(crate) sq_head: u32,
    pub(crate) sq_tail: u32,
    pub(crate) sq_next: u32,
    /// Packets of the request at `sq_next` already sent.
    pub(crate) cur_pkt: u32,
    /// The next PSN to send, and the oldest not acknowledged.
    pub(crate) psn: u32,
    pub(crate) una: u32,
    pub(crate) retries: u8,
    pub(crate) rnr_retries: u8,
    /// When the retransmission timer fires (0: not running).
    pub(crate) deadline: u64,
    /// Until when a receiver-not-ready NAK holds the requester (0: it does not).
    pub(crate) rnr_until: u64,
    // The receive queue and the responder.
    pub(crate) rq: NonNull<RqEntry>,
    /// The receive ring's slots less one (at least its capacity, `caps.max_recv_wr`, less
    /// one), as `sq_mask`.
    pub(crate) rq_mask: u32,
    pub(crate) rq_head: u32,
    pub(crate) rq_tail: u32,
    /// The expected PSN and the message sequence number.
    pub(crate) epsn: u32,
    pub(crate) msn: u32,
    /// A sequence NAK went out for the current gap.
    pub(crate) nak_sent: bool,
    pub(crate) inbound: Inbound,
    /// The receive request of the SEND in progress, its bytes so far.
    pub(crate) wqe: RqEntry,
    pub(crate) offset: u32,
    /// The RDMA WRITE in progress: where and how long.
    pub(crate) write_va: u64,
    pub(crate) write_rkey: u32,
    pub(crate) write_len: u32,
    pub(crate) res: [RdResource; MAX_RD_ATOMIC as usize],
    /// READs and atomics kept so far (the number of the next one).
    pub(crate) res_next: u32,
    /// READs and atomics answered in full at least once (a high-water number): those after
    /// it are in flight at the responder, at most `max_dest_rd_atomic` of them.
    pub(crate) res_sent: u32,
    /// Answers the NIC had no room for: the number of the READ or atomic to answer next, and
    /// the PSN to answer it from.
    pub(crate) backlog: Option<(u32, u32)>,
    /// An acknowledgement or NAK not sent yet (its PSN and its AETH syndrome): held behind
    /// the backlog, or met a busy NIC; sent from the device's progress.
    pub(crate) ack_due: Option<(u32, u8)>,
    /// A sequence NAK started a go-back-N retry that has made no progress yet: later
    /// sequence NAKs are ignored until it does (or the timer fires), as rxe runs one retry
    /// at a time.
    pub(crate) seq_retry: bool,
    /// Before this time (µs) a gap in a READ's responses asks for nothing: the responses of
    /// the READ asked before are still on their way (0: any time).
    pub(crate) gap_retry_at: u64,
}

impl QpCore {
    /// A datagram QP (UD, or the GSI QP, which is UD to QP1 with its fixed Q_Key).
    pub(crate) fn datagram(&self) -> bool {
        matches!(self.qp_type, QpType::Ud | QpType::Gsi)
    }

    #[inline(always)]
    pub(crate) fn sq(&mut self, i: u32) -> &mut SqEntry {
        // SAFETY: `sq` is `sq_mask + 1` entries in the QP's block (valid zeroed), reached
        // through `&mut self` only; the index is masked to them.
        unsafe { &mut *self.sq.as_ptr().add((i & self.sq_mask) as usize) }
    }

    /// The send entry `i` (a count, reduced modulo the capacity), to read.
    #[inline(always)]
    pub(crate) fn sq_ref(&self, i: u32) -> &SqEntry {
        // SAFETY: as for `sq`; shared, through `&self`.
        unsafe { &*self.sq.as_ptr().add((i & self.sq_mask) as usize) }
    }

    #[inline(always)]
    pub(crate) fn rq(&mut self, i: u32) -> &mut RqEntry {
        // SAFETY: as for `sq`.
        unsafe { &mut *self.rq.as_ptr().add((i & self.rq_mask) as usize) }
    }

    pub(crate) fn send_cq(&self) -> &CqRing {
        // SAFETY: the CQ outlives the QP and does not move (create_qp's contract); its ring
        // is shared through atomics.
        unsafe { self.send_cq.as_ref() }
    }

    pub(crate) fn recv_cq(&self) -> &CqRing {
        // SAFETY: as for `send_cq`.
        unsafe { self.recv_cq.as_ref() }
    }

    pub(crate) fn srq(&mut self) -> Option<&mut SrqCore> {
        // SAFETY: the SRQ outlives the QP and does not move (create_qp's contract); it is
        // reached under the device lock only.
        self.srq.map(|mut s| unsafe { s.as_mut() })
    }

    /// Completes the oldest send request with `status` (its completion when it is signaled
    /// or failed; its buffer back to the pool otherwise) and retires it.
    pub(crate) fn retire(&mut self, status: WcStatus, hub: &EventHub) {
        self.retire_with(status, hub);
    }

    /// [`retire`](Self::retire) of a request the peer acknowledged (the common case: once a
    /// message), inlined into the acknowledgement's handling.
    #[inline(always)]
    pub(crate) fn retire_acked(&mut self, hub: &EventHub) {
        self.retire_with(WcStatus::Success, hub);
    }

    #[inline(always)]
    fn retire_with(&mut self, status: WcStatus, hub: &EventHub) {
        if self.sq_tail == self.sq_head {
            // Nothing outstanding (a caller's bug, or a peer's answer to nothing): no
            // completion can be made up.
            return;
        }
        // The fields a completion needs, not the whole 200-byte entry.
        let e = self.sq_ref(self.sq_tail);
        let (op_code, len, tag, wr_id) = (e.op, e.len, e.tag, e.wr_id);
        let (signaled, opcode) = (e.signaled(self.sig_all), e.wc_opcode());
        self.sq_tail = self.sq_tail.wrapping_add(1);
        if self.sq_next.wrapping_sub(self.sq_tail) > self.sq_head.wrapping_sub(self.sq_tail) {
            self.sq_next = self.sq_tail;
            self.cur_pkt = 0;
        }
        // A READ's length is its data's; the atomics (the operations after READ) return 8
        // bytes.
        let byte_len = if op_code > op::READ { 8 } else { len };
        if status == WcStatus::Success && !signaled {
            self.send_cq().give(1);
            self.release_tag(tag);
            return;
        }
        let wc = WorkCompletion {
            wr_id,
            byte_len,
            qp_num: self.qpn,
            status,
            opcode,
            ..Default::default()
        };
        self.push(true, wc, tag, false, false, hub);
    }

    /// Completes a receive request.
    pub(crate) fn complete_recv(
        &mut self,
        e: &RqEntry,
        wc: WorkCompletion,
        solicited: bool,
        hub: &EventHub,
    ) {
        let wc = WorkCompletion {
            wr_id: e.wr_id,
            qp_num: self.qpn,
            ..wc
        };
        self.push(false, wc, e.tag, solicited, e.srq_room, hub);
    }

    /// Adds a completion to the send or the receive CQ, on the room its request took.
    #[inline(always)]
    fn push(
        &mut self,
        send: bool,
        wc: WorkCompletion,
        tag: u32,
        solicited: bool,
        srq_room: bool,
        hub: &EventHub,
    ) {
        let cq = if send { self.send_cq() } else { self.recv_cq() };
        let e = Cqe {
            wc,
            tag,
            release: self.release,
            solicited,
            srq_room,
        };
        if !cq.push(e, hub) {
            // Reservations make this impossible; should it happen, the buffer still goes back.
            crate::error::warn_msg("rxe: completion queue overrun; a completion was lost");
            cq.give_srq(srq_room);
            self.release_tag(tag);
        }
    }

    fn release_tag(&self, tag: u32) {
        if let (Some(r), true) = (self.release, tag != 0) {
            // SAFETY: the buffer was moved into this QP by a safe post and is handed back
            // once: its request is retired here.
            unsafe { r.release(tag - 1) };
        }
    }

    /// Moves the QP to the error state: every outstanding request completes flushed.
    pub(crate) fn enter_error(&mut self, hub: &EventHub) {
        self.state = QpState::Err;
        self.deadline = 0;
        self.rnr_until = 0;
        self.flush(hub);
    }

    /// Completes every outstanding request as flushed (the QP is in the error state).
    pub(crate) fn flush(&mut self, hub: &EventHub) {
        // Both loops bounded by the requests posted (at most the rings' capacities): each
        // turn takes one.
        while self.sq_tail != self.sq_head {
            self.retire(WcStatus::WrFlushErr, hub);
        }
        self.sq_next = self.sq_tail;
        self.cur_pkt = 0;
        if self.inbound == Inbound::Send {
            let e = self.wqe;
            self.complete_recv(&e, flushed(WcOpcode::Recv), false, hub);
        }
        self.inbound = Inbound::Idle;
        while self.rq_tail != self.rq_head {
            let e = *self.rq(self.rq_tail);
            self.rq_tail = self.rq_tail.wrapping_add(1);
            self.complete_recv(&e, flushed(WcOpcode::Recv), false, hub);
        }
    }

    /// Forgets every outstanding request without a completion (RESET), giving back the
    /// completion-queue room each had taken.
    pub(crate) fn discard(&mut self) {
        self.send_cq().give(self.sq_head.wrapping_sub(self.sq_tail));
        // Both loops bounded by the requests posted, as in `flush`.
        while self.sq_tail != self.sq_head {
            let t = self.sq(self.sq_tail).tag;
            self.release_tag(t);
            self.sq_tail = self.sq_tail.wrapping_add(1);
        }
        if self.inbound == Inbound::Send {
            self.recv_cq().give_srq(self.wqe.srq_room);
            self.release_tag(self.wqe.tag);
        }
        self.recv_cq().give(self.rq_head.wrapping_sub(self.rq_tail));
        while self.rq_tail != self.rq_head {
            let t = self.rq(self.rq_tail).tag;
            self.release_tag(t);
            self.rq_tail = self.rq_tail.wrapping_add(1);
        }
        self.sq_next = self.sq_tail;
        self.cur_pkt = 0;
        self.inbound = Inbound::Idle;
        self.deadline = 0;
        self.rnr_until = 0;
        self.nak_sent = false;
        self.res = [RdResource::default(); MAX_RD_ATOMIC as usize];
        self.res_next = 0;
        self.res_sent = 0;
        self.backlog = None;
        self.ack_due = None;
        self.seq_retry = false;
        self.gap_retry_at = 0;
    }

    /// Takes the next receive request (from the SRQ when the QP has one) off its queue into
    /// `self.wqe`, the request a SEND lands in; whether there was one. Copied once, from the
    /// ring slot into place (an 80-byte entry).
    pub(crate) fn take_wqe(&mut self, events: &mut AsyncRing, hub: &EventHub) -> bool {
        if self.srq.is_some() {
            return match self.take_srq_recv(events, hub) {
                Some(e) => {
                    self.wqe = e;
                    true
                }
                None => false,
            };
        }
        if self.rq_tail == self.rq_head {
            return false;
        }
        let i = self.rq_tail;
        self.rq_tail = i.wrapping_add(1);
        // SAFETY: as for `rq`; the slot is apart from `self.wqe`.
        let slot = unsafe { &*self.rq.as_ptr().add((i & self.rq_mask) as usize) };
        // Field by field, the four scatter entries as four fixed copies (valid zeroed, so
        // the unused ones copy harmlessly): no loop over the used ones, and no whole-entry
        // assignment (a byte-wise `rep movsb` of 80 bytes at opt-level "z").
        const _: () = assert!(super::MAX_SGE == 4, "one copy per scatter entry below");
        let w = &mut self.wqe;
        w.wr_id = slot.wr_id;
        w.tag = slot.tag;
        w.nsge = slot.nsge;
        w.srq_room = slot.srq_room;
        w.sges[0] = slot.sges[0];
        w.sges[1] = slot.sges[1];
        w.sges[2] = slot.sges[2];
        w.sges[3] = slot.sges[3];
        true
    }

    /// Completes the receive request a SEND landed in (`self.wqe`).
    pub(crate) fn complete_wqe(&mut self, wc: WorkCompletion, solicited: bool, hub: &EventHub) {
        let (wr_id, tag, srq_room) = (self.wqe.wr_id, self.wqe.tag, self.wqe.srq_room);
        let wc = WorkCompletion {
            wr_id,
            qp_num: self.qpn,
            ..wc
        };
        self.push(false, wc, tag, solicited, srq_room, hub);
    }

    /// The next receive request (from the SRQ when the QP has one), taken off its queue.
    pub(crate) fn take_recv(&mut self, events: &mut AsyncRing, hub: &EventHub) -> Option<RqEntry> {
        if self.srq.is_some() {
            return self.take_srq_recv(events, hub);
        }
        if self.rq_tail == self.rq_head {
            return None;
        }
        let e = *self.rq(self.rq_tail);
        self.rq_tail = self.rq_tail.wrapping_add(1);
        Some(e)
    }

    /// The next request of the QP's SRQ, with its completion's room taken first: without
    /// room, the request stays on the SRQ. Out of line: the own queue's path stays short.
    #[inline(never)]
    fn take_srq_recv(&mut self, events: &mut AsyncRing, hub: &EventHub) -> Option<RqEntry> {
        if !self.srq().is_some_and(|s| s.has()) {
            return None;
        }
        let srq_room = self.recv_cq().take_srq()?;
        let e = self.srq().and_then(|s| s.take(events, hub));
        match e {
            Some(e) => Some(RqEntry { srq_room, ..e }),
            None => {
                self.recv_cq().give_srq(srq_room);
                None
            }
        }
    }

    /// Whether a receive request is there.
    pub(crate) fn has_recv(&mut self) -> bool {
        match self.srq() {
            Some(s) => s.has() && self.recv_cq().srq_fits(),
            None => self.rq_tail != self.rq_head,
        }
    }

    /// Whether the device's progress has work for this QP without a frame arriving: answers
    /// or an acknowledgement held back, or (ready to send) requests not sent yet, a
    /// retransmission or RNR timer running.
    #[inline(always)]
    pub(crate) fn wants_progress(&self) -> bool {
        self.backlog.is_some()
            || self.ack_due.is_some()
            || (self.state == QpState::Rts
                && (self.deadline != 0 || self.rnr_until != 0 || self.sq_next != self.sq_head))
    }

    /// Whether the progress would send for it now (`Rxe::sends_waiting`): frames held back
    /// (a backlog, an answer due), or, ready to send, requests posted and not sent yet with
    /// room in the window. A timer alone (a request awaiting its acknowledgement, an RNR
    /// wait) is not.
    pub(crate) fn has_sends(&self) -> bool {
        if self.backlog.is_some() || self.ack_due.is_some() {
            return true;
        }
        if self.state != QpState::Rts || self.rnr_until != 0 {
            return false;
        }
        match self.qp_type {
            QpType::Ud | QpType::Gsi => self.sq_tail != self.sq_head,
            _ => {
                self.sq_next != self.sq_head
                    && super::seq::psn_diff(self.psn, self.una) < super::seq::WINDOW
            }
        }
    }

    /// The ACK timeout in microseconds (0: none): 4.096 µs << `timeout`, from a table made
    /// at compile time (no division at every acknowledgement).
    #[inline(always)]
    pub(crate) fn timeout_us(&self) -> u64 {
        TIMEOUT_US[usize::from(self.attr.timeout.min(31))]
    }
}

/// [`QpCore::timeout_us`] of each timeout code 0 to 31 (the attribute's 5 bits; larger ones
/// are taken as 31).
const TIMEOUT_US: [u64; 32] = {
    let mut t = [0; 32];
    let mut i = 1;
    while i < 32 {
        t[i] = (4096u64 << i) / 1000;
        i += 1;
    }
    t
};

/// Access rights the remote side's requests need on the QP.
pub(crate) fn qp_allows(q: &QpCore, need: AccessFlags) -> bool {
    q.attr.access.contains(need)
}

#[cfg(test)]
mod tests {
    use super::TIMEOUT_US;

    /// The table is 4.096 µs << code for every code (0: none), and a code past 31 is 31's.
    #[test]
    fn timeout_table_is_the_formula() {
        for code in 0..=u8::MAX {
            let want = match code {
                0 => 0,
                t => (4096u64 << t.min(31)) / 1000,
            };
            assert_eq!(TIMEOUT_US[usize::from(code.min(31))], want, "code {code}");
        }
        assert_eq!(TIMEOUT_US[14], 67_108);
    }
}
