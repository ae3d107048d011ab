//! The end of an expired or nacked move lease, whose stale copy sits in a
//! destination list the pop, reap or NACK call that found it was not
//! given: no client command, the follow-up of NACK, the reaper and a
//! closed connection.

use bytes::Bytes;

use crate::queue::library;
use crate::queue::library::call::{Call, CallError, Caller};
use crate::queue::library::op::{int_at, Op};
use crate::queue::library::value::Value;
use crate::queue::rules::Queue;

/// Ends one expired (or nacked) move lease, removing its stale copy from
/// `dest` first.
pub async fn expire_move(caller: &Caller, q: &Queue, dest: &[u8], token: &[u8]) -> Ended {
    // Redis away or refusing: the lease stays, and the reaper tries again.
    caller
        .op(ExpireMove { q, dest, token })
        .await
        .unwrap_or_default()
}

/// `expire_move`: ends one expired (or nacked) move lease, its stale copy
/// taken out of `dest` first.
pub struct ExpireMove<'a> {
    pub q: &'a Queue,
    pub dest: &'a [u8],
    pub token: &'a [u8],
}

/// Messages back in their queue and messages dead-lettered.
#[derive(Default, Clone, Copy)]
pub struct Ended {
    pub requeued: i64,
    pub dead: i64,
}

impl Op for ExpireMove<'_> {
    type Reply = Ended;

    fn call(self) -> Call {
        Call::new(&library::EXPIRE_MOVE)
            .queue(self.q)
            .key(Bytes::copy_from_slice(self.dest))
            .rule(self.q)
            .arg(Bytes::copy_from_slice(self.token))
    }

    fn read(v: &Value) -> Result<Ended, CallError> {
        Ok(Ended {
            requeued: int_at(v, 0),
            dead: int_at(v, 1),
        })
    }
}
