//! Client authentication through the proxy follows Redis's: the same
//! replies, byte for byte, for clients that never logged in, gave a wrong
//! password, are restricted ACL users or full ones, after RESET and after a
//! failed AUTH; queue operations only for users Redis would let pop the
//! list; Redis's limits on requests before login; CONFIG SET requirepass
//! and SIGHUP keep the proxy's own connections working.

mod common;

use std::time::{Duration, Instant};

use common::*;

const QUEUE_CONFIG: &str = "[[queue]]\npattern = \"jobs\"\nlease_ms = 600000\n";

fn secured_redis() -> Redis {
    let r = Redis::start_with(&["--requirepass", "secret"]);
    let mut admin = r.client();
    assert_eq!(admin.cmd(&["AUTH", "secret"]), Value::Simple("OK".into()));
    let setuser = [
        "ACL",
        "SETUSER",
        "restricted",
        "on",
        ">rpass",
        "~allowed:*",
        "+get",
        "+set",
        "+rpop",
        "+lpush",
    ];
    assert_eq!(admin.cmd(&setuser), Value::Simple("OK".into()));
    r
}

fn admin(r: &Redis) -> Client {
    let mut c = r.client();
    assert_eq!(c.cmd(&["AUTH", "secret"]), Value::Simple("OK".into()));
    c
}

fn proxy(r: &Redis, extra: &[&str]) -> Proxy {
    let mut args = vec!["--upstream-password", "secret"];
    args.extend_from_slice(extra);
    Proxy::start_with_config(r.port, QUEUE_CONFIG, &args)
}

/// How a connection starts before the common commands.
const SCENARIOS: &[(&str, &[&[&str]])] = &[
    ("unauthenticated", &[]),
    (
        "wrong password",
        &[
            &["AUTH", "wrong"],
            &["AUTH", "restricted", "wrong"],
            &["HELLO", "3", "AUTH", "restricted", "wrong"],
            &["HELLO", "3"],
        ],
    ),
    ("restricted user", &[&["AUTH", "restricted", "rpass"]]),
    ("full user", &[&["AUTH", "default", "secret"]]),
    (
        "HELLO AUTH as the restricted user",
        &[&["HELLO", "3", "AUTH", "restricted", "rpass", "SETNAME", "n"]],
    ),
    (
        "HELLO AUTH as the full user",
        &[&["HELLO", "2", "AUTH", "default", "secret"]],
    ),
    ("after RESET", &[&["AUTH", "secret"], &["RESET"]]),
    (
        "after a failed AUTH",
        &[&["AUTH", "restricted", "rpass"], &["AUTH", "secret-not"]],
    ),
    (
        "after a failed AUTH, unauthenticated",
        &[
            &["AUTH", "secret-not"],
            &["HELLO", "2", "AUTH", "default", "x"],
        ],
    ),
];

/// Run the same way in every scenario, directly and through the proxy.
const COMMANDS: &[&[&str]] = &[
    &["PING"],
    &["SET", "allowed:k", "v"],
    &["GET", "allowed:k"],
    &["SET", "k", "v"],
    &["GET", "k"],
    &["CONFIG", "GET", "requirepass"],
    &["ACL", "WHOAMI"],
    &["LPUSH", "allowed:l", "a", "b"],
    &["RPOP", "allowed:l"],
    &["RPOP", "jobs"],
    &["LPOP", "jobs"],
    &["BRPOP", "jobs", "0.01"],
    &["FOO", "bar"],
    &["GET"],
    &["CONFIG", "NOPE"],
    &["CONFIG"],
    &["DEBUG", "SLEEP", "0"],
    &["MULTI"],
    &["SET", "allowed:m", "1"],
    &["RPOP", "jobs"],
    &["EXEC"],
    &["AUTH"],
    &["ECHO", "a", "b"],
    &["SELECT", "1"],
    &["GET", "allowed:k"],
    &["PING"],
];

/// HELLO's reply holds the connection's id, which differs.
fn mask_client_id(reply: &[u8]) -> Vec<u8> {
    let key = b"$2\r\nid\r\n:";
    let Some(at) = reply.windows(key.len()).position(|w| w == key) else {
        return reply.to_vec();
    };
    let start = at + key.len();
    let end = start + reply[start..].iter().position(|&b| b == b'\r').unwrap();
    [&reply[..start], b"N".as_slice(), &reply[end..]].concat()
}

