//! What clients see of "clients" through the proxy: `CLIENT LIST`, `CLIENT
//! INFO`, `CLIENT ID`, `CLIENT KILL`, `CLIENT NO-EVICT`, `CLIENT UNBLOCK`,
//! `CLIENT TRACKING ... REDIRECT` and `INFO clients` describe and act on the
//! proxy's clients, in Redis's formats, never on its upstream connections.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;

const CONFIG: &str = r#"
[[queue]]
pattern = "jobs"
ack_id = "payload"
lease_ms = 600000
requeue_on_disconnect = true
"#;

fn text(v: &Value) -> String {
    match v {
        Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        // RESP3's verbatim string: =len, then "txt:" and the text.
        Value::Other(b) => {
            let s = String::from_utf8_lossy(b).into_owned();
            let body = &s[s.find("\r\n").unwrap() + 2..s.len() - 2];
            body.strip_prefix("txt:").unwrap().to_string()
        }
        other => panic!("not a text reply: {other:?}"),
    }
}

/// `CLIENT LIST` lines as field maps, keyed by id, with the field order.
fn parse_list(list: &str) -> Vec<Vec<(String, String)>> {
    list.lines()
        .map(|l| {
            l.split(' ')
                .map(|f| {
                    let (k, v) = f.split_once('=').unwrap_or((f, ""));
                    (k.to_string(), v.to_string())
                })
                .collect()
        })
        .collect()
}

fn by_id(list: &str) -> BTreeMap<i64, BTreeMap<String, String>> {
    parse_list(list)
        .into_iter()
        .map(|fields| {
            let m: BTreeMap<String, String> = fields.into_iter().collect();
            (m["id"].parse().unwrap(), m)
        })
        .collect()
}

fn id(c: &mut Client) -> i64 {
    match c.cmd(&["CLIENT", "ID"]) {
        Value::Int(n) => n,
        other => panic!("CLIENT ID: {other:?}"),
    }
}

fn info_field(c: &mut Client, name: &str) -> i64 {
    let info = text(&c.cmd(&["INFO", "clients"]));
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("{name} missing in {info}"))
        .trim()
        .parse()
        .unwrap()
}

fn closed(c: &mut Client) -> bool {
    c.set_read_timeout(Some(Duration::from_secs(20)));
    c.try_read_raw().is_err()
}

