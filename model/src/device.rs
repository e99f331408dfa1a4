//! The PVRDMA device proper: registers, shared-region load, command execution with QEMU's
//! validation (Q-MAIN, Q-CMD, Q-RM; `docs/pvrdma.md` §2–§6, §11).

use crate::datapath::{Mr, QpData, RingGeo, SrqData};
use crate::hostile::{Liar, point};
use crate::mem::Memory;
use crate::{Garbage, ModelConfig, Semantics, Violations};

pub(crate) const EIO: u32 = 5;
pub(crate) const ENOMEM: u32 = 12;
pub(crate) const EINVAL: u32 = 22;
const EOPNOTSUPP: u32 = 95;
/// Marks an errno that QEMU passes through from a host verbs call as is (positive in ERR).
const HOST_ERRNO: u32 = 1 << 31;
/// The attribute-mask bits the host's verbs know (IB_QP_STATE … IB_QP_DEST_QPN).
const STANDARD_QP_ATTR_MASK: u32 = (1 << 21) - 1;

const REG_VERSION: usize = 0x00;
const REG_DSR_LOW: usize = 0x04;
const REG_DSR_HIGH: usize = 0x08;
const REG_CTL: usize = 0x0C;
const REG_REQUEST: usize = 0x10;
const REG_ERR: usize = 0x14;

const DSR_SIZE: usize = 280;
const CMD_SIZE: usize = 184;
const RESP_SIZE: usize = 176;
/// Bytes of response payload (after the 16-byte header) each command has (§5.3): what a
/// hostile device garbles.
const RESP_PAYLOAD: [usize; 21] = [
    48,  // QUERY_PORT
    8,   // QUERY_PKEY
    8,   // CREATE_PD
    0,   // DESTROY_PD
    16,  // CREATE_MR
    0,   // DESTROY_MR
    8,   // CREATE_CQ
    8,   // RESIZE_CQ
    0,   // DESTROY_CQ
    32,  // CREATE_QP (v2: qpn, qp_handle, five caps, pad)
    0,   // MODIFY_QP
    160, // QUERY_QP
    8,   // DESTROY_QP
    8,   // CREATE_UC
    0,   // DESTROY_UC
    0,   // CREATE_BIND
    0,   // DESTROY_BIND
    8,   // CREATE_SRQ
    0,   // MODIFY_SRQ
    16,  // QUERY_SRQ
    0,   // DESTROY_SRQ
];
/// Capability fields of the shared region (offset from the caps, width): every one a hostile
/// device may misreport.
const CAPS_FIELDS: [(usize, usize); 51] = {
    let mut f = [(0, 0); 51];
    let mut i = 0;
    while i < 6 {
        f[i] = (8 * i, 8);
        i += 1;
    }
    // 0x30..0xC4: u32 fields.
    while i < 6 + 37 {
        f[i] = (0x30 + 4 * (i - 6), 4);
        i += 1;
    }
    f[i] = (0xC4, 2);
    i += 1;
    // local_ca_ack_delay, phys_port_cnt, mode, atomic_ops, bmme_flags, gid_types.
    while i < 6 + 37 + 1 + 6 {
        f[i] = (0xC6 + (i - 44), 1);
        i += 1;
    }
    f[i] = (0xCC, 4);
    assert!(i == 50);
    f
};
const CAPS: u64 = 0x48;
/// QEMU's per-ring page limit for CQs, QPs and SRQs (ring-state page included).
pub(crate) const MAX_CHUNKS: u32 = 128;
const PAGE: u64 = 4096;

/// What the model needs from the machine while it acts.
pub(crate) struct Ctx<'a> {
    pub(crate) cfg: &'a ModelConfig,
    pub(crate) mem: &'a mut Memory,
    pub(crate) violations: &'a mut Violations,
    pub(crate) liar: &'a mut Liar,
    pub(crate) bus_master: bool,
    /// MSI-X enabled and the function unmasked: QEMU's completion thread then raises
    /// interrupts, which take its global lock.
    pub(crate) msix_live: bool,
}

