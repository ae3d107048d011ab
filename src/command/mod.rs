//! Command classification: one table that says, for every command, what the
//! session has to do with it. Nothing else in the proxy compares command
//! names.

pub mod keys;
pub mod table;

use std::ops::Range;

use bytes::Bytes;

/// A framed request's arguments, borrowed from the read buffer.
#[derive(Clone, Copy)]
pub struct Args<'a> {
    buf: &'a [u8],
    ranges: &'a [Range<usize>],
    /// The request as its own `Bytes`, when it is one: an argument kept
    /// past the request is then a slice of it, not a copy.
    frame: Option<&'a Bytes>,
}

impl<'a> Args<'a> {
    pub fn new(buf: &'a [u8], ranges: &'a [Range<usize>]) -> Self {
        Args {
            buf,
            ranges,
            frame: None,
        }
    }

    /// The arguments of a request held as `frame`.
    pub fn of_frame(frame: &'a Bytes, ranges: &'a [Range<usize>]) -> Self {
        Args {
            buf: frame,
            ranges,
            frame: Some(frame),
        }
    }

    /// Argument `i` to keep: a slice of the request when it is held as
    /// its own `Bytes`, else a copy.
    pub fn to_bytes(&self, i: usize) -> Option<Bytes> {
        let r = self.ranges.get(i)?.clone();
        Some(match self.frame {
            Some(frame) => frame.slice(r),
            None => Bytes::copy_from_slice(&self.buf[r]),
        })
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        self.ranges.get(i).map(|r| &self.buf[r.clone()])
    }

    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.ranges.iter().map(|r| &self.buf[r.clone()])
    }

    /// Argument `i` equals `word`, ignoring ASCII case.
    pub fn is(&self, i: usize, word: &str) -> bool {
        self.get(i)
            .is_some_and(|a| a.eq_ignore_ascii_case(word.as_bytes()))
    }
}

/// What executing a command does to the client's connection state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No connection state: may share an upstream connection.
    Plain,
    /// May block server-side: runs on a dedicated connection until its reply.
    Blocking,
    /// A client's script or function call (EVAL*, FCALL*): it may run for
    /// long, and on a shared connection nobody could kill it. Runs like
    /// `Blocking`.
    Script,
    /// Served by Redis while a script runs (SCRIPT KILL, FUNCTION KILL,
    /// SHUTDOWN) or meant to end a pause (CLIENT PAUSE/UNPAUSE): sent on a
    /// connection where nothing of other clients is queued before it.
    Urgent,
    Multi,
    /// EXEC or DISCARD: ends MULTI and WATCH.
    EndTransaction,
    Watch,
    Unwatch,
    /// Changes connection state for good (until RESET): AUTH, HELLO,
    /// SELECT n, ...
    Sticky,
    /// CLIENT SETNAME, SETINFO, GETNAME: connection metadata the proxy
    /// keeps for the client itself; CLIENT ID, INFO, LIST, KILL, NO-EVICT,
    /// UNBLOCK: the proxy's table of its clients.
    Meta,
    /// Like `Sticky`, and replies stop matching requests one to one
    /// (SUBSCRIBE family, MONITOR, CLIENT REPLY OFF|SKIP).
    StickyUnpaired,
    Reset,
    Quit,
    /// A list pop that queue rules may intercept.
    Pop(PopForm),
    /// LREM: may acknowledge a lease when the key is a move destination.
    Lrem,
    Ack,
    Nack,
    Queue,
}

/// The list pop commands, by shape of arguments and reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PopForm {
    /// LPOP/RPOP key [count]
    Pop { left: bool },
    /// BLPOP/BRPOP key [key ...] timeout
    BPop { left: bool },
    /// RPOPLPUSH source destination
    RPopLPush,
    /// BRPOPLPUSH source destination timeout
    BRPopLPush,
    /// LMOVE source destination LEFT|RIGHT LEFT|RIGHT
    LMove,
    /// BLMOVE source destination LEFT|RIGHT LEFT|RIGHT timeout
    BLMove,
    /// LMPOP numkeys key [key ...] LEFT|RIGHT [COUNT count]
    LMPop,
    /// BLMPOP timeout numkeys key [key ...] LEFT|RIGHT [COUNT count]
    BLMPop,
}

