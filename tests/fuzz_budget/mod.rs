//! What the seeded fuzzers of the network, the CM and the NVMe-oF target share: a budget read
//! from the environment, spent in sessions of fresh devices from seeds SEED, SEED+1, ..., a
//! session that panics counted as a failure with the command that replays it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

/// What a run spent.
pub struct Spent {
    /// The first seed.
    pub seed: u64,
    /// Units (frames, MADs, capsules) sent.
    pub done: u64,
    /// Sessions that failed.
    pub failures: u64,
    /// Wall time, in seconds.
    pub secs: f64,
}

/// Runs `$budget_var` units (default `default_budget`) from seed `$seed_var` (default 1) in
/// sessions of at most `per`: `session(seed, n)` each, its outcome handed to `reached`. A
/// session that panics is a failure, and `<name>: <unit> failed; replay with tests/<script> n
/// seed` says how to run it again.
#[allow(clippy::too_many_arguments)] // each names one part of the fuzzer's command line
pub fn spend<R>(
    name: &str,
    unit: &str,
    script: &str,
    (budget_var, default_budget): (&str, u64),
    seed_var: &str,
    per: u64,
    mut session: impl FnMut(u64, u64) -> R,
    mut reached: impl FnMut(R),
) -> Spent {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let budget = env(budget_var, default_budget);
    let seed = env(seed_var, 1);
    let t0 = Instant::now();
    let (mut done, mut failures, mut k) = (0u64, 0u64, 0u64);
    // Bounded: the budget is finite and each session spends at least one unit of it.
    while done < budget {
        let n = (budget - done).min(per);
        let s = seed.wrapping_add(k);
        // Each session builds its devices afresh: nothing a panic leaves half-done is used again.
        match catch_unwind(AssertUnwindSafe(|| session(s, n))) {
            Ok(r) => reached(r),
            Err(_) => {
                failures += 1;
                eprintln!("{name}: {unit} failed; replay with tests/{script} {n} {s}");
            }
        }
        done += n.max(1);
        k += 1;
    }
    Spent {
        seed,
        done,
        failures,
        secs: t0.elapsed().as_secs_f64(),
    }
}
