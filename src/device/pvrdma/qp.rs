//! Queue pairs on PVRDMA: the object, CREATE_QP and DESTROY_QP (state changes: `qp_state.rs`;
//! sizing: `layout.rs`). Page 0 of a QP's memory is the ring state (SQ at +0, RQ at +8), then
//! the send pages, then the receive pages (`docs/pvrdma.md` §6, §7, §8.4).

use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use bareverbs_hal::Hal;

use super::abi::{self, opcode};
use super::cq::{Cq, CqLocks};
use super::layout::{QueueLayout, RQ_WQE_HDR, SQ_WQE_HDR, caps_of, layout};
use super::pdir::QueueMem;
use super::qptable::QpCtlMem;
use super::ring::Producer;
use super::ring::Ring;
use super::srq::Srq;
use super::{MAX_RING_PAGES, Pd, Pvrdma, regs};
use crate::error::{EBUSY, Error, Feature, Object, Op, Param, Result, Unsupported};
use crate::verbs::{QpCaps, QpInit, QpState, QpType};

/// A queue pair on a PVRDMA device.
pub struct Qp<H: Hal> {
    pub(super) handle: u32,
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) caps: QpCaps,
    pub(super) sq_sig_all: bool,
    /// The state last commanded (QEMU only records RESET/ERR/SQD/SQE, §8.3).
    pub(super) state: QpState,
    /// The furthest state the host QP behind it reached (QEMU passes INIT/RTR/RTS to it but
    /// only records RESET and ERR, §8.3).
    pub(super) host: QpState,
    /// Outstanding RDMA reads/atomics as applied (`QpAttr::max_rd_atomic`, `_dest_`).
    pub(super) max_rd_atomic: u8,
    pub(super) max_dest_rd_atomic: u8,
    /// The device answered the create with a handle the driver cannot use.
    handle_unusable: bool,
    pub(crate) sq: QueueLayout,
    pub(crate) rq: QueueLayout,
    pub(crate) mem: QueueMem<H>,
    pub(crate) ctl: QpCtlMem<H>,
    pub(crate) sq_prod: Producer,
    pub(crate) rq_prod: Producer,
    /// The Q_Key last set (UD sends with a remote Q_Key of bit 31 use it).
    pub(crate) qkey: u32,
    /// The source GID index set at RTR (QEMU reads one in every send WQE).
    pub(crate) sgid_index: u8,
    pub(crate) pd_handle: u32,
    pub(crate) has_srq: bool,
    /// UD or GSI: sends carry an address vector.
    pub(crate) datagram: bool,
    pub(crate) sq_ring: Ring,
    pub(crate) rq_ring: Ring,
    /// The send and receive CQs, the SRQ and the PD (they outlive the QP and do not move: the
    /// provider contract of create_qp).
    send_cq: NonNull<Cq<H>>,
    recv_cq: NonNull<Cq<H>>,
    srq: Option<NonNull<Srq<H>>>,
    pd: NonNull<Pd>,
    /// CQEs reserved on the send and receive CQ for the QP's life: a work queue's depth when
    /// it fit the CQ at creation (0 for a metered queue, whose requests take room as they are
    /// posted).
    reserved: (u32, u32),
}

// SAFETY: the CQ/SRQ/PD pointers name objects that outlive the QP (the provider contract of
// create_qp), touched only through their locks and atomics; the rings and the control block
// are the QP's own memory, written through `&mut Qp` or atomically.
unsafe impl<H: Hal + Send> Send for Qp<H> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync> Sync for Qp<H> {}

impl<H: Hal> Qp<H> {
    /// The device's handle (the QP number on devices below version 20), as doorbells and
    /// completions name it.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Pages of ring memory, the ring-state page included.
    pub fn pages(&self) -> usize {
        self.mem.data.pages()
    }

    /// Send and receive queue data pages, as the device was told.
    pub fn queue_pages(&self) -> (u32, u32) {
        (self.sq.pages, self.rq.pages)
    }

    /// Send and receive WQE strides in bytes.
    pub fn strides(&self) -> (u32, u32) {
        (self.sq.stride, self.rq.stride)
    }

