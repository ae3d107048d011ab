//! The proxy's own commands — ACK, NACK, QUEUE — and LREM on a move
//! destination, each turned into a script call and a reply builder.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::call::{Caller, ScriptReply};
use super::job::{above_one_call, Job};
use super::ops::{self, Op};
use super::registry::Registry;
use super::rules::{Queue, Rules};
use super::tally;
use super::value::Value;
use super::Intercept;
use crate::command::{parse_i64, Args};
use crate::config::{AckPolicy, Backoff, Hold};
use crate::resp::reply;

pub const HELP: &[&str] = &[
    "QUEUE <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "PUSH <queue> <payload> [<payload> ...] [DELAY <ms> | AT <unix-ms>]",
    "    Push messages, now or when due (they wait in the queue's delayed set).",
    "EXTEND <queue> <id> <ms>",
    "    Renew the leases of the messages with this id for <ms> milliseconds from now.",
    "INFO <queue>",
    "    Ready, leased, delayed and dead counts, oldest lease age, totals, the rule, and a",
    "    lease suggested from recent ack latencies (2 x p99, -1 before 10 acks).",
    "DEAD <queue> [COUNT <n>] [OFFSET <o>]",
    "    The oldest dead letters (default 10), past the <o> oldest, each with its history:",
    "    id, deliveries, NACKs, expiries, first and last delivery, last reason, when it was",
    "    dead-lettered.",
    "REDRIVE <queue> [COUNT <n>]",
    "    Return dead letters (all, or the <n> oldest) to the queue as new messages.",
    "REDRIVE <queue> ID <id> <payload>",
    "    Return the one dead letter with this id (as QUEUE DEAD shows it, \"\" for none) and",
    "    payload to the queue as a new message: 1, or 0 if there is none.",
    "PURGE <queue> DEAD",
    "    Delete the dead letters and their histories.",
    "PURGE <queue> DEAD ID <id> <payload>",
    "    Delete the one dead letter with this id and payload: 1, or 0 if there is none.",
    "LEASES <queue> [COUNT <n>] [OFFSET <o>]",
    "    The leases that expire first (default 10), past the first <o>: id, payload,",
    "    deliveries, NACKs, expiries, ms left, destination.",
    "HELP",
    "    Print this help.",
    "Outside QUEUE: ACK <queue> <id> [<id> ...] releases leases; NACK <queue> <id> [<id> ...]",
    "[DELAY <ms>] returns leased messages to the queue, at once (or after the rule's retry",
    "backoff) or after <ms>.",
];

