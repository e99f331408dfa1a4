//! Completion queues: a ring of completions in HAL memory with one producer (the transport,
//! under the device lock) and one consumer at a time (a poll, under the CQ's poll lock), so a
//! poll never waits for the transport and the transport never waits for a poll. Posts take
//! room for their completions without the device lock (a bounded compare-and-swap on the
//! count of room taken), from several cores at once.

use core::mem::MaybeUninit;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

use bareverbs_hal::Hal;

use crate::dma::Dma;
use crate::error::{Error, Param, Result};
use crate::events::{Arm, EventHub, Slot};
use crate::verbs::{BufRelease, PollCq, WcFlags, WcOpcode, WcStatus, WorkCompletion};

/// Completion queues the device creates.
pub const MAX_CQ: u32 = 64;
/// Spins a poll waits for another thread's poll of the same CQ to end (a poll holds it for
/// the entries it reads: far fewer spins than this).
const POLL_SPINS: u32 = 1 << 16;
/// Entries per completion queue, at most.
pub const MAX_CQE: u32 = 16384;

/// A completion and what goes with it.
#[derive(Clone, Copy)]
pub(crate) struct Cqe {
    pub(crate) wc: WorkCompletion,
    /// The safe path's buffer tag + 1 (0: none), and where it goes back.
    pub(crate) tag: u32,
    pub(crate) release: Option<BufRelease>,
    /// Raised by a packet with the solicited-event bit.
    pub(crate) solicited: bool,
    /// Its room is the SRQ's reservation (`CqRing::srq_used`), not `CqRing::taken`.
    pub(crate) srq_room: bool,
}

/// The ring's header, at the start of the CQ's block; the entries follow.
pub(crate) struct CqRing {
    /// Entries produced (the transport's count).
    head: AtomicU32,
    /// Entries consumed (the poller's count).
    tail: AtomicU32,
    /// A poll is under way (the poll lock).
    polling: AtomicBool,
    /// Entries (a power of two). It and `entries` change only with both the device lock and
    /// the poll lock held (a resize, which only grows them): the producer and the poller
    /// each read them under one of the two, a post's `take` reads `cap` without either (an
    /// older, smaller one only makes it take less).
    cap: AtomicU32,
    /// Room taken (never more than `cap`: raised by compare-and-swap within it, by posts on
    /// any core and by the transport; lowered by a poll too): one entry per request posted to a queue pair's own queues that completes
    /// here, from its post until its completion is polled (or it retires without one), and
    /// the reservations of the shared receive queues whose QPs complete here (`srq_room`).
    taken: AtomicU32,
    /// The part of `taken` reserved for shared receive queues: once per (SRQ, CQ) pair, as
    /// much of the SRQ's depth as there was room for when its first QP attached.
    pub(crate) srq_room: AtomicU32,
    /// Receive requests taken from shared receive queues on that reservation, until their
    /// completions are polled: at most `srq_room`.
    srq_used: AtomicU32,
    /// SRQ reservation given up (its last QP left) but not yet out of `srq_room`, for
    /// completions still counted in `srq_used`: settled as they are polled.
    srq_leaving: AtomicU32,
    /// Queue pairs that complete on this CQ (one per QP, even when it is both its send and
    /// its receive CQ).
    pub(crate) users: AtomicU32,
    /// Completions lost to a full ring (cannot happen while reservations hold).
    pub(crate) overflow: AtomicU32,
    pub(crate) id: u32,
    pub(crate) slot: Option<Slot>,
    /// What the CQ is armed for ([`Arm`] as a number): the event hub's word of `slot`, or
    /// `unarmed` for a CQ without one; read at every completion added, so one load.
    arm: NonNull<AtomicU32>,
    /// Always 0 ([`Arm::None`]): `arm` of a CQ that takes no part in events.
    unarmed: AtomicU32,
    entries: AtomicPtr<MaybeUninit<Cqe>>,
}

impl CqRing {
    #[inline(always)]
    fn entry(&self, i: u32) -> *mut MaybeUninit<Cqe> {
        // SAFETY: the entries are `cap` slots (after the header in the same block, or the
        // block of a resize); the index is reduced modulo `cap` (a power of two: `new`,
        // `Cq::grow`). Both are read under the lock (device or poll) their changes hold.
        unsafe {
            self.entries
                .load(Ordering::Relaxed)
                .add((i & (self.cap() - 1)) as usize)
        }
    }

    #[inline(always)]
    pub(crate) fn cap(&self) -> u32 {
        self.cap.load(Ordering::Relaxed)
    }

