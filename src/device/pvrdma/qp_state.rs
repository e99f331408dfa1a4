//! Queue-pair state changes (MODIFY_QP / QUERY_QP; `docs/pvrdma.md` §8.2, §8.3) and
//! what RESET and ERR do to the requests outstanding: discarded, or flushed by the driver
//! (QEMU only records both states).

use core::sync::atomic::Ordering;

use bareverbs_hal::Hal;

use super::abi::{self, opcode};
use super::cq::CqLocks;
use super::mr::{access_from_pvrdma, pvrdma_access};
use super::qp::Qp;
use super::{Pvrdma, WqCursor};
use crate::error::{Attr, Error, Feature, Op, Result, Unsupported};
use crate::verbs::{ModifyAttr, Mtu, QpAttr, QpAttrMask, QpState, QpType};

/// The outstanding RDMA reads/atomics a QP gets when `requested` are asked of a device whose
/// caps advertise `cap`. A device that advertises a limit gets the request clamped to it.
/// QEMU advertises 0 (it never fills the field, §3.1) yet gives every RC host QP 1 at RTR and
/// RTS whatever is asked (§8.3), as Linux's driver lets it: so with 0 advertised, the QP has 1.
fn rd_atomic(requested: u8, cap: u32) -> u8 {
    match cap {
        0 => 1,
        cap => requested.min(u8::try_from(cap).unwrap_or(u8::MAX)),
    }
}

/// PVRDMA's attribute-mask bits (L-VRB `enum pvrdma_qp_attr_mask`): IB numbering.
fn pvrdma_mask(m: QpAttrMask) -> u32 {
    const MAP: [(QpAttrMask, u32); 21] = [
        (QpAttrMask::STATE, 1 << 0),
        (QpAttrMask::CUR_STATE, 1 << 1),
        (QpAttrMask::EN_SQD_ASYNC_NOTIFY, 1 << 2),
        (QpAttrMask::ACCESS_FLAGS, 1 << 3),
        (QpAttrMask::PKEY_INDEX, 1 << 4),
        (QpAttrMask::PORT, 1 << 5),
        (QpAttrMask::QKEY, 1 << 6),
        (QpAttrMask::AV, 1 << 7),
        (QpAttrMask::PATH_MTU, 1 << 8),
        (QpAttrMask::TIMEOUT, 1 << 9),
        (QpAttrMask::RETRY_CNT, 1 << 10),
        (QpAttrMask::RNR_RETRY, 1 << 11),
        (QpAttrMask::RQ_PSN, 1 << 12),
        (QpAttrMask::MAX_QP_RD_ATOMIC, 1 << 13),
        (QpAttrMask::ALT_PATH, 1 << 14),
        (QpAttrMask::MIN_RNR_TIMER, 1 << 15),
        (QpAttrMask::SQ_PSN, 1 << 16),
        (QpAttrMask::MAX_DEST_RD_ATOMIC, 1 << 17),
        (QpAttrMask::PATH_MIG_STATE, 1 << 18),
        (QpAttrMask::CAP, 1 << 19),
        (QpAttrMask::DEST_QPN, 1 << 20),
    ];
    MAP.iter()
        .filter(|(f, _)| m.contains(*f))
        .fold(0, |acc, (_, b)| acc | b)
}

