//! The Prometheus series the proxy exports, each described and present from
//! start-up (at 0), so that dashboards and alerts see a series before its
//! first event. Queue series are labelled by rule (its pattern), never by key:
//! the number of series stays bounded whatever keys clients use.
//!
//! Recording goes through handles made once (per route, per rule), never
//! through a lookup by name and labels per request. Without a metrics
//! address no recorder is installed: the handles are no-ops, and request
//! latency is not even timed (no clock reads). Counters and gauges are the
//! exporter's; histograms and the process's series are ours ([`histogram`],
//! [`process`]), rendered by [`render`] after the exporter's text.

mod histogram;
mod process;

use std::sync::{Mutex, OnceLock, RwLock};

use metrics::{Counter, Gauge};
use metrics_exporter_prometheus::PrometheusBuilder;

pub use histogram::Histogram;

use crate::config::QueueRule;

/// Where a client's request was served; the `route` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Multiplexed on a shared upstream connection.
    Shared = 0,
    /// On the client's own upstream connection.
    Dedicated = 1,
    /// A queue operation (pop, ACK, NACK, QUEUE, acknowledging LREM)
    /// carried out by the proxy's scripts.
    Queue = 2,
    /// Answered by the proxy alone (QUIT, RESET, protocol errors, refusals).
    Proxy = 3,
}

const ROUTES: [&str; 4] = ["shared", "dedicated", "queue", "proxy"];

/// Request latency buckets, in µs: 50 µs to 10 s.
const LATENCY_BUCKETS: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];
/// Pop → ACK buckets, in ms: 10 ms to 1 h.
const ACK_BUCKETS: &[u64] = &[
    10, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000,
    1_800_000, 3_600_000,
];

const COMMANDS: &str = "ackproxy_commands_total";
const COMMAND_SECONDS: &str = "ackproxy_command_duration_seconds";
const COMMAND_SECONDS_HELP: &str = "Request received to reply written, by route.";
const ACK_SECONDS: &str = "ackproxy_ack_latency_seconds";
const ACK_SECONDS_HELP: &str = "Pop to ACK of acknowledged leases, by rule.";

/// The Prometheus exporter of the counters and gauges.
pub fn builder() -> PrometheusBuilder {
    PrometheusBuilder::new()
}

/// The request-timing clock: the monotonic clock in µs, at least 1 (0
/// stands for "not timed"). Read twice per request while timing is on, so
/// read directly: through `Instant` each read and difference cost three
/// times the instructions (checked subtraction of `timespec`s).
pub fn now_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always
    // exists on Linux, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000).max(1)
}

/// Client connections, requests and parked pops.
pub struct Clients {
    pub connections: Gauge,
    pub connections_total: Counter,
    pub rejected: Counter,
    pub tls_failures: Counter,
    pub parked: Gauge,
    pub polling: Gauge,
    commands: [Counter; 4],
}

impl Clients {
    pub fn commands(&self, route: Route) -> &Counter {
        &self.commands[route as usize]
    }
}

/// The proxy's connections to Redis.
pub struct Upstream {
    pub connects: Counter,
    pub errors: Counter,
    pub reconnects: Counter,
    pub shared: Gauge,
    /// Clients' own connections, in use.
    pub dedicated: Gauge,
    /// Connections opened ahead of need, for clients' own (see
    /// `upstream::ready`); in no client's use yet.
    pub pooled: Gauge,
    /// Shared connections of logged-in users (one per user and password).
    pub user: Gauge,
    /// 1 while Redis is reachable: see [`upstream_up`].
    up: Gauge,
}

/// Request latency per route: request received → reply written, in µs.
pub struct Latency {
    per_route: [Histogram; 4],
}

impl Latency {
    pub fn route(&self, route: Route) -> &Histogram {
        &self.per_route[route as usize]
    }
}

