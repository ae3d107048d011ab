//! Completion signals (`done` in a rule, see `config::DoneSignal`): the
//! write by which a job framework says in Redis that a job ended — rq's
//! finished registry, kombu's own ack, a Celery result. A request is
//! recognised as one when the session classifies it; once Redis has
//! accepted the write, the proxy acknowledges the leases whose ids it
//! names, on its own connection, as `ACK` would (`sink.rs`).
//!
//! The framework's write and the acknowledgement are two things: the
//! client's request goes to Redis untouched, and its reply is Redis's.
//! Between the two a proxy may die; the lease then runs out and the job
//! runs again, which at-least-once allows.

pub mod sink;

use bytes::Bytes;

use crate::command::Args;
use crate::config::{DoneSignal, QueueRule, SignalCommand};
use crate::glob::is_glob;

/// Ids one request acknowledges at most; a framework names one job per
/// write. Past it the rest run out as leases do.
const IDS_PER_SIGNAL: usize = 1000;

/// A name, or a name with one `*` in it.
#[derive(Debug, Clone)]
struct Template {
    prefix: Vec<u8>,
    /// After the `*`; `None`: no `*`, the name is `prefix`.
    suffix: Option<Vec<u8>>,
}

impl Template {
    fn new(s: &str) -> Template {
        match s.split_once('*') {
            Some((p, x)) => Template {
                prefix: p.as_bytes().to_vec(),
                suffix: Some(x.as_bytes().to_vec()),
            },
            None => Template {
                prefix: s.as_bytes().to_vec(),
                suffix: None,
            },
        }
    }

    /// What the `*` matched in `name` (empty when there is no `*`), or
    /// `None` if `name` does not fit.
    fn capture<'a>(&self, name: &'a [u8]) -> Option<&'a [u8]> {
        match &self.suffix {
            None => (name == self.prefix.as_slice()).then_some(&name[..0]),
            Some(suffix) => {
                let fits = name.len() >= self.prefix.len() + suffix.len()
                    && name.starts_with(&self.prefix)
                    && name.ends_with(suffix);
                fits.then(|| &name[self.prefix.len()..name.len() - suffix.len()])
            }
        }
    }

    fn fill(&self, star: &[u8]) -> Bytes {
        let mut name = self.prefix.clone();
        if let Some(suffix) = &self.suffix {
            name.extend_from_slice(star);
            name.extend_from_slice(suffix);
        }
        Bytes::from(name)
    }
}

struct Entry {
    command: SignalCommand,
    key: Template,
    /// The queue: the rule's exact name, or its glob with the signal key's
    /// `*` put in for the rule's.
    queue: Template,
}

/// The completion signals of a set of rules.
#[derive(Default)]
pub struct Signals {
    entries: Vec<Entry>,
}

/// What a signalling request acknowledges once Redis accepts it: ids, each
/// with its queue; and the databases whose parked pops must look again
/// (`SWAPDB` changes what their keys hold and sends no keyspace event).
#[derive(Debug, Default, PartialEq)]
pub struct Fired {
    pub acks: Vec<(Bytes, Bytes)>,
    pub wake: Vec<i64>,
}

/// `SWAPDB a b`: both databases' parked pops look again once it ran.
pub fn swapped(args: Args<'_>) -> Option<Fired> {
    if args.len() != 3 || !args.is(0, "SWAPDB") {
        return None;
    }
    let db = |i| crate::command::parse_i64(args.get(i)?);
    Some(Fired {
        acks: Vec::new(),
        wake: vec![db(1)?, db(2)?],
    })
}

impl Signals {
    pub fn new(rules: &[QueueRule]) -> Signals {
        let mut entries = Vec::new();
        for rule in rules {
            // A glob rule's signals passed the configuration check only with
            // a `*` that names the queue; a glob with more is not a template.
            let glob = is_glob(rule.pattern.as_bytes());
            for DoneSignal { command, key } in &rule.done {
                if glob && (command.id_in_key() || !key.contains('*')) {
                    continue;
                }
                entries.push(Entry {
                    command: *command,
                    key: Template::new(key),
                    queue: Template::new(&rule.pattern),
                });
            }
        }
        Signals { entries }
    }

    /// The acknowledgements `args` would make, if it is a signal.
    pub fn of(&self, args: Args<'_>) -> Option<Fired> {
        let command = SignalCommand::parse(args.get(0)?)?;
        let mut fired = Fired::default();
        for e in self.entries.iter().filter(|e| e.command == command) {
            if command.id_in_key() {
                let keys = match command {
                    SignalCommand::Del => args.len(),
                    _ => 2.min(args.len()),
                };
                for i in 1..keys {
                    let key = args.get(i).unwrap_or_default();
                    if let Some(id) = e.key.capture(key).filter(|id| !id.is_empty()) {
                        fired.push(e.queue.fill(b""), id);
                    }
                }
            } else if let Some(star) = args.get(1).and_then(|k| e.key.capture(k)) {
                let queue = e.queue.fill(star);
                for id in elements(command, args) {
                    fired.push(queue.clone(), id);
                }
            }
        }
        (!fired.acks.is_empty()).then_some(fired)
    }
}

impl Fired {
    fn push(&mut self, queue: Bytes, id: &[u8]) {
        if self.acks.len() < IDS_PER_SIGNAL {
            self.acks.push((queue, Bytes::copy_from_slice(id)));
        }
    }

    /// Another signal of the same transaction.
    pub fn extend(&mut self, other: Fired) {
        let room = IDS_PER_SIGNAL.saturating_sub(self.acks.len());
        self.acks.extend(other.acks.into_iter().take(room));
        self.wake.extend(other.wake);
    }
}

