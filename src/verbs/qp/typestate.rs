//! The queue-pair state machine at the type level: transports, states, the attributes of each
//! transition, and the checks every modify passes before the device sees it.

use super::super::qp_types::*;
use super::super::{DeviceCaps, Mtu};
use crate::error::{Error, Param, Result};

/// Largest packet sequence number or QP number (24 bits).
const MAX_24BIT: u32 = 0x00FF_FFFF;

/// A queue pair's transport, at the type level.
pub trait Transport: sealed::Sealed {
    /// The runtime type.
    const TYPE: QpType;
    /// What the RESET → INIT transition needs.
    type InitAttr;
    /// What the INIT → RTR transition needs.
    type RtrAttr;
    /// What the RTR → RTS transition needs.
    type RtsAttr;
    #[doc(hidden)]
    fn init_modify(attr: &Self::InitAttr) -> ModifyAttr;
    #[doc(hidden)]
    fn rtr_modify(attr: &Self::RtrAttr) -> ModifyAttr;
    #[doc(hidden)]
    fn rts_modify(attr: &Self::RtsAttr) -> ModifyAttr;
}

mod sealed {
    pub trait Sealed {}
}

/// RESET → INIT of a connected QP (RC, UC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectedInit {
    /// Port (1-based).
    pub port: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// What remote peers may do.
    pub access: AccessFlags,
}

impl Default for ConnectedInit {
    fn default() -> Self {
        ConnectedInit {
            port: 1,
            pkey_index: 0,
            access: AccessFlags::empty(),
        }
    }
}

/// INIT → RTR of a connected QP: the peer's address and QP number (RoCE: always a GRH).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectedRtr {
    /// The peer's QP number.
    pub dest_qpn: u32,
    /// The first PSN expected from the peer.
    pub rq_psn: u32,
    /// The path to the peer.
    pub av: AddressVector,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Outstanding RDMA reads/atomics accepted from the peer.
    pub max_dest_rd_atomic: u8,
    /// Receiver-not-ready NAK timer code.
    pub min_rnr_timer: u8,
}

impl ConnectedRtr {
    /// RTR towards `dest_qpn` at `av`, expecting PSN `rq_psn`; MTU 1024, one RDMA READ or
    /// atomic accepted at a time (the provider clamps it to what the device does), RNR timer
    /// code 12.
    pub fn new(dest_qpn: u32, rq_psn: u32, av: AddressVector) -> Self {
        ConnectedRtr {
            dest_qpn,
            rq_psn,
            av,
            path_mtu: Mtu::Mtu1024,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
        }
    }
}

/// RTR → RTS of a connected QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectedRts {
    /// The first PSN sent.
    pub sq_psn: u32,
    /// Local ACK timeout code.
    pub timeout: u8,
    /// Retries on timeout.
    pub retry_cnt: u8,
    /// Retries on receiver-not-ready (7: infinite).
    pub rnr_retry: u8,
    /// Outstanding RDMA reads/atomics this QP initiates (its initiator depth): at 0, a READ
    /// or atomic is refused when posted.
    pub max_rd_atomic: u8,
}

impl ConnectedRts {
    /// RTS sending from PSN `sq_psn`; timeout 14, 7 retries, one RDMA READ or atomic
    /// outstanding at a time (the provider clamps it to what the device does). At depth 0 a
    /// READ or atomic is refused when posted
    /// ([`Attr::InitiatorDepth`](crate::error::Attr::InitiatorDepth)).
    pub fn new(sq_psn: u32) -> Self {
        ConnectedRts {
            sq_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        }
    }
}

/// RESET → INIT of a datagram QP (UD, GSI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatagramInit {
    /// Port (1-based).
    pub port: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Q_Key.
    pub qkey: u32,
}

impl DatagramInit {
    /// INIT on port 1, P_Key index 0, with `qkey`.
    pub fn new(qkey: u32) -> Self {
        DatagramInit {
            port: 1,
            pkey_index: 0,
            qkey,
        }
    }
}

