//! What packages and images are made of: `--version` with the commit,
//! `--help` with the defaults, the man page and shell completions made from
//! the command-line definition, the systemd unit, the container's
//! configuration and health check, queue rules from the environment, and
//! the private redis-server's persistence switched on by a flag.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn ackproxy(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ackproxy"))
        .args(args)
        .env_remove("ACKPROXY_QUEUES")
        .output()
        .expect("ackproxy binary")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A directory of its own, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("ackproxy-{what}-{}", free_port()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn version_names_the_commit_when_built_in_git() {
    let out = ackproxy(&["--version"]);
    assert!(out.status.success());
    let version = stdout(&out);
    let head = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(ROOT)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| stdout(&o).trim().to_string());
    let want = match (std::env::var("ACKPROXY_GIT_COMMIT"), head) {
        (Ok(given), _) if !given.is_empty() => {
            format!("ackproxy {} (commit {given})\n", env!("CARGO_PKG_VERSION"))
        }
        (_, Some(head)) => format!("ackproxy {} (commit {head})\n", env!("CARGO_PKG_VERSION")),
        _ => format!("ackproxy {}\n", env!("CARGO_PKG_VERSION")),
    };
    assert_eq!(version, want);
}

#[test]
fn help_shows_defaults_which_do_not_override_the_file() {
    let help = stdout(&ackproxy(&["--help"]));
    for default in [
        "[default: 127.0.0.1:6380]",
        "[default: none: a private redis-server is started]",
        "[default: 64]",
        "[default: human]",
    ] {
        assert!(help.contains(default), "{default} not in:\n{help}");
    }
    let short = stdout(&ackproxy(&["-h"]));
    assert!(short.contains("[default: 127.0.0.1:6380]"), "{short}");
    // A default shown is not a value given: the file's settings stay.
    let dir = TempDir::new("help");
    let port = free_port();
    let file = dir.0.join("a.toml");
    std::fs::write(
        &file,
        format!(
            "listen = \"127.0.0.1:{port}\"\nshared_connections = 3\nupstream = \"127.0.0.1:1\"\n"
        ),
    )
    .unwrap();
    let out = ackproxy(&["--config", file.to_str().unwrap(), "--check-config"]);
    let summary = stdout(&out);
    assert!(out.status.success(), "{summary}{}", stderr(&out));
    assert!(summary.contains(&format!("127.0.0.1:{port}")), "{summary}");
    assert!(summary.contains("3 shared"), "{summary}");
}

/// The packagers' subcommand is in `--help` (and `-h`), with how to call
/// it, rather than known only to those who read the source.
#[test]
fn help_names_the_generate_subcommand() {
    for flag in ["--help", "-h"] {
        let help = stdout(&ackproxy(&[flag]));
        assert!(
            help.contains("Usage: ackproxy [OPTIONS] [COMMAND]"),
            "{help}"
        );
        let generate = help
            .lines()
            .find(|l| l.trim_start().starts_with("generate "))
            .unwrap_or_else(|| panic!("no generate in {flag}:\n{help}"));
        assert!(
            generate.contains("generate man DIR")
                && generate.contains("generate completions SHELL DIR"),
            "{generate}"
        );
    }
}

