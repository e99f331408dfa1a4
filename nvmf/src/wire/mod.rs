//! NVMe structures as NVMe/RDMA carries them: the 64-byte submission queue entry (SQE), the
//! 16-byte completion queue entry (CQE), SGL descriptors and statuses. Everything is
//! little-endian (`docs/nvmeof.md`). Parsing is bounded: every reader checks the length first,
//! and every field from the network is validated before it is used.

pub mod ana;
pub mod cm;
pub mod fabrics;
pub mod identify;

/// Bytes of a submission queue entry (a command capsule without in-capsule data).
pub const SQE_LEN: usize = 64;
/// Bytes of a completion queue entry (a response capsule).
pub const CQE_LEN: usize = 16;

pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    u64::from(le32(b, at)) | (u64::from(le32(b, at + 4)) << 32)
}
pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Command opcodes (admin, fabrics and NVM command sets).
pub mod opcode {
    /// Admin: Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Admin: Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Admin: Abort.
    pub const ABORT: u8 = 0x08;
    /// Admin: Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Admin: Get Features.
    pub const GET_FEATURES: u8 = 0x0A;
    /// Admin: Asynchronous Event Request.
    pub const ASYNC_EVENT: u8 = 0x0C;
    /// Admin: Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
    /// Fabrics commands (the type is in byte 4).
    pub const FABRICS: u8 = 0x7F;
    /// NVM: Flush.
    pub const FLUSH: u8 = 0x00;
    /// NVM: Write.
    pub const WRITE: u8 = 0x01;
    /// NVM: Read.
    pub const READ: u8 = 0x02;
    /// NVM: Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
}

/// Fabrics command types (SQE byte 4 of opcode 0x7F).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
}

/// A completion status: the 15-bit field of the CQE (status code type in bits 10:8, status
/// code in 7:0, Do Not Retry in bit 14), without the phase bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Status(pub u16);

impl Status {
    /// Success.
    pub const SUCCESS: Status = Status(0);
    /// Do Not Retry, to OR into an error.
    pub const DNR: u16 = 0x4000;
    /// Invalid command opcode.
    pub const INVALID_OPCODE: Status = Status(0x001 | Self::DNR);
    /// Invalid field in command.
    pub const INVALID_FIELD: Status = Status(0x002 | Self::DNR);
    /// Data transfer error.
    pub const DATA_TRANSFER_ERROR: Status = Status(0x004);
    /// Internal error.
    pub const INTERNAL: Status = Status(0x006);
    /// Internal error, do not retry: what a held Asynchronous Event Request is answered when
    /// its controller is reset (as nvmet answers the ones it holds when their queue ends).
    pub const INTERNAL_DNR: Status = Status(0x006 | Self::DNR);
    /// Invalid namespace or format.
    pub const INVALID_NS: Status = Status(0x00B | Self::DNR);
    /// Command sequence error.
    pub const SEQUENCE_ERROR: Status = Status(0x00C | Self::DNR);
    /// Data SGL length invalid.
    pub const SGL_LENGTH_INVALID: Status = Status(0x00F | Self::DNR);
    /// Invalid number of SGL descriptors (a descriptor list of no descriptor, of a part of
    /// one, or of more than MSDBD).
    pub const SGL_COUNT_INVALID: Status = Status(0x00E | Self::DNR);
    /// SGL descriptor type invalid.
    pub const SGL_TYPE_INVALID: Status = Status(0x011 | Self::DNR);
    /// SGL offset invalid.
    pub const SGL_OFFSET_INVALID: Status = Status(0x016 | Self::DNR);
    /// LBA out of range.
    pub const LBA_RANGE: Status = Status(0x080 | Self::DNR);
    /// Asynchronous event request limit exceeded (command specific).
    pub const AER_LIMIT: Status = Status(0x105 | Self::DNR);
    /// Invalid log page (command specific).
    pub const INVALID_LOG_PAGE: Status = Status(0x109 | Self::DNR);
    /// Feature identifier not saveable (command specific).
    pub const FEATURE_NOT_SAVEABLE: Status = Status(0x10D | Self::DNR);
    /// Connect: incompatible format.
    pub const CONNECT_FORMAT: Status = Status(0x180 | Self::DNR);
    /// Connect: controller busy.
    pub const CONNECT_BUSY: Status = Status(0x181);
    /// Connect: invalid parameters.
    pub const CONNECT_INVALID_PARAM: Status = Status(0x182 | Self::DNR);
    /// Connect: invalid host.
    pub const CONNECT_INVALID_HOST: Status = Status(0x184 | Self::DNR);
    /// Unrecovered read error (media errors, code 81h): the device behind a namespace failed
    /// a read (the host may retry).
    pub const MEDIA_ERROR: Status = Status(0x281);
    /// Write fault (media errors, code 80h), do not retry: the device behind a namespace
    /// failed a write or a flush. What its cache held may be lost, so a retry that succeeds
    /// must not hide it from the host.
    pub const WRITE_FAULT: Status = Status(0x280 | Self::DNR);
    /// Asymmetric Access Inaccessible (path related, code 02h), retryable: the namespace's
    /// ANA group is inaccessible through this controller; a multipath host sends the
    /// command down another path.
    pub const ANA_INACCESSIBLE: Status = Status(0x302);
    /// Asymmetric Access Persistent Loss (path related, code 01h).
    pub const ANA_PERSISTENT_LOSS: Status = Status(0x301);
    /// Asymmetric Access Transition (path related, code 03h).
    pub const ANA_TRANSITION: Status = Status(0x303);

