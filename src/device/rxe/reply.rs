//! What the responder sends back: the route and headers of an answer, ACKs and NAKs, READ
//! responses and atomic acknowledgements; and the answers the NIC had no room for, kept in
//! the QP's backlog and sent in PSN order from the device's progress, with any ACK (or RNR or
//! sequence NAK) of a later request held behind them (an acknowledgement past an outstanding
//! READ tells the requester its responses were lost: it would ask again).

use bareverbs_hal::Link;

use super::mem::Denied;
use super::net::{Net, Unsent};
use super::qp_state::QpCore;
use super::seq::{Kind, psn_add, psn_diff, segments};
use super::wire::bth::{Aeth, Bth, DEFAULT_PKEY, Headers, opcode};
use super::wire::packet::{Packet, Route};
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

/// The route back to the sender of `p`.
pub(super) fn reply_route<L: Link>(net: &Net<'_, L>, q: &QpCore, p: &Packet<'_>) -> Route {
    let av = q.attr.av;
    Route {
        src_mac: net.t.port.mac(),
        dst_mac: p.src_mac,
        src_ip: net.t.port.ip(),
        dst_ip: p.ip.src,
        tos: av.map_or(0, |a| a.traffic_class),
        ttl: av.map_or(64, |a| a.hop_limit),
        src_port: q.src_port,
    }
}

/// The headers of an answer to the peer of `q`: `op` at `psn`, with an AETH of `syn` (the
/// middle READ responses carry none).
fn reply(q: &QpCore, op: u8, psn: u32, syn: Option<u8>) -> Headers {
    let mut h = Headers::new(Bth {
        opcode: op,
        se: false,
        pad: 0,
        pkey: DEFAULT_PKEY,
        dest_qp: q.attr.dest_qpn,
        ack_req: false,
        psn,
    });
    h.aeth = syn.map(|syndrome| Aeth {
        syndrome,
        msn: q.msn,
    });
    h
}

/// Sends an ACK or NAK (`syn`) for `psn`.
pub(super) fn ack<L: Link>(net: &mut Net<'_, L>, q: &QpCore, p: &Packet<'_>, syn: u8, psn: u32) {
    let route = reply_route(net, q, p);
    // A lost acknowledge is recovered by the peer's retry.
    let _ = ack_to(net, q, route, syn, psn);
}

/// Sends an ACK or NAK (`syn`) for `psn` along `route`; whether the NIC took it.
fn ack_to<L: Link>(net: &mut Net<'_, L>, q: &QpCore, route: Route, syn: u8, psn: u32) -> bool {
    let h = reply(q, opcode::RC_ACK, psn, Some(syn));
    !matches!(net.send(&route, &h, 0, |_, _| Ok(())), Err(Unsent::Busy))
}

/// Sends the ACK or NAK `syn` for `psn`, unless answers to earlier READs or atomics still wait
/// for room (`q.backlog`): an acknowledgement (or an RNR or sequence NAK, which acknowledges
/// the requests before its PSN) overtaking them would tell the requester they were lost (it
/// retries the READ). It is then held and sent once they are out ([`drain`]); one is held,
/// the answer to the latest PSN, a NAK before an ACK of the same PSN, the first NAK of a PSN
/// kept (the requester goes back to it either way).
pub(super) fn answer_in_order<L: Link>(
    net: &mut Net<'_, L>,
    q: &mut QpCore,
    p: &Packet<'_>,
    syn: u8,
    psn: u32,
) {
    if q.backlog.is_none() {
        return ack(net, q, p, syn, psn);
    }
    let replaces = match q.ack_due {
        None => true,
        Some((held, held_syn, _)) => match psn_diff(psn, held) {
            0 => held_syn == syndrome::ACK && syn != syndrome::ACK,
            d => d > 0,
        },
    };
    if replaces {
        q.ack_due = Some((psn, syn, reply_route(net, q, p)));
    }
}

