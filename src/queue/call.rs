//! Calling the queue functions. A [`Call`] is built from the calling
//! convention (a queue's key group, its rule arguments) and sent as
//! `FCALL`; a call that finds the library missing is sent again behind its
//! load (see `library.rs`).

use std::sync::Arc;

use bytes::Bytes;

use super::library::{self, Function};
use super::rules::Queue;
use super::tally::{self, Groups};
use super::value::{self, Value};
use crate::error::UpstreamError;
use crate::output::{ClientState, ReplyTransform, Transformed};
use crate::upstream::push_command;
use crate::upstream::shared::SharedUpstream;

/// One function call, kept so it can be sent again.
pub struct Call {
    pub function: &'static Function,
    pub keys: Vec<Bytes>,
    pub argv: Vec<Bytes>,
    /// The queues whose groups are in `keys`, for the events of the reply.
    groups: Groups,
}

impl Call {
    pub fn new(function: &'static Function) -> Call {
        Call {
            function,
            keys: Vec::new(),
            argv: Vec::new(),
            groups: Vec::new(),
        }
    }

    pub fn key(mut self, k: impl Into<Bytes>) -> Self {
        self.keys.push(k.into());
        self
    }

    pub fn arg(mut self, a: impl Into<Bytes>) -> Self {
        self.argv.push(a.into());
        self
    }

    /// Appends the queue's key group to KEYS (Lua: `group(i)`).
    pub fn queue(mut self, q: &Queue) -> Self {
        self.groups
            .push((self.keys.len() + 1, q.rule.pattern.clone()));
        self.keys.extend(q.key_group().iter().cloned());
        self
    }

    /// Appends the queue's rule to ARGV (Lua: `rule(i)`).
    pub fn rule(mut self, q: &Queue) -> Self {
        self.argv.extend(q.rule_args().iter().cloned());
        self
    }

    /// The `FCALL` request, for a connection in database 0.
    pub fn request(&self) -> Bytes {
        self.encode(self.function.name(), None)
    }

    /// The `FCALL` request, for a connection in database `db`: elsewhere
    /// than in 0 the function's variant that is told the database (the
    /// library keeps some totals between calls, per database).
    pub fn request_in(&self, db: i64) -> Bytes {
        if db == 0 {
            return self.request();
        }
        let index = db.to_string();
        self.encode(self.function.name_db(), Some(index.as_bytes()))
    }

    fn encode(&self, name: &str, last: Option<&[u8]>) -> Bytes {
        let numkeys = itoa::Buffer::new().format(self.keys.len()).to_owned();
        let mut args: Vec<&[u8]> = Vec::with_capacity(4 + self.keys.len() + self.argv.len());
        args.push(b"FCALL");
        args.push(name.as_bytes());
        args.push(numkeys.as_bytes());
        args.extend(self.keys.iter().map(|k| &k[..]));
        args.extend(self.argv.iter().map(|a| &a[..]));
        args.extend(last);
        let mut out = Vec::new();
        push_command(&mut out, &args);
        Bytes::from(out)
    }
}

/// Why a function call gave no value.
#[derive(Debug, Clone)]
pub enum CallError {
    /// Redis answered with an error (WRONGTYPE, OOM, ...): the client gets it
    /// as it is, as it would from the command it sent.
    Redis(Bytes),
    /// No reply from Redis; see [`UpstreamError`] for whether it ran.
    Upstream(UpstreamError),
    /// A reply our scripts never give.
    Unexpected,
}

impl CallError {
    pub fn to_reply(&self) -> Bytes {
        match self {
            CallError::Redis(b) => b.clone(),
            CallError::Upstream(e) => Bytes::from(e.to_reply()),
            CallError::Unexpected => {
                Bytes::from_static(b"-ERR ackproxy: unexpected queue function reply\r\n")
            }
        }
    }
}

/// A function's result, once the events of its reply are counted.
fn decode(reply: Bytes, groups: &[(usize, String)]) -> Result<Value, CallError> {
    if reply.first() == Some(&b'-') {
        if library::is_unsupported(&reply) {
            return Err(CallError::Redis(Bytes::from_static(
                b"-ERR ackproxy: queues need Redis 7.0 or later (FUNCTION/FCALL)\r\n",
            )));
        }
        return Err(CallError::Redis(reply));
    }
    value::decode(&reply)
        .and_then(|v| tally::settle(v, groups))
        .ok_or(CallError::Unexpected)
}

impl Call {
    /// Decodes this call's reply, counting the events it reports.
    pub fn decode(&self, reply: Bytes) -> Result<Value, CallError> {
        decode(reply, &self.groups)
    }
}

/// Turns a function's reply into the client's reply; errors the function
/// returns (WRONGTYPE, ...) reach the client as they are.
pub struct ScriptReply<F> {
    /// The request, until it was sent again once.
    retry: Option<Bytes>,
    groups: Groups,
    build: F,
}

impl<F> ScriptReply<F>
where
    F: FnMut(Value) -> Bytes + Send + 'static,
{
    pub fn boxed(call: Call, request: Bytes, build: F) -> Box<dyn ReplyTransform> {
        Box::new(ScriptReply {
            groups: call.groups,
            retry: Some(request),
            build,
        })
    }
}

impl<F> ReplyTransform for ScriptReply<F>
where
    F: FnMut(Value) -> Bytes + Send + 'static,
{
    fn apply(&mut self, reply: Bytes) -> Transformed {
        if library::is_missing(&reply) {
            if let Some(request) = self.retry.take() {
                return Transformed::Retry {
                    before: library::library().load.clone(),
                    request,
                };
            }
        }
        match decode(reply, &self.groups) {
            Ok(v) => Transformed::Done((self.build)(v)),
            Err(e) => Transformed::Done(e.to_reply()),
        }
    }
}

/// Where a multi-step queue operation sends its calls, in order: the shared
/// connection of the client it runs for (or the proxy's own), in database
/// `db`.
#[derive(Clone)]
pub struct Caller {
    pub shared: SharedUpstream,
    pub client: Arc<ClientState>,
    pub db: i64,
}

impl Caller {
    /// Runs a call and decodes its reply, loading the library first if
    /// Redis lost it.
    pub async fn run(&self, call: &Call) -> Result<Value, CallError> {
        let request = call.request_in(self.db);
        let mut reply = self.shared.call(request.clone(), self.client.clone()).await;
        if matches!(&reply, Ok(b) if library::is_missing(b)) {
            reply = self.resend(library::library().load.clone(), request).await;
        }
        decode(reply.map_err(CallError::Upstream)?, &call.groups)
    }

    /// `before` (its reply dropped), then `request`, awaited.
    pub async fn resend(&self, before: Bytes, request: Bytes) -> crate::output::Reply {
        self.shared.send_discarded(before, 1, &self.client);
        self.shared.call(request, self.client.clone()).await
    }
}
