//! SIGHUP reloads the configuration file: queue rules and limits change for
//! the next pops, ACKs and connections, with the clients already connected
//! still served on the same sockets; a file that does not load changes
//! nothing and says why.

use std::net::TcpStream;
use std::path::PathBuf;

use crate::common::{
    bulk_strings, field, free_port, int, metric, read_to_close, wait_until, Client, Proxy, Redis,
    Value,
};

/// A proxy on its own redis-server, reading a configuration file the test
/// rewrites, with its log kept for inspection.
struct Setup {
    redis: Redis,
    proxy: Proxy,
    config: PathBuf,
    log: PathBuf,
}

impl Setup {
    fn start(toml: &str) -> Setup {
        Setup::start_on(Redis::start(), toml)
    }

    /// The same, on a redis-server started as the test wants.
    fn start_on(redis: Redis, toml: &str) -> Setup {
        let (proxy, config, log) = Proxy::start_reloadable(redis.port, "ackproxy-reload", toml);
        Setup {
            redis,
            proxy,
            config,
            log,
        }
    }

    fn client(&self) -> Client {
        self.proxy.client()
    }

    fn log_lines(&self, containing: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(containing))
            .count()
    }

    /// Writes `toml`, sends SIGHUP and waits until the proxy has logged
    /// the outcome (`expect` one more time than before).
    fn reload(&self, toml: &str, expect: &str) {
        let before = self.log_lines(expect);
        std::fs::write(&self.config, toml).unwrap();
        self.proxy.hangup();
        wait_until(&format!("{expect:?} in the log"), || {
            self.log_lines(expect) > before
        });
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
        let _ = std::fs::remove_file(&self.log);
    }
}

const RELOADED: &str = "configuration reloaded";
const NOT_RELOADED: &str = "configuration not reloaded from";

fn rule(pattern: &str, lease_ms: u64) -> String {
    format!("[[queue]]\npattern = \"{pattern}\"\nlease_ms = {lease_ms}\n")
}

fn lease_ms(c: &mut Client, queue: &str) -> i64 {
    let info = c.cmd(&["QUEUE", "INFO", queue]);
    int(&field(&info, "lease-ms").unwrap_or_else(|| panic!("QUEUE INFO {queue}: {info:?}")))
}

/// How long the lease of `id` has left, from QUEUE LEASES.
fn expires_in(c: &mut Client, queue: &str, id: &str) -> i64 {
    let Value::Array(leases) = c.cmd(&["QUEUE", "LEASES", queue, "COUNT", "100"]) else {
        panic!("QUEUE LEASES {queue}");
    };
    let lease = leases
        .iter()
        .find(|l| field(l, "id") == Some(Value::bulk(id)))
        .unwrap_or_else(|| panic!("no lease of {id} in {leases:?}"));
    int(&field(lease, "expires-in-ms").unwrap())
}

