//! Node.js workers through the proxy: node-redis and ioredis, each with its
//! default settings (RESP3 through `HELLO 3`, `CLIENT SETINFO`, ioredis's
//! `INFO` ready check, node-redis's `CLIENT MAINT_NOTIFICATIONS`), run the
//! worker loop of docs/queues.md (tests/node/worker.js): pop a JSON job, SET and GET
//! its result, `ACK jobs <id>`. Every job is delivered once and
//! acknowledged, and workers that only do that keep sharing the proxy's
//! upstream connections. Skipped, with the reason printed, where node or
//! the modules of tests/node (`npm ci --prefix tests/node`, which
//! tests/setup-bench-deps.sh runs) are missing.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use crate::common::*;

/// The `jobs` rule of docs/queues.md (JSON ids), with leases that outlast any test:
/// a job seen twice would be a second delivery, not an expiry.
const CONFIG: &str = r#"
[[queue]]
pattern = "jobs"
ack_id = "json:id"
lease_ms = 600000
"#;

const CLIENTS: [&str; 2] = ["node-redis", "ioredis"];

fn node_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node")
}

/// Why the Node workers cannot run here, if they cannot.
fn missing_node() -> Option<String> {
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Some("node not found (install Node.js 20 or later)".into());
    }
    for module in ["redis", "ioredis"] {
        if !node_dir().join("node_modules").join(module).is_dir() {
            return Some(format!(
                "tests/node/node_modules/{module} missing (npm ci --prefix tests/node)"
            ));
        }
    }
    None
}

macro_rules! require_node {
    () => {
        if let Some(why) = missing_node() {
            println!("skipped: {why}");
            return;
        }
    };
}

/// What a worker reports once it has processed its jobs.
#[derive(Debug)]
struct Summary {
    ids: Vec<String>,
    acked: u64,
}

/// One `node worker.js` process; it stays connected until its standard
/// input is closed ([`Worker::finish`]), and is killed if dropped first.
struct Worker {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: PathBuf,
}

