//! Shared receive queues (CREATE_SRQ / DESTROY_SRQ; `docs/pvrdma.md` §5.2, §8.4):
//! sized as a receive queue, its ring state at +8 of page 0.

use core::sync::atomic::{AtomicU32, Ordering};

use bareverbs_hal::Hal;

use super::abi::{self, opcode};
use super::layout::{QueueLayout, RQ_WQE_HDR, layout};
use super::pdir::QueueMem;
use super::ring::Ring;
use super::srq_slots::{SrqCounters, SrqSlot};
use super::{MAX_RING_PAGES, Pd, Pvrdma, regs};
use crate::dma::Dma;
use crate::error::{Error, Fault, Feature, Object, Op, Param, Result, Unsupported};
use crate::verbs::SrqAttr;

/// A shared receive queue on a PVRDMA device.
pub struct Srq<H: Hal> {
    handle: u32,
    pub(crate) attr: SrqAttr,
    pub(crate) layout: QueueLayout,
    mem: QueueMem<H>,
    /// The lock that makes posting exclusive.
    pub(crate) lock: spin::Mutex<()>,
    pub(crate) ring: Ring,
    /// QPs that receive from it.
    pub(crate) users: AtomicU32,
    /// Receives posted and completed (the credit is the ring minus the difference), and the
    /// per-slot record completions are matched against.
    pub(crate) counters: SrqCounters,
    /// Driver-private memory of the per-slot record (`SrqCounters`).
    _records: Dma<H>,
    /// Its PD (which it uses: it outlives the SRQ and does not move).
    pd: core::ptr::NonNull<Pd>,
    /// The limit last armed (MODIFY_SRQ), or given at creation: what a query answers when the
    /// device's own query is unusable.
    limit: AtomicU32,
}

// SAFETY: the ring points into the SRQ's own DMA memory, written only under `lock`.
unsafe impl<H: Hal + Send> Send for Srq<H> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync> Sync for Srq<H> {}

impl<H: Hal> Srq<H> {
    /// The device's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Pages of ring memory, the ring-state page included.
    pub fn pages(&self) -> usize {
        self.mem.data.pages()
    }

    /// WQE stride in bytes.
    pub fn stride(&self) -> u32 {
        self.layout.stride
    }
}

impl<H: Hal> Pvrdma<H> {
    pub(crate) fn srq_layout(&self, attr: &SrqAttr) -> Result<QueueLayout> {
        // The device's own limits: the page limit is applied on top.
        let c = &self.device_caps();
        let l = layout(
            (attr.max_wr, Param::SrqMaxWr, c.max_srq_wr),
            (attr.max_sge, Param::SrqMaxSge, c.max_srq_sge),
            RQ_WQE_HDR,
            MAX_RING_PAGES - 1,
        )?;
        if attr.srq_limit > attr.max_wr {
            return Err(Error::invalid(Param::SrqLimit, attr.srq_limit, attr.max_wr));
        }
        Ok(l)
    }

    pub(crate) fn create_srq_impl(&self, pd: &Pd, attr: &SrqAttr) -> Result<Srq<H>> {
        let op = Op::CreateSrq;
        let layout = self.srq_layout(attr)?;
        let mut st = self.state.lock();
        st.room_for(Object::Srq, self.caps.max_srq)?;
        let nchunks = 1 + layout.pages;
        let mem = QueueMem::new(&self.hal, nchunks as usize)?;
        let record_bytes = layout.slots as usize * size_of::<SrqSlot>();
        let records = Dma::new(&self.hal, record_bytes.div_ceil(bareverbs_hal::PAGE_SIZE))?;
        let actual = SrqAttr {
            max_wr: layout.slots,
            max_sge: layout.sge,
            srq_limit: attr.srq_limit,
        };
        let req: &mut abi::CreateSrq = st.chan.slot(opcode::CREATE_SRQ);
        (req.pdir_dma, req.pd_handle, req.nchunks) = (mem.pdir.paddr(), pd.handle, nchunks);
        let a = &mut req.attrs;
        (a.max_wr, a.max_sge, a.srq_limit) = (actual.max_wr, actual.max_sge, actual.srq_limit);
        if let Err((e, kept)) = st.run_create(&self.regs, Object::Srq, op, opcode::CREATE_SRQ) {
            if kept {
                // The device may have made it: its memory is kept, its PD stays busy for good.
                core::mem::forget((mem, records));
                pd.users.fetch_add(1, Ordering::Relaxed);
            }
            return Err(e);
        }
        let r: abi::CreateSrqResp = st.chan.answer();
        pd.users.fetch_add(1, Ordering::Relaxed);
        let srq = Srq {
            handle: r.srqn,
            attr: actual,
            layout,
            lock: spin::Mutex::new(()),
            ring: Ring::new(
                &mem.data,
                abi::RING_STATE_RX,
                1,
                layout.slots,
                layout.stride,
            ),
            users: AtomicU32::new(0),
            counters: SrqCounters::new(records.base().cast(), layout.slots),
            _records: records,
            pd: core::ptr::NonNull::from(pd),
            limit: AtomicU32::new(actual.srq_limit),
            mem,
        };
        if r.srqn > regs::db::HANDLE_MASK {
            // Garbage handle: the SRQ cannot be named, so neither used nor destroyed.
            core::mem::forget(srq);
            return Err(Error::bad_value(op, &"srqn", r.srqn));
        }
        Ok(srq)
    }

