//! The Grafana dashboard (`config/grafana-dashboard.json`) against a real
//! proxy: known queue traffic, two scrapes of `/metrics` (before and
//! after), and every panel's PromQL evaluated over them by a small
//! evaluator of the subset the dashboard uses. Every series a panel or a
//! variable names must be one the proxy exports, and the panels about
//! queues must show what the traffic did; lease growth, summed over the
//! traffic, must be the number of leases it left open.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::common::*;

const DASHBOARD: &str = include_str!("../../config/grafana-dashboard.json");

// ------------------------------------------------------------ the samples

type Labels = BTreeMap<String, String>;

/// One scrape: every sample, by name and labels. Each gets the `instance`
/// label Prometheus adds to what it scrapes.
#[derive(Default)]
struct Samples(HashMap<String, Vec<(Labels, f64)>>);

impl Samples {
    fn parse(text: &str) -> Samples {
        let mut out = Samples::default();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("name value");
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("value of {line}")),
            };
            let (name, mut labels) = match series.split_once('{') {
                Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').unwrap())),
                None => (series, Labels::new()),
            };
            labels.insert("instance".into(), "proxy:7380".into());
            out.0
                .entry(name.to_string())
                .or_default()
                .push((labels, value));
        }
        out
    }

    fn get(&self, name: &str) -> Option<&Vec<(Labels, f64)>> {
        self.0.get(name)
    }
}

/// `k="v",k2="v2"` as the exporter writes it (`\\`, `\"`, `\n` escaped).
fn parse_labels(s: &str) -> Labels {
    let mut labels = Labels::new();
    let mut chars = s.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            return labels;
        }
        assert_eq!(chars.next(), Some('"'), "label {key} of {s}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c) => value.push(c),
                    None => panic!("escape at the end of {s}"),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_string(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
}

// ------------------------------------------------------------ the evaluator

/// An instant vector (name dropped, as PromQL drops it after a function,
/// an aggregation or arithmetic, kept after a plain selector) or a number.
#[derive(Debug, Clone)]
enum Val {
    Vector(Vec<(Labels, f64)>),
    Scalar(f64),
}

/// What the expressions are evaluated over: counters' increase between
/// the two scrapes, taken as happening within `window` seconds, and
/// gauges as the second scrape has them.
struct Eval<'a> {
    before: &'a Samples,
    after: &'a Samples,
    window: f64,
    /// Every series name an expression used.
    names: Vec<String>,
}

/// Dashboard variables, all set to "All" (their `allValue`).
fn expand_variables(expr: &str) -> String {
    expr.replace("$instance", ".*").replace("$rule", ".*")
}

struct Parser<'s> {
    s: &'s [u8],
    at: usize,
}

impl<'s> Parser<'s> {
    fn new(s: &'s str) -> Parser<'s> {
        Parser {
            s: s.as_bytes(),
            at: 0,
        }
    }

    fn ws(&mut self) {
        while self.at < self.s.len() && self.s[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.at).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) {
        assert!(
            self.eat(c),
            "expected {:?} at {} of {:?}",
            c as char,
            self.at,
            String::from_utf8_lossy(self.s)
        );
    }

    fn word(&mut self) -> String {
        self.ws();
        let start = self.at;
        while self.at < self.s.len()
            && (self.s[self.at].is_ascii_alphanumeric() || matches!(self.s[self.at], b'_' | b':'))
        {
            self.at += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.at]).into_owned()
    }

    fn quoted(&mut self) -> String {
        self.expect(b'"');
        let start = self.at;
        while self.s[self.at] != b'"' {
            assert_ne!(self.s[self.at], b'\\', "escapes are not in the subset");
            self.at += 1;
        }
        self.at += 1;
        String::from_utf8_lossy(&self.s[start..self.at - 1]).into_owned()
    }

    fn done(&mut self) -> bool {
        self.peek().is_none()
    }
}

