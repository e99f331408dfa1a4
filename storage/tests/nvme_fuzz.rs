//! The hostile-controller fuzzer of the NVMe driver: `tests/nvme_fuzz.sh [N] [SEED]`.
//!
//! `NVME_FUZZ_EXECS` executions (default 20,000 under `cargo test`) from the seed
//! `NVME_FUZZ_SEED`, spent through the fuzz budget driver in sessions of [`SESSION`]: a fresh
//! controller model of random shape (namespaces of random sizes with 512- or 4096-byte
//! blocks, the optional commands or not, queue sizes, doorbell strides, MDTS), brought up
//! honestly or, one session in four, under lies in Identify and CSTS; then lying on
//! completions at a rate drawn per session (wrong identifiers, stale phases, duplicates,
//! withheld completions, bad queue identifiers and heads, error statuses). An execution is
//! one operation: a copied read or write, a zero-copy read or write through the caller's own
//! pages at an offset or through the caller's buffer translated by the HAL (off a dword
//! boundary now and then: copied, and counted so), Flush, Write Zeroes, Dataset Management, or a reset of a stopped
//! controller.
//!
//! Three sessions in four program MSI-X before the lies start (one in three of those under a
//! lie in its placement: no capability, a looping list, the table elsewhere, an entry that
//! forgets): the driver then waits through its wait hook, and every message the model sent
//! must be the one programmed.
//!
//! The oracles: nothing panics; every command ends exactly once (submitted = completed +
//! timed out + protocol violations); a read that succeeds returns the bytes last written
//! (a shadow of the medium, with blocks a failed command may have changed left unknown);
//! every operation's waits end within a bound of clock reads; the model is never asked to
//! reach memory the driver does not own, nor has memory freed under live queues; after a
//! session every DMA page is returned unless the controller would not stop.
//!
//! Prints `nvme-fuzz: N executions, F failures; commands C, completed D, status errors E,
//! timeouts T, violations V, resets R, bring-ups U, refused K, ignored namespaces I,
//! verified reads B, zero-copy transfers Z, kept memory M, lies L, longest wait W, MSI-X on X of
//! Y sessions, messages G, waits H; errors {...}; seed S`.

#[path = "../../tests/fuzz_budget/mod.rs"]
mod fuzz_budget;

use std::cell::Cell;
use std::collections::BTreeMap;

use bareverbs_hal::{Hal, MsiMessage, PAGE_SIZE};
use bareverbs_model::Rng;
use bareverbs_model::nvme::{MsixLie, NsConfig, NvmeConfig, NvmeHostile, NvmeModel};
use bareverbs_storage::nvme::{MsixError, Nvme, NvmeError, Options, Pages, State};

/// Executions of one session.
const SESSION: u64 = 2_000;
/// Milliseconds a command may take in the fuzzer (clock reads: the clock ticks at each).
const TIMEOUT: u64 = 20;
/// Clock reads one operation may make at most: a command's timeout per command, and the
/// stop and restart of the controller (twice CAP.TO, at most 15 units of 500 ms here).
const WAIT_BOUND: u64 = 40 * (TIMEOUT + 2) + 4 * (15 * 500 + 2);
/// Pages of the caller's own buffer for the zero-copy operations.
const USER_PAGES: usize = 10;

thread_local! {
    static TICKS: Cell<u64> = const { Cell::new(0) };
    static WAITS: Cell<u64> = const { Cell::new(0) };
}

/// The message the sessions with MSI-X program.
const MSG: MsiMessage = MsiMessage {
    address: 0xFEE0_0000,
    data: 0x34,
};

/// The wait hook: counted (per thread); the clock moves at the driver's next look.
fn wait_hook() {
    WAITS.with(|w| w.set(w.get() + 1));
}

/// A clock that moves one millisecond at every look (per thread).
fn tick() -> u64 {
    TICKS.with(|t| {
        let v = t.get() + 1;
        t.set(v);
        v
    })
}

fn now() -> u64 {
    TICKS.with(Cell::get)
}

#[derive(Default)]
struct Reach {
    submitted: u64,
    completed: u64,
    status_errors: u64,
    timeouts: u64,
    violations: u64,
    resets: u64,
    up: u64,
    refused: u64,
    ignored: u64,
    verified: u64,
    kept: u64,
    direct: u64,
    lies: u64,
    longest: u64,
    msix_tried: u64,
    msix_on: u64,
    messages: u64,
    waits: u64,
    errors: BTreeMap<String, u64>,
}

