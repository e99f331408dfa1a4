//! Controllers come and go, each on its own: a key the host never gave, a disconnect in the
//! middle of I/O, keep-alive expiry, asynchronous event requests held open, 128 commands
//! outstanding on one queue; other hosts keep their controllers throughout.

mod common;

use bareverbs_model::link::TestClock;
use bareverbs_nvmf::host::{Data, Host, HostError};
use bareverbs_nvmf::wire::{Sgl, Sqe, Status, opcode, prop};
use common::*;

#[test]
fn an_unknown_key_ends_that_queue_only() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A));
    let sc = side(&l.c);
    let mut cmc = cm(&sc, &l.clk);
    let mut h2: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), hcfg(HOST_C));
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.connect(&mut cma, &mut idle).unwrap();
    h2.connect(&mut cmc, &mut idle).unwrap();
    assert_ne!(h.cntlid(), h2.cntlid());
    // A write whose SGL names a key the host never registered: the target's RDMA READ
    // fails, and its queue with it.
    let (addr, key) = h.data_key(1, 0).unwrap();
    let mut s = Sqe::rw(opcode::WRITE, 0x55, 1, 0, 8);
    s.set_sgl(&Sgl::Keyed {
        addr,
        len: 4096,
        key: key ^ 0x00A5_5A00,
        invalidate: false,
    });
    h.submit_raw(1, &s.0, 0x55).unwrap();
    settle(&l.clk, &mut t, &mut cmb, &mut h, &mut cma, 3000);
    assert!(!h.connected(1), "the queue whose READ failed ended");
    assert!(h.connected(0) && h.connected(2));
    let c = t.counts();
    assert_eq!((c.transport_errors, c.lost), (1, 0));
    assert_eq!(t.controllers().count(), 2);
    assert!(disk_untouched(&t), "nothing written");
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    // The controller still answers; the other host still does I/O; the queue comes back.
    assert_eq!(h.property_get(prop::CSTS, false, &mut idle).unwrap() & 1, 1);
    let data = pattern(4096, 3);
    h2.write(1, 1, 0, 8, &data, &mut idle).unwrap();
    h.reconnect_io(&mut cma, 1, &mut idle).unwrap();
    let mut back = vec![0u8; 4096];
    h.read(1, 1, 0, 8, &mut back, &mut idle).unwrap();
    assert_eq!(back, data);
    // The same on the read side: the target's RDMA WRITE to an unknown key.
    let mut s = Sqe::rw(opcode::READ, 0x56, 1, 0, 8);
    s.set_sgl(&Sgl::Keyed {
        addr,
        len: 4096,
        key: key ^ 0x0011_2200,
        invalidate: false,
    });
    h.submit_raw(2, &s.0, 0x56).unwrap();
    settle(&l.clk, &mut t, &mut cmb, &mut h, &mut cma, 3000);
    assert!(!h.connected(2) && h.connected(1) && h.connected(0));
    assert_eq!(t.counts().transport_errors, 2);
    assert_eq!(t.controllers().count(), 2);
    let _ = &disk;
}

fn disk_untouched(t: &T<'_, '_>) -> bool {
    // The target's queues hold no data for the failed write: every queue in use is one the
    // hosts still have (admin 2, I/O 3).
    t.queues_in_use() == 5
}

#[test]
fn a_disconnect_mid_io_loses_that_controller_only() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A));
    let sc = side(&l.c);
    let mut cmc = cm(&sc, &l.clk);
    let mut h2: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), hcfg(HOST_C));
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.connect(&mut cma, &mut idle).unwrap();
    h2.connect(&mut cmc, &mut idle).unwrap();
    // Sixteen commands in flight on each I/O queue (more than the target's 8 data buffers),
    // then every queue disconnected at once, without a shutdown.
    let big = pattern(16384, 5);
    for k in 0..16u64 {
        let q = 1 + (k % 2) as u16;
        if k % 4 == 3 {
            h.submit(q, Sqe::rw(opcode::READ, 0, 1, k * 32, 32), Data::In(16384))
                .unwrap();
        } else {
            h.submit(q, Sqe::rw(opcode::WRITE, 0, 1, k * 32, 32), Data::Out(&big))
                .unwrap();
        }
    }
    for _ in 0..3 {
        l.clk.advance(10);
        t.poll(&mut cmb);
    }
    for q in [1, 2, 0] {
        h.close_queue(&mut cma, q);
    }
    settle(&l.clk, &mut t, &mut cmb, &mut h, &mut cma, 3000);
    assert_eq!(
        t.controllers().count(),
        1,
        "the other host's controller stays"
    );
    assert_eq!(t.queues_in_use(), 3);
    assert_eq!(t.counts().lost, 1);
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    // The other host goes on; the first connects again and gets a new controller.
    let data = pattern(8192, 6);
    h2.write(2, 1, 1000, 16, &data, &mut idle).unwrap();
    let old = h.cntlid();
    h.connect(&mut cma, &mut idle).unwrap();
    assert_ne!(h.cntlid(), old);
    let mut back = vec![0u8; 8192];
    h.read(1, 1, 1000, 16, &mut back, &mut idle).unwrap();
    assert_eq!(back, data);
    assert_eq!(t.controllers().count(), 2);
    let _ = &disk;
}

