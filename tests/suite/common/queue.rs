//! Reading the proxy's queue replies: field/value arrays, integers,
//! `QUEUE INFO`.

use std::collections::HashMap;

use super::{Client, Proxy, Value};

/// A queue's totals (`ackq:{TAG}:Q:stats`): the one auxiliary key that
/// outlives the queue's messages, by design (it expires on its own).
pub fn is_queue_stats(key: &str) -> bool {
    key.starts_with("ackq:") && key.ends_with(":stats")
}

/// A string reply's text; anything else as its debug form.
pub fn as_str(v: &Value) -> String {
    match v {
        Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Simple(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

/// An integer reply; fails on any other.
pub fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("not an integer: {other:?}"),
    }
}

/// A field/value reply (RESP2 flat array or RESP3 map) as a map.
pub fn fields(v: &Value) -> HashMap<String, Value> {
    let Value::Array(items) = v else {
        panic!("expected a field/value reply, got {v:?}")
    };
    assert!(items.len() % 2 == 0, "odd field/value array: {v:?}");
    items
        .chunks(2)
        .map(|kv| (as_str(&kv[0]), kv[1].clone()))
        .collect()
}

/// `QUEUE INFO q` on a connection of its own: a fault in a queue reply
/// then shows up in the test that looks for it, not as a confusing failure
/// in every test that reads a queue's state.
pub fn queue_info(p: &Proxy, q: &str) -> HashMap<String, Value> {
    fields(&p.client().cmd(&["QUEUE", "INFO", q]))
}

/// One field of `QUEUE INFO q`, which must be there.
pub fn queue_info_field(p: &Proxy, q: &str, field: &str) -> Value {
    let mut i = queue_info(p, q);
    i.remove(field)
        .unwrap_or_else(|| panic!("QUEUE INFO {q} has no {field:?}: {i:?}"))
}

/// An integer field of `QUEUE INFO q`.
pub fn queue_info_int(p: &Proxy, q: &str, field: &str) -> i64 {
    int(&queue_info_field(p, q, field))
}

/// `QUEUE LEASES q`, one map a lease.
pub fn queue_leases(p: &Proxy, q: &str) -> Vec<HashMap<String, Value>> {
    match p.client().cmd(&["QUEUE", "LEASES", q]) {
        Value::Array(items) => items.iter().map(fields).collect(),
        other => panic!("QUEUE LEASES {q}: expected an array, got {other:?}"),
    }
}

/// The whole list at `key`.
pub fn lrange(c: &mut Client, key: &str) -> Vec<String> {
    match c.cmd(&["LRANGE", key, "0", "-1"]) {
        Value::Array(items) => items.iter().map(as_str).collect(),
        other => panic!("LRANGE {key}: {other:?}"),
    }
}
