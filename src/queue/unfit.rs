//! What the proxy sees of a queue that its rule does not fit: pops from
//! the other end than `pop_end`, a move destination that is itself a
//! queue, a client's script that moves a rule's messages where the proxy
//! cannot see it. Each is counted every time and logged once per rule.

use std::collections::HashSet;
use std::sync::Mutex;

/// Why a rule does not fit what its clients do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unfit {
    /// Pops take from the other end than the rule's `pop_end`: redelivered
    /// messages go in behind the queue instead of next.
    PopEnd,
    /// A move pop's destination is itself a queue of some rule: the
    /// processing list would be leased as a queue.
    DestinationIsQueue,
    /// A client's script names a move destination of the rule: it may
    /// move messages inside Redis, where the proxy sees neither a job
    /// start nor its end.
    ScriptMoves,
}

impl Unfit {
    pub fn label(self) -> &'static str {
        match self {
            Unfit::PopEnd => "pop_end",
            Unfit::DestinationIsQueue => "destination_is_queue",
            Unfit::ScriptMoves => "script_moves",
        }
    }
}

/// (rule, reason) pairs already logged. Rules come from the configuration,
/// but reloads may bring new ones: past this many, nothing more is logged
/// (the counter still counts).
const LOGGED_MAX: usize = 4096;

static LOGGED: Mutex<Option<HashSet<(String, Unfit)>>> = Mutex::new(None);

/// Counts one occurrence for `rule`, and logs `why` the first time.
pub fn note(rule: &str, what: Unfit, why: impl FnOnce() -> String) {
    metrics::counter!(
        "ackproxy_rule_unfit_total",
        "rule" => rule.to_string(),
        "reason" => what.label()
    )
    .increment(1);
    let mut logged = LOGGED.lock().unwrap();
    let logged = logged.get_or_insert_with(HashSet::new);
    if logged.len() >= LOGGED_MAX || !logged.insert((rule.to_string(), what)) {
        return;
    }
    tracing::warn!(rule, reason = what.label(), "{}", why());
}
