//! What Intel's igb (82576) and e1000e (82574) NICs share, as a [`Link`]: [`IntelNic`], generic
//! over the [`Family`] that says what differs (device IDs, the queue registers, the descriptor
//! words, link bring-up, interrupt routing). The families live in their own modules:
//! [`igb`](crate::igb) and [`e1000e`](crate::e1000e); this one knows neither.
//!
//! Bring-up ([`IntelNic::new`]): memory decoding and bus mastering on, BAR 0 mapped through the
//! [`Hal`], a software reset (bounded wait for its bit to clear), the MAC from receive address
//! 0 (which the device loads from its EEPROM at reset) or else from the EEPROM words 0-2
//! (bounded wait for each read), the multicast table cleared, the rings in DMA memory from the
//! HAL, every receive buffer posted, the receiver (this MAC, broadcast, the multicast groups
//! joined; CRC stripped; the IPv4 header checksum checked by the NIC) and the transmitter
//! enabled, and the link started. The link polls; [`IntelNic::route_interrupts`] routes a
//! received frame and a finished transmission to an MSI-X message for a CPU that halts while
//! it waits.
//!
//! Frames are built in the transmit buffer ([`Link::transmit_with`]) and shown in the receive
//! buffer ([`Link::receive_with`], [`Link::receive_if`]). The NIC is hostile input: it writes
//! only descriptors' status and length, both bounded before use (a frame over several
//! descriptors, an error flag, a length below a header or past the buffer: refused and
//! counted in [`LinkStats`]); every wait on it is bounded and ends in a typed
//! [`IntelError`]; no register it writes is used as an index. Dropping the link resets the
//! NIC before its memory goes back to the HAL, and keeps the memory for good if the reset does
//! not complete.
//!
//! Checksum offload: the NIC checks the IPv4 header checksum of what it receives
//! (`RXCSUM.IPOFLD`), so that a frame it flags is refused before the transport parses it;
//! nothing else is offloaded (RoCE's UDP checksum is 0 and its ICRC is the transport's; the
//! transmit side's IPv4 checksum is 20 bytes the transport sums while it builds the header).

pub mod pci;
pub mod regs;
mod ring;

use pci_types::{ConfigRegionAccess, PciAddress};

use crate::{Hal, Link, LinkError, Mmio, MsiMessage};
use regs::*;
use ring::{Dma, Rings, Rx};

pub use pci::MsixError;
pub use regs::RingRegs;
pub use ring::{BUFFER_SIZE, RX_DESC, TX_DESC};

/// The largest frame carried: a 1500-byte IP MTU and the 14-byte Ethernet header.
pub const MAX_FRAME: usize = 1514;
/// Frames shorter than this are padded with zeros (Ethernet's minimum without the FCS).
pub const MIN_FRAME: usize = 60;
/// Bytes of BAR 0 mapped (the register window of both families).
pub const MMIO_SIZE: usize = 128 * 1024;
/// Register reads a bounded wait makes at most (reset, EEPROM read, PHY access): on hardware,
/// at about a microsecond a read, some tens of milliseconds.
pub const POLLS: u32 = 1 << 16;

/// What differs between the two families. Sealed: implemented by [`crate::igb::I82576`] and
/// [`crate::e1000e::I82574`] only.
pub trait Family: sealed::Sealed {
    /// A name for messages ("igb", "e1000e").
    const NAME: &'static str;
    /// PCI device IDs of the family's functions this link drives.
    const DEVICE_IDS: &'static [u16];
    /// Queue 0's receive ring registers.
    const RX_RING: RingRegs;
    /// Queue 0's transmit ring registers.
    const TX_RING: RingRegs;
    /// The third and fourth dwords of a transmit descriptor that sends `len` bytes as one
    /// whole frame, with the FCS inserted and the status reported.
    fn tx_words(len: u32) -> (u32, u32);
    /// The family's receive set-up after the reset, before the rings are given (descriptor
    /// format, buffer size, queue enables).
    fn configure<M: Mmio>(regs: &M);
    /// Starts the link after the receiver and transmitter are on; `Err` when a bounded wait
    /// on the NIC ran out.
    fn start_link<M: Mmio>(regs: &M) -> Result<(), IntelError>;
    /// Routes queue 0's receive and transmit interrupts to MSI-X vector 0.
    fn route_vector0<M: Mmio>(regs: &M);
    /// Enables queue 0's interrupt causes again after routing, when the NIC masks a cause
    /// as it sends its message (the 82574); called when the link finds no frame, before the
    /// CPU may halt. Nothing by default.
    fn rearm<M: Mmio>(regs: &M) {
        let _ = regs;
    }
}

