//! QUEUE EXTEND queue id ms: the leases of an id renewed.

use bytes::Bytes;

use super::{int_reply, rewrite, Sub, MAX_DURATION_MS};
use crate::command::parse_i64;
use crate::queue::library;
use crate::queue::library::call::Call;
use crate::queue::library::op::Op;
use crate::queue::rules::Queue;
use crate::queue::Intercept;
use crate::resp::reply;

/// QUEUE EXTEND queue id ms
pub(super) fn extend(sub: Sub<'_>) -> Intercept {
    let Sub {
        args, q, registry, ..
    } = sub;
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
    let id = Bytes::copy_from_slice(args.get(3).unwrap_or_default());
    rewrite(renew(&q, id, ms), registry.db, int_reply)
}

/// `extend`: renews the leases of `id` for `ms` from now. Reply: how many.
fn renew(q: &Queue, id: Bytes, ms: i64) -> Op<i64> {
    let call = Call::new(&library::EXTEND).queue(q).arg(id);
    Op::new(call.arg(ms.to_string()), |v| Ok(v.int()))
}
