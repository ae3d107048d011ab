//! What the scripts count. A script tallies each thing it does to a queue
//! twice: in the queue's `stats` hash, the totals `QUEUE INFO` shows (kept
//! in Redis, so every proxy adds to the same ones), and in its reply, from
//! which the proxy increments the Prometheus counter of the queue's rule.
//! The table below is the one list of both; a new count is one line here
//! (and its help text in `telemetry.rs`).
//!
//! A function's reply is one flat array, `[m, events…, result…]` (nested
//! arrays cost Redis about as much to send as a small command): the `|m|`
//! or `-m - 1` values after `m` are the events, flat (KEYS index where the
//! queue's group starts, 1-based place in [`EVENTS`], amount) triples; with
//! `m >= 0` the result is an array made of the rest, with `m < 0` it is the
//! one value left. `reply` in `lua/common.lua` writes it.

use std::sync::Arc;

use crate::queue::library::value::Value;

/// Event names as the Lua side uses them and the `stats` hash stores them,
/// with the per-rule counter each one increments.
pub const EVENTS: &[(&str, &str)] = &[
    ("deliveries", "ackproxy_pops_total"),
    ("acks", "ackproxy_acks_total"),
    ("late_acks", "ackproxy_late_acks_total"),
    ("nacks", "ackproxy_nacks_total"),
    ("expiries", "ackproxy_expiries_total"),
    ("redeliveries", "ackproxy_redeliveries_total"),
    ("dead_lettered", "ackproxy_dead_letters_total"),
    ("promoted", "ackproxy_delayed_promoted_total"),
    ("redriven", "ackproxy_redriven_total"),
    ("dead_dropped", "ackproxy_dead_dropped_total"),
    ("disconnects", "ackproxy_disconnect_requeues_total"),
    ("would_redeliver", "ackproxy_shadow_would_redeliver_total"),
    ("poisoned", "ackproxy_poison_messages_total"),
];

/// The queues of one script call: where each one's key group starts in
/// KEYS (1-based, as the Lua side counts) and the pattern of its rule.
/// One queue's without an allocation: nearly every call has one.
pub type Groups = smallvec::SmallVec<[(usize, Arc<str>); 1]>;

/// The short form a function's reply may take in its common case (see
/// `short_reply` in `lua/common.lua`): one plain value that stands for a
/// flat reply with one event of the queue whose group comes first. Its
/// event is counted here; the value itself is the result the operation's
/// reader gets (`pop::call::Pop::read`, `commands::ack::read_acked`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Short {
    /// The function never answers so.
    None,
    /// `pop1`: the popped value, for `[0, 1, value]` and one delivery.
    Pop,
    /// `ack`: the released lease's start, for `[1, 0, start]` and one ack.
    Ack,
}

/// Splits a function's reply, incrementing the counters its events name;
/// returns the result (a short reply as it is), or `None` for a reply of
/// another shape.
pub fn settle(reply: Value, groups: &[(usize, Arc<str>)], short: Short) -> Option<Value> {
    let mut parts = match (short, reply) {
        (_, Value::Array(parts)) => parts,
        // Passed on as they are, not rebuilt as the result they stand for
        // (an allocation on every pop and ACK): `pop::call::Pop::read`
        // and `commands::ack::read_acked` read them. A result of the flat
        // form is never a bare string (pop) or integer (ack).
        (Short::Pop, value @ Value::Str(_)) => {
            count(groups, 0, 1);
            return Some(value);
        }
        (Short::Ack, value @ Value::Int(_)) => {
            count(groups, 1, 1);
            return Some(value);
        }
        _ => return None,
    };
    let m = parts.first()?.int();
    let (events, spread) = if m >= 0 {
        (m as usize, true)
    } else {
        ((-m - 1) as usize, false)
    };
    if parts.len() < 1 + events + usize::from(!spread) {
        return None;
    }
    for ev in parts[1..1 + events].chunks(3) {
        let [base, event, n] = ev else { break };
        let rule = groups.iter().find(|(b, _)| *b as i64 == base.int());
        let metric = usize::try_from(event.int() - 1)
            .ok()
            .and_then(|i| EVENTS.get(i));
        if let (Some((_, rule)), Some((_, metric)), Ok(n)) = (rule, metric, u64::try_from(n.int()))
        {
            if let Some(c) = crate::telemetry::rule(rule).counter(metric) {
                c.increment(n);
            }
        }
    }
    // In place: the result is what is left of the reply's own array.
    parts.drain(..1 + events);
    if spread {
        Some(Value::Array(parts))
    } else if parts.len() == 1 {
        parts.pop()
    } else {
        None
    }
}

