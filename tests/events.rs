//! Interrupts and events on the device model: MSI-X set up from the HAL, the interrupt entry
//! run synchronously as a CPU would take the message (inside the driver's own register and
//! doorbell writes), CQ arming (next / solicited), completion channels with the
//! acknowledge-before-destroy rule, typed async events, futures woken from interrupts, a wake
//! racing the waker's registration, and a hostile device's interrupt storm.

mod common;

use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskCx, Poll, RawWaker, RawWakerVTable, Waker};

use bareverbs::device::pvrdma::{Config, Pvrdma};
use bareverbs::error::{Feature, Object, Resource, Unsupported};
use bareverbs::events::CQ_SLOTS;
use bareverbs::hal::{ConfigRegionAccess, DmaBlock, DmaError, Hal, Mmio, PciAddress};
use bareverbs::verbs::*;
use bareverbs::{Error, ErrorKind};
use bareverbs_model::{MSI_FIRST_VECTOR, Model, ModelMmio};
use common::*;

const IMR: usize = 0x1C;

fn irq_config() -> Config {
    Config {
        interrupts: true,
        ..CONFIG
    }
}

/// The model's CPU wired to a context: every MSI-X message runs `ctx.interrupt(vector)` at
/// once, as an embedder's handler does. Unwired when dropped.
struct Wired<'a> {
    model: &'a Model,
    ctx: Arc<AtomicUsize>,
    vectors: Arc<Mutex<Vec<u32>>>,
    _ctx: std::marker::PhantomData<&'a Ctx>,
}

fn wire<'a>(model: &'a Model, ctx: &'a Ctx) -> Wired<'a> {
    let ptr = Arc::new(AtomicUsize::new(ctx as *const Ctx as usize));
    let vectors = Arc::new(Mutex::new(Vec::new()));
    let (p, v) = (ptr.clone(), vectors.clone());
    model.set_msi_handler(Some(Arc::new(move |address, data| {
        assert_eq!(address, 0xFEE0_0000);
        v.lock().unwrap().push(data);
        let c = p.load(Ordering::Acquire);
        if c != 0 {
            // SAFETY: the context outlives the wiring (the guard borrows it) and the pointer
            // is cleared before the guard goes.
            let ctx = unsafe { &*(c as *const Ctx) };
            ctx.interrupt((data - MSI_FIRST_VECTOR) as u16);
        }
    })));
    Wired {
        model,
        ctx: ptr,
        vectors,
        _ctx: std::marker::PhantomData,
    }
}

impl Wired<'_> {
    /// CPU vectors taken since the last call.
    fn taken(&self) -> Vec<u32> {
        std::mem::take(&mut *self.vectors.lock().unwrap())
    }
}

impl Drop for Wired<'_> {
    fn drop(&mut self) {
        self.ctx.store(0, Ordering::Release);
        self.model.set_msi_handler(None);
    }
}

fn up_irq(model: &Model) -> Ctx {
    Context::new(Pvrdma::probe(model.clone(), model, irq_config()).expect("bring-up"))
}

/// A waker that counts its wakes and can run something when it is cloned (that is, while a
/// waker slot stores it).
#[derive(Default)]
struct Probe {
    wakes: AtomicUsize,
    on_clone: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

fn probe_waker(p: &Arc<Probe>) -> Waker {
    fn raw(p: Arc<Probe>) -> RawWaker {
        RawWaker::new(Arc::into_raw(p).cast(), &VTABLE)
    }
    unsafe fn clone(d: *const ()) -> RawWaker {
        // SAFETY: `d` came from Arc::into_raw of a Probe, still owned by the waker cloned.
        let p = unsafe { Arc::from_raw(d.cast::<Probe>()) };
        let c = p.clone();
        std::mem::forget(p);
        let f = c.on_clone.lock().unwrap().take();
        if let Some(f) = f {
            f();
        }
        raw(c)
    }
    unsafe fn wake(d: *const ()) {
        // SAFETY: as in `clone`; this consumes the waker's reference.
        let p = unsafe { Arc::from_raw(d.cast::<Probe>()) };
        p.wakes.fetch_add(1, Ordering::SeqCst);
    }
    unsafe fn wake_by_ref(d: *const ()) {
        // SAFETY: as in `clone`; the reference stays with the waker.
        let p = unsafe { &*d.cast::<Probe>() };
        p.wakes.fetch_add(1, Ordering::SeqCst);
    }
    unsafe fn drop_waker(d: *const ()) {
        // SAFETY: as in `clone`; this releases the waker's reference.
        drop(unsafe { Arc::from_raw(d.cast::<Probe>()) });
    }
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake_by_ref, drop_waker);
    // SAFETY: the vtable's functions keep the Arc's count right.
    unsafe { Waker::from_raw(raw(p.clone())) }
}

