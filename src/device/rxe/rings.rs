//! The device's small frame and event queues: frames for the embedder's IP stack, frames the
//! device sent to its own address (loopback), and async events. Each is a fixed ring indexed
//! by wrapping counts, the slot the count modulo the size.

use super::{FRAME, LOOPBACK_FRAMES, STACK_FRAMES};

/// Async events kept until read.
const ASYNC_EVENTS: usize = 8;

/// The frames the IP stack has not read yet.
pub(crate) struct StackRing {
    frames: [[u8; 1536]; STACK_FRAMES],
    lens: [u16; STACK_FRAMES],
    head: u32,
    tail: u32,
    /// Frames dropped because the ring was full or the frame too long.
    pub(crate) dropped: u32,
}

impl StackRing {
    pub(crate) fn push(&mut self, frame: &[u8]) {
        if self.head.wrapping_sub(self.tail) as usize >= STACK_FRAMES || frame.len() > 1536 {
            self.dropped = self.dropped.wrapping_add(1);
            return;
        }
        let i = self.head as usize % STACK_FRAMES;
        self.frames[i][..frame.len()].copy_from_slice(frame);
        self.lens[i] = frame.len() as u16;
        self.head = self.head.wrapping_add(1);
    }

    pub(crate) fn pop(&mut self, buf: &mut [u8]) -> Option<usize> {
        // Bounded by the frames queued (at most STACK_FRAMES): each turn takes one.
        while self.head != self.tail {
            let i = self.tail as usize % STACK_FRAMES;
            self.tail = self.tail.wrapping_add(1);
            let n = usize::from(self.lens[i]);
            if let Some(out) = buf.get_mut(..n) {
                out.copy_from_slice(&self.frames[i][..n]);
                return Some(n);
            }
        }
        None
    }
}

/// Frames the device sent to its own address, waiting to be received (rxe loops them back
/// the same way).
pub(crate) struct Loopback {
    frames: [[u8; FRAME]; LOOPBACK_FRAMES],
    lens: [u16; LOOPBACK_FRAMES],
    head: u32,
    tail: u32,
    /// Frames to this interface that found the queue full: not built, their sender tries
    /// again at a later turn (as with a NIC out of transmit room).
    pub(crate) full: u64,
}

impl Loopback {
    /// Whether a frame would be queued now.
    pub(crate) fn has_room(&self) -> bool {
        (self.head.wrapping_sub(self.tail) as usize) < LOOPBACK_FRAMES
    }

    /// Queues a frame; `false` when the queue is full.
    pub(crate) fn push(&mut self, frame: &[u8]) -> bool {
        if self.head.wrapping_sub(self.tail) as usize >= LOOPBACK_FRAMES || frame.len() > FRAME {
            return false;
        }
        let i = self.head as usize % LOOPBACK_FRAMES;
        self.frames[i][..frame.len()].copy_from_slice(frame);
        self.lens[i] = frame.len() as u16;
        self.head = self.head.wrapping_add(1);
        true
    }

    /// Moves the oldest frame into `buf`.
    pub(crate) fn pop(&mut self, buf: &mut [u8]) -> Option<usize> {
        if self.head == self.tail {
            return None;
        }
        let i = self.tail as usize % LOOPBACK_FRAMES;
        self.tail = self.tail.wrapping_add(1);
        let n = usize::from(self.lens[i]).min(buf.len());
        buf[..n].copy_from_slice(&self.frames[i][..n]);
        Some(n)
    }
}

/// Async events raised and not yet read (`ibv_get_async_event`): the software device raises
/// only SRQ_LIMIT_REACHED, so an entry is the SRQ's number.
pub(crate) struct AsyncRing {
    srqs: [u32; ASYNC_EVENTS],
    head: u32,
    tail: u32,
}

impl AsyncRing {
    /// Records that SRQ `srq` went below its limit (the oldest event makes room).
    pub(crate) fn push(&mut self, srq: u32) {
        if self.head.wrapping_sub(self.tail) as usize >= ASYNC_EVENTS {
            self.tail = self.tail.wrapping_add(1);
        }
        self.srqs[self.head as usize % ASYNC_EVENTS] = srq;
        self.head = self.head.wrapping_add(1);
    }

    /// The oldest event.
    pub(crate) fn pop(&mut self) -> Option<u32> {
        if self.head == self.tail {
            return None;
        }
        let s = self.srqs[self.tail as usize % ASYNC_EVENTS];
        self.tail = self.tail.wrapping_add(1);
        Some(s)
    }
}
