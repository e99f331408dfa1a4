//! Interrupts and the two notification rings (`docs/pvrdma.md` §1, §2, §4, §10.4;
//! §13): MSI-X set up from the HAL's messages, the interrupt entry, the
//! CQ-notification ring drained into the event hub, and the async-event ring read as typed
//! events.
//!
//! The device has three vectors: 0 after every command (QEMU: after each write of REQUEST,
//! failed commands included), 1 for the async ring (QEMU never writes it), 2 for the
//! CQ-notification ring. QEMU writes a CQ's handle into that ring for *every* CQE, armed or
//! not, and raises vector 2 only for an armed CQ — and no interrupt at all once the ring is
//! full. So the driver drains the ring on every interrupt and before it arms a CQ, and decides
//! itself which notification is an event: one for a CQ it armed.

use core::sync::atomic::{AtomicU32, Ordering};

use bareverbs_hal::{ConfigRegionAccess, Hal, Mmio, PAGE_SIZE, PciAddress};

use super::Pvrdma;
use super::abi;
use super::regs::{self, db};
use super::ring::Ring;
use crate::dma::Dma;
use crate::error::{Error, Feature, Op, Result, Unsupported};
use crate::events::AsyncEvent;
use crate::events::{Count, EventHub};
use crate::pci::{self, Bar};

/// Vector 0: a command completed.
pub const VECTOR_COMMAND: u16 = 0;
/// Vector 1: the async-event ring has entries.
pub const VECTOR_ASYNC: u16 = 1;
/// Vector 2: the CQ-notification ring has entries (an armed CQ got a CQE).
pub const VECTOR_CQ: u16 = 2;
/// The device's vectors.
pub const VECTORS: u16 = 3;

/// MSI-X capability ID.
const CAP_MSIX: u8 = 0x11;
/// Message Control (upper half of the capability's first dword): Enable, Function Mask.
const MSIX_ENABLE: u32 = 1 << 31;
const MSIX_FUNCTION_MASK: u32 = 1 << 30;
/// A table entry: address low, address high, data, vector control (bit 0 masks).
const ENTRY: usize = 16;

/// Bit of `Events::drain`: a pass over the CQ-notification ring is running.
const HELD: u32 = 1;
/// Bit of `Events::drain`: more was asked while it ran.
const AGAIN: u32 = 2;
/// Passes one drain makes at most (each at most a ring's worth of entries).
const MAX_PASSES: u32 = 2;

/// The driver's side of the notification rings and interrupts: its state in one page of
/// driver-private memory (a stable address, and a small device value), and the MSI-X table's
/// window when interrupts are on.
pub(crate) struct Events<H: Hal> {
    /// An [`IrqState`] in pages of the shared region's block that the device is never told
    /// about; dropped in place by [`Events::release`] before the block goes.
    st: core::ptr::NonNull<IrqState<H::Mmio>>,
}

// SAFETY: the state is atomics, locks and cells with their own rules, plus the MSI-X window
// (an `H::Mmio`, sent and shared as the device's other windows are).
unsafe impl<H: Hal> Send for Events<H> where H::Mmio: Send {}
// SAFETY: as above.
unsafe impl<H: Hal> Sync for Events<H> where H::Mmio: Sync {}

/// What `Events::st` points to.
struct IrqState<M> {
    /// The BAR window holding the MSI-X table, when interrupts are on.
    msix: Option<M>,
    hub: EventHub,
    /// The CQ-notification ring (4-byte CQ handles) and the async ring (8-byte events), in
    /// the shared region's block.
    notify: Ring,
    async_ring: Ring,
    /// The consumer's free-running counter of the CQ-notification ring (only the drain
    /// holder writes it).
    notify_head: AtomicU32,
    /// [`HELD`] | [`AGAIN`].
    drain: AtomicU32,
    /// The async ring's consumer counter; its lock is the reader's (thread context only).
    async_head: spin::Mutex<u32>,
    /// The MSI-X table's offset in its BAR.
    table: usize,
    /// QEMU's emulation (subsystem vendor not VMware's): a CQ is armed with both arm bits,
    /// whatever it is armed for (QEMU arms only on 30|29, §9), and no POLL doorbell is rung
    /// while MSI-X is on (see [`Events::poll_doorbell`]).
    qemu: bool,
}

