//! The proxy's own connections to Redis, for its own purposes: reading the
//! command table, enabling keyspace notifications and subscribing to them,
//! asking whether clients must log in. They go through the `redis` crate;
//! clients' traffic never passes here. How such a connection reaches Redis
//! (address, login, and one day TLS) is decided in [`client`] alone.

use std::future::Future;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSub};
use redis::io::tcp::TcpSettings;
use redis::{
    Client, Cmd, ConnectionAddr, FromRedisValue, IntoConnectionInfo, RedisConnectionInfo,
    RedisResult,
};

use super::{Credentials, Endpoint};
use crate::error::{ControlCause, ControlError};

/// Redis answers these requests at once unless it is stuck; one that stays
/// silent this long is treated as unreachable, and the caller tries again.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A client for Redis as `credentials`, read by the caller at connect
/// time: SIGHUP and `CONFIG SET requirepass` change them between connects.
fn client(endpoint: &Endpoint, credentials: &Credentials) -> Result<Client, ControlError> {
    let (host, port) = split_addr(&endpoint.addr).ok_or_else(|| {
        ControlError::new(
            "connect",
            ControlCause::Unexpected(format!(
                "upstream address {:?} is not host:port",
                endpoint.addr
            )),
        )
    })?;
    // Redis 7.0 does not know CLIENT SETINFO: sending it would only cost a
    // round trip and an error on every connect.
    let mut login = RedisConnectionInfo::default().set_skip_set_lib_name();
    if let Some(password) = &credentials.password {
        login = login.set_password(password);
        if let Some(user) = &credentials.user {
            login = login.set_username(user);
        }
    }
    let info = ConnectionAddr::Tcp(host, port)
        .into_connection_info()
        .map_err(|e| ControlError::redis("connect", &e))?
        .set_redis_settings(login)
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    Client::open(info).map_err(|e| ControlError::redis("connect", &e))
}

/// `host:port`, `[v6]:port` → host and port.
fn split_addr(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host.to_string(), port.parse().ok()?))
}

/// A connection for one-off administration (CONFIG, COMMAND), logged in
/// with the proxy's credentials of the moment. Made per use, so that it
/// always logs in with the current ones.
pub async fn admin(endpoint: &Endpoint) -> Result<ConnectionManager, ControlError> {
    let credentials = endpoint.credentials.read().unwrap().clone();
    manager(endpoint, &credentials).await
}

/// Like [`admin`], logged in as nobody: what a client that has not
/// authenticated sees.
pub async fn plain(endpoint: &Endpoint) -> Result<ConnectionManager, ControlError> {
    manager(endpoint, &Credentials::default()).await
}

async fn manager(
    endpoint: &Endpoint,
    credentials: &Credentials,
) -> Result<ConnectionManager, ControlError> {
    // No retries of its own: every caller already tries again on its own
    // schedule (the subscriber's backoff, the next shared reconnect, the
    // probe loop), and a retry here would only hold up start-up.
    let config = ConnectionManagerConfig::new()
        .set_number_of_retries(0)
        .set_connection_timeout(Some(endpoint.connect_timeout))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    let client = client(endpoint, credentials)?;
    ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| ControlError::redis("connect", &e))
}

/// A pub/sub connection logged in with the proxy's credentials.
pub async fn subscriber(endpoint: &Endpoint) -> Result<PubSub, ControlError> {
    let credentials = endpoint.credentials.read().unwrap().clone();
    let client = client(endpoint, &credentials)?;
    request_within(
        "connect",
        endpoint.connect_timeout,
        client.get_async_pubsub(),
    )
    .await
}

/// Sends `cmd` on an administration connection and reads its reply, at
/// most [`RESPONSE_TIMEOUT`]; `during` names it in errors.
pub async fn query<T: FromRedisValue>(
    conn: &mut ConnectionManager,
    during: &'static str,
    cmd: &Cmd,
) -> Result<T, ControlError> {
    request(during, cmd.query_async(conn)).await
}

/// Awaits one request on a control connection, at most
/// [`RESPONSE_TIMEOUT`], and says which request failed.
pub async fn request<T>(
    during: &'static str,
    reply: impl Future<Output = RedisResult<T>>,
) -> Result<T, ControlError> {
    request_within(during, RESPONSE_TIMEOUT, reply).await
}

async fn request_within<T>(
    during: &'static str,
    limit: Duration,
    reply: impl Future<Output = RedisResult<T>>,
) -> Result<T, ControlError> {
    match tokio::time::timeout(limit, reply).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(ControlError::redis(during, &e)),
        Err(_) => Err(ControlError::new(
            during,
            ControlCause::Unreachable(format!("no reply in {limit:?}")),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_addresses() {
        assert_eq!(
            split_addr("127.0.0.1:6379"),
            Some(("127.0.0.1".into(), 6379))
        );
        assert_eq!(
            split_addr("redis.local:7000"),
            Some(("redis.local".into(), 7000))
        );
        assert_eq!(split_addr("[::1]:6379"), Some(("::1".into(), 6379)));
        assert_eq!(split_addr("127.0.0.1"), None);
        assert_eq!(split_addr("host:port"), None);
    }
}
