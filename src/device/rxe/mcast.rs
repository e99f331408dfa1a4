//! The multicast groups of the device's UD queue pairs (`ibv_attach_mcast`,
//! `docs/multicast.md`): a fixed table of IPv4 groups, each with the set of queue-pair slots
//! attached to it. A frame to a group reaches only the queue pairs in its set (and each
//! checks its Q_Key); a group nobody is in takes nothing.

use bareverbs_hal::{Clock, Hal, Link};

use super::qp::Qp;
use super::wire::igmp;
use super::{FIRST_QPN, MAX_QP, Rxe};
use crate::error::{Error, Feature, NotFound, Object, Op, Param, Resource, Result, Unsupported};
use crate::verbs::{Gid, QpType};

/// Multicast groups the device's queue pairs are attached to at once (`max_mcast_grp`).
pub const MAX_MCAST_GRP: usize = 8;

/// Words of a group's member set (one bit per queue-pair slot).
const WORDS: usize = MAX_QP.div_ceil(64);

/// A group's members: bit `s` is the queue pair in table slot `s` (below [`MAX_QP`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Members([u64; WORDS]);

impl Members {
    /// Whether slot `s` is in the set (a slot past the table never is).
    pub(crate) fn has(&self, s: usize) -> bool {
        self.0.get(s / 64).is_some_and(|w| w & (1 << (s % 64)) != 0)
    }

    fn set(&mut self, s: usize, on: bool) {
        if let Some(w) = self.0.get_mut(s / 64) {
            if on {
                *w |= 1 << (s % 64);
            } else {
                *w &= !(1 << (s % 64));
            }
        }
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
}

/// What an attach or a detach changed on the segment's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// The group's membership changed, not whether the device is in it.
    Members,
    /// The first queue pair joined: the device joins the group (IGMP report).
    Joined,
    /// The last queue pair left: the device leaves the group (IGMP leave).
    Left,
}

/// Why an attach or a detach was refused (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Every entry holds another group.
    Full,
    /// The queue pair is attached to the group already.
    Already,
    /// The queue pair is not attached to the group.
    NotMember,
}

/// The table: entry `i` is the group `ip[i]` while `members[i]` is not empty.
#[derive(Debug)]
pub(crate) struct Groups {
    ip: [[u8; 4]; MAX_MCAST_GRP],
    members: [Members; MAX_MCAST_GRP],
}

impl Groups {
    /// No group.
    pub(crate) const fn new() -> Self {
        Groups {
            ip: [[0; 4]; MAX_MCAST_GRP],
            members: [Members([0; WORDS]); MAX_MCAST_GRP],
        }
    }

    fn find(&self, ip: [u8; 4]) -> Option<usize> {
        (0..MAX_MCAST_GRP).find(|&i| !self.members[i].is_empty() && self.ip[i] == ip)
    }

    /// The slots attached to `ip` (empty: none, or no such group).
    pub(crate) fn members(&self, ip: [u8; 4]) -> Members {
        self.find(ip)
            .map_or_else(Members::default, |i| self.members[i])
    }

    /// Groups with at least one member.
    pub(crate) fn count(&self) -> usize {
        self.members.iter().filter(|m| !m.is_empty()).count()
    }

    /// Attaches slot `slot` (below [`MAX_QP`]) to `ip`.
    pub(crate) fn attach(&mut self, ip: [u8; 4], slot: usize) -> Result<Change, Refused> {
        if slot >= MAX_QP {
            // No queue pair has such a slot: nothing to attach.
            return Err(Refused::NotMember);
        }
        if let Some(i) = self.find(ip) {
            if self.members[i].has(slot) {
                return Err(Refused::Already);
            }
            self.members[i].set(slot, true);
            return Ok(Change::Members);
        }
        let i = (0..MAX_MCAST_GRP)
            .find(|&i| self.members[i].is_empty())
            .ok_or(Refused::Full)?;
        self.ip[i] = ip;
        self.members[i].set(slot, true);
        Ok(Change::Joined)
    }

    /// Detaches slot `slot` from `ip`.
    pub(crate) fn detach(&mut self, ip: [u8; 4], slot: usize) -> Result<Change, Refused> {
        let i = self.find(ip).ok_or(Refused::NotMember)?;
        if !self.members[i].has(slot) {
            return Err(Refused::NotMember);
        }
        self.members[i].set(slot, false);
        Ok(if self.members[i].is_empty() {
            Change::Left
        } else {
            Change::Members
        })
    }

    /// Detaches slot `slot` from every group (its queue pair is destroyed); `left` gets each
    /// group that lost its last member.
    pub(crate) fn forget(&mut self, slot: usize, mut left: impl FnMut([u8; 4])) {
        for i in 0..MAX_MCAST_GRP {
            if self.members[i].has(slot) {
                self.members[i].set(slot, false);
                if self.members[i].is_empty() {
                    left(self.ip[i]);
                }
            }
        }
    }
}

