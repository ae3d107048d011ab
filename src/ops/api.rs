//! The queue API behind the web view. Every answer comes from the proxy's
//! own `QUEUE …` command ([`Queues::admin`]), its RESP3 reply turned into
//! JSON as it is: a field the command gains shows up here and on the page
//! without a change. Errors are JSON too, `{"error": "<Redis's text>"}`,
//! with a status that says whose fault they are.
//!
//! | route | QUEUE command |
//! |---|---|
//! | `GET /api/queues` | `INFO` of every queue key found per rule, and the rule's totals |
//! | `GET /api/queues/{key}` | `INFO key` |
//! | `GET /api/queues/{key}/leases?count=n&id=i` | `LEASES key [COUNT n]`, those with id `i` |
//! | `GET /api/queues/{key}/leases?offset=o&count=n` | `LEASES key COUNT n OFFSET o` |
//! | `GET /api/queues/{key}/dead?count=n&id=i` | `DEAD key [COUNT n]`, those with id `i` |
//! | `GET /api/queues/{key}/dead?offset=o&count=n` | `DEAD key COUNT n OFFSET o` |
//! | `GET /api/queues/{key}/ready?offset=o&count=n` | `LRANGE key …`, from the pop end |
//! | `GET /api/queues/{key}/delayed?offset=o&count=n` | `ZRANGE <delayed set> o o+n-1 WITHSCORES` |
//! | `POST /api/queues/{key}/redrive?count=n` | `REDRIVE key [COUNT n]` (admin) |
//! | `POST /api/queues/{key}/purge` | `PURGE key DEAD` (admin) |
//! | `POST /api/queues/{key}/dead/retry` `{id, payload}` | `REDRIVE key ID id payload` (admin) |
//! | `POST /api/queues/{key}/dead/delete` `{id, payload}` | `PURGE key DEAD ID id payload` (admin) |
//!
//! Admin routes take the bearer token or a session (see [`super::session`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::session::{self, Denied, Sessions};
use crate::queue::Queues;

/// Queue keys listed per rule at most; the page says when there are more.
pub const KEYS_PER_RULE: usize = 200;
/// SCAN calls per glob rule and listing, each looking at about
/// [`SCAN_COUNT`] keys: a large keyspace is sampled, not walked.
const SCAN_ROUNDS: usize = 50;
const SCAN_COUNT: &[u8] = b"1000";
/// A listing is served again for this long. It needs no token and any page
/// in a browser on this host can ask for it, so without this each request
/// would cost Redis up to thousands of commands.
const LISTING_FOR: Duration = Duration::from_secs(1);

pub struct Ops {
    pub handle: PrometheusHandle,
    pub queues: Arc<Queues>,
    pub admin_token: Option<String>,
    pub listing: Listing,
    pub sessions: Sessions,
}

/// The last queue listing and when it was made. Requests that arrive while
/// one is being made wait for it rather than make their own.
#[derive(Default)]
pub struct Listing {
    last: tokio::sync::Mutex<Option<(Instant, Arc<Value>)>>,
}

/// Why a request got no data, and the status that tells whose fault it is.
#[derive(Debug)]
pub enum ApiError {
    /// No rule makes the key a queue (or there are no rules).
    NotFound(String),
    /// Arguments the QUEUE command refused (a COUNT out of range, ...).
    BadRequest(String),
    /// This proxy's QUEUE command has no such subcommand.
    NotImplemented(String),
    /// Redis could not be reached or the connection broke.
    Unavailable(String),
    /// Any other error Redis answered (WRONGTYPE, OOM, NOPERM, ...).
    Redis(String),
    /// Actions are off: no `admin_token` is configured.
    ActionsDisabled,
    /// The bearer token is missing or wrong.
    Unauthorized,
}

