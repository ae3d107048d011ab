//! Redis's own command table, read with `COMMAND` on a control connection
//! (`upstream::control`) at start-up and after the shared connection reconnects, so
//! that routing follows the flags of the Redis actually behind the proxy
//! (a command that can block never lands on a shared connection, even one
//! the hand-written table does not know). Until it arrives, or if Redis
//! refuses `COMMAND`, the hand-written classification stands alone.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use redis::Value;

use crate::error::{ControlCause, ControlError};
use crate::upstream::{control, Endpoint};

/// The command flags routing cares about.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    pub write: bool,
    pub blocking: bool,
    /// Redis 7.0 does not report `may_replicate` in `COMMAND`; the commands
    /// that have it are listed by hand in [`may_replicate`].
    pub may_replicate: bool,
    pub pubsub: bool,
    pub admin: bool,
    pub noscript: bool,
    pub allow_busy: bool,
    pub no_multi: bool,
    pub loading: bool,
    pub stale: bool,
    /// Runs before the client authenticates (AUTH, HELLO, QUIT, RESET).
    pub no_auth: bool,
}

/// FNV-1a: command names are a few bytes, and SipHash's cost shows on the
/// request path. The tables are Redis's, not the client's, so a weaker hash
/// lets no client flood them.
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type Map<V> = HashMap<Vec<u8>, V, BuildHasherDefault<Fnv>>;

/// Where a command's keys are, as `COMMAND` tells: the arity and Redis's
/// legacy key range, which cluster routing in Redis 7.0 still follows
/// (`getKeysFromCommand`) for every command without `movablekeys`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeySpec {
    /// `n` exactly n arguments, `-n` at least n (the name counts).
    pub arity: i64,
    /// Index of the first key; 0 for a command without keys.
    pub first: i64,
    /// Index of the last key; negative counts from the end (-1 is the last
    /// argument).
    pub last: i64,
    pub step: i64,
    /// The range does not tell all the keys: they depend on the arguments.
    pub movable: bool,
}

/// Commands and subcommands (`name|sub`), lower-case.
#[derive(Debug, Default)]
pub struct Table {
    commands: Map<Flags>,
    /// Commands that have subcommands: look those up by `name|sub`.
    containers: HashSet<Vec<u8>, BuildHasherDefault<Fnv>>,
    /// Redis's arity: `n` exactly n arguments, `-n` at least n.
    arity: Map<i64>,
    keys: Map<KeySpec>,
}

static CURRENT: RwLock<Option<Arc<Table>>> = RwLock::new(None);

/// Bumped by every [`install`]: each thread keeps the table it last read
/// until this changes, so a request takes no lock and no reference count.
static GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static LOCAL: RefCell<(u64, Option<Arc<Table>>)> = const { RefCell::new((0, None)) };
}

/// The table in use, if Redis's has arrived.
pub fn current() -> Option<Arc<Table>> {
    CURRENT.read().unwrap().clone()
}

/// Runs `f` with the table in use (`None` until Redis's has arrived).
pub fn with_current<T>(f: impl FnOnce(Option<&Table>) -> T) -> T {
    let generation = GENERATION.load(Ordering::Acquire);
    LOCAL.with(|local| {
        let mut local = local.borrow_mut();
        if local.0 != generation {
            *local = (generation, current());
        }
        f(local.1.as_deref())
    })
}

pub fn install(table: Table) {
    *CURRENT.write().unwrap() = Some(Arc::new(table));
    GENERATION.fetch_add(1, Ordering::Release);
}

/// Commands Redis 7.0 holds during `CLIENT PAUSE WRITE` without a `write`
/// flag: they have `may_replicate`, which `COMMAND` does not show.
pub fn may_replicate(name: &[u8]) -> bool {
    const LIST: &[&[u8]] = &[
        b"publish",
        b"spublish",
        b"pfcount",
        b"eval",
        b"evalsha",
        b"eval_ro",
        b"evalsha_ro",
        b"fcall",
        b"fcall_ro",
        b"function",
        b"script",
    ];
    LIST.iter().any(|c| c.eq_ignore_ascii_case(name))
}

impl Table {
    /// Whether Redis has the command `key` (`name` or `name|sub`, lower
    /// case) itself, not just its container.
    pub fn knows(&self, key: &[u8]) -> bool {
        self.commands.contains_key(key)
    }

