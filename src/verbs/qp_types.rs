//! Device-agnostic queue-pair and shared-receive-queue vocabulary (`ibv_qp_init_attr[_ex]`,
//! `ibv_qp_attr`, `ibv_srq_init_attr`), in `libibverbs` numbering.

use super::types::{Gid, Mtu};

/// Queue pair transport type (`enum ibv_qp_type`, plus GSI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// Raw Ethernet packets.
    RawPacket,
    /// XRC initiator.
    XrcSend,
    /// XRC target.
    XrcRecv,
    /// The general services interface QP (QP1), for management datagrams.
    Gsi,
}

impl QpType {
    /// Whether a QP of this type may receive through a shared receive queue (RC and UD only).
    pub fn may_use_srq(self) -> bool {
        matches!(self, QpType::Rc | QpType::Ud)
    }
}

/// Queue pair state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Reset: just created, or reset.
    Reset,
    /// Initialized: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error.
    Err,
}

impl QpState {
    /// The `ibv_qp_state` number.
    pub fn to_raw(self) -> u32 {
        self as u32
    }

    /// From an `ibv_qp_state` number.
    pub fn from_raw(raw: u32) -> Option<QpState> {
        Some(match raw {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => return None,
        })
    }
}

/// Queue pair capacities (`struct ibv_qp_cap`). In a request, the minimum wanted; from create
/// and query, what the queue pair actually has (each ≥ the request).
///
/// The default, [`QpCaps::DEFAULT`] (what [`QpBuilder`](super::QpBuilder) asks for unless
/// [`caps`](super::QpBuilder::caps) says otherwise): 16 send and 16 receive requests
/// outstanding, 1 scatter/gather entry each, no inline data: well within both devices'
/// limits (PVRDMA's rings of 16 slots fit a page each). On PVRDMA a queue
/// pair reserves a completion for every request it may have outstanding, so its completion
/// queue(s) need room for 32 more (16 + 16 on one CQ). Ask for deeper queues with
/// `.caps(QpCaps { max_send_wr: 256, ..QpCaps::default() })`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests (0 with a shared receive queue).
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive work request (0 with a shared receive queue).
    pub max_recv_sge: u32,
    /// Bytes of inline data per send work request.
    pub max_inline_data: u32,
}

impl QpCaps {
    /// The capacities a queue pair gets unless asked otherwise (and [`QpCaps::default`]): 16
    /// requests outstanding each way, 1 scatter/gather entry each, no inline data.
    pub const DEFAULT: QpCaps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
}

impl Default for QpCaps {
    /// [`QpCaps::DEFAULT`]: the depths [`QpBuilder`](super::QpBuilder) gives a queue pair
    /// unless [`caps`](super::QpBuilder::caps) says otherwise.
    fn default() -> Self {
        QpCaps::DEFAULT
    }
}

bitflags::bitflags! {
    /// Memory and queue-pair access rights (`enum ibv_access_flags`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct AccessFlags: u32 {
        /// The local side may write.
        const LOCAL_WRITE = 1 << 0;
        /// Remote peers may RDMA-write.
        const REMOTE_WRITE = 1 << 1;
        /// Remote peers may RDMA-read.
        const REMOTE_READ = 1 << 2;
        /// Remote peers may perform atomics.
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound.
        const MW_BIND = 1 << 4;
    }
}

