//! Robustness: malformed input, slow or greedy clients, many connections,
//! an upstream that goes away, and shutdown. Where Redis defines the
//! behaviour, the proxy's bytes are compared with Redis's.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::*;

fn send_and_collect(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // The peer may close before reading everything: that is its right.
    let _ = s.write_all(bytes);
    read_to_close(&mut s)
}

#[test]
fn malformed_requests_get_redis_errors_and_a_close() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port, &[]);
    let mut bystander = proxy.client();
    let mut nested = Vec::new();
    for _ in 0..100_000 {
        nested.extend_from_slice(b"*1\r\n");
    }
    let long_inline = vec![b'a'; 70 * 1024];
    let cases: Vec<Vec<u8>> = vec![
        b"*abc\r\n".to_vec(),
        b"*1\r\n!3\r\nfoo\r\n".to_vec(),
        b"*1\r\n$-5\r\n".to_vec(),
        b"*1\r\n$600000000\r\n".to_vec(),
        b"*1\r\n$abc\r\n".to_vec(),
        nested,
        b"SET a \"unbalanced\r\n".to_vec(),
        b"SET a 'x'y\r\n".to_vec(),
        long_inline,
        b"PING\r\n*2\r\n$3\r\nGET\r\n:1\r\n".to_vec(),
        b"*3000000000\r\n".to_vec(),
    ];
    for case in &cases {
        let want = send_and_collect(redis.port, case);
        let got = send_and_collect(proxy.port, case);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "for {:?}",
            String::from_utf8_lossy(&case[..case.len().min(40)])
        );
        assert!(want.starts_with(b"-ERR Protocol error") || want.starts_with(b"+PONG"));
        assert_eq!(bystander.cmd(&["PING"]), Value::Simple("PONG".into()));
    }
}

#[test]
fn a_stalled_half_frame_blocks_nobody() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port, &[]);
    let mut staller = TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
    staller
        .write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100\r\nonly part")
        .unwrap();
    let mut other = proxy.client();
    let started = Instant::now();
    for i in 0..100 {
        assert_eq!(
            other.cmd(&["SET", "o", &i.to_string()]),
            Value::Simple("OK".into())
        );
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    // The stalled frame completes later and runs then.
    staller.write_all(&[b'x'; 91]).unwrap();
    staller.write_all(b"\r\n").unwrap();
    let mut buf = [0u8; 5];
    staller.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"+OK\r\n");
    assert_eq!(other.cmd(&["STRLEN", "k"]), Value::Int(100));
}

#[test]
fn a_client_that_never_reads_is_cut_off_and_memory_stays_bounded() {
    let redis = Redis::start();
    let metrics = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics}");
    let proxy = Proxy::start_with_config(
        redis.port,
        "[limits]\nclient_output_buffer_limit = 8388608\n",
        &["--metrics", &metrics_addr],
    );
    let mut setup = proxy.client();
    let big = vec![b'x'; 1024 * 1024];
    assert_eq!(
        setup.cmd_bin(&[b"SET", b"big", &big]),
        Value::Simple("OK".into())
    );
    let mut greedy = TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
    greedy
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let get = Client::encode(&[b"GET", b"big"]);
    let mut batch = Vec::new();
    for _ in 0..100 {
        batch.extend_from_slice(&get);
    }
    // 500 MB of replies requested, none read. The proxy stops reading
    // requests once enough are in flight, so writing may stall: stop
    // writing then.
    let mut peak = 0;
    for _ in 0..50 {
        if greedy.write_all(&batch).is_err() {
            break;
        }
        peak = peak.max(rss_kb(proxy.pid()));
    }
    // The proxy must cut the client off while it still reads nothing: wait
    // for its session to end, however long a busy machine takes.
    let deadline = Instant::now() + Duration::from_secs(120);
    while connections(metrics) != 1 {
        peak = peak.max(rss_kb(proxy.pid()));
        assert!(
            Instant::now() < deadline,
            "the greedy client is still served"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("proxy RSS with a client that never reads: {peak} kB at most");
    assert!(peak < 200 * 1024, "RSS {peak} kB");
    let total = read_to_close(&mut greedy).len();
    assert!(total < 100 * 1024 * 1024, "read {total} bytes");
    assert_eq!(setup.cmd(&["PING"]), Value::Simple("PONG".into()));
}

/// The proxy's `ackproxy_connections_open` gauge, from its metrics endpoint.
fn connections(metrics: u16) -> i64 {
    metric(metrics, "ackproxy_connections_open") as i64
}

#[test]
fn a_client_that_reads_may_have_more_than_its_output_limit_in_flight() {
    // Redis has no such limit for normal clients; the proxy's counts only
    // what the client has not read yet.
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port, &[]);
    let mut c = proxy.client();
    // 300 MB asked for, past the default limit of 256 MB.
    let big = vec![b'x'; 10 * 1024 * 1024];
    assert_eq!(
        c.cmd_bin(&[b"SET", b"big", &big]),
        Value::Simple("OK".into())
    );
    let mut batch = Vec::new();
    for _ in 0..30 {
        batch.extend_from_slice(&Client::encode(&[b"GET", b"big"]));
    }
    c.send_raw(&batch);
    for i in 0..30 {
        let r = c.try_read_raw();
        assert!(
            r.as_ref().is_ok_and(|r| r.len() == big.len() + 13),
            "reply {i}: {:?}",
            r.map(|r| r.len())
        );
    }
    assert_eq!(c.cmd(&["PING"]), Value::Simple("PONG".into()));
}

