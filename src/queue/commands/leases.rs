//! QUEUE LEASES queue [COUNT n] [OFFSET o]: the leases that end first.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::{map_reply, rewrite, window_args, Field, Shape};
use crate::command::Args;
use crate::queue::library;
use crate::queue::library::call::{Call, CallError};
use crate::queue::library::op::Op;
use crate::queue::library::value::Value;
use crate::queue::rules::Queue;
use crate::queue::Intercept;
use crate::resp::reply;

/// QUEUE LEASES queue [COUNT n] [OFFSET o]
pub(super) fn leases(args: Args<'_>, q: Arc<Queue>, how: Shape) -> Intercept {
    let (count, offset) = match window_args(args, 3) {
        Ok(w) => w,
        Err(e) => return Intercept::Reply(e),
    };
    let op = Leases {
        q: &q,
        count,
        offset,
    };
    rewrite(op, how.db, move |leases| {
        let mut out = BytesMut::new();
        reply::array(&mut out, leases.len());
        for l in leases {
            let fields: Vec<(String, Field)> = [
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
            .collect();
            map_reply(&mut out, &fields, how.protocol);
        }
        out.freeze()
    })
}

/// `leases`: the `count` leases that end first after the first `offset`.
pub struct Leases<'a> {
    pub q: &'a Queue,
    pub count: i64,
    pub offset: i64,
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

/// Field `i` of a lease: `Nil` only when the function left it out (a null
/// it gave shows as an empty string, as it always has).
fn field(f: &[Value], i: usize) -> Value {
    match f.get(i) {
        None => Value::Nil,
        Some(Value::Nil) => Value::Str(Bytes::new()),
        Some(v) => v.clone(),
    }
}

impl Op for Leases<'_> {
    type Reply = Vec<Lease>;

    fn call(self) -> Call {
        Call::new(&library::LEASES)
            .queue(self.q)
            .arg(self.count.to_string())
            .arg(self.offset.to_string())
    }

    fn read(v: &Value) -> Result<Vec<Lease>, CallError> {
        Ok(v.array()
            .iter()
            .map(|l| {
                let f = l.array();
                Lease {
                    id: field(f, 0),
                    payload: field(f, 1),
                    deliveries: field(f, 2),
                    expires_in_ms: field(f, 3),
                    destination: field(f, 4),
                    nacks: field(f, 5),
                    expiries: field(f, 6),
                }
            })
            .collect())
    }
}
