//! The software RoCE device's data path, for instruction counting (`tests/bench.sh` runs this
//! under `valgrind --tool=callgrind`).
//!
//! Two `Rxe` devices, A (the requester) and B (the responder), joined by [`Wire`]: an in-memory
//! link that costs what the HAL's virtio-net link costs the driver: each frame built in place
//! in a transmit buffer (`Link::transmit_with`), looked at in place and copied once out of a
//! receive buffer into the device's (`Link::receive_if`), with no allocation (the model's
//! `MemLink` allocates per frame: not this). Every call
//! on A goes through [`bench_req`], every call on B through [`bench_resp`]: callgrind counts
//! inside one of them (`--toggle-collect=bench_req` or `=bench_resp`), so the two sides of one
//! run are measured apart, each with its share of the link's copies (transmit in the sender's
//! call, receive in the receiver's), and the harness's own work (filling and checking the
//! buffers, counting) is outside both. [`bench_floor`] does what no data path can avoid per
//! payload byte: one copy of the payload (the build's `memcpy`) and its CRC-32 with the best
//! algorithm the machine has (`crc32fast`: PCLMULQDQ folding when the CPU has it).
//!
//! The same file is built twice: as `rxe` (the bench profile: opt-level 3, glibc's `memcpy`)
//! and as `rxe_guest` (`tests/bench/rxe_guest.rs`: the unikernel's own memory functions, the
//! profile set by `tests/bench.sh`: opt-level "z", one codegen unit, LTO, as the kernel).
//!
//!   rxe <op>_<mtu>   8 messages of 64 KiB (after one uncounted), op send, write or read,
//!                    at path MTU 1024 or 4096
//!   rxe send64       256 SENDs of 64 bytes (after 16 uncounted)
//!   rxe floor_<mtu>  8 times: 64 KiB copied and CRC-checked in packets of 1024 or 4096 bytes
//!   rxe all          every scenario (a self-check; also what `cargo bench` runs)
//!
//! Every message is checked outside the count: each completion once, successful, and the bytes
//! where they belong.

use std::cell::RefCell;
use std::hint::black_box;
use std::rc::Rc as Shared;
use std::sync::atomic::{AtomicU64, Ordering};

use bareverbs::Context;
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::hal::Clock;
use bareverbs::verbs::*;
use bareverbs_model::{Model, ModelConfig};

#[path = "wire.rs"]
mod wire;
use wire::{Ring, Wire, wire};

/// Payload bytes of one large message.
pub const MSG: usize = 64 * 1024;
/// Large messages counted per scenario (one more runs first, uncounted).
pub const REPS: usize = 8;
/// Small SENDs counted (16 more run first, uncounted).
pub const SMALL_REPS: usize = 256;
/// Bytes of a small SEND.
pub const SMALL: usize = 64;

const IP_A: [u8; 4] = [10, 0, 0, 2];
const IP_B: [u8; 4] = [10, 0, 0, 3];
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);
const SIG: SendFlags = SendFlags::SIGNALED;
/// Frames one direction of the wire holds (a 64 KiB message at MTU 1024 is 64, its READ
/// responses too).
const SLOTS: usize = 256;

// ---- The measured functions. ----

/// Runs `f`, work of the requester's device A. Counted with `--toggle-collect=bench_req`.
#[unsafe(no_mangle)]
#[inline(never)]
pub fn bench_req(f: &mut dyn FnMut()) {
    black_box(0u8);
    f();
}

/// Runs `f`, work of the responder's device B. Counted with `--toggle-collect=bench_resp`.
#[unsafe(no_mangle)]
#[inline(never)]
pub fn bench_resp(f: &mut dyn FnMut()) {
    black_box(1u8);
    f();
}

/// One copy of `src` into `dst` and the CRC-32 of `src`, in packets of `piece` bytes (each
/// copied and checked apart, as a data path does): the floor of a data path per byte. Returns
/// the packets' CRCs, xored.
#[unsafe(no_mangle)]
#[inline(never)]
pub fn bench_floor(dst: &mut [u8], src: &[u8], piece: usize) -> u32 {
    let mut x = 0;
    for (d, s) in dst.chunks_mut(piece).zip(src.chunks(piece)) {
        d.copy_from_slice(s);
        x ^= crc32fast::hash(s);
    }
    x
}

/// Time runs 2 ms a reading (a progress reads it once): the responder's pace (64 KiB back to
/// back, 32 KiB a millisecond) holds no more back than its turn does, and nothing is lost, so
/// no retransmission timer is due (a scenario's message completes within a few readings).
#[derive(Clone, Copy)]
pub struct Still;