/// Sends the responses of `res` from its packet `from` on. Returns whether they all went
/// out; when the NIC has no room, where to go on is left in `q.backlog` for [`drain`].
fn respond_read<L: Link>(
    net: &mut Net<'_, L>,
    q: &mut QpCore,
    route: Route,
    res: &RdResource,
    from: u32,
) -> bool {
    for s in segments(Kind::ReadResponse, res.len, q.mtu).skip(from as usize) {
        let syn = (s.opcode != opcode::RC_READ_RESPONSE_MIDDLE).then_some(syndrome::ACK);
        let psn = psn_add(res.first, s.index);
        let h = reply(q, s.opcode, psn, syn);
        let (pd, va) = (q.pd, res.va.wrapping_add(u64::from(s.offset)));
        let r = net.send(&route, &h, s.len as usize, |t, out| {
            if out.is_empty() {
                return Ok(());
            }
            let src = t.check(res.rkey, pd, va, out.len() as u64, AccessFlags::REMOTE_READ)?;
            // SAFETY: `check` found the bytes inside a region registered with remote read.
            unsafe { core::ptr::copy(src, out.as_mut_ptr(), out.len()) };
            Ok::<(), Denied>(())
        });
        match r {
            Err(Unsent::Busy) => {
                q.backlog = Some((psn, route));
                return false;
            }
            // The region went away: the requester times out and asks again (and is refused).
            Err(Unsent::Denied(_)) => return true,
            _ => {}
        }
    }
    true
}

/// The READ or atomic kept whose PSNs hold `psn`, if any.
pub(super) fn answered(q: &QpCore, psn: u32) -> Option<RdResource> {
    q.res
        .iter()
        .copied()
        .find(|r| r.kind != 0 && psn_diff(psn, r.first) >= 0 && psn_diff(r.last, psn) >= 0)
}

/// Answers the READ or atomic `r` from its packet `psn` on (a READ's responses, an atomic's
/// acknowledgement), then leaves in `q.backlog` where to go on: the READs and atomics kept
/// behind it, or the rest of `r` when the NIC has no room. Whether all of `r` went out.
pub(super) fn answer_from<L: Link>(
    net: &mut Net<'_, L>,
    q: &mut QpCore,
    route: Route,
    r: RdResource,
    psn: u32,
) -> bool {
    q.backlog = None;
    let done = if r.kind == 1 {
        respond_read(net, q, route, &r, psn_diff(psn, r.first) as u32)
    } else {
        atomic_ack(net, q, route, r.first, r.orig)
    };
    if done {
        q.backlog = next_after(q, r.last, route);
    } else {
        q.backlog.get_or_insert((r.first, route));
    }
    done
}

/// Sends on the answers the NIC had no room for (`q.backlog`): the rest of a READ's
/// responses, then the READs and atomics that came in behind it, in PSN order, until the NIC
/// is full again; then the acknowledgement held behind them. Called from the device's
/// progress.
pub(crate) fn drain<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore) {
    if !matches!(q.state, QpState::Rtr | QpState::Rts) {
        q.backlog = None;
        q.ack_due = None;
        return;
    }
    while let Some((psn, route)) = q.backlog {
        let Some(r) = answered(q, psn) else {
            q.backlog = None;
            break;
        };
        if !answer_from(net, q, route, r, psn) {
            return;
        }
    }
    if let Some((psn, syn, route)) = q.ack_due
        && ack_to(net, q, route, syn, psn)
    {
        q.ack_due = None;
    }
}

/// The first READ or atomic kept after PSN `last`, as the place to answer from next.
fn next_after(q: &QpCore, last: u32, route: Route) -> Option<(u32, Route)> {
    q.res
        .iter()
        .filter(|n| n.kind != 0 && psn_diff(n.first, last) > 0)
        .min_by_key(|n| psn_diff(n.first, last))
        .map(|n| (n.first, route))
}

/// Sends the atomic acknowledge of `psn` with the original value; whether the NIC took it.
fn atomic_ack<L: Link>(
    net: &mut Net<'_, L>,
    q: &QpCore,
    route: Route,
    psn: u32,
    orig: u64,
) -> bool {
    let mut h = reply(q, opcode::RC_ATOMIC_ACK, psn, Some(syndrome::ACK));
    h.atomic_ack = Some(orig);
    !matches!(net.send(&route, &h, 0, |_, _| Ok(())), Err(Unsent::Busy))
}
