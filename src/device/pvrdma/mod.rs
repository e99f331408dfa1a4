//! The VMware paravirtual RDMA device (PVRDMA, PCI 15ad:0820), as QEMU 7.2–9.0 emulates it.
//!
//! Every PVRDMA fact of the crate lives in this folder: [`regs`] (registers and doorbells),
//! `abi` (shared-memory layouts), `pdir` (page directories), `cmd` (the command channel),
//! `bringup` (probe, activation, caps), `provider` (the verbs provider), and one file per
//! object (`qp`, `cq` with `cursor`, `srq`, `mr`, `ah`, `wqe`, `ring`, `layout`, `qptable`).
//! Facts and their sources: `docs/pvrdma.md`.
//!
//! Bring-up ([`Pvrdma::new`]) follows the Linux driver's order (L-MAIN `pvrdma_pci_probe`):
//! check the paired vmxnet3 at function 0, size and map BAR1 (registers) and BAR2 (UAR), enable
//! memory decoding and bus mastering, read VERSION, build the shared region (DSR) with the
//! command/response slots and the two notification rings, write DSRLOW then DSRHIGH (the device
//! loads it and writes its capabilities back), validate them, set up MSI-X when asked
//! ([`Config::interrupts`]; `irq`), open or mask interrupts, ACTIVATE, and require ERR = 0.

mod abi;
mod ah;
mod bringup;
mod cmd;
mod cq;
mod cq_resize;
mod cursor;
mod gid;
mod irq;
mod layout;
mod mr;
mod pdir;
mod poll;
mod provider;
mod qp;
mod qp_state;
mod qptable;
pub mod regs;
mod ring;
mod srq;
mod srq_meter;
mod srq_slots;
mod wqe;

pub use ah::Ah;
pub use bringup::find;
pub use cq::Cq;
pub use cursor::Poll;
pub use irq::{VECTOR_ASYNC, VECTOR_COMMAND, VECTOR_CQ, VECTORS};
pub use mr::Mr;
pub use qp::Qp;
pub use ring::WqCursor;
pub use srq::Srq;

use core::sync::atomic::Ordering;

use bareverbs_hal::{Hal, Mmio, PciAddress};

use self::cmd::Channel;
use self::qptable::QpTable;
use crate::dma::Dma;
use crate::error::{Error, Object, Op, Resource, Result};
use crate::verbs::DeviceCaps;

/// Bring-up options.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// How many times a wait for the device (a command's response) polls before it gives up
    /// with [`Error::Timeout`].
    pub poll_limit: u32,
    /// Which send operations the driver posts.
    pub opcodes: Opcodes,
    /// Take interrupts: set up MSI-X with the HAL's messages
    /// ([`Hal::msi_message`]) and unmask the device; the
    /// embedder's handlers call [`Pvrdma::interrupt`]. Off (the default), the driver polls,
    /// and completion channels and futures still work: they take the device's notifications
    /// when they are asked.
    pub interrupts: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            poll_limit: 1 << 22,
            opcodes: Opcodes::SendOnly,
            interrupts: false,
        }
    }
}

/// Which send operations the driver posts (QEMU's PVRDMA executes every send WQE as a plain
/// SEND: the opcode, immediate data and RDMA fields are ignored, §8.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcodes {
    /// Only what QEMU executes faithfully: SEND (and receives). RDMA WRITE/READ and the
    /// immediate-data forms are refused with
    /// [`Feature::NotExecutedByDevice`](crate::error::Feature::NotExecutedByDevice).
    SendOnly,
    /// Every operation the PVRDMA ABI has, written as the ABI says: for a device that executes
    /// them (VMware's), or knowingly on QEMU, where they run as SEND.
    All,
}

impl<H: Hal> Pvrdma<H> {
    /// Whether GID `index` is bound now (lock-free: what the data path checks before a WQE
    /// names it — QEMU loops forever on a send whose GID it cannot map, §8.6, §14).
    #[inline(always)]
    pub(crate) fn gid_in_use(&self, index: u8) -> bool {
        self.gid_bits[usize::from(index / 64)].load(Ordering::Acquire) & (1 << (index % 64)) != 0
    }
}

/// Driver-private memory from the HAL (zeroed pages the device is never told about), freed
/// when dropped.
pub struct PrivateMem<H: Hal>(Dma<H>);

/// The device's own values of the capabilities the driver reports otherwise (the rule of
/// [`Pvrdma::device_caps`]).
#[derive(Clone, Copy, Debug, Default)]
struct RawLimits {
    max_qp_wr: u32,
    max_srq_wr: u32,
    max_cqe: u32,
    gid_tbl_len: u32,
    max_mr_size: u64,
}

/// Most QPs alive at once (the QP table is sized for twice as many).
const MAX_LIVE_QPS: u32 = 1024;

/// Number of CQEs that fit one page (64-byte CQEs).
const CQES_PER_PAGE: u32 = 64;
/// QEMU accepts at most this many pages (ring-state page included) per CQ, QP queue or SRQ
/// (Q-CMD `create_cq_ring`, `create_qp_rings`).
const MAX_RING_PAGES: u32 = 128;

/// A PVRDMA function, brought up and active.
pub struct Pvrdma<H: Hal> {
    hal: H,
    regs: H::Mmio,
    uar: H::Mmio,
    pci: PciAddress,
    version: u32,
    /// The capabilities creation accepts ([`Pvrdma::device_caps`] explains the rule).
    caps: DeviceCaps,
    /// The device's own values where they differ from `caps`.
    raw: RawLimits,
    state: spin::Mutex<State<H>>,
    /// The shared region (DSR) and, after it, the two notification rings with their page
    /// directories.
    dsr: Dma<H>,
    qps: QpTable<H>,
    opcodes: Opcodes,
    /// The bound GIDs (a copy of the command lock's bitmap the data path reads without it).
    gid_bits: [core::sync::atomic::AtomicU64; 4],
    /// Interrupts, the notification rings and the event hub.
    events: irq::Events<H>,
}

