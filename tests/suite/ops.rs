//! The operations server: `/metrics`, the queue API (its numbers against
//! the proxy's own `QUEUE INFO`/`LEASES`, status codes, the admin token),
//! the loopback rule, the Grafana dashboard against a live scrape, and the
//! web view driven in headless Chromium through chromedriver.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{free_port, http, int, Client, HttpReply, Proxy, Redis, Value};
use serde_json::{json, Value as Json};

const TOKEN: &str = "s3cret-ops-token";

/// `jobs` keeps its leases for the whole test; `fragile` dead-letters a
/// message whose first lease runs out.
const RULES: &str = r#"
[[queue]]
pattern = "jobs"
ack_id = "json:id"

[[queue]]
pattern = "tasks:*"

[[queue]]
pattern = "fragile"
ack_id = "json:id"
lease_ms = 50
max_deliveries = 1
"#;

/// Fields drop in order: the proxy goes before its Redis.
struct Setup {
    proxy: Proxy,
    redis: Redis,
    ops: u16,
}

fn start(top: &str) -> Setup {
    let redis = Redis::start();
    let toml = format!("{top}\n{RULES}");
    let (proxy, ops) = Proxy::start_with_metrics(redis.port, &toml);
    Setup { proxy, redis, ops }
}

fn with_token() -> Setup {
    start(&format!("admin_token = \"{TOKEN}\""))
}

fn get(port: u16, path: &str) -> HttpReply {
    http(port, "GET", path, &[], b"").expect("operations server answers")
}

fn post(port: u16, path: &str, headers: &[(&str, &str)]) -> HttpReply {
    http(port, "POST", path, headers, b"").expect("operations server answers")
}

fn json_of(r: &HttpReply) -> Json {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.text()))
}

fn text(v: &Value) -> String {
    match v {
        Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Simple(s) | Value::Error(s) => s.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

/// A RESP2 flat map reply (`QUEUE INFO`, one lease) as name → value.
fn map_of(v: &Value) -> BTreeMap<String, Value> {
    let Value::Array(items) = v else {
        panic!("not a map reply: {v:?}")
    };
    items
        .chunks(2)
        .map(|kv| (text(&kv[0]), kv[1].clone()))
        .collect()
}

fn queue_info(c: &mut Client, key: &str) -> BTreeMap<String, Value> {
    map_of(&c.cmd(&["QUEUE", "INFO", key]))
}

/// The API's view of a queue equals `QUEUE INFO` read just before and
/// after it: every field the same, the oldest lease's age in between.
fn assert_info_matches(
    api: &Json,
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
) {
    let api = api.as_object().expect("info is an object");
    assert_eq!(
        api.keys().collect::<BTreeSet<_>>(),
        before.keys().collect::<BTreeSet<_>>(),
        "the API reports every QUEUE INFO field"
    );
    for (name, v) in before {
        match v {
            Value::Int(_) if name == "oldest-lease-age-ms" => {
                let got = api[name].as_i64().unwrap();
                assert!(
                    (int(v)..=int(&after[name])).contains(&got),
                    "{name}: {got} outside {v:?}..{:?}",
                    after[name]
                );
            }
            Value::Int(n) => assert_eq!(api[name], json!(n), "{name}"),
            Value::Array(items) => {
                let want: Vec<String> = items.iter().map(text).collect();
                assert_eq!(api[name], json!(want), "{name}");
            }
            other => assert_eq!(api[name], json!(text(other)), "{name}"),
        }
    }
}

fn fill(c: &mut Client) {
    for id in 1..=3 {
        c.cmd(&["LPUSH", "jobs", &format!("{{\"id\":\"{id}\"}}")]);
    }
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk("{\"id\":\"1\"}"));
    c.cmd(&["RPUSH", "tasks:a", "x", "y"]);
    c.cmd(&["RPUSH", "tasks:b", "p", "q"]);
    assert_eq!(c.cmd(&["RPOP", "tasks:b"]), Value::bulk("q"));
    // Matches the glob but is no list: not a queue the view lists.
    c.cmd(&["HSET", "tasks:meta", "f", "v"]);
    c.cmd(&["RPUSH", "unrelated", "z"]);
}

#[test]
fn the_queue_list_reports_what_queue_info_says() {
    let s = with_token();
    let mut c = s.proxy.client();
    fill(&mut c);
    let before: BTreeMap<&str, _> = ["jobs", "tasks:a", "tasks:b"]
        .into_iter()
        .map(|k| (k, queue_info(&mut c, k)))
        .collect();
    let r = get(s.ops, "/api/queues");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("application/json"));
    let after: BTreeMap<&str, _> = before.keys().map(|&k| (k, queue_info(&mut c, k))).collect();
    let body = json_of(&r);
    assert_eq!(body["admin_actions"], json!(true));
    let rules = body["rules"].as_array().unwrap();
    let patterns: Vec<_> = rules
        .iter()
        .map(|r| r["pattern"].as_str().unwrap())
        .collect();
    assert_eq!(patterns, ["jobs", "tasks:*", "fragile"]);
    let mut listed = Vec::new();
    for rule in rules {
        assert_eq!(rule["truncated"], json!(false));
        for q in rule["queues"].as_array().unwrap() {
            let key = q["key"].as_str().unwrap();
            listed.push(key.to_string());
            if let Some(b) = before.get(key) {
                assert_info_matches(&q["info"], b, &after[key]);
            }
        }
    }
    // Exact names are always listed; glob rules list their lists only.
    assert_eq!(listed, ["jobs", "tasks:a", "tasks:b", "fragile"]);
    // Totals per rule are the exporter's counters.
    let jobs = &rules[0];
    assert_eq!(jobs["totals"]["pops"], json!(1));
    assert_eq!(rules[1]["totals"]["pops"], json!(1));
    assert_eq!(
        crate::common::metric(s.ops, "ackproxy_pops_total{rule=\"tasks:*\"}"),
        1.0
    );
    assert_eq!(jobs["lease_ms"], json!(30000));
    assert_eq!(jobs["key_limit"], json!(200));
}

#[test]
fn one_queue_its_leases_and_errors_as_the_proxy_gives_them() {
    let s = with_token();
    let mut c = s.proxy.client();
    fill(&mut c);
    c.cmd(&["RPUSH", "tasks:a/b", "m1", "m2", "m3"]);

    let before = queue_info(&mut c, "jobs");
    let r = get(s.ops, "/api/queues/jobs");
    let after = queue_info(&mut c, "jobs");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_info_matches(&json_of(&r), &before, &after);
    assert_eq!(int(&before["leased"]), 1);
    // The library flushed behind the proxy's back is loaded again.
    assert_eq!(
        s.redis.client().cmd(&["FUNCTION", "FLUSH"]),
        Value::Simple("OK".into())
    );
    let r = get(s.ops, "/api/queues/jobs");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(json_of(&r)["leased"], json!(1));

    // A key with `/` travels percent-encoded.
    let r = get(s.ops, "/api/queues/tasks%3Aa%2Fb");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(json_of(&r)["ready"], json!(3));

    let r = get(s.ops, "/api/queues/jobs/leases?count=5");
    assert_eq!(r.status, 200, "{}", r.text());
    let api = json_of(&r);
    let Value::Array(leases) = c.cmd(&["QUEUE", "LEASES", "jobs", "COUNT", "5"]) else {
        panic!("LEASES is an array")
    };
    assert_eq!(api.as_array().unwrap().len(), leases.len());
    assert_eq!(leases.len(), 1);
    for (a, l) in api.as_array().unwrap().iter().zip(&leases) {
        let l = map_of(l);
        assert_eq!(a["id"], json!(text(&l["id"])));
        assert_eq!(a["id"], json!("1"));
        assert_eq!(a["payload"], json!(text(&l["payload"])));
        assert_eq!(a["deliveries"], json!(int(&l["deliveries"])));
        assert!(a["expires-in-ms"].as_i64().unwrap() <= 30_000);
    }

    // Errors are the proxy's own text, with a status saying why.
    let not_queue = text(&c.cmd(&["QUEUE", "INFO", "unrelated"]));
    let r = get(s.ops, "/api/queues/unrelated");
    assert_eq!(r.status, 404);
    assert_eq!(json_of(&r), json!({ "error": not_queue }));
    let bad_count = text(&c.cmd(&["QUEUE", "LEASES", "jobs", "COUNT", "0"]));
    let r = get(s.ops, "/api/queues/jobs/leases?count=0");
    assert_eq!(r.status, 400);
    assert_eq!(json_of(&r), json!({ "error": bad_count }));
    assert_eq!(get(s.ops, "/api/nothing-here").status, 404);

    // Dead letters come from QUEUE DEAD: until the proxy has it, its error
    // passes through as 501 with the proxy's text.
    let direct = c.cmd(&["QUEUE", "DEAD", "jobs", "COUNT", "10"]);
    let r = get(s.ops, "/api/queues/jobs/dead?count=10");
    match direct {
        Value::Error(e) if e.contains("unknown subcommand") => {
            assert_eq!(r.status, 501);
            assert_eq!(json_of(&r), json!({ "error": e }));
        }
        Value::Error(e) => panic!("QUEUE DEAD jobs: {e}"),
        Value::Array(items) => {
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(json_of(&r).as_array().unwrap().len(), items.len());
        }
        other => panic!("QUEUE DEAD jobs: {other:?}"),
    }
}

#[test]
fn an_unreachable_redis_is_reported_not_hidden() {
    let mut s = start("");
    let mut c = s.proxy.client();
    fill(&mut c);
    s.redis.kill();
    let r = get(s.ops, "/api/queues/jobs");
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(json_of(&r)["error"]
        .as_str()
        .unwrap()
        .starts_with("ERR upstream unavailable"));
    let r = get(s.ops, "/api/queues");
    assert_eq!(r.status, 200, "{}", r.text());
    let body = json_of(&r);
    let jobs = &body["rules"][0]["queues"][0];
    assert_eq!(jobs["key"], json!("jobs"));
    assert!(
        jobs["error"].as_str().unwrap().contains("upstream"),
        "{jobs}"
    );
    let tasks = &body["rules"][1];
    assert!(tasks["scan_error"].as_str().is_some(), "{tasks}");
    // What the proxy knows without Redis is still listed: tasks:b has a
    // lease taken through it.
    assert_eq!(tasks["queues"][0]["key"], json!("tasks:b"));
}

#[test]
fn actions_are_refused_without_a_configured_token() {
    let s = start("");
    for path in [
        "/api/queues/jobs/redrive",
        "/api/queues/jobs/purge",
        "/api/queues/jobs/dead/retry",
        "/api/queues/jobs/dead/delete",
        "/api/login",
    ] {
        let r = post(
            s.ops,
            path,
            &[("Authorization", &format!("Bearer {TOKEN}"))],
        );
        assert_eq!(r.status, 403, "{path}");
        assert!(json_of(&r)["error"]
            .as_str()
            .unwrap()
            .contains("admin_token"));
    }
    assert_eq!(
        json_of(&get(s.ops, "/api/queues"))["admin_actions"],
        json!(false)
    );
    assert_eq!(
        json_of(&get(s.ops, "/api/session")),
        json!({"admin_actions": false, "logged_in": false, "csrf": null})
    );
}