#[test]
fn man_page_and_completions_are_made_from_the_flags() {
    let dir = TempDir::new("generate");
    let man = dir.0.join("man1");
    let out = ackproxy(&["generate", "man", man.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = std::fs::read_to_string(man.join("ackproxy.1")).unwrap();
    assert!(page.contains(".TH ackproxy 1"), "{page}");
    for flag in [
        "listen",
        "upstream",
        "check\\-config",
        "embedded\\-persistence",
    ] {
        assert!(
            page.contains(&format!("\\-\\-{flag}")),
            "--{flag} not in the man page"
        );
    }
    assert!(
        page.contains("127.0.0.1:6380"),
        "no default in the man page"
    );
    assert!(
        page.contains(env!("CARGO_PKG_VERSION")),
        "no version in the man page"
    );
    // What a reader of a man page looks for beside the flags, and the
    // proxy's own commands with every QUEUE operation.
    for section in [
        "COMMANDS",
        "FILES",
        "ENVIRONMENT",
        "SIGNALS",
        "EXIT STATUS",
        "EXAMPLES",
    ] {
        assert!(
            page.contains(&format!(".SH {section}\n"))
                || page.contains(&format!(".SH \"{section}\"\n")),
            "no {section} section"
        );
    }
    for word in [
        "ACK",
        "NACK",
        "EXTEND",
        "INFO",
        "LEASES",
        "REDRIVE",
        "PURGE",
        "SIGHUP",
        "SIGTERM",
        "ACKPROXY_LISTEN",
        "ACKPROXY_ADMIN_TOKEN",
        "/etc/ackproxy/ackproxy.toml",
    ] {
        assert!(page.contains(word), "{word} not in the man page");
    }
    // The subcommand is for packagers, not in the page.
    assert!(
        !page.contains("generate") && !page.contains("subcommand"),
        "{page}"
    );
    if Command::new("man").arg("--version").output().is_ok() {
        let shown = Command::new("man")
            .arg("-l")
            .arg(man.join("ackproxy.1"))
            .env("MANWIDTH", "100")
            .output()
            .unwrap();
        assert!(shown.status.success(), "{}", stderr(&shown));
        assert!(
            stdout(&shown).contains("--upstream-tls"),
            "{}",
            stdout(&shown)
        );
    } else {
        println!("man is not installed: the page is not rendered");
    }

    for (shell, file) in [
        ("bash", "ackproxy.bash"),
        ("zsh", "_ackproxy"),
        ("fish", "ackproxy.fish"),
    ] {
        let out = ackproxy(&["generate", "completions", shell, dir.0.to_str().unwrap()]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = std::fs::read_to_string(dir.0.join(file)).unwrap();
        assert!(script.contains("listen"), "{shell}: {script}");
        assert!(
            script.contains("upstream-tls-ca-cert-file"),
            "{shell}: {script}"
        );
        assert!(!script.contains("generate"), "{shell}: {script}");
    }
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(dir.0.join("ackproxy.bash"))
        .output()
        .unwrap();
    assert!(syntax.status.success(), "{}", stderr(&syntax));
    let bad = ackproxy(&["generate", "completions", "tcsh", dir.0.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let unit = read("packaging/ackproxy.service");
    for hardening in [
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "DynamicUser=yes",
        "CapabilityBoundingSet=\n",
        "PrivateTmp=yes",
        "SystemCallFilter=@system-service",
    ] {
        assert!(unit.contains(hardening), "{hardening} not in the unit");
    }
    assert!(unit.contains("ExecStart=/usr/bin/ackproxy "), "{unit}");
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("systemd-analyze is not installed: the unit is not verified");
        return;
    }
    // Verified as installed: the binary where ExecStart says (here, the
    // one just built) and the man page that Documentation= names.
    let dir = TempDir::new("unit");
    let unit = unit.replace("/usr/bin/ackproxy", env!("CARGO_BIN_EXE_ackproxy"));
    std::fs::write(dir.0.join("ackproxy.service"), unit).unwrap();
    let man = dir.0.join("man/man1");
    assert!(ackproxy(&["generate", "man", man.to_str().unwrap()])
        .status
        .success());
    let out = Command::new("systemd-analyze")
        .args(["verify", "./ackproxy.service"])
        .current_dir(&dir.0)
        .env("MANPATH", dir.0.join("man"))
        .output()
        .unwrap();
    // Unknown or misspelt settings are only warned of: no output at all.
    assert!(
        out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
}

/// The proxy with `args` and `env`, until it answers PING on `port`.
struct Running(std::process::Child);

impl Running {
    fn start(port: u16, args: &[&str], env: &[(&str, &str)]) -> Running {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ackproxy"));
        cmd.args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = Running(cmd.spawn().expect("ackproxy binary"));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut c) = Client::try_connect(port) {
                c.send(&["PING"]);
                if c.try_read_raw().is_ok_and(|r| r == b"+PONG\r\n") {
                    return child;
                }
            }
            if let Ok(Some(status)) = child.0.try_wait() {
                panic!("ackproxy exited: {status}");
            }
            assert!(Instant::now() < deadline, "ackproxy never answered");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, and the exit status.
    fn stop(mut self) -> bool {
        Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.0.try_wait().unwrap() {
                return s.success();
            }
            assert!(Instant::now() < deadline, "still running after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn embedded_persistence_by_flag_keeps_the_data_across_restarts() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("persist");
    let data = dir.0.join("data");
    // redis-server as the proxy runs it, logging to a file of ours: Redis
    // says there whether it was asked to stop and made its files safe.
    let redis_log = dir.0.join("redis.log");
    let wrapper = dir.0.join("redis-server");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec redis-server \"$@\" --logfile {}\n",
            redis_log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.0.join("embedded.toml");
    std::fs::write(
        &config,
        format!("[embedded]\nredis_server = \"{}\"\n", wrapper.display()),
    )
    .unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--listen",
        &listen,
        "--embedded-persistence",
        "--embedded-dir",
        data.to_str().unwrap(),
    ];
    let proxy = Running::start(port, &args, &[]);
    let mut c = Client::connect(port);
    assert_eq!(c.cmd(&["SET", "kept", "yes"]), Value::Simple("OK".into()));
    assert_eq!(c.cmd(&["LPUSH", "list", "a", "b"]), Value::Int(2));
    drop(c);
    assert!(proxy.stop());
    // Stopped as `redis-cli shutdown` would: the append-only file synced,
    // not a SIGKILL that may lose the last writes acknowledged.
    let said = std::fs::read_to_string(&redis_log).unwrap();
    assert!(
        said.contains("Received SIGTERM") && said.contains("ready to exit"),
        "{said}"
    );
    let proxy = Running::start(port, &args, &[]);
    let mut c = Client::connect(port);
    assert_eq!(c.cmd(&["GET", "kept"]), Value::bulk("yes"));
    assert_eq!(c.cmd(&["LLEN", "list"]), Value::Int(2));
    drop(c);
    assert!(proxy.stop());
    // The same through the environment, as the container sets it; without
    // persistence nothing is kept.
    let env_port = free_port();
    let env_listen = format!("127.0.0.1:{env_port}");
    let env = [
        ("ACKPROXY_LISTEN", env_listen.as_str()),
        ("ACKPROXY_EMBEDDED_DIR", data.to_str().unwrap()),
    ];
    let proxy = Running::start(env_port, &[], &env);
    let mut c = Client::connect(env_port);
    assert_eq!(c.cmd(&["GET", "kept"]), Value::Nil);
    drop(c);
    assert!(proxy.stop());
    let mut persistent = env.to_vec();
    persistent.push(("ACKPROXY_EMBEDDED_PERSISTENCE", "true"));
    let proxy = Running::start(env_port, &[], &persistent);
    let mut c = Client::connect(env_port);
    assert_eq!(c.cmd(&["GET", "kept"]), Value::bulk("yes"));
    drop(c);
    assert!(proxy.stop());
}

#[test]
fn queue_rules_from_the_environment_replace_the_file() {
    let redis = Redis::start();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let upstream = format!("127.0.0.1:{}", redis.port);
    let rules = "queue = [{ pattern = \"envq\", ack_id = \"json:id\" }]";
    // The example file's rules (jobs, tasks:*) give way to the variable's.
    let proxy = Running::start(
        port,
        &[
            "--config",
            &format!("{ROOT}/config/ackproxy.toml"),
            "--listen",
            &listen,
        ],
        &[("ACKPROXY_UPSTREAM", &upstream), ("ACKPROXY_QUEUES", rules)],
    );
    let mut c = Client::connect(port);
    assert_eq!(c.cmd(&["LPUSH", "envq", "{\"id\":\"7\"}"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "envq"]), Value::bulk("{\"id\":\"7\"}"));
    assert_eq!(
        field(&c.cmd(&["QUEUE", "INFO", "envq"]), "leased"),
        Some(Value::Int(1))
    );
    assert_eq!(c.cmd(&["ACK", "envq", "7"]), Value::Int(1));
    match c.cmd(&["QUEUE", "INFO", "jobs"]) {
        Value::Error(e) => assert!(e.contains("no queue rule"), "{e}"),
        other => panic!("jobs still a queue: {other:?}"),
    }
    drop(c);
    assert!(proxy.stop());

    // [[queue]] tables too; a mistake is reported as the variable's.
    let tables = "[[queue]]\npattern = \"a\"\n\n[[queue]]\npattern = \"b\"\ndead_letter = \"b\"\n";
    let out = Command::new(env!("CARGO_BIN_EXE_ackproxy"))
        .args(["--check-config", "--upstream", &upstream])
        .env("ACKPROXY_QUEUES", tables)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let why = stderr(&out);
    assert!(
        why.contains("ACKPROXY_QUEUES:6: queue \"b\": dead_letter"),
        "{why}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_ackproxy"))
        .args(["--check-config", "--upstream", &upstream])
        .env("ACKPROXY_QUEUES", "[[queue]]\npatern = \"a\"\n")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out)
            .contains("ACKPROXY_QUEUES:2: queue.patern: unknown key, did you mean `pattern`?"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_container_configuration_and_its_health_check() {
    let dockerfile = read("Dockerfile");
    let toml = read("docker/ackproxy.toml");
    assert!(toml.contains("listen = \"0.0.0.0:6380\""), "{toml}");
    assert!(toml.contains("metrics = \"0.0.0.0:7380\""), "{toml}");
    assert!(dockerfile.contains("EXPOSE 6380 7380"), "{dockerfile}");
    assert!(
        dockerfile.contains("CMD [\"--config\", \"/etc/ackproxy/ackproxy.toml\"]")
            && dockerfile.contains("COPY docker/ackproxy.toml /etc/ackproxy/ackproxy.toml"),
        "{dockerfile}"
    );
    // Every benchmark Cargo.toml names gets a placeholder in the
    // dependencies' layer: the Dockerfile finds them in Cargo.toml.
    assert!(read("Cargo.toml").contains("path = \"bench/"));

    // The container's file as it is, on loopback ports here (the variables
    // override it as `docker run -e` would), with rules from the
    // environment; its health check asks the operations server.
    let redis = Redis::start();
    let (port, ops) = (free_port(), free_port());
    let (listen, metrics) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{ops}"));
    let upstream = format!("127.0.0.1:{}", redis.port);
    let proxy = Running::start(
        port,
        &["--config", &format!("{ROOT}/docker/ackproxy.toml")],
        &[
            ("ACKPROXY_LISTEN", &listen),
            ("ACKPROXY_METRICS", &metrics),
            ("ACKPROXY_UPSTREAM", &upstream),
            ("ACKPROXY_QUEUES", "[[queue]]\npattern = \"jobs\"\n"),
        ],
    );
    let mut c = Client::connect(port);
    assert_eq!(c.cmd(&["LPUSH", "jobs", "x"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk("x"));
    assert_eq!(c.cmd(&["ACK", "jobs", "x"]), Value::Int(1));
    let check = |addr: &str| {
        Command::new("bash")
            .arg(format!("{ROOT}/docker/healthcheck.sh"))
            .env("ACKPROXY_METRICS", addr)
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(check(&metrics));
    assert!(
        check(&format!("0.0.0.0:{ops}")),
        "an address of every interface is asked on loopback"
    );
    drop(c);
    assert!(proxy.stop());
    assert!(!check(&metrics), "healthy with the proxy stopped");
}

#[test]
fn suggested_operations_ports_are_no_exporters_defaults() {
    // Prometheus's list of exporters' default ports fills 9100-9999 (9121
    // is redis_exporter's): an operations address suggested there would
    // clash on a host that runs Redis and its exporter.
    let mut seen = 0;
    for path in [
        "README.md",
        "docs/configuration.md",
        "docs/metrics.md",
        "docs/operations.md",
        "config/ackproxy.toml",
        "config/prometheus.yml",
        "docker/ackproxy.toml",
        "docker/healthcheck.sh",
        "Dockerfile",
        "packaging/ackproxy.service",
    ] {
        for line in read(path).lines() {
            let lower = line.to_ascii_lowercase();
            if !(lower.contains("metrics") || lower.contains("expose") || lower.contains("7380")) {
                continue;
            }
            for word in line.split(|c: char| !c.is_ascii_digit()) {
                if let Ok(port) = word.parse::<u32>() {
                    if word.len() == 4 {
                        seen += 1;
                        assert!(!(9100..=9999).contains(&port), "{path}: {line}");
                    }
                }
            }
        }
    }
    assert!(seen > 5, "no operations port found");
}

#[test]
fn license_and_changelog() {
    let license = read("LICENSE");
    assert!(license.starts_with("MIT License"), "{license}");
    assert!(license.contains("The ackproxy developers"), "{license}");
    assert!(read("Cargo.toml").contains("license = \"MIT\""));
    let changelog = read("CHANGELOG.md");
    assert!(changelog.contains("## [Unreleased]"), "{changelog}");
    assert!(
        changelog.contains(&format!("## [{}]", env!("CARGO_PKG_VERSION"))),
        "no entry for this version"
    );
}

/// The Debian package (`packaging/deb.sh`, made by cargo-deb): what it
/// holds, then, where the machine allows it (root and dpkg), installed,
/// started as its systemd unit starts it (by systemd where systemd runs,
/// by this test where it does not), and removed.
#[test]
fn the_debian_package_installs_and_starts() {
    let bin = Path::new(env!("CARGO_BIN_EXE_ackproxy"));
    let target = bin.parent().and_then(Path::parent).unwrap();
    let built = Command::new("bash")
        .args(["packaging/deb.sh", "--no-build"])
        .current_dir(ROOT)
        .env("CARGO_TARGET_DIR", target)
        .output()
        .expect("bash");
    assert!(
        built.status.success(),
        "packaging/deb.sh (cargo-deb comes from tests/setup-bench-deps.sh): {}{}",
        stdout(&built),
        stderr(&built)
    );
    let deb = stdout(&built).lines().last().unwrap().trim().to_string();
    let listing = Command::new("dpkg-deb")
        .args(["-c", &deb])
        .output()
        .unwrap();
    let listing = stdout(&listing);
    for path in [
        "./usr/bin/ackproxy",
        "./etc/ackproxy/ackproxy.toml",
        "/systemd/system/ackproxy.service",
        "./usr/share/man/man1/ackproxy.1.gz",
        "./usr/share/bash-completion/completions/ackproxy",
        "./usr/share/zsh/vendor-completions/_ackproxy",
        "./usr/share/doc/ackproxy/README.md",
        "./usr/share/doc/ackproxy/docs/configuration.md",
        "./usr/share/doc/ackproxy/examples/frameworks/rq.toml",
    ] {
        assert!(
            listing.contains(path),
            "{path} not in the package:\n{listing}"
        );
    }
    let conffiles = Command::new("dpkg-deb")
        .args(["--info", &deb, "conffiles"])
        .output()
        .unwrap();
    assert!(
        stdout(&conffiles).contains("/etc/ackproxy/ackproxy.toml"),
        "{}",
        stdout(&conffiles)
    );

    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| stdout(&o).trim() == "0");
    if !root {
        println!("not root: the package is built and checked, not installed");
        return;
    }
    let installed = Command::new("dpkg")
        .args(["-i", &deb])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .unwrap();
    assert!(installed.status.success(), "{}", stderr(&installed));
    struct Removed;
    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = Command::new("dpkg").args(["--purge", "ackproxy"]).output();
        }
    }
    let _removed = Removed;
    let version = Command::new("/usr/bin/ackproxy")
        .arg("--version")
        .output()
        .unwrap();
    assert!(stdout(&version).contains(env!("CARGO_PKG_VERSION")));

    let port = free_port();
    if Path::new("/run/systemd/system").exists() {
        // systemd started it on the shipped configuration's address.
        let mut c = Client::connect(6380);
        assert_eq!(c.cmd(&["PING"]), Value::Simple("PONG".into()));
    } else {
        // The unit's command line, with its environment, on a free port.
        let unit = ["/lib", "/usr/lib"]
            .iter()
            .find_map(|d| {
                std::fs::read_to_string(format!("{d}/systemd/system/ackproxy.service")).ok()
            })
            .expect("the unit installed");
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap();
        let mut words = exec.split_whitespace();
        let state = TempDir::new("deb-state");
        let mut child = Command::new(words.next().unwrap())
            .args(words)
            .env("ACKPROXY_EMBEDDED_DIR", &state.0)
            .env("ACKPROXY_LISTEN", format!("127.0.0.1:{port}"))
            .env("ACKPROXY_METRICS", format!("127.0.0.1:{}", free_port()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut c = loop {
            if let Ok(c) = Client::try_connect(port) {
                break c;
            }
            assert!(
                Instant::now() < deadline,
                "the packaged proxy did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(c.cmd(&["PING"]), Value::Simple("PONG".into()));
        assert_eq!(c.cmd(&["LPUSH", "jobs", "{\"id\":\"1\"}"]), Value::Int(1));
        let _ = child.kill();
        let _ = child.wait();
    }
    if Command::new("man").arg("--version").output().is_ok() {
        let page = Command::new("man")
            .args(["-l", "/usr/share/man/man1/ackproxy.1.gz"])
            .output()
            .unwrap();
        assert!(stdout(&page).contains("EXIT STATUS"), "{}", stdout(&page));
    }
    drop(_removed);
    assert!(!Path::new("/usr/bin/ackproxy").exists(), "not removed");
}

/// The release binary ships without debug line tables (52 MB with them):
/// panics still name their functions, and a package carries no dead weight.
#[test]
fn the_release_binary_has_no_debug_line_tables() {
    if cfg!(debug_assertions) {
        println!("a debug build: the release profile is what ships");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_ackproxy");
    let sections = Command::new("readelf")
        .args(["--section-headers", "--wide", bin])
        .output()
        .expect("readelf (binutils)");
    let sections = stdout(&sections);
    assert!(sections.contains(".text"), "{sections}");
    assert!(
        !sections.contains(".debug_line") && !sections.contains(".debug_info"),
        "{sections}"
    );
    let size = std::fs::metadata(bin).unwrap().len();
    assert!(size < 25 << 20, "{size} bytes");
}