impl Ctx<'_> {
    fn rd(&mut self, pa: u64, len: usize) -> Option<Vec<u8>> {
        let r = self.mem.read(pa, len);
        if r.is_none() {
            self.violations.memory(format!(
                "device read of unallocated memory {pa:#x} (+{len})"
            ));
        }
        r
    }

    /// Like `rd`, without copying.
    fn check(&mut self, pa: u64, len: usize) -> Option<()> {
        if self.mem.contains(pa, len) {
            return Some(());
        }
        self.violations.memory(format!(
            "device read of unallocated memory {pa:#x} (+{len})"
        ));
        None
    }

    fn rd64(&mut self, pa: u64) -> Option<u64> {
        let r = self.mem.read_u64(pa);
        if r.is_none() {
            self.violations
                .memory(format!("device read of unallocated memory {pa:#x} (+8)"));
        }
        r
    }

    fn wr(&mut self, pa: u64, bytes: &[u8]) {
        if !self.mem.write(pa, bytes) {
            self.violations.memory(format!(
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
            self.violations.memory("page directory entry 0 is 0");
            return None;
        }
        let mut pages = Vec::with_capacity(n as usize);
        for i in 0..u64::from(n) {
            let pa = self.rd64(table.wrapping_add(8 * i))?;
            if pa == 0 {
                self.violations.memory(format!("page table entry {i} is 0"));
                return None;
            }
            self.check(pa, PAGE as usize)?;
            pages.push(pa);
        }
        Some(pages)
    }
}

impl Ctx<'_> {
    /// Maps `n` pages through every table of a page directory (memory regions, §6).
    pub(crate) fn map_pdir_multi(&mut self, pdir: u64, n: u32) -> Option<Vec<u64>> {
        if pdir == 0 {
            return None;
        }
        let mut pages = Vec::with_capacity(n as usize);
        for i in 0..u64::from(n) {
            let table = self.rd64(pdir.wrapping_add(8 * (i >> 9)))?;
            let pa = self.rd64(table.wrapping_add(8 * (i & 511)))?;
            if pa == 0 {
                self.violations
                    .memory(format!("MR page table entry {i} is 0"));
                return None;
            }
            self.check(pa, PAGE as usize)?;
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

/// `pages` as runs of contiguous memory, (start, end): what a free is checked against.
pub(crate) fn spans(pages: &[u64]) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = Vec::new();
    for &pa in pages {
        match v.last_mut() {
            Some(last) if last.1 == pa => last.1 += PAGE,
            _ => v.push((pa, pa.saturating_add(PAGE))),
        }
    }
    v
}

pub(crate) struct Cq {
    pub(crate) pages: Vec<u64>,
    spans: Vec<(u64, u64)>,
    pub(crate) cqe: u32,
    pub(crate) armed: bool,
}

impl Cq {
    /// Where CQE `index` (masked to a slot) lies: 64 CQEs a page after the ring-state page.
    /// None when the ring's pages do not reach that far (a violation at create).
    pub(crate) fn cqe_addr(&self, index: u32) -> Option<u64> {
        let slot = u64::from(index & (self.cqe - 1));
        Some(self.pages.get(1 + (slot / 64) as usize)? + (slot % 64) * 64)
    }
}

/// A queue pair as the model keeps it: QEMU's record (`state`) and the host QP behind it
/// (`host_state`, `qkey`, PSNs…), which only INIT/RTR/RTS reach (§8.3).
pub(crate) struct Qp {
    pub(crate) qpn: u32,
    pub(crate) qp_type: u8,
    pub(crate) pd: u32,
    pub(crate) scq: u32,
    pub(crate) rcq: u32,
    pub(crate) srq: Option<u32>,
    spans: Vec<(u64, u64)>,
    pub(crate) data: QpData,
    pub(crate) state: u32,
    pub(crate) host_state: u32,
    pub(crate) qkey: u32,
    pub(crate) sq_psn: u32,
    pub(crate) rq_psn: u32,
    pub(crate) dest_qpn: u32,
    pub(crate) sgid_index: u8,
    pub(crate) dgid: [u8; 16],
    pub(crate) caps: [u32; 5],
    pub(crate) sq_sig_all: bool,
    /// The remote access rights the last modify gave (`qp_access_flags`), which
    /// `Semantics::Verbs` enforces on incoming WRITEs, READs and atomics.
    pub(crate) access: u32,
    /// The READs and atomics the QP accepts (`max_dest_rd_atomic`): with 0,
    /// `Semantics::Verbs` refuses every incoming READ as an invalid request.
    pub(crate) max_dest_rd_atomic: u8,
    /// The path MTU the last modify gave (IB code: 1 is 256 bytes … 5 is 4096; 0 unset):
    /// where a message is one packet, which decides what rxe checks first.
    pub(crate) path_mtu: u32,
}

pub(crate) struct Srq {
    pd: u32,
    spans: Vec<(u64, u64)>,
    pub(crate) data: SrqData,
    /// The armed limit (0: not armed): SRQ_LIMIT_REACHED when fewer receives are posted.
    pub(crate) limit: u32,
    max_sge: u32,
}

pub(crate) const QPT_SMI: u8 = 0;
pub(crate) const QPT_GSI: u8 = 1;
pub(crate) const QPT_RC: u8 = 2;
pub(crate) const QPT_UD: u8 = 4;
const QPS_RESET: u32 = 0;
const QPS_INIT: u32 = 1;
const QPS_RTR: u32 = 2;
const QPS_RTS: u32 = 3;
/// The error state: under `Semantics::Verbs` an RC QP goes there on its own when a request
/// fails, as rxe and hardware do (`docs/pvrdma.md`).
pub(crate) const QPS_ERR: u32 = 6;
const MASK_STATE: u32 = 1 << 0;
const MASK_ACCESS: u32 = 1 << 3;
const MASK_QKEY: u32 = 1 << 6;
const MASK_PATH_MTU: u32 = 1 << 8;
const MASK_MAX_DEST_RD_ATOMIC: u32 = 1 << 17;

/// Live objects in the device's tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectCounts {
    pub pds: usize,
    pub cqs: usize,
    pub qps: usize,
    pub srqs: usize,
    pub mrs: usize,
    pub gids: usize,
}

pub(crate) struct Device {
    pub(crate) regs: [u32; 64],
    pub(crate) loaded: Option<Loaded>,
    pub(crate) active: bool,
    pub(crate) dsr_written: Option<Vec<u8>>,
    pub(crate) ring_pages: Vec<u64>,
    /// Pages of the CQ-notification ring at the start of `ring_pages` (the async ring's
    /// follow).
    pub(crate) notify_pages: usize,
    /// MSI-X vectors raised since the machine last delivered them (0 command, 1 async, 2 CQ).
    pub(crate) raised: Vec<usize>,
    /// Async events posted to the async ring.
    pub(crate) async_events: u64,
    pub(crate) pds: Vec<bool>,
    pub(crate) cqs: Vec<Option<Cq>>,
    pub(crate) qps: Vec<Option<Qp>>,
    pub(crate) srqs: Vec<Option<Srq>>,
    pub(crate) mrs: Vec<Option<Mr>>,
    next_qpn: u32,
    pub(crate) gids: Vec<Option<[u8; 16]>>,
    /// The MAD multiplexer the GSI QP sends through (`Model::attach_mux`).
    pub(crate) mux: Option<crate::datapath::gsi::Port>,
    pub(crate) commands: u64,
    pub(crate) fail_at: Option<(u64, u32)>,
    pub(crate) silent: bool,
    pub(crate) garbage: Option<Garbage>,
    pub(crate) reject_next: bool,
    /// The last response as the device computed it (a hostile device may replay it).
    last_resp: Option<Vec<u8>>,
    pub(crate) doorbells: u64,
    pub(crate) cqes: u64,
    pub(crate) interrupts: u64,
    /// CQEs posted while the CQ-notification ring was full (QEMU: "rdma: CQ is full").
    pub(crate) notify_ring_full: u64,
}

/// Lowest free slot of a table of `cap` entries, or a violation: QEMU's allocator would have
/// written past its table (`docs/pvrdma.md` §11).
pub(crate) fn alloc_slot<T>(
    table: &mut Vec<Option<T>>,
    cap: u32,
    what: &str,
    v: &mut Violations,
) -> Option<usize> {
    if let Some(i) = table.iter().position(Option::is_none) {
        return Some(i);
    }
    if table.len() < cap as usize {
        table.push(None);
        return Some(table.len() - 1);
    }
    // The driver counts against the caps: lied caps or outcomes rightly mislead it.
    v.qemu(
        point::CAPS | point::PROTOCOL,
        format!("{what} table overflow: QEMU would corrupt its heap ({cap} entries)"),
    );
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
            notify_pages: 0,
            raised: Vec::new(),
            async_events: 0,
            pds: Vec::new(),
            cqs: Vec::new(),
            qps: Vec::new(),
            srqs: Vec::new(),
            mrs: Vec::new(),
            next_qpn: 0x11,
            gids: vec![None; 255],
            commands: 0,
            fail_at: None,
            silent: false,
            garbage: None,
            reject_next: false,
            last_resp: None,
            doorbells: 0,
            cqes: 0,
            interrupts: 0,
            notify_ring_full: 0,
            mux: None,
        }
    }

    pub(crate) fn counts(&self) -> ObjectCounts {
        ObjectCounts {
            pds: self.pds.iter().filter(|&&b| b).count(),
            cqs: self.cqs.iter().flatten().count(),
            qps: self.qps.iter().flatten().count(),
            srqs: self.srqs.iter().flatten().count(),
            mrs: self.mrs.iter().flatten().count(),
            gids: self.gids.iter().flatten().count(),
        }
    }

    /// Page ranges the device still uses (and may write): rings of live objects, and the
    /// shared region with its slots and notification rings while active.
    pub(crate) fn pages_in_use(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = Vec::new();
        let objects = (self.cqs.iter().flatten().map(|c| &c.spans))
            .chain(self.qps.iter().flatten().map(|q| &q.spans))
            .chain(self.srqs.iter().flatten().map(|s| &s.spans))
            .chain(self.mrs.iter().flatten().map(|m| &m.spans));
        for spans in objects {
            v.extend_from_slice(spans);
        }
        let mut add = |pa: u64| v.push((pa, pa + PAGE));
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
            ctx.violations.qemu(0, "VERSION register overwritten");
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
            REG_REQUEST if value == 0 => {
                self.exec(ctx);
                // QEMU raises the command vector after every command, failed ones included.
                if !self.silent {
                    self.raised.push(0);
                }
            }
            _ => {}
        }
    }

    /// Posts an async event to the async ring as VMware's device does (QEMU never does):
    /// 8-byte elements (u32 type, u32 info), (pages − 1)·512 of them, indices modulo twice
    /// that, producer at +8 of the state page; then raises vector 1. False (nothing posted)
    /// when no ring is loaded, its indices are invalid, or it is full.
    pub(crate) fn post_async(&mut self, ctx: &mut Ctx<'_>, kind: u32, info: u32) -> bool {
        let Some(&state) = self.ring_pages.get(self.notify_pages) else {
            return false;
        };
        let data = &self.ring_pages[self.notify_pages + 1..];
        let slots = (data.len() * 512) as u32;
        if !slots.is_power_of_two() {
            return false;
        }
        let Some(b) = ctx.rd(state + 8, 8) else {
            return false;
        };
        let (p, q) = (le32(&b, 0), le32(&b, 4));
        if p >= 2 * slots || q >= 2 * slots || p == q ^ slots {
            return false;
        }
        let i = p & (slots - 1);
        let mut e = [0u8; 8];
        e[..4].copy_from_slice(&kind.to_le_bytes());
        e[4..].copy_from_slice(&info.to_le_bytes());
        ctx.wr(data[(i / 512) as usize] + u64::from(i % 512) * 8, &e);
        ctx.wr(state + 8, &((p + 1) & (2 * slots - 1)).to_le_bytes());
        self.async_events += 1;
        self.raised.push(1);
        true
    }

    /// Hostile: writes `handles` into the CQ-notification ring whatever its consumer says
    /// (overrunning it), sets its producer index to `prod` if given (else past the entries),
    /// and raises vector 2.
    pub(crate) fn notify_storm(&mut self, ctx: &mut Ctx<'_>, handles: &[u32], prod: Option<u32>) {
        let (Some(&state), Some(&data)) = (self.ring_pages.first(), self.ring_pages.get(1)) else {
            return;
        };
        let Some(b) = ctx.rd(state + 8, 4) else {
            return;
        };
        let mut p = le32(&b, 0);
        for h in handles {
            ctx.wr(data + u64::from(p & 1023) * 4, &h.to_le_bytes());
            p = p.wrapping_add(1) & 2047;
        }
        ctx.wr(state + 8, &prod.unwrap_or(p).to_le_bytes());
        self.raised.push(2);
    }

    fn load_dsr(&mut self, ctx: &mut Ctx<'_>) {
        self.loaded = None;
        self.ring_pages.clear();
        if !ctx.bus_master {
            ctx.violations
                .qemu(point::PCI, "DSRHIGH written with bus mastering off");
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
        let mut notify_pages = 0;
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
            if notify_pages == 0 {
                notify_pages = ring_pages.len();
            }
        }
        self.ring_pages = ring_pages;
        self.notify_pages = notify_pages;

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
        for (off, v) in [(0x70, c.rd_atom.0), (0x7C, c.rd_atom.1)] {
            if v != 0 {
                put32(&mut caps, off, v);
            }
        }
        caps[0xC4..0xC6].copy_from_slice(&1u16.to_le_bytes());
        caps[0xC7] = c.phys_port_cnt;
        caps[0xC8] = c.mode;
        caps[0xCB] |= c.gid_types;
        // Hostile: the region is not loaded at all, or one to four capability fields are
        // misreported.
        if ctx.liar.roll(point::CAPS) {
            if ctx.liar.below(8) == 0 {
                return;
            }
            for _ in 0..1 + ctx.liar.below(4) {
                let (off, width) = ctx.liar.pick(&CAPS_FIELDS);
                ctx.liar.mutate_field(&mut caps, off, width);
            }
        }
        ctx.wr(dsr + CAPS, &caps);
        self.loaded = Some(Loaded { dsr, cmd, resp });
    }

    fn exec(&mut self, ctx: &mut Ctx<'_>) {
        if self.silent {
            return;
        }
        self.commands += 1;
        // Hostile: no answer at all, the command not even run.
        if ctx.liar.roll(point::SILENCE) {
            return;
        }
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
        // RESIZE_CQ has no handler; MODIFY_SRQ and QUERY_SRQ are swapped in QEMU's table
        // (Q-CMD `cmd_handlers` is indexed by opcode and lists QUERY_SRQ before MODIFY_SRQ).
        let swap_srq = ctx.cfg.semantics == crate::Semantics::Qemu;
        let ack = match cmd {
            7 | 21.. => {
                self.regs[REG_ERR / 4] = 0xFFFF;
                return;
            }
            18 if swap_srq => 0x8000_0013,
            19 if swap_srq => 0x8000_0012,
            c => 0x8000_0000 | c,
        };
        let cmd = match cmd {
            18 if swap_srq => 19,
            19 if swap_srq => 18,
            c => c,
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
        // QEMU's header carries only a negative return, negated; a host errno passed through
        // as a positive value leaves it 0 (Q-CMD `pvrdma_exec_cmd`).
        resp[12] = match rc {
            Err(e) if e & HOST_ERRNO == 0 => e as u8,
            _ => 0,
        };
        match self.garbage.take() {
            Some(Garbage::Everything) => resp.fill(0xA5),
            Some(Garbage::Payload) => resp[16..].fill(0xA5),
            Some(Garbage::Word { offset, value }) => put32(&mut resp, offset, value),
            None => {}
        }
        let err = match rc {
            Ok(()) => 0,
            // A host verbs return passed through unchanged: a positive errno.
            Err(e) if e & HOST_ERRNO != 0 => e & !HOST_ERRNO,
            Err(errno) => errno.wrapping_neg(),
        };
        // Hostile: the command ran, but no response comes (ERR is set, the slot untouched).
        if ctx.liar.roll(point::SILENCE) {
            self.regs[REG_ERR / 4] = err;
            return;
        }
        // Hostile: the previous command's response again, or one to three fields of this one
        // (header or this command's payload).
        let truth = resp.clone();
        if ctx.liar.roll(point::RESPONSE) {
            let payload = RESP_PAYLOAD.get(cmd as usize).copied().unwrap_or(0);
            let stale = self.last_resp.as_ref().filter(|_| ctx.liar.below(6) == 0);
            if let Some(old) = stale {
                resp.copy_from_slice(old);
            }
            for _ in 0..if stale.is_some() {
                0
            } else {
                1 + ctx.liar.below(3)
            } {
                if payload == 0 || ctx.liar.below(4) == 0 {
                    let (off, width) = [(0, 8), (8, 4), (12, 1)][ctx.liar.below(3) as usize];
                    ctx.liar.mutate_field(&mut resp, off, width);
                } else {
                    ctx.liar.mutate_somewhere(&mut resp, 16, 16 + payload);
                }
            }
        }
        ctx.wr(l.resp, &resp);
        self.regs[REG_ERR / 4] = err;
        self.last_resp = Some(truth);
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
                let h = le32(req, 0x10);
                if self.qps.iter().flatten().any(|q| q.pd == h)
                    || self.srqs.iter().flatten().any(|s| s.pd == h)
                {
                    ctx.violations.qemu(
                        point::PROTOCOL,
                        format!("PD {h} destroyed while a QP or SRQ uses it"),
                    );
                }
                // QEMU frees the slot; the host keeps its PD (ibv_dealloc_pd fails with the MR
                // still registered) and the MR names a handle that may be reused.
                if self.mrs.iter().flatten().any(|m| m.pd == h) {
                    ctx.violations.qemu(
                        point::PROTOCOL,
                        format!("PD {h} destroyed while an MR uses it"),
                    );
                }
                if let Some(p) = self.pds.get_mut(h as usize) {
                    *p = false;
                }
                Ok(())
            }
            4 => self.create_mr(ctx, req, resp),
            5 => {
                // DESTROY_MR: always succeeds
                if let Some(slot) = self.mrs.get_mut(le32(req, 0x10) as usize) {
                    *slot = None;
                }
                Ok(())
            }
            6 => self.create_cq(ctx, req, resp),
            8 => {
                // DESTROY_CQ
                let h = le32(req, 0x10) as usize;
                if self
                    .qps
                    .iter()
                    .flatten()
                    .any(|q| q.scq as usize == h || q.rcq as usize == h)
                {
                    ctx.violations.qemu(
                        point::PROTOCOL,
                        format!("CQ {h} destroyed while a QP uses it"),
                    );
                }
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
            9 => self.create_qp(ctx, req, resp),
            10 => self.modify_qp(ctx, req),
            11 => self.query_qp(req, resp),
            12 => {
                // DESTROY_QP (events_reported is left stale, as QEMU does)
                let i = self.qp_index(le32(req, 0x10)).ok_or(EINVAL)?;
                self.qps[i] = None;
                Ok(())
            }
            17 => self.create_srq(ctx, req, resp),
            18 => self.modify_srq(ctx, req),
            19 => self.query_srq(req, resp),
            20 => {
                // DESTROY_SRQ
                let h = le32(req, 0x10);
                if self.qps.iter().flatten().any(|q| q.srq == Some(h)) {
                    ctx.violations.qemu(
                        point::PROTOCOL,
                        format!("SRQ {h} destroyed while a QP uses it"),
                    );
                }
                match self.srqs.get_mut(h as usize) {
                    Some(slot @ Some(_)) => {
                        *slot = None;
                        Ok(())
                    }
                    _ => Err(EINVAL),
                }
            }
            other => {
                ctx.violations
                    .qemu(0, format!("command {other} is not modelled"));
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
            // The driver's own arithmetic: no lie excuses it.
            ctx.violations.qemu(
                0,
                format!(
                    "CQ of {cqe} entries in {} data pages: QEMU would index out of bounds",
                    nchunks - 1
                ),
            );
        }
        let max = ctx.cfg.caps.max_cq;
        let slot = alloc_slot(&mut self.cqs, max, "CQ", ctx.violations).ok_or(ENOMEM)?;
        self.cqs[slot] = Some(Cq {
            spans: spans(&pages),
            pages,
            cqe,
            armed: false,
        });
        put32(resp, 0x10, slot as u32);
        put32(resp, 0x14, cqe);
        Ok(())
    }
}

