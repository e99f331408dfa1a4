//! A controller's life on one association: reset by CC.EN = 0 and enabled again, shutdown by
//! CC.SHN, its asynchronous event requests through both and through its end, and the Abort
//! command.

mod common;

use bareverbs_nvmf::host::{Data, HostError};
use bareverbs_nvmf::wire::{Sqe, Status, opcode, prop};
use common::*;

/// Four AERs (AERL + 1) held, a fifth refused with AER Limit Exceeded; returns the four's
/// slots.
fn hold_four(h: &mut H<'_, '_>, idle: &mut dyn FnMut()) -> Vec<u16> {
    let held: Vec<u16> = (0..4)
        .map(|_| {
            h.submit(0, Sqe::new(opcode::ASYNC_EVENT, 0), Data::None)
                .unwrap()
        })
        .collect();
    let fifth = h
        .submit(0, Sqe::new(opcode::ASYNC_EVENT, 0), Data::None)
        .unwrap();
    assert_eq!(
        h.wait(0, fifth, &mut [], idle),
        Err(HostError::Status(Status::AER_LIMIT)),
        "the fifth is over the limit"
    );
    for _ in 0..200 {
        idle();
        h.poll();
    }
    for &s in &held {
        assert!(h.take(0, s).is_none(), "held open");
    }
    held
}

#[test]
fn cc_en_0_resets_the_controller_and_cc_en_1_enables_it_again() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A));
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.connect(&mut cma, &mut idle).unwrap();
    let data = pattern(4096, 3);
    h.write(1, 1, 16, 8, &data, &mut idle).unwrap();
    let held = hold_four(&mut h, &mut idle);
    let cntlid = h.cntlid();

    // Reset: CC.EN = 0 (what Linux writes before it tears the admin queue down, and what
    // `nvme reset` starts with).
    let cc = h.property_get(prop::CC, false, &mut idle).unwrap() as u32;
    assert_ne!(cc & prop::CC_EN, 0);
    h.property_set(prop::CC, cc & !prop::CC_EN, &mut idle)
        .unwrap();
    for s in held {
        assert_eq!(
            h.wait(0, s, &mut [], &mut idle),
            Err(HostError::Status(Status::INTERNAL_DNR)),
            "a held AER is answered by the reset"
        );
    }
    let csts = h.property_get(prop::CSTS, false, &mut idle).unwrap() as u32;
    assert_eq!(csts & prop::CSTS_RDY, 0, "CSTS.RDY drops");
    // While disabled, anything but the fabrics commands is refused.
    let mut id = [0u8; 4096];
    assert_eq!(
        h.identify(1, 0, &mut id, &mut idle),
        Err(HostError::Status(Status::SEQUENCE_ERROR))
    );
    // The I/O queues ended with the reset (the target disconnected them).
    settle(&l.clk, &mut t, &mut cmb, &mut h, &mut cma, 500);
    assert!(h.connected(0), "the admin queue stays");
    assert!(
        !h.connected(1) && !h.connected(2),
        "the I/O queues are gone"
    );
    assert_eq!(t.queues_in_use(), 1);
    assert_eq!(t.controllers().count(), 1);
    assert_eq!(t.counts().resets, 1);
    assert_eq!(t.counts().lost, 0, "a reset keeps the association");

    // Enabled again: ready, the same controller, its I/O queues connect again, the data is
    // there, and the AER limit is whole again.
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.property_set(prop::CC, cc, &mut idle).unwrap();
    let csts = h.property_get(prop::CSTS, false, &mut idle).unwrap() as u32;
    assert_eq!(csts & prop::CSTS_RDY, prop::CSTS_RDY);
    h.reconnect_io(&mut cma, 1, &mut idle).unwrap();
    assert_eq!(h.cntlid(), cntlid);
    let mut back = vec![0u8; 4096];
    h.read(1, 1, 16, 8, &mut back, &mut idle).unwrap();
    assert_eq!(back, data);
    hold_four(&mut h, &mut idle);
    // CC.EN = 0 written while already 0 is no second reset.
    h.property_set(prop::CC, 0, &mut idle).unwrap();
    h.property_set(prop::CC, 0, &mut idle).unwrap();
    assert_eq!(t.counts().resets, 2);
    let _ = &disk;
}

#[test]
fn a_reset_answers_every_outstanding_admin_command_once() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A));
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.connect(&mut cma, &mut idle).unwrap();
    // A Keep Alive outstanding with four AERs held, then the reset: every one of them is
    // answered, once.
    let held = hold_four(&mut h, &mut idle);
    let ka = h
        .submit(0, Sqe::new(opcode::KEEP_ALIVE, 0), Data::None)
        .unwrap();
    let cc = h.property_get(prop::CC, false, &mut idle).unwrap() as u32;
    h.property_set(prop::CC, cc & !prop::CC_EN, &mut idle)
        .unwrap();
    assert!(h.wait(0, ka, &mut [], &mut idle).is_ok());
    for s in held {
        assert!(h.wait(0, s, &mut [], &mut idle).is_err());
    }
    settle(&l.clk, &mut t, &mut cmb, &mut h, &mut cma, 500);
    // Nothing more comes: each command had one answer.
    let before = t.counts();
    settle(&l.clk, &mut t, &mut cmb, &mut h, &mut cma, 500);
    assert_eq!(t.counts().commands, before.commands);
    assert_eq!(
        before.errors, 5,
        "the fifth AER and the four the reset answered"
    );
    let _ = &disk;
}

