//! The HAL's Intel links (`hal/src/intel`, `igb`, `e1000e`) over the register-level NIC models
//! of `bareverbs-model` (`model/src/intel`): bring-up as the links program the NICs (MAC from
//! receive address 0, rings, receiver and transmitter, link), two software RoCE devices
//! exchanging WRITE, SEND and READ through an igb pair and an e1000e pair with every byte
//! checked, the multicast filter, MSI-X, and hostile NICs: a reset that never completes,
//! register reads that lie, descriptor write-backs with forged lengths and status — each a
//! typed error or a counted refusal, never a panic, never memory the link does not own.

mod common;
mod mw_common;
mod pair;

use bareverbs::Context;
use bareverbs::device::rxe::{Config, Rxe};
use bareverbs::hal::{Link, LinkError, MsiMessage};
use bareverbs::verbs::*;
use bareverbs_hal::e1000e::I82574;
use bareverbs_hal::igb::I82576;
use bareverbs_hal::intel::{Family, IntelError, IntelNic, MAX_FRAME};
use bareverbs_model::intel::{NicHostile, NicModel, Wire};
use bareverbs_model::link::TestClock;
use bareverbs_model::{Model, ModelConfig};
use mw_common::*;
use pair::{Ends, IP_A, IP_B};

type Nic<F> = IntelNic<NicModel, F>;
type Dev<F> = Rxe<Model, Nic<F>, TestClock>;

const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0x12, 0, 2];
const MAC_B: [u8; 6] = [0x52, 0x54, 0, 0x12, 0, 3];

fn make(family: &str, wire: &Wire, mac: [u8; 6]) -> NicModel {
    match family {
        "igb" => NicModel::igb(wire, mac),
        _ => NicModel::e1000e(wire, mac),
    }
}

/// A NIC model and the link brought up on it, its link up.
fn bring_up<F: Family>(wire: &Wire, mac: [u8; 6]) -> (NicModel, Nic<F>) {
    let m = make(F::NAME, wire, mac);
    // SAFETY: the model's function at its address is this link's alone; the model maps BAR 0.
    let nic = unsafe { Nic::<F>::new(m.clone(), &m, NicModel::address()) }.expect("bring-up");
    nic.wait_link(100).expect("link up");
    (m, nic)
}

/// Runs `f` on two rxe devices over a pair of NICs of family `F`; then checks that every page
/// came back and the NICs were never asked to reach memory the links do not own.
fn on_nics<F: Family, T>(f: impl FnOnce(&Ends<'_, Dev<F>>, &NicModel) -> T) -> T {
    let model = Model::new(ModelConfig::default());
    let wire = Wire::new();
    let ((ma, la), (mb, lb)) = (bring_up::<F>(&wire, MAC_A), bring_up::<F>(&wire, MAC_B));
    assert_eq!(
        (la.mac(), lb.mac()),
        (MAC_A, MAC_B),
        "from receive address 0"
    );
    let clk = TestClock::default();
    let a = Context::new(Rxe::new(model.clone(), la, clk.clone(), Config { ip: IP_A }).unwrap());
    let b = Context::new(Rxe::new(model.clone(), lb, clk.clone(), Config { ip: IP_B }).unwrap());
    let settle = || {
        for _ in 0..100 {
            clk.advance(100);
            a.process_events();
            b.process_events();
        }
    };
    let ends = Ends {
        a: &a,
        b: &b,
        to_b: AddressVector::new(Gid::from_ipv4(IP_B), 1),
        to_a: AddressVector::new(Gid::from_ipv4(IP_A), 1),
        settle: &settle,
    };
    let out = f(&ends, &ma);
    drop((a, b));
    assert_eq!(model.outstanding_pages(), 0, "rxe: DMA pages leaked");
    for m in [&ma, &mb] {
        assert_eq!(m.outstanding_pages(), 0, "{}: the link's pages", m.name());
        assert_eq!(m.violations(), Vec::<String>::new());
        assert!(m.counters().resets >= 2, "reset at bring-up and at drop");
    }
    out
}

/// WRITE, SEND and READ of a few KiB each (several packets at MTU 1024), bytes checked.
fn traffic<F: Family>() {
    on_nics::<F, _>(|e, ma| {
        let (pa, pb) = (e.a.alloc_pd().unwrap(), e.b.alloc_pd().unwrap());
        let (ca, cb) = (e.a.create_cq(64).unwrap(), e.b.create_cq(64).unwrap());
        let (mut qa, mut qb) = pair(e, (&pa, &ca), (&pb, &cb));
        let remote = pb
            .register(16384, AccessFlags::LOCAL_WRITE | REMOTE)
            .unwrap();
        let mut local = pa.register(16384, AccessFlags::LOCAL_WRITE).unwrap();
        let pattern: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        local.as_mut_slice()[..5000].copy_from_slice(&pattern);

        write(
            &mut qa,
            1,
            (remote.addr() + 100, remote.rkey()),
            &local,
            5000,
        );
        let c = wait(e, &ca, 1);
        assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::Success));
        assert_eq!(&remote.as_slice()[100..5100], &pattern[..]);

        // SAFETY: the buffers are left alone until the completions are polled.
        unsafe {
            let mut r = qb.recv_batch();
            r.recv(7, &[remote.sge(8192, 4096).unwrap()]).unwrap();
            r.finish();
            let mut s = qa.send_batch();
            s.send(2, SIG, &[local.sge(1000, 3000).unwrap()]).unwrap();
            s.finish();
        }
        assert_eq!(wait(e, &ca, 1)[0].status, WcStatus::Success);
        let c = wait(e, &cb, 1);
        assert_eq!(
            (c[0].wr_id, c[0].status, c[0].byte_len),
            (7, WcStatus::Success, 3000)
        );
        assert_eq!(&remote.as_slice()[8192..11192], &pattern[1000..4000]);

        local.as_mut_slice().fill(0);
        read(
            &mut qa,
            3,
            (remote.addr() + 100, remote.rkey()),
            &local,
            5000,
        );
        let c = wait(e, &ca, 1);
        assert_eq!((c[0].wr_id, c[0].status), (3, WcStatus::Success));
        assert_eq!(&local.as_slice()[..5000], &pattern[..]);

        let n = ma.counters();
        assert!(n.rx_frames >= 5 && n.tx_frames >= 10, "{n:?}");
        assert_eq!(n.rx_missed, 0, "{n:?}");
    });
}

