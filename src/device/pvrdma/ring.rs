//! A PVRDMA ring as the driver sees it: two state words and `N` fixed-size slots in DMA memory
//! (L-RING, Q-RING; `docs/pvrdma.md` §7).
//!
//! `N` is a power of two; the indices the device sees run modulo `2N` and a slot is
//! `index & (N − 1)`. The driver keeps its own counters free-running (modulo 2³²) and converts
//! them when it publishes: `2N` divides 2³², so `counter & (2N − 1)` is the device's index.
//! Every index the device wrote is checked before it is used.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use bareverbs_hal::{Hal, PAGE_SIZE};

use super::abi;
use crate::dma::Dma;

/// What the driver keeps for one slot of a work queue, in driver-private memory (never shown
/// to the device): the caller's `wr_id` and the safe path's buffer tag. Kept here, below the
/// QP table that reads it, so that the data flows one way: `qptable` uses `ring`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Shadow {
    pub(crate) wr_id: u64,
    /// The buffer's tag + 1; 0 for a request posted without a buffer.
    pub(crate) tag: u32,
    pub(crate) _pad: u32,
}

/// A ring located once in its DMA memory (which never moves while the ring's owner exists).
#[derive(Clone, Copy)]
pub(crate) struct Ring {
    /// prod_tail; cons_head is the next word.
    state: NonNull<AtomicU32>,
    data: NonNull<u8>,
    /// N − 1.
    mask: u32,
    /// 2N − 1: the device's indices run modulo 2N (kept, not computed, on the data path).
    wrap: u32,
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
    /// at byte `state` of `mem`, slots from page `data_page`.
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
            state.is_multiple_of(4)
                && state + 8 <= mem.pages() * PAGE_SIZE
                && end <= mem.pages() * PAGE_SIZE,
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
            wrap: 2 * slots - 1,
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

    /// The CQE of free-running counter `n`, for a ring of [`abi::CQE_SIZE`]-byte slots (a
    /// CQ's: the stride is a constant, not a shift read from the ring).
    #[inline(always)]
    pub(crate) fn cqe(&self, n: u32) -> *const abi::Cqe {
        debug_assert_eq!(1 << self.shift, abi::CQE_SIZE);
        // SAFETY: as in `slot`: a CQ's ring has N slots of CQE_SIZE bytes (`Ring::new`).
        unsafe {
            self.data
                .as_ptr()
                .add((n & self.mask) as usize * abi::CQE_SIZE)
                .cast()
        }
    }

    /// The device's index for free-running counter `n` (modulo 2N).
    #[inline]
    pub(crate) fn index(&self, n: u32) -> u32 {
        n & self.wrap()
    }

    /// 2N − 1: the device's indices run modulo 2N.
    #[inline(always)]
    pub(crate) fn wrap(&self) -> u32 {
        self.wrap
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
#[derive(Clone, Copy)]
pub(crate) struct Producer {
    /// Requests published to the device, free-running.
    pub(crate) tail: u32,
    /// The `tail` at which the queue is full, as last computed from the completions taken
    /// (free-running: completions + slots). A new or reset queue (`tail` 0) starts with the
    /// slot count.
    pub(crate) credit: u32,
    /// The queue's doorbell word (the QP's handle and the queue's bit), made once.
    pub(crate) bell: u32,
    /// The per-slot record of the queue (the pollers' `QueueView::shadow`).
    pub(crate) shadow: NonNull<Shadow>,
    /// Each request takes its CQ room when it is written (`QueueView::room`): the credit
    /// then covers only the requests that have room, and every other one goes through the
    /// slow refill (as every receive of a QP on an SRQ does, to its refusal).
    pub(crate) metered: bool,
    /// A metered queue's CQ room counter (`QueueView::room`), kept here too: the refill
    /// reaches it through the QP it already holds.
    pub(crate) room: Option<NonNull<AtomicI32>>,
}

impl Producer {
    /// A new queue of `slots` slots whose doorbell word is `bell`, with the per-slot record
    /// `shadow` its pollers read (`metered`, `room`: see the fields).
    pub(crate) fn new(
        slots: u32,
        bell: u32,
        shadow: NonNull<Shadow>,
        metered: bool,
        room: Option<NonNull<AtomicI32>>,
    ) -> Self {
        let mut p = Producer {
            tail: 0,
            credit: 0,
            bell,
            shadow,
            metered,
            room,
        };
        p.reset(slots);
        p
    }

    /// The queue starts over (a QP reset): nothing published, `slots` of credit (none for a
    /// metered queue: its first request takes room).
    pub(crate) fn reset(&mut self, slots: u32) {
        self.tail = 0;
        self.credit = if self.metered { 0 } else { slots };
    }
}

/// A batch of work requests being written into a work queue: the producer's position and
/// credit and the ring's geometry, copied out of the QP when the batch starts, so that they
/// stay in registers while the batch writes WQEs (memory the compiler cannot tell apart from
/// the QP), and written back when it is committed. A batch dropped unfinished writes nothing
/// back: its WQEs stay unpublished, where the device does not look.
#[derive(Clone, Copy)]
pub struct WqCursor {
    /// The next request's free-running counter.
    pub(crate) tail: u32,
    /// `tail` when the batch started (what the QP has published).
    pub(crate) start: u32,
    /// The `tail` at which the queue is full (`Producer::credit`).
    pub(crate) limit: u32,
    /// The ring's slots, `mask` and slot size (log2).
    pub(crate) data: NonNull<u8>,
    pub(crate) mask: u32,
    pub(crate) shift: u32,
    /// SGEs a WQE holds.
    pub(crate) max_sge: u32,
    /// The queue's per-slot record.
    pub(crate) shadow: NonNull<Shadow>,
    /// Sends: the QP's source GID was found bound by this batch.
    pub(crate) gid_ok: bool,
}

impl WqCursor {
    /// A cursor at `p`'s position on `ring`.
    #[inline(always)]
    pub(crate) fn new(p: &Producer, ring: &Ring, max_sge: u32) -> Self {
        WqCursor {
            tail: p.tail,
            start: p.tail,
            limit: p.credit,
            data: ring.data,
            mask: ring.mask,
            shift: ring.shift,
            max_sge,
            shadow: p.shadow,
            gid_ok: false,
        }
    }

    /// The slot of the next request.
    #[inline(always)]
    pub(crate) fn slot(&self) -> *mut u8 {
        // SAFETY: the masked slot is < N, and N slots of the stride lie in the ring's memory
        // (`Ring::new`).
        unsafe {
            self.data
                .as_ptr()
                .add(((self.tail & self.mask) as usize) << self.shift)
        }
    }

    /// Records the next request's `wr_id` and tag in the queue's per-slot record (what its
    /// completion is matched against).
    #[inline(always)]
    pub(crate) fn record(&self, wr_id: u64, tag: u32) {
        let i = (self.tail & self.mask) as usize;
        // SAFETY: the record has one entry per ring slot (`QpCtlMem::new`), i < slots; only
        // the (exclusive) poster writes unpublished slots. (The two fields only: the padding is
        // never read.)
        unsafe {
            let e = self.shadow.as_ptr().add(i);
            core::ptr::addr_of_mut!((*e).wr_id).write(wr_id);
            core::ptr::addr_of_mut!((*e).tag).write(tag);
        }
    }
}
