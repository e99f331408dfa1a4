//! A register-level model of an NVMe controller on PCIe, for host tests of the storage
//! crate's NVMe driver: [`NvmeModel`] is at once the machine's memory (a [`Hal`]: DMA pages
//! with guard pages), the controller's PCI function at 00:04.0 ([`ConfigRegionAccess`]: class
//! 01/08/02, the command register, a 64-bit BAR 0) and the controller: a doorbell write runs
//! the submitted commands synchronously inside [`Mmio::write32`] and posts their completions,
//! as QEMU's controller does from its timer.
//!
//! The model encodes the interface of `docs/nvme.md` on its own, with byte offsets rather than
//! the driver's structs, so a layout mistake on either side shows.
//!
//! Faithful: CAP/CC/CSTS/AQA/ASQ/ACQ and doorbells at CAP.DSTRD's stride; admin commands
//! Identify (controller, active namespace list, namespace), Set Features Number of Queues,
//! Create and Delete I/O queues; I/O commands Read, Write, Flush, Write Zeroes and Dataset
//! Management (the last two only when configured in ONCS, else Invalid Opcode); PRP entries
//! and PRP lists (chained at a page's last entry); namespaces of given sizes and 512- or
//! 4096-byte blocks, stored sparsely (a block never written reads as zeroes); phase tags that
//! flip at each wrap.
//!
//! Hostile ([`NvmeModel::set_hostile`], [`NvmeModel::inject`]): completions with a wrong
//! identifier, a stale phase, a wrong queue or an out-of-range submission head, posted twice,
//! withheld, or with an error status; Identify fields that lie (a huge NSZE or NN, an absurd
//! LBA data size, a format index past NLBAF, a namespace list out of order, entry sizes the
//! driver cannot use); a ready bit that never changes; a fatal status. [`NvmeLies`] counts
//! what was told.
//!
//! MSI-X, as QEMU's controller lays it out: the capability at 40h (a table entry per queue
//! pair and one for the admin queue), the table in BAR 0 on the first 4 KiB boundary past the
//! doorbells and the pending bits on the next. A completion posted on a queue created with
//! interrupts enabled while MSI-X was enabled (QEMU binds the vector then) sends its entry's
//! message ([`NvmeModel::messages`]) while MSI-X is
//! enabled, the function and the entry unmasked; masked, it sets the pending bit and the
//! message goes when the mask clears. Hostile placements ([`NvmeModel::set_msix_lie`]): no
//! capability, a capability list that loops, the table in another BAR or past BAR 0, an
//! entry that forgets what is written to it.
//!
//! It keeps watch too: [`NvmeModel::violations`] lists every access the driver asked for that
//! leaves the memory it owns, a completion queue overrun, memory freed while the controller
//! was enabled and still had queues there, and damaged guard pages.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use bareverbs_hal::{ConfigRegionAccess, DmaBlock, DmaError, Hal, Mmio, PciAddress};

use crate::hostile::Rng;
use crate::mem::Memory;

/// The controller's PCI address in the model.
pub const NVME_ADDRESS: (u8, u8, u8) = (0, 4, 0);
/// Where BAR 0 decodes (a 64-bit BAR above 4 GiB).
pub const BAR0: u64 = 0x8_0000_0000;
/// Bytes of BAR 0.
pub const BAR0_SIZE: usize = 0x4000;
/// QEMU's NVMe controller's PCI IDs (Red Hat, 0010h).
pub const VENDOR: u16 = 0x1B36;
/// The device ID.
pub const DEVICE: u16 = 0x0010;

const PAGE: u64 = 4096;
// Register offsets.
const CAP: usize = 0x00;
const VS: usize = 0x08;
const CC: usize = 0x14;
const CSTS: usize = 0x1C;
const AQA: usize = 0x24;
const ASQ: usize = 0x28;
const ACQ: usize = 0x30;
const DOORBELLS: usize = 0x1000;

// Status codes (generic command status unless noted).
const SC_INVALID_OPCODE: u16 = 0x01;
const SC_INVALID_FIELD: u16 = 0x02;
const SC_DATA_TRANSFER: u16 = 0x04;
const SC_INVALID_NS: u16 = 0x0B;
const SC_INVALID_PRP_OFFSET: u16 = 0x13;
const SC_LBA_RANGE: u16 = 0x80;
/// Command specific (type 1): invalid queue identifier, invalid queue size.
const SC_INVALID_QID: u16 = 0x100 | 0x01;
const SC_INVALID_QSIZE: u16 = 0x100 | 0x02;
/// Command specific: completion queue invalid.
const SC_INVALID_CQ: u16 = 0x100;
/// Command specific: invalid interrupt vector.
const SC_INVALID_IV: u16 = 0x100 | 0x08;
/// Where the MSI-X capability lies in configuration space.
const MSIX_CAP: u16 = 0x40;

/// A lie about MSI-X ([`NvmeModel::set_msix_lie`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsixLie {
    /// No capability list at all (status bit 4 clear).
    NoCapability,
    /// A capability list whose entry points at itself, without MSI-X.
    LoopingList,
    /// The table in BAR 2 (which does not exist).
    OtherBar,
    /// The table's offset near 4 GiB, past BAR 0.
    PastBar,
    /// Table entries that read back as zeroes whatever is written.
    ForgetfulEntry,
}

/// One namespace: its blocks and their size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsConfig {
    /// Blocks (NSZE).
    pub blocks: u64,
    /// Bytes per block: 512 or 4096.
    pub block_size: u32,
}

