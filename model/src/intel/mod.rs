//! Register-level models of Intel's igb (82576) and e1000e (82574) NICs as QEMU emulates them,
//! for host tests of the HAL's Intel links: [`NicModel`] is at once the machine's memory (a
//! [`Hal`]: DMA pages with guard pages), the NIC's PCI function at 00:03.0
//! ([`ConfigRegionAccess`]: IDs, command register, BAR 0, the MSI-X BAR and capability) and
//! the NIC: register writes act synchronously inside [`Mmio::write32`], as QEMU's do (a tail
//! write sends, a reset bit resets).
//!
//! Stations of one [`Wire`] hear each other: a frame a NIC sends is written at once into the
//! receive ring of every other station whose receiver and filter take it (this MAC,
//! broadcast, the multicast table's hash; promiscuous bits), as QEMU writes a frame into guest
//! memory when it arrives. A station with no free descriptor misses the frame (counted).
//!
//! What differs between the families is a [`Personality`] (module `igb`, module `e1000e`):
//! device ID, queue registers, descriptor formats, what enables the queues, how the link comes
//! up and how the queue causes reach an MSI-X vector. This module knows neither family.
//!
//! Hostile mode ([`NicModel::set_hostile`]): a seeded liar, at each point with probability
//! 1/rate, writes back a receive descriptor with a random or boundary length, random status
//! and error bits (no end-of-packet, errors, done on a descriptor it was not given),
//! withholds or forges a transmit descriptor's done bit, scribbles on a descriptor in a
//! ring, drops or duplicates frames, and answers register reads with lies (a reset that never
//! clears, an EEPROM or PHY access that never completes, a random MAC or status). [`Lies`]
//! counts what it told.

mod e1000e;
mod igb;

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bareverbs_hal::{ConfigRegionAccess, DmaBlock, DmaError, Hal, Mmio, PciAddress};

use crate::hostile::Rng;
use crate::mem::Memory;

pub use e1000e::E1000e;
pub use igb::Igb;

/// The NIC's PCI address in the model.
pub const NIC_ADDRESS: (u8, u8, u8) = (0, 3, 0);
/// Where BAR 0 (the registers) decodes.
pub const BAR0: u64 = 0xFEB0_0000;
/// Where the MSI-X BAR decodes.
pub const MSIX_BAR: u64 = 0xFEB8_0000;
/// Bytes of BAR 0.
pub const BAR0_SIZE: usize = 128 * 1024;
/// Bytes of the MSI-X BAR (QEMU: 16 KiB; the table at 0, the pending bits at 0x2000).
pub const MSIX_BAR_SIZE: usize = 16 * 1024;
const REGS: usize = BAR0_SIZE / 4;

// Registers both families have, by byte offset.
pub(crate) const CTRL: usize = 0x0000;
pub(crate) const STATUS: usize = 0x0008;
pub(crate) const EERD: usize = 0x0014;
pub(crate) const MDIC: usize = 0x0020;
pub(crate) const ICR: usize = 0x00C0;
pub(crate) const IMS: usize = 0x00D0;
pub(crate) const IMC: usize = 0x00D8;
pub(crate) const RCTL: usize = 0x0100;
pub(crate) const TCTL: usize = 0x0400;
pub(crate) const MTA: usize = 0x5200;
pub(crate) const RA: usize = 0x5400;

const CTRL_RST: u32 = 1 << 26;
pub(crate) const STATUS_LU: u32 = 1 << 1;
const RCTL_EN: u32 = 1 << 1;
const RCTL_UPE: u32 = 1 << 3;
const RCTL_MPE: u32 = 1 << 4;
const RCTL_BAM: u32 = 1 << 15;
const RCTL_SECRC: u32 = 1 << 26;
const TCTL_EN: u32 = 1 << 1;
const RAH_AV: u32 = 1 << 31;
const MDIC_READY: u32 = 1 << 28;
const MDIC_ERROR: u32 = 1 << 30;
/// Status dword of a receive write-back: done, end of packet.
pub(crate) const RX_DD: u32 = 1;
pub(crate) const RX_EOP: u32 = 2;

