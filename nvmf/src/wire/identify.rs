//! Identify data (controller, namespace, active namespace list, namespace identification
//! descriptors) and the discovery log page, at the offsets `docs/nvmeof.md` gives.

use super::{le16, le32, le64, put16, put32, put64};

/// Bytes of an Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;

/// Identify CNS values.
pub mod cns {
    /// Namespace.
    pub const NAMESPACE: u8 = 0x00;
    /// Controller.
    pub const CONTROLLER: u8 = 0x01;
    /// Active namespace ID list.
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    /// Namespace identification descriptor list.
    pub const NS_DESC_LIST: u8 = 0x03;
}

/// Controller type (Identify Controller byte 111).
pub mod cntrltype {
    /// I/O controller.
    pub const IO: u8 = 1;
    /// Discovery controller.
    pub const DISCOVERY: u8 = 2;
}

/// The Identify Controller fields this crate writes and reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdCtrl<'n> {
    /// Serial number (up to 20 ASCII bytes, space-padded).
    pub serial: &'n str,
    /// Model number (up to 40, space-padded).
    pub model: &'n str,
    /// Firmware revision (up to 8).
    pub firmware: &'n str,
    /// Controller multi-path I/O and namespace sharing capabilities (byte 76: bit 0 several
    /// ports, bit 1 several controllers, bit 3 ANA reporting).
    pub cmic: u8,
    /// Maximum data transfer size, a power of two of 4 KiB (0: no limit).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version (as the VS property).
    pub ver: u32,
    /// Optional asynchronous events supported (bytes 92–95; bit 11 ANA change notices).
    pub oaes: u32,
    /// Controller type (1 I/O, 2 discovery).
    pub cntrltype: u8,
    /// Abort limit (0's based).
    pub acl: u8,
    /// Asynchronous event request limit (0's based).
    pub aerl: u8,
    /// Log page attributes.
    pub lpa: u8,
    /// Error Information log entries the controller keeps (0's based).
    pub elpe: u8,
    /// Keep-alive granularity (100 ms units; 0: no keep-alive).
    pub kas: u16,
    /// ANA transition time (byte 342, seconds).
    pub anatt: u8,
    /// ANA capabilities (byte 343: bits 0–4 the states it may report, bit 6 a namespace's
    /// group never changes while attached).
    pub anacap: u8,
    /// Highest ANA group ID (bytes 344–347).
    pub anagrpmax: u32,
    /// Number of ANA group IDs supported (bytes 348–351).
    pub nanagrpid: u32,
    /// Maximum outstanding commands.
    pub maxcmd: u16,
    /// Number of namespaces (highest NSID).
    pub nn: u32,
    /// Optional NVM command support (bit 3: Write Zeroes).
    pub oncs: u16,
    /// Volatile write cache (bit 0).
    pub vwc: u8,
    /// Maximum number of allowed namespaces (bytes 540–543; Linux wants 1..=NN when ANA is
    /// reported).
    pub mnan: u32,
    /// SGL support (bits 1:0 = 01, bit 2 keyed, bit 20 offset/in-capsule).
    pub sgls: u32,
    /// Subsystem NQN.
    pub subnqn: &'n [u8],
    /// I/O command capsule supported size, in 16-byte units.
    pub ioccsz: u32,
    /// I/O response capsule supported size, in 16-byte units.
    pub iorcsz: u32,
    /// In-capsule data offset (16-byte units; must be 0 for Linux).
    pub icdoff: u16,
    /// Maximum SGL descriptors per command.
    pub msdbd: u8,
}

fn put_str(b: &mut [u8], s: &[u8]) {
    b.fill(b' ');
    let n = s.len().min(b.len());
    b[..n].copy_from_slice(&s[..n]);
}

