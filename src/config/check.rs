//! What a configuration may not say, and what it likely does not mean:
//! errors and warnings that point at where the setting was written.

use super::rule::{Backoff, QueueRule, MAX_DURATION_MS, MIN_HELD_LEASE_MS};
use super::settings::{AuthClients, Config, UpstreamMode};
use crate::glob::{check_glob, glob_match, is_glob};

impl Config {
    /// Every check; errors and the warnings returned say where in `at` the
    /// setting concerned was written.
    pub(super) fn validate_at(&self, at: &Origin) -> Result<Vec<String>, String> {
        self.refusal().map_err(|r| at.locate(r))?;
        self.check_rules(at).map_err(|r| at.locate(r))
    }

    /// What the settings cannot be, each alone or together; the rules'
    /// cross-checks are [`Config::check_rules`].
    fn refusal(&self) -> Result<(), Refusal> {
        use std::net::ToSocketAddrs;
        if !self.listen.is_empty() && self.listen.to_socket_addrs().is_err() {
            return Err(Refusal::of(
                "listen",
                format!("listen: {:?} is not a host:port address", self.listen),
            ));
        }
        self.validate_tls()?;
        if let Some(m) = &self.metrics {
            let Ok(addr) = m.parse::<std::net::SocketAddr>() else {
                return Err(Refusal::of(
                    "metrics",
                    format!("metrics: {m:?} is not an ip:port address"),
                ));
            };
            // The queue API shows payloads and the view is unauthenticated:
            // reachable from other hosts only when asked for.
            if !addr.ip().is_loopback() && !self.ops_public {
                return Err(Refusal::of(
                    "metrics",
                    format!(
                        "metrics: {m} is not a loopback address; the operations server \
                         (metrics, web view, queue API with message payloads) would be \
                         reachable from other hosts. Set ops_public = true (--ops-public) \
                         to allow it"
                    ),
                ));
            }
        }
        for host in &self.ops_allowed_hosts {
            // Compared with the name part of `Host`; addresses always pass.
            let plain = !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
            if !plain {
                return Err(Refusal::of(
                    "ops_allowed_hosts",
                    format!(
                        "ops_allowed_hosts: {host:?} is not a host name (no port, scheme or path)"
                    ),
                ));
            }
        }
        // Each is a file descriptor; far more than any host gives a process
        // is a mistake (and past 2^61 a panic in the connection cap).
        if !(1..=1_000_000).contains(&self.ops_max_connections) {
            return Err(Refusal::of(
                "ops_max_connections",
                "ops_max_connections must be between 1 and 1000000",
            ));
        }
        if self.admin_token.as_deref() == Some("") {
            return Err(Refusal::of(
                "admin_token",
                "admin_token is empty; leave it out to disable the actions",
            ));
        }
        if self.shared_connections == 0 {
            return Err(Refusal::of(
                "shared_connections",
                "shared_connections must be at least 1",
            ));
        }
        // Per login, so a few; each is a file descriptor here and a client
        // in Redis.
        if self.dedicated_pool > 1024 {
            return Err(Refusal::of(
                "dedicated_pool",
                "dedicated_pool must be at most 1024",
            ));
        }
        if self.limits.max_inline_len == 0 {
            return Err(Refusal::of(
                "limits.max_inline_len",
                "[limits] max_inline_len must be positive",
            ));
        }
        if self.limits.max_bulk_len == 0 {
            return Err(Refusal::of(
                "limits.max_bulk_len",
                "[limits] max_bulk_len must be positive",
            ));
        }
        for (i, rule) in self.queues.iter().enumerate() {
            let p = &rule.pattern;
            if p.is_empty() {
                return Err(Refusal::rule(
                    i,
                    "pattern",
                    "a [[queue]] rule has an empty pattern",
                ));
            }
            if rule.lease_ms == 0 {
                return Err(Refusal::rule(
                    i,
                    "lease_ms",
                    format!("queue {p:?}: lease_ms: must be positive"),
                ));
            }
            if rule.max_deliveries == 0 {
                return Err(Refusal::rule(
                    i,
                    "max_deliveries",
                    format!("queue {p:?}: max_deliveries: must be at least 1"),
                ));
            }
            if !(0.0..=1.0).contains(&rule.retry_jitter) {
                return Err(Refusal::rule(
                    i,
                    "retry_jitter",
                    format!("queue {p:?}: retry_jitter: must be between 0 and 1"),
                ));
            }
            if rule.retry_backoff != Backoff::None {
                if rule.retry_base_ms == 0 {
                    return Err(Refusal::rule(
                        i,
                        "retry_base_ms",
                        format!("queue {p:?}: retry_base_ms: must be positive with a backoff"),
                    ));
                }
                if rule.retry_max_ms < rule.retry_base_ms {
                    return Err(Refusal::rule(
                        i,
                        "retry_max_ms",
                        format!(
                            "queue {p:?}: retry_max_ms: must be at least retry_base_ms ({})",
                            rule.retry_base_ms
                        ),
                    ));
                }
            }
        }
        // A cluster's seeds, a list, are checked one by one below.
        if let Some(u) = self
            .upstream
            .as_ref()
            .filter(|_| self.upstream_mode != UpstreamMode::Cluster)
        {
            if let Err(why) = check_host_port(u) {
                return Err(Refusal::of(
                    "upstream",
                    format!("upstream: {why}, got {u:?}"),
                ));
            }
        }
        self.validate_sentinel()?;
        if self.threads == Some(0) {
            return Err(Refusal::of("threads", "threads must be at least 1"));
        }
        if self.runs_embedded() && self.embedded.persistence && self.embedded.dir.is_none() {
            // The default directory is removed at exit: the data would not
            // outlive a restart, which is all persistence is for.
            return Err(Refusal::of(
                "embedded.persistence",
                "[embedded] persistence needs a dir (--embedded-dir): \
                 the default directory is temporary and removed at exit",
            ));
        }
        Ok(())
    }

