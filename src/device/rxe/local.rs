//! The requester's local work requests — memory-window binds, fast registrations, local
//! invalidations — executed on the region table when the requester reaches them in the send
//! queue and every request before them has completed (nothing goes on the wire); and the
//! SEND with invalidate's last opcode.

use super::keys::{Bind, Reg};
use super::mem::MrTable;
use super::qp_state::QpCore;
use super::seq::psn_add;
use super::wire::bth::{PSN_MASK, opcode};
use super::wqe::op;
use crate::verbs::{AccessFlags, MwType, WcStatus};

/// Executes the local request at `i` (once: a rewind walks it again without effect); the
/// error status when the table refuses it.
pub(crate) fn execute(t: &mut MrTable, q: &mut QpCore, i: u32) -> Result<(), WcStatus> {
    let (pd, qpn, psn) = (q.pd, q.qpn, q.psn);
    let e = q.sq_ref(i);
    if e.npkts != 0 {
        return Ok(());
    }
    let access = AccessFlags::from_bits_truncate(e.swap as u32);
    let ok = match e.op {
        op::BIND_MW => {
            let b = Bind {
                mw: e.rkey,
                kind: if e.swap >> 32 & 1 == 1 {
                    MwType::Type2
                } else {
                    MwType::Type1
                },
                new_rkey: e.imm,
                mr_lkey: e.sges[0].lkey,
                addr: e.remote_addr,
                length: e.compare_add,
                access,
            };
            t.bind(pd, qpn, &b).then_some(()).ok_or(WcStatus::MwBindErr)
        }
        op::REG_MR => {
            let r = Reg {
                mr: e.rkey,
                new_key: e.imm,
                sge: e.sges[0],
                iova: e.remote_addr,
                access,
            };
            let ok = t.register_fast(pd, &r);
            ok.then_some(()).ok_or(WcStatus::LocQpOpErr)
        }
        _ => t
            .invalidate(e.rkey, pd, None)
            .map_err(|_| WcStatus::LocQpOpErr),
    };
    ok?;
    // Marked executed (a rewind walks it again without effect); it stands for the PSN
    // before it, should an acknowledgement ever find it.
    let s = q.sq(i);
    s.npkts = 1;
    s.first_psn = psn_add(psn, PSN_MASK);
    Ok(())
}

/// The opcode of a SEND with invalidate's last packet, for the plain SEND's `op` (LAST or
/// ONLY; others unchanged).
pub(crate) fn with_inv(op: u8) -> u8 {
    match op {
        opcode::RC_SEND_LAST => opcode::RC_SEND_LAST_INV,
        opcode::RC_SEND_ONLY => opcode::RC_SEND_ONLY_INV,
        other => other,
    }
}
