//! QUEUE PUSH queue payload [payload ...] [DELAY ms | AT unix-ms].

use bytes::Bytes;

use super::job::{above_one_call, Job};
use super::{
    changed, in_chunks, int_reply, job_reply, rewrite, trailing_ms, Sub, MAX_AT_MS, MAX_DURATION_MS,
};
use crate::command::Args;
use crate::queue::leases::registry::Registry;
use crate::queue::library;
use crate::queue::library::call::Call;
use crate::queue::library::op::{int_at, Op};
use crate::queue::library::value::Value;
use crate::queue::rules::Queue;
use crate::queue::Intercept;

/// Messages one QUEUE PUSH call takes: a delayed one costs a sequence
/// number and a sorted-set insert, a few µs.
pub const PUSH_PER_CALL: usize = 100;
/// When QUEUE PUSH makes its messages due.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Due {
    Now,
    /// Milliseconds from now (Redis time).
    Delay(i64),
    /// Unix time in milliseconds (Redis time).
    At(i64),
}

/// The payloads and due time of `QUEUE PUSH queue payload [payload ...]
/// [DELAY ms | AT unix-ms]`; else the error reply.
pub fn parse_push(args: Args<'_>) -> Result<(Vec<Bytes>, Due), Bytes> {
    let options = [("DELAY", MAX_DURATION_MS), ("AT", MAX_AT_MS)];
    let (end, option) = trailing_ms(args, 3, &options)?;
    let due = match option {
        None => Due::Now,
        Some((0, ms)) => Due::Delay(ms),
        Some((_, ms)) => Due::At(ms),
    };
    let payloads = args
        .iter()
        .take(end)
        .skip(3)
        .map(Bytes::copy_from_slice)
        .collect();
    Ok((payloads, due))
}

/// After a delayed push: the reaper looks at the queue when the messages
/// are due (`ms` from now, as the script measured it on Redis's clock).
fn note_delayed(registry: &Registry, q: &Queue, pushed: &Pushed) {
    if let Some(ms) = pushed.due_in_ms {
        let wait = std::time::Duration::from_millis(ms as u64)
            .min(crate::queue::leases::registry::MAX_WAIT);
        registry.note(&q.name, tokio::time::Instant::now() + wait);
    }
}

/// QUEUE PUSH queue payload [payload ...] [DELAY ms | AT unix-ms]
pub(super) fn push(sub: Sub<'_>) -> Intercept {
    let Sub {
        args,
        q,
        registry,
        how,
    } = sub;
    let (payloads, due) = match parse_push(args) {
        Ok(p) => p,
        Err(e) => return Intercept::Reply(e),
    };
    if how.one_call && payloads.len() > PUSH_PER_CALL {
        return Intercept::Refuse(above_one_call(
            "number of messages",
            &payloads.len().to_string(),
            PUSH_PER_CALL,
        ));
    }
    let registry = registry.clone();
    if payloads.len() <= PUSH_PER_CALL {
        let op = push_op(&q, due, &payloads);
        let q = q.clone();
        return rewrite(op, registry.db, move |pushed| {
            note_delayed(&registry, &q, &pushed);
            changed(&registry, &q, pushed.accepted);
            int_reply(pushed.accepted)
        });
    }
    Intercept::Job(Job::new(move |caller| async move {
        let op = |payloads: &[Bytes]| push_op(&q, due, payloads);
        let done = in_chunks(&caller, &payloads, PUSH_PER_CALL, op, |pushed| {
            note_delayed(&registry, &q, &pushed);
            pushed.accepted
        })
        .await;
        job_reply(&registry, &q, done)
    }))
}

/// What a push call did.
pub struct Pushed {
    pub accepted: i64,
    /// Ms until the messages are due; `None` when they were pushed now.
    pub due_in_ms: Option<i64>,
}

/// `push`: QUEUE PUSH's messages (at most `PUSH_PER_CALL`), now or when
/// due.
fn push_op(q: &Queue, due: Due, payloads: &[Bytes]) -> Op<Pushed> {
    let (when, ms): (&'static [u8], Bytes) = match due {
        Due::Now => (b"", Bytes::new()),
        Due::Delay(ms) => (b"D", Bytes::from(ms.to_string())),
        Due::At(ms) => (b"A", Bytes::from(ms.to_string())),
    };
    let mut call = Call::new(&library::PUSH).queue_rule(q);
    call = call.arg(Bytes::from_static(when)).arg(ms);
    call.argv.extend(payloads.iter().cloned());
    Op::new(call, |v| {
        let due = v.array().get(1).map(Value::int).unwrap_or(-1);
        Ok(Pushed {
            accepted: int_at(v, 0),
            due_in_ms: (due >= 0).then_some(due),
        })
    })
}
