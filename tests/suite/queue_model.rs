//! Random interleavings of queue operations checked against models, one
//! test per part:
//!
//! - The core: pushes (LPUSH and QUEUE PUSH) with duplicate payloads, every
//!   pop form with counts up to 10× the per-call bound, ACK (timely, late
//!   and unknown), NACK (also DELAY 0), EXTEND and lease expiry (forced with
//!   `QUEUE EXTEND id 1`). After every step the proxy's view (`QUEUE INFO`)
//!   and every reply must match the model: every message in exactly one
//!   place, none lost, none invented; at the end, once everything is
//!   acknowledged, no auxiliary key remains. (Move pops take part; what
//!   their destination holds is the client's own list and is checked by the
//!   queue tests, not here.)
//! - Consumers outside the proxy: a consumer that pops straight from Redis
//!   and `DEL` of the queue key, beside the proxy's own pops, ACKs (late
//!   ones too), NACKs and expiries. Ack ids repeat (a producer reuses an
//!   id once its message is done, also while a copy a late ACK marked is
//!   still in the list, and the new message's lease then ends), bodies
//!   never do: with identical bodies nobody, the proxy included, can tell
//!   which copy a direct consumer took, so no behaviour could be asserted.
//!   A late ACK of a copy that vanished must take nothing else out of the
//!   list, and a skip mark must cancel only the copy it was made for.
//! - `ack = "next-pop"` workers on several connections: real pops, pops
//!   pipelined in one write (two or three pops, a pop with a PING before or
//!   after it), two pops in one MULTI, explicit ACKs, expiries, NACKs and
//!   reconnects. Only the first pop of a write, or of a transaction,
//!   acknowledges the connection's earlier leases (and calls back copies
//!   of those that ran out); the others keep them.
//! - Dead-letter lists shared by several queues (a glob rule with a fixed
//!   `dead_letter`) beside lists of their own (`$queue`): every message
//!   pushed is acknowledged, dead in its queue's list exactly once, purged,
//!   or still in its own queue; a pop never returns another queue's message.
//! - Reloads (SIGHUP with a rewritten file) that add, remove and change
//!   rules (lease, ack policy, redelivery end) while leases are held and a
//!   pop is parked: nothing lost, no lease orphaned.
//!
//! Every part but the core keeps message bodies distinct and reads the list
//! straight from Redis after every step: each message must be where the
//! model says, and each pop must return exactly the elements the model
//! predicts from the list, in order.
//!
//! `ACKPROXY_MODEL_SEED` replays one sequence (name the test to replay only
//! it; a failure prints its seed and last steps); `ACKPROXY_MODEL_CASES`
//! sets how many sequences each test runs (default 6 for the core, 4 for
//! reloads, 3 for the others); `ACKPROXY_MODEL_TRACE=1` prints every step. Each part
//! counts what its actors did (direct pops, DELs, pipelined pops that kept
//! leases, reloads that removed a rule under a lease …); over the default
//! number of sequences every case must have happened, so that a change to
//! the generators cannot silently leave one out.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::*;

const CONFIG: &str = r#"
[[queue]]
pattern = "mq"
lease_ms = 600000
max_deliveries = 1000000
ack_id = "payload"
redeliver = "next"
pop_end = "right"

[reaper]
interval_ms = 10
batch = 100
"#;

/// Elements one pop script call takes at most (`queue::pop::POP_BATCH`).
const BOUND: u64 = 50;

type Bag = BTreeMap<String, i64>;

fn add(b: &mut Bag, p: &str, n: i64) {
    let e = b.entry(p.to_string()).or_insert(0);
    *e += n;
    assert!(*e >= 0, "model went negative for {p}");
    if *e == 0 {
        b.remove(p);
    }
}

fn total(b: &Bag) -> i64 {
    b.values().sum()
}

#[derive(Default)]
struct Model {
    ready: Bag,
    leased: Bag,
    /// Copies of a payload back in the list after their lease ended, not
    /// popped since: an ACK of that payload then is a late ACK.
    requeued: Bag,
    acked: i64,
    pushed: i64,
}

impl Model {
    fn popped(&mut self, p: &str) {
        assert!(
            self.ready.contains_key(p),
            "popped {p:?}, which the model does not have ready: {:?}",
            self.ready
        );
        add(&mut self.ready, p, -1);
        if self.requeued.contains_key(p) {
            add(&mut self.requeued, p, -1);
        }
        add(&mut self.leased, p, 1);
    }

    /// A lease of `p` ended without an ACK: back to the list.
    fn returned(&mut self, p: &str) {
        add(&mut self.leased, p, -1);
        add(&mut self.ready, p, 1);
        add(&mut self.requeued, p, 1);
    }
}

fn bulks(v: &Value) -> Vec<String> {
    match v {
        Value::Nil => vec![],
        Value::Bulk(b) => vec![String::from_utf8_lossy(b).into_owned()],
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                other => panic!("element {other:?}"),
            })
            .collect(),
        other => panic!("pop reply {other:?}"),
    }
}

/// The values of a reply that names its key: `[key, value]` or
/// `[key, [values]]`, or nil.
fn keyed_values(r: Value) -> Vec<String> {
    match r {
        Value::Nil => vec![],
        Value::Array(kv) => bulks(&kv[1]),
        other => panic!("pop reply {other:?}"),
    }
}

/// Sends `words` followed by `count`; returns the request and the values.
fn keyed(c: &mut Client, words: &[&str], count: u64) -> (Vec<String>, Vec<String>) {
    let a: Vec<String> = words
        .iter()
        .map(|s| s.to_string())
        .chain([count.to_string()])
        .collect();
    let r = c.cmd(&a.iter().map(String::as_str).collect::<Vec<_>>());
    (a, keyed_values(r))
}

fn info(c: &mut Client, field: &str) -> i64 {
    let Value::Array(items) = c.cmd(&["QUEUE", "INFO", "mq"]) else {
        panic!("QUEUE INFO")
    };
    for pair in items.chunks(2) {
        if pair[0] == Value::bulk(field) {
            return int(&pair[1]);
        }
    }
    panic!("no {field}")
}

fn check(c: &mut Client, m: &Model, step: &str) {
    // Forced expiries are handled by the reaper within a few intervals.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (ready, leased) = (info(c, "ready"), info(c, "leased"));
        if (ready, leased) == (total(&m.ready), total(&m.leased)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {step}: proxy says ready {ready} leased {leased}, model {} {}",
            total(&m.ready),
            total(&m.leased)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        m.pushed,
        total(&m.ready) + total(&m.leased) + m.acked,
        "after {step}: model bookkeeping"
    );
}

fn run(seed: u64) {
    run_in(seed, "0");
}

fn run_in_database_3(seed: u64) {
    run_in(seed, "3");
}

/// The model in database `db`: the client and the direct connection
/// select it first.
fn run_in(seed: u64, db: &str) {
    let (redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    let mut direct = redis.client();
    for conn in [&mut c, &mut direct] {
        assert_eq!(conn.cmd(&["SELECT", db]), Value::Simple("OK".into()));
    }
    let mut rng = Rng(seed | 1);
    let mut m = Model::default();
    // Few distinct payloads: duplicates in flight all the time.
    let payload = |rng: &mut Rng| format!("p{}", rng.below(12));
    let any_leased = |m: &Model, rng: &mut Rng| -> Option<String> {
        let keys: Vec<&String> = m.leased.keys().collect();
        (!keys.is_empty()).then(|| keys[rng.below(keys.len() as u64) as usize].clone())
    };
    for step in 0..120 {
        let op = rng.below(10);
        let label = match op {
            0 | 1 => {
                let big = rng.below(4) == 0;
                let n = 1 + rng.below(if big { 300 } else { 8 });
                let ps: Vec<String> = (0..n).map(|_| payload(&mut rng)).collect();
                // QUEUE PUSH (due now) puts them where LPUSH would.
                let queue_push = rng.below(2) == 0;
                let mut args = if queue_push {
                    vec!["QUEUE", "PUSH", "mq"]
                } else {
                    vec!["LPUSH", "mq"]
                };
                args.extend(ps.iter().map(String::as_str));
                if queue_push && rng.below(2) == 0 {
                    args.extend(["DELAY", "0"]);
                }
                let r = c.cmd(&args);
                if queue_push {
                    assert_eq!(r, Value::Int(n as i64), "{args:?}");
                }
                for p in &ps {
                    add(&mut m.ready, p, 1);
                }
                m.pushed += n as i64;
                format!("{} {n}", args[0])
            }
            2 | 3 => {
                let count = 1 + rng.below(BOUND * 10);
                let form = rng.below(6);
                let ready = total(&m.ready);
                let (args, got): (Vec<String>, Vec<String>) = match form {
                    0 | 4 => {
                        let verb = if form == 0 { "RPOP" } else { "LPOP" };
                        let a = vec![verb.into(), "mq".into(), count.to_string()];
                        let r = c.cmd(&a.iter().map(String::as_str).collect::<Vec<_>>());
                        (a, bulks(&r))
                    }
                    1 => keyed(&mut c, &["LMPOP", "1", "mq", "RIGHT", "COUNT"], count),
                    2 => keyed(
                        &mut c,
                        &["BLMPOP", "0.05", "1", "mq", "RIGHT", "COUNT"],
                        count,
                    ),
                    _ => {
                        let verb = if form == 3 { "BRPOP" } else { "BLPOP" };
                        let a: Vec<String> =
                            [verb, "mq", "0.05"].iter().map(|s| s.to_string()).collect();
                        let r = c.cmd(&a.iter().map(String::as_str).collect::<Vec<_>>());
                        (a, keyed_values(r))
                    }
                };
                let want = if form == 3 || form == 5 {
                    1
                } else {
                    count as i64
                };
                assert_eq!(
                    got.len() as i64,
                    want.min(ready),
                    "{args:?} with {ready} ready (seed {seed})"
                );
                for p in &got {
                    m.popped(p);
                }
                format!("{args:?} -> {}", got.len())
            }
            4 => {
                let forms: [&[&str]; 4] = [
                    &["RPOPLPUSH", "mq", "mdst"],
                    &["LMOVE", "mq", "mdst", "LEFT", "RIGHT"],
                    &["BRPOPLPUSH", "mq", "mdst", "0.05"],
                    &["BLMOVE", "mq", "mdst", "RIGHT", "LEFT", "0.05"],
                ];
                let args = forms[rng.below(4) as usize];
                let got = bulks(&c.cmd(args));
                assert_eq!(got.len() as i64, total(&m.ready).min(1), "{args:?}");
                for p in &got {
                    m.popped(p);
                }
                format!("{args:?} -> {got:?}")
            }
            5 | 6 => {
                // ACK a few ids: leased ones, late ones and unknown ones.
                let big = rng.below(4) == 0;
                let n = 1 + rng.below(if big { 200 } else { 5 });
                let ids: Vec<String> = (0..n)
                    .map(|_| {
                        if rng.below(5) == 0 {
                            format!("unknown{}", rng.below(3))
                        } else {
                            payload(&mut rng)
                        }
                    })
                    .collect();
                let mut expect = 0;
                for id in &ids {
                    // One lease of that payload, else one requeued copy.
                    if m.leased.contains_key(id) {
                        add(&mut m.leased, id, -1);
                        m.acked += 1;
                        expect += 1;
                    } else if m.requeued.contains_key(id) {
                        add(&mut m.requeued, id, -1);
                        add(&mut m.ready, id, -1);
                        m.acked += 1;
                        expect += 1;
                    }
                }
                let mut args = vec!["ACK", "mq"];
                args.extend(ids.iter().map(String::as_str));
                assert_eq!(int(&c.cmd(&args)), expect, "ACK {ids:?} (seed {seed})");
                format!("ACK {n}")
            }
            7 => {
                let Some(p) = any_leased(&m, &mut rng) else {
                    continue;
                };
                // DELAY 0 is at once, as a NACK under this rule's policy.
                let mut args = vec!["NACK", "mq", p.as_str()];
                if rng.below(2) == 0 {
                    args.extend(["DELAY", "0"]);
                }
                assert_eq!(c.cmd(&args), Value::Int(1));
                m.returned(&p);
                format!("{args:?}")
            }
            _ => {
                // Expiry: every lease of that payload ends in 1 ms.
                let Some(p) = any_leased(&m, &mut rng) else {
                    continue;
                };
                let n = m.leased[&p];
                let r = int(&c.cmd(&["QUEUE", "EXTEND", "mq", &p, "1"]));
                assert_eq!(r, n.min(100), "EXTEND {p}");
                for _ in 0..r {
                    m.returned(&p);
                }
                format!("expire {r} x {p}")
            }
        };
        note(format!("step {step}: {label}"));
        check(&mut c, &m, &format!("step {step}: {label} (seed {seed})"));
    }

    // Drain: acknowledge every lease, pop and acknowledge everything ready.
    for (p, n) in m.leased.clone() {
        for _ in 0..n {
            assert_eq!(c.cmd(&["ACK", "mq", &p]), Value::Int(1));
            m.acked += 1;
        }
    }
    m.leased.clear();
    loop {
        let got = bulks(&c.cmd(&["RPOP", "mq", "1000"]));
        if got.is_empty() {
            break;
        }
        for p in got {
            assert_eq!(c.cmd(&["ACK", "mq", &p]), Value::Int(1));
            m.acked += 1;
        }
    }
    assert_eq!(m.acked, m.pushed, "every message acknowledged exactly once");
    direct.cmd(&["DEL", "mdst"]);
    let left: Vec<String> = bulks(&direct.cmd(&["KEYS", "*"]))
        .into_iter()
        .filter(|k| !is_queue_stats(k))
        .collect();
    assert!(left.is_empty(), "keys left (seed {seed}): {left:?}");
    // Nothing of it in another database.
    let elsewhere = bulks(&redis.client().cmd(&["KEYS", "*"]));
    assert!(
        db == "0" || elsewhere.is_empty(),
        "database 0 holds keys of database {db}'s queue (seed {seed}): {elsewhere:?}"
    );
}

#[test]
fn random_interleavings_match_the_model() {
    run_seeds(6, run, &[]);
}

#[test]
fn random_interleavings_match_the_model_in_database_3() {
    run_seeds(6, run_in_database_3, &[]);
}

// ------------------------------------------------------------------ seeds

thread_local! {
    /// The last steps of the sequence running on this thread, printed when
    /// it fails.
    static TRACE: RefCell<VecDeque<String>> = const { RefCell::new(VecDeque::new()) };
    /// How often each case happened, over the sequences of one test.
    static SEEN: RefCell<BTreeMap<&'static str, usize>> = const { RefCell::new(BTreeMap::new()) };
}

/// Counts `n` occurrences of a case (see [`run_seeds`]).
fn seen(case: &'static str, n: usize) {
    SEEN.with(|s| *s.borrow_mut().entry(case).or_insert(0) += n);
}

/// Records a step; `ACKPROXY_MODEL_TRACE=1` also prints each one.
fn note(step: String) {
    if std::env::var("ACKPROXY_MODEL_TRACE").as_deref() == Ok("1") {
        println!("{step}");
    }
    TRACE.with(|t| {
        let mut t = t.borrow_mut();
        if t.len() == 40 {
            t.pop_front();
        }
        t.push_back(step);
    });
}

/// Prints the seed, the last steps and how to replay them when the
/// sequence it guards fails.
struct Replay(u64);

impl Drop for Replay {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let test = std::thread::current().name().unwrap_or("").to_string();
            let steps = TRACE.with(|t| t.borrow().iter().cloned().collect::<Vec<_>>());
            eprintln!(
                "model failed with seed {s}; its last steps:\n  {}\nreplay: \
                 ACKPROXY_MODEL_SEED={s} cargo test --release --test suite -- --exact {test}",
                steps.join("\n  "),
                s = self.0
            );
        }
    }
}

