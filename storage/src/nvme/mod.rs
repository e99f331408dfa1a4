//! An NVMe controller on PCIe (QEMU's `-device nvme`, or an SSD), over the HAL: the
//! admin queue, Identify, I/O queue pairs, and Read, Write, Flush, Write Zeroes and Dataset
//! Management on its namespaces. `docs/nvme.md` describes the controller as this driver uses
//! it, with the specification's sections.
//!
//! Bring-up ([`Nvme::new`]): memory decoding and bus mastering on, BAR 0 mapped; CAP read and
//! checked (the NVM command set, 4 KiB pages, doorbells inside the window); the controller
//! disabled (CC.EN 0, CSTS.RDY 0 awaited for at most CAP.TO); the driver's DMA memory taken;
//! the admin queue given (AQA, ASQ, ACQ) and the controller enabled (RDY awaited, a fatal
//! status refused); Identify Controller, the active namespace list and Identify Namespace for
//! each listed namespace (at most [`MAX_NAMESPACES`]); Set Features Number of Queues, and
//! the I/O queue pairs the controller granted (at most [`MAX_IO_QUEUES`]), their completion
//! queues with interrupts enabled on vector 0.
//!
//! Interrupts ([`Nvme::enable_msix`]): MSI-X entry 0 programmed with the embedder's message
//! (its place in BAR 0 bounded, the entry read back) and the controller restarted, so that
//! its queues are bound to the vector. From then on a command's wait calls the embedder's
//! hook ([`Nvme::set_wait`], e.g. a halt until the next interrupt) between two looks at the
//! completion queue instead of spinning; without MSI-X the driver polls.
//!
//! Data moves two ways. [`Nvme::read`] and [`Nvme::write`] copy through the driver's bounce
//! buffer. The zero-copy entries take the caller's buffer itself: [`Nvme::read_direct`] and
//! [`Nvme::write_direct`] translate each of its pages with the HAL's
//! [`virt_to_phys`](Hal::virt_to_phys) (and fall back to the bounce buffer for a part they
//! cannot, counting the bytes copied); [`Nvme::read_pages`] and [`Nvme::write_pages`] take
//! the physical pages already translated ([`Pages`]: a first page with an offset, then whole
//! pages). Either way the driver builds the command's PRP entries, with a PRP list in the
//! queue's own list page for more than two pages. [`NsDisk`], the
//! [`BlockDevice`](bareverbs_nvmf::BlockDevice) of a namespace, copies, except in
//! [`read_dma`](bareverbs_nvmf::BlockDevice::read_dma) and
//! [`write_dma`](bareverbs_nvmf::BlockDevice::write_dma)
//! once the embedder allowed DMA to the buffers given there ([`NsDisk::allow_dma`]).
//!
//! The controller is hostile input. Every wait is bounded (CAP.TO for the ready bit, the
//! [`Options::command_timeout_ms`] for a command) and ends in a typed [`NvmeError`]; a
//! completion is taken only with the phase looked for, on its own queue, with a submission
//! head between the last one and the tail and the identifier of a command in flight (see the
//! `queue` module); nothing the controller wrote indexes anything before it is bounded; an
//! Identify answer is checked (entry sizes, the namespace list's order, the LBA format's
//! index and size, the capacity's byte count) and a namespace the driver cannot serve is left
//! out and counted. A command that times out or a completion that breaks the protocol stops
//! the controller ([`State::Failed`]: disabled, so nothing of the driver's or the caller's
//! memory is written any more; [`Nvme::reset`] brings it back), or, if even the disable does
//! not complete, leaves it [`State::Wedged`]: its DMA memory is then never returned.
//! Dropping the driver disables the controller first and returns the memory only if that
//! completed.

mod data;
mod disk;
mod msix;
mod queue;
pub mod regs;

use core::ptr::NonNull;

use bareverbs_hal::{ConfigRegionAccess, DmaBlock, Hal, Mmio, PAGE_SIZE, PciAddress};
use bareverbs_nvmf::BlockError;

pub use disk::NsDisk;
pub use msix::MsixError;
pub use queue::MAX_DEPTH;
use queue::Queue;
use regs::{Cap, Command, admin};