/// The WQE stride QEMU derives: pow2ceil(hdr + 16·sge − 1), computed without overflow.
pub(crate) fn wqe_stride(hdr: u32, sge: u32) -> u64 {
    (u64::from(hdr) + 16 * u64::from(sge) - 1).next_power_of_two()
}

/// Maps a ring as QEMU's `pvrdma_ring_init` would and checks what QEMU does not: that the
/// element count is a power of two and the pages hold `elems` WQEs of the stride QEMU derives.
fn check_ring(v: &mut Violations, what: &str, elems: u32, hdr: u32, sge: u32, pages: u32) {
    // QEMU: pow2ceil(hdr + 16 * sge - 1).
    let stride = wqe_stride(hdr, sge);
    if !elems.is_power_of_two() {
        v.qemu(0, format!("{what}: {elems} elements is not a power of two"));
    }
    if u64::from(elems).saturating_mul(stride) > u64::from(pages) * PAGE {
        // The driver's own arithmetic: no lie excuses it.
        v.qemu(
            0,
            format!(
                "{what}: {elems} x {stride} B in {pages} pages: QEMU would index out of bounds"
            ),
        );
    }
}

impl Device {
    pub(crate) fn qp_index(&self, qpn: u32) -> Option<usize> {
        self.qps
            .iter()
            .position(|q| q.as_ref().is_some_and(|q| q.qpn == qpn))
    }

