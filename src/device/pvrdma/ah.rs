//! Address handles: on PVRDMA a driver-side value (QEMU keeps no AH objects, §11), the
//! address-vector words of a UD send WQE computed once (L-ABI `pvrdma_av`, §8.5).

use bareverbs_hal::Hal;

use super::{Pd, Pvrdma};
use crate::error::{Error, Param, Result};
use crate::verbs::AddressVector;

/// A prepared UD destination.
#[derive(Clone, Copy, Debug)]
pub struct Ah {
    /// sl_tclass_flowlabel, the DGID's four words, and the word holding the source GID index
    /// (byte 0x41 of the WQE) and the hop limit.
    pub(crate) words: [u32; 6],
}

impl<H: Hal> Pvrdma<H> {
    pub(crate) fn create_ah_impl(&self, _pd: &Pd, av: &AddressVector) -> Result<Ah> {
        // QEMU loops forever on a send whose GID index it cannot map (§8.6, §14): only a GID
        // this driver bound may be named.
        if !self.state.lock().gid_bound(u32::from(av.sgid_index)) {
            let max = self.caps.gid_tbl_len.saturating_sub(1);
            return Err(Error::invalid(Param::GidIndex, av.sgid_index, max));
        }
        let g = av.dgid.0;
        let word = |i: usize| u32::from_ne_bytes([g[i], g[i + 1], g[i + 2], g[i + 3]]);
        Ok(Ah {
            words: [
                (u32::from(av.traffic_class) << 20) | av.flow_label,
                word(0),
                word(4),
                word(8),
                word(12),
                (u32::from(av.hop_limit) << 24) | (u32::from(av.sgid_index) << 8) | 0x80,
            ],
        })
    }
}
