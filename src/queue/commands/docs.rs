//! `COMMAND INFO` and `COMMAND DOCS` for the proxy's own commands (ACK,
//! NACK, QUEUE and its operations), in Redis's own shape, so that
//! redis-cli's hints and clients that read the command table know them.
//!
//! Redis answers these requests as usual; the proxy's entries replace the
//! nulls Redis gives for names it does not know (`COMMAND INFO ack`), join
//! the found ones in the order asked (`COMMAND DOCS`), or follow Redis's
//! whole table when no name is given. A request that names none of the
//! proxy's commands is not looked at: its reply is Redis's, byte for byte.

use bytes::{Bytes, BytesMut};

use crate::command::Args;
use crate::output::{ReplyTransform, Transformed};
use crate::resp::frame::{bulk, items};
use crate::resp::reply;

/// Whether the request is one [`view`] may answer for.
pub fn concerns(args: Args<'_>) -> bool {
    args.len() >= 2 && args.is(0, "COMMAND") && (args.is(1, "INFO") || args.is(1, "DOCS"))
}

/// The transform of the reply, when the request names one of the proxy's
/// commands or none at all.
pub fn view(args: Args<'_>) -> Option<Box<dyn ReplyTransform>> {
    if !concerns(args) {
        return None;
    }
    let names: Vec<Vec<u8>> = (2..args.len())
        .filter_map(|i| args.get(i).map(<[u8]>::to_vec))
        .collect();
    if !names.is_empty() && !names.iter().any(|n| find(n).is_some()) {
        return None;
    }
    Some(Box::new(Entries {
        docs: args.is(1, "DOCS"),
        names,
    }))
}

/// One of the proxy's commands, or an operation of `QUEUE`.
struct Command {
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    /// Where its one key is (0: none).
    key: i64,
    key_flags: &'static [&'static str],
    acl: &'static [&'static str],
    summary: &'static str,
    complexity: &'static str,
    arguments: &'static [Arg],
}

