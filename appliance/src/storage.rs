//! The appliance's two runs: the NVMe-oF target itself, and the virtio-blk boot check
//! (`bvblk`), each ending the run.

use core::fmt::Write;

use bareverbs::hal::virtio_net::GlobalIdentity;
use bareverbs::hal::{DmaRegion, Hal, IdentityHal, PAGE_SIZE, x86::PortIoConfig};

use core::cell::RefCell;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};

use bareverbs_appliance::config::{Config, MAX_DISKS, MAX_NVME};
use bareverbs_appliance::nvmf_app;
use bareverbs_platform::console::{self, Exit, Serial, exit};
use bareverbs_platform::machine::{
    IDLE_MS, clock_ms, dma_left, pass, roce_device, route_nic_interrupts,
};
use bareverbs_platform::{irq, smp};
use bareverbs_storage::nvme::{self, NsDisk, Nvme, NvmeStats, Options};

/// The poll groups' job (`SmpCores::run`): the address of a `&(dyn Fn(usize) + Sync)` on
/// core 0's stack while the run lasts, 0 before.
static JOB: AtomicUsize = AtomicUsize::new(0);
/// The CPUs that finished the job.
static JOBS_DONE: AtomicUsize = AtomicUsize::new(0);

/// What every other CPU runs (`smp::start`'s entry): halts (until an interrupt or its timer's
/// tick) until core 0 hands out the poll groups' job, runs `job(index − 1)` when its index is
/// within [`nvmf_app::MAX_GROUPS`], then returns to idle halts. Never runs it twice.
pub(crate) fn ap_main(index: usize) {
    if index == 0 || index > nvmf_app::MAX_GROUPS {
        return;
    }
    loop {
        let at = JOB.load(Ordering::Acquire);
        if at != 0 {
            // SAFETY: `SmpCores::run` stores the address of a live `&(dyn Fn(usize) + Sync)`
            // and does not return (nor let it go) until every CPU it counted added itself to
            // JOBS_DONE, which this one does only after the call.
            let job = unsafe { *(at as *const &(dyn Fn(usize) + Sync)) };
            job(index - 1);
            JOBS_DONE.fetch_add(1, Ordering::AcqRel);
            return;
        }
        irq::wait();
    }
}

/// The platform's other CPUs as the target's [`nvmf_app::Cores`] (each running [`ap_main`]).
struct SmpCores;

impl nvmf_app::Cores for SmpCores {
    fn count(&self) -> usize {
        (smp::cpus() - 1).min(nvmf_app::MAX_GROUPS)
    }
    fn run(&self, job: &(dyn Fn(usize) + Sync), main: &mut dyn FnMut()) {
        let n = self.count();
        if n == 0 {
            return main();
        }
        let job: &(dyn Fn(usize) + Sync) = job;
        JOB.store(&raw const job as usize, Ordering::Release);
        main();
        // Every CPU counted ran its job (each ends within a poll round and a timer tick once
        // `main` told them to stop); `job` lives until then.
        while JOBS_DONE.load(Ordering::Acquire) < n {
            irq::wait();
        }
    }
    fn wait(&self) {
        irq::wait();
    }
    fn sleeping(&self, k: usize, on: bool) {
        if let Some(s) = SLEEPING.get(k) {
            s.store(on, Ordering::SeqCst);
            // The flag before the group's last poll reads its CQ.
            fence(Ordering::SeqCst);
        }
    }
    fn wake(&self) {
        // The round's completions before the flags are read.
        fence(Ordering::SeqCst);
        for (k, s) in SLEEPING.iter().enumerate().take(self.count()) {
            if s.load(Ordering::Relaxed) {
                irq::wake(k + 1);
            }
        }
    }
    fn posted(&self) {
        // The round's posts (their QPs' state, the busy set) before core 0's flag is read:
        // either core 0's check before it halts (`core0_halt`) sees them, or this sees the
        // flag.
        fence(Ordering::SeqCst);
        if CORE0_SLEEPING.load(Ordering::Relaxed) {
            irq::wake(0);
        }
    }
}

