//! Bring-up and teardown (L-MAIN `pvrdma_pci_probe` order; `docs/pvrdma.md` §1–§4):
//! the paired vmxnet3, the BARs, the shared region with the command slots and the two
//! notification rings, activation; the capabilities read back, checked, and the creatable
//! subset derived from them.

use core::mem::offset_of;
use core::sync::atomic::{Ordering, fence};

use bareverbs_hal::{ConfigRegionAccess, Hal, Mmio, PAGE_SIZE, PciAddress};

use super::abi::{self, Caps, Dsr, RingPageInfo};
use super::cmd::Channel;
use super::qptable::QpTable;
use super::regs::{self, BAR_REGS, BAR_UAR, ctl, reg};
use super::{
    CQES_PER_PAGE, Config, MAX_LIVE_QPS, MAX_RING_PAGES, Pvrdma, RawLimits, State, layout, pdir,
};
use crate::dma::Dma;
use crate::error::{DeviceStatus, Error, NotFound, Op, Result, Unsupported};
use crate::pci;
use crate::verbs::DeviceCaps;

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
    /// the shared region, [`Resource::Dma`](crate::error::Resource::Dma) when DMA memory runs out. Everything allocated is
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
        // directory page and its table page (`docs/pvrdma.md` §3, §6, §7).
        let ring_pages = abi::NOTIFY_RING_PAGES as usize;
        // The event state follows, in pages the device is never told about.
        let state_page = 1 + 2 * (ring_pages + 2);
        let dsr = Dma::new(&hal, state_page + super::irq::Events::<H>::PAGES)?;
        let ring_pdir = |first: usize| {
            let (dir, table) = (first + ring_pages, first + ring_pages + 1);
            dsr.write::<u64>(dir * PAGE_SIZE, dsr.page_paddr(table));
            for i in 0..ring_pages {
                dsr.write::<u64>(table * PAGE_SIZE + 8 * i, dsr.page_paddr(first + i));
            }
            dsr.page_paddr(dir)
        };
        let (async_first, cq_first) = (1, 1 + ring_pages + 2);
        let (async_pdir, cq_pdir) = (ring_pdir(async_first), ring_pdir(cq_first));

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
        // QEMU arms a CQ only on both arm bits (§9); a device with VMware's own subsystem
        // vendor is trusted to tell "next" from "solicited".
        // SAFETY: the subsystem IDs of an endpoint header; reading has no side effect.
        let subsystem = unsafe { pci.read(address, 0x2C) } & 0xFFFF;
        let qemu = subsystem != u32::from(regs::VENDOR_VMWARE);
        let events = super::irq::Events::new(
            &dsr,
            (async_first, cq_first, state_page),
            abi::NOTIFY_RING_PAGES,
            qemu,
        );
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
            events,
        };
        if config.interrupts {
            dev.events.enable_msix(&dev.hal, pci, address, &bars)?;
        }
        dev.load_and_activate()?;
        Ok(dev)
    }

    fn load_and_activate(&mut self) -> Result<()> {
        let pa = self.dsr.paddr();
        // The shared region (and the rings it points to) must be in memory before the device
        // is told where it is.
        self.hal.publish_barrier();
        self.regs.write32(reg::DSR_LOW, pa as u32);
        self.regs.write32(reg::DSR_HIGH, (pa >> 32) as u32);
        // The device wrote the caps during the DSRHIGH write: read them after it.
        self.hal.consume_barrier();
        let raw: Caps = self.dsr.get(abi::DSR_CAPS_OFFSET);
        validate_caps(self.version, &raw)?;
        // The device's caps, then in place the creatable subset of them (the rule of
        // [`Self::device_caps`]), the device's own values kept in `raw`.
        self.caps = caps_from_raw(&raw);
        let c = &mut self.caps;
        self.raw = RawLimits {
            max_qp_wr: c.max_qp_wr,
            max_srq_wr: c.max_srq_wr,
            max_cqe: c.max_cqe,
            gid_tbl_len: c.gid_tbl_len,
            max_mr_size: c.max_mr_size,
        };
        (c.max_qp_wr, c.max_srq_wr) = layout::creatable_wrs(c, MAX_RING_PAGES);
        c.max_cqe = max_cq_entries(c.max_cqe);
        c.max_mr_size = c
            .max_mr_size
            .min((pdir::MAX_PAGES * bareverbs_hal::PAGE_SIZE) as u64);
        c.gid_tbl_len = c.gid_tbl_len.min(255);

        // Interrupts open when MSI-X is set up; otherwise every vector stays masked (QEMU: any
        // non-zero IMR masks all).
        let imr = if self.events.msix_on() {
            0
        } else {
            regs::IMR_MASK_ALL
        };
        self.regs.write32(reg::IMR, imr);
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
}

