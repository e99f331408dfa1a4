//! Events without a heap and without an executor: what an interrupt (or a poll of the device's
//! notification rings) records, and what completion channels, async-event readers and futures
//! read. Device-agnostic: a provider owns one [`EventHub`] and feeds it from its own rings.
//!
//! Every operation here is lock-free and allocation-free, and those an interrupt performs
//! ([`EventHub::cq_notified`], [`WakerSlot::wake`], the counters) never wait for anything: an
//! interrupt handler may run them while it preempts any other operation of the same hub on the
//! same CPU.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use core::task::Waker;

/// How many completion queues of a device can take part in events (arming, channels,
/// futures); further CQs can be created and polled, but not armed.
pub const CQ_SLOTS: usize = 64;
/// How many completion channels a device can have at once.
pub const CHANNELS: usize = 8;

/// A place for one waker, written by the one task that waits and taken by whoever wakes it
/// (an interrupt included): the classic "atomic waker" protocol, in which neither side ever
/// waits for the other.
///
/// A wake that arrives while the waker is being stored is not lost: the storing side sees it
/// when it finishes and wakes the task itself.
pub struct WakerSlot {
    state: AtomicU32,
    waker: UnsafeCell<Option<Waker>>,
}

/// Nobody is storing or taking the waker.
const IDLE: u32 = 0;
/// A task is storing its waker.
const STORING: u32 = 1;
/// A wake is taking the waker (or arrived while it was being stored).
const WAKING: u32 = 2;

// SAFETY: the cell is only touched by the side that moved `state` from IDLE to its own bit
// (STORING or WAKING), which excludes the other side until it puts IDLE back.
unsafe impl Sync for WakerSlot {}
// SAFETY: a `Waker` is `Send`.
unsafe impl Send for WakerSlot {}

impl Default for WakerSlot {
    fn default() -> Self {
        Self::new()
    }
}

impl WakerSlot {
    /// An empty slot.
    pub const fn new() -> Self {
        WakerSlot {
            state: AtomicU32::new(IDLE),
            waker: UnsafeCell::new(None),
        }
    }

    /// Stores `waker` as the one to wake next (replacing an earlier one). If a wake happens
    /// meanwhile, `waker` is woken at once instead.
    pub fn register(&self, waker: &Waker) {
        match self
            .state
            .compare_exchange(IDLE, STORING, Ordering::Acquire, Ordering::Acquire)
        {
            Ok(_) => {
                // SAFETY: STORING is ours: no wake touches the cell until IDLE is back.
                let cell = unsafe { &mut *self.waker.get() };
                match cell {
                    Some(w) if w.will_wake(waker) => {}
                    _ => *cell = Some(waker.clone()),
                }
                if self
                    .state
                    .compare_exchange(STORING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    // A wake arrived while storing (it set WAKING and left the cell to us).
                    // SAFETY: still ours: the waking side does not touch the cell when it
                    // finds STORING.
                    let w = unsafe { (*self.waker.get()).take() };
                    self.state.store(IDLE, Ordering::Release);
                    if let Some(w) = w {
                        w.wake();
                    }
                }
            }
            // A wake is in progress (on another CPU): the task must run again.
            Err(_) => waker.wake_by_ref(),
        }
    }

    /// Wakes the stored waker, if any, and forgets it. Never waits.
    pub fn wake(&self) {
        if self.state.fetch_or(WAKING, Ordering::AcqRel) == IDLE {
            // SAFETY: we moved IDLE to WAKING: the cell is ours until we clear the bit.
            let w = unsafe { (*self.waker.get()).take() };
            self.state.fetch_and(!WAKING, Ordering::Release);
            if let Some(w) = w {
                w.wake();
            }
        }
        // Otherwise: being stored (the storing side wakes) or being woken already.
    }

    /// Forgets the stored waker without waking it (a waiter that went away).
    pub fn clear(&self) {
        if self
            .state
            .compare_exchange(IDLE, STORING, Ordering::Acquire, Ordering::Acquire)
            .is_ok()
        {
            // SAFETY: STORING is ours, as in `register`.
            let w = unsafe { (*self.waker.get()).take() };
            self.state.store(IDLE, Ordering::Release);
            drop(w);
        }
    }
}

/// An identity of a completion queue in events: the device's handle of it (unique among the
/// device's live CQs); [`CompletionQueue::id`](crate::CompletionQueue::id) gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CqId(pub u32);

/// What a CQ was armed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Arm {
    /// Not armed.
    None = 0,
    /// The next completion.
    Next = 1,
    /// The next solicited completion (or an error completion).
    Solicited = 2,
}