/// The IPv4 group a multicast GID names: the IPv4-mapped GID of a class D address (what
/// Linux's CM makes of an IPv4 group for RoCEv2). An IPv6 group is not taken (Linux's CM
/// refuses RoCEv2 multicast over IPv6 too).
fn group_of(gid: Gid) -> Result<[u8; 4]> {
    let ip = gid
        .ipv4()
        .ok_or(Error::Unsupported(Unsupported::Feature(Feature::Ipv6)))?;
    if !igmp::is_multicast(ip) {
        return Err(Error::invalid(
            Param::McastGid,
            u32::from_be_bytes(ip),
            u32::from_be_bytes([239, 255, 255, 255]),
        ));
    }
    Ok(ip)
}

impl<H: Hal, L: Link, C: Clock> Rxe<H, L, C> {
    /// `ibv_attach_mcast`: the UD queue pair `qp` takes the datagrams to `gid`'s group from
    /// now on. The device's first member of a group has the NIC take the group's MAC and
    /// sends an IGMPv2 membership report.
    pub(crate) fn attach_mcast_impl(&self, qp: &Qp<H>, gid: Gid) -> Result<()> {
        let ip = group_of(gid)?;
        if qp.qp_type != QpType::Ud {
            return Err(Error::Unsupported(Unsupported::Feature(Feature::Multicast)));
        }
        let slot = (qp.qpn - FIRST_QPN) as usize;
        let mut core = self.lock();
        let (link, t) = core.parts();
        match t.port.groups.attach(ip, slot) {
            Ok(Change::Joined) => {
                link.join_multicast(igmp::multicast_mac(ip));
                // A report the NIC had no room for is not sent again: the group's datagrams
                // still come on a segment without snooping (a hub, QEMU's socket netdev).
                let _ = link.transmit(&igmp::frame(igmp::REPORT_V2, self.mac, self.ip, ip));
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(Refused::Full) => Err(Error::Resource(Resource::Objects {
                object: Object::McastGroup,
                limit: MAX_MCAST_GRP as u32,
            })),
            Err(_) => Err(Error::Busy {
                op: Op::AttachMcast,
            }),
        }
    }

    /// `ibv_detach_mcast`: `qp` leaves `gid`'s group; the device's last member of a group
    /// sends an IGMPv2 leave.
    pub(crate) fn detach_mcast_impl(&self, qp: &Qp<H>, gid: Gid) -> Result<()> {
        let ip = group_of(gid)?;
        let slot = (qp.qpn.wrapping_sub(FIRST_QPN)) as usize;
        let mut core = self.lock();
        let (link, t) = core.parts();
        match t.port.groups.detach(ip, slot) {
            Ok(Change::Left) => {
                let _ = link.transmit(&igmp::frame(igmp::LEAVE, self.mac, self.ip, ip));
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(_) => Err(Error::NotFound(NotFound::McastMember { gid })),
        }
    }

    /// Has the NIC take frames to the Ethernet group `mac` from now on, for the embedder's
    /// IP stack ([`Rxe::stack`]): for example IGMPv3's reports (224.0.0.22,
    /// `01:00:5e:00:00:16`) for an embedder that watches who joins a group. A NIC with a
    /// multicast filter sets its entry; the port hands every group frame that is not RoCE to
    /// the stack.
    pub fn join_ethernet_group(&self, mac: [u8; 6]) {
        self.lock().link.join_multicast(mac);
    }

    /// The multicast groups at least one queue pair of the device is attached to (the
    /// groups whose datagrams the device takes).
    pub fn mcast_groups(&self) -> usize {
        self.lock().tables().port.groups.count()
    }

    /// A queue pair in slot `slot` is destroyed: it leaves every group (device lock held:
    /// `link` and `groups`), the device sending a leave for each group it was the last
    /// member of.
    pub(crate) fn forget_mcast(&self, link: &mut L, groups: &mut Groups, slot: usize) {
        groups.forget(slot, |ip| {
            let _ = link.transmit(&igmp::frame(igmp::LEAVE, self.mac, self.ip, ip));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_every_slot_of_the_table_and_none_beyond() {
        let mut g = Groups::new();
        let (a, b) = ([239, 0, 0, 1], [239, 0, 0, 2]);
        assert_eq!(g.attach(a, 0), Ok(Change::Joined));
        assert_eq!(g.attach(a, MAX_QP - 1), Ok(Change::Members));
        assert_eq!(g.attach(a, MAX_QP - 1), Err(Refused::Already));
        assert_eq!(g.attach(a, MAX_QP), Err(Refused::NotMember));
        assert_eq!(g.attach(b, MAX_QP - 1), Ok(Change::Joined));
        let m = g.members(a);
        let slots: Vec<usize> = (0..MAX_QP + 64).filter(|&s| m.has(s)).collect();
        assert_eq!(slots, [0, MAX_QP - 1]);
        assert_eq!(g.detach(a, 0), Ok(Change::Members));
        let mut left = Vec::new();
        g.forget(MAX_QP - 1, |ip| left.push(ip));
        assert_eq!(left, [a, b]);
        assert_eq!((g.count(), g.members(a).is_empty()), (0, true));
        assert_eq!(g.detach(a, 0), Err(Refused::NotMember));
    }
}