impl PopForm {
    pub fn is_blocking(self) -> bool {
        matches!(
            self,
            PopForm::BPop { .. } | PopForm::BRPopLPush | PopForm::BLMove | PopForm::BLMPop
        )
    }
}

/// Upper-cases a command name into a stack buffer; names longer than any
/// known command classify as `Plain`.
fn upper(name: &[u8], out: &mut [u8; 24]) -> Option<usize> {
    if name.len() > out.len() {
        return None;
    }
    for (o, b) in out.iter_mut().zip(name) {
        *o = b.to_ascii_uppercase();
    }
    Some(name.len())
}

pub fn classify(args: Args<'_>) -> Kind {
    classified(args).0
}

/// [`classify`] and [`may_write`] of a request at once: for a command that
/// only Redis's table classifies, the one lookup answers both (this is on
/// every shared request's path).
pub fn classify_writes(args: Args<'_>) -> (Kind, bool) {
    match classified(args) {
        (kind, Some(writes)) => (kind, writes),
        (kind, None) => (kind, may_write(args)),
    }
}

/// The kind, and whether the request may write if that came with it.
fn classified(args: Args<'_>) -> (Kind, Option<bool>) {
    let Some(name) = args.get(0) else {
        return (Kind::Plain, None);
    };
    let mut buf = [0u8; 24];
    let Some(n) = upper(name, &mut buf) else {
        return (Kind::Plain, None);
    };
    let kind = match &buf[..n] {
        // The commands most requests are, named here so that they cost no
        // lookup: flags no Redis version has changed.
        b"GET" | b"PING" => return (Kind::Plain, Some(false)),
        b"SET" => return (Kind::Plain, Some(true)),
        b"RPOP" => Kind::Pop(PopForm::Pop { left: false }),
        b"LPOP" => Kind::Pop(PopForm::Pop { left: true }),
        b"BRPOP" => Kind::Pop(PopForm::BPop { left: false }),
        b"BLPOP" => Kind::Pop(PopForm::BPop { left: true }),
        b"RPOPLPUSH" => Kind::Pop(PopForm::RPopLPush),
        b"BRPOPLPUSH" => Kind::Pop(PopForm::BRPopLPush),
        b"LMOVE" => Kind::Pop(PopForm::LMove),
        b"BLMOVE" => Kind::Pop(PopForm::BLMove),
        b"LMPOP" => Kind::Pop(PopForm::LMPop),
        b"BLMPOP" => Kind::Pop(PopForm::BLMPop),
        b"LREM" => Kind::Lrem,
        b"ACK" => Kind::Ack,
        b"NACK" => Kind::Nack,
        b"QUEUE" => Kind::Queue,
        b"BZPOPMIN" | b"BZPOPMAX" | b"BZMPOP" | b"WAIT" | b"WAITAOF" => Kind::Blocking,
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => Kind::Script,
        b"SHUTDOWN" => Kind::Urgent,
        b"SCRIPT" | b"FUNCTION" if args.is(1, "KILL") => Kind::Urgent,
        b"XREAD" | b"XREADGROUP" => {
            if args
                .iter()
                .skip(1)
                .any(|a| a.eq_ignore_ascii_case(b"BLOCK"))
            {
                Kind::Blocking
            } else {
                Kind::Plain
            }
        }
        b"MULTI" => Kind::Multi,
        b"EXEC" | b"DISCARD" => Kind::EndTransaction,
        b"WATCH" => Kind::Watch,
        b"UNWATCH" => Kind::Unwatch,
        b"AUTH" | b"HELLO" | b"READONLY" | b"READWRITE" | b"ASKING" => Kind::Sticky,
        b"SELECT" => match args.get(1).and_then(parse_i64) {
            Some(0) | None => Kind::Plain,
            Some(_) => Kind::Sticky,
        },
        b"SUBSCRIBE" | b"PSUBSCRIBE" | b"SSUBSCRIBE" | b"UNSUBSCRIBE" | b"PUNSUBSCRIBE"
        | b"SUNSUBSCRIBE" | b"MONITOR" | b"SYNC" | b"PSYNC" | b"REPLCONF" => Kind::StickyUnpaired,
        b"CLIENT" => classify_client(args),
        b"RESET" => Kind::Reset,
        b"QUIT" => Kind::Quit,
        _ => {
            let (kind, writes) = from_table(args);
            return (kind, Some(writes));
        }
    };
    (kind, None)
}

