//! Hardware abstraction for the `bareverbs` RDMA driver.
//!
//! The driver reaches hardware through three seams, all chosen by the embedder at compile time
//! (generic parameters, monomorphised: no `dyn`, no cost):
//!
//! - [`Hal`]: page-granular, zeroed, physically contiguous DMA memory, and mapping of device
//!   register windows (PCI BARs) as [`Mmio`] regions;
//! - [`Mmio`]: 32-bit register and doorbell access at an offset of a mapped BAR. The real
//!   implementation ([`MmioRegion`]) is a volatile access; a software model of a device can
//!   instead react inside the write, as an emulator does;
//! - PCI configuration space through [`pci_types::ConfigRegionAccess`] (re-exported here);
//! - [`Link`]: whole Ethernet frames in and out of a NIC, and [`Clock`], a monotonic time, for
//!   the software RoCEv2 device.
//!
//! Ready implementations: [`DmaRegion`] (a page allocator over memory the embedder hands over),
//! [`IdentityHal`] (DMA from a [`DmaRegion`], MMIO through a fixed physical-to-virtual offset),
//! and, with the `x86_64` feature, [`x86::PortIoConfig`][PortIoConfig] (configuration
//! mechanism #1 over ports 0xCF8/0xCFC), and with the `virtio-net` feature
//! [`virtio_net::VirtioNet`][VirtioNet] (a virtio-net NIC as a [`Link`], through the
//! `virtio-drivers` crate), and with the `igb` and `e1000e` features `igb::Igb` and
//! `e1000e::E1000e` (Intel NICs as [`Link`]s, sharing the module `intel`).
//!
//! Without those features the two items are not compiled; their links then lead to the
//! documentation built with every feature (as docs.rs builds it).
//!
#![cfg_attr(feature = "x86_64", doc = "[PortIoConfig]: x86::PortIoConfig")]
#![cfg_attr(
    not(feature = "x86_64"),
    doc = "[PortIoConfig]: https://docs.rs/bareverbs-hal/latest/bareverbs_hal/x86/struct.PortIoConfig.html"
)]
#![cfg_attr(feature = "virtio-net", doc = "[VirtioNet]: virtio_net::VirtioNet")]
#![cfg_attr(
    not(feature = "virtio-net"),
    doc = "[VirtioNet]: https://docs.rs/bareverbs-hal/latest/bareverbs_hal/virtio_net/struct.VirtioNet.html"
)]
#![no_std]
#![deny(
    unsafe_op_in_unsafe_fn,
    missing_docs,
    clippy::undocumented_unsafe_blocks
)]

pub mod clock;
#[cfg(feature = "e1000e")]
pub mod e1000e;
#[cfg(feature = "igb")]
pub mod igb;
#[cfg(any(feature = "igb", feature = "e1000e"))]
pub mod intel;
pub mod link;
mod region;
#[cfg(feature = "virtio-net")]
pub mod virtio_net;
#[cfg(feature = "x86_64")]
pub mod x86;

use core::ptr::NonNull;

pub use clock::Clock;
pub use link::{Link, LinkError, copy_if};
pub use pci_types::{ConfigRegionAccess, PciAddress};
pub use region::{DmaRegion, IdentityHal, MAX_REGION_PAGES, MmioRegion};

/// The size of a DMA page, in bytes. Every DMA allocation is a whole number of these.
pub const PAGE_SIZE: usize = 4096;

/// A block of DMA-coherent memory as a [`Hal`] hands it out.
///
/// A plain description, with no ownership semantics of its own: the driver wraps it in an RAII
/// owner that returns it with [`Hal::dma_dealloc`] when dropped.
#[derive(Debug, PartialEq, Eq)]
pub struct DmaBlock {
    /// Physical (bus) address of the first byte, page-aligned and never 0.
    pub paddr: u64,
    /// Where the CPU reaches the first byte, page-aligned.
    pub vaddr: NonNull<u8>,
    /// Length in pages.
    pub pages: usize,
}