/// Increments by n the counter of the event `name` for `rule`: what a
/// script that sends no events (`library::script`) did.
pub fn counted(rule: &str, name: &str, n: u64) {
    if let Some((_, metric)) = EVENTS.iter().find(|(e, _)| *e == name) {
        if let Some(c) = crate::telemetry::rule(rule).counter(metric) {
            c.increment(n);
        }
    }
}

/// Increments by n the counter of [`EVENTS`]`[event]` for the rule of the
/// queue whose group comes first.
fn count(groups: &[(usize, Arc<str>)], event: usize, n: u64) {
    if let (Some((_, rule)), Some((_, metric))) = (groups.first(), EVENTS.get(event)) {
        if let Some(c) = crate::telemetry::rule(rule).counter(metric) {
            c.increment(n);
        }
    }
}

/// Reads a `stats` field list (as `info.lua` returns it, in [`EVENTS`]
/// order) into (name, value) pairs.
pub fn totals(values: &[Value]) -> impl Iterator<Item = (&'static str, i64)> + '_ {
    EVENTS
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (*name, values.get(i).map(Value::int).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn s(x: &str) -> Value {
        Value::Str(Bytes::copy_from_slice(x.as_bytes()))
    }

    #[test]
    fn a_flat_reply_gives_back_its_result() {
        let groups = vec![(1, Arc::from("settle-test"))];
        // A table result, spread after one event.
        let v = Value::Array(vec![
            Value::Int(3),
            Value::Int(1),
            Value::Int(1),
            Value::Int(2),
            Value::Int(0),
            Value::Int(1),
            s("payload"),
        ]);
        assert_eq!(
            settle(v, &groups, Short::None),
            Some(Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                s("payload")
            ]))
        );
        // An empty table and no events.
        assert_eq!(
            settle(Value::Array(vec![Value::Int(0)]), &groups, Short::None),
            Some(Value::Array(vec![]))
        );
        // A single value (nil) after no events, and after one.
        assert_eq!(
            settle(
                Value::Array(vec![Value::Int(-1), Value::Nil]),
                &groups,
                Short::None
            ),
            Some(Value::Nil)
        );
        let v = Value::Array(vec![
            Value::Int(-4),
            Value::Int(1),
            Value::Int(2),
            Value::Int(5),
            Value::Int(7),
        ]);
        assert_eq!(settle(v, &groups, Short::None), Some(Value::Int(7)));
        // Shapes the library never sends.
        assert_eq!(
            settle(Value::Array(vec![Value::Int(-1)]), &groups, Short::None),
            None
        );
        assert_eq!(
            settle(Value::Array(vec![Value::Int(3)]), &groups, Short::None),
            None
        );
        assert_eq!(settle(Value::Int(1), &groups, Short::None), None);
    }

    #[test]
    fn a_short_reply_is_passed_on_as_it_is() {
        let groups = vec![(1, Arc::from("settle-short-test"))];
        assert_eq!(
            settle(s("payload"), &groups, Short::Pop),
            Some(s("payload"))
        );
        assert_eq!(
            settle(Value::Int(1700000000123), &groups, Short::Ack),
            Some(Value::Int(1700000000123))
        );
        // Only the function that answers so.
        assert_eq!(settle(s("payload"), &groups, Short::Ack), None);
        assert_eq!(settle(Value::Int(5), &groups, Short::Pop), None);
        assert_eq!(settle(Value::Int(5), &groups, Short::None), None);
        // The long form still reads as before.
        assert_eq!(
            settle(
                Value::Array(vec![Value::Int(-1), Value::Nil]),
                &groups,
                Short::Pop
            ),
            Some(Value::Nil)
        );
    }
}
