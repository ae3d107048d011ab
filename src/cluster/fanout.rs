//! Requests that are not one node's, and how their replies are put back
//! together so that the client sees what one Redis would answer:
//!
//! | request | sent to | reply |
//! |---|---|---|
//! | `MGET`, `MSET`, `DEL`, `UNLINK`, `EXISTS`, `TOUCH` across slots | one part per slot | values in key order; `OK`; the sum |
//! | other commands whose keys span slots | nowhere | Redis Cluster's `CROSSSLOT` error |
//! | `DBSIZE` | every primary | the sum |
//! | `KEYS` | every primary | every node's keys |
//! | `RANDOMKEY` | every primary | the first key found |
//! | `SCAN` | one primary at a time | the node's index is the cursor's low 8 bits |
//! | `FLUSHALL`, `FLUSHDB`, `SCRIPT LOAD/FLUSH`, `FUNCTION LOAD/DELETE/FLUSH/RESTORE`, `CONFIG SET/RESETSTAT` | every primary | the first error, else the first reply |
//! | `SCRIPT EXISTS` | every primary | 1 where every node has the script |
//! | any other command without keys | the owner of slot 0 | as it is |

use bytes::{BufMut, Bytes, BytesMut};

use super::slot::{command_slot, key_slot, CommandSlot};
use crate::command::table::Table;
use crate::command::Args;
use crate::output::Reply;
use crate::resp::ReplyScanner;

/// How a request is sent.
pub enum Plan {
    /// To one node: the owner of `slot` (any node for `None`).
    One { slot: Option<u16> },
    /// One request per slot, their replies merged.
    Split {
        parts: Vec<(u16, Bytes)>,
        merge: Merge,
    },
    /// The same request to every primary, their replies merged.
    All { frame: Bytes, merge: Merge },
    /// `SCAN` of the `node`th primary (see [`Merge::Scan`]).
    Scan { node: usize, frame: Bytes },
    /// Answered by the proxy.
    Answer(Bytes),
}

pub enum Merge {
    /// `MGET`: element `i` of the reply is element `.1` of part `.0`.
    Gather(Vec<(usize, usize)>),
    /// Integer replies added (`DEL`, `DBSIZE`, …).
    Sum,
    /// Every node's array, one after the other (`KEYS`).
    Concat,
    /// The first error, else the first reply (`MSET`, `FLUSHALL`, …).
    Same,
    /// Element-wise: 1 only where every node says 1 (`SCRIPT EXISTS`).
    And,
    /// The first reply that is not nil (`RANDOMKEY`).
    FirstNonNil,
    /// A node's `SCAN` reply, its cursor turned into the proxy's.
    Scan { node: usize, nodes: usize },
}

const CROSSSLOT: &[u8] = b"-CROSSSLOT Keys in request don't hash to the same slot\r\n";

pub fn plan(args: Args<'_>, table: Option<&Table>, frame: &Bytes) -> Plan {
    match command_slot(args, table) {
        CommandSlot::Slot(slot) => Plan::One { slot: Some(slot) },
        CommandSlot::Unknown => Plan::One { slot: None },
        CommandSlot::CrossSlot => {
            split(args).unwrap_or(Plan::Answer(Bytes::from_static(CROSSSLOT)))
        }
        CommandSlot::Keyless => keyless(args, frame),
    }
}

fn name_is(args: Args<'_>, i: usize, names: &[&str]) -> bool {
    names.iter().any(|n| args.is(i, n))
}

