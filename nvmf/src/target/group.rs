//! Poll groups: a target's I/O queues served by other cores ([`GroupLink`], `docs/percore.md`).
//!
//! Core 0's [`Target`] (made core 0 by [`Target::serve_groups`]) keeps the CM, the admin
//! queues, the controllers and the connection requests. When it accepts an I/O queue it may
//! hand it to a poll group: another target (made a group by [`Target::join_group`]) that
//! another core polls with [`Target::poll_group`]. The QP is created on the group's
//! completion queue and moved to it whole with its region; from then on only the group's
//! core touches the queue, its buffers and its counts, until it ends. Core 0 keeps a
//! placeholder of the queue (its connection, queue ID, station and controller).
//!
//! The two talk through a [`GroupLink`]: two single-producer, single-consumer rings, one each
//! way, used on a queue's control path only (its hand-over, its Connect, which core 0 checks
//! against the controller table, its end, its error-log entries and, every
//! [`PROGRESS_EVERY_US`], its counts and keep-alive stamp). No message passes per I/O, and
//! nothing the link holds is written per I/O: a command arrives on the group's CQ, runs on
//! its core's handle of the medium, and its data and response go out from its core.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use bareverbs::cm::{ConnId, ConnectRequest};
use bareverbs::hal::Clock;
use bareverbs::verbs::{CompletionQueue, MemoryRegion, Provider, QueuePair, Rc, Rts};

use super::counts::IoCounts;
use super::ctrl::{Ctrl, Which};
use super::exec::Fail;
use super::queue::Cmd;
use super::{CoreCounts, LossCause, RefusalReason, Target, TargetError};
use crate::wire::cm::CmReq;
use crate::wire::fabrics::{CONNECT_DATA_LEN, Nqn};
use crate::wire::log::ErrorEntry;
use crate::wire::{SQE_LEN, Sqe, Status};

/// Messages a ring holds.
pub(super) const RING: usize = 64;
/// I/O queues a poll group serves at most (so that its rings never fill with the messages
/// that must not be lost: a hand-over, a Connect and an end a queue).
pub const GROUP_QUEUES: usize = 16;
/// How often a group reports each of its queues' counts and keep-alive stamps to core 0
/// (µs of its clock).
pub const PROGRESS_EVERY_US: u64 = 100_000;

/// A single-producer, single-consumer ring: [`GroupLink::claim`] gives each side to one
/// target, so one thread pushes and one pops.
struct Ring<T> {
    /// Messages pushed (written by the producer only).
    head: AtomicU32,
    /// Messages popped (written by the consumer only).
    tail: AtomicU32,
    slots: [UnsafeCell<MaybeUninit<T>>; RING],
}

// SAFETY: a slot is written by the producer before it publishes it (release of `head`) and
// read by the consumer after it saw it published (acquire), then given back (release of
// `tail`) before the producer, which acquires `tail`, writes it again: no slot is accessed by
// both at once. The messages move between threads, so they must be `Send`.
unsafe impl<T: Send> Sync for Ring<T> {}

impl<T> Ring<T> {
    fn new() -> Self {
        Ring {
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
            slots: [const { UnsafeCell::new(MaybeUninit::uninit()) }; RING],
        }
    }

    /// Messages in the ring now (as one side sees it).
    fn len(&self) -> usize {
        let h = self.head.load(Ordering::Acquire);
        let t = self.tail.load(Ordering::Acquire);
        h.wrapping_sub(t) as usize
    }

    /// Pushes `m`, or hands it back when the ring is full.
    ///
    /// # Safety
    ///
    /// Only one thread pushes to this ring (its producer).
    unsafe fn push(&self, m: T) -> Result<(), T> {
        let h = self.head.load(Ordering::Relaxed);
        let t = self.tail.load(Ordering::Acquire);
        if h.wrapping_sub(t) as usize >= RING {
            return Err(m);
        }
        let slot = &self.slots[h as usize % RING];
        // SAFETY: the slot is free (the consumer gave it back: `tail` acquired past it) and
        // only this thread, the one producer, writes slots.
        unsafe { (*slot.get()).write(m) };
        self.head.store(h.wrapping_add(1), Ordering::Release);
        Ok(())
    }

