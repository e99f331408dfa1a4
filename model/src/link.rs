//! An Ethernet segment in memory for the software RoCE device: two (or more) [`MemLink`]s
//! whose transmitted frames reach every other link on the segment, in order, with an
//! optional lossy mode (drop, duplicate, reorder) driven by a seeded generator, and a record
//! of every frame sent for byte-level checks.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bareverbs_hal::{Link, LinkError};

/// Damage the segment does to frames in flight, each per mille, from a seeded generator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Frames dropped, per mille.
    pub drop: u32,
    /// Frames delivered twice, per mille.
    pub duplicate: u32,
    /// Frames delivered after the next one, per mille.
    pub reorder: u32,
    /// The generator's seed.
    pub seed: u64,
}

#[derive(Default)]
struct Inner {
    /// Per link: frames waiting to be received.
    queues: Vec<VecDeque<Vec<u8>>>,
    /// Every frame transmitted, with its sender, in order.
    sent: Vec<(usize, Vec<u8>)>,
    faults: Faults,
    rng: u64,
    /// Frames dropped, duplicated and reordered so far.
    damage: (u64, u64, u64),
    /// Per link: how many more frames its NIC takes before it answers Busy (`None`: no
    /// limit), as a NIC whose transmit ring is full.
    credit: Vec<Option<u32>>,
}

impl Inner {
    fn roll(&mut self, per_mille: u32) -> bool {
        if per_mille == 0 {
            return false;
        }
        // xorshift64*: repeatable from the seed.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (r >> 33) % 1000 < u64::from(per_mille)
    }
}

/// A shared Ethernet segment.
#[derive(Clone, Default)]
pub struct Segment(Arc<Mutex<Inner>>);

impl Segment {
    /// An empty, lossless segment.
    pub fn new() -> Self {
        Segment::default()
    }

    /// Attaches a link with `mac` (frames larger than `max_frame` are refused).
    pub fn attach(&self, mac: [u8; 6], max_frame: usize) -> MemLink {
        let mut g = self.0.lock().unwrap();
        g.queues.push(VecDeque::new());
        g.credit.push(None);
        MemLink {
            seg: self.clone(),
            id: g.queues.len() - 1,
            mac,
            max_frame,
        }
    }

    /// Turns the lossy mode on (or off, with `Faults::default()`).
    pub fn set_faults(&self, faults: Faults) {
        let mut g = self.0.lock().unwrap();
        g.faults = faults;
        g.rng = faults.seed | 1;
    }

    /// Limits link `id`'s transmissions to `credit` more frames (`None`: no limit); beyond
    /// them its NIC answers [`LinkError::Busy`], as one whose transmit ring is full.
    pub fn set_tx_credit(&self, id: usize, credit: Option<u32>) {
        self.0.lock().unwrap().credit[id] = credit;
    }

    /// Every frame sent so far, with the index of the link that sent it.
    pub fn sent(&self) -> Vec<(usize, Vec<u8>)> {
        self.0.lock().unwrap().sent.clone()
    }

    /// How many frames were sent so far (the index [`Segment::sent_since`] starts from).
    pub fn sent_count(&self) -> usize {
        self.0.lock().unwrap().sent.len()
    }

    /// The frames sent from index `start` on, with their senders (without copying the
    /// earlier ones, as [`Segment::sent`] does).
    pub fn sent_since(&self, start: usize) -> Vec<(usize, Vec<u8>)> {
        let g = self.0.lock().unwrap();
        g.sent.get(start..).map_or_else(Vec::new, <[_]>::to_vec)
    }

    /// Frames (dropped, duplicated, reordered) so far.
    pub fn damage(&self) -> (u64, u64, u64) {
        self.0.lock().unwrap().damage
    }

    /// Puts `frame` on the segment as if link `from` sent it (a recorded peer's frame).
    pub fn inject(&self, from: usize, frame: &[u8]) {
        self.deliver(from, frame.to_vec());
    }

