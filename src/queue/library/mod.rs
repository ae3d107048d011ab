//! The queue operations' Redis function library, and the one place that
//! keeps it loaded.
//!
//! The library is one text: a prelude generated from the calling convention
//! (`keys::GROUP`, `rules::RULE`, `tally::EVENTS`, the per-call bounds),
//! `lua/common.lua`, then one file per operation, each registering one
//! function. Redis runs that text once, at `FUNCTION LOAD`; an `FCALL` then
//! runs only the operation's own function, with every helper already built
//! and each rule version decoded once (see `rule` in the prelude).
//!
//! The library's name and its functions' names carry a hash of its text, so
//! proxies of two versions can share a Redis during a rolling upgrade, and
//! a name that exists in Redis always has this text.
//!
//! Loading is lazy: nothing is loaded until a queue operation runs, so a
//! proxy whose clients never touch a queue leaves `FUNCTION LIST` as they
//! made it. An `FCALL` answered "Function not found" (a restarted Redis, a
//! `FUNCTION FLUSH` made anywhere) is sent again behind a load
//! ([`Retry`]); where that cannot be done (inside `MULTI`), the session
//! makes sure of the library first ([`Loader::ensure`]).

pub mod ack_id;
pub mod call;
pub mod keys;
pub mod lease;
pub mod op;
pub mod script;
pub mod tally;
pub mod value;
pub mod visible;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use bytes::Bytes;

use crate::queue::library::keys::{Role, CALL_KEYS, DEAD_HISTORY, GROUP, STATS_TTL_MS};
use crate::queue::library::tally::EVENTS;
use crate::queue::rules::{RULE, RULE_ARGS};
use crate::upstream::Endpoint;

/// One operation of the library: `ackq_<op>_<version>`.
pub struct Function {
    pub op: &'static str,
    index: usize,
}

macro_rules! functions {
    ($($name:ident = $op:literal),* $(,)?) => {
        functions!(@each 0usize; $($name = $op,)*);
        /// Every operation, in the order their files follow `common.lua`.
        pub const ALL: &[&Function] = &[$(&$name),*];
        const SOURCES: &[&str] = &[$(include_str!(concat!("../../../lua/", $op, ".lua"))),*];
    };
    (@each $i:expr; $name:ident = $op:literal, $($rest:tt)*) => {
        pub const $name: Function = Function { op: $op, index: $i };
        functions!(@each $i + 1usize; $($rest)*);
    };
    (@each $i:expr;) => {};
}

functions! {
    POP = "pop",
    POP1 = "pop1",
    ACK = "ack",
    NACK = "nack",
    EXTEND = "extend",
    REAP = "reap",
    EXPIRE_MOVE = "expire_move",
    LREM = "lrem",
    INFO = "info",
    LEASES = "leases",
    PUSH = "push",
    DEAD = "dead",
    REDRIVE = "redrive",
    PURGE = "purge",
    DISOWN = "disown",
    RELEASE = "release",
    DEAD_ONE = "dead_one",
    HOLD = "hold",
}

impl Function {
    /// The short form of this function's reply, if it has one.
    pub fn short(&self) -> crate::queue::library::tally::Short {
        use crate::queue::library::tally::Short;
        if self.index == POP1.index {
            Short::Pop
        } else if self.index == ACK.index {
            Short::Ack
        } else {
            Short::None
        }
    }
}

/// The head of the library and of `lua/scripts/take.lua` (see `script.rs`).
pub const LEASE_CORE: &str = include_str!("../../../lua/lease_core.lua");
const COMMON: &str = include_str!("../../../lua/common.lua");