    fn cq_live(&self, h: u32) -> bool {
        matches!(self.cqs.get(h as usize), Some(Some(_)))
    }

    fn create_qp(&mut self, ctx: &mut Ctx<'_>, req: &[u8], resp: &mut [u8]) -> Result<(), u32> {
        let caps = ctx.cfg.caps;
        let (pd, scq, rcq, srq_h) = (
            le32(req, 0x18),
            le32(req, 0x1C),
            le32(req, 0x20),
            le32(req, 0x24),
        );
        let wr = [
            le32(req, 0x28),
            le32(req, 0x2C),
            le32(req, 0x30),
            le32(req, 0x34),
            le32(req, 0x38),
        ];
        let total = u32::from(u16::from_le_bytes([req[0x44], req[0x45]]));
        let send = u32::from(u16::from_le_bytes([req[0x46], req[0x47]]));
        let (sq_sig_all, qp_type, is_srq) = (req[0x4A] != 0, req[0x4B], req[0x4C] != 0);
        // create_qp_rings
        let recv = total.saturating_sub(send + 1);
        if send == 0 || send > MAX_CHUNKS || (!is_srq && (recv == 0 || recv > MAX_CHUNKS)) {
            return Err(EINVAL);
        }
        // (QEMU reads the send pages' entries whatever total_chunks says.)
        let pages = ctx
            .map_pdir(le64(req, 0x10), total.max(send + 1))
            .ok_or(EINVAL)?;
        check_ring(ctx.violations, "SQ", wr[0], 80, wr[2], send);
        if !is_srq {
            check_ring(ctx.violations, "RQ", wr[1], 16, wr[3], recv);
        }
        // rdma_rm_alloc_qp
        if !matches!(self.pds.get(pd as usize), Some(true))
            || !self.cq_live(scq)
            || !self.cq_live(rcq)
        {
            return Err(EINVAL);
        }
        if is_srq && !matches!(self.srqs.get(srq_h as usize), Some(Some(_))) {
            return Err(EINVAL);
        }
        if wr[2] > caps.max_sge
            || wr[3] > caps.max_sge
            || u64::from(wr[0]) > u64::from(caps.max_qp_wr).next_power_of_two()
        {
            return Err(EIO); // the host refuses
        }
        let qpn = match qp_type {
            QPT_RC | QPT_UD | QPT_SMI => {
                self.next_qpn += 1;
                self.next_qpn - 1
            }
            QPT_GSI => {
                if self.qps.iter().flatten().any(|q| q.qp_type == QPT_GSI) {
                    ctx.violations.qemu(
                        point::PROTOCOL,
                        "a second GSI QP: QEMU would register QP1 twice",
                    );
                }
                1
            }
            _ => return Err(EIO),
        };
        let slot = alloc_slot(&mut self.qps, caps.max_qp, "QP", ctx.violations).ok_or(ENOMEM)?;
        let stride = wqe_stride;
        let data = QpData {
            sq: RingGeo {
                state: pages[0],
                state_off: 0,
                slots: wr[0],
                stride: stride(80, wr[2]),
                pages: pages[1..=send as usize].to_vec(),
            },
            rq: if is_srq {
                RingGeo::default()
            } else {
                RingGeo {
                    state: pages[0],
                    state_off: 8,
                    slots: wr[1],
                    stride: stride(16, wr[3]),
                    pages: pages[1 + send as usize..].to_vec(),
                }
            },
            ..Default::default()
        };
        self.qps[slot] = Some(Qp {
            data,
            qpn,
            qp_type,
            pd,
            scq,
            rcq,
            srq: is_srq.then_some(srq_h),
            spans: spans(&pages),
            state: QPS_RESET,
            host_state: QPS_RESET,
            qkey: 0,
            sq_psn: 0,
            rq_psn: 0,
            dest_qpn: 0,
            sgid_index: 0,
            dgid: [0; 16],
            caps: wr,
            sq_sig_all,
            access: 0,
            max_dest_rd_atomic: 0,
            path_mtu: 0,
        });
        put32(resp, 0x10, qpn);
        let caps_at = if ctx.cfg.version >= 20 {
            put32(resp, 0x14, qpn); // qp_handle: QEMU's handle is the QP number
            0x18
        } else {
            0x14
        };
        for (i, v) in wr.iter().enumerate() {
            put32(resp, caps_at + 4 * i, *v);
        }
        Ok(())
    }