/// Runs `run` once with `ACKPROXY_MODEL_SEED`, else on
/// `ACKPROXY_MODEL_CASES` (default `cases`) seeds taken from the clock.
/// Over at least `cases` sequences, every case in `required` must have
/// been counted (with [`seen`]) at least once: a part whose actor never
/// acted tests nothing.
fn run_seeds(cases: u64, run: fn(u64), required: &[&'static str]) {
    let seeds: Vec<u64> = match std::env::var("ACKPROXY_MODEL_SEED") {
        Ok(s) => vec![s.parse().expect("ACKPROXY_MODEL_SEED: a number")],
        Err(_) => {
            let cases: u64 = std::env::var("ACKPROXY_MODEL_CASES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(cases);
            let base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            (0..cases)
                .map(|i| base.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
                .collect()
        }
    };
    SEEN.with(|s| s.borrow_mut().clear());
    let one = |seed: u64| {
        println!("seed {seed}");
        TRACE.with(|t| t.borrow_mut().clear());
        let _replay = Replay(seed);
        run(seed);
    };
    let missing = || -> Vec<&'static str> {
        SEEN.with(|s| {
            let seen = s.borrow();
            required
                .iter()
                .copied()
                .filter(|c| seen.get(c).copied().unwrap_or(0) == 0)
                .collect()
        })
    };
    for &seed in &seeds {
        one(seed);
    }
    let mut ran = seeds.len() as u64;
    if ran >= cases {
        // Random sequences reach a rare case only now and then: rather
        // than fail a run whose few sequences all missed it, go on with
        // further seeds, a bounded number, until every case has happened.
        let mut next = seeds.last().copied().unwrap_or(0);
        while !missing().is_empty() && ran < cases * 5 {
            next = next.wrapping_add(0x9E37_79B9_7F4A_7C15);
            one(next);
            ran += 1;
        }
        let seen = SEEN.with(|s| s.borrow().clone());
        println!("cases over {ran} sequences: {seen:?}");
        let missing = missing();
        assert!(
            missing.is_empty(),
            "over {ran} sequences these cases never happened: {missing:?} (all: {seen:?})"
        );
    }
}

// ----------------------------------------------------------------- helpers

/// A reply as text, bulk strings readable.
fn show(v: &Value) -> String {
    match v {
        Value::Bulk(b) => format!("{:?}", String::from_utf8_lossy(b)),
        Value::Array(a) => format!("[{}]", a.iter().map(show).collect::<Vec<_>>().join(", ")),
        Value::Int(i) => i.to_string(),
        Value::Nil => "nil".into(),
        Value::Simple(s) => format!("+{s}"),
        Value::Error(e) => format!("-{e}"),
        Value::Other(o) => format!("{:?}", String::from_utf8_lossy(o)),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("expected a bulk string, got {}", show(other)),
    }
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn words(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A list, read straight from Redis, left to right.
fn lrange(d: &mut Client, key: &str) -> Vec<String> {
    bulks(&d.cmd(&["LRANGE", key, "0", "-1"]))
}

/// `QUEUE INFO key` as field → value.
fn info_of(c: &mut Client, key: &str) -> BTreeMap<String, Value> {
    let v = c.cmd(&["QUEUE", "INFO", key]);
    let Value::Array(items) = &v else {
        panic!("QUEUE INFO {key}: {}", show(&v))
    };
    items
        .chunks(2)
        .map(|kv| (text(&kv[0]), kv[1].clone()))
        .collect()
}

fn field_int(info: &BTreeMap<String, Value>, name: &str) -> i64 {
    int(info
        .get(name)
        .unwrap_or_else(|| panic!("QUEUE INFO has no {name}")))
}

/// Every key in Redis but the queues' totals, sorted.
fn keys_left(d: &mut Client) -> Vec<String> {
    let mut k: Vec<String> = bulks(&d.cmd(&["KEYS", "*"]))
        .into_iter()
        .filter(|k| !is_queue_stats(k))
        .collect();
    k.sort();
    k
}

/// The name of one of a queue's auxiliary keys (docs/queues.md, "Keys"; the queues
/// here have no hash tag of their own).
fn aux(queue: &str, suffix: &str) -> String {
    format!("ackq:{{{queue}}}:{queue}:{suffix}")
}

/// Sends `cmds` in one write and reads their replies.
fn pipelined(c: &mut Client, cmds: &[Vec<String>]) -> Vec<Value> {
    let mut out = Vec::new();
    for cmd in cmds {
        let a: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
        out.extend(Client::encode(&a));
    }
    c.send_raw(&out);
    cmds.iter().map(|_| c.read_value()).collect()
}

/// One pop request and how to read its reply.
#[derive(Clone, Debug)]
struct PopCmd {
    args: Vec<String>,
    /// Pops from the right end.
    right: bool,
    /// Elements it takes at most.
    count: usize,
    /// The reply names the key (`[key, value]`, `[key, [values]]`).
    keyed: bool,
}

impl PopCmd {
    /// A random pop form on `key` for at most `max` elements; `blocking`:
    /// the blocking forms too (with a 50 ms timeout).
    fn random(rng: &mut Rng, key: &str, max: u64, blocking: bool) -> PopCmd {
        let n = 1 + rng.below(max);
        let ns = n.to_string();
        let (args, right, count, keyed): (Vec<&str>, bool, u64, bool) =
            match rng.below(if blocking { 8 } else { 5 }) {
                0 => (vec!["RPOP", key], true, 1, false),
                1 => (vec!["RPOP", key, &ns], true, n, false),
                2 => (vec!["LPOP", key, &ns], false, n, false),
                3 => (
                    vec!["LMPOP", "1", key, "RIGHT", "COUNT", &ns],
                    true,
                    n,
                    true,
                ),
                4 => (
                    vec!["LMPOP", "1", key, "LEFT", "COUNT", &ns],
                    false,
                    n,
                    true,
                ),
                5 => (vec!["BRPOP", key, "0.05"], true, 1, true),
                6 => (vec!["BLPOP", key, "0.05"], false, 1, true),
                _ => (
                    vec!["BLMPOP", "0.05", "1", key, "RIGHT", "COUNT", &ns],
                    true,
                    n,
                    true,
                ),
            };
        PopCmd {
            args: words(&args),
            right,
            count: count as usize,
            keyed,
        }
    }

    fn values(&self, v: Value) -> Vec<String> {
        if self.keyed {
            keyed_values(v)
        } else {
            bulks(&v)
        }
    }
}

/// What a pop takes from `list`: up to `count` elements from its end,
/// dropping those `skip` says are cancelled. Takes them out of `list`.
fn simulate(
    list: &mut VecDeque<String>,
    right: bool,
    count: usize,
    skip: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < count {
        let next = if right {
            list.pop_back()
        } else {
            list.pop_front()
        };
        let Some(v) = next else { break };
        if !skip(&v) {
            out.push(v);
        }
    }
    out
}

// -------------------------------------------------------------------- pool

/// Where one message of a [`Pool`] is.
#[derive(Clone, Debug, PartialEq)]
enum St {
    /// In the list. `requeued`: back after a lease ended and not popped
    /// since, so an ACK of its id now is a late ACK. `late`: the connection
    /// whose lease of it ran out on a next-pop rule; that connection's next
    /// pop is a late ACK of it.
    Ready { requeued: bool, late: Option<u64> },
    /// Leased; `owner`: the connection holding it, on a rule that tracks it.
    Leased { owner: Option<u64> },
    /// Acknowledged late while its copy was in the list: the proxy took the
    /// copy out or marked it, and no pop may return it.
    Cancelled,
    /// In its queue's dead-letter list.
    Dead,
    /// Gone for good, and how.
    Done(&'static str),
}

#[derive(Clone, Debug)]
struct Msg {
    id: String,
    st: St,
    deliveries: u32,
}

/// Which of the queue's totals a check compares.
#[derive(Clone, Copy, PartialEq)]
enum Totals {
    None,
    Acks,
    Both,
}

/// A queue whose messages all have distinct bodies, so that the list, read
/// straight from Redis, shows where each one is.
struct Pool {
    key: String,
    /// By body.
    msgs: BTreeMap<String, Msg>,
    /// Ack ids with copies that left the list behind the proxy's back
    /// after a lease of theirs ended (popped straight from Redis, deleted,
    /// popped while no rule covered the key). The proxy cannot know: it
    /// still counts them back in the list, so an ACK of such an id without
    /// a lease may answer 1 — but it must take nothing out of the list.
    vanished: BTreeMap<String, i64>,
    /// Skip marks whose copy left the list behind the proxy's back: a late
    /// ACK that did not find a copy within its list budget marked it (the
    /// model has it `Cancelled`), then it was popped straight from Redis,
    /// deleted or popped as a plain list. The proxy cannot know; it keeps
    /// the mark (a key remains) and `QUEUE INFO` counts it off ready (never
    /// below 0), until a pop through the proxy finds the list empty and
    /// drops it (see [`Pool::ran_out`]).
    stale: i64,
    /// Stale marks there may be beyond `stale`, until a check reads how
    /// many there are (see [`Pool::release`]).
    stale_slack: i64,
    /// By ack id, the connection that held the lease of a requeued copy
    /// when it ran out on a next-pop rule, the copy having left the list
    /// behind the proxy's back: that connection's next pop still calls it
    /// back (see [`Pool::release`]), unless an ACK of the id did first (a
    /// late ACK calls back one copy, whoever sends it: see
    /// [`Pool::ack_all`]).
    late_gone: BTreeMap<String, u64>,
    /// The ids of those marks, until they are dropped. They are reused,
    /// and their new messages' leases end (see [`free_id`]).
    tainted: std::collections::BTreeSet<String>,
    acks: i64,
    late_acks: i64,
    /// ACKs of ids whose copy vanished (for the summary).
    vanished_acks: usize,
}

impl Pool {
    fn new(key: &str) -> Pool {
        Pool {
            key: key.to_string(),
            msgs: BTreeMap::new(),
            vanished: BTreeMap::new(),
            stale: 0,
            stale_slack: 0,
            late_gone: BTreeMap::new(),
            tainted: Default::default(),
            acks: 0,
            late_acks: 0,
            vanished_acks: 0,
        }
    }

    fn add(&mut self, body: &str, id: &str) {
        let fresh = Msg {
            id: id.to_string(),
            st: St::Ready {
                requeued: false,
                late: None,
            },
            deliveries: 0,
        };
        assert!(
            self.msgs.insert(body.to_string(), fresh).is_none(),
            "body {body} pushed twice"
        );
    }

    fn count(&self, f: impl Fn(&St) -> bool) -> usize {
        self.msgs.values().filter(|m| f(&m.st)).count()
    }

    fn ready(&self) -> usize {
        self.count(|s| matches!(s, St::Ready { .. }))
    }

    fn leased(&self) -> usize {
        self.count(|s| matches!(s, St::Leased { .. }))
    }

    fn bodies(&self, f: impl Fn(&St) -> bool) -> Vec<String> {
        self.msgs
            .iter()
            .filter(|(_, m)| f(&m.st))
            .map(|(b, _)| b.clone())
            .collect()
    }

    fn any(&self, rng: &mut Rng, f: impl Fn(&St) -> bool) -> Option<String> {
        let b = self.bodies(f);
        (!b.is_empty()).then(|| b[rng.below(b.len() as u64) as usize].clone())
    }

    fn with_id(&self, id: &str, f: impl Fn(&St) -> bool) -> Option<String> {
        self.msgs
            .iter()
            .find(|(_, m)| m.id == id && f(&m.st))
            .map(|(b, _)| b.clone())
    }

    /// Whether a message with this id is in the list or leased.
    fn live(&self, id: &str) -> bool {
        self.with_id(id, |s| matches!(s, St::Ready { .. } | St::Leased { .. }))
            .is_some()
    }

    fn id(&self, body: &str) -> String {
        self.msgs[body].id.clone()
    }

    /// Whether a skip mark was made for a copy with this id: the copy is
    /// still in the list, or the mark is stale.
    fn marked(&self, id: &str) -> bool {
        self.tainted.contains(id) || self.with_id(id, |s| *s == St::Cancelled).is_some()
    }

    fn is_cancelled(&self, body: &str) -> bool {
        self.msgs.get(body).map(|m| &m.st) == Some(&St::Cancelled)
    }

    fn set(&mut self, body: &str, st: St) {
        self.msgs.get_mut(body).unwrap().st = st;
    }

    /// A pop through the proxy leased `body`.
    fn take(&mut self, body: &str, owner: Option<u64>) {
        let key = &self.key;
        let m = self
            .msgs
            .get_mut(body)
            .unwrap_or_else(|| panic!("a pop from {key} returned {body:?}, never pushed there"));
        assert!(
            matches!(m.st, St::Ready { .. }),
            "a pop from {key} returned {body:?}, which the model has {:?}",
            m.st
        );
        m.st = St::Leased { owner };
        m.deliveries += 1;
    }

    /// The next pop of connection `owner` on a next-pop rule: its leases
    /// are acknowledged, and copies of its leases that ran out, still in
    /// the list, are cancelled.
    fn release(&mut self, owner: u64) {
        // The list as the pop finds it (the model's list is exactly its
        // ready and cancelled copies).
        let list_exists = self
            .msgs
            .values()
            .any(|m| matches!(m.st, St::Ready { .. } | St::Cancelled));
        let (mut acks, mut late) = (0, 0);
        for m in self.msgs.values_mut() {
            match m.st {
                St::Leased { owner: Some(o) } if o == owner => {
                    m.st = St::Done("acknowledged by the next pop");
                    acks += 1;
                }
                St::Ready { late: Some(o), .. } if o == owner => {
                    m.st = St::Cancelled;
                    late += 1;
                }
                _ => {}
            }
        }
        self.acks += acks;
        self.late_acks += late;
        seen("next pops that acknowledged leases", (acks > 0) as usize);
        seen(
            "next pops that called back a late copy",
            (late > 0) as usize,
        );
        // Copies of its late leases that vanished: the late ACKs of one pop
        // share a list budget, which the first one spends whole (docs/queues.md,
        // "list elements a late ACK looks at"); that one forgets a copy it
        // does not find, the others mark theirs, and those marks are stale.
        // Which comes first the model cannot tell. Where the queue is no
        // list any more, every one of them is forgotten.
        let before = self.late_gone.len();
        self.late_gone.retain(|_, o| *o != owner);
        let gone = (before - self.late_gone.len()) as i64;
        if gone > 0 {
            seen("next pops that called back copies that vanished", 1);
            self.late_acks += gone;
            if list_exists {
                self.stale += gone - 1;
                self.stale_slack += (late > 0) as i64;
            }
        }
    }

    /// A pop through the proxy found the list empty (it took fewer than it
    /// asked for): the skip marks left went with the list.
    fn ran_out(&mut self) {
        if self.stale > 0 {
            seen("stale marks dropped by a pop that found the list empty", 1);
        }
        self.stale = 0;
        self.stale_slack = 0;
        self.tainted.clear();
    }

    /// Leases connection `owner` holds.
    fn held_by(&self, owner: u64) -> usize {
        self.count(|s| *s == St::Leased { owner: Some(owner) })
    }

    /// An ACK of one id: what it may answer, at least and at most.
    fn ack(&mut self, id: &str) -> (i64, i64) {
        if let Some(b) = self.with_id(id, |s| matches!(s, St::Leased { .. })) {
            self.set(&b, St::Done("acknowledged"));
            self.acks += 1;
            return (1, 1);
        }
        let requeued = |s: &St| matches!(s, St::Ready { requeued: true, .. });
        if let Some(b) = self.with_id(id, requeued) {
            self.set(&b, St::Cancelled);
            self.late_acks += 1;
            return (1, 1);
        }
        if self.vanished.get(id).copied().unwrap_or(0) > 0 {
            self.vanished_acks += 1;
            return (0, 1);
        }
        (0, 0)
    }

    /// ACK of `ids` through `c`: one call, but an id whose copy vanished
    /// goes in a call of its own. The list elements late ACKs look at are
    /// bounded per call (docs/queues.md, "list elements a late ACK looks at"): only
    /// the first late ACK of a call is sure to look at the list whole, and
    /// only one that did may forget a copy it does not find; a later one
    /// marks it. Alone, it must forget it: a mark would be stale at once.
    /// Returns the replies and whether any answer was open (an id whose
    /// copy vanished was named).
    fn ack_ids(&mut self, c: &mut Client, ids: &[String]) -> (Vec<i64>, bool) {
        let (apart, rest): (Vec<String>, Vec<String>) = ids
            .iter()
            .cloned()
            .partition(|id| self.vanished.contains_key(id));
        let (mut got, mut open) = (Vec::new(), false);
        for call in std::iter::once(rest).chain(apart.into_iter().map(|id| vec![id])) {
            if !call.is_empty() {
                let (n, o) = self.ack_all(c, &call);
                got.push(n);
                open |= o;
            }
        }
        (got, open)
    }

    /// ACK of `ids` through `c` in one call: checks the reply against the
    /// model. Returns the reply and whether the answer was open (an id
    /// whose copy vanished was named).
    fn ack_all(&mut self, c: &mut Client, ids: &[String]) -> (i64, bool) {
        let (mut lo, mut hi) = (0, 0);
        let mut open = Vec::new();
        for id in ids {
            let (a, b) = self.ack(id);
            lo += a;
            hi += b;
            if a < b {
                open.push(id.clone());
            }
        }
        let mut args = vec!["ACK", self.key.as_str()];
        args.extend(ids.iter().map(String::as_str));
        let got = int(&c.cmd(&args));
        assert!(
            lo <= got && got <= hi,
            "ACK {} {ids:?} answered {got}, the model expects {lo}..={hi}",
            self.key
        );
        if got == hi {
            // Each one the proxy still counted is now forgotten, and so is
            // the call-back its holder's next pop would have made: the late
            // ACK just made it (docs/ack-policies.md: the next pop calls
            // the redelivery back "as a late ACK does. ACK works as well").
            for id in &open {
                if let Some(n) = self.vanished.get_mut(id) {
                    *n -= 1;
                    if *n == 0 {
                        self.vanished.remove(id);
                    }
                }
                if self.late_gone.remove(id).is_some() {
                    seen("late ACKs of vanished copies a next pop would call back", 1);
                }
            }
        }
        (got, !open.is_empty())
    }

    /// A lease of `body` ended without an ACK (`expired`: it ran out, else
    /// a NACK): back in the list, or dead after `max` deliveries. Returns
    /// whether it died. `next_pop`: the rule it runs out under is a
    /// next-pop one; the connection that held it then calls its copy back
    /// with its next pop (a late ACK).
    fn end_lease(&mut self, body: &str, expired: bool, next_pop: bool, max: u32) -> bool {
        let m = self.msgs.get_mut(body).unwrap();
        let St::Leased { owner } = m.st else {
            panic!("the lease of {body:?} ended, but it is {:?}", m.st)
        };
        if m.deliveries >= max {
            m.st = St::Dead;
            return true;
        }
        let late = if expired && next_pop { owner } else { None };
        m.st = St::Ready {
            requeued: true,
            late,
        };
        false
    }

    /// `body` left the list behind the proxy's back.
    fn vanish(&mut self, body: &str, how: &'static str) {
        let key = &self.key;
        let m = self
            .msgs
            .get_mut(body)
            .unwrap_or_else(|| panic!("{how}: {body:?} was never pushed to {key}"));
        match m.st {
            St::Ready { requeued, late } => {
                if let Some(o) = late {
                    self.late_gone.insert(m.id.clone(), o);
                }
                if requeued {
                    *self.vanished.entry(m.id.clone()).or_insert(0) += 1;
                    seen("requeued copies that vanished", 1);
                }
                m.st = St::Done(how);
            }
            St::Cancelled => {
                // Still in the list after the check that followed its late
                // ACK: marked, not taken out.
                self.tainted.insert(m.id.clone());
                self.stale += 1;
                seen("marked copies that vanished", 1);
                m.st = St::Done(how);
            }
            ref other => panic!("{how}: {body:?} from {key}, which the model has {other:?}"),
        }
    }

    fn describe(&self) -> String {
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        let mut open = Vec::new();
        for (b, m) in &self.msgs {
            let name = match &m.st {
                St::Done(how) => format!("done ({how})"),
                other => {
                    open.push(format!("{b} {other:?}"));
                    format!("{other:?}")
                        .split([' ', '{'])
                        .next()
                        .unwrap()
                        .to_string()
                }
            };
            *by.entry(name).or_insert(0) += 1;
        }
        format!(
            "{by:?}; vanished {:?}; stale marks {}; not done: {open:?}",
            self.vanished, self.stale
        )
    }

    /// Compares the list (read straight from Redis) and, if `info`,
    /// `QUEUE INFO` with the model, waiting up to 10 s for the reaper.
    fn check(&mut self, c: &mut Client, d: &mut Client, info: bool, totals: Totals, step: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let list = lrange(d, &self.key);
            let mut present: BTreeMap<&str, usize> = BTreeMap::new();
            for b in &list {
                *present.entry(b.as_str()).or_insert(0) += 1;
            }
            // A cancelled copy that left the list was skipped by a pop or
            // taken out by the late ACK: done.
            for (b, m) in self.msgs.iter_mut() {
                if m.st == St::Cancelled && !present.contains_key(b.as_str()) {
                    m.st = St::Done("cancelled by a late ACK");
                }
            }
            let mut bad = Vec::new();
            for (b, n) in &present {
                if *n > 1 {
                    bad.push(format!("{b} is {n} times in the list"));
                }
                match self.msgs.get(*b) {
                    Some(m) if matches!(m.st, St::Ready { .. } | St::Cancelled) => {}
                    Some(m) => bad.push(format!("{b} is in the list; the model has it {:?}", m.st)),
                    None => bad.push(format!("{b} is in the list, never pushed there")),
                }
            }
            for (b, m) in &self.msgs {
                if matches!(m.st, St::Ready { .. }) && !present.contains_key(b.as_str()) {
                    bad.push(format!(
                        "{b} is not in the list; the model has it {:?}",
                        m.st
                    ));
                }
            }
            let mut seen_stale = None;
            if info {
                let i = info_of(c, &self.key);
                let (ready, leased) = (field_int(&i, "ready"), field_int(&i, "leased"));
                if leased != self.leased() as i64 {
                    bad.push(format!(
                        "QUEUE INFO leased {leased}, the model {}",
                        self.leased()
                    ));
                }
                // Ready is the list less the copies the proxy has marked,
                // stale marks included, and never below 0.
                let model = self.ready() as i64;
                let (lo, hi) = (self.stale, self.stale + self.stale_slack);
                if ready < (model - hi).max(0) || ready > (model - lo).max(0) {
                    bad.push(format!(
                        "QUEUE INFO ready {ready}, the model {model} less {lo}..={hi} stale skip \
                         marks, at least 0"
                    ));
                } else if ready > 0 {
                    seen_stale = Some((model - ready, model - ready));
                } else {
                    // At least as many marks as ready copies.
                    seen_stale = Some((lo.max(model), hi));
                }
                if totals != Totals::None && field_int(&i, "acks") != self.acks {
                    bad.push(format!(
                        "QUEUE INFO acks {}, the model {}",
                        field_int(&i, "acks"),
                        self.acks
                    ));
                }
                if totals == Totals::Both && field_int(&i, "late-acks") != self.late_acks {
                    bad.push(format!(
                        "QUEUE INFO late-acks {}, the model {}",
                        field_int(&i, "late-acks"),
                        self.late_acks
                    ));
                }
            }
            if bad.is_empty() {
                if let Some((lo, hi)) = seen_stale {
                    self.stale = lo;
                    self.stale_slack = hi - lo;
                }
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} after {step}:\n  {}\nlist (left to right): {list:?}\nmodel: {}",
                self.key,
                bad.join("\n  "),
                self.describe()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A pop of `cmd` through `c`, on a queue: its reply must be what the
    /// model predicts from the list; the elements are leased to `owner`.
    fn pop(&mut self, c: &mut Client, d: &mut Client, cmd: &PopCmd, owner: Option<u64>) -> usize {
        let mut list: VecDeque<String> = lrange(d, &self.key).into();
        let want = simulate(&mut list, cmd.right, cmd.count, &|b| self.is_cancelled(b));
        let got = cmd.values(c.cmd(&refs(&cmd.args)));
        assert_eq!(
            got, want,
            "{:?}: the reply, and what the model expects",
            cmd.args
        );
        for b in &got {
            self.take(b, owner);
        }
        if got.len() < cmd.count {
            self.ran_out();
        }
        got.len()
    }

    /// Acknowledges everything through `c` (whose pops are `owner`'s): the
    /// leases, then what is left in the list, popped and acknowledged; then
    /// ids whose copies vanished, so the proxy may forget them.
    fn drain(&mut self, c: &mut Client, d: &mut Client, owner: Option<u64>) {
        for b in self.bodies(|s| matches!(s, St::Leased { .. })) {
            let id = self.id(&b);
            assert_eq!(self.ack_all(c, std::slice::from_ref(&id)).0, 1, "ACK {id}");
        }
        loop {
            let cmd = PopCmd {
                args: words(&["RPOP", &self.key, "100"]),
                right: true,
                count: 100,
                keyed: false,
            };
            if self.pop(c, d, &cmd, owner) == 0 {
                break;
            }
            for b in self.bodies(|s| matches!(s, St::Leased { .. })) {
                let id = self.id(&b);
                assert_eq!(self.ack_all(c, std::slice::from_ref(&id)).0, 1, "ACK {id}");
            }
        }
        for (id, n) in self.vanished.clone() {
            for _ in 0..n {
                self.ack_all(c, std::slice::from_ref(&id));
            }
        }
    }

    /// After a drain: nothing is anywhere but acknowledged, dead, or gone
    /// otherwise; the summary of how.
    fn settled(&self) -> String {
        let open: Vec<_> = self
            .msgs
            .iter()
            .filter(|(_, m)| !matches!(m.st, St::Done(_) | St::Dead))
            .collect();
        assert!(open.is_empty(), "{}: not settled: {open:?}", self.key);
        let mut by: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.msgs.values() {
            let how = match m.st {
                St::Done(how) => how,
                _ => "dead",
            };
            *by.entry(how).or_insert(0) += 1;
        }
        format!("{}: {} messages: {by:?}", self.key, self.msgs.len())
    }

    /// Keys that may remain of this queue when skip marks are stale (the
    /// retry entry holding them, and the lease set's mark of it).
    fn stale_keys(&self) -> Vec<String> {
        if self.stale > 0 {
            vec![aux(&self.key, "retry"), aux(&self.key, "leases")]
        } else {
            vec![]
        }
    }
}

/// Asserts that Redis holds no key but the queues' totals and `allowed`.
fn assert_clean(d: &mut Client, allowed: &[String], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = keys_left(d)
            .into_iter()
            .filter(|k| !allowed.contains(k))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: keys left: {left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// -------------------------------------------- consumers outside the proxy

const OUTSIDE: &str = r#"
[[queue]]
pattern = "jq"
lease_ms = 600000
max_deliveries = 1000000
ack_id = "json:id"
redeliver = "next"
pop_end = "right"

[reaper]
interval_ms = 10
batch = 100
"#;

/// Ack ids producers reuse once no message with the id is in the list or
/// leased: `X0`…`X7`; `Y…` when all are in use. An id with a skip mark
/// (its copy still in the list, or stale) is reused too: the mark cancels
/// only the copy it was made for, also once the new message's lease ends
/// and it goes back to the list beside that copy.
fn free_id(p: &Pool, rng: &mut Rng, n: u64) -> String {
    let mut free: Vec<String> = (0..8)
        .map(|i| format!("X{i}"))
        .filter(|id| !p.live(id))
        .collect();
    let marked: Vec<String> = free.iter().filter(|id| p.marked(id)).cloned().collect();
    if !marked.is_empty() && rng.below(2) == 0 {
        free = marked;
    }
    if free.is_empty() {
        format!("Y{n}")
    } else {
        free[rng.below(free.len() as u64) as usize].clone()
    }
}

/// Two new messages through the proxy, popped, their leases run out, then
/// one ACK of both: the first late ACK takes its copy out, the second finds
/// the call's list budget spent and marks its copy.
fn mark_one(p: &mut Pool, c: &mut Client, d: &mut Client, rng: &mut Rng, n: &mut u64, step: u32) {
    let mut bodies = Vec::new();
    for _ in 0..2 {
        *n += 1;
        let id = free_id(p, rng, *n);
        let body = format!(r#"{{"id":"{id}","n":{n}}}"#);
        p.add(&body, &id);
        bodies.push(body);
    }
    let ids: Vec<String> = bodies.iter().map(|b| p.id(b)).collect();
    assert!(matches!(
        c.cmd(&["LPUSH", "jq", &bodies[0], &bodies[1]]),
        Value::Int(_)
    ));
    let cmd = PopCmd {
        args: words(&["LPOP", "jq", "2"]),
        right: false,
        count: 2,
        keyed: false,
    };
    assert_eq!(p.pop(c, d, &cmd, None), 2);
    for (b, id) in bodies.iter().zip(&ids) {
        let r = c.cmd(&["QUEUE", "EXTEND", "jq", id, "1"]);
        assert_eq!(r, Value::Int(1), "EXTEND {id} 1");
        p.end_lease(b, true, false, u32::MAX);
    }
    let label = format!("step {step}: {bodies:?} pushed, popped, expired");
    note(label.clone());
    p.check(c, d, true, Totals::Acks, &label);
    let (got, _) = p.ack_all(c, &ids);
    let label = format!("step {step}: ACK {ids:?} -> {got}");
    note(label.clone());
    p.check(c, d, true, Totals::Acks, &label);
}

/// A lease to end (NACK, expiry), if any; often one whose id has a skip
/// mark.
fn lease_to_end(p: &Pool, rng: &mut Rng) -> Option<String> {
    let leases = p.bodies(|s| matches!(s, St::Leased { .. }));
    let marked: Vec<&String> = leases.iter().filter(|b| p.marked(&p.id(b))).collect();
    let b = if !marked.is_empty() && rng.below(2) == 0 {
        marked[rng.below(marked.len() as u64) as usize].clone()
    } else {
        p.any(rng, |s| matches!(s, St::Leased { .. }))?
    };
    seen(
        "leases ended of ids with a skip mark",
        p.marked(&p.id(&b)) as usize,
    );
    Some(b)
}

/// An id to acknowledge: of a lease, of a copy back in the list, of a copy
/// that vanished, of a message done, or unknown.
fn ack_id_to_try(p: &Pool, rng: &mut Rng) -> String {
    let pick = |f: &dyn Fn(&St) -> bool, rng: &mut Rng| p.any(rng, f).map(|b| p.id(&b));
    let id = match rng.below(7) {
        0 | 1 => pick(&|s| matches!(s, St::Leased { .. }), rng),
        2..=4 => pick(&|s| matches!(s, St::Ready { requeued: true, .. }), rng),
        5 => {
            let v: Vec<&String> = p.vanished.keys().collect();
            (!v.is_empty()).then(|| v[rng.below(v.len() as u64) as usize].clone())
        }
        _ => pick(&|s| matches!(s, St::Done(_) | St::Cancelled), rng),
    };
    id.unwrap_or_else(|| format!("Z{}", rng.below(3)))
}

fn run_outside(seed: u64) {
    let (redis, proxy) = Proxy::with_redis(OUTSIDE);
    let mut c = proxy.client();
    let mut d = redis.client();
    let mut rng = Rng(seed | 1);
    let mut p = Pool::new("jq");
    let mut n = 0u64;
    for step in 0..150 {
        let label = match rng.below(26) {
            0..=3 => {
                let k = if rng.below(12) == 0 {
                    10 + rng.below(30)
                } else {
                    1 + rng.below(3)
                };
                let mut bodies = Vec::new();
                for _ in 0..k {
                    n += 1;
                    let id = free_id(&p, &mut rng, n);
                    if p.tainted.contains(&id) {
                        seen("messages reusing the id of a stale mark", 1);
                    }
                    let body = format!(r#"{{"id":"{id}","n":{n}}}"#);
                    p.add(&body, &id);
                    bodies.push(body);
                }
                let how = rng.below(3);
                let mut args = if how == 1 {
                    vec!["QUEUE", "PUSH", "jq"]
                } else {
                    vec!["LPUSH", "jq"]
                };
                args.extend(bodies.iter().map(String::as_str));
                let r = if how == 2 { d.cmd(&args) } else { c.cmd(&args) };
                assert!(matches!(r, Value::Int(_)), "{args:?}: {}", show(&r));
                let ids: Vec<String> = bodies.iter().map(|b| p.id(b)).collect();
                let how = ["LPUSH", "QUEUE PUSH", "LPUSH straight to Redis"][how as usize];
                format!("{how} {k}: ids {ids:?}")
            }
            4..=8 => {
                let max = if rng.below(6) == 0 { 120 } else { 6 };
                let cmd = PopCmd::random(&mut rng, "jq", max, true);
                let got = p.pop(&mut c, &mut d, &cmd, None);
                format!("{:?} -> {got}", cmd.args)
            }
            9..=12 => {
                let k = if rng.below(6) == 0 {
                    10 + rng.below(50)
                } else {
                    1 + rng.below(4)
                };
                let mut ids: Vec<String> = (0..k).map(|_| ack_id_to_try(&p, &mut rng)).collect();
                let requeued: Vec<String> = p
                    .bodies(|s| matches!(s, St::Ready { requeued: true, .. }))
                    .iter()
                    .map(|b| p.id(b))
                    .collect();
                if requeued.len() > 1 && rng.below(2) == 0 {
                    // Late ACKs of every copy back in the list, in one
                    // call: all but the first mark theirs.
                    ids = requeued;
                }
                let (got, _) = p.ack_ids(&mut c, &ids);
                format!("ACK {ids:?} -> {got:?}")
            }
            13 => {
                let Some(b) = lease_to_end(&p, &mut rng) else {
                    continue;
                };
                let id = p.id(&b);
                assert_eq!(c.cmd(&["NACK", "jq", &id]), Value::Int(1), "NACK {id}");
                p.end_lease(&b, false, false, u32::MAX);
                format!("NACK {id}")
            }
            14..=16 => {
                // Up to three leases run out.
                let mut ended = Vec::new();
                for _ in 0..1 + rng.below(3) {
                    let Some(b) = lease_to_end(&p, &mut rng) else {
                        break;
                    };
                    let id = p.id(&b);
                    let r = c.cmd(&["QUEUE", "EXTEND", "jq", &id, "1"]);
                    assert_eq!(r, Value::Int(1), "EXTEND {id} 1");
                    p.end_lease(&b, true, false, u32::MAX);
                    ended.push(b);
                }
                format!("expire {ended:?}")
            }
            17..=20 => {
                let k = 1 + rng.below(3);
                let verb = if rng.below(4) == 0 { "LPOP" } else { "RPOP" };
                let got = bulks(&d.cmd(&[verb, "jq", &k.to_string()]));
                seen(
                    "pops straight from Redis that took something",
                    (!got.is_empty()) as usize,
                );
                for b in &got {
                    p.vanish(b, "popped straight from Redis");
                }
                format!("{verb} jq {k} straight from Redis -> {got:?}")
            }
            21 => {
                let list = lrange(&mut d, "jq");
                d.cmd(&["DEL", "jq"]);
                seen(
                    "DELs of a list that held something",
                    (!list.is_empty()) as usize,
                );
                for b in &list {
                    p.vanish(b, "deleted with DEL");
                }
                format!("DEL jq ({} elements)", list.len())
            }
            22 | 23 => {
                // A producer reuses the id of a copy marked in the list
                // (marked here first if there is none); the new message is
                // popped from the other end of the list, and its lease runs
                // out: it goes back beside the marked copy, which keeps the
                // mark.
                let reusable = |p: &Pool| -> Option<String> {
                    p.bodies(|s| *s == St::Cancelled)
                        .iter()
                        .map(|b| p.id(b))
                        .find(|id| !p.live(id))
                };
                if reusable(&p).is_none() {
                    mark_one(&mut p, &mut c, &mut d, &mut rng, &mut n, step);
                }
                let Some(id) = reusable(&p) else {
                    continue;
                };
                n += 1;
                let body = format!(r#"{{"id":"{id}","n":{n}}}"#);
                p.add(&body, &id);
                assert!(matches!(c.cmd(&["LPUSH", "jq", &body]), Value::Int(_)));
                let cmd = PopCmd {
                    args: words(&["LPOP", "jq"]),
                    right: false,
                    count: 1,
                    keyed: false,
                };
                assert_eq!(p.pop(&mut c, &mut d, &cmd, None), 1);
                let r = c.cmd(&["QUEUE", "EXTEND", "jq", &id, "1"]);
                assert_eq!(r, Value::Int(1), "EXTEND {id} 1");
                seen("leases ended of ids with a skip mark", 1);
                p.end_lease(&body, true, false, u32::MAX);
                format!("LPUSH, LPOP and expire {body} beside its id's marked copy")
            }
            _ => {
                let cmd = PopCmd::random(&mut rng, "jq", 4, false);
                let got = p.pop(&mut c, &mut d, &cmd, None);
                format!("{:?} -> {got}", cmd.args)
            }
        };
        let label = format!("step {step}: {label}");
        note(label.clone());
        p.check(&mut c, &mut d, true, Totals::Acks, &label);
    }
    p.drain(&mut c, &mut d, None);
    note("drained".into());
    p.check(&mut c, &mut d, true, Totals::Acks, "the drain");
    seen("late ACKs of copies that vanished", p.vanished_acks);
    println!(
        "{}; late ACKs of vanished copies {}; stale marks {}",
        p.settled(),
        p.vanished_acks,
        p.stale
    );
    assert_clean(&mut d, &p.stale_keys(), "after the drain");
}

#[test]
fn consumers_outside_the_proxy_and_del_match_the_model() {
    run_seeds(
        3,
        run_outside,
        &[
            "pops straight from Redis that took something",
            "DELs of a list that held something",
            "requeued copies that vanished",
            "late ACKs of copies that vanished",
            "leases ended of ids with a skip mark",
            "stale marks dropped by a pop that found the list empty",
        ],
    );
}

// ------------------------------------------------------ next-pop workers

const NEXT_POP: &str = r#"
[[queue]]
pattern = "np"
lease_ms = 600000
max_deliveries = 1000000
ack_id = "payload"
ack = "next-pop"
redeliver = "next"
pop_end = "right"

[reaper]
interval_ms = 10
batch = 100
"#;

/// A worker: one connection, the model's name for it.
struct Worker {
    c: Client,
    owner: u64,
}

fn run_next_pop(seed: u64) {
    let (redis, proxy) = Proxy::with_redis(NEXT_POP);
    // Pushes, ACKs, NACKs, expiries and QUEUE INFO go through a connection
    // of their own: none of them is a pop.
    let mut o = proxy.client();
    let mut d = redis.client();
    let mut rng = Rng(seed | 1);
    let mut p = Pool::new("np");
    let mut owners = 0u64;
    let worker = |owners: &mut u64| {
        *owners += 1;
        Worker {
            c: proxy.client(),
            owner: *owners,
        }
    };
    let mut ws: Vec<Worker> = (0..3).map(|_| worker(&mut owners)).collect();
    let mut n = 0u64;
    for step in 0..150 {
        let w = rng.below(ws.len() as u64) as usize;
        let label = match rng.below(20) {
            0..=3 => {
                let k = 1 + rng.below(5);
                let bodies: Vec<String> = (0..k)
                    .map(|_| {
                        n += 1;
                        format!("n{n}")
                    })
                    .collect();
                for b in &bodies {
                    p.add(b, b);
                }
                let mut args = vec!["LPUSH", "np"];
                args.extend(bodies.iter().map(String::as_str));
                let direct = rng.below(3) == 0;
                let r = if direct { d.cmd(&args) } else { o.cmd(&args) };
                assert!(matches!(r, Value::Int(_)), "{args:?}: {}", show(&r));
                format!("LPUSH {bodies:?}")
            }
            4..=7 => {
                // A pop sent after every reply: the next one.
                let cmd = PopCmd::random(&mut rng, "np", 3, true);
                let owner = ws[w].owner;
                p.release(owner);
                let got = p.pop(&mut ws[w].c, &mut d, &cmd, Some(owner));
                format!("worker {owner}: {:?} -> {got}", cmd.args)
            }
            8..=11 => {
                // One write: pops and PINGs, only the first pop is next.
                let shapes: [&[bool]; 5] = [
                    &[true, true],
                    &[true, false],
                    &[false, true],
                    &[true, true, true],
                    &[false, true, true],
                ];
                let shape = shapes[rng.below(5) as usize];
                let owner = ws[w].owner;
                let mut list: VecDeque<String> = lrange(&mut d, "np").into();
                let mut cmds = Vec::new();
                let mut want = Vec::new();
                let mut first = true;
                for &is_pop in shape {
                    if !is_pop {
                        cmds.push(words(&["PING"]));
                        want.push(None);
                        continue;
                    }
                    if first {
                        p.release(owner);
                        first = false;
                    } else {
                        // What the pops before it in this write took is
                        // leased by now: this pop must keep it.
                        let taken: usize = want
                            .iter()
                            .flatten()
                            .map(|(_, v): &(PopCmd, Vec<String>)| v.len())
                            .sum();
                        let held = p.held_by(owner) + taken;
                        seen(
                            "pipelined pops behind leases they keep",
                            (held > 0) as usize,
                        );
                    }
                    let cmd = PopCmd::random(&mut rng, "np", 3, true);
                    let values = simulate(&mut list, cmd.right, cmd.count, &|b| p.is_cancelled(b));
                    cmds.push(cmd.args.clone());
                    want.push(Some((cmd, values)));
                }
                let replies = pipelined(&mut ws[w].c, &cmds);
                let mut shown = Vec::new();
                for (reply, want) in replies.into_iter().zip(want) {
                    match want {
                        None => assert_eq!(reply, Value::Simple("PONG".into())),
                        Some((cmd, values)) => {
                            let got = cmd.values(reply);
                            assert_eq!(got, values, "{:?} in the write {cmds:?}", cmd.args);
                            for b in &got {
                                p.take(b, Some(owner));
                            }
                            if got.len() < cmd.count {
                                p.ran_out();
                            }
                            shown.push(format!("{:?} -> {}", cmd.args, got.len()));
                        }
                    }
                }
                format!("worker {owner}, one write: {cmds:?} -> {shown:?}")
            }
            12 | 13 => {
                // Two pops in one transaction: the first is next.
                let owner = ws[w].owner;
                let c = &mut ws[w].c;
                assert_eq!(c.cmd(&["MULTI"]), Value::Simple("OK".into()));
                let cmds: Vec<PopCmd> = (0..2)
                    .map(|_| PopCmd::random(&mut rng, "np", 3, false))
                    .collect();
                for cmd in &cmds {
                    assert_eq!(c.cmd(&refs(&cmd.args)), Value::Simple("QUEUED".into()));
                }
                p.release(owner);
                let mut list: VecDeque<String> = lrange(&mut d, "np").into();
                let want: Vec<Vec<String>> = cmds
                    .iter()
                    .map(|cmd| simulate(&mut list, cmd.right, cmd.count, &|b| p.is_cancelled(b)))
                    .collect();
                seen(
                    "second pops in MULTI behind leases they keep",
                    (p.held_by(owner) + want[0].len() > 0) as usize,
                );
                let Value::Array(replies) = c.cmd(&["EXEC"]) else {
                    panic!("EXEC")
                };
                for ((cmd, reply), want) in cmds.iter().zip(replies).zip(want) {
                    let got = cmd.values(reply);
                    assert_eq!(got, want, "{:?} in MULTI", cmd.args);
                    for b in &got {
                        p.take(b, Some(owner));
                    }
                    if got.len() < cmd.count {
                        p.ran_out();
                    }
                }
                format!(
                    "worker {owner}: MULTI {:?} {:?} EXEC",
                    cmds[0].args, cmds[1].args
                )
            }
            14 | 15 => {
                let ids: Vec<String> = (0..1 + rng.below(3))
                    .map(|_| ack_id_to_try(&p, &mut rng))
                    .collect();
                let (got, _) = p.ack_all(&mut o, &ids);
                format!("ACK {ids:?} -> {got}")
            }
            16 | 17 => {
                let Some(b) = p.any(&mut rng, |s| matches!(s, St::Leased { .. })) else {
                    continue;
                };
                let r = o.cmd(&["QUEUE", "EXTEND", "np", &b, "1"]);
                assert_eq!(r, Value::Int(1), "EXTEND {b} 1");
                let holder = p.msgs[&b].st.clone();
                p.end_lease(&b, true, true, u32::MAX);
                format!("expire {b} ({holder:?})")
            }
            18 => {
                let Some(b) = p.any(&mut rng, |s| matches!(s, St::Leased { .. })) else {
                    continue;
                };
                assert_eq!(o.cmd(&["NACK", "np", &b]), Value::Int(1), "NACK {b}");
                p.end_lease(&b, false, true, u32::MAX);
                format!("NACK {b}")
            }
            _ => {
                // The worker goes; its leases stay until they run out or
                // are acknowledged. Another connection takes its place.
                let old = ws[w].owner;
                ws[w] = worker(&mut owners);
                format!("worker {old} disconnects; worker {} connects", ws[w].owner)
            }
        };
        let label = format!("step {step}: {label}");
        note(label.clone());
        p.check(&mut o, &mut d, true, Totals::Both, &label);
    }
    owners += 1;
    p.drain(&mut o, &mut d, Some(owners));
    note("drained".into());
    p.check(&mut o, &mut d, true, Totals::Both, "the drain");
    println!("{}", p.settled());
    assert_clean(&mut d, &[], "after the drain");
}

#[test]
fn pipelined_next_pop_workers_match_the_model() {
    run_seeds(
        3,
        run_next_pop,
        &[
            "next pops that acknowledged leases",
            "next pops that called back a late copy",
            "pipelined pops behind leases they keep",
            "second pops in MULTI behind leases they keep",
        ],
    );
}

// ------------------------------------------------- shared dead-letter lists

const SHARED_DEAD: &str = r#"
[[queue]]
pattern = "sd:*"
lease_ms = 600000
max_deliveries = 2
ack_id = "payload"
dead_letter = "sd-dead"
redeliver = "next"
pop_end = "right"

[[queue]]
pattern = "own:*"
lease_ms = 600000
max_deliveries = 1
ack_id = "payload"
dead_letter = "own-dead:$queue"
redeliver = "last"
pop_end = "right"

[reaper]
interval_ms = 10
batch = 100
"#;

const DEAD_QUEUES: [&str; 5] = ["sd:a", "sd:b", "sd:c", "own:a", "own:b"];

fn dead_list(q: &str) -> String {
    if q.starts_with("sd:") {
        "sd-dead".into()
    } else {
        format!("own-dead:{q}")
    }
}

/// The queue a body was pushed to (bodies are `queue/n`).
fn origin(body: &str) -> &str {
    &body[..body.find('/').unwrap()]
}

fn run_shared_dead(seed: u64) {
    let (redis, proxy) = Proxy::with_redis(SHARED_DEAD);
    let mut c = proxy.client();
    let mut d = redis.client();
    let mut rng = Rng(seed | 1);
    let mut pools: BTreeMap<&str, Pool> = DEAD_QUEUES.iter().map(|q| (*q, Pool::new(q))).collect();
    // Each dead-letter list, oldest first.
    let mut dead: BTreeMap<String, Vec<String>> =
        DEAD_QUEUES.iter().map(|q| (dead_list(q), vec![])).collect();
    let mut n = 0u64;
    for step in 0..120 {
        let q = DEAD_QUEUES[rng.below(5) as usize];
        let list = dead_list(q);
        let shared = q.starts_with("sd:");
        let p = pools.get_mut(q).unwrap();
        let label = match rng.below(20) {
            0..=3 => {
                let bodies: Vec<String> = (0..1 + rng.below(3))
                    .map(|_| {
                        n += 1;
                        format!("{q}/{n}")
                    })
                    .collect();
                for b in &bodies {
                    p.add(b, b);
                }
                let queue_push = rng.below(2) == 0;
                let mut args = if queue_push {
                    vec!["QUEUE", "PUSH", q]
                } else {
                    vec!["LPUSH", q]
                };
                args.extend(bodies.iter().map(String::as_str));
                let r = c.cmd(&args);
                match r {
                    Value::Int(k) if !queue_push || k == bodies.len() as i64 => {}
                    other => panic!("{args:?}: {}", show(&other)),
                }
                format!("push {bodies:?}")
            }
            4..=8 => {
                let cmd = PopCmd::random(&mut rng, q, 3, true);
                let got = p.pop(&mut c, &mut d, &cmd, None);
                format!("{:?} -> {got}", cmd.args)
            }
            9 => {
                let ids: Vec<String> = (0..1 + rng.below(3))
                    .map(|_| match rng.below(4) {
                        0 => p.any(&mut rng, |s| *s == St::Dead),
                        _ => Some(ack_id_to_try(p, &mut rng)),
                    })
                    .map(|id| id.unwrap_or_else(|| "none".into()))
                    .collect();
                let (got, _) = p.ack_all(&mut c, &ids);
                format!("ACK {q} {ids:?} -> {got}")
            }
            10..=13 => {
                // Up to three leases end (often: messages must die twice
                // on the shared list's queues to reach it).
                let mut ended = Vec::new();
                for _ in 0..1 + rng.below(3) {
                    let Some(b) = p.any(&mut rng, |s| matches!(s, St::Leased { .. })) else {
                        break;
                    };
                    let nack = rng.below(2) == 0;
                    let r = if nack {
                        c.cmd(&["NACK", q, &b])
                    } else {
                        c.cmd(&["QUEUE", "EXTEND", q, &b, "1"])
                    };
                    let verb = if nack { "NACK" } else { "expire" };
                    assert_eq!(r, Value::Int(1), "{verb} {b}");
                    let max = if shared { 2 } else { 1 };
                    let died = p.end_lease(&b, !nack, false, max);
                    if died {
                        dead.get_mut(&list).unwrap().push(b.clone());
                    }
                    // The next one ends after this one is where it goes, so
                    // that a dead-letter list's order is known.
                    let there = if died { list.as_str() } else { q };
                    wait_until(&format!("{b} in {there}"), || {
                        lrange(&mut d, there).contains(&b)
                    });
                    ended.push(format!("{verb} {b}{}", if died { ": dead" } else { "" }));
                }
                if ended.is_empty() {
                    continue;
                }
                format!("{ended:?}")
            }
            14 | 15 => {
                // Redrive or purge: refused on a shared list (it cannot
                // tell one queue's dead letters from another's).
                let purge = rng.below(3) == 0;
                let count = (rng.below(2) == 0).then(|| 1 + rng.below(3));
                let mut args = vec!["QUEUE".to_string()];
                if purge {
                    args.extend(words(&["PURGE", q, "DEAD"]));
                } else {
                    args.extend(words(&["REDRIVE", q]));
                    if let Some(k) = count {
                        args.extend(words(&["COUNT", &k.to_string()]));
                    }
                }
                let r = c.cmd(&refs(&args));
                let letters = dead.get_mut(&list).unwrap();
                let own: Vec<String> = letters.iter().filter(|b| origin(b) == q).cloned().collect();
                let p = pools.get_mut(q).unwrap();
                let label = format!("{args:?} -> {}", show(&r));
                match r {
                    Value::Error(e) if shared => {
                        assert!(
                            e.contains("sd-dead") && e.contains("shared"),
                            "{args:?}: {e}"
                        );
                        seen("REDRIVE or PURGE refused on a shared list", 1);
                        let others = letters.iter().any(|b| origin(b) != q);
                        seen(
                            "refused while the shared list held the queue's and others' letters",
                            (others && !own.is_empty()) as usize,
                        );
                    }
                    Value::Int(k) if !shared => {
                        let want = if purge {
                            own.len()
                        } else {
                            own.len().min(count.unwrap_or(u64::MAX) as usize)
                        };
                        assert_eq!(
                            k as usize, want,
                            "{args:?}: {q}'s own dead letters are {own:?}; {list} holds {letters:?}"
                        );
                        seen(
                            "REDRIVE or PURGE of an own list that moved something",
                            (want > 0) as usize,
                        );
                        for b in &own[..want] {
                            letters.retain(|x| x != b);
                            if purge {
                                p.set(b, St::Done("purged"));
                            } else {
                                // Redriven as a new message.
                                p.set(
                                    b,
                                    St::Ready {
                                        requeued: false,
                                        late: None,
                                    },
                                );
                                p.msgs.get_mut(b).unwrap().deliveries = 0;
                            }
                        }
                    }
                    other => panic!("{args:?}: {}", show(&other)),
                }
                label
            }
            16 => {
                let r = c.cmd(&["QUEUE", "DEAD", q, "COUNT", "5"]);
                let Value::Array(entries) = &r else {
                    panic!("QUEUE DEAD {q}: {}", show(&r))
                };
                let shown: Vec<String> = entries
                    .iter()
                    .map(|e| match field(e, "payload") {
                        Some(payload) => text(&payload),
                        None => panic!("QUEUE DEAD {q}: {}", show(e)),
                    })
                    .collect();
                let want: Vec<String> = dead[&list].iter().take(5).cloned().collect();
                assert_eq!(shown, want, "QUEUE DEAD {q} COUNT 5: the oldest of {list}");
                format!("QUEUE DEAD {q} -> {}", shown.len())
            }
            _ => {
                let cmd = PopCmd::random(&mut rng, q, 3, false);
                let got = p.pop(&mut c, &mut d, &cmd, None);
                format!("{:?} -> {got}", cmd.args)
            }
        };
        let label = format!("step {step}: {label}");
        note(label.clone());
        check_dead(&mut c, &mut d, &mut pools, &dead, &label);
        let origins: std::collections::BTreeSet<&str> =
            dead["sd-dead"].iter().map(|b| origin(b)).collect();
        seen(
            "steps with several queues' letters in the shared list",
            (origins.len() > 1) as usize,
        );
    }
    for p in pools.values_mut() {
        p.drain(&mut c, &mut d, None);
    }
    note("drained".into());
    check_dead(&mut c, &mut d, &mut pools, &dead, "the drain");
    let (mut pushed, mut dead_n) = (0, 0);
    for p in pools.values() {
        println!("{}", p.settled());
        pushed += p.msgs.len();
        dead_n += p.count(|s| *s == St::Dead);
    }
    assert_eq!(
        dead_n,
        dead.values().map(Vec::len).sum::<usize>(),
        "dead letters"
    );
    println!("{pushed} messages, {dead_n} dead");
    let mut allowed: Vec<String> = dead.keys().cloned().collect();
    allowed.extend(DEAD_QUEUES.iter().map(|q| aux(q, "history")));
    assert_clean(&mut d, &allowed, "after the drain");
}

/// Every queue as [`Pool::check`] does, its `QUEUE INFO` dead count, and
/// every dead-letter list whole, in order.
fn check_dead(
    c: &mut Client,
    d: &mut Client,
    pools: &mut BTreeMap<&str, Pool>,
    dead: &BTreeMap<String, Vec<String>>,
    step: &str,
) {
    // The queues first: their checks wait for the reaper, which moves dead
    // letters in the same call as it ends their leases.
    for p in pools.values_mut() {
        p.check(c, d, true, Totals::Both, step);
    }
    for q in pools.keys() {
        let list = dead_list(q);
        let shown = field_int(&info_of(c, q), "dead");
        assert_eq!(
            shown,
            dead[&list].len() as i64,
            "after {step}: QUEUE INFO {q} dead (the list {list} whole)"
        );
    }
    for (list, want) in dead {
        assert_eq!(&lrange(d, list), want, "after {step}: the list {list}");
    }
}

#[test]
fn shared_dead_letter_lists_match_the_model() {
    run_seeds(
        3,
        run_shared_dead,
        &[
            "steps with several queues' letters in the shared list",
            "REDRIVE or PURGE refused on a shared list",
            "REDRIVE or PURGE of an own list that moved something",
        ],
    );
}

// ----------------------------------------------------------------- reloads

/// One rule's settings that reloads change.
#[derive(Clone, Copy, Debug, PartialEq)]
struct RuleCfg {
    lease_ms: u64,
    next_pop: bool,
    redeliver_next: bool,
}

impl RuleCfg {
    fn random(rng: &mut Rng) -> RuleCfg {
        RuleCfg {
            lease_ms: [600_000, 300_000][rng.below(2) as usize],
            next_pop: rng.below(2) == 0,
            redeliver_next: rng.below(2) == 0,
        }
    }

    fn short(&self) -> String {
        format!(
            "{}s/{}/{}",
            self.lease_ms / 1000,
            if self.next_pop {
                "next-pop"
            } else {
                "explicit"
            },
            if self.redeliver_next { "next" } else { "last" }
        )
    }

    fn toml(&self, pattern: &str) -> String {
        format!(
            "[[queue]]\npattern = \"{pattern}\"\nlease_ms = {}\nmax_deliveries = 1000000\n\
             ack_id = \"payload\"\nack = \"{}\"\nredeliver = \"{}\"\npop_end = \"right\"\n\n",
            self.lease_ms,
            if self.next_pop {
                "next-pop"
            } else {
                "explicit"
            },
            if self.redeliver_next { "next" } else { "last" },
        )
    }
}

/// The rules in force: a glob for every queue, exact ones for two.
#[derive(Clone, Debug, PartialEq)]
struct RuleSet {
    glob: Option<RuleCfg>,
    a: Option<RuleCfg>,
    b: Option<RuleCfg>,
}

const RELOAD_QUEUES: [&str; 3] = ["rl:a", "rl:b", "rl:c"];

impl RuleSet {
    fn random(rng: &mut Rng) -> RuleSet {
        let mut maybe = || (rng.below(10) < 7).then(|| RuleCfg::random(rng));
        RuleSet {
            glob: maybe(),
            a: maybe(),
            b: maybe(),
        }
    }

    fn rule(&self, q: &str) -> Option<RuleCfg> {
        match q {
            "rl:a" => self.a.or(self.glob),
            "rl:b" => self.b.or(self.glob),
            _ => self.glob,
        }
    }

    /// Gives `q` a rule again (its exact one, or the glob).
    fn keep(&mut self, q: &str, cfg: RuleCfg) {
        match q {
            "rl:a" => self.a = Some(cfg),
            "rl:b" => self.b = Some(cfg),
            _ => self.glob = Some(cfg),
        }
    }

    /// The rules by pattern, in the file's order.
    fn by_pattern(&self) -> Vec<(&'static str, RuleCfg)> {
        [("rl:a", self.a), ("rl:b", self.b), ("rl:*", self.glob)]
            .into_iter()
            .filter_map(|(p, r)| r.map(|r| (p, r)))
            .collect()
    }

    /// Leaves `q` without a rule (its exact one and the glob go).
    fn remove(&mut self, q: &str) {
        match q {
            "rl:a" => self.a = None,
            "rl:b" => self.b = None,
            _ => {}
        }
        self.glob = None;
    }

    fn short(&self) -> String {
        let one = |r: Option<RuleCfg>| r.map_or("-".to_string(), |r| r.short());
        format!(
            "rl:a {} rl:b {} rl:* {}",
            one(self.a),
            one(self.b),
            one(self.glob)
        )
    }

    fn toml(&self, metrics: u16) -> String {
        let mut s = format!("metrics = \"127.0.0.1:{metrics}\"\n\n");
        for (pattern, r) in [("rl:a", self.a), ("rl:b", self.b), ("rl:*", self.glob)] {
            if let Some(r) = r {
                s += &r.toml(pattern);
            }
        }
        s + "[reaper]\ninterval_ms = 10\nbatch = 100\n"
    }
}

/// A proxy reading a configuration file the test rewrites, logging where
/// the test can see that a reload happened.
struct Reloading {
    proxy: Proxy,
    config: PathBuf,
    log: PathBuf,
}

impl Reloading {
    fn start(redis: &Redis, toml: &str) -> Reloading {
        let (proxy, config, log) = Proxy::start_reloadable(redis.port, "ackproxy-model", toml);
        Reloading { proxy, config, log }
    }

    fn reloads(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches("configuration reloaded")
            .count()
    }

    fn reload(&self, toml: &str) {
        let before = self.reloads();
        std::fs::write(&self.config, toml).unwrap();
        self.proxy.hangup();
        wait_until("the reload in the log", || self.reloads() > before);
    }
}

impl Drop for Reloading {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The removed rules the proxy remembers after a reload from `old` to
/// `new`: those `old` had and `new` has not, then those removed before,
/// one per pattern (the proxy's `Rules::replace`).
fn retire(
    retired: &[(&'static str, RuleCfg)],
    old: &RuleSet,
    new: &RuleSet,
) -> Vec<(&'static str, RuleCfg)> {
    let back = new.by_pattern();
    let mut kept: Vec<(&'static str, RuleCfg)> = Vec::new();
    for (p, r) in old.by_pattern().into_iter().chain(retired.iter().copied()) {
        if !back.iter().any(|(b, _)| *b == p) && !kept.iter().any(|(k, _)| *k == p) {
            kept.push((p, r));
        }
    }
    kept
}

/// The removed rule the proxy ends `q`'s leases under when no rule holds
/// it: an exact one before the glob, however long ago it went.
fn retired_rule(retired: &[(&'static str, RuleCfg)], q: &str) -> Option<RuleCfg> {
    let exact = retired.iter().find(|(p, _)| *p == q);
    exact
        .or_else(|| retired.iter().find(|(p, _)| *p == "rl:*"))
        .map(|(_, r)| *r)
}

/// The model's names of the two connections.
const MAIN: u64 = 1;
const PARKED: u64 = 2;

fn run_reloads(seed: u64) {
    let mut rng = Rng(seed | 1);
    let metrics = free_port();
    let mut rules = RuleSet {
        glob: Some(RuleCfg::random(&mut rng)),
        a: Some(RuleCfg::random(&mut rng)),
        b: Some(RuleCfg::random(&mut rng)),
    };
    let redis = Redis::start();
    let s = Reloading::start(&redis, &rules.toml(metrics));
    let mut c = s.proxy.client();
    let mut c2 = s.proxy.client();
    let mut d = redis.client();
    let mut pools: BTreeMap<&str, Pool> =
        RELOAD_QUEUES.iter().map(|q| (*q, Pool::new(q))).collect();
    let mut n = 0u64;
    let mut retired: Vec<(&'static str, RuleCfg)> = Vec::new();

    // `parked`: a queue with a pop parked on it, whose leases must not run
    // out (the pop would take their copies back).
    let reload = |c: &mut Client,
                  rng: &mut Rng,
                  rules: &mut RuleSet,
                  new: RuleSet,
                  pools: &mut BTreeMap<&str, Pool>,
                  retired: &mut Vec<(&'static str, RuleCfg)>,
                  parked: Option<&str>|
     -> String {
        seen("reloads", 1);
        let now_retired = retire(retired, rules, &new);
        // Some leases of the queues losing their rule run out soon after:
        // the reaper must hand them back under the removed rule.
        let mut abandoned = Vec::new();
        for q in RELOAD_QUEUES {
            match (rules.rule(q), new.rule(q)) {
                (Some(old), None) => {
                    let p = pools.get_mut(q).unwrap();
                    let leases = p.bodies(|s| matches!(s, St::Leased { .. }));
                    seen(
                        "reloads that removed the rule of a queue holding leases",
                        (!leases.is_empty()) as usize,
                    );
                    // The proxy resolves a queue without a rule under an
                    // exact removed rule before a glob removed later (not
                    // "the latest removed rule that matched it", as
                    // `Rules::resolve_leased` says). A next-pop worker's
                    // lease running out there may then leave a late mark
                    // that the rule it was taken under would not: such
                    // leases are left alone.
                    let reaper = retired_rule(&now_retired, q).expect("a removed rule");
                    for b in leases {
                        let owned = p.msgs[&b].st != St::Leased { owner: None };
                        if owned && reaper.next_pop != old.next_pop {
                            seen(
                                "leases not run out: an older removed rule would end them",
                                1,
                            );
                            continue;
                        }
                        if abandoned.len() < 2 && parked != Some(q) && rng.below(2) == 0 {
                            let r = c.cmd(&["QUEUE", "EXTEND", q, &b, "500"]);
                            assert_eq!(r, Value::Int(1), "EXTEND {q} {b} 500");
                            abandoned.push((q, b, old.next_pop));
                        }
                    }
                }
                (None, Some(_)) => seen("reloads that gave a queue a rule", 1),
                (Some(old), Some(new)) if old != new => {
                    seen("reloads that changed a queue's rule", 1)
                }
                _ => {}
            }
        }
        note(format!(
            "reloading to {}; leases running out: {abandoned:?}",
            new.short()
        ));
        s.reload(&new.toml(metrics));
        *rules = new;
        *retired = now_retired;
        // Those still leased now ran out under no rule (on a loaded machine
        // some ran out before the reload: the case is counted apart).
        for (q, b, _) in &abandoned {
            let back = lrange(&mut redis.client(), q).contains(b);
            seen(
                "leases that ran out after their rule was removed",
                (!back) as usize,
            );
        }
        for (q, b, next_pop) in &abandoned {
            let mut d = redis.client();
            wait_until(
                &format!("{b}, leased under a removed rule, back in {q}"),
                || lrange(&mut d, q).contains(b),
            );
            pools
                .get_mut(q)
                .unwrap()
                .end_lease(b, true, *next_pop, u32::MAX);
        }
        for q in RELOAD_QUEUES {
            if let Some(r) = rules.rule(q) {
                let info = info_of(c, q);
                assert_eq!(
                    field_int(&info, "lease-ms"),
                    r.lease_ms as i64,
                    "{q} after the reload"
                );
                let ack = if r.next_pop { "next-pop" } else { "explicit" };
                assert_eq!(info["ack"], Value::bulk(ack), "{q} after the reload");
            }
        }
        let abandoned: Vec<&String> = abandoned.iter().map(|(_, b, _)| b).collect();
        format!("reload to {}; leases ran out: {abandoned:?}", rules.short())
    };

    for step in 0..120 {
        let q = RELOAD_QUEUES[rng.below(3) as usize];
        let rule = rules.rule(q);
        let label = match rng.below(20) {
            0..=3 => {
                let bodies: Vec<String> = (0..1 + rng.below(3))
                    .map(|_| {
                        n += 1;
                        format!("{q}/{n}")
                    })
                    .collect();
                let p = pools.get_mut(q).unwrap();
                for b in &bodies {
                    p.add(b, b);
                }
                let mut args = vec!["LPUSH", q];
                args.extend(bodies.iter().map(String::as_str));
                let direct = rng.below(3) == 0;
                let r = if direct { d.cmd(&args) } else { c.cmd(&args) };
                assert!(matches!(r, Value::Int(_)), "{args:?}: {}", show(&r));
                format!("LPUSH {bodies:?}")
            }
            4..=8 => {
                let cmd = PopCmd::random(&mut rng, q, 3, true);
                let p = pools.get_mut(q).unwrap();
                match rule {
                    Some(r) => {
                        if r.next_pop {
                            p.release(MAIN);
                        }
                        let got = p.pop(&mut c, &mut d, &cmd, r.next_pop.then_some(MAIN));
                        format!("{:?} -> {got} leased", cmd.args)
                    }
                    None => {
                        // A plain list: Redis's own pop, cancelled copies
                        // included.
                        let mut list: VecDeque<String> = lrange(&mut d, q).into();
                        let want = simulate(&mut list, cmd.right, cmd.count, &|_| false);
                        let got = cmd.values(c.cmd(&refs(&cmd.args)));
                        assert_eq!(got, want, "{:?} on a plain list", cmd.args);
                        seen(
                            "pops of a queue without a rule that took something",
                            (!got.is_empty()) as usize,
                        );
                        for b in &got {
                            p.vanish(b, "popped as a plain list");
                        }
                        format!("{:?} -> {got:?} (no rule)", cmd.args)
                    }
                }
            }
            9 | 10 => {
                // Often of the leases a removed rule left behind.
                let orphans: Vec<&str> = RELOAD_QUEUES
                    .into_iter()
                    .filter(|q| rules.rule(q).is_none() && pools[q].leased() > 0)
                    .collect();
                let (q, rule) = match orphans.first() {
                    Some(o) if rng.below(4) != 0 => (*o, None),
                    _ => (q, rule),
                };
                let p = pools.get_mut(q).unwrap();
                let mut ids: Vec<String> = (0..1 + rng.below(2))
                    .map(|_| ack_id_to_try(p, &mut rng))
                    .collect();
                if rule.is_none() {
                    // A lease a removed rule left, if any: it stays ackable.
                    ids.extend(p.any(&mut rng, |s| matches!(s, St::Leased { .. })));
                }
                let (got, _) = p.ack_ids(&mut c, &ids);
                if rule.is_none() {
                    let acked = got.iter().sum::<i64>() > 0;
                    seen(
                        "ACKs on a queue without a rule that acknowledged something",
                        acked as usize,
                    );
                }
                format!("ACK {q} {ids:?} -> {got:?}")
            }
            11 | 12 => {
                let Some(r) = rule else { continue };
                let p = pools.get_mut(q).unwrap();
                let Some(b) = p.any(&mut rng, |s| matches!(s, St::Leased { .. })) else {
                    continue;
                };
                let nack = rng.below(3) == 0;
                let got = if nack {
                    c.cmd(&["NACK", q, &b])
                } else {
                    c.cmd(&["QUEUE", "EXTEND", q, &b, "1"])
                };
                assert_eq!(
                    got,
                    Value::Int(1),
                    "{} {b}",
                    if nack { "NACK" } else { "EXTEND" }
                );
                let holder = p.msgs[&b].st.clone();
                p.end_lease(&b, !nack, r.next_pop, u32::MAX);
                format!("{} {b} ({holder:?})", if nack { "NACK" } else { "expire" })
            }
            13 | 14 => {
                let new = RuleSet::random(&mut rng);
                reload(
                    &mut c,
                    &mut rng,
                    &mut rules,
                    new,
                    &mut pools,
                    &mut retired,
                    None,
                )
            }
            15..=17 => {
                // A pop parked across a reload, woken by a push straight to
                // Redis: on a queue with a rule and an empty list.
                let empty: Vec<&str> = RELOAD_QUEUES
                    .into_iter()
                    .filter(|q| {
                        let p = &pools[q];
                        rules.rule(q).is_some()
                            && p.ready() == 0
                            && p.count(|s| *s == St::Cancelled) == 0
                    })
                    .collect();
                if empty.is_empty() {
                    continue;
                }
                let q = empty[rng.below(empty.len() as u64) as usize];
                let parsed = rules.rule(q).unwrap();
                if parsed.next_pop {
                    pools.get_mut(q).unwrap().release(PARKED);
                }
                // It pops before it parks, and finds the list empty.
                pools.get_mut(q).unwrap().ran_out();
                c2.send(&["BRPOP", q, "20"]);
                wait_until("the pop to park", || {
                    metric(metrics, "ackproxy_parked_clients") == 1.0
                });
                let mut label = format!("BRPOP {q} parked under {}", parsed.short());
                let reloaded = rng.below(3) != 0;
                if reloaded {
                    let mut new = RuleSet::random(&mut rng);
                    if rng.below(2) == 0 {
                        new.remove(q);
                    }
                    let r = reload(
                        &mut c,
                        &mut rng,
                        &mut rules,
                        new,
                        &mut pools,
                        &mut retired,
                        Some(q),
                    );
                    label += &format!("; {r}");
                }
                n += 1;
                let body = format!("{q}/{n}");
                let p = pools.get_mut(q).unwrap();
                p.add(&body, &body);
                assert_eq!(d.cmd(&["LPUSH", q, &body]), Value::Int(1));
                assert_eq!(
                    c2.read_value(),
                    Value::bulks(&[q, &body]),
                    "the parked BRPOP {q}"
                );
                if rules.rule(q).is_some() {
                    seen(
                        "pops parked across a reload that left a rule",
                        reloaded as usize,
                    );
                    p.take(&body, parsed.next_pop.then_some(PARKED));
                    label + &format!("; woken by {body}: leased")
                } else {
                    seen("pops parked when their rule was removed", 1);
                    p.vanish(&body, "popped as a plain list");
                    label + &format!("; woken by {body}: no lease (rule removed)")
                }
            }
            _ => {
                // A rule for every queue again, as it was or new.
                let mut new = rules.clone();
                for q in RELOAD_QUEUES {
                    if new.rule(q).is_none() {
                        new.keep(q, RuleCfg::random(&mut rng));
                    }
                }
                reload(
                    &mut c,
                    &mut rng,
                    &mut rules,
                    new,
                    &mut pools,
                    &mut retired,
                    None,
                )
            }
        };
        let label = format!("step {step}: {label}");
        note(label.clone());
        for q in RELOAD_QUEUES {
            let info = rules.rule(q).is_some();
            pools
                .get_mut(q)
                .unwrap()
                .check(&mut c, &mut d, info, Totals::None, &label);
        }
    }
    // Every rule back, explicit: everything is acknowledged.
    let all = RuleCfg {
        lease_ms: 600_000,
        next_pop: false,
        redeliver_next: true,
    };
    let last = reload(
        &mut c,
        &mut rng,
        &mut rules,
        RuleSet {
            glob: Some(all),
            a: Some(all),
            b: Some(all),
        },
        &mut pools,
        &mut retired,
        None,
    );
    note(last);
    let mut allowed = Vec::new();
    for p in pools.values_mut() {
        p.check(&mut c, &mut d, true, Totals::None, "the last reload");
        p.drain(&mut c, &mut d, None);
        p.check(&mut c, &mut d, true, Totals::None, "the drain");
        println!("{}; stale marks {}", p.settled(), p.stale);
        allowed.extend(p.stale_keys());
    }
    assert_clean(&mut d, &allowed, "after the drain");
}

/// Sequences that once failed, replayed on every run (the clock picks the
/// others). 6150287735597336910: a next-pop connection's leases ran out
/// under a removed rule, their copies were popped as a plain list, then
/// ACKed late (the proxy answers 1: it cannot know the copies left); the
/// connection's next pop must then call back nothing, so it makes no skip
/// mark. A change to the generators replays other sequences under these
/// seeds: still valid cases, no longer these.
const RELOAD_SEEDS: [u64; 1] = [6150287735597336910];

#[test]
fn reloads_of_seeds_that_once_failed_match_the_model() {
    for seed in RELOAD_SEEDS {
        println!("seed {seed}");
        TRACE.with(|t| t.borrow_mut().clear());
        let _replay = Replay(seed);
        run_reloads(seed);
    }
}

#[test]
fn reloads_that_add_remove_and_change_rules_match_the_model() {
    run_seeds(
        4,
        run_reloads,
        &[
            "reloads that removed the rule of a queue holding leases",
            "reloads that gave a queue a rule",
            "reloads that changed a queue's rule",
            "leases that ran out after their rule was removed",
            "pops parked when their rule was removed",
            "pops parked across a reload that left a rule",
            "ACKs on a queue without a rule that acknowledged something",
            "pops of a queue without a rule that took something",
        ],
    );
}
