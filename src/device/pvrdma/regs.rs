//! PVRDMA register map (BAR1) and doorbells (BAR2 UAR pages).
//!
//! Sources: Linux `drivers/infiniband/hw/vmw_pvrdma/pvrdma_dev_api.h` (L-API), QEMU
//! `hw/rdma/vmw/pvrdma_main.c` (Q-MAIN), `include/uapi/rdma/vmw_pvrdma-abi.h` (L-ABI); see
//! `docs/pvrdma.md` §1, §2, §9.

/// PCI vendor ID of VMware (L-H).
pub const VENDOR_VMWARE: u16 = 0x15AD;
/// PCI device ID of the PVRDMA function (L-H, Q-MAIN).
pub const DEVICE_PVRDMA: u16 = 0x0820;
/// PCI device ID of the vmxnet3 function that must sit at function 0 of the same slot (Q-MAIN).
pub const DEVICE_VMXNET3: u16 = 0x07B0;

/// BAR holding the registers (L-API: PVRDMA_PCI_RESOURCE_REG).
pub const BAR_REGS: u8 = 1;
/// BAR holding the UAR doorbell pages (L-API: PVRDMA_PCI_RESOURCE_UAR).
pub const BAR_UAR: u8 = 2;
/// Smallest register window used: registers 0x00–0x24 (QEMU implements 0x100).
pub const REGS_MIN_SIZE: u64 = 0x28;
/// Smallest UAR window used: one page.
pub const UAR_MIN_SIZE: u64 = 4096;

/// Register offsets in BAR1; 32-bit accesses only (L-API `PVRDMA_REG_*`, Q-MAIN `regs_write`).
pub mod reg {
    /// Device interface version (R). QEMU: 17.
    pub const VERSION: usize = 0x00;
    /// Low 32 bits of the shared region's physical address (W).
    pub const DSR_LOW: usize = 0x04;
    /// High 32 bits; writing it makes the device load the shared region (W).
    pub const DSR_HIGH: usize = 0x08;
    /// Control (W): see [`super::ctl`].
    pub const CTL: usize = 0x0C;
    /// Writing 0 runs the command in the command slot (W).
    pub const REQUEST: usize = 0x10;
    /// Status of the last command: 0 or a negative errno in two's complement (R).
    pub const ERR: usize = 0x14;
    /// Interrupt mask (R/W): non-zero masks every vector on QEMU.
    pub const IMR: usize = 0x1C;
}

/// Values of the CTL register (L-API `PVRDMA_DEVICE_CTL_*`).
pub mod ctl {
    /// Start the device.
    pub const ACTIVATE: u32 = 0;
    /// Stop the device (QEMU: stops its completion thread; objects are kept).
    pub const RESET: u32 = 2;
}

/// ERR value meaning "rejected before running": no shared region, unknown or unimplemented
/// opcode (Q-MAIN reset value, Q-CMD `pvrdma_exec_cmd`).
pub const ERR_REJECTED: u32 = 0xFFFF;
/// IMR value masking every interrupt (L-MAIN `pvrdma_disable_intrs`).
pub const IMR_MASK_ALL: u32 = !0;

/// Doorbell offsets inside a UAR page and their bits (L-ABI `PVRDMA_UAR_*`).
pub mod db {
    /// QP doorbell offset.
    pub const QP: usize = 0x0;
    /// CQ doorbell offset.
    pub const CQ: usize = 0x4;
    /// SRQ doorbell offset.
    pub const SRQ: usize = 0x8;
    /// Handle field mask.
    pub const HANDLE_MASK: u32 = 0x00FF_FFFF;
    /// QP: process the send queue.
    pub const QP_SEND: u32 = 1 << 30;
    /// QP: process the receive queue.
    pub const QP_RECV: u32 = 1 << 31;
    /// CQ: arm for solicited completions only.
    pub const CQ_ARM_SOL: u32 = 1 << 29;
    /// CQ: arm for the next completion (QEMU needs ARM_SOL too, §9).
    pub const CQ_ARM: u32 = 1 << 30;
    /// CQ: harvest completions now.
    pub const CQ_POLL: u32 = 1 << 31;
    /// SRQ: process the receive queue.
    pub const SRQ_RECV: u32 = 1 << 30;
}
