//! Failure behaviour of queues: consumer processes and a proxy killed with
//! SIGKILL while messages flow through two proxies, once with workers that
//! send ACK, once with unchanged workers that never do (`ack =
//! "next-pop"`), and once with next-pop workers that pipeline (a pop and a
//! PING in one write, two pops in one write, a message's records and the
//! next pop in one write); Redis killed and restarted with AOF. At the end
//! every message is done, duplicates stay within what the kills explain,
//! and no auxiliary key is left.
//!
//! Consumers are separate processes: this test binary re-executed with
//! `fault::consumer_process --exact --ignored`, driven by environment variables.
//! `ACKPROXY_LONG_FAULT=1` runs the long form (100,000 messages).

use std::collections::HashSet;
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;

const QUEUE_CONFIG: &str = r#"
[[queue]]
pattern = "q"
lease_ms = 1000
max_deliveries = 1000
ack_id = "json:id"
redeliver = "next"
pop_end = "right"

[reaper]
interval_ms = 100
"#;

/// The same queue for workers that never send ACK: their next pop on the
/// same connection acknowledges.
fn next_pop_config() -> String {
    QUEUE_CONFIG.replace(
        "pop_end = \"right\"",
        "pop_end = \"right\"\nack = \"next-pop\"",
    )
}

// ------------------------------------------------------------- consumer side

/// One command on a possibly broken connection; never panics.
fn try_cmd(c: &mut Client, args: &[&str]) -> std::io::Result<Value> {
    let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
    let mut s: &TcpStream = c.stream();
    s.write_all(&Client::encode(&a))?;
    let raw = c.try_read_raw()?;
    Ok(decode(&raw).0)
}

fn io_err(msg: String) -> std::io::Error {
    std::io::Error::other(msg)
}

/// The ack id of a message: the `id` field of the JSON ones (a number as
/// written, or a string), the whole payload of the others.
fn id_of(payload: &str) -> String {
    let Some(rest) = payload.strip_prefix(r#"{"id":"#) else {
        return payload.to_string();
    };
    let raw = &rest[..rest.find(',').unwrap_or(rest.len())];
    raw.trim_matches('"').to_string()
}

/// The consumer loop: BRPOP q 1 → HINCRBY deliveries payload 1 → SADD done
/// payload → ACK q id (unless `ack` is false: then the next BRPOP is the
/// acknowledgement). `done` is written before the ACK: a kill between the
/// two then means a redelivery (counted as a duplicate), never a message
/// that was acked but not recorded.
fn consume(port: u16, state: &Path, ack: bool) -> std::io::Result<()> {
    let mut c = Client::try_connect(port)?;
    c.set_read_timeout(Some(Duration::from_secs(10)));
    std::fs::write(state, port.to_string())?;
    loop {
        let Some(payload) = brpopped(try_cmd(&mut c, &["BRPOP", "q", "1"])?)? else {
            continue;
        };
        match try_cmd(&mut c, &["HINCRBY", "deliveries", &payload, "1"])? {
            Value::Int(_) => {}
            other => return Err(io_err(format!("HINCRBY: {other:?}"))),
        }
        match try_cmd(&mut c, &["SADD", "done", &payload])? {
            Value::Int(_) => {}
            other => return Err(io_err(format!("SADD: {other:?}"))),
        }
        if !ack {
            continue;
        }
        match try_cmd(&mut c, &["ACK", "q", &id_of(&payload)])? {
            Value::Int(_) => {}
            other => return Err(io_err(format!("ACK: {other:?}"))),
        }
    }
}

/// The payload a BRPOP reply carries, `None` when it timed out: unlike
/// [`popped`], a bare value is no BRPOP reply. Never panics.
fn brpopped(v: Value) -> std::io::Result<Option<String>> {
    match v {
        Value::Nil => Ok(None),
        Value::Array(items) if items.len() == 2 => match &items[1] {
            Value::Bulk(b) => Ok(Some(String::from_utf8_lossy(b).into_owned())),
            other => Err(io_err(format!("BRPOP value {other:?}"))),
        },
        other => Err(io_err(format!("BRPOP: {other:?}"))),
    }
}

