//! The CM messages: each one's fields at the offsets IBTA volume 1 chapter 12 gives and Linux
//! uses (`docs/cm.md` has the tables), read from a checked [`Mad`] and written into a new one;
//! and the rdma_cm header that starts a REQ's or SIDR_REQ's private data.

use super::CmAddr;
use super::mad::{Mad, attr};

/// Private-data bytes of each message.
pub mod pdata {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}

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

/// Private data: up to `N` bytes and how many are meaningful.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Private<const N: usize> {
    /// The bytes (zero past `len`).
    pub bytes: [u8; N],
    /// How many the sender gave (the wire does not say: the whole area for received data).
    pub len: usize,
}

impl<const N: usize> Private<N> {
    /// No private data.
    pub const fn empty() -> Self {
        Private {
            bytes: [0; N],
            len: 0,
        }
    }

    /// The first `N` bytes of `data` (more are cut).
    pub fn from_slice(data: &[u8]) -> Self {
        let mut p = Self::empty();
        let n = data.len().min(N);
        p.bytes[..n].copy_from_slice(&data[..n]);
        p.len = n;
        p
    }

    /// The meaningful bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len.min(N)]
    }

    fn read(m: &Mad, at: usize) -> Self {
        let mut p = Self::empty();
        p.bytes.copy_from_slice(&m.0[at..at + N]);
        p.len = N;
        p
    }
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

/// REQ: the active side asks for a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Req {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The service asked for.
    pub service_id: u64,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// The sender's data QP.
    pub local_qpn: u32,
    /// READs/atomics the sender accepts at once.
    pub responder_resources: u8,
    /// READs/atomics the sender issues at once.
    pub initiator_depth: u8,
    /// How long the receiver may take to answer (4.096 µs · 2^t).
    pub remote_cm_response_timeout: u8,
    /// Transport: 0 RC, 1 UC.
    pub transport: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The PSN the sender expects first: the receiver sends from it.
    pub starting_psn: u32,
    /// How long the sender may take to answer.
    pub local_cm_response_timeout: u8,
    /// Retries on transport timeout.
    pub retry_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// Path MTU, IB code (1 = 256 … 5 = 4096).
    pub mtu: u8,
    /// Retries on receiver-not-ready the receiver is to use.
    pub rnr_retry_count: u8,
    /// How often the sender sends this REQ at most (after the first).
    pub max_cm_retries: u8,
    /// Whether the sender's QP receives from an SRQ.
    pub srq: bool,
    /// The sender's GID.
    pub local_gid: [u8; 16],
    /// The receiver's GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Local ACK timeout code.
    pub local_ack_timeout: u8,
    /// Private data (rdma_cm: its header first).
    pub private: Private<{ pdata::REQ }>,
}

impl Req {
    /// The MAD.
    pub fn encode(&self, tid: u64) -> Mad {
        let mut m = Mad::new(attr::REQ, tid);
        m.put_u32(24, self.local_comm_id);
        m.put_u64(32, self.service_id);
        m.put_u64(40, self.local_ca_guid);
        m.put_u24(56, self.local_qpn);
        m.put_u8(59, self.responder_resources);
        m.put_u8(63, self.initiator_depth);
        m.put_bits(67, 7, 3, self.remote_cm_response_timeout);
        m.put_bits(67, 2, 1, self.transport);
        m.put_bits(67, 0, 0, self.flow_control as u8);
        m.put_u24(68, self.starting_psn);
        m.put_bits(71, 7, 3, self.local_cm_response_timeout);
        m.put_bits(71, 2, 0, self.retry_count);
        m.put_u16(72, self.pkey);
        m.put_bits(74, 7, 4, self.mtu);
        m.put_bits(74, 2, 0, self.rnr_retry_count);
        m.put_bits(75, 7, 4, self.max_cm_retries);
        m.put_bits(75, 3, 3, self.srq as u8);
        // Permissive LIDs: RoCE routes by GID.
        m.put_u16(76, 0xFFFF);
        m.put_u16(78, 0xFFFF);
        m.put_bytes(80, &self.local_gid);
        m.put_bytes(96, &self.remote_gid);
        m.put_u32(112, (self.flow_label & 0xF_FFFF) << 12);
        m.put_u8(116, self.traffic_class);
        m.put_u8(117, self.hop_limit);
        m.put_bits(119, 7, 3, self.local_ack_timeout);
        m.put_bytes(164, &self.private.bytes);
        m
    }

