//! QUEUE REDRIVE queue ID id payload and QUEUE PURGE queue DEAD ID id
//! payload: one dead letter, named by its id and payload.

use std::sync::Arc;

use bytes::Bytes;

use super::{changed, int_reply, rewrite, shared_refusal};
use crate::command::Args;
use crate::queue::leases::registry::Registry;
use crate::queue::library;
use crate::queue::library::call::{Call, CallError};
use crate::queue::library::op::{int_at, Op};
use crate::queue::library::value::Value;
use crate::queue::rules::Queue;
use crate::queue::Intercept;

/// QUEUE REDRIVE queue ID id payload (`redrive`), QUEUE PURGE queue DEAD
/// ID id payload: the last two arguments name one dead letter. Its id, from
/// the queue's own histories, is what makes it this queue's on a shared
/// list; one without a history (an empty id) could be any queue's there.
pub(super) fn one_dead_letter(
    args: Args<'_>,
    q: Arc<Queue>,
    registry: &Arc<Registry>,
    redrive: bool,
) -> Intercept {
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
    let op = DeadOne {
        q: &q,
        redrive,
        id,
        payload,
    };
    let (q, registry) = (q.clone(), registry.clone());
    rewrite(op, registry.db, move |n| {
        changed(&registry, &q, n);
        int_reply(n)
    })
}

/// `dead_one`: redrives (`redrive`) or deletes the one dead letter with
/// this id and payload. Reply: 1, or 0 if there is none.
pub struct DeadOne<'a> {
    pub q: &'a Queue,
    pub redrive: bool,
    pub id: &'a [u8],
    pub payload: &'a [u8],
}

impl Op for DeadOne<'_> {
    type Reply = i64;

    fn call(self) -> Call {
        Call::new(&library::DEAD_ONE)
            .queue(self.q)
            .rule(self.q)
            .arg(Bytes::from_static(if self.redrive { b"R" } else { b"D" }))
            .arg(Bytes::copy_from_slice(self.id))
            .arg(Bytes::copy_from_slice(self.payload))
    }

    fn read(v: &Value) -> Result<i64, CallError> {
        Ok(int_at(v, 0))
    }
}
