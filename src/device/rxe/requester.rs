//! The requester and the completer of a connected queue pair (a datagram QP's requester is
//! `datagram.rs`): send requests cut into packets at the
//! path MTU inside the PSN window, READ and atomic depth and fences respected; then the
//! peer's answers — coalesced ACKs, NAKs, READ responses, atomic acknowledges — complete the
//! requests in order; a timer or a sequence NAK rewinds to the oldest unacknowledged PSN
//! (go-back-N, one retry at a time), an RNR NAK waits its timer (`docs/roce-v2.md` §6.2,
//! §6.3). Answers older than the oldest unacknowledged PSN are ignored, as rxe's completer
//! ignores them.

use bareverbs_hal::Link;

use super::datagram::{BURST, payload, run_ud};
use super::net::{Net, Unsent};
use super::qp_state::QpCore;
use super::seq::{self, Kind, WINDOW, psn_add, psn_diff};
use super::wire::bth::{AtomicEth, Bth, DEFAULT_PKEY, Headers, Reth, opcode};
use super::wire::packet::{EXT_MAX, Template, View, reth_bytes};
use super::wqe::{SqEntry, op};
use crate::verbs::{QpState, QpType, SendFlags, WcStatus};

/// Response packets one READ request asks for at most. A longer READ is asked for in parts
/// of this many packets (at fixed places: packet `k` belongs to the part from
/// `k - k % READ_PART`), each a READ request of its own, and its parts' responses in flight
/// are kept within the window: nothing acknowledges READ responses, and a responder answers a
/// request whole at once (Linux's rxe does), so a READ of thousands of packets asked at once
/// arrives faster than a slow receiver takes it and its buffers drop the rest. A part asked
/// again after a loss starts at the first missing packet and ends where its part ends (a
/// responder replays only within the request it had).
pub(crate) const READ_PART: u32 = 64;

/// Where the part of a READ holding packet `k` (of `n`) ends: its next part's first packet.
#[inline(always)]
fn part_end(k: u32, n: u32) -> u32 {
    (k - k % READ_PART).saturating_add(READ_PART).min(n)
}

/// Microseconds of each RNR timer code (IBA table; code 0 is the longest).
const RNR_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// READ and atomic requests started and not completed (a READ of more than one part as two:
/// its last parts may both be in flight).
fn reads_out(q: &QpCore) -> u32 {
    let mut n = 0;
    let mut i = q.sq_tail;
    // Bounded by the requests started and not completed: `sq_next - sq_tail` is at most the
    // ring's capacity (MAX_WR), a distance between two wrapping counts that cannot wrap.
    while i != q.sq_next {
        let e = q.sq_ref(i);
        if op::reads(e.op) {
            n += if e.op == op::READ && e.npkts > READ_PART {
                2
            } else {
                1
            };
        }
        i = i.wrapping_add(1);
    }
    n
}

/// Whether a READ or atomic (`e_op`), or a request with the fence flag, may start: the READs
/// and atomics in flight below the initiator depth, and none at all before a fenced one.
fn may_start(q: &QpCore, e_op: u8, fence: bool) -> bool {
    let out = reads_out(q);
    let deep = op::reads(e_op) && out >= u32::from(q.attr.max_rd_atomic).max(1);
    !(deep || (fence && out > 0))
}

/// Sends what the window allows. Inlined: most calls (after an acknowledgement, from the
/// timers) find nothing to send, and return before the sending functions' frames are set up.
#[inline(always)]
pub(crate) fn run<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore) {
    if q.state != QpState::Rts {
        return;
    }
    if q.rnr_until != 0 {
        if net.now < q.rnr_until {
            return;
        }
        q.rnr_until = 0;
    }
    match q.qp_type {
        QpType::Ud | QpType::Gsi => {
            if q.sq_tail != q.sq_head {
                run_ud(net, q)
            }
        }
        _ => {
            if q.sq_next != q.sq_head {
                run_rc(net, q)
            }
        }
    }
}

