//! The VMware paravirtual RDMA device (PVRDMA, PCI 15ad:0820), as QEMU 7.2–9.0 emulates it.
//!
//! Every PVRDMA fact of the crate lives in this folder: [`regs`] (registers and doorbells),
//! `abi` (shared-memory layouts), `pdir` (page directories), `cmd` (the command channel).
//! Facts and their sources: `shared/pvrdma-abi.md`.
//!
//! Bring-up ([`Pvrdma::new`]) follows the Linux driver's order (L-MAIN `pvrdma_pci_probe`):
//! check the paired vmxnet3 at function 0, size and map BAR1 (registers) and BAR2 (UAR), enable
//! memory decoding and bus mastering, read VERSION, build the shared region (DSR) with the
//! command/response slots and the two notification rings, write DSRLOW then DSRHIGH (the device
//! loads it and writes its capabilities back), validate them, mask interrupts (this driver
//! polls), ACTIVATE, and require ERR = 0.

mod abi;
mod ah;
mod cmd;
mod cq;
mod cursor;
mod layout;
mod mr;
mod pdir;
mod qp;
mod qptable;
pub mod regs;
mod ring;
mod srq;
mod wqe;

pub use ah::Ah;
pub use cq::Cq;
pub use cursor::Poll;
pub use mr::Mr;
pub use qp::Qp;
pub use srq::Srq;

use core::mem::offset_of;
use core::sync::atomic::{Ordering, fence};

use bareverbs_hal::{ConfigRegionAccess, Hal, Mmio, PAGE_SIZE, PciAddress};

use self::abi::{Caps, Dsr, RingPageInfo};
use self::cmd::Channel;
use self::qptable::QpTable;
use self::regs::{BAR_REGS, BAR_UAR, ctl, reg};
use crate::dma::Dma;
use crate::error::{
    DeviceStatus, EBUSY, Error, Feature, NotFound, Object, Op, Param, Resource, Result, Unsupported,
};
use crate::pci;
use crate::verbs::{
    AccessFlags, AddressVector, DeviceCaps, Gid, ModifyAttr, Mtu, PortAttr, PortState, Provider,
    QpAttr, QpCaps, QpInit, RecvWr, SendWqe, Sge, SrqAttr, WorkCompletion,
};

/// Bring-up options.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// How many times a wait for the device (a command's response) polls before it gives up
    /// with [`Error::Timeout`].
    pub poll_limit: u32,
    /// Which send operations the driver posts.
    pub opcodes: Opcodes,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            poll_limit: 1 << 22,
            opcodes: Opcodes::SendOnly,
        }
    }
}