static NOW_US: AtomicU64 = AtomicU64::new(1);

impl Clock for Still {
    fn now_us(&self) -> u64 {
        NOW_US.fetch_add(2_000, Ordering::Relaxed)
    }
}

type R = Rxe<Model, Wire<SLOTS>, Still>;
type Ctx = Context<R>;
type RcQp<'a> = QueuePair<'a, R, Rc, Rts>;

/// Two devices on one wire (and the wire's two directions, A to B first).
fn devices(model: &Model) -> (Ctx, Ctx, [Shared<RefCell<Ring<SLOTS>>>; 2]) {
    let (la, lb, rings) = wire::<SLOTS>();
    let a = Rxe::new(model.clone(), la, Still, Config { ip: IP_A }).unwrap();
    let b = Rxe::new(model.clone(), lb, Still, Config { ip: IP_B }).unwrap();
    (Context::new(a), Context::new(b), rings)
}

/// Brings an RC QP to RTS towards `peer` (QPN, IP) at `mtu`.
fn up<'a>(qp: QueuePair<'a, R, Rc, Reset>, peer: u32, ip: [u8; 4], mtu: Mtu) -> RcQp<'a> {
    let init = ConnectedInit {
        access: ALL,
        ..Default::default()
    };
    let qp = qp.init(&init).unwrap();
    let mut rtr = ConnectedRtr::new(peer, 0, AddressVector::new(Gid::from_ipv4(ip), 1));
    rtr.path_mtu = mtu;
    rtr.max_dest_rd_atomic = 4;
    let qp = qp.rtr(&rtr).unwrap();
    let mut rts = ConnectedRts::new(0);
    rts.max_rd_atomic = 4;
    qp.rts(&rts).unwrap()
}

/// What a scenario moves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Op {
    /// SEND into a posted receive.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ (B answers with the data).
    Read,
}

/// Runs `f` as work of side `req` (A) or B, through the counted wrappers when `counted`.
fn side(req: bool, counted: bool, mut f: impl FnMut()) {
    match (counted, req) {
        (false, _) => f(),
        (true, true) => bench_req(&mut f),
        (true, false) => bench_resp(&mut f),
    }
}

/// Polls `cq` once (which first runs its device: frames in, timers) as work of side `req`
/// (counted when `counted`), collecting its completions. Only the poll call is counted: the
/// array it fills is the caller's, made once, and the copy into `into` is the harness's own
/// work, after the count.
fn poll(
    req: bool,
    counted: bool,
    cq: &CompletionQueue<'_, R>,
    wc: &mut [WorkCompletion; 4],
    into: &mut Vec<WorkCompletion>,
) {
    let mut n = 0;
    side(req, counted, || n = cq.poll(wc).unwrap());
    into.extend_from_slice(&wc[..n]);
}

/// What a scenario did: payload bytes counted, frames each way per message.
pub struct Done {
    /// Payload bytes moved in the counted messages.
    pub bytes: usize,
    /// Frames from A to B, and from B to A, per message.
    pub frames: (f64, f64),
}