fn run_rc<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore) {
    if q.sq_next == q.sq_head {
        return;
    }
    match net.path(q) {
        Ok(true) => {}
        Ok(false) => return,
        Err(_) => {
            // Nobody answers for the peer's address: the request cannot be delivered.
            return fail(net, q, WcStatus::RetryExcErr);
        }
    }
    let mtu = q.mtu;
    let mut sent = 0;
    // Bounded by BURST packets (a plain count).
    while q.sq_next != q.sq_head && sent < BURST {
        if psn_diff(q.psn, q.una) >= WINDOW {
            break;
        }
        let i = q.sq_next;
        let k = q.cur_pkt;
        // Read in place (a shared borrow of the QP until the frame is out), not copied: the
        // entry is 200 bytes.
        let e = q.sq_ref(i);
        let e_op = e.op;
        // The message's first PSN and packet count: set when its first packet goes (stored
        // in the entry just after it is sent).
        let (e_first, e_npkts) = if k == 0 {
            let fence =
                SendFlags::from_bits_truncate(u32::from(e.flags)).contains(SendFlags::FENCE);
            if op::local(e_op) {
                // A bind, fast registration or local invalidation: executed here once every
                // request before it has completed (a READ may still be landing in the memory
                // it changes), and completed at once (`local.rs`).
                if q.sq_tail != i {
                    break;
                }
                if let Err(status) = super::local::execute(&mut net.t.mrs, q, i) {
                    // Nothing before it is left to flush (checked just above).
                    return fail(net, q, status);
                }
                q.sq_next = i.wrapping_add(1);
                q.retire(WcStatus::Success, net.hub);
                continue;
            }
            if (op::reads(e_op) || fence) && !may_start(q, e_op, fence) {
                break;
            }
            let n = match e_op {
                op::CMP_SWAP | op::FETCH_ADD => 1,
                // One packet (what `packets` gives for it, or for an MTU it refuses).
                _ if e.len <= mtu => 1,
                _ => packets(e.len, mtu),
            };
            (q.psn, n)
        } else {
            (e.first_psn, e.npkts)
        };
        if e_op == op::READ {
            // A part of a READ: its responses within the window (one part always goes when
            // nothing is in flight), and, after the first part, the READs in flight within
            // the initiator depth (this READ's parts counted).
            let part = part_end(k, e_npkts) - k;
            let out = psn_diff(q.psn, q.una);
            if out > 0 && out + part as i32 > WINDOW {
                break;
            }
            if k != 0 {
                let mine = if out > 0 {
                    let from = psn_diff(q.psn, e_first).min(out).max(1) as u32;
                    from.div_ceil(READ_PART)
                } else {
                    0
                };
                if reads_out(q) + mine >= u32::from(q.attr.max_rd_atomic).max(1) {
                    break;
                }
            }
        }
        // Made by `path` above; nothing in between drops it (the QP's lock is held).
        let Some(outer) = q.hdr.as_ref() else {
            break;
        };
        let psn = q.psn;
        let mut bth = Bth {
            opcode: 0,
            se: false,
            pad: 0,
            pkey: DEFAULT_PKEY,
            dest_qp: q.attr.dest_qpn,
            ack_req: true,
            psn,
        };
        let r = match e.op {
            op::SEND if e_npkts == 1 => {
                // The common one-packet SEND: its BTH alone, the whole message (no segment,
                // no header record).
                bth.opcode = opcode::RC_SEND_ONLY;
                bth.se = SendFlags::from_bits_truncate(u32::from(e.flags))
                    .contains(SendFlags::SOLICITED);
                let pd = q.pd;
                net.send_bth(outer, bth, e.len as usize, move |t, out| {
                    payload(t, pd, e, 0, out)
                })
            }
            // The others: a packet of a longer message, a READ, an atomic.
            _ => match request(net, outer, e, q.pd, bth, (k, e_npkts), mtu) {
                Some(r) => r,
                None => break,
            },
        };
        if k == 0 {
            let s = q.sq(i);
            s.first_psn = e_first;
            s.npkts = e_npkts;
        }
        match r {
            Ok(()) => {}
            Err(Unsent::Busy) => break,
            Err(Unsent::Denied(_)) => {
                // The gather list names memory the QP may not read: this request fails with
                // a local protection error, after the ones before it (flushed: the QP is
                // going to the error state), in order.
                // Bounded: each turn retires one of the requests before `i` (fewer than the
                // ring's capacity).
                while q.sq_tail != i {
                    q.retire(WcStatus::WrFlushErr, net.hub);
                }
                return fail(net, q, WcStatus::LocProtErr);
            }
            // Lost on the way out: the retransmission timer covers it.
            Err(Unsent::Lost) => {}
        }
        sent += 1;
        if q.deadline == 0 {
            q.deadline = deadline(net.now, q.timeout_us());
        }
        if e_op == op::READ {
            // A READ's request stands for all its part's responses' PSNs.
            let end = part_end(k, e_npkts);
            q.psn = psn_add(e_first, end);
            if end >= e_npkts {
                q.cur_pkt = 0;
                q.sq_next = i.wrapping_add(1);
            } else {
                q.cur_pkt = end;
            }
        } else if op::reads(e_op) {
            q.psn = psn_add(e_first, e_npkts);
            q.cur_pkt = 0;
            q.sq_next = i.wrapping_add(1);
        } else {
            q.psn = psn_add(psn, 1);
            q.cur_pkt += 1;
            if q.cur_pkt >= e_npkts {
                q.cur_pkt = 0;
                q.sq_next = i.wrapping_add(1);
            }
        }
    }
}

