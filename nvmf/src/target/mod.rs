//! The NVMe/RDMA target: a discovery controller and NVM subsystems, each queue an RC QP the
//! connection manager accepted with NVMe/RDMA's private data.
//!
//! The embedder creates one [`Target`] over a protection domain and one completion queue
//! (every queue's sends and receives complete there), hands it its [`Subsystem`]s, listens
//! with the CM on [`TargetConfig::port`] and calls [`Target::poll`] in its loop. Each poll
//! takes the CM's events (requests to the port, disconnections), a bounded number of
//! completions, retries the commands that wait for a buffer and expires keep-alive timers.
//!
//! A command is answered once it was executed on its namespace's [`BlockDevice`] (a write is
//! on the device, a Flush after the device's flush, a write with Force Unit Access after a
//! flush where the device has a volatile cache); a device's failure is an error status. The
//! target counts per queue and per controller ([`IoCounts`]: commands, errors by status,
//! bytes, a latency histogram) and fills the SMART log from those counts; it logs every
//! connection request and Connect it refuses ([`Target::refusal`]). `docs/nvmeof.md` has the
//! rules.
//!
//! Errors in a command are NVMe statuses in its response; a queue ends only when its
//! transport does (a disconnection, a failed RDMA operation such as a READ with a key the
//! host never gave, which moves the QP to ERROR). A queue's end loses its controller if it
//! was the admin queue; other controllers keep theirs.

mod admin;
mod ana;
mod counts;
mod ctrl;
mod exec;
mod group;
mod io;
mod queue;
mod remote;

use core::mem::MaybeUninit;
use core::ptr;

use bareverbs::cm::{AcceptParams, Cm, CmEvent, ConnId};
use bareverbs::hal::Clock;
use bareverbs::verbs::{
    AccessFlags, CompletionQueue, ProtectionDomain, Provider, QpCaps, Rc, WorkCompletion,
};

use crate::block::BlockDevice;
use crate::wire::cm::{CmRejStatus, CmRep, CmReq, RECFMT};
use crate::wire::fabrics::Nqn;

pub use ana::{ANA_GROUPS, ANACAP, ANATT_S, MAX_PEERS, Multipath, NsIds, Peer};
use counts::RefusalLog;
pub use counts::{
    Carried, HOST_HISTORIES, HostHistories, IoCounts, LATENCY_BUCKETS, REFUSALS_KEPT, Refusal,
    RefusalReason, STATUS_KINDS, bucket_floor_us, latency_bucket,
};
pub use ctrl::{Ctrl, ERROR_LOG_ENTRIES, ErrorLog, Which};
use group::Role;
pub use group::{GROUP_QUEUES, GroupLink, PROGRESS_EVERY_US};
use queue::{Kind, Queue};
pub use remote::MSDBD;

/// Admin queue depth (commands outstanding at once; Linux asks for 32).
pub const ADMIN_DEPTH: u16 = 32;
/// Data buffers of an admin queue.
const ADMIN_SLOTS: u16 = 4;
/// Bytes of an admin queue's data buffer (Identify, a log page piece, the Connect data).
const ADMIN_SLOT_LEN: u32 = 4096;
/// Asynchronous event requests a controller holds (AERL + 1).
pub const AER_HELD: u8 = 4;
/// How long an accepted queue may stay without a controller (µs).
pub const CONNECT_WITHIN_US: u64 = 30_000_000;
/// [`TargetConfig::default_kato_ms`]'s default: two minutes (nvmet's for a discovery
/// controller whose host asks for none).
pub const DEFAULT_KATO_MS: u32 = 120_000;
/// [`TargetConfig::max_kato_ms`]'s default: two minutes. Linux's host sends Keep Alive every
/// half of its `keep_alive_tmo` (and asks for it; older hosts asked for it plus 10 s),
/// so any `keep_alive_tmo` up to 240 s keeps its controller alive here.
pub const MAX_KATO_MS: u32 = 120_000;
/// The longest grace a controller's keep-alive timer gets past its timeout (ms; see
/// [`kato_grace_ms`]).
pub const KATO_GRACE_MAX_MS: u32 = 10_000;

/// The grace past a keep-alive timeout of `kato_ms` before a silent controller is lost: the
/// timeout again, at most [`KATO_GRACE_MAX_MS`]. A host's Keep Alive may come late for reasons
/// that do not grow with its timeout (its scheduler, a retransmission); Linux's nvmet loses a
/// controller between one and two timeouts after its last command (its timer looks back over
/// whole periods), and older Linux hosts asked for their timeout plus 10 s to cover the
/// same delays. So a controller here is lost `kato_ms + kato_grace_ms(kato_ms)` after its last
/// command: never before nvmet would lose it (`docs/nvmeof.md`, "Keep-alive bounds").
pub const fn kato_grace_ms(kato_ms: u32) -> u32 {
    if kato_ms < KATO_GRACE_MAX_MS {
        kato_ms
    } else {
        KATO_GRACE_MAX_MS
    }
}

/// Completions taken per poll.
const BUDGET: usize = 64;

/// An NVM subsystem: its NQN, the hosts allowed to connect, and its namespaces (NSID 1 is the
/// first device).
pub struct Subsystem<'s> {
    /// The subsystem's NQN.
    pub nqn: &'s str,
    /// Serial number Identify Controller reports (up to 20 ASCII characters).
    pub serial: &'s str,
    /// Host NQNs allowed to connect; empty: any host.
    pub allowed_hosts: &'s [&'s str],
    /// The namespaces, NSID `k + 1` for `namespaces[k]`.
    pub namespaces: &'s mut [&'s mut dyn BlockDevice],
    /// Its namespaces are reached through core 0's handles only (a medium with one queue of
    /// its own, such as a virtio-blk disk, that the poll groups have no handle of): its I/O
    /// queues stay on core 0 whatever the poll groups ([`Target::serve_groups`]). Placement
    /// is decided when a queue is accepted, by the controller ID NVMe/RDMA's connection
    /// request names (`docs/percore.md`).
    pub core0_only: bool,
    /// Its namespaces' identities and ANA groups ([`Multipath::default`]: NGUIDs derived
    /// from the NQN, every namespace in group 1, optimized).
    pub multipath: Multipath<'s>,
}