/// Expired leases a pop returns to their queues before popping, over all
/// its queues.
pub const REQUEUE_PER_CALL: u64 = 16;
/// Copies cancelled by a late ACK a pop skips.
pub const SKIP_PER_CALL: u64 = 100;
/// Delayed messages that fell due a pop moves into their lists first: a
/// pop finds what is due even between two reaper passes.
pub const PROMOTE_PER_CALL: u64 = 100;
/// List elements one ACK call may look at to take late-acknowledged copies
/// out of the list (LPOS ... MAXLEN), over all its ids.
pub const LATE_SCAN_PER_CALL: u64 = 2000;
/// Decoded rules the library keeps (one per rule version in use); past it
/// the cache starts again empty.
const RULE_CACHE: usize = 256;
/// Queues' key groups the library keeps between calls (a few hundred bytes
/// each).
const GROUP_CACHE: usize = 1024;

/// The library as Redis gets it.
pub struct Library {
    /// `ackproxy_<version>`: the first 12 hex digits of the SHA1 of the
    /// text after its first two lines (which name it).
    pub name: String,
    pub text: String,
    /// `FUNCTION LOAD <text>`, as one request. Without REPLACE: a library of
    /// this name always has this text, and Redis answers a load of one it
    /// has before compiling anything (a few µs).
    pub load: Bytes,
    /// `ackq_<op>_<version>` per operation, in [`ALL`] order.
    names: Vec<String>,
    /// `ackq_<op>_db_<version>`: the same, for calls in another database
    /// than 0, which add its number as their last argument.
    names_db: Vec<String>,
}

pub fn library() -> &'static Library {
    static LIB: OnceLock<Library> = OnceLock::new();
    LIB.get_or_init(|| {
        let mut body = prelude();
        body.push_str(LEASE_CORE);
        body.push('\n');
        body.push_str(COMMON);
        for src in SOURCES {
            body.push('\n');
            body.push_str(src);
        }
        let hash = sha1_smol::Sha1::from(&body).digest().to_string();
        let version = hash[..12].to_string();
        let name = format!("ackproxy_{version}");
        let text = format!("#!lua name={name}\nlocal LIB = '{version}'\n{body}");
        let mut load = Vec::new();
        crate::upstream::push_command(&mut load, &[b"FUNCTION", b"LOAD", text.as_bytes()]);
        let names = ALL
            .iter()
            .map(|f| format!("ackq_{}_{version}", f.op))
            .collect();
        let names_db = ALL
            .iter()
            .map(|f| format!("ackq_{}_db_{version}", f.op))
            .collect();
        Library {
            name,
            text,
            load: Bytes::from(load),
            names,
            names_db,
        }
    })
}

impl Function {
    /// The name to `FCALL`.
    pub fn name(&self) -> &'static str {
        &library().names[self.index]
    }

    /// The name to `FCALL` in another database than 0.
    pub fn name_db(&self) -> &'static str {
        &library().names_db[self.index]
    }
}

/// Whether a reply says the library is not in Redis.
pub fn is_missing(reply: &[u8]) -> bool {
    reply.starts_with(b"-ERR Function not found")
}

/// Whether a reply says Redis has no functions at all (before 7.0).
pub fn is_unsupported(reply: &[u8]) -> bool {
    reply.starts_with(b"-ERR unknown command")
        && reply.windows(5).any(|w| w.eq_ignore_ascii_case(b"fcall"))
}

/// Whether a client's command may remove the library from Redis.
pub fn may_unload(args: crate::command::Args<'_>) -> bool {
    args.is(0, "FUNCTION") && (args.is(1, "FLUSH") || args.is(1, "RESTORE") || args.is(1, "DELETE"))
}

/// What the proxy knows of the library in Redis: loaded as of the shared
/// connection it counted last, or unknown. Only calls that cannot be sent
/// again (inside `MULTI`) wait for [`Loader::ensure`]; the others find out
/// from their reply.
#[derive(Debug, Default)]
pub struct Loader {
    /// `Endpoint::opened` when the library was last known loaded, plus one
    /// (0: unknown).
    loaded_at: AtomicU64,
}

