//! The model's data path: memory regions, and the SQ/RQ/SRQ rings executed inside the
//! doorbell write (Q-QPO, Q-BE; `docs/pvrdma.md` §7–§10), in loopback: an RC QP's peer is
//! the QP named by its destination QPN, a UD send goes to the QP named in the WQE if the Q_Key
//! matches.

use std::collections::VecDeque;

use crate::Semantics;
use crate::device::{Ctx, Device, le32, le64, put32};
use crate::hostile::point;

const PAGE: u64 = 4096;

/// The fields of a CQE (offset, width), as a hostile device garbles them; the ones drivers
/// act on listed twice.
const CQE_FIELDS: [(usize, usize); 24] = [
    (0x00, 8), // wr_id
    (0x00, 8),
    (0x08, 8), // qp
    (0x08, 8),
    (0x10, 4), // opcode
    (0x10, 4),
    (0x14, 4), // status
    (0x14, 4),
    (0x18, 4), // byte_len
    (0x18, 4),
    (0x1C, 4), // imm_data
    (0x20, 4), // src_qp
    (0x24, 4), // wc_flags
    (0x24, 4),
    (0x28, 4), // vendor_err
    (0x2C, 2), // pkey_index
    (0x2E, 2), // slid
    (0x30, 1), // sl
    (0x31, 1), // dlid_path_bits
    (0x32, 1), // port_num
    (0x33, 4), // smac (first four bytes)
    (0x37, 2), // smac (last two)
    (0x39, 1), // network_hdr_type
    (0x3A, 4), // reserved
];

/// A registered memory region.
pub(crate) struct Mr {
    pub(crate) pd: u32,
    pub(crate) iova: u64,
    pub(crate) len: u64,
    pub(crate) access: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) pages: Vec<u64>,
    pub(crate) spans: Vec<(u64, u64)>,
}

/// A receive WQE the device has taken from a ring (QEMU posts it to the host at once).
#[derive(Clone, Debug)]
pub(crate) struct Recv {
    wr_id: u64,
    sges: Vec<(u64, u32, u32)>,
}

/// Per-queue ring geometry, as QEMU derives it from CREATE_QP / CREATE_SRQ.
#[derive(Clone, Debug, Default)]
pub(crate) struct RingGeo {
    pub(crate) state: u64,
    pub(crate) state_off: u64,
    pub(crate) slots: u32,
    pub(crate) stride: u64,
    pub(crate) pages: Vec<u64>,
}

impl RingGeo {
    /// Where WQE `slot` is; None past the ring's pages (a violation at create).
    fn wqe(&self, slot: u32) -> Option<u64> {
        let off = u64::from(slot).checked_mul(self.stride)?;
        Some(self.pages.get(usize::try_from(off / PAGE).ok()?)? + off % PAGE)
    }

    /// Index `idx` masked to a slot (the index is valid: below 2·slots).
    fn slot(&self, idx: u32) -> u32 {
        (u64::from(idx) & (u64::from(self.slots) - 1)) as u32
    }

    /// The index after `idx`, modulo 2·slots.
    fn next(&self, idx: u32) -> u32 {
        ((u64::from(idx) + 1) & (2 * u64::from(self.slots) - 1)) as u32
    }
}

/// Data-path state of a QP.
#[derive(Default)]
pub(crate) struct QpData {
    pub(crate) sq: RingGeo,
    pub(crate) rq: RingGeo,
    pub(crate) recvs: VecDeque<Recv>,
    pub(crate) hung: bool,
    /// The QP went to ERROR while its send queue ran: its receives are flushed once the
    /// rest of the send queue has been (the order rxe flushes in).
    pub(crate) flush_rq: bool,
}

/// Data-path state of an SRQ.
#[derive(Default)]
pub(crate) struct SrqData {
    pub(crate) ring: RingGeo,
    pub(crate) recvs: VecDeque<Recv>,
}

const ACC_LOCAL_WRITE: u32 = 1;
const ACC_REMOTE_WRITE: u32 = 2;
const ACC_REMOTE_READ: u32 = 4;
const WC_RECV: u32 = 128;

// CQE status values (IB numbering).
#[path = "gsi.rs"]
pub(crate) mod gsi;

const ST_OK: u32 = 0;
const ST_LOC_LEN: u32 = 1;
const ST_LOC_PROT: u32 = 4;
const ST_WR_FLUSH: u32 = 5;
const ST_RETRY_EXC: u32 = 12;
const ST_REM_INV_REQ: u32 = 9;
const ST_REM_ACCESS: u32 = 10;
const ST_RNR: u32 = 13;

struct Cqe {
    wr_id: u64,
    qp: u32,
    opcode: u32,
    status: u32,
    byte_len: u32,
    imm: u32,
    src_qp: u32,
    flags: u32,
}

