//! The link's DMA memory (`Pages`: the frame buffers and the queues' pages), which buffer
//! slots the device holds (`Slots`), and where a received frame lies in its buffer
//! (`frame_range`, from lengths the device reported).

use core::ops::Range;
use core::ptr::NonNull;

use super::{BUFFER_SIZE, QUEUE_SIZE, StaticHal, VirtioNetError};
use crate::{DmaBlock, Hal, PAGE_SIZE};

/// Where the frame lies in a receive buffer of `buffer_len` bytes, given the header and packet
/// lengths the device reported, if it is a frame at all and fits the caller's `room`.
pub(super) fn frame_range(
    hdr: usize,
    len: usize,
    buffer_len: usize,
    room: usize,
) -> Option<Range<usize>> {
    let end = hdr.checked_add(len)?;
    (len > 0 && end <= buffer_len && len <= room).then_some(hdr..end)
}

/// A block of DMA memory the link owns: the buffers (receive slots first, then transmit
/// slots) or the queues' pages.
pub(super) struct Pages<S: StaticHal> {
    paddr: u64,
    vaddr: NonNull<u8>,
    pages: usize,
    _hal: core::marker::PhantomData<S>,
}

impl<S: StaticHal> Pages<S> {
    pub(super) fn new(hal: &S::Hal, pages: usize) -> Result<Self, VirtioNetError> {
        let block = hal.dma_alloc(pages).map_err(|_| VirtioNetError::OutOfDma)?;
        Ok(Pages {
            paddr: block.paddr,
            vaddr: block.vaddr,
            pages,
            _hal: core::marker::PhantomData,
        })
    }

    /// The CPU address of page `i`.
    pub(super) fn page(&self, i: usize) -> NonNull<u8> {
        assert!(i < self.pages);
        // SAFETY: inside the block (`i` is in range).
        unsafe { self.vaddr.add(i * PAGE_SIZE) }
    }

    /// The bus address of page `i`.
    pub(super) fn paddr(&self, i: usize) -> u64 {
        self.paddr_at(i * PAGE_SIZE)
    }

    /// The bus address of byte `at` of the block.
    pub(super) fn paddr_at(&self, at: usize) -> u64 {
        assert!(at < self.pages * PAGE_SIZE);
        self.paddr + at as u64
    }

    /// Buffer `i` (receive slots `0..RX_BUFFERS`, then transmit slots).
    pub(super) fn slot(&mut self, i: usize) -> &mut [u8] {
        assert!((i + 1) * BUFFER_SIZE <= self.pages * PAGE_SIZE);
        // SAFETY: `i` is in range, so the slice lies inside the block, which this value owns;
        // `&mut self` makes it the only reference the CPU holds (the device may hold the
        // buffer: the link's slot bookkeeping keeps the CPU off it then).
        unsafe {
            core::slice::from_raw_parts_mut(self.vaddr.as_ptr().add(i * BUFFER_SIZE), BUFFER_SIZE)
        }
    }
}

impl<S: StaticHal> Drop for Pages<S> {
    fn drop(&mut self) {
        if let Some(hal) = S::hal() {
            // SAFETY: the block came from this HAL (`StaticHal` returns the same one), is
            // returned once, and the device was reset before (the `VirtioNet` field order, or
            // no device was set up yet).
            unsafe {
                hal.dma_dealloc(DmaBlock {
                    paddr: self.paddr,
                    vaddr: self.vaddr,
                    pages: self.pages,
                })
            }
        }
    }
}

/// Which buffer slots the device holds: the descriptor (token) each was posted with, and the
/// length handed over. Every operation is O(1) (a per-frame linear scan of the slots was the
/// largest cost of the RoCE lab's READ responder: docs/measurements.md): an idle-slot bit mask,
/// and the slot of each token (a descriptor index, below [`QUEUE_SIZE`]; a larger one, which
/// only a device breaking the protocol reports, is looked for in turn and not found).
pub(super) struct Slots<const N: usize> {
    held: [Option<(u16, u16)>; N],
    /// Bit `i` set: slot `i` is idle.
    idle: u64,
    /// Per token below [`QUEUE_SIZE`]: the slot last held with it.
    by_token: [u8; QUEUE_SIZE],
}

