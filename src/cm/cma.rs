//! rdma_cm's layer over the CM: its port spaces and service IDs, and the header that starts a
//! REQ's or SIDR_REQ's private data (source port and both addresses, IP version 4 or 6), read
//! with its checks and written as Linux writes it (`docs/cm.md`).

use super::CmAddr;

/// rdma_cm's port space of RC connections (`RDMA_PS_TCP`).
pub const PS_TCP: u16 = 0x0106;
/// rdma_cm's port space of UD services (`RDMA_PS_UDP`).
pub const PS_UDP: u16 = 0x0111;
/// The Q_Key rdma_cm gives UD services (`RDMA_UDP_QKEY`).
pub const UDP_QKEY: u32 = 0x0123_4567;
/// Bytes of the rdma_cm header at the start of REQ and SIDR_REQ private data.
pub const CMA_HDR: usize = 36;

/// The service ID rdma_cm gives port `port` of port space `ps`.
pub fn service_id(ps: u16, port: u16) -> u64 {
    (u64::from(ps) << 16) | u64::from(port)
}

/// The rdma_cm header (version 0, IPv4): the active side's source port and both addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmaHeader {
    /// The active side's rdma_cm port.
    pub src_port: u16,
    /// The active side's IPv4 address.
    pub src_ip: [u8; 4],
    /// The address the active side connects to.
    pub dst_ip: [u8; 4],
}

impl CmaHeader {
    /// The 36 bytes: version 0, IP version 4 in the high nibble, the port, then each address
    /// as 12 zero bytes and the IPv4 address.
    pub fn to_bytes(&self) -> [u8; CMA_HDR] {
        let mut b = [0u8; CMA_HDR];
        b[1] = 0x40;
        b[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        b[16..20].copy_from_slice(&self.src_ip);
        b[32..36].copy_from_slice(&self.dst_ip);
        b
    }

    /// Reads the header; `None` for another version, IPv6, or a short area.
    pub fn parse(b: &[u8]) -> Option<CmaHeader> {
        let b = b.get(..CMA_HDR)?;
        if b[0] != 0 || b[1] >> 4 != 4 {
            return None;
        }
        let ip = |at: usize| [b[at], b[at + 1], b[at + 2], b[at + 3]];
        Some(CmaHeader {
            src_port: u16::from_be_bytes([b[2], b[3]]),
            src_ip: ip(16),
            dst_ip: ip(32),
        })
    }
}

/// The rdma_cm header over IPv6 (version 0, IP version 6): the active side's source port
/// and both IPv6 addresses, each the whole 16 bytes of its field (`docs/cm.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmaHeader6 {
    /// The active side's rdma_cm port.
    pub src_port: u16,
    /// The active side's IPv6 address.
    pub src_ip: [u8; 16],
    /// The address the active side connects to.
    pub dst_ip: [u8; 16],
}

impl CmaHeader6 {
    /// The 36 bytes: version 0, IP version 6 in the high nibble, the port, the addresses.
    pub fn to_bytes(&self) -> [u8; CMA_HDR] {
        let mut b = [0u8; CMA_HDR];
        b[1] = 0x60;
        b[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        b[4..20].copy_from_slice(&self.src_ip);
        b[20..36].copy_from_slice(&self.dst_ip);
        b
    }

    /// Reads the header; `None` for another version, IPv4, or a short area.
    pub fn parse(b: &[u8]) -> Option<CmaHeader6> {
        let b = b.get(..CMA_HDR)?;
        if b[0] != 0 || b[1] >> 4 != 6 {
            return None;
        }
        let mut h = CmaHeader6 {
            src_port: u16::from_be_bytes([b[2], b[3]]),
            src_ip: [0; 16],
            dst_ip: [0; 16],
        };
        h.src_ip.copy_from_slice(&b[4..20]);
        h.dst_ip.copy_from_slice(&b[20..36]);
        Some(h)
    }
}

/// Why an rdma_cm header was not read ([`CmaAddrs::parse`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmaHeaderError {
    /// The private data is shorter than the header's 36 bytes.
    Short,
    /// The header's version is not 0 (the value).
    Version(u8),
    /// The IP version is neither 4 nor 6 (the value).
    IpVersion(u8),
    /// An IPv6 header whose addresses are unspecified or multicast, which no station has.
    NoStation,
}

impl core::fmt::Display for CmaHeaderError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CmaHeaderError::Short => f.write_str("rdma_cm header: short"),
            CmaHeaderError::Version(v) => write!(f, "rdma_cm header: version {v}"),
            CmaHeaderError::IpVersion(v) => write!(f, "rdma_cm header: IP version {v}"),
            CmaHeaderError::NoStation => f.write_str("rdma_cm header: no station's address"),
        }
    }
}

/// The rdma_cm header of either IP version, its addresses as [`CmAddr`]s (an IPv4-mapped
/// address in an IPv6 header is the IPv4 address, as RoCEv2 carries it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmaAddrs {
    /// The active side's rdma_cm port.
    pub src_port: u16,
    /// The active side's address.
    pub src: CmAddr,
    /// The address the active side connects to.
    pub dst: CmAddr,
}

impl CmaAddrs {
    /// Reads the header of either IP version.
    ///
    /// # Errors
    ///
    /// [`CmaHeaderError`]: short, another version, another IP version, or IPv6 addresses
    /// of no station.
    pub fn parse(b: &[u8]) -> Result<CmaAddrs, CmaHeaderError> {
        let b = b.get(..CMA_HDR).ok_or(CmaHeaderError::Short)?;
        if b[0] != 0 {
            return Err(CmaHeaderError::Version(b[0]));
        }
        if let Some(h) = CmaHeader::parse(b) {
            return Ok(CmaAddrs {
                src_port: h.src_port,
                src: h.src_ip.into(),
                dst: h.dst_ip.into(),
            });
        }
        let h = CmaHeader6::parse(b).ok_or(CmaHeaderError::IpVersion(b[1] >> 4))?;
        let nobody = |a: &[u8; 16]| *a == [0; 16] || a[0] == 0xFF;
        if nobody(&h.src_ip) || nobody(&h.dst_ip) {
            return Err(CmaHeaderError::NoStation);
        }
        Ok(CmaAddrs {
            src_port: h.src_port,
            src: h.src_ip.into(),
            dst: h.dst_ip.into(),
        })
    }
}

/// The rdma_cm header of a request from `src` to `dst` at rdma_cm port `src_port`: of IP
/// version 4 when `dst` is IPv4 (then `src` is too: this side's address of that family),
/// else of IP version 6, as Linux writes it for each family.
pub fn cma_header(src_port: u16, src: CmAddr, dst: CmAddr) -> [u8; CMA_HDR] {
    match (src.ipv4(), dst.ipv4()) {
        (Some(src_ip), Some(dst_ip)) => CmaHeader {
            src_port,
            src_ip,
            dst_ip,
        }
        .to_bytes(),
        _ => CmaHeader6 {
            src_port,
            src_ip: src.gid().0,
            dst_ip: dst.gid().0,
        }
        .to_bytes(),
    }
}
