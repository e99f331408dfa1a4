//! NVM commands on I/O queues: Read, Write, Flush, Write Zeroes.

use super::Subsystem;
use super::admin::ns_index;
use super::ctrl::{Ctrl, Which};
use super::exec::Dir;
use crate::block::{BlockDevice, BlockError};
use crate::wire::{Sqe, Status, fctype, opcode};

fn namespace<'x>(
    ctrl: Option<&Ctrl>,
    subsystems: &'x [Subsystem<'_>],
    nsid: u32,
) -> Result<&'x dyn BlockDevice, Status> {
    let Some(Which::Nvm(k)) = ctrl.map(|c| c.which) else {
        return Err(Status::SEQUENCE_ERROR);
    };
    let sub = subsystems.get(k).ok_or(Status::INTERNAL)?;
    let i = ns_index(nsid, sub.namespaces.len() as u32)?;
    // Through this target the namespace's ANA group may be inaccessible.
    super::ana::io_allowed(sub, nsid)?;
    Ok(&*sub.namespaces[i])
}

/// The blocks of a Read, Write or Write Zeroes, checked against the namespace.
fn range(dev: &dyn BlockDevice, sqe: &Sqe) -> Result<(u64, u32), Status> {
    let (slba, nlb) = (sqe.slba(), sqe.nlb());
    match slba.checked_add(u64::from(nlb)) {
        Some(end) if end <= dev.capacity() => Ok((slba, nlb)),
        _ => Err(Status::LBA_RANGE),
    }
}

/// Which way an I/O command's data goes, after the opcode, namespace and range checks.
pub(super) fn direction(
    sqe: &Sqe,
    ctrl: Option<&Ctrl>,
    subsystems: &[Subsystem<'_>],
) -> Result<Dir, Status> {
    let bytes = |dev: &dyn BlockDevice| -> Result<u32, Status> {
        let (_, nlb) = range(dev, sqe)?;
        u32::try_from(u64::from(nlb) * u64::from(dev.block_size()))
            .map_err(|_| Status::INVALID_FIELD)
    };
    match sqe.opcode() {
        opcode::READ => Ok(Dir::ToHost(bytes(namespace(
            ctrl,
            subsystems,
            sqe.nsid(),
        )?)?)),
        opcode::WRITE => Ok(Dir::FromHost(bytes(namespace(
            ctrl,
            subsystems,
            sqe.nsid(),
        )?)?)),
        opcode::WRITE_ZEROES => {
            range(namespace(ctrl, subsystems, sqe.nsid())?, sqe)?;
            Ok(Dir::None)
        }
        opcode::FLUSH => {
            namespace(ctrl, subsystems, sqe.nsid())?;
            Ok(Dir::None)
        }
        opcode::FABRICS if sqe.fctype() == fctype::CONNECT => Err(Status::SEQUENCE_ERROR),
        _ => Err(Status::INVALID_OPCODE),
    }
}

/// A medium's failure as a status: a read's is an unrecovered read error (the host may
/// retry), a write's or a flush's a write fault with Do Not Retry (what the medium's cache
/// held may be lost: no retry may turn that into a success).
fn media(e: BlockError, writing: bool) -> Status {
    match e {
        BlockError::OutOfRange => Status::LBA_RANGE,
        BlockError::Misaligned => Status::INVALID_FIELD,
        BlockError::Io if writing => Status::WRITE_FAULT,
        BlockError::Io => Status::MEDIA_ERROR,
    }
}

/// Force Unit Access: bit 30 of command dword 12 of a Read, Write or Write Zeroes.
const FUA: u32 = 1 << 30;

/// What an I/O command did to the medium besides moving its data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Done {
    /// Flushes of the medium it made.
    pub flushes: u32,
    /// Bytes the CPU copied between the data buffer and the medium.
    pub copied: u64,
}

/// Runs an I/O command with its data buffer `buf` (checked by [`direction`] before): what
/// it did besides moving the data.
///
/// `buf` is a data buffer of the queue's registered region (or in-capsule data in a
/// receive buffer, also in that region): memory the embedder lent for DMA, handed to the
/// medium by [`BlockDevice::read_dma`] and [`BlockDevice::write_dma`], so that a medium
/// whose controller reaches it moves the data by DMA with no copy.
///
/// Durability: a command is answered only once the device returned (a write is on the
/// medium, or in its cache); a Flush once the device's flush returned; a Write or Write
/// Zeroes with Force Unit Access — or of a controller whose host disabled the volatile write
/// cache — is followed by a flush where the medium has a cache, before its answer; a Read
/// with Force Unit Access flushes first (it then reads from stable media). A failure of any
/// of these is the command's status, never a success.
pub(super) fn run(
    ctrl: &mut Ctrl,
    subsystems: &mut [Subsystem<'_>],
    sqe: &Sqe,
    buf: &mut [u8],
) -> Result<Done, Status> {
    let Which::Nvm(k) = ctrl.which else {
        return Err(Status::SEQUENCE_ERROR);
    };
    let sub = subsystems.get_mut(k).ok_or(Status::INTERNAL)?;
    let i = ns_index(sqe.nsid(), sub.namespaces.len() as u32)?;
    let dev = &mut *sub.namespaces[i];
    let op = sqe.opcode();
    // Whether the command must be on stable media before its answer, and whether that takes
    // a flush of this medium.
    let fua = sqe.cdw(12) & FUA != 0 || (!ctrl.wce && op != opcode::READ);
    let flush = fua && dev.volatile_cache();
    let mut copied = 0;
    match op {
        opcode::READ => {
            let (slba, _) = range(dev, sqe)?;
            if flush {
                dev.flush().map_err(|e| media(e, true))?;
            }
            copied = dev.read_dma(slba, buf).map_err(|e| media(e, false))?;
        }
        opcode::WRITE => {
            let (slba, _) = range(dev, sqe)?;
            copied = dev
                .write_dma(slba, buf, flush)
                .map_err(|e| media(e, true))?;
        }
        opcode::WRITE_ZEROES => {
            let (slba, nlb) = range(dev, sqe)?;
            dev.write_zeroes(slba, u64::from(nlb))
                .map_err(|e| media(e, true))?;
            if flush {
                dev.flush().map_err(|e| media(e, true))?;
            }
        }
        opcode::FLUSH => {
            dev.flush().map_err(|e| media(e, true))?;
            return Ok(Done {
                flushes: 1,
                copied: 0,
            });
        }
        _ => return Err(Status::INVALID_OPCODE),
    }
    Ok(Done {
        flushes: u32::from(flush),
        copied: copied as u64,
    })
}
