//! Completion queues: the object (its ring of 64-byte CQEs, `docs/pvrdma.md` §10, and
//! the CQ capacity the QPs completing to it reserve), its poll lock and the locks a QP change
//! takes on its CQs, CREATE_CQ and DESTROY_CQ. Polling the ring is `poll.rs`'s (and the
//! cursor's, `cursor.rs`).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use bareverbs_hal::{Hal, Mmio};

use super::abi::{self, wc_opcode};
use super::pdir::QueueMem;
use super::qptable::QpCtl;
use super::regs::db;
use super::ring::Ring;
use super::{CQES_PER_PAGE, Pvrdma};
use crate::error::{Error, Holder, Object, Op, Queue, Resource, Result};
use crate::events::{Arm, ChannelId, Slot};
use crate::verbs::WcOpcode;

/// A completion queue on a PVRDMA device.
pub struct Cq<H: Hal> {
    pub(crate) handle: u32,
    pub(crate) entries: u32,
    pub(crate) ring: Ring,
    pub(crate) mem: QueueMem<H>,
    pub(crate) poll: spin::Mutex<PollState>,
    /// Room left: the entries minus the CQEs reserved by the work queues that complete here
    /// (their depth, or one per request of a metered queue) and by SRQs; below 0 only for a
    /// QP kept for good (`reserve_forever`). Counted down, so that a post takes one entry with
    /// one locked decrement whose flags say whether there was room.
    pub(crate) room: AtomicI32,
    /// Work queues attached here with requests left to flush.
    pub(crate) flushing: AtomicU32,
    /// QPs that complete here.
    pub(crate) users: AtomicU32,
    /// 1 while a refused CQE waits to be reported by the next poll.
    pub(crate) deferred: AtomicU32,
    /// The consumer index last handed back to the device (modulo 2N): the driver's own copy
    /// of the ring's `cons_head`. Whether the ring looks empty is decided against it, never
    /// against the shared word, which the device could rewrite (a CQ that reads ready while a
    /// poll, counting from its private head, finds nothing, makes a waiter spin).
    pub(crate) cons_index: AtomicU32,
    /// The POLL doorbell word (`handle | CQ_POLL`), or 0 where it must not be rung
    /// ([`Events::poll_doorbell`](super::irq::Events::poll_doorbell)).
    pub(crate) poll_bell: u32,
    /// Its place in the event hub (`None`: every place was taken when it was created).
    pub(crate) slot: Option<Slot>,
}

// SAFETY: the ring points into the CQ's own DMA memory; the consumer side is written only
// under `poll`, the rest is atomic.
unsafe impl<H: Hal + Send> Send for Cq<H> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync> Sync for Cq<H> {}

/// What the poll lock protects.
pub(crate) struct PollState {
    /// The consumer's free-running counter.
    pub(crate) head: u32,
    /// The last QP a CQE named.
    pub(crate) last: Last,
    /// A refusal met after good completions, reported by the next poll.
    pub(crate) deferred: Option<Error>,
}

// SAFETY: `last` points at a control block that is only dereferenced under the poll lock,
// which QP creation and destruction also take.
unsafe impl Send for PollState {}

/// A poller's cache of the last QP a CQE named: the table's answer for it on this CQ.
#[derive(Clone, Copy)]
pub(crate) struct Last {
    /// The CQE `qp` value it answers (meaningless while `roles` is 0).
    pub(crate) qp: u64,
    /// The QP's control block (dangling while `roles` is 0).
    pub(crate) ctl: NonNull<QpCtl>,
    /// [`SENDS`], [`RECVS`], [`OWN_RECVS`]: which of its completions come to this CQ.
    pub(crate) roles: u32,
    /// The QP number its completions report.
    pub(crate) qpn: u32,
}

/// The QP's send completions come to this CQ.
pub(crate) const SENDS: u32 = 1;
/// Its receive completions come to this CQ.
pub(crate) const RECVS: u32 = 2;
/// Its receive completions come to this CQ, from its own receive queue (not an SRQ), and none
/// of its earlier life is due (the straight-line poll may take them).
pub(crate) const OWN_RECVS: u32 = 4;
/// Its send completions come to this CQ, and none of its earlier life is due (the
/// straight-line poll may take them).
pub(crate) const FAST_SENDS: u32 = 8;
/// The GSI QP's number (and handle) on QEMU: its host QP is QP1.
pub(crate) const GSI_QPN: u32 = 1;

