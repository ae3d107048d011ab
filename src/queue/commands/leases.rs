//! QUEUE LEASES queue [COUNT n] [OFFSET o]: the leases that end first.

use bytes::Bytes;

use super::{listed, window_call, Field, Sub};
use crate::queue::library;
use crate::queue::library::lease::place;
use crate::queue::library::op::Op;
use crate::queue::library::value::Value;
use crate::queue::rules::Queue;
use crate::queue::Intercept;

/// QUEUE LEASES queue [COUNT n] [OFFSET o]
pub(super) fn leases(sub: Sub<'_>) -> Intercept {
    let Sub { args, q, how, .. } = sub;
    listed(
        args,
        how,
        |count, offset| leases_op(&q, count, offset),
        shown,
    )
}

/// A lease as the client sees it.
fn shown(l: Lease) -> Vec<(String, Field)> {
    [
        ("id", l.id),
        ("payload", l.payload),
        ("deliveries", l.deliveries),
        ("nacks", l.nacks),
        ("expiries", l.expiries),
        ("expires-in-ms", l.expires_in_ms),
        ("destination", l.destination),
    ]
    .into_iter()
    .map(|(name, v)| {
        let value = match v {
            Value::Int(n) => Field::Int(n),
            Value::Nil => Field::Nil,
            v => Field::Str(Bytes::copy_from_slice(v.bytes())),
        };
        (name.to_string(), value)
    })
    .collect()
}

/// One lease as QUEUE LEASES shows it; a field is an integer or a string
/// as the function gave it, `Nil` where it gave none.
pub struct Lease {
    pub id: Value,
    pub payload: Value,
    pub deliveries: Value,
    pub expires_in_ms: Value,
    /// Empty unless a move form took it.
    pub destination: Value,
    pub nacks: Value,
    pub expiries: Value,
}

/// Where a lease's fields stand in the function's answer: after the ms
/// until its deadline, in the record's own order.
const ID: usize = 1 + place("id");
const PAYLOAD: usize = 1 + place("payload");
const DELIVERIES: usize = 1 + place("deliveries");
const DEST: usize = 1 + place("dest");
const NACKS: usize = 1 + place("nacks");
const EXPIRIES: usize = 1 + place("expiries");

/// Field `i` of a lease: `Nil` only when the function left it out (a null
/// it gave shows as an empty string, as it always has).
fn field(f: &[Value], i: usize) -> Value {
    match f.get(i) {
        None => Value::Nil,
        Some(Value::Nil) => Value::Str(Bytes::new()),
        Some(v) => v.clone(),
    }
}

/// `leases`: the `count` leases that end first after the first `offset`.
fn leases_op(q: &Queue, count: i64, offset: i64) -> Op<Vec<Lease>> {
    Op::new(window_call(&library::LEASES, q, count, offset), |v| {
        Ok(v.array().iter().map(|l| lease(l.array())).collect())
    })
}

fn lease(f: &[Value]) -> Lease {
    Lease {
        expires_in_ms: field(f, 0),
        id: field(f, ID),
        payload: field(f, PAYLOAD),
        deliveries: field(f, DELIVERIES),
        destination: field(f, DEST),
        nacks: field(f, NACKS),
        expiries: field(f, EXPIRIES),
    }
}
