//! Jobs of unknown length and the messages that kill their workers:
//! `hold = "connection"` keeps a lease while the connection that took it
//! stays open (up to `max_hold_ms`), and a message each of whose
//! deliveries ended with its worker's connection closing is flagged as
//! poison after `poison_after` of them, in `QUEUE INFO`, the metrics and
//! the operations API. Leases are short (400–600 ms) so that holding one
//! three times over takes seconds, not minutes; every other wait is for a
//! condition, with a generous deadline.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value as Json;

const CONFIG: &str = r#"
[[queue]]
pattern = "held*"
lease_ms = 600
max_deliveries = 100
ack_id = "payload"
hold = "connection"

[[queue]]
pattern = "bounded*"
lease_ms = 400
max_hold_ms = 2000
max_deliveries = 100
ack_id = "payload"
hold = "connection"

[[queue]]
pattern = "plain*"
lease_ms = 600
max_deliveries = 100
ack_id = "payload"

[[queue]]
pattern = "crash*"
lease_ms = 600000
max_deliveries = 10
ack_id = "payload"
requeue_on_disconnect = true
poison_after = 3

[reaper]
interval_ms = 20
"#;

/// How long a condition may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);

struct Setup {
    proxy: Proxy,
    _redis: Redis,
    ops: u16,
}

fn start() -> Setup {
    let redis = Redis::start();
    let (proxy, ops) = Proxy::start_with_metrics(redis.port, CONFIG);
    Setup {
        proxy,
        _redis: redis,
        ops,
    }
}

fn info(p: &Proxy, q: &str) -> HashMap<String, Value> {
    info_on(&mut p.client(), q)
}

/// QUEUE INFO in the database `c` selected.
fn info_on(c: &mut Client, q: &str) -> HashMap<String, Value> {
    let v = c.cmd(&["QUEUE", "INFO", q]);
    let Value::Array(items) = &v else {
        panic!("QUEUE INFO {q}: {v:?}")
    };
    items
        .chunks(2)
        .map(|kv| (as_str(&kv[0]), kv[1].clone()))
        .collect()
}

fn poison_ids(p: &Proxy, q: &str) -> Vec<String> {
    match &info(p, q)["poison-ids"] {
        Value::Array(ids) => ids.iter().map(as_str).collect(),
        other => panic!("poison-ids: {other:?}"),
    }
}

