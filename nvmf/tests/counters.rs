//! What the target counts: per queue and per controller (commands, errors by status, bytes,
//! the latency histogram), the SMART / Health log's fields from those counts (Data Units,
//! Host Read and Write Commands, Controller Busy Time, Power On Hours), counts that outlive
//! their queues, and every refused request or Connect logged with its reason.

mod common;

use bareverbs::cm::{CmEvent, ConnectParams};
use bareverbs::hal::Clock;
use bareverbs::verbs::{QpCaps, Rc};
use bareverbs_model::link::TestClock;
use bareverbs_nvmf::block::{BlockDevice, BlockError, RamDisk};
use bareverbs_nvmf::host::{Data, HostError};
use bareverbs_nvmf::target::{
    IoCounts, LATENCY_BUCKETS, RefusalReason, Subsystem, bucket_floor_us, latency_bucket,
};
use bareverbs_nvmf::wire::cm::{CmRejStatus, CmReq};
use bareverbs_nvmf::wire::{Sqe, Status, log};
use common::*;

/// A RAM disk whose writes take `delay_us` of the test's clock (a slow medium).
struct SlowDisk<'m> {
    ram: RamDisk<'m>,
    clk: TestClock,
    delay_us: std::rc::Rc<std::cell::Cell<u64>>,
}

impl BlockDevice for SlowDisk<'_> {
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn capacity(&self) -> u64 {
        self.ram.capacity()
    }
    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        self.ram.read(lba, buf)
    }
    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.clk.advance(self.delay_us.get());
        self.ram.write(lba, buf)
    }
    fn flush(&mut self) -> Result<(), BlockError> {
        self.ram.flush()
    }
    fn write_zeroes(&mut self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.ram.write_zeroes(lba, blocks)
    }
}

macro_rules! idle {
    ($clk:expr, $t:ident, $cmb:ident) => {
        &mut || {
            $clk.advance(20);
            $t.poll(&mut $cmb);
        }
    };
}

/// A target on B serving a [`SlowDisk`] of 1 MiB as `NQN`, host A connected (keep-alive and
/// command timeouts of two minutes: the slow writes move the clock by a minute).
macro_rules! rig {
    ($l:ident, $t:ident, $h:ident, $cma:ident, $cmb:ident, $delay:ident) => {
        let $l = lab();
        let sa = side(&$l.a);
        let sb = side(&$l.b);
        let mut $cma = cm(&sa, &$l.clk);
        let mut $cmb = target_cm(&sb, &$l.clk);
        let mut mem = vec![0u8; 1 << 20];
        let $delay = std::rc::Rc::new(std::cell::Cell::new(0u64));
        let mut disk = SlowDisk {
            ram: RamDisk::new(&mut mem, 512),
            clk: $l.clk.clone(),
            delay_us: $delay.clone(),
        };
        let mut nss: [&mut dyn BlockDevice; 1] = [&mut disk];
        let mut subs = [Subsystem::new(NQN, &mut nss)];
        let mut $t: T = T::new(&sb.pd, &sb.dcq, $l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
        let mut cfg = hcfg(HOST_A);
        cfg.kato_ms = 120_000;
        cfg.timeout_ms = 120_000;
        let mut $h: H = H::new(&sa.pd, &sa.dcq, $l.clk.clone(), cfg);
        $h.connect(&mut $cma, idle!($l.clk, $t, $cmb)).unwrap();
    };
}

/// A disk whose data entries for the target's buffers say how much they copied as a medium
/// moving the data by DMA would (nothing for an even block, everything for an odd one), and
/// whose plain entries the target must not use for a host's data.
struct DmaDisk<'m> {
    ram: RamDisk<'m>,
    plain: u32,
}

impl DmaDisk<'_> {
    fn copies(lba: u64, len: usize) -> usize {
        if lba.is_multiple_of(2) { 0 } else { len }
    }
}

impl BlockDevice for DmaDisk<'_> {
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn capacity(&self) -> u64 {
        self.ram.capacity()
    }
    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        self.plain += 1;
        self.ram.read(lba, buf)
    }
    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.plain += 1;
        self.ram.write(lba, buf)
    }
    fn read_dma(&mut self, lba: u64, buf: &mut [u8]) -> Result<usize, BlockError> {
        self.ram.read(lba, buf)?;
        Ok(Self::copies(lba, buf.len()))
    }
    fn write_dma(&mut self, lba: u64, buf: &[u8], _fua: bool) -> Result<usize, BlockError> {
        self.ram.write(lba, buf)?;
        Ok(Self::copies(lba, buf.len()))
    }
    fn flush(&mut self) -> Result<(), BlockError> {
        self.ram.flush()
    }
    fn volatile_cache(&self) -> bool {
        false
    }
    fn write_zeroes(&mut self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.ram.write_zeroes(lba, blocks)
    }
}

