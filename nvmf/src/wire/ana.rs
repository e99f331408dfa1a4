//! Asymmetric Namespace Access (ANA) on the wire: the states, the ANA log page (log
//! identifier 0x0C) and the asynchronous event that announces a change, at the offsets
//! `docs/nvmeof.md` gives.

use super::{le32, le64, put16, put32, put64};

/// The ANA log page's identifier.
pub const LOG_ID: u8 = 0x0C;
/// Bytes of the log's header: change count (8), number of group descriptors (2), reserved.
pub const HEADER_LEN: usize = 16;
/// Bytes of a group descriptor before its namespace IDs: group ID (4), number of NSIDs (4),
/// change count (8), state (1), reserved (15).
pub const DESC_LEN: usize = 32;
/// Get Log Page's log specific field (CDW10 bits 11:8) bit 0 for this log: Return Groups
/// Only (every descriptor without its namespace IDs).
pub const LSP_RGO: u8 = 1;
/// Identify Controller OAES bit and Set Features (Asynchronous Event Configuration) bit 11:
/// ANA change notices.
pub const AEN_ANA_CHANGE: u32 = 1 << 11;
/// The completion dword 0 of an asynchronous event request that reports an ANA change:
/// type Notice (2, bits 2:0), information ANA change (0x03, bits 15:8), log page to read
/// 0x0C (bits 23:16).
pub const AEN_RESULT: u32 = 0x02 | (0x03 << 8) | ((LOG_ID as u32) << 16);

/// An ANA group's state, as the log page and Linux's `ana_state` name it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum AnaState {
    /// Optimized: the preferred path.
    #[default]
    Optimized = 0x01,
    /// Non-optimized: usable, not preferred.
    NonOptimized = 0x02,
    /// Inaccessible: I/O commands fail with the ANA Inaccessible status.
    Inaccessible = 0x03,
    /// Persistent loss: the path will not come back.
    PersistentLoss = 0x04,
    /// Change: the state is changing (within ANATT).
    Change = 0x0F,
}

impl AnaState {
    /// The state with code `v`, or `None` for a reserved value.
    pub fn from_code(v: u8) -> Option<AnaState> {
        Some(match v {
            0x01 => AnaState::Optimized,
            0x02 => AnaState::NonOptimized,
            0x03 => AnaState::Inaccessible,
            0x04 => AnaState::PersistentLoss,
            0x0F => AnaState::Change,
            _ => return None,
        })
    }
    /// The state named `s` as Linux's sysfs `ana_state` spells it (`optimized`,
    /// `non-optimized`, `inaccessible`, `persistent-loss`, `change`).
    pub fn from_name(s: &str) -> Option<AnaState> {
        Some(match s {
            "optimized" => AnaState::Optimized,
            "non-optimized" => AnaState::NonOptimized,
            "inaccessible" => AnaState::Inaccessible,
            "persistent-loss" => AnaState::PersistentLoss,
            "change" => AnaState::Change,
            _ => return None,
        })
    }
    /// Its name, as [`from_name`](Self::from_name) reads it.
    pub fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non-optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent-loss",
            AnaState::Change => "change",
        }
    }
    /// Whether I/O commands are executed in this state (optimized or non-optimized).
    pub fn serves_io(self) -> bool {
        matches!(self, AnaState::Optimized | AnaState::NonOptimized)
    }
}

/// Writes the log's header into `b` (at least [`HEADER_LEN`] bytes).
pub fn write_header(b: &mut [u8], chgcnt: u64, ngrps: u16) {
    let b = &mut b[..HEADER_LEN];
    b.fill(0);
    put64(b, 0, chgcnt);
    put16(b, 8, ngrps);
}

/// One ANA group descriptor (without its namespace IDs, which follow it, 4 bytes each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupDesc {
    /// The ANA group ID (1..=ANAGRPMAX).
    pub grpid: u32,
    /// Namespace IDs that follow the descriptor.
    pub nnsids: u32,
    /// The group's change count.
    pub chgcnt: u64,
    /// Its state code ([`AnaState`] as a byte; a reader may meet a reserved value).
    pub state: u8,
}

impl GroupDesc {
    /// Writes it into `b` (at least [`DESC_LEN`] bytes).
    pub fn write(&self, b: &mut [u8]) {
        let b = &mut b[..DESC_LEN];
        b.fill(0);
        put32(b, 0, self.grpid);
        put32(b, 4, self.nnsids);
        put64(b, 8, self.chgcnt);
        b[16] = self.state;
    }
    /// Reads one from `b` (`None` when shorter than [`DESC_LEN`]).
    pub fn parse(b: &[u8]) -> Option<GroupDesc> {
        let b = b.get(..DESC_LEN)?;
        Some(GroupDesc {
            grpid: le32(b, 0),
            nnsids: le32(b, 4),
            chgcnt: le64(b, 8),
            state: b[16],
        })
    }
}

/// `(change count, number of group descriptors)` from a log's header (`None` when shorter).
pub fn parse_header(b: &[u8]) -> Option<(u64, u16)> {
    let b = b.get(..HEADER_LEN)?;
    Some((le64(b, 0), super::le16(b, 8)))
}

/// The descriptors of a log read into `b`, each with its namespace IDs' bytes: a walk that
/// stops at the header's count or where `b` ends (a count from the wire never reads past
/// `b`).
pub fn groups(b: &[u8]) -> impl Iterator<Item = (GroupDesc, &[u8])> {
    let n = parse_header(b).map_or(0, |(_, n)| n);
    let mut at = HEADER_LEN;
    (0..n).map_while(move |_| {
        let d = GroupDesc::parse(b.get(at..)?)?;
        let ids_len = usize::try_from(d.nnsids).ok()?.checked_mul(4)?;
        let start = at + DESC_LEN;
        let ids = b.get(start..start.checked_add(ids_len)?)?;
        at = start + ids_len;
        Some((d, ids))
    })
}
