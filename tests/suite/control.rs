//! The proxy's own traffic with Redis: the keyspace subscription that wakes
//! parked pops (its recovery when Redis drops it, polling when CONFIG is
//! refused), the command table and the login probe, with the errors each
//! reports.

use std::process::Command;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::common::*;
use ackproxy::error::ControlCause;
use ackproxy::upstream::topology::Address;
use ackproxy::upstream::{Credentials, Endpoint};

/// One queue rule; leases long enough that none expires during a test.
const CONFIG: &str = "[[queue]]\npattern = \"w*\"\nlease_ms = 600000\n";

/// Parked pops are retried this often even with notifications (the
/// dispatcher's safety recheck).
const SAFETY_RECHECK: Duration = Duration::from_secs(1);

/// Polls `cond` until it holds; the machine may be loaded, so the deadline
/// is generous and only there to end a test that would hang.
fn await_condition(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How many subscribers the keyspace channel of `key` has.
fn subscribers(direct: &mut Client, key: &str) -> Value {
    let channel = format!("__keyspace@0__:{key}");
    match direct.cmd(&["PUBSUB", "NUMSUB", &channel]) {
        Value::Array(mut v) if v.len() == 2 => v.pop().unwrap(),
        other => panic!("PUBSUB NUMSUB: {other:?}"),
    }
}

fn start(redis: &Redis) -> (Proxy, u16) {
    let (proxy, metrics) = Proxy::start_with_metrics(redis.port, CONFIG);
    (proxy, metrics)
}

/// Sends a BRPOP on `key` and returns once the proxy has parked it.
fn park(proxy: &Proxy, metrics: u16, key: &str) -> Client {
    let mut c = proxy.client();
    c.set_read_timeout(Some(Duration::from_secs(10)));
    c.send(&["BRPOP", key, "0"]);
    await_condition("the BRPOP is parked", || {
        metric(metrics, "ackproxy_parked_clients") == 1.0
    });
    c
}

/// Pushes `msg` straight to Redis and returns how long the parked client
/// took to get it.
fn push_and_wake(direct: &mut Client, parked: &mut Client, key: &str, msg: &str) -> Duration {
    let pushed = Instant::now();
    assert_eq!(direct.cmd(&["LPUSH", key, msg]), Value::Int(1));
    let reply = parked.read_value();
    let took = pushed.elapsed();
    assert_eq!(reply, Value::bulks(&[key, msg]));
    took
}

#[test]
fn keyspace_subscriber_recovers_after_redis_kills_its_connection() {
    let redis = Redis::start();
    let (proxy, metrics) = start(&redis);
    let mut direct = redis.client();
    let mut acker = proxy.client();
    for round in 0..2 {
        let mut parked = park(&proxy, metrics, "w");
        await_condition("the proxy subscribes to the parked key", || {
            subscribers(&mut direct, "w") == Value::Int(1)
        });
        let killed = Command::new("redis-cli")
            .args([
                "-p",
                &redis.port.to_string(),
                "CLIENT",
                "KILL",
                "TYPE",
                "pubsub",
            ])
            .output()
            .expect("redis-cli");
        assert_eq!(
            String::from_utf8_lossy(&killed.stdout).trim(),
            "1",
            "round {round}: the proxy's subscription is the one pub/sub client"
        );
        let msg = format!("lost-{round}");
        let took = push_and_wake(&mut direct, &mut parked, "w", &msg);
        println!("round {round}: woken {took:?} after a push made while unsubscribed");
        assert!(
            took <= SAFETY_RECHECK + Duration::from_millis(500),
            "round {round}: {took:?}"
        );
        assert_eq!(acker.cmd(&["ACK", "w", &msg]), Value::Int(1));

        await_condition("the proxy subscribes again", || {
            subscribers(&mut direct, "w") == Value::Int(1)
        });
        await_condition("the proxy stops polling", || {
            metric(metrics, "ackproxy_wakeup_polling") == 0.0
        });
        // Notifications again, not polling: parked pops are retried only
        // by the safety recheck, which is far off right after parking.
        let mut parked = park(&proxy, metrics, "w");
        let msg = format!("back-{round}");
        let took = push_and_wake(&mut direct, &mut parked, "w", &msg);
        println!("round {round}: woken {took:?} after the subscription is back");
        assert!(took < SAFETY_RECHECK / 2, "round {round}: {took:?}");
        assert_eq!(acker.cmd(&["ACK", "w", &msg]), Value::Int(1));
    }
}

#[test]
fn parked_pops_poll_when_config_is_refused() {
    let redis = Redis::start_with(&["--rename-command", "CONFIG", ""]);
    let (proxy, metrics) = start(&redis);
    await_condition("the proxy falls back to polling", || {
        metric(metrics, "ackproxy_wakeup_polling") == 1.0
    });
    let mut direct = redis.client();
    let mut parked = park(&proxy, metrics, "wp");
    assert_eq!(subscribers(&mut direct, "wp"), Value::Int(0));
    let took = push_and_wake(&mut direct, &mut parked, "wp", "m");
    println!("woken {took:?} after the push, by polling");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["ACK", "wp", "m"]), Value::Int(1));
    assert_eq!(metric(metrics, "ackproxy_wakeup_polling"), 1.0);
}