/// Sends `cmds` in one write; their replies, in order. Never panics.
fn try_pipeline(c: &mut Client, cmds: &[Vec<&str>]) -> std::io::Result<Vec<Value>> {
    let mut out = Vec::new();
    for cmd in cmds {
        let a: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
        out.extend(Client::encode(&a));
    }
    let mut s: &TcpStream = c.stream();
    s.write_all(&out)?;
    cmds.iter()
        .map(|_| c.try_read_raw().map(|raw| decode(&raw).0))
        .collect()
}

/// The message of a pop's reply (`BRPOP`'s `[key, value]`, `RPOP`'s
/// value), if any.
fn popped(v: &Value) -> std::io::Result<Option<String>> {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match v {
        Value::Nil => Ok(None),
        Value::Bulk(b) => Ok(Some(lossy(b))),
        Value::Array(items) if items.len() == 2 => match &items[1] {
            Value::Bulk(b) => Ok(Some(lossy(b))),
            other => Err(io_err(format!("pop value {other:?}"))),
        },
        other => Err(io_err(format!("pop: {other:?}"))),
    }
}

/// Checks the replies of commands that answer integers.
fn all_ints(replies: &[Value], what: &str) -> std::io::Result<()> {
    match replies.iter().find(|v| !matches!(v, Value::Int(_))) {
        Some(other) => Err(io_err(format!("{what}: {other:?}"))),
        None => Ok(()),
    }
}

/// How long a pipelining worker works on a message: a kill then often
/// finds it holding messages it has not recorded yet.
const JOB: Duration = Duration::from_millis(1);

/// A worker of a next-pop rule that never sends ACK and pipelines, in one
/// of three ways (`style`): `BRPOP q 1` and `PING` in one write; `BRPOP q
/// 1` and `RPOP q` in one write (the second pop acknowledges nothing: the
/// worker holds two leases until its next write); or the records of the
/// message it has and its next `BRPOP` in one write (the write's first pop,
/// sent once every reply before it was read: it acknowledges the message,
/// after the records ahead of it). Records are written before the pop that
/// acknowledges, as in [`consume`].
fn consume_pipelined(port: u16, state: &Path, style: usize) -> std::io::Result<()> {
    let mut c = Client::try_connect(port)?;
    c.set_read_timeout(Some(Duration::from_secs(10)));
    std::fs::write(state, port.to_string())?;
    let pop = vec!["BRPOP", "q", "1"];
    let mut unrecorded: Option<String> = None;
    loop {
        let got: Vec<String> = match style {
            0 => {
                let r = try_pipeline(&mut c, &[pop.clone(), vec!["PING"]])?;
                if r[1] != Value::Simple("PONG".into()) {
                    return Err(io_err(format!("PING: {:?}", r[1])));
                }
                popped(&r[0])?.into_iter().collect()
            }
            1 => {
                let r = try_pipeline(&mut c, &[pop.clone(), vec!["RPOP", "q"]])?;
                let mut got = Vec::new();
                for v in &r {
                    got.extend(popped(v)?);
                }
                got
            }
            _ => {
                let mut cmds = Vec::new();
                if let Some(p) = &unrecorded {
                    cmds.push(vec!["HINCRBY", "deliveries", p.as_str(), "1"]);
                    cmds.push(vec!["SADD", "done", p.as_str()]);
                }
                cmds.push(pop.clone());
                let r = try_pipeline(&mut c, &cmds)?;
                all_ints(&r[..r.len() - 1], "records")?;
                unrecorded = popped(&r[r.len() - 1])?;
                if unrecorded.is_some() {
                    thread::sleep(JOB);
                }
                continue;
            }
        };
        for p in got {
            thread::sleep(JOB);
            all_ints(
                &try_pipeline(&mut c, &[vec!["HINCRBY", "deliveries", p.as_str(), "1"]])?,
                "HINCRBY",
            )?;
            all_ints(
                &try_pipeline(&mut c, &[vec!["SADD", "done", p.as_str()]])?,
                "SADD",
            )?;
        }
    }
}