impl Device {
    pub(crate) fn create_mr(
        &mut self,
        ctx: &mut Ctx<'_>,
        req: &[u8],
        resp: &mut [u8],
    ) -> Result<(), u32> {
        let (start, length, pdir) = (le64(req, 0x10), le64(req, 0x18), le64(req, 0x20));
        let (pd, access, flags, nchunks) = (
            le32(req, 0x28),
            le32(req, 0x2C),
            le32(req, 0x30),
            le32(req, 0x34),
        );
        if !matches!(self.pds.get(pd as usize), Some(true)) {
            return Err(crate::device::EINVAL);
        }
        let pages = if flags & 1 != 0 {
            Vec::new() // DMA MR: no mapping, lkey 0 (useless for data, §8.8)
        } else {
            if Some(u64::from(nchunks) * PAGE) != length.div_ceil(PAGE).checked_mul(PAGE)
                || nchunks == 0
            {
                return Err(crate::device::EINVAL);
            }
            ctx.map_pdir_multi(pdir, nchunks)
                .ok_or(crate::device::EINVAL)?
        };
        let max = ctx.cfg.caps.max_mr;
        let slot = crate::device::alloc_slot(&mut self.mrs, max, "MR", ctx.violations)
            .ok_or(crate::device::ENOMEM)?;
        let lkey = if flags & 1 != 0 {
            0
        } else {
            (slot as u32) << 8 | 0x11
        };
        let rkey = match ctx.cfg.semantics {
            Semantics::Qemu => 0xFFFF_FFFF,
            Semantics::Verbs | Semantics::LooseVerbs => (slot as u32) << 8 | 0x77,
        };
        self.mrs[slot] = Some(Mr {
            pd,
            iova: start,
            len: length,
            access,
            lkey,
            rkey,
            spans: crate::device::spans(&pages),
            pages,
        });
        put32(resp, 0x10, slot as u32);
        put32(resp, 0x14, lkey);
        put32(resp, 0x18, rkey);
        Ok(())
    }

    /// Translates `len` bytes at `addr` of the MR keyed `key` (by lkey, or rkey when
    /// `remote`), requiring `access`; returns physical pieces.
    fn translate(
        &self,
        key: u32,
        remote: bool,
        addr: u64,
        len: u32,
        access: u32,
        pd: Option<u32>,
    ) -> Option<Vec<(u64, usize)>> {
        let mr = self.mrs.iter().flatten().find(|m| {
            if remote {
                m.rkey == key && m.rkey != 0xFFFF_FFFF
            } else {
                m.lkey == key && key != 0
            }
        })?;
        if pd.is_some_and(|p| p != mr.pd) || (access != 0 && mr.access & access == 0) {
            return None;
        }
        let end = addr.checked_add(u64::from(len))?;
        if addr < mr.iova || end > mr.iova.saturating_add(mr.len) {
            return None;
        }
        let mut out = Vec::new();
        let mut off = addr - mr.iova + (mr.iova % PAGE);
        let mut left = u64::from(len);
        while left > 0 {
            let page = *mr.pages.get((off / PAGE) as usize)?;
            let n = (PAGE - off % PAGE).min(left);
            out.push((page + off % PAGE, n as usize));
            off += n;
            left -= n;
        }
        Some(out)
    }

    fn gather(&self, ctx: &mut Ctx<'_>, sges: &[(u64, u32, u32)], pd: u32) -> Option<Vec<u8>> {
        let mut data = Vec::new();
        for &(addr, len, lkey) in sges {
            for (pa, n) in self.translate(lkey, false, addr, len, 0, Some(pd))? {
                let Some(bytes) = ctx.mem.read(pa, n) else {
                    ctx.violations
                        .freed(format!("memory region page {pa:#x} is not allocated"));
                    return None;
                };
                data.extend(bytes);
            }
        }
        Some(data)
    }

    /// Writes `data` across `sges` (which need LOCAL_WRITE); `None` if they are too small or
    /// invalid.
    fn scatter(
        &self,
        ctx: &mut Ctx<'_>,
        sges: &[(u64, u32, u32)],
        pd: u32,
        data: &[u8],
    ) -> Result<(), u32> {
        let room: u64 = sges.iter().map(|s| u64::from(s.1)).sum();
        if room < data.len() as u64 {
            return Err(ST_LOC_LEN);
        }
        let mut rest = data;
        for &(addr, len, lkey) in sges {
            if rest.is_empty() {
                break;
            }
            let take = (len as usize).min(rest.len());
            let pieces = self
                .translate(lkey, false, addr, take as u32, ACC_LOCAL_WRITE, Some(pd))
                .ok_or(ST_LOC_PROT)?;
            for (pa, n) in pieces {
                if !ctx.mem.write(pa, &rest[..n]) {
                    ctx.violations
                        .freed(format!("memory region page {pa:#x} is not allocated"));
                }
                rest = &rest[n..];
            }
        }
        Ok(())
    }

    pub(crate) fn doorbell(&mut self, ctx: &mut Ctx<'_>, offset: usize, value: u32) {
        self.doorbells += 1;
        if ctx.liar.roll(point::WRITE) {
            self.scribble(ctx);
        }
        let handle = value & 0x00FF_FFFF;
        match offset & 0xFFF {
            0x0 => {
                let Some(i) = self.qp_index(handle) else {
                    ctx.violations.qemu(
                        point::PROTOCOL,
                        format!("QP doorbell for unknown QP {handle}"),
                    );
                    return;
                };
                if value & (1 << 31) != 0 {
                    self.take_recvs(ctx, i);
                }
                if value & (1 << 30) != 0 {
                    self.run_sq(ctx, i);
                }
            }
            0x4 => {
                let Some(cq) = self.cqs.get_mut(handle as usize).and_then(Option::as_mut) else {
                    ctx.violations.qemu(
                        point::PROTOCOL,
                        format!("CQ doorbell for unknown CQ {handle}"),
                    );
                    return;
                };
                match (value >> 29) & 0x3 {
                    0b11 => cq.armed = true,
                    0b10 => cq.armed = false, // bit 30 alone disarms on QEMU
                    _ => {}                   // POLL, or bit 29 alone (ignored)
                }
                if value & (1 << 31) != 0 {
                    if ctx.msix_live {
                        // QEMU's completion thread raises the CQ interrupt holding the
                        // resource lock and then waits for the global lock; a vCPU's POLL
                        // holds the global lock and waits for the resource lock.
                        ctx.violations.qemu(
                            0,
                            format!(
                                "POLL doorbell of CQ {handle} with MSI-X on: QEMU's completion \
                                 thread and this vCPU can deadlock"
                            ),
                        );
                    }
                    self.poll_lies(ctx, handle);
                }
            }
            0x8 => self.take_srq_recvs(ctx, handle),
            other => ctx
                .violations
                .qemu(0, format!("doorbell at unknown offset {other:#x}")),
        }
    }

