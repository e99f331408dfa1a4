//! The progress's per-QP scheduling: the busy set (`Rxe::busy`), the queue pairs that have
//! work without a frame arriving, and their turns. A QP joins the set under its own lock when
//! it may have gained such work and leaves it under its own lock once it has none.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

use bareverbs_hal::{Clock, Hal, Link};

use super::busy_bit::{self as tables, BUSY_WORDS, BusyBit, SLOT_WORDS};
use super::tables::Tables;
use super::{Core, MAX_QP, QP_SPINS, Rxe, qp_lock, qp_state, reply, requester};

/// The busy set's words as they were read once (`Acquire`), and whether any bit was set.
fn snapshot(busy: &[AtomicU64; BUSY_WORDS]) -> Option<[u64; BUSY_WORDS]> {
    let mut words = [0; BUSY_WORDS];
    let mut any = 0;
    for (w, b) in words.iter_mut().zip(busy) {
        *w = b.load(Ordering::Acquire);
        any |= *w;
    }
    (any != 0).then_some(words)
}

/// The table slots of a snapshot in rotation from slot `first`: `first` and the slots after
/// it, then those before it, each set bit once (at most [`MAX_QP`] items).
fn rotation(words: &[u64; BUSY_WORDS], first: usize) -> impl Iterator<Item = usize> + '_ {
    let (w0, b0) = (first / 64 % SLOT_WORDS, first % 64);
    // SLOT_WORDS + 1 pieces: the first word from bit b0, the other words whole, the first
    // word again below b0.
    (0..=SLOT_WORDS).flat_map(move |k| {
        let w = (w0 + k) % SLOT_WORDS;
        let mask = match k {
            0 => u64::MAX << b0,
            _ if k == SLOT_WORDS => !(u64::MAX << b0),
            _ => u64::MAX,
        };
        let mut left = words[w] & mask;
        core::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            let j = left.trailing_zeros() as usize;
            left &= left - 1;
            Some(w * 64 + j)
        })
    })
}

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    /// Puts queue pair `q` in the busy set when it has work for the progress (its lock is
    /// held: `q`). Only this QP's lock holders change its bit (but for a QP already gone from
    /// the table), so a set bit read under it stays set: then neither its work is looked at
    /// nor the set written.
    #[inline(always)]
    pub(crate) fn note(&self, q: &qp_state::QpCore) {
        let BusyBit { word, mask } = q.busy_bit;
        let w = &self.busy[word];
        if w.load(Ordering::Relaxed) & mask == 0 && q.wants_progress() {
            w.fetch_or(mask, Ordering::AcqRel);
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
        let BusyBit { word, mask } = q.busy_bit;
        let w = &self.busy[word];
        if w.load(Ordering::Relaxed) & mask != 0 {
            w.fetch_and(!mask, Ordering::AcqRel);
        }
    }

    /// Puts queue pair `qpn` in the busy set (the progress looks at it once).
    pub(crate) fn mark(&self, qpn: u32) {
        let BusyBit { word, mask } = Tables::bit(qpn);
        self.busy[word].fetch_or(mask, Ordering::AcqRel);
    }

    /// Takes queue pair `bit` out of the busy set (under its lock, with no work left).
    fn unmark(&self, bit: BusyBit) {
        self.busy[bit.word].fetch_and(!bit.mask, Ordering::AcqRel);
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
        let Some(words) = snapshot(&self.busy) else {
            return false;
        };
        let Some(mut core) = self.core.try_lock() else {
            return true;
        };
        if !core.parts().0.tx_ready() {
            return false;
        }
        let t = core.tables();
        let gsi = (words[tables::GSI_BIT.word] & tables::GSI_BIT.mask != 0).then_some(t.gsi);
        // Bounded: each set bit of the slots once (at most MAX_QP), then the GSI QP.
        let slots =
            rotation(&words, 0).map(|i| t.qps.get(i).copied().unwrap_or(core::ptr::null_mut()));
        for q in slots.chain(gsi) {
            if let Some(q) = NonNull::new(q) {
                // SAFETY: as in `dispatch`: a QP in the table is alive (destroy removes it
                // under the device lock, held here); no QP lock is held (the lock order).
                if let Some(q) = unsafe { qp_lock::QpGuard::try_lock(q, 1) }
                    && q.has_sends()
                {
                    return true;
                }
            }
        }
        false
    }

    /// Runs the timers of the queue pairs that have work without a frame arriving (the
    /// busy set, `Rxe::busy`), and sends on their backlogs, a bounded turn each; the
    /// first turn goes to each queue pair in rotation, so that one QP's backlog cannot keep
    /// the NIC from the others. Idle QPs are not visited: a poll costs nothing per QP.
    pub(super) fn run_timers(&self, core: &mut Core<L>, now: u64) {
        let Some(words) = snapshot(&self.busy) else {
            return;
        };
        let first = core.tables().turn as usize % MAX_QP;
        let gsi = words[tables::GSI_BIT.word] & tables::GSI_BIT.mask != 0;
        let mut next = None;
        // Bounded: each set bit of the slots once (at most MAX_QP), then the GSI QP.
        let slots = rotation(&words, first).map(Some);
        for slot in slots.chain(gsi.then_some(None)) {
            let (q, bit) = match slot {
                Some(i) => (
                    core.tables().qps[i],
                    Tables::bit(super::FIRST_QPN + i as u32),
                ),
                None => (core.tables().gsi, tables::GSI_BIT),
            };
            let Some(q) = NonNull::new(q) else {
                self.unmark(bit);
                continue;
            };
            // The next progress starts after the first QP served now.
            if let Some(i) = slot {
                next.get_or_insert(i + 1);
            }
            // SAFETY: as in `dispatch`. Held elsewhere: its turn waits for the next
            // progress (it stays in the busy set).
            let Some(mut q) = (unsafe { qp_lock::QpGuard::try_lock(q, QP_SPINS) }) else {
                continue;
            };
            let mut net = self.net(core, now);
            reply::drain(&mut net, &mut q);
            requester::on_timer(&mut net, &mut q);
            if !q.wants_progress() {
                // Under the QP's lock: a post that adds work marks it again after this.
                self.unmark(bit);
            }
        }
        if let Some(n) = next {
            core.tables().turn = n as u32;
        }
    }
}