/// A descriptor ring's registers (byte offsets).
#[derive(Clone, Copy, Debug)]
pub struct Ring {
    pub bal: usize,
    pub bah: usize,
    pub len: usize,
    pub head: usize,
    pub tail: usize,
}

/// What a transmit descriptor asks, as a family reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxDesc {
    /// Data: `len` bytes at `addr`; the frame ends here (`eop`); report done (`rs`).
    Data {
        addr: u64,
        len: usize,
        eop: bool,
        rs: bool,
    },
    /// A descriptor the device takes but sends nothing for (a context descriptor).
    Context { rs: bool },
    /// A descriptor type the model does not implement (skipped, as QEMU skips it).
    Unsupported { rs: bool },
}

/// What differs between the families.
pub trait Personality: Send {
    /// "igb", "e1000e".
    fn name(&self) -> &'static str;
    /// PCI device ID.
    fn device_id(&self) -> u16;
    /// Whether the MSI-X BAR is a 64-bit BAR (igb) or a 32-bit one.
    fn msix_bar_64(&self) -> bool;
    /// MSI-X table entries.
    fn msix_vectors(&self) -> u16;
    /// Register values after a reset (`regs` zeroed before).
    fn reset(&self, regs: &mut [u32]);
    /// Whether the link is up right after a reset (else only once auto-negotiation runs).
    fn link_after_reset(&self) -> bool;
    /// Queue 0's receive and transmit rings.
    fn rings(&self) -> (Ring, Ring);
    /// Whether queue 0 receives (beyond RCTL.EN and the link).
    fn rx_enabled(&self, regs: &[u32]) -> bool;
    /// Whether queue 0 transmits (beyond TCTL.EN).
    fn tx_enabled(&self, regs: &[u32]) -> bool;
    /// Bytes of each receive buffer.
    fn rx_buffer(&self, regs: &[u32]) -> usize;
    /// The 16-byte write-back of a receive descriptor: `status` (done, end of packet, errors)
    /// and `len` where this family's format has them.
    fn rx_writeback(&self, regs: &[u32], status: u32, len: u16) -> [u8; 16];
    /// Reads a transmit descriptor.
    fn tx_desc(&self, d: &[u8; 16]) -> TxDesc;
    /// Handles a write to a family register; false when the register is plain storage.
    fn write(&self, regs: &mut [u32], offset: usize, value: u32) -> bool;
    /// The MSI-X vector queue 0's receive (`rx`) or transmit causes raise, if routed.
    fn vector(&self, regs: &[u32], rx: bool) -> Option<u16>;
    /// The interrupt cause register bit of queue 0's receive (`rx`) or transmit cause, when the
    /// family keeps it in `ICR` and raises a message only when it newly appears there (0: a
    /// message for every cause).
    fn cause(&self, rx: bool) -> u32 {
        let _ = rx;
        0
    }
    /// What the family does once a message for the cause went (the 82574: auto-clear, and
    /// auto-mask).
    fn fired(&self, regs: &mut [u32], rx: bool) {
        let _ = (regs, rx);
    }
}

/// What the liar said, by class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lies {
    /// Receive write-backs with a forged length, status or errors, or done where not given.
    pub rx_writeback: u64,
    /// Transmit done bits withheld or forged.
    pub tx_writeback: u64,
    /// Register reads answered with a lie.
    pub registers: u64,
    /// Descriptors scribbled on.
    pub scribbles: u64,
    /// Frames dropped or duplicated.
    pub frames: u64,
}

/// How hostile the NIC is: lies at each point with probability 1/`rate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NicHostile {
    /// Seeds every decision.
    pub seed: u64,
    /// One lie in `rate` at each point (0: never).
    pub rate: u32,
    /// Lie on register reads too (bring-up then fails often, with a typed error).
    pub registers: bool,
}