/// `messages` of `len` bytes with `op` at `mtu` (the first `warm` uncounted).
fn run(op: Op, mtu: Mtu, len: usize, warm: usize, messages: usize) -> Done {
    let model = Model::new(ModelConfig::default());
    let (a, b, rings) = devices(&model);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qa = pa.qp_builder(&ca, &ca).caps(caps).build::<Rc>().unwrap();
    let qb = pb.qp_builder(&cb, &cb).caps(caps).build::<Rc>().unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    let mut qa = up(qa, nb, IP_B, mtu);
    let mut qb = up(qb, na, IP_A, mtu);
    let mut ma = pa.register(MSG, ALL).unwrap();
    let mut mb = pb.register(MSG, ALL).unwrap();
    let (sa, sb) = (
        ma.sge(0, len as u32).unwrap(),
        mb.sge(0, len as u32).unwrap(),
    );
    let remote = (mb.addr(), mb.rkey());
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let mut wc = [WorkCompletion::default(); 4];
    let mut frames = [0; 2];
    for i in 0..warm + messages {
        let counted = i >= warm;
        if i == warm {
            frames = rings.each_ref().map(|r| r.borrow().tail);
        }
        // The source holds message i's bytes, the destination something else.
        let (src, dst) = match op {
            Op::Read => (&mut mb, &mut ma),
            _ => (&mut ma, &mut mb),
        };
        for (k, x) in src.as_mut_slice()[..len].iter_mut().enumerate() {
            *x = (k as u32).wrapping_mul(31).wrapping_add(i as u32 * 7) as u8;
        }
        dst.as_mut_slice()[..len].fill(!0);
        let expect: Vec<u8> = src.as_slice()[..len].to_vec();
        let wr = i as u64;
        if op == Op::Send {
            // SAFETY: the buffer stays registered and untouched until its completion.
            side(false, counted, || {
                unsafe { qb.post_recv_raw(wr, &[sb]) }.unwrap()
            });
        }
        side(true, counted, || {
            let mut s = qa.send_batch();
            // SAFETY: as above.
            unsafe {
                match op {
                    Op::Send => s.send(wr, SIG, &[sa]),
                    Op::Write => s.rdma_write(wr, SIG, remote, &[sa]),
                    Op::Read => s.rdma_read(wr, SIG, remote, &[sa]),
                }
            }
            .unwrap();
            s.finish();
        });
        let want_b = usize::from(op == Op::Send);
        let mut rounds = 0;
        while wa.is_empty() || wb.len() < want_b {
            rounds += 1;
            assert!(rounds < 100, "message {i}: {op:?} did not complete");
            poll(false, counted, &cb, &mut wc, &mut wb);
            poll(true, counted, &ca, &mut wc, &mut wa);
        }
        let s = wa.remove(0);
        assert_eq!((s.wr_id, s.status), (wr, WcStatus::Success), "{s:?}");
        if op == Op::Send {
            let r = wb.remove(0);
            assert_eq!(
                (r.wr_id, r.status, r.byte_len),
                (wr, WcStatus::Success, len as u32)
            );
        }
        assert!(wa.is_empty() && wb.is_empty(), "{wa:?} {wb:?}");
        let dst = match op {
            Op::Read => &ma,
            _ => &mb,
        };
        assert!(
            dst.as_slice()[..len] == expect[..],
            "message {i}: bytes differ"
        );
    }
    let per = |k: usize| (rings[k].borrow().tail - frames[k]) as f64 / messages as f64;
    Done {
        bytes: messages * len,
        frames: (per(0), per(1)),
    }
}

/// The floor at packets of `piece` bytes, `REPS` times over 64 KiB.
fn floor(piece: usize) -> Done {
    let src: Vec<u8> = (0..MSG).map(|k| (k * 7) as u8).collect();
    let mut dst = vec![0u8; MSG];
    let want = src.chunks(piece).fold(0, |x, c| x ^ crc32fast::hash(c));
    for _ in 0..REPS {
        dst.fill(0);
        let got = bench_floor(black_box(&mut dst), black_box(&src), black_box(piece));
        assert_eq!(got, want);
        assert!(dst == src);
    }
    Done {
        bytes: REPS * MSG,
        frames: (0.0, 0.0),
    }
}

/// Runs scenario `key`; `None` for an unknown key.
fn scenario(key: &str) -> Option<Done> {
    if key == "send64" {
        return Some(run(Op::Send, Mtu::Mtu1024, SMALL, 16, SMALL_REPS));
    }
    let (op, mtu) = key.split_once('_')?;
    let (mtu, piece) = match mtu {
        "1024" => (Mtu::Mtu1024, 1024),
        "4096" => (Mtu::Mtu4096, 4096),
        _ => return None,
    };
    let op = match op {
        "floor" => return Some(floor(piece)),
        "send" => Op::Send,
        "write" => Op::Write,
        "read" => Op::Read,
        _ => return None,
    };
    Some(run(op, mtu, MSG, 1, REPS))
}

/// Every scenario's key, in the order `tests/bench.sh` prints them.
pub const KEYS: [&str; 9] = [
    "floor_1024",
    "floor_4096",
    "send_1024",
    "write_1024",
    "read_1024",
    "send_4096",
    "write_4096",
    "read_4096",
    "send64",
];

/// The entry point (shared with `rxe_guest`).
pub fn main() {
    let arg = std::env::args().nth(1).unwrap_or_default();
    if arg.is_empty() || arg == "all" || arg.starts_with("--") {
        for key in KEYS {
            let d = scenario(key).unwrap();
            let (ab, ba) = d.frames;
            println!(
                "{key} ok: {} bytes counted, frames per message {ab} A to B, {ba} B to A",
                d.bytes
            );
        }
    } else if scenario(&arg).is_none() {
        eprintln!("rxe: unknown scenario {arg:?} (one of {KEYS:?}, or all)");
        std::process::exit(2);
    }
}