/// How the controller is built.
#[derive(Clone, Debug)]
pub struct NvmeConfig {
    /// Namespaces 1, 2, ... in order.
    pub namespaces: Vec<NsConfig>,
    /// A volatile write cache (Identify's VWC).
    pub vwc: bool,
    /// Write Zeroes in ONCS.
    pub write_zeroes: bool,
    /// Dataset Management in ONCS.
    pub dsm: bool,
    /// CAP.MQES (0-based entries per queue).
    pub mqes: u16,
    /// CAP.DSTRD.
    pub dstrd: u8,
    /// CAP.TO (500 ms units).
    pub to: u8,
    /// Identify's MDTS (0: no limit).
    pub mdts: u8,
    /// I/O queue pairs the controller grants at most.
    pub max_queues: u16,
    /// DMA pages the machine has.
    pub dma_pages: usize,
}

impl Default for NvmeConfig {
    fn default() -> Self {
        NvmeConfig {
            namespaces: vec![NsConfig {
                blocks: 2048,
                block_size: 512,
            }],
            vwc: true,
            write_zeroes: true,
            dsm: true,
            mqes: 2047,
            dstrd: 0,
            to: 15,
            mdts: 7,
            max_queues: 64,
            dma_pages: 1 << 14,
        }
    }
}

/// A fault injected into one coming completion ([`NvmeModel::inject`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The identifier of no command in flight.
    WrongCid,
    /// Written with the phase of the previous round (invisible to a driver that checks).
    StalePhase,
    /// Posted twice.
    Duplicate,
    /// A submission queue head past the queue's end.
    SqHead,
    /// Another queue's identifier.
    WrongQueue,
    /// Not posted at all.
    Withheld,
    /// This status (code type in bits 10:8, code in 7:0) instead of the real one.
    Status(u16),
}

/// A lie in Identify data ([`NvmeModel::set_identify_lie`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdentifyLie {
    /// NSZE of every namespace near 2^64.
    NszeHuge,
    /// An LBA data size (as a power of two) that no disk has.
    LbaSize(u8),
    /// NN of 2^32 - 1.
    NnHuge,
    /// FLBAS names a format past NLBAF.
    FormatIndex,
    /// FLBAS's bits 6:5 (the format index's upper bits) set.
    FormatIndexHigh,
    /// The active namespace list descends.
    ListOrder,
    /// SQES and CQES say 128-byte and 32-byte entries only.
    EntrySizes,
    /// Metadata in the namespace's format.
    Metadata,
}

/// How hostile the controller is: each completion lies with probability 1/`rate` if
/// `completions`, each Identify with 1/`rate` if `identify`, each CSTS read with 1/`rate` if
/// `registers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmeHostile {
    /// Seeds every decision.
    pub seed: u64,
    /// One lie in `rate` (0: never).
    pub rate: u32,
    /// Lie in completions.
    pub completions: bool,
    /// Lie in Identify data too.
    pub identify: bool,
    /// Lie in CSTS too (a ready bit that does not follow CC.EN, a fatal status).
    pub registers: bool,
}

/// What the controller lied about, by class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeLies {
    /// Completions forged, withheld, duplicated or given a false status.
    pub completions: u64,
    /// Identify pages falsified.
    pub identify: u64,
    /// Register reads answered with a lie.
    pub registers: u64,
}

/// What the controller did, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeCounters {
    /// Commands fetched from submission queues.
    pub fetched: u64,
    /// Completions posted (a duplicate counts twice).
    pub posted: u64,
    /// Admin commands fetched.
    pub admin: u64,
    /// Reads, writes, flushes, write zeroes and dataset management commands executed.
    pub reads: u64,
    /// Writes executed.
    pub writes: u64,
    /// Flushes executed.
    pub flushes: u64,
    /// Write Zeroes executed.
    pub write_zeroes: u64,
    /// Dataset Management executed.
    pub dsm: u64,
    /// PRP list entries followed.
    pub prp_list_entries: u64,
    /// Times the controller was disabled (CC.EN 1 to 0).
    pub disables: u64,
    /// Times it was enabled.
    pub enables: u64,
    /// Bytes the driver cleaned from the CPU's caches ([`Hal::dma_clean`]) before the
    /// controller read them.
    pub cleaned: u64,
    /// Bytes the driver invalidated in the CPU's caches ([`Hal::dma_invalidate`]) around
    /// the controller's writes.
    pub invalidated: u64,
}

#[derive(Clone, Copy)]
struct Sq {
    base: u64,
    size: u16,
    head: u16,
    tail: u16,
    cqid: u16,
}

#[derive(Clone, Copy)]
struct Cq {
    base: u64,
    size: u16,
    head: u16,
    tail: u16,
    phase: bool,
    /// The MSI-X entry its completions signal (None: interrupts disabled).
    iv: Option<u16>,
}

struct Ctrl {
    cfg: NvmeConfig,
    mem: Memory,
    command: u16,
    cc: u32,
    ready: bool,
    aqa: u32,
    asq: u64,
    acq: u64,
    sqs: Vec<Option<Sq>>,
    cqs: Vec<Option<Cq>>,
    /// Granted I/O queue pairs (Set Features), 0 before.
    granted: u16,
    blocks: Vec<HashMap<u64, Vec<u8>>>,
    faults: Vec<Fault>,
    identify_lie: Option<IdentifyLie>,
    stuck_ready: Option<bool>,
    fatal: bool,
    liar: Option<(Rng, NvmeHostile)>,
    lies: NvmeLies,
    /// A completion lie was told since the controller was last enabled (a queue it overran
    /// then is its own doing).
    lied: bool,
    counters: NvmeCounters,
    violations: Vec<String>,
    /// MSI-X Message Control's Enable (bit 15) and Function Mask (bit 14).
    msix_control: u16,
    /// The MSI-X table: address low, high, data, vector control per entry.
    msix_table: Vec<[u32; 4]>,
    /// The pending bits, one per entry.
    msix_pending: Vec<bool>,
    /// Messages sent: (address, data).
    messages: Vec<(u64, u32)>,
    msix_lie: Option<MsixLie>,
}

/// The controller's answer to a command: status (type << 8 | code) and dword 0.
type Answer = (u16, u32);

