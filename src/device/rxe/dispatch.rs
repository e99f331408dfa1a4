//! Where a received RoCE packet goes: to the queue pair it names (as an answer to that QP's
//! requests or as a request to it), or to every queue pair attached to its multicast group;
//! and the transport's view of the locked core (`net`).

use core::ptr::NonNull;

use bareverbs_hal::{Clock, Hal, Link};

use super::{
    Core, FRAME, MAX_QP, MCAST_QPN, QP_SPINS, Rxe, check, net, port, qp_lock, reply, requester,
    responder, wire,
};
use crate::verbs::QpState;

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    /// What the transport works with, from the locked core.
    pub(crate) fn net<'a>(&'a self, core: &'a mut Core<L>, now: u64) -> net::Net<'a, L> {
        // SAFETY: the transmit buffer is FRAME bytes of the device block, apart from the
        // tables and the receive buffer, reached only through the locked core.
        let tx = unsafe { core::slice::from_raw_parts_mut(core.tx.as_ptr(), FRAME) };
        let (link, t) = core.parts();
        net::Net {
            link,
            t,
            tx,
            hub: self.hub(),
            now,
            mtu: self.mtu,
            answers: reply::ANSWER_BURST,
        }
    }

    /// A RoCE packet for this interface: to the queue pair it names, as an answer to its
    /// requests or as a request to it. `false` when that QP's lock is held elsewhere (the
    /// frame is kept for the next progress: the progress never waits for a QP, so an
    /// interrupt handler that runs it cannot wait for the thread it preempted).
    pub(super) fn dispatch(
        &self,
        core: &mut Core<L>,
        p: &wire::packet::View<'_>,
        now: u64,
    ) -> bool {
        let qpn = p.dest_qp();
        if qpn == MCAST_QPN {
            self.dispatch_group(core, p, now);
            return true;
        }
        let Some(&mut q) = core.tables().qp_slot(qpn) else {
            return true;
        };
        let Some(q) = NonNull::new(q) else {
            return true;
        };
        // SAFETY: a QP in the table is alive (destroy removes it under the device lock,
        // held here, first); the device lock is held and no QP lock (the lock order).
        let Some(mut guard) = (unsafe { qp_lock::QpGuard::try_lock(q, QP_SPINS) }) else {
            return false;
        };
        let q = &mut *guard;
        if q.peer_mac.is_none()
            && matches!(
                q.qp_type,
                crate::verbs::QpType::Rc | crate::verbs::QpType::Uc
            )
            && q.state != QpState::Reset
        {
            // The peer's MAC as ARP gave it, for the source check.
            q.peer_mac = core.tables().port.lookup_any(q.peer_ip);
        }
        // Over IPv6 the port names a frame's sender by the first of its paths between the
        // two addresses; paths differ by their flow label, which a peer need not send back
        // (Linux's rxe sends 0): a frame on another path between the QP's two addresses is
        // the QP's own path's.
        let mut src = p.src_ip();
        if src != q.peer_ip
            && port::alias_path(src).is_some()
            && core.tables().port.same_peer6(src, q.peer_ip)
        {
            src = q.peer_ip;
        }
        // Not the peer's, not for this QP's transport, or the QP does not receive: dropped,
        // nothing changed.
        if !check::admit(q, p, src) {
            return true;
        }
        let mut net = self.net(core, now);
        use wire::bth::opcode as o;
        match p.opcode() {
            o::RC_READ_RESPONSE_FIRST..=o::RC_ATOMIC_ACK => requester::on_response(&mut net, q, p),
            _ => responder::on_request(&mut net, q, p),
        }
        self.note_frame(q);
        true
    }
}

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    /// A datagram to a multicast group (the port checked that a queue pair of the device is
    /// in it): to each UD queue pair attached, which checks its Q_Key and takes a receive of
    /// its own. A member whose lock is held elsewhere misses this datagram (the progress
    /// never waits for a QP, and keeping the frame would give it twice to the others):
    /// datagrams are unreliable, as when its receive queue is empty.
    fn dispatch_group(&self, core: &mut Core<L>, p: &wire::packet::View<'_>, now: u64) {
        let members = core.tables().port.groups.members(p.dst_ip());
        // Bounded: at most MAX_QP members, each looked at once.
        for slot in 0..MAX_QP {
            if !members.has(slot) {
                continue;
            }
            let Some(q) = core.tables().qps.get(slot).copied().and_then(NonNull::new) else {
                continue;
            };
            // SAFETY: a QP in the table is alive (destroy removes it, and its memberships,
            // under the device lock, held here); the device lock is held and no QP lock.
            let Some(mut guard) = (unsafe { qp_lock::QpGuard::try_lock(q, QP_SPINS) }) else {
                continue;
            };
            let q = &mut *guard;
            if q.qp_type != crate::verbs::QpType::Ud || !check::admit(q, p, p.src_ip()) {
                continue;
            }
            let mut net = self.net(core, now);
            responder::on_request(&mut net, q, p);
            self.note_frame(q);
        }
    }
}