#[test]
fn actions_need_the_bearer_token() {
    let s = with_token();
    let mut c = s.proxy.client();
    for path in [
        "/api/queues/jobs/redrive",
        "/api/queues/jobs/purge",
        "/api/queues/jobs/dead/retry",
        "/api/queues/jobs/dead/delete",
    ] {
        for headers in [
            vec![],
            vec![("Authorization", "Bearer wrong-token")],
            vec![("Authorization", "Basic s3cret-ops-token")],
            vec![("Authorization", "Bearer s3cret-ops-toke")],
        ] {
            let r = post(s.ops, path, &headers);
            assert_eq!(r.status, 401, "{path} {headers:?}");
            assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        }
        // Reading is not acting: a GET is not allowed on an action.
        assert_eq!(get(s.ops, path).status, 405);
    }
    // With the token, the request is the proxy's QUEUE command, whose
    // reply (or error, until the command exists) comes back as it is.
    let bearer = format!("Bearer {TOKEN}");
    for (path, cmd) in [
        (
            "/api/queues/jobs/redrive?count=1",
            vec!["QUEUE", "REDRIVE", "jobs", "COUNT", "1"],
        ),
        (
            "/api/queues/jobs/purge",
            vec!["QUEUE", "PURGE", "jobs", "DEAD"],
        ),
    ] {
        let r = post(s.ops, path, &[("Authorization", &bearer)]);
        match c.cmd(&cmd) {
            Value::Error(e) if e.contains("unknown subcommand") => {
                assert_eq!(r.status, 501, "{path}");
                assert_eq!(json_of(&r), json!({ "error": e }));
            }
            Value::Error(e) => panic!("{cmd:?}: {e}"),
            _ => assert_eq!(r.status, 200, "{path}: {}", r.text()),
        }
    }
}

fn post_json(port: u16, path: &str, headers: &[(&str, &str)], body: &Json) -> HttpReply {
    let mut h = vec![("Content-Type", "application/json")];
    h.extend_from_slice(headers);
    http(port, "POST", path, &h, body.to_string().as_bytes()).expect("operations server answers")
}

/// `name=value` of the session cookie a reply sets, and the whole header.
fn session_cookie(r: &HttpReply) -> (String, String) {
    let set = r
        .header("set-cookie")
        .unwrap_or_else(|| panic!("no Set-Cookie: {}", r.text()))
        .to_string();
    let pair = set.split(';').next().unwrap().trim().to_string();
    (pair, set)
}

/// The admin token, given once to `/api/login`, becomes a session cookie
/// (HttpOnly, SameSite=Strict) that authorises actions only with the
/// session's CSRF token beside it and only from this origin; logging out
/// ends it.
#[test]
fn the_admin_token_logs_in_as_a_session() {
    let s = with_token();
    let anonymous = json_of(&get(s.ops, "/api/session"));
    assert_eq!(
        anonymous,
        json!({"admin_actions": true, "logged_in": false, "csrf": null})
    );

    let wrong = post_json(s.ops, "/api/login", &[], &json!({"token": "guess"}));
    assert_eq!(wrong.status, 401, "{}", wrong.text());
    assert_eq!(wrong.header("set-cookie"), None);
    // A form another site's page could post is no login.
    let form = http(
        s.ops,
        "POST",
        "/api/login",
        &[("Content-Type", "text/plain")],
        format!("{{\"token\": \"{TOKEN}\"}}").as_bytes(),
    )
    .unwrap();
    assert_eq!(form.status, 415, "{}", form.text());
    assert_eq!(form.header("set-cookie"), None);
    for cross in [
        ("Origin", "http://evil.example"),
        ("Sec-Fetch-Site", "cross-site"),
    ] {
        let r = post_json(s.ops, "/api/login", &[cross], &json!({ "token": TOKEN }));
        assert_eq!(r.status, 403, "{cross:?}: {}", r.text());
        assert_eq!(r.header("set-cookie"), None);
    }

    let origin = format!("http://127.0.0.1:{}", s.ops);
    let ok = post_json(
        s.ops,
        "/api/login",
        &[("Origin", &origin), ("Sec-Fetch-Site", "same-origin")],
        &json!({ "token": TOKEN }),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    let (cookie, set) = session_cookie(&ok);
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.split("; ").any(|a| a == attr), "{attr} in {set}");
    }
    assert!(
        cookie.starts_with("ackproxy_session=") && cookie.len() > 40,
        "{cookie}"
    );
    let csrf = json_of(&ok)["csrf"].as_str().unwrap().to_string();
    assert!(csrf.len() >= 32, "{csrf}");
    assert!(!cookie.contains(&csrf) && !set.contains(TOKEN));
    assert_eq!(
        json_of(&http(s.ops, "GET", "/api/session", &[("Cookie", &cookie)], b"").unwrap()),
        json!({"admin_actions": true, "logged_in": true, "csrf": csrf})
    );

    let redrive = "/api/queues/jobs/redrive";
    // The cookie alone is not enough: a page elsewhere could make the
    // browser send it (were it not SameSite), never the CSRF token.
    for headers in [
        vec![("Cookie", cookie.as_str())],
        vec![("Cookie", cookie.as_str()), ("X-CSRF-Token", "0123")],
        vec![("X-CSRF-Token", csrf.as_str())],
        vec![
            ("Cookie", "ackproxy_session=forged"),
            ("X-CSRF-Token", csrf.as_str()),
        ],
    ] {
        let r = post(s.ops, redrive, &headers);
        assert_eq!(r.status, 401, "{headers:?}: {}", r.text());
    }
    let both = [("Cookie", cookie.as_str()), ("X-CSRF-Token", csrf.as_str())];
    for cross in [
        ("Origin", "http://evil.example"),
        ("Origin", "null"),
        ("Sec-Fetch-Site", "same-site"),
    ] {
        let mut h = both.to_vec();
        h.push(cross);
        let r = post(s.ops, redrive, &h);
        assert_eq!(r.status, 403, "{cross:?}: {}", r.text());
    }
    let mut same = both.to_vec();
    same.push(("Origin", &origin));
    let r = post(s.ops, redrive, &same);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(json_of(&r), json!(0));

    // Logging out ends the session for good, whatever the browser keeps.
    let out = post(s.ops, "/api/logout", &[("Cookie", &cookie)]);
    assert_eq!(out.status, 200);
    let (cleared, set) = session_cookie(&out);
    assert_eq!(cleared, "ackproxy_session=");
    assert!(set.contains("Max-Age=0"), "{set}");
    assert_eq!(post(s.ops, redrive, &same).status, 401);
    assert_eq!(
        json_of(&http(s.ops, "GET", "/api/session", &[("Cookie", &cookie)], b"").unwrap())
            ["logged_in"],
        json!(false)
    );
}

/// `dead` letters of `queue` as `QUEUE DEAD` lists them: (id, payload).
fn dead_of(c: &mut Client, queue: &str) -> Vec<(Option<String>, String)> {
    let Value::Array(letters) = c.cmd(&["QUEUE", "DEAD", queue, "COUNT", "100"]) else {
        panic!("QUEUE DEAD {queue}")
    };
    letters
        .iter()
        .map(|l| {
            let m = map_of(l);
            let id = match &m["id"] {
                Value::Nil => None,
                v => Some(text(v)),
            };
            (id, text(&m["payload"]))
        })
        .collect()
}

/// Pushes `payloads` to `queue`, whose rule allows one delivery, pops and
/// NACKs each: dead letters, oldest first.
fn kill(c: &mut Client, queue: &str, payloads: &[&str]) {
    for p in payloads {
        c.cmd(&["LPUSH", queue, p]);
        assert_eq!(c.cmd(&["RPOP", queue]), Value::bulk(p));
        let id = serde_json::from_str::<Json>(p)
            .ok()
            .and_then(|v| v["id"].as_str().map(String::from))
            .unwrap_or_else(|| p.to_string());
        assert_eq!(c.cmd(&["NACK", queue, &id]), Value::Int(1), "{p}");
    }
}

fn list(c: &mut Client, key: &str) -> Vec<String> {
    let Value::Array(items) = c.cmd(&["LRANGE", key, "0", "-1"]) else {
        panic!("LRANGE {key}")
    };
    items.iter().map(text).collect()
}

const SHARED_RULES: &str = r#"
[[queue]]
pattern = "dl:*"
max_deliveries = 1
dead_letter = "dead-dl"
"#;

