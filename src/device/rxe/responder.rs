//! The responder of a queue pair: requests taken in PSN order — SEND into receive requests,
//! RDMA WRITE, READ and atomics into registered memory after the key, bounds and rights are
//! checked — acknowledged as rxe acknowledges them; one sequence NAK per gap; duplicates
//! re-acknowledged, READs and atomics replayed from the responder's resources; RNR NAK when
//! no receive is posted; and UD receives with their GRH (`docs/roce-v2.md` §6.4, §7). What
//! it sends back, and the answers that wait for room in the NIC: `reply.rs`.

use bareverbs_hal::Link;

use super::MAX_RD_ATOMIC;
use super::net::Net;
use super::qp_state::{QpCore, qp_allows};
use super::reply::{answer_from, answer_in_order, answered, syndrome};
use super::seq::{psn_add, psn_diff};
use super::wire::bth::{PSN_MASK, Reth, opcode};
use super::wire::packet::View;
use super::wqe::{Inbound, RdResource, recv_wc};
use crate::verbs::{AccessFlags, QpState, QpType, WcFlags, WcOpcode, WcStatus, WorkCompletion};

/// Bytes of the GRH slot before a UD payload in the receive buffer.
pub(crate) const GRH_LEN: usize = 40;

/// A request from the peer.
pub(crate) fn on_request<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, p: &View<'_>) {
    if q.datagram() {
        return ud_receive(net, q, p);
    }
    if !matches!(q.state, QpState::Rtr | QpState::Rts) || q.qp_type != QpType::Rc {
        return;
    }
    let psn = p.psn();
    let d = psn_diff(psn, q.epsn);
    if d > 0 {
        net.t.transport.out_of_sequence += 1;
        if !q.nak_sent {
            net.t.transport.seq_naks_sent += 1;
            q.nak_sent = true;
            let e = q.epsn;
            answer_in_order(net, q, syndrome::SEQ, e);
        }
        return;
    }
    if d < 0 {
        net.t.transport.duplicates += 1;
        return duplicate(net, q, p);
    }
    q.nak_sent = false;
    let op = p.opcode();
    let r = match op {
        opcode::RC_SEND_FIRST..=opcode::RC_SEND_ONLY_IMM => send(net, q, p),
        opcode::RC_SEND_LAST_INV | opcode::RC_SEND_ONLY_INV => send(net, q, p),
        opcode::RC_WRITE_FIRST..=opcode::RC_WRITE_ONLY_IMM => write(net, q, p),
        opcode::RC_READ_REQUEST => read(net, q, p),
        opcode::RC_COMPARE_SWAP | opcode::RC_FETCH_ADD => atomic(net, q, p),
        _ => Err(Fail::Invalid),
    };
    match r {
        Ok(()) => {}
        Err(Fail::Full) => {
            // Not taken: the PSN stays expected, and a sequence NAK of it follows the answers
            // to the READs and atomics before it (held behind them while they wait), so the
            // requester sends it again from there once those are in; the requests behind it
            // are out of sequence until then (one NAK per gap).
            net.t.transport.rd_atomic_deferred += 1;
            if !q.nak_sent {
                net.t.transport.seq_naks_sent += 1;
                q.nak_sent = true;
                answer_in_order(net, q, syndrome::SEQ, psn);
            }
        }
        Err(Fail::Rnr) => {
            net.t.transport.rnr_naks_sent += 1;
            let syn = syndrome::RNR | (q.attr.min_rnr_timer & 0x1F);
            answer_in_order(net, q, syn, psn);
        }
        Err(f) => {
            let (syn, status) = match f {
                Fail::Access => (syndrome::ACCESS, WcStatus::RemAccessErr),
                Fail::Length => (syndrome::INVALID, WcStatus::LocLenErr),
                Fail::Local => (syndrome::OPERATIONAL, WcStatus::LocProtErr),
                _ => (syndrome::INVALID, WcStatus::RemInvReqErr),
            };
            // Behind the answers to the READs and atomics taken before it (still waiting for
            // room): ahead of them it would tell the requester their responses were lost, and
            // it would ask again instead of failing the request (`reply::drain` sends them,
            // then this, once the QP is in ERROR).
            answer_in_order(net, q, syn, psn);
            if q.inbound == Inbound::Send {
                // The receive the failed SEND was landing in completes in error.
                let e = q.wqe;
                q.inbound = Inbound::Idle;
                let wc = WorkCompletion {
                    status,
                    opcode: WcOpcode::Recv,
                    ..Default::default()
                };
                q.complete_recv(&e, wc, false, net.hub);
            }
            q.enter_error(net.hub);
        }
    }
}

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fail {
    /// No receive posted: RNR NAK, the packet dropped.
    Rnr,
    /// A READ or atomic beyond the responder's depth: dropped unexecuted, the requester sent
    /// back to it with a sequence NAK behind the answers before it.
    Full,
    /// Malformed, out of order, or not allowed on the QP: NAK invalid request.
    Invalid,
    /// Key, bounds or rights of a remote access: NAK remote access error.
    Access,
    /// The message is longer than the receive: NAK invalid request, LOC_LEN_ERR.
    Length,
    /// The receive names memory the QP may not write: NAK remote operational error.
    Local,
}