impl<'s> Subsystem<'s> {
    /// A subsystem any host may connect to.
    pub fn new(nqn: &'s str, namespaces: &'s mut [&'s mut dyn BlockDevice]) -> Subsystem<'s> {
        Subsystem {
            nqn,
            serial: "bareverbs",
            allowed_hosts: &[],
            namespaces,
            core0_only: false,
            multipath: Multipath::default(),
        }
    }
    /// Whether `host` may connect.
    pub fn allows(&self, host: &str) -> bool {
        self.allowed_hosts.is_empty() || self.allowed_hosts.contains(&host)
    }
    /// Whether a namespace of it has a volatile write cache
    /// ([`BlockDevice::volatile_cache`]): what its controllers report in Identify
    /// Controller's Volatile Write Cache bit. The bit is the controller's, and a controller
    /// serves every namespace of its subsystem, so one namespace with a cache sets it; a
    /// Flush of a namespace without one completes at once.
    pub fn volatile_cache(&self) -> bool {
        self.namespaces.iter().any(|d| d.volatile_cache())
    }
}

/// One queue's counts, as [`Target::queue_counts`] lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueCounts {
    /// The controller it is bound to (none before its Connect).
    pub cntlid: Option<u16>,
    /// Its queue ID (0: admin).
    pub qid: u16,
    /// The station it came from.
    pub station: [u8; 4],
    /// What it counted since it was accepted.
    pub counts: IoCounts,
}

/// How the target serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetConfig {
    /// The rdma_cm port it serves (4420).
    pub port: u16,
    /// Port ID in the discovery log.
    pub port_id: u16,
    /// I/O queues a controller may have at most.
    pub max_io_queues: u16,
    /// I/O queue depth at most (2..=the target's `D`).
    pub io_depth: u16,
    /// In-capsule data bytes an I/O command may carry (0: none; rounded down to 16).
    pub inline_data: u32,
    /// Bytes one I/O command may move at most (a power of two, 4096 or more).
    pub max_transfer: u32,
    /// Data buffers of `max_transfer` bytes per I/O queue (commands beyond wait for one).
    pub data_slots: u16,
    /// Keep-alive timeout granted to an I/O controller whose Connect asks for none (ms,
    /// 1..=[`max_kato_ms`](Self::max_kato_ms)). A host that asks for none sends no Keep
    /// Alive (Linux's host with `keep_alive_tmo=0`), so its controller lasts this long (and
    /// the grace, [`kato_grace_ms`]) after its last command.
    pub default_kato_ms: u32,
    /// The longest keep-alive timeout granted (ms, 1 or more): a Connect or Set Features that
    /// asks for more gets this. A controller whose host vanished is lost at most this long
    /// and the grace ([`kato_grace_ms`]) after its last command, its queues with it; Get Features (Keep Alive Timer) reports
    /// the value in force.
    pub max_kato_ms: u32,
    /// Lowest controller ID handed out (1 or more). Several appliances serving one
    /// subsystem each take IDs from a range of their own: a host refuses a second path whose
    /// controller ID another path of the subsystem already has.
    pub cntlid_min: u16,
    /// Highest controller ID handed out (`cntlid_min..=0xFFEF`).
    pub cntlid_max: u16,
    /// Other appliances serving the same subsystems, which the discovery log lists beside
    /// this target's port (`None`: unused).
    pub peers: [Option<Peer>; MAX_PEERS],
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            port: crate::NVME_RDMA_PORT,
            port_id: 1,
            max_io_queues: 4,
            io_depth: 128,
            inline_data: 4096,
            max_transfer: 128 * 1024,
            data_slots: 32,
            default_kato_ms: DEFAULT_KATO_MS,
            max_kato_ms: MAX_KATO_MS,
            cntlid_min: 1,
            cntlid_max: admin::CNTLID_MAX,
            peers: [None; MAX_PEERS],
        }
    }
}

/// What the target counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetCounts {
    /// Queue connections accepted.
    pub accepted: u64,
    /// Queue connection requests rejected (REJ with NVMe/RDMA status).
    pub rejected: u64,
    /// Commands answered.
    pub commands: u64,
    /// Commands answered with an error status.
    pub errors: u64,
    /// Controllers created.
    pub controllers: u64,
    /// Controllers lost (disconnect, keep-alive expiry, transport error).
    pub lost: u64,
    /// Controllers lost to keep-alive expiry.
    pub kato_expired: u64,
    /// Queues ended by a transport error (a failed completion).
    pub transport_errors: u64,
    /// Controller resets (CC.EN cleared by the host).
    pub resets: u64,
    /// Responses sent as SEND with Invalidate of the key the command named (the host asked
    /// for it; a device without the operation answers with a plain SEND instead).
    pub invalidated: u64,
    /// Connection requests and Connects refused ([`Target::refusal`] tells why).
    pub refusals: u64,
}

/// Why a controller was lost ([`Loss`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossCause {
    /// Its keep-alive timer expired: no command came for longer than its timeout and the
    /// grace ([`kato_grace_ms`]).
    KeepAlive,
    /// Its admin queue's connection ended on the CM's side (the host's DREQ, or the CM
    /// gave the connection up).
    Disconnected,
    /// A work request of its admin queue completed in error (the QP went to the error
    /// state: a retry count exceeded, a remote access error).
    Transport,
    /// Otherwise: its admin queue ended by the target for another reason (its receives
    /// could not be posted, the target dropped).
    Other,
}

/// A controller's end, as the target logs it ([`Target::loss`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loss {
    /// Its number: 1 for the target's first loss ([`TargetCounts::lost`] is the newest's).
    pub seq: u64,
    /// When (the target's clock, µs).
    pub at_us: u64,
    /// The controller's ID.
    pub cntlid: u16,
    /// The station its admin queue came from.
    pub station: [u8; 4],
    /// Why.
    pub cause: LossCause,
    /// How long before its end its last command came (µs).
    pub idle_us: u64,
    /// Its keep-alive timeout (ms).
    pub kato_ms: u32,
    /// The longest it went without a command before (µs; [`Ctrl::longest_idle_us`]).
    pub longest_idle_us: u64,
}

