//! Posting: send and receive requests written into a queue pair's rings by a batch, made
//! visible at its commit, which runs the requester (the "doorbell" of the software device).

use bareverbs_hal::{Clock, Hal, Link};

use super::mem::sge_bytes;
use super::qp::Qp;
use super::qp_lock::QpGuard;
use super::qp_state::QpCore;
use super::wqe::{op, wr_op};
use super::{Rxe, requester};
use crate::error::{Attr, Error, Feature, Op, Param, Queue, Result, Unsupported};
use crate::verbs::{QpState, QpType, SendFlags, SendWqe, Sge};

/// A batch's copy of a queue's posting state: where it starts and how many it wrote.
#[derive(Clone, Copy, Debug)]
pub struct Cursor {
    pub(super) start: u32,
    pub(super) n: u32,
}

/// Takes the completion-queue room of one request written by the batch `c` (the QP's lock
/// held); `pending` counts the room of requests written and not yet published. A new batch
/// first gives back what a batch dropped unfinished had taken.
#[inline(always)]
pub(super) fn take_room(q: &mut QpCore, send: bool, c: &Cursor) -> Result<()> {
    let mut pending = if send { q.sq_pending } else { q.rq_pending };
    let cq = if send { q.send_cq() } else { q.recv_cq() };
    if c.n == 0 && pending != 0 {
        cq.give(core::mem::take(&mut pending));
    }
    let taken = cq.take(1);
    pending += u32::from(taken);
    if send {
        q.sq_pending = pending;
    } else {
        q.rq_pending = pending;
    }
    if taken {
        Ok(())
    } else {
        Err(Error::QueueFull {
            queue: Queue::Cq,
            free: if send { q.send_cq() } else { q.recv_cq() }.free(),
        })
    }
}

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    /// Frees the room a shared receive queue gave up on `cq` as far as its requests allow,
    /// when the device lock is free now (settling is the device lock's; a post only tries it,
    /// holding its QP's lock: never waiting on the device lock under it).
    pub(super) fn settle(&self, cq: &super::cq::CqRing) {
        if let Some(_device) = self.core.try_lock() {
            cq.settle();
        }
    }

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
        let ud = matches!(qp.qp_type, QpType::Ud | QpType::Gsi);
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
        // One entry (the common case) read directly: the sum over the list is a call.
        let len = match w.sges {
            [s] => u64::from(s.length),
            sges => sge_bytes(sges),
        };
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
        // The QP's own lock only: a post never waits for the NIC or another QP.
        // SAFETY: the QP is alive (`qp` is borrowed); no other QP lock is held.
        let mut guard = unsafe { QpGuard::lock(qp.core) };
        let q = &mut *guard;
        if op::reads(op_code) && q.attr.max_rd_atomic == 0 {
            // Initiator depth 0: the READ or atomic would stall, or be NAKed at the peer.
            return Err(Error::MissingAttribute {
                op: Op::PostSend,
                attr: Attr::InitiatorDepth,
            });
        }
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
        // Written in place, field by field: the entry is 200 bytes (its inline data 64), and
        // building it on the stack to copy it in cost about 400 instructions at opt-level "z".
        let e = q.sq(c.start.wrapping_add(c.n));
        e.wr_id = w.wr_id;
        e.remote_addr = w.remote_addr;
        e.compare_add = w.compare_add;
        e.swap = w.swap;
        e.len = len as u32;
        e.rkey = w.rkey;
        e.imm = w.imm;
        e.tag = w.tag;
        e.first_psn = 0;
        e.npkts = 0;
        e.op = op_code;
        e.flags = w.flags.bits() as u8;
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
            e.nsge = 0;
        } else {
            match (w.sges, e.sges.first_mut()) {
                // One entry stored as one (a slice copy is a `memcpy` call).
                ([s], Some(d)) => *d = *s,
                (sges, _) => e.sges[..sges.len()].copy_from_slice(sges),
            }
            e.nsge = w.sges.len() as u8;
            e.inline_len = 0xFF;
        }
        // A datagram's destination (a datagram QP's requests only, checked above: a connected
        // QP's requester never reads these fields).
        if let Some(u) = w.ud {
            (e.ud_qpn, e.ud_qkey, e.ud_ip, e.ud_tos, e.ud_ttl) =
                (u.remote_qpn, u.remote_qkey, u.ah.ip, u.ah.tos, u.ah.ttl);
        }
        c.n += 1;
        Ok(())
    }

    pub(crate) fn sq_commit_impl(&self, qp: &mut Qp<H>, c: &Cursor, flushed: bool) {
        qp.sq_head = c.start.wrapping_add(c.n);
        // The device's lock first, when it is free (the lock order: the device's, then the
        // QP's): the frames go out now, under the one QP lock that publishes the requests. If
        // another thread has it (a progress, a post on another QP), the next progress sends
        // them.
        // Not even tried when the progress is another core's (`set_progress_only`).
        let mut core = if self.progress_only() {
            None
        } else {
            self.core.try_lock()
        };
        // SAFETY: as in `sq_write_impl`; the device lock, when held, was taken before it.
        let mut q = unsafe { QpGuard::lock(qp.core) };
        q.sq_head = qp.sq_head;
        q.sq_pending = 0;
        if flushed || q.state == QpState::Err {
            drop(q);
            drop(core);
            return self.flush_locked(qp);
        }
        if let Some(core) = core.as_deref_mut() {
            let now = self.now();
            requester::run(&mut self.net(core, now), &mut q);
        }
        // In the busy set while its lock is held: a progress that visits it after this sees
        // the new requests (it leaves the set only under this lock, with none left).
        self.note(&q);
    }

    /// Flushes every request of the QP (an error state, or a batch that asked it): the
    /// completions are the device lock's to add (one producer per CQ), taken before the QP's.
    fn flush_locked(&self, qp: &Qp<H>) {
        let _device = self.lock();
        // SAFETY: the QP is alive (`qp` is borrowed); the device lock is held, no QP lock.
        unsafe { QpGuard::lock(qp.core) }.flush(self.hub());
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
        // SAFETY: as in `sq_write_impl`.
        let mut guard = unsafe { QpGuard::lock(qp.core) };
        let q = &mut *guard;
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
        if take_room(q, false, c).is_err() {
            self.settle(q.recv_cq());
            take_room(q, false, c)?;
        }
        // Written in place, as the send entries are (an 80-byte entry not built and copied).
        let e = q.rq(c.start.wrapping_add(c.n));
        e.wr_id = wr_id;
        e.tag = tag;
        e.nsge = sges.len() as u16;
        e.srq_room = false;
        e.sges[..sges.len()].copy_from_slice(sges);
        c.n += 1;
        Ok(())
    }

    pub(crate) fn rq_commit_impl(&self, qp: &mut Qp<H>, c: &Cursor, flushed: bool) {
        qp.rq_head = c.start.wrapping_add(c.n);
        let flush = {
            // SAFETY: as in `sq_write_impl`.
            let mut q = unsafe { QpGuard::lock(qp.core) };
            q.rq_head = qp.rq_head;
            q.rq_pending = 0;
            flushed || q.state == QpState::Err
        };
        if flush {
            self.flush_locked(qp);
        }
    }
}
