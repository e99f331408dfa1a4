//! The driver's table of live queue pairs, by device handle, and each QP's control block: what
//! a completion-queue poller needs to match a CQE to the work request it completes.
//!
//! A CQE names its QP by handle (`docs/pvrdma.md` §10.1) and nothing else: no WQE index.
//! Work requests of one work queue complete in the order they were posted (RC and UD), so the
//! driver counts, per queue, the requests it published (`tail`) and the completions it took
//! (`done`); the CQE for a queue must be the one for request `done`, and its `wr_id` must be
//! the one the driver wrote there. That check is what lets the driver:
//! - give the send/receive credit back only for requests that have completed (the ring never
//!   holds more outstanding requests than `max_send_wr` / `max_recv_wr`),
//! - hand back a safe-path buffer whichever poller takes its completion,
//! - flush every outstanding request exactly once when the QP goes to the error state, and
//!   drop a late CQE for a request already flushed,
//! - refuse a CQE the device invented (wrong QP, nothing outstanding, wrong `wr_id`).
//!
//! Control blocks and the table live in driver-private DMA memory (never moved, never shown to
//! the device). The table is written under the command lock *and* the poll locks of the QP's
//! CQs; a poller holding its CQ's lock reads it without further locking and dereferences a
//! control block only when the entry names that same CQ, so a QP cannot be destroyed under it.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use bareverbs_hal::{Hal, PAGE_SIZE};

use super::ring::{Ring, Shadow};
use super::srq_slots::SrqCounters;
use crate::dma::Dma;
use crate::error::{Error, Op, Result};
use crate::verbs::{BufRelease, ModifyAttr, QpAttrMask, QpState};

/// One work queue's counters, shared by its poster and the poller of its CQ.
#[repr(C)]
pub(crate) struct QueueCtl {
    /// Completions taken, free-running; written by the poller (release).
    pub(crate) done: AtomicU32,
    /// Requests published, free-running; written by the poster (release).
    pub(crate) tail: AtomicU32,
    /// 1 while the outstanding requests are to complete flushed (the QP is in ERR).
    pub(crate) flush: AtomicU32,
    /// CQEs due for requests the driver finished without them (flushed, or discarded by a
    /// RESET) after the device had taken them: the device completes in order, so the next
    /// this many CQEs of the queue belong to that earlier life and are dropped. Written under
    /// the poll lock of the queue's CQ.
    pub(crate) late: AtomicU32,
    /// Requests at the end of the queue (`tail` − this ..< `tail`) posted while the QP was in
    /// ERR: never published to the device, flushed by the driver. Written by the poster (after
    /// `tail`, release), read before `tail` (acquire): a reader never counts more of them than
    /// there are (the safe direction: a request counted as published may be parked, never a
    /// published one handed back).
    pub(crate) unpublished: AtomicU32,
}

/// One queue as a poller sees it.
pub(crate) struct QueueView {
    pub(crate) ctl: QueueCtl,
    pub(crate) ring: Ring,
    /// The receive queue of a QP with a buffer pool: one bit per buffer of the pool, set for
    /// a buffer parked (its receive was flushed or discarded after the device took it: the
    /// device may still write it), handed back when the QP is destroyed. Apart from the
    /// per-slot record, whose slot the next post reuses.
    pub(crate) parked: Option<(NonNull<AtomicU64>, u32)>,
    /// The per-slot record (one per ring slot): the `wr_id` and buffer tag of each request,
    /// in driver-private memory. What a CQE is matched against: never the WQE in the ring,
    /// which the device can rewrite (`docs/security.md`).
    pub(crate) shadow: NonNull<Shadow>,
    /// A metered queue's CQ room counter (`Cq::reserved`, the CQ outlives the QP): the queue's
    /// whole depth did not fit the CQ when it was created, so each request takes room when it
    /// is posted and gives it back here. `None`: the depth is reserved for the QP's life.
    pub(crate) room: Option<NonNull<AtomicI32>>,
    /// That CQ's entries (what `room` may reach).
    pub(crate) room_cap: u32,
}

/// A metered queue's CQ room counter and the CQ's entries (`QueueView::room`).
pub(crate) type Room = (Option<NonNull<AtomicI32>>, u32);

