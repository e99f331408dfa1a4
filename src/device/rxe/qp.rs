//! Queue pairs: their state in HAL memory (the send and receive rings, the requester's and
//! the responder's progress), creation, modify, query and destroy, and the posting of work
//! requests into the rings.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use bareverbs_hal::{Clock, Hal, Link};

use super::cq::{Cq, CqRing, Cqe};
use super::mem::{Pd, sge_bytes};
use super::srq::{Srq, SrqCore};
use super::wire::addr::{rc_source_port, ud_source_port};
use super::wire::eth::Mac;
use super::{FIRST_QPN, MAX_INLINE, MAX_QP, MAX_RD_ATOMIC, MAX_SGE, MAX_WR, Rxe, requester};
use crate::dma::Dma;
use crate::error::{Attr, Error, Feature, Object, Op, Param, Queue, Resource, Result, Unsupported};
use crate::events::EventHub;
use crate::verbs::{
    AccessFlags, BufRelease, ModifyAttr, QpAttr, QpCaps, QpInit, QpState, QpType, SendFlags,
    SendWqe, Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

/// Operation codes of a send entry.
pub(crate) mod op {
    pub(crate) const SEND: u8 = 0;
    pub(crate) const SEND_IMM: u8 = 1;
    pub(crate) const WRITE: u8 = 2;
    pub(crate) const WRITE_IMM: u8 = 3;
    pub(crate) const READ: u8 = 4;
    pub(crate) const CMP_SWAP: u8 = 5;
    pub(crate) const FETCH_ADD: u8 = 6;

    /// Whether the operation waits for a response from the peer (READ, atomics).
    pub(crate) fn reads(op: u8) -> bool {
        op >= READ
    }
}

/// One send work request, as the transport keeps it (all integers: valid zeroed).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SqEntry {
    pub(crate) wr_id: u64,
    pub(crate) remote_addr: u64,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) sges: [Sge; MAX_SGE as usize],
    pub(crate) len: u32,
    pub(crate) rkey: u32,
    pub(crate) imm: u32,
    pub(crate) tag: u32,
    /// The PSN of its first packet, and how many PSNs it uses (set when first sent).
    pub(crate) first_psn: u32,
    pub(crate) npkts: u32,
    pub(crate) ud_qpn: u32,
    pub(crate) ud_qkey: u32,
    pub(crate) ud_ip: [u8; 4],
    pub(crate) ud_tos: u8,
    pub(crate) ud_ttl: u8,
    pub(crate) op: u8,
    pub(crate) flags: u8,
    pub(crate) nsge: u8,
    /// Inline data: its length (the bytes are in `inline`); 0xFF: not inline.
    pub(crate) inline_len: u8,
    pub(crate) inline: [u8; MAX_INLINE as usize],
}

impl Default for SqEntry {
    fn default() -> Self {
        SqEntry {
            wr_id: 0,
            remote_addr: 0,
            compare_add: 0,
            swap: 0,
            sges: [Sge::default(); MAX_SGE as usize],
            len: 0,
            rkey: 0,
            imm: 0,
            tag: 0,
            first_psn: 0,
            npkts: 0,
            ud_qpn: 0,
            ud_qkey: 0,
            ud_ip: [0; 4],
            ud_tos: 0,
            ud_ttl: 0,
            op: 0,
            flags: 0,
            nsge: 0,
            inline_len: 0,
            inline: [0; MAX_INLINE as usize],
        }
    }
}

impl SqEntry {
    pub(crate) fn sges(&self) -> &[Sge] {
        &self.sges[..usize::from(self.nsge).min(MAX_SGE as usize)]
    }

    pub(crate) fn is_inline(&self) -> bool {
        self.inline_len != 0xFF
    }

    pub(crate) fn signaled(&self, sig_all: bool) -> bool {
        sig_all
            || SendFlags::from_bits_truncate(u32::from(self.flags)).contains(SendFlags::SIGNALED)
    }

    pub(crate) fn wc_opcode(&self) -> WcOpcode {
        match self.op {
            op::WRITE | op::WRITE_IMM => WcOpcode::RdmaWrite,
            op::READ => WcOpcode::RdmaRead,
            op::CMP_SWAP => WcOpcode::CompSwap,
            op::FETCH_ADD => WcOpcode::FetchAdd,
            _ => WcOpcode::Send,
        }
    }
}

