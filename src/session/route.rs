//! Where a request goes. One pure decision from the request and a few facts
//! about the client and Redis, so that the rules that keep clients apart
//! live in one place: nothing that can block, run for long, be held by a
//! pause made through the proxy, or make Redis drop the connection goes on
//! a shared connection; and on the shared pair, nothing a pause made on
//! Redis directly may hold goes ahead of another client's reads ([`lane`]).

use std::time::Instant;

use crate::command::{may_write, Args, Kind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Multiplexed with other clients' requests.
    Shared,
    /// The client's dedicated connection, for this request only: it goes
    /// back to the shared connection once the reply is in.
    Dedicated,
    /// The client's dedicated connection, which it keeps while in a
    /// stateful mode (or always, with `--dedicated-per-client`).
    Pinned,
    /// Answered by the proxy itself.
    Proxy,
}

/// A `CLIENT PAUSE` made through the proxy and still in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    pub until: Instant,
    /// `ALL` rather than `WRITE`.
    pub all: bool,
}

impl Pause {
    /// Whether Redis would hold the request while the pause lasts.
    pub fn holds(&self, args: Args<'_>, now: Instant) -> bool {
        now < self.until && (self.all || may_write(args))
    }
}

pub struct Facts {
    pub pinned: bool,
    /// The client has had a big reply on a shared connection: more are
    /// likely, and would hold it up for others.
    pub big_replies: bool,
    pub pause: Option<Pause>,
    pub now: Instant,
}

/// Which connection of the shared pair a batch of requests goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Some request of the batch may write (or replicate): Redis holds it
    /// during `CLIENT PAUSE WRITE`, and everything behind it on that
    /// connection with it.
    Writes,
    /// Nothing a write pause holds: never queued behind another client's
    /// held write.
    Reads,
}

/// The lane of a batch for a shared connection. `writes`: some request of
/// it may write; `inflight`: the lane of the client's earlier requests still
/// unanswered, if any. A client's requests must run in the order it sent
/// them, and two connections do not keep that order: a read follows the
/// client's writes still in flight onto their lane (as directly, it waits
/// behind its own held write), and a write waits until the client's reads
/// in flight are answered (shortly: a write pause holds none of them) —
/// `inflight == Some(Reads)` with `Writes` chosen.
pub fn lane(writes: bool, inflight: Option<Lane>) -> Lane {
    match inflight {
        Some(Lane::Writes) => Lane::Writes,
        _ if writes => Lane::Writes,
        _ => Lane::Reads,
    }
}

/// Redis's smallest proto-max-bulk-len. A request holding a bulk this long
/// may be one Redis refuses by closing the connection, so it never goes on a
/// shared one.
pub const OVERSIZED_BULK: usize = 1024 * 1024;

pub fn oversized(args: Args<'_>) -> bool {
    args.iter().any(|a| a.len() >= OVERSIZED_BULK)
}

/// The route of a request the queue interceptor left alone (or of the
/// request it rewrote into, with the original's kind).
pub fn route(kind: Kind, args: Args<'_>, f: &Facts) -> Route {
    match kind {
        Kind::Quit => return Route::Proxy,
        Kind::Reset if !f.pinned => return Route::Proxy,
        _ => {}
    }
    if f.pinned {
        return Route::Pinned;
    }
    match kind {
        Kind::Multi | Kind::Watch | Kind::Sticky | Kind::StickyUnpaired => Route::Pinned,
        Kind::Blocking | Kind::Script | Kind::Urgent => Route::Dedicated,
        Kind::Pop(form) if form.is_blocking() => Route::Dedicated,
        _ if oversized(args) || f.big_replies => Route::Dedicated,
        _ if f.pause.is_some_and(|p| p.holds(args, f.now)) => Route::Dedicated,
        _ => Route::Shared,
    }
}

