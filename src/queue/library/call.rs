//! Calling the queue functions. A [`Call`] is built from the calling
//! convention (a queue's key group, its rule arguments) by an
//! operation (see `op.rs`) and sent as `FCALL`; a call that finds the
//! library missing is sent again behind its load ([`Reload`], the one place
//! that does).

use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

use crate::error::UpstreamError;
use crate::output::{ClientState, ReplyTransform, Transformed};
use crate::queue::library::keys::CALL_KEYS;
use crate::queue::library::tally::{self, Groups, Short};
use crate::queue::library::value::{self, Value};
use crate::queue::library::{self, Function};
use crate::queue::rules::{Queue, RULE_ARGS};
use crate::upstream::shared::SharedUpstream;

/// Keys of the common call (one queue's group) held without an allocation.
pub type Keys = SmallVec<[Bytes; CALL_KEYS + 1]>;
/// Arguments of the common call (a rule, a few more), likewise.
pub type Argv = SmallVec<[Bytes; RULE_ARGS + 4]>;

/// One function call, kept so it can be sent again.
pub struct Call {
    pub function: &'static Function,
    pub keys: Keys,
    pub argv: Argv,
    /// The queues whose groups are in `keys`, for the events of the reply.
    groups: Groups,
    /// The encoded keys and rule of the queue the call starts with (see
    /// [`Call::queue_rule`]).
    encoded: Option<Bytes>,
}

impl Call {
    #[inline]
    pub fn new(function: &'static Function) -> Call {
        // Every pop and ACK makes one: the common one allocates nothing
        // but its request.
        Call {
            function,
            keys: Keys::new(),
            argv: Argv::new(),
            groups: Groups::new(),
            encoded: None,
        }
    }

    #[inline]
    pub fn key(mut self, k: impl Into<Bytes>) -> Self {
        self.keys.push(k.into());
        self
    }

    #[inline]
    pub fn arg(mut self, a: impl Into<Bytes>) -> Self {
        self.argv.push(a.into());
        self
    }

    /// Appends the queue's key group to KEYS (Lua: `group(i)`).
    #[inline]
    pub fn queue(mut self, q: &Queue) -> Self {
        self.push_queue(q);
        self
    }

    // The builder's steps work in place: a `Call` is some 400 bytes, and
    // each step that takes and gives it back by value copied it.
    fn push_queue(&mut self, q: &Queue) {
        self.groups.push((self.keys.len() + 1, q.pattern.clone()));
        self.keys.extend(q.key_group().iter().cloned());
    }

    fn push_rule(&mut self, q: &Queue) {
        self.argv.extend(q.rule_args().iter().cloned());
    }

    /// The queue's key group and rule as the first keys and arguments
    /// (`.queue(q).rule(q)`), written into the request from their encoding
    /// made once for the queue.
    #[inline]
    pub fn queue_rule(mut self, q: &Queue) -> Self {
        if self.keys.is_empty() && self.argv.is_empty() {
            self.encoded = Some(q.encoded.clone());
        }
        self.push_queue(q);
        self.push_rule(q);
        self
    }

    /// Appends the queue's rule to ARGV (Lua: `rule(i)`).
    #[inline]
    pub fn rule(mut self, q: &Queue) -> Self {
        self.push_rule(q);
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
        let mut index = itoa::Buffer::new();
        self.encode(self.function.name_db(), Some(index.format(db).as_bytes()))
    }

    fn encode(&self, name: &str, last: Option<&[u8]>) -> Bytes {
        // Written straight into one buffer of the right size: no list of
        // arguments, no second copy.
        let mut keys = itoa::Buffer::new();
        let numkeys = keys.format(self.keys.len()).as_bytes();
        let mut digits = itoa::Buffer::new();
        // A call that starts with one queue's keys and rule takes them
        // encoded once for the queue (see `Queue::encoded`).
        let (cached, skip_keys, skip_args) = match &self.encoded {
            Some(e) if self.keys.len() == CALL_KEYS && self.argv.len() >= RULE_ARGS => {
                (&e[..], CALL_KEYS, RULE_ARGS)
            }
            _ => (&b""[..], 0, 0),
        };
        let before = || {
            [&b"FCALL"[..], name.as_bytes(), numkeys]
                .into_iter()
                .chain(self.keys[skip_keys..].iter().map(|k| &k[..]))
        };
        let after = || self.argv[skip_args..].iter().map(|a| &a[..]).chain(last);
        let count = 3 + self.keys.len() + self.argv.len() + usize::from(last.is_some());
        // The exact size: a `Bytes` made of a vector with spare room
        // allocates again, for its shared header.
        let size = head_len(count)
            + before()
                .chain(after())
                .map(|a| head_len(a.len()) + a.len() + 2)
                .sum::<usize>()
            + cached.len();
        let mut out = Vec::with_capacity(size);
        out.push(b'*');
        out.extend_from_slice(digits.format(count).as_bytes());
        out.extend_from_slice(b"\r\n");
        let mut bulk = |out: &mut Vec<u8>, a: &[u8]| {
            out.push(b'$');
            out.extend_from_slice(digits.format(a.len()).as_bytes());
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        };
        for a in before() {
            bulk(&mut out, a);
        }
        out.extend_from_slice(cached);
        for a in after() {
            bulk(&mut out, a);
        }
        debug_assert_eq!(out.len(), size);
        Bytes::from(out)
    }
}