#[test]
fn a_reset_with_io_in_flight_ends_those_commands_with_their_queue() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A));
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.connect(&mut cma, &mut idle).unwrap();
    h.write(1, 1, 0, 8, &pattern(4096, 1), &mut idle).unwrap();
    // Eight reads submitted and not waited for, then the reset at once: the target has
    // taken some, maybe all; their queue goes, and with it every one of them.
    let reads: Vec<u16> = (0..8)
        .map(|k| {
            h.submit(1, Sqe::rw(opcode::READ, 0, 1, k * 8, 8), Data::In(4096))
                .unwrap()
        })
        .collect();
    let cc = h.property_get(prop::CC, false, &mut idle).unwrap() as u32;
    h.property_set(prop::CC, cc & !prop::CC_EN, &mut idle)
        .unwrap();
    settle(&l.clk, &mut t, &mut cmb, &mut h, &mut cma, 500);
    assert!(!h.connected(1) && !h.connected(2));
    assert_eq!(t.queues_in_use(), 1, "the I/O queues' resources are freed");
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    for s in reads {
        // Answered before the reset, or gone with the queue.
        match h.wait(1, s, &mut [], &mut idle) {
            Ok(_) | Err(HostError::NotConnected) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    // Enabled again, the queue connects again and the data is there.
    h.property_set(prop::CC, cc, &mut idle).unwrap();
    h.reconnect_io(&mut cma, 1, &mut idle).unwrap();
    let mut back = vec![0u8; 4096];
    h.read(1, 1, 0, 8, &mut back, &mut idle).unwrap();
    assert_eq!(back, pattern(4096, 1));
    let _ = &disk;
}

#[test]
fn shutdown_reports_shst_complete_and_a_reset_brings_the_controller_back() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A));
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.connect(&mut cma, &mut idle).unwrap();
    let cc = h.property_get(prop::CC, false, &mut idle).unwrap() as u32;
    h.property_set(prop::CC, cc | (1 << 14), &mut idle).unwrap();
    let csts = h.property_get(prop::CSTS, false, &mut idle).unwrap() as u32;
    assert_eq!(csts & (3 << 2), prop::CSTS_SHST_DONE, "SHST = 10b");
    let mut buf = vec![0u8; 512];
    assert_eq!(
        h.read(1, 1, 0, 1, &mut buf, &mut idle),
        Err(HostError::Status(Status::SEQUENCE_ERROR)),
        "no I/O once shut down"
    );
    // CC = 0 (reset, SHN cleared), then enabled: normal operation.
    h.property_set(prop::CC, 0, &mut idle).unwrap();
    let csts = h.property_get(prop::CSTS, false, &mut idle).unwrap() as u32;
    assert_eq!(csts & (prop::CSTS_RDY | 3 << 2), 0);
    h.property_set(prop::CC, cc, &mut idle).unwrap();
    let csts = h.property_get(prop::CSTS, false, &mut idle).unwrap() as u32;
    assert_eq!(csts & (prop::CSTS_RDY | 3 << 2), prop::CSTS_RDY);
    settle(&l.clk, &mut t, &mut cmb, &mut h, &mut cma, 300);
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.reconnect_io(&mut cma, 1, &mut idle).unwrap();
    h.write(1, 1, 0, 1, &pattern(512, 9), &mut idle).unwrap();
    h.read(1, 1, 0, 1, &mut buf, &mut idle).unwrap();
    assert_eq!(buf, pattern(512, 9));
    let _ = &disk;
}

#[test]
fn a_controller_lost_with_aers_held_leaks_nothing() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A));
    for _ in 0..3 {
        let clk = l.clk.clone();
        let mut idle = || {
            clk.advance(20);
            t.poll(&mut cmb);
        };
        h.connect(&mut cma, &mut idle).unwrap();
        hold_four(&mut h, &mut idle);
        h.disconnect(&mut cma, &mut idle).unwrap();
        settle(&l.clk, &mut t, &mut cmb, &mut h, &mut cma, 1000);
    }
    assert_eq!(t.queues_in_use(), 0, "every queue freed");
    assert_eq!(t.controllers().count(), 0);
    assert_eq!(t.counts().controllers, 3);
    let _ = &disk;
}

#[test]
fn abort_is_answered_not_performed() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A); idle);
    h.connect(&mut cma, &mut idle).unwrap();
    let aer = h
        .submit(0, Sqe::new(opcode::ASYNC_EVENT, 0), Data::None)
        .unwrap();
    // Abort of the AER (SQ 0, its slot as the command ID) and of one nobody used on SQ 1.
    for (sqid, cid) in [(0u32, u32::from(aer)), (1, 0x1234)] {
        let mut s = Sqe::new(opcode::ABORT, 0);
        s.set_cdw(10, sqid | cid << 16);
        let cqe = h.exec(0, s, Data::None, &mut [], &mut idle).unwrap();
        assert_eq!(cqe.result & 1, 1, "Dword 0 bit 0: not aborted");
    }
    for _ in 0..200 {
        idle();
        h.poll();
    }
    assert!(h.take(0, aer).is_none(), "the AER is still held");
    let _ = &disk;
}
