//! Durability, on a disk double with a volatile write cache that a "crash" empties: a write is
//! answered only once the disk took it, a Flush only once the disk's flush returned, a write
//! with Force Unit Access (or of a controller whose write cache the host disabled) is on
//! stable media before its answer, a Read with Force Unit Access flushes first; the Volatile
//! Write Cache bit says which medium has a cache; a disk that fails a write, a flush or a read
//! answers the host with an error status, never a success.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use bareverbs_nvmf::block::{BlockDevice, BlockError, RamDisk};
use bareverbs_nvmf::host::{Data, HostError};
use bareverbs_nvmf::target::Subsystem;
use bareverbs_nvmf::wire::identify::IDENTIFY_LEN;
use bareverbs_nvmf::wire::{Sqe, Status, feature, log, opcode, prop};
use common::*;

const NQN_DISK: &str = "nqn.2026-11.io.bareverbs:cached";

/// What the disk double was asked to do, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Read(u64),
    Write(u64),
    Zeroes(u64),
    Flush,
}

/// The disk double's state, shared with the test while the target holds the disk: its
/// stable bytes (what a crash leaves), its cache (what a crash loses), what it was asked.
#[derive(Default)]
struct Shared {
    stable: Vec<u8>,
    cached: Vec<(usize, Vec<u8>)>,
    ops: Vec<Op>,
    fail_write: bool,
    fail_flush: bool,
    fail_read: bool,
}

impl Shared {
    /// The stable bytes of blocks `lba..lba + n`.
    fn stable(&self, lba: usize, n: usize) -> &[u8] {
        &self.stable[lba * 512..(lba + n) * 512]
    }
}

/// A disk of 512-byte blocks with a volatile write cache (or without: `cache` false): a
/// write lands in the cache, a flush moves the cache to stable media, a crash loses the
/// cache.
struct CacheDisk {
    cache: bool,
    s: Rc<RefCell<Shared>>,
}

impl CacheDisk {
    fn new(blocks: usize, cache: bool) -> (CacheDisk, Rc<RefCell<Shared>>) {
        let s = Rc::new(RefCell::new(Shared {
            stable: vec![0; blocks * 512],
            ..Shared::default()
        }));
        (
            CacheDisk {
                cache,
                s: s.clone(),
            },
            s,
        )
    }

    fn put(&mut self, at: usize, data: Vec<u8>) {
        let mut s = self.s.borrow_mut();
        if self.cache {
            s.cached.push((at, data));
        } else {
            s.stable[at..at + data.len()].copy_from_slice(&data);
        }
    }
}

