//! The controller's MSI-X entry 0 and the wait between two looks at a completion queue
//! ([`Nvme::enable_msix`], [`Nvme::set_wait`]): the capability found and bounded, the entry
//! programmed and read back, the controller restarted so that its queues are bound to the
//! vector.

use bareverbs_hal::{ConfigRegionAccess, Hal, Mmio, MsiMessage, PciAddress};

use super::{Nvme, NvmeError, State, disable};

/// The PCI capability ID of MSI-X.
const CAP_MSIX: u8 = 0x11;
/// MSI-X Message Control: MSI-X Enable.
const MSIX_ENABLE: u32 = 1 << 15;
/// MSI-X Message Control: Function Mask.
const MSIX_FUNCTION_MASK: u32 = 1 << 14;
/// Bytes of one MSI-X table entry.
const MSIX_ENTRY: usize = 16;
/// The PCI command register's Interrupt Disable bit (INTx off).
const PCI_INTX_DISABLE: u32 = 1 << 10;

/// Why the controller's completions cannot interrupt ([`Nvme::enable_msix`]): the driver then
/// keeps polling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsixError {
    /// No capability list, or no MSI-X capability in the first 48 entries.
    NoCapability,
    /// The table lies in another BAR than BAR 0, or not inside the mapped window.
    Table,
    /// The entry did not keep the message written to it (the controller polls on).
    Refused,
    /// The controller did not come back from the restart that binds the vector to its
    /// queues (it is left stopped, as after any failed [`Nvme::reset`]).
    Restart(NvmeError),
}

impl core::fmt::Display for MsixError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            MsixError::NoCapability => "no MSI-X capability",
            MsixError::Table => "the MSI-X table is not inside the mapped BAR 0",
            MsixError::Refused => "the MSI-X entry did not keep its message",
            MsixError::Restart(_) => "the controller did not restart with MSI-X",
        })
    }
}

/// Where MSI-X entry 0 lies: the capability's configuration offset, and the entry's byte
/// offset in BAR 0. `window` is the mapped part of BAR 0; nothing the function says is used
/// before it is bounded.
fn find_msix<C: ConfigRegionAccess>(
    pci: &C,
    at: PciAddress,
    window: usize,
) -> Result<(u16, usize), MsixError> {
    // SAFETY: configuration reads of the caller's function have no side effect.
    let status = unsafe { pci.read(at, 0x04) } >> 16;
    if status == 0xFFFF || status & 0x10 == 0 {
        return Err(MsixError::NoCapability);
    }
    // SAFETY: as above.
    let mut ptr = (unsafe { pci.read(at, 0x34) } & 0xFC) as u16;
    // Bounded: a list that loops ends after as many capabilities as fit in 256 bytes.
    for _ in 0..48 {
        if ptr < 0x40 {
            break;
        }
        // SAFETY: as above; `ptr` is a dword offset below 256.
        let head = unsafe { pci.read(at, ptr) };
        if head as u8 == CAP_MSIX {
            // SAFETY: as above: the Table Offset / Table BIR dword.
            let table = unsafe { pci.read(at, ptr + 4) };
            let (bir, offset) = (table & 7, (table & !7) as usize);
            // Entry 0 alone is used: it exists whatever the table size says (N - 1 encoded).
            if bir != 0
                || offset
                    .checked_add(MSIX_ENTRY)
                    .is_none_or(|end| end > window)
            {
                return Err(MsixError::Table);
            }
            return Ok((ptr, offset));
        }
        ptr = ((head >> 8) & 0xFC) as u16;
    }
    Err(MsixError::NoCapability)
}