pub(crate) use super::srq_meter::unreserve;

/// A QP's control block.
pub(crate) struct QpCtl {
    pub(crate) sq: QueueView,
    pub(crate) rq: QueueView,
    /// The QP number completions report.
    pub(crate) qpn: u32,
    /// The device's handle of the QP (what CQEs name).
    pub(crate) handle: u32,
    /// Receives come from a shared receive queue (their completions are not the RQ's).
    pub(crate) srq: bool,
    /// The SRQ's counters, when receives come from one.
    pub(crate) srq_done: Option<NonNull<SrqCounters>>,
    /// Where a safe buffer goes back when a completion is taken by a raw poll, a flush or a
    /// destroy.
    pub(crate) release: Option<BufRelease>,
}

impl QpCtl {
    /// A CQE removed from a CQ completed the receive posted with `wr_id` to this QP's SRQ, if
    /// it has one: the SRQ gets its credit back.
    pub(crate) fn srq_completed(&self, wr_id: u64) {
        if let Some(c) = self.srq_done {
            // SAFETY: the SRQ outlives the QP (the provider contract of create_qp).
            unsafe { c.as_ref() }.complete(wr_id);
        }
    }

    /// Matches a CQE of this QP (`recv`: for a receive) carrying `wr_id` to the request it
    /// completes: `Some(tag)` (the safe path's buffer tag + 1, or 0) when it is the next
    /// outstanding one, which is then counted complete; `None` for a CQE to drop (a late one
    /// for a request already flushed, or one the device invented with nothing outstanding);
    /// an error for a CQE that cannot be right (another request than the next).
    #[inline]
    pub(crate) fn match_cqe(&self, recv: bool, wr_id: u64) -> Result<Option<u32>> {
        if recv && self.srq {
            // A receive from the shared queue: completions come in no order across its QPs;
            // the SRQ gets its credit back.
            if let Some(c) = self.srq_done {
                // SAFETY: the SRQ outlives the QPs that receive from it (the provider contract
                // of create_qp), and this QP is alive (the table rule).
                if !unsafe { c.as_ref() }.complete(wr_id) {
                    return Err(Error::bad_value(
                        Op::PollCq,
                        &"CQE wr_id (no SRQ receive outstanding)",
                        wr_id,
                    ));
                }
            }
            return Ok(Some(0));
        }
        let q = if recv { &self.rq } else { &self.sq };
        let late = q.ctl.late.load(Ordering::Relaxed);
        if late != 0 {
            // A CQE of a request finished before (flushed or discarded): dropped, its room
            // free.
            q.ctl.late.store(late - 1, Ordering::Relaxed);
            q.give_room(1);
            return Ok(None);
        }
        let done = q.ctl.done.load(Ordering::Relaxed);
        if done == q.ctl.tail.load(Ordering::Acquire) {
            // Nothing outstanding: a late CQE for a request already flushed (or one the
            // device invented). Every request completes once: drop it.
            return Ok(None);
        }
        let (posted, tag) = q.posted(done);
        if posted != wr_id {
            if q.ctl.flush.load(Ordering::Acquire) != 0 {
                // The queue is being flushed: a late CQE for a request already flushed.
                return Ok(None);
            }
            return Err(Error::bad_value(
                Op::PollCq,
                &"CQE wr_id (not the next request)",
                wr_id,
            ));
        }
        q.ctl.done.store(done.wrapping_add(1), Ordering::Release);
        q.give_room(1);
        Ok(Some(tag))
    }
}

// The control block is created in place by `QpCtlMem::new` and dropped with its memory.
impl QueueView {
    fn new(
        ring: Ring,
        shadow: NonNull<Shadow>,
        parked: Option<(NonNull<AtomicU64>, u32)>,
        (room, room_cap): Room,
    ) -> Self {
        QueueView {
            ctl: QueueCtl {
                done: AtomicU32::new(0),
                tail: AtomicU32::new(0),
                flush: AtomicU32::new(0),
                late: AtomicU32::new(0),
                unpublished: AtomicU32::new(0),
            },
            ring,
            shadow,
            parked,
            room,
            room_cap,
        }
    }

