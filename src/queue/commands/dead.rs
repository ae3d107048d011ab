//! QUEUE DEAD queue [COUNT n] [OFFSET o]: the oldest dead letters with
//! their histories.

use super::{listed, window_call, Field, Sub};
use crate::queue::library;
use crate::queue::library::op::Op;
use crate::queue::library::value::Value;
use crate::queue::rules::Queue;
use crate::queue::Intercept;

/// QUEUE DEAD queue [COUNT n] [OFFSET o]
pub(super) fn dead(sub: Sub<'_>) -> Intercept {
    let Sub { args, q, how, .. } = sub;
    listed(args, how, |count, offset| dead_op(&q, count, offset), shown)
}

/// A dead letter as the client sees it.
fn shown(l: DeadLetter) -> Vec<(String, Field)> {
    [
        "payload",
        "id",
        "deliveries",
        "nacks",
        "expiries",
        "first-delivery-ms",
        "last-delivery-ms",
        "last-reason",
        "dead-lettered-ms",
    ]
    .iter()
    .zip(l.fields)
    .map(|(name, v)| {
        let value = match v {
            Value::Int(n) => Field::Int(n),
            Value::Str(s) => Field::Str(s),
            // No history kept (dropped past the bound, or the payload was
            // put there by something else).
            _ => Field::Nil,
        };
        (name.to_string(), value)
    })
    .collect()
}

/// A dead letter: its payload, then its history (id, deliveries, NACKs,
/// expiries, first and last delivery, last reason, when it died), each
/// `Nil` where none was kept.
pub struct DeadLetter {
    pub fields: [Value; DEAD_FIELDS],
}

/// Payload and history fields of a dead letter, in the function's order.
pub const DEAD_FIELDS: usize = 9;

/// `dead`: the `count` oldest dead letters after the `offset` oldest, with
/// their histories.
fn dead_op(q: &Queue, count: i64, offset: i64) -> Op<Vec<DeadLetter>> {
    Op::new(window_call(&library::DEAD, q, count, offset), |v| {
        Ok(v.array().iter().map(|l| dead_letter(l.array())).collect())
    })
}

fn dead_letter(f: &[Value]) -> DeadLetter {
    DeadLetter {
        fields: std::array::from_fn(|i| match f.get(i) {
            Some(v @ (Value::Int(_) | Value::Str(_))) => v.clone(),
            _ => Value::Nil,
        }),
    }
}