/// Whether an MSI-X table from byte `offset` of BAR `bir` overlaps a BAR region the driver
/// uses for something else: the registers (BAR1, from 0, `REGS_MIN_SIZE` bytes) or the UAR page
/// (BAR2, from 0, `UAR_MIN_SIZE` bytes). Both start at 0: the table overlaps one when it
/// starts inside it. A device that places it there is refused (`docs/pvrdma.md`).
fn overlaps_used(bir: u8, offset: usize) -> bool {
    let used = match bir {
        regs::BAR_REGS => regs::REGS_MIN_SIZE,
        regs::BAR_UAR => regs::UAR_MIN_SIZE,
        _ => return false,
    };
    (offset as u64) < used
}

impl<H: Hal> Events<H> {
    /// Pages of the block [`Events::new`] needs after the rings.
    pub(crate) const PAGES: usize = size_of::<IrqState<H::Mmio>>().div_ceil(PAGE_SIZE);

    /// The hub and the rings: the CQ-notification ring in pages `cq_first..` of `block`
    /// (state page first), the async ring in `async_first..`, each of `pages` pages; the
    /// state in [`Self::PAGES`] pages from `state_page`, which nothing else uses.
    pub(crate) fn new(
        block: &Dma<H>,
        (async_first, cq_first, state_page): (usize, usize, usize),
        pages: u32,
        qemu: bool,
    ) -> Self {
        let data = pages.saturating_sub(1).max(1);
        let state = IrqState::<H::Mmio> {
            msix: None,
            hub: EventHub::new(),
            notify: Ring::new(
                block,
                cq_first * PAGE_SIZE + abi::RING_STATE_RX,
                cq_first + 1,
                data * 1024,
                4,
            ),
            async_ring: Ring::new(
                block,
                async_first * PAGE_SIZE + abi::RING_STATE_RX,
                async_first + 1,
                data * 512,
                8,
            ),
            notify_head: AtomicU32::new(0),
            drain: AtomicU32::new(0),
            async_head: spin::Mutex::new(0),
            table: 0,
            qemu,
        };
        assert!(
            (state_page + Self::PAGES) <= block.pages(),
            "event state outside its memory"
        );
        // SAFETY: the pages were just checked to lie inside the block (page-aligned, so
        // aligned for the state); nothing else uses them; written once here, dropped in place
        // by `release`.
        let st = unsafe {
            let p = block
                .base()
                .add(state_page * PAGE_SIZE)
                .cast::<IrqState<H::Mmio>>();
            p.as_ptr().write(state);
            p
        };
        Events { st }
    }

    fn st(&self) -> &IrqState<H::Mmio> {
        // SAFETY: written in `new`, lives until `release`, which the owner calls last; only
        // shared references to it are made outside `&mut self` methods, and it is atomics,
        // locks and cells with their own rules.
        unsafe { self.st.as_ref() }
    }

    /// Drops the state in place (its wakers and window). The owner calls it once, before the
    /// block is freed, and uses nothing of `self` afterwards.
    ///
    /// # Safety
    ///
    /// Called once; no other method of `self` runs afterwards.
    pub(crate) unsafe fn release(&mut self) {
        // SAFETY: written in `new`, dropped once (the caller's promise); `&mut self`.
        unsafe { core::ptr::drop_in_place(self.st.as_ptr()) };
    }

    /// The event hub.
    pub(crate) fn hub(&self) -> &EventHub {
        &self.st().hub
    }

    /// The doorbell bits that arm a CQ (`solicited`: for the next solicited completion).
    pub(crate) fn arm_bits(&self, solicited: bool) -> u32 {
        match (self.st().qemu, solicited) {
            (true, _) => db::CQ_ARM | db::CQ_ARM_SOL,
            (false, false) => db::CQ_ARM,
            (false, true) => db::CQ_ARM_SOL,
        }
    }

