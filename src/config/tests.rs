use clap::Parser;

use super::cli::name_env_source;
use super::*;

/// Each framework's ready file is a valid configuration with no warning,
/// and those with rules name the signals their framework writes.
#[test]
fn framework_configs_parse() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config/frameworks");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let (cfg, warnings) = Config::from_toml_with_warnings(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(warnings.is_empty(), "{}: {warnings:?}", path.display());
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        match name.as_str() {
            "bull" | "sidekiq" => assert!(cfg.queues.is_empty(), "{name}"),
            "hotqueue" => assert_eq!(cfg.queues[0].ack, AckPolicy::NextPop),
            "bee-queue" => assert!(cfg.queues[0].lrem_acks),
            _ => assert!(!cfg.queues[0].done.is_empty(), "{name}"),
        }
        names.push(name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "bee-queue",
            "bull",
            "celery",
            "celery-acks-late",
            "hotqueue",
            "rq",
            "sidekiq"
        ]
    );
}

#[test]
fn example_config_parses() {
    let text = include_str!("../../config/ackproxy.toml");
    let cfg = Config::from_toml(text).expect("example config is valid");
    assert!(!cfg.queues.is_empty());
    // The file says the values it shows are the defaults.
    let (l, d) = (&cfg.limits, LimitsConfig::default());
    assert_eq!(
        (
            l.max_bulk_len,
            l.max_array_len,
            l.max_inline_len,
            l.maxclients
        ),
        (
            d.max_bulk_len,
            d.max_array_len,
            d.max_inline_len,
            d.maxclients
        )
    );
    assert_eq!(
        (
            l.client_output_buffer_limit,
            l.max_inflight_per_client,
            l.idle_timeout_secs
        ),
        (
            d.client_output_buffer_limit,
            d.max_inflight_per_client,
            d.idle_timeout_secs
        )
    );
    assert_eq!(
        cfg.user_connections_max,
        Config::default().user_connections_max
    );
    assert_eq!(cfg.requirepass, None);
    let d = Config::default();
    assert_eq!(
        (&cfg.ops_allowed_hosts, cfg.ops_max_connections),
        (&d.ops_allowed_hosts, d.ops_max_connections)
    );
    let r = ReaperConfig::default();
    assert_eq!(
        (cfg.reaper.interval_ms, cfg.reaper.batch),
        (r.interval_ms, r.batch)
    );
}

#[test]
fn unknown_keys_and_bad_ack_ids_are_rejected() {
    assert!(Config::from_toml("listn = \"x\"").is_err());
    let bad = "[[queue]]\npattern = \"q\"\nack_id = \"xml:id\"\n";
    let err = Config::from_toml(bad).unwrap_err();
    assert!(err.contains("ack_id"), "{err}");
}

#[test]
fn bad_addresses_are_rejected() {
    assert!(Config::from_toml("listen = \"not-an-addr\"").is_err());
    assert!(Config::from_toml("metrics = \"nope\"").is_err());
    let public = Config::from_toml("metrics = \"0.0.0.0:7380\"").unwrap_err();
    assert!(public.contains("ops_public"), "{public}");
    assert!(Config::from_toml("metrics = \"[::1]:7380\"").is_ok());
    assert!(Config::from_toml("metrics = \"0.0.0.0:7380\"\nops_public = true").is_ok());
    assert!(Config::from_toml("listen = \"127.0.0.1:7000\"").is_ok());
}