impl Ctrl {
    fn new(cfg: NvmeConfig) -> Self {
        let n = cfg.namespaces.len();
        let q = usize::from(cfg.max_queues) + 1;
        Ctrl {
            mem: Memory::new(cfg.dma_pages),
            cfg,
            command: 0,
            cc: 0,
            ready: false,
            aqa: 0,
            asq: 0,
            acq: 0,
            sqs: vec![None; q],
            cqs: vec![None; q],
            granted: 0,
            blocks: vec![HashMap::new(); n],
            faults: Vec::new(),
            identify_lie: None,
            stuck_ready: None,
            fatal: false,
            liar: None,
            lies: NvmeLies::default(),
            lied: false,
            counters: NvmeCounters::default(),
            violations: Vec::new(),
            msix_control: 0,
            // Every entry masked out of reset (PCI 3.0, 6.8.2.9).
            msix_table: vec![[0, 0, 0, 1]; q],
            msix_pending: vec![false; q],
            messages: Vec::new(),
            msix_lie: None,
        }
    }

    fn roll(&mut self) -> bool {
        match &mut self.liar {
            Some((rng, h)) => rng.one_in(h.rate),
            None => false,
        }
    }

    fn rand(&mut self) -> u64 {
        self.liar.as_mut().map_or(0, |(r, _)| r.next_u64())
    }

    fn cap(&self) -> u64 {
        u64::from(self.cfg.mqes)
            | 1 << 16
            | u64::from(self.cfg.to) << 24
            | u64::from(self.cfg.dstrd & 0xF) << 32
            | 1 << 37
            | 4 << 52
    }

    fn stride(&self) -> usize {
        4 << (self.cfg.dstrd & 0xF)
    }

    /// The MSI-X table's offset in BAR 0: the first 4 KiB boundary past every doorbell.
    fn msix_table_at(&self) -> usize {
        let end = DOORBELLS + 2 * self.msix_table.len() * self.stride();
        end.next_multiple_of(PAGE as usize)
    }

    /// The pending bit array's offset: the next 4 KiB boundary past the table.
    fn msix_pba_at(&self) -> usize {
        (self.msix_table_at() + 16 * self.msix_table.len()).next_multiple_of(PAGE as usize)
    }

    /// The MSI-X table entry and dword at BAR 0 offset `at`, if it is one.
    fn msix_slot(&self, at: usize) -> Option<(usize, usize)> {
        let rel = at.checked_sub(self.msix_table_at())?;
        (rel < 16 * self.msix_table.len()).then_some((rel / 16, rel % 16 / 4))
    }

    /// Entry `iv`'s message, or its pending bit if masked.
    fn signal(&mut self, iv: u16) {
        let i = usize::from(iv);
        if self.msix_control & 0x8000 == 0 || i >= self.msix_table.len() {
            return;
        }
        let e = self.msix_table[i];
        if self.msix_control & 0x4000 != 0 || e[3] & 1 != 0 {
            self.msix_pending[i] = true;
        } else {
            self.messages
                .push((u64::from(e[0]) | u64::from(e[1]) << 32, e[2]));
        }
    }

    /// Sends the messages pending on entries no longer masked.
    fn unmasked(&mut self) {
        for i in 0..self.msix_pending.len() {
            if self.msix_pending[i] {
                self.msix_pending[i] = false;
                self.signal(i as u16);
            }
        }
    }

    fn csts(&mut self) -> u32 {
        let mut rdy = self.stuck_ready.unwrap_or(self.ready);
        let mut cfs = self.fatal;
        if self.liar.as_ref().is_some_and(|(_, h)| h.registers) && self.roll() {
            self.lies.registers += 1;
            match self.rand() % 3 {
                0 => rdy = !rdy,
                1 => cfs = true,
                _ => return u32::MAX,
            }
        }
        u32::from(rdy) | u32::from(cfs) << 1
    }

    fn read(&mut self, at: usize) -> u32 {
        if let Some((e, w)) = self.msix_slot(at) {
            return if self.msix_lie == Some(MsixLie::ForgetfulEntry) && w < 3 {
                0
            } else {
                self.msix_table[e][w]
            };
        }
        if let Some(rel) = at.checked_sub(self.msix_pba_at())
            && rel < self.msix_pending.len().div_ceil(32) * 4
        {
            let first = rel / 4 * 32;
            return (0..32)
                .filter(|b| self.msix_pending.get(first + b).copied().unwrap_or(false))
                .fold(0, |v, b| v | 1 << b);
        }
        match at {
            CAP => self.cap() as u32,
            o if o == CAP + 4 => (self.cap() >> 32) as u32,
            VS => 0x0001_0400,
            CC => self.cc,
            CSTS => self.csts(),
            AQA => self.aqa,
            ASQ => self.asq as u32,
            o if o == ASQ + 4 => (self.asq >> 32) as u32,
            ACQ => self.acq as u32,
            o if o == ACQ + 4 => (self.acq >> 32) as u32,
            _ => 0,
        }
    }

    fn write(&mut self, at: usize, v: u32) {
        if let Some((e, w)) = self.msix_slot(at) {
            self.msix_table[e][w] = if w == 3 { v & 1 } else { v };
            if w == 3 {
                self.unmasked();
            }
            return;
        }
        if at >= self.msix_table_at() {
            // The pending bits are read-only.
            return;
        }
        match at {
            CC => {
                let was = self.cc & 1 != 0;
                self.cc = v;
                match (was, v & 1 != 0) {
                    (false, true) => self.enable(),
                    (true, false) => self.disable(),
                    _ => {}
                }
            }
            AQA => self.aqa = v & 0x0FFF_0FFF,
            ASQ => self.asq = (self.asq & !0xFFFF_FFFF) | u64::from(v),
            o if o == ASQ + 4 => self.asq = (self.asq & 0xFFFF_FFFF) | u64::from(v) << 32,
            ACQ => self.acq = (self.acq & !0xFFFF_FFFF) | u64::from(v),
            o if o == ACQ + 4 => self.acq = (self.acq & 0xFFFF_FFFF) | u64::from(v) << 32,
            o if o >= DOORBELLS => self.doorbell(o - DOORBELLS, v),
            _ => {}
        }
    }