impl Eval<'_> {
    fn eval(&mut self, expr: &str) -> Val {
        let expr = expand_variables(expr);
        let mut p = Parser::new(&expr);
        let v = self.sum(&mut p);
        assert!(p.done(), "not in the subset, at {}: {expr}", p.at);
        v
    }

    /// `a + b - c …`
    fn sum(&mut self, p: &mut Parser) -> Val {
        let mut v = self.product(p);
        loop {
            if p.eat(b'+') {
                let r = self.product(p);
                v = binary(v, r, |a, b| a + b);
            } else if p.eat(b'-') {
                let r = self.product(p);
                v = binary(v, r, |a, b| a - b);
            } else {
                return v;
            }
        }
    }

    /// `a * b / c …`
    fn product(&mut self, p: &mut Parser) -> Val {
        let mut v = self.atom(p);
        loop {
            if p.eat(b'*') {
                let r = self.atom(p);
                v = binary(v, r, |a, b| a * b);
            } else if p.eat(b'/') {
                let r = self.atom(p);
                v = binary(v, r, |a, b| a / b);
            } else {
                return v;
            }
        }
    }

    fn atom(&mut self, p: &mut Parser) -> Val {
        if p.eat(b'(') {
            let v = self.sum(p);
            p.expect(b')');
            return v;
        }
        if p.peek().is_some_and(|c| c.is_ascii_digit()) {
            return Val::Scalar(number(p));
        }
        let word = p.word();
        match word.as_str() {
            "sum" | "max" | "min" => {
                let by = if p.peek() == Some(b'b') {
                    assert_eq!(p.word(), "by");
                    p.expect(b'(');
                    let mut labels = vec![p.word()];
                    while p.eat(b',') {
                        labels.push(p.word());
                    }
                    p.expect(b')');
                    labels
                } else {
                    Vec::new()
                };
                p.expect(b'(');
                let inner = self.sum(p);
                p.expect(b')');
                aggregate(&word, &by, inner)
            }
            "rate" | "increase" => {
                p.expect(b'(');
                let (name, matchers) = selector(p);
                assert!(p.eat(b'['), "{word} needs a range");
                while !p.eat(b']') {
                    p.at += 1;
                }
                p.expect(b')');
                let per = if word == "rate" { self.window } else { 1.0 };
                let after = self.select(self.after, &name, &matchers);
                let before = self.select(self.before, &name, &matchers);
                Val::Vector(
                    after
                        .into_iter()
                        .map(|(labels, v)| {
                            let was = before
                                .iter()
                                .find(|(l, _)| *l == labels)
                                .map_or(0.0, |(_, v)| *v);
                            assert!(v >= was, "{name}{labels:?} went down: not a counter");
                            (without_name(labels), (v - was) / per)
                        })
                        .collect(),
                )
            }
            "histogram_quantile" => {
                p.expect(b'(');
                let q = number(p);
                p.expect(b',');
                let inner = self.sum(p);
                p.expect(b')');
                quantile(q, inner)
            }
            name => {
                assert!(
                    name.starts_with("ackproxy_") || name.starts_with("process_"),
                    "not in the subset: {name:?}"
                );
                p.at -= name.len();
                let (name, matchers) = selector(p);
                assert!(p.peek() != Some(b'['), "a range without a function");
                Val::Vector(self.select(self.after, &name, &matchers))
            }
        }
    }

    /// The samples of one series name that the matchers select; the name
    /// must be one the proxy exports.
    fn select(
        &mut self,
        from: &Samples,
        name: &str,
        m: &[(String, bool, String)],
    ) -> Vec<(Labels, f64)> {
        self.names.push(name.to_string());
        assert!(
            self.after.get(name).is_some(),
            "the proxy exports no series {name}"
        );
        from.get(name)
            .into_iter()
            .flatten()
            .filter(|(labels, _)| {
                m.iter().all(|(k, regex, v)| {
                    let has = labels.get(k).map_or("", String::as_str);
                    if *regex {
                        v == ".*" || v == has
                    } else {
                        v == has
                    }
                })
            })
            .map(|(l, v)| {
                let mut l = l.clone();
                l.insert("__name__".into(), name.to_string());
                (l, *v)
            })
            .collect()
    }
}

fn number(p: &mut Parser) -> f64 {
    p.ws();
    let start = p.at;
    while p.at < p.s.len() && (p.s[p.at].is_ascii_digit() || p.s[p.at] == b'.') {
        p.at += 1;
    }
    std::str::from_utf8(&p.s[start..p.at])
        .unwrap()
        .parse()
        .unwrap()
}

/// `name{k="v", k=~"re"}`: the name and (label, regex?, value) matchers.
fn selector(p: &mut Parser) -> (String, Vec<(String, bool, String)>) {
    let name = p.word();
    assert!(!name.is_empty(), "a selector without a name");
    let mut matchers = Vec::new();
    if p.eat(b'{') {
        while !p.eat(b'}') {
            let label = p.word();
            let regex = p.eat(b'=') && p.eat(b'~');
            let value = p.quoted();
            matchers.push((label, regex, value));
            p.eat(b',');
        }
    }
    (name, matchers)
}