/// What the NIC did, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NicCounters {
    /// Frames written into the receive ring.
    pub rx_frames: u64,
    /// Frames the filter refused.
    pub rx_filtered: u64,
    /// Frames missed: no free descriptor.
    pub rx_missed: u64,
    /// Frames arriving while the receiver, its queue, bus mastering or the link was off.
    pub rx_off: u64,
    /// Frames sent on the wire.
    pub tx_frames: u64,
    /// Software resets.
    pub resets: u64,
    /// MSI-X messages sent.
    pub msix: u64,
}

struct Nic {
    p: Box<dyn Personality>,
    regs: Vec<u32>,
    mem: Memory,
    mac: [u8; 6],
    eeprom: [u16; 64],
    /// PCI command register.
    command: u16,
    /// MSI-X message control's enable and function mask.
    msix_enable: bool,
    msix_masked: bool,
    msix_table: Vec<u32>,
    msi: Vec<(u64, u32)>,
    /// STATUS reads left before auto-negotiation completes (None: not running).
    autoneg: Option<u32>,
    /// The cable: a station whose link is pulled neither sends nor receives.
    cable: bool,
    /// A frame being gathered from transmit descriptors.
    gather: Vec<u8>,
    counters: NicCounters,
    liar: Option<(Rng, NicHostile)>,
    lies: Lies,
    /// The driver asked the NIC to reach memory it does not own.
    violations: Vec<String>,
    /// CTRL reads keep the reset bit set: a reset that never completes.
    stuck_reset: bool,
}

impl Nic {
    fn new(p: Box<dyn Personality>, mac: [u8; 6]) -> Self {
        let mut eeprom = [0u16; 64];
        for i in 0..3 {
            eeprom[i] = u16::from_le_bytes([mac[2 * i], mac[2 * i + 1]]);
        }
        // Every entry masked, as after reset.
        let msix_table = (0..p.msix_vectors()).flat_map(|_| [0, 0, 0, 1]).collect();
        let mut n = Nic {
            p,
            regs: vec![0; REGS],
            mem: Memory::new(1 << 16),
            mac,
            eeprom,
            command: 0,
            msix_enable: false,
            msix_masked: false,
            msix_table,
            msi: Vec::new(),
            autoneg: None,
            cable: true,
            gather: Vec::new(),
            counters: NicCounters::default(),
            liar: None,
            lies: Lies::default(),
            violations: Vec::new(),
            stuck_reset: false,
        };
        n.reset();
        n.counters.resets = 0;
        n
    }

