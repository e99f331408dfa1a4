//! The NVMe-oF target under a hostile host: a seeded capsule fuzzer. Host A, connected as an
//! allowed host (admin queue and two I/O queues), sends mutated command capsules on its
//! queues: Read, Write, Write Zeroes, Flush, Identify, Get Log Page, Get/Set Features, Keep
//! Alive, Property Get/Set, Connect out of sequence and unknown opcodes, with their fields,
//! SGLs (keyed to a watched region of its memory, inside and around it, with its key or
//! another; in-capsule data at offsets; descriptor lists), lengths and bytes mangled. Host C,
//! well-behaved, does verified I/O on another subsystem of the same target all along.
//!
//! The oracles, checked after each batch of capsules (1 to 4, answered or ended within a
//! bounded number of rounds):
//! - exactly one answer per capsule: the response capsules the target puts on the segment
//!   (retransmissions counted once) carry each command's ID once, or none when its queue
//!   ended (a transport error the capsule caused);
//! - the medium written only as the commands say: every write the namespace's block device
//!   saw is a Write or Write Zeroes answered with success on an I/O queue, at the command's
//!   LBA and length, with the data the command named (in the capsule, or the host's memory
//!   at its keyed SGL); every such success wrote; the medium equals a shadow copy kept so;
//! - the host's memory touched only where the commands name: in the watched region (64 KiB,
//!   registered for remote access), every byte that changed lies in a keyed descriptor with
//!   its key in one of the batch's capsules; a Read answered with success put there exactly
//!   the medium's blocks;
//! - other hosts served: host C's writes and reads are answered in time with success and
//!   its reads return what it wrote;
//! - no panic, every wait bounded.
//!
//! `a_hostile_host_cannot_make_the_target_misbehave` runs a small budget with the suite;
//! `the_capsule_fuzzer` runs `NVMF_FUZZ_CAPSULES` from `NVMF_FUZZ_SEED` in sessions of
//! [`SESSION`] capsules (fresh devices, target and hosts; seeds SEED, SEED+1, ...) and prints
//! what it reached (`tests/capsule_fuzz.sh` runs it in release).
//!
//! One file of about a thousand lines, on purpose: the mutator, the four oracles and the
//! shadow state they share (the medium's copy, the watched region, the answers seen) are one
//! machine, and split into modules each would reach into the others' state.

mod common;

#[path = "../../tests/fuzz_budget/mod.rs"]
mod fuzz_budget;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;

use bareverbs::device::rxe::wire::packet::{Frame, parse};
use bareverbs::hal::Clock;
use bareverbs::verbs::AccessFlags;
use bareverbs_model::Rng;
use bareverbs_nvmf::block::{BlockDevice, BlockError, RamDisk};
use bareverbs_nvmf::host::{Data, HostError};
use bareverbs_nvmf::target::Subsystem;
use bareverbs_nvmf::wire::fabrics::{Connect, Property};
use bareverbs_nvmf::wire::{Sgl, Sqe, Status, opcode, prop};
use common::*;

/// Capsules of one session.
const SESSION: u64 = 20_000;
/// The fuzzed namespace: 256 KiB of 512-byte blocks.
const DISK: usize = 256 * 1024;
const BS: usize = 512;
/// The watched region of host A's memory.
const WATCH: usize = 64 * 1024;
/// Rounds of 100 µs a batch may take to be answered (or its queues to end).
const ROUNDS: u32 = 3000;
const NQN2: &str = "nqn.2026-11.io.bareverbs:good";

/// The writes a block device saw: the byte offset and the bytes.
type WriteLog = Rc<RefCell<Vec<(usize, Vec<u8>)>>>;

/// A block device over shared memory that logs every write.
struct Watched {
    mem: Rc<RefCell<Vec<u8>>>,
    log: WriteLog,
}

impl BlockDevice for Watched {
    fn block_size(&self) -> u32 {
        BS as u32
    }
    fn capacity(&self) -> u64 {
        (DISK / BS) as u64
    }
    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let at = self.range(lba, buf.len())?;
        buf.copy_from_slice(&self.mem.borrow()[at..at + buf.len()]);
        Ok(())
    }
    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<(), BlockError> {
        let at = self.range(lba, buf.len())?;
        self.mem.borrow_mut()[at..at + buf.len()].copy_from_slice(buf);
        self.log.borrow_mut().push((at, buf.to_vec()));
        Ok(())
    }
    fn flush(&mut self) -> Result<(), BlockError> {
        Ok(())
    }
    fn write_zeroes(&mut self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        let len = usize::try_from(blocks.saturating_mul(BS as u64))
            .map_err(|_| BlockError::OutOfRange)?;
        let at = self.range(lba, len)?;
        self.mem.borrow_mut()[at..at + len].fill(0);
        self.log.borrow_mut().push((at, vec![0; len]));
        Ok(())
    }
}

