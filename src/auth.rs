//! Client authentication with Redis's own semantics. Whether Redis wants
//! clients to log in is asked of Redis (a connection without credentials
//! that gets `-NOAUTH` for PING), a client's AUTH is judged by Redis on the
//! client's own connection, and what a user may do with a queue is asked
//! with `ACL DRYRUN`. A password the proxy itself asks for (`requirepass`,
//! for a Redis that needs none) guards the `default` user the same way,
//! with Redis's replies.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::command::{Args, Kind};
use crate::output::{ReplyTransform, Transformed};
use crate::upstream::users::{constant_time_eq, Salt};
use crate::upstream::{control, encode_command, Credentials, Endpoint};

pub const NOAUTH: &[u8] = b"-NOAUTH Authentication required.\r\n";
/// Redis refuses an EXEC before running it with the reason inside this.
pub const NOAUTH_EXEC: &[u8] =
    b"-EXECABORT Transaction discarded because of: NOAUTH Authentication required.\r\n";
/// Redis's answer to HELLO without AUTH from a client that has not logged in.
pub const NOAUTH_HELLO: &[u8] = b"-NOAUTH HELLO must be called with the client already \
authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the \
client and select the RESP protocol version at the same time\r\n";
const WRONGPASS: &[u8] = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n";
/// A user name Redis refuses to create (no spaces allowed): logging in as
/// it fails with Redis's WRONGPASS at the point where the client's login
/// failed.
const NO_SUCH_USER: &[u8] = b"ackproxy wrong password";

const UNKNOWN: u8 = 0;
const OPEN: u8 = 1;
const REQUIRED: u8 = 2;

/// Whether Redis wants clients to authenticate, as last found out.
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Whether a client connecting now must authenticate. Until Redis has
/// answered, it must: a proxy that cannot tell lets nobody in for free.
pub fn required() -> bool {
    STATE.load(Ordering::Acquire) != OPEN
}

fn set_required(on: bool) {
    STATE.store(if on { REQUIRED } else { OPEN }, Ordering::Release);
}

/// Counts what the proxy saw change Redis's need for a login (a `CONFIG
/// SET requirepass` through it): a probe asked before such a change must
/// not overwrite it with its older answer.
static CHANGES: AtomicU64 = AtomicU64::new(0);

/// Asks Redis, on a connection without credentials, whether PING needs a
/// login. `None` if Redis could not be asked.
pub async fn probe(endpoint: &Endpoint) -> Option<bool> {
    let changes = CHANGES.load(Ordering::Acquire);
    let ask = async {
        let mut plain = control::plain(endpoint).await?;
        control::query::<()>(&mut plain, "PING", &redis::cmd("PING")).await
    };
    let found = match tokio::time::timeout(endpoint.connect_timeout * 2, ask).await {
        Ok(Ok(())) => Some(false),
        Ok(Err(e)) if e.needs_login() => Some(true),
        _ => None,
    };
    if CHANGES.load(Ordering::Acquire) != changes {
        return found;
    }
    if let Some(on) = found {
        let before = STATE.load(Ordering::Acquire);
        set_required(on);
        if before != if on { REQUIRED } else { OPEN } {
            tracing::info!(required = on, "upstream client authentication");
        }
    }
    found
}

/// Probes until Redis answers (at start-up Redis may not be up yet); the
/// task ends when it has.
pub fn spawn_probe(endpoint: Arc<Endpoint>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut wait = Duration::from_millis(50);
        while probe(&endpoint).await.is_none() {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
        }
        crate::telemetry::upstream_up(true);
        crate::upstream::shared::reachable();
    })
}

/// A client's standing with Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// No login needed (Redis needs none and the proxy asks for none, or
    /// the client gave the proxy's password): it uses the proxy's
    /// connections as the proxy's user, and nothing is checked.
    Open,
    /// Must authenticate before anything but AUTH, HELLO, QUIT and RESET.
    Anonymous,
    /// Logged in as this user, as Redis judged.
    User(Bytes),
}