    fn reset(&mut self) {
        self.regs.iter_mut().for_each(|r| *r = 0);
        self.p.reset(&mut self.regs);
        if self.p.link_after_reset() && self.cable {
            self.regs[STATUS / 4] |= STATUS_LU;
        }
        self.regs[RA / 4] =
            u32::from_le_bytes([self.mac[0], self.mac[1], self.mac[2], self.mac[3]]);
        self.regs[RA / 4 + 1] = u32::from(u16::from_le_bytes([self.mac[4], self.mac[5]])) | RAH_AV;
        self.autoneg = None;
        self.gather.clear();
        self.counters.resets += 1;
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

    fn reg(&self, offset: usize) -> u32 {
        self.regs[offset / 4]
    }

    fn read(&mut self, offset: usize) -> u32 {
        let mut v = self.regs[offset / 4];
        match offset {
            STATUS => {
                if let Some(n) = self.autoneg {
                    if n == 0 {
                        self.autoneg = None;
                        if self.cable {
                            self.regs[STATUS / 4] |= STATUS_LU;
                        }
                    } else {
                        self.autoneg = Some(n - 1);
                    }
                    v = self.regs[STATUS / 4];
                }
            }
            ICR => self.regs[ICR / 4] = 0,
            _ => {}
        }
        if offset == CTRL && self.stuck_reset {
            v |= CTRL_RST;
        }
        let lying_reg = self.liar.as_ref().is_some_and(|(_, h)| h.registers);
        let watched = matches!(offset, CTRL | STATUS | EERD | MDIC | RA) || offset == RA + 4;
        if lying_reg && watched && self.roll() {
            self.lies.registers += 1;
            let r = self.rand();
            v = match r % 4 {
                0 => v ^ (1 << ((r >> 8) % 32)),
                1 => u32::MAX,
                2 => 0,
                _ => (r >> 32) as u32,
            };
        }
        v
    }

    /// Handles a register write; frames to send are left in `out`.
    fn write(&mut self, offset: usize, value: u32, out: &mut Vec<Vec<u8>>) {
        let (rx, tx) = self.p.rings();
        if self.p.write(&mut self.regs, offset, value) {
            return;
        }
        match offset {
            CTRL => {
                self.regs[CTRL / 4] = value & !CTRL_RST;
                if value & CTRL_RST != 0 {
                    self.reset();
                }
            }
            STATUS | ICR => {}
            EERD => {
                let addr = (value >> 2) & 0x3FFF;
                self.regs[EERD / 4] = if value & 1 != 0 && (addr as usize) < self.eeprom.len() {
                    u32::from(self.eeprom[addr as usize]) << 16 | addr << 2 | 2
                } else {
                    addr << 2
                };
            }
            MDIC => {
                let phy = (value >> 21) & 31;
                let reg = (value >> 16) & 31;
                let op = (value >> 26) & 3;
                let mut v = value | MDIC_READY;
                if phy != 1 {
                    v |= MDIC_ERROR;
                } else if op == 1 && reg == 0 && value & (1 << 9) != 0 && value & (1 << 12) != 0 {
                    // Auto-negotiation restarted: the link drops, and comes up a few STATUS
                    // reads later (QEMU: 500 ms of virtual time).
                    self.regs[STATUS / 4] &= !STATUS_LU;
                    self.autoneg = Some(3);
                }
                self.regs[MDIC / 4] = v;
            }
            IMS => {
                // A cause pending while it was masked is announced once it is enabled.
                let before = self.regs[IMS / 4];
                self.regs[IMS / 4] |= value;
                for rx in [true, false] {
                    let c = self.p.cause(rx);
                    if c & value & !before & self.regs[ICR / 4] != 0 {
                        self.notify(rx);
                    }
                }
            }
            IMC => self.regs[IMS / 4] &= !value,
            o if o == rx.tail => self.regs[o / 4] = value & 0xFFFF,
            o if o == tx.tail => {
                self.regs[o / 4] = value & 0xFFFF;
                self.transmit(tx, out);
            }
            o if o == rx.bal || o == tx.bal => self.regs[o / 4] = value & !0xF,
            o if o == rx.len || o == tx.len => self.regs[o / 4] = value & 0xF_FF80,
            o => self.regs[o / 4] = value,
        }
    }

    fn bus_master(&self) -> bool {
        self.command & 0x4 != 0
    }

    fn ring_base(&self, r: Ring) -> u64 {
        u64::from(self.reg(r.bah)) << 32 | u64::from(self.reg(r.bal))
    }

    fn transmit(&mut self, r: Ring, out: &mut Vec<Vec<u8>>) {
        if self.reg(TCTL) & TCTL_EN == 0 || !self.p.tx_enabled(&self.regs) || !self.bus_master() {
            return;
        }
        let count = self.reg(r.len) as usize / 16;
        let base = self.ring_base(r);
        let mut sent_any = false;
        // Bounded: at most a ring's worth per tail write.
        for _ in 0..count {
            let (head, tail) = (self.reg(r.head) as usize, self.reg(r.tail) as usize);
            if head == tail || tail >= count || head >= count {
                break;
            }
            let at = base + 16 * head as u64;
            let Some(bytes) = self.mem.read(at, 16) else {
                self.violations.push(format!(
                    "transmit descriptor at {at:#x} is not the driver's memory"
                ));
                break;
            };
            let d: [u8; 16] = bytes.try_into().expect("16 bytes");
            let rs = match self.p.tx_desc(&d) {
                TxDesc::Data { addr, len, eop, rs } => {
                    match self.mem.read(addr, len) {
                        Some(b) => self.gather.extend_from_slice(&b),
                        None => self.violations.push(format!(
                            "transmit buffer {addr:#x}+{len} is not the driver's memory"
                        )),
                    }
                    if eop {
                        let frame = std::mem::take(&mut self.gather);
                        if (14..=1514 + 4).contains(&frame.len()) && self.cable {
                            out.push(frame);
                            self.counters.tx_frames += 1;
                        }
                    }
                    rs
                }
                TxDesc::Context { rs } | TxDesc::Unsupported { rs } => rs,
            };
            let withhold = self.roll();
            if rs && !withhold {
                let mut wb = d;
                wb[12] |= 1;
                self.mem.write(at, &wb);
            } else if withhold {
                self.lies.tx_writeback += 1;
            }
            self.regs[r.head / 4] = ((head + 1) % count) as u32;
            sent_any = true;
            if self.roll() {
                // A done bit forged on a descriptor the device has not taken.
                self.lies.tx_writeback += 1;
                let j = self.rand() as usize % count;
                let at = base + 16 * j as u64 + 12;
                if let Some(b) = self.mem.read(at, 1) {
                    self.mem.write(at, &[b[0] | 1]);
                }
            }
        }
        if sent_any {
            self.raise(false);
        }
    }

    /// Whether the filter takes a frame to `dst`.
    fn accepts(&self, dst: &[u8]) -> bool {
        let rctl = self.reg(RCTL);
        if dst == [0xFF; 6] {
            return rctl & RCTL_BAM != 0;
        }
        if dst[0] & 1 != 0 {
            if rctl & RCTL_MPE != 0 {
                return true;
            }
        } else if rctl & RCTL_UPE != 0 {
            return true;
        }
        for i in 0..16 {
            let (low, high) = (self.reg(RA + 8 * i), self.reg(RA + 8 * i + 4));
            if high & RAH_AV != 0 {
                let mut m = [0u8; 6];
                m[..4].copy_from_slice(&low.to_le_bytes());
                m[4..].copy_from_slice(&(high as u16).to_le_bytes());
                if m == dst {
                    return true;
                }
            }
        }
        if dst[0] & 1 != 0 {
            let shift = [4, 3, 2, 0][((rctl >> 12) & 3) as usize];
            let f = ((usize::from(dst[5]) << 8 | usize::from(dst[4])) >> shift) & 0xFFF;
            return self.reg(MTA + 4 * (f >> 5)) & (1 << (f & 31)) != 0;
        }
        false
    }

    /// A frame arriving from the wire.
    fn receive(&mut self, frame: &[u8]) {
        if !self.cable
            || self.reg(STATUS) & STATUS_LU == 0
            || self.reg(RCTL) & RCTL_EN == 0
            || !self.p.rx_enabled(&self.regs)
            || !self.bus_master()
        {
            self.counters.rx_off += 1;
            return;
        }
        if frame.len() < 14 || frame.len() > 1514 || !self.accepts(&frame[..6]) {
            self.counters.rx_filtered += 1;
            return;
        }
        let mut data = frame.to_vec();
        data.resize(data.len().max(60), 0);
        if self.reg(RCTL) & RCTL_SECRC == 0 {
            data.extend_from_slice(&[0; 4]);
        }
        let (r, _) = self.p.rings();
        let count = self.reg(r.len) as usize / 16;
        let base = self.ring_base(r);
        let bufsize = self.p.rx_buffer(&self.regs).max(1);
        let needed = data.len().div_ceil(bufsize);
        let (head, tail) = (self.reg(r.head) as usize, self.reg(r.tail) as usize);
        let free = if tail >= count || head >= count {
            0
        } else {
            (tail + count - head) % count
        };
        if free < needed {
            self.counters.rx_missed += 1;
            return;
        }
        let mut head = head;
        for (k, chunk) in data.chunks(bufsize).enumerate() {
            let at = base + 16 * head as u64;
            let Some(addr) = self.mem.read_u64(at) else {
                self.violations.push(format!(
                    "receive descriptor at {at:#x} is not the driver's memory"
                ));
                return;
            };
            let mut written = 0u16;
            if addr != 0 {
                if self.mem.write(addr, chunk) {
                    written = chunk.len() as u16;
                } else {
                    self.violations.push(format!(
                        "receive buffer {addr:#x}+{} is not the driver's memory",
                        chunk.len()
                    ));
                }
            }
            let last = k + 1 == needed;
            let mut status = RX_DD | if last { RX_EOP } else { 0 };
            let mut len = written;
            if self.roll() {
                self.lies.rx_writeback += 1;
                let r = self.rand();
                match r % 5 {
                    0 => len = (r >> 16) as u16,
                    1 => len = [0, 1, 13, 2048, 2049, 1515, u16::MAX][(r >> 8) as usize % 7],
                    2 => status &= !RX_EOP,
                    3 => status |= 1 << (24 + (r >> 8) % 8),
                    _ => status = (r >> 32) as u32 | RX_DD,
                }
            }
            let wb = self.p.rx_writeback(&self.regs, status, len);
            self.mem.write(at, &wb);
            head = (head + 1) % count;
        }
        self.regs[r.head / 4] = head as u32;
        self.counters.rx_frames += 1;
        if self.roll() {
            // Done written on a descriptor at random (perhaps one the driver holds).
            self.lies.rx_writeback += 1;
            let j = self.rand() as usize % count.max(1);
            let r = self.rand();
            let wb = self
                .p
                .rx_writeback(&self.regs, RX_DD | RX_EOP, (r >> 20) as u16);
            self.mem.write(base + 16 * j as u64, &wb);
        }
        if self.roll() {
            // Random bytes over a descriptor of either ring.
            self.lies.scribbles += 1;
            let (rx, tx) = self.p.rings();
            let ring = if self.rand() & 1 == 0 { rx } else { tx };
            let n = (self.reg(ring.len) as usize / 16).max(1);
            let j = self.rand() as usize % n;
            // The status and length half: an address the NIC forged would have it reach
            // memory it was never given, which only an IOMMU can stop, not the driver.
            let bytes: Vec<u8> = (0..8).map(|_| self.rand() as u8).collect();
            let at = self.ring_base(ring) + 16 * j as u64 + 8;
            self.mem.write(at, &bytes);
        }
        self.raise(true);
    }

    /// Raises queue 0's receive or transmit cause on its MSI-X vector, if routed (and, for a
    /// family that keeps its causes in `ICR`, if the cause was not already pending and enabled).
    fn raise(&mut self, rx: bool) {
        let cause = self.p.cause(rx);
        let was = self.regs[ICR / 4] & self.regs[IMS / 4] & cause;
        self.regs[ICR / 4] |= cause;
        if was != 0 {
            return;
        }
        self.notify(rx);
    }

    /// Sends queue 0's receive or transmit message, if routed and enabled.
    fn notify(&mut self, rx: bool) {
        let Some(v) = self.p.vector(&self.regs, rx) else {
            return;
        };
        let e = 4 * usize::from(v);
        if !self.msix_enable || self.msix_masked || e + 3 >= self.msix_table.len() {
            return;
        }
        if self.msix_table[e + 3] & 1 != 0 {
            return;
        }
        let address = u64::from(self.msix_table[e + 1]) << 32 | u64::from(self.msix_table[e]);
        self.msi.push((address, self.msix_table[e + 2]));
        self.counters.msix += 1;
        self.p.fired(&mut self.regs, rx);
    }
}

struct WireInner {
    stations: Vec<Weak<Mutex<Nic>>>,
    frames: u64,
}

/// An Ethernet segment of NIC models: what one station sends, every other one hears.
#[derive(Clone)]
pub struct Wire(Arc<Mutex<WireInner>>);

impl Default for Wire {
    fn default() -> Self {
        Wire::new()
    }
}

impl Wire {
    /// An empty segment.
    pub fn new() -> Self {
        Wire(Arc::new(Mutex::new(WireInner {
            stations: Vec::new(),
            frames: 0,
        })))
    }

