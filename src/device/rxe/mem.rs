//! Memory: protection domains, the memory-region table with its keys and access checks, and
//! the copies between registered memory and frames.
//!
//! A region's addresses are the CPU's own (as `rdma_rxe`'s are user virtual addresses): a
//! scatter/gather entry or a remote request names bytes by address and key, and every use is
//! checked against the region the key names — its protection domain, its bounds and its
//! rights — before a byte moves.

use core::ptr::NonNull;
use core::sync::atomic::AtomicU32;

use bareverbs_hal::Hal;

use super::MAX_MR;
use crate::dma::Dma;
use crate::verbs::{AccessFlags, Entropy, Sge};

/// Protection domains the device hands out.
pub const MAX_PD: u32 = 64;

/// A protection domain: a number, and how many regions and queue pairs use it.
#[derive(Debug)]
pub struct Pd {
    pub(crate) id: u32,
    pub(crate) users: AtomicU32,
}

/// A registered memory region.
pub struct Mr<H: Hal> {
    /// The pages the driver allocated for it (`None`: the embedder's memory).
    pub(crate) _mem: Option<Dma<H>>,
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
    pub(crate) key: u32,
    /// The PD's use count (the PD outlives the region and does not move).
    pub(crate) pd_users: NonNull<AtomicU32>,
}

// SAFETY: the region's bytes belong to whoever registered them; the handle only names them.
unsafe impl<H: Hal + Send> Send for Mr<H> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync> Sync for Mr<H> {}

/// Driver-private memory (HAL pages the NIC never sees).
pub struct Mem<H: Hal>(pub(crate) Dma<H>);

/// One entry of the region table; key 0: free.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MrEntry {
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) key: u32,
    pub(crate) pd: u32,
    pub(crate) access: u32,
    /// The low byte of the slot's last key (the next one differs from it).
    pub(crate) generation: u8,
    /// What the key is (`kind::*`).
    pub(crate) kind: u8,
    /// Access through the key is possible: a registration, a bound window, a fast
    /// registration not invalidated.
    pub(crate) valid: bool,
    /// Windows and fast registrations over this region (it cannot be deregistered).
    pub(crate) binds: u16,
    /// The region a window or fast registration is over: its slot + 1 (0: none).
    pub(crate) parent: u16,
    /// A type 2 window: the QP it is bound to.
    pub(crate) qpn: u32,
    /// The CPU address of `addr` (a fast registration's `iova` names other bytes).
    pub(crate) base: u64,
    /// A fast-registration region: the bytes it may map.
    pub(crate) max_len: u64,
}

/// What a key of the table is.
pub(crate) mod kind {
    /// A registered memory region.
    pub(crate) const MR: u8 = 0;
    /// A type 1 memory window.
    pub(crate) const MW1: u8 = 1;
    /// A type 2 memory window.
    pub(crate) const MW2: u8 = 2;
    /// A region for fast registration.
    pub(crate) const FAST: u8 = 3;
}

/// The rights only a peer uses.
const REMOTE: AccessFlags = AccessFlags::REMOTE_READ
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_ATOMIC);

/// The bits of a key that name its slot in the table (bits 8 to 15).
pub(super) const KEY_INDEX: u32 = (MAX_MR as u32 - 1) << 8;
const _: () = assert!(MAX_MR.is_power_of_two() && MAX_MR <= 256);

/// The memory-region table: every region's key, protection domain, bounds and rights.
///
/// A key is the slot's index in bits 8 to 15 (as rxe's index in bits 8 and up), a byte in
/// bits 0 to 7 that changes with every registration of the slot (a stale key never names the
/// region registered after it), and 16 bits drawn per registration in bits 16 to 31; the low
/// byte starts, per slot, at a drawn value. The draws come from the device's seed
/// ([`Hal::seed`]): a station on the segment that guesses keys faces 24 unknown bits (16 once
/// it saw an earlier key of the slot), not a count from 1 (`docs/security.md`).
pub(crate) struct MrTable {
    pub(super) entries: [MrEntry; MAX_MR],
    /// The stream the key bits come from (valid zeroed; seeded in [`MrTable::seed`]).
    keys: Entropy,
}

/// Why a memory access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No region has this key (or it is another PD's).
    Key,
    /// Outside the region.
    Bounds,
    /// The region does not grant the right.
    Access,
}

impl MrTable {
    /// Seeds the key bits (from the HAL's seed, once, before any registration).
    pub(crate) fn seed(&mut self, seed: u64) {
        self.keys = Entropy::new(seed);
    }

