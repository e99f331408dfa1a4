//! One split virtqueue (virtio 1.x, 2.7) of [`QUEUE_SIZE`] entries, driven directly: the link
//! gives each descriptor one buffer for good at bring-up, so posting a buffer is one entry of
//! the available ring and taking it back one entry of the used ring (virtio-drivers' general
//! queue, which chains, frees and checks descriptors per buffer, cost about 450 instructions
//! a frame: docs/measurements.md).
//!
//! The queue lives in one page of DMA memory: the descriptor table at [`DESC`], the available
//! ring at [`AVAIL`], the used ring at [`USED`]. No event index (`VIRTIO_F_EVENT_IDX` is not
//! negotiated): notifications and interrupts are suppressed with the rings' flags.
//!
//! Hostile device: the used ring is the device's; its index is trusted only for a step of at
//! most [`QUEUE_SIZE`], and the ids and lengths read from it are bounded by the caller
//! ([`Ring::pop`] returns them raw).

use core::ptr::NonNull;
use core::sync::atomic::{Ordering, fence};

use super::QUEUE_SIZE;

/// The descriptor table's offset in the queue's page (16 bytes an entry).
pub(super) const DESC: usize = 0;
/// The available ring's offset: flags, index, then the entries (2 bytes each).
pub(super) const AVAIL: usize = 1024;
/// The used ring's offset: flags, index, then the entries (id and length, 4 bytes each).
pub(super) const USED: usize = 2048;
/// Where the queue's own structures end: the rest of the page is free for small buffers.
pub(super) const END: usize = USED + 4 + 8 * QUEUE_SIZE;

const _: () = assert!(
    DESC + 16 * QUEUE_SIZE <= AVAIL
        && AVAIL + 6 + 2 * QUEUE_SIZE <= USED
        && END <= crate::PAGE_SIZE
        && QUEUE_SIZE.is_power_of_two()
        && QUEUE_SIZE <= u16::MAX as usize
);

/// `VIRTQ_DESC_F_NEXT`: the chain goes on at `next`.
pub(super) const F_NEXT: u16 = 1;
/// `VIRTQ_DESC_F_WRITE`: the device writes the buffer.
pub(super) const F_WRITE: u16 = 2;
/// `VIRTQ_AVAIL_F_NO_INTERRUPT`.
const NO_INTERRUPT: u16 = 1;
/// `VIRTQ_USED_F_NO_NOTIFY`.
const NO_NOTIFY: u16 = 1;

/// A split virtqueue in a page of DMA memory the link owns.
pub(super) struct Ring {
    /// The page (its CPU address).
    page: NonNull<u8>,
    /// The page's bus address.
    paddr: u64,
    /// The next available-ring index to publish (free-running, as the ring's own).
    next_avail: u16,
    /// The next used-ring index to look at (free-running).
    next_used: u16,
}

impl Ring {
    /// A queue in `page` (zeroed here), at bus address `paddr`.
    ///
    /// # Safety
    ///
    /// `page` is a page of DMA memory the caller owns for the queue's life, identity of
    /// `paddr` for the device, and nothing else (CPU side) refers to it meanwhile.
    pub(super) unsafe fn new(page: NonNull<u8>, paddr: u64) -> Self {
        // SAFETY: the caller's promise: the page is ours.
        unsafe { page.as_ptr().write_bytes(0, crate::PAGE_SIZE) };
        Ring {
            page,
            paddr,
            next_avail: 0,
            next_used: 0,
        }
    }

    /// The bus addresses of the descriptor table, the available ring and the used ring.
    pub(super) fn areas(&self) -> (u64, u64, u64) {
        (
            self.paddr + DESC as u64,
            self.paddr + AVAIL as u64,
            self.paddr + USED as u64,
        )
    }

    /// The CPU address of byte `offset` of the queue's page, as a `T`.
    fn at<T>(&self, offset: usize) -> *mut T {
        debug_assert!(offset + core::mem::size_of::<T>() <= crate::PAGE_SIZE);
        // SAFETY: every caller's offset is a constant of this module plus an index below
        // QUEUE_SIZE: inside the page (the layout assertion above).
        unsafe { self.page.as_ptr().add(offset).cast() }
    }

