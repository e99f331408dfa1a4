//! Waiting without spinning: a tiny `block_on` that halts the CPU between interrupts, and the
//! seam through which the embedder's interrupt handler reaches the driver.
//!
//! The future is polled; while it is pending the CPU halts in the embedder's interrupt window
//! until the future's waker is woken (from the driver's interrupt entry). A halt that ends
//! without a wake (the embedder's timer) halts again; only after [`RESCUE_TICKS`] timer ticks
//! without a wake is the future polled anyway, counted as a spin: a lost wake-up shows as
//! `spun > 0` instead of a hang.

use core::future::Future;
use core::pin::pin;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use core::task::{Context as TaskCx, Poll, RawWaker, RawWakerVTable, Waker};

use bareverbs::Context;
use bareverbs::verbs::Provider;

/// The driver's interrupt entry as the embedder's handler calls it: a context and the
/// function that runs `ctx.interrupt(vector)` on it.
#[derive(Clone, Copy)]
pub struct Entry {
    ctx: *const (),
    call: unsafe fn(*const (), u16),
}

impl Entry {
    /// The entry of `ctx`. It must be removed ([`Cpu::route`] with `None`) before `ctx` moves
    /// or goes.
    pub fn of<P: Provider>(ctx: &Context<P>) -> Self {
        /// # Safety
        ///
        /// `p` is a live `Context<P>`.
        unsafe fn call<P: Provider>(p: *const (), vector: u16) {
            // SAFETY: the caller's promise.
            unsafe { (*p.cast::<Context<P>>()).interrupt(vector) }
        }
        Entry {
            ctx: (ctx as *const Context<P>).cast(),
            call: call::<P>,
        }
    }

    /// Runs the driver's entry for device vector `vector`.
    ///
    /// # Safety
    ///
    /// The context this entry was made of is alive and has not moved.
    pub unsafe fn run(&self, vector: u16) {
        // SAFETY: the caller's promise.
        unsafe { (self.call)(self.ctx, vector) }
    }
}

/// The CPU side of interrupts, as the embedder has it.
pub trait Cpu {
    /// Routes the device's interrupts to `entry` (or, with `None`, nowhere any more).
    fn route(&mut self, entry: Option<Entry>);
    /// Waits for the next interrupt and returns after its handler ran; `false` when this CPU
    /// takes no interrupts (the caller then polls).
    fn halt(&mut self) -> bool;
    /// Timer ticks so far (the safety net that ends every halt).
    fn ticks(&self) -> u32;
    /// Whether this CPU takes interrupts (its halts end by them).
    fn takes_interrupts(&self) -> bool {
        true
    }
}

/// A CPU without interrupts: every wait is a poll (the host's model runs).
pub struct Polling;

impl Cpu for Polling {
    fn route(&mut self, _: Option<Entry>) {}
    fn halt(&mut self) -> bool {
        false
    }
    fn ticks(&self) -> u32 {
        0
    }
    fn takes_interrupts(&self) -> bool {
        false
    }
}

/// Timer ticks a halt may last without a wake before the future is polled anyway (a spin).
pub const RESCUE_TICKS: u32 = 64;

static WOKEN: AtomicBool = AtomicBool::new(false);
static HALTED: AtomicU32 = AtomicU32::new(0);
static SPUN: AtomicU32 = AtomicU32::new(0);

/// (halts while waiting, polls without a wake) so far.
pub fn counts() -> (u32, u32) {
    (HALTED.load(Ordering::Relaxed), SPUN.load(Ordering::Relaxed))
}

fn waker() -> Waker {
    const VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake, drop_waker);
    fn clone(_: *const ()) -> RawWaker {
        RawWaker::new(core::ptr::null(), &VTABLE)
    }
    fn wake(_: *const ()) {
        WOKEN.store(true, Ordering::Release);
    }
    fn drop_waker(_: *const ()) {}
    // SAFETY: the functions ignore the data pointer and only set a flag: any thread or
    // interrupt may call them.
    unsafe { Waker::from_raw(RawWaker::new(core::ptr::null(), &VTABLE)) }
}

/// Runs `fut` to completion on `cpu`: polled, then halted until woken.
pub fn block_on<F: Future>(cpu: &mut dyn Cpu, fut: F) -> F::Output {
    let waker = waker();
    let mut cx = TaskCx::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        WOKEN.store(false, Ordering::Release);
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        let start = cpu.ticks();
        // Interrupts are only taken inside `halt`, so a wake cannot slip in between this
        // test and the halt.
        while !WOKEN.load(Ordering::Acquire) {
            if !cpu.halt() || cpu.ticks().wrapping_sub(start) > RESCUE_TICKS {
                SPUN.fetch_add(1, Ordering::Relaxed);
                break;
            }
            HALTED.fetch_add(1, Ordering::Relaxed);
        }
    }
}
