//! One redis-server process, and what tests read of a running Redis.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use super::process::{free_port, fresh_dir, wait_for_ping, wait_until_ready};
use super::{Client, Value};

/// A redis-server child on a free port, killed on drop.
pub struct Redis {
    pub port: u16,
    pub(super) child: Child,
    pub dir: PathBuf,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::start_with(&[])
    }

    /// Extra `--name value` arguments are passed to redis-server as is.
    pub fn start_with(extra: &[&str]) -> Redis {
        let port = free_port();
        let dir = fresh_dir(std::env::temp_dir().join(format!("ackproxy-test-redis-{port}")));
        Redis::start_on(port, dir, extra)
    }

    /// Start on a given port and dir (used to restart a server in place).
    pub fn start_on(port: u16, dir: PathBuf, extra: &[&str]) -> Redis {
        let mut redis = Redis::spawn(port, dir, extra);
        wait_for_ping(port, "redis-server", &mut redis.child);
        redis
    }

    /// A redis-server that does not answer a plain PING on `port` (one
    /// whose `extra` makes it speak TLS there): `ready` tells when it is up.
    pub fn start_when(port: u16, extra: &[&str], mut ready: impl FnMut() -> bool) -> Redis {
        let dir = fresh_dir(std::env::temp_dir().join(format!("ackproxy-test-redis-{port}")));
        let mut redis = Redis::spawn(port, dir, extra);
        wait_until_ready(port, "redis-server", &mut redis.child, &mut ready);
        redis
    }

    /// `extra` comes after `--port`: a later `--port 0` turns plain TCP off.
    pub(super) fn spawn(port: u16, dir: PathBuf, extra: &[&str]) -> Redis {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        Redis { port, child, dir }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.port)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `INFO section` of the Redis on `port`, empty while it cannot be read.
pub fn info(port: u16, section: &str) -> String {
    let Ok(mut c) = Client::try_connect(port) else {
        return String::new();
    };
    match c.try_cmd(&["INFO", section]) {
        Ok(Value::Bulk(b)) => String::from_utf8_lossy(&b).into_owned(),
        _ => String::new(),
    }
}
