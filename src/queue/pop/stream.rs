//! A pop carried out from the client's reply stream: sent like any other
//! command, so that a client's pipelined pops do not wait for one another;
//! the rare further calls follow from the replies.

use std::sync::Arc;

use bytes::Bytes;

use super::{Pop, Progress};
use crate::output::{ReplyTransform, Transformed};
use crate::queue::leases::registry::Registry;
use crate::queue::library::call::{Call, Reload};

/// A pop carried out from the client's reply stream: each reply is taken
/// in, and the next bounded call, if any, sent (see [`Pop::run`], the same
/// steps awaited).
pub struct PopCalls {
    pop: Pop,
    progress: Progress,
    /// The call in flight.
    call: Call,
    reload: Reload,
    registry: Arc<Registry>,
}

impl PopCalls {
    /// `pop`, whose first call `call` (in `progress`) goes out now.
    pub fn boxed(
        pop: Pop,
        progress: Progress,
        call: Call,
        registry: Arc<Registry>,
    ) -> Box<dyn ReplyTransform> {
        Box::new(PopCalls {
            pop,
            progress,
            call,
            reload: Reload::default(),
            registry,
        })
    }
}

impl ReplyTransform for PopCalls {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        if let Some(retry) = self.reload.retry(&reply, &self.call, self.registry.db) {
            return retry;
        }
        let taken = self
            .call
            .decode(reply.clone())
            .and_then(|v| self.pop.absorb(&mut self.progress, &v));
        if let Err(e) = taken {
            return Transformed::Done(e.to_reply());
        }
        if let Some(call) = self.pop.next_call(&mut self.progress) {
            let request = call.request_in(self.registry.db);
            self.call = call;
            self.reload = Reload::default();
            return Transformed::Continue(request);
        }
        let done = self
            .pop
            .finish(std::mem::take(&mut self.progress), Some(&reply));
        self.registry.record(&done);
        Transformed::Done(done.reply.unwrap_or_else(|| self.pop.multi_empty_reply()))
    }
}
