//! Calling the embedded scripts: EVALSHA normally, the whole script where a
//! missing one cannot be retried (inside MULTI) or after Redis said NOSCRIPT.

use std::collections::HashMap;
use std::sync::OnceLock;

use bytes::Bytes;

use super::scripts::Script;
use super::value::{self, Value};
use crate::session::output::{ReplyTransform, Transformed};
use crate::upstream::push_command;

/// One script invocation, kept so it can be re-sent in full.
pub struct Call {
    pub script: &'static Script,
    pub keys: Vec<Bytes>,
    pub argv: Vec<Bytes>,
}

fn sha_of(script: &'static Script) -> &'static str {
    static SHAS: OnceLock<std::sync::Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
    let mut map = SHAS.get_or_init(Default::default).lock().unwrap();
    map.entry(script.name).or_insert_with(|| {
        let hex = sha1_smol::Sha1::from(script.body).digest().to_string();
        Box::leak(hex.into_boxed_str())
    })
}

impl Call {
    pub fn new(script: &'static Script) -> Call {
        Call {
            script,
            keys: Vec::new(),
            argv: Vec::new(),
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
        self.encode(b"EVALSHA", sha_of(self.script).as_bytes())
    }

    pub fn eval(&self) -> Bytes {
        self.encode(b"EVAL", self.script.body.as_bytes())
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

/// Turns a script's reply into the client's reply; errors the script
/// returns (WRONGTYPE, ...) reach the client as they are.
pub struct ScriptReply<F> {
    call: Option<Call>,
    build: F,
}

impl<F> ScriptReply<F>
where
    F: FnMut(Value) -> Bytes + Send + 'static,
{
    pub fn boxed(call: Call, build: F) -> Box<dyn ReplyTransform> {
        Box::new(ScriptReply {
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
        if reply.first() == Some(&b'-') {
            return Transformed::Done(reply);
        }
        match value::decode(&reply) {
            Some(v) => Transformed::Done((self.build)(v)),
            None => Transformed::Done(Bytes::from_static(
                b"-ERR ackproxy: unexpected script reply\r\n",
            )),
        }
    }
}

/// Runs a call on the shared upstream and returns its decoded reply,
/// re-sending the whole script if Redis lost it.
pub async fn run(
    shared: &crate::upstream::shared::SharedUpstream,
    client: &std::sync::Arc<crate::session::output::ClientState>,
    call: &Call,
) -> Result<Value, Bytes> {
    let mut reply = shared.call(call.evalsha(), client.clone()).await;
    if matches!(&reply, Ok(b) if b.starts_with(b"-NOSCRIPT")) {
        reply = shared.call(call.eval(), client.clone()).await;
    }
    match reply {
        Ok(b) if b.first() == Some(&b'-') => Err(b),
        Ok(b) => value::decode(&b)
            .ok_or_else(|| Bytes::from_static(b"-ERR ackproxy: unexpected script reply\r\n")),
        Err(e) => Err(Bytes::from(e.to_reply())),
    }
}