/// Sends packet `k` of the `npkts` of the request `e` (not a one-packet SEND) with `bth`
/// (its PSN and destination set) along `outer`: a READ's request, an atomic, a SEND's or
/// WRITE's packet at path MTU `mtu`. `None` when the MTU cuts no such packet. Apart from the
/// requester's turn: the one-packet SEND's path stays lean.
fn request<L: Link>(
    net: &mut Net<'_, L>,
    outer: &Template,
    e: &SqEntry,
    pd: u32,
    mut bth: Bth,
    (k, e_npkts): (u32, u32),
    mtu: u32,
) -> Option<Result<(), Unsent>> {
    match e.op {
        op::READ => {
            bth.opcode = opcode::RC_READ_REQUEST;
            // Packet `k` to the end of its part (`READ_PART`).
            let done = k.saturating_mul(mtu).min(e.len);
            let end = part_end(k, e_npkts).saturating_mul(mtu).min(e.len);
            let reth = Reth {
                va: e.remote_addr.wrapping_add(u64::from(done)),
                rkey: e.rkey,
                len: end - done.min(end),
            };
            // At fixed offsets: the BTH and the RETH.
            let ext = (reth_bytes(&reth), EXT_MAX);
            Some(net.send_ext(outer, bth, ext, 0, |_, _| Ok(())))
        }
        op::CMP_SWAP | op::FETCH_ADD => {
            let cas = e.op == op::CMP_SWAP;
            bth.opcode = if cas {
                opcode::RC_COMPARE_SWAP
            } else {
                opcode::RC_FETCH_ADD
            };
            let mut h = Headers::new(bth);
            h.atomic = Some(AtomicEth {
                va: e.remote_addr,
                rkey: e.rkey,
                swap_add: if cas { e.swap } else { e.compare_add },
                compare: if cas { e.compare_add } else { 0 },
            });
            Some(net.send(outer, &h, 0, |_, _| Ok(())))
        }
        _ => {
            let kind = match e.op {
                op::SEND | op::SEND_IMM | op::SEND_INV => Kind::Send {
                    imm: e.op == op::SEND_IMM,
                },
                _ => Kind::Write {
                    imm: e.op == op::WRITE_IMM,
                },
            };
            let s = seq::segment_of(kind, e.len, mtu, e_npkts, k)?;
            let last = k + 1 == e_npkts;
            bth.opcode = s.opcode;
            bth.ack_req = s.ack_req;
            let solicited =
                SendFlags::from_bits_truncate(u32::from(e.flags)).contains(SendFlags::SOLICITED);
            bth.se = last && solicited && e.op != op::WRITE;
            let write_first = k == 0 && matches!(kind, Kind::Write { .. });
            let with_imm = last && matches!(e.op, op::SEND_IMM | op::WRITE_IMM | op::SEND_INV);
            if !with_imm {
                // The packets without immediate data (most), at fixed offsets: a WRITE's first
                // with its RETH, the others a BTH alone.
                let ext = if write_first {
                    let reth = Reth {
                        va: e.remote_addr,
                        rkey: e.rkey,
                        len: e.len,
                    };
                    (reth_bytes(&reth), EXT_MAX)
                } else {
                    ([0; EXT_MAX], 0)
                };
                return Some(net.send_ext(outer, bth, ext, s.len as usize, |t, out| {
                    payload(t, pd, e, s.offset, out)
                }));
            }
            let mut h = Headers::new(bth);
            if write_first {
                h.reth = Some(Reth {
                    va: e.remote_addr,
                    rkey: e.rkey,
                    len: e.len,
                });
            }
            if last && matches!(e.op, op::SEND_IMM | op::WRITE_IMM) {
                h.imm = Some(e.imm);
            }
            if last && e.op == op::SEND_INV {
                // The IETH: the peer's key to invalidate, where ImmDt would be.
                h.bth.opcode = super::local::with_inv(s.opcode);
                h.imm = Some(e.rkey);
            }
            Some(net.send(outer, &h, s.len as usize, |t, out| {
                payload(t, pd, e, s.offset, out)
            }))
        }
    }
}