fn cfg(model: &Model, off: u16) -> u32 {
    // SAFETY: the model's configuration space; reads have no side effect.
    unsafe { model.read(PciAddress::new(0, 0, 0x10, 1), off) }
}

fn bar(model: &Model, i: u16, len: usize) -> ModelMmio {
    let pa = u64::from(cfg(model, 0x10 + 4 * i) & !0xF);
    // SAFETY: the model's own BAR.
    unsafe { model.map_mmio(pa, len).expect("BAR") }
}

#[test]
fn msix_is_set_up_from_the_hal_and_every_vector_reaches_the_entry() {
    let model = model();
    let ctx = up_irq(&model);
    assert!(ctx.provider().interrupts_enabled());
    assert_eq!(
        cfg(&model, 0x40) >> 30,
        0b10,
        "MSI-X enabled, function unmasked"
    );
    let table = bar(&model, 0, 0x4000);
    for v in 0..3 {
        assert_eq!(table.read32(v * 16), 0xFEE0_0000);
        assert_eq!(table.read32(v * 16 + 8), 0x30 + v as u32);
        assert_eq!(table.read32(v * 16 + 12), 0, "unmasked");
    }
    assert_eq!(bar(&model, 1, 0x100).read32(IMR), 0, "device mask open");
    {
        let w = wire(&model, &ctx);
        // Vector 0 after every command, taken inside the REQUEST write (under the driver's
        // command lock: the entry must not need it).
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(8).unwrap();
        assert_eq!(w.taken(), vec![0x30, 0x30]);
        assert_eq!(ctx.irq_counts().command, 2);
        // Vector 1 from the async ring.
        assert!(model.post_async(9, 1));
        assert_eq!(w.taken(), vec![0x31]);
        assert_eq!(ctx.irq_counts().async_events, 1);
        assert_eq!(ctx.get_async_event(), Some(AsyncEvent::PortActive(1)));
        assert_eq!(ctx.get_async_event(), None);
        // Vector 2 from an armed CQ.
        cq.req_notify(false).unwrap();
        model.inject_cqe(cq.id().0, 0x77, 1);
        assert_eq!(w.taken(), vec![0x32]);
        let c = ctx.irq_counts();
        assert_eq!((c.cq, c.cq_events, c.notifications), (1, 1, 1));
        // An unknown vector is counted, not trusted.
        ctx.interrupt(7);
        assert_eq!(ctx.irq_counts().unknown, 1);
        drop(cq);
        drop(pd);
    }
    drop(ctx);
    for v in 0..3 {
        assert_eq!(table.read32(v * 16 + 12), 1, "masked at teardown");
    }
    assert_eq!(model.outstanding_pages(), 0);
}

