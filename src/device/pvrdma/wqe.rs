//! Posting: send and receive WQEs written straight into their ring slots
//! (`docs/pvrdma.md` §8.5), published with one index store and one doorbell per batch.
//!
//! The credit of a work queue is its ring slots minus the requests not yet completed; it is
//! cached in the QP and recomputed from the poller's completion counter only when it runs out.
//! WQEs are written past the published index, where the device does not look: a batch that is
//! abandoned leaves the ring as it was.

use core::sync::atomic::Ordering;

use bareverbs_hal::{Hal, Mmio};

use super::abi::{self, send_flags, wr, wr_opcode};
use super::qp::Qp;
use super::qptable::QueueCtl;
use super::regs::db;
use super::ring::{Producer, Ring, WqCursor};
use super::srq::Srq;
use super::{Opcodes, Pvrdma};
use crate::error::{Attr, Error, Feature, Op, Param, Queue, Result, Unsupported};
use crate::verbs::{RecvWr, SendFlags, SendWqe, Sge, WrOpcode};

/// A store to one field of a WQE. Plain, not volatile: the slot is past the published
/// index, where the device does not look, until the release store of the index that
/// publishes it (the compiler may merge and order these stores before that).
macro_rules! put {
    ($p:expr, $field:ident, $v:expr) => {
        core::ptr::addr_of_mut!((*$p).$field).write($v)
    };
}

// `write_sges` copies an `Sge` into a WQE's entry byte for byte: the same fields at the same
// offsets, nothing else.
const _: () = {
    use core::mem::offset_of;
    assert!(
        size_of::<Sge>() == size_of::<abi::WqeSge>()
            && offset_of!(Sge, addr) == offset_of!(abi::WqeSge, addr)
            && offset_of!(Sge, length) == offset_of!(abi::WqeSge, length)
            && offset_of!(Sge, lkey) == offset_of!(abi::WqeSge, lkey)
    );
};

/// Writes the SGEs of a WQE at `p`.
///
/// # Safety
///
/// `p` points at the SGE array of a WQE whose stride holds `sges.len()` entries.
#[inline(always)]
unsafe fn write_sges(p: *mut u8, sges: &[Sge]) {
    let e = p.cast::<abi::WqeSge>();
    for (i, s) in sges.iter().enumerate() {
        // SAFETY: the caller's contract: room for every entry; an `Sge` and an
        // `abi::WqeSge` have the same fields at the same offsets (asserted above): the entry
        // is a copy of the bytes (one 16-byte copy where the compiler can).
        unsafe {
            core::ptr::copy_nonoverlapping(
                core::ptr::from_ref(s).cast::<u8>(),
                e.add(i).cast::<u8>(),
                size_of::<abi::WqeSge>(),
            )
        };
    }
}

/// Recomputes where a work queue (`p`, written by the batch `c`) is full from the completions
/// taken (`done`); `false` when it is full. Inline, without a call: a call on the posting
/// path, even a rare one, makes every post save and restore registers around it.
#[inline(always)]
fn refill(p: &mut Producer, c: &mut WqCursor, done: u32) -> bool {
    c.limit = done.wrapping_add(c.mask + 1);
    p.credit = c.limit;
    c.tail != c.limit
}

/// The refill of a metered work queue `q` (`p`, written by the batch `c`; `done` its
/// completions taken): the next request takes one entry of CQ room, so that the CQ never gets
/// more CQEs than it holds (QEMU drops those silently), and the limit moves past it; `false`
/// when the ring or the CQ is full, or there is no ring (a QP on an SRQ). Exactly one
/// request's room at a time: a queue never holds room it does not use, so it keeps none from
/// the CQ's other queues. Inline, without a call (see `refill`).
#[inline(always)]
fn meter(p: &mut Producer, c: &mut WqCursor, done: u32) -> bool {
    if c.tail == done.wrapping_add(c.mask + 1) {
        return false;
    }
    let Some(room) = p.room else {
        return false;
    };
    // SAFETY: the CQ outlives the QP whose queue names it (the provider contract of
    // create_qp).
    let r = unsafe { room.as_ref() };
    // Taken, then given back if there was none (a concurrent reservation that reads the
    // overshoot fails, as it would a moment later anyway).
    if r.fetch_sub(1, Ordering::AcqRel) < 1 {
        r.fetch_add(1, Ordering::AcqRel);
        return false;
    }
    c.limit = c.tail.wrapping_add(1);
    p.credit = c.limit;
    true
}

