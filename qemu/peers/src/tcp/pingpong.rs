//! The exchange of `ibv_rc_pingpong` and `ibv_ud_pingpong` (rdma-core 44.0,
//! `libibverbs/examples/rc_pingpong.c`, `ud_pingpong.c`, `pingpong.c`): the same message and
//! order for both programs (`docs/roce-v2.md` §10.1, §10.4).
//!
//! The message is 52 bytes: `sprintf("%04x:%06x:%06x:%s")` of LID (0 on RoCE), QPN, PSN and
//! the GID as 32 lower-case hex digits (its 16 bytes in network order), plus the NUL:
//! `0000:000011:3fa2c1:00000000000000000000ffff0a000002\0`.
//!
//! | # | client (connects) | server (accepts one) |
//! |---|---|---|
//! | 1 | writes its 52 B | one `read()` must return exactly 52 B |
//! | 2 | — | QP (rc: INIT → RTR → RTS; ud: RTR, RTS, address handle) **before replying** |
//! | 3 | one `read()` must return exactly 52 B | writes its 52 B |
//! | 4 | writes `done` + NUL (5 B), closes; only then connects its QP | one `read()` must return exactly 5 B; closes |
//!
//! The unikernel sends every message in one segment, so each of the C program's single
//! reads gets all of it; it reads the peer's messages whole however they arrive. The Linux
//! side needs `-g <index of its IPv4-mapped GID>` (without it it sends a zero GID and cannot
//! reach a RoCE peer); the other options (`-s`, `-n`, `-m`, `-r`) are never exchanged and must
//! match what the unikernel runs. The C client does not retry its connect: start the Linux
//! client after [`Stack::listen`](super::Stack::listen).

use bareverbs::verbs::Gid;
use bareverbs_hal::Link;

use super::stack::{Retry, Stack};
use super::{Error, Field, FlowError, field, put_hex};

/// Bytes of the message, NUL included.
pub const MSG_LEN: usize = 52;
/// The client's last message.
pub const DONE: &[u8; 5] = b"done\0";

/// One side's connection data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial send PSN (24 bits).
    pub psn: u32,
    /// GID, bytes in network order.
    pub gid: Gid,
}

impl Dest {
    /// The 52-byte message. [`Error::Malformed`] for a QPN or PSN above 24 bits (the C
    /// format would widen the field and break the layout).
    pub fn encode(&self) -> Result<[u8; MSG_LEN], Error> {
        if self.qpn > 0xFF_FFFF {
            return Err(Error::Malformed(Field::Qpn));
        }
        if self.psn > 0xFF_FFFF {
            return Err(Error::Malformed(Field::Psn));
        }
        let mut m = [0u8; MSG_LEN];
        put_hex(&mut m[0..4], self.lid.into());
        m[4] = b':';
        put_hex(&mut m[5..11], self.qpn.into());
        m[11] = b':';
        put_hex(&mut m[12..18], self.psn.into());
        m[18] = b':';
        for (i, b) in self.gid.0.iter().enumerate() {
            put_hex(&mut m[19 + 2 * i..21 + 2 * i], (*b).into());
        }
        Ok(m)
    }

    /// Parses a 52-byte message (hex digits in either case, as the C `sscanf` accepts).
    pub fn parse(m: &[u8]) -> Result<Dest, Error> {
        if m.len() != MSG_LEN {
            return Err(Error::Malformed(Field::Length));
        }
        if m[MSG_LEN - 1] != 0 {
            return Err(Error::Malformed(Field::Terminator));
        }
        let lid = field(m, 0, 4, true, Field::Lid)? as u16;
        let qpn = field(m, 5, 6, true, Field::Qpn)? as u32;
        let psn = field(m, 12, 6, true, Field::Psn)? as u32;
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = field(m, 19 + 2 * i, 2, false, Field::Gid)? as u8;
        }
        Ok(Dest {
            lid,
            qpn,
            psn,
            gid: Gid(gid),
        })
    }
}

/// The unikernel as the server (the Linux program is the client, `ibv_rc_pingpong -g G
/// 10.0.0.2`): accepts one connection on `port`, reads the client's message, calls
/// `on_peer` with it — connect the QP there: the C client sends its first message as soon
/// as it has the reply — then replies with `local` and reads `done`. Returns the client's
/// data. On any failure the connection is reset; `on_peer`'s error comes back as
/// [`FlowError::Hook`].
pub fn serve<L: Link, E>(
    stack: &mut Stack<'_, L>,
    port: u16,
    local: &Dest,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
    on_peer: impl FnOnce(&Dest) -> Result<(), E>,
) -> Result<Dest, FlowError<E>> {
    // Refused before anything is accepted: a QPN or PSN the message cannot carry.
    local.encode()?;
    let peer = accept_peer(stack, port, deadline, now)?;
    if let Err(e) = on_peer(&peer) {
        reset(stack, now);
        return Err(FlowError::Hook(e));
    }
    reply(stack, local, deadline, now)?;
    Ok(peer)
}