impl ApiError {
    /// From the text of an error reply (without `-` and CRLF).
    fn from_reply(text: String) -> ApiError {
        let msg = text.strip_prefix("ERR ").unwrap_or(&text);
        let starts = |p: &[&str]| p.iter().any(|p| msg.starts_with(p));
        if starts(&["no queue rule matches key"]) {
            ApiError::NotFound(text)
        } else if starts(&["unknown subcommand"]) {
            ApiError::NotImplemented(text)
        } else if starts(&["upstream unavailable", "upstream connection lost"]) {
            ApiError::Unavailable(text)
        } else if starts(&[
            "wrong number of arguments",
            "syntax error",
            "value is out of range",
        ]) {
            ApiError::BadRequest(text)
        } else {
            ApiError::Redis(text)
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, text) = match self {
            ApiError::NotFound(t) => (StatusCode::NOT_FOUND, t),
            ApiError::BadRequest(t) => (StatusCode::BAD_REQUEST, t),
            ApiError::NotImplemented(t) => (StatusCode::NOT_IMPLEMENTED, t),
            ApiError::Unavailable(t) => (StatusCode::SERVICE_UNAVAILABLE, t),
            ApiError::Redis(t) => (StatusCode::BAD_GATEWAY, t),
            ApiError::ActionsDisabled => (
                StatusCode::FORBIDDEN,
                "actions are disabled: no admin_token is configured".to_string(),
            ),
            ApiError::Unauthorized => {
                let body =
                    Json(json!({"error": "a valid Authorization: Bearer token is required"}));
                return (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    body,
                )
                    .into_response();
            }
        };
        (status, Json(json!({ "error": text }))).into_response()
    }
}

impl From<Denied> for ApiError {
    fn from(d: Denied) -> ApiError {
        match d {
            Denied::ActionsDisabled => ApiError::ActionsDisabled,
            Denied::Unauthorized => ApiError::Unauthorized,
        }
    }
}

/// Whether the request may act (see [`session::authorize`]).
fn authorize(ops: &Ops, headers: &HeaderMap) -> Result<(), ApiError> {
    session::authorize(ops.admin_token.as_deref(), &ops.sessions, headers).map_err(ApiError::from)
}

/// Runs `QUEUE <args>` and returns its reply as JSON.
async fn run(ops: &Ops, args: &[&[u8]]) -> Result<Value, ApiError> {
    reply_to_json(&ops.queues.admin(args).await)
}

fn reply_to_json(reply: &[u8]) -> Result<Value, ApiError> {
    if let Some(rest) = reply.strip_prefix(b"-") {
        let line = rest.split(|&b| b == b'\r').next().unwrap_or_default();
        return Err(ApiError::from_reply(
            String::from_utf8_lossy(line).into_owned(),
        ));
    }
    redis::parse_redis_value(reply)
        .map(to_json)
        .map_err(|e| ApiError::Redis(format!("unreadable reply: {e}")))
}

