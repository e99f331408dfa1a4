//! Probe and bring-up of a PVRDMA on the device model: what the driver accepts and refuses,
//! the shared region it writes (byte for byte), the capabilities it reads back.

mod common;

use bareverbs::device::pvrdma::{self, Pvrdma};
use bareverbs::error::{DeviceStatus, Fault, NotFound, Op, Unsupported};
use bareverbs::hal::PciAddress;
use bareverbs::verbs::{Mtu, PortState};
use bareverbs::{Error, pci};
use bareverbs_model::{CapsConfig, Fn0, Model, ModelConfig};
use common::*;

fn probe_with(cfg: ModelConfig) -> (Model, Result<Pvrdma<Model>, Error>) {
    let model = Model::new(cfg);
    let r = Pvrdma::probe(model.clone(), &model, CONFIG);
    (model, r)
}

/// A refused probe leaves nothing allocated and nothing QEMU would mind.
fn refused(cfg: ModelConfig) -> Error {
    let (model, r) = probe_with(cfg);
    let e = r.err().expect("probe must fail");
    assert_eq!(model.outstanding_pages(), 0, "{e:?}: DMA pages leaked");
    assert_clean(&model);
    e
}

#[test]
fn scan_lists_every_function_in_address_order() {
    let model = model();
    let found: Vec<_> = pci::scan(&model)
        .map(|f| {
            let a = f.address;
            (
                (a.bus(), a.device(), a.function()),
                f.vendor,
                f.device,
                f.class,
            )
        })
        .collect();
    assert_eq!(
        found,
        vec![
            ((0, 0, 0), 0x8086, 0x29C0, (6, 0, 0)),
            ((0, 0x10, 0), 0x15AD, 0x07B0, (2, 0, 0)),
            ((0, 0x10, 1), 0x15AD, 0x0820, (2, 0x80, 0)),
        ]
    );
}

#[test]
fn bars_are_sized_with_decoding_off_and_left_in_place() {
    let model = model();
    let before = model.bar_addresses();
    let bars = pci::size_bars(&model, PciAddress::new(0, 0, 0x10, 1)).unwrap();
    assert_eq!(
        bars[1],
        Some(pci::Bar::Memory {
            address: 0xFEB4_4000,
            size: 0x100,
            is_64bit: false,
            prefetchable: false
        })
    );
    assert_eq!(
        bars[2],
        Some(pci::Bar::Memory {
            address: 0xFE00_0000,
            size: 0x80_0000,
            is_64bit: false,
            prefetchable: false
        })
    );
    assert_eq!(bars[3], None);
    assert_eq!(model.bar_addresses(), before);
    assert_clean(&model);
}

#[test]
fn sixty_four_bit_bar2_is_decoded() {
    let cfg = ModelConfig {
        bar2_64bit: true,
        ..Default::default()
    };
    let bars = pci::size_bars(&Model::new(cfg), PciAddress::new(0, 0, 0x10, 1)).unwrap();
    assert_eq!(
        bars[2],
        Some(pci::Bar::Memory {
            address: 0x80_0000_0000,
            size: 0x80_0000,
            is_64bit: true,
            prefetchable: false
        })
    );
    assert_eq!(bars[3], None, "the upper half is not a BAR of its own");

    let (model, dev) = probe_with(cfg);
    let dev = dev.expect("probe with a 64-bit UAR BAR");
    let dsr = model.dsr_as_written().unwrap();
    assert_eq!(&dsr[0x40..0x48], &(0x80_0000_0000u64 >> 12).to_le_bytes());
    teardown(&model, bareverbs::Context::new(dev));
}

#[test]
fn probe_brings_the_device_up_and_enables_mmio_and_dma() {
    let model = model();
    let ctx = up(&model);
    assert!(model.active());
    assert_eq!(model.pci_command() & 0x6, 0x6, "memory space + bus master");
    assert_eq!(
        model.reg(0x1C),
        u32::MAX,
        "interrupts masked: the driver polls"
    );
    assert_eq!(ctx.provider().version(), 17);
    let a = ctx.provider().pci_address();
    assert_eq!((a.bus(), a.device(), a.function()), (0, 0x10, 1));
    assert_eq!(model.outstanding_pages(), DEVICE_PAGES);
    assert_eq!(model.commands(), 0, "bring-up issues no command");
    teardown(&model, ctx);
}

