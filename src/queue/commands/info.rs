//! QUEUE INFO queue: sizes, totals, the rule and a suggested lease; the
//! same call gives the reaper the queue gauges' sample.

use bytes::{Bytes, BytesMut};

use super::{map_reply, rewrite, Field, Sub};
use crate::config::{AckPolicy, Backoff, Hold};
use crate::queue::leases::clock;
use crate::queue::library;
use crate::queue::library::call::{Call, CallError};
use crate::queue::library::op::{int_at, Op};
use crate::queue::library::tally;
use crate::queue::library::value::Value;
use crate::queue::rules::Queue;
use crate::queue::Intercept;

/// Twice the p99: a job slower than all but 1 % of the recent ones still
/// finishes before its lease ends, with room for a slower worker or a
/// pause, while a dead worker's message is back within about two jobs' time.
const LEASE_SAFETY: u64 = 2;
/// Fewer acknowledgements say too little about the slow end.
const MIN_ACKS_FOR_SUGGESTION: usize = 10;

/// QUEUE INFO queue
pub(super) fn info(sub: Sub<'_>) -> Intercept {
    let Sub { q, how, .. } = sub;
    let suggested = suggested_lease_ms(&q.rule.pattern);
    // The totals this proxy's scripts made that the stats hash does not
    // count yet (see `Queue::totals_to_write`) are written by the call,
    // before it reads.
    let totals = match how.db {
        0 => q.take_unwritten(clock::redis_now_ms()),
        _ => [0, 0],
    };
    let op = info_op(&q, totals);
    let q = q.clone();
    rewrite(op, how.db, move |i| {
        let mut fields: Vec<(String, Field)> = vec![
            ("ready".into(), Field::Int(i.ready)),
            ("leased".into(), Field::Int(i.leased)),
            ("delayed".into(), Field::Int(i.delayed)),
            ("dead".into(), Field::Int(i.dead)),
            ("oldest-lease-age-ms".into(), Field::Int(i.oldest_lease_ms)),
            ("requeued".into(), Field::Int(i.requeued)),
            ("poison".into(), Field::Int(i.poison)),
        ];
        fields.extend(
            tally::totals(&i.totals).map(|(name, n)| (name.replace('_', "-"), Field::Int(n))),
        );
        let rule = &q.rule;
        fields.extend([
            ("lease-ms".into(), Field::Int(rule.lease_ms as i64)),
            (
                "max-deliveries".into(),
                Field::Int(rule.max_deliveries as i64),
            ),
            (
                "dead-letter-key".into(),
                Field::Str(Bytes::copy_from_slice(q.keys.dead())),
            ),
            (
                "retry-backoff".into(),
                Field::Str(Bytes::from_static(match rule.retry_backoff {
                    Backoff::None => b"none",
                    Backoff::Fixed => b"fixed",
                    Backoff::Exp => b"exp",
                })),
            ),
            (
                "ack".into(),
                Field::Str(Bytes::from_static(match rule.ack {
                    AckPolicy::Explicit => b"explicit",
                    AckPolicy::NextPop => b"next-pop",
                })),
            ),
            (
                "requeue-on-disconnect".into(),
                Field::Int(rule.requeues_on_disconnect() as i64),
            ),
            ("shadow".into(), Field::Int(rule.shadow as i64)),
            (
                "hold".into(),
                Field::Str(Bytes::from_static(match rule.hold {
                    Hold::Lease => b"lease",
                    Hold::Connection => b"connection",
                })),
            ),
            ("max-hold-ms".into(), Field::Int(rule.max_hold_ms() as i64)),
            ("poison-after".into(), Field::Int(rule.poison_after.into())),
            ("suggested-lease-ms".into(), Field::Int(suggested)),
        ]);
        // Last: a nested array, after every flat field.
        fields.push(("poison-ids".into(), Field::List(i.poison_ids)));
        let mut out = BytesMut::new();
        map_reply(&mut out, &fields, how.protocol);
        out.freeze()
    })
}

/// A lease that covers almost every job: the 99th percentile of the rule's
/// recent pop → ACK latencies (the last [`RECENT_ACKS`] acknowledged
/// through this proxy) times [`LEASE_SAFETY`], rounded up to a second; -1
/// until there are [`MIN_ACKS_FOR_SUGGESTION`] of them.
///
/// [`RECENT_ACKS`]: crate::telemetry::RECENT_ACKS
fn suggested_lease_ms(pattern: &str) -> i64 {
    match crate::telemetry::rule(pattern).ack_p99() {
        Some((p99, n)) if n >= MIN_ACKS_FOR_SUGGESTION => {
            let ms = p99.saturating_mul(LEASE_SAFETY).max(1);
            ms.div_ceil(1000).saturating_mul(1000) as i64
        }
        _ => -1,
    }
}

/// What QUEUE INFO and the gauges show.
pub struct QueueInfo {
    pub ready: i64,
    pub leased: i64,
    pub dead: i64,
    /// -1 without leases.
    pub oldest_lease_ms: i64,
    /// Distinct ids with copies back in the list after an expiry.
    pub requeued: i64,
    pub delayed: i64,
    /// In `tally::EVENTS` order (see `tally::totals`).
    pub totals: Vec<Value>,
    pub poison: i64,
    pub poison_ids: Vec<Bytes>,
}

/// `info`: a queue's sizes, totals and poison list.
/// `totals`: deliveries and ACKs of the proxy's scripts to add first.
pub fn info_op(q: &Queue, totals: [i64; 2]) -> Op<QueueInfo> {
    let mut call = Call::new(&library::INFO).queue_rule(q);
    if totals.iter().any(|n| *n > 0) {
        call = call.arg(totals[0].to_string()).arg(totals[1].to_string());
    }
    Op::new(call, read_info)
}

fn read_info(v: &Value) -> Result<QueueInfo, CallError> {
    let a = v.array();
    Ok(QueueInfo {
        ready: int_at(v, 0),
        leased: int_at(v, 1),
        dead: int_at(v, 2),
        oldest_lease_ms: int_at(v, 3),
        requeued: int_at(v, 4),
        delayed: int_at(v, 5),
        totals: a.get(6).map(Value::array).unwrap_or_default().to_vec(),
        poison: int_at(v, 7),
        poison_ids: a
            .get(8)
            .map(Value::array)
            .unwrap_or_default()
            .iter()
            .map(|v| Bytes::copy_from_slice(v.bytes()))
            .collect(),
    })
}