    /// Writes descriptor `i` (below [`QUEUE_SIZE`]): the buffer at `addr`, `len` bytes.
    pub(super) fn describe(&mut self, i: usize, addr: u64, len: u32, flags: u16, next: u16) {
        let i = i % QUEUE_SIZE;
        let d = DESC + 16 * i;
        // SAFETY: inside the page (`at`); the device only reads descriptors, and this one is
        // not in the available ring now (the callers describe a buffer before posting it).
        unsafe {
            self.at::<u64>(d).write_volatile(addr);
            self.at::<u32>(d + 8).write_volatile(len);
            self.at::<u16>(d + 12).write_volatile(flags);
            self.at::<u16>(d + 14).write_volatile(next);
        }
    }

    /// Sets the length of descriptor `i` (the next frame in its buffer).
    pub(super) fn set_len(&mut self, i: usize, len: u32) {
        let d = DESC + 16 * (i % QUEUE_SIZE);
        // SAFETY: as in `describe`.
        unsafe { self.at::<u32>(d + 8).write_volatile(len) };
    }

    /// Posts the chain starting at descriptor `head` to the device (without notifying it).
    pub(super) fn publish(&mut self, head: u16) {
        let slot = usize::from(self.next_avail) % QUEUE_SIZE;
        self.next_avail = self.next_avail.wrapping_add(1);
        // SAFETY: inside the page; the available ring is the driver's to write.
        unsafe {
            self.at::<u16>(AVAIL + 4 + 2 * slot).write_volatile(head);
            // The entry (and the buffer, written before) visible before the index.
            fence(Ordering::Release);
            self.at::<u16>(AVAIL + 2).write_volatile(self.next_avail);
        }
    }

    /// Whether the device wants a notification for what was published.
    pub(super) fn wants_notify(&self) -> bool {
        // The index written before the flag is read (a store, then a load: a full fence).
        fence(Ordering::SeqCst);
        // SAFETY: inside the page; a read of the device's flag.
        let flags = unsafe { self.at::<u16>(USED).read_volatile() };
        flags & NO_NOTIFY == 0
    }

    /// Asks the device for an interrupt per used buffer (`true`) or none.
    pub(super) fn set_interrupts(&mut self, on: bool) {
        let flags = if on { 0 } else { NO_INTERRUPT };
        // SAFETY: inside the page; the available ring's flags are the driver's to write.
        unsafe { self.at::<u16>(AVAIL).write_volatile(flags) };
    }

    /// The next buffer the device has used: `Some(Ok((id, len)))`, as the device wrote them
    /// (the caller bounds both); `None` when none; `Some(Err(()))` when the device's used
    /// index moved by more than the queue holds (a device breaking the protocol).
    pub(super) fn pop(&mut self) -> Option<Result<(u32, u32), ()>> {
        // SAFETY: inside the page; reads of the device's index and entry.
        unsafe {
            let idx = self.at::<u16>(USED + 2).read_volatile();
            if idx == self.next_used {
                return None;
            }
            if usize::from(idx.wrapping_sub(self.next_used)) > QUEUE_SIZE {
                return Some(Err(()));
            }
            // The entry read after the index that covers it.
            fence(Ordering::Acquire);
            let e = USED + 4 + 8 * (usize::from(self.next_used) % QUEUE_SIZE);
            let id = self.at::<u32>(e).read_volatile();
            let len = self.at::<u32>(e + 4).read_volatile();
            self.next_used = self.next_used.wrapping_add(1);
            Some(Ok((id, len)))
        }
    }