    /// Hostile ([`point::WRITE`]): rewrites one field of memory the driver gave the device —
    /// a ring-state word of a QP, SRQ or CQ (either index), the `wr_id` of a WQE slot, or a
    /// field of a CQE slot. (Never an SGE: a device that DMAs where it likes is beyond what a
    /// driver can check.)
    fn scribble(&mut self, ctx: &mut Ctx<'_>) {
        // (address, width) of every candidate field.
        let mut fields: Vec<(u64, usize)> = Vec::new();
        let ring = |g: &RingGeo, fields: &mut Vec<(u64, usize)>, pick: u64| {
            if g.slots == 0 || g.pages.is_empty() {
                return;
            }
            fields.push((g.state + g.state_off, 4));
            fields.push((g.state + g.state_off + 4, 4));
            if let Some(a) = g.wqe((pick % u64::from(g.slots)) as u32) {
                fields.push((a, 8));
            }
        };
        for qp in self.qps.iter().flatten() {
            let pick = ctx.liar.next_u64();
            ring(&qp.data.sq, &mut fields, pick);
            ring(&qp.data.rq, &mut fields, pick >> 32);
        }
        for srq in self.srqs.iter().flatten() {
            ring(&srq.data.ring, &mut fields, ctx.liar.next_u64());
        }
        for cq in self.cqs.iter().flatten() {
            let Some(&state) = cq.pages.first() else {
                continue;
            };
            fields.push((state + 8, 4));
            fields.push((state + 12, 4));
            let (off, width) = ctx.liar.pick(&CQE_FIELDS);
            if let Some(a) = cq.cqe_addr(ctx.liar.below(u64::from(cq.cqe.max(1))) as u32) {
                fields.push((a + off as u64, width));
            }
        }
        if fields.is_empty() {
            return;
        }
        let (pa, width) = ctx.liar.pick(&fields);
        if let Some(mut b) = ctx.mem.read(pa, width) {
            ctx.liar.mutate_field(&mut b, 0, width);
            ctx.mem.write(pa, &b);
        }
    }

    /// Reads the ring's indices; `None` (and a violation) when they are invalid.
    fn ring_indices(ctx: &mut Ctx<'_>, g: &RingGeo) -> Option<(u32, u32)> {
        let Some(b) = ctx.mem.read(g.state + g.state_off, 8) else {
            ctx.violations
                .freed(format!("ring state {:#x} is not allocated", g.state));
            return None;
        };
        let (prod, cons) = (le32(&b, 0), le32(&b, 4));
        let n2 = 2 * u64::from(g.slots);
        if u64::from(prod) >= n2 || u64::from(cons) >= n2 {
            ctx.violations.qemu(
                point::RING | point::PROTOCOL,
                format!("ring index out of range: prod {prod} cons {cons}"),
            );
            return None;
        }
        Some((prod, cons))
    }

    fn set_cons(ctx: &mut Ctx<'_>, g: &RingGeo, mut cons: u32) {
        // Hostile: a consumer index that is not the one the device reached.
        if ctx.liar.roll(point::RING) {
            cons = ctx.liar.mutate32(cons);
        }
        ctx.mem
            .write(g.state + g.state_off + 4, &cons.to_le_bytes());
    }

    /// Reads receive WQE `slot`; an error is a violation and the lies that may excuse it.
    fn read_recv(
        ctx: &mut Ctx<'_>,
        g: &RingGeo,
        slot: u32,
        max_sge: u32,
    ) -> Result<Recv, (u32, String)> {
        let at = g
            .wqe(slot)
            .ok_or((0, "receive WQE outside the ring's pages".to_owned()))?;
        let unreadable = || {
            (
                point::PROTOCOL,
                format!("receive WQE {at:#x} is not allocated"),
            )
        };
        let hdr = ctx.mem.read(at, 16).ok_or_else(unreadable)?;
        let n = le32(&hdr, 8);
        if n > max_sge {
            // The driver checks against the caps: lied caps rightly mislead it.
            return Err((
                point::CAPS | point::PROTOCOL,
                format!("receive WQE with {n} SGEs > max_sge {max_sge}: QEMU loops forever"),
            ));
        }
        let b = ctx
            .mem
            .read(at + 16, 16 * n as usize)
            .ok_or_else(unreadable)?;
        let sges = (0..n as usize)
            .map(|k| {
                (
                    le64(&b, 16 * k),
                    le32(&b, 16 * k + 8),
                    le32(&b, 16 * k + 12),
                )
            })
            .collect();
        Ok(Recv {
            wr_id: le64(&hdr, 0),
            sges,
        })
    }

    /// Moves every receive WQE of ring `g` into `into`, as QEMU posts them to the host at the
    /// doorbell, and advances the ring.
    fn drain_recvs(ctx: &mut Ctx<'_>, g: &RingGeo, max_sge: u32, into: &mut VecDeque<Recv>) {
        let Some((prod, mut cons)) = Self::ring_indices(ctx, g) else {
            return;
        };
        while cons != prod {
            match Self::read_recv(ctx, g, g.slot(cons), max_sge) {
                Ok(r) => into.push_back(r),
                Err((excused_by, v)) => {
                    ctx.violations.qemu(excused_by, v);
                    return;
                }
            }
            cons = g.next(cons);
        }
        Self::set_cons(ctx, g, cons);
    }

