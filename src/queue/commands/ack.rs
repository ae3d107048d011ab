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
use crate::queue::leases::registry::Registry;
use crate::queue::library;
use crate::queue::library::call::{Call, CallError};
use crate::queue::library::op::{int_at, Op};
use crate::queue::library::value::Value;
use crate::queue::rules::{Queue, Rules};
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
pub fn ack(args: Args<'_>, rules: &Rules, registry: &Arc<Registry>, one_call: bool) -> Intercept {
    let q = match leased_target(args, rules, "ack") {
        Ok(q) => q,
        Err(e) => return Intercept::Reply(e),
    };
    let n = args.len() - 2;
    if one_call && n > IDS_PER_CALL {
        return too_many_ids(n);
    }
    let registry = registry.clone();
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
