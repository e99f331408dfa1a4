//! Work requests and completions (`ibv_send_wr`, `ibv_recv_wr`, `ibv_wc`), device-agnostic.

/// A scatter/gather entry: `length` bytes at `addr` of the memory region whose local key is
/// `lkey` (`struct ibv_sge`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Address in the region's address space (its IOVA).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The region's local key.
    pub lkey: u32,
}

/// A send operation (`enum ibv_wr_opcode`), as the batch methods of
/// [`SendBatch`](super::SendBatch) write it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrOpcode {
    /// SEND.
    Send,
    /// SEND with 32-bit immediate data.
    SendWithImm,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA WRITE with immediate data (consumes a receive at the peer).
    RdmaWriteWithImm,
    /// RDMA READ into the local scatter list.
    RdmaRead,
    /// Atomic compare-and-swap of 8 remote bytes.
    AtomicCmpSwap,
    /// Atomic fetch-and-add of 8 remote bytes.
    AtomicFetchAdd,
}

bitflags::bitflags! {
    /// Send flags (`enum ibv_send_flags`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct SendFlags: u32 {
        /// Wait for earlier RDMA reads/atomics before starting.
        const FENCE = 1 << 0;
        /// Generate a completion (implied by `sq_sig_all`).
        const SIGNALED = 1 << 1;
        /// Raise a solicited event at the receiver.
        const SOLICITED = 1 << 2;
        /// Send the data inline in the WQE.
        const INLINE = 1 << 3;
    }
}

/// Where a UD send goes: an address handle, the remote QP number and its Q_Key.
#[derive(Clone, Copy, Debug)]
pub struct UdTarget<'w, A> {
    /// The prepared address.
    pub ah: &'w A,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Destination Q_Key (bit 31 set: use the QP's own Q_Key).
    pub remote_qkey: u32,
}

/// One send work request as the verbs layer hands it to a provider, to be written into the
/// ring at once (the batch methods build it from constants, so the provider's dispatch on
/// `op` folds away).
#[derive(Clone, Copy, Debug)]
pub struct SendWqe<'w, A> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: WrOpcode,
    /// Flags.
    pub flags: SendFlags,
    /// The gather list.
    pub sges: &'w [Sge],
    /// RDMA and atomics: the remote address.
    pub remote_addr: u64,
    /// RDMA and atomics: the remote key.
    pub rkey: u32,
    /// Immediate data (the `_WITH_IMM` operations).
    pub imm: u32,
    /// Compare-and-swap: the value compared; fetch-and-add: the value added.
    pub compare_add: u64,
    /// Compare-and-swap: the value stored when equal.
    pub swap: u64,
    /// UD: the destination.
    pub ud: Option<UdTarget<'w, A>>,
    /// The safe path's buffer tag + 1 (0: none).
    #[doc(hidden)]
    pub tag: u32,
}

impl<'w, A> SendWqe<'w, A> {
    /// A request of `op` with nothing else set.
    #[inline(always)]
    pub fn new(wr_id: u64, op: WrOpcode, flags: SendFlags, sges: &'w [Sge]) -> Self {
        SendWqe {
            wr_id,
            op,
            flags,
            sges,
            remote_addr: 0,
            rkey: 0,
            imm: 0,
            compare_add: 0,
            swap: 0,
            ud: None,
            tag: 0,
        }
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr<'s> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The scatter list.
    pub sg_list: &'s [Sge],
}

/// Completion status (`enum ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum WcStatus {
    #[default]
    /// The work request completed.
    Success,
    /// Local length error (a receive too small, a message too long).
    LocLenErr,
    /// Local QP operation error.
    LocQpOpErr,
    /// Local EE context operation error.
    LocEecOpErr,
    /// Local protection error (a bad lkey or address).
    LocProtErr,
    /// Flushed: the QP went to the error state.
    WrFlushErr,
    /// Memory window bind error.
    MwBindErr,
    /// Bad response from the peer.
    BadRespErr,
    /// Local access error.
    LocAccessErr,
    /// The peer found the request invalid.
    RemInvReqErr,
    /// Remote access error (a bad rkey, address or right).
    RemAccessErr,
    /// The peer could not complete the operation.
    RemOpErr,
    /// Transport retries exhausted.
    RetryExcErr,
    /// Receiver-not-ready retries exhausted (no receive posted at the peer).
    RnrRetryExcErr,
    /// Local RDD violation.
    LocRddViolErr,
    /// The peer found an RDMA read request invalid.
    RemInvRdReqErr,
    /// The peer aborted.
    RemAbortErr,
    /// Invalid EE context number.
    InvEecnErr,
    /// Invalid EE context state.
    InvEecStateErr,
    /// Fatal error.
    FatalErr,
    /// Response timeout.
    RespTimeoutErr,
    /// General error (the device's detail is in `vendor_err`).
    GeneralErr,
}

