//! A shared receive queue's bookkeeping of its outstanding receives, in driver-private memory:
//! which `wr_id`s the driver posted, so that a completion the device reports for the SRQ is
//! matched to a receive that is really outstanding, exactly once (`docs/pvrdma.md`).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use super::srq_meter::SrqMeter;
use crate::error::Result;

/// What the driver keeps for one outstanding receive of a shared receive queue, in
/// driver-private memory: its `wr_id`. The SRQ has as many of these as ring slots, which is
/// as many receives as can be outstanding.
#[repr(C)]
pub(crate) struct SrqSlot {
    pub(crate) wr_id: u64,
    /// `FREE`, `CLAIMED` (by the poster, `wr_id` being written) or `LIVE` (outstanding).
    live: AtomicU32,
    _pad: u32,
}

const FREE: u32 = 0;
const CLAIMED: u32 = 2;
const LIVE: u32 = 1;

/// A shared receive queue's counters: receives published (by its poster) and completed (by
/// the pollers of its QPs' CQs), both free-running (the credit is the ring minus the
/// difference: completions come in no order across the SRQ's QPs), and the record of the
/// receives outstanding, which every completion is matched against.
pub(crate) struct SrqCounters {
    pub(crate) tail: AtomicU32,
    pub(crate) done: AtomicU32,
    /// `slots` records (`slots` − 1 = `mask`).
    records: NonNull<SrqSlot>,
    mask: u32,
    /// Where the next post and the next match start looking (FIFO-ish completions make both
    /// searches short).
    post_hint: AtomicU32,
    match_hint: AtomicU32,
    /// Completions come through the pollers of every CQ its QPs complete to: one matches at
    /// a time, under this lock, which also keeps the SRQ's metered receive CQs.
    matching: spin::Mutex<SrqMeter>,
    /// How many receive CQs are metered (`SrqMeter::len`), read by the poster without the
    /// lock: it becomes non-zero only under the poster's lock (`meter_attach`).
    metered: AtomicU32,
}

impl SrqCounters {
    /// Counters for an SRQ of `slots` slots (a power of two) whose records are at `records`
    /// (`slots` of them, zeroed, in memory that lives and stays put as long as the SRQ).
    pub(crate) fn new(records: NonNull<SrqSlot>, slots: u32) -> Self {
        SrqCounters {
            tail: AtomicU32::new(0),
            done: AtomicU32::new(0),
            records,
            mask: slots - 1,
            post_hint: AtomicU32::new(0),
            match_hint: AtomicU32::new(0),
            matching: spin::Mutex::new(SrqMeter::new()),
            metered: AtomicU32::new(0),
        }
    }

    fn slot(&self, i: u32) -> *mut SrqSlot {
        // (i & mask < slots: inside the records, `new`.)
        self.records.as_ptr().wrapping_add((i & self.mask) as usize)
    }

    fn live(&self, i: u32) -> &AtomicU32 {
        // SAFETY: inside the records (`slot`); the flag is an atomic.
        unsafe { &(*self.slot(i)).live }
    }

    /// Records a receive posted with `wr_id`. The caller holds the SRQ's poster lock and the
    /// credit rule holds (fewer receives outstanding than records): a free record exists.
    pub(crate) fn post(&self, wr_id: u64) {
        let h = self.post_hint.load(Ordering::Relaxed);
        for k in 0..=self.mask {
            let i = h.wrapping_add(k);
            let l = self.live(i);
            if l.compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                // SAFETY: inside the records; claimed by this poster: no completer reads a
                // record that is not LIVE.
                unsafe { core::ptr::addr_of_mut!((*self.slot(i)).wr_id).write(wr_id) };
                l.store(LIVE, Ordering::Release);
                self.post_hint.store(i.wrapping_add(1), Ordering::Relaxed);
                return;
            }
        }
    }

    /// Counts the completion of an outstanding receive posted with `wr_id`; `false` when none
    /// is (a CQE the device invented or rewrote): nothing the device writes decides which
    /// `wr_id` a completion reports. The search is bounded by the SRQ's size.
    pub(crate) fn complete(&self, wr_id: u64) -> bool {
        let mut g = self.matching.lock();
        if self.done.load(Ordering::Relaxed) == self.tail.load(Ordering::Acquire) {
            // Nothing published is outstanding (a record being posted is not yet).
            return false;
        }
        let h = self.match_hint.load(Ordering::Relaxed);
        for k in 0..=self.mask {
            let i = h.wrapping_add(k);
            let l = self.live(i);
            // SAFETY: inside the records; a LIVE record's wr_id was written before (acquire).
            if l.load(Ordering::Acquire) == LIVE && unsafe { (*self.slot(i)).wr_id } == wr_id {
                l.store(FREE, Ordering::Release);
                self.match_hint.store(i.wrapping_add(1), Ordering::Relaxed);
                self.done.fetch_add(1, Ordering::AcqRel);
                g.discharge();
                return true;
            }
        }
        false
    }

    /// `n` receives about to be published take their CQ room on every metered receive CQ
    /// (`SrqMeter::charge`). The caller holds the SRQ's poster lock.
    #[inline]
    pub(crate) fn charge(&self, n: u32) -> Result<()> {
        if self.metered.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        self.matching.lock().charge(n)
    }

    /// Meters receive CQ `m` for this SRQ (`SrqMeter::attach`): the caller holds the SRQ's
    /// poster lock, so that the receives outstanding are all published and counted.
    pub(crate) fn meter_attach(
        &self,
        m: (u64, core::ptr::NonNull<core::sync::atomic::AtomicI32>, u32),
    ) -> Result<()> {
        let mut g = self.matching.lock();
        let outstanding = self
            .tail
            .load(Ordering::Acquire)
            .wrapping_sub(self.done.load(Ordering::Acquire));
        let r = g.attach(m, outstanding);
        self.metered.store(g.len(), Ordering::Release);
        r
    }

    /// Receive CQ `cq` stops being metered for this SRQ (its last QP on the SRQ is gone):
    /// `false` when it was not (its room was reserved).
    pub(crate) fn meter_detach(&self, cq: u64) -> bool {
        let mut g = self.matching.lock();
        let was = g.detach(cq);
        self.metered.store(g.len(), Ordering::Release);
        was
    }
}