/// Pops with `RPOP` until a message comes; returns it.
fn pop_eventually(c: &mut Client, q: &str) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match c.cmd(&["RPOP", q]) {
            Value::Nil => {}
            Value::Bulk(b) => return String::from_utf8_lossy(&b).into_owned(),
            other => panic!("RPOP {q}: {other:?}"),
        }
        assert!(Instant::now() < deadline, "nothing came back to {q}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Nothing can be popped from `q` for `span`: its one message stays leased.
fn stays_leased(c: &mut Client, q: &str, span: Duration) {
    let until = Instant::now() + span;
    while Instant::now() < until {
        assert_eq!(c.cmd(&["RPOP", q]), Value::Nil, "{q} was redelivered");
        thread::sleep(Duration::from_millis(50));
    }
}

// ------------------------------------------------------------ hold

#[test]
fn a_held_lease_outlives_its_lease_while_the_connection_is_open() {
    let s = start();
    let mut worker = s.proxy.client();
    let mut other = s.proxy.client();
    worker.cmd(&["LPUSH", "held1", "long-job"]);
    worker.cmd(&["LPUSH", "plain1", "long-job"]);
    assert_eq!(worker.cmd(&["RPOP", "held1"]), Value::bulk("long-job"));
    assert_eq!(worker.cmd(&["RPOP", "plain1"]), Value::bulk("long-job"));
    // The worker sends nothing for three leases; its connection stays open.
    stays_leased(&mut other, "held1", Duration::from_millis(3 * 600));
    // The same lease on a rule that does not hold ran out long ago.
    assert_eq!(other.cmd(&["RPOP", "plain1"]), Value::bulk("long-job"));
    let i = info(&s.proxy, "held1");
    let got: Vec<i64> = ["leased", "ready", "expiries", "disconnects"]
        .iter()
        .map(|f| int(&i[*f]))
        .collect();
    assert_eq!(got, vec![1, 0, 0, 0], "{i:?}");
    assert_eq!(as_str(&i["hold"]), "connection");
    // Still the worker's: its ACK releases the lease, not a late copy.
    assert_eq!(worker.cmd(&["ACK", "held1", "long-job"]), Value::Int(1));
    assert_eq!(queue_info_int(&s.proxy, "held1", "late-acks"), 0);
    assert_eq!(queue_info_int(&s.proxy, "held1", "leased"), 0);
}

#[test]
fn a_held_lease_comes_back_once_its_connection_closes() {
    let s = start();
    let mut worker = s.proxy.client();
    let mut other = s.proxy.client();
    worker.cmd(&["LPUSH", "held2", "job"]);
    assert_eq!(worker.cmd(&["RPOP", "held2"]), Value::bulk("job"));
    stays_leased(&mut other, "held2", Duration::from_millis(2 * 600));
    drop(worker);
    // Not by running out (it is renewed no more, but that takes a lease):
    // the closed connection's leases end at once.
    assert_eq!(pop_eventually(&mut other, "held2"), "job");
    let i = info(&s.proxy, "held2");
    let got: Vec<i64> = ["disconnects", "expiries", "redeliveries"]
        .iter()
        .map(|f| int(&i[*f]))
        .collect();
    assert_eq!(got, vec![1, 0, 1], "{i:?}");
}

#[test]
fn held_leases_are_renewed_in_every_database_their_connection_holds_them() {
    let s = start();
    let in_db = |db: &str| {
        let mut c = s.proxy.client();
        assert_eq!(c.cmd(&["SELECT", db]), Value::Simple("OK".into()));
        c
    };
    let mut worker = in_db("3");
    let (mut other3, mut other0) = (in_db("3"), in_db("0"));
    // One connection, leases in two databases: held4 in 3 and its
    // namesake in 0 are two queues.
    worker.cmd(&["LPUSH", "held4", "job-in-3"]);
    assert_eq!(worker.cmd(&["RPOP", "held4"]), Value::bulk("job-in-3"));
    assert_eq!(worker.cmd(&["SELECT", "0"]), Value::Simple("OK".into()));
    worker.cmd(&["LPUSH", "held4", "job-in-0"]);
    assert_eq!(worker.cmd(&["RPOP", "held4"]), Value::bulk("job-in-0"));
    let until = Instant::now() + Duration::from_millis(3 * 600);
    while Instant::now() < until {
        assert_eq!(other3.cmd(&["RPOP", "held4"]), Value::Nil, "db 3");
        assert_eq!(other0.cmd(&["RPOP", "held4"]), Value::Nil, "db 0");
        thread::sleep(Duration::from_millis(50));
    }
    for c in [&mut other3, &mut other0] {
        let i = info_on(c, "held4");
        let got: Vec<i64> = ["leased", "expiries", "disconnects"]
            .iter()
            .map(|f| int(&i[*f]))
            .collect();
        assert_eq!(got, vec![1, 0, 0], "{i:?}");
    }
    drop(worker);
    // Each ends at once, in its own database.
    assert_eq!(pop_eventually(&mut other3, "held4"), "job-in-3");
    assert_eq!(pop_eventually(&mut other0, "held4"), "job-in-0");
    for c in [&mut other3, &mut other0] {
        let i = info_on(c, "held4");
        let got: Vec<i64> = ["disconnects", "expiries", "redeliveries"]
            .iter()
            .map(|f| int(&i[*f]))
            .collect();
        assert_eq!(got, vec![1, 0, 1], "{i:?}");
    }
}

#[test]
fn a_held_lease_ends_at_max_hold_ms_however_long_the_connection_lives() {
    let s = start();
    let mut worker = s.proxy.client();
    let mut other = s.proxy.client();
    worker.cmd(&["LPUSH", "bounded1", "stuck"]);
    let popped = Instant::now();
    assert_eq!(worker.cmd(&["RPOP", "bounded1"]), Value::bulk("stuck"));
    // Held past its lease (400 ms) ...
    stays_leased(&mut other, "bounded1", Duration::from_millis(1000));
    // ... until max_hold_ms (2000 ms) from its delivery: then it expires.
    assert_eq!(pop_eventually(&mut other, "bounded1"), "stuck");
    let held = popped.elapsed();
    assert!(held >= Duration::from_millis(1900), "back after {held:?}");
    let i = info(&s.proxy, "bounded1");
    let got: Vec<i64> = ["expiries", "disconnects", "max-hold-ms"]
        .iter()
        .map(|f| int(&i[*f]))
        .collect();
    assert_eq!(got, vec![1, 0, 2000], "{i:?}");
    // The worker's connection was open throughout.
    assert_eq!(worker.cmd(&["PING"]), Value::Simple("PONG".into()));
}

#[test]
fn a_connection_holding_more_than_one_renewal_call_takes_keeps_them_all() {
    // 1,200 leases: three bounded hold calls per renewal, each going on
    // where the one before stopped.
    let s = start();
    let mut worker = s.proxy.client();
    let mut other = s.proxy.client();
    let jobs: Vec<String> = (0..1200).map(|i| format!("job{i}")).collect();
    for chunk in jobs.chunks(100) {
        let mut push = vec!["LPUSH", "held3"];
        push.extend(chunk.iter().map(String::as_str));
        worker.cmd(&push);
    }
    let mut taken = 0;
    while taken < jobs.len() {
        // A split pop may stop early (half the lease): pop until all are.
        match worker.cmd(&["RPOP", "held3", "1200"]) {
            Value::Array(items) => taken += items.len(),
            other => panic!("RPOP held3 1200: {other:?}"),
        }
    }
    stays_leased(&mut other, "held3", Duration::from_millis(3 * 600));
    let i = info(&s.proxy, "held3");
    let got: Vec<i64> = ["leased", "ready", "expiries"]
        .iter()
        .map(|f| int(&i[*f]))
        .collect();
    assert_eq!(got, vec![1200, 0, 0], "{i:?}");
}

#[test]
fn a_longer_queue_extend_outlasts_max_hold_ms() {
    let s = start();
    let mut worker = s.proxy.client();
    let mut other = s.proxy.client();
    worker.cmd(&["LPUSH", "bounded2", "asked-for"]);
    assert_eq!(worker.cmd(&["RPOP", "bounded2"]), Value::bulk("asked-for"));
    // An explicit lease is the worker's word: renewals never shorten it.
    assert_eq!(
        worker.cmd(&["QUEUE", "EXTEND", "bounded2", "asked-for", "600000"]),
        Value::Int(1)
    );
    stays_leased(&mut other, "bounded2", Duration::from_millis(2600));
    assert_eq!(queue_info_int(&s.proxy, "bounded2", "expiries"), 0);
}

// ------------------------------------------------------------ poison

/// A worker pops `payload` from `q` and its connection dies.
fn crash_on(s: &Setup, q: &str, payload: &str) {
    let mut worker = s.proxy.client();
    assert_eq!(pop_eventually(&mut worker, q), payload);
    let before = queue_info_int(&s.proxy, q, "disconnects");
    drop(worker);
    wait_until("the lease to end by the disconnect", || {
        queue_info_int(&s.proxy, q, "disconnects") == before + 1
    });
}

#[test]
fn a_message_that_kills_every_worker_is_flagged_as_poison() {
    let s = start();
    let mut c = s.proxy.client();
    // Popped first, and first again after each death (redeliver = next).
    c.cmd(&["LPUSH", "crash1", "fine"]);
    c.cmd(&["RPUSH", "crash1", "bad"]);
    // Two deaths: not yet.
    crash_on(&s, "crash1", "bad");
    crash_on(&s, "crash1", "bad");
    assert_eq!(queue_info_int(&s.proxy, "crash1", "poison"), 0);
    assert!(poison_ids(&s.proxy, "crash1").is_empty());
    // The third, as poison_after says.
    crash_on(&s, "crash1", "bad");
    let i = info(&s.proxy, "crash1");
    assert_eq!((int(&i["poison"]), int(&i["poisoned"])), (1, 1), "{i:?}");
    assert_eq!(poison_ids(&s.proxy, "crash1"), vec!["bad"]);
    assert_eq!(
        metric(s.ops, "ackproxy_poison_messages_total{rule=\"crash*\"}"),
        1.0
    );
    // The operations API (and so the web view) has it too.
    let r = http(s.ops, "GET", "/api/queues/crash1", &[], b"").expect("ops answers");
    assert_eq!(r.status, 200, "{}", r.text());
    let j: Json = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["poison"], 1, "{j}");
    assert_eq!(j["poison-ids"], serde_json::json!(["bad"]), "{j}");
    assert_eq!(j["poisoned"], 1, "{j}");
    // Flagged, not removed: still delivered, until acknowledged.
    let mut last = s.proxy.client();
    assert_eq!(pop_eventually(&mut last, "crash1"), "bad");
    assert_eq!(
        queue_info_int(&s.proxy, "crash1", "poison"),
        1,
        "leased still"
    );
    assert_eq!(last.cmd(&["ACK", "crash1", "bad"]), Value::Int(1));
    let i = info(&s.proxy, "crash1");
    assert_eq!((int(&i["poison"]), int(&i["poisoned"])), (0, 1), "{i:?}");
    assert!(poison_ids(&s.proxy, "crash1").is_empty());
}