    /// A metered queue gives back the CQ room of `n` of its requests (a queue with its depth
    /// reserved has nothing to give). The room a metered queue holds is never counted apart:
    /// it is its poster's credit (one entry per request it took room for) minus the requests
    /// completed (`done`), plus the CQEs still owed for requests finished before (`late`).
    pub(crate) fn give_room(&self, n: u32) {
        if let Some(room) = self.room {
            unreserve(room, n, self.room_cap);
        }
    }

    /// The room a metered queue holds while its poster's credit is `credit` (see
    /// [`give_room`](Self::give_room)).
    pub(crate) fn held(&self, credit: u32) -> u32 {
        let (done, late) = (
            self.ctl.done.load(Ordering::Acquire),
            self.ctl.late.load(Ordering::Acquire),
        );
        credit.wrapping_sub(done).wrapping_add(late)
    }

    /// The common case of [`QpCtl::match_cqe`] for this queue, with no effect otherwise: when
    /// a request is outstanding and the next one carries `wr_id` (and, unless `tags`, no safe
    /// buffer), counts it complete and gives its tag (the safe path's buffer tag + 1, or 0).
    /// `None` leaves the CQE to the general match (nothing outstanding, another `wr_id`, a
    /// buffer to hand back).
    #[inline]
    pub(crate) fn take_next(&self, wr_id: u64, tags: bool) -> Option<u32> {
        let done = self.ctl.done.load(Ordering::Relaxed);
        if done == self.ctl.tail.load(Ordering::Acquire) {
            return None;
        }
        let (posted, tag) = self.posted(done);
        if posted != wr_id || (!tags && tag != 0) {
            return None;
        }
        self.ctl.done.store(done.wrapping_add(1), Ordering::Release);
        Some(tag)
    }

    /// The `wr_id` and buffer tag of request `n` (free-running), as the driver wrote them.
    #[inline]
    pub(crate) fn posted(&self, n: u32) -> (u64, u32) {
        let i = (n & (self.ring.slots() - 1)) as usize;
        // SAFETY: the shadow has one entry per ring slot (`QpCtlMem::new`), i < slots.
        let e = unsafe { self.shadow.as_ptr().add(i).read() };
        (e.wr_id, e.tag)
    }

    /// Whether request `n` (outstanding: done ≤ n < tail) was taken by the device already
    /// (behind its consumer index, checked; an impossible index counts every published
    /// request as taken, the safe answer). A request posted in ERR was never published: not
    /// taken.
    pub(crate) fn consumed(&self, n: u32, done: u32) -> bool {
        // `unpublished` before `tail` (see the field): never more than there are.
        let unpublished = self.ctl.unpublished.load(Ordering::Acquire);
        let tail = self.ctl.tail.load(Ordering::Acquire);
        let published = tail.wrapping_sub(unpublished);
        if tail.wrapping_sub(n) <= unpublished {
            return false;
        }
        let wrap = 2 * self.ring.slots() - 1;
        let cons = self.ring.cons().load(Ordering::Acquire);
        let waiting = self.ring.index(published).wrapping_sub(cons) & wrap;
        let waiting = if cons & !wrap != 0 || waiting > published.wrapping_sub(done) {
            0
        } else {
            waiting
        };
        published.wrapping_sub(n) > waiting
    }

    /// Hands back the safe buffer of outstanding request `n` that will not complete (flush,
    /// reset), or parks it: a receive buffer the device already took stays out of the pool
    /// until the QP is destroyed, since a device that only records ERROR and RESET (QEMU's host
    /// QP keeps its receives) may still write it. `recv` says which queue this is.
    pub(crate) fn give_back(&self, n: u32, done: u32, recv: bool, release: Option<BufRelease>) {
        let (_, tag) = self.posted(n);
        let (Some(rel), true) = (release, tag != 0) else {
            return;
        };
        if recv && self.consumed(n, done) {
            self.park(n);
            return;
        }
        // SAFETY: a safe request of this queue that will never complete: its buffer goes back
        // once, here, and the device never took it (or only reads it).
        unsafe { rel.release(tag - 1) };
    }

