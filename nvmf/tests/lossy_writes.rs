//! Writes of 4 to 64 KiB at queue depth 16 between the NVMe/RDMA host and target on the
//! in-memory segment, with the loss, duplication and reordering a busy virtual segment shows,
//! then every byte of the namespace read back on a clean segment. For writes the target is
//! the RDMA READ requester (the data fetched from the host's slot in parts, a part asked for
//! again from its middle when a response is lost) and the responder of the command capsules
//! (a duplicate SEND is acknowledged, never executed twice). The host reuses a slot's buffer
//! for the next write as soon as a command completes: a command executed twice, or data
//! fetched from the wrong offset, leaves bytes of another write on the disk, which the read
//! back finds.

mod common;

use bareverbs_model::link::Faults;
use bareverbs_nvmf::host::Data;
use bareverbs_nvmf::wire::{Sqe, opcode};
use common::*;

/// The namespace: 1 MiB in 16 regions of 64 KiB; a write stays inside one region, and no two
/// writes to a region are in flight at once, so what the disk must hold is known.
const DISK: usize = 1 << 20;
const REGION: usize = 64 * 1024;

/// Runs `ms` rounds of 1 ms of writes at depth 16 on `faults` (`inline`: the host may carry
/// writes of up to the target's in-capsule size in the capsule), then reads the whole
/// namespace back on a clean segment. Returns the writes completed, the segment's damage and
/// the target's transport counters.
fn randwrite(
    faults: Faults,
    ms: u64,
    inline: bool,
) -> (
    u64,
    (u64, u64, u64),
    bareverbs::device::rxe::TransportCounts,
) {
    let depth = 16u16;
    let cfg = bareverbs_nvmf::target::TargetConfig {
        data_slots: 32,
        io_depth: 64,
        max_transfer: REGION as u32,
        ..tcfg()
    };
    let hc = bareverbs_nvmf::host::HostConfig {
        io_depth: depth,
        timeout_ms: 30_000,
        kato_ms: 0,
        max_transfer: REGION as u32,
        inline,
        ..hcfg(HOST_A)
    };
    setup!(l, t, h, cma, cmb, disk, cfg, hc; idle);
    h.connect(&mut cma, &mut idle).unwrap();
    let mut want = vec![0u8; DISK];
    l.seg.set_faults(faults);
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Per slot: the write in flight (its byte offset and its bytes).
    let mut slots: Vec<Option<(usize, Vec<u8>)>> = vec![None; usize::from(depth)];
    let mut busy = [false; DISK / REGION];
    let mut done = 0u64;
    let mut seed = 0u32;
    // Writes for `ms` rounds on the damaging segment; then the ones still in flight finish on
    // a clean one.
    for round in 0..ms + 5_000 {
        if round == ms {
            l.seg.set_faults(Faults::default());
        }
        if round >= ms && slots.iter().all(Option::is_none) {
            break;
        }
        if round < ms {
            for _ in 0..depth {
                let r = (next() % (DISK / REGION) as u64) as usize;
                if busy[r] {
                    continue;
                }
                // 1 to 16 blocks of 4 KiB, anywhere in the region.
                let blocks = 1 + (next() % 16) as usize;
                let at = r * REGION + (next() % (17 - blocks as u64)) as usize * 4096;
                let at = at.min((r + 1) * REGION - blocks * 4096);
                seed = seed.wrapping_add(1);
                let data = pattern(blocks * 4096, seed);
                let sqe = Sqe::rw(opcode::WRITE, 0, 1, (at / 512) as u64, (blocks * 8) as u32);
                match h.submit(1, sqe, Data::Out(&data)) {
                    Ok(s) => {
                        assert!(slots[usize::from(s)].is_none());
                        slots[usize::from(s)] = Some((at, data));
                        busy[r] = true;
                    }
                    Err(_) => break,
                }
            }
        }
        l.clk.advance(1_000);
        t.poll(&mut cmb);
        h.poll();
        while let Some(e) = cma.poll() {
            h.on_cm_event(e);
        }
        for s in 0..depth {
            if slots[usize::from(s)].is_none() {
                continue;
            }
            if let Some((cqe, _)) = h.take(1, s) {
                let (at, data) = slots[usize::from(s)].take().unwrap();
                assert!(cqe.status.is_ok(), "write at {at}: {:?}", cqe.status);
                want[at..at + data.len()].copy_from_slice(&data);
                busy[at / REGION] = false;
                done += 1;
            }
        }
    }
    assert!(slots.iter().all(Option::is_none), "every write completed");
    let damage = l.seg.damage();
    let counts = l.b.provider().transport_counts();
    // Every byte read back, a region at a time.
    for r in 0..DISK / REGION {
        let at = r * REGION;
        let sqe = Sqe::rw(opcode::READ, 0, 1, (at / 512) as u64, (REGION / 512) as u32);
        let s = h.submit(1, sqe, Data::In(REGION as u32)).unwrap();
        let mut got = None;
        for _ in 0..5_000 {
            l.clk.advance(1_000);
            t.poll(&mut cmb);
            h.poll();
            if let Some((cqe, data)) = h.take(1, s) {
                assert!(cqe.status.is_ok(), "read of region {r}: {:?}", cqe.status);
                got = Some(data.to_vec());
                break;
            }
        }
        let got = got.expect("the read back completed");
        if got[..] != want[at..at + REGION] {
            let first = (0..REGION).find(|&i| got[i] != want[at + i]).unwrap();
            panic!(
                "region {r}: byte {first} (disk offset {}) reads {:#04x}, the last write put \
                 {:#04x} there ({done} writes, damage {damage:?}, target {counts:?})",
                at + first,
                got[first],
                want[at + first]
            );
        }
    }
    assert!(h.connected(1), "the I/O queue stayed up");
    let _ = &disk;
    (done, damage, counts)
}

/// Whether the run is under memcheck (`tests/memcheck.sh` sets `BAREVERBS_MEMCHECK`: valgrind
/// runs a test about forty times slower): a shorter run, whose bytes are checked the same but
/// which is too short to be sure of meeting every kind of damage.
fn memcheck() -> bool {
    std::env::var_os("BAREVERBS_MEMCHECK").is_some()
}

/// 1.5 s of the test clock; 250 ms under memcheck.
fn run_ms() -> u64 {
    if memcheck() { 250 } else { 1_500 }
}

fn lossy(seed: u64) -> Faults {
    Faults {
        drop: 10,
        duplicate: 5,
        reorder: 10,
        seed,
    }
}

#[test]
fn writes_land_whole_and_once_on_a_lossy_segment() {
    let (done, damage, target) = randwrite(lossy(7), run_ms(), false);
    eprintln!("randwrite 4-64k depth 16: {done} writes, damage {damage:?}, target {target:?}");
    assert!(done > run_ms() / 100, "{done} writes");
    assert!(damage.0 > 0 && damage.1 > 0 && damage.2 > 0, "{damage:?}");
    if memcheck() {
        return;
    }
    // The target's READs of the host's data met loss, and its responder duplicates.
    assert!(target.read_gaps + target.timeouts > 0, "{target:?}");
    assert!(target.duplicates > 0, "{target:?}");
}

#[test]
fn in_capsule_writes_land_whole_and_once_on_a_lossy_segment() {
    let (done, damage, target) = randwrite(lossy(23), run_ms(), true);
    eprintln!(
        "randwrite 4-64k depth 16, in-capsule: {done} writes, damage {damage:?}, target {target:?}"
    );
    assert!(done > run_ms() / 100, "{done} writes");
    if !memcheck() {
        assert!(target.duplicates > 0, "{target:?}");
    }
}
