//! Refusing a case the peer does not run, so that both sides go on to the next case together.
//!
//! The Linux programs that exchange their connection data over TCP (the pingpong programs,
//! perftest without `-R`) meet the unikernel on [`super::PORT`]. When the unikernel cannot run
//! a case (a program it does not speak, options it does not take), it still ends the Linux
//! side's attempt at once, instead of leaving it to its timeout while the unikernel's next
//! case takes the port:
//!
//! - the Linux program connects (the unikernel would have served): the unikernel accepts the
//!   connection and resets it; the program's first read fails and it exits. Until no new
//!   connection came for `quiet_ms`, it accepts and resets any further one too: a program
//!   run again (the lab runs a client again while its server does not listen yet) must not
//!   find the next case's listener;
//! - the Linux program listens: the unikernel connects (retrying while the program is not
//!   listening yet) and resets the connection; the program's read fails likewise.
//!
//! Nothing is read from a connection refused.

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

/// Ends the Linux program's attempt: connections accepted and reset (until none came for
/// `quiet_ms`), or one made and reset. Returns how many were reset; [`Error::Timeout`] when
/// the Linux side did not show up by `deadline`, [`Error::Refused`] when it never listened
/// (nothing is left open either way).
pub fn refuse<L: Link>(
    stack: &mut Stack<'_, L>,
    side: LinuxSide,
    linux: [u8; 4],
    retry: Retry,
    quiet_ms: u64,
    deadline: u64,
    now: &mut dyn FnMut() -> u64,
) -> Result<u32, Error> {
    let reset = |stack: &mut Stack<'_, L>, now: &mut dyn FnMut() -> u64| {
        stack.abort();
        let t = now();
        stack.poll(t);
    };
    let r = match side {
        LinuxSide::Connects => stack.accept(PORT, deadline, now).map(|_| ()),
        LinuxSide::Listens => stack.connect(linux, PORT, retry, deadline, now),
    };
    reset(stack, now);
    r?;
    let mut n = 1;
    if side == LinuxSide::Connects {
        loop {
            let until = now().saturating_add(quiet_ms).min(deadline);
            let again = stack.accept(PORT, until, now);
            reset(stack, now);
            match again {
                Ok(_) => n += 1,
                Err(_) => break,
            }
        }
    }
    Ok(n)
}
