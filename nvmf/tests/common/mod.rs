//! What the NVMe/RDMA tests share: software RoCE devices on an in-memory segment (A and C
//! hosts, B the target), a CM on each, a target with one RAM-disk subsystem, hosts.
#![allow(dead_code)] // each test binary uses a different subset

/// The devices, the segment and the CM set-up, shared with the driver crate's CM tests (one
/// copy: the workspace's `tests/cm_common`).
#[path = "../../../tests/cm_common/mod.rs"]
mod cm_common;
#[allow(unused_imports)] // each test binary uses a different subset
pub use cm_common::{IP_A, IP_B, IP_C, Lab, R, TestCm};

use bareverbs::Context;
use bareverbs::cm::{CmConfig, Service};
use bareverbs::verbs::*;
use bareverbs_model::link::{Faults, TestClock};
use bareverbs_nvmf::host::{Host, HostConfig};
use bareverbs_nvmf::target::{Target, TargetConfig};

pub type T<'a, 's> = Target<'a, 's, R, TestClock, 8, 128>;
pub type H<'a, 'n> = Host<'a, 'n, R, TestClock, 3, 32>;

pub const NQN: &str = "nqn.2026-11.io.bareverbs:ram0";
pub const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001";
pub const HOST_C: &str = "nqn.2014-08.org.nvmexpress:uuid:cccccccc-0000-0000-0000-000000000003";

/// Three devices on one segment, seeded 7, 8 and 9 (their IDs and PSNs replay).
pub fn lab() -> Lab {
    cm_common::lab_seeded(Faults::default(), [7, 8, 9])
}

/// A device's protection domain, CM completion queue and data completion queue.
pub struct Side<'c> {
    pub pd: ProtectionDomain<'c, R>,
    pub mcq: CompletionQueue<'c, R>,
    pub dcq: CompletionQueue<'c, R>,
}

pub fn side(ctx: &Context<R>) -> Side<'_> {
    Side {
        pd: ctx.alloc_pd().unwrap(),
        mcq: ctx.create_cq(64).unwrap(),
        dcq: ctx.create_cq(4096).unwrap(),
    }
}

pub fn cm<'a>(s: &'a Side<'a>, clk: &TestClock) -> TestCm<'a> {
    cm_common::cm(&s.pd, &s.mcq, clk, CmConfig::default())
}

/// The target's CM, listening on 4420.
pub fn target_cm<'a>(s: &'a Side<'a>, clk: &TestClock) -> TestCm<'a> {
    let mut c = cm(s, clk);
    c.listen(None, 4420, Service::Rc).unwrap();
    c
}

/// A small target configuration (the tests' memory is the model's).
pub fn tcfg() -> TargetConfig {
    TargetConfig {
        max_io_queues: 2,
        io_depth: 128,
        inline_data: 4096,
        max_transfer: 16 * 1024,
        data_slots: 8,
        ..TargetConfig::default()
    }
}

pub fn hcfg(hostnqn: &str) -> HostConfig<'_> {
    HostConfig {
        addr: IP_B,
        subnqn: NQN,
        hostnqn,
        io_queues: 2,
        io_depth: 32,
        kato_ms: 5000,
        max_transfer: 16 * 1024,
        timeout_ms: 5000,
        ..HostConfig::default()
    }
}

/// Bytes with a pattern from `seed`.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// Runs the target, the host's completions and the host's CM (its events to the host) for
/// `rounds` rounds of 100 µs.
pub fn settle<'a, 'b, 's, 'n>(
    clk: &TestClock,
    t: &mut T<'b, 's>,
    cmb: &mut TestCm<'b>,
    h: &mut H<'a, 'n>,
    cma: &mut TestCm<'a>,
    rounds: u32,
) {
    for _ in 0..rounds {
        clk.advance(100);
        t.poll(cmb);
        h.poll();
        while let Some(e) = cma.poll() {
            h.on_cm_event(e);
        }
    }
}

/// A lab, both sides, their CMs, a 1 MiB RAM disk of 512-byte blocks as namespace 1 of
/// subsystem `NQN`, a target (`$tcfg`) on B and a host (`$hcfg`) on A.
#[macro_export]
macro_rules! setup {
    // The same, and `$idle`: one round of the test's idle time (20 µs of the clock, then a
    // poll of the target), the closure every host call waits with.
    ($l:ident, $t:ident, $h:ident, $cma:ident, $cmb:ident, $disk:ident, $tcfg:expr, $hcfg:expr; $idle:ident) => {
        setup!($l, $t, $h, $cma, $cmb, $disk, $tcfg, $hcfg);
        let clk = $l.clk.clone();
        let mut $idle = || {
            clk.advance(20);
            $t.poll(&mut $cmb);
        };
    };
    ($l:ident, $t:ident, $h:ident, $cma:ident, $cmb:ident, $disk:ident, $tcfg:expr, $hcfg:expr) => {
        let $l = lab();
        let sa = side(&$l.a);
        let sb = side(&$l.b);
        let mut $cma = cm(&sa, &$l.clk);
        let mut $cmb = target_cm(&sb, &$l.clk);
        let mut mem = vec![0u8; 1 << 20];
        let mut $disk = bareverbs_nvmf::block::RamDisk::new(&mut mem, 512);
        let mut nss: [&mut dyn bareverbs_nvmf::block::BlockDevice; 1] = [&mut $disk];
        let mut subs = [bareverbs_nvmf::target::Subsystem::new(NQN, &mut nss)];
        let mut $t: T = T::new(&sb.pd, &sb.dcq, $l.clk.clone(), IP_B, $tcfg, &mut subs).unwrap();
        let mut $h: H = H::new(&sa.pd, &sa.dcq, $l.clk.clone(), $hcfg);
        let _ = (&mut $cma, &mut $h);
    };
}
