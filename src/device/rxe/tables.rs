//! The device's tables, in its block: the port, the memory regions, the queue pairs, the
//! counters of the other objects, and the small queues. The data flows one way: the tables
//! hold the memory table ([`super::mem`]) and the queue pairs ([`super::qp_state`]), which
//! hold the shared receive queues ([`super::srq`]); none of those reaches back here.

use core::ptr::NonNull;

use super::busy_bit::{BusyBit, GSI_BIT};
use super::mem::MrTable;
use super::port::Port;
use super::port::TransportCounts;
use super::qp_state::QpCore;
use super::rings::{AsyncRing, Loopback, StackRing};
use super::{FIRST_QPN, GSI_QPN, MAX_QP};

/// The device's tables, in its block (reached only under the device lock).
pub(crate) struct Tables {
    pub(crate) port: Port,
    pub(crate) mrs: MrTable,
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
    /// Which queue pair has the first turn at the next progress.
    pub(crate) turn: u32,
    /// What the reliable transport counted (retries, NAKs, duplicates).
    pub(crate) transport: TransportCounts,
    /// The pace of the READ responses to other stations.
    pub(crate) pace: super::pace::Pace,
}

impl Tables {
    /// Sets up the tables at `t` (zeroed memory: every field but the port is valid zeroed).
    ///
    /// # Safety
    ///
    /// `t` is valid for writes of a `Tables`, zeroed, and not referenced yet.
    pub(crate) unsafe fn init(t: NonNull<Tables>, port: Port, seed: u64) {
        // SAFETY: the caller's contract; the port is the one field that is not valid zeroed,
        // written before any reference to the whole exists.
        unsafe { core::ptr::addr_of_mut!((*t.as_ptr()).port).write(port) };
        // SAFETY: as above; the port is written, every other field is valid zeroed.
        unsafe { (*t.as_ptr()).mrs.seed(seed) };
    }

    /// The place of queue pair `qpn` in the device's busy set (an empty mask for a number
    /// the device never gives).
    pub(crate) fn bit(qpn: u32) -> BusyBit {
        if qpn == GSI_QPN {
            return GSI_BIT;
        }
        match qpn.checked_sub(FIRST_QPN) {
            Some(i) if (i as usize) < MAX_QP => BusyBit {
                word: i as usize / 64,
                mask: 1 << (i % 64),
            },
            _ => BusyBit { word: 0, mask: 0 },
        }
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
}