/// Why a DMA allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaError {
    /// No run of free pages as long as the request is left.
    Exhausted {
        /// Pages asked for.
        requested: usize,
    },
    /// A request of zero pages.
    ZeroSize,
}

/// Memory and MMIO services the driver needs from its environment.
///
/// The trait is implemented by a cheap handle (a reference or a small `Copy` value): the driver
/// clones it into every object that owns DMA memory, so that the memory can be returned when
/// that object is dropped.
///
/// # Safety
///
/// Implementers promise:
/// - [`dma_alloc`](Hal::dma_alloc) returns blocks of exactly the requested number of pages,
///   physically contiguous, page-aligned, zero-filled, with a non-zero physical address that the
///   device can reach by DMA and a virtual address at which the CPU sees the same bytes
///   (DMA-coherent: on a platform whose device accesses do not snoop the CPU's caches, the
///   implementation maps these blocks uncached, as an operating system's coherent DMA
///   allocator does; the driver keeps its rings, command slot and shared region there and does
///   no cache maintenance on them). A block is never handed out twice before it is
///   deallocated.
/// - [`publish_barrier`](Hal::publish_barrier), [`consume_barrier`](Hal::consume_barrier),
///   [`dma_clean`](Hal::dma_clean) and [`dma_invalidate`](Hal::dma_invalidate) do what their
///   documentation says on this platform (see "Ordering and coherence" below).
/// - [`map_mmio`](Hal::map_mmio) returns a region through which accesses reach the device's
///   registers uncached, in program order with respect to each other.
/// - [`virt_to_phys`](Hal::virt_to_phys), when it answers, gives the address at which DMA
///   reaches the very byte the CPU sees at that address, for as long as the mapping lasts.
///
/// # Ordering and coherence
///
/// Two kinds of platform need more than x86-64 does, and the trait has a seam for each:
///
/// - **Weakly ordered** CPUs (aarch64, RISC-V, POWER) may make a store to normal memory visible
///   to a device after a later store to a device register. The driver calls
///   [`publish_barrier`](Hal::publish_barrier) between writing what a device will read (a
///   work request, a ring index, a command) and the register write that tells the device to
///   read it (a doorbell), and [`consume_barrier`](Hal::consume_barrier) between reading the
///   value by which a device announces data (an acknowledgement) and reading that data. The
///   defaults are right for x86-64; elsewhere they are full fences (`fence(SeqCst)`), which
///   order memory between CPUs but not necessarily against device accesses: an aarch64
///   embedder overrides them with `dmb oshst` and `dmb oshld` (Linux's `dma_wmb()` and
///   `dma_rmb()`), a RISC-V one with `fence w,o` and `fence r,r`.
/// - **Non-coherent** DMA (device accesses that do not snoop the CPU's caches): memory from
///   [`dma_alloc`](Hal::dma_alloc) is coherent by contract (mapped uncached there), so the
///   driver's own structures need nothing. Memory the embedder registers itself (zero-copy,
///   through [`virt_to_phys`](Hal::virt_to_phys)) is ordinary cacheable memory: the driver
///   [cleans and invalidates](Hal::dma_clean) it when it registers it, and from then on the
///   embedder keeps it coherent (maps it uncached) or calls [`dma_clean`](Hal::dma_clean)
///   before it posts a request whose bytes the device reads and
///   [`dma_invalidate`](Hal::dma_invalidate) before it reads bytes the device wrote (after
///   the completion), exactly as Linux's RDMA users call `ib_dma_sync_single_for_device` and
///   `ib_dma_sync_single_for_cpu`. The defaults do nothing: right where DMA is coherent
///   (x86-64 and most servers).
pub unsafe trait Hal: Clone {
    /// A mapped register window.
    type Mmio: Mmio;

    /// Allocates `pages` zeroed, physically contiguous pages.
    ///
    /// Failure is a value: an implementation never panics and never returns address 0.
    fn dma_alloc(&self, pages: usize) -> Result<DmaBlock, DmaError>;

