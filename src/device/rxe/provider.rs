//! The verbs provider: what the verbs layer asks of the software device, delegated to the
//! file of each object (`qp`, `cq`, `srq`, `mem`); the port, GID, PD, MR and event entries
//! are short enough to stand here.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use bareverbs_hal::{Clock, Hal, Link};

use super::cq::{Cq, Poll};
use super::mem::{Mem, Mr, Pd, kind as mem_kind};
use super::post::Cursor;
use super::qp::Qp;
use super::srq::Srq;
use super::{Ah, Rxe};
use crate::dma::Dma;
use crate::error::{Error, Holder, Object, Op, Param, Resource, Result};
use crate::events::{AsyncEvent, ChannelId, CqId, EventHub, Slot};
use crate::verbs::{
    AccessFlags, AddressVector, DeviceCaps, ExtWqe, Gid, KeyKind, LinkLayer, ModifyAttr, Mtu,
    MwType, PortAttr, PortState, Provider, QpAttr, QpCaps, QpInit, RecvWr, SendWqe, Sge, SrqAttr,
    WorkCompletion,
};

/// The `ibv_mtu` of a path MTU in bytes (one of `seq::MTUS`: 256 is 1, each doubling +1).
fn mtu_enum(bytes: u32) -> Mtu {
    Mtu::from_raw(bytes.trailing_zeros().saturating_sub(7)).unwrap_or(Mtu::Mtu4096)
}

impl<H: Hal, L: Link, C: Clock> Provider for Rxe<H, L, C> {
    type Pd = Pd;
    type Cq = Cq<H>;
    type Qp = Qp<H>;
    type Srq = Srq<H>;
    type Mr = Mr<H>;
    type Mem = Mem<H>;
    type Ah = Ah;
    type Cursor = Cursor;
    type Poll<'c>
        = Poll<'c>
    where
        Self: 'c;

    fn caps(&self) -> &DeviceCaps {
        &self.caps
    }

