//! The embedder's memory registered and taking RDMA in place, and the size of every object
//! (the context at most 512 bytes, every object small whatever its depth), on the device
//! model.
//!
//! Every test runs in `lab`, which ends with every DMA page back and no violation of what QEMU
//! would mishandle.

mod common;

use core::ptr::NonNull;

use bareverbs::device::pvrdma::Pvrdma;
use bareverbs::error::Feature;
use bareverbs::hal::Hal;
use bareverbs::verbs::*;
use bareverbs_model::Model;
use common::*;

type P = Pvrdma<Model>;

const SIG: SendFlags = SendFlags::SIGNALED;

// ---------------------------------------------------------------------------------------------
// The embedder's memory

#[test]
fn user_memory_registers_and_takes_rdma_in_place() {
    lab(|model, _, pd, cq, gid| {
        let (mut a, mut b) = rc_pair(pd, cq, gid, None, None);
        let block = Hal::dma_alloc(model, 2).unwrap();
        let base = block.vaddr;
        let mrs = model.objects().mrs;
        // SAFETY: the block stays allocated until the regions are gone (dealloc comes last),
        // and the CPU reads its bytes only after the completions that wrote them.
        let user = unsafe { pd.register_user(base, 8192, RW) }.unwrap();
        assert_eq!(
            user.addr(),
            base.as_ptr() as u64,
            "SGEs use the CPU's addresses"
        );
        assert_eq!(user.len(), 8192);
        assert_eq!(model.objects().mrs, mrs + 1);
        // An RDMA WRITE from a driver region lands in the embedder's bytes, across the page
        // boundary.
        let src = with_mr(pd, &(0..200u8).collect::<Vec<_>>());
        // SAFETY: the regions outlive the completions polled right after.
        unsafe {
            let mut sb = a.send_batch();
            sb.rdma_write(
                1,
                SIG,
                (user.addr() + 4000, user.rkey()),
                &[src.sge(0, 200).unwrap()],
            )
            .unwrap();
            sb.finish();
        }
        let wcs = drain(cq);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
        // SAFETY: the block's 8192 bytes, written by the device before the completion.
        let bytes = unsafe { core::slice::from_raw_parts(base.as_ptr(), 8192) };
        assert_eq!(&bytes[4000..4200], &(0..200u8).collect::<Vec<_>>()[..]);
        assert!(bytes[..4000].iter().all(|&x| x == 0) && bytes[4200..].iter().all(|&x| x == 0));
        assert_eq!(
            model.read_phys(block.paddr + 4000, 200).unwrap(),
            (0..200u8).collect::<Vec<_>>(),
            "at the physical address the HAL gave"
        );
        assert_eq!(&user.as_slice()[4000..4200], &bytes[4000..4200]);
        // A region at an unaligned address inside the block: receives and sends by lkey.
        // SAFETY: as above.
        let part =
            unsafe { pd.register_user(NonNull::new(base.as_ptr().add(100)).unwrap(), 300, RW) }
                .unwrap();
        assert_eq!(part.addr(), base.as_ptr() as u64 + 100);
        // SAFETY: as above.
        unsafe {
            b.post_recv_raw(2, &[part.sge(50, 64).unwrap()]).unwrap();
            let mut sb = a.send_batch();
            sb.send(3, SIG, &[src.sge(10, 20).unwrap()]).unwrap();
            sb.finish();
        }
        let wcs = drain(cq);
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
        assert_eq!(&bytes[150..170], &(10..30u8).collect::<Vec<_>>()[..]);
        // SAFETY: as above.
        unsafe {
            let rbuf = pd.register(4096, RW).unwrap();
            a.post_recv_raw(4, &[rbuf.sge(0, 64).unwrap()]).unwrap();
            let mut sb = b.send_batch();
            sb.send(5, SIG, &[part.sge(50, 20).unwrap()]).unwrap();
            sb.finish();
            assert_eq!(drain(cq).len(), 2);
            assert_eq!(&rbuf.as_slice()[..20], &(10..30u8).collect::<Vec<_>>()[..]);
        }
        drop(part);
        drop(user);
        assert_eq!(model.objects().mrs, mrs + 1, "only `src` is left");
        // Memory the HAL cannot translate is refused, and leaves nothing behind.
        let pages = model.outstanding_pages();
        let mut heap = vec![0u8; 4096];
        // SAFETY: refused (never registered).
        let e = unsafe { pd.register_user(NonNull::new(heap.as_mut_ptr()).unwrap(), 4096, RW) };
        assert_eq!(e.err(), Some(unsupported(Feature::UserMemory)));
        let leaked: &'static mut [u8] = Box::leak(vec![0u8; 64].into_boxed_slice());
        let e = pd.register_static(leaked, RW);
        assert_eq!(e.err(), Some(unsupported(Feature::UserMemory)));
        // Memory partly outside the block: refused too.
        // SAFETY: refused.
        let e = unsafe { pd.register_user(base, 3 * 4096, RW) };
        assert_eq!(e.err(), Some(unsupported(Feature::UserMemory)));
        assert_eq!(model.objects().mrs, mrs + 1);
        assert_eq!(model.outstanding_pages(), pages);
        drop((a, b));
        drop(src);
        // SAFETY: allocated above from the model; every region over it is gone.
        unsafe { Hal::dma_dealloc(model, block) };
    });
}