    /// Parks request `n`'s buffer (kept until the QP is destroyed): its bit is set in the
    /// queue's parked set and its slot's record forgets it (the next post into the slot
    /// overwrites the record, never the parked set). The caller holds the locks that make the
    /// slot's record its own (a flush or reset of this queue).
    pub(crate) fn park(&self, n: u32) {
        let i = (n & (self.ring.slots() - 1)) as usize;
        // SAFETY: as in `posted`; the record is this caller's (above).
        let e = unsafe { &mut *self.shadow.as_ptr().add(i) };
        let Some(index) = e.tag.checked_sub(1) else {
            return;
        };
        e.tag = 0;
        match self.parked {
            Some((set, words)) if index / 64 < words => {
                // SAFETY: word index / 64 < words of the set (`QpCtlMem::new`).
                let w = unsafe { set.add((index / 64) as usize).as_ref() };
                w.fetch_or(1 << (index % 64), Ordering::Relaxed);
            }
            // A tag from this QP's pool is below its count: cannot happen.
            _ => crate::error::warn_msg("parked buffer outside its pool (kept for good)"),
        }
    }

    /// Hands back every parked buffer (the device has dropped the QP).
    pub(crate) fn release_parked(&self, release: Option<BufRelease>) {
        let (Some((set, words)), Some(rel)) = (self.parked, release) else {
            return;
        };
        for k in 0..words {
            // SAFETY: k < words of the set (`QpCtlMem::new`); the QP is gone from the device
            // and from the table, so nothing else reads or writes it.
            let w = unsafe { set.add(k as usize).as_ref() };
            let mut bits = w.swap(0, Ordering::Relaxed);
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                // SAFETY: parked once (its record forgot it), released once (the bit is
                // cleared).
                unsafe { rel.release(k * 64 + b) };
            }
        }
    }
}

/// A control block, the record of the attributes last set, and the shadows, in
/// driver-private DMA memory (in that order).
pub(crate) struct QpCtlMem<H: Hal> {
    mem: Dma<H>,
}

/// Where the record of the attributes last set lies after the control block.
const RECORD_AT: usize = size_of::<QpCtl>().next_multiple_of(16);
/// Where the shadows start.
const SHADOWS_AT: usize = (RECORD_AT + size_of::<ModifyAttr>()).next_multiple_of(16);
const _: () = assert!(align_of::<QpCtl>() <= 16 && align_of::<ModifyAttr>() <= 16);
const _: () = assert!(align_of::<Shadow>() <= 16);

impl<H: Hal> QpCtlMem<H> {
    /// Allocates and initialises a control block for the rings `sq` and `rq`, with a record
    /// (`Shadow`) per ring slot.
    #[inline(never)]
    pub(crate) fn new(
        hal: &H,
        (sq, rq): (Ring, Ring),
        (qpn, handle): (u32, u32),
        srq_done: Option<NonNull<SrqCounters>>,
        release: Option<BufRelease>,
        (sq_room, rq_room): (Room, Room),
    ) -> Result<Self> {
        let head = SHADOWS_AT;
        let shadows = (sq.slots() + rq.slots()) as usize * size_of::<Shadow>();
        // The receive queue's parked set: a bit per buffer of the pool, after the records.
        let words = release.map_or(0, |r| r.count().div_ceil(64));
        let pages = (head + shadows + words as usize * 8).div_ceil(PAGE_SIZE);
        let mem = Dma::new(hal, pages)?;
        let base = mem.base();
        // SAFETY: the three offsets lie inside the `pages` pages just allocated (zeroed); the
        // set's offset is a multiple of 8 (16-byte records from a 16-byte boundary).
        let (sq_shadow, rq_shadow, parked) = unsafe {
            let s = base.add(head).cast::<Shadow>();
            let set = base.add(head + shadows).cast::<AtomicU64>();
            (
                s,
                s.add(sq.slots() as usize),
                (words != 0).then_some((set, words)),
            )
        };
        let ctl = QpCtl {
            sq: QueueView::new(sq, sq_shadow, None, sq_room),
            rq: QueueView::new(rq, rq_shadow, parked, rq_room),
            qpn,
            handle,
            srq: srq_done.is_some(),
            srq_done,
            release,
        };
        // SAFETY: the memory is ours, page-aligned (so aligned for QpCtl and, at RECORD_AT, a
        // multiple of 16, for the record) and large enough (`head` covers both).
        unsafe {
            base.cast::<QpCtl>().write(ctl);
            let mut record = ModifyAttr::to_state(QpState::Reset);
            record.mask = QpAttrMask::empty();
            base.add(RECORD_AT).cast::<ModifyAttr>().write(record);
        }
        Ok(QpCtlMem { mem })
    }

