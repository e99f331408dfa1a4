//! The PVRDMA device proper: registers, shared-region load, command execution with QEMU's
//! validation (Q-MAIN, Q-CMD, Q-RM; `shared/pvrdma-abi.md` §2–§6, §11).

use crate::mem::Memory;
use crate::{Garbage, ModelConfig};

pub(crate) const EIO: u32 = 5;
pub(crate) const ENOMEM: u32 = 12;
pub(crate) const EINVAL: u32 = 22;

const REG_VERSION: usize = 0x00;
const REG_DSR_LOW: usize = 0x04;
const REG_DSR_HIGH: usize = 0x08;
const REG_CTL: usize = 0x0C;
const REG_REQUEST: usize = 0x10;
const REG_ERR: usize = 0x14;

const DSR_SIZE: usize = 280;
const CMD_SIZE: usize = 184;
const RESP_SIZE: usize = 176;
const CAPS: u64 = 0x48;
/// QEMU's per-ring page limit for CQs, QPs and SRQs (ring-state page included).
pub(crate) const MAX_CHUNKS: u32 = 128;
const PAGE: u64 = 4096;

/// What the model needs from the machine while it acts.
pub(crate) struct Ctx<'a> {
    pub(crate) cfg: &'a ModelConfig,
    pub(crate) mem: &'a mut Memory,
    pub(crate) violations: &'a mut Vec<String>,
    pub(crate) bus_master: bool,
}

impl Ctx<'_> {
    fn rd(&mut self, pa: u64, len: usize) -> Option<Vec<u8>> {
        let r = self.mem.read(pa, len);
        if r.is_none() {
            self.violations.push(format!(
                "device read of unallocated memory {pa:#x} (+{len})"
            ));
        }
        r
    }

    fn rd64(&mut self, pa: u64) -> Option<u64> {
        self.rd(pa, 8).map(|b| le64(&b, 0))
    }

    fn wr(&mut self, pa: u64, bytes: &[u8]) {
        if !self.mem.write(pa, bytes) {
            self.violations.push(format!(
                "device write to unallocated memory {pa:#x} (+{})",
                bytes.len()
            ));
        }
    }

    /// Maps `n` pages through a page directory as QEMU does for rings: only `dir[0]` is used;
    /// every entry must name allocated memory. Returns the page addresses.
    pub(crate) fn map_pdir(&mut self, pdir: u64, n: u32) -> Option<Vec<u64>> {
        if pdir == 0 {
            return None;
        }
        let table = self.rd64(pdir)?;
        if table == 0 {
            self.violations.push("page directory entry 0 is 0".into());
            return None;
        }
        let mut pages = Vec::with_capacity(n as usize);
        for i in 0..u64::from(n) {
            let pa = self.rd64(table + 8 * i)?;
            if pa == 0 {
                self.violations.push(format!("page table entry {i} is 0"));
                return None;
            }
            self.rd(pa, PAGE as usize)?;
            pages.push(pa);
        }
        Some(pages)
    }
}

pub(crate) fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

pub(crate) fn le64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

pub(crate) fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

#[derive(Clone, Copy)]
pub(crate) struct Loaded {
    pub(crate) dsr: u64,
    cmd: u64,
    resp: u64,
}

struct Cq {
    pages: Vec<u64>,
}

/// Live objects in the device's tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectCounts {
    pub pds: usize,
    pub cqs: usize,
    pub gids: usize,
}

pub(crate) struct Device {
    pub(crate) regs: [u32; 64],
    pub(crate) loaded: Option<Loaded>,
    pub(crate) active: bool,
    pub(crate) dsr_written: Option<Vec<u8>>,
    ring_pages: Vec<u64>,
    pds: Vec<bool>,
    cqs: Vec<Option<Cq>>,
    pub(crate) gids: Vec<Option<[u8; 16]>>,
    pub(crate) commands: u64,
    pub(crate) fail_at: Option<(u64, u32)>,
    pub(crate) silent: bool,
    pub(crate) garbage: Option<Garbage>,
    pub(crate) reject_next: bool,
    pub(crate) doorbells: Vec<(usize, u32)>,
}