impl Worker {
    /// Starts a worker and waits until its client is connected and ready.
    fn start(client: &str, url: &str, pop: &str, count: usize) -> Worker {
        let stderr = std::env::temp_dir().join(format!("ackproxy-node-{}.err", free_port()));
        let mut child = Command::new("node")
            .arg(node_dir().join("worker.js"))
            .args([client, url, pop, &count.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("node");
        // Lines arrive on a thread of their own, so that a worker that
        // hangs fails the test after a timeout instead of blocking it.
        let (tx, lines) = channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut w = Worker {
            name: format!("{client} {pop} {url}"),
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
        };
        let ready = w.line();
        assert_eq!(ready, r#"{"ready":true}"#, "{}", w.name);
        w
    }

    fn line(&mut self) -> String {
        match self.lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => line,
            Err(e) => panic!(
                "{}: no line from the worker ({e}); stderr:\n{}",
                self.name,
                std::fs::read_to_string(&self.stderr).unwrap_or_default()
            ),
        }
    }

    fn summary(&mut self, client: &str) -> Summary {
        let line = self.line();
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{}: {e}: {line}", self.name));
        assert_eq!(v["client"], client, "{line}");
        let ids = v["ids"]
            .as_array()
            .unwrap_or_else(|| panic!("{line}"))
            .iter()
            .map(|id| id.as_str().unwrap().to_string())
            .collect();
        let acked = v["acked"].as_u64().unwrap_or_else(|| panic!("{line}"));
        Summary { ids, acked }
    }

    /// Lets the worker disconnect and exit; it must exit cleanly.
    fn finish(mut self) {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{}: still running",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "{}: {status}; stderr:\n{}",
            self.name,
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
    }
}

fn job(id: &str) -> String {
    format!(r#"{{"id":"{id}","task":"resize"}}"#)
}

fn queue_info(c: &mut Client) -> HashMap<String, Value> {
    let Value::Array(items) = c.cmd(&["QUEUE", "INFO", "jobs"]) else {
        panic!("QUEUE INFO jobs");
    };
    items
        .chunks(2)
        .map(|kv| match &kv[0] {
            Value::Bulk(k) => (String::from_utf8_lossy(k).into_owned(), kv[1].clone()),
            other => panic!("QUEUE INFO field {other:?}"),
        })
        .collect()
}

/// Nothing ready, nothing leased, nothing delayed or dead.
fn assert_queue_drained(c: &mut Client) {
    let info = queue_info(c);
    for field in ["ready", "leased", "delayed", "dead"] {
        assert_eq!(info[field], Value::Int(0), "{field}: {info:?}");
    }
}

fn keys(c: &mut Client) -> BTreeSet<String> {
    let Value::Array(keys) = c.cmd(&["KEYS", "*"]) else {
        panic!("KEYS");
    };
    bulk_strings(&keys, "key")
        .into_iter()
        .filter(|k| !is_queue_stats(k))
        .collect()
}

fn select(c: &mut Client, db: &str) {
    assert_eq!(c.cmd(&["SELECT", db]), Value::Simple("OK".into()));
}

/// Two workers of one client, one blocking on BRPOP and one polling with
/// RPOP, share 60 jobs pushed after they connected (half straight to Redis,
/// half through the proxy): each job is processed once and acknowledged,
/// and no worker needed an upstream connection of its own.
fn workers_share_connections(client: &str) {
    let redis = Redis::start();
    let (proxy, m) = Proxy::start_with_metrics(redis.port, CONFIG);
    let url = format!("redis://127.0.0.1:{}", proxy.port);
    let (n, per_worker) = (60, 30);
    let mut workers = [
        Worker::start(client, &url, "brpop", per_worker),
        Worker::start(client, &url, "rpop", per_worker),
    ];
    let all: BTreeSet<String> = (0..n).map(|i| format!("{client}-{i}")).collect();
    {
        let mut direct = redis.client();
        let mut proxied = proxy.client();
        for (i, id) in all.iter().enumerate() {
            let producer = if i % 2 == 0 {
                &mut direct
            } else {
                &mut proxied
            };
            assert!(matches!(
                producer.cmd(&["LPUSH", "jobs", &job(id)]),
                Value::Int(_)
            ));
        }
    }
    let mut seen = Vec::new();
    for w in &mut workers {
        let s = w.summary(client);
        assert_eq!(s.ids.len(), per_worker, "{}: {s:?}", w.name);
        assert_eq!(
            s.acked, per_worker as u64,
            "{}: every ACK is 1: {s:?}",
            w.name
        );
        seen.extend(s.ids);
    }
    seen.sort();
    let mut want: Vec<String> = all.iter().cloned().collect();
    want.sort();
    assert_eq!(seen, want, "each job delivered to exactly one worker, once");

    // The workers are still connected, and only they are.
    await_metric(m, "ackproxy_connections_open", 2.0);
    let body = scrape(m).expect("metrics");
    let dedicated = series("ackproxy_upstream_connections", &[("kind", "dedicated")]);
    assert_eq!(series_value(&body, &dedicated), Some(0.0), "{body}");
    let routed = series("ackproxy_commands_total", &[("route", "dedicated")]);
    assert_eq!(
        series_value(&body, &routed).unwrap_or(0.0),
        0.0,
        "no request went on a dedicated connection: {body}"
    );

    let mut admin = proxy.client();
    assert_queue_drained(&mut admin);
    let done: BTreeSet<String> = all.iter().map(|id| format!("done:{id}")).collect();
    let mut direct = redis.client();
    assert_eq!(
        keys(&mut direct),
        done,
        "only the workers' results are left"
    );
    for key in &done {
        assert_eq!(direct.cmd(&["GET", key]), Value::bulk(client));
    }
    for w in workers {
        w.finish();
    }
}

/// A worker whose URL names database 1 (as Celery- and RQ-style settings
/// give it) pops and acknowledges the jobs of database 1's `jobs`, and
/// leaves database 0's alone.
fn worker_on_database_1(client: &str) {
    let (redis, proxy) = Proxy::with_redis(CONFIG);
    let mut db0 = redis.client();
    let other = job("database-0");
    assert_eq!(db0.cmd(&["LPUSH", "jobs", &other]), Value::Int(1));
    let url = format!("redis://127.0.0.1:{}/1", proxy.port);
    let n = 10;
    let mut w = Worker::start(client, &url, "brpop", n);
    let mut db1 = redis.client();
    select(&mut db1, "1");
    let want: Vec<String> = (0..n).map(|i| format!("{client}-db1-{i}")).collect();
    for id in &want {
        assert!(matches!(
            db1.cmd(&["LPUSH", "jobs", &job(id)]),
            Value::Int(_)
        ));
    }
    let s = w.summary(client);
    // One worker, one list: the jobs in the order they were pushed.
    assert_eq!(s.ids, want, "{s:?}");
    assert_eq!(s.acked, n as u64, "every ACK is 1: {s:?}");
    let mut admin = proxy.client();
    select(&mut admin, "1");
    assert_queue_drained(&mut admin);
    let done: BTreeSet<String> = want.iter().map(|id| format!("done:{id}")).collect();
    assert_eq!(keys(&mut db1), done, "database 1: only the results");
    assert_eq!(
        db0.cmd(&["LRANGE", "jobs", "0", "-1"]),
        Value::bulks(&[&other]),
        "database 0's job untouched"
    );
    assert_eq!(
        keys(&mut db0),
        BTreeSet::from(["jobs".to_string()]),
        "database 0: nothing of the worker's"
    );
    w.finish();
}

#[test]
fn node_redis_workers_share_connections() {
    require_node!();
    workers_share_connections(CLIENTS[0]);
}

#[test]
fn ioredis_workers_share_connections() {
    require_node!();
    workers_share_connections(CLIENTS[1]);
}

#[test]
fn a_node_redis_worker_on_database_1_pops_and_acks_its_own_queue() {
    require_node!();
    worker_on_database_1(CLIENTS[0]);
}

#[test]
fn an_ioredis_worker_on_database_1_pops_and_acks_its_own_queue() {
    require_node!();
    worker_on_database_1(CLIENTS[1]);
}
