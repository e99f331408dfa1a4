//! The words for serving a namespace from several appliances at once (`docs/appliance.md`,
//! "Two appliances, one namespace"): this appliance's controller ID range and port ID, its
//! peers for the discovery log, each namespace's identity and ANA group, each group's
//! state.

use bareverbs_nvmf::target::{ANA_GROUPS, MAX_PEERS, NsIds, Peer};
use bareverbs_nvmf::wire::ana::AnaState;

use super::{DEFAULT_PORT, MAX_NAMESPACES, Problem, Reader, ipv4};

/// The appliance's own multipath settings (its controller IDs, its port ID, its peers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Multipath {
    /// `bvnvmf.cntlid=MIN-MAX`: the controller IDs it hands out.
    pub cntlid: (u16, u16),
    /// `bvnvmf.portid=N`: its port ID in the discovery log.
    pub port_id: u16,
    /// `bvnvmf.peer=…`: the other appliances its discovery log lists.
    pub peers: [Option<Peer>; MAX_PEERS],
}

impl Default for Multipath {
    fn default() -> Self {
        Multipath {
            cntlid: (1, CNTLID_MAX),
            port_id: 1,
            peers: [None; MAX_PEERS],
        }
    }
}

/// A subsystem's namespace identities and ANA group states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shared {
    /// Namespace `k + 1`'s identity and group (`bvnvmf.nguid=`, `.eui64=`, `.uuid=`,
    /// `.anagrp=` after its `bvnvmf.ns=`).
    pub ids: [NsIds; MAX_NAMESPACES],
    /// Group `g`'s state at `ana[g - 1]` (`bvnvmf.ana=G:STATE`; optimized unless given).
    pub ana: [AnaState; ANA_GROUPS as usize],
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            ids: [NsIds::default(); MAX_NAMESPACES],
            ana: [AnaState::Optimized; ANA_GROUPS as usize],
        }
    }
}

/// The highest controller ID there is.
pub const CNTLID_MAX: u16 = 0xFFEF;

/// `n` hex digits as bytes (`None` for another length or a non-hex digit).
fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; N];
    for (k, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * k..2 * k + 2], 16).ok()?;
    }
    Some(out)
}

/// A UUID as 8-4-4-4-12 hex digits.
fn uuid(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != 36 || [8, 13, 18, 23].iter().any(|&k| b[k] != b'-') {
        return None;
    }
    let mut digits = [0u8; 32];
    let mut n = 0;
    for &c in b.iter().filter(|&&c| c != b'-') {
        *digits.get_mut(n)? = c;
        n += 1;
    }
    hex::<16>(core::str::from_utf8(&digits[..n]).ok()?)
}

/// A decimal number of at most `max` (digits only).
fn number(s: &str, max: u32) -> Option<u32> {
    (!s.is_empty() && s.len() <= 10 && s.bytes().all(|c| c.is_ascii_digit()))
        .then(|| s.parse::<u32>().ok())
        .flatten()
        .filter(|&v| v <= max)
}

