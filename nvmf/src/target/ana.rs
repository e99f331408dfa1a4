//! Several appliances, one namespace: the namespace identifiers every appliance serving it
//! reports alike, Asymmetric Namespace Access (groups, states, the ANA log page and the
//! notice of a change), and the peers the discovery log lists beside this target's own port.
//! `docs/nvmeof.md` (Multipath and ANA) has the fields and what Linux reads of them.

use bareverbs::hal::Clock;
use bareverbs::verbs::Provider;

use super::ADMIN_DEPTH;
use super::admin::{Cx, ns_index};
use super::ctrl::Which;
use super::queue::Cmd;
use super::{Subsystem, Target, TargetError};
use crate::wire::ana::{self, AnaState, GroupDesc};
use crate::wire::fabrics::CNTLID_DYNAMIC;
use crate::wire::identify::discovery;
use crate::wire::{SQE_LEN, Sqe, Status, put32};

/// ANA groups a subsystem has: IDs 1..=`ANA_GROUPS` (Identify Controller's ANAGRPMAX and
/// NANAGRPID).
pub const ANA_GROUPS: u32 = 4;
/// ANA transition time reported (seconds): states change at once here, so never used up.
pub const ANATT_S: u8 = 10;
/// ANA capabilities reported: the optimized, non-optimized and inaccessible states (bits
/// 0–2), and a namespace's group never changes while it is attached (bit 6).
pub const ANACAP: u8 = 0x47;
/// Peers a discovery log lists at most ([`TargetConfig::peers`](super::TargetConfig::peers)).
pub const MAX_PEERS: usize = 4;

/// A namespace's identity: what every appliance that serves the namespace reports, so that a
/// host's multipath sees one namespace behind several controllers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsIds {
    /// Namespace GUID; `None`: one derived from the subsystem's NQN and the NSID (alike on
    /// every appliance serving the same NQN).
    pub nguid: Option<[u8; 16]>,
    /// IEEE EUI-64; `None`: not reported.
    pub eui64: Option<[u8; 8]>,
    /// UUID; `None`: not reported.
    pub uuid: Option<[u8; 16]>,
    /// The namespace's ANA group (1..=[`ANA_GROUPS`]).
    pub anagrpid: u32,
}

impl Default for NsIds {
    fn default() -> Self {
        NsIds {
            nguid: None,
            eui64: None,
            uuid: None,
            anagrpid: 1,
        }
    }
}

/// Another appliance's NVMe/RDMA port, which this target's discovery log lists too (with
/// each subsystem the host may reach), so that a host's `nvme connect-all` against either
/// appliance connects every path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its IPv4 address.
    pub addr: [u8; 4],
    /// Its rdma_cm port (4420).
    pub port: u16,
    /// Its port ID (its own [`TargetConfig::port_id`](super::TargetConfig::port_id)).
    pub port_id: u16,
}

/// A subsystem's multipath state: its namespaces' identities and its ANA groups' states and
/// change counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Multipath<'s> {
    /// Identity of namespace `k + 1` at `ids[k]`; a namespace past the slice has the
    /// defaults ([`NsIds::default`]: derived NGUID, group 1).
    pub ids: &'s [NsIds],
    states: [AnaState; ANA_GROUPS as usize],
    group_chgcnt: [u64; ANA_GROUPS as usize],
    chgcnt: u64,
}

impl Default for Multipath<'_> {
    fn default() -> Self {
        Multipath::new(&[])
    }
}

impl<'s> Multipath<'s> {
    /// Namespaces identified by `ids`, every group optimized.
    pub fn new(ids: &'s [NsIds]) -> Self {
        Multipath {
            ids,
            states: [AnaState::Optimized; ANA_GROUPS as usize],
            group_chgcnt: [0; ANA_GROUPS as usize],
            chgcnt: 0,
        }
    }

    /// The same with group `grpid` in `state` from the start (a group out of range, or a
    /// state the target does not report, leaves it as it was).
    pub fn with_state(mut self, grpid: u32, state: AnaState) -> Self {
        if let Some(s) = group(grpid).and_then(|g| self.states.get_mut(g))
            && reported(state)
        {
            *s = state;
        }
        self
    }

    /// The identity of namespace `nsid` (1-based).
    pub fn ns(&self, nsid: u32) -> NsIds {
        nsid.checked_sub(1)
            .and_then(|k| self.ids.get(k as usize))
            .copied()
            .unwrap_or_default()
    }

    /// The state of group `grpid`, `None` out of range.
    pub fn state(&self, grpid: u32) -> Option<AnaState> {
        group(grpid).map(|g| self.states[g])
    }

