//! Shared receive queues: a ring of receive requests in HAL memory that the responder of
//! every QP attached to it takes from, with the limit event.

use core::cell::UnsafeCell;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use bareverbs_hal::{Clock, Hal, Link};

use super::mem::Pd;
use super::rings::AsyncRing;
use super::wqe::RqEntry;
use super::{MAX_SGE, MAX_SRQ_WR, Rxe};
use crate::dma::Dma;
use crate::error::{Error, Holder, Object, Param, Queue, Resource, Result};
use crate::events::{Count, EventHub};
use crate::verbs::{RecvWr, SrqAttr};

/// Shared receive queues the device creates.
pub const MAX_SRQ: u32 = 16;

/// The SRQ's state, at the start of its block (the ring follows).
pub(crate) struct SrqCore {
    ring: NonNull<RqEntry>,
    cap: u32,
    head: u32,
    tail: u32,
    /// The limit event fires once fewer than this many requests are posted (0: disarmed).
    pub(crate) limit: u32,
    /// The SRQ's number (in its limit event).
    pub(crate) id: u32,
}

impl SrqCore {
    fn at(&mut self, i: u32) -> &mut RqEntry {
        // SAFETY: `cap` entries follow the header in the SRQ's block (valid zeroed), reached
        // through `&mut self` (under the device lock); the index is reduced modulo `cap`.
        unsafe { &mut *self.ring.as_ptr().add((i % self.cap) as usize) }
    }

    /// Moves the requests posted into `ring` (`cap` entries, owned by the SRQ from now on),
    /// in order; `Err` with their count when they do not fit, or with the armed limit when
    /// it is above `cap` (nothing changed). Under the device lock (`&mut self`).
    pub(crate) fn regrow(&mut self, ring: NonNull<RqEntry>, cap: u32) -> Result<(), Error> {
        let posted = self.head.wrapping_sub(self.tail);
        if cap < posted {
            return Err(Error::invalid(Param::SrqWrInUse, posted, cap));
        }
        if cap < self.limit {
            return Err(Error::invalid(Param::SrqLimit, self.limit, cap));
        }
        for k in 0..posted {
            let e = *self.at(self.tail.wrapping_add(k));
            // SAFETY: k < posted <= cap entries of the new ring (the caller's), which nothing
            // else reaches yet.
            unsafe { ring.as_ptr().add(k as usize).write(e) };
        }
        (self.ring, self.cap, self.head, self.tail) = (ring, cap, posted, 0);
        Ok(())
    }

    pub(crate) fn has(&self) -> bool {
        self.head != self.tail
    }

    /// Takes the oldest request; when that leaves fewer than the armed limit, raises the
    /// limit event (into `events`, waking the async-event reader) and disarms.
    pub(crate) fn take(&mut self, events: &mut AsyncRing, hub: &EventHub) -> Option<RqEntry> {
        if !self.has() {
            return None;
        }
        let e = *self.at(self.tail);
        self.tail = self.tail.wrapping_add(1);
        if self.limit != 0 && self.head.wrapping_sub(self.tail) < self.limit {
            self.limit = 0;
            events.push(self.id);
            hub.count(Count::Async);
            hub.async_waker().wake();
        }
        Some(e)
    }
}

/// A shared receive queue.
pub struct Srq<H: Hal> {
    _mem: Dma<H>,
    /// The ring of a resized SRQ (its first ring stays in `_mem`, unused): replaced only
    /// under the device lock, by a resize.
    ring_mem: UnsafeCell<Option<Dma<H>>>,
    pub(crate) core: NonNull<SrqCore>,
    /// The attributes as created (`max_wr`: see `max_wr`).
    attr: SrqAttr,
    /// Its size now (a resize changes it, under the device lock).
    max_wr: AtomicU32,
    pub(crate) users: AtomicU32,
    pd_users: NonNull<AtomicU32>,
    id: u32,
}

impl<H: Hal> Srq<H> {
    /// The SRQ's number, as its limit event names it
    /// ([`AsyncEvent::SrqLimitReached`](crate::events::AsyncEvent::SrqLimitReached)).
    pub fn number(&self) -> u32 {
        self.id
    }

    /// Keeps `mem`, the ring the core now names (a resize), dropping the one it replaces.
    ///
    /// # Safety
    ///
    /// The caller holds the device lock, and the core no longer names the ring replaced.
    pub(crate) unsafe fn keep_ring(&self, mem: Dma<H>, max_wr: u32) {
        // SAFETY: the caller's contract: `ring_mem` is reached only under the device lock.
        unsafe { *self.ring_mem.get() = Some(mem) };
        self.max_wr.store(max_wr, Ordering::Release);
    }

    /// Its attributes now (the size a resize gave it), the limit as created.
    pub(crate) fn attr(&self) -> SrqAttr {
        SrqAttr {
            max_wr: self.max_wr.load(Ordering::Acquire),
            ..self.attr
        }
    }
}

