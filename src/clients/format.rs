//! What clients see of the table, in Redis's formats: a `CLIENT LIST`
//! line, and the clients section of `INFO`.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use super::{Entry, Registry};
use crate::command::Args;
use crate::output::{ReplyTransform, Transformed};

impl Entry {
    /// Redis's line for this client (`catClientInfoString`). `current` is
    /// the request being answered when the line is the asking client's
    /// own. Fields the proxy does not have the way Redis does are given
    /// plausible values in Redis's format: `qbuf`, `qbuf-free`, `argv-mem`
    /// (the request being answered for the asking client, an empty buffer
    /// for others), `rbs`, `rbp`, `obl`, `oll`, `omem`, `tot-mem` (Redis's
    /// sizes for a client with empty buffers) and `events`.
    pub(crate) fn line(&self, current: Option<&[u8]>, current_argv: usize, lib: bool) -> String {
        let s = self.state.lock().unwrap();
        let blocked = s.blocked();
        let now = Instant::now();
        let mut flags = String::new();
        if s.monitor {
            flags.push('O');
        }
        let [sub, psub, ssub] = s.subscriptions();
        if sub + psub + ssub > 0 {
            flags.push('P');
        }
        if s.multi.is_some() {
            flags.push('x');
        }
        if blocked {
            flags.push('b');
        }
        if s.no_evict {
            flags.push('e');
        }
        if flags.is_empty() {
            flags.push('N');
        }
        // A query buffer of Redis's starts at 16 KB plus its allocator's
        // slack: 20474 bytes, less what the request takes.
        let (qbuf, qbuf_free, argv_mem) = match current {
            Some(req) => (
                req.len(),
                20474usize.saturating_sub(req.len()),
                current_argv,
            ),
            // A blocked client's arguments stay in memory.
            None if blocked => (0, 0, s.argv_mem),
            None => (0, 0, 0),
        };
        let (multi, multi_mem) = match s.multi {
            Some((n, mem)) => (i64::from(n), mem),
            None => (-1, 0),
        };
        // Reply buffer of 16 KB, and some 790 bytes of client structure.
        let rbs = 16384;
        let tot_mem = 790 + rbs + qbuf + qbuf_free + argv_mem + multi_mem;
        fn text(v: &Option<Bytes>) -> std::borrow::Cow<'_, str> {
            v.as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default()
        }
        let mut line = format!(
            "id={} addr={} laddr={} fd={} name={} age={} idle={} flags={} db={} sub={} psub={} ssub={} multi={} qbuf={} qbuf-free={} argv-mem={} multi-mem={} rbs={} rbp=0 obl=0 oll=0 omem=0 tot-mem={} events=r cmd={} user={} redir=-1 resp={}",
            self.id,
            self.addr,
            self.laddr,
            self.fd,
            text(&s.name),
            now.duration_since(self.created).as_secs(),
            now.duration_since(s.last).as_secs(),
            flags,
            s.db,
            sub,
            psub,
            ssub,
            multi,
            qbuf,
            qbuf_free,
            argv_mem,
            multi_mem,
            rbs,
            tot_mem,
            s.cmd.as_ref().map_or_else(|| "NULL".to_string(), |(n, sub)| full_name(n, sub)),
            String::from_utf8_lossy(&s.user),
            s.resp,
        );
        if lib {
            line.push_str(&format!(
                " lib-name={} lib-ver={}",
                text(&s.lib_name),
                text(&s.lib_ver)
            ));
        }
        line
    }
}

/// The name Redis shows for the command `name` (with first argument
/// `sub`, empty if none): lower case, with its subcommand (`client|list`)
/// where it is a container; `NULL` for one Redis does not know (where
/// Redis's table says so), as Redis shows a command it refused as unknown.
pub(crate) fn full_name(name: &[u8], sub: &[u8]) -> String {
    crate::command::table::with_current(|t| full_name_in(t, name, sub))
}

pub(crate) fn full_name_in(
    t: Option<&crate::command::table::Table>,
    name: &[u8],
    sub: &[u8],
) -> String {
    let name = String::from_utf8_lossy(name).to_ascii_lowercase();
    let full = format!(
        "{name}|{}",
        String::from_utf8_lossy(sub).to_ascii_lowercase()
    );
    let container = CONTAINERS.contains(&name.as_str());
    let proxys = PROXY_COMMANDS.contains(&name.as_str());
    match t {
        Some(t) if !sub.is_empty() && t.knows(full.as_bytes()) => full,
        Some(t) if proxys || (!container || sub.is_empty()) && t.knows(name.as_bytes()) => name,
        Some(_) => "NULL".to_string(),
        None if container && !sub.is_empty() => full,
        None => name,
    }
}

/// Commands of the proxy's own, which Redis does not know.
pub(crate) const PROXY_COMMANDS: &[&str] = &["ack", "nack", "queue"];

pub(crate) const CONTAINERS: &[&str] = &[
    "acl", "client", "cluster", "command", "config", "function", "latency", "memory", "module",
    "object", "pubsub", "script", "slowlog", "xgroup", "xinfo",
];

