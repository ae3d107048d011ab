//! The session's side of the client table (`crate::clients`): `CLIENT
//! ID|INFO|LIST|KILL|NO-EVICT|UNBLOCK` answered from it, `CLIENT TRACKING …
//! REDIRECT` naming a proxy client to Redis, and what the table shows of
//! this session.

use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};

use super::{Session, Step, Stop};
use crate::auth::{State as Auth, Verdict};
use crate::clients::format::verbatim;
use crate::clients::{client_type, Ask, Entry, Snapshot, Type};
use crate::command::{parse_i64, Args};
use crate::output::{ReplyTransform, Transformed};

/// Whether the request is one the table answers (with Redis's arity: a
/// request of the wrong length is left to Redis, which refuses it).
pub fn answers(args: Args<'_>) -> bool {
    if !args.is(0, "CLIENT") {
        return false;
    }
    let n = args.len();
    (n == 2 && (args.is(1, "ID") || args.is(1, "INFO")))
        || (n >= 2 && args.is(1, "LIST"))
        || (n >= 3 && args.is(1, "KILL"))
        || (n == 3 && args.is(1, "NO-EVICT"))
        || ((n == 3 || n == 4) && args.is(1, "UNBLOCK"))
}

/// Where `CLIENT TRACKING … REDIRECT id` names its id, and the id: a
/// proxy client's, which Redis does not know.
pub fn names_redirect(args: Args<'_>) -> Option<(usize, i64)> {
    if !(args.is(0, "CLIENT") && args.is(1, "TRACKING")) {
        return None;
    }
    let at = (3..args.len().saturating_sub(1)).find(|&i| args.is(i, "REDIRECT"))?;
    Some((at, parse_i64(args.get(at + 1)?)?))
}

fn error(text: &str) -> Bytes {
    Bytes::from(format!("-{text}\r\n"))
}

const SYNTAX: &str = "ERR syntax error";

/// A `CLIENT KILL` filter, as Redis parses it.
#[derive(Default)]
struct Filter {
    addr: Option<Vec<u8>>,
    laddr: Option<Vec<u8>>,
    id: Option<u64>,
    kind: Option<Type>,
    user: Option<Vec<u8>>,
    skipme: bool,
}

impl Filter {
    fn matches(&self, e: &Entry) -> bool {
        if self.addr.as_deref().is_some_and(|a| a != e.addr.as_bytes())
            || self
                .laddr
                .as_deref()
                .is_some_and(|a| a != e.laddr.as_bytes())
            || self.id.is_some_and(|id| id != e.id)
            || self.kind.is_some_and(|t| !e.is(t))
        {
            return false;
        }
        match &self.user {
            Some(u) => e.state.lock().unwrap().user[..] == u[..],
            None => true,
        }
    }
}