    fn enable(&mut self) {
        self.counters.enables += 1;
        self.lied = false;
        let sqs = (self.aqa & 0xFFF) as u16 + 1;
        let cqs = ((self.aqa >> 16) & 0xFFF) as u16 + 1;
        let iosqes = (self.cc >> 16) & 0xF;
        let iocqes = (self.cc >> 20) & 0xF;
        if sqs < 2
            || cqs < 2
            || !self.asq.is_multiple_of(PAGE)
            || !self.acq.is_multiple_of(PAGE)
            || iosqes != 6
            || iocqes != 4
        {
            // QEMU refuses to start (the ready bit stays clear).
            return;
        }
        self.sqs[0] = Some(Sq {
            base: self.asq,
            size: sqs,
            head: 0,
            tail: 0,
            cqid: 0,
        });
        self.cqs[0] = Some(Cq {
            base: self.acq,
            size: cqs,
            head: 0,
            tail: 0,
            phase: true,
            // The vector is bound only if MSI-X is enabled as the queue is made (QEMU's
            // controller marks the vector used then).
            iv: (self.msix_control & 0x8000 != 0).then_some(0),
        });
        self.ready = true;
    }

    fn disable(&mut self) {
        self.counters.disables += 1;
        self.sqs.iter_mut().for_each(|q| *q = None);
        self.cqs.iter_mut().for_each(|q| *q = None);
        self.granted = 0;
        self.ready = false;
    }

    fn doorbell(&mut self, off: usize, v: u32) {
        let idx = off / self.stride();
        if !off.is_multiple_of(self.stride()) {
            return;
        }
        let (qid, is_cq) = (idx / 2, idx % 2 == 1);
        if !self.ready || self.command & 0x4 == 0 || qid >= self.sqs.len() {
            return;
        }
        if is_cq {
            if let Some(cq) = self.cqs[qid].as_mut()
                && (v as u16) < cq.size
            {
                cq.head = v as u16;
            }
            return;
        }
        let Some(sq) = self.sqs[qid].as_mut() else {
            return;
        };
        if (v as u16) >= sq.size {
            return;
        }
        sq.tail = v as u16;
        self.run_sq(qid);
    }

    fn run_sq(&mut self, qid: usize) {
        // Bounded: one queue's worth per doorbell.
        for _ in 0..4096 {
            let Some(sq) = self.sqs.get(qid).copied().flatten() else {
                return;
            };
            if sq.head == sq.tail || !self.ready {
                return;
            }
            let at = sq.base + u64::from(sq.head) * 64;
            let head = (sq.head + 1) % sq.size;
            if let Some(s) = self.sqs[qid].as_mut() {
                s.head = head;
            }
            let Some(cmd) = self.mem.read(at, 64) else {
                self.violations
                    .push(format!("submission entry at {at:#x} is not DMA memory"));
                return;
            };
            self.counters.fetched += 1;
            let dw = |i: usize| u32::from_le_bytes(cmd[4 * i..4 * i + 4].try_into().unwrap());
            let cid = (dw(0) >> 16) as u16;
            let (status, dw0) = if qid == 0 {
                self.counters.admin += 1;
                self.admin(&cmd)
            } else {
                self.io(&cmd)
            };
            self.post(sq.cqid, qid as u16, head, cid, status, dw0);
        }
    }

    /// Posts a completion, with the lie in store or drawn.
    fn post(&mut self, cqid: u16, sqid: u16, sqhd: u16, cid: u16, status: u16, dw0: u32) {
        let fault = if !self.faults.is_empty() {
            Some(self.faults.remove(0))
        } else if self.liar.as_ref().is_some_and(|(_, h)| h.completions) && self.roll() {
            let r = self.rand();
            Some(match r % 7 {
                0 => Fault::WrongCid,
                1 => Fault::StalePhase,
                2 => Fault::Duplicate,
                3 => Fault::SqHead,
                4 => Fault::WrongQueue,
                5 => Fault::Withheld,
                _ => Fault::Status((r >> 8) as u16 & 0x7FF),
            })
        } else {
            None
        };
        let mut e = (sqid, sqhd, cid, status, dw0, false);
        let mut times = 1;
        if let Some(f) = fault {
            self.lies.completions += 1;
            self.lied = true;
            let r = self.rand() | 1;
            match f {
                Fault::WrongCid => e.2 ^= (r as u16) | 1,
                Fault::StalePhase => e.5 = true,
                Fault::Duplicate => times = 2,
                Fault::SqHead => e.1 = 0x8000 | r as u16,
                Fault::WrongQueue => e.0 ^= (r as u16) | 1,
                Fault::Withheld => times = 0,
                Fault::Status(s) => e.3 = s.max(1),
            }
        }
        for _ in 0..times {
            self.write_cqe(cqid, e);
        }
        if times > 0
            && let Some(iv) = self
                .cqs
                .get(usize::from(cqid))
                .copied()
                .flatten()
                .and_then(|q| q.iv)
        {
            self.signal(iv);
        }
    }

