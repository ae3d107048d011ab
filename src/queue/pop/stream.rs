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
use crate::queue::rules::Queue;

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
    /// The take script's reply is in: its queue, for `Pop::note_held`.
    taken_from: Option<Arc<Queue>>,
}

/// The first call went as `lua/scripts/take.lua` (see `Pop::take_request`).
struct Taking {
    /// The call, to go again with the script's text if Redis lost it.
    eval: Option<script::Request>,
    q: Arc<Queue>,
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
            taken_from: None,
        })
    }

    /// The first call goes as the take script instead (`eval`: its request
    /// with the text), `call` after it if the script leaves the pop to it.
    pub fn taking(mut self: Box<Self>, eval: script::Request, q: Arc<Queue>) -> Box<PopCalls> {
        self.taking = Some(Taking {
            eval: Some(eval),
            q,
        });
        self
    }

    /// The take script's reply: `Err` with what to do next when it is not
    /// the pop's result (pop1 next, or the script again with its text);
    /// else the result, with its delivery counted.
    fn taken(&mut self, reply: &Bytes) -> Result<Option<Value>, Transformed> {
        let Some(t) = self.taking.as_mut() else {
            return Ok(None);
        };
        match &reply[..] {
            b":0\r\n" => {
                self.taking = None;
                Err(Transformed::Continue(self.call.request()))
            }
            r if script::is_noscript(r) && t.eval.is_some() => Err(Transformed::Continue(
                t.eval.take().map(|r| r.eval()).unwrap_or_default(),
            )),
            b"$-1\r\n" | b"_\r\n" => {
                self.taking = None;
                Ok(Some(Value::Nil))
            }
            r => {
                super::count_made(&t.q, r);
                self.taken_from = Some(t.q.clone());
                self.taking = None;
                Ok(None)
            }
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
            // An empty list: what pop1 answers, without its events.
            Some(v) => self.pop.absorb(&mut self.progress, &v),
            // The value alone, as pop1's short reply: decoded as one.
            None => self.call.decode(reply.clone()).and_then(|v| {
                if let Some(q) = self.taken_from.take() {
                    self.pop.note_held(&q, &v);
                }
                self.pop.absorb(&mut self.progress, &v)
            }),
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