fn without_name(mut l: Labels) -> Labels {
    l.remove("__name__");
    l
}

/// Vector and vector on identical label sets (one to one), or with a
/// number on either side.
fn binary(a: Val, b: Val, op: impl Fn(f64, f64) -> f64) -> Val {
    match (a, b) {
        (Val::Scalar(x), Val::Scalar(y)) => Val::Scalar(op(x, y)),
        (Val::Vector(v), Val::Scalar(y)) => Val::Vector(
            v.into_iter()
                .map(|(l, x)| (without_name(l), op(x, y)))
                .collect(),
        ),
        (Val::Scalar(x), Val::Vector(v)) => Val::Vector(
            v.into_iter()
                .map(|(l, y)| (without_name(l), op(x, y)))
                .collect(),
        ),
        (Val::Vector(a), Val::Vector(b)) => {
            let b: Vec<(Labels, f64)> = b.into_iter().map(|(l, v)| (without_name(l), v)).collect();
            Val::Vector(
                a.into_iter()
                    .filter_map(|(l, x)| {
                        let l = without_name(l);
                        let y = b.iter().find(|(m, _)| *m == l)?.1;
                        Some((l, op(x, y)))
                    })
                    .collect(),
            )
        }
    }
}

fn aggregate(how: &str, by: &[String], v: Val) -> Val {
    let Val::Vector(v) = v else {
        panic!("{how} of a number")
    };
    let mut groups: BTreeMap<Labels, Vec<f64>> = BTreeMap::new();
    for (l, x) in v {
        let key: Labels = l.into_iter().filter(|(k, _)| by.contains(k)).collect();
        groups.entry(key).or_default().push(x);
    }
    Val::Vector(
        groups
            .into_iter()
            .map(|(l, xs)| {
                let x = match how {
                    "sum" => xs.iter().sum(),
                    "max" => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    _ => xs.iter().copied().fold(f64::INFINITY, f64::min),
                };
                (l, x)
            })
            .collect(),
    )
}

/// Prometheus's `histogram_quantile`: cumulative buckets by `le`, linear
/// within the bucket the rank falls in; NaN without observations.
fn quantile(q: f64, v: Val) -> Val {
    let Val::Vector(v) = v else {
        panic!("histogram_quantile of a number")
    };
    let mut groups: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
    for (mut l, x) in v {
        let le = l.remove("le").expect("a bucket without le");
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap()
        };
        groups.entry(without_name(l)).or_default().push((le, x));
    }
    Val::Vector(
        groups
            .into_iter()
            .map(|(l, mut buckets)| {
                buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
                let total = buckets.last().unwrap().1;
                assert!(buckets.last().unwrap().0.is_infinite(), "no +Inf bucket");
                if total == 0.0 {
                    return (l, f64::NAN);
                }
                let rank = q * total;
                let i = buckets.iter().position(|(_, c)| *c >= rank).unwrap();
                if i == buckets.len() - 1 {
                    return (l, buckets[buckets.len() - 2].0);
                }
                let (lower, below) = if i == 0 { (0.0, 0.0) } else { buckets[i - 1] };
                let (upper, count) = buckets[i];
                (
                    l,
                    lower + (upper - lower) * (rank - below) / (count - below),
                )
            })
            .collect(),
    )
}

// ------------------------------------------------------------ the dashboard

/// Every panel (rows' panels too) with its targets' expressions.
fn panels() -> Vec<(String, Vec<String>)> {
    let d: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard JSON");
    let mut out = Vec::new();
    let mut stack: Vec<serde_json::Value> = d["panels"].as_array().unwrap().clone();
    while let Some(p) = stack.pop() {
        if let Some(inner) = p["panels"].as_array() {
            stack.extend(inner.iter().cloned());
        }
        let exprs: Vec<String> = p["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                t["expr"]
                    .as_str()
                    .expect("a target without expr")
                    .to_string()
            })
            .collect();
        if !exprs.is_empty() {
            out.push((p["title"].as_str().unwrap().to_string(), exprs));
        }
    }
    out
}

/// The series the variables' `label_values(series, label)` queries read.
fn variable_series() -> Vec<String> {
    let d: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
    d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let q = v["definition"].as_str().unwrap();
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.strip_suffix(')'))
                .unwrap_or_else(|| panic!("variable query not in the subset: {q}"));
            let series = inner.rsplit_once(',').unwrap().0;
            series.split('{').next().unwrap().trim().to_string()
        })
        .collect()
}