#[test]
#[ignore]
fn consumer_process() {
    let Ok(ports) = std::env::var("ACKPROXY_CONSUMER_PORTS") else {
        return;
    };
    let ports: Vec<u16> = ports.split(',').map(|p| p.parse().unwrap()).collect();
    let index: usize = std::env::var("ACKPROXY_CONSUMER_INDEX")
        .unwrap()
        .parse()
        .unwrap();
    let state = PathBuf::from(std::env::var("ACKPROXY_CONSUMER_STATE").unwrap());
    let mode = std::env::var("ACKPROXY_CONSUMER_ACK").unwrap_or_default();
    let mut which = index;
    loop {
        let port = ports[which % ports.len()];
        let run = match mode.as_str() {
            "pipeline" => consume_pipelined(port, &state, index % 3),
            "no" => consume(port, &state, false),
            _ => consume(port, &state, true),
        };
        if let Err(_e) = run {
            thread::sleep(Duration::from_millis(50));
        }
        which += 1; // alternate proxies on every reconnect
    }
}

// ---------------------------------------------------------------- driver side

struct Consumers {
    children: Vec<Child>,
    ports: String,
    dir: PathBuf,
    /// How the workers acknowledge: `yes` (ACK), `no` (their next pop),
    /// `pipeline` (their next pop, pipelining; see [`consume_pipelined`]).
    mode: &'static str,
}

impl Consumers {
    fn spawn_one(&self, i: usize) -> Child {
        Command::new(std::env::current_exe().unwrap())
            .args([
                "fault::consumer_process",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env("ACKPROXY_CONSUMER_PORTS", &self.ports)
            .env("ACKPROXY_CONSUMER_INDEX", i.to_string())
            .env("ACKPROXY_CONSUMER_STATE", self.dir.join(format!("c{i}")))
            .env("ACKPROXY_CONSUMER_ACK", self.mode)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn consumer process")
    }

    fn start(n: usize, ports: &[u16], dir: PathBuf, mode: &'static str) -> Consumers {
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Consumers {
            children: Vec::new(),
            ports: ports
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(","),
            dir,
            mode,
        };
        for i in 0..n {
            let child = c.spawn_one(i);
            c.children.push(child);
        }
        c
    }

    fn kill_and_respawn(&mut self, i: usize) {
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
        self.children[i] = self.spawn_one(i);
    }

    /// Consumers whose current connection is to `port`.
    fn attached_to(&self, port: u16) -> usize {
        (0..self.children.len())
            .filter(|i| {
                std::fs::read_to_string(self.dir.join(format!("c{i}")))
                    .map(|s| s.trim() == port.to_string())
                    .unwrap_or(false)
            })
            .count()
    }
}

impl Drop for Consumers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write_config(text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("ackproxy-fault-{}.toml", free_port()));
    std::fs::write(&path, text).unwrap();
    path
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        Value::Bulk(b) => String::from_utf8_lossy(b).parse().unwrap(),
        other => panic!("not an integer: {other:?}"),
    }
}

/// Every key but the queues' totals (see `is_queue_stats`).
fn all_keys(c: &mut Client) -> Vec<String> {
    match c.cmd(&["KEYS", "*"]) {
        Value::Array(items) => {
            let mut k: Vec<String> = items
                .iter()
                .map(|v| match v {
                    Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                    other => panic!("{other:?}"),
                })
                .filter(|k| !is_queue_stats(k))
                .collect();
            k.sort();
            k
        }
        other => panic!("KEYS: {other:?}"),
    }
}

