//! Which primary owns each slot, read from `CLUSTER SHARDS` (Redis 7.0) or
//! `CLUSTER SLOTS`, corrected slot by slot by MOVED redirections.

use redis::Value;

use super::SLOTS;

/// No primary owns the slot.
const UNASSIGNED: u16 = u16::MAX;

/// The owner of every slot, and the primaries' replicas. Addresses are
/// `host:port`, as Redis writes them in redirections.
#[derive(Debug, Clone)]
pub struct SlotMap {
    /// Per slot: an index into `primaries`, or [`UNASSIGNED`].
    owners: Vec<u16>,
    primaries: Vec<String>,
    /// Per primary, in the order of `primaries`.
    replicas: Vec<Vec<String>>,
}

impl Default for SlotMap {
    fn default() -> Self {
        SlotMap {
            owners: vec![UNASSIGNED; SLOTS],
            primaries: Vec::new(),
            replicas: Vec::new(),
        }
    }
}

impl SlotMap {
    /// From a `CLUSTER SHARDS` reply (RESP2 or RESP3). A shard's primary is
    /// its node with role `master` and health `online`; a shard without one
    /// (its primary failed, no replica promoted yet) leaves its slots
    /// unassigned. Replicas are those `online`. A node's address is its
    /// `endpoint` (its `ip` if there is none) and `port`; an endpoint Redis
    /// does not know ("" or "?") is `seed_host`, the host the reply came from.
    pub fn from_shards(reply: &Value, seed_host: &str) -> Result<SlotMap, String> {
        let mut map = SlotMap::default();
        for shard in items(reply).ok_or("CLUSTER SHARDS: not an array")? {
            let shard = pairs(shard).ok_or("CLUSTER SHARDS: a shard is not a map")?;
            let slots = field(&shard, "slots")
                .and_then(items)
                .ok_or("CLUSTER SHARDS: a shard without slots")?;
            let nodes = field(&shard, "nodes")
                .and_then(items)
                .ok_or("CLUSTER SHARDS: a shard without nodes")?;
            let mut primary = None;
            let mut replicas = Vec::new();
            for node in nodes {
                let node = pairs(node).ok_or("CLUSTER SHARDS: a node is not a map")?;
                let text_of = |name| field(&node, name).and_then(text);
                if text_of("health").as_deref() != Some("online") {
                    continue;
                }
                let host = match text_of("endpoint") {
                    Some(endpoint) => endpoint,
                    None => text_of("ip").unwrap_or_default(),
                };
                let port = field(&node, "port")
                    .and_then(int)
                    .ok_or("CLUSTER SHARDS: a node without a port")?;
                let addr = address(&host, port, seed_host);
                match text_of("role").as_deref() {
                    Some("master") => primary = Some(addr),
                    Some("replica") => replicas.push(addr),
                    _ => {}
                }
            }
            let Some(primary) = primary else {
                continue;
            };
            let owner = map.add_primary(&primary);
            map.replicas[owner as usize] = replicas;
            if !slots.len().is_multiple_of(2) {
                return Err("CLUSTER SHARDS: an odd number of slot bounds".into());
            }
            for range in slots.chunks(2) {
                let (start, end) = (slot_number(&range[0])?, slot_number(&range[1])?);
                map.assign(start, end, owner);
            }
        }
        Ok(map)
    }

    /// From a `CLUSTER SLOTS` reply: per slot range, its start, its end, the
    /// primary (host, port, id, ...) and its replicas likewise. A host Redis
    /// does not know (null, "" or "?") is `seed_host`.
    pub fn from_slots(reply: &Value, seed_host: &str) -> Result<SlotMap, String> {
        let mut map = SlotMap::default();
        for range in items(reply).ok_or("CLUSTER SLOTS: not an array")? {
            let range = items(range).ok_or("CLUSTER SLOTS: a range is not an array")?;
            let [start, end, primary, replicas @ ..] = range else {
                return Err("CLUSTER SLOTS: a range without its primary".into());
            };
            let node = |v: &Value| -> Result<String, String> {
                let fields = items(v).ok_or("CLUSTER SLOTS: a node is not an array")?;
                let host = fields.first().and_then(text).unwrap_or_default();
                let port = fields
                    .get(1)
                    .and_then(int)
                    .ok_or("CLUSTER SLOTS: a node without a port")?;
                Ok(address(&host, port, seed_host))
            };
            let owner = map.add_primary(&node(primary)?);
            for replica in replicas {
                let replica = node(replica)?;
                let known = &mut map.replicas[owner as usize];
                if !known.contains(&replica) {
                    known.push(replica);
                }
            }
            map.assign(slot_number(start)?, slot_number(end)?, owner);
        }
        Ok(map)
    }

