//! rping (librdmacm-utils' `rping.c`) in both roles: the 16-byte buffer advertisements, the
//! server's RDMA READ and WRITE, the ping text, every byte checked.

use core::fmt::Write;

use bareverbs::cm::CmAddr;
use bareverbs::hal::Clock;
use bareverbs::verbs::*;

use super::{
    CaseError, CmCase, DATA_AT, Done, INFO, RECV_AT, RPING_PORT, SEND_AT, SENTINEL, Session,
    WR_READ, WR_RECV, WR_SEND, WR_WRITE,
};
use crate::{Failure, Step};

impl<'a, P: Provider, C: Clock> Session<'_, 'a, P, C> {
    /// Posts the one receive of 16 bytes.
    fn post_recv(&mut self, qp: &mut QueuePair<'a, P, Rc, Rts>) -> Result<(), Failure> {
        let sge = self.mr.sge(RECV_AT, INFO).at("cm: sge")?;
        // SAFETY: the region outlives the QP (destroyed first in every path of the case), and
        // the CPU reads the receive buffer only after its completion.
        unsafe {
            let mut r = qp.recv_batch();
            r.recv(WR_RECV, &[sge]).at("cm: post receive")?;
            r.finish();
        }
        Ok(())
    }

    /// Sends the 16-byte message `info` (the send buffer is free: the last SEND completed).
    fn send(&mut self, qp: &mut QueuePair<'a, P, Rc, Rts>, info: [u8; 16]) -> Result<(), Failure> {
        let at = SEND_AT as usize;
        self.mr.as_mut_slice()[at..at + 16].copy_from_slice(&info);
        let sge = self.mr.sge(SEND_AT, INFO).at("cm: sge")?;
        // SAFETY: as in `post_recv`; the send buffer is not written again before the SEND's
        // completion is taken.
        unsafe {
            let mut s = qp.send_batch();
            s.send(WR_SEND, SendFlags::SIGNALED, &[sge])
                .at("cm: post SEND")?;
            s.finish();
        }
        Ok(())
    }

    /// Waits for the next 16-byte message, checks its length, and posts the receive again.
    fn receive(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        what: &'static str,
        ping: u32,
    ) -> Result<[u8; 16], CaseError> {
        let w = self.wait(WR_RECV, what)?;
        if w.byte_len != INFO || w.opcode != WcOpcode::Recv || w.flags.contains(WcFlags::WITH_IMM) {
            return Err(CaseError::Bytes {
                what,
                ping,
                at: u32::MAX,
            });
        }
        let mut m = [0u8; 16];
        let at = RECV_AT as usize;
        m.copy_from_slice(&self.mr.as_slice()[at..at + 16]);
        self.post_recv(qp)?;
        Ok(m)
    }

    /// This side's buffer `which` (0 the ping, 1 the sink) as rping advertises it.
    fn info(&self, which: u32, size: u32) -> [u8; 16] {
        let addr = self.mr.addr() + u64::from(DATA_AT + which * size);
        encode_info(addr, self.mr.rkey(), size)
    }

    fn data(&mut self, which: u32, size: u32) -> &mut [u8] {
        let at = (DATA_AT + which * size) as usize;
        &mut self.mr.as_mut_slice()[at..at + size as usize]
    }

    /// The unikernel as rping's client (Linux runs `rping -s`).
    pub(super) fn rping_client(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: CmAddr,
        case: &CmCase,
    ) -> Result<Done, CaseError> {
        let qp = self.qp(pd)?;
        let (mut rts, connect_ms) = self.connect_retrying(qp, linux, RPING_PORT)?;
        let r = self.rping_client_pings(&mut rts, case);
        let mut done = r.map(|(data, messages)| Done {
            count: case.count,
            unit: "pings",
            size: case.size,
            checked: data + u64::from(messages) * u64::from(INFO),
            connect_ms,
            how: super::EVERY_BYTE,
        });
        // rping's disconnect: the QP to ERROR, then the DREQ; the DREP ends it.
        let qp = rts.to_error().at("cm: QP to ERROR")?;
        if let Some(id) = self.id {
            if !self.disconnected
                && let Err(e) = self.cm.disconnect(id)
            {
                done = done.and(Err(CaseError::Cm("disconnect", e)));
            }
            while !self.disconnected && self.now() <= self.deadline {
                let _ = self.cm_event();
            }
            if !self.disconnected {
                done = done.and(Err(CaseError::Deadline("the DREP")));
            }
        }
        self.drain();
        qp.destroy().at("cm: destroy QP")?;
        done
    }

    fn rping_client_pings(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
    ) -> Result<(u64, u32), CaseError> {
        let size = case.size;
        let (mut data, mut messages) = (0u64, 0u32);
        self.post_recv(qp)?;
        for ping in 0..case.count {
            rping_text(ping, self.data(0, size));
            self.data(1, size).fill(SENTINEL);
            // The ping buffer: the server READs it, then says "go ahead".
            let info = self.info(0, size);
            self.send(qp, info)?;
            self.wait(WR_SEND, "the SEND of the ping buffer")?;
            let go = self.receive(qp, "the go-ahead after the READ", ping)?;
            check_go_ahead(&go, ping)?;
            // The sink: the server WRITEs the ping there, then says "go ahead".
            let info = self.info(1, size);
            self.send(qp, info)?;
            self.wait(WR_SEND, "the SEND of the sink")?;
            let go = self.receive(qp, "the go-ahead after the WRITE", ping)?;
            check_go_ahead(&go, ping)?;
            messages += 2;
            let at = (DATA_AT + size) as usize;
            let sink = &self.mr.as_slice()[at..at + size as usize];
            if let Some(at) = first_difference(sink, ping) {
                return Err(CaseError::Bytes {
                    what: "the ping WRITTEN back",
                    ping,
                    at,
                });
            }
            data += u64::from(size);
        }
        Ok((data, messages))
    }

    /// The unikernel as rping's server (Linux runs `rping -c`).
    pub(super) fn rping_server(
        &mut self,
        pd: &'a ProtectionDomain<'a, P>,
        linux: CmAddr,
        case: &CmCase,
    ) -> Result<Done, CaseError> {
        // rping's request: from the Linux side to this port, depths 1/1, retries 7/7, no
        // private data after rdma_cm's header.
        let (mut rts, t_req) = self.accept_checked(pd, linux, RPING_PORT, (7, 7))?;
        let r = self.rping_server_pings(&mut rts, case);
        // The client disconnects after its last ping.
        let r = r.and_then(|(data, messages)| {
            self.wait_disconnected("the client's DREQ")?;
            Ok((data, messages))
        });
        let qp = rts.to_error().at("cm: QP to ERROR")?;
        self.drain();
        qp.destroy().at("cm: destroy QP")?;
        let (data, messages) = r?;
        let up = self.established.ok_or(CaseError::Deadline("the RTU"))?;
        Ok(Done {
            count: case.count,
            unit: "pings",
            size: case.size,
            checked: data + u64::from(messages) * u64::from(INFO),
            connect_ms: up - t_req,
            how: super::EVERY_BYTE,
        })
    }

    fn rping_server_pings(
        &mut self,
        qp: &mut QueuePair<'a, P, Rc, Rts>,
        case: &CmCase,
    ) -> Result<(u64, u32), CaseError> {
        let size = case.size;
        let (mut data, mut messages) = (0u64, 0u32);
        let mut first: [Option<[u8; 16]>; 2] = [None; 2];
        self.post_recv(qp)?;
        for ping in 0..case.count {
            // The client's ping buffer: READ it, check it, "go ahead".
            let m = self.receive(qp, "the client's ping buffer", ping)?;
            let (addr, rkey) = check_info(&m, size, &mut first[0], "the ping buffer", ping)?;
            self.data(0, size).fill(SENTINEL);
            let sge = self.mr.sge(DATA_AT, size).at("cm: sge")?;
            // SAFETY: as in `post_recv`; the CPU leaves the buffer alone until the READ's
            // completion.
            unsafe {
                let mut s = qp.send_batch();
                s.rdma_read(WR_READ, SendFlags::SIGNALED, (addr, rkey), &[sge])
                    .at("cm: post READ")?;
                s.finish();
            }
            self.wait(WR_READ, "the READ")?;
            if let Some(at) = first_difference(self.data(0, size), ping) {
                return Err(CaseError::Bytes {
                    what: "the ping READ",
                    ping,
                    at,
                });
            }
            data += u64::from(size);
            self.send(qp, [0; 16])?;
            self.wait(WR_SEND, "the go-ahead after the READ")?;
            // The client's sink: WRITE the ping there (up to its NUL), "go ahead".
            let m = self.receive(qp, "the client's sink", ping)?;
            let (addr, rkey) = check_info(&m, size, &mut first[1], "the sink", ping)?;
            let len = self
                .data(0, size)
                .iter()
                .position(|&b| b == 0)
                .map_or(size, |n| n as u32 + 1);
            let sge = self.mr.sge(DATA_AT, len).at("cm: sge")?;
            // SAFETY: as above.
            unsafe {
                let mut s = qp.send_batch();
                s.rdma_write(WR_WRITE, SendFlags::SIGNALED, (addr, rkey), &[sge])
                    .at("cm: post WRITE")?;
                s.finish();
            }
            self.wait(WR_WRITE, "the WRITE")?;
            self.send(qp, [0; 16])?;
            // After the last ping the client disconnects as soon as it has this go-ahead:
            // its DREQ may come before the completion here.
            let last = ping + 1 == case.count;
            if !self.wait_unless_disconnected(WR_SEND, "the go-ahead after the WRITE")? && !last {
                return Err(CaseError::Disconnected("the next ping"));
            }
            messages += 2;
        }
        Ok((data, messages))
    }
}

