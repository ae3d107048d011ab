//! Clients that identify themselves on connect (CLIENT SETINFO, SETNAME)
//! and speak RESP3 (HELLO 3), as redis-py 5 and later do by default, keep
//! sharing the proxy's upstream connections; their replies are what Redis
//! gives a direct client, byte for byte.

use crate::common::*;

const CONFIG: &str = r#"
[[queue]]
pattern = "jobs"
ack_id = "payload"
lease_ms = 600000
"#;

fn same(direct: &mut Client, proxied: &mut Client, args: &[&str]) -> Vec<u8> {
    let d = direct.raw(args);
    let p = proxied.raw(args);
    assert_eq!(
        mask_hello_id(&p),
        mask_hello_id(&d),
        "reply to {args:?} differs from Redis's"
    );
    p
}

fn dedicated() -> String {
    series("ackproxy_upstream_connections", &[("kind", "dedicated")])
}

/// What redis-py sends on connect, then a worker's loop: ten clients, no
/// dedicated upstream connection.
#[test]
fn self_identifying_resp3_clients_share_connections() {
    let a = Redis::start();
    let b = Redis::start();
    let (proxy, m) = Proxy::start_with_metrics(b.port, CONFIG);
    let mut clients = Vec::new();
    for i in 0..10 {
        let mut d = a.client();
        let mut p = proxy.client();
        for cmd in [
            &["HELLO", "3"][..],
            &["CLIENT", "SETINFO", "LIB-NAME", "redis-py"],
            &["CLIENT", "SETINFO", "LIB-VER", "5.2.1"],
            &["CLIENT", "GETNAME"],
            &["CLIENT", "SETNAME", &format!("worker-{i}")],
            &["CLIENT", "GETNAME"],
            &["CLIENT", "SETNAME", "bad name"],
            &["CLIENT", "SETNAME"],
            &["SET", &format!("k{i}"), "v"],
            &["GET", &format!("k{i}")],
            &["GET", "missing"],
            &["HSET", "h", "f", "1"],
            &["HGETALL", "h"],
            &["INCRBYFLOAT", "n", "1"],
            &["LPUSH", "jobs", &format!("m{i}")],
        ] {
            same(&mut d, &mut p, cmd);
        }
        // The queue's reply in the client's protocol (its message is its
        // own, since each client pushes one and pops one in turn).
        assert_eq!(
            same(&mut d, &mut p, &["RPOP", "jobs"]),
            format!("$2\r\nm{i}\r\n").into_bytes()
        );
        assert_eq!(p.raw(&["ACK", "jobs", &format!("m{i}")]), b":1\r\n");
        clients.push((d, p));
    }
    // A pipeline, as redis-py sends its connect commands with a command.
    let mut d = a.client();
    let mut p = proxy.client();
    let hello = Client::encode(&[b"HELLO", b"3", b"SETNAME", b"piped"]);
    let mut bytes = hello;
    bytes.extend(Client::encode(&[b"GET", b"missing"]));
    bytes.extend(Client::encode(&[b"CLIENT", b"GETNAME"]));
    bytes.extend(Client::encode(&[b"HGETALL", b"h"]));
    d.send_raw(&bytes);
    p.send_raw(&bytes);
    for what in ["HELLO", "GET", "GETNAME", "HGETALL"] {
        assert_eq!(
            mask_hello_id(&p.read_raw()),
            mask_hello_id(&d.read_raw()),
            "{what}"
        );
    }
    let body = scrape(m).expect("metrics");
    assert_eq!(series_value(&body, &dedicated()), Some(0.0), "{body}");
    drop(clients);
}

/// A client that needs a dedicated connection after all (MULTI) takes its
/// name and protocol there: Redis's CLIENT LIST shows the name, replies
/// stay RESP3. RESET forgets both.
#[test]
fn metadata_follows_a_client_to_its_dedicated_connection() {
    let a = Redis::start();
    let b = Redis::start();
    let proxy = Proxy::start(b.port, &[]);
    let mut d = a.client();
    let mut p = proxy.client();
    same(&mut d, &mut p, &["HELLO", "3", "SETNAME", "w1"]);
    same(&mut d, &mut p, &["HSET", "h", "f", "1"]);
    for cmd in [
        &["MULTI"][..],
        &["HGETALL", "h"],
        &["CLIENT", "GETNAME"],
        &["EXEC"],
    ] {
        same(&mut d, &mut p, cmd);
    }
    let mut admin = b.client();
    let list = String::from_utf8_lossy(&admin.raw(&["CLIENT", "LIST"])).into_owned();
    assert!(
        list.lines()
            .any(|l| l.contains(" name=w1 ") && l.trim_end().ends_with(" resp=3")),
        "{list}"
    );
    same(&mut d, &mut p, &["CLIENT", "SETNAME", "w2"]);
    same(&mut d, &mut p, &["CLIENT", "GETNAME"]);
    same(&mut d, &mut p, &["RESET"]);
    for cmd in [
        &["CLIENT", "GETNAME"][..],
        &["GET", "missing"],
        &["HGETALL", "h"],
        &["HELLO"],
        &["HELLO", "2", "SETNAME", "x y"],
        &["HELLO", "4"],
        &["HELLO", "3", "FOO"],
    ] {
        same(&mut d, &mut p, cmd);
    }
}

/// redis-py itself, with its default settings, when it is installed.
#[test]
fn redis_py_workers_share_connections() {
    if !redis_py_installed() {
        return;
    }
    let b = Redis::start();
    let (proxy, m) = Proxy::start_with_metrics(b.port, CONFIG);
    let script = r#"
import sys, urllib.request, redis
port, metrics = int(sys.argv[1]), sys.argv[2]
clients = []
for i in range(10):
    r = redis.Redis(port=port, socket_timeout=30)
    r.set(f"k{i}", "v")
    assert r.get(f"k{i}") == b"v"
    assert r.get("missing") is None
    r.lpush("jobs", f"m{i}")
    m = r.rpop("jobs")
    assert m == f"m{i}".encode(), m
    assert r.execute_command("ACK", "jobs", m) == 1
    r.client_setname(f"w{i}")
    assert r.client_getname() in (f"w{i}", f"w{i}".encode())
    clients.append(r)
body = urllib.request.urlopen(f"http://{metrics}/metrics").read().decode()
line = [l for l in body.splitlines() if l.startswith('ackproxy_upstream_connections{kind="dedicated"}')]
print(line)
assert line == ['ackproxy_upstream_connections{kind="dedicated"} 0'], line
"#;
    python(
        script,
        &[&proxy.port.to_string(), &format!("127.0.0.1:{m}")],
    );
}