impl Loader {
    /// The library may be gone: a `FUNCTION FLUSH` passed, or a call found
    /// it missing.
    pub fn forget(&self) {
        self.loaded_at.store(0, Ordering::Release);
    }

    /// Whether it is known loaded since the last shared connection opened
    /// (a new connection may mean a restarted Redis).
    pub fn known(&self, endpoint: &Endpoint) -> bool {
        self.loaded_at.load(Ordering::Acquire) == endpoint.opened() + 1
    }

    /// Loads the library through `shared` unless it is known loaded.
    pub async fn ensure(
        &self,
        endpoint: &Endpoint,
        shared: &crate::upstream::shared::SharedUpstream,
        client: &std::sync::Arc<crate::output::ClientState>,
    ) {
        if self.known(endpoint) {
            return;
        }
        let at = endpoint.opened();
        let reply = shared.call(library().load.clone(), client.clone()).await;
        // Loaded now, or loaded already: both say it is there.
        if let Ok(b) = reply {
            if b.first() == Some(&b'$') || b.starts_with(b"-ERR Library") {
                self.loaded_at.store(at + 1, Ordering::Release);
            }
        }
    }
}

/// Loads the library on the primary of the moment through a connection of
/// its own (not a shared one, which may still be to the previous primary
/// right after a failover). Returns whether it is there now.
pub async fn load_on(endpoint: &Endpoint) -> Result<(), crate::error::ControlError> {
    use crate::upstream::control;
    let mut conn = control::admin(endpoint).await?;
    let mut load = redis::cmd("FUNCTION");
    load.arg("LOAD").arg(&library().text);
    match control::query::<redis::Value>(&mut conn, "FUNCTION LOAD", &load).await {
        Ok(_) => Ok(()),
        // Loaded already (replicated before the failover, most often).
        Err(e) if matches!(&e.cause, crate::error::ControlCause::Refused { detail, .. } if detail.starts_with("Library")) => {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The library-level locals every operation reads: the sizes and names of
/// the calling convention and the bounds, written from the Rust tables.
fn prelude() -> String {
    let mut s = String::from(
        "-- The calling convention, generated from keys::GROUP, rules::RULE and tally::EVENTS.\n",
    );
    let _ = writeln!(s, "local GROUP_SIZE = {CALL_KEYS}");
    let _ = writeln!(s, "local RULE_SIZE = {RULE_ARGS}");
    // Numbers given to redis.call are formatted with %.17g on every call:
    // constants the scripts only pass on are strings.
    let _ = writeln!(s, "local STATS_TTL_MS = '{STATS_TTL_MS}'");
    let _ = writeln!(s, "local DEAD_HISTORY = {DEAD_HISTORY}");
    let _ = writeln!(s, "local REQUEUE_PER_CALL = {REQUEUE_PER_CALL}");
    // What a look at the leases asks for: the expired ones and both marks.
    let _ = writeln!(s, "local REQUEUE_LIMIT = '{}'", REQUEUE_PER_CALL + 2);
    let _ = writeln!(s, "local SKIP_PER_CALL = {SKIP_PER_CALL}");
    let _ = writeln!(s, "local PROMOTE_PER_CALL = {PROMOTE_PER_CALL}");
    let _ = writeln!(s, "local LATE_SCAN_PER_CALL = {LATE_SCAN_PER_CALL}");
    s.push_str("local EVENT_NAMES = {");
    for (name, _) in EVENTS {
        let _ = write!(s, " '{name}',");
    }
    s.push_str(" }\nlocal function event_names() return EVENT_NAMES end\n");
    // Replies carry an event as its 1-based place in EVENTS: an integer
    // costs Redis less to send than the name.
    s.push_str("local EVENT = {");
    for (i, (name, _)) in EVENTS.iter().enumerate() {
        let _ = write!(s, " {name} = {},", i + 1);
    }
    s.push_str(" }\n");
    // A queue's group: the queue, the aux prefix and the dead-letter list
    // (keys::CALL_KEYS); an aux key's name is made from the prefix when
    // first read, so a call pays only for the keys it uses.
    s.push_str("local AUX = {");
    for (name, role) in GROUP {
        if let Role::Aux(suffix) = role {
            let _ = write!(s, " {name} = '{suffix}',");
        }
    }
    s.push_str(" }\n");
    s.push_str(
        "local GROUP_MT = { __index = function(t, name)\n  local suffix = AUX[name]\n  if not suffix then return nil end\n  local key = t.prefix .. suffix\n  t[name] = key\n  return key\nend }\n",
    );
    // A queue's group is kept between calls (its names are made once, not
    // at every call), at most GROUP_CACHE of them.
    let _ = writeln!(s, "local GROUPS, GROUPS_KEPT = {{}}, 0");
    let _ = write!(
        s,
        "local function group(keys, base)\n  local q, prefix, dead = keys[base], keys[base + 1], keys[base + 2]\n  local g = GROUPS[prefix]\n  if g and g.q == q and g.dead == dead then\n    g.base = base\n    return g\n  end\n  g = setmetatable({{ base = base, q = q, prefix = prefix, dead = dead }}, GROUP_MT)\n  if GROUPS_KEPT >= {GROUP_CACHE} then GROUPS, GROUPS_KEPT = {{}}, 0 end\n  GROUPS[prefix], GROUPS_KEPT = g, GROUPS_KEPT + 1\n  return g\nend\n"
    );
    // A rule arrives as the same MessagePack string on every call until the
    // rule changes: decoded once per version.
    let _ = writeln!(s, "local RULES, RULES_KEPT = {{}}, 0");
    s.push_str("local function rule(args, at)\n  local raw = args[at]\n  local r = RULES[raw]\n  if r then return r end\n  local ");
    let fields: Vec<String> = (1..=RULE.len()).map(|i| format!("f{i}")).collect();
    s.push_str(&fields.join(", "));
    s.push_str(" = cmsgpack.unpack(raw)\n  r = {");
    for (i, (name, _)) in RULE.iter().enumerate() {
        let _ = write!(s, " {name} = f{},", i + 1);
    }
    let _ = write!(
        s,
        " }}\n  if RULES_KEPT >= {RULE_CACHE} then RULES, RULES_KEPT = {{}}, 0 end\n  RULES[raw], RULES_KEPT = r, RULES_KEPT + 1\n  return r\nend\n"
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_names_itself_and_every_function_by_its_version() {
        let lib = library();
        assert!(lib.text.starts_with(&format!("#!lua name={}\n", lib.name)));
        let version = lib.name.strip_prefix("ackproxy_").unwrap();
        assert_eq!(version.len(), 12);
        assert_eq!(POP.name(), format!("ackq_pop_{version}"));
        assert_eq!(POP.name_db(), format!("ackq_pop_db_{version}"));
        for f in ALL {
            assert!(
                lib.text.contains(&format!("register('{}', function", f.op)),
                "{} registers itself",
                f.op
            );
        }
        assert!(lib
            .text
            .contains("q, prefix, dead = keys[base], keys[base + 1], keys[base + 2]"));
        assert!(lib.text.contains("leases = 'leases',"));
        assert!(lib.text.contains("lease = f1,"));
        assert!(lib.text.contains("'acks',"));
    }

    #[test]
    fn missing_library_replies_are_recognised() {
        assert!(is_missing(b"-ERR Function not found\r\n"));
        assert!(!is_missing(b"-ERR Library 'x' already exists\r\n"));
        assert!(!is_missing(b"$3\r\nabc\r\n"));
        assert!(is_unsupported(
            b"-ERR unknown command `FCALL`, with args beginning with: `ackq_pop_x`, \r\n"
        ));
        assert!(!is_unsupported(b"-ERR unknown command `FOO`\r\n"));
    }
}
