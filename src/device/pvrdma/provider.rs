//! The verbs provider: what the verbs layer asks of a PVRDMA, delegated to the file of each
//! object (`qp`, `cq`, `srq`, `mr`, `ah`, `wqe`, `cursor`); the port, P_Key, PD and GID
//! commands are short enough to stand here.

use core::mem::offset_of;
use core::sync::atomic::Ordering;

use bareverbs_hal::Hal;

use super::abi::{self, Caps};
use super::cq::Cq;
use super::cursor::Poll;
use super::mr::Mr;
use super::qp::Qp;
use super::srq::Srq;
use super::{Ah, Pd, PrivateMem, Pvrdma, WqCursor, layout, regs};
use crate::dma::Dma;
use crate::error::{EBUSY, Error, Feature, Object, Op, Param, Result, Unsupported};
use crate::events::{AsyncEvent, ChannelId, CqId, EventHub, Slot};
use crate::verbs::{
    AccessFlags, AddressVector, DeviceCaps, Gid, ModifyAttr, Mtu, PortAttr, PortState, Provider,
    QpAttr, QpCaps, QpInit, RecvWr, SendWqe, Sge, SrqAttr, WorkCompletion,
};

impl<H: Hal> Provider for Pvrdma<H> {
    type Pd = Pd;
    type Cq = Cq<H>;
    type Qp = Qp<H>;
    type Srq = Srq<H>;

    fn plan_qp(&self, init: &QpInit<'_>) -> Result<QpCaps> {
        let (sq, rq) = self.qp_layout(init)?;
        Ok(layout::caps_of(&sq, &rq))
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
        self.query_qp_impl(qp)
    }

    fn destroy_qp(&self, qp: Qp<H>) -> Result<(), (Qp<H>, Error)> {
        self.destroy_qp_impl(qp)
    }

    fn attach_mcast(&self, _qp: &Qp<H>, _gid: Gid, _lid: u16) -> Result<()> {
        // PVRDMA has no multicast command (max_mcast_grp = 0 on QEMU).
        Err(Error::Unsupported(Unsupported::Feature(Feature::Multicast)))
    }

    fn detach_mcast(&self, _qp: &Qp<H>, _gid: Gid, _lid: u16) -> Result<()> {
        Err(Error::Unsupported(Unsupported::Feature(Feature::Multicast)))
    }

    fn plan_srq(&self, attr: &SrqAttr) -> Result<SrqAttr> {
        let l = self.srq_layout(attr)?;
        Ok(SrqAttr {
            max_wr: l.slots,
            max_sge: l.sge,
            srq_limit: attr.srq_limit,
        })
    }

    unsafe fn create_srq(&self, pd: &Pd, attr: &SrqAttr) -> Result<Srq<H>> {
        self.create_srq_impl(pd, attr)
    }

    fn srq_attr(&self, srq: &Srq<H>) -> SrqAttr {
        srq.attr
    }

    fn destroy_srq(&self, srq: Srq<H>) -> Result<(), (Srq<H>, Error)> {
        self.destroy_srq_impl(srq)
    }

    type Mr = Mr<H>;

    unsafe fn create_mr(&self, pd: &Pd, len: usize, access: AccessFlags) -> Result<Mr<H>> {
        self.create_mr_impl(pd, len, access)
    }

    fn destroy_mr(&self, mr: Mr<H>) -> Result<(), (Mr<H>, Error)> {
        self.destroy_mr_impl(mr)
    }

    fn mr_info(&self, mr: &Mr<H>) -> (u64, usize, u32, u32) {
        (mr.addr, mr.len, mr.lkey, mr.rkey)
    }

    fn mr_ptr(&self, mr: &Mr<H>) -> core::ptr::NonNull<u8> {
        mr.ptr
    }

