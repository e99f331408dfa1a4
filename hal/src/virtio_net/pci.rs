//! PCI for virtio-drivers: its `ConfigurationAccess` over a [`ConfigRegionAccess`], and the
//! search for a virtio-net function.

use pci_types::{ConfigRegionAccess, PciAddress};
use virtio_drivers::transport::pci::bus::{Command, ConfigurationAccess, DeviceFunction, PciRoot};

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
    find_with(access, is_virtio_net)
}

/// The first function on segment 0 whose vendor and device IDs `is` accepts, in address order.
pub fn find_with<C: ConfigRegionAccess>(
    access: &C,
    is: fn(u16, u16) -> bool,
) -> Option<PciAddress> {
    (0u32..256 * 32 * 8).find_map(|i| {
        let a = PciAddress::new(0, (i >> 8) as u8, ((i >> 3) & 31) as u8, (i & 7) as u8);
        // SAFETY: offset 0 exists in every function's configuration header; a read of an absent
        // function returns all-ones without side effects.
        let id = unsafe { access.read(a, 0) };
        is(id as u16, (id >> 16) as u16).then_some(a)
    })
}

/// Runs `bring_up` on the function at `address` with memory decoding and bus mastering on,
/// through virtio-drivers' PCI root, and restores the command register if it fails. `None`
/// when `address` is not on segment 0 or not a function whose IDs `is` accepts.
///
/// # Safety
///
/// As [`PciConfig::new`] for `pci`; the function at `address` is driven by nothing else.
pub unsafe fn with_function<C: ConfigRegionAccess, T, E>(
    pci: &C,
    address: PciAddress,
    is: fn(u16, u16) -> bool,
    bring_up: impl FnOnce(&mut PciRoot<PciConfig<'_, C>>, DeviceFunction) -> Result<T, E>,
) -> Option<Result<T, E>> {
    if address.segment() != 0 {
        return None;
    }
    // SAFETY: offset 0 exists in every function's header; reading it has no side effect.
    let id = unsafe { pci.read(address, 0) };
    if !is(id as u16, (id >> 16) as u16) {
        return None;
    }
    // SAFETY: our caller's promise.
    let mut root = PciRoot::new(unsafe { PciConfig::new(pci) });
    let df = DeviceFunction {
        bus: address.bus(),
        device: address.device(),
        function: address.function(),
    };
    let (_, old) = root.get_status_command(df);
    root.set_command(df, old | Command::MEMORY_SPACE | Command::BUS_MASTER);
    let up = bring_up(&mut root, df);
    if up.is_err() {
        root.set_command(df, old);
    }
    Some(up)
}
