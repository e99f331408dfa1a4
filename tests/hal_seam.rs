//! The HAL's ordering and coherence seam: the driver calls `Hal::publish_barrier` before every
//! register write that tells the device to read memory (a doorbell, a command, the shared
//! region's address), `Hal::consume_barrier` between a command's acknowledgement and its
//! payload, and cleans and invalidates memory the embedder registers zero-copy.
mod common;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use bareverbs::Context;
use bareverbs::device::pvrdma::Pvrdma;
use bareverbs::error::{Error, Feature, Unsupported};
use bareverbs::hal::{DmaBlock, DmaError, Hal, Mmio};
use bareverbs::verbs::*;
use bareverbs_model::{Model, ModelMmio};
use common::{CONFIG, model, rc_to_rts};

/// What the checking HAL saw.
#[derive(Debug, Default)]
struct Seen {
    /// Barriers since the last register write that tells the device to read memory.
    pending: u32,
    publish: u32,
    consume: u32,
    /// Such register writes (BAR1 DSR_LOW and REQUEST, every BAR2 doorbell) without a barrier
    /// since the one before: (BAR, offset).
    unordered: Vec<(u8, usize)>,
    told: u32,
    cleaned: Vec<(usize, usize)>,
    invalidated: Vec<(usize, usize)>,
}

/// The model's HAL, watching its ordering and coherence calls.
#[derive(Clone)]
struct Checked(Model, Arc<Mutex<Seen>>);

/// A BAR of the model, watched: `bar` 1 or 2 (0: not watched).
struct CheckedMmio(ModelMmio, u8, Arc<Mutex<Seen>>);

// SAFETY: forwards to the model's own window.
unsafe impl Mmio for CheckedMmio {
    fn size(&self) -> usize {
        self.0.size()
    }
    fn read32(&self, offset: usize) -> u32 {
        self.0.read32(offset)
    }
    fn write32(&self, offset: usize, value: u32) {
        // BAR1: DSR_LOW (0x04) and REQUEST (0x10); BAR2: every doorbell.
        if (self.1 == 1 && (offset == 0x04 || offset == 0x10)) || self.1 == 2 {
            let mut s = self.2.lock().unwrap();
            s.told += 1;
            if s.pending == 0 {
                s.unordered.push((self.1, offset));
            }
            s.pending = 0;
        }
        self.0.write32(offset, value)
    }
}

// SAFETY: every call is the model's own; the seam's methods only record.
unsafe impl Hal for Checked {
    type Mmio = CheckedMmio;
    fn dma_alloc(&self, pages: usize) -> Result<DmaBlock, DmaError> {
        self.0.dma_alloc(pages)
    }
    unsafe fn dma_dealloc(&self, block: DmaBlock) {
        // SAFETY: forwarded.
        unsafe { self.0.dma_dealloc(block) }
    }
    unsafe fn map_mmio(&self, paddr: u64, size: usize) -> Option<CheckedMmio> {
        let (bar1, bar2) = self.0.bar_addresses();
        let bar = [(bar1, 1), (bar2, 2)]
            .into_iter()
            .find_map(|(a, b)| (a == paddr).then_some(b))
            .unwrap_or(0);
        // SAFETY: forwarded.
        let m = unsafe { self.0.map_mmio(paddr, size) }?;
        Some(CheckedMmio(m, bar, self.1.clone()))
    }
    fn virt_to_phys(&self, vaddr: NonNull<u8>) -> Option<u64> {
        self.0.virt_to_phys(vaddr)
    }
    fn publish_barrier(&self) {
        let mut s = self.1.lock().unwrap();
        s.publish += 1;
        s.pending += 1;
    }
    fn consume_barrier(&self) {
        self.1.lock().unwrap().consume += 1;
    }
    fn dma_clean(&self, vaddr: NonNull<u8>, len: usize) {
        let mut s = self.1.lock().unwrap();
        s.cleaned.push((vaddr.as_ptr() as usize, len));
    }
    fn dma_invalidate(&self, vaddr: NonNull<u8>, len: usize) {
        let mut s = self.1.lock().unwrap();
        s.invalidated.push((vaddr.as_ptr() as usize, len));
    }
}

