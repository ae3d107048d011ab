//! A client's own upstream connection is taken from a few kept open and
//! logged in: its first stateful request reaches Redis before requests
//! other clients send after it, as it would directly, however new the
//! client is, whoever it logged in as and whatever protocol it speaks.

use std::time::Duration;

use crate::common::*;

/// Rounds of each race: before ready connections, about a third of them
/// went the wrong way.
const ROUNDS: usize = 100;

fn gauge(kind: &str) -> String {
    series("ackproxy_upstream_connections", &[("kind", kind)])
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A Redis user `name`, password `pw`, allowed everything.
fn add_user(c: &mut Client, name: &str) {
    let reply = c.cmd(&["ACL", "SETUSER", name, "on", ">pw", "~*", "+@all"]);
    assert_eq!(reply, Value::Simple("OK".into()));
}

/// [`missed`] for `ROUNDS` readers, each a fresh client from `open`, and
/// `b`: none may miss its entry.
fn none_missed(b: &mut Client, mut open: impl FnMut() -> Client) {
    let mut misses = 0;
    for i in 0..ROUNDS {
        let mut a = open();
        if missed(&mut a, b, &format!("s{i}")).0 {
            misses += 1;
        }
    }
    assert_eq!(
        misses, 0,
        "{misses} of {ROUNDS} blocking reads missed the entry added after them"
    );
}

/// `a`, on shared connections so far, reads entries added after its
/// request, blocking; `b` adds one right after. Whether `a` missed it: its request reached Redis after the entry
/// (directly, never). The reply to `a` is returned.
fn missed(a: &mut Client, b: &mut Client, key: &str) -> (bool, Vec<u8>) {
    // Accepted (by Redis directly, by the proxy and its session): a
    // connection Redis has yet to accept may be read after one it has.
    assert!(matches!(a.cmd(&["PING"]), Value::Simple(_)));
    a.send(&["XREAD", "BLOCK", "0", "STREAMS", key, "$"]);
    let Value::Bulk(first) = b.cmd(&["XADD", key, "*", "n", "1"]) else {
        panic!("XADD");
    };
    a.set_read_timeout(Some(Duration::from_millis(300)));
    let reply = match a.try_read_raw() {
        Ok(reply) => reply,
        Err(_) => {
            // Slow, or waiting for a later entry: a second one tells.
            b.cmd(&["XADD", key, "*", "n", "2"]);
            a.set_read_timeout(Some(Duration::from_secs(30)));
            a.read_raw()
        }
    };
    (!contains(&reply, &first), reply)
}

/// Redis's `CLIENT LIST` line of the connection blocked in `XREAD`, once
/// there is one.
fn blocked_in_xread(direct: &mut Client) -> String {
    wait_until("the read to block", || {
        let Value::Bulk(list) = direct.cmd(&["CLIENT", "LIST"]) else {
            return false;
        };
        String::from_utf8_lossy(&list).contains(" cmd=xread ")
    });
    let Value::Bulk(list) = direct.cmd(&["CLIENT", "LIST"]) else {
        panic!("CLIENT LIST");
    };
    let list = String::from_utf8(list).unwrap();
    let found = list
        .lines()
        .filter(|l| l.contains(" cmd=xread "))
        .collect::<Vec<_>>();
    assert_eq!(found.len(), 1, "{list}");
    found[0].to_string()
}

#[test]
fn a_clients_first_blocking_read_reaches_redis_before_the_next_write() {
    // The proxy logs in as a user of its own: opening a connection costs
    // a login round trip too.
    let redis = Redis::start();
    let mut admin = redis.client();
    add_user(&mut admin, "proxy");
    let (proxy, m) = Proxy::start_with_metrics(
        redis.port,
        "upstream_user = \"proxy\"\nupstream_password = \"pw\"\n",
    );
    await_metric(m, &gauge("pooled"), 2.0);
    let direct = || redis.client();

    // Directly, the reader is always served.
    let mut b = direct();
    for i in 0..ROUNDS {
        let mut a = direct();
        assert!(!missed(&mut a, &mut b, &format!("direct{i}")).0);
    }

    let mut b = proxy.client();
    none_missed(&mut b, || proxy.client());
    // Clients gone, their connections closed; the pool kept full.
    await_metric(m, &gauge("dedicated"), 0.0);
    await_metric(m, &gauge("pooled"), 2.0);
}

#[test]
fn a_logged_in_clients_connection_is_ready_as_its_user() {
    let redis = Redis::start();
    let mut direct = redis.client();
    add_user(&mut direct, "worker");
    let m = free_port();
    let proxy = Proxy::start(redis.port, &["--metrics", &format!("127.0.0.1:{m}")]);
    let login =
        |c: &mut Client| assert_eq!(c.cmd(&["AUTH", "worker", "pw"]), Value::Simple("OK".into()));
    // The user's connections open with its first login, and stay.
    let mut first = proxy.client();
    login(&mut first);
    drop(first);
    // The proxy's two, and the user's.
    await_metric(m, &gauge("pooled"), 4.0);

    // Blocked as the user, on a connection of its own.
    let mut a = proxy.client();
    login(&mut a);
    a.send(&["XREAD", "BLOCK", "0", "STREAMS", "s", "$"]);
    let line = blocked_in_xread(&mut direct);
    assert!(line.contains(" user=worker "), "{line}");
    drop(a);

    let mut b = proxy.client();
    login(&mut b);
    none_missed(&mut b, || {
        let mut a = proxy.client();
        login(&mut a);
        a
    });
    await_metric(m, &gauge("pooled"), 4.0);
}

#[test]
fn a_resp3_named_clients_first_request_gets_its_protocol_and_name() {
    let redis = Redis::start();
    let mut direct = redis.client();
    let proxy = Proxy::start(redis.port, &[]);
    let mut b = proxy.client();
    let mut misses = 0;
    for i in 0..ROUNDS {
        let mut a = proxy.client();
        // Answered by the proxy: the client still shares.
        assert!(a.raw(&["HELLO", "3"]).starts_with(b"%"));
        let name = format!("reader-{i}");
        assert_eq!(a.raw(&["CLIENT", "SETNAME", &name]), b"+OK\r\n");
        let (miss, reply) = missed(&mut a, &mut b, &format!("s{i}"));
        if miss {
            misses += 1;
        }
        // A map: the reply came in RESP3.
        assert!(
            reply.starts_with(b"%1\r\n"),
            "{}",
            String::from_utf8_lossy(&reply)
        );
        if i == 0 {
            a.send(&["XREAD", "BLOCK", "0", "STREAMS", "s0", "$"]);
            let line = blocked_in_xread(&mut direct);
            assert!(line.contains(&format!(" name={name} ")), "{line}");
            assert!(line.ends_with(" resp=3"), "{line}");
            assert!(line.contains(" db=0 "), "{line}");
        }
    }
    assert_eq!(
        misses, 0,
        "{misses} of {ROUNDS} blocking reads missed the entry added after them"
    );
}

/// The ids of Redis's connections that have not sent a request yet: the
/// proxy's ready ones (it logs in only where Redis wants a password).
fn never_used(direct: &mut Client) -> Vec<String> {
    let Value::Bulk(list) = direct.cmd(&["CLIENT", "LIST"]) else {
        panic!("CLIENT LIST");
    };
    String::from_utf8(list)
        .unwrap()
        .lines()
        .filter(|l| l.contains(" cmd=NULL "))
        .map(|l| {
            l.split(' ')
                .next()
                .unwrap()
                .trim_start_matches("id=")
                .to_string()
        })
        .collect()
}

#[test]
fn a_ready_connection_redis_closed_is_never_handed_out() {
    let redis = Redis::start();
    let mut direct = redis.client();
    let m = free_port();
    let proxy = Proxy::start(redis.port, &["--metrics", &format!("127.0.0.1:{m}")]);
    await_metric(m, &gauge("pooled"), 2.0);
    await_metric(m, &gauge("dedicated"), 0.0);
    for round in 0..3 {
        wait_until("two ready connections", || {
            never_used(&mut direct).len() == 2
        });
        for id in never_used(&mut direct) {
            assert_eq!(direct.cmd(&["CLIENT", "KILL", "ID", &id]), Value::Int(1));
        }
        // At once, before the proxy's check every second: the next client
        // needing one of its own is served, not told the connection is lost.
        let mut a = proxy.client();
        let key = format!("nothing{round}");
        assert_eq!(a.cmd(&["BLPOP", &key, "0.01"]), Value::Nil, "round {round}");
    }
    // One in use while blocked, the pool full again.
    let mut a = proxy.client();
    a.send(&["BLPOP", "k", "0"]);
    await_metric(m, &gauge("dedicated"), 1.0);
    await_metric(m, &gauge("pooled"), 2.0);
    assert_eq!(direct.cmd(&["RPUSH", "k", "v"]), Value::Int(1));
    assert_eq!(a.read_value(), Value::bulks(&["k", "v"]));
}

#[test]
fn no_ready_connections_when_the_pool_is_off() {
    let redis = Redis::start();
    let (proxy, m) = Proxy::start_with_metrics(redis.port, "dedicated_pool = 0\n");
    let mut a = proxy.client();
    a.send(&["BLPOP", "k", "0"]);
    await_metric(m, &gauge("dedicated"), 1.0);
    assert_eq!(metric(m, &gauge("pooled")), 0.0);
    assert_eq!(redis.client().cmd(&["RPUSH", "k", "v"]), Value::Int(1));
    assert_eq!(a.read_value(), Value::bulks(&["k", "v"]));
}

/// Redis lost with a client's first request on its own connection still
/// unanswered, and the requests of the proxy's own written with it (the
/// client's name): the client gets one error, for its one request, and its
/// next request's reply after it.
#[test]
fn a_lost_connection_answers_only_the_clients_requests() {
    let mut redis = Redis::start();
    let port = redis.port;
    let m = free_port();
    let proxy = Proxy::start(port, &["--metrics", &format!("127.0.0.1:{m}")]);
    let mut a = proxy.client();
    assert_eq!(
        a.cmd(&["CLIENT", "SETNAME", "reader"]),
        Value::Simple("OK".into())
    );
    // Redis holds every request from now on, then dies.
    assert_eq!(
        redis.client().cmd(&["CLIENT", "PAUSE", "60000", "ALL"]),
        Value::Simple("OK".into())
    );
    a.send(&["BLPOP", "k", "0"]);
    // Written (with the name) on a connection of its own.
    await_metric(m, &gauge("dedicated"), 1.0);
    redis.kill();
    let Value::Error(e) = a.read_value() else {
        panic!("an error for BLPOP");
    };
    assert!(e.starts_with("ERR upstream"), "{e}");

    let _again = Redis::start_on(port, redis.dir.clone(), &[]);
    wait_until("the proxy to reach Redis again", || {
        Client::connect(proxy.port).cmd(&["PING"]) == Value::Simple("PONG".into())
    });
    assert_eq!(a.cmd(&["ECHO", "after"]), Value::bulk("after"));
}