#[test]
fn keep_alive_expiry_loses_the_silent_host_only() {
    let mut quick = hcfg(HOST_A);
    quick.kato_ms = 1000;
    setup!(l, t, h, cma, cmb, disk, tcfg(), quick);
    let sc = side(&l.c);
    let mut cmc = cm(&sc, &l.clk);
    let mut cfg2 = hcfg(HOST_C);
    cfg2.kato_ms = 1000;
    let mut h2: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), cfg2);
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.connect(&mut cma, &mut idle).unwrap();
    h2.connect(&mut cmc, &mut idle).unwrap();
    // 0.9 s with both hosts quiet: nobody expires yet.
    for _ in 0..900 {
        l.clk.advance(1000);
        t.poll(&mut cmb);
    }
    assert_eq!(t.controllers().count(), 2);
    // Then 3 s in which only the second host polls (and so sends Keep Alive every 0.5 s).
    for _ in 0..3000 {
        l.clk.advance(1000);
        t.poll(&mut cmb);
        h2.poll();
    }
    assert_eq!(t.controllers().count(), 1);
    let c = t.counts();
    assert_eq!((c.kato_expired, c.lost), (1, 1));
    // The silent host learns it (the target disconnected its queues).
    settle(&l.clk, &mut t, &mut cmb, &mut h, &mut cma, 1000);
    assert!(!h.connected(0) && !h.connected(1) && !h.connected(2));
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    let mut back = vec![0u8; 512];
    h2.read(1, 1, 0, 1, &mut back, &mut idle).unwrap();
    assert_eq!(
        h.read(1, 1, 0, 1, &mut back, &mut idle),
        Err(HostError::NotConnected)
    );
    let _ = &disk;
}

/// A Keep Alive that comes late, past the timeout but within its grace (the timeout again,
/// at most 10 s), keeps the controller; silence past both loses it, and the target's log of
/// the loss says why and how long the host had been silent. A host that disconnects is
/// logged as such.
#[test]
fn a_late_keep_alive_is_within_the_grace_and_each_loss_says_why() {
    use bareverbs_nvmf::target::{LossCause, kato_grace_ms};
    let mut quick = hcfg(HOST_A);
    quick.kato_ms = 2000;
    setup!(l, t, h, cma, cmb, disk, tcfg(), quick);
    assert_eq!((kato_grace_ms(2000), kato_grace_ms(30_000)), (2000, 10_000));
    let clk = l.clk.clone();
    h.connect(&mut cma, &mut || {
        clk.advance(20);
        t.poll(&mut cmb);
    })
    .unwrap();
    assert_eq!(t.controllers().next().map(|c| c.kato_ms), Some(2000));
    // The host silent for 3.9 s (its Keep Alive due every second): past the timeout, within
    // the grace. Then it polls again (a Keep Alive) for 2 s.
    for _ in 0..3900 {
        l.clk.advance(1000);
        t.poll(&mut cmb);
    }
    assert_eq!(
        t.controllers().count(),
        1,
        "3.9 s of silence, 2 s timeout and 2 s of grace"
    );
    for _ in 0..2000 {
        l.clk.advance(1000);
        t.poll(&mut cmb);
        h.poll();
    }
    assert_eq!((t.controllers().count(), t.counts().lost), (1, 0));
    let cntlid = h.cntlid();
    // Silent for 4.2 s: lost, its three queues with it.
    for _ in 0..4200 {
        l.clk.advance(1000);
        t.poll(&mut cmb);
    }
    assert_eq!(t.controllers().count(), 0);
    assert_eq!(t.queues_in_use(), 0);
    let c = t.counts();
    assert_eq!((c.lost, c.kato_expired), (1, 1));
    let loss = t.loss(1).expect("the loss is logged");
    assert_eq!((loss.seq, loss.cntlid, loss.station), (1, cntlid, IP_A));
    assert_eq!((loss.cause, loss.kato_ms), (LossCause::KeepAlive, 2000));
    assert!(
        (4_000_000..4_100_000).contains(&loss.idle_us),
        "lost just past 4 s of silence: {loss:?}"
    );
    assert!(
        (3_900_000..4_000_000).contains(&loss.longest_idle_us),
        "its longest silence before, the 3.9 s one: {loss:?}"
    );
    assert_eq!((t.loss(0), t.loss(2)), (None, None));
    // The host learns it, reconnects, and then disconnects: logged as a disconnection.
    settle(&l.clk, &mut t, &mut cmb, &mut h, &mut cma, 1000);
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.connect(&mut cma, &mut idle).unwrap();
    let again = h.cntlid();
    h.disconnect(&mut cma, &mut idle).unwrap();
    for _ in 0..100 {
        idle();
    }
    let loss = t.loss(2).expect("the second loss is logged");
    assert_eq!((loss.cntlid, loss.cause), (again, LossCause::Disconnected));
    assert!(loss.idle_us < 1_000_000, "{loss:?}");
    assert_eq!(t.loss(1).map(|l| l.cause), Some(LossCause::KeepAlive));
    let _ = &disk;
}

