//! NACK queue id [id ...] [DELAY ms]: leased messages back to their
//! queue, at once, after the rule's backoff, or after the delay.

use std::sync::Arc;

use bytes::Bytes;

use super::expire_move::expire_move;
use super::job::Job;
use super::{
    changed, int_reply, leased_target, rewrite, too_many_ids, trailing_ms, IDS_PER_CALL,
    MAX_DURATION_MS,
};
use crate::command::Args;
use crate::queue::leases::registry::Registry;
use crate::queue::library;
use crate::queue::library::call::Call;
use crate::queue::library::op::{int_at, moves, Moves, Op};
use crate::queue::rules::{Queue, Rules};
use crate::queue::Intercept;

/// NACK queue id [id ...] [DELAY ms]
pub fn nack(args: Args<'_>, rules: &Rules, registry: &Arc<Registry>, one_call: bool) -> Intercept {
    let q = match leased_target(args, rules, "nack") {
        Ok(q) => q,
        Err(e) => return Intercept::Reply(e),
    };
    let (end, delay) = match trailing_ms(args, 2, &[("DELAY", MAX_DURATION_MS)]) {
        Ok(t) => t,
        Err(e) => return Intercept::Reply(e),
    };
    let delay = delay.map(|(_, ms)| ms);
    let ids: Vec<Bytes> = args
        .iter()
        .take(end)
        .skip(2)
        .map(Bytes::copy_from_slice)
        .collect();
    if one_call && ids.len() > IDS_PER_CALL {
        return too_many_ids(ids.len());
    }
    if one_call {
        // Move leases are only marked here; the reaper ends them.
        registry.touch(&q.name);
        let op = nack_op(&q, delay, &ids);
        let registry = registry.clone();
        let q = q.clone();
        return rewrite(op, registry.db, move |nacked| {
            changed(&registry, &q, nacked.ended);
            int_reply(nacked.ended)
        });
    }
    let registry = registry.clone();
    Intercept::Job(Job::new(move |caller| async move {
        let mut total = 0;
        for chunk in ids.chunks(IDS_PER_CALL) {
            let op = nack_op(&q, delay, chunk);
            let nacked = match caller.op(op).await {
                Ok(n) => n,
                Err(e) => return e.to_reply(),
            };
            total += nacked.ended;
            // Move leases: their stale copy leaves the destination and the
            // message is back in the queue before the client hears back.
            for (token, dest) in &nacked.moves {
                expire_move(&caller, &q, dest, token).await;
            }
        }
        // Messages waiting for their delay are due later: the reaper looks.
        registry.touch(&q.name);
        int_reply(total)
    }))
}

/// What a NACK call did.
pub struct Nacked {
    pub ended: i64,
    /// Move leases only marked (see [`Moves`]).
    pub moves: Moves,
}

/// `nack`: returns the messages of `ids` to the queue, at once, after the
/// rule's retry backoff, or after `delay` ms.
fn nack_op(q: &Queue, delay: Option<i64>, ids: &[Bytes]) -> Op<Nacked> {
    let delay = delay.map(|ms| ms.to_string()).unwrap_or_default();
    let mut call = Call::new(&library::NACK).queue_rule(q).arg(delay);
    call.argv.extend(ids.iter().cloned());
    Op::new(call, |v| {
        let items = v.array();
        Ok(Nacked {
            ended: int_at(v, 0),
            moves: moves(items.get(1..).unwrap_or_default()),
        })
    })
}