/// The PCI class code of an NVMe controller: mass storage (01h), non-volatile memory (08h),
/// NVM Express (02h).
pub const CLASS: u32 = 0x01_08_02;
/// Bytes of BAR 0 mapped: the registers and the doorbells of [`MAX_IO_QUEUES`] queue pairs at
/// any stride that fits.
pub const MMIO_SIZE: usize = 0x4000;
/// I/O queue pairs the driver makes at most.
pub const MAX_IO_QUEUES: u16 = 4;
/// Namespaces the driver serves at most (the first of the active list).
pub const MAX_NAMESPACES: usize = 16;
/// Entries of the admin queues.
pub const ADMIN_DEPTH: u16 = 32;
/// Pages of the bounce buffer: the most one copied command moves.
pub const BOUNCE_PAGES: usize = 32;
/// Entries of a PRP list page: the zero-copy entries move at most this many pages and one
/// more.
pub const PRP_LIST_ENTRIES: usize = PAGE_SIZE / 8;

// The DMA block: the admin queues, the Identify page, the Dataset Management range page,
// then three pages per I/O queue (submission, completion, PRP list), then the bounce buffer.
const PG_ASQ: usize = 0;
const PG_ACQ: usize = 1;
const PG_IDENTIFY: usize = 2;
const PG_DSM: usize = 3;
const PG_IO: usize = 4;
const PAGES: usize = PG_IO + 3 * MAX_IO_QUEUES as usize + BOUNCE_PAGES;
const PG_BOUNCE: usize = PG_IO + 3 * MAX_IO_QUEUES as usize;

/// What the driver asks of the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// I/O queue pairs wanted (1 to [`MAX_IO_QUEUES`]; fewer if the controller grants fewer).
    pub io_queues: u16,
    /// Entries of each I/O queue (2 to [`MAX_DEPTH`], and at most CAP.MQES + 1).
    pub io_depth: u16,
    /// Milliseconds a command may take before the controller is stopped.
    pub command_timeout_ms: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            io_queues: 1,
            io_depth: MAX_DEPTH,
            command_timeout_ms: 10_000,
        }
    }
}

/// A completion the controller wrote that breaks the queue protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    /// An identifier that names no command in flight (invented, stale or a duplicate).
    UnknownCid,
    /// The submission queue identifier is not the queue's.
    WrongQueue,
    /// The submission queue head lies outside the queue, or outside the entries in flight.
    SqHead,
}

/// What the driver does not do, or the controller does not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsupported {
    /// CAP.CSS has no NVM command set.
    CommandSet,
    /// 4 KiB memory pages are outside CAP.MPSMIN..=MPSMAX.
    PageSize,
    /// The doorbells of the queues lie outside the mapped window (CAP.DSTRD).
    DoorbellStride,
    /// CAP.MQES allows no queue of two entries.
    QueueSize,
    /// Identify Controller's entry sizes do not include 64-byte submission and 16-byte
    /// completion entries.
    EntrySizes,
    /// The controller granted no I/O queue.
    NoIoQueues,
    /// ONCS has no Write Zeroes.
    WriteZeroes,
    /// ONCS has no Dataset Management.
    DatasetManagement,
}

/// Why the driver or a command failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NvmeError {
    /// No NVMe function at that address.
    NoDevice,
    /// BAR 0 is not an assigned memory BAR, or the HAL did not map it.
    Bar,
    /// DMA memory is exhausted.
    OutOfDma,
    /// CSTS.RDY did not clear within CAP.TO after CC.EN was cleared.
    DisableTimeout,
    /// CSTS.RDY did not set within CAP.TO after CC.EN was set.
    ReadyTimeout,
    /// The controller reports a fatal status (CSTS.CFS).
    Fatal,
    /// A command did not complete in time: the controller was stopped.
    Timeout,
    /// A completion broke the queue protocol: the controller was stopped.
    Protocol(Violation),
    /// Identify gave an answer that cannot be true (the namespace list out of order or past
    /// the namespace count).
    BadIdentify,
    /// Not supported by the controller or the driver.
    Unsupported(Unsupported),
    /// The command completed with an error status (status code type, status code).
    Status {
        /// Status Code Type.
        sct: u8,
        /// Status Code.
        sc: u8,
    },
    /// No such namespace (not active, or left out).
    NoNamespace,
    /// Blocks past the namespace's capacity.
    OutOfRange,
    /// A buffer that is not whole blocks, pages that do not describe the length, or a
    /// transfer larger than one command carries.
    InvalidArgument,
    /// The queue holds as many commands as it can.
    Busy,
    /// The controller was stopped after an earlier failure ([`Nvme::reset`] to start it again).
    Stopped,
}