#[test]
fn operations_limits_and_host_names_are_checked() {
    let cfg = Config::from_toml(
        "metrics = \"0.0.0.0:7380\"\nops_public = true\n\
         ops_allowed_hosts = [\"ops.example.com\", \"ops-2.internal\"]\n\
         ops_max_connections = 8\n",
    )
    .unwrap();
    assert_eq!(cfg.ops_max_connections, 8);
    let s = cfg.summary();
    assert!(
        s.contains("hosts IP addresses, localhost, ops.example.com, ops-2.internal"),
        "{s}"
    );
    assert!(s.contains("at most 8 connections"), "{s}");
    let open = Config::from_toml("metrics = \"0.0.0.0:7380\"\nops_public = true\n").unwrap();
    assert!(open.summary().contains("hosts any"), "{}", open.summary());
    let local = Config::from_toml("metrics = \"127.0.0.1:7380\"\nops_public = true\n").unwrap();
    assert!(
        local
            .summary()
            .contains("hosts IP addresses and localhost,"),
        "{}",
        local.summary()
    );
    for bad in ["ops.example.com:443", "https://ops.example.com", "", "a b"] {
        let err = Config::from_toml(&format!("ops_allowed_hosts = [{bad:?}]")).unwrap_err();
        assert!(err.contains("ops_allowed_hosts"), "{bad}: {err}");
    }
    for bad in ["0", "1000001", "4611686018427387904"] {
        let err = Config::from_toml(&format!("ops_max_connections = {bad}")).unwrap_err();
        assert!(err.contains("ops_max_connections"), "{bad}: {err}");
    }
}

#[test]
fn tls_settings_that_go_together() {
    let listener = "tls_listen = \"127.0.0.1:6381\"\n\
                    tls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"\n";
    let err = |toml: &str| Config::from_toml(toml).unwrap_err();
    // As Redis: client certificates are required by default, so a CA is.
    assert!(err(listener).contains("tls_ca_cert_file"));
    let cfg = Config::from_toml(&format!("{listener}tls_auth_clients = \"no\"\n")).unwrap();
    assert_eq!(cfg.tls_auth_clients, AuthClients::No);
    let cfg = Config::from_toml(&format!(
        "{listener}tls_ca_cert_file = \"ca.pem\"\ntls_auth_clients = \"optional\"\n"
    ))
    .unwrap();
    assert_eq!(cfg.tls_auth_clients, AuthClients::Optional);
    assert!(err("tls_listen = \"127.0.0.1:6381\"\n").contains("tls_cert_file"));
    assert!(err("tls_cert_file = \"c.pem\"\n").contains("need tls_listen"));
    assert!(err("listen = \"\"\n").contains("no listener"));
    let tls_only = format!("listen = \"\"\n{listener}tls_auth_clients = \"no\"\n");
    assert!(Config::from_toml(&tls_only).is_ok());

    let upstream = "upstream = \"127.0.0.1:6379\"\nupstream_tls = true\n";
    assert!(err(upstream).contains("upstream_tls_ca_cert_file"));
    let with_ca = format!("{upstream}upstream_tls_ca_cert_file = \"ca.pem\"\n");
    assert!(Config::from_toml(&with_ca).is_ok());
    assert!(err(&format!("{with_ca}upstream_tls_cert_file = \"c.pem\"\n")).contains("go together"));
    // The private redis-server speaks plain text only.
    assert!(
        err("upstream_tls = true\nupstream_tls_ca_cert_file = \"ca.pem\"\n")
            .contains("needs an upstream")
    );
    assert!(err("upstream_tls_ca_cert_file = \"ca.pem\"\n").contains("upstream_tls = true"));
}

#[test]
fn the_client_password_is_shown_as_set_only() {
    let cfg = Config::from_toml("requirepass = \"hunter2\"\nuser_connections_max = 3\n").unwrap();
    assert_eq!(cfg.client_password(), Some("hunter2"));
    let summary = cfg.summary();
    assert!(!summary.contains("hunter2"), "{summary}");
    assert!(summary.contains("client password     set"), "{summary}");
    assert!(summary.contains("up to 3"), "{summary}");
    let empty = Config::from_toml("requirepass = \"\"\n").unwrap();
    assert_eq!(empty.client_password(), None);
    assert_eq!(Config::default().user_connections_max, 64);
}