    /// The CPU address of byte `offset` of the page, for a small buffer past [`END`].
    pub(super) fn spare(&self, offset: usize) -> Option<(*mut u8, u64)> {
        (END..crate::PAGE_SIZE)
            .contains(&offset)
            .then(|| (self.at::<u8>(offset), self.paddr + offset as u64))
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    #[repr(C, align(4096))]
    struct Page([u8; crate::PAGE_SIZE]);

    /// The test's page, reached only through raw pointers (the ring's and the device's);
    /// freed when the guard goes.
    struct Held(NonNull<Page>);

    impl Drop for Held {
        fn drop(&mut self) {
            // SAFETY: made by `Box::into_raw` in `page`, freed once.
            drop(unsafe { std::boxed::Box::from_raw(self.0.as_ptr()) });
        }
    }

    fn page() -> (Held, NonNull<u8>) {
        let b = std::boxed::Box::new(Page([0xAA; crate::PAGE_SIZE]));
        let p = NonNull::from(std::boxed::Box::leak(b));
        (Held(p), p.cast())
    }

    fn put(p: NonNull<u8>, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= crate::PAGE_SIZE);
        // SAFETY: inside the test's page.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), p.as_ptr().add(at), bytes.len()) }
    }

    fn get<const N: usize>(p: NonNull<u8>, at: usize) -> [u8; N] {
        assert!(at + N <= crate::PAGE_SIZE);
        // SAFETY: inside the test's page.
        unsafe { p.as_ptr().add(at).cast::<[u8; N]>().read() }
    }

    fn word(p: NonNull<u8>, at: usize) -> u16 {
        u16::from_le_bytes(get::<2>(p, at))
    }

    /// The device's side: marks used entry `n` (`id`, `len`) and moves the used index past it.
    fn device_uses(p: NonNull<u8>, n: u16, id: u32, len: u32) {
        let e = USED + 4 + 8 * (usize::from(n) % QUEUE_SIZE);
        put(p, e, &id.to_le_bytes());
        put(p, e + 4, &len.to_le_bytes());
        put(p, USED + 2, &n.wrapping_add(1).to_le_bytes());
    }

    #[test]
    fn publishes_and_pops_in_ring_order_across_the_wrap() {
        let (_held, p) = page();
        // SAFETY: the page is this test's (held until the end), used through the ring and, between its
        // calls, as the device.
        let mut r = unsafe { Ring::new(p, 0x10_0000) };
        assert_eq!(r.areas(), (0x10_0000, 0x10_0000 + 1024, 0x10_0000 + 2048));
        r.describe(3, 0xdead_0000, 2048, F_WRITE, 0);
        r.set_len(3, 60);
        assert_eq!(get::<8>(p, 48), 0xdead_0000u64.to_le_bytes());
        assert_eq!(get::<4>(p, 56), 60u32.to_le_bytes());
        assert_eq!(word(p, 60), F_WRITE);
        for n in 0..(3 * QUEUE_SIZE as u16) {
            r.publish(n % 7);
            assert_eq!(word(p, AVAIL + 2), n + 1, "the index follows");
            assert_eq!(
                word(p, AVAIL + 4 + 2 * (usize::from(n) % QUEUE_SIZE)),
                n % 7
            );
            assert_eq!(r.pop(), None, "nothing used yet");
            device_uses(p, n, u32::from(n % 7), 100 + u32::from(n));
            assert_eq!(r.pop(), Some(Ok((u32::from(n % 7), 100 + u32::from(n)))));
        }
        assert!(r.wants_notify());
        put(p, USED, &1u16.to_le_bytes());
        assert!(!r.wants_notify(), "the device asked for no notifications");
        r.set_interrupts(false);
        assert_eq!(word(p, AVAIL), 1);
        r.set_interrupts(true);
        assert_eq!(word(p, AVAIL), 0);
    }

    #[test]
    fn a_used_index_beyond_the_queue_is_refused() {
        let (_held, p) = page();
        // SAFETY: as above.
        let mut r = unsafe { Ring::new(p, 0) };
        put(p, USED + 2, &(QUEUE_SIZE as u16 + 1).to_le_bytes());
        assert_eq!(r.pop(), Some(Err(())));
        put(p, USED + 2, &(QUEUE_SIZE as u16).to_le_bytes());
        assert!(
            matches!(r.pop(), Some(Ok(_))),
            "a full ring's worth is fine"
        );
        assert_eq!(r.spare(END - 1), None);
        assert!(r.spare(END).is_some());
        assert_eq!(r.spare(crate::PAGE_SIZE), None);
    }
}