/// The value of one panel's `target`-th expression for `rule`.
fn panel_value(
    eval: &mut Eval,
    panels: &[(String, Vec<String>)],
    title: &str,
    target: usize,
    rule: &str,
) -> f64 {
    let (_, exprs) = panels
        .iter()
        .find(|(t, _)| t == title)
        .unwrap_or_else(|| panic!("no panel {title:?}"));
    let Val::Vector(v) = eval.eval(&exprs[target]) else {
        panic!("{title}: a number")
    };
    v.iter()
        .find(|(l, _)| l.get("rule").map(String::as_str) == Some(rule))
        .map(|(_, x)| *x)
        .unwrap_or_else(|| panic!("{title}: no series for rule {rule}: {v:?}"))
}

// ------------------------------------------------------------ the traffic

const CONFIG: &str = r#"
[reaper]
interval_ms = 50

[[queue]]
pattern = "jobs"
ack_id = "payload"
lease_ms = 1000
max_deliveries = 2
dead_max = 1

[[queue]]
pattern = "shadow:*"
ack_id = "payload"
lease_ms = 500
shadow = true

[[queue]]
pattern = "disc"
ack_id = "payload"
lease_ms = 600000
requeue_on_disconnect = true
"#;

fn await_count(m: u16, name: &str, rule: &str, want: f64) {
    await_metric(m, &series(name, &[("rule", rule)]), want);
}

fn popped(v: Value) -> Vec<String> {
    match v {
        Value::Array(items) => bulk_strings(&items, "popped"),
        Value::Bulk(b) => vec![String::from_utf8(b).unwrap()],
        other => panic!("popped {other:?}"),
    }
}