    fn take_recvs(&mut self, ctx: &mut Ctx<'_>, i: usize) {
        let max_sge = ctx.cfg.caps.max_sge;
        let qp = self.qps[i].as_mut().expect("indexed");
        if qp.srq.is_some() {
            // (A lied QP number can make the driver ring another QP's doorbell.)
            ctx.violations.qemu(
                point::PROTOCOL,
                "RECV doorbell on a QP with an SRQ: QEMU reads past its allocation",
            );
            return;
        }
        let g = qp.data.rq.clone();
        Self::drain_recvs(ctx, &g, max_sge, &mut qp.data.recvs);
        if self.in_error(ctx, i) {
            self.flush_recvs(ctx, i);
        }
    }

    /// Under `Semantics::Verbs`, whether RC QP `i` is in the error state the device moved it
    /// to (QEMU's records follow the driver's commands only).
    fn in_error(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        ctx.cfg.semantics == Semantics::Verbs
            && self.qps[i]
                .as_ref()
                .is_some_and(|q| q.host_state == crate::device::QPS_ERR)
    }

    /// `Semantics::Verbs`: a request of RC QP `i` failed, or a request to it did; the QP
    /// goes to ERROR, as on rxe and hardware. A responder's receives are flushed at once;
    /// a requester's once the rest of its send queue is (`run_sq`).
    fn enter_error(&mut self, ctx: &mut Ctx<'_>, i: usize, responder: bool) {
        if ctx.cfg.semantics != Semantics::Verbs {
            return;
        }
        let Some(qp) = self.qps[i].as_mut() else {
            return;
        };
        if qp.qp_type != crate::device::QPT_RC {
            return;
        }
        qp.state = crate::device::QPS_ERR;
        qp.host_state = crate::device::QPS_ERR;
        if responder {
            self.flush_recvs(ctx, i);
        } else {
            qp.data.flush_rq = true;
        }
    }

    /// Completes every receive QP `i` holds (not its SRQ's) as flushed.
    fn flush_recvs(&mut self, ctx: &mut Ctx<'_>, i: usize) {
        let Some(qp) = self.qps[i].as_mut() else {
            return;
        };
        qp.data.flush_rq = false;
        let (me, rcq) = (qp.qpn, qp.rcq);
        let recvs: Vec<Recv> = qp.data.recvs.drain(..).collect();
        for r in recvs {
            self.post_cqe(
                ctx,
                rcq,
                Cqe {
                    wr_id: r.wr_id,
                    qp: me,
                    opcode: WC_RECV,
                    status: ST_WR_FLUSH,
                    byte_len: 0,
                    imm: 0,
                    src_qp: 0,
                    flags: 0,
                },
            );
        }
    }

    fn take_srq_recvs(&mut self, ctx: &mut Ctx<'_>, handle: u32) {
        let max_sge = ctx.cfg.caps.max_srq_sge;
        let Some(srq) = self.srqs.get_mut(handle as usize).and_then(Option::as_mut) else {
            ctx.violations.qemu(
                point::PROTOCOL,
                format!("SRQ doorbell for unknown SRQ {handle}"),
            );
            return;
        };
        let g = srq.data.ring.clone();
        Self::drain_recvs(ctx, &g, max_sge, &mut srq.data.recvs);
    }

    /// Whether QP `i` has a receive to take (its own, or its SRQ's).
    fn has_recv(&self, i: usize) -> bool {
        let Some(qp) = self.qps[i].as_ref() else {
            return false;
        };
        match qp.srq {
            Some(s) => self
                .srqs
                .get(s as usize)
                .and_then(Option::as_ref)
                .is_some_and(|s| !s.data.recvs.is_empty()),
            None => !qp.data.recvs.is_empty(),
        }
    }

    /// Takes the next receive of QP `i` (from its SRQ if it has one, which may then reach its
    /// limit).
    fn pop_recv(&mut self, ctx: &mut Ctx<'_>, i: usize) -> Option<Recv> {
        let qp = self.qps[i].as_mut()?;
        match qp.srq {
            Some(s) => {
                let r = self
                    .srqs
                    .get_mut(s as usize)?
                    .as_mut()?
                    .data
                    .recvs
                    .pop_front();
                self.srq_limit_check(ctx, s);
                r
            }
            None => qp.data.recvs.pop_front(),
        }
    }

