//! A request a queue rule concerns, from the session's hand-over to its
//! reply. The session hands it over once ([`Queues::serve`]) with a small
//! handle on the client's connection ([`Conn`]); which calls it becomes,
//! where they go, the library they need, a blocking pop's wait and the reply
//! are decided here.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::command::{Args, Kind};
use crate::output::{ReplyTransform, Transformed};
use crate::queue::library::call::Caller;
use crate::queue::{How, Intercept, Queues};

/// Where a rewritten request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Queued in the client's transaction: its reply is an element of
    /// EXEC's.
    Transaction,
    /// Alone on the client's own connection, its reply rewritten there.
    Alone,
    /// On the shared connection of the client's database.
    Shared,
}

/// How a parked pop's wait ended without its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// The client went away.
    Gone,
    /// The proxy shuts down.
    Shutdown,
}

/// What became of the request.
pub enum Outcome {
    /// No queue operation after all: the session serves it as any other.
    Passed,
    Served,
    /// The client's connection ends.
    Ended(Left),
}

/// A wait for a parked pop's reply.
pub type Wait<'a> = Pin<&'a mut (dyn Future<Output = Bytes> + Send)>;

/// The client's connection as a queue operation needs it: replies in their
/// place, calls sent where the client's requests go, and the wait of a
/// blocking pop. The session implements it; nothing here knows how.
#[allow(async_fn_in_trait)]
pub trait Conn {
    /// Takes the reply's place in the client's stream, after everything the
    /// client sent before.
    async fn answer(&mut self, reply: Bytes);
    /// Has Redis discard the client's open transaction at EXEC, as after a
    /// command it refused while queuing.
    async fn abort_transaction(&mut self);
    /// Sends `call`, the rewrite of a request of `kind`, to the connection
    /// `to` names; its reply goes through `reply`.
    async fn send(&mut self, kind: Kind, call: Bytes, reply: Box<dyn ReplyTransform>, to: Place);
    /// The client's next request waits until `resolved` fires (or its
    /// sender is dropped): the reply of a request that may send a second
    /// call is resolved (see `Intercept::Scripted`).
    fn hold_next(&mut self, resolved: oneshot::Receiver<()>);
    /// A caller on the shared connection of the client's database, once
    /// everything the client sent before has run.
    async fn caller(&mut self) -> Caller;
    /// Until `wait` gives the pop's reply, `CLIENT UNBLOCK` gives
    /// `unblocked`, the client goes away, or the proxy shuts down; the
    /// reply given is written.
    async fn park(&mut self, wait: Wait<'_>, unblocked: Bytes) -> Result<(), Left>;
}

impl Queues {
    /// Serves a request [`Queues::concerns`].
    pub async fn serve<C: Conn>(
        self: &Arc<Self>,
        kind: Kind,
        args: Args<'_>,
        how: How,
        conn: &mut C,
    ) -> Outcome {
        match self.intercept(kind, args, how) {
            Intercept::Pass => return Outcome::Passed,
            Intercept::Reply(reply) => conn.answer(reply).await,
            Intercept::Refuse(reply) => {
                conn.answer(reply).await;
                if how.in_multi {
                    conn.abort_transaction().await;
                }
            }
            Intercept::Rewrite { request, transform } => {
                let place = if how.in_multi {
                    Place::Transaction
                } else if matches!(kind, Kind::Pop(form) if form.is_blocking()) || !how.split {
                    // A blocking form left to Redis (to report bad
                    // arguments) may block there after all, and a pause
                    // holds the scripts queue operations become: never on
                    // the shared connection.
                    Place::Alone
                } else {
                    Place::Shared
                };
                // Loaded first where its reply cannot be answered by
                // loading the library and calling again; on the shared
                // connection too, so that the call sent again there does
                // not come after the client's next requests (those pops of
                // one that go as the proxy's script never load it). Once
                // known loaded, this is a look at two numbers.
                self.ensure_library().await;
                conn.send(kind, request, transform, place).await;
            }
            Intercept::Scripted { request, transform } => {
                let (tx, rx) = oneshot::channel();
                let transform = Box::new(Resolved {
                    inner: transform,
                    _tx: tx,
                });
                conn.send(kind, request, transform, Place::Shared).await;
                conn.hold_next(rx);
            }
            Intercept::Job(job) => {
                let caller = conn.caller().await;
                let reply = job.run(caller).await;
                conn.answer(reply).await;
            }
            Intercept::Block(pop) => {
                let caller = conn.caller().await;
                // A pause would hold the pop's call on the shared
                // connection, and every other client's request behind it
                // there: the proxy's own connection instead.
                let caller = (!how.paused).then_some(caller);
                let started = tokio::time::Instant::now();
                // As Redis serves a blocking pop on a list with elements: at
                // once, the client never blocked (nor shown blocked).
                let pop = match self.pop_now(pop, caller, how.db).await {
                    Ok(reply) => {
                        conn.answer(reply).await;
                        return Outcome::Served;
                    }
                    Err(pop) => pop,
                };
                let unblocked = pop.timeout_reply();
                let wait = self.park(pop, how.db, started);
                tokio::pin!(wait);
                if let Err(left) = conn.park(wait, unblocked).await {
                    return Outcome::Ended(left);
                }
            }
        }
        Outcome::Served
    }
}

/// A reply transform whose end (dropped once its reply is written, or
/// with the client) releases the client's next request (see
/// [`Conn::hold_next`]).
struct Resolved {
    inner: Box<dyn ReplyTransform>,
    _tx: oneshot::Sender<()>,
}

impl ReplyTransform for Resolved {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        self.inner.apply(reply)
    }

    fn resend_on(&self) -> Option<&dyn crate::output::Resend> {
        self.inner.resend_on()
    }
}