#[test]
fn every_panel_evaluates_over_exported_series_and_shows_the_traffic() {
    let redis = Redis::start();
    let (proxy, m) = Proxy::start_with_metrics(redis.port, CONFIG);
    let before = Samples::parse(&scrape(m).expect("metrics endpoint"));
    let mut c = proxy.client();

    // jobs: 6 popped; 2 acknowledged, 1 nacked (redelivered), 3 expired
    // (redelivered), one of which is acknowledged late.
    assert_eq!(
        c.cmd(&["LPUSH", "jobs", "a", "b", "c", "d", "e", "f"]),
        Value::Int(6)
    );
    assert_eq!(popped(c.cmd(&["RPOP", "jobs", "6"])).len(), 6);
    assert_eq!(c.cmd(&["ACK", "jobs", "a", "b"]), Value::Int(2));
    assert_eq!(c.cmd(&["NACK", "jobs", "c"]), Value::Int(1));
    await_count(m, "ackproxy_expiries_total", "jobs", 3.0);
    assert_eq!(c.cmd(&["ACK", "jobs", "d"]), Value::Int(1));
    await_count(m, "ackproxy_late_acks_total", "jobs", 1.0);
    // c, e, f again (d's redelivery was cancelled): c acknowledged, e and
    // f expire a second time, past max_deliveries, into the dead-letter
    // list, which keeps one of them.
    let mut again = popped(c.cmd(&["RPOP", "jobs", "10"]));
    again.sort();
    assert_eq!(again, ["c", "e", "f"]);
    assert_eq!(c.cmd(&["ACK", "jobs", "c"]), Value::Int(1));
    await_count(m, "ackproxy_dead_letters_total", "jobs", 2.0);
    await_count(m, "ackproxy_dead_dropped_total", "jobs", 1.0);
    assert_eq!(c.cmd(&["QUEUE", "REDRIVE", "jobs"]), Value::Int(1));
    // One delayed message, due at once.
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "jobs", "g", "DELAY", "100"]),
        Value::Int(1)
    );
    await_count(m, "ackproxy_delayed_promoted_total", "jobs", 1.0);
    // The redriven one and g stay leased.
    let held = popped(c.cmd(&["RPOP", "jobs", "10"]));
    assert_eq!(held.len(), 2, "{held:?}");
    for id in &held {
        assert_eq!(
            c.cmd(&["QUEUE", "EXTEND", "jobs", id, "600000"]),
            Value::Int(1)
        );
    }

    // shadow: a lease that ends without an ACK is only counted.
    assert_eq!(c.cmd(&["LPUSH", "shadow:1", "s"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "shadow:1"]), Value::bulk("s"));
    await_count(m, "ackproxy_shadow_would_redeliver_total", "shadow:*", 1.0);

    // disc: the connection holding the lease closes.
    let mut worker = proxy.client();
    assert_eq!(worker.cmd(&["LPUSH", "disc", "x"]), Value::Int(1));
    assert_eq!(worker.cmd(&["RPOP", "disc"]), Value::bulk("x"));
    drop(worker);
    await_count(m, "ackproxy_disconnect_requeues_total", "disc", 1.0);

    // The leases left open, as Redis has them.
    let mut leased = |key: &str| match field(&c.cmd(&["QUEUE", "INFO", key]), "leased") {
        Some(Value::Int(n)) => n as f64,
        other => panic!("QUEUE INFO {key}: {other:?}"),
    };
    assert_eq!(leased("jobs"), 2.0);
    assert_eq!(leased("shadow:1"), 0.0);
    assert_eq!(leased("disc"), 0.0);
    // The reaper's gauges have caught up too.
    await_count(m, "ackproxy_queue_leased", "jobs", 2.0);

    let after = Samples::parse(&scrape(m).expect("metrics endpoint"));
    let mut eval = Eval {
        before: &before,
        after: &after,
        window: 1.0,
        names: Vec::new(),
    };
    let panels = panels();
    assert!(panels.len() >= 25, "{} panels", panels.len());

    // Every expression is in the subset and finds its series.
    for (title, exprs) in &panels {
        for e in exprs {
            match eval.eval(e) {
                Val::Vector(v) => assert!(!v.is_empty(), "{title}: no series for {e}"),
                Val::Scalar(_) => panic!("{title}: a number, not series: {e}"),
            }
        }
    }
    for name in variable_series() {
        assert!(
            after.get(&name).is_some(),
            "a variable reads {name}, which is not exported"
        );
        eval.names.push(name);
    }
    // The panels chart every queue counter and every series of the proxy.
    for name in after.0.keys() {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        assert!(
            eval.names
                .iter()
                .any(|n| n == name || n.starts_with(family)),
            "no panel shows {name}"
        );
    }

    // Lease growth, over the whole traffic, is the leases it left open.
    let growth =
        |eval: &mut Eval, rule: &str| panel_value(eval, &panels, "Lease growth per rule", 0, rule);
    assert_eq!(growth(&mut eval, "jobs"), 2.0);
    assert_eq!(growth(&mut eval, "shadow:*"), 0.0);
    assert_eq!(growth(&mut eval, "disc"), 0.0);

    let mut at = |title: &str, target: usize, rule: &str| {
        panel_value(&mut eval, &panels, title, target, rule)
    };
    let pops = "Pops, acks and nacks per rule";
    assert_eq!(at(pops, 0, "jobs"), 11.0);
    assert_eq!(at(pops, 1, "jobs"), 3.0);
    assert_eq!(at(pops, 2, "jobs"), 1.0);
    assert_eq!(at("Redeliveries per rule", 0, "jobs"), 4.0);
    assert_eq!(at("Redeliveries per rule", 0, "disc"), 1.0);
    assert_eq!(at("Dead letters per rule", 0, "jobs"), 2.0);
    assert_eq!(at("Late acks per rule", 0, "jobs"), 1.0);
    let ended = "Expired and disconnected leases per rule";
    assert_eq!(at(ended, 0, "jobs"), 5.0);
    assert_eq!(at(ended, 0, "shadow:*"), 1.0);
    assert_eq!(at(ended, 1, "disc"), 1.0);
    assert_eq!(at(ended, 1, "jobs"), 0.0);
    assert_eq!(at("Delayed messages promoted per rule", 0, "jobs"), 1.0);
    let dead = "Dead letters redriven and dropped per rule";
    assert_eq!(at(dead, 0, "jobs"), 1.0);
    assert_eq!(at(dead, 1, "jobs"), 1.0);
    assert_eq!(
        at("Shadow mode: would redeliver per rule", 0, "shadow:*"),
        1.0
    );
    assert_eq!(at("Shadow mode: would redeliver per rule", 0, "jobs"), 0.0);
    assert_eq!(at("In flight per rule", 0, "jobs"), 2.0);
    // Three ACKs, each within seconds of its pop.
    let p99 = at("Ack latency per rule (pop to ACK)", 1, "jobs");
    assert!(p99 > 0.0 && p99 <= 10.0, "{p99}");

    let mut total =
        |title: &str| match eval.eval(&panels.iter().find(|(t, _)| t == title).unwrap().1[0]) {
            Val::Vector(v) => v.iter().map(|(_, x)| x).sum::<f64>(),
            Val::Scalar(x) => x,
        };
    assert_eq!(total("Dead letters (1h)"), 2.0);
    assert_eq!(total("TLS handshake failures"), 0.0);
    // This test's client and nothing else.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(m, "ackproxy_connections_open") != 1.0 {
        assert!(Instant::now() < deadline, "connections did not settle");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_evaluator_takes_the_subset_as_promql_does() {
    let text = "\
ackproxy_pops_total{rule=\"a\"} 10\n\
ackproxy_pops_total{rule=\"b\"} 4\n\
ackproxy_acks_total{rule=\"a\"} 6\n\
ackproxy_queue_ready{rule=\"a\"} 3\n\
h_bucket{rule=\"a\",le=\"1\"} 2\n\
h_bucket{rule=\"a\",le=\"2\"} 4\n\
h_bucket{rule=\"a\",le=\"+Inf\"} 4\n";
    let before = Samples::parse("ackproxy_pops_total{rule=\"a\"} 2\n");
    let after = Samples::parse(text);
    let mut e = Eval {
        before: &before,
        after: &after,
        window: 4.0,
        names: Vec::new(),
    };
    let by_rule = |v: Val| match v {
        Val::Vector(v) => v
            .into_iter()
            .map(|(l, x)| (l.get("rule").cloned().unwrap_or_default(), x))
            .collect::<BTreeMap<_, _>>(),
        Val::Scalar(x) => panic!("{x}"),
    };
    // rate: the increase per second; a series only in the second scrape
    // started at 0; an unmatched side drops out of a difference.
    let r = by_rule(e.eval(
        "sum by (rule) (rate(ackproxy_pops_total{rule=~\"$rule\"}[5m])) - sum by (rule) (rate(ackproxy_acks_total[5m]))",
    ));
    assert_eq!(r, BTreeMap::from([("a".to_string(), 0.5)]));
    let r = by_rule(e.eval("sum(increase(ackproxy_pops_total[1h])) * 2"));
    assert_eq!(r, BTreeMap::from([(String::new(), 24.0)]));
    let r = by_rule(e.eval("max by (rule) (ackproxy_queue_ready{instance=~\"$instance\"}) / 3"));
    assert_eq!(r, BTreeMap::from([("a".to_string(), 1.0)]));
    let r = by_rule(e.eval("histogram_quantile(0.75, sum by (rule, le) (increase(h_bucket[1m])))"));
    assert_eq!(r, BTreeMap::from([("a".to_string(), 1.5)]));
}

