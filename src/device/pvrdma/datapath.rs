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
use crate::verbs::{
    AccessFlags, RecvWr, SendFlags, SendOp, SendWr, Sge, WcFlags, WcOpcode, WcStatus,
    WorkCompletion,
};

/// A memory region on a PVRDMA device, with the memory it covers.
pub struct Mr<H: Hal> {
    handle: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) len: usize,
    pub(crate) mem: Dma<H>,
    _pdir: PageDir<H>,
}

impl<H: Hal> Mr<H> {
    /// The device's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }
}

/// A work-queue ring as the producer sees it: the ring-state words and the WQE slots, located
/// once when the queue is created (DMA memory never moves).
#[derive(Clone, Copy)]
pub(crate) struct RawRing {
    /// prod_tail; cons_head is the next word.
    state: NonNull<AtomicU32>,
    data: NonNull<u8>,
    slots: u32,
    /// log2 of the WQE stride.
    shift: u32,
}

impl RawRing {
    /// The ring of `l` in `mem`: state at byte `state`, WQEs from page `data_page`.
    pub(crate) fn new(
        mem: &Dma<impl Hal>,
        l: &QueueLayout,
        state: usize,
        data_page: usize,
    ) -> Self {
        // Checked once here: both state words and every slot lie inside `mem`.
        let _ = mem.atomic_u32(state + 4);
        let end = data_page * PAGE_SIZE + (l.slots * l.stride) as usize;
        assert!(
            l.slots == 0 || end <= mem.pages() * PAGE_SIZE,
            "ring outside its memory"
        );
        // SAFETY: offsets checked just above.
        let (st, data) = unsafe {
            (
                mem.base().add(state).cast::<AtomicU32>(),
                mem.base().add(data_page * PAGE_SIZE),
            )
        };
        RawRing {
            state: st,
            data,
            slots: l.slots.max(1),
            shift: l.stride.max(1).trailing_zeros(),
        }
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: checked in `new`; the memory lives as long as the queue.
        unsafe { self.state.as_ref() }
    }

    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as in `prod`: the word after it.
        unsafe { &*self.state.as_ptr().add(1) }
    }

    /// Free slots, from the driver's tail and the device's head; the head is checked.
    #[inline]
    fn free(&self, tail: u32, op: Op) -> Result<u32> {
        let head = self.cons().load(Ordering::Acquire);
        let used = tail.wrapping_sub(head) & (2 * self.slots - 1);
        if head >= 2 * self.slots || used > self.slots {
            return Err(Error::bad_value(op, "ring cons_head", head));
        }
        Ok(self.slots - used)
    }

    /// The WQE of index `idx`, masked to a slot.
    #[inline]
    fn wqe(&self, idx: u32) -> *mut u8 {
        // SAFETY: slot < slots, and slots · stride bytes lie inside the memory (`new`).
        unsafe {
            self.data
                .as_ptr()
                .add(((idx & (self.slots - 1)) as usize) << self.shift)
        }
    }

    #[inline]
    fn next(&self, idx: u32) -> u32 {
        (idx + 1) & (2 * self.slots - 1)
    }

    /// Publishes the WQEs up to `tail`.
    #[inline]
    fn publish(&self, tail: u32) {
        // The WQEs must be visible to the device before the index that announces them.
        self.prod().store(tail, Ordering::Release);
    }
}

/// A completion queue's budget: CQEs that posted work requests will produce (`posted`) and CQEs
/// polled (`polled`), both wrapping counters. The device drops CQEs silently when a CQ is
/// full, so posts that could overflow it are refused.
pub(crate) struct CqBudget {
    posted: AtomicU32,
    polled: AtomicU32,
    entries: u32,
}

impl CqBudget {
    pub(crate) fn new(entries: u32) -> Self {
        CqBudget {
            posted: AtomicU32::new(0),
            polled: AtomicU32::new(0),
            entries,
        }
    }

    /// CQEs still to come.
    pub(crate) fn pending(&self) -> u32 {
        let p = self.posted.load(Ordering::Relaxed);
        p.wrapping_sub(self.polled.load(Ordering::Relaxed))
    }

    #[inline]
    fn reserve(&self, n: u32) -> Result<()> {
        let before = self.posted.fetch_add(n, Ordering::Relaxed);
        let outstanding = before.wrapping_sub(self.polled.load(Ordering::Relaxed));
        if outstanding.wrapping_add(n) > self.entries || outstanding > self.entries {
            // (A device that produced more CQEs than were posted makes `outstanding` wrap: the
            // budget then refuses everything — failing safe.)
            self.posted.fetch_sub(n, Ordering::Relaxed);
            let free = self.entries.saturating_sub(outstanding);
            return Err(Error::QueueFull {
                queue: Queue::Cq,
                free,
            });
        }
        Ok(())
    }