impl State {
    /// `proxy_password`: the proxy asks clients for a password of its own.
    pub fn at_connect(proxy_password: bool) -> State {
        if required() || proxy_password {
            State::Anonymous
        } else {
            State::Open
        }
    }

    /// What RESET (or a connection Redis dropped) leaves: the standing of
    /// a new connection, as Redis logs the client in as `default` only if
    /// that user needs no password.
    pub fn after_reset(proxy_password: bool) -> State {
        State::at_connect(proxy_password)
    }
}

/// The user and password an AUTH or `HELLO ... AUTH` request logs in with,
/// if it is one: `AUTH pass` is `default`; HELLO's last AUTH option counts,
/// as in Redis.
pub fn login_credentials(kind: Kind, args: Args<'_>) -> Option<(Bytes, Bytes)> {
    if kind != Kind::Sticky {
        return None;
    }
    let owned = |i: usize| args.get(i).map(Bytes::copy_from_slice);
    if args.is(0, "AUTH") {
        return match args.len() {
            2 => Some((Bytes::from_static(b"default"), owned(1)?)),
            3 => Some((owned(1)?, owned(2)?)),
            _ => None,
        };
    }
    if !args.is(0, "HELLO") {
        return None;
    }
    let mut login = None;
    let mut j = 2;
    while j < args.len() {
        let more = args.len() - 1 - j;
        if args.is(j, "AUTH") && more >= 2 {
            login = Some((owned(j + 1)?, owned(j + 2)?));
            j += 3;
        } else if args.is(j, "SETNAME") && more >= 1 {
            j += 2;
        } else {
            return None;
        }
    }
    login
}

/// Whether a HELLO leaves state on the connection besides the login: a
/// protocol other than RESP2, or a client name.
pub fn hello_keeps_state(args: Args<'_>) -> bool {
    if !args.is(0, "HELLO") {
        return false;
    }
    let resp2 = args
        .get(1)
        .is_some_and(|v| crate::resp::parse_i64(v) == Some(2));
    !resp2
        || args
            .iter()
            .skip(2)
            .any(|a| a.eq_ignore_ascii_case(b"SETNAME"))
}

/// The proxy's own password for clients (`requirepass`), kept as a salted
/// digest and compared in constant time.
pub struct Password {
    salt: Salt,
    digest: [u8; 20],
}

impl Password {
    pub fn new(password: &[u8]) -> Password {
        let salt = Salt::random();
        let digest = salt.digest(password);
        Password { salt, digest }
    }

    pub fn matches(&self, candidate: &[u8]) -> bool {
        constant_time_eq(&self.salt.digest(candidate), &self.digest)
    }
}

