//! What the responder sends back: ACKs and NAKs, READ responses and atomic acknowledgements,
//! all along the queue pair's path (its address vector and the peer's MAC from ARP, never the
//! addresses of the frame being answered: a spoofer of the peer's IP stays blind, and the
//! device reflects nothing to a MAC of the sender's choosing); and the answers the NIC had no
//! room for, kept in the QP's backlog and sent from the device's progress, with any ACK or
//! NAK of a later request held behind them (an acknowledgement past an outstanding READ tells
//! the requester its responses were lost: it would ask again; an error NAK there would not
//! fail the request it names, and the QP it moved to ERROR answers no retry).
//!
//! The backlog walks the kept READs and atomics by the order they came in (their count), not
//! by PSN: each is answered once per walk (IBTA 9.7.5.1.3), and the walk ends at the newest
//! (`res_next`), whatever PSNs the requests carried. A requester's retry restarts the walk
//! at the request it asks for again only when that comes before where the walk waits
//! (`responder.rs`, `replay`).

use bareverbs_hal::Link;

use super::MAX_RD_ATOMIC;
use super::mem::Denied;
use super::mem::MrTable;
use super::net::{Net, Unsent};
use super::qp_state::QpCore;
use super::seq::{Kind, psn_add, psn_diff, segments_from};
use super::wire::bth::{AETH_LEN, Aeth, Bth, DEFAULT_PKEY, Headers, opcode};
use super::wire::packet::{EXT_MAX, aeth_bytes};
use super::wire::template::Template;
use super::wqe::RdResource;
use crate::verbs::{AccessFlags, QpState};

/// AETH syndromes the responder sends.
pub(super) mod syndrome {
    /// ACK, credits "unlimited" (rxe always sends this).
    pub(crate) const ACK: u8 = 0x1F;
    /// RNR NAK (| the timer code).
    pub(crate) const RNR: u8 = 0x20;
    /// NAK: PSN sequence error.
    pub(crate) const SEQ: u8 = 0x60;
    /// NAK: invalid request.
    pub(crate) const INVALID: u8 = 0x61;
    /// NAK: remote access error.
    pub(crate) const ACCESS: u8 = 0x62;
    /// NAK: remote operational error.
    pub(crate) const OPERATIONAL: u8 = 0x63;
}

/// Answer packets (READ responses, atomic acknowledges) one queue pair sends per turn at
/// most: the rest waits in its backlog, and the other queue pairs have their turn (a READ of
/// 2 GiB is 8 M packets).
pub(crate) const ANSWER_BURST: u32 = 32;

/// The outer headers of the frames to the peer of `q` along its path; `None` while the
/// peer's MAC is being resolved (ARP), or when it cannot be (the requester retries).
#[inline(always)]
fn path<'q, L: Link>(net: &mut Net<'_, L>, q: &'q mut QpCore) -> Option<&'q Template> {
    if !net.path(q).ok()? {
        return None;
    }
    q.hdr.as_ref()
}

/// The BTH of an answer to the peer of `q`: `op` at `psn`.
#[inline(always)]
fn answer_bth(q: &QpCore, op: u8, psn: u32) -> Bth {
    Bth {
        opcode: op,
        se: false,
        pad: 0,
        pkey: DEFAULT_PKEY,
        dest_qp: q.attr.dest_qpn,
        ack_req: false,
        psn,
    }
}

/// The headers of an answer to the peer of `q`: `op` at `psn`, with an AETH of `syn` (the
/// middle READ responses carry none).
fn reply(q: &QpCore, op: u8, psn: u32, syn: Option<u8>) -> Headers {
    let mut h = Headers::new(answer_bth(q, op, psn));
    h.aeth = syn.map(|syndrome| Aeth {
        syndrome,
        msn: q.msn,
    });
    h
}

/// Sends an ACK or NAK (`syn`) for `psn` now; when the NIC has no room (or the peer's MAC
/// is not known yet) it is held ([`hold`]) and sent from the device's progress: a busy NIC
/// delays an acknowledgement, it does not lose it. A newer acknowledgement sent supersedes
/// the one held.
#[inline(always)]
pub(super) fn ack<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, syn: u8, psn: u32) {
    // The QP's outer headers kept (every acknowledgement after the first): sent from here,
    // the making of the path apart ([`ack_path`]), so that this stays a small function.
    let Some(outer) = q.hdr.as_ref() else {
        return ack_path(net, q, syn, psn);
    };
    let aeth = Aeth {
        syndrome: syn,
        msn: q.msn,
    };
    let sent = !matches!(net.send_ack(outer, psn, aeth), Err(Unsent::Busy));
    acked(q, sent, syn, psn);
}