#[test]
fn shared_region_matches_the_abi_byte_for_byte() {
    let model = model();
    let ctx = up(&model);
    let dsr = model.dsr_as_written().expect("DSR loaded");
    assert_eq!(dsr.len(), 280);
    let u64_at = |o: usize| u64::from_le_bytes(dsr[o..o + 8].try_into().unwrap());
    let cmd = u64_at(0x10);
    let async_pdir = u64_at(0x28);
    let cq_pdir = u64_at(0x38);

    // The expected region, field by field from docs/pvrdma.md §3.
    let mut want = vec![0u8; 280];
    want[0x00..0x04].copy_from_slice(&20u32.to_le_bytes()); // driver_version
    want[0x08..0x0C].copy_from_slice(&(2u32 | 1 << 2 | 1 << 6).to_le_bytes()); // gos_info
    want[0x10..0x18].copy_from_slice(&cmd.to_le_bytes());
    want[0x18..0x20].copy_from_slice(&(cmd + 2048).to_le_bytes()); // response slot
    want[0x20..0x24].copy_from_slice(&2u32.to_le_bytes()); // async ring pages
    want[0x28..0x30].copy_from_slice(&async_pdir.to_le_bytes());
    want[0x30..0x34].copy_from_slice(&2u32.to_le_bytes()); // CQ-notification ring pages
    want[0x38..0x40].copy_from_slice(&cq_pdir.to_le_bytes());
    want[0x40..0x48].copy_from_slice(&(0xFE00_0000u64 >> 12).to_le_bytes()); // uar_pfn
    // caps (0x48..0x118): left zero for the device to fill.
    assert_eq!(dsr, want);

    // The addresses are real: page-aligned allocated memory, the DSR itself above 4 GiB.
    assert!(
        model.dsr_paddr().unwrap() >> 32 != 0,
        "DSRHIGH carried the high half"
    );
    assert_eq!(cmd % 4096, 0);
    assert!(model.is_allocated(cmd));
    let mut ring_pages = Vec::new();
    for pdir in [async_pdir, cq_pdir] {
        assert!(pdir != 0 && pdir % 4096 == 0);
        let dir = model.read_phys(pdir, 4096).unwrap();
        let table = u64::from_le_bytes(dir[0..8].try_into().unwrap());
        assert!(dir[8..].iter().all(|&b| b == 0), "one table is enough");
        let t = model.read_phys(table, 4096).unwrap();
        for i in 0..2 {
            let pa = u64::from_le_bytes(t[i * 8..i * 8 + 8].try_into().unwrap());
            assert!(model.is_allocated(pa) && pa % 4096 == 0);
            ring_pages.push(pa);
        }
        assert!(t[16..].iter().all(|&b| b == 0), "exactly num_pages entries");
    }
    ring_pages.sort();
    ring_pages.dedup();
    assert_eq!(ring_pages.len(), 4, "distinct ring pages");
    teardown(&model, ctx);
}

#[test]
fn capabilities_read_back_equal_the_devices() {
    let model = model();
    let ctx = up(&model);
    // What the device reports (Context::caps is the creatable subset: tests/contract.rs).
    let c = ctx.provider().device_caps();
    let m = CapsConfig::default();
    assert_eq!(c.fw_ver, 14);
    // EUI-64 of 52:54:00:12:34:57, in memory order.
    assert_eq!(
        c.node_guid.to_le_bytes(),
        [0x50, 0x54, 0x00, 0xFF, 0xFE, 0x12, 0x34, 0x57]
    );
    assert_eq!(c.sys_image_guid, 0);
    assert_eq!(c.max_mr_size, m.max_mr_size);
    assert_eq!(
        (c.max_qp, c.max_qp_wr, c.max_sge, c.max_cq, c.max_cqe),
        (1024, 10467, 4, 2048, 28672)
    );
    assert_eq!((c.max_mr, c.max_pd, c.max_ah), (1024, 1024, 64));
    assert_eq!((c.max_srq, c.max_srq_wr, c.max_srq_sge), (512, 12288, 4));
    assert_eq!((c.gid_tbl_len, c.max_pkeys, c.phys_port_cnt), (255, 1, 1));
    assert_eq!((c.max_qp_rd_atom, c.atomic_ops, c.max_mcast_grp), (0, 0, 0));
    assert_eq!(
        ctx.provider().max_cq_entries(),
        4096,
        "QEMU's 128-page ring limit"
    );
    teardown(&model, ctx);
}

#[test]
fn port_and_pkey_queries() {
    let model = model();
    let ctx = up(&model);
    let p = ctx.query_port(1).unwrap();
    assert_eq!(p.state, PortState::Active);
    assert_eq!((p.max_mtu, p.active_mtu), (Mtu::Mtu4096, Mtu::Mtu1024));
    assert_eq!(
        (p.gid_tbl_len, p.max_msg_sz, p.pkey_tbl_len),
        (255, 1024, 1)
    );
    assert_eq!((p.active_width, p.active_speed, p.phys_state), (1, 1, 5));
    assert_eq!(ctx.query_pkey(1, 0), Ok(0xFFFF));
    let bad_port = |port: u8| Error::InvalidInput {
        param: bareverbs::error::Param::Port,
        value: u64::from(port),
        max: 1,
    };
    assert_eq!(ctx.query_port(0), Err(bad_port(0)));
    assert_eq!(ctx.query_port(2), Err(bad_port(2)));
    assert!(matches!(
        ctx.query_pkey(1, 1),
        Err(Error::InvalidInput { max: 0, .. })
    ));
    assert_eq!(
        model.commands(),
        2,
        "invalid queries never reach the device"
    );
    teardown(&model, ctx);

    let model = Model::new(ModelConfig {
        port_active: false,
        ..Default::default()
    });
    let ctx = up(&model);
    assert_eq!(ctx.query_port(1).unwrap().state, PortState::Down);
    teardown(&model, ctx);
}