impl IdCtrl<'_> {
    /// Writes the 4096-byte structure into `b` (at least 4096 bytes; zeroed first).
    pub fn write(&self, b: &mut [u8]) {
        let b = &mut b[..IDENTIFY_LEN];
        b.fill(0);
        put_str(&mut b[4..24], self.serial.as_bytes());
        put_str(&mut b[24..64], self.model.as_bytes());
        put_str(&mut b[64..72], self.firmware.as_bytes());
        b[76] = self.cmic;
        b[77] = self.mdts;
        put16(b, 78, self.cntlid);
        put32(b, 80, self.ver);
        put32(b, 92, self.oaes);
        b[111] = self.cntrltype;
        b[258] = self.acl;
        b[259] = self.aerl;
        b[261] = self.lpa;
        b[262] = self.elpe;
        put16(b, 320, self.kas);
        b[342] = self.anatt;
        b[343] = self.anacap;
        put32(b, 344, self.anagrpmax);
        put32(b, 348, self.nanagrpid);
        b[512] = 0x66;
        b[513] = 0x44;
        put16(b, 514, self.maxcmd);
        put32(b, 516, self.nn);
        put16(b, 520, self.oncs);
        b[525] = self.vwc;
        put32(b, 536, self.sgls);
        put32(b, 540, self.mnan);
        let n = self.subnqn.len().min(255);
        b[768..768 + n].copy_from_slice(&self.subnqn[..n]);
        put32(b, 1792, self.ioccsz);
        put32(b, 1796, self.iorcsz);
        put16(b, 1800, self.icdoff);
        b[1803] = self.msdbd;
    }
}

/// What a host reads back from Identify Controller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtrlInfo {
    /// Multi-path I/O and namespace sharing capabilities.
    pub cmic: u8,
    /// Maximum data transfer size (power of two of 4 KiB; 0: no limit).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Optional asynchronous events supported.
    pub oaes: u32,
    /// ANA capabilities.
    pub anacap: u8,
    /// Highest ANA group ID.
    pub anagrpmax: u32,
    /// Number of ANA group IDs.
    pub nanagrpid: u32,
    /// Maximum number of allowed namespaces.
    pub mnan: u32,
    /// Controller type.
    pub cntrltype: u8,
    /// Keep-alive granularity.
    pub kas: u16,
    /// Maximum outstanding commands.
    pub maxcmd: u16,
    /// Number of namespaces.
    pub nn: u32,
    /// Optional NVM commands.
    pub oncs: u16,
    /// SGL support.
    pub sgls: u32,
    /// I/O command capsule size in 16-byte units.
    pub ioccsz: u32,
    /// In-capsule data offset.
    pub icdoff: u16,
}

impl CtrlInfo {
    /// Reads the fields from a 4096-byte structure (`None` when shorter).
    pub fn parse(b: &[u8]) -> Option<CtrlInfo> {
        let b = b.get(..IDENTIFY_LEN)?;
        Some(CtrlInfo {
            cmic: b[76],
            mdts: b[77],
            cntlid: le16(b, 78),
            oaes: le32(b, 92),
            anacap: b[343],
            anagrpmax: le32(b, 344),
            nanagrpid: le32(b, 348),
            mnan: le32(b, 540),
            cntrltype: b[111],
            kas: le16(b, 320),
            maxcmd: le16(b, 514),
            nn: le32(b, 516),
            oncs: le16(b, 520),
            sgls: le32(b, 536),
            ioccsz: le32(b, 1792),
            icdoff: le16(b, 1800),
        })
    }
}

/// The Identify Namespace fields this crate writes and reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdNs {
    /// Size in blocks.
    pub nsze: u64,
    /// Capacity in blocks.
    pub ncap: u64,
    /// Blocks in use.
    pub nuse: u64,
    /// log2 of the block size (9: 512 bytes).
    pub lbads: u8,
    /// Multi-path I/O and sharing capabilities (byte 30; bit 0: may be shared).
    pub nmic: u8,
    /// The namespace's ANA group (bytes 92–95; 0: none reported).
    pub anagrpid: u32,
    /// Namespace GUID.
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier (bytes 120–127; zero: none).
    pub eui64: [u8; 8],
}

impl IdNs {
    /// Writes the 4096-byte structure (one LBA format, no metadata) into `b`.
    pub fn write(&self, b: &mut [u8]) {
        let b = &mut b[..IDENTIFY_LEN];
        b.fill(0);
        put64(b, 0, self.nsze);
        put64(b, 8, self.ncap);
        put64(b, 16, self.nuse);
        b[30] = self.nmic;
        put32(b, 92, self.anagrpid);
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        // LBA format 0: no metadata, the data size, best relative performance.
        b[128 + 2] = self.lbads;
    }
    /// Reads it back (`None` when shorter than 4096 bytes).
    pub fn parse(b: &[u8]) -> Option<IdNs> {
        let b = b.get(..IDENTIFY_LEN)?;
        let fmt = usize::from(b[26] & 0xF);
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[104..120]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&b[120..128]);
        Some(IdNs {
            nsze: le64(b, 0),
            ncap: le64(b, 8),
            nuse: le64(b, 16),
            lbads: b[128 + fmt * 4 + 2],
            nmic: b[30],
            anagrpid: le32(b, 92),
            nguid,
            eui64,
        })
    }
}