/// `struct rping_rdma_info`: address, rkey, size, big-endian.
pub fn encode_info(addr: u64, rkey: u32, size: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&addr.to_be_bytes());
    m[8..12].copy_from_slice(&rkey.to_be_bytes());
    m[12..].copy_from_slice(&size.to_be_bytes());
    m
}

/// The address and rkey of a buffer the client advertised: its size must be the case's, and
/// the same buffer each ping (rping reuses its two buffers).
fn check_info(
    m: &[u8; 16],
    size: u32,
    first: &mut Option<[u8; 16]>,
    what: &'static str,
    ping: u32,
) -> Result<(u64, u32), CaseError> {
    let addr = u64::from_be_bytes([m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]]);
    let rkey = u32::from_be_bytes([m[8], m[9], m[10], m[11]]);
    let got = u32::from_be_bytes([m[12], m[13], m[14], m[15]]);
    if got != size {
        return Err(CaseError::Bytes { what, ping, at: 12 });
    }
    match first {
        Some(f) if f != m => {
            let at = f.iter().zip(m).position(|(a, b)| a != b).unwrap_or(0);
            Err(CaseError::Bytes {
                what,
                ping,
                at: at as u32,
            })
        }
        _ => {
            *first = Some(*m);
            Ok((addr, rkey))
        }
    }
}