    #[inline]
    fn unreserve(&self, n: u32) {
        self.posted.fetch_sub(n, Ordering::Relaxed);
    }

    /// Only the poller (under the CQ's poll lock) adds here.
    #[inline]
    fn take(&self, n: u32) {
        let p = self.polled.load(Ordering::Relaxed);
        self.polled.store(p.wrapping_add(n), Ordering::Relaxed);
    }
}

/// A volatile store to one field of a WQE or CQE.
macro_rules! put {
    ($p:expr, $field:ident, $v:expr) => {
        core::ptr::addr_of_mut!((*$p).$field).write_volatile($v)
    };
}

/// Writes the SGEs of a WQE at `p`.
///
/// # Safety
///
/// `p` points at the SGE array of a WQE whose stride holds `sges.len()` entries.
#[inline]
unsafe fn write_sges(p: *mut u8, sges: &[Sge]) {
    let e = p.cast::<abi::WqeSge>();
    for (i, s) in sges.iter().enumerate() {
        // SAFETY: the caller's contract: room for every entry.
        unsafe {
            put!(e.add(i), addr, s.addr);
            put!(e.add(i), length, s.length);
            put!(e.add(i), lkey, s.lkey);
        }
    }
}

impl<H: Hal> Pvrdma<H> {
    /// Full barrier, then the doorbell. The ring index store must reach memory before the
    /// device, woken by the uncached doorbell write, reads it.
    fn ring_doorbell(&self, offset: usize, value: u32) {
        fence(Ordering::SeqCst);
        self.uar.write32(offset, value);
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

    /// # Safety
    ///
    /// The buffers named stay valid until their completions (the provider contract).
    pub(crate) unsafe fn post_send_impl(&self, qp: &mut Qp<H>, wrs: &[SendWr<'_>]) -> Result<()> {
        let op = Op::PostSend;
        let n = wrs.len() as u32;
        if n == 0 {
            return Ok(());
        }
        let ring = qp.sq_ring;
        let free = ring.free(qp.sq_tail, op)?;
        if n > free {
            return Err(Error::QueueFull {
                queue: Queue::Send,
                free,
            });
        }
        // SAFETY: the CQ outlives the QP (the provider contract of create_qp).
        let budget = unsafe { qp.send_cq.as_ref() };
        budget.reserve(n)?;
        // WQEs are written past the published index, where the device does not look: a request
        // refused half-way leaves the ring as it was.
        let mut tail = qp.sq_tail;
        for w in wrs {
            if let Err(e) = self.write_send(qp, w, tail) {
                budget.unreserve(n);
                return Err(e);
            }
            tail = ring.next(tail);
        }
        ring.publish(tail);
        qp.sq_tail = tail;
        self.ring_doorbell(db::QP, qp.handle() | db::QP_SEND);
        Ok(())
    }

    /// Checks one send request and writes its WQE at index `idx` of the send ring.
    #[inline]
    fn write_send(&self, qp: &Qp<H>, w: &SendWr<'_>, idx: u32) -> Result<()> {
        let nsge = w.sg_list.len();
        if nsge > qp.sq.sge as usize {
            return Err(Error::invalid(Param::NumSge, nsge as u64, qp.sq.sge));
        }
        if w.flags.contains(SendFlags::INLINE) {
            return Err(Error::Unsupported(Unsupported::Feature(
                Feature::InlineData,
            )));
        }
        let datagram = qp.datagram;
        let (code, imm, remote) = match w.op {
            SendOp::Send => (wr_opcode::SEND, 0, None),
            SendOp::SendWithImm(imm) => (wr_opcode::SEND_WITH_IMM, imm, None),
            _ if datagram => {
                let f = Feature::OpcodeForQpType;
                return Err(Error::Unsupported(Unsupported::Feature(f)));
            }
            SendOp::RdmaWrite { remote_addr, rkey } => {
                (wr_opcode::RDMA_WRITE, 0, Some((remote_addr, rkey)))
            }
            SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => (
                wr_opcode::RDMA_WRITE_WITH_IMM,
                imm,
                Some((remote_addr, rkey)),
            ),
            SendOp::RdmaRead { remote_addr, rkey } => {
                (wr_opcode::RDMA_READ, 0, Some((remote_addr, rkey)))
            }
            // The device advertises no atomics (QEMU: atomic_ops = 0).
            SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. } => {
                return Err(Error::Unsupported(Unsupported::Feature(Feature::Atomics)));
            }
        };
        let ud = match (datagram, w.ud) {
            (true, None) => {
                return Err(Error::MissingAttribute {
                    op: Op::PostSend,
                    attr: Attr::UdDest,
                });
            }
            (true, Some(ud)) => Some(ud),
            (false, _) => None,
        };
        // Every send WQE completes on PVRDMA (QEMU ignores the flag); saying so keeps the CQ
        // budget exact.
        let mut flags = send_flags::SIGNALED;
        if w.flags.contains(SendFlags::FENCE) {
            flags |= send_flags::FENCE;
        }
        if w.flags.contains(SendFlags::SOLICITED) {
            flags |= send_flags::SOLICITED;
        }
        let h = qp.sq_ring.wqe(idx).cast::<abi::SqWqeHdr>();
        // SAFETY: `h` is this slot's WQE, inside the ring and not published yet; the stride
        // holds the header and max_send_sge SGEs, and the count was checked above.
        unsafe {
            put!(h, wr_id, w.wr_id);
            put!(h, num_sge, nsge as u32);
            put!(h, total_len, 0);
            put!(h, opcode, code);
            put!(h, send_flags, flags);
            put!(h, ex, imm);
            let wr = core::ptr::addr_of_mut!((*h).wr).cast::<u32>();
            if let Some((addr, rkey)) = remote {
                wr.add(wr::REMOTE_ADDR).cast::<u64>().write_unaligned(addr);
                wr.add(wr::RDMA_RKEY).write_volatile(rkey);
            }
            // QEMU reads the source GID index at byte 0x41 for every QP type (§8.6).
            let mut gid_word = u32::from(qp.sgid_index) << 8;
            if let Some(ud) = ud {
                let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
                    qp.qkey
                } else {
                    ud.remote_qkey
                };
                wr.add(wr::UD_REMOTE_QPN).write_volatile(ud.remote_qpn);
                wr.add(wr::UD_REMOTE_QKEY).write_volatile(qkey);
                wr.add(wr::AV_PORT_PD)
                    .write_volatile(qp.pd_handle | (1 << 24));
                let tf = (u32::from(ud.av.traffic_class) << 20) | (ud.av.flow_label & 0xF_FFFF);
                wr.add(wr::AV_SL_TCLASS_FLOW).write_volatile(tf);
                wr.add(wr::AV_DGID)
                    .cast::<[u8; 16]>()
                    .write_unaligned(ud.av.dgid.0);
                gid_word =
                    (u32::from(ud.av.hop_limit) << 24) | (u32::from(ud.av.sgid_index) << 8) | 0x80;
            }
            wr.add(wr::AV_GID_WORD).write_volatile(gid_word);
            write_sges(h.cast::<u8>().add(size_of::<abi::SqWqeHdr>()), w.sg_list);
        }
        Ok(())
    }

