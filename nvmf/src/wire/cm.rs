//! NVMe/RDMA private data of the CM's REQ, REP and REJ (after rdma_cm's header in a REQ):
//! `docs/nvmeof.md`.

use super::{le16, put16};

/// The only record format (1.0).
pub const RECFMT: u16 = 0;

/// REQ private data (32 bytes): what a host asks for one queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmReq {
    /// Record format (0).
    pub recfmt: u16,
    /// Queue ID: 0 admin, 1.. I/O.
    pub qid: u16,
    /// Host receive queue size (responses the host can take at once).
    pub hrqsize: u16,
    /// Host send queue size, 0's based (commands outstanding at most, minus one).
    pub hsqsize: u16,
    /// Controller ID (newer hosts, I/O queues; 0 otherwise).
    pub cntlid: u16,
}

/// Bytes of the REQ private data.
pub const CM_REQ_LEN: usize = 32;
/// Bytes of the REP private data.
pub const CM_REP_LEN: usize = 32;
/// Bytes of the REJ private data.
pub const CM_REJ_LEN: usize = 4;

impl CmReq {
    /// Decodes; `None` when shorter than 32 bytes.
    pub fn parse(b: &[u8]) -> Option<CmReq> {
        if b.len() < CM_REQ_LEN {
            return None;
        }
        Some(CmReq {
            recfmt: le16(b, 0),
            qid: le16(b, 2),
            hrqsize: le16(b, 4),
            hsqsize: le16(b, 6),
            cntlid: le16(b, 8),
        })
    }
    /// Encodes.
    pub fn to_bytes(&self) -> [u8; CM_REQ_LEN] {
        let mut b = [0u8; CM_REQ_LEN];
        put16(&mut b, 0, self.recfmt);
        put16(&mut b, 2, self.qid);
        put16(&mut b, 4, self.hrqsize);
        put16(&mut b, 6, self.hsqsize);
        put16(&mut b, 8, self.cntlid);
        b
    }
}

/// REP private data: the controller's receive queue size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmRep {
    /// Record format (0).
    pub recfmt: u16,
    /// Controller receive queue size (capsules it has receive buffers for).
    pub crqsize: u16,
}

impl CmRep {
    /// Decodes; `None` when shorter than 4 bytes.
    pub fn parse(b: &[u8]) -> Option<CmRep> {
        if b.len() < 4 {
            return None;
        }
        Some(CmRep {
            recfmt: le16(b, 0),
            crqsize: le16(b, 2),
        })
    }
    /// Encodes (32 bytes, the rest reserved).
    pub fn to_bytes(&self) -> [u8; CM_REP_LEN] {
        let mut b = [0u8; CM_REP_LEN];
        put16(&mut b, 0, self.recfmt);
        put16(&mut b, 2, self.crqsize);
        b
    }
}

/// Why a controller rejects a queue's connection (REJ private data status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum CmRejStatus {
    /// The private data is missing or too short.
    InvalidLength = 1,
    /// Unknown record format.
    InvalidRecfmt = 2,
    /// Queue ID out of range (or a queue that exists already).
    InvalidQid = 3,
    /// Host send queue size out of range.
    InvalidHsqsize = 4,
    /// Host receive queue size out of range.
    InvalidHrqsize = 5,
    /// No room (queue or controller table full, memory).
    NoResources = 6,
    /// Invalid IRD.
    InvalidIrd = 7,
    /// Invalid ORD.
    InvalidOrd = 8,
    /// Invalid controller ID.
    InvalidCntlid = 9,
}

impl CmRejStatus {
    /// The status from its wire value.
    pub fn from_raw(v: u16) -> Option<CmRejStatus> {
        use CmRejStatus::*;
        Some(match v {
            1 => InvalidLength,
            2 => InvalidRecfmt,
            3 => InvalidQid,
            4 => InvalidHsqsize,
            5 => InvalidHrqsize,
            6 => NoResources,
            7 => InvalidIrd,
            8 => InvalidOrd,
            9 => InvalidCntlid,
            _ => return None,
        })
    }
    /// REJ private data: record format 0, the status.
    pub fn to_bytes(self) -> [u8; CM_REJ_LEN] {
        let mut b = [0u8; CM_REJ_LEN];
        put16(&mut b, 0, RECFMT);
        put16(&mut b, 2, self as u16);
        b
    }
    /// Decodes REJ private data (the status, whatever the record format).
    pub fn parse(b: &[u8]) -> Option<u16> {
        (b.len() >= CM_REJ_LEN).then(|| le16(b, 2))
    }
}
