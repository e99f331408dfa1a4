//! Two cores serving two NVMe/RDMA I/O queues, the way the appliance's pollers are to serve
//! them (`docs/percore.md`): each queue's QP, CQ and buffers owned by one thread from its
//! start to its end, the device's transport (the NIC's receive and transmit, its timers) run
//! by a third, "core 0", that owns the device's progress.
//!
//! Host A reads 4 KiB blocks of one RAM namespace through two queues; on the target (device
//! B, [`Rxe::set_progress_only`]) each poller takes a capsule from its own CQ, reads the
//! medium (memory both pollers read, no lock: a RAM namespace read by two cores is shared
//! memory only read), RDMA WRITEs the data and SENDs the response, then posts the receive
//! again. The rounds alternate: core 0 runs the devices while the pollers wait, then the
//! pollers run together while core 0 waits, so that the device lock's count over the
//! pollers' phase is theirs alone (the driver's `lock-count` feature counts it).
//!
//! - With the device's transport left to core 0, the pollers' path takes the device lock
//!   not once (neither taken nor tried), and every read comes back right, once.
//! - Without it (a device that transmits at once from a post and runs its transport from a
//!   poll), the same pollers take it on every I/O: the count sees a shared lock when one is
//!   on the path, so the first test fails if one is put there.

mod common;

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use bareverbs::verbs::*;
use bareverbs_nvmf::wire::{Cqe, SQE_LEN, Sgl, Sqe, Status, opcode};
use common::{IP_A, IP_B, Lab, R, lab};

/// Commands outstanding per queue.
const DEPTH: usize = 8;
/// Bytes a command reads (8 blocks of 512).
const IO: usize = 4096;
/// Blocks of the namespace (1 MiB).
const BLOCKS: u64 = 2048;
/// Reads per queue.
const READS: u64 = 400;

/// Host A's region of a queue: capsules, then responses, then data buffers.
const H_RESP: usize = DEPTH * SQE_LEN;
const H_DATA: usize = H_RESP + DEPTH * 16;
const H_LEN: usize = H_DATA + DEPTH * IO;
/// A poller's region: receive buffers, then data buffers, then responses.
const T_DATA: usize = DEPTH * SQE_LEN;
const T_RESP: usize = T_DATA + DEPTH * IO;
const T_LEN: usize = T_RESP + DEPTH * 16;

/// Work request IDs: the slot, and this bit for a send's.
const SEND: u64 = 1 << 32;

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 2 * DEPTH as u32 + 1,
        max_recv_wr: DEPTH as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

fn up<'a>(
    qp: QueuePair<'a, R, Rc, Reset>,
    peer: u32,
    ip: [u8; 4],
    access: AccessFlags,
) -> QueuePair<'a, R, Rc, Rts> {
    let init = ConnectedInit {
        access,
        ..Default::default()
    };
    let av = AddressVector::new(Gid::from_ipv4(ip), 1);
    let qp = qp.init(&init).unwrap();
    let qp = qp.rtr(&ConnectedRtr::new(peer, 0, av)).unwrap();
    qp.rts(&ConnectedRts::new(0)).unwrap()
}

/// The namespace's contents: every byte a function of its place.
fn medium() -> Vec<u8> {
    (0..BLOCKS as usize * 512)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2])
        .collect()
}

/// The starting LBA of read `n` of queue `q` (8-block aligned, spread over the namespace).
fn lba(q: usize, n: u64) -> u64 {
    (n.wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(q as u64 * 1_442_695_040_888_963_407)
        >> 33)
        % (BLOCKS / 8)
        * 8
}

/// One poller's queue on the target: its QP, CQ and region.
struct Poller<'a> {
    qp: QueuePair<'a, R, Rc, Rts>,
    cq: &'a CompletionQueue<'a, R>,
    mr: MemoryRegion<'a, R>,
    served: u64,
}

