//! Queue pairs: creation (the state and both rings in one HAL block, completion-queue room
//! reserved), modify, query and destroy.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use bareverbs_hal::{Clock, Hal, Link};

use super::cq::Cq;
use super::mem::Pd;
use super::port::{PATHS6, Port};
use super::qp_lock::{HEAD_BYTES, QpGuard};
use super::qp_state::QpCore;
use super::srq::Srq;
use super::wire::addr::{rc_source_port, ud_source_port};
use super::wire::ip6::{Ip6, V6_EXTRA, martian6};
use super::wqe::{Inbound, RdResource, RqEntry, SqEntry};
use super::{FIRST_QPN, GSI_QPN, MAX_INLINE, MAX_QP, MAX_RD_ATOMIC, MAX_SGE, MAX_WR, Rxe};
use crate::dma::Dma;
use crate::error::{Attr, Error, Feature, Object, Op, Param, Resource, Result, Unsupported};
use crate::verbs::{ModifyAttr, QpAttr, QpCaps, QpInit, QpState, QpType};

/// The IPv6 source and destination of a connected QP whose address vector names an IPv6
/// destination GID: the source GID is the link-local one (index 0) or a global one (2 and
/// up); the IPv4-mapped one (1) with an IPv6 peer, a destination no station has, and one of
/// this interface's own addresses (loopback over IPv6) are refused (`Feature::Ipv6`).
pub(super) fn ipv6_path(port: &Port, av: &crate::verbs::AddressVector) -> Result<(Ip6, Ip6)> {
    let refused = Error::Unsupported(Unsupported::Feature(Feature::Ipv6));
    let dst = av.dgid.0;
    if av.sgid_index == 1 || martian6(&dst) || port.has_ipv6(&dst) {
        return Err(refused);
    }
    match port.gid(u32::from(av.sgid_index)) {
        Some(g) => Ok((g.0, dst)),
        None => Err(Error::invalid(
            Param::GidIndex,
            av.sgid_index,
            super::port::GIDS - 1,
        )),
    }
}

/// A queue pair.
pub struct Qp<H: Hal> {
    _mem: Dma<H>,
    pub(crate) core: NonNull<QpCore>,
    pub(crate) qpn: u32,
    pub(crate) caps: QpCaps,
    pub(crate) qp_type: QpType,
    pub(crate) has_srq: bool,
    /// The PD's and the SRQ's use counts (they outlive the QP and do not move).
    pd_users: NonNull<AtomicU32>,
    srq_users: Option<NonNull<AtomicU32>>,
    /// Requests posted (mirrors the core's heads: only posting changes them).
    pub(crate) sq_head: u32,
    pub(crate) rq_head: u32,
}

// SAFETY: the core is reached only under the QP's own lock (`qp_lock`).
unsafe impl<H: Hal + Send> Send for Qp<H> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync> Sync for Qp<H> {}

/// Another living QP than `me` that takes its receives from `srq` and completes them on
/// `cq` (device lock held: `t`; the caller holds no QP lock: each candidate's is taken to
/// look at it).
fn pair_holder(
    t: &super::tables::Tables,
    srq: NonNull<super::srq::SrqCore>,
    cq: NonNull<super::cq::CqRing>,
    me: *mut QpCore,
) -> Option<NonNull<QpCore>> {
    t.qps.iter().copied().filter(|&q| q != me).find_map(|q| {
        let q = NonNull::new(q)?;
        // SAFETY: the table's non-null entries are living QP cores (destroy takes them out
        // under the device lock, held here); no other QP lock is held.
        let g = unsafe { QpGuard::lock(q) };
        (g.srq == Some(srq) && g.recv_cq == cq).then_some(q)
    })
}