    /// Writes receive WQEs to `ring` from `tail`; returns the new tail.
    ///
    /// # Safety
    ///
    /// `ring` is a receive ring whose stride holds `max_sge` SGEs, and every request has at
    /// most `max_sge` (checked by the caller).
    #[inline]
    unsafe fn write_recvs(ring: &RawRing, mut tail: u32, wrs: &[RecvWr<'_>]) -> u32 {
        for w in wrs {
            let h = ring.wqe(tail).cast::<abi::RqWqeHdr>();
            // SAFETY: this slot's WQE, not yet published; the stride holds the header and the
            // SGEs (caller).
            unsafe {
                put!(h, wr_id, w.wr_id);
                put!(h, num_sge, w.sg_list.len() as u32);
                write_sges(h.cast::<u8>().add(size_of::<abi::RqWqeHdr>()), w.sg_list);
            }
            tail = ring.next(tail);
        }
        tail
    }

    #[inline]
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
        let ring = qp.rq_ring;
        let free = ring.free(qp.rq_tail, Op::PostRecv)?;
        if n > free {
            return Err(Error::QueueFull {
                queue: Queue::Recv,
                free,
            });
        }
        // SAFETY: the CQ outlives the QP (the provider contract of create_qp).
        unsafe { qp.recv_cq.as_ref() }.reserve(n)?;
        // SAFETY: the QP's receive ring; SGE counts checked above.
        let tail = unsafe { Self::write_recvs(&ring, qp.rq_tail, wrs) };
        ring.publish(tail);
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
        let ring = srq.ring;
        let tail0 = srq.tail.load(Ordering::Relaxed);
        let free = ring.free(tail0, op)?;
        if wrs.len() as u32 > free {
            return Err(Error::QueueFull {
                queue: Queue::Srq,
                free,
            });
        }
        // SAFETY: the SRQ's ring; SGE counts checked above.
        let tail = unsafe { Self::write_recvs(&ring, tail0, wrs) };
        ring.publish(tail);
        srq.tail.store(tail, Ordering::Relaxed);
        self.ring_doorbell(db::SRQ, srq.handle() | db::SRQ_RECV);
        Ok(())
    }

