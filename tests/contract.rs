//! The verbs contract where rdma-core's test suite (translated onto the public API) and a
//! hostile device found the driver wanting: each test here failed on the code before its fix.

mod common;

use bareverbs::error::{Attr, DeviceStatus, ErrorKind, Fault, Object, Op, Resource};
use bareverbs::verbs::*;
use bareverbs::{Error, Gid};
use bareverbs_model::{Garbage, Model, ModelConfig};
use common::*;

const LOCAL_WRITE: AccessFlags = AccessFlags::LOCAL_WRITE;

/// The response slot's offset of the header's error field (`docs/pvrdma.md` §5.1).
const HDR_ERR: usize = 0x0C;

fn protocol(op: Op, fault: Fault) -> Error {
    Error::Protocol { op, fault }
}

/// §6b: ERR and the response header's `err` field must tell the same story; when they do not,
/// the answer is not trusted (a create then counts as "outcome unknown").
#[test]
fn err_register_and_header_err_field_must_agree() {
    let model = model();
    let ctx = up(&model);

    // ERR says success, the header says EIO.
    model.garbage_next(Garbage::Word {
        offset: HDR_ERR,
        value: 5,
    });
    assert_eq!(
        ctx.query_port(1).err(),
        Some(protocol(
            Op::QueryPort,
            Fault::StatusMismatch {
                register: 0,
                header: 5
            }
        ))
    );
    // ERR says EINVAL, the header says success.
    model.fail_command(1, 22);
    model.garbage_next(Garbage::Word {
        offset: HDR_ERR,
        value: 0,
    });
    assert_eq!(
        ctx.query_port(1).err(),
        Some(protocol(
            Op::QueryPort,
            Fault::StatusMismatch {
                register: 22u32.wrapping_neg(),
                header: 0
            }
        ))
    );
    // A create answered that way may have happened: the PD stays counted on both sides.
    model.garbage_next(Garbage::Word {
        offset: HDR_ERR,
        value: 12,
    });
    assert!(matches!(
        ctx.alloc_pd(),
        Err(Error::Protocol {
            op: Op::CreatePd,
            fault: Fault::StatusMismatch { .. }
        })
    ));
    assert_eq!(model.objects().pds, 1);

    // When they agree, the errno is reported as before.
    model.fail_command(1, 22);
    assert_eq!(
        ctx.query_port(1).err(),
        Some(Error::Device {
            op: Op::QueryPort,
            status: DeviceStatus::Errno(22)
        })
    );
    assert!(ctx.query_port(1).is_ok());
    teardown(&model, ctx);
}

/// §6c: a PD, CQ or SRQ that a leaked (forgotten) QP still uses, or a PD that a leaked MR
/// still uses, is refused destruction (`InUse`, naming what holds it) before the device is asked (QEMU would have
/// destroyed it under its user); the objects are handed back, and dropping them keeps them.
#[test]
fn objects_used_by_a_leaked_qp_or_mr_are_busy() {
    let model = model();
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let (scq, rcq) = (ctx.create_cq(16).unwrap(), ctx.create_cq(16).unwrap());
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let qp = pd.qp_builder(&scq, &rcq).srq(&srq).build::<Rc>().unwrap();
    std::mem::forget(qp);
    let commands = model.commands();

    let r = srq.destroy();
    assert_clean(&model);
    let (srq, e) = r.expect_err("the SRQ is in use");
    assert!(
        matches!(
            e,
            Error::InUse {
                op: Op::DestroySrq,
                holder: bareverbs::error::Holder::Qps,
                ..
            }
        ),
        "{e:?}"
    );
    for cq in [scq, rcq] {
        let r = cq.destroy();
        assert_clean(&model);
        let (_cq, e) = r.expect_err("the CQ is in use");
        assert!(
            matches!(
                e,
                Error::InUse {
                    op: Op::DestroyCq,
                    holder: bareverbs::error::Holder::Qps,
                    ..
                }
            ),
            "{e:?}"
        );
    }
    drop(srq);
    let r = pd.destroy();
    assert_clean(&model);
    let (pd, e) = r.expect_err("the PD is in use");
    assert!(
        matches!(
            e,
            Error::InUse {
                op: Op::DestroyPd,
                holder: bareverbs::error::Holder::PdObjects,
                ..
            }
        ),
        "{e:?}"
    );
    drop(pd);
    assert_eq!(model.commands(), commands, "the device was never asked");
    let o = model.objects();
    assert_eq!((o.pds, o.cqs, o.qps, o.srqs), (1, 2, 1, 1));

    // A memory region keeps its PD busy the same way.
    let pd = ctx.alloc_pd().unwrap();
    std::mem::forget(pd.register(4096, LOCAL_WRITE).unwrap());
    let r = pd.destroy();
    assert_clean(&model);
    let (pd, e) = r.expect_err("the PD is in use");
    assert!(
        matches!(
            e,
            Error::InUse {
                op: Op::DestroyPd,
                holder: bareverbs::error::Holder::PdObjects,
                ..
            }
        ),
        "{e:?}"
    );
    drop(pd);

    // Users that are destroyed give their objects back.
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let srq = pd.create_srq(SrqAttr::default()).unwrap();
    let qp = pd.qp_builder(&cq, &cq).srq(&srq).build::<Ud>().unwrap();
    let mr = pd.register(4096, LOCAL_WRITE).unwrap();
    qp.destroy().unwrap();
    mr.destroy().unwrap();
    srq.destroy().unwrap();
    cq.destroy().unwrap();
    pd.destroy().unwrap();
    drop(ctx);
    assert_clean(&model);
}