#[test]
fn more_than_a_million_arguments_like_redis() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port, &[]);
    let n = 1_048_577usize;
    let mut req = format!("*{}\r\n$3\r\nDEL\r\n", n + 1).into_bytes();
    for _ in 0..n {
        req.extend_from_slice(b"$1\r\nk\r\n");
    }
    for port in [redis.port, proxy.port] {
        let mut c = Client::connect(port);
        c.send_raw(&req);
        assert_eq!(c.read_raw(), b":0\r\n", "port {port}");
    }
}

#[test]
fn ten_thousand_connections() {
    let redis = Redis::start();
    // One more than the 10,000 held, for the client that checks afterwards.
    let proxy = Proxy::start_with_config(redis.port, "[limits]\nmaxclients = 10001\n", &[]);
    let n = 10_000;
    let conns = open_pinged(proxy.port, n, 1000, Some(Duration::from_secs(20)));
    println!(
        "proxy RSS with {} idle clients: {} kB",
        conns.len(),
        rss_kb(proxy.pid())
    );
    let mut normal = proxy.client();
    assert_eq!(normal.cmd(&["SET", "a", "b"]), Value::Simple("OK".into()));
}

#[test]
fn maxclients_is_enforced_like_redis() {
    let (_redis, proxy) = Proxy::with_redis("[limits]\nmaxclients = 5\n");
    // The start-up probe's connection counts until the proxy has seen it
    // close; connecting five more at once may race with that.
    std::thread::sleep(Duration::from_millis(200));
    let mut held: Vec<Client> = (0..5).map(|_| proxy.client()).collect();
    for c in held.iter_mut() {
        assert_eq!(c.cmd(&["PING"]), Value::Simple("PONG".into()));
    }
    let mut sixth = TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
    assert_eq!(
        read_to_close(&mut sixth),
        b"-ERR max number of clients reached\r\n"
    );
    drop(held.pop());
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(proxy.client().cmd(&["PING"]), Value::Simple("PONG".into()));
}

#[test]
fn upstream_down_errors_promptly_and_recovers() {
    let mut redis = Redis::start();
    let port = redis.port;
    let dir = std::env::temp_dir().join(format!("ackproxy-test-restart-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let proxy = Proxy::start(port, &[]);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["SET", "k", "v"]), Value::Simple("OK".into()));
    redis.kill();
    let started = Instant::now();
    let reply = c.cmd(&["GET", "k"]);
    assert!(
        matches!(&reply, Value::Error(e) if e.starts_with("ERR upstream")),
        "{reply:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Pipelined requests all get an error each, in order.
    c.send_raw(b"PING\r\nPING\r\nPING\r\n");
    for _ in 0..3 {
        assert!(matches!(c.read_value(), Value::Error(_)));
    }
    let _restarted = Redis::start_on(port, dir, &[]);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match c.cmd(&["SET", "k", "again"]) {
            Value::Simple(s) if s == "OK" => break,
            other => assert!(Instant::now() < deadline, "not recovered: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(c.cmd(&["GET", "k"]), Value::bulk("again"));
}

#[test]
fn sigterm_finishes_in_flight_replies_then_exits() {
    let redis = Redis::start();
    let mut proxy = Proxy::start(redis.port, &[]);
    let mut c = proxy.client();
    c.send(&["BLPOP", "never", "1"]);
    std::thread::sleep(Duration::from_millis(100));
    let mut killer = redis.client();
    let pid = proxy.pid();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        killer.cmd(&["PING"]);
    });
    // The blocked command's reply still arrives.
    assert_eq!(c.read_value(), Value::Nil);
    t.join().unwrap();
    assert!(proxy.terminate(), "ackproxy did not exit cleanly");
}

#[test]
fn replies_of_the_proxys_own_wait_for_those_due_from_redis() {
    let redis = Redis::start();
    for mode in [&[][..], &["--dedicated-per-client"][..]] {
        let proxy = Proxy::start(redis.port, mode);
        // A blocking command pins the client; what follows it — QUIT's
        // +OK, a protocol error — must come after its reply, as in Redis.
        for (head, tail) in [
            (&b"BLPOP nolist 0.2\r\n"[..], &b"QUIT\r\n"[..]),
            (b"BLPOP nolist 0.2\r\n", b"*abc\r\n"),
            (b"BLPOP nolist 0.2\r\n", b"MULTI\r\nQUIT\r\n"),
            // Subscribed: replies no longer pair with requests.
            (b"SUBSCRIBE ch1 ch2\r\nPING\r\n", b"QUIT\r\n"),
            (b"SUBSCRIBE ch\r\nPING\r\n", b"*1\r\n$-5\r\n"),
        ] {
            let mut bytes = head.to_vec();
            bytes.extend_from_slice(tail);
            let want = send_and_collect(redis.port, &bytes);
            let got = send_and_collect(proxy.port, &bytes);
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want),
                "mode {mode:?}, tail {:?}",
                String::from_utf8_lossy(tail)
            );
        }
    }
}
