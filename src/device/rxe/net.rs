//! Sending one RoCEv2 frame: the outer headers from a route, the transport headers, the
//! payload copied straight from registered memory into the transmit buffer, the ICRC.

use bareverbs_hal::{Link, LinkError};

use super::mem::{Denied, MrTable};
use super::tables::Tables;
use super::wire::bth::Headers;
use super::wire::packet::{Route, begin, finish};
use crate::events::EventHub;

/// What the transport works with while it holds the device lock.
pub(crate) struct Net<'a, L: Link> {
    pub(crate) link: &'a mut L,
    pub(crate) t: &'a mut Tables,
    pub(crate) tx: &'a mut [u8],
    pub(crate) hub: &'a EventHub,
    pub(crate) now: u64,
    /// The port's active MTU (UD messages larger than it are not sent).
    pub(crate) mtu: u32,
}

/// Why a frame was not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unsent {
    /// The NIC has no free transmit slot now: try again later.
    Busy,
    /// The payload's memory was refused.
    Denied(Denied),
    /// The frame could not be built or the NIC refused it (lost, as on a wire).
    Lost,
}

impl<L: Link> Net<'_, L> {
    /// Sends a frame with `headers` and `len` payload bytes that `fill` writes.
    pub(crate) fn send(
        &mut self,
        route: &Route,
        headers: &Headers,
        len: usize,
        fill: impl FnOnce(&MrTable, &mut [u8]) -> Result<(), Denied>,
    ) -> Result<(), Unsent> {
        let id = self.t.ip_id;
        self.t.ip_id = id.wrapping_add(1);
        let at = begin(self.tx, route, id, headers, len).ok_or(Unsent::Lost)?;
        let payload = self.tx.get_mut(at..at + len).ok_or(Unsent::Lost)?;
        fill(&self.t.mrs, payload).map_err(Unsent::Denied)?;
        let n = finish(self.tx).ok_or(Unsent::Lost)?;
        if route.dst_ip == route.src_ip {
            // To this interface: looped back, never on the wire.
            return if self.t.loopback.push(&self.tx[..n]) {
                Ok(())
            } else {
                Err(Unsent::Busy)
            };
        }
        match self.link.transmit(&self.tx[..n]) {
            Ok(()) => Ok(()),
            Err(LinkError::Busy) => Err(Unsent::Busy),
            Err(_) => Err(Unsent::Lost),
        }
    }
}