/// Lowest free slot of a table of `cap` entries, or a violation: QEMU's allocator would have
/// written past its table (`shared/pvrdma-abi.md` §11).
fn alloc_slot<T>(
    table: &mut Vec<Option<T>>,
    cap: u32,
    what: &str,
    v: &mut Vec<String>,
) -> Option<usize> {
    if let Some(i) = table.iter().position(Option::is_none) {
        return Some(i);
    }
    if table.len() < cap as usize {
        table.push(None);
        return Some(table.len() - 1);
    }
    v.push(format!(
        "{what} table overflow: QEMU would corrupt its heap ({cap} entries)"
    ));
    None
}

impl Device {
    pub(crate) fn new(cfg: &ModelConfig) -> Self {
        let mut regs = [0u32; 64];
        regs[REG_VERSION / 4] = cfg.version;
        regs[REG_ERR / 4] = 0xFFFF;
        Device {
            regs,
            loaded: None,
            active: false,
            dsr_written: None,
            ring_pages: Vec::new(),
            pds: Vec::new(),
            cqs: Vec::new(),
            gids: vec![None; 255],
            commands: 0,
            fail_at: None,
            silent: false,
            garbage: None,
            reject_next: false,
            doorbells: Vec::new(),
        }
    }

    pub(crate) fn counts(&self) -> ObjectCounts {
        ObjectCounts {
            pds: self.pds.iter().filter(|&&b| b).count(),
            cqs: self.cqs.iter().flatten().count(),
            gids: self.gids.iter().flatten().count(),
        }
    }

    /// Page ranges the device still uses (and may write): rings of live objects, and the
    /// shared region with its slots and notification rings while active.
    pub(crate) fn pages_in_use(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = Vec::new();
        let mut add = |pa: u64| v.push((pa, pa + PAGE));
        for cq in self.cqs.iter().flatten() {
            cq.pages.iter().copied().for_each(&mut add);
        }
        if let (Some(l), true) = (self.loaded, self.active) {
            for pa in [l.dsr, l.cmd, l.resp] {
                add(pa & !(PAGE - 1));
            }
            self.ring_pages.iter().copied().for_each(&mut add);
        }
        v
    }

    pub(crate) fn reg_read(&self, offset: usize) -> u32 {
        self.regs.get(offset / 4).copied().unwrap_or(u32::MAX)
    }

    pub(crate) fn reg_write(&mut self, ctx: &mut Ctx<'_>, offset: usize, value: u32) {
        if offset / 4 >= self.regs.len() {
            return;
        }
        if offset == REG_VERSION {
            ctx.violations.push("VERSION register overwritten".into());
        }
        self.regs[offset / 4] = value;
        match offset {
            REG_DSR_HIGH => self.load_dsr(ctx),
            REG_CTL => match value {
                0 => {
                    self.active = true;
                    self.regs[REG_ERR / 4] = ctx.cfg.activate_err;
                }
                2 => self.active = false,
                _ => {}
            },
            REG_REQUEST if value == 0 => self.exec(ctx),
            _ => {}
        }
    }

    pub(crate) fn doorbell(&mut self, _ctx: &mut Ctx<'_>, offset: usize, value: u32) {
        self.doorbells.push((offset & 0xFFF, value));
    }