/// Only keys that pops wait on are subscribed to: a busy queue, which
/// parks nobody, brings the proxy no keyspace event for its pushes and
/// pops. A key stays subscribed a while after its last parked pop, so the
/// next one is woken by the event at once.
#[test]
fn only_keys_with_parked_pops_are_subscribed() {
    let redis = Redis::start();
    let (proxy, metrics) = start(&redis);
    let mut direct = redis.client();
    let mut c = proxy.client();
    for i in 0..50 {
        let msg = format!("m{i}");
        assert_eq!(c.cmd(&["LPUSH", "wbusy", &msg]), Value::Int(1));
        assert_eq!(c.cmd(&["RPOP", "wbusy"]), Value::bulk(&msg));
        assert_eq!(c.cmd(&["ACK", "wbusy", &msg]), Value::Int(1));
    }
    // The subscription's connection exists (events are enabled) but
    // listens to nothing.
    await_condition("the keyspace events are enabled", || {
        let flags = direct.cmd(&["CONFIG", "GET", "notify-keyspace-events"]);
        matches!(&flags, Value::Array(v) if v.get(1).is_some_and(|f| *f != Value::bulk("")))
    });
    assert_eq!(direct.cmd(&["PUBSUB", "NUMPAT"]), Value::Int(0));
    assert_eq!(
        direct.cmd(&["PUBSUB", "CHANNELS"]),
        Value::Array(Vec::new())
    );

    let mut parked = park(&proxy, metrics, "wbusy");
    await_condition("the proxy subscribes to the parked key", || {
        subscribers(&mut direct, "wbusy") == Value::Int(1)
    });
    assert_eq!(
        direct.cmd(&["PUBSUB", "CHANNELS"]),
        Value::bulks(&["__keyspace@0__:wbusy"])
    );
    let took = push_and_wake(&mut direct, &mut parked, "wbusy", "first");
    assert!(took < SAFETY_RECHECK / 2, "{took:?}");
    assert_eq!(c.cmd(&["ACK", "wbusy", "first"]), Value::Int(1));
    // Served: the subscription lingers for the next parked pop.
    assert_eq!(metric(metrics, "ackproxy_parked_clients"), 0.0);
    assert_eq!(subscribers(&mut direct, "wbusy"), Value::Int(1));
    let mut parked = park(&proxy, metrics, "wbusy");
    let took = push_and_wake(&mut direct, &mut parked, "wbusy", "second");
    assert!(took < SAFETY_RECHECK / 2, "{took:?}");
    assert_eq!(c.cmd(&["ACK", "wbusy", "second"]), Value::Int(1));
}

fn endpoint(port: u16, password: Option<&str>) -> Endpoint {
    Endpoint {
        addr: Address::fixed(format!("127.0.0.1:{port}")),
        credentials: RwLock::new(Credentials {
            user: None,
            password: password.map(str::to_string),
        }),
        connect_timeout: Duration::from_secs(1),
        tls: None,
        opened: Default::default(),
        connected: Arc::new(tokio::sync::Notify::new()),
    }
}

#[tokio::test]
async fn command_table_is_read_from_redis() {
    use ackproxy::command::table::fetch;
    let redis = Redis::start();
    let table = fetch(&endpoint(redis.port, None)).await.expect("table");
    let blpop = table.lookup(b"BLPOP", None).unwrap();
    assert!(blpop.blocking && blpop.write);
    let pause = table.lookup(b"client", Some(b"PAUSE")).unwrap();
    assert!(pause.admin && pause.noscript && !pause.blocking);
    let get = table.lookup(b"get", None).unwrap();
    assert!(!get.write && !get.blocking);
    assert_eq!(table.lookup(b"nosuch", None), None);
    // Arity and the commands allowed before AUTH come from the table too.
    assert!(table.refuses_unauthenticated(b"GET", None, 2));
    assert!(!table.refuses_unauthenticated(b"GET", None, 3));
    assert!(!table.refuses_unauthenticated(b"AUTH", None, 2));

    let renamed = Redis::start_with(&["--rename-command", "COMMAND", ""]);
    let e = fetch(&endpoint(renamed.port, None)).await.unwrap_err();
    assert_eq!(e.during, "COMMAND");
    assert!(
        matches!(&e.cause, ControlCause::Refused { code, .. } if code == "ERR"),
        "{e}"
    );
    assert!(!e.retryable(), "{e}");
}

#[tokio::test]
async fn control_connections_log_in_with_the_proxys_credentials() {
    use ackproxy::command::table::fetch;
    let redis = Redis::start_with(&["--requirepass", "secret"]);
    assert!(fetch(&endpoint(redis.port, Some("secret"))).await.is_ok());

    let e = fetch(&endpoint(redis.port, Some("wrong")))
        .await
        .unwrap_err();
    assert_eq!(
        (e.during, &e.cause),
        ("connect", &ControlCause::Login),
        "{e}"
    );
    assert!(e.retryable(), "new credentials may come with SIGHUP");

    let e = fetch(&endpoint(redis.port, None)).await.unwrap_err();
    assert!(e.needs_login(), "{e}");

    // Credentials are read at each connect.
    let ep = endpoint(redis.port, Some("wrong"));
    ep.credentials.write().unwrap().password = Some("secret".into());
    assert!(fetch(&ep).await.is_ok());

    let closed = free_port();
    let e = fetch(&endpoint(closed, None)).await.unwrap_err();
    assert!(
        matches!(e.cause, ControlCause::Unreachable(_)) && e.retryable(),
        "{e}"
    );
}

#[tokio::test]
async fn login_probe_asks_redis_without_credentials() {
    use ackproxy::auth::{probe, required};
    let open = Redis::start();
    let locked = Redis::start_with(&["--requirepass", "secret"]);
    // The proxy's own password does not count: clients have none.
    assert_eq!(
        probe(&endpoint(locked.port, Some("secret"))).await,
        Some(true)
    );
    assert!(required());
    assert_eq!(probe(&endpoint(open.port, None)).await, Some(false));
    assert!(!required());
    // Nobody to ask: nothing learnt, the last answer stands.
    assert_eq!(probe(&endpoint(free_port(), None)).await, None);
    assert!(!required());
}
