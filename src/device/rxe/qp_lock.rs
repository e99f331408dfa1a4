//! A queue pair's own lock: a spin lock in the QP's block, right after its core (outside the
//! `QpCore`, so that a holder's `&mut QpCore` never covers the word another thread spins on).
//! Which lock guards what, and the order they are taken in: `docs/architecture.md`.

use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, Ordering};

use super::qp_state::QpCore;

/// Where a QP's lock is in its block: right after the core.
pub(crate) const LOCK_AT: usize = size_of::<QpCore>().next_multiple_of(align_of::<AtomicBool>());
/// Bytes of the block before the rings: the core and its lock, rounded to a cache line.
pub(crate) const HEAD_BYTES: usize = (LOCK_AT + size_of::<AtomicBool>()).next_multiple_of(64);

/// The core of a QP, locked: `&mut QpCore` through it; the lock is let go when it drops.
pub(crate) struct QpGuard<'a> {
    q: NonNull<QpCore>,
    _core: PhantomData<&'a mut QpCore>,
}

/// The lock word of the QP whose core is at `q`.
///
/// # Safety
///
/// `q` is the core at the start of a QP block laid out by `create_qp` (the lock word at
/// [`LOCK_AT`], zeroed: unlocked), alive for `'a`.
unsafe fn word<'a>(q: NonNull<QpCore>) -> &'a AtomicBool {
    // SAFETY: the caller's contract: the word is in the block, apart from the core, and only
    // ever reached as an atomic.
    unsafe { &*q.as_ptr().cast::<u8>().add(LOCK_AT).cast::<AtomicBool>() }
}

impl QpGuard<'_> {
    /// Locks the QP whose core is at `q`, spinning while another thread holds it (a holder
    /// keeps it for one post, one packet or one timer turn, and takes no other lock while it
    /// does: `docs/architecture.md`).
    ///
    /// # Safety
    ///
    /// `q` is a living QP's core (as [`word`] asks), alive while the guard is; the caller
    /// holds no other QP's lock unless it holds the device lock (the lock order).
    #[inline(always)]
    pub(crate) unsafe fn lock(q: NonNull<QpCore>) -> Self {
        // SAFETY: the caller's contract.
        let w = unsafe { word(q) };
        // Test, then test-and-set: a waiter reads the line, it does not write it.
        while w
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while w.load(Ordering::Relaxed) {
                core::hint::spin_loop();
            }
        }
        QpGuard {
            q,
            _core: PhantomData,
        }
    }

    /// Locks the QP whose core is at `q` if it is free within `spins` tries; `None` when its
    /// holder keeps it (another core mid-post, or the thread an interrupt preempted: the
    /// progress, which an interrupt handler may run, never waits for a QP).
    ///
    /// # Safety
    ///
    /// As for [`lock`](Self::lock).
    #[inline(always)]
    pub(crate) unsafe fn try_lock(q: NonNull<QpCore>, spins: u32) -> Option<Self> {
        // SAFETY: the caller's contract.
        let w = unsafe { word(q) };
        for _ in 0..spins {
            if !w.load(Ordering::Relaxed)
                && w.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return Some(QpGuard {
                    q,
                    _core: PhantomData,
                });
            }
            core::hint::spin_loop();
        }
        None
    }
}

impl Deref for QpGuard<'_> {
    type Target = QpCore;

    fn deref(&self) -> &QpCore {
        // SAFETY: the lock is held: no other reference to the core exists.
        unsafe { self.q.as_ref() }
    }
}

impl DerefMut for QpGuard<'_> {
    fn deref_mut(&mut self) -> &mut QpCore {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { self.q.as_mut() }
    }
}

impl Drop for QpGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the core is alive while the guard is (`lock`'s contract).
        unsafe { word(self.q) }.store(false, Ordering::Release);
    }
}
