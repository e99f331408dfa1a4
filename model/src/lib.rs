//! A software PVRDMA device with QEMU 7.2's observable behaviour, for firmware-style tests of
//! `bareverbs` on the host.
//!
//! [`Model`] is at once the machine's memory (it implements [`Hal`]: DMA pages come from it and
//! have "physical" addresses above 4 GiB), its PCI configuration space
//! ([`ConfigRegionAccess`]: a host bridge, a vmxnet3 at 00:10.0 and the PVRDMA at 00:10.1), and
//! the device: register writes run synchronously inside [`Mmio::write32`], as QEMU runs a
//! command inside the REQUEST write.
//!
//! The model encodes the device interface from `docs/pvrdma.md` on its own, with byte
//! offsets rather than the driver's structs, so a layout mistake on either side shows.
//!
//! It also keeps watch: [`Model::violations`] lists everything the driver did that real QEMU
//! would have mishandled (a table overflow that corrupts QEMU's heap, a ring smaller than its
//! element count, BARs sized with decoding on, memory freed while the device still maps it, an
//! access to memory that is not allocated…). Tests assert that list stays empty.
//!
//! Memory for zero-copy registration: [`Model::alloc_user_memory`]. The model's HAL translates
//! only the memory the machine has ([`Hal::virt_to_phys`]), as a real HAL knows only the memory
//! it maps: a test program's own buffers are refused as `Unsupported(Feature(UserMemory))`.
//!
//! Fault injection: the n-th command fails with an errno ([`Model::fail_command`]), the n-th DMA
//! allocation fails ([`Model::fail_dma_alloc`]), the device stops answering
//! ([`Model::set_silent`]), the next response is garbage ([`Model::garbage_next`]).
//!
//! Hostile mode ([`ModelConfig::hostile`], [`Model::set_hostile`]): a seeded liar mutates what
//! the device shows the driver — responses, ERR, capabilities, ring indices, CQEs, PCI values,
//! VERSION — or stays silent (see [`hostile`]). [`Model::lies`] counts what it told, so a
//! checker can tell the driver's mistakes from the consequences of a lie: every [`Violation`]
//! has a [`ViolationKind`] and says which lies may excuse it. DMA blocks carry guard pages that
//! [`Model::check_guards`] verifies. [`Model::reset`] rebuilds the machine in place, for a
//! harness that runs millions of them.

mod datapath;
mod device;
pub mod hostile;
pub mod intel;
pub mod link;
mod mem;
pub mod nvme;
mod pci;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bareverbs_hal::{ConfigRegionAccess, DmaBlock, DmaError, Hal, Mmio, PciAddress};

pub use datapath::gsi::Mux;
use device::Device;
pub use device::ObjectCounts;
use hostile::Liar;
pub use hostile::{Hostile, Lies, Rng};
use mem::Memory;
use pci::Pci;

/// The model's view of one QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpView {
    /// PVRDMA type number (1 GSI, 2 RC, 4 UD).
    pub qp_type: u8,
    /// The state QEMU recorded.
    pub state: u32,
    /// The host QP's state (only INIT/RTR/RTS reach it).
    pub host_state: u32,
    pub qkey: u32,
    pub sq_psn: u32,
    pub rq_psn: u32,
    pub dest_qpn: u32,
    pub sgid_index: u8,
    pub dgid: [u8; 16],
    pub sq_sig_all: bool,
    /// max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data as created.
    pub caps: [u32; 5],
}

/// What sits at function 0 of the PVRDMA's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fn0 {
    /// A vmxnet3 (15ad:07b0), as QEMU requires.
    Vmxnet3,
    /// Another device (an e1000, 8086:100e).
    Other,
    /// Nothing.
    Absent,
}

/// Capabilities the device reports (QEMU 7.2 defaults over an rxe backend).
#[derive(Clone, Copy, Debug)]
pub struct CapsConfig {
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_ah: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_mr_size: u64,
    pub gid_tbl_len: u32,
    pub phys_port_cnt: u8,
    /// 0 RoCE, 1 iWARP, 2 IB.
    pub mode: u8,
    /// OR-ed into whatever the driver left in the field (QEMU ORs 1).
    pub gid_types: u8,
    /// `max_qp_rd_atom` and `max_qp_init_rd_atom`: QEMU never writes them (they keep the
    /// driver's zeroes), so 0 here leaves the field alone; a non-zero value is written, as a
    /// device that reports RDMA-read resources would.
    pub rd_atom: (u32, u32),
}

impl Default for CapsConfig {
    fn default() -> Self {
        let max_sge = 4;
        CapsConfig {
            max_qp: 1024,
            max_qp_wr: 2_097_152 / (80 + 16 * max_sge) - 4096,
            max_sge,
            max_cq: 2048,
            max_cqe: 2_097_152 / 64 - 4096,
            max_mr: 1024,
            max_pd: 1024,
            max_ah: 64,
            max_srq: 512,
            max_srq_wr: 2_097_152 / (32 * max_sge) - 4096,
            max_srq_sge: max_sge,
            max_mr_size: 0x800_0000,
            gid_tbl_len: 255,
            phys_port_cnt: 1,
            mode: 0,
            gid_types: 1,
            rd_atom: (0, 0),
        }
    }
}