    /// The ANA log's change count (one more for every change of a group's state).
    pub fn change_count(&self) -> u64 {
        self.chgcnt
    }

    /// Puts group `grpid` in `state`, its change counts and the log's up by one; false (and
    /// nothing changed) when the group is out of range, the state not one the target reports,
    /// or the group's already.
    pub(super) fn apply(&mut self, grpid: u32, state: AnaState) -> bool {
        let Some(g) = group(grpid) else {
            return false;
        };
        if !reported(state) || self.states[g] == state {
            return false;
        }
        self.states[g] = state;
        self.chgcnt = self.chgcnt.wrapping_add(1).max(1);
        self.group_chgcnt[g] = self.group_chgcnt[g].wrapping_add(1).max(1);
        true
    }

    /// The state of namespace `nsid`'s group.
    pub fn ns_state(&self, nsid: u32) -> AnaState {
        self.state(self.ns(nsid).anagrpid)
            .unwrap_or(AnaState::Inaccessible)
    }
}

/// Group ID `grpid` as an index.
fn group(grpid: u32) -> Option<usize> {
    (1..=ANA_GROUPS)
        .contains(&grpid)
        .then(|| (grpid - 1) as usize)
}

/// Whether the target reports `state` (ANACAP).
fn reported(state: AnaState) -> bool {
    matches!(
        state,
        AnaState::Optimized | AnaState::NonOptimized | AnaState::Inaccessible
    )
}

/// A subsystem's configuration, checked: every identity names a namespace it has and a group
/// in range, and no two namespaces share an NGUID, EUI-64 or UUID.
pub(super) fn check(sub: &Subsystem<'_>) -> Result<(), TargetError> {
    let ids = sub.multipath.ids;
    if ids.len() > sub.namespaces.len() {
        return Err(TargetError::Config("namespace ids"));
    }
    if ids.iter().any(|x| group(x.anagrpid).is_none()) {
        return Err(TargetError::Config("anagrpid"));
    }
    for (k, a) in ids.iter().enumerate() {
        for b in &ids[k + 1..] {
            let same = |x: Option<&[u8]>, y: Option<&[u8]>| x.is_some() && x == y;
            if same(
                a.nguid.as_ref().map(|g| &g[..]),
                b.nguid.as_ref().map(|g| &g[..]),
            ) || same(
                a.eui64.as_ref().map(|g| &g[..]),
                b.eui64.as_ref().map(|g| &g[..]),
            ) || same(
                a.uuid.as_ref().map(|g| &g[..]),
                b.uuid.as_ref().map(|g| &g[..]),
            ) {
                return Err(TargetError::Config("namespace ids"));
            }
        }
    }
    Ok(())
}

/// The I/O status of namespace `nsid` of `sub` through this target: success where its group
/// is optimized or non-optimized, else the path-related status of its state.
pub(super) fn io_allowed(sub: &Subsystem<'_>, nsid: u32) -> Result<(), Status> {
    match sub.multipath.ns_state(nsid) {
        AnaState::Optimized | AnaState::NonOptimized => Ok(()),
        AnaState::PersistentLoss => Err(Status::ANA_PERSISTENT_LOSS),
        AnaState::Change => Err(Status::ANA_TRANSITION),
        AnaState::Inaccessible => Err(Status::ANA_INACCESSIBLE),
    }
}

/// The Namespace Identification Descriptor list of namespace `nsid` into `buf` (zeroed
/// first): its EUI-64 and UUID where it has them, its NGUID, and the command set (NVM).
pub(super) fn ns_desc_list(sub: &Subsystem<'_>, nsid: u32, nguid: [u8; 16], buf: &mut [u8]) {
    use crate::wire::identify::nidt;
    buf.fill(0);
    let ids = sub.multipath.ns(nsid);
    let mut at = 0;
    let mut put = |t: u8, v: &[u8]| {
        buf[at] = t;
        buf[at + 1] = v.len() as u8;
        buf[at + 4..at + 4 + v.len()].copy_from_slice(v);
        at += 4 + v.len();
    };
    if let Some(e) = ids.eui64 {
        put(nidt::EUI64, &e);
    }
    put(nidt::NGUID, &nguid);
    if let Some(u) = ids.uuid {
        put(nidt::UUID, &u);
    }
    // CSI 0: the NVM command set.
    put(nidt::CSI, &[0]);
}

