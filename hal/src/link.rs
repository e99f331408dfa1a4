//! The link seam: whole Ethernet frames in and out of a NIC, for the software RoCEv2 device.
//!
//! A frame starts at the destination MAC and ends with the payload (no FCS); the NIC adds
//! and strips whatever its hardware needs (a virtio-net header, padding to 60 bytes). The
//! transport polls the link from its own calls (post, poll), so the seam needs no thread and
//! no interrupt.
//!
//! Frames need not be copied across the seam. [`Link::transmit_with`] lets the transport build
//! a frame (headers, payload, ICRC) straight in the NIC's transmit buffer, and
//! [`Link::receive_with`] / [`Link::receive_if`] show a received frame where the NIC put it, so
//! that a frame not for this interface is dropped before any copy or check. Their default
//! methods go through [`Link::transmit`] and [`Link::receive`] with a caller's scratch buffer
//! (one copy each way), so a NIC that implements only those keeps working.
//!
//! A NIC that can filter in hardware (or whose device model can: virtio-net's
//! `VIRTIO_NET_F_CTRL_RX` with promiscuous mode off) should take only frames to its own MAC,
//! broadcast and the multicast groups asked for: those are all the transport looks at, and a
//! shared segment (a QEMU socket or multicast netdev echoes every frame, the sender's own
//! included) otherwise costs a ring slot and a look per foreign frame. A promiscuous NIC
//! (virtio-net through virtio-drivers 0.13, which negotiates no control queue) hands every
//! frame on; the transport then drops foreign ones in [`Link::receive_if`]'s test, uncopied.

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

    /// Whether the NIC itself spaces out what it is given: the device takes the frames from
    /// its ring in its own time, a ring's worth at most (virtio-net, whose device transmits
    /// from its own thread after a notification), so a burst cannot leave faster than the
    /// device sends. The default, `false`, is a NIC that puts each frame on the wire as it is
    /// posted (QEMU's igb and e1000e send within the tail write): the software RoCE device then
    /// paces its READ responses itself.
    fn paces_itself(&self) -> bool {
        false
    }

    /// Takes frames to the Ethernet multicast group `group` from now on (IPv6 neighbour
    /// discovery's solicited-node groups, 33:33:ff:xx:xx:xx). A NIC that filters by group
    /// (a multicast table) sets the group's entry; the default does nothing, for a NIC that
    /// hands every group frame on (promiscuous, or one that takes all multicast).
    fn join_multicast(&mut self, group: [u8; 6]) {
        let _ = group;
    }

    /// Moves the next received frame into `buf` and returns its length, or `None` when no
    /// frame has arrived. A frame longer than `buf` is dropped (and the next one looked at).
    fn receive(&mut self, buf: &mut [u8]) -> Option<usize>;

    /// Builds one frame in the NIC's own transmit buffer and sends it: `build` gets a buffer of
    /// at most [`max_frame`](Self::max_frame) bytes (its content is whatever an earlier frame
    /// left) and returns the frame's length, or `None` to send nothing (the slot stays free).
    /// `Ok(Some(len))` once sent; `Ok(None)` when `build` declined; [`LinkError::Busy`] (and
    /// `build` not called) when no transmit slot is free; [`LinkError::Size`] when `build`
    /// returned an empty frame or one longer than its buffer.
    ///
    /// The default asks [`tx_ready`](Self::tx_ready), builds in `scratch` and sends it with
    /// [`transmit`](Self::transmit) (one copy); a NIC with its own transmit buffers leaves
    /// `scratch` alone.
    fn transmit_with<F>(&mut self, scratch: &mut [u8], build: F) -> Result<Option<usize>, LinkError>
    where
        F: FnOnce(&mut [u8]) -> Option<usize>,
        Self: Sized,
    {
        // Asked first, so that a full ring costs a question, not a frame built and dropped.
        if !self.tx_ready() {
            return Err(LinkError::Busy);
        }
        let room = scratch.len().min(self.max_frame());
        let Some(n) = build(&mut scratch[..room]) else {
            return Ok(None);
        };
        if n == 0 || n > room {
            return Err(LinkError::Size);
        }
        self.transmit(&scratch[..n]).map(|()| Some(n))
    }

    /// Shows the next received frame to `f` where it lies (in the NIC's own receive buffer)
    /// and returns what `f` made of it, or `None` when no frame has arrived. The buffer goes
    /// back to the NIC when `f` returns: what must outlive the call, `f` copies.
    ///
    /// The default receives into `scratch` with [`receive`](Self::receive) (one copy; frames
    /// longer than `scratch` are dropped); a NIC with its own receive buffers leaves `scratch`
    /// alone and shows every frame it holds.
    fn receive_with<R, F>(&mut self, scratch: &mut [u8], f: F) -> Option<R>
    where
        F: FnOnce(&[u8]) -> R,
        Self: Sized,
    {
        let n = self.receive(scratch)?;
        scratch.get(..n).map(f)
    }

    /// Receives the next frame into `buf` if `want` takes it, looked at where the NIC put it:
    /// `Some(Some(len))` when copied, `Some(None)` when `want` refused it (or it is longer than
    /// `buf`) and it was dropped uncopied, `None` when no frame has arrived. The transport's
    /// receive: a frame not for this interface costs a look at its first bytes, not a copy.
    ///
    /// The default is [`receive`](Self::receive) followed by `want` (the copy first).
    fn receive_if<F>(&mut self, buf: &mut [u8], want: F) -> Option<Option<usize>>
    where
        F: FnOnce(&[u8]) -> bool,
        Self: Sized,
    {
        let n = self.receive(buf)?;
        Some(buf.get(..n).is_some_and(want).then_some(n))
    }
}

/// Copies a frame the NIC holds into `buf` when `want` takes it and it fits: the body of
/// [`Link::receive_if`] for a NIC that shows frames in place (its [`Link::receive_with`]).
pub fn copy_if(frame: &[u8], buf: &mut [u8], want: impl FnOnce(&[u8]) -> bool) -> Option<usize> {
    let dst = buf.get_mut(..frame.len())?;
    if !want(frame) {
        return None;
    }
    dst.copy_from_slice(frame);
    Some(frame.len())
}