    /// Frames sent on the segment so far.
    pub fn frames(&self) -> u64 {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).frames
    }

    /// Puts `frame` on the segment as if a station not modelled sent it.
    pub fn inject(&self, frame: &[u8]) {
        self.deliver(None, vec![frame.to_vec()]);
    }

    fn deliver(&self, from: Option<&Arc<Mutex<Nic>>>, frames: Vec<Vec<u8>>) {
        if frames.is_empty() {
            return;
        }
        let stations: Vec<_> = {
            let mut w = self.0.lock().unwrap_or_else(|p| p.into_inner());
            w.frames += frames.len() as u64;
            w.stations.retain(|s| s.strong_count() > 0);
            w.stations.iter().filter_map(Weak::upgrade).collect()
        };
        for s in stations {
            if from.is_some_and(|f| Arc::ptr_eq(f, &s)) {
                continue;
            }
            let mut g = s.lock().unwrap_or_else(|p| p.into_inner());
            for f in &frames {
                let copies = if g.roll() {
                    g.lies.frames += 1;
                    (g.rand() % 3) as usize
                } else {
                    1
                };
                for _ in 0..copies {
                    g.receive(f);
                }
            }
        }
    }
}

/// One NIC model on a [`Wire`]: the machine's memory, its PCI function and the NIC. Clones
/// share it.
#[derive(Clone)]
pub struct NicModel {
    nic: Arc<Mutex<Nic>>,
    wire: Wire,
}