/// The ANA log page of subsystem `k` from byte `lpo` into `buf` (zeroed by the caller): the
/// header, then one descriptor per group with a namespace, each followed by its NSIDs in
/// ascending order (none with Return Groups Only, LSP bit 0). Read without Retain
/// Asynchronous Event (CDW10 bit 15), it unmasks the controller's ANA change notices.
pub(super) fn log_page(
    cx: &mut Cx<'_, '_>,
    k: usize,
    sqe: &Sqe,
    lpo: u64,
    buf: &mut [u8],
) -> Result<u64, Status> {
    let sub = cx.subsystems.get(k).ok_or(Status::INTERNAL)?;
    let rgo = (sqe.cdw(10) >> 8) as u8 & ana::LSP_RGO != 0;
    let mp = &sub.multipath;
    let nn = sub.namespaces.len() as u32;
    let members = |g: u32| (1..=nn).filter(move |&n| mp.ns(n).anagrpid == g);
    let groups = || (1..=ANA_GROUPS).filter(|&g| members(g).next().is_some());
    let mut out = Out { lpo, buf, at: 0 };
    let mut head = [0u8; ana::HEADER_LEN];
    ana::write_header(&mut head, mp.chgcnt, groups().count() as u16);
    out.put(&head);
    for g in groups() {
        let nnsids = if rgo { 0 } else { members(g).count() as u32 };
        let mut d = [0u8; ana::DESC_LEN];
        GroupDesc {
            grpid: g,
            nnsids,
            chgcnt: mp.group_chgcnt[(g - 1) as usize],
            state: mp.states[(g - 1) as usize] as u8,
        }
        .write(&mut d);
        out.put(&d);
        if !rgo {
            for n in members(g) {
                let mut id = [0u8; 4];
                put32(&mut id, 0, n);
                out.put(&id);
            }
        }
        if out.done() {
            break;
        }
    }
    if out.at < lpo {
        return Err(Status::INVALID_FIELD);
    }
    if sqe.cdw(10) & (1 << 15) == 0 {
        cx.ctrl.ana_masked = false;
    }
    Ok(0)
}

/// A log page's bytes laid at their offsets, the window from `lpo` copied into `buf`.
struct Out<'b> {
    lpo: u64,
    buf: &'b mut [u8],
    /// Bytes of the page laid so far.
    at: u64,
}

impl Out<'_> {
    fn put(&mut self, bytes: &[u8]) {
        let (start, end) = (self.at, self.at + bytes.len() as u64);
        let (lo, hi) = (self.lpo, self.lpo + self.buf.len() as u64);
        if end > lo && start < hi {
            let from = lo.max(start);
            let to = hi.min(end);
            let src = &bytes[(from - start) as usize..(to - start) as usize];
            let dst = (from - lo) as usize;
            self.buf[dst..dst + src.len()].copy_from_slice(src);
        }
        self.at = end;
    }
    fn done(&self) -> bool {
        self.at >= self.lpo + self.buf.len() as u64
    }
}

impl<P: Provider, K: Clock, const Q: usize, const D: usize> Target<'_, '_, P, K, Q, D> {
    /// Puts ANA group `grpid` of subsystem `subsystem` in `state` (optimized,
    /// non-optimized or inaccessible) and announces the change: the log's change counts go
    /// up, and each controller of the subsystem whose host enabled ANA change notices
    /// (Asynchronous Event Configuration bit 11) gets one, on an asynchronous event request
    /// it holds or on the next it sends, unless one is already unread (the host has not read
    /// the ANA log since). Returns how many controllers were told or will be. Setting the
    /// state a group already has changes nothing and tells nobody. Core 0 of poll groups
    /// passes the state on to each group, whose queues then serve or refuse I/O by it (a
    /// group whose message ring is full at that moment keeps the state it had).
    ///
    /// # Errors
    ///
    /// [`TargetError::Config`] for a subsystem or group out of range, or a state the target
    /// does not report.
    pub fn set_ana_state(
        &mut self,
        subsystem: usize,
        grpid: u32,
        state: AnaState,
    ) -> Result<usize, TargetError> {
        let g = group(grpid).ok_or(TargetError::Config("anagrpid"))?;
        if !reported(state) {
            return Err(TargetError::Config("ana state"));
        }
        let mp = &mut self
            .subsystems
            .get_mut(subsystem)
            .ok_or(TargetError::Config("subsystem"))?
            .multipath;
        if mp.states[g] == state || !mp.apply(grpid, state) {
            return Ok(0);
        }
        if let super::group::Role::Core0(links) = self.role.0 {
            for l in links {
                let _ = l.send_to_group(super::group::ToGroup::Ana {
                    subsystem,
                    grpid,
                    state,
                });
            }
        }
        let mut told = 0;
        for c in 0..Q {
            let Some(x) = self.ctrls[c].as_mut() else {
                continue;
            };
            if x.which != Which::Nvm(subsystem) || x.aec & ana::AEN_ANA_CHANGE == 0 {
                continue;
            }
            told += 1;
            if !x.ana_masked {
                x.ana_pending = true;
                self.deliver_aen(c);
            }
        }
        Ok(told)
    }