    pub(crate) fn destroy_srq_impl(&self, srq: Srq<H>) -> Result<(), (Srq<H>, Error)> {
        let users = srq.users.load(Ordering::Relaxed);
        if users != 0 {
            // A QP (perhaps one leaked with mem::forget) still receives from it.
            let e = Error::in_use(Op::DestroySrq, crate::error::Holder::Qps, users);
            return Err((srq, e));
        }
        let code = (Op::DestroySrq, opcode::DESTROY_SRQ);
        let (handle, pd) = (srq.handle, srq.pd);
        if let Err(e) = self
            .state
            .lock()
            .run_destroy(&self.regs, Object::Srq, code, handle)
        {
            return Err((srq, e));
        }
        // SAFETY: the PD outlived the SRQ until now and did not move (the provider contract
        // of create_srq).
        unsafe { pd.as_ref() }.users.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Whether `e` is the answer of a device that ran the handler acknowledged `other` for the
/// command sent: QEMU's MODIFY_SRQ/QUERY_SRQ swap (`docs/pvrdma.md` §5.2, §12 item 2).
fn swapped(e: &Error, other: u32) -> bool {
    matches!(e, Error::Protocol { fault: Fault::Ack { found, .. }, .. }
        if *found == opcode::ACK_BIT | other)
}

impl<H: Hal> Pvrdma<H> {
    /// MODIFY_SRQ with the LIMIT bit: arms the SRQ limit (0 disarms).
    ///
    /// QEMU's handler table swaps MODIFY_SRQ and QUERY_SRQ: MODIFY_SRQ runs its (read-only)
    /// query handler and acknowledges as QUERY_SRQ. That answer is recognised, remembered for
    /// the device, and reported as [`Feature::SrqModify`] unsupported; later modifies are
    /// refused without a command. (Arming through the other opcode would arm the host SRQ,
    /// but QEMU never posts the async event: the limit would never be reported.)
    pub(crate) fn modify_srq_impl(&self, srq: &Srq<H>, limit: u32) -> Result<()> {
        let op = Op::ModifySrq;
        if limit > srq.attr.max_wr {
            return Err(Error::invalid(Param::SrqLimit, limit, srq.attr.max_wr));
        }
        let unsupported = Error::Unsupported(Unsupported::Feature(Feature::SrqModify));
        let mut st = self.state.lock();
        if st.chan.srq_swapped {
            return Err(unsupported);
        }
        let fill = |r: &mut abi::ModifySrq| {
            (r.srq_handle, r.attr_mask) = (srq.handle, abi::srq_mask::LIMIT);
            r.attrs.srq_limit = limit;
        };
        match st.chan.command(&self.regs, (op, opcode::MODIFY_SRQ), fill) {
            Ok(()) => {
                srq.limit.store(limit, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if swapped(&e, opcode::QUERY_SRQ) => {
                st.chan.srq_swapped = true;
                log::warn!("bareverbs: MODIFY_SRQ answered as QUERY_SRQ (QEMU): unsupported");
                Err(unsupported)
            }
            Err(e) => Err(e),
        }
    }

    /// QUERY_SRQ: the device's answer; on a device whose query handler is another command's
    /// (QEMU, seen once), the driver's own knowledge: the actual size and SGEs, and the limit
    /// last armed or given at creation.
    pub(crate) fn query_srq_impl(&self, srq: &Srq<H>) -> Result<SrqAttr> {
        let op = Op::QuerySrq;
        let known = SrqAttr {
            srq_limit: srq.limit.load(Ordering::Relaxed),
            ..srq.attr
        };
        let mut st = self.state.lock();
        if st.chan.srq_swapped {
            return Ok(known);
        }
        let fill = |r: &mut abi::QuerySrq| r.srq_handle = srq.handle;
        match st
            .chan
            .exec::<_, abi::QuerySrqResp>(&self.regs, (op, opcode::QUERY_SRQ), fill)
        {
            Ok(r) => {
                let a = r.attrs;
                // A limit above the queue cannot be right (the device was told the size).
                if a.srq_limit > a.max_wr.max(srq.attr.max_wr) {
                    return Err(Error::bad_value(op, &"srq_limit", a.srq_limit));
                }
                srq.limit.store(a.srq_limit, Ordering::Relaxed);
                Ok(SrqAttr {
                    max_wr: a.max_wr,
                    max_sge: a.max_sge,
                    srq_limit: a.srq_limit,
                })
            }
            Err(e) if swapped(&e, opcode::MODIFY_SRQ) => {
                st.chan.srq_swapped = true;
                log::warn!("bareverbs: QUERY_SRQ answered as MODIFY_SRQ (QEMU): driver's values");
                Ok(known)
            }
            Err(e) => Err(e),
        }
    }
}
