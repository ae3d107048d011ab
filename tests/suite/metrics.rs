//! The Prometheus endpoint after known operations, scraped over HTTP: every
//! counter and gauge has exactly the value those operations must give it.
//! Also: parked pops do not hold up shutdown.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::*;

const CONFIG: &str = r#"
[limits]
maxclients = 4

[[queue]]
pattern = "jobs"
ack_id = "payload"
lease_ms = 600000

[[queue]]
pattern = "short:*"
ack_id = "payload"
lease_ms = 200
max_deliveries = 2

[[queue]]
pattern = "wait:*"
ack_id = "payload"
lease_ms = 600000
"#;

const ROUTES: [&str; 4] = ["shared", "dedicated", "queue", "proxy"];

fn rule(name: &str, pattern: &str) -> String {
    series(name, &[("rule", pattern)])
}

fn route(name: &str, r: &str) -> String {
    series(name, &[("route", r)])
}

/// Requests sent, by the route the proxy must serve them on.
#[derive(Default)]
struct Sent(HashMap<&'static str, f64>);

impl Sent {
    fn cmd(&mut self, c: &mut Client, via: &'static str, args: &[&str]) -> Value {
        *self.0.entry(via).or_default() += 1.0;
        c.cmd(args)
    }

    fn send(&mut self, c: &mut Client, via: &'static str, args: &[&str]) {
        *self.0.entry(via).or_default() += 1.0;
        c.send(args);
    }
}

fn info_field(v: &Value, field: &str) -> i64 {
    let Value::Array(items) = v else {
        panic!("QUEUE INFO: {v:?}")
    };
    let at = items
        .iter()
        .position(|i| *i == Value::bulk(field))
        .unwrap_or_else(|| panic!("QUEUE INFO has no {field}: {v:?}"));
    int(&items[at + 1])
}

#[test]
fn every_series_has_the_exact_value_of_known_operations() {
    let redis = Redis::start();
    let (proxy, m) = Proxy::start_with_metrics(redis.port, CONFIG);
    // The harness's PING connection is closed; its session ends on its own.
    await_metric(m, "ackproxy_connections_open", 0.0);
    let body = scrape(m).expect("metrics endpoint");

    // Every series exists from the start, at 0; the harness's PING (one
    // shared request) is the only thing that happened.
    for pattern in ["jobs", "short:*", "wait:*"] {
        for name in [
            "ackproxy_pops_total",
            "ackproxy_acks_total",
            "ackproxy_late_acks_total",
            "ackproxy_nacks_total",
            "ackproxy_expiries_total",
            "ackproxy_redeliveries_total",
            "ackproxy_dead_letters_total",
            "ackproxy_delayed_promoted_total",
            "ackproxy_redriven_total",
            "ackproxy_dead_dropped_total",
            "ackproxy_disconnect_requeues_total",
            "ackproxy_shadow_would_redeliver_total",
            "ackproxy_queue_ready",
            "ackproxy_queue_leased",
            "ackproxy_queue_delayed",
            "ackproxy_queue_dead",
            "ackproxy_queue_oldest_lease_age_seconds",
            "ackproxy_ack_latency_seconds_count",
        ] {
            let s = rule(name, pattern);
            assert_eq!(series_value(&body, &s), Some(0.0), "{s}");
        }
    }
    for name in [
        "ackproxy_rejected_connections_total",
        "ackproxy_tls_handshake_failures_total",
        "ackproxy_upstream_errors_total",
        "ackproxy_upstream_reconnects_total",
        "ackproxy_parked_clients",
        "ackproxy_connections_open",
    ] {
        assert_eq!(series_value(&body, name), Some(0.0), "{name}");
    }
    assert_eq!(
        series_value(
            &body,
            &series("ackproxy_upstream_connections", &[("kind", "dedicated")])
        ),
        Some(0.0)
    );
    for r in ["dedicated", "queue", "proxy"] {
        assert_eq!(
            series_value(&body, &route("ackproxy_commands_total", r)),
            Some(0.0),
            "{r}"
        );
    }
    let mut sent = Sent::default();
    sent.0.insert("shared", 1.0);
    let connected_before = series_value(&body, "ackproxy_connections_total").unwrap();
    assert_eq!(connected_before, 1.0, "the harness's PING connection");

    let mut c = proxy.client();
    await_metric(m, "ackproxy_connections_open", 1.0);

    // 5 pops of 3 messages, 12 of them acknowledged, 1 nacked, 1 unknown id.
    let msgs: Vec<String> = (1..=16).map(|i| format!("m{i}")).collect();
    let mut push = vec!["LPUSH", "jobs"];
    push.extend(msgs.iter().map(String::as_str));
    assert_eq!(sent.cmd(&mut c, "shared", &push), Value::Int(16));
    let mut popped = Vec::new();
    for _ in 0..5 {
        match sent.cmd(&mut c, "queue", &["RPOP", "jobs", "3"]) {
            Value::Array(vs) => popped.extend(vs),
            other => panic!("RPOP: {other:?}"),
        }
    }
    let popped = bulk_strings(&popped, "popped");
    assert_eq!(popped.len(), 15);
    let mut ack = vec!["ACK", "jobs"];
    ack.extend(popped[..12].iter().map(String::as_str));
    assert_eq!(sent.cmd(&mut c, "queue", &ack), Value::Int(12));
    assert_eq!(
        sent.cmd(&mut c, "queue", &["NACK", "jobs", &popped[12]]),
        Value::Int(1)
    );
    assert_eq!(
        sent.cmd(&mut c, "queue", &["ACK", "jobs", "nope"]),
        Value::Int(0)
    );

    // A lease that runs out twice: redelivered, then dead-lettered.
    assert_eq!(
        sent.cmd(&mut c, "shared", &["LPUSH", "short:a", "x"]),
        Value::Int(1)
    );
    assert_eq!(
        sent.cmd(&mut c, "queue", &["RPOP", "short:a"]),
        Value::bulk("x")
    );
    await_metric(m, &rule("ackproxy_redeliveries_total", "short:*"), 1.0);
    assert_eq!(
        sent.cmd(&mut c, "queue", &["RPOP", "short:a"]),
        Value::bulk("x")
    );
    await_metric(m, &rule("ackproxy_dead_letters_total", "short:*"), 1.0);

    // A parked pop woken by a push, and one that times out.
    let mut parked = proxy.client();
    sent.send(&mut parked, "queue", &["BRPOP", "wait:1", "0"]);
    await_metric(m, "ackproxy_parked_clients", 1.0);
    assert_eq!(
        sent.cmd(&mut c, "shared", &["LPUSH", "wait:1", "w"]),
        Value::Int(1)
    );
    assert_eq!(parked.read_value(), Value::bulks(&["wait:1", "w"]));
    await_metric(m, "ackproxy_parked_clients", 0.0);
    assert_eq!(
        sent.cmd(&mut parked, "queue", &["BRPOP", "wait:2", "0.05"]),
        Value::Nil
    );
    await_metric(m, "ackproxy_parked_clients", 0.0);

    // A blocking command on a plain key: the client's own connection.
    assert_eq!(
        sent.cmd(&mut c, "dedicated", &["BLPOP", "plain", "0.01"]),
        Value::Nil
    );
    await_metric(
        m,
        &series("ackproxy_upstream_connections", &[("kind", "dedicated")]),
        1.0,
    );

    // QUEUE INFO suggests a lease from the 12 acknowledgements.
    let info = sent.cmd(&mut c, "queue", &["QUEUE", "INFO", "jobs"]);
    let suggested = info_field(&info, "suggested-lease-ms");
    assert!(suggested >= 1000 && suggested % 1000 == 0, "{info:?}");
    let info = sent.cmd(&mut c, "queue", &["QUEUE", "INFO", "wait:1"]);
    assert_eq!(info_field(&info, "suggested-lease-ms"), -1, "no ACK yet");

    let counters = [
        ("ackproxy_pops_total", "jobs", 15.0),
        ("ackproxy_acks_total", "jobs", 12.0),
        ("ackproxy_ack_latency_seconds_count", "jobs", 12.0),
        ("ackproxy_nacks_total", "jobs", 1.0),
        ("ackproxy_late_acks_total", "jobs", 0.0),
        ("ackproxy_expiries_total", "jobs", 0.0),
        ("ackproxy_pops_total", "short:*", 2.0),
        ("ackproxy_expiries_total", "short:*", 2.0),
        ("ackproxy_redeliveries_total", "short:*", 1.0),
        ("ackproxy_dead_letters_total", "short:*", 1.0),
        ("ackproxy_acks_total", "short:*", 0.0),
        ("ackproxy_pops_total", "wait:*", 1.0),
        ("ackproxy_acks_total", "wait:*", 0.0),
    ];
    for (name, pattern, want) in counters {
        await_metric(m, &rule(name, pattern), want);
    }
    // The queue gauges, once the reaper has sampled after the last change.
    let gauges = [
        ("ackproxy_queue_ready", "jobs", 2.0),
        ("ackproxy_queue_leased", "jobs", 2.0),
        ("ackproxy_queue_dead", "jobs", 0.0),
        ("ackproxy_queue_ready", "short:*", 0.0),
        ("ackproxy_queue_leased", "short:*", 0.0),
        ("ackproxy_queue_dead", "short:*", 1.0),
        ("ackproxy_queue_ready", "wait:*", 0.0),
        ("ackproxy_queue_leased", "wait:*", 1.0),
        ("ackproxy_queue_dead", "wait:*", 0.0),
    ];
    for (name, pattern, want) in gauges {
        await_metric(m, &rule(name, pattern), want);
    }
    assert!(metric(m, &rule("ackproxy_queue_oldest_lease_age_seconds", "jobs")) > 0.0);
    assert_eq!(
        metric(
            m,
            &rule("ackproxy_queue_oldest_lease_age_seconds", "short:*")
        ),
        0.0
    );

    // Delayed delivery: a message due in 100 ms is promoted by the reaper,
    // one due in an hour stays delayed.
    for (payload, delay) in [("soon", "100"), ("later", "3600000")] {
        assert_eq!(
            sent.cmd(
                &mut c,
                "queue",
                &["QUEUE", "PUSH", "wait:3", payload, "DELAY", delay]
            ),
            Value::Int(1)
        );
    }
    await_metric(m, &rule("ackproxy_delayed_promoted_total", "wait:*"), 1.0);
    await_metric(m, &rule("ackproxy_queue_delayed", "wait:*"), 1.0);
    await_metric(m, &rule("ackproxy_queue_ready", "wait:*"), 1.0);
    // The dead letter back in its queue.
    assert_eq!(
        sent.cmd(&mut c, "queue", &["QUEUE", "REDRIVE", "short:a"]),
        Value::Int(1)
    );
    await_metric(m, &rule("ackproxy_redriven_total", "short:*"), 1.0);
    await_metric(m, &rule("ackproxy_queue_dead", "short:*"), 0.0);
    await_metric(m, &rule("ackproxy_queue_ready", "short:*"), 1.0);
    for (name, pattern) in [
        ("ackproxy_dead_dropped_total", "short:*"),
        ("ackproxy_disconnect_requeues_total", "jobs"),
        ("ackproxy_shadow_would_redeliver_total", "jobs"),
        ("ackproxy_queue_delayed", "jobs"),
    ] {
        assert_eq!(metric(m, &rule(name, pattern)), 0.0, "{name}");
    }

    // Every request counted by route, and timed: one latency per request.
    for r in ROUTES {
        if r == "proxy" {
            continue;
        }
        let want = sent.0.get(r).copied().unwrap_or(0.0);
        await_metric(m, &route("ackproxy_commands_total", r), want);
        await_metric(
            m,
            &route("ackproxy_command_duration_seconds_count", r),
            want,
        );
    }

    // maxclients = 4: c and parked are open; two more fit, the next is refused.
    let mut third = proxy.client();
    let mut fourth = proxy.client();
    await_metric(m, "ackproxy_connections_open", 4.0);
    let mut fifth = proxy.client();
    assert_eq!(
        fifth.read_value(),
        Value::Error("ERR max number of clients reached".into())
    );
    await_metric(m, "ackproxy_rejected_connections_total", 1.0);
    assert_eq!(
        sent.cmd(&mut third, "proxy", &["QUIT"]),
        Value::Simple("OK".into())
    );
    assert_eq!(
        sent.cmd(&mut fourth, "proxy", &["QUIT"]),
        Value::Simple("OK".into())
    );
    await_metric(m, &route("ackproxy_commands_total", "proxy"), 2.0);
    await_metric(
        m,
        &route("ackproxy_command_duration_seconds_count", "proxy"),
        2.0,
    );
    drop((c, parked, third, fourth, fifth));
    await_metric(m, "ackproxy_connections_open", 0.0);
    await_metric(
        m,
        &series("ackproxy_upstream_connections", &[("kind", "dedicated")]),
        0.0,
    );
    // The harness's PING, c, parked, third and fourth (not the refused one).
    await_metric(m, "ackproxy_connections_total", 5.0);
    assert_eq!(metric(m, "ackproxy_upstream_errors_total"), 0.0);
    assert_eq!(metric(m, "ackproxy_upstream_reconnects_total"), 0.0);
}

/// An outage is counted once, and `ackproxy_upstream_up` is 0 while it
/// lasts: 1 → 0 when Redis dies, → 1 when the proxy is connected again.
#[test]
fn upstream_loss_and_return_are_counted() {
    let mut redis = Redis::start();
    let m = free_port();
    let proxy = Proxy::start(redis.port, &["--metrics", &format!("127.0.0.1:{m}")]);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["SET", "k", "v"]), Value::Simple("OK".into()));
    assert_eq!(metric(m, "ackproxy_upstream_up"), 1.0);
    let (port, dir) = (redis.port, redis.dir.clone());
    redis.kill();
    // The loss is seen by the next request, which fails.
    assert!(matches!(c.cmd(&["GET", "k"]), Value::Error(_)));
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(m, "ackproxy_upstream_errors_total") < 1.0 {
        assert!(Instant::now() < deadline, "the loss was not counted");
        std::thread::sleep(Duration::from_millis(20));
    }
    await_metric(m, "ackproxy_upstream_up", 0.0);
    assert_eq!(metric(m, "ackproxy_upstream_reconnects_total"), 0.0);
    // Still down after more failed attempts.
    assert!(matches!(c.cmd(&["GET", "k"]), Value::Error(_)));
    assert_eq!(metric(m, "ackproxy_upstream_up"), 0.0);
    let _back = Redis::start_on(port, dir, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.cmd(&["PING"]) != Value::Simple("PONG".into()) {
        assert!(Instant::now() < deadline, "not reconnected");
        std::thread::sleep(Duration::from_millis(20));
    }
    // One outage, however many attempts it took.
    assert_eq!(metric(m, "ackproxy_upstream_reconnects_total"), 1.0);
    assert_eq!(metric(m, "ackproxy_upstream_up"), 1.0);
}

