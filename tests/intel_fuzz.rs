//! The hostile-NIC fuzzer of the Intel links: `tests/intel_fuzz.sh [N] [SEED]`.
//!
//! Each NIC family gets `INTEL_FUZZ_EXECS` executions (default 20,000) from the seed
//! `INTEL_FUZZ_SEED`, spent through the fuzz budget driver in sessions of [`SESSION`]: a
//! fresh wire, a NIC model brought up under register lies one session in four (a typed error
//! or a link), then lying on every write-back at a rate drawn per session. An execution is a
//! frame of random length and destination put on the wire, every frame the link then shows
//! read (its length checked against the buffer and the largest frame), and one frame sent.
//! After each session the link is dropped and the model says whether it was ever asked to
//! reach memory the link does not own. Prints, per family:
//! `intel-fuzz <nic>: N executions, F failures; received R, refused length L, fragments G,
//! errors E, busy B, resyncs rx X tx Y; bring-ups U, refused K; lies L; seed S`.

mod fuzz_budget;

use bareverbs::hal::Link;
use bareverbs_hal::e1000e::I82574;
use bareverbs_hal::igb::I82576;
use bareverbs_hal::intel::{Family, IntelNic, MAX_FRAME};
use bareverbs_model::Rng;
use bareverbs_model::intel::{NicHostile, NicModel, Wire};

/// Executions of one session.
const SESSION: u64 = 5_000;
const MAC: [u8; 6] = [0x52, 0x54, 0, 0x12, 0, 2];

#[derive(Default)]
struct Reach {
    received: u64,
    bad_length: u64,
    fragments: u64,
    errors: u64,
    busy: u64,
    rx_resyncs: u64,
    tx_resyncs: u64,
    up: u64,
    refused: u64,
    lies: u64,
}

fn session<F: Family>(seed: u64, n: u64) -> Reach {
    let mut rng = Rng::new(seed);
    let wire = Wire::new();
    let m = match F::NAME {
        "igb" => NicModel::igb(&wire, MAC),
        _ => NicModel::e1000e(&wire, MAC),
    };
    let mut reach = Reach::default();
    let registers = rng.one_in(4);
    let rate = [1, 2, 3, 8, 64][rng.below(5) as usize];
    m.set_hostile(registers.then_some(NicHostile {
        seed,
        rate: 3,
        registers: true,
    }));
    // SAFETY: the model's function is this link's alone; the model maps its BARs.
    let nic = unsafe { IntelNic::<NicModel, F>::new(m.clone(), &m, NicModel::address()) };
    let mut nic = match nic {
        Ok(nic) if nic.wait_link(100).is_ok() => {
            reach.up += 1;
            nic
        }
        _ => {
            reach.refused += 1;
            let l = m.lies();
            reach.lies += l.registers;
            assert!(m.violations().is_empty(), "{:?}", m.violations());
            return reach;
        }
    };
    m.set_hostile(Some(NicHostile {
        seed: seed ^ 0xABCD,
        rate,
        registers: false,
    }));
    let mut frame = vec![0u8; 1600];
    for _ in 0..n {
        let len = match rng.below(4) {
            0 => rng.below(1600) as usize,
            1 => 60,
            _ => 14 + rng.below(1501) as usize,
        };
        let dst = match rng.below(4) {
            0 => [0xFF; 6],
            1 => [0x01, 0x00, 0x5E, 0, 0, rng.below(256) as u8],
            2 => [0x52, 0x54, 0, 0x12, 0, rng.below(4) as u8],
            _ => MAC,
        };
        frame[..6].copy_from_slice(&dst);
        frame[6] = rng.below(256) as u8;
        wire.inject(&frame[..len]);
        if rng.one_in(50) {
            nic.join_multicast(dst);
        }
        // Bounded: each call looks at most a ring's worth.
        for _ in 0..4 {
            match nic.receive_with(&mut [], |f| f.len()) {
                Some(got) => assert!((14..=MAX_FRAME).contains(&got), "{got}"),
                None => break,
            }
        }
        let _ = nic.transmit(&frame[..60 + rng.below(200) as usize]);
    }
    let s = nic.stats();
    drop(nic);
    let l = m.lies();
    assert!(m.violations().is_empty(), "{:?}", m.violations());
    Reach {
        received: s.received,
        bad_length: s.bad_length,
        fragments: s.fragments,
        errors: s.errors,
        busy: s.busy,
        rx_resyncs: s.rx_resyncs,
        tx_resyncs: s.tx_resyncs,
        lies: l.rx_writeback + l.tx_writeback + l.scribbles + l.frames + l.registers,
        ..reach
    }
}

fn fuzz<F: Family>() -> u64 {
    let mut t = Reach::default();
    let spent = fuzz_budget::spend(
        &format!("intel-fuzz {}", F::NAME),
        "session",
        "intel_fuzz.sh",
        ("INTEL_FUZZ_EXECS", 20_000),
        "INTEL_FUZZ_SEED",
        SESSION,
        session::<F>,
        |r| {
            t.received += r.received;
            t.bad_length += r.bad_length;
            t.fragments += r.fragments;
            t.errors += r.errors;
            t.busy += r.busy;
            t.rx_resyncs += r.rx_resyncs;
            t.tx_resyncs += r.tx_resyncs;
            t.up += r.up;
            t.refused += r.refused;
            t.lies += r.lies;
        },
    );
    println!(
        "intel-fuzz {}: {} executions, {} failures; received {}, refused length {}, fragments {}, \
         errors {}, busy {}, resyncs rx {} tx {}; bring-ups {}, refused {}; lies {}; seed {} ({:.1} s)",
        F::NAME,
        spent.done,
        spent.failures,
        t.received,
        t.bad_length,
        t.fragments,
        t.errors,
        t.busy,
        t.rx_resyncs,
        t.tx_resyncs,
        t.up,
        t.refused,
        t.lies,
        spent.seed,
        spent.secs
    );
    assert!(t.received > 0 && t.bad_length > 0 && t.up > 0);
    spent.failures
}

#[test]
fn the_hostile_nic_fuzzer() {
    let failures = fuzz::<I82576>() + fuzz::<I82574>();
    assert_eq!(failures, 0);
}
