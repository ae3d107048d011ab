//! Process handling shared by the benchmark programs.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process, killed on drop.
pub struct Proc(pub Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A redis-server without persistence on a free port, data in `dir`.
pub fn start_redis(dir: &Path) -> (Proc, u16) {
    let port = free_port();
    let redis = Proc(
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server"),
    );
    wait_port(port);
    (redis, port)
}

/// The proxy `bin` in front of `redis_port`, with the configuration `toml`
/// (written into `dir`), on a free port.
pub fn start_proxy(bin: &str, redis_port: u16, toml: &str, dir: &Path) -> (Proc, u16) {
    start_proxy_with(bin, redis_port, toml, dir, &[])
}

/// [`start_proxy`] with extra command-line flags.
pub fn start_proxy_with(
    bin: &str,
    redis_port: u16,
    toml: &str,
    dir: &Path,
    extra: &[&str],
) -> (Proc, u16) {
    let cfg = dir.join("ackproxy.toml");
    std::fs::write(&cfg, toml).unwrap();
    let port = free_port();
    let proxy = Proc(
        Command::new(bin)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", &format!("127.0.0.1:{redis_port}")])
            .arg("--config")
            .arg(&cfg)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("ackproxy binary"),
    );
    wait_port(port);
    (proxy, port)
}