#[test]
fn the_bytes_a_medium_copies_are_counted_per_queue() {
    let l = lab();
    let sa = side(&l.a);
    let sb = side(&l.b);
    let mut cma = cm(&sa, &l.clk);
    let mut cmb = target_cm(&sb, &l.clk);
    let mut mem = vec![0u8; 1 << 20];
    let mut disk = DmaDisk {
        ram: RamDisk::new(&mut mem, 512),
        plain: 0,
    };
    {
        let mut nss: [&mut dyn BlockDevice; 1] = [&mut disk];
        let mut subs = [Subsystem::new(NQN, &mut nss)];
        let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
        let mut h: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), hcfg(HOST_A));
        h.connect(&mut cma, idle!(l.clk, t, cmb)).unwrap();
        // Even blocks: "by DMA", nothing copied, in capsule (4 KiB) or fetched (16 KiB).
        let small = pattern(4096, 8);
        let big = pattern(16384, 9);
        h.write(1, 1, 0, 8, &small, idle!(l.clk, t, cmb)).unwrap();
        h.write(2, 1, 64, 32, &big, idle!(l.clk, t, cmb)).unwrap();
        let mut back = vec![0u8; 16384];
        h.read(1, 1, 64, 32, &mut back, idle!(l.clk, t, cmb))
            .unwrap();
        assert_eq!(back, big);
        let c = t.ctrl_counts(h.cntlid()).unwrap();
        assert_eq!((c.writes, c.reads, c.bytes_copied), (2, 1, 0));
        // An odd block: copied, counted on its queue.
        h.read(2, 1, 1, 8, &mut back[..4096], idle!(l.clk, t, cmb))
            .unwrap();
        let q2 = t
            .queue_counts()
            .find(|q| q.cntlid == Some(h.cntlid()) && q.qid == 2)
            .unwrap()
            .counts;
        assert_eq!((q2.reads, q2.bytes_copied), (1, 4096));
        assert_eq!(t.io_counts().bytes_copied, 4096);
    }
    assert_eq!(
        disk.plain, 0,
        "the target hands its buffers to the DMA entries"
    );
}

/// The sum of `counts`.
fn sum<'a>(counts: impl Iterator<Item = &'a IoCounts>) -> IoCounts {
    let mut all = IoCounts::default();
    for c in counts {
        all.add(c);
    }
    all
}

