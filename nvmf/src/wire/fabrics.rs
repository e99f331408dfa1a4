//! Fabrics commands: Connect (command and its 1024 bytes of data), Property Get and Set
//! (`docs/nvmeof.md`).

use super::{Sqe, fctype, le16, le32, le64, opcode, put16, put32, put64};

/// Bytes of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;
/// Longest NQN (bytes before the terminating NUL in a 256-byte field).
pub const NQN_MAX: usize = 223;
/// The discovery subsystem's NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Controller ID that asks the subsystem to allocate one (admin Connect).
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;

/// Where a Connect's invalid parameter is, for dword 0 of its response with
/// [`Status::CONNECT_INVALID_PARAM`](super::Status::CONNECT_INVALID_PARAM): the byte offset in
/// bits 15:0 (IPO), and bit 16 (IATTR bit 0) set when that offset is in the Connect data, clear
/// when it is in the command. Linux's host prints the field it names ("Connect Invalid Data
/// Parameter, cntlid: 5", "Connect Invalid SQE Parameter, qid 2").
pub mod invalid {
    /// Dword 0 naming byte `offset` of the Connect data.
    pub const fn data(offset: u16) -> u32 {
        (1 << 16) | offset as u32
    }
    /// Dword 0 naming byte `offset` of the Connect command.
    pub const fn sqe(offset: u16) -> u32 {
        offset as u32
    }
    /// The host identifier's offset in the Connect data.
    pub const HOSTID: u16 = 0;
    /// The controller ID's offset in the Connect data.
    pub const CNTLID: u16 = 16;
    /// The subsystem NQN's offset in the Connect data.
    pub const SUBNQN: u16 = 256;
    /// The host NQN's offset in the Connect data.
    pub const HOSTNQN: u16 = 512;
    /// The queue ID's offset in the Connect command.
    pub const QID: u16 = 42;
    /// The submission queue size's offset in the Connect command.
    pub const SQSIZE: u16 = 44;
}

/// The Connect command's fields (SQE bytes 40–51).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Connect {
    /// Record format (0).
    pub recfmt: u16,
    /// Queue ID.
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    /// Connect attributes (bit 2: SQ flow control disabled).
    pub cattr: u8,
    /// Keep-alive timeout in milliseconds (admin queue; 0: none).
    pub kato_ms: u32,
}

impl Connect {
    /// Reads the fields of a Connect SQE.
    pub fn parse(s: &Sqe) -> Connect {
        Connect {
            recfmt: le16(&s.0, 40),
            qid: le16(&s.0, 42),
            sqsize: le16(&s.0, 44),
            cattr: s.0[46],
            kato_ms: le32(&s.0, 48),
        }
    }
    /// A Connect SQE (its SGL still to be set).
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(opcode::FABRICS, cid);
        s.0[4] = fctype::CONNECT;
        put16(&mut s.0, 40, self.recfmt);
        put16(&mut s.0, 42, self.qid);
        put16(&mut s.0, 44, self.sqsize);
        s.0[46] = self.cattr;
        put32(&mut s.0, 48, self.kato_ms);
        s
    }
}

/// An NQN as the wire carries it: up to 223 bytes (plus NUL) in a 256-byte field.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Nqn {
    bytes: [u8; 256],
    len: usize,
}

impl core::fmt::Debug for Nqn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Nqn({:?})", self.as_str())
    }
}

impl Nqn {
    /// An NQN from a string (`None` when longer than 223 bytes, empty or holding a NUL).
    pub fn new(s: &str) -> Option<Nqn> {
        Nqn::from_field(s.as_bytes()).filter(|n| n.len == s.len())
    }
    /// The NQN in a 256-byte field: the bytes up to the first NUL, which must come within the
    /// first 224 bytes; must be non-empty printable ASCII.
    pub fn from_field(b: &[u8]) -> Option<Nqn> {
        let b = &b[..b.len().min(256)];
        let len = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        if len == 0 || len > NQN_MAX || !b[..len].iter().all(|c| (0x20..0x7F).contains(c)) {
            return None;
        }
        let mut bytes = [0u8; 256];
        bytes[..len].copy_from_slice(&b[..len]);
        Some(Nqn { bytes, len })
    }
    /// The NQN.
    pub fn as_str(&self) -> &str {
        // Checked printable ASCII at construction.
        core::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
    }
    /// The 256-byte field (NUL-padded).
    pub fn field(&self) -> &[u8; 256] {
        &self.bytes
    }
}

/// The Connect command's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectData {
    /// Host identifier (UUID).
    pub hostid: [u8; 16],
    /// Controller ID: 0xFFFF on the admin queue, the admin Connect's answer on I/O queues.
    pub cntlid: u16,
    /// The subsystem connected to.
    pub subnqn: Nqn,
    /// The host.
    pub hostnqn: Nqn,
}

impl ConnectData {
    /// Decodes 1024 bytes; `None` when shorter or when an NQN is not valid.
    pub fn parse(b: &[u8]) -> Option<ConnectData> {
        let b = b.get(..CONNECT_DATA_LEN)?;
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&b[..16]);
        Some(ConnectData {
            hostid,
            cntlid: le16(b, 16),
            subnqn: Nqn::from_field(&b[256..512])?,
            hostnqn: Nqn::from_field(&b[512..768])?,
        })
    }
    /// Encodes into `b` (at least 1024 bytes; the rest of the 1024 zeroed).
    pub fn write(&self, b: &mut [u8]) {
        let b = &mut b[..CONNECT_DATA_LEN];
        b.fill(0);
        b[..16].copy_from_slice(&self.hostid);
        put16(b, 16, self.cntlid);
        b[256..512].copy_from_slice(self.subnqn.field());
        b[512..768].copy_from_slice(self.hostnqn.field());
    }
}

/// Property Get / Set fields (SQE bytes 40, 44, 48).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Property {
    /// Size: 0 four bytes, 1 eight bytes (attrib bits 2:0).
    pub size8: bool,
    /// Register offset.
    pub offset: u32,
    /// Value to set (Set only).
    pub value: u64,
}

impl Property {
    /// Reads the fields; `None` when the size code is neither 0 nor 1.
    pub fn parse(s: &Sqe) -> Option<Property> {
        let size = s.0[40] & 7;
        if size > 1 {
            return None;
        }
        Some(Property {
            size8: size == 1,
            offset: le32(&s.0, 44),
            value: le64(&s.0, 48),
        })
    }
    /// A Property Get (`set` false) or Set SQE.
    pub fn to_sqe(&self, cid: u16, set: bool) -> Sqe {
        let mut s = Sqe::new(opcode::FABRICS, cid);
        s.0[4] = if set {
            fctype::PROPERTY_SET
        } else {
            fctype::PROPERTY_GET
        };
        s.0[40] = u8::from(self.size8);
        put32(&mut s.0, 44, self.offset);
        put64(&mut s.0, 48, self.value);
        s
    }
}