/// Redis's verbatim text reply: a bulk string in RESP2.
pub(crate) fn verbatim(text: &str, protocol: u8) -> Bytes {
    let mut out = BytesMut::new();
    if protocol >= 3 {
        out.extend_from_slice(format!("={}\r\ntxt:", text.len() + 4).as_bytes());
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(b"\r\n");
    } else {
        crate::resp::reply::bulk(&mut out, text.as_bytes());
    }
    out.freeze()
}

/// Whether the request's reply is rewritten by [`info`] (cheap: asked of
/// every request that could join a shared batch).
pub fn concerns(args: Args<'_>) -> bool {
    args.is(0, "INFO")
}

/// `INFO`, with the clients section telling of the proxy's clients:
/// `connected_clients` counts them, `blocked_clients` adds to Redis's count
/// (of connections blocked there, each a client's own: blocking commands and
/// commands held by a pause go on dedicated connections) the clients waiting
/// in a queue pop the proxy serves, which Redis does not see. The memory
/// section leaves out `hidden`, the proxy's own scripts in Redis's script
/// cache (how many, the bytes Redis counts for them): that cache is the
/// client's.
pub fn info(registry: &Arc<Registry>, hidden: Hidden) -> Box<dyn ReplyTransform> {
    Box::new(InfoClients(registry.clone(), hidden))
}

/// Scripts of the proxy's own in Redis's script cache: how many, and the
/// bytes `used_memory_scripts_eval` counts for them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hidden {
    pub scripts: u64,
    pub bytes: u64,
}

pub(crate) struct InfoClients(Arc<Registry>, Hidden);

impl ReplyTransform for InfoClients {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        let (connected, parked) = self.0.counts();
        Transformed::Done(rewrite_info(&reply, connected, parked, self.1).unwrap_or(reply))
    }
}

/// Whether an `INFO` request's reply has the memory section.
pub fn shows_memory(args: Args<'_>) -> bool {
    args.len() == 1
        || (1..args.len()).any(|i| {
            ["memory", "all", "everything", "default"]
                .iter()
                .any(|s| args.is(i, s))
        })
}

/// Slots of the table of a Redis dict holding n entries, grown as
/// inserts grow it (none while empty, then 4, doubling when full). A table
/// in the middle of growing, or held back from it during a fork, has more
/// or fewer: the memory shown is then off by a few slots.
fn table_slots(n: u64) -> u64 {
    match n {
        0 => 0,
        _ => n.next_power_of_two().max(4),
    }
}

/// Redis's `bytesToHuman`.
fn human(n: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (1 << 10, "K"),
        (1 << 20, "M"),
        (1 << 30, "G"),
        (1 << 40, "T"),
        (1 << 50, "P"),
    ];
    if n < 1024 {
        return format!("{n}B");
    }
    let (unit, name) = UNITS
        .iter()
        .rev()
        .find(|(u, _)| n >= *u)
        .copied()
        .unwrap_or(UNITS[0]);
    format!("{:.2}{name}", n as f64 / unit as f64)
}

