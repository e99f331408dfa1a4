//! The model's PCI configuration space: a host bridge at 00:00.0, function 0 of slot 0x10 (a
//! vmxnet3 unless configured otherwise) and the PVRDMA at 00:10.1, with BARs that size as real
//! ones do (Q-MAIN `pvrdma_realize`, `docs/pvrdma.md` §1), and the PVRDMA's MSI-X
//! capability with its table and PBA in BAR0 (`docs/pvrdma.md` §13.2, §13.3).

use bareverbs_hal::PciAddress;

use crate::{Fn0, ModelConfig, Violations};

const _: () = assert!(PVRDMA.0 == 0 && PVRDMA.1 == 0x10 && PVRDMA.2 == 1);

/// Whether a function may answer at `a` on any machine the model builds (the host bridge, and
/// functions 0 and 1 of slot 0x10): a bus scan answers everything else without the lock.
pub(crate) fn may_exist(a: PciAddress) -> bool {
    a.segment() == 0 && a.bus() == 0 && matches!((a.device(), a.function()), (0, 0) | (0x10, 0 | 1))
}

struct Func {
    addr: (u8, u8, u8),
    cfg: [u32; 64],
    /// Size of each BAR (0: not implemented). A 64-bit BAR has its size in the low slot.
    bar_size: [u64; 6],
    bar64: [bool; 6],
}

impl Func {
    fn new(addr: (u8, u8, u8), vendor: u16, device: u16, class: u32, multi: bool) -> Self {
        let mut cfg = [0u32; 64];
        cfg[0] = u32::from(vendor) | (u32::from(device) << 16);
        cfg[2] = class << 8; // revision 0
        cfg[3] = if multi { 0x80 << 16 } else { 0 };
        Func {
            addr,
            cfg,
            bar_size: [0; 6],
            bar64: [false; 6],
        }
    }

    fn bar(mut self, i: usize, addr: u64, size: u64, is64: bool) -> Self {
        self.bar_size[i] = size;
        self.bar64[i] = is64;
        self.cfg[4 + i] = (addr as u32 & !0xF) | if is64 { 0x4 } else { 0 };
        if is64 {
            self.cfg[5 + i] = (addr >> 32) as u32;
        }
        self
    }

    fn decodes(&self) -> bool {
        self.cfg[1] & 0x2 != 0
    }
}

pub(crate) struct Pci {
    funcs: Vec<Func>,
    msix: Msix,
}

/// Where the PVRDMA's MSI-X capability sits in its configuration space (QEMU: 0x40, the only
/// capability).
pub(crate) const MSIX_CAP: u16 = 0x40;
/// MSI-X vectors of the PVRDMA: 0 command response, 1 async events, 2 CQ notification.
pub(crate) const MSIX_VECTORS: usize = 3;
/// Offset of the pending-bit array in BAR0.
pub(crate) const MSIX_PBA: usize = 0x2000;

/// The PVRDMA's MSI-X state as QEMU's `msix.c` keeps it: the table (address low, address
/// high, data, vector control per entry; entries reset masked), the pending bits, and the
/// messages sent, in order.
struct Msix {
    table: [[u32; 4]; MSIX_VECTORS],
    pba: u64,
    sent: Vec<(u64, u32)>,
    /// Messages the device raised while IMR was non-zero: dropped, not pending (QEMU).
    dropped_imr: u64,
    /// Messages that found bus mastering off: dropped silently, not pending (QEMU).
    dropped_bus_master: u64,
}

impl Msix {
    fn new() -> Self {
        Msix {
            table: [[0, 0, 0, 1]; MSIX_VECTORS],
            pba: 0,
            sent: Vec::new(),
            dropped_imr: 0,
            dropped_bus_master: 0,
        }
    }
}

const PVRDMA: (u8, u8, u8) = crate::PVRDMA_ADDRESS;

