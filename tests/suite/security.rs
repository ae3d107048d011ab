//! Client authentication through the proxy follows Redis's: the same
//! replies, byte for byte, for clients that never logged in, gave a wrong
//! password, are restricted ACL users or full ones, after RESET and after a
//! failed AUTH; queue operations only for users Redis would let pop the
//! list; Redis's limits on requests before login; CONFIG SET requirepass
//! and SIGHUP keep the proxy's own connections working. Logged-in clients
//! share one connection per user and password, which ends (and takes its
//! clients with it) as Redis ends a user's connections. The proxy's own
//! password in front of a Redis that needs none answers as a Redis with
//! `requirepass` does.

use std::time::{Duration, Instant};

use crate::common::*;

const QUEUE_CONFIG: &str = "[[queue]]\npattern = \"jobs\"\nlease_ms = 600000\n";

const RESTRICTED: &[&str] = &[
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
    "+acl|whoami",
];

fn ok() -> Value {
    Value::Simple("OK".into())
}

fn secured_redis() -> Redis {
    let r = Redis::start_with(&["--requirepass", "secret"]);
    let mut admin = r.client();
    assert_eq!(admin.cmd(&["AUTH", "secret"]), ok());
    assert_eq!(admin.cmd(RESTRICTED), ok());
    r
}

/// A Redis that needs no login, with the same restricted user.
fn open_redis() -> Redis {
    let r = Redis::start();
    assert_eq!(r.client().cmd(RESTRICTED), ok());
    r
}

/// A connection with every right, whether Redis needs a login or not.
fn superuser(r: &Redis) -> Client {
    let mut c = r.client();
    if c.raw(&["PING"]) != b"+PONG\r\n" {
        assert_eq!(c.cmd(&["AUTH", "secret"]), ok());
    }
    c
}

/// Redis's connections of one user's shared pair (one for requests that
/// may write, one for reads).
const PAIR: usize = 2;

/// Redis's connections of one login the proxy keeps: its shared pair, and
/// those kept ready for its clients' own (`dedicated_pool`, default 2).
const LOGIN: usize = PAIR + 2;

/// Redis's connections logged in as `user`.
fn connections_of(r: &Redis, user: &str) -> usize {
    let Value::Bulk(list) = superuser(r).cmd(&["CLIENT", "LIST"]) else {
        panic!("CLIENT LIST");
    };
    let needle = format!(" user={user} ");
    String::from_utf8(list)
        .unwrap()
        .lines()
        .filter(|l| l.contains(&needle))
        .count()
}

/// Waits until Redis has `want` connections of `user` (connections the
/// proxy closes go away in Redis a little later).
fn settles(r: &Redis, user: &str, want: usize) {
    poll_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let n = connections_of(r, user);
        if n == want {
            Ok(())
        } else {
            Err(format!("{n} connections of {user}, not {want}"))
        }
    });
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