    fn load_dsr(&mut self, ctx: &mut Ctx<'_>) {
        self.loaded = None;
        self.ring_pages.clear();
        if !ctx.bus_master {
            ctx.violations
                .push("DSRHIGH written with bus mastering off".into());
            return;
        }
        if ctx.cfg.refuse_dsr {
            return;
        }
        let dsr =
            u64::from(self.regs[REG_DSR_LOW / 4]) | u64::from(self.regs[REG_DSR_HIGH / 4]) << 32;
        if dsr == 0 {
            return;
        }
        let Some(bytes) = ctx.rd(dsr, DSR_SIZE) else {
            return;
        };
        self.dsr_written = Some(bytes.clone());
        let (cmd, resp) = (le64(&bytes, 0x10), le64(&bytes, 0x18));
        if cmd == 0
            || resp == 0
            || ctx.rd(cmd, CMD_SIZE).is_none()
            || ctx.rd(resp, RESP_SIZE).is_none()
        {
            return;
        }
        // CQ-notification ring first, then the async ring, as QEMU maps them.
        let mut ring_pages = Vec::new();
        for (num_off, pdir_off) in [(0x30, 0x38), (0x20, 0x28)] {
            let n = le32(&bytes, num_off);
            if !(1..=511).contains(&n) {
                return;
            }
            let Some(pages) = ctx.map_pdir(le64(&bytes, pdir_off), n) else {
                return;
            };
            for &pa in &pages[1..] {
                ctx.wr(pa, &[0u8; PAGE as usize]);
            }
            ring_pages.extend(pages);
        }
        self.ring_pages = ring_pages;

        // Capabilities, written in place; fields QEMU does not write keep the driver's bytes.
        let cfg = ctx.cfg;
        let c = &cfg.caps;
        let mut caps = bytes[CAPS as usize..].to_vec();
        put64(&mut caps, 0x00, 14);
        let m = cfg.mac;
        caps[0x08..0x10].copy_from_slice(&[m[0] ^ 2, m[1], m[2], 0xFF, 0xFE, m[3], m[4], m[5]]);
        put64(&mut caps, 0x10, 0);
        put64(&mut caps, 0x18, c.max_mr_size);
        for (off, v) in [
            (0x4C, c.max_qp),
            (0x50, c.max_qp_wr),
            (0x58, c.max_sge),
            (0x60, c.max_cq),
            (0x64, c.max_cqe),
            (0x68, c.max_mr),
            (0x6C, c.max_pd),
            (0xA4, c.max_ah),
            (0xB0, c.max_srq),
            (0xB4, c.max_srq_wr),
            (0xB8, c.max_srq_sge),
            (0xBC, 0x20_0000),
            (0xC0, c.gid_tbl_len),
        ] {
            put32(&mut caps, off, v);
        }
        caps[0xC4..0xC6].copy_from_slice(&1u16.to_le_bytes());
        caps[0xC7] = c.phys_port_cnt;
        caps[0xC8] = c.mode;
        caps[0xCB] |= c.gid_types;
        ctx.wr(dsr + CAPS, &caps);
        self.loaded = Some(Loaded { dsr, cmd, resp });
    }

    fn exec(&mut self, ctx: &mut Ctx<'_>) {
        if self.silent {
            return;
        }
        self.commands += 1;
        let Some(l) = self
            .loaded
            .filter(|_| !std::mem::take(&mut self.reject_next))
        else {
            self.regs[REG_ERR / 4] = 0xFFFF;
            return;
        };
        let Some(req) = ctx.rd(l.cmd, CMD_SIZE) else {
            return;
        };
        let cmd = le32(&req, 8);
        // RESIZE_CQ has no handler; MODIFY_SRQ and QUERY_SRQ are swapped in QEMU's table.
        let ack = match cmd {
            7 | 21.. => {
                self.regs[REG_ERR / 4] = 0xFFFF;
                return;
            }
            18 => 0x8000_0013,
            19 => 0x8000_0012,
            c => 0x8000_0000 | c,
        };
        let mut resp = vec![0u8; RESP_SIZE];
        let rc = match self.fail_at {
            Some((n, errno)) if n == self.commands => {
                self.fail_at = None;
                Err(errno)
            }
            _ => self.handle(ctx, cmd, &req, &mut resp),
        };
        resp[0..8].copy_from_slice(&req[0..8]);
        put32(&mut resp, 8, ack);
        resp[12] = rc.err().unwrap_or(0) as u8;
        match self.garbage.take() {
            Some(Garbage::Everything) => resp.fill(0xA5),
            Some(Garbage::Payload) => resp[16..].fill(0xA5),
            None => {}
        }
        ctx.wr(l.resp, &resp);
        self.regs[REG_ERR / 4] = match rc {
            Ok(()) => 0,
            Err(errno) => errno.wrapping_neg(),
        };
    }

