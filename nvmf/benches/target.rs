//! The NVMe/RDMA target's instructions per I/O, for instruction counting (`tests/nvmf_bench.sh`,
//! which `tests/bench.sh` runs, counts this under `valgrind --tool=callgrind`).
//!
//! A bareverbs-nvmf host on software RoCE device A and the target on device B, on an in-memory
//! wire that builds each frame in place and copies it once out (as the virtio-net link, and
//! the wire of `tests/bench/wire.rs`, which the rxe bench shares). The target is the appliance's (`appliance/src/nvmf_app.rs`): 14 queues of at most 64 commands, 2 I/O queues a controller, I/O depth 64, a
//! CM of 28 entries, a RAM disk of 512-byte blocks, the configuration's other defaults
//! (4 KiB in-capsule data, 128 KiB transfers, 32 data buffers a queue). The host connects an
//! admin queue and two I/O queues, as Linux's host of the lab does, and drives queue 1.
//!
//! The target runs in the appliance's loop shape: `poll`, then `counts` (the appliance reads
//! them every round), again while the poll found work; the round that finds none is the idle
//! poll after which the appliance halts until a frame comes. Then the host runs (its device
//! takes the target's frames and answers), takes its completions and submits as many commands
//! again, and the time moves 10 µs. Every call of the target's round goes through
//! [`bench_target`]; callgrind counts only inside it (`--toggle-collect=bench_target`), so the
//! count is the target's work and its device's (the frames received, the transport, the
//! frames sent, each one's copy onto the wire), and nothing of the host's or of the harness.
//!
//!   target <scenario>   a warm-up of `QD` commands (uncounted), then the counted I/Os;
//!                       prints `<scenario> ios N rounds M idle K` (rounds: the target's polls
//!                       in the count; idle: those that found no work)
//!   target all          every scenario (a self-check; also what `cargo bench` runs)
//!
//! Scenarios (and `idle`: 4096 polls that find nothing, the host's three queues connected): `randread-4k` (2048 random 4 KiB reads at depth 32), `randwrite-4k` (2048
//! random 4 KiB writes at depth 32, in the capsule as Linux's host sends them), `seqread-128k`
//! (256 sequential 128 KiB reads at depth 8). Every command is checked outside the count: a
//! success status, a read's bytes against the disk's, and the disk at the end against every
//! write.

use std::hint::black_box;

use bareverbs::Context;
use bareverbs::cm::{Cm, CmConfig, Service};
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs_model::link::TestClock;
use bareverbs_model::{Model, ModelConfig};
use bareverbs_nvmf::block::{BlockDevice, RamDisk};
use bareverbs_nvmf::host::{Data, Host, HostConfig};
use bareverbs_nvmf::target::{Subsystem, Target, TargetConfig};
use bareverbs_nvmf::wire::{Sqe, opcode};

#[path = "../../tests/bench/wire.rs"]
mod wire;
use wire::{Wire, wire};

/// The appliance's queue table, queue depth, I/O queues a controller and CM entries.
const QUEUES: usize = 14;
const DEPTH: usize = 64;
const IO_QUEUES: u16 = 2;
const CONNS: usize = 2 * QUEUES;
/// The RAM disk (512-byte blocks).
const DISK: usize = 16 << 20;
/// Microseconds the clock moves per host round.
const STEP_US: u64 = 10;
/// Frames one direction of the wire holds.
const SLOTS: usize = 512;

const IP_A: [u8; 4] = [10, 0, 0, 2];
const IP_B: [u8; 4] = [10, 0, 0, 3];
const NQN: &str = "nqn.2026-11.io.bareverbs:ram";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:62617265-7665-7262-732d-6e766d660000";

type R = Rxe<Model, Wire<SLOTS>, TestClock>;

// ---- The measured function. ----

/// Runs `f`, the target's round. Counted with `--toggle-collect=bench_target`.
#[unsafe(no_mangle)]
#[inline(never)]
pub fn bench_target(f: &mut dyn FnMut()) {
    black_box(0u8);
    f();
}

/// Runs `f` uncounted (the warm-up and the connection).
#[inline(never)]
fn uncounted(f: &mut dyn FnMut()) {
    black_box(1u8);
    f();
}

// ---- The scenarios. ----

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    RandRead,
    RandWrite,
    SeqRead,
    /// No I/O: the target's idle polls with the host's three queues connected.
    Idle,
}

