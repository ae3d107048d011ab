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
        }
    }
}

impl std::error::Error for StartError {}
