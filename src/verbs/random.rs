//! Values a station on the network must not predict (starting PSNs, connection identifiers),
//! drawn from the seed the HAL gives ([`Hal::seed`](bareverbs_hal::Hal::seed)).
//!
//! RoCE authenticates nothing: a station that spoofs a peer's addresses needs only the QP number
//! and the 24-bit PSN the receiver expects. A starting PSN drawn here makes a blind guess succeed
//! with odds of one in 2^24 per frame (`docs/security.md`).
//!
//! The generator is SplitMix64 over one atomic counter: lock-free, `Sync`, and a different value
//! for every call from any core. It is not a cryptographic generator; its output is as hard to
//! predict as the seed is to learn, which is what the wire-visible values need (each value is
//! seen by the peer, and SplitMix64's output function hides the counter it came from).

use core::sync::atomic::{AtomicU64, Ordering};

/// SplitMix64's increment (the golden ratio in 64 bits).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A lock-free stream of 64-bit values from one seed.
#[derive(Debug)]
pub struct Entropy {
    state: AtomicU64,
}

impl Entropy {
    /// A stream from `seed`: the same seed gives the same values (tests replay with it).
    pub const fn new(seed: u64) -> Self {
        Entropy {
            state: AtomicU64::new(seed),
        }
    }

    /// The next 64-bit value.
    pub fn next_u64(&self) -> u64 {
        let mut z = self
            .state
            .fetch_add(GAMMA, Ordering::Relaxed)
            .wrapping_add(GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The next value of 24 bits: a starting packet sequence number.
    pub fn next_psn(&self) -> u32 {
        (self.next_u64() >> 40) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::Entropy;

    #[test]
    fn same_seed_same_stream_other_seed_other_stream() {
        let (a, b, c) = (Entropy::new(7), Entropy::new(7), Entropy::new(8));
        let xs: [u64; 4] = core::array::from_fn(|_| a.next_u64());
        let ys: [u64; 4] = core::array::from_fn(|_| b.next_u64());
        let zs: [u64; 4] = core::array::from_fn(|_| c.next_u64());
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
        assert!(xs.windows(2).all(|w| w[0] != w[1]));
    }

    #[test]
    fn psns_are_24_bits_and_spread() {
        let e = Entropy::new(1);
        let mut high = 0;
        for _ in 0..1000 {
            let p = e.next_psn();
            assert!(p < 1 << 24);
            if p >= 1 << 23 {
                high += 1;
            }
        }
        // Half of them in the upper half, give or take: a biased generator would fail this.
        assert!(
            (400..600).contains(&high),
            "{high} of 1000 in the upper half"
        );
    }
}
