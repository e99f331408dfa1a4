//! The GID table as the driver knows it: PVRDMA has no command that reads the table back
//! (`shared/pvrdma-abi.md` §5.2), so the driver answers `ibv_query_gid` from what it bound
//! (CREATE_BIND) and unbound (DESTROY_BIND). The bitmap of bound indices is the command lock's
//! (`State::gids`); the values are kept in a driver-private page held by the channel, allocated
//! at the first bind and freed when the last GID goes.

use bareverbs_hal::Hal;

use super::{Pvrdma, State};
use crate::dma::Dma;
use crate::error::{Error, Param, Result};
use crate::verbs::Gid;

/// Entries QEMU's table has (CREATE_BIND refuses an index ≥ 255).
const QEMU_GIDS: u32 = 255;

impl<H: Hal> State<H> {
    /// Makes room to remember a GID (before it is bound: a failure leaves the device
    /// untouched).
    pub(super) fn gid_room(&mut self, hal: &H) -> Result<()> {
        if self.chan.gid_values.is_none() {
            self.chan.gid_values = Some(Dma::new(hal, 1)?);
        }
        Ok(())
    }

    /// Remembers that `gid` is bound at `index` (< 256: checked by the caller).
    pub(super) fn remember_gid(&mut self, index: u32, gid: Gid) {
        if let Some(page) = &self.chan.gid_values {
            page.write(index as usize * 16, gid.0);
        }
    }

    /// Forgets the GID at `index`; the page goes when no GID is bound.
    pub(super) fn forget_gid(&mut self, index: u32) {
        if let Some(page) = &self.chan.gid_values {
            page.write(index as usize % 256 * 16, [0u8; 16]);
        }
        if self.gids == [0; 4] {
            self.chan.gid_values = None;
        }
    }

    /// The GID bound at `index`, if one is.
    fn bound_gid(&self, index: u32) -> Option<Gid> {
        let page = self.chan.gid_values.as_ref()?;
        self.gid_bound(index)
            .then(|| Gid(page.read(index as usize * 16)))
    }
}

impl<H: Hal> Pvrdma<H> {
    /// Entries of port `port`'s GID table a query may name (the device's length, at most
    /// QEMU's 255), or why `port` cannot be queried.
    fn gid_table_len(&self, port: u8) -> Result<u32> {
        if port == 0 || port > self.caps.phys_port_cnt {
            return Err(Error::invalid(Param::Port, port, self.caps.phys_port_cnt));
        }
        Ok(self.caps.gid_tbl_len.min(QEMU_GIDS))
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
        Ok(self.state.lock().bound_gid(index).unwrap_or(Gid([0; 16])))
    }

    /// The first bound entry of port `port` at or after `from`.
    pub(crate) fn next_gid_impl(&self, port: u8, from: u32) -> Result<Option<(u32, Gid)>> {
        let len = self.gid_table_len(port)?;
        let st = self.state.lock();
        Ok((from..len).find_map(|i| st.bound_gid(i).map(|g| (i, g))))
    }
}
