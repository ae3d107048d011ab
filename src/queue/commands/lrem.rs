//! LREM on a move destination: a removed copy releases its lease.

use std::sync::Arc;

use bytes::Bytes;

use super::{changed, counted, int_reply};
use crate::command::{parse_i64, Args};
use crate::output::{ReplyTransform, Transformed};
use crate::queue::leases::registry::Registry;
use crate::queue::library;
use crate::queue::library::ack_id;
use crate::queue::library::call::Call;
use crate::queue::library::keys;
use crate::queue::library::op::{first_int, Op};
use crate::queue::library::script;
use crate::queue::library::tally;
use crate::queue::rules::{Made, Queue};
use crate::queue::Intercept;

/// LREM destination count payload, where the destination received messages
/// from a queue's move pops: removing a copy releases its lease. As
/// `lua/scripts/lrem_ack.lua` when the proxy may send a script (`scripted`,
/// see `How::alone`) in database 0 and the rule tracks no connection.
pub fn lrem(args: Args<'_>, q: &Arc<Queue>, registry: &Arc<Registry>, scripted: bool) -> Intercept {
    let (Some(dest), Some(count), Some(payload)) = (args.get(1), args.get(2), args.get(3)) else {
        return Intercept::Pass;
    };
    if args.len() != 4 || parse_i64(count).is_none() {
        return Intercept::Pass;
    }
    let op = lrem_op(dest, q, count, payload);
    if !scripted || registry.db != 0 || q.rule.tracks_connections() {
        return counted(op, q, registry);
    }
    let k = &q.keys;
    // The lease's token as the proxy can tell it: the script then reads
    // no JSON in the common case.
    let (hint, tail) = match ack_id::of(&q.rule.ack_id, payload) {
        Some(id) => (keys::id_key(id), ack_id::record_tail(dest, id, payload)),
        None => (Vec::new(), Vec::new()),
    };
    let request = script::lrem_ack().call(
        q,
        &[dest, k.prefix()],
        &[count, payload, q.rule.ack_id.field(), &hint, &tail],
    );
    Intercept::Scripted {
        request: request.evalsha.clone(),
        transform: Box::new(LremScripted {
            op: Some(op),
            eval: Some(request),
            q: q.clone(),
            registry: registry.clone(),
        }),
    }
}

/// The reply to `lrem_ack.lua`: LREM's count, or the library lrem's reply
/// (`op`'s).
struct LremScripted {
    op: Option<Op<i64>>,
    /// The request, to go again with the script's text if Redis lost it.
    eval: Option<script::Request>,
    q: Arc<Queue>,
    registry: Arc<Registry>,
}

impl ReplyTransform for LremScripted {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        if script::is_noscript(&reply) {
            if let Some(eval) = self.eval.take() {
                return Transformed::Continue(eval.eval());
            }
        }
        let Some(Op { call, read }) = self.op.take() else {
            return Transformed::Done(reply);
        };
        // n: LREM removed n copies, each releasing its lease.
        if let Some(n) = reply
            .strip_prefix(b":")
            .and_then(|r| r.strip_suffix(b"\r\n"))
            .and_then(parse_i64)
        {
            self.q.made_many(Made::Acks, n);
            tally::counted(&self.q.pattern, "acks", n.unsigned_abs());
            changed(&self.registry, &self.q, n);
            return Transformed::Done(int_reply(n));
        }
        let v = match call.decode(reply) {
            Ok(v) => v,
            Err(e) => return Transformed::Done(e.to_reply()),
        };
        // {removed, released}: the script's acknowledgements, for the
        // totals the proxy writes.
        let released = v.array().get(1).map_or(0, |r| r.int());
        self.q.made_many(Made::Acks, released);
        match read(&v) {
            Ok(n) => {
                changed(&self.registry, &self.q, n);
                Transformed::Done(int_reply(n))
            }
            Err(e) => Transformed::Done(e.to_reply()),
        }
    }
}

/// `lrem`: LREM on a move destination, `count` copies of `payload`; a
/// removed copy releases its lease. Reply: LREM's own.
fn lrem_op(dest: &[u8], q: &Queue, count: &[u8], payload: &[u8]) -> Op<i64> {
    let call = Call::new(&library::LREM)
        .key(Bytes::copy_from_slice(dest))
        .queue(q)
        .rule(q)
        .arg(Bytes::copy_from_slice(count));
    Op::new(call.arg(Bytes::copy_from_slice(payload)), first_int)
}