    /// Flags of the command `name` (with subcommand `sub` where it has
    /// them); `None` for a command Redis does not know.
    pub fn lookup(&self, name: &[u8], sub: Option<&[u8]>) -> Option<Flags> {
        // Command names are short: no allocation on the request path.
        let mut buf = [0u8; 64];
        if name.len() > buf.len() {
            return None;
        }
        for (o, b) in buf.iter_mut().zip(name) {
            *o = b.to_ascii_lowercase();
        }
        let n = name.len();
        if self.containers.contains(&buf[..n]) {
            if let Some(sub) = sub.filter(|s| n + 1 + s.len() <= buf.len()) {
                buf[n] = b'|';
                for (o, b) in buf[n + 1..].iter_mut().zip(sub) {
                    *o = b.to_ascii_lowercase();
                }
                if let Some(f) = self.commands.get(&buf[..n + 1 + sub.len()]) {
                    return Some(*f);
                }
            }
        }
        self.commands.get(&buf[..n]).copied()
    }

    /// Where the keys of the command `name` are; for a command with
    /// subcommands, those of subcommand `sub` (the container's own entry
    /// only when there is no `sub`, as Redis looks them up). `None` for
    /// what Redis does not know, which it refuses.
    pub fn key_spec(&self, name: &[u8], sub: Option<&[u8]>) -> Option<KeySpec> {
        // On every request's path in cluster mode: no allocation.
        let mut buf = [0u8; 64];
        if name.len() > buf.len() {
            return None;
        }
        for (o, b) in buf.iter_mut().zip(name) {
            *o = b.to_ascii_lowercase();
        }
        let n = name.len();
        match sub {
            Some(sub) if self.containers.contains(&buf[..n]) => {
                if n + 1 + sub.len() > buf.len() {
                    return None;
                }
                buf[n] = b'|';
                for (o, b) in buf[n + 1..].iter_mut().zip(sub) {
                    *o = b.to_ascii_lowercase();
                }
                self.keys.get(&buf[..n + 1 + sub.len()]).copied()
            }
            _ => self.keys.get(&buf[..n]).copied(),
        }
    }

    /// Whether Redis answers this request from a client that has not
    /// authenticated with NOAUTH: it knows the command (and subcommand),
    /// the argument count fits, and the command is not one of the few
    /// allowed before AUTH. Redis checks existence and arity first, so
    /// anything else gets another answer, which only Redis should give.
    pub fn refuses_unauthenticated(&self, name: &[u8], sub: Option<&[u8]>, argc: usize) -> bool {
        let lower = |b: &[u8]| b.to_ascii_lowercase();
        let mut key = lower(name);
        if self.containers.contains(&key) {
            let Some(sub) = sub else {
                return false;
            };
            key.push(b'|');
            key.extend_from_slice(&lower(sub));
        }
        let (Some(flags), Some(&arity)) = (self.commands.get(&key), self.arity.get(&key)) else {
            return false;
        };
        let fits = if arity >= 0 {
            argc as i64 == arity
        } else {
            argc as i64 >= -arity
        };
        // DEBUG and MODULE may be refused for being disabled before the
        // authentication check, which COMMAND does not show.
        let protected = key.starts_with(b"debug") || key.starts_with(b"module");
        fits && !flags.no_auth && !protected
    }

    /// Builds the table from Redis's `COMMAND` reply.
    pub fn from_reply(reply: &Value) -> Option<Table> {
        let Value::Array(entries) = reply else {
            return None;
        };
        let mut table = Table::default();
        for entry in entries {
            table.add(entry)?;
        }
        (!table.commands.is_empty()).then_some(table)
    }

    /// One entry: name, arity, flags, first key, last key, step, ACL
    /// categories, tips, key specs, subcommands (entries themselves).
    fn add(&mut self, entry: &Value) -> Option<()> {
        let Value::Array(fields) = entry else {
            return None;
        };
        let name = text(fields.first()?)?.to_ascii_lowercase();
        let mut flags = Flags::default();
        let mut movable = false;
        if let Some(Value::Array(fs)) = fields.get(2) {
            for f in fs.iter().filter_map(text) {
                match f {
                    b"movablekeys" => movable = true,
                    b"write" => flags.write = true,
                    b"blocking" => flags.blocking = true,
                    b"may_replicate" | b"may-replicate" => flags.may_replicate = true,
                    b"pubsub" => flags.pubsub = true,
                    b"admin" => flags.admin = true,
                    b"noscript" => flags.noscript = true,
                    b"allow_busy" => flags.allow_busy = true,
                    b"no_multi" => flags.no_multi = true,
                    b"loading" => flags.loading = true,
                    b"stale" => flags.stale = true,
                    b"no_auth" => flags.no_auth = true,
                    _ => {}
                }
            }
        }
        if let Some(Value::Int(a)) = fields.get(1) {
            self.arity.insert(name.clone(), *a);
        }
        let int = |i: usize| match fields.get(i) {
            Some(Value::Int(v)) => Some(*v),
            _ => None,
        };
        if let (Some(arity), Some(first), Some(last), Some(step)) = (int(1), int(3), int(4), int(5))
        {
            let spec = KeySpec {
                arity,
                first,
                last,
                step,
                movable,
            };
            self.keys.insert(name.clone(), spec);
        }
        if may_replicate(name.split(|&b| b == b'|').next().unwrap_or_default()) {
            flags.may_replicate = true;
        }
        if let Some(Value::Array(subs)) = fields.get(9) {
            if !subs.is_empty() {
                self.containers.insert(name.clone());
            }
            for sub in subs {
                self.add(sub)?;
            }
        }
        self.commands.insert(name, flags);
        Some(())
    }
}