/// What the command lock protects: the channel, and the driver's count of device objects (the
/// driver counts so that it never asks QEMU for one object more than its tables hold: QEMU's
/// allocator corrupts its heap instead of failing).
struct State<H: Hal> {
    chan: Channel<H>,
    /// Live objects of each kind, by [`State::slot`].
    counts: [u32; 5],
    /// Whether the GSI QP (QP1) exists.
    gsi: bool,
    gids: [u64; 4],
}

impl<H: Hal> State<H> {
    fn slot(kind: Object) -> usize {
        match kind {
            Object::Pd => 0,
            Object::Cq => 1,
            Object::Qp => 2,
            Object::Srq => 3,
            // (Event slots and channels are the driver's, never counted here.)
            Object::Mr
            | Object::Gid
            | Object::CqEventSlot
            | Object::CompletionChannel
            | Object::Ipv6Path
            | Object::McastGroup => 4,
        }
    }

    /// Refuses a create when the device's table for `kind` is full (`limit` entries): the
    /// driver counts so that it never asks QEMU to overflow a table.
    fn room_for(&self, kind: Object, limit: u32) -> Result<()> {
        if self.counts[Self::slot(kind)] >= limit {
            return Err(Error::Resource(Resource::Objects {
                object: kind,
                limit,
            }));
        }
        Ok(())
    }

    /// Runs a create command (`fill` writes the request in the slot). On success the object
    /// counts against its table. On failure, `keep` (the memory the device was given for the
    /// object) is freed when the device clearly refused, and kept — with the object still
    /// counted — when the outcome is unknown.
    fn create<Q: cmd::Request, R: cmd::Response, M>(
        &mut self,
        regs: &impl Mmio,
        kind: Object,
        (op, code): (Op, u32),
        fill: impl FnOnce(&mut Q),
        keep: M,
    ) -> Result<(R, M)> {
        fill(self.chan.slot(code));
        match self.run_create(regs, kind, op, code) {
            Ok(()) => Ok((self.chan.answer(), keep)),
            Err((e, kept)) => {
                if kept {
                    core::mem::forget(keep);
                }
                Err(e)
            }
        }
    }

    /// The part of [`Self::create`] that does not depend on the message types (compiled once):
    /// runs the command written to the slot and counts the object; on failure, whether the
    /// object's memory must be kept.
    #[inline(never)]
    fn run_create(
        &mut self,
        regs: &impl Mmio,
        kind: Object,
        op: Op,
        code: u32,
    ) -> Result<(), (Error, bool)> {
        match self.chan.run(regs, op, code) {
            Ok(()) => {
                self.counts[Self::slot(kind)] += 1;
                Ok(())
            }
            Err(e) => {
                let unknown = outcome_unknown(&e);
                if unknown {
                    self.counts[Self::slot(kind)] += 1;
                    let keeping = "; keeping the object's DMA memory, the device may use it";
                    crate::error::warn("", &e, keeping);
                }
                Err((e, unknown))
            }
        }
    }

    /// Runs the destroy command `code` for `obj`, whose device handle is `handle`; on success
    /// it leaves its table's count, on failure it is handed back with the error.
    fn destroy<T>(
        &mut self,
        regs: &impl Mmio,
        kind: Object,
        (op, code): (Op, u32),
        handle: u32,
        obj: T,
    ) -> Result<(), (T, Error)> {
        match self.run_destroy(regs, kind, (op, code), handle) {
            Ok(()) => Ok(()),
            Err(e) => Err((obj, e)),
        }
    }

    /// The part of [`Self::destroy`] that does not depend on the object's type.
    #[inline(never)]
    fn run_destroy(
        &mut self,
        regs: &impl Mmio,
        kind: Object,
        (op, code): (Op, u32),
        handle: u32,
    ) -> Result<()> {
        let fill = |r: &mut abi::DestroyHandle| r.handle = handle;
        self.chan.command(regs, (op, code), fill)?;
        let c = &mut self.counts[Self::slot(kind)];
        *c = c.saturating_sub(1);
        Ok(())
    }

    fn gid_bound(&self, index: u32) -> bool {
        index < 256 && self.gids[index as usize / 64] & (1 << (index % 64)) != 0
    }

    fn lowest_gid(&self) -> Option<u32> {
        (0..256).find(|&i| self.gid_bound(i))
    }
}

/// A protection domain handle on a PVRDMA device.
#[derive(Debug)]
pub struct Pd {
    handle: u32,
    /// Memory regions and QPs in it.
    users: core::sync::atomic::AtomicU32,
}

impl Pd {
    /// The device's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }
}

impl<H: Hal> Pvrdma<H> {
    /// The device's interface version (QEMU: 17).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Where the function sits on the bus.
    pub fn pci_address(&self) -> PciAddress {
        self.pci
    }

    /// Runs a command under the channel lock (`fill` writes the request in the slot).
    fn exec<Q: cmd::Request, R: cmd::Response>(
        &self,
        code: (Op, u32),
        fill: impl FnOnce(&mut Q),
    ) -> Result<R> {
        self.state.lock().chan.exec(&self.regs, code, fill)
    }
}

/// Whether a command that failed with `e` may nevertheless have taken effect on the device.
fn outcome_unknown(e: &Error) -> bool {
    matches!(e, Error::Timeout { .. } | Error::Protocol { .. })
}
