//! Work requests and completions (`ibv_send_wr`, `ibv_recv_wr`, `ibv_wc`), device-agnostic.

use super::AddressVector;

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

/// What a send work request does (`ibv_wr_opcode` with its operands).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with 32-bit immediate data.
    SendWithImm(u32),
    /// RDMA WRITE to `remote_addr` in the region keyed `rkey`.
    RdmaWrite {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate data (consumes a receive at the peer).
    RdmaWriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ from `remote_addr` into the local scatter list.
    RdmaRead {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// Atomic compare-and-swap of the 8 bytes at `remote_addr`.
    AtomicCmpSwap {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Compared with.
        compare: u64,
        /// Stored when equal.
        swap: u64,
    },
    /// Atomic fetch-and-add of the 8 bytes at `remote_addr`.
    AtomicFetchAdd {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Added.
        add: u64,
    },
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

/// Where a UD send goes: the address, the remote QP number and its Q_Key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// The path (GRH: destination GID, source GID index…).
    pub av: AddressVector,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Destination Q_Key (bit 31 set: use the QP's own Q_Key).
    pub remote_qkey: u32,
}

/// A send work request (`ibv_send_wr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr<'s> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The gather list.
    pub sg_list: &'s [Sge],
    /// The operation.
    pub op: SendOp,
    /// Flags.
    pub flags: SendFlags,
    /// UD destination (UD and GSI QPs only).
    pub ud: Option<UdDest>,
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
        ALL.get(raw as usize).copied()
    }
}

/// What completed (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
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
}

bitflags::bitflags! {
    /// Completion flags (`enum ibv_wc_flags`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct WcFlags: u32 {
        /// A GRH is in the first 40 bytes of the receive buffer (UD).
        const GRH = 1 << 0;
        /// `imm` is valid.
        const WITH_IMM = 1 << 1;
    }
}

/// A work completion (`struct ibv_wc`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's `wr_id`.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Operation.
    pub opcode: WcOpcode,
    /// Bytes received (receives, RDMA READ).
    pub byte_len: u32,
    /// Immediate data, when [`WcFlags::WITH_IMM`].
    pub imm: u32,
    /// The local QP number, as the device reported it.
    pub qp_num: u32,
    /// The sender's QP number (UD receives).
    pub src_qp: u32,
    /// Flags.
    pub flags: WcFlags,
    /// Device-specific detail of an error.
    pub vendor_err: u32,
}