#[test]
fn refuses_a_missing_paired_function() {
    for fn0 in [Fn0::Other, Fn0::Absent] {
        let e = refused(ModelConfig {
            fn0,
            ..Default::default()
        });
        assert_eq!(e, Error::NotFound(NotFound::PairedFunction), "{fn0:?}");
    }
}

#[test]
fn refuses_versions_it_does_not_speak() {
    for version in [0, 16, 21, 0xFFFF_FFFF] {
        let e = refused(ModelConfig {
            version,
            ..Default::default()
        });
        assert_eq!(e, Error::Unsupported(Unsupported::DeviceVersion(version)));
    }
    // 18 (RoCEv2) with RoCEv2 GIDs is spoken.
    let mut cfg = ModelConfig {
        version: 18,
        ..Default::default()
    };
    cfg.caps.gid_types = 2;
    let (model, dev) = probe_with(cfg);
    teardown(&model, bareverbs::Context::new(dev.expect("version 18")));
}

#[test]
fn refuses_a_mode_other_than_roce() {
    for mode in [1, 2] {
        let mut cfg = ModelConfig::default();
        cfg.caps.mode = mode;
        assert_eq!(
            refused(cfg),
            Error::Unsupported(Unsupported::TransportMode(mode))
        );
    }
}

#[test]
fn refuses_gid_types_that_do_not_fit_the_version() {
    let mut cfg = ModelConfig::default();
    cfg.caps.gid_types = 2; // ORed with nothing: version 17 must say RoCEv1 only
    assert_eq!(refused(cfg), Error::Unsupported(Unsupported::GidTypes(2)));
}

#[test]
fn a_shared_region_the_device_did_not_load_is_an_error() {
    let e = refused(ModelConfig {
        refuse_dsr: true,
        ..Default::default()
    });
    assert_eq!(
        e,
        Error::Device {
            op: Op::LoadSharedRegion,
            status: DeviceStatus::Rejected
        }
    );
}

#[test]
fn activation_must_leave_err_zero() {
    let e = refused(ModelConfig {
        activate_err: 0xFFFF_FFEA,
        ..Default::default()
    });
    assert_eq!(
        e,
        Error::Device {
            op: Op::Activate,
            status: DeviceStatus::NotActive(0xFFFF_FFEA)
        }
    );
}

#[test]
fn unusable_capabilities_are_refused_not_trusted() {
    for field in &[
        "max_sge",
        "max_qp",
        "max_cqe",
        "gid_tbl_len",
        "phys_port_cnt",
    ] {
        let mut cfg = ModelConfig::default();
        match *field {
            "max_sge" => cfg.caps.max_sge = 0,
            "max_qp" => cfg.caps.max_qp = 0,
            "max_cqe" => cfg.caps.max_cqe = 0,
            "gid_tbl_len" => cfg.caps.gid_tbl_len = 0,
            _ => cfg.caps.phys_port_cnt = 0,
        }
        assert_eq!(
            refused(cfg),
            Error::Protocol {
                op: Op::LoadSharedRegion,
                fault: Fault::Value { field, value: 0 }
            }
        );
    }
}

#[test]
fn new_at_an_address_without_the_device_is_not_found() {
    let model = model();
    let r = Pvrdma::new(model.clone(), &model, PciAddress::new(0, 0, 0, 0), CONFIG);
    assert_eq!(r.err(), Some(Error::NotFound(NotFound::Device)));
    assert_eq!(
        pvrdma::find(&model).map(|a| (a.device(), a.function())),
        Some((0x10, 1))
    );
    assert_eq!(model.outstanding_pages(), 0);
}

#[test]
fn dma_exhaustion_at_each_bring_up_allocation_leaks_nothing() {
    // Count the allocations of a clean bring-up, then fail each one in turn.
    let model = model();
    let ctx = up(&model);
    let allocs = model.dma_allocs();
    teardown(&model, ctx);
    assert_eq!(
        allocs, 3,
        "command page, QP table, DSR block (with both notification rings, their directories \
         and the event state)"
    );
    for nth in 1..=allocs {
        let model = self::model();
        model.fail_dma_alloc(nth);
        let r = Pvrdma::probe(model.clone(), &model, CONFIG);
        assert!(
            matches!(
                r,
                Err(Error::Resource(bareverbs::error::Resource::Dma { .. }))
            ),
            "allocation {nth}: {:?}",
            r.err()
        );
        assert_eq!(model.outstanding_pages(), 0, "allocation {nth}");
        assert_clean(&model);
    }
}
