//! The methods that make the futures of a completion queue and of a completion channel. The
//! future types (`wait.rs`) name the objects they wait on; the objects' own files
//! (`cq.rs`, `channel.rs`) do not name the futures, so the imports run one way: this file
//! uses both.

use super::{CompletionChannel, CompletionQueue, CqEventFuture, NextCompletion, Provider, Ready};

impl<'c, P: Provider> CompletionQueue<'c, P> {
    /// A future that resolves when a poll would find a completion (it arms the CQ while it
    /// waits; its waker is woken from the CQ-notification interrupt).
    pub fn ready(&self) -> Ready<'_, 'c, P> {
        Ready::new(self)
    }

    /// A future of the CQ's next completion, as [`poll`](Self::poll) of one entry gives it.
    pub fn next_completion(&self) -> NextCompletion<'_, 'c, P> {
        NextCompletion::new(self)
    }
}

impl<'c, P: Provider> CompletionChannel<'c, P> {
    /// A future of the next event (`ibv_get_cq_event` on a blocking channel), woken from the
    /// CQ-notification interrupt.
    pub fn cq_event(&self) -> CqEventFuture<'_, 'c, P> {
        CqEventFuture::new(self)
    }
}