/// Checks a packet's payload length against its place in the message and the path MTU.
fn length_ok(op: u8, len: usize, mtu: u32) -> bool {
    let mtu = mtu as usize;
    match op {
        opcode::RC_SEND_FIRST
        | opcode::RC_SEND_MIDDLE
        | opcode::RC_WRITE_FIRST
        | opcode::RC_WRITE_MIDDLE => len == mtu,
        opcode::RC_SEND_LAST
        | opcode::RC_SEND_LAST_IMM
        | opcode::RC_SEND_LAST_INV
        | opcode::RC_WRITE_LAST
        | opcode::RC_WRITE_LAST_IMM => len >= 1 && len <= mtu,
        _ => len <= mtu,
    }
}

/// Ends a message: the MSN counts it, the packet is acknowledged when it asks.
#[inline(always)]
fn accepted<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, p: &View<'_>, end: bool) {
    // The expected PSN: `on_request` hands a request on only then (not read from the frame
    // again).
    let psn = q.epsn;
    debug_assert_eq!(psn, p.psn());
    q.epsn = psn_add(psn, 1);
    if end {
        q.msn = (q.msn + 1) & PSN_MASK;
    }
    if p.ack_req() {
        answer_in_order(net, q, syndrome::ACK, psn);
    }
}

fn send<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, p: &View<'_>) -> Result<(), Fail> {
    let op = p.opcode();
    let first = matches!(
        op,
        opcode::RC_SEND_FIRST
            | opcode::RC_SEND_ONLY
            | opcode::RC_SEND_ONLY_IMM
            | opcode::RC_SEND_ONLY_INV
    );
    let last = op != opcode::RC_SEND_FIRST && op != opcode::RC_SEND_MIDDLE;
    // A first packet starts a message, any other continues a SEND.
    if q.inbound != if first { Inbound::Idle } else { Inbound::Send } {
        return Err(Fail::Invalid);
    }
    // FIRST and MIDDLE fill the path MTU, LAST carries 1 to MTU bytes, ONLY up to MTU.
    let len = p.payload().len();
    let mtu = q.mtu as usize;
    if len > mtu || (!last && len != mtu) || (!first && len == 0) {
        return Err(Fail::Invalid);
    }
    if first {
        if !q.take_wqe(&mut net.t.async_events, net.hub) {
            return Err(Fail::Rnr);
        }
        q.offset = 0;
        q.inbound = Inbound::Send;
    }
    let room = super::mem::sge_bytes(q.wqe.sges());
    let end = u64::from(q.offset) + p.payload().len() as u64;
    if end > room {
        return Err(Fail::Length);
    }
    if net
        .t
        .mrs
        .scatter(q.pd, q.wqe.sges(), q.offset, p.payload())
        .is_err()
    {
        return Err(Fail::Local);
    }
    q.offset = end as u32;
    if last {
        let inv = matches!(op, opcode::RC_SEND_LAST_INV | opcode::RC_SEND_ONLY_INV);
        let wc = if inv {
            // The IETH's key: invalidated only if it is this QP's to invalidate (else the
            // receive completes in error and the peer gets NAK invalid request, as rxe).
            let rkey = p.imm().ok_or(Fail::Invalid)?;
            net.t
                .mrs
                .invalidate(rkey, q.pd, Some(q.qpn))
                .map_err(|_| Fail::Invalid)?;
            super::wqe::inv_wc(q.offset, rkey, q.attr.dest_qpn)
        } else {
            recv_wc(WcOpcode::Recv, q.offset, p.imm(), q.attr.dest_qpn)
        };
        q.inbound = Inbound::Idle;
        q.complete_wqe(wc, p.se(), net.hub);
    }
    accepted(net, q, p, last);
    Ok(())
}

