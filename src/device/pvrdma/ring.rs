//! A PVRDMA ring as the driver sees it: two state words and `N` fixed-size slots in DMA memory
//! (L-RING, Q-RING; `shared/pvrdma-abi.md` §7).
//!
//! `N` is a power of two; the indices the device sees run modulo `2N` and a slot is
//! `index & (N − 1)`. The driver keeps its own counters free-running (modulo 2³²) and converts
//! them when it publishes: `2N` divides 2³², so `counter & (2N − 1)` is the device's index.
//! Every index the device wrote is checked before it is used.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use bareverbs_hal::{Hal, PAGE_SIZE};

use crate::dma::Dma;

/// A ring located once in its DMA memory (which never moves while the ring's owner exists).
#[derive(Clone, Copy)]
pub(crate) struct Ring {
    /// prod_tail; cons_head is the next word.
    state: NonNull<AtomicU32>,
    data: NonNull<u8>,
    /// N − 1.
    mask: u32,
    /// log2 of the slot size.
    shift: u32,
}

// SAFETY: a Ring is a pair of pointers into DMA memory owned by the object that holds it;
// the state words are atomics and slots are written only by the (exclusive) producer.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

impl Ring {
    /// The ring of `slots` slots of `stride` bytes (both powers of two) in `mem`: state words
    /// at byte `state`, slots from page `data_page`.
    ///
    /// # Panics
    ///
    /// When the ring does not fit `mem` (a driver bug: sizes are computed, never read).
    #[inline(never)]
    pub(crate) fn new(
        mem: &Dma<impl Hal>,
        state: usize,
        data_page: usize,
        slots: u32,
        stride: u32,
    ) -> Self {
        let slots = slots.max(1);
        assert!(slots.is_power_of_two() && slots <= 1 << 24 && stride.is_power_of_two());
        let end = data_page * PAGE_SIZE + slots as usize * stride as usize;
        assert!(
            state + 8 <= PAGE_SIZE && end <= mem.pages() * PAGE_SIZE,
            "ring outside its memory"
        );
        // SAFETY: both offsets were checked to lie inside `mem` just above.
        let (st, data) = unsafe {
            (
                mem.base().add(state).cast::<AtomicU32>(),
                mem.base().add(data_page * PAGE_SIZE),
            )
        };
        Ring {
            state: st,
            data,
            mask: slots - 1,
            shift: stride.trailing_zeros(),
        }
    }

    /// Slots in the ring (N).
    #[inline]
    pub(crate) fn slots(&self) -> u32 {
        self.mask + 1
    }

    /// The producer index word.
    #[inline]
    pub(crate) fn prod(&self) -> &AtomicU32 {
        // SAFETY: checked in `new`; the memory lives as long as the ring's owner.
        unsafe { self.state.as_ref() }
    }

    /// The consumer index word.
    #[inline]
    pub(crate) fn cons(&self) -> &AtomicU32 {
        // SAFETY: as in `prod`: the word after it, checked in `new`.
        unsafe { &*self.state.as_ptr().add(1) }
    }

    /// The slot of free-running counter `n`.
    #[inline]
    pub(crate) fn slot(&self, n: u32) -> *mut u8 {
        // SAFETY: the masked slot is < N, and N slots of the stride lie in the memory (`new`).
        unsafe {
            self.data
                .as_ptr()
                .add(((n & self.mask) as usize) << self.shift)
        }
    }

    /// The device's index for free-running counter `n` (modulo 2N).
    #[inline]
    pub(crate) fn index(&self, n: u32) -> u32 {
        n & self.wrap()
    }

    /// 2N − 1: the device's indices run modulo 2N.
    #[inline(always)]
    fn wrap(&self) -> u32 {
        2 * self.mask + 1
    }

    /// Publishes free-running producer counter `n`: the slots written before are visible to
    /// the device before the index is (release).
    #[inline]
    pub(crate) fn publish(&self, n: u32) {
        self.prod().store(self.index(n), Ordering::Release);
    }

    /// Reads the index the device produced (a CQ's prod_tail) relative to the consumer's
    /// free-running counter `head`: how many slots are ready, or `None` when the value cannot
    /// be right (a bit outside 2N − 1, or more ready than the ring holds).
    #[inline]
    pub(crate) fn ready(&self, head: u32) -> Option<u32> {
        let tail = self.prod().load(Ordering::Acquire);
        let wrap = self.wrap();
        let ready = tail.wrapping_sub(head) & wrap;
        // wrap is 2N − 1: a bit outside it is `tail > wrap`.
        (tail <= wrap && ready <= self.mask + 1).then_some(ready)
    }
}

/// The producer side of one work queue, kept in the QP (moved with it; only `&mut` touches it).
#[derive(Clone, Copy, Default)]
pub(crate) struct Producer {
    /// Requests written, free-running (≥ `published`).
    pub(crate) tail: u32,
    /// Requests published to the device.
    pub(crate) published: u32,
    /// The `tail` at which the queue is full, as last computed from the completions taken
    /// (free-running: completions + slots). A new or reset queue (`tail` 0) starts with the
    /// slot count.
    pub(crate) credit: u32,
}