    fn write_cqe(
        &mut self,
        cqid: u16,
        (sqid, sqhd, cid, status, dw0, stale): (u16, u16, u16, u16, u32, bool),
    ) {
        let Some(cq) = self.cqs.get(usize::from(cqid)).copied().flatten() else {
            return;
        };
        if (cq.tail + 1) % cq.size == cq.head {
            // Full: a driver that let it fill is at fault, unless the model's own lies (a
            // duplicate, an entry the driver could not see) filled it.
            if !self.lied {
                self.violations.push(format!(
                    "completion queue {cqid} overrun: the driver let it fill \
                     (size {}, head {}, tail {}; sqid {sqid}, cid {cid:#x})",
                    cq.size, cq.head, cq.tail
                ));
            }
            return;
        }
        let phase = cq.phase != stale;
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&dw0.to_le_bytes());
        b[8..10].copy_from_slice(&sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&sqid.to_le_bytes());
        b[12..14].copy_from_slice(&cid.to_le_bytes());
        b[14..16].copy_from_slice(&((status & 0x7FFF) << 1 | u16::from(phase)).to_le_bytes());
        let at = cq.base + u64::from(cq.tail) * 16;
        if !self.mem.write(at, &b) {
            self.violations
                .push(format!("completion entry at {at:#x} is not DMA memory"));
            return;
        }
        self.counters.posted += 1;
        if let Some(c) = self.cqs[usize::from(cqid)].as_mut() {
            c.tail += 1;
            if c.tail == c.size {
                c.tail = 0;
                c.phase = !c.phase;
            }
        }
    }

    fn admin(&mut self, c: &[u8]) -> Answer {
        let dw = |i: usize| u32::from_le_bytes(c[4 * i..4 * i + 4].try_into().unwrap());
        let prp1 = u64::from(dw(6)) | u64::from(dw(7)) << 32;
        let (cdw10, cdw11) = (dw(10), dw(11));
        let nsid = dw(1);
        match c[0] {
            0x06 => {
                let Some(page) = self.identify(cdw10 & 0xFF, nsid) else {
                    return (SC_INVALID_NS, 0);
                };
                if !prp1.is_multiple_of(4) || !self.mem.write(prp1, &page) {
                    self.violations
                        .push(format!("Identify into {prp1:#x}: not 4 KiB of DMA memory"));
                    return (SC_DATA_TRANSFER, 0);
                }
                (0, 0)
            }
            0x09 if cdw10 & 0xFF == 0x07 => {
                if self.granted != 0 {
                    // Only once after a reset (QEMU: the value stays; asking again is refused).
                    return (SC_INVALID_FIELD, 0);
                }
                let want = (cdw11 & 0xFFFF).max(cdw11 >> 16) as u16;
                self.granted = want.saturating_add(1).min(self.cfg.max_queues);
                let g = u32::from(self.granted - 1);
                (0, g | g << 16)
            }
            0x05 | 0x01 => {
                let qid = usize::from(cdw10 as u16);
                let size = (cdw10 >> 16) as u16;
                if qid == 0 || qid > usize::from(self.granted) || qid >= self.sqs.len() {
                    return (SC_INVALID_QID, 0);
                }
                if size == 0 || size > self.cfg.mqes {
                    return (SC_INVALID_QSIZE, 0);
                }
                if !prp1.is_multiple_of(PAGE) || cdw11 & 1 == 0 {
                    return (SC_INVALID_FIELD, 0);
                }
                let bytes = (usize::from(size) + 1) * if c[0] == 0x05 { 16 } else { 64 };
                if !self.mem.contains(prp1, bytes) {
                    self.violations.push(format!(
                        "queue {qid} at {prp1:#x}: not {bytes} bytes of DMA memory"
                    ));
                    return (SC_DATA_TRANSFER, 0);
                }
                if c[0] == 0x05 {
                    if self.cqs[qid].is_some() {
                        return (SC_INVALID_QID, 0);
                    }
                    // Interrupts enabled (bit 1) name an entry of the MSI-X table.
                    let iv = (cdw11 & 2 != 0).then_some((cdw11 >> 16) as u16);
                    if iv.is_some_and(|v| usize::from(v) >= self.msix_table.len()) {
                        return (SC_INVALID_IV, 0);
                    }
                    // Bound to its vector only with MSI-X already enabled (as above).
                    let iv = iv.filter(|_| self.msix_control & 0x8000 != 0);
                    self.cqs[qid] = Some(Cq {
                        base: prp1,
                        size: size + 1,
                        head: 0,
                        tail: 0,
                        phase: true,
                        iv,
                    });
                } else {
                    let cqid = (cdw11 >> 16) as u16;
                    if self.cqs.get(usize::from(cqid)).copied().flatten().is_none() || cqid == 0 {
                        return (SC_INVALID_CQ, 0);
                    }
                    if self.sqs[qid].is_some() {
                        return (SC_INVALID_QID, 0);
                    }
                    self.sqs[qid] = Some(Sq {
                        base: prp1,
                        size: size + 1,
                        head: 0,
                        tail: 0,
                        cqid,
                    });
                }
                (0, 0)
            }
            0x00 | 0x04 => {
                let qid = usize::from(cdw10 as u16);
                if qid == 0 || qid >= self.sqs.len() {
                    return (SC_INVALID_QID, 0);
                }
                if c[0] == 0x00 {
                    self.sqs[qid] = None;
                } else {
                    self.cqs[qid] = None;
                }
                (0, 0)
            }
            _ => (SC_INVALID_OPCODE, 0),
        }
    }

    /// The Identify page for `cns`, `None` for a namespace that is not there.
    fn identify(&mut self, cns: u32, nsid: u32) -> Option<Vec<u8>> {
        let mut p = vec![0u8; 4096];
        let n = self.cfg.namespaces.len() as u32;
        let lie = self.identify_lie.or_else(|| {
            (self.liar.as_ref().is_some_and(|(_, h)| h.identify) && self.roll()).then(|| {
                let r = self.rand();
                [
                    IdentifyLie::NszeHuge,
                    IdentifyLie::LbaSize((r >> 8) as u8),
                    IdentifyLie::NnHuge,
                    IdentifyLie::FormatIndex,
                    IdentifyLie::ListOrder,
                    IdentifyLie::EntrySizes,
                    IdentifyLie::Metadata,
                    IdentifyLie::FormatIndexHigh,
                ][(r % 8) as usize]
            })
        });
        let mut lied = false;
        match cns {
            0x01 => {
                p[0..2].copy_from_slice(&VENDOR.to_le_bytes());
                p[4..24].copy_from_slice(b"bareverbs-model     ");
                p[24..64].copy_from_slice(b"bareverbs model NVMe controller         ");
                p[77] = self.cfg.mdts;
                p[512] = 0x66;
                p[513] = 0x44;
                let mut nn = n;
                if lie == Some(IdentifyLie::NnHuge) {
                    nn = u32::MAX;
                    lied = true;
                }
                if lie == Some(IdentifyLie::EntrySizes) {
                    p[512] = 0x77;
                    p[513] = 0x55;
                    lied = true;
                }
                p[516..520].copy_from_slice(&nn.to_le_bytes());
                let oncs = u16::from(self.cfg.dsm) << 2 | u16::from(self.cfg.write_zeroes) << 3;
                p[520..522].copy_from_slice(&oncs.to_le_bytes());
                p[525] = u8::from(self.cfg.vwc);
            }
            0x02 => {
                let ids: Vec<u32> = (1..=n).filter(|&i| i > nsid).collect();
                for (i, id) in ids.iter().enumerate().take(1024) {
                    p[4 * i..4 * i + 4].copy_from_slice(&id.to_le_bytes());
                }
                if lie == Some(IdentifyLie::ListOrder) && !ids.is_empty() {
                    p[0..4].copy_from_slice(&(n + 7).to_le_bytes());
                    p[4..8].copy_from_slice(&1u32.to_le_bytes());
                    lied = true;
                }
            }
            0x00 => {
                let ns = *self.cfg.namespaces.get((nsid as usize).wrapping_sub(1))?;
                let mut nsze = ns.blocks;
                let mut lbads = ns.block_size.trailing_zeros() as u8;
                let mut flbas = 0u8;
                let mut ms = 0u16;
                match lie {
                    Some(IdentifyLie::NszeHuge) => nsze = u64::MAX - 3,
                    Some(IdentifyLie::LbaSize(s)) => {
                        lbads = if (9..=12).contains(&s) { 30 } else { s }
                    }
                    Some(IdentifyLie::FormatIndex) => flbas = 5,
                    Some(IdentifyLie::FormatIndexHigh) => flbas = 0x20,
                    Some(IdentifyLie::Metadata) => ms = 8,
                    _ => {}
                }
                lied = matches!(
                    lie,
                    Some(IdentifyLie::NszeHuge | IdentifyLie::LbaSize(_))
                        | Some(IdentifyLie::FormatIndex | IdentifyLie::Metadata)
                        | Some(IdentifyLie::FormatIndexHigh)
                );
                p[0..8].copy_from_slice(&nsze.to_le_bytes());
                p[8..16].copy_from_slice(&nsze.to_le_bytes());
                p[25] = 0;
                p[26] = flbas;
                let lbaf = u32::from(ms) | u32::from(lbads) << 16;
                p[128..132].copy_from_slice(&lbaf.to_le_bytes());
            }
            _ => return None,
        }
        if lied {
            self.lies.identify += 1;
        }
        Some(p)
    }

    /// The (address, length) pieces of `len` bytes at PRP1/PRP2, or a status.
    fn prps(&mut self, prp1: u64, prp2: u64, len: usize) -> Result<Vec<(u64, usize)>, u16> {
        let mut out = Vec::new();
        let first = (PAGE - prp1 % PAGE).min(len as u64) as usize;
        if !prp1.is_multiple_of(4) {
            return Err(SC_INVALID_PRP_OFFSET);
        }
        out.push((prp1, first));
        let mut left = len - first;
        if left == 0 {
            return Ok(out);
        }
        if left <= PAGE as usize {
            if !prp2.is_multiple_of(PAGE) {
                return Err(SC_INVALID_PRP_OFFSET);
            }
            out.push((prp2, left));
            return Ok(out);
        }
        let mut list = prp2;
        if !list.is_multiple_of(8) {
            return Err(SC_INVALID_PRP_OFFSET);
        }
        // Bounded by the transfer: one entry per page.
        while left > 0 {
            let Some(entry) = self.mem.read_u64(list) else {
                self.violations
                    .push(format!("PRP list entry at {list:#x} is not DMA memory"));
                return Err(SC_DATA_TRANSFER);
            };
            self.counters.prp_list_entries += 1;
            let last_in_page = (list + 8).is_multiple_of(PAGE);
            if last_in_page && left > PAGE as usize {
                list = entry;
                continue;
            }
            if !entry.is_multiple_of(PAGE) {
                return Err(SC_INVALID_PRP_OFFSET);
            }
            let n = left.min(PAGE as usize);
            out.push((entry, n));
            left -= n;
            list += 8;
        }
        Ok(out)
    }

    fn io(&mut self, c: &[u8]) -> Answer {
        let dw = |i: usize| u32::from_le_bytes(c[4 * i..4 * i + 4].try_into().unwrap());
        let nsid = dw(1);
        let prp1 = u64::from(dw(6)) | u64::from(dw(7)) << 32;
        let prp2 = u64::from(dw(8)) | u64::from(dw(9)) << 32;
        let slba = u64::from(dw(10)) | u64::from(dw(11)) << 32;
        let nlb = u64::from(dw(12) & 0xFFFF) + 1;
        let Some(ns) = self
            .cfg
            .namespaces
            .get((nsid as usize).wrapping_sub(1))
            .copied()
        else {
            return (SC_INVALID_NS, 0);
        };
        let bs = ns.block_size as usize;
        let in_range = |lba: u64, n: u64| lba.checked_add(n).is_some_and(|e| e <= ns.blocks);
        let store = &mut self.blocks[nsid as usize - 1];
        match c[0] {
            0x00 => {
                self.counters.flushes += 1;
                (0, 0)
            }
            op @ (0x01 | 0x02) => {
                if !in_range(slba, nlb) {
                    return (SC_LBA_RANGE, 0);
                }
                let len = nlb as usize * bs;
                let pieces = match self.prps(prp1, prp2, len) {
                    Ok(p) => p,
                    Err(s) => return (s, 0),
                };
                let mut data = vec![0u8; len];
                let mut at = 0;
                if op == 0x01 {
                    for (pa, n) in pieces {
                        match self.mem.read(pa, n) {
                            Some(b) => data[at..at + n].copy_from_slice(&b),
                            None => {
                                self.violations
                                    .push(format!("write from {pa:#x} (+{n}): not DMA memory"));
                                return (SC_DATA_TRANSFER, 0);
                            }
                        }
                        at += n;
                    }
                    let store = &mut self.blocks[nsid as usize - 1];
                    for (i, blk) in data.chunks(bs).enumerate() {
                        store.insert(slba + i as u64, blk.to_vec());
                    }
                    self.counters.writes += 1;
                } else {
                    let store = &self.blocks[nsid as usize - 1];
                    for (i, blk) in data.chunks_mut(bs).enumerate() {
                        if let Some(b) = store.get(&(slba + i as u64)) {
                            blk.copy_from_slice(b);
                        }
                    }
                    for (pa, n) in pieces {
                        if !self.mem.write(pa, &data[at..at + n]) {
                            self.violations
                                .push(format!("read into {pa:#x} (+{n}): not DMA memory"));
                            return (SC_DATA_TRANSFER, 0);
                        }
                        at += n;
                    }
                    self.counters.reads += 1;
                }
                (0, 0)
            }
            0x08 if self.cfg.write_zeroes => {
                if !in_range(slba, nlb) {
                    return (SC_LBA_RANGE, 0);
                }
                for l in slba..slba + nlb {
                    store.remove(&l);
                }
                self.counters.write_zeroes += 1;
                (0, 0)
            }
            0x09 if self.cfg.dsm => {
                let nr = (dw(10) & 0xFF) as usize + 1;
                let Some(ranges) = self.mem.read(prp1, nr * 16) else {
                    self.violations
                        .push(format!("DSM ranges at {prp1:#x}: not DMA memory"));
                    return (SC_DATA_TRANSFER, 0);
                };
                let store = &mut self.blocks[nsid as usize - 1];
                for r in ranges.chunks(16) {
                    let n = u64::from(u32::from_le_bytes(r[4..8].try_into().unwrap()));
                    let lba = u64::from_le_bytes(r[8..16].try_into().unwrap());
                    if !in_range(lba, n) {
                        return (SC_LBA_RANGE, 0);
                    }
                    if dw(11) & 4 != 0 {
                        for l in lba..lba + n {
                            store.remove(&l);
                        }
                    }
                }
                self.counters.dsm += 1;
                (0, 0)
            }
            _ => (SC_INVALID_OPCODE, 0),
        }
    }

    /// Whether a queue of the enabled controller lies in the block at `pa`.
    fn queue_in(&self, pa: u64, pages: usize) -> bool {
        let end = pa + pages as u64 * PAGE;
        let live = self.ready || self.stuck_ready == Some(true);
        live && self
            .sqs
            .iter()
            .flatten()
            .map(|q| q.base)
            .chain(self.cqs.iter().flatten().map(|q| q.base))
            .any(|b| (pa..end).contains(&b))
    }
}

