//! The proxy's own commands — ACK, NACK, QUEUE and its subcommands — and
//! LREM on a move destination: one file each, holding its parsing, its
//! function call (the operation's keys and arguments, in the order the
//! header of its `lua/` file states, and the reader of its reply) and the
//! client's reply. Here: what they share, and the QUEUE dispatcher.

mod ack;
mod dead;
mod dead_one;
pub mod docs;
mod expire_move;
mod extend;
mod help;
mod info;
pub mod job;
mod leases;
mod lrem;
mod nack;
mod purge;
mod push;
mod redrive;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::command::{parse_i64, Args};
use crate::queue::leases::registry::Registry;
use crate::queue::library::call::{Call, CallError, Caller, ScriptReply};
use crate::queue::library::op::Op;
use crate::queue::library::Function;
use crate::queue::rules::{Queue, Rules};
use crate::queue::Intercept;
use crate::resp::reply;
pub use ack::{ack, ack_op, count_acks};
pub use expire_move::expire_move;
pub use help::HELP;
pub use info::info_op;
use job::above_one_call;
pub use lrem::lrem;
pub use nack::nack;
pub use push::PUSH_PER_CALL;
pub use redrive::REDRIVE_PER_CALL;

fn wrong_arity(cmd: &str) -> Bytes {
    reply::error(&format!(
        "wrong number of arguments for '{}' command",
        cmd.to_ascii_lowercase()
    ))
}

fn not_a_queue(key: &[u8]) -> Bytes {
    let name: String = String::from_utf8_lossy(key)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    reply::error(&format!("no queue rule matches key '{name}'"))
}

/// Operation `op` in database `db`, its reply made the client's by
/// `build`.
fn rewrite<R, F>(op: Op<R>, db: i64, mut build: F) -> Intercept
where
    R: 'static,
    F: FnMut(R) -> Bytes + Send + 'static,
{
    let Op { call, read } = op;
    Intercept::Rewrite {
        request: call.request_in(db),
        transform: ScriptReply::boxed(call, db, move |v| match read(&v) {
            Ok(r) => build(r),
            Err(e) => e.to_reply(),
        }),
    }
}

/// A job's calls of `op` on `items`, `per_call` at a time, adding up what
/// `count` makes of each reply: the total, and the error of the call that
/// failed, if one did (no call is made after it).
async fn in_chunks<T, R>(
    caller: &Caller,
    items: &[T],
    per_call: usize,
    op: impl Fn(&[T]) -> Op<R>,
    mut count: impl FnMut(R) -> i64,
) -> (i64, Option<CallError>) {
    let mut total = 0;
    for chunk in items.chunks(per_call) {
        match caller.op(op(chunk)).await {
            Ok(r) => total += count(r),
            Err(e) => return (total, Some(e)),
        }
    }
    (total, None)
}

/// The reply of a job that did `total` things to `q`: the total, or the
/// error of the call that failed. The gauges sample `q` again.
fn job_reply(registry: &Registry, q: &Queue, (total, failed): (i64, Option<CallError>)) -> Bytes {
    changed(registry, q, total);
    failed.map_or_else(|| int_reply(total), |e| e.to_reply())
}

/// QUEUE LEASES and DEAD: `[COUNT n] [OFFSET o]` from argument 3 on, the
/// operation `op` makes of them, and each item of its reply as a map of
/// `fields`.
fn listed<R: 'static>(
    args: Args<'_>,
    how: Shape,
    op: impl FnOnce(i64, i64) -> Op<Vec<R>>,
    fields: fn(R) -> Vec<(String, Field)>,
) -> Intercept {
    let (count, offset) = match window_args(args, 3) {
        Ok(w) => w,
        Err(e) => return Intercept::Reply(e),
    };
    rewrite(op(count, offset), how.db, move |items| {
        let mut out = BytesMut::new();
        reply::array(&mut out, items.len());
        for item in items {
            map_reply(&mut out, &fields(item), how.protocol);
        }
        out.freeze()
    })
}

/// The queue of ACK and NACK (`cmd`) `queue id [id ...]`, also under a
/// rule a reload removed: what ends a lease works for the leases taken
/// under it. Else the error reply.
fn leased_target(args: Args<'_>, rules: &Rules, cmd: &str) -> Result<Arc<Queue>, Bytes> {
    if args.len() < 3 {
        return Err(wrong_arity(cmd));
    }
    resolve_leased(rules, args.get(1))
}

/// An operation whose reply is how many things it did to `q`, that many
/// the client's reply.
fn counted(op: Op<i64>, q: &Arc<Queue>, registry: &Arc<Registry>) -> Intercept {
    let (q, registry) = (q.clone(), registry.clone());
    rewrite(op, registry.db, move |n| {
        changed(&registry, &q, n);
        int_reply(n)
    })
}

fn int_reply(v: i64) -> Bytes {
    // An ACK's usual answers, without an allocation.
    match v {
        0 => return Bytes::from_static(b":0\r\n"),
        1 => return Bytes::from_static(b":1\r\n"),
        _ => {}
    }
    let mut out = BytesMut::new();
    reply::integer(&mut out, v);
    out.freeze()
}

