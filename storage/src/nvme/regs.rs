//! The controller's registers (BAR 0) and the queue entries, as the NVMe base specification
//! lays them out (docs/nvme.md has the sections). Offsets are checked against the layout
//! struct at compile time; the entries' sizes too.

use core::mem::{offset_of, size_of};

/// The controller registers up to the doorbells, as laid out in BAR 0. The driver reaches them
/// through the HAL's 32-bit [`Mmio`](bareverbs_hal::Mmio) at these offsets (a 64-bit register
/// as two halves, low first); the struct is the layout's statement, checked below.
#[repr(C)]
pub struct Registers {
    /// Controller Capabilities (64-bit, read-only).
    pub cap: u64,
    /// Version.
    pub vs: u32,
    /// Interrupt Mask Set.
    pub intms: u32,
    /// Interrupt Mask Clear.
    pub intmc: u32,
    /// Controller Configuration.
    pub cc: u32,
    _reserved: u32,
    /// Controller Status.
    pub csts: u32,
    /// NVM Subsystem Reset.
    pub nssr: u32,
    /// Admin Queue Attributes.
    pub aqa: u32,
    /// Admin Submission Queue base address (64-bit).
    pub asq: u64,
    /// Admin Completion Queue base address (64-bit).
    pub acq: u64,
}

/// Byte offset of CAP.
pub const CAP: usize = offset_of!(Registers, cap);
/// Byte offset of VS.
pub const VS: usize = offset_of!(Registers, vs);
/// Byte offset of INTMS.
pub const INTMS: usize = offset_of!(Registers, intms);
/// Byte offset of CC.
pub const CC: usize = offset_of!(Registers, cc);
/// Byte offset of CSTS.
pub const CSTS: usize = offset_of!(Registers, csts);
/// Byte offset of AQA.
pub const AQA: usize = offset_of!(Registers, aqa);
/// Byte offset of ASQ.
pub const ASQ: usize = offset_of!(Registers, asq);
/// Byte offset of ACQ.
pub const ACQ: usize = offset_of!(Registers, acq);
/// Where the doorbells start.
pub const DOORBELLS: usize = 0x1000;

const _: () = {
    assert!(CAP == 0x00 && VS == 0x08 && INTMS == 0x0C && CC == 0x14);
    assert!(CSTS == 0x1C && AQA == 0x24 && ASQ == 0x28 && ACQ == 0x30);
    assert!(size_of::<Registers>() == 0x38);
};

/// CC.EN: enable.
pub const CC_EN: u32 = 1;
/// CC.IOSQES = 6 (64-byte submission entries), bits 19:16.
pub const CC_IOSQES: u32 = 6 << 16;
/// CC.IOCQES = 4 (16-byte completion entries), bits 23:20.
pub const CC_IOCQES: u32 = 4 << 20;
/// CSTS.RDY: ready.
pub const CSTS_RDY: u32 = 1;
/// CSTS.CFS: controller fatal status.
pub const CSTS_CFS: u32 = 1 << 1;

/// The fields of CAP the driver uses, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    /// Maximum Queue Entries Supported, 0-based (a queue may hold `mqes + 1` entries).
    pub mqes: u16,
    /// Timeout: the worst time to ready, in 500 ms units.
    pub to: u8,
    /// Doorbell stride: doorbells are `4 << dstrd` bytes apart.
    pub dstrd: u8,
    /// Command sets supported (bit 0: the NVM command set).
    pub css: u8,
    /// Memory page size minimum, as `2 ^ (12 + mpsmin)`.
    pub mpsmin: u8,
    /// Memory page size maximum, as `2 ^ (12 + mpsmax)`.
    pub mpsmax: u8,
}

impl Cap {
    /// Decodes the 64-bit register.
    pub fn decode(v: u64) -> Cap {
        Cap {
            mqes: v as u16,
            to: (v >> 24) as u8,
            dstrd: ((v >> 32) & 0xF) as u8,
            css: (v >> 37) as u8,
            mpsmin: ((v >> 48) & 0xF) as u8,
            mpsmax: ((v >> 52) & 0xF) as u8,
        }
    }
}