impl Session {
    /// What the table shows of this session.
    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            name: self.meta.name.clone(),
            lib_name: self.meta.lib_name.clone(),
            lib_ver: self.meta.lib_ver.clone(),
            db: self.db(),
            resp: self.protocol(),
            user: match &self.auth {
                Auth::User(u) => u.clone(),
                _ => Bytes::from_static(b"default"),
            },
            upstream: self.dedicated.as_ref().map(|d| d.watch()),
        }
    }

    /// Answers a `CLIENT` request of the table's (see [`answers`]).
    pub(super) async fn client_table(&mut self, args: Args<'_>, frame: &Bytes) -> Step {
        if !self.table_permitted(args).await {
            return Step::Served;
        }
        if self.pinned {
            self.settle().await;
        }
        self.client.update(self.snapshot());
        let registry = self.ctx.clients.clone();
        let lib = super::meta::redis_has_setinfo();
        let protocol = self.protocol();
        let me = self.conn;
        let argv: usize = args.iter().map(<[u8]>::len).sum();
        let line = |e: &Entry| {
            let current = (e.id == me).then_some(&frame[..]);
            e.line(current, argv, lib)
        };
        let reply = if args.is(1, "ID") {
            Bytes::from(format!(":{me}\r\n"))
        } else if args.is(1, "INFO") {
            verbatim(&(line(&self.client.entry) + "\n"), protocol)
        } else if args.is(1, "LIST") {
            let entries = if args.len() == 4 && args.is(2, "TYPE") {
                let Some(t) = client_type(args.get(3).unwrap_or_default()) else {
                    let t = String::from_utf8_lossy(args.get(3).unwrap_or_default());
                    return self
                        .table_reply(error(&format!("ERR Unknown client type '{t}'")))
                        .await;
                };
                registry.all().into_iter().filter(|e| e.is(t)).collect()
            } else if args.len() > 3 && args.is(2, "ID") {
                let mut found = Vec::new();
                for id in args.iter().skip(3) {
                    let Some(id) = parse_i64(id) else {
                        return self.table_reply(error("ERR Invalid client ID")).await;
                    };
                    found.extend(u64::try_from(id).ok().and_then(|id| registry.get(id)));
                }
                found
            } else if args.len() != 2 {
                return self.table_reply(error(SYNTAX)).await;
            } else {
                registry.all()
            };
            let text: String = entries.iter().map(|e| line(e) + "\n").collect();
            verbatim(&text, protocol)
        } else if args.is(1, "NO-EVICT") {
            let on = if args.is(2, "ON") {
                true
            } else if args.is(2, "OFF") {
                false
            } else {
                return self.table_reply(error(SYNTAX)).await;
            };
            self.client.entry.state.lock().unwrap().no_evict = on;
            Bytes::from_static(b"+OK\r\n")
        } else if args.is(1, "UNBLOCK") {
            return self.unblock(args).await;
        } else {
            return self.kill(args).await;
        };
        self.table_reply(reply).await
    }

    async fn table_reply(&mut self, reply: Bytes) -> Step {
        self.answer(reply).await;
        Step::Served
    }

    /// `CLIENT KILL`, in its old form (an address) or with filters.
    async fn kill(&mut self, args: Args<'_>) -> Step {
        let old_form = args.len() == 3;
        let mut filter = Filter::default();
        if old_form {
            filter.addr = args.get(2).map(<[u8]>::to_vec);
        } else {
            filter.skipme = true;
            let mut i = 2;
            while i < args.len() {
                let Some(value) = args.get(i + 1) else {
                    return self.table_reply(error(SYNTAX)).await;
                };
                if args.is(i, "ID") {
                    match parse_i64(value).filter(|&id| id >= 1) {
                        Some(id) => filter.id = Some(id as u64),
                        None => {
                            let e = error("ERR client-id should be greater than 0");
                            return self.table_reply(e).await;
                        }
                    }
                } else if args.is(i, "TYPE") {
                    match client_type(value) {
                        Some(t) => filter.kind = Some(t),
                        None => {
                            let t = String::from_utf8_lossy(value);
                            let e = error(&format!("ERR Unknown client type '{t}'"));
                            return self.table_reply(e).await;
                        }
                    }
                } else if args.is(i, "ADDR") {
                    filter.addr = Some(value.to_vec());
                } else if args.is(i, "LADDR") {
                    filter.laddr = Some(value.to_vec());
                } else if args.is(i, "USER") {
                    if !self.user_exists(value).await {
                        let u = String::from_utf8_lossy(value);
                        return self
                            .table_reply(error(&format!("ERR No such user '{u}'")))
                            .await;
                    }
                    filter.user = Some(value.to_vec());
                } else if args.is(i, "SKIPME") {
                    if value.eq_ignore_ascii_case(b"YES") {
                        filter.skipme = true;
                    } else if value.eq_ignore_ascii_case(b"NO") {
                        filter.skipme = false;
                    } else {
                        return self.table_reply(error(SYNTAX)).await;
                    }
                } else {
                    return self.table_reply(error(SYNTAX)).await;
                }
                i += 2;
            }
        }
        let registry = self.ctx.clients.clone();
        let mut killed = 0;
        let mut close_me = false;
        for e in registry.all() {
            if !filter.matches(&e) {
                continue;
            }
            if e.id == self.conn {
                if filter.skipme {
                    continue;
                }
                close_me = true;
            } else {
                registry.kill(&e);
            }
            killed += 1;
        }
        let reply = match (old_form, killed) {
            (true, 0) => error("ERR No such client"),
            (true, _) => Bytes::from_static(b"+OK\r\n"),
            (false, n) => Bytes::from(format!(":{n}\r\n")),
        };
        self.answer(reply).await;
        // As Redis: the reply is written, then the connection closes.
        if close_me {
            Step::Stop(Stop::Finish)
        } else {
            Step::Served
        }
    }

    /// `CLIENT UNBLOCK id [TIMEOUT|ERROR]`: a client blocked in Redis, on
    /// its dedicated connection, is unblocked there.
    async fn unblock(&mut self, args: Args<'_>) -> Step {
        if args.len() == 4 && !(args.is(3, "TIMEOUT") || args.is(3, "ERROR")) {
            let e = error("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR");
            return self.table_reply(e).await;
        }
        let Some(id) = args.get(2).and_then(parse_i64) else {
            return self
                .table_reply(error("ERR value is not an integer or out of range"))
                .await;
        };
        let registry = self.ctx.clients.clone();
        let target = u64::try_from(id).ok().and_then(|id| registry.get(id));
        let Some(target) = target.filter(|e| e.blocked()) else {
            return self.table_reply(Bytes::from_static(b":0\r\n")).await;
        };
        let parked = {
            let mut s = target.state.lock().unwrap();
            if s.parked {
                s.unblock = Some(args.is(3, "ERROR"));
            }
            s.parked
        };
        if parked {
            target.unblock.notify_one();
            return self.table_reply(Bytes::from_static(b":1\r\n")).await;
        }
        let upstream = self.upstream_id(target.id).await;
        let Some(upstream) = upstream else {
            return self.table_reply(Bytes::from_static(b":0\r\n")).await;
        };
        let upstream = upstream.to_string();
        let mut words: Vec<&[u8]> = vec![b"CLIENT", b"UNBLOCK", upstream.as_bytes()];
        words.extend(args.get(3));
        let request = Bytes::from(crate::upstream::encode_command(&words));
        if self.pinned {
            self.settle().await;
        }
        self.send_shared(request, 1, true);
        Step::Served
    }

    /// The id Redis gives the dedicated connection of client `id`: found
    /// by its address in Redis's `CLIENT LIST` (asking Redis only when a
    /// request names a client, never on the request path).
    async fn upstream_id(&mut self, id: u64) -> Option<u64> {
        let addr = self.ctx.clients.upstream(id)?;
        self.redis_id(addr).await
    }

    /// The id Redis gives its client connected from `addr`.
    async fn redis_id(&mut self, addr: SocketAddr) -> Option<u64> {
        let request = Bytes::from_static(b"*2\r\n$6\r\nCLIENT\r\n$4\r\nLIST\r\n");
        let reply = self.shared.call(request, self.out.clone()).await.ok()?;
        let text = String::from_utf8_lossy(&reply);
        let wanted = format!("addr={addr}");
        text.lines()
            .find(|l| l.split(' ').any(|f| f == wanted))?
            .split(' ')
            .find_map(|f| f.strip_prefix("id="))?
            .parse()
            .ok()
    }

    /// `CLIENT TRACKING ... REDIRECT id` (see [`names_redirect`]) with the
    /// proxy's id replaced by Redis's id of that client's dedicated
    /// connection (0, which Redis never gives, for a client that has none).
    pub(super) async fn tracking_redirect(&mut self, args: Args<'_>, at: usize, id: i64) -> Bytes {
        // A client naming itself (redis-py's `client_tracking_on(clientid=…)`
        // with its own id) gets the connection the request goes on anyway,
        // before it is named.
        if u64::try_from(id).is_ok_and(|id| id == self.client.id()) && self.ensure_dedicated().await
        {
            self.client.update(self.snapshot());
        }
        let upstream = match u64::try_from(id) {
            Ok(id) => {
                let mut found = self.upstream_id(id).await;
                if found.is_none() && id != self.client.id() {
                    // Another client without a (live) connection of its own:
                    // its session opens one to be named.
                    if let Some(addr) = self.ctx.clients.ask_upstream(id).await {
                        found = self.redis_id(addr).await;
                    }
                }
                found.map_or(0, |up| {
                    self.redirect_ids = Some((up, id));
                    up
                })
            }
            Err(_) => 0,
        }
        .to_string();
        let mut words: Vec<&[u8]> = args.iter().collect();
        words[at + 1] = upstream.as_bytes();
        Bytes::from(crate::upstream::encode_command(&words))
    }

    /// Answers other sessions' requests for the client's dedicated
    /// connection (see [`Registry::ask_upstream`]), opening it as a request
    /// needing it would, but sending nothing of the client's on it and
    /// leaving its other requests where they go. Its set-up (`HELLO 3`, a
    /// name) is written at once: Redis sends the redirected invalidations
    /// in the protocol the connection speaks.
    pub(super) async fn open_for_redirect(&mut self, asks: Vec<Ask>) {
        let addr = match self.open_dedicated(false).await {
            Ok(()) => {
                let d = self.dedicated.as_mut().expect("dedicated connection");
                d.write_prelude().await;
                let addr = d.watch().local_addr();
                self.client.update(self.snapshot());
                addr
            }
            Err(_) => None,
        };
        for ask in asks {
            // One that stopped waiting gets nothing.
            let _ = ask.send(addr);
        }
    }

    /// `CLIENT GETREDIR` and `CLIENT TRACKINGINFO` after a `CLIENT
    /// TRACKING … REDIRECT id`: Redis answers with its own id of the
    /// connection the proxy named in the client's place, and the client
    /// gets the id it gave back, also once that client is gone (the
    /// `broken_redirect` case). `None` for other requests.
    pub(super) fn redirect_view(&self, args: Args<'_>) -> Option<Box<dyn ReplyTransform>> {
        let (upstream, proxy) = self.redirect_ids?;
        if !(args.is(0, "CLIENT") && (args.is(1, "GETREDIR") || args.is(1, "TRACKINGINFO"))) {
            return None;
        }
        Some(Box::new(RedirectIds { upstream, proxy }))
    }

    /// Whether Redis's ACL lets the client's user run the request; if not,
    /// the client has its refusal.
    async fn table_permitted(&mut self, args: Args<'_>) -> bool {
        let Auth::User(user) = &self.auth else {
            return true;
        };
        let user = user.clone();
        let name = format!(
            "client|{}",
            String::from_utf8_lossy(args.get(1).unwrap_or_default()).to_ascii_lowercase()
        );
        let command: Vec<Bytes> = args.iter().map(Bytes::copy_from_slice).collect();
        let verdict = match self.ctx.permissions.cached(&user, &name, &command) {
            Some(v) => v,
            None => {
                let request = crate::auth::dryrun_request(&user, &command);
                match self.shared.call(request, self.out.clone()).await {
                    Ok(reply) => {
                        let v = crate::auth::verdict(&reply, &name);
                        self.ctx
                            .permissions
                            .remember(&user, &name, &command, v.clone());
                        v
                    }
                    Err(e) => Verdict::Refused(Bytes::from(e.to_reply())),
                }
            }
        };
        match verdict {
            Verdict::Allowed => true,
            Verdict::Refused(reply) => {
                self.answer(reply).await;
                false
            }
        }
    }

    /// Whether Redis has the ACL user `name`.
    async fn user_exists(&mut self, name: &[u8]) -> bool {
        let request = Bytes::from(crate::upstream::encode_command(&[b"ACL", b"GETUSER", name]));
        match self.shared.call(request, self.out.clone()).await {
            // Redis's null, in either form, or an error.
            Ok(reply) => ![&b"$-1"[..], b"*-1", b"_", b"-"]
                .iter()
                .any(|p| reply.starts_with(p)),
            Err(_) => false,
        }
    }
}

