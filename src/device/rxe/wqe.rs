//! The work-request records a queue pair keeps in its rings (send and receive entries), the
//! responder's replay resources, and the completions built from them.

use super::MAX_INLINE;
use super::MAX_SGE;
use crate::verbs::{SendFlags, Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode};

/// Operation codes of a send entry.
pub(crate) mod op {
    // Numbered so that each class is one comparison on the per-packet path: the SENDs
    // first, then the WRITEs, the local requests, and the requests that wait for a response.
    pub(crate) const SEND: u8 = 0;
    pub(crate) const SEND_IMM: u8 = 1;
    /// SEND with invalidate (its last packet carries the IETH).
    pub(crate) const SEND_INV: u8 = 2;
    pub(crate) const WRITE: u8 = 3;
    pub(crate) const WRITE_IMM: u8 = 4;
    /// Bind a memory window (local: executed by the requester, nothing sent).
    pub(crate) const BIND_MW: u8 = 5;
    /// Fast registration (local).
    pub(crate) const REG_MR: u8 = 6;
    /// Local invalidation (local).
    pub(crate) const LOCAL_INV: u8 = 7;
    pub(crate) const READ: u8 = 8;
    pub(crate) const CMP_SWAP: u8 = 9;
    pub(crate) const FETCH_ADD: u8 = 10;

    /// Whether the operation waits for a response from the peer (READ, atomics).
    pub(crate) fn reads(op: u8) -> bool {
        op >= READ
    }

    /// Whether the operation is executed locally by the requester (no packet).
    pub(crate) fn local(op: u8) -> bool {
        (BIND_MW..=LOCAL_INV).contains(&op)
    }
}

/// One send work request, as the transport keeps it (all integers: valid zeroed).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SqEntry {
    pub(crate) wr_id: u64,
    pub(crate) remote_addr: u64,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) sges: [Sge; MAX_SGE as usize],
    pub(crate) len: u32,
    pub(crate) rkey: u32,
    pub(crate) imm: u32,
    pub(crate) tag: u32,
    /// The PSN of its first packet, and how many PSNs it uses (set when first sent).
    pub(crate) first_psn: u32,
    pub(crate) npkts: u32,
    pub(crate) ud_qpn: u32,
    pub(crate) ud_qkey: u32,
    pub(crate) ud_ip: [u8; 4],
    pub(crate) ud_tos: u8,
    pub(crate) ud_ttl: u8,
    pub(crate) op: u8,
    pub(crate) flags: u8,
    pub(crate) nsge: u8,
    /// Inline data: its length (the bytes are in `inline`); 0xFF: not inline.
    pub(crate) inline_len: u8,
    pub(crate) inline: [u8; MAX_INLINE as usize],
}

impl Default for SqEntry {
    fn default() -> Self {
        SqEntry {
            wr_id: 0,
            remote_addr: 0,
            compare_add: 0,
            swap: 0,
            sges: [Sge::default(); MAX_SGE as usize],
            len: 0,
            rkey: 0,
            imm: 0,
            tag: 0,
            first_psn: 0,
            npkts: 0,
            ud_qpn: 0,
            ud_qkey: 0,
            ud_ip: [0; 4],
            ud_tos: 0,
            ud_ttl: 0,
            op: 0,
            flags: 0,
            nsge: 0,
            inline_len: 0,
            inline: [0; MAX_INLINE as usize],
        }
    }
}

impl SqEntry {
    pub(crate) fn sges(&self) -> &[Sge] {
        &self.sges[..usize::from(self.nsge).min(MAX_SGE as usize)]
    }

    pub(crate) fn is_inline(&self) -> bool {
        self.inline_len != 0xFF
    }

    pub(crate) fn signaled(&self, sig_all: bool) -> bool {
        sig_all
            || SendFlags::from_bits_truncate(u32::from(self.flags)).contains(SendFlags::SIGNALED)
    }

    pub(crate) fn wc_opcode(&self) -> WcOpcode {
        match self.op {
            op::WRITE | op::WRITE_IMM => WcOpcode::RdmaWrite,
            op::READ => WcOpcode::RdmaRead,
            op::CMP_SWAP => WcOpcode::CompSwap,
            op::FETCH_ADD => WcOpcode::FetchAdd,
            op::BIND_MW => WcOpcode::BindMw,
            op::REG_MR => WcOpcode::RegMr,
            op::LOCAL_INV => WcOpcode::LocalInv,
            _ => WcOpcode::Send,
        }
    }
}

/// One receive work request.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RqEntry {
    pub(crate) wr_id: u64,
    pub(crate) sges: [Sge; MAX_SGE as usize],
    pub(crate) tag: u32,
    pub(crate) nsge: u16,
    /// Taken from a shared receive queue on its reservation in the receive CQ (see
    /// `CqRing::take_srq`); `false` for the QP's own requests and the SRQ's on free room.
    pub(crate) srq_room: bool,
}

impl RqEntry {
    pub(crate) fn sges(&self) -> &[Sge] {
        &self.sges[..usize::from(self.nsge).min(MAX_SGE as usize)]
    }
}

/// What the responder is in the middle of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Inbound {
    /// Between messages.
    #[default]
    Idle,
    /// A multi-packet SEND into the receive request held in `QpCore::wqe`.
    Send,
    /// A multi-packet RDMA WRITE.
    Write,
}

/// A READ or atomic the responder executed, kept for replay.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RdResource {
    /// 0: free; 1: READ; 2: atomic.
    pub(crate) kind: u8,
    pub(crate) first: u32,
    pub(crate) last: u32,
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    pub(crate) len: u32,
    pub(crate) orig: u64,
    /// Its number: the requests kept are counted as they come in (the backlog's order).
    pub(crate) n: u32,
}

pub(crate) fn flushed(opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion {
        status: WcStatus::WrFlushErr,
        opcode,
        ..Default::default()
    }
}

pub(crate) fn wr_op(o: WrOpcode) -> u8 {
    match o {
        WrOpcode::Send => op::SEND,
        WrOpcode::SendWithImm => op::SEND_IMM,
        WrOpcode::RdmaWrite => op::WRITE,
        WrOpcode::RdmaWriteWithImm => op::WRITE_IMM,
        WrOpcode::RdmaRead => op::READ,
        WrOpcode::AtomicCmpSwap => op::CMP_SWAP,
        WrOpcode::AtomicFetchAdd => op::FETCH_ADD,
    }
}

/// A receive completion of `len` bytes.
pub(crate) fn recv_wc(opcode: WcOpcode, len: u32, imm: Option<u32>, src_qp: u32) -> WorkCompletion {
    WorkCompletion {
        byte_len: len,
        imm: imm.unwrap_or(0),
        src_qp,
        opcode,
        flags: if imm.is_some() {
            WcFlags::WITH_IMM
        } else {
            WcFlags::empty()
        },
        ..Default::default()
    }
}

/// The receive completion of a SEND with invalidate of `len` bytes that invalidated `rkey`.
pub(crate) fn inv_wc(len: u32, rkey: u32, src_qp: u32) -> WorkCompletion {
    WorkCompletion {
        byte_len: len,
        imm: rkey,
        src_qp,
        opcode: WcOpcode::Recv,
        flags: WcFlags::WITH_INV,
        ..Default::default()
    }
}