struct Scenario {
    name: &'static str,
    kind: Kind,
    /// Bytes per command.
    len: usize,
    depth: u16,
    /// Commands counted.
    ios: u64,
}

const SCENARIOS: [Scenario; 4] = [
    Scenario {
        name: "randread-4k",
        kind: Kind::RandRead,
        len: 4096,
        depth: 32,
        ios: 2048,
    },
    Scenario {
        name: "randwrite-4k",
        kind: Kind::RandWrite,
        len: 4096,
        depth: 32,
        ios: 2048,
    },
    Scenario {
        name: "seqread-128k",
        kind: Kind::SeqRead,
        len: 128 * 1024,
        depth: 8,
        ios: 256,
    },
    Scenario {
        name: "idle",
        kind: Kind::Idle,
        len: 4096,
        depth: 1,
        ios: 0,
    },
];

/// Idle polls counted in the `idle` scenario.
const IDLE_POLLS: u64 = 4096;

/// The byte at offset `i` of the disk as first written, and of block run `b`'s `version`th write.
fn byte(i: usize, version: u32) -> u8 {
    ((i as u32)
        .wrapping_mul(2654435761)
        .wrapping_add(version.wrapping_mul(40503))
        >> 13) as u8
}

/// What one scenario counted.
struct Ran {
    ios: u64,
    rounds: u64,
    idle: u64,
}

