//! The storage appliance: an NVMe over Fabrics RDMA target on the software RoCE device,
//! serving the subsystems its configuration declares ([`crate::config`]: RAM namespaces and
//! virtio-blk disks, each subsystem with its allow list) through `bareverbs-nvmf`'s target to
//! unmodified Linux hosts (`nvme discover` / `nvme connect -t rdma`). Without a declaration,
//! the built-in two: [`crate::config::NQN_RAM`] (a RAM disk of `bvnvmf.mib=` MiB) and
//! [`crate::config::NQN_BLK`] (the first virtio-blk disk). How to run it is in
//! `docs/appliance.md`.
//!
//! The kernel serves until its console receives `q`, then prints what the target counted
//! ([`report`]), flushes the virtio-blk disks and powers off. `s` on the console prints the
//! counters while it serves; every refused connection or Connect is printed as it happens,
//! with its reason. Its console also takes the lab's instruction-count marks ([`Console`]).
//! Between rounds that found nothing to do it halts (the embedder's idle hook), so that an
//! idle appliance leaves the CPU to others.

use core::cell::UnsafeCell;
use core::fmt::Write;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bareverbs::Context;
use bareverbs::cm::{Cm, CmConfig, CmError, Service};
use bareverbs::hal::Clock;
use bareverbs::verbs::Provider;
use bareverbs::verbs::{CompletionQueue, ProtectionDomain};
use bareverbs_nvmf::block::{SharedRam, SharedRamDisk};
use bareverbs_nvmf::target::{
    GroupLink, IoCounts, LATENCY_BUCKETS, LossCause, REFUSALS_KEPT, TargetError, bucket_floor_us,
};
use bareverbs_nvmf::{
    BlockDevice, Host, HostConfig, HostError, RamDisk, Subsystem, Target, TargetConfig,
    TargetCounts,
};

use bareverbs_platform::{Failure, Step};

use bareverbs_nvmf::wire::ana::AnaState;

use crate::config::{Config, MAX_NAMESPACES, MAX_SUBSYSTEMS, Medium, RAM_BLOCK, SubsystemConfig};

/// A declared subsystem's namespace identities and ANA states, as the target takes them.
fn multipath_of<'s>(s: &'s SubsystemConfig<'_>) -> bareverbs_nvmf::target::Multipath<'s> {
    let n = s.namespaces.len().min(s.shared.ids.len());
    let mut m = bareverbs_nvmf::target::Multipath::new(&s.shared.ids[..n]);
    for (g, &state) in (1..).zip(&s.shared.ana) {
        m = m.with_state(g, state);
    }
    m
}

/// The subsystem Linux's nvmet-rdma serves the appliance's host mode (qemu/roce/nvmf.sh sets
/// it up on a brd disk).
pub const NQN_LINUX: &str = "nqn.2026-11.io.bareverbs:linux-brd-uk";
/// This machine's host NQN.
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:62617265-7665-7262-732d-6e766d660000";
/// Bytes the host mode writes, reads back and compares.
pub const HOST_BYTES: usize = 256 * 1024;
/// Bytes one host command moves.
const HOST_CHUNK: usize = 32 * 1024;
/// Bytes of the RAM handed to [`serve`] the host mode uses as its scratch (before the target
/// serves; zeroed after).
pub const HOST_SCRATCH: usize = 2 * HOST_CHUNK;
/// Milliseconds the host mode keeps trying to connect while the target is not up yet.
const HOST_CONNECT_MS: u64 = 60_000;
/// Queues the target holds at once (admin and I/O of every controller): four hosts with an
/// admin and [`IO_QUEUES`] I/O queues each, and two spare for a discovery controller and a
/// host that reconnects while its old controller still waits for its keep-alive to expire
/// (a host that vanished holds its queues at most the target's keep-alive maximum, 120 s).
/// The target's queue table lives in static memory ([`TARGET_MEMORY`] bytes: about 4.6 KB a
/// queue, its counters included), and each I/O queue registers about 4.3 MiB of the DMA region (its 32 data
/// buffers of 128 KiB and its 64 receive buffers): these bound it. A queue the DMA region cannot hold is refused (REJ,
/// no resources), as one beyond the table.
const QUEUES: usize = 14;
/// I/O queues a controller may have (Linux asks for one per CPU and takes what Number of
/// Queues grants).
const IO_QUEUES: u16 = 2;
/// Commands per queue at most (a Linux host asks for 128 and takes what the controller's
/// MQES allows).
const DEPTH: usize = 64;
/// Entries of the completion queue every queue's work completes on.
const CQ_ENTRIES: u32 = (QUEUES * 4 * DEPTH) as u32;
/// Connections the CM tracks: every queue, and as many again for connections the target
/// ended whose DREQ goes unanswered (a host that vanished: 16 sends 6.144 s apart) or that
/// wait in TIME_WAIT.
const CONNS: usize = 2 * QUEUES;
/// Refusal lines printed a second at most (the console is slow, and anyone may send
/// connection requests).
const REFUSAL_LINES: u32 = 8;

/// What a byte on the console asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// `q`: stop serving.
    Quit,
    /// `s`: print the counters ([`report`]).
    Stats,
    /// `m` and four hex digits: run the instruction counter's mark of that code ([`mark`]).
    Mark(u16),
    /// `a`, a group digit (1 to 4) and `o`, `n` or `i`: put that ANA group of every
    /// subsystem in the optimized, non-optimized or inaccessible state, and tell the hosts.
    Ana(u32, AnaState),
}

/// The console's commands, a byte at a time: `q`, `s`, `aGS` (an ANA state) and `mXXXX` (the
/// lab's marks around a counted job). Anything else is ignored (and ends a mark or an ANA
/// command being read).
#[derive(Clone, Copy, Debug, Default)]
pub struct Console {
    /// A mark being read: its digits so far, and how many.
    mark: Option<(u16, u8)>,
    /// An ANA command being read: its group once given.
    ana: Option<Option<u32>>,
}