impl NicModel {
    /// A NIC with `personality` and `mac` on `wire`.
    pub fn new(wire: &Wire, personality: impl Personality + 'static, mac: [u8; 6]) -> Self {
        let nic = Arc::new(Mutex::new(Nic::new(Box::new(personality), mac)));
        wire.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stations
            .push(Arc::downgrade(&nic));
        NicModel {
            nic,
            wire: wire.clone(),
        }
    }

    /// An igb (82576) on `wire`.
    pub fn igb(wire: &Wire, mac: [u8; 6]) -> Self {
        Self::new(wire, Igb, mac)
    }

    /// An e1000e (82574) on `wire`.
    pub fn e1000e(wire: &Wire, mac: [u8; 6]) -> Self {
        Self::new(wire, E1000e, mac)
    }

    fn lock(&self) -> MutexGuard<'_, Nic> {
        self.nic.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The family's name.
    pub fn name(&self) -> &'static str {
        self.lock().p.name()
    }

    /// The NIC's PCI address.
    pub fn address() -> PciAddress {
        PciAddress::new(0, NIC_ADDRESS.0, NIC_ADDRESS.1, NIC_ADDRESS.2)
    }

    /// Makes the NIC hostile from now on (honest again with `None`).
    pub fn set_hostile(&self, h: Option<NicHostile>) {
        self.lock().liar = h.map(|h| (Rng::new(h.seed), h));
    }

    /// Plugs or pulls the cable: link status follows.
    pub fn set_cable(&self, on: bool) {
        let mut g = self.lock();
        g.cable = on;
        if !on {
            g.regs[STATUS / 4] &= !STATUS_LU;
        } else if g.p.link_after_reset() {
            g.regs[STATUS / 4] |= STATUS_LU;
        }
    }

    /// Makes the reset bit read back set from now on (a reset that never completes), or not.
    pub fn set_stuck_reset(&self, stuck: bool) {
        self.lock().stuck_reset = stuck;
    }

    /// What the liar told so far.
    pub fn lies(&self) -> Lies {
        self.lock().lies
    }

    /// What the NIC did so far.
    pub fn counters(&self) -> NicCounters {
        self.lock().counters
    }

    /// The value of the register at byte `offset` of BAR 0 (no side effects).
    pub fn reg(&self, offset: usize) -> u32 {
        self.lock().regs[offset / 4 % REGS]
    }

    /// The MSI-X messages sent since the last call.
    pub fn take_msi(&self) -> Vec<(u64, u32)> {
        std::mem::take(&mut self.lock().msi)
    }

    /// DMA pages allocated and not returned.
    pub fn outstanding_pages(&self) -> usize {
        self.lock().mem.outstanding_pages()
    }

    /// Memory the driver asked the NIC to reach that it did not own, and damaged guard
    /// pages.
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
}