#[test]
fn every_command_is_counted_per_queue_and_per_controller() {
    rig!(l, t, h, cma, cmb, delay);
    let cntlid = h.cntlid();
    let before = t.ctrl_counts(cntlid).unwrap();
    assert_eq!((before.reads, before.writes, before.errors), (0, 0, 0));
    assert!(before.commands >= 1, "the Connect and the admin commands");
    // Queue 1: three 4 KiB writes, one read, an unknown opcode. Queue 2: two 16 KiB writes,
    // a write past the end.
    let small = pattern(4096, 1);
    let big = pattern(16384, 2);
    for k in 0..3 {
        h.write(1, 1, 8 * k, 8, &small, idle!(l.clk, t, cmb))
            .unwrap();
    }
    let mut back = vec![0u8; 4096];
    h.read(1, 1, 0, 8, &mut back, idle!(l.clk, t, cmb)).unwrap();
    assert_eq!(
        h.exec(
            1,
            Sqe::new(0x7E, 0),
            Data::None,
            &mut [],
            idle!(l.clk, t, cmb)
        ),
        Err(HostError::Status(Status::INVALID_OPCODE))
    );
    for k in 0..2 {
        h.write(2, 1, 100 + 32 * k, 32, &big, idle!(l.clk, t, cmb))
            .unwrap();
    }
    assert_eq!(
        h.write(2, 1, 2047, 32, &big, idle!(l.clk, t, cmb)),
        Err(HostError::Status(Status::LBA_RANGE))
    );
    let queues: Vec<_> = t
        .queue_counts()
        .filter(|q| q.cntlid == Some(cntlid))
        .collect();
    assert_eq!(queues.len(), 3, "admin and two I/O queues");
    let q = |qid| queues.iter().find(|q| q.qid == qid).unwrap().counts;
    let (q1, q2) = (q(1), q(2));
    // Each I/O queue's count starts with its own Connect.
    assert_eq!((q1.commands, q1.writes, q1.reads, q1.errors), (6, 3, 1, 1));
    assert_eq!((q1.bytes_written, q1.bytes_read), (3 * 4096, 4096));
    assert_eq!((q1.units_written, q1.units_read), (24, 8));
    assert_eq!(q1.errors_with(Status::INVALID_OPCODE), 1);
    assert_eq!((q2.commands, q2.writes, q2.reads, q2.errors), (4, 2, 0, 1));
    assert_eq!(q2.bytes_written, 2 * 16384);
    assert_eq!(q2.errors_with(Status::LBA_RANGE), 1);
    assert_eq!(q2.errors_with(Status::INVALID_OPCODE), 0, "queue 1's");
    // A RAM disk copies every byte between the data buffers and its memory (the default
    // `read_dma` and `write_dma` say so); failed commands copied nothing.
    assert_eq!(q1.bytes_copied, q1.bytes_written + q1.bytes_read);
    assert_eq!(q2.bytes_copied, 2 * 16384);
    // Every answered command is in its queue's latency histogram. The disk takes no time
    // and the clock moves only between polls (20 µs): a command run as its capsule came
    // (data in the capsule, or none, or a read) is at 0 µs; one whose data the target fetched
    // by RDMA READ (queue 2's 16 KiB writes) answers a poll later.
    for c in [q1, q2] {
        assert_eq!(c.latency.iter().sum::<u64>(), c.commands);
    }
    assert_eq!(q1.latency[0], 6);
    assert_eq!(q2.latency[0], 2, "its Connect and the write past the end");
    assert_eq!(q2.latency[latency_bucket(20)], 2);
    // The controller's counts are its queues' summed, and the target's the same (one
    // controller); the target's command count agrees.
    let ctrl = t.ctrl_counts(cntlid).unwrap();
    assert_eq!(ctrl, sum(queues.iter().map(|q| &q.counts)));
    assert_eq!(t.io_counts(), ctrl);
    assert_eq!(t.counts().commands, ctrl.commands);
    assert_eq!(t.counts().errors, ctrl.errors);
    let _ = (&mut cma, &delay);
}

#[test]
fn a_slow_medium_shows_in_the_latency_histogram() {
    rig!(l, t, h, cma, cmb, delay);
    let data = pattern(4096, 3);
    // 300 µs a write: bucket 256..511 µs.
    delay.set(300);
    for k in 0..4 {
        h.write(1, 1, 8 * k, 8, &data, idle!(l.clk, t, cmb))
            .unwrap();
    }
    delay.set(5000);
    h.write(2, 1, 64, 8, &data, idle!(l.clk, t, cmb)).unwrap();
    let c = t.ctrl_counts(h.cntlid()).unwrap();
    let k300 = latency_bucket(300);
    assert_eq!(
        (bucket_floor_us(k300), bucket_floor_us(k300 + 1)),
        (256, 512)
    );
    assert_eq!(c.latency[k300], 4);
    assert_eq!(c.latency[latency_bucket(5000)], 1);
    // Every other command took no time of the clock but the admin queue's Connect, whose
    // data came by RDMA READ (a poll later: 20 µs).
    assert_eq!(c.latency[1..].iter().sum::<u64>(), 6);
    assert_eq!(c.latency[latency_bucket(20)], 1);
    assert_eq!(c.latency.len(), LATENCY_BUCKETS);
    let _ = &mut cma;
}

/// The 8 low bytes of a SMART log field.
fn field(page: &[u8], at: usize) -> u64 {
    log::smart_field(page, at)
}

