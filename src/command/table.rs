//! Redis's own command table, read with `COMMAND` on a connection of the
//! proxy's own at start-up and after the shared connection reconnects, so
//! that routing follows the flags of the Redis actually behind the proxy
//! (a command that can block never lands on a shared connection, even one
//! the hand-written table does not know). Until it arrives, or if Redis
//! refuses `COMMAND`, the hand-written classification stands alone.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::resp::ReplyScanner;
use crate::upstream::Endpoint;

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

/// Commands and subcommands (`name|sub`), lower-case.
#[derive(Debug, Default)]
pub struct Table {
    commands: Map<Flags>,
    /// Commands that have subcommands: look those up by `name|sub`.
    containers: HashSet<Vec<u8>, BuildHasherDefault<Fnv>>,
    /// Redis's arity: `n` exactly n arguments, `-n` at least n.
    arity: Map<i64>,
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

    /// Builds the table from a `COMMAND` reply (RESP2).
    pub fn parse(reply: &[u8]) -> Option<Table> {
        let (value, _) = parse_value(reply)?;
        let mut table = Table::default();
        let Value::Array(entries) = value else {
            return None;
        };
        for entry in &entries {
            table.add(entry)?;
        }
        (!table.commands.is_empty()).then_some(table)
    }

    fn add(&mut self, entry: &Value) -> Option<()> {
        let Value::Array(fields) = entry else {
            return None;
        };
        let Value::Bytes(name) = fields.first()? else {
            return None;
        };
        let mut flags = Flags::default();
        if let Some(Value::Array(fs)) = fields.get(2) {
            for f in fs {
                if let Value::Bytes(f) = f {
                    match &f[..] {
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
        }
        let name = name.to_ascii_lowercase();
        if let Some(Value::Int(a)) = fields.get(1) {
            self.arity.insert(name.clone(), *a);
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

enum Value {
    Bytes(Vec<u8>),
    Int(i64),
    Nil,
    Array(Vec<Value>),
}

/// One RESP2 value from the start of `b` and its length.
fn parse_value(b: &[u8]) -> Option<(Value, usize)> {
    let end = b.windows(2).position(|w| w == b"\r\n")?;
    let line = &b[1..end];
    let after = end + 2;
    match b.first()? {
        b'+' | b'-' => Some((Value::Bytes(line.to_vec()), after)),
        b':' => Some((
            Value::Int(std::str::from_utf8(line).ok()?.parse().ok()?),
            after,
        )),
        b'$' => {
            let n: i64 = std::str::from_utf8(line).ok()?.parse().ok()?;
            if n < 0 {
                return Some((Value::Nil, after));
            }
            let n = n as usize;
            let data = b.get(after..after + n)?;
            Some((Value::Bytes(data.to_vec()), after + n + 2))
        }
        b'*' => {
            let n: i64 = std::str::from_utf8(line).ok()?.parse().ok()?;
            let mut at = after;
            let mut items = Vec::with_capacity(n.clamp(0, 1024) as usize);
            for _ in 0..n.max(0) {
                let (v, used) = parse_value(b.get(at..)?)?;
                items.push(v);
                at += used;
            }
            Some((Value::Array(items), at))
        }
        _ => None,
    }
}

/// Reads Redis's command table on a connection of its own and installs it.
pub async fn load(endpoint: &Endpoint) -> bool {
    let fetch = async {
        let mut stream = endpoint.connect().await.ok()?;
        stream.write_all(b"*1\r\n$7\r\nCOMMAND\r\n").await.ok()?;
        let mut buf = Vec::with_capacity(256 * 1024);
        let mut scanner = ReplyScanner::new();
        loop {
            let mut chunk = [0u8; 64 * 1024];
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(len) = scanner.scan(&buf).ok()? {
                return Table::parse(&buf[..len]);
            }
        }
    };
    match tokio::time::timeout(endpoint.connect_timeout * 4, fetch).await {
        Ok(Some(table)) => {
            install(table);
            true
        }
        _ => {
            tracing::warn!("could not read COMMAND from redis; using the built-in table");
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
        let t = Table::parse(reply).expect("table");
        let blpop = t.lookup(b"BLPOP", None).unwrap();
        assert!(blpop.blocking && blpop.write);
        let pause = t.lookup(b"client", Some(b"PAUSE")).unwrap();
        assert!(pause.admin && !pause.blocking);
        assert_eq!(t.lookup(b"client", Some(b"nosuch")), Some(Flags::default()));
        assert_eq!(t.lookup(b"nosuch", None), None);
    }
}