impl<H: Hal> Nvme<H> {
    /// Programs MSI-X entry 0 with `message` and enables MSI-X (INTx off): the completions
    /// of the admin queue and of every I/O queue (all on vector 0) then interrupt. The table
    /// must lie in BAR 0 inside the mapped window ([`MMIO_SIZE`](super::MMIO_SIZE)); the entry is read back.
    /// Until it succeeds the driver polls; on failure MSI-X is left off.
    ///
    /// The controller is stopped while the entry is written and restarted after (its queues
    /// made anew, the namespaces kept): a controller may bind a queue to its vector only when
    /// the queue is created with MSI-X already enabled (QEMU's does), so queues made before
    /// would never interrupt.
    ///
    /// # Errors
    ///
    /// [`MsixError`]: no capability, a table the driver cannot reach, an entry that does not
    /// keep its message.
    ///
    /// # Safety
    ///
    /// `pci` reaches the function this value drives (the `address` given to [`Nvme::new`]).
    pub unsafe fn enable_msix<C: ConfigRegionAccess>(
        &mut self,
        pci: &C,
        address: PciAddress,
        message: MsiMessage,
    ) -> Result<(), MsixError> {
        let (cap, table) = find_msix(pci, address, self.regs.size())?;
        if self.state == State::Wedged {
            return Err(MsixError::Restart(NvmeError::Stopped));
        }
        if let Err(e) = disable(&self.regs, self.cap, self.clock) {
            self.state = State::Wedged;
            return Err(MsixError::Restart(e));
        }
        self.state = State::Failed;
        let kept = self.program_msix(pci, address, cap, table, message);
        self.interrupts = kept;
        self.restart().map_err(MsixError::Restart)?;
        if kept {
            Ok(())
        } else {
            Err(MsixError::Refused)
        }
    }

    /// Writes MSI-X entry 0 (table at `table` in BAR 0, capability at `cap`) and enables
    /// MSI-X, or leaves it off if the entry does not keep the message. The controller is
    /// disabled meanwhile.
    fn program_msix<C: ConfigRegionAccess>(
        &mut self,
        pci: &C,
        address: PciAddress,
        cap: u16,
        table: usize,
        message: MsiMessage,
    ) -> bool {
        // SAFETY: the caller's function: its command register and MSI-X capability.
        let (command, control) = unsafe { (pci.read(address, 4), pci.read(address, cap)) };
        // Enabled with the whole function masked while entry 0 is written (PCI 3.0, 6.8.2).
        // SAFETY: as above.
        unsafe {
            pci.write(
                address,
                cap,
                control | MSIX_ENABLE << 16 | MSIX_FUNCTION_MASK << 16,
            )
        };
        let words = [
            message.address as u32,
            (message.address >> 32) as u32,
            message.data,
        ];
        // Entry 0 masked while written, then unmasked (vector control bit 0).
        self.regs.write32(table + 12, 1);
        for (i, w) in words.into_iter().enumerate() {
            self.regs.write32(table + 4 * i, w);
        }
        let kept = (0..3).all(|i| self.regs.read32(table + 4 * i) == words[i]);
        if !kept {
            // SAFETY: as above: MSI-X back off as it was.
            unsafe { pci.write(address, cap, control & !(MSIX_ENABLE << 16)) };
            return false;
        }
        self.regs.write32(table + 12, 0);
        // SAFETY: as above: INTx off (bit 10; the status half is write-one-to-clear, so
        // written as 0), then the function unmasked.
        unsafe {
            pci.write(address, 4, (command & 0xFFFF) | PCI_INTX_DISABLE);
            pci.write(
                address,
                cap,
                (control | MSIX_ENABLE << 16) & !(MSIX_FUNCTION_MASK << 16),
            );
        }
        true
    }

    /// Whether the completions interrupt ([`Nvme::enable_msix`] succeeded).
    pub fn interrupts(&self) -> bool {
        self.interrupts
    }

    /// What a wait for a completion does between two looks at its queue, once the completions
    /// interrupt: the embedder's way to give the CPU away until an interrupt arrives (on a
    /// bare-metal x86 `sti; hlt`, woken by the completion's MSI-X message or the next timer
    /// tick). It must return within a bounded time: the command's timeout is counted on the
    /// clock between two calls. Without interrupts the driver spins, whatever this is.
    pub fn set_wait(&mut self, wait: fn()) {
        self.wait = wait;
    }
}