    /// The state of ANA group `grpid` of subsystem `subsystem`.
    pub fn ana_state(&self, subsystem: usize, grpid: u32) -> Option<AnaState> {
        self.subsystems.get(subsystem)?.multipath.state(grpid)
    }

    /// Answers one asynchronous event request controller `c` holds with its pending ANA
    /// change notice, if it has both; the notice is then masked until its host reads the
    /// ANA log.
    pub(super) fn deliver_aen(&mut self, c: usize) {
        let Some(x) = self.ctrls[c].as_ref() else {
            return;
        };
        if !x.ana_pending || x.aers == 0 {
            return;
        }
        let Some(q) = (0..self.span.min(Q)).find(|&q| {
            self.queues[q].in_use() && self.queues[q].qid == 0 && self.queues[q].ctrl == Some(c)
        }) else {
            return;
        };
        let Some(slot) = (0..self.queues[q].depth)
            .find(|&s| matches!(self.queues[q].cmds.get(usize::from(s)), Some(Cmd::Held)))
        else {
            return;
        };
        if let Some(x) = self.ctrls[c].as_mut() {
            x.aers -= 1;
            x.ana_pending = false;
            x.ana_masked = true;
        }
        let sqe = Sqe::parse(self.queues[q].capsule_bytes(slot, SQE_LEN as u32));
        let cid = sqe.map_or(0, |s| s.cid());
        self.queues[q].cmds[usize::from(slot)] = Cmd::Idle;
        self.finish(
            q,
            slot,
            (cid, sqe.as_ref()),
            Ok(u64::from(ana::AEN_RESULT)),
            None,
            None,
        );
    }
}

/// Identify Namespace's ANA group of `nsid` (0 where `nsid` is out of range).
pub(super) fn anagrpid(sub: &Subsystem<'_>, nsid: u32) -> u32 {
    ns_index(nsid, sub.namespaces.len() as u32).map_or(0, |_| sub.multipath.ns(nsid).anagrpid)
}

/// The discovery log page from byte `lpo`: the header, then one entry per subsystem this
/// host may connect to, at this target's port, then the same at each peer's.
pub(super) fn discovery_log(cx: &mut Cx<'_, '_>, lpo: u64, buf: &mut [u8]) -> Result<u64, Status> {
    let host = cx.ctrl.hostnqn;
    let visible = || cx.subsystems.iter().filter(|s| s.allows(host.as_str()));
    let own = Peer {
        addr: cx.ip,
        port: cx.cfg.port,
        port_id: cx.cfg.port_id,
    };
    let ports = || core::iter::once(own).chain(cx.cfg.peers.iter().flatten().copied());
    let nsubs = visible().count() as u64;
    let numrec = nsubs * ports().count() as u64;
    let total = (numrec + 1) * discovery::RECORD as u64;
    if lpo > total {
        return Err(Status::INVALID_FIELD);
    }
    let mut rec = [0u8; discovery::RECORD];
    for k in 0..=numrec {
        let start = k * discovery::RECORD as u64;
        let end = start + discovery::RECORD as u64;
        let want_end = lpo + buf.len() as u64;
        if end <= lpo || start >= want_end {
            continue;
        }
        if k == 0 {
            // The generation counter: the subsystems are fixed for a target's life.
            discovery::write_header(&mut rec, 1, numrec);
        } else if let Some(s) = visible().nth(((k - 1) % nsubs) as usize)
            && let Some(p) = ports().nth(((k - 1) / nsubs) as usize)
        {
            discovery::Entry {
                subtype: 2,
                portid: p.port_id,
                cntlid: CNTLID_DYNAMIC,
                asqsz: ADMIN_DEPTH,
                trsvcid: p.port,
                subnqn: s.nqn.as_bytes(),
                traddr: p.addr,
            }
            .write(&mut rec);
        }
        let from = lpo.max(start);
        let to = want_end.min(end);
        let src = &rec[(from - start) as usize..(to - start) as usize];
        let dst = (from - lpo) as usize;
        buf[dst..dst + src.len()].copy_from_slice(src);
    }
    Ok(0)
}