    fn run_sq(&mut self, ctx: &mut Ctx<'_>, i: usize) {
        let qp = self.qps[i].as_ref().expect("indexed");
        if qp.data.hung {
            return;
        }
        let g = qp.data.sq.clone();
        let Some((prod, mut cons)) = Self::ring_indices(ctx, &g) else {
            return;
        };
        while cons != prod {
            let Some(addr) = g.wqe(g.slot(cons)) else {
                ctx.violations.qemu(0, "send WQE outside the ring's pages");
                return;
            };
            let Some(hdr) = ctx.mem.read(addr, 80) else {
                return;
            };
            let num_sge = le32(&hdr, 0x08);
            let gid_index = hdr[0x41];
            let qp = self.qps[i].as_ref().expect("indexed");
            let gsi = qp.qp_type == crate::device::QPT_GSI;
            // QEMU's checks; on failure it posts an error CQE and does not advance: it hangs.
            if !gsi
                && self
                    .gids
                    .get(usize::from(gid_index))
                    .copied()
                    .flatten()
                    .is_none()
            {
                // (A device that lies about its ring indices walks slots the driver never
                // wrote — zeroed ones name GID 0: that lie excuses it.)
                ctx.violations.qemu(
                    point::PROTOCOL | point::RING,
                    format!("send WQE with unbound GID index {gid_index}: QEMU loops forever"),
                );
                self.qps[i].as_mut().expect("indexed").data.hung = true;
                return;
            }
            if num_sge > ctx.cfg.caps.max_sge {
                // The driver checks against the caps: lied caps rightly mislead it.
                ctx.violations.qemu(
                    point::CAPS | point::PROTOCOL,
                    format!("send WQE with {num_sge} SGEs > max_sge: QEMU loops forever"),
                );
                self.qps[i].as_mut().expect("indexed").data.hung = true;
                return;
            }
            let Some(sb) = ctx.mem.read(addr + 80, 16 * num_sge as usize) else {
                return;
            };
            let sges: Vec<_> = (0..num_sge as usize)
                .map(|k| {
                    (
                        le64(&sb, 16 * k),
                        le32(&sb, 16 * k + 8),
                        le32(&sb, 16 * k + 12),
                    )
                })
                .collect();
            if self.in_error(ctx, i) {
                self.flush_send(ctx, i, &hdr);
            } else {
                self.execute(ctx, i, &hdr, &sges);
            }
            cons = g.next(cons);
            Self::set_cons(ctx, &g, cons);
        }
        if self.qps[i].as_ref().is_some_and(|q| q.data.flush_rq) {
            self.flush_recvs(ctx, i);
        }
    }

    /// Completes a send WQE of a QP in ERROR as flushed (signaled or not, as the verbs have
    /// it), with the completion opcode of its work request.
    fn flush_send(&mut self, ctx: &mut Ctx<'_>, i: usize, hdr: &[u8]) {
        let qp = self.qps[i].as_ref().expect("indexed");
        let (me, scq) = (qp.qpn, qp.scq);
        self.post_cqe(
            ctx,
            scq,
            Cqe {
                wr_id: le64(hdr, 0),
                qp: me,
                opcode: wc_opcode(le32(hdr, 0x10)),
                status: ST_WR_FLUSH,
                byte_len: 0,
                imm: 0,
                src_qp: 0,
                flags: 0,
            },
        );
    }