/// Acknowledgement latencies kept per rule for `QUEUE INFO`'s suggestion:
/// the last [`RECENT_ACKS`] of them, in a ring.
pub const RECENT_ACKS: usize = 1024;

/// The series of one queue rule, and its recent ack latencies.
pub struct Rule {
    /// In [`QUEUE_COUNTERS`] order.
    counters: Vec<Counter>,
    pub ready: Gauge,
    pub leased: Gauge,
    pub delayed: Gauge,
    pub dead: Gauge,
    pub oldest_lease_age: Gauge,
    ack_latency: Histogram,
    recent: Mutex<Recent>,
}

#[derive(Default)]
struct Recent {
    ms: Vec<u64>,
    next: usize,
}

impl Rule {
    /// The counter of [`QUEUE_COUNTERS`] named `name`, if there is one.
    pub fn counter(&self, name: &str) -> Option<&Counter> {
        let i = QUEUE_COUNTERS.iter().position(|(n, _)| *n == name)?;
        self.counters.get(i)
    }

    /// One acknowledged lease, `ms` after its message was popped.
    pub fn acked_after(&self, ms: u64) {
        self.ack_latency.record(ms);
        let mut r = self.recent.lock().unwrap();
        if r.ms.len() < RECENT_ACKS {
            r.ms.push(ms);
        } else {
            let at = r.next;
            r.ms[at] = ms;
        }
        r.next = (r.next + 1) % RECENT_ACKS;
    }

    /// The 99th percentile of the recent ack latencies, in ms, and how many
    /// there are; `None` before the first.
    pub fn ack_p99(&self) -> Option<(u64, usize)> {
        let mut ms = self.recent.lock().unwrap().ms.clone();
        if ms.is_empty() {
            return None;
        }
        let rank = (ms.len() * 99).div_ceil(100) - 1;
        let (_, p99, _) = ms.select_nth_unstable(rank);
        Some((*p99, ms.len()))
    }
}

const COUNTERS: &[(&str, &str)] = &[
    ("ackproxy_connections_total", "Client connections accepted."),
    (
        "ackproxy_rejected_connections_total",
        "Clients refused at maxclients.",
    ),
    (
        "ackproxy_tls_handshake_failures_total",
        "Clients of the TLS listener whose handshake failed or timed out.",
    ),
    (
        "ackproxy_upstream_connects_total",
        "Shared upstream connections opened (the proxy's and logged-in users').",
    ),
    (
        "ackproxy_upstream_errors_total",
        "Shared upstream connections (the proxy's and logged-in users') that could not be made or broke.",
    ),
    (
        "ackproxy_upstream_reconnects_total",
        "Shared upstream connections made again after an outage.",
    ),
];

const GAUGES: &[(&str, &str)] = &[
    ("ackproxy_connections_open", "Client connections open now."),
    (
        "ackproxy_parked_clients",
        "Blocking pops on queues waiting in the proxy.",
    ),
    (
        "ackproxy_wakeup_polling",
        "1 while keyspace notifications are unavailable and parked pops poll.",
    ),
    (
        "ackproxy_upstream_up",
        "1 while Redis is reachable: 0 from the moment a shared upstream connection fails or cannot be made until one is made again.",
    ),
    (
        RELOAD_SUCCESS,
        "1 if the last configuration reload (SIGHUP) succeeded, 0 if it failed.",
    ),
    (
        RELOAD_TIME,
        "When the configuration was last loaded successfully (start-up or SIGHUP), in seconds since the epoch.",
    ),
    (
        SAMPLED_TIME,
        "When the queue gauges were last sampled from Redis, in seconds since the epoch; it stands still while Redis cannot be asked, and the gauges keep their last values.",
    ),
];

const RELOAD_SUCCESS: &str = "ackproxy_config_reload_success";
const RELOAD_TIME: &str = "ackproxy_config_reload_timestamp_seconds";
const BUILD_INFO: &str = "ackproxy_build_info";
const SAMPLED_TIME: &str = "ackproxy_queue_sampled_timestamp_seconds";

