//! The NIC the software RoCE device runs over: the first Intel igb (82576), else the first
//! Intel e1000e (82574), else the first virtio-net, or the family the command line names
//! (`bvnic=igb|e1000e|virtio`). [`Nic`] is one type over the three, so that the RoCE device
//! (generic over its [`Link`]) is compiled once per kernel; each call is a `match` on the
//! family and then the family's own code, with nothing dynamic.

use core::fmt::Write;

use bareverbs::hal::e1000e::{self, E1000e};
use bareverbs::hal::igb::{self, Igb};
use bareverbs::hal::intel::{self, IntelError};
use bareverbs::hal::virtio_net::{self, GlobalIdentity, VirtioNet};
use bareverbs::hal::{Hal, IdentityHal, Link, LinkError, x86::PortIoConfig};
use pci_types::PciAddress;

use crate::console::Serial;

/// The HAL the kernels run on.
type KHal = IdentityHal<'static>;

/// A NIC family this kernel drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Intel 82576 (QEMU's `-device igb`).
    Igb,
    /// Intel 82574 (QEMU's `-device e1000e`).
    E1000e,
    /// virtio-net.
    Virtio,
}

impl Family {
    /// In the order they are looked for.
    pub const ALL: [Family; 3] = [Family::Igb, Family::E1000e, Family::Virtio];

    /// The family's name, as the command line's `bvnic=` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Family::Igb => "igb",
            Family::E1000e => "e1000e",
            Family::Virtio => "virtio",
        }
    }

    /// The family `bvnic=NAME` names.
    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The family the command line `cmdline` asks for with `bvnic=`: `Err` with the word when
    /// it names none.
    pub fn from_cmdline(cmdline: &str) -> Result<Option<Family>, &str> {
        match cmdline
            .split_ascii_whitespace()
            .find_map(|w| w.strip_prefix("bvnic="))
        {
            None => Ok(None),
            Some(n) => Family::from_name(n).map(Some).ok_or(n),
        }
    }

    /// The first function of this family on the machine.
    pub fn find(self, pci: &PortIoConfig) -> Option<PciAddress> {
        // One bus scan for every family (the one virtio-blk's search uses too).
        let is: fn(u16, u16) -> bool = match self {
            Family::Igb => |v, d| v == intel::pci::VENDOR_INTEL && igb::DEVICE_IDS.contains(&d),
            Family::E1000e => {
                |v, d| v == intel::pci::VENDOR_INTEL && e1000e::DEVICE_IDS.contains(&d)
            }
            Family::Virtio => virtio_net::is_virtio_net,
        };
        virtio_net::find_with(pci, is)
    }
}

/// The first NIC found: of family `only` if given, else in [`Family::ALL`]'s order.
pub fn find(pci: &PortIoConfig, only: Option<Family>) -> Option<(Family, PciAddress)> {
    Family::ALL
        .into_iter()
        .filter(|f| only.is_none_or(|o| o == *f))
        .find_map(|f| Some((f, f.find(pci)?)))
}

/// Milliseconds an Intel NIC is given to report its link up (QEMU's igb: 500 ms of
/// auto-negotiation after the driver restarts it).
pub const LINK_MS: u64 = 5000;

/// Why the NIC did not come up.
#[derive(Debug)]
pub enum NicError {
    /// An Intel NIC's bring-up.
    Intel(IntelError),
    /// virtio-net's bring-up.
    Virtio(virtio_net::VirtioNetError),
}

impl core::fmt::Display for NicError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            NicError::Intel(e) => write!(f, "{e}"),
            NicError::Virtio(e) => write!(f, "{e}"),
        }
    }
}

/// A NIC of one of the families, as a [`Link`].
// One value per kernel, moved once into the RoCE device: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Nic {
    /// An igb NIC.
    Igb(Igb<KHal>),
    /// An e1000e NIC.
    E1000e(E1000e<KHal>),
    /// A virtio-net NIC.
    Virtio(VirtioNet<GlobalIdentity>),
}

// SAFETY: a `Nic` owns its driver's DMA pages, rings and register window alone (raw pointers
// into memory no other value reaches); the RoCE device that holds it drives it under its
// device lock from whichever CPU holds that lock (the poll groups' CPUs, `docs/percore.md`),
// and memory, port I/O and MMIO reach the same device from every CPU.
unsafe impl Send for Nic {}

/// Calls `$body` with `$n` bound to the NIC of whichever family.
macro_rules! each {
    ($nic:expr, $n:ident => $body:expr) => {
        match $nic {
            Nic::Igb($n) => $body,
            Nic::E1000e($n) => $body,
            Nic::Virtio($n) => $body,
        }
    };
}

