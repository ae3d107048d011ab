//! What clients see of Redis's functions: everything but the proxy's own
//! function library (`library/mod.rs`). Through the proxy, `FUNCTION LIST`,
//! `FUNCTION STATS` and `FUNCTION DUMP` answer as Redis would without it,
//! and `FUNCTION DELETE` does not find it. A client's `FUNCTION FLUSH` (or
//! `FUNCTION RESTORE … FLUSH`) removes it with the client's libraries, as
//! directly; the next queue operation loads it again.
//!
//! The proxy's libraries are the ones named `ackproxy_` and 12 lowercase
//! hex digits (another version's too, during a rolling upgrade); their
//! functions are `ackq_<operation>_<version>`. A client's library or
//! function of such a name would be hidden as well: the names are reserved.
//!
//! What clients see of the proxy's commands in Redis's command table is
//! `commands/docs.rs`'s, asked through [`view`] as well.

use std::ops::Range;
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};

use crate::command::Args;
use crate::output::{ReplyTransform, Transformed};
use crate::resp::frame::{bulk, items};
use crate::resp::ReplyScanner;

const LIBRARY_PREFIX: &[u8] = b"ackproxy_";
const FUNCTION_PREFIX: &[u8] = b"ackq_";
const VERSION_LEN: usize = 12;

fn is_version(v: &[u8]) -> bool {
    v.len() == VERSION_LEN && v.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether a library (whose names Redis compares exactly) is the proxy's.
pub fn is_hidden_library(name: &[u8]) -> bool {
    name.strip_prefix(LIBRARY_PREFIX).is_some_and(is_version)
}

/// Whether a function (whose names Redis compares ignoring case) is one
/// the proxy's library registers.
fn is_hidden_function(name: &[u8]) -> bool {
    let name = name.to_ascii_lowercase();
    let Some(rest) = name.strip_prefix(FUNCTION_PREFIX) else {
        return false;
    };
    rest.len() > VERSION_LEN + 1
        && rest[rest.len() - VERSION_LEN - 1] == b'_'
        && is_version(&rest[rest.len() - VERSION_LEN..])
}

/// What the session does instead of forwarding a `FUNCTION` request as is.
pub enum View {
    /// Forward this request instead: Redis's own reply to it is the one
    /// the client's request gets directly.
    Request(Bytes),
    /// Forward the request and rewrite its reply.
    Reply(Box<dyn ReplyTransform>),
    /// `FUNCTION STATS`: forwarded behind [`probe`], both in one write so
    /// that Redis runs them back to back, and answered by [`stats_joined`];
    /// inside `MULTI` (where the probe would be part of the transaction)
    /// answered by [`stats_with`] after a probe made outside it.
    Stats,
}

/// Whether [`view`] may have something to do with the request (cheap: it
/// is asked of every request that could join a shared batch).
pub fn concerns(args: Args<'_>) -> bool {
    if crate::queue::commands::docs::concerns(args) {
        return true;
    }
    args.len() >= 2
        && args.is(0, "FUNCTION")
        && (args.is(1, "LIST") || args.is(1, "STATS") || args.is(1, "DUMP") || args.is(1, "DELETE"))
}

pub fn view(args: Args<'_>) -> Option<View> {
    if crate::queue::commands::docs::concerns(args) {
        return crate::queue::commands::docs::view(args).map(View::Reply);
    }
    if !concerns(args) {
        return None;
    }
    if args.is(1, "LIST") {
        return Some(View::Reply(Box::new(ListFilter)));
    }
    if args.is(1, "DUMP") {
        return Some(View::Reply(Box::new(DumpFilter)));
    }
    if args.is(1, "STATS") && args.len() == 2 {
        return Some(View::Stats);
    }
    if args.is(1, "DELETE") && args.len() == 3 && args.get(2).is_some_and(is_hidden_library) {
        // No library can have this name (it is not a valid one), so Redis
        // answers "Library not found" where and when it would have for the
        // client's request: at once, as an element of EXEC, or NOPERM.
        let request =
            crate::upstream::encode_command(&[b"FUNCTION", b"DELETE", b"ackproxy-reserved"]);
        return Some(View::Request(Bytes::from(request)));
    }
    None
}

/// The request whose reply tells how many of the libraries and functions
/// Redis counts in `FUNCTION STATS` are the proxy's.
pub const PROBE: &[&[u8]] = &[b"FUNCTION", b"LIST", b"LIBRARYNAME", b"ackproxy_*"];

pub fn probe() -> Bytes {
    Bytes::from(crate::upstream::encode_command(PROBE))
}

/// The proxy's share of `FUNCTION STATS`'s counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hidden {
    libraries: i64,
    functions: i64,
}

