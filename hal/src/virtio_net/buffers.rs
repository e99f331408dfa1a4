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

/// Which buffer slots the device holds, and the length handed over with each. A slot is
/// posted under its own number as the descriptor id (the link's queues give each buffer the
/// descriptor of its slot), so the id the device reports back names the slot directly: every
/// operation is O(1) (a per-frame linear scan of the slots was the largest cost of the RoCE
/// lab's READ responder: docs/measurements.md). An id the device reports that is out of range
/// or not held, which only a device breaking the protocol reports, is not found.
pub(super) struct Slots<const N: usize> {
    held: [Option<u16>; N],
    /// Bit `i` set: slot `i` is idle.
    idle: u64,
}

impl<const N: usize> Slots<N> {
    const ALL: u64 = if N == 64 { u64::MAX } else { (1u64 << N) - 1 };
    const FITS: () = assert!(N >= 1 && N <= 64 && N <= QUEUE_SIZE);

    pub(super) fn new() -> Self {
        let () = Self::FITS;
        Slots {
            held: [None; N],
            idle: Self::ALL,
        }
    }

    /// The first slot the device does not hold.
    pub(super) fn idle(&self) -> Option<usize> {
        (self.idle != 0).then(|| self.idle.trailing_zeros() as usize)
    }

    /// Slot `slot` handed to the device (under descriptor id `slot`) with `len` bytes.
    pub(super) fn hold(&mut self, slot: usize, len: u16) {
        self.held[slot] = Some(len);
        self.idle &= !(1u64 << slot);
    }

    /// The slot the device names by descriptor `id` (a value the device reports: one out of
    /// range or not held gives `None`), and its length.
    pub(super) fn find(&self, id: u16) -> Option<(usize, usize)> {
        let slot = usize::from(id);
        let len = (*self.held.get(slot)?)?;
        Some((slot, usize::from(len)))
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
    fn slots_answer_the_ids_they_hold() {
        let mut s = Slots::<3>::new();
        assert_eq!(s.idle(), Some(0));
        s.hold(0, 100);
        s.hold(1, 60);
        assert_eq!(s.idle(), Some(2));
        assert_eq!(s.held(), 2);
        assert_eq!(s.find(1), Some((1, 60)));
        assert_eq!(s.find(0), Some((0, 100)));
        assert_eq!(s.find(2), None, "an id nobody posted");
        s.hold(2, 1);
        assert_eq!(s.idle(), None);
        s.release(0);
        assert_eq!(s.idle(), Some(0));
        assert_eq!(s.find(0), None, "a released slot no longer answers its id");
        assert_eq!(s.held(), 2);
    }

    #[test]
    fn slots_are_reused_lowest_first_and_refuse_ids_out_of_range() {
        let mut s = Slots::<RX_BUFFERS>::new();
        for i in 0..RX_BUFFERS {
            assert_eq!(s.idle(), Some(i));
            s.hold(i, 1);
        }
        assert_eq!(s.idle(), None);
        assert_eq!(s.held(), RX_BUFFERS);
        // The device hands buffers back out of order.
        s.release(5);
        s.release(2);
        assert_eq!(s.idle(), Some(2), "the lowest idle slot first");
        s.hold(2, 9);
        assert_eq!(s.find(2), Some((2, 9)));
        assert_eq!(s.find(5), None, "slot 5 is idle");
        assert_eq!(s.idle(), Some(5));
        assert_eq!(s.find(RX_BUFFERS as u16), None, "an id past the slots");
        assert_eq!(s.find(u16::MAX), None, "an id beyond the queue");
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