/// Losses [`Target::loss`] keeps (the newest).
pub const LOSSES_KEPT: usize = 4;

/// The target, with room for `Q` queues (admin and I/O, all controllers together) of at most
/// `D` commands each.
pub struct Target<'a, 's, P: Provider, K: Clock, const Q: usize = 8, const D: usize = 128> {
    pd: &'a ProtectionDomain<'a, P>,
    cq: &'a CompletionQueue<'a, P>,
    clock: K,
    cfg: TargetConfig,
    subsystems: &'s mut [Subsystem<'s>],
    queues: [Queue<'a, P, D>; Q],
    /// Queues at or above this index are free (one past the highest in use): the loops of
    /// every poll stop here.
    span: usize,
    /// Queues at or above this index were never opened (their slots count no invalidation).
    touched: usize,
    ctrls: [Option<Ctrl>; Q],
    next_cntlid: u16,
    /// Connections to disconnect at the end of `progress` (the CM is at hand there): the
    /// queues it ended, each in use when it ended, so at most `Q` (a connection left out
    /// would keep its CM entry for ever).
    dreq: [Option<ConnId>; Q],
    /// Whether `dreq` may hold a connection.
    dreq_any: bool,
    /// No controller's keep-alive timer expires before the clock passes this (µs): a lower
    /// bound of their deadlines (a command only moves a deadline later), lowered when a
    /// controller is made or its timeout set; the controllers are looked at only past it.
    kato_check_us: u64,
    /// The same for the queues without a controller ([`CONNECT_WITHIN_US`]).
    unconnected_check_us: u64,
    ip: [u8; 4],
    counts: TargetCounts,
    /// The clock as last read (at the start of `progress` and at each response): the time
    /// a capsule is taken at, and the keep-alive timers'.
    now_us: u64,
    /// When the target was made (µs): the SMART log's power-on hours count from it.
    born_us: u64,
    /// The counts of the queues that ended.
    retired: IoCounts,
    refusals: RefusalLog,
    /// The SMART counts of hosts whose controllers ended, for their next controller.
    histories: HostHistories,
    /// Alone, core 0 of poll groups, or a poll group (`group.rs`, `docs/percore.md`).
    role: group::Member<'a, P>,
    /// A poll group's next report of its queues' counts to core 0 (µs).
    report_us: u64,
    /// Commands answered on I/O queues (the commands per core the appliance reports).
    io_commands: u64,
    /// Why the next controller [`lose_ctrl`](Self::lose_ctrl) loses goes (set by the one
    /// that ends its admin queue, back to [`LossCause::Other`] after).
    loss_cause: LossCause,
    /// The newest losses, number `seq` at `(seq - 1) % LOSSES_KEPT`.
    losses: [Option<Loss>; LOSSES_KEPT],
}

/// What one core of a target serves ([`Target::cores`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreCounts {
    /// I/O queues it serves now.
    pub io_queues: u32,
    /// Commands it answered on I/O queues.
    pub io_commands: u64,
}

/// Why a target cannot be created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetError {
    /// A configuration value out of range (which one).
    Config(&'static str),
}

impl core::fmt::Display for TargetError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TargetError::Config(what) => write!(f, "NVMe/RDMA target: bad {what}"),
        }
    }
}

impl core::error::Error for TargetError {}

/// A value built in memory its owner lent ([`Target::new_in`]): used through `Deref`, dropped
/// in place when this is dropped (the memory stays the lender's).
pub struct InPlace<'t, T>(&'t mut T);

impl<T> core::ops::Deref for InPlace<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0
    }
}

impl<T> core::ops::DerefMut for InPlace<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0
    }
}

impl<T> Drop for InPlace<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the value was initialised in place by its constructor and is dropped only
        // here, once; nothing reads it afterwards (this borrow ends with `self`).
        unsafe { ptr::drop_in_place(&raw mut *self.0) }
    }
}