impl BlockDevice for CacheDisk {
    fn block_size(&self) -> u32 {
        512
    }
    fn capacity(&self) -> u64 {
        (self.s.borrow().stable.len() / 512) as u64
    }
    fn read(&mut self, lba: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let mut s = self.s.borrow_mut();
        s.ops.push(Op::Read(lba));
        if s.fail_read {
            return Err(BlockError::Io);
        }
        let at = lba as usize * 512;
        buf.copy_from_slice(&s.stable[at..at + buf.len()]);
        // The cache over the stable bytes, oldest first.
        for (w, data) in &s.cached {
            for (i, b) in data.iter().enumerate() {
                if (at..at + buf.len()).contains(&(w + i)) {
                    buf[w + i - at] = *b;
                }
            }
        }
        Ok(())
    }
    fn write(&mut self, lba: u64, buf: &[u8]) -> Result<(), BlockError> {
        {
            let mut s = self.s.borrow_mut();
            s.ops.push(Op::Write(lba));
            if s.fail_write {
                return Err(BlockError::Io);
            }
        }
        self.put(lba as usize * 512, buf.to_vec());
        Ok(())
    }
    fn flush(&mut self) -> Result<(), BlockError> {
        let mut s = self.s.borrow_mut();
        s.ops.push(Op::Flush);
        if s.fail_flush {
            // A failed write-back: what the cache held is gone.
            s.cached.clear();
            return Err(BlockError::Io);
        }
        let cached = std::mem::take(&mut s.cached);
        for (at, data) in cached {
            s.stable[at..at + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }
    fn volatile_cache(&self) -> bool {
        self.cache
    }
    fn write_zeroes(&mut self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.s.borrow_mut().ops.push(Op::Zeroes(lba));
        self.put(lba as usize * 512, vec![0u8; blocks as usize * 512]);
        Ok(())
    }
}

/// A write command of `blocks` blocks at `slba` on namespace 1, with Force Unit Access when
/// `fua`.
fn write_sqe(slba: u64, blocks: u32, fua: bool) -> Sqe {
    let mut s = Sqe::rw(opcode::WRITE, 0, 1, slba, blocks);
    if fua {
        s.set_cdw(12, s.cdw(12) | 1 << 30);
    }
    s
}

/// Runs the target while a host call waits.
macro_rules! idle {
    ($clk:expr, $t:ident, $cmb:ident) => {
        &mut || {
            $clk.advance(20);
            $t.poll(&mut $cmb);
        }
    };
}

/// A target on B with a RAM subsystem (`NQN`) and one on the disk double (`NQN_DISK`), host A
/// connected to `$sub`.
macro_rules! rig {
    ($l:ident, $t:ident, $h:ident, $cma:ident, $cmb:ident, $shared:ident, $cache:expr, $sub:expr) => {
        let $l = lab();
        let sa = side(&$l.a);
        let sb = side(&$l.b);
        let mut $cma = cm(&sa, &$l.clk);
        let mut $cmb = target_cm(&sb, &$l.clk);
        let mut mem = vec![0u8; 1 << 20];
        let mut ram = RamDisk::new(&mut mem, 512);
        let (mut disk, $shared) = CacheDisk::new(2048, $cache);
        let mut n1: [&mut dyn BlockDevice; 1] = [&mut ram];
        let mut n2: [&mut dyn BlockDevice; 1] = [&mut disk];
        let mut subs = [
            Subsystem::new(NQN, &mut n1),
            Subsystem::new(NQN_DISK, &mut n2),
        ];
        let mut $t: T = T::new(&sb.pd, &sb.dcq, $l.clk.clone(), IP_B, tcfg(), &mut subs).unwrap();
        let mut cfg = hcfg(HOST_A);
        cfg.subnqn = $sub;
        let mut $h: H = H::new(&sa.pd, &sa.dcq, $l.clk.clone(), cfg);
        $h.connect(&mut $cma, idle!($l.clk, $t, $cmb)).unwrap();
    };
}

fn vwc(h: &mut H, idle: &mut dyn FnMut()) -> u8 {
    let mut b = vec![0u8; IDENTIFY_LEN];
    h.identify(1, 0, &mut b, idle).unwrap();
    b[525]
}

fn get_wce(h: &mut H, idle: &mut dyn FnMut()) -> Result<u64, HostError> {
    let mut s = Sqe::new(opcode::GET_FEATURES, 0);
    s.set_cdw(10, u32::from(feature::VOLATILE_WC));
    h.exec(0, s, Data::None, &mut [], idle).map(|c| c.result)
}

fn set_wce(h: &mut H, on: bool, idle: &mut dyn FnMut()) -> Result<(), HostError> {
    let mut s = Sqe::new(opcode::SET_FEATURES, 0);
    s.set_cdw(10, u32::from(feature::VOLATILE_WC));
    s.set_cdw(11, u32::from(on));
    h.exec(0, s, Data::None, &mut [], idle).map(|_| ())
}

fn ops(s: &Rc<RefCell<Shared>>) -> Vec<Op> {
    std::mem::take(&mut s.borrow_mut().ops)
}

fn status<T: std::fmt::Debug>(r: Result<T, HostError>) -> Status {
    match r {
        Err(HostError::Status(s)) => s,
        other => panic!("expected an error status, got {other:?}"),
    }
}

#[test]
fn a_medium_with_a_cache_sets_the_volatile_write_cache_bit() {
    rig!(l, t, h, cma, cmb, shared, true, NQN_DISK);
    assert_eq!(vwc(&mut h, idle!(l.clk, t, cmb)), 1);
    assert_eq!(
        get_wce(&mut h, idle!(l.clk, t, cmb)),
        Ok(1),
        "enabled at first"
    );
    assert!(
        ops(&shared).is_empty(),
        "Identify and features touch no medium"
    );
}

#[test]
fn a_medium_without_a_cache_clears_it() {
    // The disk double without a cache, and the RAM disk: no bit, no feature to set.
    rig!(l, t, h, cma, cmb, shared, false, NQN_DISK);
    assert_eq!(vwc(&mut h, idle!(l.clk, t, cmb)), 0);
    assert_eq!(
        status(get_wce(&mut h, idle!(l.clk, t, cmb))),
        Status::INVALID_FIELD
    );
    assert_eq!(
        status(set_wce(&mut h, false, idle!(l.clk, t, cmb))),
        Status::INVALID_FIELD
    );
    // Force Unit Access on it: the write only (it is on the medium when it returns).
    let data = pattern(4096, 1);
    h.exec(
        1,
        write_sqe(8, 8, true),
        Data::Out(&data),
        &mut [],
        idle!(l.clk, t, cmb),
    )
    .unwrap();
    assert_eq!(ops(&shared), [Op::Write(8)]);
    assert_eq!(shared.borrow().stable(8, 8), &data[..]);
    let _ = &mut cma;
}

#[test]
fn the_ram_disk_has_no_volatile_write_cache() {
    rig!(l, t, h, cma, cmb, shared, true, NQN);
    assert_eq!(vwc(&mut h, idle!(l.clk, t, cmb)), 0);
    assert_eq!(
        status(get_wce(&mut h, idle!(l.clk, t, cmb))),
        Status::INVALID_FIELD
    );
    // A Flush there completes (there is nothing to flush); the other subsystem's disk is
    // not touched.
    h.flush(1, 1, idle!(l.clk, t, cmb)).unwrap();
    assert!(ops(&shared).is_empty());
    let _ = &mut cma;
}

#[test]
fn a_plain_write_may_stay_cached_until_a_flush() {
    rig!(l, t, h, cma, cmb, shared, true, NQN_DISK);
    let data = pattern(8192, 2);
    h.write(1, 1, 16, 16, &data, idle!(l.clk, t, cmb)).unwrap();
    assert_eq!(
        ops(&shared),
        [Op::Write(16)],
        "answered once the disk took it"
    );
    assert!(
        shared.borrow().stable(16, 16).iter().all(|&b| b == 0),
        "in the cache only: a crash now would lose it (allowed: no flush yet)"
    );
    // Read back through the cache.
    let mut back = vec![0u8; 8192];
    h.read(1, 1, 16, 16, &mut back, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(back, data);
    ops(&shared);
    // Flush: answered after the disk's flush, and the data is on stable media.
    h.flush(2, 1, idle!(l.clk, t, cmb)).unwrap();
    assert_eq!(ops(&shared), [Op::Flush]);
    assert_eq!(shared.borrow().stable(16, 16), &data[..]);
    let _ = &mut cma;
}

#[test]
fn force_unit_access_flushes_a_cached_medium_before_the_answer() {
    rig!(l, t, h, cma, cmb, shared, true, NQN_DISK);
    let data = pattern(4096, 3);
    // In the capsule, and keyed (16 KiB).
    h.exec(
        1,
        write_sqe(40, 8, true),
        Data::Out(&data),
        &mut [],
        idle!(l.clk, t, cmb),
    )
    .unwrap();
    assert_eq!(ops(&shared), [Op::Write(40), Op::Flush]);
    assert_eq!(shared.borrow().stable(40, 8), &data[..], "on stable media");
    let big = pattern(16384, 4);
    h.exec(
        2,
        write_sqe(100, 32, true),
        Data::Out(&big),
        &mut [],
        idle!(l.clk, t, cmb),
    )
    .unwrap();
    assert_eq!(ops(&shared), [Op::Write(100), Op::Flush]);
    assert_eq!(shared.borrow().stable(100, 32), &big[..]);
    // Write Zeroes with FUA: zeroes, then a flush.
    let mut z = Sqe::rw(opcode::WRITE_ZEROES, 0, 1, 100, 4);
    z.set_cdw(12, z.cdw(12) | 1 << 30);
    h.exec(1, z, Data::None, &mut [], idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(ops(&shared), [Op::Zeroes(100), Op::Flush]);
    assert!(shared.borrow().stable(100, 4).iter().all(|&b| b == 0));
    // A Read with FUA: the flush comes first.
    let mut r = Sqe::rw(opcode::READ, 0, 1, 40, 8);
    r.set_cdw(12, r.cdw(12) | 1 << 30);
    let mut back = vec![0u8; 4096];
    h.exec(1, r, Data::In(4096), &mut back, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(ops(&shared), [Op::Flush, Op::Read(40)]);
    assert_eq!(back, data);
    // The counts saw each flush.
    let cntlid = h.cntlid();
    assert_eq!(t.ctrl_counts(cntlid).unwrap().medium_flushes, 3 + 1);
    let _ = &mut cma;
}

#[test]
fn a_disabled_write_cache_writes_through() {
    rig!(l, t, h, cma, cmb, shared, true, NQN_DISK);
    set_wce(&mut h, false, idle!(l.clk, t, cmb)).unwrap();
    assert_eq!(get_wce(&mut h, idle!(l.clk, t, cmb)), Ok(0));
    let data = pattern(4096, 5);
    h.write(1, 1, 0, 8, &data, idle!(l.clk, t, cmb)).unwrap();
    assert_eq!(ops(&shared), [Op::Write(0), Op::Flush]);
    assert_eq!(shared.borrow().stable(0, 8), &data[..]);
    // Reads are not flushed for it.
    let mut back = vec![0u8; 4096];
    h.read(1, 1, 0, 8, &mut back, idle!(l.clk, t, cmb)).unwrap();
    assert_eq!(ops(&shared), [Op::Read(0)]);
    // On again: writes stay in the cache.
    set_wce(&mut h, true, idle!(l.clk, t, cmb)).unwrap();
    h.write(1, 1, 8, 8, &data, idle!(l.clk, t, cmb)).unwrap();
    assert_eq!(ops(&shared), [Op::Write(8)]);
    // Off, then a controller reset (CC.EN cleared and set): on again, as every feature.
    set_wce(&mut h, false, idle!(l.clk, t, cmb)).unwrap();
    let cc = h
        .property_get(prop::CC, false, idle!(l.clk, t, cmb))
        .unwrap() as u32;
    h.property_set(prop::CC, cc & !prop::CC_EN, idle!(l.clk, t, cmb))
        .unwrap();
    h.property_set(prop::CC, cc, idle!(l.clk, t, cmb)).unwrap();
    assert_eq!(get_wce(&mut h, idle!(l.clk, t, cmb)), Ok(1));
    let _ = &mut cma;
}

#[test]
fn a_disk_that_fails_a_flush_answers_an_error_never_a_success() {
    rig!(l, t, h, cma, cmb, shared, true, NQN_DISK);
    let data = pattern(4096, 6);
    h.write(1, 1, 24, 8, &data, idle!(l.clk, t, cmb)).unwrap();
    shared.borrow_mut().fail_flush = true;
    // The Flush: a write fault, do not retry.
    let st = status(h.flush(1, 1, idle!(l.clk, t, cmb)));
    assert_eq!(st, Status::WRITE_FAULT);
    assert!(st.dnr() && !st.is_ok());
    assert_eq!(ops(&shared), [Op::Write(24), Op::Flush]);
    // A FUA write whose flush fails: the same, though the write itself went through.
    let st = status(h.exec(
        2,
        write_sqe(32, 8, true),
        Data::Out(&data),
        &mut [],
        idle!(l.clk, t, cmb),
    ));
    assert_eq!(st, Status::WRITE_FAULT);
    assert_eq!(ops(&shared), [Op::Write(32), Op::Flush]);
    // The error log and the SMART log say so; the queues stay up.
    let mut page = [0u8; 64];
    h.get_log_page(log::ERROR, 0, &mut page, idle!(l.clk, t, cmb))
        .unwrap();
    let e = log::ErrorEntry::parse(&page).unwrap();
    assert_eq!(
        (e.count, e.sqid, e.status, e.lba),
        (2, 2, Status::WRITE_FAULT, 32)
    );
    let mut smart = [0u8; 512];
    h.get_log_page(log::SMART, 0, &mut smart, idle!(l.clk, t, cmb))
        .unwrap();
    assert_eq!(log::smart_field(&smart, log::SMART_MEDIA_ERRORS), 2);
    assert_eq!(log::smart_field(&smart, log::SMART_ERROR_ENTRIES), 2);
    // The disk recovers: a flush succeeds again.
    shared.borrow_mut().fail_flush = false;
    h.flush(1, 1, idle!(l.clk, t, cmb)).unwrap();
    let _ = &mut cma;
}

#[test]
fn a_disk_that_fails_a_write_or_a_read_answers_an_error() {
    rig!(l, t, h, cma, cmb, shared, true, NQN_DISK);
    let data = pattern(16384, 7);
    shared.borrow_mut().fail_write = true;
    // In the capsule and keyed: a write fault, and nothing reached the disk.
    assert_eq!(
        status(h.write(1, 1, 0, 8, &data[..4096], idle!(l.clk, t, cmb))),
        Status::WRITE_FAULT
    );
    assert_eq!(
        status(h.write(2, 1, 64, 32, &data, idle!(l.clk, t, cmb))),
        Status::WRITE_FAULT
    );
    // FUA: the write fails, no flush follows.
    assert_eq!(
        status(h.exec(
            1,
            write_sqe(0, 8, true),
            Data::Out(&data[..4096]),
            &mut [],
            idle!(l.clk, t, cmb)
        )),
        Status::WRITE_FAULT
    );
    assert_eq!(ops(&shared), [Op::Write(0), Op::Write(64), Op::Write(0)]);
    {
        let s = shared.borrow();
        assert!(s.cached.is_empty() && s.stable.iter().all(|&b| b == 0));
    }
    shared.borrow_mut().fail_write = false;
    shared.borrow_mut().fail_read = true;
    let mut back = vec![0u8; 4096];
    let st = status(h.read(1, 1, 0, 8, &mut back, idle!(l.clk, t, cmb)));
    assert_eq!(st, Status::MEDIA_ERROR, "an unrecovered read error");
    assert!(!st.dnr(), "a read may be retried");
    let c = t.ctrl_counts(h.cntlid()).unwrap();
    assert_eq!(c.media_errors, 4);
    assert_eq!(c.errors_with(Status::WRITE_FAULT), 3);
    assert_eq!(c.errors_with(Status::MEDIA_ERROR), 1);
    assert_eq!((c.writes, c.reads, c.bytes_written), (0, 0, 0));
    let _ = &mut cma;
}