/// One receive work request.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RqEntry {
    pub(crate) wr_id: u64,
    pub(crate) sges: [Sge; MAX_SGE as usize],
    pub(crate) tag: u32,
    pub(crate) nsge: u32,
}

impl RqEntry {
    pub(crate) fn sges(&self) -> &[Sge] {
        &self.sges[..(self.nsge as usize).min(MAX_SGE as usize)]
    }
}

/// What the responder is in the middle of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Inbound {
    /// Between messages.
    #[default]
    Idle,
    /// A multi-packet SEND into the receive request held in `QpCore::wqe`.
    Send,
    /// A multi-packet RDMA WRITE.
    Write,
}

/// A READ or atomic the responder executed, kept for replay.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RdResource {
    /// 0: free; 1: READ; 2: atomic.
    pub(crate) kind: u8,
    pub(crate) first: u32,
    pub(crate) last: u32,
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    pub(crate) len: u32,
    pub(crate) orig: u64,
}

/// A queue pair's whole state, at the start of its block (the rings follow).
pub(crate) struct QpCore {
    pub(crate) qpn: u32,
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
    pub(crate) release: Option<BufRelease>,
    // The path (connected QPs, from RTR).
    pub(crate) peer_ip: [u8; 4],
    pub(crate) peer_mac: Option<Mac>,
    pub(crate) src_port: u16,
    pub(crate) mtu: u32,
    // The send queue and the requester.
    sq: NonNull<SqEntry>,
    pub(crate) sq_cap: u32,
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
    rq: NonNull<RqEntry>,
    pub(crate) rq_cap: u32,
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
    pub(crate) res_next: u32,
}

impl QpCore {
    pub(crate) fn sq(&mut self, i: u32) -> &mut SqEntry {
        // SAFETY: `sq` is `sq_cap` entries in the QP's block (valid zeroed), reached through
        // `&mut self` only; the index is reduced modulo the capacity.
        unsafe { &mut *self.sq.as_ptr().add((i % self.sq_cap) as usize) }
    }

    pub(crate) fn rq(&mut self, i: u32) -> &mut RqEntry {
        // SAFETY: as for `sq`.
        unsafe { &mut *self.rq.as_ptr().add((i % self.rq_cap) as usize) }
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
        if self.sq_tail == self.sq_head {
            // Nothing outstanding (a caller's bug, or a peer's answer to nothing): no
            // completion can be made up.
            return;
        }
        let e = *self.sq(self.sq_tail);
        self.sq_tail = self.sq_tail.wrapping_add(1);
        if self.sq_next.wrapping_sub(self.sq_tail) > self.sq_head.wrapping_sub(self.sq_tail) {
            self.sq_next = self.sq_tail;
            self.cur_pkt = 0;
        }
        let byte_len = if e.op == op::READ {
            e.len
        } else if op::reads(e.op) {
            8
        } else {
            e.len
        };
        if status == WcStatus::Success && !e.signaled(self.sig_all) {
            self.release_tag(e.tag);
            return;
        }
        let wc = WorkCompletion {
            wr_id: e.wr_id,
            byte_len,
            qp_num: self.qpn,
            status,
            opcode: e.wc_opcode(),
            ..Default::default()
        };
        self.push(true, wc, e.tag, false, hub);
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
        self.push(false, wc, e.tag, solicited, hub);
    }