bitflags::bitflags! {
    /// Which attributes of a modify are valid (`enum ibv_qp_attr_mask`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct QpAttrMask: u32 {
        /// `qp_state`.
        const STATE = 1 << 0;
        /// `cur_qp_state`.
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`.
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `port_num`.
        const PORT = 1 << 5;
        /// `qkey`.
        const QKEY = 1 << 6;
        /// `ah_attr`.
        const AV = 1 << 7;
        /// `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `timeout`.
        const TIMEOUT = 1 << 9;
        /// `retry_cnt`.
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry`.
        const RNR_RETRY = 1 << 11;
        /// `rq_psn`.
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `alt_ah_attr`.
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`.
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state`.
        const PATH_MIG_STATE = 1 << 18;
        /// `cap`.
        const CAP = 1 << 19;
        /// `dest_qp_num`.
        const DEST_QPN = 1 << 20;
    }
}

/// A RoCE address vector: where a connected QP's peer is (always with a GRH: RoCE routes by
/// GID).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressVector {
    /// The peer's GID.
    pub dgid: Gid,
    /// Index of the local GID to send from (a bound [`GidBinding`](super::GidBinding)).
    pub sgid_index: u8,
    /// IP hop limit.
    pub hop_limit: u8,
    /// IP traffic class.
    pub traffic_class: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
}

impl AddressVector {
    /// An address vector to `dgid` from local GID `sgid_index`, hop limit 1 (a link-local peer).
    pub fn new(dgid: Gid, sgid_index: u8) -> Self {
        AddressVector {
            dgid,
            sgid_index,
            hop_limit: 1,
            traffic_class: 0,
            flow_label: 0,
            sl: 0,
        }
    }
}

/// Attributes of one modify (`ibv_qp_attr` + mask), as the typestate transitions build them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModifyAttr {
    /// Which fields are valid.
    pub mask: QpAttrMask,
    /// Target state.
    pub state: QpState,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive PSN (24 bits).
    pub rq_psn: u32,
    /// Send PSN (24 bits).
    pub sq_psn: u32,
    /// Destination QP number (24 bits).
    pub dest_qpn: u32,
    /// Remote access rights.
    pub access: AccessFlags,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port (1-based).
    pub port: u8,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Local ACK timeout (4.096 µs · 2^timeout).
    pub timeout: u8,
    /// Retries on timeout.
    pub retry_cnt: u8,
    /// Retries on receiver-not-ready.
    pub rnr_retry: u8,
    /// Receiver-not-ready NAK timer code.
    pub min_rnr_timer: u8,
    /// Outstanding RDMA reads/atomics this QP initiates.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics this QP accepts.
    pub max_dest_rd_atomic: u8,
    /// Primary path (connected QPs at RTR).
    pub av: Option<AddressVector>,
}

impl ModifyAttr {
    /// A modify to `state` with nothing else set.
    pub fn to_state(state: QpState) -> Self {
        ModifyAttr {
            mask: QpAttrMask::STATE,
            state,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qpn: 0,
            access: AccessFlags::empty(),
            pkey_index: 0,
            port: 1,
            path_mtu: Mtu::Mtu1024,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            min_rnr_timer: 0,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            av: None,
        }
    }
}

impl ModifyAttr {
    /// Folds `m` into this record of the values last set: each attribute `m`'s mask names
    /// replaces the recorded one, the others stay; the state is always `m`'s.
    pub(crate) fn merge(&mut self, m: &ModifyAttr) {
        let has = |b: QpAttrMask| m.mask.contains(b);
        self.state = m.state;
        if has(QpAttrMask::QKEY) {
            self.qkey = m.qkey;
        }
        if has(QpAttrMask::RQ_PSN) {
            self.rq_psn = m.rq_psn;
        }
        if has(QpAttrMask::SQ_PSN) {
            self.sq_psn = m.sq_psn;
        }
        if has(QpAttrMask::DEST_QPN) {
            self.dest_qpn = m.dest_qpn;
        }
        if has(QpAttrMask::ACCESS_FLAGS) {
            self.access = m.access;
        }
        if has(QpAttrMask::PKEY_INDEX) {
            self.pkey_index = m.pkey_index;
        }
        if has(QpAttrMask::PORT) {
            self.port = m.port;
        }
        if has(QpAttrMask::PATH_MTU) {
            self.path_mtu = m.path_mtu;
        }
        if has(QpAttrMask::TIMEOUT) {
            self.timeout = m.timeout;
        }
        if has(QpAttrMask::RETRY_CNT) {
            self.retry_cnt = m.retry_cnt;
        }
        if has(QpAttrMask::RNR_RETRY) {
            self.rnr_retry = m.rnr_retry;
        }
        if has(QpAttrMask::MIN_RNR_TIMER) {
            self.min_rnr_timer = m.min_rnr_timer;
        }
        if has(QpAttrMask::MAX_QP_RD_ATOMIC) {
            self.max_rd_atomic = m.max_rd_atomic;
        }
        if has(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            self.max_dest_rd_atomic = m.max_dest_rd_atomic;
        }
        if has(QpAttrMask::AV) && m.av.is_some() {
            self.av = m.av;
        }
        self.mask |= m.mask;
    }
}

/// What `ibv_query_qp` reports: the attributes the device reports, the ones the driver last
/// set where the device reports none, and the creation attributes (`ibv_qp_init_attr`).
///
/// Which value comes from where depends on the device; each provider documents it (PVRDMA:
/// `device::pvrdma`'s `qp_state.rs`, and the table in README).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpAttr {
    /// Current state.
    pub state: QpState,
    /// The current state as the device names it in `cur_qp_state` (equal to `state` unless
    /// the device says otherwise).
    pub cur_state: QpState,
    /// Actual capacities.
    pub caps: QpCaps,
    /// The QP number.
    pub qp_num: u32,
    /// Q_Key.
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Destination QP number.
    pub dest_qpn: u32,
    /// Whether every send request generates a completion.
    pub sq_sig_all: bool,
    /// Outstanding RDMA reads/atomics this QP initiates, as the device applies it (a request
    /// above the device's limit is clamped to what the device does).
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics this QP accepts, as the device applies it (clamped
    /// likewise).
    pub max_dest_rd_atomic: u8,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Remote access rights (`qp_access_flags`).
    pub access: AccessFlags,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port (1-based).
    pub port: u8,
    /// Local ACK timeout code (4.096 µs · 2^timeout).
    pub timeout: u8,
    /// Retries on timeout.
    pub retry_cnt: u8,
    /// Retries on receiver-not-ready (7: infinite).
    pub rnr_retry: u8,
    /// Receiver-not-ready NAK timer code.
    pub min_rnr_timer: u8,
    /// The primary path (connected QPs from RTR on; `None` before, and for datagram QPs).
    pub av: Option<AddressVector>,
    /// Whether the send queue is draining (SQD).
    pub sq_draining: bool,
    /// The transport (a creation attribute).
    pub qp_type: QpType,
    /// Whether receives come from a shared receive queue (a creation attribute).
    pub has_srq: bool,
}

bitflags::bitflags! {
    /// `ibv_qp_init_attr_ex.create_flags` (`enum ibv_qp_create_flags`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CreateFlags: u32 {
        /// Block self multicast loopback.
        const BLOCK_SELF_MCAST_LB = 1 << 1;
        /// Keep the Ethernet FCS in received packets.
        const SCATTER_FCS = 1 << 8;
        /// Strip customer VLAN tags.
        const CVLAN_STRIPPING = 1 << 9;
        /// Send with `source_qpn` (UD).
        const SOURCE_QPN = 1 << 10;
        /// Pad PCI writes to the end of the cache line.
        const PCI_WRITE_END_PADDING = 1 << 11;
    }
}

/// Receive-side scaling configuration (`struct ibv_rx_hash_conf` with its indirection table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxHashConf<'a> {
    /// Hash function (`IBV_RX_HASH_FUNC_TOEPLITZ` = 1).
    pub function: u8,
    /// Hash key.
    pub key: &'a [u8],
    /// Which header fields are hashed (`enum ibv_rx_hash_fields`).
    pub fields_mask: u64,
    /// Indirection table handle.
    pub ind_table: u32,
}

/// The `_ex` part of queue pair creation (`ibv_qp_init_attr_ex` beyond `ibv_qp_init_attr`).
/// Every field defaults to "not used"; a device that lacks a feature refuses it with
/// [`Unsupported`](crate::error::Unsupported), never ignores it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpInitEx<'a> {
    /// Creation flags.
    pub create_flags: CreateFlags,
    /// Source QP number to send as (UD, with [`CreateFlags::SOURCE_QPN`]).
    pub source_qpn: Option<u32>,
    /// Receive-side scaling.
    pub rx_hash: Option<RxHashConf<'a>>,
    /// Largest TSO header (0: none).
    pub max_tso_header: u16,
    /// XRC domain (XRC target QPs).
    pub xrcd: Option<u32>,
}

/// Everything a provider needs to create a queue pair, as the builder gathers it.
#[derive(Clone, Copy, Debug)]
pub struct QpInit<'a> {
    /// Transport.
    pub qp_type: QpType,
    /// Requested capacities.
    pub caps: QpCaps,
    /// Whether every send generates a completion.
    pub sq_sig_all: bool,
    /// Whether receives come from a shared receive queue.
    pub has_srq: bool,
    /// The `_ex` attributes.
    pub ex: QpInitEx<'a>,
    /// The safe path: where the buffers of completed safe requests go back (the provider
    /// keeps a per-slot record of `wr_id` and buffer); `None` for a raw-only QP.
    pub safe: Option<super::buf_release::BufRelease>,
}

/// Shared receive queue attributes (`struct ibv_srq_attr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrqAttr {
    /// Outstanding work requests (actual ≥ requested).
    pub max_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Limit at which the device raises SRQ_LIMIT_REACHED (0: off).
    pub srq_limit: u32,
}
