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

fn media(e: BlockError) -> Status {
    match e {
        BlockError::OutOfRange => Status::LBA_RANGE,
        BlockError::Misaligned => Status::INVALID_FIELD,
        BlockError::Io => Status::MEDIA_ERROR,
    }
}

/// Runs an I/O command with its data buffer `buf` (checked by [`direction`] before).
pub(super) fn run(
    ctrl: &mut Ctrl,
    subsystems: &mut [Subsystem<'_>],
    sqe: &Sqe,
    buf: &mut [u8],
) -> Result<u64, Status> {
    let Which::Nvm(k) = ctrl.which else {
        return Err(Status::SEQUENCE_ERROR);
    };
    let sub = subsystems.get_mut(k).ok_or(Status::INTERNAL)?;
    let i = ns_index(sqe.nsid(), sub.namespaces.len() as u32)?;
    let dev = &mut *sub.namespaces[i];
    match sqe.opcode() {
        opcode::READ => {
            let (slba, _) = range(dev, sqe)?;
            dev.read(slba, buf).map_err(media)?;
        }
        opcode::WRITE => {
            let (slba, _) = range(dev, sqe)?;
            dev.write(slba, buf).map_err(media)?;
        }
        opcode::WRITE_ZEROES => {
            let (slba, nlb) = range(dev, sqe)?;
            dev.write_zeroes(slba, u64::from(nlb)).map_err(media)?;
        }
        opcode::FLUSH => dev.flush().map_err(media)?,
        _ => return Err(Status::INVALID_OPCODE),
    }
    Ok(0)
}