impl Poller<'_> {
    /// Takes every completion its CQ holds and serves the capsules among them. Returns
    /// whether it found any.
    fn serve(&mut self, medium: &[u8]) -> bool {
        let mut wc = [WorkCompletion::default(); 16];
        let n = self.cq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            let slot = (w.wr_id & 0xffff) as usize;
            if w.wr_id & SEND != 0 {
                // The response went out: its buffer and the receive are free again.
                let sge = self
                    .mr
                    .sge((slot * SQE_LEN) as u32, SQE_LEN as u32)
                    .unwrap();
                // SAFETY: the region outlives the QP and its completions.
                unsafe { self.qp.post_recv_raw(slot as u64, &[sge]) }.unwrap();
                continue;
            }
            assert_eq!(w.byte_len as usize, SQE_LEN);
            let at = slot * SQE_LEN;
            let sqe = Sqe::parse(&self.mr.as_slice()[at..at + SQE_LEN]).unwrap();
            assert_eq!(sqe.opcode(), opcode::READ);
            let Ok(Sgl::Keyed { addr, key, len, .. }) = sqe.sgl() else {
                panic!("not a keyed SGL: {sqe:?}");
            };
            let (from, blocks) = (sqe.slba() as usize * 512, sqe.nlb() as usize);
            assert_eq!((blocks * 512, len as usize), (IO, IO));
            // The medium read into the data buffer the WRITE sends from.
            let data = T_DATA + slot * IO;
            self.mr.as_mut_slice()[data..data + IO].copy_from_slice(&medium[from..from + IO]);
            let resp = T_RESP + slot * 16;
            let cqe = Cqe {
                sq_id: 1,
                cid: sqe.cid(),
                status: Status::SUCCESS,
                ..Cqe::default()
            };
            self.mr.as_mut_slice()[resp..resp + 16].copy_from_slice(&cqe.to_bytes());
            let (d, r) = (
                self.mr.sge(data as u32, IO as u32).unwrap(),
                self.mr.sge(resp as u32, 16).unwrap(),
            );
            let mut b = self.qp.send_batch();
            // SAFETY: the region outlives the QP and its completions; the buffers stay
            // untouched until the response's completion.
            unsafe {
                b.rdma_write(slot as u64, SendFlags::empty(), (addr, key), &[d])
                    .unwrap();
                b.send(SEND | slot as u64, SendFlags::SIGNALED, &[r])
                    .unwrap();
            }
            b.finish();
            self.served += 1;
        }
        n > 0
    }
}

/// Host A's side of one queue.
struct HostQueue<'a> {
    qp: QueuePair<'a, R, Rc, Rts>,
    cq: &'a CompletionQueue<'a, R>,
    mr: MemoryRegion<'a, R>,
    /// The LBA each slot's outstanding read asked for.
    asked: [Option<u64>; DEPTH],
    submitted: u64,
    done: u64,
}

impl HostQueue<'_> {
    fn submit(&mut self, q: usize, slot: usize) {
        let n = self.submitted;
        self.submitted += 1;
        let l = lba(q, n);
        self.asked[slot] = Some(l);
        let mut sqe = Sqe::rw(opcode::READ, slot as u16, 1, l, (IO / 512) as u32);
        sqe.set_sgl(&Sgl::Keyed {
            addr: self.mr.addr() + (H_DATA + slot * IO) as u64,
            key: self.mr.rkey(),
            len: IO as u32,
            invalidate: false,
        });
        let at = slot * SQE_LEN;
        self.mr.as_mut_slice()[at..at + SQE_LEN].copy_from_slice(&sqe.0);
        let resp = self.mr.sge((H_RESP + slot * 16) as u32, 16).unwrap();
        let cap = self.mr.sge(at as u32, SQE_LEN as u32).unwrap();
        // SAFETY: the region outlives the QP and its completions.
        unsafe { self.qp.post_recv_raw(slot as u64, &[resp]) }.unwrap();
        let mut b = self.qp.send_batch();
        // SAFETY: as above.
        unsafe { b.send(SEND | slot as u64, SendFlags::SIGNALED, &[cap]) }.unwrap();
        b.finish();
    }

    /// Takes the responses, checks them and their data, submits the next reads.
    fn reap(&mut self, q: usize, medium: &[u8]) {
        let mut wc = [WorkCompletion::default(); 16];
        let n = self.cq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            if w.wr_id & SEND != 0 {
                continue;
            }
            let slot = w.wr_id as usize;
            let resp = H_RESP + slot * 16;
            let cqe = Cqe::parse(&self.mr.as_slice()[resp..resp + 16]).unwrap();
            assert_eq!((cqe.cid, cqe.status), (slot as u16, Status::SUCCESS));
            let l = self.asked[slot]
                .take()
                .expect("a response for a slot with no read");
            let data = &self.mr.as_slice()[H_DATA + slot * IO..][..IO];
            let from = l as usize * 512;
            assert!(
                data == &medium[from..from + IO],
                "queue {q} LBA {l}: wrong data"
            );
            self.done += 1;
            if self.submitted < READS {
                self.submit(q, slot);
            }
        }
    }
}