#[test]
fn asynchronous_event_requests_are_held_up_to_the_limit() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A));
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.connect(&mut cma, &mut idle).unwrap();
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
        h.wait(0, fifth, &mut [], &mut idle),
        Err(HostError::Status(Status::AER_LIMIT))
    );
    // Other admin commands are answered while the four stay open.
    assert_eq!(
        h.property_get(prop::VS, false, &mut idle).unwrap(),
        0x0001_0300
    );
    for _ in 0..1000 {
        idle();
        h.poll();
    }
    for s in held {
        assert!(h.take(0, s).is_none(), "held open");
    }
    let _ = &disk;
}

type Deep<'a, 'n> = Host<'a, 'n, R, TestClock, 2, 128>;

/// 128 commands outstanding on one I/O queue, through the target's 8 data buffers.
fn depth_128(inline: bool) {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A));
    let mut cfg = hcfg(HOST_C);
    cfg.io_queues = 1;
    cfg.io_depth = 128;
    cfg.max_transfer = 4096;
    cfg.inline = inline;
    let sc = side(&l.c);
    let mut cmc = cm(&sc, &l.clk);
    let mut d: Deep = Deep::new(&sc.pd, &sc.dcq, l.clk.clone(), cfg);
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    d.connect(&mut cmc, &mut idle).unwrap();
    let data: Vec<Vec<u8>> = (0..128).map(|k| pattern(4096, 100 + k)).collect();
    let slots: Vec<u16> = (0..128u64)
        .map(|k| {
            d.submit(
                1,
                Sqe::rw(opcode::WRITE, 0, 1, k * 8, 8),
                Data::Out(&data[k as usize]),
            )
            .unwrap()
        })
        .collect();
    assert_eq!(
        d.submit(1, Sqe::new(opcode::FLUSH, 0), Data::None),
        Err(HostError::Busy)
    );
    for s in &slots {
        d.wait(1, *s, &mut [], &mut idle).unwrap();
    }
    let slots: Vec<u16> = (0..128u64)
        .map(|k| {
            d.submit(1, Sqe::rw(opcode::READ, 0, 1, k * 8, 8), Data::In(4096))
                .unwrap()
        })
        .collect();
    for (k, s) in slots.iter().enumerate() {
        let mut back = vec![0u8; 4096];
        d.wait(1, *s, &mut back, &mut idle).unwrap();
        assert_eq!(back, data[k], "command {k}");
    }
    assert_eq!(t.counts().errors, 0);
    let _ = &disk;
}

#[test]
fn a_queue_of_128_keyed() {
    depth_128(false);
}

#[test]
fn a_queue_of_128_in_capsule() {
    depth_128(true);
}

/// A discovery controller whose host asked for no keep-alive is dropped after two minutes
/// without a command (nvmet's default) and the grace (10 s), not kept forever.
#[test]
fn a_forgotten_discovery_controller_expires_after_two_minutes() {
    let mut cfg = hcfg(HOST_A);
    cfg.subnqn = bareverbs_nvmf::wire::fabrics::DISCOVERY_NQN;
    cfg.io_queues = 0;
    cfg.kato_ms = 0;
    setup!(l, t, h, cma, cmb, disk, tcfg(), cfg);
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h.connect(&mut cma, &mut idle).unwrap();
    for _ in 0..129 {
        l.clk.advance(1_000_000);
        t.poll(&mut cmb);
    }
    assert_eq!(t.controllers().count(), 1, "129 s: still there");
    for _ in 0..2 {
        l.clk.advance(1_000_000);
        t.poll(&mut cmb);
    }
    assert_eq!(t.controllers().count(), 0);
    assert_eq!(t.counts().kato_expired, 1);
    let _ = &disk;
}

/// A queue whose host never sends Connect (or leaves it open after a failed one) is ended
/// 30 s after it was accepted; a connected one is not.
#[test]
fn a_queue_without_connect_is_ended() {
    setup!(l, t, h, cma, cmb, disk, tcfg(), hcfg(HOST_A));
    let sc = side(&l.c);
    let mut cmc = cm(&sc, &l.clk);
    let mut h2: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), hcfg(HOST_C));
    let clk = l.clk.clone();
    let mut idle = || {
        clk.advance(20);
        t.poll(&mut cmb);
    };
    h2.connect(&mut cmc, &mut idle).unwrap();
    h.open_queue(&mut cma, 0, 32, &mut idle).unwrap();
    assert_eq!(t.queues_in_use(), 4);
    for _ in 0..29 {
        l.clk.advance(1_000_000);
        t.poll(&mut cmb);
        h2.poll();
    }
    assert_eq!(t.queues_in_use(), 4, "29 s");
    settle(&l.clk, &mut t, &mut cmb, &mut h, &mut cma, 20_000);
    assert_eq!(t.queues_in_use(), 3, "the other host's three stay");
    assert!(!h.connected(0), "the host was told (DREQ)");
    assert_eq!(t.controllers().count(), 1);
    let _ = &disk;
}