    /// Runs one send WQE of QP `i`.
    fn execute(&mut self, ctx: &mut Ctx<'_>, i: usize, hdr: &[u8], sges: &[(u64, u32, u32)]) {
        let qp = self.qps[i].as_ref().expect("indexed");
        let (me, pd, scq, sq_sig_all, ty) = (qp.qpn, qp.pd, qp.scq, qp.sq_sig_all, qp.qp_type);
        let wr_id = le64(hdr, 0);
        let qemu = ctx.cfg.semantics == Semantics::Qemu;
        let mut opcode = le32(hdr, 0x10);
        let signaled = qemu || sq_sig_all || le32(hdr, 0x14) & 2 != 0;
        if qemu {
            opcode = 2; // every opcode runs as SEND (§8.6)
        }
        let imm = if qemu { 0 } else { le32(hdr, 0x18) };
        let (remote_addr, rkey) = (le64(hdr, 0x20), le32(hdr, 0x28));
        let done = |dev: &mut Device, ctx: &mut Ctx<'_>, status: u32, wc_op: u32, byte_len: u32| {
            if status != ST_OK {
                dev.enter_error(ctx, i, false);
            }
            if signaled || status != ST_OK {
                dev.post_cqe(
                    ctx,
                    scq,
                    Cqe {
                        wr_id,
                        qp: me,
                        opcode: wc_op,
                        status,
                        byte_len,
                        imm: 0,
                        src_qp: 0,
                        flags: 0,
                    },
                );
            }
        };
        let Some(data) = (if opcode == 4 {
            Some(Vec::new())
        } else {
            self.gather(ctx, sges, pd)
        }) else {
            return done(self, ctx, ST_LOC_PROT, wc_opcode(opcode), 0);
        };
        // The destination QP.
        let (dest, ud) = match ty {
            crate::device::QPT_UD => (le32(hdr, 0x20), true),
            crate::device::QPT_GSI => {
                let st = gsi::send(self, ctx, hdr, sges);
                return done(self, ctx, st, 0, 0);
            }
            _ => (self.qps[i].as_ref().expect("indexed").dest_qpn, false),
        };
        let Some(j) = self.qp_index(dest) else {
            // UD to nowhere is dropped; an RC peer that does not exist never acknowledges.
            return match ud {
                true => done(self, ctx, ST_OK, 0, data.len() as u32),
                false => done(self, ctx, ST_RETRY_EXC, 0, 0),
            };
        };
        if !ud && self.in_error(ctx, j) {
            // A responder in ERROR drops every request: the requester's retries run out.
            return done(self, ctx, ST_RETRY_EXC, wc_opcode(opcode), 0);
        }
        let verbs = ctx.cfg.semantics == Semantics::Verbs;
        let (dest_access, dest_depth) = {
            let d = self.qps[j].as_ref().expect("indexed");
            (d.access, d.max_dest_rd_atomic)
        };
        // The responder QP's rights and READ depth (`Semantics::Verbs`): a request the QP
        // does not take is an invalid request, and the responder goes to ERROR (rxe's order:
        // the depth, then the right, then the key).
        let refused = verbs
            && !ud
            && match opcode {
                0 | 1 => dest_access & ACC_REMOTE_WRITE == 0,
                4 => dest_depth == 0 || dest_access & ACC_REMOTE_READ == 0,
                _ => false,
            };
        if refused {
            self.enter_error(ctx, j, true);
            return done(self, ctx, ST_REM_INV_REQ, wc_opcode(opcode), 0);
        }
        if ud {
            let qkey = le32(hdr, 0x24);
            let d = self.qps[j].as_ref().expect("indexed");
            if d.qp_type != crate::device::QPT_UD || d.qkey != qkey {
                return done(self, ctx, ST_OK, 0, data.len() as u32); // dropped on the wire
            }
        }
        let dest_pd = self.qps[j].as_ref().expect("indexed").pd;
        let dest_rcq = self.qps[j].as_ref().expect("indexed").rcq;
        match opcode {
            0 | 1 => {
                // RDMA WRITE (with immediate)
                let mtu = match self.qps[i].as_ref().expect("indexed").path_mtu {
                    code @ 1..=5 => 128usize << code,
                    _ => 4096,
                };
                if verbs && opcode == 1 && data.len() <= mtu && !self.has_recv(j) {
                    // A one-packet WRITE with immediate: rxe checks for the receive (RNR)
                    // before the key (a longer one has its key checked by its first packet).
                    return done(self, ctx, ST_RNR, 1, 0);
                }
                let Some(pieces) = self.translate(
                    rkey,
                    true,
                    remote_addr,
                    data.len() as u32,
                    ACC_REMOTE_WRITE,
                    Some(dest_pd),
                ) else {
                    self.enter_error(ctx, j, true);
                    return done(self, ctx, ST_REM_ACCESS, 1, 0);
                };
                if opcode == 1 {
                    let Some(r) = self.pop_recv(ctx, j) else {
                        return done(self, ctx, ST_RNR, 1, 0);
                    };
                    self.post_cqe(
                        ctx,
                        dest_rcq,
                        Cqe {
                            wr_id: r.wr_id,
                            qp: dest,
                            opcode: 129,
                            status: ST_OK,
                            byte_len: data.len() as u32,
                            imm,
                            src_qp: me,
                            flags: 2,
                        },
                    );
                }
                let mut rest = &data[..];
                for (pa, n) in pieces {
                    ctx.mem.write(pa, &rest[..n]);
                    rest = &rest[n..];
                }
                done(self, ctx, ST_OK, 1, data.len() as u32)
            }
            4 => {
                // RDMA READ
                let len = sges.iter().fold(0u32, |a, s| a.saturating_add(s.1));
                let Some(pieces) =
                    self.translate(rkey, true, remote_addr, len, ACC_REMOTE_READ, Some(dest_pd))
                else {
                    self.enter_error(ctx, j, true);
                    return done(self, ctx, ST_REM_ACCESS, 2, 0);
                };
                let mut bytes = Vec::new();
                for (pa, n) in pieces {
                    bytes.extend(ctx.mem.read(pa, n).unwrap_or_default());
                }
                match self.scatter(ctx, sges, pd, &bytes) {
                    Ok(()) => done(self, ctx, ST_OK, 2, len),
                    Err(st) => done(self, ctx, st, 2, 0),
                }
            }
            _ => {
                // SEND (with immediate)
                let Some(r) = self.pop_recv(ctx, j) else {
                    return match ud {
                        true => done(self, ctx, ST_OK, 0, data.len() as u32),
                        false => done(self, ctx, ST_RNR, 0, 0),
                    };
                };
                let mut payload = Vec::new();
                let mut flags = if opcode == 3 && !qemu { 2 } else { 0 };
                if ud {
                    // The first 40 bytes of a UD receive hold the GRH.
                    let dgid: [u8; 16] = hdr[0x30..0x40].try_into().expect("16 bytes");
                    let sgid = self.gids.get(usize::from(hdr[0x41])).copied().flatten();
                    let grh = match (ipv4_of(&dgid), sgid.as_ref().and_then(ipv4_of)) {
                        (Some(dst), Some(src)) => ipv4_grh(src, dst, data.len()),
                        _ => {
                            let mut grh = [0u8; 40];
                            grh[0] = 0x60;
                            grh[4..6].copy_from_slice(&(data.len() as u16).to_be_bytes());
                            grh[6] = 0x1B;
                            grh[7] = 1;
                            grh[8..24].copy_from_slice(&dgid);
                            grh[24..40].copy_from_slice(&dgid);
                            grh
                        }
                    };
                    payload.extend_from_slice(&grh);
                    flags |= 1;
                } else if qemu {
                    // QEMU hands over the host's completion: on RoCE (rxe) an RC receive
                    // carries the GRH flag and source QP 0, as the lab showed.
                    flags |= 1;
                }
                let src_qp = if qemu && !ud { 0 } else { me };
                payload.extend_from_slice(&data);
                match self.scatter(ctx, &r.sges, dest_pd, &payload) {
                    Ok(()) => {
                        self.post_cqe(
                            ctx,
                            dest_rcq,
                            Cqe {
                                wr_id: r.wr_id,
                                qp: dest,
                                opcode: 128,
                                status: ST_OK,
                                byte_len: payload.len() as u32,
                                imm: if flags & 2 != 0 { imm } else { 0 },
                                src_qp,
                                flags,
                            },
                        );
                        done(self, ctx, ST_OK, 0, data.len() as u32)
                    }
                    Err(st) => {
                        self.post_cqe(
                            ctx,
                            dest_rcq,
                            Cqe {
                                wr_id: r.wr_id,
                                qp: dest,
                                opcode: 128,
                                status: st,
                                byte_len: 0,
                                imm: 0,
                                src_qp: me,
                                flags: 0,
                            },
                        );
                        self.enter_error(ctx, j, true);
                        done(self, ctx, ST_REM_INV_REQ, 0, 0)
                    }
                }
            }
        }
    }

    fn post_cqe(&mut self, ctx: &mut Ctx<'_>, cq_handle: u32, c: Cqe) {
        let mut e = [0u8; 64];
        e[0..8].copy_from_slice(&c.wr_id.to_le_bytes());
        e[8..16].copy_from_slice(&u64::from(c.qp).to_le_bytes());
        for (off, v) in [
            (0x10, c.opcode),
            (0x14, c.status),
            (0x18, c.byte_len),
            (0x1C, c.imm),
            (0x20, c.src_qp),
            (0x24, c.flags),
        ] {
            put32(&mut e, off, v);
        }
        if c.status != ST_OK && c.status != ST_WR_FLUSH {
            // (A flush carries no detail: the request never ran.)
            put32(&mut e, 0x28, 0x201);
        }
        // Hostile: the CQE is dropped, posted twice, or one to three of its fields lie.
        let mut copies = 1;
        if ctx.liar.roll(point::CQE) {
            match ctx.liar.below(8) {
                0 => copies = 0,
                1 => copies = 2,
                _ => {
                    for _ in 0..1 + ctx.liar.below(3) {
                        let (off, width) = ctx.liar.pick(&CQE_FIELDS);
                        ctx.liar.mutate_field(&mut e, off, width);
                    }
                }
            }
        }
        for _ in 0..copies {
            self.write_cqe(ctx, cq_handle, &e);
        }
    }

    /// Puts a CQE in CQ `cq_handle`'s ring and advances its prod_tail, as QEMU does.
    fn write_cqe(&mut self, ctx: &mut Ctx<'_>, cq_handle: u32, e: &[u8; 64]) {
        let Some(cq) = self
            .cqs
            .get_mut(cq_handle as usize)
            .and_then(Option::as_mut)
        else {
            ctx.violations
                .qemu(point::PROTOCOL, format!("CQE for unknown CQ {cq_handle}"));
            return;
        };
        let n = cq.cqe;
        let state = cq.pages[0] + 8;
        let Some(b) = ctx.mem.read(state, 8) else {
            ctx.violations
                .freed(format!("CQ {cq_handle}'s ring state is not allocated"));
            return;
        };
        let (prod, cons) = (le32(&b, 0), le32(&b, 4));
        if prod >= 2 * n || cons >= 2 * n {
            ctx.violations.qemu(
                point::RING | point::PROTOCOL,
                format!("CQ {cq_handle} indices out of range"),
            );
            return;
        }
        if prod == cons ^ n {
            // The driver budgets its CQs: spurious CQEs and lied indices rightly defeat that.
            ctx.violations.qemu(
                point::CQE | point::RING | point::PROTOCOL,
                format!("CQ {cq_handle} full: QEMU drops the CQE silently"),
            );
            return;
        }
        let Some(pa) = cq.cqe_addr(prod) else {
            ctx.violations
                .qemu(0, format!("CQ {cq_handle}: CQE outside the ring's pages"));
            return;
        };
        if !ctx.mem.write(pa, e) {
            ctx.violations
                .freed(format!("CQ {cq_handle}'s ring is not allocated"));
        }
        let mut next = (prod + 1) & (2 * n - 1);
        // Hostile: a producer index that is not where the CQEs are.
        if ctx.liar.roll(point::RING) {
            next = ctx.liar.mutate32(next);
        }
        ctx.mem.write(state, &next.to_le_bytes());
        self.cqes += 1;
        // The CQ-notification ring gets the CQ handle; an armed CQ raises vector 2, once.
        // With that ring full QEMU logs "rdma: CQ is full" and returns: the CQE stays, but
        // no interrupt is raised and the arm stays set (a polling driver never drains the
        // ring, so in the lab every CQE after the 1024th logged it).
        let mut ring_full = false;
        if let Some(&ring_state) = self.ring_pages.first() {
            let slots = 1024u32;
            if let Some(b) = ctx.mem.read(ring_state + 8, 8) {
                let (p, q) = (le32(&b, 0), le32(&b, 4));
                if p < 2 * slots && p != q ^ slots {
                    let data = self.ring_pages[1] + u64::from(p & (slots - 1)) * 4;
                    ctx.mem.write(data, &cq_handle.to_le_bytes());
                    ctx.mem
                        .write(ring_state + 8, &((p + 1) & (2 * slots - 1)).to_le_bytes());
                } else if p == q ^ slots {
                    ring_full = true;
                    self.notify_ring_full += 1;
                }
            }
        }
        if cq.armed && !ring_full {
            cq.armed = false;
            self.interrupts += 1;
            self.raised.push(2);
        }
    }

    /// Hostile, at a CQ's POLL doorbell: CQEs no work request asked for, or a producer index
    /// that lies.
    fn poll_lies(&mut self, ctx: &mut Ctx<'_>, cq_handle: u32) {
        if ctx.liar.roll(point::CQE) {
            let qpns: Vec<u32> = self.qps.iter().flatten().map(|q| q.qpn).collect();
            for _ in 0..1 + ctx.liar.below(3) {
                let mut e = [0u8; 64];
                if ctx.liar.below(4) == 0 {
                    // Noise.
                    for chunk in e.chunks_mut(8) {
                        chunk.copy_from_slice(&ctx.liar.next_u64().to_le_bytes());
                    }
                } else {
                    // Plausible: a real QP, a real opcode and status, then some lies.
                    let qpn = if qpns.is_empty() || ctx.liar.below(4) == 0 {
                        ctx.liar.mutate32(0x11)
                    } else {
                        ctx.liar.pick(&qpns)
                    };
                    let wr_id = ctx.liar.mutate(0, 64);
                    e[0..8].copy_from_slice(&wr_id.to_le_bytes());
                    e[8..16].copy_from_slice(&u64::from(qpn).to_le_bytes());
                    put32(&mut e, 0x10, ctx.liar.pick(&[0, 1, 2, 3, 4, 128, 129]));
                    put32(&mut e, 0x14, ctx.liar.pick(&[0, 0, 0, 5, 12, 21]));
                    put32(&mut e, 0x18, ctx.liar.below(5000) as u32);
                    for _ in 0..ctx.liar.below(3) {
                        let (off, width) = ctx.liar.pick(&CQE_FIELDS);
                        ctx.liar.mutate_field(&mut e, off, width);
                    }
                }
                self.write_cqe(ctx, cq_handle, &e);
            }
        }
        if ctx.liar.roll(point::RING)
            && let Some(cq) = self.cqs.get(cq_handle as usize).and_then(Option::as_ref)
        {
            let state = cq.pages[0] + 8;
            if let Some(b) = ctx.mem.read(state, 4) {
                let lie = ctx.liar.mutate32(le32(&b, 0));
                ctx.mem.write(state, &lie.to_le_bytes());
            }
        }
    }

    pub(crate) fn inject_raw_cqe(
        &mut self,
        mem: &mut crate::mem::Memory,
        cq: u32,
        bytes: [u8; 64],
    ) {
        let Some(cq) = self.cqs.get(cq as usize).and_then(Option::as_ref) else {
            return;
        };
        let n = cq.cqe;
        let state = cq.pages[0] + 8;
        let Some(b) = mem.read(state, 4) else { return };
        let prod = le32(&b, 0);
        let Some(pa) = cq.cqe_addr(prod) else { return };
        mem.write(pa, &bytes);
        mem.write(state, &(prod.wrapping_add(1) & (2 * n - 1)).to_le_bytes());
    }

    pub(crate) fn consume_rings(&mut self, mem: &mut crate::mem::Memory, qpn: u32) {
        let Some(i) = self.qp_index(qpn) else { return };
        let qp = self.qps[i].as_ref().expect("indexed");
        for g in [&qp.data.sq, &qp.data.rq] {
            if g.slots == 0 {
                continue;
            }
            if let Some(b) = mem.read(g.state + g.state_off, 4) {
                mem.write(g.state + g.state_off + 4, &b);
            }
        }
    }

    pub(crate) fn set_cq_cons(&mut self, mem: &mut crate::mem::Memory, cq: u32, value: u32) {
        if let Some(cq) = self.cqs.get(cq as usize).and_then(Option::as_ref) {
            mem.write(cq.pages[0] + 12, &value.to_le_bytes());
        }
    }

    pub(crate) fn set_wqe_wr_id(
        &mut self,
        mem: &mut crate::mem::Memory,
        qpn: u32,
        recv: bool,
        slot: u32,
        wr_id: u64,
    ) {
        let Some(i) = self.qp_index(qpn) else { return };
        let qp = self.qps[i].as_ref().expect("indexed");
        let g = if recv { &qp.data.rq } else { &qp.data.sq };
        if g.slots != 0
            && let Some(pa) = g.wqe(slot % g.slots)
        {
            mem.write(pa, &wr_id.to_le_bytes());
        }
    }

    pub(crate) fn set_cq_prod(&mut self, mem: &mut crate::mem::Memory, cq: u32, value: u32) {
        if let Some(cq) = self.cqs.get(cq as usize).and_then(Option::as_ref) {
            mem.write(cq.pages[0] + 8, &value.to_le_bytes());
        }
    }

    /// Writes a CQE straight into a CQ (benchmarks: completions without a doorbell).
    pub(crate) fn inject_cqe(&mut self, ctx: &mut Ctx<'_>, cq: u32, qpn: u32, wr_id: u64) {
        self.post_cqe(
            ctx,
            cq,
            Cqe {
                wr_id,
                qp: qpn,
                opcode: 0,
                status: ST_OK,
                byte_len: 0,
                imm: 0,
                src_qp: 0,
                flags: 0,
            },
        );
    }
}