/// Runs `READS` reads on each of two queues, each served by a poller thread of its own;
/// returns the device lock's acquisitions and held-tries over the pollers' phases, and the
/// commands each poller served.
fn run(progress_only: bool) -> ((u64, u64), [u64; 2]) {
    let l: Lab = lab();
    let (a, b) = (&l.a, &l.b);
    b.provider().set_progress_only(progress_only);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let ca = [a.create_cq(64).unwrap(), a.create_cq(64).unwrap()];
    let cb = [b.create_cq(64).unwrap(), b.create_cq(64).unwrap()];
    let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let medium = medium();
    let mut hosts = Vec::new();
    let mut pollers = Vec::new();
    for q in 0..2 {
        let qa = pa
            .qp_builder(&ca[q], &ca[q])
            .caps(caps())
            .build::<Rc>()
            .unwrap();
        let qb = pb
            .qp_builder(&cb[q], &cb[q])
            .caps(caps())
            .build::<Rc>()
            .unwrap();
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        hosts.push(HostQueue {
            qp: up(qa, nb, IP_B, remote),
            cq: &ca[q],
            mr: pa.register(H_LEN, remote).unwrap(),
            asked: [None; DEPTH],
            submitted: 0,
            done: 0,
        });
        let mut p = Poller {
            qp: up(qb, na, IP_A, AccessFlags::LOCAL_WRITE),
            cq: &cb[q],
            mr: pb.register(T_LEN, AccessFlags::LOCAL_WRITE).unwrap(),
            served: 0,
        };
        for slot in 0..DEPTH {
            let sge = p.mr.sge((slot * SQE_LEN) as u32, SQE_LEN as u32).unwrap();
            // SAFETY: the region outlives the QP and its completions.
            unsafe { p.qp.post_recv_raw(slot as u64, &[sge]) }.unwrap();
        }
        pollers.push(p);
    }
    // Addresses resolved (ARP both ways) before the first command.
    for _ in 0..8 {
        a.progress();
        b.progress();
    }
    for (q, h) in hosts.iter_mut().enumerate() {
        for slot in 0..DEPTH {
            h.submit(q, slot);
        }
    }
    let (start, done) = (Barrier::new(3), Barrier::new(3));
    let stop = AtomicBool::new(false);
    let mut in_pollers = (0, 0);
    let served = std::thread::scope(|s| {
        let handles: Vec<_> = pollers
            .into_iter()
            .map(|mut p| {
                let (start, done, stop, medium) = (&start, &done, &stop, &medium);
                s.spawn(move || {
                    loop {
                        start.wait();
                        if stop.load(Ordering::Acquire) {
                            return p.served;
                        }
                        // Bounded: what the CQ holds, a few passes.
                        for _ in 0..4 {
                            if !p.serve(medium) {
                                break;
                            }
                        }
                        done.wait();
                    }
                })
            })
            .collect();
        // Bounded: each round moves every outstanding command a step.
        for _ in 0..20_000 {
            if hosts.iter().all(|h| h.done == READS) {
                break;
            }
            // Core 0: the devices' transport (and host A, another machine).
            for _ in 0..3 {
                l.clk.advance(50);
                b.progress();
                a.progress();
            }
            for (q, h) in hosts.iter_mut().enumerate() {
                h.reap(q, &medium);
            }
            // The pollers, alone in the target's device.
            let before = b.provider().device_lock_counts();
            start.wait();
            done.wait();
            let after = b.provider().device_lock_counts();
            in_pollers.0 += after.0 - before.0;
            in_pollers.1 += after.1 - before.1;
        }
        stop.store(true, Ordering::Release);
        start.wait();
        let served: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        [served[0], served[1]]
    });
    for (q, h) in hosts.iter().enumerate() {
        assert_eq!(h.done, READS, "queue {q}: {} of {READS} reads done", h.done);
    }
    (in_pollers, served)
}