impl<H: Hal> Pvrdma<H> {
    /// The QP's outstanding requests are to complete flushed (it went to ERR).
    #[inline(never)]
    fn start_flush(&self, qp: &Qp<H>, locks: &CqLocks<'_, H>) {
        let ctl = qp.ctl.ctl();
        for (q, cq, on) in [(&ctl.sq, locks.s, true), (&ctl.rq, locks.r, !ctl.srq)] {
            if on && q.ctl.flush.swap(1, Ordering::AcqRel) == 0 {
                cq.flushing.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Drops the QP's outstanding requests without completions (RESET): their CQEs still in
    /// the CQs go (`CqLocks::purge`), their safe buffers go back to the pool (or are parked),
    /// the CQEs the device still owes for requests it took are counted to be dropped
    /// (`QueueCtl::late`); the counters restart at 0. Nothing of the QP's earlier life
    /// completes after this.
    #[inline(never)]
    fn discard(&self, qp: &mut Qp<H>, locks: &mut CqLocks<'_, H>) {
        let ctl = qp.ctl.ctl();
        let (purged_sq, purged_rq) = locks.purge(qp.handle, |wr_id| ctl.srq_completed(wr_id));
        let own_rq = if ctl.srq { 0 } else { purged_rq };
        let credits = [qp.sq_prod.credit, qp.rq_prod.credit];
        for ((q, purged), credit) in [(&ctl.sq, purged_sq), (&ctl.rq, own_rq)]
            .into_iter()
            .zip(credits)
        {
            let held = q.held(credit);
            let (done, tail) = (
                q.ctl.done.load(Ordering::Relaxed),
                q.ctl.tail.load(Ordering::Relaxed),
            );
            // The first CQEs removed were owed for requests finished before; the rest
            // completed the oldest requests outstanding (the device completes in order).
            let late = q.ctl.late.load(Ordering::Relaxed);
            let owed = late.min(purged);
            let completed = (purged - owed).min(tail.wrapping_sub(done));
            let mut late = late - owed;
            let recv = core::ptr::eq(q, &ctl.rq);
            let mut n = done;
            while n != tail {
                if n.wrapping_sub(done) < completed {
                    // Completed by the device: its buffer is free (`recv` false: no parking).
                    q.give_back(n, done, false, ctl.release);
                } else {
                    if q.consumed(n, done) {
                        late += 1;
                    }
                    q.give_back(n, done, recv, ctl.release);
                }
                n = n.wrapping_add(1);
            }
            q.ctl.late.store(late, Ordering::Relaxed);
            // A metered queue keeps room only for the CQEs still owed (its credit restarts at
            // 0: what it holds is then `late`).
            q.give_room(held.saturating_sub(late));
            q.ctl.done.store(0, Ordering::Relaxed);
            q.ctl.tail.store(0, Ordering::Relaxed);
            q.ctl.unpublished.store(0, Ordering::Relaxed);
        }
        locks.stop_flush(qp.ctl.ctl());
        qp.sq_prod.reset(qp.sq.slots);
        qp.rq_prod.reset(qp.rq.slots);
    }

    /// Makes the requests a batch `c` wrote to a QP in ERR outstanding, to complete flushed
    /// (libibverbs lets a QP in ERR be posted to). They are not shown to the device: the ring's
    /// producer index stays, no doorbell rings (QEMU would execute them: it only records ERR,
    /// §8.3), so the device never reads their buffers. `recv`: the receive queue.
    pub(crate) fn commit_flushed(&self, qp: &mut Qp<H>, c: &WqCursor, recv: bool) {
        let n = c.tail.wrapping_sub(c.start);
        if n == 0 {
            return;
        }
        let (s, r) = qp.cq_ptrs();
        // SAFETY: the CQs outlive the QP and do not move (the provider contract of create_qp).
        let cq = unsafe { if recv { r.as_ref() } else { s.as_ref() } };
        let p = if recv {
            &mut qp.rq_prod
        } else {
            &mut qp.sq_prod
        };
        p.tail = c.tail;
        let ctl = qp.ctl.ctl();
        let q = if recv { &ctl.rq } else { &ctl.sq };
        // The tail first, then the count of unpublished requests (readers take them in the
        // other order: see `QueueCtl::unpublished`), then the flag (see `take_flush`).
        q.ctl.tail.store(c.tail, Ordering::SeqCst);
        q.ctl.unpublished.fetch_add(n, Ordering::Release);
        if q.ctl.flush.swap(1, Ordering::SeqCst) == 0 {
            cq.flushing.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub(crate) fn modify_qp_impl(&self, qp: &mut Qp<H>, m: &ModifyAttr) -> Result<()> {
        let op = Op::ModifyQp;
        if m.state == QpState::Init
            && matches!(qp.host, QpState::Rtr | QpState::Rts)
            && qp.qp_type != QpType::Gsi
        {
            // QEMU would pass INIT to a host QP still in RTR/RTS, which refuses it (EIO): a QP
            // reset after INIT cannot be brought back, since nothing resets the host QP (§8.3).
            return Err(Error::Unsupported(Unsupported::Feature(
                Feature::ReinitAfterReset,
            )));
        }
        // RESET and ERR change what the CQs' pollers read: their locks first, before the
        // device is asked (a poll in progress answers Busy, nothing changed).
        let mut locks = match m.state {
            QpState::Reset | QpState::Err => Some(self.lock_cqs(qp, op)?),
            _ => None,
        };
        let mut st = self.state.lock();
        let mut mask = pvrdma_mask(m.mask);
        let mut sgid = m.av.map_or(0, |av| av.sgid_index);
        if m.state == QpState::Rtr && qp.qp_type != QpType::Gsi {
            // QEMU resolves the source GID at RTR for every QP type and fails (EIO) unless it
            // is a GID this device bound (§8.3). For datagram QPs, which carry no address at
            // RTR, the driver supplies its lowest bound GID.
            let bound = match m.av {
                Some(av) => Some(av.sgid_index).filter(|&i| st.gid_bound(u32::from(i))),
                None => st.lowest_gid().map(|i| i as u8),
            };
            let Some(bound) = bound else {
                return Err(Error::MissingAttribute {
                    op,
                    attr: Attr::SourceGid,
                });
            };
            sgid = bound;
            mask |= pvrdma_mask(QpAttrMask::AV);
        }
        let rd = |set: QpAttrMask, n: u8, max: u32| match m.mask.contains(set) {
            true => rd_atomic(n, max),
            false => 0,
        };
        let max_rd_atomic = rd(
            QpAttrMask::MAX_QP_RD_ATOMIC,
            m.max_rd_atomic,
            self.caps.max_qp_init_rd_atom,
        );
        let max_dest_rd_atomic = rd(
            QpAttrMask::MAX_DEST_RD_ATOMIC,
            m.max_dest_rd_atomic,
            self.caps.max_qp_rd_atom,
        );
        // Filled in the command slot (the fields not named stay zero). L-VRB numbers QP states
        // and MTUs as InfiniBand (and ibverbs) do.
        let req: &mut abi::ModifyQp = st.chan.slot(opcode::MODIFY_QP);
        req.qp_handle = qp.handle;
        req.attr_mask = mask;
        let a = &mut req.attrs;
        a.qp_state = m.state.to_raw();
        a.path_mtu = m.path_mtu as u32;
        a.qkey = m.qkey;
        a.rq_psn = m.rq_psn;
        a.sq_psn = m.sq_psn;
        a.dest_qp_num = m.dest_qpn;
        a.qp_access_flags = pvrdma_access(m.access);
        a.pkey_index = m.pkey_index;
        a.max_rd_atomic = max_rd_atomic;
        a.max_dest_rd_atomic = max_dest_rd_atomic;
        a.min_rnr_timer = m.min_rnr_timer;
        a.port_num = m.port;
        a.timeout = m.timeout;
        a.retry_cnt = m.retry_cnt;
        a.rnr_retry = m.rnr_retry;
        let ah = &mut a.ah_attr;
        if let Some(av) = m.av {
            ah.grh.dgid = av.dgid.0;
            ah.grh.flow_label = av.flow_label;
            ah.grh.hop_limit = av.hop_limit;
            ah.grh.traffic_class = av.traffic_class;
            ah.sl = av.sl;
            ah.ah_flags = abi::AH_GRH;
            ah.port_num = m.port;
        }
        ah.grh.sgid_index = sgid;
        st.chan.run(&self.regs, op, opcode::MODIFY_QP)?;
        qp.state = m.state;
        if matches!(m.state, QpState::Init | QpState::Rtr | QpState::Rts) {
            qp.host = m.state;
        }
        if m.mask.contains(QpAttrMask::QKEY) {
            qp.qkey = m.qkey;
        }
        if m.mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
            qp.max_rd_atomic = max_rd_atomic;
        }
        if m.mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            qp.max_dest_rd_atomic = max_dest_rd_atomic;
        }
        if mask & pvrdma_mask(QpAttrMask::AV) != 0 {
            qp.sgid_index = sgid;
        }
        drop(st);
        // What was set, for queries where the device reports nothing (rd_atomic as applied).
        let mut applied = *m;
        (applied.max_rd_atomic, applied.max_dest_rd_atomic) = (max_rd_atomic, max_dest_rd_atomic);
        qp.ctl.record_mut().merge(&applied);
        match (m.state, &mut locks) {
            (QpState::Reset, Some(locks)) => {
                // The driver restarts its rings with the QP (as Linux and rdma-core do).
                self.discard(qp, locks);
                qp.mem.data.zero(0, 16);
            }
            (QpState::Err, Some(locks)) => self.start_flush(qp, locks),
            _ => {}
        }
        Ok(())
    }

    /// QUERY_QP. Which attribute comes from where (`docs/pvrdma.md` §5.3, §8.3):
    ///
    /// - From the device: the state (but see below), `cur_state`, `path_mtu` (when it is an
    ///   MTU code), `qkey`, `rq_psn`, `sq_psn`, `dest_qpn` and `access` — the fields before
    ///   offset 0x24 of the answer, the only ones QEMU writes in PVRDMA's layout (it copies the
    ///   host's `ibv_qp_attr` there; on QEMU they are the host QP's values: path MTU 1024 for RC
    ///   from RTR on, access flags 0 for RC, whatever was asked).
    /// - From the driver's record of the last modify: `pkey_index`, `port`, `timeout`,
    ///   `retry_cnt`, `rnr_retry`, `min_rnr_timer`, `av`, `max_rd_atomic` and
    ///   `max_dest_rd_atomic` (as applied), and `path_mtu` when the device's is no MTU code.
    ///   Past offset 0x24 QEMU's answer is the host's layout (its `cap`, `ah_attr`…), which no
    ///   PVRDMA field can be read from; `sq_draining` is false (the driver never drains).
    /// - From creation: `caps`, `qp_type`, `sq_sig_all`, `has_srq`, `qp_num`.
    ///
    /// The state: QEMU only records RESET/ERR/SQD/SQE (the host QP keeps its state) and
    /// reports RTS for its emulated GSI QP, so in those cases the state last commanded is the
    /// true one. A GSI QP has no host QP at all: QEMU answers nothing but the state, so every
    /// other attribute comes from the record.
    pub(crate) fn query_qp_impl(&self, qp: &Qp<H>) -> Result<QpAttr> {
        let op = Op::QueryQp;
        let fill = |r: &mut abi::QueryQp| {
            r.qp_handle = qp.handle;
            // Every defined attribute, and only those: QEMU hands the mask to the host's
            // ibv_query_qp, which refuses unknown bits (EOPNOTSUPP, seen on QEMU over rxe).
            r.attr_mask = pvrdma_mask(QpAttrMask::all());
        };
        let r: abi::QueryQpResp = self.exec((op, opcode::QUERY_QP), fill)?;
        let a = r.attrs;
        let reported = QpState::from_raw(a.qp_state)
            .ok_or_else(|| Error::bad_value(op, &"qp_state", a.qp_state))?;
        let gsi = qp.qp_type == QpType::Gsi;
        let (state, device_state) = match qp.state {
            QpState::Reset | QpState::Err | QpState::Sqd | QpState::Sqe => (qp.state, false),
            _ if gsi => (qp.state, false),
            _ => (reported, true),
        };
        let cur_state = match QpState::from_raw(a.cur_qp_state) {
            Some(s) if device_state => s,
            _ => state,
        };
        let rec = qp.ctl.record();
        let from_device = !gsi;
        let pick = |device: u32, recorded: u32| if from_device { device } else { recorded };
        let path_mtu = match Mtu::from_raw(a.path_mtu) {
            Some(mtu) if from_device => mtu,
            _ => rec.path_mtu,
        };
        let access = match from_device {
            true => access_from_pvrdma(a.qp_access_flags),
            false => rec.access,
        };
        Ok(QpAttr {
            state,
            cur_state,
            caps: qp.caps,
            qp_num: qp.qpn,
            qkey: pick(a.qkey, qp.qkey),
            rq_psn: pick(a.rq_psn, rec.rq_psn),
            sq_psn: pick(a.sq_psn, rec.sq_psn),
            dest_qpn: pick(a.dest_qp_num, rec.dest_qpn),
            sq_sig_all: qp.sq_sig_all,
            max_rd_atomic: qp.max_rd_atomic,
            max_dest_rd_atomic: qp.max_dest_rd_atomic,
            path_mtu,
            access,
            pkey_index: rec.pkey_index,
            port: rec.port,
            timeout: rec.timeout,
            retry_cnt: rec.retry_cnt,
            rnr_retry: rec.rnr_retry,
            min_rnr_timer: rec.min_rnr_timer,
            av: rec.av,
            sq_draining: false,
            qp_type: qp.qp_type,
            has_srq: qp.has_srq,
        })
    }
}
