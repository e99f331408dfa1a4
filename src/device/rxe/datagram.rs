//! A datagram QP's requester (UD, and the GSI QP): each request one packet to the address
//! it names, completed as it goes out; and a message's payload as both requesters send it,
//! from the request's inline copy or from registered memory.

use bareverbs_hal::Link;

use super::mem::{Denied, MrTable};
use super::net::{Net, Unsent};
use super::qp_state::QpCore;
use super::seq::psn_add;
use super::wire::bth::{Bth, DEFAULT_PKEY, Deth, Headers, opcode};
use super::wire::packet::{Route, Template};
use super::wqe::{SqEntry, op};
use crate::verbs::{AccessFlags, QpType, SendFlags, WcStatus};

/// Packets one call sends at most (bounded work per verbs call).
pub(super) const BURST: u32 = 256;

/// Writes `out.len()` bytes of the message at `offset` into `out`: from the inline copy or
/// from registered memory.
#[inline(always)]
pub(super) fn payload(
    t: &MrTable,
    pd: u32,
    e: &SqEntry,
    offset: u32,
    out: &mut [u8],
) -> Result<(), Denied> {
    if e.is_inline() {
        let from = offset as usize;
        let src = e.inline.get(from..from + out.len()).ok_or(Denied::Bounds)?;
        out.copy_from_slice(src);
        Ok(())
    } else if let ([s], false) = (e.sges(), out.is_empty()) {
        // One entry (the common case): checked and copied directly, not through the list's
        // walk; a range past its end is refused as the walk refuses it.
        let (at, n) = (u64::from(offset), out.len() as u64);
        if at + n > u64::from(s.length) {
            return Err(Denied::Bounds);
        }
        let a = s.addr.checked_add(at).ok_or(Denied::Bounds)?;
        let p = t.check(s.lkey, pd, a, n, AccessFlags::empty())?;
        // SAFETY: `check` found the `n` bytes at `p` inside a registered region (the
        // registration contract keeps it allocated); `out` is `n` bytes.
        unsafe { core::ptr::copy(p, out.as_mut_ptr(), out.len()) };
        Ok(())
    } else {
        t.gather(pd, e.sges(), offset, out)
    }
}

pub(super) fn run_ud<L: Link>(net: &mut Net<'_, L>, q: &mut QpCore) {
    let mut sent = 0;
    // Bounded: each turn retires the oldest request (the queue holds at most MAX_WR), and at
    // most BURST go out.
    while q.sq_tail != q.sq_head && sent < BURST {
        let e = *q.sq(q.sq_tail);
        if e.len > net.mtu {
            // Larger than the port MTU: rxe sends nothing and completes it successfully.
            q.retire(WcStatus::Success, net.hub);
            continue;
        }
        // A group's datagram goes to the group's MAC: nothing to resolve (RFC 1112 §6.4).
        // (An address handle's IPv6 path: the alias of its peer, resolved by neighbour
        // discovery, and its frames made IPv6 on the way out; an alias is never class D.)
        let resolved = if super::wire::igmp::is_multicast(e.ud_ip) {
            Ok(Some(super::wire::igmp::multicast_mac(e.ud_ip)))
        } else {
            net.t.port.resolve_any(net.link, e.ud_ip, net.now)
        };
        let mac = match resolved {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(_) => {
                q.retire(WcStatus::RetryExcErr, net.hub);
                continue;
            }
        };
        let outer = Template::new(
            &Route {
                src_mac: net.t.port.mac(),
                dst_mac: mac,
                src_ip: net.t.port.ip(),
                dst_ip: e.ud_ip,
                tos: e.ud_tos,
                ttl: e.ud_ttl,
                src_port: q.src_port,
            },
            e.ud_qpn,
        );
        let outer = match super::port::alias_path(e.ud_ip) {
            Some(i) => outer.over_path6(i),
            None => outer,
        };
        let imm = e.op == op::SEND_IMM;
        let mut h = Headers::new(Bth {
            opcode: if imm {
                opcode::UD_SEND_ONLY_IMM
            } else {
                opcode::UD_SEND_ONLY
            },
            se: SendFlags::from_bits_truncate(u32::from(e.flags)).contains(SendFlags::SOLICITED),
            pad: 0,
            pkey: DEFAULT_PKEY,
            dest_qp: e.ud_qpn,
            ack_req: false,
            psn: q.psn,
        });
        h.deth = Some(Deth {
            qkey: if q.qp_type == QpType::Gsi {
                super::GSI_QKEY
            } else if e.ud_qkey & 0x8000_0000 != 0 {
                q.attr.qkey
            } else {
                e.ud_qkey
            },
            src_qp: q.qpn,
        });
        if imm {
            h.imm = Some(e.imm);
        }
        let pd = q.pd;
        match net.send(&outer, &h, e.len as usize, |t, out| {
            payload(t, pd, &e, 0, out)
        }) {
            Err(Unsent::Busy) => return,
            Err(Unsent::Denied(_)) => {
                // The request fails and the QP goes to the error state.
                q.retire(WcStatus::LocProtErr, net.hub);
                q.enter_error(net.hub);
                return;
            }
            Ok(()) | Err(Unsent::Lost) => {}
        }
        sent += 1;
        q.psn = psn_add(q.psn, 1);
        q.retire(WcStatus::Success, net.hub);
    }
    q.sq_next = q.sq_tail;
}
