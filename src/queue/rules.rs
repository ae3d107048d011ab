//! Which keys are queues: the configured rules, matched by exact name or by
//! glob (Redis `KEYS` syntax), resolved into a [`Queue`] with its key layout
//! and the script arguments its rule implies.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use tokio::sync::watch;

use crate::command::Args;
use crate::config::{AckId, AckPolicy, Backoff, End, QueueRule, Redeliver};
use crate::glob::{glob_match, is_glob};
use crate::queue::bounded::ByteBoundedMap;
use crate::queue::library::keys::{QueueKeys, CALL_KEYS};
use crate::queue::signals::{Fired, Signals};

/// One field of a rule as the scripts receive it.
#[derive(Clone, Debug, PartialEq)]
pub enum RuleValue {
    Int(u64),
    Float(f64),
    Text(&'static str),
    Owned(String),
}

/// The other half of the calling convention (the keys are `keys::GROUP`):
/// a queue's rule, each field with the name the Lua side gives it
/// (`rule(i).<name>`). Adding a rule field is one line here.
///
/// The fields travel as ONE argument, a MessagePack sequence the script
/// unpacks in C (`cmsgpack.unpack`): Redis turns every argument of a call
/// into objects and Lua strings, and a dozen arguments per queue, twice per
/// pop and ACK, cost Redis more CPU than the rest of the lease bookkeeping
/// added together.
#[allow(clippy::type_complexity)]
pub const RULE: [(&str, fn(&QueueRule) -> RuleValue); 16] = [
    ("lease", |r| RuleValue::Int(r.lease_ms)),
    ("max", |r| RuleValue::Int(r.max_deliveries.into())),
    // '' = the whole payload is the ack id.
    ("field", |r| match &r.ack_id {
        AckId::Payload => RuleValue::Text(""),
        AckId::JsonField(f) => RuleValue::Owned(f.clone()),
    }),
    ("redeliver", |r| {
        RuleValue::Text(match r.redeliver {
            Redeliver::Next => "next",
            Redeliver::Last => "last",
        })
    }),
    ("pop_end", |r| {
        RuleValue::Text(match r.pop_end {
            End::Left => "L",
            End::Right => "R",
        })
    }),
    ("backoff", |r| {
        RuleValue::Text(match r.retry_backoff {
            Backoff::None => "none",
            Backoff::Fixed => "fixed",
            Backoff::Exp => "exp",
        })
    }),
    ("base", |r| RuleValue::Int(r.retry_base_ms)),
    ("cap", |r| RuleValue::Int(r.retry_max_ms)),
    ("jitter", |r| RuleValue::Float(r.retry_jitter)),
    // 0 = no limit.
    ("dead_max", |r| RuleValue::Int(r.dead_max)),
    ("ack", |r| {
        RuleValue::Text(match r.ack {
            AckPolicy::Explicit => "explicit",
            AckPolicy::NextPop => "next-pop",
        })
    }),
    ("track", |r| RuleValue::Int(r.tracks_connections().into())),
    ("shadow", |r| RuleValue::Int(r.shadow.into())),
    // 1: leases last while their connection is open, up to max_hold ms.
    ("hold", |r| RuleValue::Int(r.holds().into())),
    ("max_hold", |r| RuleValue::Int(r.max_hold_ms())),
    // Disconnect-ended deliveries that flag a message as poison (0: never).
    ("poison", |r| RuleValue::Int(r.poison_after.into())),
];

/// ARGV values a script takes per queue for its rule.
pub const RULE_ARGS: usize = 1;

/// The rule as the MessagePack sequence of its fields, in [`RULE`] order.
fn encode_rule(rule: &QueueRule) -> Bytes {
    let mut out = Vec::new();
    for (_, field) in RULE {
        match field(rule) {
            RuleValue::Int(n) => msgpack_uint(&mut out, n),
            RuleValue::Float(f) => {
                out.push(0xcb);
                out.extend_from_slice(&f.to_be_bytes());
            }
            RuleValue::Text(s) => msgpack_str(&mut out, s),
            RuleValue::Owned(s) => msgpack_str(&mut out, &s),
        }
    }
    Bytes::from(out)
}

fn msgpack_uint(out: &mut Vec<u8>, n: u64) {
    match n {
        0..=0x7f => out.push(n as u8),
        0x80..=0xff => out.extend_from_slice(&[0xcc, n as u8]),
        0x100..=0xffff => {
            out.push(0xcd);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(0xce);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        _ => {
            out.push(0xcf);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

fn msgpack_str(out: &mut Vec<u8>, s: &str) {
    let n = s.len();
    match n {
        0..=31 => out.push(0xa0 | n as u8),
        32..=0xff => out.extend_from_slice(&[0xd9, n as u8]),
        0x100..=0xffff => {
            out.push(0xda);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            out.push(0xdb);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
    out.extend_from_slice(s.as_bytes());
}

/// Totals the proxy's scripts write in one go (see
/// [`Queue::totals_to_write`]).
const WRITTEN_AT: i64 = 100;
const WRITTEN_EVERY_MS: i64 = 1000;

/// What the proxy's own scripts count (see [`Queue::made`]), in the order
/// they pass the totals on.
#[derive(Clone, Copy)]
pub enum Made {
    Deliveries = 0,
    Acks = 1,
}

/// A queue key and everything the scripts need to know about it.
pub struct Queue {
    pub name: Bytes,
    pub keys: QueueKeys,
    pub rule: QueueRule,
    /// Why the dead-letter list may hold other queues' messages, if it may
    /// (see [`RuleSet::dead_letter_shared`]). A dead letter is its raw
    /// payload and carries no queue, so such a list can only be read whole.
    pub dead_shared: Option<String>,
    /// The rule as the script argument (see [`RULE`]).
    args: [Bytes; RULE_ARGS],
    /// `rule.pattern`, shared: each call names the rule of its queues (for
    /// the counters of its reply) without a copy.
    pub pattern: Arc<str>,
    /// The key group and the rule as a call's bulk strings, in that order:
    /// the calls of every pop and ACK take them (see `Call::queue_rule`).
    pub encoded: Bytes,
    /// Deliveries and ACKs the proxy's own scripts made that the stats
    /// hash does not count yet (see [`Queue::totals_to_write`]), and when
    /// they were last written (ms).
    unwritten: [AtomicI64; 2],
    written_at: AtomicI64,
    /// Take scripts asked for, counted for [`Queue::skiplist_turn`].
    takes: AtomicU64,
}

/// One take script in this many makes the queue's lease set a skiplist
/// (see `SKIPLIST_MARK` in `library/script.rs`): often enough that a busy
/// queue's set is one soon after it fills, and rarely enough that a queue
/// whose set empties after every ACK pays next to nothing for making one.
const SKIPLIST_EVERY: u64 = 64;

impl Queue {
    fn new(name: &[u8], rule: &QueueRule, set: &RuleSet) -> Queue {
        let keys = QueueKeys::new(name, rule.dead_letter.as_deref());
        let dead_shared = set.dead_letter_shared(name, keys.dead());
        Queue {
            name: Bytes::copy_from_slice(name),
            keys,
            rule: rule.clone(),
            dead_shared,
            args: [encode_rule(rule)],
            pattern: Arc::from(rule.pattern.as_str()),
            encoded: Bytes::new(),
            unwritten: [AtomicI64::new(0), AtomicI64::new(0)],
            written_at: AtomicI64::new(0),
            takes: AtomicU64::new(0),
        }
        .with_encoding()
    }

    /// One more delivery or ACK made by the proxy's own scripts
    /// (`library::script`), which write no total themselves: one `HINCRBY`
    /// per call cost Redis a tenth of a pop + ACK pair.
    pub fn made(&self, what: Made) {
        self.made_many(what, 1);
    }

    /// `n` of `what` at once (an LREM's acknowledgements).
    pub fn made_many(&self, what: Made, n: i64) {
        self.unwritten[what as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// The totals the next script call should add to the stats hash
    /// (deliveries, ACKs): all unwritten ones once there are
    /// [`WRITTEN_AT`] or the last write is [`WRITTEN_EVERY_MS`] old. The
    /// library batches its own totals the same way; a proxy that stops (or
    /// a rule reload that drops this queue) loses fewer than that many.
    pub fn totals_to_write(&self, now_ms: i64) -> Option<[i64; 2]> {
        let n: i64 = self
            .unwritten
            .iter()
            .map(|u| u.load(Ordering::Relaxed))
            .sum();
        let due = n >= WRITTEN_AT
            || (n > 0 && now_ms - self.written_at.load(Ordering::Relaxed) >= WRITTEN_EVERY_MS);
        if !due {
            return None;
        }
        Some(self.take_unwritten(now_ms)).filter(|t| t.iter().any(|n| *n > 0))
    }

    /// Every total not written yet, for `QUEUE INFO` to write before it
    /// reads them, and for the reaper's look at the queue: the last ones of
    /// a queue nobody pops from any more.
    pub fn take_unwritten(&self, now_ms: i64) -> [i64; 2] {
        self.written_at.store(now_ms, Ordering::Relaxed);
        [0, 1].map(|i| self.unwritten[i].swap(0, Ordering::Relaxed))
    }

    /// Whether this take script makes the lease set a skiplist: the
    /// first of the queue's, then one in [`SKIPLIST_EVERY`].
    pub fn skiplist_turn(&self) -> bool {
        self.takes
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SKIPLIST_EVERY)
    }

    /// Totals taken to write whose call failed: the next one writes them.
    pub fn unwritten_again(&self, n: [i64; 2]) {
        for (u, n) in self.unwritten.iter().zip(n) {
            u.fetch_add(n, Ordering::Relaxed);
        }
    }

    fn with_encoding(mut self) -> Queue {
        let mut out = Vec::new();
        for part in self.key_group().iter().chain(self.args.iter()) {
            out.push(b'$');
            out.extend_from_slice(itoa::Buffer::new().format(part.len()).as_bytes());
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(part);
            out.extend_from_slice(b"\r\n");
        }
        self.encoded = Bytes::from(out);
        self
    }

    /// The queue's keys as every function call takes them.
    pub fn key_group(&self) -> &[Bytes; CALL_KEYS] {
        self.keys.call_keys()
    }

    /// The queue's rule in the order every script takes it.
    pub fn rule_args(&self) -> &[Bytes; RULE_ARGS] {
        &self.args
    }

    /// Bytes this queue holds besides its name: its keys hold the name once
    /// or (aux keys: tag and name) twice, so a long name costs about twenty
    /// times over.
    fn footprint(&self) -> usize {
        let keys: usize = self.keys.all().iter().map(|k| k.len()).sum();
        let args: usize = self.args.iter().map(Bytes::len).sum::<usize>() + self.encoded.len();
        let rule = 2 * self.rule.pattern.len()
            + self.rule.dead_letter.as_ref().map_or(0, String::len)
            + self.dead_shared.as_ref().map_or(0, String::len)
            + match &self.rule.ack_id {
                AckId::Payload => 0,
                AckId::JsonField(f) => f.len(),
            };
        std::mem::size_of::<Queue>() + keys + args + rule
    }
}

/// The rules configured at one time, indexed for matching.
struct RuleSet {
    rules: Vec<QueueRule>,
    exact: foldhash::HashMap<Vec<u8>, usize>,
    globs: Vec<usize>,
    signals: Signals,
}

impl RuleSet {
    fn new(rules: &[QueueRule]) -> RuleSet {
        let mut exact = foldhash::HashMap::default();
        let mut globs = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            if is_glob(r.pattern.as_bytes()) {
                globs.push(i);
            } else {
                exact.entry(r.pattern.as_bytes().to_vec()).or_insert(i);
            }
        }
        RuleSet {
            rules: rules.to_vec(),
            exact,
            globs,
            signals: Signals::new(rules),
        }
    }

    fn rule_for(&self, key: &[u8]) -> Option<&QueueRule> {
        if let Some(&i) = self.exact.get(key) {
            return Some(&self.rules[i]);
        }
        self.globs
            .iter()
            .map(|&i| &self.rules[i])
            .find(|r| glob_match(r.pattern.as_bytes(), key))
    }

    /// The first of the rules, in their order, that matches `key`: for
    /// removed rules, kept latest removal first, that is the latest removed
    /// one ([`Rules::replace`] orders the rules one reload removes as
    /// [`RuleSet::rule_for`] chose among them).
    fn first_match(&self, key: &[u8]) -> Option<&QueueRule> {
        self.rules.iter().find(|r| {
            let p = r.pattern.as_bytes();
            if is_glob(p) {
                glob_match(p, key)
            } else {
                p == key
            }
        })
    }

    /// Whether `rule` (one of this set's) is the one that applies to `key`.
    fn governs(&self, rule: &QueueRule, key: &[u8]) -> bool {
        self.rule_for(key).is_some_and(|r| std::ptr::eq(r, rule))
    }

    /// Why the dead-letter list `dead` of `queue` may receive another key's
    /// messages; `None` if only `queue`'s dead letters can reach it under
    /// these rules. Every rule is asked
    /// which of its queues would have `dead` as their list: a fixed name
    /// names it for all of them, and a name made from the queue's
    /// (`$queue`, or the default) belongs to one queue at most, found by
    /// reading the name back.
    fn dead_letter_shared(&self, queue: &[u8], dead: &[u8]) -> Option<String> {
        let show = |b: &[u8]| -> String {
            String::from_utf8_lossy(b)
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect()
        };
        if let Some(owner) = self.rule_for(dead) {
            return Some(format!(
                "it is itself a queue, of the rule '{}'",
                show(owner.pattern.as_bytes())
            ));
        }
        for other in &self.rules {
            let candidates: Vec<Vec<u8>> = match (&other.dead_letter, other.fixed_dead_letter()) {
                (_, Some(fixed)) if fixed.as_bytes() != dead => continue,
                (_, Some(_)) if other.shares_dead_letter() => {
                    return Some(format!(
                        "the rule '{}' names it for every queue it matches",
                        show(other.pattern.as_bytes())
                    ));
                }
                (_, Some(_)) => vec![other.pattern.as_bytes().to_vec()],
                (Some(template), None) => templated_queue(template, dead).into_iter().collect(),
                (None, None) => default_dead_queues(dead),
            };
            let same_list =
                |c: &Vec<u8>| QueueKeys::new(c, other.dead_letter.as_deref()).dead() == dead;
            if let Some(c) = candidates
                .iter()
                .find(|c| c[..] != *queue && same_list(c) && self.governs(other, c))
            {
                return Some(format!("the queue '{}' has it too", show(c)));
            }
        }
        None
    }
}

/// The queue whose name, put for `$queue` in `template`, gives `dead`, if
/// one can: the substitution is one-to-one (the name's length follows from
/// the result's, and its first occurrence starts where the template says).
fn templated_queue(template: &str, dead: &[u8]) -> Option<Vec<u8>> {
    let parts: Vec<&str> = template.split("$queue").collect();
    let times = parts.len() - 1;
    let fixed: usize = parts.iter().map(|p| p.len()).sum();
    let rest = dead.len().checked_sub(fixed)?;
    if times == 0 || rest % times != 0 {
        return None;
    }
    let start = parts[0].len();
    Some(dead[start..start + rest / times].to_vec())
}

/// The queues whose default dead-letter list could be `dead`, one per form
/// of the default name (see `library/keys.rs`); the caller checks each.
fn default_dead_queues(dead: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    if let Some(q) = dead.strip_suffix(b":dead") {
        out.push(q.to_vec());
        if let Some(rest) = q.strip_prefix(b"{") {
            if let Some(inner) = rest.strip_suffix(b"}") {
                out.push(inner.to_vec());
            }
            if let Some(close) = rest.windows(2).position(|w| w == b"}:") {
                out.push(rest[close + 2..].to_vec());
            }
        }
    }
    out
}

/// The queue rules in force. SIGHUP replaces them here, in one place, so
/// the sessions, the reaper, the waiters and the owners, which all hold
/// this, see the new rules from their next lookup on.
pub struct Rules {
    set: RwLock<Arc<RuleSet>>,
    /// Rules that reloads removed, latest removal first (those one reload
    /// removed: exact names, then globs, as configured): leases taken under them
    /// (before the reload, or by a pop in flight during it) are still
    /// acknowledged, nacked and reaped under them ([`Rules::resolve_leased`]),
    /// so no lease is left that nothing ends.
    retired: RwLock<Arc<RuleSet>>,
    /// Whether `set` holds no rule: read on every pop, without the lock, so
    /// a proxy without rules pays next to nothing for queue handling.
    empty: AtomicBool,
    /// Whether some rule in force has completion signals: read on every
    /// request that may be one, without the lock.
    signalled: AtomicBool,
    /// Queues resolved under `set`; emptied when it is replaced. Filled
    /// while `set` is read-locked, so a queue resolved under the old rules
    /// cannot land in the cache after the swap.
    resolved: RwLock<ByteBoundedMap<Arc<Queue>>>,
    /// Told each time the rules are replaced (the keyspace subscription
    /// follows the patterns).
    changed: watch::Sender<()>,
}

/// Bytes of resolved queues kept. Clients choose the key names, and a queue
/// holds about twenty copies of its name, so a count limit let a few
/// hundred ACKs on 64 KB names grow the proxy by hundreds of MB. 8 MiB still
/// holds over four thousand queues with short names (about 1.5 KB each), more
/// than a deployment uses at once, while a 64 KB name is kept only a handful
/// of times.
const RESOLVED_CACHE_BYTES: usize = 8 << 20;

/// Removed rules remembered at most: far more than a configuration holds,
/// while a file that keeps changing cannot grow the list without bound.
const RETIRED_MAX: usize = 1024;

impl Rules {
    pub fn new(rules: &[QueueRule]) -> Rules {
        Rules {
            set: RwLock::new(Arc::new(RuleSet::new(rules))),
            retired: RwLock::new(Arc::new(RuleSet::new(&[]))),
            empty: AtomicBool::new(rules.is_empty()),
            signalled: AtomicBool::new(rules.iter().any(|r| !r.done.is_empty())),
            resolved: RwLock::new(ByteBoundedMap::new(RESOLVED_CACHE_BYTES)),
            changed: watch::Sender::new(()),
        }
    }

    /// Puts `rules` in force for every lookup from now on. Queues resolved
    /// before (a parked pop's) keep the rule they were resolved with.
    pub fn replace(&self, rules: &[QueueRule]) {
        let next = Arc::new(RuleSet::new(rules));
        {
            let mut set = self.set.write().unwrap();
            let mut retired = self.retired.write().unwrap();
            let mut kept: Vec<QueueRule> = Vec::new();
            // Latest removal first; among the rules removed now, in the
            // order the rules in force were chosen by: exact names, then
            // globs as configured.
            let exact = set.rules.iter().filter(|r| !is_glob(r.pattern.as_bytes()));
            let globs = set.rules.iter().filter(|r| is_glob(r.pattern.as_bytes()));
            for r in exact.chain(globs).chain(retired.rules.iter()) {
                let back = rules.iter().any(|n| n.pattern == r.pattern);
                if !back && !kept.iter().any(|k| k.pattern == r.pattern) {
                    kept.push(r.clone());
                }
            }
            kept.truncate(RETIRED_MAX);
            *retired = Arc::new(RuleSet::new(&kept));
            *set = next;
            self.resolved.write().unwrap().clear();
            self.empty.store(rules.is_empty(), Ordering::Release);
            self.signalled
                .store(rules.iter().any(|r| !r.done.is_empty()), Ordering::Release);
        }
        self.changed.send_replace(());
    }

    /// The rules in force, as configured.
    pub fn configured(&self) -> Vec<QueueRule> {
        self.set.read().unwrap().rules.clone()
    }

    /// Told when [`Rules::replace`] puts new rules in force.
    pub fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// No rule is configured: no key is a queue.
    pub fn is_empty(&self) -> bool {
        self.empty.load(Ordering::Acquire)
    }

    /// The acknowledgements `args` makes if it is a completion signal of a
    /// rule in force.
    pub fn signal(&self, args: Args<'_>) -> Option<Fired> {
        if let Some(swap) = crate::queue::signals::swapped(args).filter(|_| !self.is_empty()) {
            return Some(swap);
        }
        if !self.signalled.load(Ordering::Acquire) {
            return None;
        }
        self.set.read().unwrap().signals.of(args)
    }

    /// Whether a rule in force matches `key`. A key resolved before is
    /// found in the cache [`Rules::resolve`] reads next, so a queue request
    /// matches its keys against the rules' patterns once, not once to be
    /// recognised and again to be served.
    pub fn is_queue(&self, key: &[u8]) -> bool {
        if self.is_empty() {
            return false;
        }
        self.resolved.read().unwrap().get(key).is_some()
            || self.set.read().unwrap().rule_for(key).is_some()
    }

    pub fn resolve(&self, key: &[u8]) -> Option<Arc<Queue>> {
        if self.is_empty() {
            return None;
        }
        if let Some(q) = self.resolved.read().unwrap().get(key) {
            return Some(q.clone());
        }
        let set = self.set.read().unwrap();
        let q = Arc::new(Queue::new(key, set.rule_for(key)?, &set));
        // The key shares its buffer with `q.name`, so the name is charged once.
        let size = q.footprint();
        self.resolved
            .write()
            .unwrap()
            .insert(q.name.clone(), q.clone(), size);
        drop(set);
        Some(q)
    }

    /// The queue `key` is under the rules in force or, failing that, under
    /// the latest removed rule that matched it: for what ends leases (ACK,
    /// NACK, LREM on a move destination, the reaper, a closed connection),
    /// never for a pop.
    pub fn resolve_leased(&self, key: &[u8]) -> Option<Arc<Queue>> {
        if let Some(q) = self.resolve(key) {
            return Some(q);
        }
        let retired = self.retired.read().unwrap().clone();
        if retired.rules.is_empty() {
            return None;
        }
        retired
            .first_match(key)
            .map(|r| Arc::new(Queue::new(key, r, &retired)))
    }

    /// Whether `key` has a queue's leases to end (see [`Rules::resolve_leased`]).
    pub fn is_leased_queue(&self, key: &[u8]) -> bool {
        self.is_queue(key) || self.retired.read().unwrap().first_match(key).is_some()
    }

    /// Whether some rule, in force or removed by a reload, may have leases.
    pub fn any_leased(&self) -> bool {
        !self.is_empty() || !self.retired.read().unwrap().rules.is_empty()
    }

    /// Whether `name` is a queue named exactly (not by a glob) in the rules.
    pub fn is_exact(&self, name: &[u8]) -> bool {
        self.set.read().unwrap().exact.contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(p: &str) -> QueueRule {
        crate::config::Config::from_toml(&format!("[[queue]]\npattern = {p:?}\n"))
            .unwrap()
            .queues
            .remove(0)
    }

    #[test]
    fn exact_rules_win_and_resolution_is_cached() {
        let rules = Rules::new(&[rule("jobs*"), rule("jobs")]);
        assert!(rules.is_queue(b"jobs"));
        assert!(rules.is_queue(b"jobs2"));
        assert!(!rules.is_queue(b"other"));
        let a = rules.resolve(b"jobs").unwrap();
        let b = rules.resolve(b"jobs").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&a.key_group()[0][..], b"jobs");
    }

    /// A call's request is the same whether the queue's keys and rule come
    /// from their encoding made once or are written one by one, and both are
    /// the plain `FCALL` of every argument in turn: in database 0 the
    /// function's name, elsewhere its `_db_` name and the database number
    /// last.
    #[test]
    fn calls_from_the_encoded_keys_and_rule_are_the_same_request() {
        use crate::queue::library::call::Call;
        use crate::queue::library::{self, Function};
        // The request as an array of bulk strings, one argument after the
        // other.
        let plain = |f: &Function, db: i64, keys: &[&[u8]], argv: &[&[u8]]| {
            let numkeys = keys.len().to_string();
            let index = db.to_string();
            let name = if db == 0 { f.name() } else { f.name_db() };
            let mut args: Vec<&[u8]> = vec![b"FCALL", name.as_bytes(), numkeys.as_bytes()];
            args.extend(keys);
            args.extend(argv);
            if db != 0 {
                args.push(index.as_bytes());
            }
            let mut out = Vec::new();
            crate::upstream::push_command(&mut out, &args);
            Bytes::from(out)
        };
        let rules = Rules::new(&[rule("jobs:*")]);
        let q = rules.resolve(b"jobs:a\r\n\x00").unwrap();
        let group: Vec<&[u8]> = q.key_group().iter().map(|k| &k[..]).collect();
        let rule_args: Vec<&[u8]> = q.rule_args().iter().map(|a| &a[..]).collect();
        // RPOP of one (nothing past the rule), LPOP with a count, ACK of
        // one id and of several.
        let cases: [(&Function, &[&[u8]]); 5] = [
            (&library::POP1, &[]),
            (&library::POP1, &[b"L", b"1"]),
            (&library::POP1, &[b"R", b"25"]),
            (&library::ACK, &[b"id-1"]),
            (&library::ACK, &[b"id-1", b"", b"id-3"]),
        ];
        for (f, extra) in cases {
            let add = |mut c: Call| {
                for a in extra {
                    c = c.arg(Bytes::copy_from_slice(a));
                }
                c
            };
            let encoded = add(Call::new(f).queue_rule(&q));
            let apart = add(Call::new(f).queue(&q).rule(&q));
            let argv: Vec<&[u8]> = rule_args.iter().chain(extra).copied().collect();
            for db in [0, 3, 15] {
                let want = plain(f, db, &group, &argv);
                assert_eq!(encoded.request_in(db), want, "{} in db {db}", f.name());
                assert_eq!(apart.request_in(db), want, "{} in db {db}", f.name());
            }
            assert_eq!(encoded.request(), plain(f, 0, &group, &argv));
            // Keys added after the group: written apart, in their place.
            let more = add(Call::new(f).queue_rule(&q).key(Bytes::from_static(b"k")));
            let keys: Vec<&[u8]> = group.iter().copied().chain([&b"k"[..]]).collect();
            for db in [0, 3] {
                assert_eq!(more.request_in(db), plain(f, db, &keys, &argv));
            }
        }
    }

    #[test]
    fn cache_of_huge_names_is_bounded_in_bytes() {
        let rules = Rules::new(&[rule("big:*")]);
        let name = |i: u32| {
            let mut k = b"big:".to_vec();
            k.extend(std::iter::repeat_n(b'x', 64 * 1024));
            k.extend_from_slice(i.to_string().as_bytes());
            k
        };
        for i in 0..500 {
            assert!(rules.resolve(&name(i)).is_some());
        }
        // Each queue holds its 64 KB name many times over; whatever it is
        // charged, the names alone of what stays cached fit the budget.
        let cached = rules.resolved.read().unwrap().len();
        assert!(cached >= 1, "the latest queue is cached");
        assert!(
            cached * 64 * 1024 <= RESOLVED_CACHE_BYTES,
            "{cached} cached"
        );
        let latest = rules.resolve(&name(499)).unwrap();
        assert!(Arc::ptr_eq(&latest, &rules.resolve(&name(499)).unwrap()));
    }

    fn rule_with(p: &str, extra: &str) -> QueueRule {
        crate::config::Config::from_toml(&format!("[[queue]]\npattern = {p:?}\n{extra}\n"))
            .unwrap()
            .queues
            .remove(0)
    }

    #[test]
    fn replaced_rules_apply_to_the_next_lookup() {
        let rules = Rules::new(&[rule_with("jobs", "lease_ms = 1000"), rule("old:*")]);
        let mut told = rules.subscribe();
        let before = rules.resolve(b"jobs").unwrap();
        assert!(rules.is_queue(b"old:1"));
        rules.replace(&[rule_with("jobs", "lease_ms = 2000"), rule("new:*")]);
        assert!(told.has_changed().unwrap());
        told.borrow_and_update();
        // The cached queue of the old rule is gone; one resolved before
        // keeps its rule.
        let after = rules.resolve(b"jobs").unwrap();
        assert_eq!(after.rule.lease_ms, 2000);
        assert_eq!(before.rule.lease_ms, 1000);
        assert_ne!(after.rule_args(), before.rule_args());
        assert!(!rules.is_queue(b"old:1"));
        assert!(rules.resolve(b"old:1").is_none());
        assert!(rules.is_queue(b"new:1"));
        assert!(rules.is_exact(b"jobs"));
        assert!(!rules.is_exact(b"new:*"));
        rules.replace(&[]);
        assert!(rules.is_empty());
        assert!(!rules.is_queue(b"jobs"));
        assert!(rules.resolve(b"jobs").is_none());
        assert!(told.has_changed().unwrap());
    }

    fn shared(rules: &Rules, queue: &str) -> Option<String> {
        rules.resolve(queue.as_bytes()).unwrap().dead_shared.clone()
    }

    #[test]
    fn dead_letter_lists_other_keys_reach_are_shared() {
        let dead = |p: &str, d: &str| rule_with(p, &format!("dead_letter = {d:?}"));
        // A glob with one name for all its queues.
        let rules = Rules::new(&[dead("dl:*", "dl-dead")]);
        let why = shared(&rules, "dl:a").unwrap();
        assert!(why.contains("'dl:*' names it for every queue"), "{why}");
        // A glob with the queue's name in it, or the default: its own.
        let rules = Rules::new(&[dead("dl:*", "dead:$queue"), rule("t:*")]);
        assert_eq!(shared(&rules, "dl:a"), None);
        assert_eq!(shared(&rules, "t:a"), None);
        // Two rules naming the same list, whichever way.
        let rules = Rules::new(&[
            dead("a", "common"),
            dead("b", "common"),
            dead("c", "x:$queue"),
            dead("d", "x:c"),
            rule("e"),
        ]);
        assert!(shared(&rules, "a").unwrap().contains("'b'"));
        assert!(shared(&rules, "b").unwrap().contains("'a'"));
        assert!(shared(&rules, "c").unwrap().contains("'d'"));
        assert!(shared(&rules, "d").unwrap().contains("'c'"));
        assert_eq!(shared(&rules, "e"), None);
        // `$queue` names read back: q:y's list is also p:q:y's.
        let rules = Rules::new(&[dead("p:*", "d:$queue"), dead("q:*", "d:p:$queue")]);
        assert!(shared(&rules, "q:y").unwrap().contains("'p:q:y'"));
        assert!(shared(&rules, "p:q:y").unwrap().contains("'q:y'"));
        assert_eq!(shared(&rules, "p:x"), None);
        // Default names: `jobs` and `{jobs}` both have `{jobs}:dead`, and
        // a fixed name may be another queue's default.
        let rules = Rules::new(&[
            rule("jobs"),
            rule("{jobs}"),
            rule("t:*"),
            dead("z", "{t:1}:dead"),
        ]);
        assert!(shared(&rules, "jobs").unwrap().contains("'{jobs}'"));
        assert!(shared(&rules, "{jobs}").unwrap().contains("'jobs'"));
        assert!(shared(&rules, "t:1").unwrap().contains("'z'"));
        assert!(shared(&rules, "z").unwrap().contains("'t:1'"));
        assert_eq!(shared(&rules, "t:2"), None);
        // A rule that does not apply to the other key shares nothing: the
        // exact rule wins for `t:9`, whose list is its own.
        let rules = Rules::new(&[
            dead("t:*", "d:$queue"),
            dead("t:9", "other"),
            dead("u", "d:t:9"),
        ]);
        assert_eq!(shared(&rules, "u"), None);
        // A list that is itself a queue.
        let rules = Rules::new(&[dead("a", "b"), rule("b")]);
        assert!(shared(&rules, "a").unwrap().contains("itself a queue"));
    }

    #[test]
    fn removed_rules_still_end_their_leases() {
        let rules = Rules::new(&[rule_with("jobs", "lease_ms = 1000"), rule("old:*")]);
        assert!(rules.any_leased());
        rules.replace(&[rule("new:*")]);
        assert!(rules.resolve(b"old:1").is_none());
        assert_eq!(
            rules.resolve_leased(b"old:1").unwrap().rule.pattern,
            "old:*"
        );
        assert_eq!(rules.resolve_leased(b"jobs").unwrap().rule.lease_ms, 1000);
        assert!(rules.is_leased_queue(b"jobs"));
        assert!(rules.resolve_leased(b"other").is_none());
        assert!(!rules.is_leased_queue(b"other"));
        // A rule that comes back is in force, not removed; the latest
        // removal of a pattern wins.
        rules.replace(&[rule_with("jobs", "lease_ms = 3000")]);
        assert_eq!(rules.resolve(b"jobs").unwrap().rule.lease_ms, 3000);
        assert_eq!(
            rules.resolve_leased(b"new:1").unwrap().rule.pattern,
            "new:*"
        );
        assert!(rules.resolve_leased(b"old:1").is_some());
        rules.replace(&[]);
        assert!(rules.is_empty());
        assert!(rules.any_leased());
        assert_eq!(rules.resolve_leased(b"jobs").unwrap().rule.lease_ms, 3000);
        // Never for a pop.
        assert!(!rules.is_queue(b"jobs"));
        assert!(rules.resolve(b"jobs").is_none());
    }

    #[test]
    fn a_lease_ends_under_the_latest_removed_rule_that_matched() {
        // An exact rule removed, then a glob that also matches its queue
        // removed later: the glob, the latest, ends the queue's leases.
        let rules = Rules::new(&[rule_with("jobs", "lease_ms = 1000")]);
        rules.replace(&[rule_with("job*", "lease_ms = 2000")]);
        assert_eq!(rules.resolve_leased(b"jobs").unwrap().rule.lease_ms, 2000);
        rules.replace(&[]);
        assert_eq!(rules.resolve_leased(b"jobs").unwrap().rule.pattern, "job*");
        // The other way round: the exact rule removed last wins.
        let rules = Rules::new(&[rule("task*")]);
        rules.replace(&[rule("tasks")]);
        rules.replace(&[]);
        assert_eq!(
            rules.resolve_leased(b"tasks").unwrap().rule.pattern,
            "tasks"
        );
        assert_eq!(
            rules.resolve_leased(b"task1").unwrap().rule.pattern,
            "task*"
        );
        // Removed by one reload: chosen as while they were in force, the
        // exact name before a glob listed ahead of it.
        let rules = Rules::new(&[rule("q*"), rule("queue"), rule("qu*")]);
        rules.replace(&[]);
        assert_eq!(
            rules.resolve_leased(b"queue").unwrap().rule.pattern,
            "queue"
        );
        assert_eq!(rules.resolve_leased(b"qux").unwrap().rule.pattern, "q*");
        assert!(rules.is_leased_queue(b"queue"));
        assert!(!rules.is_leased_queue(b"other"));
    }

    #[test]
    fn removed_rules_kept_are_bounded() {
        let rules = Rules::new(&[]);
        for i in 0..RETIRED_MAX + 10 {
            rules.replace(&[rule(&format!("q{i}"))]);
        }
        rules.replace(&[]);
        assert_eq!(rules.retired.read().unwrap().rules.len(), RETIRED_MAX);
        assert!(rules
            .resolve_leased(format!("q{}", RETIRED_MAX + 9).as_bytes())
            .is_some());
        assert!(rules.resolve_leased(b"q0").is_none());
    }

    #[test]
    fn ordinary_queues_cost_about_a_kilobyte() {
        // Keeps RESOLVED_CACHE_BYTES's rationale honest: thousands fit.
        let set = RuleSet::new(&[rule("tasks:*")]);
        let q = Queue::new(b"tasks:eu:mail", &set.rules[0], &set);
        let cost = ByteBoundedMap::<()>::cost(&q.name, q.footprint());
        assert!(cost < 2000, "{cost}");
    }
}