impl Reader<'_> {
    /// A multipath word (`key`=`value`), or `None` when `key` is not one.
    pub(super) fn multipath_word(&mut self, key: &str, value: &str) -> Option<Result<(), Problem>> {
        Some(match key {
            "bvnvmf.cntlid" => self.cntlid(value),
            "bvnvmf.portid" => {
                if self.port_id_set {
                    return Some(Err(Problem::Repeated));
                }
                self.port_id_set = true;
                number(value, u32::from(u16::MAX))
                    .map(|v| self.mp.port_id = v as u16)
                    .ok_or(Problem::BadNumber)
            }
            "bvnvmf.peer" => self.peer(value),
            "bvnvmf.nguid" => self.ns_id(|ids| {
                let v = hex::<16>(value).ok_or(Problem::BadIdentifier)?;
                ids.nguid
                    .replace(v)
                    .map_or(Ok(()), |_| Err(Problem::Repeated))
            }),
            "bvnvmf.eui64" => self.ns_id(|ids| {
                let v = hex::<8>(value).ok_or(Problem::BadIdentifier)?;
                ids.eui64
                    .replace(v)
                    .map_or(Ok(()), |_| Err(Problem::Repeated))
            }),
            "bvnvmf.uuid" => self.ns_id(|ids| {
                let v = uuid(value).ok_or(Problem::BadIdentifier)?;
                ids.uuid
                    .replace(v)
                    .map_or(Ok(()), |_| Err(Problem::Repeated))
            }),
            "bvnvmf.anagrp" => self.anagrp(value),
            "bvnvmf.ana" => self.ana(value),
            _ => return None,
        })
    }

    fn cntlid(&mut self, value: &str) -> Result<(), Problem> {
        if self.cntlid_set {
            return Err(Problem::Repeated);
        }
        self.cntlid_set = true;
        let (lo, hi) = value.split_once('-').ok_or(Problem::BadCntlidRange)?;
        let max = u32::from(CNTLID_MAX);
        match (number(lo, max), number(hi, max)) {
            (Some(lo), Some(hi)) if lo >= 1 && lo <= hi => {
                self.mp.cntlid = (lo as u16, hi as u16);
                Ok(())
            }
            _ => Err(Problem::BadCntlidRange),
        }
    }

    /// `A.B.C.D[:PORT[:PORTID]]`: port 4420 and port ID 2 + its place among the peers unless
    /// given.
    fn peer(&mut self, value: &str) -> Result<(), Problem> {
        let mut parts = value.split(':');
        let addr = ipv4(parts.next().unwrap_or("")).ok_or(Problem::BadAddress)?;
        let port = match parts.next() {
            Some(p) => number(p, u32::from(u16::MAX))
                .filter(|&p| p != 0)
                .ok_or(Problem::BadPort)? as u16,
            None => DEFAULT_PORT,
        };
        let k = self.mp.peers.iter().flatten().count();
        let port_id = match parts.next() {
            Some(p) => number(p, u32::from(u16::MAX)).ok_or(Problem::BadNumber)? as u16,
            None => 2 + k as u16,
        };
        if parts.next().is_some() {
            return Err(Problem::BadAddress);
        }
        if self
            .mp
            .peers
            .iter()
            .flatten()
            .any(|p| p.addr == addr && p.port == port)
        {
            return Err(Problem::Repeated);
        }
        let slot = self.mp.peers.get_mut(k).ok_or(Problem::TooManyPeers)?;
        *slot = Some(Peer {
            addr,
            port,
            port_id,
        });
        Ok(())
    }

    /// Applies `f` to the identity of the namespace declared last (in the subsystem open).
    fn ns_id(&mut self, f: impl FnOnce(&mut NsIds) -> Result<(), Problem>) -> Result<(), Problem> {
        let s = self
            .subsystems
            .last_mut()
            .ok_or(Problem::IdentityOutsideNamespace)?;
        let k = s
            .namespaces
            .len()
            .checked_sub(1)
            .ok_or(Problem::IdentityOutsideNamespace)?;
        f(&mut s.shared.ids[k])?;
        // Two namespaces of this appliance with one identifier would be one to a host.
        let ids = s.shared.ids[k];
        let same = |a: &NsIds| {
            (ids.nguid.is_some() && a.nguid == ids.nguid)
                || (ids.eui64.is_some() && a.eui64 == ids.eui64)
                || (ids.uuid.is_some() && a.uuid == ids.uuid)
        };
        let n = self.subsystems.len();
        let clash = self.subsystems.iter().enumerate().any(|(j, s)| {
            let upto = if j + 1 == n { k } else { s.namespaces.len() };
            s.shared.ids[..upto].iter().any(same)
        });
        if clash {
            return Err(Problem::DuplicateIdentifier);
        }
        Ok(())
    }

    fn anagrp(&mut self, value: &str) -> Result<(), Problem> {
        let g = number(value, ANA_GROUPS)
            .filter(|&g| g >= 1)
            .ok_or(Problem::BadGroup)?;
        let (sub, ns) = (
            self.subsystems.len().wrapping_sub(1),
            self.subsystems
                .last()
                .map_or(0, |s| s.namespaces.len())
                .wrapping_sub(1),
        );
        let bit = 1u64 << ((sub * MAX_NAMESPACES + ns) % 64);
        let fresh = self.groups_set & bit == 0;
        self.ns_id(|ids| {
            if !fresh {
                return Err(Problem::Repeated);
            }
            ids.anagrpid = g;
            Ok(())
        })?;
        self.groups_set |= bit;
        Ok(())
    }

    /// `G:STATE` for the subsystem open.
    fn ana(&mut self, value: &str) -> Result<(), Problem> {
        let (g, state) = value.split_once(':').ok_or(Problem::BadAnaState)?;
        let g = number(g, ANA_GROUPS)
            .filter(|&g| g >= 1)
            .ok_or(Problem::BadGroup)?;
        let state = AnaState::from_name(state)
            .filter(|s| {
                matches!(
                    s,
                    AnaState::Optimized | AnaState::NonOptimized | AnaState::Inaccessible
                )
            })
            .ok_or(Problem::BadAnaState)?;
        let s = self
            .subsystems
            .last_mut()
            .ok_or(Problem::AnaOutsideSubsystem)?;
        s.shared.ana[(g - 1) as usize] = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