    fn push(&mut self, send: bool, wc: WorkCompletion, tag: u32, solicited: bool, hub: &EventHub) {
        let cq = if send { self.send_cq() } else { self.recv_cq() };
        let e = Cqe {
            wc,
            tag,
            release: self.release,
            solicited,
        };
        if !cq.push(e, hub) {
            // Reservations make this impossible; should it happen, the buffer still goes back.
            crate::error::warn_msg("rxe: completion queue overrun; a completion was lost");
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

    /// Forgets every outstanding request without a completion (RESET).
    fn discard(&mut self) {
        while self.sq_tail != self.sq_head {
            let t = self.sq(self.sq_tail).tag;
            self.release_tag(t);
            self.sq_tail = self.sq_tail.wrapping_add(1);
        }
        if self.inbound == Inbound::Send {
            self.release_tag(self.wqe.tag);
        }
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
    }

    /// The next receive request (from the SRQ when the QP has one), taken off its queue.
    pub(crate) fn take_recv(&mut self, hub: &EventHub) -> Option<RqEntry> {
        if let Some(srq) = self.srq() {
            return srq.take(hub);
        }
        if self.rq_tail == self.rq_head {
            return None;
        }
        let e = *self.rq(self.rq_tail);
        self.rq_tail = self.rq_tail.wrapping_add(1);
        Some(e)
    }

    /// Whether a receive request is there.
    pub(crate) fn has_recv(&mut self) -> bool {
        match self.srq() {
            Some(s) => s.has(),
            None => self.rq_tail != self.rq_head,
        }
    }

    /// The ACK timeout in microseconds (0: none).
    pub(crate) fn timeout_us(&self) -> u64 {
        match self.attr.timeout {
            0 => 0,
            t => (4096u64 << t.min(31)) / 1000,
        }
    }
}

fn flushed(opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion {
        status: WcStatus::WrFlushErr,
        opcode,
        ..Default::default()
    }
}

/// A queue pair.
pub struct Qp<H: Hal> {
    _mem: Dma<H>,
    pub(crate) core: NonNull<QpCore>,
    pub(crate) qpn: u32,
    pub(crate) caps: QpCaps,
    pub(crate) qp_type: QpType,
    pub(crate) has_srq: bool,
    /// The PD's and the SRQ's use counts (they outlive the QP and do not move).
    pd_users: NonNull<AtomicU32>,
    srq_users: Option<NonNull<AtomicU32>>,
    /// Requests posted (mirrors the core's heads: only posting changes them).
    sq_head: u32,
    rq_head: u32,
}

// SAFETY: the core is reached only under the device lock.
unsafe impl<H: Hal + Send> Send for Qp<H> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync> Sync for Qp<H> {}

/// A batch's copy of a queue's posting state: where it starts and how many it wrote.
#[derive(Clone, Copy, Debug)]
pub struct Cursor {
    start: u32,
    n: u32,
}

fn wr_op(o: WrOpcode) -> u8 {
    match o {
        WrOpcode::Send => op::SEND,
        WrOpcode::SendWithImm => op::SEND_IMM,
        WrOpcode::RdmaWrite => op::WRITE,
        WrOpcode::RdmaWriteWithImm => op::WRITE_IMM,
        WrOpcode::RdmaRead => op::READ,
        WrOpcode::AtomicCmpSwap => op::CMP_SWAP,
        WrOpcode::AtomicFetchAdd => op::FETCH_ADD,
    }
}

/// Rounds a queue depth up to what the rings hold, or refuses it.
fn depth(want: u32, param: Param) -> Result<u32> {
    if want > MAX_WR {
        return Err(Error::invalid(param, want, MAX_WR));
    }
    Ok(want.max(1))
}

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    pub(crate) fn plan_qp_impl(&self, init: &QpInit<'_>) -> Result<QpCaps> {
        match init.qp_type {
            QpType::Rc | QpType::Uc | QpType::Ud => {}
            t => return Err(Error::Unsupported(Unsupported::QpType(t))),
        }
        if !init.ex.create_flags.is_empty() {
            return Err(Error::Unsupported(Unsupported::Feature(
                Feature::CreateFlags,
            )));
        }
        if init.ex.source_qpn.is_some() {
            return Err(Error::Unsupported(Unsupported::Feature(Feature::SourceQpn)));
        }
        if init.ex.rx_hash.is_some() {
            return Err(Error::Unsupported(Unsupported::Feature(Feature::Rss)));
        }
        if init.ex.max_tso_header != 0 {
            return Err(Error::Unsupported(Unsupported::Feature(Feature::Tso)));
        }
        if init.ex.xrcd.is_some() {
            return Err(Error::Unsupported(Unsupported::Feature(Feature::Xrc)));
        }
        let c = init.caps;
        if c.max_send_sge > MAX_SGE {
            return Err(Error::invalid(Param::MaxSendSge, c.max_send_sge, MAX_SGE));
        }
        if c.max_recv_sge > MAX_SGE {
            return Err(Error::invalid(Param::MaxRecvSge, c.max_recv_sge, MAX_SGE));
        }
        if c.max_inline_data > MAX_INLINE {
            return Err(Error::invalid(
                Param::MaxInlineData,
                c.max_inline_data,
                MAX_INLINE,
            ));
        }
        let send = depth(c.max_send_wr, Param::MaxSendWr)?;
        let (recv, recv_sge) = if init.has_srq {
            (0, 0)
        } else {
            (
                depth(c.max_recv_wr, Param::MaxRecvWr)?,
                c.max_recv_sge.max(1),
            )
        };
        Ok(QpCaps {
            max_send_wr: send,
            max_recv_wr: recv,
            max_send_sge: c.max_send_sge.max(1),
            max_recv_sge: recv_sge,
            max_inline_data: if c.max_inline_data > 0 { MAX_INLINE } else { 0 },
        })
    }

    pub(crate) fn create_qp_impl(
        &self,
        pd: &Pd,
        send_cq: &Cq<H>,
        recv_cq: &Cq<H>,
        srq: Option<&Srq<H>>,
        init: &QpInit<'_>,
    ) -> Result<Qp<H>> {
        let caps = self.plan_qp_impl(init)?;
        let (sq_cap, rq_cap) = (caps.max_send_wr, caps.max_recv_wr.max(1));
        // Completion-queue room is reserved now, not per post.
        let need = |cq: &Cq<H>| cq.ring().reserved.load(Ordering::Relaxed);
        let same = core::ptr::eq(send_cq, recv_cq);
        let recv_need = if srq.is_some() { 0 } else { caps.max_recv_wr };
        let fits = if same {
            need(send_cq) + sq_cap + recv_need <= send_cq.ring().cap()
        } else {
            need(send_cq) + sq_cap <= send_cq.ring().cap()
                && need(recv_cq) + recv_need <= recv_cq.ring().cap()
        };
        if !fits {
            let cq = send_cq.ring().cap();
            return Err(Error::invalid(Param::CqEntries, sq_cap + recv_need, cq));
        }
        let at_sq = size_of::<QpCore>().next_multiple_of(64);
        let at_rq = at_sq + sq_cap as usize * size_of::<SqEntry>();
        let bytes = at_rq + rq_cap as usize * size_of::<RqEntry>();
        let mem = Dma::new(&self.hal, bytes.div_ceil(bareverbs_hal::PAGE_SIZE))?;
        let mut core = self.lock();
        let t = core.tables();
        let Some(idx) = t.qps.iter().position(|q| q.is_null()) else {
            return Err(Error::Resource(Resource::Objects {
                object: Object::Qp,
                limit: MAX_QP as u32,
            }));
        };
        let qpn = FIRST_QPN + idx as u32;
        let ptr = mem.base().cast::<QpCore>();
        // SAFETY: the block holds the core and both rings (page-aligned, zeroed: the rings'
        // entries are valid zeroed); the core is written before any reference to it.
        unsafe {
            ptr.write(QpCore {
                qpn,
                qp_type: init.qp_type,
                pd: pd.id,
                sig_all: init.sq_sig_all,
                state: QpState::Reset,
                attr: ModifyAttr::to_state(QpState::Reset),
                caps,
                send_cq: send_cq.ring,
                recv_cq: recv_cq.ring,
                srq: srq.map(|s| s.core),
                release: init.safe,
                peer_ip: [0; 4],
                peer_mac: None,
                src_port: ud_source_port(qpn),
                mtu: self.mtu,
                sq: mem.base().add(at_sq).cast(),
                sq_cap,
                sq_head: 0,
                sq_tail: 0,
                sq_next: 0,
                cur_pkt: 0,
                psn: 0,
                una: 0,
                retries: 0,
                rnr_retries: 0,
                deadline: 0,
                rnr_until: 0,
                rq: mem.base().add(at_rq).cast(),
                rq_cap,
                rq_head: 0,
                rq_tail: 0,
                epsn: 0,
                msn: 0,
                nak_sent: false,
                inbound: Inbound::Idle,
                wqe: RqEntry::default(),
                offset: 0,
                write_va: 0,
                write_rkey: 0,
                write_len: 0,
                res: [RdResource::default(); MAX_RD_ATOMIC as usize],
                res_next: 0,
            });
        }
        t.qps[idx] = ptr.as_ptr();
        send_cq.ring().reserved.fetch_add(sq_cap, Ordering::Relaxed);
        recv_cq
            .ring()
            .reserved
            .fetch_add(recv_need, Ordering::Relaxed);
        pd.users.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = srq {
            s.users.fetch_add(1, Ordering::Relaxed);
        }
        drop(core);
        Ok(Qp {
            _mem: mem,
            core: ptr,
            qpn,
            caps,
            qp_type: init.qp_type,
            has_srq: srq.is_some(),
            pd_users: NonNull::from(&pd.users),
            srq_users: srq.map(|s| NonNull::from(&s.users)),
            sq_head: 0,
            rq_head: 0,
        })
    }

    /// The QP's core; `_held` is the device lock's guard, which the caller keeps while it
    /// uses the core.
    #[allow(clippy::mut_from_ref)]
    fn qp_core<'a>(&self, qp: &'a Qp<H>, _held: &super::Core<L>) -> &'a mut QpCore {
        // SAFETY: the core lives in the QP's block until the QP is dropped, and is reached
        // only under the device lock, which the caller holds.
        unsafe { &mut *qp.core.as_ptr() }
    }

    pub(crate) fn modify_qp_impl(&self, qp: &mut Qp<H>, m: &ModifyAttr) -> Result<()> {
        let mut guard = self.lock();
        let now = self.now();
        let hub = self.hub();
        let q = self.qp_core(qp, &guard);
        let (link, t) = guard.parts();
        let mut attr = q.attr;
        attr.merge(m);
        let has = |b| m.mask.contains(b);
        use crate::verbs::QpAttrMask as M;
        match m.state {
            QpState::Rtr if q.qp_type != QpType::Ud && q.state != QpState::Rtr => {
                let av = attr.av.ok_or(Error::MissingAttribute {
                    op: Op::ModifyQp,
                    attr: Attr::Address,
                })?;
                let ip = av
                    .dgid
                    .ipv4()
                    .ok_or(Error::Unsupported(Unsupported::Feature(Feature::Ipv6)))?;
                // Either GID sends from the interface's IPv4 address (RoCEv2 over IPv4).
                if av.sgid_index > 1 {
                    return Err(Error::invalid(Param::GidIndex, av.sgid_index, 1u8));
                }
                let mtu = attr.path_mtu.bytes();
                if mtu > self.mtu {
                    return Err(Error::invalid(
                        Param::PathMtu,
                        attr.path_mtu as u8,
                        self.mtu / 256,
                    ));
                }
                if attr.max_dest_rd_atomic as u32 > MAX_RD_ATOMIC {
                    return Err(Error::invalid(
                        Param::MaxRdAtomic,
                        attr.max_dest_rd_atomic,
                        MAX_RD_ATOMIC,
                    ));
                }
                q.peer_ip = ip;
                q.peer_mac = None;
                q.mtu = mtu;
                q.src_port = rc_source_port(q.qpn, attr.dest_qpn, av.flow_label);
                q.epsn = attr.rq_psn & super::wire::bth::PSN_MASK;
                q.msn = 0;
                q.nak_sent = false;
                // Start resolving the peer now: the requester needs its MAC.
                if let Ok(Some(mac)) = t.port.resolve(link, ip, now) {
                    q.peer_mac = Some(mac);
                }
            }
            QpState::Rts if q.state != QpState::Rts => {
                if attr.max_rd_atomic as u32 > MAX_RD_ATOMIC {
                    return Err(Error::invalid(
                        Param::MaxRdAtomic,
                        attr.max_rd_atomic,
                        MAX_RD_ATOMIC,
                    ));
                }
                let psn = attr.sq_psn & super::wire::bth::PSN_MASK;
                q.psn = psn;
                q.una = psn;
                q.retries = attr.retry_cnt;
                q.rnr_retries = attr.rnr_retry;
            }
            QpState::Rts if has(M::SQ_PSN) => {
                q.psn = attr.sq_psn & super::wire::bth::PSN_MASK;
                q.una = q.psn;
            }
            QpState::Err => {
                q.attr = attr;
                q.enter_error(hub);
                return Ok(());
            }
            QpState::Reset => {
                q.discard();
                q.peer_mac = None;
                q.msn = 0;
                attr = ModifyAttr::to_state(QpState::Reset);
            }
            _ => {}
        }
        q.attr = attr;
        q.state = m.state;
        Ok(())
    }

    pub(crate) fn query_qp_impl(&self, qp: &Qp<H>) -> QpAttr {
        let guard = self.lock();
        let q = self.qp_core(qp, &guard);
        let a = q.attr;
        QpAttr {
            state: q.state,
            cur_state: q.state,
            caps: q.caps,
            qp_num: q.qpn,
            qkey: a.qkey,
            rq_psn: q.epsn,
            sq_psn: q.psn,
            dest_qpn: a.dest_qpn,
            sq_sig_all: q.sig_all,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            path_mtu: a.path_mtu,
            access: a.access,
            pkey_index: a.pkey_index,
            port: a.port,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            min_rnr_timer: a.min_rnr_timer,
            av: if q.qp_type == QpType::Ud { None } else { a.av },
            sq_draining: false,
            qp_type: q.qp_type,
            has_srq: q.srq.is_some(),
        }
    }

    /// Destroys a QP: it leaves the table (nothing reaches it after), its requests are
    /// forgotten, its CQ room and PD/SRQ uses given back. Never fails.
    pub(crate) fn destroy_qp_impl(&self, qp: Qp<H>) {
        let mut guard = self.lock();
        let idx = (qp.qpn - FIRST_QPN) as usize;
        if let Some(slot) = guard.tables().qps.get_mut(idx) {
            *slot = core::ptr::null_mut();
        }
        let q = self.qp_core(&qp, &guard);
        q.discard();
        let recv_need = if q.srq.is_some() {
            0
        } else {
            q.caps.max_recv_wr
        };
        q.send_cq().reserved.fetch_sub(q.sq_cap, Ordering::Relaxed);
        q.recv_cq().reserved.fetch_sub(recv_need, Ordering::Relaxed);
        drop(guard);
        // SAFETY: the PD and the SRQ outlive the QP (create_qp's contract).
        unsafe {
            qp.pd_users.as_ref().fetch_sub(1, Ordering::Relaxed);
            if let Some(s) = qp.srq_users {
                s.as_ref().fetch_sub(1, Ordering::Relaxed);
            }
        }
        drop(qp);
    }

    // --- Posting.

    pub(crate) fn sq_start_impl(&self, qp: &Qp<H>) -> Cursor {
        Cursor {
            start: qp.sq_head,
            n: 0,
        }
    }

    pub(crate) fn sq_write_impl(
        &self,
        qp: &mut Qp<H>,
        c: &mut Cursor,
        w: &SendWqe<'_, super::Ah>,
    ) -> Result<()> {
        let op_code = wr_op(w.op);
        let ud = qp.qp_type == QpType::Ud;
        match (ud, w.ud) {
            (true, None) => {
                return Err(Error::MissingAttribute {
                    op: Op::PostSend,
                    attr: Attr::UdDest,
                });
            }
            (false, Some(_)) => {
                return Err(Error::Unsupported(Unsupported::Feature(
                    Feature::OpcodeForQpType,
                )));
            }
            _ => {}
        }
        if (ud && op_code > op::SEND_IMM) || (qp.qp_type == QpType::Uc && op::reads(op_code)) {
            return Err(Error::Unsupported(Unsupported::Feature(
                Feature::OpcodeForQpType,
            )));
        }
        if w.sges.len() > qp.caps.max_send_sge as usize {
            return Err(Error::invalid(
                Param::NumSge,
                w.sges.len() as u64,
                qp.caps.max_send_sge,
            ));
        }
        let inline = w.flags.contains(SendFlags::INLINE);
        let len = sge_bytes(w.sges);
        if inline && (len > u64::from(qp.caps.max_inline_data) || op::reads(op_code)) {
            return Err(Error::Unsupported(Unsupported::Feature(
                Feature::InlineData,
            )));
        }
        if len > 1 << 31 {
            return Err(Error::invalid(Param::BufferRange, len, 1u64 << 31));
        }
        if op::reads(op_code) && op_code != op::READ && (w.sges.len() != 1 || len != 8) {
            return Err(Error::invalid(Param::BufferRange, len, 8u64));
        }
        let guard = self.lock();
        let q = self.qp_core(qp, &guard);
        let used = c.start.wrapping_add(c.n).wrapping_sub(q.sq_tail);
        if used >= q.sq_cap {
            return Err(Error::QueueFull {
                queue: Queue::Send,
                free: q.sq_cap.saturating_sub(c.start.wrapping_sub(q.sq_tail)),
            });
        }
        let mut e = SqEntry {
            wr_id: w.wr_id,
            remote_addr: w.remote_addr,
            compare_add: w.compare_add,
            swap: w.swap,
            len: len as u32,
            rkey: w.rkey,
            imm: w.imm,
            tag: w.tag,
            op: op_code,
            flags: w.flags.bits() as u8,
            inline_len: 0xFF,
            ..Default::default()
        };
        if inline {
            let mut at = 0;
            for s in w.sges {
                // SAFETY: an inline request's SGEs name bytes the caller lends for this call
                // (the batch's `send_inline` borrows them), `length` bytes at `addr`.
                let src = unsafe {
                    core::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
                };
                e.inline[at..at + src.len()].copy_from_slice(src);
                at += src.len();
            }
            e.inline_len = at as u8;
        } else {
            e.sges[..w.sges.len()].copy_from_slice(w.sges);
            e.nsge = w.sges.len() as u8;
        }
        if let Some(u) = w.ud {
            e.ud_qpn = u.remote_qpn;
            e.ud_qkey = u.remote_qkey;
            e.ud_ip = u.ah.ip;
            e.ud_tos = u.ah.tos;
            e.ud_ttl = u.ah.ttl;
        }
        *q.sq(c.start.wrapping_add(c.n)) = e;
        c.n += 1;
        Ok(())
    }

    pub(crate) fn sq_commit_impl(&self, qp: &mut Qp<H>, c: &Cursor, flushed: bool) {
        qp.sq_head = c.start.wrapping_add(c.n);
        let mut guard = self.lock();
        let now = self.now();
        let hub = self.hub();
        let q = self.qp_core(qp, &guard);
        q.sq_head = qp.sq_head;
        if flushed || q.state == QpState::Err {
            q.flush(hub);
            return;
        }
        self.run_requester(&mut guard, qp.core, now);
    }

    pub(crate) fn rq_start_impl(&self, qp: &Qp<H>) -> Cursor {
        Cursor {
            start: qp.rq_head,
            n: 0,
        }
    }

    pub(crate) fn rq_write_impl(
        &self,
        qp: &mut Qp<H>,
        c: &mut Cursor,
        wr_id: u64,
        sges: &[Sge],
        tag: u32,
    ) -> Result<()> {
        if qp.has_srq {
            return Err(Error::Unsupported(Unsupported::Feature(
                Feature::SrqOnQpType,
            )));
        }
        if sges.len() > qp.caps.max_recv_sge as usize {
            return Err(Error::invalid(
                Param::NumSge,
                sges.len() as u64,
                qp.caps.max_recv_sge,
            ));
        }
        let guard = self.lock();
        let q = self.qp_core(qp, &guard);
        let used = c.start.wrapping_add(c.n).wrapping_sub(q.rq_tail);
        if used >= q.caps.max_recv_wr {
            return Err(Error::QueueFull {
                queue: Queue::Recv,
                free: q
                    .caps
                    .max_recv_wr
                    .saturating_sub(c.start.wrapping_sub(q.rq_tail)),
            });
        }
        let mut e = RqEntry {
            wr_id,
            tag,
            nsge: sges.len() as u32,
            ..Default::default()
        };
        e.sges[..sges.len()].copy_from_slice(sges);
        *q.rq(c.start.wrapping_add(c.n)) = e;
        c.n += 1;
        Ok(())
    }

    pub(crate) fn rq_commit_impl(&self, qp: &mut Qp<H>, c: &Cursor, flushed: bool) {
        qp.rq_head = c.start.wrapping_add(c.n);
        let guard = self.lock();
        let hub = self.hub();
        let q = self.qp_core(qp, &guard);
        q.rq_head = qp.rq_head;
        if flushed || q.state == QpState::Err {
            q.flush(hub);
        }
    }

    /// Runs the requester of the QP whose core is `q` (the lock is held: `core`).
    pub(crate) fn run_requester(&self, core: &mut super::Core<L>, q: NonNull<QpCore>, now: u64) {
        let mut net = self.net(core, now);
        // SAFETY: the QP's core, reached under the device lock (`core`), apart from the
        // tables `net` borrows.
        let q = unsafe { &mut *q.as_ptr() };
        requester::run(&mut net, q);
    }
}

/// Access rights the remote side's requests need on the QP.
pub(crate) fn qp_allows(q: &QpCore, need: AccessFlags) -> bool {
    q.attr.access.contains(need)
}

/// A receive completion of `len` bytes.
pub(crate) fn recv_wc(opcode: WcOpcode, len: u32, imm: Option<u32>, src_qp: u32) -> WorkCompletion {
    WorkCompletion {
        byte_len: len,
        imm: imm.unwrap_or(0),
        src_qp,
        opcode,
        flags: if imm.is_some() {
            WcFlags::WITH_IMM
        } else {
            WcFlags::empty()
        },
        ..Default::default()
    }
}
