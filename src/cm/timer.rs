//! The CM's timers: one per connection, a deadline on the embedder's [`Clock`] and a bounded
//! number of retransmissions. Nothing runs by itself: [`Cm::poll`](super::Cm::poll) looks at
//! the deadlines.
//!
//! [`Clock`]: bareverbs_hal::Clock

/// The wait a CM timeout code `t` stands for (4.096 µs · 2^t), in microseconds, as Linux
/// rounds it (`cm_convert_to_ms`): 2^(t − 8) ms, at least 1 ms. Codes above 31 count as 31.
pub fn timeout_us(t: u8) -> u64 {
    1000u64 << u32::from(t.min(31)).saturating_sub(8)
}

/// A retransmission timer: when it fires next, how long each wait is, how many sends are
/// left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timer {
    /// When it fires (µs on the CM's clock); `None`: stopped.
    pub deadline: Option<u64>,
    /// The wait between two sends.
    pub period: u64,
    /// Sends left after the first.
    pub left: u8,
}

impl Timer {
    /// Armed at `now` for `period`, with `retries` resends.
    pub fn arm(now: u64, period: u64, retries: u8) -> Timer {
        Timer {
            deadline: Some(now.saturating_add(period)),
            period,
            left: retries,
        }
    }

    /// A one-shot wait (TIME_WAIT).
    pub fn once(now: u64, wait: u64) -> Timer {
        Timer::arm(now, wait, 0)
    }

    /// Stopped.
    pub fn stop(&mut self) {
        self.deadline = None;
    }

    /// Whether it has fired by `now`.
    pub fn due(&self, now: u64) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// The peer asked for more time (an MRA): the next deadline is `wait` from `now`, with
    /// the sends left unchanged.
    pub fn extend(&mut self, now: u64, wait: u64) {
        if self.deadline.is_some() {
            self.deadline = Some(now.saturating_add(wait));
        }
    }

    /// After it fired: `true` and re-armed if a resend is left, else `false` and stopped.
    pub fn retry(&mut self, now: u64) -> bool {
        if self.left == 0 {
            self.stop();
            return false;
        }
        self.left -= 1;
        self.deadline = Some(now.saturating_add(self.period));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_convert_as_linux_does() {
        assert_eq!(timeout_us(0), 1000);
        assert_eq!(timeout_us(8), 1000);
        assert_eq!(timeout_us(18), 1_024_000);
        assert_eq!(timeout_us(20), 4_096_000);
        assert_eq!(timeout_us(31), timeout_us(255));
    }

    #[test]
    fn a_timer_resends_its_count_then_stops() {
        let mut t = Timer::arm(0, 10, 2);
        assert!(!t.due(9));
        assert!(t.due(10));
        assert!(t.retry(10));
        assert_eq!(t.deadline, Some(20));
        assert!(t.retry(20));
        assert!(!t.retry(30));
        assert!(!t.due(u64::MAX));
        let mut s = Timer::default();
        s.extend(5, 5);
        assert_eq!(s.deadline, None, "a stopped timer stays stopped");
    }
}