impl core::fmt::Display for NvmeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            NvmeError::NoDevice => write!(f, "no NVMe controller at that address"),
            NvmeError::Bar => write!(f, "BAR 0 is not a mapped memory BAR"),
            NvmeError::OutOfDma => write!(f, "DMA memory exhausted"),
            NvmeError::DisableTimeout => write!(f, "the controller did not stop in CAP.TO"),
            NvmeError::ReadyTimeout => write!(f, "the controller did not become ready in CAP.TO"),
            NvmeError::Fatal => write!(f, "the controller reports a fatal status"),
            NvmeError::Timeout => write!(f, "a command did not complete in time"),
            NvmeError::Protocol(v) => write!(f, "a completion broke the queue protocol: {v:?}"),
            NvmeError::BadIdentify => write!(f, "Identify gave an impossible answer"),
            NvmeError::Unsupported(u) => write!(f, "not supported: {u:?}"),
            NvmeError::Status { sct, sc } => {
                write!(
                    f,
                    "command failed: status code type {sct:#x}, code {sc:#04x}"
                )
            }
            NvmeError::NoNamespace => write!(f, "no such namespace"),
            NvmeError::OutOfRange => write!(f, "blocks past the namespace's capacity"),
            NvmeError::InvalidArgument => write!(f, "invalid buffer or transfer"),
            NvmeError::Busy => write!(f, "the queue is full"),
            NvmeError::Stopped => write!(f, "the controller was stopped after a failure"),
        }
    }
}

impl core::error::Error for NvmeError {}

impl From<NvmeError> for BlockError {
    fn from(e: NvmeError) -> BlockError {
        match e {
            NvmeError::OutOfRange => BlockError::OutOfRange,
            NvmeError::InvalidArgument => BlockError::Misaligned,
            _ => BlockError::Io,
        }
    }
}

/// Where the controller stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Enabled, its queues made: commands go.
    Ready,
    /// Stopped after a failure, and disabled: it writes nothing any more.
    Failed,
    /// Stopped after a failure, and the disable did not complete: it may still write the
    /// driver's memory, which is therefore never returned.
    Wedged,
}

/// What Identify Controller said that the driver uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerInfo {
    /// PCI vendor ID (from Identify).
    pub vid: u16,
    /// Serial number (ASCII, space-padded).
    pub serial: [u8; 20],
    /// Model number (ASCII, space-padded).
    pub model: [u8; 40],
    /// The version register.
    pub version: u32,
    /// Number of namespaces (as the controller says: bounded by nothing the driver indexes).
    pub nn: u32,
    /// Optional NVM Command Support.
    pub oncs: u16,
    /// Whether a volatile write cache is present (VWC bit 0).
    pub vwc: bool,
    /// The most bytes one command moves: MDTS, the bounce buffer and one PRP list.
    pub max_transfer: usize,
}

impl ControllerInfo {
    /// Whether the controller has Write Zeroes.
    pub fn write_zeroes(&self) -> bool {
        self.oncs & regs::ONCS_WRITE_ZEROES != 0
    }
    /// Whether the controller has Dataset Management.
    pub fn dataset_management(&self) -> bool {
        self.oncs & regs::ONCS_DSM != 0
    }
}

/// A namespace the driver serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Namespace {
    /// Its identifier.
    pub nsid: u32,
    /// Blocks (NSZE).
    pub blocks: u64,
    /// Bytes per block (512 to 4096).
    pub block_size: u32,
}

/// Commands and failures counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeStats {
    /// Commands submitted.
    pub submitted: u64,
    /// Completions taken (each command at most once).
    pub completed: u64,
    /// Completions with an error status.
    pub status_errors: u64,
    /// Commands that did not complete in time.
    pub timeouts: u64,
    /// Completions that broke the protocol.
    pub violations: u64,
    /// Times the controller was brought back by [`Nvme::reset`].
    pub resets: u64,
    /// Namespaces left out (a format the driver cannot serve, or an impossible size).
    pub ignored_namespaces: u32,
    /// Bytes read and written.
    pub read: u64,
    /// Bytes written.
    pub written: u64,
    /// Flush commands completed.
    pub flushes: u64,
    /// Reads and writes of a caller's buffer asked of the driver ([`Nvme::read`],
    /// [`Nvme::write`], [`Nvme::read_direct`], [`Nvme::write_direct`]), each counted once
    /// however many commands it took.
    pub transfers: u64,
    /// Bytes of those the CPU copied through the bounce buffer.
    pub copied: u64,
    /// Bytes of those the controller moved by DMA straight to or from the caller's buffer.
    pub direct: u64,
}

