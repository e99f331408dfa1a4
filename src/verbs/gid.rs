//! Listing a port's GID table without a heap: an iterator that asks the provider for the next
//! bound entry each step.

use super::{Context, Gid, Provider};

/// The bound entries of a port's GID table, (index, GID) in index order
/// ([`Context::gid_table`]).
pub struct GidEntries<'c, P: Provider> {
    ctx: &'c Context<P>,
    port: u8,
    next: u32,
}

impl<'c, P: Provider> GidEntries<'c, P> {
    pub(super) fn new(ctx: &'c Context<P>, port: u8) -> Self {
        GidEntries { ctx, port, next: 0 }
    }
}

impl<P: Provider> Iterator for GidEntries<'_, P> {
    type Item = (u32, Gid);

    fn next(&mut self) -> Option<(u32, Gid)> {
        // The port was checked when the listing started: an error cannot come now, and ends
        // the listing if it does.
        let (index, gid) = self.ctx.provider().next_gid(self.port, self.next).ok()??;
        self.next = index.checked_add(1)?;
        Some((index, gid))
    }
}