/// [`ack`] of a QP without its outer headers yet: the path made first (or the answer held
/// while the peer's MAC is resolved).
#[cold]
#[inline(never)]
fn ack_path<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, syn: u8, psn: u32) {
    let sent = ack_now(net, q, syn, psn);
    acked(q, sent, syn, psn);
}

/// After an ACK or NAK (`syn`) of `psn` was offered to the NIC: the one held for an earlier
/// PSN superseded when it went, else it is held.
#[inline(always)]
fn acked(q: &mut QpCore, sent: bool, syn: u8, psn: u32) {
    if sent {
        if q.ack_due.is_some_and(|(held, _)| psn_diff(psn, held) >= 0) {
            q.ack_due = None;
        }
    } else {
        hold(q, syn, psn);
    }
}

/// Sends an ACK or NAK (`syn`) for `psn` along the path; whether it went (or was lost on the
/// way out, as on a wire: the peer's retry recovers it).
#[inline(always)]
fn ack_now<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, syn: u8, psn: u32) -> bool {
    let aeth = Aeth {
        syndrome: syn,
        msn: q.msn,
    };
    let Some(outer) = path(net, q) else {
        return false;
    };
    // Built whole at fixed offsets: an acknowledgement has no payload and one layout.
    !matches!(net.send_ack(outer, psn, aeth), Err(Unsent::Busy))
}

/// Keeps the ACK or NAK `syn` of `psn` for later: one is held, the answer to the latest PSN,
/// a NAK before an ACK of the same PSN, the first NAK of a PSN kept (the requester goes back
/// to it either way).
fn hold(q: &mut QpCore, syn: u8, psn: u32) {
    let replaces = match q.ack_due {
        None => true,
        Some((held, held_syn)) => match psn_diff(psn, held) {
            0 => held_syn == syndrome::ACK && syn != syndrome::ACK,
            d => d > 0,
        },
    };
    if replaces {
        q.ack_due = Some((psn, syn));
    }
}

/// Sends the ACK or NAK `syn` for `psn`, unless answers to earlier READs or atomics still wait
/// for room (`q.backlog`): an acknowledgement (or an RNR or sequence NAK, which acknowledges
/// the requests before its PSN) overtaking them would tell the requester they were lost (it
/// retries the READ). It is then held ([`hold`]) and sent once they are out ([`drain`]).
#[inline(always)]
pub(super) fn answer_in_order<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore, syn: u8, psn: u32) {
    if q.backlog.is_none() {
        ack(net, q, syn, psn);
    } else {
        hold(q, syn, psn);
    }
}

/// Sends the responses of `res` from its packet `from` on, within the turn's budget. Returns
/// whether they all went out; otherwise where to go on is left in `q.backlog` for [`drain`].
fn respond_read<L: Link>(
    net: &mut Net<'_, L>,
    q: &mut QpCore,
    outer: &Template,
    res: &RdResource,
    from: u32,
) -> bool {
    // Answers to this device's own address (loopback) reach no NIC, and a NIC that paces
    // itself needs no pace of ours.
    let paced = !net.t.pace.off && q.peer_ip != net.t.port.ip();
    // Bounded by the READ's packets (at most 2^31 / 256) and by the budget of the turn.
    for s in segments_from(Kind::ReadResponse, res.len, q.mtu, from) {
        let psn = psn_add(res.first, s.index);
        if net.answers == 0 {
            q.backlog = Some((res.n, psn));
            return false;
        }
        if paced && !net.t.pace.take(s.len, net.now) {
            net.t.transport.reads_paced += 1;
            q.backlog = Some((res.n, psn));
            return false;
        }
        net.answers -= 1;
        let bth = answer_bth(q, s.opcode, psn);
        let (pd, va) = (q.pd, res.va.wrapping_add(u64::from(s.offset)));
        let fill = move |t: &MrTable, out: &mut [u8]| {
            if out.is_empty() {
                return Ok(());
            }
            let src = t.check(res.rkey, pd, va, out.len() as u64, AccessFlags::REMOTE_READ)?;
            // SAFETY: `check` found the bytes inside a region registered with remote read.
            unsafe { core::ptr::copy(src, out.as_mut_ptr(), out.len()) };
            Ok::<(), Denied>(())
        };
        // At fixed offsets: the middle responses a BTH alone, the others with an AETH.
        let ext = if s.opcode == opcode::RC_READ_RESPONSE_MIDDLE {
            ([0; EXT_MAX], 0)
        } else {
            let aeth = Aeth {
                syndrome: syndrome::ACK,
                msn: q.msn,
            };
            (aeth_bytes(&aeth), AETH_LEN)
        };
        let r = net.send_ext(outer, bth, ext, s.len as usize, fill);
        match r {
            Err(Unsent::Busy) => {
                q.backlog = Some((res.n, psn));
                return false;
            }
            // The region went away: the requester times out and asks again (and is refused).
            Err(Unsent::Denied(_)) => return true,
            _ => {}
        }
    }
    true
}