/// The physical pages of one transfer: `first` may start inside its page (at a dword
/// boundary); each of `rest` is a page-aligned address, and every page but the last is used
/// to its end.
#[derive(Clone, Copy, Debug)]
pub struct Pages<'a> {
    /// Address of the first byte.
    pub first: u64,
    /// The following pages.
    pub rest: &'a [u64],
}

/// An NVMe controller (polled, or interrupted once [`Nvme::enable_msix`] succeeded) and its
/// namespaces.
pub struct Nvme<H: Hal> {
    regs: H::Mmio,
    hal: H,
    cap: Cap,
    clock: fn() -> u64,
    options: Options,
    dma: NonNull<u8>,
    dma_pa: u64,
    admin: Queue,
    io: [Option<Queue>; MAX_IO_QUEUES as usize],
    info: ControllerInfo,
    namespaces: [Option<Namespace>; MAX_NAMESPACES],
    state: State,
    stats: NvmeStats,
    /// Whether MSI-X entry 0 is programmed and enabled ([`Nvme::enable_msix`]).
    interrupts: bool,
    /// What a wait for a completion does between two looks at the queue.
    wait: fn(),
}

/// The `n`th NVMe function on segment 0 (from 0), in address order.
pub fn find_nth<C: ConfigRegionAccess>(pci: &C, n: usize) -> Option<PciAddress> {
    (0u32..256 * 32 * 8)
        .map(|i| PciAddress::new(0, (i >> 8) as u8, ((i >> 3) & 31) as u8, (i & 7) as u8))
        .filter(|&a| {
            // SAFETY: offsets 0 and 8 exist in every function's header; reading an absent
            // function returns all-ones without side effects.
            let (id, class) = unsafe { (pci.read(a, 0), pci.read(a, 8)) };
            id != u32::MAX && class >> 8 == CLASS
        })
        .nth(n)
}

impl<H: Hal> Nvme<H> {
    /// Brings up the NVMe function at `address` (see the module documentation). `clock`
    /// gives milliseconds, for the bounds on every wait. On failure the command register is
    /// restored and the memory returned (unless the controller could not be disabled).
    ///
    /// # Safety
    ///
    /// `pci` reaches the function at `address`, which nothing else drives while the value
    /// lives; its BAR 0 is assigned (as firmware does) and mapped by `hal`'s
    /// [`map_mmio`](Hal::map_mmio).
    pub unsafe fn new<C: ConfigRegionAccess>(
        hal: H,
        pci: &C,
        address: PciAddress,
        clock: fn() -> u64,
        options: Options,
    ) -> Result<Self, NvmeError> {
        // SAFETY: the caller drives the function: header reads.
        let (id, class) = unsafe { (pci.read(address, 0), pci.read(address, 8)) };
        if id == u32::MAX || class >> 8 != CLASS {
            return Err(NvmeError::NoDevice);
        }
        // SAFETY: the command register of the caller's function.
        let old = unsafe { pci.read(address, 4) } & 0xFFFF;
        // SAFETY: as above: memory decoding and bus mastering on.
        unsafe { pci.write(address, 4, old | 0x6) };
        let bar = memory_bar(pci, address).ok_or(NvmeError::Bar);
        // SAFETY: BAR 0 of the caller's function, decoding on, driven by nothing else.
        let up = bar
            .and_then(|b| unsafe { hal.map_mmio(b, MMIO_SIZE) }.ok_or(NvmeError::Bar))
            .and_then(|regs| Self::bring_up(hal, regs, clock, options));
        if up.is_err() {
            // SAFETY: as above.
            unsafe { pci.write(address, 4, old) };
        }
        up
    }