    /// The send and receive CQs (they outlive the QP and do not move: the provider contract
    /// of create_qp).
    pub(super) fn cq_ptrs(&self) -> (NonNull<Cq<H>>, NonNull<Cq<H>>) {
        (self.send_cq, self.recv_cq)
    }

    /// The receive CQ (`recv`) or the send CQ.
    pub(super) fn cq(&self, recv: bool) -> &Cq<H> {
        let p = if recv { self.recv_cq } else { self.send_cq };
        // SAFETY: the CQs outlive the QP and do not move (the provider contract of create_qp).
        unsafe { p.as_ref() }
    }
}

/// Counts a QP as a user of its PD, CQs and SRQ (released when it is destroyed, never when
/// it is leaked: they then stay busy for good, as its memory is kept for good).
fn hold_users<H: Hal>(pd: &Pd, (s, r): (&Cq<H>, &Cq<H>), srq: Option<&Srq<H>>) {
    pd.users.fetch_add(1, Ordering::Relaxed);
    s.users.fetch_add(1, Ordering::Relaxed);
    r.users.fetch_add(1, Ordering::Relaxed);
    if let Some(srq) = srq {
        srq.users.fetch_add(1, Ordering::Relaxed);
    }
}

/// A QP the device may have made but the driver cannot destroy keeps everything it could use
/// for good: its PD, CQs and SRQ stay busy and its CQEs reserved (`slots`: send, receive).
#[cold]
#[inline(never)]
fn quarantine<H: Hal>(
    pd: &Pd,
    (s, r): (&Cq<H>, &Cq<H>),
    srq: Option<&Srq<H>>,
    (sq_slots, rq_slots): (u32, u32),
) {
    hold_users(pd, (s, r), srq);
    s.reserve_forever(sq_slots);
    r.reserve_forever(rq_slots);
}

fn pvrdma_qp_type(t: QpType) -> Result<u8> {
    match t {
        QpType::Rc => Ok(abi::qp_type::RC),
        QpType::Ud => Ok(abi::qp_type::UD),
        QpType::Gsi => Ok(abi::qp_type::GSI),
        // UC makes QEMU answer EIO; raw and XRC QPs do not exist on PVRDMA (§8.1).
        other => Err(Error::Unsupported(Unsupported::QpType(other))),
    }
}

impl<H: Hal> Pvrdma<H> {
    /// The queue layouts a QP created with `init` gets, or why it cannot be created.
    #[inline(never)]
    pub(crate) fn qp_layout(&self, init: &QpInit<'_>) -> Result<(QueueLayout, QueueLayout)> {
        pvrdma_qp_type(init.qp_type)?;
        let ex = &init.ex;
        // The first feature asked for that PVRDMA lacks, if any (one error built for all).
        let unsupported = if !ex.create_flags.is_empty() {
            Some(Feature::CreateFlags)
        } else if ex.source_qpn.is_some() {
            Some(Feature::SourceQpn)
        } else if ex.rx_hash.is_some() {
            Some(Feature::Rss)
        } else if ex.max_tso_header != 0 {
            Some(Feature::Tso)
        } else if ex.xrcd.is_some() {
            Some(Feature::Xrc)
        } else if init.caps.max_inline_data != 0 {
            // PVRDMA has no inline data (L-QP forces it to 0): refuse rather than
            // under-deliver.
            Some(Feature::InlineData)
        } else {
            None
        };
        if let Some(f) = unsupported {
            return Err(Error::Unsupported(Unsupported::Feature(f)));
        }
        // The device's own limits: the page limit is applied on top.
        let c = &self.device_caps();
        let sq = layout(
            (init.caps.max_send_wr, Param::MaxSendWr, c.max_qp_wr),
            (init.caps.max_send_sge, Param::MaxSendSge, c.max_sge),
            SQ_WQE_HDR,
            MAX_RING_PAGES,
        )?;
        let rq = if init.has_srq {
            QueueLayout::empty()
        } else {
            layout(
                (init.caps.max_recv_wr, Param::MaxRecvWr, c.max_qp_wr),
                (init.caps.max_recv_sge, Param::MaxRecvSge, c.max_sge),
                RQ_WQE_HDR,
                MAX_RING_PAGES,
            )?
        };
        Ok((sq, rq))
    }