#[test]
fn summary_says_the_admin_token_is_set_never_its_value() {
    let cfg =
        Config::from_toml("metrics = \"127.0.0.1:7380\"\nadmin_token = \"s3cret-t0ken\"").unwrap();
    let s = cfg.summary();
    assert!(s.contains("admin token         set"), "{s}");
    assert!(s.contains("loopback only"), "{s}");
    assert!(!s.contains("s3cret-t0ken"), "{s}");
    assert!(Config::from_toml("admin_token = \"\"").is_err());
}

#[test]
fn queue_rule_defaults() {
    let cfg = Config::from_toml("[[queue]]\npattern = \"jobs\"\n").unwrap();
    let q = &cfg.queues[0];
    assert_eq!(q.lease_ms, 30_000);
    assert_eq!(q.max_deliveries, 5);
    assert_eq!(q.ack_id, AckId::Payload);
    assert_eq!(q.redeliver, Redeliver::Next);
    assert_eq!(q.pop_end, End::Right);
    assert_eq!(q.retry_backoff, Backoff::None);
    assert_eq!(q.ack, AckPolicy::Explicit);
    assert!(!q.tracks_connections());
    let next = Config::from_toml("[[queue]]\npattern = \"q\"\nack = \"next-pop\"\n").unwrap();
    assert!(next.queues[0].tracks_connections());
    assert!(Config::from_toml("[[queue]]\npattern = \"q\"\nack = \"never\"\n").is_err());
}

#[test]
fn held_rules_are_checked_where_they_are_written() {
    let rule = |extra: &str| {
        Config::from_toml_with_warnings(&format!("[[queue]]\npattern = \"q\"\n{extra}"))
    };
    let (cfg, warnings) = rule("hold = \"connection\"\nlease_ms = 1000\n").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let q = &cfg.queues[0];
    assert!(q.holds() && q.requeues_on_disconnect() && q.tracks_connections());
    assert!(!q.requeue_on_disconnect);
    assert_eq!(q.max_hold_ms(), DEFAULT_MAX_HOLD_MS);
    assert_eq!(q.poison_after, 3);
    let plain = &Config::from_toml("[[queue]]\npattern = \"q\"\n")
        .unwrap()
        .queues[0];
    assert!(!plain.holds() && !plain.requeues_on_disconnect());
    let e = rule("hold = \"connection\"\nlease_ms = 100\n").unwrap_err();
    assert!(
        e.starts_with("line 4: queue \"q\": lease_ms: must be at least 300"),
        "{e}"
    );
    let e = rule("hold = \"connection\"\nlease_ms = 1000\nmax_hold_ms = 500\n").unwrap_err();
    assert!(
        e.starts_with("line 5: queue \"q\": max_hold_ms: must be between lease_ms (1000)"),
        "{e}"
    );
    // The one bound on every duration; the default (an hour) below a
    // longer lease is named at the rule's pattern.
    let e = rule("hold = \"connection\"\nmax_hold_ms = 2592000001\n").unwrap_err();
    assert!(e.starts_with("line 4: queue \"q\": max_hold_ms:"), "{e}");
    assert!(
        e.contains("and 2592000000 (30 days), got 2592000001"),
        "{e}"
    );
    let e = rule("hold = \"connection\"\nlease_ms = 7200000\n").unwrap_err();
    assert!(e.starts_with("line 2: queue \"q\": max_hold_ms:"), "{e}");
    assert!(rule("hold = \"connection\"\nmax_hold_ms = 2592000000\n").is_ok());
    assert!(rule("hold = \"forever\"\n").is_err());
    // Accepted, but it says nothing without hold.
    let (_, warnings) = rule("max_hold_ms = 5000\n").unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("line 3: queue \"q\": max_hold_ms: has no effect"),
        "{}",
        warnings[0]
    );
}

