//! Queue sizing as the device computes it (L-QP `pvrdma_set_sq_size`/`pvrdma_set_rq_size`,
//! Q-CMD `create_qp_rings`, `docs/pvrdma.md` §6, §8.4): work-request counts are powers
//! of two (at least 1); scatter/gather counts at least 1; send WQE stride pow2(80 + 16·sge),
//! receive stride pow2(16 + 16·sge); each queue's data pages ≤ 128 (QEMU), SRQ pages ≤ 128
//! including its ring-state page.

use bareverbs_hal::PAGE_SIZE;

use crate::error::{Error, Param, Result};
use crate::verbs::QpCaps;

/// Send WQE header size (L-ABI `pvrdma_sq_wqe_hdr`).
pub(crate) const SQ_WQE_HDR: u32 = 80;
/// Receive WQE header size (L-ABI `pvrdma_rq_wqe_hdr`).
pub(crate) const RQ_WQE_HDR: u32 = 16;
/// Scatter/gather entry size (L-ABI `pvrdma_sge`).
const SGE_SIZE: u32 = 16;

/// Where each queue of a QP lives and how big it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueueLayout {
    /// Ring slots (a power of two; 0 for an absent receive queue).
    pub(crate) slots: u32,
    /// Scatter/gather entries per WQE.
    pub(crate) sge: u32,
    /// Bytes per WQE.
    pub(crate) stride: u32,
    /// Data pages.
    pub(crate) pages: u32,
}

impl QueueLayout {
    pub(crate) fn empty() -> Self {
        QueueLayout {
            slots: 0,
            sge: 0,
            stride: 0,
            pages: 0,
        }
    }
}

/// Lays out one work queue of `wr` requests of `sge` entries with `hdr`-byte headers, within
/// `max_wr`, `max_sge` and `max_pages` data pages; errors name the parameter and its limit.
pub(crate) fn layout(
    (wr, wr_param, max_wr): (u32, Param, u32),
    (sge, sge_param, max_sge): (u32, Param, u32),
    hdr: u32,
    max_pages: u32,
) -> Result<QueueLayout> {
    // The device's max_sge is only trusted as far as a WQE of that many SGEs fits the
    // driver's ring limit: a larger value must not grow (or overflow) the stride.
    let max_sge = max_sge.min((max_pages * PAGE_SIZE as u32 - hdr) / SGE_SIZE);
    if sge > max_sge {
        return Err(Error::invalid(sge_param, sge, max_sge));
    }
    let sge = sge.max(1);
    let stride = stride(hdr, sge);
    let limit = wr_limit(max_wr, stride, max_pages);
    if wr > limit {
        return Err(Error::invalid(wr_param, wr, limit));
    }
    let slots = wr.max(1).next_power_of_two();
    Ok(QueueLayout {
        slots,
        sge,
        stride,
        pages: (slots * stride).div_ceil(PAGE_SIZE as u32),
    })
}

/// The capacities a QP with these queues has (no inline data on PVRDMA).
pub(crate) fn caps_of(sq: &QueueLayout, rq: &QueueLayout) -> QpCaps {
    QpCaps {
        max_send_wr: sq.slots,
        max_recv_wr: rq.slots,
        max_send_sge: sq.sge,
        max_recv_sge: rq.sge,
        max_inline_data: 0,
    }
}

/// The largest power of two ≤ `n` (0 for 0).
pub(crate) fn prev_power_of_two(n: u32) -> u32 {
    if n == 0 {
        0
    } else {
        1 << (31 - n.leading_zeros())
    }
}

/// Bytes per WQE of `sge` (≥ 1, bounded by the caller) entries after an `hdr`-byte header: a
/// power of two.
fn stride(hdr: u32, sge: u32) -> u32 {
    (hdr + SGE_SIZE * sge).next_power_of_two()
}

/// The most work requests a queue of `stride`-byte WQEs takes: within the device's `max_wr`,
/// and a power-of-two ring that fits `max_pages` data pages.
fn wr_limit(max_wr: u32, stride: u32, max_pages: u32) -> u32 {
    max_wr.min(prev_power_of_two(max_pages * PAGE_SIZE as u32 / stride))
}

/// The most work requests a QP queue (send and receive alike) and an SRQ take at one SGE:
/// what the device's `max_qp_wr` / `max_srq_wr` mean in practice, with `max_pages` data pages
/// a queue.
pub(crate) fn creatable_wrs(c: &crate::verbs::DeviceCaps, max_pages: u32) -> (u32, u32) {
    let qp = |hdr| wr_limit(c.max_qp_wr, stride(hdr, 1), max_pages);
    let qp_wr = qp(SQ_WQE_HDR).min(qp(RQ_WQE_HDR));
    let srq_wr = wr_limit(c.max_srq_wr, stride(RQ_WQE_HDR, 1), max_pages - 1);
    (qp_wr, srq_wr)
}