    #[inline(never)]
    pub(crate) fn create_qp_impl(
        &self,
        pd: &Pd,
        send_cq: &Cq<H>,
        recv_cq: &Cq<H>,
        srq: Option<&Srq<H>>,
        init: &QpInit<'_>,
    ) -> Result<Qp<H>> {
        let op = Op::CreateQp;
        let (sq, rq) = self.qp_layout(init)?;
        // The QP joins the table its CQs' pollers read: their locks first, before the device
        // is asked (a poll in progress answers Busy, nothing made).
        let locks = CqLocks::take(send_cq, recv_cq, op)?;
        // Every request outstanding must have room for its CQE (QEMU drops CQEs silently on
        // a full CQ). A work queue whose whole depth fits the CQ has it reserved for the QP's
        // life (its posts then take nothing); any other is metered: each request takes its
        // room when it is posted (`QueueFull { Cq }` when there is none) and gives it back
        // when its CQE is polled. The QP is never refused for the CQ's size.
        // One CQ for both queues: both depths reserved, or both metered, so that a send queue
        // whose depth alone fills the CQ does not leave the receives no room at all.
        let (sq_res, rq_res) = if send_cq.id() == recv_cq.id() && rq.slots > 0 {
            let both = sq.slots.saturating_add(rq.slots);
            send_cq
                .reserve(both)
                .map_or((0, 0), |()| (sq.slots, rq.slots))
        } else {
            let sq_res = send_cq.reserve(sq.slots).map_or(0, |()| sq.slots);
            let rq_res = match rq.slots {
                0 => 0,
                n => recv_cq.reserve(n).map_or(0, |()| n),
            };
            (sq_res, rq_res)
        };
        // A receive posted to an SRQ may complete through any of its QPs: the SRQ's depth is
        // reserved once per (SRQ, receive CQ) pair, by its first QP, where it fits; where it
        // does not, the pair is metered: each receive posted to the SRQ takes its room on
        // every such CQ (`srq_meter.rs`).
        let (srq_room, srq_metered) = match srq {
            Some(s) if !self.qps.srq_pair(recv_cq.id(), NonNull::from(&s.counters)) => {
                let n = s.layout.slots;
                if recv_cq.reserve(n).is_ok() {
                    (n, false)
                } else {
                    // The poster's lock: the receives outstanding are all published.
                    let _poster = s.lock.lock();
                    let m = (recv_cq.id(), NonNull::from(&recv_cq.room), recv_cq.entries);
                    if let Err(e) = s.counters.meter_attach(m) {
                        send_cq.unreserve(sq_res);
                        recv_cq.unreserve(rq_res);
                        return Err(e);
                    }
                    (0, true)
                }
            }
            _ => (0, false),
        };
        let reserved = (sq_res, rq_res, srq_room);
        // The QP stays where create_qp_cmd built it (the result returned): checked and
        // registered in place.
        let mut r = self.create_qp_cmd(pd, (send_cq, recv_cq), srq, init, (sq, rq), reserved);
        let Ok(qp) = &mut r else {
            send_cq.unreserve(sq_res);
            recv_cq.unreserve(rq_res + srq_room);
            if let (Some(s), true) = (srq, srq_metered) {
                s.counters.meter_detach(recv_cq.id());
            }
            return r;
        };
        hold_users(pd, (send_cq, recv_cq), srq);
        // The device must describe the QP we laid out, under a handle no live QP has.
        let mask = regs::db::HANDLE_MASK;
        let inserted = if qp.qpn > mask {
            Err(Error::bad_value(op, &"qpn", qp.qpn))
        } else if qp.handle > mask {
            Err(Error::bad_value(op, &"qp_handle", qp.handle))
        } else {
            let ids = (send_cq.id(), recv_cq.id());
            self.qps.insert(qp.handle, ids, qp.ctl.ptr())
        };
        drop(locks);
        if let Err(e) = inserted {
            qp.handle_unusable = true;
            if let Ok(qp) = core::mem::replace(&mut r, Err(e))
                && let Err((qp, _)) = self.destroy_qp_impl(qp)
            {
                core::mem::forget(qp);
            }
        }
        r
    }

