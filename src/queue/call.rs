//! Calling the queue scripts. A [`Call`] is built from the calling
//! convention (a queue's key group, its rule arguments) and sent as EVALSHA,
//! or as the whole script where a missing one cannot be retried (inside
//! MULTI) or after Redis said NOSCRIPT.

use std::sync::Arc;

use bytes::Bytes;

use super::rules::Queue;
use super::scripts::Script;
use super::tally::{self, Groups};
use super::value::{self, Value};
use crate::error::UpstreamError;
use crate::output::{ClientState, ReplyTransform, Transformed};
use crate::upstream::push_command;
use crate::upstream::shared::SharedUpstream;

/// One script invocation, kept so it can be re-sent in full.
pub struct Call {
    pub script: &'static Script,
    pub keys: Vec<Bytes>,
    pub argv: Vec<Bytes>,
    /// The queues whose groups are in `keys`, for the events of the reply.
    groups: Groups,
}

impl Call {
    pub fn new(script: &'static Script) -> Call {
        Call {
            script,
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

    fn encode(&self, verb: &[u8], script: &[u8]) -> Bytes {
        let numkeys = self.keys.len().to_string();
        let mut args: Vec<&[u8]> = Vec::with_capacity(3 + self.keys.len() + self.argv.len());
        args.push(verb);
        args.push(script);
        args.push(numkeys.as_bytes());
        args.extend(self.keys.iter().map(|k| &k[..]));
        args.extend(self.argv.iter().map(|a| &a[..]));
        let mut out = Vec::new();
        push_command(&mut out, &args);
        Bytes::from(out)
    }

    pub fn evalsha(&self) -> Bytes {
        self.encode(b"EVALSHA", self.script.sha().as_bytes())
    }

    pub fn eval(&self) -> Bytes {
        self.encode(b"EVAL", self.script.body().as_bytes())
    }

    /// The request to send: EVALSHA, or the whole script when `full`.
    pub fn request(&self, full: bool) -> Bytes {
        if full {
            self.eval()
        } else {
            self.evalsha()
        }
    }
}

/// Why a script call gave no value.
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
                Bytes::from_static(b"-ERR ackproxy: unexpected script reply\r\n")
            }
        }
    }
}

/// A script's result, once the events of its reply are counted.
fn decode(reply: Bytes, groups: &[(usize, String)]) -> Result<Value, CallError> {
    if reply.first() == Some(&b'-') {
        return Err(CallError::Redis(reply));
    }
    value::decode(&reply)
        .and_then(|v| tally::settle(v, groups))
        .ok_or(CallError::Unexpected)
}

/// Turns a script's reply into the client's reply; errors the script
/// returns (WRONGTYPE, ...) reach the client as they are.
pub struct ScriptReply<F> {
    call: Option<Call>,
    groups: Groups,
    build: F,
}

impl<F> ScriptReply<F>
where
    F: FnMut(Value) -> Bytes + Send + 'static,
{
    pub fn boxed(call: Call, build: F) -> Box<dyn ReplyTransform> {
        Box::new(ScriptReply {
            groups: call.groups.clone(),
            call: Some(call),
            build,
        })
    }
}

impl<F> ReplyTransform for ScriptReply<F>
where
    F: FnMut(Value) -> Bytes + Send + 'static,
{
    fn apply(&mut self, reply: Bytes) -> Transformed {
        if reply.starts_with(b"-NOSCRIPT") {
            if let Some(call) = self.call.take() {
                return Transformed::Retry(call.eval());
            }
        }
        match decode(reply, &self.groups) {
            Ok(v) => Transformed::Done((self.build)(v)),
            Err(e) => Transformed::Done(e.to_reply()),
        }
    }
}

/// Where a multi-step queue operation sends its calls, in order: the shared
/// connection of the client it runs for (or the proxy's own).
#[derive(Clone)]
pub struct Caller {
    pub shared: SharedUpstream,
    pub client: Arc<ClientState>,
}

impl Caller {
    /// Runs a call and decodes its reply, re-sending the whole script if
    /// Redis lost it.
    pub async fn run(&self, call: &Call) -> Result<Value, CallError> {
        let mut reply = self.shared.call(call.evalsha(), self.client.clone()).await;
        if matches!(&reply, Ok(b) if b.starts_with(b"-NOSCRIPT")) {
            reply = self.shared.call(call.eval(), self.client.clone()).await;
        }
        decode(reply.map_err(CallError::Upstream)?, &call.groups)
    }
}