#[test]
fn two_pollers_serve_two_queues_without_the_device_lock() {
    let (locks, served) = run(true);
    // Every command served once, each queue's by its own poller.
    assert_eq!(served, [READS, READS]);
    assert_eq!(
        locks,
        (0, 0),
        "the pollers' per-I/O path took (or tried) the device lock (acquisitions, tries \
         that found it held) over {} commands",
        2 * READS
    );
}

#[test]
fn a_poller_that_runs_the_transport_takes_the_device_lock_every_io() {
    let (locks, served) = run(false);
    assert_eq!(served, [READS, READS]);
    let touched = locks.0 + locks.1;
    eprintln!(
        "device lock over {} commands served by two pollers running the transport: {} \
         acquisitions, {} tries that found it held",
        2 * READS,
        locks.0,
        locks.1
    );
    // At least the post's try and the poll's progress of each command.
    assert!(
        touched >= 2 * READS,
        "{touched} device-lock acquisitions and tries over {} commands",
        2 * READS
    );
}

/// The target split over two cores: core 0 (this thread) with the CM, the admin queue, the
/// controllers and the device's transport, and a poll group on a thread of its own; host A
/// connects two I/O queues, one goes to each core. Writes on one queue are read back on
/// the other (one RAM namespace, a handle of it each core); the group's rounds alternate
/// with core 0's, and the device lock's count over the group's rounds of I/O is the group's.
#[test]
fn the_target_split_over_two_cores_serves_a_queue_on_each_with_no_device_lock() {
    split(false);
}

/// The same, but the host vanishes after its I/O (no disconnection): its controller's
/// keep-alive timer (core 0's) expires, and the queue the group serves ends with the rest.
#[test]
fn a_vanished_hosts_queue_on_a_group_ends_with_its_controller() {
    split(true);
}

/// An ANA group made inaccessible on core 0: the queue the group serves refuses I/O with the
/// path status as core 0's does, and serves again once the group is optimized again.
#[test]
fn an_ana_state_set_on_core0_reaches_the_group() {
    split_with(false, true);
}

/// The split target's run (`vanish`: the host vanishes instead of disconnecting).
fn split(vanish: bool) {
    split_with(vanish, false);
}

