//! One bound for code that shares a device's objects between cores.

use super::Provider;

/// A [`Provider`] whose verbs objects can be shared between cores: the device and each of its
/// object types are `Send + Sync`, so that a [`Context`](super::Context), its completion
/// queues, buffer pools and memory regions can be shared by reference and a
/// [`QueuePair`](super::QueuePair) moved to the core that posts on it.
///
/// It is a bound alias: every provider that meets the bounds implements it (both of this
/// crate's do, over a HAL, link and clock that are `Send + Sync`), and code generic over the
/// provider writes `P: SharedProvider` instead of `P: Provider + Send + Sync` and a where-bound
/// for each of `P::Pd`, `P::Cq`, `P::Qp`, `P::Srq`, `P::Mr`, `P::Mem` and `P::Ah`.
///
/// # Example
///
/// One core posts, another polls, generic over the device:
///
/// ```
/// # include!("../doctests.rs");
/// use bareverbs::verbs::*;
///
/// fn two_cores<P: SharedProvider>(ctx: &Context<P>, gid: Gid) -> bareverbs::Result<()> {
///     let pd = ctx.alloc_pd()?;
///     let cq = ctx.create_cq(64)?;
///     let pool = pd.buffer_pool(8, 256)?;
///     let (mut a, mut b) = rc_pair(&pd, &cq, &pool, gid)?;
///     let (pool, cq) = (&pool, &cq);
///     let polled = std::thread::scope(|s| {
///         let poster = s.spawn(move || -> bareverbs::Result<_> {
///             b.post_recv(1, pool.alloc().expect("a free buffer"))?;
///             a.post_send(2, pool.alloc().expect("a free buffer"))?;
///             Ok((a, b)) // handed back, alive until their completions are taken
///         });
///         let poller = s.spawn(move || {
///             let mut wc = [WorkCompletion::default(); 4];
///             let mut n = 0;
///             while n < 2 {
///                 n += cq.poll(&mut wc[n..]).unwrap();
///             }
///             n
///         });
///         let qps = poster.join().unwrap().unwrap();
///         let n = poller.join().unwrap();
///         drop(qps);
///         n
///     });
///     assert_eq!(polled, 2);
///     Ok(())
/// }
///
/// # fn main() -> bareverbs::Result<()> {
/// let (machine, ctx) = pvrdma()?;
/// let gid = ctx.bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))?;
/// two_cores(&ctx, gid.gid())?;
/// # drop(gid); drop(ctx); assert_eq!(machine.outstanding_pages(), 0);
/// # Ok(()) }
/// ```
pub trait SharedProvider:
    Provider<
        Pd: Send + Sync,
        Cq: Send + Sync,
        Qp: Send + Sync,
        Srq: Send + Sync,
        Mr: Send + Sync,
        Mem: Send + Sync,
        Ah: Send + Sync,
    > + Send
    + Sync
{
}

impl<P> SharedProvider for P where
    P: Provider<
            Pd: Send + Sync,
            Cq: Send + Sync,
            Qp: Send + Sync,
            Srq: Send + Sync,
            Mr: Send + Sync,
            Mem: Send + Sync,
            Ah: Send + Sync,
        > + Send
        + Sync
{
}
