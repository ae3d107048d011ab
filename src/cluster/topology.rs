//! Which node owns which hash slot, as the cluster says: read with
//! `CLUSTER SHARDS` (`CLUSTER SLOTS` where that is unknown) from the seeds
//! at start, again every few seconds, soon after a `MOVED` or a node that
//! cannot be reached, and patched at once by each `MOVED` in between.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::map::SlotMap;
use crate::upstream::topology::Address;
use crate::upstream::{control, Endpoint};

/// How often the map is read when nothing prompts it: a resharding or a
/// failover is usually noticed first by a `MOVED` or a lost connection.
const REFRESH: Duration = Duration::from_secs(5);
/// Refreshes prompted by redirections come at most this often.
const MIN_GAP: Duration = Duration::from_millis(100);

pub struct Topology {
    /// Credentials, TLS and timeouts of every node's connections.
    base: Arc<Endpoint>,
    seeds: Vec<String>,
    map: RwLock<Arc<SlotMap>>,
    endpoints: Mutex<HashMap<String, Arc<Endpoint>>>,
    refresh: Notify,
}

impl Topology {
    /// Reads the slot map from the first seed that answers, and keeps it up
    /// to date until `stop`.
    pub async fn start(
        base: Arc<Endpoint>,
        seeds: Vec<String>,
        stop: watch::Receiver<bool>,
    ) -> Result<Arc<Topology>, String> {
        let topology = Arc::new(Topology {
            base,
            seeds,
            map: RwLock::new(Arc::new(SlotMap::default())),
            endpoints: Mutex::new(HashMap::new()),
            refresh: Notify::new(),
        });
        let map = topology.read_map().await?;
        topology.install(map);
        tokio::spawn(topology.clone().keep_fresh(stop));
        Ok(topology)
    }

    /// The endpoint of the node at `addr`, with the proxy's credentials of
    /// the moment.
    pub fn endpoint(&self, addr: &str) -> Arc<Endpoint> {
        let mut endpoints = self.endpoints.lock().unwrap();
        if let Some(e) = endpoints.get(addr) {
            return e.clone();
        }
        let e = Arc::new(Endpoint {
            addr: Address::fixed(addr),
            credentials: RwLock::new(self.base.credentials.read().unwrap().clone()),
            connect_timeout: self.base.connect_timeout,
            tls: self.base.tls.clone(),
            connected: Arc::new(Notify::new()),
            opened: Default::default(),
        });
        endpoints.insert(addr.to_string(), e.clone());
        e
    }

    pub fn map(&self) -> Arc<SlotMap> {
        self.map.read().unwrap().clone()
    }

    /// The primary that owns `slot`, if any does.
    pub fn owner(&self, slot: u16) -> Option<String> {
        self.map
            .read()
            .unwrap()
            .primary_of(slot)
            .map(str::to_string)
    }

    /// The node for a request without keys: the owner of slot 0, or any
    /// primary.
    pub fn any(&self) -> Option<String> {
        let map = self.map.read().unwrap();
        map.primary_of(0)
            .or_else(|| map.primaries().first().map(String::as_str))
            .map(str::to_string)
    }

    /// Every primary, in a stable order (by address).
    pub fn primaries(&self) -> Vec<String> {
        let mut p = self.map.read().unwrap().primaries().to_vec();
        p.sort();
        p.dedup();
        p
    }

    /// A `MOVED` said `slot` is at `addr` now: routed there from now on,
    /// and the whole map read again soon (a resharding moves more than
    /// one slot). Returns the address to dial.
    pub fn moved(&self, slot: u16, addr: &str) -> String {
        let addr = self.resolve(addr);
        {
            let mut map = self.map.write().unwrap();
            if map.primary_of(slot) != Some(addr.as_str()) {
                let mut next = (**map).clone();
                next.set_owner(slot, &addr);
                *map = Arc::new(next);
            }
        }
        self.refresh_soon();
        addr
    }

    /// An address from a redirection: Redis leaves the host out (`:port`)
    /// when it does not know its own; it is then the seed's.
    pub fn resolve(&self, addr: &str) -> String {
        match addr.strip_prefix(':') {
            Some(port) => format!("{}:{port}", self.seed_host()),
            None => addr.to_string(),
        }
    }

    fn seed_host(&self) -> String {
        let seed = self
            .seeds
            .first()
            .map(String::as_str)
            .unwrap_or("127.0.0.1");
        match seed.rsplit_once(':') {
            Some((host, _)) => host.to_string(),
            None => seed.to_string(),
        }
    }

    /// Reads the map again without waiting for the next periodic read.
    pub fn refresh_soon(&self) {
        self.refresh.notify_one();
    }

    fn install(&self, map: SlotMap) {
        let credentials = self.base.credentials.read().unwrap().clone();
        for e in self.endpoints.lock().unwrap().values() {
            // SIGHUP and CONFIG SET requirepass change the proxy's login.
            if *e.credentials.read().unwrap() != credentials {
                *e.credentials.write().unwrap() = credentials.clone();
            }
        }
        let mut primaries = map.primaries().to_vec();
        primaries.sort();
        let changed = {
            let mut current = self.map.write().unwrap();
            let mut before = current.primaries().to_vec();
            before.sort();
            *current = Arc::new(map);
            before != primaries
        };
        if changed {
            // A new primary may lack what the proxy knows is loaded (the
            // queue library): counted as a new connection to Redis.
            self.base.note_opened();
        }
    }

    async fn keep_fresh(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(REFRESH) => {}
                _ = self.refresh.notified() => {}
                _ = stop.changed() => return,
            }
            match self.read_map().await {
                Ok(map) => self.install(map),
                Err(e) => tracing::warn!("cluster slot map not read: {e}"),
            }
            tokio::time::sleep(MIN_GAP).await;
        }
    }

    /// The map as the first node that answers says: the known primaries
    /// first, then the seeds.
    async fn read_map(&self) -> Result<SlotMap, String> {
        let mut candidates = self.primaries();
        for s in &self.seeds {
            if !candidates.contains(s) {
                candidates.push(s.clone());
            }
        }
        let mut last = String::from("no seed node");
        for addr in candidates {
            match self.read_map_from(&addr).await {
                Ok(map) if map.primaries().is_empty() => {
                    last = format!("{addr}: no slot is assigned");
                }
                Ok(map) => return Ok(map),
                Err(e) => last = format!("{addr}: {e}"),
            }
        }
        Err(last)
    }

    async fn read_map_from(&self, addr: &str) -> Result<SlotMap, String> {
        let endpoint = self.endpoint(addr);
        let mut conn = control::admin(&endpoint).await.map_err(|e| e.to_string())?;
        let host = match addr.rsplit_once(':') {
            Some((host, _)) => host.to_string(),
            None => addr.to_string(),
        };
        let shards: Result<redis::Value, _> = control::query(
            &mut conn,
            "CLUSTER SHARDS",
            redis::cmd("CLUSTER").arg("SHARDS"),
        )
        .await;
        match shards {
            Ok(v) => SlotMap::from_shards(&v, &host),
            Err(_) => {
                let v: redis::Value = control::query(
                    &mut conn,
                    "CLUSTER SLOTS",
                    redis::cmd("CLUSTER").arg("SLOTS"),
                )
                .await
                .map_err(|e| e.to_string())?;
                SlotMap::from_slots(&v, &host)
            }
        }
    }
}