#[test]
fn retry_policies_are_checked() {
    let rule = |extra: &str| Config::from_toml(&format!("[[queue]]\npattern = \"q\"\n{extra}"));
    assert!(rule("retry_backoff = \"exp\"\nretry_base_ms = 100\nretry_max_ms = 800\n").is_ok());
    assert!(rule("retry_backoff = \"fixed\"\nretry_base_ms = 0\n").is_err());
    assert!(rule("retry_backoff = \"exp\"\nretry_base_ms = 100\nretry_max_ms = 50\n").is_err());
    assert!(rule("retry_jitter = 1.5\n").is_err());
    assert!(rule("retry_backoff = \"linear\"\n").is_err());
}

fn dead_letter_rule(pattern: &str, dead: &str) -> Result<Config, String> {
    Config::from_toml(&format!(
        "[[queue]]\npattern = {pattern:?}\ndead_letter = {dead:?}\n"
    ))
}

#[test]
fn a_dead_letter_list_that_is_the_queue_is_refused() {
    let err = dead_letter_rule("jobs", "jobs").unwrap_err();
    assert!(
        err.starts_with("line 3: queue \"jobs\": dead_letter"),
        "{err}"
    );
    assert!(err.contains("the queue itself"), "{err}");
    // `$queue` resolving to the queue's name, for an exact rule or any
    // queue of a glob.
    assert!(dead_letter_rule("jobs", "$queue").is_err());
    assert!(dead_letter_rule("tasks:*", "$queue").is_err());
    // One list for all the glob's queues that the glob matches: for
    // that queue it is itself.
    let err = dead_letter_rule("tasks:*", "tasks:dead").unwrap_err();
    assert!(err.contains("for the queue \"tasks:dead\""), "{err}");
    for (pattern, dead) in [
        ("jobs", "jobs:dead"),
        ("jobs", "$queue:dead"),
        ("jobs", "dlq:$queue"),
        ("tasks:*", "$queue:dead"),
        ("tasks:*", "dead:tasks"),
        ("tasks:*", "{tasks}:dead"),
    ] {
        assert!(dead_letter_rule(pattern, dead).is_ok(), "{pattern} {dead}");
    }
}

fn pattern_rule(pattern: &str) -> Result<Config, String> {
    Config::from_toml(&format!("# rules\n[[queue]]\npattern = {pattern:?}\n"))
}

#[test]
fn an_unclosed_bracket_is_refused() {
    let err = pattern_rule("jobs[").unwrap_err();
    assert!(
        err.starts_with("line 3: queue \"jobs[\": pattern: "),
        "{err}"
    );
    assert!(err.contains("the [ at character 5 is not closed"), "{err}");
    assert!(err.contains("match no key"), "{err}");
    let err = pattern_rule("jobs[12").unwrap_err();
    assert!(err.contains("one class"), "{err}");
    // `]` ends the range `a-]`; `\]` is a literal `]`; `[]` is empty.
    for bad in ["x[^", "[a-]", "q[\\]", "q[]", "[]]", "a[\\"] {
        assert!(pattern_rule(bad).is_err(), "{bad}");
    }
    for good in [
        "jobs", "q[0-9]", "q[^0-9]x", "a\\[", "[\\]]", "[^]", "q[a-]]", "[z-a]", "a\\", "*",
    ] {
        assert!(pattern_rule(good).is_ok(), "{good}");
    }
}

#[test]
fn the_same_pattern_twice_is_refused() {
    let twice = "[[queue]]\npattern = \"jobs\"\n\n[[queue]]\npattern = \"jobs\"\nlease_ms = 5\n";
    let err = Config::from_toml(twice).unwrap_err();
    assert!(
        err.starts_with("line 5: queue \"jobs\": pattern: "),
        "{err}"
    );
    assert!(
        err.contains("the rule at line 2 has the same pattern"),
        "{err}"
    );
    let globs = "[[queue]]\npattern = \"t:*\"\n[[queue]]\npattern = \"t:*\"\n";
    assert!(Config::from_toml(globs).is_err());
}

