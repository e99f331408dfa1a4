//! The link's DMA memory and its two descriptor rings.
//!
//! One block: the receive ring ([`RX_DESC`] descriptors of 16 bytes) and the transmit ring
//! ([`TX_DESC`]) in its first page, then the buffers, [`BUFFER_SIZE`] bytes each: receive
//! buffer `i` belongs to receive descriptor `i` for good, transmit buffer `j` to transmit
//! descriptor `j`. The driver never reads an address back from a descriptor: the device's
//! write-backs overwrite the address fields, so a descriptor is rewritten whole from the
//! driver's own table each time it is given back.
//!
//! Hostile device: it writes only a descriptor's status and length (and whatever else it
//! likes inside the ring, which is ours to rewrite); both are bounded by the caller. No head
//! register is read: what the device has done is learned from the descriptors alone, one at
//! a time, so a lying head cannot make the driver skip or revisit anything.

use core::ptr::NonNull;

use crate::{DmaBlock, Hal, PAGE_SIZE};

/// Receive descriptors (the ring's length, 2 KiB, is a multiple of 128 as the rings want).
pub const RX_DESC: usize = 128;
/// Transmit descriptors: at most `TX_DESC - 1` frames in flight.
pub const TX_DESC: usize = 64;
/// Bytes of each buffer (the receive buffer size programmed: 2 KiB).
pub const BUFFER_SIZE: usize = 2048;
/// Bytes of a descriptor.
pub(crate) const DESC: usize = 16;
/// Where the transmit ring starts in the first page.
const TX_RING: usize = RX_DESC * DESC;
/// Pages of the block: the rings' page and the buffers.
pub(crate) const PAGES: usize = 1 + (RX_DESC + TX_DESC) * BUFFER_SIZE / PAGE_SIZE;

const _: () = assert!(
    TX_RING + TX_DESC * DESC <= PAGE_SIZE
        && (RX_DESC * DESC).is_multiple_of(128)
        && (TX_DESC * DESC).is_multiple_of(128)
        && PAGE_SIZE.is_multiple_of(BUFFER_SIZE)
        && RX_DESC <= u16::MAX as usize
);

/// The block, returned to the HAL when dropped (unless [`Dma::leak`]ed: memory a device that
/// would not reset may still write).
pub(crate) struct Dma<H: Hal> {
    hal: H,
    block: Option<DmaBlock>,
}

impl<H: Hal> Dma<H> {
    pub(crate) fn new(hal: H) -> Result<Self, crate::DmaError> {
        let block = hal.dma_alloc(PAGES)?;
        Ok(Dma {
            hal,
            block: Some(block),
        })
    }

    fn base(&self) -> (NonNull<u8>, u64) {
        match &self.block {
            Some(b) => (b.vaddr, b.paddr),
            // Only after `leak`, which only `Drop` paths call.
            None => (NonNull::dangling(), 0),
        }
    }

    /// Bus address of byte `at` of the block.
    pub(crate) fn paddr(&self, at: usize) -> u64 {
        debug_assert!(at < PAGES * PAGE_SIZE);
        self.base().1 + at as u64
    }

    /// CPU pointer to byte `at` of the block, as a `T`.
    fn at<T>(&self, at: usize) -> *mut T {
        assert!(at + core::mem::size_of::<T>() <= PAGES * PAGE_SIZE && self.block.is_some());
        // SAFETY: inside the block (checked above).
        unsafe { self.base().0.as_ptr().add(at).cast() }
    }

    /// Keeps the block from the HAL for good.
    pub(crate) fn leak(&mut self) {
        self.block = None;
    }
}

impl<H: Hal> Drop for Dma<H> {
    fn drop(&mut self) {
        if let Some(b) = self.block.take() {
            // SAFETY: the block came from this HAL, is returned once, and the device was
            // reset before (the link's Drop) or never given it.
            unsafe { self.hal.dma_dealloc(b) }
        }
    }
}

/// The two rings in a [`Dma`] block: where the driver is in each.
pub(crate) struct Rings {
    /// The next receive descriptor to look at.
    rx_next: u16,
    /// Receive descriptors given back to the device but not yet announced through the tail.
    rx_unposted: u16,
    /// The next transmit descriptor to fill.
    tx_tail: u16,
    /// The oldest transmit descriptor the device holds.
    tx_clean: u16,
    /// Transmit descriptors the device holds.
    tx_held: u16,
}

