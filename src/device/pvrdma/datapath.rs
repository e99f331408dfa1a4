//! The data path: memory regions, posting to the send/receive/shared-receive rings, polling
//! and arming completion queues.
//!
//! Rings (L-RING, Q-RING; `shared/pvrdma-abi.md` §7, §9, §10): N slots (a power of two),
//! indices modulo 2N; the driver produces WQEs and the device consumes them; the device produces
//! CQEs and the driver consumes them. Producer: WQEs → release → prod_tail → full barrier →
//! doorbell (one per batch). Consumer: prod_tail (acquire) → CQEs → cons_head (release). Every
//! index the device wrote is checked before use; slots are always `index & (N − 1)`.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering, fence};

use bareverbs_hal::{Hal, Mmio, PAGE_SIZE};

use super::abi::{self, opcode, send_flags, wc_opcode, wr, wr_opcode};
use super::pdir::{self, PageDir};
use super::qp::{Qp, QueueLayout, Srq, pvrdma_access};
use super::regs::db;
use super::{Cq, Pd, Pvrdma};
use crate::dma::Dma;
use crate::error::{Attr, Error, Feature, Object, Op, Param, Queue, Result, Unsupported};
use crate::verbs::types::bad_value;
use crate::verbs::{
    AccessFlags, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, WcFlags, WcOpcode, WcStatus,
    WorkCompletion,
};

/// A memory region on a PVRDMA device, with the memory it covers.
pub struct Mr<H: Hal> {
    handle: u32,
    lkey: u32,
    rkey: u32,
    len: usize,
    mem: Dma<H>,
    _pdir: PageDir<H>,
}

impl<H: Hal> Mr<H> {
    /// The device's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }
}

/// One producer ring: slots, stride, where page 0's state and the first WQE are.
struct Ring {
    slots: u32,
    stride: usize,
    state: usize,
    data: usize,
}

impl Ring {
    fn of(l: &QueueLayout, state: usize, data_page: usize) -> Self {
        Ring {
            slots: l.slots,
            stride: l.stride as usize,
            state,
            data: data_page * PAGE_SIZE,
        }
    }

    /// Free slots, from the driver's tail and the device's head; the head is checked.
    fn free(&self, mem: &Dma<impl Hal>, tail: u32, op: Op) -> Result<u32> {
        let head = mem.atomic_u32(self.state + 4).load(Ordering::Acquire);
        let used = tail.wrapping_sub(head) & (2 * self.slots - 1);
        if head >= 2 * self.slots || used > self.slots {
            return Err(bad_value(op, "ring cons_head", head));
        }
        Ok(self.slots - used)
    }

    /// Pointer to the WQE for index `idx` (masked to a slot).
    fn wqe(&self, base: NonNull<u8>, idx: u32) -> *mut u8 {
        let off = self.data + (idx & (self.slots - 1)) as usize * self.stride;
        // SAFETY: slot < slots and slots · stride ≤ the ring's pages (the layout), so the
        // offset lies inside the queue's memory.
        unsafe { base.as_ptr().add(off) }
    }

    /// Publishes the WQEs up to `tail`.
    fn publish(&self, mem: &Dma<impl Hal>, tail: u32) {
        // The WQEs must be visible to the device before the index that announces them.
        mem.atomic_u32(self.state).store(tail, Ordering::Release);
    }
}

/// Writes the SGEs of a WQE at `p`.
///
/// # Safety
///
/// `p` points at the SGE array of a WQE whose stride holds `sges.len()` entries.
unsafe fn write_sges(p: *mut u8, sges: &[Sge]) {
    for (i, s) in sges.iter().enumerate() {
        let e = abi::WqeSge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
        // SAFETY: the caller's contract: room for every entry.
        unsafe { p.cast::<abi::WqeSge>().add(i).write_volatile(e) };
    }
}

impl<H: Hal> Pvrdma<H> {
    /// Full barrier, then the doorbell. The ring index store must reach memory before the
    /// device, woken by the uncached doorbell write, reads it.
    fn ring_doorbell(&self, offset: usize, value: u32) {
        fence(Ordering::SeqCst);
        self.uar.write32(offset, value);
    }