/// How the model is built.
#[derive(Clone, Copy, Debug)]
pub struct ModelConfig {
    /// The VERSION register (QEMU: 17).
    pub version: u32,
    /// What is at function 0.
    pub fn0: Fn0,
    /// Make BAR2 a 64-bit BAR placed above 4 GiB (VMware's hardware, per L-API).
    pub bar2_64bit: bool,
    /// The vmxnet3's MAC (the node GUID is derived from it).
    pub mac: [u8; 6],
    /// Whether the port reads ACTIVE (QEMU: only once the guest's vmxnet3 driver is up).
    pub port_active: bool,
    /// The capabilities.
    pub caps: CapsConfig,
    /// Refuse to load the shared region (QEMU cannot map it: nothing is written back).
    pub refuse_dsr: bool,
    /// ERR value ACTIVATE leaves (QEMU: 0).
    pub activate_err: u32,
    /// Total DMA pages the machine has.
    pub dma_pages: usize,
    /// How send work requests execute.
    pub semantics: Semantics,
    /// Lie to the driver (None: an honest device).
    pub hostile: Option<Hostile>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            version: 17,
            fn0: Fn0::Vmxnet3,
            bar2_64bit: false,
            mac: [0x52, 0x54, 0x00, 0x12, 0x34, 0x57],
            port_active: true,
            caps: CapsConfig::default(),
            refuse_dsr: false,
            activate_err: 0,
            dma_pages: 1 << 20,
            semantics: Semantics::Verbs,
            hostile: None,
        }
    }
}

/// How the device executes send work requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Semantics {
    /// As the verbs specify, and rxe and hardware enforce: every opcode with its meaning,
    /// keys and the memory regions' and the responder QP's access rights checked, a READ to
    /// a QP that takes none (`max_dest_rd_atomic` 0) refused, SIGNALED honoured, immediate
    /// data delivered; a failed RC request moves its QP (and, for a fault the responder
    /// found, the responder's) to ERROR, whose later requests and receives are flushed.
    #[default]
    Verbs,
    /// As QEMU 7.2 does (§8.6, §8.8): every opcode runs as a SEND, every send WQE completes,
    /// immediate data is not delivered, memory regions get rkey 0xFFFFFFFF.
    Qemu,
    /// As `Verbs`, but looser where rxe and hardware are strict: the responder QP's access
    /// flags and READ depth are not checked, and a failed request leaves both QPs as they
    /// were (no move to ERROR, nothing flushed by the device). The device the property tests'
    /// reference model (`tests/props/`) predicts; every other test runs `Verbs`.
    LooseVerbs,
}

/// How the next response is garbled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Garbage {
    /// The whole response slot, header included, is overwritten with 0xA5 bytes.
    Everything,
    /// The header is right; the payload is overwritten with 0xA5 bytes.
    Payload,
    /// Everything is right except the 32-bit word at byte `offset` of the response slot,
    /// which holds `value` (e.g. offset 0x0C: the header's error field, offset 0x14: a CREATE_MR
    /// lkey). ERR is left as the command set it.
    Word {
        /// Byte offset in the response slot (a multiple of 4, below 176).
        offset: usize,
        /// The value written there.
        value: u32,
    },
}

/// What kind of rule a [`Violation`] broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViolationKind {
    /// Memory the driver does not own: the device was handed an address (in the shared region,
    /// a command, a page directory) that is not allocated; the driver freed a block that was not
    /// allocated as such; or the driver wrote into a DMA block's guard pages. No lie of the
    /// device excuses these: the driver never takes an address from the device.
    Memory,
    /// The driver freed memory the device still uses (or the device found such memory freed).
    UseAfterFree,
    /// Something QEMU would mishandle (table overflow, ring geometry, a WQE it loops on, a
    /// PCI or register rule) or the device itself found inconsistent.
    Qemu,
}

/// One thing the driver did that the device (or QEMU) would not survive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub kind: ViolationKind,
    pub message: String,
    /// The [`hostile::point`]s whose lies may lead a correct driver here (0: none may; a
    /// violation of `Memory` kind is never excused).
    pub excused_by: u32,
}

/// The model's list of violations.
#[derive(Default)]
pub(crate) struct Violations(Vec<Violation>);

impl Violations {
    /// A [`ViolationKind::Qemu`] violation that only lies at `excused_by` may explain.
    pub(crate) fn qemu(&mut self, excused_by: u32, message: impl Into<String>) {
        self.add(ViolationKind::Qemu, excused_by, message);
    }

    /// A [`ViolationKind::Memory`] violation.
    pub(crate) fn memory(&mut self, message: impl Into<String>) {
        self.add(ViolationKind::Memory, 0, message);
    }

    /// A [`ViolationKind::UseAfterFree`] violation (a lie about a command's outcome may explain
    /// it: the driver then rightly believes the device no longer has the memory).
    pub(crate) fn freed(&mut self, message: impl Into<String>) {
        self.add(
            ViolationKind::UseAfterFree,
            hostile::point::PROTOCOL,
            message,
        );
    }