fn write<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, p: &View<'_>) -> Result<(), Fail> {
    let op = p.opcode();
    let first = matches!(
        op,
        opcode::RC_WRITE_FIRST | opcode::RC_WRITE_ONLY | opcode::RC_WRITE_ONLY_IMM
    );
    let last = op != opcode::RC_WRITE_FIRST && op != opcode::RC_WRITE_MIDDLE;
    let imm = matches!(op, opcode::RC_WRITE_LAST_IMM | opcode::RC_WRITE_ONLY_IMM);
    if first != (q.inbound == Inbound::Idle) || (!first && q.inbound != Inbound::Write) {
        return Err(Fail::Invalid);
    }
    if !length_ok(op, p.payload().len(), q.mtu) {
        return Err(Fail::Invalid);
    }
    if !qp_allows(q, AccessFlags::REMOTE_WRITE) {
        return Err(Fail::Invalid);
    }
    if imm && !q.has_recv() {
        return Err(Fail::Rnr);
    }
    if first {
        let r = remote_range(net, q, p.reth(), AccessFlags::REMOTE_WRITE)?;
        (q.write_va, q.write_rkey, q.write_len) = (r.va, r.rkey, r.len);
        q.offset = 0;
        q.inbound = Inbound::Write;
    }
    let len = p.payload().len() as u32;
    let end = q.offset.checked_add(len).ok_or(Fail::Invalid)?;
    if end > q.write_len || (last && end != q.write_len) {
        return Err(Fail::Invalid);
    }
    if len > 0 {
        // A peer's address: wrapping, so that `check` refuses it rather than it overflowing.
        let va = q.write_va.wrapping_add(u64::from(q.offset));
        let dst = net
            .t
            .mrs
            .check_qp(
                q.write_rkey,
                q.pd,
                q.qpn,
                va,
                u64::from(len),
                AccessFlags::REMOTE_WRITE,
            )
            .map_err(|_| Fail::Access)?;
        // SAFETY: `check` found the bytes inside a region registered with remote write (the
        // registration keeps them allocated); the payload is in the receive buffer.
        unsafe { core::ptr::copy(p.payload().as_ptr(), dst, p.payload().len()) };
    }
    q.offset = end;
    if last {
        q.inbound = Inbound::Idle;
        if imm {
            let Some(e) = q.take_recv(&mut net.t.async_events, net.hub) else {
                return Err(Fail::Rnr);
            };
            let wc = recv_wc(
                WcOpcode::RecvRdmaWithImm,
                q.write_len,
                p.imm(),
                q.attr.dest_qpn,
            );
            q.complete_recv(&e, wc, p.se(), net.hub);
        }
    }
    accepted(net, q, p, last);
    Ok(())
}