    fn handle(
        &mut self,
        ctx: &mut Ctx<'_>,
        cmd: u32,
        req: &[u8],
        resp: &mut [u8],
    ) -> Result<(), u32> {
        let caps = ctx.cfg.caps;
        match cmd {
            0 => {
                // QUERY_PORT
                if req[0x10] > 1 {
                    return Err(EINVAL);
                }
                let state = if ctx.cfg.port_active { 4 } else { 1 };
                for (off, v) in [
                    (0x10, state),
                    (0x14, 5),
                    (0x18, 3),
                    (0x1C, 255),
                    (0x20, 0),
                    (0x24, 1024),
                ] {
                    put32(resp, off, v);
                }
                resp[0x30..0x32].copy_from_slice(&1u16.to_le_bytes());
                resp[0x3B] = 1; // active_width 1X
                resp[0x3C] = 1; // active_speed SDR
                resp[0x3D] = 5; // phys_state LinkUp
                Ok(())
            }
            1 => {
                // QUERY_PKEY
                if req[0x10] > 1 || req[0x11] > 1 {
                    return Err(EINVAL);
                }
                resp[0x10..0x12].copy_from_slice(&0xFFFFu16.to_le_bytes());
                Ok(())
            }
            2 => {
                // CREATE_PD
                let mut table: Vec<Option<()>> =
                    self.pds.iter().map(|&b| b.then_some(())).collect();
                let slot =
                    alloc_slot(&mut table, caps.max_pd, "PD", ctx.violations).ok_or(ENOMEM)?;
                if slot == self.pds.len() {
                    self.pds.push(true);
                } else {
                    self.pds[slot] = true;
                }
                put32(resp, 0x10, slot as u32);
                Ok(())
            }
            3 => {
                // DESTROY_PD: always succeeds
                if let Some(p) = self.pds.get_mut(le32(req, 0x10) as usize) {
                    *p = false;
                }
                Ok(())
            }
            6 => self.create_cq(ctx, req, resp),
            8 => {
                // DESTROY_CQ
                let h = le32(req, 0x10) as usize;
                match self.cqs.get_mut(h) {
                    Some(slot @ Some(_)) => {
                        *slot = None;
                        Ok(())
                    }
                    _ => Err(EINVAL),
                }
            }
            15 => {
                // CREATE_BIND
                let index = le32(req, 0x18) as usize;
                if index >= 255 {
                    return Err(EINVAL);
                }
                self.gids[index] = Some(req[0x1C..0x2C].try_into().expect("16 bytes"));
                Ok(())
            }
            16 => {
                // DESTROY_BIND
                let index = le32(req, 0x10) as usize;
                if index >= 255 {
                    return Err(EINVAL);
                }
                self.gids[index] = None;
                Ok(())
            }
            other => {
                ctx.violations
                    .push(format!("command {other} is not modelled"));
                Err(EINVAL)
            }
        }
    }

    fn create_cq(&mut self, ctx: &mut Ctx<'_>, req: &[u8], resp: &mut [u8]) -> Result<(), u32> {
        let pdir = le64(req, 0x10);
        let cqe = le32(req, 0x1C);
        let nchunks = le32(req, 0x20);
        if nchunks == 0 || nchunks > MAX_CHUNKS {
            return Err(EINVAL);
        }
        let pages = ctx.map_pdir(pdir, nchunks).ok_or(EINVAL)?;
        if cqe == 0 || cqe > ctx.cfg.caps.max_cqe {
            return Err(EIO); // the host refuses to create the CQ
        }
        if !cqe.is_power_of_two() || u64::from(nchunks - 1) * PAGE < u64::from(cqe) * 64 {
            ctx.violations.push(format!(
                "CQ of {cqe} entries in {} data pages: QEMU would index out of bounds",
                nchunks - 1
            ));
        }
        let max = ctx.cfg.caps.max_cq;
        let slot = alloc_slot(&mut self.cqs, max, "CQ", ctx.violations).ok_or(ENOMEM)?;
        self.cqs[slot] = Some(Cq { pages });
        put32(resp, 0x10, slot as u32);
        put32(resp, 0x14, cqe);
        Ok(())
    }
}