    fn seed(&self) -> u64 {
        self.hal.seed()
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port != 1 {
            return Err(Error::invalid(Param::Port, port, 1u8));
        }
        Ok(PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: mtu_enum(self.mtu),
            gid_tbl_len: self.caps.gid_tbl_len,
            port_cap_flags: 0,
            max_msg_sz: 1 << 31,
            pkey_tbl_len: 1,
            active_width: 1,
            active_speed: 1,
            phys_state: 5,
            link_layer: LinkLayer::Ethernet,
        })
    }

    fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        if port != 1 {
            return Err(Error::invalid(Param::Port, port, 1u8));
        }
        if index != 0 {
            return Err(Error::invalid(Param::PkeyIndex, index, 0u16));
        }
        Ok(super::wire::bth::DEFAULT_PKEY)
    }

    unsafe fn create_pd(&self) -> Result<Pd> {
        let mut core = self.lock();
        let t = core.tables();
        if t.pds >= self.caps.max_pd {
            return Err(Error::Resource(Resource::Objects {
                object: Object::Pd,
                limit: self.caps.max_pd,
            }));
        }
        t.pds += 1;
        t.pd_next = t.pd_next.wrapping_add(1).max(1);
        Ok(Pd {
            id: t.pd_next,
            users: AtomicU32::new(0),
        })
    }

    fn destroy_pd(&self, pd: Pd) -> Result<(), (Pd, Error)> {
        if pd.users.load(Ordering::Relaxed) != 0 {
            let count = pd.users.load(Ordering::Relaxed);
            return Err((pd, Error::in_use(Op::DestroyPd, Holder::PdObjects, count)));
        }
        self.lock().tables().pds -= 1;
        Ok(())
    }

    unsafe fn create_cq(&self, entries: u32, channel: Option<ChannelId>) -> Result<Cq<H>> {
        let id = {
            let mut core = self.lock();
            let t = core.tables();
            if t.cqs >= super::cq::MAX_CQ {
                return Err(Error::Resource(Resource::Objects {
                    object: Object::Cq,
                    limit: super::cq::MAX_CQ,
                }));
            }
            t.cqs += 1;
            t.cq_next = t.cq_next.wrapping_add(1);
            t.cq_next
        };
        let slot = match channel {
            Some(ch) => match self.hub().attach(id, Some(ch)) {
                Some(s) => Some(s),
                None => {
                    self.lock().tables().cqs -= 1;
                    return Err(Error::Resource(Resource::Objects {
                        object: Object::CqEventSlot,
                        limit: crate::events::CQ_SLOTS as u32,
                    }));
                }
            },
            None => self.hub().attach(id, None),
        };
        match Cq::new(&self.hal, entries, id, slot, self.hub()) {
            Ok(cq) => Ok(cq),
            Err(e) => {
                if let Some(s) = slot {
                    self.hub().detach(s);
                }
                self.lock().tables().cqs -= 1;
                Err(e)
            }
        }
    }

    fn destroy_cq(&self, cq: Cq<H>) -> Result<(), (Cq<H>, Error)> {
        let users = cq.ring().users.load(Ordering::Relaxed);
        if users != 0 {
            return Err((cq, Error::in_use(Op::DestroyCq, Holder::Qps, users)));
        }
        if let Some(s) = cq.ring().slot {
            self.hub().detach(s);
        }
        self.lock().tables().cqs -= 1;
        Ok(())
    }

    fn cq_entries(&self, cq: &Cq<H>) -> u32 {
        cq.ring().cap()
    }

    fn bind_gid(&self, index: u32, gid: Gid) -> Result<()> {
        // The table is the interface's: binding names one of its entries.
        match self.gid(index) {
            Some(g) if g == gid => Ok(()),
            _ => Err(Error::invalid(
                Param::GidIndex,
                index,
                self.caps.gid_tbl_len - 1,
            )),
        }
    }

    fn unbind_gid(&self, index: u32, _gid: Gid) -> Result<()> {
        match self.gid(index) {
            Some(_) => Ok(()),
            None => Err(Error::invalid(
                Param::GidIndex,
                index,
                self.caps.gid_tbl_len - 1,
            )),
        }
    }

    fn plan_qp(&self, init: &QpInit<'_>) -> Result<QpCaps> {
        self.plan_qp_impl(init)
    }

    unsafe fn create_qp(
        &self,
        pd: &Pd,
        send_cq: &Cq<H>,
        recv_cq: &Cq<H>,
        srq: Option<&Srq<H>>,
        init: &QpInit<'_>,
    ) -> Result<Qp<H>> {
        self.create_qp_impl(pd, send_cq, recv_cq, srq, init)
    }

    fn qp_num(&self, qp: &Qp<H>) -> u32 {
        qp.qpn
    }

    fn qp_caps(&self, qp: &Qp<H>) -> QpCaps {
        qp.caps
    }

    fn modify_qp(&self, qp: &mut Qp<H>, attr: &ModifyAttr) -> Result<()> {
        self.modify_qp_impl(qp, attr)
    }

    fn query_qp(&self, qp: &Qp<H>) -> Result<QpAttr> {
        Ok(self.query_qp_impl(qp))
    }

    fn destroy_qp(&self, qp: Qp<H>) -> Result<(), (Qp<H>, Error)> {
        // Its number may be given again: the type 2 windows bound to it end with it.
        self.lock().tables().mrs.unbind_qp(qp.qpn);
        self.destroy_qp_impl(qp);
        Ok(())
    }

    fn attach_mcast(&self, qp: &Qp<H>, gid: Gid, _lid: u16) -> Result<()> {
        self.attach_mcast_impl(qp, gid)
    }

    fn detach_mcast(&self, qp: &Qp<H>, gid: Gid, _lid: u16) -> Result<()> {
        self.detach_mcast_impl(qp, gid)
    }

    fn plan_srq(&self, attr: &SrqAttr) -> Result<SrqAttr> {
        self.plan_srq_impl(attr)
    }

    unsafe fn create_srq(&self, pd: &Pd, attr: &SrqAttr) -> Result<Srq<H>> {
        self.create_srq_impl(pd, attr)
    }

    fn srq_attr(&self, srq: &Srq<H>) -> SrqAttr {
        srq.attr()
    }

    fn destroy_srq(&self, srq: Srq<H>) -> Result<(), (Srq<H>, Error)> {
        self.destroy_srq_impl(srq)
    }

    unsafe fn create_mr(&self, pd: &Pd, len: usize, access: AccessFlags) -> Result<Mr<H>> {
        let mem = Dma::new(&self.hal, len.max(1).div_ceil(bareverbs_hal::PAGE_SIZE))?;
        let ptr = mem.base();
        self.register(pd, Some(mem), ptr, len, access)
    }

    unsafe fn create_user_mr(
        &self,
        pd: &Pd,
        addr: NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr<H>> {
        // The software device reaches memory by CPU address: no translation is needed.
        self.register(pd, None, addr, len, access)
    }

    fn destroy_mr(&self, mr: Mr<H>) -> Result<(), (Mr<H>, Error)> {
        {
            let mut core = self.lock();
            let mrs = &mut core.tables().mrs;
            let binds = mrs.binds(mr.key);
            if binds > 0 {
                let e = Error::InUse {
                    op: Op::DestroyMr,
                    holder: Holder::Windows,
                    count: u32::from(binds),
                };
                return Err((mr, e));
            }
            mrs.remove(mr.key);
        }
        // SAFETY: the PD outlives the region (create_mr's contract).
        unsafe { mr.pd_users.as_ref() }.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    fn mr_info(&self, mr: &Mr<H>) -> (u64, usize, u32, u32) {
        (mr.ptr.as_ptr() as usize as u64, mr.len, mr.key, mr.key)
    }

    fn rereg_mr_access(&self, mr: &mut Mr<H>, access: AccessFlags) -> Result<()> {
        if self.lock().tables().mrs.set_access(mr.key, access) {
            Ok(())
        } else {
            Err(Error::invalid(Param::MrLength, 0u32, 0u32))
        }
    }

    fn mr_ptr(&self, mr: &Mr<H>) -> NonNull<u8> {
        mr.ptr
    }

    fn alloc_mem(&self, bytes: usize) -> Result<Mem<H>> {
        let pages = bytes.max(1).div_ceil(bareverbs_hal::PAGE_SIZE);
        Ok(Mem(Dma::new(&self.hal, pages)?))
    }

    fn mem_ptr(&self, mem: &Mem<H>) -> NonNull<u8> {
        mem.0.base()
    }

    fn create_ah(&self, _pd: &Pd, av: &AddressVector) -> Result<Ah> {
        let ip = match av.dgid.ipv4() {
            Some(ip) if av.sgid_index <= 1 => ip,
            Some(_) => return Err(super::port::sgid_refused(av.sgid_index)),
            // An IPv6 destination: a use of the IPv6 path from the source GID, given back
            // when the handle goes (`destroy_ah`).
            None => self.hold_ah_path6(av)?,
        };
        Ok(Ah {
            ip,
            tos: av.traffic_class,
            ttl: av.hop_limit,
        })
    }

    fn destroy_ah(&self, ah: &Ah) {
        self.release_ah_path6(ah.ip);
    }

    fn sq_start(&self, qp: &Qp<H>) -> Cursor {
        self.sq_start_impl(qp)
    }

    unsafe fn sq_write(&self, qp: &mut Qp<H>, c: &mut Cursor, wqe: &SendWqe<'_, Ah>) -> Result<()> {
        self.sq_write_impl(qp, c, wqe)
    }

    unsafe fn sq_write_ext(&self, qp: &mut Qp<H>, c: &mut Cursor, wqe: &ExtWqe<'_>) -> Result<()> {
        self.sq_write_ext_impl(qp, c, wqe)
    }

    fn alloc_key(&self, pd: &Pd, kind: KeyKind) -> Result<u32> {
        let (k, max_len) = match kind {
            KeyKind::Window(MwType::Type1) => (mem_kind::MW1, 0),
            KeyKind::Window(MwType::Type2) => (mem_kind::MW2, 0),
            KeyKind::FastReg { max_pages } => {
                let pages = u64::from(max_pages);
                (mem_kind::FAST, pages * bareverbs_hal::PAGE_SIZE as u64)
            }
        };
        let key = self
            .lock()
            .tables()
            .mrs
            .add_key(pd.id, k, max_len)
            .ok_or(Error::Resource(Resource::Objects {
                object: Object::Mr,
                limit: super::MAX_MR as u32,
            }))?;
        pd.users.fetch_add(1, Ordering::Relaxed);
        Ok(key)
    }

    fn free_key(&self, pd: &Pd, key: u32) -> Result<()> {
        self.lock().tables().mrs.free_key(key);
        pd.users.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    fn sq_commit(&self, qp: &mut Qp<H>, c: &Cursor) {
        self.sq_commit_impl(qp, c, false)
    }

    fn rq_start(&self, qp: &Qp<H>) -> Cursor {
        self.rq_start_impl(qp)
    }

    unsafe fn rq_write(
        &self,
        qp: &mut Qp<H>,
        c: &mut Cursor,
        wr_id: u64,
        sges: &[Sge],
        tag: u32,
    ) -> Result<()> {
        self.rq_write_impl(qp, c, wr_id, sges, tag)
    }

    fn rq_commit(&self, qp: &mut Qp<H>, c: &Cursor) {
        self.rq_commit_impl(qp, c, false)
    }

    unsafe fn post_srq_recv(&self, srq: &Srq<H>, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.post_srq_impl(srq, wrs)
    }

    fn start_poll<'c>(&'c self, cq: &'c Cq<H>, only: Option<&Qp<H>>) -> Result<Option<Poll<'c>>> {
        self.poll_progress();
        Poll::start(cq.ring(), only.map(|q| q.qpn))
    }

    fn poll_cq(&self, cq: &Cq<H>, out: &mut [WorkCompletion]) -> Result<usize> {
        self.poll_progress();
        Ok(cq.poll(out))
    }

    fn poll_qp(&self, cq: &Cq<H>, qp: &Qp<H>, wc: &mut WorkCompletion) -> Result<Option<u32>> {
        self.poll_progress();
        Ok(cq.poll_qp(qp.qpn, wc))
    }

    fn req_notify_cq(&self, cq: &Cq<H>, solicited_only: bool) -> Result<()> {
        let Some(slot) = cq.ring().slot else {
            return Err(Error::Resource(Resource::Objects {
                object: Object::CqEventSlot,
                limit: crate::events::CQ_SLOTS as u32,
            }));
        };
        let arm = if solicited_only {
            crate::events::Arm::Solicited
        } else {
            crate::events::Arm::Next
        };
        self.hub().arm(slot, arm);
        Ok(())
    }

    fn cq_ready(&self, cq: &Cq<H>) -> bool {
        self.poll_progress();
        cq.ready()
    }

    fn cq_id(&self, cq: &Cq<H>) -> CqId {
        CqId(cq.ring().id)
    }

    fn cq_slot(&self, cq: &Cq<H>) -> Option<Slot> {
        cq.ring().slot
    }

    fn events(&self) -> &EventHub {
        self.hub()
    }

    fn process_events(&self) {
        self.progress();
    }

    fn progress(&self) {
        Rxe::progress(self);
    }

    fn interrupt(&self, _vector: u16) {
        // The NIC's interrupt only says frames arrived: take them.
        self.progress();
    }

    fn next_async_event(&self) -> Option<AsyncEvent> {
        self.progress();
        let srq = self.lock().tables().async_events.pop()?;
        Some(AsyncEvent::SrqLimitReached(srq))
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        if port != 1 {
            return Err(Error::invalid(Param::Port, port, 1u8));
        }
        if index >= self.caps.gid_tbl_len {
            return Err(Error::invalid(
                Param::GidIndex,
                index,
                self.caps.gid_tbl_len - 1,
            ));
        }
        // An entry of the table with no address given (a global IPv6 place) reads as the
        // zero GID, as an unbound entry does.
        Ok(self.gid(index).unwrap_or_default())
    }

    fn next_gid(&self, port: u8, from: u32) -> Result<Option<(u32, Gid)>> {
        if port != 1 {
            return Err(Error::invalid(Param::Port, port, 1u8));
        }
        Ok((from..self.caps.gid_tbl_len).find_map(|i| self.gid(i).map(|g| (i, g))))
    }

    fn modify_srq(&self, srq: &Srq<H>, limit: u32) -> Result<()> {
        self.modify_srq_impl(srq, limit)
    }

    fn resize_srq(&self, srq: &Srq<H>, max_wr: u32) -> Result<u32> {
        self.resize_srq_impl(srq, max_wr)
    }

    fn query_srq(&self, srq: &Srq<H>) -> Result<SrqAttr> {
        Ok(self.query_srq_impl(srq))
    }

    fn resize_cq(&self, cq: &mut Cq<H>, entries: u32) -> Result<()> {
        self.resize_cq_impl(cq, entries)
    }

    fn sq_commit_flushed(&self, qp: &mut Qp<H>, c: &Cursor) {
        self.sq_commit_impl(qp, c, true)
    }

    fn rq_commit_flushed(&self, qp: &mut Qp<H>, c: &Cursor) {
        self.rq_commit_impl(qp, c, true)
    }
}

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    fn register(
        &self,
        pd: &Pd,
        mem: Option<Dma<H>>,
        ptr: NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr<H>> {
        let key = self
            .lock()
            .tables()
            .mrs
            .add(ptr.as_ptr() as usize as u64, len as u64, pd.id, access)
            .ok_or(Error::Resource(Resource::Objects {
                object: Object::Mr,
                limit: super::MAX_MR as u32,
            }))?;
        pd.users.fetch_add(1, Ordering::Relaxed);
        Ok(Mr {
            _mem: mem,
            ptr,
            len,
            key,
            pd_users: NonNull::from(&pd.users),
        })
    }
}

/// The capabilities of the software device (fixed: the driver's tables).
pub(super) fn caps_of(mac: [u8; 6]) -> DeviceCaps {
    // The node GUID is the EUI-64 of the MAC: the interface id of its link-local GID.
    let g = Gid::link_local_from_mac(mac).0;
    let guid = u64::from_be_bytes([g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]]);
    DeviceCaps {
        fw_ver: 0,
        node_guid: guid.to_be(),
        sys_image_guid: guid.to_be(),
        max_mr_size: 1 << 31,
        vendor_part_id: 0,
        max_qp: super::MAX_QP as u32,
        max_qp_wr: super::MAX_WR,
        max_sge: super::MAX_SGE,
        max_cq: super::cq::MAX_CQ,
        max_cqe: super::cq::MAX_CQE,
        max_mr: super::MAX_MR as u32,
        max_pd: super::mem::MAX_PD,
        max_qp_rd_atom: super::MAX_RD_ATOMIC,
        max_qp_init_rd_atom: super::MAX_RD_ATOMIC,
        max_mcast_grp: super::MAX_MCAST_GRP as u32,
        max_ah: u32::MAX,
        max_srq: super::srq::MAX_SRQ,
        max_srq_wr: super::MAX_SRQ_WR,
        max_srq_sge: super::MAX_SGE,
        gid_tbl_len: super::port::GIDS,
        max_pkeys: 1,
        phys_port_cnt: 1,
        device_cap_flags: 0,
        atomic_ops: 1,
        // Linux rxe's vendor id, so that peers see the same device kind.
        vendor_id: 0x00FF_FFFF,
        // Regions are reached by CPU address: every page size from 4 KiB.
        page_size_cap: !0xFFF,
        max_sge_rd: super::MAX_SGE,
    }
}