/// The length of `*<n>\r\n` or `$<n>\r\n`.
fn head_len(n: usize) -> usize {
    3 + decimal_len(n)
}

/// How many digits `n` has.
pub fn decimal_len(mut n: usize) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
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
fn decode(reply: Bytes, groups: &[(usize, Arc<str>)], short: Short) -> Result<Value, CallError> {
    if reply.first() == Some(&b'-') {
        if library::is_unsupported(&reply) {
            return Err(CallError::Redis(Bytes::from_static(
                b"-ERR ackproxy: queues need Redis 7.0 or later (FUNCTION/FCALL)\r\n",
            )));
        }
        return Err(CallError::Redis(reply));
    }
    value::decode(&reply)
        .and_then(|v| tally::settle(v, groups, short))
        .ok_or(CallError::Unexpected)
}

impl Call {
    /// Decodes this call's reply, counting the events it reports.
    pub fn decode(&self, reply: Bytes) -> Result<Value, CallError> {
        decode(reply, &self.groups, self.function.short())
    }
}

/// The one retry of a call whose reply says the library is not in Redis
/// (a restarted Redis, a `FUNCTION FLUSH`): the library's load, then the
/// call again. Once per call: a second "not found" is the client's reply.
/// The request is made again from the call rather than kept, as a second
/// reference to the request sent costs an allocation on every call for a
/// retry that almost never happens.
#[derive(Default)]
pub struct Reload {
    done: bool,
}

impl Reload {
    /// The load and `call`'s request in database `db`, to send in that
    /// order, if `reply` says the library is missing and this call was not
    /// sent again yet.
    pub fn after(&mut self, reply: &[u8], call: &Call, db: i64) -> Option<(Bytes, Bytes)> {
        if self.done || !library::is_missing(reply) {
            return None;
        }
        self.done = true;
        Some((library::library().load.clone(), call.request_in(db)))
    }

    /// The same, as a reply transform's step.
    pub fn retry(&mut self, reply: &[u8], call: &Call, db: i64) -> Option<Transformed> {
        self.after(reply, call, db)
            .map(|(before, request)| Transformed::Retry { before, request })
    }
}

/// Turns a function's reply into the client's reply; errors the function
/// returns (WRONGTYPE, ...) reach the client as they are.
pub struct ScriptReply<F> {
    call: Call,
    db: i64,
    reload: Reload,
    build: F,
}

impl<F> ScriptReply<F>
where
    F: FnMut(Value) -> Bytes + Send + 'static,
{
    /// `call`, sent in database `db`.
    pub fn boxed(call: Call, db: i64, build: F) -> Box<dyn ReplyTransform> {
        Box::new(ScriptReply {
            call,
            db,
            reload: Reload::default(),
            build,
        })
    }
}

impl<F> ReplyTransform for ScriptReply<F>
where
    F: FnMut(Value) -> Bytes + Send + 'static,
{
    fn apply(&mut self, reply: Bytes) -> Transformed {
        if let Some(retry) = self.reload.retry(&reply, &self.call, self.db) {
            return retry;
        }
        match self.call.decode(reply) {
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
        let mut reply = self.shared.call(request, self.client.clone()).await;
        let retry = match &reply {
            Ok(b) => Reload::default().after(b, call, self.db),
            Err(_) => None,
        };
        if let Some((load, request)) = retry {
            self.shared.send_discarded(load, 1, &self.client);
            reply = self.shared.call(request, self.client.clone()).await;
        }
        call.decode(reply.map_err(CallError::Upstream)?)
    }
}