    fn add(&mut self, kind: ViolationKind, excused_by: u32, message: impl Into<String>) {
        self.0.push(Violation {
            kind,
            message: message.into(),
            excused_by,
        });
    }
}

struct Inner {
    cfg: ModelConfig,
    mem: Memory,
    pci: Pci,
    dev: Device,
    violations: Violations,
    liar: Liar,
}

/// The machine: memory, PCI configuration space and the PVRDMA device. Clones share it.
#[derive(Clone)]
pub struct Model {
    inner: Arc<Mutex<Inner>>,
    /// Benchmark switches: free doorbells, and the plain UAR page; the CPU side of MSI-X.
    bench: Arc<BenchState>,
}

/// What the model's "CPU" runs for an MSI-X message (address, data): an embedder's interrupt
/// handler.
pub type MsiHandler = Arc<dyn Fn(u64, u32) + Send + Sync>;

/// What benchmarks set (shared by clones).
struct BenchState {
    /// Doorbell writes are ignored ([`Model::set_free_doorbells`]).
    free_doorbells: AtomicBool,
    /// The plain UAR page ([`Model::set_plain_uar`]).
    plain_uar: Arc<PlainUar>,
    /// The handler MSI-X messages are delivered to, synchronously
    /// ([`Model::set_msi_handler`]).
    cpu: Mutex<Option<MsiHandler>>,
    /// What [`Hal::seed`] answers ([`Model::set_seed`]); fixed, so that runs replay.
    seed: AtomicU64,
}

/// A UAR as plain memory: what BAR2 mappings made in plain mode write to.
struct PlainUar {
    /// Whether new BAR2 mappings are plain.
    on: AtomicBool,
    words: [AtomicU32; 1024],
}

impl Default for Model {
    fn default() -> Self {
        Model::new(ModelConfig::default())
    }
}

/// Offset of the interrupt mask register in BAR1.
const REG_IMR: usize = 0x1C;

/// The PCI address of the PVRDMA function.
pub const PVRDMA_ADDRESS: (u8, u8, u8) = (0, 0x10, 1);

impl Inner {
    /// Hands the vectors the device raised to its MSI-X function (IMR as it is now).
    fn deliver_interrupts(&mut self) {
        let imr = self.dev.regs[REG_IMR / 4];
        for v in std::mem::take(&mut self.dev.raised) {
            self.pci.msix_notify(v, imr);
        }
    }

    fn new(cfg: ModelConfig) -> Self {
        Inner {
            mem: Memory::new(cfg.dma_pages),
            pci: Pci::new(&cfg),
            dev: Device::new(&cfg),
            cfg,
            violations: Violations::default(),
            liar: cfg.hostile.map_or_else(Liar::honest, Liar::new),
        }
    }
}

impl Model {
    /// A machine built as `cfg` says.
    pub fn new(cfg: ModelConfig) -> Self {
        Model {
            inner: Arc::new(Mutex::new(Inner::new(cfg))),
            bench: Arc::new(BenchState {
                free_doorbells: AtomicBool::new(false),
                plain_uar: Arc::new(PlainUar {
                    on: AtomicBool::new(false),
                    words: std::array::from_fn(|_| AtomicU32::new(0)),
                }),
                cpu: Mutex::new(None),
                seed: AtomicU64::new(MODEL_SEED),
            }),
        }
    }

    /// Delivers every MSI-X message the device sends from now on to `handler`, synchronously,
    /// as a CPU takes an interrupt: right after the register, doorbell or configuration write
    /// that raised it (the model's lock released), inside the driver's call that wrote it.
    /// `None` goes back to collecting them for [`take_msi`](Self::take_msi).
    pub fn set_msi_handler(&self, handler: Option<MsiHandler>) {
        *self.bench.cpu.lock().unwrap_or_else(|p| p.into_inner()) = handler;
    }

    /// Runs the handler for the messages sent, if there is one.
    fn run_msi_handler(&self) {
        let h = self
            .bench
            .cpu
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(h) = h {
            let msgs = self.lock().pci.take_msi();
            for (address, data) in msgs {
                h(address, data);
            }
        }
    }

