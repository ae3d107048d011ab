//! LREM on a move destination: a removed copy releases its lease.

use std::sync::Arc;

use bytes::Bytes;

use super::counted;
use crate::command::{parse_i64, Args};
use crate::queue::leases::registry::Registry;
use crate::queue::library;
use crate::queue::library::call::Call;
use crate::queue::library::op::{first_int, Op};
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
    counted(lrem_op(dest, q, count, payload), q, registry)
}

/// `lrem`: LREM on a move destination, `count` copies of `payload`; a
/// removed copy releases its lease. Reply: LREM's own.
fn lrem_op(dest: &[u8], q: &Queue, count: &[u8], payload: &[u8]) -> Op<i64> {
    let call = Call::new(&library::LREM)
        .key(Bytes::copy_from_slice(dest))
        .queue(q)
        .arg(Bytes::copy_from_slice(count));
    Op::new(call.arg(Bytes::copy_from_slice(payload)), first_int)
}