/// The same, with an ANA change after the I/O (`ana`).
fn split_with(vanish: bool, ana: bool) {
    use bareverbs_nvmf::block::{BlockDevice, SharedRam};
    use bareverbs_nvmf::target::{CoreCounts, GroupLink, Subsystem, Target};
    use common::{H, NQN, T, hcfg, pattern, side, target_cm, tcfg};

    let l = lab();
    l.b.provider().set_progress_only(true);
    let gcq = l.b.create_cq(4096).unwrap();
    let links = [GroupLink::new(&gcq)];
    let sa = side(&l.a);
    let sb = side(&l.b);
    let mut cma = common::cm(&sa, &l.clk);
    let mut cmb = target_cm(&sb, &l.clk);
    // One namespace: 1 MiB of 512-byte blocks, 8-byte aligned.
    let mut mem = vec![0u64; (1 << 20) / 8];
    // SAFETY: the vector's bytes, borrowed mutably for as long as the view lives.
    let bytes = unsafe { std::slice::from_raw_parts_mut(mem.as_mut_ptr().cast::<u8>(), 1 << 20) };
    let ram = SharedRam::new(bytes, 512).unwrap();
    let mut h0 = ram.handle();
    let mut nss: [&mut dyn BlockDevice; 1] = [&mut h0];
    let mut subs = [Subsystem::new(NQN, &mut nss)];
    let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
    t.serve_groups(&links).unwrap();
    let t = std::cell::RefCell::new(t);
    let mut h: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), hcfg(common::HOST_A));
    let turn = Turn::default();
    // Device-lock acquisitions and held tries over the group's rounds, while counted.
    let counting = AtomicBool::new(false);
    let mut in_group = (0u64, 0u64);
    let group_ram = ram.handle();
    std::thread::scope(|s| {
        let (turn_g, link, pd, gcq) = (&turn, &links[0], &sb.pd, &gcq);
        let clk = l.clk.clone();
        let group = s.spawn(move || {
            let mut h1 = group_ram;
            let mut nss: [&mut dyn BlockDevice; 1] = [&mut h1];
            let mut subs = [Subsystem::new(NQN, &mut nss)];
            let mut g: Target<'_, '_, R, _, 8, 128> =
                Target::new(pd, gcq, clk, IP_B, tcfg(), &mut subs).unwrap();
            g.join_group(link).unwrap();
            let mut served = 0;
            while turn_g.group_waits() {
                for _ in 0..3 {
                    served += g.poll_group();
                }
                turn_g.to_core0();
            }
            (served, g.counts().commands)
        });
        {
            let b = &l.b;
            let clk = l.clk.clone();
            let (t, cmb, counting, in_group) = (&t, &mut cmb, &counting, &mut in_group);
            let mut idle = || {
                clk.advance(20);
                b.progress();
                t.borrow_mut().poll(cmb);
                let before = b.provider().device_lock_counts();
                turn.to_group_and_back();
                let after = b.provider().device_lock_counts();
                if counting.load(Ordering::Relaxed) {
                    in_group.0 += after.0 - before.0;
                    in_group.1 += after.1 - before.1;
                }
            };
            h.connect(&mut cma, &mut idle).unwrap();
            counting.store(true, Ordering::Relaxed);
            // Each queue writes blocks and the other reads them back.
            for k in 0..16u32 {
                let (wq, rq) = if k % 2 == 0 { (1, 2) } else { (2, 1) };
                let data = pattern(4096, k);
                let lba = u64::from(k) * 8;
                h.write(wq, 1, lba, 8, &data, &mut idle).unwrap();
                let mut back = vec![0u8; 4096];
                h.read(rq, 1, lba, 8, &mut back, &mut idle).unwrap();
                assert_eq!(
                    back, data,
                    "block {lba}: written on queue {wq}, read on {rq}"
                );
            }
            counting.store(false, Ordering::Relaxed);
            // Every core served its queue (the counts the group published at its last round).
            for _ in 0..4 {
                idle();
            }
            let cores: Vec<CoreCounts> = t.borrow().cores().collect();
            assert_eq!(cores.len(), 2);
            assert_eq!(
                cores.iter().map(|c| c.io_queues).collect::<Vec<_>>(),
                [1, 1],
                "{cores:?}"
            );
            // 16 writes and 16 reads, half on each queue, and each queue's Connect.
            assert_eq!(
                cores.iter().map(|c| c.io_commands).collect::<Vec<_>>(),
                [17, 17],
                "{cores:?}"
            );
            if ana {
                use bareverbs_nvmf::host::HostError;
                use bareverbs_nvmf::wire::ana::AnaState;
                let mut back = vec![0u8; 512];
                let st = AnaState::Inaccessible;
                assert_eq!(t.borrow_mut().set_ana_state(0, 1, st), Ok(0));
                for _ in 0..4 {
                    idle();
                }
                for q in [1, 2] {
                    let r = h.read(q, 1, 0, 1, &mut back, &mut idle);
                    let want = Err(HostError::Status(Status::ANA_INACCESSIBLE));
                    assert_eq!(r, want, "queue {q}");
                }
                let st = AnaState::Optimized;
                assert_eq!(t.borrow_mut().set_ana_state(0, 1, st), Ok(0));
                for _ in 0..4 {
                    idle();
                }
                for q in [1, 2] {
                    h.read(q, 1, 0, 1, &mut back, &mut idle).unwrap();
                }
            }
            if vanish {
                // The host says nothing more; the clock passes its keep-alive timeout (5 s)
                // and the target's grace after it (5 s more), then as long again for the
                // group's report of the ended queue's counts (`idle` is done with).
                for _ in 0..200 {
                    clk.advance(100_000);
                    b.progress();
                    t.borrow_mut().poll(cmb);
                    turn.to_group_and_back();
                }
                assert_eq!(t.borrow().counts().kato_expired, 1);
                assert_eq!(t.borrow().counts().lost, 1);
            } else {
                h.disconnect(&mut cma, &mut idle).unwrap();
                for _ in 0..20 {
                    idle();
                }
            }
            assert_eq!(t.borrow().queues_in_use(), 0);
            assert_eq!(t.borrow().cores().map(|c| c.io_queues).sum::<u32>(), 0);
        }
        turn.stop();
        let (work, commands) = group.join().unwrap();
        assert!(work > 0);
        assert_eq!(
            commands,
            16 + 1 + if ana { 2 } else { 0 },
            "the group's commands: 16 I/O and its queue's Connect (and the two reads of the ANA change)"
        );
    });
    assert_eq!(
        in_group,
        (0, 0),
        "the group's rounds of I/O took (or tried) the device lock"
    );
    // The controller's counts on core 0 hold both queues' (the group's came back at its end).
    let t = t.into_inner();
    let io = t.io_counts();
    assert_eq!((io.reads, io.writes), (16 + if ana { 2 } else { 0 }, 16));
    assert_eq!(t.counts().controllers, 1);
}