/// Whether core 0 is about to halt or halted while it runs the device's progress for poll
/// groups (written by core 0 only; read by a group after a round that did work).
static CORE0_SLEEPING: AtomicBool = AtomicBool::new(false);

/// Core 0's idle halt with poll groups: says it is halting (the flag a group reads after it
/// posts), then halts unless the device has frames to send (`sends_waiting`: a group's posts
/// made before the flag was seen, which only core 0's progress transmits); a group that
/// posts after the flag wakes it (`SmpCores::posted`), so a group's I/O never waits for the
/// timer's tick (about 16 ms).
fn core0_halt(sends_waiting: impl FnOnce() -> bool) {
    CORE0_SLEEPING.store(true, Ordering::Relaxed);
    // The flag before the device's state is read (paired with the fence in `posted`).
    fence(Ordering::SeqCst);
    if !sends_waiting() {
        irq::wait();
    }
    CORE0_SLEEPING.store(false, Ordering::Relaxed);
}

/// Whether each poll group's CPU is about to halt or halted (written by that CPU only).
static SLEEPING: [AtomicBool; nvmf_app::MAX_GROUPS] =
    [const { AtomicBool::new(false) }; nvmf_app::MAX_GROUPS];

/// The NVMe controllers on the bus, in PCI order (at most [`MAX_NVME`]), brought up; one that
/// does not come up is `None` (its line says why).
pub(crate) type Controllers = [Option<RefCell<Nvme<IdentityHal<'static>>>>; MAX_NVME];

/// A wait for an NVMe completion: on the bootstrap CPU (where the MSI-X messages arrive) a
/// halt until an interrupt (the completion's, at the latest the timer's tick); elsewhere a
/// window for the pending ones.
fn nvme_wait() {
    if bareverbs_platform::smp::cpu_id() == 0 {
        irq::wait();
    } else {
        irq::window();
    }
}

/// Brings up the NVMe controllers and prints a line for each.
pub(crate) fn nvme_controllers(pci: &PortIoConfig, hal: IdentityHal<'static>) -> Controllers {
    core::array::from_fn(|n| {
        let at = nvme::find_nth(pci, n)?;
        // SAFETY: the function is driven by this controller alone; its BAR lies in the
        // identity-mapped, uncached PCI hole (the HAL's mapping).
        match unsafe { Nvme::new(hal, pci, at, clock_ms, Options::default()) } {
            Ok(mut c) => {
                // The completions interrupt the bootstrap CPU on the storage vector; a wait
                // for one halts there instead of spinning.
                let msg =
                    hal.msi_message(u16::from(irq::STORAGE_VECTOR - irq::DEVICE_VECTORS.start));
                // SAFETY: `at` is the function `c` drives, reached through `pci`.
                let msix = msg.map(|m| unsafe { c.enable_msix(pci, at, m) });
                c.set_wait(nvme_wait);
                let info = *c.info();
                let model = core::str::from_utf8(&info.model).unwrap_or("?").trim_end();
                let serial = core::str::from_utf8(&info.serial).unwrap_or("?").trim_end();
                let _ = write!(
                    Serial,
                    "nvme {n}: {at} {model} (serial {serial}), {} I/O queue, interrupts {}, write cache {}, write zeroes {}, dataset management {}, largest transfer {} B;",
                    c.io_queues(),
                    match msix {
                        Some(Ok(())) => "MSI-X",
                        Some(Err(_)) => "none (polled: MSI-X refused)",
                        None => "none (polled: no MSI route)",
                    },
                    if info.vwc { "yes" } else { "no" },
                    if info.write_zeroes() { "yes" } else { "no" },
                    if info.dataset_management() {
                        "yes"
                    } else {
                        "no"
                    },
                    info.max_transfer
                );
                for ns in c.namespaces() {
                    let _ = write!(
                        Serial,
                        " ns {} ({} blocks of {} B)",
                        ns.nsid, ns.blocks, ns.block_size
                    );
                }
                let _ = writeln!(Serial);
                Some(RefCell::new(c))
            }
            Err(e) => {
                let _ = writeln!(Serial, "nvmf: NVMe controller {n} at {at}: {e}");
                None
            }
        }
    })
}

/// Prints `nvmf-uk nvme copies: X bytes per I/O (N I/Os, B bytes copied)` for the NVMe
/// controllers (summed; nothing without one): the bytes the CPU copied between the target's
/// buffers and the controllers' namespaces, per read or write asked of them.
fn nvme_copies(controllers: &Controllers) {
    let stats: heapless::Vec<NvmeStats, MAX_NVME> = controllers
        .iter()
        .flatten()
        .filter_map(|c| c.try_borrow().ok().map(|c| c.stats()))
        .collect();
    if !stats.is_empty() {
        copies_line(stats.iter());
    }
}

fn copies_line<'a>(stats: impl Iterator<Item = &'a NvmeStats>) {
    let (ios, copied) = stats.fold((0u64, 0u64), |(i, c), s| (i + s.transfers, c + s.copied));
    let _ = writeln!(
        Serial,
        "nvmf-uk nvme copies: {} bytes per I/O ({ios} I/Os, {copied} bytes copied)",
        // Rounded up: 0 only when nothing was copied.
        if ios == 0 { 0 } else { copied.div_ceil(ios) }
    );
}

