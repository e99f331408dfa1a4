//! The hostile device: a seeded liar that, at each mutation point, may replace what the model
//! was about to show the driver with a mutated value.
//!
//! Mutation points ([`point`]): every field of a command response (header and payload, or the
//! previous response replayed) and the ERR register as the driver reads it, silence (a command
//! that gets no answer, before or after it ran), each capability field of the shared region
//! when it is loaded (or not loading it at all), the ring indices the device writes (CQ
//! `prod_tail`, SQ/RQ/SRQ `cons_head`, and a CQ's `prod_tail` at a POLL doorbell), every CQE
//! field (plus dropped, duplicated and spurious CQEs), PCI configuration values (IDs, command
//! register, BARs, also as read while sizing), the VERSION register, and memory the driver gave
//! the device, rewritten at a doorbell ([`point::WRITE`]: a ring-state word, a WQE's `wr_id`, a
//! CQE in a ring).
//!
//! At each point the liar lies with probability 1/`rate` (`rate` 0: never; a point may have
//! its own rate): once per PCI configuration or register read, per command (then one to three
//! of its response fields), per shared-region load (then one to four capability fields, or the
//! region not loaded), per ring index written, per CQE, and per POLL doorbell (spurious CQEs,
//! a producer index). A lie is a random value, a boundary value (0, 1, the maximum and its
//! neighbours, 0x8000_0000, powers of two and their neighbours, the handle mask and just above
//! it, QEMU's page and table limits), a value just above the true one, or one flipped bit; it
//! always differs from the truth. Everything follows from the seed: the same driver run
//! against the same seed sees the same lies.

/// A deterministic pseudo-random generator (SplitMix64): tiny, fast, good enough for fuzzing.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Lemire's multiply-shift: no division, bias below 2^-64·n.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability 1/`k` (never when `k` is 0).
    pub fn one_in(&mut self, k: u32) -> bool {
        k != 0 && self.below(u64::from(k)) == 0
    }

    /// One element of `items` (which must not be empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// Mutation points, as bits of [`Hostile::points`].
pub mod point {
    /// A field of a command response (header or payload).
    pub const RESPONSE: u32 = 1 << 0;
    /// The ERR register as the driver reads it (after commands and after ACTIVATE).
    pub const ERR: u32 = 1 << 1;
    /// No answer to a command (not run at all, or run without a response).
    pub const SILENCE: u32 = 1 << 2;
    /// A capability field of the shared region, or the region not loaded at all.
    pub const CAPS: u32 = 1 << 3;
    /// A ring index the device writes (CQ prod_tail, SQ/RQ/SRQ cons_head).
    pub const RING: u32 = 1 << 4;
    /// A CQE field; a dropped, duplicated or spurious CQE.
    pub const CQE: u32 = 1 << 5;
    /// A PCI configuration value of the PVRDMA function or function 0 of its slot.
    pub const PCI: u32 = 1 << 6;
    /// The VERSION register.
    pub const VERSION: u32 = 1 << 7;
    /// Memory the device was given, rewritten behind the driver's back (at a doorbell): a
    /// ring's state words, a WQE's `wr_id`, a CQE already in a ring. What the driver reads
    /// back from shared memory must not decide anything it promises.
    pub const WRITE: u32 = 1 << 8;
    /// Every point.
    pub const ALL: u32 = (1 << 9) - 1;
    /// The points that lie about a command's outcome (see [`super::Lies::protocol`]).
    pub const PROTOCOL: u32 = RESPONSE | ERR | SILENCE | VERSION;
}

/// How hostile the device is: lies at the enabled `points`, each with probability 1/`rate`
/// (or its own rate in `rates`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hostile {
    /// Seeds every decision.
    pub seed: u64,
    /// One lie in `rate` at each point (0: never lie).
    pub rate: u32,
    /// Which points may lie ([`point`] bits).
    pub points: u32,
    /// A point's own rate, by bit number (`rates[3]` is [`point::CAPS`]'s); 0: `rate`.
    pub rates: [u32; 9],
}

impl Hostile {
    /// Lies at every point, one in `rate`.
    pub fn new(seed: u64, rate: u32) -> Self {
        Hostile {
            seed,
            rate,
            points: point::ALL,
            rates: [0; 9],
        }
    }