impl Last {
    /// No QP cached: no CQE matches (`roles` 0).
    pub(crate) const NONE: Last = Last {
        qp: u64::MAX,
        ctl: NonNull::dangling(),
        roles: 0,
        qpn: 0,
    };

    /// The table's answer for QP `handle` on CQ `cq`; `None` when none of its completions
    /// come here (or it does not exist).
    #[inline(never)]
    pub(crate) fn lookup<H: Hal>(dev: &Pvrdma<H>, cq: &Cq<H>, handle: u32) -> Option<Last> {
        let (ctl, send, recv) = dev.qps.lookup(handle, cq.id())?;
        // SAFETY: the table named this CQ for the QP, so the control block lives while the
        // caller holds the CQ's poll lock.
        let c = unsafe { ctl.as_ref() };
        let (srq, qpn) = (c.srq, c.qpn);
        // (A queue with CQEs of its earlier life due goes through the general match.
        // Nor does a metered queue's: its CQEs give back room.)
        let calm = |q: &super::qptable::QueueView| {
            q.ctl.late.load(Ordering::Relaxed) == 0 && q.room.is_none()
        };
        let roles = if send { SENDS } else { 0 }
            | if send && calm(&c.sq) { FAST_SENDS } else { 0 }
            | if recv { RECVS } else { 0 }
            // (Not the GSI QP's: its receive lengths are corrected in the general loop.)
            | if recv && !srq && qpn != GSI_QPN && calm(&c.rq) {
                OWN_RECVS
            } else {
                0
            };
        Some(Last {
            qp: u64::from(handle),
            ctl,
            roles,
            qpn,
        })
    }
}

impl PollState {
    pub(crate) fn new() -> Self {
        PollState {
            head: 0,
            last: Last::NONE,
            deferred: None,
        }
    }

    /// Forgets a cached control block (its QP is going away).
    pub(crate) fn forget(&mut self, ctl: NonNull<QpCtl>) {
        if self.last.ctl == ctl {
            self.last = Last::NONE;
        }
    }
}

/// How many times taking a poll lock is tried before the operation answers `Busy` (a poller
/// holds it only for a poll, or while its cursor lives).
const LOCK_TRIES: u32 = 1 << 16;
/// Spins a poll waits for another thread's poll of the same CQ (a poll holds the lock for the
/// entries it reads: far fewer spins than this; the device has no clock to wait by).
const POLL_SPINS: u32 = 1 << 16;

/// The poll locks of a QP's send and receive CQs (one when they are the same), taken in
/// address order and bounded: what creating, resetting, erroring and destroying a QP hold
/// while they change what the CQs' pollers read (the QP table and the QP's counters).
pub(crate) struct CqLocks<'a, H: Hal> {
    pub(crate) s: &'a Cq<H>,
    pub(crate) r: &'a Cq<H>,
    first: spin::MutexGuard<'a, PollState>,
    second: Option<spin::MutexGuard<'a, PollState>>,
}