/// How a login request reaches Redis when the proxy's password guards the
/// `default` user. Redis needs no login then, so its `default` user takes
/// any password: the proxy checks it, and sends Redis a login that fails
/// where the client's would, so that Redis gives its own answer.
#[derive(Debug, PartialEq, Eq)]
pub enum ProxyLogin {
    /// Judged by Redis as it is: another user, or not a login at all.
    AsIs,
    /// Sent instead; Redis's answer is the client's.
    Rewritten(Bytes),
    /// A HELLO without AUTH from a client that has not logged in, sent
    /// with a login that fails: Redis answers what comes before the login
    /// check, and its WRONGPASS becomes HELLO's NOAUTH ([`HelloRefused`]).
    WithoutLogin(Bytes),
    /// The proxy's answer.
    Reply(&'static [u8]),
}

pub fn proxy_login(args: Args<'_>, password: &Password, anonymous: bool) -> ProxyLogin {
    let is_default = |i: usize| args.get(i) == Some(b"default".as_slice());
    let wrong = |i: usize| !password.matches(args.get(i).unwrap_or_default());
    let rewritten = |parts: &[&[u8]]| Bytes::from(encode_command(parts));
    if args.is(0, "AUTH") {
        let pass = args.get(args.len() - 1).unwrap_or_default();
        return match args.len() {
            2 if wrong(1) => ProxyLogin::Rewritten(rewritten(&[b"AUTH", NO_SUCH_USER, pass])),
            2 => ProxyLogin::Rewritten(rewritten(&[b"AUTH", b"default", pass])),
            3 if is_default(1) && wrong(2) => {
                ProxyLogin::Rewritten(rewritten(&[b"AUTH", NO_SUCH_USER, pass]))
            }
            _ => ProxyLogin::AsIs,
        };
    }
    if args.len() == 1 {
        return if anonymous {
            ProxyLogin::Reply(NOAUTH_HELLO)
        } else {
            ProxyLogin::AsIs
        };
    }
    // Redis reads HELLO's options in order and logs in at each AUTH.
    let mut parts: Vec<&[u8]> = args.iter().take(2).collect();
    let (mut logins, mut changed, mut complete) = (false, false, true);
    let mut j = 2;
    while j < args.len() {
        let more = args.len() - 1 - j;
        if args.is(j, "AUTH") && more >= 2 {
            logins = true;
            let user = if is_default(j + 1) && wrong(j + 2) {
                changed = true;
                NO_SUCH_USER
            } else {
                args.get(j + 1).unwrap_or_default()
            };
            parts.extend([args.get(j).unwrap_or_default(), user]);
            parts.push(args.get(j + 2).unwrap_or_default());
            j += 3;
        } else if args.is(j, "SETNAME") && more >= 1 {
            parts.extend(args.iter().skip(j).take(2));
            j += 2;
        } else {
            // Redis stops here with a syntax error.
            complete = false;
            parts.extend(args.iter().skip(j));
            break;
        }
    }
    if changed {
        ProxyLogin::Rewritten(rewritten(&parts))
    } else if !logins && anonymous && complete {
        parts.extend([b"AUTH".as_slice(), NO_SUCH_USER, b"-"]);
        ProxyLogin::WithoutLogin(rewritten(&parts))
    } else {
        ProxyLogin::AsIs
    }
}

/// Turns the failed login added to a HELLO into Redis's NOAUTH for HELLO.
pub struct HelloRefused;

impl ReplyTransform for HelloRefused {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        if reply == WRONGPASS {
            Transformed::Done(Bytes::from_static(NOAUTH_HELLO))
        } else {
            Transformed::Done(reply)
        }
    }
}

/// MULTI, then the request, then DISCARD: how a request of a client that
/// has not logged in reaches a Redis that needs no login, so that it can
/// never run. Redis answers what it refuses before its login check
/// (unknown command, wrong arity, a disabled DEBUG) as it would; what it
/// queues is what it would refuse with NOAUTH ([`QueuedRefused`]).
pub const UNEXECUTED_BEFORE: &[u8] = b"*1\r\n$5\r\nMULTI\r\n";
pub const UNEXECUTED_AFTER: &[u8] = b"*1\r\n$7\r\nDISCARD\r\n";

pub struct QueuedRefused;

impl ReplyTransform for QueuedRefused {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        if &reply[..] == b"+QUEUED\r\n" {
            Transformed::Done(Bytes::from_static(NOAUTH))
        } else {
            Transformed::Done(reply)
        }
    }
}

/// Whether the request is AUTH or HELLO, which Redis judges itself.
pub fn is_login(kind: Kind, args: Args<'_>) -> bool {
    kind == Kind::Sticky && (args.is(0, "AUTH") || args.is(0, "HELLO"))
}

/// Whether the proxy can answer an unauthenticated request with NOAUTH
/// itself, exactly as Redis would. Anything else goes to the client's own
/// connection, which has no credentials, for Redis to answer.
pub fn refuse_unauthenticated(kind: Kind, args: Args<'_>, queues: bool) -> bool {
    if queues && matches!(kind, Kind::Ack | Kind::Nack | Kind::Queue) {
        return true;
    }
    let Some(table) = crate::command::table::current() else {
        return false;
    };
    table.refuses_unauthenticated(args.get(0).unwrap_or_default(), args.get(1), args.len())
}

/// The new password of a `CONFIG SET` that sets `requirepass` (Redis
/// refuses one that names a parameter twice).
pub fn sets_requirepass(args: Args<'_>) -> Option<&[u8]> {
    if !(args.is(0, "CONFIG") && args.is(1, "SET"))
        || args.len() < 4
        || !args.len().is_multiple_of(2)
    {
        return None;
    }
    (2..args.len())
        .step_by(2)
        .find(|&i| args.is(i, "requirepass"))
        .and_then(|i| args.get(i + 1))
}

