//! QUEUE REDRIVE queue [COUNT n]: dead letters back to the queue.

use super::job::{above_one_call, Job};
use super::{changed, count_arg, int_reply, job_reply, rewrite, shared_dead_letters, Sub};
use crate::queue::library;
use crate::queue::library::call::Call;
use crate::queue::library::op::{two_ints, Op};
use crate::queue::rules::Queue;
use crate::queue::Intercept;
use crate::resp::reply;

/// Dead letters one QUEUE REDRIVE call moves.
pub const REDRIVE_PER_CALL: i64 = 100;

/// QUEUE REDRIVE queue [COUNT n]: all of them without COUNT.
pub(super) fn redrive(sub: Sub<'_>) -> Intercept {
    let args = sub.args;
    if args.len() == 6 {
        if !args.is(3, "ID") {
            return Intercept::Reply(reply::error("syntax error"));
        }
        return super::dead_one::one_dead_letter(sub, true);
    }
    let Sub {
        q, registry, how, ..
    } = sub;
    let count = match count_arg(args, 3, i64::MAX, i64::MAX) {
        Ok(c) => c,
        Err(e) => return Intercept::Reply(e),
    };
    if let Some(refused) = shared_dead_letters("REDRIVE", &q) {
        return refused;
    }
    if how.one_call && count > REDRIVE_PER_CALL {
        return Intercept::Refuse(if args.len() == 3 {
            reply::error(&format!(
                "ackproxy: QUEUE REDRIVE without COUNT moves every dead letter; inside \
                 MULTI or during a client pause give a COUNT of at most {REDRIVE_PER_CALL}"
            ))
        } else {
            above_one_call("COUNT", &count.to_string(), REDRIVE_PER_CALL)
        });
    }
    let registry = registry.clone();
    if count <= REDRIVE_PER_CALL {
        let op = redrive_op(&q, count);
        let q = q.clone();
        return rewrite(op, registry.db, move |r| {
            changed(&registry, &q, r.moved);
            int_reply(r.moved)
        });
    }
    Intercept::Job(Job::new(move |caller| async move {
        // At most what was dead when the command started (the first call's
        // moved plus left): letters that die meanwhile, behind those, wait
        // for the next REDRIVE, or it would never end while messages die.
        let mut count = count;
        let mut first = true;
        let mut total = 0;
        while total < count {
            let ask = (count - total).min(REDRIVE_PER_CALL);
            match caller.op(redrive_op(&q, ask)).await {
                Ok(r) => {
                    let n = r.moved;
                    total += n;
                    if first {
                        count = count.min(n.saturating_add(r.left.max(0)));
                        first = false;
                    }
                    if n < ask {
                        break;
                    }
                }
                Err(e) => return job_reply(&registry, &q, (total, Some(e))),
            }
        }
        job_reply(&registry, &q, (total, None))
    }))
}

pub struct Redriven {
    pub moved: i64,
    /// Dead letters left after it.
    pub left: i64,
}

/// `redrive`: returns up to `count` dead letters to the queue.
fn redrive_op(q: &Queue, count: i64) -> Op<Redriven> {
    let call = Call::new(&library::REDRIVE).queue_rule(q);
    Op::new(call.arg(count.to_string()), |v| {
        let (moved, left) = two_ints(v);
        Ok(Redriven { moved, left })
    })
}