    /// Rebuilds the machine as `cfg` says, as if new: every DMA block is freed, the device and
    /// its tables start over. For a harness that runs many machines on one model — clones the
    /// driver leaked on purpose (memory it kept for a device it could not trust) would
    /// otherwise keep each old machine alive.
    ///
    /// # Safety
    ///
    /// No driver object that used the old machine is used again: pointers into its DMA memory
    /// dangle.
    pub unsafe fn reset(&self, cfg: ModelConfig) {
        let old = std::mem::replace(&mut *self.lock(), Inner::new(cfg));
        drop(old);
        self.bench.free_doorbells.store(false, Ordering::Relaxed);
        self.bench.plain_uar.on.store(false, Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A test that panicked while holding the lock poisons it; the state is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// DMA pages allocated and not yet returned.
    pub fn outstanding_pages(&self) -> usize {
        self.lock().mem.outstanding_pages()
    }

    /// Everything the driver did that QEMU would have mishandled.
    pub fn violations(&self) -> Vec<String> {
        let g = self.lock();
        g.violations.0.iter().map(|v| v.message.clone()).collect()
    }

    /// The violations with their kinds.
    pub fn violation_records(&self) -> Vec<Violation> {
        self.lock().violations.0.clone()
    }

    /// Makes the device hostile from now on (or honest again with `None`); the liar restarts
    /// from `h.seed` and its count of lies from zero.
    pub fn set_hostile(&self, h: Option<Hostile>) {
        self.lock().liar = h.map_or_else(Liar::honest, Liar::new);
    }

    /// The lies told so far, by class.
    pub fn lies(&self) -> Lies {
        self.lock().liar.lies
    }

    /// Checks every live DMA block's guard pages (the driver writing outside its memory), adding
    /// a [`ViolationKind::Memory`] violation for each one damaged; true when all are intact.
    /// Blocks are also checked when freed.
    pub fn check_guards(&self) -> bool {
        let mut g = self.lock();
        let Inner {
            mem, violations, ..
        } = &mut *g;
        let damaged = mem.check_guards();
        let ok = damaged.is_empty();
        for m in damaged {
            violations.memory(m);
        }
        ok
    }

    /// Live objects in the device's tables.
    pub fn objects(&self) -> ObjectCounts {
        self.lock().dev.counts()
    }

    /// Commands the device has run (rejected ones included).
    pub fn commands(&self) -> u64 {
        self.lock().dev.commands
    }

    /// Makes the `nth` command from now (1 = the next) fail with `errno`.
    pub fn fail_command(&self, nth: u64, errno: u32) {
        let mut g = self.lock();
        let at = g.dev.commands + nth;
        g.dev.fail_at = Some((at, errno));
    }

    /// Makes the `nth` DMA allocation from now (1 = the next) fail.
    pub fn fail_dma_alloc(&self, nth: u64) {
        self.lock().mem.fail_nth(nth);
    }

    /// DMA allocations made so far.
    pub fn dma_allocs(&self) -> u64 {
        self.lock().mem.allocs
    }

    /// A silent device ignores REQUEST writes: no response, ERR untouched.
    pub fn set_silent(&self, silent: bool) {
        self.lock().dev.silent = silent;
    }

    /// Rejects the next command before running it (ERR = 0xFFFF, no response), as QEMU does
    /// an unknown opcode.
    pub fn reject_next(&self) {
        self.lock().dev.reject_next = true;
    }

    /// Garbles the next command's response.
    pub fn garbage_next(&self, how: Garbage) {
        self.lock().dev.garbage = Some(how);
    }

    /// The 280 bytes of the shared region as the driver had written them when it wrote
    /// DSRHIGH, before the device filled in the capabilities.
    pub fn dsr_as_written(&self) -> Option<Vec<u8>> {
        self.lock().dev.dsr_written.clone()
    }

    /// Physical address of the shared region, once loaded.
    pub fn dsr_paddr(&self) -> Option<u64> {
        self.lock().dev.loaded.map(|l| l.dsr)
    }

    /// Reads `len` bytes of machine memory (None if not all allocated).
    pub fn read_phys(&self, pa: u64, len: usize) -> Option<Vec<u8>> {
        self.lock().mem.read(pa, len)
    }

    /// Whether `pa` is the start of a page that is allocated now.
    pub fn is_allocated(&self, pa: u64) -> bool {
        self.lock().mem.read(pa, 1).is_some()
    }

    /// The current BAR addresses of the PVRDMA function: (BAR1, BAR2).
    pub fn bar_addresses(&self) -> (u64, u64) {
        let g = self.lock();
        (g.pci.pvrdma_bar(1), g.pci.pvrdma_bar(2))
    }

    /// Hostile: the PVRDMA's MSI-X capability places its table in BAR `bir` at `offset`.
    pub fn set_msix_table(&self, bir: u8, offset: u32) {
        self.lock().pci.set_msix_table(bir, offset);
    }

    /// The PCI command register of the PVRDMA function.
    pub fn pci_command(&self) -> u16 {
        self.lock().pci.pvrdma_command()
    }

    /// What the model knows of the QP numbered `qpn`: (recorded state, host state, qkey,
    /// sq_psn, rq_psn, dest_qpn, sgid_index, sq_sig_all, caps as created).
    pub fn qp(&self, qpn: u32) -> Option<QpView> {
        let g = self.lock();
        g.dev
            .qps
            .iter()
            .flatten()
            .find(|q| q.qpn == qpn)
            .map(|q| QpView {
                qp_type: q.qp_type,
                state: q.state,
                host_state: q.host_state,
                qkey: q.qkey,
                sq_psn: q.sq_psn,
                rq_psn: q.rq_psn,
                dest_qpn: q.dest_qpn,
                sgid_index: q.sgid_index,
                dgid: q.dgid,
                sq_sig_all: q.sq_sig_all,
                caps: q.caps,
            })
    }

    /// Doorbell writes, CQEs posted, and interrupts raised so far.
    pub fn counters(&self) -> (u64, u64, u64) {
        let g = self.lock();
        (g.dev.doorbells, g.dev.cqes, g.dev.interrupts)
    }

    /// CQEs posted while the CQ-notification ring was full: each one QEMU logs as
    /// "rdma: CQ is full", without notifying or interrupting (the CQE itself is posted).
    pub fn notify_ring_full(&self) -> u64 {
        self.lock().dev.notify_ring_full
    }

    /// Sets what the model's [`Hal::seed`] answers from now on (devices opened later draw
    /// their starting PSNs and key bits from it).
    pub fn set_seed(&self, seed: u64) {
        self.bench.seed.store(seed, Ordering::Relaxed);
    }

    /// Makes doorbell writes free (ignored without locking the model): for benchmarks that
    /// count the driver's instructions, with completions put in place by [`Model::inject_cqe`].
    pub fn set_free_doorbells(&self, free: bool) {
        self.bench.free_doorbells.store(free, Ordering::Relaxed);
    }

    /// Makes the BAR2 (UAR) mappings made from now on (until turned off) a plain page of
    /// memory, as a benchmark harness's fake UAR: a doorbell is one store there, the device
    /// does not see it. The harness reads it with [`Model::take_uar_word`] and rings the device
    /// itself with [`Model::doorbell`]. Mappings made before keep their mode.
    pub fn set_plain_uar(&self, on: bool) {
        self.bench.plain_uar.on.store(on, Ordering::Relaxed);
    }

    /// The last value written at byte `offset` of the plain UAR page since the last take (0
    /// when none); the word is cleared.
    pub fn take_uar_word(&self, offset: usize) -> u32 {
        self.bench.plain_uar.words[offset / 4].swap(0, Ordering::Relaxed)
    }

    /// A doorbell write of `value` at byte `offset` of the UAR, as if through a mapping of
    /// BAR2 (the device acts on it at once).
    pub fn doorbell(&self, offset: usize, value: u32) {
        self.mmio_write(2, 4096, offset, value);
    }

    /// Runs `f` on the device with a context of the machine (bus mastering as configured in
    /// PCI, or forced on), then delivers the interrupts it raised.
    fn on_device<T>(
        &self,
        force_bus_master: bool,
        f: impl FnOnce(&mut Device, &mut device::Ctx<'_>) -> T,
    ) -> T {
        let mut g = self.lock();
        let Inner {
            cfg,
            mem,
            pci,
            dev,
            violations,
            liar,
        } = &mut *g;
        let mut ctx = device::Ctx {
            cfg,
            mem,
            violations,
            liar,
            bus_master: force_bus_master || pci.pvrdma_bus_master(),
            msix_live: pci.msix_unmasked(),
        };
        let r = f(dev, &mut ctx);
        g.deliver_interrupts();
        drop(g);
        self.run_msi_handler();
        r
    }

    /// Posts a successful SEND completion for `qpn` with `wr_id` to CQ `cq`.
    pub fn inject_cqe(&self, cq: u32, qpn: u32, wr_id: u64) {
        self.on_device(true, |dev, ctx| dev.inject_cqe(ctx, cq, qpn, wr_id));
    }

    /// Posts an async event (`kind` as the PVRDMA ABI numbers them, 0–18, and its `info`: a
    /// QP, CQ or SRQ handle, or a port) to the async ring and raises vector 1, as VMware's
    /// device does; QEMU never does. False when there is no ring to post to or it is full.
    pub fn post_async(&self, kind: u32, info: u32) -> bool {
        self.on_device(false, |dev, ctx| dev.post_async(ctx, kind, info))
    }

    /// Hostile: writes `handles` into the CQ-notification ring over whatever is there, sets
    /// its producer index to `prod` (or just past them), and raises vector 2.
    pub fn notify_storm(&self, handles: &[u32], prod: Option<u32>) {
        self.on_device(false, |dev, ctx| dev.notify_storm(ctx, handles, prod));
    }

    /// The MSI-X messages the PVRDMA sent since the last call, in order: (address, data) as
    /// the driver programmed the entry of each raised vector.
    pub fn take_msi(&self) -> Vec<(u64, u32)> {
        self.lock().pci.take_msi()
    }

    /// MSI-X state: (pending bits, messages dropped while IMR was non-zero, messages dropped
    /// with bus mastering off). QEMU drops rather than holds a vector raised under IMR.
    pub fn msix_stats(&self) -> (u64, u64, u64) {
        self.lock().pci.msix_stats()
    }

    /// Async events posted so far.
    pub fn async_events(&self) -> u64 {
        self.lock().dev.async_events
    }

    /// Marks every WQE of QP `qpn`'s rings as consumed, without running them (benchmarks, with
    /// free doorbells).
    pub fn consume_rings(&self, qpn: u32) {
        let mut g = self.lock();
        let Inner { mem, dev, .. } = &mut *g;
        dev.consume_rings(mem, qpn);
    }

    /// Writes raw bytes into a CQ's next CQE slot and publishes it (garbage-CQE tests).
    pub fn inject_raw_cqe(&self, cq: u32, bytes: [u8; 64]) {
        let mut g = self.lock();
        let Inner { mem, dev, .. } = &mut *g;
        dev.inject_raw_cqe(mem, cq, bytes);
    }

    /// Hostile: overwrites a CQ's consumer index, the word only the driver should write.
    pub fn set_cq_cons(&self, cq: u32, value: u32) {
        let mut g = self.lock();
        let Inner { mem, dev, .. } = &mut *g;
        dev.set_cq_cons(mem, cq, value);
    }

    /// Hostile: overwrites the `wr_id` of the WQE in `slot` of QP `qpn`'s send (or receive)
    /// ring, which only the driver should write.
    pub fn set_wqe_wr_id(&self, qpn: u32, recv: bool, slot: u32, wr_id: u64) {
        let mut g = self.lock();
        let Inner { mem, dev, .. } = &mut *g;
        dev.set_wqe_wr_id(mem, qpn, recv, slot, wr_id);
    }

    /// Overwrites a CQ's producer index (garbage-index tests).
    pub fn set_cq_prod(&self, cq: u32, value: u32) {
        let mut g = self.lock();
        let Inner { mem, dev, .. } = &mut *g;
        dev.set_cq_prod(mem, cq, value);
    }

    /// The GID bound at `index`, if any.
    pub fn gid(&self, index: usize) -> Option<[u8; 16]> {
        self.lock().dev.gids.get(index).copied().flatten()
    }

    /// Whether the device is active (ACTIVATE seen, no RESET since).
    pub fn active(&self) -> bool {
        self.lock().dev.active
    }

    /// The last value written to a register of BAR1.
    pub fn reg(&self, offset: usize) -> u32 {
        self.lock().dev.regs[offset / 4]
    }

    /// The configuration the model was built with.
    pub fn config(&self) -> ModelConfig {
        self.lock().cfg
    }

    /// `len` bytes (rounded up to whole pages, zeroed) of the machine's memory for the embedder's
    /// own use: memory that zero-copy registration (`bareverbs`'
    /// `ProtectionDomain::register_user` and `register_static`) accepts, because the model's
    /// [`Hal::virt_to_phys`] translates it.
    ///
    /// The model translates only its own memory, as a machine's HAL knows only the memory it
    /// maps: registering a `Vec`, a stack array or a `static` of the test program fails with
    /// `Unsupported(Feature(UserMemory))`. The pages count in [`Model::outstanding_pages`]
    /// until the [`UserMemory`] is dropped (or for good, after [`UserMemory::leak`]).
    ///
    /// # Panics
    ///
    /// When `len` is 0 or the machine's memory is exhausted (a test's mistake).
    pub fn alloc_user_memory(&self, len: usize) -> UserMemory {
        let block = self
            .lock()
            .mem
            .alloc(len.div_ceil(4096))
            .expect("the model's memory holds the user memory asked for");
        UserMemory {
            model: self.clone(),
            block: Some(block),
            len,
        }
    }

    /// The async event posted last, (type, info) as the async ring holds it; `None` before
    /// the first.
    pub fn last_async_event(&self) -> Option<(u32, u32)> {
        let g = self.lock();
        g.dev.last_async_event(&g.mem)
    }
}

// SAFETY: blocks come from `Memory`, which allocates page-aligned, zeroed, exclusively owned
// host memory and gives each a distinct non-zero "physical" address; MMIO goes to the model.
unsafe impl Hal for Model {
    type Mmio = ModelMmio;

    fn dma_alloc(&self, pages: usize) -> Result<DmaBlock, DmaError> {
        self.lock().mem.alloc(pages)
    }

    unsafe fn dma_dealloc(&self, block: DmaBlock) {
        let mut g = self.lock();
        let Inner {
            mem,
            dev,
            violations,
            ..
        } = &mut *g;
        for range in dev.pages_in_use() {
            let end = block.paddr + (block.pages * 4096) as u64;
            if range.0 < end && block.paddr < range.1 {
                violations.freed(format!(
                    "freed DMA block {:#x} (+{} pages) while the device still uses {:#x}..{:#x}",
                    block.paddr, block.pages, range.0, range.1
                ));
            }
        }
        if let Err(v) = mem.free(block) {
            violations.memory(v);
        }
    }

    unsafe fn map_mmio(&self, paddr: u64, size: usize) -> Option<ModelMmio> {
        let g = self.lock();
        for bar in [0usize, 1, 2] {
            let base = g.pci.pvrdma_bar(bar);
            if base != 0 && paddr == base && size as u64 <= g.pci.pvrdma_bar_size(bar) {
                let plain = bar == 2 && self.bench.plain_uar.on.load(Ordering::Relaxed);
                return Some(ModelMmio {
                    plain: plain.then(|| self.bench.plain_uar.clone()),
                    model: self.clone(),
                    bar,
                    size,
                });
            }
        }
        None
    }

    fn virt_to_phys(&self, vaddr: std::ptr::NonNull<u8>) -> Option<u64> {
        self.lock().mem.virt_to_phys(vaddr.as_ptr())
    }

    /// A fixed seed ([`MODEL_SEED`] unless [`Model::set_seed`] changed it): a test's starting
    /// PSNs and key bits are the same in every run.
    fn seed(&self) -> u64 {
        self.bench.seed.load(Ordering::Relaxed)
    }

    /// Vector `v` to the local APIC of CPU 0 at CPU vector [`MSI_FIRST_VECTOR`] + `v`.
    fn msi_message(&self, vector: u16) -> Option<bareverbs_hal::MsiMessage> {
        Some(bareverbs_hal::MsiMessage {
            address: 0xFEE0_0000,
            data: MSI_FIRST_VECTOR + u32::from(vector),
        })
    }
}

/// The seed a new model's HAL gives ([`Hal::seed`]).
pub const MODEL_SEED: u64 = 0x5EED_0FB4_EE7E_1200;

/// The CPU vector the model's HAL routes the device's vector 0 to (1 and 2 follow).
pub const MSI_FIRST_VECTOR: u32 = 0x30;

impl ConfigRegionAccess for Model {
    unsafe fn read(&self, address: PciAddress, offset: u16) -> u32 {
        // Most of a bus scan reads absent functions: answer those without the lock.
        if !pci::may_exist(address) {
            return u32::MAX;
        }
        let mut g = self.lock();
        let v = g.pci.read(address, offset);
        // IDs, command/status, class, header, BARs (also as read back while sizing).
        if offset <= 0x24 && g.liar.roll(hostile::point::PCI) {
            return g.liar.mutate32(v);
        }
        v
    }

    unsafe fn write(&self, address: PciAddress, offset: u16, value: u32) {
        let mut g = self.lock();
        let Inner {
            pci, violations, ..
        } = &mut *g;
        pci.write(address, offset, value, violations);
        drop(g);
        self.run_msi_handler();
    }
}

/// Memory of the machine handed to the embedder ([`Model::alloc_user_memory`]): what a test
/// registers zero-copy. Returned to the machine when dropped (a region still registered over it
/// is then reported in [`Model::violations`], as memory freed while the device uses it).
pub struct UserMemory {
    model: Model,
    block: Option<DmaBlock>,
    len: usize,
}

impl UserMemory {
    /// Where the CPU reaches the first byte (page-aligned).
    pub fn as_ptr(&self) -> std::ptr::NonNull<u8> {
        self.block.as_ref().expect("present until dropped").vaddr
    }

    /// Length in bytes, as asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is 0 (never: [`Model::alloc_user_memory`] refuses 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, for the CPU.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the block is `len` bytes or more of zeroed memory owned by this value.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr().as_ptr(), self.len) }
    }

    /// Keeps the memory for the rest of the program, for
    /// `ProtectionDomain::register_static`; its pages stay counted as outstanding.
    pub fn leak(mut self) -> &'static mut [u8] {
        let block = self.block.take().expect("present until dropped");
        // SAFETY: the block is `len` bytes or more of zeroed memory, never freed from now on.
        unsafe { std::slice::from_raw_parts_mut(block.vaddr.as_ptr(), self.len) }
    }
}

impl Drop for UserMemory {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            // SAFETY: the block came from this machine's allocator and is returned once.
            unsafe { self.model.dma_dealloc(block) }
        }
    }
}