/// Why a post is refused.
#[derive(Clone, Copy)]
enum Refusal {
    Full(Queue),
    /// More SGEs (the count) than the queue's maximum.
    Sges(usize, u32),
    Feature(Feature),
    NoUdDest,
    UnboundGid,
    /// A READ on a QP whose initiator depth is 0.
    NoDepth,
}

/// The error of a refused post, built out of line from one function: every refusal of a post
/// is then one call from the post's code, which keeps its stack frame off the common path.
#[cold]
fn refuse(why: Refusal) -> Error {
    let missing = |attr| Error::MissingAttribute {
        op: Op::PostSend,
        attr,
    };
    match why {
        Refusal::Full(queue) => Error::QueueFull { queue, free: 0 },
        Refusal::Sges(n, max) => Error::invalid(Param::NumSge, n as u64, max),
        Refusal::Feature(f) => Error::Unsupported(Unsupported::Feature(f)),
        Refusal::NoUdDest => missing(Attr::UdDest),
        Refusal::UnboundGid => missing(Attr::SourceGid),
        Refusal::NoDepth => missing(Attr::InitiatorDepth),
    }
}

impl<H: Hal> Pvrdma<H> {
    /// The send queue's credit recomputed (`refill`), or a metered queue's room taken
    /// ([`meter`]); `false` when it is full.
    #[inline(always)]
    fn sq_refill(&self, qp: &mut Qp<H>, c: &mut WqCursor) -> bool {
        let done = qp.ctl.ctl().sq.ctl.done.load(Ordering::Acquire);
        if qp.sq_prod.metered {
            return meter(&mut qp.sq_prod, c, done);
        }
        refill(&mut qp.sq_prod, c, done)
    }

    /// The receive queue's credit recomputed (`refill`), or a metered queue's room taken
    /// ([`meter`]); `false` when it is full. Receives of a QP with an SRQ go to the SRQ (the
    /// queue has no slots, so no credit, and no room: `meter` refuses them): QEMU would read
    /// past its allocation (§12.3).
    #[inline(always)]
    fn rq_refill(&self, qp: &mut Qp<H>, c: &mut WqCursor) -> bool {
        let done = qp.ctl.ctl().rq.ctl.done.load(Ordering::Acquire);
        if qp.rq_prod.metered {
            return meter(&mut qp.rq_prod, c, done);
        }
        refill(&mut qp.rq_prod, c, done)
    }

    /// The send queue's credit recomputed, taking no CQ room (a request about to be refused):
    /// `false` when it is full or metered.
    #[inline(always)]
    fn sq_credit(&self, qp: &mut Qp<H>, c: &mut WqCursor) -> bool {
        let done = qp.ctl.ctl().sq.ctl.done.load(Ordering::Acquire);
        !qp.sq_prod.metered && refill(&mut qp.sq_prod, c, done)
    }

    /// As [`sq_credit`](Self::sq_credit), for the receive queue.
    #[inline(always)]
    fn rq_credit(&self, qp: &mut Qp<H>, c: &mut WqCursor) -> bool {
        let done = qp.ctl.ctl().rq.ctl.done.load(Ordering::Acquire);
        !qp.rq_prod.metered && refill(&mut qp.rq_prod, c, done)
    }

