//! The CM's events as a future, without an executor crate: [`Cm::next_event`] resolves to the
//! next [`CmEvent`]. It registers its task's waker for the CM's completion queue (so a message
//! arriving on QP1 wakes it, from the device's interrupt entry or
//! [`Context::process_events`](crate::verbs::Context::process_events)) and arms the queue,
//! then looks once more before it answers `Pending`, so a message that races with the
//! registration is never lost.
//!
//! Timers do not wake it: an embedder that waits on the future also arranges to poll it again
//! by [`Cm::next_deadline`] (its timer interrupt, its executor's sleep), or resends and
//! timeouts wait for the next message.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context as TaskContext, Poll};

use bareverbs_hal::Clock;

use super::{Cm, CmError, CmEvent};
use crate::error::{Error, Object, Resource};
use crate::events::CQ_SLOTS;
use crate::verbs::Provider;

/// [`Cm::next_event`]: resolves to the CM's next event.
pub struct NextEvent<'m, 'a, P: Provider, C: Clock, const N: usize> {
    cm: &'m mut Cm<'a, P, C, N>,
}

impl<'a, P: Provider, C: Clock, const N: usize> Cm<'a, P, C, N> {
    /// The next event, as a future (see the module's documentation for what wakes it).
    pub fn next_event(&mut self) -> NextEvent<'_, 'a, P, C, N> {
        NextEvent { cm: self }
    }

    /// When the earliest timer fires (µs on the CM's clock): poll by then for resends,
    /// timeouts and the end of TIME_WAIT. `None` when no timer runs.
    pub fn next_deadline(&self) -> Option<u64> {
        self.conns.iter().filter_map(|c| c.timer.deadline).min()
    }
}

impl<'a, P: Provider, C: Clock, const N: usize> Future for NextEvent<'_, 'a, P, C, N> {
    type Output = Result<CmEvent<'a, P>, CmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let cm = &mut *self.get_mut().cm;
        if let Some(e) = cm.poll() {
            return Poll::Ready(Ok(e));
        }
        let (p, raw) = (cm.ctx.provider(), cm.cq.raw());
        let Some(slot) = p.cq_slot(raw) else {
            return Poll::Ready(Err(CmError::Verbs(Error::Resource(Resource::Objects {
                object: Object::CqEventSlot,
                limit: CQ_SLOTS as u32,
            }))));
        };
        p.events().cq_waker(slot).register(cx.waker());
        if let Err(e) = p.req_notify_cq(raw, false) {
            return Poll::Ready(Err(e.into()));
        }
        // A message that came before the arm raises no event: look again.
        match cm.poll() {
            Some(e) => Poll::Ready(Ok(e)),
            None => Poll::Pending,
        }
    }
}
