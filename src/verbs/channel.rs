//! Completion channels (`ibv_comp_channel`): where the events of the CQs created on one are
//! read (`ibv_get_cq_event`), then acknowledged on the CQ (`ibv_ack_cq_events`).

use super::{Context, Provider};
use crate::error::{Error, Object, Resource, Result};
use crate::events::{CHANNELS, ChannelId, CqId};

/// A completion channel. CQs created on it ([`Context::create_cq_with_channel`]) borrow it,
/// so it outlives them; dropping it closes it.
///
/// # Example
///
/// Waiting for a completion without polling the CQ in a loop: arm the CQ, await the channel's
/// event (a future, here run by [`block_on`](crate::block_on); on a machine woken from the
/// CQ-notification interrupt), acknowledge it, then poll.
///
/// ```
/// # include!("../doctests.rs");
/// # fn main() -> bareverbs::Result<()> {
/// use bareverbs::verbs::*;
/// let (_machine, ctx) = pvrdma()?;
/// let gid = ctx.bind_gid(0, Gid::link_local_from_mac([2, 0, 0, 0, 0, 1]))?;
/// let pd = ctx.alloc_pd()?;
/// let channel = ctx.create_comp_channel()?;
/// let cq = ctx.create_cq_with_channel(64, &channel)?;
/// let pool = pd.buffer_pool(4, 64)?;
/// let (mut a, mut b) = rc_pair(&pd, &cq, &pool, gid.gid())?;
///
/// cq.req_notify(false)?; // one event, at the next completion
/// b.post_recv(1, pool.alloc().expect("a free buffer"))?;
/// a.post_send(2, pool.alloc().expect("a free buffer"))?;
/// let id = bareverbs::block_on(channel.cq_event());
/// assert_eq!(id, cq.id());
/// cq.ack_events(1); // before the CQ may be destroyed
/// let mut wc = [WorkCompletion::default(); 2];
/// let mut n = 0;
/// while n < 2 {
///     n += cq.poll(&mut wc[n..])?;
/// }
/// # Ok(()) }
/// ```
pub struct CompletionChannel<'c, P: Provider> {
    ctx: &'c Context<P>,
    id: ChannelId,
}

impl<'c, P: Provider> CompletionChannel<'c, P> {
    pub(super) fn open(ctx: &'c Context<P>) -> Result<Self> {
        let id = ctx
            .provider()
            .events()
            .open_channel()
            .ok_or(Error::Resource(Resource::Objects {
                object: Object::CompletionChannel,
                limit: CHANNELS as u32,
            }))?;
        Ok(CompletionChannel { ctx, id })
    }

    pub(super) fn id(&self) -> ChannelId {
        self.id
    }

    /// The context it belongs to.
    pub fn context(&self) -> &'c Context<P> {
        self.ctx
    }

    /// Takes the next event of one of its CQs (`ibv_get_cq_event` on a non-blocking channel):
    /// the CQ's identity (compare with [`CompletionQueue::id`](super::CompletionQueue::id)),
    /// or `None` when there is none now. The device's pending notifications are taken first,
    /// so a channel works without interrupts too, and its [`progress`](Context::progress)
    /// runs (a peer's READs and WRITEs on the software RoCE device are served). Each event returned must be acknowledged
    /// ([`CompletionQueue::ack_events`](super::CompletionQueue::ack_events)) before its CQ
    /// can be destroyed.
    pub fn get_cq_event(&self) -> Option<CqId> {
        let p = self.ctx.provider();
        p.progress();
        p.process_events();
        p.events().take_event(self.id)
    }
}

impl<P: Provider> Drop for CompletionChannel<'_, P> {
    fn drop(&mut self) {
        self.ctx.provider().events().close_channel(self.id);
    }
}