impl Watched {
    fn range(&self, lba: u64, len: usize) -> Result<usize, BlockError> {
        if !len.is_multiple_of(BS) {
            return Err(BlockError::Misaligned);
        }
        let (at, _) =
            bareverbs_nvmf::block::byte_range(lba, (len / BS) as u64, BS as u32, self.capacity())?;
        Ok(at)
    }
}

/// What the fuzzer reached, counted from what the target answered and did.
#[derive(Clone, Debug, Default)]
struct Reach {
    capsules: u64,
    answered: u64,
    successes: u64,
    /// Answers by status (the status field without the phase bit).
    statuses: BTreeMap<u16, u64>,
    /// Capsules sent, by queue kind (admin: 0, I/O: 1) and opcode.
    opcodes: BTreeMap<(u8, u8), u64>,
    /// Host A's queues that ended (the target's disconnect or a transport error).
    disconnects: u64,
    /// Capsules left without an answer because their queue ended.
    unanswered_on_end: u64,
    /// Writes to the medium, checked against their commands.
    medium_writes: u64,
    /// Of them, those whose data was compared with the bytes the command named.
    data_checked: u64,
    /// Reads whose data in host memory was compared with the medium.
    reads_checked: u64,
    /// Bytes of the watched region the target wrote (all inside named ranges).
    host_bytes_written: u64,
    /// Host C's commands answered and checked.
    good_io: u64,
    /// Writes to the medium by commands whose queue ended before their answer.
    late_writes: u64,
    /// Times host A could not connect again at once (the target still held its last
    /// controller's queues) and waited.
    reconnect_waits: u64,
    /// Why the first try to connect again failed, by error.
    reconnect_errors: BTreeMap<String, u64>,
    /// Answers on the wire for no capsule of the batch (the host's own keep-alives).
    strays: u64,
}

impl Reach {
    fn add(&mut self, o: &Reach) {
        self.capsules += o.capsules;
        self.answered += o.answered;
        self.successes += o.successes;
        for (k, v) in &o.statuses {
            *self.statuses.entry(*k).or_default() += v;
        }
        for (k, v) in &o.opcodes {
            *self.opcodes.entry(*k).or_default() += v;
        }
        self.disconnects += o.disconnects;
        self.unanswered_on_end += o.unanswered_on_end;
        self.medium_writes += o.medium_writes;
        self.data_checked += o.data_checked;
        self.reads_checked += o.reads_checked;
        self.host_bytes_written += o.host_bytes_written;
        self.good_io += o.good_io;
        self.strays += o.strays;
        self.late_writes += o.late_writes;
        self.reconnect_waits += o.reconnect_waits;
        for (k, v) in &o.reconnect_errors {
            *self.reconnect_errors.entry(k.clone()).or_default() += v;
        }
    }
}

/// A capsule sent and what became of it.
struct Sent {
    qid: u16,
    slot: u16,
    cid: u16,
    bytes: Vec<u8>,
    answer: Option<Status>,
}

impl Sent {
    fn sqe(&self) -> Option<Sqe> {
        Sqe::parse(&self.bytes)
    }
}

/// Every keyed data block descriptor with `key` in `capsule` (the SQE's, and any 16 bytes of
/// the in-capsule data that read as one): `(address, length)`.
fn keyed_ranges(capsule: &[u8], key: u32) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = |d: &[u8]| {
        if d.len() == 16
            && d[15] >> 4 == 4
            && u32::from_le_bytes(d[11..15].try_into().unwrap()) == key
        {
            let addr = u64::from_le_bytes(d[..8].try_into().unwrap());
            let len = u64::from(u32::from_le_bytes([d[8], d[9], d[10], 0]));
            out.push((addr, len));
        }
    };
    if capsule.len() >= 40 {
        at(&capsule[24..40]);
    }
    for j in 64..capsule.len().saturating_sub(15) {
        at(&capsule[j..j + 16]);
    }
    out
}

/// Whether no capsule of `batch` but the `i`th names bytes of `[addr, addr + len)` with `key`
/// (then that range held one value all through the batch, but for the `i`th's own transfer).
fn alone(batch: &[Sent], i: usize, addr: u64, len: u64, key: u32) -> bool {
    let end = addr.wrapping_add(len);
    batch.iter().enumerate().all(|(j, y)| {
        j == i
            || keyed_ranges(&y.bytes, key)
                .iter()
                .all(|&(a, n)| a.wrapping_add(n) <= addr || a >= end)
    })
}

/// Where host A's watched region is, its key, and another key of host A's (a queue's).
#[derive(Clone, Copy)]
struct Mem {
    addr: u64,
    key: u32,
    other: Option<(u64, u32)>,
}