// ---------------------------------------------------------------------------------------------
// Object sizes

#[test]
fn the_context_is_at_most_512_bytes() {
    use core::mem::size_of;
    let parts = [
        ("Context", size_of::<Ctx>()),
        ("Pvrdma", size_of::<P>()),
        ("DeviceCaps", size_of::<DeviceCaps>()),
        ("Model (the HAL handle)", size_of::<Model>()),
        ("ModelMmio", size_of::<bareverbs_model::ModelMmio>()),
    ];
    assert!(size_of::<Ctx>() <= 512, "{parts:?}");
}

#[test]
fn every_object_is_small_whatever_its_depth() {
    use core::mem::size_of;
    let sizes = [
        (
            "QueuePair<Rc, Rts>",
            size_of::<QueuePair<'static, P, Rc, Rts>>(),
        ),
        (
            "QueuePair<Ud, Reset>",
            size_of::<QueuePair<'static, P, Ud, Reset>>(),
        ),
        ("CompletionQueue", size_of::<CompletionQueue<'static, P>>()),
        (
            "SharedReceiveQueue",
            size_of::<SharedReceiveQueue<'static, P>>(),
        ),
        ("MemoryRegion", size_of::<MemoryRegion<'static, P>>()),
        ("BufferPool", size_of::<BufferPool<'static, P>>()),
        ("Buf", size_of::<Buf<'static, P>>()),
        (
            "ProtectionDomain",
            size_of::<ProtectionDomain<'static, P>>(),
        ),
        ("AddressHandle", size_of::<AddressHandle<'static, P>>()),
        ("Completion", size_of::<Completion<'static, P>>()),
        ("PollCursor", size_of::<PollCursor<'static, P>>()),
    ];
    for (name, size) in sizes {
        eprintln!("{name}: {size} bytes");
        assert!(size <= 512, "{name} is {size} bytes");
    }
    assert_eq!(size_of::<Buf<'static, P>>(), 16);
    assert!(
        size_of::<Ctx>() <= 1024,
        "see the_context_is_at_most_512_bytes"
    );
    assert_eq!(size_of::<WorkCompletion>(), 32);
    // The objects themselves, shallow and deep: the same size (their queues live in DMA
    // memory).
    lab(|_, ctx, pd, _, _| {
        let cq1 = ctx.create_cq(2).unwrap();
        let cq2 = ctx.create_cq(2048).unwrap();
        assert_eq!(size_of_val(&cq1), size_of_val(&cq2));
        let shallow = pd
            .qp_builder(&cq1, &cq1)
            .caps(caps(0, 0, 1))
            .build::<Rc>()
            .unwrap();
        let deep = pd
            .qp_builder(&cq2, &cq2)
            .caps(caps(1024, 1024, 4))
            .build::<Rc>()
            .unwrap();
        assert_eq!(deep.caps().max_send_wr, 1024);
        assert_eq!(size_of_val(&shallow), size_of_val(&deep));
        assert!(size_of_val(&deep) <= 512);
        let p1 = pd.buffer_pool(1, 64).unwrap();
        let p2 = pd.buffer_pool(4096, 256).unwrap();
        assert_eq!(size_of_val(&p1), size_of_val(&p2));
        let s1 = pd
            .create_srq(SrqAttr {
                max_wr: 1,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let s2 = pd
            .create_srq(SrqAttr {
                max_wr: 2048,
                max_sge: 4,
                srq_limit: 0,
            })
            .unwrap();
        assert_eq!(size_of_val(&s1), size_of_val(&s2));
        drop((shallow, deep));
        drop((p1, p2, s1, s2));
        drop((cq1, cq2));
    });
}
