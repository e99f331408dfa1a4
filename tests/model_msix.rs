//! The device model's MSI-X function and async ring, as QEMU's `msix.c` and `pvrdma_main.c`
//! behave (`docs/pvrdma.md` §1, §2, §10.4, §13.3, §13.6): the ground
//! the driver's interrupt support is tested on. The test programs the function itself, as a
//! driver would, through the machine's configuration space and BAR mappings.

mod common;

use bareverbs::hal::{ConfigRegionAccess, Hal, Mmio, PciAddress};
use bareverbs::verbs::*;
use bareverbs_model::Model;
use common::*;

type Qp<'a, S> = QueuePair<'a, bareverbs::device::pvrdma::Pvrdma<Model>, Rc, S>;

fn connect<'a>(qp: Qp<'a, Reset>, peer: u32, gid: Gid) -> Qp<'a, Rts> {
    rc_up(qp, peer, gid, AccessFlags::empty())
}

fn pvrdma() -> PciAddress {
    PciAddress::new(0, 0, 0x10, 1)
}
const IMR: usize = 0x1C;

fn cfg(model: &Model, off: u16) -> u32 {
    // SAFETY: the model's configuration space; reads have no side effect.
    unsafe { model.read(pvrdma(), off) }
}

fn set_cfg(model: &Model, off: u16, v: u32) {
    // SAFETY: the model's configuration space.
    unsafe { model.write(pvrdma(), off, v) }
}

/// BAR0 (the MSI-X table and PBA) and BAR1 (the registers), mapped.
fn bars(model: &Model) -> (impl Mmio, impl Mmio) {
    let bar0 = u64::from(cfg(model, 0x10) & !0xF);
    let bar1 = u64::from(cfg(model, 0x14) & !0xF);
    // SAFETY: the model's own BARs, mapped at their programmed addresses.
    unsafe {
        (
            model.map_mmio(bar0, 0x4000).expect("BAR0"),
            model.map_mmio(bar1, 0x100).expect("BAR1"),
        )
    }
}

/// Entry `v`: address 0xFEE0_0000, data 0x30 + v, masked as `masked`.
fn program(bar0: &impl Mmio, v: usize, masked: bool) {
    bar0.write32(v * 16 + 12, 1);
    bar0.write32(v * 16, 0xFEE0_0000);
    bar0.write32(v * 16 + 4, 0);
    bar0.write32(v * 16 + 8, 0x30 + v as u32);
    bar0.write32(v * 16 + 12, u32::from(masked));
}

/// Writes Message Control's Enable and Function Mask bits (the dword keeps ID and next).
fn control(model: &Model, enable: bool, function_mask: bool) {
    let dword = cfg(model, 0x40);
    let bits = u32::from(enable) << 31 | u32::from(function_mask) << 30;
    set_cfg(model, 0x40, (dword & !0xC000_0000) | bits);
}

#[test]
fn the_capability_is_msix_with_three_entries_in_bar0() {
    let model = model();
    assert_ne!(cfg(&model, 0x04) & (1 << 20), 0, "status: capability list");
    assert_eq!(cfg(&model, 0x34) & 0xFF, 0x40);
    assert_eq!(cfg(&model, 0x40), 0x0002_0011, "ID 0x11, last, 3 entries");
    assert_eq!((cfg(&model, 0x44), cfg(&model, 0x48)), (0, 0x2000));
    // The table size and ID are read-only; Enable and Function Mask are not.
    set_cfg(&model, 0x40, 0xFFFF_FFFF);
    assert_eq!(cfg(&model, 0x40), 0xC002_0011);
    let ctx = up(&model);
    let (bar0, _) = bars(&model);
    for v in 0..3 {
        assert_eq!(bar0.read32(v * 16 + 12), 1, "entries reset masked");
    }
    bar0.write32(0, 0xFEE0_0003);
    assert_eq!(bar0.read32(0), 0xFEE0_0000, "address bits 1:0 read as zero");
    teardown(&model, ctx);
}

#[test]
fn a_vector_raised_under_imr_is_dropped_not_held() {
    let model = model();
    let ctx = up(&model); // the polling driver leaves IMR = ~0
    let (bar0, _) = bars(&model);
    (0..3).for_each(|v| program(&bar0, v, false));
    control(&model, true, false);
    let (_, dropped_before, _) = model.msix_stats();
    let pd = ctx.alloc_pd().unwrap();
    assert!(model.take_msi().is_empty());
    let (pending, dropped, _) = model.msix_stats();
    assert_eq!((pending, dropped), (0, dropped_before + 1));
    drop(pd);
    teardown(&model, ctx);
}

