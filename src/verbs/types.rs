//! Device-agnostic verbs values: GIDs, device capabilities, port attributes.

/// A 128-bit global identifier (an IPv6 address for RoCE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The link-local IPv6 address (fe80::/64 with the modified EUI-64 interface identifier)
    /// of an Ethernet MAC: the GID a RoCE port has for its own MAC.
    pub fn link_local_from_mac(mac: [u8; 6]) -> Gid {
        let mut g = [0u8; 16];
        g[0] = 0xFE;
        g[1] = 0x80;
        g[8] = mac[0] ^ 0x02;
        g[9] = mac[1];
        g[10] = mac[2];
        g[11] = 0xFF;
        g[12] = 0xFE;
        g[13] = mac[3];
        g[14] = mac[4];
        g[15] = mac[5];
        Gid(g)
    }

    /// The IPv4-mapped IPv6 address `::ffff:a.b.c.d` (a RoCE GID for an IPv4 address).
    pub fn from_ipv4(ip: [u8; 4]) -> Gid {
        let mut g = [0u8; 16];
        g[10] = 0xFF;
        g[11] = 0xFF;
        g[12..].copy_from_slice(&ip);
        Gid(g)
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), or `None` for any other.
    pub fn ipv4(&self) -> Option<[u8; 4]> {
        let g = &self.0;
        (g[..10] == [0; 10] && g[10..12] == [0xFF, 0xFF]).then(|| [g[12], g[13], g[14], g[15]])
    }
}

/// Device capabilities, as `ibv_query_device` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceCaps {
    /// Firmware version.
    pub fw_ver: u64,
    /// Node GUID (in network byte order, as the wire carries it).
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Largest memory region, bytes.
    pub max_mr_size: u64,
    /// PCI device ID the device reports as its part ID (0 if it does not say).
    pub vendor_part_id: u32,
    /// Queue pairs.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Completion queues.
    pub max_cq: u32,
    /// Entries per completion queue.
    pub max_cqe: u32,
    /// Memory regions.
    pub max_mr: u32,
    /// Protection domains.
    pub max_pd: u32,
    /// Outstanding RDMA reads/atomics a QP may receive.
    pub max_qp_rd_atom: u32,
    /// Outstanding RDMA reads/atomics a QP may initiate.
    pub max_qp_init_rd_atom: u32,
    /// Multicast groups (0: no multicast).
    pub max_mcast_grp: u32,
    /// Address handles.
    pub max_ah: u32,
    /// Shared receive queues.
    pub max_srq: u32,
    /// Work requests per shared receive queue.
    pub max_srq_wr: u32,
    /// Scatter/gather entries per shared receive queue work request.
    pub max_srq_sge: u32,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// P_Key table length.
    pub max_pkeys: u16,
    /// Physical ports.
    pub phys_port_cnt: u8,
    /// Device capability flags (`IBV_DEVICE_*` bits, as the device reports them).
    pub device_cap_flags: u32,
    /// Atomic operations the device supports (0: none).
    pub atomic_ops: u8,
    /// The IEEE vendor id (`vendor_id`).
    pub vendor_id: u32,
    /// The page sizes the device maps, one bit per size (`page_size_cap`: bit 12 = 4 KiB).
    pub page_size_cap: u64,
    /// Scatter/gather entries of an RDMA READ's local buffer, at most (`max_sge_rd`).
    pub max_sge_rd: u32,
}

/// The link layer of a port (`IBV_LINK_LAYER_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkLayer {
    /// Not reported (`IBV_LINK_LAYER_UNSPECIFIED`).
    Unspecified = 0,
    /// InfiniBand.
    InfiniBand = 1,
    /// Ethernet (RoCE).
    Ethernet = 2,
}

/// Logical port state (`enum ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PortState {
    /// No state change.
    Nop = 0,
    /// Down.
    Down = 1,
    /// Initializing.
    Init = 2,
    /// Armed.
    Armed = 3,
    /// Active: can carry traffic.
    Active = 4,
    /// Active, deferred.
    ActiveDefer = 5,
}

/// Path MTU (`enum ibv_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        128 << self as u32
    }

    /// From `enum ibv_mtu` numbering; `None` outside it.
    pub fn from_raw(raw: u32) -> Option<Mtu> {
        Some(match raw {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

impl PortState {
    /// From `enum ibv_port_state` numbering; `None` outside it.
    pub fn from_raw(raw: u32) -> Option<PortState> {
        Some(match raw {
            0 => PortState::Nop,
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            _ => return None,
        })
    }
}

/// Port attributes, as `ibv_query_port` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Capability flags.
    pub port_cap_flags: u32,
    /// Largest message, bytes.
    pub max_msg_sz: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// Active link width (1 = 1X).
    pub active_width: u8,
    /// Active link speed (1 = SDR).
    pub active_speed: u8,
    /// Physical state.
    pub phys_state: u8,
    /// The link layer: Ethernet for RoCE devices.
    pub link_layer: LinkLayer,
}

/// The type of a GID entry (`enum ibv_gid_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GidType {
    /// An InfiniBand GID.
    Ib,
    /// RoCE version 1 (Ethernet, the GRH's EtherType).
    RoceV1,
    /// RoCE version 2 (UDP/IP).
    #[default]
    RoceV2,
}
