//! Futures: waiting for a completion, a channel's event or an async event without spinning and
//! without an executor crate. Each registers its task's waker in the event hub's fixed place
//! for what it waits on, arms what needs arming, and looks once more before it answers
//! `Pending`, so a wake-up that races with the registration is never lost. The wakers are
//! woken from the provider's interrupt entry (or from
//! [`Context::process_events`](super::Context::process_events) when the driver polls).
//!
//! Each poll of a future first runs its device's [`Provider::progress`]: on the software RoCE
//! device, a side that only awaits one of these futures still serves its peers' READs and
//! WRITEs, each time its executor polls.
//!
//! One task waits on a given CQ, channel or the async events at a time: a second one
//! registering replaces the first's waker.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context as TaskContext, Poll};

use super::{
    AsyncEvent, CompletionChannel, CompletionQueue, Context, CqId, Provider, WorkCompletion,
};
use crate::error::{Error, Object, Resource, Result};
use crate::events::CQ_SLOTS;

fn no_slot() -> Error {
    Error::Resource(Resource::Objects {
        object: Object::CqEventSlot,
        limit: CQ_SLOTS as u32,
    })
}

/// [`CompletionQueue::ready`]: resolves when a poll of the CQ would find a completion.
pub struct Ready<'q, 'c, P: Provider> {
    cq: &'q CompletionQueue<'c, P>,
}

impl<'q, 'c, P: Provider> Ready<'q, 'c, P> {
    pub(super) fn new(cq: &'q CompletionQueue<'c, P>) -> Self {
        Ready { cq }
    }
}

impl<P: Provider> Future for Ready<'_, '_, P> {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<()>> {
        let (p, raw) = (self.cq.ctx.provider(), self.cq.raw());
        p.progress();
        if p.cq_ready(raw) {
            return Poll::Ready(Ok(()));
        }
        let Some(slot) = p.cq_slot(raw) else {
            return Poll::Ready(Err(no_slot()));
        };
        p.events().cq_waker(slot).register(cx.waker());
        if let Err(e) = p.req_notify_cq(raw, false) {
            return Poll::Ready(Err(e));
        }
        // A completion that came before the arm raises no event: look again.
        if p.cq_ready(raw) {
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }
}

/// How many times one poll of [`NextCompletion`] looks again after the CQ read ready but its
/// poll found nothing, before it yields.
const READY_TRIES: u32 = 4;

/// [`CompletionQueue::next_completion`]: resolves to the CQ's next completion.
pub struct NextCompletion<'q, 'c, P: Provider> {
    cq: &'q CompletionQueue<'c, P>,
}

impl<'q, 'c, P: Provider> NextCompletion<'q, 'c, P> {
    pub(super) fn new(cq: &'q CompletionQueue<'c, P>) -> Self {
        NextCompletion { cq }
    }
}

impl<P: Provider> Future for NextCompletion<'_, '_, P> {
    type Output = Result<WorkCompletion>;

    /// Bounded: a CQ that reads ready while its poll finds nothing (a provider's readiness
    /// test disagreeing with its poll, or a device racing both) gets `READY_TRIES` (4) more looks;
    /// then the future asks to be polled again later (its waker woken) instead of spinning.
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<WorkCompletion>> {
        let mut wc = [WorkCompletion::default()];
        for _ in 0..=READY_TRIES {
            match self.cq.poll(&mut wc) {
                Ok(1) => return Poll::Ready(Ok(wc[0])),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            match Pin::new(&mut Ready::new(self.cq)).poll(cx) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// [`CompletionChannel::cq_event`]: resolves to the CQ of the channel's next event.
pub struct CqEventFuture<'h, 'c, P: Provider> {
    channel: &'h CompletionChannel<'c, P>,
}

impl<'h, 'c, P: Provider> CqEventFuture<'h, 'c, P> {
    pub(super) fn new(channel: &'h CompletionChannel<'c, P>) -> Self {
        CqEventFuture { channel }
    }
}

impl<P: Provider> Future for CqEventFuture<'_, '_, P> {
    type Output = CqId;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<CqId> {
        if let Some(id) = self.channel.get_cq_event() {
            return Poll::Ready(id);
        }
        let hub = self.channel.context().provider().events();
        hub.channel_waker(self.channel.id()).register(cx.waker());
        match self.channel.get_cq_event() {
            Some(id) => Poll::Ready(id),
            None => Poll::Pending,
        }
    }
}

/// [`Context::async_event`]: resolves to the device's next async event.
pub struct AsyncEventFuture<'c, P: Provider> {
    ctx: &'c Context<P>,
}

impl<'c, P: Provider> AsyncEventFuture<'c, P> {
    pub(super) fn new(ctx: &'c Context<P>) -> Self {
        AsyncEventFuture { ctx }
    }
}

impl<P: Provider> Future for AsyncEventFuture<'_, P> {
    type Output = AsyncEvent;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<AsyncEvent> {
        self.ctx.progress();
        if let Some(e) = self.ctx.get_async_event() {
            return Poll::Ready(e);
        }
        self.ctx
            .provider()
            .events()
            .async_waker()
            .register(cx.waker());
        match self.ctx.get_async_event() {
            Some(e) => Poll::Ready(e),
            None => Poll::Pending,
        }
    }
}