fn run(s: &Scenario) -> Ran {
    let model = Model::new(ModelConfig::default());
    let clk = TestClock::default();
    let (la, lb, _) = wire::<SLOTS>();
    model.set_seed(7);
    let a = Context::new(Rxe::new(model.clone(), la, clk.clone(), Config { ip: IP_A }).unwrap());
    model.set_seed(8);
    let b = Context::new(Rxe::new(model.clone(), lb, clk.clone(), Config { ip: IP_B }).unwrap());
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ma, mb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let da = a.create_cq(3 * 2 * 32 + 8).unwrap();
    let db = b.create_cq((QUEUES * 4 * DEPTH) as u32).unwrap();
    let mut cma: Cm<'_, R, TestClock, 8> =
        Cm::new(&pa, &ma, clk.clone(), CmConfig::default()).unwrap();
    let mut cmb: Cm<'_, R, TestClock, CONNS> =
        Cm::new(&pb, &mb, clk.clone(), CmConfig::default()).unwrap();
    cmb.listen(None, 4420, Service::Rc).unwrap();

    // The disk's first contents, and what every write leaves (checked at the end).
    let mut shadow: Vec<u8> = (0..DISK).map(|i| byte(i, 0)).collect();
    let mut mem = shadow.clone();
    let ran;
    {
        let mut disk = RamDisk::new(&mut mem, 512);
        let mut nss: [&mut dyn BlockDevice; 1] = [&mut disk];
        let mut subs = [Subsystem::new(NQN, &mut nss)];
        let cfg = TargetConfig {
            io_depth: DEPTH as u16,
            max_io_queues: IO_QUEUES,
            ..TargetConfig::default()
        };
        let mut t: Target<'_, '_, R, TestClock, QUEUES, DEPTH> =
            Target::new(&pb, &db, clk.clone(), IP_B, cfg, &mut subs).unwrap();
        let hc = HostConfig {
            addr: IP_B,
            subnqn: NQN,
            hostnqn: HOSTNQN,
            io_queues: 2,
            io_depth: 32,
            kato_ms: 0,
            max_transfer: 128 * 1024,
            timeout_ms: 30_000,
            ..HostConfig::default()
        };
        let mut h: Host<'_, '_, R, TestClock, 3, 32> = Host::new(&pa, &da, clk.clone(), hc);
        {
            let clk = clk.clone();
            let t = &mut t;
            let cmb = &mut cmb;
            let mut idle = || {
                clk.advance(20);
                uncounted(&mut || {
                    t.poll(cmb);
                });
            };
            h.connect(&mut cma, &mut idle).unwrap();
        }
        assert_eq!(h.io_queues(), 2, "{}: I/O queues granted", s.name);
        if s.kind == Kind::Idle {
            // Settled first (the connection's last frames answered), then counted.
            for _ in 0..100 {
                clk.advance(STEP_US);
                uncounted(&mut || {
                    t.poll(&mut cmb);
                });
                h.poll();
            }
            let mut idle = 0;
            for _ in 0..IDLE_POLLS {
                clk.advance(STEP_US);
                let mut work = 0;
                bench_target(&mut || {
                    work = t.poll(&mut cmb);
                    black_box(t.counts());
                });
                assert_eq!(work, 0, "idle: the target found work");
                idle += 1;
            }
            return Ran {
                ios: 0,
                rounds: idle,
                idle,
            };
        }

        let blocks = (DISK / s.len) as u64;
        let per = (s.len / 512) as u64;
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut seq = 0u64;
        let mut version = 0u32;
        // Per host slot: the command's first byte offset on the disk and its write generation.
        let mut slots: Vec<Option<(usize, u32)>> = vec![None; usize::from(s.depth)];
        let mut data = vec![0u8; s.len];
        let (mut submitted, mut done) = (0u64, 0u64);
        let total = u64::from(s.depth) + s.ios;
        let mut counted = Ran {
            ios: 0,
            rounds: 0,
            idle: 0,
        };
        let mut guard = 0u64;
        while done < total {
            guard += 1;
            assert!(guard < 50 * total + 10_000, "{}: stalled at {done}", s.name);
            // The host submits as many commands as it has room for (up to the scenario's
            // total).
            while submitted < total
                && slots.iter().filter(|x| x.is_some()).count() < usize::from(s.depth)
            {
                let block = match s.kind {
                    Kind::SeqRead => {
                        seq += 1;
                        (seq - 1) % blocks
                    }
                    _ => loop {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let b = rng % blocks;
                        // Never two writes of one block in flight (their order is the wire's).
                        if !slots
                            .iter()
                            .flatten()
                            .any(|&(at, _)| at == b as usize * s.len)
                        {
                            break b;
                        }
                    },
                };
                let at = block as usize * s.len;
                let (sqe, d) = if s.kind == Kind::RandWrite {
                    version += 1;
                    for (k, x) in data.iter_mut().enumerate() {
                        *x = byte(at + k, version);
                    }
                    (
                        Sqe::rw(opcode::WRITE, 0, 1, block * per, per as u32),
                        Data::Out(&data),
                    )
                } else {
                    (
                        Sqe::rw(opcode::READ, 0, 1, block * per, per as u32),
                        Data::In(s.len as u32),
                    )
                };
                let slot = h.submit(1, sqe, d).unwrap();
                assert!(slots[usize::from(slot)].is_none());
                slots[usize::from(slot)] = Some((at, version));
                submitted += 1;
            }
            clk.advance(STEP_US);
            // The target's loop, as the appliance's: until a round finds nothing to do.
            let warm = done < u64::from(s.depth);
            loop {
                let mut work = 0;
                let mut round = || {
                    work = t.poll(&mut cmb);
                    black_box(t.counts());
                };
                if warm {
                    uncounted(&mut round);
                } else {
                    bench_target(&mut round);
                    counted.rounds += 1;
                }
                if work == 0 {
                    if !warm {
                        counted.idle += 1;
                    }
                    break;
                }
            }
            // The host: its device takes the target's frames, it takes its completions.
            h.poll();
            for k in 0..s.depth {
                let Some((at, g)) = slots[usize::from(k)] else {
                    continue;
                };
                let Some((cqe, got)) = h.take(1, k) else {
                    continue;
                };
                assert!(cqe.status.is_ok(), "{}: status {:?}", s.name, cqe.status);
                if s.kind == Kind::RandWrite {
                    for (i, x) in shadow[at..at + s.len].iter_mut().enumerate() {
                        *x = byte(at + i, g);
                    }
                } else {
                    assert!(got == &shadow[at..at + s.len], "{}: data at {at}", s.name);
                }
                slots[usize::from(k)] = None;
                if !warm {
                    counted.ios += 1;
                }
                done += 1;
            }
        }
        let c = t.counts();
        assert_eq!(c.errors, 0, "{}: error statuses", s.name);
        assert!(c.commands >= total, "{}: commands {}", s.name, c.commands);
        ran = counted;
    }
    assert!(mem == shadow, "{}: the disk after the writes", s.name);
    ran
}

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    let mut any = false;
    for s in &SCENARIOS {
        if arg == "all" || arg == s.name {
            let r = run(s);
            println!(
                "{} ios {} rounds {} idle {}",
                s.name, r.ios, r.rounds, r.idle
            );
            any = true;
        }
    }
    if !any {
        eprintln!("target: unknown scenario {arg} (randread-4k, randwrite-4k, seqread-128k, all)");
        std::process::exit(2);
    }
}