#[test]
fn rxe_write_send_read_over_igb() {
    traffic::<I82576>();
}

#[test]
fn rxe_write_send_read_over_e1000e() {
    traffic::<I82574>();
}

fn frame(dst: [u8; 6], src: [u8; 6], len: usize, fill: u8) -> Vec<u8> {
    let mut f = vec![fill; len];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x88B5u16.to_be_bytes());
    f
}

/// What bring-up programmed, as the NIC holds it, and the filter it built.
fn bring_up_and_filter<F: Family>(rx_tail: usize, rctl_expect: u32) {
    let wire = Wire::new();
    let (m, mut nic) = bring_up::<F>(&wire, MAC_A);
    assert_eq!(
        m.pci_command() & 0x6,
        0x6,
        "memory decoding and bus mastering"
    );
    assert_eq!(
        m.reg(0x0100),
        rctl_expect,
        "RCTL: on, broadcast, CRC stripped"
    );
    assert_eq!(
        m.reg(rx_tail),
        127,
        "every receive descriptor but one given"
    );
    assert_eq!(
        m.reg(0x5404),
        0x8000_0000 | 0x0200,
        "RAH0: valid, bytes 4 and 5"
    );
    assert_eq!(m.counters().resets, 1);

    let mut buf = [0u8; 2048];
    assert_eq!(nic.receive(&mut buf), None);
    wire.inject(&frame(MAC_A, MAC_B, 100, 0xAB));
    wire.inject(&frame([0xFF; 6], MAC_B, 42, 0xCD));
    wire.inject(&frame([0x52, 0, 0, 0, 0, 9], MAC_B, 64, 0xEE));
    let group = [0x01, 0x00, 0x5E, 0x00, 0x00, 0xFB];
    wire.inject(&frame(group, MAC_B, 64, 0x11));
    assert_eq!(nic.receive(&mut buf), Some(100));
    assert_eq!(buf[99], 0xAB);
    assert_eq!(
        nic.receive(&mut buf),
        Some(60),
        "padded to the minimum by the NIC"
    );
    assert_eq!(&buf[..6], &[0xFF; 6]);
    assert_eq!(
        nic.receive(&mut buf),
        None,
        "another station's and an unjoined group's"
    );
    assert_eq!(m.counters().rx_filtered, 2);
    nic.join_multicast(group);
    wire.inject(&frame(group, MAC_B, 64, 0x11));
    assert_eq!(nic.receive(&mut buf), Some(64), "the group joined");

    // A frame refused by the caller is dropped uncopied; one too long for the buffer too.
    wire.inject(&frame(MAC_A, MAC_B, 1514, 0x22));
    let mut small = [0u8; 16];
    assert_eq!(nic.receive_if(&mut small, |_| true), Some(None));
    wire.inject(&frame(MAC_A, MAC_B, 80, 0x33));
    assert_eq!(nic.receive_if(&mut buf, |f| f[14] == 0x44), Some(None));
    let s = nic.stats();
    assert_eq!((s.received, s.dropped), (3, 2), "{s:?}");

    // Transmit: built in place, padded; a full ring says Busy and sends nothing more.
    let other = make(F::NAME, &wire, MAC_B);
    assert_eq!(nic.transmit(&[]), Err(LinkError::Size));
    assert_eq!(nic.transmit(&vec![0; MAX_FRAME + 1]), Err(LinkError::Size));
    assert_eq!(nic.transmit_with(&mut [], |_| None), Ok(None));
    assert_eq!(
        nic.transmit_with(&mut [], |b| {
            b[..14].copy_from_slice(&frame(MAC_B, MAC_A, 14, 0)[..14]);
            Some(14)
        }),
        Ok(Some(14))
    );
    assert_eq!(m.counters().tx_frames, 1);
    drop(other);
    // Many frames: the model completes each at its tail write, so the ring never fills.
    for i in 0..500u32 {
        nic.transmit(&frame(MAC_B, MAC_A, 60 + (i as usize % 1400), i as u8))
            .unwrap();
    }
    assert_eq!(m.counters().tx_frames, 501);
    drop(nic);
    assert_eq!(m.outstanding_pages(), 0);
    assert_eq!(m.counters().resets, 2, "reset again before the memory went");
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

#[test]
fn igb_bring_up_filter_and_frames() {
    bring_up_and_filter::<I82576>(0xC018, 0x0400_8002);
}

#[test]
fn e1000e_bring_up_filter_and_frames() {
    bring_up_and_filter::<I82574>(0x2818, 0x0400_8002);
}

fn msix<F: Family>() {
    let wire = Wire::new();
    let (m, mut nic) = bring_up::<F>(&wire, MAC_A);
    wire.inject(&frame(MAC_A, MAC_B, 100, 1));
    assert!(m.take_msi().is_empty(), "no interrupt before routing");
    let msg = MsiMessage {
        address: 0xFEE0_1000,
        data: 0x41,
    };
    // SAFETY: the model's function, whose MSI-X BAR the model maps.
    unsafe { nic.route_interrupts(&m, msg) }.unwrap();
    wire.inject(&frame(MAC_A, MAC_B, 100, 2));
    assert_eq!(m.take_msi(), vec![(0xFEE0_1000, 0x41)], "a frame arrived");
    nic.transmit(&frame(MAC_B, MAC_A, 60, 3)).unwrap();
    assert_eq!(m.take_msi(), vec![(0xFEE0_1000, 0x41)], "a frame went");
    // A frame that comes while the driver is busy, after the message: on the 82574 the
    // message masked its cause (QEMU 8.0 and later), so it is announced when the link, finding
    // the ring empty, enables the cause again; igb announces it at once.
    wire.inject(&frame(MAC_A, MAC_B, 100, 4));
    let mut buf = [0u8; 2048];
    for _ in 0..3 {
        assert_eq!(nic.receive(&mut buf), Some(100));
    }
    assert_eq!(nic.receive(&mut buf), None);
    assert_eq!(
        m.take_msi(),
        vec![(0xFEE0_1000, 0x41)],
        "the frame that came while the driver was busy was announced"
    );
    // The CPU that message woke looks again: nothing, nothing announced.
    assert_eq!(nic.receive(&mut buf), None);
    assert!(m.take_msi().is_empty());
    // Every later frame and transmission still interrupts a CPU that halts after an empty
    // look (the link re-enabled its causes).
    for i in 5..10u8 {
        wire.inject(&frame(MAC_A, MAC_B, 100, i));
        assert_eq!(m.take_msi(), vec![(0xFEE0_1000, 0x41)], "frame {i} arrived");
        assert_eq!(nic.receive(&mut buf), Some(100));
        assert_eq!(nic.receive(&mut buf), None);
        nic.transmit(&frame(MAC_B, MAC_A, 60, i)).unwrap();
        assert_eq!(m.take_msi(), vec![(0xFEE0_1000, 0x41)], "frame {i} went");
        assert_eq!(nic.receive(&mut buf), None);
    }
}

#[test]
fn igb_routes_queue_interrupts_to_msix_vector_0() {
    msix::<I82576>();
}

#[test]
fn e1000e_routes_queue_interrupts_to_msix_vector_0() {
    msix::<I82574>();
}

fn refused<F: Family>() {
    // A reset that never completes: a typed error, every page back, the command register as
    // it was.
    let wire = Wire::new();
    let m = make(F::NAME, &wire, MAC_A);
    m.set_stuck_reset(true);
    // SAFETY: as in `bring_up`.
    let r = unsafe { Nic::<F>::new(m.clone(), &m, NicModel::address()) };
    assert_eq!(r.err(), Some(IntelError::ResetTimeout));
    assert_eq!(m.outstanding_pages(), 0);
    assert_eq!(m.pci_command(), 0, "restored");

    // No such function.
    let wrong = bareverbs::hal::PciAddress::new(0, 0, 4, 0);
    // SAFETY: nothing is there; the link only reads the IDs.
    let r = unsafe { Nic::<F>::new(m.clone(), &m, wrong) };
    assert_eq!(r.err(), Some(IntelError::NoDevice));

    // Pulled cable: the link waits a bounded time and says so.
    let m = make(F::NAME, &wire, MAC_B);
    m.set_cable(false);
    // SAFETY: as in `bring_up`.
    let nic = unsafe { Nic::<F>::new(m.clone(), &m, NicModel::address()) }.unwrap();
    assert_eq!(nic.wait_link(1000), Err(IntelError::LinkDown));
    drop(nic);
    assert_eq!(m.outstanding_pages(), 0);
}

#[test]
fn igb_refuses_a_stuck_reset_a_missing_function_and_a_dead_link() {
    refused::<I82576>();
}

#[test]
fn e1000e_refuses_a_stuck_reset_a_missing_function_and_a_dead_link() {
    refused::<I82574>();
}

/// Registers that lie on every read: bring-up ends in a typed error each time (or, rarely,
/// comes up), never a panic; pages come back unless the reset at drop did not complete.
fn lying_registers<F: Family>() {
    let mut errors = std::collections::BTreeMap::new();
    let mut lies = 0;
    for seed in 0..200 {
        let wire = Wire::new();
        let m = make(F::NAME, &wire, MAC_A);
        m.set_hostile(Some(NicHostile {
            seed,
            rate: 2,
            registers: true,
        }));
        // SAFETY: as in `bring_up`.
        match unsafe { Nic::<F>::new(m.clone(), &m, NicModel::address()) } {
            Ok(nic) => {
                assert!(nic.mac() != [0; 6] && nic.mac()[0] & 1 == 0);
                *errors.entry("up").or_insert(0) += 1;
            }
            Err(e) => {
                *errors.entry(format!("{e:?}").leak() as &str).or_insert(0) += 1;
            }
        }
        assert!(m.violations().is_empty(), "{:?}", m.violations());
        lies += m.lies().registers;
    }
    assert!(lies > 200, "{lies}");
    eprintln!("{}: {errors:?}", F::NAME);
    assert!(errors.len() >= 2, "{errors:?}");
}

#[test]
fn igb_bring_up_under_lying_registers_ends_in_typed_errors() {
    lying_registers::<I82576>();
}

#[test]
fn e1000e_bring_up_under_lying_registers_ends_in_typed_errors() {
    lying_registers::<I82574>();
}

/// Forged write-backs on the data path: every frame shown is within bounds, the refusals are
/// counted by reason, and the link keeps working once the NIC is honest again.
fn lying_descriptors<F: Family>() {
    let wire = Wire::new();
    let (m, mut nic) = bring_up::<F>(&wire, MAC_A);
    m.set_hostile(Some(NicHostile {
        seed: 7,
        rate: 3,
        registers: false,
    }));
    let mut buf = [0u8; 2048];
    let mut shown = 0u64;
    for i in 0..5000usize {
        wire.inject(&frame(MAC_A, MAC_B, 14 + i % 1500, i as u8));
        while let Some(got) = nic.receive_with(&mut [], |f| f.len()) {
            assert!((14..=MAX_FRAME).contains(&got), "{got}");
            shown += 1;
        }
        let _ = nic.transmit(&frame(MAC_B, MAC_A, 60, 0));
    }
    let s = nic.stats();
    let lies = m.lies();
    eprintln!("{}: {s:?} {lies:?} {:?}", F::NAME, m.counters());
    assert!(s.bad_length > 0 && s.fragments > 0 && s.errors > 0, "{s:?}");
    assert!(lies.rx_writeback > 0 && lies.tx_writeback > 0 && lies.scribbles > 0);
    assert_eq!(s.received, shown);
    m.set_hostile(None);
    // Honest again: once the link found the NIC's place (a resync, after a few hundred
    // empty looks at most), every frame comes through.
    let mut honest = [0; 2];
    for count in &mut honest {
        for _ in 0..300 {
            wire.inject(&frame(MAC_A, MAC_B, 200, 0x5A));
            while let Some(n) = nic.receive(&mut buf) {
                if n == 200 && buf[199] == 0x5A {
                    *count += 1;
                }
            }
        }
    }
    assert_eq!(honest[1], 300, "{honest:?} {:?}", nic.stats());
    drop(nic);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
    assert_eq!(m.outstanding_pages(), 0);
}

#[test]
fn igb_data_path_under_forged_write_backs() {
    lying_descriptors::<I82576>();
}

#[test]
fn e1000e_data_path_under_forged_write_backs() {
    lying_descriptors::<I82574>();
}