impl<'a, H: Hal> CqLocks<'a, H> {
    /// The queues of the QP whose control block is `ctl` stop flushing (RESET, destroy): its
    /// CQs no longer count them, so that a CQ with nothing to report reads empty. Under both
    /// CQs' poll locks (this value).
    pub(crate) fn stop_flush(&self, ctl: &QpCtl) {
        for (q, cq) in [(&ctl.sq, self.s), (&ctl.rq, self.r)] {
            if q.ctl.flush.swap(0, Ordering::AcqRel) != 0 {
                cq.flushing.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Takes both locks, or answers `Busy` for `op` (nothing held).
    pub(crate) fn take(s: &'a Cq<H>, r: &'a Cq<H>, op: Op) -> Result<Self> {
        let lock = |cq: &'a Cq<H>| {
            (0..LOCK_TRIES)
                .find_map(|_| {
                    let g = cq.poll.try_lock();
                    if g.is_none() {
                        core::hint::spin_loop();
                    }
                    g
                })
                .ok_or(Error::Busy { op })
        };
        let (a, b) = if (s as *const Cq<H>) <= (r as *const Cq<H>) {
            (s, r)
        } else {
            (r, s)
        };
        let first = lock(a)?;
        let second = if core::ptr::eq(a, b) {
            None
        } else {
            Some(lock(b)?)
        };
        Ok(CqLocks {
            s,
            r,
            first,
            second,
        })
    }

    /// Forgets a control block the pollers cached (its QP is going away).
    pub(crate) fn forget(&mut self, ctl: NonNull<QpCtl>) {
        self.first.forget(ctl);
        if let Some(g) = self.second.as_mut() {
            g.forget(ctl);
        }
    }

    /// Removes every CQE of QP `handle` from both CQs ([`Cq::purge`], `recv_wr_id` called
    /// with the `wr_id` of each receive removed): how many were in the send CQ's ring for its
    /// send queue and in the receive CQ's for its receive queue.
    pub(crate) fn purge(&mut self, handle: u32, mut recv_wr_id: impl FnMut(u64)) -> (u32, u32) {
        let s_first = (self.s as *const Cq<H>) <= (self.r as *const Cq<H>);
        let (a, b) = if s_first {
            (self.s, self.r)
        } else {
            (self.r, self.s)
        };
        let (a_s, a_r) = a.purge(&mut self.first.head, handle, &mut recv_wr_id);
        let Some(g) = self.second.as_mut() else {
            return (a_s, a_r);
        };
        let (b_s, b_r) = b.purge(&mut g.head, handle, &mut recv_wr_id);
        if s_first { (a_s, b_r) } else { (b_s, a_r) }
    }
}

impl<H: Hal> Cq<H> {
    /// The device's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Pages of ring memory, the ring-state page included.
    pub fn pages(&self) -> usize {
        self.mem.data.pages()
    }

    /// This CQ's identity in the QP table: its ring's physical address (unique while it lives).
    pub(crate) fn id(&self) -> u64 {
        self.mem.data.paddr()
    }

    /// Hands the slots before free-running consumer position `head` back to the device
    /// (release: the CQEs were read before), and keeps the index the device was given.
    #[inline(always)]
    pub(crate) fn hand_back(&self, head: u32) {
        let i = self.ring.index(head);
        self.ring.cons().store(i, Ordering::Release);
        self.cons_index.store(i, Ordering::Relaxed);
    }

    /// Whether the ring looks empty: the device's producer index is where the driver's own
    /// consumer index is.
    #[inline(always)]
    pub(crate) fn looks_empty(&self) -> bool {
        self.ring.prod().load(Ordering::Relaxed) == self.cons_index.load(Ordering::Relaxed)
    }

    /// Takes the poll lock, waiting for another poller a bounded number of spins: `None` when
    /// it still holds the lock after them (that poll takes the completions there are: this
    /// one finds none now, as `ibv_poll_cq` returning 0).
    #[inline(always)]
    pub(crate) fn poll_lock(&self) -> Option<spin::MutexGuard<'_, PollState>> {
        match self.poll.try_lock() {
            Some(g) => Some(g),
            None => self.poll_lock_wait(),
        }
    }

    #[cold]
    #[inline(never)]
    fn poll_lock_wait(&self) -> Option<spin::MutexGuard<'_, PollState>> {
        for _ in 0..POLL_SPINS {
            // Test, then test-and-set: the waiting poller reads the line, not writes it.
            if !self.poll.is_locked()
                && let Some(g) = self.poll.try_lock()
            {
                return Some(g);
            }
            core::hint::spin_loop();
        }
        None
    }

    /// Room for completions no request or reservation holds.
    pub(crate) fn free(&self) -> u32 {
        self.room.load(Ordering::Acquire).max(0) as u32
    }

    /// The CQEs reserved (which may exceed the entries: see `room`).
    pub(crate) fn reserved(&self) -> u32 {
        (i64::from(self.entries) - i64::from(self.room.load(Ordering::Acquire))) as u32
    }

