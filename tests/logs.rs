//! What the proxy logs at its default level (`info`), with stderr a file:
//! no colour codes, no line per passthrough command, the upstream's loss and return
//! once each, and the client's address on lines about a client.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

fn log_path() -> PathBuf {
    std::env::temp_dir().join(format!("ackproxy-log-{}.txt", free_port()))
}

/// A configuration file holding `toml`.
fn config(toml: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("ackproxy-log-{}.toml", free_port()));
    std::fs::write(&path, toml).unwrap();
    path
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Waits until the log has a line containing `what`, and returns the log.
fn await_line(log: &Path, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = read(log);
        if text.contains(what) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no line with {what:?} in:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn passthrough_logs_nothing_and_a_file_gets_no_colour() {
    let redis = Redis::start();
    let log = log_path();
    let proxy = Proxy::start_logged(redis.port, &config(""), &log);
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
    let log = log_path();
    let proxy = Proxy::start_logged(redis.port, &config(""), &log);
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
    let log = log_path();
    let limit = config("[limits]\nclient_output_buffer_limit = 1048576\n");
    let proxy = Proxy::start_logged(redis.port, &limit, &log);
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

#[test]
fn keyspace_notifications_lost_and_back_are_logged_once_each() {
    let mut redis = Redis::start();
    let log = log_path();
    let rules = config("[[queue]]\npattern = \"jobs\"\n");
    let _proxy = Proxy::start_logged(redis.port, &rules, &log);
    await_line(&log, "enabled keyspace notifications");
    let (port, dir) = (redis.port, redis.dir.clone());
    redis.kill();
    await_line(&log, "keyspace notifications unavailable");
    // Long enough for several attempts to subscribe again (the first
    // ones come 50 ms, 100 ms, 200 ms … apart).
    std::thread::sleep(Duration::from_secs(4));
    let during = read(&log);
    assert_eq!(
        during.matches("keyspace notifications unavailable").count(),
        1,
        "{during}"
    );
    let _back = Redis::start_on(port, dir, &[]);
    let text = await_line(&log, "keyspace notifications back");
    assert_eq!(
        text.matches("keyspace notifications unavailable").count(),
        1,
        "{text}"
    );
    assert_eq!(text.matches("keyspace notifications back").count(), 1, "{text}");
}