#[test]
fn an_exact_rule_a_glob_also_matches_is_warned_about() {
    let text = "[[queue]]\npattern = \"jobs*\"\n[[queue]]\npattern = \"jobs\"\n\
                [[queue]]\npattern = \"other\"\n[[queue]]\npattern = \"jobs:*\"\n";
    let (cfg, warnings) = Config::from_toml_with_warnings(text).unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let w = &warnings[0];
    assert!(w.starts_with("line 4: queue \"jobs\": pattern: "), "{w}");
    assert!(w.contains("glob \"jobs*\" of the rule at line 2"), "{w}");
    // The precedence the warning and docs/configuration.md state is the one the
    // rules follow: the exact rule, then the first glob in file order.
    let rules = crate::queue::rules::Rules::new(&cfg.queues);
    let rule_of = |key: &[u8]| rules.resolve(key).unwrap().rule.pattern.clone();
    assert_eq!(rule_of(b"jobs"), "jobs");
    assert_eq!(rule_of(b"jobs2"), "jobs*");
    assert_eq!(rule_of(b"jobs:a"), "jobs*");
    let (_, none) = Config::from_toml_with_warnings("[[queue]]\npattern = \"jobs\"\n").unwrap();
    assert!(none.is_empty());
}

#[test]
fn a_shared_dead_letter_list_is_warned_about() {
    let text = "[[queue]]\npattern = \"t:*\"\ndead_letter = \"t-dead\"\n\
                [[queue]]\npattern = \"a\"\ndead_letter = \"ab-dead\"\n\
                [[queue]]\npattern = \"b\"\ndead_letter = \"ab-dead\"\n\
                [[queue]]\npattern = \"u:*\"\ndead_letter = \"dead:$queue\"\n";
    let (_, warnings) = Config::from_toml_with_warnings(text).unwrap();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].starts_with("line 3: queue \"t:*\": dead_letter \"t-dead\": one list"),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[1].starts_with("line 9: queue \"b\": dead_letter \"ab-dead\": also")
            && warnings[1].contains("of the rule at line 5"),
        "{}",
        warnings[1]
    );
}

#[test]
fn upstream_needs_host_and_port() {
    let err = Config::from_toml("upstream = \"nohost\"\n").unwrap_err();
    assert_eq!(err, "line 1: upstream: expected host:port, got \"nohost\"");
    for bad in [
        "nohost:",
        ":6379",
        "host:0",
        "host:port",
        "redis://h:6379",
        "::1",
    ] {
        assert!(
            Config::from_toml(&format!("upstream = {bad:?}")).is_err(),
            "{bad}"
        );
    }
    for good in ["127.0.0.1:6379", "redis.internal:6379", "[::1]:6379"] {
        assert!(
            Config::from_toml(&format!("upstream = {good:?}")).is_ok(),
            "{good}"
        );
    }
}

#[test]
fn threads_must_be_at_least_one() {
    let err = Config::from_toml("listen = \"127.0.0.1:6380\"\nthreads = 0\n").unwrap_err();
    assert_eq!(err, "line 2: threads must be at least 1");
    assert!(Config::from_toml("threads = 2").is_ok());
    let e = Cli::try_parse_from(["ackproxy", "--threads", "0"]).unwrap_err();
    assert!(e.to_string().contains("threads must be at least 1"), "{e}");
    assert_eq!(
        Cli::try_parse_from(["ackproxy", "--threads", "4"])
            .unwrap()
            .threads,
        Some(4)
    );
}