    /// Adds a completion (the device lock is held: one producer); raises the CQ's event when
    /// it is armed for it. `false` when the ring is full (the completion is lost).
    #[inline(always)]
    pub(crate) fn push(&self, e: Cqe, hub: &EventHub) -> bool {
        let h = self.head.load(Ordering::Relaxed);
        if h.wrapping_sub(self.tail.load(Ordering::Acquire)) >= self.cap() {
            self.overflow.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // SAFETY: one producer (the device lock); slot `h` is not readable by the consumer
        // until `head` moves past it.
        unsafe { self.entry(h).write(MaybeUninit::new(e)) };
        self.head.store(h.wrapping_add(1), Ordering::Release);
        // SAFETY: `arm` is the hub's word of this CQ's slot (the hub is in the device block,
        // which outlives every CQ) or this ring's own `unarmed`; only ever reached as an atomic.
        let arm = unsafe { self.arm.as_ref() }.load(Ordering::Acquire);
        if arm != Arm::None as u32 {
            self.armed(arm, e.solicited || e.wc.status != WcStatus::Success, hub);
        }
        true
    }

    /// A completion was added to the CQ armed for `arm`: its event, when the arm asks for
    /// one (`solicited`: the completion was solicited, or an error). Out of line: rare.
    #[cold]
    #[inline(never)]
    fn armed(&self, arm: u32, solicited: bool, hub: &EventHub) {
        let fire = match arm {
            a if a == Arm::Next as u32 => true,
            a if a == Arm::Solicited as u32 => solicited,
            _ => false,
        };
        if let (true, Some(slot)) = (fire, self.slot) {
            hub.cq_notified(slot);
        }
    }

    /// Takes the poll lock, waiting for another poller a bounded number of spins (the
    /// device has no clock to wait by): `false` when it is still held after them. The free
    /// lock's one swap inline; the wait out of line.
    #[inline(always)]
    fn claim(&self) -> bool {
        self.polling
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            || self.claim_wait()
    }

    #[cold]
    #[inline(never)]
    fn claim_wait(&self) -> bool {
        for _ in 0..POLL_SPINS {
            // Test, then test-and-set: the waiting poller reads the line, not writes it.
            if !self.polling.load(Ordering::Relaxed)
                && self
                    .polling
                    .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return true;
            }
            core::hint::spin_loop();
        }
        false
    }

    /// Entries no request or reservation has taken.
    pub(crate) fn free(&self) -> u32 {
        self.cap()
            .saturating_sub(self.taken.load(Ordering::Acquire))
    }

    /// Room taken: the CQEs the CQ must keep room for (requests posted and not yet polled,
    /// the shared receive queues' reservations).
    pub(crate) fn taken(&self) -> u32 {
        self.taken.load(Ordering::Acquire)
    }

    /// Takes room for `n` completions if there is: a compare-and-swap within the capacity,
    /// so posts on several cores (each under its QP's lock only) and the transport never take
    /// more than there is; a concurrent poll only lowers `taken`. Bounded: each failed swap
    /// means another core's take or give went through.
    #[inline(always)]
    pub(crate) fn take(&self, n: u32) -> bool {
        // `fetch_update` written out: at opt-level "z" it stays an out-of-line call with its
        // closure.
        let mut t = self.taken.load(Ordering::Acquire);
        loop {
            if self.cap().saturating_sub(t) < n {
                return false;
            }
            match self
                .taken
                .compare_exchange_weak(t, t + n, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => t = now,
            }
        }
    }