/// §1: a CREATE_MR answer that cannot be right (a handle beyond 24 bits, a zero lkey for a
/// mapped region) is refused; the region the device did register keeps its memory (never
/// handed back while the device maps it) and keeps counting against the device's MR table.
#[test]
fn garbage_from_create_mr_keeps_the_region_and_its_count() {
    let mut cfg = ModelConfig::default();
    cfg.caps.max_mr = 2;
    let model = Model::new(cfg);
    let ctx = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let base = model.outstanding_pages();
    // A one-page region: its page, a directory and a table page.
    let pages = 1 + 2;

    model.garbage_next(Garbage::Payload);
    assert_eq!(
        pd.register(4096, LOCAL_WRITE).err(),
        Some(protocol(
            Op::CreateMr,
            Fault::Value {
                field: &"mr_handle",
                value: 0xA5A5_A5A5
            }
        ))
    );
    assert_eq!(model.objects().mrs, 1, "the device registered it");
    assert_eq!(
        model.outstanding_pages(),
        base + pages,
        "its memory is kept"
    );

    // A plausible handle (1) with the DMA region's useless key.
    model.garbage_next(Garbage::Word {
        offset: 0x14,
        value: 0,
    });
    assert_eq!(
        pd.register(4096, LOCAL_WRITE).err(),
        Some(protocol(
            Op::CreateMr,
            Fault::Value {
                field: &"lkey",
                value: 0
            }
        ))
    );
    assert_eq!(model.outstanding_pages(), base + 2 * pages);

    // Both still count: the table (2 entries) is full, and the driver says so itself.
    let commands = model.commands();
    assert_eq!(
        pd.register(4096, LOCAL_WRITE).err(),
        Some(Error::Resource(Resource::Objects {
            object: Object::Mr,
            limit: 2
        }))
    );
    assert_eq!(model.commands(), commands, "the device was not asked");

    // The PD they use stays too; nothing was freed under the device.
    drop(pd);
    drop(ctx);
    assert_eq!(model.objects().mrs, 2);
    assert_eq!(model.outstanding_pages(), 2 * pages);
    assert_clean(&model);
}