/// The proxy asking for its own password, in front of a Redis that needs
/// none.
fn guarding_proxy(r: &Redis, extra: &[&str]) -> Proxy {
    let mut args = vec!["--requirepass", "secret"];
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
    (
        "HELLO forms before logging in",
        &[
            &["HELLO"],
            &["HELLO", "3", "SETNAME", "n"],
            &["HELLO", "3", "SETNAME"],
            &["HELLO", "3", "SETNAME", "a b"],
            &["HELLO", "4", "AUTH", "default", "secret"],
            &["HELLO", "x"],
            &["HELLO", "3", "AUTH", "default", "wrong", "SETNAME", "n"],
            &["HELLO", "2", "SETNAME", "n", "AUTH", "default", "wrong"],
            &["AUTH", "a", "b", "c"],
            &["AUTH"],
        ],
    ),
    (
        "HELLO 3 AUTH as the full user",
        &[&["HELLO", "3", "AUTH", "default", "secret"]],
    ),
    (
        "from one user to another",
        &[
            &["AUTH", "default", "secret"],
            &["AUTH", "restricted", "rpass"],
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
    &["MODULE", "LIST"],
    &["MODULE", "LOAD", "/nonexistent.so"],
    &["FLUSHALL"],
    &["SET", "allowed:k", "v"],
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

/// Redis's own setting, which differs behind a proxy that asks for its
/// own password.
const REDIS_SETTING: &[&str] = &["CONFIG", "GET", "requirepass"];

/// The same requests, directly to a Redis with `requirepass` and through
/// the proxy: either to a Redis with the same `requirepass`, or (`guard`)
/// to a Redis that needs no login behind a proxy asking for that password.
fn run_matrix(extra: &[&str], guard: bool) {
    let direct = secured_redis();
    let behind = if guard { open_redis() } else { secured_redis() };
    let p = if guard {
        guarding_proxy(&behind, extra)
    } else {
        proxy(&behind, extra)
    };
    for (name, preamble) in SCENARIOS {
        let mut a = direct.client();
        let mut b = p.client();
        for cmd in preamble.iter().chain(COMMANDS.iter()) {
            if guard && *cmd == REDIS_SETTING {
                continue;
            }
            let ra = mask_client_id(&a.raw(cmd));
            let rb = mask_client_id(&b.raw(cmd));
            assert_eq!(
                String::from_utf8_lossy(&ra),
                String::from_utf8_lossy(&rb),
                "{name}: {cmd:?} ({extra:?}, guard {guard})"
            );
        }
        // Nothing ran through the proxy that Redis refused directly.
        assert_eq!(
            superuser(&direct).cmd(&["DBSIZE"]),
            superuser(&behind).cmd(&["DBSIZE"]),
            "{name}"
        );
        // Both are left as they were: clean up for the next scenario.
        superuser(&direct).cmd(&["FLUSHALL"]);
        superuser(&behind).cmd(&["FLUSHALL"]);
    }

    // Clients logged in as one user share one connection of that user,
    // which has the user's rights and no more.
    let mut clients = Vec::new();
    for i in 0..20 {
        let key = format!("allowed:{i}");
        let value = i.to_string();
        let mut a = direct.client();
        let mut b = p.client();
        let cmds: [&[&str]; 5] = [
            &["AUTH", "restricted", "rpass"],
            &["SET", &key, &value],
            &["GET", &key],
            &["GET", "k"],
            &["ACL", "WHOAMI"],
        ];
        for cmd in cmds {
            assert_eq!(a.raw(cmd), b.raw(cmd), "{cmd:?} ({extra:?})");
        }
        clients.push(b);
    }
    let own_each = extra.contains(&"--dedicated-per-client");
    settles(&behind, "restricted", if own_each { 20 } else { LOGIN });
    for (i, c) in clients.iter_mut().enumerate() {
        let key = format!("allowed:{i}");
        assert_eq!(c.cmd(&["GET", &key]), Value::bulk(&i.to_string()));
    }
}

#[test]
fn matrix_multiplexed() {
    run_matrix(&[], false);
}

#[test]
fn matrix_dedicated_per_client() {
    run_matrix(&["--dedicated-per-client"], false);
}

#[test]
fn matrix_proxy_password_multiplexed() {
    run_matrix(&[], true);
}

#[test]
fn matrix_proxy_password_dedicated_per_client() {
    run_matrix(&["--dedicated-per-client"], true);
}

/// HELLO without AUTH from a client that has logged in: Redis answers it,
/// and HELLO 3 switches the protocol (`redis-cli -3 -a pw` sends AUTH,
/// then HELLO 3). Compared with a direct Redis, byte for byte but for the
/// connection's id.
fn hello_after_login(extra: &[&str], guard: bool) {
    let direct = secured_redis();
    let behind = if guard { open_redis() } else { secured_redis() };
    let p = if guard {
        guarding_proxy(&behind, extra)
    } else {
        proxy(&behind, extra)
    };
    let logins: [&[&str]; 2] = [&["AUTH", "secret"], &["AUTH", "restricted", "rpass"]];
    for login in logins {
        let mut a = direct.client();
        let mut b = p.client();
        let cmds: [&[&str]; 12] = [
            login,
            &["HELLO"],
            &["HELLO", "2"],
            &["PING"],
            &["HELLO", "3"],
            &["PING"],
            &["SET", "allowed:k", "v"],
            &["GET", "allowed:k"],
            &["RPOP", "jobs"],
            &["HELLO"],
            &["HELLO", "2"],
            &["ACL", "WHOAMI"],
        ];
        for cmd in cmds {
            let ra = mask_client_id(&a.raw(cmd));
            let rb = mask_client_id(&b.raw(cmd));
            assert_eq!(
                String::from_utf8_lossy(&ra),
                String::from_utf8_lossy(&rb),
                "after {login:?}: {cmd:?} ({extra:?}, guard {guard})"
            );
        }
    }
}

#[test]
fn hello_after_login_multiplexed() {
    hello_after_login(&[], false);
}

#[test]
fn hello_after_login_dedicated_per_client() {
    hello_after_login(&["--dedicated-per-client"], false);
}

#[test]
fn hello_after_login_with_the_proxys_password() {
    hello_after_login(&[], true);
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

/// Queues `dl:*` share one dead-letter list; each `dt:*` queue has its own.
const DEAD_LETTER_CONFIG: &str = r#"
[[queue]]
pattern = "dl:*"
lease_ms = 600000
max_deliveries = 1
dead_letter = "dead-dl"

[[queue]]
pattern = "dt:*"
lease_ms = 600000
max_deliveries = 1
dead_letter = "dead:$queue"
"#;

/// A queue operation touches the dead-letter list on the user's behalf
/// only if the user could touch it directly: reading, redriving or purging
/// dead letters takes Redis's rights on that list, not only on the queue
/// (a user of `dl:a` read and took `dl:b`'s payloads through a shared
/// list). What the end of a lease does anyway (a NACK past the last
/// delivery) needs no rights on it.
#[test]
fn dead_letters_follow_the_users_rights() {
    let r = secured_redis();
    let mut adm = admin(&r);
    let setuser = [
        "ACL", "SETUSER", "dlw", "on", ">dpass", "~dl:a", "~dt:a", "+@list",
    ];
    assert_eq!(adm.cmd(&setuser), ok());
    let p = Proxy::start_with_config(
        r.port,
        DEAD_LETTER_CONFIG,
        &["--upstream-password", "secret"],
    );
    // Dead letters of every queue, made by a client with every right.
    let mut full = p.client();
    assert_eq!(full.cmd(&["AUTH", "secret"]), ok());
    for q in ["dl:a", "dl:b", "dt:a", "dt:b"] {
        let payload = format!("{q} secret");
        full.cmd(&["LPUSH", q, &payload]);
        assert_eq!(full.cmd(&["RPOP", q]), Value::bulk(&payload));
        assert_eq!(full.cmd(&["NACK", q, &payload]), Value::Int(1));
    }
    let lists = |adm: &mut Client| {
        ["dead-dl", "dead:dt:a", "dead:dt:b", "dl:a", "dt:a"].map(|k| adm.cmd(&["LLEN", k]))
    };
    let before = lists(&mut adm);
    assert_eq!(before[..3], [Value::Int(2), Value::Int(1), Value::Int(1)]);

    // What Redis says to this user for the dead-letter lists.
    let mut direct = r.client();
    assert_eq!(direct.cmd(&["AUTH", "dlw", "dpass"]), ok());
    let noperm =
        b"-NOPERM this user has no permissions to access one of the keys used as arguments\r\n";
    for key in ["dead-dl", "dead:dt:a"] {
        assert_eq!(direct.raw(&["LRANGE", key, "0", "0"]), noperm);
        assert_eq!(direct.raw(&["LMOVE", key, "dl:a", "LEFT", "RIGHT"]), noperm);
    }

    let mut c = p.client();
    assert_eq!(c.raw(&["AUTH", "dlw", "dpass"]), b"+OK\r\n");
    for q in ["dl:a", "dt:a"] {
        for cmd in [
            &["QUEUE", "DEAD", q][..],
            &["QUEUE", "DEAD", q, "COUNT", "5"],
            &["QUEUE", "REDRIVE", q],
            &["QUEUE", "REDRIVE", q, "COUNT", "1"],
            &["QUEUE", "PURGE", q, "DEAD"],
            &["QUEUE", "INFO", q],
            // One dead letter: the same rights as all of them.
            &["QUEUE", "REDRIVE", q, "ID", "", &format!("{q} secret")],
            &[
                "QUEUE",
                "PURGE",
                q,
                "DEAD",
                "ID",
                "",
                &format!("{q} secret"),
            ],
        ] {
            assert_eq!(c.raw(cmd), noperm, "{cmd:?}");
        }
    }
    // Nothing was read, moved or deleted: the queue has nothing to pop.
    assert_eq!(lists(&mut adm), before);
    assert_eq!(c.cmd(&["RPOP", "dl:a"]), Value::Nil);
    assert_eq!(c.cmd(&["RPOP", "dt:a"]), Value::Nil);
    // The queue's own operations need the queue alone, a NACK that makes
    // a dead letter included.
    assert_eq!(c.cmd(&["LPUSH", "dt:a", "m"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "dt:a"]), Value::bulk("m"));
    assert_eq!(c.cmd(&["NACK", "dt:a", "m"]), Value::Int(1));
    assert_eq!(adm.cmd(&["LLEN", "dead:dt:a"]), Value::Int(2));
    let Value::Array(leases) = c.cmd(&["QUEUE", "LEASES", "dt:a"]) else {
        panic!("QUEUE LEASES");
    };
    assert!(leases.is_empty());

    // Rights on its own list: the user's dead letters, and no others.
    adm.cmd(&["ACL", "SETUSER", "dlw", "~dead:dt:a"]);
    until(&mut c, &["QUEUE", "INFO", "dt:a"], |v| {
        matches!(v, Value::Array(_))
    });
    let Value::Array(dead) = c.cmd(&["QUEUE", "DEAD", "dt:a"]) else {
        panic!("QUEUE DEAD");
    };
    assert_eq!(dead.len(), 2);
    assert_eq!(
        c.cmd(&["QUEUE", "REDRIVE", "dt:a", "COUNT", "1"]),
        Value::Int(1)
    );
    assert_eq!(c.cmd(&["RPOP", "dt:a"]), Value::bulk("dt:a secret"));
    assert_eq!(c.cmd(&["QUEUE", "PURGE", "dt:a", "DEAD"]), Value::Int(1));
    assert_eq!(c.raw(&["QUEUE", "DEAD", "dt:b"]), noperm);
    assert_eq!(adm.cmd(&["LLEN", "dead:dt:b"]), Value::Int(1));
    // Purging is a write: a write-only right on the list is enough, as for
    // LTRIM or DEL directly; reading the letters is not allowed by it.
    adm.cmd(&[
        "ACL",
        "SETUSER",
        "dlw",
        "resetkeys",
        "~dl:a",
        "~dt:a",
        "%W~dead:dt:a",
    ]);
    full.cmd(&["RPUSH", "dead:dt:a", "again"]);
    until(&mut c, &["QUEUE", "DEAD", "dt:a"], is_noperm);
    assert_eq!(c.raw(&["QUEUE", "DEAD", "dt:a"]), noperm);
    assert_eq!(c.cmd(&["QUEUE", "PURGE", "dt:a", "DEAD"]), Value::Int(1));

    // Rights on the shared list: reading it whole is what Redis would
    // allow, taking or deleting it for one queue is refused for everyone.
    adm.cmd(&["ACL", "SETUSER", "dlw", "~dead-dl"]);
    let Value::Array(dead) = until(&mut c, &["QUEUE", "DEAD", "dl:a"], |v| !is_noperm(v)) else {
        panic!("QUEUE DEAD");
    };
    assert_eq!(dead.len(), 2);
    for cmd in [
        &["QUEUE", "REDRIVE", "dl:a"][..],
        &["QUEUE", "PURGE", "dl:a", "DEAD"],
        &["QUEUE", "REDRIVE", "dl:a", "ID", "", "dl:b secret"],
        &["QUEUE", "PURGE", "dl:a", "DEAD", "ID", "", "dl:b secret"],
    ] {
        let reply = c.raw(cmd);
        assert!(
            reply.starts_with(b"-ERR ackproxy: QUEUE ")
                && reply.windows(7).any(|w| w == b"shared "),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&reply)
        );
    }
    assert_eq!(adm.cmd(&["LLEN", "dead-dl"]), Value::Int(2));
    assert_eq!(adm.cmd(&["LLEN", "dl:a"]), Value::Int(0));
}

/// The first reply to `cmd` that `done` accepts, once an ACL change has
/// reached the proxy (its answers are reused for up to a second).
fn until(c: &mut Client, cmd: &[&str], done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = c.cmd(cmd);
        if done(&reply) {
            return reply;
        }
        assert!(Instant::now() < deadline, "{cmd:?}: still {reply:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn is_noperm(v: &Value) -> bool {
    matches!(v, Value::Error(e) if e.starts_with("NOPERM"))
}

#[test]
fn unauthenticated_request_limits() {
    request_limits(false);
}

#[test]
fn unauthenticated_request_limits_with_the_proxys_password() {
    request_limits(true);
}

/// Directly to a Redis with `requirepass`, and through the proxy (to the
/// same Redis, or, with `guard`, asking for the password itself).
fn request_limits(guard: bool) {
    let r = secured_redis();
    let open = open_redis();
    let p = if guard {
        guarding_proxy(&open, &[])
    } else {
        proxy(&r, &[])
    };
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
    let (r, p) = Proxy::with_redis(QUEUE_CONFIG);
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
    let (r, p) = Proxy::with_redis(QUEUE_CONFIG);
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

/// Each client's commands run as the user it logged in as last, on that
/// user's connection; a failed AUTH changes nothing; RESET logs out.
#[test]
fn logging_in_as_another_user_moves_the_client() {
    let d = secured_redis();
    let r = secured_redis();
    add_worker(&d);
    add_worker(&r);
    let p = proxy(&r, &[]);
    let mut direct = d.client();
    let mut c = p.client();
    let steps: &[&[&str]] = &[
        &["AUTH", "restricted", "rpass"],
        &["ACL", "WHOAMI"],
        &["SET", "allowed:a", "1"],
        &["GET", "k"],
        &["AUTH", "worker", "wpass"],
        &["ACL", "WHOAMI"],
        &["GET", "allowed:a"],
        &["LPUSH", "jobs", "x"],
        &["AUTH", "worker", "nope"],
        &["ACL", "WHOAMI"],
        &["HELLO", "2", "AUTH", "restricted", "rpass"],
        &["ACL", "WHOAMI"],
        &["GET", "allowed:a"],
        &["AUTH", "default", "secret"],
        &["ACL", "WHOAMI"],
        &["GET", "k"],
        &["RESET"],
        &["ACL", "WHOAMI"],
        &["GET", "allowed:a"],
    ];
    for cmd in steps {
        let want = mask_client_id(&direct.raw(cmd));
        assert_eq!(
            String::from_utf8_lossy(&want),
            String::from_utf8_lossy(&mask_client_id(&c.raw(cmd))),
            "{cmd:?}"
        );
    }
    // One pair per user, kept for the next client of that login.
    settles(&r, "restricted", LOGIN);
    settles(&r, "worker", LOGIN);
    let mut again = p.client();
    assert_eq!(again.raw(&["AUTH", "restricted", "rpass"]), b"+OK\r\n");
    assert_eq!(again.cmd(&["GET", "allowed:a"]), Value::bulk("1"));
    settles(&r, "restricted", LOGIN);
}

/// A client in a pool pipelines a push on its user's connection and a pop
/// of the queue, which runs on the proxy's: they run in order.
#[test]
fn a_pooled_clients_queue_operations_run_in_order() {
    let r = secured_redis();
    add_worker(&r);
    let more = ["ACL", "SETUSER", "worker", "+brpop", "+multi", "+exec"];
    assert_eq!(admin(&r).cmd(&more), ok());
    let p = proxy(&r, &[]);
    let mut w = p.client();
    assert_eq!(w.raw(&["AUTH", "worker", "wpass"]), b"+OK\r\n");
    let mut pipeline = Vec::new();
    for cmd in [
        &["LPUSH", "jobs", "a", "b"][..],
        &["RPOP", "jobs"],
        &["LPUSH", "jobs", "c"],
        &["LRANGE", "jobs", "0", "-1"],
    ] {
        let args: Vec<&[u8]> = cmd.iter().map(|a| a.as_bytes()).collect();
        pipeline.extend(Client::encode(&args));
    }
    w.send_raw(&pipeline);
    assert_eq!(w.read_value(), Value::Int(2));
    assert_eq!(w.read_value(), Value::bulk("a"));
    assert_eq!(w.read_value(), Value::Int(2));
    assert_eq!(w.read_value(), Value::bulks(&["c", "b"]));
    assert_eq!(w.cmd(&["ACK", "jobs", "a"]), Value::Int(1));
    // Blocking and transactions on the client's own connection, as the user.
    assert_eq!(w.cmd(&["BRPOP", "jobs", "0"]), Value::bulks(&["jobs", "b"]));
    assert_eq!(w.cmd(&["MULTI"]), Value::Simple("OK".into()));
    assert_eq!(
        w.cmd(&["LRANGE", "jobs", "0", "-1"]),
        Value::Simple("QUEUED".into())
    );
    assert_eq!(
        w.cmd(&["GET", "k"]),
        Value::Error("NOPERM this user has no permissions to run the 'get' command".into())
    );
    assert_eq!(
        w.cmd(&["EXEC"]),
        Value::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
}

/// Waits for the proxy (or Redis) to close the connection, and returns
/// what it received before.
fn closed(c: &Client) -> Vec<u8> {
    read_to_close(&mut c.stream().try_clone().unwrap())
}

/// Redis disconnects the clients of a deleted user; through the proxy, so
/// are the clients of that user's shared connection. Turned off, or with
/// its password changed, a user's clients stay, as in Redis 7.0.
#[test]
fn a_deleted_user_is_disconnected_as_by_redis() {
    let r = secured_redis();
    let mut adm = admin(&r);
    for user in ["doomed", "paused", "rotated"] {
        let setuser = ["ACL", "SETUSER", user, "on", ">pw", "~*", "+@all"];
        assert_eq!(adm.cmd(&setuser), ok());
    }
    // Clients' own connections opened when needed: one opened after a
    // password change is refused (a ready one, opened before, would
    // still be logged in, as a client's own connection is directly).
    let p = proxy(&r, &["--dedicated-pool", "0"]);
    let login = |c: &mut Client, user: &str| {
        assert_eq!(c.raw(&["AUTH", user, "pw"]), b"+OK\r\n");
        assert_eq!(c.cmd(&["SET", user, user]), ok());
    };
    let mut direct = r.client();
    login(&mut direct, "doomed");
    let mut pooled: Vec<Client> = (0..3).map(|_| p.client()).collect();
    for c in &mut pooled {
        login(c, "doomed");
    }
    let mut bystander = p.client();
    login(&mut bystander, "paused");
    let mut rotated = p.client();
    login(&mut rotated, "rotated");
    // Directly, and one pair shared by the proxy's three.
    settles(&r, "doomed", 1 + PAIR);

    assert_eq!(adm.cmd(&["ACL", "DELUSER", "doomed"]), Value::Int(1));
    assert_eq!(closed(&direct), b"");
    for c in &pooled {
        assert_eq!(closed(c), b"");
    }
    let mut fresh = p.client();
    let refused = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n";
    assert_eq!(fresh.raw(&["AUTH", "doomed", "pw"]), refused);

    // Turned off: logged-in clients go on, new logins are refused.
    assert_eq!(adm.cmd(&["ACL", "SETUSER", "paused", "off"]), ok());
    assert_eq!(bystander.cmd(&["GET", "paused"]), Value::bulk("paused"));
    assert_eq!(fresh.raw(&["AUTH", "paused", "pw"]), refused);
    assert_eq!(bystander.cmd(&["INCR", "n"]), Value::Int(1));

    // A new password: the old login goes on; the new one gets a
    // connection of its own.
    assert_eq!(
        adm.cmd(&["ACL", "SETUSER", "rotated", "resetpass", ">new"]),
        ok()
    );
    assert_eq!(rotated.cmd(&["INCR", "n"]), Value::Int(2));
    // A connection of its own needs a new login, which Redis refuses now.
    let Value::Error(e) = rotated.cmd(&["MULTI"]) else {
        panic!("MULTI with a changed password");
    };
    assert!(
        e.starts_with("ERR upstream unavailable") && e.contains("WRONGPASS"),
        "{e}"
    );
    assert_eq!(rotated.cmd(&["GET", "rotated"]), Value::bulk("rotated"));
    assert_eq!(fresh.raw(&["AUTH", "rotated", "pw"]), refused);
    assert_eq!(fresh.raw(&["AUTH", "rotated", "new"]), b"+OK\r\n");
    assert_eq!(fresh.cmd(&["INCR", "n"]), Value::Int(3));
    settles(&r, "rotated", 2 * PAIR);
}

/// When the shared connection of a user ends (killed here), its clients
/// are disconnected, as they would be if it were their own; a new login
/// gets a new connection. Other users' clients are untouched.
#[test]
fn clients_of_a_lost_user_connection_are_disconnected() {
    let r = secured_redis();
    add_worker(&r);
    assert_eq!(
        admin(&r).cmd(&["ACL", "SETUSER", "restricted", "+multi"]),
        ok()
    );
    let p = proxy(&r, &[]);
    let mut members: Vec<Client> = (0..3).map(|_| p.client()).collect();
    for c in &mut members {
        assert_eq!(c.raw(&["AUTH", "restricted", "rpass"]), b"+OK\r\n");
        assert_eq!(c.cmd(&["GET", "allowed:x"]), Value::Nil);
    }
    // One of them is in a transaction on its own connection: it goes too.
    assert_eq!(members[2].cmd(&["MULTI"]), ok());
    let mut other = p.client();
    assert_eq!(other.raw(&["AUTH", "worker", "wpass"]), b"+OK\r\n");
    assert_eq!(other.cmd(&["LPUSH", "jobs", "m"]), Value::Int(1));
    settles(&r, "restricted", LOGIN + 1);
    let mut adm = admin(&r);
    let Value::Bulk(list) = adm.cmd(&["CLIENT", "LIST"]) else {
        panic!("CLIENT LIST");
    };
    // The shared one has served GETs; the transaction's only MULTI.
    let pool_id = String::from_utf8(list)
        .unwrap()
        .lines()
        .find(|l| l.contains(" cmd=get user=restricted "))
        .and_then(|l| l.strip_prefix("id="))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .expect("the shared connection of restricted");
    assert_eq!(adm.cmd(&["CLIENT", "KILL", "ID", &pool_id]), Value::Int(1));
    for c in &members {
        assert_eq!(closed(c), b"");
    }
    assert_eq!(
        other.cmd(&["LRANGE", "jobs", "0", "-1"]),
        Value::bulks(&["m"])
    );
    let mut again = p.client();
    assert_eq!(again.raw(&["AUTH", "restricted", "rpass"]), b"+OK\r\n");
    assert_eq!(again.cmd(&["GET", "allowed:x"]), Value::Nil);
    settles(&r, "restricted", LOGIN);
}

/// At most `user_connections_max` users' connections: past it, the least
/// recently used one nobody uses is closed, and while all are in use a
/// newly logged-in client keeps a connection of its own.
#[test]
fn user_connections_are_bounded() {
    let r = secured_redis();
    add_worker(&r);
    let p = proxy(&r, &["--user-connections-max", "1"]);
    let mut first = p.client();
    assert_eq!(first.raw(&["AUTH", "restricted", "rpass"]), b"+OK\r\n");
    assert_eq!(first.cmd(&["GET", "allowed:x"]), Value::Nil);
    let mut second = p.client();
    assert_eq!(second.raw(&["AUTH", "worker", "wpass"]), b"+OK\r\n");
    assert_eq!(second.cmd(&["LPUSH", "jobs", "a"]), Value::Int(1));
    assert_eq!(
        second.cmd(&["ACL", "WHOAMI"]),
        Value::Error("NOPERM this user has no permissions to run the 'acl|whoami' command".into())
    );
    settles(&r, "restricted", LOGIN);
    // Its own connection: no pool can take it.
    settles(&r, "worker", 1);
    drop(first);
    drop(second);
    // Once the proxy has seen `first` go, the next login takes the place
    // of its user's idle connection.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut clients = Vec::new();
    loop {
        let mut c = p.client();
        assert_eq!(c.raw(&["AUTH", "worker", "wpass"]), b"+OK\r\n");
        assert_eq!(c.cmd(&["LRANGE", "jobs", "0", "-1"]), Value::bulks(&["a"]));
        clients.push(c);
        if connections_of(&r, "restricted") == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the idle connection stays");
        std::thread::sleep(Duration::from_millis(20));
    }
    settles(&r, "worker", LOGIN);
}

/// With the proxy's password, queue operations wait for it like
/// everything else, then run as for any client of a Redis without login.
#[test]
fn the_proxys_password_guards_queue_operations() {
    let r = open_redis();
    let p = guarding_proxy(&r, &[]);
    assert_eq!(r.client().cmd(&["LPUSH", "jobs", "m1"]), Value::Int(1));
    let mut c = p.client();
    for cmd in [
        &["RPOP", "jobs"][..],
        &["ACK", "jobs", "m1"],
        &["QUEUE", "INFO", "jobs"],
        &["LPUSH", "jobs", "x"],
    ] {
        assert_eq!(
            c.raw(cmd),
            b"-NOAUTH Authentication required.\r\n",
            "{cmd:?}"
        );
    }
    assert!(c.raw(&["AUTH", "wrong"]).starts_with(b"-WRONGPASS"));
    assert_eq!(
        c.raw(&["RPOP", "jobs"]),
        b"-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(c.raw(&["AUTH", "secret"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk("m1"));
    assert_eq!(c.cmd(&["ACK", "jobs", "m1"]), Value::Int(1));
    assert_eq!(c.raw(&["RESET"]), b"+RESET\r\n");
    assert_eq!(
        c.raw(&["GET", "k"]),
        b"-NOAUTH Authentication required.\r\n"
    );
    // A user of Redis's own logs in as with Redis directly.
    assert_eq!(c.raw(&["AUTH", "restricted", "rpass"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), Value::bulk("restricted"));
    assert_eq!(r.client().cmd(&["LLEN", "jobs"]), Value::Int(0));
}
