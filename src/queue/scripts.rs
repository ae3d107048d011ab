//! The Lua scripts. Each one sent to Redis is a prelude generated from the
//! calling convention (`keys::GROUP`, `rules::RULE`) and the counted events
//! (`tally::EVENTS`), then `lua/common.lua`, then the script's own file, so
//! every operation is one atomic script and the Lua side reads a queue's
//! keys and rule only through `group(i)` and `rule(i)`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};

use super::keys::{DEAD_HISTORY, GROUP, STATS_TTL_MS};
use super::rules::{LuaType, RULE};
use super::tally::EVENTS;

pub struct Script {
    pub name: &'static str,
    own: &'static str,
}

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub const $name: Script = Script {
            name: $file,
            own: include_str!(concat!("../../lua/", $file, ".lua")),
        };
    };
}

script!(POP, "pop");
script!(ACK, "ack");
script!(NACK, "nack");
script!(EXTEND, "extend");
script!(REAP, "reap");
script!(EXPIRE_MOVE, "expire_move");
script!(LREM, "lrem");
script!(INFO, "info");
script!(LEASES, "leases");
script!(PUSH, "push");
script!(DEAD, "dead");
script!(REDRIVE, "redrive");
script!(PURGE, "purge");
script!(DISOWN, "disown");
script!(RELEASE, "release");

pub const ALL: &[&Script] = &[
    &POP,
    &ACK,
    &NACK,
    &EXTEND,
    &REAP,
    &EXPIRE_MOVE,
    &LREM,
    &INFO,
    &LEASES,
    &PUSH,
    &DEAD,
    &REDRIVE,
    &PURGE,
    &DISOWN,
    &RELEASE,
];

/// `SCRIPT LOAD` of every script, as one write, for the upstream
/// connections to send when they open.
pub fn preload() -> crate::upstream::Scripts {
    static LOADS: OnceLock<Vec<u8>> = OnceLock::new();
    let loads = LOADS.get_or_init(|| {
        let mut out = Vec::new();
        for s in ALL {
            crate::upstream::push_command(&mut out, &[b"SCRIPT", b"LOAD", s.body().as_bytes()]);
        }
        out
    });
    crate::upstream::Scripts {
        loads,
        count: ALL.len(),
    }
}

const COMMON: &str = include_str!("../../lua/common.lua");

/// `group(base)`, `rule(at)` and the event numbers, written from the Rust
/// tables.
fn prelude() -> String {
    let mut s = String::from(
        "-- The calling convention, generated from keys::GROUP, rules::RULE and tally::EVENTS.\n",
    );
    let _ = writeln!(s, "local GROUP_SIZE = {}", GROUP.len());
    let _ = writeln!(s, "local RULE_SIZE = {}", RULE.len());
    let _ = writeln!(s, "local STATS_TTL_MS = {STATS_TTL_MS}");
    let _ = writeln!(s, "local DEAD_HISTORY = {DEAD_HISTORY}");
    s.push_str("local EVENT = {");
    for (i, (name, _)) in EVENTS.iter().enumerate() {
        let _ = write!(s, " {name} = {},", i + 1);
    }
    s.push_str(" }\nlocal EVENT_NAME = {");
    for (name, _) in EVENTS {
        let _ = write!(s, " '{name}',");
    }
    s.push_str(" }\nlocal function group(base)\n  return { base = base,");
    for (i, (name, _)) in GROUP.iter().enumerate() {
        let _ = write!(s, " {name} = KEYS[base + {i}],");
    }
    s.push_str(" }\nend\nlocal function rule(at)\n  return {");
    for (i, (name, ty, _)) in RULE.iter().enumerate() {
        match ty {
            LuaType::Number => {
                let _ = write!(s, " {name} = tonumber(ARGV[at + {i}]),");
            }
            LuaType::Text => {
                let _ = write!(s, " {name} = ARGV[at + {i}],");
            }
        }
    }
    s.push_str(" }\nend\n");
    s
}

struct Built {
    body: &'static str,
    sha: &'static str,
}

fn built(script: &'static Script) -> &'static Built {
    static BUILT: OnceLock<Mutex<HashMap<&'static str, &'static Built>>> = OnceLock::new();
    let mut map = BUILT.get_or_init(Default::default).lock().unwrap();
    map.entry(script.name).or_insert_with(|| {
        let body: &'static str = Box::leak(
            [prelude().as_str(), COMMON, script.own]
                .concat()
                .into_boxed_str(),
        );
        let sha = sha1_smol::Sha1::from(body).digest().to_string();
        Box::leak(Box::new(Built {
            body,
            sha: Box::leak(sha.into_boxed_str()),
        }))
    })
}

impl Script {
    /// The whole text sent with EVAL or SCRIPT LOAD.
    pub fn body(&'static self) -> &'static str {
        built(self).body
    }

    /// Its SHA1, for EVALSHA.
    pub fn sha(&'static self) -> &'static str {
        built(self).sha
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prelude_names_every_key_and_rule_argument() {
        let p = prelude();
        assert!(p.contains("q = KEYS[base + 0]"));
        assert!(p.contains("dead = KEYS[base + 6]"));
        assert!(p.contains("base = base,"));
        assert!(p.contains("acks = 2,"));
        assert!(p.contains("lease = tonumber(ARGV[at + 0])"));
        assert!(p.contains("pop_end = ARGV[at + 4]"));
        assert_eq!(POP.sha().len(), 40);
        assert!(POP.body().contains("local function group"));
    }
}