/// Retry and delete of one dead letter act on exactly the letter named by
/// its id and whole payload, on this queue's letters only where the list
/// is shared; a search by id finds leases and dead letters.
#[test]
fn one_dead_letter_is_retried_or_deleted_by_its_id_and_payload() {
    let s = start(&format!("admin_token = \"{TOKEN}\"\n{SHARED_RULES}"));
    let mut c = s.proxy.client();
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("Authorization", bearer.as_str())];
    let letters = [r#"{"id":"d1"}"#, r#"{"id":"d2","n":2}"#, r#"{"id":"d3"}"#];
    kill(&mut c, "fragile", &letters);
    // A second copy of d1's payload under another id is another letter.
    let all = dead_of(&mut c, "fragile");
    assert_eq!(all.len(), 3);
    let letter = |id: &str, payload: &str| json!({"id": id, "payload": payload});
    let retry = "/api/queues/fragile/dead/retry";
    let delete = "/api/queues/fragile/dead/delete";

    // Search by id: exactly the one, among leases and dead letters.
    let found = json_of(&get(s.ops, "/api/queues/fragile/dead?id=d2"));
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found[0]["payload"], json!(letters[1]));
    assert_eq!(
        json_of(&get(s.ops, "/api/queues/fragile/dead?id=d9")),
        json!([])
    );
    let leased = json_of(&get(s.ops, "/api/queues/jobs/leases?id=1"));
    assert_eq!(leased, json!([]));
    c.cmd(&["LPUSH", "jobs", r#"{"id":"7"}"#]);
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk(r#"{"id":"7"}"#));
    let leased = json_of(&get(s.ops, "/api/queues/jobs/leases?id=7"));
    assert_eq!(leased.as_array().unwrap().len(), 1, "{leased}");
    assert_eq!(leased[0]["id"], json!("7"));

    // A wrong id, a payload that differs by a byte, one that is only a
    // prefix: nothing happens.
    for wrong in [
        letter("d1", letters[1]),
        letter("d2", r#"{"id":"d2","n":3}"#),
        letter("d2", r#"{"id":"d2""#),
        json!({"id": null, "payload": letters[1]}),
    ] {
        for path in [retry, delete] {
            let r = post_json(s.ops, path, &auth, &wrong);
            assert_eq!(r.status, 404, "{path} {wrong}: {}", r.text());
        }
    }
    assert_eq!(dead_of(&mut c, "fragile"), all);
    assert_eq!(list(&mut c, "fragile"), Vec::<String>::new());

    // Retry: that letter, and no other, is a new message of the queue.
    let r = post_json(s.ops, retry, &auth, &letter("d2", letters[1]));
    assert_eq!((r.status, json_of(&r)), (200, json!(1)), "{}", r.text());
    assert_eq!(list(&mut c, "fragile"), vec![letters[1].to_string()]);
    assert_eq!(
        dead_of(&mut c, "fragile"),
        vec![all[0].clone(), all[2].clone()]
    );
    // Done once: the same request again finds nothing.
    assert_eq!(
        post_json(s.ops, retry, &auth, &letter("d2", letters[1])).status,
        404
    );
    let info = queue_info(&mut c, "fragile");
    assert_eq!((int(&info["dead"]), int(&info["redriven"])), (2, 1));

    // Delete: gone, the rest stays.
    let r = post_json(s.ops, delete, &auth, &letter("d3", letters[2]));
    assert_eq!((r.status, json_of(&r)), (200, json!(1)), "{}", r.text());
    assert_eq!(dead_of(&mut c, "fragile"), vec![all[0].clone()]);
    assert_eq!(list(&mut c, "fragile"), vec![letters[1].to_string()]);

    // A bad body is refused, once authorised.
    let r = http(s.ops, "POST", delete, &auth, b"{\"id\": 1}").unwrap();
    assert_eq!(r.status, 400, "{}", r.text());

    // A shared list: dl:a and dl:b's letters side by side, and one that
    // something else put there, with no history.
    kill(&mut c, "dl:a", &["a-1"]);
    kill(&mut c, "dl:b", &["b-1"]);
    c.cmd(&["RPUSH", "dead-dl", "stray"]);
    let shared = dead_of(&mut c, "dl:a");
    let id_a = shared[0].0.clone().expect("dl:a's letter has its history");
    assert_eq!(shared[0].1, "a-1");
    assert_eq!(
        shared[1],
        (None, "b-1".to_string()),
        "dl:b's history is not dl:a's"
    );
    let id_b = dead_of(&mut c, "dl:b")[1]
        .0
        .clone()
        .expect("dl:b's history");
    // dl:b's letter through dl:a, under dl:b's own id: not dl:a's.
    for path in [
        "/api/queues/dl:a/dead/retry",
        "/api/queues/dl:a/dead/delete",
    ] {
        let r = post_json(s.ops, path, &auth, &letter(&id_b, "b-1"));
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        // Without an id it could be anyone's: refused, as REDRIVE is.
        for payload in ["b-1", "stray"] {
            let r = post_json(s.ops, path, &auth, &json!({"id": null, "payload": payload}));
            assert_eq!(r.status, 502, "{path}: {}", r.text());
            let e = json_of(&r)["error"].as_str().unwrap().to_string();
            assert!(
                e.contains("is shared") && e.contains("without an id"),
                "{e}"
            );
        }
    }
    assert_eq!(list(&mut c, "dead-dl"), ["a-1", "b-1", "stray"]);
    let r = post_json(
        s.ops,
        "/api/queues/dl:a/dead/retry",
        &auth,
        &letter(&id_a, "a-1"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(list(&mut c, "dead-dl"), ["b-1", "stray"]);
    assert_eq!(list(&mut c, "dl:a"), ["a-1"]);
    assert_eq!(list(&mut c, "dl:b"), Vec::<String>::new());
    // The same through QUEUE, as any client with the rights may send it.
    assert_eq!(
        c.cmd(&["QUEUE", "PURGE", "dl:b", "DEAD", "ID", &id_b, "b-1"]),
        Value::Int(1)
    );
    assert_eq!(list(&mut c, "dead-dl"), ["stray"]);
    for bad in [
        &["QUEUE", "REDRIVE", "dl:b", "IX", "1", "p"][..],
        &["QUEUE", "PURGE", "dl:b", "DEAD", "IX", "1", "p"],
        &["QUEUE", "PURGE", "dl:b", "DEED", "ID", "1", "p"],
    ] {
        assert_eq!(
            c.cmd(bad),
            Value::Error("ERR syntax error".into()),
            "{bad:?}"
        );
    }
}

#[test]
fn pages_are_served_for_addresses_and_localhost_only() {
    let s = start("");
    let r = get(s.ops, "/");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(r.header("content-security-policy").is_some());
    assert!(r.text().contains("<title>ackproxy"));
    let localhost = format!("localhost:{}", s.ops);
    assert_eq!(
        http(s.ops, "GET", "/", &[("Host", &localhost)], b"")
            .unwrap()
            .status,
        200
    );
    // A name re-pointed at 127.0.0.1 by someone else's DNS is refused.
    for path in ["/", "/api/queues", "/metrics"] {
        let r = http(s.ops, "GET", path, &[("Host", "ops.attacker.example")], b"").unwrap();
        assert_eq!(r.status, 403, "{path}");
    }
    let r = get(s.ops, "/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(r.text().contains("ackproxy_connections_open "));
}

fn ackproxy(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ackproxy"))
        .args(args)
        .env_remove("ACKPROXY_ADMIN_TOKEN")
        .env_remove("ACKPROXY_OPS_PUBLIC")
        .envs(env.iter().copied())
        .output()
        .expect("ackproxy runs")
}

#[test]
fn a_public_operations_address_must_be_asked_for() {
    let listen = format!("127.0.0.1:{}", free_port());
    let public = format!("0.0.0.0:{}", free_port());
    let base = ["--listen", &listen, "--upstream", "127.0.0.1:1"];
    for check in [true, false] {
        let mut args = base.to_vec();
        args.extend(["--metrics", &public]);
        if check {
            args.push("--check-config");
        }
        let out = ackproxy(&args, &[]);
        assert_eq!(out.status.code(), Some(2), "check {check}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not a loopback address") && err.contains("ops_public"),
            "{err}"
        );
    }
    let mut args = base.to_vec();
    args.extend(["--metrics", &public, "--ops-public", "--check-config"]);
    let out = ackproxy(&args, &[("ACKPROXY_ADMIN_TOKEN", TOKEN)]);
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{summary}");
    assert!(summary.contains("public allowed"), "{summary}");
    assert!(summary.contains("admin token         set"), "{summary}");
    assert!(!summary.contains(TOKEN), "{summary}");
}

#[test]
fn glob_rules_list_a_bounded_number_of_keys() {
    let s = start("");
    let mut r = Client::connect(s.redis.port);
    let n = 250;
    for i in 0..n {
        r.send(&["RPUSH", &format!("tasks:{i:03}"), "m"]);
    }
    for _ in 0..n {
        assert_eq!(r.read_value(), Value::Int(1));
    }
    let body = json_of(&get(s.ops, "/api/queues"));
    let tasks = &body["rules"][1];
    assert_eq!(tasks["pattern"], json!("tasks:*"));
    assert_eq!(tasks["truncated"], json!(true));
    let queues = tasks["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 200);
    assert!(queues.iter().all(|q| q["info"]["ready"] == json!(1)));
}

/// Every `ackproxy_*` name in the dashboard's expressions is a series the
/// proxy exports (histogram suffixes stripped).
#[test]
fn the_dashboard_uses_only_exported_metrics() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config");
    let dash: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("grafana-dashboard.json")).unwrap())
            .expect("the dashboard is JSON");
    assert_eq!(dash["__inputs"][0]["name"], json!("DS_PROMETHEUS"));
    let mut exprs = Vec::new();
    collect_queries(&dash, &mut exprs);
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.iter().filter(|p| p["type"] != json!("row")).count() >= 10);
    assert!(exprs.len() >= 15, "{exprs:?}");

    let s = start("");
    let mut c = s.proxy.client();
    fill(&mut c);
    let scrape = get(s.ops, "/metrics").text();
    let exported: BTreeSet<String> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect();
    let mut used = BTreeSet::new();
    for e in &exprs {
        for name in metric_names(e) {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| exported.contains(*b)))
                .unwrap_or(&name)
                .to_string();
            assert!(
                exported.contains(&base),
                "{name} (in {e}) is not exported; the scrape has {exported:?}"
            );
            used.insert(base);
        }
    }
    // Each queue counter and the connection series have a panel.
    for name in [
        "ackproxy_connections_open",
        "ackproxy_commands_total",
        "ackproxy_upstream_errors_total",
        "ackproxy_pops_total",
        "ackproxy_acks_total",
        "ackproxy_nacks_total",
        "ackproxy_redeliveries_total",
        "ackproxy_dead_letters_total",
    ] {
        assert!(used.contains(name), "no panel shows {name}");
    }
    let prom = std::fs::read_to_string(dir.join("prometheus.yml")).unwrap();
    assert!(prom.contains("metrics_path: /metrics"));
}

/// The PromQL of every panel target and template variable.
fn collect_queries(v: &Json, out: &mut Vec<String>) {
    match v {
        Json::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "definition", Json::String(s)) => out.push(s.clone()),
                    ("query", Json::String(s)) => out.push(s.clone()),
                    _ => collect_queries(v, out),
                }
            }
        }
        Json::Array(a) => a.iter().for_each(|v| collect_queries(v, out)),
        _ => {}
    }
}

fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("ackproxy_") {
        let start = i + at;
        let end = b[start..]
            .iter()
            .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
            .map_or(b.len(), |n| start + n);
        out.push(expr[start..end].to_string());
        i = end;
    }
    out
}

/// `ops_public` allows a non-loopback address; on a loopback one, the Host
/// check still keeps pages re-pointed at 127.0.0.1 by DNS out.
#[test]
fn ops_public_keeps_the_host_check_on_a_loopback_address() {
    let s = start("ops_public = true");
    for path in ["/", "/api/queues", "/api/queues/jobs", "/metrics"] {
        let r = http(s.ops, "GET", path, &[("Host", "attacker.example")], b"").unwrap();
        assert_eq!(r.status, 403, "{path}: {}", r.text());
    }
    assert_eq!(get(s.ops, "/api/queues").status, 200);
}

/// Status of `GET /api/queues` on `port` with `Host: host`.
fn status_for_host(port: u16, host: &str) -> u16 {
    http(port, "GET", "/api/queues", &[("Host", host)], b"")
        .expect("operations server answers")
        .status
}

#[test]
fn a_public_address_answers_the_allowed_host_names() {
    let redis = Redis::start();
    let ops = free_port();
    let public = format!("0.0.0.0:{ops}");
    let toml = format!("ops_public = true\nops_allowed_hosts = [\"ops.example.com\"]\n{RULES}");
    let proxy = Proxy::start_with_config(redis.port, &toml, &["--metrics", &public]);
    for (host, want) in [
        ("ops.example.com", 200),
        ("OPS.Example.com:7380", 200),
        ("127.0.0.1", 200),
        (&format!("localhost:{ops}"), 200),
        ("attacker.example", 403),
        ("ops.example.com.attacker.example", 403),
    ] {
        assert_eq!(status_for_host(ops, host), want, "{host}");
    }
    drop(proxy);

    // The flag (and ACKPROXY_OPS_ALLOWED_HOSTS) takes a comma-separated list.
    let ops = free_port();
    let public = format!("0.0.0.0:{ops}");
    let proxy = Proxy::start_with_config(
        redis.port,
        RULES,
        &[
            "--metrics",
            &public,
            "--ops-public",
            "--ops-allowed-hosts",
            "a.example,b.example",
        ],
    );
    assert_eq!(status_for_host(ops, "b.example"), 200);
    assert_eq!(status_for_host(ops, "c.example"), 403);
    drop(proxy);

    // Without a list, a public address answers any name (its clients are
    // other hosts, under names the proxy cannot know).
    let ops = free_port();
    let public = format!("0.0.0.0:{ops}");
    let _proxy =
        Proxy::start_with_config(redis.port, RULES, &["--metrics", &public, "--ops-public"]);
    assert_eq!(status_for_host(ops, "anything.example"), 200);
}

