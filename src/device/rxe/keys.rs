//! Keys beyond registered regions, in the region table: memory windows (type 1 and 2) and
//! regions for fast registration — allocated, bound or registered over a registered region
//! by a send queue's work request, invalidated locally or by a peer's SEND with invalidate
//! (`docs/architecture.md`, "Memory windows and fast registration"; `docs/roce-v2.md` for
//! the IETH). A key from the network is looked up by its index bits: one slot, no search.

use super::mem::{Denied, KEY_INDEX, MrEntry, MrTable, kind};
use crate::verbs::{AccessFlags, MwType, Sge};

/// The rights a write lands by: the memory behind them must be locally writable.
const WRITES: AccessFlags = AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_ATOMIC);
/// The rights a window grants.
const REMOTE: AccessFlags = AccessFlags::REMOTE_READ.union(WRITES);

/// The slot a key names (its index bits: always inside the table).
fn slot(key: u32) -> usize {
    ((key & KEY_INDEX) >> 8) as usize
}

/// A bind as the send queue holds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bind {
    pub(crate) mw: u32,
    pub(crate) kind: MwType,
    pub(crate) new_rkey: u32,
    pub(crate) mr_lkey: u32,
    pub(crate) addr: u64,
    pub(crate) length: u64,
    pub(crate) access: AccessFlags,
}

/// A fast registration as the send queue holds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reg {
    pub(crate) mr: u32,
    pub(crate) new_key: u32,
    pub(crate) sge: Sge,
    pub(crate) iova: u64,
    pub(crate) access: AccessFlags,
}

impl MrTable {
    /// Allocates an unbound key of `kind` in `pd` (`max_len`: the bytes a fast registration
    /// may map); `None` when the table is full.
    pub(crate) fn add_key(&mut self, pd: u32, k: u8, max_len: u64) -> Option<u32> {
        let key = self.add(0, 0, pd, AccessFlags::empty())?;
        let m = &mut self.entries[slot(key)];
        m.kind = k;
        m.valid = false;
        m.max_len = max_len;
        Some(key)
    }

    /// Frees the window or fast-registration key whose slot `handle` names (whatever its
    /// key is now), releasing the region it is over.
    pub(crate) fn free_key(&mut self, handle: u32) {
        let i = slot(handle);
        if self.entries[i].key != 0 && self.entries[i].kind != kind::MR {
            self.release(i);
            self.entries[i].key = 0;
            self.entries[i].kind = kind::MR;
        }
    }

    /// Windows and fast registrations over the region with `key`.
    pub(crate) fn binds(&self, key: u32) -> u16 {
        let m = &self.entries[slot(key)];
        if m.key == key && m.kind == kind::MR {
            m.binds
        } else {
            0
        }
    }

    /// Ends access through slot `i` and releases the region it was over.
    fn release(&mut self, i: usize) {
        let p = usize::from(self.entries[i].parent);
        if let Some(parent) = p.checked_sub(1).and_then(|p| self.entries.get_mut(p)) {
            parent.binds = parent.binds.saturating_sub(1);
        }
        let m = &mut self.entries[i];
        (m.parent, m.valid, m.qpn, m.access, m.len) = (0, false, 0, 0, 0);
    }

    /// The registered region (not a window, not a fast registration) with `lkey` in `pd`,
    /// when `addr..addr + len` is inside it: its slot and entry.
    fn region(&self, lkey: u32, pd: u32, addr: u64, len: u64) -> Option<(usize, MrEntry)> {
        let i = slot(lkey);
        let m = self.entries[i];
        let end = addr.checked_add(len)?;
        let ok = m.key != 0
            && m.key == lkey
            && m.kind == kind::MR
            && m.valid
            && m.pd == pd
            && addr >= m.addr
            && end <= m.addr + m.len;
        ok.then_some((i, m))
    }

    /// Gives slot `i` access to `len` bytes at `addr` (CPU: `base`) over the region in slot
    /// `p`, under `key`.
    #[allow(clippy::too_many_arguments)]
    fn map(&mut self, i: usize, p: usize, key: u32, addr: u64, len: u64, base: u64, access: u32) {
        self.release(i);
        let m = &mut self.entries[i];
        (m.key, m.addr, m.len, m.base, m.access) = (key, addr, len, base, access);
        (m.valid, m.parent) = (true, p as u16 + 1);
        let parent = &mut self.entries[p];
        parent.binds = parent.binds.saturating_add(1);
    }

