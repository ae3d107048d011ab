//! Several proxies shown as one Redis Cluster (`cluster_announce`): the
//! proxy answers `CLUSTER SLOTS`, `SHARDS`, `NODES`, `INFO`, `MYID` and
//! `KEYSLOT` itself, listing the announced proxies as primaries that share
//! the 16384 slots in equal ranges. A cluster-aware client then spreads its
//! connections over the proxies; since every proxy serves every key, which
//! proxy a slot names is only a way to spread load, and no proxy ever
//! answers with a redirection.

use bytes::{Bytes, BytesMut};

use super::{key_slot, SLOTS};
use crate::command::Args;
use crate::resp::reply;

pub struct Announce {
    /// `(host, port, node id)` of every proxy, this one included.
    proxies: Vec<(String, u16, String)>,
    /// Index of this proxy in `proxies`.
    me: usize,
}

impl Announce {
    /// `proxies`: `host:port` each (checked by the configuration); `own`:
    /// this proxy's listening address, to tell which one it is.
    pub fn new(proxies: &[String], own: &str) -> Announce {
        let proxies: Vec<(String, u16, String)> = proxies
            .iter()
            .map(|p| {
                let (host, port) = p.rsplit_once(':').unwrap_or((p, "0"));
                let id = sha1_smol::Sha1::from(p.as_bytes()).digest().to_string();
                (host.to_string(), port.parse().unwrap_or(0), id)
            })
            .collect();
        let me = proxies
            .iter()
            .position(|(h, p, _)| format!("{h}:{p}") == own)
            .or_else(|| {
                let port = own.rsplit_once(':').map(|(_, p)| p);
                proxies
                    .iter()
                    .position(|(_, p, _)| Some(p.to_string().as_str()) == port)
            })
            .unwrap_or(0);
        Announce { proxies, me }
    }

    /// Slots `[start, end]` of the `i`th proxy.
    fn range(&self, i: usize) -> (usize, usize) {
        let n = self.proxies.len();
        (SLOTS * i / n, SLOTS * (i + 1) / n - 1)
    }

    /// The reply to `CLUSTER …` when the proxy answers it; `None`: Redis's
    /// own reply stands (other subcommands).
    pub fn answer(&self, args: Args<'_>, protocol: u8) -> Option<Bytes> {
        if !args.is(0, "CLUSTER") || self.proxies.is_empty() {
            return None;
        }
        let mut out = BytesMut::new();
        if args.is(1, "SLOTS") && args.len() == 2 {
            reply::array(&mut out, self.proxies.len());
            for (i, (host, port, id)) in self.proxies.iter().enumerate() {
                let (start, end) = self.range(i);
                reply::array(&mut out, 3);
                reply::integer(&mut out, start as i64);
                reply::integer(&mut out, end as i64);
                reply::array(&mut out, 4);
                reply::bulk(&mut out, host.as_bytes());
                reply::integer(&mut out, i64::from(*port));
                reply::bulk(&mut out, id.as_bytes());
                reply::map(&mut out, 0, protocol);
            }
        } else if args.is(1, "SHARDS") && args.len() == 2 {
            reply::array(&mut out, self.proxies.len());
            for (i, (host, port, id)) in self.proxies.iter().enumerate() {
                let (start, end) = self.range(i);
                reply::map(&mut out, 2, protocol);
                reply::bulk(&mut out, b"slots");
                reply::array(&mut out, 2);
                reply::integer(&mut out, start as i64);
                reply::integer(&mut out, end as i64);
                reply::bulk(&mut out, b"nodes");
                reply::array(&mut out, 1);
                reply::map(&mut out, 7, protocol);
                for (k, v) in [
                    ("id", Some(id.as_str())),
                    ("port", None),
                    ("ip", Some(host.as_str())),
                    ("endpoint", Some(host.as_str())),
                    ("role", Some("master")),
                    ("replication-offset", None),
                    ("health", Some("online")),
                ] {
                    reply::bulk(&mut out, k.as_bytes());
                    match (k, v) {
                        ("port", _) => reply::integer(&mut out, i64::from(*port)),
                        (_, Some(v)) => reply::bulk(&mut out, v.as_bytes()),
                        (_, None) => reply::integer(&mut out, 0),
                    }
                }
            }
        } else if args.is(1, "NODES") && args.len() == 2 {
            let mut text = String::new();
            for (i, (host, port, id)) in self.proxies.iter().enumerate() {
                let (start, end) = self.range(i);
                let flags = if i == self.me {
                    "myself,master"
                } else {
                    "master"
                };
                text.push_str(&format!(
                    "{id} {host}:{port}@0 {flags} - 0 0 {} connected {start}-{end}\n",
                    i + 1
                ));
            }
            reply::bulk(&mut out, text.as_bytes());
        } else if args.is(1, "INFO") && args.len() == 2 {
            let n = self.proxies.len();
            let text = format!(
                "cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:16384\r\n\
                 cluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:{n}\r\n\
                 cluster_size:{n}\r\ncluster_current_epoch:{n}\r\ncluster_my_epoch:{}\r\n\
                 cluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\n\
                 total_cluster_links_buffer_limit_exceeded:0\r\n",
                self.me + 1
            );
            reply::bulk(&mut out, text.as_bytes());
        } else if args.is(1, "MYID") && args.len() == 2 {
            reply::bulk(&mut out, self.proxies[self.me].2.as_bytes());
        } else if args.is(1, "KEYSLOT") && args.len() == 3 {
            reply::integer(&mut out, i64::from(key_slot(args.get(2)?)));
        } else {
            return None;
        }
        Some(out.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(a: &Announce, words: &[&str]) -> String {
        let parts: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        let frame = crate::upstream::encode_command(&parts);
        let mut scanner = crate::resp::scanner::RequestScanner::new(Default::default());
        assert!(matches!(
            scanner.scan(&frame),
            crate::resp::scanner::Scan::Command(_)
        ));
        let reply = a.answer(Args::new(&frame, scanner.args()), 2).unwrap();
        String::from_utf8(reply.to_vec()).unwrap()
    }

    #[test]
    fn the_proxies_share_the_slots_in_equal_ranges() {
        let a = Announce::new(
            &[
                "10.0.0.1:6380".into(),
                "10.0.0.2:6380".into(),
                "10.0.0.3:7000".into(),
            ],
            "0.0.0.0:7000",
        );
        let slots = answer(&a, &["CLUSTER", "SLOTS"]);
        assert!(slots.starts_with("*3\r\n*3\r\n:0\r\n:5460\r\n*4\r\n$8\r\n10.0.0.1\r\n:6380\r\n"));
        assert!(slots.contains(":5461\r\n:10921\r\n"));
        assert!(slots.contains(":10922\r\n:16383\r\n"));
        let nodes = answer(&a, &["CLUSTER", "NODES"]);
        assert_eq!(nodes.matches("myself").count(), 1);
        assert!(nodes.contains("10.0.0.3:7000@0 myself,master"));
        assert_eq!(answer(&a, &["cluster", "keyslot", "foo"]), ":12182\r\n");
        let id = answer(&a, &["CLUSTER", "MYID"]);
        assert!(nodes.contains(id.lines().nth(1).unwrap()));
    }
}