    /// Reserves `n` CQEs for a work queue, or says how many are left.
    pub(crate) fn reserve(&self, n: u32) -> Result<()> {
        let n = i32::try_from(n).unwrap_or(i32::MAX);
        let r = self
            .room
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                (r >= n).then(|| r - n)
            });
        r.map(|_| ()).map_err(|r| Error::QueueFull {
            queue: Queue::Cq,
            free: r.max(0) as u32,
        })
    }

    /// Reserves `n` CQEs for good (a QP whose creation had an unknown outcome may complete
    /// here), even beyond the CQ's size: the CQ then refuses every new QP.
    pub(crate) fn reserve_forever(&self, n: u32) {
        let n = i32::try_from(n).unwrap_or(i32::MAX);
        let _ = self
            .room
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(n))
            });
    }

    /// Removes every CQE of QP `handle` waiting in the ring from the consumer position `head`
    /// (the caller holds the poll lock: `head` is its state's), as Linux's driver does when a
    /// QP is reset or destroyed (`docs/pvrdma.md`): the CQEs kept move toward the producer end,
    /// the consumer position moves past the slots freed, which go back to the device. How many
    /// of those removed were sends and receives (`recv_wr_id` is called with each receive's
    /// `wr_id`); an impossible producer index removes none.
    pub(crate) fn purge(
        &self,
        head: &mut u32,
        handle: u32,
        recv_wr_id: &mut impl FnMut(u64),
    ) -> (u32, u32) {
        let ring = self.ring;
        let Some(ready) = ring.ready(*head) else {
            return (0, 0);
        };
        let (mut sends, mut recvs) = (0, 0);
        let end = head.wrapping_add(ready);
        // From the newest CQE back; `keep` is the slot of the last CQE kept.
        let (mut keep, mut n) = (end, end);
        while n != *head {
            n = n.wrapping_sub(1);
            let c = ring.slot(n).cast::<abi::Cqe>();
            // SAFETY: a CQE slot of the ring, published by the prod_tail read (acquire) in
            // `ready`; read as plain data.
            let (qp, op) = unsafe {
                (
                    core::ptr::addr_of!((*c).qp).read_volatile(),
                    core::ptr::addr_of!((*c).opcode).read_volatile(),
                )
            };
            if qp == u64::from(handle) {
                match decode_opcode(op) {
                    Some((_, true)) => {
                        recvs += 1;
                        // SAFETY: as above.
                        recv_wr_id(unsafe { core::ptr::addr_of!((*c).wr_id).read_volatile() });
                    }
                    _ => sends += 1,
                }
                continue;
            }
            keep = keep.wrapping_sub(1);
            if keep != n {
                // SAFETY: both slots lie between the consumer position and the producer index
                // read above: published CQEs the device no longer writes, the poller's alone
                // (its lock is held); distinct slots of CQE_SIZE bytes.
                unsafe {
                    core::ptr::copy_nonoverlapping(ring.slot(n), ring.slot(keep), abi::CQE_SIZE)
                };
            }
        }
        if keep != *head {
            *head = keep;
            self.hand_back(keep);
        }
        (sends, recvs)
    }

    /// Gives back `n` reserved CQEs.
    pub(crate) fn unreserve(&self, n: u32) {
        super::qptable::unreserve(core::ptr::NonNull::from(&self.room), n, self.entries);
    }
}

