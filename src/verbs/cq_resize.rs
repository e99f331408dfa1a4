//! `ibv_resize_cq`.

use super::{CompletionQueue, Provider};
use crate::error::Result;

impl<P: Provider> CompletionQueue<'_, P> {
    /// Resizes the CQ to at least `entries` entries (`ibv_resize_cq`); [`entries`](Self::entries)
    /// then says how many it has. A size it already has succeeds without asking the device.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for more entries than the device
    /// allows ([`Param::CqEntries`](crate::error::Param::CqEntries)) or fewer than the CQEs
    /// its queue pairs keep reserved
    /// ([`Param::CqEntriesInUse`](crate::error::Param::CqEntriesInUse));
    /// [`Error::Unsupported`](crate::Error::Unsupported) with
    /// [`Feature::ResizeCq`](crate::error::Feature::ResizeCq) when the device cannot grow it
    /// (QEMU's PVRDMA).
    pub fn resize(&mut self, entries: u32) -> Result<()> {
        let ctx = self.ctx;
        ctx.provider().resize_cq(&mut self.raw, entries)
    }
}
