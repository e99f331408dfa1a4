//! PCI for virtio-drivers: its `ConfigurationAccess` over a [`ConfigRegionAccess`], and the
//! search for a virtio-net function.

use pci_types::{ConfigRegionAccess, PciAddress};
use virtio_drivers::transport::pci::bus::{ConfigurationAccess, DeviceFunction};

/// The virtio PCI vendor.
pub const VENDOR: u16 = 0x1AF4;
/// A transitional virtio-net function (legacy and modern interface).
pub const DEVICE_TRANSITIONAL: u16 = 0x1000;
/// A modern-only virtio-net function (0x1040 + device type 1).
pub const DEVICE_MODERN: u16 = 0x1041;

/// virtio-drivers' configuration access, over bareverbs' (segment 0).
pub struct PciConfig<'a, C: ConfigRegionAccess> {
    access: &'a C,
}

impl<'a, C: ConfigRegionAccess> PciConfig<'a, C> {
    /// Wraps `access`.
    ///
    /// # Safety
    ///
    /// Reads and writes through `access` are valid for every function and offset virtio-drivers
    /// names (the functions of segment 0 it is handed, at dword offsets 0..256), and nothing
    /// else reconfigures those functions meanwhile.
    pub unsafe fn new(access: &'a C) -> Self {
        PciConfig { access }
    }
}

fn address(f: DeviceFunction) -> PciAddress {
    PciAddress::new(0, f.bus, f.device, f.function)
}

impl<C: ConfigRegionAccess> ConfigurationAccess for PciConfig<'_, C> {
    fn read_word(&self, device_function: DeviceFunction, register_offset: u8) -> u32 {
        // SAFETY: `new`'s contract covers every function and offset virtio-drivers names.
        unsafe {
            self.access
                .read(address(device_function), register_offset.into())
        }
    }

    fn write_word(&mut self, device_function: DeviceFunction, register_offset: u8, data: u32) {
        // SAFETY: as in `read_word`.
        unsafe {
            self.access
                .write(address(device_function), register_offset.into(), data)
        }
    }

    unsafe fn unsafe_clone(&self) -> Self {
        PciConfig {
            access: self.access,
        }
    }
}

/// Whether a vendor/device ID pair is a virtio-net function.
pub fn is_virtio_net(vendor: u16, device: u16) -> bool {
    vendor == VENDOR && (device == DEVICE_TRANSITIONAL || device == DEVICE_MODERN)
}

/// The first virtio-net function on segment 0 (buses 0–255, every function of every slot), in
/// address order.
pub fn find<C: ConfigRegionAccess>(access: &C) -> Option<PciAddress> {
    (0u32..256 * 32 * 8).find_map(|i| {
        let a = PciAddress::new(0, (i >> 8) as u8, ((i >> 3) & 31) as u8, (i & 7) as u8);
        // SAFETY: offset 0 exists in every function's configuration header; a read of an absent
        // function returns all-ones without side effects.
        let id = unsafe { access.read(a, 0) };
        is_virtio_net(id as u16, (id >> 16) as u16).then_some(a)
    })
}
