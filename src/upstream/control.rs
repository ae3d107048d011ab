//! The proxy's own connections to Redis, for its own purposes: reading the
//! command table, enabling keyspace notifications and subscribing to them,
//! asking whether clients must log in. They go through the `redis` crate;
//! clients' traffic never passes here. How such a connection reaches Redis
//! (address, login, TLS) is decided here alone, on the same streams as
//! clients' traffic ([`Endpoint::connect_stream`]).

use std::future::Future;
use std::time::Duration;

use redis::aio::{MultiplexedConnection, PubSub};
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, RedisConnectionInfo, RedisResult};

use super::{Credentials, Endpoint};
use crate::error::{ControlCause, ControlError};

/// Redis answers these requests at once unless it is stuck; one that stays
/// silent this long is treated as unreachable, and the caller tries again.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How the crate logs in as `credentials`, read by the caller at connect
/// time: SIGHUP and `CONFIG SET requirepass` change them between connects.
fn login(credentials: &Credentials) -> RedisConnectionInfo {
    // Redis 7.0 does not know CLIENT SETINFO: sending it would only cost a
    // round trip and an error on every connect.
    let mut login = RedisConnectionInfo::default().set_skip_set_lib_name();
    if let Some(password) = &credentials.password {
        login = login.set_password(password);
        if let Some(user) = &credentials.user {
            login = login.set_username(user);
        }
    }
    login
}

/// The connection itself (TCP, or TLS when the upstream is configured so)
/// is the proxy's own, as for clients' traffic; the crate speaks RESP on it.
async fn stream(endpoint: &Endpoint) -> Result<crate::net::Stream, ControlError> {
    endpoint
        .connect_stream()
        .await
        .map_err(|e| ControlError::new("connect", ControlCause::Unreachable(e.to_string())))
}

/// A connection for one-off administration (CONFIG, COMMAND), logged in
/// with the proxy's credentials of the moment. Made per use, so that it
/// always logs in with the current ones.
pub async fn admin(endpoint: &Endpoint) -> Result<MultiplexedConnection, ControlError> {
    let credentials = endpoint.credentials.read().unwrap().clone();
    connection(endpoint, &credentials).await
}

/// Like [`admin`], logged in as nobody: what a client that has not
/// authenticated sees.
pub async fn plain(endpoint: &Endpoint) -> Result<MultiplexedConnection, ControlError> {
    connection(endpoint, &Credentials::default()).await
}

async fn connection(
    endpoint: &Endpoint,
    credentials: &Credentials,
) -> Result<MultiplexedConnection, ControlError> {
    // No retries of its own: every caller already tries again on its own
    // schedule (the subscriber's backoff, the next shared reconnect, the
    // probe loop), and a retry here would only hold up start-up.
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
    let stream = stream(endpoint).await?;
    let (conn, driver) = request_within(
        "connect",
        endpoint.connect_timeout,
        MultiplexedConnection::new_with_config(&login(credentials), stream, config),
    )
    .await?;
    // Ends when the last handle to the connection is dropped.
    tokio::spawn(driver);
    Ok(conn)
}

/// A pub/sub connection logged in with the proxy's credentials.
pub async fn subscriber(endpoint: &Endpoint) -> Result<PubSub, ControlError> {
    let credentials = endpoint.credentials.read().unwrap().clone();
    let stream = stream(endpoint).await?;
    request_within(
        "connect",
        endpoint.connect_timeout,
        PubSub::new(&login(&credentials), stream),
    )
    .await
}

/// Sends `cmd` on an administration connection and reads its reply, at
/// most [`RESPONSE_TIMEOUT`]; `during` names it in errors.
pub async fn query<T: FromRedisValue>(
    conn: &mut MultiplexedConnection,
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