fn wrong_arity(cmd: &str) -> Intercept {
    Intercept::Reply(reply::error(&format!(
        "wrong number of arguments for '{}' command",
        cmd.to_ascii_lowercase()
    )))
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
fn rewrite<O, F>(op: O, db: i64, mut build: F) -> Intercept
where
    O: Op,
    F: FnMut(O::Reply) -> Bytes + Send + 'static,
{
    let call = op.call();
    Intercept::Rewrite {
        request: call.request_in(db),
        transform: ScriptReply::boxed(call, db, move |v| match O::read(&v) {
            Ok(r) => build(r),
            Err(e) => e.to_reply(),
        }),
    }
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

/// ACK's reply: leases released plus late ACKs. The age of each lease it
/// released (pop → ACK, by Redis's clock) goes to the rule's ack latency.
pub(super) fn count_acks(q: &Queue, acked: &ops::Acked) -> i64 {
    if !acked.started.is_empty() {
        let rule = crate::telemetry::rule(&q.rule.pattern);
        let now = super::clock::redis_now_ms();
        for at in &acked.started {
            rule.acked_after((now - at).max(0) as u64);
        }
    }
    acked.count()
}

fn ids_of(args: Args<'_>, from: usize) -> Vec<Bytes> {
    args.iter().skip(from).map(Bytes::copy_from_slice).collect()
}

/// ACK queue id [id ...]
pub fn ack(args: Args<'_>, rules: &Rules, registry: &Arc<Registry>, one_call: bool) -> Intercept {
    if args.len() < 3 {
        return wrong_arity("ack");
    }
    let q = match resolve_leased(rules, args.get(1)) {
        Ok(q) => q,
        Err(e) => return Intercept::Reply(e),
    };
    let n = args.len() - 2;
    if one_call && n > IDS_PER_CALL {
        return too_many_ids(n);
    }
    let registry = registry.clone();
    if n <= IDS_PER_CALL {
        // The ids straight from the request into the call, as slices of
        // it: no list of them first, no copies.
        let ids = (2..args.len()).filter_map(|i| args.to_bytes(i));
        let op = ops::Ack { q: &q, ids };
        let q = q.clone();
        return rewrite(op, registry.db, move |acked| {
            let n = count_acks(&q, &acked);
            changed(&registry, &q, n);
            int_reply(n)
        });
    }
    let ids = ids_of(args, 2);
    Intercept::Job(Job::new(move |caller| async move {
        let mut total = 0;
        for chunk in ids.chunks(IDS_PER_CALL) {
            let op = ops::Ack {
                q: &q,
                ids: chunk.iter().cloned(),
            };
            match caller.op(op).await {
                Ok(acked) => total += count_acks(&q, &acked),
                Err(e) => {
                    changed(&registry, &q, total);
                    return e.to_reply();
                }
            }
        }
        changed(&registry, &q, total);
        int_reply(total)
    }))
}

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
        let op = ops::Nack {
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
            let op = ops::Nack {
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

/// QUEUE subcommand ...
pub fn queue(args: Args<'_>, rules: &Rules, registry: &Arc<Registry>, how: Shape) -> Intercept {
    let Some(sub_raw) = args.get(1) else {
        return wrong_arity("queue");
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
    match sub.as_str() {
        "EXTEND" => extend(args, q, registry),
        "INFO" => info(q, how),
        "LEASES" => leases(args, q, how),
        "DEAD" => dead(args, q, how),
        "REDRIVE" => redrive(args, q, registry, how),
        "PURGE" => purge(args, q, registry),
        _ => push(args, q, registry, how),
    }
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

/// QUEUE EXTEND queue id ms
fn extend(args: Args<'_>, q: Arc<Queue>, registry: &Registry) -> Intercept {
    let Some(ms) = args
        .get(4)
        .and_then(parse_i64)
        .filter(|&ms| ms > 0 && ms <= MAX_DURATION_MS)
    else {
        return Intercept::Reply(reply::error(&format!(
            "value is out of range, must be positive and at most {MAX_DURATION_MS}"
        )));
    };
    // A shorter lease may now be due before the reaper expected.
    registry.touch(&q.name);
    let op = ops::Extend {
        q: &q,
        id: Bytes::copy_from_slice(args.get(3).unwrap_or_default()),
        ms,
    };
    rewrite(op, registry.db, int_reply)
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

/// QUEUE INFO queue
fn info(q: Arc<Queue>, how: Shape) -> Intercept {
    let suggested = suggested_lease_ms(&q.rule.pattern);
    let op = ops::Info { q: &q };
    let q = q.clone();
    rewrite(op, how.db, move |i| {
        let mut fields: Vec<(String, Field)> = vec![
            ("ready".into(), Field::Int(i.ready)),
            ("leased".into(), Field::Int(i.leased)),
            ("delayed".into(), Field::Int(i.delayed)),
            ("dead".into(), Field::Int(i.dead)),
            ("oldest-lease-age-ms".into(), Field::Int(i.oldest_lease_ms)),
            ("requeued".into(), Field::Int(i.requeued)),
            ("poison".into(), Field::Int(i.poison)),
        ];
        fields.extend(
            tally::totals(&i.totals).map(|(name, n)| (name.replace('_', "-"), Field::Int(n))),
        );
        let rule = &q.rule;
        fields.extend([
            ("lease-ms".into(), Field::Int(rule.lease_ms as i64)),
            (
                "max-deliveries".into(),
                Field::Int(rule.max_deliveries as i64),
            ),
            (
                "dead-letter-key".into(),
                Field::Str(Bytes::copy_from_slice(q.keys.dead())),
            ),
            (
                "retry-backoff".into(),
                Field::Str(Bytes::from_static(match rule.retry_backoff {
                    Backoff::None => b"none",
                    Backoff::Fixed => b"fixed",
                    Backoff::Exp => b"exp",
                })),
            ),
            (
                "ack".into(),
                Field::Str(Bytes::from_static(match rule.ack {
                    AckPolicy::Explicit => b"explicit",
                    AckPolicy::NextPop => b"next-pop",
                })),
            ),
            (
                "requeue-on-disconnect".into(),
                Field::Int(rule.requeues_on_disconnect() as i64),
            ),
            ("shadow".into(), Field::Int(rule.shadow as i64)),
            (
                "hold".into(),
                Field::Str(Bytes::from_static(match rule.hold {
                    Hold::Lease => b"lease",
                    Hold::Connection => b"connection",
                })),
            ),
            ("max-hold-ms".into(), Field::Int(rule.max_hold_ms() as i64)),
            ("poison-after".into(), Field::Int(rule.poison_after.into())),
            ("suggested-lease-ms".into(), Field::Int(suggested)),
        ]);
        // Last: a nested array, after every flat field.
        fields.push(("poison-ids".into(), Field::List(i.poison_ids)));
        let mut out = BytesMut::new();
        map_reply(&mut out, &fields, how.protocol);
        out.freeze()
    })
}

/// QUEUE LEASES queue [COUNT n] [OFFSET o]
fn leases(args: Args<'_>, q: Arc<Queue>, how: Shape) -> Intercept {
    let (count, offset) = match window_args(args, 3) {
        Ok(w) => w,
        Err(e) => return Intercept::Reply(e),
    };
    let op = ops::Leases {
        q: &q,
        count,
        offset,
    };
    rewrite(op, how.db, move |leases| {
        let mut out = BytesMut::new();
        reply::array(&mut out, leases.len());
        for l in leases {
            let fields: Vec<(String, Field)> = [
                ("id", l.id),
                ("payload", l.payload),
                ("deliveries", l.deliveries),
                ("nacks", l.nacks),
                ("expiries", l.expiries),
                ("expires-in-ms", l.expires_in_ms),
                ("destination", l.destination),
            ]
            .into_iter()
            .map(|(name, v)| {
                let value = match v {
                    Value::Int(n) => Field::Int(n),
                    Value::Nil => Field::Nil,
                    v => Field::Str(Bytes::copy_from_slice(v.bytes())),
                };
                (name.to_string(), value)
            })
            .collect();
            map_reply(&mut out, &fields, how.protocol);
        }
        out.freeze()
    })
}

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

fn push_op<'a>(q: &'a Queue, due: Due, payloads: &'a [Bytes]) -> ops::Push<'a> {
    let (when, ms): (&'static [u8], Bytes) = match due {
        Due::Now => (b"", Bytes::new()),
        Due::Delay(ms) => (b"D", Bytes::from(ms.to_string())),
        Due::At(ms) => (b"A", Bytes::from(ms.to_string())),
    };
    ops::Push {
        q,
        when,
        ms,
        payloads,
    }
}

/// After a delayed push: the reaper looks at the queue when the messages
/// are due (`ms` from now, as the script measured it on Redis's clock).
fn note_delayed(registry: &Registry, q: &Queue, pushed: &ops::Pushed) {
    if let Some(ms) = pushed.due_in_ms {
        let wait = std::time::Duration::from_millis(ms as u64).min(super::registry::MAX_WAIT);
        registry.note(&q.name, tokio::time::Instant::now() + wait);
    }
}

/// QUEUE PUSH queue payload [payload ...] [DELAY ms | AT unix-ms]
fn push(args: Args<'_>, q: Arc<Queue>, registry: &Arc<Registry>, how: Shape) -> Intercept {
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
        let mut total = 0;
        for chunk in payloads.chunks(PUSH_PER_CALL) {
            match caller.op(push_op(&q, due, chunk)).await {
                Ok(pushed) => {
                    note_delayed(&registry, &q, &pushed);
                    total += pushed.accepted;
                }
                Err(e) => {
                    changed(&registry, &q, total);
                    return e.to_reply();
                }
            }
        }
        changed(&registry, &q, total);
        int_reply(total)
    }))
}
/// A lease that covers almost every job: the 99th percentile of the rule's
/// recent pop → ACK latencies (the last [`RECENT_ACKS`] acknowledged
/// through this proxy) times [`LEASE_SAFETY`], rounded up to a second; -1
/// until there are [`MIN_ACKS_FOR_SUGGESTION`] of them.
///
/// [`RECENT_ACKS`]: crate::telemetry::RECENT_ACKS
fn suggested_lease_ms(pattern: &str) -> i64 {
    match crate::telemetry::rule(pattern).ack_p99() {
        Some((p99, n)) if n >= MIN_ACKS_FOR_SUGGESTION => {
            let ms = p99.saturating_mul(LEASE_SAFETY).max(1);
            ms.div_ceil(1000).saturating_mul(1000) as i64
        }
        _ => -1,
    }
}

/// Twice the p99: a job slower than all but 1 % of the recent ones still
/// finishes before its lease ends, with room for a slower worker or a
/// pause, while a dead worker's message is back within about two jobs' time.
const LEASE_SAFETY: u64 = 2;
/// Fewer acknowledgements say too little about the slow end.
const MIN_ACKS_FOR_SUGGESTION: usize = 10;

/// LREM destination count payload, where the destination received messages
/// from a queue's move pops: removing a copy releases its lease.
pub fn lrem(args: Args<'_>, q: &Arc<Queue>, registry: &Arc<Registry>) -> Intercept {
    let (Some(dest), Some(count), Some(payload)) = (args.get(1), args.get(2), args.get(3)) else {
        return Intercept::Pass;
    };
    if args.len() != 4 || parse_i64(count).is_none() {
        return Intercept::Pass;
    }
    let op = ops::Lrem {
        dest,
        q,
        count,
        payload,
    };
    let (q, registry) = (q.clone(), registry.clone());
    rewrite(op, registry.db, move |n| {
        changed(&registry, &q, n);
        int_reply(n)
    })
}

/// QUEUE DEAD queue [COUNT n] [OFFSET o]
fn dead(args: Args<'_>, q: Arc<Queue>, how: Shape) -> Intercept {
    let (count, offset) = match window_args(args, 3) {
        Ok(w) => w,
        Err(e) => return Intercept::Reply(e),
    };
    let op = ops::Dead {
        q: &q,
        count,
        offset,
    };
    rewrite(op, how.db, move |letters| {
        let mut out = BytesMut::new();
        reply::array(&mut out, letters.len());
        for l in letters {
            let fields: Vec<(String, Field)> = [
                "payload",
                "id",
                "deliveries",
                "nacks",
                "expiries",
                "first-delivery-ms",
                "last-delivery-ms",
                "last-reason",
                "dead-lettered-ms",
            ]
            .iter()
            .zip(l.fields)
            .map(|(name, v)| {
                let value = match v {
                    Value::Int(n) => Field::Int(n),
                    Value::Str(s) => Field::Str(s),
                    // No history kept (dropped past the bound, or the
                    // payload was put there by something else).
                    _ => Field::Nil,
                };
                (name.to_string(), value)
            })
            .collect();
            map_reply(&mut out, &fields, how.protocol);
        }
        out.freeze()
    })
}

/// Dead letters one QUEUE REDRIVE call moves.
pub const REDRIVE_PER_CALL: i64 = 100;

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

/// QUEUE REDRIVE queue [COUNT n]: all of them without COUNT.
fn redrive(args: Args<'_>, q: Arc<Queue>, registry: &Arc<Registry>, how: Shape) -> Intercept {
    if args.len() == 6 {
        if !args.is(3, "ID") {
            return Intercept::Reply(reply::error("syntax error"));
        }
        return one_dead_letter(args, q, registry, true);
    }
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
        let op = ops::Redrive { q: &q, count };
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
            match caller.op(ops::Redrive { q: &q, count: ask }).await {
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
                Err(e) => {
                    changed(&registry, &q, total);
                    return e.to_reply();
                }
            }
        }
        changed(&registry, &q, total);
        int_reply(total)
    }))
}