/// rping's server answers with its send buffer, which it never fills: 16 zero bytes.
fn check_go_ahead(m: &[u8; 16], ping: u32) -> Result<(), CaseError> {
    match m.iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(at) => Err(CaseError::Bytes {
            what: "the go-ahead",
            ping,
            at: at as u32,
        }),
    }
}

/// Fills `buf` with rping's ping number `ping`: `rdma-ping-<ping>: `, then letters from
/// `A` + `ping` mod 58 on, cycling through `A`..=`z`, and a NUL in the last byte.
pub fn rping_text(ping: u32, buf: &mut [u8]) {
    let text = Text::new(ping, buf.len());
    for (i, b) in buf.iter_mut().enumerate() {
        *b = text.byte(i);
    }
}

/// The first byte of `got` that differs from ping `ping`'s text.
fn first_difference(got: &[u8], ping: u32) -> Option<u32> {
    let text = Text::new(ping, got.len());
    got.iter()
        .enumerate()
        .position(|(i, &b)| b != text.byte(i))
        .map(|i| i as u32)
}

/// Ping `ping`'s text of `len` bytes, byte by byte (no buffer of its size).
struct Text {
    head: Head,
    start: u32,
    len: usize,
}

impl Text {
    fn new(ping: u32, len: usize) -> Text {
        let mut head = Head {
            buf: [0; 32],
            len: 0,
        };
        let _ = write!(head, "rdma-ping-{ping}: ");
        Text {
            head,
            start: ping % 58,
            len,
        }
    }

    fn byte(&self, i: usize) -> u8 {
        let n = self.head.len.min(self.len.saturating_sub(1));
        if i + 1 == self.len {
            0
        } else if i < n {
            self.head.buf[i]
        } else {
            b'A' + ((self.start as usize + (i - n)) % 58) as u8
        }
    }
}

/// A small text buffer for the ping's head.
struct Head {
    buf: [u8; 32],
    len: usize,
}

impl Write for Head {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(core::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_are_rpings_text() {
        let mut b = [0u8; 32];
        rping_text(0, &mut b);
        assert_eq!(&b, b"rdma-ping-0: ABCDEFGHIJKLMNOPQR\0");
        rping_text(57, &mut b);
        assert_eq!(&b[..16], b"rdma-ping-57: zA");
        assert_eq!(b[31], 0);
        let mut long = [0u8; 80];
        rping_text(1, &mut long);
        // From 'B' to 'z' is 57 letters, then 'A' again.
        assert_eq!(long[13 + 57], b'A');
        assert_eq!(first_difference(&long, 1), None);
        long[40] ^= 1;
        assert_eq!(first_difference(&long, 1), Some(40));
    }

    #[test]
    fn infos_are_big_endian_and_checked() {
        let m = encode_info(0x1122_3344_5566_7788, 0xAABB_CCDD, 64);
        assert_eq!(
            m,
            [
                0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xAA, 0xBB, 0xCC, 0xDD, 0, 0, 0, 64
            ]
        );
        let mut first = None;
        assert_eq!(
            check_info(&m, 64, &mut first, "x", 0),
            Ok((0x1122_3344_5566_7788, 0xAABB_CCDD))
        );
        assert_eq!(
            check_info(&m, 64, &mut first, "x", 1),
            Ok((0x1122_3344_5566_7788, 0xAABB_CCDD))
        );
        let other = encode_info(0x1122_3344_5566_7789, 0xAABB_CCDD, 64);
        assert_eq!(
            check_info(&other, 64, &mut first, "x", 2),
            Err(CaseError::Bytes {
                what: "x",
                ping: 2,
                at: 7
            })
        );
        assert_eq!(
            check_info(&m, 65, &mut None, "x", 0),
            Err(CaseError::Bytes {
                what: "x",
                ping: 0,
                at: 12
            })
        );
        assert!(check_go_ahead(&[0; 16], 0).is_ok());
        let mut g = [0u8; 16];
        g[5] = 1;
        assert!(check_go_ahead(&g, 0).is_err());
    }
}