    /// Pops the oldest message.
    ///
    /// # Safety
    ///
    /// Only one thread pops from this ring (its consumer).
    unsafe fn pop(&self) -> Option<T> {
        let t = self.tail.load(Ordering::Relaxed);
        let h = self.head.load(Ordering::Acquire);
        if h == t {
            return None;
        }
        let slot = &self.slots[t as usize % RING];
        // SAFETY: the producer wrote the slot before publishing it (`head` acquired past
        // it); only this thread, the one consumer, reads slots, each once before giving it
        // back.
        let m = unsafe { (*slot.get()).assume_init_read() };
        self.tail.store(t.wrapping_add(1), Ordering::Release);
        Some(m)
    }
}

// No `Drop`: a ring's messages are dropped by the targets that leave it (`leave`), so that
// a link may hold references that live exactly as long as itself (the targets' `'a`).

/// A queue core 0 hands to a group: the accepted QP, its region, and what the queue is.
pub(super) struct Adopt<'a, P: Provider> {
    pub id: (u8, u16),
    pub conn: ConnId,
    pub qid: u16,
    pub depth: u16,
    pub capsule: u32,
    pub slots: u16,
    pub slot_len: u32,
    pub station: [u8; 4],
    pub opened_us: u64,
    pub qp: QueuePair<'a, P, Rc, Rts>,
    pub mr: MemoryRegion<'a, P>,
}

/// Core 0 to a group. A queue is named by its place in core 0's table and that place's
/// generation (`id`), which outlives its reuse.
// The messages sit in a ring's fixed slots (no heap to box a large one in): a slot is the
// size of the largest, a few KB a ring.
#[allow(clippy::large_enum_variant)]
pub(super) enum ToGroup<'a, P: Provider> {
    /// Serve this queue.
    Adopt(Adopt<'a, P>),
    /// End this queue (core 0 decided: a disconnection, its controller lost or reset).
    End { id: (u8, u16) },
    /// ANA group `grpid` of subsystem `subsystem` is now in `state` (core 0 changed it: the
    /// group's queues refuse I/O or serve it as core 0's do).
    Ana {
        subsystem: usize,
        grpid: u32,
        state: crate::wire::ana::AnaState,
    },
    /// The answer to a Connect the group passed on: the status, and the controller it is
    /// bound to (a copy: what the I/O path reads of it).
    Connected {
        id: (u8, u16),
        slot: u16,
        res: Result<u64, Fail>,
        ctrl: Option<Ctrl>,
    },
}

/// A group to core 0.
#[allow(clippy::large_enum_variant)]
pub(super) enum ToCore0 {
    /// A Connect on a queue the group serves, for core 0 to check and bind (`slot`: the
    /// command's).
    Connect {
        id: (u8, u16),
        slot: u16,
        sqe: Sqe,
        data: [u8; CONNECT_DATA_LEN],
    },
    /// A queue ended: its counts at the end; `by_group`: the group ended it (a transport
    /// error), so core 0 disconnects it.
    Ended {
        id: (u8, u16),
        cntlid: Option<u16>,
        counts: IoCounts,
        by_group: bool,
    },
    /// An error-log entry of a command of a queue's controller.
    Error { cntlid: u16, entry: ErrorEntry },
    /// A queue's counts so far and when its last command arrived.
    Progress {
        id: (u8, u16),
        counts: IoCounts,
        last_us: u64,
    },
}

/// The link between core 0's target and one poll group: the group's completion queue (core
/// 0 creates the QPs it hands over on it), the two rings, and the group's published totals.
/// Lives as long as both targets (`'a`).
pub struct GroupLink<'a, P: Provider> {
    pub(super) cq: &'a CompletionQueue<'a, P>,
    to_group: Ring<ToGroup<'a, P>>,
    to_core0: Ring<ToCore0>,
    claimed: [AtomicBool; 2],
    /// What the group published (written by the group only, on its own cache line).
    published: Published,
}

/// The group's totals, on a cache line of their own.
#[repr(align(64))]
struct Published {
    commands: AtomicU64,
    errors: AtomicU64,
    queues: AtomicU32,
}

impl<'a, P: Provider> GroupLink<'a, P> {
    /// A link for a group that completes its queues' work on `cq` (which must hold every
    /// outstanding work request of [`GROUP_QUEUES`] queues: `GROUP_QUEUES × 4 × D` entries
    /// covers it; queues that do not fit are refused).
    pub fn new(cq: &'a CompletionQueue<'a, P>) -> Self {
        GroupLink {
            cq,
            to_group: Ring::new(),
            to_core0: Ring::new(),
            claimed: [AtomicBool::new(false), AtomicBool::new(false)],
            published: Published {
                commands: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                queues: AtomicU32::new(0),
            },
        }
    }