pub(crate) mod sealed {
    /// Keeps [`super::Family`] to this crate's families.
    pub trait Sealed {}
}

/// Why an Intel NIC could not be brought up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntelError {
    /// No function of the family at that address.
    NoDevice,
    /// BAR 0 is not an assigned memory BAR, or the HAL did not map it.
    Bar,
    /// DMA memory for the rings and buffers is exhausted.
    OutOfDma,
    /// The software reset did not complete.
    ResetTimeout,
    /// An EEPROM read did not complete.
    EepromTimeout,
    /// A PHY access did not complete, or the PHY refused it.
    PhyTimeout,
    /// The MAC the NIC gave is not a station address (zero, or a group address).
    BadMac,
    /// The link did not come up in the polls allowed ([`IntelNic::wait_link`]).
    LinkDown,
}

impl core::fmt::Display for IntelError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            IntelError::NoDevice => "no NIC of this family at that address",
            IntelError::Bar => "BAR 0 is not a mapped memory BAR",
            IntelError::OutOfDma => "DMA memory exhausted",
            IntelError::ResetTimeout => "the NIC's reset did not complete",
            IntelError::EepromTimeout => "an EEPROM read did not complete",
            IntelError::PhyTimeout => "a PHY access did not complete",
            IntelError::BadMac => "the NIC's MAC is not a station address",
            IntelError::LinkDown => "the link did not come up",
        })
    }
}

/// Frames counted by an [`IntelNic`], refusals by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames handed to the caller.
    pub received: u64,
    /// Frames handed to the NIC.
    pub transmitted: u64,
    /// Frames shown to the caller and refused by it (not for this interface), or longer than
    /// its buffer.
    pub dropped: u64,
    /// Refused: a length the NIC got wrong (below a header, past the buffer or the largest
    /// frame).
    pub bad_length: u64,
    /// Refused: descriptors of a frame spread over several (never sent by this link's peers:
    /// every frame fits a buffer).
    pub fragments: u64,
    /// Refused: the NIC flagged an error.
    pub errors: u64,
    /// Transmissions refused because every descriptor was in flight.
    pub busy: u64,
    /// Times the receive side started over at the NIC's head: its head stood still, away
    /// from where the driver looked, for [`STALL_POLLS`] empty looks twice (a done bit
    /// written out of turn had put them apart).
    pub rx_resyncs: u64,
    /// Times transmit descriptors were taken back by the NIC's head after [`STALL_POLLS`]
    /// refusals in a row (a NIC that moved on without writing done bits back).
    pub tx_resyncs: u64,
}

/// Empty receive looks (or busy transmit refusals) before the NIC's head register is read
/// to find a NIC and a driver out of step: one register read in that many.
pub const STALL_POLLS: u32 = 64;

/// An Intel NIC of family `F` as a [`Link`]: queue 0 of each direction, polled.
pub struct IntelNic<H: Hal, F: Family> {
    regs: H::Mmio,
    hal: H,
    dma: Dma<H>,
    rings: Rings,
    address: PciAddress,
    mac: [u8; 6],
    stats: LinkStats,
    /// Whether the last receive descriptor was part of a frame still going on (its later
    /// descriptors are refused too).
    in_fragment: bool,
    /// Empty receive looks since the head was last read, and the head read then.
    rx_stall: (u32, u32),
    /// Busy transmit refusals in a row.
    tx_stall: u32,
    /// Whether the interrupts are routed ([`Family::rearm`] after an empty look).
    routed: bool,
    _family: core::marker::PhantomData<F>,
}

impl<H: Hal, F: Family> IntelNic<H, F> {
    /// Brings up the function at `address` (see the module documentation). On failure
    /// everything allocated is returned and the command register restored.
    ///
    /// # Safety
    ///
    /// `pci` reaches the function at `address`, which nothing else drives while the value
    /// lives; its BAR 0 is assigned (as firmware does) and mapped by `hal`'s
    /// [`map_mmio`](Hal::map_mmio).
    pub unsafe fn new<C: ConfigRegionAccess>(
        hal: H,
        pci: &C,
        address: PciAddress,
    ) -> Result<Self, IntelError> {
        let id = pci::device_id(pci, address).ok_or(IntelError::NoDevice)?;
        if !F::DEVICE_IDS.contains(&id) {
            return Err(IntelError::NoDevice);
        }
        // SAFETY: the caller drives the function.
        let old = unsafe { pci::enable(pci, address) };
        let up = Self::bring_up(hal, pci, address);
        if up.is_err() {
            // SAFETY: as above.
            unsafe { pci::restore(pci, address, old) };
        }
        up
    }