    /// Whether this is success.
    pub fn is_ok(self) -> bool {
        self.0 & 0x7FF == 0
    }
    /// The status code type (bits 10:8) and code (7:0), without DNR, More and CRD.
    pub fn code(self) -> u16 {
        self.0 & 0x7FF
    }
    /// Whether Do Not Retry is set.
    pub fn dnr(self) -> bool {
        self.0 & Self::DNR != 0
    }
}

/// A submission queue entry (64 bytes), read-only view with typed accessors.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_LEN]);

impl core::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "Sqe(op {:#04x}, cid {}, nsid {})",
            self.opcode(),
            self.cid(),
            self.nsid()
        )
    }
}

impl Default for Sqe {
    fn default() -> Self {
        Sqe([0; SQE_LEN])
    }
}

impl Sqe {
    /// The first 64 bytes of `b`, or `None` when it is shorter.
    pub fn parse(b: &[u8]) -> Option<Sqe> {
        let mut s = [0u8; SQE_LEN];
        s.copy_from_slice(b.get(..SQE_LEN)?);
        Some(Sqe(s))
    }
    /// A command with `opcode` and `cid`, PSDT = SGL (byte 1 = 0x40), a null SGL.
    pub fn new(opcode: u8, cid: u16) -> Sqe {
        let mut s = Sqe::default();
        s.0[0] = opcode;
        s.0[1] = 0x40;
        put16(&mut s.0, 2, cid);
        s.set_sgl(&Sgl::Null);
        s
    }
    /// Opcode (byte 0).
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    /// Flags (byte 1): fused bits 1:0, PSDT bits 7:6.
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    /// Command identifier (bytes 2–3).
    pub fn cid(&self) -> u16 {
        le16(&self.0, 2)
    }
    /// Sets the command identifier.
    pub fn set_cid(&mut self, cid: u16) {
        put16(&mut self.0, 2, cid);
    }
    /// Namespace ID (bytes 4–7).
    pub fn nsid(&self) -> u32 {
        le32(&self.0, 4)
    }
    /// Sets the namespace ID.
    pub fn set_nsid(&mut self, nsid: u32) {
        put32(&mut self.0, 4, nsid);
    }
    /// Fabrics command type (byte 4 of a 0x7F command).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }
    /// Command dword `n` (10..=15).
    pub fn cdw(&self, n: usize) -> u32 {
        le32(&self.0, 40 + (n.clamp(10, 15) - 10) * 4)
    }
    /// Sets command dword `n` (10..=15).
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        put32(&mut self.0, 40 + (n.clamp(10, 15) - 10) * 4, v);
    }
    /// The raw SGL descriptor (bytes 24–39).
    pub fn sgl_bytes(&self) -> [u8; 16] {
        let mut d = [0u8; 16];
        d.copy_from_slice(&self.0[24..40]);
        d
    }
    /// The data pointer, decoded.
    pub fn sgl(&self) -> Result<Sgl, Status> {
        Sgl::parse(&self.sgl_bytes())
    }
    /// Writes the data pointer.
    pub fn set_sgl(&mut self, sgl: &Sgl) {
        self.0[24..40].copy_from_slice(&sgl.to_bytes());
    }
    /// Read/Write/Write Zeroes: the starting LBA (cdw10–11).
    pub fn slba(&self) -> u64 {
        le64(&self.0, 40)
    }
    /// Read/Write/Write Zeroes: blocks, 1-based (cdw12 bits 15:0 plus one).
    pub fn nlb(&self) -> u32 {
        u32::from(le16(&self.0, 48)) + 1
    }
    /// A Read or Write (or Write Zeroes) of `blocks` (1..=65536) from `slba`.
    pub fn rw(opcode: u8, cid: u16, nsid: u32, slba: u64, blocks: u32) -> Sqe {
        let mut s = Sqe::new(opcode, cid);
        s.set_nsid(nsid);
        put64(&mut s.0, 40, slba);
        put16(&mut s.0, 48, blocks.clamp(1, 65536).wrapping_sub(1) as u16);
        s
    }
}

