//! A Sentinel upstream: the proxy finds the primary through the sentinels
//! and follows it across failovers. A real Sentinel set (three sentinels,
//! a primary and a replica) is failed over by killing the primary with
//! SIGKILL while a producer and workers run through the proxy.
//!
//! The long run (more messages, several failovers) runs with
//! `ACKPROXY_LONG_TESTS=1`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;

fn sentinel_config(set: &SentinelSet, rules: &str) -> String {
    let sentinels: Vec<String> = set
        .sentinel_addrs()
        .iter()
        .map(|a| format!("{a:?}"))
        .collect();
    format!(
        "upstream_mode = \"sentinel\"\nsentinel_master = {SENTINEL_MASTER:?}\n\
         sentinels = [{}]\nconnect_timeout_ms = 500\n{rules}",
        sentinels.join(", ")
    )
}

fn start_proxy(set: &SentinelSet, rules: &str, extra: &[&str]) -> Proxy {
    let file = TempFile::new("ackproxy-test", "toml", &sentinel_config(set, rules));
    let mut args = vec!["--config", file.as_arg()];
    args.extend_from_slice(extra);
    Proxy::start_args(&args).owning(file)
}

/// The port of the Redis that served this proxy connection's `INFO server`.
fn served_by(c: &mut Client) -> Option<u16> {
    let Ok(Value::Bulk(b)) = c.try_cmd(&["INFO", "server"]) else {
        return None;
    };
    String::from_utf8_lossy(&b)
        .lines()
        .find_map(|l| l.strip_prefix("tcp_port:"))
        .and_then(|p| p.trim().parse().ok())
}

const RULES: &str = "[[queue]]\npattern = \"jobs\"\nlease_ms = 3000\nmax_deliveries = 1000\n";

/// What the run saw, shared by its threads.
#[derive(Default)]
struct Tally {
    /// Payloads whose push a replica acknowledged (`WAIT 1` answered 1).
    pushed: Mutex<Vec<String>>,
    /// Payloads acknowledged (`ACK` answered 1): when that ACK was sent,
    /// and when its reply came.
    acked: Mutex<HashMap<String, (Instant, Instant)>>,
    /// Payloads whose `ACK` was in flight when the primary died: it may
    /// have run (and been replicated) with its reply lost.
    uncertain: Mutex<HashSet<String>>,
    /// Times a worker or the producer connected again after losing its
    /// connection.
    reconnects: AtomicUsize,
    stop: AtomicBool,
}