/// The storage appliance (`bareverbs_appliance::nvmf_app`): the NVMe-oF target over the
/// software RoCE device, with `ram` as the RAM disk and the first virtio-blk disk if there is
/// one, until the console receives `q` or `opts.serve_secs` have passed (`s`: the counters).
/// Then prints what the target counted, flushes the disk and powers off (PASS).
pub(crate) fn appliance(
    pci: &PortIoConfig,
    hal: IdentityHal<'static>,
    dma: &DmaRegion,
    config: &Config<'_>,
    ram: &'static mut [u8],
    controllers: Controllers,
) -> ! {
    use bareverbs_appliance::nvmf_app;
    use bareverbs_platform::block::{BlockDevice, BlockError};
    use bareverbs_platform::virtio_blk;
    let mut nic_interrupts = false;
    let dev = roce_device(pci, hal, config.ip, |nic| {
        nic_interrupts = route_nic_interrupts(pci, hal, nic)
    });
    let ctx = bareverbs::Context::new(dev);
    // With poll groups on other CPUs, only core 0's loop runs the device's transport: a
    // group's posts and polls never take the device lock (docs/percore.md).
    let with_groups = nvmf_app::groups(config, &SmpCores) > 0;
    if with_groups {
        ctx.provider().set_progress_only(true);
    }
    // The virtio-blk disks in PCI order (`blk:N` is the Nth); one that does not come up is
    // `None`, and a namespace on it stops the appliance before it serves.
    let mut disks: [Option<virtio_blk::VirtioBlk<GlobalIdentity, _>>; MAX_DISKS] =
        core::array::from_fn(|n| {
            let at = virtio_blk::find_nth(pci, n)?;
            // SAFETY: as in `blk_check`; each function is driven by this disk alone.
            let d =
                unsafe { virtio_blk::VirtioBlk::<GlobalIdentity, _>::new_pci(pci, at, clock_ms) };
            match d {
                Ok(d) => Some(d),
                Err(e) => {
                    let _ = writeln!(Serial, "nvmf: virtio-blk disk {n} at {at}: {e}");
                    None
                }
            }
        });
    // The console: `q` stops, `s` prints the counters, `aGS` sets an ANA group's state,
    // `mXXXX` runs the instruction counter's mark XXXX (the lab's windows around a counted
    // fio job).
    let mut commands = nvmf_app::Console::default();
    let stop_at = config
        .serve_secs
        .map(|s| clock_ms().saturating_add(u64::from(s) * 1000));
    let mut console_in = || {
        if stop_at.is_some_and(|t| clock_ms() >= t) {
            return Some(nvmf_app::Command::Quit);
        }
        while let Some(b) = console::try_get() {
            match commands.feed(b) {
                Some(c @ (nvmf_app::Command::Quit | nvmf_app::Command::Ana(..))) => return Some(c),
                Some(c @ nvmf_app::Command::Stats) => {
                    nvme_copies(&controllers);
                    return Some(c);
                }
                Some(nvmf_app::Command::Mark(code)) if nvmf_app::mark(code) => {
                    let _ = writeln!(Serial, "nvmf-uk mark {code:04x}");
                }
                Some(nvmf_app::Command::Mark(_)) | None => {}
            }
        }
        None
    };
    // Idle: a round that did no work and saw no new frame halts the CPU until the NIC's
    // interrupt (or the timer's); without the NIC's interrupts, only after IDLE_MS without a
    // frame, until the timer's.
    let frames_in = || {
        let c = ctx.provider().port_counts();
        c.roce + c.stack + c.dropped + c.arp_answered
    };
    let (mut seen, mut since) = (frames_in(), clock_ms());
    // Once a second, when they changed: what the transport counted (the evidence of loss on
    // the segment and of what was done about it), and the CPU's halts and interrupts.
    let t0 = clock_ms();
    let (mut shown, mut shown_at) = (ctx.provider().transport_counts(), t0);
    let mut idle = |work: usize| {
        let (frames, now) = (frames_in(), clock_ms());
        if now.saturating_sub(shown_at) >= 1000 {
            shown_at = now;
            let c = ctx.provider().transport_counts();
            if c != shown {
                shown = c;
                let _ = writeln!(
                    Serial,
                    "nvmf-uk transport +{} ms: timeouts {}, seq NAKs received {} sent {}, RNR NAKs received {} sent {}, duplicates {}, out of sequence {}, READ gaps {}; NIC interrupts {}, timer ticks {}, halts {}",
                    now - t0,
                    c.timeouts,
                    c.seq_naks_received,
                    c.seq_naks_sent,
                    c.rnr_naks_received,
                    c.rnr_naks_sent,
                    c.duplicates,
                    c.out_of_sequence,
                    c.read_gaps,
                    irq::count(irq::DEVICE_VECTORS.start),
                    irq::count(irq::TIMER_VECTOR),
                    irq::halts()
                );
            }
        }
        if work > 0 || frames != seen {
            (seen, since) = (frames, now);
        } else if nic_interrupts || now.saturating_sub(since) >= IDLE_MS {
            if with_groups {
                core0_halt(|| ctx.provider().sends_waiting());
            } else {
                irq::wait();
            }
        }
    };
    let _ = writeln!(
        Serial,
        "nvmf: idle rounds halt {}",
        if nic_interrupts {
            "until the NIC's interrupt or the timer's"
        } else {
            "after 32 ms without a frame, until the timer's interrupt"
        }
    );
    let mut handed: [Option<&mut dyn BlockDevice>; MAX_DISKS] = disks
        .each_mut()
        .map(|d| d.as_mut().map(|d| d as &mut dyn BlockDevice));
    // Every namespace of every controller, as a block device over its shared controller.
    const NVME_NS: usize = MAX_NVME * nvme::MAX_NAMESPACES;
    let mut ns_disks: heapless::Vec<(usize, NsDisk<'_, IdentityHal<'static>>), NVME_NS> =
        heapless::Vec::new();
    for (n, c) in controllers.iter().enumerate() {
        let Some(c) = c else { continue };
        let nsids: heapless::Vec<u32, { nvme::MAX_NAMESPACES }> =
            c.borrow().namespaces().map(|ns| ns.nsid).collect();
        for nsid in nsids {
            if let Some(mut d) = NsDisk::new(c, nsid) {
                // SAFETY: the target gives `read_dma` and `write_dma` only the data and
                // receive buffers of its queues' regions, carved from `dma`, the DMA region
                // `hal` translates (identity-mapped, the controller reaches it at those
                // addresses); it holds I/O data only, so a late write of a controller that
                // would not stop can change data, never the kernel's state.
                unsafe { d.allow_dma() };
                let _ = ns_disks.push((n, d));
            }
        }
    }
    let mut handed_nvme: heapless::Vec<nvmf_app::NvmeNamespace<'_>, NVME_NS> = ns_disks
        .iter_mut()
        .map(|(n, d)| nvmf_app::NvmeNamespace {
            controller: *n,
            nsid: d.namespace().nsid,
            disk: Some(d as &mut dyn BlockDevice),
        })
        .collect();
    let r = nvmf_app::serve(
        &ctx,
        config,
        ram,
        &mut handed,
        &mut handed_nvme,
        &mut Serial,
        &clock_ms,
        &mut console_in,
        &mut idle,
        &SmpCores,
    );
    // The poll groups' CPUs: how often core 0 woke them (IPIs taken), beside their halts.
    let groups = nvmf_app::groups(config, &SmpCores);
    if groups > 0 {
        let _ = write!(Serial, "nvmf: poll groups woken by core 0:");
        for cpu in 1..=groups {
            let _ = write!(
                Serial,
                " cpu {cpu} {}",
                irq::count_on(cpu, irq::WAKE_VECTOR)
            );
        }
        // And core 0 by the groups (their posts while it halted), beside its halts.
        let _ = writeln!(
            Serial,
            "; core 0 woken by the groups {} (halts {})",
            irq::count_on(0, irq::WAKE_VECTOR),
            irq::halts_on(0)
        );
    }
    // Every disk flushed before power-off, and what each did.
    type Flushed = Option<(Result<(), BlockError>, virtio_blk::BlkStats, bool)>;
    let mut flushed: [Flushed; MAX_DISKS] = [const { None }; MAX_DISKS];
    for (f, d) in flushed.iter_mut().zip(disks.iter_mut()) {
        if let Some(d) = d {
            *f = Some((d.flush(), d.stats(), d.volatile_cache()));
        }
    }
    drop(disks);
    drop(handed_nvme);
    // Every NVMe namespace flushed (a Flush where the controller has a volatile cache), then
    // the controllers disabled (their drop) before the DMA pages are counted.
    let mut nvme_failed = false;
    for (n, d) in ns_disks.iter_mut() {
        if let Err(e) = d.flush() {
            let _ = writeln!(
                Serial,
                "nvmf: NVMe controller {n} namespace {}: flush: {e}",
                d.namespace().nsid
            );
            nvme_failed = true;
        }
    }
    drop(ns_disks);
    let nvme_stats: [Option<NvmeStats>; MAX_NVME] = controllers
        .each_ref()
        .map(|c| c.as_ref().map(|c| c.borrow().stats()));
    drop(controllers);
    drop(ctx);
    match r {
        Ok(s) => {
            let c = s.counts;
            let _ = writeln!(
                Serial,
                "nvmf-uk target: ok served {} s: {} queue connections accepted, {} rejected, {} controllers ({} lost), {} commands ({} with an error status)",
                s.ms / 1000,
                c.accepted,
                c.rejected,
                c.controllers,
                c.lost,
                c.commands,
                c.errors
            );
        }
        Err(e) => {
            let _ = writeln!(Serial, "bareverbs: FAIL nvmf: {e}");
            exit(Exit::Fail)
        }
    }
    let mut failed = false;
    for (n, f) in flushed.iter().enumerate() {
        match f {
            Some((Ok(()), st, cache)) => {
                let _ = writeln!(
                    Serial,
                    "nvmf-uk virtio-blk disk {n}: flushed; {} requests, {} bytes read, {} written, {} flushes; write cache {}",
                    st.requests,
                    st.read,
                    st.written,
                    st.flushes,
                    if *cache {
                        "write-back"
                    } else {
                        "write-through"
                    }
                );
            }
            Some((Err(e), _, _)) => {
                let _ = writeln!(Serial, "nvmf: virtio-blk disk {n}: flush: {e}");
                failed = true;
            }
            None => {}
        }
    }
    if nvme_stats.iter().any(Option::is_some) {
        copies_line(nvme_stats.iter().flatten());
    }
    for (n, st) in nvme_stats.iter().enumerate() {
        if let Some(st) = st {
            let _ = writeln!(
                Serial,
                "nvmf-uk nvme {n}: flushed; {} commands, {} bytes read, {} written, {} flushes, {} errors, {} timeouts",
                st.completed, st.read, st.written, st.flushes, st.status_errors, st.timeouts
            );
        }
    }
    if failed || nvme_failed {
        let _ = writeln!(Serial, "bareverbs: FAIL nvmf: a disk's flush failed");
        exit(Exit::Fail)
    }
    let left = dma_left(dma);
    if left != 0 {
        let _ = writeln!(
            Serial,
            "bareverbs: FAIL nvmf: {left} DMA pages not returned"
        );
        exit(Exit::Fail)
    }
    let _ = writeln!(Serial, "DMA pages outstanding: 0");
    pass()
}

