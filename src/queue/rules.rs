//! Which keys are queues: the configured rules, matched by exact name or by
//! glob (Redis `KEYS` syntax), resolved into a [`Queue`] with its key layout
//! and the script arguments its rule implies.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use bytes::Bytes;

use super::keys::{QueueKeys, QUEUE_GROUP};
use crate::config::{AckId, End, QueueRule, Redeliver};

/// How the Lua side reads a rule argument.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LuaType {
    Number,
    Text,
}

/// The other half of the calling convention (the keys are `keys::GROUP`):
/// a queue's rule as consecutive ARGV, each with the name the Lua side gives
/// it (`rule(i).<name>`) and how it is encoded. Adding a rule argument is
/// one line here.
#[allow(clippy::type_complexity)]
pub const RULE: [(&str, LuaType, fn(&QueueRule) -> Bytes); 5] = [
    ("lease", LuaType::Number, |r| {
        Bytes::from(r.lease_ms.to_string())
    }),
    ("max", LuaType::Number, |r| {
        Bytes::from(r.max_deliveries.to_string())
    }),
    // '' = the whole payload is the ack id.
    ("field", LuaType::Text, |r| match &r.ack_id {
        AckId::Payload => Bytes::new(),
        AckId::JsonField(f) => Bytes::from(f.clone()),
    }),
    ("redeliver", LuaType::Text, |r| {
        Bytes::from_static(match r.redeliver {
            Redeliver::Next => b"next",
            Redeliver::Last => b"last",
        })
    }),
    ("pop_end", LuaType::Text, |r| {
        Bytes::from_static(match r.pop_end {
            End::Left => b"L",
            End::Right => b"R",
        })
    }),
];

/// Rule arguments a script takes per queue.
pub const RULE_ARGS: usize = RULE.len();

/// A queue key and everything the scripts need to know about it.
pub struct Queue {
    pub name: Bytes,
    pub keys: QueueKeys,
    /// `keys` in the order every script takes them, cheap to clone.
    group: [Bytes; QUEUE_GROUP],
    pub rule: QueueRule,
    /// The rule as script arguments, in [`RULE`] order.
    args: [Bytes; RULE_ARGS],
}

impl Queue {
    fn new(name: &[u8], rule: &QueueRule) -> Queue {
        let keys = QueueKeys::new(name, rule.dead_letter.as_deref());
        let group = keys.all().map(Bytes::copy_from_slice);
        Queue {
            name: Bytes::copy_from_slice(name),
            keys,
            group,
            rule: rule.clone(),
            args: RULE.map(|(_, _, f)| f(rule)),
        }
    }

    /// The queue's keys in the order every script takes them.
    pub fn key_group(&self) -> &[Bytes; QUEUE_GROUP] {
        &self.group
    }

    /// The queue's rule in the order every script takes it.
    pub fn rule_args(&self) -> &[Bytes; RULE_ARGS] {
        &self.args
    }

    /// Approximate bytes this entry holds, for byte-bounded caches.
    pub fn size(&self) -> usize {
        self.group.iter().map(Bytes::len).sum::<usize>() * 2 + self.name.len() + 256
    }
}

pub struct Rules {
    rules: Vec<QueueRule>,
    exact: HashMap<Vec<u8>, usize>,
    globs: Vec<usize>,
    resolved: RwLock<HashMap<Bytes, Arc<Queue>>>,
}

/// Resolved queues kept at most; past it the cache starts over.
const RESOLVED_CACHE: usize = 100_000;