/// The packets of a message of `len` bytes at path MTU `mtu` (1 for an MTU [`seq::packets`]
/// refuses). Out of line: the requester's turn computes it for a message longer than one
/// packet only, and inlined its MTU checks were hoisted into every turn.
#[inline(never)]
fn packets(len: u32, mtu: u32) -> u32 {
    seq::packets(len, mtu).unwrap_or(1)
}

fn deadline(now: u64, timeout: u64) -> u64 {
    if timeout == 0 {
        0
    } else {
        now.saturating_add(timeout).max(1)
    }
}

/// Completes the send and write requests the peer acknowledged through `psn`; stops at a
/// READ or atomic (those complete with their responses). `true` when such a request is
/// covered by the acknowledge: its response was lost.
#[inline(always)]
fn ack_through<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, psn: u32) -> bool {
    // Bounded by the requests started (at most MAX_WR): each turn retires one or returns,
    // whatever PSN the peer wrote.
    while q.sq_tail != q.sq_next {
        let e = q.sq_ref(q.sq_tail);
        let (e_op, first) = (e.op, e.first_psn);
        let last = psn_add(first, e.npkts.max(1) - 1);
        if psn_diff(psn, last) < 0 {
            if !op::reads(e_op) && psn_diff(psn, first) >= 0 {
                // Part of a multi-packet message.
                q.una = psn_add(psn, 1);
            }
            return false;
        }
        if op::reads(e_op) {
            return true;
        }
        q.una = psn_add(last, 1);
        q.retire_acked(net.hub);
    }
    if q.cur_pkt != 0 {
        // The oldest request is the one being sent (the window stopped it in its middle):
        // the acknowledge is of some of its packets (the caller took PSNs before `q.psn`
        // only), which the window no longer needs to hold. (A READ asked for in parts
        // advances with its responses only.)
        let e = q.sq_ref(q.sq_tail);
        if !op::reads(e.op) && psn_diff(psn, e.first_psn) >= 0 {
            q.una = psn_add(psn, 1);
        }
    }
    false
}

/// Whether packets were sent that the peer has not answered for yet: requests started and
/// not completed, or some of the packets of the request being sent (a message longer than
/// the window stops in its middle until the peer acknowledges part of it).
#[inline(always)]
fn in_flight(q: &QpCore) -> bool {
    q.sq_tail != q.sq_next || q.cur_pkt != 0
}

/// Go back to the oldest unacknowledged PSN and send again from the oldest incomplete
/// request, skipping what of it the peer has.
fn rewind(q: &mut QpCore) {
    let started = q.sq_next != q.sq_tail || q.cur_pkt != 0;
    q.sq_next = q.sq_tail;
    q.psn = q.una;
    q.cur_pkt = 0;
    // An executed local request at the head stands for no packet: start from the next.
    if started && q.sq_tail != q.sq_head && !op::local(q.sq_ref(q.sq_tail).op) {
        let first = q.sq(q.sq_tail).first_psn;
        q.cur_pkt = psn_diff(q.una, first).max(0) as u32;
        q.psn = psn_add(first, q.cur_pkt);
    }
    q.deadline = 0;
}