/// Which send operations the driver posts (QEMU's PVRDMA executes every send WQE as a plain
/// SEND: the opcode, immediate data and RDMA fields are ignored, §8.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcodes {
    /// Only what QEMU executes faithfully: SEND (and receives). RDMA WRITE/READ and the
    /// immediate-data forms are refused with
    /// [`Feature::NotExecutedByDevice`].
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
            Object::Mr | Object::Gid => 4,
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

    /// Runs a create command. On success the object counts against its table. On failure,
    /// `keep` (the memory the device was given for the object) is freed when the device clearly
    /// refused, and kept — with the object still counted — when the outcome is unknown.
    fn create<Q: cmd::Request, R: cmd::Response, M>(
        &mut self,
        regs: &impl Mmio,
        kind: Object,
        (op, code): (Op, u32),
        req: Q,
        keep: M,
    ) -> Result<(R, M)> {
        match self.chan.exec(regs, op, code, req) {
            Ok(r) => {
                self.counts[Self::slot(kind)] += 1;
                Ok((r, keep))
            }
            Err(e) => {
                if outcome_unknown(&e) {
                    self.counts[Self::slot(kind)] += 1;
                    log::warn!(
                        "bareverbs: {e}; keeping the object's DMA memory, the device may use it"
                    );
                    core::mem::forget(keep);
                }
                Err(e)
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
        let req = abi::DestroyHandle {
            handle,
            ..Default::default()
        };
        match self.chan.exec::<_, abi::RespHdr>(regs, op, code, req) {
            Ok(_) => {
                let c = &mut self.counts[Self::slot(kind)];
                *c = c.saturating_sub(1);
                Ok(())
            }
            Err(e) => Err((obj, e)),
        }
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

/// The first PVRDMA function on the bus.
pub fn find<C: ConfigRegionAccess>(pci: &C) -> Option<PciAddress> {
    pci::scan(pci)
        .find(|f| f.vendor == regs::VENDOR_VMWARE && f.device == regs::DEVICE_PVRDMA)
        .map(|f| f.address)
}

impl<H: Hal> Pvrdma<H> {
    /// Finds the first PVRDMA function on the bus and brings it up ([`Pvrdma::new`]).
    pub fn probe<C: ConfigRegionAccess>(hal: H, pci: &C, config: Config) -> Result<Self> {
        let address = find(pci).ok_or(Error::NotFound(NotFound::Device))?;
        Self::new(hal, pci, address, config)
    }

    /// Brings up the PVRDMA function at `address`.
    ///
    /// # Errors
    ///
    /// [`NotFound::Device`] when no PVRDMA answers there, [`NotFound::PairedFunction`] without
    /// a vmxnet3 at function 0 of the slot, [`NotFound::Bar`] / [`Unsupported::BarType`] for
    /// missing or odd BARs, [`Unsupported::DeviceVersion`], [`Unsupported::TransportMode`] and
    /// [`Unsupported::GidTypes`] for a device this driver cannot speak to, a
    /// [`DeviceStatus::Rejected`] from [`Op::LoadSharedRegion`] when the device did not take
    /// the shared region, [`Resource::Dma`] when DMA memory runs out. Everything allocated is
    /// returned on failure.
    pub fn new<C: ConfigRegionAccess>(
        hal: H,
        pci: &C,
        address: PciAddress,
        config: Config,
    ) -> Result<Self> {
        match pci::function(pci, address) {
            Some(f) if f.vendor == regs::VENDOR_VMWARE && f.device == regs::DEVICE_PVRDMA => {}
            _ => return Err(Error::NotFound(NotFound::Device)),
        }
        let fn0 = PciAddress::new(address.segment(), address.bus(), address.device(), 0);
        match pci::function(pci, fn0) {
            Some(f) if f.vendor == regs::VENDOR_VMWARE && f.device == regs::DEVICE_VMXNET3 => {}
            _ => return Err(Error::NotFound(NotFound::PairedFunction)),
        }
        let bars = pci::size_bars(pci, address)?;
        let (regs_pa, regs_len) = pci::memory_bar(&bars, BAR_REGS, regs::REGS_MIN_SIZE)?;
        let (uar_pa, _) = pci::memory_bar(&bars, BAR_UAR, regs::UAR_MIN_SIZE)?;
        pci::enable_mmio_and_dma(pci, address);
        let map = |pa: u64, len: u64, bar: u8| {
            let len = usize::try_from(len).map_err(|_| Error::NotFound(NotFound::Bar { bar }))?;
            // SAFETY: `pa..pa + len` is the function's memory BAR, decoding was just enabled,
            // and this driver is the function's only user.
            unsafe { hal.map_mmio(pa, len) }.ok_or(Error::NotFound(NotFound::Bar { bar }))
        };
        let regs = map(regs_pa, regs_len, BAR_REGS)?;
        // The driver's doorbells use UAR page 0 (the kernel's page in L-MAIN).
        let uar = map(uar_pa, regs::UAR_MIN_SIZE, BAR_UAR)?;

        let version = regs.read32(reg::VERSION);
        if !(abi::VERSION_ROCEV1..=abi::VERSION_QP_HANDLE).contains(&version) {
            return Err(Error::Unsupported(Unsupported::DeviceVersion(version)));
        }
        let uar_pfn = uar_pa >> 12;
        if version < abi::VERSION_PPN64 && uar_pfn > u64::from(u32::MAX) {
            return Err(Error::Unsupported(Unsupported::BarType { bar: BAR_UAR }));
        }

        let chan = Channel::new(&hal, config.poll_limit)?;
        let qps = QpTable::new(&hal, MAX_LIVE_QPS)?;
        // One block: the DSR, then for each notification ring (async, CQ) its data pages, its
        // directory page and its table page (`shared/pvrdma-abi.md` §3, §6, §7).
        let ring_pages = abi::NOTIFY_RING_PAGES as usize;
        let dsr = Dma::new(&hal, 1 + 2 * (ring_pages + 2))?;
        let ring_pdir = |first: usize| {
            let (dir, table) = (first + ring_pages, first + ring_pages + 1);
            dsr.write::<u64>(dir * PAGE_SIZE, dsr.page_paddr(table));
            for i in 0..ring_pages {
                dsr.write::<u64>(table * PAGE_SIZE + 8 * i, dsr.page_paddr(first + i));
            }
            dsr.page_paddr(dir)
        };
        let (async_pdir, cq_pdir) = (ring_pdir(1), ring_pdir(1 + ring_pages + 2));

        let w = |off: usize, v: u64| dsr.write(off, v);
        dsr.write(offset_of!(Dsr, driver_version), abi::DRIVER_VERSION);
        dsr.write(offset_of!(Dsr, gos_info), abi::GOS_INFO);
        w(offset_of!(Dsr, cmd_slot_dma), chan.cmd_paddr());
        w(offset_of!(Dsr, resp_slot_dma), chan.resp_paddr());
        let ring = |pdir_dma| RingPageInfo {
            num_pages: abi::NOTIFY_RING_PAGES,
            reserved: 0,
            pdir_dma,
        };
        dsr.write(offset_of!(Dsr, async_ring_pages), ring(async_pdir));
        dsr.write(offset_of!(Dsr, cq_ring_pages), ring(cq_pdir));
        w(offset_of!(Dsr, uar_pfn64), uar_pfn);

        // From here on the device holds addresses of our memory: build the value now, so that
        // any failure below runs Drop (which stops the device) before the memory is freed.
        let mut dev = Pvrdma {
            hal,
            regs,
            uar,
            pci: address,
            version,
            caps: caps_from_raw(&Caps::default()),
            raw: RawLimits::default(),
            state: spin::Mutex::new(State {
                chan,
                counts: [0; 5],
                gsi: false,
                gids: [0; 4],
            }),
            dsr,
            qps,
            opcodes: config.opcodes,
            gid_bits: Default::default(),
        };
        dev.load_and_activate()?;
        Ok(dev)
    }

    fn load_and_activate(&mut self) -> Result<()> {
        let pa = self.dsr.paddr();
        // The shared region (and the rings it points to) must be in memory before the device
        // is told where it is.
        fence(Ordering::SeqCst);
        self.regs.write32(reg::DSR_LOW, pa as u32);
        self.regs.write32(reg::DSR_HIGH, (pa >> 32) as u32);
        // The device wrote the caps during the DSRHIGH write: read them after it.
        fence(Ordering::SeqCst);
        let raw: Caps = self.dsr.get(abi::DSR_CAPS_OFFSET);
        validate_caps(self.version, &raw)?;
        let device = caps_from_raw(&raw);
        self.raw = RawLimits {
            max_qp_wr: device.max_qp_wr,
            max_srq_wr: device.max_srq_wr,
            max_cqe: device.max_cqe,
            gid_tbl_len: device.gid_tbl_len,
            max_mr_size: device.max_mr_size,
        };
        self.caps = self.usable_caps(device);

        // This driver polls: mask every interrupt vector.
        self.regs.write32(reg::IMR, regs::IMR_MASK_ALL);
        self.regs.write32(reg::CTL, ctl::ACTIVATE);
        fence(Ordering::SeqCst);
        match self.regs.read32(reg::ERR) {
            0 => Ok(()),
            err => Err(Error::Device {
                op: Op::Activate,
                status: DeviceStatus::NotActive(err),
            }),
        }
    }

    /// The device's interface version (QEMU: 17).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Where the function sits on the bus.
    pub fn pci_address(&self) -> PciAddress {
        self.pci
    }

    /// Runs a command under the channel lock.
    fn exec<Q: cmd::Request, R: cmd::Response>(&self, op: Op, code: u32, req: Q) -> Result<R> {
        self.state.lock().chan.exec(&self.regs, op, code, req)
    }

    /// The largest CQ this driver can create on the device: a power of two within the device's
    /// `max_cqe` and QEMU's per-ring page limit.
    pub fn max_cq_entries(&self) -> u32 {
        let by_pages = (MAX_RING_PAGES - 1) * CQES_PER_PAGE;
        layout::prev_power_of_two(self.raw.max_cqe.min(by_pages))
    }

    /// The capabilities as the device reports them in its shared region (what Linux's
    /// `ibv_devinfo` shows). Some are not creatable on QEMU: its 128-page ring limit caps CQs
    /// at 4096 entries where it reports `max_cqe` 28672, for instance. What the verbs layer
    /// reports ([`Provider::caps`], `Context::caps`) is the creatable subset, by this rule:
    /// **every value up to a reported limit can be created with the other parameters at their
    /// minimum** (1 work request, 1 scatter/gather entry). So `max_qp_wr` is the most send
    /// *and* receive WRs at 1 SGE (QEMU: 4096; more SGEs allow fewer, e.g. 2048 send WRs at 4),
    /// `max_srq_wr` the most SRQ WRs at 1 SGE (8192), `max_cqe` the largest CQ
    /// ([`max_cq_entries`](Self::max_cq_entries), 4096), `max_mr_size` at most what one page
    /// directory maps (1 GiB) and `gid_tbl_len` at most QEMU's 255 entries. The other values
    /// are the device's.
    pub fn device_caps(&self) -> DeviceCaps {
        let r = self.raw;
        DeviceCaps {
            max_qp_wr: r.max_qp_wr,
            max_srq_wr: r.max_srq_wr,
            max_cqe: r.max_cqe,
            gid_tbl_len: r.gid_tbl_len,
            max_mr_size: r.max_mr_size,
            ..self.caps
        }
    }

    /// The creatable capabilities, by the rule of [`device_caps`](Self::device_caps).
    fn usable_caps(&self, raw: DeviceCaps) -> DeviceCaps {
        let (max_qp_wr, max_srq_wr) = layout::creatable_wrs(&raw, MAX_RING_PAGES);
        DeviceCaps {
            max_qp_wr,
            max_srq_wr,
            max_cqe: self.max_cq_entries(),
            max_mr_size: raw
                .max_mr_size
                .min((pdir::MAX_PAGES * bareverbs_hal::PAGE_SIZE) as u64),
            gid_tbl_len: raw.gid_tbl_len.min(255),
            ..raw
        }
    }
}

/// Whether a command that failed with `e` may nevertheless have taken effect on the device.
fn outcome_unknown(e: &Error) -> bool {
    matches!(e, Error::Timeout { .. } | Error::Protocol { .. })
}

/// Checks what the device wrote into the DSR: that it loaded it at all, that it is a RoCE
/// device this driver speaks to, and that the limits it reports are usable.
fn validate_caps(version: u32, caps: &Caps) -> Result<()> {
    let op = Op::LoadSharedRegion;
    if caps.gid_types == 0 && caps.max_qp == 0 && caps.phys_port_cnt == 0 {
        // QEMU leaves the region untouched when it cannot map it, with no error register set.
        return Err(Error::Device {
            op,
            status: DeviceStatus::Rejected,
        });
    }
    if caps.mode != abi::MODE_ROCE {
        return Err(Error::Unsupported(Unsupported::TransportMode(caps.mode)));
    }
    let ok_types = match version {
        abi::VERSION_ROCEV1 => caps.gid_types == abi::GID_TYPE_ROCE_V1,
        _ => matches!(
            caps.gid_types,
            abi::GID_TYPE_ROCE_V1 | abi::GID_TYPE_ROCE_V2
        ),
    };
    if !ok_types {
        return Err(Error::Unsupported(Unsupported::GidTypes(caps.gid_types)));
    }
    let nonzero: [(&'static str, u32); 8] = [
        ("max_qp", caps.max_qp),
        ("max_qp_wr", caps.max_qp_wr),
        ("max_sge", caps.max_sge),
        ("max_cq", caps.max_cq),
        ("max_cqe", caps.max_cqe),
        ("max_pd", caps.max_pd),
        ("gid_tbl_len", caps.gid_tbl_len),
        ("phys_port_cnt", u32::from(caps.phys_port_cnt)),
    ];
    for (field, value) in nonzero {
        if value == 0 {
            return Err(Error::bad_value(op, field, value));
        }
    }
    Ok(())
}

fn caps_from_raw(c: &Caps) -> DeviceCaps {
    DeviceCaps {
        fw_ver: c.fw_ver,
        node_guid: c.node_guid,
        sys_image_guid: c.sys_image_guid,
        max_mr_size: c.max_mr_size,
        vendor_part_id: c.vendor_part_id,
        max_qp: c.max_qp,
        max_qp_wr: c.max_qp_wr,
        max_sge: c.max_sge,
        max_cq: c.max_cq,
        max_cqe: c.max_cqe,
        max_mr: c.max_mr,
        max_pd: c.max_pd,
        max_qp_rd_atom: c.max_qp_rd_atom,
        max_qp_init_rd_atom: c.max_qp_init_rd_atom,
        max_mcast_grp: c.max_mcast_grp,
        max_ah: c.max_ah,
        max_srq: c.max_srq,
        max_srq_wr: c.max_srq_wr,
        max_srq_sge: c.max_srq_sge,
        gid_tbl_len: c.gid_tbl_len,
        max_pkeys: c.max_pkeys,
        phys_port_cnt: c.phys_port_cnt,
        device_cap_flags: c.device_cap_flags,
        atomic_ops: c.atomic_ops,
    }
}

impl<H: Hal> Drop for Pvrdma<H> {
    fn drop(&mut self) {
        // L-MAIN teardown order: mask interrupts, then RESET, then free the memory (the fields'
        // own drops, after this). QEMU keeps the shared region mapped but only reads the
        // command slot on a REQUEST write, which no one can issue any more.
        self.regs.write32(reg::IMR, regs::IMR_MASK_ALL);
        self.regs.write32(reg::CTL, ctl::RESET);
        fence(Ordering::SeqCst);
    }
}

impl<H: Hal> Provider for Pvrdma<H> {
    type Pd = Pd;
    type Cq = Cq<H>;
    type Qp = Qp<H>;
    type Srq = Srq<H>;

    fn plan_qp(&self, init: &QpInit<'_>) -> Result<QpCaps> {
        let (sq, rq) = self.qp_layout(init)?;
        Ok(layout::caps_of(&sq, &rq))
    }

    unsafe fn create_qp(
        &self,
        pd: &Pd,
        send_cq: &Cq<H>,
        recv_cq: &Cq<H>,
        srq: Option<&Srq<H>>,
        init: &QpInit<'_>,
    ) -> Result<Qp<H>> {
        self.create_qp_impl(pd, send_cq, recv_cq, srq, init)
    }

    fn qp_num(&self, qp: &Qp<H>) -> u32 {
        qp.qpn
    }

    fn qp_caps(&self, qp: &Qp<H>) -> QpCaps {
        qp.caps
    }

    fn modify_qp(&self, qp: &mut Qp<H>, attr: &ModifyAttr) -> Result<()> {
        self.modify_qp_impl(qp, attr)
    }

    fn query_qp(&self, qp: &Qp<H>) -> Result<QpAttr> {
        self.query_qp_impl(qp)
    }

    fn destroy_qp(&self, qp: Qp<H>) -> Result<(), (Qp<H>, Error)> {
        self.destroy_qp_impl(qp)
    }

    fn attach_mcast(&self, _qp: &Qp<H>, _gid: Gid, _lid: u16) -> Result<()> {
        // PVRDMA has no multicast command (max_mcast_grp = 0 on QEMU).
        Err(Error::Unsupported(Unsupported::Feature(Feature::Multicast)))
    }

    fn detach_mcast(&self, _qp: &Qp<H>, _gid: Gid, _lid: u16) -> Result<()> {
        Err(Error::Unsupported(Unsupported::Feature(Feature::Multicast)))
    }

    fn plan_srq(&self, attr: &SrqAttr) -> Result<SrqAttr> {
        let l = self.srq_layout(attr)?;
        Ok(SrqAttr {
            max_wr: l.slots,
            max_sge: l.sge,
            srq_limit: attr.srq_limit,
        })
    }

    unsafe fn create_srq(&self, pd: &Pd, attr: &SrqAttr) -> Result<Srq<H>> {
        self.create_srq_impl(pd, attr)
    }

    fn srq_attr(&self, srq: &Srq<H>) -> SrqAttr {
        srq.attr
    }

    fn destroy_srq(&self, srq: Srq<H>) -> Result<(), (Srq<H>, Error)> {
        self.destroy_srq_impl(srq)
    }

    type Mr = Mr<H>;

    unsafe fn create_mr(&self, pd: &Pd, len: usize, access: AccessFlags) -> Result<Mr<H>> {
        self.create_mr_impl(pd, len, access)
    }

    fn destroy_mr(&self, mr: Mr<H>) -> Result<(), (Mr<H>, Error)> {
        self.destroy_mr_impl(mr)
    }

    fn mr_info(&self, mr: &Mr<H>) -> (u64, usize, u32, u32) {
        (mr.addr, mr.len, mr.lkey, mr.rkey)
    }

    fn mr_ptr(&self, mr: &Mr<H>) -> core::ptr::NonNull<u8> {
        mr.ptr
    }

    unsafe fn create_user_mr(
        &self,
        pd: &Pd,
        addr: core::ptr::NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr<H>> {
        self.create_user_mr_impl(pd, addr, len, access)
    }

    type Mem = PrivateMem<H>;

    fn alloc_mem(&self, bytes: usize) -> Result<PrivateMem<H>> {
        let pages = bytes.max(1).div_ceil(bareverbs_hal::PAGE_SIZE);
        Ok(PrivateMem(Dma::new(&self.hal, pages)?))
    }

    fn mem_ptr(&self, mem: &PrivateMem<H>) -> core::ptr::NonNull<u8> {
        mem.0.base()
    }

    type Ah = Ah;

    fn create_ah(&self, pd: &Pd, av: &AddressVector) -> Result<Ah> {
        self.create_ah_impl(pd, av)
    }

    #[inline(always)]
    unsafe fn sq_write(&self, qp: &mut Qp<H>, wqe: &SendWqe<'_, Ah>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { Pvrdma::sq_write(self, qp, wqe) }
    }

    #[inline(always)]
    fn sq_commit(&self, qp: &mut Qp<H>) {
        Pvrdma::sq_commit(self, qp)
    }

    #[inline]
    fn sq_abort(&self, qp: &mut Qp<H>) {
        Pvrdma::sq_abort(self, qp)
    }

    #[inline(always)]
    unsafe fn rq_write(&self, qp: &mut Qp<H>, wr_id: u64, sges: &[Sge], tag: u32) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { Pvrdma::rq_write(self, qp, wr_id, sges, tag) }
    }

    #[inline(always)]
    fn rq_commit(&self, qp: &mut Qp<H>) {
        Pvrdma::rq_commit(self, qp)
    }

    #[inline]
    fn rq_abort(&self, qp: &mut Qp<H>) {
        Pvrdma::rq_abort(self, qp)
    }

    unsafe fn post_srq_recv(&self, srq: &Srq<H>, wrs: &[RecvWr<'_>]) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.srq_post(srq, wrs) }
    }

    type Poll<'c>
        = Poll<'c, H>
    where
        H: 'c;

    #[inline]
    fn start_poll<'c>(
        &'c self,
        cq: &'c Cq<H>,
        only: Option<&Qp<H>>,
    ) -> Result<Option<Poll<'c, H>>> {
        Pvrdma::start_poll(self, cq, only.map(|q| q.handle()))
    }

    #[inline]
    fn poll_cq(&self, cq: &Cq<H>, out: &mut [WorkCompletion]) -> Result<usize> {
        self.poll_into(cq, out)
    }

    fn arm_cq(&self, cq: &Cq<H>, solicited_only: bool) {
        // QEMU arms only when bits 30 and 29 are both set; bit 30 alone disarms (§9).
        let bits = if solicited_only {
            regs::db::CQ_ARM_SOL
        } else {
            regs::db::CQ_ARM | regs::db::CQ_ARM_SOL
        };
        wqe::before_doorbell();
        self.uar.write32(regs::db::CQ, cq.handle() | bits);
    }

    fn caps(&self) -> &DeviceCaps {
        &self.caps
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port == 0 || port > self.caps.phys_port_cnt {
            return Err(Error::invalid(Param::Port, port, self.caps.phys_port_cnt));
        }
        let op = Op::QueryPort;
        let req = abi::QueryPort {
            port_num: port,
            ..Default::default()
        };
        let r: abi::QueryPortResp = self.exec(op, abi::opcode::QUERY_PORT, req)?;
        let a = r.attrs;
        // L-VRB numbers port states and MTUs as InfiniBand (and ibverbs) do.
        let mtu = |field, raw| Mtu::from_raw(raw).ok_or(Error::bad_value(op, field, raw));
        Ok(PortAttr {
            state: PortState::from_raw(a.state).ok_or(Error::bad_value(
                op,
                "port state",
                a.state,
            ))?,
            max_mtu: mtu("max_mtu", a.max_mtu)?,
            active_mtu: mtu("active_mtu", a.active_mtu)?,
            gid_tbl_len: a.gid_tbl_len,
            port_cap_flags: a.port_cap_flags,
            max_msg_sz: a.max_msg_sz,
            pkey_tbl_len: a.pkey_tbl_len,
            active_width: a.active_width,
            active_speed: a.active_speed,
            phys_state: a.phys_state,
        })
    }

    fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        if port == 0 || port > self.caps.phys_port_cnt {
            return Err(Error::invalid(Param::Port, port, self.caps.phys_port_cnt));
        }
        let max = self.caps.max_pkeys.saturating_sub(1);
        if index > max || index > u16::from(u8::MAX) {
            return Err(Error::invalid(Param::PkeyIndex, index, max));
        }
        let req = abi::QueryPkey {
            port_num: port,
            index: index as u8,
            ..Default::default()
        };
        let r: abi::QueryPkeyResp = self.exec(Op::QueryPkey, abi::opcode::QUERY_PKEY, req)?;
        Ok(r.pkey)
    }

    unsafe fn create_pd(&self) -> Result<Pd> {
        let op = Op::CreatePd;
        let mut st = self.state.lock();
        st.room_for(Object::Pd, self.caps.max_pd)?;
        let req = abi::CreatePd::default();
        let (r, ()): (abi::CreatePdResp, ()) = st.create(
            &self.regs,
            Object::Pd,
            (op, abi::opcode::CREATE_PD),
            req,
            (),
        )?;
        if r.pd_handle > regs::db::HANDLE_MASK {
            // Handles travel in 24-bit fields (doorbells, address vectors): this one is garbage.
            // The device made a PD the driver cannot name; it stays counted.
            return Err(Error::bad_value(op, "pd_handle", r.pd_handle));
        }
        Ok(Pd {
            handle: r.pd_handle,
            users: core::sync::atomic::AtomicU32::new(0),
        })
    }

    fn destroy_pd(&self, pd: Pd) -> Result<(), (Pd, Error)> {
        if pd.users.load(core::sync::atomic::Ordering::Relaxed) != 0 {
            // A region or QP (perhaps leaked with mem::forget) still uses it.
            return Err((pd, Error::Busy { op: Op::DestroyPd }));
        }
        let code = (Op::DestroyPd, abi::opcode::DESTROY_PD);
        let handle = pd.handle;
        self.state
            .lock()
            .destroy(&self.regs, Object::Pd, code, handle, pd)
    }

    unsafe fn create_cq(&self, entries: u32) -> Result<Cq<H>> {
        self.create_cq_impl(entries)
    }

    fn destroy_cq(&self, cq: Cq<H>) -> Result<(), (Cq<H>, Error)> {
        self.destroy_cq_impl(cq)
    }

    fn cq_entries(&self, cq: &Cq<H>) -> u32 {
        cq.entries
    }

    fn bind_gid(&self, index: u32, gid: Gid) -> Result<()> {
        // QEMU refuses index >= 255 (its table size) whatever gid_tbl_len says.
        let max = self.caps.gid_tbl_len.min(255) - 1;
        if index > max {
            return Err(Error::invalid(Param::GidIndex, index, max));
        }
        let (word, bit) = (index as usize / 64, 1u64 << (index % 64));
        let mut st = self.state.lock();
        if st.gids[word] & bit != 0 {
            return Err(Error::from_errno(Op::BindGid, EBUSY));
        }
        let gid_type = if self
            .dsr
            .read::<u8>(abi::DSR_CAPS_OFFSET + offset_of!(Caps, gid_types))
            & abi::GID_TYPE_ROCE_V1
            != 0
        {
            abi::GID_TYPE_ROCE_V1
        } else {
            abi::GID_TYPE_ROCE_V2
        };
        let req = abi::CreateBind {
            mtu: 1024,
            vlan: 0xFFF,
            index,
            new_gid: gid.0,
            gid_type,
            ..Default::default()
        };
        st.chan
            .exec::<_, abi::RespHdr>(&self.regs, Op::BindGid, abi::opcode::CREATE_BIND, req)?;
        st.gids[word] |= bit;
        self.gid_bits[word].fetch_or(bit, Ordering::Release);
        Ok(())
    }

    fn unbind_gid(&self, index: u32, gid: Gid) -> Result<()> {
        let (word, bit) = (index as usize / 64 % 4, 1u64 << (index % 64));
        let mut st = self.state.lock();
        let req = abi::DestroyBind {
            index,
            dest_gid: gid.0,
            ..Default::default()
        };
        st.chan.exec::<_, abi::RespHdr>(
            &self.regs,
            Op::UnbindGid,
            abi::opcode::DESTROY_BIND,
            req,
        )?;
        st.gids[word] &= !bit;
        self.gid_bits[word].fetch_and(!bit, Ordering::Release);
        Ok(())
    }
}
