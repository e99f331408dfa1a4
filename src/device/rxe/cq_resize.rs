//! Resizing a completion queue (`ibv_resize_cq`): a larger ring with the completions not yet
//! polled moved into it, in order; a smaller size keeps the ring it has.

use bareverbs_hal::{Clock, Hal, Link};

use super::Rxe;
use super::cq::{Cq, MAX_CQE};
use crate::dma::Dma;
use crate::error::{Error, Op, Param, Result};

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    /// `ibv_resize_cq`: afterwards the CQ has at least `entries`. More than the device's
    /// [`MAX_CQE`] is `InvalidInput { CqEntries }`; fewer than the CQEs it must keep room for
    /// (requests posted and not yet polled, completions waiting, shared receive queues'
    /// reservations) `InvalidInput { CqEntriesInUse }`; either way nothing changed. A size
    /// the ring already has keeps it (as libibverbs allows: "at least"); a larger one moves
    /// the completions waiting into a new ring of the next power of two, in their order,
    /// under the device lock (no completion is added meanwhile).
    pub(crate) fn resize_cq_impl(&self, cq: &mut Cq<H>, entries: u32) -> Result<()> {
        if entries == 0 || entries > MAX_CQE {
            return Err(Error::invalid(Param::CqEntries, entries, MAX_CQE));
        }
        let in_use = cq.ring().taken();
        if entries < in_use {
            return Err(Error::invalid(Param::CqEntriesInUse, in_use, entries));
        }
        if entries <= cq.ring().cap() {
            return Ok(());
        }
        let cap = entries.next_power_of_two();
        let mem = Dma::new(
            &self.hal,
            Cq::<H>::entries_bytes(cap).div_ceil(bareverbs_hal::PAGE_SIZE),
        )?;
        let _guard = self.lock();
        // SAFETY: the device lock is held; `mem` is page-aligned and holds `cap` entries.
        if unsafe { cq.grow(mem, cap) } {
            Ok(())
        } else {
            // A poll of this CQ held it through every spin (one not ended: `&mut` leaves no
            // other).
            Err(Error::Busy { op: Op::ResizeCq })
        }
    }
}