#[test]
fn polling_is_the_default_and_a_hal_without_messages_refuses_interrupts() {
    let model = model();
    let ctx = up(&model);
    assert!(!ctx.provider().interrupts_enabled());
    assert_eq!(bar(&model, 1, 0x100).read32(IMR), !0, "every vector masked");
    assert_eq!(cfg(&model, 0x40) >> 31, 0, "MSI-X left off");
    let _pd = ctx.alloc_pd().unwrap();
    assert!(model.take_msi().is_empty());
    drop(_pd);
    drop(ctx);

    /// The model's HAL without interrupt routing.
    #[derive(Clone)]
    struct NoMsi(Model);
    // SAFETY: every call is the model's own.
    unsafe impl Hal for NoMsi {
        type Mmio = ModelMmio;
        fn dma_alloc(&self, pages: usize) -> Result<DmaBlock, DmaError> {
            self.0.dma_alloc(pages)
        }
        unsafe fn dma_dealloc(&self, block: DmaBlock) {
            // SAFETY: forwarded.
            unsafe { self.0.dma_dealloc(block) }
        }
        unsafe fn map_mmio(&self, paddr: u64, size: usize) -> Option<ModelMmio> {
            // SAFETY: forwarded.
            unsafe { self.0.map_mmio(paddr, size) }
        }
    }
    let e = Pvrdma::probe(NoMsi(model.clone()), &model, irq_config()).err();
    assert_eq!(
        e,
        Some(Error::Unsupported(Unsupported::Feature(
            Feature::Interrupts
        )))
    );
    assert_eq!(model.outstanding_pages(), 0, "nothing kept");
    assert_eq!(bar(&model, 1, 0x100).read32(IMR), !0);
}

/// An RC pair `$a`, `$b` on one CQ `$cq` with a pool `$pool`, in RTS, bound in the caller's
/// scope.
macro_rules! pair {
    ($ctx:expr, $cq:expr => $a:ident, $b:ident, $pool:ident) => {
        let g = $ctx
            .bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))
            .unwrap();
        let pd = $ctx.alloc_pd().unwrap();
        let $pool = pd.buffer_pool(8, 64).unwrap();
        let rc = || pd.qp_builder($cq, $cq).pool(&$pool).build::<Rc>().unwrap();
        let (a, b) = (rc(), rc());
        let (qa, qb) = (a.qp_num(), b.qp_num());
        let empty = AccessFlags::empty();
        let (mut $a, mut $b) = (rc_up(a, qb, g.gid(), empty), rc_up(b, qa, g.gid(), empty));
    };
}

/// One message a → b; both completions taken.
fn exchange<'a>(
    a: &mut QueuePair<'a, P, Rc, Rts>,
    b: &mut QueuePair<'a, P, Rc, Rts>,
    pool: &'a BufferPool<'a, P>,
) {
    b.post_recv(1, pool.alloc().unwrap()).unwrap();
    a.post_send(2, pool.alloc().unwrap()).unwrap();
    drop(b.poll_one().unwrap().expect("receive"));
    drop(a.poll_one().unwrap().expect("send"));
}

#[test]
fn a_channel_gets_one_event_per_arm_and_the_cq_waits_for_its_acknowledgement() {
    let model = model();
    let ctx = up_irq(&model);
    let w = wire(&model, &ctx);
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq_with_channel(64, &ch).unwrap();
    let other = ctx.create_cq(8).unwrap();
    {
        pair!(ctx, &cq => a, b, pool);
        exchange(&mut a, &mut b, &pool);
        assert_eq!(ch.get_cq_event(), None, "not armed: no event");
        cq.req_notify(false).unwrap();
        exchange(&mut a, &mut b, &pool);
        assert_eq!(ch.get_cq_event(), Some(cq.id()), "armed: one event");
        assert_eq!(ch.get_cq_event(), None, "one, for two completions");
        exchange(&mut a, &mut b, &pool);
        assert_eq!(ch.get_cq_event(), None, "the event used the arm up");
        // Solicited: QEMU's PVRDMA cannot tell, and the event comes at the next completion.
        cq.req_notify(true).unwrap();
        exchange(&mut a, &mut b, &pool);
        assert_eq!(ch.get_cq_event(), Some(cq.id()));
    }
    assert_ne!(cq.id(), other.id());
    assert!(w.taken().contains(&0x32));
    // Two events taken, none acknowledged: the CQ cannot go.
    let cq = match cq.destroy() {
        Err((cq, e)) => {
            assert_eq!(e.kind(), ErrorKind::Busy);
            cq
        }
        Ok(()) => panic!("destroyed with unacknowledged events"),
    };
    cq.ack_events(1);
    let cq = cq.destroy().expect_err("one left").0;
    cq.ack_events(1);
    cq.destroy().expect("all acknowledged");
    drop(other);
    drop(ch);
    drop(w);
    teardown(&model, ctx);
}