#[test]
fn a_bad_value_from_the_environment_names_the_variable() {
    use std::ffi::OsString;
    let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
    let env = |var: &str| (var == "ACKPROXY_THREADS").then(|| OsString::from("x"));
    let error = || Cli::try_parse_from(["ackproxy", "--threads", "x"]).unwrap_err();
    // On the command line the flag wins over the variable: it is named.
    let mut e = error();
    name_env_source(&mut e, &args(&["ackproxy", "--threads=x"]), env);
    assert!(e.to_string().contains("'--threads <THREADS>'"), "{e}");
    // Only in the environment: the variable.
    let mut e = error();
    name_env_source(&mut e, &args(&["ackproxy", "--check-config"]), env);
    let text = e.to_string();
    assert!(text.contains("for 'ACKPROXY_THREADS'"), "{text}");
    assert!(!text.contains("--threads"), "{text}");
    // The variable holds something else: the flag gave the value.
    let mut e = error();
    name_env_source(&mut e, &args(&["ackproxy"]), |_| Some("2".into()));
    assert!(e.to_string().contains("'--threads <THREADS>'"), "{e}");
    // Values checked against a list (ValueEnum) too.
    let mut e = Cli::try_parse_from(["ackproxy", "--log-format", "xml"]).unwrap_err();
    name_env_source(&mut e, &args(&["ackproxy"]), |var| {
        (var == "ACKPROXY_LOG_FORMAT").then(|| "xml".into())
    });
    assert!(e.to_string().contains("'ACKPROXY_LOG_FORMAT'"), "{e}");
}

#[test]
fn reload_names_what_changed() {
    let old = Config::from_toml("[limits]\nmaxclients = 10\n").unwrap();
    let new = Config::from_toml(
        "listen = \"127.0.0.1:7000\"\nupstream_password = \"p\"\n\
         [reaper]\nbatch = 5\n[limits]\nmaxclients = 20\nidle_timeout_secs = 3\n\
         [[queue]]\npattern = \"q\"\n",
    )
    .unwrap();
    // Credentials, limits and rules reload; the rest waits for a restart.
    assert_eq!(old.restart_only_changes(&new), ["listen", "reaper"]);
    assert_eq!(
        old.limits.changes(&new.limits),
        ["maxclients", "idle_timeout_secs"]
    );
    assert!(old.restart_only_changes(&old.clone()).is_empty());
}