/// Whether the server still holds `s` open: nothing to read yet, no EOF.
fn still_open(s: &TcpStream) -> bool {
    use std::io::Read;
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 256];
    let r = (&*s).read(&mut buf);
    s.set_nonblocking(false).unwrap();
    matches!(r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// 500 connections that send half a request line and wait: at most
/// `ops_max_connections` (64) are held, until the header timeout (5 s);
/// the others are closed at once. The proxy, allowed 256 descriptors,
/// keeps enough for its Redis clients throughout.
#[test]
fn half_sent_requests_cannot_take_the_proxys_descriptors() {
    use std::io::Write;
    let redis = Redis::start();
    let ops = free_port();
    let proxy = Proxy::start_with_config_nofile(
        redis.port,
        RULES,
        &["--metrics", &format!("127.0.0.1:{ops}")],
        256,
    );
    let opened = Instant::now();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], ops));
    let mut hogs = Vec::new();
    let mut unaccepted = None;
    for i in 0..500 {
        // A loaded machine may take a while to accept: only a connection
        // that waits seconds says the server stopped accepting.
        match TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
            Ok(mut s) => {
                // May find the connection closed already: that is the point.
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0");
                hogs.push(s);
            }
            // The accept backlog is full: the later ones would wait too.
            Err(e) => {
                unaccepted = Some(format!("connection {i}: {e}"));
                break;
            }
        }
    }

    let mut c = Client::connect(proxy.port);
    c.set_read_timeout(Some(Duration::from_secs(5)));
    c.send(&["PING"]);
    assert_eq!(
        c.try_read_raw()
            .expect("a Redis client is served during the flood"),
        b"+PONG\r\n"
    );
    assert_eq!(unaccepted, None, "the operations server stopped accepting");

    std::thread::sleep(Duration::from_millis(500));
    let held = hogs.iter().filter(|s| still_open(s)).count();
    assert!((1..=64).contains(&held), "{held} of 500 connections held");
    // Over the cap a request is closed at once, not queued.
    let asked = Instant::now();
    assert!(http(ops, "GET", "/metrics", &[], b"").is_err());
    assert!(asked.elapsed() < Duration::from_secs(2));

    // The header timeout ends the held ones.
    while hogs.iter().any(still_open) {
        assert!(
            opened.elapsed() < Duration::from_secs(10),
            "half-sent requests still open after {:?}",
            opened.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        opened.elapsed() >= Duration::from_secs(4),
        "closed after {:?}, before the header timeout",
        opened.elapsed()
    );
    let r = get(ops, "/metrics");
    assert_eq!(r.status, 200);
    assert!(r.text().contains("ackproxy_connections_open "));
    c.send(&["PING"]);
    assert_eq!(c.try_read_raw().unwrap(), b"+PONG\r\n");
}

/// A body longer than 64 kB is refused from its announced length.
#[test]
fn request_bodies_are_limited() {
    use std::io::{Read, Write};
    let s = with_token();
    let mut conn = TcpStream::connect(("127.0.0.1", s.ops)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        conn,
        "POST /api/queues/jobs/purge HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Authorization: Bearer {TOKEN}\r\nContent-Length: 100000\r\n\r\n"
    )
    .unwrap();
    let mut reply = [0u8; 12];
    conn.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"HTTP/1.1 413");
    // Within the limit, the request is served.
    let r = http(s.ops, "GET", "/api/queues/jobs", &[], &[b'x'; 1000]);
    assert_eq!(r.unwrap().status, 200);
}

/// `INFO <section>` of the Redis on `port`, as text.
fn redis_info(c: &mut Client, section: &str) -> String {
    text(&c.cmd(&["INFO", section]))
}

fn info_number(info: &str, name: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in {info}"))
}

/// Calls per command from `INFO commandstats`, without INFO itself.
fn command_calls(c: &mut Client) -> BTreeMap<String, u64> {
    redis_info(c, "commandstats")
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (name != "info").then(|| (name.to_string(), calls))
        })
        .collect()
}

fn calls_since(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> (u64, u64) {
    let grew = |name: &str| after.get(name).unwrap_or(&0) - before.get(name).unwrap_or(&0);
    let total = after.keys().map(|k| grew(k)).sum();
    (total, grew("scan"))
}

/// Listing the queues costs Redis a SCAN per 1,000 keys and a script call
/// per queue. Fifty requests at once (a page left open in many tabs, or
/// any page in a browser on this host) share one connection and one
/// computation.
#[test]
fn queue_listings_share_one_connection_and_one_computation() {
    let s = start("");
    let mut c = s.proxy.client();
    fill(&mut c);
    let mut r = s.redis.client();
    // Keys the SCAN walks past, and more queues to look at.
    for i in 0..3000 {
        r.send(&["SET", &format!("other:{i}"), "v"]);
    }
    for i in 0..40 {
        r.send(&["RPUSH", &format!("tasks:{i:02}"), "m"]);
    }
    for _ in 0..3040 {
        r.read_value();
    }
    // The first listing may open the proxy's own connection.
    assert_eq!(get(s.ops, "/api/queues").status, 200);
    std::thread::sleep(Duration::from_millis(1200));
    let before = command_calls(&mut r);
    let listing = json_of(&get(s.ops, "/api/queues"));
    assert_eq!(listing["rules"][1]["queues"].as_array().unwrap().len(), 42);
    let (one_total, one_scans) = calls_since(&before, &command_calls(&mut r));
    assert!(one_scans >= 3, "{one_scans} SCAN calls for 3,000 keys");
    std::thread::sleep(Duration::from_millis(1200));

    let connections = info_number(&redis_info(&mut r, "stats"), "total_connections_received");
    let before = command_calls(&mut r);
    let ops = s.ops;
    let replies: Vec<_> = (0..50)
        .map(|_| std::thread::spawn(move || get(ops, "/api/queues")))
        .collect();
    let keys = |v: &Json| -> Vec<Json> {
        let queues = v["rules"][1]["queues"].as_array().unwrap();
        queues.iter().map(|q| q["key"].clone()).collect()
    };
    let mut made = BTreeSet::new();
    for reply in replies {
        let reply = reply.join().unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
        let body = json_of(&reply);
        assert_eq!(keys(&body), keys(&listing));
        made.insert(body["listed_at_ms"].as_u64().expect("listed_at_ms"));
    }
    assert!(made.len() <= 2, "50 listings made at {made:?}");
    let (total, scans) = calls_since(&before, &command_calls(&mut r));
    println!("one listing: {one_total} commands, {one_scans} SCANs; 50: {total}, {scans}");
    let opened =
        info_number(&redis_info(&mut r, "stats"), "total_connections_received") - connections;
    assert!(opened <= 2, "50 listings opened {opened} Redis connections");
    assert!(
        scans <= 2 * one_scans,
        "50 listings ran {scans} SCANs; one runs {one_scans}"
    );
    // The reaper's and the gauges' own calls go on meanwhile.
    assert!(
        total <= 2 * one_total + 100,
        "50 listings cost {total} commands; one costs {one_total}"
    );
}

/// The probes: no token needed, the Host check applies, and `/readyz`
/// follows Redis and the proxy's function library while `/healthz` only says the
/// process answers. `docker/healthcheck.sh` (the image's HEALTHCHECK)
/// asks `/healthz`.
#[test]
fn health_and_readiness() {
    let mut s = with_token();
    for path in ["/healthz", "/readyz"] {
        let r = get(s.ops, path);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
        let r = http(s.ops, "GET", path, &[("Host", "attacker.example")], b"").unwrap();
        assert_eq!(r.status, 403, "{path}");
    }
    assert_eq!(get(s.ops, "/healthz").text(), "ok\n");
    assert_eq!(get(s.ops, "/readyz").text(), "ready\n");

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docker/healthcheck.sh");
    let healthcheck = |addr: &str| {
        Command::new("bash")
            .arg(&script)
            .env("ACKPROXY_METRICS", addr)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("bash runs")
            .success()
    };
    assert!(healthcheck(&format!("127.0.0.1:{}", s.ops)));
    assert!(healthcheck(&format!("0.0.0.0:{}", s.ops)));
    assert!(!healthcheck(&format!("127.0.0.1:{}", free_port())));

    // The function library flushed behind the proxy's back: readiness
    // loads it again (a proxy kept out of rotation gets no queue operation
    // that would), and is ready once it is there.
    let mut direct = s.redis.client();
    let libraries = |direct: &mut Client| match direct.cmd(&["FUNCTION", "LIST"]) {
        Value::Array(libs) => libs.len(),
        other => panic!("FUNCTION LIST: {other:?}"),
    };
    assert_eq!(libraries(&mut direct), 1);
    assert_eq!(
        direct.cmd(&["FUNCTION", "FLUSH"]),
        Value::Simple("OK".into())
    );
    assert_eq!(libraries(&mut direct), 0);
    let r = get(s.ops, "/readyz");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(libraries(&mut direct), 1);
    let mut c = s.proxy.client();
    c.cmd(&["LPUSH", "jobs", "{\"id\":\"r1\"}"]);
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk("{\"id\":\"r1\"}"));

    s.redis.kill();
    let r = get(s.ops, "/readyz");
    assert_eq!(r.status, 503);
    assert!(r.text().starts_with("not ready: upstream"), "{}", r.text());
    assert_eq!(get(s.ops, "/healthz").status, 200);
    assert!(healthcheck(&format!("127.0.0.1:{}", s.ops)));
}

/// Without queue rules, ready means Redis answers.
#[test]
fn readiness_without_queue_rules() {
    let redis = Redis::start();
    let ops = free_port();
    let _proxy = Proxy::start(redis.port, &["--metrics", &format!("127.0.0.1:{ops}")]);
    let r = get(ops, "/readyz");
    assert_eq!(r.status, 200, "{}", r.text());
}

// ---------------------------------------------------------------------
// The web view in headless Chromium, through chromedriver's WebDriver API.

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

struct Browser {
    driver: Child,
    port: u16,
    session: String,
    profile: PathBuf,
}

const CHROMIUM: &str = "/usr/bin/chromium";

