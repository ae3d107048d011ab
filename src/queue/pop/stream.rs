//! A pop carried out from the client's reply stream: sent like any other
//! command, so that a client's pipelined pops do not wait for one another;
//! the rare further calls follow from the replies.

use std::sync::Arc;

use bytes::Bytes;

use super::{Pop, Progress};
use crate::output::{ReplyTransform, Transformed};
use crate::queue::leases::registry::Registry;
use crate::queue::library::call::{Call, Reload};
use crate::queue::library::script;
use crate::queue::library::value::Value;

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
    taking: Option<Taking>,
}

/// The first call went as one of the take scripts (see
/// `Pop::take_request`).
struct Taking {
    take: super::Take,
    /// The call with the script's text, sent at most once: when Redis lost
    /// the script.
    reloaded: bool,
}

impl PopCalls {
    /// `pop`, whose first call `call` (in `progress`) goes out now.
    pub fn boxed(
        pop: Pop,
        progress: Progress,
        call: Call,
        registry: Arc<Registry>,
    ) -> Box<PopCalls> {
        Box::new(PopCalls {
            pop,
            progress,
            call,
            reload: Reload::default(),
            registry,
            taking: None,
        })
    }

    /// The first call goes as the take script instead, `call` after it if
    /// the script leaves the pop to it.
    pub fn taking(mut self: Box<Self>, take: super::Take) -> Box<PopCalls> {
        self.taking = Some(Taking {
            take,
            reloaded: false,
        });
        self
    }

    /// The take script's reply: `Err` with what to do next when it is not
    /// the pop's result (the library's call next, the script again with
    /// its text, or the client's error); else the result, if this was the
    /// script's reply.
    fn taken(&mut self, reply: &Bytes) -> Result<Option<Value>, Transformed> {
        let Some(t) = self.taking.take() else {
            return Ok(None);
        };
        if script::is_noscript(reply) && !t.reloaded {
            let eval = t.take.request.eval();
            self.taking = Some(Taking {
                take: t.take,
                reloaded: true,
            });
            return Err(Transformed::Continue(eval));
        }
        match t.take.reply(reply) {
            Ok(None) => Err(Transformed::Continue(self.call.request())),
            Ok(Some(v)) => {
                self.pop.note_held(&t.take.q, &v);
                Ok(Some(v))
            }
            Err(e) => Err(Transformed::Done(e.to_reply())),
        }
    }
}

impl ReplyTransform for PopCalls {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        if let Some(retry) = self.reload.retry(&reply, &self.call, self.registry.db) {
            return retry;
        }
        let nothing = match self.taken(&reply) {
            Ok(nothing) => nothing,
            Err(next) => return next,
        };
        let taken = match nothing {
            Some(v) => self.pop.absorb(&mut self.progress, &v),
            None => self
                .call
                .decode(reply.clone())
                .and_then(|v| self.pop.absorb(&mut self.progress, &v)),
        };
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
