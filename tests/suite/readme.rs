//! The README and the pages of `docs/` work as written: the README's quick
//! start runs the proxy with the example configuration on a private
//! redis-server, and every `redis-cli` example of the README and of each
//! `docs/*.md` page gives the output its comment states (the text after
//! `# `, up to ` — `; output lines joined by spaces). The private
//! redis-server dies with the proxy, however the proxy dies.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// A child killed (SIGKILL) and reaped on drop.
struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The proxy as the quick start runs it, on a free port.
fn quick_start() -> (Killed, u16) {
    let port = free_port();
    let child = Killed(
        Command::new(env!("CARGO_BIN_EXE_ackproxy"))
            .args(["--config", "config/ackproxy.toml"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ackproxy binary"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut c) = Client::try_connect(port) {
            if c.cmd(&["PING"]) == Value::Simple("PONG".into()) {
                return (child, port);
            }
        }
        assert!(Instant::now() < deadline, "the quick start never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The README, then every `docs/*.md` page sorted by name: `(path, text)`,
/// read when the test runs, so that a new page is picked up.
fn pages() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |rel: &str| {
        std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    };
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("the docs directory")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    std::iter::once("README.md".to_string())
        .chain(docs)
        .map(|rel| {
            let text = read(&rel);
            (rel, text)
        })
        .collect()
}

/// `(command, expected output)` for each example line of the README and of
/// the docs pages, in that order.
fn examples() -> Vec<(String, String)> {
    let pages = pages();
    let readme = &pages[0].1;
    let quick = readme
        .lines()
        .find(|l| l.contains("cargo run --release"))
        .expect("a quick start line");
    assert!(
        quick.contains("--config config/ackproxy.toml"),
        "the quick start must run the example configuration: {quick}"
    );
    pages
        .iter()
        .flat_map(|(path, text)| text.lines().map(move |l| (path, l)))
        .filter(|(_, l)| l.starts_with("redis-cli -p 6380 "))
        .map(|(path, l)| {
            let (cmd, comment) = l
                .split_once("   # ")
                .unwrap_or_else(|| panic!("{path}: an expected output: {l}"));
            let want = comment.split(" — ").next().unwrap().trim();
            (cmd.trim().to_string(), want.to_string())
        })
        .collect()
}

#[test]
fn readme_examples_work_as_written() {
    let (proxy, port) = quick_start();
    let examples = examples();
    assert!(examples.len() >= 8, "{examples:?}");
    for (cmd, want) in &examples {
        let cmd_here = cmd.replace("-p 6380", &format!("-p {port}"));
        let out = Command::new("sh").args(["-c", &cmd_here]).output().unwrap();
        let got = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(&got, want, "{cmd}");
    }
    drop(proxy);
}

fn children_named(pid: u32, name: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let comm = &stat[stat.find('(').unwrap() + 1..close];
        let ppid: u32 = stat[close + 2..]
            .split(' ')
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if ppid == pid && comm.starts_with(name) {
            out.push(p);
        }
    }
    out
}

/// Alive and not a zombie.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let close = s.rfind(')').unwrap();
        !s[close + 2..].starts_with('Z')
    })
}

#[test]
fn the_private_redis_server_dies_with_a_killed_proxy() {
    let (proxy, _port) = quick_start();
    let redis = children_named(proxy.0.id(), "redis-server");
    assert_eq!(redis.len(), 1, "one private redis-server: {redis:?}");
    let scratch = std::env::temp_dir().join(format!("ackproxy-redis-{}", proxy.0.id()));
    assert!(scratch.is_dir(), "{scratch:?}");
    drop(proxy); // SIGKILL: no clean-up code runs
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(redis[0]) {
        assert!(
            Instant::now() < deadline,
            "redis-server {} outlived the proxy",
            redis[0]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The killed proxy's directory is left; the next proxy removes it, and
    // its own when it stops.
    assert!(scratch.is_dir(), "{scratch:?}");
    let (next, _port) = quick_start();
    assert!(!scratch.exists(), "{scratch:?} outlived the next start");
    let own = std::env::temp_dir().join(format!("ackproxy-redis-{}", next.0.id()));
    assert!(own.is_dir(), "{own:?}");
    let status = Command::new("kill")
        .args(["-TERM", &next.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    while own.exists() {
        assert!(Instant::now() < deadline, "{own:?} outlived its proxy");
        std::thread::sleep(Duration::from_millis(20));
    }
}