    /// What the rules' fields cannot show alone: a pattern that cannot mean
    /// what it says, a dead-letter list that is the queue itself, two rules
    /// for one key. Ok: warnings, of rules that overlap by design.
    fn check_rules(&self, at: &Origin) -> Result<Vec<String>, Refusal> {
        let rules = &self.queues;
        for (i, rule) in rules.iter().enumerate() {
            let p = &rule.pattern;
            if let Err(why) = check_glob(p) {
                return Err(Refusal::rule(
                    i,
                    "pattern",
                    format!("queue {p:?}: pattern: {why}"),
                ));
            }
            if let Some(dead) = &rule.dead_letter {
                if let Err(why) = check_dead_letter(p, dead) {
                    return Err(Refusal::rule(
                        i,
                        "dead_letter",
                        format!("queue {p:?}: dead_letter {dead:?}: {why}"),
                    ));
                }
            }
            if let Err(why) = check_signals(rule) {
                return Err(Refusal::rule(
                    i,
                    "done",
                    format!("queue {p:?}: done: {why}"),
                ));
            }
            if let Err((key, why)) = check_hold(rule) {
                return Err(Refusal::rule(i, key, format!("queue {p:?}: {key}: {why}")));
            }
            if let Some(first) = rules[..i].iter().position(|r| r.pattern == *p) {
                return Err(Refusal::rule(
                    i,
                    "pattern",
                    format!(
                        "queue {p:?}: pattern: the rule {} has the same pattern, and only \
                         the first of the two would apply; merge them",
                        at.rule_place(first),
                    ),
                ));
            }
        }
        let mut warnings = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            if let Some(dead) = rule
                .fixed_dead_letter()
                .filter(|_| rule.shares_dead_letter())
            {
                warnings.push(format!(
                    "{}queue {:?}: dead_letter {dead:?}: one list for every queue the glob \
                     matches, so QUEUE REDRIVE and QUEUE PURGE … DEAD refuse it (they cannot \
                     tell one queue's dead letters from another's); put $queue in the name to \
                     give each queue its own",
                    at.rule(i, "dead_letter"),
                    rule.pattern,
                ));
            }
            let fixed = rule.fixed_dead_letter();
            if let Some(first) = fixed.and_then(|d| {
                rules[..i]
                    .iter()
                    .position(|r| r.fixed_dead_letter() == Some(d))
            }) {
                warnings.push(format!(
                    "{}queue {:?}: dead_letter {:?}: also the dead-letter list of the rule {}, \
                     so QUEUE REDRIVE and QUEUE PURGE … DEAD refuse it for both; name a list \
                     of its own",
                    at.rule(i, "dead_letter"),
                    rule.pattern,
                    fixed.unwrap_or_default(),
                    at.rule_place(first),
                ));
            }
        }
        for (i, rule) in rules.iter().enumerate() {
            if rule.max_hold_ms.is_some() && !rule.holds() {
                warnings.push(format!(
                    "{}queue {:?}: max_hold_ms: has no effect without hold = \"connection\"",
                    at.rule(i, "max_hold_ms"),
                    rule.pattern,
                ));
            }
        }
        for (i, exact) in rules.iter().enumerate() {
            if is_glob(exact.pattern.as_bytes()) {
                continue;
            }
            for (j, glob) in rules.iter().enumerate() {
                if is_glob(glob.pattern.as_bytes())
                    && glob_match(glob.pattern.as_bytes(), exact.pattern.as_bytes())
                {
                    warnings.push(format!(
                        "{}queue {:?}: pattern: also matched by the glob {:?} of the rule {}; \
                         the exact rule applies to {:?} (an exact pattern wins over any glob)",
                        at.rule(i, "pattern"),
                        exact.pattern,
                        glob.pattern,
                        at.rule_place(j),
                        exact.pattern,
                    ));
                }
            }
        }
        Ok(warnings)
    }

    /// The sentinel settings: all of them in sentinel mode, none otherwise.
    fn validate_sentinel(&self) -> Result<(), Refusal> {
        for p in &self.cluster_announce {
            if let Err(why) = check_host_port(p) {
                return Err(Refusal::of(
                    "cluster_announce",
                    format!("cluster_announce: {why}, got {p:?}"),
                ));
            }
        }
        if self.upstream_mode == UpstreamMode::Cluster {
            return self.validate_cluster();
        }
        if self.upstream_mode == UpstreamMode::Direct {
            let set = [
                ("sentinel_master", self.sentinel_master.is_some()),
                ("sentinels", !self.sentinels.is_empty()),
                ("sentinel_user", self.sentinel_user.is_some()),
                ("sentinel_password", self.sentinel_password.is_some()),
                ("sentinel_tls", self.sentinel_tls),
            ];
            if let Some((key, _)) = set.iter().find(|(_, set)| *set) {
                return Err(Refusal::of(
                    key,
                    "sentinel_* settings need upstream_mode = \"sentinel\"",
                )
                .or("upstream_mode"));
            }
            return Ok(());
        }
        if self.upstream.is_some() {
            return Err(Refusal::of(
                "upstream",
                "upstream and upstream_mode = \"sentinel\" exclude each other: \
                 the sentinels name the primary",
            )
            .or("upstream_mode"));
        }
        if self.sentinel_master.as_deref().is_none_or(str::is_empty) {
            return Err(Refusal::of(
                "sentinel_master",
                "upstream_mode = \"sentinel\" needs sentinel_master, the name the \
                 sentinels monitor the primary under",
            )
            .or("upstream_mode"));
        }
        if self.sentinels.is_empty() {
            return Err(Refusal::of(
                "sentinels",
                "upstream_mode = \"sentinel\" needs sentinels, their host:port addresses",
            )
            .or("upstream_mode"));
        }
        for s in &self.sentinels {
            if let Err(why) = check_host_port(s) {
                return Err(Refusal::of(
                    "sentinels",
                    format!("sentinels: {why}, got {s:?}"),
                ));
            }
        }
        if self.sentinel_user.is_some() && self.sentinel_password.is_none() {
            return Err(Refusal::of(
                "sentinel_user",
                "sentinel_user needs sentinel_password",
            ));
        }
        Ok(())
    }

    /// Cluster mode: seeds to learn the cluster from, and every queue's keys
    /// in one hash slot.
    fn validate_cluster(&self) -> Result<(), Refusal> {
        if self.sentinel_master.is_some() || !self.sentinels.is_empty() {
            let key = if self.sentinel_master.is_some() {
                "sentinel_master"
            } else {
                "sentinels"
            };
            return Err(
                Refusal::of(key, "sentinel_* settings need upstream_mode = \"sentinel\"")
                    .or("upstream_mode"),
            );
        }
        let seeds = self.cluster_seeds();
        if seeds.is_empty() {
            return Err(Refusal::of(
                "upstream",
                "upstream_mode = \"cluster\" needs upstream, the host:port of one or more \
                 of the cluster's nodes (comma-separated)",
            )
            .or("upstream_mode"));
        }
        for s in &seeds {
            if let Err(why) = check_host_port(s) {
                return Err(Refusal::of(
                    "upstream",
                    format!("upstream: {why}, got {s:?}"),
                ));
            }
        }
        for (i, rule) in self.queues.iter().enumerate() {
            if let Some(template) = &rule.dead_letter {
                if !dead_letter_in_queue_slot(&rule.pattern, template) {
                    return Err(Refusal::rule(
                        i,
                        "dead_letter",
                        format!(
                            "queue {:?}: dead_letter {template:?} is not in the queue's hash \
                             slot for every queue the rule matches, and a Redis Cluster runs \
                             a queue's scripts on the node of that one slot. Leave \
                             dead_letter unset (the default list is always in the queue's \
                             slot), or give the list the queue's hash tag (for queue \
                             \"jobs\": \"{{jobs}}:dead\")",
                            rule.pattern
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Which TLS settings go together. Whether the files can be read and
    /// hold what they should is checked when they are loaded (`net::tls`).
    fn validate_tls(&self) -> Result<(), Refusal> {
        use std::net::ToSocketAddrs;
        match &self.tls_listen {
            Some(addr) => {
                if addr.to_socket_addrs().is_err() {
                    return Err(Refusal::of(
                        "tls_listen",
                        format!("tls_listen: {addr:?} is not a host:port address"),
                    ));
                }
                if self.tls_cert_file.is_none() || self.tls_key_file.is_none() {
                    return Err(Refusal::of(
                        "tls_listen",
                        "tls_listen needs tls_cert_file and tls_key_file",
                    ));
                }
                if self.tls_auth_clients != AuthClients::No && self.tls_ca_cert_file.is_none() {
                    return Err(Refusal::of(
                        "tls_auth_clients",
                        "tls_auth_clients (default \"yes\") needs tls_ca_cert_file, the CA \
                         client certificates are checked against; set tls_auth_clients = \"no\" \
                         to accept clients without one",
                    )
                    .or("tls_listen"));
                }
            }
            None => {
                if self.listen.is_empty() {
                    return Err(Refusal::of(
                        "listen",
                        "listen is empty and tls_listen is not set: no listener",
                    ));
                }
                let files = [
                    ("tls_cert_file", &self.tls_cert_file),
                    ("tls_key_file", &self.tls_key_file),
                    ("tls_ca_cert_file", &self.tls_ca_cert_file),
                ];
                if let Some((key, _)) = files.iter().find(|(_, f)| f.is_some()) {
                    return Err(Refusal::of(
                        key,
                        "tls_cert_file, tls_key_file and tls_ca_cert_file need tls_listen",
                    ));
                }
            }
        }
        if self.upstream_tls {
            if self.runs_embedded() {
                return Err(Refusal::of(
                    "upstream_tls",
                    "upstream_tls needs an upstream: the private redis-server \
                     speaks plain TCP",
                ));
            }
            if self.upstream_tls_ca_cert_file.is_none() {
                return Err(Refusal::of(
                    "upstream_tls",
                    "upstream_tls needs upstream_tls_ca_cert_file, the CA the \
                     upstream's certificate is checked against (the system's, e.g. \
                     /etc/ssl/certs/ca-certificates.crt, for a public one)",
                ));
            }
            if self.upstream_tls_cert_file.is_some() != self.upstream_tls_key_file.is_some() {
                return Err(Refusal::of(
                    "upstream_tls_cert_file",
                    "upstream_tls_cert_file and upstream_tls_key_file go together",
                )
                .or("upstream_tls_key_file"));
            }
        } else {
            let set = [
                (
                    "upstream_tls_ca_cert_file",
                    self.upstream_tls_ca_cert_file.is_some(),
                ),
                (
                    "upstream_tls_cert_file",
                    self.upstream_tls_cert_file.is_some(),
                ),
                (
                    "upstream_tls_key_file",
                    self.upstream_tls_key_file.is_some(),
                ),
                (
                    "upstream_tls_server_name",
                    self.upstream_tls_server_name.is_some(),
                ),
            ];
            if let Some((key, _)) = set.iter().find(|(_, set)| *set) {
                return Err(Refusal::of(
                    key,
                    "upstream_tls_* settings need upstream_tls = true",
                ));
            }
        }
        if self.sentinel_tls {
            if self.sentinel_tls_ca_cert_file.is_none() && self.upstream_tls_ca_cert_file.is_none()
            {
                return Err(Refusal::of(
                    "sentinel_tls",
                    "sentinel_tls needs sentinel_tls_ca_cert_file (or \
                     upstream_tls_ca_cert_file), the CA the sentinels' certificates \
                     are checked against",
                ));
            }
            if self.sentinel_tls_cert_file.is_some() != self.sentinel_tls_key_file.is_some() {
                return Err(Refusal::of(
                    "sentinel_tls_cert_file",
                    "sentinel_tls_cert_file and sentinel_tls_key_file go together",
                )
                .or("sentinel_tls_key_file"));
            }
        } else {
            let set = [
                (
                    "sentinel_tls_ca_cert_file",
                    self.sentinel_tls_ca_cert_file.is_some(),
                ),
                (
                    "sentinel_tls_cert_file",
                    self.sentinel_tls_cert_file.is_some(),
                ),
                (
                    "sentinel_tls_key_file",
                    self.sentinel_tls_key_file.is_some(),
                ),
                (
                    "sentinel_tls_server_name",
                    self.sentinel_tls_server_name.is_some(),
                ),
            ];
            if let Some((key, _)) = set.iter().find(|(_, set)| *set) {
                return Err(Refusal::of(
                    key,
                    "sentinel_tls_* settings need sentinel_tls = true",
                ));
            }
        }
        Ok(())
    }
}

/// What a check refuses, and the settings it is about: the message points
/// at the first of them that the command line, the environment or the
/// file gave (a default is written nowhere). Every refusal is one of
/// these, so that none can leave out where.
pub(super) struct Refusal {
    keys: Vec<Key>,
    message: String,
}

#[derive(Clone, Copy)]
enum Key {
    /// A top-level setting, or a table's as `table.key`.
    Setting(&'static str),
    /// A key of the i-th queue rule (its pattern's line when unset).
    Rule(usize, &'static str),
}

impl Refusal {
    fn of(key: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            keys: vec![Key::Setting(key)],
            message: message.into(),
        }
    }

    fn rule(i: usize, key: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            keys: vec![Key::Rule(i, key)],
            message: message.into(),
        }
    }

    /// Another setting to point at, when the ones before were not given.
    fn or(mut self, key: &'static str) -> Refusal {
        self.keys.push(Key::Setting(key));
        self
    }
}

/// Where a configuration was written, for messages to point at: the file
/// (name and text) and the settings the command line or the environment
/// gave instead.
#[derive(Default)]
pub(super) struct Origin<'a> {
    pub(super) file: Option<&'a str>,
    pub(super) text: Option<&'a str>,
    /// Setting → the flag or variable that gave it.
    pub(super) given: Vec<(&'static str, String)>,
    /// Where the queue rules came from instead of the file, and their text.
    pub(super) rules: Option<(&'a str, &'a str)>,
}

impl Origin<'_> {
    /// Where the rules were written: this, or the flag or variable that
    /// gave them in place of the file's.
    fn of_rules(&self) -> Origin<'_> {
        match self.rules {
            Some((from, text)) => Origin {
                file: Some(from),
                text: Some(text),
                ..Origin::default()
            },
            None => Origin {
                file: self.file,
                text: self.text,
                ..Origin::default()
            },
        }
    }

    /// The line (from 1) setting `key`: at the top level (`limits.maxclients`
    /// in a table), or in the `rule`-th `[[queue]]` table.
    fn line(&self, rule: Option<usize>, key: &str) -> Option<usize> {
        let text = self.text?;
        let doc = toml::de::DeTable::parse(text).ok()?;
        let doc = doc.get_ref();
        let value = match rule {
            None => {
                let mut parts = key.split('.');
                let mut value = doc.get(parts.next()?)?;
                for part in parts {
                    value = value.get_ref().get(part)?;
                }
                value
            }
            Some(i) => doc.get("queue")?.get_ref().get(i)?.get_ref().get(key)?,
        };
        Some(text[..value.span().start].matches('\n').count() + 1)
    }

    fn place(&self, line: Option<usize>) -> Option<String> {
        let line = line?;
        Some(match self.file {
            Some(f) => format!("{f}:{line}"),
            None => format!("line {line}"),
        })
    }

    /// `file:line: ` of a rule's `key` (its pattern's line without it), to
    /// start a message with; empty when unknown.
    fn rule(&self, i: usize, key: &str) -> String {
        let at = self.of_rules();
        at.place(at.line(Some(i), key).or(at.line(Some(i), "pattern")))
            .map(|p| format!("{p}: "))
            .unwrap_or_default()
    }

    /// A rule by where it is: `at file:line`, or by number.
    fn rule_place(&self, i: usize) -> String {
        let at = self.of_rules();
        at.place(at.line(Some(i), "pattern"))
            .map(|p| format!("at {p}"))
            .unwrap_or_else(|| format!("number {}", i + 1))
    }

    /// The refusal's message, starting with where its setting was written
    /// (`file:line: `), or ending with the flag or variable that gave it.
    pub(super) fn locate(&self, refusal: Refusal) -> String {
        let message = refusal.message;
        for key in refusal.keys {
            match key {
                Key::Setting(key) => {
                    if let Some((_, by)) = self.given.iter().find(|(k, _)| *k == key) {
                        return format!("{message} (from {by})");
                    }
                    if let Some(p) = self.place(self.line(None, key)) {
                        return format!("{p}: {message}");
                    }
                }
                Key::Rule(i, key) => return format!("{}{message}", self.rule(i, key)),
            }
        }
        message
    }
}

/// Whether the dead-letter list `template` (`$queue`: the queue's name) is
/// in the hash slot of each queue `pattern` matches. For a glob, checked on
/// names made from it, with and without a hash tag of their own: a list
/// that passes for all of them passes for any name.
fn dead_letter_in_queue_slot(pattern: &str, template: &str) -> bool {
    use crate::keyslot::key_slot;
    let names: Vec<String> = if is_glob(pattern.as_bytes()) {
        ["a", "jobs", "{t}x", "x{u}", "b}c", "{}d"]
            .iter()
            .map(|fill| {
                let mut name = String::new();
                let mut chars = pattern.chars();
                while let Some(c) = chars.next() {
                    match c {
                        '*' | '?' => name.push_str(fill),
                        '[' => {
                            // A class stands for one of its characters.
                            let class: String = chars.by_ref().take_while(|c| *c != ']').collect();
                            name.push(class.chars().find(|c| *c != '^').unwrap_or('a'));
                        }
                        '\\' => name.extend(chars.next()),
                        c => name.push(c),
                    }
                }
                name
            })
            .collect()
    } else {
        vec![pattern.to_string()]
    };
    names.iter().all(|q| {
        let dead = template.replace("$queue", q);
        key_slot(dead.as_bytes()) == key_slot(q.as_bytes())
    })
}

/// `host:port`, as the upstream is connected to (resolved only then).
fn check_host_port(addr: &str) -> Result<(), String> {
    let expected = "expected host:port";
    if addr.contains("://") {
        return Err(format!("{expected} (not a URL)"));
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(expected.into());
    };
    if host.is_empty() || !port.parse::<u16>().is_ok_and(|p| p != 0) {
        return Err(expected.into());
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(format!(
            "{expected}, an IPv6 address in brackets ([::1]:6379)"
        ));
    }
    Ok(())
}

/// Whether a pattern is a glob, as the rules tell (`queue::rules`).
/// What a held rule needs: a lease the proxy can renew in time, and a
/// bound within the one on every duration. Err: the key at fault and why.
fn check_hold(rule: &QueueRule) -> Result<(), (&'static str, String)> {
    if !rule.holds() {
        return Ok(());
    }
    if rule.lease_ms < MIN_HELD_LEASE_MS {
        return Err((
            "lease_ms",
            format!(
                "must be at least {MIN_HELD_LEASE_MS} with hold = \"connection\" (the proxy \
                 renews held leases every lease_ms / 3), got {}",
                rule.lease_ms
            ),
        ));
    }
    let max = rule.max_hold_ms();
    if max < rule.lease_ms || max > MAX_DURATION_MS {
        return Err((
            "max_hold_ms",
            format!(
                "must be between lease_ms ({}) and {MAX_DURATION_MS} (30 days), got {max}",
                rule.lease_ms
            ),
        ));
    }
    Ok(())
}

/// Whether each completion signal of `rule` names the queue whose lease
/// it ends: an exact rule names it itself; under a glob rule with one
/// `*`, the `*` of a signal's key stands for the rule's.
fn check_signals(rule: &QueueRule) -> Result<(), String> {
    let pattern = rule.pattern.as_bytes();
    if !is_glob(pattern) {
        return Ok(());
    }
    let one_star = pattern.iter().filter(|&&b| b == b'*').count() == 1
        && !pattern.iter().any(|b| matches!(b, b'?' | b'[' | b'\\'));
    for s in &rule.done {
        if !one_star || s.command.id_in_key() || !s.key.contains('*') {
            return Err(format!(
                "\"{} {}\" does not say which queue of the glob {:?} it is about: a glob \
                 rule's signal must be a command whose members are the ids, on a key whose \
                 `*` stands for the rule's one `*` (\"ZADD rq:finished:*\" for \"rq:queue:*\"); \
                 or write one rule per queue",
                s.command.name(),
                s.key,
                rule.pattern
            ));
        }
    }
    Ok(())
}

/// A dead-letter list that is the queue itself: its dead letters would be
/// popped again at once, and never stay dead. `$queue` stands for the
/// queue's name.
pub fn check_dead_letter(pattern: &str, dead_letter: &str) -> Result<(), String> {
    let itself = "the dead-letter list is the queue itself: dead letters would be \
                  popped again at once; leave dead_letter out for the default \
                  (\"{queue}:dead\") or name another list";
    if !is_glob(pattern.as_bytes()) {
        if dead_letter.replace("$queue", pattern) == pattern {
            return Err(itself.into());
        }
    } else if dead_letter == "$queue" {
        return Err(itself.into());
    } else if !dead_letter.contains("$queue")
        && glob_match(pattern.as_bytes(), dead_letter.as_bytes())
    {
        // The one list all the queues' dead letters go to is one of them.
        return Err(format!(
            "for the queue {dead_letter:?}, which the pattern matches, {itself}"
        ));
    }
    Ok(())
}
