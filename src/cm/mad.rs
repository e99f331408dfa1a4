//! The management datagram as the CM sends it: 256 bytes, a 24-byte common header and the
//! CM's 232-byte payload, every field big-endian (`docs/cm.md`). Reading checks the length and
//! the header before a field is looked at; writing starts from zeroes, as Linux allocates its
//! send MADs.

/// Bytes of every CM MAD.
pub const MAD_LEN: usize = 256;
/// Bytes of the common header.
pub const HDR_LEN: usize = 24;
/// Base version of every MAD.
pub const BASE_VERSION: u8 = 1;
/// Management class of the communication manager.
pub const CLASS_CM: u8 = 0x07;
/// The CM's class version.
pub const CLASS_VERSION: u8 = 2;
/// Method SEND: every CM message.
pub const METHOD_SEND: u8 = 0x03;

/// CM attribute IDs (the message types).
pub mod attr {
    /// Connection request.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Reject.
    pub const REJ: u16 = 0x0012;
    /// Reply to a request.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnection request.
    pub const DREQ: u16 = 0x0015;
    /// Reply to a disconnection request.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request (UD).
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution reply.
    pub const SIDR_REP: u16 = 0x0018;
}

/// Why a received datagram is not a CM message this CM takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MadError {
    /// Not 256 bytes.
    Length(usize),
    /// Base version other than 1.
    BaseVersion(u8),
    /// A class other than the CM's.
    Class(u8),
    /// A CM class version other than 2.
    ClassVersion(u8),
    /// A method other than SEND.
    Method(u8),
    /// An attribute that is not one of the messages handled (ClassPortInfo, LAP, APR,
    /// unknown).
    Attribute(u16),
}

/// A CM MAD's bytes, checked or being written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Mad(pub [u8; MAD_LEN]);

impl core::fmt::Debug for Mad {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "Mad(attr {:#06x}, tid {:#018x})",
            self.attr(),
            self.tid()
        )
    }
}

impl Mad {
    /// A zeroed MAD with the CM header for `attr` and transaction ID `tid`.
    pub fn new(attr: u16, tid: u64) -> Mad {
        let mut m = Mad([0; MAD_LEN]);
        m.0[..4].copy_from_slice(&[BASE_VERSION, CLASS_CM, CLASS_VERSION, METHOD_SEND]);
        m.put_u64(8, tid);
        m.put_u16(16, attr);
        m
    }

    /// Checks a received datagram: exactly 256 bytes, base version 1, class CM version 2,
    /// method SEND, and one of the nine message attributes.
    pub fn parse(bytes: &[u8]) -> Result<Mad, MadError> {
        let b: &[u8; MAD_LEN] = bytes
            .try_into()
            .map_err(|_| MadError::Length(bytes.len()))?;
        let m = Mad(*b);
        if b[0] != BASE_VERSION {
            return Err(MadError::BaseVersion(b[0]));
        }
        if b[1] != CLASS_CM {
            return Err(MadError::Class(b[1]));
        }
        if b[2] != CLASS_VERSION {
            return Err(MadError::ClassVersion(b[2]));
        }
        if b[3] != METHOD_SEND {
            return Err(MadError::Method(b[3]));
        }
        match m.attr() {
            attr::REQ..=attr::SIDR_REP => Ok(m),
            a => Err(MadError::Attribute(a)),
        }
    }

    /// The attribute ID (the message type).
    pub fn attr(&self) -> u16 {
        self.u16(16)
    }

    /// The transaction ID.
    pub fn tid(&self) -> u64 {
        self.u64(8)
    }

    /// The attribute modifier.
    pub fn attr_mod(&self) -> u32 {
        self.u32(20)
    }

    /// Byte `at` (MAD offsets; every caller names a constant below 256).
    pub fn u8(&self, at: usize) -> u8 {
        self.0[at]
    }

    /// Bits `hi..=lo` of byte `at` (bit 7 the most significant).
    pub fn bits(&self, at: usize, hi: u32, lo: u32) -> u8 {
        (self.0[at] >> lo) & ((1u16 << (hi - lo + 1)) - 1) as u8
    }

