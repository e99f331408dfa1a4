//! The progress's per-QP scheduling: the busy set (`Rxe::busy`), the queue pairs that have
//! work without a frame arriving, and their turns. A QP joins the set under its own lock when
//! it may have gained such work and leaves it under its own lock once it has none.

use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use bareverbs_hal::{Clock, Hal, Link};

use super::tables::{self, Tables};
use super::{Core, MAX_QP, QP_SPINS, Rxe, qp_lock, qp_state, reply, requester};

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    /// Puts queue pair `q` in the busy set when it has work for the progress (its lock is
    /// held: `q`). Only this QP's lock holders change its bit (but for a QP already gone from
    /// the table), so a set bit read under it stays set: then neither its work is looked at
    /// nor the set written.
    #[inline(always)]
    pub(crate) fn note(&self, q: &qp_state::QpCore) {
        let bit = q.busy_bit;
        if self.busy.load(Ordering::Relaxed) & bit == 0 && q.wants_progress() {
            self.busy.fetch_or(bit, Ordering::AcqRel);
        }
    }

    /// After a frame for queue pair `q` (its lock is held): it joins the busy set when it has
    /// work for the progress, and leaves it when it has none, as the progress's own visit
    /// would (with no work, that visit does nothing: `wants_progress`), so that the progress
    /// does not visit it for nothing. As in `note`, the bit read under the lock is current.
    #[inline(always)]
    pub(super) fn note_frame(&self, q: &qp_state::QpCore) {
        if q.wants_progress() {
            self.note(q);
            return;
        }
        let busy = self.busy.load(Ordering::Relaxed);
        if busy != 0 {
            let bit = q.busy_bit;
            if busy & bit != 0 {
                self.busy.fetch_and(!bit, Ordering::AcqRel);
            }
        }
    }

    /// Puts queue pair `qpn` in the busy set (the progress looks at it once).
    pub(crate) fn mark(&self, qpn: u32) {
        self.busy.fetch_or(Tables::bit(qpn), Ordering::AcqRel);
    }

    /// Whether the next [`progress`](Self::progress) has frames to send now: a queue pair of
    /// the busy set with requests posted and not yet sent (and room in its window), answers
    /// held back, or frames waiting for the NIC, and room on the NIC. A queue pair there only
    /// for its timers (a request awaiting its acknowledgement) does not count, nor does a
    /// full transmit ring: what ends those waits arrives through the NIC (or the timer). What
    /// a core that runs the progress for other cores' posts (`set_progress_only`) asks before
    /// it halts. With the set empty, one load; else the device lock and each busy queue
    /// pair's lock are tried once, never waited for. A queue pair whose lock is held
    /// elsewhere is passed over: its holder is mid-post or mid-poll, and a core that posts
    /// must tell the progress's core after it (the appliance's poll groups wake core 0 after
    /// every round that did work). The device lock held elsewhere counts as work.
    pub fn sends_waiting(&self) -> bool {
        let busy = self.busy.load(Ordering::Acquire);
        if busy == 0 {
            return false;
        }
        let Some(mut core) = self.core.try_lock() else {
            return true;
        };
        if !core.parts().0.tx_ready() {
            return false;
        }
        let t = core.tables();
        let mut left = busy as u32;
        // Bounded: each set bit of the slots once (at most MAX_QP), then the GSI QP.
        loop {
            let (q, last) = if left != 0 {
                let i = left.trailing_zeros() as usize;
                left &= left - 1;
                (
                    t.qps.get(i).copied().unwrap_or(core::ptr::null_mut()),
                    false,
                )
            } else if busy & tables::GSI_BIT != 0 {
                (t.gsi, true)
            } else {
                return false;
            };
            if let Some(q) = NonNull::new(q) {
                // SAFETY: as in `dispatch`: a QP in the table is alive (destroy removes it
                // under the device lock, held here); no QP lock is held (the lock order).
                if let Some(q) = unsafe { qp_lock::QpGuard::try_lock(q, 1) }
                    && q.has_sends()
                {
                    return true;
                }
            }
            if last {
                return false;
            }
        }
    }

    /// Runs the timers of the queue pairs that have work without a frame arriving (the
    /// busy set, `Rxe::busy`), and sends on their backlogs, a bounded turn each; the
    /// first turn goes to each queue pair in rotation, so that one QP's backlog cannot keep
    /// the NIC from the others. Idle QPs are not visited: a poll costs nothing per QP.
    pub(super) fn run_timers(&self, core: &mut Core<L>, now: u64) {
        let busy = self.busy.load(Ordering::Acquire);
        if busy == 0 {
            return;
        }
        let first = core.tables().turn % MAX_QP as u32;
        // Bit j of `slots` is slot (first + j) % MAX_QP: the rotation starts at `first`.
        let slots = (busy as u32).rotate_right(first);
        let mut next = None;
        let mut left = slots;
        // Bounded: each set bit of the slots once (at most MAX_QP), then the GSI QP.
        loop {
            let (slot, bit) = if left != 0 {
                let j = left.trailing_zeros();
                left &= left - 1;
                let i = (first + j) % MAX_QP as u32;
                (Some(i as usize), 1u64 << i)
            } else if busy & tables::GSI_BIT != 0 {
                (None, tables::GSI_BIT)
            } else {
                break;
            };
            let t = core.tables();
            let q = match slot {
                Some(i) => t.qps[i],
                None => t.gsi,
            };
            if let Some(q) = NonNull::new(q) {
                // The next progress starts after the first QP served now.
                if let Some(i) = slot {
                    next.get_or_insert(i + 1);
                }
                // SAFETY: as in `dispatch`. Held elsewhere: its turn waits for the next
                // progress (it stays in the busy set).
                let Some(mut q) = (unsafe { qp_lock::QpGuard::try_lock(q, QP_SPINS) }) else {
                    if slot.is_none() {
                        break;
                    }
                    continue;
                };
                let mut net = self.net(core, now);
                reply::drain(&mut net, &mut q);
                requester::on_timer(&mut net, &mut q);
                if !q.wants_progress() {
                    // Under the QP's lock: a post that adds work marks it again after this.
                    self.busy.fetch_and(!bit, Ordering::AcqRel);
                }
            } else {
                self.busy.fetch_and(!bit, Ordering::AcqRel);
            }
            if slot.is_none() {
                break;
            }
        }
        if let Some(n) = next {
            core.tables().turn = n as u32;
        }
    }
}