/// Redis's id of a redirect target, in a reply, made the proxy's.
struct RedirectIds {
    upstream: u64,
    proxy: u64,
}

impl ReplyTransform for RedirectIds {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        let from = format!(":{}\r\n", self.upstream);
        let to = format!(":{}\r\n", self.proxy);
        // GETREDIR: the id alone.
        if reply[..] == *from.as_bytes() {
            return Transformed::Done(Bytes::from(to));
        }
        // TRACKINGINFO: the `redirect` field, in RESP2 and RESP3 alike, ahead
        // of the prefixes (the only free text of the reply).
        let field = format!("$8\r\nredirect\r\n{from}");
        let Some(at) = reply
            .windows(field.len())
            .position(|w| w == field.as_bytes())
        else {
            return Transformed::Done(reply);
        };
        let value = at + field.len() - from.len();
        let mut out = BytesMut::with_capacity(reply.len() + to.len());
        out.extend_from_slice(&reply[..value]);
        out.extend_from_slice(to.as_bytes());
        out.extend_from_slice(&reply[at + field.len()..]);
        Transformed::Done(out.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::with_words;

    #[test]
    fn table_requests_have_redis_arity() {
        let a = |w: &[&str]| with_words(w, answers);
        assert!(a(&["client", "list"]));
        assert!(a(&["CLIENT", "KILL", "1.2.3.4:5"]));
        assert!(!a(&["CLIENT", "KILL"]));
        assert!(!a(&["CLIENT", "ID", "x"]));
        assert!(!a(&["CLIENT", "NO-EVICT"]));
        assert!(!a(&["CLIENT", "UNBLOCK", "1", "TIMEOUT", "x"]));
    }
}