impl WcStatus {
    /// From `ibv_wc_status` numbering; `None` beyond it.
    #[inline]
    pub fn from_raw(raw: u32) -> Option<WcStatus> {
        use WcStatus::*;
        const ALL: [WcStatus; 22] = [
            Success,
            LocLenErr,
            LocQpOpErr,
            LocEecOpErr,
            LocProtErr,
            WrFlushErr,
            MwBindErr,
            BadRespErr,
            LocAccessErr,
            RemInvReqErr,
            RemAccessErr,
            RemOpErr,
            RetryExcErr,
            RnrRetryExcErr,
            LocRddViolErr,
            RemInvRdReqErr,
            RemAbortErr,
            InvEecnErr,
            InvEecStateErr,
            FatalErr,
            RespTimeoutErr,
            GeneralErr,
        ];
        // The discriminants are the raw values, in order (checked at compile time).
        const _: () = {
            let mut i = 0;
            while i < ALL.len() {
                assert!(ALL[i] as usize == i);
                i += 1;
            }
        };
        if raw as usize >= ALL.len() {
            return None;
        }
        // SAFETY: `WcStatus` is `repr(u8)` and `raw` is below the number of its variants,
        // whose discriminants are 0, 1, … in order (the assertion above).
        Some(unsafe { core::mem::transmute::<u8, WcStatus>(raw as u8) })
    }
}

/// What completed (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum WcOpcode {
    /// A SEND (with or without immediate).
    #[default]
    Send,
    /// An RDMA WRITE.
    RdmaWrite,
    /// An RDMA READ.
    RdmaRead,
    /// An atomic compare-and-swap.
    CompSwap,
    /// An atomic fetch-and-add.
    FetchAdd,
    /// A receive.
    Recv,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm,
    /// A memory window bound (`IBV_WC_BIND_MW`).
    BindMw,
    /// A fast registration (`IB_WC_REG_MR`).
    RegMr,
    /// A local invalidation (`IBV_WC_LOCAL_INV`).
    LocalInv,
}

bitflags::bitflags! {
    /// Completion flags (`enum ibv_wc_flags`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct WcFlags: u8 {
        /// A GRH is in the first 40 bytes of the receive buffer (UD).
        const GRH = 1 << 0;
        /// `imm` is valid.
        const WITH_IMM = 1 << 1;
        /// The SEND that completed this receive invalidated the rkey in `imm`
        /// (`IBV_WC_WITH_INV`; see [`WorkCompletion::invalidated_rkey`]).
        const WITH_INV = 1 << 2;
    }
}

/// A work completion (`struct ibv_wc`), 32 bytes. The device's detail of an error
/// (`vendor_err`) is read through a [`PollCursor`](super::PollCursor).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's `wr_id`.
    pub wr_id: u64,
    /// Bytes received (receives, RDMA READ).
    pub byte_len: u32,
    /// Immediate data, when [`WcFlags::WITH_IMM`]; the invalidated rkey, when
    /// [`WcFlags::WITH_INV`] (`ibv_wc`'s `imm_data` / `invalidated_rkey` union).
    pub imm: u32,
    /// The local QP number.
    pub qp_num: u32,
    /// The sender's QP number (UD receives).
    pub src_qp: u32,
    /// Status.
    pub status: WcStatus,
    /// Operation.
    pub opcode: WcOpcode,
    /// Flags.
    pub flags: WcFlags,
}