#[test]
fn the_smart_log_reports_data_units_commands_and_busy_time() {
    rig!(l, t, h, cma, cmb, delay);
    let mut smart = [0xAAu8; 512];
    h.get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    assert!(smart.iter().all(|&b| b == 0), "nothing yet: {smart:?}");
    // 1001 blocks written (31 writes of 32 and one of 9), 32 read: 2 and 1 thousands,
    // rounded up.
    let data = pattern(16384, 4);
    for k in 0..31 {
        h.write(1, 1, 32 * k, 32, &data, idle!(l.clk, t, cmb))
            .unwrap();
    }
    h.write(2, 1, 992, 9, &data[..9 * 512], idle!(l.clk, t, cmb))
        .unwrap();
    let mut back = vec![0u8; 16384];
    h.read(1, 1, 0, 32, &mut back, idle!(l.clk, t, cmb))
        .unwrap();
    // Write Zeroes and Flush are neither reads nor writes of data.
    h.write_zeroes(1, 1, 0, 8, idle!(l.clk, t, cmb)).unwrap();
    h.flush(1, 1, idle!(l.clk, t, cmb)).unwrap();
    h.get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(field(&smart, log::SMART_DATA_UNITS_WRITTEN), 2);
    assert_eq!(field(&smart, log::SMART_DATA_UNITS_READ), 1);
    assert_eq!(field(&smart, log::SMART_HOST_WRITES), 32);
    assert_eq!(field(&smart, log::SMART_HOST_READS), 1);
    assert_eq!(field(&smart, log::SMART_BUSY_MINUTES), 0);
    assert_eq!(field(&smart, log::SMART_MEDIA_ERRORS), 0);
    assert_eq!(field(&smart, log::SMART_ERROR_ENTRIES), 0);
    // One write that keeps the controller busy for 61 s: one minute of busy time. Then 100 s
    // idle: still one minute (idle time is not busy time).
    delay.set(61_000_000);
    h.write(1, 1, 0, 8, &data[..4096], idle!(l.clk, t, cmb))
        .unwrap();
    delay.set(0);
    for _ in 0..10 {
        l.clk.advance(10_000_000);
        t.poll(&mut cmb);
        h.poll();
    }
    h.get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(field(&smart, log::SMART_BUSY_MINUTES), 1);
    assert_eq!(field(&smart, log::SMART_HOST_WRITES), 33);
    let busy = t.controllers().next().unwrap().busy_time_us(t.now_us());
    assert!((61_000_000..62_000_000).contains(&busy), "{busy}");
    // The fields lie where Linux's `struct nvme_smart_log` has them: the high 8 bytes of
    // each 16-byte counter are 0, and so is everything not filled.
    for at in [32, 48, 64, 80, 96, 112, 128, 144, 160, 176] {
        assert!(smart[at + 8..at + 16].iter().all(|&b| b == 0));
    }
    assert!(smart[..32].iter().all(|&b| b == 0));
    assert!(smart[192..].iter().all(|&b| b == 0));
    // Part of the page, from an offset.
    let mut part = [0u8; 16];
    h.get_log_page(log::SMART, 80, &mut part, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(field(&part, 0), 33);
    let _ = &mut cma;
}

#[test]
fn power_on_hours_count_from_the_targets_start() {
    let l = lab();
    let sa = side(&l.a);
    let sb = side(&l.b);
    let mut cma = cm(&sa, &l.clk);
    let mut cmb = target_cm(&sb, &l.clk);
    let mut mem = vec![0u8; 1 << 16];
    let mut disk = RamDisk::new(&mut mem, 512);
    let mut nss: [&mut dyn BlockDevice; 1] = [&mut disk];
    let mut subs = [Subsystem::new(NQN, &mut nss)];
    let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
    // Two hours and a bit before the host comes.
    l.clk.advance(2 * 3_600_000_000 + 5_000_000);
    t.poll(&mut cmb);
    let mut h: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), hcfg(HOST_A));
    h.connect(&mut cma, idle!(l.clk, t, cmb)).unwrap();
    let mut smart = [0u8; 512];
    h.get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(field(&smart, log::SMART_POWER_ON_HOURS), 2);
}

#[test]
fn counts_outlive_their_queues() {
    rig!(l, t, h, cma, cmb, delay);
    let data = pattern(4096, 5);
    h.write(1, 1, 0, 8, &data, idle!(l.clk, t, cmb)).unwrap();
    h.write(2, 1, 8, 8, &data, idle!(l.clk, t, cmb)).unwrap();
    let cntlid = h.cntlid();
    let live = t.ctrl_counts(cntlid).unwrap();
    h.disconnect(&mut cma, idle!(l.clk, t, cmb)).unwrap();
    for _ in 0..100 {
        l.clk.advance(100);
        t.poll(&mut cmb);
        let _ = cma.poll();
    }
    assert_eq!(t.queues_in_use(), 0);
    assert_eq!(t.ctrl_counts(cntlid), None, "the controller is gone");
    let all = t.io_counts();
    assert_eq!((all.writes, all.bytes_written), (2, 8192));
    assert!(all.commands >= live.commands);
    assert_eq!(all.commands, t.counts().commands);
    let _ = &delay;
}

