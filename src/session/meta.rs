//! Connection metadata the proxy keeps for each client: the name, library
//! name and version (`CLIENT SETNAME`, `CLIENT SETINFO`) and the protocol
//! version (`HELLO`). They change nothing Redis needs to see on a shared
//! connection, so a client that sets them keeps sharing; a dedicated
//! connection gets them when the client needs one, so that Redis's own
//! `CLIENT LIST` still shows them there and its replies are in the
//! client's protocol.
//!
//! Requests Redis would refuse are sent to Redis (on the connection the
//! client uses now), which gives its own error text and changes nothing.

use bytes::Bytes;

use super::Session;
use crate::command::Args;
use crate::output::{ReplyTransform, Transformed};
use crate::resp::ReplyScanner;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub name: Option<Bytes>,
    pub lib_name: Option<Bytes>,
    pub lib_ver: Option<Bytes>,
    /// RESP version the client speaks.
    pub protocol: u8,
}

impl Default for Meta {
    fn default() -> Self {
        Meta {
            name: None,
            lib_name: None,
            lib_ver: None,
            protocol: 2,
        }
    }
}

impl Meta {
    /// The requests that give a new connection this metadata, and their
    /// number. `CLIENT SETINFO` only where Redis has it.
    pub fn commands(&self, setinfo: bool) -> (Vec<u8>, usize) {
        let mut out = Vec::new();
        let mut n = 0;
        if self.protocol == 3 {
            crate::upstream::push_command(&mut out, &[b"HELLO", b"3"]);
            n += 1;
        }
        if let Some(name) = &self.name {
            crate::upstream::push_command(&mut out, &[b"CLIENT", b"SETNAME", name]);
            n += 1;
        }
        if setinfo {
            for (attr, value) in [
                (&b"LIB-NAME"[..], &self.lib_name),
                (b"LIB-VER", &self.lib_ver),
            ] {
                if let Some(v) = value {
                    crate::upstream::push_command(&mut out, &[b"CLIENT", b"SETINFO", attr, v]);
                    n += 1;
                }
            }
        }
        (out, n)
    }
}

/// Redis's check of client names and `CLIENT SETINFO` values: printable
/// ASCII without spaces (empty clears).
fn valid_attr(value: &[u8]) -> bool {
    value.iter().all(|b| (b'!'..=b'~').contains(b))
}

/// Whether Redis has `CLIENT SETINFO` (7.2 and later), from its command
/// table. Without the table the proxy does not know, and leaves it to Redis.
pub(super) fn redis_has_setinfo() -> bool {
    crate::command::table::with_current(|t| t.is_some_and(|t| t.knows(b"client|setinfo")))
}

/// Whether the proxy keeps what the request sets or asks (see
/// [`Session::client_meta`]).
pub(super) fn keeps(args: Args<'_>) -> bool {
    parse_client(args, redis_has_setinfo()).is_some()
}