    /// Registers `len` bytes at `addr` in `pd`; the key, or `None` when the table is full.
    pub(crate) fn add(&mut self, addr: u64, len: u64, pd: u32, access: AccessFlags) -> Option<u32> {
        let i = self.entries.iter().position(|m| m.key == 0)?;
        let drawn = self.keys.next_u64();
        let m = &mut self.entries[i];
        // The low byte: a drawn start for a slot never used, then one more each time (never
        // 0, so that key 0, "free", is never handed out).
        let start = if m.generation == 0 {
            drawn as u8
        } else {
            m.generation
        };
        m.generation = start.wrapping_add(1).max(1);
        let high = (drawn >> 32) as u32 & 0xFFFF_0000;
        let key = high | (i as u32) << 8 | u32::from(m.generation);
        *m = MrEntry {
            addr,
            len,
            key,
            pd,
            access: access.bits(),
            generation: m.generation,
            valid: true,
            base: addr,
            ..MrEntry::default()
        };
        Some(key)
    }

    /// Gives the region with `key` the rights `access`; `false` when no region has it.
    pub(crate) fn set_access(&mut self, key: u32, access: AccessFlags) -> bool {
        match self.entries.get_mut(((key & KEY_INDEX) >> 8) as usize) {
            Some(m) if m.key == key => {
                m.access = access.bits();
                true
            }
            _ => false,
        }
    }

    /// Deregisters the region with `key`.
    pub(crate) fn remove(&mut self, key: u32) {
        if let Some(m) = self.entries.get_mut(((key & KEY_INDEX) >> 8) as usize)
            && m.key == key
        {
            m.key = 0;
        }
    }

    /// The CPU address of `len` bytes at `addr` of the region with `key` in `pd`, with the
    /// right `need` (empty: local read).
    #[inline(always)]
    pub(crate) fn check(
        &self,
        key: u32,
        pd: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<*mut u8, Denied> {
        let m = self
            .entries
            .get(((key & KEY_INDEX) >> 8) as usize)
            .ok_or(Denied::Key)?;
        if m.key == 0 || m.key != key || m.pd != pd || !m.valid {
            return Err(Denied::Key);
        }
        // A window's key is an rkey only: never a local key.
        if matches!(m.kind, kind::MW1 | kind::MW2) && !need.intersects(REMOTE) {
            return Err(Denied::Key);
        }
        if len == 0 {
            return Ok(core::ptr::null_mut());
        }
        let end = addr.checked_add(len).ok_or(Denied::Bounds)?;
        if addr < m.addr || end > m.addr + m.len {
            return Err(Denied::Bounds);
        }
        if !AccessFlags::from_bits_truncate(m.access).contains(need) {
            return Err(Denied::Access);
        }
        Ok(m.base.wrapping_add(addr - m.addr) as usize as *mut u8)
    }

    /// Copies `out.len()` bytes at byte `offset` of the message the gather list `sges`
    /// describes into `out`.
    pub(crate) fn gather(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u32,
        out: &mut [u8],
    ) -> Result<(), Denied> {
        self.walk(
            pd,
            sges,
            offset,
            out.len(),
            AccessFlags::empty(),
            |p, at, n| {
                // SAFETY: `check` found `p..p + n` inside a registered region (the registration
                // contract keeps it allocated); `out[at..at + n]` is in bounds (walk's contract).
                unsafe { core::ptr::copy(p, out.as_mut_ptr().add(at), n) }
            },
        )
    }

    /// Copies `data` to byte `offset` of the message the scatter list `sges` describes.
    pub(crate) fn scatter(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u32,
        data: &[u8],
    ) -> Result<(), Denied> {
        self.walk(
            pd,
            sges,
            offset,
            data.len(),
            AccessFlags::LOCAL_WRITE,
            |p, at, n| {
                // SAFETY: as in `gather`, with the region's local-write right checked.
                unsafe { core::ptr::copy(data.as_ptr().add(at), p, n) }
            },
        )
    }

    /// Calls `f(cpu address, position in the caller's buffer, length)` for each piece of
    /// `len` bytes at `offset` of the scatter/gather list, every piece checked first.
    fn walk(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u32,
        len: usize,
        need: AccessFlags,
        mut f: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), Denied> {
        if len == 0 {
            return Ok(());
        }
        let mut skip = u64::from(offset);
        let mut done = 0usize;
        // Bounded by the list's entries (at most MAX_SGE, checked when posted). Ends as soon
        // as the last byte is placed (most lists: in their first entry), before the next
        // entry is looked at.
        for s in sges {
            let l = u64::from(s.length);
            if skip >= l {
                skip -= l;
                continue;
            }
            // Not 0: `skip < l`, and `done < len` (the walk returns when they are equal).
            let n = ((l - skip) as usize).min(len - done);
            let a = s.addr.checked_add(skip).ok_or(Denied::Bounds)?;
            let p = self.check(s.lkey, pd, a, n as u64, need)?;
            f(p, done, n);
            done += n;
            if done == len {
                return Ok(());
            }
            skip = 0;
        }
        Err(Denied::Bounds)
    }
}

/// Bytes of a scatter/gather list.
pub(crate) fn sge_bytes(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}