/// Fails the oldest request with `status` and moves the QP to the error state.
fn fail<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, status: WcStatus) {
    q.retire(status, net.hub);
    q.enter_error(net.hub);
}

/// One retry (a timeout or a sequence NAK): rewinds, or fails the oldest request when the
/// retries are used up (7: unlimited, as rxe counts).
fn retry<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore) {
    if q.attr.retry_cnt != 7 {
        if q.retries == 0 {
            return fail(net, q, WcStatus::RetryExcErr);
        }
        q.retries -= 1;
    }
    rewind(q);
}

/// The retransmission and RNR timers, and a requester held by address resolution.
pub(crate) fn on_timer<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore) {
    if q.state != QpState::Rts {
        return;
    }
    if q.deadline != 0 && net.now >= q.deadline {
        if q.una != q.psn || q.sq_next != q.sq_tail {
            net.t.transport.timeouts += 1;
            q.seq_retry = false;
            retry(net, q);
        } else {
            q.deadline = 0;
        }
    }
    run(net, q);
}

/// A NAK for the request at `psn` (the requests before it acknowledged): RNR (`rnr`, `code` the
/// timer) waits and sends it again; a sequence error goes back to it; the others fail it.
fn nak<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, psn: u32, rnr: bool, code: u8) {
    if rnr {
        net.t.transport.rnr_naks_received += 1;
        if !in_flight(q) {
            return;
        }
        if q.attr.rnr_retry != 7 {
            if q.rnr_retries == 0 {
                return fail(net, q, WcStatus::RnrRetryExcErr);
            }
            q.rnr_retries -= 1;
        }
        q.una = psn;
        rewind(q);
        q.rnr_until = net.now + u64::from(RNR_US[usize::from(code)]).max(1);
        return;
    }
    let status = match code {
        0 => {
            net.t.transport.seq_naks_received += 1;
            if q.seq_retry {
                // A go-back-N retry is under way and nothing was acknowledged since: this
                // NAK is about the same gap (a duplicate, or the responder's answer to the
                // packets sent before the retry). One retry at a time, as rxe: the timer
                // covers a retry that is lost.
                return;
            }
            q.seq_retry = true;
            q.una = psn;
            retry(net, q);
            run(net, q);
            return;
        }
        1 => WcStatus::RemInvReqErr,
        2 => WcStatus::RemAccessErr,
        _ => WcStatus::RemOpErr,
    };
    if !in_flight(q) {
        // The acknowledge completed everything: nothing left to fail.
        return;
    }
    fail(net, q, status)
}

/// An answer from the peer (ACK, NAK, READ response, atomic acknowledge).
pub(crate) fn on_response<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, p: &View<'_>) {
    if q.state != QpState::Rts || q.qp_type != QpType::Rc {
        return;
    }
    let psn = p.psn();
    // Only answers to what was sent and not yet acknowledged count: one older than the
    // oldest unacknowledged PSN answers nothing outstanding, and rxe's completer ignores it
    // (a NAK of the PSN before would move the requester back over acknowledged requests).
    if psn_diff(psn, q.psn) >= 0 || psn_diff(psn, q.una) < 0 {
        return;
    }
    if !in_flight(q) {
        // Nothing sent is waiting for an answer: whatever this is, it answers nothing.
        return;
    }
    let before = (q.una, q.sq_tail);
    let syndrome = p.aeth().map_or(0, |a| a.syndrome);
    match p.opcode() {
        opcode::RC_ACK => match syndrome >> 5 {
            0 => {
                if ack_through(net, q, psn) {
                    retry(net, q);
                }
            }
            kind @ (1 | 3) => {
                // A NAK acknowledges the requests before its PSN: a READ or atomic among them
                // still without its answer lost it, and is asked again from where it stopped
                // (a retry, as for an ACK past it), whatever the NAK says of the later request.
                if ack_through(net, q, psn_add(psn, super::wire::bth::PSN_MASK)) {
                    retry(net, q);
                } else {
                    if (q.una, q.sq_tail) != before {
                        // Progress since the last retry: a new gap may start one.
                        q.seq_retry = false;
                    }
                    return nak(net, q, psn, kind == 1, syndrome & 0x1F);
                }
            }
            _ => {
                return fail(net, q, WcStatus::BadRespErr);
            }
        },
        opcode::RC_READ_RESPONSE_FIRST
        | opcode::RC_READ_RESPONSE_MIDDLE
        | opcode::RC_READ_RESPONSE_LAST
        | opcode::RC_READ_RESPONSE_ONLY => read_response(net, q, p),
        opcode::RC_ATOMIC_ACK => {
            ack_through(net, q, psn_add(psn, super::wire::bth::PSN_MASK));
            if q.sq_tail == q.sq_next || psn != q.una {
                return;
            }
            let e = *q.sq(q.sq_tail);
            if !matches!(e.op, op::CMP_SWAP | op::FETCH_ADD) || e.first_psn != psn {
                return;
            }
            let orig = p.atomic_ack().unwrap_or(0).to_ne_bytes();
            let status = match net.t.mrs.scatter(q.pd, e.sges(), 0, &orig) {
                Ok(()) => WcStatus::Success,
                Err(_) => WcStatus::LocProtErr,
            };
            q.una = psn_add(psn, 1);
            q.retire(status, net.hub);
            if status != WcStatus::Success {
                q.enter_error(net.hub);
                return;
            }
        }
        _ => return,
    }
    if (q.una, q.sq_tail) != before {
        // Progress: the retries start over and the timer restarts.
        q.seq_retry = false;
        q.retries = q.attr.retry_cnt;
        q.rnr_retries = q.attr.rnr_retry;
        q.deadline = if q.una == q.psn {
            0
        } else {
            deadline(net.now, q.timeout_us())
        };
    }
    run(net, q);
}

