//! The NVMe driver against the controller model of bareverbs-model: bring-up, data round
//! trips checked byte by byte (in the driver's reads and in the model's medium), PRP lists,
//! 4096-byte blocks, the optional commands present and absent, and every hostile behaviour
//! of the model ending in a typed error, with the memory returned or kept as it must be.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use bareverbs_hal::{Hal, MsiMessage, PAGE_SIZE};
use bareverbs_model::nvme::{Fault, IdentifyLie, MsixLie, NsConfig, NvmeConfig, NvmeModel};
use bareverbs_nvmf::{BlockDevice, BlockError};
use bareverbs_storage::nvme::{
    MsixError, NsDisk, Nvme, NvmeError, Options, Pages, State, Unsupported, Violation, find_nth,
};

/// A clock that moves a millisecond at every look: every bounded wait ends.
fn tick() -> u64 {
    static T: AtomicU64 = AtomicU64::new(0);
    T.fetch_add(1, Ordering::Relaxed)
}

fn opts() -> Options {
    Options {
        command_timeout_ms: 50,
        ..Options::default()
    }
}

fn up_with(m: &NvmeModel, o: Options) -> Result<Nvme<NvmeModel>, NvmeError> {
    // SAFETY: the model's function is this driver's alone; the model maps its BAR.
    unsafe { Nvme::new(m.clone(), m, NvmeModel::address(), tick, o) }
}

fn up(m: &NvmeModel) -> Nvme<NvmeModel> {
    up_with(m, opts()).expect("bring-up")
}