impl<H: Hal> Pvrdma<H> {
    pub(crate) fn create_cq_impl(&self, entries: u32, channel: Option<ChannelId>) -> Result<Cq<H>> {
        let op = Op::CreateCq;
        let max = self.max_cq_entries();
        if entries > max {
            return Err(Error::invalid(crate::error::Param::CqEntries, entries, max));
        }
        // A power of two (QEMU and Linux require it), at least 1.
        let cqe = entries.max(1).next_power_of_two();
        let pages = 1 + cqe.div_ceil(CQES_PER_PAGE);
        let mut st = self.state.lock();
        st.room_for(crate::error::Object::Cq, self.caps.max_cq)?;
        let mem = QueueMem::new(&self.hal, pages as usize)?;
        let pdir_dma = mem.pdir.paddr();
        let fill = |r: &mut abi::CreateCq| (r.pdir_dma, r.cqe, r.nchunks) = (pdir_dma, cqe, pages);
        let code = (op, abi::opcode::CREATE_CQ);
        let (r, mem): (abi::CreateCqResp, _) =
            st.create(&self.regs, crate::error::Object::Cq, code, fill, mem)?;
        drop(st);
        let mut cq = Cq {
            handle: r.cq_handle,
            entries: cqe,
            ring: Ring::new(&mem.data, abi::RING_STATE_RX, 1, cqe, abi::CQE_SIZE as u32),
            mem,
            poll: spin::Mutex::new(PollState::new()),
            room: AtomicI32::new(cqe as i32),
            flushing: AtomicU32::new(0),
            users: AtomicU32::new(0),
            deferred: AtomicU32::new(0),
            cons_index: AtomicU32::new(0),
            poll_bell: if self.events.poll_doorbell() {
                r.cq_handle | db::CQ_POLL
            } else {
                0
            },
            slot: None,
        };
        // The CQ as the device described it must be usable, and a CQ on a channel must be able
        // to raise events; otherwise it is undone, best effort.
        let refused = if r.cqe != cqe || r.cq_handle > db::HANDLE_MASK {
            // Garbage: the CQ cannot be used as the device described it.
            Some(if r.cqe != cqe {
                Error::bad_value(op, &"cqe", r.cqe)
            } else {
                Error::bad_value(op, &"cq_handle", r.cq_handle)
            })
        } else {
            cq.slot = self.events.hub().attach(cq.handle, channel);
            (cq.slot.is_none() && channel.is_some()).then_some(Error::Resource(Resource::Objects {
                object: Object::CqEventSlot,
                limit: crate::events::CQ_SLOTS as u32,
            }))
        };
        if let Some(e) = refused {
            if let Err((cq, de)) = self.destroy_cq_impl(cq) {
                // The device may use the CQ's memory: kept for good, as every deliberate leak,
                // with a warning.
                crate::error::warn(
                    "a CQ the device answered garbage for could not be destroyed (",
                    &de,
                    "): its memory is kept",
                );
                core::mem::forget(cq);
            }
            return Err(e);
        }
        Ok(cq)
    }

    /// Arms `cq` for its next (or next solicited) completion (`ibv_req_notify_cq`): the hub
    /// records it before the device is told, after the notifications so far are taken (so
    /// that they do not count against the arm, and the device's ring has room).
    pub(crate) fn req_notify_impl(&self, cq: &Cq<H>, solicited: bool) -> Result<()> {
        let slot = cq.slot.ok_or(Error::Resource(Resource::Objects {
            object: Object::CqEventSlot,
            limit: crate::events::CQ_SLOTS as u32,
        }))?;
        self.events.drain();
        let arm = if solicited { Arm::Solicited } else { Arm::Next };
        self.events.hub().arm(slot, arm);
        self.hal.publish_barrier();
        self.uar
            .write32(db::CQ, cq.handle | self.events.arm_bits(solicited));
        Ok(())
    }

    pub(crate) fn destroy_cq_impl(&self, cq: Cq<H>) -> Result<(), (Cq<H>, Error)> {
        let hub = self.events.hub();
        // A QP (perhaps one leaked with mem::forget) still completes here, or events taken
        // from its channel are not acknowledged (`ibv_destroy_cq`'s rule).
        let users = cq.users.load(Ordering::Relaxed);
        let unacked = cq.slot.map_or(0, |s| hub.unacked(s));
        if users != 0 {
            return Err((cq, Error::in_use(Op::DestroyCq, Holder::Qps, users)));
        }
        if unacked != 0 {
            let e = Error::in_use(Op::DestroyCq, Holder::UnackedEvents, unacked);
            return Err((cq, e));
        }
        let code = (Op::DestroyCq, abi::opcode::DESTROY_CQ);
        let (handle, slot) = (cq.handle, cq.slot);
        self.state
            .lock()
            .destroy(&self.regs, crate::error::Object::Cq, code, handle, cq)?;
        if let Some(s) = slot {
            hub.detach(s);
        }
        Ok(())
    }
}

/// A CQE opcode as a completion opcode, and whether it completes a receive.
#[inline(always)]
pub(crate) fn decode_opcode(raw: u32) -> Option<(WcOpcode, bool)> {
    Some(match raw {
        wc_opcode::SEND => (WcOpcode::Send, false),
        wc_opcode::RDMA_WRITE => (WcOpcode::RdmaWrite, false),
        wc_opcode::RDMA_READ => (WcOpcode::RdmaRead, false),
        wc_opcode::COMP_SWAP => (WcOpcode::CompSwap, false),
        wc_opcode::FETCH_ADD => (WcOpcode::FetchAdd, false),
        wc_opcode::RECV => (WcOpcode::Recv, true),
        wc_opcode::RECV_RDMA_WITH_IMM => (WcOpcode::RecvRdmaWithImm, true),
        _ => return None,
    })
}