/// RTR → RTS of a datagram QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatagramRts {
    /// The first PSN sent.
    pub sq_psn: u32,
}

fn connected_init(a: &ConnectedInit) -> ModifyAttr {
    let mut m = ModifyAttr::to_state(QpState::Init);
    m.mask |= QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    (m.port, m.pkey_index, m.access) = (a.port, a.pkey_index, a.access);
    m
}

fn connected_rtr(a: &ConnectedRtr) -> ModifyAttr {
    let mut m = ModifyAttr::to_state(QpState::Rtr);
    m.mask |= QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    m.av = Some(a.av);
    (m.path_mtu, m.dest_qpn, m.rq_psn) = (a.path_mtu, a.dest_qpn, a.rq_psn);
    (m.max_dest_rd_atomic, m.min_rnr_timer) = (a.max_dest_rd_atomic, a.min_rnr_timer);
    m
}

fn connected_rts(a: &ConnectedRts) -> ModifyAttr {
    let mut m = ModifyAttr::to_state(QpState::Rts);
    m.mask |= QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::SQ_PSN
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    (m.sq_psn, m.timeout, m.retry_cnt) = (a.sq_psn, a.timeout, a.retry_cnt);
    (m.rnr_retry, m.max_rd_atomic) = (a.rnr_retry, a.max_rd_atomic);
    m
}

fn datagram_init(a: &DatagramInit) -> ModifyAttr {
    let mut m = ModifyAttr::to_state(QpState::Init);
    m.mask |= QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
    (m.port, m.pkey_index, m.qkey) = (a.port, a.pkey_index, a.qkey);
    m
}

fn datagram_rts(a: &DatagramRts) -> ModifyAttr {
    let mut m = ModifyAttr::to_state(QpState::Rts);
    m.mask |= QpAttrMask::SQ_PSN;
    m.sq_psn = a.sq_psn;
    m
}