#[test]
fn deliveries_ended_by_ack_or_nack_flag_nothing() {
    let s = start();
    let mut c = s.proxy.client();
    // Rejected three times, then three deaths: not every delivery ended
    // with a death, so the message is not what kills the workers.
    c.cmd(&["LPUSH", "crash2", "rejected"]);
    for _ in 0..3 {
        assert_eq!(pop_eventually(&mut c, "crash2"), "rejected");
        assert_eq!(c.cmd(&["NACK", "crash2", "rejected"]), Value::Int(1));
    }
    for _ in 0..3 {
        crash_on(&s, "crash2", "rejected");
    }
    // Two deaths, then done: acknowledged, gone, never flagged.
    c.cmd(&["LPUSH", "crash3", "survivor"]);
    crash_on(&s, "crash3", "survivor");
    crash_on(&s, "crash3", "survivor");
    assert_eq!(pop_eventually(&mut c, "crash3"), "survivor");
    assert_eq!(c.cmd(&["ACK", "crash3", "survivor"]), Value::Int(1));
    for q in ["crash2", "crash3"] {
        let i = info(&s.proxy, q);
        assert_eq!(
            (int(&i["poison"]), int(&i["poisoned"])),
            (0, 0),
            "{q}: {i:?}"
        );
    }
    assert_eq!(queue_info_int(&s.proxy, "crash2", "nacks"), 3);
    assert_eq!(
        metric(s.ops, "ackproxy_poison_messages_total{rule=\"crash*\"}"),
        0.0
    );
}
