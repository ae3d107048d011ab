//! QUEUE DEAD queue [COUNT n] [OFFSET o]: the oldest dead letters with
//! their histories.

use std::sync::Arc;

use bytes::BytesMut;

use super::{map_reply, rewrite, window_args, Field, Shape};
use crate::command::Args;
use crate::queue::library;
use crate::queue::library::call::{Call, CallError};
use crate::queue::library::op::Op;
use crate::queue::library::value::Value;
use crate::queue::rules::Queue;
use crate::queue::Intercept;
use crate::resp::reply;

/// QUEUE DEAD queue [COUNT n] [OFFSET o]
pub(super) fn dead(args: Args<'_>, q: Arc<Queue>, how: Shape) -> Intercept {
    let (count, offset) = match window_args(args, 3) {
        Ok(w) => w,
        Err(e) => return Intercept::Reply(e),
    };
    let op = Dead {
        q: &q,
        count,
        offset,
    };
    rewrite(op, how.db, move |letters| {
        let mut out = BytesMut::new();
        reply::array(&mut out, letters.len());
        for l in letters {
            let fields: Vec<(String, Field)> = [
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
                    // No history kept (dropped past the bound, or the
                    // payload was put there by something else).
                    _ => Field::Nil,
                };
                (name.to_string(), value)
            })
            .collect();
            map_reply(&mut out, &fields, how.protocol);
        }
        out.freeze()
    })
}

/// `dead`: the `count` oldest dead letters after the `offset` oldest, with
/// their histories.
pub struct Dead<'a> {
    pub q: &'a Queue,
    pub count: i64,
    pub offset: i64,
}

/// A dead letter: its payload, then its history (id, deliveries, NACKs,
/// expiries, first and last delivery, last reason, when it died), each
/// `Nil` where none was kept.
pub struct DeadLetter {
    pub fields: [Value; DEAD_FIELDS],
}

/// Payload and history fields of a dead letter, in the function's order.
pub const DEAD_FIELDS: usize = 9;

impl Op for Dead<'_> {
    type Reply = Vec<DeadLetter>;

    fn call(self) -> Call {
        Call::new(&library::DEAD)
            .queue(self.q)
            .arg(self.count.to_string())
            .arg(self.offset.to_string())
    }

    fn read(v: &Value) -> Result<Vec<DeadLetter>, CallError> {
        Ok(v.array()
            .iter()
            .map(|l| {
                let f = l.array();
                DeadLetter {
                    fields: std::array::from_fn(|i| match f.get(i) {
                        Some(v @ (Value::Int(_) | Value::Str(_))) => v.clone(),
                        _ => Value::Nil,
                    }),
                }
            })
            .collect())
    }
}