macro_rules! transport {
    ($(#[$doc:meta])* $name:ident, $ty:expr, connected) => {
        transport!(@def $(#[$doc])* $name, $ty, ConnectedInit, ConnectedRtr, ConnectedRts,
            connected_init, connected_rtr, connected_rts);
    };
    ($(#[$doc:meta])* $name:ident, $ty:expr, datagram) => {
        transport!(@def $(#[$doc])* $name, $ty, DatagramInit, (), DatagramRts,
            datagram_init, (|_: &()| ModifyAttr::to_state(QpState::Rtr)), datagram_rts);
    };
    (@def $(#[$doc:meta])* $name:ident, $ty:expr, $i:ty, $r:ty, $s:ty, $fi:expr, $fr:expr, $fs:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl Transport for $name {
            const TYPE: QpType = $ty;
            type InitAttr = $i;
            type RtrAttr = $r;
            type RtsAttr = $s;
            fn init_modify(a: &$i) -> ModifyAttr { ($fi)(a) }
            fn rtr_modify(a: &$r) -> ModifyAttr { ($fr)(a) }
            fn rts_modify(a: &$s) -> ModifyAttr { ($fs)(a) }
        }
    };
}

/// Datagram transports: INIT takes a Q_Key, RTR nothing, and [`QueuePair::ready`](super::QueuePair::ready) goes
/// straight from RESET to RTS.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is a connected transport: it sends to its one peer, with no address",
    label = "a datagram QP (`Ud`, `Gsi`, `RawPacket`) is needed here",
    note = "a connected QP posts with `post_send`, or `send_batch().send(..)`"
)]
pub trait Datagram:
    Transport<InitAttr = DatagramInit, RtrAttr = (), RtsAttr = DatagramRts>
{
}

transport!(
    /// Reliable connected.
    Rc, QpType::Rc, connected);
transport!(
    /// Unreliable connected.
    Uc, QpType::Uc, connected);
transport!(
    /// Unreliable datagram.
    Ud, QpType::Ud, datagram);
transport!(
    /// The GSI QP (QP1).
    Gsi, QpType::Gsi, datagram);
transport!(
    /// Raw Ethernet packets.
    RawPacket, QpType::RawPacket, datagram);
impl Datagram for Ud {}
impl Datagram for Gsi {}
impl Datagram for RawPacket {}

/// A queue pair state, at the type level.
pub trait State: sealed::Sealed {
    /// The runtime state.
    const STATE: QpState;
}

macro_rules! states {
    ($($(#[$doc:meta])* $name:ident => $s:expr),*) => { $(
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl State for $name { const STATE: QpState = $s; }
    )* };
}
states!(
    /// RESET.
    Reset => QpState::Reset,
    /// INIT.
    Init => QpState::Init,
    /// Ready to receive.
    Rtr => QpState::Rtr,
    /// Ready to send.
    Rts => QpState::Rts,
    /// ERROR.
    ErrState => QpState::Err
);

/// States in which receives may be posted (INIT, RTR, RTS; and ERROR, where they complete
/// flushed, as libibverbs allows).
#[diagnostic::on_unimplemented(
    message = "post receives only on a queue pair in INIT, RTR or RTS",
    label = "this queue pair is in `{Self}`",
    note = "bring the queue pair to INIT first: `qp.init(&attr)` (datagram QPs: `qp.ready(..)`); in ERROR, receives complete flushed"
)]
pub trait CanRecv: State {}
impl CanRecv for Init {}
impl CanRecv for Rtr {}
impl CanRecv for Rts {}
impl CanRecv for ErrState {}

/// States in which sends may be posted (RTS; and ERROR, where they complete flushed with
/// [`WcStatus::WrFlushErr`](crate::verbs::WcStatus::WrFlushErr) without reaching the device,
/// as libibverbs allows).
#[diagnostic::on_unimplemented(
    message = "post sends only on an RTS queue pair",
    label = "this queue pair is in `{Self}`",
    note = "bring the queue pair to RTS first: `init`, `rtr`, then `rts` (datagram QPs: `ready`); in ERROR, sends complete flushed"
)]
pub trait CanSend: State {}
impl CanSend for Rts {}
impl CanSend for ErrState {}

/// Checks a modify's values against the device's limits before the device sees them.
///
/// `max_rd_atomic` / `max_dest_rd_atomic` are not refused here: as Linux does (ib_core checks
/// neither; its PVRDMA driver accepts any value), the provider clamps a value above what the
/// device can do to what it does, and reports the result in [`QpAttr`].
pub(super) fn validate(caps: &DeviceCaps, m: &ModifyAttr) -> Result<()> {
    let has = |bit: QpAttrMask| m.mask.contains(bit);
    if has(QpAttrMask::PORT) && (m.port == 0 || m.port > caps.phys_port_cnt) {
        return Err(Error::invalid(Param::Port, m.port, caps.phys_port_cnt));
    }
    if has(QpAttrMask::PKEY_INDEX) && m.pkey_index >= caps.max_pkeys {
        let max = caps.max_pkeys.saturating_sub(1);
        return Err(Error::invalid(Param::PkeyIndex, m.pkey_index, max));
    }
    for (bit, param, v) in [
        (QpAttrMask::SQ_PSN, Param::Psn, m.sq_psn),
        (QpAttrMask::RQ_PSN, Param::Psn, m.rq_psn),
        (QpAttrMask::DEST_QPN, Param::QpNumber, m.dest_qpn),
    ] {
        if has(bit) && v > MAX_24BIT {
            return Err(Error::invalid(param, v, MAX_24BIT));
        }
    }
    if let (true, Some(av)) = (has(QpAttrMask::AV), m.av) {
        let max = caps.gid_tbl_len.saturating_sub(1);
        if u32::from(av.sgid_index) > max {
            return Err(Error::invalid(Param::GidIndex, av.sgid_index, max));
        }
        if av.flow_label > 0xF_FFFF {
            return Err(Error::invalid(Param::FlowLabel, av.flow_label, 0xF_FFFFu32));
        }
    }
    Ok(())
}