impl Browser {
    /// `None`, saying why, where Chromium or chromedriver is missing
    /// (tests/setup-bench-deps.sh installs both, as CI does).
    fn start() -> Option<Browser> {
        if !std::path::Path::new(CHROMIUM).exists() {
            println!("skipped: no {CHROMIUM} (tests/setup-bench-deps.sh installs chromium)");
            return None;
        }
        let port = free_port();
        let Ok(driver) = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        else {
            println!(
                "skipped: no chromedriver (tests/setup-bench-deps.sh installs chromium-driver)"
            );
            return None;
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = http(port, "GET", "/status", &[], b"") {
                if json_of(&r)["value"]["ready"] == json!(true) {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "chromedriver never became ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = std::env::temp_dir().join(format!("ackproxy-chromium-{port}"));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }}});
        let mut b = Browser {
            driver,
            port,
            session: String::new(),
            profile,
        };
        let v = b.call("POST", "/session", caps);
        b.session = v["sessionId"].as_str().expect("a session").to_string();
        Some(b)
    }

    /// Makes the page's viewport (what a screenshot shows) `width` ×
    /// `height`: the window is that plus whatever its frame takes.
    fn resize(&self, width: u32, height: u32) {
        self.session(
            "POST",
            "/window/rect",
            json!({ "width": width, "height": height }),
        );
        self.wait_for(
            "the new width",
            &format!("return window.outerWidth === {width} || null;"),
        );
        let frame = self.js(
            "return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight];",
        );
        let extra = |i: usize| frame[i].as_u64().unwrap_or(0) as u32;
        self.session(
            "POST",
            "/window/rect",
            json!({ "width": width + extra(0), "height": height + extra(1) }),
        );
        self.wait_for(
            "the new size",
            &format!(
                "return window.innerWidth === {width} && window.innerHeight === {height} || null;"
            ),
        );
    }

    /// Whether the element is shown (it and its ancestors not hidden).
    fn visible(&self, css: &str) -> bool {
        self.js(&format!(
            "const e = document.querySelector('{css}'); return !!(e && e.offsetParent !== null);"
        )) == json!(true)
    }

    fn call(&self, method: &str, path: &str, body: Json) -> Json {
        let body = if method == "GET" {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let r = http(
            self.port,
            method,
            path,
            &[("Content-Type", "application/json")],
            &body,
        )
        .expect("chromedriver answers");
        let v = json_of(&r);
        assert_eq!(r.status, 200, "{method} {path}: {v}");
        v["value"].clone()
    }

    fn session(&self, method: &str, path: &str, body: Json) -> Json {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    fn go(&self, url: &str) {
        self.session("POST", "/url", json!({ "url": url }));
    }

    fn js(&self, script: &str) -> Json {
        self.js_with(script, json!([]))
    }

    /// `script` with `arguments` set to `args`.
    fn js_with(&self, script: &str, args: Json) -> Json {
        self.session(
            "POST",
            "/execute/sync",
            json!({ "script": script, "args": args }),
        )
    }

    /// Waits until `script` returns something other than null or false.
    fn wait_for(&self, what: &str, script: &str) -> Json {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.js(script);
            if !v.is_null() && v != json!(false) {
                return v;
            }
            assert!(Instant::now() < deadline, "the page never showed {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn element(&self, css: &str) -> String {
        let v = self.session(
            "POST",
            "/element",
            json!({ "using": "css selector", "value": css }),
        );
        v[ELEMENT].as_str().expect("an element").to_string()
    }

    fn click(&self, css: &str) {
        let id = self.element(css);
        self.session("POST", &format!("/element/{id}/click"), json!({}));
    }

    fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.session("POST", &format!("/element/{id}/clear"), json!({}));
        self.session(
            "POST",
            &format!("/element/{id}/value"),
            json!({ "text": text }),
        );
    }

    /// Saves a PNG of the window under target/test-output/ and prints where.
    fn screenshot(&self, name: &str) -> PathBuf {
        self.shot(name).0
    }

    /// The screenshot saved, and as the base64 text chromedriver sent.
    fn shot(&self, name: &str) -> (PathBuf, String) {
        let encoded = self
            .session("GET", "/screenshot", json!(null))
            .as_str()
            .unwrap()
            .to_string();
        let png = base64(&encoded);
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-output");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, png).unwrap();
        println!("screenshot: {}", path.display());
        (path, encoded)
    }

    /// A screenshot read back: the browser decodes the PNG (no PNG crate
    /// here) and gives the colour at each point, in CSS pixels of the
    /// window, and the picture's size in CSS pixels.
    fn shot_pixels(&self, name: &str, points: &[(f64, f64)]) -> ((f64, f64), Vec<[u8; 3]>) {
        let (_, encoded) = self.shot(name);
        let v = self.js_with(
            "const [b64, points] = arguments;
             const bin = atob(b64);
             const bytes = new Uint8Array(bin.length);
             for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
             const bmp = await createImageBitmap(new Blob([bytes], { type: 'image/png' }));
             const c = document.createElement('canvas');
             c.width = bmp.width;
             c.height = bmp.height;
             const g = c.getContext('2d');
             g.drawImage(bmp, 0, 0);
             const scale = bmp.width / window.innerWidth;
             const px = points.map(([x, y]) =>
               [...g.getImageData(Math.floor(x * scale), Math.floor(y * scale), 1, 1).data].slice(0, 3));
             return [bmp.width / scale, bmp.height / scale, px];",
            json!([encoded, points]),
        );
        let size = (v[0].as_f64().unwrap(), v[1].as_f64().unwrap());
        let px = v[2]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let c: Vec<u8> = p
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_u64().unwrap() as u8)
                    .collect();
                [c[0], c[1], c[2]]
            })
            .collect();
        (size, px)
    }

    /// An element's box: left, top, width, height (CSS pixels).
    fn rect(&self, css: &str) -> [f64; 4] {
        let v = self.js(&format!(
            "const e = document.querySelector('{css}'); if (!e) return null; \
             const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height];"
        ));
        let v = v
            .as_array()
            .unwrap_or_else(|| panic!("no {css}"))
            .iter()
            .map(|n| n.as_f64().unwrap())
            .collect::<Vec<_>>();
        [v[0], v[1], v[2], v[3]]
    }

    /// The window's inner size.
    fn viewport(&self) -> (f64, f64) {
        let v = self.js("return [window.innerWidth, window.innerHeight];");
        (v[0].as_f64().unwrap(), v[1].as_f64().unwrap())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = http(self.port, "DELETE", &path, &[], b"");
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn base64(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = s
        .bytes()
        .filter(|&c| c != b'=' && c != b'\n')
        .map(value)
        .collect();
    digits
        .chunks(4)
        .flat_map(|c| {
            let n = c
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &d)| n | (d as u32) << (18 - 6 * i));
            let bytes = n.to_be_bytes();
            bytes[1..c.len()].to_vec()
        })
        .collect()
}

/// What a cell of the queue list shows, as a number.
fn cell(key: &str, field: &str) -> String {
    format!(
        "const c = document.querySelector('tr[data-key=\"{key}\"] td[data-field=\"{field}\"]'); \
         return c ? c.getAttribute('data-value') : null;"
    )
}

/// What sticks out of a rule's card on the queue list: a table past its
/// right edge, a card or table box that scrolls sideways, the page itself
/// wider than the window.
const OVERFLOW: &str = "
    const out = [];
    for (const card of document.querySelectorAll('section.rule')) {
      const c = card.getBoundingClientRect();
      const name = card.getAttribute('data-rule');
      for (const t of card.querySelectorAll('table')) {
        if (t.getBoundingClientRect().right > c.right + 0.5) out.push('table past the card of ' + name);
      }
      if (card.scrollWidth > card.clientWidth) out.push('card of ' + name + ' scrolls');
      for (const s of card.querySelectorAll('.scroll')) {
        if (s.scrollWidth > s.clientWidth) out.push('table of ' + name + ' scrolls');
      }
    }
    const page = document.documentElement;
    if (page.scrollWidth > page.clientWidth) out.push('page scrolls');
    return out;";

/// Every column and rate label of the queue list.
const LABELS: &str = "
    return [...document.querySelectorAll('section.rule th, section.rule .rates .l')]
      .map((e) => e.textContent);";

/// The ids of a list's rows, once it has `n` of them.
fn rows(list: &str, n: usize) -> String {
    format!(
        "const rows = document.querySelectorAll('#{list} tbody tr'); \
         return rows.length === {n} ? [...rows].map((r) => r.getAttribute('data-id')) : null;"
    )
}

/// Whether a colour is within a small distance of another (a screenshot's
/// pixels are the CSS colour, give or take rounding).
fn near(got: [u8; 3], want: [u8; 3]) -> bool {
    got.iter().zip(want).all(|(&g, w)| g.abs_diff(w) <= 12)
}

/// The highlight of dead letters above zero (`.alert` in page.html).
const ALERT_BG: [u8; 3] = [0xfe, 0xe4, 0xe2];
/// The banner's background (`--bad` in page.html).
const BANNER_BG: [u8; 3] = [0xb4, 0x23, 0x18];

/// Whether a box lies wholly inside the window.
fn inside(r: [f64; 4], (w, h): (f64, f64)) -> bool {
    r[0] >= 0.0 && r[1] >= 0.0 && r[0] + r[2] <= w + 0.5 && r[1] + r[3] <= h + 0.5 && r[2] > 0.0
}

/// A time cell of a list: its relative text ("29 s ago", "in 19 s"), its
/// absolute text, and whether the absolute text, read as ISO 8601 with its
/// offset, is the same second as the cell's epoch milliseconds.
fn time_cell(browser: &Browser, css: &str) -> (String, String, bool) {
    let v = browser.js(&format!(
        "const c = document.querySelector('{css}'); \
         const abs = c.querySelector('.abs').textContent; \
         const t = Date.parse(abs.replace(' ', 'T')); \
         return [c.querySelector('.rel').textContent, abs, \
                 Math.floor(Number(c.getAttribute('data-value')) / 1000) * 1000 === t];"
    ));
    (
        v[0].as_str().unwrap().to_string(),
        v[1].as_str().unwrap().to_string(),
        v[2] == json!(true),
    )
}

/// `2026-11-28 10:24:47+00:00`: ISO 8601 with the zone's offset.
fn is_iso_with_offset(t: &str) -> bool {
    t.len() == 25
        && t.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 => b == b'-',
            10 => b == b' ',
            13 | 16 | 22 => b == b':',
            19 => b == b'+' || b == b'-',
            _ => b.is_ascii_digit(),
        })
}

/// "29 s", "5 min", "1 h 30 min", "850 ms": a number and a unit, twice at most.
fn is_duration(t: &str) -> bool {
    let parts: Vec<&str> = t.split(' ').collect();
    (parts.len() == 2 || parts.len() == 4)
        && parts.chunks(2).all(|p| {
            p[0].bytes().all(|b| b.is_ascii_digit())
                && ["ms", "s", "min", "h", "day", "days"].contains(&p[1])
        })
}

const RESULT_STATUS: &str =
    "return document.getElementById('action-result').getAttribute('data-status');";

fn action_status(browser: &Browser, what: &str, status: &str) -> Json {
    browser.wait_for(
        what,
        &format!(
            "const r = document.getElementById('action-result'); \
             return r.getAttribute('data-status') === '{status}' ? r.textContent : null;"
        ),
    )
}