/// What a receive descriptor holds, as the device wrote it back, classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rx {
    /// A whole frame of that many bytes in the descriptor's buffer.
    Frame(usize),
    /// Not written back yet.
    Empty,
    /// Refused: a length of 0, below an Ethernet header, or past the buffer or the largest
    /// frame.
    Length,
    /// Refused: part of a frame spread over several descriptors (no end-of-packet, or the
    /// rest of one).
    Fragment,
    /// Refused: the device flagged an error (CRC, symbol, sequence, IPv4 checksum...).
    Error,
}

/// Receive descriptors announced in one tail write.
const RX_BATCH: u16 = 16;

impl Rings {
    pub(crate) fn new() -> Self {
        Rings {
            rx_next: 0,
            rx_unposted: 0,
            tx_tail: 0,
            tx_clean: 0,
            tx_held: 0,
        }
    }

    /// Bus addresses of the receive and transmit rings.
    pub(crate) fn ring_addresses<H: Hal>(dma: &Dma<H>) -> (u64, u64) {
        (dma.paddr(0), dma.paddr(TX_RING))
    }

    fn rx_buffer_at(i: usize) -> usize {
        PAGE_SIZE + i * BUFFER_SIZE
    }

    fn tx_buffer_at(j: usize) -> usize {
        PAGE_SIZE + (RX_DESC + j) * BUFFER_SIZE
    }

    /// Writes receive descriptor `i` whole: its buffer, no header buffer (which also clears
    /// the status the device writes back over it).
    fn give_rx<H: Hal>(dma: &Dma<H>, i: usize) {
        let d = (i % RX_DESC) * DESC;
        let buffer = dma.paddr(Self::rx_buffer_at(i % RX_DESC));
        // SAFETY: inside the ring page (`at` checks); the descriptor is the driver's now.
        unsafe {
            dma.at::<u64>(d).write_volatile(buffer);
            dma.at::<u64>(d + 8).write_volatile(0);
        }
    }

    /// Fills every receive descriptor; the tail to write is `RX_DESC - 1` (one kept back, so
    /// that head == tail means "none").
    pub(crate) fn fill_rx<H: Hal>(&mut self, dma: &Dma<H>) -> u32 {
        for i in 0..RX_DESC {
            Self::give_rx(dma, i);
        }
        for j in 0..TX_DESC {
            let d = TX_RING + j * DESC;
            // SAFETY: inside the ring page; nothing is posted yet.
            unsafe {
                dma.at::<u64>(d).write_volatile(0);
                dma.at::<u64>(d + 8).write_volatile(0);
            }
        }
        (RX_DESC - 1) as u32
    }

    /// Classifies the next receive descriptor. `Frame` leaves it taken (the caller reads the
    /// buffer, then calls [`Rings::rx_done`]); every refusal gives it back at once.
    pub(crate) fn rx_peek<H: Hal>(&mut self, dma: &Dma<H>, max_frame: usize) -> (Rx, usize) {
        let i = usize::from(self.rx_next);
        let d = i * DESC;
        // SAFETY: inside the ring page; a read of the device's write-back.
        let status = unsafe { dma.at::<u32>(d + 8).read_volatile() };
        if status & super::regs::RX_DD == 0 {
            return (Rx::Empty, i);
        }
        dma.hal.consume_barrier();
        // SAFETY: as above.
        let len = usize::from(unsafe { dma.at::<u16>(d + 12).read_volatile() });
        let verdict = if status & super::regs::RX_EOP == 0 {
            Rx::Fragment
        } else if status & super::regs::RX_ERRORS != 0 {
            Rx::Error
        } else if len < 14 || len > max_frame.min(BUFFER_SIZE) {
            Rx::Length
        } else {
            Rx::Frame(len)
        };
        (verdict, i)
    }

    /// The bytes of receive buffer `i` (a descriptor [`Rings::rx_peek`] found done).
    pub(crate) fn rx_bytes<H: Hal>(dma: &Dma<H>, i: usize, len: usize) -> &[u8] {
        assert!(i < RX_DESC && len <= BUFFER_SIZE);
        // SAFETY: inside the block; the device wrote the buffer back and holds it no more
        // (its descriptor is done and not given back until `rx_done`).
        unsafe { core::slice::from_raw_parts(dma.at::<u8>(Self::rx_buffer_at(i)), len) }
    }

    /// Gives receive descriptor `i` (the one `rx_peek` looked at) back; returns the tail to
    /// write when a batch is due (or `flush` asks), `None` otherwise.
    pub(crate) fn rx_done<H: Hal>(&mut self, dma: &Dma<H>, i: usize, flush: bool) -> Option<u32> {
        Self::give_rx(dma, i);
        self.rx_next = ((i + 1) % RX_DESC) as u16;
        self.rx_unposted += 1;
        (flush || self.rx_unposted >= RX_BATCH).then(|| self.rx_tail())
    }