    fn deliver(&self, from: usize, frame: Vec<u8>) {
        let mut g = self.0.lock().unwrap();
        g.sent.push((from, frame.clone()));
        let f = g.faults;
        if g.roll(f.drop) {
            g.damage.0 += 1;
            return;
        }
        let copies = if g.roll(f.duplicate) {
            g.damage.1 += 1;
            2
        } else {
            1
        };
        let reorder = g.roll(f.reorder);
        if reorder {
            g.damage.2 += 1;
        }
        for (i, q) in g.queues.iter_mut().enumerate() {
            if i == from {
                continue;
            }
            for _ in 0..copies {
                // Reordered: the frame goes before the last one waiting.
                if reorder && !q.is_empty() {
                    let at = q.len() - 1;
                    q.insert(at, frame.clone());
                } else {
                    q.push_back(frame.clone());
                }
            }
        }
    }
}

/// One NIC on a [`Segment`].
pub struct MemLink {
    seg: Segment,
    id: usize,
    mac: [u8; 6],
    max_frame: usize,
}

impl MemLink {
    /// This link's index on its segment (as [`Segment::sent`] names senders).
    pub fn id(&self) -> usize {
        self.id
    }

    /// Frames waiting to be received.
    pub fn pending(&self) -> usize {
        self.seg.0.lock().unwrap().queues[self.id].len()
    }
}

impl Link for MemLink {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn max_frame(&self) -> usize {
        self.max_frame
    }

    fn transmit(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        if frame.is_empty() || frame.len() > self.max_frame {
            return Err(LinkError::Size);
        }
        self.transmit_with(&mut [], |buf| {
            buf.get_mut(..frame.len())?.copy_from_slice(frame);
            Some(frame.len())
        })
        .map(|_| ())
    }

    /// As a NIC with its own transmit buffers (virtio-net's): the frame is built in this
    /// link's buffer, then copied onto the segment (the device's copy, as QEMU's virtio-net
    /// model copies a transmit buffer out of the guest).
    fn transmit_with<F>(&mut self, _: &mut [u8], build: F) -> Result<Option<usize>, LinkError>
    where
        F: FnOnce(&mut [u8]) -> Option<usize>,
    {
        if let Some(c) = &mut self.seg.0.lock().unwrap().credit[self.id] {
            if *c == 0 {
                return Err(LinkError::Busy);
            }
            *c -= 1;
        }
        let mut buf = vec![0; self.max_frame];
        let Some(n) = build(&mut buf) else {
            // Nothing sent: the slot is free again.
            if let Some(c) = &mut self.seg.0.lock().unwrap().credit[self.id] {
                *c += 1;
            }
            return Ok(None);
        };
        if n == 0 || n > self.max_frame {
            return Err(LinkError::Size);
        }
        self.seg.deliver(self.id, buf[..n].to_vec());
        Ok(Some(n))
    }

    fn tx_ready(&mut self) -> bool {
        self.seg.0.lock().unwrap().credit[self.id] != Some(0)
    }

    fn receive(&mut self, buf: &mut [u8]) -> Option<usize> {
        loop {
            if let Some(n) = self.receive_if(buf, |_| true)? {
                return Some(n);
            }
        }
    }

    /// As a NIC with its own receive buffers: the frame is shown where the segment put it.
    fn receive_with<R, F>(&mut self, _: &mut [u8], f: F) -> Option<R>
    where
        F: FnOnce(&[u8]) -> R,
    {
        let frame = self.seg.0.lock().unwrap().queues[self.id].pop_front()?;
        Some(f(&frame))
    }

    /// Looked at in place, copied only when taken (as virtio-net's).
    fn receive_if<F>(&mut self, buf: &mut [u8], want: F) -> Option<Option<usize>>
    where
        F: FnOnce(&[u8]) -> bool,
    {
        self.receive_with(&mut [], |frame| bareverbs_hal::copy_if(frame, buf, want))
    }
}

/// A clock the test moves by hand (for the software RoCE device's timers); clones share it.
#[derive(Clone, Debug, Default)]
pub struct TestClock(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl TestClock {
    /// Moves the time `us` microseconds on.
    pub fn advance(&self, us: u64) {
        self.0.fetch_add(us, std::sync::atomic::Ordering::Relaxed);
    }
}

impl bareverbs_hal::Clock for TestClock {
    fn now_us(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}