fn run_matrix(extra: &[&str]) {
    let direct = secured_redis();
    let behind = secured_redis();
    let p = proxy(&behind, extra);
    for (name, preamble) in SCENARIOS {
        let mut a = direct.client();
        let mut b = p.client();
        for cmd in preamble.iter().chain(COMMANDS.iter()) {
            let ra = mask_client_id(&a.raw(cmd));
            let rb = mask_client_id(&b.raw(cmd));
            assert_eq!(
                String::from_utf8_lossy(&ra),
                String::from_utf8_lossy(&rb),
                "{name}: {cmd:?} ({extra:?})"
            );
        }
        // Both are left as they were: clean up for the next scenario.
        admin(&direct).cmd(&["FLUSHALL"]);
        admin(&behind).cmd(&["FLUSHALL"]);
    }
}

#[test]
fn matrix_multiplexed() {
    run_matrix(&[]);
}

#[test]
fn matrix_dedicated_per_client() {
    run_matrix(&["--dedicated-per-client"]);
}

/// A user with the rights to pop `jobs` directly.
fn add_worker(r: &Redis) {
    let setuser = [
        "ACL", "SETUSER", "worker", "on", ">wpass", "~jobs", "+rpop", "+lpop", "+lrange", "+lpush",
    ];
    assert_eq!(admin(r).cmd(&setuser), Value::Simple("OK".into()));
}

