//! Posting the work requests on keys — memory-window binds, fast registrations, local
//! invalidations and SENDs with invalidate — into a queue pair's send ring, in order with
//! the others (the requester executes the local ones when it reaches them: `local.rs`).

use bareverbs_hal::{Clock, Hal, Link};

use super::Rxe;
use super::mem::sge_bytes;
use super::post::{Cursor, take_room};
use super::qp::Qp;
use super::qp_lock::QpGuard;
use super::wqe::op;
use crate::error::{Error, Feature, Param, Queue, Result, Unsupported};
use crate::verbs::{ExtOp, ExtWqe, MwType, QpType, SendFlags, Sge};

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    pub(crate) fn sq_write_ext_impl(
        &self,
        qp: &mut Qp<H>,
        c: &mut Cursor,
        w: &ExtWqe<'_>,
    ) -> Result<()> {
        let not_for_qp = Error::Unsupported(Unsupported::Feature(Feature::OpcodeForQpType));
        match qp.qp_type {
            QpType::Rc => {}
            // SEND with invalidate exists for RC only (IBA opcodes 0x16, 0x17).
            QpType::Uc if !matches!(w.op, ExtOp::SendWithInv { .. }) => {}
            _ => return Err(not_for_qp),
        }
        if w.flags.contains(SendFlags::INLINE) {
            return Err(Error::Unsupported(Unsupported::Feature(
                Feature::InlineData,
            )));
        }
        let mut len = 0;
        if let ExtOp::SendWithInv { sges, .. } = w.op {
            if sges.len() > qp.caps.max_send_sge as usize {
                let n = sges.len() as u64;
                return Err(Error::invalid(Param::NumSge, n, qp.caps.max_send_sge));
            }
            len = sge_bytes(sges);
            if len > 1 << 31 {
                return Err(Error::invalid(Param::BufferRange, len, 1u64 << 31));
            }
        }
        // SAFETY: the QP is alive (`qp` is borrowed); no other QP lock is held.
        let mut guard = unsafe { QpGuard::lock(qp.core) };
        let q = &mut *guard;
        let used = c.start.wrapping_add(c.n).wrapping_sub(q.sq_tail);
        if used >= q.sq_cap {
            return Err(Error::QueueFull {
                queue: Queue::Send,
                free: q.sq_cap.saturating_sub(c.start.wrapping_sub(q.sq_tail)),
            });
        }
        if take_room(q, true, c).is_err() {
            self.settle(q.send_cq());
            take_room(q, true, c)?;
        }
        let e = q.sq(c.start.wrapping_add(c.n));
        e.wr_id = w.wr_id;
        e.flags = w.flags.bits() as u8;
        e.tag = 0;
        e.first_psn = 0;
        // 0: not executed yet (a local request), set when the requester executes it.
        e.npkts = 0;
        e.len = 0;
        e.nsge = 0;
        e.inline_len = 0xFF;
        (e.remote_addr, e.compare_add, e.swap, e.imm) = (0, 0, 0, 0);
        match w.op {
            ExtOp::BindMw {
                mw,
                kind,
                new_rkey,
                mr_lkey,
                addr,
                length,
                access,
            } => {
                e.op = op::BIND_MW;
                (e.rkey, e.imm, e.remote_addr, e.compare_add) = (mw, new_rkey, addr, length);
                e.swap = u64::from(access.bits()) | u64::from(kind == MwType::Type2) << 32;
                e.sges[0] = Sge {
                    addr,
                    length: 0,
                    lkey: mr_lkey,
                };
            }
            ExtOp::RegMr {
                mr,
                new_key,
                sge,
                iova,
                access,
            } => {
                e.op = op::REG_MR;
                (e.rkey, e.imm, e.remote_addr) = (mr, new_key, iova);
                e.swap = u64::from(access.bits());
                e.sges[0] = sge;
            }
            ExtOp::LocalInv { key } => {
                e.op = op::LOCAL_INV;
                e.rkey = key;
            }
            ExtOp::SendWithInv { rkey, sges } => {
                e.op = op::SEND_INV;
                e.rkey = rkey;
                e.len = len as u32;
                e.sges[..sges.len()].copy_from_slice(sges);
                e.nsge = sges.len() as u8;
            }
        }
        c.n += 1;
        Ok(())
    }
}