/// Pushes `payload` and pops it through `c`, which must lease it.
fn push_and_pop(c: &mut Client, queue: &str, payload: &str) {
    assert_eq!(c.cmd(&["LPUSH", queue, payload]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", queue]), Value::bulk(payload));
}

#[test]
fn a_new_lease_duration_applies_to_the_next_pop_on_the_same_connection() {
    let s = Setup::start(&rule("q", 600_000));
    let mut c = s.client();
    push_and_pop(&mut c, "q", "m1");
    assert_eq!(lease_ms(&mut c, "q"), 600_000);

    s.reload(&rule("q", 20_000), RELOADED);
    // The client connected before the reload is the one that sees it.
    assert_eq!(lease_ms(&mut c, "q"), 20_000);
    push_and_pop(&mut c, "q", "m2");
    let new = expires_in(&mut c, "q", "m2");
    assert!(new > 0 && new <= 20_000, "m2 leased for {new} ms");
    // A lease taken before keeps the end it was given.
    let old = expires_in(&mut c, "q", "m1");
    assert!(old > 500_000, "m1 has {old} ms left");
    assert_eq!(c.cmd(&["ACK", "q", "m1", "m2"]), Value::Int(2));
    assert_eq!(
        s.log_lines("configuration reloaded: 1 queue rules (0 added, 1 changed, 0 removed), limits unchanged"),
        1
    );
}

#[test]
fn an_added_rule_makes_its_keys_queues() {
    let s = Setup::start(&rule("q", 600_000));
    let mut c = s.client();
    assert_eq!(
        c.cmd(&["ACK", "jobs:1", "m"]),
        Value::Error("ERR no queue rule matches key 'jobs:1'".into())
    );

    s.reload(&(rule("q", 600_000) + &rule("jobs:*", 30_000)), RELOADED);
    push_and_pop(&mut c, "jobs:1", "m");
    let info = c.cmd(&["QUEUE", "INFO", "jobs:1"]);
    assert_eq!(field(&info, "leased"), Some(Value::Int(1)), "{info:?}");
    assert_eq!(field(&info, "lease-ms"), Some(Value::Int(30_000)));
    assert_eq!(c.cmd(&["ACK", "jobs:1", "m"]), Value::Int(1));
    // The rule that was there stays in force.
    push_and_pop(&mut c, "q", "n");
    assert_eq!(c.cmd(&["ACK", "q", "n"]), Value::Int(1));
    assert_eq!(
        s.log_lines("2 queue rules (1 added, 0 changed, 0 removed)"),
        1
    );
}

/// The keys in Redis, sorted.
fn keys(c: &mut Client) -> Vec<String> {
    let Value::Array(keys) = c.cmd(&["KEYS", "*"]) else {
        panic!("KEYS");
    };
    let mut names = bulk_strings(&keys, "KEYS");
    names.sort();
    names
}

#[test]
fn a_removed_rule_leaves_its_keys_plain_lists() {
    let s = Setup::start(&(rule("q", 600_000) + &rule("gone", 600_000)));
    let mut c = s.client();
    s.reload(&rule("q", 600_000), RELOADED);
    push_and_pop(&mut c, "gone", "m");
    // Popped without a lease: nothing in Redis, nothing to acknowledge.
    assert_eq!(keys(&mut s.redis.client()), Vec::<String>::new());
    assert_eq!(c.cmd(&["ACK", "gone", "m"]), Value::Int(0));
    assert_eq!(
        c.cmd(&["ACK", "never", "m"]),
        Value::Error("ERR no queue rule matches key 'never'".into())
    );
    assert_eq!(
        s.log_lines("1 queue rules (0 added, 0 changed, 1 removed)"),
        1
    );
}

/// A pop parked on `gone` while a reload to `after` removes its rule, then
/// woken by a push: answered as a pop of the plain list it now is, with no
/// lease left in Redis.
fn parked_across_removal(after: &str) {
    let ops = free_port();
    let metrics = format!("metrics = \"127.0.0.1:{ops}\"\n");
    let s = Setup::start(&(metrics.clone() + &rule("q", 600_000) + &rule("gone", 600_000)));
    let mut c = s.client();
    c.send(&["BRPOP", "gone", "20"]);
    wait_until("the pop to park", || {
        metric(ops, "ackproxy_parked_clients") == 1.0
    });
    s.reload(&(metrics + after), RELOADED);
    let mut direct = s.redis.client();
    assert_eq!(direct.cmd(&["LPUSH", "gone", "m"]), Value::Int(1));
    assert_eq!(c.read_value(), Value::bulks(&["gone", "m"]));
    assert_eq!(keys(&mut direct), Vec::<String>::new());
    // Nothing leased: an ACK finds nothing, and nothing comes back.
    assert_eq!(c.cmd(&["ACK", "gone", "m"]), Value::Int(0));
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(keys(&mut direct), Vec::<String>::new());
}

#[test]
fn a_pop_parked_on_a_removed_rule_takes_no_lease() {
    parked_across_removal(&rule("q", 600_000));
}

#[test]
fn a_pop_parked_when_the_last_rule_goes_takes_no_lease() {
    parked_across_removal("# no queue rules\n");
}

/// Leases taken under a rule that a reload to `after` removes.
fn leases_across_removal(after: &str) {
    let s = Setup::start(&(rule("q", 600_000) + &rule("gone", 1_000)));
    let mut c = s.client();
    push_and_pop(&mut c, "gone", "m1");
    push_and_pop(&mut c, "gone", "m2");
    s.reload(after, RELOADED);
    // Acknowledged under the rule they were taken under.
    assert_eq!(c.cmd(&["ACK", "gone", "m1"]), Value::Int(1));
    // The other one runs out and is handed back by the reaper.
    let mut direct = s.redis.client();
    wait_until("m2 back in the list", || {
        direct.cmd(&["LRANGE", "gone", "0", "-1"]) == Value::bulks(&["m2"])
    });
    assert_eq!(lease_tokens(&mut direct, "gone"), Vec::<String>::new());
    // From the list it is now plain, popped without a lease.
    assert_eq!(c.cmd(&["RPOP", "gone"]), Value::bulk("m2"));
    assert_eq!(lease_tokens(&mut direct, "gone"), Vec::<String>::new());
}

/// The leases of `queue` in Redis: its lease records, and the tokens in its
/// lease set (whose `~` members are marks, not leases).
fn lease_tokens(direct: &mut Client, queue: &str) -> Vec<String> {
    let aux = format!("ackq:{{{queue}}}:{queue}:");
    let Value::Array(records) = direct.cmd(&["HKEYS", &format!("{aux}msgs")]) else {
        panic!("HKEYS");
    };
    let Value::Array(members) = direct.cmd(&["ZRANGE", &format!("{aux}leases"), "0", "-1"]) else {
        panic!("ZRANGE");
    };
    records
        .into_iter()
        .chain(members)
        .filter_map(|v| match v {
            Value::Bulk(b) if !b.starts_with(b"~") => {
                Some(String::from_utf8_lossy(&b).into_owned())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn leases_of_a_removed_rule_stay_ackable_and_are_reaped() {
    leases_across_removal(&rule("q", 600_000));
}

#[test]
fn leases_stay_ackable_and_are_reaped_when_the_last_rule_goes() {
    leases_across_removal("# no queue rules\n");
}

#[test]
fn a_file_that_does_not_load_changes_nothing() {
    let s = Setup::start(&rule("q", 600_000));
    let mut c = s.client();
    let path = s.config.display().to_string();

    // Not TOML.
    s.reload(&(rule("q", 20_000) + "[[queue]\npattern ="), NOT_RELOADED);
    // Valid TOML that validation refuses, beside a change that alone
    // would be fine.
    s.reload(&(rule("q", 20_000) + &rule("jobs:*", 0)), NOT_RELOADED);
    let warnings = std::fs::read_to_string(&s.log).unwrap();
    let warnings: Vec<&str> = warnings
        .lines()
        .filter(|l| l.contains(NOT_RELOADED))
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    for w in &warnings {
        assert!(w.contains("WARN"), "{w}");
        assert!(w.contains(&path), "{w}");
    }
    assert!(
        warnings[0].contains(&format!("{path}:4: unclosed array table")),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[1].contains("queue \"jobs:*\": lease_ms: must be positive"),
        "{}",
        warnings[1]
    );
    assert_eq!(s.log_lines(RELOADED), 0);

    // The old rule, with its old lease, on the connection made before.
    assert_eq!(lease_ms(&mut c, "q"), 600_000);
    push_and_pop(&mut c, "q", "m");
    assert!(expires_in(&mut c, "q", "m") > 500_000);
    assert_eq!(
        c.cmd(&["ACK", "jobs:1", "m"]),
        Value::Error("ERR no queue rule matches key 'jobs:1'".into())
    );
    // A good file afterwards still reloads.
    s.reload(&rule("q", 20_000), RELOADED);
    assert_eq!(lease_ms(&mut c, "q"), 20_000);
}

#[test]
fn the_first_rule_can_come_by_reload() {
    let ops = free_port();
    let metrics = format!("metrics = \"127.0.0.1:{ops}\"\n");
    let s = Setup::start(&(metrics.clone() + "# no queue rules yet\n"));
    let mut c = s.client();
    let mut direct = s.redis.client();
    // Redis's own answers, byte for byte, while no rule is configured.
    for cmd in [
        &["ACK", "q", "m"][..],
        &["QUEUE", "INFO", "q"],
        &["NACK", "q", "m"],
    ] {
        let want = direct.raw(cmd);
        assert!(want.starts_with(b"-ERR unknown command"), "{want:?}");
        assert_eq!(c.raw(cmd), want);
    }
    // Without rules the proxy leaves Redis's settings alone.
    assert_eq!(
        direct.cmd(&["CONFIG", "GET", "notify-keyspace-events"]),
        Value::bulks(&["notify-keyspace-events", ""])
    );
    // ... and its functions: the shared connection (open since the
    // commands above) loaded no library.
    let libraries = |direct: &mut Client| match direct.cmd(&["FUNCTION", "LIST"]) {
        Value::Array(libs) => libs.len(),
        other => panic!("FUNCTION LIST: {other:?}"),
    };
    assert_eq!(c.cmd(&["SET", "k", "v"]), Value::Simple("OK".into()));
    assert_eq!(libraries(&mut direct), 0);

    s.reload(&(metrics + &rule("q", 30_000)), RELOADED);
    assert_eq!(lease_ms(&mut c, "q"), 30_000);
    assert_eq!(metric(ops, "ackproxy_pops_total{rule=\"q\"}"), 0.0);
    push_and_pop(&mut c, "q", "m1");
    // The library was loaded when a queue operation needed it.
    assert_eq!(libraries(&mut direct), 1);
    assert_eq!(c.cmd(&["ACK", "q", "m1"]), Value::Int(1));
    // A blocking pop parks in the proxy and is woken by a push.
    c.send(&["BRPOP", "q", "10"]);
    wait_until("the pop to park", || {
        metric(ops, "ackproxy_parked_clients") == 1.0
    });
    assert_eq!(s.client().cmd(&["LPUSH", "q", "m2"]), Value::Int(1));
    assert_eq!(c.read_value(), Value::bulks(&["q", "m2"]));
    assert_eq!(c.cmd(&["ACK", "q", "m2"]), Value::Int(1));
    assert_eq!(metric(ops, "ackproxy_pops_total{rule=\"q\"}"), 2.0);
    // The web view's listing follows the rules in force.
    let listing = crate::common::http(ops, "GET", "/api/queues", &[], b"").unwrap();
    assert_eq!(listing.status, 200);
    assert!(
        listing.text().contains("\"pattern\":\"q\""),
        "{}",
        listing.text()
    );
}

#[test]
fn a_lower_maxclients_refuses_the_next_connection() {
    let limits = |n: usize| format!("{}[limits]\nmaxclients = {n}\n", rule("q", 30_000));
    let s = Setup::start(&limits(100));
    let mut a = s.client();
    let mut b = s.client();
    assert_eq!(a.raw(&["PING"]), b"+PONG\r\n");
    assert_eq!(b.raw(&["PING"]), b"+PONG\r\n");

    s.reload(&limits(2), "limits changed (maxclients)");
    let mut refused = TcpStream::connect(("127.0.0.1", s.proxy.port)).unwrap();
    assert_eq!(
        read_to_close(&mut refused),
        b"-ERR max number of clients reached\r\n"
    );
    // Those already connected stay.
    assert_eq!(a.raw(&["PING"]), b"+PONG\r\n");
    s.reload(&limits(10), "limits changed (maxclients)");
    let mut c = s.client();
    assert_eq!(c.raw(&["PING"]), b"+PONG\r\n");
}

#[test]
fn settings_that_need_a_restart_are_named_and_kept() {
    let s = Setup::start(&rule("q", 30_000));
    let mut c = s.client();
    s.reload(
        &format!(
            "shared_connections = 3\nconnect_timeout_ms = 5\n{}",
            rule("q", 30_000)
        ),
        RELOADED,
    );
    for name in ["shared_connections", "connect_timeout_ms"] {
        assert_eq!(
            s.log_lines(&format!(
                "{name} changed in the file; it takes effect at restart"
            )),
            1,
            "{name}"
        );
    }
    assert_eq!(s.log_lines("0 queue rules"), 0);
    assert_eq!(
        s.log_lines("1 queue rules (0 added, 0 changed, 0 removed), limits unchanged"),
        1
    );
    push_and_pop(&mut c, "q", "m");
    assert_eq!(c.cmd(&["ACK", "q", "m"]), Value::Int(1));
}

#[test]
fn a_password_changed_through_the_proxy_outlives_a_reload_of_the_same_file() {
    let toml = format!("upstream_password = \"old\"\n{}", rule("q", 600_000));
    let s = Setup::start_on(Redis::start_with(&["--requirepass", "old"]), &toml);
    let mut c = s.client();
    assert_eq!(c.raw(&["AUTH", "old"]), b"+OK\r\n");
    // Followed by the proxy for its own connections.
    assert_eq!(c.raw(&["CONFIG", "SET", "requirepass", "new"]), b"+OK\r\n");
    // The file did not change: its old password is not news.
    s.reload(&toml, RELOADED);
    assert_eq!(s.log_lines("upstream credentials reloaded"), 0);
    // Every connection to Redis goes: the proxy's next ones log in anew.
    let mut direct = s.redis.client();
    assert_eq!(direct.raw(&["AUTH", "new"]), b"+OK\r\n");
    direct.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    let mut n = s.client();
    assert_eq!(n.raw(&["AUTH", "new"]), b"+OK\r\n");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        // Refused, nothing was pushed: retried while the proxy reconnects.
        let got = n.cmd(&["QUEUE", "PUSH", "q", "m"]);
        if got == Value::Int(1) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "QUEUE PUSH: {got:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(n.cmd(&["RPOP", "q"]), Value::bulk("m"));
    assert_eq!(n.cmd(&["ACK", "q", "m"]), Value::Int(1));
}