#[test]
fn events_work_without_interrupts_when_the_channel_is_read() {
    let model = model();
    let ctx = up(&model);
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq_with_channel(64, &ch).unwrap();
    {
        pair!(ctx, &cq => a, b, pool);
        cq.req_notify(false).unwrap();
        exchange(&mut a, &mut b, &pool);
        assert_eq!(ch.get_cq_event(), Some(cq.id()));
        cq.ack_events(1);
    }
    assert_eq!(ctx.irq_counts().cq, 0, "no interrupt taken");
    drop(cq);
    drop(ch);
    teardown(&model, ctx);
}

#[test]
fn channels_and_event_slots_are_bounded_with_typed_errors() {
    let model = model();
    let ctx = up(&model);
    let chans: Vec<_> = (0..bareverbs::events::CHANNELS)
        .map(|_| ctx.create_comp_channel().unwrap())
        .collect();
    let e = ctx.create_comp_channel().err().unwrap();
    assert!(matches!(
        e,
        Error::Resource(Resource::Objects {
            object: Object::CompletionChannel,
            ..
        })
    ));
    let cqs: Vec<_> = (0..CQ_SLOTS)
        .map(|_| ctx.create_cq_with_channel(1, &chans[0]).unwrap())
        .collect();
    let e = ctx.create_cq_with_channel(1, &chans[1]).err().unwrap();
    assert!(matches!(
        e,
        Error::Resource(Resource::Objects {
            object: Object::CqEventSlot,
            ..
        })
    ));
    // A CQ without a channel is still created, but cannot be armed.
    let plain = ctx.create_cq(1).unwrap();
    assert!(matches!(
        plain.req_notify(false),
        Err(Error::Resource(Resource::Objects {
            object: Object::CqEventSlot,
            ..
        }))
    ));
    drop(plain);
    drop(cqs);
    // Slots come back with their CQs; a channel closed is open again.
    let again = ctx.create_cq_with_channel(1, &chans[1]).unwrap();
    drop(again);
    drop(chans);
    let _c = ctx.create_comp_channel().unwrap();
    drop(_c);
    teardown(&model, ctx);
}

#[test]
fn every_async_event_type_is_typed_and_wakes_its_future() {
    let model = model();
    let ctx = up_irq(&model);
    let w = wire(&model, &ctx);
    let probe = Arc::new(Probe::default());
    let waker = probe_waker(&probe);
    let mut cx = TaskCx::from_waker(&waker);
    let expected = [
        AsyncEvent::CqError(CqId(5)),
        AsyncEvent::QpFatal(6),
        AsyncEvent::QpRequestError(7),
        AsyncEvent::QpAccessError(8),
        AsyncEvent::CommunicationEstablished(9),
        AsyncEvent::SqDrained(10),
        AsyncEvent::PathMigrated(11),
        AsyncEvent::PathMigrationError(12),
        AsyncEvent::DeviceFatal,
        AsyncEvent::PortActive(1),
        AsyncEvent::PortError(1),
        AsyncEvent::LidChange(1),
        AsyncEvent::PkeyChange(1),
        AsyncEvent::SmChange(1),
        AsyncEvent::SrqError(3),
        AsyncEvent::SrqLimitReached(3),
        AsyncEvent::QpLastWqeReached(4),
        AsyncEvent::ClientReregister(1),
        AsyncEvent::GidChange(1),
    ];
    let info = [5, 6, 7, 8, 9, 10, 11, 12, 0, 1, 1, 1, 1, 1, 3, 3, 4, 1, 1];
    for (kind, (want, info)) in expected.iter().zip(info).enumerate() {
        let before = probe.wakes.load(Ordering::SeqCst);
        let mut fut = pin!(ctx.async_event());
        assert!(fut.as_mut().poll(&mut cx).is_pending(), "nothing yet");
        assert!(model.post_async(kind as u32, info));
        assert_eq!(probe.wakes.load(Ordering::SeqCst), before + 1, "woken");
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(*want));
    }
    assert!(model.post_async(99, 0xABCD));
    assert_eq!(
        ctx.get_async_event(),
        Some(AsyncEvent::Unknown {
            kind: 99,
            info: 0xABCD
        })
    );
    assert_eq!(ctx.irq_counts().async_events, 20);
    assert_eq!(w.taken().len(), 20);
    drop(w);
    teardown(&model, ctx);
}