    #[inline]
    pub(crate) fn poll_cq_impl(
        &self,
        cq: &Cq<H>,
        only: Option<u32>,
        out: &mut [WorkCompletion],
    ) -> Result<usize> {
        // The empty case, without the lock: the indices are atomics and a racing poller can
        // only make this poll find nothing, as any poll may.
        let ring = &cq.ring;
        let head = ring.cons().load(Ordering::Relaxed);
        if ring.prod().load(Ordering::Acquire) == head {
            // Looks empty: let the device harvest what it has, then look again (§10.3).
            self.uar.write32(db::CQ, cq.handle | db::CQ_POLL);
            if ring.prod().load(Ordering::Acquire) == head {
                return Ok(0);
            }
        }
        self.harvest(cq, only, out)
    }

    /// Takes the CQEs that are there (the CQ is not empty, or was not a moment ago).
    #[inline(never)]
    fn harvest(&self, cq: &Cq<H>, only: Option<u32>, out: &mut [WorkCompletion]) -> Result<usize> {
        let op = Op::PollCq;
        let _guard = cq.poll_lock.try_lock().ok_or(Error::Busy { op })?;
        let ring = &cq.ring;
        let (n, mask2) = (ring.slots, 2 * ring.slots - 1);
        let mut head = ring.cons().load(Ordering::Relaxed);
        let tail = ring.prod().load(Ordering::Acquire);
        if tail > mask2 || (tail.wrapping_sub(head) & mask2) > n {
            return Err(Error::bad_value(op, "CQ prod_tail", tail));
        }
        let mut count = 0;
        while count < out.len() && head != tail {
            let c = ring.wqe(head).cast::<abi::Cqe>();
            // SAFETY: a CQE slot of the ring (masked index), published by the prod_tail read
            // (acquire) above; every field is read as plain data.
            let wc = unsafe { read_cqe(c) };
            match wc {
                Ok(wc) if only.is_some_and(|q| q != wc.qp_num) => break,
                Ok(wc) => out[count] = wc,
                // A CQE that cannot be right: first return the good ones before it; when it is
                // first, consume it (so the CQ can go on) and report it.
                Err(_) if count > 0 => break,
                Err(e) => {
                    ring.cons().store((head + 1) & mask2, Ordering::Release);
                    cq.budget.take(1);
                    return Err(e);
                }
            }
            head = (head + 1) & mask2;
            count += 1;
        }
        // The CQEs were read before their slots are handed back.
        ring.cons().store(head, Ordering::Release);
        cq.budget.take(count as u32);
        Ok(count)
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

/// Reads a CQE as a work completion; values outside the ABI are an error, never trusted.
///
/// # Safety
///
/// `c` points at a CQE in the ring's memory.
#[inline]
unsafe fn read_cqe(c: *const abi::Cqe) -> Result<WorkCompletion> {
    macro_rules! get {
        ($f:ident) => {
            // SAFETY: the caller's contract.
            unsafe { core::ptr::addr_of!((*c).$f).read_volatile() }
        };
    }
    let op = Op::PollCq;
    let raw_op = get!(opcode);
    let opcode = match raw_op {
        wc_opcode::SEND => WcOpcode::Send,
        wc_opcode::RDMA_WRITE => WcOpcode::RdmaWrite,
        wc_opcode::RDMA_READ => WcOpcode::RdmaRead,
        wc_opcode::COMP_SWAP => WcOpcode::CompSwap,
        wc_opcode::FETCH_ADD => WcOpcode::FetchAdd,
        wc_opcode::RECV => WcOpcode::Recv,
        wc_opcode::RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        other => return Err(Error::bad_value(op, "CQE opcode", other)),
    };
    // CQE status values are InfiniBand's (L-ABI `enum pvrdma_wc_status`).
    let raw_status = get!(status);
    let status = WcStatus::from_raw(raw_status)
        .ok_or_else(|| Error::bad_value(op, "CQE status", raw_status))?;
    // QEMU passes the host's flags: bits 0–1 agree with PVRDMA's, the rest do not (§10.1).
    let flags = WcFlags::from_bits_truncate(get!(wc_flags) & 0x3);
    Ok(WorkCompletion {
        wr_id: get!(wr_id),
        status,
        opcode,
        byte_len: get!(byte_len),
        imm: if flags.contains(WcFlags::WITH_IMM) {
            get!(imm_data)
        } else {
            0
        },
        qp_num: get!(qp) as u32 & db::HANDLE_MASK,
        src_qp: get!(src_qp),
        flags,
        vendor_err: get!(vendor_err),
    })
}