    /// Brings up the controller behind `regs` (BAR 0, mapped; bus mastering on).
    pub fn bring_up(
        hal: H,
        regs: H::Mmio,
        clock: fn() -> u64,
        options: Options,
    ) -> Result<Self, NvmeError> {
        let cap = Cap::decode(read64(&regs, regs::CAP));
        if cap.css & 1 == 0 {
            return Err(NvmeError::Unsupported(Unsupported::CommandSet));
        }
        if cap.mpsmin != 0 {
            return Err(NvmeError::Unsupported(Unsupported::PageSize));
        }
        if cap.mqes == 0 {
            return Err(NvmeError::Unsupported(Unsupported::QueueSize));
        }
        let last = regs::doorbell(MAX_IO_QUEUES, true, cap.dstrd);
        if last.is_none_or(|o| o + 4 > regs.size()) {
            return Err(NvmeError::Unsupported(Unsupported::DoorbellStride));
        }
        // Nothing of ours is given to it before it stopped.
        disable(&regs, cap, clock)?;
        let block = hal.dma_alloc(PAGES).map_err(|_| NvmeError::OutOfDma)?;
        let page = |i: usize| {
            // SAFETY: page i < PAGES of the block just allocated.
            (
                unsafe { block.vaddr.add(i * PAGE_SIZE) },
                block.paddr + (i * PAGE_SIZE) as u64,
            )
        };
        let ((sq, sq_pa), (cq, cq_pa)) = (page(PG_ASQ), page(PG_ACQ));
        let db = |q, c| regs::doorbell(q, c, cap.dstrd).unwrap_or(0);
        // SAFETY: two pages of the block, which the driver keeps while the queue is used.
        let admin = unsafe {
            Queue::new(
                0,
                ADMIN_DEPTH,
                sq,
                sq_pa,
                cq,
                cq_pa,
                db(0, false),
                db(0, true),
            )
        };
        let mut nvme = Nvme {
            regs,
            hal,
            cap,
            clock,
            options,
            dma: block.vaddr,
            dma_pa: block.paddr,
            admin,
            io: [const { None }; MAX_IO_QUEUES as usize],
            info: ControllerInfo {
                vid: 0,
                serial: [b' '; 20],
                model: [b' '; 40],
                version: 0,
                nn: 0,
                oncs: 0,
                vwc: false,
                max_transfer: PAGE_SIZE,
            },
            namespaces: [None; MAX_NAMESPACES],
            state: State::Failed,
            stats: NvmeStats::default(),
            interrupts: false,
            wait: core::hint::spin_loop,
        };
        // From here on a failure drops `nvme`, which disables the controller before the
        // memory goes back.
        nvme.enable()?;
        nvme.identify()?;
        nvme.make_io_queues()?;
        Ok(nvme)
    }

    /// Gives the admin queue and enables the controller; waits for it to be ready.
    fn enable(&mut self) -> Result<(), NvmeError> {
        self.admin.reset();
        let aqs = u32::from(ADMIN_DEPTH - 1);
        self.regs.write32(regs::AQA, aqs | aqs << 16);
        write64(&self.regs, regs::ASQ, self.admin.sq_pa);
        write64(&self.regs, regs::ACQ, self.admin.cq_pa);
        // The pin-based interrupt masked (undefined, and left alone, once MSI-X is on).
        if !self.interrupts {
            self.regs.write32(regs::INTMS, u32::MAX);
        }
        self.hal.publish_barrier();
        self.regs
            .write32(regs::CC, regs::CC_EN | regs::CC_IOSQES | regs::CC_IOCQES);
        let limit = ready_limit_ms(self.cap);
        let start = (self.clock)();
        loop {
            let csts = self.regs.read32(regs::CSTS);
            // All-ones: the function is gone (a master abort), not a status.
            if csts != u32::MAX && csts & regs::CSTS_CFS != 0 {
                return Err(NvmeError::Fatal);
            }
            if csts != u32::MAX && csts & regs::CSTS_RDY != 0 {
                self.state = State::Ready;
                return Ok(());
            }
            if (self.clock)().wrapping_sub(start) > limit {
                return Err(NvmeError::ReadyTimeout);
            }
            core::hint::spin_loop();
        }
    }

    /// A byte of the Identify page.
    fn id8(&self, at: usize) -> u8 {
        // SAFETY: `at % PAGE_SIZE` lies inside the Identify page of the block this value
        // owns; the controller wrote it before the completion was taken.
        unsafe {
            self.dma
                .add(PG_IDENTIFY * PAGE_SIZE + at % PAGE_SIZE)
                .read_volatile()
        }
    }

    fn id_le(&self, at: usize, n: usize) -> u64 {
        (0..n).fold(0, |v, i| v | u64::from(self.id8(at + i)) << (8 * i))
    }