    unsafe fn create_user_mr(
        &self,
        pd: &Pd,
        addr: core::ptr::NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr<H>> {
        self.create_user_mr_impl(pd, addr, len, access)
    }

    type Mem = PrivateMem<H>;

    fn alloc_mem(&self, bytes: usize) -> Result<PrivateMem<H>> {
        let pages = bytes.max(1).div_ceil(bareverbs_hal::PAGE_SIZE);
        Ok(PrivateMem(Dma::new(&self.hal, pages)?))
    }

    fn mem_ptr(&self, mem: &PrivateMem<H>) -> core::ptr::NonNull<u8> {
        mem.0.base()
    }

    type Ah = Ah;

    fn create_ah(&self, pd: &Pd, av: &AddressVector) -> Result<Ah> {
        self.create_ah_impl(pd, av)
    }

    type Cursor = WqCursor;

    #[inline(always)]
    fn sq_start(&self, qp: &Qp<H>) -> WqCursor {
        Pvrdma::sq_start(self, qp)
    }

    #[inline(always)]
    unsafe fn sq_write(
        &self,
        qp: &mut Qp<H>,
        c: &mut WqCursor,
        wqe: &SendWqe<'_, Ah>,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { Pvrdma::sq_write(self, qp, c, wqe) }
    }

    #[inline(always)]
    fn sq_commit(&self, qp: &mut Qp<H>, c: &WqCursor) {
        Pvrdma::sq_commit(self, qp, c)
    }

    #[inline(always)]
    fn rq_start(&self, qp: &Qp<H>) -> WqCursor {
        Pvrdma::rq_start(self, qp)
    }

    #[inline(always)]
    unsafe fn rq_write(
        &self,
        qp: &mut Qp<H>,
        c: &mut WqCursor,
        wr_id: u64,
        sges: &[Sge],
        tag: u32,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { Pvrdma::rq_write(self, qp, c, wr_id, sges, tag) }
    }

    #[inline]
    fn rq_commit(&self, qp: &mut Qp<H>, c: &WqCursor) {
        Pvrdma::rq_commit(self, qp, c)
    }

    unsafe fn post_srq_recv(&self, srq: &Srq<H>, wrs: &[RecvWr<'_>]) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.srq_post(srq, wrs) }
    }

    type Poll<'c>
        = Poll<'c, H>
    where
        H: 'c;

    #[inline]
    fn start_poll<'c>(
        &'c self,
        cq: &'c Cq<H>,
        only: Option<&Qp<H>>,
    ) -> Result<Option<Poll<'c, H>>> {
        Pvrdma::start_poll(self, cq, only.map(|q| q.handle()))
    }

    #[inline(always)]
    fn poll_cq(&self, cq: &Cq<H>, out: &mut [WorkCompletion]) -> Result<usize> {
        self.poll_into(cq, out)
    }

    #[inline]
    fn poll_qp(&self, cq: &Cq<H>, qp: &Qp<H>, wc: &mut WorkCompletion) -> Result<Option<u32>> {
        Pvrdma::poll_qp(self, cq, qp.handle(), wc)
    }

    fn req_notify_cq(&self, cq: &Cq<H>, solicited_only: bool) -> Result<()> {
        self.req_notify_impl(cq, solicited_only)
    }

    fn cq_ready(&self, cq: &Cq<H>) -> bool {
        self.cq_ready_impl(cq)
    }

    fn cq_id(&self, cq: &Cq<H>) -> CqId {
        CqId(cq.handle)
    }

    fn cq_slot(&self, cq: &Cq<H>) -> Option<Slot> {
        cq.slot
    }

    fn events(&self) -> &EventHub {
        self.events.hub()
    }

    fn process_events(&self) {
        self.events.drain();
    }

    fn interrupt(&self, vector: u16) {
        Pvrdma::interrupt(self, vector)
    }

    fn next_async_event(&self) -> Option<AsyncEvent> {
        Pvrdma::next_async_event(self)
    }

    fn caps(&self) -> &DeviceCaps {
        &self.caps
    }