fn connect_retrying(port: u16, tally: &Tally) -> Option<Client> {
    while !tally.stop.load(Ordering::Relaxed) {
        if let Ok(c) = Client::try_connect(port) {
            c.set_read_timeout(Some(Duration::from_secs(10)));
            return Some(c);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Pops with `BRPOP` and acknowledges, connecting again whenever the
/// connection is lost, until told to stop.
fn worker(port: u16, tally: Arc<Tally>) {
    let mut conn = connect_retrying(port, &tally);
    while let Some(c) = conn.as_mut() {
        if tally.stop.load(Ordering::Relaxed) {
            return;
        }
        let lost = match c.try_cmd(&["BRPOP", "jobs", "1"]) {
            Ok(Value::Array(kv)) => match kv.get(1) {
                Some(Value::Bulk(p)) => {
                    let payload = String::from_utf8_lossy(p).into_owned();
                    let sent = Instant::now();
                    match c.try_cmd(&["ACK", "jobs", &payload]) {
                        Ok(Value::Int(1)) => {
                            let replied = Instant::now();
                            tally
                                .acked
                                .lock()
                                .unwrap()
                                .entry(payload)
                                .or_insert((sent, replied));
                            false
                        }
                        Ok(Value::Error(e)) if e.contains("connection lost") => {
                            tally.uncertain.lock().unwrap().insert(payload);
                            false
                        }
                        // Not acknowledged (the lease moved on, or Redis
                        // was unreachable): the message comes again when
                        // its lease expires.
                        Ok(_) => false,
                        Err(_) => {
                            tally.uncertain.lock().unwrap().insert(payload);
                            true
                        }
                    }
                }
                _ => false,
            },
            Ok(Value::Nil) => false,
            // In flight at the switch, or Redis down for the moment.
            Ok(_) => {
                std::thread::sleep(Duration::from_millis(50));
                false
            }
            Err(_) => true,
        };
        if lost {
            tally.reconnects.fetch_add(1, Ordering::Relaxed);
            conn = connect_retrying(port, &tally);
        }
    }
}

/// Pushes `m0`, `m1`, … each followed by `WAIT 1`, on a connection pinned
/// by a WATCH (so that WAIT measures the push's own replication), until
/// `want` pushes were acknowledged by a replica.
fn producer(port: u16, tally: Arc<Tally>, want: usize) {
    let mut next = 0usize;
    let mut conn: Option<Client> = None;
    let deadline = Instant::now() + Duration::from_secs(240);
    while tally.pushed.lock().unwrap().len() < want {
        assert!(
            Instant::now() < deadline,
            "the producer never got its pushes acknowledged"
        );
        if tally.stop.load(Ordering::Relaxed) {
            return;
        }
        let c = match conn.as_mut() {
            Some(c) => c,
            None => {
                let Some(mut c) = connect_retrying(port, &tally) else {
                    return;
                };
                if c.try_cmd(&["WATCH", "producer-pin"]).ok() != Some(Value::Simple("OK".into())) {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                conn.insert(c)
            }
        };
        let payload = format!("m{next}");
        next += 1;
        let pushed = c
            .try_cmd(&["LPUSH", "jobs", &payload])
            .and_then(|r| match r {
                Value::Int(_) => c.try_cmd(&["WAIT", "1", "2000"]).map(Some),
                _ => Ok(None),
            });
        match pushed {
            Ok(Some(Value::Int(n))) if n >= 1 => tally.pushed.lock().unwrap().push(payload),
            // Not known replicated: not counted (it may still arrive).
            Ok(_) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => {
                tally.reconnects.fetch_add(1, Ordering::Relaxed);
                conn = None;
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Paced, so that the failover happens mid-run.
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `messages` pushes acknowledged by a replica, `failovers` kills of the
/// primary spread over the run: every acknowledged push is acknowledged
/// by a worker at least once. Returns the recovery time of each failover:
/// from the kill to the first message a worker acknowledged after it.
fn failover_run(messages: usize, failovers: usize) -> Vec<Duration> {
    let mut set = SentinelSet::start();
    let proxy = start_proxy(&set, RULES, &[]);
    let tally = Arc::new(Tally::default());
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let t = tally.clone();
            let port = proxy.port;
            std::thread::spawn(move || worker(port, t))
        })
        .collect();
    let producer = {
        let t = tally.clone();
        let port = proxy.port;
        std::thread::spawn(move || producer(port, t, messages))
    };
    let mut recoveries = Vec::new();
    for n in 1..=failovers {
        let at = messages * n / (failovers + 1);
        wait_until_long("pushes acknowledged before the failover", || {
            tally.pushed.lock().unwrap().len() >= at
        });
        let old = set.kill9_primary();
        // The primary is gone (reaped): an ACK sent from now on that
        // succeeds was served by the new one.
        let killed_at = Instant::now();
        let new = set.wait_failover(old);
        println!(
            "failover {n}: primary {old} killed, the sentinels name {new} {:?} later",
            killed_at.elapsed()
        );
        let first_after = || {
            tally
                .acked
                .lock()
                .unwrap()
                .values()
                .filter(|(sent, _)| *sent > killed_at)
                .map(|(_, replied)| *replied)
                .min()
        };
        wait_until_long("a message acknowledged after the failover", || {
            first_after().is_some()
        });
        let recovery = first_after().unwrap() - killed_at;
        println!(
            "failover {n}: recovery {recovery:?} from the kill to the first message \
             acknowledged on the new primary"
        );
        recoveries.push(recovery);
        // Pushes can be acknowledged by a replica again.
        set.restart_as_replica(old);
    }
    producer.join().expect("producer");
    let pushed: Vec<String> = tally.pushed.lock().unwrap().clone();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut info = proxy.client();
    loop {
        let acked = tally.acked.lock().unwrap().clone();
        let missing: Vec<&String> = pushed.iter().filter(|p| !acked.contains_key(*p)).collect();
        if missing.is_empty() {
            break;
        }
        // An ACK whose reply was lost with the primary, but which ran:
        // its message is nowhere any more (not ready, leased, delayed or
        // dead), and was acknowledged.
        let uncertain = tally.uncertain.lock().unwrap().clone();
        let mut drained = || {
            let q = info.cmd(&["QUEUE", "INFO", "jobs"]);
            ["ready", "leased", "delayed", "dead"]
                .iter()
                .all(|f| field(&q, f) == Some(Value::Int(0)))
        };
        if missing.iter().all(|p| uncertain.contains(*p)) && drained() {
            println!("acknowledged with the reply lost: {missing:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} acknowledged pushes never acknowledged by a worker, e.g. {:?}",
            missing.len(),
            pushed.len(),
            &missing[..missing.len().min(10)]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    tally.stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    let acked: HashSet<String> = tally.acked.lock().unwrap().keys().cloned().collect();
    println!(
        "{} pushes acknowledged by a replica, {} messages acknowledged, {} reconnects",
        pushed.len(),
        acked.len(),
        tally.reconnects.load(Ordering::Relaxed)
    );
    recoveries
}

/// Like `wait_until`, for what a failover holds up (Sentinel's own
/// detection and election come first).
fn wait_until_long(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn failover_delivers_every_replicated_push() {
    let recoveries = failover_run(300, 1);
    assert_eq!(recoveries.len(), 1);
}

#[test]
fn long_failover_run() {
    if std::env::var("ACKPROXY_LONG_TESTS").ok().as_deref() != Some("1") {
        println!("skipped: set ACKPROXY_LONG_TESTS=1");
        return;
    }
    let recoveries = failover_run(5000, 3);
    assert_eq!(recoveries.len(), 3);
}

#[test]
fn the_proxy_serves_the_primary_the_sentinels_name() {
    let set = SentinelSet::start();
    let proxy = start_proxy(&set, RULES, &[]);
    let mut c = proxy.client();
    assert_eq!(served_by(&mut c), Some(set.primary()));
    assert_eq!(c.cmd(&["SET", "k", "v"]), Value::Simple("OK".into()));
}

#[test]
fn a_blocking_pop_parked_across_a_failover_gets_the_next_push() {
    let mut set = SentinelSet::start();
    let metrics = free_port();
    let ops = format!("127.0.0.1:{metrics}");
    let proxy = start_proxy(&set, RULES, &["--metrics", &ops]);
    let mut parked = proxy.client();
    parked.set_read_timeout(Some(Duration::from_secs(90)));
    parked.send(&["BRPOP", "jobs", "0"]);
    await_metric(metrics, "ackproxy_parked_clients", 1.0);
    let old = set.kill9_primary();
    let new = set.wait_failover(old);
    let mut c = proxy.client();
    wait_until_long("the proxy on the new primary", || {
        served_by(&mut c) == Some(new)
    });
    assert_eq!(c.cmd(&["LPUSH", "jobs", "after"]), Value::Int(1));
    // Still parked, not failed while the primary was gone.
    assert_eq!(parked.read_value(), Value::bulks(&["jobs", "after"]));
    assert_eq!(parked.cmd(&["ACK", "jobs", "after"]), Value::Int(1));
}

#[test]
fn a_manual_failover_moves_every_client_to_the_new_primary() {
    let set = SentinelSet::start();
    let proxy = start_proxy(&set, RULES, &[]);
    let old = set.primary();
    let mut c = proxy.client();
    assert_eq!(served_by(&mut c), Some(old));
    // The old primary stays up, as a replica: nothing the proxy holds to
    // it may stay in use.
    let mut s = Client::connect(set.sentinel_ports()[0]);
    assert_eq!(
        s.cmd(&["SENTINEL", "FAILOVER", SENTINEL_MASTER]),
        Value::Simple("OK".into())
    );
    let new = set.wait_failover(old);
    wait_until_long("the same client served by the new primary", || {
        matches!(c.try_cmd(&["SET", "k", "v"]), Ok(Value::Simple(_)))
            && served_by(&mut c) == Some(new)
    });
    // The proxy's own traffic follows too: a queue round trip.
    assert_eq!(c.cmd(&["LPUSH", "jobs", "one"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk("one"));
    assert_eq!(c.cmd(&["ACK", "jobs", "one"]), Value::Int(1));
    assert_eq!(info_role(new), "master");
}

fn info_role(port: u16) -> String {
    info(port, "replication")
        .lines()
        .find_map(|l| l.strip_prefix("role:"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn check_config(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ackproxy"))
        .arg("--check-config")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn sentinel_settings_are_checked() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config/sentinel.toml");
    let (code, out, err) = check_config(&["--config", example], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("the primary of sentinel master \"mymaster\", from 127.0.0.1:26379"),
        "{out}"
    );
    // The same from the environment.
    let (code, out, err) = check_config(
        &[],
        &[
            ("ACKPROXY_UPSTREAM_MODE", "sentinel"),
            ("ACKPROXY_SENTINEL_MASTER", "m1"),
            ("ACKPROXY_SENTINELS", "127.0.0.1:1,127.0.0.1:2"),
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("sentinel master \"m1\", from 127.0.0.1:1, 127.0.0.1:2"),
        "{out}"
    );
    for (args, why) in [
        (
            vec!["--upstream-mode", "sentinel", "--sentinel-master", "m"],
            "needs sentinels",
        ),
        (
            vec!["--upstream-mode", "sentinel", "--sentinels", "127.0.0.1:1"],
            "needs sentinel_master",
        ),
        (
            vec![
                "--upstream-mode",
                "sentinel",
                "--sentinel-master",
                "m",
                "--sentinels",
                "127.0.0.1:1",
                "--upstream",
                "127.0.0.1:2",
            ],
            "exclude each other",
        ),
        (
            vec![
                "--upstream-mode",
                "sentinel",
                "--sentinel-master",
                "m",
                "--sentinels",
                "nowhere",
            ],
            "sentinels: expected host:port",
        ),
        (
            vec!["--sentinel-master", "m", "--upstream", "127.0.0.1:2"],
            "need upstream_mode = \"sentinel\"",
        ),
        (
            vec![
                "--upstream-mode",
                "sentinel",
                "--sentinel-master",
                "m",
                "--sentinels",
                "127.0.0.1:1",
                "--sentinel-tls",
            ],
            "sentinel_tls needs sentinel_tls_ca_cert_file",
        ),
    ] {
        let (code, out, err) = check_config(&args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {out}{err}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
}

#[test]
fn connections_to_a_primary_cut_off_by_a_failover_are_closed() {
    let mut set = SentinelSet::start();
    let proxy = start_proxy(&set, RULES, &[]);
    let mut c = proxy.client();
    let mut pinned = proxy.client();
    assert_eq!(pinned.cmd(&["WATCH", "w"]), Value::Simple("OK".into()));
    let old = set.freeze_primary();
    // Sent to the frozen primary: nothing answers it until the switch.
    c.send(&["SET", "k", "before"]);
    pinned.send(&["GET", "w"]);
    let new = set.wait_failover(old);
    // The shared connection to the frozen primary was closed: what was
    // in flight on it failed, what comes next goes to the new primary.
    let in_flight = c.read_value();
    assert_eq!(
        in_flight,
        Value::Error("ERR upstream connection lost".into()),
        "{in_flight:?}"
    );
    wait_until_long("the client served by the new primary", || {
        matches!(c.try_cmd(&["SET", "k", "after"]), Ok(Value::Simple(_)))
    });
    assert_eq!(served_by(&mut c), Some(new));
    // A client whose own connection held state (its WATCH) is
    // disconnected, as if Redis had closed its connection.
    let mut rest = Vec::new();
    let closed = std::io::Read::read_to_end(&mut pinned.stream(), &mut rest);
    assert!(closed.is_ok() && rest.is_empty(), "{closed:?} {rest:?}");
}
