//! A queue rule: which keys are queues, and how their messages are leased,
//! acknowledged, retried and buried.

use serde::Deserialize;

use super::duration;
use crate::glob::is_glob;

/// Where a message whose lease expired re-enters its list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Redeliver {
    /// At the end consumers pop from: it is the next message popped.
    #[default]
    Next,
    /// At the end producers push to: behind everything already waiting.
    Last,
}

/// The end of the list consumers pop from (`right` for LPUSH + BRPOP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum End {
    Left,
    #[default]
    Right,
}

/// What acknowledges a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum AckPolicy {
    /// `ACK queue id`, or `LREM` of the payload from a move destination.
    #[default]
    Explicit,
    /// Also: the next pop on the same connection from the same queue.
    NextPop,
}

/// How long a message whose lease ended without an ACK (expired, or
/// NACK without DELAY) waits before it is back in the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backoff {
    /// Back at once.
    #[default]
    None,
    /// `retry_base_ms` every time.
    Fixed,
    /// `retry_base_ms` doubled for each delivery before: base, 2×base, 4×base, ….
    Exp,
}

/// How long a lease lasts while its worker is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Hold {
    /// `lease_ms` from the pop (or from the last `QUEUE EXTEND`).
    #[default]
    Lease,
    /// As long as the connection that popped stays open (the proxy renews
    /// the lease), up to `max_hold_ms`; ended at once when it closes.
    Connection,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckId {
    /// The whole payload is the ack id.
    Payload,
    /// The ack id is this top-level field of a JSON object payload.
    JsonField(String),
}

impl<'de> Deserialize<'de> for AckId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        AckId::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl AckId {
    pub fn parse(s: &str) -> Result<AckId, String> {
        if s == "payload" {
            Ok(AckId::Payload)
        } else if let Some(field) = s.strip_prefix("json:") {
            if field.is_empty() {
                Err("ack_id \"json:\" needs a field name".into())
            } else {
                Ok(AckId::JsonField(field.to_string()))
            }
        } else {
            Err(format!(
                "ack_id must be \"payload\" or \"json:<field>\", got {s:?}"
            ))
        }
    }

    /// The field as the queue scripts take it: '' for the whole payload.
    pub fn field(&self) -> &[u8] {
        match self {
            AckId::Payload => b"",
            AckId::JsonField(f) => f.as_bytes(),
        }
    }
}

/// A command by which a job framework says, in Redis, that a job ended:
/// a family of commands that write alike (`SET` stands for `SETEX`,
/// `PSETEX` and `SETNX` too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalCommand {
    Zadd,
    Sadd,
    Hdel,
    Lrem,
    Push,
    Set,
    Hset,
    Del,
    Xadd,
}

impl SignalCommand {
    /// Every command name, with its family; the first of a family names it.
    const NAMES: [(&'static str, SignalCommand); 18] = [
        ("ZADD", SignalCommand::Zadd),
        ("SADD", SignalCommand::Sadd),
        ("HDEL", SignalCommand::Hdel),
        ("LREM", SignalCommand::Lrem),
        ("LPUSH", SignalCommand::Push),
        ("RPUSH", SignalCommand::Push),
        ("LPUSHX", SignalCommand::Push),
        ("RPUSHX", SignalCommand::Push),
        ("SET", SignalCommand::Set),
        ("SETEX", SignalCommand::Set),
        ("PSETEX", SignalCommand::Set),
        ("SETNX", SignalCommand::Set),
        ("HSET", SignalCommand::Hset),
        ("HMSET", SignalCommand::Hset),
        ("HSETNX", SignalCommand::Hset),
        ("DEL", SignalCommand::Del),
        ("UNLINK", SignalCommand::Del),
        ("XADD", SignalCommand::Xadd),
    ];

    /// The family of a command name, in any case.
    pub fn parse(name: &[u8]) -> Option<SignalCommand> {
        if !(3..=6).contains(&name.len()) {
            return None;
        }
        Self::NAMES
            .iter()
            .find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name))
            .map(|&(_, c)| c)
    }

    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(_, c)| *c == self).unwrap().0
    }

    /// Whether the job id is in the key's name (a result written under
    /// the task's id) rather than among the elements the command writes
    /// or removes (a registry's members, a hash's fields, a list's
    /// elements).
    pub fn id_in_key(self) -> bool {
        matches!(
            self,
            SignalCommand::Set | SignalCommand::Hset | SignalCommand::Del | SignalCommand::Xadd
        )
    }
}

