//! IPv4 multicast on the segment (`docs/multicast.md`): the group address a RoCEv2 multicast
//! GID stands for, the Ethernet group MAC an IPv4 group maps to (RFC 1112 §6.4), and the two
//! IGMPv2 messages (RFC 2236) the device sends so that a snooping switch forwards a group's
//! frames to it: a membership report when its first queue pair joins the group and a leave
//! when its last one goes.

use super::eth::Mac;
use super::ip::ones_sum;

/// IGMPv2's membership report (RFC 2236 §2.1).
pub const REPORT_V2: u8 = 0x16;
/// IGMPv2's leave group message.
pub const LEAVE: u8 = 0x17;
/// The all-routers group, where a leave goes (RFC 2236 §3).
pub const ALL_ROUTERS: [u8; 4] = [224, 0, 0, 2];
/// The bytes of an IGMP frame as the device sends it: Ethernet (14), IPv4 with the Router
/// Alert option (24), IGMP (8), padded to Ethernet's smallest frame (60 without the FCS).
pub const FRAME_LEN: usize = 60;
/// The IP protocol number of IGMP.
pub const PROTOCOL: u8 = 2;

/// Whether `ip` is an IPv4 multicast (class D, 224.0.0.0/4) address.
pub fn is_multicast(ip: [u8; 4]) -> bool {
    ip[0] >> 4 == 0xE
}

/// The Ethernet group MAC of the IPv4 group `ip`: 01:00:5e and the address's low 23 bits
/// (RFC 1112 §6.4).
pub fn multicast_mac(ip: [u8; 4]) -> Mac {
    [0x01, 0x00, 0x5E, ip[1] & 0x7F, ip[2], ip[3]]
}

/// The IGMPv2 message `kind` ([`REPORT_V2`] or [`LEAVE`]) about `group`, from the station
/// with `mac` and `ip`: a report goes to the group itself, a leave to all routers (each to
/// its group MAC), with TTL 1, the Router Alert option and precedence 6 (TOS 0xC0), as
/// RFC 2236 §2 and Linux send them.
pub fn frame(kind: u8, mac: Mac, ip: [u8; 4], group: [u8; 4]) -> [u8; FRAME_LEN] {
    let dst = if kind == LEAVE { ALL_ROUTERS } else { group };
    let mut f = [0u8; FRAME_LEN];
    f[..6].copy_from_slice(&multicast_mac(dst));
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    {
        let h = &mut f[14..38];
        h[0] = 0x46; // version 4, six words: one of options
        h[1] = 0xC0;
        h[2..4].copy_from_slice(&32u16.to_be_bytes());
        h[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
        h[8] = 1;
        h[9] = PROTOCOL;
        h[12..16].copy_from_slice(&ip);
        h[16..20].copy_from_slice(&dst);
        h[20..24].copy_from_slice(&[0x94, 0x04, 0, 0]); // Router Alert (RFC 2113)
        let sum = !(ones_sum(0, h) as u16);
        h[10..12].copy_from_slice(&sum.to_be_bytes());
    }
    let g = &mut f[38..46];
    g[0] = kind;
    g[4..8].copy_from_slice(&group);
    let sum = !(ones_sum(0, g) as u16);
    g[2..4].copy_from_slice(&sum.to_be_bytes());
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_and_leave_are_well_formed() {
        let mac = [0x52, 0x54, 0, 0, 0, 2];
        let r = frame(REPORT_V2, mac, [10, 0, 0, 2], [239, 129, 2, 3]);
        // To the group's MAC (bit 23 of the address dropped), from ours, IPv4.
        assert_eq!(&r[..6], &[0x01, 0x00, 0x5E, 0x01, 2, 3]);
        assert_eq!(&r[6..12], &mac);
        // Both checksums verify (the one's-complement sum of each part is all ones).
        assert_eq!(ones_sum(0, &r[14..38]), 0xFFFF);
        assert_eq!(ones_sum(0, &r[38..46]), 0xFFFF);
        assert_eq!((r[22], r[23], r[38]), (1, PROTOCOL, REPORT_V2));
        assert_eq!(&r[30..34], &[239, 129, 2, 3]);
        let l = frame(LEAVE, mac, [10, 0, 0, 2], [239, 129, 2, 3]);
        assert_eq!(&l[30..34], &ALL_ROUTERS);
        assert_eq!(&l[..6], &[0x01, 0x00, 0x5E, 0, 0, 2]);
        assert_eq!(&l[42..46], &[239, 129, 2, 3]);
        assert!(is_multicast([224, 0, 0, 1]) && is_multicast([239, 255, 255, 255]));
        assert!(!is_multicast([240, 0, 0, 1]) && !is_multicast([10, 0, 0, 2]));
    }
}
