//! The unikernel example's demo — the code the kernel runs under QEMU — run on the host
//! against the device model, where a PVRDMA exists: the device path of the example is tested
//! on every `cargo test`, not only in the nested lab.

#[path = "../../../tests/common/mod.rs"]
mod common;

use bareverbs_model::{Model, ModelConfig};
use bareverbs_unikernel::wait::Polling;
use bareverbs_unikernel::{CAP_SETS, Verdict, run};
use common::*;

#[test]
fn the_demo_passes_on_the_model_and_returns_every_page() {
    big_stack(demo_passes);
}

fn demo_passes() {
    let model = model();
    let mut out = String::new();
    let verdict = run(model.clone(), &model, &mut out, CONFIG, &mut Polling);
    assert_eq!(verdict, Ok(Verdict::Pass), "{out}");
    assert_eq!(model.outstanding_pages(), 0, "{out}");
    assert_clean(&model);
    assert_eq!(
        model.objects(),
        Default::default(),
        "nothing left on the device"
    );

    for line in [
        "  00:10.0 15ad:07b0 class 02.00 VMware vmxnet3",
        "  00:10.1 15ad:0820 class 02.80 VMware PVRDMA",
        "PVRDMA at 00:10.1: device version 17",
        "caps: max_qp 1024 max_qp_wr 10467 max_sge 4 max_cq 2048 max_cqe 28672 max_mr 1024 max_pd 1024",
        "caps: max_srq 512 max_srq_wr 12288 max_srq_sge 4 max_ah 64 gid_tbl_len 255 max_pkeys 1 ports 1",
        "port 1: state Active, max_mtu 4096, active_mtu 1024, gid_tbl_len 255, max_msg_sz 1024, pkey[0] 0xffff",
        "GID[0] bound: fe80:0000:0000:0000:5054:00ff:fe12:3457",
        "PD 0, CQs of 4096 and 128 entries (asked 4096, 100)",
        "UC: unsupported on PVRDMA (as expected)",
        "GSI QP: qpn 1",
        "SRQ: max_wr 256 max_sge 2; RC QP 25 receives from it (recv caps 0/0)",
        "RC SEND 26 -> 27: 1000 bytes received, payload checked; send status Success",
        "UD QP 28: Rts, qkey 0x11111111, sq_psn 0x42",
        "UD SEND 28 -> 29: 552 bytes received (40 GRH + 512), payload checked; send status Success",
        "UD QP after reset: Reset",
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "missing {line:?} in:\n{out}"
        );
    }
    let rc_lines: Vec<_> = out.lines().filter(|l| l.starts_with("RC QP ")).collect();
    assert_eq!(rc_lines.len(), CAP_SETS.len());
    assert!(rc_lines[2].ends_with("asked wr 100/50 sge 4/3 -> got wr 128/64 sge 4/3 inline 0"));
    assert!(
        out.contains("RC pair 26 <-> 27: Rts/Rts, dest_qpn 27/26"),
        "{out}"
    );
}

#[test]
fn the_demo_reports_a_failure_with_its_step() {
    big_stack(demo_reports_failure);
}

fn demo_reports_failure() {
    let model = model();
    let mut out = String::new();
    model.fail_command(3, 5); // QUERY_PORT, QUERY_PKEY, then CREATE_BIND
    let f = run(model.clone(), &model, &mut out, CONFIG, &mut Polling).unwrap_err();
    assert_eq!(f.step, "bind GID 0");
    assert_eq!(
        model.outstanding_pages(),
        0,
        "a failed demo still returns every page"
    );
}

#[test]
fn without_a_pvrdma_the_demo_says_so() {
    big_stack(no_pvrdma);
}

fn no_pvrdma() {
    // A model whose PVRDMA is not paired cannot be brought up; a machine without one at all is
    // what plain QEMU gives (checked by booting the kernel there).
    let model = Model::new(ModelConfig {
        fn0: bareverbs_model::Fn0::Other,
        ..Default::default()
    });
    let mut out = String::new();
    let f = run(model.clone(), &model, &mut out, CONFIG, &mut Polling).unwrap_err();
    assert_eq!(f.step, "bring-up");
    assert_eq!(
        f.error,
        bareverbs::Error::NotFound(bareverbs::error::NotFound::PairedFunction)
    );
}