/// What a reader of each panel takes it to show: one kind of value per
/// panel (rates or levels, never both on one axis), what the title says
/// and nothing else, and a 0/1 stat in words.
#[test]
fn panels_show_one_kind_of_value_and_what_their_titles_say() {
    let rate = |e: &str| e.contains("rate(") || e.contains("increase(");
    for (title, exprs) in panels() {
        let rates = exprs.iter().filter(|e| rate(e)).count();
        assert!(
            rates == 0 || rates == exprs.len(),
            "{title:?} puts levels and rates on one axis: {exprs:?}"
        );
        if title.contains("Expired") {
            assert!(
                exprs.iter().all(|e| !e.contains("poison")),
                "{title:?} plots poison flags: {exprs:?}"
            );
        }
    }
    assert!(panels()
        .iter()
        .any(|(t, e)| t.contains("Poison") && e.iter().any(|e| e.contains("poison"))));

    let d: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
    let flags = [
        "ackproxy_wakeup_polling",
        "ackproxy_upstream_up",
        "ackproxy_config_reload_success",
    ];
    let mut stats = 0;
    for p in d["panels"].as_array().unwrap() {
        let on_off = p["targets"].as_array().into_iter().flatten().any(|t| {
            flags
                .iter()
                .any(|f| t["expr"].as_str().unwrap().contains(f))
        });
        if p["type"] != "stat" || !on_off {
            continue;
        }
        stats += 1;
        let mappings = p["fieldConfig"]["defaults"]["mappings"].to_string();
        for value in ["\"0\"", "\"1\""] {
            assert!(
                mappings.contains(value),
                "{}: no words for {value}",
                p["title"]
            );
        }
    }
    assert!(stats > 0, "no 0/1 stat found");
}
