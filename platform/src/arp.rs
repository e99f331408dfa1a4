//! The link self-test: resolve one IPv4 address with ARP over a [`Link`], with the frames of
//! the software RoCE device's wire module (RFC 826, Ethernet/IPv4 only).

use bareverbs::device::rxe::wire::eth::{Arp, ArpOp, ETH_LEN, ETHERTYPE_ARP, EthHeader};
use bareverbs::hal::{Link, LinkError};

/// How the probe ended without an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArpFailure {
    /// The request could not be sent.
    Transmit(LinkError),
    /// No reply before the caller's clock ran out.
    Timeout,
}

impl core::fmt::Display for ArpFailure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ArpFailure::Transmit(e) => write!(f, "ARP request not sent: {e:?}"),
            ArpFailure::Timeout => write!(f, "no ARP reply"),
        }
    }
}

/// What a probe saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArpReply {
    /// The target's MAC.
    pub mac: [u8; 6],
    /// Frames received while waiting (the reply included).
    pub frames_in: u32,
    /// Frames sent (the requests).
    pub frames_out: u32,
}

/// The broadcast ARP request ("who has `target`? tell `ip`") from `mac`, padded to 60 bytes.
pub fn request(mac: [u8; 6], ip: [u8; 4], target: [u8; 4]) -> [u8; 60] {
    Arp {
        op: ArpOp::Request,
        sender_mac: mac,
        sender_ip: ip,
        target_mac: [0; 6],
        target_ip: target,
    }
    .frame(mac)
}

/// The sender MAC of `frame` if it is an ARP reply from `target` to `ip`.
pub fn parse_reply(frame: &[u8], ip: [u8; 4], target: [u8; 4]) -> Option<[u8; 6]> {
    let eth = EthHeader::parse(frame).ok()?;
    let a = Arp::parse(frame.get(ETH_LEN..)?).ok()?;
    (eth.ethertype == ETHERTYPE_ARP
        && a.op == ArpOp::Reply
        && a.sender_ip == target
        && a.target_ip == ip)
        .then_some(a.sender_mac)
}

/// Asks who has `target` (as `ip`) and waits for the answer: `tick` is called between polls
/// that found nothing (the caller waits there) and returns `false` once time is up. The
/// request is sent again every `resend` ticks.
pub fn probe<L: Link>(
    link: &mut L,
    ip: [u8; 4],
    target: [u8; 4],
    resend: u32,
    mut tick: impl FnMut() -> bool,
) -> Result<ArpReply, ArpFailure> {
    let frame = request(link.mac(), ip, target);
    let mut buf = [0u8; 1514];
    let (mut frames_in, mut frames_out, mut ticks) = (0, 0, 0u32);
    loop {
        if ticks.is_multiple_of(resend.max(1)) {
            match link.transmit(&frame) {
                Ok(()) => frames_out += 1,
                // All slots in flight: the next round retries.
                Err(LinkError::Busy) => {}
                Err(e) => return Err(ArpFailure::Transmit(e)),
            }
        }
        while let Some(n) = link.receive(&mut buf) {
            frames_in += 1;
            if let Some(mac) = parse_reply(&buf[..n], ip, target) {
                return Ok(ArpReply {
                    mac,
                    frames_in,
                    frames_out,
                });
            }
        }
        if !tick() {
            return Err(ArpFailure::Timeout);
        }
        ticks += 1;
    }
}

/// A MAC address as `aa:bb:cc:dd:ee:ff`.
pub struct DisplayMac(pub [u8; 6]);

impl core::fmt::Display for DisplayMac {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::collections::VecDeque;
    use std::vec::Vec;

    const ME: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
    const GW: [u8; 6] = [0x52, 0x55, 10, 0, 2, 2];
    const IP: [u8; 4] = [10, 0, 2, 15];
    const GW_IP: [u8; 4] = [10, 0, 2, 2];

    /// A wire with a gateway on it that (if `answer`) replies to requests for its address,
    /// behind one unrelated frame per frame sent.
    struct Wire {
        sent: Vec<Vec<u8>>,
        inbox: VecDeque<Vec<u8>>,
        answer: bool,
    }

    impl Link for Wire {
        fn mac(&self) -> [u8; 6] {
            ME
        }
        fn max_frame(&self) -> usize {
            1514
        }
        fn transmit(&mut self, frame: &[u8]) -> Result<(), LinkError> {
            self.sent.push(frame.to_vec());
            // Unrelated traffic first, then (if it answers) the reply.
            self.inbox.push_back(std::vec![0xAB; 60]);
            if self.answer && frame[12..14] == [8, 6] && frame[38..42] == GW_IP {
                let mut r = request(GW, GW_IP, IP).to_vec();
                r[0..6].copy_from_slice(&frame[6..12]);
                r[21] = 2;
                r[32..38].copy_from_slice(&frame[22..28]);
                self.inbox.push_back(r);
            }
            Ok(())
        }
        fn receive(&mut self, buf: &mut [u8]) -> Option<usize> {
            let f = self.inbox.pop_front()?;
            buf[..f.len()].copy_from_slice(&f);
            Some(f.len())
        }
    }

    #[test]
    fn request_bytes() {
        let f = request(ME, IP, GW_IP);
        let want: [u8; 42] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0, 0x12, 0x34, 0x56, 8, 6, //
            0, 1, 8, 0, 6, 4, 0, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x56, 10, 0, 2, 15, //
            0, 0, 0, 0, 0, 0, 10, 0, 2, 2,
        ];
        assert_eq!(f[..42], want);
        assert!(
            f[42..].iter().all(|&b| b == 0),
            "padded with zeros to 60 bytes"
        );
        assert_eq!(parse_reply(&f, IP, GW_IP), None, "a request is not a reply");
    }

    #[test]
    fn probe_finds_the_gateway_among_other_frames() {
        let mut w = Wire {
            sent: Vec::new(),
            inbox: VecDeque::new(),
            answer: true,
        };
        let r = probe(&mut w, IP, GW_IP, 10, || true).unwrap();
        assert_eq!(r.mac, GW);
        assert_eq!((r.frames_in, r.frames_out), (2, 1));
        assert_eq!(w.sent.len(), 1);
    }

    #[test]
    fn probe_resends_then_times_out() {
        let mut w = Wire {
            sent: Vec::new(),
            inbox: VecDeque::new(),
            answer: false,
        };
        let mut left = 25;
        let r = probe(&mut w, IP, GW_IP, 10, || {
            left -= 1;
            left > 0
        });
        assert_eq!(r, Err(ArpFailure::Timeout));
        // Sent at ticks 0, 10 and 20.
        assert_eq!(w.sent.len(), 3);
    }
}