    /// Reads a REQ.
    pub fn decode(m: &Mad) -> Req {
        Req {
            local_comm_id: m.u32(24),
            service_id: m.u64(32),
            local_ca_guid: m.u64(40),
            local_qpn: m.u24(56),
            responder_resources: m.u8(59),
            initiator_depth: m.u8(63),
            remote_cm_response_timeout: m.bits(67, 7, 3),
            transport: m.bits(67, 2, 1),
            flow_control: m.bits(67, 0, 0) != 0,
            starting_psn: m.u24(68),
            local_cm_response_timeout: m.bits(71, 7, 3),
            retry_count: m.bits(71, 2, 0),
            pkey: m.u16(72),
            mtu: m.bits(74, 7, 4),
            rnr_retry_count: m.bits(74, 2, 0),
            max_cm_retries: m.bits(75, 7, 4),
            srq: m.bits(75, 3, 3) != 0,
            local_gid: m.gid(80),
            remote_gid: m.gid(96),
            flow_label: m.u32(112) >> 12,
            traffic_class: m.u8(116),
            hop_limit: m.u8(117),
            local_ack_timeout: m.bits(119, 7, 3),
            private: Private::read(m, 164),
        }
    }
}

/// REP: the passive side accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The REQ's sender's.
    pub remote_comm_id: u32,
    /// The sender's data QP.
    pub local_qpn: u32,
    /// The PSN the sender expects first.
    pub starting_psn: u32,
    /// READs/atomics the sender accepts at once.
    pub responder_resources: u8,
    /// READs/atomics the sender issues at once.
    pub initiator_depth: u8,
    /// The sender's ACK delay code.
    pub target_ack_delay: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Retries on receiver-not-ready the REQ's sender is to use.
    pub rnr_retry_count: u8,
    /// Whether the sender's QP receives from an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private: Private<{ pdata::REP }>,
}

impl Rep {
    /// The MAD.
    pub fn encode(&self, tid: u64) -> Mad {
        let mut m = Mad::new(attr::REP, tid);
        m.put_u32(24, self.local_comm_id);
        m.put_u32(28, self.remote_comm_id);
        m.put_u24(36, self.local_qpn);
        m.put_u24(44, self.starting_psn);
        m.put_u8(48, self.responder_resources);
        m.put_u8(49, self.initiator_depth);
        m.put_bits(50, 7, 3, self.target_ack_delay);
        m.put_bits(50, 0, 0, self.flow_control as u8);
        m.put_bits(51, 7, 5, self.rnr_retry_count);
        m.put_bits(51, 4, 4, self.srq as u8);
        m.put_u64(52, self.local_ca_guid);
        m.put_bytes(60, &self.private.bytes);
        m
    }

    /// Reads a REP.
    pub fn decode(m: &Mad) -> Rep {
        Rep {
            local_comm_id: m.u32(24),
            remote_comm_id: m.u32(28),
            local_qpn: m.u24(36),
            starting_psn: m.u24(44),
            responder_resources: m.u8(48),
            initiator_depth: m.u8(49),
            target_ack_delay: m.bits(50, 7, 3),
            flow_control: m.bits(50, 0, 0) != 0,
            rnr_retry_count: m.bits(51, 7, 5),
            srq: m.bits(51, 4, 4) != 0,
            local_ca_guid: m.u64(52),
            private: Private::read(m, 60),
        }
    }
}

/// The two communication IDs that start RTU, DREQ, DREP, MRA and REJ, and their private
/// data's offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ids {
    /// The sender's communication ID.
    pub local: u32,
    /// The receiver's.
    pub remote: u32,
}

impl Ids {
    /// Reads them.
    pub fn decode(m: &Mad) -> Ids {
        Ids {
            local: m.u32(24),
            remote: m.u32(28),
        }
    }

    fn put(&self, m: &mut Mad) {
        m.put_u32(24, self.local);
        m.put_u32(28, self.remote);
    }
}

/// RTU (ready to use), DREP: the IDs and private data at 32.
pub fn encode_simple(a: u16, ids: Ids, private: &[u8], tid: u64) -> Mad {
    let mut m = Mad::new(a, tid);
    ids.put(&mut m);
    let n = private.len().min(pdata::RTU);
    m.put_bytes(32, &private[..n]);
    m
}

/// Which message a REJ or MRA is about.
pub mod about {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// Another message.
    pub const OTHER: u8 = 2;
}

/// REJ reasons (the ones this CM sends, and `TIMEOUT`, which it reads specially).
pub mod reason {
    /// No resources.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout.
    pub const TIMEOUT: u16 = 4;
    /// Invalid service ID: nobody listens.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport type.
    pub const INVALID_TRANSPORT: u16 = 9;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// Consumer defined (rdma_cm's reject, and its refusals).
    pub const CONSUMER: u16 = 28;
}

/// REJ: a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rej {
    /// The IDs (the sender's local ID 0 when it never assigned one).
    pub ids: Ids,
    /// Which message is rejected ([`about`]).
    pub rejected: u8,
    /// Additional rejection information length.
    pub ari_len: u8,
    /// The reason ([`reason`]).
    pub reason: u16,
    /// Private data.
    pub private: Private<{ pdata::REJ }>,
}

impl Rej {
    /// The MAD.
    pub fn encode(&self, tid: u64) -> Mad {
        let mut m = Mad::new(attr::REJ, tid);
        self.ids.put(&mut m);
        m.put_bits(32, 7, 6, self.rejected);
        m.put_bits(33, 7, 1, self.ari_len);
        m.put_u16(34, self.reason);
        m.put_bytes(108, &self.private.bytes);
        m
    }