/// §2: remote write or remote atomic access without local write is refused for memory
/// registration, as libibverbs/ib_core refuse it (EINVAL): typed, before the device is asked,
/// nothing allocated. QP access flags have no such rule in ib_core (a QP's flags only say what
/// peers may do), so INIT keeps accepting them.
#[test]
fn remote_write_or_atomic_without_local_write_is_refused() {
    let model = model();
    let ctx = up(&model);
    let _g = ctx
        .bind_gid(
            0,
            Gid::link_local_from_mac([0x52, 0x54, 0, 0x12, 0x34, 0x57]),
        )
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let (commands, pages) = (model.commands(), model.outstanding_pages());
    let (rw, ra, rr) = (
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_ATOMIC,
        AccessFlags::REMOTE_READ,
    );
    for access in [rw, ra, rw | rr, ra | rr, rw | ra | AccessFlags::MW_BIND] {
        let e = pd.register(4096, access).err();
        assert_eq!(
            e,
            Some(Error::MissingAttribute {
                op: Op::CreateMr,
                attr: Attr::LocalWrite
            }),
            "{access:?}"
        );
        assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::InvalidInput));
    }
    assert_eq!(model.commands(), commands, "the device was not asked");
    assert_eq!(model.outstanding_pages(), pages, "nothing was allocated");

    for access in [
        AccessFlags::empty(),
        rr,
        LOCAL_WRITE | rw,
        LOCAL_WRITE | ra,
        LOCAL_WRITE | rw | rr | ra,
    ] {
        drop(pd.register(4096, access).unwrap());
    }
    let cq = ctx.create_cq(16).unwrap();
    let qp = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let qp = qp
        .init(&ConnectedInit {
            access: rw | ra,
            ..Default::default()
        })
        .unwrap();
    drop(qp);
    drop(cq);
    drop(pd);
    drop(_g);
    teardown(&model, ctx);
}

/// §6a: a GSI QP create whose outcome is unknown (timed out, or answered with garbage) may have
/// made QP1 on the device: QP1 counts as existing, so a second one is never asked for (QEMU
/// would register QP1 twice).
#[test]
fn a_gsi_create_with_an_unknown_outcome_still_counts_as_qp1() {
    for how in ["silent", "garbage"] {
        let model = model();
        let ctx = up(&model);
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let build = || pd.qp_builder(&cq, &cq).build::<Gsi>();
        if how == "silent" {
            model.set_silent(true);
            assert_eq!(build().err(), Some(Error::Timeout { op: Op::CreateQp }));
            model.set_silent(false);
        } else {
            model.garbage_next(Garbage::Everything);
            assert!(matches!(
                build().err(),
                Some(Error::Protocol {
                    op: Op::CreateQp,
                    ..
                })
            ));
        }
        let commands = model.commands();
        let r = build();
        assert_clean(&model);
        assert_eq!(r.err(), Some(Error::Busy { op: Op::CreateQp }), "{how}");
        assert_eq!(
            model.commands(),
            commands,
            "{how}: the device was not asked"
        );
        drop(cq);
        drop(pd);
        drop(ctx);
        assert_clean(&model);
    }
}

/// Connects `qp` to `peer` the way ibv_rc_pingpong does: one outstanding RDMA read/atomic each
/// way (RTR's max_dest_rd_atomic, RTS's max_rd_atomic), or `rd` of them.
fn pingpong_connect<'a, P: Provider>(
    qp: QueuePair<'a, P, Rc, Reset>,
    peer: u32,
    gid: Gid,
    rd: u8,
) -> Result<QueuePair<'a, P, Rc, Rts>, Error> {
    let qp = qp.init(&ConnectedInit::default())?;
    let mut rtr = ConnectedRtr::new(peer, 0, AddressVector::new(gid, 0));
    rtr.max_dest_rd_atomic = rd;
    let qp = qp.rtr(&rtr)?;
    let mut rts = ConnectedRts::new(0);
    rts.max_rd_atomic = rd;
    qp.rts(&rts).map_err(|(_, e)| e)
}

