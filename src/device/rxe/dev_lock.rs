//! The device lock ([`DevLock`]): a spin lock around the device's core (the NIC, the tables,
//! the frame buffers) that, with the `lock-count` feature, counts its acquisitions, so that a
//! test can show which paths take the one lock every queue pair of the device shares.

use spin::{Mutex, MutexGuard};

#[cfg(feature = "lock-count")]
use core::sync::atomic::{AtomicU64, Ordering};

/// The device-wide lock (see the module's documentation).
pub(crate) struct DevLock<T> {
    inner: Mutex<T>,
    /// Acquisitions, `lock` and successful `try_lock` alike, and attempts of `try_lock` that
    /// found it held.
    #[cfg(feature = "lock-count")]
    counts: [AtomicU64; 2],
}

impl<T> DevLock<T> {
    pub(crate) const fn new(value: T) -> Self {
        DevLock {
            inner: Mutex::new(value),
            #[cfg(feature = "lock-count")]
            counts: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Takes the lock, spinning until it is free.
    #[inline(always)]
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        #[cfg(feature = "lock-count")]
        self.counts[0].fetch_add(1, Ordering::Relaxed);
        self.inner.lock()
    }

    /// Takes the lock if it is free now.
    #[inline(always)]
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let got = self.inner.try_lock();
        #[cfg(feature = "lock-count")]
        self.counts[usize::from(got.is_none())].fetch_add(1, Ordering::Relaxed);
        got
    }

    /// `(acquisitions, attempts that found it held)` so far.
    #[cfg(feature = "lock-count")]
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.counts[0].load(Ordering::Relaxed),
            self.counts[1].load(Ordering::Relaxed),
        )
    }
}