impl Console {
    /// Takes one byte; the command it completes, if any.
    pub fn feed(&mut self, b: u8) -> Option<Command> {
        if let Some(group) = self.ana.take() {
            match (group, b) {
                (None, b'1'..=b'4') => self.ana = Some(Some(u32::from(b - b'0'))),
                (Some(g), b'o') => return Some(Command::Ana(g, AnaState::Optimized)),
                (Some(g), b'n') => return Some(Command::Ana(g, AnaState::NonOptimized)),
                (Some(g), b'i') => return Some(Command::Ana(g, AnaState::Inaccessible)),
                _ => {}
            }
            return None;
        }
        if let Some((code, n)) = self.mark.take()
            && let Some(d) = char::from(b).to_digit(16)
        {
            let code = code << 4 | d as u16;
            if n == 3 {
                return Some(Command::Mark(code));
            }
            self.mark = Some((code, n + 1));
            return None;
        }
        match b {
            b'q' => Some(Command::Quit),
            b's' => Some(Command::Stats),
            b'a' => {
                self.ana = Some(None);
                None
            }
            b'm' => {
                self.mark = Some((0, 0));
                None
            }
            _ => None,
        }
    }
}

/// Runs the instruction counter's mark `code` (`qemu/roce/icount.c`: the lab's windows
/// `00KK`..`01KK` around counted job KK, for KK 01 to 06: the three jobs on the RAM namespace,
/// then on the NVMe namespace); whether `code` is one of those.
/// The marker is an instruction with the code inside, so each code is its own.
pub fn mark(code: u16) -> bool {
    use bareverbs_platform::mark as m;
    match code {
        0x0001 => m::<0x0001>(),
        0x0002 => m::<0x0002>(),
        0x0003 => m::<0x0003>(),
        0x0004 => m::<0x0004>(),
        0x0005 => m::<0x0005>(),
        0x0006 => m::<0x0006>(),
        0x0101 => m::<0x0101>(),
        0x0102 => m::<0x0102>(),
        0x0103 => m::<0x0103>(),
        0x0104 => m::<0x0104>(),
        0x0105 => m::<0x0105>(),
        0x0106 => m::<0x0106>(),
        _ => return false,
    }
    true
}

/// Why the appliance stopped early.
#[derive(Debug)]
pub enum AppError {
    /// A verbs step failed.
    Verbs(Failure),
    /// The connection manager could not be set up.
    Cm(&'static str, CmError),
    /// The target refused its configuration.
    Target(bareverbs_nvmf::target::TargetError),
    /// The host mode failed (at which step).
    Host(&'static str, HostError),
    /// The host mode read back other bytes than it wrote (at which byte).
    HostData(usize),
    /// The target's memory was taken already, or is too small for the target.
    TargetMemory,
    /// The memory or the disks handed over do not hold the namespaces the configuration
    /// declares.
    Namespaces,
}

impl From<Failure> for AppError {
    fn from(f: Failure) -> Self {
        AppError::Verbs(f)
    }
}

impl core::fmt::Display for AppError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AppError::Verbs(e) => write!(f, "{e}"),
            AppError::Cm(what, e) => write!(f, "{what}: {e}"),
            AppError::Target(e) => write!(f, "{e}"),
            AppError::Host(what, e) => write!(f, "host mode, {what}: {e}"),
            AppError::HostData(at) => write!(f, "host mode: byte {at} read back differs"),
            AppError::Namespaces => write!(
                f,
                "the RAM or the disks handed over do not hold the configuration's namespaces"
            ),
            AppError::TargetMemory => write!(
                f,
                "no memory for the target (taken already, or the target needs more than {TARGET_MEMORY} bytes)"
            ),
        }
    }
}

/// Bytes of the static memory the target is built in (one target a run).
pub const TARGET_MEMORY: usize = 128 * 1024;

/// The memory a target lives in (core 0's, or a poll group's): static, taken once a run.
#[repr(C, align(64))]
struct StaticMemory<const N: usize> {
    mem: UnsafeCell<MaybeUninit<[u8; N]>>,
    taken: AtomicBool,
}

/// A target's.
type TargetMemory = StaticMemory<TARGET_MEMORY>;

// SAFETY: the memory is reached only through `take`, which hands it out once.
unsafe impl<const N: usize> Sync for StaticMemory<N> {}

/// The poll groups' links (each holds its two rings: 157.6 KiB with the software RoCE
/// device, most of it the ring of Connects a group passes to core 0).
static LINK_MEMORY: StaticMemory<{ MAX_GROUPS * 168 * 1024 }> = StaticMemory::new();

/// Core 0's target.
static TARGET_MEMORY_CELL: TargetMemory = TargetMemory::new();

/// Each poll group's target.
static GROUP_MEMORY: [TargetMemory; MAX_GROUPS] = [const { TargetMemory::new() }; MAX_GROUPS];

impl<const N: usize> StaticMemory<N> {
    const fn new() -> Self {
        StaticMemory {
            mem: UnsafeCell::new(MaybeUninit::uninit()),
            taken: AtomicBool::new(false),
        }
    }

    /// The memory, as an uninitialised `T`, the first time it is asked for (for any lifetime:
    /// the memory is static, and nothing else reaches it); `None` after that, or when a `T`
    /// does not fit (size or alignment).
    fn take<'t, T>(&'static self) -> Option<&'t mut MaybeUninit<T>> {
        if size_of::<T>() > N || align_of::<T>() > align_of::<Self>() {
            return None;
        }
        if self.taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        // SAFETY: the static's bytes, handed out once (the flag above); large and aligned
        // enough for a `T` (checked above: the bytes are the struct's first field, at its
        // start); `MaybeUninit` asks nothing of their contents.
        Some(unsafe { &mut *self.mem.get().cast::<MaybeUninit<T>>() })
    }
}

/// The CM's and the target's clock: the kernel's millisecond clock.
#[derive(Clone, Copy)]
struct Ms<'c>(&'c dyn Fn() -> u64);

impl Clock for Ms<'_> {
    fn now_us(&self) -> u64 {
        (self.0)().saturating_mul(1000)
    }
}

/// What the target did while it served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// The target's counts.
    pub counts: TargetCounts,
    /// Milliseconds it served.
    pub ms: u64,
}

/// Poll groups the appliance runs at most: CPUs past `1 + MAX_GROUPS` idle.
pub const MAX_GROUPS: usize = 3;