    /// The 16-bit field at `at`.
    pub fn u16(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.0[at], self.0[at + 1]])
    }

    /// The 24-bit field at `at`.
    pub fn u24(&self, at: usize) -> u32 {
        u32::from_be_bytes([0, self.0[at], self.0[at + 1], self.0[at + 2]])
    }

    /// The 32-bit field at `at`.
    pub fn u32(&self, at: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.0[at..at + 4]);
        u32::from_be_bytes(b)
    }

    /// The 64-bit field at `at`.
    pub fn u64(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[at..at + 8]);
        u64::from_be_bytes(b)
    }

    /// The 16 bytes at `at` (a GID).
    pub fn gid(&self, at: usize) -> [u8; 16] {
        let mut g = [0u8; 16];
        g.copy_from_slice(&self.0[at..at + 16]);
        g
    }

    /// Writes byte `at`.
    pub fn put_u8(&mut self, at: usize, v: u8) {
        self.0[at] = v;
    }

    /// Writes bits `hi..=lo` of byte `at` (the others kept).
    pub fn put_bits(&mut self, at: usize, hi: u32, lo: u32, v: u8) {
        let mask = (((1u16 << (hi - lo + 1)) - 1) as u8) << lo;
        self.0[at] = (self.0[at] & !mask) | ((v << lo) & mask);
    }

    /// Writes the 16-bit field at `at`.
    pub fn put_u16(&mut self, at: usize, v: u16) {
        self.0[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }

    /// Writes the 24-bit field at `at` (the top byte of `v` dropped).
    pub fn put_u24(&mut self, at: usize, v: u32) {
        self.0[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
    }

    /// Writes the 32-bit field at `at`.
    pub fn put_u32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }

    /// Writes the 64-bit field at `at`.
    pub fn put_u64(&mut self, at: usize, v: u64) {
        self.0[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }

    /// Writes `b` at `at`.
    pub fn put_bytes(&mut self, at: usize, b: &[u8]) {
        self.0[at..at + b.len()].copy_from_slice(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_written_and_checked() {
        let m = Mad::new(attr::REQ, 0x1122_3344_5566_7788);
        assert_eq!(&m.0[..4], &[1, 7, 2, 3]);
        assert_eq!(
            &m.0[8..18],
            &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0, 0x10]
        );
        assert_eq!(Mad::parse(&m.0), Ok(m));
        assert_eq!(Mad::parse(&m.0[..255]), Err(MadError::Length(255)));
        assert_eq!(Mad::parse(&[]), Err(MadError::Length(0)));
        for (at, v, e) in [
            (0, 2, MadError::BaseVersion(2)),
            (1, 4, MadError::Class(4)),
            (2, 1, MadError::ClassVersion(1)),
            (3, 0x81, MadError::Method(0x81)),
        ] {
            let mut b = m.0;
            b[at] = v;
            assert_eq!(Mad::parse(&b), Err(e));
        }
        for a in [0x0001u16, 0x000F, 0x0019, 0x001A, 0xFFFF] {
            let b = Mad::new(a, 0).0;
            assert_eq!(Mad::parse(&b), Err(MadError::Attribute(a)));
        }
    }

    #[test]
    fn bit_fields_are_msb_first_and_leave_their_neighbours() {
        let mut m = Mad::new(attr::REQ, 0);
        m.put_u8(67, 0xFF);
        m.put_bits(67, 7, 3, 20);
        assert_eq!(m.u8(67), (20 << 3) | 0x07);
        assert_eq!(m.bits(67, 7, 3), 20);
        m.put_bits(67, 2, 1, 0);
        assert_eq!(m.u8(67), (20 << 3) | 1);
        m.put_u24(56, 0xAB_CDEF);
        assert_eq!(&m.0[56..59], &[0xAB, 0xCD, 0xEF]);
        assert_eq!(m.u24(56), 0xAB_CDEF);
    }
}