/// A mapped BAR of the model's PVRDMA: writes act synchronously, as in QEMU.
pub struct ModelMmio {
    /// A UAR mapped in plain mode ([`Model::set_plain_uar`]).
    plain: Option<Arc<PlainUar>>,
    model: Model,
    bar: usize,
    size: usize,
}

// SAFETY: accesses outside the window or unaligned are refused (reads give all-ones).
unsafe impl Mmio for ModelMmio {
    fn size(&self) -> usize {
        self.size
    }

    fn read32(&self, offset: usize) -> u32 {
        if !offset.is_multiple_of(4) || offset + 4 > self.size {
            return u32::MAX;
        }
        let mut g = self.model.lock();
        if !g.pci.pvrdma_decodes() {
            g.violations.qemu(
                hostile::point::PCI,
                format!("BAR{} read with memory decoding off", self.bar),
            );
            return u32::MAX;
        }
        match self.bar {
            0 => return g.pci.bar0_read(offset),
            1 => {}
            _ => return u32::MAX,
        }
        let v = g.dev.reg_read(offset);
        let p = match offset {
            0x00 => hostile::point::VERSION,
            0x14 => hostile::point::ERR,
            _ => return v,
        };
        if g.liar.roll(p) {
            g.liar.mutate32(v)
        } else {
            v
        }
    }