    /// The control block (it never moves).
    #[inline]
    pub(crate) fn ctl(&self) -> &QpCtl {
        // SAFETY: initialised in `new`; lives as long as `self`; only atomics are mutated
        // through shared references.
        unsafe { self.mem.base().cast::<QpCtl>().as_ref() }
    }

    pub(crate) fn ptr(&self) -> NonNull<QpCtl> {
        self.mem.base().cast()
    }

    /// The attributes the driver last set (the state and every attribute a modify named),
    /// read by queries where the device reports none. Pollers never touch it.
    pub(crate) fn record(&self) -> &ModifyAttr {
        // SAFETY: initialised in `new` at RECORD_AT (aligned, inside the memory); only written
        // through `record_mut`, which needs `&mut self`.
        unsafe { self.mem.base().add(RECORD_AT).cast::<ModifyAttr>().as_ref() }
    }

    /// The record, to update after a modify (the QP is held exclusively).
    pub(crate) fn record_mut(&mut self) -> &mut ModifyAttr {
        // SAFETY: as in `record`; `&mut self` makes this the only reference to it (pollers
        // reach the control block and the shadows, never these bytes).
        unsafe { self.mem.base().add(RECORD_AT).cast::<ModifyAttr>().as_mut() }
    }
}

/// Sentinels for a table entry's handle (device handles have 24 bits).
const EMPTY: u32 = u32::MAX;
const GONE: u32 = u32::MAX - 1;

#[repr(C)]
struct Entry {
    handle: AtomicU32,
    _pad: u32,
    /// The identities of the send and receive CQ (`Cq::id`).
    send_cq: AtomicU64,
    recv_cq: AtomicU64,
    ctl: AtomicPtr<QpCtl>,
}

/// Open-addressed table of live QPs by handle (linear probing, tombstones). Its memory ends
/// with one more page of driver-private bookkeeping that has no better home: the values of
/// the bound GIDs (`gid.rs`), 16 bytes for each of 256 indices.
pub(crate) struct QpTable<H: Hal> {
    mem: Dma<H>,
    mask: u32,
}

impl<H: Hal> QpTable<H> {
    /// A table for at least `max_qp` live QPs (twice as many entries, a power of two), and
    /// the GID page.
    pub(crate) fn new(hal: &H, max_qp: u32) -> Result<Self> {
        let n = (max_qp.clamp(1, 1 << 16) * 2).next_power_of_two();
        let pages = (n as usize * size_of::<Entry>()).div_ceil(PAGE_SIZE);
        let mem = Dma::new(hal, pages + 1)?;
        let t = QpTable { mem, mask: n - 1 };
        for i in 0..n {
            t.entry(i).handle.store(EMPTY, Ordering::Relaxed);
        }
        Ok(t)
    }

    /// Where the GID page starts (after the entries, page-aligned).
    fn gid_page(&self) -> usize {
        ((self.mask as usize + 1) * size_of::<Entry>()).next_multiple_of(PAGE_SIZE)
    }

    /// The value recorded for GID `index` (< 256).
    pub(crate) fn gid_value(&self, index: u8) -> [u8; 16] {
        self.mem.read(self.gid_page() + usize::from(index) * 16)
    }

    /// Records the value of GID `index` (< 256); the caller holds the command lock.
    pub(crate) fn set_gid_value(&self, index: u8, gid: [u8; 16]) {
        self.mem
            .write(self.gid_page() + usize::from(index) * 16, gid);
    }

    fn entry(&self, i: u32) -> &Entry {
        let i = (i & self.mask) as usize;
        // SAFETY: i ≤ mask, and mask + 1 entries fit the memory (`new`); Entry is atomics only.
        unsafe { &*self.mem.base().as_ptr().cast::<Entry>().add(i) }
    }

