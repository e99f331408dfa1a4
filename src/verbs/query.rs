//! The queries rdma-core's extended API adds: a GID entry with its type
//! (`ibv_query_gid_ex`), the whole GID table (`ibv_query_gid_table`), a P_Key's index
//! (`ibv_get_pkey_index`), and CQs on a completion vector.

use core::mem::ManuallyDrop;

use super::{CompletionQueue, Context, Gid, GidType, Provider};
use crate::error::{Error, NotFound, Param, Result};

/// One bound entry of a port's GID table (`struct ibv_gid_entry`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the port's table.
    pub gid_index: u32,
    /// The port.
    pub port_num: u8,
    /// Its type.
    pub gid_type: GidType,
}

impl<P: Provider> Context<P> {
    /// The GID entry at `index` of port `port` (`ibv_query_gid_ex`).
    ///
    /// # Errors
    ///
    /// [`NotFound::GidEntry`] where nothing is bound (rdma-core's ENODATA);
    /// [`Error::InvalidInput`] for a port or an index out of range.
    pub fn query_gid_ex(&self, port: u8, index: u32) -> Result<GidEntry> {
        let gid = self.provider.query_gid(port, index)?;
        if gid == Gid::default() {
            return Err(Error::NotFound(NotFound::GidEntry { port, index }));
        }
        Ok(GidEntry {
            gid,
            gid_index: index,
            port_num: port,
            gid_type: self.provider.gid_type(port, index),
        })
    }

    /// Every bound GID entry of every port, in port then index order, into `out`
    /// (`ibv_query_gid_table`); returns how many.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for [`Param::GidTableBuffer`] when `out` is shorter than the
    /// valid entries (`value` its length, `max` the entries): nothing is truncated silently.
    pub fn query_gid_table(&self, out: &mut [GidEntry]) -> Result<usize> {
        let mut n = 0usize;
        for port in 1..=self.caps().phys_port_cnt {
            for (index, gid) in self.gid_table(port)? {
                if let Some(slot) = out.get_mut(n) {
                    *slot = GidEntry {
                        gid,
                        gid_index: index,
                        port_num: port,
                        gid_type: self.provider.gid_type(port, index),
                    };
                }
                n += 1;
            }
        }
        if n > out.len() {
            return Err(Error::invalid(
                Param::GidTableBuffer,
                out.len() as u64,
                n as u64,
            ));
        }
        Ok(n)
    }

    /// The index of `pkey` in port `port`'s P_Key table (`ibv_get_pkey_index`).
    ///
    /// # Errors
    ///
    /// [`NotFound::Pkey`] when the table does not hold it; the port query's errors.
    pub fn pkey_index(&self, port: u8, pkey: u16) -> Result<u16> {
        let len = self.query_port(port)?.pkey_tbl_len;
        // Bounded by the table's length as the device reports it (at most 65535 queries).
        for i in 0..len {
            if self.query_pkey(port, i)? == pkey {
                return Ok(i);
            }
        }
        Err(Error::NotFound(NotFound::Pkey { port, pkey }))
    }

    /// Completion vectors a CQ may name (`num_comp_vectors`).
    pub fn num_comp_vectors(&self) -> u32 {
        self.provider.num_comp_vectors()
    }

    /// Creates a completion queue of at least `entries` entries on completion vector
    /// `comp_vector` (`ibv_create_cq`'s last argument).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for [`Param::CompVector`] at or beyond
    /// [`num_comp_vectors`](Self::num_comp_vectors); as [`create_cq`](Self::create_cq).
    pub fn create_cq_on_vector(
        &self,
        entries: u32,
        comp_vector: u32,
    ) -> Result<CompletionQueue<'_, P>> {
        let vectors = self.num_comp_vectors();
        if comp_vector >= vectors {
            return Err(Error::invalid(
                Param::CompVector,
                comp_vector,
                vectors.saturating_sub(1),
            ));
        }
        // SAFETY: as in `create_cq`: owned by a CompletionQueue that borrows this context.
        let raw = unsafe { self.provider.create_cq(entries, None)? };
        Ok(CompletionQueue {
            ctx: self,
            raw: ManuallyDrop::new(raw),
        })
    }
}
