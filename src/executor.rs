//! The smallest executor for the crate's futures: poll, and between polls spin (or run the
//! caller's idle step). No heap, no thread, no waker machinery.

use core::future::Future;
use core::pin::pin;
use core::task::{Context as TaskContext, Poll, Waker};

/// Runs `fut` to completion on this core, polling it again and again with a waker that does
/// nothing, with a spin-loop hint between polls.
///
/// The crate's futures ([`CompletionQueue::ready`](crate::CompletionQueue::ready),
/// [`CompletionQueue::next_completion`](crate::CompletionQueue::next_completion),
/// [`CompletionChannel::cq_event`](crate::verbs::CompletionChannel::cq_event),
/// [`Context::async_event`](crate::Context::async_event)) look at the device each time they
/// are polled (a channel's and the async events' futures also process the device's events when
/// the driver polls, and each runs its device's [`progress`](crate::Context::progress)), so
/// spinning finds what they wait for. A future that is not the crate's (or that waits on
/// another device than the one whose peers must be served) leaves the device unprogressed:
/// [`Context::block_on`](crate::Context::block_on) runs the device between polls. It also
/// spins forever if nothing
/// ever comes: bound the wait in the future itself, or use [`block_on_with`] and give up from
/// its idle step. An embedder that takes interrupts halts the CPU between polls instead (the
/// example kernel's `wait::block_on` does, with a waker its interrupt handler wakes).
///
/// # Example
///
/// ```
/// # include!("doctests.rs");
/// # fn main() -> bareverbs::Result<()> {
/// use bareverbs::verbs::*;
/// let (machine, ctx) = pvrdma()?;
/// let gid = ctx.bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64)?;
/// let pool = pd.buffer_pool(4, 64)?;
/// let (mut a, mut b) = rc_pair(&pd, &cq, &pool, gid.gid())?;
/// b.post_recv(1, pool.alloc().expect("a free buffer"))?;
/// a.post_send(2, pool.alloc().expect("a free buffer"))?;
/// // The CQ's next completion, whichever QP it is of.
/// let wc = bareverbs::block_on(cq.next_completion())?;
/// assert_eq!(wc.status, WcStatus::Success);
/// # Ok(()) }
/// ```
pub fn block_on<F: Future>(fut: F) -> F::Output {
    block_on_with(fut, core::hint::spin_loop)
}

/// As [`block_on`], running `idle` between polls: a step that lets the awaited thing happen
/// (advance a test clock, move frames on a test link), or that waits for it (halt until the
/// next interrupt), or that gives up (panic, or end the program, after a bound).
///
/// # Example
///
/// ```
/// # include!("doctests.rs");
/// # fn main() -> bareverbs::Result<()> {
/// use std::cell::Cell;
/// use std::task::Poll;
/// // A future that is ready at its fourth poll; the idle step counts the polls in between.
/// let idles = Cell::new(0);
/// let fut = std::future::poll_fn(|_| match idles.get() {
///     3 => Poll::Ready("ready"),
///     _ => Poll::Pending,
/// });
/// assert_eq!(bareverbs::block_on_with(fut, || idles.set(idles.get() + 1)), "ready");
/// # Ok(()) }
/// ```
///
/// Two software RoCE devices on a test segment need their step between polls
/// ([`Rxe::new`](crate::device::rxe::Rxe::new) has the whole example).
pub fn block_on_with<F: Future>(fut: F, mut idle: impl FnMut()) -> F::Output {
    let mut fut = pin!(fut);
    let mut cx = TaskContext::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        idle();
    }
}
