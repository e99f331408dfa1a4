//! The neighbour tables of the port, one per address family (IPv4 → MAC, IPv6 → MAC):
//! bounded, the least recently learnt entry making room, resolution retried and given up as
//! Linux does (`docs/roce-v2.md` §5).

use super::{ARP_RETRY_US, ARP_TRIES};
use crate::device::rxe::wire::eth::Mac;
use crate::error::{Error, Op, Result};

#[derive(Clone, Copy, Debug)]
pub(super) struct Neighbour<A> {
    ip: A,
    /// `None` while a resolution is under way.
    mac: Option<Mac>,
    /// When it was learnt, or when the last request went out.
    at: u64,
    /// Requests sent without an answer.
    tries: u8,
}

/// One step of the resolution of `ip` in `cache`: `Ok(Some)` known; `Ok(None)` pending (a
/// request sent by `send` if none went out in the last [`ARP_RETRY_US`]); the timeout after
/// [`ARP_TRIES`] unanswered requests. `sent` counts the requests that went out.
pub(super) fn step<A: Copy + PartialEq, const N: usize>(
    cache: &mut [Option<Neighbour<A>>; N],
    ip: A,
    now: u64,
    sent: &mut u64,
    send: impl FnOnce(A) -> bool,
) -> Result<Option<Mac>> {
    let i = match find(cache, ip) {
        Some(i) => i,
        None => make_room(cache, ip, now),
    };
    let Some(n) = cache[i].as_mut() else {
        return Ok(None);
    };
    if let Some(mac) = n.mac {
        return Ok(Some(mac));
    }
    if n.tries > 0 && now.wrapping_sub(n.at) < ARP_RETRY_US {
        return Ok(None);
    }
    if n.tries >= ARP_TRIES {
        cache[i] = None;
        return Err(Error::Timeout {
            op: Op::ResolveAddress,
        });
    }
    if send(ip) {
        n.tries += 1;
        n.at = now;
        *sent += 1;
    }
    Ok(None)
}

pub(super) fn find<A: Copy + PartialEq, const N: usize>(
    cache: &[Option<Neighbour<A>>; N],
    ip: A,
) -> Option<usize> {
    cache.iter().position(|n| n.is_some_and(|n| n.ip == ip))
}

/// A slot for `ip`, pending: a free one, or the least recently learnt.
pub(super) fn make_room<A: Copy + PartialEq, const N: usize>(
    cache: &mut [Option<Neighbour<A>>; N],
    ip: A,
    now: u64,
) -> usize {
    let i = cache.iter().position(Option::is_none).unwrap_or_else(|| {
        (0..N)
            .min_by_key(|&i| cache[i].map_or(0, |n| n.at))
            .unwrap_or(0)
    });
    cache[i] = Some(Neighbour {
        ip,
        mac: None,
        at: now,
        tries: 0,
    });
    i
}

pub(super) fn lookup<A: Copy + PartialEq, const N: usize>(
    cache: &[Option<Neighbour<A>>; N],
    ip: A,
) -> Option<Mac> {
    find(cache, ip).and_then(|i| cache[i]?.mac)
}

/// Records `ip` at `mac`, making room if needed.
pub(super) fn learn<A: Copy + PartialEq, const N: usize>(
    cache: &mut [Option<Neighbour<A>>; N],
    ip: A,
    mac: Mac,
    now: u64,
) {
    let i = match find(cache, ip) {
        Some(i) => i,
        None => make_room(cache, ip, now),
    };
    cache[i] = Some(Neighbour {
        ip,
        mac: Some(mac),
        at: now,
        tries: 0,
    });
}

/// Records `ip` at `mac` if `ip` is known or being resolved.
pub(super) fn refresh<A: Copy + PartialEq, const N: usize>(
    cache: &mut [Option<Neighbour<A>>; N],
    ip: A,
    mac: Mac,
    now: u64,
) {
    if find(cache, ip).is_some() {
        learn(cache, ip, mac, now);
    }
}