/// A keyed SGL into (mostly) the watched region.
fn keyed(rng: &mut Rng, m: &Mem, len: u32) -> Sgl {
    let off = match rng.below(8) {
        0 => rng.below(WATCH as u64 + 4096).wrapping_sub(2048),
        1 => (WATCH as u64).wrapping_sub(u64::from(len)) + rng.below(3),
        _ => rng.below((WATCH as u64).saturating_sub(u64::from(len)).max(1)),
    };
    let (addr, key) = match rng.below(40) {
        0 => (rng.next_u64(), rng.next_u64() as u32),
        1 => (m.addr.wrapping_add(off), rng.next_u64() as u32),
        2 => m.other.unwrap_or((m.addr, m.key)),
        _ => (m.addr.wrapping_add(off), m.key),
    };
    let len = match rng.below(12) {
        0 => rng.below(1 << 24) as u32,
        1 => len
            .saturating_add(rng.below(1024) as u32)
            .saturating_sub(512),
        2 => 0,
        _ => len,
    };
    Sgl::Keyed {
        addr,
        len,
        key,
        invalidate: rng.below(16) == 0,
    }
}

/// A command capsule for queue `qid` (at most `room` bytes): a valid command of a random
/// kind, then its fields and bytes mangled now and then. The command ID is set by the caller.
fn capsule(rng: &mut Rng, qid: u16, room: usize, m: &Mem) -> Vec<u8> {
    let blocks = (DISK / BS) as u64;
    let mut data: Vec<u8> = Vec::new();
    let mut s = if qid == 0 {
        match rng.below(10) {
            0..=2 => {
                let mut s = Sqe::new(opcode::IDENTIFY, 0);
                s.set_nsid([0, 1, 2, 0xFFFF_FFFF][rng.below(4) as usize]);
                s.set_cdw(
                    10,
                    [0, 1, 2, 3, rng.below(256) as u32][rng.below(5) as usize],
                );
                s.set_sgl(&keyed(rng, m, 4096));
                s
            }
            3..=4 => {
                let mut s = Sqe::new(opcode::GET_LOG_PAGE, 0);
                let len = [512u32, 64, 4, 4096][rng.below(4) as usize];
                let lid = [1u32, 2, 3, 0x70, rng.below(256) as u32][rng.below(5) as usize];
                s.set_cdw(10, lid | ((len / 4 - 1) << 16));
                s.set_cdw(
                    12,
                    [0, 64, 512, rng.next_u64() as u32][rng.below(4) as usize],
                );
                s.set_sgl(&keyed(rng, m, len));
                s
            }
            5 => {
                let op = [opcode::GET_FEATURES, opcode::SET_FEATURES][rng.below(2) as usize];
                let mut s = Sqe::new(op, 0);
                s.set_cdw(
                    10,
                    [7u32, 0xF, 0xB, rng.below(256) as u32][rng.below(4) as usize],
                );
                s.set_cdw(11, rng.next_u64() as u32);
                s
            }
            6 => Sqe::new(opcode::KEEP_ALIVE, 0),
            7 => {
                let offset =
                    [prop::CAP, prop::VS, prop::CC, prop::CSTS, 0x40][rng.below(5) as usize];
                // A Property Set only rarely (CC resets or shuts the controller down).
                let set = rng.below(8) == 0;
                Property {
                    size8: rng.below(2) == 0,
                    offset,
                    value: rng.next_u64(),
                }
                .to_sqe(0, set)
            }
            8 => {
                // A Connect on a connected queue, its data anywhere.
                let mut s = Connect {
                    recfmt: 0,
                    qid: rng.below(4) as u16,
                    sqsize: rng.below(64) as u16,
                    cattr: 0,
                    kato_ms: rng.next_u64() as u32,
                }
                .to_sqe(0);
                s.set_sgl(&keyed(rng, m, 1024));
                s
            }
            _ => {
                let mut s = Sqe::new(rng.next_u64() as u8, 0);
                let len = rng.below(8192) as u32;
                s.set_sgl(&keyed(rng, m, len));
                s
            }
        }
    } else {
        let slba = match rng.below(8) {
            0 => blocks - rng.below(40),
            1 => rng.next_u64() >> rng.below(64),
            _ => rng.below(blocks),
        };
        let nlb = match rng.below(8) {
            0 => 1 + rng.below(65536) as u32,
            _ => 1 + rng.below(32) as u32,
        };
        let nsid = match rng.below(16) {
            0 => 0,
            1 => 2,
            2 => 0xFFFF_FFFF,
            _ => 1,
        };
        let op = [
            opcode::READ,
            opcode::READ,
            opcode::WRITE,
            opcode::WRITE,
            opcode::WRITE_ZEROES,
            opcode::FLUSH,
            rng.next_u64() as u8,
        ][rng.below(7) as usize];
        let mut s = Sqe::rw(op, 0, nsid, slba, nlb);
        let len = nlb.saturating_mul(BS as u32);
        let sgl = match (op, rng.below(8)) {
            (opcode::WRITE, 0..=2) => {
                // In-capsule data, at an offset now and then.
                let off = if rng.below(4) == 0 { rng.below(64) } else { 0 };
                let n = (len as usize).min(room.saturating_sub(64 + off as usize));
                data = vec![0; off as usize];
                data.extend((0..n).map(|_| rng.next_u64() as u8));
                Sgl::InCapsule {
                    offset: off,
                    len: if rng.below(8) == 0 {
                        rng.below(8192) as u32
                    } else {
                        n as u32
                    },
                }
            }
            (_, 3) => {
                // A descriptor list in the capsule.
                let k = 1 + rng.below(3) as u32;
                for _ in 0..k {
                    data.extend_from_slice(&keyed(rng, m, len / k).to_bytes());
                }
                Sgl::LastSegment {
                    offset: 0,
                    len: if rng.below(8) == 0 {
                        rng.below(128) as u32
                    } else {
                        16 * k
                    },
                }
            }
            (_, 4) if rng.below(4) == 0 => Sgl::Null,
            _ => keyed(rng, m, len),
        };
        s.set_sgl(&sgl);
        s
    };
    // The bytes mangled now and then (not the command ID, which the caller sets).
    if rng.below(3) == 0 {
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(64) as usize;
            if !(2..4).contains(&at) {
                s.0[at] = rng.next_u64() as u8;
            }
        }
    }
    let mut c = s.0.to_vec();
    c.extend_from_slice(&data);
    if rng.below(4) == 0 {
        c.extend((0..rng.below(256)).map(|_| rng.next_u64() as u8));
    }
    // Cut short now and then (shorter than an SQE, even than its command ID).
    if rng.below(32) == 0 {
        c.truncate(rng.below(64) as usize);
    }
    c.truncate(room);
    c
}