/// An NVMe controller model: the machine's memory, its PCI function and the controller.
/// Clones share it.
#[derive(Clone)]
pub struct NvmeModel {
    ctrl: Arc<Mutex<Ctrl>>,
}

impl NvmeModel {
    /// A controller built as `cfg` says.
    pub fn new(cfg: NvmeConfig) -> Self {
        NvmeModel {
            ctrl: Arc::new(Mutex::new(Ctrl::new(cfg))),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ctrl> {
        self.ctrl.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The controller's PCI address.
    pub fn address() -> PciAddress {
        PciAddress::new(0, NVME_ADDRESS.0, NVME_ADDRESS.1, NVME_ADDRESS.2)
    }

    /// Lies from now on as `h` says (honest again with `None`).
    pub fn set_hostile(&self, h: Option<NvmeHostile>) {
        self.lock().liar = h.map(|h| (Rng::new(h.seed), h));
    }

    /// Applies `fault` to the next completion (faults queue up, one per completion).
    pub fn inject(&self, fault: Fault) {
        self.lock().faults.push(fault);
    }

    /// Lies in every Identify page from now on (`None`: the truth).
    pub fn set_identify_lie(&self, lie: Option<IdentifyLie>) {
        self.lock().identify_lie = lie;
    }

    /// Makes CSTS.RDY read `Some(value)` whatever CC.EN says (a controller that never
    /// becomes ready, or never stops), or follow CC.EN again (`None`). A controller stuck
    /// ready goes on executing commands.
    pub fn set_stuck_ready(&self, stuck: Option<bool>) {
        self.lock().stuck_ready = stuck;
    }

    /// Sets or clears CSTS.CFS.
    pub fn set_fatal(&self, fatal: bool) {
        self.lock().fatal = fatal;
    }

    /// What the liar told so far.
    pub fn lies(&self) -> NvmeLies {
        self.lock().lies
    }

    /// What the controller did so far.
    pub fn counters(&self) -> NvmeCounters {
        self.lock().counters
    }

    /// The bytes of block `lba` of namespace `nsid` (zeroes if never written), as stored.
    pub fn block(&self, nsid: u32, lba: u64) -> Vec<u8> {
        let g = self.lock();
        let bs = g.cfg.namespaces[nsid as usize - 1].block_size as usize;
        g.blocks[nsid as usize - 1]
            .get(&lba)
            .cloned()
            .unwrap_or_else(|| vec![0; bs])
    }

    /// Whether CC.EN is set.
    pub fn enabled(&self) -> bool {
        self.lock().cc & 1 != 0
    }

    /// DMA pages allocated and not returned.
    pub fn outstanding_pages(&self) -> usize {
        self.lock().mem.outstanding_pages()
    }

    /// Everything the driver did that it must not: memory reached that it does not own, a
    /// completion queue overrun, memory freed under live queues, damaged guard pages.
    pub fn violations(&self) -> Vec<String> {
        let g = self.lock();
        let mut v = g.violations.clone();
        v.extend(g.mem.check_guards());
        v
    }

    /// The PCI command register.
    pub fn pci_command(&self) -> u16 {
        self.lock().command
    }

    /// Lies about MSI-X from now on (`None`: the truth).
    pub fn set_msix_lie(&self, lie: Option<MsixLie>) {
        self.lock().msix_lie = lie;
    }

    /// Whether MSI-X is enabled (Message Control's Enable bit).
    pub fn msix_enabled(&self) -> bool {
        self.lock().msix_control & 0x8000 != 0
    }

    /// The MSI-X messages sent so far: (address, data), in order.
    pub fn messages(&self) -> Vec<(u64, u32)> {
        self.lock().messages.clone()
    }
}

// SAFETY: DMA blocks come from the model's `Memory` (zeroed, with distinct "physical"
// addresses, handed out once); the MMIO window is the model's own registers, bounds-checked.
unsafe impl Hal for NvmeModel {
    type Mmio = NvmeMmio;

    fn dma_alloc(&self, pages: usize) -> Result<DmaBlock, DmaError> {
        self.lock().mem.alloc(pages)
    }

    unsafe fn dma_dealloc(&self, block: DmaBlock) {
        let mut g = self.lock();
        if g.queue_in(block.paddr, block.pages) {
            g.violations.push(format!(
                "DMA block {:#x} freed while the enabled controller has queues in it",
                block.paddr
            ));
        }
        if let Err(e) = g.mem.free(block) {
            g.violations.push(e);
        }
    }

    unsafe fn map_mmio(&self, paddr: u64, size: usize) -> Option<NvmeMmio> {
        let base = paddr.checked_sub(BAR0)?;
        (base + size as u64 <= BAR0_SIZE as u64).then(|| NvmeMmio {
            model: self.clone(),
            base: base as usize,
            size,
        })
    }

    fn seed(&self) -> u64 {
        0x5EED_0E7E
    }

    /// The "physical" address of a byte of a DMA block (the caller's blocks included), as
    /// the controller reaches it; `None` elsewhere (the heap, the stack).
    fn virt_to_phys(&self, vaddr: std::ptr::NonNull<u8>) -> Option<u64> {
        self.lock().mem.virt_to_phys(vaddr.as_ptr())
    }

    /// Counted (DMA is coherent here): the tests see the driver's coherence duties done.
    fn dma_clean(&self, _vaddr: std::ptr::NonNull<u8>, len: usize) {
        self.lock().counters.cleaned += len as u64;
    }

    fn dma_invalidate(&self, _vaddr: std::ptr::NonNull<u8>, len: usize) {
        self.lock().counters.invalidated += len as u64;
    }
}

impl ConfigRegionAccess for NvmeModel {
    unsafe fn read(&self, address: PciAddress, offset: u16) -> u32 {
        if address != Self::address() || offset >= 256 {
            return u32::MAX;
        }
        let g = self.lock();
        let lie = g.msix_lie;
        // Status bit 4: a capability list.
        let caps = if lie == Some(MsixLie::NoCapability) {
            0
        } else {
            0x10 << 16
        };
        let table = match lie {
            Some(MsixLie::OtherBar) => g.msix_table_at() as u32 | 2,
            Some(MsixLie::PastBar) => 0xFFFF_FFF0,
            _ => g.msix_table_at() as u32,
        };
        match offset & !3 {
            0x00 => u32::from(VENDOR) | u32::from(DEVICE) << 16,
            0x04 => u32::from(g.command) | caps,
            0x08 => 0x0108_0200,
            // A 64-bit memory BAR.
            0x10 => BAR0 as u32 | 0x4,
            0x14 => (BAR0 >> 32) as u32,
            0x34 => u32::from(MSIX_CAP),
            // A vendor capability that names itself as the next.
            o if o == MSIX_CAP && lie == Some(MsixLie::LoopingList) => {
                0x09 | u32::from(MSIX_CAP) << 8
            }
            // MSI-X, the last capability: table size N - 1, the control bits.
            o if o == MSIX_CAP => {
                0x11 | (u32::from(g.msix_control) | (g.msix_table.len() as u32 - 1)) << 16
            }
            o if o == MSIX_CAP + 4 => table,
            o if o == MSIX_CAP + 8 => g.msix_pba_at() as u32,
            _ => 0,
        }
    }

    unsafe fn write(&self, address: PciAddress, offset: u16, value: u32) {
        if address != Self::address() {
            return;
        }
        let mut g = self.lock();
        match offset & !3 {
            0x04 => g.command = value as u16,
            o if o == MSIX_CAP && g.msix_lie != Some(MsixLie::LoopingList) => {
                g.msix_control = (value >> 16) as u16 & 0xC000;
                g.unmasked();
            }
            _ => {}
        }
    }
}

/// BAR 0 of the model, mapped.
pub struct NvmeMmio {
    model: NvmeModel,
    base: usize,
    size: usize,
}

// SAFETY: every access is checked against the window; no memory outside the model is reached.
unsafe impl Mmio for NvmeMmio {
    fn size(&self) -> usize {
        self.size
    }

    fn read32(&self, offset: usize) -> u32 {
        if !offset.is_multiple_of(4) || offset + 4 > self.size {
            return u32::MAX;
        }
        let mut g = self.model.lock();
        if g.command & 0x2 == 0 {
            return u32::MAX;
        }
        g.read(self.base + offset)
    }

    fn write32(&self, offset: usize, value: u32) {
        if !offset.is_multiple_of(4) || offset + 4 > self.size {
            return;
        }
        let mut g = self.model.lock();
        if g.command & 0x2 == 0 {
            return;
        }
        g.write(self.base + offset, value);
    }
}