    /// Returns a block to the allocator.
    ///
    /// # Safety
    ///
    /// Callers: `block` came from `dma_alloc` of this HAL (or a clone of it), is returned once,
    /// and neither the CPU nor the device will access it afterwards.
    unsafe fn dma_dealloc(&self, block: DmaBlock);

    /// Maps `size` bytes of device registers at physical address `paddr`.
    ///
    /// Returns `None` when the window cannot be mapped.
    ///
    /// # Safety
    ///
    /// Callers: `paddr..paddr + size` is a register window of a device (a memory BAR with
    /// decoding enabled) that no other code drives at the same time.
    unsafe fn map_mmio(&self, paddr: u64, size: usize) -> Option<Self::Mmio>;

    /// The physical (bus) address at which a device reaches the byte the CPU reaches at
    /// `vaddr`: how the driver registers memory the embedder owns (zero-copy buffers). `None`
    /// when the HAL cannot tell; the default knows nothing, and registration is then refused.
    ///
    /// Implementations answer for any address (a wrong answer would let the device reach
    /// memory the embedder did not register: part of the trait's safety contract).
    fn virt_to_phys(&self, vaddr: NonNull<u8>) -> Option<u64> {
        let _ = vaddr;
        None
    }

    /// The message a device writes to raise its interrupt `vector` (0-based, in the device's
    /// own numbering: for PVRDMA 0 = command completion, 1 = async event, 2 = CQ
    /// notification): where the embedder routes that vector to a CPU. On x86 the address is
    /// `0xFEE0_0000 | apic_id << 12` and the data the CPU vector (edge, fixed delivery).
    ///
    /// `None` (the default) when the embedder takes no interrupts: drivers then poll. The
    /// embedder's handler for the vector calls the driver's interrupt entry (for PVRDMA,
    /// `Pvrdma::interrupt`) with the same `vector`.
    fn msi_message(&self, vector: u16) -> Option<MsiMessage> {
        let _ = vector;
        None
    }

    /// 64 bits that a station on the network cannot predict: the driver expands them (with a
    /// generator of its own) into the values RoCE leaves unauthenticated, such as starting
    /// PSNs, the variable bits of memory keys and connection-manager identifiers. A device asks
    /// once, when it is opened.
    ///
    /// The default draws from the CPU: on x86-64 `RDRAND` when CPUID offers it, mixed with the
    /// time-stamp counter; elsewhere, and when `RDRAND` fails, the time-stamp counter alone or
    /// (no counter) a constant. That is unpredictable enough only where the platform has
    /// `RDRAND`: an embedder on any other platform overrides this with its own entropy source
    /// (a hardware RNG, a seed the boot loader passed). Tests override it with a fixed value so
    /// that runs replay.
    fn seed(&self) -> u64 {
        cpu_seed()
    }

    /// Makes every earlier store to DMA memory visible to devices before any later store to a
    /// device register: the barrier before a doorbell.
    ///
    /// The default is right for x86-64, where stores are not reordered with other stores and
    /// an uncached register store follows earlier stores: only the compiler must keep the
    /// order (Linux's `dma_wmb()` and `writel()` put no fence there either). Elsewhere it is
    /// a full fence, which a weakly ordered platform replaces with its device store barrier
    /// (aarch64: `dmb oshst`; RISC-V: `fence w,o`).
    #[inline(always)]
    fn publish_barrier(&self) {
        #[cfg(target_arch = "x86_64")]
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        #[cfg(not(target_arch = "x86_64"))]
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
    }

    /// Orders an earlier load of a value a device wrote (an acknowledgement, a producer
    /// index) before every later load: the barrier between reading that a device has written
    /// something and reading it.
    ///
    /// The default is right for x86-64, where loads are not reordered with other loads: a
    /// compiler barrier. Elsewhere it is a full fence, which a weakly ordered platform replaces
    /// with its device load barrier (aarch64: `dmb oshld`; RISC-V: `fence r,r`).
    #[inline(always)]
    fn consume_barrier(&self) {
        #[cfg(target_arch = "x86_64")]
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        #[cfg(not(target_arch = "x86_64"))]
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
    }