// SAFETY: DMA blocks come from the model's `Memory` (zeroed, with distinct "physical"
// addresses, handed out once); MMIO windows are the model's own registers, bounds-checked.
unsafe impl Hal for NicModel {
    type Mmio = NicMmio;

    fn dma_alloc(&self, pages: usize) -> Result<DmaBlock, DmaError> {
        self.lock().mem.alloc(pages)
    }

    unsafe fn dma_dealloc(&self, block: DmaBlock) {
        let mut g = self.lock();
        if let Err(e) = g.mem.free(block) {
            g.violations.push(e);
        }
    }

    unsafe fn map_mmio(&self, paddr: u64, size: usize) -> Option<NicMmio> {
        let (window, base) = if (BAR0..BAR0 + BAR0_SIZE as u64).contains(&paddr) {
            (Window::Regs, paddr - BAR0)
        } else if (MSIX_BAR..MSIX_BAR + MSIX_BAR_SIZE as u64).contains(&paddr) {
            (Window::Msix, paddr - MSIX_BAR)
        } else {
            return None;
        };
        let limit = match window {
            Window::Regs => BAR0_SIZE,
            Window::Msix => MSIX_BAR_SIZE,
        } as u64;
        (base + size as u64 <= limit).then(|| NicMmio {
            model: self.clone(),
            window,
            base: base as usize,
            size,
        })
    }

