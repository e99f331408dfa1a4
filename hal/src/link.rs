//! The link seam: whole Ethernet frames in and out of a NIC, for the software RoCEv2 device.
//!
//! A frame starts at the destination MAC and ends with the payload (no FCS); the NIC adds
//! and strips whatever its hardware needs (a virtio-net header, padding to 60 bytes). The
//! transport polls the link from its own calls (post, poll), so the seam needs no thread and
//! no interrupt.

/// Why a frame could not be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkError {
    /// Every transmit slot is in use: try again after the NIC completed some.
    Busy,
    /// Larger than [`Link::max_frame`] (or empty).
    Size,
    /// The NIC failed (for example a queue the device reported broken).
    Device,
}

/// A NIC as the software RoCE transport uses it.
pub trait Link {
    /// The interface's MAC address.
    fn mac(&self) -> [u8; 6];

    /// The largest frame it carries, Ethernet header included, FCS excluded: 1514 for the
    /// usual IP MTU of 1500.
    fn max_frame(&self) -> usize;

    /// Sends one frame (copied: `frame` may be reused when this returns).
    fn transmit(&mut self, frame: &[u8]) -> Result<(), LinkError>;

    /// Whether [`transmit`](Self::transmit) would find a free transmit slot now. The
    /// transport asks before it builds a frame (headers, payload copy, ICRC), so that a full
    /// ring costs a question, not a frame built and thrown away. A hint: `transmit` may still
    /// say [`LinkError::Busy`]. The default says yes (a NIC that cannot tell).
    fn tx_ready(&mut self) -> bool {
        true
    }

    /// Moves the next received frame into `buf` and returns its length, or `None` when no
    /// frame has arrived. A frame longer than `buf` is dropped (and the next one looked at).
    fn receive(&mut self, buf: &mut [u8]) -> Option<usize>;
}