/// §3: max_rd_atomic / max_dest_rd_atomic = 1 (ibv_rc_pingpong's values) are accepted although
/// QEMU reports 0 for both; a value above what the device does is clamped to it, and the
/// values the QP has are reported by query (QEMU: 1, which it forces on every RC QP).
#[test]
fn rd_atomic_is_clamped_to_what_the_device_does_and_reported() {
    // (device caps (max_qp_rd_atom, max_qp_init_rd_atom), asked, (max_rd_atomic,
    // max_dest_rd_atomic) the QP has)
    for (rd_atom, asked, want) in [
        ((0, 0), 1, (1, 1)),  // QEMU, rc_pingpong's 1
        ((0, 0), 16, (1, 1)), // QEMU: more is clamped to the 1 it applies
        ((0, 0), 0, (1, 1)),  // QEMU applies 1 whatever is asked
        ((4, 2), 16, (2, 4)), // a device that advertises limits: clamped to each
        ((4, 2), 1, (1, 1)),
    ] {
        let mut cfg = ModelConfig::default();
        cfg.caps.rd_atom = rd_atom;
        let model = Model::new(cfg);
        let ctx = up(&model);
        assert_eq!(
            (ctx.caps().max_qp_rd_atom, ctx.caps().max_qp_init_rd_atom),
            rd_atom
        );
        let g = ctx
            .bind_gid(
                0,
                Gid::link_local_from_mac([0x52, 0x54, 0, 0x12, 0x34, 0x57]),
            )
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let a = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
        let b = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
        let (qa, qb) = (a.qp_num(), b.qp_num());
        let a = pingpong_connect(a, qb, g.gid(), asked).unwrap();
        let b = pingpong_connect(b, qa, g.gid(), asked).unwrap();
        for qp in [&a, &b] {
            let q = qp.query().unwrap();
            assert_eq!(q.state, QpState::Rts);
            assert_eq!(
                (q.max_rd_atomic, q.max_dest_rd_atomic),
                want,
                "caps {rd_atom:?}, asked {asked}"
            );
        }
        drop((a, b));
        drop(cq);
        drop(pd);
        drop(g);
        teardown(&model, ctx);
    }
}

/// §5: on QEMU a QP that went beyond INIT cannot come back from RESET (QEMU only records
/// RESET; its host QP stays in RTS and refuses INIT with EIO). The driver says so, typed,
/// without asking the device; a QP reset from INIT can still be initialized again.
#[test]
fn reinit_after_reset_from_beyond_init_is_refused_before_the_device() {
    let refused = Error::Unsupported(bareverbs::error::Unsupported::Feature(
        bareverbs::error::Feature::ReinitAfterReset,
    ));
    let model = model();
    let ctx = up(&model);
    let g = ctx
        .bind_gid(
            0,
            Gid::link_local_from_mac([0x52, 0x54, 0, 0x12, 0x34, 0x57]),
        )
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();

    // RC: RTS, then RESET, then INIT.
    let a = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let b = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let (qa, qb) = (a.qp_num(), b.qp_num());
    let a = pingpong_connect(a, qb, g.gid(), 1).unwrap();
    let b = pingpong_connect(b, qa, g.gid(), 1).unwrap();
    let a = a.reset().unwrap();
    let commands = model.commands();
    let (a, e) = a.init(&ConnectedInit::default()).err().unwrap();
    assert_eq!(e, refused);
    assert_eq!(model.commands(), commands, "the device was not asked");
    assert_eq!(
        (a.state(), a.query().unwrap().state),
        (QpState::Reset, QpState::Reset)
    );

    // UD: the same after ready() (RTS).
    let ud = pd.qp_builder(&cq, &cq).build::<Ud>().unwrap();
    let ud = ud.ready(0x11, 0).unwrap();
    let ud = ud.reset().unwrap();
    let (ud, e) = ud.init(&DatagramInit::new(0x11)).err().unwrap();
    assert_eq!(e, refused);

    // From ERR (recorded only) after RTS: the host QP is still in RTS.
    let b = b.to_error().unwrap();
    let b = b.reset().unwrap();
    let (b, e) = b.init(&ConnectedInit::default()).err().unwrap();
    assert_eq!(e, refused);

    // A QP reset from INIT: its host QP is in INIT, which INIT again is legal from.
    let c = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
    let c = c.init(&ConnectedInit::default()).unwrap();
    let c = c.reset().unwrap();
    let c = c.init(&ConnectedInit::default()).unwrap();
    assert_eq!(c.query().unwrap().state, QpState::Init);

    drop((a, b, c, ud));
    drop(cq);
    drop(pd);
    drop(g);
    teardown(&model, ctx);
}

