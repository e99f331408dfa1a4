//! Resizing a shared receive queue (`ibv_modify_srq` with `IBV_SRQ_MAX_WR`): a new ring with
//! the receives posted moved into it, and the room its QPs' receive CQs reserve for it
//! (once per SRQ and CQ, `cq.rs`) moved to the new depth.

use core::ptr::NonNull;

use bareverbs_hal::{Clock, Hal, Link};

use super::Rxe;
use super::qp_lock::QpGuard;
use super::srq::{Srq, SrqCore};
use super::tables::Tables;
use super::wqe::RqEntry;
use crate::dma::Dma;
use crate::error::Result;
use crate::verbs::SrqAttr;

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    /// Resizes `srq` to `max_wr` receives (rounded as at creation); answers the size it has.
    /// Fewer than the receives outstanding is `InvalidInput { SrqWrInUse }`, fewer than the
    /// armed limit `InvalidInput { SrqLimit }`, more than the device's `InvalidInput {
    /// SrqMaxWr }`: nothing changed.
    pub(crate) fn resize_srq_impl(&self, srq: &Srq<H>, max_wr: u32) -> Result<u32> {
        let want = self
            .plan_srq_impl(&SrqAttr {
                max_wr,
                ..srq.attr()
            })?
            .max_wr;
        let bytes = want as usize * size_of::<RqEntry>();
        let mem = Dma::new(&self.hal, bytes.div_ceil(bareverbs_hal::PAGE_SIZE))?;
        let mut guard = self.lock();
        self.srq_core(srq, &mut guard)
            .regrow(mem.base().cast(), want)?;
        // SAFETY: the device lock is held; the core names the new ring now.
        unsafe { srq.keep_ring(mem, want) };
        reserve_depth(guard.tables(), srq.core, want);
        Ok(want)
    }
}

/// Locks QP `q` (a living QP of the table: the device lock is held, no QP lock), for as
/// long as the tables `_t` are held.
fn qp<'t>(_t: &'t Tables, q: NonNull<super::qp_state::QpCore>) -> QpGuard<'t> {
    // SAFETY: the table's non-null entries are living QP cores (destroy takes them out under
    // the device lock, held by the caller); no other QP lock is held.
    unsafe { QpGuard::lock(q) }
}

/// Moves the reservation of each (SRQ `srq`, receive CQ) pair to `depth`: more reserved (as
/// much as the CQ has free, as at creation) by the pair's first QP, or the excess given back
/// by those that hold it (device lock held: `t` is its tables).
fn reserve_depth(t: &Tables, srq: NonNull<SrqCore>, depth: u32) {
    let live = || t.qps.iter().filter_map(|&q| NonNull::new(q));
    let on = |q| {
        let g = qp(t, q);
        (g.srq == Some(srq)).then_some(g.recv_cq)
    };
    for (i, q) in live().enumerate() {
        let Some(cq) = on(q) else { continue };
        // Once per pair: at its first QP in the table.
        if live().take(i).any(|o| on(o) == Some(cq)) {
            continue;
        }
        let pair = || live().filter(move |&o| on(o) == Some(cq));
        let held: u32 = pair().map(|o| qp(t, o).srq_reserved).sum();
        // SAFETY: the CQ outlives the QPs that complete on it (create_qp's contract).
        let ring = unsafe { cq.as_ref() };
        if held < depth {
            let more = ring.reserve_srq(depth - held);
            qp(t, q).srq_reserved += more;
        } else {
            let mut over = held - depth;
            for o in pair() {
                let mut g = qp(t, o);
                let n = over.min(g.srq_reserved);
                if n != 0 {
                    g.srq_reserved -= n;
                    over -= n;
                    ring.release_srq(n);
                }
            }
        }
    }
}