impl<const N: usize> Slots<N> {
    const ALL: u64 = if N == 64 { u64::MAX } else { (1u64 << N) - 1 };
    const FITS: () = assert!(N >= 1 && N <= 64 && N <= u8::MAX as usize);

    pub(super) fn new() -> Self {
        let () = Self::FITS;
        Slots {
            held: [None; N],
            idle: Self::ALL,
            by_token: [0; QUEUE_SIZE],
        }
    }

    /// The first slot the device does not hold.
    pub(super) fn idle(&self) -> Option<usize> {
        (self.idle != 0).then(|| self.idle.trailing_zeros() as usize)
    }

    pub(super) fn hold(&mut self, slot: usize, token: u16, len: u16) {
        self.held[slot] = Some((token, len));
        self.idle &= !(1u64 << slot);
        if let Some(s) = self.by_token.get_mut(usize::from(token)) {
            *s = slot as u8;
        }
    }

    /// The slot posted with `token` (a value the device reports: unknown ones give `None`),
    /// and its length.
    pub(super) fn find(&self, token: u16) -> Option<(usize, usize)> {
        let is = |i: usize| match self.held.get(i) {
            Some(Some((t, len))) if *t == token => Some((i, usize::from(*len))),
            _ => None,
        };
        match self.by_token.get(usize::from(token)) {
            Some(&slot) => is(usize::from(slot)),
            None => (0..N).find_map(is),
        }
    }

    pub(super) fn release(&mut self, slot: usize) {
        self.held[slot] = None;
        self.idle |= 1u64 << slot;
    }

    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        N - self.idle.count_ones() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio_net::RX_BUFFERS;

    #[test]
    fn slots_track_tokens() {
        let mut s = Slots::<3>::new();
        assert_eq!(s.idle(), Some(0));
        s.hold(0, 7, 100);
        s.hold(1, 2, 60);
        assert_eq!(s.idle(), Some(2));
        assert_eq!(s.held(), 2);
        assert_eq!(s.find(2), Some((1, 60)));
        assert_eq!(s.find(7), Some((0, 100)));
        assert_eq!(s.find(3), None, "a token nobody posted");
        s.hold(2, 3, 1);
        assert_eq!(s.idle(), None);
        s.release(0);
        assert_eq!(s.idle(), Some(0));
        assert_eq!(
            s.find(7),
            None,
            "a released slot no longer answers its token"
        );
        assert_eq!(s.held(), 2);
    }

    #[test]
    fn slots_reuse_tokens_and_refuse_stale_ones() {
        let mut s = Slots::<RX_BUFFERS>::new();
        for i in 0..RX_BUFFERS {
            assert_eq!(s.idle(), Some(i));
            s.hold(i, i as u16, 1);
        }
        assert_eq!(s.idle(), None);
        assert_eq!(s.held(), RX_BUFFERS);
        // The device hands buffers back out of order; virtio-drivers reuses their tokens.
        s.release(5);
        s.release(2);
        assert_eq!(s.idle(), Some(2), "the lowest idle slot first");
        s.hold(2, 5, 9);
        assert_eq!(s.find(5), Some((2, 9)), "token 5 now names slot 2");
        assert_eq!(s.find(2), None, "slot 2's old token is stale");
        assert_eq!(s.idle(), Some(5));
        assert_eq!(s.find(u16::MAX), None, "a token beyond the queue");
        let mut t = Slots::<2>::new();
        t.hold(1, 1000, 3);
        assert_eq!(t.find(1000), Some((1, 3)), "a token beyond the queue, held");
    }

    #[test]
    fn frame_range_checks_device_lengths() {
        assert_eq!(frame_range(12, 42, 2048, 1514), Some(12..54));
        assert_eq!(frame_range(12, 2036, 2048, 4096), Some(12..2048));
        assert_eq!(frame_range(12, 2037, 2048, 4096), None, "beyond the buffer");
        assert_eq!(
            frame_range(12, 100, 2048, 99),
            None,
            "longer than the caller's room"
        );
        assert_eq!(frame_range(12, 0, 2048, 1514), None, "empty");
        assert_eq!(frame_range(usize::MAX, 1, 2048, 1514), None, "overflow");
        assert_eq!(frame_range(10, 1514, 2048, 1514), Some(10..1524));
    }
}