    /// Writes back the CPU's cached copies of `len` bytes from `vaddr` to memory, so that a
    /// device reading them by DMA sees what the CPU wrote ("clean"; Linux's
    /// `dma_sync_single_for_device` with `DMA_TO_DEVICE`).
    ///
    /// Called on memory that is not from [`dma_alloc`](Hal::dma_alloc) (the trait's
    /// "Ordering and coherence"). An implementation works on whole cache lines around the
    /// range and never discards a store. The default does nothing: right where DMA snoops the
    /// caches (x86-64).
    #[inline(always)]
    fn dma_clean(&self, vaddr: NonNull<u8>, len: usize) {
        let _ = (vaddr, len);
    }

    /// Discards the CPU's cached copies of `len` bytes from `vaddr`, so that the CPU's next
    /// reads see what a device wrote there by DMA ("invalidate"; Linux's
    /// `dma_sync_single_for_cpu` with `DMA_FROM_DEVICE`).
    ///
    /// An implementation cleans a cache line it shares with bytes outside the range before it
    /// invalidates it, so that no store outside the range is lost. The default does nothing:
    /// right where DMA snoops the caches (x86-64).
    #[inline(always)]
    fn dma_invalidate(&self, vaddr: NonNull<u8>, len: usize) {
        let _ = (vaddr, len);
    }
}

/// The default [`Hal::seed`]: `RDRAND` (when CPUID offers it) mixed with the time-stamp counter
/// on x86-64, a constant elsewhere.
pub fn cpu_seed() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__cpuid, _rdtsc};
        // SAFETY: CPUID and RDTSC exist on every x86-64 processor and only read processor state.
        let (leaf1, tsc) = unsafe { (__cpuid(1), _rdtsc()) };
        let mut mixed = tsc ^ 0x9E37_79B9_7F4A_7C15;
        if leaf1.ecx & (1 << 30) != 0 {
            // RDRAND can fail transiently; the specification suggests ten tries.
            for _ in 0..10 {
                let mut value = 0u64;
                // SAFETY: CPUID leaf 1 ECX bit 30 says the processor implements RDRAND.
                if unsafe { rdrand64(&mut value) } {
                    mixed ^= value;
                    break;
                }
            }
        }
        mixed
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0x9E37_79B9_7F4A_7C15
    }
}

/// One `RDRAND`: `true` and the value when the processor had one ready.
///
/// # Safety
///
/// The processor implements `RDRAND` (CPUID leaf 1, ECX bit 30).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "rdrand")]
unsafe fn rdrand64(value: &mut u64) -> bool {
    // Safe to call here: this function is compiled with the feature, which its caller checked.
    core::arch::x86_64::_rdrand64_step(value) == 1
}

/// An MSI/MSI-X message: the device raises an interrupt by writing `data` (32 bits) to
/// `address`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsiMessage {
    /// Message address (on x86: the local APIC's window, `0xFEE0_0000 | apic_id << 12`).
    pub address: u64,
    /// Message data (on x86: the vector, with delivery mode and trigger bits 0 = fixed, edge).
    pub data: u32,
}

/// 32-bit access to a mapped register window (a PCI memory BAR).
///
/// # Safety
///
/// Implementers promise that both methods are sound for *any* `offset`: an access with
/// `offset + 4 > size()` or an unaligned offset must be refused (a read then returns
/// `0xFFFF_FFFF`, as a master abort does, and a write does nothing) rather than reach memory
/// outside the window. Accesses are performed in program order and are not merged or elided.
pub unsafe trait Mmio {
    /// The window's length in bytes.
    fn size(&self) -> usize;
    /// Reads the 32-bit register at byte `offset`.
    fn read32(&self, offset: usize) -> u32;
    /// Writes the 32-bit register at byte `offset`. A device may act synchronously inside it.
    fn write32(&self, offset: usize, value: u32);
}
