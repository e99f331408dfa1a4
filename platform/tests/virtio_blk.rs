//! The kernels' virtio-blk driver against a software virtio-blk device on the host: the
//! device side of the split virtqueue over memory whose "physical" addresses are its host
//! addresses, executing In/Out/Flush on a disk in a vector, or misbehaving on demand (silent,
//! completing a request it was never given, failing with an I/O status, read-only).

use std::alloc::{Layout, alloc_zeroed};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};

use bareverbs::hal::virtio_net::GlobalIdentity;
use bareverbs::hal::virtio_net::virtio_drivers::transport::{
    DeviceStatus, DeviceType, InterruptStatus, Transport,
};
use bareverbs::hal::virtio_net::virtio_drivers::{self, PhysAddr};
use bareverbs_platform::block::{BlockDevice, BlockError};
use bareverbs_platform::virtio_blk::{CHUNK, TIMEOUT_MS, VirtioBlk};
use zerocopy::{FromBytes, Immutable, IntoBytes};

const REGION_PAGES: usize = 256;
const SECTORS: u64 = 2048;

/// The DMA region every test shares (a static HAL), and a lock so that each test sees its
/// pages all come back.
fn hal() -> MutexGuard<'static, ()> {
    static ONCE: Once = Once::new();
    static LOCK: Mutex<()> = Mutex::new(());
    ONCE.call_once(|| {
        let layout = Layout::from_size_align(REGION_PAGES * 4096, 4096).unwrap();
        // SAFETY: a non-zero size; leaked for the process's life (the region keeps it).
        let mem = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        // SAFETY: memory nothing else uses, kept for good; "physical" = host address.
        unsafe { GlobalIdentity::install(mem.as_ptr() as u64, mem, REGION_PAGES, 0) }.unwrap();
    });
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn free_pages() -> usize {
    GlobalIdentity::get().unwrap().region().free_pages()
}

/// A clock that moves 100 ms at every reading: a wait that never ends times out quickly.
fn clock() -> u64 {
    static NOW: AtomicU64 = AtomicU64::new(0);
    NOW.fetch_add(100, Ordering::Relaxed)
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Good,
    /// Never completes anything.
    Silent,
    /// Completes a descriptor chain head it was not given.
    Foreign,
    /// Completes with status 1 (I/O error).
    IoError,
}

#[derive(Default)]
struct Disk {
    bytes: Vec<u8>,
    flushes: u32,
    requests: u32,
}

struct FakeBlk {
    disk: Arc<Mutex<Disk>>,
    mode: Mode,
    features: u64,
    status: DeviceStatus,
    queue: Option<(u32, u64, u64, u64)>,
    last_avail: u16,
}

const F_RO: u64 = 1 << 5;
const F_FLUSH: u64 = 1 << 9;
const F_VERSION_1: u64 = 1 << 32;

fn fake(mode: Mode, features: u64) -> (FakeBlk, Arc<Mutex<Disk>>) {
    let disk = Arc::new(Mutex::new(Disk {
        bytes: vec![0; SECTORS as usize * 512],
        ..Disk::default()
    }));
    (
        FakeBlk {
            disk: disk.clone(),
            mode,
            features,
            status: DeviceStatus::empty(),
            queue: None,
            last_avail: 0,
        },
        disk,
    )
}

// SAFETY (of the reads and writes below): the addresses are the driver's virtqueue and
// buffers, in the leaked region ("physical" = host address), as a device reaches them.
fn rd16(a: u64) -> u16 {
    // SAFETY: see above.
    unsafe { (a as *const u16).read_volatile() }
}
fn wr16(a: u64, v: u16) {
    // SAFETY: see above.
    unsafe { (a as *mut u16).write_volatile(v) }
}
fn wr32(a: u64, v: u32) {
    // SAFETY: see above.
    unsafe { (a as *mut u32).write_volatile(v) }
}

