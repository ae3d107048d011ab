//! QUEUE PURGE queue DEAD: the dead letters and their histories deleted.

use super::{counted, shared_dead_letters, Sub};
use crate::queue::library;
use crate::queue::library::call::Call;
use crate::queue::library::op::Op;
use crate::queue::rules::Queue;
use crate::queue::Intercept;
use crate::resp::reply;

/// QUEUE PURGE queue DEAD
pub(super) fn purge(sub: Sub<'_>) -> Intercept {
    let args = sub.args;
    if !args.is(3, "DEAD") || (args.len() == 7 && !args.is(4, "ID")) {
        return Intercept::Reply(reply::error("syntax error"));
    }
    if args.len() == 7 {
        return super::dead_one::one_dead_letter(sub, false);
    }
    let Sub { q, registry, .. } = sub;
    if let Some(refused) = shared_dead_letters("PURGE", &q) {
        return refused;
    }
    counted(purge_dead(&q), &q, registry)
}

/// `purge`: deletes the dead letters and their histories. Reply: how many.
fn purge_dead(q: &Queue) -> Op<i64> {
    Op::new(Call::new(&library::PURGE).queue(q), |v| Ok(v.int()))
}