/// Every refusal starts with the line of the setting it is about, and
/// names the key: also those (`listen`, `lease_ms`, `max_deliveries`, …)
/// whose checks once built their messages without asking where.
#[test]
fn every_refusal_names_its_line_and_key() {
    let rule = "# rules\n[[queue]]\npattern = \"q\"\n";
    let tls = "tls_listen = \"127.0.0.1:6381\"\ntls_cert_file = \"c\"\ntls_key_file = \"k\"\n";
    let cases: Vec<(String, &str)> = vec![
        ("# a\nlisten = \"not-an-addr\"\n".into(), "line 2: listen: "),
        (
            format!("{rule}lease_ms = 0\n"),
            "line 4: queue \"q\": lease_ms: ",
        ),
        (
            format!("{rule}max_deliveries = 0\n"),
            "line 4: queue \"q\": max_deliveries: ",
        ),
        (
            format!("{rule}retry_jitter = 2.0\n"),
            "line 4: queue \"q\": retry_jitter: ",
        ),
        (
            format!("{rule}retry_backoff = \"exp\"\nretry_base_ms = 0\n"),
            "line 5: queue \"q\": retry_base_ms: ",
        ),
        (
            format!("{rule}retry_backoff = \"exp\"\nretry_max_ms = 10\n"),
            "line 5: queue \"q\": retry_max_ms: ",
        ),
        (
            "[[queue]]\npattern = \"\"\n".into(),
            "line 2: a [[queue]] rule",
        ),
        ("\nmetrics = \"nope\"\n".into(), "line 2: metrics: "),
        ("\nmetrics = \"0.0.0.0:1\"\n".into(), "line 2: metrics: "),
        (
            "\nops_allowed_hosts = [\"a:1\"]\n".into(),
            "line 2: ops_allowed_hosts: ",
        ),
        (
            "\nops_max_connections = 0\n".into(),
            "line 2: ops_max_connections ",
        ),
        ("\nadmin_token = \"\"\n".into(), "line 2: admin_token "),
        (
            "\nshared_connections = 0\n".into(),
            "line 2: shared_connections ",
        ),
        (
            "\ndedicated_pool = 5000\n".into(),
            "line 2: dedicated_pool ",
        ),
        (
            "[limits]\nmax_bulk_len = 0\n".into(),
            "line 2: [limits] max_bulk_len ",
        ),
        (
            "[limits]\n\nmax_inline_len = 0\n".into(),
            "line 3: [limits] max_inline_len ",
        ),
        (
            "[embedded]\npersistence = true\n".into(),
            "line 2: [embedded] persistence ",
        ),
        (
            "\ncluster_announce = [\"x\"]\n".into(),
            "line 2: cluster_announce: ",
        ),
        (
            "\nsentinels = [\"a:1\"]\n".into(),
            "line 2: sentinel_* settings",
        ),
        (
            "upstream_mode = \"sentinel\"\n\nsentinels = [\"a:1\"]\n".into(),
            "line 1: upstream_mode = \"sentinel\" needs sentinel_master",
        ),
        (
            "upstream_mode = \"cluster\"\n".into(),
            "line 1: upstream_mode = \"cluster\" needs upstream",
        ),
        (format!("\n{tls}"), "line 2: tls_auth_clients "),
        ("\nlisten = \"\"\n".into(), "line 2: listen is empty"),
        ("\ntls_key_file = \"k\"\n".into(), "line 2: tls_cert_file, "),
        (
            "upstream = \"h:1\"\n\nupstream_tls_server_name = \"x\"\n".into(),
            "line 3: upstream_tls_* ",
        ),
        (
            "upstream = \"h:1\"\n\nupstream_tls = true\n".into(),
            "line 3: upstream_tls needs",
        ),
        ("\nthreads = 0\n".into(), "line 2: threads "),
    ];
    for (text, want) in cases {
        let err = Config::from_toml(&text).unwrap_err();
        assert!(err.starts_with(want), "{text:?}: {err}");
    }
}

#[test]
fn a_mistyped_key_gets_the_nearest_known_one() {
    let err = |text: &str| Config::from_toml(text).unwrap_err();
    assert_eq!(
        err("\nlistn = \"x\"\n"),
        "line 2: listn: unknown key, did you mean `listen`?"
    );
    assert_eq!(
        err("[limits]\nmaxclient = 3\n"),
        "line 2: limits.maxclient: unknown key, did you mean `maxclients`?"
    );
    assert_eq!(
        err("[[queue]]\npattern = \"a\"\n[[queue]]\npatern = \"b\"\n"),
        "line 4: queue.patern: unknown key, did you mean `pattern`?"
    );
    assert_eq!(
        err("[[queue]]\npattern = \"a\"\nmax_delivery = 3\n"),
        "line 3: queue.max_delivery: unknown key, did you mean `max_deliveries`?"
    );
    assert_eq!(
        err("[limits]\nidle_timeout = 3\n"),
        "line 2: limits.idle_timeout: unknown key, did you mean `idle_timeout_secs`?"
    );
    // Nothing close: no guess, and not the whole list either.
    let far = err("frobnicate = 1\n");
    assert!(
        far.starts_with("line 1: frobnicate: unknown key ("),
        "{far}"
    );
    assert!(
        !far.contains("did you mean") && !far.contains("listen"),
        "{far}"
    );
    use super::parse_error::edit_distance;
    assert_eq!(edit_distance("listn", "listen"), 1);
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(edit_distance("same", "same"), 0);
}

