//! The data phase of perftest's `-R` cases: at most [`WINDOW`] work requests in flight, each
//! completion waited for in order (an RC QP completes its sends, and its receives, in order).

use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use super::super::{CaseError, CmCase, RECV_BASE, SEND_BASE, Session};
use super::msg::prefill;
use super::{Agreed, DATA_AT, MAX_CYCLE, SENTINEL, WINDOW, cycle_steps, lane_slots, slots, stride};
use crate::Step;

/// One data QP's receive slots (perftest's `-q`: the slots shared among the QPs): the first
/// one's index among all, how many, and where the image of the sender's cycle buffer the QP
/// checks against sits in the region.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lane {
    from: u32,
    slots: u32,
    image: u32,
}

impl Lane {
    /// QP `k` of `qps` for messages of `size` bytes: its share of the slots, its image after
    /// all the slots (and the images of the QPs before it). One QP has every slot.
    pub(super) fn of(size: u32, k: u32, qps: u32) -> Lane {
        let per = lane_slots(size, qps);
        Lane {
            from: k * per,
            slots: per,
            image: DATA_AT + qps.max(1) * per * stride(size) + k * size.max(MAX_CYCLE),
        }
    }
}

impl<'a, P: Provider, C: Clock> Session<'_, 'a, P, C> {
    /// Posts the receive of slot `k` (`size` bytes at its place of the data area), the slot
    /// filled with the sentinel first.
    fn post_slot(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        size: u32,
        k: u32,
    ) -> Result<(), CaseError> {
        let at = DATA_AT + k * stride(size);
        self.mr.as_mut_slice()[at as usize..(at + size) as usize].fill(SENTINEL);
        let sge = self.mr.sge(at, size).at("perftest: sge")?;
        // SAFETY: the region outlives the QP (destroyed first on every path of the case); the
        // CPU reads a slot only after its receive completed.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(RECV_BASE + u64::from(k), &[sge])
                .at("perftest: post receive")?;
            r.finish();
        }
        Ok(())
    }

    /// Posts the receives of `lane`'s slots (of `count` messages at most).
    pub(super) fn post_slots(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        size: u32,
        lane: Lane,
        count: u32,
    ) -> Result<(), CaseError> {
        (lane.from..lane.from + lane.slots.min(count)).try_for_each(|k| self.post_slot(qp, size, k))
    }

    /// `ib_send_bw`'s server: takes the client's `-n` SENDs on `qp` (`lane`'s receives
    /// posted by the caller), each `-s` bytes and the bytes the client's cycle buffer holds at
    /// its place: the first message at each place is kept (in the lane's image), the later
    /// ones compared with it. Returns the bytes checked.
    pub(super) fn receive_all(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
        agreed: Agreed,
        lane: Lane,
    ) -> Result<u64, CaseError> {
        let (size, n) = (case.size, case.count);
        let (period, step) = cycle_steps(size, agreed.cycle, agreed.line);
        let slots = lane.slots;
        let image = lane.image as usize;
        for i in 0..n {
            let k = lane.from + i % slots;
            let w = self.wait(RECV_BASE + u64::from(k), "a SEND")?;
            if w.byte_len != size
                || w.opcode != WcOpcode::Recv
                || w.flags.contains(WcFlags::WITH_IMM)
            {
                return Err(CaseError::Message {
                    what: "a SEND",
                    index: i,
                    at: u32::MAX,
                });
            }
            let slot = (DATA_AT + k * stride(size)) as usize;
            let place = image + ((i % period) * step) as usize;
            let buf = self.mr.as_mut_slice();
            if i < period {
                buf.copy_within(slot..slot + size as usize, place);
            } else if let Some(at) = (0..size as usize).find(|&j| buf[slot + j] != buf[place + j]) {
                return Err(CaseError::Message {
                    what: "a SEND (not the bytes the first one at its place had)",
                    index: i,
                    at: at as u32,
                });
            }
            if i + slots < n {
                self.post_slot(qp, size, k)?;
            }
        }
        Ok(u64::from(n) * u64::from(size))
    }

    /// `ib_send_bw`'s client (with `-b` either side): `-n` SENDs of `-s` bytes from `src` in
    /// the region.
    pub(super) fn send_all(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
        src: u32,
    ) -> Result<(), CaseError> {
        self.fill_source(src, case.size);
        let sge = self.mr.sge(src, case.size).at("perftest: sge")?;
        self.pipeline(
            case.count,
            WINDOW,
            "a SEND's completion",
            |_, qp, id| {
                // SAFETY: as in `post_slot`; the CPU leaves the source alone until the last
                // completion.
                unsafe {
                    let mut s = qp.send_batch();
                    s.send(id, SendFlags::SIGNALED, &[sge])
                        .at("perftest: post SEND")?;
                    s.finish();
                }
                Ok(())
            },
            qp,
            |_, _| Ok(0),
        )
        .map(|_| ())
    }

    /// `ib_write_bw`'s client (with `-b` either side): `-n` WRITEs of `-s` bytes from `src`
    /// in the region to the peer's buffer.
    pub(super) fn write_all(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
        peer: &super::Dest,
        src: u32,
    ) -> Result<(), CaseError> {
        self.fill_source(src, case.size);
        let sge = self.mr.sge(src, case.size).at("perftest: sge")?;
        let to = (peer.vaddr, peer.rkey);
        self.pipeline(
            case.count,
            WINDOW,
            "a WRITE's completion",
            |_, qp, id| {
                // SAFETY: as in `send_all`.
                unsafe {
                    let mut s = qp.send_batch();
                    s.rdma_write(id, SendFlags::SIGNALED, to, &[sge])
                        .at("perftest: post WRITE")?;
                    s.finish();
                }
                Ok(())
            },
            qp,
            |_, _| Ok(0),
        )
        .map(|_| ())
    }

    /// `ib_read_bw`'s client: `-n` READs of `-s` bytes from the start of the peer's buffer,
    /// `window` in flight, each into its slot from `base` on (the sentinel first); every one
    /// must bring the first one's bytes (kept after the slots). Returns the bytes checked.
    pub(super) fn read_all(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
        peer: &super::Dest,
        window: u32,
        base: u32,
    ) -> Result<u64, CaseError> {
        let size = case.size;
        let from = (peer.vaddr, peer.rkey);
        let first = (base + slots(size) * stride(size)) as usize;
        self.pipeline(
            case.count,
            window,
            "a READ's completion",
            |s, qp, id| {
                let at = base + (id - SEND_BASE) as u32 * stride(size);
                s.mr.as_mut_slice()[at as usize..(at + size) as usize].fill(SENTINEL);
                let sge = s.mr.sge(at, size).at("perftest: sge")?;
                // SAFETY: as in `post_slot`; the CPU reads the slot only after the READ completed.
                unsafe {
                    let mut b = qp.send_batch();
                    b.rdma_read(id, SendFlags::SIGNALED, from, &[sge])
                        .at("perftest: post READ")?;
                    b.finish();
                }
                Ok(())
            },
            qp,
            |s, i| {
                let slot = (base + (i % window) * stride(size)) as usize;
                let buf = s.mr.as_mut_slice();
                if i == 0 {
                    buf.copy_within(slot..slot + size as usize, first);
                } else if let Some(at) =
                    (0..size as usize).find(|&j| buf[slot + j] != buf[first + j])
                {
                    return Err(CaseError::Message {
                        what: "a READ (not the first READ's bytes)",
                        index: i,
                        at: at as u32,
                    });
                }
                Ok(u64::from(size))
            },
        )
    }

    /// `ib_atomic_bw`'s client (with `-b` either side): `-n` fetch-and-adds of 1 on the word
    /// the peer named, `window` in flight, each result into its slot from `base` on (the
    /// sentinel first); each must return the one before plus one (each executed once, in
    /// order; the first kept after the slots). Returns the bytes checked.
    pub(super) fn add_all(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
        peer: &super::Dest,
        window: u32,
        base: u32,
    ) -> Result<u64, CaseError> {
        let to = (peer.vaddr, peer.rkey);
        let first = (base + slots(8) * stride(8)) as usize;
        let word = |buf: &[u8], at: usize| {
            u64::from_ne_bytes(buf[at..at + 8].try_into().unwrap_or([0; 8]))
        };
        self.pipeline(
            case.count,
            window,
            "a fetch-and-add's completion",
            |s, qp, id| {
                let at = base + (id - SEND_BASE) as u32 * stride(8);
                s.mr.as_mut_slice()[at as usize..at as usize + 8].fill(SENTINEL);
                let sge = s.mr.sge(at, 8).at("perftest: sge")?;
                // SAFETY: as in `post_slot`; the CPU reads the slot only after the atomic
                // completed.
                unsafe {
                    let mut b = qp.send_batch();
                    b.atomic_fetch_add(id, SendFlags::SIGNALED, to, 1, &sge)
                        .at("perftest: post fetch-and-add")?;
                    b.finish();
                }
                Ok(())
            },
            qp,
            |s, i| {
                let slot = (base + (i % window) * stride(8)) as usize;
                let buf = s.mr.as_mut_slice();
                if i == 0 {
                    buf.copy_within(slot..slot + 8, first);
                } else if word(buf, slot) != word(buf, first).wrapping_add(u64::from(i)) {
                    return Err(CaseError::Message {
                        what: "a fetch-and-add's result (not the one before plus one)",
                        index: i,
                        at: 0,
                    });
                }
                Ok(8)
            },
        )
    }

    /// The bytes this side SENDs or WRITEs.
    fn fill_source(&mut self, at: u32, size: u32) {
        let at = at as usize;
        for (j, b) in self.mr.as_mut_slice()[at..at + size as usize]
            .iter_mut()
            .enumerate()
        {
            *b = prefill(j);
        }
    }

    /// Runs `n` operations, `window` in flight: `post(self, qp, wr_id)` posts one (the work
    /// request ID `SEND_BASE` + its slot), `done(self, i)` takes operation `i`'s completion
    /// (in order) and returns the bytes it checked. Returns their sum.
    #[allow(clippy::type_complexity)]
    fn pipeline(
        &mut self,
        n: u32,
        window: u32,
        what: &'static str,
        mut post: impl FnMut(&mut Self, &mut QueuePair<'a, P, Rc, Rts>, u64) -> Result<(), CaseError>,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        mut done: impl FnMut(&mut Self, u32) -> Result<u64, CaseError>,
    ) -> Result<u64, CaseError> {
        let window = window.clamp(1, WINDOW);
        let (mut posted, mut checked) = (0u32, 0u64);
        for i in 0..n {
            while posted < n && posted < i + window {
                post(self, qp, SEND_BASE + u64::from(posted % window))?;
                posted += 1;
            }
            self.wait(SEND_BASE + u64::from(i % window), what)?;
            checked += done(self, i)?;
        }
        Ok(checked)
    }
}
