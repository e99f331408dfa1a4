//! Refusing a case the peer does not run, so that both sides go on to the next case together.
//!
//! The Linux programs that exchange their connection data over TCP (the pingpong programs,
//! perftest without `-R`) meet the unikernel on [`super::PORT`]. When the unikernel cannot run
//! a case (a program it does not speak, options it does not take), it still ends the Linux
//! side's attempt at once, instead of leaving it to its timeout while the unikernel's next
//! case takes the port:
//!
//! - the Linux program connects (the unikernel would have served): the unikernel accepts the
//!   one connection and resets it; the program's first read fails and it exits;
//! - the Linux program listens: the unikernel connects (retrying while the program is not
//!   listening yet) and resets the connection; the program's read fails likewise.
//!
//! Either way a single connection is taken and reset, and nothing is read from it.

use bareverbs_hal::Link;

use super::stack::{Retry, Stack};
use super::{Error, PORT};

/// Which side of the TCP exchange the Linux program of a refused case takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinuxSide {
    /// It connects to the unikernel.
    Connects,
    /// It listens for the unikernel.
    Listens,
}

/// Ends the Linux program's attempt: one connection, accepted or made, then reset. Returns
/// the Linux side's address; [`Error::Timeout`] when it did not show up by `deadline`
/// (nothing is left open then either).
pub fn refuse<L: Link>(
    stack: &mut Stack<'_, L>,
    side: LinuxSide,
    linux: [u8; 4],
    retry: Retry,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<[u8; 4], Error> {
    let r = match side {
        LinuxSide::Connects => stack.accept(PORT, deadline, now).map(|(ip, _)| ip),
        LinuxSide::Listens => stack
            .connect(linux, PORT, retry, deadline, now)
            .map(|()| linux),
    };
    stack.abort();
    let t = now();
    stack.poll(t);
    r
}