impl<'a, 's, P: Provider, K: Clock, const Q: usize, const D: usize> Target<'a, 's, P, K, Q, D> {
    /// A target serving `subsystems` on `pd`'s device, at address `ip` (the CM's,
    /// [`Cm::ip`]; the discovery log names it), completing every queue's work on `cq`
    /// (which must hold every queue's outstanding work: `Q × (4 × D)` entries covers it).
    ///
    /// # Errors
    ///
    /// [`TargetError::Config`] for a depth over `D` or below 2, a transfer size that is not a
    /// power of two of at least 4096 bytes, no data slots, `D` below the admin depth, a
    /// keep-alive maximum of 0, or a keep-alive default of 0 or above the maximum.
    pub fn new(
        pd: &'a ProtectionDomain<'a, P>,
        cq: &'a CompletionQueue<'a, P>,
        clock: K,
        ip: [u8; 4],
        cfg: TargetConfig,
        subsystems: &'s mut [Subsystem<'s>],
    ) -> Result<Self, TargetError> {
        let cfg = Self::checked(cfg)?;
        subsystems.iter().try_for_each(ana::check)?;
        let now_us = clock.now_us();
        Ok(Target {
            pd,
            cq,
            clock,
            cfg,
            subsystems,
            queues: core::array::from_fn(|_| Queue::free()),
            span: 0,
            touched: 0,
            ctrls: [const { None }; Q],
            next_cntlid: cfg.cntlid_min,
            dreq: [None; Q],
            dreq_any: false,
            kato_check_us: u64::MAX,
            unconnected_check_us: u64::MAX,
            ip,
            counts: TargetCounts::default(),
            now_us,
            born_us: now_us,
            retired: IoCounts::default(),
            refusals: RefusalLog::default(),
            histories: HostHistories::default(),
            role: group::Member(Role::Alone),
            report_us: 0,
            io_commands: 0,
            loss_cause: LossCause::Other,
            losses: [None; LOSSES_KEPT],
        })
    }

    /// [`Target::new`], built in `slot` rather than returned: a target with room for many
    /// queues is large (its queue table holds every queue's buffers' descriptors, a few KB a
    /// queue), too large for a small stack, so a kernel keeps it in a `static` or other
    /// memory of its own. The queues are written one at a time; nothing of the target's size
    /// passes through the stack. The target is dropped when the [`InPlace`] is.
    ///
    /// # Errors
    ///
    /// As [`Target::new`]; `slot` is then left as it was (uninitialised).
    ///
    /// # Example
    ///
    /// The crate's example with the target in a slot of its own (here on the heap of the
    /// test; a kernel's is a `static`), a configuration it refuses first:
    ///
    /// ```
    /// use std::mem::MaybeUninit;
    /// use bareverbs::Context;
    /// use bareverbs::cm::{Cm, CmConfig, Service};
    /// use bareverbs::device::rxe::{Config, Rxe};
    /// use bareverbs_model::link::{Segment, TestClock};
    /// use bareverbs_model::{Model, ModelConfig};
    /// use bareverbs_nvmf::{BlockDevice, Host, HostConfig, RamDisk, Subsystem};
    /// use bareverbs_nvmf::{Target, TargetConfig, TargetError};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let (model, segment, clock) = (Model::new(ModelConfig::default()), Segment::new(), TestClock::default());
    /// let device = |mac, ip| Rxe::new(model.clone(), segment.attach(mac, 1514), clock.clone(), Config { ip });
    /// let host_dev = Context::new(device([2, 0, 0, 0, 0, 1], [10, 0, 0, 1])?);
    /// let target_dev = Context::new(device([2, 0, 0, 0, 0, 2], [10, 0, 0, 2])?);
    /// let pd = target_dev.alloc_pd()?;
    /// let (cm_cq, cq) = (target_dev.create_cq(64)?, target_dev.create_cq(8 * 4 * 128)?);
    /// let mut target_cm: Cm<_, _, 8> = Cm::new(&pd, &cm_cq, clock.clone(), CmConfig::default())?;
    /// target_cm.listen(None, 4420, Service::Rc)?;
    /// let mut memory = vec![0u8; 1 << 20];
    /// let mut disk = RamDisk::new(&mut memory, 512);
    /// let mut namespaces: [&mut dyn BlockDevice; 1] = [&mut disk];
    /// let mut subsystems = [Subsystem::new("nqn.2026-11.io.example:ram", &mut namespaces)];
    ///
    /// let mut slot = Box::new(MaybeUninit::<Target<'_, '_, _, _, 8, 128>>::uninit());
    /// let bad = TargetConfig { io_depth: 1, ..TargetConfig::default() };
    /// let refused = Target::new_in(&mut slot, &pd, &cq, clock.clone(), target_cm.ip(), bad, &mut []);
    /// assert_eq!(refused.err(), Some(TargetError::Config("io_depth")));
    /// let config = TargetConfig::default();
    /// let mut target =
    ///     Target::new_in(&mut slot, &pd, &cq, clock.clone(), target_cm.ip(), config, &mut subsystems)?;
    ///
    /// let config = HostConfig { addr: [10, 0, 0, 2], subnqn: "nqn.2026-11.io.example:ram", ..HostConfig::default() };
    /// let host_pd = host_dev.alloc_pd()?;
    /// let (host_cm_cq, host_cq) = (host_dev.create_cq(64)?, host_dev.create_cq(2 * 2 * 32)?);
    /// let mut host_cm: Cm<_, _, 8> = Cm::new(&host_pd, &host_cm_cq, clock.clone(), CmConfig::default())?;
    /// let mut host: Host<'_, '_, _, _, 2, 32> = Host::new(&host_pd, &host_cq, clock.clone(), config);
    /// let mut idle = || {
    ///     clock.advance(20);
    ///     target.poll(&mut target_cm);
    /// };
    /// host.connect(&mut host_cm, &mut idle)?;
    /// let blocks = [0xA5u8; 512];
    /// host.write(1, 1, 3, 1, &blocks, &mut idle)?;
    /// let mut back = [0u8; 512];
    /// host.read(1, 1, 3, 1, &mut back, &mut idle)?;
    /// assert_eq!(back, blocks);
    /// host.disconnect(&mut host_cm, &mut idle)?;
    /// drop(idle);
    /// assert_eq!(target.counts().controllers, 1);
    /// # Ok(()) }
    /// ```
    pub fn new_in<'t>(
        slot: &'t mut MaybeUninit<Self>,
        pd: &'a ProtectionDomain<'a, P>,
        cq: &'a CompletionQueue<'a, P>,
        clock: K,
        ip: [u8; 4],
        cfg: TargetConfig,
        subsystems: &'s mut [Subsystem<'s>],
    ) -> Result<InPlace<'t, Self>, TargetError> {
        // Every field of the target is written below: this pattern names them all, so that
        // a field added to the target fails to compile here until it is written too.
        let _every_field = |t: Self| {
            let Target {
                pd: _,
                cq: _,
                clock: _,
                cfg: _,
                subsystems: _,
                queues: _,
                span: _,
                touched: _,
                ctrls: _,
                next_cntlid: _,
                dreq: _,
                dreq_any: _,
                kato_check_us: _,
                unconnected_check_us: _,
                ip: _,
                counts: _,
                now_us: _,
                born_us: _,
                retired: _,
                refusals: _,
                histories: _,
                role: _,
                report_us: _,
                io_commands: _,
                loss_cause: _,
                losses: _,
            } = t;
        };
        let cfg = Self::checked(cfg)?;
        subsystems.iter().try_for_each(ana::check)?;
        let now_us = clock.now_us();
        let p = slot.as_mut_ptr();
        // SAFETY: `p` is valid for writes of a `Self` (the slot's memory, borrowed mutably
        // for 't); each field is written exactly once through a raw field pointer (no
        // reference to uninitialised memory is made), the arrays element by element; the
        // pattern above checks that these are all of the fields, so the slot holds a whole,
        // valid target when `assume_init_mut` is called.
        let target = unsafe {
            ptr::addr_of_mut!((*p).pd).write(pd);
            ptr::addr_of_mut!((*p).cq).write(cq);
            ptr::addr_of_mut!((*p).clock).write(clock);
            ptr::addr_of_mut!((*p).cfg).write(cfg);
            ptr::addr_of_mut!((*p).subsystems).write(subsystems);
            let queues = ptr::addr_of_mut!((*p).queues).cast::<Queue<'a, P, D>>();
            for i in 0..Q {
                queues.add(i).write(Queue::free());
            }
            let ctrls = ptr::addr_of_mut!((*p).ctrls).cast::<Option<Ctrl>>();
            for i in 0..Q {
                ctrls.add(i).write(None);
            }
            ptr::addr_of_mut!((*p).span).write(0);
            ptr::addr_of_mut!((*p).touched).write(0);
            ptr::addr_of_mut!((*p).next_cntlid).write(cfg.cntlid_min);
            ptr::addr_of_mut!((*p).dreq).write([None; Q]);
            ptr::addr_of_mut!((*p).dreq_any).write(false);
            ptr::addr_of_mut!((*p).kato_check_us).write(u64::MAX);
            ptr::addr_of_mut!((*p).unconnected_check_us).write(u64::MAX);
            ptr::addr_of_mut!((*p).ip).write(ip);
            ptr::addr_of_mut!((*p).counts).write(TargetCounts::default());
            ptr::addr_of_mut!((*p).now_us).write(now_us);
            ptr::addr_of_mut!((*p).born_us).write(now_us);
            ptr::addr_of_mut!((*p).retired).write(IoCounts::default());
            ptr::addr_of_mut!((*p).refusals).write(RefusalLog::default());
            ptr::addr_of_mut!((*p).histories).write(HostHistories::default());
            ptr::addr_of_mut!((*p).role).write(group::Member(Role::Alone));
            ptr::addr_of_mut!((*p).report_us).write(0);
            ptr::addr_of_mut!((*p).io_commands).write(0);
            ptr::addr_of_mut!((*p).loss_cause).write(LossCause::Other);
            ptr::addr_of_mut!((*p).losses).write([None; LOSSES_KEPT]);
            slot.assume_init_mut()
        };
        Ok(InPlace(target))
    }

    /// `cfg` if the target can work with it, its inline data size rounded down to 16 bytes.
    fn checked(cfg: TargetConfig) -> Result<TargetConfig, TargetError> {
        if cfg.io_depth < 2 || usize::from(cfg.io_depth) > D || D < usize::from(ADMIN_DEPTH) {
            return Err(TargetError::Config("io_depth"));
        }
        if cfg.max_transfer < 4096 || !cfg.max_transfer.is_power_of_two() {
            return Err(TargetError::Config("max_transfer"));
        }
        if cfg.data_slots == 0 || usize::from(cfg.data_slots) > D {
            return Err(TargetError::Config("data_slots"));
        }
        if D > usize::from(u16::MAX) || Q > 255 {
            return Err(TargetError::Config("Q or D"));
        }
        if cfg.max_kato_ms == 0 {
            return Err(TargetError::Config("max_kato_ms"));
        }
        if cfg.default_kato_ms == 0 || cfg.default_kato_ms > cfg.max_kato_ms {
            return Err(TargetError::Config("default_kato_ms"));
        }
        if cfg.cntlid_min == 0
            || cfg.cntlid_min > cfg.cntlid_max
            || cfg.cntlid_max > admin::CNTLID_MAX
        {
            return Err(TargetError::Config("cntlid range"));
        }
        Ok(TargetConfig {
            inline_data: cfg.inline_data & !15,
            ..cfg
        })
    }

    /// What the target counted so far.
    pub fn counts(&self) -> TargetCounts {
        let mut c = TargetCounts {
            invalidated: self.queues[..self.touched]
                .iter()
                .map(|q| q.invalidated)
                .sum(),
            refusals: self.refusals.count(),
            ..self.counts
        };
        // The commands the poll groups answered, as they published them.
        if let Role::Core0(links) = self.role.0 {
            for l in links {
                c.commands += l.commands();
                c.errors += l.errors();
            }
        }
        c
    }

    /// Every queue's counts summed, those that ended included: the target's I/O counts.
    pub fn io_counts(&self) -> IoCounts {
        let mut all = self.retired;
        for q in self.queues[..self.span].iter().filter(|q| q.in_use()) {
            all.add(&q.counts);
        }
        all
    }

    /// The counts of the controller with ID `cntlid` (its queues', those that ended
    /// included), or `None` when no live controller has it.
    pub fn ctrl_counts(&self, cntlid: u16) -> Option<IoCounts> {
        let c = self
            .ctrls
            .iter()
            .position(|x| x.as_ref().is_some_and(|x| x.cntlid == cntlid))?;
        Some(self.ctrl_io(c))
    }

    /// The hosts' SMART counts kept between their controllers.
    pub fn histories(&self) -> &HostHistories {
        &self.histories
    }

    /// Controller `c`'s counts.
    fn ctrl_io(&self, c: usize) -> IoCounts {
        let mut sum = self.ctrls[c]
            .as_ref()
            .map(|x| x.retired)
            .unwrap_or_default();
        for q in self
            .queues
            .iter()
            .filter(|q| q.in_use() && q.ctrl == Some(c))
        {
            sum.add(&q.counts);
        }
        sum
    }

    /// The connected queues' counts.
    pub fn queue_counts(&self) -> impl Iterator<Item = QueueCounts> + '_ {
        self.queues
            .iter()
            .filter(|q| q.in_use())
            .map(|q| QueueCounts {
                cntlid: q
                    .ctrl
                    .and_then(|c| self.ctrls[c].as_ref())
                    .map(|x| x.cntlid),
                qid: q.qid,
                station: q.station,
                counts: q.counts,
            })
    }

    /// Refusal number `seq` (1 for the first; [`TargetCounts::refusals`] is the newest's),
    /// if it is among the newest [`REFUSALS_KEPT`].
    pub fn refusal(&self, seq: u64) -> Option<Refusal> {
        self.refusals.get(seq).copied()
    }

    /// Loss number `seq` (1 for the first; [`TargetCounts::lost`] is the newest's), if it
    /// is among the newest [`LOSSES_KEPT`]: when, which controller, why, and how long its
    /// host had been silent.
    pub fn loss(&self, seq: u64) -> Option<Loss> {
        let at = (seq.checked_sub(1)? % LOSSES_KEPT as u64) as usize;
        self.losses[at].filter(|l| l.seq == seq)
    }

    /// Ends queue `q` as [`end_queue`](Self::end_queue) does, a controller it loses lost for
    /// `cause`.
    fn end_queue_for(&mut self, q: usize, dreq: bool, by_group: bool, cause: LossCause) {
        self.loss_cause = cause;
        self.end_queue_as(q, dreq, by_group);
        self.loss_cause = LossCause::Other;
    }

    /// The target's clock as it last read it (µs).
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// Logs a refusal of a request or Connect from `station`.
    fn refuse(&mut self, station: [u8; 4], reason: RefusalReason, hostnqn: Option<Nqn>) {
        self.refusals.record(Refusal {
            seq: 0,
            at_us: self.now_us,
            station,
            reason,
            hostnqn,
        });
    }

    /// The configuration in force.
    pub fn config(&self) -> &TargetConfig {
        &self.cfg
    }

    /// Live controllers.
    pub fn controllers(&self) -> impl Iterator<Item = &Ctrl> {
        self.ctrls.iter().flatten()
    }

    /// Queues connected (admin and I/O).
    pub fn queues_in_use(&self) -> usize {
        self.queues.iter().filter(|q| q.in_use()).count()
    }

    /// Subsystem `k` (to inspect its namespaces once the target is done with them).
    pub fn subsystem(&mut self, k: usize) -> Option<&mut Subsystem<'s>> {
        self.subsystems.get_mut(k)
    }

    /// One step: the CM's events (the target's own; others are dropped — an embedder that
    /// shares the CM uses [`on_cm_event`](Self::on_cm_event) and [`progress`](Self::progress)
    /// instead), then [`progress`](Self::progress). Returns the work done (events and
    /// completions); 0 means idle.
    pub fn poll<C: Clock, const N: usize>(&mut self, cm: &mut Cm<'a, P, C, N>) -> usize {
        if self.role.0.is_group() {
            return self.poll_group();
        }
        let mut work = 0;
        // Each `cm.poll` runs the device's progress first (the CM is on the target's device:
        // it accepted every queue), so the rest of the step does not run it again.
        for _ in 0..2 * Q + 4 {
            let Some(ev) = cm.poll() else { break };
            work += 1;
            let _ = self.on_cm_event(cm, ev);
        }
        work + self.step(cm)
    }

    /// Takes a CM event: requests to the target's port, and the ends of its connections.
    /// Hands back the events that are not the target's.
    pub fn on_cm_event<C: Clock, const N: usize>(
        &mut self,
        cm: &mut Cm<'a, P, C, N>,
        ev: CmEvent<'a, P>,
    ) -> Option<CmEvent<'a, P>> {
        if self.role.0.is_group() {
            return Some(ev);
        }
        match ev {
            CmEvent::ConnectRequest(r) if r.dst_port == self.cfg.port => {
                self.on_request(cm, &r);
                None
            }
            CmEvent::Established { id, qp: None, .. } if self.by_conn(id).is_some() => None,
            CmEvent::Disconnected { id } | CmEvent::Failed { id, qp: None, .. }
                if self.by_conn(id).is_some() =>
            {
                if let Some(q) = self.by_conn(id) {
                    self.end_queue_for(q, false, false, LossCause::Disconnected);
                }
                None
            }
            CmEvent::TimeWaitExit { id } if self.by_conn(id).is_some() => None,
            other => Some(other),
        }
    }

    /// Completions (a bounded number), commands waiting for a buffer, keep-alive timers, and
    /// the disconnections the target decided. Returns the completions taken.
    pub fn progress<C: Clock, const N: usize>(&mut self, cm: &mut Cm<'a, P, C, N>) -> usize {
        self.cq.context().progress();
        self.step(cm)
    }

    /// [`progress`](Self::progress) after the device's.
    fn step<C: Clock, const N: usize>(&mut self, cm: &mut Cm<'a, P, C, N>) -> usize {
        self.now_us = self.clock.now_us();
        match self.role.0 {
            Role::Alone => {}
            Role::Group(_) => return self.poll_group(),
            Role::Core0(links) => self.take_group_messages(links),
        }
        let taken = self.step_io();
        if self.now_us > self.kato_check_us {
            self.expire_keep_alive();
        }
        if self.now_us > self.unconnected_check_us {
            self.expire_unconnected();
        }
        if core::mem::take(&mut self.dreq_any) {
            for d in self.dreq.iter_mut() {
                if let Some(id) = d.take() {
                    // Already gone on the CM's side (a DREQ crossed ours): nothing to do.
                    let _ = cm.disconnect(id);
                }
            }
        }
        taken
    }

    /// What the poll groups sent core 0 (a ring's worth from each at most).
    #[inline(never)]
    fn take_group_messages(&mut self, links: &'a [GroupLink<'a, P>]) {
        for (g, link) in links.iter().enumerate() {
            for _ in 0..group::RING {
                let Some(m) = link.take_for_core0() else {
                    break;
                };
                self.on_group_message(g, m);
            }
        }
    }

    /// The completions (a bounded number) and the commands that wait for a buffer.
    #[inline(always)]
    fn step_io(&mut self) -> usize {
        let mut wc = [WorkCompletion::default(); 16];
        let mut taken = 0;
        while taken < BUDGET {
            let Ok(n) = self.cq.poll(&mut wc) else { break };
            if n == 0 {
                break;
            }
            taken += n;
            for w in &wc[..n] {
                self.completion(w);
            }
        }
        for q in 0..self.span {
            // Checked here, not only in the call: an idle round makes no call.
            if self.queues[q].pending && self.queues[q].in_use() {
                self.retry_waiting(q);
            }
        }
        taken
    }

    fn by_conn(&self, id: ConnId) -> Option<usize> {
        self.queues[..self.span]
            .iter()
            .position(|q| q.in_use() && q.conn == id)
    }

    /// A request for a queue: checks NVMe/RDMA's private data, sets up the QP and its
    /// buffers, accepts.
    fn on_request<C: Clock, const N: usize>(
        &mut self,
        cm: &mut Cm<'a, P, C, N>,
        r: &bareverbs::cm::ConnectRequest,
    ) {
        self.now_us = self.clock.now_us();
        let verdict = self.check_request(r.private_data.as_slice());
        let (req, depth) = match verdict {
            Ok(v) => v,
            Err(st) => {
                self.counts.rejected += 1;
                self.refuse(r.src_ip, RefusalReason::Request(st), None);
                let _ = cm.reject(r.id, &st.to_bytes());
                return;
            }
        };
        let Some(q) = self.queues.iter().position(|q| !q.in_use()) else {
            self.counts.rejected += 1;
            self.refuse(r.src_ip, RefusalReason::NoQueue, None);
            let _ = cm.reject(r.id, &CmRejStatus::NoResources.to_bytes());
            return;
        };
        let admin = req.qid == 0;
        let (capsule, slots, slot_len) = if admin {
            (64, ADMIN_SLOTS, ADMIN_SLOT_LEN)
        } else {
            (
                64 + self.cfg.inline_data,
                self.cfg.data_slots,
                self.cfg.max_transfer,
            )
        };
        let caps = QpCaps {
            // Responses, and each data command's READs or WRITEs (one per descriptor).
            max_send_wr: 2 * u32::from(depth) + 2 * u32::from(slots) * u32::from(MSDBD) + 1,
            max_recv_wr: u32::from(depth),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let len = Queue::<P, D>::region_len(depth, capsule, slots, slot_len);
        // An I/O queue may go to a poll group: its QP completes on the group's CQ.
        let group = if admin {
            None
        } else {
            self.pick_group(&req, r.src_ip)
        };
        let cq = match (group, self.role.0) {
            (Some(g), Role::Core0(links)) => links[g].cq,
            _ => self.cq,
        };
        let built = self
            .pd
            .qp_builder(cq, cq)
            .caps(caps)
            .build::<Rc>()
            .ok()
            .zip(self.pd.register(len, AccessFlags::LOCAL_WRITE).ok());
        let Some((qp, mr)) = built else {
            self.counts.rejected += 1;
            self.refuse(r.src_ip, RefusalReason::NoMemory, None);
            let _ = cm.reject(r.id, &CmRejStatus::NoResources.to_bytes());
            return;
        };
        let rep = CmRep {
            recfmt: RECFMT,
            crqsize: depth,
        }
        .to_bytes();
        let params = AcceptParams {
            responder_resources: 0,
            initiator_depth: 16,
            rnr_retry_count: 7,
            private_data: &rep,
        };
        let qp = match cm.accept(r.id, qp, &params) {
            Ok(qp) => qp,
            Err(_) => {
                self.counts.rejected += 1;
                self.refuse(r.src_ip, RefusalReason::AcceptFailed, None);
                return;
            }
        };
        self.counts.accepted += 1;
        if let (Some(g), Role::Core0(links)) = (group, self.role.0) {
            self.hand_over(
                q,
                g,
                links,
                r,
                (req.qid, depth, capsule, slots, slot_len),
                qp,
                mr,
            );
            if !self.queues[q].in_use() {
                let _ = cm.disconnect(r.id);
            }
            return;
        }
        let queue = &mut self.queues[q];
        queue.open(r.id, req.qid, depth, capsule, slots, slot_len, qp, mr);
        queue.opened_us = self.now_us;
        queue.station = r.src_ip;
        self.span = self.span.max(q + 1);
        self.touched = self.touched.max(q + 1);
        self.unconnected_check_us = self
            .unconnected_check_us
            .min(self.now_us.saturating_add(CONNECT_WITHIN_US));
        let queue = &mut self.queues[q];
        if queue.post_all_recvs(q).is_err() {
            // The CM is at hand: disconnected now, not through the table of `dreq` (which
            // then holds only the queues `progress` ends, at most `Q` between two drains,
            // whatever the number of requests a poll takes).
            self.end_queue(q, false);
            let _ = cm.disconnect(r.id);
        }
    }

    /// NVMe/RDMA's checks of a REQ's private data: `(request, depth)` or the REJ status.
    fn check_request(&self, pdata: &[u8]) -> Result<(CmReq, u16), CmRejStatus> {
        let req = CmReq::parse(pdata).ok_or(CmRejStatus::InvalidLength)?;
        if req.recfmt != RECFMT {
            return Err(CmRejStatus::InvalidRecfmt);
        }
        let max = if req.qid == 0 {
            ADMIN_DEPTH
        } else {
            if req.qid > self.cfg.max_io_queues {
                return Err(CmRejStatus::InvalidQid);
            }
            self.cfg.io_depth
        };
        let depth = req
            .hsqsize
            .checked_add(1)
            .ok_or(CmRejStatus::InvalidHsqsize)?;
        if depth < 2 || depth > max {
            return Err(CmRejStatus::InvalidHsqsize);
        }
        if req.hrqsize < depth {
            return Err(CmRejStatus::InvalidHrqsize);
        }
        Ok((req, depth))
    }

    /// Ends queue `q` (its QP destroyed before its buffers); `dreq`: the target decided, so
    /// the CM disconnects. An admin queue takes its controller (and its I/O queues) along.
    fn end_queue(&mut self, q: usize, dreq: bool) {
        self.end_queue_as(q, dreq, false);
    }

    /// [`end_queue`](Self::end_queue); `by_group`: core 0 learnt from the poll group that
    /// serves the queue that it ended it (nothing to tell the group).
    fn end_queue_as(&mut self, q: usize, dreq: bool, by_group: bool) {
        let queue = &mut self.queues[q];
        if !queue.in_use() {
            return;
        }
        let (remote, origin, id) = (queue.remote, queue.origin, (q as u8, queue.epoch));
        let cntlid = queue
            .ctrl
            .and_then(|c| self.ctrls[c].as_ref())
            .map(|x| x.cntlid);
        let queue = &mut self.queues[q];
        if dreq
            && !self.role.0.is_group()
            && let Some(d) = self.dreq.iter_mut().find(|d| d.is_none())
        {
            *d = Some(queue.conn);
            self.dreq_any = true;
        }
        let ctrl = queue.ctrl;
        let admin = queue.qid == 0;
        // Its counts go to its controller's and the target's; its outstanding commands end
        // with it (no longer busy).
        let (counts, busy) = (queue.counts, queue.busy);
        queue.counted = [false; D];
        queue.busy = 0;
        queue.close();
        while self.span > 0 && !self.queues[self.span - 1].in_use() {
            self.span -= 1;
        }
        // A queue a group served: its counts at its end come with the group's report.
        if remote.is_none() {
            self.retired.add(&counts);
            if let Some(x) = ctrl.and_then(|c| self.ctrls[c].as_mut()) {
                x.retired.add(&counts);
                x.busy_end(busy, self.now_us);
            }
        }
        self.tell_end(remote, origin, id, cntlid, counts, dreq, by_group);
        if let Some(c) = ctrl {
            if self.role.0.is_group() {
                // A group's copy of the controller goes with its queue.
                self.ctrls[c] = None;
            } else if admin {
                self.lose_ctrl(c);
            } else if let Some(ctrl) = self.ctrls[c].as_mut() {
                ctrl.io_queues = ctrl.io_queues.saturating_sub(1);
            }
        }
    }

    /// Resets controller `c` (its host cleared CC.EN): its I/O queues end (the target
    /// disconnects them; their outstanding commands are aborted with them), the asynchronous
    /// event requests it holds are answered (Internal Error, DNR), and what Set Features
    /// granted is forgotten (Number of Queues, the event configuration, the write cache
    /// enable: on again). The admin queue and
    /// the association stay; CSTS.RDY follows CC.EN, so it reads 0, and CC.EN = 1 enables it
    /// again.
    fn reset_ctrl(&mut self, c: usize) {
        let mut admin = None;
        for q in 0..Q {
            if self.queues[q].in_use() && self.queues[q].ctrl == Some(c) {
                if self.queues[q].qid == 0 {
                    admin = Some(q);
                } else {
                    self.end_queue(q, true);
                }
            }
        }
        if let Some(q) = admin {
            self.release_held(q, crate::wire::Status::INTERNAL_DNR);
        }
        if let Some(x) = self.ctrls[c].as_mut() {
            x.aers = 0;
            x.io_granted = 0;
            x.aec = 0;
            x.ana_pending = false;
            x.ana_masked = false;
            x.wce = true;
            self.counts.resets += 1;
        }
    }

    /// Loses controller `c`: every queue bound to it ends (the target disconnects them).
    fn lose_ctrl(&mut self, c: usize) {
        // What it counted, with the history it took from its host's, goes back to the host's
        // (an I/O controller's): its queues' counts, those still open included (they end
        // below, with the controller gone), its time busy, its errors.
        let mut io = self.ctrl_io(c);
        let Some(x) = self.ctrls[c].take() else {
            return;
        };
        let seq = self.counts.lost + 1;
        self.losses[((seq - 1) % LOSSES_KEPT as u64) as usize] = Some(Loss {
            seq,
            at_us: self.now_us,
            cntlid: x.cntlid,
            station: x.station,
            cause: core::mem::replace(&mut self.loss_cause, LossCause::Other),
            idle_us: self.now_us.saturating_sub(x.last_us),
            kato_ms: x.kato_ms,
            longest_idle_us: x.longest_idle_us,
        });
        if let Which::Nvm(k) = x.which {
            let mut carried = x.carried;
            io.add(&carried.io);
            carried.io = io;
            carried.busy_us = carried.busy_us.saturating_add(x.busy_time_us(self.now_us));
            carried.errors = carried.errors.saturating_add(x.errors.count());
            self.histories
                .give(k, &x.hostnqn, &x.hostid, carried, self.now_us);
        }
        self.counts.lost += 1;
        for q in 0..Q {
            if self.queues[q].in_use() && self.queues[q].ctrl == Some(c) {
                self.end_queue(q, true);
            }
        }
    }

    /// Loses the controllers whose keep-alive timer expired (more than their timeout and its
    /// grace, [`kato_grace_ms`], since their last command), and sets the bound of the
    /// others' deadlines.
    fn expire_keep_alive(&mut self) {
        let now = self.now_us;
        let mut next = u64::MAX;
        for c in 0..Q {
            // Every controller has a timeout (0 is never granted).
            let Some(deadline) = self.ctrls[c].as_ref().map(|x| {
                let k = x.kato_ms.max(1);
                x.last_us
                    .saturating_add(u64::from(k.saturating_add(kato_grace_ms(k))) * 1000)
            }) else {
                continue;
            };
            if now > deadline {
                self.counts.kato_expired += 1;
                self.loss_cause = LossCause::KeepAlive;
                self.lose_ctrl(c);
                self.loss_cause = LossCause::Other;
            } else {
                next = next.min(deadline);
            }
        }
        self.kato_check_us = next;
    }

    /// Queues with no controller [`CONNECT_WITHIN_US`] after they were accepted (no Connect
    /// came, or it failed and the host left the queue open): ended, their resources freed.
    fn expire_unconnected(&mut self) {
        let now = self.now_us;
        let mut next = u64::MAX;
        for q in 0..self.span {
            let queue = &self.queues[q];
            if !queue.in_use() || queue.ctrl.is_some() {
                continue;
            }
            let deadline = queue.opened_us.saturating_add(CONNECT_WITHIN_US);
            if now > deadline {
                self.end_queue(q, true);
            } else {
                next = next.min(deadline);
            }
        }
        self.unconnected_check_us = next;
    }

    fn completion(&mut self, w: &WorkCompletion) {
        let Some((q, epoch, kind, slot)) = queue::decode(w.wr_id) else {
            return;
        };
        if q >= Q || !self.queues[q].in_use() || self.queues[q].epoch != epoch {
            return; // a queue that ended: its work is void
        }
        // The slot as the device reported it: bounded before it names a buffer.
        if slot >= self.queues[q].depth && !(kind == Kind::Send && slot == u16::MAX) {
            return;
        }
        if w.status != bareverbs::verbs::WcStatus::Success {
            self.counts.transport_errors += 1;
            self.end_queue_for(q, true, false, LossCause::Transport);
            return;
        }
        match kind {
            Kind::Recv => self.on_capsule(q, slot, w.byte_len),
            Kind::Read => self.on_read_done(q, slot),
            Kind::Send => self.queues[q].send_done(slot),
        }
    }
}