    /// Sets up MSI-X for the function at `address`, whose BARs are `bars`: each of the three
    /// entries programmed masked with the HAL's message, the function enabled, the entries
    /// unmasked. The device's own mask (IMR) stays as it is (the caller opens it).
    pub(crate) fn enable_msix<C: ConfigRegionAccess>(
        &mut self,
        hal: &H,
        pci_access: &C,
        address: PciAddress,
        bars: &[Option<Bar>; 6],
    ) -> Result<()> {
        let no = || Error::Unsupported(Unsupported::Feature(Feature::Interrupts));
        let cap = pci::find_capability(pci_access, address, CAP_MSIX).ok_or_else(no)?;
        // SAFETY: the MSI-X capability's dwords (found in the list above); reads have no
        // side effect.
        let (control, table) = unsafe {
            (
                pci_access.read(address, cap),
                pci_access.read(address, cap + 4),
            )
        };
        let size = ((control >> 16) & 0x7FF) + 1;
        let (bir, offset) = ((table & 7) as u8, (table & !7) as usize);
        let (bar_pa, bar_len) = match bars.get(usize::from(bir)).copied().flatten() {
            Some(Bar::Memory { address, size, .. }) if address != 0 => (address, size),
            _ => return Err(no()),
        };
        let end = offset + usize::from(VECTORS) * ENTRY;
        if size < u32::from(VECTORS) || end as u64 > bar_len {
            return Err(no());
        }
        if overlaps_used(bir, offset) {
            // Entries written there would land on the registers or the doorbells.
            return Err(Error::bad_value(
                Op::Probe,
                &"MSI-X table (BIR, offset)",
                table,
            ));
        }
        let mut messages = [(0u64, 0u32); VECTORS as usize];
        for (v, m) in messages.iter_mut().enumerate() {
            let msg = hal.msi_message(v as u16).ok_or_else(no)?;
            *m = (msg.address, msg.data);
        }
        let len = usize::try_from(bar_len).map_err(|_| no())?;
        // SAFETY: the BAR holding the MSI-X table, decoding enabled by bring-up; the driver
        // is the function's only user.
        let bar = unsafe { hal.map_mmio(bar_pa, len) }.ok_or_else(no)?;
        for (v, &(a, d)) in messages.iter().enumerate() {
            let e = offset + v * ENTRY;
            bar.write32(e + 12, 1);
            bar.write32(e, a as u32);
            bar.write32(e + 4, (a >> 32) as u32);
            bar.write32(e + 8, d);
        }
        let on = (control & !MSIX_FUNCTION_MASK) | MSIX_ENABLE;
        // SAFETY: Message Control of the function's MSI-X capability: enabling MSI-X is what
        // the function's driver does; every entry is programmed (and masked) already.
        unsafe { pci_access.write(address, cap, on) };
        for v in 0..usize::from(VECTORS) {
            bar.write32(offset + v * ENTRY + 12, 0);
        }
        // SAFETY: `&mut self`: no shared reference to the state is alive.
        let st = unsafe { self.st.as_mut() };
        st.table = offset;
        st.msix = Some(bar);
        Ok(())
    }

    /// Whether interrupts were set up.
    pub(crate) fn msix_on(&self) -> bool {
        self.st().msix.is_some()
    }

    /// Whether a poll may ring a CQ's POLL doorbell. Not on QEMU with MSI-X on: QEMU's
    /// completion thread raises the CQ interrupt while it holds its resource lock, and an
    /// MSI-X write needs QEMU's global lock, which a vCPU holds through a doorbell write,
    /// while the POLL doorbell takes that resource lock: a POLL that races the thread's
    /// interrupt deadlocks QEMU (seen in the lab). The thread harvests every completion by
    /// itself, so nothing is lost, only the synchronous harvest.
    pub(crate) fn poll_doorbell(&self) -> bool {
        !(self.st().qemu && self.msix_on())
    }

    /// Masks every MSI-X entry (teardown: no message after this).
    pub(crate) fn mask_all(&self) {
        if let Some(bar) = &self.st().msix {
            let offset = self.st().table;
            for v in 0..usize::from(VECTORS) {
                bar.write32(offset + v * ENTRY + 12, 1);
            }
        }
    }

    /// Takes what the CQ-notification ring holds into the hub: each CQ named that was armed
    /// gets its event. Bounded (at most [`MAX_PASSES`] ring's worth of entries) and never
    /// waits: when another drain runs (an interrupt preempting a thread, or another CPU), it
    /// asks that one to go again and returns.
    pub(crate) fn drain(&self) {
        let (hub, st) = (self.hub(), self.st());
        let mut s = st.drain.load(Ordering::Acquire);
        loop {
            let (new, mine) = if s & HELD == 0 {
                (HELD, true)
            } else {
                (s | AGAIN, false)
            };
            match st
                .drain
                .compare_exchange(s, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if mine => break,
                Ok(_) => return,
                Err(now) => s = now,
            }
        }
        for pass in 1..=MAX_PASSES {
            self.drain_pass(hub);
            if st
                .drain
                .compare_exchange(HELD, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return;
            }
            if pass == MAX_PASSES {
                hub.count(Count::Bounded);
                st.drain.store(0, Ordering::Release);
                return;
            }
            st.drain.store(HELD, Ordering::Release);
        }
    }

