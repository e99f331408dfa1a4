//! PVRDMA shared-memory layouts: the device shared region (DSR), capabilities, command and
//! response slots. Field names as L-API names them; every struct's size is asserted.
//!
//! Sources: Linux `pvrdma_dev_api.h` (L-API) and `pvrdma_verbs.h` (L-VRB), checked against the
//! pahole offsets of `docs/pvrdma.md` §3 and §5.3.

#![allow(dead_code)] // A complete hardware layout: fields exist for their offsets, not all are read.

use crate::dma::pod;

/// Driver interface version written into the DSR (L-MAIN writes 20; QEMU ignores it).
pub const DRIVER_VERSION: u32 = 20;
/// gos_info word: 64-bit (gos_bits = 2), Linux-compatible (gos_type = 1 at bit 2), version 1
/// (gos_ver at bit 6) — what L-MAIN writes.
pub const GOS_INFO: u32 = 2 | (1 << 2) | (1 << 6);

/// Device versions this driver speaks (L-API `PVRDMA_*_VERSION`).
pub const VERSION_ROCEV1: u32 = 17;
/// RoCEv2 capable.
pub const VERSION_ROCEV2: u32 = 18;
/// 64-bit PFNs (uar_pfn64, CREATE_UC pfn64).
pub const VERSION_PPN64: u32 = 19;
/// Separate QP handle in the CREATE_QP response.
pub const VERSION_QP_HANDLE: u32 = 20;

/// caps.mode value for RoCE.
pub const MODE_ROCE: u8 = 0;
/// gid_types bit: RoCEv1.
pub const GID_TYPE_ROCE_V1: u8 = 1;
/// gid_types bit: RoCEv2.
pub const GID_TYPE_ROCE_V2: u8 = 2;

/// Page count of each notification ring, including its state page. QEMU uses (n − 1)·1024
/// 4-byte slots; 2 pages give a power-of-two ring (1024 slots), unlike Linux's 4 (§7).
pub const NOTIFY_RING_PAGES: u32 = 2;

/// Size of the command slot QEMU maps (the request union, equal to MODIFY_QP).
pub const CMD_SLOT_SIZE: usize = 184;
/// Size of the response slot QEMU maps (the response union, equal to the QUERY_QP response).
pub const RESP_SLOT_SIZE: usize = 176;
/// Offset of the response slot in the driver's command page.
pub const RESP_SLOT_OFFSET: usize = 2048;

/// A ring's page count and page directory (L-API `pvrdma_ring_page_info`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RingPageInfo {
    pub num_pages: u32,
    pub reserved: u32,
    pub pdir_dma: u64,
}

/// Device capabilities, written by the device into the DSR (L-API `pvrdma_device_caps`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Caps {
    pub fw_ver: u64,
    /// Big-endian.
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub atomic_arg_sizes: u64,
    pub ex_comp_mask: u32,
    pub device_cap_flags2: u32,
    pub max_fa_bit_boundary: u32,
    pub log_max_atomic_inline_arg: u32,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub device_cap_flags: u32,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_ee_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_ee_init_rd_atom: u32,
    pub max_ee: u32,
    pub max_rdd: u32,
    pub max_mw: u32,
    pub max_raw_ipv6_qp: u32,
    pub max_raw_ethy_qp: u32,
    pub max_mcast_grp: u32,
    pub max_mcast_qp_attach: u32,
    pub max_total_mcast_qp_attach: u32,
    pub max_ah: u32,
    pub max_fmr: u32,
    pub max_map_per_fmr: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_uar: u32,
    pub gid_tbl_len: u32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
    pub mode: u8,
    pub atomic_ops: u8,
    pub bmme_flags: u8,
    pub gid_types: u8,
    pub max_fast_reg_page_list_len: u32,
}

/// The device shared region (L-API `pvrdma_device_shared_region`), 280 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Dsr {
    pub driver_version: u32,
    pub pad: u32,
    pub gos_info: u32,
    pub gos_pad: u32,
    pub cmd_slot_dma: u64,
    pub resp_slot_dma: u64,
    pub async_ring_pages: RingPageInfo,
    pub cq_ring_pages: RingPageInfo,
    /// `uar_pfn` (u32) below version 19, `uar_pfn64` from 19 on; the same bytes for PFNs that
    /// fit 32 bits.
    pub uar_pfn64: u64,
    pub caps: Caps,
}

