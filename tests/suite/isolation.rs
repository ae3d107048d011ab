//! Isolation of clients sharing the proxy's upstream connections: what one
//! client does (a script that loops, a blocking pop, a request Redis
//! refuses, ...) must not stall or break another client any more than it
//! does when both talk to Redis directly. Every scenario runs against a
//! Redis directly and through the proxy (in both connection modes), and the
//! victim's replies and worst latency are compared.

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::*;

const QUEUE_CONFIG: &str = r#"
[[queue]]
pattern = "q*"
lease_ms = 600000
max_deliveries = 3
ack_id = "payload"
redeliver = "next"
pop_end = "right"
"#;

const MODES: [&[&str]; 2] = [&[], &["--dedicated-per-client"]];

/// A client sending `GET vk` one at a time until told to stop, recording
/// each reply and how long it took.
struct Victim {
    stop: Arc<AtomicBool>,
    /// Set once the victim got a `-BUSY` reply.
    busy: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
    handle: JoinHandle<Vec<(Vec<u8>, Duration)>>,
}

impl Victim {
    fn start(port: u16) -> Victim {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let busy = Arc::new(AtomicBool::new(false));
        let (s, d, b) = (stop.clone(), done.clone(), busy.clone());
        let handle = std::thread::spawn(move || {
            let mut c = Client::connect(port);
            c.set_read_timeout(Some(Duration::from_secs(3)));
            let mut seen = Vec::new();
            while !s.load(Ordering::Acquire) {
                let t = Instant::now();
                c.send(&["GET", "vk"]);
                let reply = c.try_read_raw();
                let stalled = reply.is_err();
                if reply.as_ref().is_ok_and(|r| r.starts_with(b"-BUSY")) {
                    b.store(true, Ordering::Release);
                }
                seen.push((
                    reply.unwrap_or_else(|_| b"<no reply>".to_vec()),
                    t.elapsed(),
                ));
                d.fetch_add(1, Ordering::AcqRel);
                if stalled {
                    break;
                }
            }
            seen
        });
        let v = Victim {
            stop,
            busy,
            done,
            handle,
        };
        v.wait_for(5);
        v
    }