/// Redis accepted `CONFIG SET requirepass password`: when the proxy logs in
/// as `default`, its next connections use the new password, and clients
/// connecting from now on must log in (or need not, for an empty one).
pub fn adopt_requirepass(endpoint: &Endpoint, password: &[u8]) {
    let mut c = endpoint.credentials.write().unwrap();
    if c.user.as_deref().is_none_or(|u| u == "default") {
        c.password = if password.is_empty() {
            None
        } else {
            Some(String::from_utf8_lossy(password).into_owned())
        };
        tracing::info!("CONFIG SET requirepass through the proxy: its own connections follow");
    }
    CHANGES.fetch_add(1, Ordering::AcqRel);
    set_required(!password.is_empty());
}

/// Replaces the proxy's own credentials (SIGHUP re-reads them).
pub fn set_credentials(endpoint: &Endpoint, credentials: Credentials) {
    let mut c = endpoint.credentials.write().unwrap();
    if *c != credentials {
        *c = credentials;
        tracing::info!("upstream credentials reloaded");
    }
}

/// The list commands a queue operation stands for, one per key it reads
/// or moves messages between on the client's behalf, which the client's
/// user must be allowed to run directly, and the operation's name for
/// Redis's NOPERM text. `dead_of` gives a queue's dead-letter list (`None`:
/// not a queue, which the interceptor refuses anyway). `None`: nothing to
/// check (arguments the interceptor refuses anyway, QUEUE HELP).
///
/// What the end of a lease does anyway (a message past its deliveries
/// going to the dead-letter list, a move lease's stale copy leaving its
/// destination) is the proxy's own bookkeeping, as when the reaper does it:
/// a pop or NACK that only brings it forward is not checked for those
/// keys, or a worker would need rights on lists it never reads.
pub fn equivalent(
    kind: Kind,
    args: Args<'_>,
    dead_of: impl FnOnce(&[u8]) -> Option<Bytes>,
) -> Option<(Vec<Vec<Bytes>>, String)> {
    let owned = |a: &[u8]| Bytes::copy_from_slice(a);
    let cmd = |parts: &[&[u8]]| -> Vec<Bytes> { parts.iter().map(|p| owned(p)).collect() };
    let name = |i: usize| String::from_utf8_lossy(args.get(i).unwrap_or_default()).to_lowercase();
    match kind {
        Kind::Pop(_) | Kind::Lrem => Some((vec![args.iter().map(owned).collect()], name(0))),
        Kind::Ack | Kind::Nack => Some((vec![cmd(&[b"LPOP", args.get(1)?])], name(0))),
        Kind::Queue => {
            let q = args.get(2)?;
            let full = format!("{}|{}", name(0), name(1));
            let sub = |s: &str| args.is(1, s);
            let mut checks = if sub("EXTEND") || sub("PURGE") {
                vec![cmd(&[b"LPOP", q])]
            } else if sub("PUSH") || sub("REDRIVE") {
                vec![cmd(&[b"LPUSH", q, b"x"])]
            } else if sub("INFO") || sub("LEASES") || sub("DEAD") {
                vec![cmd(&[b"LRANGE", q, b"0", b"0"])]
            } else {
                return None;
            };
            // The dead-letter list, with what the operation does to it.
            let on_dead: Option<&[&[u8]]> = if sub("INFO") {
                Some(&[b"LLEN"])
            } else if sub("DEAD") {
                Some(&[b"LRANGE", b"0", b"0"])
            } else if sub("REDRIVE") {
                Some(&[b"LPOP"])
            } else if sub("PURGE") {
                // Emptying a list: a write, as DEL or LTRIM.
                Some(&[b"LTRIM", b"1", b"0"])
            } else {
                None
            };
            if let Some((command, rest)) = on_dead.and_then(|p| p.split_first()) {
                if let Some(dead) = dead_of(q) {
                    let mut c = vec![owned(command), dead];
                    c.extend(rest.iter().map(|p| owned(p)));
                    checks.push(c);
                }
            }
            Some((checks, full))
        }
        _ => None,
    }
}