impl<H: Hal> Pvrdma<H> {
    /// The largest CQ this driver can create on the device: a power of two within the device's
    /// `max_cqe` and QEMU's per-ring page limit.
    pub fn max_cq_entries(&self) -> u32 {
        max_cq_entries(self.raw.max_cqe)
    }

    /// The capabilities as the device reports them in its shared region (what Linux's
    /// `ibv_devinfo` shows). Some are not creatable on QEMU: its 128-page ring limit caps CQs
    /// at 4096 entries where it reports `max_cqe` 28672, for instance. What the verbs layer
    /// reports ([`Provider::caps`](crate::verbs::Provider::caps), `Context::caps`) is the creatable subset, by this rule:
    /// **every value up to a reported limit can be created with the other parameters at their
    /// minimum** (1 work request, 1 scatter/gather entry). So `max_qp_wr` is the most send
    /// *and* receive WRs at 1 SGE (QEMU: 4096; more SGEs allow fewer, e.g. 2048 send WRs at 4),
    /// `max_srq_wr` the most SRQ WRs at 1 SGE (8192), `max_cqe` the largest CQ
    /// ([`max_cq_entries`](Self::max_cq_entries), 4096), `max_mr_size` at most what one page
    /// directory maps (1 GiB) and `gid_tbl_len` at most QEMU's 255 entries. The other values
    /// are the device's.
    #[inline(never)]
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
}

/// The largest CQ creatable on a device reporting `max_cqe`: a power of two within it and
/// QEMU's per-ring page limit.
fn max_cq_entries(max_cqe: u32) -> u32 {
    let by_pages = (MAX_RING_PAGES - 1) * CQES_PER_PAGE;
    layout::prev_power_of_two(max_cqe.min(by_pages))
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
    static NONZERO: [&str; 8] = [
        "max_qp",
        "max_qp_wr",
        "max_sge",
        "max_cq",
        "max_cqe",
        "max_pd",
        "gid_tbl_len",
        "phys_port_cnt",
    ];
    let values = [
        caps.max_qp,
        caps.max_qp_wr,
        caps.max_sge,
        caps.max_cq,
        caps.max_cqe,
        caps.max_pd,
        caps.gid_tbl_len,
        u32::from(caps.phys_port_cnt),
    ];
    match values.iter().position(|&v| v == 0) {
        Some(i) => Err(Error::bad_value(op, &NONZERO[i], 0u32)),
        None => Ok(()),
    }
}

#[inline(never)]
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
        vendor_id: c.vendor_id,
        page_size_cap: c.page_size_cap,
        max_sge_rd: c.max_sge_rd,
    }
}

impl<H: Hal> Drop for Pvrdma<H> {
    fn drop(&mut self) {
        // L-MAIN teardown order: mask interrupts, then RESET, then free the memory (the fields'
        // own drops, after this). QEMU keeps the shared region mapped but only reads the
        // command slot on a REQUEST write, which no one can issue any more.
        self.regs.write32(reg::IMR, regs::IMR_MASK_ALL);
        self.events.mask_all();
        self.regs.write32(reg::CTL, ctl::RESET);
        fence(Ordering::SeqCst);
        // SAFETY: last use of the event state, before the block holding it is freed (the
        // fields' drops, after this).
        unsafe { self.events.release() };
    }
}
