//! The primary of a Sentinel-monitored Redis: asked of the sentinels,
//! checked with the primary itself (`ROLE`), and followed across failovers.
//!
//! Every sentinel is asked at once (`SENTINEL MASTER <name>`); the answer
//! of the newest configuration (the highest `config-epoch`) wins, so a
//! sentinel that has not heard of a failover yet cannot send the proxy back
//! to the previous primary, even one restarted as an empty master before
//! the sentinels turn it into a replica. A `+switch-master` on any sentinel
//! has them asked at once; they are also asked every [`REFRESH`], which
//! covers a message lost while a subscription was down.
//!
//! A move goes through [`Address::set`](super::topology::Address::set):
//! connections to the previous primary close, and open again on the new one.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::sync::{watch, Notify};

use super::topology::Address;
use super::{control, Credentials, Endpoint};
use crate::config::Config;
use crate::error::{ControlCause, ControlError};
use crate::net::tls::UpstreamTls;

/// The sentinels are asked this often, whatever they publish.
pub const REFRESH: Duration = Duration::from_secs(1);
/// And this often while no primary is known, or the one they name does not
/// say it is one yet (a promotion in progress).
const RETRY: Duration = Duration::from_millis(100);
const RESUBSCRIBE_MIN: Duration = Duration::from_millis(100);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(2);

pub struct Sentinels {
    master: String,
    /// One per sentinel: its address, and the sentinels' login and TLS.
    sentinels: Vec<Endpoint>,
    /// Whose address follows the sentinels.
    upstream: Arc<Endpoint>,
    /// Ask now: a sentinel published a switch, or a subscription (re)began.
    ask: Notify,
}

/// What one sentinel says of the master.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Named {
    addr: String,
    epoch: u64,
}

impl Sentinels {
    /// The sentinels of `config`, moving `upstream`'s address.
    pub fn new(
        config: &Config,
        upstream: Arc<Endpoint>,
        tls: Option<UpstreamTls>,
    ) -> Arc<Sentinels> {
        let sentinels = config
            .sentinels
            .iter()
            .map(|addr| Endpoint {
                addr: Address::fixed(addr.clone()),
                credentials: std::sync::RwLock::new(Credentials {
                    user: config.sentinel_user.clone(),
                    password: config.sentinel_password.clone(),
                }),
                connect_timeout: config.connect_timeout(),
                tls: tls.clone(),
                opened: Default::default(),
                connected: Default::default(),
            })
            .collect();
        Arc::new(Sentinels {
            master: config.sentinel_master.clone().unwrap_or_default(),
            sentinels,
            upstream,
            ask: Notify::new(),
        })
    }

