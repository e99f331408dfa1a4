//! smoltcp's view of the NIC: a [`smoltcp::phy::Device`] over any [`Link`], with one receive
//! and one transmit frame buffer inside the struct (no heap).
//!
//! # A busy transmit ring
//!
//! smoltcp hands a frame to a transmit token and forgets it: when the token's `consume`
//! returns, the frame counts as sent. A [`Link::transmit`] that fails with
//! [`LinkError::Busy`] (every NIC slot in use) would therefore lose it silently. Instead the
//! frame stays in the device's transmit buffer, *deferred*, and is retried first by every
//! later call (`receive`, `transmit`, [`LinkDevice::flush`]). While it cannot go out,
//! [`Device::transmit`] hands smoltcp no token, so smoltcp keeps its own data and tries again
//! at its next poll: nothing it sends of its own accord is lost. Only a frame that smoltcp
//! produces *while answering a received one* (an ACK, an RST) can meet a deferred frame still
//! stuck in the buffer; that one is dropped and counted ([`DeviceCounts::tx_dropped`]), and
//! TCP recovers it (the peer retransmits, the ACK is repeated). A frame the link refuses for
//! good ([`LinkError::Size`], [`LinkError::Device`]) is dropped and counted too.

use bareverbs_hal::{Link, LinkError};
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant;

/// The largest frame the device carries: 1500 bytes of IP plus the 14-byte Ethernet header.
pub const FRAME: usize = 1514;

/// What the device did, by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounts {
    /// Frames received and given to smoltcp.
    pub rx: u64,
    /// Frames the link accepted.
    pub tx: u64,
    /// Transmits the link refused as busy (the frame was kept and retried).
    pub tx_deferred: u64,
    /// Frames dropped because a deferred one still held the buffer.
    pub tx_dropped: u64,
    /// Frames the link refused for good (size, device failure).
    pub tx_errors: u64,
}

/// A [`Link`] as a smoltcp Ethernet device.
pub struct LinkDevice<L: Link> {
    link: L,
    rx: [u8; FRAME],
    tx: [u8; FRAME],
    /// Length of a frame in `tx` that the link refused as busy.
    deferred: Option<usize>,
    counts: DeviceCounts,
}

impl<L: Link> LinkDevice<L> {
    /// The device over `link`.
    pub fn new(link: L) -> Self {
        LinkDevice {
            link,
            rx: [0; FRAME],
            tx: [0; FRAME],
            deferred: None,
            counts: DeviceCounts::default(),
        }
    }

    /// The link.
    pub fn link(&self) -> &L {
        &self.link
    }

    /// The link, to use it directly (for example to receive RoCE frames the stack never sees).
    pub fn link_mut(&mut self) -> &mut L {
        &mut self.link
    }

    /// Frames handled so far.
    pub fn counts(&self) -> DeviceCounts {
        self.counts
    }

    /// Whether a frame refused as busy is still waiting to go out.
    pub fn has_deferred(&self) -> bool {
        self.deferred.is_some()
    }

    /// Retries a deferred frame; `true` when none is left waiting.
    pub fn flush(&mut self) -> bool {
        flush(
            &mut self.link,
            &self.tx,
            &mut self.deferred,
            &mut self.counts,
        )
    }

    /// The largest frame smoltcp may build: the link's limit, at most [`FRAME`].
    fn mtu(&self) -> usize {
        self.link.max_frame().min(FRAME)
    }
}

/// Sends the deferred frame in `tx`, if any: `true` when nothing is left waiting.
fn flush<L: Link>(
    link: &mut L,
    tx: &[u8; FRAME],
    deferred: &mut Option<usize>,
    counts: &mut DeviceCounts,
) -> bool {
    let Some(len) = *deferred else {
        return true;
    };
    match link.transmit(&tx[..len]) {
        Ok(()) => {
            counts.tx += 1;
            *deferred = None;
            true
        }
        Err(LinkError::Busy) => false,
        Err(_) => {
            counts.tx_errors += 1;
            *deferred = None;
            true
        }
    }
}

impl<L: Link> Device for LinkDevice<L> {
    type RxToken<'a>
        = RxToken<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = TxToken<'a, L>
    where
        Self: 'a;

    fn receive(&mut self, _: Instant) -> Option<(RxToken<'_>, TxToken<'_, L>)> {
        flush(
            &mut self.link,
            &self.tx,
            &mut self.deferred,
            &mut self.counts,
        );
        let len = self.link.receive(&mut self.rx)?;
        // A link that reports more than the buffer holds is wrong; take no frame from it.
        let frame = self.rx.get(..len)?;
        self.counts.rx += 1;
        let tx = TxToken {
            link: &mut self.link,
            buf: &mut self.tx,
            deferred: &mut self.deferred,
            counts: &mut self.counts,
        };
        Some((RxToken { frame }, tx))
    }

    fn transmit(&mut self, _: Instant) -> Option<TxToken<'_, L>> {
        if !self.flush() {
            return None;
        }
        Some(TxToken {
            link: &mut self.link,
            buf: &mut self.tx,
            deferred: &mut self.deferred,
            counts: &mut self.counts,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        // For an Ethernet device smoltcp counts the Ethernet header in the MTU.
        caps.max_transmission_unit = self.mtu();
        caps.max_burst_size = Some(1);
        caps
    }
}

/// One received frame, lent to smoltcp.
pub struct RxToken<'a> {
    frame: &'a [u8],
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.frame)
    }
}

/// The transmit buffer, lent to smoltcp for one frame.
pub struct TxToken<'a, L: Link> {
    link: &'a mut L,
    buf: &'a mut [u8; FRAME],
    deferred: &'a mut Option<usize>,
    counts: &'a mut DeviceCounts,
}

impl<L: Link> phy::TxToken for TxToken<'_, L> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        // smoltcp never builds a frame above the MTU it was given (at most FRAME).
        let len = len.min(FRAME);
        if !flush(self.link, self.buf, self.deferred, self.counts) {
            // The buffer still holds the deferred frame: let smoltcp build this one in a
            // scratch buffer and drop it (TCP recovers; see the module docs).
            self.counts.tx_dropped += 1;
            let mut scratch = [0u8; FRAME];
            return f(&mut scratch[..len]);
        }
        let r = f(&mut self.buf[..len]);
        match self.link.transmit(&self.buf[..len]) {
            Ok(()) => self.counts.tx += 1,
            Err(LinkError::Busy) => {
                self.counts.tx_deferred += 1;
                *self.deferred = Some(len);
            }
            Err(_) => self.counts.tx_errors += 1,
        }
        r
    }
}
