//! The pace of the responder's READ responses: a token bucket of bytes, filled by the device's
//! clock, that every READ response sent to another station takes its payload from.
//!
//! Why. A READ's responses are not acknowledged: nothing the requester sends tells the
//! responder it is going too fast. A requester that asks for a whole long READ at once (Linux's
//! rxe asks for up to its `max_rd_atomic` READs of any length) gets every response back to
//! back, and a receiver slower than the segment (a guest under emulation: QEMU's socket on the
//! segment holds about 212 KB, some 90 frames of MTU 1024) drops the rest of the burst; the
//! requester then waits for its retransmission timer and asks again from the gap. The bucket
//! bounds what leaves in a burst ([`BURST`]) and on average ([`BYTES_PER_MS`]), so the answers
//! reach such a receiver at a pace it keeps up with, and the ACKs, other queue pairs' answers
//! and the IP stack's frames (an NVMe-oF keep-alive) go out between them.
//!
//! The figures: [`BURST`] is 64 KiB, the READ of 64 packets at MTU 1024 that such a receiver
//! took whole (the RoCE lab's 64 KiB READs, about 39 MB/s into Linux under TCG), two thirds of
//! its socket, leaving room for what else arrives; [`BYTES_PER_MS`] is 32 KiB a millisecond
//! (about 33 MB/s), under the rate that receiver kept up with. The device's own answers to
//! itself (loopback) never reach a NIC and are not paced, nor are answers over a NIC that
//! spaces out what it sends itself (`Link::paces_itself`: virtio-net, whose device sends from
//! its own thread; paced on top, the RoCE lab's 64 KiB READs on virtio-net took 39.8 s, 2,856
//! RoCE frames coming in for 1,000 READs as Linux asked again).
//!
//! The rate is the embedder's clock's: the example kernels' clock moves in 16 ms timer ticks,
//! so there the bucket refills whole at each tick, 64 KiB a tick (about 4 MB/s). That is what
//! Linux under TCG took from a long READ without loss in the RoCE lab (a 1 MiB READ on
//! virtio-net, whose transmission QEMU paces, ran at about 2 MB/s); the same rate with the
//! clock to the microsecond (32 KiB a millisecond) overran it again (Linux asked 26 times
//! again in twenty 1 MiB READs).
//!
//! What was held back waits in the queue pair's backlog (`reply.rs`) and goes at a later
//! progress, once the clock has filled the bucket again with [`RESUME`] bytes (32 KiB, a
//! millisecond): in runs, not a few packets at each progress.

/// Bytes of READ response payload that may leave back to back (the bucket's size).
pub(crate) const BURST: u64 = 64 * 1024;

/// Bytes of READ response payload the bucket gains a millisecond of the device's clock.
pub(crate) const BYTES_PER_MS: u64 = 32 * 1024;

/// The bucket: valid zeroed (full at its first fill).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Pace {
    /// Bytes that may still leave now (at most [`BURST`]).
    bytes: u64,
    /// The clock when it was last filled (µs).
    at: u64,
    /// Filled once (the first fill fills it whole, whatever the clock reads).
    primed: bool,
    /// Off: the link paces itself (`Link::paces_itself`), the bucket is not looked at.
    pub(crate) off: bool,
    /// It ran dry: answers wait until it holds [`RESUME`] again (meanwhile what it holds is
    /// here, and `bytes` is 0, so that [`Pace::take`]'s quick test refuses).
    dry: Option<u64>,
}

/// Bytes the bucket must hold again, once it ran dry, before answers go on: they then leave
/// in runs of 32 packets at MTU 1024 (a turn's worth) instead of a few at each progress, which
/// would cost the device a progress (and its CPU a poll) for every few packets.
pub(crate) const RESUME: u64 = 32 * 1024;

/// Microseconds that fill an empty bucket: a longer gap fills no more (and the product below
/// stays small).
const FULL_US: u64 = BURST * 1000 / BYTES_PER_MS;

impl Pace {
    /// Fills the bucket for the time since it was last filled, up to [`BURST`]. A clock that
    /// went back fills nothing, and counts from its new reading.
    #[cold]
    fn fill(&mut self, now_us: u64) {
        if !self.primed {
            (self.primed, self.bytes, self.at) = (true, BURST, now_us);
            return;
        }
        let dt = now_us.saturating_sub(self.at).min(FULL_US);
        self.at = now_us;
        self.bytes = (self.bytes + dt * BYTES_PER_MS / 1000).min(BURST);
    }

    /// Takes `len` bytes (a response's payload; at least 64, what its headers cost the
    /// receiver) when the bucket has them, filled for the time up to `now_us` first when it
    /// is short (only then: nothing is read or reckoned while it has enough); `false` when
    /// the response must wait.
    #[inline(always)]
    pub(crate) fn take(&mut self, len: u32, now_us: u64) -> bool {
        let cost = u64::from(len.max(64));
        if self.bytes < cost {
            return self.refill(cost, now_us);
        }
        self.bytes -= cost;
        true
    }

    /// [`Pace::take`] when the bucket is short of `cost`: filled, then taken from when it
    /// holds `cost` (and [`RESUME`], once it ran dry).
    #[cold]
    #[inline(never)]
    fn refill(&mut self, cost: u64, now_us: u64) -> bool {
        let need = match self.dry.take() {
            Some(held) => {
                self.bytes = held;
                cost.max(RESUME)
            }
            None => cost,
        };
        self.fill(now_us);
        if self.bytes < need {
            self.dry = Some(self.bytes);
            self.bytes = 0;
            return false;
        }
        self.bytes -= cost;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_in_runs() {
        let mut p = Pace::default();
        // 64 packets of 1 KiB leave at once, the 65th waits.
        for _ in 0..64 {
            assert!(p.take(1024, 1_000_000));
        }
        assert!(!p.take(1024, 1_000_000));
        // Dry: half a millisecond later the bucket holds 16 of them, not yet enough.
        assert!(!p.take(1024, 1_000_500));
        // A millisecond after it ran dry: 32, in one run.
        for _ in 0..32 {
            assert!(p.take(1024, 1_001_000));
        }
        assert!(!p.take(1024, 1_001_000));
        // A long idle fills up to the burst only.
        for _ in 0..64 {
            assert!(p.take(1024, 60_000_000));
        }
        assert!(!p.take(1, 60_000_000));
        // Small answers cost their headers' 64 bytes: a millisecond is 512 of them.
        for _ in 0..512 {
            assert!(p.take(8, 60_001_000));
        }
        assert!(!p.take(8, 60_001_000));
    }

    #[test]
    fn a_clock_that_goes_back_fills_nothing() {
        let mut p = Pace::default();
        while p.take(1024, 5_000) {}
        assert!(!p.take(64, 4_000));
        // From the new reading on it counts again.
        assert!(p.take(1024, 5_000));
    }
}