/// A name or flag: a bulk string, or a status reply (flags in RESP2).
fn text(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// Reads Redis's command table on a control connection.
pub async fn fetch(endpoint: &Endpoint) -> Result<Table, ControlError> {
    let mut admin = control::admin(endpoint).await?;
    let reply: Value = control::query(&mut admin, "COMMAND", &redis::cmd("COMMAND")).await?;
    Table::from_reply(&reply).ok_or_else(|| {
        ControlError::new(
            "COMMAND",
            ControlCause::Unexpected("not a command table".into()),
        )
    })
}

/// Reads Redis's command table and installs it.
pub async fn load(endpoint: &Endpoint) -> bool {
    let fetched = tokio::time::timeout(endpoint.connect_timeout * 4, fetch(endpoint)).await;
    match fetched {
        Ok(Ok(table)) => {
            if table.lookup(b"fcall", None).is_none() {
                tracing::error!(
                    "this Redis has no FCALL: queues need Redis 7.0 or later (Redis functions); queue operations will be refused"
                );
            }
            install(table);
            true
        }
        // A Redis stopped with the proxy is not worth a warning.
        Ok(Err(_)) if crate::upstream::shared::is_stopping() => false,
        // One cause, one line: the outage's.
        Ok(Err(e)) if matches!(e.cause, ControlCause::Unreachable(_)) => {
            crate::upstream::shared::unreachable(&e.to_string());
            tracing::debug!("could not read the command table ({e}); using the built-in one");
            false
        }
        Ok(Err(e)) => {
            tracing::warn!("could not read the command table ({e}); using the built-in one");
            false
        }
        Err(_) => {
            tracing::warn!("COMMAND took too long; using the built-in command table");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_and_subcommands() {
        let reply = b"*2\r\n\
            *10\r\n$5\r\nblpop\r\n:-3\r\n*2\r\n+write\r\n+blocking\r\n:1\r\n:-2\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n\
            *10\r\n$6\r\nclient\r\n:-2\r\n*0\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*1\r\n\
            *10\r\n$12\r\nclient|pause\r\n:-3\r\n*2\r\n+admin\r\n+noscript\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*0\r\n";
        let reply = redis::parse_redis_value(reply).expect("RESP");
        let t = Table::from_reply(&reply).expect("table");
        let blpop = t.lookup(b"BLPOP", None).unwrap();
        assert!(blpop.blocking && blpop.write);
        let pause = t.lookup(b"client", Some(b"PAUSE")).unwrap();
        assert!(pause.admin && !pause.blocking);
        assert_eq!(t.lookup(b"client", Some(b"nosuch")), Some(Flags::default()));
        assert_eq!(t.lookup(b"nosuch", None), None);
    }

    #[test]
    fn keeps_key_ranges_of_commands_and_subcommands() {
        let reply = b"*2\r\n\
            *10\r\n$4\r\nmset\r\n:-3\r\n*1\r\n+write\r\n:1\r\n:-1\r\n:2\r\n*0\r\n*0\r\n*0\r\n*0\r\n\
            *10\r\n$6\r\nobject\r\n:-2\r\n*0\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n*1\r\n\
            *10\r\n$15\r\nobject|encoding\r\n:3\r\n*1\r\n+movablekeys\r\n:2\r\n:2\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n";
        let reply = redis::parse_redis_value(reply).expect("RESP");
        let t = Table::from_reply(&reply).expect("table");
        let spec = |arity, first, last, step, movable| KeySpec {
            arity,
            first,
            last,
            step,
            movable,
        };
        assert_eq!(t.key_spec(b"MSet", None), Some(spec(-3, 1, -1, 2, false)));
        assert_eq!(
            t.key_spec(b"object", Some(b"ENCODING")),
            Some(spec(3, 2, 2, 1, true))
        );
        // Redis refuses a subcommand it does not know; a container alone
        // is checked against its own arity.
        assert_eq!(t.key_spec(b"object", Some(b"nosuch")), None);
        assert_eq!(t.key_spec(b"OBJECT", None), Some(spec(-2, 0, 0, 0, false)));
        assert_eq!(
            t.key_spec(b"mset", Some(b"k")),
            Some(spec(-3, 1, -1, 2, false))
        );
        assert_eq!(t.key_spec(b"nosuch", None), None);
    }
}