/// How long an `ACL DRYRUN` answer is reused: an ACL change reaches queue
/// operations within this time.
pub const DRYRUN_TTL: Duration = Duration::from_secs(1);
/// Answers kept at most.
const DRYRUN_ENTRIES: usize = 4096;

/// `ACL DRYRUN` answers per (user, operation, command and arguments): the
/// operation's name is in the refusal's text.
#[derive(Default)]
pub struct Permissions {
    answers: Mutex<HashMap<Vec<u8>, (Instant, Verdict)>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// The reply the client gets instead.
    Refused(Bytes),
}

impl Permissions {
    fn key(user: &[u8], name: &str, command: &[Bytes]) -> Vec<u8> {
        let mut k = Vec::with_capacity(64);
        let head = [user, name.as_bytes()];
        for part in head.into_iter().chain(command.iter().map(|b| &b[..])) {
            k.extend_from_slice(&(part.len() as u32).to_le_bytes());
            k.extend_from_slice(part);
        }
        k
    }

    pub fn cached(&self, user: &[u8], name: &str, command: &[Bytes]) -> Option<Verdict> {
        let answers = self.answers.lock().unwrap();
        let (at, v) = answers.get(&Self::key(user, name, command))?;
        (at.elapsed() < DRYRUN_TTL).then(|| v.clone())
    }

    pub fn remember(&self, user: &[u8], name: &str, command: &[Bytes], verdict: Verdict) {
        let mut answers = self.answers.lock().unwrap();
        if answers.len() >= DRYRUN_ENTRIES {
            answers.retain(|_, (at, _)| at.elapsed() < DRYRUN_TTL);
            if answers.len() >= DRYRUN_ENTRIES {
                answers.clear();
            }
        }
        answers.insert(Self::key(user, name, command), (Instant::now(), verdict));
    }
}

/// `ACL DRYRUN user command args...` as a request.
pub fn dryrun_request(user: &[u8], command: &[Bytes]) -> Bytes {
    let mut args: Vec<&[u8]> = vec![b"ACL", b"DRYRUN", user];
    args.extend(command.iter().map(|b| &b[..]));
    Bytes::from(encode_command(&args))
}