enum Arg {
    Key(&'static str),
    Text(&'static str),
    Many(&'static str),
    Integer(&'static str),
    /// `[TOKEN value]`, of a type.
    Option(&'static str, &'static str, &'static str),
    /// A word said as is.
    Token(&'static str),
    /// `[A x | B y]`: one of these options at most.
    OneOf(&'static str, &'static [Arg]),
    /// `[TOKEN a b]`.
    Block(&'static str, &'static str, &'static [&'static str]),
}

const ACK: Command = Command {
    name: "ack",
    arity: -3,
    flags: &["write", "fast"],
    key: 1,
    key_flags: &["RW", "delete"],
    acl: &["@write", "@list", "@fast"],
    summary: "Acknowledge leased messages: their leases end and they are not delivered again",
    complexity: "O(N) where N is the number of ids",
    arguments: &[Arg::Key("queue"), Arg::Many("id")],
};

const NACK: Command = Command {
    name: "nack",
    arity: -3,
    flags: &["write", "fast"],
    key: 1,
    key_flags: &["RW", "update"],
    acl: &["@write", "@list", "@fast"],
    summary: "Return leased messages to their queue, now, after the retry backoff or after a delay",
    complexity: "O(N) where N is the number of ids",
    arguments: &[
        Arg::Key("queue"),
        Arg::Many("id"),
        Arg::Option("DELAY", "ms", "integer"),
    ],
};

const QUEUE: Command = Command {
    name: "queue",
    arity: -2,
    flags: &[],
    key: 0,
    key_flags: &[],
    acl: &["@slow"],
    summary: "A container for the operations of ackproxy's queues",
    complexity: "Depends on subcommand.",
    arguments: &[],
};

const OPERATIONS: &[Command] = &[
    Command {
        name: "queue|push",
        arity: -4,
        flags: &["write", "denyoom"],
        key: 2,
        key_flags: &["RW", "insert"],
        acl: &["@write", "@list", "@slow"],
        summary: "Push messages, now or when due",
        complexity: "O(N) where N is the number of messages",
        arguments: &[
            Arg::Key("queue"),
            Arg::Many("payload"),
            Arg::OneOf(
                "when",
                &[
                    Arg::Option("DELAY", "ms", "integer"),
                    Arg::Option("AT", "unix-time-milliseconds", "unix-time"),
                ],
            ),
        ],
    },
    Command {
        name: "queue|extend",
        arity: 5,
        flags: &["write", "fast"],
        key: 2,
        key_flags: &["RW", "update"],
        acl: &["@write", "@list", "@fast"],
        summary: "Renew the leases of the messages with this id",
        complexity: "O(1)",
        arguments: &[Arg::Key("queue"), Arg::Text("id"), Arg::Integer("ms")],
    },
    Command {
        name: "queue|info",
        arity: 3,
        flags: &["readonly"],
        key: 2,
        key_flags: &["RO", "access"],
        acl: &["@read", "@list", "@slow"],
        summary: "Counts, totals, the rule and a suggested lease of a queue",
        complexity: "O(1)",
        arguments: &[Arg::Key("queue")],
    },
    Command {
        name: "queue|dead",
        arity: -3,
        flags: &["readonly"],
        key: 2,
        key_flags: &["RO", "access"],
        acl: &["@read", "@list", "@slow"],
        summary: "The oldest dead letters, each with its history",
        complexity: "O(S+N) where S is the offset (from the nearer end of a large list) and N is the count",
        arguments: &[
            Arg::Key("queue"),
            Arg::Option("COUNT", "count", "integer"),
            Arg::Option("OFFSET", "offset", "integer"),
        ],
    },
    Command {
        name: "queue|redrive",
        arity: -3,
        flags: &["write"],
        key: 2,
        key_flags: &["RW", "insert"],
        acl: &["@write", "@list", "@slow"],
        summary: "Return dead letters to the queue as new messages",
        complexity: "O(N) where N is the number of dead letters returned",
        arguments: &[
            Arg::Key("queue"),
            Arg::OneOf(
                "which",
                &[
                    Arg::Option("COUNT", "count", "integer"),
                    Arg::Block("ID", "one", &["id", "payload"]),
                ],
            ),
        ],
    },
    Command {
        name: "queue|purge",
        arity: -4,
        flags: &["write"],
        key: 2,
        key_flags: &["RW", "delete"],
        acl: &["@write", "@list", "@slow"],
        summary: "Delete the dead letters, or one of them",
        complexity: "O(N) where N is the number of dead letters deleted",
        arguments: &[
            Arg::Key("queue"),
            Arg::Token("DEAD"),
            Arg::Block("ID", "one", &["id", "payload"]),
        ],
    },
    Command {
        name: "queue|leases",
        arity: -3,
        flags: &["readonly"],
        key: 2,
        key_flags: &["RO", "access"],
        acl: &["@read", "@list", "@slow"],
        summary: "The leases that expire first",
        complexity: "O(log(L)*(log(S)+1)+N) where L is the number of leases, S is the offset and N is the count",
        arguments: &[
            Arg::Key("queue"),
            Arg::Option("COUNT", "count", "integer"),
            Arg::Option("OFFSET", "offset", "integer"),
        ],
    },
    Command {
        name: "queue|help",
        arity: 2,
        flags: &["loading", "stale"],
        key: 0,
        key_flags: &[],
        acl: &["@slow"],
        summary: "Show helpful text about the different subcommands",
        complexity: "O(1)",
        arguments: &[],
    },
];

const TOP: [&Command; 3] = [&ACK, &NACK, &QUEUE];

fn find(name: &[u8]) -> Option<&'static Command> {
    TOP.into_iter()
        .chain(OPERATIONS)
        .find(|c| c.name.as_bytes().eq_ignore_ascii_case(name))
}

/// A reply as a tree, written in either protocol: sets and maps are
/// arrays in RESP2.
enum V {
    Bulk(String),
    Int(i64),
    Simple(&'static str),
    Array(Vec<V>),
    Set(Vec<V>),
    Map(Vec<(&'static str, V)>),
}

fn bulk_of(s: &str) -> V {
    V::Bulk(s.to_string())
}

fn simples(words: &[&'static str]) -> V {
    V::Set(words.iter().map(|w| V::Simple(w)).collect())
}

impl V {
    fn write(&self, out: &mut BytesMut, protocol: u8) {
        match self {
            V::Bulk(s) => reply::bulk(out, s.as_bytes()),
            V::Int(n) => reply::integer(out, *n),
            V::Simple(s) => reply::simple(out, s),
            V::Array(items) | V::Set(items) => {
                if protocol >= 3 && matches!(self, V::Set(_)) {
                    out.extend_from_slice(format!("~{}\r\n", items.len()).as_bytes());
                } else {
                    reply::array(out, items.len());
                }
                for i in items {
                    i.write(out, protocol);
                }
            }
            V::Map(fields) => {
                reply::map(out, fields.len(), protocol);
                for (k, v) in fields {
                    reply::bulk(out, k.as_bytes());
                    v.write(out, protocol);
                }
            }
        }
    }
}

/// `COMMAND INFO`'s entry.
fn info(c: &Command) -> V {
    let subcommands = if c.name == "queue" {
        OPERATIONS.iter().map(info).collect()
    } else {
        Vec::new()
    };
    let specs = if c.key > 0 {
        vec![V::Map(vec![
            ("flags", simples(c.key_flags)),
            (
                "begin_search",
                V::Map(vec![
                    ("type", bulk_of("index")),
                    ("spec", V::Map(vec![("index", V::Int(c.key))])),
                ]),
            ),
            (
                "find_keys",
                V::Map(vec![
                    ("type", bulk_of("range")),
                    (
                        "spec",
                        V::Map(vec![
                            ("lastkey", V::Int(0)),
                            ("keystep", V::Int(1)),
                            ("limit", V::Int(0)),
                        ]),
                    ),
                ]),
            ),
        ])]
    } else {
        Vec::new()
    };
    let step = i64::from(c.key > 0);
    V::Array(vec![
        bulk_of(c.name),
        V::Int(c.arity),
        simples(c.flags),
        V::Int(c.key),
        V::Int(c.key),
        V::Int(step),
        simples(c.acl),
        V::Set(Vec::new()),
        V::Set(specs),
        V::Set(subcommands),
    ])
}

/// `COMMAND DOCS`'s entry.
fn docs(c: &Command) -> V {
    let mut fields = vec![
        ("summary", bulk_of(c.summary)),
        ("since", bulk_of(env!("CARGO_PKG_VERSION"))),
        (
            "group",
            bulk_of(if c.name == "queue" { "generic" } else { "list" }),
        ),
        ("complexity", bulk_of(c.complexity)),
    ];
    if !c.arguments.is_empty() {
        fields.push((
            "arguments",
            V::Array(c.arguments.iter().map(argument).collect()),
        ));
    }
    if c.name == "queue" {
        fields.push((
            "subcommands",
            V::Map(OPERATIONS.iter().map(|o| (o.name, docs(o))).collect()),
        ));
    }
    V::Map(fields)
}

fn plain(name: &str, kind: &str) -> Vec<(&'static str, V)> {
    vec![("name", bulk_of(name)), ("type", bulk_of(kind))]
}

fn argument(a: &Arg) -> V {
    argument_in(a, true)
}

/// An argument's entry; `alone`: not a choice of a `OneOf`, whose options
/// are optional as a whole.
fn argument_in(a: &Arg, alone: bool) -> V {
    let optional = || ("flags", simples(&["optional"]));
    V::Map(match a {
        Arg::Key(name) => {
            let mut f = plain(name, "key");
            f.push(("key_spec_index", V::Int(0)));
            f
        }
        Arg::Text(name) => plain(name, "string"),
        Arg::Integer(name) => plain(name, "integer"),
        Arg::Many(name) => {
            let mut f = plain(name, "string");
            f.push(("flags", simples(&["multiple"])));
            f
        }
        Arg::Option(token, name, kind) => {
            let mut f = plain(name, kind);
            f.push(("token", bulk_of(token)));
            if alone {
                f.push(optional());
            }
            f
        }
        Arg::Token(token) => {
            let mut f = plain(&token.to_ascii_lowercase(), "pure-token");
            f.push(("token", bulk_of(token)));
            f
        }
        Arg::OneOf(name, choices) => {
            let mut f = plain(name, "oneof");
            f.push(optional());
            let inner = choices.iter().map(|c| argument_in(c, false)).collect();
            f.push(("arguments", V::Array(inner)));
            f
        }
        Arg::Block(token, name, parts) => {
            let mut f = plain(name, "block");
            f.push(("token", bulk_of(token)));
            if alone {
                f.push(optional());
            }
            let inner = parts.iter().map(|p| V::Map(plain(p, "string"))).collect();
            f.push(("arguments", V::Array(inner)));
            f
        }
    })
}

struct Entries {
    docs: bool,
    /// The names asked for; none: Redis's whole table.
    names: Vec<Vec<u8>>,
}

impl ReplyTransform for Entries {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        let rewritten = if self.docs {
            self.docs_reply(&reply)
        } else {
            self.info_reply(&reply)
        };
        Transformed::Done(rewritten.unwrap_or(reply))
    }
}

impl Entries {
    fn info_reply(&self, reply: &[u8]) -> Option<Bytes> {
        let (b'*', entries) = items(reply)? else {
            return None;
        };
        let mut out = BytesMut::with_capacity(reply.len() + 4096);
        if self.names.is_empty() {
            // RESP3 writes an entry's flags as a set.
            let protocol = match entries.first() {
                Some(e) => match items(&reply[e.clone()])?.1.get(2) {
                    Some(flags) if reply[e.start + flags.start] == b'~' => 3,
                    _ => 2,
                },
                None => 2,
            };
            reply::array(&mut out, entries.len() + TOP.len());
            out.extend_from_slice(&reply[entries.first().map_or(reply.len(), |e| e.start)..]);
            for c in TOP {
                info(c).write(&mut out, protocol);
            }
            return Some(out.freeze());
        }
        if entries.len() != self.names.len() {
            return None;
        }
        // Redis's null for a name it does not know tells the protocol.
        let protocol = self
            .names
            .iter()
            .zip(&entries)
            .find(|(n, _)| find(n).is_some())
            .map(|(_, e)| if reply[e.start] == b'_' { 3 } else { 2 })?;
        reply::array(&mut out, entries.len());
        for (name, e) in self.names.iter().zip(&entries) {
            match find(name) {
                Some(c) => info(c).write(&mut out, protocol),
                None => out.extend_from_slice(&reply[e.clone()]),
            }
        }
        Some(out.freeze())
    }

    fn docs_reply(&self, reply: &[u8]) -> Option<Bytes> {
        let (kind, fields) = items(reply)?;
        let protocol = match kind {
            b'%' => 3,
            b'*' => 2,
            _ => return None,
        };
        let pairs: Vec<(&[u8], &[u8])> = fields
            .chunks(2)
            .map(|p| match p {
                [k, v] => Some((&reply[k.clone()], &reply[v.clone()])),
                _ => None,
            })
            .collect::<Option<_>>()?;
        let mut body = BytesMut::with_capacity(reply.len() + 4096);
        let mut count = 0;
        let mut theirs = pairs.iter().peekable();
        if self.names.is_empty() {
            for (k, v) in theirs.by_ref() {
                body.extend_from_slice(k);
                body.extend_from_slice(v);
                count += 1;
            }
            for c in TOP {
                reply::bulk(&mut body, c.name.as_bytes());
                docs(c).write(&mut body, protocol);
                count += 1;
            }
        } else {
            // Redis lists the names it knows in the order asked.
            for name in &self.names {
                if let Some(c) = find(name) {
                    reply::bulk(&mut body, c.name.as_bytes());
                    docs(c).write(&mut body, protocol);
                    count += 1;
                } else if let Some((k, v)) =
                    theirs.next_if(|(k, _)| bulk(k).is_some_and(|k| k.eq_ignore_ascii_case(name)))
                {
                    body.extend_from_slice(k);
                    body.extend_from_slice(v);
                    count += 1;
                }
            }
            for (k, v) in theirs {
                body.extend_from_slice(k);
                body.extend_from_slice(v);
                count += 1;
            }
        }
        let mut out = BytesMut::with_capacity(body.len() + 16);
        reply::map(&mut out, count, protocol);
        out.extend_from_slice(&body);
        Some(out.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(v: &V, protocol: u8) -> Vec<u8> {
        let mut out = BytesMut::new();
        v.write(&mut out, protocol);
        out.to_vec()
    }

    #[test]
    fn entries_are_whole_replies_in_both_protocols() {
        for c in TOP.into_iter().chain(OPERATIONS) {
            for protocol in [2, 3] {
                for v in [info(c), docs(c)] {
                    let bytes = written(&v, protocol);
                    let len = crate::resp::ReplyScanner::new().scan(&bytes).unwrap();
                    assert_eq!(len, Some(bytes.len()), "{}", c.name);
                }
            }
        }
    }

    #[test]
    fn every_queue_operation_of_the_help_has_an_entry() {
        for line in crate::queue::commands::HELP.iter().skip(1) {
            let Some(word) = line
                .split(' ')
                .next()
                .filter(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_uppercase()))
            else {
                continue;
            };
            if line.starts_with("Outside") {
                continue;
            }
            let name = format!("queue|{}", word.to_ascii_lowercase());
            assert!(find(name.as_bytes()).is_some(), "{name}");
        }
    }
}
