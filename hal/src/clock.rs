//! The clock seam: a monotonic time in microseconds, for the software RoCE transport's
//! timers (acknowledge timeouts, receiver-not-ready waits, address resolution retries).

/// A monotonic clock.
///
/// The transport reads it from its own calls (post, poll); it needs no timer interrupt. A
/// clock that stands still only delays retransmissions: nothing else depends on it.
pub trait Clock {
    /// Microseconds since an arbitrary origin; never decreases.
    fn now_us(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now_us(&self) -> u64 {
        (**self).now_us()
    }
}