    /// Reserves `n` completion slots of the CQ whose counter is `pending` (holding `entries`):
    /// the device drops CQEs silently when a CQ is full.
    fn reserve_cqes(pending: &AtomicU32, entries: u32, n: u32) -> Result<()> {
        let before = pending.fetch_add(n, Ordering::Relaxed);
        if before + n > entries {
            pending.fetch_sub(n, Ordering::Relaxed);
            let free = entries.saturating_sub(before);
            return Err(Error::QueueFull {
                queue: Queue::Cq,
                free,
            });
        }
        Ok(())
    }

    pub(crate) fn create_mr_impl(&self, pd: &Pd, len: usize, access: AccessFlags) -> Result<Mr<H>> {
        let op = Op::CreateMr;
        let max = self
            .caps
            .max_mr_size
            .min((pdir::MAX_PAGES * PAGE_SIZE) as u64);
        if len as u64 > max {
            return Err(Error::invalid(Param::MrLength, len as u64, max));
        }
        let pages = len.div_ceil(PAGE_SIZE);
        let mut st = self.state.lock();
        st.room_for(Object::Mr, self.caps.max_mr)?;
        let mem = Dma::new(&self.hal, pages)?;
        let pdir = PageDir::new(&self.hal, &mem)?;
        let req = abi::CreateMr {
            start: mem.paddr(),
            length: len as u64,
            pdir_dma: pdir.paddr(),
            pd_handle: pd.handle(),
            access_flags: pvrdma_access(access),
            flags: 0,
            nchunks: pages as u32,
            ..Default::default()
        };
        let code = (op, opcode::CREATE_MR);
        let (r, (mem, pdir)): (abi::CreateMrResp, _) =
            st.create(&self.regs, Object::Mr, code, req, (mem, pdir))?;
        Ok(Mr {
            handle: r.mr_handle,
            lkey: r.lkey,
            rkey: r.rkey,
            len,
            mem,
            _pdir: pdir,
        })
    }

    pub(crate) fn destroy_mr_impl(&self, mr: Mr<H>) -> Result<(), (Mr<H>, Error)> {
        let code = (Op::DestroyMr, opcode::DESTROY_MR);
        let handle = mr.handle;
        self.state
            .lock()
            .destroy(&self.regs, Object::Mr, code, handle, mr)
    }

    pub(crate) fn mr_info_of(mr: &Mr<H>) -> (u64, usize, u32, u32) {
        (mr.mem.paddr(), mr.len, mr.lkey, mr.rkey)
    }

    pub(crate) fn mr_ptr_of(mr: &Mr<H>) -> NonNull<u8> {
        mr.mem.base()
    }