    /// Finds the primary (waiting at most about `within`: the proxy starts
    /// without one, as it starts with a direct upstream that is down), then
    /// follows it until `stop`.
    pub async fn start(self: &Arc<Self>, within: Duration, stop: watch::Receiver<bool>) {
        let mut conns: Vec<Option<MultiplexedConnection>> = vec![None; self.sentinels.len()];
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.refresh(&mut conns).await || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(RETRY).await;
        }
        if self.upstream.addr.current().is_none() {
            tracing::warn!(
                master = %self.master,
                "no sentinel names a reachable primary yet; requests fail until one does"
            );
        }
        for i in 0..self.sentinels.len() {
            tokio::spawn(self.clone().subscribe(i, stop.clone()));
        }
        tokio::spawn(self.clone().follow(conns, stop));
    }

    /// Asks the sentinels on every notice and every [`REFRESH`].
    async fn follow(
        self: Arc<Self>,
        mut conns: Vec<Option<MultiplexedConnection>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut settled = true;
        loop {
            let wait = if settled { REFRESH } else { RETRY };
            tokio::select! {
                _ = stop.changed() => return,
                _ = self.ask.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
            settled = self.refresh(&mut conns).await;
        }
    }

    /// One round of questions; the address moves if the newest answer is
    /// another primary that says it is one. Returns whether the primary
    /// the sentinels name is the one in use.
    async fn refresh(&self, conns: &mut [Option<MultiplexedConnection>]) -> bool {
        let answers = futures_util::future::join_all(
            self.sentinels
                .iter()
                .zip(conns.iter_mut())
                .map(|(s, c)| self.ask_one(s, c)),
        )
        .await;
        let mut newest: Option<Named> = None;
        for (sentinel, answer) in self.sentinels.iter().zip(answers) {
            match answer {
                Ok(named) => {
                    if newest.as_ref().is_none_or(|n| named.epoch > n.epoch) {
                        newest = Some(named);
                    }
                }
                Err(e) => tracing::debug!(sentinel = %sentinel.addr, "sentinel not answering: {e}"),
            }
        }
        let Some(named) = newest else {
            return false;
        };
        let current = self.upstream.addr.current();
        if current.as_deref() == Some(named.addr.as_str()) {
            return true;
        }
        if !self.is_primary(&named.addr).await {
            return false;
        }
        if self.upstream.addr.set(named.addr.clone()) {
            match current {
                Some(from) => tracing::warn!(
                    master = %self.master,
                    from = %from,
                    to = %named.addr,
                    config_epoch = named.epoch,
                    "upstream primary switched; connections to the previous one are closed"
                ),
                None => tracing::info!(
                    master = %self.master,
                    primary = %named.addr,
                    config_epoch = named.epoch,
                    "upstream primary found"
                ),
            }
        }
        true
    }

    /// `SENTINEL MASTER <name>` on one sentinel, through the connection
    /// kept for it (opened again when it fails).
    async fn ask_one(
        &self,
        sentinel: &Endpoint,
        conn: &mut Option<MultiplexedConnection>,
    ) -> Result<Named, ControlError> {
        const DURING: &str = "SENTINEL MASTER";
        if conn.is_none() {
            *conn = Some(control::admin(sentinel).await?);
        }
        let c = conn.as_mut().expect("opened above");
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("MASTER").arg(&self.master);
        let reply = control::query::<Vec<String>>(c, DURING, &cmd).await;
        if matches!(&reply, Err(e) if matches!(e.cause, ControlCause::Unreachable(_))) {
            *conn = None;
        }
        let fields = reply?;
        let field = |name: &str| {
            fields
                .chunks(2)
                .find(|kv| kv.len() == 2 && kv[0] == name)
                .map(|kv| kv[1].clone())
        };
        let unexpected =
            |why: &str| ControlError::new(DURING, ControlCause::Unexpected(why.into()));
        let (Some(ip), Some(port)) = (field("ip"), field("port")) else {
            return Err(unexpected("no ip and port"));
        };
        let epoch = field("config-epoch")
            .and_then(|e| e.parse().ok())
            .unwrap_or(0);
        let addr = if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            format!("{ip}:{port}")
        };
        Ok(Named { addr, epoch })
    }

    /// Whether `addr` says it is a primary (`ROLE`), with the proxy's own
    /// login and TLS. A Redis that does not let the proxy ask is taken at
    /// the sentinels' word.
    async fn is_primary(&self, addr: &str) -> bool {
        let candidate = Endpoint {
            addr: Address::fixed(addr),
            credentials: std::sync::RwLock::new(self.upstream.credentials.read().unwrap().clone()),
            connect_timeout: self.upstream.connect_timeout,
            tls: self.upstream.tls.clone(),
            opened: Default::default(),
            connected: Default::default(),
        };
        let role = async {
            let mut conn = control::admin(&candidate).await?;
            control::query::<Value>(&mut conn, "ROLE", &redis::cmd("ROLE")).await
        };
        match role.await {
            Ok(Value::Array(items)) => {
                let is_master =
                    matches!(items.first(), Some(Value::BulkString(r)) if r == b"master");
                if !is_master {
                    tracing::debug!(%addr, "named by the sentinels, not a primary yet");
                }
                is_master
            }
            Ok(other) => {
                tracing::debug!(%addr, "ROLE answered {other:?}");
                false
            }
            Err(e) if matches!(e.cause, ControlCause::Refused { .. } | ControlCause::Login) => {
                tracing::debug!(%addr, "ROLE not answered ({e}); taking the sentinels' word");
                true
            }
            Err(e) => {
                tracing::debug!(%addr, "primary named by the sentinels unreachable: {e}");
                false
            }
        }
    }

    /// Keeps a `+switch-master` subscription on sentinel `i`: each switch
    /// of this master, and each new subscription (one may have been
    /// missed meanwhile), has the sentinels asked at once.
    async fn subscribe(self: Arc<Self>, i: usize, mut stop: watch::Receiver<bool>) {
        let sentinel = &self.sentinels[i];
        let mut backoff = RESUBSCRIBE_MIN;
        loop {
            let subscribed = async {
                let mut conn = control::subscriber(sentinel).await?;
                control::request("SUBSCRIBE", conn.subscribe("+switch-master")).await?;
                Ok::<_, ControlError>(conn)
            };
            let ended = match subscribed.await {
                Ok(conn) => {
                    backoff = RESUBSCRIBE_MIN;
                    self.ask.notify_one();
                    let mut messages = conn.into_on_message();
                    loop {
                        tokio::select! {
                            _ = stop.changed() => return,
                            m = messages.next() => match m {
                                Some(m) => {
                                    let payload: String = m.get_payload().unwrap_or_default();
                                    if payload.split(' ').next() == Some(self.master.as_str()) {
                                        tracing::info!(sentinel = %sentinel.addr, "+switch-master {payload}");
                                        self.ask.notify_one();
                                    }
                                }
                                None => break "subscription closed".to_string(),
                            },
                        }
                    }
                }
                Err(e) => e.to_string(),
            };
            tracing::debug!(sentinel = %sentinel.addr, "no +switch-master subscription: {ended}");
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(RESUBSCRIBE_MAX);
        }
    }
}