/// Namespace identification descriptor types.
pub mod nidt {
    /// EUI-64 (8 bytes).
    pub const EUI64: u8 = 1;
    /// NGUID (16 bytes).
    pub const NGUID: u8 = 2;
    /// UUID (16 bytes).
    pub const UUID: u8 = 3;
    /// Command set identifier (1 byte).
    pub const CSI: u8 = 4;
}

/// The discovery log page header (first 1024 bytes) and entries (1024 bytes each).
pub mod discovery {
    use super::*;

    /// Bytes of the header, and of each entry.
    pub const RECORD: usize = 1024;

    /// One discovery log entry (an NVMe/RDMA subsystem port).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Entry<'n> {
        /// Subsystem type: 2 NVM subsystem, 3 the current discovery subsystem.
        pub subtype: u8,
        /// Port ID.
        pub portid: u16,
        /// Controller ID (0xFFFF: dynamic).
        pub cntlid: u16,
        /// Admin max SQ size.
        pub asqsz: u16,
        /// Transport service ID (the port number in ASCII).
        pub trsvcid: u16,
        /// Subsystem NQN.
        pub subnqn: &'n [u8],
        /// Transport address (IPv4).
        pub traddr: [u8; 4],
    }

    /// Writes the header into `b` (1024 bytes).
    pub fn write_header(b: &mut [u8], genctr: u64, numrec: u64) {
        let b = &mut b[..RECORD];
        b.fill(0);
        put64(b, 0, genctr);
        put64(b, 8, numrec);
    }

    fn ascii_u16(out: &mut [u8], v: u16) -> usize {
        let mut digits = [0u8; 5];
        let mut n = 0;
        let mut v = v;
        loop {
            digits[n] = b'0' + (v % 10) as u8;
            n += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        for k in 0..n {
            out[k] = digits[n - 1 - k];
        }
        n
    }

    impl Entry<'_> {
        /// Writes the 1024-byte entry into `b`.
        pub fn write(&self, b: &mut [u8]) {
            let b = &mut b[..RECORD];
            b.fill(0);
            b[0] = 1; // RDMA
            b[1] = 1; // IPv4
            b[2] = self.subtype;
            b[3] = 0; // no requirements
            put16(b, 4, self.portid);
            put16(b, 6, self.cntlid);
            put16(b, 8, self.asqsz);
            ascii_u16(&mut b[32..64], self.trsvcid);
            let n = self.subnqn.len().min(255);
            b[256..256 + n].copy_from_slice(&self.subnqn[..n]);
            let mut at = 512;
            for (k, o) in self.traddr.iter().enumerate() {
                if k > 0 {
                    b[at] = b'.';
                    at += 1;
                }
                at += ascii_u16(&mut b[at..], u16::from(*o));
            }
            // RDMA transport specific: connected QP, no provider type given, rdma_cm.
            b[768] = 1;
            b[769] = 1;
            b[770] = 1;
        }
    }

    /// `(genctr, numrec)` from a header (`None` when shorter than 16 bytes).
    pub fn parse_header(b: &[u8]) -> Option<(u64, u64)> {
        let b = b.get(..16)?;
        Some((le64(b, 0), le64(b, 8)))
    }

    /// `(trtype, subtype, subnqn field)` of an entry (`None` when shorter than 1024 bytes).
    pub fn parse_entry(b: &[u8]) -> Option<(u8, u8, &[u8])> {
        let b = b.get(..RECORD)?;
        Some((b[0], b[2], &b[256..512]))
    }

    /// `(port ID, transport address field, service ID field)` of an entry, the two fields
    /// as the NUL-padded ASCII they are (`None` when shorter than 1024 bytes).
    pub fn parse_address(b: &[u8]) -> Option<(u16, &[u8], &[u8])> {
        let b = b.get(..RECORD)?;
        let trim = |f: &'_ [u8]| -> usize { f.iter().position(|&c| c == 0).unwrap_or(f.len()) };
        let (traddr, trsvcid) = (&b[512..768], &b[32..64]);
        Some((
            le16(b, 4),
            &traddr[..trim(traddr)],
            &trsvcid[..trim(trsvcid)],
        ))
    }
}
