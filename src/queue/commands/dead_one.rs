//! QUEUE REDRIVE queue ID id payload and QUEUE PURGE queue DEAD ID id
//! payload: one dead letter, named by its id and payload.

use bytes::Bytes;

use super::{counted, shared_refusal, Sub};
use crate::queue::library;
use crate::queue::library::call::Call;
use crate::queue::library::op::{first_int, Op};
use crate::queue::rules::Queue;
use crate::queue::Intercept;

/// QUEUE REDRIVE queue ID id payload (`redrive`), QUEUE PURGE queue DEAD
/// ID id payload: the last two arguments name one dead letter. Its id, from
/// the queue's own histories, is what makes it this queue's on a shared
/// list; one without a history (an empty id) could be any queue's there.
pub(super) fn one_dead_letter(sub: Sub<'_>, redrive: bool) -> Intercept {
    let Sub {
        args, q, registry, ..
    } = sub;
    let n = args.len();
    let (id, payload) = (
        args.get(n - 2).unwrap_or_default(),
        args.get(n - 1).unwrap_or_default(),
    );
    let sub = if redrive { "REDRIVE" } else { "PURGE" };
    if id.is_empty() {
        let because =
            "a dead letter without an id has no history of this queue to say it is this queue's";
        if let Some(refused) = shared_refusal(sub, &q, because) {
            return refused;
        }
    }
    counted(dead_one(&q, redrive, id, payload), &q, registry)
}

/// `dead_one`: redrives (`redrive`) or deletes the one dead letter with
/// this id and payload. Reply: 1, or 0 if there is none.
fn dead_one(q: &Queue, redrive: bool, id: &[u8], payload: &[u8]) -> Op<i64> {
    let call = Call::new(&library::DEAD_ONE)
        .queue_rule(q)
        .arg(Bytes::from_static(if redrive { b"R" } else { b"D" }))
        .arg(Bytes::copy_from_slice(id));
    Op::new(call.arg(Bytes::copy_from_slice(payload)), first_int)
}