/// The response capsules on the segment since `seen` from the target (station 1) to host A:
/// each command ID, a retransmission (the same QP and PSN) once.
fn answers(
    seg: &bareverbs_model::link::Segment,
    seen: &mut usize,
    psns: &mut HashSet<(u32, u32)>,
) -> Vec<u16> {
    let fresh = seg.sent_since(*seen);
    *seen += fresh.len();
    let mut out = Vec::new();
    for (from, f) in fresh {
        if from != 1 {
            continue;
        }
        let Ok(Frame::Roce(p)) = parse(&f) else {
            continue;
        };
        // SEND Only, with immediate, with invalidate: a whole response capsule.
        if p.ip.dst != IP_A || !matches!(p.headers.bth.opcode, 0x04 | 0x05 | 0x17) {
            continue;
        }
        if p.payload.len() != 16 || !psns.insert((p.headers.bth.dest_qp, p.headers.bth.psn)) {
            continue;
        }
        out.push(u16::from_le_bytes([p.payload[12], p.payload[13]]));
    }
    out
}

#[test]
fn a_hostile_host_cannot_make_the_target_misbehave() {
    let mut reach = Reach::default();
    // Small: the suite runs under memcheck too.
    for seed in [1u64, 20261125] {
        reach.add(&session(seed, 400));
    }
    assert!(
        reach.successes > 0 && reach.answered > reach.successes,
        "{reach:?}"
    );
    assert!(
        reach.medium_writes > 0 && reach.reads_checked > 0,
        "{reach:?}"
    );
    assert!(reach.disconnects > 0 && reach.good_io > 0, "{reach:?}");
}

/// The fuzzer: `NVMF_FUZZ_CAPSULES` capsules (default 300) from `NVMF_FUZZ_SEED` (default
/// 1), in sessions of [`SESSION`]; each failed session prints the seed that replays it.
#[test]
fn the_capsule_fuzzer() {
    let mut reach = Reach::default();
    let spent = fuzz_budget::spend(
        "nvmf-fuzz",
        "session",
        "capsule_fuzz.sh",
        ("NVMF_FUZZ_CAPSULES", 300),
        "NVMF_FUZZ_SEED",
        SESSION,
        session,
        |r| reach.add(&r),
    );
    let fuzz_budget::Spent {
        seed,
        done,
        failures,
        secs,
    } = spent;
    let ops: Vec<String> = reach
        .opcodes
        .iter()
        .filter(|(_, n)| **n * 200 >= reach.capsules)
        .map(|((q, op), n)| format!("{}{op:02x}:{n}", ["admin ", "io "][usize::from(*q)]))
        .collect();
    let errs: Vec<String> = reach
        .statuses
        .iter()
        .filter(|(s, _)| **s != 0)
        .map(|(s, n)| format!("{s:#06x}:{n}"))
        .collect();
    eprintln!(
        "nvmf-fuzz: {:.0} capsules/s ({done} capsules in {secs:.1} s)",
        done as f64 / secs.max(1e-9)
    );
    eprintln!(
        "nvmf-fuzz: commands by opcode (those of 0.5 % or more): {}",
        ops.join(" ")
    );
    eprintln!("nvmf-fuzz: error statuses: {}", errs.join(" "));
    eprintln!(
        "nvmf-fuzz: medium writes checked {} (data compared {}), reads compared {}, host bytes \
         written (inside named ranges) {}, capsules left unanswered by an ended queue {} (their \
         writes that ran {}), stray answers {}, waits to connect again {}",
        reach.medium_writes,
        reach.data_checked,
        reach.reads_checked,
        reach.host_bytes_written,
        reach.unanswered_on_end,
        reach.late_writes,
        reach.strays,
        reach.reconnect_waits
    );
    eprintln!(
        "nvmf-fuzz: first tries to connect again that failed, by error: {:?}",
        reach.reconnect_errors
    );
    println!(
        "nvmf-fuzz: {} capsules, {failures} failures; answered {}, successes {}, error statuses \
         {}, disconnects {}, good-host I/O {}, seed {seed}",
        reach.capsules,
        reach.answered,
        reach.successes,
        reach.answered - reach.successes,
        reach.disconnects,
        reach.good_io
    );
    assert_eq!(failures, 0, "nvmf-fuzz: {failures} sessions failed");
}

