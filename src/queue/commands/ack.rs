//! ACK queue id [id ...]: the leases of the ids released, or the copies
//! of the ids whose lease ran out cancelled (a late ACK).

use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

use super::job::Job;
use super::{
    changed, in_chunks, int_reply, job_reply, leased_target, rewrite, too_many_ids, IDS_PER_CALL,
};
use crate::command::Args;
use crate::output::{ReplyTransform, Transformed};
use crate::queue::leases::handed;
use crate::queue::leases::registry::Registry;
use crate::queue::library;
use crate::queue::library::call::{Call, CallError, ScriptReply};
use crate::queue::library::op::{int_at, Op};
use crate::queue::library::value::Value;
use crate::queue::library::{script, tally};
use crate::queue::rules::{Made, Queue, Rules};
use crate::queue::Intercept;

/// ACK's reply: leases released plus late ACKs. The age of each lease it
/// released (pop → ACK, by Redis's clock) goes to the rule's ack latency.
pub fn count_acks(q: &Queue, acked: &Acked) -> i64 {
    if !acked.started.is_empty() {
        let rule = crate::telemetry::rule(&q.rule.pattern);
        let now = crate::queue::leases::clock::redis_now_ms();
        for at in &acked.started {
            rule.acked_after((now - at).max(0) as u64);
        }
    }
    acked.count()
}

fn ids_of(args: Args<'_>, from: usize) -> Vec<Bytes> {
    args.iter().skip(from).map(Bytes::copy_from_slice).collect()
}

/// ACK queue id [id ...]
/// `scripted`: it may go as `release.lua` (see `How::alone`); `owner`
/// gives the name of the connection sending it, for `release_owned.lua`
/// on a rule that tracks connections.
pub fn ack(
    args: Args<'_>,
    rules: &Rules,
    registry: &Arc<Registry>,
    (one_call, scripted): (bool, bool),
    owner: impl FnOnce() -> Bytes,
) -> Intercept {
    let q = match leased_target(args, rules, "ack") {
        Ok(q) => q,
        Err(e) => return Intercept::Reply(e),
    };
    let n = args.len() - 2;
    if one_call && n > IDS_PER_CALL {
        return too_many_ids(n);
    }
    let registry = registry.clone();
    // Every ACK forgets the leases it names as handed out: a note left
    // behind could send a later ACK of the same id the short way after the
    // rule changed under it.
    let handed_at = match n {
        1 => handed::take(&q.name, args.get(2).unwrap_or_default()),
        _ => {
            (2..args.len()).for_each(|i| {
                handed::take(&q.name, args.get(i).unwrap_or_default());
            });
            None
        }
    };
    if let Some(popped_at) = handed_at {
        if scripted && registry.db == 0 {
            let id = Bytes::copy_from_slice(args.get(2).unwrap_or_default());
            let owner = match q.rule.tracks_connections() {
                true => Some(owner()),
                false => None,
            };
            return release(q, registry, id, popped_at, owner);
        }
    }
    if n <= IDS_PER_CALL {
        // The ids straight from the request into the call, as slices of
        // it: no list of them first, no copies.
        let ids = (2..args.len()).filter_map(|i| args.to_bytes(i));
        let op = ack_op(&q, ids);
        let q = q.clone();
        return rewrite(op, registry.db, move |acked| {
            let n = count_acks(&q, &acked);
            changed(&registry, &q, n);
            int_reply(n)
        });
    }
    let ids = ids_of(args, 2);
    Intercept::Job(Job::new(move |caller| async move {
        let op = |ids: &[Bytes]| ack_op(&q, ids.iter().cloned());
        let done = in_chunks(&caller, &ids, IDS_PER_CALL, op, |a| count_acks(&q, &a)).await;
        job_reply(&registry, &q, done)
    }))
}