/// The other CPUs an embedder lends the target, each to run one poll group
/// (`docs/percore.md`).
pub trait Cores: Sync {
    /// CPUs besides this one that can run a job.
    fn count(&self) -> usize;
    /// Runs `job(k)` on CPU `k + 1` for every `k < count()` while `main` runs on this CPU;
    /// returns when `main` and every job returned (a job may borrow what `main` borrows).
    fn run(&self, job: &(dyn Fn(usize) + Sync), main: &mut dyn FnMut());
    /// Waits, on the CPU that calls it, for an interrupt or a bounded time (an idle poll
    /// group's halt), unless [`wake`](Self::wake) came since this CPU's
    /// [`sleeping`](Self::sleeping).
    fn wait(&self);
    /// Job `k`'s CPU says it is about to wait (`true`: it polls once more first) or is
    /// polling again (`false`).
    fn sleeping(&self, _k: usize, _on: bool) {}
    /// Wakes every job's CPU that said it is sleeping (core 0, after a round that did work:
    /// completions may have gone to a group's CQ).
    fn wake(&self) {}
    /// A job's round did work (called on its CPU): it may have posted requests, or sent core 0
    /// a message, that only core 0's loop carries on (the device's progress, the link), so
    /// core 0 is woken if it said it is halting. Nothing when it is awake (a read of a line
    /// only core 0 writes).
    fn posted(&self) {}
}

/// Whether every namespace of `s` can be served by several cores at once (RAM): its I/O
/// queues may go to the poll groups; a virtio-blk or NVMe namespace (a medium with one queue
/// of its own, driven by core 0) keeps them on core 0.
fn shareable(s: &crate::config::SubsystemConfig<'_>) -> bool {
    s.namespaces.iter().all(|m| matches!(m, Medium::Ram { .. }))
}

/// The poll groups [`serve`] runs for `config` on `cores`: one per CPU `cores` lends, up to
/// [`MAX_GROUPS`], when a subsystem has its namespaces in RAM only; none otherwise.
pub fn groups(config: &Config<'_>, cores: &dyn Cores) -> usize {
    if config.subsystems.iter().any(shareable) {
        cores.count().min(MAX_GROUPS)
    } else {
        0
    }
}

/// No CPU but this one: `run` runs `main` only.
pub struct OneCore;

impl Cores for OneCore {
    fn count(&self) -> usize {
        0
    }
    fn run(&self, _: &(dyn Fn(usize) + Sync), main: &mut dyn FnMut()) {
        main()
    }
    fn wait(&self) {}
}

/// Namespaces the appliance serves at most (every subsystem's together).
pub const MAX_NAMESPACES_IN_ALL: usize = MAX_SUBSYSTEMS * MAX_NAMESPACES;

/// An NVMe namespace handed to [`serve`]: which controller (PCI order) and NSID it is, and
/// its device (`None`: taken already, or it did not come up).
pub struct NvmeNamespace<'d> {
    /// The controller, from 0.
    pub controller: usize,
    /// The NSID on it.
    pub nsid: u32,
    /// The namespace as a block device.
    pub disk: Option<&'d mut dyn BlockDevice>,
}