/// §4: `Context::caps()` (ibv_query_device) reports what creation accepts, under the rule
/// libibverbs users rely on: every value up to a reported limit can be created with the other
/// parameters at their minimum (1 work request, 1 SGE). QEMU's own numbers (max_cqe 28672,
/// max_qp_wr 10467, max_srq_wr 12288) ignore its 128-page ring limit; they stay available as
/// the device's raw caps.
#[test]
fn reported_caps_are_the_creatable_ones() {
    big_stack(|| {
        let mut cfg = ModelConfig::default();
        cfg.caps.max_mr_size = 4 << 30; // more than one page directory maps (1 GiB)
        let model = Model::new(cfg);
        let ctx = up(&model);
        let c = *ctx.caps();
        let raw = ctx.provider().device_caps();
        assert_eq!(
            (raw.max_qp_wr, raw.max_cqe, raw.max_srq_wr, raw.max_mr_size),
            (10467, 28672, 12288, 4 << 30)
        );
        assert_eq!(
            (c.max_qp_wr, c.max_cqe, c.max_srq_wr, c.max_mr_size),
            (4096, 4096, 8192, 1 << 30)
        );
        assert_eq!(
            (c.max_qp, c.max_sge, c.max_cq, c.max_srq_sge),
            (1024, 4, 2048, 4)
        );

        let pd = ctx.alloc_pd().unwrap();
        // CQs: every size up to max_cqe, nothing beyond.
        for n in [1, 100, 4095, c.max_cqe] {
            drop(ctx.create_cq(n).unwrap());
        }
        assert!(matches!(
            ctx.create_cq(c.max_cqe + 1),
            Err(Error::InvalidInput { .. })
        ));
        // Each QP reserves a CQE for every request it can have outstanding: one CQ for sends,
        // one for receives.
        let (cq, rcq) = (
            ctx.create_cq(c.max_cqe).unwrap(),
            ctx.create_cq(c.max_cqe).unwrap(),
        );
        // QPs: max_qp_wr send or receive WRs at 1 SGE.
        let w = |s, r| QpCaps {
            max_send_wr: s,
            max_recv_wr: r,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        for caps in [
            w(c.max_qp_wr, 1),
            w(1, c.max_qp_wr),
            w(c.max_qp_wr, c.max_qp_wr),
        ] {
            let qp = pd.qp_builder(&cq, &rcq).caps(caps).build::<Rc>();
            assert_eq!(qp.map(|q| q.caps()), Ok(caps));
        }
        assert!(matches!(
            pd.qp_builder(&cq, &rcq)
                .caps(w(c.max_qp_wr + 1, 1))
                .build::<Rc>(),
            Err(Error::InvalidInput { .. })
        ));
        // SRQs: max_srq_wr at 1 SGE.
        let srq = pd.create_srq(SrqAttr {
            max_wr: c.max_srq_wr,
            max_sge: 1,
            srq_limit: 0,
        });
        assert_eq!(srq.map(|s| s.attr().max_wr).ok(), Some(c.max_srq_wr));
        assert!(matches!(
            pd.create_srq(SrqAttr {
                max_wr: c.max_srq_wr + 1,
                max_sge: 1,
                srq_limit: 0,
            }),
            Err(Error::InvalidInput { .. })
        ));
        drop((cq, rcq));
        drop(pd);
        teardown(&model, ctx);
    });
}

/// §7: `.cargo/config.toml`'s runner (`qemu/runner.sh`: boots the unikernel, execs everything
/// else) must not take over under Miri. `cargo miri` builds stand-ins (JSON files) instead of
/// executables and registers itself, with the argument `runner`, as the runner for
/// `cfg(all())` — which a runner keyed on the host triple outranks — so the script exec'd the
/// stand-ins (exit 126). Simulated here as cargo-miri sets up cargo (its runner setting, an
/// explicit `--target`, itself as the rustc wrapper, `MIRI_LOCAL_CRATES`), with a stand-in
/// cargo-miri that passes compiler calls through and, as a runner, only says it was chosen.
#[test]
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[cfg_attr(miri, ignore = "runs cargo")]
fn the_unikernel_runner_hands_over_to_cargo_miri() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("miri-runner-check");
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("cargo-miri");
    std::fs::write(
        &fake,
        "#!/bin/sh\nif [ \"$1\" = runner ]; then echo \"miri-runner-chosen $2\"; exit 0; fi\nexec \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["test", "--offline", "-q", "-p", "bareverbs-hal", "--lib"])
        .args(["--target", "x86_64-unknown-linux-gnu", "--target-dir"])
        .arg(dir.join("target"))
        .arg("--config")
        .arg(format!(
            "target.'cfg(all())'.runner=['{}', 'runner']",
            fake.display()
        ))
        .env("RUSTC_WRAPPER", &fake)
        .env("MIRI_LOCAL_CRATES", "bareverbs-hal")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .output()
        .expect("cargo runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("miri-runner-chosen") && stdout.contains("bareverbs_hal-"),
        "another runner ran the test binary:\n{stdout}\n{stderr}"
    );
}

/// Found by the fuzzer: a send WQE naming a GID that is no longer (or never was) bound makes
/// QEMU loop forever on it (§8.6, §14). The binding of an RTS QP's source GID dropped, and an
/// address handle made before its GID was unbound: both sends are refused before the ring.
#[test]
fn a_send_from_an_unbound_gid_is_refused_before_the_ring() {
    let model = model();
    let ctx = up(&model);
    {
        let g = Gid::link_local_from_mac([2, 0, 0, 0, 0, 9]);
        let binding = ctx.bind_gid(0, g).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let sge = mr.sge(0, 8).unwrap();
        let a = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
        let qpn = a.qp_num();
        let mut a = pingpong_connect(a, qpn, g, 0).unwrap();
        let ud = pd.qp_builder(&cq, &cq).build::<Ud>().unwrap();
        let mut ud = ud.ready(0x11, 0).unwrap();
        let ah = pd.create_ah(&AddressVector::new(g, 0)).unwrap();
        // A made-up source GID index is refused when the address handle is made.
        assert!(matches!(
            pd.create_ah(&AddressVector::new(g, 7)),
            Err(Error::InvalidInput { .. })
        ));
        binding.unbind().unwrap();
        let unbound = Error::MissingAttribute {
            op: Op::PostSend,
            attr: Attr::SourceGid,
        };
        // SAFETY: `mr` outlives the QPs; nothing is posted anyway.
        unsafe {
            let mut b = a.send_batch();
            assert_eq!(b.send(1, SendFlags::SIGNALED, &[sge]), Err(unbound));
            b.finish();
            let mut b = ud.send_batch();
            assert_eq!(
                b.send_to(2, SendFlags::SIGNALED, (&ah, qpn, 0x11), &[sge]),
                Err(unbound)
            );
            b.finish();
        }
        let mut wc = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut wc), Ok(0), "nothing reached the device");
        assert_eq!(model.counters().1, 0, "no send WQE executed: no CQE");
        drop((a, ud));
    }
    teardown(&model, ctx);
}

