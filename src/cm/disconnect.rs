//! Disconnection: DREQ (resent until the DREP or the retry count), DREP, TIME_WAIT; a DREQ
//! for a connection this side does not know is answered with a DREP (as Linux does), one that
//! names another QP than the connection's, or comes from another address, is dropped.

use bareverbs_hal::Clock;

use super::mad::{Mad, attr};
use super::msg::{self, Ids};
use super::table::{Lookup, St, pend};
use super::timer::{Timer, timeout_us};
use super::{Cm, CmAddr, CmError, ConnId};
use crate::verbs::Provider;

impl<P: Provider, C: Clock, const N: usize> Cm<'_, P, C, N> {
    /// Disconnects an established connection (DREQ). Linux moves its QP to ERROR first: do
    /// the same. [`CmEvent::Disconnected`](super::CmEvent) follows at the DREP (or when the
    /// DREQ goes unanswered), then [`CmEvent::TimeWaitExit`](super::CmEvent).
    ///
    /// # Errors
    ///
    /// [`CmError::UnknownConnection`]; [`CmError::WrongState`] for a connection that is not
    /// established (or waiting for its RTU).
    pub fn disconnect(&mut self, id: ConnId) -> Result<(), CmError> {
        let i = self
            .conns
            .by_local(id.0)
            .ok_or(CmError::UnknownConnection)?;
        if !matches!(self.conns[i].st, St::Established | St::RepSent) {
            return Err(CmError::WrongState);
        }
        let now = self.clock.now_us();
        self.start_disconnect(i, now);
        Ok(())
    }

    /// Sends the DREQ of entry `i` and waits for the DREP.
    pub(super) fn start_disconnect(&mut self, i: usize, now: u64) {
        let tid = self.tid_for(self.conns[i].local_id) ^ (now << 32);
        let period = 2 * timeout_us(self.cfg.packet_life) + timeout_us(self.cfg.response_timeout);
        let c = &mut self.conns[i];
        let m = msg::encode_dreq(
            Ids {
                local: c.local_id,
                remote: c.remote_id,
            },
            c.remote_qpn,
            tid,
        );
        c.st = St::DreqSent;
        c.out = m;
        c.timer = Timer::arm(now, period, self.cfg.max_retries);
        let ip = c.peer_ip;
        self.send(ip, &m);
    }

    /// Entry `i` enters TIME_WAIT (the QP's ACK timeout long) with its disconnection to
    /// report.
    pub(super) fn time_wait(&mut self, i: usize, now: u64) {
        let wait = timeout_us(self.cfg.ack_timeout);
        let c = &mut self.conns[i];
        if c.st != St::TimeWait {
            c.pending |= pend::DISCONNECTED;
        }
        c.st = St::TimeWait;
        c.timer = Timer::once(now, wait);
    }

    /// A DREQ from `ip`.
    pub(super) fn on_dreq(&mut self, ip: CmAddr, m: &Mad, now: u64) -> bool {
        let ids = Ids::decode(m);
        let drep = |ids: Ids| msg::encode_simple(attr::DREP, ids, &[], m.tid());
        let Some(i) = self.conns.by_pair(ids.remote, ids.local, ip) else {
            let known = self
                .conns
                .iter()
                .any(|c| c.live() && c.local_id == ids.remote);
            if !known {
                // Nobody's here: answer as Linux does (IDs swapped), so a peer that lost
                // its DREP stops resending.
                self.answer(
                    ip,
                    &drep(Ids {
                        local: ids.remote,
                        remote: ids.local,
                    }),
                );
            }
            return false;
        };
        let c = &self.conns[i];
        if msg::dreq_remote_qpn(m) != c.local_qpn {
            return false;
        }
        let back = Ids {
            local: c.local_id,
            remote: c.remote_id,
        };
        match c.st {
            St::Established | St::RepSent | St::DreqSent => {
                self.send(ip, &drep(back));
                self.time_wait(i, now);
                true
            }
            St::TimeWait => {
                self.send(ip, &drep(back));
                true
            }
            _ => false,
        }
    }

    /// A DREP from `ip`.
    pub(super) fn on_drep(&mut self, ip: CmAddr, m: &Mad, now: u64) -> bool {
        let ids = Ids::decode(m);
        let Some(i) = self.conns.by_pair(ids.remote, ids.local, ip) else {
            return false;
        };
        if self.conns[i].st != St::DreqSent {
            return false;
        }
        self.time_wait(i, now);
        true
    }
}