    fn modify_qp(&mut self, ctx: &mut Ctx<'_>, req: &[u8]) -> Result<(), u32> {
        let i = self.qp_index(le32(req, 0x10)).ok_or(EINVAL)?;
        let mask = le32(req, 0x14);
        let gids = self.gids.clone();
        let qp = self.qps[i].as_mut().expect("indexed");
        match qp.qp_type {
            QPT_SMI => return Err(1),
            QPT_GSI => return Ok(()),
            _ => {}
        }
        let a = 0x18;
        if ctx.cfg.semantics == Semantics::Verbs {
            // The attributes the verbs enforce, as asked (QEMU's host QP gets its own).
            if mask & MASK_ACCESS != 0 {
                qp.access = le32(req, a + 0x20);
            }
            if mask & MASK_MAX_DEST_RD_ATOMIC != 0 {
                qp.max_dest_rd_atomic = req[a + 0x2B];
            }
            if mask & MASK_PATH_MTU != 0 {
                qp.path_mtu = le32(req, a + 0x08);
            }
        }
        if mask & MASK_STATE == 0 {
            return Ok(());
        }
        let target = le32(req, a);
        let qkey = le32(req, a + 0x10);
        let use_qkey = mask & MASK_QKEY != 0;
        qp.state = target;
        // The host QP takes only INIT/RTR/RTS, and only along ibverbs' legal transitions.
        let host_ok = |from: u32, to: u32| {
            matches!(
                (from, to),
                (QPS_RESET | QPS_INIT, QPS_INIT)
                    | (QPS_INIT, QPS_RTR)
                    | (QPS_RTR | QPS_RTS, QPS_RTS)
            )
        };
        match target {
            QPS_INIT => {
                if !host_ok(qp.host_state, target) {
                    return Err(EIO);
                }
                if qp.qp_type == QPT_UD {
                    qp.qkey = qkey;
                }
                qp.host_state = target;
            }
            QPS_RTR => {
                let sgid = req[a + 0x50 + 0x14];
                // A guest GID index maps to a backend index >= 1 only if it was bound.
                if gids.get(usize::from(sgid)).copied().flatten().is_none() {
                    return Err(EIO);
                }
                if !host_ok(qp.host_state, target) {
                    return Err(EIO);
                }
                qp.sgid_index = sgid;
                if qp.qp_type == QPT_RC {
                    qp.dest_qpn = le32(req, a + 0x1C);
                    qp.rq_psn = le32(req, a + 0x14);
                    qp.dgid = req[a + 0x50..a + 0x60].try_into().expect("16 bytes");
                } else if use_qkey {
                    qp.qkey = qkey;
                }
                qp.host_state = target;
            }
            QPS_RTS => {
                if !host_ok(qp.host_state, target) {
                    return Err(EIO);
                }
                qp.sq_psn = le32(req, a + 0x18);
                if qp.qp_type == QPT_UD && use_qkey {
                    qp.qkey = qkey;
                }
                qp.host_state = target;
            }
            QPS_RESET if ctx.cfg.semantics == Semantics::Verbs && qp.host_state == QPS_ERR => {
                // A QP the device moved to ERROR (`Semantics::Verbs`) starts over.
                qp.host_state = QPS_RESET;
            }
            _ => {} // RESET, ERR, SQD, SQE: recorded only
        }
        Ok(())
    }