    /// Reserves room for a shared receive queue of `depth` whose first QP completes here:
    /// all of it when it fits the free room, else none (its requests then take free room one
    /// at a time, and wait, not-ready to the sender, while there is none: a reservation of
    /// whatever was free would leave the CQ's other queues no room at all); returns it
    /// (device lock held).
    pub(crate) fn reserve_srq(&self, depth: u32) -> u32 {
        self.settle();
        let mut r = 0;
        // Bounded as in `take`.
        let _ = self
            .taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                r = if depth <= self.cap().saturating_sub(t) {
                    depth
                } else {
                    0
                };
                Some(t + r)
            });
        self.srq_room.fetch_add(r, Ordering::Relaxed);
        r
    }

    /// Gives up `r` of the SRQs' reservation (their last QP left): at once for the part no
    /// request uses, the rest as its completions are polled (device lock held).
    pub(crate) fn release_srq(&self, r: u32) {
        self.srq_leaving.fetch_add(r, Ordering::Relaxed);
        self.settle();
    }

    /// Moves the reservation given up out of `srq_room` and `taken`, as far as the requests
    /// taken on it allow (device lock held: a poll only lowers `srq_used`).
    pub(crate) fn settle(&self) {
        let leaving = self.srq_leaving.load(Ordering::Relaxed);
        if leaving == 0 {
            return;
        }
        let room = self.srq_room.load(Ordering::Relaxed);
        let unused = room.saturating_sub(self.srq_used.load(Ordering::Acquire));
        let n = leaving.min(unused);
        self.srq_leaving.store(leaving - n, Ordering::Relaxed);
        self.srq_room.store(room - n, Ordering::Relaxed);
        self.give(n);
    }

    /// Whether a shared receive queue's request could complete here now.
    pub(crate) fn srq_fits(&self) -> bool {
        self.srq_used.load(Ordering::Acquire) < self.srq_room.load(Ordering::Relaxed)
            || self.free() > 0
    }

    /// Gives back room taken by `n` requests that will not complete here.
    #[inline(always)]
    pub(crate) fn give(&self, n: u32) {
        self.taken.fetch_sub(n, Ordering::Release);
    }

    /// Room for one completion of a shared receive queue's request: from the SRQs'
    /// reservation, else from the free room; `None` when neither has any (the request is not
    /// taken: the sender is told the receiver is not ready, and nothing is dropped).
    pub(crate) fn take_srq(&self) -> Option<bool> {
        // The device lock is held (the responder): the one raiser of `srq_used`, and the one
        // settler.
        self.settle();
        if self.srq_used.load(Ordering::Acquire) < self.srq_room.load(Ordering::Relaxed) {
            self.srq_used.fetch_add(1, Ordering::Relaxed);
            return Some(true);
        }
        self.take(1).then_some(false)
    }

    /// Gives back the room of a receive request taken with [`take_srq`](Self::take_srq)
    /// that will not complete here.
    pub(crate) fn give_srq(&self, srq_room: bool) {
        if srq_room {
            self.srq_used.fetch_sub(1, Ordering::Release);
        } else {
            self.give(1);
        }
    }

    #[inline(always)]
    fn ready(&self) -> bool {
        self.head.load(Ordering::Acquire) != self.tail.load(Ordering::Relaxed)
    }

    /// Ends a poll (the poll lock is held): the entries up to `tail` are consumed, `own` of
    /// them on `taken`'s room and `srq` on the SRQs' reservation, which go back.
    #[inline(always)]
    fn consumed(&self, tail: u32, own: u32, srq: u32) {
        self.tail.store(tail, Ordering::Release);
        if own != 0 {
            self.give(own);
        }
        if srq != 0 {
            self.srq_used.fetch_sub(srq, Ordering::Release);
        }
        self.polling.store(false, Ordering::Release);
    }
}

/// A completion queue.
pub struct Cq<H: Hal> {
    _mem: Dma<H>,
    /// The entries of a resized CQ (the first ones, in `_mem`, are then unused).
    grown: Option<Dma<H>>,
    pub(crate) ring: NonNull<CqRing>,
}

// SAFETY: the ring is shared through atomics (head/tail, the poll lock, the room counts); it
// is written under the device lock only; the rest of the header is written once, at creation.
unsafe impl<H: Hal + Send> Send for Cq<H> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync> Sync for Cq<H> {}

impl<H: Hal> Cq<H> {
    /// Allocates a ring of at least `entries` (a power of two).
    pub(crate) fn new(
        hal: &H,
        entries: u32,
        id: u32,
        slot: Option<Slot>,
        hub: &EventHub,
    ) -> Result<Self> {
        if entries == 0 || entries > MAX_CQE {
            return Err(Error::invalid(Param::CqEntries, entries, MAX_CQE));
        }
        let cap = entries.next_power_of_two();
        let at = size_of::<CqRing>().next_multiple_of(align_of::<Cqe>());
        let bytes = at + cap as usize * size_of::<Cqe>();
        let mem = Dma::new(hal, bytes.div_ceil(bareverbs_hal::PAGE_SIZE))?;
        let ring = mem.base().cast::<CqRing>();
        // SAFETY: the block holds the header and `cap` entries after it, page-aligned (so
        // aligned for both); the header is written before any reference exists (`unarmed`'s
        // place is taken without one).
        unsafe {
            let entries = mem.base().add(at).cast::<MaybeUninit<Cqe>>();
            let arm = match slot {
                Some(s) => NonNull::from(hub.arm_word(s)),
                // The field's place in the block (the header is written just below).
                None => NonNull::new_unchecked(core::ptr::addr_of_mut!((*ring.as_ptr()).unarmed)),
            };
            ring.write(CqRing {
                head: AtomicU32::new(0),
                tail: AtomicU32::new(0),
                polling: AtomicBool::new(false),
                cap: AtomicU32::new(cap),
                taken: AtomicU32::new(0),
                srq_room: AtomicU32::new(0),
                srq_used: AtomicU32::new(0),
                srq_leaving: AtomicU32::new(0),
                users: AtomicU32::new(0),
                overflow: AtomicU32::new(0),
                id,
                slot,
                arm,
                unarmed: AtomicU32::new(0),
                entries: AtomicPtr::new(entries.as_ptr()),
            });
        }
        Ok(Cq {
            _mem: mem,
            grown: None,
            ring,
        })
    }