/// A poll in progress on a CQ (a live cursor) while one of its QPs is put in ERROR or
/// destroyed, on the same thread: the driver needs the CQ's poll lock for that and must not
/// spin on it forever. It answers Busy, hands the QP back unchanged, and works once the
/// cursor is gone.
#[test]
fn a_qp_change_during_a_poll_of_its_cq_is_busy_not_a_deadlock() {
    let model = model();
    let ctx = up(&model);
    {
        let g = Gid::link_local_from_mac([2, 0, 0, 0, 0, 8]);
        let _binding = ctx.bind_gid(0, g).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let a = pd.qp_builder(&cq, &cq).build::<Rc>().unwrap();
        let qpn = a.qp_num();
        let mut a = pingpong_connect(a, qpn, g, 0).unwrap();
        // A completion in the CQ, so that a cursor exists.
        // SAFETY: `mr` outlives the QP.
        unsafe {
            a.post_recv_raw(1, &[mr.sge(0, 64).unwrap()]).unwrap();
            let mut b = a.send_batch();
            b.send(2, SendFlags::SIGNALED, &[mr.sge(64, 8).unwrap()])
                .unwrap();
            b.finish();
        }
        let cursor = cq.start_poll().unwrap().expect("a completion");
        let busy = |op| Error::Busy { op };
        let (a, e) = a.to_error().expect_err("refused while polled");
        assert_eq!(e, busy(Op::ModifyQp));
        let (a, e) = a.destroy().expect_err("refused while polled");
        assert_eq!(e, busy(Op::DestroyQp));
        assert_eq!(a.query().unwrap().state, QpState::Rts, "unchanged");
        drop(cursor);
        let a = a.to_error().unwrap();
        a.destroy().unwrap();
        let mut wc = [WorkCompletion::default(); 4];
        while cq.poll(&mut wc).unwrap() > 0 {}
    }
    teardown(&model, ctx);
}