/// A proxy started while Redis is down says so, and says when it is back.
#[test]
fn upstream_up_is_0_from_a_start_without_redis() {
    let port = free_port();
    let m = free_port();
    let listen = free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ackproxy"))
        .args(["--listen", &format!("127.0.0.1:{listen}")])
        .args(["--upstream", &format!("127.0.0.1:{port}")])
        .args(["--metrics", &format!("127.0.0.1:{m}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    await_metric(m, "ackproxy_upstream_up", 0.0);
    let dir = std::env::temp_dir().join(format!("ackproxy-test-redis-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let _redis = Redis::start_on(port, dir, &[]);
    // The proxy's own probe finds it, with no client request.
    await_metric(m, "ackproxy_upstream_up", 1.0);
    stop_child(&mut child, Duration::from_secs(5));
}

/// `ackproxy_build_info` names the version and the commit (as `--version`
/// does), at 1.
#[test]
fn build_info_names_the_version_and_commit() {
    let redis = Redis::start();
    let m = free_port();
    let _proxy = Proxy::start(redis.port, &["--metrics", &format!("127.0.0.1:{m}")]);
    let body = scrape(m).expect("metrics endpoint");
    let version = std::process::Command::new(env!("CARGO_BIN_EXE_ackproxy"))
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    let commit = version
        .split("(commit ")
        .nth(1)
        .and_then(|c| c.split(')').next())
        .unwrap_or("unknown");
    let name = series(
        "ackproxy_build_info",
        &[("version", env!("CARGO_PKG_VERSION")), ("commit", commit)],
    );
    assert_eq!(series_value(&body, &name), Some(1.0), "{name} in:\n{body}");
    assert!(body.contains("# TYPE ackproxy_build_info gauge"), "{body}");
}

/// The process series every Prometheus client library exports, under
/// their standard names and types, with values that fit this process.
#[test]
fn process_series_are_exported() {
    let redis = Redis::start();
    let m = free_port();
    let proxy = Proxy::start(redis.port, &["--metrics", &format!("127.0.0.1:{m}")]);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let body = scrape(m).expect("metrics endpoint");
    let value =
        |name: &str| series_value(&body, name).unwrap_or_else(|| panic!("no {name} in:\n{body}"));
    for (name, kind) in [
        ("process_cpu_seconds_total", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_virtual_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
    ] {
        assert!(
            body.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} {kind}"
        );
        assert!(value(name) >= 0.0, "{name}");
    }
    let resident = value("process_resident_memory_bytes");
    let rss = rss_kb(proxy.pid()) as f64 * 1024.0;
    assert!(
        resident > 1e6 && (resident - rss).abs() < rss / 2.0,
        "{resident} {rss}"
    );
    assert!(value("process_virtual_memory_bytes") >= resident);
    // Listeners, the upstream connection, this scrape's.
    let fds = value("process_open_fds");
    assert!(fds >= 4.0 && fds <= value("process_max_fds"), "{fds}");
    let start = value("process_start_time_seconds");
    assert!(
        start <= started + 1.0 && start > started - 60.0,
        "{start} {started}"
    );
}

/// `ackproxy_config_reload_success` says how the last SIGHUP went, and
/// `ackproxy_config_reload_timestamp_seconds` when the configuration last
/// loaded (start-up at first); a failed reload is one line in the log.
#[test]
fn reload_metrics_follow_good_and_bad_reloads() {
    let redis = Redis::start();
    let m = free_port();
    let good =
        format!("metrics = \"127.0.0.1:{m}\"\n[[queue]]\npattern = \"jobs\"\nlease_ms = \"30s\"\n");
    let config = TempFile::new("ackproxy-reload-metrics", "toml", &good);
    let log = TempFile::new("ackproxy-reload-metrics", "log", "");
    let proxy = Proxy::start_logged(redis.port, &config, &log);
    assert_eq!(metric(m, "ackproxy_config_reload_success"), 1.0);
    let loaded = metric(m, "ackproxy_config_reload_timestamp_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(loaded > now - 60.0 && loaded <= now + 1.0, "{loaded} {now}");

    let bad = good.replace("lease_ms", "leas_ms");
    std::fs::write(&*config, &bad).unwrap();
    proxy.hangup();
    await_metric(m, "ackproxy_config_reload_success", 0.0);
    assert_eq!(
        metric(m, "ackproxy_config_reload_timestamp_seconds"),
        loaded
    );
    let text = std::fs::read_to_string(&*log).unwrap();
    let failed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("configuration not reloaded"))
        .collect();
    assert_eq!(failed.len(), 1, "{text}");
    assert!(
        failed[0].contains(":4: queue.leas_ms: unknown key, did you mean `lease_ms`?"),
        "{}",
        failed[0]
    );
    // No continuation lines (a snippet of the file, a caret): every line
    // of the log is an entry of its own, starting with its time.
    for line in text.lines() {
        assert!(line.starts_with(|c: char| c.is_ascii_digit()), "{text}");
    }

    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&*config, good.replace("30s", "1m")).unwrap();
    proxy.hangup();
    await_metric(m, "ackproxy_config_reload_success", 1.0);
    assert!(metric(m, "ackproxy_config_reload_timestamp_seconds") > loaded);
}

#[test]
fn sigterm_closes_parked_pops_at_once_after_their_earlier_replies() {
    let redis = Redis::start();
    let (mut proxy, m) = Proxy::start_with_metrics(redis.port, CONFIG);
    let mut c = proxy.client();
    let mut pipeline = Client::encode(&[b"PING"]);
    pipeline.extend_from_slice(&Client::encode(&[b"BRPOP", b"wait:never", b"0"]));
    c.send_raw(&pipeline);
    await_metric(m, "ackproxy_parked_clients", 1.0);
    let started = Instant::now();
    assert!(proxy.terminate(), "ackproxy did not exit cleanly");
    // Well within the 10 s a busy client may take to drain.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    // As Redis's SHUTDOWN does to a blocked client: the connection closes,
    // with no reply to the pop, after the replies due before it.
    assert_eq!(
        read_to_close(&mut c.stream().try_clone().unwrap()),
        b"+PONG\r\n"
    );
    // The parked pop took nothing.
    assert_eq!(redis.client().cmd(&["EXISTS", "wait:never"]), Value::Int(0));
}

/// FCALL calls Redis has run so far.
fn fcalls(direct: &mut Client) -> i64 {
    let Value::Bulk(info) = direct.cmd(&["INFO", "commandstats"]) else {
        panic!("INFO")
    };
    String::from_utf8_lossy(&info)
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Waits (long: thousands of queues are sampled a bounded number a round)
/// until the series has the value `want`.
fn await_slow_metric(port: u16, name: &str, want: f64) {
    let (limit, every) = (Duration::from_secs(120), Duration::from_millis(100));
    await_metric_within(port, name, want, limit, every);
}

#[test]
fn an_idle_proxy_samples_the_gauges_of_thousands_of_queues_at_a_bounded_cost() {
    const QUEUES: usize = 2000;
    /// FCALLs Redis may see in 5 idle seconds (two and a half rounds of
    /// the gauges' sampling): the slow refresh of queues this proxy did not
    /// change takes 2 a round. (Sampling every queue would be thousands.)
    const IDLE_WINDOW: Duration = Duration::from_secs(5);
    const IDLE_BOUND: i64 = 15;
    let config = "[[queue]]\npattern = \"many:*\"\nack_id = \"payload\"\nlease_ms = 600000\n";
    let redis = Redis::start();
    let (proxy, m) = Proxy::start_with_metrics(redis.port, config);
    let mut direct = redis.client();
    let mut c = proxy.client();
    for i in 0..QUEUES {
        direct.send(&[
            "LPUSH",
            &format!("many:{i}"),
            &format!("a{i}"),
            &format!("b{i}"),
        ]);
    }
    for _ in 0..QUEUES {
        assert_eq!(direct.read_value(), Value::Int(2));
    }
    // Each queue popped once and acknowledged: one message left in each.
    for i in 0..QUEUES {
        c.send(&["RPOP", &format!("many:{i}")]);
    }
    for i in 0..QUEUES {
        assert_eq!(c.read_value(), Value::bulk(&format!("a{i}")));
    }
    for i in 0..QUEUES {
        c.send(&["ACK", &format!("many:{i}"), &format!("a{i}")]);
    }
    for _ in 0..QUEUES {
        assert_eq!(c.read_value(), Value::Int(1));
    }
    let ready = rule("ackproxy_queue_ready", "many:*");
    let leased = rule("ackproxy_queue_leased", "many:*");
    await_slow_metric(m, &ready, QUEUES as f64);
    await_slow_metric(m, &leased, 0.0);

    // Once every queue is sampled after its last change, nothing happens
    // and Redis is (nearly) not asked anything.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let before = fcalls(&mut direct);
        std::thread::sleep(IDLE_WINDOW);
        let calls = fcalls(&mut direct) - before;
        if calls <= IDLE_BOUND {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{calls} FCALL in {IDLE_WINDOW:?} of an idle proxy with {QUEUES} queues"
        );
    }

    // A queue that changes still shows in the gauges at once.
    assert_eq!(c.cmd(&["RPOP", "many:7"]), Value::bulk("b7"));
    await_metric(m, &leased, 1.0);
    await_metric(m, &ready, QUEUES as f64 - 1.0);
    // Its lease ages although the queue is not sampled again.
    let age = rule("ackproxy_queue_oldest_lease_age_seconds", "many:*");
    wait_until("the lease to age", || metric(m, &age) >= 3.0);
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "many:8", "c8", "d8"]),
        Value::Int(2)
    );
    await_metric(m, &ready, QUEUES as f64 + 1.0);
    assert_eq!(c.cmd(&["ACK", "many:7", "b7"]), Value::Int(1));
    await_metric(m, &leased, 0.0);
    await_metric(m, &age, 0.0);
}

/// Tools that follow OpenMetrics (Prometheus's own OpenMetrics parser, the
/// OpenTelemetry collector) name a counter without its `_total`: no other
/// series may have that name.
#[test]
fn no_series_is_named_as_a_counter_without_its_total() {
    let redis = Redis::start();
    let (_proxy, m) = Proxy::start_with_metrics(redis.port, CONFIG);
    let body = scrape(m).expect("metrics endpoint");
    let families: Vec<(&str, &str)> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    assert!(families.len() > 20, "{body}");
    for (name, kind) in &families {
        if *kind != "counter" {
            continue;
        }
        let bare = name.strip_suffix("_total").unwrap_or_else(|| {
            panic!("counter {name} does not end in _total");
        });
        for (other, other_kind) in &families {
            assert_ne!(
                *other, bare,
                "the {other_kind} {other} is named as the counter {name} without _total"
            );
        }
    }
}

/// Queue gauges sampled before Redis went away keep their values, and
/// `ackproxy_queue_sampled_timestamp_seconds` tells they are stale: it stands
/// still until Redis answers again.
#[test]
fn queue_gauges_carried_over_an_outage_say_when_they_were_sampled() {
    let mut redis = Redis::start();
    let (proxy, m) = Proxy::start_with_metrics(redis.port, CONFIG);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["LPUSH", "jobs", "a", "b", "c"]), Value::Int(3));
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk("a"));
    await_slow_metric(m, &rule("ackproxy_queue_ready", "jobs"), 2.0);
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let sampled = "ackproxy_queue_sampled_timestamp_seconds";
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(m, sampled) < now() - 5.0 {
        assert!(Instant::now() < deadline, "never sampled");
        std::thread::sleep(Duration::from_millis(100));
    }

    let (port, dir) = (redis.port, redis.dir.clone());
    redis.kill();
    let down = now();
    assert!(matches!(c.cmd(&["GET", "k"]), Value::Error(_)));
    // Several sampling rounds (one each 2 s) fail meanwhile.
    std::thread::sleep(Duration::from_secs(7));
    let last = metric(m, sampled);
    assert!(
        last <= down + 0.5,
        "sampled at {last} with Redis down since {down}"
    );
    assert_eq!(metric(m, &rule("ackproxy_queue_ready", "jobs")), 2.0);

    let _back = Redis::start_on(port, dir, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(m, sampled) <= last {
        assert!(Instant::now() < deadline, "not sampled again");
        let _ = c.cmd(&["PING"]);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Prometheus's own linter accepts the exposition (names, units, HELP and
/// TYPE lines, histograms), after traffic on every kind of series.
#[test]
fn promtool_accepts_the_exposition() {
    let redis = Redis::start();
    let (proxy, m) = Proxy::start_with_metrics(redis.port, CONFIG);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["LPUSH", "jobs", "a", "b"]), Value::Int(2));
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk("a"));
    assert_eq!(c.cmd(&["ACK", "jobs", "a"]), Value::Int(1));
    assert_eq!(c.cmd(&["SET", "k", "v"]), Value::Simple("OK".into()));
    let text = scrape(m).expect("metrics endpoint");
    assert!(
        text.contains("ackproxy_acks_total{rule=\"jobs\"} 1"),
        "{text}"
    );
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; tests/setup-bench-deps.sh installs it)");
    use std::io::Write;
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