#[test]
fn every_refusal_is_logged_with_its_reason() {
    let l = lab();
    let (sa, sb, sc) = (side(&l.a), side(&l.b), side(&l.c));
    let (mut cma, mut cmb, mut cmc) = (cm(&sa, &l.clk), target_cm(&sb, &l.clk), cm(&sc, &l.clk));
    let mut mem = vec![0u8; 1 << 16];
    let mut disk = RamDisk::new(&mut mem, 512);
    let mut nss: [&mut dyn BlockDevice; 1] = [&mut disk];
    let allowed = [HOST_C];
    let mut subs = [Subsystem {
        allowed_hosts: &allowed,
        ..Subsystem::new(NQN, &mut nss)
    }];
    let mut t: T = T::new(&sb.pd, &sb.dcq, l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
    assert_eq!((t.counts().refusals, t.refusal(1)), (0, None));
    // Host A is not on the list.
    let mut ha: H = H::new(&sa.pd, &sa.dcq, l.clk.clone(), hcfg(HOST_A));
    assert_eq!(
        ha.connect(&mut cma, idle!(l.clk, t, cmb)),
        Err(HostError::Status(Status::CONNECT_INVALID_HOST))
    );
    assert_eq!(t.counts().refusals, 1);
    let r = t.refusal(1).unwrap();
    assert_eq!(r.seq, 1);
    assert_eq!(r.station, IP_A);
    assert_eq!(
        r.reason,
        RefusalReason::Connect(Status::CONNECT_INVALID_HOST, 0)
    );
    assert_eq!(
        r.hostnqn.map(|n| n.as_str().to_string()),
        Some(HOST_A.into())
    );
    assert_eq!(r.reason.to_string(), "Connect: host not allowed");
    // Host C asks for a subsystem that does not exist.
    let mut cfg = hcfg(HOST_C);
    cfg.subnqn = "nqn.2026-11.io.bareverbs:nobody";
    let mut hc: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), cfg);
    assert_eq!(
        hc.connect(&mut cmc, idle!(l.clk, t, cmb)),
        Err(HostError::Status(Status::CONNECT_INVALID_PARAM))
    );
    let r = t.refusal(2).unwrap();
    assert_eq!((r.seq, r.station), (2, IP_C));
    assert!(matches!(
        r.reason,
        RefusalReason::Connect(Status::CONNECT_INVALID_PARAM, dw0) if dw0 != 0
    ));
    // A connection request whose private data names an I/O queue beyond the target's: the
    // CM's REJ, logged with its status.
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = sa
        .pd
        .qp_builder(&sa.dcq, &sa.dcq)
        .caps(caps)
        .build::<Rc>()
        .unwrap();
    let req = CmReq {
        recfmt: 0,
        qid: 9,
        hrqsize: 32,
        hsqsize: 31,
        cntlid: 0,
    }
    .to_bytes();
    let params = ConnectParams {
        private_data: &req,
        ..ConnectParams::default()
    };
    cma.connect(qp, IP_B, 4420, &params).unwrap();
    let mut failed = false;
    for _ in 0..1000 {
        l.clk.advance(100);
        t.poll(&mut cmb);
        if let Some(CmEvent::Failed { .. }) = cma.poll() {
            failed = true;
            break;
        }
    }
    assert!(failed, "rejected");
    assert_eq!(t.counts().refusals, 3);
    let r = t.refusal(3).unwrap();
    assert_eq!(r.reason, RefusalReason::Request(CmRejStatus::InvalidQid));
    assert_eq!((r.station, r.hostnqn), (IP_A, None));
    assert!(r.at_us > 0 && r.at_us <= l.clk.now_us());
    // The allowed host gets in: no refusal.
    let mut hc: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), hcfg(HOST_C));
    hc.connect(&mut cmc, idle!(l.clk, t, cmb)).unwrap();
    assert_eq!(t.counts().refusals, 3);
}

/// Ends the host's association (a clean disconnect) and waits until the target let go of
/// its controller.
macro_rules! gone {
    ($l:ident, $t:ident, $h:ident, $cma:ident, $cmb:ident) => {
        let cntlid = $h.cntlid();
        $h.disconnect(&mut $cma, idle!($l.clk, $t, $cmb)).unwrap();
        // (Long enough for the connections' time-wait to end on both sides.)
        for _ in 0..2_000 {
            $l.clk.advance(1_000);
            $t.poll(&mut $cmb);
            let _ = $cma.poll();
        }
        assert_eq!($t.ctrl_counts(cntlid), None, "the controller is gone");
    };
}

