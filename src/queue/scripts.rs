//! The Lua scripts. Each one sent to Redis is a prelude generated from the
//! calling convention (`keys::GROUP`, `rules::RULE`) and the counted events
//! (`tally::EVENTS`), then the parts of `lua/common.lua` it uses, then the
//! script's own file, so every operation is one atomic script and the Lua
//! side reads a queue's keys and rule only through `group(i)` and
//! `rule(i)`.
//!
//! Only the parts used: every call runs the whole text from the top, and
//! each `local function` it passes is a closure Redis builds anew (a script
//! keeps nothing between calls). Defining every shared function in every
//! script cost the pop and the ACK more Redis CPU than their own work.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};

use super::keys::{DEAD_HISTORY, GROUP, STATS_TTL_MS};
use super::rules::{RULE, RULE_ARGS};
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

/// `group(base)`, `rule(at)` and the event numbers, written from the Rust
/// tables.
fn prelude() -> String {
    let mut s = String::from(
        "-- The calling convention, generated from keys::GROUP, rules::RULE and tally::EVENTS.\n",
    );
    let _ = writeln!(s, "local GROUP_SIZE = {}", GROUP.len());
    let _ = writeln!(s, "local RULE_SIZE = {RULE_ARGS}");
    let _ = writeln!(s, "local STATS_TTL_MS = {STATS_TTL_MS}");
    let _ = writeln!(s, "local DEAD_HISTORY = {DEAD_HISTORY}");
    let _ = writeln!(s, "local REQUEUE_PER_CALL = {REQUEUE_PER_CALL}");
    let _ = writeln!(s, "local SKIP_PER_CALL = {SKIP_PER_CALL}");
    let _ = writeln!(s, "local PROMOTE_PER_CALL = {PROMOTE_PER_CALL}");
    let _ = writeln!(s, "local LATE_SCAN_PER_CALL = {LATE_SCAN_PER_CALL}");
    s.push_str("local function event_names()\n  return {");
    for (name, _) in EVENTS {
        let _ = write!(s, " '{name}',");
    }
    s.push_str(" }\nend\nlocal function group(base)\n  return { base = base,");
    for (i, (name, _)) in GROUP.iter().enumerate() {
        let _ = write!(s, " {name} = KEYS[base + {i}],");
    }
    s.push_str(" }\nend\nlocal function rule(at)\n  local ");
    let fields: Vec<String> = (1..=RULE.len()).map(|i| format!("f{i}")).collect();
    s.push_str(&fields.join(", "));
    s.push_str(" = cmsgpack.unpack(ARGV[at])\n  return {");
    for (i, (name, _)) in RULE.iter().enumerate() {
        let _ = write!(s, " {name} = f{},", i + 1);
    }
    s.push_str(" }\nend\n");
    s
}

/// A top-level definition of `lua/common.lua` (`local function f` or
/// `local A, B = ...`, with the comment above it) and the names it defines.
struct Item {
    names: Vec<String>,
    text: String,
}

/// `lua/common.lua` cut into its top-level definitions: lines at column 0
/// that start with `local ` begin one; comments and blank lines before it
/// belong to it; everything indented, and `end`, continue it.
fn common_items() -> &'static [Item] {
    static ITEMS: OnceLock<Vec<Item>> = OnceLock::new();
    ITEMS.get_or_init(|| {
        let mut items: Vec<Item> = Vec::new();
        let mut pending = String::new();
        let mut open = false;
        for line in COMMON.lines() {
            let top = !line.starts_with(' ') && !line.starts_with('\t');
            if top && line.starts_with("local ") {
                let head = line.trim_start_matches("local ");
                let names = match head.strip_prefix("function ") {
                    Some(f) => vec![identifiers(f).next().unwrap_or_default().to_string()],
                    None => identifiers(head.split('=').next().unwrap_or_default())
                        .map(str::to_string)
                        .collect(),
                };
                items.push(Item {
                    names,
                    text: std::mem::take(&mut pending) + line + "\n",
                });
                open = true;
            } else if top && (line.is_empty() || line.starts_with("--")) {
                open = false;
                pending.push_str(line);
                pending.push('\n');
            } else if open {
                let last = items.last_mut().expect("a definition is open");
                last.text.push_str(line);
                last.text.push('\n');
            } else {
                panic!("lua/common.lua: a top-level line outside any definition: {line}");
            }
        }
        items
    })
}

fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
}

/// The definitions of `lua/common.lua` that `own` uses, directly or through
/// one another, in their order in the file.
fn common_for(own: &str) -> String {
    let items = common_items();
    let index: HashMap<&str, usize> = items
        .iter()
        .enumerate()
        .flat_map(|(i, it)| it.names.iter().map(move |n| (n.as_str(), i)))
        .collect();
    let mut used = vec![false; items.len()];
    let mut todo: Vec<usize> = identifiers(own)
        .filter_map(|w| index.get(w).copied())
        .collect();
    while let Some(i) = todo.pop() {
        if std::mem::replace(&mut used[i], true) {
            continue;
        }
        todo.extend(identifiers(&items[i].text).filter_map(|w| index.get(w).copied()));
    }
    items
        .iter()
        .zip(used)
        .filter(|(_, u)| *u)
        .map(|(it, _)| it.text.as_str())
        .collect()
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
            [prelude().as_str(), &common_for(script.own), script.own]
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
        assert!(p.contains("'acks',"));
        assert!(p.contains("= cmsgpack.unpack(ARGV[at])"));
        assert!(p.contains("lease = f1,"));
        assert!(p.contains("pop_end = f5,"));
        assert_eq!(POP.sha().len(), 40);
        assert!(POP.body().contains("local function group"));
    }

    #[test]
    fn each_script_carries_what_it_uses_of_common() {
        let extend = EXTEND.body();
        assert!(extend.contains("local function tokens_of("));
        assert!(extend.contains("local function id_key("));
        assert!(!extend.contains("local function dead_letter("));
        // Through expire: dead letters, delays, the retry entry.
        let pop = POP.body();
        for f in [
            "expire",
            "dead_letter",
            "delay",
            "retry_entry",
            "release_owned",
        ] {
            assert!(pop.contains(&format!("local function {f}(")), "{f}");
        }
        assert!(!pop.contains("local function first_lease("));
        // Every definition is somewhere, and each once.
        for it in common_items() {
            let holders = ALL.iter().filter(|s| s.body().contains(&it.text)).count();
            assert!(holders >= 1, "unused: {:?}", it.names);
        }
        let n = common_items().iter().map(|it| it.text.len()).sum::<usize>();
        assert!(n + 200 >= COMMON.len(), "lines lost cutting common.lua");
    }
}