    /// Waits until the victim has `n` more replies (or gave up).
    fn wait_for(&self, n: usize) {
        let target = self.done.load(Ordering::Acquire) + n;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.done.load(Ordering::Acquire) < target
            && !self.handle.is_finished()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until the victim has been told Redis is busy.
    fn wait_busy(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.busy.load(Ordering::Acquire) {
            assert!(
                Instant::now() < deadline && !self.handle.is_finished(),
                "the victim was never told Redis is busy"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The distinct replies and the worst latency.
    fn finish(self) -> (BTreeSet<String>, Duration) {
        self.stop.store(true, Ordering::Release);
        let seen = self.handle.join().unwrap();
        let replies = seen
            .iter()
            .map(|(r, _)| String::from_utf8_lossy(r).into_owned())
            .collect();
        let worst = seen.iter().map(|(_, t)| *t).max().unwrap_or_default();
        (replies, worst)
    }
}

struct Outcome {
    offender: Vec<String>,
    victim: BTreeSet<String>,
    worst: Duration,
}

/// Runs `offend` against `port` while a victim keeps reading `vk`.
fn scenario(port: u16, offend: &dyn Fn(u16, &Victim) -> Vec<String>) -> Outcome {
    Client::connect(port).cmd(&["SET", "vk", "v"]);
    let victim = Victim::start(port);
    let offender = offend(port, &victim);
    victim.wait_for(5);
    let (victim, worst) = victim.finish();
    Outcome {
        offender,
        victim,
        worst,
    }
}

/// The same scenario directly and through the proxy, in both modes; the
/// victim must see the same replies and no stall Redis itself does not
/// have. `setup` prepares each Redis (directly).
fn compare(
    config: Option<&str>,
    setup: &dyn Fn(&mut Client),
    offend: &dyn Fn(u16, &Victim) -> Vec<String>,
    stall: Duration,
) {
    for mode in MODES {
        let direct = Redis::start();
        setup(&mut direct.client());
        let d = scenario(direct.port, offend);
        let upstream = Redis::start();
        setup(&mut upstream.client());
        let proxy = match config {
            Some(toml) => Proxy::start_with_config(upstream.port, toml, mode),
            None => Proxy::start(upstream.port, mode),
        };
        let p = scenario(proxy.port, offend);
        println!(
            "{mode:?}: victim worst latency direct {:?}, proxied {:?}",
            d.worst, p.worst
        );
        assert_eq!(p.offender, d.offender, "offender's replies ({mode:?})");
        assert_eq!(p.victim, d.victim, "victim's replies ({mode:?})");
        if d.worst < stall {
            assert!(
                p.worst < stall,
                "victim stalled {:?} through the proxy ({mode:?}), {:?} directly",
                p.worst,
                d.worst
            );
        } else {
            assert!(
                p.worst < d.worst + stall,
                "victim stalled {:?} through the proxy ({mode:?}), {:?} directly",
                p.worst,
                d.worst
            );
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn busy_threshold(c: &mut Client) {
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "busy-reply-threshold", "100"]),
        Value::Simple("OK".into())
    );
}

/// Waits until Redis answers `-BUSY` (a script has run past the
/// threshold), asking on `c`.
fn wait_busy(c: &mut Client) {
    loop {
        let r = c.raw(&["PING"]);
        if r.starts_with(b"-BUSY") {
            return;
        }
        assert_eq!(r, b"+PONG\r\n");
    }
}

fn killer(port: u16) -> Client {
    let c = Client::connect(port);
    c.set_read_timeout(Some(Duration::from_secs(5)));
    c
}

#[test]
fn script_kill_reaches_a_script_that_loops() {
    compare(
        None,
        &busy_threshold,
        &|port, victim| {
            let mut offender = Client::connect(port);
            offender.send(&["EVAL", "while true do end", "0"]);
            let mut k = killer(port);
            wait_busy(&mut k);
            victim.wait_busy();
            let killed = text(&k.raw(&["SCRIPT", "KILL"]));
            let script = text(&offender.read_raw());
            let after = text(&offender.raw(&["GET", "vk"]));
            vec![killed, script, after]
        },
        Duration::from_millis(500),
    );
}

#[test]
fn function_kill_reaches_a_function_that_loops() {
    let setup = |c: &mut Client| {
        busy_threshold(c);
        let lib =
            "#!lua name=spinlib\nredis.register_function('spin', function() while true do end end)";
        assert_eq!(
            c.cmd(&["FUNCTION", "LOAD", lib]),
            Value::Bulk(b"spinlib".to_vec())
        );
    };
    compare(
        None,
        &setup,
        &|port, victim| {
            let mut offender = Client::connect(port);
            offender.send(&["FCALL", "spin", "0"]);
            let mut k = killer(port);
            wait_busy(&mut k);
            victim.wait_busy();
            let killed = text(&k.raw(&["FUNCTION", "KILL"]));
            let function = text(&offender.read_raw());
            vec![killed, function]
        },
        Duration::from_millis(500),
    );
}

#[test]
fn shutdown_nosave_reaches_redis_while_a_script_loops() {
    for mode in MODES {
        for through_proxy in [false, true] {
            let redis = Redis::start();
            busy_threshold(&mut redis.client());
            let proxy = through_proxy.then(|| Proxy::start(redis.port, mode));
            let port = proxy.as_ref().map_or(redis.port, |p| p.port);
            let mut offender = Client::connect(port);
            offender.send(&["EVAL", "while true do end", "0"]);
            let mut k = killer(port);
            wait_busy(&mut k);
            k.send(&["SHUTDOWN", "NOSAVE"]);
            let got = k.try_read_raw();
            assert!(
                got.is_err(),
                "SHUTDOWN NOSAVE answered {:?} (proxy: {through_proxy}, {mode:?})",
                got.map(|r| text(&r))
            );
            // Redis is gone.
            let deadline = Instant::now() + Duration::from_secs(5);
            while TcpStream::connect(("127.0.0.1", redis.port)).is_ok() {
                assert!(Instant::now() < deadline, "redis still running");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

#[test]
fn an_invalid_blocking_pop_on_a_queue_blocks_only_its_client() {
    compare(
        Some(QUEUE_CONFIG),
        &|_| {},
        &|port, victim| {
            let mut offender = Client::connect(port);
            // Redis reads the timeout as a hexadecimal 0: block for ever.
            offender.send(&["BRPOP", "q", "0x0"]);
            victim.wait_for(50);
            let mut other = Client::connect(port);
            vec![text(&other.raw(&["LLEN", "q"]))]
        },
        // Well above a loopback round trip, even on a busy machine; the
        // stall this guards against lasts as long as the pop blocks.
        Duration::from_millis(250),
    );
}

#[test]
fn an_oversized_request_disconnects_only_its_client() {
    let big = vec![b'x'; 2 * 1024 * 1024];
    let set = Client::encode(&[b"SET", b"big", &big]);
    let setup = |c: &mut Client| {
        assert_eq!(
            c.cmd(&["CONFIG", "SET", "proto-max-bulk-len", "1mb"]),
            Value::Simple("OK".into())
        );
    };
    for mode in MODES {
        for through_proxy in [false, true] {
            let redis = Redis::start();
            setup(&mut redis.client());
            redis.client().cmd(&["SET", "vk", "v"]);
            let proxy = through_proxy.then(|| Proxy::start(redis.port, mode));
            let port = proxy.as_ref().map_or(redis.port, |p| p.port);
            // Clients with pipelines in flight while the offender sends.
            let stop = Arc::new(AtomicBool::new(false));
            let victims: Vec<_> = (0..4)
                .map(|_| {
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        let mut c = Client::connect(port);
                        let mut bad = BTreeSet::new();
                        let mut batch = Vec::new();
                        for _ in 0..50 {
                            batch.extend_from_slice(&Client::encode(&[b"GET", b"vk"]));
                        }
                        while !stop.load(Ordering::Acquire) {
                            c.send_raw(&batch);
                            for _ in 0..50 {
                                let r = c.read_raw();
                                if r != b"$1\r\nv\r\n" {
                                    bad.insert(text(&r));
                                }
                            }
                        }
                        bad
                    })
                })
                .collect();
            for _ in 0..5 {
                let mut offender = TcpStream::connect(("127.0.0.1", port)).unwrap();
                use std::io::Write;
                let _ = offender.write_all(&set);
                let got = read_to_close(&mut offender);
                assert!(
                    got.is_empty() || got == b"-ERR Protocol error: invalid bulk length\r\n",
                    "offender got {:?} (proxy: {through_proxy})",
                    text(&got)
                );
            }
            stop.store(true, Ordering::Release);
            for v in victims {
                let bad = v.join().unwrap();
                assert!(
                    bad.is_empty(),
                    "other clients got {bad:?} (proxy: {through_proxy}, {mode:?})"
                );
            }
        }
    }
}

/// Sends `setup` (one reply each), then `pipeline` in one write, to Redis
/// directly and through the proxy, and compares every reply.
fn same_replies(config: &str, prepare: &[&[&str]], setup: &[&[&str]], pipeline: &[&[&str]]) {
    for mode in MODES {
        let direct = Redis::start();
        let upstream = Redis::start();
        let proxy = Proxy::start_with_config(upstream.port, config, mode);
        let mut got = Vec::new();
        for port in [direct.port, proxy.port] {
            let mut p = Client::connect(port);
            for cmd in prepare {
                p.cmd(cmd);
            }
            let mut c = Client::connect(port);
            let mut replies = Vec::new();
            for cmd in setup {
                let r = c.raw(cmd);
                replies.push(hello_neutral(cmd, r));
            }
            let mut bytes = Vec::new();
            for cmd in pipeline {
                let a: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
                bytes.extend_from_slice(&Client::encode(&a));
            }
            c.send_raw(&bytes);
            let mut skip = 0;
            for cmd in pipeline {
                if cmd.len() == 3 && cmd[..2] == ["CLIENT", "REPLY"] && cmd[2] == "SKIP" {
                    // No reply for this command nor the next.
                    skip = 2;
                }
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                let r = c.read_raw();
                replies.push(hello_neutral(cmd, r));
            }
            got.push(replies);
        }
        assert_eq!(got[1], got[0], "through the proxy ({mode:?}) vs directly");
    }
}

/// A successful HELLO's reply holds the connection's id, which differs.
fn hello_neutral(cmd: &[&str], reply: Vec<u8>) -> String {
    if cmd[0] == "HELLO" && !reply.starts_with(b"-") {
        return format!("HELLO ok, {}", &text(&reply)[..2]);
    }
    text(&reply)
}

#[test]
fn a_pop_after_unsubscribe_is_answered_in_order() {
    let prepare: &[&[&str]] = &[&["RPUSH", "q", "m1", "m2"]];
    let pipeline: &[&[&str]] = &[
        &["SUBSCRIBE", "ch"],
        &["UNSUBSCRIBE", "ch"],
        &["RPOP", "q"],
        &["LLEN", "q"],
    ];
    same_replies(QUEUE_CONFIG, prepare, &[], pipeline);
    same_replies(QUEUE_CONFIG, prepare, &[&["HELLO", "3"]], pipeline);
}

#[test]
fn queue_commands_are_refused_while_subscribed_in_resp2() {
    let prepare: &[&[&str]] = &[&["RPUSH", "q", "m1", "m2"]];
    same_replies(
        QUEUE_CONFIG,
        prepare,
        &[&["SUBSCRIBE", "ch"]],
        &[
            &["RPOP", "q"],
            &["LPOP", "q", "2"],
            &["BRPOP", "q", "1"],
            &["PING"],
            &["UNSUBSCRIBE"],
            &["RPOP", "q"],
        ],
    );
    // ACK, NACK and QUEUE are the proxy's own: refused like any other.
    for mode in MODES {
        let redis = Redis::start();
        let proxy = Proxy::start_with_config(redis.port, QUEUE_CONFIG, mode);
        let mut c = proxy.client();
        c.raw(&["PSUBSCRIBE", "p*"]);
        for cmd in ["ACK", "NACK", "QUEUE"] {
            let lower = cmd.to_ascii_lowercase();
            assert_eq!(
                text(&c.raw(&[cmd, "q", "m1"])),
                format!("-ERR Can't execute '{lower}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n")
            );
        }
    }
    // In RESP3 Redis allows every command while subscribed.
    same_replies(
        QUEUE_CONFIG,
        prepare,
        &[&["HELLO", "3"], &["SUBSCRIBE", "ch"]],
        &[&["RPOP", "q"], &["UNSUBSCRIBE"], &["RPOP", "q"]],
    );
}

#[test]
fn a_failed_hello_leaves_the_protocol_alone() {
    same_replies(
        QUEUE_CONFIG,
        &[],
        &[&["HELLO", "3", "AUTH", "nobody", "wrong"]],
        &[&["RPOP", "q"], &["LPOP", "q", "2"]],
    );
    same_replies(
        QUEUE_CONFIG,
        &[],
        &[],
        &[
            &["HELLO", "3", "AUTH", "nobody", "wrong"],
            &["RPOP", "q"],
            &["HELLO", "3"],
            &["RPOP", "q"],
            &["RESET"],
            &["RPOP", "q"],
        ],
    );
}

#[test]
fn reset_ends_pub_sub_and_skipped_replies_for_good() {
    let prepare: &[&[&str]] = &[&["RPUSH", "q", "m1", "m2", "m3"]];
    let after: &[&[&str]] = &[
        &["MULTI"],
        &["RPOP", "q"],
        &["EXEC"],
        &["RPOP", "q"],
        &["LLEN", "q"],
    ];
    let with_reset = |before: &[&'static [&'static str]]| {
        let mut v: Vec<&[&str]> = before.to_vec();
        v.push(&["RESET"]);
        v.extend_from_slice(after);
        v
    };
    // One at a time and pipelined.
    same_replies(
        QUEUE_CONFIG,
        prepare,
        &[&["SUBSCRIBE", "ch"]],
        &with_reset(&[]),
    );
    same_replies(
        QUEUE_CONFIG,
        prepare,
        &[],
        &with_reset(&[&["SUBSCRIBE", "ch"]]),
    );
    same_replies(
        QUEUE_CONFIG,
        prepare,
        &[],
        &with_reset(&[&["CLIENT", "REPLY", "SKIP"], &["PING"]]),
    );
}

#[test]
fn a_write_pause_holds_writes_but_not_reads_of_others() {
    paused_write(&["SET", "k", "new"]);
    // A pop on a queue writes too (it runs as a script).
    paused_write(&["RPOP", "q"]);
}

fn paused_write(write: &[&str]) {
    for mode in MODES {
        let mut seen = Vec::new();
        for through_proxy in [false, true] {
            let redis = Redis::start();
            let proxy =
                through_proxy.then(|| Proxy::start_with_config(redis.port, QUEUE_CONFIG, mode));
            let port = proxy.as_ref().map_or(redis.port, |p| p.port);
            let mut a = Client::connect(port);
            let mut b = Client::connect(port);
            let mut c = Client::connect(port);
            a.cmd(&["SET", "k", "old"]);
            a.cmd(&["RPUSH", "q", "m1", "m2"]);
            assert_eq!(
                a.cmd(&["CLIENT", "PAUSE", "3000", "WRITE"]),
                Value::Simple("OK".into())
            );
            b.send(write);
            // B's write is held in Redis before C reads.
            let mut admin = redis.client();
            let deadline = Instant::now() + Duration::from_secs(2);
            while !matches!(admin.cmd(&["INFO", "clients"]), Value::Bulk(info)
                if text(&info).contains("blocked_clients:1"))
            {
                assert!(Instant::now() < deadline, "B's write never reached Redis");
                std::thread::sleep(Duration::from_millis(1));
            }
            let t = Instant::now();
            let during = text(&c.raw(&["GET", "k"])) + &text(&c.raw(&["LLEN", "q"]));
            let read_took = t.elapsed();
            let t = Instant::now();
            let unpause = text(&a.raw(&["CLIENT", "UNPAUSE"]));
            let unpause_took = t.elapsed();
            let b_reply = text(&b.read_raw());
            let after = text(&c.raw(&["GET", "k"])) + &text(&c.raw(&["LLEN", "q"]));
            println!(
                "proxy {through_proxy} {mode:?}: read during the pause {read_took:?}, unpause {unpause_took:?}"
            );
            assert!(
                read_took < Duration::from_millis(1000),
                "GET took {read_took:?} (proxy: {through_proxy}, {mode:?})"
            );
            seen.push(vec![during, unpause, b_reply, after]);
        }
        assert_eq!(seen[1], seen[0], "through the proxy ({mode:?}) vs directly");
    }
}

/// A `CLIENT PAUSE WRITE` made on Redis directly, as a failover makes one,
/// holds the writes sent through the proxy and nothing more: another
/// client's reads are answered at once, as directly (the proxy does not
/// know of this pause, so the writes go on shared connections), and the
/// writer's own requests still run in the order it sent them.
#[test]
fn a_pause_made_on_redis_holds_no_other_client_s_reads() {
    // Clients of the proxy's connections; logged-in clients, who share
    // their user's; clients with connections of their own.
    for (login, mode) in [(false, MODES[0]), (true, MODES[0]), (false, MODES[1])] {
        let redis = Redis::start();
        let mut admin = redis.client();
        admin.cmd(&["ACL", "SETUSER", "u", "on", ">p", "~*", "&*", "+@all"]);
        let proxy = Proxy::start(redis.port, mode);
        let (mut a, mut b) = (proxy.client(), proxy.client());
        if login {
            assert_eq!(a.raw(&["AUTH", "u", "p"]), b"+OK\r\n");
            assert_eq!(b.raw(&["AUTH", "u", "p"]), b"+OK\r\n");
        }
        a.cmd(&["SET", "k", "old"]);
        b.cmd(&["SET", "other", "x"]);
        assert_eq!(b.cmd(&["GET", "other"]), Value::bulk("x"));
        assert_eq!(
            admin.cmd(&["CLIENT", "PAUSE", "3000", "WRITE"]),
            Value::Simple("OK".into())
        );
        let paused = Instant::now();
        // A's write and its own read of it, pipelined; then, once the write
        // is held in Redis, another read of A's, sent on its own.
        let mut pipeline = Client::encode(&[b"SET", b"k", b"new"]);
        pipeline.extend(Client::encode(&[b"GET", b"k"]));
        a.send_raw(&pipeline);
        wait_until("A's write held in Redis", || {
            matches!(admin.cmd(&["INFO", "clients"]), Value::Bulk(info)
                if text(&info).contains("blocked_clients:1"))
        });
        a.send(&["GET", "k"]);
        let t = Instant::now();
        let b_read = (b.cmd(&["GET", "other"]), b.cmd(&["GET", "k"]));
        let read_took = t.elapsed();
        println!("login {login}, {mode:?}: B's reads during the pause took {read_took:?}");
        assert!(
            read_took < Duration::from_millis(500),
            "B's reads took {read_took:?} behind A's held write (login {login}, {mode:?})"
        );
        assert_eq!(b_read, (Value::bulk("x"), Value::bulk("old")));
        assert_eq!(a.read_raw(), b"+OK\r\n");
        let write_took = paused.elapsed();
        assert!(
            write_took > Duration::from_millis(2500),
            "A's write answered after {write_took:?}, within the pause"
        );
        assert_eq!(a.read_value(), Value::bulk("new"));
        assert_eq!(a.read_value(), Value::bulk("new"));
    }
}

#[test]
fn pops_after_script_flush_keep_their_place_in_a_pipeline() {
    let prepare: &[&[&str]] = &[&["RPUSH", "q", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8"]];
    let pipeline: &[&[&str]] = &[
        &["RPOP", "q"],
        &["LLEN", "q"],
        &["RPOP", "q"],
        &["LLEN", "q"],
    ];
    // Once to load the scripts, then flushed under the proxy's feet.
    same_replies(
        QUEUE_CONFIG,
        prepare,
        &[&["RPOP", "q"], &["SCRIPT", "FLUSH"]],
        pipeline,
    );
    same_replies(
        QUEUE_CONFIG,
        prepare,
        &[&["RPOP", "q"]],
        &[
            &["SCRIPT", "FLUSH"],
            &["RPOP", "q"],
            &["LLEN", "q"],
            &["RPOP", "q"],
            &["LLEN", "q"],
        ],
    );
}

/// The upstream connection that runs `c`'s next request (an `ECHO`), by
/// its address as Redis's `MONITOR` shows it. (`CLIENT LIST` through the
/// proxy lists the proxy's clients, not its upstream connections.)
fn upstream_id(redis: &Redis, c: &mut Client) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let token = format!(
        "which-connection-{}",
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let mut monitor = redis.client();
    assert_eq!(monitor.cmd(&["MONITOR"]), Value::Simple("OK".into()));
    assert_eq!(c.cmd(&["ECHO", &token]), Value::bulk(&token));
    loop {
        let Value::Simple(line) = monitor.read_value() else {
            panic!("MONITOR");
        };
        if line.contains(&token) {
            let at = line.find('[').expect("MONITOR line") + 1;
            let end = at + line[at..].find(']').expect("MONITOR line");
            return line[at..end].to_string();
        }
    }
}

#[test]
fn a_client_pulling_big_replies_leaves_the_shared_connection() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port, &[]);
    let mut puller = proxy.client();
    let mut other = proxy.client();
    let big = vec![b'x'; 2 * 1024 * 1024];
    puller.cmd_bin(&[b"SET", b"big", &big]);
    let shared = upstream_id(&redis, &mut puller);
    assert_eq!(
        upstream_id(&redis, &mut other),
        shared,
        "one shared connection"
    );
    let Value::Bulk(got) = puller.cmd(&["GET", "big"]) else {
        panic!("GET big");
    };
    assert_eq!(got.len(), big.len());
    // Its next requests, which may well pull more, run on a connection of
    // its own; the other client's stay shared.
    assert_ne!(upstream_id(&redis, &mut puller), shared);
    assert_eq!(puller.cmd(&["STRLEN", "big"]), Value::Int(big.len() as i64));
    assert_eq!(upstream_id(&redis, &mut other), shared);
}

/// `SYNC` and `PSYNC` through the proxy: a replica pointed at the proxy
/// gets Redis's RDB payload and then its replication stream as Redis sends
/// them (no reply pairs with a request there), and the proxy's other
/// clients are served as before. Before, the proxy read the RDB payload as
/// a RESP reply, which it is not, and the replica never got it.
#[test]
fn a_replica_syncs_through_the_proxy() {
    for mode in MODES {
        let r = Redis::start();
        let proxy = Proxy::start(r.port, mode);
        let mut c = proxy.client();
        c.cmd(&["SET", "before", "1"]);
        let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &proxy.port.to_string()]);
        let mut rc = replica.client();
        wait_until("the replica has the RDB's key", || {
            rc.cmd(&["GET", "before"]) == Value::bulk("1")
        });
        c.cmd(&["SET", "after", "2"]);
        wait_until("the replica has the stream's key", || {
            rc.cmd(&["GET", "after"]) == Value::bulk("2")
        });
        let info = bulk_text(c.cmd(&["INFO", "replication"]));
        assert!(info.contains("connected_slaves:1"), "{mode:?}: {info}");
        assert!(info.contains("state=online"), "{mode:?}: {info}");
        assert_eq!(c.cmd(&["PING"]), Value::Simple("PONG".into()));
        // The replica's link goes when its proxy connection does.
        drop(proxy);
        wait_until("the replica notices", || {
            bulk_text(rc.cmd(&["INFO", "replication"])).contains("master_link_status:down")
        });
    }
}

fn bulk_text(v: Value) -> String {
    match v {
        Value::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
        other => panic!("not a bulk string: {other:?}"),
    }
}