/// The RETH of a WRITE or READ, its whole range checked for `need` (a zero length names no
/// memory: nothing to check); lengths beyond 2^31 are invalid.
fn remote_range<L: Link>(
    net: &Net<'_, L>,
    q: &QpCore,
    reth: Option<Reth>,
    need: AccessFlags,
) -> Result<Reth, Fail> {
    let r = reth.ok_or(Fail::Invalid)?;
    if r.len > 1 << 31 {
        return Err(Fail::Invalid);
    }
    if r.len > 0 {
        net.t
            .mrs
            .check_qp(r.rkey, q.pd, q.qpn, r.va, u64::from(r.len), need)
            .map_err(|_| Fail::Access)?;
    }
    Ok(r)
}

/// The READs and atomics the responder keeps and has in flight at most
/// (`max_dest_rd_atomic`, within the table).
fn depth(q: &QpCore) -> u32 {
    u32::from(q.attr.max_dest_rd_atomic).clamp(1, MAX_RD_ATOMIC)
}

/// A new READ or atomic may start: the QP takes them, and fewer than `max_dest_rd_atomic`
/// are in flight (not yet answered in full once). A requester that keeps more in flight than
/// it was given (Linux's passive rdma_cm gives its QP its own initiator depth, not the
/// responder resources offered: `docs/cm.md`) gets the one beyond back with `Fail::Full`:
/// not executed, not kept, so no kept request is overwritten before it is answered and a
/// flood of READs grows nothing; it is asked for again once the answers before it are out.
fn may_start(q: &QpCore) -> Result<(), Fail> {
    if q.inbound != Inbound::Idle || q.attr.max_dest_rd_atomic == 0 {
        return Err(Fail::Invalid);
    }
    if q.res_next.wrapping_sub(q.res_sent) >= depth(q) {
        return Err(Fail::Full);
    }
    Ok(())
}

/// Keeps a READ or atomic for replay (oldest first out), numbered in the order they came.
fn remember(q: &mut QpCore, mut r: RdResource) -> RdResource {
    let i = (q.res_next % depth(q)) as usize;
    r.n = q.res_next;
    q.res[i] = r;
    q.res_next = q.res_next.wrapping_add(1);
    r
}

fn read<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, p: &View<'_>) -> Result<(), Fail> {
    may_start(q)?;
    if !qp_allows(q, AccessFlags::REMOTE_READ) {
        return Err(Fail::Invalid);
    }
    let r = remote_range(net, q, p.reth(), AccessFlags::REMOTE_READ)?;
    let psn = p.psn();
    let n = r.len.div_ceil(q.mtu).max(1);
    let res = RdResource {
        kind: 1,
        first: psn,
        last: psn_add(psn, n - 1),
        va: r.va,
        rkey: r.rkey,
        len: r.len,
        orig: 0,
        n: 0,
    };
    let res = remember(q, res);
    q.epsn = psn_add(psn, n);
    q.msn = (q.msn + 1) & PSN_MASK;
    if q.backlog.is_none() {
        answer_from(net, q, res, psn);
    }
    Ok(())
}

fn atomic<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, p: &View<'_>) -> Result<(), Fail> {
    may_start(q)?;
    if !qp_allows(q, AccessFlags::REMOTE_ATOMIC) {
        return Err(Fail::Invalid);
    }
    let a = p.atomic().ok_or(Fail::Invalid)?;
    if a.va & 7 != 0 {
        return Err(Fail::Invalid);
    }
    let at = net
        .t
        .mrs
        .check_qp(a.rkey, q.pd, q.qpn, a.va, 8, AccessFlags::REMOTE_ATOMIC)
        .map_err(|_| Fail::Access)?
        .cast::<u64>();
    // SAFETY: `check` found 8 bytes, 8-byte aligned, inside a region registered with remote
    // atomic rights; the device lock makes the read-modify-write one operation for the
    // transport (the embedder's contract keeps the CPU off registered remote memory).
    let orig = unsafe {
        let orig = at.read_volatile();
        let new = if p.opcode() == opcode::RC_COMPARE_SWAP {
            if orig == a.compare { a.swap_add } else { orig }
        } else {
            orig.wrapping_add(a.swap_add)
        };
        at.write_volatile(new);
        orig
    };
    let psn = p.psn();
    let res = RdResource {
        kind: 2,
        first: psn,
        last: psn,
        va: a.va,
        rkey: a.rkey,
        len: 8,
        orig,
        n: 0,
    };
    let res = remember(q, res);
    q.epsn = psn_add(psn, 1);
    q.msn = (q.msn + 1) & PSN_MASK;
    // Behind a READ still being answered, the acknowledgement waits its turn.
    if q.backlog.is_none() {
        answer_from(net, q, res, psn);
    }
    Ok(())
}