    /// Bytes of a block for `cap` entries of a resize.
    pub(crate) fn entries_bytes(cap: u32) -> usize {
        cap as usize * size_of::<Cqe>()
    }

    /// Moves the completions not yet polled, in order, into `mem`'s `cap` entries (a power of
    /// two larger than the ring's), which the ring then uses. `false` (nothing changed) when
    /// another poller held the ring through every spin.
    ///
    /// # Safety
    ///
    /// The device lock is held (no completion is added meanwhile), and `mem` holds at least
    /// [`entries_bytes`](Self::entries_bytes)`(cap)` bytes, aligned for the entries.
    pub(crate) unsafe fn grow(&mut self, mem: Dma<H>, cap: u32) -> bool {
        let ring = self.ring();
        debug_assert!(cap.is_power_of_two() && cap > ring.cap());
        if !ring.claim() {
            return false;
        }
        let (tail, head) = (
            ring.tail.load(Ordering::Relaxed),
            ring.head.load(Ordering::Acquire),
        );
        let to = mem.base().cast::<MaybeUninit<Cqe>>();
        // Bounded by the ring: `head` never runs more than `cap` ahead of `tail`.
        let n = head.wrapping_sub(tail).min(ring.cap());
        for i in 0..n {
            let at = tail.wrapping_add(i);
            // SAFETY: entries before `head` were written by the producer; the poll lock and
            // the device lock (the caller's) are held, so nobody reads or writes either ring.
            // The new slot is within `mem` (`cap` entries, the index reduced modulo `cap`).
            unsafe {
                to.as_ptr()
                    .add((at & (cap - 1)) as usize)
                    .write(ring.entry(at).read());
            }
        }
        // Counters run on: with both capacities powers of two (dividing 2^32), an index keeps
        // its place across the wrap.
        ring.entries.store(to.as_ptr(), Ordering::Relaxed);
        ring.cap.store(cap, Ordering::Release);
        // The poll lock's release publishes both to the next poller; the device lock's to
        // the producer.
        ring.consumed(tail, 0, 0);
        // The previous resize's block, if any, is no longer read.
        self.grown = Some(mem);
        true
    }

    /// The ring (shared: every field that changes is atomic).
    pub(crate) fn ring(&self) -> &CqRing {
        // SAFETY: written in `new`, lives as long as `self.mem`.
        unsafe { self.ring.as_ref() }
    }

    pub(crate) fn ready(&self) -> bool {
        self.ring().ready()
    }

    /// Takes up to `out.len()` completions (a buffer of the safe path goes back to its pool).
    /// Read in place, straight into `out`: the entries between `tail` and `head` are the
    /// poller's alone while it holds the poll lock, so no cursor copies them first.
    #[inline(always)]
    pub(crate) fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let ring = self.ring();
        if !ring.ready() || !ring.claim() {
            // Empty, or another poller held the ring through every spin: it takes the
            // completions there are (as `ibv_poll_cq` returning 0).
            return 0;
        }
        let tail = ring.tail.load(Ordering::Relaxed);
        let ready = ring.head.load(Ordering::Acquire).wrapping_sub(tail);
        // Bounded by the caller's buffer and by the ring (`head` never runs more than `cap`
        // ahead of `tail`).
        let n = out.len().min(ready.min(ring.cap()) as usize);
        let mut srq = 0;
        for (i, wc) in out[..n].iter_mut().enumerate() {
            // SAFETY: entries before `head` were written by the producer (Release on head,
            // Acquire above) and are not rewritten until `tail` passes them.
            let e = unsafe { (*ring.entry(tail.wrapping_add(i as u32))).assume_init_ref() };
            *wc = e.wc;
            srq += u32::from(e.srq_room);
            if e.tag != 0
                && let Some(r) = e.release
            {
                // SAFETY: the buffer was moved into the QP by a safe post; its completion is
                // handled once, here (the entry is consumed below).
                unsafe { r.release(e.tag - 1) };
            }
        }
        ring.consumed(tail.wrapping_add(n as u32), n as u32 - srq, srq);
        n
    }

    /// Takes the next completion of queue pair `qpn` into `wc`; `Some(tag)` for one (the
    /// buffer tag + 1, or 0: the buffer is the caller's now). Another QP's completion first
    /// is left where it is. Read in place, as [`poll`](Self::poll).
    pub(crate) fn poll_qp(&self, qpn: u32, wc: &mut WorkCompletion) -> Option<u32> {
        let ring = self.ring();
        if !ring.ready() || !ring.claim() {
            return None;
        }
        let tail = ring.tail.load(Ordering::Relaxed);
        if ring.head.load(Ordering::Acquire) == tail {
            ring.consumed(tail, 0, 0);
            return None;
        }
        // SAFETY: as in `poll`: an entry before `head`, the poller's alone.
        let e = unsafe { (*ring.entry(tail)).assume_init_ref() };
        if e.wc.qp_num != qpn {
            ring.consumed(tail, 0, 0);
            return None;
        }
        *wc = e.wc;
        let (tag, srq) = (e.tag, u32::from(e.srq_room));
        ring.consumed(tail.wrapping_add(1), 1 - srq, srq);
        Some(tag)
    }
}

