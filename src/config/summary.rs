//! The configuration as `--check-config` prints it.

use std::path::PathBuf;

use super::rule::{AckId, AckPolicy, Backoff, End, Redeliver};
use super::settings::{AuthClients, Config, LogFormat, UpstreamMode};

impl Config {
    /// Every setting and rule, as `--check-config` prints it.
    pub fn summary(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let on = |b: bool| if b { "yes" } else { "no" };
        let _ = writeln!(
            s,
            "listen              {}",
            if self.listen.is_empty() {
                "off (TLS only)"
            } else {
                &self.listen
            }
        );
        let file = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        match &self.tls_listen {
            Some(addr) => {
                let _ = writeln!(
                    s,
                    "tls listen          {addr}, certificate {}, key {}, client certificates {}",
                    file(&self.tls_cert_file),
                    file(&self.tls_key_file),
                    match self.tls_auth_clients {
                        AuthClients::Yes =>
                            format!("required (CA {})", file(&self.tls_ca_cert_file)),
                        AuthClients::Optional =>
                            format!("optional (CA {})", file(&self.tls_ca_cert_file)),
                        AuthClients::No => "not asked for".to_string(),
                    }
                );
            }
            None => {
                let _ = writeln!(s, "tls listen          off");
            }
        }
        match &self.upstream {
            Some(u) if self.upstream_mode == UpstreamMode::Cluster => {
                let _ = writeln!(s, "upstream            Redis Cluster, learnt from {u}");
            }
            Some(u) => {
                let _ = writeln!(s, "upstream            {u}");
            }
            None if self.upstream_mode == UpstreamMode::Sentinel => {
                let _ = writeln!(
                    s,
                    "upstream            the primary of sentinel master {:?}, from {} \
                     (login {}, tls {})",
                    self.sentinel_master.as_deref().unwrap_or_default(),
                    self.sentinels.join(", "),
                    match (&self.sentinel_user, &self.sentinel_password) {
                        (_, None) => "none".to_string(),
                        (Some(u), Some(_)) => format!("user {u}, password set"),
                        (None, Some(_)) => "password set (user default)".to_string(),
                    },
                    if self.sentinel_tls { "on" } else { "off" }
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "upstream            private redis-server (`{}`, persistence {}{})",
                    self.embedded.redis_server,
                    on(self.embedded.persistence),
                    self.embedded
                        .dir
                        .as_ref()
                        .map(|d| format!(", dir {}", d.display()))
                        .unwrap_or_default()
                );
            }
        }
        if !self.cluster_announce.is_empty() {
            let _ = writeln!(
                s,
                "cluster announce    {} (CLUSTER SLOTS/SHARDS/NODES answered by the proxy)",
                self.cluster_announce.join(", ")
            );
        }
        if self.upstream_tls {
            let _ = writeln!(
                s,
                "upstream tls        on, CA {}, client certificate {}, server name {}",
                file(&self.upstream_tls_ca_cert_file),
                if self.upstream_tls_cert_file.is_some() {
                    file(&self.upstream_tls_cert_file)
                } else {
                    "none".to_string()
                },
                self.upstream_tls_server_name
                    .clone()
                    .unwrap_or_else(|| "the upstream's host".to_string())
            );
        } else {
            let _ = writeln!(s, "upstream tls        off");
        }
        let _ = writeln!(
            s,
            "upstream login      {}",
            match (&self.upstream_user, &self.upstream_password) {
                (_, None) => "none".to_string(),
                (Some(u), Some(_)) => format!("user {u}, password set"),
                (None, Some(_)) => "password set (user default)".to_string(),
            }
        );
        let _ = writeln!(
            s,
            "connections         {}",
            if self.dedicated_per_client {
                "one upstream connection per client".to_string()
            } else {
                format!(
                    "{} shared, dedicated when stateful ({} kept ready)",
                    self.shared_connections, self.dedicated_pool
                )
            }
        );
        let _ = writeln!(
            s,
            "client password     {}",
            if self.client_password().is_some() {
                "set (clients log in with AUTH while Redis needs no login)"
            } else {
                "none (as Redis)"
            }
        );
        let _ = writeln!(
            s,
            "user connections    {}",
            if self.user_connections_max == 0 || self.dedicated_per_client {
                "none: logged-in clients keep their own".to_string()
            } else {
                format!(
                    "up to {}, one shared per logged-in user and password",
                    self.user_connections_max
                )
            }
        );
        let _ = writeln!(s, "threads             {}", self.threads.unwrap_or(1));
        let _ = writeln!(
            s,
            "operations          {}",
            match &self.metrics {
                None => "off".to_string(),
                Some(m) => format!(
                    "http://{m}/ (metrics, web view, API), {}, hosts {}, \
                     at most {} connections",
                    if self.ops_public {
                        "public allowed"
                    } else {
                        "loopback only"
                    },
                    if !self.ops_allowed_hosts.is_empty() {
                        format!(
                            "IP addresses, localhost, {}",
                            self.ops_allowed_hosts.join(", ")
                        )
                    } else if m
                        .parse::<std::net::SocketAddr>()
                        .is_ok_and(|a| a.ip().is_loopback())
                    {
                        "IP addresses and localhost".to_string()
                    } else {
                        "any".to_string()
                    },
                    self.ops_max_connections
                ),
            }
        );
        let _ = writeln!(
            s,
            "admin token         {}",
            if self.admin_token.is_some() {
                "set"
            } else {
                "not set: REDRIVE and PURGE refused"
            }
        );
        let _ = writeln!(
            s,
            "log format          {}",
            match self.log_format {
                LogFormat::Human => "human",
                LogFormat::Json => "json",
            }
        );
        let _ = writeln!(s, "connect timeout     {} ms", self.connect_timeout_ms);
        let l = &self.limits;
        let _ = writeln!(
            s,
            "limits              bulk {} B, array {} args, inline {} B, {} clients, \
             output buffer {} B{}, {} requests in flight per client, idle timeout {}",
            l.max_bulk_len,
            l.max_array_len,
            l.max_inline_len,
            l.maxclients,
            l.client_output_buffer_limit,
            if l.client_output_buffer_limit == 0 {
                " (none)"
            } else {
                ""
            },
            l.max_inflight_per_client,
            if l.idle_timeout_secs == 0 {
                "never".to_string()
            } else {
                format!("{} s", l.idle_timeout_secs)
            }
        );
        let _ = writeln!(
            s,
            "reaper              every {} ms, {} leases per call",
            self.reaper.interval_ms, self.reaper.batch
        );
        if self.queues.is_empty() {
            let _ = writeln!(s, "queue rules         none: every command passes through");
        }
        for q in &self.queues {
            let retry = match q.retry_backoff {
                Backoff::None => "at once".to_string(),
                b => format!(
                    "{} backoff from {} ms up to {} ms, jitter {}",
                    if b == Backoff::Fixed {
                        "fixed"
                    } else {
                        "exponential"
                    },
                    q.retry_base_ms,
                    q.retry_max_ms,
                    q.retry_jitter
                ),
            };
            let _ = writeln!(
                s,
                "queue {:?}: lease {} ms, max deliveries {}, ack id {}, ack {}{}{}, \
                 redeliver {}, retries {retry}, consumers pop from the {}, dead letters {} ({})",
                q.pattern,
                q.lease_ms,
                q.max_deliveries,
                match &q.ack_id {
                    AckId::Payload => "the whole payload".to_string(),
                    AckId::JsonField(f) => format!("JSON field {f:?}"),
                },
                match q.ack {
                    AckPolicy::Explicit => "explicit",
                    AckPolicy::NextPop => "next-pop",
                },
                match (q.requeue_on_disconnect, q.shadow) {
                    (_, true) => ", shadow mode (nothing redelivered)",
                    (true, false) => ", requeued on disconnect",
                    (false, false) => "",
                },
                if q.holds() {
                    format!(
                        ", held while the connection is open (at most {} ms)",
                        q.max_hold_ms()
                    )
                } else {
                    String::new()
                },
                match q.redeliver {
                    Redeliver::Next => "next (popped next)",
                    Redeliver::Last => "last (behind the others)",
                },
                match q.pop_end {
                    End::Left => "left",
                    End::Right => "right",
                },
                q.dead_letter
                    .as_deref()
                    .map(|d| format!("in {d:?}"))
                    .unwrap_or_else(|| "in the default list (`{queue}:dead`)".to_string()),
                if q.dead_max == 0 {
                    "no limit".to_string()
                } else {
                    format!("at most {}", q.dead_max)
                }
            );
        }
        s
    }
}