    /// The address of the primary that owns `slot`, if one does.
    pub fn primary_of(&self, slot: u16) -> Option<&str> {
        let owner = *self.owners.get(usize::from(slot))?;
        self.primaries.get(usize::from(owner)).map(String::as_str)
    }

    /// Every primary known, including any that owns no slot now.
    pub fn primaries(&self) -> &[String] {
        &self.primaries
    }

    pub fn replicas_of(&self, primary: &str) -> &[String] {
        match self.primaries.iter().position(|p| p == primary) {
            Some(i) => &self.replicas[i],
            None => &[],
        }
    }

    /// Whether every slot has a primary.
    pub fn covers_all(&self) -> bool {
        self.owners.iter().all(|&o| o != UNASSIGNED)
    }

    /// After a MOVED: `slot` now belongs to `addr`, a primary added if new.
    pub fn set_owner(&mut self, slot: u16, addr: &str) {
        if usize::from(slot) >= SLOTS {
            return;
        }
        let owner = self.add_primary(addr);
        self.owners[usize::from(slot)] = owner;
    }

    fn add_primary(&mut self, addr: &str) -> u16 {
        if let Some(i) = self.primaries.iter().position(|p| p == addr) {
            return i as u16;
        }
        self.primaries.push(addr.to_string());
        self.replicas.push(Vec::new());
        (self.primaries.len() - 1) as u16
    }

    fn assign(&mut self, start: u16, end: u16, owner: u16) {
        for slot in start..=end {
            self.owners[usize::from(slot)] = owner;
        }
    }
}

/// A redirection Redis answers with in cluster mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// The slot belongs to `addr` now: ask there, and from now on.
    Moved { slot: u16, addr: String },
    /// The slot is being migrated to `addr`: ask there, this once, after
    /// ASKING.
    Ask { slot: u16, addr: String },
}

/// A MOVED or ASK error (`-MOVED 3999 127.0.0.1:6381\r\n`, the `-` and
/// line end optional); `None` for any other error. The address is as Redis
/// wrote it, `host:port`, except that an unknown host ("" or "?", what Redis
/// 7 writes when told to prefer a hostname a node has not announced) is
/// left empty (":6381"): the caller substitutes the host it asked.
pub fn parse_redirect(error_line: &[u8]) -> Option<Redirect> {
    let line = error_line.strip_prefix(b"-").unwrap_or(error_line);
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split(' ');
    let (kind, slot, addr) = (words.next()?, words.next()?, words.next()?);
    if words.next().is_some() {
        return None;
    }
    // Redis writes the slot with %d: digits only, no sign.
    if slot.is_empty() || !slot.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let slot: u16 = slot.parse().ok().filter(|&s| usize::from(s) < SLOTS)?;
    let (host, port) = addr.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let addr = if host == "?" {
        format!(":{port}")
    } else {
        addr.to_string()
    };
    match kind {
        "MOVED" => Some(Redirect::Moved { slot, addr }),
        "ASK" => Some(Redirect::Ask { slot, addr }),
        _ => None,
    }
}

fn address(host: &str, port: i64, seed_host: &str) -> String {
    let host = if host.is_empty() || host == "?" {
        seed_host
    } else {
        host
    };
    format!("{host}:{port}")
}

fn items(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(items) | Value::Set(items) => Some(items),
        _ => None,
    }
}

/// A map: RESP3's, or RESP2's flat array of names and values.
fn pairs(v: &Value) -> Option<Vec<(&Value, &Value)>> {
    match v {
        Value::Map(pairs) => Some(pairs.iter().map(|(k, v)| (k, v)).collect()),
        Value::Array(flat) if flat.len().is_multiple_of(2) => {
            Some(flat.chunks(2).map(|p| (&p[0], &p[1])).collect())
        }
        _ => None,
    }
}

fn field<'a>(pairs: &[(&Value, &'a Value)], name: &str) -> Option<&'a Value> {
    pairs
        .iter()
        .find(|(k, _)| text(k).as_deref() == Some(name))
        .map(|(_, v)| *v)
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