    /// Only at `points`.
    pub fn at(mut self, points: u32) -> Self {
        self.points = points;
        self
    }

    /// One lie in `rate` at point `p` (one of the [`point`] bits).
    pub fn rate_at(mut self, p: u32, rate: u32) -> Self {
        self.rates[p.trailing_zeros() as usize % 9] = rate;
        self
    }
}

/// How many lies of each class the device told.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lies {
    pub response: u32,
    pub err: u32,
    pub silence: u32,
    pub caps: u32,
    pub ring: u32,
    pub cqe: u32,
    pub pci: u32,
    pub version: u32,
    pub write: u32,
}

impl Lies {
    /// Lies about the command channel's outcome (a response, ERR, silence, the version that
    /// selects the response layouts): after one, the driver's view of which objects exist and
    /// what memory the device holds may rightly differ from the device's.
    pub fn protocol(&self) -> bool {
        self.response + self.err + self.silence + self.version > 0
    }

    /// Any lie at all.
    pub fn any(&self) -> bool {
        self.mask() != 0
    }

    /// The [`point`]s that lied.
    pub fn mask(&self) -> u32 {
        [
            (self.response, point::RESPONSE),
            (self.err, point::ERR),
            (self.silence, point::SILENCE),
            (self.caps, point::CAPS),
            (self.ring, point::RING),
            (self.cqe, point::CQE),
            (self.pci, point::PCI),
            (self.version, point::VERSION),
            (self.write, point::WRITE),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .fold(0, |m, (_, p)| m | p)
    }
}

/// The liar the device consults at each point (rate 0 when the model is honest).
#[derive(Clone, Debug)]
pub(crate) struct Liar {
    rng: Rng,
    /// The rate of each point, by bit number (0: never).
    rates: [u32; 9],
    pub(crate) lies: Lies,
}

/// Values drivers get wrong: zero and one, the top of each width, the sign bit, the 24-bit
/// handle mask and just above it, QEMU's page/table limits and their neighbours.
const BOUNDARY32: [u32; 30] = [
    0,
    1,
    2,
    3,
    u32::MAX,
    u32::MAX - 1,
    0x8000_0000,
    0x7FFF_FFFF,
    0x8000_0001,
    0xFF,
    0x100,
    0xFFFF,
    0x1_0000,
    0x00FF_FFFF,
    0x0100_0000,
    0x0FFF_FFFF,
    0x1000_0000,
    127,
    128,
    129,
    511,
    512,
    1023,
    1024,
    2048,
    4095,
    4096,
    4097,
    28672,
    10467,
];

impl Liar {
    pub(crate) fn honest() -> Self {
        Liar {
            rng: Rng::new(0),
            rates: [0; 9],
            lies: Lies::default(),
        }
    }

    pub(crate) fn new(h: Hostile) -> Self {
        let mut rates = [0; 9];
        for (i, r) in rates.iter_mut().enumerate() {
            if h.points & (1 << i) != 0 {
                *r = if h.rates[i] != 0 { h.rates[i] } else { h.rate };
            }
        }
        Liar {
            rng: Rng::new(h.seed),
            rates,
            lies: Lies::default(),
        }
    }

    /// Whether to lie now at `p` (counted in its class when so).
    #[inline]
    pub(crate) fn roll(&mut self, p: u32) -> bool {
        let rate = self.rates[p.trailing_zeros() as usize % 9];
        if rate == 0 || !self.rng.one_in(rate) {
            return false;
        }
        let l = &mut self.lies;
        let class = match p {
            point::RESPONSE => &mut l.response,
            point::ERR => &mut l.err,
            point::SILENCE => &mut l.silence,
            point::CAPS => &mut l.caps,
            point::RING => &mut l.ring,
            point::CQE => &mut l.cqe,
            point::PCI => &mut l.pci,
            point::WRITE => &mut l.write,
            _ => &mut l.version,
        };
        *class += 1;
        true
    }

    /// A value in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// One element of `items`.
    pub(crate) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        self.rng.pick(items)
    }

