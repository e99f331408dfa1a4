//! Memory: protection domains, the memory-region table with its keys and access checks, the
//! copies between registered memory and frames, and the device's tables.
//!
//! A region's addresses are the CPU's own (as `rdma_rxe`'s are user virtual addresses): a
//! scatter/gather entry or a remote request names bytes by address and key, and every use is
//! checked against the region the key names — its protection domain, its bounds and its
//! rights — before a byte moves.

use core::ptr::NonNull;
use core::sync::atomic::AtomicU32;

use bareverbs_hal::Hal;

use super::port::Port;
use super::qp_state::QpCore;
use super::{FIRST_QPN, FRAME, GSI_QPN, LOOPBACK_FRAMES, MAX_MR, MAX_QP, STACK_FRAMES};
use crate::dma::Dma;
use crate::verbs::{AccessFlags, Sge};

/// Async events kept until read.
const ASYNC_EVENTS: usize = 8;

/// Protection domains the device hands out.
pub const MAX_PD: u32 = 64;

/// A protection domain: a number, and how many regions and queue pairs use it.
#[derive(Debug)]
pub struct Pd {
    pub(crate) id: u32,
    pub(crate) users: AtomicU32,
}

/// A registered memory region.
pub struct Mr<H: Hal> {
    /// The pages the driver allocated for it (`None`: the embedder's memory).
    pub(crate) _mem: Option<Dma<H>>,
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
    pub(crate) key: u32,
    /// The PD's use count (the PD outlives the region and does not move).
    pub(crate) pd_users: NonNull<AtomicU32>,
}

// SAFETY: the region's bytes belong to whoever registered them; the handle only names them.
unsafe impl<H: Hal + Send> Send for Mr<H> {}
// SAFETY: as above.
unsafe impl<H: Hal + Sync> Sync for Mr<H> {}

/// Driver-private memory (HAL pages the NIC never sees).
pub struct Mem<H: Hal>(pub(crate) Dma<H>);

/// One entry of the region table; key 0: free.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MrEntry {
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) key: u32,
    pub(crate) pd: u32,
    pub(crate) access: u32,
    /// The generation the slot's next key takes (its low byte).
    pub(crate) generation: u8,
}

/// Why a memory access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No region has this key (or it is another PD's).
    Key,
    /// Outside the region.
    Bounds,
    /// The region does not grant the right.
    Access,
}

/// The frames the IP stack has not read yet.
pub(crate) struct StackRing {
    frames: [[u8; 1536]; STACK_FRAMES],
    lens: [u16; STACK_FRAMES],
    head: u32,
    tail: u32,
    /// Frames dropped because the ring was full or the frame too long.
    pub(crate) dropped: u32,
}

impl StackRing {
    pub(crate) fn push(&mut self, frame: &[u8]) {
        if self.head.wrapping_sub(self.tail) as usize >= STACK_FRAMES || frame.len() > 1536 {
            self.dropped = self.dropped.wrapping_add(1);
            return;
        }
        let i = self.head as usize % STACK_FRAMES;
        self.frames[i][..frame.len()].copy_from_slice(frame);
        self.lens[i] = frame.len() as u16;
        self.head = self.head.wrapping_add(1);
    }

    pub(crate) fn pop(&mut self, buf: &mut [u8]) -> Option<usize> {
        while self.head != self.tail {
            let i = self.tail as usize % STACK_FRAMES;
            self.tail = self.tail.wrapping_add(1);
            let n = usize::from(self.lens[i]);
            if let Some(out) = buf.get_mut(..n) {
                out.copy_from_slice(&self.frames[i][..n]);
                return Some(n);
            }
        }
        None
    }
}

/// Frames the device sent to its own address, waiting to be received (rxe loops them back
/// the same way).
pub(crate) struct Loopback {
    frames: [[u8; FRAME]; LOOPBACK_FRAMES],
    lens: [u16; LOOPBACK_FRAMES],
    head: u32,
    tail: u32,
}