/// The completion opcode of a send work request's opcode (PVRDMA numbering, as IB's).
fn wc_opcode(wr_opcode: u32) -> u32 {
    match wr_opcode {
        0 | 1 => 1, // RDMA WRITE (with immediate)
        4 => 2,     // RDMA READ
        5 => 3,     // compare and swap
        6 => 4,     // fetch and add
        _ => 0,     // SEND (with immediate, with invalidate)
    }
}

/// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
fn ipv4_of(gid: &[u8; 16]) -> Option<[u8; 4]> {
    (gid[..10] == [0; 10] && gid[10..12] == [0xFF, 0xFF]).then(|| gid[12..].try_into().expect("4"))
}

/// The GRH area of a UD receive between IPv4-mapped GIDs, as rxe (RoCE v2 over IPv4) writes
/// it, observed through QEMU's pvrdma in the nested lab: 20 zero bytes, then the packet's
/// 20-byte IPv4 header — version 4, IHL 5, TOS 0 (QEMU builds its address handle without the
/// traffic class), the total length of
/// IP + UDP (8) + BTH (12) + DETH (8) + payload + ICRC (4), DF, TTL 64 (not the address
/// handle's hop limit 1), protocol UDP, source and destination from the GIDs. The checksum
/// reads 0: between two addresses of one host rxe loops the packet back without computing it.
fn ipv4_grh(src: [u8; 4], dst: [u8; 4], len: usize) -> [u8; 40] {
    let mut grh = [0u8; 40];
    let ip = &mut grh[20..];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + 8 + 12 + 8 + len + 4) as u16).to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dst);
    grh
}
