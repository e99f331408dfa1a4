//! The unikernel's GIDs a lab case may connect from, and which one it takes: RoCEv2 over
//! IPv4 from the IPv4-mapped GID, over IPv6 from a global IPv6 one (`docs/roce-v2.md` §5).

use bareverbs::verbs::Gid;

/// The unikernel's GIDs a case may connect from: `v4` its IPv4-mapped one, `v6` a global
/// IPv6 one (when the interface has one), each with its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gids {
    /// The IPv4-mapped GID and its index.
    pub v4: (Gid, u32),
    /// A global IPv6 GID and its index.
    pub v6: Option<(Gid, u32)>,
}

impl Gids {
    /// The GID to connect from: where Linux's GID is known (the unikernel answers: Linux sent
    /// its own first), the same family as Linux's — the IPv6 one for an IPv6 GID, the
    /// IPv4-mapped one for an IPv4-mapped GID; where it is not (the unikernel speaks first),
    /// the IPv6 one if the case asks for IPv6. `None`: the family asked for is not there.
    pub fn pick(&self, case_v6: bool, linux: Option<&Gid>) -> Option<(Gid, u32)> {
        let v6 = match linux {
            Some(g) => !crate::tcp::is_ipv4_mapped(&g.0),
            None => case_v6,
        };
        if v6 { self.v6 } else { Some(self.v4) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_family_of_linux_gid_or_of_the_case() {
        let v4 = (Gid::from_ipv4([10, 0, 0, 2]), 1);
        let mut g6 = [0u8; 16];
        (g6[0], g6[15]) = (0xFD, 2);
        let v6 = (Gid(g6), 2);
        let both = Gids { v4, v6: Some(v6) };
        let only4 = Gids { v4, v6: None };
        let mut linux6 = g6;
        linux6[15] = 1;
        let linux6 = Gid(linux6);
        let linux4 = Gid::from_ipv4([10, 0, 0, 1]);
        // Answering: Linux's family, whatever the case says.
        assert_eq!(both.pick(false, Some(&linux6)), Some(v6));
        assert_eq!(both.pick(true, Some(&linux4)), Some(v4));
        // Speaking first: the case's.
        assert_eq!(both.pick(true, None), Some(v6));
        assert_eq!(both.pick(false, None), Some(v4));
        // No IPv6 address: none.
        assert_eq!(only4.pick(true, None), None);
        assert_eq!(only4.pick(false, Some(&linux6)), None);
        assert_eq!(only4.pick(true, Some(&linux4)), Some(v4));
    }
}