    /// The refusal of request `tail` of a work queue (`recv`: the receive queue) whose credit
    /// ran out, with `nsge` SGEs: the ring is full (or absent), or, for a metered queue, the CQ
    /// is; else the SGE count, when it is more than the queue's maximum.
    #[cold]
    #[inline(never)]
    fn full(&self, qp: &Qp<H>, tail: u32, mask: u32, recv: bool, nsge: usize) -> Error {
        let max = if recv { qp.rq.sge } else { qp.sq.sge };
        let queue = if recv { Queue::Recv } else { Queue::Send };
        let ctl = qp.ctl.ctl();
        let (q, p) = if recv {
            (&ctl.rq, &qp.rq_prod)
        } else {
            (&ctl.sq, &qp.sq_prod)
        };
        let done = q.ctl.done.load(Ordering::Acquire);
        if !p.metered || q.room.is_none() || tail == done.wrapping_add(mask + 1) {
            return refuse(Refusal::Full(queue));
        }
        let free = qp.cq(recv).free();
        if free == 0 || nsge <= max as usize {
            return Error::QueueFull {
                queue: Queue::Cq,
                free,
            };
        }
        refuse(Refusal::Sges(nsge, max))
    }

    /// Starts a batch on the send queue.
    #[inline(always)]
    pub(crate) fn sq_start(&self, qp: &Qp<H>) -> WqCursor {
        WqCursor::new(&qp.sq_prod, &qp.sq_ring, qp.sq.sge)
    }

