//! The proxy's own commands — ACK, NACK, QUEUE — and LREM on a move
//! destination, each turned into a script call and a reply builder.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::call::{Call, ScriptReply};
use super::job::Job;
use super::registry::Registry;
use super::rules::{Queue, Rules};
use super::scripts;
use super::value::Value;
use super::Intercept;
use crate::command::{parse_i64, Args};
use crate::resp::reply;

pub const HELP: &[&str] = &[
    "QUEUE <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "EXTEND <queue> <id> <ms>",
    "    Renew the leases of the messages with this id for <ms> milliseconds from now.",
    "INFO <queue>",
    "    Ready, leased and dead message counts, oldest lease age, the queue's rule, and a",
    "    lease suggested from recent ack latencies (2 x p99, -1 before 10 acks).",
    "LEASES <queue> [COUNT <n>]",
    "    The leases that expire first (default 10): id, payload, deliveries, ms left, destination.",
    "HELP",
    "    Print this help.",
    "Outside QUEUE: ACK <queue> <id> [<id> ...] releases leases; NACK <queue> <id> [<id> ...]",
    "returns leased messages to the queue at once.",
];

fn wrong_arity(cmd: &str) -> Intercept {
    Intercept::Reply(reply::error(&format!(
        "wrong number of arguments for '{}' command",
        cmd.to_ascii_lowercase()
    )))
}

fn not_a_queue(key: &[u8]) -> Intercept {
    let name: String = String::from_utf8_lossy(key)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    Intercept::Reply(reply::error(&format!("no queue rule matches key '{name}'")))
}

fn rewrite<F>(call: Call, full: bool, build: F) -> Intercept
where
    F: FnMut(Value) -> Bytes + Send + 'static,
{
    Intercept::Rewrite {
        request: call.request(full),
        transform: ScriptReply::boxed(call, build),
    }
}

fn int_reply(v: i64) -> Bytes {
    let mut out = BytesMut::new();
    reply::integer(&mut out, v);
    out.freeze()
}

fn resolve(rules: &Rules, key: Option<&[u8]>) -> Result<Arc<Queue>, Intercept> {
    let key = key.unwrap_or_default();
    rules.resolve(key).ok_or_else(|| not_a_queue(key))
}

/// Ids acknowledged or nacked per script call: about 10 µs each.
pub const IDS_PER_CALL: usize = 50;
/// List elements one ACK call may look at to take late-acked copies out of
/// the list (LPOS ... MAXLEN), over all its ids.
const LATE_SCAN_PER_CALL: &str = "2000";
/// The longest lease QUEUE EXTEND grants: 30 days. A lease that never ends
/// would keep its message from everyone for good.
pub const MAX_EXTEND_MS: i64 = 30 * 24 * 3600 * 1000;

/// The ACK script call for `ids` (at most [`IDS_PER_CALL`]).
pub fn ack_call(q: &Queue, ids: &[Bytes]) -> Call {
    let mut call = Call::new(&scripts::ACK)
        .queue(q)
        .rule(q)
        .arg(LATE_SCAN_PER_CALL);
    for id in ids {
        call = call.arg(id.clone());
    }
    call
}

/// Counts an ACK call's outcome under the queue's rule, with the age of
/// each lease it released (pop → ACK, by Redis's clock).
fn count_acks(q: &Queue, v: &Value) -> i64 {
    let items = v.array();
    let released = items.first().map(Value::int).unwrap_or(0);
    let late = items.get(1).map(Value::int).unwrap_or(0);
    let rule = crate::telemetry::rule(&q.rule.pattern);
    rule.acks.increment(released as u64);
    rule.late_acks.increment(late as u64);
    for age in items.get(2..).unwrap_or_default() {
        rule.acked_after(age.int().max(0) as u64);
    }
    released + late
}

fn ids_of(args: Args<'_>, from: usize) -> Vec<Bytes> {
    args.iter().skip(from).map(Bytes::copy_from_slice).collect()
}