    #[inline]
    fn write32(&self, offset: usize, value: u32) {
        // Benchmarks: a store into the plain page, after this one test.
        if let Some(p) = &self.plain {
            if offset.is_multiple_of(4) && offset < 4096 {
                p.words[offset / 4].store(value, Ordering::Relaxed);
            }
            return;
        }
        // Benchmarks: a free doorbell costs this one test.
        if self.bar == 2 && self.model.bench.free_doorbells.load(Ordering::Relaxed) {
            return;
        }
        self.write32_saved(offset, value);
    }
}

impl ModelMmio {
    /// [`write32_slow`](Self::write32_slow) through a call that preserves every register
    /// (x86-64): the driver's code around a register write is compiled as around a store to
    /// hardware, which clobbers nothing, rather than around a call, for which the compiler
    /// saves registers (also on the paths that never make it). What a benchmark counts is then
    /// the driver's code as it runs on hardware.
    #[inline(always)]
    fn write32_saved(&self, offset: usize, value: u32) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the trampoline (`bareverbs_model_write32_saved`, below) saves and restores
        // every general-purpose and SSE register and the stack pointer around its call of
        // `write32_entry` with these three arguments; the red zone is stepped over before the
        // call pushes anything, and the trampoline aligns the stack itself.
        unsafe {
            core::arch::asm!(
                "lea rsp, [rsp - 128]",
                "call {t}",
                "lea rsp, [rsp + 128]",
                t = sym bareverbs_model_write32_saved,
                in("rdi") self as *const ModelMmio,
                in("rsi") offset,
                in("rdx") value,
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        self.write32_slow(offset, value);
    }
}

/// What the trampoline calls: [`ModelMmio::write32_slow`].
#[cfg(target_arch = "x86_64")]
extern "C" fn write32_entry(mmio: &ModelMmio, offset: usize, value: u32) {
    mmio.write32_slow(offset, value);
}

#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    /// Calls `write32_entry(rdi, rsi, edx)` preserving every register (see `write32_saved`).
    fn bareverbs_model_write32_saved();
}