    /// Writes one send WQE at the batch's next slot (not yet published).
    ///
    /// # Safety
    ///
    /// The buffers named stay valid until the request completes (the provider contract).
    #[inline(always)]
    pub(crate) unsafe fn sq_write(
        &self,
        qp: &mut Qp<H>,
        c: &mut WqCursor,
        w: &SendWqe<'_, super::Ah>,
    ) -> Result<()> {
        // As in `rq_write`: the SGE count first, refused as if the credit were checked first,
        // one call site for the refusals that look at the queue.
        let nsge = w.sges.len();
        let over = nsge > c.max_sge as usize;
        if over || c.tail == c.limit {
            let ok = if over {
                if c.tail != c.limit || self.sq_credit(qp, c) {
                    return Err(refuse(Refusal::Sges(nsge, c.max_sge)));
                }
                false
            } else {
                self.sq_refill(qp, c)
            };
            if !ok {
                return Err(self.full(qp, c.tail, c.mask, false, nsge));
            }
        }
        if w.flags.contains(SendFlags::INLINE) {
            // PVRDMA has no inline data (L-QP forces max_inline_data to 0).
            return Err(refuse(Refusal::Feature(Feature::InlineData)));
        }
        let (code, faithful) = match w.op {
            WrOpcode::Send => (wr_opcode::SEND, true),
            WrOpcode::SendWithImm => (wr_opcode::SEND_WITH_IMM, false),
            WrOpcode::RdmaWrite => (wr_opcode::RDMA_WRITE, false),
            WrOpcode::RdmaWriteWithImm => (wr_opcode::RDMA_WRITE_WITH_IMM, false),
            // The depth the QP has (as applied at RTS: QEMU's 1 when it reports none): a READ
            // on a depth-0 QP would never be answered.
            WrOpcode::RdmaRead if qp.max_rd_atomic == 0 => return Err(refuse(Refusal::NoDepth)),
            WrOpcode::RdmaRead => (wr_opcode::RDMA_READ, false),
            // The device advertises no atomics (QEMU: atomic_ops = 0).
            WrOpcode::AtomicCmpSwap | WrOpcode::AtomicFetchAdd => {
                return Err(refuse(Refusal::Feature(Feature::Atomics)));
            }
        };
        if !faithful && self.opcodes == Opcodes::SendOnly {
            // QEMU runs every send WQE as a plain SEND (§8.6): refuse what it would fake.
            return Err(refuse(Refusal::Feature(Feature::NotExecutedByDevice)));
        }
        let ud = match (qp.datagram, &w.ud) {
            (true, None) => return Err(refuse(Refusal::NoUdDest)),
            (false, Some(_)) => return Err(refuse(Refusal::Feature(Feature::OpcodeForQpType))),
            (true, Some(_)) if code != wr_opcode::SEND && code != wr_opcode::SEND_WITH_IMM => {
                return Err(refuse(Refusal::Feature(Feature::OpcodeForQpType)));
            }
            (_, ud) => ud,
        };
        // The source GID the WQE names (byte 0x41) must be bound now: QEMU loops forever on
        // one it cannot map (§8.6). A binding dropped after RTR, or an address handle made
        // before an unbind, is refused here.
        // The QP's own GID (connected sends) is looked at once per batch: a batch's first
        // request is published at `finish` like its last, so a check per request would guard
        // no window the first one's does not.
        let bound = match ud {
            Some(ud) => self.gid_in_use((ud.ah.words[5] >> 8) as u8),
            None => c.gid_ok || self.gid_in_use(qp.sgid_index),
        };
        if !bound {
            return Err(refuse(Refusal::UnboundGid));
        }
        c.gid_ok |= ud.is_none();
        let h = c.slot().cast::<abi::SqWqeHdr>();
        c.record(w.wr_id, w.tag);
        // Every send WQE completes on PVRDMA (QEMU ignores the flag): saying so keeps the
        // driver's completion count exact.
        let mut flags = send_flags::SIGNALED;
        if w.flags.contains(SendFlags::FENCE) {
            flags |= send_flags::FENCE;
        }
        if w.flags.contains(SendFlags::SOLICITED) {
            flags |= send_flags::SOLICITED;
        }
        // SAFETY: `h` is this slot's WQE, inside the ring and not published; the stride holds
        // the header and max_send_sge SGEs, and the count was checked above.
        unsafe {
            put!(h, wr_id, w.wr_id);
            put!(h, num_sge, nsge as u32);
            put!(h, opcode, code);
            put!(h, send_flags, flags);
            put!(h, ex, w.imm);
            let words = core::ptr::addr_of_mut!((*h).wr).cast::<u32>();
            // QEMU reads the source GID index at byte 0x41 for every QP type (§8.6).
            let mut gid_word = u32::from(qp.sgid_index) << 8;
            if let Some(ud) = ud {
                let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
                    qp.qkey
                } else {
                    ud.remote_qkey
                };
                words.add(wr::UD_REMOTE_QPN).write(ud.remote_qpn);
                words.add(wr::UD_REMOTE_QKEY).write(qkey);
                let av = &ud.ah.words;
                words.add(wr::AV_PORT_PD).write(qp.pd_handle | (1 << 24));
                words.add(wr::AV_SL_TCLASS_FLOW).write(av[0]);
                for (i, &g) in av[1..5].iter().enumerate() {
                    words.add(wr::AV_DGID + i).write(g);
                }
                gid_word = av[5];
            } else if code != wr_opcode::SEND && code != wr_opcode::SEND_WITH_IMM {
                words
                    .add(wr::REMOTE_ADDR)
                    .cast::<u64>()
                    .write_unaligned(w.remote_addr);
                words.add(wr::RDMA_RKEY).write(w.rkey);
            }
            words.add(wr::AV_GID_WORD).write(gid_word);
            write_sges(h.cast::<u8>().add(size_of::<abi::SqWqeHdr>()), w.sges);
        }
        c.tail = c.tail.wrapping_add(1);
        Ok(())
    }

    /// Publishes the send WQEs the batch `c` wrote, with one doorbell.
    #[inline(always)]
    pub(crate) fn sq_commit(&self, qp: &mut Qp<H>, c: &WqCursor) {
        let ctl = &qp.ctl.ctl().sq.ctl;
        self.commit(&mut qp.sq_prod, &qp.sq_ring, ctl, c);
    }

    /// Publishes what the batch `c` wrote on `ring` (`p`'s queue), tells the poller (`ctl`),
    /// and rings the QP doorbell.
    #[inline(always)]
    fn commit(&self, p: &mut Producer, ring: &Ring, ctl: &QueueCtl, c: &WqCursor) {
        let tail = c.tail;
        if tail == c.start {
            return;
        }
        p.tail = tail;
        ctl.tail.store(tail, Ordering::Release);
        ring.publish(tail);
        self.hal.publish_barrier();
        self.uar.write32(db::QP, p.bell);
    }

    /// Starts a batch on the receive queue.
    #[inline(always)]
    pub(crate) fn rq_start(&self, qp: &Qp<H>) -> WqCursor {
        WqCursor::new(&qp.rq_prod, &qp.rq_ring, qp.rq.sge)
    }

    /// Writes one receive WQE at the batch's next slot (not yet published).
    ///
    /// # Safety
    ///
    /// As [`sq_write`](Self::sq_write).
    #[inline(always)]
    pub(crate) unsafe fn rq_write(
        &self,
        qp: &mut Qp<H>,
        c: &mut WqCursor,
        wr_id: u64,
        sges: &[Sge],
        tag: u32,
    ) -> Result<()> {
        // The SGE count first (its limit is then no longer needed, which leaves a register
        // for the refill), the refusal as if the credit were checked first.
        // One call site for both refusals that look at the queue (`full`): its arguments are
        // then made only where it is called.
        let nsge = sges.len();
        let over = nsge > c.max_sge as usize;
        if over || c.tail == c.limit {
            let ok = if over {
                if c.tail != c.limit || self.rq_credit(qp, c) {
                    return Err(refuse(Refusal::Sges(nsge, c.max_sge)));
                }
                false
            } else {
                self.rq_refill(qp, c)
            };
            if !ok {
                return Err(self.full(qp, c.tail, c.mask, true, nsge));
            }
        }
        let h = c.slot().cast::<abi::RqWqeHdr>();
        c.record(wr_id, tag);
        // SAFETY: this slot's WQE, not yet published; the stride holds the header and
        // max_recv_sge SGEs, the count was checked above.
        unsafe {
            put!(h, wr_id, wr_id);
            put!(h, num_sge, sges.len() as u32);
            write_sges(h.cast::<u8>().add(size_of::<abi::RqWqeHdr>()), sges);
        }
        c.tail = c.tail.wrapping_add(1);
        Ok(())
    }

    /// Publishes the receive WQEs the batch `c` wrote, with one doorbell.
    #[inline(always)]
    pub(crate) fn rq_commit(&self, qp: &mut Qp<H>, c: &WqCursor) {
        let ctl = &qp.ctl.ctl().rq.ctl;
        self.commit(&mut qp.rq_prod, &qp.rq_ring, ctl, c);
    }

    /// Posts receive work requests to a shared receive queue, all or none, one doorbell.
    ///
    /// # Safety
    ///
    /// As [`sq_write`](Self::sq_write).
    pub(crate) unsafe fn srq_post(&self, srq: &Srq<H>, wrs: &[RecvWr<'_>]) -> Result<()> {
        let op = Op::PostRecv;
        if let Some(w) = wrs
            .iter()
            .find(|w| w.sg_list.len() > srq.layout.sge as usize)
        {
            return Err(refuse(Refusal::Sges(w.sg_list.len(), srq.layout.sge)));
        }
        let _guard = srq.lock.try_lock().ok_or(Error::Busy { op })?;
        let ring = srq.ring;
        let tail0 = srq.counters.tail.load(Ordering::Relaxed);
        // Receives completed through any QP give the SRQ its credit back: never more
        // outstanding than the ring (and the CQ reservations) hold.
        let done = srq.counters.done.load(Ordering::Acquire);
        let used = tail0.wrapping_sub(done);
        if used > ring.slots() {
            return Err(Error::bad_value(op, &"SRQ completions", u64::from(done)));
        }
        let free = ring.slots() - used;
        if wrs.len() as u32 > free {
            return Err(Error::QueueFull {
                queue: Queue::Srq,
                free,
            });
        }
        // Where the SRQ's depth did not fit a receive CQ, each receive takes its room there
        // now, on every such CQ (`srq_meter.rs`): all or none.
        srq.counters.charge(wrs.len() as u32)?;
        let mut n = tail0;
        for w in wrs {
            let h = ring.slot(n).cast::<abi::RqWqeHdr>();
            srq.counters.post(w.wr_id);
            // SAFETY: this slot's WQE, not yet published; SGE counts checked above.
            unsafe {
                put!(h, wr_id, w.wr_id);
                put!(h, num_sge, w.sg_list.len() as u32);
                write_sges(h.cast::<u8>().add(size_of::<abi::RqWqeHdr>()), w.sg_list);
            }
            n = n.wrapping_add(1);
        }
        if n != tail0 {
            ring.publish(n);
            srq.counters.tail.store(n, Ordering::Release);
            self.hal.publish_barrier();
            self.uar.write32(db::SRQ, srq.handle() | db::SRQ_RECV);
        }
        Ok(())
    }
}