/// Rounds a queue depth up to what the rings hold, or refuses it.
fn depth(want: u32, param: Param) -> Result<u32> {
    if want > MAX_WR {
        return Err(Error::invalid(param, want, MAX_WR));
    }
    Ok(want.max(1))
}

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    pub(crate) fn plan_qp_impl(&self, init: &QpInit<'_>) -> Result<QpCaps> {
        match init.qp_type {
            QpType::Rc | QpType::Uc | QpType::Ud | QpType::Gsi => {}
            t => return Err(Error::Unsupported(Unsupported::QpType(t))),
        }
        if !init.ex.create_flags.is_empty() {
            return Err(Error::Unsupported(Unsupported::Feature(
                Feature::CreateFlags,
            )));
        }
        if init.ex.source_qpn.is_some() {
            return Err(Error::Unsupported(Unsupported::Feature(Feature::SourceQpn)));
        }
        if init.ex.rx_hash.is_some() {
            return Err(Error::Unsupported(Unsupported::Feature(Feature::Rss)));
        }
        if init.ex.max_tso_header != 0 {
            return Err(Error::Unsupported(Unsupported::Feature(Feature::Tso)));
        }
        if init.ex.xrcd.is_some() {
            return Err(Error::Unsupported(Unsupported::Feature(Feature::Xrc)));
        }
        let c = init.caps;
        if c.max_send_sge > MAX_SGE {
            return Err(Error::invalid(Param::MaxSendSge, c.max_send_sge, MAX_SGE));
        }
        if c.max_recv_sge > MAX_SGE {
            return Err(Error::invalid(Param::MaxRecvSge, c.max_recv_sge, MAX_SGE));
        }
        if c.max_inline_data > MAX_INLINE {
            return Err(Error::invalid(
                Param::MaxInlineData,
                c.max_inline_data,
                MAX_INLINE,
            ));
        }
        let send = depth(c.max_send_wr, Param::MaxSendWr)?;
        let (recv, recv_sge) = if init.has_srq {
            (0, 0)
        } else {
            (
                depth(c.max_recv_wr, Param::MaxRecvWr)?,
                c.max_recv_sge.max(1),
            )
        };
        Ok(QpCaps {
            max_send_wr: send,
            max_recv_wr: recv,
            max_send_sge: c.max_send_sge.max(1),
            max_recv_sge: recv_sge,
            max_inline_data: if c.max_inline_data > 0 { MAX_INLINE } else { 0 },
        })
    }

    pub(crate) fn create_qp_impl(
        &self,
        pd: &Pd,
        send_cq: &Cq<H>,
        recv_cq: &Cq<H>,
        srq: Option<&Srq<H>>,
        init: &QpInit<'_>,
    ) -> Result<Qp<H>> {
        let caps = self.plan_qp_impl(init)?;
        let (sq_cap, rq_cap) = (caps.max_send_wr, caps.max_recv_wr.max(1));
        // Completion-queue room is taken per post, not here: the CQ may be smaller than
        // the queues (`ibv_create_qp` has no such failure).
        let same = core::ptr::eq(send_cq, recv_cq);
        // The core, its lock (zeroed: unlocked), then the rings.
        let at_sq = HEAD_BYTES;
        // Each ring's slots: a power of two at least its capacity, so that a count's slot is
        // the count masked (and stays so as the counts wrap at 2^32).
        let (sq_slots, rq_slots) = (
            sq_cap.max(1).next_power_of_two(),
            rq_cap.next_power_of_two(),
        );
        let at_rq = at_sq + sq_slots as usize * size_of::<SqEntry>();
        let bytes = at_rq + rq_slots as usize * size_of::<RqEntry>();
        let mem = Dma::new(&self.hal, bytes.div_ceil(bareverbs_hal::PAGE_SIZE))?;
        let mut core = self.lock();
        let t = core.tables();
        let free = if init.qp_type == QpType::Gsi {
            t.gsi.is_null().then_some(GSI_QPN)
        } else {
            let i = t.qps.iter().position(|q| q.is_null());
            i.map(|i| FIRST_QPN + i as u32)
        };
        let Some(qpn) = free else {
            return Err(Error::Resource(Resource::Objects {
                object: Object::Qp,
                limit: if init.qp_type == QpType::Gsi {
                    1
                } else {
                    MAX_QP as u32
                },
            }));
        };
        let ptr = mem.base().cast::<QpCore>();
        // SAFETY: the block holds the core and both rings (page-aligned, zeroed: the rings'
        // entries are valid zeroed); the core is written before any reference to it.
        unsafe {
            ptr.write(QpCore {
                qpn,
                busy_bit: super::tables::Tables::bit(qpn),
                qp_type: init.qp_type,
                pd: pd.id,
                sig_all: init.sq_sig_all,
                state: QpState::Reset,
                attr: ModifyAttr::to_state(QpState::Reset),
                caps,
                send_cq: send_cq.ring,
                recv_cq: recv_cq.ring,
                srq: srq.map(|s| s.core),
                srq_reserved: 0,
                sq_pending: 0,
                rq_pending: 0,
                release: init.safe,
                peer_ip: [0; 4],
                peer_mac: None,
                src_port: ud_source_port(qpn),
                hdr: None,
                mtu: self.mtu,
                sq: mem.base().add(at_sq).cast(),
                sq_cap,
                sq_mask: sq_slots - 1,
                sq_head: 0,
                sq_tail: 0,
                sq_next: 0,
                cur_pkt: 0,
                psn: 0,
                una: 0,
                retries: 0,
                rnr_retries: 0,
                deadline: 0,
                rnr_until: 0,
                rq: mem.base().add(at_rq).cast(),
                rq_mask: rq_slots - 1,
                rq_head: 0,
                rq_tail: 0,
                epsn: 0,
                msn: 0,
                nak_sent: false,
                inbound: Inbound::Idle,
                wqe: RqEntry::default(),
                offset: 0,
                write_va: 0,
                write_rkey: 0,
                write_len: 0,
                res: [RdResource::default(); MAX_RD_ATOMIC as usize],
                res_next: 0,
                res_sent: 0,
                backlog: None,
                ack_due: None,
                seq_retry: false,
                gap_retry_at: 0,
            });
        }
        if let Some(slot) = t.qp_slot(qpn) {
            *slot = ptr.as_ptr();
        }
        if let Some(s) = srq {
            // The first QP of an (SRQ, receive CQ) pair reserves the SRQ's depth there.
            if pair_holder(t, s.core, recv_cq.ring, ptr.as_ptr()).is_none() {
                let r = recv_cq.ring().reserve_srq(s.attr().max_wr);
                // SAFETY: written above; not reachable by another thread before the device
                // lock (held) is let go.
                unsafe { (*ptr.as_ptr()).srq_reserved = r };
            }
        }
        send_cq.ring().users.fetch_add(1, Ordering::Relaxed);
        if !same {
            recv_cq.ring().users.fetch_add(1, Ordering::Relaxed);
        }
        pd.users.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = srq {
            s.users.fetch_add(1, Ordering::Relaxed);
        }
        drop(core);
        Ok(Qp {
            _mem: mem,
            core: ptr,
            qpn,
            caps,
            qp_type: init.qp_type,
            has_srq: srq.is_some(),
            pd_users: NonNull::from(&pd.users),
            srq_users: srq.map(|s| NonNull::from(&s.users)),
            sq_head: 0,
            rq_head: 0,
        })
    }

    pub(crate) fn modify_qp_impl(&self, qp: &mut Qp<H>, m: &ModifyAttr) -> Result<()> {
        let mut guard = self.lock();
        let now = self.now();
        let hub = self.hub();
        // SAFETY: the QP is alive (`qp` is borrowed); the device lock is held, no QP lock.
        let mut qg = unsafe { QpGuard::lock(qp.core) };
        let q = &mut *qg;
        let (link, t) = guard.parts();
        // Whatever the new state, the progress looks at the QP once (it leaves the busy set
        // again when it has nothing to do).
        self.mark(q.qpn);
        // The frames' outer headers are made again from the new path when next needed.
        q.hdr = None;
        let mut attr = q.attr;
        attr.merge(m);
        let has = |b| m.mask.contains(b);
        use crate::verbs::QpAttrMask as M;
        match m.state {
            QpState::Rtr if !q.datagram() && q.state != QpState::Rtr => {
                let av = attr.av.ok_or(Error::MissingAttribute {
                    op: Op::ModifyQp,
                    attr: Attr::Address,
                })?;
                // An IPv4-mapped destination: RoCEv2 over IPv4, from the interface's IPv4
                // address (GID 0 or 1). Another: over IPv6, from the source GID's address.
                let ipv6 = match av.dgid.ipv4() {
                    Some(_) if av.sgid_index > 1 => {
                        return Err(super::port::sgid_refused(av.sgid_index));
                    }
                    Some(_) => None,
                    None => Some(ipv6_path(&t.port, &av)?),
                };
                let mtu = attr.path_mtu.bytes();
                if mtu > self.mtu {
                    return Err(Error::invalid(
                        Param::PathMtu,
                        attr.path_mtu as u8,
                        self.mtu / 256,
                    ));
                }
                // Over IPv6 a frame is 20 bytes longer: the link must carry it.
                let room = link.max_frame().min(super::FRAME);
                if ipv6.is_some()
                    && mtu as usize + super::wire::packet::MAX_OVERHEAD + V6_EXTRA > room
                {
                    return Err(Error::invalid(
                        Param::PathMtu,
                        attr.path_mtu as u8,
                        self.mtu / 512,
                    ));
                }
                if attr.max_dest_rd_atomic as u32 > MAX_RD_ATOMIC {
                    return Err(Error::invalid(
                        Param::MaxRdAtomic,
                        attr.max_dest_rd_atomic,
                        MAX_RD_ATOMIC,
                    ));
                }
                let ip = match ipv6 {
                    None => av.dgid.ipv4().unwrap_or_default(),
                    Some((src, dst)) => {
                        t.port
                            .hold_path6(src, dst, av.flow_label)
                            .ok_or(Error::Resource(Resource::Objects {
                                object: Object::Ipv6Path,
                                limit: PATHS6 as u32,
                            }))?
                    }
                };
                // The path of an earlier connection given back (the new one held first: the
                // same path stays).
                t.port.release_path6(q.peer_ip);
                q.peer_ip = ip;
                q.peer_mac = None;
                q.mtu = mtu;
                q.src_port = rc_source_port(q.qpn, attr.dest_qpn, av.flow_label);
                q.epsn = attr.rq_psn & super::wire::bth::PSN_MASK;
                q.msn = 0;
                q.nak_sent = false;
                // Start resolving the peer now: the requester needs its MAC.
                if let Ok(Some(mac)) = t.port.resolve_any(link, ip, now) {
                    q.peer_mac = Some(mac);
                }
            }
            QpState::Rts if q.state != QpState::Rts => {
                if attr.max_rd_atomic as u32 > MAX_RD_ATOMIC {
                    return Err(Error::invalid(
                        Param::MaxRdAtomic,
                        attr.max_rd_atomic,
                        MAX_RD_ATOMIC,
                    ));
                }
                let psn = attr.sq_psn & super::wire::bth::PSN_MASK;
                q.psn = psn;
                q.una = psn;
                q.retries = attr.retry_cnt;
                q.rnr_retries = attr.rnr_retry;
            }
            QpState::Rts if has(M::SQ_PSN) => {
                q.psn = attr.sq_psn & super::wire::bth::PSN_MASK;
                q.una = q.psn;
            }
            QpState::Err => {
                q.attr = attr;
                q.enter_error(hub);
                return Ok(());
            }
            QpState::Reset => {
                q.discard();
                t.port.release_path6(q.peer_ip);
                q.peer_ip = [0; 4];
                q.peer_mac = None;
                q.msn = 0;
                attr = ModifyAttr::to_state(QpState::Reset);
            }
            _ => {}
        }
        q.attr = attr;
        q.state = m.state;
        Ok(())
    }

    pub(crate) fn query_qp_impl(&self, qp: &Qp<H>) -> QpAttr {
        // SAFETY: the QP is alive (`qp` is borrowed); no other lock is held.
        let q = unsafe { QpGuard::lock(qp.core) };
        let a = q.attr;
        QpAttr {
            state: q.state,
            cur_state: q.state,
            caps: q.caps,
            qp_num: q.qpn,
            qkey: a.qkey,
            rq_psn: q.epsn,
            sq_psn: q.psn,
            dest_qpn: a.dest_qpn,
            sq_sig_all: q.sig_all,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            path_mtu: a.path_mtu,
            access: a.access,
            pkey_index: a.pkey_index,
            port: a.port,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            min_rnr_timer: a.min_rnr_timer,
            av: if q.datagram() { None } else { a.av },
            sq_draining: false,
            qp_type: q.qp_type,
            has_srq: q.srq.is_some(),
        }
    }

    /// Destroys a QP: it leaves the table (nothing reaches it after), its requests are
    /// forgotten, its CQ room and PD/SRQ uses given back. Never fails.
    pub(crate) fn destroy_qp_impl(&self, qp: Qp<H>) {
        let mut guard = self.lock();
        if let Some(slot) = guard.tables().qp_slot(qp.qpn) {
            *slot = core::ptr::null_mut();
        }
        // Its memberships end with it (the verbs layer detaches first; a QP dropped while
        // attached leaks none).
        if let Some(slot) = qp.qpn.checked_sub(super::FIRST_QPN) {
            let (link, t) = guard.parts();
            self.forget_mcast(link, &mut t.port.groups, slot as usize);
        }
        let me = qp.core.as_ptr();
        let (srq, recv_cq, reserved) = {
            // SAFETY: the QP is alive (owned here); the device lock is held, no QP lock.
            let mut q = unsafe { QpGuard::lock(qp.core) };
            q.discard();
            guard.tables().port.release_path6(q.peer_ip);
            q.send_cq().give(q.sq_pending);
            q.recv_cq().give(q.rq_pending);
            q.send_cq().users.fetch_sub(1, Ordering::Relaxed);
            if q.send_cq != q.recv_cq {
                q.recv_cq().users.fetch_sub(1, Ordering::Relaxed);
            }
            (q.srq, q.recv_cq, q.srq_reserved)
        };
        if reserved != 0 {
            match srq.and_then(|s| pair_holder(guard.tables(), s, recv_cq, me)) {
                Some(other) => {
                    // SAFETY: a living QP of the table (device lock held), no QP lock held.
                    unsafe { QpGuard::lock(other) }.srq_reserved += reserved;
                }
                // SAFETY: the CQ outlives the QP (create_qp's contract).
                None => unsafe { recv_cq.as_ref() }.release_srq(reserved),
            }
        }
        drop(guard);
        // SAFETY: the PD and the SRQ outlive the QP (create_qp's contract).
        unsafe {
            qp.pd_users.as_ref().fetch_sub(1, Ordering::Relaxed);
            if let Some(s) = qp.srq_users {
                s.as_ref().fetch_sub(1, Ordering::Relaxed);
            }
        }
        drop(qp);
    }
}