/// The share seen by the last probe that got an answer. A probe refused
/// while a script runs (`BUSY`) is answered from it: nothing can load or
/// remove a library until the script ends.
static LAST_SEEN: Mutex<Hidden> = Mutex::new(Hidden {
    libraries: 0,
    functions: 0,
});

/// The proxy's share according to a probe's reply (or the last one known,
/// if the probe was refused).
pub fn observe(probe_reply: &[u8]) -> Hidden {
    match hidden_in(probe_reply) {
        Some(h) => {
            *LAST_SEEN.lock().unwrap() = h;
            h
        }
        None => last_seen(),
    }
}

pub fn last_seen() -> Hidden {
    *LAST_SEEN.lock().unwrap()
}

fn hidden_in(reply: &[u8]) -> Option<Hidden> {
    let (b'*', libs) = items(reply)? else {
        return None;
    };
    let mut h = Hidden::default();
    for lib in libs {
        let lib = &reply[lib];
        if field(lib, b"library_name")
            .and_then(bulk)
            .is_some_and(is_hidden_library)
        {
            h.libraries += 1;
            let functions = field(lib, b"functions").and_then(items)?.1;
            h.functions += functions.len() as i64;
        }
    }
    Some(h)
}

/// `FUNCTION STATS`'s reply behind the probe's, both in one.
pub fn stats_joined() -> Box<dyn ReplyTransform> {
    Box::new(StatsJoined)
}

/// `FUNCTION STATS`'s reply alone, with the proxy's share known already.
pub fn stats_with(hidden: Hidden) -> Box<dyn ReplyTransform> {
    Box::new(StatsWith(hidden))
}

struct StatsJoined;

impl ReplyTransform for StatsJoined {
    fn apply(&mut self, replies: Bytes) -> Transformed {
        let Ok(Some(first)) = ReplyScanner::new().scan(&replies) else {
            return Transformed::Done(replies);
        };
        let hidden = observe(&replies[..first]);
        Transformed::Done(rewrite_stats(replies.slice(first..), hidden))
    }
}

struct StatsWith(Hidden);

impl ReplyTransform for StatsWith {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        Transformed::Done(rewrite_stats(reply, self.0))
    }
}

/// `running_script` is null while the script running is the proxy's, and
/// the Lua engine's counts leave its libraries and functions out.
fn rewrite_stats(reply: Bytes, hidden: Hidden) -> Bytes {
    try_rewrite_stats(&reply, hidden).unwrap_or(reply)
}

fn try_rewrite_stats(reply: &[u8], hidden: Hidden) -> Option<Bytes> {
    let (kind, fields) = items(reply)?;
    let null: &[u8] = match kind {
        b'*' => b"$-1\r\n",
        b'%' => b"_\r\n",
        _ => return None,
    };
    let mut out = BytesMut::with_capacity(reply.len());
    out.extend_from_slice(&reply[..fields.first()?.start]);
    let mut changed = false;
    for pair in fields.chunks(2) {
        let [k, v] = pair else { return None };
        let (key, value) = (&reply[k.clone()], &reply[v.clone()]);
        out.extend_from_slice(key);
        match bulk(key)? {
            b"running_script" if running_is_hidden(value) => {
                out.extend_from_slice(null);
                changed = true;
            }
            b"engines" if hidden != Hidden::default() => {
                out.extend_from_slice(&rewrite_engines(value, hidden)?);
                changed = true;
            }
            _ => out.extend_from_slice(value),
        }
    }
    changed.then(|| out.freeze())
}