#[test]
fn every_command_raises_vector_0_and_masking_holds_it_pending() {
    let model = model();
    let ctx = up(&model);
    let (bar0, bar1) = bars(&model);
    (0..3).for_each(|v| program(&bar0, v, false));
    bar1.write32(IMR, 0);
    // Disabled: pending, nothing sent; enabling sends it once.
    let pd = ctx.alloc_pd().unwrap();
    assert_eq!(model.msix_stats().0, 0b001);
    assert!(model.take_msi().is_empty());
    control(&model, true, false);
    assert_eq!(model.take_msi(), vec![(0xFEE0_0000, 0x30)]);
    assert_eq!(bar0.read32(0x2000), 0, "PBA cleared");
    // Enabled: each command sends at once, failed ones too.
    let pd2 = ctx.alloc_pd().unwrap();
    assert_eq!(model.take_msi(), vec![(0xFEE0_0000, 0x30)]);
    model.reject_next();
    assert!(ctx.alloc_pd().is_err());
    assert_eq!(
        model.take_msi().len(),
        1,
        "a refused command interrupts too"
    );
    // Function mask: pending until cleared.
    control(&model, true, true);
    drop(pd2);
    assert!(model.take_msi().is_empty());
    assert_eq!(model.msix_stats().0, 0b001);
    control(&model, true, false);
    assert_eq!(model.take_msi(), vec![(0xFEE0_0000, 0x30)]);
    // Entry mask: pending until the entry is unmasked.
    bar0.write32(12, 1);
    drop(pd);
    assert!(model.take_msi().is_empty());
    assert_eq!(bar0.read32(0x2000), 0b001);
    bar0.write32(12, 0);
    assert_eq!(model.take_msi(), vec![(0xFEE0_0000, 0x30)]);
    bar1.write32(IMR, !0);
    teardown(&model, ctx);
}

#[test]
fn bus_mastering_off_drops_the_message() {
    let model = model();
    let ctx = up(&model);
    let (bar0, bar1) = bars(&model);
    program(&bar0, 0, false);
    control(&model, true, false);
    bar1.write32(IMR, 0);
    let command = cfg(&model, 0x04) & 0xFFFF;
    set_cfg(&model, 0x04, command & !0x4);
    model.post_async(9, 1); // no vector 1 entry programmed: held in the PBA
    let pd = ctx.alloc_pd(); // the command itself runs; its message is lost
    set_cfg(&model, 0x04, command);
    assert!(model.take_msi().is_empty());
    assert_eq!(model.msix_stats().2, 1);
    drop(pd);
    bar1.write32(IMR, !0);
    drop(ctx);
    // The model flags the command run with bus mastering off; only the message is checked.
    assert_eq!(model.outstanding_pages(), 0);
}

#[test]
fn an_armed_cq_raises_vector_2_once_and_async_events_vector_1() {
    let model = model();
    let ctx = up(&model);
    let (bar0, bar1) = bars(&model);
    (0..3).for_each(|v| program(&bar0, v, false));
    control(&model, true, false);
    {
        let g = ctx
            .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let pool = pd.buffer_pool(4, 64).unwrap();
        let rc = || pd.qp_builder(&cq, &cq).pool(&pool).build::<Rc>().unwrap();
        let (a, b) = (rc(), rc());
        let (qa, qb) = (a.qp_num(), b.qp_num());
        let (mut a, mut b) = (connect(a, qb, g.gid()), connect(b, qa, g.gid()));
        bar1.write32(IMR, 0);
        let _ = model.take_msi();
        let mut one = |arm: bool| {
            if arm {
                cq.req_notify(false).expect("arm");
            }
            b.post_recv(1, pool.alloc().unwrap()).unwrap();
            a.post_send(2, pool.alloc().unwrap()).unwrap();
            drop(b.poll_one().unwrap().expect("receive"));
            drop(a.poll_one().unwrap().expect("send"));
            model.take_msi()
        };
        assert!(one(false).is_empty(), "not armed: no interrupt");
        assert_eq!(
            one(true),
            vec![(0xFEE0_0000, 0x32)],
            "armed: one, for two CQEs"
        );
        assert!(one(false).is_empty(), "firing disarmed it");
        bar1.write32(IMR, !0);
    }
    // Async events: 8-byte elements, one data page (the driver's 2-page ring): 512 slots.
    bar1.write32(IMR, 0);
    let _ = model.take_msi();
    assert!(model.post_async(9, 1));
    assert_eq!(model.take_msi(), vec![(0xFEE0_0000, 0x31)]);
    for _ in 1..512 {
        assert!(model.post_async(10, 1));
    }
    assert!(!model.post_async(9, 1), "the 513th finds the ring full");
    assert_eq!(model.async_events(), 512);
    bar1.write32(IMR, !0);
    teardown(&model, ctx);
}

#[test]
fn an_msix_table_over_the_registers_or_the_doorbells_is_refused() {
    for (bir, offset) in [(1u8, 0u32), (1, 0x20), (2, 0), (2, 0x800)] {
        let model = common::model();
        model.set_msix_table(bir, offset);
        let config = bareverbs::device::pvrdma::Config {
            interrupts: true,
            ..CONFIG
        };
        let r = bareverbs::device::pvrdma::Pvrdma::probe(model.clone(), &model, config);
        let e = r
            .err()
            .unwrap_or_else(|| panic!("table in BAR{bir} at {offset:#x} accepted"));
        assert!(
            matches!(e, bareverbs::Error::Protocol { .. }),
            "BAR{bir} at {offset:#x}: {e:?}"
        );
        assert_eq!(model.outstanding_pages(), 0, "BAR{bir} at {offset:#x}");
        assert!(!model.active());
    }
}