// The trampoline: saves the caller-saved general-purpose registers and xmm0-15, aligns the
// stack, calls `write32_entry`, restores everything.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.bareverbs_model_write32_saved,\"ax\",@progbits",
    ".globl bareverbs_model_write32_saved",
    ".hidden bareverbs_model_write32_saved",
    "bareverbs_model_write32_saved:",
    "push rbp",
    "mov rbp, rsp",
    "push rax",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "and rsp, -16",
    "sub rsp, 256",
    "movdqu [rsp + 0], xmm0",
    "movdqu [rsp + 16], xmm1",
    "movdqu [rsp + 32], xmm2",
    "movdqu [rsp + 48], xmm3",
    "movdqu [rsp + 64], xmm4",
    "movdqu [rsp + 80], xmm5",
    "movdqu [rsp + 96], xmm6",
    "movdqu [rsp + 112], xmm7",
    "movdqu [rsp + 128], xmm8",
    "movdqu [rsp + 144], xmm9",
    "movdqu [rsp + 160], xmm10",
    "movdqu [rsp + 176], xmm11",
    "movdqu [rsp + 192], xmm12",
    "movdqu [rsp + 208], xmm13",
    "movdqu [rsp + 224], xmm14",
    "movdqu [rsp + 240], xmm15",
    "call {entry}",
    "movdqu xmm0, [rsp + 0]",
    "movdqu xmm1, [rsp + 16]",
    "movdqu xmm2, [rsp + 32]",
    "movdqu xmm3, [rsp + 48]",
    "movdqu xmm4, [rsp + 64]",
    "movdqu xmm5, [rsp + 80]",
    "movdqu xmm6, [rsp + 96]",
    "movdqu xmm7, [rsp + 112]",
    "movdqu xmm8, [rsp + 128]",
    "movdqu xmm9, [rsp + 144]",
    "movdqu xmm10, [rsp + 160]",
    "movdqu xmm11, [rsp + 176]",
    "movdqu xmm12, [rsp + 192]",
    "movdqu xmm13, [rsp + 208]",
    "movdqu xmm14, [rsp + 224]",
    "movdqu xmm15, [rsp + 240]",
    "lea rsp, [rbp - 72]",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "pop rax",
    "pop rbp",
    "ret",
    ".popsection",
    entry = sym write32_entry,
);