impl Nic {
    /// Brings up the NIC of `family` at `address` (an Intel NIC: and waits, for at most
    /// [`LINK_MS`] of `clock_ms`, for its link).
    ///
    /// # Safety
    ///
    /// `pci` reaches every function; nothing else drives the one at `address` while the value
    /// lives (a NIC driven before is gone: this takes it over anew); its BARs lie in the
    /// identity-mapped, uncached PCI hole that `hal` maps.
    pub unsafe fn new(
        family: Family,
        pci: &PortIoConfig,
        hal: KHal,
        address: PciAddress,
        clock_ms: &dyn Fn() -> u64,
    ) -> Result<Nic, NicError> {
        let link = |up: &dyn Fn(u32) -> Result<(), IntelError>| {
            let until = clock_ms().saturating_add(LINK_MS);
            loop {
                match up(1 << 12) {
                    Err(IntelError::LinkDown) if clock_ms() < until => {}
                    r => return r.map_err(NicError::Intel),
                }
            }
        };
        Ok(match family {
            Family::Igb => {
                // SAFETY: our caller's promise.
                let n = unsafe { Igb::new(hal, pci, address) }.map_err(NicError::Intel)?;
                link(&|p| n.wait_link(p))?;
                Nic::Igb(n)
            }
            Family::E1000e => {
                // SAFETY: our caller's promise.
                let n = unsafe { E1000e::new(hal, pci, address) }.map_err(NicError::Intel)?;
                link(&|p| n.wait_link(p))?;
                Nic::E1000e(n)
            }
            Family::Virtio => Nic::Virtio(
                // SAFETY: our caller's promise.
                unsafe { VirtioNet::<GlobalIdentity>::new(pci, address) }
                    .map_err(NicError::Virtio)?,
            ),
        })
    }

    /// The family.
    pub fn family(&self) -> Family {
        match self {
            Nic::Igb(_) => Family::Igb,
            Nic::E1000e(_) => Family::E1000e,
            Nic::Virtio(_) => Family::Virtio,
        }
    }

    /// Where the function is.
    pub fn address(&self) -> PciAddress {
        each!(self, n => n.address())
    }

    /// Whether the NIC filters what it hands on (this MAC, broadcast, the groups joined), or
    /// is promiscuous.
    pub fn filters(&self) -> bool {
        match self {
            Nic::Virtio(n) => n.filters(),
            Nic::Igb(_) | Nic::E1000e(_) => true,
        }
    }

    /// Routes the NIC's interrupts (a received frame, a finished transmission) to device
    /// vector 0; whether they are.
    pub fn route_interrupts(&mut self, pci: &PortIoConfig, hal: KHal) -> bool {
        let Some(msg) = hal.msi_message(0) else {
            return false;
        };
        // (Each arm:) `pci` reaches the NIC's function as given to `Nic::new`; nothing else
        // uses its MSI-X table; its BARs lie in the HAL's identity-mapped PCI hole.
        let r = match self {
            // SAFETY: as said above.
            Nic::Igb(n) => unsafe { n.route_interrupts(pci, msg) },
            // SAFETY: as said above.
            Nic::E1000e(n) => unsafe { n.route_interrupts(pci, msg) },
            Nic::Virtio(n) => {
                // SAFETY: as said above.
                return unsafe { n.route_interrupts(pci, msg) }
                    .map_err(|e| not_routed("virtio-net", e))
                    .is_ok();
            }
        };
        r.map_err(|e| not_routed(self.family().name(), e)).is_ok()
    }
}

impl Drop for Nic {
    /// Says what the NIC counted (the evidence of a lossy segment or a confused NIC), before
    /// the family's own drop resets it.
    fn drop(&mut self) {
        let name = self.family().name();
        let _ = match self {
            Nic::Igb(n) => intel_counts(name, n.stats()),
            Nic::E1000e(n) => intel_counts(name, n.stats()),
            Nic::Virtio(n) => {
                let c = n.stats();
                writeln!(
                    Serial,
                    "nic: {name} counted: received {}, transmitted {}, dropped {}",
                    c.received, c.transmitted, c.dropped
                )
            }
        };
    }
}

/// Prints an Intel NIC's counters.
fn intel_counts(name: &str, c: intel::LinkStats) -> core::fmt::Result {
    writeln!(
        Serial,
        "nic: {name} counted: received {}, transmitted {}, dropped {}, refused: length {}, \
         fragments {}, errors {}; transmit busy {}; resyncs rx {} tx {}",
        c.received,
        c.transmitted,
        c.dropped,
        c.bad_length,
        c.fragments,
        c.errors,
        c.busy,
        c.rx_resyncs,
        c.tx_resyncs
    )
}

/// Says why a NIC's interrupts are not routed.
fn not_routed(family: &str, why: impl core::fmt::Display) {
    let _ = writeln!(Serial, "nic: {family} interrupts not routed: {why}");
}

impl Link for Nic {
    fn mac(&self) -> [u8; 6] {
        each!(self, n => n.mac())
    }

    fn max_frame(&self) -> usize {
        each!(self, n => n.max_frame())
    }

    fn transmit(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        each!(self, n => n.transmit(frame))
    }

    fn tx_ready(&mut self) -> bool {
        each!(self, n => n.tx_ready())
    }

    fn paces_itself(&self) -> bool {
        each!(self, n => n.paces_itself())
    }

    fn join_multicast(&mut self, group: [u8; 6]) {
        each!(self, n => Link::join_multicast(n, group))
    }

    fn receive(&mut self, buf: &mut [u8]) -> Option<usize> {
        each!(self, n => n.receive(buf))
    }

    fn transmit_with<F>(&mut self, scratch: &mut [u8], build: F) -> Result<Option<usize>, LinkError>
    where
        F: FnOnce(&mut [u8]) -> Option<usize>,
    {
        each!(self, n => n.transmit_with(scratch, build))
    }

    fn receive_with<R, F>(&mut self, scratch: &mut [u8], f: F) -> Option<R>
    where
        F: FnOnce(&[u8]) -> R,
    {
        each!(self, n => n.receive_with(scratch, f))
    }

    fn receive_if<F>(&mut self, buf: &mut [u8], want: F) -> Option<Option<usize>>
    where
        F: FnOnce(&[u8]) -> bool,
    {
        each!(self, n => n.receive_if(buf, want))
    }
}
