//! `--check-config` refuses configurations that would start but not do
//! what they say, naming the file, the line and the key; it binds nothing,
//! and `--check-bind` reports each address that cannot be bound; its output
//! may be cut short by the reader; with JSON logs every line on stderr is
//! JSON, also the ones that say why the proxy stops.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A file named after the test holding `text`.
fn file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ackproxy-config-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn ackproxy() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ackproxy"));
    // Nothing from the environment the tests run in.
    for (var, _) in std::env::vars() {
        if var.starts_with("ACKPROXY_") {
            cmd.env_remove(var);
        }
    }
    cmd.env_remove("RUST_LOG");
    cmd
}

struct Checked {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn checked(out: Output) -> Checked {
    Checked {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `--check-config` of `toml` in a file named `name` (its path returned),
/// with an upstream given unless the file names one, and a listener that
/// can always bind.
fn check(name: &str, toml: &str, env: &[(&str, &str)]) -> (Checked, String) {
    let path = file(name, toml);
    let mut cmd = ackproxy();
    cmd.args(["--check-config", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path);
    if !toml.contains("upstream") && !env.iter().any(|(k, _)| *k == "ACKPROXY_UPSTREAM") {
        cmd.args(["--upstream", "127.0.0.1:6379"]);
    }
    cmd.envs(env.iter().copied());
    (checked(cmd.output().unwrap()), path.display().to_string())
}

/// Refused: exit status 2, nothing said to be OK, `want` on stderr.
fn assert_refused(c: &Checked, want: &[&str]) {
    assert_eq!(
        c.code,
        Some(2),
        "stdout:\n{}\nstderr:\n{}",
        c.stdout,
        c.stderr
    );
    assert!(!c.stdout.contains("configuration OK"), "{}", c.stdout);
    for w in want {
        assert!(c.stderr.contains(w), "{w:?} not in:\n{}", c.stderr);
    }
}

#[test]
fn a_dead_letter_list_that_is_the_queue_is_refused() {
    let (c, path) = check(
        "dead-exact.toml",
        "[[queue]]\npattern = \"jobs\"\nlease_ms = 1000\ndead_letter = \"jobs\"\n",
        &[],
    );
    assert_refused(
        &c,
        &[
            &format!("{path}:4: queue \"jobs\": dead_letter \"jobs\": "),
            "the queue itself",
        ],
    );
    let (c, path) = check(
        "dead-template.toml",
        "[[queue]]\npattern = \"jobs\"\n\n[[queue]]\npattern = \"tasks:*\"\ndead_letter = \"$queue\"\n",
        &[],
    );
    assert_refused(
        &c,
        &[&format!(
            "{path}:6: queue \"tasks:*\": dead_letter \"$queue\": "
        )],
    );
}

#[test]
fn an_unclosed_bracket_in_a_pattern_is_refused() {
    let (c, path) = check(
        "bracket.toml",
        "# queues\n[[queue]]\npattern = \"jobs[\"\n",
        &[],
    );
    assert_refused(
        &c,
        &[
            &format!("{path}:3: queue \"jobs[\": pattern: "),
            "the [ at character 5 is not closed by a ]",
        ],
    );
}

#[test]
fn the_same_pattern_twice_is_refused_and_an_exact_rule_under_a_glob_warned() {
    let (c, path) = check(
        "duplicate.toml",
        "[[queue]]\npattern = \"jobs\"\n\n[[queue]]\npattern = \"jobs\"\nlease_ms = 5\n",
        &[],
    );
    assert_refused(
        &c,
        &[&format!(
            "{path}:5: queue \"jobs\": pattern: the rule at {path}:2 has the same pattern"
        )],
    );
    // Accepted, with a warning naming both rules' lines.
    let (c, path) = check(
        "overlap.toml",
        "[[queue]]\npattern = \"jobs*\"\n\n[[queue]]\nlease_ms = 5\npattern = \"jobs\"\n",
        &[],
    );
    assert_eq!(c.code, Some(0), "{}", c.stderr);
    assert!(c.stdout.ends_with("configuration OK\n"), "{}", c.stdout);
    let warning = format!(
        "ackproxy: warning: {path}:6: queue \"jobs\": pattern: also matched by the glob \
         \"jobs*\" of the rule at {path}:2; the exact rule applies to \"jobs\""
    );
    assert!(c.stderr.contains(&warning), "{}", c.stderr);
}

#[test]
fn threads_must_be_at_least_one_and_a_bad_variable_is_named() {
    let (c, path) = check("threads.toml", "threads = 0\n", &[]);
    assert_refused(&c, &[&format!("{path}:1: threads must be at least 1")]);

    let out = ackproxy()
        .args(["--check-config", "--threads", "0"])
        .output()
        .unwrap();
    let c = checked(out);
    assert_refused(&c, &["'--threads <THREADS>'", "threads must be at least 1"]);

    for value in ["abc", "0"] {
        let (c, _) = check("threads-env.toml", "", &[("ACKPROXY_THREADS", value)]);
        assert_refused(
            &c,
            &[&format!("invalid value '{value}' for 'ACKPROXY_THREADS'")],
        );
        assert!(!c.stderr.contains("--threads"), "{}", c.stderr);
    }
}

/// Every refusal, of the checks or of the file's syntax and types, is one
/// line starting with `file:line: ` and naming the key.
#[test]
fn errors_name_the_file_line_and_key() {
    let cases = [
        (
            "listen.toml",
            "# proxy\nlisten = \"nowhere\"\n",
            ":2: listen: \"nowhere\" is not a host:port address",
        ),
        (
            "lease.toml",
            "[[queue]]\npattern = \"jobs\"\nlease_ms = 0\n",
            ":3: queue \"jobs\": lease_ms: must be positive",
        ),
        (
            "deliveries.toml",
            "[[queue]]\npattern = \"jobs\"\n\nmax_deliveries = 0\n",
            ":4: queue \"jobs\": max_deliveries: must be at least 1",
        ),
        (
            "typo.toml",
            "[[queue]]\npattern = \"jobs\"\nleas_ms = 100\n",
            ":3: queue.leas_ms: unknown key, did you mean `lease_ms`?",
        ),
        (
            "table.toml",
            "[queue]\npattern = \"jobs\"\n",
            ":1: queue: `[queue]` is one table; queue rules are an array of tables: \
             write `[[queue]]`",
        ),
        (
            "duration.toml",
            "[limits]\nidle_timeout_secs = \"30 seconds\"\n",
            ":2: limits.idle_timeout_secs: \"30 seconds\" is not a duration: write a whole \
             number with a unit, ms, s, m or h (\"250ms\", \"30s\", \"5m\", \"1h\"), or a \
             plain number of seconds",
        ),
    ];
    for (name, toml, want) in cases {
        let path = file(name, toml);
        let out = ackproxy()
            .args(["--check-config", "--upstream", "127.0.0.1:6379", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let c = checked(out);
        assert_refused(&c, &[&format!("ackproxy: {}{want}\n", path.display())]);
        assert_eq!(c.stderr.lines().count(), 1, "{}", c.stderr);
    }
    // A unit where a number was all there was.
    let (c, _) = check(
        "units.toml",
        "connect_timeout_ms = \"2s\"\n[[queue]]\npattern = \"jobs\"\nlease_ms = \"5m\"\n",
        &[],
    );
    assert_eq!(c.code, Some(0), "{}", c.stderr);
    assert!(
        c.stdout.contains("connect timeout     2000 ms"),
        "{}",
        c.stdout
    );
    assert!(
        c.stdout.contains("queue \"jobs\": lease 300000 ms"),
        "{}",
        c.stdout
    );
}

#[test]
fn upstream_needs_host_and_port() {
    let (c, path) = check("upstream.toml", "upstream = \"nohost\"\n", &[]);
    assert_refused(
        &c,
        &[&format!(
            "{path}:1: upstream: expected host:port, got \"nohost\""
        )],
    );
    let (c, _) = check("upstream-env.toml", "", &[("ACKPROXY_UPSTREAM", "nohost")]);
    assert_refused(
        &c,
        &["upstream: expected host:port, got \"nohost\" (from ACKPROXY_UPSTREAM)"],
    );
}

/// Persistence in the private redis-server's default directory, which is
/// removed at exit, would keep nothing across a restart.
#[test]
fn embedded_persistence_needs_a_directory() {
    let refused = "[embedded] persistence needs a dir (--embedded-dir)";
    let run = |args: &[&str]| {
        let mut cmd = ackproxy();
        cmd.args(["--check-config", "--listen", "127.0.0.1:0"])
            .args(args);
        checked(cmd.output().unwrap())
    };
    assert_refused(&run(&["--embedded-persistence"]), &[refused]);
    let path = file("persistence.toml", "[embedded]\npersistence = true\n");
    let c = run(&["--config", path.to_str().unwrap()]);
    assert_refused(&c, &[refused]);
    let dir = std::env::temp_dir().to_str().unwrap().to_string();
    let c = run(&["--embedded-persistence", "--embedded-dir", &dir]);
    assert_eq!(c.code, Some(0), "{}", c.stderr);
    // With an upstream the private server is not started.
    let c = run(&["--embedded-persistence", "--upstream", "127.0.0.1:6379"]);
    assert_eq!(c.code, Some(0), "{}", c.stderr);
}

fn assert_no_panic(c: &Checked) {
    assert_ne!(c.code, Some(101), "{}", c.stderr);
    assert!(!c.stderr.contains("panicked"), "{}", c.stderr);
}

#[test]
fn a_reader_that_stops_reading_is_no_panic() {
    let valid = [
        "--check-config",
        "--upstream",
        "127.0.0.1:6379",
        "--listen",
        "127.0.0.1:0",
    ];
    // The reader gone before anything is written: every write fails.
    let run = |args: &[&str], lines: usize| {
        let mut child = ackproxy()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        for _ in 0..lines {
            stdout.read_line(&mut String::new()).unwrap();
        }
        drop(stdout);
        checked(child.wait_with_output().unwrap())
    };
    let c = run(&valid, 0);
    assert_no_panic(&c);
    // What the check found is still the exit status.
    assert_eq!(c.code, Some(0), "{}", c.stderr);
    // As `| head -1`.
    assert_no_panic(&run(&valid, 1));
    // A check that fails after the summary: its listener's port is taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let mut invalid = valid.to_vec();
    invalid.extend(["--listen", &taken, "--check-bind"]);
    let c = run(&invalid, 0);
    assert_no_panic(&c);
    assert_eq!(c.code, Some(2), "{}", c.stderr);
    for args in [&["--help"][..], &["--version"][..]] {
        let c = run(args, 0);
        assert_no_panic(&c);
        assert_eq!(c.code, Some(0), "{args:?}: {}", c.stderr);
    }
}

/// The file of a proxy that is running passes `--check-config`, which
/// binds nothing (as `nginx -t`); `--check-bind` names every address of it
/// that is taken, and still passes once they are free.
#[test]
fn the_file_of_a_running_proxy_passes_and_check_bind_names_the_taken_addresses() {
    let redis = crate::common::Redis::start();
    let (port, m) = (crate::common::free_port(), crate::common::free_port());
    let toml = format!(
        "listen = \"127.0.0.1:{port}\"\nmetrics = \"127.0.0.1:{m}\"\n\
         upstream = \"127.0.0.1:{}\"\n[[queue]]\npattern = \"jobs\"\n",
        redis.port
    );
    let path = file("running.toml", &toml);
    let run = |args: &[&str]| {
        let mut cmd = ackproxy();
        cmd.args(args).arg("--config").arg(&path);
        checked(cmd.output().unwrap())
    };
    let mut proxy =
        crate::common::Proxy::start_when(port, &["--config", path.to_str().unwrap()], || {
            crate::common::Client::try_connect(port).is_ok_and(|mut c| {
                c.send(&["PING"]);
                c.try_read_raw().is_ok_and(|r| r == b"+PONG\r\n")
            })
        });

    let c = run(&["--check-config"]);
    assert_eq!(c.code, Some(0), "{}", c.stderr);
    assert!(c.stdout.ends_with("configuration OK\n"), "{}", c.stdout);
    assert!(c.stderr.is_empty(), "{}", c.stderr);

    for args in [
        &["--check-config", "--check-bind"][..],
        &["--check-bind"][..],
    ] {
        let c = run(args);
        assert_refused(
            &c,
            &[
                &format!("ackproxy: listen: cannot bind 127.0.0.1:{port}: "),
                &format!("ackproxy: metrics: cannot bind 127.0.0.1:{m}: "),
                "Address already in use",
            ],
        );
    }

    assert!(proxy.terminate(), "ackproxy did not exit cleanly");
    let c = run(&["--check-bind"]);
    assert_eq!(c.code, Some(0), "{}", c.stderr);
    assert!(
        c.stdout.ends_with(&format!(
            "addresses free      listen 127.0.0.1:{port}, metrics 127.0.0.1:{m}\n\
             configuration OK\n"
        )),
        "{}",
        c.stdout
    );
}

/// A metrics port another process holds: the file is fine, the start would
/// fail, and `--check-bind` says why before it does.
#[test]
fn check_bind_reports_a_taken_metrics_port() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap();
    let (c, _) = check(
        "metrics-taken.toml",
        &format!("metrics = \"{taken}\"\n"),
        &[],
    );
    assert_eq!(c.code, Some(0), "{}", c.stderr);
    let path = file(
        "metrics-taken-bind.toml",
        &format!("metrics = \"{taken}\"\n"),
    );
    let out = ackproxy()
        .args(["--check-bind", "--upstream", "127.0.0.1:6379"])
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let c = checked(out);
    assert_refused(&c, &[&format!("ackproxy: metrics: cannot bind {taken}: ")]);
    // Only the address that is taken.
    assert!(!c.stderr.contains("listen:"), "{}", c.stderr);
    // Two settings naming one address cannot both be bound at start-up.
    let same = format!("127.0.0.1:{}", crate::common::free_port());
    let out = ackproxy()
        .args(["--check-bind", "--upstream", "127.0.0.1:6379"])
        .args(["--listen", &same, "--metrics", &same])
        .output()
        .unwrap();
    assert_refused(&checked(out), &[&format!("metrics: cannot bind {same}: ")]);
}

/// Runs the proxy to its end (killed after 20 s) and returns its stderr.
fn run_to_end(mut cmd: Command) -> (Option<i32>, String) {
    let mut child: Child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every line of `stderr` a JSON log line; the messages at `level`.
fn json_lines(stderr: &str, level: &str) -> Vec<String> {
    assert!(!stderr.is_empty());
    let mut messages = Vec::new();
    for line in stderr.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\nin:\n{stderr}"));
        assert!(v["timestamp"].is_string(), "{line}");
        if v["level"] == level {
            messages.push(v["fields"]["message"].as_str().unwrap().to_string());
        }
    }
    messages
}

#[test]
fn with_json_logs_every_line_on_stderr_is_json() {
    // Refused before the start.
    let mut cmd = ackproxy();
    cmd.args(["--log-format", "json", "--upstream", "nohost"])
        .args(["--listen", "127.0.0.1:0"]);
    let (code, stderr) = run_to_end(cmd);
    assert_eq!(code, Some(2), "{stderr}");
    let errors = json_lines(&stderr, "ERROR");
    assert_eq!(
        errors,
        ["upstream: expected host:port, got \"nohost\" (from --upstream)"]
    );

    // Chosen in the file, which does not load.
    let path = file(
        "json-file.toml",
        "log_format = \"json\"\nupstream = \"127.0.0.1:1\"\n[[queue]]\npattern = \"q[\"\n",
    );
    let mut cmd = ackproxy();
    cmd.arg("--config").arg(&path);
    let (code, stderr) = run_to_end(cmd);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(json_lines(&stderr, "ERROR").len(), 1, "{stderr}");

    // Fails once logging is set up: the listener's port is taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cmd = ackproxy();
    cmd.args(["--log-format", "json", "--upstream", "127.0.0.1:1"])
        .arg("--listen")
        .arg(taken.local_addr().unwrap().to_string());
    let (code, stderr) = run_to_end(cmd);
    assert_eq!(code, Some(1), "{stderr}");
    let errors = json_lines(&stderr, "ERROR");
    assert!(
        errors.len() == 1 && errors[0].starts_with("cannot listen on"),
        "{stderr}"
    );
    assert!(
        json_lines(&stderr, "WARN")
            .iter()
            .any(|w| w.starts_with("no [[queue]] rules")),
        "{stderr}"
    );

    // What a private redis-server says on its stderr.
    let fake = file(
        "fake-redis-server",
        "#!/bin/sh\necho 'FATAL: cannot start, say why' >&2\nexit 1\n",
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let toml = file(
        "json-embedded.toml",
        &format!(
            "[embedded]\nredis_server = {:?}\n",
            fake.display().to_string()
        ),
    );
    let mut cmd = ackproxy();
    cmd.args([
        "--log-format",
        "json",
        "--listen",
        "127.0.0.1:0",
        "--config",
    ])
    .arg(&toml);
    let (code, stderr) = run_to_end(cmd);
    assert_eq!(code, Some(1), "{stderr}");
    let warnings = json_lines(&stderr, "WARN");
    assert!(
        warnings.contains(&"redis-server: FATAL: cannot start, say why".to_string()),
        "{stderr}"
    );
    let errors = json_lines(&stderr, "ERROR");
    assert!(
        errors.len() == 1 && errors[0].starts_with("private redis-server: exited at start"),
        "{stderr}"
    );
}