#[test]
fn futures_wait_for_a_completion_and_are_woken_by_the_cq_interrupt() {
    let model = model();
    let ctx = up_irq(&model);
    let w = wire(&model, &ctx);
    let cq = ctx.create_cq(64).unwrap();
    let probe = Arc::new(Probe::default());
    let waker = probe_waker(&probe);
    let mut cx = TaskCx::from_waker(&waker);
    {
        pair!(ctx, &cq => a, b, pool);
        b.post_recv(1, pool.alloc().unwrap()).unwrap();
        {
            let mut ready = pin!(cq.ready());
            assert!(ready.as_mut().poll(&mut cx).is_pending());
            assert_eq!(probe.wakes.load(Ordering::SeqCst), 0);
            // The send completes inside the doorbell write; its CQE interrupts at once.
            a.post_send(2, pool.alloc().unwrap()).unwrap();
            assert_eq!(probe.wakes.load(Ordering::SeqCst), 1, "woken by vector 2");
            assert_eq!(ready.as_mut().poll(&mut cx), Poll::Ready(Ok(())));
        }
        drop(b.poll_one().unwrap().expect("receive"));
        drop(a.poll_one().unwrap().expect("send"));
        // next_completion: a raw receive completes through the future.
        {
            let mut next = pin!(cq.next_completion());
            assert!(next.as_mut().poll(&mut cx).is_pending());
            b.post_recv(3, pool.alloc().unwrap()).unwrap();
            a.post_send(4, pool.alloc().unwrap()).unwrap();
            assert_eq!(probe.wakes.load(Ordering::SeqCst), 2);
            match next.as_mut().poll(&mut cx) {
                Poll::Ready(Ok(wc)) => assert_eq!(wc.status, WcStatus::Success),
                other => panic!("{other:?}"),
            }
        }
        let mut wc = [WorkCompletion::default(); 2];
        assert_eq!(cq.poll(&mut wc).unwrap(), 1, "the other completion");
    }
    assert!(w.taken().contains(&0x32));
    drop(cq);
    drop(w);
    teardown(&model, ctx);
}

#[test]
fn a_wake_while_the_waker_is_being_stored_is_not_lost() {
    let model = model();
    let ctx = up_irq(&model);
    let w = wire(&model, &ctx);
    let cq = ctx.create_cq(64).unwrap();
    let first = Arc::new(Probe::default());
    let second = Arc::new(Probe::default());
    let (w1, w2) = (probe_waker(&first), probe_waker(&second));
    let mut ready = pin!(cq.ready());
    // Waiting: the CQ armed, the first waker stored.
    assert!(
        ready
            .as_mut()
            .poll(&mut TaskCx::from_waker(&w1))
            .is_pending()
    );
    // Polled again by another task: while its waker is being stored (cloned into the slot),
    // a CQE arrives and its interrupt runs.
    let (m, h) = (model.clone(), cq.id().0);
    *second.on_clone.lock().unwrap() = Some(Box::new(move || m.inject_cqe(h, 0x99, 7)));
    let r = ready.as_mut().poll(&mut TaskCx::from_waker(&w2));
    let woken = second.wakes.load(Ordering::SeqCst);
    assert!(
        r.is_ready() || woken == 1,
        "the wake that raced the registration was lost"
    );
    assert_eq!(
        woken, 1,
        "the interrupt found the slot being stored: the storer woke"
    );
    assert_eq!(
        first.wakes.load(Ordering::SeqCst),
        0,
        "the replaced waker is not woken"
    );
    assert_eq!(ctx.irq_counts().cq_events, 1);
    drop(w);
    // The injected CQE names no QP of this driver: no completion comes of it.
    let mut wc = [WorkCompletion::default()];
    assert!(!matches!(cq.poll(&mut wc), Ok(1)));
    drop(cq);
    drop(ctx);
    assert_eq!(model.outstanding_pages(), 0);
}