fn slot_number(v: &Value) -> Result<u16, String> {
    int(v)
        .filter(|&n| (0..SLOTS as i64).contains(&n))
        .map(|n| n as u16)
        .ok_or_else(|| format!("not a slot: {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn flat(fields: &[(&str, Value)]) -> Value {
        Value::Array(
            fields
                .iter()
                .flat_map(|(k, v)| [bulk(k), v.clone()])
                .collect(),
        )
    }

    fn node(endpoint: Option<&str>, ip: &str, port: i64, role: &str, health: &str) -> Value {
        let mut fields = vec![
            ("id", bulk("x")),
            ("port", Value::Int(port)),
            ("ip", bulk(ip)),
        ];
        if let Some(e) = endpoint {
            fields.push(("endpoint", bulk(e)));
        }
        fields.extend([
            ("role", bulk(role)),
            ("replication-offset", Value::Int(1)),
            ("health", bulk(health)),
        ]);
        flat(&fields)
    }

    fn shard(slots: &[i64], nodes: Vec<Value>) -> Value {
        flat(&[
            (
                "slots",
                Value::Array(slots.iter().map(|&s| Value::Int(s)).collect()),
            ),
            ("nodes", Value::Array(nodes)),
        ])
    }

    #[test]
    fn shards_give_primaries_replicas_and_slots() {
        let reply = Value::Array(vec![
            shard(
                &[0, 5460, 10923, 10923],
                vec![
                    node(Some("10.0.0.1"), "10.0.0.1", 7000, "master", "online"),
                    node(Some("10.0.0.4"), "10.0.0.4", 7003, "replica", "online"),
                    node(Some("10.0.0.7"), "10.0.0.7", 7006, "replica", "loading"),
                ],
            ),
            shard(
                &[5461, 10922],
                vec![
                    // Redis lists the replica first as often as not.
                    node(Some(""), "10.0.0.5", 7004, "replica", "online"),
                    node(None, "10.0.0.2", 7001, "master", "online"),
                ],
            ),
            shard(
                &[10924, 16383],
                vec![node(Some("?"), "10.0.0.3", 7002, "master", "online")],
            ),
            // A failed primary that lost its slots.
            shard(
                &[],
                vec![node(Some("10.0.0.9"), "10.0.0.9", 7009, "master", "fail")],
            ),
        ]);
        let map = SlotMap::from_shards(&reply, "seed").unwrap();
        assert_eq!(map.primary_of(0), Some("10.0.0.1:7000"));
        assert_eq!(map.primary_of(5460), Some("10.0.0.1:7000"));
        assert_eq!(map.primary_of(5461), Some("10.0.0.2:7001"));
        assert_eq!(map.primary_of(10923), Some("10.0.0.1:7000"));
        assert_eq!(map.primary_of(16383), Some("seed:7002"));
        assert_eq!(
            map.primaries(),
            ["10.0.0.1:7000", "10.0.0.2:7001", "seed:7002"]
        );
        assert_eq!(map.replicas_of("10.0.0.1:7000"), ["10.0.0.4:7003"]);
        assert_eq!(map.replicas_of("10.0.0.2:7001"), ["seed:7004"]);
        assert!(map.replicas_of("seed:7002").is_empty());
        assert!(map.replicas_of("nowhere:1").is_empty());
        assert!(map.covers_all());
    }

    #[test]
    fn shards_in_resp3() {
        let map3 = |fields: Vec<(&str, Value)>| {
            Value::Map(fields.into_iter().map(|(k, v)| (bulk(k), v)).collect())
        };
        let n = map3(vec![
            ("port", Value::Int(7000)),
            ("ip", bulk("127.0.0.1")),
            ("endpoint", bulk("127.0.0.1")),
            ("role", bulk("master")),
            ("health", bulk("online")),
        ]);
        let reply = Value::Array(vec![map3(vec![
            (
                "slots",
                Value::Array(vec![Value::Int(0), Value::Int(16383)]),
            ),
            ("nodes", Value::Array(vec![n])),
        ])]);
        let map = SlotMap::from_shards(&reply, "seed").unwrap();
        assert_eq!(map.primary_of(8000), Some("127.0.0.1:7000"));
        assert!(map.covers_all());
    }

    #[test]
    fn a_shard_whose_primary_failed_leaves_its_slots_unassigned() {
        let reply = Value::Array(vec![
            shard(
                &[0, 99],
                vec![
                    node(Some("h"), "h", 1, "master", "fail"),
                    node(Some("h"), "h", 2, "replica", "online"),
                ],
            ),
            shard(
                &[100, 16383],
                vec![node(Some("h"), "h", 3, "master", "online")],
            ),
        ]);
        let mut map = SlotMap::from_shards(&reply, "seed").unwrap();
        assert_eq!(map.primary_of(0), None);
        assert_eq!(map.primary_of(100), Some("h:3"));
        assert!(!map.covers_all());
        map.set_owner(0, "h:2");
        assert_eq!(map.primary_of(0), Some("h:2"));
        assert_eq!(map.primaries(), ["h:3", "h:2"]);
        assert!(!map.covers_all());
        for slot in 1..100 {
            map.set_owner(slot, "h:3");
        }
        assert!(map.covers_all());
        // Out of range: ignored.
        map.set_owner(16384, "h:9");
        assert_eq!(map.primaries(), ["h:3", "h:2"]);
    }

    #[test]
    fn malformed_shards_are_refused() {
        assert!(SlotMap::from_shards(&Value::Int(1), "s").is_err());
        assert!(SlotMap::from_shards(&Value::Array(vec![Value::Int(1)]), "s").is_err());
        let odd = Value::Array(vec![shard(
            &[0],
            vec![node(Some("h"), "h", 1, "master", "online")],
        )]);
        assert!(SlotMap::from_shards(&odd, "s").is_err());
        let beyond = Value::Array(vec![shard(
            &[0, 16384],
            vec![node(Some("h"), "h", 1, "master", "online")],
        )]);
        assert!(SlotMap::from_shards(&beyond, "s").is_err());
    }

    #[test]
    fn slots_reply() {
        let n = |host: Value, port: i64| Value::Array(vec![host, Value::Int(port), bulk("id")]);
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8191),
                n(bulk("10.0.0.1"), 7000),
                n(bulk("10.0.0.2"), 7001),
            ]),
            Value::Array(vec![
                Value::Int(8192),
                Value::Int(16000),
                n(Value::Nil, 7002),
                n(bulk("?"), 7003),
            ]),
            Value::Array(vec![
                Value::Int(16001),
                Value::Int(16001),
                n(bulk("10.0.0.1"), 7000),
                n(bulk("10.0.0.2"), 7001),
            ]),
        ]);
        let map = SlotMap::from_slots(&reply, "seed").unwrap();
        assert_eq!(map.primary_of(0), Some("10.0.0.1:7000"));
        assert_eq!(map.primary_of(8192), Some("seed:7002"));
        assert_eq!(map.primary_of(16001), Some("10.0.0.1:7000"));
        assert_eq!(map.primary_of(16002), None);
        assert!(!map.covers_all());
        assert_eq!(map.primaries(), ["10.0.0.1:7000", "seed:7002"]);
        assert_eq!(map.replicas_of("10.0.0.1:7000"), ["10.0.0.2:7001"]);
        assert_eq!(map.replicas_of("seed:7002"), ["seed:7003"]);
        let short = Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(1)])]);
        assert!(SlotMap::from_slots(&short, "s").is_err());
    }

    #[test]
    fn redirects() {
        let moved = |slot, addr: &str| {
            Some(Redirect::Moved {
                slot,
                addr: addr.into(),
            })
        };
        assert_eq!(
            parse_redirect(b"-MOVED 3999 127.0.0.1:6381\r\n"),
            moved(3999, "127.0.0.1:6381")
        );
        assert_eq!(
            parse_redirect(b"MOVED 3999 127.0.0.1:6381"),
            moved(3999, "127.0.0.1:6381")
        );
        assert_eq!(
            parse_redirect(b"-ASK 16383 redis-2.example:7000\r\n"),
            Some(Redirect::Ask {
                slot: 16383,
                addr: "redis-2.example:7000".into()
            })
        );
        assert_eq!(parse_redirect(b"-MOVED 0 :6381\r\n"), moved(0, ":6381"));
        assert_eq!(parse_redirect(b"-MOVED 0 ?:6381\r\n"), moved(0, ":6381"));
        assert_eq!(parse_redirect(b"-MOVED 1 ::1:6381"), moved(1, "::1:6381"));
        for bad in [
            &b"-ERR unknown command"[..],
            b"-MOVED 16384 h:1",
            b"-MOVED -1 h:1",
            b"-MOVED +1 h:1",
            b"-MOVED 1 h",
            b"-MOVED 1 h:x",
            b"-MOVED 1 h:1 extra",
            b"-CROSSSLOT Keys in request don't hash to the same slot",
            b"-TRYAGAIN Multiple keys request during rehashing of slot",
            b"",
        ] {
            assert_eq!(
                parse_redirect(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