    /// CREATE_QP: the command, and the QP as the device answered.
    #[inline(never)]
    fn create_qp_cmd(
        &self,
        pd: &Pd,
        (send_cq, recv_cq): (&Cq<H>, &Cq<H>),
        srq: Option<&Srq<H>>,
        init: &QpInit<'_>,
        (sq, rq): (QueueLayout, QueueLayout),
        (sq_res, rq_res, srq_room): (u32, u32, u32),
    ) -> Result<Qp<H>> {
        let op = Op::CreateQp;
        let qp_type = init.qp_type;
        // What a QP kept for good keeps reserved (`quarantine`): its reservations (a metered
        // queue holds room only for requests posted, and it has none).
        let hold = (sq_res, rq_res + srq_room);
        let mut st = self.state.lock();
        st.room_for(Object::Qp, self.caps.max_qp.min(super::MAX_LIVE_QPS))?;
        if qp_type == QpType::Gsi && st.gsi {
            // One QP1 a port: QEMU would register a second under the same number.
            return Err(Error::from_errno(op, EBUSY));
        }
        let total = 1 + sq.pages + rq.pages;
        let mem = QueueMem::new(&self.hal, total as usize)?;
        let sq_ring = Ring::new(&mem.data, abi::RING_STATE_TX, 1, sq.slots, sq.stride);
        // Without a receive queue (an SRQ feeds the QP) the ring is a placeholder of one byte
        // in the state page that nothing writes (the queue has no credit).
        let rq_page = if rq.slots == 0 {
            0
        } else {
            1 + sq.pages as usize
        };
        let rq_ring = Ring::new(
            &mem.data,
            abi::RING_STATE_RX,
            rq_page,
            rq.slots.max(1),
            rq.stride.max(1),
        );
        let raw_type = pvrdma_qp_type(qp_type)?;
        // `State::create` without reading an answer: it depends on the version (below). The
        // request is filled in the command slot (fields not named stay zero: no inline data,
        // no lkey, no atomic argument).
        let req: &mut abi::CreateQp = st.chan.slot(opcode::CREATE_QP);
        req.pdir_dma = mem.pdir.paddr();
        req.pd_handle = pd.handle;
        req.send_cq_handle = send_cq.handle;
        req.recv_cq_handle = recv_cq.handle;
        req.srq_handle = srq.map_or(0, |s| s.handle());
        req.max_send_wr = sq.slots;
        req.max_recv_wr = rq.slots;
        req.max_send_sge = sq.sge;
        req.max_recv_sge = rq.sge;
        req.access_flags = abi::ACCESS_LOCAL_WRITE;
        req.total_chunks = total as u16;
        req.send_chunks = sq.pages as u16;
        req.sq_sig_all = u8::from(init.sq_sig_all);
        req.qp_type = raw_type;
        req.is_srq = u8::from(srq.is_some());
        if let Err((e, kept)) = st.run_create(&self.regs, Object::Qp, op, opcode::CREATE_QP) {
            if kept {
                // The device may have made the QP: its ring is kept, it keeps its PD, CQs and
                // SRQ busy for good (and their CQEs reserved), and if it is QP1, QP1 exists.
                core::mem::forget(mem);
                quarantine(pd, (send_cq, recv_cq), srq, hold);
                st.gsi |= qp_type == QpType::Gsi;
            }
            return Err(e);
        }
        // (qpn, handle, the four caps the device echoes, inline data), as the version answers.
        let (qpn, handle, echoed, inline) = if self.version >= abi::VERSION_QP_HANDLE {
            let r: abi::CreateQpRespV2 = st.chan.answer();
            let c = [r.max_send_wr, r.max_recv_wr, r.max_send_sge, r.max_recv_sge];
            (r.qpn, r.qp_handle, c, r.max_inline_data)
        } else {
            let r: abi::CreateQpRespV1 = st.chan.answer();
            let c = [r.max_send_wr, r.max_recv_wr, r.max_send_sge, r.max_recv_sge];
            (r.qpn, r.qpn, c, r.max_inline_data)
        };
        st.gsi |= qp_type == QpType::Gsi;
        drop(st);
        let ctl = QpCtlMem::new(
            &self.hal,
            (sq_ring, rq_ring),
            (qpn, handle),
            srq.map(|s| NonNull::from(&s.counters)),
            init.safe,
            (
                (
                    (sq_res == 0).then(|| NonNull::from(&send_cq.room)),
                    send_cq.entries,
                ),
                (
                    (rq_res == 0 && rq.slots != 0).then(|| NonNull::from(&recv_cq.room)),
                    recv_cq.entries,
                ),
            ),
        );
        let mask = regs::db::HANDLE_MASK;
        let nameable = handle <= mask && qpn <= mask;
        let garbage = echoed != [sq.slots, rq.slots, sq.sge, rq.sge] || inline != 0;
        let ctl = match ctl {
            Ok(ctl) if !garbage || !nameable => ctl,
            ctl => {
                // The device did not make the QP we asked for (garbage), or the driver cannot
                // keep track of it (no memory for its control block): destroy it, by a handle
                // that is at least well-formed.
                let e = match ctl {
                    Ok(_) => Error::bad_value(op, &"qp caps", echoed[0]),
                    Err(e) => e,
                };
                log::warn!("bareverbs: QP {qpn} made but not usable ({e}): destroying it");
                let mut st = self.state.lock();
                let code = (Op::DestroyQp, opcode::DESTROY_QP);
                match st.run_destroy(&self.regs, Object::Qp, code, handle) {
                    Ok(()) => st.gsi &= qp_type != QpType::Gsi,
                    Err(_) => {
                        drop(st);
                        // The device may use the QP's memory: kept for good, with everything
                        // else the QP could use.
                        quarantine(pd, (send_cq, recv_cq), srq, hold);
                        core::mem::forget(mem);
                    }
                }
                return Err(e);
            }
        };
        if garbage {
            // Garbage under a handle that cannot be named (checked above): nothing can be
            // told to the device about it, its memory is kept for good.
            quarantine(pd, (send_cq, recv_cq), srq, hold);
            core::mem::forget((mem, ctl));
            return Err(Error::bad_value(op, &"qp caps", echoed[0]));
        }
        Ok(Qp {
            handle,
            qpn,
            qp_type,
            caps: caps_of(&sq, &rq),
            sq_sig_all: init.sq_sig_all,
            state: QpState::Reset,
            host: QpState::Reset,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            handle_unusable: false,
            sq,
            rq,
            sq_prod: Producer::new(
                sq.slots,
                handle | regs::db::QP_SEND,
                ctl.ctl().sq.shadow,
                ctl.ctl().sq.room.is_some(),
                ctl.ctl().sq.room,
            ),
            rq_prod: Producer::new(
                rq.slots,
                handle | regs::db::QP_RECV,
                ctl.ctl().rq.shadow,
                // (A QP on an SRQ has no receive ring: its receives go the slow way too, to
                // their refusal.)
                ctl.ctl().rq.room.is_some() || srq.is_some(),
                ctl.ctl().rq.room,
            ),
            ctl,
            qkey: 0,
            sgid_index: 0,
            pd_handle: pd.handle,
            has_srq: srq.is_some(),
            datagram: matches!(qp_type, QpType::Ud | QpType::Gsi),
            sq_ring,
            rq_ring,
            send_cq: NonNull::from(send_cq),
            recv_cq: NonNull::from(recv_cq),
            srq: srq.map(NonNull::from),
            pd: NonNull::from(pd),
            reserved: (sq_res, rq_res),
            mem,
        })
    }