/// Event state of one completion queue.
struct CqSlot {
    /// Device handle + 1; 0 while the slot is free.
    key: AtomicU32,
    /// [`Arm`] as a number.
    arm: AtomicU32,
    /// The channel (index + 1), or 0.
    channel: AtomicU32,
    /// Events raised and not yet taken by `get_cq_event`.
    pending: AtomicU32,
    /// Events taken and not yet acknowledged.
    unacked: AtomicU32,
    /// The task waiting for this CQ (a future), if any.
    waker: WakerSlot,
}

impl CqSlot {
    const fn new() -> Self {
        CqSlot {
            key: AtomicU32::new(0),
            arm: AtomicU32::new(0),
            channel: AtomicU32::new(0),
            pending: AtomicU32::new(0),
            unacked: AtomicU32::new(0),
            waker: WakerSlot::new(),
        }
    }
}

/// A completion channel's state.
struct ChannelSlot {
    /// 1 while the channel exists.
    used: AtomicU32,
    /// Where the next scan for a CQ with an event starts (fairness).
    cursor: AtomicU32,
    /// The task waiting for an event on this channel.
    waker: WakerSlot,
}

impl ChannelSlot {
    const fn new() -> Self {
        ChannelSlot {
            used: AtomicU32::new(0),
            cursor: AtomicU32::new(0),
            waker: WakerSlot::new(),
        }
    }
}

/// Interrupts (or notification-ring passes) by cause, as a provider counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrqCounts {
    /// Command-completion interrupts.
    pub command: u64,
    /// Async-event interrupts.
    pub async_events: u64,
    /// Completion-notification interrupts.
    pub cq: u64,
    /// Interrupts with a vector the device does not have.
    pub unknown: u64,
    /// CQ notifications taken from the device (one per entry of its notification ring).
    pub notifications: u64,
    /// Notifications that became events (their CQ was armed).
    pub cq_events: u64,
    /// Notifications naming no CQ of this driver (a device's garbage), ignored.
    pub stray: u64,
    /// Times an interrupt found its work bound reached and left the rest for the next one.
    pub bounded: u64,
}

/// The event state a provider keeps: one slot per event-capable CQ, the completion channels,
/// the async-event waiter and the interrupt counters. Fixed size, no heap; a provider keeps it
/// at a stable address (it is shared with interrupt handlers by reference).
pub struct EventHub {
    cqs: [CqSlot; CQ_SLOTS],
    channels: [ChannelSlot; CHANNELS],
    async_waker: WakerSlot,
    counts: [AtomicU64; 8],
}

/// A CQ's slot in the hub.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot(u16);

/// A completion channel's index in the hub.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelId(u16);

/// Counter indices in `EventHub::counts`.
#[derive(Clone, Copy)]
#[repr(usize)]
pub enum Count {
    /// [`IrqCounts::command`].
    Command = 0,
    /// [`IrqCounts::async_events`].
    Async = 1,
    /// [`IrqCounts::cq`].
    Cq = 2,
    /// [`IrqCounts::unknown`].
    Unknown = 3,
    /// [`IrqCounts::notifications`].
    Notification = 4,
    /// [`IrqCounts::cq_events`].
    CqEvent = 5,
    /// [`IrqCounts::stray`].
    Stray = 6,
    /// [`IrqCounts::bounded`].
    Bounded = 7,
}

impl Default for EventHub {
    fn default() -> Self {
        Self::new()
    }
}

impl EventHub {
    /// An empty hub.
    pub const fn new() -> Self {
        #[allow(clippy::declare_interior_mutable_const)]
        const C: CqSlot = CqSlot::new();
        #[allow(clippy::declare_interior_mutable_const)]
        const H: ChannelSlot = ChannelSlot::new();
        #[allow(clippy::declare_interior_mutable_const)]
        const Z: AtomicU64 = AtomicU64::new(0);
        EventHub {
            cqs: [C; CQ_SLOTS],
            channels: [H; CHANNELS],
            async_waker: WakerSlot::new(),
            counts: [Z; 8],
        }
    }