impl FakeBlk {
    /// Takes every new request from the available ring and completes it (or not).
    fn process(&mut self) {
        let Some((size, desc, avail, used)) = self.queue else {
            return;
        };
        let size = size as u16;
        while self.last_avail != rd16(avail + 2) {
            let head = rd16(avail + 4 + 2 * (self.last_avail % size) as u64);
            self.last_avail = self.last_avail.wrapping_add(1);
            if self.mode == Mode::Silent {
                continue;
            }
            // The chain: (address, length, flags).
            let mut chain = Vec::new();
            let mut i = head;
            loop {
                let d = desc + 16 * u64::from(i);
                // SAFETY: see above (a descriptor of the table).
                let (addr, len, flags, next) = unsafe {
                    (
                        (d as *const u64).read_volatile(),
                        ((d + 8) as *const u32).read_volatile(),
                        ((d + 12) as *const u16).read_volatile(),
                        ((d + 14) as *const u16).read_volatile(),
                    )
                };
                chain.push((addr, len as usize, flags));
                if flags & 1 == 0 {
                    break;
                }
                i = next;
            }
            // SAFETY: see above (the request header, 16 bytes).
            let hdr = unsafe { std::slice::from_raw_parts(chain[0].0 as *const u8, 16) };
            let kind = u32::from_le_bytes(hdr[0..4].try_into().unwrap());
            let sector = u64::from_le_bytes(hdr[8..16].try_into().unwrap()) as usize;
            let status = chain.last().unwrap().0;
            let mut disk = self.disk.lock().unwrap();
            disk.requests += 1;
            let mut st = 0u8;
            if chain.len() == 3 {
                let (a, n, flags) = chain[1];
                let at = sector * 512;
                match (kind, flags & 2 != 0) {
                    // SAFETY: see above (the data buffer, n bytes).
                    (0, true) => unsafe {
                        std::ptr::copy_nonoverlapping(
                            disk.bytes[at..at + n].as_ptr(),
                            a as *mut u8,
                            n,
                        )
                    },
                    // SAFETY: see above.
                    (1, false) => unsafe {
                        std::ptr::copy_nonoverlapping(
                            a as *const u8,
                            disk.bytes[at..at + n].as_mut_ptr(),
                            n,
                        )
                    },
                    _ => st = 2,
                }
            } else if kind == 4 {
                disk.flushes += 1;
            } else {
                st = 2;
            }
            if self.mode == Mode::IoError {
                st = 1;
            }
            // SAFETY: see above (the status byte).
            unsafe { (status as *mut u8).write_volatile(st) };
            let id = if self.mode == Mode::Foreign {
                head ^ 1
            } else {
                head
            };
            let u = rd16(used + 2);
            let e = used + 4 + 8 * u64::from(u % size);
            wr32(e, u32::from(id));
            wr32(e + 4, 1);
            std::sync::atomic::fence(Ordering::Release);
            wr16(used + 2, u.wrapping_add(1));
        }
    }
}

impl Transport for FakeBlk {
    fn device_type(&self) -> DeviceType {
        DeviceType::Block
    }
    fn read_device_features(&mut self) -> u64 {
        self.features
    }
    fn write_driver_features(&mut self, f: u64) {
        assert_eq!(
            f & !self.features,
            0,
            "the driver took features it was not offered"
        );
    }
    fn max_queue_size(&mut self, _queue: u16) -> u32 {
        16
    }
    fn notify(&mut self, queue: u16) {
        assert_eq!(queue, 0);
        self.process();
    }
    fn get_status(&self) -> DeviceStatus {
        self.status
    }
    fn set_status(&mut self, status: DeviceStatus) {
        self.status = status;
    }
    fn set_guest_page_size(&mut self, _size: u32) {}
    fn requires_legacy_layout(&self) -> bool {
        false
    }
    fn queue_set(
        &mut self,
        _q: u16,
        size: u32,
        desc: PhysAddr,
        driver: PhysAddr,
        device: PhysAddr,
    ) {
        self.queue = Some((size, desc, driver, device));
    }
    fn queue_unset(&mut self, _q: u16) {
        self.queue = None;
    }
    fn queue_used(&mut self, _q: u16) -> bool {
        self.queue.is_some()
    }
    fn ack_interrupt(&mut self) -> InterruptStatus {
        InterruptStatus::empty()
    }
    fn read_config_generation(&self) -> u32 {
        0
    }
    fn read_config_space<T: FromBytes + IntoBytes>(
        &self,
        offset: usize,
    ) -> virtio_drivers::Result<T> {
        let mut cfg = [0u8; 8];
        cfg.copy_from_slice(&SECTORS.to_le_bytes());
        T::read_from_bytes(&cfg[offset..offset + size_of::<T>()])
            .map_err(|_| virtio_drivers::Error::ConfigSpaceTooSmall)
    }
    fn write_config_space<T: IntoBytes + Immutable>(
        &mut self,
        _o: usize,
        _v: T,
    ) -> virtio_drivers::Result<()> {
        Ok(())
    }
}

impl Drop for FakeBlk {
    fn drop(&mut self) {
        // A transport resets the device on drop: it forgets the queue.
        self.queue = None;
    }
}

fn disk(mode: Mode, features: u64) -> (VirtioBlk<GlobalIdentity, FakeBlk>, Arc<Mutex<Disk>>) {
    let (t, d) = fake(mode, features);
    (VirtioBlk::new(t, clock).unwrap(), d)
}