    /// Executes a bind posted on QP `qpn` of PD `pd`; `false` when it is refused (the bind
    /// error).
    pub(crate) fn bind(&mut self, pd: u32, qpn: u32, b: &Bind) -> bool {
        let i = slot(b.mw);
        let m = self.entries[i];
        let want = match b.kind {
            MwType::Type1 => kind::MW1,
            MwType::Type2 => kind::MW2,
        };
        let same_slot = b.new_rkey & !0xFF == b.mw & !0xFF;
        if m.key == 0 || m.key != b.mw || m.kind != want || m.pd != pd || !same_slot {
            return false;
        }
        // A type 2 window is bound again only after an invalidation.
        if want == kind::MW2 && m.valid {
            return false;
        }
        if b.length == 0 {
            // Unbinds a type 1 window (a type 2 window is unbound by invalidation).
            if want == kind::MW2 || b.new_rkey == 0 {
                return false;
            }
            self.release(i);
            self.entries[i].key = b.new_rkey;
            return true;
        }
        let Some((p, parent)) = self.region(b.mr_lkey, pd, b.addr, b.length) else {
            return false;
        };
        let rights = AccessFlags::from_bits_truncate(parent.access);
        if !rights.contains(AccessFlags::MW_BIND)
            || (b.access.intersects(WRITES) && !rights.contains(AccessFlags::LOCAL_WRITE))
            || b.new_rkey == 0
        {
            return false;
        }
        let base = parent.base.wrapping_add(b.addr - parent.addr);
        let access = (b.access & REMOTE).bits();
        self.map(i, p, b.new_rkey, b.addr, b.length, base, access);
        if want == kind::MW2 {
            self.entries[i].qpn = qpn;
        }
        true
    }

    /// Executes a fast registration posted on a QP of PD `pd`; `false` when it is refused.
    pub(crate) fn register_fast(&mut self, pd: u32, r: &Reg) -> bool {
        let i = slot(r.mr);
        let m = self.entries[i];
        let len = u64::from(r.sge.length);
        let same_slot = r.new_key & !0xFF == r.mr & !0xFF;
        if m.key == 0 || m.key != r.mr || m.kind != kind::FAST || m.pd != pd || !same_slot {
            return false;
        }
        // Registered again only after an invalidation (as rxe: "only in the free state").
        if m.valid || len == 0 || len > m.max_len || r.iova.checked_add(len).is_none() {
            return false;
        }
        let Some((p, parent)) = self.region(r.sge.lkey, pd, r.sge.addr, len) else {
            return false;
        };
        let writes = r.access.intersects(WRITES | AccessFlags::LOCAL_WRITE);
        let parent_writes =
            AccessFlags::from_bits_truncate(parent.access).contains(AccessFlags::LOCAL_WRITE);
        let needs_local =
            r.access.intersects(WRITES) && !r.access.contains(AccessFlags::LOCAL_WRITE);
        if (writes && !parent_writes) || needs_local || r.new_key == 0 {
            return false;
        }
        let base = parent.base.wrapping_add(r.sge.addr - parent.addr);
        let access = (r.access - AccessFlags::MW_BIND).bits();
        self.map(i, p, r.new_key, r.iova, len, base, access);
        true
    }

    /// Invalidates `key` for a QP of PD `pd` — a fast-registered region's, or a type 2
    /// window's (from the network, `qpn`: only the window bound to that QP). A key that
    /// names nothing, another PD's, a registered region's or a type 1 window's is refused and
    /// nothing changes.
    pub(crate) fn invalidate(&mut self, key: u32, pd: u32, qpn: Option<u32>) -> Result<(), Denied> {
        let i = slot(key);
        let m = self.entries[i];
        if m.key == 0 || m.key != key || m.pd != pd {
            return Err(Denied::Key);
        }
        match m.kind {
            kind::FAST => {}
            kind::MW2 if qpn.is_none_or(|q| q == m.qpn) => {}
            _ => return Err(Denied::Key),
        }
        self.release(i);
        Ok(())
    }

    /// As [`check`](MrTable::check), for a peer's request on QP `qpn`: a type 2 window
    /// serves only the QP it is bound to.
    pub(crate) fn check_qp(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<*mut u8, Denied> {
        let m = &self.entries[slot(key)];
        if m.kind == kind::MW2 && m.key == key && m.qpn != qpn {
            return Err(Denied::Key);
        }
        self.check(key, pd, addr, len, need)
    }

    /// Unbinds the type 2 windows bound to QP `qpn` (it is being destroyed: its number may
    /// be given again). Bounded by the table's slots.
    pub(crate) fn unbind_qp(&mut self, qpn: u32) {
        for i in 0..self.entries.len() {
            let m = &self.entries[i];
            if m.key != 0 && m.kind == kind::MW2 && m.valid && m.qpn == qpn {
                self.release(i);
            }
        }
    }
}