/// The virtio-blk boot check (`bvblk` on the command line; `bareverbs_appliance::disk_check`):
/// the pattern through the first virtio-blk disk, which the lab then finds in the disk image.
/// Ends the run with PASS or FAIL.
pub(crate) fn blk_check(pci: &PortIoConfig, hal: IdentityHal<'static>, dma: &DmaRegion) -> ! {
    use bareverbs::hal::Hal;
    use bareverbs_appliance::disk_check;
    use bareverbs_platform::virtio_blk;
    let fail = |why: &dyn core::fmt::Display| -> ! {
        let _ = writeln!(Serial, "bareverbs: FAIL virtio-blk: {why}");
        exit(Exit::Fail)
    };
    let Some(at) = virtio_blk::find(pci) else {
        fail(&"no virtio-blk function on the bus")
    };
    // SAFETY: the disk is driven by nothing else; its BARs lie in the identity-mapped,
    // uncached PCI hole (the HAL's mapping).
    let mut disk =
        match unsafe { virtio_blk::VirtioBlk::<GlobalIdentity, _>::new_pci(pci, at, clock_ms) } {
            Ok(d) => d,
            Err(e) => fail(&e),
        };
    let pages = (disk_check::SECTORS * 512).div_ceil(PAGE_SIZE);
    let Ok(block) = hal.dma_alloc(pages) else {
        fail(&"no DMA memory for the scratch buffer")
    };
    // SAFETY: a fresh block of `pages` pages from the HAL, used only here, returned below.
    let scratch =
        unsafe { core::slice::from_raw_parts_mut(block.vaddr.as_ptr(), pages * PAGE_SIZE) };
    let r = disk_check::run(&mut disk, scratch);
    let (stats, flush) = (disk.stats(), disk.has_flush());
    drop(disk);
    // SAFETY: the block `dma_alloc` gave, returned once; `scratch` is not used after this.
    unsafe { hal.dma_dealloc(block) };
    match r {
        Ok(c) if dma_left(dma) == 0 => {
            let _ = writeln!(
                Serial,
                "virtio-blk: {:02x}:{:02x}.{}, {} sectors, flush {}: {} bytes from sector {} \
                 written, read back in 3 pieces and equal, flushed; reads past the end and of \
                 part of a block refused ({} requests)",
                at.bus(),
                at.device(),
                at.function(),
                c.capacity,
                if flush { "yes" } else { "no" },
                c.bytes,
                disk_check::FIRST,
                stats.requests
            );
            let _ = writeln!(Serial, "DMA pages outstanding: 0");
            pass()
        }
        Ok(_) => fail(&"DMA pages not returned"),
        Err(why) => fail(&why),
    }
}

