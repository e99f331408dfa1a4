//! From bareverbs' [`Hal`](crate::Hal) (a value) to virtio-drivers' `Hal` (associated functions,
//! no `self`): the HAL lives in a static the embedder fills once, and a marker type names it.

use core::marker::PhantomData;
use core::ptr::NonNull;

use virtio_drivers::{BufferDirection, PhysAddr};

use crate::{DmaBlock, DmaRegion, Hal, IdentityHal};

/// A bareverbs [`Hal`] reachable without a value: what virtio-drivers needs, since its `Hal`
/// trait has associated functions only. Implemented by a marker type that reads a static.
///
/// # Safety
///
/// Implementers promise:
/// - once [`hal`](StaticHal::hal) has returned `Some`, it returns the same HAL (or one sharing
///   its allocator) on every later call, so a block is returned to the allocator it came from;
/// - the HAL's [`virt_to_phys`](Hal::virt_to_phys) answers, correctly, for every byte of DMA
///   memory it hands out (virtio-drivers shares buffers by their CPU address);
/// - [`mmio_virt`](StaticHal::mmio_virt), when it answers, gives an address at which the CPU
///   reaches `paddr..paddr + size` uncached, used by nothing else that drives the device.
pub unsafe trait StaticHal: 'static {
    /// The HAL behind the marker.
    type Hal: Hal + 'static;

    /// The HAL, or `None` before the embedder installed it.
    fn hal() -> Option<&'static Self::Hal>;

    /// Where the CPU reaches the device registers at physical `paddr` (`size` bytes), or `None`
    /// when they are not mapped.
    fn mmio_virt(paddr: u64, size: usize) -> Option<NonNull<u8>>;
}

/// virtio-drivers' `Hal`, implemented over the bareverbs HAL that `S` names.
///
/// DMA pages come from that HAL's allocator; buffers are shared by their physical address as
/// the HAL's `virt_to_phys` tells it (the memory is DMA-coherent: no bounce copy, `unshare`
/// does nothing). Two calls cannot fail politely, because virtio-drivers' signatures leave no
/// room for it, and panic instead: mapping a BAR that [`StaticHal::mmio_virt`] does not map,
/// and sharing a buffer the HAL cannot translate. [`VirtioNet`](super::VirtioNet) only shares
/// its own DMA buffers, and checks that the HAL is installed before anything maps a BAR.
pub struct Bridge<S>(PhantomData<S>);

// SAFETY: DMA blocks come from the bareverbs HAL, whose own contract gives zeroed, page-aligned,
// physically contiguous memory handed out once; `dma_dealloc` returns the very triple
// `dma_alloc` handed out to the same allocator (`StaticHal`'s first promise). MMIO addresses and
// physical addresses of shared buffers come from `StaticHal`, which vouches for them.
unsafe impl<S: StaticHal> virtio_drivers::Hal for Bridge<S> {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        match S::hal().map(|h| h.dma_alloc(pages)) {
            Some(Ok(block)) => (block.paddr, block.vaddr),
            // Physical address 0 is virtio-drivers' failure value (`Error::DmaError`).
            _ => (0, NonNull::dangling()),
        }
    }

    unsafe fn dma_dealloc(paddr: PhysAddr, vaddr: NonNull<u8>, pages: usize) -> i32 {
        if let Some(hal) = S::hal() {
            // SAFETY: virtio-drivers passes back, once, a triple `dma_alloc` returned (its
            // `Dma` owner's contract), which came from this HAL's allocator.
            unsafe {
                hal.dma_dealloc(DmaBlock {
                    paddr,
                    vaddr,
                    pages,
                })
            }
        }
        // Non-zero would make virtio-drivers' `Dma::drop` panic: never.
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, size: usize) -> NonNull<u8> {
        S::mmio_virt(paddr, size).expect("virtio: a BAR outside the mapped MMIO window")
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        S::hal()
            .and_then(|h| h.virt_to_phys(buffer.cast()))
            .expect("virtio: a buffer the HAL cannot translate to a physical address")
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}

/// The installed identity HAL and its MMIO offset.
static IDENTITY: spin::Once<(IdentityHal<'static>, usize)> = spin::Once::new();
/// The region it allocates from (a static of its own, so the HAL can borrow it for `'static`).
static IDENTITY_REGION: spin::Once<DmaRegion> = spin::Once::new();

/// The ready [`StaticHal`] for [`IdentityHal`] (what the example unikernel uses): a global the
/// embedder fills once with [`install`](GlobalIdentity::install).
pub struct GlobalIdentity;

impl GlobalIdentity {
    /// Makes the [`DmaRegion`] over `pages` pages at physical `paddr` (CPU address `vaddr`),
    /// keeps it for good, and returns the [`IdentityHal`] over it (MMIO at
    /// `paddr + phys_offset`), which the embedder may use for other drivers too. `None` when a
    /// HAL was installed before (this call then changes nothing).
    ///
    /// # Safety
    ///
    /// As [`DmaRegion::new`] for the memory (handed over for the rest of the program), and as
    /// [`IdentityHal::new`]: every physical MMIO address a driver will map is mapped, uncached,
    /// at `paddr + phys_offset` for the rest of the program.
    pub unsafe fn install(
        paddr: u64,
        vaddr: NonNull<u8>,
        pages: usize,
        phys_offset: usize,
    ) -> Option<IdentityHal<'static>> {
        let mut fresh = false;
        let region = IDENTITY_REGION.call_once(|| {
            fresh = true;
            // SAFETY: our caller's promise; the region lives in a static from now on.
            unsafe { DmaRegion::new(paddr, vaddr, pages) }
        });
        if !fresh {
            return None;
        }
        let (hal, _) = IDENTITY.call_once(|| {
            // SAFETY: our caller's promise, for a region that lives for good.
            (
                unsafe { IdentityHal::new(region, phys_offset) },
                phys_offset,
            )
        });
        Some(*hal)
    }

    /// The installed HAL, if any.
    pub fn get() -> Option<IdentityHal<'static>> {
        IDENTITY.get().map(|(h, _)| *h)
    }
}

// SAFETY: the statics are written once; the HAL allocates from one region for the rest of the
// program; `IdentityHal::virt_to_phys` answers for its whole region; MMIO is at paddr + offset
// per `install`'s contract.
unsafe impl StaticHal for GlobalIdentity {
    type Hal = IdentityHal<'static>;

    fn hal() -> Option<&'static IdentityHal<'static>> {
        IDENTITY.get().map(|(h, _)| h)
    }

    fn mmio_virt(paddr: u64, _size: usize) -> Option<NonNull<u8>> {
        let (_, offset) = IDENTITY.get()?;
        let vaddr = usize::try_from(paddr).ok()?.checked_add(*offset)?;
        NonNull::new(vaddr as *mut u8)
    }
}
