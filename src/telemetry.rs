//! The Prometheus series the proxy exports, each described and present from
//! start-up (at 0), so that dashboards and alerts see a series before its
//! first event. Queue series are labelled by rule (its pattern), never by key:
//! the number of series stays bounded whatever keys clients use.

use crate::config::QueueRule;

const COUNTERS: &[(&str, &str)] = &[
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
        "Upstream connections opened.",
    ),
    (
        "ackproxy_upstream_errors_total",
        "Upstream connections that failed or broke.",
    ),
];

const GAUGES: &[(&str, &str)] = &[
    ("ackproxy_connections", "Client connections open now."),
    (
        "ackproxy_parked_clients",
        "Blocking pops on queues waiting in the proxy.",
    ),
    (
        "ackproxy_wakeup_polling",
        "1 while keyspace notifications are unavailable and parked pops poll.",
    ),
];

const ROUTES: &[&str] = &["shared", "dedicated", "queue"];

/// Counters per queue rule (the operations API reports them per rule).
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
];

/// Describes every series and sets it to 0 for each rule.
pub fn register(rules: &[QueueRule]) {
    for (name, help) in COUNTERS {
        metrics::describe_counter!(*name, *help);
        metrics::counter!(*name).absolute(0);
    }
    for (name, help) in GAUGES {
        metrics::describe_gauge!(*name, *help);
        metrics::gauge!(*name).set(0.0);
    }
    metrics::describe_counter!("ackproxy_commands_total", "Client requests, by route.");
    for route in ROUTES {
        metrics::counter!("ackproxy_commands_total", "route" => *route).absolute(0);
    }
    for (name, help) in QUEUE_COUNTERS {
        metrics::describe_counter!(*name, *help);
    }
    register_rules(rules);
}

/// Sets every per-rule series of `rules` to 0: at start, and for the rules
/// a reload adds.
pub fn register_rules(rules: &[QueueRule]) {
    for (name, _) in QUEUE_COUNTERS {
        for r in rules {
            metrics::counter!(*name, "rule" => r.pattern.clone()).absolute(0);
        }
    }
}