/// The NVMe boot check (`bvnvme` on the command line): the virtio-blk check's pattern
/// (`bareverbs_appliance::disk_check`) through the first namespace of the first NVMe
/// controller, by its bounce buffer; then the controller is disabled and its memory counted.
/// Ends the run with PASS or FAIL.
/// Where the boot check's zero-copy round trip goes (past the pattern of
/// `disk_check`), and its size: one command of the largest transfer.
const ZERO_COPY_LBA: u64 = 1024;
const ZERO_COPY_BYTES: usize = 128 * 1024;

/// Writes [`ZERO_COPY_BYTES`] of the sector pattern from `scratch` at byte 512 by DMA
/// (33 pages: PRP1 at an offset and a PRP list), reads them back by DMA at byte 2048 and
/// compares; the bytes copied on the way (0 when both went by DMA).
fn zero_copy_check(
    disk: &mut NsDisk<'_, IdentityHal<'static>>,
    scratch: &mut [u8],
) -> Result<usize, &'static str> {
    use bareverbs_appliance::disk_check::pattern;
    use bareverbs_platform::block::BlockDevice;
    let blocks = (ZERO_COPY_BYTES / 512) as u64;
    if scratch.len() < ZERO_COPY_BYTES + 2048 || disk.capacity() < ZERO_COPY_LBA + blocks {
        return Err("no room for the zero-copy round trip");
    }
    let src = &mut scratch[512..512 + ZERO_COPY_BYTES];
    for (i, s) in src.chunks_mut(512).enumerate() {
        pattern(ZERO_COPY_LBA + i as u64, s);
    }
    let w = disk
        .write_dma(ZERO_COPY_LBA, src, false)
        .map_err(|_| "the zero-copy write failed")?;
    scratch.fill(0);
    let dst = &mut scratch[2048..2048 + ZERO_COPY_BYTES];
    let r = disk
        .read_dma(ZERO_COPY_LBA, dst)
        .map_err(|_| "the zero-copy read failed")?;
    let mut want = [0u8; 512];
    for (i, s) in dst.chunks(512).enumerate() {
        pattern(ZERO_COPY_LBA + i as u64, &mut want);
        if s != want {
            return Err("the zero-copy read gave other bytes");
        }
    }
    Ok(w + r)
}

