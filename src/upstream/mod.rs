//! Connections to the upstream Redis: shared multiplexed ones for stateless
//! commands, dedicated ones for clients in a stateful mode, and the proxy's
//! own control connections.

pub mod control;
pub mod dedicated;
pub mod ready;
pub mod sentinel;
pub mod shared;
pub mod topology;
pub mod users;

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::error::UpstreamError;
use crate::net::tls::UpstreamTls;
use crate::net::Stream;

/// Where Redis is and how the proxy's own connections log in.
#[derive(Debug)]
pub struct Endpoint {
    /// Where the primary is now: every connection dials it when it opens.
    pub addr: topology::Address,
    /// Read at each connect: CONFIG SET requirepass through the proxy and
    /// SIGHUP replace them (see `crate::auth`).
    pub credentials: std::sync::RwLock<Credentials>,
    /// Bounds the TCP connect and, separately, the TLS handshake.
    pub connect_timeout: Duration,
    /// Every connection to Redis speaks TLS with these settings.
    pub tls: Option<UpstreamTls>,
    /// Told each time a shared connection is opened: Redis may have
    /// restarted (as another version, with other commands).
    pub connected: Arc<Notify>,
    /// Shared connections opened so far (the same events as `connected`),
    /// for what the proxy knows of Redis only until one opens again.
    pub opened: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub user: Option<String>,
    pub password: Option<String>,
}

impl Endpoint {
    /// Shared connections opened so far.
    pub fn opened(&self) -> u64 {
        self.opened.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A shared connection opened: Redis may be another one now.
    pub fn note_opened(&self) {
        self.opened
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.connected.notify_one();
    }

    /// Opens and authenticates a connection.
    pub async fn connect(&self) -> Result<Stream, UpstreamError> {
        let credentials = self.credentials.read().unwrap().clone();
        self.connect_as(&credentials).await
    }

    /// Opens a connection that logs in as nobody: a client's own, which
    /// it authenticates itself if Redis wants it to.
    pub async fn connect_plain(&self) -> Result<Stream, UpstreamError> {
        self.connect_as(&Credentials::default()).await
    }

    fn unavailable(&self, why: impl std::fmt::Display) -> UpstreamError {
        UpstreamError::Unavailable(format!("{}: {why}", self.addr))
    }

    /// Opens a connection, TLS when configured, that has not logged in, to
    /// the primary of the moment.
    pub async fn connect_stream(&self) -> Result<Stream, UpstreamError> {
        let Some(addr) = self.addr.current() else {
            return Err(self.unavailable("no sentinel has named it yet"));
        };
        let unavailable = |why: String| UpstreamError::Unavailable(format!("{addr}: {why}"));
        let tcp = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&addr))
            .await
            .map_err(|_| unavailable("connect timed out".into()))?
            .map_err(|e| unavailable(e.to_string()))?;
        tcp.set_nodelay(true)
            .map_err(|e| unavailable(e.to_string()))?;
        let Some(tls) = &self.tls else {
            return Ok(Stream::Plain(tcp));
        };
        // Boxed: a handshake in progress holds a whole rustls connection,
        // and this future is part of every session's state (it may open a
        // dedicated connection), TLS or not.
        tokio::time::timeout(self.connect_timeout, Box::pin(tls.connect(tcp, &addr)))
            .await
            .map_err(|_| unavailable("TLS handshake timed out".into()))?
            .map_err(|e| unavailable(format!("TLS handshake: {e}")))
    }

    /// Opens a connection that logs in with `credentials` (none: as nobody).
    pub async fn connect_as(&self, credentials: &Credentials) -> Result<Stream, UpstreamError> {
        let unavailable = |e: String| self.unavailable(e);
        let stream = self.connect_stream().await?;
        if let Some(password) = &credentials.password {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = &credentials.user {
                args.push(user.as_bytes());
            }
            args.push(password.as_bytes());
            let mut stream = BufReader::new(stream);
            stream
                .get_mut()
                .write_all(&encode_command(&args))
                .await
                .map_err(|e| unavailable(e.to_string()))?;
            stream
                .get_mut()
                .flush()
                .await
                .map_err(|e| unavailable(e.to_string()))?;
            let mut line = String::new();
            tokio::time::timeout(self.connect_timeout, stream.read_line(&mut line))
                .await
                .map_err(|_| unavailable("AUTH timed out".into()))?
                .map_err(|e| unavailable(e.to_string()))?;
            if !line.starts_with("+OK") {
                return Err(unavailable(format!("AUTH failed: {}", line.trim_end())));
            }
            return Ok(stream.into_inner());
        }
        Ok(stream)
    }
}

/// A command as a RESP multibulk frame.
pub fn encode_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    push_command(&mut out, args);
    out
}

pub fn push_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    // A queue script call has some 30 arguments: one reservation, and
    // lengths written without `fmt` (which cost 15% of a pop+ACK pair).
    out.reserve(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    let mut digits = itoa::Buffer::new();
    out.push(b'*');
    out.extend_from_slice(digits.format(args.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        out.extend_from_slice(digits.format(a.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings_with_exact_lengths() {
        let long = vec![b'x'; 1_234_567];
        let out = encode_command(&[b"SET", b"", &long]);
        let mut want = b"*3\r\n$3\r\nSET\r\n$0\r\n\r\n$1234567\r\n".to_vec();
        want.extend_from_slice(&long);
        want.extend_from_slice(b"\r\n");
        assert_eq!(out, want);
        let mut more = b"PING\r\n".to_vec();
        push_command(&mut more, &[b"GET", b"k"]);
        assert_eq!(more, b"PING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }
}
