//! The [`Provider`] trait: what a device driver implements to be driven by the verbs layer
//! (`docs/architecture.md` states what each method must guarantee).

use core::ptr::NonNull;

use super::{
    AccessFlags, AddressVector, DeviceCaps, ExtWqe, Gid, GidType, KeyKind, ModifyAttr, PortAttr,
    QpAttr, QpCaps, QpInit, RecvWr, SendWqe, Sge, SrqAttr, WcFlags, WcOpcode, WcStatus,
    WorkCompletion,
};
use crate::error::{Error, Result};
use crate::events::AsyncEvent;
use crate::events::{ChannelId, CqId, EventHub, Slot};

/// What a device driver implements to be driven by the verbs layer.
///
/// The `unsafe` creation methods return device objects whose memory the device may use until
/// they are destroyed; [`Context`](super::Context) and the object types uphold their contract with lifetimes,
/// so users never call them directly.
pub trait Provider {
    /// A protection domain on the device.
    type Pd;
    /// A completion queue on the device.
    type Cq;

    /// The device's capabilities (read once at bring-up).
    fn caps(&self) -> &DeviceCaps;
    /// The seed for values the network must not predict: the device's
    /// [`Hal::seed`](bareverbs_hal::Hal::seed), read once by [`Context::new`](super::Context::new).
    fn seed(&self) -> u64;
    /// Queries port `port` (1-based).
    fn query_port(&self, port: u8) -> Result<PortAttr>;
    /// Reads P_Key `index` of port `port`.
    fn query_pkey(&self, port: u8, index: u16) -> Result<u16>;

    /// Creates a protection domain.
    ///
    /// # Safety
    ///
    /// The PD is passed to [`destroy_pd`](Self::destroy_pd) of this provider (or leaked) before
    /// the provider is dropped.
    unsafe fn create_pd(&self) -> Result<Self::Pd>;
    /// Destroys a protection domain; on failure hands it back with the error.
    fn destroy_pd(&self, pd: Self::Pd) -> Result<(), (Self::Pd, Error)>;

    /// Creates a completion queue of at least `entries` entries, raising its events on
    /// `channel` if given.
    ///
    /// # Safety
    ///
    /// As for [`create_pd`](Self::create_pd): destroyed through this provider, or leaked, before
    /// the provider is dropped (the device writes into its ring until then).
    unsafe fn create_cq(&self, entries: u32, channel: Option<ChannelId>) -> Result<Self::Cq>;
    /// Destroys a completion queue; on failure hands it back with the error.
    fn destroy_cq(&self, cq: Self::Cq) -> Result<(), (Self::Cq, Error)>;
    /// The number of entries the completion queue actually has.
    fn cq_entries(&self, cq: &Self::Cq) -> u32;

    /// Adds `gid` at `index` of port 1's GID table.
    fn bind_gid(&self, index: u32, gid: Gid) -> Result<()>;
    /// Removes the GID at `index`.
    fn unbind_gid(&self, index: u32, gid: Gid) -> Result<()>;

    /// A queue pair on the device.
    type Qp;
    /// A shared receive queue on the device.
    type Srq;

