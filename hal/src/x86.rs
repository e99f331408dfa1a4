//! Bare-metal x86_64 pieces: PCI configuration mechanism #1 over I/O ports 0xCF8/0xCFC.

use pci_types::{ConfigRegionAccess, PciAddress};
use x86_64::instructions::port::Port;

const CONFIG_ADDRESS: u16 = 0xCF8;
const CONFIG_DATA: u16 = 0xCFC;

/// PCI configuration access through the legacy I/O ports (segment 0, 256 bytes a function).
///
/// The address/data port pair is a shared resource, so every access takes a spin lock.
pub struct PortIoConfig {
    lock: spin::Mutex<()>,
}

impl PortIoConfig {
    /// The accessor.
    ///
    /// # Safety
    ///
    /// The machine has configuration mechanism #1 at ports 0xCF8/0xCFC, the code runs at a
    /// privilege level allowed to use them, and nothing outside this value uses those ports.
    pub const unsafe fn new() -> Self {
        PortIoConfig {
            lock: spin::Mutex::new(()),
        }
    }

    fn address(address: PciAddress, offset: u16) -> u32 {
        0x8000_0000
            | (u32::from(address.bus()) << 16)
            | (u32::from(address.device()) << 11)
            | (u32::from(address.function()) << 8)
            | u32::from(offset & 0xFC)
    }
}

impl ConfigRegionAccess for PortIoConfig {
    unsafe fn read(&self, address: PciAddress, offset: u16) -> u32 {
        let _guard = self.lock.lock();
        let mut addr = Port::<u32>::new(CONFIG_ADDRESS);
        let mut data = Port::<u32>::new(CONFIG_DATA);
        // SAFETY: `new`'s contract gives us the configuration ports; the lock keeps the
        // address/data pair atomic.
        unsafe {
            addr.write(Self::address(address, offset));
            data.read()
        }
    }

    unsafe fn write(&self, address: PciAddress, offset: u16, value: u32) {
        let _guard = self.lock.lock();
        let mut addr = Port::<u32>::new(CONFIG_ADDRESS);
        let mut data = Port::<u32>::new(CONFIG_DATA);
        // SAFETY: as in `read`; the caller vouches that the write is valid for the function.
        unsafe {
            addr.write(Self::address(address, offset));
            data.write(value);
        }
    }
}