#[test]
fn a_hostile_storm_costs_bounded_work_per_interrupt_and_events_still_flow() {
    let model = model();
    let ctx = up_irq(&model);
    let w = wire(&model, &ctx);
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq_with_channel(64, &ch).unwrap();
    let mut seed = 0x1234_5678u32;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    let mut max_per_irq = 0;
    for i in 0..3000 {
        let before = ctx.irq_counts();
        let handles: Vec<u32> = (0..rnd() % 1500).map(|_| rnd()).collect();
        // Every tenth: a producer index that cannot be right.
        let prod = (i % 10 == 0).then(&mut rnd);
        model.notify_storm(&handles, prod);
        let after = ctx.irq_counts();
        assert_eq!(after.cq, before.cq + 1);
        max_per_irq = max_per_irq.max(after.notifications - before.notifications);
    }
    assert!(
        max_per_irq <= 2 * 1024,
        "{max_per_irq} entries in one interrupt"
    );
    assert!(ctx.irq_counts().stray > 0);
    assert_eq!(
        ch.get_cq_event(),
        None,
        "garbage raised no event: the CQ was not armed"
    );
    // The device behaves again (a valid producer index): the driver takes up from there, and
    // an armed CQ gets its event.
    model.notify_storm(&[1, 2, 3], None);
    cq.req_notify(false).unwrap();
    model.inject_cqe(cq.id().0, 0x99, 1);
    assert_eq!(ch.get_cq_event(), Some(cq.id()));
    cq.ack_events(1);
    drop(w);
    drop(cq);
    drop(ch);
    drop(ctx);
    assert_eq!(model.outstanding_pages(), 0);
}

#[test]
fn with_msix_on_qemu_a_poll_never_rings_the_poll_doorbell() {
    // Polling: an empty poll asks the device to harvest (one POLL doorbell).
    let polling = model();
    let ctx = up(&polling);
    let cq = ctx.create_cq(16).unwrap();
    let mut wc = [WorkCompletion::default(); 1];
    let bells = polling.counters().0;
    assert_eq!(cq.poll(&mut wc).unwrap(), 0);
    assert_eq!(polling.counters().0, bells + 1, "an empty poll rings POLL");
    drop(cq);
    teardown(&polling, ctx);

    // MSI-X on QEMU: POLL racing QEMU's completion thread deadlocks it; polls only read the
    // ring, and completions still arrive (the model, as QEMU's thread, posts them itself).
    let model = model();
    let ctx = up_irq(&model);
    let w = wire(&model, &ctx);
    let cq = ctx.create_cq(16).unwrap();
    let bells = model.counters().0;
    assert_eq!(cq.poll(&mut wc).unwrap(), 0);
    assert_eq!(model.counters().0, bells, "no doorbell for an empty poll");
    {
        pair!(ctx, &cq => a, b, pool);
        let bells = model.counters().0;
        assert!(b.poll_one().unwrap().is_none());
        assert!(a.poll_one().unwrap().is_none());
        assert_eq!(
            model.counters().0,
            bells,
            "no doorbell for an empty QP poll"
        );
        for _ in 0..4 {
            cq.req_notify(false).unwrap();
            exchange(&mut a, &mut b, &pool);
        }
    }
    assert!(w.taken().contains(&0x32));
    drop(cq);
    drop(w);
    teardown(&model, ctx);
}