    /// Identify with `cns` (and `nsid`) into the Identify page.
    fn identify_page(&mut self, cns: u32, nsid: u32) -> Result<(), NvmeError> {
        let mut c = Command {
            cdw0: u32::from(admin::IDENTIFY),
            nsid,
            prp1: self.page_pa(PG_IDENTIFY),
            ..Command::default()
        };
        c.cdw10[0] = cns;
        self.run(None, c).map(|_| ())
    }

    fn identify(&mut self) -> Result<(), NvmeError> {
        self.identify_page(admin::CNS_CONTROLLER, 0)?;
        let (sqes, cqes) = (self.id8(512), self.id8(513));
        let fits = |v: u8, want: u8| v & 0xF <= want && want <= v >> 4;
        if !fits(sqes, 6) || !fits(cqes, 4) {
            return Err(NvmeError::Unsupported(Unsupported::EntrySizes));
        }
        let mut info = self.info;
        info.vid = self.id_le(0, 2) as u16;
        for (i, b) in info.serial.iter_mut().enumerate() {
            *b = self.id8(4 + i);
        }
        for (i, b) in info.model.iter_mut().enumerate() {
            *b = self.id8(24 + i);
        }
        info.version = self.regs.read32(regs::VS);
        info.nn = self.id_le(516, 4) as u32;
        info.oncs = self.id_le(520, 2) as u16;
        info.vwc = self.id8(525) & 1 != 0;
        // MDTS: a power of two of minimum pages (4 KiB here); 0 is no limit.
        let mdts = match self.id8(77) {
            0 => usize::MAX,
            m => PAGE_SIZE.checked_shl(u32::from(m)).unwrap_or(usize::MAX),
        };
        info.max_transfer = mdts.min(BOUNCE_PAGES * PAGE_SIZE);
        self.info = info;

        self.identify_page(admin::CNS_ACTIVE_LIST, 0)?;
        let mut list = [0u32; MAX_NAMESPACES];
        let mut prev = 0;
        for (i, slot) in list.iter_mut().enumerate() {
            let nsid = self.id_le(4 * i, 4) as u32;
            if nsid == 0 {
                break;
            }
            // Ascending, below the broadcast value and within the count.
            if nsid <= prev || nsid == u32::MAX || nsid > info.nn {
                return Err(NvmeError::BadIdentify);
            }
            prev = nsid;
            *slot = nsid;
        }
        let mut n = 0;
        for &nsid in list.iter().take_while(|&&x| x != 0) {
            self.identify_page(admin::CNS_NAMESPACE, nsid)?;
            match self.namespace_from_page(nsid) {
                Some(ns) => {
                    self.namespaces[n] = Some(ns);
                    n += 1;
                }
                None => self.stats.ignored_namespaces += 1,
            }
        }
        Ok(())
    }

    /// The namespace the Identify page describes, if the driver can serve it.
    fn namespace_from_page(&self, nsid: u32) -> Option<Namespace> {
        let nsze = self.id_le(0, 8);
        let nlbaf = self.id8(25);
        let flbas = self.id8(26);
        // Bits 6:5 extend the format index past 16 formats (revision 2.0): not served.
        let (format, high) = (flbas & 0xF, flbas & 0x60);
        if nsze == 0 || high != 0 || format > nlbaf {
            return None;
        }
        let flbas = format;
        let lbaf = self.id_le(128 + 4 * usize::from(flbas), 4) as u32;
        let (ms, lbads) = (lbaf & 0xFFFF, (lbaf >> 16) & 0xFF);
        // Metadata is not served; blocks of 512 to 4096 bytes are.
        if ms != 0 || !(9..=12).contains(&lbads) {
            return None;
        }
        let block_size = 1u32 << lbads;
        nsze.checked_mul(u64::from(block_size))?;
        Some(Namespace {
            nsid,
            blocks: nsze,
            block_size,
        })
    }