    /// A lie about a value of `bits` bits (8, 16, 32 or 64) whose truth is `v`.
    pub(crate) fn mutate(&mut self, v: u64, bits: u32) -> u64 {
        let mask = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let r = &mut self.rng;
        let m = match r.below(10) {
            0 | 1 => r.next_u64(),
            2 | 3 => {
                let b = u64::from(r.pick(&BOUNDARY32));
                // For 64-bit fields also the top of the range and just past 32 bits.
                match (bits, r.below(4)) {
                    (64, 0) => u64::MAX - b.min(1),
                    (64, 1) => (1 << 32) + b.min(1),
                    _ => b,
                }
            }
            4 => {
                // A power of two or a neighbour.
                let p = 1u64 << r.below(u64::from(bits));
                p.wrapping_add(r.below(3)).wrapping_sub(1)
            }
            5 => {
                // Just above the truth: what a check with an off-by-one lets through.
                match r.below(3) {
                    0 => v.wrapping_add(1),
                    1 => v.wrapping_mul(2),
                    _ => v.wrapping_add(1 + r.below(64)),
                }
            }
            6 => v.wrapping_sub(1),
            7 => r.below(64),
            _ => v ^ (1 << r.below(u64::from(bits))),
        } & mask;
        if m == v & mask { (v ^ 1) & mask } else { m }
    }

    pub(crate) fn mutate32(&mut self, v: u32) -> u32 {
        self.mutate(u64::from(v), 32) as u32
    }

    /// Mutates the little-endian field of `width` bytes at `off` of `buf`.
    pub(crate) fn mutate_field(&mut self, buf: &mut [u8], off: usize, width: usize) {
        let mut b = [0u8; 8];
        b[..width].copy_from_slice(&buf[off..off + width]);
        let v = self.mutate(u64::from_le_bytes(b), 8 * width as u32);
        buf[off..off + width].copy_from_slice(&v.to_le_bytes()[..width]);
    }

    /// Mutates one field of `buf[from..to]`: its width 1, 2, 4 or 8 bytes, aligned.
    pub(crate) fn mutate_somewhere(&mut self, buf: &mut [u8], from: usize, to: usize) {
        let width = [1usize, 2, 4, 4, 4, 8][self.rng.below(6) as usize].min(to - from);
        let slots = (to - from) / width;
        let off = from + width * self.rng.below(slots as u64) as usize;
        self.mutate_field(buf, off, width);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_tells_the_same_lies() {
        let run = |seed| {
            let mut l = Liar::new(Hostile::new(seed, 3));
            (0..1000)
                .map(|i| {
                    if l.roll(point::CQE) {
                        l.mutate(i, 32)
                    } else {
                        i
                    }
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn lies_name_their_points() {
        let mut l = Liar::new(Hostile::new(3, 1).at(point::CQE | point::PCI));
        assert!(l.roll(point::CQE) && l.roll(point::PCI) && !l.roll(point::ERR));
        assert_eq!(l.lies.mask(), point::CQE | point::PCI);
        assert!(!l.lies.protocol());
    }

    #[test]
    fn a_point_may_have_its_own_rate() {
        let mut l = Liar::new(Hostile::new(4, 0).rate_at(point::RING, 1));
        assert!(l.roll(point::RING) && !l.roll(point::CQE));
        let mut l = Liar::new(Hostile::new(4, 1).rate_at(point::RING, 1 << 30));
        assert!(l.roll(point::CQE) && (0..100).all(|_| !l.roll(point::RING)));
    }

    #[test]
    fn a_lie_always_differs_from_the_truth_and_fits_its_width() {
        let mut l = Liar::new(Hostile::new(1, 1));
        for bits in [8, 16, 32, 64] {
            for v in [0u64, 1, 0xFF, 0x1234_5678, u64::MAX] {
                let v = if bits == 64 { v } else { v & ((1 << bits) - 1) };
                for _ in 0..200 {
                    let m = l.mutate(v, bits);
                    assert_ne!(m, v);
                    assert!(bits == 64 || m < 1 << bits);
                }
            }
        }
    }

    #[test]
    fn an_honest_liar_never_lies() {
        let mut l = Liar::honest();
        assert!((0..1000).all(|_| !l.roll(point::ALL)));
        assert!(!l.lies.any());
    }
}