#[test]
fn queue_operations_follow_the_users_rights() {
    let r = secured_redis();
    add_worker(&r);
    let p = proxy(&r, &[]);
    let mut adm = admin(&r);
    adm.cmd(&["LPUSH", "jobs", "m1", "m2"]);

    // What Redis says to the restricted user for the pop itself.
    let mut direct = r.client();
    direct.cmd(&["AUTH", "restricted", "rpass"]);
    let refused_pop = direct.raw(&["RPOP", "jobs"]);
    assert!(refused_pop.starts_with(b"-NOPERM"), "{refused_pop:?}");
    let refused_bpop = direct.raw(&["BRPOP", "jobs", "0.1"]);
    assert!(refused_bpop.starts_with(b"-NOPERM"), "{refused_bpop:?}");

    let mut c = p.client();
    assert_eq!(c.raw(&["AUTH", "restricted", "rpass"]), b"+OK\r\n");
    assert_eq!(c.raw(&["RPOP", "jobs"]), refused_pop);
    assert_eq!(c.raw(&["BRPOP", "jobs", "0.1"]), refused_bpop);
    assert_eq!(
        c.raw(&["QUEUE", "LEASES", "jobs"]),
        b"-NOPERM this user has no permissions to run the 'queue|leases' command\r\n"
    );
    assert_eq!(
        c.raw(&["QUEUE", "INFO", "jobs"]),
        b"-NOPERM this user has no permissions to run the 'queue|info' command\r\n"
    );
    assert_eq!(
        c.raw(&["ACK", "jobs", "7"]),
        b"-NOPERM this user has no permissions to run the 'ack' command\r\n"
    );
    assert_eq!(
        c.raw(&["NACK", "jobs", "7"]),
        b"-NOPERM this user has no permissions to run the 'nack' command\r\n"
    );
    // Refused inside MULTI, the transaction fails as in Redis.
    let mut expected = Vec::new();
    for cmd in [&["MULTI"][..], &["RPOP", "jobs"], &["EXEC"]] {
        expected.push(direct.raw(cmd));
    }
    for (cmd, want) in [&["MULTI"][..], &["RPOP", "jobs"], &["EXEC"]]
        .iter()
        .zip(&expected)
    {
        assert_eq!(&c.raw(cmd), want, "{cmd:?}");
    }
    assert_eq!(adm.cmd(&["LLEN", "jobs"]), Value::Int(2));

    // RESET and a failed AUTH: no rights borrowed from the proxy.
    assert_eq!(c.raw(&["RESET"]), b"+RESET\r\n");
    assert_eq!(
        c.raw(&["RPOP", "jobs"]),
        b"-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(
        c.raw(&["QUEUE", "LEASES", "jobs"]),
        b"-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(
        c.raw(&["ACK", "jobs", "1"]),
        b"-NOAUTH Authentication required.\r\n"
    );
    assert!(c.raw(&["AUTH", "nope"]).starts_with(b"-WRONGPASS"));
    assert_eq!(
        c.raw(&["RPOP", "jobs"]),
        b"-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(adm.cmd(&["LLEN", "jobs"]), Value::Int(2));

    // A user Redis lets pop the list gets the queue's semantics.
    let mut w = p.client();
    assert_eq!(w.raw(&["AUTH", "worker", "wpass"]), b"+OK\r\n");
    assert_eq!(w.cmd(&["RPOP", "jobs"]), Value::bulk("m1"));
    assert!(w.raw(&["AUTH", "worker", "bad"]).starts_with(b"-WRONGPASS"));
    let Value::Array(leases) = w.cmd(&["QUEUE", "LEASES", "jobs"]) else {
        panic!("QUEUE LEASES");
    };
    assert_eq!(leases.len(), 1);
    assert_eq!(w.cmd(&["ACK", "jobs", "m1"]), Value::Int(1));

    // An ACL change reaches queue operations within the cache's second.
    adm.cmd(&["ACL", "SETUSER", "worker", "-rpop"]);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let reply = w.raw(&["RPOP", "jobs"]);
        if reply.starts_with(b"-NOPERM") {
            assert_eq!(
                reply,
                b"-NOPERM this user has no permissions to run the 'rpop' command\r\n"
            );
            break;
        }
        assert!(Instant::now() < deadline, "ACL change never seen");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn unauthenticated_request_limits() {
    let r = secured_redis();
    let p = proxy(&r, &[]);
    let mut big_bulk = b"*2\r\n$4\r\nECHO\r\n$16385\r\n".to_vec();
    big_bulk.extend_from_slice(&[b'x'; 16385]);
    big_bulk.extend_from_slice(b"\r\n");
    let mut eleven = b"*11\r\n".to_vec();
    for _ in 0..11 {
        eleven.extend_from_slice(b"$1\r\nk\r\n");
    }
    let cases: Vec<Vec<u8>> = vec![
        eleven.clone(),
        [b"GET k\r\n".as_slice(), &eleven].concat(),
        big_bulk.clone(),
        b"*2\r\n$4\r\nECHO\r\n$16384\r\n".to_vec(),
        b"*10\r\n$4\r\nPING\r\n".to_vec(),
    ];
    for case in &cases {
        let mut a = r.client();
        let mut b = p.client();
        a.set_read_timeout(Some(Duration::from_millis(500)));
        b.set_read_timeout(Some(Duration::from_millis(500)));
        a.send_raw(case);
        b.send_raw(case);
        let mut ra = Vec::new();
        let mut rb = Vec::new();
        while let Ok(r) = a.try_read_raw() {
            ra.extend(r);
        }
        while let Ok(r) = b.try_read_raw() {
            rb.extend(r);
        }
        assert_eq!(
            String::from_utf8_lossy(&ra),
            String::from_utf8_lossy(&rb),
            "{:?}",
            String::from_utf8_lossy(&case[..case.len().min(40)])
        );
    }
    // After logging in, in the same pipeline, the limits are gone.
    let mut c = p.client();
    let mut pipeline = b"*2\r\n$4\r\nAUTH\r\n$6\r\nsecret\r\n".to_vec();
    pipeline.extend_from_slice(&del_ten());
    pipeline.extend_from_slice(&big_bulk);
    c.send_raw(&pipeline);
    assert_eq!(c.read_raw(), b"+OK\r\n");
    assert_eq!(c.read_raw(), b":0\r\n");
    assert_eq!(c.read_raw().len(), 16385 + 10);
}

/// Eleven arguments: a DEL of ten keys.
fn del_ten() -> Vec<u8> {
    let mut out = b"*11\r\n$3\r\nDEL\r\n".to_vec();
    for _ in 0..10 {
        out.extend_from_slice(b"$1\r\nk\r\n");
    }
    out
}

/// Ends the proxy's upstream connections, so it must open new ones.
fn kill_connections(r: &Redis, password: &str) {
    let mut c = r.client();
    c.cmd(&["AUTH", password]);
    c.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
}

/// Retries while the proxy reconnects after its connections were killed.
fn eventually(c: &mut Client, cmd: &[&str], want: Value) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = c.cmd(cmd);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{cmd:?}: {got:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn config_set_requirepass_through_the_proxy() {
    // Redis needs no login at first: clients use the shared connection.
    let r = Redis::start();
    let p = Proxy::start_with_config(r.port, QUEUE_CONFIG, &[]);
    let mut c = p.client();
    assert_eq!(c.raw(&["LPUSH", "jobs", "m1", "m2"]), b":2\r\n");
    assert_eq!(
        c.raw(&["CONFIG", "SET", "requirepass", "newpass"]),
        b"+OK\r\n"
    );
    kill_connections(&r, "newpass");
    // Connected before, the client stays logged in, until RESET, as with
    // Redis.
    eventually(&mut c, &["GET", "k"], Value::Nil);
    assert_eq!(c.raw(&["RESET"]), b"+RESET\r\n");
    assert_eq!(
        c.raw(&["GET", "k"]),
        b"-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(
        c.raw(&["RPOP", "jobs"]),
        b"-NOAUTH Authentication required.\r\n"
    );
    // New clients must log in now, and the proxy's own connections (the
    // queue's pop runs on them) use the new password.
    let mut n = p.client();
    assert_eq!(n.raw(&["PING"]), b"-NOAUTH Authentication required.\r\n");
    assert_eq!(n.raw(&["AUTH", "newpass"]), b"+OK\r\n");
    eventually(&mut n, &["RPOP", "jobs"], Value::bulk("m1"));
    assert_eq!(n.cmd(&["ACK", "jobs", "m1"]), Value::Int(1));

    // And again from an authenticated client while it requires one.
    assert_eq!(
        n.raw(&["CONFIG", "SET", "requirepass", "third"]),
        b"+OK\r\n"
    );
    kill_connections(&r, "third");
    let mut t = p.client();
    assert_eq!(t.raw(&["AUTH", "third"]), b"+OK\r\n");
    eventually(&mut t, &["RPOP", "jobs"], Value::bulk("m2"));
}

#[test]
fn sighup_rereads_the_proxys_credentials() {
    let r = Redis::start_with(&["--requirepass", "old"]);
    let path = std::env::temp_dir().join(format!("ackproxy-sec-{}.toml", free_port()));
    let write = |pass: &str| {
        let text = format!("upstream_password = \"{pass}\"\n{QUEUE_CONFIG}");
        std::fs::write(&path, text).unwrap();
    };
    write("old");
    let p = Proxy::start(r.port, &["--config", path.to_str().unwrap()]);
    let mut adm = r.client();
    adm.cmd(&["AUTH", "old"]);
    adm.cmd(&["LPUSH", "jobs", "m1"]);
    // Changed behind the proxy's back, then told to it.
    adm.cmd(&["CONFIG", "SET", "requirepass", "new"]);
    write("new");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &p.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    std::thread::sleep(Duration::from_millis(300));
    kill_connections(&r, "new");
    let mut c = p.client();
    assert_eq!(c.raw(&["AUTH", "new"]), b"+OK\r\n");
    eventually(&mut c, &["RPOP", "jobs"], Value::bulk("m1"));
    let _ = std::fs::remove_file(&path);
}

/// Calls of `ACL DRYRUN` Redis has served.
fn dryruns(admin: &mut Client) -> i64 {
    let Value::Bulk(info) = admin.cmd(&["INFO", "commandstats"]) else {
        panic!("INFO");
    };
    let info = String::from_utf8(info).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_acl|dryrun:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

#[test]
fn no_checks_when_redis_needs_no_login() {
    let r = Redis::start();
    let p = Proxy::start_with_config(r.port, QUEUE_CONFIG, &[]);
    let mut c = p.client();
    c.cmd(&["LPUSH", "jobs", "m1"]);
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk("m1"));
    assert_eq!(c.cmd(&["ACK", "jobs", "m1"]), Value::Int(1));
    assert_eq!(dryruns(&mut r.client()), 0);
}

#[test]
fn dryrun_answers_are_reused_for_a_second() {
    let r = secured_redis();
    add_worker(&r);
    let p = proxy(&r, &[]);
    let mut adm = admin(&r);
    let mut w = p.client();
    assert_eq!(w.raw(&["AUTH", "worker", "wpass"]), b"+OK\r\n");
    for _ in 0..20 {
        assert_eq!(w.cmd(&["RPOP", "jobs"]), Value::Nil);
    }
    let first = dryruns(&mut adm);
    assert!((1..=2).contains(&first), "{first}");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(w.cmd(&["RPOP", "jobs"]), Value::Nil);
    assert_eq!(dryruns(&mut adm), first + 1);
}
