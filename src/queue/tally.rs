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

use super::value::Value;

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
pub type Groups = Vec<(usize, String)>;

/// Splits a function's reply, incrementing the counters its events name;
/// returns the result, or `None` for a reply of another shape.
pub fn settle(reply: Value, groups: &[(usize, String)]) -> Option<Value> {
    let Value::Array(mut parts) = reply else {
        return None;
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
    let rest = parts.split_off(1 + events);
    if spread {
        Some(Value::Array(rest))
    } else if rest.len() == 1 {
        rest.into_iter().next()
    } else {
        None
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
        let groups = vec![(1, "settle-test".to_string())];
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
            settle(v, &groups),
            Some(Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                s("payload")
            ]))
        );
        // An empty table and no events.
        assert_eq!(
            settle(Value::Array(vec![Value::Int(0)]), &groups),
            Some(Value::Array(vec![]))
        );
        // A single value (nil) after no events, and after one.
        assert_eq!(
            settle(Value::Array(vec![Value::Int(-1), Value::Nil]), &groups),
            Some(Value::Nil)
        );
        let v = Value::Array(vec![
            Value::Int(-4),
            Value::Int(1),
            Value::Int(2),
            Value::Int(5),
            Value::Int(7),
        ]);
        assert_eq!(settle(v, &groups), Some(Value::Int(7)));
        // Shapes the library never sends.
        assert_eq!(settle(Value::Array(vec![Value::Int(-1)]), &groups), None);
        assert_eq!(settle(Value::Array(vec![Value::Int(3)]), &groups), None);
        assert_eq!(settle(Value::Int(1), &groups), None);
    }
}
