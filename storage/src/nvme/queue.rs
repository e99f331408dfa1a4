//! One submission/completion queue pair in DMA memory: the driver's side of the ring protocol,
//! and the checks that make a completion the controller wrote safe to act on.
//!
//! A command identifier is the slot the command occupies (bits 5:0, below the queue's depth)
//! and a sequence number (bits 15:6) that changes with every use of the slot: a completion
//! names a command in flight only if its slot is busy and the whole identifier is the one that
//! slot was given. So a duplicate, stale or invented completion is recognised, and nothing is
//! indexed by the identifier before its slot is bounded by the depth. The submission queue
//! head a completion reports must lie between the head last reported and the tail.

use core::ptr::NonNull;

use bareverbs_hal::{Hal, Mmio};

use super::NvmeError;
use super::Violation;
use super::regs::{Command, Completion};

/// The deepest queue the driver makes: a submission queue of 64-byte entries in one page.
pub const MAX_DEPTH: u16 = 64;

/// A completion the checks let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reaped {
    /// The command's identifier (one that was in flight on this queue).
    pub cid: u16,
    /// Status field without the phase tag: 0 is success.
    pub status: u16,
    /// Dword 0 (command specific).
    pub dw0: u32,
}

/// A queue pair: the submission queue at `sq`, its completion queue at `cq` (one page each).
pub(crate) struct Queue {
    pub qid: u16,
    pub depth: u16,
    sq: NonNull<Command>,
    cq: NonNull<Completion>,
    /// Physical addresses of the two pages.
    pub sq_pa: u64,
    pub cq_pa: u64,
    /// The doorbells' byte offsets in BAR 0.
    sq_db: usize,
    cq_db: usize,
    tail: u16,
    /// Submission head as the controller last reported it.
    head: u16,
    cq_head: u16,
    phase: bool,
    /// Slots with a command in flight.
    busy: u64,
    /// The identifier each busy slot was given.
    cids: [u16; MAX_DEPTH as usize],
    seq: u16,
}

impl Queue {
    /// A queue over two pages the caller owns (zeroed by [`reset`](Self::reset) before use).
    ///
    /// # Safety
    ///
    /// `sq` and `cq` are the CPU's view of one page of DMA memory each (at `sq_pa` and
    /// `cq_pa`), owned by the caller for as long as the queue is used; `depth` is 2..=64.
    #[allow(clippy::too_many_arguments)] // each names one part of the queue's place
    pub unsafe fn new(
        qid: u16,
        depth: u16,
        sq: NonNull<u8>,
        sq_pa: u64,
        cq: NonNull<u8>,
        cq_pa: u64,
        sq_db: usize,
        cq_db: usize,
    ) -> Queue {
        let mut q = Queue {
            qid,
            depth: depth.clamp(2, MAX_DEPTH),
            sq: sq.cast(),
            cq: cq.cast(),
            sq_pa,
            cq_pa,
            sq_db,
            cq_db,
            tail: 0,
            head: 0,
            cq_head: 0,
            phase: true,
            busy: 0,
            cids: [0; MAX_DEPTH as usize],
            seq: 0,
        };
        q.reset();
        q
    }

    /// Starts over, as after a controller reset: indices at 0, phase 1, nothing in flight, the
    /// completion queue zeroed (no entry from before carries the phase looked for).
    pub fn reset(&mut self) {
        self.tail = 0;
        self.head = 0;
        self.cq_head = 0;
        self.phase = true;
        self.busy = 0;
        for i in 0..usize::from(self.depth) {
            // SAFETY: entry `i` < depth <= 64 of the completion page (16-byte entries) that
            // `new`'s caller lent; the controller is disabled or not given the queue yet.
            unsafe {
                self.cq
                    .as_ptr()
                    .add(i)
                    .write_volatile(Completion::default())
            };
        }
    }

    /// Commands in flight.
    pub fn in_flight(&self) -> u32 {
        self.busy.count_ones()
    }

    /// Writes `cmd` (its identifier set here) at the tail and rings the doorbell; returns the
    /// identifier. `Busy` when the queue holds `depth - 1` commands already.
    pub fn submit<H: Hal>(
        &mut self,
        hal: &H,
        regs: &H::Mmio,
        mut cmd: Command,
    ) -> Result<u16, NvmeError> {
        if self.in_flight() + 1 >= u32::from(self.depth) {
            return Err(NvmeError::Busy);
        }
        let slot = (!self.busy).trailing_zeros() as u16;
        if slot >= self.depth {
            return Err(NvmeError::Busy);
        }
        self.seq = (self.seq + 1) & 0x3FF;
        let cid = slot | self.seq << 6;
        self.busy |= 1 << slot;
        self.cids[usize::from(slot)] = cid;
        cmd.cdw0 = (cmd.cdw0 & 0xFFFF) | u32::from(cid) << 16;
        // SAFETY: the tail is < depth <= 64: inside the submission page; the controller reads
        // the entry only after the doorbell below.
        unsafe {
            self.sq
                .as_ptr()
                .add(usize::from(self.tail))
                .write_volatile(cmd)
        };
        self.tail = (self.tail + 1) % self.depth;
        hal.publish_barrier();
        regs.write32(self.sq_db, u32::from(self.tail));
        Ok(cid)
    }

    /// The next completion, if the controller posted one: checked (queue, submission head,
    /// identifier) before anything else uses it. `Err` is a protocol violation: the caller
    /// stops the controller.
    pub fn reap<H: Hal>(&mut self, hal: &H, regs: &H::Mmio) -> Result<Option<Reaped>, NvmeError> {
        // SAFETY: cq_head < depth <= 64: inside the completion page.
        let at = unsafe { self.cq.as_ptr().add(usize::from(self.cq_head)) };
        // SAFETY: as above; the status half-word first, alone: the phase says whether the
        // rest is this round's.
        let status = unsafe { core::ptr::addr_of!((*at).status).read_volatile() };
        if (status & 1 == 1) != self.phase {
            return Ok(None);
        }
        hal.consume_barrier();
        // SAFETY: as above.
        let e = unsafe { at.read_volatile() };
        self.cq_head += 1;
        if self.cq_head == self.depth {
            self.cq_head = 0;
            self.phase = !self.phase;
        }
        regs.write32(self.cq_db, u32::from(self.cq_head));
        if e.sqid != self.qid {
            return Err(NvmeError::Protocol(Violation::WrongQueue));
        }
        // The reported head lies in [head, tail] in ring order (the controller consumed
        // entries up to it), and so below the depth.
        let d = u32::from(self.depth);
        let ahead = |x: u16| (u32::from(x) + d - u32::from(self.head)) % d;
        if e.sqhd >= self.depth || ahead(e.sqhd) > ahead(self.tail) {
            return Err(NvmeError::Protocol(Violation::SqHead));
        }
        let slot = e.cid & 0x3F;
        if slot >= self.depth || self.busy & 1 << slot == 0 || self.cids[usize::from(slot)] != e.cid
        {
            return Err(NvmeError::Protocol(Violation::UnknownCid));
        }
        self.head = e.sqhd;
        self.busy &= !(1 << slot);
        Ok(Some(Reaped {
            cid: e.cid,
            status: e.status >> 1,
            dw0: e.dw0,
        }))
    }
}