/// The queue `key` names; else the error reply for it.
fn resolve(rules: &Rules, key: Option<&[u8]>) -> Result<Arc<Queue>, Bytes> {
    let key = key.unwrap_or_default();
    rules.resolve(key).ok_or_else(|| not_a_queue(key))
}

/// The same, also under a rule a reload removed: what ends a lease works
/// for the leases taken under it.
fn resolve_leased(rules: &Rules, key: Option<&[u8]>) -> Result<Arc<Queue>, Bytes> {
    let key = key.unwrap_or_default();
    rules.resolve_leased(key).ok_or_else(|| not_a_queue(key))
}

/// Ids acknowledged or nacked per script call: about 10 µs each.
pub const IDS_PER_CALL: usize = 50;
/// The longest duration a client may give: 30 days, for the lease QUEUE
/// EXTEND grants, NACK's DELAY and QUEUE PUSH's DELAY. A lease that never
/// ends would keep its message from everyone for good, and a delay of
/// centuries is a mistake, not a plan.
pub const MAX_DURATION_MS: i64 = crate::config::MAX_DURATION_MS as i64;
/// The latest time QUEUE PUSH's AT accepts: 3000-01-01T00:00:00Z. AT is a
/// point on Redis's clock, which the proxy does not read, so it cannot be
/// held to [`MAX_DURATION_MS`] from now; this only refuses the absurd.
pub const MAX_AT_MS: i64 = 32_503_680_000_000;

/// After an operation that did `n` things to `q` (released, pushed,
/// moved...): the gauges sample it again.
fn changed(registry: &Registry, q: &Queue, n: i64) {
    if n != 0 {
        registry.changed(&q.name);
    }
}

fn too_many_ids(n: usize) -> Intercept {
    Intercept::Refuse(above_one_call(
        "number of ids",
        &n.to_string(),
        IDS_PER_CALL,
    ))
}

/// Where a command's values end, and the trailing option found after them:
/// its index in the options asked for, and its number.
type Trailing = (usize, Option<(usize, i64)>);

/// A trailing `<OPTION> <ms>` (one of `options`, any case, each with the
/// largest number it takes) after at least one value from `args[first]`
/// on: where the values end, and which option with its number if present.
/// Options before the last two arguments, or with no value before them,
/// are values themselves (`NACK q DELAY 5` acknowledges the ids `DELAY`
/// and `5`). Else the error reply.
fn trailing_ms(args: Args<'_>, first: usize, options: &[(&str, i64)]) -> Result<Trailing, Bytes> {
    let n = args.len();
    if n < first + 3 {
        return Ok((n, None));
    }
    let Some(which) = options.iter().position(|(o, _)| args.is(n - 2, o)) else {
        return Ok((n, None));
    };
    let ms = args
        .get(n - 1)
        .and_then(parse_i64)
        .filter(|&ms| ms >= 0)
        .ok_or_else(|| reply::error("value is not an integer or out of range"))?;
    let max = options[which].1;
    if ms > max {
        return Err(reply::error(&format!(
            "value is out of range, must be at most {max}"
        )));
    }
    Ok((n - 2, Some((which, ms))))
}

/// QUEUE subcommand ...
pub fn queue(args: Args<'_>, rules: &Rules, registry: &Arc<Registry>, how: Shape) -> Intercept {
    let Some(sub_raw) = args.get(1) else {
        return Intercept::Reply(wrong_arity("queue"));
    };
    let sub = String::from_utf8_lossy(sub_raw).to_ascii_uppercase();
    let n = args.len();
    let arity_ok = match sub.as_str() {
        "HELP" => n == 2,
        "EXTEND" => n == 5,
        "INFO" => n == 3,
        "LEASES" => n == 3 || n == 5 || n == 7,
        "PUSH" => n >= 4,
        "DEAD" => n == 3 || n == 5 || n == 7,
        "REDRIVE" => n == 3 || n == 5 || n == 6,
        "PURGE" => n == 4 || n == 7,
        _ => {
            let shown: String = String::from_utf8_lossy(sub_raw)
                .chars()
                .filter(|c| !c.is_control())
                .take(128)
                .collect();
            return Intercept::Reply(reply::error(&format!(
                "unknown subcommand '{shown}'. Try QUEUE HELP."
            )));
        }
    };
    if !arity_ok {
        return Intercept::Reply(reply::error(&format!(
            "wrong number of arguments for 'queue|{}' command",
            sub.to_ascii_lowercase()
        )));
    }
    if sub == "HELP" {
        let mut out = BytesMut::new();
        reply::array(&mut out, HELP.len());
        for line in HELP {
            reply::simple(&mut out, line);
        }
        return Intercept::Reply(out.freeze());
    }
    let q = match resolve(rules, args.get(2)) {
        Ok(q) => q,
        Err(e) => return Intercept::Reply(e),
    };
    let on = Sub {
        args,
        q,
        registry,
        how,
    };
    match sub.as_str() {
        "EXTEND" => extend::extend(on),
        "INFO" => info::info(on),
        "LEASES" => leases::leases(on),
        "DEAD" => dead::dead(on),
        "REDRIVE" => redrive::redrive(on),
        "PURGE" => purge::purge(on),
        _ => push::push(on),
    }
}