    fn start(&self, handle: u32) -> u32 {
        handle.wrapping_mul(0x9E37_79B1) >> 8
    }

    /// Adds a QP. A handle already present is the device's error (two live QPs cannot share
    /// one). The caller holds the command lock and the poll locks of both CQs.
    pub(crate) fn insert(
        &self,
        handle: u32,
        (send_cq, recv_cq): (u64, u64),
        ctl: NonNull<QpCtl>,
    ) -> Result<()> {
        if self.find(handle).is_some() {
            return Err(Error::bad_value(
                Op::CreateQp,
                &"qp_handle (in use)",
                handle,
            ));
        }
        let s = self.start(handle);
        for i in 0..=self.mask {
            let e = self.entry(s.wrapping_add(i));
            let h = e.handle.load(Ordering::Relaxed);
            if h == EMPTY || h == GONE {
                e.ctl.store(ctl.as_ptr(), Ordering::Relaxed);
                e.send_cq.store(send_cq, Ordering::Relaxed);
                e.recv_cq.store(recv_cq, Ordering::Relaxed);
                e.handle.store(handle, Ordering::Release);
                return Ok(());
            }
        }
        // Cannot happen: the table has twice the entries of the QPs the driver lets live.
        Err(Error::bad_value(Op::CreateQp, &"qp table full", handle))
    }

    fn find(&self, handle: u32) -> Option<&Entry> {
        let s = self.start(handle);
        for i in 0..=self.mask {
            let e = self.entry(s.wrapping_add(i));
            match e.handle.load(Ordering::Acquire) {
                h if h == handle => return Some(e),
                EMPTY => return None,
                _ => {}
            }
        }
        None
    }

    /// The control block of QP `handle`, whatever its CQs.
    pub(crate) fn lookup_ctl(&self, handle: u32) -> Option<NonNull<QpCtl>> {
        NonNull::new(self.find(handle)?.ctl.load(Ordering::Relaxed))
    }

    /// Removes a QP (the caller holds the locks of `insert`).
    pub(crate) fn remove(&self, handle: u32) {
        if let Some(e) = self.find(handle) {
            e.handle.store(GONE, Ordering::Release);
        }
    }

    /// The control block of QP `handle` and whether its sends and its receives complete to
    /// CQ `cq`; `None` for a QP that does not exist or completes only to other CQs.
    pub(crate) fn lookup(&self, handle: u32, cq: u64) -> Option<(NonNull<QpCtl>, bool, bool)> {
        let e = self.find(handle)?;
        let send = e.send_cq.load(Ordering::Relaxed) == cq;
        let recv = e.recv_cq.load(Ordering::Relaxed) == cq;
        if !send && !recv {
            return None;
        }
        Some((NonNull::new(e.ctl.load(Ordering::Relaxed))?, send, recv))
    }

    /// Whether a live QP receives from the SRQ whose counters are `srq` and completes its
    /// receives to CQ `cq` (the pair holds one reservation, however many QPs it has).
    pub(crate) fn srq_pair(&self, cq: u64, srq: NonNull<SrqCounters>) -> bool {
        let mut found = false;
        self.for_each_on(cq, |ctl, _, recv| {
            found |= recv && ctl.srq_done == Some(srq)
        });
        found
    }

    /// Calls `f` with each live QP completing to CQ `cq` (either role).
    pub(crate) fn for_each_on(&self, cq: u64, mut f: impl FnMut(&QpCtl, bool, bool)) {
        for i in 0..=self.mask {
            let e = self.entry(i);
            let h = e.handle.load(Ordering::Acquire);
            if h == EMPTY || h == GONE {
                continue;
            }
            let (s, r) = (
                e.send_cq.load(Ordering::Relaxed) == cq,
                e.recv_cq.load(Ordering::Relaxed) == cq,
            );
            if let (true, Some(p)) = (s || r, NonNull::new(e.ctl.load(Ordering::Relaxed))) {
                // SAFETY: an entry naming `cq` stays valid while the caller holds that CQ's
                // poll lock (the module's locking rule).
                f(unsafe { p.as_ref() }, s, r);
            }
        }
    }
}