impl Pci {
    pub(crate) fn new(cfg: &ModelConfig) -> Self {
        let mut funcs = vec![Func::new((0, 0, 0), 0x8086, 0x29C0, 0x06_00_00, false)];
        match cfg.fn0 {
            Fn0::Vmxnet3 => funcs.push(
                Func::new((0, 0x10, 0), 0x15AD, 0x07B0, 0x02_00_00, true)
                    .bar(0, 0xFEB5_0000, 0x1000, false)
                    .bar(1, 0xFEB5_1000, 0x1000, false),
            ),
            Fn0::Other => funcs.push(
                Func::new((0, 0x10, 0), 0x8086, 0x100E, 0x02_00_00, true).bar(
                    0,
                    0xFEB6_0000,
                    0x2_0000,
                    false,
                ),
            ),
            Fn0::Absent => {}
        }
        let mut pvrdma = Func::new(PVRDMA, 0x15AD, 0x0820, 0x02_80_00, false)
            .bar(0, 0xFEB4_0000, 0x4000, false)
            .bar(1, 0xFEB4_4000, 0x100, false);
        pvrdma = if cfg.bar2_64bit {
            pvrdma.bar(2, 0x80_0000_0000, 0x80_0000, true)
        } else {
            pvrdma.bar(2, 0xFE00_0000, 0x80_0000, false)
        };
        pvrdma.cfg[11] = 0x1100_1AF4; // subsystem: QEMU's default
        pvrdma.cfg[15] = 0x0100; // interrupt pin INTA#
        // MSI-X, the only capability: status bit 4, the list at 0x34; 3 entries (N-1 = 2),
        // table at BAR0 + 0, PBA at BAR0 + 0x2000.
        pvrdma.cfg[1] |= 0x0010_0000;
        pvrdma.cfg[13] = u32::from(MSIX_CAP);
        let cap = usize::from(MSIX_CAP / 4);
        pvrdma.cfg[cap] = 0x0002_0011;
        pvrdma.cfg[cap + 1] = 0;
        pvrdma.cfg[cap + 2] = MSIX_PBA as u32;
        funcs.push(pvrdma);
        Pci {
            funcs,
            msix: Msix::new(),
        }
    }

    fn find(&self, a: PciAddress) -> Option<&Func> {
        let key = (a.bus(), a.device(), a.function());
        (a.segment() == 0).then_some(())?;
        self.funcs.iter().find(|f| f.addr == key)
    }

    fn pvrdma(&self) -> &Func {
        self.funcs
            .iter()
            .find(|f| f.addr == PVRDMA)
            .expect("pvrdma")
    }

    pub(crate) fn read(&self, a: PciAddress, offset: u16) -> u32 {
        match self.find(a) {
            Some(f) if offset < 256 => f.cfg[usize::from(offset / 4)],
            _ => u32::MAX,
        }
    }

    pub(crate) fn write(&mut self, a: PciAddress, offset: u16, value: u32, v: &mut Violations) {
        let key = (a.bus(), a.device(), a.function());
        if key == PVRDMA && a.segment() == 0 && offset / 4 == MSIX_CAP / 4 {
            // Message Control: only Enable (bit 15) and Function Mask (bit 14) are writable;
            // ID, next pointer and the table size stay. Unmasking the function sends what is
            // pending.
            let was = self.msix_unmasked();
            let f = self.pvrdma_mut();
            let i = usize::from(MSIX_CAP / 4);
            f.cfg[i] = (f.cfg[i] & !0xC000_0000) | (value & 0xC000_0000);
            if !was && self.msix_unmasked() {
                for v in 0..MSIX_VECTORS {
                    self.deliver_if_pending(v);
                }
            }
            return;
        }
        let Some(f) = self
            .funcs
            .iter_mut()
            .find(|f| f.addr == key && a.segment() == 0)
        else {
            return;
        };
        let idx = usize::from(offset / 4);
        match idx {
            1 => f.cfg[1] = (f.cfg[1] & 0xFFFF_0000) | (value & 0xFFFF),
            4..=9 => {
                let bar = idx - 4;
                if value == u32::MAX && f.decodes() && f.bar_size[bar] != 0 {
                    v.qemu(
                        crate::hostile::point::PCI,
                        format!("BAR{bar} of {:?} sized with memory decoding on", f.addr),
                    );
                }
                if f.bar_size[bar] != 0 {
                    let mask = !(f.bar_size[bar] - 1) as u32 & !0xF;
                    f.cfg[idx] = (value & mask) | if f.bar64[bar] { 0x4 } else { 0 };
                } else if bar > 0 && f.bar64[bar - 1] {
                    f.cfg[idx] = value & !((f.bar_size[bar - 1] - 1) >> 32) as u32;
                }
            }
            _ => {}
        }
    }

    fn pvrdma_mut(&mut self) -> &mut Func {
        self.funcs
            .iter_mut()
            .find(|f| f.addr == PVRDMA)
            .expect("pvrdma")
    }