/// A completion queue entry (16 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    /// Command-specific result (dwords 0–1).
    pub result: u64,
    /// Submission queue head pointer.
    pub sq_head: u16,
    /// Submission queue identifier.
    pub sq_id: u16,
    /// The command identifier it completes.
    pub cid: u16,
    /// The status (phase bit not included).
    pub status: Status,
}

impl Cqe {
    /// Encodes (status shifted left by one over the phase bit, which is 0 on fabrics).
    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        put64(&mut b, 0, self.result);
        put16(&mut b, 8, self.sq_head);
        put16(&mut b, 10, self.sq_id);
        put16(&mut b, 12, self.cid);
        put16(&mut b, 14, self.status.0 << 1);
        b
    }
    /// Decodes exactly 16 bytes.
    pub fn parse(b: &[u8]) -> Option<Cqe> {
        if b.len() != CQE_LEN {
            return None;
        }
        Some(Cqe {
            result: le64(b, 0),
            sq_head: le16(b, 8),
            sq_id: le16(b, 10),
            cid: le16(b, 12),
            status: Status(le16(b, 14) >> 1),
        })
    }
}

/// An SGL descriptor as NVMe/RDMA uses them (one per command).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sgl {
    /// No data (a keyed data block of length 0, or all zero).
    Null,
    /// Keyed SGL data block: the host's memory at `addr`, `len` bytes (24 bits), R_Key `key`;
    /// `invalidate` when the host asks for the key to be invalidated (subtype 0xF).
    Keyed {
        /// Remote virtual address.
        addr: u64,
        /// Bytes (at most 2^24 − 1).
        len: u32,
        /// Remote key.
        key: u32,
        /// Subtype 0xF: invalidate the key with the response.
        invalidate: bool,
    },
    /// Data block with an offset into the in-capsule data.
    InCapsule {
        /// Offset from the start of the in-capsule data.
        offset: u64,
        /// Bytes.
        len: u32,
    },
    /// Last Segment with an offset: a list of descriptors (16 bytes each) in the in-capsule
    /// data, the command's data described by them in order.
    LastSegment {
        /// Offset of the list from the start of the in-capsule data.
        offset: u64,
        /// Bytes of the list.
        len: u32,
    },
}

/// SGL identifiers (byte 15 of a descriptor): type in bits 7:4, subtype in 3:0.
pub mod sgl_id {
    /// Keyed data block, address.
    pub const KEYED: u8 = 0x40;
    /// Keyed data block, address, invalidate the key.
    pub const KEYED_INVALIDATE: u8 = 0x4F;
    /// Data block, offset (in-capsule data).
    pub const OFFSET: u8 = 0x01;
    /// Last Segment, offset (a descriptor list in the in-capsule data).
    pub const LAST_SEGMENT_OFFSET: u8 = 0x31;
}