    fn make_io_queues(&mut self) -> Result<(), NvmeError> {
        let want = self.options.io_queues.clamp(1, MAX_IO_QUEUES);
        let mut c = Command {
            cdw0: u32::from(admin::SET_FEATURES),
            ..Command::default()
        };
        c.cdw10[0] = admin::FEAT_QUEUES;
        c.cdw10[1] = u32::from(want - 1) | u32::from(want - 1) << 16;
        let dw0 = self.run(None, c)?;
        // The answer is 0-based; bounded by what was asked.
        let granted = want
            .min((dw0 as u16).saturating_add(1))
            .min(((dw0 >> 16) as u16).saturating_add(1));
        if granted == 0 {
            return Err(NvmeError::Unsupported(Unsupported::NoIoQueues));
        }
        let depth = self
            .options
            .io_depth
            .clamp(2, MAX_DEPTH)
            .min(self.cap.mqes.saturating_add(1));
        for i in 0..usize::from(granted) {
            let qid = i as u16 + 1;
            let base = PG_IO + 3 * i;
            let db = |c| regs::doorbell(qid, c, self.cap.dstrd).unwrap_or(0);
            let (sq, sq_pa) = self.page(base);
            let (cq, cq_pa) = self.page(base + 1);
            // SAFETY: two pages of the block this value owns, for this queue alone.
            let q = unsafe { Queue::new(qid, depth, sq, sq_pa, cq, cq_pa, db(false), db(true)) };
            let size = u32::from(q.depth - 1) << 16 | u32::from(qid);
            let mut c = Command {
                cdw0: u32::from(admin::CREATE_CQ),
                prp1: cq_pa,
                ..Command::default()
            };
            // Physically contiguous, interrupts on, vector 0 (MSI-X entry 0, the admin
            // queue's too): they reach the CPU once [`Nvme::enable_msix`] programmed it.
            c.cdw10[0] = size;
            c.cdw10[1] = CQ_PC_IEN;
            self.run(None, c)?;
            let mut c = Command {
                cdw0: u32::from(admin::CREATE_SQ),
                prp1: sq_pa,
                ..Command::default()
            };
            c.cdw10[0] = size;
            c.cdw10[1] = 1 | u32::from(qid) << 16;
            self.run(None, c)?;
            self.io[i] = Some(q);
        }
        Ok(())
    }

    fn page(&self, i: usize) -> (NonNull<u8>, u64) {
        // SAFETY: callers pass i < PAGES: inside the block.
        (unsafe { self.dma.add(i * PAGE_SIZE) }, self.page_pa(i))
    }

    fn page_pa(&self, i: usize) -> u64 {
        self.dma_pa + (i * PAGE_SIZE) as u64
    }

    /// Submits `c` on I/O queue `io` (None: the admin queue) and waits for its completion;
    /// returns its dword 0.
    fn run(&mut self, io: Option<usize>, c: Command) -> Result<u32, NvmeError> {
        if self.state != State::Ready {
            return Err(NvmeError::Stopped);
        }
        let q = match io {
            None => &mut self.admin,
            Some(i) => self
                .io
                .get_mut(i)
                .and_then(Option::as_mut)
                .ok_or(NvmeError::InvalidArgument)?,
        };
        let cid = q.submit(&self.hal, &self.regs, c)?;
        self.stats.submitted += 1;
        let start = (self.clock)();
        let limit = self.options.command_timeout_ms;
        loop {
            match q.reap(&self.hal, &self.regs) {
                Ok(Some(r)) => {
                    self.stats.completed += 1;
                    // One command in flight: the one completion that passes is its own.
                    debug_assert_eq!(r.cid, cid);
                    if r.status & 0x7FF != 0 {
                        self.stats.status_errors += 1;
                        return Err(NvmeError::Status {
                            sct: ((r.status >> 8) & 7) as u8,
                            sc: r.status as u8,
                        });
                    }
                    return Ok(r.dw0);
                }
                Ok(None) => {}
                Err(e) => {
                    self.stats.violations += 1;
                    self.stop();
                    return Err(e);
                }
            }
            if (self.clock)().wrapping_sub(start) > limit {
                self.stats.timeouts += 1;
                let csts = self.regs.read32(regs::CSTS);
                self.stop();
                return Err(if csts != u32::MAX && csts & regs::CSTS_CFS != 0 {
                    NvmeError::Fatal
                } else {
                    NvmeError::Timeout
                });
            }
            if self.interrupts {
                // Until the completion's interrupt (or the embedder's bound, a timer tick).
                (self.wait)();
            } else {
                core::hint::spin_loop();
            }
        }
    }

    /// Stops the controller after a failure: disabled ([`State::Failed`]) or, if the
    /// disable does not complete, [`State::Wedged`].
    fn stop(&mut self) {
        self.state = match disable(&self.regs, self.cap, self.clock) {
            Ok(()) => State::Failed,
            Err(_) => State::Wedged,
        };
    }