/// Counters per queue rule (the operations API reports them per rule);
/// `queue::tally` maps the scripts' events onto them.
pub const QUEUE_COUNTERS: &[(&str, &str)] = &[
    ("ackproxy_pops_total", "Messages popped and leased."),
    (
        "ackproxy_acks_total",
        "Leases released by ACK or by LREM on a move destination.",
    ),
    (
        "ackproxy_late_acks_total",
        "ACKs after the lease ended, before the redelivery was popped.",
    ),
    ("ackproxy_nacks_total", "Leases ended by NACK."),
    (
        "ackproxy_redeliveries_total",
        "Leases ended without an ACK whose message went back to the queue.",
    ),
    (
        "ackproxy_dead_letters_total",
        "Leases ended without an ACK whose message went to the dead-letter list.",
    ),
    (
        "ackproxy_expiries_total",
        "Leases that ran out (a crashed or slow worker), as opposed to NACKs.",
    ),
    (
        "ackproxy_delayed_promoted_total",
        "Delayed messages moved into their list when due.",
    ),
    (
        "ackproxy_redriven_total",
        "Dead letters returned to their queue by QUEUE REDRIVE.",
    ),
    (
        "ackproxy_dead_dropped_total",
        "Oldest dead letters dropped to keep the list within dead_max.",
    ),
    (
        "ackproxy_disconnect_requeues_total",
        "Leases ended at once because the connection holding them closed.",
    ),
    (
        "ackproxy_shadow_would_redeliver_total",
        "Shadow mode: leases that ended without an ACK, whose message would have been redelivered.",
    ),
    (
        "ackproxy_poison_messages_total",
        "Messages flagged as poison: poison_after of their deliveries, and every one so far, ended with the worker's connection closing.",
    ),
];

const QUEUE_GAUGES: &[(&str, &str)] = &[
    (
        "ackproxy_queue_ready",
        "Messages ready in the rule's known queues, as last sampled.",
    ),
    (
        "ackproxy_queue_leased",
        "Messages leased in the rule's known queues, as last sampled.",
    ),
    (
        "ackproxy_queue_delayed",
        "Messages waiting for their delivery time in the rule's known queues, as last sampled.",
    ),
    (
        "ackproxy_queue_dead",
        "Messages in the rule's dead-letter lists, as last sampled.",
    ),
    (
        "ackproxy_queue_oldest_lease_age_seconds",
        "Age of the oldest lease in the rule's known queues, as last sampled.",
    ),
];

static CLIENTS: OnceLock<Clients> = OnceLock::new();
static UPSTREAM: OnceLock<Upstream> = OnceLock::new();
static LATENCY: OnceLock<Latency> = OnceLock::new();
/// Rules by pattern. A rule's series live as long as the process (a
/// reload that drops a rule leaves its last values), so their number is
/// bounded by the patterns ever configured.
static RULES: RwLock<Option<foldhash::HashMap<String, &'static Rule>>> = RwLock::new(None);
static NO_RULE: OnceLock<Rule> = OnceLock::new();

fn new_rule(pattern: &str) -> Rule {
    let g = |name: &'static str| metrics::gauge!(name, "rule" => pattern.to_owned());
    Rule {
        counters: QUEUE_COUNTERS
            .iter()
            .map(|(name, _)| metrics::counter!(*name, "rule" => pattern.to_owned()))
            .collect(),
        ready: g("ackproxy_queue_ready"),
        leased: g("ackproxy_queue_leased"),
        delayed: g("ackproxy_queue_delayed"),
        dead: g("ackproxy_queue_dead"),
        oldest_lease_age: g("ackproxy_queue_oldest_lease_age_seconds"),
        ack_latency: Histogram::new(ACK_BUCKETS, 1_000),
        recent: Mutex::new(Recent::default()),
    }
}