#[test]
fn queues_of_a_subsystem_the_groups_cannot_reach_stay_on_core_0() {
    placement(true);
}

/// The same with hosts that name no controller in their queues' connection requests (Linux
/// 6.1's nvme-rdma): the target places each by the controller of its station that waits for
/// a queue of that ID.
#[test]
fn queues_are_placed_by_their_stations_controller_when_the_request_names_none() {
    placement(false);
}

/// Host C to a subsystem core 0 alone reaches, then host A to a RAM subsystem every core
/// reaches; `cntlid`: the hosts name their controller in their requests.
fn placement(cntlid: bool) {
    use bareverbs_nvmf::block::{BlockDevice, RamDisk, SharedRam};
    use bareverbs_nvmf::host::HostConfig;
    use bareverbs_nvmf::target::{CoreCounts, GroupLink, Subsystem, Target};
    use common::{H, HOST_A, HOST_C, NQN, T, hcfg, pattern, side, target_cm, tcfg};
    const NQN_ONE: &str = "nqn.2026-11.io.bareverbs:core0";

    let l = lab();
    l.b.provider().set_progress_only(true);
    let gcq = l.b.create_cq(4096).unwrap();
    let links = [GroupLink::new(&gcq)];
    let (sa, sb, sc) = (side(&l.a), side(&l.b), side(&l.c));
    let mut cma = common::cm(&sa, &l.clk);
    let mut cmc = common::cm(&sc, &l.clk);
    let mut cmb = target_cm(&sb, &l.clk);
    // NQN: 1 MiB of RAM every core has a handle of. NQN_ONE: a disk core 0 alone reaches.
    let mut mem = vec![0u64; (1 << 20) / 8];
    // SAFETY: the vector's bytes, borrowed mutably for as long as the view lives.
    let bytes = unsafe { std::slice::from_raw_parts_mut(mem.as_mut_ptr().cast::<u8>(), 1 << 20) };
    let ram = SharedRam::new(bytes, 512).unwrap();
    let mut h0 = ram.handle();
    let mut own = vec![0u8; 1 << 20];
    let mut disk = RamDisk::new(&mut own, 512);
    let mut nss: [&mut dyn BlockDevice; 1] = [&mut h0];
    let mut nss_one: [&mut dyn BlockDevice; 1] = [&mut disk];
    let mut subs = [
        Subsystem::new(NQN, &mut nss),
        Subsystem {
            core0_only: true,
            ..Subsystem::new(NQN_ONE, &mut nss_one)
        },
    ];
    let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
    t.serve_groups(&links).unwrap();
    let t = std::cell::RefCell::new(t);
    let ha_cfg = HostConfig {
        request_cntlid: cntlid,
        ..hcfg(HOST_A)
    };
    let mut ha: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), ha_cfg);
    let hc_cfg = HostConfig {
        subnqn: NQN_ONE,
        request_cntlid: cntlid,
        ..hcfg(HOST_C)
    };
    let mut hc: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), hc_cfg);
    let turn = Turn::default();
    let group_ram = ram.handle();
    std::thread::scope(|s| {
        let (turn_g, link, pd, gcq) = (&turn, &links[0], &sb.pd, &gcq);
        let clk = l.clk.clone();
        let group = s.spawn(move || {
            let mut h1 = group_ram;
            let mut none: [u8; 0] = [];
            let mut nothing = RamDisk::new(&mut none, 512);
            let mut nss: [&mut dyn BlockDevice; 1] = [&mut h1];
            let mut nss_one: [&mut dyn BlockDevice; 1] = [&mut nothing];
            let mut subs = [
                Subsystem::new(NQN, &mut nss),
                Subsystem {
                    core0_only: true,
                    ..Subsystem::new(NQN_ONE, &mut nss_one)
                },
            ];
            let mut g: Target<'_, '_, R, _, 8, 128> =
                Target::new(pd, gcq, clk, IP_B, tcfg(), &mut subs).unwrap();
            g.join_group(link).unwrap();
            while turn_g.group_waits() {
                for _ in 0..3 {
                    g.poll_group();
                }
                turn_g.to_core0();
            }
            g.counts().commands
        });
        {
            let b = &l.b;
            let clk = l.clk.clone();
            let (t, cmb) = (&t, &mut cmb);
            let mut idle = || {
                clk.advance(20);
                b.progress();
                t.borrow_mut().poll(cmb);
                turn.to_group_and_back();
            };
            // Host C first, to the subsystem only core 0 reaches: both its queues stay
            // there (by load, the second would have gone to the group).
            hc.connect(&mut cmc, &mut idle).unwrap();
            ha.connect(&mut cma, &mut idle).unwrap();
            for k in 0..8u32 {
                let q = 1 + (k % 2) as u16;
                let lba = u64::from(k) * 8;
                for (h, who) in [(&mut ha, "A"), (&mut hc, "C")] {
                    let data = pattern(4096, k + if who == "A" { 0 } else { 100 });
                    h.write(q, 1, lba, 8, &data, &mut idle).unwrap();
                    let mut back = vec![0u8; 4096];
                    h.read(q, 1, lba, 8, &mut back, &mut idle).unwrap();
                    assert_eq!(back, data, "host {who}, queue {q}, block {lba}");
                }
            }
            // A's blocks hold A's bytes still: C's writes went to C's subsystem alone.
            for k in 0..8u32 {
                let mut back = vec![0u8; 4096];
                ha.read(1, 1, u64::from(k) * 8, 8, &mut back, &mut idle)
                    .unwrap();
                assert_eq!(back, pattern(4096, k), "host A's block {}", k * 8);
            }
            for _ in 0..4 {
                idle();
            }
            let cores: Vec<CoreCounts> = t.borrow().cores().collect();
            // Core 0: C's two queues; the group, the least loaded then, both of A's. C's
            // commands on core 0 (2 Connects, 8 writes, 8 reads), A's on the group (and A's 8
            // reads back).
            assert_eq!(
                cores.iter().map(|c| c.io_queues).collect::<Vec<_>>(),
                [2, 2],
                "{cores:?}"
            );
            assert_eq!(
                cores.iter().map(|c| c.io_commands).collect::<Vec<_>>(),
                [18, 26],
                "{cores:?}"
            );
        }
        turn.stop();
        assert_eq!(group.join().unwrap(), 26);
    });
}