fn keyless(args: Args<'_>, frame: &Bytes) -> Plan {
    let all = |merge| Plan::All {
        frame: frame.clone(),
        merge,
    };
    if args.is(0, "DBSIZE") {
        return all(Merge::Sum);
    }
    if args.is(0, "KEYS") {
        return all(Merge::Concat);
    }
    if args.is(0, "RANDOMKEY") {
        return all(Merge::FirstNonNil);
    }
    if name_is(args, 0, &["FLUSHALL", "FLUSHDB"]) {
        return all(Merge::Same);
    }
    if args.is(0, "SCRIPT") {
        if name_is(args, 1, &["LOAD", "FLUSH"]) {
            return all(Merge::Same);
        }
        if args.is(1, "EXISTS") {
            return all(Merge::And);
        }
    }
    if args.is(0, "FUNCTION") && name_is(args, 1, &["LOAD", "DELETE", "FLUSH", "RESTORE"]) {
        return all(Merge::Same);
    }
    if args.is(0, "CONFIG") && name_is(args, 1, &["SET", "RESETSTAT"]) {
        return all(Merge::Same);
    }
    if args.is(0, "SCAN") {
        if let Some(plan) = scan(args) {
            return plan;
        }
    }
    Plan::One { slot: None }
}

/// `SCAN cursor …`: the cursor's low 8 bits name the primary (in address
/// order), the rest is that node's own cursor.
fn scan(args: Args<'_>) -> Option<Plan> {
    let cursor: u64 = std::str::from_utf8(args.get(1)?).ok()?.parse().ok()?;
    let node = (cursor & 0xff) as usize;
    let own = (cursor >> 8).to_string();
    let mut parts: Vec<&[u8]> = args.iter().collect();
    parts[1] = own.as_bytes();
    Some(Plan::Scan {
        node,
        frame: Bytes::from(crate::upstream::encode_command(&parts)),
    })
}

/// A multi-key command that may span slots, as one request per slot.
fn split(args: Args<'_>) -> Option<Plan> {
    let (step, merge_kind) = if args.is(0, "MGET") {
        (1, 0)
    } else if args.is(0, "MSET") {
        (2, 1)
    } else if name_is(args, 0, &["DEL", "UNLINK", "EXISTS", "TOUCH"]) {
        (1, 2)
    } else {
        return None;
    };
    let name = args.get(0)?;
    let mut slots: Vec<u16> = Vec::new();
    let mut groups: Vec<Vec<&[u8]>> = Vec::new();
    let mut order = Vec::new();
    let mut i = 1;
    while i < args.len() {
        let key = args.get(i)?;
        let slot = key_slot(key);
        let g = match slots.iter().position(|s| *s == slot) {
            Some(g) => g,
            None => {
                slots.push(slot);
                groups.push(vec![name]);
                slots.len() - 1
            }
        };
        order.push((g, (groups[g].len() - 1) / step));
        for j in 0..step {
            groups[g].push(args.get(i + j)?);
        }
        i += step;
    }
    let parts = slots
        .into_iter()
        .zip(groups)
        .map(|(slot, args)| (slot, Bytes::from(crate::upstream::encode_command(&args))))
        .collect();
    let merge = match merge_kind {
        0 => Merge::Gather(order),
        1 => Merge::Same,
        _ => Merge::Sum,
    };
    Some(Plan::Split { parts, merge })
}

fn is_error(reply: &[u8]) -> bool {
    matches!(reply.first(), Some(b'-') | Some(b'!'))
}

/// The elements of an array reply, each a whole reply; `None` if `reply`
/// is not an array.
fn elements(reply: &Bytes) -> Option<Vec<Bytes>> {
    if !matches!(reply.first(), Some(b'*') | Some(b'~')) {
        return None;
    }
    let end = reply.iter().position(|b| *b == b'\r')?;
    let n: i64 = std::str::from_utf8(&reply[1..end]).ok()?.parse().ok()?;
    let mut at = end + 2;
    let mut out = Vec::with_capacity(n.max(0) as usize);
    for _ in 0..n.max(0) {
        let mut scanner = ReplyScanner::new();
        let len = scanner.scan(&reply[at..]).ok()??;
        out.push(reply.slice(at..at + len));
        at += len;
    }
    Some(out)
}

fn integer(reply: &[u8]) -> Option<i64> {
    let s = reply.strip_prefix(b":")?.strip_suffix(b"\r\n")?;
    std::str::from_utf8(s).ok()?.parse().ok()
}

