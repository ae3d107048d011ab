//! QUEUE EXTEND queue id ms: the leases of an id renewed.

use std::sync::Arc;

use bytes::Bytes;

use super::{int_reply, rewrite, MAX_DURATION_MS};
use crate::command::{parse_i64, Args};
use crate::queue::leases::registry::Registry;
use crate::queue::library;
use crate::queue::library::call::{Call, CallError};
use crate::queue::library::op::Op;
use crate::queue::library::value::Value;
use crate::queue::rules::Queue;
use crate::queue::Intercept;
use crate::resp::reply;

/// QUEUE EXTEND queue id ms
pub(super) fn extend(args: Args<'_>, q: Arc<Queue>, registry: &Registry) -> Intercept {
    let Some(ms) = args
        .get(4)
        .and_then(parse_i64)
        .filter(|&ms| ms > 0 && ms <= MAX_DURATION_MS)
    else {
        return Intercept::Reply(reply::error(&format!(
            "value is out of range, must be positive and at most {MAX_DURATION_MS}"
        )));
    };
    // A shorter lease may now be due before the reaper expected.
    registry.touch(&q.name);
    let op = Extend {
        q: &q,
        id: Bytes::copy_from_slice(args.get(3).unwrap_or_default()),
        ms,
    };
    rewrite(op, registry.db, int_reply)
}

/// `extend`: renews the leases of `id` for `ms` from now. Reply: how many.
pub struct Extend<'a> {
    pub q: &'a Queue,
    pub id: Bytes,
    pub ms: i64,
}

impl Op for Extend<'_> {
    type Reply = i64;

    fn call(self) -> Call {
        Call::new(&library::EXTEND)
            .queue(self.q)
            .arg(self.id)
            .arg(self.ms.to_string())
    }

    fn read(v: &Value) -> Result<i64, CallError> {
        Ok(v.int())
    }
}