/// ACK queue id [id ...]
pub fn ack(args: Args<'_>, rules: &Rules, one_call: bool, full: bool) -> Intercept {
    if args.len() < 3 {
        return wrong_arity("ack");
    }
    let q = match resolve(rules, args.get(1)) {
        Ok(q) => q,
        Err(e) => return e,
    };
    let ids = ids_of(args, 2);
    if ids.len() <= IDS_PER_CALL || one_call {
        let call = ack_call(&q, &ids);
        return rewrite(call, full, move |v| int_reply(count_acks(&q, &v)));
    }
    Intercept::Job(Job::new(move |caller| async move {
        let mut total = 0;
        for chunk in ids.chunks(IDS_PER_CALL) {
            match caller.run(&ack_call(&q, chunk)).await {
                Ok(v) => total += count_acks(&q, &v),
                Err(e) => return e.to_reply(),
            }
        }
        int_reply(total)
    }))
}

fn nack_call(q: &Queue, ids: &[Bytes]) -> Call {
    let mut call = Call::new(&scripts::NACK).queue(q).rule(q);
    for id in ids {
        call = call.arg(id.clone());
    }
    call
}

/// NACK queue id [id ...]
pub fn nack(
    args: Args<'_>,
    rules: &Rules,
    registry: &Arc<Registry>,
    one_call: bool,
    full: bool,
) -> Intercept {
    if args.len() < 3 {
        return wrong_arity("nack");
    }
    let q = match resolve(rules, args.get(1)) {
        Ok(q) => q,
        Err(e) => return e,
    };
    let ids = ids_of(args, 2);
    let rule = crate::telemetry::rule(&q.rule.pattern);
    if one_call {
        // Move leases are only marked due here; the reaper ends them.
        registry.touch(&q.name);
        let call = nack_call(&q, &ids);
        return rewrite(call, full, move |v| {
            let n = v.array().first().map(Value::int).unwrap_or(0);
            rule.nacks.increment(n as u64);
            int_reply(n)
        });
    }
    let registry = registry.clone();
    Intercept::Job(Job::new(move |caller| async move {
        let mut total = 0;
        for chunk in ids.chunks(IDS_PER_CALL) {
            let v = match caller.run(&nack_call(&q, chunk)).await {
                Ok(v) => v,
                Err(e) => return e.to_reply(),
            };
            let items = v.array();
            total += items.first().map(Value::int).unwrap_or(0);
            // Move leases: their stale copy leaves the destination and the
            // message is back in the queue before the client hears back.
            for pair in items.get(1..).unwrap_or_default().chunks(2) {
                let [token, dest] = pair else { break };
                super::reaper::expire_move(&caller, &q, dest.bytes(), token.bytes()).await;
            }
        }
        registry.touch(&q.name);
        rule.nacks.increment(total as u64);
        int_reply(total)
    }))
}