/// A submission queue entry: 64 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Command {
    /// Opcode (7:0), fused (9:8), PRP or SGL (15:14), command identifier (31:16).
    pub cdw0: u32,
    /// Namespace identifier.
    pub nsid: u32,
    /// Command dwords 2 and 3.
    pub cdw2: [u32; 2],
    /// Metadata pointer.
    pub mptr: u64,
    /// PRP entry 1.
    pub prp1: u64,
    /// PRP entry 2 (or the PRP list's address).
    pub prp2: u64,
    /// Command dwords 10 to 15.
    pub cdw10: [u32; 6],
}

/// A completion queue entry: 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    /// Command specific (Set Features' answer).
    pub dw0: u32,
    /// Reserved.
    pub dw1: u32,
    /// Submission queue head pointer.
    pub sqhd: u16,
    /// Submission queue identifier.
    pub sqid: u16,
    /// Command identifier.
    pub cid: u16,
    /// Phase tag (bit 0) and status (15:1).
    pub status: u16,
}

const _: () = {
    assert!(size_of::<Command>() == 64);
    assert!(offset_of!(Command, prp1) == 24 && offset_of!(Command, cdw10) == 40);
    assert!(size_of::<Completion>() == 16);
    assert!(offset_of!(Completion, sqhd) == 8 && offset_of!(Completion, status) == 14);
};

/// The byte offset of queue `qid`'s submission tail doorbell (`cq` false) or completion head
/// doorbell (`cq` true), with CAP.DSTRD's stride; `None` on overflow.
pub fn doorbell(qid: u16, cq: bool, dstrd: u8) -> Option<usize> {
    let index = 2 * usize::from(qid) + usize::from(cq);
    let stride = 4usize.checked_shl(u32::from(dstrd))?;
    index.checked_mul(stride)?.checked_add(DOORBELLS)
}

/// Admin opcodes.
pub mod admin {
    /// Delete I/O Submission Queue.
    pub const DELETE_SQ: u8 = 0x00;
    /// Create I/O Submission Queue.
    pub const CREATE_SQ: u8 = 0x01;
    /// Delete I/O Completion Queue.
    pub const DELETE_CQ: u8 = 0x04;
    /// Create I/O Completion Queue.
    pub const CREATE_CQ: u8 = 0x05;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Identify CNS: a namespace.
    pub const CNS_NAMESPACE: u32 = 0x00;
    /// Identify CNS: the controller.
    pub const CNS_CONTROLLER: u32 = 0x01;
    /// Identify CNS: the active namespace list.
    pub const CNS_ACTIVE_LIST: u32 = 0x02;
    /// Feature: Number of Queues.
    pub const FEAT_QUEUES: u32 = 0x07;
}

/// NVM command set opcodes.
pub mod io {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DSM: u8 = 0x09;
}

/// Identify Controller: ONCS bit for Dataset Management.
pub const ONCS_DSM: u16 = 1 << 2;
/// Identify Controller: ONCS bit for Write Zeroes.
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbells_follow_the_stride() {
        assert_eq!(doorbell(0, false, 0), Some(0x1000));
        assert_eq!(doorbell(0, true, 0), Some(0x1004));
        assert_eq!(doorbell(1, false, 0), Some(0x1008));
        assert_eq!(doorbell(1, true, 2), Some(0x1000 + 3 * 16));
        assert_eq!(
            doorbell(u16::MAX, true, 15),
            Some(0x1000 + 131071 * (4 << 15))
        );
        let cap = Cap::decode(0x0000_0020_0F01_07FF | 4 << 52);
        assert_eq!(
            cap,
            Cap {
                mqes: 0x7FF,
                to: 0x0F,
                dstrd: 0,
                css: 1,
                mpsmin: 0,
                mpsmax: 4
            }
        );
    }
}