/// Makes every handle, describes every series and sets it to 0. Called once
/// at start-up, after the recorder (if any) is installed; `timed` turns
/// request latency timing on.
pub fn register(rules: &[QueueRule], timed: bool) {
    for (name, help) in COUNTERS {
        metrics::describe_counter!(*name, *help);
        metrics::counter!(*name).absolute(0);
    }
    for (name, help) in GAUGES {
        metrics::describe_gauge!(*name, *help);
        metrics::gauge!(*name).set(0.0);
    }
    metrics::describe_counter!(COMMANDS, "Client requests, by route.");
    metrics::describe_counter!(
        "ackproxy_signal_acks_total",
        "Leases acknowledged by a completion signal (a rule's `done`), by rule."
    );
    metrics::describe_counter!(
        "ackproxy_signals_dropped_total",
        "Completion signals dropped past the backlog: their leases run out instead."
    );
    metrics::describe_counter!(
        "ackproxy_rule_unfit_total",
        "What a rule does not fit, by rule and reason (pop_end, destination_is_queue, script_moves)."
    );
    metrics::describe_gauge!(
        BUILD_INFO,
        "Always 1; the labels name the version and the commit the binary was built from."
    );
    metrics::gauge!(
        BUILD_INFO,
        "version" => env!("CARGO_PKG_VERSION"),
        "commit" => env!("ACKPROXY_COMMIT"),
    )
    .set(1.0);
    config_loaded(true);
    metrics::describe_gauge!(
        "ackproxy_upstream_connections",
        "Upstream connections open now, by kind (shared, dedicated, pooled, user)."
    );
    for (name, help) in QUEUE_COUNTERS.iter().chain(QUEUE_GAUGES) {
        if name.ends_with("_total") {
            metrics::describe_counter!(*name, *help);
        } else {
            metrics::describe_gauge!(*name, *help);
        }
    }
    let clients = clients();
    for route in [Route::Shared, Route::Dedicated, Route::Queue, Route::Proxy] {
        clients.commands(route).absolute(0);
    }
    let up = upstream();
    up.shared.set(0.0);
    up.dedicated.set(0.0);
    up.pooled.set(0.0);
    up.user.set(0.0);
    if timed {
        let _ = LATENCY.set(Latency {
            per_route: ROUTES.map(|_| Histogram::new(LATENCY_BUCKETS, 1_000_000)),
        });
    }
    register_rules(rules);
}

/// Makes the series of rules not seen before, at 0: at start-up, and for
/// the rules a reload adds.
pub fn register_rules(rules: &[QueueRule]) {
    let mut map = RULES.write().unwrap();
    let map = map.get_or_insert_with(foldhash::HashMap::default);
    for r in rules {
        if map.contains_key(&r.pattern) {
            continue;
        }
        let rule: &'static Rule = Box::leak(Box::new(new_rule(&r.pattern)));
        for c in &rule.counters {
            c.absolute(0);
        }
        for g in [
            &rule.ready,
            &rule.leased,
            &rule.delayed,
            &rule.dead,
            &rule.oldest_lease_age,
        ] {
            g.set(0.0);
        }
        map.insert(r.pattern.clone(), rule);
    }
}

pub fn clients() -> &'static Clients {
    CLIENTS.get_or_init(|| Clients {
        connections: metrics::gauge!("ackproxy_connections_open"),
        connections_total: metrics::counter!("ackproxy_connections_total"),
        rejected: metrics::counter!("ackproxy_rejected_connections_total"),
        tls_failures: metrics::counter!("ackproxy_tls_handshake_failures_total"),
        parked: metrics::gauge!("ackproxy_parked_clients"),
        polling: metrics::gauge!("ackproxy_wakeup_polling"),
        commands: ROUTES.map(|r| metrics::counter!(COMMANDS, "route" => r)),
    })
}

