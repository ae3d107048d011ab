//! What the scripts count. A script tallies each thing it does to a queue
//! twice: in the queue's `stats` hash, the totals `QUEUE INFO` shows (kept
//! in Redis, so every proxy adds to the same ones), and in its reply, from
//! which the proxy increments the Prometheus counter of the queue's rule.
//! The table below is the one list of both; a new count is one line here
//! (and its help text in `telemetry.rs`).
//!
//! A script's reply is `{events, result}`: `events` is a flat array of
//! (KEYS index where the queue's group starts, event name, amount).

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
];

/// The queues of one script call: where each one's key group starts in
/// KEYS (1-based, as the Lua side counts) and the pattern of its rule.
pub type Groups = Vec<(usize, String)>;

/// Splits a script's `{events, result}` reply, incrementing the counters
/// the events name; returns the result, or `None` for a reply of another
/// shape.
pub fn settle(reply: Value, groups: &[(usize, String)]) -> Option<Value> {
    let Value::Array(mut parts) = reply else {
        return None;
    };
    if parts.len() != 2 {
        return None;
    }
    let result = parts.pop()?;
    for ev in parts[0].array().chunks(3) {
        let [base, event, n] = ev else { break };
        let rule = groups.iter().find(|(b, _)| *b as i64 == base.int());
        let metric = EVENTS
            .iter()
            .find(|(name, _)| name.as_bytes() == event.bytes());
        if let (Some((_, rule)), Some((_, metric)), Ok(n)) = (rule, metric, u64::try_from(n.int()))
        {
            if let Some(c) = crate::telemetry::rule(rule).counter(metric) {
                c.increment(n);
            }
        }
    }
    Some(result)
}

/// Reads a `stats` field list (as `info.lua` returns it, in [`EVENTS`]
/// order) into (name, value) pairs.
pub fn totals(values: &[Value]) -> impl Iterator<Item = (&'static str, i64)> + '_ {
    EVENTS
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (*name, values.get(i).map(Value::int).unwrap_or(0)))
}