    /// One pass: the entries the device published (an index that cannot be right: none).
    fn drain_pass(&self, hub: &EventHub) {
        let st = self.st();
        let ring = &st.notify;
        let head = st.notify_head.load(Ordering::Relaxed);
        let Some(ready) = ring.ready(head) else {
            // An index that cannot be right: what the ring holds cannot be trusted. Take up
            // from the device's position if it is one (its later entries are then read).
            hub.count(Count::Stray);
            let tail = ring.prod().load(Ordering::Acquire);
            if tail <= ring.wrap() {
                st.notify_head.store(tail, Ordering::Relaxed);
                ring.cons().store(tail, Ordering::Release);
            }
            return;
        };
        if ready == 0 {
            return;
        }
        let mut last = (u32::MAX, None);
        for i in 0..ready {
            // SAFETY: a slot of the ring (masked index), published by the prod_tail read
            // (acquire) in `ready`; a plain u32 read.
            let handle = unsafe {
                ring.slot(head.wrapping_add(i))
                    .cast::<u32>()
                    .read_volatile()
            };
            hub.count(Count::Notification);
            let slot = if handle == last.0 {
                last.1
            } else {
                let s = hub.find(handle);
                last = (handle, s);
                s
            };
            match slot {
                Some(s) => {
                    hub.cq_notified(s);
                }
                None => hub.count(Count::Stray),
            }
        }
        let head = head.wrapping_add(ready);
        st.notify_head.store(head, Ordering::Relaxed);
        // The entries were read before their slots are handed back (release).
        ring.cons().store(ring.index(head), Ordering::Release);
    }

    /// The next event of the async ring, if one is there (thread context; `None` also while
    /// another reader holds the ring, or when its index cannot be right).
    pub(crate) fn next_async(&self) -> Option<(u32, u32)> {
        let st = self.st();
        let mut head = st.async_head.try_lock()?;
        let ring = &st.async_ring;
        if ring.ready(*head)? == 0 {
            return None;
        }
        let e = ring.slot(*head).cast::<[u32; 2]>();
        // SAFETY: a slot of the ring (8 bytes), published by the prod_tail read (acquire).
        let [kind, info] = unsafe { e.read_volatile() };
        *head = head.wrapping_add(1);
        ring.cons().store(ring.index(*head), Ordering::Release);
        Some((kind, info))
    }
}

impl<H: Hal> Pvrdma<H> {
    /// The interrupt entry: what the embedder's handler for the device's vector `vector`
    /// (0 command, 1 async event, 2 CQ notification: [`Hal::msi_message`]'s numbering) calls.
    ///
    /// Interrupt-safe: it takes no lock that other code of the driver holds, never waits,
    /// allocates nothing, and its work is bounded (at most two passes over the
    /// CQ-notification ring, whatever the device writes); it may preempt any other method of
    /// this device on the same CPU, or run beside them on another. It wakes the tasks waiting
    /// on what it finds (so the wakers' `wake` runs in interrupt context).
    pub fn interrupt(&self, vector: u16) {
        let hub = self.events.hub();
        match vector {
            VECTOR_COMMAND => hub.count(Count::Command),
            VECTOR_ASYNC => {
                hub.count(Count::Async);
                hub.async_waker().wake();
            }
            VECTOR_CQ => hub.count(Count::Cq),
            _ => hub.count(Count::Unknown),
        }
        // Every vector drains: QEMU stops notifying once the ring is full.
        self.events.drain();
    }

    /// Whether interrupts are on (bring-up with [`Config::interrupts`](super::Config)).
    pub fn interrupts_enabled(&self) -> bool {
        self.events.msix_on()
    }

    /// The next async event from the device's ring, typed.
    pub(crate) fn next_async_event(&self) -> Option<AsyncEvent> {
        let (kind, info) = self.events.next_async()?;
        Some(AsyncEvent::from_ib(kind, info))
    }
}
