//! The GID table as the driver knows it: PVRDMA has no command that reads the table back
//! (`docs/pvrdma.md` §5.2), so the driver answers `ibv_query_gid` from what it bound
//! (CREATE_BIND) and unbound (DESTROY_BIND). The bitmap of bound indices is the command lock's
//! (`State::gids`); the values are kept in a driver-private page allocated at bring-up with
//! the QP table (`QpTable::gid_value`), written under the command lock.

use bareverbs_hal::Hal;

use super::Pvrdma;
use crate::error::{Error, Param, Result};
use crate::verbs::Gid;

/// Entries QEMU's table has (CREATE_BIND refuses an index ≥ 255).
const QEMU_GIDS: u32 = 255;

impl<H: Hal> Pvrdma<H> {
    /// Records the value bound at `index` (the caller holds the command lock; `index` < 256,
    /// checked by the bind).
    pub(super) fn remember_gid(&self, index: u32, gid: Gid) {
        if let Ok(i) = u8::try_from(index) {
            self.qps.set_gid_value(i, gid.0);
        }
    }

    /// Entries of port `port`'s GID table a query may name (the device's length, at most
    /// QEMU's 255), or why `port` cannot be queried.
    fn gid_table_len(&self, port: u8) -> Result<u32> {
        if port == 0 || port > self.caps.phys_port_cnt {
            return Err(Error::invalid(Param::Port, port, self.caps.phys_port_cnt));
        }
        Ok(self.caps.gid_tbl_len.min(QEMU_GIDS))
    }

    /// The GID bound at `index` (< the table length), if one is; the caller holds the command
    /// lock (`bound`: its bitmap says so).
    fn bound_gid(&self, index: u32, bound: bool) -> Option<Gid> {
        let i = u8::try_from(index).ok()?;
        bound.then(|| Gid(self.qps.gid_value(i)))
    }

    /// `ibv_query_gid`: the GID at `index` of port `port`; the zero GID for an index in range
    /// that nothing is bound at.
    pub(crate) fn query_gid_impl(&self, port: u8, index: u32) -> Result<Gid> {
        let len = self.gid_table_len(port)?;
        if index >= len {
            return Err(Error::invalid(
                Param::GidIndex,
                index,
                len.saturating_sub(1),
            ));
        }
        let st = self.state.lock();
        let g = self.bound_gid(index, st.gid_bound(index));
        Ok(g.unwrap_or(Gid([0; 16])))
    }

    /// The first bound entry of port `port` at or after `from`.
    pub(crate) fn next_gid_impl(&self, port: u8, from: u32) -> Result<Option<(u32, Gid)>> {
        let len = self.gid_table_len(port)?;
        let st = self.state.lock();
        Ok((from..len).find_map(|i| self.bound_gid(i, st.gid_bound(i)).map(|g| (i, g))))
    }
}