    /// The tail that gives the device every descriptor handed back: the last one done.
    pub(crate) fn rx_tail(&mut self) -> u32 {
        self.rx_unposted = 0;
        ((usize::from(self.rx_next) + RX_DESC - 1) % RX_DESC) as u32
    }

    /// The next receive descriptor the driver will look at.
    pub(crate) fn rx_next(&self) -> usize {
        usize::from(self.rx_next)
    }

    /// Starts over at receive descriptor `head` (below [`RX_DESC`]), every descriptor
    /// rewritten whole: after a NIC that wrote a done bit out of turn left the driver and the
    /// NIC at different places. Returns the tail to write.
    pub(crate) fn rx_resync<H: Hal>(&mut self, dma: &Dma<H>, head: usize) -> u32 {
        for i in 0..RX_DESC {
            Self::give_rx(dma, i);
        }
        self.rx_next = (head % RX_DESC) as u16;
        self.rx_tail()
    }

    /// Takes back the transmit descriptors before `head` (below [`TX_DESC`]) as done, for a
    /// NIC that moved its head without writing done bits back. At most those held.
    pub(crate) fn tx_resync(&mut self, head: usize) -> usize {
        let mut n = 0;
        while self.tx_held > 0 && usize::from(self.tx_clean) != head % TX_DESC {
            self.tx_clean = ((usize::from(self.tx_clean) + 1) % TX_DESC) as u16;
            self.tx_held -= 1;
            n += 1;
        }
        n
    }

    /// Whether descriptors were given back but not yet announced.
    pub(crate) fn rx_pending(&self) -> bool {
        self.rx_unposted != 0
    }

    /// Takes back every transmit descriptor the device reports done, oldest first, stopping
    /// at the first one not done (at most a ring's worth).
    pub(crate) fn tx_reclaim<H: Hal>(&mut self, dma: &Dma<H>) {
        while self.tx_held > 0 {
            let d = TX_RING + usize::from(self.tx_clean) * DESC;
            // SAFETY: inside the ring page; a read of the device's write-back.
            let status = unsafe { dma.at::<u32>(d + 12).read_volatile() };
            if status & super::regs::TX_DD == 0 {
                return;
            }
            self.tx_clean = ((usize::from(self.tx_clean) + 1) % TX_DESC) as u16;
            self.tx_held -= 1;
        }
    }

    /// Whether a transmit descriptor is free (after taking back what the device finished,
    /// when none looked free).
    pub(crate) fn tx_free<H: Hal>(&mut self, dma: &Dma<H>) -> bool {
        if usize::from(self.tx_held) < TX_DESC - 1 {
            return true;
        }
        self.tx_reclaim(dma);
        usize::from(self.tx_held) < TX_DESC - 1
    }

    /// The buffer of the next transmit descriptor (free: [`Rings::tx_free`] said so).
    pub(crate) fn tx_buffer<H: Hal>(&mut self, dma: &Dma<H>) -> &mut [u8] {
        let j = usize::from(self.tx_tail);
        // SAFETY: inside the block; the descriptor is not held by the device (the ring keeps
        // one free, and `tx_free` checked), so its buffer is the CPU's alone; `&mut self`
        // makes this the only reference.
        unsafe { core::slice::from_raw_parts_mut(dma.at::<u8>(Self::tx_buffer_at(j)), BUFFER_SIZE) }
    }

    /// Hands the next transmit descriptor to the device with its two command words; returns
    /// the tail to write.
    pub(crate) fn tx_post<H: Hal>(&mut self, dma: &Dma<H>, words: (u32, u32)) -> u32 {
        let j = usize::from(self.tx_tail);
        let d = TX_RING + j * DESC;
        let buffer = dma.paddr(Self::tx_buffer_at(j));
        // SAFETY: inside the ring page; the descriptor is the driver's until the tail moves.
        unsafe {
            dma.at::<u64>(d).write_volatile(buffer);
            dma.at::<u32>(d + 8).write_volatile(words.0);
            dma.at::<u32>(d + 12)
                .write_volatile(words.1 & !super::regs::TX_DD);
        }
        self.tx_tail = ((j + 1) % TX_DESC) as u16;
        self.tx_held += 1;
        u32::from(self.tx_tail)
    }

    /// Transmit descriptors the device holds.
    pub(crate) fn tx_in_flight(&self) -> usize {
        usize::from(self.tx_held)
    }
}