#[test]
fn one_table_and_an_array_of_tables_are_told_apart() {
    let err = Config::from_toml("# rules\n[queue]\npattern = \"a\"\n").unwrap_err();
    assert_eq!(
        err,
        "line 2: queue: `[queue]` is one table; queue rules are an array of tables: \
         write `[[queue]]`"
    );
    for table in ["limits", "embedded", "reaper"] {
        let err = Config::from_toml(&format!("\n[[{table}]]\n")).unwrap_err();
        assert_eq!(
            err,
            format!(
                "line 2: {table}: `[[{table}]]` is an array of tables; {table} is one \
                 table: write `[{table}]`"
            )
        );
    }
    // Other type errors keep serde's words, with the line and the key.
    let err = Config::from_toml("\nlisten = 5\n").unwrap_err();
    assert_eq!(
        err,
        "line 2: listen: invalid type: integer `5`, expected a string"
    );
}

#[test]
fn durations_take_a_unit_and_plain_numbers_keep_theirs() {
    let rule =
        |v: &str| Config::from_toml(&format!("[[queue]]\npattern = \"q\"\nlease_ms = {v}\n"));
    for (written, ms) in [
        ("30000", 30_000),
        ("\"250ms\"", 250),
        ("\"30s\"", 30_000),
        ("\"5m\"", 300_000),
        ("\"1h\"", 3_600_000),
        ("\"2 s\"", 2_000),
    ] {
        assert_eq!(rule(written).unwrap().queues[0].lease_ms, ms, "{written}");
    }
    let cfg = Config::from_toml(
        "connect_timeout_ms = \"2s\"\n[limits]\nidle_timeout_secs = \"5m\"\n\
         [reaper]\ninterval_ms = \"1s\"\n\
         [[queue]]\npattern = \"q\"\nhold = \"connection\"\nmax_hold_ms = \"2h\"\n\
         retry_backoff = \"exp\"\nretry_base_ms = \"1s\"\nretry_max_ms = \"1m\"\n",
    )
    .unwrap();
    assert_eq!(cfg.connect_timeout_ms, 2_000);
    assert_eq!(cfg.limits.idle_timeout_secs, 300);
    assert_eq!(cfg.reaper.interval_ms, 1_000);
    let q = &cfg.queues[0];
    assert_eq!(
        (q.max_hold_ms, q.retry_base_ms, q.retry_max_ms),
        (Some(7_200_000), 1_000, 60_000)
    );
    // A plain number of a *_secs key is seconds, as before.
    let cfg = Config::from_toml("[limits]\nidle_timeout_secs = 30\n").unwrap();
    assert_eq!(cfg.limits.idle_timeout_secs, 30);
    assert_eq!(Config::from_toml("").unwrap().queues.len(), 0);
    assert_eq!(rule("\"1h\"").unwrap().queues[0].max_hold_ms, None);

    let err = rule("\"30sec\"").unwrap_err();
    assert_eq!(
        err,
        "line 3: queue.lease_ms: \"30sec\" is not a duration: write a whole number with a \
         unit, ms, s, m or h (\"250ms\", \"30s\", \"5m\", \"1h\"), or a plain number of \
         milliseconds"
    );
    let err = Config::from_toml("[limits]\nidle_timeout_secs = \"1d\"\n").unwrap_err();
    assert!(
        err.starts_with("line 2: limits.idle_timeout_secs: \"1d\" is not a duration")
            && err.ends_with("or a plain number of seconds"),
        "{err}"
    );
    let err = Config::from_toml("[limits]\nidle_timeout_secs = \"1500ms\"\n").unwrap_err();
    assert!(err.contains("not a whole number of seconds"), "{err}");
    for bad in [
        "\"s\"",
        "\"1.5s\"",
        "\"-1s\"",
        "\"\"",
        "-1",
        "1.5",
        "\"99999999999999999999h\"",
    ] {
        let err = rule(bad).unwrap_err();
        assert!(err.starts_with("line 3: queue.lease_ms: "), "{bad}: {err}");
    }
    let err = Config::from_toml("connect_timeout_ms = \"soon\"\n").unwrap_err();
    assert!(
        err.starts_with("line 1: connect_timeout_ms: \"soon\""),
        "{err}"
    );
}