    fn bring_up<C: ConfigRegionAccess>(
        hal: H,
        pci: &C,
        address: PciAddress,
    ) -> Result<Self, IntelError> {
        let bar = pci::memory_bar(pci, address, 0).ok_or(IntelError::Bar)?;
        // SAFETY: BAR 0 of the function the caller drives (`new`'s contract).
        let regs = unsafe { hal.map_mmio(bar, MMIO_SIZE) }.ok_or(IntelError::Bar)?;
        let dma = Dma::new(hal.clone()).map_err(|_| IntelError::OutOfDma)?;
        reset(&regs)?;
        let mac = read_mac(&regs)?;
        regs.write32(RAL0, u32::from_le_bytes([mac[0], mac[1], mac[2], mac[3]]));
        regs.write32(
            RAH0,
            u32::from(u16::from_le_bytes([mac[4], mac[5]])) | RAH_AV,
        );
        for i in 0..MTA_LEN {
            regs.write32(MTA + 4 * i, 0);
        }
        F::configure(&regs);
        let mut rings = Rings::new();
        let tail = rings.fill_rx(&dma);
        let (rx, tx) = Rings::ring_addresses(&dma);
        for (r, base, bytes) in [
            (F::RX_RING, rx, RX_DESC * ring::DESC),
            (F::TX_RING, tx, TX_DESC * ring::DESC),
        ] {
            regs.write32(r.bal, base as u32);
            regs.write32(r.bah, (base >> 32) as u32);
            regs.write32(r.len, bytes as u32);
            regs.write32(r.head, 0);
            regs.write32(r.tail, 0);
        }
        hal.publish_barrier();
        regs.write32(F::RX_RING.tail, tail);
        regs.write32(RXCSUM, RXCSUM_IPOFLD);
        regs.write32(RCTL, RCTL_EN | RCTL_BAM | RCTL_SECRC);
        regs.write32(TCTL, TCTL_EN | TCTL_PSP | TCTL_CT_COLD);
        let nic = IntelNic {
            regs,
            hal,
            dma,
            rings,
            address,
            mac,
            stats: LinkStats::default(),
            in_fragment: false,
            rx_stall: (0, u32::MAX),
            tx_stall: 0,
            routed: false,
            _family: core::marker::PhantomData,
        };
        // On failure from here, `nic`'s Drop resets the NIC before the memory goes.
        F::start_link(&nic.regs)?;
        Ok(nic)
    }

    /// Whether the NIC reports the link up.
    pub fn link_up(&self) -> bool {
        self.regs.read32(STATUS) & STATUS_LU != 0
    }

    /// Waits (at most `polls` reads of the status register) for the link to come up.
    pub fn wait_link(&self, polls: u32) -> Result<(), IntelError> {
        for _ in 0..polls {
            if self.link_up() {
                return Ok(());
            }
            core::hint::spin_loop();
        }
        Err(IntelError::LinkDown)
    }

    /// Takes frames to the multicast group `mac` from now on (its bit of the multicast
    /// table: the table is a hash, so a few other groups come in too, and the transport's
    /// filter drops them).
    pub fn join_multicast(&mut self, mac: [u8; 6]) {
        let (reg, bit) = mta_bit(mac);
        let at = MTA + 4 * reg;
        self.regs.write32(at, self.regs.read32(at) | bit);
    }

    /// Routes the NIC's interrupts, a received frame and a finished transmission alike, to
    /// `msg` (MSI-X table entry 0), so that a CPU halted while it waits wakes on the next
    /// frame. Halt only after [`Link::receive`] found nothing.
    ///
    /// # Safety
    ///
    /// `pci` reaches this NIC's function as the one given to [`IntelNic::new`]; nothing else
    /// uses its MSI-X table; the table's BAR is mapped by the HAL.
    pub unsafe fn route_interrupts<C: ConfigRegionAccess>(
        &mut self,
        pci: &C,
        msg: MsiMessage,
    ) -> Result<(), MsixError> {
        // SAFETY: the caller's promise.
        unsafe { pci::msix_entry0(&self.hal, pci, self.address, msg) }?;
        F::route_vector0(&self.regs);
        self.routed = true;
        Ok(())
    }

    /// Where the function is.
    pub fn address(&self) -> PciAddress {
        self.address
    }

    /// Frames counted so far.
    pub fn stats(&self) -> LinkStats {
        self.stats
    }

    /// Transmissions the NIC has not reported done.
    pub fn in_flight(&self) -> usize {
        self.rings.tx_in_flight()
    }