    /// MSI-X Message Control of the PVRDMA.
    fn msix_control(&self) -> u16 {
        (self.pvrdma().cfg[usize::from(MSIX_CAP / 4)] >> 16) as u16
    }

    /// MSI-X enabled and the function not masked.
    pub(crate) fn msix_unmasked(&self) -> bool {
        self.msix_control() & 0xC000 == 0x8000
    }

    /// The device raises MSI-X `vector` (QEMU's `post_interrupt`: nothing at all while IMR is
    /// non-zero; `msix_notify`: pending while disabled, function-masked or entry-masked).
    pub(crate) fn msix_notify(&mut self, vector: usize, imr: u32) {
        if vector >= MSIX_VECTORS {
            return;
        }
        if imr != 0 {
            self.msix.dropped_imr += 1;
            return;
        }
        if !self.msix_unmasked() || self.msix.table[vector][3] & 1 != 0 {
            self.msix.pba |= 1 << vector;
            return;
        }
        self.send(vector);
    }

    fn send(&mut self, vector: usize) {
        if !self.pvrdma_bus_master() {
            self.msix.dropped_bus_master += 1;
            return;
        }
        let e = self.msix.table[vector];
        self.msix
            .sent
            .push((u64::from(e[0]) | u64::from(e[1]) << 32, e[2]));
    }

    /// A pending vector whose entry and function are now unmasked: cleared and sent.
    fn deliver_if_pending(&mut self, vector: usize) {
        if self.msix.pba & (1 << vector) != 0
            && self.msix_unmasked()
            && self.msix.table[vector][3] & 1 == 0
        {
            self.msix.pba &= !(1 << vector);
            self.send(vector);
        }
    }

    /// A 32-bit read of BAR0: the MSI-X table, or the PBA (other offsets read 0).
    pub(crate) fn bar0_read(&self, offset: usize) -> u32 {
        match offset {
            o if o < MSIX_VECTORS * 16 => self.msix.table[o / 16][o % 16 / 4],
            MSIX_PBA => self.msix.pba as u32,
            o if o == MSIX_PBA + 4 => (self.msix.pba >> 32) as u32,
            _ => 0,
        }
    }

    /// A 32-bit write to BAR0: the MSI-X table (address low bits 1:0 read as zero, vector
    /// control bit 0 only); the PBA and everything else ignore writes.
    pub(crate) fn bar0_write(&mut self, offset: usize, value: u32) {
        if offset >= MSIX_VECTORS * 16 {
            return;
        }
        let (v, word) = (offset / 16, offset % 16 / 4);
        self.msix.table[v][word] = match word {
            0 => value & !3,
            3 => value & 1,
            _ => value,
        };
        if word == 3 {
            self.deliver_if_pending(v);
        }
    }

    /// The messages sent since the last call: (address, data), in order.
    pub(crate) fn take_msi(&mut self) -> Vec<(u64, u32)> {
        std::mem::take(&mut self.msix.sent)
    }

    /// (pending bits, dropped while IMR was set, dropped with bus mastering off).
    pub(crate) fn msix_stats(&self) -> (u64, u64, u64) {
        (
            self.msix.pba,
            self.msix.dropped_imr,
            self.msix.dropped_bus_master,
        )
    }

    pub(crate) fn pvrdma_bar(&self, bar: usize) -> u64 {
        let f = self.pvrdma();
        let lo = u64::from(f.cfg[4 + bar] & !0xF);
        if f.bar64[bar] {
            lo | (u64::from(f.cfg[5 + bar]) << 32)
        } else {
            lo
        }
    }

    pub(crate) fn pvrdma_bar_size(&self, bar: usize) -> u64 {
        self.pvrdma().bar_size[bar]
    }

    /// Hostile: the MSI-X capability's Table dword names BAR `bir` at `offset` (the table
    /// itself stays in BAR0: a driver that believes the dword writes elsewhere).
    pub(crate) fn set_msix_table(&mut self, bir: u8, offset: u32) {
        let cap = usize::from(MSIX_CAP / 4);
        self.pvrdma_mut().cfg[cap + 1] = (offset & !7) | u32::from(bir & 7);
    }

    pub(crate) fn pvrdma_command(&self) -> u16 {
        self.pvrdma().cfg[1] as u16
    }

    pub(crate) fn pvrdma_decodes(&self) -> bool {
        self.pvrdma().decodes()
    }

    pub(crate) fn pvrdma_bus_master(&self) -> bool {
        self.pvrdma().cfg[1] & 0x4 != 0
    }
}