/// A command the hand-written table does not single out: Redis's own flags
/// say whether it can block, and whether it may write.
fn from_table(args: Args<'_>) -> (Kind, bool) {
    let name = args.get(0).unwrap_or_default();
    let (flags, writes) = table::with_current(|t| writes_by(t, name, args.get(1)));
    let kind = match flags {
        Some(f) if f.blocking => Kind::Blocking,
        // Redis serves these while a script runs: they must not wait
        // behind anything (FUNCTION STATS, ...).
        Some(f) if f.allow_busy => Kind::Urgent,
        _ => Kind::Plain,
    };
    (kind, writes)
}

/// Whether Redis holds the command during `CLIENT PAUSE WRITE`: it may
/// write or replicate. Without Redis's table, any command may.
pub fn may_write(args: Args<'_>) -> bool {
    let name = args.get(0).unwrap_or_default();
    table::with_current(|t| writes_by(t, name, args.get(1)).1)
}

/// The command's flags in `table`, and whether it may write.
fn writes_by(
    table: Option<&table::Table>,
    name: &[u8],
    sub: Option<&[u8]>,
) -> (Option<table::Flags>, bool) {
    let Some(table) = table else {
        return (None, true);
    };
    match table.lookup(name, sub) {
        // The table has the commands of `table::may_replicate` flagged.
        Some(f) => (Some(f), f.write || f.may_replicate),
        None => (None, table::may_replicate(name)),
    }
}

fn classify_client(args: Args<'_>) -> Kind {
    let mut buf = [0u8; 24];
    let Some(n) = args.get(1).and_then(|s| upper(s, &mut buf)) else {
        return Kind::Plain;
    };
    match &buf[..n] {
        b"REPLY" => {
            if args.is(2, "ON") {
                Kind::Sticky
            } else {
                Kind::StickyUnpaired
            }
        }
        // These read or change the state of the connection itself, which on a
        // shared upstream connection would be somebody else's.
        b"PAUSE" | b"UNPAUSE" => Kind::Urgent,
        b"SETNAME" | b"SETINFO" | b"GETNAME" => Kind::Meta,
        // The proxy's table of clients answers these (`session::clients`).
        b"ID" | b"INFO" | b"LIST" | b"KILL" | b"NO-EVICT" | b"UNBLOCK" => Kind::Meta,
        b"TRACKING" | b"TRACKINGINFO" | b"CACHING" | b"GETREDIR" | b"NO-TOUCH" => Kind::Sticky,
        _ => Kind::Plain,
    }
}

pub use crate::resp::parse_i64;