/// The pause a `CLIENT PAUSE timeout [WRITE|ALL]` starts, as Redis parses
/// it; `None` if Redis would refuse it.
pub fn parse_pause(args: Args<'_>, now: Instant) -> Option<Pause> {
    let ms = crate::command::parse_i64(args.get(2)?)?;
    if ms < 0 {
        return None;
    }
    let all = match args.len() {
        3 => true,
        4 if args.is(3, "ALL") => true,
        4 if args.is(3, "WRITE") => false,
        _ => return None,
    };
    // Redis starts counting when it runs the command, a little after it
    // leaves here.
    let until = now + std::time::Duration::from_millis(ms as u64 + 100);
    Some(Pause { until, all })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{classify, with_words};

    fn decide(words: &[&str], f: &Facts) -> Route {
        with_words(words, |args| route(classify(args), args, f))
    }

    fn facts(pause: Option<Pause>) -> Facts {
        Facts {
            pinned: false,
            big_replies: false,
            pause,
            now: Instant::now(),
        }
    }

    #[test]
    fn nothing_that_can_stall_others_is_shared() {
        let f = facts(None);
        assert_eq!(decide(&["GET", "k"], &f), Route::Shared);
        assert_eq!(decide(&["EVAL", "return 1", "0"], &f), Route::Dedicated);
        assert_eq!(decide(&["FCALL_RO", "f", "0"], &f), Route::Dedicated);
        assert_eq!(decide(&["SCRIPT", "KILL"], &f), Route::Dedicated);
        assert_eq!(decide(&["BLPOP", "k", "0"], &f), Route::Dedicated);
        assert_eq!(decide(&["WAIT", "1", "0"], &f), Route::Dedicated);
        assert_eq!(decide(&["XREAD", "STREAMS", "s", "0"], &f), Route::Shared);
        assert_eq!(decide(&["SELECT", "0"], &f), Route::Shared);
        assert_eq!(decide(&["SELECT", "2"], &f), Route::Pinned);
        assert_eq!(decide(&["QUIT"], &f), Route::Proxy);
        let big = "x".repeat(OVERSIZED_BULK);
        assert_eq!(decide(&["SET", "k", &big], &f), Route::Dedicated);
    }

    #[test]
    fn a_pause_moves_what_it_would_hold() {
        let now = Instant::now();
        let write = Pause {
            until: now + std::time::Duration::from_secs(5),
            all: false,
        };
        let f = facts(Some(write));
        // Without Redis's table every command may write.
        assert_eq!(decide(&["PUBLISH", "c", "m"], &f), Route::Dedicated);
        let all = facts(Some(Pause { all: true, ..write }));
        assert_eq!(decide(&["GET", "k"], &all), Route::Dedicated);
        let over = Facts {
            now: now + std::time::Duration::from_secs(6),
            ..facts(Some(write))
        };
        assert_eq!(decide(&["SET", "k", "v"], &over), Route::Shared);
    }

    #[test]
    fn a_client_s_requests_never_overtake_each_other_across_lanes() {
        assert_eq!(lane(false, None), Lane::Reads);
        assert_eq!(lane(true, None), Lane::Writes);
        // Reads behind the client's own writes in flight stay behind them.
        assert_eq!(lane(false, Some(Lane::Writes)), Lane::Writes);
        assert_eq!(lane(true, Some(Lane::Writes)), Lane::Writes);
        assert_eq!(lane(false, Some(Lane::Reads)), Lane::Reads);
        // A write after reads in flight: on the writes lane, once they are
        // answered (the caller waits).
        assert_eq!(lane(true, Some(Lane::Reads)), Lane::Writes);
    }

    #[test]
    fn pause_arguments_as_redis_reads_them() {
        let now = Instant::now();
        let parse = |words: &[&str]| with_words(words, |args| parse_pause(args, now));
        assert!(parse(&["CLIENT", "PAUSE", "100"]).is_some_and(|p| p.all));
        assert!(parse(&["CLIENT", "PAUSE", "100", "write"]).is_some_and(|p| !p.all));
        assert_eq!(parse(&["CLIENT", "PAUSE", "-1"]), None);
        assert_eq!(parse(&["CLIENT", "PAUSE", "100", "some"]), None);
    }
}