/// A READ response: its payload scattered, the READ completed with its last. Inlined into
/// [`on_response`]: every packet of a READ's answer comes here.
#[inline(always)]
fn read_response<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, p: &View<'_>) {
    let psn = p.psn();
    ack_through(net, q, psn_add(psn, super::wire::bth::PSN_MASK));
    // (A READ still being asked for in parts is in flight with `sq_next` at it.)
    if !in_flight(q) || psn != q.una {
        // Not the next one expected: a duplicate, or a gap.
        if psn_diff(psn, q.una) > 0 && in_flight(q) {
            net.t.transport.read_gaps += 1;
            if q.sq_ref(q.sq_tail).op == op::READ && net.now >= q.gap_retry_at {
                // A response of the READ at the oldest unacknowledged PSN was lost: it is
                // asked again from there now (a new READ request for the rest), not at the
                // timer (rxe's completer drops the response and waits for its timer: a
                // READ of thousands of packets then costs a timeout per loss). The responder
                // takes the new request as a duplicate and answers from its PSN. At most
                // once per sixteenth of the timeout
                // (and per millisecond): the responses already on the way from before are
                // not new gaps.
                q.gap_retry_at = net.now + (q.timeout_us() / 16).max(1_000);
                rewind(q);
            }
        }
        return;
    }
    let e = q.sq_ref(q.sq_tail);
    if e.op != op::READ {
        return;
    }
    let idx = psn_diff(psn, e.first_psn);
    if idx < 0 || idx as u32 >= e.npkts {
        return;
    }
    let (idx, n, mtu) = (idx as u32, e.npkts, q.mtu);
    // Each part of the READ (`READ_PART`) was asked for as a request of its own: its
    // responses run from a first to a last.
    let want = match (idx % READ_PART == 0, idx + 1 == part_end(idx, n)) {
        (true, true) => opcode::RC_READ_RESPONSE_ONLY,
        (true, false) => opcode::RC_READ_RESPONSE_FIRST,
        (false, true) => opcode::RC_READ_RESPONSE_LAST,
        (false, false) => opcode::RC_READ_RESPONSE_MIDDLE,
    };
    let len = if idx + 1 == n { e.len - idx * mtu } else { mtu };
    if p.opcode() != want || p.payload().len() != len as usize {
        return;
    }
    if net
        .t
        .mrs
        .scatter(q.pd, e.sges(), idx * mtu, p.payload())
        .is_err()
    {
        return fail(net, q, WcStatus::LocProtErr);
    }
    q.una = psn_add(psn, 1);
    if idx + 1 == n {
        q.retire(WcStatus::Success, net.hub);
    }
}
