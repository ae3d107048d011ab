//! LREM on a move destination: a removed copy releases its lease.

use std::sync::Arc;

use bytes::Bytes;

use super::{changed, int_reply, rewrite};
use crate::command::{parse_i64, Args};
use crate::queue::leases::registry::Registry;
use crate::queue::library;
use crate::queue::library::call::{Call, CallError};
use crate::queue::library::op::{int_at, Op};
use crate::queue::library::value::Value;
use crate::queue::rules::Queue;
use crate::queue::Intercept;

/// LREM destination count payload, where the destination received messages
/// from a queue's move pops: removing a copy releases its lease.
pub fn lrem(args: Args<'_>, q: &Arc<Queue>, registry: &Arc<Registry>) -> Intercept {
    let (Some(dest), Some(count), Some(payload)) = (args.get(1), args.get(2), args.get(3)) else {
        return Intercept::Pass;
    };
    if args.len() != 4 || parse_i64(count).is_none() {
        return Intercept::Pass;
    }
    let op = Lrem {
        dest,
        q,
        count,
        payload,
    };
    let (q, registry) = (q.clone(), registry.clone());
    rewrite(op, registry.db, move |n| {
        changed(&registry, &q, n);
        int_reply(n)
    })
}

/// `lrem`: LREM on a move destination, `count` copies of `payload`; a
/// removed copy releases its lease. Reply: LREM's own.
pub struct Lrem<'a> {
    pub dest: &'a [u8],
    pub q: &'a Queue,
    pub count: &'a [u8],
    pub payload: &'a [u8],
}

impl Op for Lrem<'_> {
    type Reply = i64;

    fn call(self) -> Call {
        Call::new(&library::LREM)
            .key(Bytes::copy_from_slice(self.dest))
            .queue(self.q)
            .arg(Bytes::copy_from_slice(self.count))
            .arg(Bytes::copy_from_slice(self.payload))
    }

    fn read(v: &Value) -> Result<i64, CallError> {
        Ok(int_at(v, 0))
    }
}