impl Sgl {
    /// Decodes a descriptor: keyed (0x40, 0x4F), data block with offset (0x01) or Last
    /// Segment with offset (0x31); anything else is [`Status::SGL_TYPE_INVALID`].
    pub fn parse(d: &[u8; 16]) -> Result<Sgl, Status> {
        match d[15] {
            sgl_id::KEYED | sgl_id::KEYED_INVALIDATE => {
                let len = u32::from_le_bytes([d[8], d[9], d[10], 0]);
                if len == 0 {
                    return Ok(Sgl::Null);
                }
                Ok(Sgl::Keyed {
                    addr: le64(d, 0),
                    len,
                    key: le32(d, 11),
                    invalidate: d[15] == sgl_id::KEYED_INVALIDATE,
                })
            }
            sgl_id::OFFSET => Ok(Sgl::InCapsule {
                offset: le64(d, 0),
                len: le32(d, 8),
            }),
            sgl_id::LAST_SEGMENT_OFFSET => Ok(Sgl::LastSegment {
                offset: le64(d, 0),
                len: le32(d, 8),
            }),
            _ => Err(Status::SGL_TYPE_INVALID),
        }
    }
    /// Encodes (a keyed length is cut to 24 bits).
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut d = [0u8; 16];
        match *self {
            Sgl::Null => d[15] = sgl_id::KEYED,
            Sgl::Keyed {
                addr,
                len,
                key,
                invalidate,
            } => {
                put64(&mut d, 0, addr);
                d[8..11].copy_from_slice(&len.to_le_bytes()[..3]);
                put32(&mut d, 11, key);
                d[15] = if invalidate {
                    sgl_id::KEYED_INVALIDATE
                } else {
                    sgl_id::KEYED
                };
            }
            Sgl::InCapsule { offset, len } => {
                put64(&mut d, 0, offset);
                put32(&mut d, 8, len);
                d[15] = sgl_id::OFFSET;
            }
            Sgl::LastSegment { offset, len } => {
                put64(&mut d, 0, offset);
                put32(&mut d, 8, len);
                d[15] = sgl_id::LAST_SEGMENT_OFFSET;
            }
        }
        d
    }
    /// Bytes described (of a Last Segment: the bytes of its descriptor list).
    pub fn len(&self) -> u32 {
        match *self {
            Sgl::Null => 0,
            Sgl::Keyed { len, .. } | Sgl::InCapsule { len, .. } | Sgl::LastSegment { len, .. } => {
                len
            }
        }
    }
    /// Whether it describes no data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Controller property offsets (fabrics Property Get/Set).
pub mod prop {
    /// Controller capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version (4 bytes).
    pub const VS: u32 = 0x08;
    /// Controller configuration (4 bytes).
    pub const CC: u32 = 0x14;
    /// Controller status (4 bytes).
    pub const CSTS: u32 = 0x1C;
    /// CC.EN.
    pub const CC_EN: u32 = 1;
    /// CC.SHN (bits 15:14).
    pub const CC_SHN_MASK: u32 = 3 << 14;
    /// CSTS.RDY.
    pub const CSTS_RDY: u32 = 1;
    /// CSTS.SHST = shutdown complete (10b in bits 3:2).
    pub const CSTS_SHST_DONE: u32 = 2 << 2;
}

/// Feature identifiers.
pub mod feature {
    /// Volatile write cache (bit 0 of dword 11: write cache enable).
    pub const VOLATILE_WC: u8 = 0x06;
    /// Number of queues.
    pub const NUM_QUEUES: u8 = 0x07;
    /// Asynchronous event configuration.
    pub const ASYNC_EVENT: u8 = 0x0B;
    /// Keep alive timer.
    pub const KEEP_ALIVE: u8 = 0x0F;
}

/// Log page identifiers, and the Error Information log's entry.
pub mod log {
    use super::{Status, le16, le32, le64, put16, put32, put64};

