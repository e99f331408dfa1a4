//! The state machine's entry points: a received datagram dispatched by message type, the
//! messages every state shares (REJ, MRA), and the timers.

use bareverbs_hal::Clock;

use super::mad::{Mad, attr};
use super::msg::{Ids, Mra, Private, Rej, about, reason};
use super::table::Failure;
use super::table::{Lookup, St, pend};
use super::timer::timeout_us;
use super::{Cm, CmAddr};
use crate::verbs::Provider;

impl<P: Provider, C: Clock, const N: usize> Cm<'_, P, C, N> {
    /// One received datagram (the MAD after the GRH slot) from `ip`.
    pub(super) fn on_datagram(&mut self, ip: CmAddr, bytes: &[u8], now: u64) {
        let Ok(m) = Mad::parse(bytes) else {
            self.counts.malformed += 1;
            return;
        };
        self.counts.received += 1;
        let taken = match m.attr() {
            attr::REQ => self.on_req(ip, &m, now),
            attr::REP => self.on_rep(ip, &m),
            attr::RTU => self.on_rtu(ip, &m),
            attr::REJ => self.on_rej(ip, &m, now),
            attr::MRA => self.on_mra(ip, &m, now),
            attr::DREQ => self.on_dreq(ip, &m, now),
            attr::DREP => self.on_drep(ip, &m, now),
            attr::SIDR_REQ => self.on_sidr_req(ip, &m, now),
            _ => self.on_sidr_rep(ip, &m),
        };
        if !taken {
            self.counts.unmatched += 1;
        }
    }

    /// A REJ: of this side's REQ (matched by this side's ID alone, as the passive side may
    /// not have given one) or of its REP (by both IDs).
    fn on_rej(&mut self, ip: CmAddr, m: &Mad, now: u64) -> bool {
        let rej = Rej::decode(m);
        if rej.rejected == about::REQ && rej.reason == reason::TIMEOUT {
            // The active side gave up waiting for the REP: matched, as Linux matches it, by
            // its comm ID and the CA GUID in the additional information (it never learnt
            // this side's ID).
            let guid = Rej::ari_guid(m);
            let gave_up = self.conns.iter().position(|c| {
                matches!(c.st, St::ReqRcvd | St::RepSent)
                    && !c.is_active()
                    && c.remote_id == rej.ids.local
                    && c.remote_guid == guid
                    && c.peer_ip == ip
            });
            let Some(i) = gave_up else { return false };
            let c = &mut self.conns[i];
            if c.pending & pend::REQUEST != 0 {
                // Never reported: forgotten without a word.
                *c = super::table::Conn::idle();
            } else {
                c.fail(Failure::Rejected { reason: rej.reason });
            }
            return true;
        }
        let i = if rej.rejected == about::REQ {
            self.conns
                .by_local(rej.ids.remote)
                .filter(|&i| self.conns[i].peer_ip == ip && self.conns[i].st == St::ReqSent)
        } else {
            self.conns.by_pair(rej.ids.remote, rej.ids.local, ip)
        };
        let Some(i) = i else { return false };
        let c = &mut self.conns[i];
        match c.st {
            St::ReqSent => {
                c.private = Private::from_slice(&rej.private.bytes);
                c.fail(Failure::Rejected { reason: rej.reason });
            }
            St::RepSent => {
                c.private = Private::from_slice(&rej.private.bytes);
                c.failure = Failure::Rejected { reason: rej.reason };
                c.pending |= pend::FAILED;
                // TIME_WAIT, as Linux enters it at a REJ after its REP; no disconnection
                // to report (the connection never was).
                let wait = timeout_us(self.cfg.ack_timeout);
                c.st = St::TimeWait;
                c.timer = super::timer::Timer::once(now, wait);
            }
            _ => return false,
        }
        true
    }

    /// An MRA: the peer needs more time to answer this side's REQ or REP.
    fn on_mra(&mut self, ip: CmAddr, m: &Mad, now: u64) -> bool {
        let mra = Mra::decode(m);
        let i = match mra.mraed {
            about::REQ => self
                .conns
                .by_local(mra.ids.remote)
                .filter(|&i| self.conns[i].peer_ip == ip && self.conns[i].st == St::ReqSent),
            about::REP => self
                .conns
                .by_pair(mra.ids.remote, mra.ids.local, ip)
                .filter(|&i| self.conns[i].st == St::RepSent),
            _ => None,
        };
        let Some(i) = i else { return false };
        let wait = timeout_us(mra.service_timeout) + timeout_us(self.cfg.packet_life);
        self.conns[i].timer.extend(now, wait);
        true
    }

    /// Every timer that fired by `now`: resend, or give up.
    pub(super) fn run_timers(&mut self, now: u64) {
        for i in 0..N {
            if !self.conns[i].timer.due(now) {
                continue;
            }
            let c = &mut self.conns[i];
            let st = c.st;
            if st != St::TimeWait && c.timer.retry(now) {
                let (ip, m) = (c.peer_ip, c.out);
                self.counts.resent += 1;
                self.send(ip, &m);
                continue;
            }
            match st {
                St::ReqSent => {
                    // Tell the peer this side gave up (REJ "timeout", the CA GUID as its
                    // additional information), as Linux does when its REQ goes unanswered
                    // and the ID is destroyed.
                    let guid = self.guid.to_be_bytes();
                    let c = &mut self.conns[i];
                    let r = Rej {
                        ids: Ids {
                            local: c.local_id,
                            remote: 0,
                        },
                        rejected: about::REQ,
                        ari_len: 0,
                        reason: reason::TIMEOUT,
                        private: Private::empty(),
                    }
                    .encode_with_ari(c.tid, &guid);
                    let ip = c.peer_ip;
                    c.fail(Failure::Timeout);
                    self.send(ip, &r);
                }
                St::RepSent => c.fail(Failure::Timeout),
                St::DreqSent => self.time_wait(i, now),
                St::TimeWait => {
                    c.pending |= pend::TIMEWAIT_EXIT;
                    c.close();
                }
                St::SidrReqSent => self.sidr_timed_out(i),
                _ => c.timer.stop(),
            }
        }
    }
}