    /// Starts a stopped controller again: disabled (if it was not), enabled with empty
    /// queues, its I/O queues made anew. The namespaces found at bring-up stay.
    ///
    /// # Errors
    ///
    /// What bring-up fails with; the controller stays stopped.
    pub fn reset(&mut self) -> Result<(), NvmeError> {
        if let Err(e) = disable(&self.regs, self.cap, self.clock) {
            self.state = State::Wedged;
            return Err(e);
        }
        self.state = State::Failed;
        self.stats.resets += 1;
        self.restart()
    }

    /// Enables the disabled controller with empty queues and makes its I/O queues anew.
    fn restart(&mut self) -> Result<(), NvmeError> {
        self.io = [const { None }; MAX_IO_QUEUES as usize];
        let up = self.enable().and_then(|()| self.make_io_queues());
        if up.is_err() && self.state == State::Ready {
            self.stop();
        }
        up
    }

    /// Where the controller stands.
    pub fn state(&self) -> State {
        self.state
    }

    /// What Identify Controller said.
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// The namespaces served, in identifier order.
    pub fn namespaces(&self) -> impl Iterator<Item = &Namespace> {
        self.namespaces.iter().flatten()
    }

    /// The namespace `nsid`, if served.
    pub fn namespace(&self, nsid: u32) -> Option<Namespace> {
        self.namespaces().find(|n| n.nsid == nsid).copied()
    }

    /// I/O queue pairs made.
    pub fn io_queues(&self) -> usize {
        self.io.iter().flatten().count()
    }

    /// Counters so far.
    pub fn stats(&self) -> NvmeStats {
        self.stats
    }
}

impl<H: Hal> Drop for Nvme<H> {
    /// Disables the controller (bounded by CAP.TO), then returns the DMA memory; keeps it for
    /// good if the controller did not stop, as it may still write there.
    fn drop(&mut self) {
        if disable(&self.regs, self.cap, self.clock).is_ok() {
            // SAFETY: the block came from this HAL in `bring_up`, is returned once, and the
            // controller is disabled: it reaches none of it any more.
            unsafe {
                self.hal.dma_dealloc(DmaBlock {
                    paddr: self.dma_pa,
                    vaddr: self.dma,
                    pages: PAGES,
                })
            }
        }
    }
}

/// Create I/O Completion Queue dword 11: physically contiguous, interrupts enabled,
/// interrupt vector 0.
const CQ_PC_IEN: u32 = 0b11;

/// CAP.TO in milliseconds (at least one unit of 500 ms).
fn ready_limit_ms(cap: Cap) -> u64 {
    u64::from(cap.to.max(1)) * 500
}

/// Clears CC.EN and waits at most CAP.TO for CSTS.RDY to clear.
fn disable<M: Mmio>(regs: &M, cap: Cap, clock: fn() -> u64) -> Result<(), NvmeError> {
    let cc = regs.read32(regs::CC);
    if cc != u32::MAX && cc & regs::CC_EN != 0 {
        regs.write32(regs::CC, cc & !regs::CC_EN);
    }
    let limit = ready_limit_ms(cap);
    let start = clock();
    loop {
        // All-ones is no answer (a function gone): not "stopped".
        let csts = regs.read32(regs::CSTS);
        if csts != u32::MAX && csts & regs::CSTS_RDY == 0 {
            return Ok(());
        }
        if clock().wrapping_sub(start) > limit {
            return Err(NvmeError::DisableTimeout);
        }
        core::hint::spin_loop();
    }
}

fn read64<M: Mmio>(regs: &M, at: usize) -> u64 {
    u64::from(regs.read32(at)) | u64::from(regs.read32(at + 4)) << 32
}

fn write64<M: Mmio>(regs: &M, at: usize, v: u64) {
    regs.write32(at, v as u32);
    regs.write32(at + 4, (v >> 32) as u32);
}

/// The physical address memory BAR 0 (32- or 64-bit) decodes, `None` for an I/O BAR or an
/// unassigned one.
fn memory_bar<C: ConfigRegionAccess>(pci: &C, at: PciAddress) -> Option<u64> {
    // SAFETY: BAR registers of the caller's function: reads have no side effect.
    let low = unsafe { pci.read(at, 0x10) };
    if low & 1 != 0 {
        return None;
    }
    let mut base = u64::from(low & !0xF);
    if (low >> 1) & 3 == 2 {
        // SAFETY: as above, the upper half of a 64-bit BAR.
        base |= u64::from(unsafe { pci.read(at, 0x14) }) << 32;
    }
    (base != 0).then_some(base)
}