fn session(seed: u64, capsules: u64) -> Reach {
    let l = lab();
    let (sa, sb, sc) = (side(&l.a), side(&l.b), side(&l.c));
    let (mut cma, mut cmb, mut cmc) = (cm(&sa, &l.clk), target_cm(&sb, &l.clk), cm(&sc, &l.clk));
    let mem = Rc::new(RefCell::new(vec![0u8; DISK]));
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut d1 = Watched {
        mem: mem.clone(),
        log: log.clone(),
    };
    let mut m2 = vec![0u8; 1 << 18];
    let mut d2 = RamDisk::new(&mut m2, 512);
    let mut n1: [&mut dyn BlockDevice; 1] = [&mut d1];
    let mut n2: [&mut dyn BlockDevice; 1] = [&mut d2];
    let allowed = [HOST_C];
    let mut subs = [
        Subsystem::new(NQN, &mut n1),
        Subsystem {
            nqn: NQN2,
            serial: "good",
            allowed_hosts: &allowed,
            namespaces: &mut n2,
            multipath: Default::default(),
        },
    ];
    let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
    let clk = l.clk.clone();
    let mut ca = hcfg(HOST_A);
    ca.kato_ms = 10_000;
    let mut ha: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), ca);
    let mut cc = hcfg(HOST_C);
    (cc.subnqn, cc.io_queues, cc.kato_ms) = (NQN2, 1, 10_000);
    let mut hc: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), cc);
    ha.connect(&mut cma, &mut || {
        clk.advance(20);
        t.poll(&mut cmb);
    })
    .unwrap();
    hc.connect(&mut cmc, &mut || {
        clk.advance(20);
        t.poll(&mut cmb);
    })
    .unwrap();
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let mut watch = sa.pd.register(WATCH, all).unwrap();
    let mut rng = Rng::new(seed);
    for b in watch.as_mut_slice() {
        *b = rng.next_u64() as u8;
    }
    let mut reach = Reach::default();
    let mut shadow = vec![0u8; DISK];
    let (mut seen, mut psns) = (l.seg.sent_since(0).len(), HashSet::new());
    let mut cid: u16 = 0;
    let mut last_cids: HashSet<u16> = HashSet::new();
    // Host C: a 4 KiB write of a pattern, then its read back, at LBAs of its own.
    let mut good: Option<(u16, bool, u64, u64)> = None; // (slot, read?, lba, since)
    let mut good_data: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut good_k = 0u64;

    let mut sent_total = 0u64;
    let mut prev = Vec::new();
    let mut limbo: std::collections::VecDeque<Sent> = std::collections::VecDeque::new();
    while sent_total < capsules {
        // Host A's queues up again where the target ended them.
        if !ha.connected(0) || !ha.connected(1) || !ha.connected(2) {
            let ok = {
                let mut idle = || {
                    clk.advance(20);
                    t.poll(&mut cmb);
                };
                if ha.connected(0) {
                    (1..3)
                        .all(|q| ha.connected(q) || ha.reconnect_io(&mut cma, q, &mut idle).is_ok())
                } else {
                    false
                }
            };
            if !ok {
                let _ = ha.disconnect(&mut cma, &mut || {
                    clk.advance(20);
                    t.poll(&mut cmb);
                });
                // Bounded: tries 1 s apart for up to 40 s, host C served meanwhile, the
                // target given time to free what it held (a controller whose queues ended
                // without a disconnection goes at its keep-alive timeout, 10 s here).
                let mut err = None;
                for k in 0..40 {
                    let r = ha.connect(&mut cma, &mut || {
                        clk.advance(20);
                        t.poll(&mut cmb);
                    });
                    match r {
                        Ok(()) => {
                            err = None;
                            break;
                        }
                        Err(e) => err = Some(e),
                    }
                    if k == 0 {
                        reach.reconnect_waits += 1;
                        let e = format!("{:?}", err.as_ref().unwrap());
                        *reach.reconnect_errors.entry(e).or_default() += 1;
                    }
                    for _ in 0..1000 {
                        clk.advance(1000);
                        t.poll(&mut cmb);
                        ha.poll();
                        while let Some(e) = cma.poll() {
                            ha.on_cm_event(e);
                        }
                        hc.poll();
                        while let Some(e) = cmc.poll() {
                            hc.on_cm_event(e);
                        }
                    }
                }
                assert!(
                    err.is_none(),
                    "seed {seed}: host A cannot connect again: {err:?}"
                );
            }
            // What the reconnection put on the wire is not the batch's; the new queues' QPs
            // may take the numbers (and PSNs) of those that ended.
            answers(&l.seg, &mut seen, &mut psns);
            psns.clear();
        }
        let m = Mem {
            addr: watch.addr(),
            key: watch.rkey(),
            other: ha.data_key(1, 0),
        };
        let before = watch.as_slice().to_vec();
        // The batch.
        let mut batch: Vec<Sent> = Vec::new();
        let mut short = false;
        for _ in 0..(1 + rng.below(4)).min(capsules - sent_total) {
            let qid = rng.below(3) as u16;
            let room = if qid == 0 { 64 } else { 64 + 4096 };
            let mut c = capsule(&mut rng, qid, room, &m);
            // An Asynchronous Event Request is held until an event: not one of the fuzzer's.
            if qid == 0 && c.first() == Some(&opcode::ASYNC_EVENT) {
                c[0] = opcode::ABORT;
            }
            cid = cid.wrapping_add(1).max(1);
            let want = if c.len() >= 4 {
                c[2..4].copy_from_slice(&cid.to_le_bytes());
                cid
            } else {
                // Too short to carry its ID: answered with 0, one such in a batch.
                if short {
                    continue;
                }
                short = true;
                0
            };
            match ha.submit_raw(qid, &c, want) {
                Ok(slot) => {
                    let op = c.first().copied().unwrap_or(0);
                    *reach.opcodes.entry((u8::from(qid != 0), op)).or_default() += 1;
                    reach.capsules += 1;
                    sent_total += 1;
                    batch.push(Sent {
                        qid,
                        slot,
                        cid: want,
                        bytes: c,
                        answer: None,
                    });
                }
                Err(HostError::Busy | HostError::NotConnected) => {}
                Err(e) => panic!("seed {seed}: submit: {e:?}"),
            }
        }
        // Host C's next command, when its last was answered.
        if good.is_none() {
            let lba = (good_k % 32) * 8;
            let read = good_data.contains_key(&lba) && good_k % 2 == 1;
            let s = if read {
                hc.submit(1, Sqe::rw(opcode::READ, 0, 1, lba, 8), Data::In(4096))
            } else {
                let d = pattern(4096, (seed as u32) ^ (good_k as u32));
                let s = hc.submit(1, Sqe::rw(opcode::WRITE, 0, 1, lba, 8), Data::Out(&d));
                good_data.insert(lba, d);
                s
            };
            let s = s.unwrap_or_else(|e| panic!("seed {seed}: host C submit: {e:?}"));
            good = Some((s, read, lba, clk.now_us()));
            good_k += 1;
        }
        // Bounded: ROUNDS rounds of 100 µs, then every capsule is answered or its queue ended.
        let mut counts: HashMap<u16, u32> = HashMap::new();
        for _ in 0..ROUNDS {
            clk.advance(100);
            t.poll(&mut cmb);
            ha.poll();
            while let Some(e) = cma.poll() {
                ha.on_cm_event(e);
            }
            hc.poll();
            while let Some(e) = cmc.poll() {
                hc.on_cm_event(e);
            }
            for x in batch.iter_mut().filter(|x| x.answer.is_none()) {
                if let Some((cqe, _)) = ha.take(x.qid, x.slot) {
                    x.answer = Some(cqe.status);
                }
            }
            if let Some((s, read, lba, since)) = good {
                if let Some((cqe, data)) = hc.take(1, s) {
                    assert!(
                        cqe.status.is_ok(),
                        "seed {seed}: host C's command failed: {:?}",
                        cqe.status
                    );
                    if read {
                        assert!(
                            data == good_data[&lba].as_slice(),
                            "seed {seed}: host C read back other data at LBA {lba}"
                        );
                    }
                    reach.good_io += 1;
                    good = None;
                } else {
                    assert!(
                        hc.connected(1) && hc.connected(0),
                        "seed {seed}: host C lost"
                    );
                    assert!(
                        clk.now_us() - since < 2_000_000,
                        "seed {seed}: host C's command unanswered for 2 s"
                    );
                }
            }
            if batch
                .iter()
                .all(|x| x.answer.is_some() || !ha.connected(x.qid))
            {
                break;
            }
        }
        // Exactly one answer per capsule.
        for c in answers(&l.seg, &mut seen, &mut psns) {
            *counts.entry(c).or_default() += 1;
        }
        let ids: HashSet<u16> = batch.iter().map(|x| x.cid).collect();
        for (c, n) in &counts {
            if !ids.contains(c) {
                assert!(
                    !last_cids.contains(c),
                    "seed {seed}: command {c:#x} of the last batch answered again"
                );
                reach.strays += u64::from(*n);
            }
        }
        for x in &batch {
            let n = counts.get(&x.cid).copied().unwrap_or(0);
            let ended = !ha.connected(x.qid);
            assert!(
                n == 1 || (n == 0 && ended),
                "seed {seed}: command {:#x} on queue {} answered {n} times on the wire, {:?} to \
                 the host ({:?})",
                x.cid,
                x.qid,
                x.answer,
                x.sqe().map(|s| s.0)
            );
            assert!(
                x.answer.is_some() || ended,
                "seed {seed}: command {:#x} unanswered in {ROUNDS} rounds",
                x.cid
            );
            match x.answer {
                Some(st) => {
                    reach.answered += 1;
                    reach.successes += u64::from(st.is_ok());
                    *reach.statuses.entry(st.0).or_default() += 1;
                }
                None => reach.unanswered_on_end += 1,
            }
        }
        last_cids = ids;
        let prev_now: Vec<_> = batch
            .iter()
            .map(|x| {
                let s = x.sqe().unwrap_or_default();
                (
                    x.qid,
                    s.opcode(),
                    s.nsid(),
                    s.slba(),
                    s.nlb(),
                    x.answer,
                    s.sgl(),
                    x.bytes.len(),
                )
            })
            .collect();
        for q in 0..3 {
            if !ha.connected(q) {
                reach.disconnects += 1;
            }
        }
        // The medium written only as the commands said.
        let after = watch.as_slice().to_vec();
        let writes = std::mem::take(&mut *log.borrow_mut());
        // A command whose queue ended before its answer may still have run (the target
        // learns of the end later): it may have written, now or in a later batch, once.
        for x in batch.iter().filter(|x| x.answer.is_none()) {
            limbo.push_back(Sent {
                qid: x.qid,
                slot: x.slot,
                cid: x.cid,
                bytes: x.bytes.clone(),
                answer: None,
            });
        }
        while limbo.len() > 64 {
            limbo.pop_front();
        }
        let names = |x: &Sent, at: usize, len: usize| {
            x.sqe().is_some_and(|s| {
                let op = s.opcode();
                x.qid != 0
                    && (op == opcode::WRITE || op == opcode::WRITE_ZEROES)
                    && s.nsid() == 1
                    && s.slba().checked_mul(BS as u64) == Some(at as u64)
                    && u64::from(s.nlb()) * BS as u64 == len as u64
            })
        };
        // Whether the bytes `x` names are `bytes`: `Some(true)`, `Some(false)`, or `None`
        // when that cannot be told (a descriptor list, a key of another region, bytes
        // another capsule named too; for a command of an earlier batch, host memory that
        // differs: it may have changed since).
        let verdict = |x: &Sent, i: Option<usize>, bytes: &[u8]| -> Option<bool> {
            let s = x.sqe()?;
            if s.opcode() == opcode::WRITE_ZEROES {
                return Some(bytes.iter().all(|&b| b == 0));
            }
            match s.sgl() {
                Ok(Sgl::InCapsule { offset, len }) if len as usize == bytes.len() => {
                    let from = usize::try_from(offset)
                        .unwrap_or(usize::MAX)
                        .saturating_add(64);
                    Some(x.bytes.get(from..from.saturating_add(bytes.len())) == Some(bytes))
                }
                Ok(Sgl::Keyed { addr, len, key, .. })
                    if key == m.key
                        && len as usize == bytes.len()
                        && i.is_none_or(|i| alone(&batch, i, addr, u64::from(len), m.key)) =>
                {
                    let o = addr.wrapping_sub(m.addr) as usize;
                    let r = o..o.saturating_add(bytes.len());
                    let same = before.get(r.clone()) == Some(bytes) || after.get(r) == Some(bytes);
                    (same || i.is_some()).then_some(same)
                }
                _ => None,
            }
        };
        let mut used = vec![false; batch.len()];
        for (at, bytes) in &writes {
            // The commands that name these blocks: this batch's answered with success, and
            // those of ended queues.
            let mut cands: Vec<(Option<usize>, Option<usize>, Option<bool>)> = Vec::new();
            for (i, x) in batch.iter().enumerate() {
                if !used[i] && x.answer.is_some_and(|a| a.is_ok()) && names(x, *at, bytes.len()) {
                    cands.push((Some(i), None, verdict(x, Some(i), bytes)));
                }
            }
            for (k, x) in limbo.iter().enumerate() {
                if names(x, *at, bytes.len()) {
                    cands.push((None, Some(k), verdict(x, None, bytes)));
                }
            }
            // This batch's first (each of them wrote, for it was answered with success),
            // those whose data it is before those whose data cannot be told.
            let rank = |c: &(Option<usize>, Option<usize>, Option<bool>)| match c {
                (Some(_), _, Some(true)) => Some(0),
                (Some(_), _, None) => Some(1),
                (None, _, Some(true)) => Some(2),
                (None, _, None) => Some(3),
                _ => None,
            };
            let pick = cands
                .iter()
                .filter_map(|c| rank(c).map(|r| (r, *c)))
                .min_by_key(|(r, _)| *r)
                .map(|(_, c)| c);
            let Some((i, k, v)) = pick else {
                let what: Vec<_> = batch
                    .iter()
                    .map(|x| {
                        let s = x.sqe().unwrap_or_default();
                        (
                            x.qid,
                            s.opcode(),
                            s.nsid(),
                            s.slba(),
                            s.nlb(),
                            x.answer,
                            s.sgl(),
                        )
                    })
                    .collect();
                panic!(
                    "seed {seed}: the medium written at byte {at} ({} bytes) by no command of \
                     {what:?} as it said ({} named the blocks; queues {:?}), last batch {prev:?}",
                    bytes.len(),
                    cands.len(),
                    (0..3).map(|q| ha.connected(q)).collect::<Vec<_>>()
                );
            };
            reach.medium_writes += 1;
            reach.data_checked += u64::from(v.is_some());
            if let Some(i) = i {
                used[i] = true;
            }
            if let Some(k) = k {
                limbo.remove(k);
                reach.late_writes += 1;
            }
            shadow[*at..*at + bytes.len()].copy_from_slice(bytes);
        }
        for (i, x) in batch.iter().enumerate() {
            let Some(s) = x.sqe() else { continue };
            let op = s.opcode();
            if x.qid != 0
                && (op == opcode::WRITE || op == opcode::WRITE_ZEROES)
                && x.answer.is_some_and(|a| a.is_ok())
            {
                assert!(
                    used[i],
                    "seed {seed}: a Write answered with success wrote nothing: {:?}, writes {:?}",
                    (
                        x.qid,
                        s.opcode(),
                        s.nsid(),
                        s.slba(),
                        s.nlb(),
                        s.sgl(),
                        x.bytes.len()
                    ),
                    writes
                        .iter()
                        .map(|(a, b)| (a / BS, b.len() / BS))
                        .collect::<Vec<_>>()
                );
            }
        }
        prev = prev_now;
        if *mem.borrow() != shadow {
            let i = mem
                .borrow()
                .iter()
                .zip(&shadow)
                .position(|(a, b)| a != b)
                .unwrap();
            panic!(
                "seed {seed}: the medium differs from its shadow at byte {i} (writes {:?})",
                writes.iter().map(|(a, b)| (a, b.len())).collect::<Vec<_>>()
            );
        }
        // Host memory touched only where the commands named it.
        let named: Vec<(u64, u64)> = batch
            .iter()
            .flat_map(|x| keyed_ranges(&x.bytes, m.key))
            .collect();
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            if b != a {
                let va = m.addr + i as u64;
                assert!(
                    named.iter().any(|&(s, n)| va >= s && va - s < n),
                    "seed {seed}: host memory at +{i} written, no command named it"
                );
                reach.host_bytes_written += 1;
            }
        }
        // A Read answered with success put the medium's blocks where it said (when no other
        // command of the batch named those bytes, and nothing wrote the medium).
        if writes.is_empty() {
            for (i, x) in batch.iter().enumerate() {
                let Some(s) = x.sqe() else { continue };
                if x.qid == 0 || s.opcode() != opcode::READ || !x.answer.is_some_and(|a| a.is_ok())
                {
                    continue;
                }
                let Ok(Sgl::Keyed { addr, len, key, .. }) = s.sgl() else {
                    continue;
                };
                let len = u64::from(len);
                if key != m.key || s.nsid() != 1 || !alone(&batch, i, addr, len, m.key) {
                    continue;
                }
                let o = addr.wrapping_sub(m.addr) as usize;
                let from = (s.slba() as usize).saturating_mul(BS);
                let len = len as usize;
                assert!(
                    after.get(o..o.saturating_add(len))
                        == shadow.get(from..from.saturating_add(len)),
                    "seed {seed}: a Read put other data in host memory (LBA {}, {len} bytes \
                     at +{o})",
                    s.slba()
                );
                reach.reads_checked += 1;
            }
        }
    }
    // Host C is still served, and both hosts leave.
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    let d = pattern(4096, 77);
    hc.write(1, 1, 0, 8, &d, &mut idle).unwrap();
    let mut back = vec![0u8; 4096];
    hc.read(1, 1, 0, 8, &mut back, &mut idle).unwrap();
    assert_eq!(back, d, "seed {seed}: host C at the end");
    let _ = ha.disconnect(&mut cma, &mut idle);
    hc.disconnect(&mut cmc, &mut idle).unwrap();
    drop(t);
    reach
}