/// ACK of one id whose lease this proxy handed out: `release.lua` (see
/// `library/script.rs`), or `release_owned.lua` with the connection's name
/// (`owner`) on a rule that tracks connections; then the library's `ack`
/// if that found no plain lease with the id (of that connection), or if
/// Redis lost the script and the `EVAL` fails too.
fn release(
    q: Arc<Queue>,
    registry: Arc<Registry>,
    id: Bytes,
    popped_at: i64,
    owner: Option<Bytes>,
) -> Intercept {
    let k = &q.keys;
    let token = library::keys::id_key(&id);
    let call = match &owner {
        None => script::release().call(&q, &[k.prefix()], &[&token]),
        Some(owner) => script::release_owned().call(&q, &[k.prefix()], &[&token, owner]),
    };
    let request = call.evalsha.clone();
    let transform = Box::new(Release {
        eval: Some(call),
        q,
        registry,
        id,
        popped_at,
        then: None,
    });
    Intercept::Scripted { request, transform }
}

struct Release {
    q: Arc<Queue>,
    registry: Arc<Registry>,
    id: Bytes,
    popped_at: i64,
    /// The request, to go again with the script's text if Redis lost it.
    eval: Option<script::Request>,
    /// The library's `ack`, once it took over.
    then: Option<Box<dyn ReplyTransform>>,
}

impl ReplyTransform for Release {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        if let Some(then) = &mut self.then {
            return then.apply(reply);
        }
        match &reply[..] {
            b":1\r\n" => {
                self.q.made(Made::Acks);
                tally::counted(&self.q.pattern, "acks", 1);
                let acked = Acked {
                    released: 1,
                    late: 0,
                    started: smallvec::smallvec![self.popped_at],
                };
                let n = count_acks(&self.q, &acked);
                changed(&self.registry, &self.q, n);
                Transformed::Done(int_reply(n))
            }
            b":0\r\n" => {
                let op = ack_op(&self.q, std::iter::once(self.id.clone()));
                let request = op.call.request();
                let (q, registry) = (self.q.clone(), self.registry.clone());
                let read = op.read;
                self.then = Some(ScriptReply::boxed(op.call, 0, move |v| match read(&v) {
                    Ok(acked) => {
                        let n = count_acks(&q, &acked);
                        changed(&registry, &q, n);
                        int_reply(n)
                    }
                    Err(e) => e.to_reply(),
                }));
                Transformed::Continue(request)
            }
            r if script::is_noscript(r) && self.eval.is_some() => {
                Transformed::Continue(self.eval.take().map(|r| r.eval()).unwrap_or_default())
            }
            _ => Transformed::Done(reply),
        }
    }
}

/// What an ACK call did.
pub struct Acked {
    pub released: i64,
    /// Ids acknowledged after their lease ran out (their copy cancelled).
    pub late: i64,
    /// When each released lease started (ms, Redis's clock).
    pub started: SmallVec<[i64; 4]>,
}

impl Acked {
    /// The client's count: released plus late.
    pub fn count(&self) -> i64 {
        self.released + self.late
    }
}

/// `ack`: releases the leases of `ids` (at most `IDS_PER_CALL`).
pub fn ack_op(q: &Queue, ids: impl Iterator<Item = Bytes>) -> Op<Acked> {
    let mut call = Call::new(&library::ACK).queue_rule(q);
    call.argv.extend(ids);
    Op::new(call, read_acked)
}

fn read_acked(v: &Value) -> Result<Acked, CallError> {
    if let Value::Int(start) = v {
        // The short reply of `ack` (see `tally::settle`): one lease
        // released, that started then.
        return Ok(Acked {
            released: 1,
            late: 0,
            started: smallvec::smallvec![*start],
        });
    }
    let items = v.array();
    Ok(Acked {
        released: int_at(v, 0),
        late: int_at(v, 1),
        started: items
            .get(2..)
            .unwrap_or_default()
            .iter()
            .map(Value::int)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_reads_the_short_reply_as_its_flat_form() {
        let flat = Value::Array(vec![
            Value::Int(1),
            Value::Int(0),
            Value::Int(1700000000123),
        ]);
        for v in [Value::Int(1700000000123), flat] {
            let a = read_acked(&v).unwrap();
            assert_eq!(
                (a.released, a.late, a.started.to_vec()),
                (1, 0, vec![1700000000123])
            );
        }
        let none = read_acked(&Value::Array(vec![Value::Int(0), Value::Int(2)])).unwrap();
        assert_eq!((none.released, none.late, none.started.len()), (0, 2, 0));
    }
}