/// The READ or atomic kept whose PSNs hold `psn`, if any (only requests before the expected
/// PSN: a PSN from another lap of the 24-bit space names none).
pub(super) fn answered(q: &QpCore, psn: u32) -> Option<RdResource> {
    q.res.iter().copied().find(|r| {
        r.kind != 0
            && psn_diff(psn, r.first) >= 0
            && psn_diff(r.last, psn) >= 0
            && psn_diff(q.epsn, r.last) > 0
    })
}

/// The READ or atomic number `n` (counted as they came in), while it is kept.
fn kept(q: &QpCore, n: u32) -> Option<RdResource> {
    // Only the last `MAX_RD_ATOMIC` numbers can be kept (`remember` reuses the oldest slot).
    if q.res_next.wrapping_sub(n) == 0 || q.res_next.wrapping_sub(n) > MAX_RD_ATOMIC {
        return None;
    }
    q.res.iter().copied().find(|r| r.kind != 0 && r.n == n)
}

/// Answers the READ or atomic `r` from its packet `psn` on (a READ's responses, an atomic's
/// acknowledgement), then leaves in `q.backlog` where to go on: the READ or atomic that came
/// in after it, or the rest of `r` when the NIC (or the turn) has no room. Whether all of `r`
/// went out. Nothing is sent while the peer's MAC is unknown (the requester retries).
pub(super) fn answer_from<L: Link>(
    net: &mut Net<'_, L>,
    q: &mut QpCore,
    r: RdResource,
    psn: u32,
) -> bool {
    // A copy: the READ's responses change the QP as they go out.
    let Some(&outer) = path(net, q) else {
        q.backlog = Some((r.n, psn));
        return false;
    };
    q.backlog = None;
    let done = if r.kind == 1 {
        respond_read(net, q, &outer, &r, psn_diff(psn, r.first).max(0) as u32)
    } else {
        atomic_ack(net, q, &outer, r.first, r.orig)
    };
    if done {
        // Answered in full at least once: counted for the limit of requests in flight.
        let after = r.n.wrapping_add(1);
        if (after.wrapping_sub(q.res_sent) as i32) > 0 {
            q.res_sent = after;
        }
        q.backlog = kept(q, after).map(|next| (next.n, next.first));
    } else {
        q.backlog.get_or_insert((r.n, r.first));
    }
    done
}

/// Sends on the answers the NIC had no room for (`q.backlog`): the rest of a READ's
/// responses, then the READs and atomics that came in behind it, in order, until the NIC or
/// the turn is full again; then the acknowledgement held behind them. Called from the
/// device's progress. A QP the responder moved to ERROR (an error NAK held) still sends the
/// answers to the requests it took before the one it refused, then the NAK; any other QP
/// out of RTR and RTS sends nothing more.
pub(crate) fn drain<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore) {
    let live = matches!(q.state, QpState::Rtr | QpState::Rts);
    // The NAK that moved the QP to ERROR still tells the peer why, once there is room.
    let nak = q
        .ack_due
        .filter(|&(_, syn)| q.state == QpState::Err && is_error_nak(syn));
    if !live && nak.is_none() {
        q.backlog = None;
        q.ack_due = None;
        return;
    }
    // Bounded by the kept requests: each turn answers one and moves to the next newer one,
    // and the walk ends at the newest (`kept` refuses numbers outside the last
    // MAX_RD_ATOMIC), so it visits each at most once.
    for _ in 0..=MAX_RD_ATOMIC {
        let Some((n, psn)) = q.backlog else { break };
        let Some(r) = kept(q, n) else {
            q.backlog = None;
            break;
        };
        if !answer_from(net, q, r, psn) {
            return;
        }
    }
    if let Some((psn, syn)) = q.ack_due
        && q.backlog.is_none()
        && ack_now(net, q, syn, psn)
    {
        q.ack_due = None;
    }
}

/// Whether `syn` is a NAK that ends the connection (invalid request, remote access or
/// remote operational error), not a sequence or RNR NAK.
fn is_error_nak(syn: u8) -> bool {
    matches!(
        syn,
        syndrome::INVALID | syndrome::ACCESS | syndrome::OPERATIONAL
    )
}

/// Sends the atomic acknowledge of `psn` with the original value; whether the NIC took it.
fn atomic_ack<L: Link>(
    net: &mut Net<'_, L>,
    q: &QpCore,
    outer: &Template,
    psn: u32,
    orig: u64,
) -> bool {
    if net.answers == 0 {
        return false;
    }
    net.answers -= 1;
    let mut h = reply(q, opcode::RC_ATOMIC_ACK, psn, Some(syndrome::ACK));
    h.atomic_ack = Some(orig);
    !matches!(net.send(outer, &h, 0, |_, _| Ok(())), Err(Unsent::Busy))
}