    /// The next whole frame the NIC received: its descriptor and length. Refusals are counted
    /// and their descriptors given back; at most one pass over the ring.
    fn next_frame(&mut self) -> Option<(usize, usize)> {
        for _ in 0..RX_DESC {
            let (verdict, i) = self.rings.rx_peek(&self.dma, MAX_FRAME);
            let fragment = self.in_fragment;
            match verdict {
                Rx::Empty => {
                    self.announce_rx();
                    self.rx_stalled();
                    if self.routed {
                        // A frame that came since the last message, while the NIC had its
                        // cause masked, is announced now.
                        F::rearm(&self.regs);
                    }
                    return None;
                }
                Rx::Frame(len) if !fragment => return Some((i, len)),
                // The last descriptor of a frame spread over several.
                Rx::Frame(_) => {
                    self.in_fragment = false;
                    self.stats.fragments += 1;
                }
                Rx::Fragment => {
                    self.in_fragment = true;
                    self.stats.fragments += 1;
                }
                Rx::Length => {
                    self.in_fragment = false;
                    self.stats.bad_length += 1;
                }
                Rx::Error => {
                    self.in_fragment = false;
                    self.stats.errors += 1;
                }
            }
            self.give_back(i);
        }
        self.announce_rx();
        None
    }

    /// Counts an empty look; every [`STALL_POLLS`] of them reads the NIC's head, and when it
    /// stood still since the last read, away from the driver, starts over there (the head is
    /// the NIC's word: bounded, and only trusted to say where to start looking).
    fn rx_stalled(&mut self) {
        self.rx_stall.0 += 1;
        if self.rx_stall.0 < STALL_POLLS {
            return;
        }
        let head = self.regs.read32(F::RX_RING.head);
        let still = head == self.rx_stall.1;
        self.rx_stall = (0, head);
        let head = head as usize;
        if still && head < RX_DESC && head != self.rings.rx_next() {
            let tail = self.rings.rx_resync(&self.dma, head);
            self.in_fragment = false;
            self.hal.publish_barrier();
            self.regs.write32(F::RX_RING.tail, tail);
            self.stats.rx_resyncs += 1;
        }
    }

    /// Counts a busy refusal; after [`STALL_POLLS`] in a row, takes back the descriptors the
    /// NIC's head has passed.
    fn tx_stalled(&mut self) {
        self.tx_stall += 1;
        if self.tx_stall < STALL_POLLS {
            return;
        }
        self.tx_stall = 0;
        let head = self.regs.read32(F::TX_RING.head) as usize;
        if head < TX_DESC && self.rings.tx_resync(head) > 0 {
            self.stats.tx_resyncs += 1;
        }
    }

    /// Gives receive descriptor `i` back (the tail written once a batch is due).
    fn give_back(&mut self, i: usize) {
        if let Some(tail) = self.rings.rx_done(&self.dma, i, false) {
            self.hal.publish_barrier();
            self.regs.write32(F::RX_RING.tail, tail);
        }
    }

    /// Announces the descriptors given back and not yet announced.
    fn announce_rx(&mut self) {
        if self.rings.rx_pending() {
            let tail = self.rings.rx_tail();
            self.hal.publish_barrier();
            self.regs.write32(F::RX_RING.tail, tail);
        }
    }
}

/// Resets the NIC: interrupts masked, receiver and transmitter off, then the reset bit,
/// waited for (bounded) to clear; interrupts masked again and their causes cleared.
fn reset<M: Mmio>(regs: &M) -> Result<(), IntelError> {
    regs.write32(IMC, u32::MAX);
    regs.write32(RCTL, 0);
    regs.write32(TCTL, 0);
    regs.write32(CTRL, regs.read32(CTRL) | CTRL_RST);
    wait(regs, CTRL, CTRL_RST, 0).ok_or(IntelError::ResetTimeout)?;
    regs.write32(IMC, u32::MAX);
    let _ = regs.read32(ICR);
    Ok(())
}

/// Polls `reg` (at most [`POLLS`] reads) until `reg & mask == want`; the last value read.
fn wait<M: Mmio>(regs: &M, reg: usize, mask: u32, want: u32) -> Option<u32> {
    for _ in 0..POLLS {
        let v = regs.read32(reg);
        if v & mask == want {
            return Some(v);
        }
        core::hint::spin_loop();
    }
    None
}