impl Rules {
    pub fn new(rules: &[QueueRule]) -> Rules {
        let mut exact = HashMap::new();
        let mut globs = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            if is_glob(r.pattern.as_bytes()) {
                globs.push(i);
            } else {
                exact.entry(r.pattern.as_bytes().to_vec()).or_insert(i);
            }
        }
        Rules {
            rules: rules.to_vec(),
            exact,
            globs,
            resolved: RwLock::new(HashMap::new()),
        }
    }

    fn rule_for(&self, key: &[u8]) -> Option<usize> {
        if let Some(&i) = self.exact.get(key) {
            return Some(i);
        }
        self.globs
            .iter()
            .copied()
            .find(|&i| glob_match(self.rules[i].pattern.as_bytes(), key))
    }

    pub fn is_queue(&self, key: &[u8]) -> bool {
        self.rule_for(key).is_some()
    }

    pub fn resolve(&self, key: &[u8]) -> Option<Arc<Queue>> {
        if let Some(q) = self.resolved.read().unwrap().get(key) {
            return Some(q.clone());
        }
        let rule = &self.rules[self.rule_for(key)?];
        let q = Arc::new(Queue::new(key, rule));
        let mut cache = self.resolved.write().unwrap();
        if cache.len() >= RESOLVED_CACHE {
            cache.clear();
        }
        cache.insert(q.name.clone(), q.clone());
        Some(q)
    }

    /// Queues named exactly in the configuration.
    pub fn exact_names(&self) -> impl Iterator<Item = &[u8]> {
        self.exact.keys().map(Vec::as_slice)
    }

    /// Patterns to watch for pushes, as configured (exact names included).
    pub fn patterns(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|r| r.pattern.as_str())
    }
}

fn is_glob(p: &[u8]) -> bool {
    p.iter().any(|c| matches!(c, b'*' | b'?' | b'[' | b'\\'))
}

/// Redis's `stringmatchlen`, case-sensitive.
pub fn glob_match(pattern: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0usize, 0usize);
    while p < pattern.len() {
        match pattern[p] {
            b'*' => {
                while p + 1 < pattern.len() && pattern[p + 1] == b'*' {
                    p += 1;
                }
                if p + 1 == pattern.len() {
                    return true;
                }
                return (i..=s.len()).any(|j| glob_match(&pattern[p + 1..], &s[j..]));
            }
            b'?' => {
                if i >= s.len() {
                    return false;
                }
                i += 1;
            }
            b'[' => {
                if i >= s.len() {
                    return false;
                }
                p += 1;
                let not = pattern.get(p) == Some(&b'^');
                if not {
                    p += 1;
                }
                let mut matched = false;
                loop {
                    if p >= pattern.len() {
                        p -= 1;
                        break;
                    }
                    if pattern[p] == b'\\' && p + 1 < pattern.len() {
                        p += 1;
                        if pattern[p] == s[i] {
                            matched = true;
                        }
                    } else if pattern[p] == b']' {
                        break;
                    } else if p + 2 < pattern.len() && pattern[p + 1] == b'-' {
                        let (mut lo, mut hi) = (pattern[p], pattern[p + 2]);
                        if lo > hi {
                            std::mem::swap(&mut lo, &mut hi);
                        }
                        p += 2;
                        if s[i] >= lo && s[i] <= hi {
                            matched = true;
                        }
                    } else if pattern[p] == s[i] {
                        matched = true;
                    }
                    p += 1;
                }
                if matched == not {
                    return false;
                }
                i += 1;
            }
            b'\\' if p + 1 < pattern.len() => {
                p += 1;
                if i >= s.len() || pattern[p] != s[i] {
                    return false;
                }
                i += 1;
            }
            c => {
                if i >= s.len() || c != s[i] {
                    return false;
                }
                i += 1;
            }
        }
        p += 1;
    }
    i == s.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_follow_redis() {
        assert!(glob_match(b"tasks:*", b"tasks:a"));
        assert!(glob_match(b"tasks:*", b"tasks:"));
        assert!(!glob_match(b"tasks:*", b"task"));
        assert!(glob_match(b"q?", b"q1"));
        assert!(!glob_match(b"q?", b"q"));
        assert!(glob_match(b"q[0-9]", b"q5"));
        assert!(!glob_match(b"q[^0-9]", b"q5"));
        assert!(glob_match(b"q[abc]x", b"qbx"));
        assert!(glob_match(b"a\\*b", b"a*b"));
        assert!(!glob_match(b"a\\*b", b"axb"));
        assert!(glob_match(b"*:jobs:*", b"eu:jobs:mail"));
    }

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
}
