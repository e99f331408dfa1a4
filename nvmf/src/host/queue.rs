//! One queue of the host: its RC QP and one registered region (16-byte response buffers,
//! command capsules, data buffers the target reads and writes by key).

use bareverbs::cm::ConnId;
use bareverbs::verbs::{MemoryRegion, Provider, QueuePair, Rc, Rts, SendFlags};

use crate::wire::{CQE_LEN, Cqe};

/// Work-request ID: queue (8 bits), generation (16), kind (8: 1 receive, 2 send), slot.
pub(crate) fn encode(q: usize, epoch: u16, send: bool, slot: u16) -> u64 {
    ((q as u64 & 0xFF) << 48)
        | (u64::from(epoch) << 32)
        | ((1 + u64::from(send)) << 16)
        | u64::from(slot)
}

pub(crate) fn decode(id: u64) -> Option<(usize, u16, bool, u16)> {
    let kind = (id >> 16) & 0xFFFF;
    if id >> 56 != 0 || !(1..=2).contains(&kind) {
        return None;
    }
    Some((
        ((id >> 48) & 0xFF) as usize,
        (id >> 32) as u16,
        kind == 2,
        id as u16,
    ))
}

/// A command slot.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Slot {
    /// Submitted, not yet taken back by the user.
    pub busy: bool,
    /// The command ID it was sent with.
    pub cid: u16,
    /// Its capsule's SEND completed.
    pub sent: bool,
    /// Its response, once it came.
    pub cqe: Option<Cqe>,
    /// Bytes of data the target is to write into the slot's data buffer.
    pub read_len: u32,
    /// Sent by the host itself (keep-alive): taken back by `poll`.
    pub internal: bool,
}

pub(crate) struct HostQueue<'a, P: Provider, const D: usize> {
    pub qp: Option<QueuePair<'a, P, Rc, Rts>>,
    pub mr: Option<MemoryRegion<'a, P>>,
    pub conn: Option<ConnId>,
    pub epoch: u16,
    pub depth: u16,
    pub capsule: u32,
    pub data_len: u32,
    pub seq: u16,
    pub slots: [Slot; D],
}

impl<'a, P: Provider, const D: usize> HostQueue<'a, P, D> {
    pub fn free() -> Self {
        HostQueue {
            qp: None,
            mr: None,
            conn: None,
            epoch: 0,
            depth: 0,
            capsule: 0,
            data_len: 0,
            seq: 0,
            slots: [Slot::default(); D],
        }
    }

    pub fn region_len(depth: u16, capsule: u32, data_len: u32) -> usize {
        usize::from(depth) * (CQE_LEN + capsule as usize + data_len as usize)
    }

    pub fn resp_at(&self, s: u16) -> usize {
        usize::from(s) * CQE_LEN
    }
    pub fn capsule_at(&self, s: u16) -> usize {
        usize::from(self.depth) * CQE_LEN + usize::from(s) * self.capsule as usize
    }
    pub fn data_at(&self, s: u16) -> usize {
        self.capsule_at(self.depth) + usize::from(s) * self.data_len as usize
    }

    pub fn close(&mut self) {
        drop(self.qp.take());
        drop(self.mr.take());
        self.conn = None;
        self.epoch = self.epoch.wrapping_add(1);
        self.slots = [Slot::default(); D];
    }

    pub fn post_recv(&mut self, q: usize, s: u16) -> Result<(), ()> {
        let at = self.resp_at(s) as u32;
        let (Some(qp), Some(mr)) = (self.qp.as_mut(), self.mr.as_ref()) else {
            return Err(());
        };
        let sge = mr.sge(at, CQE_LEN as u32).map_err(|_| ())?;
        // SAFETY: the region outlives the QP (`close` destroys the QP first); the CPU reads a
        // response buffer only after its completion.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(encode(q, self.epoch, false, s), &[sge])
                .map_err(|_| ())?;
            r.finish();
        }
        Ok(())
    }

    /// SENDs `len` bytes of slot `s`'s capsule buffer.
    pub fn post_capsule(&mut self, q: usize, s: u16, len: u32) -> Result<(), ()> {
        let at = self.capsule_at(s) as u32;
        let (Some(qp), Some(mr)) = (self.qp.as_mut(), self.mr.as_ref()) else {
            return Err(());
        };
        let sge = mr.sge(at, len.min(self.capsule)).map_err(|_| ())?;
        // SAFETY: as in `post_recv`: the capsule and the slot's data buffer are not touched
        // until the command completes.
        unsafe {
            let mut b = qp.send_batch();
            b.send(encode(q, self.epoch, true, s), SendFlags::SIGNALED, &[sge])
                .map_err(|_| ())?;
            b.finish();
        }
        Ok(())
    }

    /// The region's bytes at `at`, `len` of them (empty if out of range).
    pub fn bytes_mut(&mut self, at: usize, len: usize) -> &mut [u8] {
        match self.mr.as_mut() {
            Some(m) => m.as_mut_slice().get_mut(at..at + len).unwrap_or(&mut []),
            None => &mut [],
        }
    }

    pub fn bytes(&self, at: usize, len: usize) -> &[u8] {
        self.mr
            .as_ref()
            .and_then(|m| m.as_slice().get(at..at + len))
            .unwrap_or(&[])
    }
}