/// The first half of [`serve`], for a caller that connects its QP between the halves:
/// accepts one connection on `port` and reads the client's message. On failure the
/// connection is reset. A caller that gives up before [`reply`] calls [`Stack::abort`].
pub fn accept_peer<L: Link>(
    stack: &mut Stack<'_, L>,
    port: u16,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<Dest, Error> {
    let r = (|| {
        stack.accept(port, deadline, now)?;
        let mut m = [0u8; MSG_LEN];
        stack.read_exact(&mut m, deadline, now)?;
        Dest::parse(&m)
    })();
    if r.is_err() {
        reset(stack, now);
    }
    r
}

/// The second half of [`serve`]: replies with `local`, reads `done`, and closes.
pub fn reply<L: Link>(
    stack: &mut Stack<'_, L>,
    local: &Dest,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<(), Error> {
    let r = (|| {
        stack.write_message(&local.encode()?, deadline, now)?;
        let mut done = [0u8; DONE.len()];
        stack.read_exact(&mut done, deadline, now)?;
        if &done != DONE {
            return Err(Error::Malformed(Field::Done));
        }
        Ok(())
    })();
    finish(stack, r, deadline, now)
}

/// The unikernel as the client (the Linux program serves, `ibv_rc_pingpong -g G`): connects
/// to `server`:`port` (retried per `retry`: the Linux side may start later), sends `local`,
/// reads the server's message, sends `done`, and closes. Returns the server's data: connect
/// the QP with it afterwards (the C server is at RTS before it replies).
pub fn connect<L: Link>(
    stack: &mut Stack<'_, L>,
    server: [u8; 4],
    port: u16,
    retry: Retry,
    local: &Dest,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<Dest, Error> {
    let hello = local.encode()?;
    let r = (|| {
        stack.connect(server, port, retry, deadline, now)?;
        stack.write_message(&hello, deadline, now)?;
        let mut m = [0u8; MSG_LEN];
        stack.read_exact(&mut m, deadline, now)?;
        let peer = Dest::parse(&m)?;
        stack.write_message(DONE, deadline, now)?;
        Ok(peer)
    })();
    finish(stack, r, deadline, now)
}

/// Milliseconds a flow waits at most for the peer's side of the close after its last
/// message (the C programs close at once; their kernel finishes the connection).
pub const LINGER_MS: u64 = 2_000;

/// Ends a flow: after success, a graceful close, bounded by [`LINGER_MS`] (its failure does
/// not undo the exchange: the peer has everything it needs; the connection is reset); after
/// a failure, a reset.
pub(super) fn finish<L: Link, T, X>(
    stack: &mut Stack<'_, L>,
    r: Result<T, X>,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<T, X> {
    if r.is_ok() {
        let linger = now().saturating_add(LINGER_MS).min(deadline);
        let _ = stack.close(linger, now);
    } else {
        reset(stack, now);
    }
    r
}

/// Resets the connection and sends the reset at once.
fn reset<L: Link>(stack: &mut Stack<'_, L>, now: &mut dyn FnMut() -> u64) {
    stack.abort();
    let t = now();
    stack.poll(t);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Dest {
        Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0x3f_a2c1,
            gid: Gid::from_ipv4([10, 0, 2, 16]),
        }
    }

    #[test]
    fn encodes_the_c_layout() {
        let m = sample().encode().unwrap();
        assert_eq!(
            &m[..51],
            b"0000:000011:3fa2c1:00000000000000000000ffff0a000210"
        );
        assert_eq!(m[51], 0);
        assert_eq!(Dest::parse(&m), Ok(sample()));
    }

    #[test]
    fn parses_upper_case() {
        let m = b"00AB:ABCDEF:000001:FE800000000000000000000000000001\0";
        let d = Dest::parse(m).unwrap();
        assert_eq!((d.lid, d.qpn, d.psn), (0xAB, 0xAB_CDEF, 1));
        assert_eq!(d.gid.0[0], 0xFE);
        assert_eq!(d.gid.0[15], 1);
    }

    #[test]
    fn rejects_malformed() {
        let good = sample().encode().unwrap();
        let bad = |f: &dyn Fn(&mut [u8; MSG_LEN])| {
            let mut m = good;
            f(&mut m);
            Dest::parse(&m)
        };
        assert_eq!(
            Dest::parse(&good[..51]),
            Err(Error::Malformed(Field::Length))
        );
        assert_eq!(
            bad(&|m| m[51] = b'0'),
            Err(Error::Malformed(Field::Terminator))
        );
        assert_eq!(
            bad(&|m| m[4] = b'-'),
            Err(Error::Malformed(Field::Separator))
        );
        assert_eq!(bad(&|m| m[2] = b'x'), Err(Error::Malformed(Field::Lid)));
        assert_eq!(bad(&|m| m[7] = b' '), Err(Error::Malformed(Field::Qpn)));
        assert_eq!(bad(&|m| m[17] = b'g'), Err(Error::Malformed(Field::Psn)));
        assert_eq!(bad(&|m| m[50] = 0), Err(Error::Malformed(Field::Gid)));
    }

    #[test]
    fn refuses_to_encode_wide_fields() {
        let mut d = sample();
        d.qpn = 1 << 24;
        assert_eq!(d.encode(), Err(Error::Malformed(Field::Qpn)));
        let mut d = sample();
        d.psn = 1 << 24;
        assert_eq!(d.encode(), Err(Error::Malformed(Field::Psn)));
    }
}