    fn query_qp(&mut self, req: &[u8], resp: &mut [u8]) -> Result<(), u32> {
        let i = self.qp_index(le32(req, 0x10)).ok_or(EINVAL)?;
        if le32(req, 0x14) & !STANDARD_QP_ATTR_MASK != 0 {
            // The host's ibv_query_qp refuses unknown mask bits; QEMU returns its errno as is.
            return Err(HOST_ERRNO | EOPNOTSUPP);
        }
        let qp = self.qps[i].as_ref().expect("indexed");
        if qp.qp_type == QPT_GSI {
            // QP1 has no host QP: QEMU answers the state alone (the rest stays zeroed).
            put32(resp, 0x10, QPS_RTS);
            return Ok(());
        }
        // The host's struct ibv_qp_attr layout (§5.3), with the host QP's values as QEMU's
        // modify set them (§8.3): only the fields up to qp_access_flags line up with PVRDMA's.
        let h = qp.host_state;
        let rc = qp.qp_type == QPT_RC;
        let mtu = if rc && h >= QPS_RTR { 3 } else { 0 };
        for (off, v) in [
            (0x10, h),
            (0x14, h),
            (0x18, mtu),
            (0x1C, 0),
            (0x20, qp.qkey),
            (0x24, qp.rq_psn),
            (0x28, qp.sq_psn),
            (0x2C, qp.dest_qpn),
            (0x30, 0), // RC host QPs get access flags 0 at INIT
        ] {
            put32(resp, off, v);
        }
        // Then the host's ibv_qp_cap (at 0x34), ibv_ah_attr (0x48), alt_ah_attr (0x68) and
        // the byte fields (0x88…), none of which line up with PVRDMA's: a driver reading
        // PVRDMA's `cap`, `ah_attr`, timeout… gets other fields' bytes.
        for (k, v) in qp.caps.iter().enumerate() {
            put32(resp, 0x34 + 4 * k, *v);
        }
        let host = |off: usize| 0x10 + off;
        if rc && h >= QPS_RTR {
            resp[host(0x38)..host(0x48)].copy_from_slice(&qp.dgid);
            // The backend's GID index (≥ 1), not the guest's.
            resp[host(0x4C)] = qp.sgid_index.wrapping_add(1);
            resp[host(0x4D)] = 1; // hop limit
            resp[host(0x55)] = 1; // is_global
            resp[host(0x56)] = 1; // port
            resp[host(0x7F)] = 1; // max_dest_rd_atomic
            resp[host(0x80)] = 12; // min_rnr_timer
        }
        if h >= QPS_INIT {
            resp[host(0x81)] = 1; // port: the backend's
        }
        if rc && h >= QPS_RTS {
            resp[host(0x7E)] = 1; // max_rd_atomic
            resp[host(0x82)] = 14; // timeout
            resp[host(0x83)] = 7; // retry_cnt
            resp[host(0x84)] = 7; // rnr_retry
        }
        Ok(())
    }