pub fn upstream() -> &'static Upstream {
    UPSTREAM.get_or_init(|| Upstream {
        connects: metrics::counter!("ackproxy_upstream_connects_total"),
        errors: metrics::counter!("ackproxy_upstream_errors_total"),
        reconnects: metrics::counter!("ackproxy_upstream_reconnects_total"),
        shared: metrics::gauge!("ackproxy_upstream_connections", "kind" => "shared"),
        dedicated: metrics::gauge!("ackproxy_upstream_connections", "kind" => "dedicated"),
        pooled: metrics::gauge!("ackproxy_upstream_connections", "kind" => "pooled"),
        user: metrics::gauge!("ackproxy_upstream_connections", "kind" => "user"),
        up: metrics::gauge!("ackproxy_upstream_up"),
    })
}

/// Whether Redis is reachable, as the proxy last found: when it asked at
/// start-up, when a shared connection was made, failed or could not be
/// made. (An idle proxy opens no shared connection, so it notices neither
/// an outage nor its end until it has something to send.)
pub fn upstream_up(up: bool) {
    upstream().up.set(if up { 1.0 } else { 0.0 });
}

/// The configuration loaded (at start-up, or by a reload), or a reload
/// that failed and changed nothing.
pub fn config_loaded(ok: bool) {
    metrics::gauge!(RELOAD_SUCCESS).set(if ok { 1.0 } else { 0.0 });
    if ok {
        metrics::gauge!(RELOAD_TIME).set(unix_now());
    }
}

/// The queue gauges were sampled, every known queue answered.
pub fn queues_sampled() {
    metrics::gauge!(SAMPLED_TIME).set(unix_now());
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Request latency histograms, when latency is timed.
pub fn latency() -> Option<&'static Latency> {
    LATENCY.get()
}

/// Appends to the exporter's text the process's series and the
/// histograms: request latency (when timed) and every rule's ack latency,
/// in a stable order.
pub fn render(out: &mut String) {
    process::render(out);
    if let Some(latency) = latency() {
        histogram::render_header(out, COMMAND_SECONDS, COMMAND_SECONDS_HELP);
        for (h, r) in latency.per_route.iter().zip(ROUTES) {
            h.render(out, COMMAND_SECONDS, ("route", r));
        }
        out.push('\n');
    }
    let mut rules = rules();
    if rules.is_empty() {
        return;
    }
    rules.sort_by(|a, b| a.0.cmp(&b.0));
    histogram::render_header(out, ACK_SECONDS, ACK_SECONDS_HELP);
    for (pattern, rule) in &rules {
        rule.ack_latency.render(out, ACK_SECONDS, ("rule", pattern));
    }
    out.push('\n');
}

/// Every rule's series, by pattern.
pub fn rules() -> Vec<(String, &'static Rule)> {
    let map = RULES.read().unwrap();
    map.iter().flatten().map(|(p, r)| (p.clone(), *r)).collect()
}

/// The series of the rule with this pattern.
pub fn rule(pattern: &str) -> &'static Rule {
    let found = RULES
        .read()
        .unwrap()
        .as_ref()
        .and_then(|m| m.get(pattern).copied());
    found.unwrap_or_else(|| NO_RULE.get_or_init(|| new_rule("")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_of_recent_acks_is_the_rank_99_percent_of_the_way_up() {
        let r = new_rule("t");
        assert_eq!(r.ack_p99(), None);
        for ms in 1..=100 {
            r.acked_after(ms);
        }
        assert_eq!(r.ack_p99(), Some((99, 100)));
        r.acked_after(5000);
        // 101 samples: rank ceil(99.99) = 100, the second largest.
        assert_eq!(r.ack_p99(), Some((100, 101)));
        // Only the most recent RECENT_ACKS count.
        for _ in 0..RECENT_ACKS {
            r.acked_after(7);
        }
        assert_eq!(r.ack_p99(), Some((7, RECENT_ACKS)));
    }
}