    /// Claims side `side` (0: core 0's target, 1: the group's) for one target: false when
    /// another target has it already.
    pub(super) fn claim(&self, side: usize) -> bool {
        !self.claimed[side].swap(true, Ordering::AcqRel)
    }

    /// Gives side `side` back (its target is dropped).
    fn release(&self, side: usize) {
        self.claimed[side].store(false, Ordering::Release);
    }

    /// Whether a group serves the link's far end now.
    pub(super) fn has_group(&self) -> bool {
        self.claimed[1].load(Ordering::Acquire)
    }

    /// Drops what core 0 sent that no group will take (a QP handed over, then its region),
    /// as the consumer of the ring to the group: only by the group, or by core 0 when it
    /// holds the group's side itself.
    fn drain_to_group(&self) {
        // SAFETY: the caller holds side 1, the consumer's, of this ring.
        while let Some(m) = unsafe { self.to_group.pop() } {
            drop(m);
        }
    }

    /// Commands the group answered so far (what it published at the end of its last poll).
    pub fn commands(&self) -> u64 {
        self.published.commands.load(Ordering::Relaxed)
    }

    /// Commands the group answered with an error status so far.
    pub fn errors(&self) -> u64 {
        self.published.errors.load(Ordering::Relaxed)
    }

    /// I/O queues the group serves now.
    pub fn queues(&self) -> u32 {
        self.published.queues.load(Ordering::Relaxed)
    }

    /// The group publishes its totals (its side only).
    pub(super) fn publish(&self, commands: u64, errors: u64, queues: u32) {
        let p = &self.published;
        if p.commands.load(Ordering::Relaxed) != commands {
            p.commands.store(commands, Ordering::Relaxed);
        }
        if p.errors.load(Ordering::Relaxed) != errors {
            p.errors.store(errors, Ordering::Relaxed);
        }
        if p.queues.load(Ordering::Relaxed) != queues {
            p.queues.store(queues, Ordering::Relaxed);
        }
    }

    /// Core 0 sends `m` (core 0's side only: see [`claim`](Self::claim)); false when the
    /// ring is full (`m` is dropped: a QP handed over is destroyed, then its region).
    pub(super) fn send_to_group(&self, m: ToGroup<'a, P>) -> bool {
        // SAFETY: only the target that claimed side 0 calls this (its `&mut self` methods).
        unsafe { self.to_group.push(m) }.is_ok()
    }

    /// The group takes the next message (the group's side only).
    pub(super) fn take_for_group(&self) -> Option<ToGroup<'a, P>> {
        // SAFETY: only the target that claimed side 1 calls this.
        unsafe { self.to_group.pop() }
    }

    /// The group sends `m` (the group's side only); false when the ring is full.
    pub(super) fn send_to_core0(&self, m: ToCore0) -> bool {
        // SAFETY: only the target that claimed side 1 calls this.
        unsafe { self.to_core0.push(m) }.is_ok()
    }

    /// Whether the ring to core 0 has room for a message that may be dropped (an error-log
    /// entry, a progress report) while leaving half of it for those that may not.
    pub(super) fn room_for_optional(&self) -> bool {
        self.to_core0.len() < RING / 2
    }

    /// Core 0 takes the next message (core 0's side only).
    pub(super) fn take_for_core0(&self) -> Option<ToCore0> {
        // SAFETY: only the target that claimed side 0 calls this.
        unsafe { self.to_core0.pop() }
    }
}

/// What a target is: alone, core 0 of some groups, or a group of core 0.
pub(super) enum Role<'a, P: Provider> {
    Alone,
    Core0(&'a [GroupLink<'a, P>]),
    Group(&'a GroupLink<'a, P>),
}

impl<P: Provider> Role<'_, P> {
    pub(super) fn is_group(&self) -> bool {
        matches!(self, Role::Group(_))
    }
}

impl<P: Provider> Clone for Role<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P: Provider> Copy for Role<'_, P> {}