/// At `config.ip`. With `config.host`, first connects as a host to [`NQN_LINUX`] there
/// (writes 256 KiB, reads it back, compares; `ram`'s first 64 KiB are its scratch, zeroed
/// after) and prints its `nvmf-uk host:` line; then serves `config`'s subsystems on
/// `config.port` of `ctx`'s device until `console` returns [`Command::Quit`]
/// ([`Command::Stats`]: prints the counters). The RAM namespaces are laid over `ram` in the
/// order they are declared; `blk:N` is `disks[N]` (`None`: a disk that did not come up);
/// `nvme:C/NSID` is the entry of `nvme` with that controller and NSID. Prints a line when it listens and one per
/// subsystem, one per controller count change, one per refusal (with its reason), and the
/// counters at the end. `idle` is called after every round with the work it did (the embedder
/// halts when there was none and no frame came in).
///
/// With `cores` lending other CPUs and every namespace in RAM, each of them (up to
/// [`MAX_GROUPS`]) runs a poll group, and I/O queues are spread over this CPU and the groups;
/// a virtio-blk or NVMe namespace (a medium with one queue of its own) keeps every queue on
/// this CPU.
///
/// # Errors
///
/// [`AppError::Namespaces`] when `ram`, `disks` or `nvme` do not hold what `config` declares
/// (it was checked against a [`crate::config::Machine`] that they do not match); the
/// verbs', the CM's and the target's errors as they come.
#[allow(clippy::too_many_arguments)]
pub fn serve<P: bareverbs::verbs::SharedProvider>(
    ctx: &Context<P>,
    config: &Config<'_>,
    ram: &mut [u8],
    disks: &mut [Option<&mut dyn BlockDevice>],
    nvme: &mut [NvmeNamespace<'_>],
    out: &mut dyn Write,
    clock_ms: &(dyn Fn() -> u64 + Sync),
    console: &mut dyn FnMut() -> Option<Command>,
    idle: &mut dyn FnMut(usize),
    cores: &dyn Cores,
) -> Result<Served, AppError> {
    let pd = ctx.alloc_pd().at("nvmf: alloc PD")?;
    let cm_cq = ctx.create_cq(64).at("nvmf: create the CM's CQ")?;
    let cq = ctx
        .create_cq(CQ_ENTRIES)
        .at("nvmf: create the target's CQ")?;
    // Poll groups on the other CPUs when a subsystem has its namespaces in RAM only (shared
    // between the cores); the queues of the others (virtio-blk, NVMe: a medium with one queue
    // of its own) stay on this CPU. A queue's core is chosen when it is accepted, by the
    // controller its connection request names (`Subsystem::core0_only`).
    let all_shareable = config.subsystems.iter().all(shareable);
    let groups = groups(config, cores);
    // Each poll group's completion queue and link (made before the CM, which outlives
    // neither).
    let mut group_cqs: heapless::Vec<CompletionQueue<'_, P>, MAX_GROUPS> = heapless::Vec::new();
    for _ in 0..groups {
        let cq = ctx
            .create_cq(CQ_ENTRIES)
            .at("nvmf: create a poll group's CQ")?;
        let _ = group_cqs.push(cq);
    }
    // In static memory (their rings are large), never dropped (a link has no drop of its
    // own); those past `groups` name core 0's CQ and are never used.
    let slot = LINK_MEMORY
        .take::<[GroupLink<'_, P>; MAX_GROUPS]>()
        .ok_or(AppError::TargetMemory)?;
    let first = slot.as_mut_ptr().cast::<GroupLink<'_, P>>();
    for k in 0..MAX_GROUPS {
        // SAFETY: element `k` of the array `slot` holds (in bounds, aligned as the array).
        unsafe {
            first
                .add(k)
                .write(GroupLink::new(group_cqs.get(k).unwrap_or(&cq)))
        };
    }
    // SAFETY: every element was written above.
    let links: &[GroupLink<'_, P>; MAX_GROUPS] = unsafe { slot.assume_init_ref() };
    // The host mode's (its default 5 queues of 32 commands, each command a send and a
    // receive).
    let host_cq = ctx
        .create_cq(5 * 2 * 32 + 8)
        .at("nvmf: create the host's CQ")?;
    let mut cm: Cm<'_, P, Ms<'_>, CONNS> = Cm::new(&pd, &cm_cq, Ms(clock_ms), CmConfig::default())
        .map_err(|e| AppError::Cm("CM over QP1", e))?;
    let (ip, port) = (config.ip, config.port);
    if let Some(linux) = config.host {
        // The RAM namespaces' memory is the host mode's scratch (the target does not serve
        // yet).
        let scratch = ram.get_mut(..HOST_SCRATCH).ok_or(AppError::HostData(0))?;
        let done = host_check(&pd, &host_cq, &mut cm, linux, scratch, clock_ms)?;
        let [a, b, c, d] = linux;
        let _ = writeln!(
            out,
            "nvmf-uk host: ok connected to {NQN_LINUX} at {a}.{b}.{c}.{d} (controller {}, {} blocks of {} B), wrote {} bytes in {} commands, read them back equal, flushed, disconnected; {} ms",
            done.cntlid, done.blocks, done.block, HOST_BYTES, done.commands, done.ms
        );
        ram[..HOST_SCRATCH].fill(0);
    }
    cm.listen(None, port, Service::Rc)
        .map_err(|e| AppError::Cm("listen on the configured port", e))?;

    if cores.count() > 0 {
        let _ = writeln!(
            out,
            "nvmf: cores: {} CPUs; {}{}",
            cores.count() + 1,
            if groups == 0 {
                "I/O queues all on core 0 (a virtio-blk or NVMe namespace cannot be shared between cores)"
            } else if all_shareable {
                "I/O queues spread over core 0 and the poll groups"
            } else {
                "I/O queues of RAM subsystems spread over core 0 and the poll groups, of virtio-blk and NVMe ones on core 0"
            },
            if cores.count() > groups && groups > 0 {
                " (CPUs past the poll groups' limit idle)"
            } else {
                ""
            }
        );
    }
    // The RAM namespaces, over `ram` in the order declared (shared between the cores when
    // there are poll groups).
    let mut rams: heapless::Vec<RamDisk<'_>, MAX_NAMESPACES_IN_ALL> = heapless::Vec::new();
    let mut shared: heapless::Vec<SharedRam<'_>, MAX_NAMESPACES_IN_ALL> = heapless::Vec::new();
    let mut rest = ram;
    for m in config.subsystems.iter().flat_map(|s| s.namespaces.iter()) {
        if let Medium::Ram { bytes } = *m {
            let bytes = usize::try_from(bytes).map_err(|_| AppError::Namespaces)?;
            if bytes > rest.len() {
                return Err(AppError::Namespaces);
            }
            let (this, after) = rest.split_at_mut(bytes);
            if groups > 0 {
                let disk =
                    SharedRam::new(this, RAM_BLOCK as u32).map_err(|_| AppError::Namespaces)?;
                shared.push(disk).map_err(|_| AppError::Namespaces)?;
            } else {
                rams.push(RamDisk::new(this, RAM_BLOCK as u32))
                    .map_err(|_| AppError::Namespaces)?;
            }
            rest = after;
        }
    }
    let mut own: heapless::Vec<SharedRamDisk<'_>, MAX_NAMESPACES_IN_ALL> =
        shared.iter().map(SharedRam::handle).collect();
    // Every namespace in subsystem order (the unused tail of the table stays on empty
    // placeholders), then a slice of it for each subsystem.
    let mut placeholders = [const { NoDisk }; MAX_NAMESPACES_IN_ALL];
    let mut table: [&mut dyn BlockDevice; MAX_NAMESPACES_IN_ALL] =
        placeholders.each_mut().map(|d| d as &mut dyn BlockDevice);
    let mut ram_disks = rams
        .iter_mut()
        .map(|r| r as &mut dyn BlockDevice)
        .chain(own.iter_mut().map(|r| r as &mut dyn BlockDevice));
    let mut used = 0;
    for m in config.subsystems.iter().flat_map(|s| s.namespaces.iter()) {
        let dev: &mut dyn BlockDevice = match *m {
            Medium::Ram { .. } => ram_disks.next().ok_or(AppError::Namespaces)?,
            Medium::Blk { index } => disks
                .get_mut(index)
                .and_then(Option::take)
                .ok_or(AppError::Namespaces)?,
            Medium::Nvme { controller, nsid } => nvme
                .iter_mut()
                .find(|n| n.controller == controller && n.nsid == nsid)
                .and_then(|n| n.disk.take())
                .ok_or(AppError::Namespaces)?,
        };
        *table.get_mut(used).ok_or(AppError::Namespaces)? = dev;
        used += 1;
    }
    // The subsystems in an array (the target borrows them for as long as it lives, which a
    // container with its own drop could not lend); the unused tail is never handed over.
    let mut table_of_subsystems: [Subsystem<'_>; MAX_SUBSYSTEMS] =
        core::array::from_fn(|_| Subsystem::new("", &mut []));
    let mut rest: &mut [&mut dyn BlockDevice] = &mut table[..used];
    let declared = config.subsystems.len().min(MAX_SUBSYSTEMS);
    for (slot, s) in table_of_subsystems.iter_mut().zip(&config.subsystems) {
        let n = s.namespaces.len();
        if n > rest.len() {
            return Err(AppError::Namespaces);
        }
        let (these, after) = core::mem::take(&mut rest).split_at_mut(n);
        *slot = Subsystem {
            allowed_hosts: &s.allow,
            core0_only: !shareable(s),
            multipath: multipath_of(s),
            ..Subsystem::new(s.nqn, these)
        };
        rest = after;
    }
    let subsystems = &mut table_of_subsystems[..declared];
    // What is served, before the target takes the subsystems.
    let [a, b, c, d] = ip;
    let _ = writeln!(
        out,
        "nvmf: target on {a}.{b}.{c}.{d}:{port}: {} subsystems ({})",
        subsystems.len(),
        if config.built_in {
            "the built-in configuration"
        } else {
            "as the command line declares them"
        }
    );
    for (s, declared) in subsystems.iter().zip(config.subsystems.iter()) {
        let _ = write!(out, "nvmf: subsystem {}:", s.nqn);
        if s.namespaces.is_empty() {
            let _ = write!(out, " no namespace (no disk),");
        }
        for (k, (dev, m)) in s
            .namespaces
            .iter()
            .zip(declared.namespaces.iter())
            .enumerate()
        {
            let what = match *m {
                Medium::Ram { .. } => Medium::Ram { bytes: 0 },
                blk => blk,
            };
            let _ = write!(
                out,
                " ns {} {} ({} blocks of {} B, volatile write cache {}),",
                k + 1,
                MediumName(what),
                dev.capacity(),
                dev.block_size(),
                if dev.volatile_cache() { "yes" } else { "no" }
            );
        }
        match s.allowed_hosts {
            [] => {
                let _ = writeln!(out, " any host NQN may connect");
            }
            hosts => {
                let _ = write!(out, " host NQNs allowed:");
                for nqn in hosts {
                    let _ = write!(out, " {nqn}");
                }
                let _ = writeln!(out);
            }
        }
    }
    // Where other appliances serve the same namespaces: this one's controller IDs and peers.
    let mp = &config.multipath;
    let _ = write!(
        out,
        "nvmf: controller IDs {}-{}, port ID {}, peers:",
        mp.cntlid.0, mp.cntlid.1, mp.port_id
    );
    for p in mp.peers.iter().flatten() {
        let [a, b, c, d] = p.addr;
        let _ = write!(out, " {a}.{b}.{c}.{d}:{} (port ID {})", p.port, p.port_id);
    }
    let _ = writeln!(
        out,
        "{}",
        if mp.peers.iter().all(Option::is_none) {
            " none"
        } else {
            ""
        }
    );
    // The target's queue table is too large for the stack: it is built in the appliance's
    // static memory for it (one target a run).
    let slot = TARGET_MEMORY_CELL
        .take::<Target<'_, '_, P, Ms<'_>, QUEUES, DEPTH>>()
        .ok_or(AppError::TargetMemory)?;
    let mp = config.multipath;
    let target_config = TargetConfig {
        port,
        io_depth: DEPTH as u16,
        max_io_queues: IO_QUEUES,
        port_id: mp.port_id,
        cntlid_min: mp.cntlid.0,
        cntlid_max: mp.cntlid.1,
        peers: mp.peers,
        ..TargetConfig::default()
    };
    let mut target = Target::new_in(slot, &pd, &cq, Ms(clock_ms), ip, target_config, subsystems)
        .map_err(AppError::Target)?;
    if groups > 0 {
        target
            .serve_groups(&links[..groups])
            .map_err(AppError::Target)?;
    }
    let _ = writeln!(
        out,
        "nvmf: the target's queue table in static memory: {} of {TARGET_MEMORY} bytes",
        size_of::<Target<'_, '_, P, Ms<'_>, QUEUES, DEPTH>>()
    );
    let t0 = clock_ms();
    let mut seen = TargetCounts::default();
    let (mut refusals, mut window_ms, mut lines) = (0, t0, 0);
    // Each poll group: its target on its own CPU until core 0 is done.
    let stop = AtomicBool::new(false);
    let failed = AtomicUsize::new(0);
    let job = |k: usize| {
        let (Some(cq), Some(link), Some(memory)) = (
            group_cqs.get(k),
            links[..groups].get(k),
            GROUP_MEMORY.get(k),
        ) else {
            return;
        };
        let r = serve_group(
            k,
            memory,
            &pd,
            cq,
            link,
            config,
            &shared,
            ip,
            target_config,
            clock_ms,
            &stop,
            cores,
        );
        if r.is_err() {
            failed.fetch_add(1, Ordering::Relaxed);
        }
    };
    let mut main = || {
        loop {
            let work = target.poll(&mut cm);
            let now = target.counts();
            if (now.controllers, now.lost, now.rejected)
                != (seen.controllers, seen.lost, seen.rejected)
            {
                let _ = writeln!(
                    out,
                    "nvmf: +{} ms: {} controllers made, {} lost, {} connections rejected, {} commands ({} with an error status, {} answered with Invalidate)",
                    clock_ms() - t0,
                    now.controllers,
                    now.lost,
                    now.rejected,
                    now.commands,
                    now.errors,
                    now.invalidated
                );
                // Each controller lost since, with why (those the target still keeps).
                for seq in seen.lost + 1..=now.lost {
                    let Some(l) = target.loss(seq) else { continue };
                    let [a, b, c, d] = l.station;
                    let why = match l.cause {
                        LossCause::KeepAlive => "its keep-alive timer expired",
                        LossCause::Disconnected => "its admin queue was disconnected",
                        LossCause::Transport => "its admin queue's QP failed",
                        LossCause::Other => "its admin queue ended",
                    };
                    let _ = writeln!(
                        out,
                        "nvmf: +{} ms: controller {} of {a}.{b}.{c}.{d} lost: {why}; its last command {} ms before, keep-alive timeout {} ms; its longest silence before {} ms",
                        (l.at_us / 1000).saturating_sub(t0),
                        l.cntlid,
                        l.idle_us / 1000,
                        l.kato_ms,
                        l.longest_idle_us / 1000
                    );
                }
                seen = now;
            }
            // Every refusal, with its reason. The console is slow and the requests may come from
            // anyone: at most REFUSAL_LINES lines a second; the rest (and those the target's log
            // no longer keeps) are told as a number when lines may be printed again.
            if refusals < now.refusals {
                let ms = clock_ms();
                if ms.saturating_sub(window_ms) >= 1000 {
                    (window_ms, lines) = (ms, 0);
                }
                while refusals < now.refusals && lines < REFUSAL_LINES {
                    let oldest = now.refusals.saturating_sub(REFUSALS_KEPT as u64) + 1;
                    if refusals + 1 < oldest {
                        let _ = writeln!(
                            out,
                            "nvmf: refusals {} to {}: not printed (more than {REFUSAL_LINES} a second, or a burst)",
                            refusals + 1,
                            oldest - 1
                        );
                        refusals = oldest - 1;
                        lines += 1;
                        continue;
                    }
                    refusals += 1;
                    lines += 1;
                    let Some(r) = target.refusal(refusals) else {
                        continue;
                    };
                    let [a, b, c, d] = r.station;
                    let _ = write!(
                        out,
                        "nvmf: refusal {} from {a}.{b}.{c}.{d} at +{} ms: {}",
                        r.seq,
                        (r.at_us / 1000).saturating_sub(t0),
                        r.reason
                    );
                    match r.hostnqn {
                        Some(n) => {
                            let _ = writeln!(out, " (host {})", n.as_str());
                        }
                        None => {
                            let _ = writeln!(out);
                        }
                    }
                }
            }
            match console() {
                Some(Command::Quit) => break,
                Some(Command::Stats) => report(out, &*target, clock_ms() - t0),
                Some(Command::Ana(g, state)) => {
                    for (k, s) in config.subsystems.iter().enumerate() {
                        match target.set_ana_state(k, g, state) {
                            Ok(told) => {
                                let _ = writeln!(
                                    out,
                                    "nvmf: ANA group {g} of {}: {} ({told} controllers told)",
                                    s.nqn,
                                    state.name()
                                );
                            }
                            Err(e) => {
                                let _ = writeln!(out, "nvmf: ANA group {g} of {}: {e}", s.nqn);
                            }
                        }
                    }
                }
                _ => {}
            }
            if work > 0 && groups > 0 {
                cores.wake();
            }
            idle(work);
        }
        report(out, &*target, clock_ms() - t0);
        stop.store(true, Ordering::Release);
    };
    cores.run(&job, &mut main);
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        let _ = writeln!(
            out,
            "nvmf: {failed} poll groups did not start (their CPUs idled)"
        );
    }
    Ok(Served {
        counts: target.counts(),
        ms: clock_ms() - t0,
    })
}

/// One poll group: its own target over `cq`, the same subsystems over its own handles of
/// `shared`, joined to `link`, polled until `stop` (halting through `cores` when idle).
#[allow(clippy::too_many_arguments)]
fn serve_group<'a, P: Provider>(
    k: usize,
    memory: &'static TargetMemory,
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    link: &'a GroupLink<'a, P>,
    config: &Config<'_>,
    shared: &[SharedRam<'_>],
    ip: [u8; 4],
    cfg: TargetConfig,
    clock_ms: &(dyn Fn() -> u64 + Sync),
    stop: &AtomicBool,
    cores: &dyn Cores,
) -> Result<(), TargetError> {
    let mut handles: heapless::Vec<SharedRamDisk<'_>, MAX_NAMESPACES_IN_ALL> =
        shared.iter().map(SharedRam::handle).collect();
    let mut placeholders = [const { NoDisk }; MAX_NAMESPACES_IN_ALL];
    let mut table: [&mut dyn BlockDevice; MAX_NAMESPACES_IN_ALL] =
        placeholders.each_mut().map(|d| d as &mut dyn BlockDevice);
    // Every namespace in subsystem order: the RAM ones this group's handles, the others
    // empty placeholders (their subsystems' queues stay on core 0, `core0_only`).
    let mut own = handles.iter_mut();
    let mut used = 0;
    let media = config.subsystems.iter().flat_map(|s| s.namespaces.iter());
    for (slot, m) in table.iter_mut().zip(media) {
        if let Medium::Ram { .. } = m {
            *slot = own
                .next()
                .ok_or(TargetError::Config("poll group namespaces"))?;
        }
        used += 1;
    }
    let mut subsystems: [Subsystem<'_>; MAX_SUBSYSTEMS] =
        core::array::from_fn(|_| Subsystem::new("", &mut []));
    let mut rest: &mut [&mut dyn BlockDevice] = &mut table[..used];
    let declared = config.subsystems.len().min(MAX_SUBSYSTEMS);
    for (slot, s) in subsystems.iter_mut().zip(&config.subsystems) {
        let n = s.namespaces.len();
        if n > rest.len() {
            return Err(TargetError::Config("poll group namespaces"));
        }
        let (these, after) = core::mem::take(&mut rest).split_at_mut(n);
        *slot = Subsystem {
            allowed_hosts: &s.allow,
            core0_only: !shareable(s),
            multipath: multipath_of(s),
            ..Subsystem::new(s.nqn, these)
        };
        rest = after;
    }
    let slot = memory
        .take::<Target<'_, '_, P, Ms<'_>, QUEUES, DEPTH>>()
        .ok_or(TargetError::Config("poll group memory"))?;
    let mut target = Target::new_in(
        slot,
        pd,
        cq,
        Ms(clock_ms),
        ip,
        cfg,
        &mut subsystems[..declared],
    )?;
    target.join_group(link)?;
    while !stop.load(Ordering::Acquire) {
        let work = target.poll_group();
        if work > 0 {
            // Its posts go out in core 0's progress: core 0 must not sleep through them.
            cores.posted();
        } else {
            // Said before the last poll: core 0's wake after it adds a completion to this
            // CQ then either finds the flag or the poll finds the completion.
            cores.sleeping(k, true);
            let last = target.poll_group();
            if last == 0 && !stop.load(Ordering::Acquire) {
                cores.wait();
            }
            cores.sleeping(k, false);
            if last > 0 {
                cores.posted();
            }
        }
    }
    Ok(())
}

/// Prints the target's counters: the totals (commands, errors by status, bytes, the latency
/// histogram's non-empty buckets, refusals), then each live controller (its host, its busy
/// time) and each connected queue. Lines start with `nvmf-uk counters`.
pub fn report<P: Provider, K: Clock, const Q: usize, const D: usize>(
    out: &mut dyn Write,
    target: &Target<'_, '_, P, K, Q, D>,
    ms: u64,
) {
    let c = target.counts();
    let all = target.io_counts();
    let _ = writeln!(
        out,
        "nvmf-uk counters: after {ms} ms: {} queue connections accepted, {} rejected, {} refusals, {} controllers made, {} lost",
        c.accepted, c.rejected, c.refusals, c.controllers, c.lost
    );
    counts_line(out, "all", &all);
    // With poll groups: what each core serves (core 0 first), `+` between the cores.
    let cores = target.cores().count();
    if cores > 1 {
        let _ = write!(out, "nvmf-uk cores: {cores} cores, I/O queues ");
        for (k, c) in target.cores().enumerate() {
            let _ = write!(out, "{}{}", if k > 0 { "+" } else { "" }, c.io_queues);
        }
        let _ = write!(out, ", commands ");
        for (k, c) in target.cores().enumerate() {
            let _ = write!(out, "{}{}", if k > 0 { "+" } else { "" }, c.io_commands);
        }
        let _ = writeln!(out);
    }
    for x in target.controllers() {
        let io = target.ctrl_counts(x.cntlid).unwrap_or_default();
        let _ = writeln!(
            out,
            "nvmf-uk counters: controller {} (host {}): busy {} ms, write cache {}",
            x.cntlid,
            x.hostnqn.as_str(),
            x.busy_time_us(target.now_us()) / 1000,
            if x.wce { "on" } else { "off" }
        );
        let mut name = heapless_name::<16>();
        let _ = write!(name, "controller {}", x.cntlid);
        counts_line(out, name.as_str(), &io);
    }
    for q in target.queue_counts() {
        let mut name = heapless_name::<24>();
        match q.cntlid {
            Some(id) => {
                let _ = write!(name, "ctrl {id} queue {}", q.qid);
            }
            None => {
                let _ = write!(name, "queue {} (no Connect)", q.qid);
            }
        }
        counts_line(out, name.as_str(), &q.counts);
    }
}

/// One line of counts, and one of its errors by status and its latency histogram when there
/// are any.
fn counts_line(out: &mut dyn Write, name: &str, c: &IoCounts) {
    let _ = writeln!(
        out,
        "nvmf-uk counters: {name}: {} commands, {} errors, {} reads ({} bytes), {} writes ({} bytes), {} medium flushes, {} media errors, {} bytes copied",
        c.commands,
        c.errors,
        c.reads,
        c.bytes_read,
        c.writes,
        c.bytes_written,
        c.medium_flushes,
        c.media_errors,
        c.bytes_copied
    );
    if c.errors > 0 {
        let _ = write!(out, "nvmf-uk counters: {name}: errors by status:");
        for &(st, n) in c.by_status.iter().filter(|e| e.1 != 0) {
            let _ = write!(out, " {:#06x}={n}", st.0);
        }
        if c.other_errors > 0 {
            let _ = write!(out, " other={}", c.other_errors);
        }
        let _ = writeln!(out);
    }
    if c.latency.iter().any(|&n| n > 0) {
        let _ = write!(out, "nvmf-uk counters: {name}: latency (from µs=commands):");
        for k in (0..LATENCY_BUCKETS).filter(|&k| c.latency[k] > 0) {
            let _ = write!(out, " {}={}", bucket_floor_us(k), c.latency[k]);
        }
        let _ = writeln!(out);
    }
}

/// A short name built without the heap.
fn heapless_name<const N: usize>() -> Name<N> {
    Name { b: [0; N], len: 0 }
}

/// A few bytes of text on the stack (cut at `N`).
struct Name<const N: usize> {
    b: [u8; N],
    len: usize,
}

impl<const N: usize> Name<N> {
    fn as_str(&self) -> &str {
        core::str::from_utf8(&self.b[..self.len]).unwrap_or("?")
    }
}

impl<const N: usize> Write for Name<N> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for &c in s.as_bytes() {
            if self.len < N {
                self.b[self.len] = c;
                self.len += 1;
            }
        }
        Ok(())
    }
}

/// What the host mode did.
struct HostDone {
    cntlid: u16,
    blocks: u64,
    block: u32,
    commands: u32,
    ms: u64,
}

/// I/O queues the host mode connects.
const HOST_QUEUES: u16 = 2;

/// The host mode: connects to [`NQN_LINUX`] at `linux` (again, while nobody listens yet, for
/// [`HOST_CONNECT_MS`]), writes [`HOST_BYTES`] of a pattern from block 0 of namespace 1 in
/// [`HOST_CHUNK`] pieces, reads them back and compares, flushes and disconnects. `scratch`
/// holds two pieces.
fn host_check<'a, P: Provider, const N: usize>(
    pd: &'a bareverbs::verbs::ProtectionDomain<'a, P>,
    cq: &'a bareverbs::verbs::CompletionQueue<'a, P>,
    cm: &mut Cm<'a, P, Ms<'_>, N>,
    linux: [u8; 4],
    scratch: &mut [u8],
    clock_ms: &dyn Fn() -> u64,
) -> Result<HostDone, AppError> {
    let t0 = clock_ms();
    let cfg = HostConfig {
        addr: linux,
        subnqn: NQN_LINUX,
        hostnqn: HOSTNQN,
        hostid: *b"bareverbs-nvmf\0\0",
        max_transfer: HOST_CHUNK as u32,
        io_queues: HOST_QUEUES,
        ..HostConfig::default()
    };
    let idle = &mut || {};
    let mut host: Host<'_, '_, P, Ms<'_>> = Host::new(pd, cq, Ms(clock_ms), cfg);
    loop {
        match host.connect(cm, idle) {
            Ok(()) => break,
            Err(HostError::Rejected(_) | HostError::ConnectFailed)
                if clock_ms() - t0 < HOST_CONNECT_MS =>
            {
                host.disconnect(cm, idle).ok();
                let until = clock_ms() + 500;
                while clock_ms() < until {
                    let _ = cm.poll();
                }
            }
            Err(e) => return Err(AppError::Host("connect", e)),
        }
    }
    let r = (|| {
        let ns = host
            .identify_namespace(1, idle)
            .map_err(|e| AppError::Host("identify namespace", e))?;
        let block = 1u32 << ns.lbads.clamp(9, 12);
        let per = HOST_CHUNK as u32 / block;
        let (wbuf, rbuf) = scratch.split_at_mut(HOST_CHUNK);
        let mut commands = 0;
        for piece in 0..HOST_BYTES / HOST_CHUNK {
            let slba = (piece * HOST_CHUNK) as u64 / u64::from(block);
            for (i, b) in wbuf.iter_mut().enumerate() {
                *b = (piece * 131 + i * 7 + (i >> 9)) as u8;
            }
            // The pieces alternate between the I/O queues (a target with poll groups serves
            // them on different cores).
            let qid = 1 + piece as u16 % host.io_queues().max(1);
            host.write(qid, 1, slba, per, wbuf, idle)
                .map_err(|e| AppError::Host("write", e))?;
            rbuf.fill(0);
            host.read(qid, 1, slba, per, rbuf, idle)
                .map_err(|e| AppError::Host("read", e))?;
            commands += 2;
            if let Some(at) = wbuf.iter().zip(rbuf.iter()).position(|(w, r)| w != r) {
                return Err(AppError::HostData(piece * HOST_CHUNK + at));
            }
        }
        host.flush(1, 1, idle)
            .map_err(|e| AppError::Host("flush", e))?;
        Ok(HostDone {
            cntlid: host.cntlid(),
            blocks: ns.nsze,
            block,
            commands: commands + 1,
            ms: 0,
        })
    })();
    let down = host.disconnect(cm, idle);
    let done = r?;
    down.map_err(|e| AppError::Host("disconnect", e))?;
    Ok(HostDone {
        ms: clock_ms() - t0,
        ..done
    })
}

/// How a namespace's size is printed: blocks and whether it has a volatile write cache (what
/// Identify's VWC bit then says), or that there is no disk.
/// A namespace's medium as the console names it (`RAM`, `virtio-blk disk N`).
struct MediumName(Medium);

impl core::fmt::Display for MediumName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            Medium::Ram { .. } => write!(f, "RAM"),
            Medium::Blk { index } => write!(f, "virtio-blk disk {index}"),
            Medium::Nvme { controller, nsid } => {
                write!(f, "NVMe controller {controller} namespace {nsid}")
            }
        }
    }
}

