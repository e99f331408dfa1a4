//! Block storage drivers for the bareverbs kernels, beside the platform's virtio-blk: an NVMe
//! controller on PCIe ([`nvme`]), no_std and heap-free, generic over the bareverbs HAL (DMA
//! memory, register windows, PCI configuration space), whose namespaces are served through
//! the NVMe-oF library's [`BlockDevice`](bareverbs_nvmf::BlockDevice) seam.
#![no_std]
#![deny(
    unsafe_op_in_unsafe_fn,
    missing_docs,
    clippy::undocumented_unsafe_blocks
)]

pub mod nvme;