pub(crate) fn nvme_check(pci: &PortIoConfig, hal: IdentityHal<'static>, dma: &DmaRegion) -> ! {
    use bareverbs::hal::Hal;
    use bareverbs_appliance::disk_check;
    let fail = |why: &dyn core::fmt::Display| -> ! {
        let _ = writeln!(Serial, "bareverbs: FAIL nvme: {why}");
        exit(Exit::Fail)
    };
    let [Some(c), ..] = nvme_controllers(pci, hal) else {
        fail(&"no NVMe controller came up")
    };
    let Some(nsid) = c.borrow().namespaces().next().map(|ns| ns.nsid) else {
        fail(&"the controller serves no namespace")
    };
    let pages = (disk_check::SECTORS * 512).div_ceil(PAGE_SIZE);
    let Ok(block) = hal.dma_alloc(pages) else {
        fail(&"no DMA memory for the scratch buffer")
    };
    // SAFETY: a fresh block of `pages` pages from the HAL, used only here, returned below.
    let scratch =
        unsafe { core::slice::from_raw_parts_mut(block.vaddr.as_ptr(), pages * PAGE_SIZE) };
    let r = match NsDisk::new(&c, nsid) {
        Some(mut disk) => disk_check::run(&mut disk, scratch).and_then(|k| {
            // SAFETY: the only buffers given to the DMA entries are `scratch`'s, a block of
            // the DMA region the HAL translates, kept until the controller is disabled.
            unsafe { disk.allow_dma() };
            zero_copy_check(&mut disk, scratch).map(|copied| (k, copied))
        }),
        None => Err("the namespace is not served"),
    };
    let stats = c.borrow().stats();
    drop(c);
    // SAFETY: the block `dma_alloc` gave, returned once; `scratch` is not used after this.
    unsafe { hal.dma_dealloc(block) };
    match r {
        Ok((k, copied)) if dma_left(dma) == 0 => {
            let _ = writeln!(
                Serial,
                "nvme: namespace {nsid}, {} blocks: {} bytes from block {} written, read back in \
                 3 pieces and equal, flushed; reads past the end and of part of a block refused \
                 ({} commands, {} flushes); the controller disabled",
                k.capacity,
                k.bytes,
                disk_check::FIRST,
                stats.completed,
                stats.flushes
            );
            let _ = writeln!(
                Serial,
                "nvme: zero copy: {ZERO_COPY_BYTES} bytes from block {ZERO_COPY_LBA} written from \
                 DMA memory at offset 512 of its page and read back at offset 2048, through PRP \
                 lists, equal; {copied} bytes copied"
            );
            let _ = writeln!(
                Serial,
                "nvme: {} MSI-X interrupts on the storage vector; {} halts",
                irq::count(irq::STORAGE_VECTOR),
                irq::halts()
            );
            let _ = writeln!(Serial, "DMA pages outstanding: 0");
            pass()
        }
        Ok(_) => fail(&"DMA pages not returned"),
        Err(why) => fail(&why),
    }
}