    /// The poll locks of the QP's CQs (bounded: `Busy` for `op`), its control block
    /// forgotten by their pollers' caches.
    pub(super) fn lock_cqs(&self, qp: &Qp<H>, op: Op) -> Result<CqLocks<'_, H>> {
        // SAFETY: the CQs outlive the QP (the provider contract of create_qp).
        let (s, r) = unsafe { (qp.send_cq.as_ref(), qp.recv_cq.as_ref()) };
        let mut locks = CqLocks::take(s, r, op)?;
        locks.forget(qp.ctl.ptr());
        Ok(locks)
    }

    /// Hands back every outstanding or parked safe buffer of a QP the device has destroyed.
    #[inline(never)]
    fn release_all(&self, qp: &mut Qp<H>) {
        let ctl = qp.ctl.ctl();
        ctl.rq.release_parked(ctl.release);
        for q in [&ctl.sq, &ctl.rq] {
            let (done, tail) = (
                q.ctl.done.load(Ordering::Relaxed),
                q.ctl.tail.load(Ordering::Relaxed),
            );
            let mut n = done;
            while n != tail {
                // `recv` false: nothing can write the buffers any more.
                q.give_back(n, done, false, ctl.release);
                n = n.wrapping_add(1);
            }
        }
    }

    pub(crate) fn destroy_qp_impl(&self, qp: Qp<H>) -> Result<(), (Qp<H>, Error)> {
        let (pd, srq, cqs, reserved) = (qp.pd, qp.srq, (qp.send_cq, qp.recv_cq), qp.reserved);
        let (handle, unusable) = (qp.handle, qp.handle_unusable);
        let ctl = qp.ctl.ptr();
        if unusable {
            // A handle the device answered garbage with: nothing to tell the device, keep it.
            crate::error::warn_msg("QP with an unusable handle kept (its memory is leaked)");
            core::mem::forget(qp);
            return Ok(());
        }
        let mut qp = qp;
        // The CQs' pollers are kept out for the whole destroy (bounded: Busy hands the QP
        // back, nothing changed).
        let mut locks = match self.lock_cqs(&qp, Op::DestroyQp) {
            Ok(l) => l,
            Err(e) => return Err((qp, e)),
        };
        let mut st = self.state.lock();
        let code = (Op::DestroyQp, opcode::DESTROY_QP);
        if let Err(e) = st.run_destroy(&self.regs, Object::Qp, code, handle) {
            return Err((qp, e));
        }
        st.gsi &= qp.qp_type != QpType::Gsi;
        drop(st);
        // Out of the table: no poller reaches its control block any more. Its CQEs still in
        // the rings go with it, as Linux's driver removes them (`docs/pvrdma.md`): a QP made
        // next under the same handle (GSI's is always 1) never sees them, and their room is
        // free at once. The SRQ receives they complete give the SRQ its credit back.
        let qctl = qp.ctl.ctl();
        locks.purge(handle, |wr_id| qctl.srq_completed(wr_id));
        if self.qps.lookup_ctl(handle) == Some(ctl) {
            self.qps.remove(handle);
        }
        // A QP destroyed in ERR has nothing left to flush: its CQs stop counting it. Its
        // metered queues' room is all free (their CQEs are gone); the SRQ's reservation goes
        // with the pair's last QP, or passes to the others.
        locks.stop_flush(qp.ctl.ctl());
        qctl.sq.give_room(qctl.sq.held(qp.sq_prod.credit));
        qctl.rq.give_room(qctl.rq.held(qp.rq_prod.credit));
        // SAFETY: the SRQ outlives the QP (the provider contract of create_qp).
        let srq_ref = srq.map(|s| unsafe { s.as_ref() });
        // The SRQ's depth, reserved once for the (SRQ, receive CQ) pair by its first QP: given
        // back by its last.
        // (Or, when the pair was metered, its CQ's entries the SRQ's receives hold.)
        let srq_room = match srq_ref {
            Some(s) if !self.qps.srq_pair(locks.r.id(), NonNull::from(&s.counters)) => {
                if s.counters.meter_detach(locks.r.id()) {
                    0
                } else {
                    s.layout.slots
                }
            }
            _ => 0,
        };
        drop(locks);
        // The device no longer has the QP: every outstanding safe buffer comes back.
        self.release_all(&mut qp);
        drop(qp);
        // SAFETY: the PD, CQs and SRQ outlive the QP (the provider contract of create_qp).
        unsafe {
            pd.as_ref().users.fetch_sub(1, Ordering::Relaxed);
            let (s, r) = (cqs.0.as_ref(), cqs.1.as_ref());
            // (Its CQEs are gone from the rings: all of its room is free.)
            s.unreserve(reserved.0);
            r.unreserve(reserved.1);
            r.unreserve(srq_room);
            s.users.fetch_sub(1, Ordering::Relaxed);
            r.users.fetch_sub(1, Ordering::Relaxed);
            if let Some(srq) = srq {
                srq.as_ref().users.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}