/// A request the responder has seen: acknowledged again, or its READ or atomic replayed.
fn duplicate<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, p: &View<'_>) {
    let psn = p.psn();
    let found = |kind: u8| answered(q, psn).filter(|r| r.kind == kind);
    match p.opcode() {
        opcode::RC_READ_REQUEST => {
            let Some(r) = found(1) else { return };
            let Some(reth) = p.reth() else { return };
            if reth.rkey != r.rkey {
                return;
            }
            replay(net, q, r, psn);
        }
        opcode::RC_COMPARE_SWAP | opcode::RC_FETCH_ADD => {
            if let Some(r) = found(2) {
                replay(net, q, r, psn);
            }
        }
        _ => {
            let last = psn_add(q.epsn, PSN_MASK);
            answer_in_order(net, q, syndrome::ACK, last);
        }
    }
}

/// The requester asks again for `r` from `psn`: answers go out from there on, in order (what
/// was waiting behind follows through `drain`). Unless the backlog already waits to answer
/// something before that point: its walk reaches `psn` in order. A requester's retry sends
/// its requests back to back, and moving the walk on to each in turn would skip the answers
/// between them that the turn had no room for (the requester, seeing a later READ answered
/// before an earlier one, would take them as lost and ask again, round after round).
fn replay<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, r: RdResource, psn: u32) {
    if let Some((n, at)) = q.backlog {
        let ahead = r.n.wrapping_sub(n) as i32;
        if ahead > 0 || (ahead == 0 && psn_diff(psn, at) >= 0) {
            return;
        }
    }
    answer_from(net, q, r, psn);
}

/// A UD datagram: its Q_Key checked, its payload after a GRH slot in the next receive.
fn ud_receive<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, p: &View<'_>) {
    if !matches!(q.state, QpState::Rtr | QpState::Rts)
        || !matches!(p.opcode(), opcode::UD_SEND_ONLY | opcode::UD_SEND_ONLY_IMM)
    {
        return;
    }
    let Some(deth) = p.deth() else { return };
    let qkey = if q.qp_type == QpType::Gsi {
        super::GSI_QKEY
    } else {
        q.attr.qkey
    };
    if deth.qkey != qkey {
        return;
    }
    let Some(e) = q.take_recv(&mut net.t.async_events, net.hub) else {
        return;
    };
    let total = GRH_LEN + p.payload().len();
    let mut wc = recv_wc(WcOpcode::Recv, total as u32, p.imm(), deth.src_qp);
    wc.flags |= WcFlags::GRH;
    if super::mem::sge_bytes(e.sges()) < total as u64 {
        wc.status = WcStatus::LocLenErr;
    } else {
        // For IPv4 the GRH slot is 20 zero bytes and the IPv4 header; over an IPv6 path
        // (the source is its alias) the IPv6 header.
        let grh = match net.t.port.path6(p.src_ip()) {
            None => {
                let mut grh = [0u8; GRH_LEN];
                grh[20..].copy_from_slice(p.ip_header());
                grh
            }
            Some(path) => super::wire::ip6::grh6(p.ip_header(), &path.dst, &path.src),
        };
        let ok = net.t.mrs.scatter(q.pd, e.sges(), 0, &grh).is_ok()
            && net
                .t
                .mrs
                .scatter(q.pd, e.sges(), GRH_LEN as u32, p.payload())
                .is_ok();
        if !ok {
            wc.status = WcStatus::LocProtErr;
        }
    }
    q.complete_recv(&e, wc, p.se(), net.hub);
}