/// A QUEUE subcommand on a queue: its arguments, the queue, the registry
/// of the client's database and how it is carried out.
struct Sub<'a> {
    args: Args<'a>,
    q: Arc<Queue>,
    registry: &'a Arc<Registry>,
    how: Shape,
}

/// How a QUEUE subcommand is carried out and answered.
#[derive(Clone, Copy)]
pub struct Shape {
    pub protocol: u8,
    /// The database the client selected.
    pub db: i64,
    /// One script call (inside MULTI, or during a pause).
    pub one_call: bool,
}

/// An optional trailing `COUNT n`; else the error reply for it.
fn count_arg(args: Args<'_>, at: usize, default: i64, max: i64) -> Result<i64, Bytes> {
    if args.len() == at {
        return Ok(default);
    }
    if args.len() != at + 2 || !args.is(at, "COUNT") {
        return Err(reply::error("syntax error"));
    }
    match args.get(at + 1).and_then(parse_i64) {
        Some(c) if c > 0 => Ok(c.min(max)),
        _ => Err(reply::error("value is out of range, must be positive")),
    }
}

/// The most one QUEUE LEASES or DEAD lists: one script call reads them
/// all, and Redis does nothing else meanwhile.
const LISTED_MAX: i64 = 1000;
const LISTED_DEFAULT: i64 = 10;

/// The call of QUEUE LEASES and DEAD (`function`): the queue's keys, the
/// count and the offset.
fn window_call(function: &'static Function, q: &Queue, count: i64, offset: i64) -> Call {
    let call = Call::new(function).queue(q).arg(count.to_string());
    call.arg(offset.to_string())
}

/// `[COUNT n] [OFFSET o]` of QUEUE LEASES and DEAD, in either order, from
/// argument `at` on, in pairs (the arity says so): `(count, offset)`; else
/// the error reply for the first one wrong, as Redis reads options.
fn window_args(args: Args<'_>, at: usize) -> Result<(i64, i64), Bytes> {
    let (mut count, mut offset) = (None, None);
    for i in (at..args.len()).step_by(2) {
        let (slot, least) = if args.is(i, "COUNT") {
            (&mut count, 1)
        } else if args.is(i, "OFFSET") {
            (&mut offset, 0)
        } else {
            return Err(reply::error("syntax error"));
        };
        if slot.is_some() {
            return Err(reply::error("syntax error"));
        }
        // Redis's text for a bad count (`LPOP key -1`, `LPOP key abc`): its
        // "positive" takes 0, as OFFSET does and COUNT never has.
        match args.get(i + 1).and_then(parse_i64) {
            Some(v) if v >= least => *slot = Some(v),
            _ => return Err(reply::error("value is out of range, must be positive")),
        }
    }
    Ok((
        count.map_or(LISTED_DEFAULT, |c| c.min(LISTED_MAX)),
        offset.unwrap_or(0),
    ))
}

/// A map of names to integers and strings, as Redis answers `XINFO`: a map
/// in RESP3, a flat array in RESP2.
enum Field {
    Int(i64),
    Str(Bytes),
    Nil,
    List(Vec<Bytes>),
}

fn map_reply(out: &mut BytesMut, fields: &[(String, Field)], protocol: u8) {
    reply::map(out, fields.len(), protocol);
    for (name, value) in fields {
        reply::bulk(out, name.as_bytes());
        match value {
            Field::Int(n) => reply::integer(out, *n),
            Field::Str(s) => reply::bulk(out, s),
            Field::Nil => reply::null_bulk(out, protocol),
            Field::List(items) => {
                reply::array(out, items.len());
                for item in items {
                    reply::bulk(out, item);
                }
            }
        }
    }
}

/// The refusal of `QUEUE <sub>` on a queue whose dead-letter list other
/// keys' messages may reach: a dead letter is its raw payload, so taking
/// them all would take other queues' too, and nothing tells which are
/// this queue's.
fn shared_dead_letters(sub: &str, q: &Queue) -> Option<Intercept> {
    shared_refusal(
        sub,
        q,
        "its dead letters do not say which queue they come from",
    )
}

fn shared_refusal(sub: &str, q: &Queue, because: &str) -> Option<Intercept> {
    let why = q.dead_shared.as_ref()?;
    let show = |b: &[u8]| -> String {
        String::from_utf8_lossy(b)
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect()
    };
    Some(Intercept::Reply(reply::error(&format!(
        "ackproxy: QUEUE {sub} refused: the dead-letter list '{}' of '{}' is shared ({why}), \
         and {because}; give each queue a list of its own: $queue in the rule's dead_letter \
         stands for the queue's name",
        show(q.keys.dead()),
        show(&q.name),
    ))))
}
