//! The end of an expired or nacked move lease, whose stale copy sits in a
//! destination list the pop, reap or NACK call that found it was not
//! given: no client command, the follow-up of NACK, the reaper and a
//! closed connection.

use bytes::Bytes;

use crate::queue::library;
use crate::queue::library::call::{Call, Caller};
use crate::queue::library::op::{two_ints, Op};
use crate::queue::rules::Queue;

/// Ends one expired (or nacked) move lease, removing its stale copy from
/// `dest` first.
pub async fn expire_move(caller: &Caller, q: &Queue, dest: &[u8], token: &[u8]) -> Ended {
    // Redis away or refusing: the lease stays, and the reaper tries again.
    caller
        .op(expire_move_op(q, dest, token))
        .await
        .unwrap_or_default()
}

/// Messages back in their queue and messages dead-lettered.
#[derive(Default, Clone, Copy)]
pub struct Ended {
    pub requeued: i64,
    pub dead: i64,
}

/// `expire_move`: ends one expired (or nacked) move lease, its stale copy
/// taken out of `dest` first.
fn expire_move_op(q: &Queue, dest: &[u8], token: &[u8]) -> Op<Ended> {
    let call = Call::new(&library::EXPIRE_MOVE)
        .queue(q)
        .key(Bytes::copy_from_slice(dest))
        .rule(q);
    Op::new(call.arg(Bytes::copy_from_slice(token)), |v| {
        let (requeued, dead) = two_ints(v);
        Ok(Ended { requeued, dead })
    })
}