// SAFETY: the core and `ring_mem` are reached only under the device lock.
unsafe impl<H: Hal + Send> Send for Srq<H> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync> Sync for Srq<H> {}

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    pub(crate) fn plan_srq_impl(&self, attr: &SrqAttr) -> Result<SrqAttr> {
        if attr.max_wr > MAX_SRQ_WR {
            return Err(Error::invalid(Param::SrqMaxWr, attr.max_wr, MAX_SRQ_WR));
        }
        if attr.max_sge > MAX_SGE {
            return Err(Error::invalid(Param::SrqMaxSge, attr.max_sge, MAX_SGE));
        }
        Ok(SrqAttr {
            max_wr: attr.max_wr.max(1),
            max_sge: attr.max_sge.max(1),
            srq_limit: attr.srq_limit,
        })
    }

    pub(crate) fn create_srq_impl(&self, pd: &Pd, attr: &SrqAttr) -> Result<Srq<H>> {
        let attr = self.plan_srq_impl(attr)?;
        let at = size_of::<SrqCore>().next_multiple_of(64);
        let bytes = at + attr.max_wr as usize * size_of::<RqEntry>();
        let mem = Dma::new(&self.hal, bytes.div_ceil(bareverbs_hal::PAGE_SIZE))?;
        let mut guard = self.lock();
        let t = guard.tables();
        if t.srqs >= MAX_SRQ {
            return Err(Error::Resource(Resource::Objects {
                object: Object::Srq,
                limit: MAX_SRQ,
            }));
        }
        t.srqs += 1;
        t.srq_next = t.srq_next.wrapping_add(1);
        let id = t.srq_next;
        let core = mem.base().cast::<SrqCore>();
        // SAFETY: the block holds the header and the ring (valid zeroed) after it; the header
        // is written before any reference to it.
        unsafe {
            core.write(SrqCore {
                ring: mem.base().add(at).cast(),
                cap: attr.max_wr,
                head: 0,
                tail: 0,
                limit: attr.srq_limit,
                id,
            });
        }
        pd.users.fetch_add(1, Ordering::Relaxed);
        Ok(Srq {
            _mem: mem,
            ring_mem: UnsafeCell::new(None),
            core,
            attr,
            max_wr: AtomicU32::new(attr.max_wr),
            users: AtomicU32::new(0),
            pd_users: NonNull::from(&pd.users),
            id,
        })
    }

    pub(crate) fn destroy_srq_impl(
        &self,
        srq: Srq<H>,
    ) -> core::result::Result<(), (Srq<H>, Error)> {
        let users = srq.users.load(Ordering::Relaxed);
        if users != 0 {
            let e = Error::in_use(crate::error::Op::DestroySrq, Holder::Qps, users);
            return Err((srq, e));
        }
        self.lock().tables().srqs -= 1;
        // SAFETY: the PD outlives the SRQ (create_srq's contract).
        unsafe { srq.pd_users.as_ref() }.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) fn srq_core<'a>(
        &self,
        srq: &Srq<H>,
        _held: &'a mut super::Core<L>,
    ) -> &'a mut SrqCore {
        // SAFETY: the core lives as long as the SRQ and is reached only under the device
        // lock, which the caller holds.
        unsafe { &mut *srq.core.as_ptr() }
    }

    pub(crate) fn post_srq_impl(&self, srq: &Srq<H>, wrs: &[RecvWr<'_>]) -> Result<()> {
        if let Some(w) = wrs
            .iter()
            .find(|w| w.sg_list.len() > srq.attr.max_sge as usize)
        {
            return Err(Error::invalid(
                Param::NumSge,
                w.sg_list.len() as u64,
                srq.attr.max_sge,
            ));
        }
        let mut guard = self.lock();
        let s = self.srq_core(srq, &mut guard);
        let free = s.cap - s.head.wrapping_sub(s.tail);
        if wrs.len() > free as usize {
            return Err(Error::QueueFull {
                queue: Queue::Srq,
                free,
            });
        }
        for w in wrs {
            let mut e = RqEntry {
                wr_id: w.wr_id,
                nsge: w.sg_list.len() as u16,
                ..Default::default()
            };
            e.sges[..w.sg_list.len()].copy_from_slice(w.sg_list);
            *s.at(s.head) = e;
            s.head = s.head.wrapping_add(1);
        }
        Ok(())
    }

    pub(crate) fn modify_srq_impl(&self, srq: &Srq<H>, limit: u32) -> Result<()> {
        let mut guard = self.lock();
        let s = self.srq_core(srq, &mut guard);
        if limit > s.cap {
            return Err(Error::invalid(Param::SrqLimit, limit, s.cap));
        }
        s.limit = limit;
        Ok(())
    }

    pub(crate) fn query_srq_impl(&self, srq: &Srq<H>) -> SrqAttr {
        let mut guard = self.lock();
        let s = self.srq_core(srq, &mut guard);
        SrqAttr {
            max_wr: s.cap,
            srq_limit: s.limit,
            ..srq.attr
        }
    }
}
