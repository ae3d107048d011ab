//! The proxy's own commands — ACK, NACK, QUEUE — and LREM on a move
//! destination, each turned into a script call and a reply builder.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::call::{Call, ScriptReply};
use super::rules::{Queue, Rules};
use super::scripts::{self, Script};
use super::value::Value;
use super::Intercept;
use crate::command::{parse_i64, Args};
use crate::resp::reply;

pub const HELP: &[&str] = &[
    "QUEUE <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "EXTEND <queue> <id> <ms>",
    "    Renew the leases of the messages with this id for <ms> milliseconds from now.",
    "INFO <queue>",
    "    Ready, leased and dead message counts, oldest lease age, and the queue's rule.",
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

fn queue_call(script: &'static Script, q: &Queue) -> Call {
    let mut call = Call::new(script);
    for k in q.key_group() {
        call = call.key(k.clone());
    }
    call
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

/// ACK queue id [id ...]
pub fn ack(args: Args<'_>, rules: &Rules, full: bool) -> Intercept {
    if args.len() < 3 {
        return wrong_arity("ack");
    }
    let q = match resolve(rules, args.get(1)) {
        Ok(q) => q,
        Err(e) => return e,
    };
    let mut call = queue_call(&scripts::ACK, &q);
    for id in args.iter().skip(2) {
        call = call.arg(Bytes::copy_from_slice(id));
    }
    let name = q.name.clone();
    rewrite(call, full, move |v| {
        let released = v.array().first().map(Value::int).unwrap_or(0);
        let late = v.array().get(1).map(Value::int).unwrap_or(0);
        let queue = String::from_utf8_lossy(&name).into_owned();
        metrics::counter!("ackproxy_acks_total", "queue" => queue.clone())
            .increment(released as u64);
        metrics::counter!("ackproxy_late_acks_total", "queue" => queue).increment(late as u64);
        int_reply(released + late)
    })
}

/// NACK queue id [id ...]
pub fn nack(args: Args<'_>, rules: &Rules, full: bool) -> Intercept {
    if args.len() < 3 {
        return wrong_arity("nack");
    }
    let q = match resolve(rules, args.get(1)) {
        Ok(q) => q,
        Err(e) => return e,
    };
    let mut call = queue_call(&scripts::NACK, &q);
    for a in &q.spec {
        call = call.arg(a.clone());
    }
    for id in args.iter().skip(2) {
        call = call.arg(Bytes::copy_from_slice(id));
    }
    let queue = String::from_utf8_lossy(&q.name).into_owned();
    rewrite(call, full, move |v| {
        let n = v.int();
        metrics::counter!("ackproxy_nacks_total", "queue" => queue.clone()).increment(n as u64);
        int_reply(n)
    })
}

/// QUEUE subcommand ...
pub fn queue(args: Args<'_>, rules: &Rules, protocol: u8, full: bool) -> Intercept {
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
            let Some(ms) = args.get(4).and_then(parse_i64).filter(|&ms| ms > 0) else {
                return Intercept::Reply(reply::error("value is out of range, must be positive"));
            };
            let call = queue_call(&scripts::EXTEND, &q)
                .arg(Bytes::copy_from_slice(args.get(3).unwrap_or_default()))
                .arg(ms.to_string());
            rewrite(call, full, |v| int_reply(v.int()))
        }
        "INFO" if args.len() == 3 => {
            let q = match resolve(rules, args.get(2)) {
                Ok(q) => q,
                Err(e) => return e,
            };
            let call = queue_call(&scripts::INFO, &q);
            let rule = q.rule.clone();
            let dead = Bytes::copy_from_slice(&q.keys.dead);
            rewrite(call, full, move |v| {
                let a = v.array();
                let field = |i: usize| a.get(i).map(Value::int).unwrap_or(0);
                let mut out = BytesMut::new();
                reply::map(&mut out, 8, protocol);
                for (name, value) in [
                    ("ready", field(0)),
                    ("leased", field(1)),
                    ("dead", field(2)),
                    ("oldest-lease-age-ms", field(3)),
                    ("requeued", field(4)),
                    ("lease-ms", rule.lease_ms as i64),
                    ("max-deliveries", rule.max_deliveries as i64),
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
            let call = queue_call(&scripts::LEASES, &q).arg(count.to_string());
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

/// LREM destination count payload, where the destination received messages
/// from a queue's move pops: removing a copy releases its lease.
pub fn lrem(args: Args<'_>, q: &Queue, full: bool) -> Intercept {
    let (Some(dest), Some(count), Some(payload)) = (args.get(1), args.get(2), args.get(3)) else {
        return Intercept::Pass;
    };
    if args.len() != 4 || parse_i64(count).is_none() {
        return Intercept::Pass;
    }
    let mut call = Call::new(&scripts::LREM).key(Bytes::copy_from_slice(dest));
    for k in q.key_group() {
        call = call.key(k.clone());
    }
    let call = call
        .arg(Bytes::copy_from_slice(count))
        .arg(Bytes::copy_from_slice(payload));
    let queue = String::from_utf8_lossy(&q.name).into_owned();
    rewrite(call, full, move |v| {
        let released = v.array().get(1).map(Value::int).unwrap_or(0);
        metrics::counter!("ackproxy_acks_total", "queue" => queue.clone())
            .increment(released as u64);
        int_reply(v.array().first().map(Value::int).unwrap_or(0))
    })
}