    fn create_srq(&mut self, ctx: &mut Ctx<'_>, req: &[u8], resp: &mut [u8]) -> Result<(), u32> {
        let pd = le32(req, 0x18);
        let nchunks = le32(req, 0x1C);
        let (max_wr, max_sge) = (le32(req, 0x20), le32(req, 0x24));
        if nchunks == 0 || nchunks > MAX_CHUNKS {
            return Err(EINVAL);
        }
        let pages = ctx.map_pdir(le64(req, 0x10), nchunks).ok_or(EINVAL)?;
        check_ring(ctx.violations, "SRQ", max_wr, 16, max_sge, nchunks - 1);
        if !matches!(self.pds.get(pd as usize), Some(true)) {
            return Err(EINVAL);
        }
        let caps = ctx.cfg.caps;
        if u64::from(max_wr) > u64::from(caps.max_srq_wr).next_power_of_two()
            || max_sge > caps.max_srq_sge
        {
            return Err(EIO);
        }
        let slot = alloc_slot(&mut self.srqs, caps.max_srq, "SRQ", ctx.violations).ok_or(ENOMEM)?;
        let ring = RingGeo {
            state: pages[0],
            state_off: 8,
            slots: max_wr,
            stride: wqe_stride(16, max_sge),
            pages: pages[1..].to_vec(),
        };
        self.srqs[slot] = Some(Srq {
            pd,
            limit: le32(req, 0x28),
            max_sge,
            spans: spans(&pages),
            data: SrqData {
                ring,
                ..Default::default()
            },
        });
        put32(resp, 0x10, slot as u32);
        Ok(())
    }
}

