//! Errors callers branch on. What a client is told depends on where a
//! failure came from, so the source is part of the type.

use std::fmt;

/// Why a request sent upstream got no reply from Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamError {
    /// No connection to Redis could be made; nothing was sent.
    Unavailable(String),
    /// The connection broke after the request was written: Redis may or may
    /// not have executed it.
    ConnectionLost,
    /// Redis sent bytes that are not RESP; the connection was dropped.
    BadReply,
}

impl UpstreamError {
    /// The error reply a client gets in place of the missing reply.
    pub fn to_reply(&self) -> Vec<u8> {
        format!("-ERR {self}\r\n").into_bytes()
    }
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamError::Unavailable(why) => write!(f, "upstream unavailable: {why}"),
            UpstreamError::ConnectionLost => f.write_str("upstream connection lost"),
            UpstreamError::BadReply => f.write_str("upstream sent an invalid reply"),
        }
    }
}

impl std::error::Error for UpstreamError {}

/// Why the proxy could not start.
#[derive(Debug)]
pub enum StartError {
    Config(String),
    Bind(String, std::io::Error),
    /// redis-server is needed for the embedded default and is not installed.
    RedisServerMissing(String),
    Embedded(String),
    /// No seed node told the proxy which node serves which slot.
    Cluster(String),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Config(e) => write!(f, "configuration: {e}"),
            StartError::Bind(addr, e) => write!(f, "cannot listen on {addr}: {e}"),
            StartError::RedisServerMissing(bin) => write!(
                f,
                "no upstream is configured and `{bin}` was not found, so the private \
                 Redis cannot start. Install it (Debian/Ubuntu: `sudo apt-get install \
                 redis-server`) or point ackproxy at a running Redis with \
                 --upstream HOST:PORT"
            ),
            StartError::Embedded(e) => write!(f, "private redis-server: {e}"),
            StartError::Cluster(e) => write!(f, "Redis Cluster upstream: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// A failure of the proxy's own traffic with Redis (the command table,
/// keyspace notifications, the login probe): no client waits on it, so
/// what matters is which request failed and whether trying again helps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlError {
    /// The request, or `connect`.
    pub during: &'static str,
    pub cause: ControlCause,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlCause {
    /// No connection, or it broke or went silent.
    Unreachable(String),
    /// Redis refused the proxy's own credentials; new ones may come with
    /// SIGHUP or a `CONFIG SET requirepass` made through the proxy.
    Login,
    /// Redis answered with an error. `transient` ones (BUSY, LOADING, …)
    /// go away by themselves; others (a renamed CONFIG, NOPERM) stay.
    Refused {
        code: String,
        detail: String,
        transient: bool,
    },
    /// A reply of a shape this request never gets from Redis, or an
    /// upstream address the proxy cannot connect to at all.
    Unexpected(String),
}

/// Error codes Redis gives while it is busy, loading or failing over.
const TRANSIENT_CODES: &[&str] = &["BUSY", "LOADING", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN"];

impl ControlError {
    pub fn new(during: &'static str, cause: ControlCause) -> ControlError {
        ControlError { during, cause }
    }

    /// What the `redis` crate reported for `during`.
    pub fn redis(during: &'static str, e: &redis::RedisError) -> ControlError {
        use redis::ErrorKind;
        let cause = match e.kind() {
            ErrorKind::AuthenticationFailed => ControlCause::Login,
            ErrorKind::Io => ControlCause::Unreachable(e.to_string()),
            ErrorKind::Server(_) | ErrorKind::Extension => {
                let code = e.code().unwrap_or("ERR").to_string();
                ControlCause::Refused {
                    transient: TRANSIENT_CODES.contains(&code.as_str()),
                    detail: e.detail().unwrap_or_default().to_string(),
                    code,
                }
            }
            _ => ControlCause::Unexpected(e.to_string()),
        };
        ControlError { during, cause }
    }

    /// Whether the same request may succeed if tried again later.
    pub fn retryable(&self) -> bool {
        match &self.cause {
            ControlCause::Unreachable(_) | ControlCause::Login => true,
            ControlCause::Refused { transient, .. } => *transient,
            ControlCause::Unexpected(_) => false,
        }
    }

    /// Redis answered `-NOAUTH`: the connection must log in first.
    pub fn needs_login(&self) -> bool {
        matches!(&self.cause, ControlCause::Refused { code, .. } if code == "NOAUTH")
    }
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.during)?;
        match &self.cause {
            ControlCause::Unreachable(why) => write!(f, "upstream unreachable: {why}"),
            ControlCause::Login => f.write_str("upstream refused the proxy's credentials"),
            ControlCause::Refused { code, detail, .. } => write!(f, "refused: {code} {detail}"),
            ControlCause::Unexpected(why) => write!(f, "unexpected: {why}"),
        }
    }
}

impl std::error::Error for ControlError {}