/// QUEUE subcommand ...
pub fn queue(
    args: Args<'_>,
    rules: &Rules,
    registry: &Arc<Registry>,
    protocol: u8,
    full: bool,
) -> Intercept {
    let Some(sub_raw) = args.get(1) else {
        return wrong_arity("queue");
    };
    let sub = String::from_utf8_lossy(sub_raw).to_ascii_uppercase();
    match sub.as_str() {
        "HELP" if args.len() == 2 => {
            let mut out = BytesMut::new();
            reply::array(&mut out, HELP.len());
            for line in HELP {
                reply::simple(&mut out, line);
            }
            Intercept::Reply(out.freeze())
        }
        "EXTEND" if args.len() == 5 => {
            let q = match resolve(rules, args.get(2)) {
                Ok(q) => q,
                Err(e) => return e,
            };
            let Some(ms) = args
                .get(4)
                .and_then(parse_i64)
                .filter(|&ms| ms > 0 && ms <= MAX_EXTEND_MS)
            else {
                return Intercept::Reply(reply::error(&format!(
                    "value is out of range, must be positive and at most {MAX_EXTEND_MS}"
                )));
            };
            // A shorter lease may now be due before the reaper expected.
            registry.touch(&q.name);
            let call = Call::new(&scripts::EXTEND)
                .queue(&q)
                .arg(Bytes::copy_from_slice(args.get(3).unwrap_or_default()))
                .arg(ms.to_string());
            rewrite(call, full, |v| int_reply(v.int()))
        }
        "INFO" if args.len() == 3 => {
            let q = match resolve(rules, args.get(2)) {
                Ok(q) => q,
                Err(e) => return e,
            };
            let call = Call::new(&scripts::INFO).queue(&q);
            let rule = q.rule.clone();
            let dead = Bytes::copy_from_slice(q.keys.dead());
            let suggested = suggested_lease_ms(&rule.pattern);
            rewrite(call, full, move |v| {
                let a = v.array();
                let field = |i: usize| a.get(i).map(Value::int).unwrap_or(0);
                let mut out = BytesMut::new();
                reply::map(&mut out, 9, protocol);
                for (name, value) in [
                    ("ready", field(0)),
                    ("leased", field(1)),
                    ("dead", field(2)),
                    ("oldest-lease-age-ms", field(3)),
                    ("requeued", field(4)),
                    ("lease-ms", rule.lease_ms as i64),
                    ("max-deliveries", rule.max_deliveries as i64),
                    ("suggested-lease-ms", suggested),
                ] {
                    reply::bulk(&mut out, name.as_bytes());
                    reply::integer(&mut out, value);
                }
                reply::bulk(&mut out, b"dead-letter-key");
                reply::bulk(&mut out, &dead);
                out.freeze()
            })
        }
        "LEASES" if args.len() == 3 || args.len() == 5 => {
            let q = match resolve(rules, args.get(2)) {
                Ok(q) => q,
                Err(e) => return e,
            };
            let mut count = 10;
            if args.len() == 5 {
                if !args.is(3, "COUNT") {
                    return Intercept::Reply(reply::error("syntax error"));
                }
                match args.get(4).and_then(parse_i64) {
                    Some(c) if c > 0 => count = c.min(1000),
                    _ => {
                        return Intercept::Reply(reply::error(
                            "value is out of range, must be positive",
                        ))
                    }
                }
            }
            let call = Call::new(&scripts::LEASES).queue(&q).arg(count.to_string());
            rewrite(call, full, move |v| {
                let leases = v.array();
                let mut out = BytesMut::new();
                reply::array(&mut out, leases.len());
                for l in leases {
                    let f = l.array();
                    reply::map(&mut out, 5, protocol);
                    for (i, name) in [
                        "id",
                        "payload",
                        "deliveries",
                        "expires-in-ms",
                        "destination",
                    ]
                    .iter()
                    .enumerate()
                    {
                        reply::bulk(&mut out, name.as_bytes());
                        match f.get(i) {
                            Some(Value::Int(n)) => reply::integer(&mut out, *n),
                            Some(v) => reply::bulk(&mut out, v.bytes()),
                            None => reply::null_bulk(&mut out, protocol),
                        }
                    }
                }
                out.freeze()
            })
        }
        "HELP" | "EXTEND" | "INFO" | "LEASES" => Intercept::Reply(reply::error(&format!(
            "wrong number of arguments for 'queue|{}' command",
            sub.to_ascii_lowercase()
        ))),
        _ => {
            let shown: String = String::from_utf8_lossy(sub_raw)
                .chars()
                .filter(|c| !c.is_control())
                .take(128)
                .collect();
            Intercept::Reply(reply::error(&format!(
                "unknown subcommand '{shown}'. Try QUEUE HELP."
            )))
        }
    }
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
pub fn lrem(args: Args<'_>, q: &Queue, full: bool) -> Intercept {
    let (Some(dest), Some(count), Some(payload)) = (args.get(1), args.get(2), args.get(3)) else {
        return Intercept::Pass;
    };
    if args.len() != 4 || parse_i64(count).is_none() {
        return Intercept::Pass;
    }
    let call = Call::new(&scripts::LREM)
        .key(Bytes::copy_from_slice(dest))
        .queue(q)
        .arg(Bytes::copy_from_slice(count))
        .arg(Bytes::copy_from_slice(payload));
    let rule = crate::telemetry::rule(&q.rule.pattern);
    rewrite(call, full, move |v| {
        let released = v.array().get(1).map(Value::int).unwrap_or(0);
        rule.acks.increment(released as u64);
        int_reply(v.array().first().map(Value::int).unwrap_or(0))
    })
}