/// Runs `f` on the arguments `words`, for unit tests.
#[cfg(test)]
pub fn with_words<T>(words: &[&str], f: impl FnOnce(Args<'_>) -> T) -> T {
    let mut buf = Vec::new();
    let mut ranges = Vec::new();
    for w in words {
        let start = buf.len();
        buf.extend_from_slice(w.as_bytes());
        ranges.push(start..buf.len());
    }
    f(Args::new(&buf, &ranges))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(words: &[&str]) -> Kind {
        with_words(words, classify)
    }

    #[test]
    fn names_are_case_insensitive() {
        assert_eq!(kind(&["multi"]), Kind::Multi);
        assert_eq!(
            kind(&["bRpOp", "q", "0"]),
            Kind::Pop(PopForm::BPop { left: false })
        );
        assert_eq!(kind(&["get", "k"]), Kind::Plain);
    }

    #[test]
    fn argument_dependent_kinds() {
        assert_eq!(kind(&["SELECT", "0"]), Kind::Plain);
        assert_eq!(kind(&["SELECT", "3"]), Kind::Sticky);
        assert_eq!(kind(&["SELECT", "x"]), Kind::Plain);
        assert_eq!(kind(&["XREAD", "STREAMS", "s", "0"]), Kind::Plain);
        assert_eq!(
            kind(&["XREAD", "block", "0", "STREAMS", "s", "$"]),
            Kind::Blocking
        );
        assert_eq!(kind(&["CLIENT", "setname", "x"]), Kind::Meta);
        assert_eq!(kind(&["CLIENT", "GETNAME"]), Kind::Meta);
        assert_eq!(kind(&["CLIENT", "REPLY", "OFF"]), Kind::StickyUnpaired);
        assert_eq!(kind(&["CLIENT", "LIST"]), Kind::Meta);
        assert_eq!(kind(&["CLIENT", "HELP"]), Kind::Plain);
        assert_eq!(kind(&["SUBSCRIBE", "c"]), Kind::StickyUnpaired);
        assert_eq!(kind(&["evalsha_ro", "x", "0"]), Kind::Script);
        assert_eq!(kind(&["SCRIPT", "kill"]), Kind::Urgent);
        assert_eq!(kind(&["SCRIPT", "FLUSH"]), Kind::Plain);
        assert_eq!(kind(&["CLIENT", "unpause"]), Kind::Urgent);
    }

    #[test]
    fn redis_table_marks_commands_the_hand_table_does_not_know() {
        assert_eq!(kind(&["XBLOCKPOP", "k", "0"]), Kind::Plain);
        let reply = b"*1\r\n*10\r\n$9\r\nxblockpop\r\n:-3\r\n*2\r\n+write\r\n+blocking\r\n\
            :1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n";
        let reply = redis::parse_redis_value(reply).unwrap();
        table::install(table::Table::from_reply(&reply).unwrap());
        assert_eq!(kind(&["xblockpop", "k", "0"]), Kind::Blocking);
        // Argument-dependent refinements still decide.
        assert_eq!(kind(&["XREAD", "STREAMS", "s", "0"]), Kind::Plain);
        assert_eq!(kind(&["SELECT", "0"]), Kind::Plain);
    }

    #[test]
    fn whether_a_request_may_write_comes_with_its_kind() {
        let writes = |words: &[&str]| with_words(words, classify_writes);
        assert_eq!(writes(&["get", "k"]), (Kind::Plain, false));
        assert_eq!(writes(&["PING"]), (Kind::Plain, false));
        assert_eq!(writes(&["Set", "k", "v"]), (Kind::Plain, true));
        // What the hand-written table singles out keeps its kind.
        assert_eq!(writes(&["MULTI"]).0, Kind::Multi);
        assert_eq!(writes(&["SCRIPT", "KILL"]).0, Kind::Urgent);
        // Scripts and PUBLISH may replicate, whatever table is in use
        // (another test installs a table of one command).
        assert!(writes(&["EVAL_RO", "return 1", "0"]).1);
        assert!(writes(&["PUBLISH", "c", "m"]).1);
        for words in [
            &["PUBLISH", "c", "m"][..],
            &["LLEN", "k"],
            &["XREAD", "STREAMS", "s", "0"],
        ] {
            assert_eq!(with_words(words, classify), writes(words).0);
        }
    }

    #[test]
    fn integers_parse_like_redis() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"05"), None);
        assert_eq!(parse_i64(b"+5"), None);
        assert_eq!(parse_i64(b"-0"), None);
        assert_eq!(parse_i64(b" 5"), None);
        assert_eq!(parse_i64(b"99999999999999999999"), None);
    }

    #[test]
    fn overlong_or_missing_names_are_plain() {
        assert_eq!(kind(&["X".repeat(100).as_str()]), Kind::Plain);
        assert_eq!(kind(&[]), Kind::Plain);
    }
}
