//! What the proxy logs at its default level (`info`), with stderr a file:
//! no colour codes, no line per passthrough command, the upstream's loss and return
//! once each, and the client's address on lines about a client.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;

/// An empty file for the proxy's log.
fn log_path() -> TempFile {
    TempFile::new("ackproxy-log", "txt", "")
}

/// A configuration file holding `toml`.
fn config(toml: &str) -> TempFile {
    TempFile::new("ackproxy-log", "toml", toml)
}

/// A proxy in front of `redis` configured by `toml`, logging into a file
/// of its own: the log, and the proxy (which keeps its configuration file).
fn logged(redis: &Redis, toml: &str) -> (TempFile, Proxy) {
    let log = log_path();
    let cfg = config(toml);
    let proxy = Proxy::start_logged(redis.port, &cfg, &log);
    (log, proxy.owning(cfg))
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Waits until the log has a line containing `what`, and returns the log.
fn await_line(log: &Path, what: &str) -> String {
    poll_until(Duration::from_secs(30), Duration::from_millis(20), || {
        let text = read(log);
        if text.contains(what) {
            Ok(text)
        } else {
            Err(format!("no line with {what:?} in:\n{text}"))
        }
    })
}

#[test]
fn passthrough_logs_nothing_and_a_file_gets_no_colour() {
    let redis = Redis::start();
    let (log, proxy) = logged(&redis, "");
    let before = read(&log);
    let mut c = proxy.client();
    for i in 0..200 {
        let k = format!("k{i}");
        assert_eq!(c.cmd(&["SET", &k, "v"]), Value::Simple("OK".into()));
        assert_eq!(c.cmd(&["GET", &k]), Value::bulk("v"));
    }
    drop(c);
    // A known later line, so that anything the commands logged is in.
    let mut d = proxy.client();
    assert_eq!(
        d.cmd(&["CLIENT", "SETNAME", "bad name"]),
        Value::Error(
            "ERR Client names cannot contain spaces, newlines or special characters.".into()
        )
    );
    let after = read(&log);
    assert_eq!(after, before, "lines logged for passthrough commands");
    assert!(
        !before.contains('\u{1b}'),
        "colour codes in a file: {before:?}"
    );
    assert!(before.contains("ackproxy ready"), "{before}");
}

#[test]
fn upstream_down_and_back_up_are_logged_once_each() {
    let mut redis = Redis::start();
    let (log, proxy) = logged(&redis, "");
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["SET", "k", "v"]), Value::Simple("OK".into()));
    let (port, dir) = (redis.port, redis.dir.clone());
    redis.kill();
    // Many requests fail while it is down, each after new attempts.
    for _ in 0..20 {
        assert!(matches!(c.cmd(&["GET", "k"]), Value::Error(_)));
        std::thread::sleep(Duration::from_millis(10));
    }
    let _back = Redis::start_on(port, dir, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.cmd(&["PING"]) != Value::Simple("PONG".into()) {
        assert!(Instant::now() < deadline, "not reconnected");
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = await_line(&log, "upstream back up");
    assert_eq!(text.matches("upstream down").count(), 1, "{text}");
    assert_eq!(text.matches("upstream back up").count(), 1, "{text}");
}

#[test]
fn a_line_about_a_client_names_its_address() {
    let redis = Redis::start();
    let mut direct = redis.client();
    let big = "x".repeat(512 * 1024);
    assert_eq!(
        direct.cmd(&["SET", "big", &big]),
        Value::Simple("OK".into())
    );
    let (log, proxy) = logged(&redis, "[limits]\nclient_output_buffer_limit = 1048576\n");
    // A client that asks for 16 MB and reads nothing passes the limit:
    // more than the kernel's buffers of the socket take (a send buffer
    // grows to 4 MB by default; 4 MB of replies could all fit there).
    let mut c = proxy.client();
    let addr = c.local_addr();
    let mut pipeline = Vec::new();
    for _ in 0..32 {
        pipeline.extend_from_slice(&Client::encode(&[b"GET", b"big"]));
    }
    c.send_raw(&pipeline);
    let text = await_line(&log, "output buffer limit");
    let line = text
        .lines()
        .find(|l| l.contains("output buffer limit"))
        .unwrap();
    assert!(line.contains(&format!("client={addr}")), "{line}");
}

/// Redis lost under a proxy with queue rules is one cause: its keyspace
/// subscription, which sees it first or not, adds no line of its own. The
/// outage is logged once when it begins and once when it ends (here found
/// by the subscription again, with no client request), however many
/// attempts come in between.
#[test]
fn redis_lost_under_the_keyspace_subscription_is_one_outage_in_the_log() {
    let mut redis = Redis::start();
    let (log, _proxy) = logged(&redis, "[[queue]]\npattern = \"jobs\"\n");
    await_line(&log, "enabled keyspace notifications");
    let (port, dir) = (redis.port, redis.dir.clone());
    redis.kill();
    await_line(&log, "upstream down");
    // Long enough for several attempts to subscribe again (the first
    // ones come 50 ms, 100 ms, 200 ms … apart).
    std::thread::sleep(Duration::from_secs(4));
    let during = read(&log);
    assert_eq!(during.matches("upstream down").count(), 1, "{during}");
    assert_eq!(during.matches(" WARN ").count(), 1, "{during}");
    let _back = Redis::start_on(port, dir, &[]);
    let text = await_line(&log, "upstream back up");
    assert_eq!(text.matches("upstream down").count(), 1, "{text}");
    assert_eq!(text.matches("upstream back up").count(), 1, "{text}");
    assert!(
        !text.contains("keyspace notifications unavailable"),
        "{text}"
    );
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    out
}

#[test]
fn a_clean_stop_logs_no_warning() {
    // With the private redis-server: stopped by the proxy after its clients
    // (SIGTERM to the proxy alone), or at the same moment as the proxy (a
    // service manager signals every process of the unit).
    for whole_group in [false, true] {
        let log = log_path();
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let rules = config("[[queue]]\npattern = \"jobs\"\n");
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ackproxy"))
            .args(["--listen", &listen, "--config"])
            .arg(rules.as_arg())
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&*log).unwrap())
            .spawn()
            .unwrap();
        wait_until("the proxy to answer", || {
            Client::try_connect(port).is_ok_and(|mut c| {
                c.send(&["PING"]);
                c.try_read_raw().is_ok_and(|r| r == b"+PONG\r\n")
            })
        });
        let mut c = Client::connect(port);
        assert_eq!(c.cmd(&["LPUSH", "jobs", "a"]), Value::Int(1));
        assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk("a"));
        assert_eq!(c.cmd(&["SET", "k", "v"]), Value::Simple("OK".into()));
        let mut pids = vec![child.id()];
        if whole_group {
            pids.extend(children(child.id()));
            assert_eq!(pids.len(), 2, "no private redis-server: {pids:?}");
        }
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let status = std::process::Command::new("kill")
            .arg("-TERM")
            .args(&pids)
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        let exit = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "still running after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(exit.success(), "{exit}");
        let text = read(&log);
        assert!(text.contains("signal received, stopping"), "{text}");
        assert!(
            !text.contains("WARN"),
            "a warning on a clean stop (whole group: {whole_group}):\n{text}"
        );
    }
}