impl Loopback {
    /// Queues a frame; `false` when the queue is full.
    pub(crate) fn push(&mut self, frame: &[u8]) -> bool {
        if self.head.wrapping_sub(self.tail) as usize >= LOOPBACK_FRAMES || frame.len() > FRAME {
            return false;
        }
        let i = self.head as usize % LOOPBACK_FRAMES;
        self.frames[i][..frame.len()].copy_from_slice(frame);
        self.lens[i] = frame.len() as u16;
        self.head = self.head.wrapping_add(1);
        true
    }

    /// Moves the oldest frame into `buf`.
    pub(crate) fn pop(&mut self, buf: &mut [u8]) -> Option<usize> {
        if self.head == self.tail {
            return None;
        }
        let i = self.tail as usize % LOOPBACK_FRAMES;
        self.tail = self.tail.wrapping_add(1);
        let n = usize::from(self.lens[i]).min(buf.len());
        buf[..n].copy_from_slice(&self.frames[i][..n]);
        Some(n)
    }
}

/// Async events raised and not yet read (`ibv_get_async_event`): the software device raises
/// only SRQ_LIMIT_REACHED, so an entry is the SRQ's number.
pub(crate) struct AsyncRing {
    srqs: [u32; ASYNC_EVENTS],
    head: u32,
    tail: u32,
}

impl AsyncRing {
    /// Records that SRQ `srq` went below its limit (the oldest event makes room).
    pub(crate) fn push(&mut self, srq: u32) {
        if self.head.wrapping_sub(self.tail) as usize >= ASYNC_EVENTS {
            self.tail = self.tail.wrapping_add(1);
        }
        self.srqs[self.head as usize % ASYNC_EVENTS] = srq;
        self.head = self.head.wrapping_add(1);
    }

    /// The oldest event.
    pub(crate) fn pop(&mut self) -> Option<u32> {
        if self.head == self.tail {
            return None;
        }
        let s = self.srqs[self.tail as usize % ASYNC_EVENTS];
        self.tail = self.tail.wrapping_add(1);
        Some(s)
    }
}

/// The device's tables, in its block (reached only under the device lock).
pub(crate) struct Tables {
    pub(crate) port: Port,
    pub(crate) mrs: [MrEntry; MAX_MR],
    /// Queue pair `i` has number `FIRST_QPN + i`; null: free.
    pub(crate) qps: [*mut QpCore; MAX_QP],
    /// The GSI queue pair (number 1); null: none.
    pub(crate) gsi: *mut QpCore,
    pub(crate) pds: u32,
    pub(crate) pd_next: u32,
    pub(crate) cqs: u32,
    pub(crate) cq_next: u32,
    pub(crate) srqs: u32,
    /// The IPv4 identification of the next frame.
    pub(crate) ip_id: u16,
    pub(crate) stack: StackRing,
    pub(crate) loopback: Loopback,
    pub(crate) async_events: AsyncRing,
    /// The number of the last SRQ created.
    pub(crate) srq_next: u32,
}

impl Tables {
    /// Sets up the tables at `t` (zeroed memory: every field but the port is valid zeroed).
    ///
    /// # Safety
    ///
    /// `t` is valid for writes of a `Tables`, zeroed, and not referenced yet.
    pub(crate) unsafe fn init(t: NonNull<Tables>, port: Port) {
        // SAFETY: the caller's contract; the port is the one field that is not valid zeroed,
        // written before any reference to the whole exists.
        unsafe { core::ptr::addr_of_mut!((*t.as_ptr()).port).write(port) };
    }

    /// The table slot of queue pair `qpn` (1: the GSI QP), or `None` for a number the device
    /// never gives.
    pub(crate) fn qp_slot(&mut self, qpn: u32) -> Option<&mut *mut QpCore> {
        if qpn == GSI_QPN {
            return Some(&mut self.gsi);
        }
        let i = qpn.checked_sub(FIRST_QPN)?;
        self.qps.get_mut(i as usize)
    }