fn running_is_hidden(value: &[u8]) -> bool {
    field(value, b"name")
        .and_then(bulk)
        .is_some_and(is_hidden_function)
}

fn rewrite_engines(engines: &[u8], hidden: Hidden) -> Option<Vec<u8>> {
    let (_, fields) = items(engines)?;
    let mut out = engines[..fields.first().map_or(engines.len(), |r| r.start)].to_vec();
    for pair in fields.chunks(2) {
        let [k, v] = pair else { return None };
        let (name, stats) = (&engines[k.clone()], &engines[v.clone()]);
        out.extend_from_slice(name);
        if !bulk(name)?.eq_ignore_ascii_case(b"LUA") {
            out.extend_from_slice(stats);
            continue;
        }
        let (_, counts) = items(stats)?;
        out.extend_from_slice(&stats[..counts.first().map_or(stats.len(), |r| r.start)]);
        for pair in counts.chunks(2) {
            let [k, v] = pair else { return None };
            let (key, value) = (&stats[k.clone()], &stats[v.clone()]);
            out.extend_from_slice(key);
            let less = match bulk(key)? {
                b"libraries_count" => hidden.libraries,
                b"functions_count" => hidden.functions,
                _ => {
                    out.extend_from_slice(value);
                    continue;
                }
            };
            let n = integer(value)?;
            out.push(b':');
            out.extend_from_slice(itoa::Buffer::new().format((n - less).max(0)).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    Some(out)
}

/// `FUNCTION LIST`'s reply without the proxy's libraries.
struct ListFilter;

impl ReplyTransform for ListFilter {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        Transformed::Done(filter_list(&reply).unwrap_or(reply))
    }
}

fn filter_list(reply: &[u8]) -> Option<Bytes> {
    let (b'*', libs) = items(reply)? else {
        return None;
    };
    let kept: Vec<&Range<usize>> = libs
        .iter()
        .filter(|r| {
            !field(&reply[(*r).clone()], b"library_name")
                .and_then(bulk)
                .is_some_and(is_hidden_library)
        })
        .collect();
    if kept.len() == libs.len() {
        return None;
    }
    let mut out = BytesMut::with_capacity(reply.len());
    crate::resp::reply::array(&mut out, kept.len());
    for r in kept {
        out.extend_from_slice(&reply[r.clone()]);
    }
    Some(out.freeze())
}

/// `FUNCTION DUMP`'s payload without the proxy's libraries.
struct DumpFilter;

impl ReplyTransform for DumpFilter {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        Transformed::Done(filter_dump(&reply).unwrap_or(reply))
    }
}

fn filter_dump(reply: &[u8]) -> Option<Bytes> {
    if reply.first() != Some(&b'$') {
        return None;
    }
    let payload = without_hidden(bulk(reply)?)?;
    let mut out = BytesMut::with_capacity(payload.len() + 16);
    crate::resp::reply::bulk(&mut out, &payload);
    Some(out.freeze())
}

/// Redis's `RDB_OPCODE_FUNCTION2`: one library's code follows.
const FUNCTION2: u8 = 245;
/// The RDB version (2 bytes) and CRC64 (8 bytes) that end a payload.
const FOOTER: usize = 10;
/// Bytes of a library's code read to find its name: its first line says
/// `#!lua name=<name>`.
const HEAD: usize = 256;

/// The payload (a sequence of `FUNCTION2` + RDB string, then the footer)
/// without the proxy's libraries, with its CRC made again; `None` when it
/// has none of them (or is not as `FUNCTION DUMP` makes it: then it is
/// left to Redis to judge).
fn without_hidden(payload: &[u8]) -> Option<Vec<u8>> {
    let body = payload.len().checked_sub(FOOTER)?;
    let mut kept = Vec::with_capacity(payload.len());
    let mut at = 0;
    let mut removed = false;
    while at < body {
        let start = at;
        if payload[at] != FUNCTION2 {
            return None;
        }
        let (end, head) = rdb_string(payload, at + 1)?;
        if end > body {
            return None;
        }
        at = end;
        if library_name(&head).is_some_and(is_hidden_library) {
            removed = true;
        } else {
            kept.extend_from_slice(&payload[start..end]);
        }
    }
    if !removed {
        return None;
    }
    kept.extend_from_slice(&payload[body..body + 2]);
    let crc = crc64(&kept);
    kept.extend_from_slice(&crc.to_le_bytes());
    Some(kept)
}

/// The library name a code's first line gives (`#!<engine> name=<name>`),
/// as Redis reads it.
fn library_name(code: &[u8]) -> Option<&[u8]> {
    let line = code.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n')?];
    line.split(|b| b.is_ascii_whitespace())
        .skip(1)
        .find(|part| part.len() >= 5 && part[..5].eq_ignore_ascii_case(b"name="))
        .map(|part| &part[5..])
}

/// An RDB length at `at`: (value, whether it is an encoding, next offset).
fn rdb_len(p: &[u8], at: usize) -> Option<(usize, bool, usize)> {
    let first = *p.get(at)?;
    let six = (first & 0x3f) as usize;
    match first >> 6 {
        0 => Some((six, false, at + 1)),
        1 => Some(((six << 8) | *p.get(at + 1)? as usize, false, at + 2)),
        3 => Some((six, true, at + 1)),
        _ => {
            let n = match first {
                0x80 => 4,
                0x81 => 8,
                _ => return None,
            };
            let bytes = p.get(at + 1..at + 1 + n)?;
            let v = bytes.iter().fold(0u64, |v, &b| (v << 8) | b as u64);
            Some((usize::try_from(v).ok()?, false, at + 1 + n))
        }
    }
}

/// An RDB string at `at`: where it ends, and its first [`HEAD`] bytes.
fn rdb_string(p: &[u8], at: usize) -> Option<(usize, Vec<u8>)> {
    let (len, encoded, at) = rdb_len(p, at)?;
    if !encoded {
        let end = at.checked_add(len)?;
        let data = p.get(at..end)?;
        return Some((end, data[..data.len().min(HEAD)].to_vec()));
    }
    match len {
        // Integers (8, 16, 32 bits): never a library.
        0 => Some((at + 1, Vec::new())),
        1 => Some((at + 2, Vec::new())),
        2 => Some((at + 4, Vec::new())),
        3 => {
            let (compressed, _, at) = rdb_len(p, at)?;
            let (_, _, at) = rdb_len(p, at)?;
            let end = at.checked_add(compressed)?;
            Some((end, lzf_head(p.get(at..end)?, HEAD)?))
        }
        _ => None,
    }
}

/// The first `want` bytes LZF-compressed `input` decompresses to.
fn lzf_head(input: &[u8], want: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(want + 264);
    let mut ip = 0;
    while ip < input.len() && out.len() < want {
        let ctrl = input[ip] as usize;
        ip += 1;
        if ctrl < 32 {
            let literal = input.get(ip..ip + ctrl + 1)?;
            out.extend_from_slice(literal);
            ip += ctrl + 1;
        } else {
            let mut len = ctrl >> 5;
            if len == 7 {
                len += *input.get(ip)? as usize;
                ip += 1;
            }
            let back = ((ctrl & 0x1f) << 8) + *input.get(ip)? as usize + 1;
            ip += 1;
            let from = out.len().checked_sub(back)?;
            for i in 0..len + 2 {
                out.push(out[from + i]);
            }
        }
    }
    out.truncate(want);
    Some(out)
}

/// Redis's CRC-64 (Jones polynomial, reflected, initial value 0), which
/// ends a `FUNCTION DUMP` payload.
fn crc64(data: &[u8]) -> u64 {
    const POLY: u64 = 0x95ac_9329_ac4b_c9b5;
    const TABLE: [u64; 256] = {
        let mut t = [0u64; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u64;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 == 1 { (c >> 1) ^ POLY } else { c >> 1 };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    data.iter().fold(0u64, |crc, &b| {
        TABLE[((crc ^ b as u64) & 0xff) as usize] ^ (crc >> 8)
    })
}

/// The value of `key` in a map reply (in RESP2, an array of keys and
/// values).
fn field<'a>(frame: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let (_, fields) = items(frame)?;
    fields
        .chunks(2)
        .find(|pair| pair.len() == 2 && bulk(&frame[pair[0].clone()]) == Some(key))
        .map(|pair| &frame[pair[1].clone()])
}

fn integer(frame: &[u8]) -> Option<i64> {
    let rest = frame.strip_prefix(b":")?;
    crate::resp::parse_i64(rest.strip_suffix(b"\r\n")?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::library::{self, ALL};

    #[test]
    fn the_proxys_names_are_hidden_and_no_others() {
        let lib = library::library();
        assert!(is_hidden_library(lib.name.as_bytes()));
        for f in ALL {
            assert!(is_hidden_function(f.name().as_bytes()), "{}", f.name());
            assert!(is_hidden_function(f.name().to_uppercase().as_bytes()));
        }
        assert!(!is_hidden_library(b"ackproxy_"));
        assert!(!is_hidden_library(b"ackproxy_0123456789ab_x"));
        assert!(!is_hidden_library(b"ACKPROXY_0123456789ab"));
        assert!(!is_hidden_library(b"ackproxy_0123456789AB"));
        assert!(!is_hidden_library(b"mylib"));
        assert!(!is_hidden_function(b"ackq_pop"));
        assert!(!is_hidden_function(b"ackq__0123456789ab"));
        assert!(!is_hidden_function(b"test"));
    }

    #[test]
    fn redis_crc64() {
        assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    }

    #[test]
    fn lzf_back_references_repeat_what_came_before() {
        // "abc" literally, then 6 bytes from 3 back: "abcabcabc".
        let input = [2, b'a', b'b', b'c', (4 << 5) as u8, 2];
        assert_eq!(lzf_head(&input, 100).unwrap(), b"abcabcabc");
        assert_eq!(lzf_head(&input, 4).unwrap(), b"abca");
        assert_eq!(lzf_head(&[(1 << 5) as u8, 0], 10), None);
    }

    #[test]
    fn library_names_are_read_from_the_first_line() {
        assert_eq!(library_name(b"#!lua name=x\nreturn"), Some(&b"x"[..]));
        assert_eq!(library_name(b"#!lua  NAME=y \nreturn"), Some(&b"y"[..]));
        assert_eq!(library_name(b"#!lua\nname=x\n"), None);
        assert_eq!(library_name(b"return 1"), None);
    }

    const OURS: &str = "ackproxy_0123456789ab";

    fn list_entry_resp2(name: &str, functions: &[&str]) -> String {
        let mut s = format!(
            "*6\r\n$12\r\nlibrary_name\r\n${}\r\n{name}\r\n$6\r\nengine\r\n$3\r\nLUA\r\n$9\r\nfunctions\r\n*{}\r\n",
            name.len(),
            functions.len()
        );
        for f in functions {
            s += &format!(
                "*6\r\n$4\r\nname\r\n${}\r\n{f}\r\n$11\r\ndescription\r\n$-1\r\n$5\r\nflags\r\n*0\r\n",
                f.len()
            );
        }
        s
    }

    #[test]
    fn function_list_loses_the_proxys_libraries_only() {
        let mine = list_entry_resp2("mylib", &["f1"]);
        let ours = list_entry_resp2(OURS, &["ackq_pop_0123456789ab", "ackq_ack_0123456789ab"]);
        let reply = format!("*2\r\n{ours}{mine}");
        let out = filter_list(reply.as_bytes()).unwrap();
        assert_eq!(&out[..], format!("*1\r\n{mine}").as_bytes());
        assert_eq!(filter_list(format!("*1\r\n{mine}").as_bytes()), None);
        assert_eq!(filter_list(b"*0\r\n"), None);
        assert_eq!(
            &filter_list(format!("*1\r\n{ours}").as_bytes()).unwrap()[..],
            b"*0\r\n"
        );
        assert_eq!(filter_list(b"-ERR Unknown argument x\r\n"), None);
        assert_eq!(
            hidden_in(format!("*2\r\n{ours}{mine}").as_bytes()),
            Some(Hidden {
                libraries: 1,
                functions: 2
            })
        );
        assert_eq!(hidden_in(b"-BUSY Redis is busy\r\n"), None);
    }

    #[test]
    fn function_stats_counts_leave_the_proxys_share_out() {
        let hidden = Hidden {
            libraries: 1,
            functions: 15,
        };
        let resp2 = b"*4\r\n$14\r\nrunning_script\r\n$-1\r\n$7\r\nengines\r\n*2\r\n$3\r\nLUA\r\n*4\r\n$15\r\nlibraries_count\r\n:3\r\n$15\r\nfunctions_count\r\n:17\r\n";
        let out = rewrite_stats(Bytes::from_static(resp2), hidden);
        assert_eq!(
            &out[..],
            b"*4\r\n$14\r\nrunning_script\r\n$-1\r\n$7\r\nengines\r\n*2\r\n$3\r\nLUA\r\n*4\r\n$15\r\nlibraries_count\r\n:2\r\n$15\r\nfunctions_count\r\n:2\r\n"
        );
        let resp3 = b"%2\r\n$14\r\nrunning_script\r\n%3\r\n$4\r\nname\r\n$21\r\nackq_pop_0123456789ab\r\n$7\r\ncommand\r\n*1\r\n$5\r\nFCALL\r\n$11\r\nduration_ms\r\n:5\r\n$7\r\nengines\r\n%1\r\n$3\r\nLUA\r\n%2\r\n$15\r\nlibraries_count\r\n:1\r\n$15\r\nfunctions_count\r\n:15\r\n";
        let out = rewrite_stats(Bytes::from_static(resp3), hidden);
        assert_eq!(
            &out[..],
            b"%2\r\n$14\r\nrunning_script\r\n_\r\n$7\r\nengines\r\n%1\r\n$3\r\nLUA\r\n%2\r\n$15\r\nlibraries_count\r\n:0\r\n$15\r\nfunctions_count\r\n:0\r\n"
        );
        // Nothing of the proxy's: unchanged, byte for byte.
        let out = rewrite_stats(Bytes::from_static(resp2), Hidden::default());
        assert_eq!(&out[..], &resp2[..]);
        let busy = Bytes::from_static(b"-BUSY Redis is busy running a script\r\n");
        assert_eq!(rewrite_stats(busy.clone(), hidden), busy);
    }

    #[test]
    fn function_dump_loses_the_proxys_libraries_and_keeps_a_valid_crc() {
        fn entry(code: &str) -> Vec<u8> {
            // Plain (uncompressed) strings, 14-bit lengths.
            let mut e = vec![FUNCTION2, 0x40 | (code.len() >> 8) as u8, code.len() as u8];
            e.extend_from_slice(code.as_bytes());
            e
        }
        fn payload(entries: &[Vec<u8>]) -> Vec<u8> {
            let mut p: Vec<u8> = entries.concat();
            p.extend_from_slice(&[10, 0]);
            let crc = crc64(&p);
            p.extend_from_slice(&crc.to_le_bytes());
            p
        }
        let ours = entry(&format!("#!lua name={OURS}\n{}", "x".repeat(100)));
        let mine = entry("#!lua name=mylib\nredis.register_function('f', function() return 1 end)");
        let both = payload(&[ours.clone(), mine.clone()]);
        assert_eq!(
            without_hidden(&both).unwrap(),
            payload(std::slice::from_ref(&mine))
        );
        assert_eq!(without_hidden(&payload(&[ours])).unwrap(), payload(&[]));
        assert_eq!(without_hidden(&payload(&[mine])), None);
        assert_eq!(without_hidden(b"short"), None);
        assert_eq!(without_hidden(&payload(&[vec![7, 1, b'x']])), None);
    }
}