    /// Error information.
    pub const ERROR: u8 = 0x01;
    /// SMART / health information.
    pub const SMART: u8 = 0x02;
    /// Asymmetric namespace access (`wire::ana`).
    pub const ANA: u8 = super::ana::LOG_ID;
    /// Discovery.
    pub const DISCOVERY: u8 = 0x70;
    /// Bytes of one Error Information log entry.
    pub const ERROR_ENTRY_LEN: usize = 64;
    /// Byte of the SMART / Health Information log where the number of Error Information log
    /// entries over the controller's life is (16 bytes; the target writes the low 8).
    pub const SMART_ERROR_ENTRIES: usize = 176;
    /// SMART / Health log: Data Units Read (16 bytes): thousands of 512-byte units the host
    /// read, rounded up.
    pub const SMART_DATA_UNITS_READ: usize = 32;
    /// SMART / Health log: Data Units Written (16 bytes), as Data Units Read.
    pub const SMART_DATA_UNITS_WRITTEN: usize = 48;
    /// SMART / Health log: Host Read Commands (16 bytes).
    pub const SMART_HOST_READS: usize = 64;
    /// SMART / Health log: Host Write Commands (16 bytes).
    pub const SMART_HOST_WRITES: usize = 80;
    /// SMART / Health log: Controller Busy Time (16 bytes, minutes).
    pub const SMART_BUSY_MINUTES: usize = 96;
    /// SMART / Health log: Power On Hours (16 bytes).
    pub const SMART_POWER_ON_HOURS: usize = 128;
    /// SMART / Health log: Media and Data Integrity Errors (16 bytes).
    pub const SMART_MEDIA_ERRORS: usize = 160;
    /// Bytes of the SMART / Health log page.
    pub const SMART_LEN: usize = 512;

    /// A SMART / Health log counter at byte `at` of `page` (the low 8 of its 16 bytes).
    pub fn smart_field(page: &[u8], at: usize) -> u64 {
        le64(page, at)
    }
    /// Parameter Error Location when no byte of the command is to blame.
    pub const NO_LOCATION: u16 = 0xFFFF;

    /// One Error Information log entry (log identifier 01h): a command answered with an
    /// error status.
    ///
    /// Layout (64 bytes, little-endian): error count (bytes 0–7; 0 marks an empty entry),
    /// submission queue ID (8–9), command ID (10–11), status field (12–13: the CQE's status
    /// above a phase bit, as in the CQE's last word), parameter error location (14–15: byte
    /// in bits 7:0 and bit in 10:8 of the command, FFFFh none), LBA (16–23), namespace
    /// (24–27), vendor-specific (28, 0); bytes 29–63 are 0 here (transport type, command set,
    /// command-specific information and the version of the layout: version 0).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct ErrorEntry {
        /// The controller's count of errors when this one was logged (1 for its first).
        pub count: u64,
        /// Submission queue ID the command came on.
        pub sqid: u16,
        /// The command's identifier.
        pub cid: u16,
        /// The status it was answered with.
        pub status: Status,
        /// The byte (bits 7:0) and bit (10:8) of the command at fault, or [`NO_LOCATION`].
        pub location: u16,
        /// The first LBA of the command (Read, Write, Write Zeroes; else 0).
        pub lba: u64,
        /// The command's namespace ID (0 for one that names none).
        pub nsid: u32,
    }

    impl ErrorEntry {
        /// Encodes into `b` (at least [`ERROR_ENTRY_LEN`] bytes; the entry's 64 overwritten).
        pub fn write(&self, b: &mut [u8]) {
            let b = &mut b[..ERROR_ENTRY_LEN];
            b.fill(0);
            put64(b, 0, self.count);
            put16(b, 8, self.sqid);
            put16(b, 10, self.cid);
            put16(b, 12, self.status.0 << 1);
            put16(b, 14, self.location);
            put64(b, 16, self.lba);
            put32(b, 24, self.nsid);
        }
        /// Decodes 64 bytes (`None` when shorter).
        pub fn parse(b: &[u8]) -> Option<ErrorEntry> {
            let b = b.get(..ERROR_ENTRY_LEN)?;
            Some(ErrorEntry {
                count: le64(b, 0),
                sqid: le16(b, 8),
                cid: le16(b, 10),
                status: Status(le16(b, 12) >> 1),
                location: le16(b, 14),
                lba: le64(b, 16),
                nsid: le32(b, 24),
            })
        }
    }
}

#[cfg(test)]
mod tests;