/// The members, fields or elements a command writes or removes: the ids
/// of a signal whose key is a registry, a hash or a list.
fn elements<'a>(command: SignalCommand, args: Args<'a>) -> impl Iterator<Item = &'a [u8]> + 'a {
    let (from, step) = match command {
        SignalCommand::Zadd => {
            // ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member ...
            let mut i = 2;
            while args.get(i).is_some_and(|a| {
                ["NX", "XX", "GT", "LT", "CH", "INCR"]
                    .iter()
                    .any(|o| a.eq_ignore_ascii_case(o.as_bytes()))
            }) {
                i += 1;
            }
            (i + 1, 2)
        }
        // LREM key count element
        SignalCommand::Lrem => (3, 1),
        _ => (2, 1),
    };
    (from..args.len())
        .step_by(step)
        .filter_map(move |i| args.get(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(toml: &str) -> Vec<QueueRule> {
        crate::config::Config::from_toml(toml).unwrap().queues
    }

    fn args(words: &[&str]) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
        let mut buf = Vec::new();
        let mut ranges = Vec::new();
        for w in words {
            ranges.push(buf.len()..buf.len() + w.len());
            buf.extend_from_slice(w.as_bytes());
        }
        (buf, ranges)
    }

    fn fired(s: &Signals, words: &[&str]) -> Vec<(String, String)> {
        let (buf, ranges) = args(words);
        s.of(Args::new(&buf, &ranges))
            .map(|f| {
                f.acks
                    .into_iter()
                    .map(|(q, id)| {
                        (
                            String::from_utf8(q.to_vec()).unwrap(),
                            String::from_utf8(id.to_vec()).unwrap(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn pair(q: &str, id: &str) -> (String, String) {
        (q.to_string(), id.to_string())
    }

    #[test]
    fn registry_members_are_ids_of_the_exact_queue() {
        let s = Signals::new(&rules(
            "[[queue]]\npattern = \"rq:queue:default\"\n\
             done = [\"ZADD rq:finished:default\", \"ZADD rq:failed:default\"]\n",
        ));
        assert_eq!(
            fired(
                &s,
                &[
                    "zadd",
                    "rq:finished:default",
                    "NX",
                    "CH",
                    "17",
                    "a",
                    "18",
                    "b"
                ]
            ),
            vec![pair("rq:queue:default", "a"), pair("rq:queue:default", "b")]
        );
        assert_eq!(
            fired(&s, &["ZADD", "rq:failed:default", "1", "c"]),
            vec![pair("rq:queue:default", "c")]
        );
        assert!(fired(&s, &["ZADD", "rq:finished:other", "1", "c"]).is_empty());
        assert!(fired(&s, &["ZREM", "rq:finished:default", "c"]).is_empty());
        assert!(fired(&s, &["GET", "rq:finished:default"]).is_empty());
    }

    #[test]
    fn a_glob_rule_takes_its_queue_from_the_signal_key() {
        let s = Signals::new(&rules(
            "[[queue]]\npattern = \"rq:queue:*\"\ndone = [\"ZADD rq:finished:*\"]\n",
        ));
        assert_eq!(
            fired(&s, &["ZADD", "rq:finished:mail", "1", "j1"]),
            vec![pair("rq:queue:mail", "j1")]
        );
    }

    #[test]
    fn ids_in_key_names_and_in_hash_fields() {
        let s = Signals::new(&rules(
            "[[queue]]\npattern = \"celery\"\nack_id = \"json:headers.id\"\n\
             done = [\"SET celery-task-meta-*\", \"HDEL unacked\", \"DEL job:*\"]\n",
        ));
        assert_eq!(
            fired(&s, &["SET", "celery-task-meta-42", "{}", "EX", "10"]),
            vec![pair("celery", "42")]
        );
        assert_eq!(
            fired(&s, &["hdel", "unacked", "t1", "t2"]),
            vec![pair("celery", "t1"), pair("celery", "t2")]
        );
        assert_eq!(
            fired(&s, &["DEL", "job:a", "other", "job:b"]),
            vec![pair("celery", "a"), pair("celery", "b")]
        );
        // The `*` must stand for something.
        assert!(fired(&s, &["SET", "celery-task-meta-", "{}"]).is_empty());
        assert!(fired(&s, &["SET", "celery-task-meta", "{}"]).is_empty());
    }

    #[test]
    fn lrem_signals_name_the_removed_element() {
        let s = Signals::new(&rules(
            "[[queue]]\npattern = \"bq:jobs:wait\"\ndone = [\"LREM bq:jobs:active\"]\n",
        ));
        assert_eq!(
            fired(&s, &["LREM", "bq:jobs:active", "0", "7"]),
            vec![pair("bq:jobs:wait", "7")]
        );
    }

    #[test]
    fn signals_are_checked_with_the_rules() {
        let bad = [
            ("SET celery-task-meta", "one `*`"),
            ("FLUSHALL x", "not a command"),
            ("ZADD a*b*", "one `*`"),
            ("ZADD", "COMMAND key"),
        ];
        for (signal, why) in bad {
            let toml = format!("[[queue]]\npattern = \"q\"\ndone = [{signal:?}]\n");
            let err = crate::config::Config::from_toml(&toml).unwrap_err();
            assert!(err.contains(why), "{signal}: {err}");
        }
        let glob = "[[queue]]\npattern = \"q:*\"\ndone = [\"HDEL unacked\"]\n";
        let err = crate::config::Config::from_toml(glob).unwrap_err();
        assert!(err.contains("which queue"), "{err}");
    }
}