fn array(items: &[Bytes]) -> Bytes {
    let mut out = BytesMut::new();
    crate::resp::reply::array(&mut out, items.len());
    for i in items {
        out.put_slice(i);
    }
    out.freeze()
}

fn unexpected() -> Reply {
    Ok(Bytes::from_static(
        b"-ERR ackproxy: a cluster node's reply could not be merged\r\n",
    ))
}

/// One reply from the replies of the parts (or nodes), in their order.
pub fn merge(merge: &Merge, replies: Vec<Reply>) -> Reply {
    let mut ok = Vec::with_capacity(replies.len());
    for r in replies {
        let r = r?;
        if is_error(&r) {
            return Ok(r);
        }
        ok.push(r);
    }
    match merge {
        Merge::Same => Ok(ok
            .into_iter()
            .next()
            .unwrap_or_else(|| Bytes::from_static(b"+OK\r\n"))),
        Merge::Sum => {
            let mut sum = 0i64;
            for r in &ok {
                match integer(r) {
                    Some(n) => sum += n,
                    None => return unexpected(),
                }
            }
            let mut out = BytesMut::new();
            crate::resp::reply::integer(&mut out, sum);
            Ok(out.freeze())
        }
        Merge::Gather(order) => {
            let mut parts = Vec::with_capacity(ok.len());
            for r in &ok {
                match elements(r) {
                    Some(e) => parts.push(e),
                    None => return unexpected(),
                }
            }
            let mut items = Vec::with_capacity(order.len());
            for (part, i) in order {
                match parts.get(*part).and_then(|p| p.get(*i)) {
                    Some(e) => items.push(e.clone()),
                    None => return unexpected(),
                }
            }
            Ok(array(&items))
        }
        Merge::Concat => {
            let mut items = Vec::new();
            for r in &ok {
                match elements(r) {
                    Some(e) => items.extend(e),
                    None => return unexpected(),
                }
            }
            Ok(array(&items))
        }
        Merge::And => {
            let mut all: Option<Vec<bool>> = None;
            for r in &ok {
                let Some(e) = elements(r) else {
                    return unexpected();
                };
                let these: Vec<bool> = e.iter().map(|x| integer(x) == Some(1)).collect();
                all = Some(match all {
                    None => these,
                    Some(prev) => prev.iter().zip(these).map(|(a, b)| *a && b).collect(),
                });
            }
            let items: Vec<Bytes> = all
                .unwrap_or_default()
                .into_iter()
                .map(|b| Bytes::from_static(if b { b":1\r\n" } else { b":0\r\n" }))
                .collect();
            Ok(array(&items))
        }
        Merge::FirstNonNil => {
            let nil = |r: &Bytes| r.as_ref() == b"$-1\r\n" || r.as_ref() == b"_\r\n";
            match ok.iter().find(|r| !nil(r)) {
                Some(r) => Ok(r.clone()),
                None => Ok(ok
                    .into_iter()
                    .next()
                    .unwrap_or_else(|| Bytes::from_static(b"$-1\r\n"))),
            }
        }
        Merge::Scan { node, nodes } => {
            let Some(r) = ok.into_iter().next() else {
                return unexpected();
            };
            let Some(e) = elements(&r) else {
                return unexpected();
            };
            let [cursor, keys] = e.as_slice() else {
                return unexpected();
            };
            let own = cursor
                .strip_prefix(b"$")
                .and_then(|c| c.iter().position(|b| *b == b'\n').map(|i| &c[i + 1..]))
                .and_then(|c| c.strip_suffix(b"\r\n"))
                .and_then(|c| std::str::from_utf8(c).ok())
                .and_then(|c| c.parse::<u64>().ok());
            let Some(own) = own else {
                return unexpected();
            };
            let next = if own != 0 {
                if own >> 56 != 0 {
                    return unexpected();
                }
                (own << 8) | *node as u64
            } else if node + 1 < *nodes {
                (node + 1) as u64
            } else {
                0
            };
            let mut out = BytesMut::new();
            crate::resp::reply::array(&mut out, 2);
            crate::resp::reply::bulk(&mut out, next.to_string().as_bytes());
            out.put_slice(keys);
            Ok(out.freeze())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args_of(words: &[&str]) -> (Bytes, Vec<std::ops::Range<usize>>) {
        let parts: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        let frame = Bytes::from(crate::upstream::encode_command(&parts));
        let mut scanner = crate::resp::scanner::RequestScanner::new(Default::default());
        match scanner.scan(&frame) {
            crate::resp::scanner::Scan::Command(_) => {}
            _ => panic!("not a command"),
        }
        (frame.clone(), scanner.args().to_vec())
    }

    #[test]
    fn mget_across_slots_is_gathered_back_in_key_order() {
        let (frame, ranges) = args_of(&["MGET", "a", "b", "a", "c"]);
        let Some(Plan::Split { parts, merge }) = split(Args::new(&frame, &ranges)) else {
            panic!("not split");
        };
        // a, b and c are in three different slots.
        assert_eq!(parts.len(), 3);
        let replies = vec![
            Ok(Bytes::from_static(b"*2\r\n$2\r\nva\r\n$2\r\nva\r\n")),
            Ok(Bytes::from_static(b"*1\r\n$-1\r\n")),
            Ok(Bytes::from_static(b"*1\r\n$2\r\nvc\r\n")),
        ];
        assert_eq!(
            &merge_of(&merge, replies)[..],
            b"*4\r\n$2\r\nva\r\n$-1\r\n$2\r\nva\r\n$2\r\nvc\r\n"
        );
    }

    fn merge_of(m: &Merge, replies: Vec<Reply>) -> Bytes {
        merge(m, replies).unwrap()
    }

    #[test]
    fn counts_add_up_and_errors_win() {
        let r = |s: &'static [u8]| Ok(Bytes::from_static(s));
        assert_eq!(
            &merge_of(&Merge::Sum, vec![r(b":1\r\n"), r(b":2\r\n")])[..],
            b":3\r\n"
        );
        assert_eq!(
            &merge_of(&Merge::Same, vec![r(b"+OK\r\n"), r(b"-OOM no\r\n")])[..],
            b"-OOM no\r\n"
        );
        assert_eq!(
            &merge_of(
                &Merge::And,
                vec![r(b"*2\r\n:1\r\n:1\r\n"), r(b"*2\r\n:0\r\n:1\r\n")]
            )[..],
            b"*2\r\n:0\r\n:1\r\n"
        );
    }

    #[test]
    fn scan_cursors_walk_every_node_in_turn() {
        let reply = |cursor: &str| {
            Ok(Bytes::from(format!(
                "*2\r\n${}\r\n{cursor}\r\n*1\r\n$1\r\nk\r\n",
                cursor.len()
            )))
        };
        let next = |node, nodes, own: &str| {
            let out = merge_of(&Merge::Scan { node, nodes }, vec![reply(own)]);
            let e = elements(&out).unwrap();
            String::from_utf8(e[0][4..e[0].len() - 2].to_vec()).unwrap()
        };
        assert_eq!(next(0, 3, "5"), (5 << 8).to_string());
        assert_eq!(next(1, 3, "5"), ((5 << 8) | 1).to_string());
        assert_eq!(next(1, 3, "0"), "2");
        assert_eq!(next(2, 3, "0"), "0");
        let (frame, ranges) = args_of(&["SCAN", &((7u64 << 8) | 2).to_string(), "COUNT", "10"]);
        let Some(Plan::Scan { node, frame }) = scan(Args::new(&frame, &ranges)) else {
            panic!("not a scan");
        };
        assert_eq!(node, 2);
        assert_eq!(
            &frame[..],
            &crate::upstream::encode_command(&[b"SCAN", b"7", b"COUNT", b"10"])[..]
        );
    }
}