impl<'a, P: Provider, K: Clock, const Q: usize, const D: usize> Target<'a, '_, P, K, Q, D> {
    /// Makes this target core 0 of the poll groups at the other ends of `links`: from now on
    /// it hands I/O queues to them as well as serving some itself (each new I/O queue goes
    /// to the core with the fewest, ties to core `qid mod cores`; `docs/percore.md`).
    /// Each group's target must list the same subsystems, in the same order, over the same
    /// media (its own handles of them), and have the same configuration and depth `D` (a
    /// queue handed over keeps the depth core 0 accepted, up to the group's `D`).
    ///
    /// # Errors
    ///
    /// [`TargetError::Config`] when the target already serves queues or has a role, when
    /// there are more than 255 links, or when a link already has a core 0.
    pub fn serve_groups(&mut self, links: &'a [GroupLink<'a, P>]) -> Result<(), TargetError> {
        if !matches!(self.role.0, Role::Alone) || self.span != 0 || links.len() > 255 {
            return Err(TargetError::Config("poll groups"));
        }
        for (k, l) in links.iter().enumerate() {
            if !l.claim(0) {
                // Let go of those claimed: they stay usable by another core 0.
                for l in &links[..k] {
                    l.release(0);
                }
                return Err(TargetError::Config("poll groups"));
            }
        }
        self.role.0 = Role::Core0(links);
        Ok(())
    }

    /// Makes this target the poll group at one end of `link`: it serves the I/O queues core
    /// 0 hands it, polled by [`poll_group`](Self::poll_group) on its own core (never with
    /// the CM). Its completion queue must be the link's.
    ///
    /// # Errors
    ///
    /// [`TargetError::Config`] when the target already serves queues or has a role, its CQ
    /// is not the link's, or the link already has a group.
    pub fn join_group(&mut self, link: &'a GroupLink<'a, P>) -> Result<(), TargetError> {
        if !matches!(self.role.0, Role::Alone)
            || self.span != 0
            || !core::ptr::eq(self.cq, link.cq)
            || !link.claim(1)
        {
            return Err(TargetError::Config("poll group"));
        }
        self.role.0 = Role::Group(link);
        Ok(())
    }

    /// What each core serves: core 0 (this target's own I/O queues) first, then each poll
    /// group as it last published. A target without groups has one core.
    pub fn cores(&self) -> impl Iterator<Item = CoreCounts> + '_ {
        let own = CoreCounts {
            io_queues: self.queues[..self.span]
                .iter()
                .filter(|q| q.in_use() && q.qid != 0 && q.remote.is_none())
                .count() as u32,
            io_commands: self.io_commands,
        };
        let links: &[GroupLink<'a, P>] = match self.role.0 {
            Role::Core0(links) => links,
            _ => &[],
        };
        core::iter::once(own).chain(links.iter().map(|l| CoreCounts {
            io_queues: l.queues(),
            io_commands: l.commands(),
        }))
    }

    /// The core an I/O queue asked for with `req` from `station` goes to: `None` this one,
    /// `Some(g)` group `g`.
    pub(super) fn pick_group(&self, req: &CmReq, station: [u8; 4]) -> Option<usize> {
        let Role::Core0(links) = self.role.0 else {
            return None;
        };
        if !self.may_leave_core0(req, station) {
            return None;
        }
        let qid = req.qid;
        let cores = links.len() + 1;
        let mut load = [0u16; 256];
        for q in self.queues[..self.span]
            .iter()
            .filter(|q| q.in_use() && q.qid != 0)
        {
            load[q.remote.map_or(0, |g| usize::from(g) + 1)] += 1;
        }
        // A group is full at GROUP_QUEUES (its rings are sized for that many).
        let open =
            |c: usize| c == 0 || (usize::from(load[c]) < GROUP_QUEUES && links[c - 1].has_group());
        let least = (0..cores).filter(|&c| open(c)).map(|c| load[c]).min()?;
        // Queue 1 to the first group: a host with one I/O queue (one CPU of its own) then
        // has its commands run beside core 0's transport, not behind it.
        let preferred = usize::from(qid) % cores;
        let core = if open(preferred) && load[preferred] == least {
            preferred
        } else {
            (0..cores).find(|&c| open(c) && load[c] == least)?
        };
        core.checked_sub(1)
    }

    /// Whether I/O queue `req.qid` asked for from `station` may go to a poll group: always when
    /// every subsystem is reachable from the groups; otherwise only when the controller it is
    /// for belongs to such a subsystem. Newer hosts name that controller in the request
    /// (`req.cntlid`); a host that names none (0: Linux 6.1's nvme-rdma, for one) is placed
    /// by the controllers made from its station that still wait for a queue of that ID (the
    /// admin queue's Connect comes before its I/O queues' requests): a group when every one
    /// of them is of such a subsystem, core 0 otherwise, or when there is none. Core 0
    /// serves every subsystem; a queue placed on a group whose Connect then names a
    /// controller of a core-0-only subsystem is refused there (`connect`).
    fn may_leave_core0(&self, req: &CmReq, station: [u8; 4]) -> bool {
        if !self.subsystems.iter().any(|s| s.core0_only) {
            return true;
        }
        let reachable = |x: &Ctrl| match x.which {
            Which::Nvm(k) => self.subsystems.get(k).is_some_and(|s| !s.core0_only),
            Which::Discovery => false,
        };
        if req.cntlid != 0 {
            return self
                .ctrls
                .iter()
                .flatten()
                .find(|x| x.cntlid == req.cntlid && x.station == station)
                .is_some_and(reachable);
        }
        let mut verdict = None;
        for (c, x) in self.ctrls.iter().enumerate() {
            let Some(x) = x else { continue };
            if x.station != station || x.which == Which::Discovery {
                continue;
            }
            let limit = if x.io_granted == 0 {
                self.cfg.max_io_queues
            } else {
                x.io_granted
            };
            let taken = self.queues[..self.span]
                .iter()
                .any(|q| q.in_use() && q.ctrl == Some(c) && q.qid == req.qid);
            if req.qid > limit || taken {
                continue;
            }
            let ok = reachable(x);
            if verdict.is_some_and(|v| v != ok) {
                return false;
            }
            verdict = Some(ok);
        }
        verdict.unwrap_or(false)
    }

    /// Hands accepted I/O queue `q` (its QP on group `g`'s CQ) to group `g`, keeping a
    /// placeholder. On failure (the group's ring full) the QP and region are dropped and `q`
    /// stays free: the caller disconnects.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hand_over(
        &mut self,
        q: usize,
        g: usize,
        links: &'a [GroupLink<'a, P>],
        r: &ConnectRequest,
        (qid, depth, capsule, slots, slot_len): (u16, u16, u32, u16, u32),
        qp: QueuePair<'a, P, Rc, Rts>,
        mr: MemoryRegion<'a, P>,
    ) {
        let queue = &mut self.queues[q];
        queue.open_remote(r.id, qid, depth, capsule, slots, slot_len, g as u8);
        queue.opened_us = self.now_us;
        queue.station = r.src_ip;
        let a = Adopt {
            id: (q as u8, queue.epoch),
            conn: r.id,
            qid,
            depth: queue.depth,
            capsule,
            slots: queue.slots,
            slot_len,
            station: r.src_ip,
            opened_us: self.now_us,
            qp,
            mr,
        };
        if !links[g].send_to_group(ToGroup::Adopt(a)) {
            self.queues[q].close();
            return;
        }
        self.span = self.span.max(q + 1);
        self.touched = self.touched.max(q + 1);
        self.unconnected_check_us = self
            .unconnected_check_us
            .min(self.now_us.saturating_add(super::CONNECT_WITHIN_US));
    }

    /// After a queue ended here: core 0 tells the group that serves it (unless the group
    /// ended it); a group tells core 0, with the queue's counts.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tell_end(
        &mut self,
        remote: Option<u8>,
        origin: Option<(u8, u16)>,
        id: (u8, u16),
        cntlid: Option<u16>,
        counts: IoCounts,
        dreq: bool,
        by_group: bool,
    ) {
        match self.role.0 {
            Role::Core0(links) => {
                if let Some(g) = remote
                    && !by_group
                    && let Some(l) = links.get(usize::from(g))
                {
                    // Room is kept for it (a queue's hand-over, answer and end at most).
                    let _ = l.send_to_group(ToGroup::End { id });
                }
            }
            Role::Group(link) => {
                if let Some(id) = origin {
                    let _ = link.send_to_core0(ToCore0::Ended {
                        id,
                        cntlid,
                        counts,
                        by_group: dreq,
                    });
                }
            }
            Role::Alone => {}
        }
    }

    /// Whether `id` names a live placeholder of group `g`'s.
    fn placeholder(&self, g: usize, id: (u8, u16)) -> Option<usize> {
        let q = usize::from(id.0);
        let queue = self.queues.get(q)?;
        (queue.remote == Some(g as u8) && queue.epoch == id.1).then_some(q)
    }

    /// Core 0 takes message `m` of group `g`.
    pub(super) fn on_group_message(&mut self, g: usize, m: ToCore0) {
        let Role::Core0(links) = self.role.0 else {
            return;
        };
        match m {
            ToCore0::Connect {
                id,
                slot,
                sqe,
                data,
            } => {
                let Some(q) = self.placeholder(g, id) else {
                    return; // ended meanwhile: so is the group's queue
                };
                let res = self.connect(q, &sqe, &data);
                if let Err(f) = res {
                    let host = data.get(512..768).and_then(Nqn::from_field);
                    let station = self.queues[q].station;
                    self.refuse(station, RefusalReason::Connect(f.status, f.dw0), host);
                }
                let ctrl = match res {
                    Ok(_) => self.queues[q].ctrl.and_then(|c| self.ctrls[c]),
                    Err(_) => None,
                };
                let _ = links[g].send_to_group(ToGroup::Connected {
                    id,
                    slot,
                    res,
                    ctrl,
                });
            }
            ToCore0::Ended {
                id,
                cntlid,
                counts,
                by_group,
            } => {
                self.retired.add(&counts);
                if let Some(x) =
                    cntlid.and_then(|n| self.ctrls.iter_mut().flatten().find(|x| x.cntlid == n))
                {
                    x.retired.add(&counts);
                }
                if let Some(q) = self.placeholder(g, id) {
                    let cause = if by_group {
                        self.counts.transport_errors += 1;
                        LossCause::Transport
                    } else {
                        LossCause::Other
                    };
                    self.end_queue_for(q, true, true, cause);
                }
            }
            ToCore0::Error { cntlid, entry } => {
                if let Some(x) = self.ctrls.iter_mut().flatten().find(|x| x.cntlid == cntlid) {
                    x.errors.record(entry);
                }
            }
            ToCore0::Progress {
                id,
                counts,
                last_us,
            } => {
                if let Some(q) = self.placeholder(g, id) {
                    self.queues[q].counts = counts;
                    if let Some(x) = self.queues[q].ctrl.and_then(|c| self.ctrls[c].as_mut()) {
                        // (The gaps a group's queues saw are not told: core 0's own
                        // queue, the admin queue, carries the Keep Alives.)
                        x.last_us = x.last_us.max(last_us);
                    }
                }
            }
        }
    }

    /// A poll group's step: what core 0 sent, then a bounded number of completions and the
    /// commands that wait for a buffer; every [`PROGRESS_EVERY_US`] each queue's counts to
    /// core 0. Never runs the device's progress (core 0 does) nor the CM. Returns the work
    /// done (messages and completions); 0 means idle. A target that is not a group does
    /// nothing here.
    pub fn poll_group(&mut self) -> usize {
        let Role::Group(link) = self.role.0 else {
            return 0;
        };
        self.now_us = self.clock.now_us();
        let mut work = 0;
        // Bounded: what the ring holds.
        for _ in 0..RING {
            let Some(m) = link.take_for_group() else {
                break;
            };
            work += 1;
            self.on_core0_message(link, m);
        }
        work += self.step_io();
        if self.now_us >= self.report_us {
            self.report_us = self.now_us.saturating_add(PROGRESS_EVERY_US);
            for q in 0..self.span {
                let queue = &self.queues[q];
                let Some(id) = queue.origin else { continue };
                if !link.room_for_optional() {
                    break;
                }
                let last_us = queue
                    .ctrl
                    .and_then(|c| self.ctrls[c].as_ref())
                    .map_or(0, |x| x.last_us);
                let _ = link.send_to_core0(ToCore0::Progress {
                    id,
                    counts: queue.counts,
                    last_us,
                });
            }
        }
        let queues = self.queues[..self.span]
            .iter()
            .filter(|q| q.in_use())
            .count() as u32;
        link.publish(self.counts.commands, self.counts.errors, queues);
        work
    }

    /// A group takes message `m` of core 0.
    fn on_core0_message(&mut self, link: &'a GroupLink<'a, P>, m: ToGroup<'a, P>) {
        match m {
            ToGroup::Adopt(a) => {
                let Some(q) = self.queues.iter().position(|q| !q.in_use()) else {
                    let _ = link.send_to_core0(ToCore0::Ended {
                        id: a.id,
                        cntlid: None,
                        counts: IoCounts::default(),
                        by_group: true,
                    });
                    return; // the QP, then the region, dropped with `a`
                };
                let queue = &mut self.queues[q];
                queue.open(
                    a.conn, a.qid, a.depth, a.capsule, a.slots, a.slot_len, a.qp, a.mr,
                );
                queue.opened_us = a.opened_us;
                queue.station = a.station;
                queue.origin = Some(a.id);
                self.span = self.span.max(q + 1);
                self.touched = self.touched.max(q + 1);
                if self.queues[q].post_all_recvs(q).is_err() {
                    self.end_queue(q, true);
                }
            }
            ToGroup::End { id } => {
                if let Some(q) = self.by_origin(id) {
                    self.end_queue(q, false);
                }
            }
            ToGroup::Ana {
                subsystem,
                grpid,
                state,
            } => {
                if let Some(s) = self.subsystems.get_mut(subsystem) {
                    s.multipath.apply(grpid, state);
                }
            }
            ToGroup::Connected {
                id,
                slot,
                res,
                ctrl,
            } => {
                let Some(q) = self.by_origin(id) else { return };
                let Some(Cmd::Connecting(ds)) = self.queues[q].cmds.get(usize::from(slot)).copied()
                else {
                    return;
                };
                self.queues[q].cmds[usize::from(slot)] = Cmd::Idle;
                let res = match (res, ctrl) {
                    (Ok(v), Some(mut c)) => {
                        // The group's copy: the I/O path's reads of the controller, and its
                        // own stamps (reported to core 0).
                        c.outstanding = 0;
                        c.busy_us = 0;
                        self.ctrls[q] = Some(c);
                        self.queues[q].ctrl = Some(q);
                        Ok(v)
                    }
                    (Ok(_), None) => Err(Status::INTERNAL.into()),
                    (Err(f), _) => Err(f),
                };
                let sqe = Sqe::parse(self.queues[q].capsule_bytes(slot, SQE_LEN as u32));
                let cid = sqe.map_or(0, |s| s.cid());
                self.finish(q, slot, (cid, sqe.as_ref()), res, ds, None);
            }
        }
    }

    fn by_origin(&self, id: (u8, u16)) -> Option<usize> {
        self.queues[..self.span]
            .iter()
            .position(|q| q.in_use() && q.origin == Some(id))
    }

    /// A group passes the Connect of command `slot` on queue `q` (its data `d`) to core 0:
    /// true when it did (the command waits for the answer), false when it cannot (another
    /// Connect of the queue waits, or the ring is full).
    pub(super) fn pass_connect(
        &mut self,
        q: usize,
        slot: u16,
        sqe: &Sqe,
        d: &[u8; CONNECT_DATA_LEN],
        ds: Option<u16>,
    ) -> bool {
        let (Role::Group(link), Some(id)) = (self.role.0, self.queues[q].origin) else {
            return false;
        };
        let queue = &mut self.queues[q];
        let depth = usize::from(queue.depth);
        if queue.cmds[..depth]
            .iter()
            .any(|c| matches!(c, Cmd::Connecting(_)))
        {
            return false;
        }
        let m = ToCore0::Connect {
            id,
            slot,
            sqe: *sqe,
            data: *d,
        };
        if !link.send_to_core0(m) {
            return false;
        }
        queue.cmds[usize::from(slot)] = Cmd::Connecting(ds);
        true
    }

    /// A group passes an error-log entry of controller `cntlid` to core 0 (dropped when the
    /// ring is half full).
    pub(super) fn pass_error(&mut self, cntlid: u16, entry: ErrorEntry) {
        if let Role::Group(link) = self.role.0
            && link.room_for_optional()
        {
            let _ = link.send_to_core0(ToCore0::Error { cntlid, entry });
        }
    }
}

/// A target's [`Role`], which leaves the links it holds when the target is dropped: a group
/// drops what core 0 sent it that it did not take; core 0 does the same for a link with no
/// group now (it takes the group's side for that); each gives its side back. (A field of its
/// own, not the target's `Drop`: the target's other borrows end at its last use.)
pub(super) struct Member<'a, P: Provider>(pub Role<'a, P>);

impl<P: Provider> Drop for Member<'_, P> {
    fn drop(&mut self) {
        match self.0 {
            Role::Group(link) => {
                link.drain_to_group();
                link.release(1);
            }
            Role::Core0(links) => {
                for l in links {
                    if l.claim(1) {
                        l.drain_to_group();
                        l.release(1);
                    }
                    l.release(0);
                }
            }
            Role::Alone => {}
        }
    }
}