/// A completion signal: `"ZADD rq:finished:default"`. When a client's
/// command of that name on that key succeeds, the proxy acknowledges the
/// leases whose ids it names. In the key, one `*` stands for the job id
/// (commands that write under the id's name: the SET and HSET families,
/// DEL, UNLINK, XADD) or for what the rule's `*` matched (the others,
/// whose members, fields or elements are the ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoneSignal {
    pub command: SignalCommand,
    pub key: String,
}

impl DoneSignal {
    pub fn parse(s: &str) -> Result<DoneSignal, String> {
        let mut words = s.split_whitespace();
        let (Some(name), Some(key), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!(
                "a completion signal is \"COMMAND key\" (\"ZADD rq:finished:default\"), got {s:?}"
            ));
        };
        let Some(command) = SignalCommand::parse(name.as_bytes()) else {
            let known: Vec<&str> = SignalCommand::NAMES.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "{name:?} is not a command a completion signal can be: one of {}",
                known.join(", ")
            ));
        };
        let stars = key.matches('*').count();
        if key.bytes().any(|b| matches!(b, b'?' | b'[' | b'\\')) || stars > 1 {
            return Err(format!(
                "the key of a completion signal is a name, or a name with one `*`, got {key:?}"
            ));
        }
        if command.id_in_key() && stars != 1 {
            return Err(format!(
                "{} names the job in its key: write the key with one `*` where the id stands \
                 (\"celery-task-meta-*\"), got {key:?}",
                command.name()
            ));
        }
        Ok(DoneSignal {
            command,
            key: key.to_string(),
        })
    }
}

impl<'de> Deserialize<'de> for DoneSignal {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        DoneSignal::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueRule {
    /// Exact key name, or a glob pattern (`*`, `?`, `[...]`, as Redis KEYS).
    pub pattern: String,
    #[serde(default = "default_lease_ms", deserialize_with = "duration::millis")]
    pub lease_ms: u64,
    #[serde(default = "default_max_deliveries")]
    pub max_deliveries: u32,
    /// Dead-letter list; `$queue` stands for the queue's name. Default: a
    /// list named after the queue in the queue's hash slot.
    #[serde(default)]
    pub dead_letter: Option<String>,
    #[serde(default = "default_ack_id")]
    pub ack_id: AckId,
    #[serde(default)]
    pub redeliver: Redeliver,
    #[serde(default)]
    pub pop_end: End,
    #[serde(default)]
    pub retry_backoff: Backoff,
    /// The first wait of a backoff, ms.
    #[serde(
        default = "default_retry_base_ms",
        deserialize_with = "duration::millis"
    )]
    pub retry_base_ms: u64,
    /// No wait of a backoff is longer, ms.
    #[serde(
        default = "default_retry_max_ms",
        deserialize_with = "duration::millis"
    )]
    pub retry_max_ms: u64,
    /// Up to this fraction of each wait is taken off at random, so that
    /// messages that failed together do not come back together.
    #[serde(default = "default_retry_jitter")]
    pub retry_jitter: f64,
    /// The dead-letter list holds at most this many messages (0: no limit);
    /// past it the oldest are dropped, and counted.
    #[serde(default)]
    pub dead_max: u64,
    #[serde(default)]
    pub ack: AckPolicy,
    /// When a client connection closes, the leases it took end at once
    /// rather than when they run out.
    #[serde(default)]
    pub requeue_on_disconnect: bool,
    /// Leases are recorded and reported, but a message whose lease ends
    /// without an ACK is not redelivered (only counted): what the workers
    /// would lose without enforcement.
    #[serde(default)]
    pub shadow: bool,
    /// `connection`: a lease lasts while the connection that took it is
    /// open, renewed by the proxy, for jobs of unknown length.
    #[serde(default)]
    pub hold: Hold,
    /// With `hold = "connection"`, no lease is held longer than this from
    /// its delivery (default [`DEFAULT_MAX_HOLD_MS`]).
    #[serde(default, deserialize_with = "duration::opt_millis")]
    pub max_hold_ms: Option<u64>,
    /// A message is flagged as poison once this many of its deliveries,
    /// and every one so far, ended with its worker's connection closing
    /// (0: never).
    #[serde(default = "default_poison_after")]
    pub poison_after: u32,
    /// Completion signals: writes by which a job framework says a job
    /// ended (see [`DoneSignal`]).
    #[serde(default)]
    pub done: Vec<DoneSignal>,
    /// Whether an `LREM` of a message from a move pop's destination
    /// acknowledges its lease. A framework that takes the job out of its
    /// processing list when the job starts (rq) says nothing by it.
    #[serde(default = "default_true")]
    pub lrem_acks: bool,
}

