//! NACK queue id [id ...] [DELAY ms]: leased messages back to their
//! queue, at once, after the rule's backoff, or after the delay.

use std::sync::Arc;

use bytes::Bytes;

use super::expire_move::expire_move;
use super::job::Job;
use super::{
    changed, int_reply, resolve_leased, rewrite, too_many_ids, trailing_ms, wrong_arity,
    IDS_PER_CALL, MAX_DURATION_MS,
};
use crate::command::Args;
use crate::queue::leases::registry::Registry;
use crate::queue::library;
use crate::queue::library::call::{Call, CallError};
use crate::queue::library::op::{int_at, moves, Moves, Op};
use crate::queue::library::value::Value;
use crate::queue::rules::{Queue, Rules};
use crate::queue::Intercept;

/// NACK queue id [id ...] [DELAY ms]
pub fn nack(args: Args<'_>, rules: &Rules, registry: &Arc<Registry>, one_call: bool) -> Intercept {
    if args.len() < 3 {
        return wrong_arity("nack");
    }
    let q = match resolve_leased(rules, args.get(1)) {
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
        let op = Nack {
            q: &q,
            delay,
            ids: &ids,
        };
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
            let op = Nack {
                q: &q,
                delay,
                ids: chunk,
            };
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

/// `nack`: returns the messages of `ids` to the queue, at once, after the
/// rule's retry backoff, or after `delay` ms.
pub struct Nack<'a> {
    pub q: &'a Queue,
    pub delay: Option<i64>,
    pub ids: &'a [Bytes],
}

/// What a NACK call did.
pub struct Nacked {
    pub ended: i64,
    /// Move leases only marked (see [`Moves`]).
    pub moves: Moves,
}

impl Op for Nack<'_> {
    type Reply = Nacked;

    fn call(self) -> Call {
        let delay = self.delay.map(|ms| ms.to_string()).unwrap_or_default();
        let mut call = Call::new(&library::NACK).queue_rule(self.q).arg(delay);
        call.argv.extend(self.ids.iter().cloned());
        call
    }

    fn read(v: &Value) -> Result<Nacked, CallError> {
        let items = v.array();
        Ok(Nacked {
            ended: int_at(v, 0),
            moves: moves(items.get(1..).unwrap_or_default()),
        })
    }
}