    fn seed(&self) -> u64 {
        0x5EED_1CE5
    }
}

impl ConfigRegionAccess for NicModel {
    unsafe fn read(&self, address: PciAddress, offset: u16) -> u32 {
        if address != Self::address() || offset >= 256 {
            return u32::MAX;
        }
        let g = self.lock();
        match offset & !3 {
            0x00 => 0x8086 | u32::from(g.p.device_id()) << 16,
            0x04 => u32::from(g.command) | 0x10 << 16,
            0x08 => 0x0200_0000,
            0x10 => BAR0 as u32,
            0x1C => MSIX_BAR as u32 | if g.p.msix_bar_64() { 0x4 } else { 0 },
            0x20 if g.p.msix_bar_64() => (MSIX_BAR >> 32) as u32,
            0x34 => 0x70,
            0x70 => {
                0x11 | u32::from(g.p.msix_vectors() - 1) << 16
                    | u32::from(g.msix_enable) << 31
                    | u32::from(g.msix_masked) << 30
            }
            0x74 => 3,
            0x78 => 3 | 0x2000,
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
            0x70 => {
                g.msix_enable = value & 1 << 31 != 0;
                g.msix_masked = value & 1 << 30 != 0;
            }
            _ => {}
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Window {
    Regs,
    Msix,
}

/// A mapped window of the NIC model: its registers (BAR 0) or its MSI-X table.
pub struct NicMmio {
    model: NicModel,
    window: Window,
    base: usize,
    size: usize,
}

// SAFETY: every access is checked against the window and the model's register file; no
// memory outside the model is reached.
unsafe impl Mmio for NicMmio {
    fn size(&self) -> usize {
        self.size
    }

    fn read32(&self, offset: usize) -> u32 {
        if !offset.is_multiple_of(4) || offset + 4 > self.size {
            return u32::MAX;
        }
        let at = self.base + offset;
        let mut g = self.model.lock();
        if g.command & 0x2 == 0 {
            return u32::MAX;
        }
        match self.window {
            Window::Regs => g.read(at),
            Window::Msix => g.msix_table.get(at / 4).copied().unwrap_or(0),
        }
    }

    fn write32(&self, offset: usize, value: u32) {
        if !offset.is_multiple_of(4) || offset + 4 > self.size {
            return;
        }
        let at = self.base + offset;
        let mut out = Vec::new();
        {
            let mut g = self.model.lock();
            if g.command & 0x2 == 0 {
                return;
            }
            match self.window {
                Window::Regs => g.write(at, value, &mut out),
                Window::Msix => {
                    if let Some(w) = g.msix_table.get_mut(at / 4) {
                        *w = value;
                    }
                }
            }
        }
        self.model.wire.deliver(Some(&self.model.nic), out);
    }
}