/// A `CLIENT` metadata request Redis would accept.
#[derive(Debug, PartialEq, Eq)]
pub enum Change<'a> {
    SetName(&'a [u8]),
    LibName(&'a [u8]),
    LibVer(&'a [u8]),
    GetName,
}

/// `None` for a request Redis refuses (arity, attribute, characters).
pub fn parse_client(args: Args<'_>, setinfo: bool) -> Option<Change<'_>> {
    if args.is(1, "GETNAME") {
        return (args.len() == 2).then_some(Change::GetName);
    }
    if args.is(1, "SETNAME") {
        let name = args.get(2).filter(|_| args.len() == 3)?;
        return valid_attr(name).then_some(Change::SetName(name));
    }
    if args.is(1, "SETINFO") && setinfo && args.len() == 4 {
        let value = args.get(3).filter(|v| valid_attr(v))?;
        if args.is(2, "LIB-NAME") {
            return Some(Change::LibName(value));
        }
        if args.is(2, "LIB-VER") {
            return Some(Change::LibVer(value));
        }
    }
    None
}

/// What a `HELLO` does, as Redis 7 parses it.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello<'a> {
    /// Accepted without logging in: the proxy answers it.
    Accept {
        protocol: Option<u8>,
        name: Option<&'a [u8]>,
    },
    /// It has an AUTH option: a login, on the client's own connection.
    Login,
    /// Refused: Redis gives the error, and nothing changes.
    Refused,
}

pub fn parse_hello(args: Args<'_>) -> Hello<'_> {
    let mut protocol = None;
    let mut j = 1;
    if let Some(v) = args.get(1) {
        match crate::command::parse_i64(v) {
            Some(2) => protocol = Some(2),
            Some(3) => protocol = Some(3),
            _ => return Hello::Refused,
        }
        j = 2;
    }
    let mut name = None;
    let mut login = false;
    while j < args.len() {
        let more = args.len() - 1 - j;
        if args.is(j, "AUTH") && more >= 2 {
            login = true;
            j += 3;
        } else if args.is(j, "SETNAME") && more >= 1 {
            let n = args.get(j + 1).unwrap_or_default();
            if !valid_attr(n) {
                return Hello::Refused;
            }
            name = Some(n);
            j += 2;
        } else {
            return Hello::Refused;
        }
    }
    if login {
        Hello::Login
    } else {
        Hello::Accept { protocol, name }
    }
}

/// Redis's reply to a plain `HELLO` on a shared connection, with the
/// client's id in place of that connection's.
struct HelloId(u64);

impl ReplyTransform for HelloId {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        Transformed::Done(with_id(&reply, self.0).map_or(reply, Bytes::from))
    }
}

/// `reply` (a HELLO reply, map or flat array) with its `id` replaced.
fn with_id(reply: &[u8], id: u64) -> Option<Vec<u8>> {
    let head_end = reply.iter().position(|&b| b == b'\n')? + 1;
    if !matches!(reply.first(), Some(b'*' | b'%')) {
        return None;
    }
    let mut out = reply[..head_end].to_vec();
    let mut at = head_end;
    let mut scanner = ReplyScanner::new();
    let mut next = |at: usize| -> Option<usize> { scanner.scan(&reply[at..]).ok().flatten() };
    while at < reply.len() {
        let key_len = next(at)?;
        let key = &reply[at..at + key_len];
        let value_len = next(at + key_len)?;
        out.extend_from_slice(key);
        if key == b"$2\r\nid\r\n" {
            out.extend_from_slice(format!(":{id}\r\n").as_bytes());
        } else {
            out.extend_from_slice(&reply[at + key_len..at + key_len + value_len]);
        }
        at += key_len + value_len;
    }
    Some(out)
}

fn ok() -> Bytes {
    Bytes::from_static(b"+OK\r\n")
}

impl Session {
    /// A `HELLO` of a client that needs no login and is on shared
    /// connections; `false` leaves it to the usual path (a login).
    pub(super) async fn hello(&mut self, args: Args<'_>, frame: &Bytes) -> bool {
        let (protocol, name) = match parse_hello(args) {
            Hello::Login => return false,
            Hello::Refused => {
                self.enter_writes_lane().await;
                self.send_shared(frame.clone(), 1, true);
                return true;
            }
            Hello::Accept { protocol, name } => (protocol, name),
        };
        let mut meta = self.meta.clone();
        if let Some(name) = name {
            meta.name = (!name.is_empty()).then(|| Bytes::copy_from_slice(name));
        }
        if let Some(p) = protocol {
            meta.protocol = p;
        }
        self.set_meta(meta).await;
        // Redis describes itself (version, role, modules) in the client's
        // protocol on a connection that speaks it.
        let request = Bytes::from_static(b"*1\r\n$5\r\nHELLO\r\n");
        let id = self.conn;
        let shared = self.protocol_shared();
        shared.send(request, 1, &self.out, Some(Box::new(HelloId(id))));
        true
    }

    /// `CLIENT SETNAME|SETINFO|GETNAME` outside MULTI; `false` leaves it to
    /// Redis.
    pub(super) async fn client_meta(&mut self, args: Args<'_>) -> bool {
        let setinfo = redis_has_setinfo();
        let Some(change) = parse_client(args, setinfo) else {
            return false;
        };
        let value = |v: &[u8]| (!v.is_empty()).then(|| Bytes::copy_from_slice(v));
        let mut meta = self.meta.clone();
        match change {
            Change::GetName if self.pinned => return false,
            Change::GetName => {
                let reply = match (&meta.name, meta.protocol) {
                    (Some(n), _) => {
                        let mut r = format!("${}\r\n", n.len()).into_bytes();
                        r.extend_from_slice(n);
                        r.extend_from_slice(b"\r\n");
                        Bytes::from(r)
                    }
                    (None, 3) => Bytes::from_static(b"_\r\n"),
                    (None, _) => Bytes::from_static(b"$-1\r\n"),
                };
                self.answer(reply).await;
                return true;
            }
            Change::SetName(n) => meta.name = value(n),
            Change::LibName(v) => meta.lib_name = value(v),
            Change::LibVer(v) => meta.lib_ver = value(v),
        }
        self.answer(ok()).await;
        if self.pinned {
            // The connection the client is on shows it to Redis's CLIENT
            // LIST at once (an empty value clears it there too).
            if let Some(d) = &mut self.dedicated {
                d.send_dropped(
                    &crate::upstream::encode_command(&args.iter().collect::<Vec<_>>()),
                    1,
                )
                .await;
            }
            self.meta = meta;
        } else {
            self.set_meta(meta).await;
        }
        true
    }

    /// New metadata for a client on shared connections.
    async fn set_meta(&mut self, meta: Meta) {
        if meta == self.meta {
            return;
        }
        if meta.protocol != self.meta.protocol {
            // What the client sent on the connection of its old protocol
            // runs before what it sends on the new one.
            self.out.shared_drained().await;
            if meta.protocol == 3 && self.shared_resp3.is_none() {
                self.shared_resp3 = Some(self.ctx.pick_shared_resp3());
            }
        }
        self.meta = meta;
        // An idle dedicated connection kept for later has the old
        // metadata: the next one is opened with the new.
        self.dedicated = None;
    }

    /// A RESET (or a connection that starts again): Redis forgets the
    /// metadata.
    pub(super) async fn reset_meta(&mut self) {
        if self.meta == Meta::default() {
            return;
        }
        if self.pinned {
            // RESET goes to the dedicated connection, which forgets it too.
            self.meta = Meta::default();
        } else {
            self.set_meta(Meta::default()).await;
        }
    }

    /// Gives a newly opened dedicated connection the client's metadata,
    /// in the same write as the request it was opened for.
    pub(super) fn apply_meta(&mut self) {
        if self.meta == Meta::default() {
            return;
        }
        let (request, count) = self.meta.commands(redis_has_setinfo());
        let protocol = self.meta.protocol;
        if let Some(d) = &mut self.dedicated {
            d.prelude(&request, count);
            d.assume_protocol(protocol);
        }
    }

    /// The shared connection for stateless requests in the client's
    /// protocol (queue operations always use the RESP2 one: their replies
    /// are rewritten for the client's protocol).
    pub(super) fn protocol_shared(&self) -> crate::upstream::shared::SharedUpstream {
        match &self.shared_resp3 {
            Some(s) if self.meta.protocol == 3 => s.clone(),
            _ => self.shared.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::with_words;

    fn hello(words: &[&str]) -> String {
        with_words(words, |a| format!("{:?}", parse_hello(a)))
    }

    #[test]
    fn hello_is_parsed_as_redis_parses_it() {
        assert_eq!(hello(&["HELLO"]), "Accept { protocol: None, name: None }");
        assert_eq!(
            hello(&["HELLO", "3"]),
            "Accept { protocol: Some(3), name: None }"
        );
        assert!(hello(&["hello", "2", "setname", "x"]).contains("Some([120])"));
        for refused in [
            &["HELLO", "4"][..],
            &["HELLO", "03"],
            &["HELLO", "x"],
            &["HELLO", "3", "SETNAME"],
            &["HELLO", "3", "SETNAME", "a b"],
            &["HELLO", "3", "FOO"],
            &["HELLO", "3", "AUTH", "u"],
        ] {
            assert_eq!(hello(refused), "Refused", "{refused:?}");
        }
        assert_eq!(hello(&["HELLO", "3", "AUTH", "u", "p"]), "Login");
        assert_eq!(hello(&["HELLO", "3", "AUTH", "u", "p", "FOO"]), "Refused");
    }

    #[test]
    fn client_requests_redis_would_refuse_are_left_to_it() {
        let client =
            |w: &[&str], setinfo| with_words(w, |a| format!("{:?}", parse_client(a, setinfo)));
        assert_eq!(client(&["CLIENT", "SETNAME", "a\nb"], true), "None");
        assert_eq!(client(&["CLIENT", "SETNAME", "a", "b"], true), "None");
        assert_eq!(client(&["CLIENT", "SETNAME"], true), "None");
        assert_eq!(client(&["CLIENT", "GETNAME", "x"], true), "None");
        assert_eq!(
            client(&["CLIENT", "SETINFO", "LIB-NAME", "x"], false),
            "None"
        );
        assert_eq!(client(&["CLIENT", "SETINFO", "LIB-FOO", "x"], true), "None");
        assert_eq!(
            client(&["CLIENT", "SETINFO", "lib-ver", "1 2"], true),
            "None"
        );
        assert_eq!(
            client(&["client", "setinfo", "lib-ver", "1.2"], true),
            "Some(LibVer([49, 46, 50]))"
        );
        assert_eq!(
            client(&["CLIENT", "SETNAME", ""], true),
            "Some(SetName([]))"
        );
    }

    #[test]
    fn hello_replies_get_the_clients_id() {
        let resp3 = b"%2\r\n$6\r\nserver\r\n$5\r\nredis\r\n$2\r\nid\r\n:17\r\n";
        assert_eq!(
            with_id(resp3, 5).unwrap(),
            b"%2\r\n$6\r\nserver\r\n$5\r\nredis\r\n$2\r\nid\r\n:5\r\n"
        );
        assert_eq!(with_id(b"-ERR x\r\n", 5), None);
    }
}