impl WorkCompletion {
    /// The rkey the peer's SEND with invalidate invalidated here (`ibv_wc.invalidated_rkey`),
    /// when [`WcFlags::WITH_INV`] is set.
    pub fn invalidated_rkey(&self) -> Option<u32> {
        self.flags.contains(WcFlags::WITH_INV).then_some(self.imm)
    }
}

/// The type of a memory window (`enum ibv_mw_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MwType {
    /// Type 1: bound by `ibv_bind_mw`, usable by every QP of its PD, rebound in place.
    Type1,
    /// Type 2: bound by an `IBV_WR_BIND_MW` work request to the QP that posts it (only that
    /// QP's peer may use it), the low 8 bits of its key the consumer's; bound again only
    /// after an invalidation.
    Type2,
}

/// What a provider allocates a key for ([`Provider::alloc_key`](super::Provider::alloc_key)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// A memory window.
    Window(MwType),
    /// A memory region for fast registration of at most `max_pages` pages of 4 KiB.
    FastReg {
        /// Pages it may map.
        max_pages: u32,
    },
}

/// The work requests on a key (memory windows, fast registration, invalidation), as the
/// verbs layer hands them to a provider ([`Provider::sq_write_ext`](super::Provider::sq_write_ext)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtOp<'w> {
    /// Bind the window keyed `mw` (its key now) over `length` bytes at `addr` of the region
    /// whose local key is `mr_lkey`, with `access`, under the key `new_rkey`
    /// (`IBV_WR_BIND_MW`). Length 0 unbinds a type 1 window.
    BindMw {
        /// The window's key when posted.
        mw: u32,
        /// Its type.
        kind: MwType,
        /// The key it gets (its index bits are the window's).
        new_rkey: u32,
        /// The local key of the region it is bound over.
        mr_lkey: u32,
        /// The first byte, in the region's address space.
        addr: u64,
        /// Bytes.
        length: u64,
        /// The remote rights it grants.
        access: super::AccessFlags,
    },
    /// Register the fast-registration region keyed `mr` (its key now) over the memory of
    /// `sge` (inside a region of the QP's PD), at `iova`, with `access`, under `new_key`
    /// (`IB_WR_REG_MR`).
    RegMr {
        /// The region's key when posted.
        mr: u32,
        /// The key it gets (lkey and rkey; its index bits are the region's).
        new_key: u32,
        /// The memory mapped (one contiguous range of a registered region).
        sge: Sge,
        /// The address the region's users name its first byte by.
        iova: u64,
        /// The rights it grants.
        access: super::AccessFlags,
    },
    /// Invalidate `key` (a fast-registered region's, or a type 2 window's)
    /// (`IBV_WR_LOCAL_INV`).
    LocalInv {
        /// The key.
        key: u32,
    },
    /// SEND of `sges` that invalidates `rkey` at the peer (`IBV_WR_SEND_WITH_INV`).
    SendWithInv {
        /// The peer's key to invalidate.
        rkey: u32,
        /// The gather list.
        sges: &'w [Sge],
    },
}

impl ExtOp<'_> {
    /// The feature a device without this operation names in its `Unsupported` error.
    pub fn feature(&self) -> crate::error::Feature {
        use crate::error::Feature;
        match self {
            ExtOp::BindMw { .. } => Feature::MemoryWindows,
            ExtOp::RegMr { .. } => Feature::FastRegistration,
            ExtOp::LocalInv { .. } | ExtOp::SendWithInv { .. } => Feature::Invalidation,
        }
    }
}

/// One work request on a key, with its `wr_id` and flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtWqe<'w> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Flags (`SIGNALED`, `FENCE`, `SOLICITED`; not `INLINE`).
    pub flags: SendFlags,
    /// The operation.
    pub op: ExtOp<'w>,
}