/// RESP3 → JSON: maps become objects, bulk strings text (invalid UTF-8
/// replaced), numbers numbers.
fn to_json(v: redis::Value) -> Value {
    use redis::Value as R;
    match v {
        R::Nil => Value::Null,
        R::Int(n) => n.into(),
        R::BulkString(b) => String::from_utf8_lossy(&b).into_owned().into(),
        R::SimpleString(s) => s.into(),
        R::Okay => "OK".into(),
        R::Array(items) | R::Set(items) => items.into_iter().map(to_json).collect(),
        R::Map(pairs) => {
            let mut m = Map::new();
            for (k, v) in pairs {
                let key = match to_json(k) {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                m.insert(key, to_json(v));
            }
            Value::Object(m)
        }
        R::Attribute { data, .. } => to_json(*data),
        R::Double(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        R::Boolean(b) => b.into(),
        R::VerbatimString { text, .. } => text.into(),
        R::Push { data, .. } => data.into_iter().map(to_json).collect(),
        R::ServerError(e) => json!({ "error": e.to_string() }),
        other => format!("{other:?}").into(),
    }
}

#[derive(Deserialize)]
pub struct Count {
    count: Option<u64>,
}

#[derive(Deserialize)]
pub struct Listed {
    count: Option<u64>,
    /// Only the entries with this id, among the first `count` (1,000
    /// without one, the most one QUEUE LEASES or DEAD gives).
    id: Option<String>,
    /// A page from this entry on (see [`Page`]).
    offset: Option<u64>,
}

/// The most entries a search by id looks at: the most one QUEUE LEASES or
/// DEAD gives. A search further down would read the whole list, one call
/// per thousand, for each refresh of the page.
const SEARCHED: u64 = 1000;

/// The most messages one page holds: a page costs Redis one bounded
/// command, and the page draws every row it gets.
pub const PAGE_MAX: u64 = 100;
const PAGE_DEFAULT: u64 = 25;
/// Far past any list Redis can hold, and small enough for an `i64` index.
const OFFSET_MAX: u64 = 1 << 40;

/// `offset` (from 0) and `count` of a page.
#[derive(Deserialize)]
pub struct Page {
    offset: Option<u64>,
    count: Option<u64>,
}

impl Page {
    fn bounds(&self) -> Result<(u64, u64), ApiError> {
        let count = self.count.unwrap_or(PAGE_DEFAULT);
        if !(1..=PAGE_MAX).contains(&count) {
            return Err(ApiError::BadRequest(format!(
                "count must be between 1 and {PAGE_MAX}"
            )));
        }
        let offset = self.offset.unwrap_or(0);
        if offset > OFFSET_MAX {
            return Err(ApiError::BadRequest(format!(
                "offset must be at most {OFFSET_MAX}"
            )));
        }
        Ok((offset, count))
    }
}

async fn run_listed(ops: &Ops, verb: &str, key: &str, q: Listed) -> Response {
    let Some(id) = q.id else {
        if let Some(offset) = q.offset {
            let page = Page {
                offset: Some(offset),
                count: q.count,
            };
            return respond(listed_page(ops, verb, key, page).await);
        }
        return run_counted(ops, verb, key, q.count).await;
    };
    let n = q.count.unwrap_or(SEARCHED).to_string();
    let found = run(
        ops,
        &[verb.as_bytes(), key.as_bytes(), b"COUNT", n.as_bytes()],
    )
    .await
    .map(|all| match all {
        Value::Array(items) => items
            .into_iter()
            .filter(|i| i.get("id").and_then(Value::as_str) == Some(id.as_str()))
            .collect(),
        other => other,
    });
    respond(found)
}

/// A page of leases or dead letters: one QUEUE call that reads only the
/// page, however far down it is.
async fn listed_page(ops: &Ops, verb: &str, key: &str, page: Page) -> Result<Value, ApiError> {
    let (offset, count) = page.bounds()?;
    let (o, n) = (offset.to_string(), count.to_string());
    run(
        ops,
        &[
            verb.as_bytes(),
            key.as_bytes(),
            b"COUNT",
            n.as_bytes(),
            b"OFFSET",
            o.as_bytes(),
        ],
    )
    .await
}

/// The queue's delayed set and pop end, or the error QUEUE gives for a key
/// no rule makes a queue.
fn browsed(ops: &Ops, key: &str) -> Result<(Bytes, bool), ApiError> {
    ops.queues.browse_of(key.as_bytes()).ok_or_else(|| {
        let name: String = key
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        ApiError::NotFound(format!("ERR no queue rule matches key '{name}'"))
    })
}

async fn ask(ops: &Ops, args: &[&[u8]]) -> Result<redis::Value, ApiError> {
    super::ask(&ops.queues, args)
        .await
        .map_err(ApiError::from_reply)
}

fn text_of(v: redis::Value) -> Result<String, ApiError> {
    match v {
        redis::Value::BulkString(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        redis::Value::SimpleString(s) => Ok(s),
        other => Err(ApiError::Redis(format!("unexpected reply: {other:?}"))),
    }
}

fn items_of(v: redis::Value) -> Result<Vec<redis::Value>, ApiError> {
    match v {
        redis::Value::Array(items) => Ok(items),
        other => Err(ApiError::Redis(format!("unexpected reply: {other:?}"))),
    }
}

/// Ready messages in the order they will be popped, `position` 1 the next.
pub async fn ready(
    State(ops): State<Arc<Ops>>,
    Path(key): Path<String>,
    Query(page): Query<Page>,
) -> Response {
    respond(ready_page(&ops, &key, page).await)
}

async fn ready_page(ops: &Ops, key: &str, page: Page) -> Result<Value, ApiError> {
    let (offset, count) = page.bounds()?;
    let (_, left) = browsed(ops, key)?;
    let (o, n) = (offset as i64, count as i64);
    // Consumers pop from the right end unless the rule says left: the
    // next message is the list's last.
    let (start, stop) = if left {
        (o, o + n - 1)
    } else {
        (-(o + n), -(o + 1))
    };
    let (start, stop) = (start.to_string(), stop.to_string());
    let reply = ask(
        ops,
        &[b"LRANGE", key.as_bytes(), start.as_bytes(), stop.as_bytes()],
    )
    .await?;
    let mut payloads = items_of(reply)?
        .into_iter()
        .map(text_of)
        .collect::<Result<Vec<_>, _>>()?;
    if !left {
        payloads.reverse();
    }
    Ok(payloads
        .into_iter()
        .zip(offset + 1..)
        .map(|(payload, position)| json!({ "position": position, "payload": payload }))
        .collect())
}

/// Delayed messages, the soonest due first, with when each is due.
pub async fn delayed(
    State(ops): State<Arc<Ops>>,
    Path(key): Path<String>,
    Query(page): Query<Page>,
) -> Response {
    respond(delayed_page(&ops, &key, page).await)
}

/// A delayed member is a 15-digit sequence number and a flag before the
/// payload (see `delay` in lua/common.lua).
const DELAYED_PREFIX: usize = 16;

async fn delayed_page(ops: &Ops, key: &str, page: Page) -> Result<Value, ApiError> {
    let (offset, count) = page.bounds()?;
    let (set, _) = browsed(ops, key)?;
    let (start, stop) = (offset.to_string(), (offset + count - 1).to_string());
    let reply = ask(
        ops,
        &[
            b"ZRANGE",
            &set,
            start.as_bytes(),
            stop.as_bytes(),
            b"WITHSCORES",
        ],
    )
    .await?;
    delayed_items(reply, offset)
}

/// WITHSCORES pairs, flat (RESP2) or nested (RESP3).
fn delayed_items(reply: redis::Value, offset: u64) -> Result<Value, ApiError> {
    use redis::Value as R;
    let items = items_of(reply)?;
    let mut pairs = Vec::new();
    let mut flat = items.into_iter();
    while let Some(first) = flat.next() {
        let (member, score) = match first {
            R::Array(mut pair) if pair.len() == 2 => {
                let score = pair.pop().unwrap_or(R::Nil);
                (pair.pop().unwrap_or(R::Nil), score)
            }
            member => (member, flat.next().unwrap_or(R::Nil)),
        };
        let due = match score {
            R::Double(f) => f as i64,
            R::Int(n) => n,
            other => text_of(other)?
                .parse::<f64>()
                .map_err(|e| ApiError::Redis(format!("unreadable score: {e}")))?
                as i64,
        };
        let member = text_of(member)?;
        let payload = match member.get(..DELAYED_PREFIX) {
            Some(head)
                if head.as_bytes()[..DELAYED_PREFIX - 1]
                    .iter()
                    .all(u8::is_ascii_digit) =>
            {
                member[DELAYED_PREFIX..].to_string()
            }
            _ => member,
        };
        pairs.push((payload, due));
    }
    Ok(pairs
        .into_iter()
        .zip(offset + 1..)
        .map(|((payload, due), position)| {
            json!({ "position": position, "payload": payload, "due-ms": due })
        })
        .collect())
}

/// `[verb, key]`, plus `COUNT n` when asked for.
async fn run_counted(ops: &Ops, verb: &str, key: &str, count: Option<u64>) -> Response {
    let n = count.map(|c| c.to_string());
    let mut args: Vec<&[u8]> = vec![verb.as_bytes(), key.as_bytes()];
    if let Some(n) = &n {
        args.extend([&b"COUNT"[..], n.as_bytes()]);
    }
    respond(run(ops, &args).await)
}

fn respond(r: Result<Value, ApiError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

pub async fn info(State(ops): State<Arc<Ops>>, Path(key): Path<String>) -> Response {
    respond(run(&ops, &[b"INFO", key.as_bytes()]).await)
}

pub async fn leases(
    State(ops): State<Arc<Ops>>,
    Path(key): Path<String>,
    Query(q): Query<Listed>,
) -> Response {
    run_listed(&ops, "LEASES", &key, q).await
}

pub async fn dead(
    State(ops): State<Arc<Ops>>,
    Path(key): Path<String>,
    Query(q): Query<Listed>,
) -> Response {
    run_listed(&ops, "DEAD", &key, q).await
}

pub async fn redrive(
    State(ops): State<Arc<Ops>>,
    Path(key): Path<String>,
    Query(q): Query<Count>,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = authorize(&ops, &headers) {
        return e.into_response();
    }
    tracing::info!(queue = %key, count = ?q.count, "operations: redrive dead letters");
    run_counted(&ops, "REDRIVE", &key, q.count).await
}

pub async fn purge(
    State(ops): State<Arc<Ops>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = authorize(&ops, &headers) {
        return e.into_response();
    }
    tracing::info!(queue = %key, "operations: purge dead letters");
    respond(run(&ops, &[b"PURGE", key.as_bytes(), b"DEAD"]).await)
}

/// One dead letter, as `QUEUE DEAD` lists it: its id (`null` for one
/// without a history) and its whole payload.
#[derive(Deserialize)]
pub struct Letter {
    id: Option<String>,
    payload: String,
}

pub async fn retry_one(
    State(ops): State<Arc<Ops>>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    one_letter(&ops, &key, &headers, &body, true).await
}

pub async fn delete_one(
    State(ops): State<Arc<Ops>>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    one_letter(&ops, &key, &headers, &body, false).await
}

/// The body is read only once the request is authorised.
async fn one_letter(
    ops: &Ops,
    key: &str,
    headers: &HeaderMap,
    body: &[u8],
    retry: bool,
) -> Response {
    if let Err(e) = authorize(ops, headers) {
        return e.into_response();
    }
    let l: Letter = match serde_json::from_slice(body) {
        Ok(l) => l,
        Err(e) => {
            return ApiError::BadRequest(format!("expected {{\"id\": …, \"payload\": …}}: {e}"))
                .into_response()
        }
    };
    let id = l.id.unwrap_or_default();
    let (what, args): (&str, Vec<&[u8]>) = if retry {
        ("retry", vec![b"REDRIVE", key.as_bytes(), b"ID"])
    } else {
        ("delete", vec![b"PURGE", key.as_bytes(), b"DEAD", b"ID"])
    };
    tracing::info!(queue = %key, id = %id, "operations: {what} one dead letter");
    let mut args = args;
    args.extend([id.as_bytes(), l.payload.as_bytes()]);
    match run(ops, &args).await {
        Ok(Value::Number(n)) if n.as_i64() == Some(0) => ApiError::NotFound(format!(
            "no dead letter of '{key}' has this id and payload (redriven, purged or dropped meanwhile?)"
        ))
        .into_response(),
        r => respond(r),
    }
}

/// Every rule with its totals and the `QUEUE INFO` of its queue keys, as
/// listed at most [`LISTING_FOR`] ago.
pub async fn queues(State(ops): State<Arc<Ops>>) -> Response {
    let listing = {
        let mut last = ops.listing.last.lock().await;
        match &*last {
            Some((at, listing)) if at.elapsed() < LISTING_FOR => listing.clone(),
            _ => {
                let listing = Arc::new(list(&ops).await);
                // From when it was done: a slow listing is not made again
                // back to back.
                *last = Some((Instant::now(), listing.clone()));
                listing
            }
        }
    };
    Json(&*listing).into_response()
}

async fn list(ops: &Ops) -> Value {
    let scrape = ops.handle.render();
    // The rules in force now: a reload may have changed them.
    let configured = ops.queues.rules();
    let queues = &ops.queues;
    let mut rules = Vec::with_capacity(configured.len());
    // The first sign that Redis cannot be reached, for the page's banner.
    let mut unreachable: Option<String> = None;
    for rule in &configured {
        let mut entry = json!({
            "pattern": rule.pattern,
            "lease_ms": rule.lease_ms,
            "max_deliveries": rule.max_deliveries,
            "dead_letter": rule.dead_letter,
            "hold": if rule.holds() { "connection" } else { "lease" },
            "max_hold_ms": rule.max_hold_ms(),
            "poison_after": rule.poison_after,
            "shadow": rule.shadow,
            "requeue_on_disconnect": rule.requeues_on_disconnect(),
            "dead_max": rule.dead_max,
            "totals": totals(&scrape, &rule.pattern),
            "key_limit": KEYS_PER_RULE,
        });
        let found = if queues.is_exact(&rule.pattern) {
            Ok(Found {
                keys: BTreeSet::from([Bytes::from(rule.pattern.clone())]),
                truncated: false,
            })
        } else {
            discover(queues, &rule.pattern).await
        };
        let mut listed = Vec::new();
        let (keys, truncated) = match found {
            Ok(f) => (f.keys, f.truncated),
            Err(e) => {
                if let ApiError::Unavailable(t) = ApiError::from_reply(e.clone()) {
                    unreachable.get_or_insert(t);
                }
                entry["scan_error"] = e.into();
                (known_keys(queues, &rule.pattern), false)
            }
        };
        for key in keys {
            let name = String::from_utf8_lossy(&key).into_owned();
            match reply_to_json(&queues.admin(&[b"INFO", &key]).await) {
                Ok(info) => listed.push(json!({ "key": name, "info": info })),
                Err(e) => {
                    if let ApiError::Unavailable(t) = &e {
                        unreachable.get_or_insert_with(|| t.clone());
                    }
                    listed.push(json!({ "key": name, "error": error_text(e) }))
                }
            }
        }
        entry["queues"] = listed.into();
        entry["truncated"] = truncated.into();
        rules.push(entry);
    }
    // The page computes rates from the totals of two listings: it needs
    // the time each was made, not when it got it, which is up to
    // LISTING_FOR later.
    let listed_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    json!({
        "rules": rules,
        "admin_actions": ops.admin_token.is_some(),
        "listed_at_ms": listed_at_ms,
        "upstream_error": unreachable,
    })
}

fn error_text(e: ApiError) -> String {
    match e {
        ApiError::NotFound(t)
        | ApiError::BadRequest(t)
        | ApiError::NotImplemented(t)
        | ApiError::Unavailable(t)
        | ApiError::Redis(t) => t,
        ApiError::ActionsDisabled | ApiError::Unauthorized => String::new(),
    }
}

struct Found {
    keys: BTreeSet<Bytes>,
    truncated: bool,
}

/// Queues of this rule that this proxy knows to have leases.
fn known_keys(queues: &Queues, pattern: &str) -> BTreeSet<Bytes> {
    queues
        .leased(KEYS_PER_RULE * 4)
        .into_iter()
        .filter(|k| queues.rule_of(k).as_deref() == Some(pattern))
        .take(KEYS_PER_RULE)
        .collect()
}

/// The rule's queue keys: those with leases, and lists matching the
/// pattern (a bounded SCAN, on the proxy's own connection). A key is the
/// rule's only if this rule, not an earlier one, makes it a queue.
async fn discover(queues: &Queues, pattern: &str) -> Result<Found, String> {
    let mut keys = known_keys(queues, pattern);
    let mut cursor = b"0".to_vec();
    let mut truncated = true;
    for _ in 0..SCAN_ROUNDS {
        let reply = super::ask(
            queues,
            &[
                b"SCAN",
                &cursor,
                b"MATCH",
                pattern.as_bytes(),
                b"COUNT",
                SCAN_COUNT,
                b"TYPE",
                b"list",
            ],
        )
        .await?;
        let (next, batch) = scan_page(reply)?;
        for k in batch {
            if queues.rule_of(&k).as_deref() == Some(pattern) {
                keys.insert(Bytes::from(k));
            }
        }
        cursor = next;
        if cursor == b"0" {
            truncated = false;
            break;
        }
        if keys.len() > KEYS_PER_RULE {
            break;
        }
    }
    if keys.len() > KEYS_PER_RULE {
        truncated = true;
        keys = keys.into_iter().take(KEYS_PER_RULE).collect();
    }
    Ok(Found { keys, truncated })
}

/// A SCAN reply: the next cursor and the keys of this page.
fn scan_page(reply: redis::Value) -> Result<(Vec<u8>, Vec<Vec<u8>>), String> {
    use redis::Value as R;
    let unexpected = || "SCAN: unexpected reply".to_string();
    let R::Array(mut parts) = reply else {
        return Err(unexpected());
    };
    if parts.len() != 2 {
        return Err(unexpected());
    }
    let (R::BulkString(cursor), R::Array(found)) = (parts.remove(0), parts.remove(0)) else {
        return Err(unexpected());
    };
    let keys = found
        .into_iter()
        .map(|k| match k {
            R::BulkString(k) => Ok(k),
            _ => Err(unexpected()),
        })
        .collect::<Result<_, _>>()?;
    Ok((cursor, keys))
}

/// The rule's queue counters from the exporter's own rendering, keyed by
/// the series name without `ackproxy_` and `_total` (`pops`, `acks`, ...).
fn totals(scrape: &str, pattern: &str) -> Value {
    let label = metrics_exporter_prometheus::formatting::sanitize_label_value(pattern);
    let mut m = Map::new();
    for (name, _) in crate::telemetry::QUEUE_COUNTERS {
        let prefix = format!("{name}{{rule=\"{label}\"}} ");
        let value = scrape
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        let short = name
            .trim_start_matches("ackproxy_")
            .trim_end_matches("_total");
        m.insert(short.to_string(), json!(value as u64));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_replies_become_typed_errors() {
        let e = reply_to_json(b"-ERR unknown subcommand 'DEAD'. Try QUEUE HELP.\r\n");
        assert!(matches!(e, Err(ApiError::NotImplemented(t)) if t.contains("'DEAD'")));
        let e = reply_to_json(b"-ERR no queue rule matches key 'x'\r\n");
        assert!(matches!(e, Err(ApiError::NotFound(_))));
        let e = reply_to_json(
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
        );
        assert!(matches!(e, Err(ApiError::Redis(t)) if t.starts_with("WRONGTYPE")));
        let e = reply_to_json(b"-ERR upstream unavailable: refused\r\n");
        assert!(matches!(e, Err(ApiError::Unavailable(_))));
    }

    #[test]
    fn resp3_maps_become_objects() {
        let v = reply_to_json(b"%2\r\n$5\r\nready\r\n:3\r\n$3\r\nkey\r\n$2\r\nq1\r\n").unwrap();
        assert_eq!(v, json!({"ready": 3, "key": "q1"}));
        let v = reply_to_json(b"*2\r\n%1\r\n$2\r\nid\r\n$1\r\n7\r\n_\r\n").unwrap();
        assert_eq!(v, json!([{"id": "7"}, null]));
    }

    #[test]
    fn scan_pages_are_read_and_odd_replies_refused() {
        let page =
            redis::parse_redis_value(b"*2\r\n$2\r\n17\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n").unwrap();
        assert_eq!(
            scan_page(page),
            Ok((b"17".to_vec(), vec![b"a".to_vec(), b"b".to_vec()]))
        );
        for odd in [
            &b"*1\r\n$1\r\n0\r\n"[..],
            b"*2\r\n:0\r\n*0\r\n",
            b"*2\r\n$1\r\n0\r\n*1\r\n:1\r\n",
            b"+OK\r\n",
        ] {
            let v = redis::parse_redis_value(odd).unwrap();
            assert!(scan_page(v).is_err(), "{odd:?}");
        }
    }

    #[test]
    fn delayed_members_lose_their_sequence_number() {
        let resp2 = redis::parse_redis_value(
            b"*4\r\n$18\r\n000000000000001pab\r\n$4\r\n1500\r\n$3\r\nodd\r\n$3\r\n2e3\r\n",
        )
        .unwrap();
        assert_eq!(
            delayed_items(resp2, 10).unwrap(),
            json!([
                {"position": 11, "payload": "ab", "due-ms": 1500},
                {"position": 12, "payload": "odd", "due-ms": 2000},
            ])
        );
        let resp3 =
            redis::parse_redis_value(b"*1\r\n*2\r\n$17\r\n000000000000007nx\r\n,42\r\n").unwrap();
        assert_eq!(
            delayed_items(resp3, 0).unwrap(),
            json!([{"position": 1, "payload": "x", "due-ms": 42}])
        );
        let bad = redis::parse_redis_value(b"*2\r\n$1\r\na\r\n$3\r\nabc\r\n").unwrap();
        assert!(delayed_items(bad, 0).is_err());
        assert!(delayed_items(redis::Value::Okay, 0).is_err());
    }

    #[test]
    fn pages_are_bounded() {
        let page = |offset, count| Page { offset, count }.bounds();
        assert_eq!(page(None, None).unwrap(), (0, PAGE_DEFAULT));
        assert_eq!(page(Some(250), Some(100)).unwrap(), (250, 100));
        assert!(matches!(
            page(None, Some(101)),
            Err(ApiError::BadRequest(_))
        ));
        assert!(matches!(page(None, Some(0)), Err(ApiError::BadRequest(_))));
        assert!(matches!(
            page(Some(u64::MAX), None),
            Err(ApiError::BadRequest(_))
        ));
    }

    #[test]
    fn totals_are_read_from_the_rendered_series() {
        let scrape = "# TYPE ackproxy_pops_total counter\n\
                      ackproxy_pops_total{rule=\"tasks:*\"} 12\n\
                      ackproxy_pops_total{rule=\"jobs\"} 3\n\
                      ackproxy_acks_total{rule=\"jobs\"} 2\n";
        let t = totals(scrape, "jobs");
        assert_eq!(t["pops"], 3);
        assert_eq!(t["acks"], 2);
        assert_eq!(t["dead_letters"], 0);
        assert_eq!(totals(scrape, "tasks:*")["pops"], 12);
    }
}