/// QUEUE PURGE queue DEAD
fn purge(args: Args<'_>, q: Arc<Queue>, registry: &Arc<Registry>) -> Intercept {
    if !args.is(3, "DEAD") || (args.len() == 7 && !args.is(4, "ID")) {
        return Intercept::Reply(reply::error("syntax error"));
    }
    if args.len() == 7 {
        return one_dead_letter(args, q, registry, false);
    }
    if let Some(refused) = shared_dead_letters("PURGE", &q) {
        return refused;
    }
    let op = ops::Purge { q: &q };
    let (q, registry) = (q.clone(), registry.clone());
    rewrite(op, registry.db, move |n| {
        changed(&registry, &q, n);
        int_reply(n)
    })
}

/// QUEUE REDRIVE queue ID id payload (`redrive`), QUEUE PURGE queue DEAD
/// ID id payload: the last two arguments name one dead letter. Its id, from
/// the queue's own histories, is what makes it this queue's on a shared
/// list; one without a history (an empty id) could be any queue's there.
fn one_dead_letter(
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
    let op = ops::DeadOne {
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

/// Ends one expired (or nacked) move lease, removing its stale copy from
/// `dest` first.
pub async fn expire_move(caller: &Caller, q: &Queue, dest: &[u8], token: &[u8]) -> ops::Ended {
    // Redis away or refusing: the lease stays, and the reaper tries again.
    caller
        .op(ops::ExpireMove { q, dest, token })
        .await
        .unwrap_or_default()
}