    /// The capacities a queue pair created with `init` would actually have, or why it cannot
    /// be created (limits, unsupported types and features); touches nothing.
    fn plan_qp(&self, init: &QpInit<'_>) -> Result<QpCaps>;
    /// Creates a queue pair (in RESET).
    ///
    /// # Safety
    ///
    /// The PD, CQs and SRQ outlive the QP and stay where they are (are not moved) while it
    /// exists — a provider may keep pointers to them — and the QP is destroyed through
    /// [`destroy_qp`](Self::destroy_qp) (or leaked) before the provider is dropped.
    unsafe fn create_qp(
        &self,
        pd: &Self::Pd,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        srq: Option<&Self::Srq>,
        init: &QpInit<'_>,
    ) -> Result<Self::Qp>;
    /// The QP number.
    fn qp_num(&self, qp: &Self::Qp) -> u32;
    /// The actual capacities.
    fn qp_caps(&self, qp: &Self::Qp) -> QpCaps;
    /// Applies a modify (the typestate layer has checked the transition and the limits).
    fn modify_qp(&self, qp: &mut Self::Qp, attr: &ModifyAttr) -> Result<()>;
    /// Queries a queue pair.
    fn query_qp(&self, qp: &Self::Qp) -> Result<QpAttr>;
    /// Destroys a queue pair; on failure hands it back with the error.
    fn destroy_qp(&self, qp: Self::Qp) -> Result<(), (Self::Qp, Error)>;
    /// Attaches a queue pair to a multicast group.
    fn attach_mcast(&self, qp: &Self::Qp, gid: Gid, lid: u16) -> Result<()>;
    /// Detaches a queue pair from a multicast group.
    fn detach_mcast(&self, qp: &Self::Qp, gid: Gid, lid: u16) -> Result<()>;

    /// The attributes a shared receive queue created with `attr` would actually have; touches
    /// nothing.
    fn plan_srq(&self, attr: &SrqAttr) -> Result<SrqAttr>;
    /// Creates a shared receive queue.
    ///
    /// # Safety
    ///
    /// The PD outlives it, and it is destroyed through [`destroy_srq`](Self::destroy_srq) (or
    /// leaked) before the provider is dropped.
    unsafe fn create_srq(&self, pd: &Self::Pd, attr: &SrqAttr) -> Result<Self::Srq>;
    /// The actual attributes.
    fn srq_attr(&self, srq: &Self::Srq) -> SrqAttr;
    /// Destroys a shared receive queue; on failure hands it back with the error.
    fn destroy_srq(&self, srq: Self::Srq) -> Result<(), (Self::Srq, Error)>;

    /// A registered memory region (with the memory it covers, when the driver allocated it).
    type Mr;
    /// Allocates `len` bytes of DMA memory and registers them in `pd` with `access`.
    ///
    /// # Safety
    ///
    /// The PD outlives the region, and it is destroyed through [`destroy_mr`](Self::destroy_mr)
    /// (or leaked) before the provider is dropped.
    unsafe fn create_mr(&self, pd: &Self::Pd, len: usize, access: AccessFlags) -> Result<Self::Mr>;
    /// Registers `len` bytes of the embedder's own memory at `addr` in `pd` with `access`; the
    /// region's addresses are the CPU's (`addr` is the first SGE address).
    ///
    /// # Safety
    ///
    /// As for [`create_mr`](Self::create_mr); and the memory stays allocated, and is not used
    /// for anything else the device could be told about, until the region is destroyed.
    unsafe fn create_user_mr(
        &self,
        pd: &Self::Pd,
        addr: NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self::Mr>;
    /// Deregisters a memory region and frees its memory; on failure hands it back.
    fn destroy_mr(&self, mr: Self::Mr) -> Result<(), (Self::Mr, Error)>;
    /// (address in the region's address space, length, local key, remote key).
    fn mr_info(&self, mr: &Self::Mr) -> (u64, usize, u32, u32);
    /// Where the CPU reaches the region's bytes.
    fn mr_ptr(&self, mr: &Self::Mr) -> NonNull<u8>;

    /// Driver-private memory (bookkeeping the device never sees), freed when dropped.
    type Mem;
    /// Allocates `bytes` of zeroed driver-private memory (it never moves).
    fn alloc_mem(&self, bytes: usize) -> Result<Self::Mem>;
    /// Where it is.
    fn mem_ptr(&self, mem: &Self::Mem) -> NonNull<u8>;

    /// A UD destination prepared once (`ibv_ah`).
    type Ah;
    /// Prepares an address handle in `pd` (checks the source GID index).
    fn create_ah(&self, pd: &Self::Pd, av: &AddressVector) -> Result<Self::Ah>;
    /// Gives back what the address handle `ah` held (it is being dropped); nothing by
    /// default. Never fails.
    fn destroy_ah(&self, ah: &Self::Ah) {
        let _ = ah;
    }

    /// A batch's copy of a work queue's posting state, kept in registers while the batch
    /// writes requests; written back when the batch is committed (dropping it forgets them).
    type Cursor: Copy;
    /// Starts a batch of send requests.
    fn sq_start(&self, qp: &Self::Qp) -> Self::Cursor;
    /// Writes one send work request into the QP's send queue, not yet visible to the device.
    ///
    /// # Safety
    ///
    /// Every buffer the request names stays allocated, registered, and untouched by the CPU
    /// until its completion has been polled (or the QP is reset or destroyed).
    unsafe fn sq_write(
        &self,
        qp: &mut Self::Qp,
        c: &mut Self::Cursor,
        wqe: &SendWqe<'_, Self::Ah>,
    ) -> Result<()>;
    /// Makes the send requests of the batch visible, with one doorbell.
    fn sq_commit(&self, qp: &mut Self::Qp, c: &Self::Cursor);
    /// Starts a batch of receive requests.
    fn rq_start(&self, qp: &Self::Qp) -> Self::Cursor;
    /// Writes one receive work request (with the safe path's buffer tag + 1, or 0).
    ///
    /// # Safety
    ///
    /// As for [`sq_write`](Self::sq_write).
    unsafe fn rq_write(
        &self,
        qp: &mut Self::Qp,
        c: &mut Self::Cursor,
        wr_id: u64,
        sges: &[Sge],
        tag: u32,
    ) -> Result<()>;
    /// Makes the receive requests of the batch visible, one doorbell.
    fn rq_commit(&self, qp: &mut Self::Qp, c: &Self::Cursor);
    /// Posts receive work requests to a shared receive queue, all or none.
    ///
    /// # Safety
    ///
    /// As for [`sq_write`](Self::sq_write).
    unsafe fn post_srq_recv(&self, srq: &Self::Srq, wrs: &[RecvWr<'_>]) -> Result<()>;

    /// A poll in progress on a CQ.
    type Poll<'c>: PollCq
    where
        Self: 'c;
    /// Starts polling `cq` (`ibv_start_poll`); `None` when nothing is there. With `only`, the
    /// poll stops at the first completion of another QP (leaving it for that QP's poll).
    fn start_poll<'c>(
        &'c self,
        cq: &'c Self::Cq,
        only: Option<&Self::Qp>,
    ) -> Result<Option<Self::Poll<'c>>>;
    /// Polls up to `out.len()` completions of any QP into `out` (`ibv_poll_cq`); a safe
    /// buffer whose completion is taken here goes back to its pool.
    fn poll_cq(&self, cq: &Self::Cq, out: &mut [WorkCompletion]) -> Result<usize>;
    /// Takes the next completion of `qp` from `cq` into `wc` (as a poll cursor with `only`
    /// does: it stops at another QP's completion, left for that QP's poll). `Some(tag)` for a
    /// completion: the safe path's buffer tag + 1, the buffer now the caller's, or 0 for
    /// none; `None` when there is nothing.
    fn poll_qp(&self, cq: &Self::Cq, qp: &Self::Qp, wc: &mut WorkCompletion)
    -> Result<Option<u32>>;
    /// Arms `cq` for an event at its next completion (`solicited_only`: its next solicited
    /// one) (`ibv_req_notify_cq`).
    fn req_notify_cq(&self, cq: &Self::Cq, solicited_only: bool) -> Result<()>;
    /// Whether a poll of `cq` would find something now (a hint: a poll may still find
    /// nothing, or another thread take it first).
    fn cq_ready(&self, cq: &Self::Cq) -> bool;
    /// The identity `cq` has in events.
    fn cq_id(&self, cq: &Self::Cq) -> CqId;
    /// The place of `cq` in the event hub, when it has one.
    fn cq_slot(&self, cq: &Self::Cq) -> Option<Slot>;
    /// The provider's event state.
    fn events(&self) -> &EventHub;
    /// Takes the device's notifications now, as an interrupt does (bounded; never waits).
    fn process_events(&self);
    /// Runs the work a device does for its peers without a call of this side's application
    /// asking for it: on a device whose transport is software (the software RoCE device,
    /// [`Rxe::progress`](crate::device::rxe::Rxe::progress)), taking the frames the NIC
    /// received — so that a peer's RDMA READs, WRITEs and atomics on this side's memory are
    /// served — and running the retransmission timers. Bounded; never waits. By default
    /// nothing: a hardware device (PVRDMA) serves its peers by itself.
    ///
    /// Every wait the crate offers runs it: its futures each time they are polled,
    /// [`Context::block_on`](super::Context::block_on) between polls, a completion channel's
    /// [`get_cq_event`](super::CompletionChannel::get_cq_event), the CM's
    /// [`poll`](crate::cm::Cm::poll) and [`next_event`](crate::cm::Cm::next_event).
    fn progress(&self) {}
    /// The interrupt entry for the device's vector `vector` (interrupt-safe: see the
    /// provider's documentation).
    fn interrupt(&self, vector: u16);
    /// The next async event, if the device has one.
    fn next_async_event(&self) -> Option<AsyncEvent>;

    // --- The rest of the verbs surface: GID query, SRQ modify/query, CQ resize,
    // --- posting in the error state.

    /// The GID at `index` of port `port`'s table (`ibv_query_gid`): the zero GID for an index
    /// in range where nothing is bound; [`Error::InvalidInput`] for a port or an index out of
    /// range.
    fn query_gid(&self, port: u8, index: u32) -> Result<Gid>;
    /// The first bound entry (index, GID) of port `port`'s table at or after index `from`.
    fn next_gid(&self, port: u8, from: u32) -> Result<Option<(u32, Gid)>>;
    /// The type of the bound GID at `index` of port `port` (`ibv_query_gid_type`). By
    /// default RoCEv2; a device that speaks another says so.
    fn gid_type(&self, _port: u8, _index: u32) -> GidType {
        GidType::RoceV2
    }
    /// Completion vectors CQs may name (`num_comp_vectors`): 1 by default.
    fn num_comp_vectors(&self) -> u32 {
        1
    }
    /// Changes a memory region's access rights in place (`ibv_rereg_mr` with
    /// `IBV_REREG_MR_CHANGE_ACCESS`); its keys stay. A typed `Unsupported` by default.
    fn rereg_mr_access(&self, _mr: &mut Self::Mr, _access: AccessFlags) -> Result<()> {
        Err(Error::Unsupported(crate::error::Unsupported::Feature(
            crate::error::Feature::ReregMr,
        )))
    }
    /// Allocates a key in `pd` for a memory window or a fast-registration region (unbound,
    /// invalid: no access through it until a bind or a registration); returns the key, which
    /// is also the handle [`free_key`](Self::free_key) and the work requests on it name
    /// (its index bits never change). A typed `Unsupported` by default.
    fn alloc_key(&self, _pd: &Self::Pd, kind: KeyKind) -> Result<u32> {
        let feature = match kind {
            KeyKind::Window(_) => crate::error::Feature::MemoryWindows,
            KeyKind::FastReg { .. } => crate::error::Feature::FastRegistration,
        };
        Err(Error::Unsupported(crate::error::Unsupported::Feature(
            feature,
        )))
    }
    /// Frees the key `key` allocated by [`alloc_key`](Self::alloc_key) in `pd` (whatever its
    /// key is now, bound or not): access through it ends, and the region it was bound over
    /// is released.
    fn free_key(&self, _pd: &Self::Pd, _key: u32) -> Result<()> {
        Err(Error::Unsupported(crate::error::Unsupported::Feature(
            crate::error::Feature::MemoryWindows,
        )))
    }
    /// Writes a work request on a key (bind, fast registration, invalidation, SEND with
    /// invalidate) into the QP's send queue, as [`sq_write`](Self::sq_write). A typed
    /// `Unsupported` by default.
    ///
    /// # Safety
    ///
    /// As for [`sq_write`](Self::sq_write).
    unsafe fn sq_write_ext(
        &self,
        _qp: &mut Self::Qp,
        _c: &mut Self::Cursor,
        wqe: &ExtWqe<'_>,
    ) -> Result<()> {
        Err(Error::Unsupported(crate::error::Unsupported::Feature(
            wqe.op.feature(),
        )))
    }
    /// Arms the SRQ limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): the device raises
    /// SRQ_LIMIT_REACHED once fewer than `limit` receives are posted, and disarms.
    fn modify_srq(&self, srq: &Self::Srq, limit: u32) -> Result<()>;
    /// The SRQ's attributes (`ibv_query_srq`).
    fn query_srq(&self, srq: &Self::Srq) -> Result<SrqAttr>;
    /// Resizes the SRQ to at least `max_wr` receives (`ibv_modify_srq` with `IBV_SRQ_MAX_WR`),
    /// keeping the receives posted; returns the size it has. Refuses fewer than the receives
    /// outstanding (`Param::SrqWrInUse`).
    fn resize_srq(&self, srq: &Self::Srq, max_wr: u32) -> Result<u32>;
    /// Resizes `cq` to at least `entries` (`ibv_resize_cq`); refuses fewer than the CQEs it
    /// must keep room for.
    fn resize_cq(&self, cq: &mut Self::Cq, entries: u32) -> Result<()>;
    /// Makes the send requests of a batch written to a QP in the error state outstanding,
    /// to complete flushed (`WR_FLUSH_ERR`), without showing them to the device.
    fn sq_commit_flushed(&self, qp: &mut Self::Qp, c: &Self::Cursor);
    /// As [`sq_commit_flushed`](Self::sq_commit_flushed), for receive requests.
    fn rq_commit_flushed(&self, qp: &mut Self::Qp, c: &Self::Cursor);
}

/// What a provider's poll in progress offers; the verbs layer wraps it in [`PollCursor`](super::PollCursor).
pub trait PollCq {
    /// Moves to the next completion; `false` when there is none (for now).
    fn advance(&mut self) -> Result<bool>;
    /// The current completion's `wr_id`.
    fn wr_id(&self) -> u64;
    /// Its status.
    fn status(&self) -> WcStatus;
    /// Its operation.
    fn opcode(&self) -> WcOpcode;
    /// The local QP number.
    fn qp_num(&self) -> u32;
    /// Bytes received.
    fn byte_len(&self) -> u32;
    /// Flags.
    fn flags(&self) -> WcFlags;
    /// Immediate data (0 without [`WcFlags::WITH_IMM`]); with [`WcFlags::WITH_INV`], the
    /// invalidated rkey.
    fn imm(&self) -> u32;
    /// The sender's QP number (UD receives).
    fn src_qp(&self) -> u32;
    /// The device's detail of an error.
    fn vendor_err(&self) -> u32;
    /// Takes the safe path's buffer tag of the current completion (else the provider hands
    /// the buffer back to its pool when the cursor moves on).
    #[doc(hidden)]
    fn take_tag(&mut self) -> Option<u32>;
}