    /// Registers `len` bytes at `addr` in `pd`; the key, or `None` when the table is full.
    pub(crate) fn add_mr(
        &mut self,
        addr: u64,
        len: u64,
        pd: u32,
        access: AccessFlags,
    ) -> Option<u32> {
        let i = self.mrs.iter().position(|m| m.key == 0)?;
        let m = &mut self.mrs[i];
        m.generation = m.generation.wrapping_add(1).max(1);
        let key = (i as u32) << 8 | u32::from(m.generation);
        *m = MrEntry {
            addr,
            len,
            key,
            pd,
            access: access.bits(),
            generation: m.generation,
        };
        Some(key)
    }

    /// Deregisters the region with `key`.
    pub(crate) fn remove_mr(&mut self, key: u32) {
        if let Some(m) = self.mrs.get_mut((key >> 8) as usize)
            && m.key == key
        {
            m.key = 0;
        }
    }

    /// The CPU address of `len` bytes at `addr` of the region with `key` in `pd`, with the
    /// right `need` (empty: local read).
    pub(crate) fn check(
        &self,
        key: u32,
        pd: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<*mut u8, Denied> {
        let m = self.mrs.get((key >> 8) as usize).ok_or(Denied::Key)?;
        if m.key == 0 || m.key != key || m.pd != pd {
            return Err(Denied::Key);
        }
        if len == 0 {
            return Ok(core::ptr::null_mut());
        }
        let end = addr.checked_add(len).ok_or(Denied::Bounds)?;
        if addr < m.addr || end > m.addr + m.len {
            return Err(Denied::Bounds);
        }
        if !AccessFlags::from_bits_truncate(m.access).contains(need) {
            return Err(Denied::Access);
        }
        Ok(addr as usize as *mut u8)
    }

    /// Copies `out.len()` bytes at byte `offset` of the message the gather list `sges`
    /// describes into `out`.
    pub(crate) fn gather(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u32,
        out: &mut [u8],
    ) -> Result<(), Denied> {
        self.walk(
            pd,
            sges,
            offset,
            out.len(),
            AccessFlags::empty(),
            |p, at, n| {
                // SAFETY: `check` found `p..p + n` inside a registered region (the registration
                // contract keeps it allocated); `out[at..at + n]` is in bounds (walk's contract).
                unsafe { core::ptr::copy(p, out.as_mut_ptr().add(at), n) }
            },
        )
    }

    /// Copies `data` to byte `offset` of the message the scatter list `sges` describes.
    pub(crate) fn scatter(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u32,
        data: &[u8],
    ) -> Result<(), Denied> {
        self.walk(
            pd,
            sges,
            offset,
            data.len(),
            AccessFlags::LOCAL_WRITE,
            |p, at, n| {
                // SAFETY: as in `gather`, with the region's local-write right checked.
                unsafe { core::ptr::copy(data.as_ptr().add(at), p, n) }
            },
        )
    }

    /// Calls `f(cpu address, position in the caller's buffer, length)` for each piece of
    /// `len` bytes at `offset` of the scatter/gather list, every piece checked first.
    fn walk(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u32,
        len: usize,
        need: AccessFlags,
        mut f: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), Denied> {
        let mut skip = u64::from(offset);
        let mut done = 0usize;
        for s in sges {
            if done == len {
                break;
            }
            let l = u64::from(s.length);
            if skip >= l {
                skip -= l;
                continue;
            }
            let n = ((l - skip) as usize).min(len - done);
            let a = s.addr.checked_add(skip).ok_or(Denied::Bounds)?;
            let p = self.check(s.lkey, pd, a, n as u64, need)?;
            if n > 0 {
                f(p, done, n);
            }
            done += n;
            skip = 0;
        }
        if done == len {
            Ok(())
        } else {
            Err(Denied::Bounds)
        }
    }
}

/// Bytes of a scatter/gather list.
pub(crate) fn sge_bytes(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}
