//! Random 4 KiB reads at queue depth 32 between the NVMe/RDMA host and target on the
//! in-memory segment, clean and with the loss, duplication and reordering a busy virtual
//! segment shows: for reads the target is the RDMA WRITE requester (4 KiB of data and the
//! completion's SEND per command, more packets in flight than the requester's window of
//! 128); every command completes once with its data, and loss costs retransmissions, not a
//! collapse of the rate.

mod common;

use bareverbs_model::link::Faults;
use bareverbs_nvmf::host::Data;
use bareverbs_nvmf::wire::{Sqe, opcode};
use common::*;

/// Reads done in `ms` milliseconds of the test clock at depth `depth`, on `faults`; every
/// read's data checked against what was written.
fn randread(
    faults: Faults,
    ms: u64,
    depth: u16,
) -> (
    u64,
    (u64, u64, u64),
    bareverbs::device::rxe::TransportCounts,
) {
    let cfg = bareverbs_nvmf::target::TargetConfig {
        data_slots: 64,
        io_depth: 64,
        ..tcfg()
    };
    let hc = bareverbs_nvmf::host::HostConfig {
        io_depth: depth,
        timeout_ms: 30_000,
        kato_ms: 0,
        ..hcfg(HOST_A)
    };
    setup!(l, t, h, cma, cmb, disk, cfg, hc; idle);
    h.connect(&mut cma, &mut idle).unwrap();
    // 256 blocks of 4 KiB, each with its own pattern.
    let blocks = 256u64;
    for b in 0..blocks {
        let data = pattern(4096, b as u32);
        h.write(1, 1, b * 8, 8, &data, &mut idle).unwrap();
    }
    l.seg.set_faults(faults);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % blocks
    };
    let mut slots: Vec<Option<u64>> = vec![None; usize::from(depth)];
    let mut done = 0u64;
    // Rounds of 1 ms: the target's retransmission timer (about 67 ms) is 67 of them.
    let rounds = ms;
    for _ in 0..rounds {
        for _ in 0..depth {
            let b = next();
            match h.submit(1, Sqe::rw(opcode::READ, 0, 1, b * 8, 8), Data::In(4096)) {
                Ok(s) => {
                    assert!(slots[usize::from(s)].is_none());
                    slots[usize::from(s)] = Some(b);
                }
                Err(_) => break,
            }
        }
        l.clk.advance(1_000);
        t.poll(&mut cmb);
        h.poll();
        while let Some(e) = cma.poll() {
            h.on_cm_event(e);
        }
        for s in 0..depth {
            let Some(b) = slots[usize::from(s)] else {
                continue;
            };
            if let Some((cqe, data)) = h.take(1, s) {
                assert!(cqe.status.is_ok(), "read of block {b}: {:?}", cqe.status);
                assert!(data == &pattern(4096, b as u32)[..], "block {b}'s data");
                slots[usize::from(s)] = None;
                done += 1;
            }
        }
    }
    assert!(h.connected(1), "the I/O queue stayed up");
    let _ = &disk;
    (done, l.seg.damage(), l.b.provider().transport_counts())
}

/// 2 s of the test clock; 300 ms under memcheck (`tests/memcheck.sh` sets
/// `BAREVERBS_MEMCHECK`: valgrind runs a test about forty times slower).
fn run_ms() -> u64 {
    if std::env::var_os("BAREVERBS_MEMCHECK").is_some() {
        300
    } else {
        2_000
    }
}

#[test]
fn random_reads_hold_their_rate_on_a_lossy_segment() {
    let (clean, _, quiet) = randread(Faults::default(), run_ms(), 32);
    assert_eq!(quiet.timeouts + quiet.seq_naks_received, 0, "{quiet:?}");
    let lossy = Faults {
        drop: 2,
        duplicate: 2,
        reorder: 5,
        seed: 11,
    };
    let (bad, damage, target) = randread(lossy, run_ms(), 32);
    eprintln!(
        "randread 4k depth 32, {} ms of the test clock: clean {clean}, lossy {bad} (segment \
         damage {damage:?}; the target's transport {target:?})",
        run_ms()
    );
    assert!(damage.0 > 0 && damage.1 > 0 && damage.2 > 0);
    // The target's requester met the loss (sequence NAKs), its responder too (NAKs sent,
    // duplicates answered).
    assert!(
        target.seq_naks_received > 0 && target.seq_naks_sent > 0,
        "{target:?}"
    );
    assert!(target.duplicates > 0, "{target:?}");
    assert!(bad * 2 > clean, "clean {clean}, lossy {bad}");
}