    /// # Safety
    ///
    /// The buffers named stay valid until their completions (the provider contract).
    pub(crate) unsafe fn post_send_impl(&self, qp: &mut Qp<H>, wrs: &[SendWr<'_>]) -> Result<()> {
        let op = Op::PostSend;
        let n = wrs.len() as u32;
        if n == 0 {
            return Ok(());
        }
        let datagram = matches!(qp.qp_type, QpType::Ud | QpType::Gsi);
        for w in wrs {
            if w.sg_list.len() > qp.sq.sge as usize {
                return Err(Error::invalid(
                    Param::NumSge,
                    w.sg_list.len() as u64,
                    qp.sq.sge,
                ));
            }
            if w.flags.contains(SendFlags::INLINE) {
                return Err(Error::Unsupported(Unsupported::Feature(
                    Feature::InlineData,
                )));
            }
            match (w.op, datagram) {
                (SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }, _) => {
                    // The device advertises no atomics (QEMU: atomic_ops = 0).
                    return Err(Error::Unsupported(Unsupported::Feature(Feature::Atomics)));
                }
                (SendOp::Send | SendOp::SendWithImm(_), true) if w.ud.is_none() => {
                    return Err(Error::MissingAttribute {
                        op,
                        attr: Attr::UdDest,
                    });
                }
                (SendOp::Send | SendOp::SendWithImm(_), _) | (_, false) => {}
                (_, true) => {
                    let f = Feature::OpcodeForQpType;
                    return Err(Error::Unsupported(Unsupported::Feature(f)));
                }
            }
        }
        let ring = Ring::of(&qp.sq, abi::RING_STATE_TX, 1);
        let mem = &qp.mem.data;
        let free = ring.free(mem, qp.sq_tail, op)?;
        if n > free {
            return Err(Error::QueueFull {
                queue: Queue::Send,
                free,
            });
        }
        // SAFETY: the CQ outlives the QP (the provider contract of create_qp).
        let (pending, entries) = unsafe { (qp.send_cq.0.as_ref(), qp.send_cq.1) };
        Self::reserve_cqes(pending, entries, n)?;

        let base = mem.base();
        let mut tail = qp.sq_tail;
        for w in wrs {
            let mut h = abi::SqWqeHdr {
                wr_id: w.wr_id,
                num_sge: w.sg_list.len() as u32,
                // Every send WQE completes on PVRDMA (QEMU ignores the flag); saying so keeps
                // the CQ budget exact.
                send_flags: send_flags::SIGNALED
                    | if w.flags.contains(SendFlags::FENCE) {
                        send_flags::FENCE
                    } else {
                        0
                    }
                    | if w.flags.contains(SendFlags::SOLICITED) {
                        send_flags::SOLICITED
                    } else {
                        0
                    },
                ..Default::default()
            };
            let (code, imm) = match w.op {
                SendOp::Send => (wr_opcode::SEND, 0),
                SendOp::SendWithImm(imm) => (wr_opcode::SEND_WITH_IMM, imm),
                SendOp::RdmaWrite { remote_addr, rkey } => {
                    h.wr[wr::REMOTE_ADDR] = remote_addr as u32;
                    h.wr[wr::REMOTE_ADDR + 1] = (remote_addr >> 32) as u32;
                    h.wr[wr::RDMA_RKEY] = rkey;
                    (wr_opcode::RDMA_WRITE, 0)
                }
                SendOp::RdmaWriteWithImm {
                    remote_addr,
                    rkey,
                    imm,
                } => {
                    h.wr[wr::REMOTE_ADDR] = remote_addr as u32;
                    h.wr[wr::REMOTE_ADDR + 1] = (remote_addr >> 32) as u32;
                    h.wr[wr::RDMA_RKEY] = rkey;
                    (wr_opcode::RDMA_WRITE_WITH_IMM, imm)
                }
                SendOp::RdmaRead { remote_addr, rkey } => {
                    h.wr[wr::REMOTE_ADDR] = remote_addr as u32;
                    h.wr[wr::REMOTE_ADDR + 1] = (remote_addr >> 32) as u32;
                    h.wr[wr::RDMA_RKEY] = rkey;
                    (wr_opcode::RDMA_READ, 0)
                }
                // Refused above.
                SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. } => (0, 0),
            };
            h.opcode = code;
            h.ex = imm;
            let mut gid_index = qp.sgid_index;
            if let (true, Some(ud)) = (datagram, w.ud) {
                h.wr[wr::UD_REMOTE_QPN] = ud.remote_qpn;
                h.wr[wr::UD_REMOTE_QKEY] = if ud.remote_qkey & 0x8000_0000 != 0 {
                    qp.qkey
                } else {
                    ud.remote_qkey
                };
                h.wr[wr::AV_PORT_PD] = qp.pd_handle | (1 << 24);
                h.wr[wr::AV_SL_TCLASS_FLOW] =
                    (u32::from(ud.av.traffic_class) << 20) | (ud.av.flow_label & 0xF_FFFF);
                for (k, c) in ud.av.dgid.0.chunks_exact(4).enumerate() {
                    h.wr[wr::AV_DGID + k] = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
                gid_index = ud.av.sgid_index;
                h.wr[wr::AV_GID_WORD] = (u32::from(ud.av.hop_limit) << 24) | 0x80;
            }
            // QEMU reads the source GID index at byte 0x41 for every QP type (§8.6).
            h.wr[wr::AV_GID_WORD] |= u32::from(gid_index) << 8;
            let p = ring.wqe(base, tail);
            // SAFETY: `p` is this slot's WQE (inside the ring); the stride holds the header and
            // max_send_sge SGEs, and the count was checked against max_send_sge.
            unsafe {
                p.cast::<abi::SqWqeHdr>().write_volatile(h);
                write_sges(p.add(size_of::<abi::SqWqeHdr>()), w.sg_list);
            }
            tail = (tail + 1) & (2 * ring.slots - 1);
        }
        ring.publish(mem, tail);
        qp.sq_tail = tail;
        self.ring_doorbell(db::QP, qp.handle() | db::QP_SEND);
        Ok(())
    }