/// The placeholder for a missing virtio-blk disk (never a namespace: the slice is cut before
/// it).
struct NoDisk;

impl BlockDevice for NoDisk {
    fn block_size(&self) -> u32 {
        512
    }
    fn capacity(&self) -> u64 {
        0
    }
    fn read(&mut self, _: u64, _: &mut [u8]) -> Result<(), bareverbs_nvmf::BlockError> {
        Err(bareverbs_nvmf::BlockError::OutOfRange)
    }
    fn write(&mut self, _: u64, _: &[u8]) -> Result<(), bareverbs_nvmf::BlockError> {
        Err(bareverbs_nvmf::BlockError::OutOfRange)
    }
    fn flush(&mut self) -> Result<(), bareverbs_nvmf::BlockError> {
        Ok(())
    }
    fn write_zeroes(&mut self, _: u64, _: u64) -> Result<(), bareverbs_nvmf::BlockError> {
        Err(bareverbs_nvmf::BlockError::OutOfRange)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    /// Lends that many CPUs (runs `main` alone: the tests only ask how many groups).
    struct Lend(usize);

    impl Cores for Lend {
        fn count(&self) -> usize {
            self.0
        }
        fn run(&self, _: &(dyn Fn(usize) + Sync), main: &mut dyn FnMut()) {
            main()
        }
        fn wait(&self) {}
    }

    #[test]
    fn poll_groups_only_over_shareable_media() {
        use crate::config::{MAX_NVME, Machine};
        let m = Machine {
            disks: 1,
            ram_bytes: 64 << 20,
            nvme: [1; MAX_NVME],
        };
        let ram = Config::parse(
            "bvnvmf.subsys=nqn.a:r bvnvmf.ns=ram:1M bvnvmf.ns=ram:1M",
            &m,
        )
        .unwrap();
        assert_eq!(groups(&ram, &Lend(1)), 1);
        assert_eq!(
            groups(&ram, &Lend(7)),
            MAX_GROUPS,
            "CPUs past the limit idle"
        );
        assert_eq!(groups(&ram, &OneCore), 0);
        // A medium with a queue of its own keeps its subsystem's queues on core 0; a RAM
        // subsystem beside it still has the poll groups.
        for other in ["blk:0", "nvme:1"] {
            let text = std::format!(
                "bvnvmf.subsys=nqn.a:r bvnvmf.ns=ram:1M bvnvmf.subsys=nqn.a:d bvnvmf.ns={other}"
            );
            let mixed = Config::parse(&text, &m).unwrap();
            assert_eq!(groups(&mixed, &Lend(1)), 1, "{other}");
            let flags: Vec<bool> = mixed.subsystems.iter().map(shareable).collect();
            assert_eq!(flags, [true, false], "{other}");
            // A subsystem of RAM and of the other medium stays on core 0 whole.
            let text = std::format!("bvnvmf.subsys=nqn.a:d bvnvmf.ns=ram:1M bvnvmf.ns={other}");
            let one = Config::parse(&text, &m).unwrap();
            assert_eq!(groups(&one, &Lend(1)), 0, "{other}");
        }
        let built_in = Config::parse("", &m).unwrap();
        assert_eq!(
            groups(&built_in, &Lend(1)),
            1,
            "the built-in configuration's RAM subsystem"
        );
    }

    #[test]
    fn console_commands() {
        let mut c = Console::default();
        let got: Vec<_> = b"xm0101\nqm01z2m00ffsq"
            .iter()
            .filter_map(|&b| c.feed(b))
            .collect();
        assert_eq!(
            got,
            [
                Command::Mark(0x0101),
                Command::Quit,
                Command::Mark(0x00ff),
                Command::Stats,
                Command::Quit
            ],
            "a mark broken by a non-digit is dropped"
        );
        let got: Vec<_> = b"a2na1ia5oa3xa4oqa"
            .iter()
            .filter_map(|&b| c.feed(b))
            .collect();
        assert_eq!(
            got,
            [
                Command::Ana(2, AnaState::NonOptimized),
                Command::Ana(1, AnaState::Inaccessible),
                Command::Ana(4, AnaState::Optimized),
                Command::Quit
            ],
            "an ANA command with a group out of range or a bad state is dropped"
        );
        assert!(mark(0x0001) && mark(0x0103) && mark(0x0004) && mark(0x0106));
        assert!(!mark(0x0007) && !mark(0x0107) && !mark(0x0201));
    }
}