/// A poll in progress on a CQ: the consumer's claim on the ring.
pub struct Poll<'c> {
    ring: &'c CqRing,
    /// The next entry to read.
    pos: u32,
    only: Option<u32>,
    cur: Cqe,
    /// Whether `cur` is a completion the cursor has handed out (its buffer still to return).
    live: bool,
    /// Completions read on `taken`'s room and on the SRQs' reservation: given back at the end.
    own: u32,
    srq: u32,
}

impl<'c> Poll<'c> {
    /// Claims the ring; `None` when it is empty.
    pub(crate) fn start(ring: &'c CqRing, only: Option<u32>) -> Result<Option<Self>> {
        if !ring.ready() {
            return Ok(None);
        }
        if !ring.claim() {
            // Another poller held the ring through every spin: it takes the completions
            // there are; this poll finds none now (as `ibv_poll_cq` returning 0).
            return Ok(None);
        }
        Ok(Some(Poll {
            ring,
            pos: ring.tail.load(Ordering::Relaxed),
            only,
            cur: Cqe {
                wc: WorkCompletion::default(),
                tag: 0,
                release: None,
                solicited: false,
                srq_room: false,
            },
            live: false,
            own: 0,
            srq: 0,
        }))
    }

    #[inline(always)]
    fn release_current(&mut self) {
        if self.live && self.cur.tag != 0 {
            if let Some(r) = self.cur.release {
                // SAFETY: the buffer was moved into the QP by a safe post; its completion is
                // handled once, here (the tag is cleared).
                unsafe { r.release(self.cur.tag - 1) };
            }
            self.cur.tag = 0;
        }
        self.live = false;
    }
}

impl PollCq for Poll<'_> {
    fn advance(&mut self) -> Result<bool> {
        self.release_current();
        if self.pos == self.ring.head.load(Ordering::Acquire) {
            return Ok(false);
        }
        // SAFETY: entries before `head` were written by the producer (Release on head,
        // Acquire above) and are not rewritten until `tail` passes them.
        let e = unsafe { self.ring.entry(self.pos).read().assume_init() };
        if self.only.is_some_and(|q| q != e.wc.qp_num) {
            return Ok(false);
        }
        if e.srq_room {
            self.srq += 1;
        } else {
            self.own += 1;
        }
        self.cur = e;
        self.live = true;
        self.pos = self.pos.wrapping_add(1);
        Ok(true)
    }

    fn wr_id(&self) -> u64 {
        self.cur.wc.wr_id
    }

    fn status(&self) -> WcStatus {
        self.cur.wc.status
    }

    fn opcode(&self) -> WcOpcode {
        self.cur.wc.opcode
    }

    fn qp_num(&self) -> u32 {
        self.cur.wc.qp_num
    }

    fn byte_len(&self) -> u32 {
        self.cur.wc.byte_len
    }

    fn flags(&self) -> WcFlags {
        self.cur.wc.flags
    }

    fn imm(&self) -> u32 {
        self.cur.wc.imm
    }

    fn src_qp(&self) -> u32 {
        self.cur.wc.src_qp
    }

    fn vendor_err(&self) -> u32 {
        0
    }

    fn take_tag(&mut self) -> Option<u32> {
        let t = core::mem::take(&mut self.cur.tag);
        (t != 0).then_some(t)
    }
}

impl Drop for Poll<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.release_current();
        self.ring.consumed(self.pos, self.own, self.srq);
    }
}