/// How long a connection holds a lease at most, unless the rule says.
pub const DEFAULT_MAX_HOLD_MS: u64 = 3_600_000;
/// The shortest lease a held rule takes: the proxy renews held leases
/// every `lease_ms / 3`, and a shorter interval would cost Redis a call per
/// queue every few milliseconds.
pub const MIN_HELD_LEASE_MS: u64 = 300;
/// The longest duration the proxy accepts anywhere (30 days): leases of
/// `QUEUE EXTEND`, `NACK … DELAY`, `QUEUE PUSH … DELAY`, `max_hold_ms`.
pub const MAX_DURATION_MS: u64 = 30 * 24 * 3600 * 1000;

impl QueueRule {
    /// Whether each lease records the connection that took it.
    pub fn tracks_connections(&self) -> bool {
        self.ack == AckPolicy::NextPop || self.requeues_on_disconnect()
    }

    /// Whether the leases a connection holds end when it closes.
    pub fn requeues_on_disconnect(&self) -> bool {
        self.requeue_on_disconnect || self.holds()
    }

    /// Whether leases last while their connection is open.
    pub fn holds(&self) -> bool {
        self.hold == Hold::Connection
    }

    /// The longest a connection holds a lease (see [`QueueRule::holds`]).
    pub fn max_hold_ms(&self) -> u64 {
        self.max_hold_ms.unwrap_or(DEFAULT_MAX_HOLD_MS)
    }

    /// The dead-letter list named without `$queue`: the same list, whatever
    /// the queue.
    pub fn fixed_dead_letter(&self) -> Option<&str> {
        self.dead_letter
            .as_deref()
            .filter(|d| !d.contains("$queue"))
    }

    /// Whether every queue the rule matches sends its dead letters to one
    /// list: a glob with a fixed `dead_letter`. (A glob that happens to
    /// match a single key counts too: telling is not worth it.)
    pub fn shares_dead_letter(&self) -> bool {
        is_glob(self.pattern.as_bytes()) && self.fixed_dead_letter().is_some()
    }
}

fn default_lease_ms() -> u64 {
    30_000
}
fn default_retry_base_ms() -> u64 {
    1_000
}
fn default_retry_max_ms() -> u64 {
    300_000
}
fn default_retry_jitter() -> f64 {
    0.1
}
fn default_max_deliveries() -> u32 {
    5
}
fn default_poison_after() -> u32 {
    3
}
fn default_true() -> bool {
    true
}
fn default_ack_id() -> AckId {
    AckId::Payload
}