#[test]
fn writes_and_reads_across_requests_and_flushes() {
    let _g = hal();
    let before = free_pages();
    {
        let (mut blk, d) = disk(Mode::Good, F_VERSION_1 | F_FLUSH);
        assert_eq!((blk.capacity(), blk.block_size()), (SECTORS, 512));
        assert!(blk.has_flush() && !blk.read_only());
        // Two and a half requests' worth, from sector 3.
        let data: Vec<u8> = (0..CHUNK * 5 / 2)
            .map(|i| (i * 7 + i / 512) as u8)
            .collect();
        blk.write(3, &data).unwrap();
        assert_eq!(d.lock().unwrap().requests, 3, "split at the request size");
        assert_eq!(
            &d.lock().unwrap().bytes[3 * 512..3 * 512 + data.len()],
            &data[..]
        );
        let mut back = vec![0u8; data.len() - 1024];
        blk.read(5, &mut back).unwrap();
        assert_eq!(&back[..], &data[1024..]);
        blk.flush().unwrap();
        assert_eq!(d.lock().unwrap().flushes, 1);
        blk.write_zeroes(3, 2).unwrap();
        assert!(
            d.lock().unwrap().bytes[3 * 512..5 * 512]
                .iter()
                .all(|&b| b == 0)
        );
        assert_eq!(d.lock().unwrap().bytes[5 * 512], data[1024]);
        let s = blk.stats();
        assert_eq!((s.written, s.flushes), (data.len() as u64 + 1024, 1));
        assert!(!blk.is_broken());
    }
    assert_eq!(free_pages(), before, "every DMA page back after the drop");
}

#[test]
fn bad_ranges_are_refused_before_the_device_sees_them() {
    let _g = hal();
    let (mut blk, d) = disk(Mode::Good, F_VERSION_1 | F_FLUSH);
    let mut b = vec![0u8; 1024];
    assert_eq!(blk.read(SECTORS - 1, &mut b), Err(BlockError::OutOfRange));
    assert_eq!(blk.read(u64::MAX, &mut b), Err(BlockError::OutOfRange));
    assert_eq!(blk.write(0, &b[..100]), Err(BlockError::Misaligned));
    assert_eq!(blk.write_zeroes(SECTORS, 1), Err(BlockError::OutOfRange));
    assert_eq!(blk.write_zeroes(0, u64::MAX), Err(BlockError::OutOfRange));
    assert_eq!(d.lock().unwrap().requests, 0);
    // Without a write cache, Flush has nothing to do and sends nothing.
    let (mut plain, d2) = disk(Mode::Good, F_VERSION_1);
    plain.flush().unwrap();
    assert_eq!(d2.lock().unwrap().requests, 0);
}

#[test]
fn a_read_only_disk_refuses_writes() {
    let _g = hal();
    let (mut blk, d) = disk(Mode::Good, F_VERSION_1 | F_RO);
    assert!(blk.read_only());
    assert_eq!(blk.write(0, &[1u8; 512]), Err(BlockError::Io));
    assert_eq!(blk.write_zeroes(0, 1), Err(BlockError::Io));
    assert_eq!(d.lock().unwrap().requests, 0);
    let mut b = [0u8; 512];
    blk.read(0, &mut b).unwrap();
}

#[test]
fn a_silent_device_times_out_and_the_disk_stays_broken() {
    let _g = hal();
    let before = free_pages();
    {
        let (mut blk, d) = disk(Mode::Silent, F_VERSION_1 | F_FLUSH);
        let mut b = vec![0x55u8; 4096];
        assert_eq!(blk.read(0, &mut b), Err(BlockError::Io));
        assert!(blk.is_broken());
        assert!(
            b.iter().all(|&x| x == 0x55),
            "the caller's buffer untouched"
        );
        assert_eq!(blk.write(0, &b), Err(BlockError::Io));
        assert_eq!(blk.flush(), Err(BlockError::Io));
        assert_eq!(
            d.lock().unwrap().requests,
            0,
            "nothing more sent to a broken disk"
        );
    }
    assert_eq!(free_pages(), before);
}

#[test]
fn a_completion_nobody_asked_for_breaks_the_disk() {
    let _g = hal();
    let (mut blk, _d) = disk(Mode::Foreign, F_VERSION_1 | F_FLUSH);
    let mut b = vec![0u8; 512];
    let t0 = clock();
    assert_eq!(blk.read(0, &mut b), Err(BlockError::Io));
    assert!(blk.is_broken());
    assert!(
        clock() - t0 < TIMEOUT_MS,
        "seen at once, not waited out until the timeout"
    );
}

#[test]
fn an_io_error_status_fails_the_request_only() {
    let _g = hal();
    let (mut blk, d) = disk(Mode::IoError, F_VERSION_1 | F_FLUSH);
    let mut b = vec![0u8; 512];
    assert_eq!(blk.read(0, &mut b), Err(BlockError::Io));
    assert_eq!(blk.flush(), Err(BlockError::Io));
    assert!(
        !blk.is_broken(),
        "the device answered: the queue is in order"
    );
    assert_eq!(d.lock().unwrap().requests, 2);
}