/// An INFO reply (bulk or verbatim string) with `connected_clients`
/// replaced, `parked` added to `blocked_clients`, and the script cache's
/// counts without `hidden`; `None` when it has none of them (another
/// section, an error).
pub(crate) fn rewrite_info(
    reply: &[u8],
    connected: usize,
    parked: usize,
    hidden: Hidden,
) -> Option<Bytes> {
    let header_end = reply.iter().position(|&b| b == b'\n')? + 1;
    let (verbatim, body_start) = match reply.first()? {
        b'$' => (false, header_end),
        b'=' if reply.get(header_end..header_end + 4) == Some(b"txt:") => (true, header_end + 4),
        _ => return None,
    };
    let body = std::str::from_utf8(reply.get(body_start..reply.len().checked_sub(2)?)?).ok()?;
    let mut changed = false;
    let mut out = String::with_capacity(body.len());
    // The cache's hash table shrinks with the scripts left out: its slots
    // for all of them, against those for the client's.
    let bytes = match body
        .split("\r\n")
        .find_map(|l| l.strip_prefix("number_of_cached_scripts:"))
        .and_then(|n| n.parse::<u64>().ok())
    {
        Some(n) if hidden.scripts > 0 => {
            let theirs = n.saturating_sub(hidden.scripts);
            hidden.bytes + 8 * (table_slots(n) - table_slots(theirs))
        }
        _ => hidden.bytes,
    };
    // used_memory_scripts as rewritten, for the _human line after it.
    let mut scripts_bytes = None;
    for line in body.split_inclusive("\r\n") {
        let value = |key: &str| line.strip_prefix(key).filter(|rest| rest.ends_with("\r\n"));
        let number = |key: &str| value(key).and_then(|n| n.trim_end().parse::<u64>().ok());
        if value("connected_clients:").is_some() {
            out.push_str(&format!("connected_clients:{connected}\r\n"));
            changed = true;
        } else if let Some(n) = value("blocked_clients:") {
            let n: usize = n.trim_end().parse().ok()?;
            out.push_str(&format!("blocked_clients:{}\r\n", n + parked));
            changed = true;
        } else if hidden == Hidden::default() {
            out.push_str(line);
        } else if let Some(n) = number("number_of_cached_scripts:") {
            let n = n.saturating_sub(hidden.scripts);
            out.push_str(&format!("number_of_cached_scripts:{n}\r\n"));
            changed = true;
        } else if let Some(n) = number("used_memory_scripts_eval:") {
            let n = n.saturating_sub(bytes);
            out.push_str(&format!("used_memory_scripts_eval:{n}\r\n"));
            changed = true;
        } else if let Some(n) = number("used_memory_scripts:") {
            let n = n.saturating_sub(bytes);
            scripts_bytes = Some(n);
            out.push_str(&format!("used_memory_scripts:{n}\r\n"));
            changed = true;
        } else if let (Some(_), Some(n)) = (value("used_memory_scripts_human:"), scripts_bytes) {
            out.push_str(&format!("used_memory_scripts_human:{}\r\n", human(n)));
        } else {
            out.push_str(line);
        }
    }
    if !changed {
        return None;
    }
    let mut r = BytesMut::new();
    if verbatim {
        r.extend_from_slice(format!("={}\r\ntxt:", out.len() + 4).as_bytes());
    } else {
        r.extend_from_slice(format!("${}\r\n", out.len()).as_bytes());
    }
    r.extend_from_slice(out.as_bytes());
    r.extend_from_slice(b"\r\n");
    Some(r.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_counts_are_replaced_in_both_protocols() {
        let body =
            "# Clients\r\nconnected_clients:7\r\ncluster_connections:0\r\nblocked_clients:2\r\n";
        let resp2 = format!("${}\r\n{body}\r\n", body.len());
        let out = rewrite_info(resp2.as_bytes(), 3, 1, Hidden::default()).unwrap();
        let want =
            "# Clients\r\nconnected_clients:3\r\ncluster_connections:0\r\nblocked_clients:3\r\n";
        assert_eq!(out, format!("${}\r\n{want}\r\n", want.len()).as_bytes());
        let resp3 = format!("={}\r\ntxt:{body}\r\n", body.len() + 4);
        let out = rewrite_info(resp3.as_bytes(), 3, 1, Hidden::default()).unwrap();
        assert_eq!(
            out,
            format!("={}\r\ntxt:{want}\r\n", want.len() + 4).as_bytes()
        );
        let other = "$12\r\n# Server\r\nx:1\r\n";
        assert_eq!(
            rewrite_info(other.as_bytes(), 3, 1, Hidden::default()),
            None
        );
        assert_eq!(rewrite_info(b"-ERR x\r\n", 3, 1, Hidden::default()), None);
    }

    #[test]
    fn the_proxys_scripts_leave_the_memory_section() {
        // "return 1" and two scripts of the proxy's (5240 bytes); the table
        // has 4 slots either way.
        let body = "# Memory\r\nused_memory_scripts_eval:5376\r\nnumber_of_cached_scripts:3\r\nused_memory_scripts:5576\r\nused_memory_scripts_human:5.45K\r\n";
        let resp2 = format!("${}\r\n{body}\r\n", body.len());
        let hidden = Hidden {
            scripts: 2,
            bytes: 5240,
        };
        let out = rewrite_info(resp2.as_bytes(), 3, 1, hidden).unwrap();
        let want = "# Memory\r\nused_memory_scripts_eval:136\r\nnumber_of_cached_scripts:1\r\nused_memory_scripts:336\r\nused_memory_scripts_human:336B\r\n";
        assert_eq!(out, format!("${}\r\n{want}\r\n", want.len()).as_bytes());
        assert_eq!(table_slots(4), 4);
        assert_eq!(table_slots(5), 8);
        assert_eq!(table_slots(0), 0);
        // Alone, the client's script would have a table of its own: 4 slots.
        let body = "used_memory_scripts_eval:9368\r\nnumber_of_cached_scripts:2\r\n";
        let resp2 = format!("${}\r\n{body}\r\n", body.len());
        let hidden = Hidden {
            scripts: 1,
            bytes: 9200,
        };
        let out = rewrite_info(resp2.as_bytes(), 3, 1, hidden).unwrap();
        let want = "used_memory_scripts_eval:168\r\nnumber_of_cached_scripts:1\r\n";
        assert_eq!(out, format!("${}\r\n{want}\r\n", want.len()).as_bytes());
        assert_eq!(human(1023), "1023B");
        assert_eq!(human(5576), "5.45K");
        assert_eq!(human(3 << 20), "3.00M");
    }

    #[test]
    fn full_names_have_their_subcommand_for_containers() {
        assert_eq!(full_name_in(None, b"CLIENT", b"List"), "client|list");
        assert_eq!(full_name_in(None, b"GET", b"k"), "get");
        assert_eq!(full_name_in(None, b"PING", b""), "ping");
    }
}