    fn seed(&self) -> u64 {
        self.hal.seed()
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port == 0 || port > self.caps.phys_port_cnt {
            return Err(Error::invalid(Param::Port, port, self.caps.phys_port_cnt));
        }
        let op = Op::QueryPort;
        let fill = |r: &mut abi::QueryPort| r.port_num = port;
        let r: abi::QueryPortResp = self.exec((op, abi::opcode::QUERY_PORT), fill)?;
        let a = r.attrs;
        // L-VRB numbers port states and MTUs as InfiniBand (and ibverbs) do.
        let mtu = |field, raw| Mtu::from_raw(raw).ok_or(Error::bad_value(op, field, raw));
        Ok(PortAttr {
            state: PortState::from_raw(a.state).ok_or(Error::bad_value(
                op,
                &"port state",
                a.state,
            ))?,
            max_mtu: mtu(&"max_mtu", a.max_mtu)?,
            active_mtu: mtu(&"active_mtu", a.active_mtu)?,
            gid_tbl_len: a.gid_tbl_len,
            port_cap_flags: a.port_cap_flags,
            max_msg_sz: a.max_msg_sz,
            pkey_tbl_len: a.pkey_tbl_len,
            active_width: a.active_width,
            active_speed: a.active_speed,
            phys_state: a.phys_state,
            link_layer: crate::verbs::LinkLayer::Ethernet,
        })
    }

    fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        if port == 0 || port > self.caps.phys_port_cnt {
            return Err(Error::invalid(Param::Port, port, self.caps.phys_port_cnt));
        }
        let max = self.caps.max_pkeys.saturating_sub(1);
        if index > max || index > u16::from(u8::MAX) {
            return Err(Error::invalid(Param::PkeyIndex, index, max));
        }
        let fill = |r: &mut abi::QueryPkey| (r.port_num, r.index) = (port, index as u8);
        let r: abi::QueryPkeyResp = self.exec((Op::QueryPkey, abi::opcode::QUERY_PKEY), fill)?;
        Ok(r.pkey)
    }

    unsafe fn create_pd(&self) -> Result<Pd> {
        let op = Op::CreatePd;
        let mut st = self.state.lock();
        st.room_for(Object::Pd, self.caps.max_pd)?;
        let (r, ()): (abi::CreatePdResp, ()) = st.create(
            &self.regs,
            Object::Pd,
            (op, abi::opcode::CREATE_PD),
            |_: &mut abi::CreatePd| {},
            (),
        )?;
        if r.pd_handle > regs::db::HANDLE_MASK {
            // Handles travel in 24-bit fields (doorbells, address vectors): this one is garbage.
            // The device made a PD the driver cannot name; it stays counted.
            return Err(Error::bad_value(op, &"pd_handle", r.pd_handle));
        }
        Ok(Pd {
            handle: r.pd_handle,
            users: core::sync::atomic::AtomicU32::new(0),
        })
    }

    fn destroy_pd(&self, pd: Pd) -> Result<(), (Pd, Error)> {
        let users = pd.users.load(core::sync::atomic::Ordering::Relaxed);
        if users != 0 {
            // A region, SRQ or QP (perhaps leaked with mem::forget) still uses it.
            let e = Error::in_use(Op::DestroyPd, crate::error::Holder::PdObjects, users);
            return Err((pd, e));
        }
        let code = (Op::DestroyPd, abi::opcode::DESTROY_PD);
        let handle = pd.handle;
        self.state
            .lock()
            .destroy(&self.regs, Object::Pd, code, handle, pd)
    }

    unsafe fn create_cq(&self, entries: u32, channel: Option<ChannelId>) -> Result<Cq<H>> {
        self.create_cq_impl(entries, channel)
    }

    fn destroy_cq(&self, cq: Cq<H>) -> Result<(), (Cq<H>, Error)> {
        self.destroy_cq_impl(cq)
    }

    fn cq_entries(&self, cq: &Cq<H>) -> u32 {
        cq.entries
    }

    fn bind_gid(&self, index: u32, gid: Gid) -> Result<()> {
        // QEMU refuses index >= 255 (its table size) whatever gid_tbl_len says.
        let max = self.caps.gid_tbl_len.min(255) - 1;
        if index > max {
            return Err(Error::invalid(Param::GidIndex, index, max));
        }
        let (word, bit) = (index as usize / 64, 1u64 << (index % 64));
        let mut st = self.state.lock();
        if st.gids[word] & bit != 0 {
            return Err(Error::from_errno(Op::BindGid, EBUSY));
        }
        let gid_type = if self
            .dsr
            .read::<u8>(abi::DSR_CAPS_OFFSET + offset_of!(Caps, gid_types))
            & abi::GID_TYPE_ROCE_V1
            != 0
        {
            abi::GID_TYPE_ROCE_V1
        } else {
            abi::GID_TYPE_ROCE_V2
        };
        let fill = |r: &mut abi::CreateBind| {
            (r.mtu, r.vlan, r.index) = (1024, 0xFFF, index);
            (r.new_gid, r.gid_type) = (gid.0, gid_type);
        };
        let code = (Op::BindGid, abi::opcode::CREATE_BIND);
        st.chan.command(&self.regs, code, fill)?;
        st.gids[word] |= bit;
        self.remember_gid(index, gid);
        self.gid_bits[word].fetch_or(bit, Ordering::Release);
        Ok(())
    }

    fn unbind_gid(&self, index: u32, gid: Gid) -> Result<()> {
        let (word, bit) = (index as usize / 64 % 4, 1u64 << (index % 64));
        let mut st = self.state.lock();
        let fill = |r: &mut abi::DestroyBind| (r.index, r.dest_gid) = (index, gid.0);
        let code = (Op::UnbindGid, abi::opcode::DESTROY_BIND);
        if let Err(e) = st.chan.command(&self.regs, code, fill) {
            if super::outcome_unknown(&e) {
                // The device may have unbound it: nothing is sent from it any more (QEMU
                // loops forever on a send whose GID it cannot map, `docs/pvrdma.md`). The
                // index stays taken for binding: the device may still hold it.
                self.gid_bits[word].fetch_and(!bit, Ordering::Release);
            }
            return Err(e);
        }
        st.gids[word] &= !bit;
        self.gid_bits[word].fetch_and(!bit, Ordering::Release);
        Ok(())
    }

    // --- The rest of the verbs surface: `gid.rs`, `srq.rs`, `cq_resize.rs`,
    // --- `qp_state.rs` (posting in ERR).

    fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        self.query_gid_impl(port, index)
    }

    fn next_gid(&self, port: u8, from: u32) -> Result<Option<(u32, Gid)>> {
        self.next_gid_impl(port, from)
    }

    fn modify_srq(&self, srq: &Srq<H>, limit: u32) -> Result<()> {
        self.modify_srq_impl(srq, limit)
    }

    fn query_srq(&self, srq: &Srq<H>) -> Result<SrqAttr> {
        self.query_srq_impl(srq)
    }

    /// QEMU's MODIFY_SRQ runs its query handler (`docs/pvrdma.md` §5.2): an SRQ's size
    /// cannot be changed.
    fn resize_srq(&self, _srq: &Srq<H>, _max_wr: u32) -> Result<u32> {
        Err(Error::Unsupported(Unsupported::Feature(Feature::SrqModify)))
    }

    fn resize_cq(&self, cq: &mut Cq<H>, entries: u32) -> Result<()> {
        self.resize_cq_impl(cq, entries)
    }

    fn sq_commit_flushed(&self, qp: &mut Qp<H>, c: &WqCursor) {
        self.commit_flushed(qp, c, false)
    }

    fn rq_commit_flushed(&self, qp: &mut Qp<H>, c: &WqCursor) {
        self.commit_flushed(qp, c, true)
    }
}