    /// Writes receive WQEs to `ring` in `mem` from `tail`; returns the new tail.
    ///
    /// # Safety
    ///
    /// `ring` describes `mem`; every request has at most `max_sge` entries (checked by the
    /// caller against the ring's stride).
    unsafe fn write_recvs(ring: &Ring, mem: &Dma<H>, mut tail: u32, wrs: &[RecvWr<'_>]) -> u32 {
        let base = mem.base();
        for w in wrs {
            let h = abi::RqWqeHdr {
                wr_id: w.wr_id,
                num_sge: w.sg_list.len() as u32,
                total_len: 0,
            };
            let p = ring.wqe(base, tail);
            // SAFETY: this slot's WQE; the stride holds the header and the SGEs (caller).
            unsafe {
                p.cast::<abi::RqWqeHdr>().write_volatile(h);
                write_sges(p.add(size_of::<abi::RqWqeHdr>()), w.sg_list);
            }
            tail = (tail + 1) & (2 * ring.slots - 1);
        }
        tail
    }

    fn check_recvs(wrs: &[RecvWr<'_>], max_sge: u32) -> Result<()> {
        match wrs.iter().find(|w| w.sg_list.len() > max_sge as usize) {
            Some(w) => Err(Error::invalid(
                Param::NumSge,
                w.sg_list.len() as u64,
                max_sge,
            )),
            None => Ok(()),
        }
    }

    /// # Safety
    ///
    /// The buffers named stay valid until their completions (the provider contract).
    pub(crate) unsafe fn post_recv_impl(&self, qp: &mut Qp<H>, wrs: &[RecvWr<'_>]) -> Result<()> {
        let op = Op::PostRecv;
        if qp.has_srq {
            // Receives go to the SRQ; QEMU would read past its allocation (§12.3).
            return Err(Error::QueueFull {
                queue: Queue::Recv,
                free: 0,
            });
        }
        let n = wrs.len() as u32;
        if n == 0 {
            return Ok(());
        }
        Self::check_recvs(wrs, qp.rq.sge)?;
        let ring = Ring::of(&qp.rq, abi::RING_STATE_RX, 1 + qp.sq.pages as usize);
        let mem = &qp.mem.data;
        let free = ring.free(mem, qp.rq_tail, op)?;
        if n > free {
            return Err(Error::QueueFull {
                queue: Queue::Recv,
                free,
            });
        }
        // SAFETY: the CQ outlives the QP (the provider contract of create_qp).
        let (pending, entries) = unsafe { (qp.recv_cq.0.as_ref(), qp.recv_cq.1) };
        Self::reserve_cqes(pending, entries, n)?;
        // SAFETY: the ring is the QP's receive queue; SGE counts checked above.
        let tail = unsafe { Self::write_recvs(&ring, mem, qp.rq_tail, wrs) };
        ring.publish(mem, tail);
        qp.rq_tail = tail;
        self.ring_doorbell(db::QP, qp.handle() | db::QP_RECV);
        Ok(())
    }

    /// # Safety
    ///
    /// The buffers named stay valid until their completions (the provider contract).
    pub(crate) unsafe fn post_srq_recv_impl(&self, srq: &Srq<H>, wrs: &[RecvWr<'_>]) -> Result<()> {
        let op = Op::PostRecv;
        Self::check_recvs(wrs, srq.layout.sge)?;
        let _guard = srq.lock.try_lock().ok_or(Error::Busy { op })?;
        let ring = Ring::of(&srq.layout, abi::RING_STATE_RX, 1);
        let mem = srq.data();
        let tail0 = srq.tail.load(Ordering::Relaxed);
        let free = ring.free(mem, tail0, op)?;
        if wrs.len() as u32 > free {
            return Err(Error::QueueFull {
                queue: Queue::Srq,
                free,
            });
        }
        // SAFETY: the ring is the SRQ's; SGE counts checked above.
        let tail = unsafe { Self::write_recvs(&ring, mem, tail0, wrs) };
        ring.publish(mem, tail);
        srq.tail.store(tail, Ordering::Relaxed);
        self.ring_doorbell(db::SRQ, srq.handle() | db::SRQ_RECV);
        Ok(())
    }

    pub(crate) fn poll_cq_impl(
        &self,
        cq: &Cq<H>,
        only: Option<u32>,
        out: &mut [WorkCompletion],
    ) -> Result<usize> {
        let op = Op::PollCq;
        let _guard = cq.poll_lock.try_lock().ok_or(Error::Busy { op })?;
        let mem = &cq.mem.data;
        let (prod, cons) = (
            mem.atomic_u32(abi::RING_STATE_RX),
            mem.atomic_u32(abi::RING_STATE_RX + 4),
        );
        let n = cq.entries;
        let mask2 = 2 * n - 1;
        let mut head = cons.load(Ordering::Relaxed);
        let mut tail = prod.load(Ordering::Acquire);
        if tail == head {
            // Looks empty: let the device harvest what it has, then look again (§10.3).
            self.uar.write32(db::CQ, cq.handle() | db::CQ_POLL);
            tail = prod.load(Ordering::Acquire);
        }
        if tail > mask2 || (tail.wrapping_sub(head) & mask2) > n {
            return Err(bad_value(op, "CQ prod_tail", tail));
        }
        let base = mem.base();
        let mut count = 0;
        while count < out.len() && head != tail {
            let off = PAGE_SIZE + (head & (n - 1)) as usize * abi::CQE_SIZE;
            // SAFETY: slot < entries and the ring's pages hold `entries` CQEs; the CQE was
            // published by the prod_tail read (acquire) above.
            let c = unsafe { base.as_ptr().add(off).cast::<abi::Cqe>().read_volatile() };
            let qpn = c.qp as u32 & db::HANDLE_MASK;
            if only.is_some_and(|q| q != qpn) {
                break;
            }
            match decode(&c, qpn) {
                Ok(wc) => out[count] = wc,
                // A CQE that cannot be right: first return the good ones before it; when it is
                // first, consume it (so the CQ can go on) and report it.
                Err(_) if count > 0 => break,
                Err(e) => {
                    cons.store((head + 1) & mask2, Ordering::Release);
                    Self::consumed(cq, 1);
                    return Err(e);
                }
            }
            head = (head + 1) & mask2;
            count += 1;
        }
        // The CQEs were read before the slots are handed back.
        cons.store(head, Ordering::Release);
        Self::consumed(cq, count as u32);
        Ok(count)
    }

    /// `n` CQEs left the CQ: they no longer count against its budget.
    fn consumed(cq: &Cq<H>, n: u32) {
        let _ = cq
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                Some(p.saturating_sub(n))
            });
    }

    pub(crate) fn arm_cq_impl(&self, cq: &Cq<H>, solicited_only: bool) {
        // QEMU arms only when bits 30 and 29 are both set; bit 30 alone disarms (§9).
        let bits = if solicited_only {
            db::CQ_ARM_SOL
        } else {
            db::CQ_ARM | db::CQ_ARM_SOL
        };
        self.ring_doorbell(db::CQ, cq.handle() | bits);
    }
}

/// A CQE as a work completion; values outside the ABI are an error, never trusted.
fn decode(c: &abi::Cqe, qpn: u32) -> Result<WorkCompletion> {
    let op = Op::PollCq;
    let opcode = match c.opcode {
        wc_opcode::SEND => WcOpcode::Send,
        wc_opcode::RDMA_WRITE => WcOpcode::RdmaWrite,
        wc_opcode::RDMA_READ => WcOpcode::RdmaRead,
        wc_opcode::COMP_SWAP => WcOpcode::CompSwap,
        wc_opcode::FETCH_ADD => WcOpcode::FetchAdd,
        wc_opcode::RECV => WcOpcode::Recv,
        wc_opcode::RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        other => return Err(bad_value(op, "CQE opcode", other)),
    };
    let status =
        WcStatus::from_raw(c.status).ok_or_else(|| bad_value(op, "CQE status", c.status))?;
    // QEMU passes the host's flags: bits 0–1 agree with PVRDMA's, the rest do not (§10.1).
    let flags = WcFlags::from_bits_truncate(c.wc_flags & 0x3);
    Ok(WorkCompletion {
        wr_id: c.wr_id,
        status,
        opcode,
        byte_len: c.byte_len,
        imm: if flags.contains(WcFlags::WITH_IMM) {
            c.imm_data
        } else {
            0
        },
        qp_num: qpn,
        src_qp: c.src_qp,
        flags,
        vendor_err: c.vendor_err,
    })
}