/// Redis down at start-up is one cause: one line says it (not one per part
/// of the proxy that needs Redis), and `ackproxy ready` waits until Redis
/// answers, as `/readyz` does.
#[test]
fn redis_down_at_start_is_one_line_and_ready_waits_for_it() {
    let log = log_path();
    let cfg = config("[[queue]]\npattern = \"jobs\"\n");
    let redis_port = free_port();
    let port = free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ackproxy"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--upstream", &format!("127.0.0.1:{redis_port}")])
        .args(["--config", cfg.as_arg()])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&*log).unwrap())
        .spawn()
        .unwrap();
    await_line(&log, "not ready");
    // What else starts meanwhile (the parked pops' subscription, the
    // reaper) has had time to fail too.
    std::thread::sleep(Duration::from_millis(1500));
    let before = read(&log);
    let warnings: Vec<&str> = before.lines().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(warnings.len(), 1, "{before}");
    assert!(warnings[0].contains("upstream down"), "{before}");
    assert!(!before.contains("ackproxy ready"), "{before}");

    let dir = std::env::temp_dir().join(format!("ackproxy-test-redis-{redis_port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let _redis = Redis::start_on(redis_port, dir, &[]);
    let after = await_line(&log, "ackproxy ready");
    assert_eq!(after.matches("ackproxy ready").count(), 1, "{after}");
    assert!(after.contains("upstream back up"), "{after}");
    let _ = child.kill();
    let _ = child.wait();
}