type P = Pvrdma<Checked>;

fn up(model: &Model) -> (Context<P>, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let hal = Checked(model.clone(), seen.clone());
    let ctx = Context::new(Pvrdma::probe(hal, model, CONFIG).expect("bring-up"));
    (ctx, seen)
}

fn rts<'a>(qp: QueuePair<'a, P, Rc, Reset>, peer: u32, g: Gid) -> QueuePair<'a, P, Rc, Rts> {
    let av = AddressVector::new(g, 0);
    rc_to_rts(
        qp,
        &ConnectedInit::default(),
        &ConnectedRtr::new(peer, 0, av),
        &ConnectedRts::new(0),
    )
}

#[test]
fn every_doorbell_and_command_follows_a_publish_barrier() {
    let model = model();
    let (ctx, seen) = up(&model);
    assert_eq!(seen.lock().unwrap().told, 1, "the shared region's address");
    let g = ctx
        .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let pool = pd.buffer_pool(8, 64).unwrap();
    let build = || pd.qp_builder(&cq, &cq).pool(&pool).build::<Rc>().unwrap();
    let (a, b) = (build(), build());
    let (qa, qb) = (a.qp_num(), b.qp_num());
    let (mut a, mut b) = (rts(a, qb, g.gid()), rts(b, qa, g.gid()));
    let (told, consume) = {
        let s = seen.lock().unwrap();
        (s.told, s.consume)
    };
    // Commands: a GID, a PD, a CQ, two QPs and three transitions each.
    assert!(told > 10, "commands seen: {told}");
    assert!(consume >= told, "each command's payload read after its ack");
    // A receive, a send, an SRQ-less raw batch and a CQ arm: each rings a doorbell.
    b.post_recv(1, pool.alloc().unwrap()).unwrap();
    a.post_send(2, pool.alloc().unwrap()).unwrap();
    cq.req_notify(false).unwrap();
    drop(b.poll_one().unwrap().expect("receive"));
    drop(a.poll_one().unwrap().expect("send"));
    let s = seen.lock().unwrap();
    assert!(s.told >= told + 3, "doorbells rung: {s:?}");
    assert!(s.unordered.is_empty(), "unordered: {:?}", s.unordered);
    assert!(s.publish >= s.told);
}

#[test]
fn zero_copy_registration_cleans_and_invalidates_the_region_and_the_model_translates_only_its_own()
{
    let model = model();
    let (ctx, seen) = up(&model);
    let pd = ctx.alloc_pd().unwrap();
    let mut mem = model.alloc_user_memory(10_000);
    mem.as_mut_slice()[..5].copy_from_slice(b"hello");
    let (ptr, len) = (mem.as_ptr(), mem.len());
    // SAFETY: the memory outlives the region (dropped after it) and the CPU leaves it alone.
    let mr = unsafe { pd.register_user(ptr, len, AccessFlags::LOCAL_WRITE) }.unwrap();
    assert_eq!(mr.addr(), ptr.as_ptr() as u64);
    assert_eq!(&mr.as_slice()[..5], b"hello");
    {
        let s = seen.lock().unwrap();
        let span = (ptr.as_ptr() as usize, len);
        assert_eq!(s.cleaned, [span]);
        assert_eq!(s.invalidated, [span]);
    }
    // Memory the model did not hand out: it cannot translate it, and says so.
    let mut own = vec![0u8; 4096];
    let own_ptr = NonNull::new(own.as_mut_ptr()).unwrap();
    // SAFETY: `own` outlives the attempt, which fails.
    let e = unsafe { pd.register_user(own_ptr, own.len(), AccessFlags::LOCAL_WRITE) }.err();
    assert_eq!(
        e,
        Some(Error::Unsupported(Unsupported::Feature(
            Feature::UserMemory
        )))
    );
    drop(mr);
    drop(mem);
    drop(pd);
    drop(ctx);
    assert_eq!(model.outstanding_pages(), 0);
    common::assert_clean(&model);
}
