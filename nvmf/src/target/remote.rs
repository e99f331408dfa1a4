//! Where a command's data lies in the host's memory: one keyed SGL descriptor, or a list of
//! them (a Last Segment descriptor pointing into the command's in-capsule data), and the
//! checks of such a list.

use crate::wire::{Sgl, Status};

/// Descriptors a command may carry at most (Identify Controller's MSDBD when the I/O queues
/// take in-capsule data: the list travels there).
pub const MSDBD: u8 = 4;

/// A command's remote buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Remote {
    /// One keyed descriptor: `(address, key, bytes)`.
    One(u64, u32, u32),
    /// `n` keyed descriptors (checked, 1..=[`MSDBD`]) at byte `at` of the queue's region (in
    /// the command's receive buffer, which the command keeps until its response).
    List { at: u32, n: u8 },
}

/// The pieces of a remote buffer, in order: `(address, key, bytes)`, `.1` of them.
pub(crate) type Pieces = ([(u64, u32, u32); MSDBD as usize], usize);

/// The keyed descriptors of a list in `list` (16 bytes each, at most [`MSDBD`]), as
/// [`Pieces`]; what is not a keyed descriptor of some length ends the list there.
pub(crate) fn pieces(list: &[u8]) -> Pieces {
    let mut out = [(0, 0, 0); MSDBD as usize];
    let mut n = 0;
    for (d, slot) in list.chunks_exact(16).zip(out.iter_mut()) {
        let Some(Ok(Sgl::Keyed { addr, len, key, .. })) =
            <&[u8; 16]>::try_from(d).ok().map(Sgl::parse)
        else {
            break;
        };
        *slot = (addr, key, len);
        n += 1;
    }
    (out, n)
}

/// Checks a Last Segment's list, `list` (the bytes it names in the capsule, already bounded
/// by the capsule), for a command that moves `need` bytes: 1 to [`MSDBD`] whole
/// descriptors (else Invalid Number of SGL Descriptors), each a keyed data block (else SGL
/// Descriptor Type Invalid) of some length (else Data SGL Length Invalid), their lengths
/// adding up to `need` (else the same). Returns how many.
pub(crate) fn check_list(list: &[u8], need: u32) -> Result<u8, Status> {
    let n = list.len() / 16;
    if list.is_empty() || !list.len().is_multiple_of(16) || n > usize::from(MSDBD) {
        return Err(Status::SGL_COUNT_INVALID);
    }
    let mut total = 0u64;
    for d in list.chunks_exact(16) {
        let d: &[u8; 16] = d.try_into().map_err(|_| Status::SGL_COUNT_INVALID)?;
        match Sgl::parse(d) {
            Ok(Sgl::Keyed { len, .. }) => total += u64::from(len),
            Ok(Sgl::Null) => return Err(Status::SGL_LENGTH_INVALID),
            _ => return Err(Status::SGL_TYPE_INVALID),
        }
    }
    if total != u64::from(need) {
        return Err(Status::SGL_LENGTH_INVALID);
    }
    Ok(n as u8)
}
