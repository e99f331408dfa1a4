//! How a provider hands the buffer of a completed safe request back to its pool
//! ([`BufferPool`](super::BufferPool)): a leaf of the verbs layer, named by the queue pair
//! creation parameters ([`QpInit`](super::QpInit)) and built by the pool, so that neither has
//! to reach the other.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

/// How a provider hands a safe buffer back to its pool: a function and the pool's free map.
#[derive(Clone, Copy)]
pub struct BufRelease {
    pub(super) f: unsafe fn(NonNull<u8>, u32),
    pub(super) ctx: NonNull<u8>,
}

// SAFETY: the context is a pool's free map, touched only through atomics.
unsafe impl Send for BufRelease {}
// SAFETY: as above.
unsafe impl Sync for BufRelease {}

impl core::fmt::Debug for BufRelease {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("BufRelease")
    }
}

impl BufRelease {
    /// How many buffers the pool has: every index handed back is below it.
    pub fn count(&self) -> u32 {
        // SAFETY: `ctx` is a pool's free map (`BufferPool::release_hook`, the only maker of a
        // BufRelease), alive while the pool is: word 0 is the buffer count.
        let n = unsafe { self.ctx.cast::<AtomicU64>().as_ref() }.load(Ordering::Relaxed);
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Hands buffer `index` back.
    ///
    /// # Safety
    ///
    /// The pool is alive, and the buffer was moved into a queue pair by a safe post whose
    /// completion (or flush, or the QP's end) is handled once, here.
    pub unsafe fn release(&self, index: u32) {
        // SAFETY: forwarded from our caller; `f` and `ctx` belong together (`BufferPool`).
        unsafe { (self.f)(self.ctx, index) }
    }
}