/// Three clients, one named and one in database 2: the list has exactly
/// them, each with its own id, address, name, database and last command,
/// and the same fields in the same order as Redis's own list.
#[test]
fn client_list_shows_the_proxys_clients() {
    let (r, proxy) = Proxy::with_redis(CONFIG);
    let mut a = proxy.client();
    let mut b = proxy.client();
    let mut c = proxy.client();
    assert_eq!(
        b.cmd(&["CLIENT", "SETNAME", "bee"]),
        Value::Simple("OK".into())
    );
    assert_eq!(c.cmd(&["SELECT", "2"]), Value::Simple("OK".into()));
    assert_eq!(c.cmd(&["GET", "k"]), Value::Nil);
    let ids = [id(&mut a), id(&mut b), id(&mut c)];
    // The start-up check's connection may still be listed for a moment.
    let mut list = String::new();
    wait_until("exactly the three clients listed", || {
        list = text(&a.cmd(&["CLIENT", "LIST"]));
        by_id(&list).keys().copied().collect::<Vec<_>>() == ids.to_vec()
    });
    let clients = by_id(&list);
    for (client, id) in [&a, &b, &c].iter().zip(ids) {
        assert_eq!(clients[&id]["addr"], client.local_addr().to_string());
        assert_eq!(clients[&id]["laddr"], format!("127.0.0.1:{}", proxy.port));
    }
    let (la, lb, lc) = (&clients[&ids[0]], &clients[&ids[1]], &clients[&ids[2]]);
    assert_eq!(la["cmd"], "client|list");
    assert_eq!(la["qbuf"], "26");
    assert_eq!(lb["name"], "bee");
    assert_eq!(lb["cmd"], "client|id");
    assert_eq!(la["name"], "");
    assert_eq!(lc["db"], "2");
    assert_eq!(lc["flags"], "N");

    // Redis's own line for a client in the same state: the same fields.
    let mut direct = r.client();
    let own = text(&direct.cmd(&["CLIENT", "LIST"]));
    let keys =
        |line: &Vec<(String, String)>| line.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    let direct_line = parse_list(&own).into_iter().last().unwrap();
    for line in parse_list(&list) {
        assert_eq!(keys(&line), keys(&direct_line), "{list}\nvs Redis's\n{own}");
    }

    // LIST ID and TYPE, and their errors, as Redis.
    let one = text(&a.cmd(&["CLIENT", "LIST", "ID", &ids[1].to_string(), "999999"]));
    assert_eq!(
        by_id(&one).keys().copied().collect::<Vec<_>>(),
        vec![ids[1]]
    );
    assert_eq!(
        by_id(&text(&a.cmd(&["CLIENT", "LIST", "TYPE", "normal"]))).len(),
        3
    );
    assert_eq!(text(&a.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"])), "");
    for args in [
        &["CLIENT", "LIST", "ID", "x"][..],
        &["CLIENT", "LIST", "TYPE", "foo"],
        &["CLIENT", "LIST", "TYPE"],
        &["CLIENT", "LIST", "foo", "bar", "baz"],
    ] {
        assert_eq!(a.raw(args), direct.raw(args), "{args:?}");
    }

    // A client gone is gone from the list.
    drop(b);
    wait_until("the closed client leaves the list", || {
        !by_id(&text(&a.cmd(&["CLIENT", "LIST"]))).contains_key(&ids[1])
    });
}

/// `CLIENT ID` is the client's own id, the same in `CLIENT INFO`, in
/// `HELLO`'s reply and after the client moved to a dedicated connection
/// (before, it was that connection's id in Redis).
#[test]
fn client_id_and_info_describe_the_client() {
    let (_r, proxy) = Proxy::with_redis(CONFIG);
    let mut a = proxy.client();
    let mine = id(&mut a);
    let info = text(&a.cmd(&["CLIENT", "INFO"]));
    assert!(info.ends_with('\n'), "{info:?}");
    let fields = &by_id(&info)[&mine];
    assert_eq!(fields["cmd"], "client|info");
    assert_eq!(fields["multi"], "-1");
    assert_eq!(fields["resp"], "2");
    assert_eq!(a.cmd(&["SELECT", "3"]), Value::Simple("OK".into()));
    assert_eq!(id(&mut a), mine, "the id changed on a dedicated connection");
    let fields = &by_id(&text(&a.cmd(&["CLIENT", "INFO"])))[&mine];
    assert_eq!(fields["db"], "3");

    // RESP3: a verbatim string, as Redis sends it.
    let mut b = proxy.client();
    let hello = b.raw(&["HELLO", "3"]);
    let b_id = id(&mut b);
    assert!(
        String::from_utf8_lossy(&hello).contains(&format!("$2\r\nid\r\n:{b_id}\r\n")),
        "{}",
        String::from_utf8_lossy(&hello)
    );
    let raw = b.raw(&["CLIENT", "INFO"]);
    assert!(raw.starts_with(b"="), "{}", String::from_utf8_lossy(&raw));
    assert!(String::from_utf8_lossy(&raw).contains(" resp=3\n"));

    // MULTI: flag x and the number of commands queued.
    assert_eq!(a.cmd(&["MULTI"]), Value::Simple("OK".into()));
    assert_eq!(a.cmd(&["GET", "k"]), Value::Simple("QUEUED".into()));
    let list = text(&b.cmd(&["CLIENT", "LIST"]).clone());
    let fields = &by_id(&list)[&mine];
    assert_eq!(
        (fields["flags"].as_str(), fields["multi"].as_str()),
        ("x", "1"),
        "{list}"
    );
    a.cmd(&["DISCARD"]);
}

/// `INFO`'s connected_clients and blocked_clients count the proxy's
/// clients (not its upstream connections); the rest of the reply is Redis's.
#[test]
fn info_counts_the_proxys_clients() {
    let (_r, proxy) = Proxy::with_redis(CONFIG);
    let mut a = proxy.client();
    // The start-up check's connection may not be gone yet, nor the new
    // ones accepted: as with Redis, the count follows.
    wait_until("connected_clients is 1", || {
        info_field(&mut a, "connected_clients") == 1
    });
    let mut b = proxy.client();
    let c = proxy.client();
    wait_until("connected_clients is 3", || {
        info_field(&mut a, "connected_clients") == 3
    });
    assert_eq!(info_field(&mut a, "blocked_clients"), 0);
    // Whole INFO too, and RESP3's verbatim form.
    let whole = text(&a.cmd(&["INFO"]));
    assert!(whole.contains("connected_clients:3\r\n"), "{whole}");
    assert!(whole.contains("# Server\r\n"));
    b.send(&["BLPOP", "nothing", "0"]);
    wait_until("blocked_clients is 1", || {
        info_field(&mut a, "blocked_clients") == 1
    });
    let list = text(&a.cmd(&["CLIENT", "LIST"]));
    assert!(list.contains("flags=b "), "{list}");
    drop(c);
    drop(b);
    wait_until("connected_clients is 1", || {
        info_field(&mut a, "connected_clients") == 1
    });
    assert_eq!(info_field(&mut a, "blocked_clients"), 0);
    let mut d = proxy.client();
    d.raw(&["HELLO", "3"]);
    let raw = d.raw(&["INFO", "clients"]);
    let s = String::from_utf8_lossy(&raw);
    assert!(
        s.starts_with('=') && s.contains("connected_clients:2\r\n"),
        "{s}"
    );
}

/// `CLIENT KILL` in each form closes the proxy's clients it names, with
/// Redis's replies and errors.
#[test]
fn client_kill_closes_the_named_clients() {
    let (r, proxy) = Proxy::with_redis(CONFIG);
    let mut direct = r.client();
    let mut me = proxy.client();

    // Errors, as Redis gives them.
    for args in [
        &["CLIENT", "KILL"][..],
        &["CLIENT", "KILL", "ID", "10", "wrong_arg"],
        &["CLIENT", "KILL", "ID", "str"],
        &["CLIENT", "KILL", "ID", "-1"],
        &["CLIENT", "KILL", "ID", "0"],
        &["CLIENT", "KILL", "TYPE", "wrong_type"],
        &["CLIENT", "KILL", "USER", "wrong_user"],
        &["CLIENT", "KILL", "SKIPME", "yes_or_no"],
        &["CLIENT", "KILL", "FOO", "bar"],
        &["CLIENT", "KILL", "1.2.3.4:5"],
        &["CLIENT", "KILL", "ID", "123456"],
        &["CLIENT", "KILL", "TYPE", "master"],
    ] {
        assert_eq!(me.raw(args), direct.raw(args), "{args:?}");
    }

    // By id.
    let mut v = proxy.client();
    let v_id = id(&mut v);
    assert_eq!(
        me.cmd(&["CLIENT", "KILL", "ID", &v_id.to_string()]),
        Value::Int(1)
    );
    assert!(closed(&mut v), "killed by id, still open");

    // By address, old form and new.
    let mut v = proxy.client();
    v.cmd(&["PING"]);
    let addr = v.local_addr().to_string();
    assert_eq!(
        me.cmd(&["CLIENT", "KILL", &addr]),
        Value::Simple("OK".into())
    );
    assert!(closed(&mut v));
    let mut v = proxy.client();
    v.cmd(&["PING"]);
    let addr = v.local_addr().to_string();
    assert_eq!(me.cmd(&["CLIENT", "KILL", "ADDR", &addr]), Value::Int(1));
    assert!(closed(&mut v));

    // By user and by local address: everyone but the asking client.
    let mut v = proxy.client();
    let mut w = proxy.client();
    v.cmd(&["PING"]);
    w.cmd(&["PING"]);
    assert_eq!(
        me.cmd(&["CLIENT", "KILL", "USER", "default"]),
        Value::Int(2)
    );
    assert!(closed(&mut v) && closed(&mut w));
    let mut v = proxy.client();
    v.cmd(&["PING"]);
    let laddr = format!("127.0.0.1:{}", proxy.port);
    assert_eq!(me.cmd(&["CLIENT", "KILL", "LADDR", &laddr]), Value::Int(1));
    assert!(closed(&mut v));
    assert_eq!(me.cmd(&["PING"]), Value::Simple("PONG".into()));

    // SKIPME NO: the asking client too, after its reply; a killed client
    // that held a lease gives it back, as any disconnect does.
    let mut v = proxy.client();
    let mut feeder = r.client();
    feeder.cmd(&["RPUSH", "jobs", "m1"]);
    assert_eq!(v.cmd(&["LPOP", "jobs"]), Value::bulk("m1"));
    assert_eq!(me.cmd(&["CLIENT", "KILL", "SKIPME", "no"]), Value::Int(2));
    assert!(closed(&mut me), "SKIPME NO left the asking client open");
    assert!(closed(&mut v));
    let mut check = proxy.client();
    wait_until("the killed client's lease comes back", || {
        check.cmd(&["LLEN", "jobs"]) == Value::Int(1)
    });
    wait_until("connected_clients is 1", || {
        info_field(&mut check, "connected_clients") == 1
    });
}

#[test]
fn client_no_evict_is_the_clients_own() {
    let (r, proxy) = Proxy::with_redis(CONFIG);
    let mut direct = r.client();
    let mut a = proxy.client();
    for args in [
        &["CLIENT", "NO-EVICT", "on"][..],
        &["CLIENT", "NO-EVICT", "maybe"],
        &["CLIENT", "NO-EVICT"],
        &["CLIENT", "NO-EVICT", "on", "x"],
    ] {
        assert_eq!(a.raw(args), direct.raw(args), "{args:?}");
    }
    let mine = id(&mut a);
    let fields = &by_id(&text(&a.cmd(&["CLIENT", "INFO"])))[&mine];
    assert_eq!(fields["flags"], "e");
    // RESET leaves it on, as in Redis.
    assert_eq!(a.cmd(&["RESET"]), Value::Simple("RESET".into()));
    direct.cmd(&["RESET"]);
    let flags = |c: &mut Client| {
        let info = text(&c.cmd(&["CLIENT", "INFO"]));
        let line = parse_list(&info).remove(0);
        line.into_iter().find(|(k, _)| k == "flags").unwrap().1
    };
    assert_eq!(flags(&mut a), flags(&mut direct));
    assert_eq!(flags(&mut a), "e");
    assert_eq!(
        a.cmd(&["CLIENT", "NO-EVICT", "off"]),
        Value::Simple("OK".into())
    );
    let fields = &by_id(&text(&a.cmd(&["CLIENT", "INFO"])))[&mine];
    assert_eq!(fields["flags"], "N");
}

/// `CLIENT UNBLOCK` names a client by its proxy id; the proxy unblocks
/// that client's command in Redis.
#[test]
fn client_unblock_reaches_the_blocked_client() {
    let (r, proxy) = Proxy::with_redis(CONFIG);
    let mut direct = r.client();
    let mut a = proxy.client();
    let mut b = proxy.client();
    let b_id = id(&mut b).to_string();
    b.send(&["BLPOP", "nothing", "0"]);
    wait_until("b is blocked", || {
        info_field(&mut a, "blocked_clients") == 1
    });
    assert_eq!(a.cmd(&["CLIENT", "UNBLOCK", &b_id]), Value::Int(1));
    assert_eq!(b.read_value(), Value::Nil);
    b.send(&["BLPOP", "nothing", "0"]);
    wait_until("b is blocked again", || {
        info_field(&mut a, "blocked_clients") == 1
    });
    assert_eq!(a.cmd(&["CLIENT", "UNBLOCK", &b_id, "ERROR"]), Value::Int(1));
    assert_eq!(
        b.read_value(),
        Value::Error("UNBLOCKED client unblocked via CLIENT UNBLOCK".into())
    );
    // A client not blocked, or none at all: 0; bad arguments as Redis.
    for args in [
        &["CLIENT", "UNBLOCK", &b_id][..],
        &["CLIENT", "UNBLOCK", "999999"],
        &["CLIENT", "UNBLOCK", "x"],
        &["CLIENT", "UNBLOCK", "1", "FOO"],
        &["CLIENT", "UNBLOCK", "1", "TIMEOUT", "x"],
    ] {
        assert_eq!(a.raw(args), direct.raw(args), "{args:?}");
    }
}

/// `CLIENT TRACKING ON REDIRECT id` with a proxy client's id: that client
/// gets the invalidation messages.
#[test]
fn tracking_redirects_to_the_proxy_client() {
    let (_r, proxy) = Proxy::with_redis(CONFIG);
    let mut listener = proxy.client();
    let listener_id = id(&mut listener).to_string();
    listener.cmd(&["SUBSCRIBE", "__redis__:invalidate"]);
    let mut tracker = proxy.client();
    assert_eq!(
        tracker.cmd(&["CLIENT", "TRACKING", "on", "REDIRECT", &listener_id]),
        Value::Simple("OK".into())
    );
    tracker.cmd(&["GET", "tracked"]);
    let mut writer = proxy.client();
    writer.cmd(&["SET", "tracked", "1"]);
    let msg = listener.read_value();
    assert_eq!(
        msg,
        Value::Array(vec![
            Value::bulk("message"),
            Value::bulk("__redis__:invalidate"),
            Value::bulks(&["tracked"]),
        ])
    );
    // A client that has only asked its id has no connection of its own to
    // Redis yet: named, it gets one, where its subscription then goes and
    // the invalidation messages come.
    let mut other = proxy.client();
    let other_id = id(&mut other).to_string();
    let mut t2 = proxy.client();
    assert_eq!(
        t2.cmd(&["CLIENT", "TRACKING", "on", "REDIRECT", &other_id]),
        Value::Simple("OK".into())
    );
    assert_eq!(
        t2.cmd(&["CLIENT", "GETREDIR"]),
        Value::Int(other_id.parse().unwrap())
    );
    t2.cmd(&["GET", "tracked2"]);
    other.cmd(&["SUBSCRIBE", "__redis__:invalidate"]);
    writer.cmd(&["SET", "tracked2", "1"]);
    assert_eq!(
        other.read_value(),
        Value::Array(vec![
            Value::bulk("message"),
            Value::bulk("__redis__:invalidate"),
            Value::bulks(&["tracked2"]),
        ])
    );
}

/// Redis's `RESP3 based basic redirect invalidation with client reply off`
/// (`unit/tracking`): the client named has sent only `HELLO 3` and `CLIENT
/// ID`, so it has no connection of its own to Redis when it is named. It
/// gets the invalidation as a push, in the same bytes as from Redis, with
/// its replies off (then on again) as with them on, and its replies are
/// right afterwards.
#[test]
fn tracking_redirects_to_a_resp3_client_without_a_connection() {
    let (r, proxy) = Proxy::with_redis(CONFIG);
    let mut writer = r.client();
    for reply_off in [true, false] {
        let mut seen = Vec::new();
        for through in [true, false] {
            let connect = || if through { proxy.client() } else { r.client() };
            let (mut target, mut tracker) = (connect(), connect());
            target.raw(&["HELLO", "3"]);
            let target_id = id(&mut target).to_string();
            let redirect = tracker.raw(&["CLIENT", "TRACKING", "on", "REDIRECT", &target_id]);
            assert_eq!(
                String::from_utf8_lossy(&redirect),
                "+OK\r\n",
                "through the proxy: {through}"
            );
            writer.cmd(&["SET", "foo", "bar"]);
            tracker.cmd(&["GET", "foo"]);
            if reply_off {
                target.send(&["CLIENT", "REPLY", "OFF"]);
            }
            writer.cmd(&["SET", "foo", "bar2"]);
            let push = target.read_raw();
            let next = if reply_off {
                target.raw(&["CLIENT", "REPLY", "ON"])
            } else {
                target.raw(&["GET", "foo"])
            };
            let pong = target.raw(&["PING"]);
            seen.push([redirect, push, next, pong].map(|b| String::from_utf8(b).unwrap()));
        }
        assert_eq!(
            seen[0],
            [
                "+OK\r\n",
                ">2\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\nfoo\r\n",
                if reply_off {
                    "+OK\r\n"
                } else {
                    "$4\r\nbar2\r\n"
                },
                "+PONG\r\n"
            ]
        );
        assert_eq!(seen[0], seen[1]);
    }
}

/// A redirect to an id no client of the proxy has (never had, or one that
/// has left) gets Redis's refusal, as directly.
#[test]
fn tracking_redirect_to_no_client_is_refused() {
    let (r, proxy) = Proxy::with_redis(CONFIG);
    let mut direct = r.client();
    let mut tracker = proxy.client();
    let mut gone = proxy.client();
    let gone_id = id(&mut gone).to_string();
    drop(gone);
    wait_until("the client has left", || {
        !by_id(&text(&tracker.cmd(&["CLIENT", "LIST"])))
            .contains_key(&gone_id.parse::<i64>().unwrap())
    });
    let refused = b"-ERR The client ID you want redirect to does not exist\r\n".to_vec();
    for target in ["999999", "0", "-3", &gone_id] {
        let args = ["CLIENT", "TRACKING", "on", "REDIRECT", target];
        // (The proxy's id of the client gone may be one Redis gives one of
        // its connections.)
        if target != gone_id {
            assert_eq!(direct.raw(&args), refused, "{target}");
        }
        assert_eq!(tracker.raw(&args), refused, "{target}");
    }
}

/// A client that names its own id (redis-py's
/// `client_tracking_on(clientid=…)` does) before it had a connection of its
/// own is tracked as on Redis: `+OK`, and in RESP3 the invalidation comes to
/// it as a push.
#[test]
fn tracking_redirects_to_the_client_itself() {
    let (r, proxy) = Proxy::with_redis(CONFIG);
    for resp3 in [false, true] {
        let (mut through, mut direct) = (proxy.client(), r.client());
        let mut writer = proxy.client();
        let mut replies = Vec::new();
        for c in [&mut through, &mut direct] {
            if resp3 {
                c.raw(&["HELLO", "3"]);
            }
            let me = id(c).to_string();
            replies.push(c.raw(&["CLIENT", "TRACKING", "on", "REDIRECT", &me]));
            c.cmd(&["GET", "self-tracked"]);
        }
        assert_eq!(
            replies[0],
            b"+OK\r\n",
            "{}",
            String::from_utf8_lossy(&replies[0])
        );
        assert_eq!(replies[0], replies[1]);
        writer.cmd(&["SET", "self-tracked", if resp3 { "3" } else { "2" }]);
        if resp3 {
            let push = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$12\r\nself-tracked\r\n";
            assert_eq!(through.read_raw(), push.to_vec());
            assert_eq!(direct.read_raw(), push.to_vec());
        }
    }
}

/// After `CLIENT TRACKING on REDIRECT id`, `CLIENT GETREDIR` and `CLIENT
/// TRACKINGINFO` show `id`, the proxy's id the client gave, as Redis shows
/// the one it was given (not Redis's id of the connection the proxy named),
/// also once that client is gone (`broken_redirect`).
#[test]
fn tracking_shows_the_redirect_id_the_client_gave() {
    let (_r, proxy) = Proxy::with_redis(CONFIG);
    let mut listener = proxy.client();
    let listener_id = id(&mut listener);
    listener.cmd(&["SUBSCRIBE", "__redis__:invalidate"]);
    let mut tracker = proxy.client();
    assert_eq!(
        tracker.cmd(&[
            "CLIENT",
            "TRACKING",
            "on",
            "REDIRECT",
            &listener_id.to_string()
        ]),
        Value::Simple("OK".into())
    );
    assert_eq!(
        tracker.cmd(&["CLIENT", "GETREDIR"]),
        Value::Int(listener_id)
    );
    // flags, redirect, prefixes: Redis's fields, with the proxy's id.
    let tracking = |c: &mut Client| match c.cmd(&["CLIENT", "TRACKINGINFO"]) {
        Value::Array(v) if v.len() == 6 => (v[1].clone(), v[3].clone()),
        other => panic!("TRACKINGINFO: {other:?}"),
    };
    let (flags, redirect) = tracking(&mut tracker);
    assert_eq!(flags, Value::bulks(&["on"]));
    assert_eq!(redirect, Value::Int(listener_id));
    // The redirect target goes; Redis notices when it next has to send it
    // something.
    drop(listener);
    tracker.cmd(&["GET", "tracked"]);
    let mut writer = proxy.client();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let flags = loop {
        writer.cmd(&["SET", "tracked", "1"]);
        tracker.cmd(&["GET", "tracked"]);
        let (flags, redirect) = tracking(&mut tracker);
        assert_eq!(redirect, Value::Int(listener_id));
        if flags != Value::bulks(&["on"]) || std::time::Instant::now() > deadline {
            break flags;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(flags, Value::bulks(&["on", "broken_redirect"]));
    assert_eq!(
        tracker.cmd(&["CLIENT", "GETREDIR"]),
        Value::Int(listener_id)
    );
    // Without a redirect, Redis's own answers.
    tracker.cmd(&["CLIENT", "TRACKING", "off"]);
    assert_eq!(tracker.cmd(&["CLIENT", "GETREDIR"]), Value::Int(-1));
    tracker.cmd(&["CLIENT", "TRACKING", "on"]);
    assert_eq!(tracker.cmd(&["CLIENT", "GETREDIR"]), Value::Int(0));
    let (_, redirect) = tracking(&mut tracker);
    assert_eq!(redirect, Value::Int(0));
    // In RESP3 the reply is a map, with the same field.
    let mut listener = proxy.client();
    let listener_id = id(&mut listener);
    listener.cmd(&["SUBSCRIBE", "__redis__:invalidate"]);
    tracker.cmd(&["CLIENT", "TRACKING", "off"]);
    tracker.cmd(&[
        "CLIENT",
        "TRACKING",
        "on",
        "REDIRECT",
        &listener_id.to_string(),
    ]);
    tracker.raw(&["HELLO", "3"]);
    let info = tracker.raw(&["CLIENT", "TRACKINGINFO"]);
    assert_eq!(
        String::from_utf8_lossy(&info),
        format!("%3\r\n$5\r\nflags\r\n~1\r\n$2\r\non\r\n$8\r\nredirect\r\n:{listener_id}\r\n$8\r\nprefixes\r\n*0\r\n")
    );
}

/// A blocking pop on a queue waits in the proxy, not in Redis: the client
/// still counts as blocked, and `CLIENT UNBLOCK` ends its wait as Redis
/// ends a blocked command's (a timeout's reply, or the UNBLOCKED error).
#[test]
fn a_client_waiting_on_a_queue_is_blocked() {
    let (r, proxy) = Proxy::with_redis(CONFIG);
    let mut a = proxy.client();
    let mut w = proxy.client();
    let w_id = id(&mut w);
    w.send(&["BRPOP", "jobs", "0"]);
    wait_until("the pop waits", || {
        info_field(&mut a, "blocked_clients") == 1
    });
    let list = text(&a.cmd(&["CLIENT", "LIST"]));
    let fields = &by_id(&list)[&w_id];
    assert_eq!(
        (fields["flags"].as_str(), fields["cmd"].as_str()),
        ("b", "brpop"),
        "{list}"
    );
    assert_eq!(
        a.cmd(&["CLIENT", "UNBLOCK", &w_id.to_string()]),
        Value::Int(1)
    );
    assert_eq!(w.read_raw(), b"*-1\r\n");
    assert_eq!(info_field(&mut a, "blocked_clients"), 0);

    w.send(&["BRPOP", "jobs", "0"]);
    wait_until("the pop waits again", || {
        info_field(&mut a, "blocked_clients") == 1
    });
    assert_eq!(
        a.cmd(&["CLIENT", "UNBLOCK", &w_id.to_string(), "error"]),
        Value::Int(1)
    );
    assert_eq!(
        w.read_value(),
        Value::Error("UNBLOCKED client unblocked via CLIENT UNBLOCK".into())
    );
    // Still a working client, whose next pop is served.
    let mut feeder = r.client();
    feeder.cmd(&["RPUSH", "jobs", "m"]);
    assert_eq!(w.cmd(&["BRPOP", "jobs", "0"]), Value::bulks(&["jobs", "m"]));

    w.send(&["BRPOP", "jobs", "0"]);
    wait_until("the pop waits once more", || {
        info_field(&mut a, "blocked_clients") == 1
    });
    assert_eq!(
        a.cmd(&["CLIENT", "KILL", "ID", &w_id.to_string()]),
        Value::Int(1)
    );
    assert!(closed(&mut w));
    assert_eq!(info_field(&mut a, "blocked_clients"), 0);
    wait_until("connected_clients is 1", || {
        info_field(&mut a, "connected_clients") == 1
    });
}
