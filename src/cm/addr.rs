//! The CM's addresses: an IPv4 or an IPv6 address, kept as the RoCEv2 GID it is on the wire
//! (`::ffff:a.b.c.d` for IPv4), so that one comparison matches a message to its peer in
//! either family.

use crate::verbs::Gid;

/// A peer's (or this side's) IP address, IPv4 or IPv6. Made from an IPv4 address
/// (`[u8; 4]`), an IPv6 address (`[u8; 16]`) or a GID; an IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`) is the IPv4 address, as RoCEv2 carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmAddr(Gid);

impl CmAddr {
    /// The unspecified address (IPv4 `0.0.0.0`).
    pub const UNSPECIFIED: CmAddr =
        CmAddr(Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0, 0, 0]));

    /// The GID that stands for this address on the wire (a REQ's GIDs, an address vector's
    /// destination).
    pub fn gid(&self) -> Gid {
        self.0
    }

    /// The IPv4 address, or `None` for an IPv6 one.
    pub fn ipv4(&self) -> Option<[u8; 4]> {
        self.0.ipv4()
    }

    /// The IPv6 address, or `None` for an IPv4 one.
    pub fn ipv6(&self) -> Option<[u8; 16]> {
        self.0.ipv4().is_none().then_some(self.0.0)
    }

    /// Whether this is an IPv6 address (not IPv4-mapped).
    pub fn is_ipv6(&self) -> bool {
        self.0.ipv4().is_none()
    }

    /// The IPv4 address, or `0.0.0.0` for an IPv6 one (the IPv4-only fields of
    /// [`ConnectRequest`](super::ConnectRequest) and [`SidrRequest`](super::SidrRequest)).
    pub(super) fn ipv4_or_zero(&self) -> [u8; 4] {
        self.0.ipv4().unwrap_or([0; 4])
    }
}

impl From<[u8; 4]> for CmAddr {
    fn from(ip: [u8; 4]) -> Self {
        CmAddr(Gid::from_ipv4(ip))
    }
}

impl From<[u8; 16]> for CmAddr {
    fn from(ip: [u8; 16]) -> Self {
        CmAddr(Gid(ip))
    }
}

impl From<Gid> for CmAddr {
    fn from(gid: Gid) -> Self {
        CmAddr(gid)
    }
}

impl PartialEq<[u8; 4]> for CmAddr {
    fn eq(&self, other: &[u8; 4]) -> bool {
        self.0.ipv4() == Some(*other)
    }
}

impl PartialEq<[u8; 16]> for CmAddr {
    fn eq(&self, other: &[u8; 16]) -> bool {
        self.0.0 == *other
    }
}

/// Dotted IPv4, or IPv6 as eight groups of hexadecimal digits (the longest run of zero
/// groups, two or more, written `::`).
impl core::fmt::Display for CmAddr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if let Some([a, b, c, d]) = self.ipv4() {
            return write!(f, "{a}.{b}.{c}.{d}");
        }
        let g = self.0.0;
        let w: [u16; 8] = core::array::from_fn(|i| u16::from_be_bytes([g[2 * i], g[2 * i + 1]]));
        // The longest run of zero groups (the first of equal ones), if two or longer.
        let (mut best, mut run) = ((0, 0), (0, 0));
        for (i, &x) in w.iter().enumerate() {
            run = if x == 0 {
                (run.0, run.1 + 1)
            } else {
                (i + 1, 0)
            };
            if run.1 > best.1 {
                best = run;
            }
        }
        let mut i = 0;
        while i < 8 {
            if best.1 >= 2 && i == best.0 {
                f.write_str(if i == 0 { "::" } else { ":" })?;
                i += best.1;
                continue;
            }
            write!(f, "{:x}", w[i])?;
            if i < 7 {
                f.write_str(":")?;
            }
            i += 1;
        }
        Ok(())
    }
}