/// The async event type SRQ_LIMIT_REACHED (L-VRB `enum pvrdma_eqe_type`, IB numbering).
const EVENT_SRQ_LIMIT_REACHED: u32 = 15;
/// MODIFY_SRQ's attribute mask bits (L-VRB `enum pvrdma_srq_attr_mask`).
const SRQ_MASK_MAX_WR: u32 = 1 << 0;
const SRQ_MASK_LIMIT: u32 = 1 << 1;

impl Device {
    /// MODIFY_SRQ as its handler does (Q-CMD `modify_srq`, Q-RM `rdma_rm_modify_srq`): only
    /// the limit, not the size; a limit above the SRQ is refused. Under QEMU's semantics the
    /// host also refuses a zero limit; as the verbs specify, 0 disarms.
    fn modify_srq(&mut self, ctx: &mut Ctx<'_>, req: &[u8]) -> Result<(), u32> {
        let (h, mask, limit) = (le32(req, 0x10), le32(req, 0x14), le32(req, 0x20));
        let srq = self
            .srqs
            .get_mut(h as usize)
            .and_then(Option::as_mut)
            .ok_or(EINVAL)?;
        if mask & SRQ_MASK_LIMIT == 0 || mask & SRQ_MASK_MAX_WR != 0 {
            return Err(EINVAL);
        }
        let qemu = ctx.cfg.semantics == crate::Semantics::Qemu;
        if limit > srq.data.ring.slots || (qemu && limit == 0) {
            return Err(EINVAL);
        }
        srq.limit = limit;
        Ok(())
    }

    /// QUERY_SRQ as its handler does (Q-CMD `query_srq`): the host's ibv_srq_attr, whose
    /// layout is PVRDMA's (max_wr, max_sge, srq_limit).
    fn query_srq(&mut self, req: &[u8], resp: &mut [u8]) -> Result<(), u32> {
        let h = le32(req, 0x10);
        let srq = self
            .srqs
            .get(h as usize)
            .and_then(Option::as_ref)
            .ok_or(EINVAL)?;
        put32(resp, 0x10, srq.data.ring.slots);
        put32(resp, 0x14, srq.max_sge);
        put32(resp, 0x18, srq.limit);
        Ok(())
    }

    /// After a receive was taken from SRQ `h`: with the limit armed and fewer receives posted
    /// than it, the device posts SRQ_LIMIT_REACHED (info: the SRQ handle) to the async ring
    /// and disarms, as the verbs specify (QEMU never posts async events).
    pub(crate) fn srq_limit_check(&mut self, ctx: &mut Ctx<'_>, h: u32) {
        if ctx.cfg.semantics == crate::Semantics::Qemu {
            return;
        }
        let Some(srq) = self.srqs.get_mut(h as usize).and_then(Option::as_mut) else {
            return;
        };
        if srq.limit == 0 || srq.data.recvs.len() >= srq.limit as usize {
            return;
        }
        srq.limit = 0;
        self.post_async(ctx, EVENT_SRQ_LIMIT_REACHED, h);
    }

    /// The async event the device posted last, (type, info), read back from the ring.
    pub(crate) fn last_async_event(&self, mem: &Memory) -> Option<(u32, u32)> {
        let &state = self.ring_pages.get(self.notify_pages)?;
        let data = &self.ring_pages[self.notify_pages + 1..];
        let slots = (data.len() * 512) as u32;
        if self.async_events == 0 || !slots.is_power_of_two() {
            return None;
        }
        let p = le32(&mem.read(state + 8, 4)?, 0);
        let i = p.wrapping_sub(1) & (slots - 1);
        let e = mem.read(data[(i / 512) as usize] + u64::from(i % 512) * 8, 8)?;
        Some((le32(&e, 0), le32(&e, 4)))
    }
}
