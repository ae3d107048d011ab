//! Queue operations carried out as several script calls: a pop with a large
//! COUNT, an ACK of many ids, a NACK that must then end move leases. Each
//! call does bounded work; the session awaits the whole job before it
//! handles the client's next request, so the client's requests still take
//! effect in the order it sent them, and gets one reply, the one Redis
//! would send.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

use crate::queue::library::call::Caller;

type Run = Box<dyn FnOnce(Caller) -> Pin<Box<dyn Future<Output = Bytes> + Send>> + Send>;

pub struct Job(Run);

impl Job {
    pub fn new<F, Fut>(f: F) -> Job
    where
        F: FnOnce(Caller) -> Fut + Send + 'static,
        Fut: Future<Output = Bytes> + Send + 'static,
    {
        Job(Box::new(move |caller| Box::pin(f(caller))))
    }

    /// Runs the calls on `caller`'s connection and returns the client's reply.
    pub async fn run(self, caller: Caller) -> Bytes {
        (self.0)(caller).await
    }
}

/// The refusal of a queue operation that must be one script call (queued
/// in MULTI, which cannot be split without losing its atomicity, or sent
/// during a client pause, where it goes as one request on the client's own
/// connection) but asks for more than one call may do: `what` is the
/// request's `n` (a COUNT, a number of ids), `bound` the most one call
/// takes. One call for all of it could run for seconds and have Redis
/// answer every other client `-BUSY`.
pub fn above_one_call(what: &str, n: &str, bound: impl std::fmt::Display) -> Bytes {
    crate::resp::reply::error(&format!(
        "ackproxy: {what} {n} is above {bound}, the most one queue call takes \
         inside MULTI or during a client pause"
    ))
}

/// The refusal of a pop that must be one call (see [`above_one_call`]) but
/// asks for more elements or looks at more keys than one call does; `None`
/// when it fits (or its arguments are invalid, which Redis reports).
pub fn pop_above_one_call(
    form: crate::command::PopForm,
    args: crate::command::Args<'_>,
    rules: &crate::queue::rules::Rules,
) -> Option<Bytes> {
    use crate::queue::pop::{parse, Parsed, POP_BATCH, SOURCES_PER_CALL};
    let Parsed::Pop(pop) = parse(form, args, rules, 2) else {
        return None;
    };
    match pop.count {
        Some(n) if n > POP_BATCH => {
            return Some(above_one_call("COUNT", &n.to_string(), POP_BATCH));
        }
        _ => {}
    }
    let keys = pop.sources.len();
    (keys > SOURCES_PER_CALL)
        .then(|| above_one_call("number of keys", &keys.to_string(), SOURCES_PER_CALL))
}