fn two_namespaces() -> NvmeConfig {
    NvmeConfig {
        namespaces: vec![
            NsConfig {
                blocks: 4096,
                block_size: 512,
            },
            NsConfig {
                blocks: 1024,
                block_size: 4096,
            },
        ],
        ..NvmeConfig::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// The model's medium for `blocks` blocks at `lba`.
fn medium(m: &NvmeModel, nsid: u32, lba: u64, blocks: u64) -> Vec<u8> {
    (lba..lba + blocks).flat_map(|l| m.block(nsid, l)).collect()
}

fn clean(m: &NvmeModel) {
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

#[test]
fn bring_up_identifies_the_controller_and_its_namespaces() {
    let m = NvmeModel::new(two_namespaces());
    assert_eq!(find_nth(&m, 0), Some(NvmeModel::address()));
    assert_eq!(find_nth(&m, 1), None);
    let n = up(&m);
    assert_eq!(n.state(), State::Ready);
    assert_eq!(n.io_queues(), 1);
    let info = *n.info();
    assert_eq!(info.vid, 0x1B36);
    assert_eq!(&info.serial[..15], b"bareverbs-model");
    assert_eq!(info.version, 0x0001_0400);
    assert_eq!(info.nn, 2);
    assert!(info.vwc && info.write_zeroes() && info.dataset_management());
    // MDTS 7: 512 KiB, above the bounce buffer's 128 KiB.
    assert_eq!(info.max_transfer, 128 * 1024);
    let ns: Vec<_> = n.namespaces().copied().collect();
    assert_eq!(ns.len(), 2);
    assert_eq!((ns[0].nsid, ns[0].blocks, ns[0].block_size), (1, 4096, 512));
    assert_eq!(
        (ns[1].nsid, ns[1].blocks, ns[1].block_size),
        (2, 1024, 4096)
    );
    assert_eq!(
        m.pci_command() & 0x6,
        0x6,
        "memory decoding and bus mastering on"
    );
    assert!(m.enabled());
    assert_eq!(m.counters().enables, 1);
    drop(n);
    assert!(!m.enabled(), "dropping disables the controller");
    assert_eq!(m.outstanding_pages(), 0, "and returns every page");
    clean(&m);
}

#[test]
fn reads_and_writes_round_trip_on_512_and_4096_byte_blocks() {
    let m = NvmeModel::new(two_namespaces());
    let mut n = up(&m);
    for (nsid, bs, lba) in [(1u32, 512usize, 7u64), (2, 4096, 3)] {
        // One block, a few, and more than the bounce buffer holds (several commands).
        for blocks in [1usize, 5, 300 * 512 / bs + 1] {
            let data = pattern(blocks * bs, nsid as u8 ^ blocks as u8);
            n.write(nsid, lba, &data).unwrap();
            assert_eq!(medium(&m, nsid, lba, blocks as u64), data, "on the medium");
            let mut back = vec![0u8; data.len()];
            n.read(nsid, lba, &mut back).unwrap();
            assert_eq!(back, data, "read back");
        }
    }
    assert!(
        m.counters().prp_list_entries > 0,
        "the long transfers went by PRP lists"
    );
    let s = n.stats();
    assert_eq!(s.submitted, s.completed, "every command completed once");
    assert_eq!(s.submitted, m.counters().fetched);
    assert_eq!(m.counters().posted, m.counters().fetched);
    drop(n);
    assert_eq!(m.outstanding_pages(), 0);
    clean(&m);
}

#[test]
fn zero_copy_pages_with_an_offset_and_a_prp_list() {
    let m = NvmeModel::new(NvmeConfig::default());
    let mut n = up(&m);
    // The caller's buffer: five pages of its own DMA memory, used from byte 512 of the first.
    let buf = m.dma_alloc(5).unwrap();
    let pa = buf.paddr;
    let rest: Vec<u64> = (1..5).map(|i| pa + i * PAGE_SIZE as u64).collect();
    let len = 4 * PAGE_SIZE;
    let data = pattern(len, 9);
    // SAFETY: the block is ours, 5 pages from `vaddr`.
    let bytes = unsafe { std::slice::from_raw_parts_mut(buf.vaddr.as_ptr(), 5 * PAGE_SIZE) };
    bytes[512..512 + len].copy_from_slice(&data);
    let pages = Pages {
        first: pa + 512,
        rest: &rest,
    };
    // SAFETY: the pages are DMA memory of the model, untouched until the call returns.
    unsafe { n.write_pages(0, 1, 100, pages, len) }.unwrap();
    assert_eq!(medium(&m, 1, 100, (len / 512) as u64), data);
    bytes.fill(0);
    // SAFETY: as above.
    unsafe { n.read_pages(0, 1, 100, pages, len) }.unwrap();
    assert_eq!(&bytes[512..512 + len], &data[..]);
    assert_eq!(
        bytes[..512],
        [0u8; 512],
        "nothing before the offset written"
    );
    assert!(m.counters().prp_list_entries >= 4);
    // Pages that do not describe the length, or an unaligned later page: refused, unsent.
    let before = m.counters().fetched;
    let short = Pages {
        first: pa + 512,
        rest: &rest[..2],
    };
    // SAFETY: refused before anything is sent.
    assert_eq!(
        unsafe { n.read_pages(0, 1, 100, short, len) },
        Err(NvmeError::InvalidArgument)
    );
    let odd = [pa + 4096 + 8];
    let bad = Pages {
        first: pa,
        rest: &odd,
    };
    // SAFETY: as above.
    assert_eq!(
        unsafe { n.read_pages(0, 1, 100, bad, 8192) },
        Err(NvmeError::InvalidArgument)
    );
    assert_eq!(m.counters().fetched, before);
    drop(n);
    // SAFETY: our block, the controller disabled.
    unsafe { m.dma_dealloc(buf) };
    assert_eq!(m.outstanding_pages(), 0);
    clean(&m);
}

#[test]
fn several_io_queues_each_carry_commands() {
    let m = NvmeModel::new(NvmeConfig {
        max_queues: 3,
        ..NvmeConfig::default()
    });
    let mut n = up_with(
        &m,
        Options {
            io_queues: 4,
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(n.io_queues(), 3, "as many as the controller granted");
    let buf = m.dma_alloc(1).unwrap();
    for q in 0..3 {
        let p = Pages {
            first: buf.paddr,
            rest: &[],
        };
        // SAFETY: our DMA page.
        unsafe { n.write_pages(q, 1, q as u64, p, 512) }.unwrap();
    }
    // SAFETY: refused: no fourth queue.
    let p = Pages {
        first: buf.paddr,
        rest: &[],
    };
    assert_eq!(
        unsafe { n.write_pages(3, 1, 0, p, 512) },
        Err(NvmeError::InvalidArgument)
    );
    assert_eq!(m.counters().writes, 3);
    drop(n);
    // SAFETY: ours; the controller disabled.
    unsafe { m.dma_dealloc(buf) };
    clean(&m);
}

#[test]
fn phase_tags_wrap_on_a_small_queue() {
    let m = NvmeModel::new(NvmeConfig {
        mqes: 3,
        ..NvmeConfig::default()
    });
    let mut n = up(&m);
    for i in 0..100u64 {
        let data = pattern(512, i as u8);
        n.write(1, i, &data).unwrap();
        let mut back = [0u8; 512];
        n.read(1, i, &mut back).unwrap();
        assert_eq!(back[..], data[..]);
    }
    let s = n.stats();
    assert_eq!(
        (s.submitted, s.completed),
        (s.completed, m.counters().posted)
    );
    clean(&m);
}

#[test]
fn flush_goes_to_the_controller_only_with_a_volatile_cache() {
    for vwc in [true, false] {
        let m = NvmeModel::new(NvmeConfig {
            vwc,
            ..NvmeConfig::default()
        });
        let n = RefCell::new(up(&m));
        let mut disk = NsDisk::new(&n, 1).unwrap();
        assert_eq!(disk.volatile_cache(), vwc);
        disk.write(0, &pattern(1024, 1)).unwrap();
        disk.flush().unwrap();
        assert_eq!(m.counters().flushes, u64::from(vwc));
        assert_eq!(n.borrow().stats().flushes, u64::from(vwc));
    }
}

#[test]
fn write_zeroes_and_dataset_management_when_oncs_has_them() {
    let m = NvmeModel::new(NvmeConfig::default());
    let mut n = up(&m);
    n.write(1, 10, &pattern(8 * 512, 3)).unwrap();
    n.write_zeroes(1, 11, 2).unwrap();
    n.deallocate(1, &[(15, 2), (17, 0xFFFF_FFFF)])
        .expect_err("a range past the end is refused");
    n.deallocate(1, &[(15, 2)]).unwrap();
    let c = m.counters();
    assert_eq!((c.write_zeroes, c.dsm), (1, 1));
    let mut back = vec![0u8; 8 * 512];
    n.read(1, 10, &mut back).unwrap();
    let want = pattern(8 * 512, 3);
    assert_eq!(back[..512], want[..512]);
    assert!(back[512..3 * 512].iter().all(|&b| b == 0), "zeroed");
    assert_eq!(back[3 * 512..5 * 512], want[3 * 512..5 * 512]);
    assert!(
        back[5 * 512..7 * 512].iter().all(|&b| b == 0),
        "deallocated"
    );
    clean(&m);
}

#[test]
fn without_them_the_driver_says_unsupported_and_the_disk_writes_zeroes() {
    let m = NvmeModel::new(NvmeConfig {
        write_zeroes: false,
        dsm: false,
        ..NvmeConfig::default()
    });
    let n = RefCell::new(up(&m));
    let before = m.counters().fetched;
    assert_eq!(
        n.borrow_mut().write_zeroes(1, 0, 1),
        Err(NvmeError::Unsupported(Unsupported::WriteZeroes))
    );
    assert_eq!(
        n.borrow_mut().deallocate(1, &[(0, 1)]),
        Err(NvmeError::Unsupported(Unsupported::DatasetManagement))
    );
    assert_eq!(m.counters().fetched, before, "nothing sent");
    let mut disk = NsDisk::new(&n, 1).unwrap();
    disk.write(0, &pattern(600 * 512, 5)).unwrap();
    // More than the bounce buffer: several written chunks of zeroes.
    disk.write_zeroes(1, 400).unwrap();
    assert!(medium(&m, 1, 1, 400).iter().all(|&b| b == 0));
    assert_eq!(m.block(1, 0), pattern(512, 5));
    assert_eq!(m.block(1, 401), pattern(600 * 512, 5)[401 * 512..402 * 512]);
    assert_eq!(m.counters().write_zeroes, 0);
    clean(&m);
}

#[test]
fn bad_arguments_are_refused_before_the_controller_sees_them() {
    let m = NvmeModel::new(two_namespaces());
    let mut n = up(&m);
    let before = m.counters().fetched;
    let mut b = vec![0u8; 512];
    assert_eq!(n.read(3, 0, &mut b), Err(NvmeError::NoNamespace));
    assert_eq!(n.read(1, 4096, &mut b), Err(NvmeError::OutOfRange));
    assert_eq!(n.read(1, u64::MAX, &mut b), Err(NvmeError::OutOfRange));
    assert_eq!(n.read(2, 0, &mut b), Err(NvmeError::InvalidArgument));
    assert_eq!(n.write(1, 0, &b[..100]), Err(NvmeError::InvalidArgument));
    assert_eq!(n.write_zeroes(1, 4000, 97), Err(NvmeError::OutOfRange));
    assert_eq!(m.counters().fetched, before);
    let n = RefCell::new(n);
    let mut disk = NsDisk::new(&n, 1).unwrap();
    assert_eq!(disk.read(4096, &mut b), Err(BlockError::OutOfRange));
    assert_eq!(disk.write(0, &b[..3]), Err(BlockError::Misaligned));
    assert!(NsDisk::new(&n, 9).is_none());
}

/// Every completion fault: a typed error, the controller stopped and brought back where
/// the protocol broke, the data path working again after `reset`, nothing completed twice.
#[test]
fn every_completion_lie_is_a_typed_error() {
    let cases = [
        (Fault::WrongCid, NvmeError::Protocol(Violation::UnknownCid)),
        (Fault::StalePhase, NvmeError::Timeout),
        (Fault::Withheld, NvmeError::Timeout),
        (Fault::SqHead, NvmeError::Protocol(Violation::SqHead)),
        (
            Fault::WrongQueue,
            NvmeError::Protocol(Violation::WrongQueue),
        ),
        (Fault::Status(0x80), NvmeError::Status { sct: 0, sc: 0x80 }),
        (Fault::Status(0x281), NvmeError::Status { sct: 2, sc: 0x81 }),
    ];
    for (fault, want) in cases {
        let m = NvmeModel::new(NvmeConfig::default());
        let mut n = up(&m);
        let data = pattern(1024, 7);
        m.inject(fault);
        assert_eq!(n.write(1, 0, &data), Err(want), "{fault:?}");
        let stopped = !matches!(want, NvmeError::Status { .. });
        assert_eq!(n.state() == State::Failed, stopped, "{fault:?}");
        if stopped {
            assert!(!m.enabled(), "{fault:?}: disabled");
            assert_eq!(n.write(1, 0, &data), Err(NvmeError::Stopped));
            n.reset().unwrap();
            assert_eq!(n.stats().resets, 1);
        }
        n.write(1, 0, &data).unwrap();
        let mut back = vec![0u8; 1024];
        n.read(1, 0, &mut back).unwrap();
        assert_eq!(back, data, "{fault:?}");
        let s = n.stats();
        assert!(s.completed <= s.submitted, "{fault:?}: {s:?}");
        drop(n);
        assert_eq!(m.outstanding_pages(), 0, "{fault:?}");
        clean(&m);
    }
}

#[test]
fn a_duplicate_completion_is_caught_by_the_next_command() {
    let m = NvmeModel::new(NvmeConfig::default());
    let mut n = up(&m);
    m.inject(Fault::Duplicate);
    n.write(1, 0, &pattern(512, 1)).unwrap();
    let mut b = [0u8; 512];
    assert_eq!(
        n.read(1, 0, &mut b),
        Err(NvmeError::Protocol(Violation::UnknownCid))
    );
    let s = n.stats();
    assert_eq!(
        s.completed,
        s.submitted - 1,
        "the read never completed; nothing twice"
    );
    assert_eq!(s.violations, 1);
    n.reset().unwrap();
    n.read(1, 0, &mut b).unwrap();
    assert_eq!(b[..], pattern(512, 1)[..]);
}

#[test]
fn lying_identify_fields_are_refused_or_left_out() {
    for (lie, outcome) in [
        (IdentifyLie::NszeHuge, Ok(0)),
        (IdentifyLie::LbaSize(3), Ok(0)),
        (IdentifyLie::LbaSize(40), Ok(0)),
        (IdentifyLie::FormatIndex, Ok(0)),
        (IdentifyLie::FormatIndexHigh, Ok(0)),
        (IdentifyLie::Metadata, Ok(0)),
        (IdentifyLie::NnHuge, Ok(1)),
        (IdentifyLie::ListOrder, Err(NvmeError::BadIdentify)),
        (
            IdentifyLie::EntrySizes,
            Err(NvmeError::Unsupported(Unsupported::EntrySizes)),
        ),
    ] {
        let m = NvmeModel::new(NvmeConfig::default());
        m.set_identify_lie(Some(lie));
        match (up_with(&m, opts()), outcome) {
            (Ok(n), Ok(served)) => {
                assert_eq!(n.namespaces().count(), served, "{lie:?}");
                assert_eq!(n.stats().ignored_namespaces as usize, 1 - served, "{lie:?}");
                if served == 0 {
                    let mut b = [0u8; 512];
                    let mut n = n;
                    assert_eq!(n.read(1, 0, &mut b), Err(NvmeError::NoNamespace));
                }
            }
            (Err(e), Err(want)) => assert_eq!(e, want, "{lie:?}"),
            (got, want) => panic!("{lie:?}: {:?} want {want:?}", got.map(|_| ())),
        }
        assert!(!m.enabled(), "{lie:?}");
        assert_eq!(m.outstanding_pages(), 0, "{lie:?}");
        clean(&m);
    }
}

#[test]
fn a_ready_bit_that_never_changes_ends_in_a_typed_error() {
    // Never stops: refused before any memory is given.
    let m = NvmeModel::new(NvmeConfig::default());
    m.set_stuck_ready(Some(true));
    assert_eq!(up_with(&m, opts()).err(), Some(NvmeError::DisableTimeout));
    assert_eq!(m.outstanding_pages(), 0);
    assert_eq!(m.pci_command() & 0x6, 0, "command register restored");
    // Never becomes ready.
    let m = NvmeModel::new(NvmeConfig::default());
    m.set_stuck_ready(Some(false));
    assert_eq!(up_with(&m, opts()).err(), Some(NvmeError::ReadyTimeout));
    assert_eq!(m.outstanding_pages(), 0);
    // Fatal.
    let m = NvmeModel::new(NvmeConfig::default());
    m.set_fatal(true);
    assert_eq!(up_with(&m, opts()).err(), Some(NvmeError::Fatal));
    assert_eq!(m.outstanding_pages(), 0);
    clean(&m);
}

#[test]
fn a_controller_that_will_not_stop_keeps_the_memory() {
    let m = NvmeModel::new(NvmeConfig::default());
    let mut n = up(&m);
    m.set_stuck_ready(Some(true));
    m.inject(Fault::Withheld);
    let mut b = [0u8; 512];
    assert_eq!(n.read(1, 0, &mut b), Err(NvmeError::Timeout));
    assert_eq!(n.state(), State::Wedged);
    assert_eq!(n.read(1, 0, &mut b), Err(NvmeError::Stopped));
    assert_eq!(n.reset(), Err(NvmeError::DisableTimeout));
    let pages = m.outstanding_pages();
    assert!(pages > 0);
    drop(n);
    assert_eq!(
        m.outstanding_pages(),
        pages,
        "kept for good: it may still write there"
    );
    clean(&m);
}

#[test]
fn doorbell_strides_and_queue_sizes() {
    // A stride that puts the doorbells past the window: refused.
    let m = NvmeModel::new(NvmeConfig {
        dstrd: 12,
        ..NvmeConfig::default()
    });
    assert_eq!(
        up_with(&m, opts()).err(),
        Some(NvmeError::Unsupported(Unsupported::DoorbellStride))
    );
    // A stride of 16 bytes: works.
    let m = NvmeModel::new(NvmeConfig {
        dstrd: 2,
        ..NvmeConfig::default()
    });
    let mut n = up(&m);
    n.write(1, 0, &pattern(512, 2)).unwrap();
    assert_eq!(m.block(1, 0), pattern(512, 2));
    // Queues of one entry: refused.
    let m = NvmeModel::new(NvmeConfig {
        mqes: 0,
        ..NvmeConfig::default()
    });
    assert_eq!(
        up_with(&m, opts()).err(),
        Some(NvmeError::Unsupported(Unsupported::QueueSize))
    );
    assert_eq!(m.outstanding_pages(), 0);
}

#[test]
fn out_of_dma_is_a_typed_error() {
    let m = NvmeModel::new(NvmeConfig {
        dma_pages: 8,
        ..NvmeConfig::default()
    });
    assert_eq!(up_with(&m, opts()).err(), Some(NvmeError::OutOfDma));
    assert!(!m.enabled());
}

#[test]
fn the_disk_maps_failures_to_block_errors() {
    let m = NvmeModel::new(NvmeConfig::default());
    let n = RefCell::new(up(&m));
    let mut disk = NsDisk::new(&n, 1).unwrap();
    m.inject(Fault::Status(0x281));
    assert_eq!(disk.write(0, &[1u8; 512]), Err(BlockError::Io));
    m.inject(Fault::Withheld);
    assert_eq!(disk.flush(), Err(BlockError::Io));
    assert_eq!(disk.read(0, &mut [0u8; 512]), Err(BlockError::Io));
    n.borrow_mut().reset().unwrap();
    disk.write(0, &[1u8; 512]).unwrap();
}

#[test]
fn the_callers_own_prp_list() {
    let m = NvmeModel::new(NvmeConfig::default());
    let mut n = up(&m);
    // Four data pages, not contiguous in the order used, and a list page of the caller's.
    let data: Vec<_> = (0..4).map(|_| m.dma_alloc(1).unwrap()).collect();
    let list = m.dma_alloc(1).unwrap();
    let order = [2usize, 0, 3, 1];
    // SAFETY: the list page is ours.
    let entries = unsafe { std::slice::from_raw_parts_mut(list.vaddr.as_ptr().cast::<u64>(), 512) };
    for (i, &k) in order[1..].iter().enumerate() {
        entries[i] = data[k].paddr.to_le();
    }
    let want = pattern(4 * PAGE_SIZE, 4);
    for (i, &k) in order.iter().enumerate() {
        // SAFETY: each data page is ours, one page from `vaddr`.
        let page = unsafe { std::slice::from_raw_parts_mut(data[k].vaddr.as_ptr(), PAGE_SIZE) };
        page.copy_from_slice(&want[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
    }
    let first = data[order[0]].paddr;
    // SAFETY: the pages and the list are DMA memory of the model, untouched until it returns.
    unsafe { n.transfer_prps(0, true, 1, 40, 4 * PAGE_SIZE, first, list.paddr) }.unwrap();
    assert_eq!(medium(&m, 1, 40, 32), want);
    let mut back = vec![0u8; 4 * PAGE_SIZE];
    n.read(1, 40, &mut back).unwrap();
    assert_eq!(back, want);
    // SAFETY: refused before anything is sent.
    assert_eq!(
        unsafe { n.transfer_prps(0, false, 1, 40, 512, first + 2, 0) },
        Err(NvmeError::InvalidArgument)
    );
    drop(n);
    for b in data.into_iter().chain([list]) {
        // SAFETY: ours; the controller is disabled.
        unsafe { m.dma_dealloc(b) };
    }
    assert_eq!(m.outstanding_pages(), 0);
    clean(&m);
}

/// `len` bytes at byte `off` of a DMA block of the model.
fn dma_slice(b: &bareverbs_hal::DmaBlock, off: usize, len: usize) -> &'static mut [u8] {
    assert!(off + len <= b.pages * PAGE_SIZE);
    // SAFETY: inside the block, which the test keeps until it deallocates it at the end.
    unsafe { std::slice::from_raw_parts_mut(b.vaddr.as_ptr().add(off), len) }
}

#[test]
fn the_disk_moves_dma_buffers_without_a_copy_through_prp_lists() {
    let m = NvmeModel::new(two_namespaces());
    let n = RefCell::new(up(&m));
    let mut d1 = NsDisk::new(&n, 1).unwrap();
    let mut d2 = NsDisk::new(&n, 2).unwrap();
    assert!(!d1.dma_allowed());
    // SAFETY: every buffer given below is DMA memory of the model, kept until the end.
    unsafe {
        d1.allow_dma();
        d2.allow_dma();
    }
    let block = m.dma_alloc(40).unwrap();
    // (namespace, lba, byte offset in the block, length, whether a PRP list is needed).
    let cases = [
        (1, 3, 0, 512, false),
        (1, 10, 512, 4096, false),
        (1, 20, 0, 2 * PAGE_SIZE, false),
        (1, 40, 512, 5 * PAGE_SIZE + 1024, true),
        (1, 100, 4, 128 * 1024, true),
        (2, 7, 3 * PAGE_SIZE + 400, 3 * PAGE_SIZE, true),
        (2, 200, 0, 128 * 1024, true),
    ];
    for (k, &(ns, lba, off, len, list)) in cases.iter().enumerate() {
        let disk = if ns == 1 { &mut d1 } else { &mut d2 };
        let bs = disk.block_size() as u64;
        let data = pattern(len, k as u8 + 40);
        let whole = dma_slice(&block, 0, 40 * PAGE_SIZE);
        whole.fill(0xA5);
        whole[off..off + len].copy_from_slice(&data);
        let (s0, c0) = (n.borrow().stats(), m.counters());
        assert_eq!(disk.write_dma(lba, &whole[off..off + len], false), Ok(0));
        let (s1, c1) = (n.borrow().stats(), m.counters());
        assert_eq!(medium(&m, ns, lba, len as u64 / bs), data, "case {k}");
        assert_eq!(s1.copied, s0.copied, "case {k}: nothing copied");
        assert_eq!(s1.direct - s0.direct, len as u64);
        assert_eq!(s1.transfers - s0.transfers, 1);
        assert_eq!(
            c1.cleaned - c0.cleaned,
            len as u64,
            "cleaned before the write"
        );
        assert_eq!(
            c1.prp_list_entries > c0.prp_list_entries,
            list,
            "case {k}: a PRP list exactly when more than two pages"
        );
        // Read back into another offset, the bytes around it untouched.
        let roff = (off + 2048) % PAGE_SIZE;
        whole.fill(0x5A);
        let c1 = m.counters();
        assert_eq!(disk.read_dma(lba, &mut whole[roff..roff + len]), Ok(0));
        let c2 = m.counters();
        assert_eq!(
            c2.invalidated - c1.invalidated,
            2 * len as u64,
            "invalidated before and after the read"
        );
        assert_eq!(c2.reads - c1.reads, (len as u64).div_ceil(128 * 1024));
        assert_eq!(&whole[roff..roff + len], &data[..], "case {k}");
        assert!(whole[..roff].iter().all(|&b| b == 0x5A));
        assert!(whole[roff + len..].iter().all(|&b| b == 0x5A));
        assert_eq!(n.borrow().stats().copied, s0.copied);
    }
    drop(n);
    // SAFETY: our block; the controller is disabled.
    unsafe { m.dma_dealloc(block) };
    assert_eq!(m.outstanding_pages(), 0);
    clean(&m);
}

#[test]
fn what_cannot_be_put_in_prps_is_copied_and_counted() {
    let m = NvmeModel::new(NvmeConfig::default());
    let n = RefCell::new(up(&m));
    let mut disk = NsDisk::new(&n, 1).unwrap();
    let block = m.dma_alloc(4).unwrap();
    let data = pattern(2 * PAGE_SIZE, 77);
    // DMA not allowed: the DMA entries copy, like read and write.
    let buf = dma_slice(&block, 0, 2 * PAGE_SIZE);
    buf.copy_from_slice(&data);
    assert_eq!(disk.write_dma(0, buf, false), Ok(2 * PAGE_SIZE));
    buf.fill(0);
    assert_eq!(disk.read_dma(0, buf), Ok(2 * PAGE_SIZE));
    assert_eq!(buf, &data[..]);
    // SAFETY: the buffers given below are DMA memory of the model, or memory the model
    // cannot translate (never handed to it).
    unsafe { disk.allow_dma() };
    // Memory the HAL cannot translate (the heap): copied.
    let mut heap = pattern(3 * 512, 5);
    assert_eq!(disk.write_dma(30, &heap, false), Ok(3 * 512));
    assert_eq!(medium(&m, 1, 30, 3), heap);
    heap.fill(0);
    assert_eq!(disk.read_dma(30, &mut heap), Ok(3 * 512));
    assert_eq!(heap, pattern(3 * 512, 5));
    // A first byte off a dword boundary: no PRP1 can name it, copied.
    let odd = dma_slice(&block, 2, 1024);
    odd.copy_from_slice(&data[..1024]);
    assert_eq!(disk.write_dma(50, odd, false), Ok(1024));
    assert_eq!(medium(&m, 1, 50, 2), &data[..1024]);
    odd.fill(0);
    assert_eq!(disk.read_dma(50, odd), Ok(1024));
    assert_eq!(odd, &data[..1024]);
    let s = n.borrow().stats();
    assert_eq!(s.copied, (4 * PAGE_SIZE + 2 * 3 * 512 + 2 * 1024) as u64);
    assert_eq!(s.direct, 0);
    assert_eq!(s.transfers, 6);
    // And a DMA buffer at a dword offset goes straight.
    let ok = dma_slice(&block, 4, 1024);
    assert_eq!(disk.read_dma(50, ok), Ok(0));
    assert_eq!(ok, &data[..1024]);
    assert_eq!(n.borrow().stats().direct, 1024);
    // Write with Force Unit Access: the write, then the controller's flush (it has a cache).
    let flushes = m.counters().flushes;
    assert_eq!(disk.write_dma(60, ok, true), Ok(0));
    assert_eq!(m.counters().flushes, flushes + 1);
    drop(n);
    // SAFETY: our block; the controller is disabled.
    unsafe { m.dma_dealloc(block) };
    assert_eq!(m.outstanding_pages(), 0);
    clean(&m);
}

#[test]
fn a_lying_controller_fails_zero_copy_commands_once_with_typed_errors() {
    let m = NvmeModel::new(NvmeConfig::default());
    let n = RefCell::new(up(&m));
    let mut disk = NsDisk::new(&n, 1).unwrap();
    // SAFETY: the buffer below is DMA memory of the model, kept until the end (also if the
    // controller wedges: this model stops when told).
    unsafe { disk.allow_dma() };
    let block = m.dma_alloc(34).unwrap();
    let buf = dma_slice(&block, 8, 128 * 1024);
    let faults = [
        Fault::Status(0x281),
        Fault::WrongCid,
        Fault::StalePhase,
        Fault::Duplicate,
        Fault::SqHead,
        Fault::WrongQueue,
        Fault::Withheld,
    ];
    for (k, f) in faults.into_iter().enumerate() {
        let fetched = m.counters().fetched;
        m.inject(f);
        let r = if k % 2 == 0 {
            disk.read_dma(64, buf)
        } else {
            disk.write_dma(64, buf, false)
        };
        if f == Fault::Duplicate {
            // The command itself completed; its second completion is caught at the next.
            assert_eq!(r, Ok(0));
            assert_eq!(disk.read_dma(64, buf), Err(BlockError::Io), "{f:?}");
        } else {
            assert_eq!(r, Err(BlockError::Io), "{f:?}");
        }
        let s = n.borrow().stats();
        assert_eq!(
            s.submitted,
            s.completed + s.timeouts + s.violations,
            "{f:?}: a command ended other than exactly once"
        );
        assert!(
            m.counters().fetched > fetched,
            "{f:?} reached the controller"
        );
        if n.borrow().state() != State::Ready {
            n.borrow_mut().reset().unwrap();
        }
        // And the next command goes through.
        assert_eq!(disk.write_dma(64, buf, false), Ok(0), "after {f:?}");
    }
    assert_eq!(n.borrow().stats().copied, 0);
    drop(n);
    // SAFETY: our block; the controller is disabled.
    unsafe { m.dma_dealloc(block) };
    assert_eq!(m.outstanding_pages(), 0);
    clean(&m);
}

/// The message the MSI-X tests program: the LAPIC window of CPU 0, vector 34h.
const MSG: MsiMessage = MsiMessage {
    address: 0xFEE0_0000,
    data: 0x34,
};

fn msix(m: &NvmeModel, n: &mut Nvme<NvmeModel>) -> Result<(), MsixError> {
    // SAFETY: the model's function, the one `n` drives.
    unsafe { n.enable_msix(m, NvmeModel::address(), MSG) }
}

#[test]
fn msix_entry_zero_carries_every_completion_once_enabled() {
    let m = NvmeModel::new(NvmeConfig::default());
    let mut n = up(&m);
    // Interrupts asked for on the I/O queue, but MSI-X off: nothing is sent, the driver polls.
    n.write(1, 0, &pattern(512, 3)).unwrap();
    assert!(m.messages().is_empty());
    assert!(!n.interrupts() && !m.msix_enabled());
    msix(&m, &mut n).unwrap();
    assert!(n.interrupts() && m.msix_enabled());
    assert_ne!(m.pci_command() & 0x400, 0, "INTx disabled");
    assert_eq!(
        m.pci_command() & 0x6,
        0x6,
        "memory and bus mastering stay on"
    );
    // Restarted to bind the vector: the admin commands that made the I/O queue again (Set
    // Features, Create I/O Completion and Submission Queue) already interrupted.
    assert_eq!(m.messages().len(), 3);
    assert_eq!(m.counters().enables, 2);
    let (before, sent0) = (m.counters().posted, m.messages().len());
    let data = pattern(8192, 9);
    n.write(1, 8, &data).unwrap();
    let mut back = vec![0u8; 8192];
    n.read(1, 8, &mut back).unwrap();
    n.flush(1).unwrap();
    assert_eq!(back, data);
    let sent = m.messages()[sent0..].to_vec();
    let posted = (m.counters().posted - before) as usize;
    assert_eq!(posted, 3);
    assert_eq!(
        sent,
        vec![(MSG.address, MSG.data); posted],
        "one message per completion"
    );
    // The admin queue signals on the same entry: a reset (admin commands) sends more.
    n.reset().unwrap();
    assert!(m.messages().len() > posted);
    assert!(
        n.interrupts(),
        "MSI-X stays programmed across a controller reset"
    );
    n.read(1, 8, &mut back).unwrap();
    assert_eq!(back, data);
    drop(n);
    assert_eq!(m.outstanding_pages(), 0);
    clean(&m);
}

#[test]
fn msix_placements_the_driver_cannot_use_leave_it_polling() {
    let cases = [
        (MsixLie::NoCapability, MsixError::NoCapability),
        (MsixLie::LoopingList, MsixError::NoCapability),
        (MsixLie::OtherBar, MsixError::Table),
        (MsixLie::PastBar, MsixError::Table),
        (MsixLie::ForgetfulEntry, MsixError::Refused),
    ];
    for (lie, want) in cases {
        let m = NvmeModel::new(NvmeConfig::default());
        let mut n = up(&m);
        m.set_msix_lie(Some(lie));
        assert_eq!(msix(&m, &mut n), Err(want), "{lie:?}");
        assert!(!n.interrupts(), "{lie:?}");
        assert!(!m.msix_enabled(), "{lie:?}: MSI-X left off");
        assert_eq!(m.pci_command() & 0x400, 0, "{lie:?}: INTx untouched");
        let data = pattern(4096, 5);
        n.write(1, 0, &data).unwrap();
        let mut back = vec![0u8; 4096];
        n.read(1, 0, &mut back).unwrap();
        assert_eq!(back, data, "{lie:?}: polled I/O goes on");
        assert!(m.messages().is_empty(), "{lie:?}");
        clean(&m);
    }
    // Doorbells at a stride that pushes the table past the mapped window.
    let m = NvmeModel::new(NvmeConfig {
        dstrd: 6,
        ..NvmeConfig::default()
    });
    let mut n = up(&m);
    assert_eq!(msix(&m, &mut n), Err(MsixError::Table));
    n.write(1, 0, &pattern(512, 1)).unwrap();
}

static WAITS: AtomicU64 = AtomicU64::new(0);
fn counted_wait() {
    WAITS.fetch_add(1, Ordering::Relaxed);
}

static POLLED_WAITS: AtomicU64 = AtomicU64::new(0);
fn polled_wait() {
    POLLED_WAITS.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn a_wait_gives_the_cpu_away_only_with_interrupts_and_stays_bounded() {
    // Polled: the embedder's wait is never called, and a withheld completion times out.
    let m = NvmeModel::new(NvmeConfig::default());
    let mut n = up(&m);
    n.set_wait(polled_wait);
    m.inject(Fault::Withheld);
    assert_eq!(n.write(1, 0, &pattern(512, 2)), Err(NvmeError::Timeout));
    assert_eq!(POLLED_WAITS.load(Ordering::Relaxed), 0);

    // With interrupts: each look at the empty queue is followed by one wait, and the
    // command's timeout (on the clock, not a count of waits) still ends it.
    let m = NvmeModel::new(NvmeConfig::default());
    let mut n = up(&m);
    msix(&m, &mut n).unwrap();
    n.set_wait(counted_wait);
    n.write(1, 0, &pattern(512, 2)).unwrap();
    assert_eq!(
        WAITS.load(Ordering::Relaxed),
        0,
        "completed at once: no wait"
    );
    m.inject(Fault::Withheld);
    let sent = m.messages().len();
    assert_eq!(n.write(1, 0, &pattern(512, 3)), Err(NvmeError::Timeout));
    assert_eq!(
        m.messages().len(),
        sent,
        "a withheld completion sends nothing"
    );
    let waits = WAITS.load(Ordering::Relaxed);
    // The clock moves a millisecond per look; the timeout is 50 ms.
    assert!((25..=60).contains(&waits), "{waits} waits");
    assert_eq!(n.state(), State::Failed);
    n.reset().unwrap();
    let mut b = [0u8; 512];
    n.read(1, 0, &mut b).unwrap();
    // The withheld command ran; only its completion never came.
    assert_eq!(b[..], pattern(512, 3)[..]);
    assert_eq!(b[..], medium(&m, 1, 0, 1)[..]);
    drop(n);
    assert_eq!(m.outstanding_pages(), 0);
    clean(&m);
}