/// The content of block `lba` written with `tag` (0: zeroes).
fn content(tag: u64, lba: u64, bs: usize, out: &mut [u8]) {
    if tag == 0 {
        out[..bs].fill(0);
        return;
    }
    let mut r = Rng::new(tag ^ lba.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    for c in out[..bs].chunks_mut(8) {
        let v = r.next_u64().to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

fn kind(e: NvmeError) -> String {
    match e {
        NvmeError::Status { .. } => "Status".into(),
        NvmeError::Unsupported(u) => format!("Unsupported({u:?})"),
        e => format!("{e:?}"),
    }
}

fn session(seed: u64, n: u64) -> Reach {
    let mut rng = Rng::new(seed);
    let mut reach = Reach::default();
    let namespaces: Vec<NsConfig> = (0..1 + rng.below(3))
        .map(|_| NsConfig {
            blocks: rng.pick(&[16, 300, 1024, 4096]),
            block_size: rng.pick(&[512, 4096]),
        })
        .collect();
    let cfg = NvmeConfig {
        namespaces,
        vwc: rng.one_in(2),
        write_zeroes: rng.one_in(2),
        dsm: rng.one_in(2),
        mqes: rng.pick(&[1, 2, 3, 7, 63, 2047]),
        dstrd: rng.pick(&[0, 0, 0, 1, 2]),
        mdts: rng.pick(&[0, 1, 2, 5, 7]),
        to: rng.pick(&[1, 2, 15]),
        max_queues: rng.pick(&[1, 2, 64]),
        ..NvmeConfig::default()
    };
    let m = NvmeModel::new(cfg.clone());
    // One session in eight brought up under lies in CSTS and Identify, one in eight under
    // lies in Identify alone; the others honestly.
    let bring_up = rng.below(8);
    let lying_bring_up = bring_up < 2;
    m.set_hostile(lying_bring_up.then_some(NvmeHostile {
        seed,
        rate: 2 + bring_up as u32,
        completions: false,
        identify: true,
        registers: bring_up == 0,
    }));
    let options = Options {
        io_queues: 1 + rng.below(4) as u16,
        io_depth: rng.pick(&[2, 3, 16, 64]),
        command_timeout_ms: TIMEOUT,
    };
    let t0 = now();
    // SAFETY: the model's function is this driver's alone; the model maps its BAR.
    let up = unsafe { Nvme::new(m.clone(), &m, NvmeModel::address(), tick, options) };
    let wait = now() - t0;
    assert!(wait <= WAIT_BOUND, "bring-up waited {wait}");
    reach.longest = wait;
    let mut nvme = match up {
        Ok(nvme) => {
            reach.up += 1;
            nvme
        }
        Err(e) => {
            reach.refused += 1;
            *reach.errors.entry(kind(e)).or_default() += 1;
            let l = m.lies();
            reach.lies += l.registers + l.identify;
            assert!(m.violations().is_empty(), "{:?}", m.violations());
            if m.outstanding_pages() != 0 {
                // Kept only when the controller would not stop: a lie in CSTS.
                assert!(lying_bring_up, "pages kept after an honest bring-up failed");
                reach.kept += 1;
            }
            return reach;
        }
    };
    reach.ignored += u64::from(nvme.stats().ignored_namespaces);
    if !rng.one_in(4) {
        reach.msix_tried += 1;
        let lie = rng.one_in(3).then(|| {
            rng.pick(&[
                MsixLie::NoCapability,
                MsixLie::LoopingList,
                MsixLie::OtherBar,
                MsixLie::PastBar,
                MsixLie::ForgetfulEntry,
            ])
        });
        m.set_msix_lie(lie);
        // SAFETY: the model's function, the one `nvme` drives.
        let on = unsafe { nvme.enable_msix(&m, NvmeModel::address(), MSG) };
        match on {
            Ok(()) => assert!(lie.is_none()),
            // The restart that binds the vector, under the bring-up's lies in CSTS.
            Err(MsixError::Restart(e)) => {
                assert!(
                    lying_bring_up,
                    "an honest controller did not restart: {e:?}"
                );
                *reach
                    .errors
                    .entry(format!("MSI-X {}", kind(e)))
                    .or_default() += 1;
            }
            Err(e) => assert!(lie.is_some(), "MSI-X refused without a lie: {e:?}"),
        }
        assert_eq!(nvme.interrupts(), lie.is_none());
        assert_eq!(m.msix_enabled(), lie.is_none());
        reach.msix_on += u64::from(nvme.interrupts());
        nvme.set_wait(wait_hook);
    }
    let waits0 = WAITS.with(Cell::get);
    let registers = rng.one_in(8);
    m.set_hostile(Some(NvmeHostile {
        seed: seed ^ 0xABCD,
        rate: rng.pick(&[2, 3, 8, 64, 1000]),
        completions: true,
        identify: false,
        registers,
    }));
    let served: Vec<_> = nvme.namespaces().copied().collect();
    // Shadows of the media: Some(tag) known, None unknown (a failed command may have
    // written).
    let mut shadow: Vec<Vec<Option<u64>>> = served
        .iter()
        .map(|ns| vec![Some(0); ns.blocks as usize])
        .collect();
    let user = m.dma_alloc(USER_PAGES).expect("the caller's buffer");
    // SAFETY: the caller's block, USER_PAGES pages from `vaddr`.
    let ubuf =
        unsafe { std::slice::from_raw_parts_mut(user.vaddr.as_ptr(), USER_PAGES * PAGE_SIZE) };
    let mut buf = vec![0u8; 160 * 1024];
    let mut expect = vec![0u8; 160 * 1024];
    let mut next_tag = seed | 1;
    for _ in 0..n {
        let t0 = now();
        if nvme.state() != State::Ready && rng.one_in(2) {
            // A stopped controller brought back (or found wedged).
            if let Err(e) = nvme.reset() {
                *reach.errors.entry(kind(e)).or_default() += 1;
            }
            continue;
        }
        if served.is_empty() {
            // Nothing to read or write: the controller still answers (or not) a reset.
            let _ = nvme.reset();
            continue;
        }
        let i = rng.below(served.len() as u64) as usize;
        let ns = served[i];
        let bs = ns.block_size as usize;
        let max_blocks = (buf.len() / bs) as u64;
        let blocks = 1 + match rng.below(4) {
            0 => rng.below(max_blocks.min(ns.blocks)),
            _ => rng.below(4.min(ns.blocks)),
        };
        let lba = rng.below(ns.blocks - blocks + 1);
        let len = blocks as usize * bs;
        let op = rng.below(10);
        let r = match op {
            // Copied write.
            0 | 1 => {
                next_tag += 2;
                for b in 0..blocks {
                    content(next_tag, lba + b, bs, &mut buf[b as usize * bs..]);
                }
                let r = nvme.write(ns.nsid, lba, &buf[..len]);
                let after = if r.is_ok() { Some(next_tag) } else { None };
                for b in 0..blocks {
                    shadow[i][(lba + b) as usize] = after;
                }
                r
            }
            // Copied read, checked.
            2 | 3 => {
                let r = nvme.read(ns.nsid, lba, &mut buf[..len]);
                if r.is_ok() {
                    for b in 0..blocks {
                        let at = b as usize * bs;
                        if let Some(tag) = shadow[i][(lba + b) as usize] {
                            content(tag, lba + b, bs, &mut expect[at..]);
                            assert!(
                                buf[at..at + bs] == expect[at..at + bs],
                                "block {} of namespace {} read wrong",
                                lba + b,
                                ns.nsid
                            );
                            reach.verified += 1;
                        }
                    }
                }
                r
            }
            // Zero-copy write or read through the caller's pages, at a dword offset.
            4 | 5 => {
                let off = 4 * rng.below(1024) as usize;
                let len = len.min((USER_PAGES - 1) * PAGE_SIZE) / bs * bs;
                let blocks = (len / bs) as u64;
                if blocks == 0 {
                    continue;
                }
                let pages: Vec<u64> = (1..(off + len).div_ceil(PAGE_SIZE))
                    .map(|p| user.paddr + (p * PAGE_SIZE) as u64)
                    .collect();
                let p = Pages {
                    first: user.paddr + off as u64,
                    rest: &pages,
                };
                let q = rng.below(nvme.io_queues() as u64 + 1) as usize;
                // Half of them through the caller's buffer itself, translated by the HAL
                // (`read_direct`, `write_direct`); at an offset off a dword boundary now and
                // then, which goes through the bounce buffer.
                let direct = rng.one_in(2);
                let off = if direct && rng.one_in(8) {
                    off + 2
                } else {
                    off
                };
                let copies = if off % 4 == 0 { 0 } else { len };
                if direct {
                    let at = &mut ubuf[off..off + len];
                    let before = nvme.stats();
                    let r = if op == 4 {
                        next_tag += 2;
                        for b in 0..blocks {
                            content(next_tag, lba + b, bs, &mut at[b as usize * bs..]);
                        }
                        // SAFETY: the caller's DMA pages, kept for good if the controller
                        // wedges.
                        let r = unsafe { nvme.write_direct(ns.nsid, lba, at) };
                        let after = if r.is_ok() { Some(next_tag) } else { None };
                        if !matches!(r, Err(NvmeError::InvalidArgument | NvmeError::Stopped)) {
                            for b in 0..blocks {
                                shadow[i][(lba + b) as usize] = after;
                            }
                        }
                        r
                    } else {
                        // SAFETY: as above.
                        let r = unsafe { nvme.read_direct(ns.nsid, lba, at) };
                        if r.is_ok() {
                            for b in 0..blocks {
                                let o = b as usize * bs;
                                if let Some(tag) = shadow[i][(lba + b) as usize] {
                                    content(tag, lba + b, bs, &mut expect);
                                    assert!(at[o..o + bs] == expect[..bs], "direct read wrong");
                                    reach.verified += 1;
                                }
                            }
                        }
                        r
                    };
                    let s = nvme.stats();
                    if let Ok(c) = r {
                        assert_eq!(c, copies, "bytes copied at offset {off}");
                        assert_eq!(s.copied - before.copied, copies as u64);
                        assert_eq!(s.direct - before.direct, (len - copies) as u64);
                        reach.direct += (c == 0) as u64;
                    }
                    r.map(|_| ())
                } else if op == 4 {
                    next_tag += 2;
                    for b in 0..blocks {
                        content(next_tag, lba + b, bs, &mut ubuf[off + b as usize * bs..]);
                    }
                    // SAFETY: the caller's DMA pages, not touched until the call returns
                    // (and kept for good if the controller wedges).
                    let r = unsafe { nvme.write_pages(q, ns.nsid, lba, p, len) };
                    let after = if r.is_ok() { Some(next_tag) } else { None };
                    if r != Err(NvmeError::InvalidArgument) {
                        for b in 0..blocks {
                            shadow[i][(lba + b) as usize] = after;
                        }
                    }
                    r
                } else {
                    // SAFETY: as above.
                    let r = unsafe { nvme.read_pages(q, ns.nsid, lba, p, len) };
                    if r.is_ok() {
                        for b in 0..blocks {
                            let at = off + b as usize * bs;
                            if let Some(tag) = shadow[i][(lba + b) as usize] {
                                content(tag, lba + b, bs, &mut expect);
                                assert!(ubuf[at..at + bs] == expect[..bs], "zero-copy read wrong");
                                reach.verified += 1;
                            }
                        }
                    }
                    r
                }
            }
            6 => nvme.flush(ns.nsid),
            7 => {
                let r = nvme.write_zeroes(ns.nsid, lba, blocks);
                let after = if r.is_ok() { Some(0) } else { None };
                if !matches!(r, Err(NvmeError::Unsupported(_))) {
                    for b in 0..blocks {
                        shadow[i][(lba + b) as usize] = after;
                    }
                }
                r
            }
            8 => {
                let r = nvme.deallocate(ns.nsid, &[(lba, blocks as u32)]);
                // Deallocated blocks read as zeroes on the model; a failed command may have
                // deallocated them or not.
                let after = if r.is_ok() { Some(0) } else { None };
                if !matches!(r, Err(NvmeError::Unsupported(_))) {
                    for b in 0..blocks {
                        shadow[i][(lba + b) as usize] = after;
                    }
                }
                r
            }
            _ => {
                if nvme.state() == State::Ready {
                    Ok(())
                } else {
                    nvme.reset()
                }
            }
        };
        if let Err(e) = r {
            *reach.errors.entry(kind(e)).or_default() += 1;
        }
        let wait = now() - t0;
        assert!(wait <= WAIT_BOUND, "an operation waited {wait} clock reads");
        reach.longest = reach.longest.max(wait);
        let s = nvme.stats();
        assert_eq!(
            s.submitted,
            s.completed + s.timeouts + s.violations,
            "a command ended other than exactly once: {s:?}"
        );
    }
    let s = nvme.stats();
    let sent = m.messages();
    assert!(
        sent.iter().all(|&(a, d)| (a, d) == (MSG.address, MSG.data)),
        "a message other than the one programmed"
    );
    assert!(
        nvme.interrupts() || sent.is_empty(),
        "messages without MSI-X"
    );
    assert!(
        sent.len() as u64 <= m.counters().posted,
        "more messages than completions"
    );
    let waits = WAITS.with(Cell::get) - waits0;
    assert!(
        nvme.interrupts() || waits == 0,
        "a wait hook called while polled"
    );
    let wedged = nvme.state() == State::Wedged;
    drop(nvme);
    if m.outstanding_pages() == USER_PAGES {
        // SAFETY: the caller's block; the controller stopped (the driver returned its own).
        unsafe { m.dma_dealloc(user) };
    } else {
        assert!(
            registers || wedged,
            "the driver kept its memory from a controller that stopped"
        );
        reach.kept += 1;
    }
    let l = m.lies();
    assert!(m.violations().is_empty(), "{:?}", m.violations());
    Reach {
        submitted: s.submitted,
        completed: s.completed,
        status_errors: s.status_errors,
        timeouts: s.timeouts,
        violations: s.violations,
        resets: s.resets,
        lies: l.completions + l.identify + l.registers,
        messages: sent.len() as u64,
        waits,
        ..reach
    }
}

#[test]
fn the_hostile_controller_fuzzer() {
    let mut t = Reach::default();
    let spent = fuzz_budget::spend(
        "nvme-fuzz",
        "session",
        "nvme_fuzz.sh",
        ("NVME_FUZZ_EXECS", 20_000),
        "NVME_FUZZ_SEED",
        SESSION,
        session,
        |r| {
            t.submitted += r.submitted;
            t.completed += r.completed;
            t.status_errors += r.status_errors;
            t.timeouts += r.timeouts;
            t.violations += r.violations;
            t.resets += r.resets;
            t.up += r.up;
            t.refused += r.refused;
            t.ignored += r.ignored;
            t.verified += r.verified;
            t.kept += r.kept;
            t.direct += r.direct;
            t.lies += r.lies;
            t.longest = t.longest.max(r.longest);
            t.msix_tried += r.msix_tried;
            t.msix_on += r.msix_on;
            t.messages += r.messages;
            t.waits += r.waits;
            for (k, v) in r.errors {
                *t.errors.entry(k).or_default() += v;
            }
        },
    );
    let errors: Vec<String> = t.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!(
        "nvme-fuzz: {} executions, {} failures; commands {}, completed {}, status errors {}, \
         timeouts {}, violations {}, resets {}, bring-ups {}, refused {}, ignored namespaces {}, \
         verified reads {}, zero-copy transfers {}, kept memory {}, lies {}, longest wait {}, MSI-X on {} of {} sessions, \
         messages {}, waits {}; errors {{{}}}; seed {} ({:.1} s)",
        spent.done,
        spent.failures,
        t.submitted,
        t.completed,
        t.status_errors,
        t.timeouts,
        t.violations,
        t.resets,
        t.up,
        t.refused,
        t.ignored,
        t.verified,
        t.direct,
        t.kept,
        t.lies,
        t.longest,
        t.msix_on,
        t.msix_tried,
        t.messages,
        t.waits,
        errors.join(", "),
        spent.seed,
        spent.secs
    );
    assert_eq!(spent.failures, 0);
    assert!(t.completed > 0 && t.verified > 0 && t.timeouts > 0 && t.violations > 0);
    assert!(t.resets > 0 && t.up > 0 && t.direct > 0);
    assert!(t.msix_on > 0 && t.msix_on < t.msix_tried && t.messages > 0 && t.waits > 0);
}