    /// The MAD, with `ari` (at most 72 bytes) as its additional rejection information.
    pub fn encode_with_ari(&self, tid: u64, ari: &[u8]) -> Mad {
        let mut m = self.encode(tid);
        let n = ari.len().min(72);
        m.put_bytes(36, &ari[..n]);
        m.put_bits(33, 7, 1, n as u8);
        m
    }

    /// The first 8 bytes of a REJ's additional rejection information: the sender's CA GUID
    /// in a REJ "timeout".
    pub fn ari_guid(m: &Mad) -> u64 {
        m.u64(36)
    }

    /// Reads a REJ.
    pub fn decode(m: &Mad) -> Rej {
        Rej {
            ids: Ids::decode(m),
            rejected: m.bits(32, 7, 6),
            ari_len: m.bits(33, 7, 1),
            reason: m.u16(34),
            private: Private::read(m, 108),
        }
    }
}

/// MRA: "received, answer later".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mra {
    /// The IDs.
    pub ids: Ids,
    /// Which message ([`about`]).
    pub mraed: u8,
    /// How long the answer may take (4.096 µs · 2^t).
    pub service_timeout: u8,
}

impl Mra {
    /// The MAD.
    pub fn encode(&self, tid: u64) -> Mad {
        let mut m = Mad::new(attr::MRA, tid);
        self.ids.put(&mut m);
        m.put_bits(32, 7, 6, self.mraed);
        m.put_bits(33, 7, 3, self.service_timeout);
        m
    }

    /// Reads an MRA.
    pub fn decode(m: &Mad) -> Mra {
        Mra {
            ids: Ids::decode(m),
            mraed: m.bits(32, 7, 6),
            service_timeout: m.bits(33, 7, 3),
        }
    }
}

/// DREQ: the IDs and the receiver's QP number.
pub fn encode_dreq(ids: Ids, remote_qpn: u32, tid: u64) -> Mad {
    let mut m = Mad::new(attr::DREQ, tid);
    ids.put(&mut m);
    m.put_u24(32, remote_qpn);
    m
}

/// The QP number a DREQ names (the receiver's own).
pub fn dreq_remote_qpn(m: &Mad) -> u32 {
    m.u24(32)
}

/// SIDR_REQ: which UD service serves a service ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrReq {
    /// The sender's request ID.
    pub request_id: u32,
    /// P_Key.
    pub pkey: u16,
    /// The service.
    pub service_id: u64,
    /// Private data (rdma_cm: its header first).
    pub private: Private<{ pdata::SIDR_REQ }>,
}

impl SidrReq {
    /// The MAD.
    pub fn encode(&self, tid: u64) -> Mad {
        let mut m = Mad::new(attr::SIDR_REQ, tid);
        m.put_u32(24, self.request_id);
        m.put_u16(28, self.pkey);
        m.put_u64(32, self.service_id);
        m.put_bytes(40, &self.private.bytes);
        m
    }

    /// Reads a SIDR_REQ.
    pub fn decode(m: &Mad) -> SidrReq {
        SidrReq {
            request_id: m.u32(24),
            pkey: m.u16(28),
            service_id: m.u64(32),
            private: Private::read(m, 40),
        }
    }
}

/// SIDR_REP statuses.
pub mod sidr_status {
    /// The service is there: QPN and Q_Key given.
    pub const OK: u8 = 0;
    /// No such service.
    pub const UNSUPPORTED_SID: u8 = 1;
    /// Refused.
    pub const REJECT: u8 = 2;
}

/// SIDR_REP: the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidrRep {
    /// The request ID of the SIDR_REQ.
    pub request_id: u32,
    /// [`sidr_status`].
    pub status: u8,
    /// The service's QP.
    pub qpn: u32,
    /// The service ID.
    pub service_id: u64,
    /// The service's Q_Key.
    pub qkey: u32,
    /// Private data.
    pub private: Private<{ pdata::SIDR_REP }>,
}

impl SidrRep {
    /// The MAD.
    pub fn encode(&self, tid: u64) -> Mad {
        let mut m = Mad::new(attr::SIDR_REP, tid);
        m.put_u32(24, self.request_id);
        m.put_u8(28, self.status);
        m.put_u24(32, self.qpn);
        m.put_u64(36, self.service_id);
        m.put_u32(44, self.qkey);
        m.put_bytes(120, &self.private.bytes);
        m
    }

    /// Reads a SIDR_REP.
    pub fn decode(m: &Mad) -> SidrRep {
        SidrRep {
            request_id: m.u32(24),
            status: m.u8(28),
            qpn: m.u24(32),
            service_id: m.u64(36),
            qkey: m.u32(44),
            private: Private::read(m, 120),
        }
    }
}

#[cfg(test)]
#[path = "msg_tests.rs"]
mod tests;