/// A host that reconnects (a new controller: its last one ended) reads on in its SMART log
/// where its last controller stopped, as from a drive that stayed on; another host, and the
/// same NQN with another host ID, read none of it and change none of it.
#[test]
fn a_reconnecting_host_reads_on_from_its_last_controllers_smart_counts() {
    rig!(l, t, h, cma, cmb, delay);
    let data = pattern(4096, 6);
    for k in 0..3 {
        h.write(1, 1, 8 * k, 8, &data, idle!(l.clk, t, cmb))
            .unwrap();
    }
    let mut back = vec![0u8; 4096];
    h.read(1, 1, 0, 8, &mut back, idle!(l.clk, t, cmb)).unwrap();
    // One error logged (an opcode the controller does not have).
    let r = h.exec(
        0,
        Sqe::new(0xC5, 0),
        Data::None,
        &mut [],
        idle!(l.clk, t, cmb),
    );
    assert_eq!(r, Err(HostError::Status(Status::INVALID_OPCODE)));
    let first = h.cntlid();
    assert!(t.histories().is_empty());
    gone!(l, t, h, cma, cmb);
    assert_eq!(t.histories().len(), 1);
    // Back: a new controller, the counts go on.
    h.connect(&mut cma, idle!(l.clk, t, cmb)).unwrap();
    assert_ne!(h.cntlid(), first, "a new controller");
    // The history is the live controller's now, not the table's.
    assert!(t.histories().is_empty());
    let mut smart = [0u8; 512];
    h.get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(field(&smart, log::SMART_HOST_WRITES), 3);
    assert_eq!(field(&smart, log::SMART_HOST_READS), 1);
    assert_eq!(field(&smart, log::SMART_DATA_UNITS_WRITTEN), 1);
    assert_eq!(field(&smart, log::SMART_ERROR_ENTRIES), 1);
    h.write(1, 1, 0, 8, &data, idle!(l.clk, t, cmb)).unwrap();
    h.get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(field(&smart, log::SMART_HOST_WRITES), 4);
    // The controller's own counts stay its own (the API's per-controller view).
    assert_eq!(t.ctrl_counts(h.cntlid()).unwrap().writes, 1);
    // A second time round: 4 writes kept.
    gone!(l, t, h, cma, cmb);
    h.connect(&mut cma, idle!(l.clk, t, cmb)).unwrap();
    h.get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(field(&smart, log::SMART_HOST_WRITES), 4);
    assert_eq!(field(&smart, log::SMART_HOST_READS), 1);

    // Another host (another NQN, from another station), while A is connected and while A is
    // gone: its own counts only, and nothing it does reaches A's.
    let sc = side(&l.c);
    let mut cmc = cm(&sc, &l.clk);
    let mut other: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), hcfg(HOST_C));
    other.connect(&mut cmc, idle!(l.clk, t, cmb)).unwrap();
    other
        .get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(field(&smart, log::SMART_HOST_WRITES), 0);
    other
        .write(1, 1, 64, 8, &data, idle!(l.clk, t, cmb))
        .unwrap();
    other
        .get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    gone!(l, t, h, cma, cmb);
    other
        .get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(field(&smart, log::SMART_HOST_WRITES), 1);
    assert_eq!(field(&smart, log::SMART_HOST_READS), 0);
    other.disconnect(&mut cmc, idle!(l.clk, t, cmb)).unwrap();
    for _ in 0..2_000 {
        l.clk.advance(1_000);
        t.poll(&mut cmb);
        let _ = cmc.poll();
    }
    assert_eq!(t.histories().len(), 2);

    // A's NQN with another host ID: another host to the target, none of A's counts.
    let mut cfg = hcfg(HOST_A);
    cfg.hostid = [0x5A; 16];
    let mut twin: H = H::new(&sc.pd, &sc.dcq, l.clk.clone(), cfg);
    twin.connect(&mut cmc, idle!(l.clk, t, cmb)).unwrap();
    twin.get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(field(&smart, log::SMART_HOST_WRITES), 0);
    assert_eq!(field(&smart, log::SMART_ERROR_ENTRIES), 0);
    // A, back once more: its 4 writes, not the other host's.
    h.connect(&mut cma, idle!(l.clk, t, cmb)).unwrap();
    h.get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(field(&smart, log::SMART_HOST_WRITES), 4);
    let _ = &delay;
}