/// Offset of `caps` in the DSR.
pub const DSR_CAPS_OFFSET: usize = 0x48;

/// Command request header (L-API `pvrdma_cmd_hdr`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CmdHdr {
    /// Cookie the device echoes in the response.
    pub response: u64,
    pub cmd: u32,
    pub reserved: u32,
}

/// Command response header (L-API `pvrdma_cmd_resp_hdr`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RespHdr {
    pub response: u64,
    pub ack: u32,
    pub err: u8,
    pub reserved: [u8; 3],
}

/// Command opcodes (L-API `enum pvrdma_cmd_typ`); the ack is `0x8000_0000 | opcode`.
pub mod opcode {
    pub const QUERY_PORT: u32 = 0;
    pub const QUERY_PKEY: u32 = 1;
    pub const CREATE_PD: u32 = 2;
    pub const DESTROY_PD: u32 = 3;
    pub const CREATE_MR: u32 = 4;
    pub const DESTROY_MR: u32 = 5;
    pub const CREATE_CQ: u32 = 6;
    pub const RESIZE_CQ: u32 = 7;
    pub const DESTROY_CQ: u32 = 8;
    pub const CREATE_QP: u32 = 9;
    pub const MODIFY_QP: u32 = 10;
    pub const QUERY_QP: u32 = 11;
    pub const DESTROY_QP: u32 = 12;
    pub const CREATE_BIND: u32 = 15;
    pub const DESTROY_BIND: u32 = 16;
    pub const CREATE_SRQ: u32 = 17;
    pub const MODIFY_SRQ: u32 = 18;
    pub const QUERY_SRQ: u32 = 19;
    pub const DESTROY_SRQ: u32 = 20;
    /// Bit set in the ack of every response.
    pub const ACK_BIT: u32 = 0x8000_0000;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QueryPort {
    pub hdr: CmdHdr,
    pub port_num: u8,
    pub reserved: [u8; 7],
}

/// Port attributes (L-VRB `pvrdma_port_attr`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: u32,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub reserved: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QueryPortResp {
    pub hdr: RespHdr,
    pub attrs: PortAttr,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QueryPkey {
    pub hdr: CmdHdr,
    pub port_num: u8,
    pub index: u8,
    pub reserved: [u8; 6],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QueryPkeyResp {
    pub hdr: RespHdr,
    pub pkey: u16,
    pub reserved: [u8; 6],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreatePd {
    pub hdr: CmdHdr,
    pub ctx_handle: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreatePdResp {
    pub hdr: RespHdr,
    pub pd_handle: u32,
    pub reserved: u32,
}

/// Any destroy command that names one handle (DESTROY_PD/CQ/QP/SRQ/MR).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DestroyHandle {
    pub hdr: CmdHdr,
    pub handle: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateCq {
    pub hdr: CmdHdr,
    pub pdir_dma: u64,
    pub ctx_handle: u32,
    pub cqe: u32,
    pub nchunks: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateCqResp {
    pub hdr: RespHdr,
    pub cq_handle: u32,
    pub cqe: u32,
}

/// RESIZE_CQ (L-API `pvrdma_cmd_resize_cq`): the handle and the new size, no ring pages.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ResizeCq {
    pub hdr: CmdHdr,
    pub cq_handle: u32,
    pub cqe: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ResizeCqResp {
    pub hdr: RespHdr,
    pub cqe: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateBind {
    pub hdr: CmdHdr,
    pub mtu: u32,
    pub vlan: u32,
    pub index: u32,
    pub new_gid: [u8; 16],
    pub gid_type: u8,
    pub reserved: [u8; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DestroyBind {
    pub hdr: CmdHdr,
    pub index: u32,
    pub dest_gid: [u8; 16],
    pub reserved: u32,
}

/// QP types (L-VRB `enum pvrdma_qp_type`, IB numbering).
pub mod qp_type {
    pub const GSI: u8 = 1;
    pub const RC: u8 = 2;
    pub const UD: u8 = 4;
}

/// QP access flag LOCAL_WRITE (L-VRB `PVRDMA_ACCESS_LOCAL_WRITE`), what Linux sends at create.
pub const ACCESS_LOCAL_WRITE: u32 = 1;
/// ah_flags bit: the address has a GRH (L-VRB `PVRDMA_AH_GRH`).
pub const AH_GRH: u8 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateQp {
    pub hdr: CmdHdr,
    pub pdir_dma: u64,
    pub pd_handle: u32,
    pub send_cq_handle: u32,
    pub recv_cq_handle: u32,
    pub srq_handle: u32,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub lkey: u32,
    pub access_flags: u32,
    pub total_chunks: u16,
    pub send_chunks: u16,
    pub max_atomic_arg: u16,
    pub sq_sig_all: u8,
    pub qp_type: u8,
    pub is_srq: u8,
    pub reserved: [u8; 3],
}

/// CREATE_QP response below version 20 (QEMU): the QP number is the handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateQpRespV1 {
    pub hdr: RespHdr,
    pub qpn: u32,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// CREATE_QP response from version 20: a separate handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateQpRespV2 {
    pub hdr: RespHdr,
    pub qpn: u32,
    pub qp_handle: u32,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub reserved: u32,
}

/// Global route header of an address (L-VRB `pvrdma_global_route`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalRoute {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reserved: u8,
}

/// Address attributes (L-VRB `pvrdma_ah_attr`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AhAttr {
    pub grh: GlobalRoute,
    pub dlid: u16,
    pub vlan_id: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub ah_flags: u8,
    pub port_num: u8,
    pub dmac: [u8; 6],
    pub reserved: u8,
}

/// QP capacities (L-VRB `pvrdma_qp_cap`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub reserved: u32,
}

/// QP attributes (L-VRB `pvrdma_qp_attr`), 160 bytes. In QEMU's QUERY_QP answer only the
/// fields up to `qp_access_flags` (offset 0x20) have this layout (§5.3).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub reserved: [u8; 5],
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub alt_ah_attr: AhAttr,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ModifyQp {
    pub hdr: CmdHdr,
    pub qp_handle: u32,
    pub attr_mask: u32,
    pub attrs: QpAttr,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QueryQp {
    pub hdr: CmdHdr,
    pub qp_handle: u32,
    pub attr_mask: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QueryQpResp {
    pub hdr: RespHdr,
    pub attrs: QpAttr,
}

/// SRQ attributes (L-VRB `pvrdma_srq_attr`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateSrq {
    pub hdr: CmdHdr,
    pub pdir_dma: u64,
    pub pd_handle: u32,
    pub nchunks: u32,
    pub attrs: SrqAttr,
    pub srq_type: u8,
    pub reserved: [u8; 7],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateSrqResp {
    pub hdr: RespHdr,
    pub srqn: u32,
    pub reserved: u32,
}

/// MODIFY_SRQ's attribute mask bits (L-VRB `enum pvrdma_srq_attr_mask`).
pub mod srq_mask {
    pub const MAX_WR: u32 = 1 << 0;
    pub const LIMIT: u32 = 1 << 1;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ModifySrq {
    pub hdr: CmdHdr,
    pub srq_handle: u32,
    pub attr_mask: u32,
    pub attrs: SrqAttr,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QuerySrq {
    pub hdr: CmdHdr,
    pub srq_handle: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QuerySrqResp {
    pub hdr: RespHdr,
    pub attrs: SrqAttr,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateMr {
    pub hdr: CmdHdr,
    pub start: u64,
    pub length: u64,
    pub pdir_dma: u64,
    pub pd_handle: u32,
    pub access_flags: u32,
    pub flags: u32,
    pub nchunks: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateMrResp {
    pub hdr: RespHdr,
    pub mr_handle: u32,
    pub lkey: u32,
    pub rkey: u32,
    pub reserved: u32,
}

/// Send WQE header (L-ABI `pvrdma_sq_wqe_hdr`), 80 bytes; the SGEs follow. `wr` is the
/// 48-byte union: RDMA (remote_addr, rkey), atomics, or UD (remote_qpn, remote_qkey, av).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SqWqeHdr {
    pub wr_id: u64,
    pub num_sge: u32,
    pub total_len: u32,
    pub opcode: u32,
    pub send_flags: u32,
    pub ex: u32,
    pub reserved: u32,
    pub wr: [u32; 12],
}

/// Word indices into [`SqWqeHdr::wr`] (byte offset 0x20 + 4·i of the WQE).
pub mod wr {
    /// rdma / atomic: remote_addr (2 words).
    pub const REMOTE_ADDR: usize = 0;
    /// rdma: rkey.
    pub const RDMA_RKEY: usize = 2;
    /// ud: remote_qpn.
    pub const UD_REMOTE_QPN: usize = 0;
    /// ud: remote_qkey.
    pub const UD_REMOTE_QKEY: usize = 1;
    /// ud av: port_pd (pd handle bits 0–23, port bits 24–31).
    pub const AV_PORT_PD: usize = 2;
    /// ud av: sl_tclass_flowlabel (traffic class from bit 20, flow label below).
    pub const AV_SL_TCLASS_FLOW: usize = 3;
    /// ud av: dgid (4 words).
    pub const AV_DGID: usize = 4;
    /// av: src_path_bits, gid_index (byte 0x41 of the WQE: QEMU reads it for every QP type),
    /// stat_rate, hop_limit.
    pub const AV_GID_WORD: usize = 8;
}

/// Send WQE opcodes (L-ABI `enum pvrdma_wr_opcode`).
pub mod wr_opcode {
    pub const RDMA_WRITE: u32 = 0;
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    pub const SEND: u32 = 2;
    pub const SEND_WITH_IMM: u32 = 3;
    pub const RDMA_READ: u32 = 4;
}

/// Send flags (L-ABI `enum pvrdma_send_flags`).
pub mod send_flags {
    pub const FENCE: u32 = 1;
    pub const SIGNALED: u32 = 2;
    pub const SOLICITED: u32 = 4;
}

/// Receive WQE header (L-ABI `pvrdma_rq_wqe_hdr`), 16 bytes; the SGEs follow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RqWqeHdr {
    pub wr_id: u64,
    pub num_sge: u32,
    pub total_len: u32,
}

/// Scatter/gather entry (L-ABI `pvrdma_sge`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WqeSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// Completion queue entry (L-ABI `pvrdma_cqe`), 64 bytes. No valid bit: only the ring's
/// prod_tail says it is ready.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Cqe {
    pub wr_id: u64,
    pub qp: u64,
    pub opcode: u32,
    pub status: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub vendor_err: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
    pub port_num: u8,
    pub smac: [u8; 6],
    pub network_hdr_type: u8,
    pub reserved: [u8; 6],
}

/// CQE opcodes (L-ABI `enum pvrdma_wc_opcode`).
pub mod wc_opcode {
    pub const SEND: u32 = 0;
    pub const RDMA_WRITE: u32 = 1;
    pub const RDMA_READ: u32 = 2;
    pub const COMP_SWAP: u32 = 3;
    pub const FETCH_ADD: u32 = 4;
    pub const RECV: u32 = 128;
    pub const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// Ring-state offsets in a queue's page 0 (L-RING, §7): the SQ's at 0; the RQ's, an SRQ's and
/// a CQ's at 8. Each is prod_tail then cons_head.
pub const RING_STATE_TX: usize = 0;
/// See [`RING_STATE_TX`].
pub const RING_STATE_RX: usize = 8;
/// CQE size.
pub const CQE_SIZE: usize = 64;

pod!(
    RingPageInfo,
    Caps,
    Dsr,
    CmdHdr,
    RespHdr,
    QueryPort,
    PortAttr,
    QueryPortResp,
    QueryPkey,
    QueryPkeyResp,
    CreatePd,
    CreatePdResp,
    DestroyHandle,
    CreateCq,
    CreateCqResp,
    CreateBind,
    DestroyBind,
    CreateQp,
    CreateQpRespV1,
    CreateQpRespV2,
    GlobalRoute,
    AhAttr,
    QpCap,
    QpAttr,
    ModifyQp,
    QueryQp,
    QueryQpResp,
    SrqAttr,
    CreateSrq,
    CreateSrqResp,
    ResizeCq,
    ResizeCqResp,
    ModifySrq,
    QuerySrq,
    QuerySrqResp,
    CreateMr,
    CreateMrResp,
    SqWqeHdr,
    RqWqeHdr,
    WqeSge,
    Cqe,
);

macro_rules! assert_size {
    ($($t:ty => $n:expr),* $(,)?) => { $( const _: () = assert!(size_of::<$t>() == $n); )* };
}
assert_size!(
    RingPageInfo => 16,
    Caps => 208,
    Dsr => 280,
    CmdHdr => 16,
    RespHdr => 16,
    QueryPort => 24,
    PortAttr => 48,
    QueryPortResp => 64,
    QueryPkey => 24,
    QueryPkeyResp => 24,
    CreatePd => 24,
    CreatePdResp => 24,
    DestroyHandle => 24,
    CreateCq => 40,
    CreateCqResp => 24,
    CreateBind => 48,
    DestroyBind => 40,
    CreateQp => 80,
    CreateQpRespV1 => 40,
    CreateQpRespV2 => 48,
    GlobalRoute => 24,
    AhAttr => 40,
    QpCap => 24,
    QpAttr => 160,
    ModifyQp => 184,
    QueryQp => 24,
    QueryQpResp => 176,
    SrqAttr => 16,
    CreateSrq => 56,
    CreateSrqResp => 24,
    ResizeCq => 24,
    ResizeCqResp => 24,
    ModifySrq => 40,
    QuerySrq => 24,
    QuerySrqResp => 32,
    CreateMr => 56,
    CreateMrResp => 32,
    SqWqeHdr => 80,
    RqWqeHdr => 16,
    WqeSge => 16,
    Cqe => 64,
);
const _: () = assert!(core::mem::offset_of!(SqWqeHdr, wr) == 0x20);
const _: () = assert!(core::mem::offset_of!(CreateMr, nchunks) == 0x34);
const _: () = assert!(core::mem::offset_of!(Cqe, vendor_err) == 0x28);
const _: () = assert!(core::mem::offset_of!(Cqe, network_hdr_type) == 0x39);
const _: () = assert!(core::mem::offset_of!(CreateQp, total_chunks) == 0x44);
const _: () = assert!(core::mem::offset_of!(CreateQp, is_srq) == 0x4C);
const _: () = assert!(core::mem::offset_of!(QpAttr, cap) == 0x38);
const _: () = assert!(core::mem::offset_of!(QpAttr, ah_attr) == 0x50);
const _: () = assert!(core::mem::offset_of!(QpAttr, timeout) == 0x2E);
const _: () = assert!(core::mem::offset_of!(AhAttr, ah_flags) == 0x1F);
const _: () = assert!(core::mem::offset_of!(AhAttr, dmac) == 0x21);
const _: () = assert!(core::mem::offset_of!(ModifyQp, attrs) == 0x18);
const _: () = assert!(core::mem::offset_of!(CreateSrq, srq_type) == 0x30);
const _: () = assert!(size_of::<ModifyQp>() == CMD_SLOT_SIZE);
const _: () = assert!(size_of::<QueryQpResp>() == RESP_SLOT_SIZE);
const _: () = assert!(core::mem::offset_of!(Dsr, caps) == DSR_CAPS_OFFSET);
const _: () = assert!(core::mem::offset_of!(Dsr, uar_pfn64) == 0x40);
const _: () = assert!(core::mem::offset_of!(Caps, max_qp) == 0x4C);
const _: () = assert!(core::mem::offset_of!(Caps, max_ah) == 0xA4);
const _: () = assert!(core::mem::offset_of!(Caps, gid_tbl_len) == 0xC0);
const _: () = assert!(core::mem::offset_of!(Caps, gid_types) == 0xCB);
const _: () = assert!(core::mem::offset_of!(PortAttr, active_width) == 0x2B);
const _: () = assert!(core::mem::offset_of!(CreateBind, gid_type) == 0x2C);
const _: () =
    assert!(RESP_SLOT_OFFSET >= CMD_SLOT_SIZE && RESP_SLOT_OFFSET + RESP_SLOT_SIZE <= 4096);