/// Whose turn it is, core 0's or the group's, handed over by a flag each side spins on (with
/// a deadline: a side that panicked or stalled ends the other's wait instead of hanging it).
#[derive(Default)]
struct Turn(AtomicU8);

const CORE0: u8 = 0;
const GROUP: u8 = 1;
const STOP: u8 = 2;
const TURN_WITHIN: Duration = Duration::from_secs(60);

impl Turn {
    /// Core 0 gives the group a turn and waits for it back.
    fn to_group_and_back(&self) {
        self.0.store(GROUP, Ordering::Release);
        let start = Instant::now();
        while self.0.load(Ordering::Acquire) == GROUP {
            assert!(
                start.elapsed() < TURN_WITHIN,
                "the group did not take its turn"
            );
            std::thread::yield_now();
        }
    }

    /// The group waits for its turn: false when told to stop (or core 0 went away).
    fn group_waits(&self) -> bool {
        let start = Instant::now();
        loop {
            match self.0.load(Ordering::Acquire) {
                GROUP => return true,
                STOP => return false,
                _ if start.elapsed() > TURN_WITHIN => return false,
                _ => std::thread::yield_now(),
            }
        }
    }

    fn to_core0(&self) {
        let _ = self
            .0
            .compare_exchange(GROUP, CORE0, Ordering::AcqRel, Ordering::Acquire);
    }

    fn stop(&self) {
        self.0.store(STOP, Ordering::Release);
    }
}