    /// Adds one to counter `c`.
    #[inline]
    pub fn count(&self, c: Count) {
        self.counts[c as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The counters.
    pub fn counts(&self) -> IrqCounts {
        let c = |i: Count| self.counts[i as usize].load(Ordering::Relaxed);
        IrqCounts {
            command: c(Count::Command),
            async_events: c(Count::Async),
            cq: c(Count::Cq),
            unknown: c(Count::Unknown),
            notifications: c(Count::Notification),
            cq_events: c(Count::CqEvent),
            stray: c(Count::Stray),
            bounded: c(Count::Bounded),
        }
    }

    /// Gives CQ `handle` a slot, on `channel` if given; `None` when every slot is taken.
    pub fn attach(&self, handle: u32, channel: Option<ChannelId>) -> Option<Slot> {
        let key = handle.checked_add(1)?;
        for (i, s) in self.cqs.iter().enumerate() {
            if s.key.load(Ordering::Relaxed) != 0 {
                continue;
            }
            // Claim it with a placeholder first: the interrupt must not match it before the
            // rest is set.
            if s.key
                .compare_exchange(0, u32::MAX, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            s.arm.store(Arm::None as u32, Ordering::Relaxed);
            s.pending.store(0, Ordering::Relaxed);
            s.unacked.store(0, Ordering::Relaxed);
            s.waker.clear();
            s.channel
                .store(channel.map_or(0, |c| u32::from(c.0) + 1), Ordering::Relaxed);
            s.key.store(key, Ordering::Release);
            return Some(Slot(i as u16));
        }
        None
    }

    /// Frees a CQ's slot (its CQ is destroyed; events not taken are discarded).
    pub fn detach(&self, slot: Slot) {
        let s = self.slot(slot);
        s.arm.store(Arm::None as u32, Ordering::Relaxed);
        s.waker.clear();
        s.key.store(0, Ordering::Release);
    }

    fn slot(&self, slot: Slot) -> &CqSlot {
        &self.cqs[usize::from(slot.0) % CQ_SLOTS]
    }

    /// The slot of CQ `handle`, if it has one (what an interrupt looks up).
    pub fn find(&self, handle: u32) -> Option<Slot> {
        let key = handle.checked_add(1)?;
        self.cqs
            .iter()
            .position(|s| s.key.load(Ordering::Acquire) == key)
            .map(|i| Slot(i as u16))
    }

    /// The device handle of the CQ in `slot`.
    fn handle_of(&self, slot: Slot) -> Option<u32> {
        match self.slot(slot).key.load(Ordering::Acquire) {
            0 | u32::MAX => None,
            k => Some(k - 1),
        }
    }

    /// Records that the CQ in `slot` is armed for `arm` (before the device is told).
    pub fn arm(&self, slot: Slot, arm: Arm) {
        self.slot(slot).arm.store(arm as u32, Ordering::Release);
    }

    /// The word that holds what the CQ in `slot` is armed for ([`Arm`] as a number): for a
    /// device that looks at it on every completion it adds, one load.
    pub(crate) fn arm_word(&self, slot: Slot) -> &AtomicU32 {
        &self.slot(slot).arm
    }

    /// What the CQ in `slot` is armed for.
    pub fn armed(&self, slot: Slot) -> Arm {
        match self.slot(slot).arm.load(Ordering::Acquire) {
            1 => Arm::Next,
            2 => Arm::Solicited,
            _ => Arm::None,
        }
    }

    /// The device named the CQ in `slot` in a completion notification: if it was armed, this
    /// is its event (the arm is used up): the channel gets it and the waiting task is woken.
    /// Returns whether it was an event. Never waits.
    pub fn cq_notified(&self, slot: Slot) -> bool {
        let s = self.slot(slot);
        if s.arm.swap(Arm::None as u32, Ordering::AcqRel) == Arm::None as u32 {
            return false;
        }
        self.count(Count::CqEvent);
        let ch = s.channel.load(Ordering::Acquire);
        if ch != 0 {
            s.pending.fetch_add(1, Ordering::AcqRel);
            if let Some(c) = self.channels.get(ch as usize - 1) {
                c.waker.wake();
            }
        }
        s.waker.wake();
        true
    }

    /// The waker place of the CQ in `slot`.
    pub fn cq_waker(&self, slot: Slot) -> &WakerSlot {
        &self.slot(slot).waker
    }

    /// Opens a completion channel; `None` when [`CHANNELS`] are open.
    pub fn open_channel(&self) -> Option<ChannelId> {
        self.channels.iter().enumerate().find_map(|(i, c)| {
            c.used
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
                .then(|| {
                    c.cursor.store(0, Ordering::Relaxed);
                    c.waker.clear();
                    ChannelId(i as u16)
                })
        })
    }

    /// Closes a channel (no CQ uses it any more: they borrow it).
    pub fn close_channel(&self, ch: ChannelId) {
        if let Some(c) = self.channels.get(usize::from(ch.0)) {
            c.waker.clear();
            c.used.store(0, Ordering::Release);
        }
    }

    /// The waker place of a channel.
    pub fn channel_waker(&self, ch: ChannelId) -> &WakerSlot {
        &self.channels[usize::from(ch.0) % CHANNELS].waker
    }

    /// Takes one event of a CQ on channel `ch` (`ibv_get_cq_event`), fairly across its CQs:
    /// the CQ's identity; the event then counts as unacknowledged until
    /// [`ack`](Self::ack).
    pub fn take_event(&self, ch: ChannelId) -> Option<CqId> {
        let c = self.channels.get(usize::from(ch.0))?;
        let want = u32::from(ch.0) + 1;
        let start = c.cursor.load(Ordering::Relaxed) as usize;
        for k in 0..CQ_SLOTS {
            let i = (start + k) % CQ_SLOTS;
            let s = &self.cqs[i];
            if s.channel.load(Ordering::Acquire) != want {
                continue;
            }
            if s.pending
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
            {
                s.unacked.fetch_add(1, Ordering::AcqRel);
                c.cursor.store((i + 1) as u32, Ordering::Relaxed);
                if let Some(h) = self.handle_of(Slot(i as u16)) {
                    return Some(CqId(h));
                }
            }
        }
        None
    }

    /// Acknowledges `n` events of the CQ in `slot` (`ibv_ack_cq_events`); more than were
    /// taken acknowledges those.
    pub fn ack(&self, slot: Slot, n: u32) {
        let _ = self
            .slot(slot)
            .unacked
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
    }

    /// Events of the CQ in `slot` taken and not yet acknowledged.
    pub fn unacked(&self, slot: Slot) -> u32 {
        self.slot(slot).unacked.load(Ordering::Acquire)
    }

    /// Events of the CQ in `slot` raised and not yet taken.
    pub fn pending(&self, slot: Slot) -> u32 {
        self.slot(slot).pending.load(Ordering::Acquire)
    }

    /// The waker place of the async-event reader.
    pub fn async_waker(&self) -> &WakerSlot {
        &self.async_waker
    }
}

/// An asynchronous event of the device (`ibv_get_async_event`), typed. The number in each is
/// the object's as the device names it: a QP's number (on PVRDMA its handle, the same number
/// before interface version 20, so on QEMU), a CQ's [`CqId`], an SRQ's handle, a port number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A CQ overran or failed (`IBV_EVENT_CQ_ERR`).
    CqError(CqId),
    /// A QP went to the error state on its own (`IBV_EVENT_QP_FATAL`).
    QpFatal(u32),
    /// A request the QP sent was refused as invalid (`IBV_EVENT_QP_REQ_ERR`).
    QpRequestError(u32),
    /// A request the QP sent broke an access rule (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError(u32),
    /// The first packet arrived on a QP in RTR (`IBV_EVENT_COMM_EST`).
    CommunicationEstablished(u32),
    /// A QP's send queue drained in SQD (`IBV_EVENT_SQ_DRAINED`).
    SqDrained(u32),
    /// A QP migrated to its alternate path (`IBV_EVENT_PATH_MIG`).
    PathMigrated(u32),
    /// Path migration failed (`IBV_EVENT_PATH_MIG_ERR`).
    PathMigrationError(u32),
    /// The last WQE of a QP on an SRQ was consumed (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached(u32),
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`).
    DeviceFatal,
    /// The port became active (`IBV_EVENT_PORT_ACTIVE`).
    PortActive(u32),
    /// The port went down (`IBV_EVENT_PORT_ERR`).
    PortError(u32),
    /// The port's LID changed (`IBV_EVENT_LID_CHANGE`).
    LidChange(u32),
    /// The port's P_Key table changed (`IBV_EVENT_PKEY_CHANGE`).
    PkeyChange(u32),
    /// The port's subnet manager changed (`IBV_EVENT_SM_CHANGE`).
    SmChange(u32),
    /// The subnet manager asks for re-registration (`IBV_EVENT_CLIENT_REREGISTER`).
    ClientReregister(u32),
    /// The port's GID table changed (`IBV_EVENT_GID_CHANGE`).
    GidChange(u32),
    /// An SRQ failed (`IBV_EVENT_SRQ_ERR`).
    SrqError(u32),
    /// An SRQ's receive count fell below its armed limit (`IBV_EVENT_SRQ_LIMIT_REACHED`);
    /// the limit is disarmed (arm it again with a modify).
    SrqLimitReached(u32),
    /// A type this driver does not know (a newer device, or garbage): its raw type and info.
    Unknown {
        /// The event's type number.
        kind: u32,
        /// Its info word.
        info: u32,
    },
}

impl AsyncEvent {
    /// The event of type `kind` as libibverbs numbers them (`enum ibv_event_type`, 0 =
    /// CQ_ERR … 18 = GID_CHANGE) about object `info`.
    pub fn from_ib(kind: u32, info: u32) -> Self {
        use AsyncEvent::*;
        match kind {
            0 => CqError(CqId(info)),
            1 => QpFatal(info),
            2 => QpRequestError(info),
            3 => QpAccessError(info),
            4 => CommunicationEstablished(info),
            5 => SqDrained(info),
            6 => PathMigrated(info),
            7 => PathMigrationError(info),
            8 => DeviceFatal,
            9 => PortActive(info),
            10 => PortError(info),
            11 => LidChange(info),
            12 => PkeyChange(info),
            13 => SmChange(info),
            14 => SrqError(info),
            15 => SrqLimitReached(info),
            16 => QpLastWqeReached(info),
            17 => ClientReregister(info),
            18 => GidChange(info),
            _ => Unknown { kind, info },
        }
    }
}