/// Message i: 30% of messages repeat the payload of the message before
/// (identical payloads in flight together), the others are new. Ids are
/// 19-digit numbers one apart (a double cannot tell them apart), every
/// fourth a string.
fn message(i: usize) -> String {
    let k = if i > 0 && matches!(i % 10, 3 | 6 | 9) {
        i - 1
    } else {
        i
    };
    if k % 4 == 0 {
        format!(r#"{{"id":"s{k}","k":{k}}}"#)
    } else {
        format!(
            r#"{{"id":{},"k":{k}}}"#,
            1_234_567_890_123_450_000u64 + k as u64
        )
    }
}

/// How many messages of `0..n` carry each payload.
fn multiplicity(n: usize) -> std::collections::HashMap<String, i64> {
    let mut m = std::collections::HashMap::new();
    for i in 0..n {
        *m.entry(message(i)).or_insert(0) += 1;
    }
    m
}

fn push_messages(c: &mut Client, from: usize, to: usize) {
    for chunk_start in (from..to).step_by(1000) {
        let ids: Vec<String> = (chunk_start..to.min(chunk_start + 1000))
            .map(message)
            .collect();
        let mut args = vec!["LPUSH", "q"];
        args.extend(ids.iter().map(|s| s.as_str()));
        assert!(matches!(c.cmd(&args), Value::Int(_)));
    }
}

/// Sum of the `deliveries` hash and its number of fields.
fn deliveries(c: &mut Client) -> (i64, i64) {
    let all = deliveries_by_payload(c);
    (all.values().sum(), all.len() as i64)
}

/// The `deliveries` hash: payload → times processed.
fn deliveries_by_payload(c: &mut Client) -> std::collections::HashMap<String, i64> {
    let mut out = std::collections::HashMap::new();
    let mut cursor = "0".to_string();
    loop {
        let v = c.cmd(&["HSCAN", "deliveries", &cursor, "COUNT", "1000"]);
        let Value::Array(parts) = v else {
            panic!("HSCAN: {v:?}")
        };
        cursor = match &parts[0] {
            Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("{other:?}"),
        };
        if let Value::Array(kv) = &parts[1] {
            for pair in kv.chunks(2) {
                let Value::Bulk(k) = &pair[0] else {
                    panic!("{pair:?}")
                };
                out.insert(String::from_utf8_lossy(k).into_owned(), int(&pair[1]));
            }
        }
        if cursor == "0" {
            return out;
        }
    }
}

fn wait_done(direct: &mut Client, n: usize, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let done = int(&direct.cmd(&["SCARD", "done"])) as usize;
        if done >= n || Instant::now() > deadline {
            return done;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (15 s at most) until only `done` and `deliveries` remain while
/// the `who` still run; what is left then is printed, for the checks made
/// once they stopped to explain. Returns it.
fn wait_clean(direct: &mut Client, who: &str) -> Vec<String> {
    let allowed = ["done", "deliveries"];
    let deadline = Instant::now() + Duration::from_secs(15);
    let extra = loop {
        let k = all_keys(direct);
        let extra: Vec<String> = k
            .iter()
            .filter(|k| !allowed.contains(&k.as_str()))
            .cloned()
            .collect();
        if extra.is_empty() || Instant::now() > deadline {
            break extra;
        }
        thread::sleep(Duration::from_millis(100));
    };
    if !extra.is_empty() {
        println!(
            "left while {who} still run: {extra:?}; q = {:?}",
            direct.cmd(&["LRANGE", "q", "0", "20"])
        );
    }
    extra
}

#[test]
fn consumers_and_proxy_killed() {
    kill_consumers_and_a_proxy(QUEUE_CONFIG, "yes");
}

/// Workers that cannot change: they pop and never acknowledge, and the
/// rule's `ack = "next-pop"` takes each pop as the acknowledgement of the
/// one before. Killed at random as above, they lose nothing.
#[test]
fn next_pop_consumers_that_never_ack_and_proxy_killed() {
    kill_consumers_and_a_proxy(&next_pop_config(), "no");
}

/// The same workers pipelining (see [`consume_pipelined`]): only a pop
/// sent after every reply was read acknowledges; one pipelined behind
/// another pop keeps both leases. Killed at random, they lose nothing; a
/// kill may cost two duplicates (two messages held).
#[test]
fn next_pop_consumers_that_pipeline_and_proxy_killed() {
    kill_consumers_and_a_proxy(&next_pop_config(), "pipeline");
}

fn kill_consumers_and_a_proxy(config_text: &str, mode: &'static str) {
    let long = std::env::var("ACKPROXY_LONG_FAULT")
        .map(|v| v == "1")
        .unwrap_or(false);
    let n: usize = if long { 100_000 } else { 5_000 };
    let mult = multiplicity(n);
    let distinct = mult.len();
    const CONSUMERS: usize = 20;
    const ROUNDS: usize = 25;
    let started = Instant::now();

    let redis = Redis::start();
    let config = write_config(config_text);
    let cfg = config.to_str().unwrap();
    let port_a = free_port();
    let port_b = free_port();
    let mut proxy_a = Proxy::start_on(port_a, redis.port, &["--config", cfg]);
    let proxy_b = Proxy::start_on(port_b, redis.port, &["--config", cfg]);
    let mut direct = redis.client();

    let state_dir = std::env::temp_dir().join(format!("ackproxy-fault-consumers-{}", redis.port));
    println!("workers acknowledge: {mode}");
    let mut consumers = Consumers::start(CONSUMERS, &[port_a, port_b], state_dir, mode);
    let mut rng = Rng::from_clock();
    let mut kills = 0usize;
    let mut attached_at_proxy_kill = 0usize;
    let per_round = n / ROUNDS;
    let mut pushed = 0usize;
    for round in 0..ROUNDS {
        let upto = if round == ROUNDS - 1 {
            n
        } else {
            pushed + per_round
        };
        push_messages(&mut direct, pushed, upto);
        pushed = upto;
        let pause = if long {
            400 + rng.below(800)
        } else {
            30 + rng.below(120)
        };
        thread::sleep(Duration::from_millis(pause));
        let victim = rng.below(CONSUMERS as u64) as usize;
        consumers.kill_and_respawn(victim);
        kills += 1;
        if round == ROUNDS / 2 {
            attached_at_proxy_kill = consumers.attached_to(port_a);
            proxy_a.kill9();
            thread::sleep(Duration::from_millis(300));
            proxy_a = Proxy::start_on(port_a, redis.port, &["--config", cfg]);
            println!("proxy A killed and restarted ({attached_at_proxy_kill} consumers attached)");
        }
    }
    let done_at_end_of_kills = int(&direct.cmd(&["SCARD", "done"]));
    println!(
        "kills finished after {:?}; {done_at_end_of_kills}/{n} done",
        started.elapsed()
    );

    let budget = if long {
        Duration::from_secs(600)
    } else {
        Duration::from_secs(40)
    };
    let done = wait_done(&mut direct, distinct, budget);
    // Copies redelivered after a kill may still be in the list or leased
    // although their id is done: the consumers drain them (lease 1 s).
    wait_clean(&mut direct, "consumers");
    drop(consumers);
    let elapsed = started.elapsed();
    let extra = all_keys(&mut direct)
        .into_iter()
        .filter(|k| k != "done" && k != "deliveries")
        .collect::<Vec<_>>();
    let by_payload = deliveries_by_payload(&mut direct);
    let (sum, fields) = (by_payload.values().sum::<i64>(), by_payload.len() as i64);
    let short: Vec<(&String, i64, i64)> = mult
        .iter()
        .map(|(p, m)| (p, *m, by_payload.get(p).copied().unwrap_or(0)))
        .filter(|(_, m, got)| got < m)
        .collect();
    let dups = sum - n as i64;
    // A pipelining worker may hold two messages when it is killed.
    let held = if mode == "pipeline" { 2 } else { 1 };
    let bound = (held * (kills + attached_at_proxy_kill)) as i64;
    println!(
        "N={n} ({distinct} distinct payloads) done={done} deliveries: sum={sum} fields={fields} duplicates={dups} \
         (bound: {held} x ({kills} consumer kills + {attached_at_proxy_kill} consumers on the killed proxy) = {bound}); \
         elapsed {elapsed:?}"
    );
    let dead = direct.cmd(&["LLEN", "{q}:dead"]);
    if let Value::Array(info) = proxy_b.client().cmd(&["QUEUE", "INFO", "q"]) {
        let shown: Vec<String> = info
            .chunks(2)
            .map(|kv| match kv {
                [Value::Bulk(k), Value::Int(v)] => format!("{}={v}", String::from_utf8_lossy(k)),
                [Value::Bulk(k), Value::Bulk(v)] => format!(
                    "{}={}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v)
                ),
                other => format!("{other:?}"),
            })
            .collect();
        println!("QUEUE INFO q: {}", shown.join(" "));
    }
    drop(proxy_a);
    drop(proxy_b);
    let _ = std::fs::remove_file(&config);

    assert_eq!(done, distinct, "SCARD done");
    assert_eq!(fields, distinct as i64, "every payload delivered");
    assert!(
        short.is_empty(),
        "messages delivered fewer times than pushed: {short:?}"
    );
    assert!(extra.is_empty(), "keys left: {extra:?}");
    assert_eq!(dead, Value::Int(0), "dead-letter list");
    assert!(dups >= 0);
    assert!(dups <= bound, "duplicates {dups} > bound {bound}");
}

#[test]
fn redis_killed_and_restarted_with_aof() {
    const N: usize = 3_000;
    const WORKERS: usize = 6;
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut redis = Redis::start_with(&aof);
    let port = redis.port;
    let dir = redis.dir.clone();
    let proxy = Proxy::start_with_config(port, QUEUE_CONFIG, &[]);
    let ppush = proxy.port;

    // Producer through the proxy, in the background, so messages are pushed
    // before, during and after the crash.
    let producer = thread::spawn(move || {
        let mut i = 0;
        while i < N {
            let mut c = match Client::try_connect(ppush) {
                Ok(c) => c,
                Err(_) => {
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            while i < N {
                let id = format!("m{i}");
                match try_cmd(&mut c, &["LPUSH", "q", &id]) {
                    Ok(Value::Int(_)) => i += 1,
                    Ok(_) => thread::sleep(Duration::from_millis(50)),
                    Err(_) => break,
                }
                if i % 100 == 0 {
                    thread::sleep(Duration::from_millis(10));
                }
            }
        }
    });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let stop = stop.clone();
            let pport = proxy.port;
            thread::spawn(move || {
                let mut errors = 0u64;
                let dummy =
                    std::env::temp_dir().join(format!("ackproxy-aof-worker-{}", free_port()));
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // consume() returns on the first error (Redis down): retry.
                    if consume_until(pport, &dummy, &stop).is_err() {
                        errors += 1;
                        thread::sleep(Duration::from_millis(50));
                    }
                }
                let _ = std::fs::remove_file(&dummy);
                errors
            })
        })
        .collect();

    // Let about a third through, then crash Redis.
    let mut watcher_deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let done = Client::try_connect(port)
            .ok()
            .and_then(|mut c| try_cmd(&mut c, &["SCARD", "done"]).ok())
            .map(|v| int(&v))
            .unwrap_or(0);
        if done as usize >= N / 3 || Instant::now() > watcher_deadline {
            println!("crashing Redis with {done}/{N} done");
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    redis.kill();
    std::mem::forget(redis); // keep the data dir: the restart reads its AOF
    thread::sleep(Duration::from_millis(500));
    let redis = Redis::start_on(port, dir, &aof);
    let mut direct = redis.client();
    println!(
        "Redis restarted; {} done after AOF replay",
        int(&direct.cmd(&["SCARD", "done"]))
    );

    producer.join().unwrap();
    watcher_deadline = Instant::now() + Duration::from_secs(40);
    let done = loop {
        let done = int(&direct.cmd(&["SCARD", "done"])) as usize;
        if done >= N || Instant::now() > watcher_deadline {
            break done;
        }
        thread::sleep(Duration::from_millis(100));
    };
    let extra = wait_clean(&mut direct, "workers");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let errors: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let (sum, fields) = deliveries(&mut direct);
    println!(
        "N={N} done={done} deliveries sum={sum} fields={fields} duplicates={} worker reconnects={errors}",
        sum - N as i64
    );
    // Which messages are missing, if any.
    if done < N {
        let members: HashSet<String> = match direct.cmd(&["SMEMBERS", "done"]) {
            Value::Array(items) => items
                .iter()
                .map(|v| match v {
                    Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => String::new(),
                })
                .collect(),
            _ => HashSet::new(),
        };
        let missing: Vec<String> = (0..N)
            .map(|i| format!("m{i}"))
            .filter(|m| !members.contains(m))
            .take(20)
            .collect();
        println!(
            "missing (first 20): {missing:?}; keys: {:?}",
            all_keys(&mut direct)
        );
    }
    drop(proxy);
    assert_eq!(done, N, "every message done after the Redis crash");
    assert!(extra.is_empty(), "keys left: {extra:?}");
}

/// Like [`consume`], but returns when `stop` is set.
fn consume_until(
    port: u16,
    state: &Path,
    stop: &std::sync::atomic::AtomicBool,
) -> std::io::Result<()> {
    let mut c = Client::try_connect(port)?;
    c.set_read_timeout(Some(Duration::from_secs(10)));
    std::fs::write(state, port.to_string())?;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let Some(id) = brpopped(try_cmd(&mut c, &["BRPOP", "q", "0.5"])?)? else {
            continue;
        };
        for args in [
            vec!["HINCRBY", "deliveries", id.as_str(), "1"],
            vec!["SADD", "done", id.as_str()],
            vec!["ACK", "q", id.as_str()],
        ] {
            match try_cmd(&mut c, &args)? {
                Value::Int(_) => {}
                other => return Err(io_err(format!("{}: {other:?}", args[0]))),
            }
        }
    }
    Ok(())
}