/// Turns Redis's answer to `ACL DRYRUN` into what the client gets, with
/// the text Redis itself gives when it refuses the command `name`.
pub fn verdict(reply: &[u8], name: &str) -> Verdict {
    if reply.starts_with(b"+OK") {
        return Verdict::Allowed;
    }
    if reply.starts_with(b"-") {
        // Bad arguments are not a matter of permission: the interceptor
        // answers them as Redis would. Anything else (an unknown user)
        // refuses.
        if reply.windows(24).any(|w| w == b"wrong number of argument") {
            return Verdict::Allowed;
        }
        return Verdict::Refused(Bytes::copy_from_slice(reply));
    }
    let text = String::from_utf8_lossy(reply);
    let refused = if text.contains("' key") {
        "-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"
            .to_string()
    } else if text.contains("' channel") {
        "-NOPERM this user has no permissions to access one of the channels used as arguments\r\n"
            .to_string()
    } else {
        format!("-NOPERM this user has no permissions to run the '{name}' command\r\n")
    };
    Verdict::Refused(Bytes::from(refused))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::classify;

    use crate::command::with_words as with_args;

    fn user(words: &[&str]) -> Option<Bytes> {
        with_args(words, |a| login_credentials(classify(a), a).map(|(u, _)| u))
    }

    #[test]
    fn login_users_as_redis_reads_them() {
        assert_eq!(user(&["AUTH", "p"]), Some(Bytes::from_static(b"default")));
        assert_eq!(user(&["auth", "u", "p"]), Some(Bytes::from_static(b"u")));
        assert_eq!(user(&["AUTH"]), None);
        assert_eq!(user(&["HELLO", "3"]), None);
        assert_eq!(
            user(&["HELLO", "3", "AUTH", "a", "p", "setname", "n", "AUTH", "b", "q"]),
            Some(Bytes::from_static(b"b"))
        );
        assert_eq!(user(&["HELLO", "3", "AUTH", "a"]), None);
        let login = |w: &[&str]| with_args(w, |a| login_credentials(classify(a), a));
        assert_eq!(
            login(&["HELLO", "2", "AUTH", "a", "p", "AUTH", "b", "q"]),
            Some((Bytes::from_static(b"b"), Bytes::from_static(b"q")))
        );
        assert_eq!(
            login(&["AUTH", "p"]),
            Some((Bytes::from_static(b"default"), Bytes::from_static(b"p")))
        );
    }

    #[test]
    fn hello_state_beyond_the_login() {
        let keeps = |w: &[&str]| with_args(w, hello_keeps_state);
        assert!(!keeps(&["HELLO", "2", "AUTH", "u", "p"]));
        assert!(keeps(&["HELLO", "3", "AUTH", "u", "p"]));
        assert!(keeps(&["HELLO", "2", "AUTH", "u", "p", "setname", "n"]));
        assert!(!keeps(&["AUTH", "u", "p"]));
    }

    #[test]
    fn the_proxys_password() {
        let p = Password::new(b"secret");
        assert!(p.matches(b"secret"));
        assert!(!p.matches(b"secreT"));
        assert!(!p.matches(b""));
    }

    /// The request of the space-separated `words`, `?` standing for
    /// [`NO_SUCH_USER`].
    fn frame(words: &str) -> Bytes {
        let words: Vec<&[u8]> = words
            .split(' ')
            .map(|w| if w == "?" { NO_SUCH_USER } else { w.as_bytes() })
            .collect();
        Bytes::from(encode_command(&words))
    }

    #[test]
    fn proxy_logins_fail_where_the_clients_would() {
        let p = Password::new(b"secret");
        let judge = |w: &[&str], anonymous: bool| with_args(w, |a| proxy_login(a, &p, anonymous));
        assert_eq!(
            judge(&["AUTH", "secret"], true),
            ProxyLogin::Rewritten(frame("AUTH default secret"))
        );
        assert_eq!(
            judge(&["AUTH", "nope"], true),
            ProxyLogin::Rewritten(frame("AUTH ? nope"))
        );
        assert_eq!(
            judge(&["AUTH", "default", "secret"], true),
            ProxyLogin::AsIs
        );
        assert_eq!(judge(&["AUTH", "u", "nope"], true), ProxyLogin::AsIs);
        assert_eq!(judge(&["AUTH", "a", "b", "c"], true), ProxyLogin::AsIs);
        assert_eq!(judge(&["HELLO"], true), ProxyLogin::Reply(NOAUTH_HELLO));
        assert_eq!(judge(&["HELLO"], false), ProxyLogin::AsIs);
        assert_eq!(
            judge(
                &["HELLO", "3", "SETNAME", "n", "AUTH", "default", "x", "BAD"],
                true
            ),
            ProxyLogin::Rewritten(frame("HELLO 3 SETNAME n AUTH ? x BAD"))
        );
        assert_eq!(
            judge(&["HELLO", "3", "AUTH", "default", "secret"], true),
            ProxyLogin::AsIs
        );
        assert_eq!(
            judge(&["HELLO", "3", "SETNAME", "n"], true),
            ProxyLogin::WithoutLogin(frame("HELLO 3 SETNAME n AUTH ? -"))
        );
        assert_eq!(
            judge(&["HELLO", "3", "SETNAME", "n"], false),
            ProxyLogin::AsIs
        );
        // Redis's syntax error comes first.
        assert_eq!(judge(&["HELLO", "3", "SETNAME"], true), ProxyLogin::AsIs);
    }

    #[test]
    fn requirepass_in_config_set() {
        let set = |w: &[&str]| with_args(w, |a| sets_requirepass(a).map(<[u8]>::to_vec));
        assert_eq!(
            set(&["config", "set", "REQUIREPASS", "x"]),
            Some(b"x".to_vec())
        );
        assert_eq!(
            set(&["CONFIG", "SET", "maxmemory", "1", "requirepass", ""]),
            Some(vec![])
        );
        assert_eq!(set(&["CONFIG", "SET", "maxmemory", "1"]), None);
        assert_eq!(set(&["CONFIG", "GET", "requirepass"]), None);
    }

    #[test]
    fn dryrun_answers_become_redis_refusals() {
        assert_eq!(verdict(b"+OK\r\n", "rpop"), Verdict::Allowed);
        let key = b"$52\r\nThis user has no permissions to access the 'jobs' key\r\n";
        assert_eq!(
            verdict(key, "rpop"),
            Verdict::Refused(Bytes::from_static(
                b"-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"
            ))
        );
        let cmd = b"$55\r\nThis user has no permissions to run the 'lpop' command\r\n";
        assert_eq!(
            verdict(cmd, "ack"),
            Verdict::Refused(Bytes::from_static(
                b"-NOPERM this user has no permissions to run the 'ack' command\r\n"
            ))
        );
    }

    /// Each check as words, for comparing.
    fn checks(words: &[&str], dead: Option<&str>) -> Vec<String> {
        let found = with_args(words, |a| {
            equivalent(classify(a), a, |_| {
                dead.map(|d| Bytes::copy_from_slice(d.as_bytes()))
            })
        });
        let Some((commands, _)) = found else {
            return vec![];
        };
        commands
            .iter()
            .map(|c| {
                let words: Vec<String> = c
                    .iter()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .collect();
                words.join(" ")
            })
            .collect()
    }

    #[test]
    fn queue_operations_are_checked_on_every_list_they_read_or_move() {
        let d = Some("dl");
        assert_eq!(
            checks(&["QUEUE", "DEAD", "q"], d),
            ["LRANGE q 0 0", "LRANGE dl 0 0"]
        );
        assert_eq!(
            checks(&["queue", "redrive", "q", "COUNT", "5"], d),
            ["LPUSH q x", "LPOP dl"]
        );
        assert_eq!(
            checks(&["QUEUE", "PURGE", "q", "DEAD"], d),
            ["LPOP q", "LTRIM dl 1 0"]
        );
        assert_eq!(
            checks(&["QUEUE", "INFO", "q"], d),
            ["LRANGE q 0 0", "LLEN dl"]
        );
        assert_eq!(checks(&["QUEUE", "LEASES", "q"], d), ["LRANGE q 0 0"]);
        assert_eq!(checks(&["QUEUE", "PUSH", "q", "m"], d), ["LPUSH q x"]);
        assert_eq!(checks(&["QUEUE", "EXTEND", "q", "1", "5"], d), ["LPOP q"]);
        assert_eq!(checks(&["ACK", "q", "1"], d), ["LPOP q"]);
        assert_eq!(checks(&["NACK", "q", "1"], d), ["LPOP q"]);
        assert_eq!(checks(&["RPOPLPUSH", "q", "w"], d), ["RPOPLPUSH q w"]);
        // Not a queue: the interceptor refuses it after the queue's check.
        assert_eq!(checks(&["QUEUE", "DEAD", "q"], None), ["LRANGE q 0 0"]);
        assert!(checks(&["QUEUE", "HELP"], d).is_empty());
    }

    #[test]
    fn cache_is_bounded_and_expires() {
        let p = Permissions::default();
        let cmd = vec![Bytes::from_static(b"LPOP"), Bytes::from_static(b"q")];
        p.remember(b"u", "ack", &cmd, Verdict::Allowed);
        assert_eq!(p.cached(b"u", "ack", &cmd), Some(Verdict::Allowed));
        assert_eq!(p.cached(b"u", "nack", &cmd), None);
        assert_eq!(p.cached(b"v", "ack", &cmd), None);
        for i in 0..DRYRUN_ENTRIES * 2 {
            p.remember(i.to_string().as_bytes(), "ack", &cmd, Verdict::Allowed);
        }
        assert!(p.answers.lock().unwrap().len() <= DRYRUN_ENTRIES);
    }
}