impl ModelMmio {
    #[cold]
    #[inline(never)]
    fn write32_slow(&self, offset: usize, value: u32) {
        self.model.mmio_write(self.bar, self.size, offset, value);
    }
}

impl Model {
    /// A write of `value` at byte `offset` of BAR `bar`, mapped `size` bytes long.
    fn mmio_write(&self, bar: usize, size: usize, offset: usize, value: u32) {
        if !offset.is_multiple_of(4) || offset + 4 > size {
            return;
        }
        let mut g = self.lock();
        let Inner {
            cfg,
            mem,
            pci,
            dev,
            violations,
            liar,
        } = &mut *g;
        if !pci.pvrdma_decodes() {
            violations.qemu(
                hostile::point::PCI,
                format!("BAR{bar} write with memory decoding off"),
            );
            return;
        }
        let bus_master = pci.pvrdma_bus_master();
        let mut ctx = device::Ctx {
            cfg,
            mem,
            violations,
            liar,
            bus_master,
            msix_live: pci.msix_unmasked(),
        };
        match bar {
            0 => pci.bar0_write(offset, value),
            1 => dev.reg_write(&mut ctx, offset, value),
            _ => dev.doorbell(&mut ctx, offset, value),
        }
        g.deliver_interrupts();
        drop(g);
        self.run_msi_handler();
    }
}
