//! The CQ room of a shared receive queue whose depth does not fit one of its receive CQs
//! (`docs/pvrdma.md`, "CQ room"): those CQs are *metered*. A receive posted to an SRQ does
//! not know which CQ it will complete on (any QP on the SRQ may take it), so each receive
//! outstanding holds one entry on *every* metered CQ of its SRQ; posting past the room of any
//! of them is refused whole, and each completion gives one entry back on each.
//!
//! The set lives under the SRQ's matching lock (`SrqCounters`), which every completion
//! already takes. Invariant: while the set is not empty, every receive outstanding is
//! charged (`charged` equals the receives outstanding, and each metered CQ holds that many
//! entries for the SRQ); while it is empty, `charged` is 0.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicI32, Ordering};

use crate::error::{Error, Object, Queue, Resource, Result};

/// How many receive CQs one SRQ can have metered at once (a driver capacity, heap-free: an
/// SRQ whose depth fits a CQ reserves there instead and is not counted).
pub(crate) const MAX_METERED: usize = 8;

/// Gives back `n` entries of a CQ's room counter (`Cq::room`), never beyond its `entries`.
pub(crate) fn unreserve(room: NonNull<AtomicI32>, n: u32, entries: u32) {
    if n != 0 {
        // SAFETY: the CQ outlives the QPs whose queues name it (the provider contract of
        // create_qp), and the SRQ pairs they make, and the CQ itself.
        let r = unsafe { room.as_ref() };
        let n = i32::try_from(n).unwrap_or(i32::MAX);
        let cap = i32::try_from(entries).unwrap_or(i32::MAX);
        let _ = r.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            Some(v.saturating_add(n).min(cap))
        });
    }
}

/// Takes `n` entries of a CQ's room counter, or answers the room it has.
fn take(room: NonNull<AtomicI32>, n: u32) -> Result<(), u32> {
    // SAFETY: as in `unreserve`.
    let r = unsafe { room.as_ref() };
    let n = i32::try_from(n).unwrap_or(i32::MAX);
    r.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        (v >= n).then(|| v - n)
    })
    .map(|_| ())
    .map_err(|v| v.max(0) as u32)
}

/// One metered receive CQ of an SRQ.
#[derive(Clone, Copy)]
struct Metered {
    /// The CQ's id (`Cq::id`).
    cq: u64,
    /// Its room counter and entries (`Cq::room`, `Cq::entries`).
    room: NonNull<AtomicI32>,
    entries: u32,
}

/// An SRQ's metered receive CQs and the receives that hold room on them.
pub(crate) struct SrqMeter {
    cqs: heapless::Vec<Metered, MAX_METERED>,
    /// Receives outstanding that hold one entry on each metered CQ.
    charged: u32,
}

// SAFETY: the room counters are atomics of CQs that outlive their place in the set (a CQ is
// in it while a QP completing there receives from the SRQ, and a QP holds its CQs).
unsafe impl Send for SrqMeter {}

impl SrqMeter {
    pub(crate) const fn new() -> Self {
        SrqMeter {
            cqs: heapless::Vec::new(),
            charged: 0,
        }
    }

    /// CQs metered now.
    pub(crate) fn len(&self) -> u32 {
        self.cqs.len() as u32
    }

    /// Whether CQ `cq` is metered for this SRQ.
    pub(crate) fn has(&self, cq: u64) -> bool {
        self.cqs.iter().any(|m| m.cq == cq)
    }

    /// Meters CQ `cq` (room counter `room` of `entries`) for this SRQ, which has `outstanding`
    /// receives: they may complete there, so each takes its entry now. `QueueFull { Cq }` when
    /// the CQ has no room for them (poll it, or the SRQ's other CQs, and try again); a full
    /// set is a resource error. Already metered: nothing to do.
    pub(crate) fn attach(
        &mut self,
        (cq, room, entries): (u64, NonNull<AtomicI32>, u32),
        outstanding: u32,
    ) -> Result<()> {
        if self.has(cq) {
            return Ok(());
        }
        if self.cqs.is_full() {
            return Err(Error::Resource(Resource::Objects {
                object: Object::Cq,
                limit: MAX_METERED as u32,
            }));
        }
        // Empty set: nothing was charged; now every receive outstanding is.
        let n = if self.cqs.is_empty() {
            outstanding
        } else {
            self.charged
        };
        take(room, n).map_err(|free| Error::QueueFull {
            queue: Queue::Cq,
            free,
        })?;
        self.charged = n;
        // (Not full: checked above.)
        let _ = self.cqs.push(Metered { cq, room, entries });
        Ok(())
    }

    /// CQ `cq` is no longer one its SRQ's receives complete on: its entries come back.
    /// `false` when it was not metered.
    pub(crate) fn detach(&mut self, cq: u64) -> bool {
        let Some(i) = self.cqs.iter().position(|m| m.cq == cq) else {
            return false;
        };
        let m = self.cqs.swap_remove(i);
        unreserve(m.room, self.charged, m.entries);
        if self.cqs.is_empty() {
            self.charged = 0;
        }
        true
    }

    /// `n` receives about to be posted take one entry each on every metered CQ, all or none:
    /// `QueueFull { Cq }` with the least room among them.
    pub(crate) fn charge(&mut self, n: u32) -> Result<()> {
        if self.cqs.is_empty() || n == 0 {
            return Ok(());
        }
        for (i, m) in self.cqs.iter().enumerate() {
            if let Err(short) = take(m.room, n) {
                for back in &self.cqs[..i] {
                    unreserve(back.room, n, back.entries);
                }
                let free = self.cqs[i + 1..]
                    .iter()
                    // SAFETY: as in `unreserve`.
                    .map(|m| unsafe { m.room.as_ref() }.load(Ordering::Acquire).max(0) as u32)
                    .fold(short, u32::min);
                return Err(Error::QueueFull {
                    queue: Queue::Cq,
                    free,
                });
            }
        }
        self.charged = self.charged.saturating_add(n);
        Ok(())
    }

    /// A receive of the SRQ completed: its entry comes back on every metered CQ.
    pub(crate) fn discharge(&mut self) {
        if self.charged == 0 {
            return;
        }
        self.charged -= 1;
        for m in &self.cqs {
            unreserve(m.room, 1, m.entries);
        }
    }
}
