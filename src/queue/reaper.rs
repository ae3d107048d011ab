//! The background reaper: returns expired leases to their queues even when
//! nobody pops, in bounded batches. Several proxies may reap the same queue
//! at once; every script re-checks what it changes.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use super::call::{self, Call};
use super::rules::{Queue, Rules};
use super::scripts;
use super::value::Value;
use super::waiters::Waiters;
use crate::session::output::ClientState;
use crate::upstream::shared::SharedUpstream;

/// How often Redis is scanned for queues this proxy has not seen yet (a
/// queue matched by a glob, leased by another proxy or before a restart).
const DISCOVER_EVERY: Duration = Duration::from_secs(10);
const SCAN_ROUNDS: usize = 20;

pub struct Reaper {
    pub rules: Arc<Rules>,
    pub known: Arc<Mutex<HashSet<Bytes>>>,
    pub shared: SharedUpstream,
    pub waiters: Waiters,
    pub interval: Duration,
    pub batch: usize,
}

impl Reaper {
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let client = ClientState::new(0, usize::MAX);
        for name in self.rules.exact_names() {
            self.known
                .lock()
                .unwrap()
                .insert(Bytes::copy_from_slice(name));
        }
        let mut next_discovery = tokio::time::Instant::now();
        let mut cursor = Bytes::from_static(b"0");
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            if tokio::time::Instant::now() >= next_discovery {
                cursor = self.discover(&client, cursor).await;
                next_discovery = tokio::time::Instant::now() + DISCOVER_EVERY;
            }
            let names: Vec<Bytes> = self.known.lock().unwrap().iter().cloned().collect();
            for name in names {
                if let Some(q) = self.rules.resolve(&name) {
                    self.reap(&client, &q).await;
                }
            }
        }
    }

    async fn reap(&self, client: &Arc<ClientState>, q: &Queue) {
        let mut call = group_call(&scripts::REAP, q);
        for a in &q.spec {
            call = call.arg(a.clone());
        }
        call = call.arg(self.batch.to_string());
        let Ok(v) = call::run(&self.shared, client, &call).await else {
            return;
        };
        let items = v.array();
        let mut requeued = items.first().map(Value::int).unwrap_or(0);
        let mut dead = items.get(1).map(Value::int).unwrap_or(0);
        for pair in items.get(2..).unwrap_or_default().chunks(2) {
            let [token, dest] = pair else { break };
            let mut call =
                group_call(&scripts::EXPIRE_MOVE, q).key(Bytes::copy_from_slice(dest.bytes()));
            for a in &q.spec {
                call = call.arg(a.clone());
            }
            call = call.arg(Bytes::copy_from_slice(token.bytes()));
            if let Ok(v) = call::run(&self.shared, client, &call).await {
                requeued += v.array().first().map(Value::int).unwrap_or(0);
                dead += v.array().get(1).map(Value::int).unwrap_or(0);
            }
        }
        let queue = String::from_utf8_lossy(&q.name).into_owned();
        if requeued > 0 {
            metrics::counter!("ackproxy_redeliveries_total", "queue" => queue.clone())
                .increment(requeued as u64);
            self.waiters.wake(q.name.clone());
        }
        if dead > 0 {
            metrics::counter!("ackproxy_dead_letters_total", "queue" => queue)
                .increment(dead as u64);
        }
    }

    /// One bounded SCAN pass for lease sets of queues matching a rule.
    async fn discover(&self, client: &Arc<ClientState>, mut cursor: Bytes) -> Bytes {
        for _ in 0..SCAN_ROUNDS {
            let req = crate::upstream::encode_command(&[
                b"SCAN",
                &cursor,
                b"MATCH",
                b"ackq:*leases",
                b"COUNT",
                b"1000",
            ]);
            let Ok(reply) = self.shared.call(Bytes::from(req), client.clone()).await else {
                return cursor;
            };
            let Some(v) = super::value::decode(&reply) else {
                return Bytes::from_static(b"0");
            };
            let items = v.array();
            cursor = Bytes::copy_from_slice(items.first().map(Value::bytes).unwrap_or(b"0"));
            for key in items.get(1).map(Value::array).unwrap_or_default() {
                if let Some(name) = queue_of_lease_key(key.bytes()) {
                    if self.rules.is_queue(name) {
                        self.known
                            .lock()
                            .unwrap()
                            .insert(Bytes::copy_from_slice(name));
                    }
                }
            }
            if &cursor[..] == b"0" {
                break;
            }
        }
        cursor
    }
}

fn group_call(script: &'static scripts::Script, q: &Queue) -> Call {
    let mut call = Call::new(script);
    for k in q.key_group() {
        call = call.key(k.clone());
    }
    call
}

/// The queue a lease set belongs to: `ackq:{TAG}:QUEUE:leases` (or
/// `:mleases`); TAG never contains `}`.
fn queue_of_lease_key(key: &[u8]) -> Option<&[u8]> {
    let rest = key.strip_prefix(b"ackq:{")?;
    let close = rest.windows(2).position(|w| w == b"}:")?;
    let rest = &rest[close + 2..];
    rest.strip_suffix(b":mleases")
        .or_else(|| rest.strip_suffix(b":leases"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_keys_name_their_queue() {
        assert_eq!(
            queue_of_lease_key(b"ackq:{jobs}:jobs:leases"),
            Some(&b"jobs"[..])
        );
        assert_eq!(
            queue_of_lease_key(b"ackq:{u1}:{u1}q:mleases"),
            Some(&b"{u1}q"[..])
        );
        assert_eq!(
            queue_of_lease_key(b"ackq:{7}:x}y:leases"),
            Some(&b"x}y"[..])
        );
        assert_eq!(queue_of_lease_key(b"other"), None);
    }
}