#[test]
fn the_web_view_in_chromium() {
    let s = with_token();
    let mut c = s.proxy.client();
    fill(&mut c);
    let long = format!(
        "{{\"id\":\"d2\",\"text\":\"{}\",\"tags\":[\"a\",\"b\"]}}",
        "lorem ipsum ".repeat(30)
    );
    let letters = [r#"{"id":"d1"}"#, long.as_str(), r#"{"id":"d3"}"#];
    kill(&mut c, "fragile", &letters);
    let Some(browser) = Browser::start() else {
        return;
    };
    let base = format!("http://127.0.0.1:{}/", s.ops);
    browser.go(&base);

    // The queue list shows what QUEUE INFO says.
    browser.wait_for("the queue list", &cell("tasks:b", "leased"));
    for key in ["jobs", "tasks:a", "tasks:b", "fragile"] {
        let info = queue_info(&mut c, key);
        for field in ["ready", "leased", "dead"] {
            let shown = browser.js(&cell(key, field));
            assert_eq!(shown, json!(int(&info[field]).to_string()), "{key} {field}");
        }
    }
    assert!(browser.js(&cell("tasks:meta", "ready")).is_null());
    // It refreshes by itself: a push shows up without a reload.
    c.cmd(&["LPUSH", "jobs", "{\"id\":\"4\"}"]);
    let ready = int(&queue_info(&mut c, "jobs")["ready"]);
    assert_eq!(ready, 3);
    browser.wait_for(
        "the new message",
        &format!(
            "return (() => {{ {} }})() === '3' || null;",
            cell("jobs", "ready")
        ),
    );

    // The summary strip: every listed queue's counts added up, above the
    // rules; dead letters above zero stand out, there and in their row.
    let mut sums = BTreeMap::new();
    for key in ["jobs", "tasks:a", "tasks:b", "fragile"] {
        let info = queue_info(&mut c, key);
        for field in ["ready", "delayed", "leased", "dead"] {
            *sums.entry(field).or_insert(0) += int(&info[field]);
        }
    }
    assert_eq!(sums["dead"], 3);
    for (field, n) in &sums {
        browser.wait_for(
            &format!("the total {field}"),
            &format!(
                "const t = document.querySelector('#summary [data-total=\"{field}\"]'); \
                 return t && t.getAttribute('data-value') === '{n}' || null;"
            ),
        );
    }
    let classes = browser.js(
        "return ['#summary [data-total=\"dead\"]', '#summary [data-total=\"ready\"]', \
                 'tr[data-key=\"fragile\"] td[data-field=\"dead\"]', \
                 'tr[data-key=\"jobs\"] td[data-field=\"dead\"]'] \
           .map((css) => document.querySelector(css).classList.contains('alert'));",
    );
    assert_eq!(classes, json!([true, false, true, false]));

    // The table of every rule stays inside its card, at 1280×800 and at
    // 1920×1080, with rates shown (two listings); the summary is on screen
    // above the first rule, and the screenshot shows the highlight where
    // the page says the dead-letter cells are.
    for (width, height) in [(1280, 800), (1920, 1080)] {
        browser.resize(width, height);
        browser.wait_for(
            "the rates",
            "const r = document.querySelector('[data-rate=\"pops\"] .n'); \
             return r && r.textContent !== '—' || null;",
        );
        let view = browser.viewport();
        let summary = browser.rect("#summary");
        let tile = browser.rect("#summary [data-total=\"dead\"]");
        let first = browser.rect("section.rule");
        let header = browser.rect("header");
        assert!(inside(summary, view), "summary {summary:?} in {view:?}");
        assert!(
            summary[1] >= header[1] + header[3],
            "{summary:?} under {header:?}"
        );
        assert!(
            summary[1] + summary[3] <= first[1],
            "{summary:?} above {first:?}"
        );
        let cell = browser.rect("tr[data-key=\"fragile\"] td[data-field=\"dead\"]");
        // Inside each box, clear of its text (which is at its right or in
        // its middle).
        let points = [
            (tile[0] + 4.0, tile[1] + tile[3] / 2.0),
            (cell[0] + 3.0, cell[1] + 3.0),
            (first[0] + 3.0, first[1] + first[3] / 2.0),
        ];
        // The pictures of docs/operations.md (docs/web-view-*.png) are these.
        let (size, px) = browser.shot_pixels(&format!("web-view-{width}.png"), &points);
        assert_eq!(size, view, "the screenshot is the window");
        assert!(near(px[0], ALERT_BG), "dead tile at {width}: {:?}", px[0]);
        if inside(cell, view) {
            assert!(near(px[1], ALERT_BG), "dead cell at {width}: {:?}", px[1]);
        }
        assert!(near(px[2], [255, 255, 255]), "a rule card: {:?}", px[2]);
        assert_eq!(browser.js(OVERFLOW), json!([]), "at {width} px");
    }

    // Labels in words, one style: no counter names with underscores.
    let labels = browser.js(LABELS);
    let labels: Vec<&str> = labels
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        labels.iter().any(|l| l.starts_with("late acks/s")),
        "{labels:?}"
    );
    // Tiles only for the features the rules use: none of these has
    // dead_max, shadow mode or leases ending with their connection.
    for absent in [
        "dead dropped/s",
        "shadow would redeliver/s",
        "poison messages/s",
        "disconnect requeues/s",
    ] {
        assert!(
            !labels.iter().any(|l| l.starts_with(absent)),
            "{absent} in {labels:?}"
        );
    }
    assert!(
        labels.iter().any(|l| l.starts_with("dead letters/s")),
        "{labels:?}"
    );
    for l in &labels {
        assert!(!l.contains('_'), "{l:?} in {labels:?}");
    }

    // One queue: its leases as QUEUE LEASES lists them.
    browser.resize(1280, 1000);
    browser.click("tr[data-key=\"jobs\"] a");
    let ids = browser.wait_for("the leases of jobs", &rows("leases", 1));
    assert_eq!(ids, json!(["1"]));
    assert_eq!(
        browser
            .js("return document.querySelector('#q-info dd[data-field=\"leased\"]').textContent;"),
        json!("1")
    );
    // Grouped: the state now, the totals, the rule's settings; durations in
    // words and no raw sentinels.
    let info = queue_info(&mut c, "jobs");
    let groups = browser.js(
        "const of = (id) => [...document.querySelectorAll('#' + id + ' dd')] \
           .map((d) => [d.getAttribute('data-field'), d.textContent]); \
         return [of('q-now'), of('q-totals'), of('q-rule')];",
    );
    let group = |i: usize| -> BTreeMap<String, String> {
        groups[i]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p[0].as_str().unwrap().to_string(),
                    p[1].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let (now, totals, rule) = (group(0), group(1), group(2));
    for field in ["ready", "leased", "delayed", "dead", "oldest-lease-age-ms"] {
        assert!(now.contains_key(field), "{field} in {now:?}");
    }
    for field in [
        "lease-ms",
        "max-deliveries",
        "dead-letter-key",
        "suggested-lease-ms",
    ] {
        assert!(rule.contains_key(field), "{field} in {rule:?}");
        assert!(!now.contains_key(field) && !totals.contains_key(field));
    }
    assert!(
        !totals.is_empty() && !totals.contains_key("ready"),
        "{totals:?}"
    );
    assert_eq!(
        now.len() + totals.len() + rule.len(),
        info.len(),
        "every QUEUE INFO field once"
    );
    assert_eq!(rule["lease-ms"], "30 s");
    assert!(is_duration(&now["oldest-lease-age-ms"]), "{now:?}");
    assert_eq!(int(&info["suggested-lease-ms"]), -1);
    assert_eq!(rule["suggested-lease-ms"], "not enough data");
    assert_eq!(now["poison-ids"], "none");
    for (field, v) in now.iter().chain(&totals).chain(&rule) {
        assert!(v != "-1" && v != "[]" && !v.is_empty(), "{field}: {v:?}");
    }
    let (g_now, g_rule) = (browser.rect("#q-now"), browser.rect("#q-rule"));
    assert!(
        g_rule[0] >= g_now[0] + g_now[2] || g_rule[1] >= g_now[1] + g_now[3],
        "the settings apart from the counters: {g_now:?} {g_rule:?}"
    );
    // A lease's deadline is a time from now.
    let expires = browser.js(
        "return document.querySelector('#leases tr[data-id=\"1\"] td[data-field=\"expires-in-ms\"]').textContent;",
    );
    let expires = expires.as_str().unwrap();
    assert!(
        expires.starts_with("in ") && is_duration(&expires[3..]),
        "{expires}"
    );

    // Dead letters, not logged in: no action is offered.
    browser.go(&format!("{base}#queue/fragile"));
    let ids = browser.wait_for("fragile's dead letters", &rows("dead", 3));
    assert_eq!(ids, json!(["d1", "d2", "d3"]));
    assert!(browser.visible("#login"));
    assert!(!browser.visible("#admin-actions"));
    assert!(!browser.visible("#read-only"));
    // Logged out, the page says what logging in would offer.
    assert!(browser.visible("#login-hint"));
    let hint = browser.js("return document.getElementById('login-hint').textContent;");
    for word in ["Log in", "retry", "delete", "redrive", "purge"] {
        assert!(hint.as_str().unwrap().contains(word), "{hint}");
    }
    assert_eq!(
        browser.js(
            "return document.querySelectorAll('#dead button.retry, #dead button.delete').length;"
        ),
        json!(0)
    );

    // Times are how long ago, and dates with their zone's offset, not
    // epoch milliseconds (which stay in data-value).
    let Value::Array(dead) = c.cmd(&["QUEUE", "DEAD", "fragile"]) else {
        panic!("QUEUE DEAD")
    };
    let first = map_of(&dead[0]);
    for field in ["first-delivery-ms", "last-delivery-ms", "dead-lettered-ms"] {
        let css = format!("#dead tr[data-id=\"d1\"] td[data-field=\"{field}\"]");
        let (rel, abs, same) = time_cell(&browser, &css);
        let ago = rel.strip_suffix(" ago").unwrap_or_default();
        assert!(rel == "now" || is_duration(ago), "{field}: {rel:?}");
        assert!(is_iso_with_offset(&abs), "{field}: {abs:?}");
        assert!(same, "{field}: {abs:?} is not the cell's time");
        let value = browser.js(&format!(
            "return document.querySelector('{css}').getAttribute('data-value');"
        ));
        assert_eq!(value, json!(int(&first[field]).to_string()), "{field}");
    }
    let heads =
        browser.js("return [...document.querySelectorAll('#dead th')].map((h) => h.textContent);");
    assert!(
        heads.as_array().unwrap().contains(&json!("dead lettered")),
        "{heads}"
    );

    // The payload preview: the start in the row, the whole behind "show".
    let preview = browser.js(
        "const c = document.querySelector('#dead tr[data-id=\"d2\"] td[data-field=\"payload\"]'); \
         return [c.querySelector('.preview').textContent, c.querySelector('pre').hidden];",
    );
    let shown = preview[0].as_str().unwrap();
    assert!(
        shown.chars().count() <= 81 && shown.ends_with('…'),
        "{shown}"
    );
    assert!(long.starts_with(shown.trim_end_matches('…')));
    assert_eq!(preview[1], json!(true));
    browser.click("#dead tr[data-id=\"d2\"] .toggle");
    let full = browser.wait_for(
        "the whole payload",
        "const p = document.querySelector('#dead tr[data-id=\"d2\"] pre'); \
         return p.hidden ? null : p.textContent;",
    );
    let full = full.as_str().unwrap();
    assert!(full.contains("\n  \"text\""), "pretty JSON: {full}");
    assert_eq!(
        serde_json::from_str::<Json>(full).unwrap(),
        serde_json::from_str::<Json>(&long).unwrap()
    );

    // Search by id.
    browser.type_into("#find-id", "d3");
    browser.click("#find button[type=\"submit\"]");
    assert_eq!(browser.wait_for("only d3", &rows("dead", 1)), json!(["d3"]));
    browser.click("#find-clear");
    browser.wait_for("every dead letter", &rows("dead", 3));

    // Log in: a wrong token is refused, the right one opens a session the
    // page's script cannot read, and the actions appear.
    browser.type_into("#login-token", "wrong");
    browser.click("#login button");
    browser.wait_for(
        "the refused login",
        "return document.getElementById('login-error').textContent.includes('wrong admin token') || null;",
    );
    assert!(!browser.visible("#admin-actions"));
    browser.type_into("#login-token", TOKEN);
    browser.click("#login button");
    browser.wait_for(
        "the actions",
        "return document.querySelectorAll('#dead button.retry').length === 3 || null;",
    );
    assert!(browser.visible("#admin-actions"));
    assert!(browser.visible("#logged-in"));
    assert!(!browser.visible("#login"));
    assert!(!browser.visible("#login-hint"));
    assert_eq!(browser.js("return document.cookie;"), json!(""));
    assert_eq!(
        browser.js("return document.getElementById('login-token').value;"),
        json!("")
    );
    browser.resize(1920, 1000);
    browser.wait_for(
        "the preview still open",
        "const p = document.querySelector('#dead tr[data-id=\"d2\"] pre'); return p && !p.hidden || null;",
    );
    // The button to the dead letters brings them into view.
    browser.click("#jump button[data-list=\"dead\"]");
    browser.wait_for(
        "the dead letters in view",
        "const r = document.getElementById('sec-dead').getBoundingClientRect(); \
         return r.top > -2 && r.top < window.innerHeight / 2 || null;",
    );
    browser.screenshot("web-view-queue.png");

    // Retry one: d2 alone goes back to the queue.
    browser.click("#dead tr[data-id=\"d2\"] .retry");
    action_status(&browser, "the retry", "200");
    assert_eq!(list(&mut c, "fragile"), vec![long.clone()]);
    assert_eq!(
        browser.wait_for("d1 and d3", &rows("dead", 2)),
        json!(["d1", "d3"])
    );

    // Delete one: the first click arms, the second deletes.
    browser.click("#dead tr[data-id=\"d3\"] .delete");
    assert_eq!(dead_of(&mut c, "fragile").len(), 2);
    browser.click("#dead tr[data-id=\"d3\"] .delete");
    action_status(&browser, "the delete", "200");
    assert_eq!(browser.wait_for("d1", &rows("dead", 1)), json!(["d1"]));
    assert_eq!(
        dead_of(&mut c, "fragile"),
        vec![(Some("d1".to_string()), letters[0].to_string())]
    );

    // Redrive the rest.
    browser.click("#redrive");
    action_status(&browser, "the redrive", "200");
    let info = queue_info(&mut c, "fragile");
    assert_eq!((int(&info["dead"]), int(&info["ready"])), (0, 2));
    browser.wait_for(
        "no dead letters",
        "const d = document.querySelector('#q-info dd[data-field=\"dead\"]'); \
         return d && d.textContent === '0' || null;",
    );

    // Log out: the actions go, and the session with them.
    browser.click("#logout");
    browser.wait_for(
        "the login form",
        "const l = document.getElementById('login'); return !l.hidden || null;",
    );
    assert!(!browser.visible("#admin-actions"));
    let r = browser.js(
        "const r = await fetch('/api/queues/fragile/purge', {method: 'POST'}); return r.status;",
    );
    assert_eq!(r, json!(401));
    assert_eq!(browser.js(RESULT_STATUS), json!("200"));
}

/// Without an admin token no action is offered: no buttons that would only
/// answer 403, no login.
#[test]
fn the_web_view_without_admin_actions() {
    let s = start("");
    let mut c = s.proxy.client();
    kill(&mut c, "fragile", &[r#"{"id":"d1"}"#]);
    let Some(browser) = Browser::start() else {
        return;
    };
    browser.go(&format!("http://127.0.0.1:{}/#queue/fragile", s.ops));
    browser.wait_for("the dead letter", &rows("dead", 1));
    browser.wait_for(
        "the read-only note",
        "return document.getElementById('read-only').offsetParent !== null || null;",
    );
    for hidden in [
        "#admin-actions",
        "#redrive",
        "#purge",
        "#login",
        "#logged-in",
        "#login-hint",
    ] {
        assert!(!browser.visible(hidden), "{hidden} is shown");
    }
    assert_eq!(
        browser.js(
            "return document.querySelectorAll('#dead button.retry, #dead button.delete').length;"
        ),
        json!(0)
    );
}

/// The ids of a list's rows and the text of its payload cells, once it
/// shows rows `from` to `to` (positions, from 1).
fn page_rows(browser: &Browser, list: &str, from: u64, to: u64) -> Json {
    let ids: Vec<String> = (from..=to).map(|n| n.to_string()).collect();
    browser.wait_for(
        &format!("{list} rows {from} to {to}"),
        &format!(
            "const rows = [...document.querySelectorAll('#{list} tbody tr')]; \
             const ids = rows.map((r) => r.getAttribute('data-id')); \
             return JSON.stringify(ids) === '{}' \
               ? rows.map((r) => r.querySelector('td[data-field=\"payload\"]').textContent) : null;",
            serde_json::to_string(&ids).unwrap()
        ),
    )
}

fn pager(browser: &Browser, list: &str) -> Json {
    browser.js(&format!(
        "const p = document.getElementById('pager-{list}'); \
         const b = (c) => {{ const e = p.querySelector('button.' + c); return e ? e.disabled : null; }}; \
         const r = p.querySelector('.range'); \
         return [r ? r.textContent : null, b('prev'), b('next')];"
    ))
}

/// A queue's ready, delayed and leased messages, a page at a time: each
/// page one bounded command, in the API and on the page.
#[test]
fn the_web_view_pages_through_a_queue() {
    let s = with_token();
    let mut c = s.proxy.client();
    let ready: Vec<String> = (1..=250).map(|n| format!("m{n:03}")).collect();
    // LPUSH of m001 … m250 in order: m001 is at the right end, popped first.
    let mut push = vec!["LPUSH", "tasks:big"];
    push.extend(ready.iter().map(String::as_str));
    assert_eq!(c.cmd(&push), Value::Int(250));
    let delayed: Vec<String> = (1..=30).map(|n| format!("d{n:02}")).collect();
    let mut push = vec!["QUEUE", "PUSH", "tasks:big"];
    push.extend(delayed.iter().map(String::as_str));
    push.extend(["DELAY", "600000"]);
    assert!(!matches!(c.cmd(&push), Value::Error(_)));
    c.cmd(&["RPUSH", "tasks:held", "h1", "h2", "h3", "h4", "h5", "h6"]);
    for _ in 0..6 {
        assert!(matches!(c.cmd(&["RPOP", "tasks:held"]), Value::Bulk(_)));
    }

    // The API: pages in pop order, count capped at 100.
    let payloads = |j: &Json| -> Vec<String> {
        j.as_array()
            .unwrap()
            .iter()
            .map(|i| i["payload"].as_str().unwrap().to_string())
            .collect()
    };
    let r = get(s.ops, "/api/queues/tasks%3Abig/ready?offset=0&count=25");
    assert_eq!(r.status, 200, "{}", r.text());
    let page = json_of(&r);
    assert_eq!(payloads(&page), ready[..25]);
    assert_eq!(page[0]["position"], json!(1));
    let r = get(s.ops, "/api/queues/tasks%3Abig/ready?offset=25&count=25");
    assert_eq!(payloads(&json_of(&r)), ready[25..50]);
    let r = get(s.ops, "/api/queues/tasks%3Abig/ready?offset=240&count=100");
    assert_eq!(payloads(&json_of(&r)), ready[240..]);
    assert_eq!(json_of(&r)[0]["position"], json!(241));
    for bad in [
        "ready?count=101",
        "ready?count=0",
        "ready?count=-1",
        "ready?offset=x",
        "delayed?count=1000",
        "leases?offset=0&count=101",
        "leases?offset=1099511627777&count=10",
        "dead?offset=0&count=500",
    ] {
        let r = get(s.ops, &format!("/api/queues/tasks%3Abig/{bad}"));
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }
    assert_eq!(get(s.ops, "/api/queues/unrelated/ready").status, 404);
    assert_eq!(get(s.ops, "/api/queues/unrelated/delayed").status, 404);
    let r = get(s.ops, "/api/queues/tasks%3Abig/delayed?offset=10&count=100");
    let page = json_of(&r);
    assert_eq!(payloads(&page), delayed[10..]);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let due = page[0]["due-ms"].as_i64().unwrap();
    assert!((now_ms + 500_000..now_ms + 700_000).contains(&due), "{due}");
    // Leases: the same as QUEUE LEASES, from the offset on.
    let Value::Array(all) = c.cmd(&["QUEUE", "LEASES", "tasks:held", "COUNT", "6"]) else {
        panic!("QUEUE LEASES")
    };
    let ids: Vec<String> = all.iter().map(|l| text(&map_of(l)["id"])).collect();
    let r = get(s.ops, "/api/queues/tasks%3Aheld/leases?offset=2&count=3");
    let got: Vec<String> = json_of(&r)
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(got, ids[2..5]);

    let Some(browser) = Browser::start() else {
        return;
    };
    browser.resize(1280, 800);
    browser.go(&format!("http://127.0.0.1:{}/#queue/tasks%3Abig", s.ops));
    let shown = page_rows(&browser, "ready", 1, 25);
    assert_eq!(shown, json!(ready[..25]));
    assert_eq!(
        pager(&browser, "ready"),
        json!(["1–25 of 250", true, false])
    );
    browser.click("#pager-ready button.next");
    assert_eq!(page_rows(&browser, "ready", 26, 50), json!(ready[25..50]));
    assert_eq!(
        pager(&browser, "ready"),
        json!(["26–50 of 250", false, false])
    );
    browser.click("#pager-ready button.prev");
    assert_eq!(page_rows(&browser, "ready", 1, 25), json!(ready[..25]));
    for from in (26..=226).step_by(25) {
        browser.click("#pager-ready button.next");
        browser.wait_for(
            "the next page",
            &format!(
                "const r = document.querySelector('#pager-ready .range'); \
                 return r && r.textContent.startsWith('{from}–') || null;"
            ),
        );
    }
    assert_eq!(page_rows(&browser, "ready", 226, 250), json!(ready[225..]));
    assert_eq!(
        pager(&browser, "ready"),
        json!(["226–250 of 250", false, true])
    );
    // Delayed: its own pages, due times from now with their zone.
    assert_eq!(page_rows(&browser, "delayed", 1, 25), json!(delayed[..25]));
    let (rel, abs, same) = time_cell(
        &browser,
        "#delayed tr[data-id=\"1\"] td[data-field=\"due-ms\"]",
    );
    assert!(rel == "in 10 min" || rel.starts_with("in 9 min"), "{rel}");
    assert!(is_iso_with_offset(&abs) && same, "{abs}");
    browser.click("#pager-delayed button.next");
    assert_eq!(page_rows(&browser, "delayed", 26, 30), json!(delayed[25..]));
    // The list counts on the buttons to each list.
    let jump = browser
        .js("return [...document.querySelectorAll('#jump button')].map((b) => b.textContent);");
    assert_eq!(
        jump,
        json!([
            "Ready · 250",
            "Delayed · 30",
            "Leased · 0",
            "Dead letters · 0"
        ])
    );
    // Paging stays inside the window at both sizes.
    for (width, height) in [(1280, 800), (1920, 1080)] {
        browser.resize(width, height);
        browser.js("document.getElementById('sec-ready').scrollIntoView(); return null;");
        let view = browser.viewport();
        let pager = browser.rect("#pager-ready");
        assert!(inside(pager, view), "pager {pager:?} in {view:?}");
        browser.screenshot(&format!("web-view-pages-{width}.png"));
    }
}

/// The payloads of a list's rows once they are `want`.
fn payload_rows(browser: &Browser, list: &str, want: &[String]) -> Json {
    browser.wait_for(
        &format!("{list} rows {} …", want[0]),
        &format!(
            "const cells = [...document.querySelectorAll('#{list} tbody td[data-field=\"payload\"]')]; \
             const got = cells.map((c) => c.textContent); \
             return JSON.stringify(got) === '{}' ? got : null;",
            serde_json::to_string(want).unwrap()
        ),
    )
}

/// Leases and dead letters page on past the first 1,000, in the API and
/// on the page: a page far down is the proxy's listing from there.
#[test]
fn leases_and_dead_letters_page_past_the_first_thousand() {
    let s = start(&format!(
        "admin_token = \"{TOKEN}\"\n[[queue]]\npattern = \"many\"\nlease_ms = 600000\n"
    ));
    let mut c = s.proxy.client();
    let payloads: Vec<String> = (0..1200).map(|n| format!("p{n:04}")).collect();
    let mut push = vec!["LPUSH", "many"];
    push.extend(payloads.iter().map(String::as_str));
    assert_eq!(c.cmd(&push), Value::Int(1200));
    for n in ["1000", "200"] {
        assert!(matches!(c.cmd(&["RPOP", "many", n]), Value::Array(_)));
    }
    // Dead letters as any tool may leave them: raw payloads, no history.
    let mut push = vec!["RPUSH", "{many}:dead"];
    push.extend(payloads.iter().map(String::as_str));
    assert_eq!(s.redis.client().cmd(&push), Value::Int(1200));

    // The whole listing, from the proxy in two calls.
    let mut leases: Vec<(String, String)> = Vec::new();
    for args in [&["COUNT", "1000"][..], &["COUNT", "1000", "OFFSET", "1000"]] {
        let mut all = vec!["QUEUE", "LEASES", "many"];
        all.extend(args);
        let Value::Array(items) = c.cmd(&all) else {
            panic!("{all:?}")
        };
        leases.extend(items.iter().map(|l| {
            let l = map_of(l);
            (text(&l["id"]), text(&l["payload"]))
        }));
    }
    assert_eq!(leases.len(), 1200);
    let page = |path: &str, field: &str| -> Vec<String> {
        let r = get(s.ops, &format!("/api/queues/many/{path}"));
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        json_of(&r)
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e[field].as_str().unwrap().to_string())
            .collect()
    };
    let ids: Vec<String> = leases.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(page("leases?offset=1100&count=50", "id"), ids[1100..1150]);
    assert_eq!(page("leases?offset=1150&count=100", "id"), ids[1150..]);
    assert!(page("leases?offset=1200&count=100", "id").is_empty());
    assert_eq!(
        page("dead?offset=1100&count=50", "payload"),
        payloads[1100..1150]
    );
    assert_eq!(
        page("dead?offset=1190&count=25", "payload"),
        payloads[1190..]
    );
    assert!(page("dead?offset=5000&count=25", "payload").is_empty());

    let Some(browser) = Browser::start() else {
        return;
    };
    browser.resize(1280, 800);
    browser.go(&format!("http://127.0.0.1:{}/#queue/many", s.ops));
    let leased: Vec<String> = leases.iter().map(|(_, p)| p.clone()).collect();
    payload_rows(&browser, "leases", &leased[..25]);
    payload_rows(&browser, "dead", &payloads[..25]);
    let titles = browser.js(
        "return [...document.querySelectorAll('#sec-leases h2, #sec-dead h2')].map((h) => h.textContent);",
    );
    assert_eq!(
        titles,
        json!([
            "Leases (the first due first)",
            "Dead letters (the oldest first)"
        ])
    );
    // Straight to row 1,101 of each (Next 44 times shows nothing more),
    // then on with Next.
    browser.js("offsets.leases = 1100; offsets.dead = 1100; refresh(); return null;");
    payload_rows(&browser, "leases", &leased[1100..1125]);
    payload_rows(&browser, "dead", &payloads[1100..1125]);
    for list in ["leases", "dead"] {
        assert_eq!(
            pager(&browser, list),
            json!(["1101–1125 of 1,200", false, false]),
            "{list}"
        );
        browser.click(&format!("#pager-{list} button.next"));
    }
    payload_rows(&browser, "leases", &leased[1125..1150]);
    payload_rows(&browser, "dead", &payloads[1125..1150]);
    browser.js("offsets.leases = 1175; offsets.dead = 1175; refresh(); return null;");
    payload_rows(&browser, "leases", &leased[1175..]);
    payload_rows(&browser, "dead", &payloads[1175..]);
    for list in ["leases", "dead"] {
        assert_eq!(
            pager(&browser, list),
            json!(["1176–1200 of 1,200", false, true]),
            "{list}"
        );
    }
}

/// Redis gone: a banner across the page says so, and no rule claims to
/// have no queues.
#[test]
fn the_web_view_says_when_redis_is_unreachable() {
    let mut s = with_token();
    let mut c = s.proxy.client();
    // Nothing leased in tasks:*: without Redis the proxy knows none of its
    // queues.
    c.cmd(&["RPUSH", "tasks:a", "x"]);
    c.cmd(&["LPUSH", "jobs", "{\"id\":\"1\"}"]);
    let Some(browser) = Browser::start() else {
        return;
    };
    browser.resize(1280, 800);
    let base = format!("http://127.0.0.1:{}/", s.ops);
    browser.go(&base);
    browser.wait_for("the queue list", &cell("tasks:a", "ready"));
    assert!(!browser.visible("#banner"));

    s.redis.kill();
    let text = browser.wait_for(
        "the banner",
        "const b = document.getElementById('banner'); return b.hidden ? null : b.textContent;",
    );
    assert!(
        text.as_str().unwrap().starts_with("Redis is unreachable"),
        "{text}"
    );
    let tasks = browser.wait_for(
        "the glob rule without its queues",
        "const c = document.querySelector('section.rule[data-rule=\"tasks:*\"]'); \
         return c && !c.querySelector('tr[data-key]') ? c.textContent : null;",
    );
    let tasks = tasks.as_str().unwrap();
    assert!(!tasks.contains("No queue of this rule holds"), "{tasks}");
    assert!(tasks.contains("Could not list keys"), "{tasks}");
    // Across the top, under the header, full width, in red.
    let view = browser.viewport();
    let banner = browser.rect("#banner");
    let header = browser.rect("header");
    assert!(inside(banner, view), "{banner:?}");
    assert!(
        (banner[1] - (header[1] + header[3])).abs() < 1.0,
        "{banner:?}"
    );
    // The window less its scroll bar.
    let width = browser
        .js("return document.documentElement.clientWidth;")
        .as_f64()
        .unwrap();
    assert!((banner[2] - width).abs() < 1.0, "{banner:?} in {width}");
    let (_, px) = browser.shot_pixels(
        "web-view-unreachable.png",
        &[
            (banner[0] + 3.0, banner[1] + 3.0),
            (width - 4.0, banner[1] + 3.0),
        ],
    );
    assert!(px.iter().all(|&p| near(p, BANNER_BG)), "{px:?}");

    // A queue's own page says so too.
    browser.go(&format!("{base}#queue/jobs"));
    browser.wait_for(
        "the banner on the queue page",
        "const b = document.getElementById('banner'); \
         return !b.hidden && document.getElementById('q-title').textContent === 'jobs' \
           && b.textContent.startsWith('Redis is unreachable') || null;",
    );
}

/// Rate tiles follow the rule: shadow, disconnect and poison counters show
/// only where the rule can move them.
#[test]
fn rate_tiles_follow_the_rules_features() {
    let redis = Redis::start();
    let ops = free_port();
    let toml = r#"
[[queue]]
pattern = "plain"

[[queue]]
pattern = "shadowed"
shadow = true

[[queue]]
pattern = "held"
requeue_on_disconnect = true
dead_max = 100
"#;
    let _proxy = Proxy::start_with_config(
        redis.port,
        toml,
        &["--metrics", &format!("127.0.0.1:{ops}")],
    );
    let body = json_of(&get(ops, "/api/queues"));
    assert_eq!(body["rules"][1]["shadow"], json!(true));
    assert_eq!(body["rules"][2]["requeue_on_disconnect"], json!(true));
    assert_eq!(body["upstream_error"], json!(null));
    let Some(browser) = Browser::start() else {
        return;
    };
    browser.go(&format!("http://127.0.0.1:{ops}/"));
    let tiles = browser.wait_for(
        "the rate tiles",
        "const cards = [...document.querySelectorAll('section.rule')]; \
         return cards.length === 3 ? cards.map((c) => [...c.querySelectorAll('[data-rate]')] \
           .map((t) => t.getAttribute('data-rate'))) : null;",
    );
    let has = |rule: usize, rate: &str| tiles[rule].as_array().unwrap().contains(&json!(rate));
    for rate in [
        "shadow_would_redeliver",
        "disconnect_requeues",
        "poison_messages",
        "dead_dropped",
    ] {
        assert!(!has(0, rate), "plain: {rate} in {tiles}");
    }
    assert!(has(0, "pops") && has(0, "dead_letters"), "{tiles}");
    assert!(has(1, "shadow_would_redeliver"), "{tiles}");
    assert!(!has(1, "poison_messages"), "{tiles}");
    for rate in ["disconnect_requeues", "poison_messages", "dead_dropped"] {
        assert!(has(2, rate), "held: {rate} in {tiles}");
    }
    assert!(!has(2, "shadow_would_redeliver"), "{tiles}");
}