/// The station address: receive address 0 when the NIC marks it valid, else EEPROM words 0-2.
fn read_mac<M: Mmio>(regs: &M) -> Result<[u8; 6], IntelError> {
    let (low, high) = (regs.read32(RAL0), regs.read32(RAH0));
    let mut mac = [0u8; 6];
    if high & RAH_AV != 0 {
        mac[..4].copy_from_slice(&low.to_le_bytes());
        mac[4..].copy_from_slice(&(high as u16).to_le_bytes());
    } else {
        for w in 0..3u32 {
            regs.write32(EERD, w << EERD_ADDR_SHIFT | EERD_START);
            let v = wait(regs, EERD, EERD_DONE, EERD_DONE).ok_or(IntelError::EepromTimeout)?;
            let word = ((v >> EERD_DATA_SHIFT) as u16).to_le_bytes();
            mac[2 * w as usize..2 * w as usize + 2].copy_from_slice(&word);
        }
    }
    if mac == [0; 6] || mac[0] & 1 != 0 {
        return Err(IntelError::BadMac);
    }
    Ok(mac)
}

/// Writes PHY register `reg` of the internal PHY (address 1) through MDIC, waiting (bounded)
/// for the access to complete.
#[cfg_attr(not(feature = "igb"), allow(dead_code))] // igb starts its link through the PHY
pub(crate) fn phy_write<M: Mmio>(regs: &M, reg: u32, value: u16) -> Result<(), IntelError> {
    regs.write32(
        MDIC,
        u32::from(value) | reg << MDIC_REG_SHIFT | 1 << MDIC_PHY_SHIFT | MDIC_OP_WRITE,
    );
    let v = wait(regs, MDIC, MDIC_READY, MDIC_READY).ok_or(IntelError::PhyTimeout)?;
    if v & MDIC_ERROR != 0 {
        return Err(IntelError::PhyTimeout);
    }
    Ok(())
}

impl<H: Hal, F: Family> Drop for IntelNic<H, F> {
    fn drop(&mut self) {
        // Stop the NIC before its memory goes: a reset stops its DMA. One that does not
        // complete keeps the memory from the HAL for good (the NIC may still write it).
        if reset(&self.regs).is_err() {
            self.dma.leak();
        }
    }
}

impl<H: Hal, F: Family> Link for IntelNic<H, F> {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn join_multicast(&mut self, group: [u8; 6]) {
        IntelNic::join_multicast(self, group);
    }

    fn max_frame(&self) -> usize {
        MAX_FRAME
    }

    fn transmit(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        if frame.is_empty() || frame.len() > MAX_FRAME {
            return Err(LinkError::Size);
        }
        self.transmit_with(&mut [], |buf| {
            buf.get_mut(..frame.len())?.copy_from_slice(frame);
            Some(frame.len())
        })
        .map(|_| ())
    }

    fn transmit_with<B>(&mut self, _: &mut [u8], build: B) -> Result<Option<usize>, LinkError>
    where
        B: FnOnce(&mut [u8]) -> Option<usize>,
    {
        if !self.rings.tx_free(&self.dma) {
            self.stats.busy += 1;
            self.tx_stalled();
            return Err(LinkError::Busy);
        }
        self.tx_stall = 0;
        let buf = self.rings.tx_buffer(&self.dma);
        let Some(n) = build(&mut buf[..MAX_FRAME]) else {
            return Ok(None);
        };
        if n == 0 || n > MAX_FRAME {
            return Err(LinkError::Size);
        }
        let len = n.max(MIN_FRAME);
        buf[n..len].fill(0);
        let tail = self.rings.tx_post(&self.dma, F::tx_words(len as u32));
        self.hal.publish_barrier();
        self.regs.write32(F::TX_RING.tail, tail);
        self.stats.transmitted += 1;
        Ok(Some(n))
    }

    fn tx_ready(&mut self) -> bool {
        self.rings.tx_free(&self.dma)
    }

    fn receive(&mut self, buf: &mut [u8]) -> Option<usize> {
        // At most one pass over the ring: a flood of frames too long cannot hold the caller.
        for _ in 0..RX_DESC {
            if let Some(n) = self.receive_if(buf, |_| true)? {
                return Some(n);
            }
        }
        None
    }

    fn receive_with<R, G>(&mut self, _: &mut [u8], f: G) -> Option<R>
    where
        G: FnOnce(&[u8]) -> R,
    {
        let (i, len) = self.next_frame()?;
        let r = f(Rings::rx_bytes(&self.dma, i, len));
        self.stats.received += 1;
        self.give_back(i);
        Some(r)
    }

    fn receive_if<G>(&mut self, buf: &mut [u8], want: G) -> Option<Option<usize>>
    where
        G: FnOnce(&[u8]) -> bool,
    {
        let got = self.receive_with(&mut [], |frame| crate::copy_if(frame, buf, want))?;
        if got.is_none() {
            self.stats.received -= 1;
            self.stats.dropped += 1;
        }
        Some(got)
    }
}
