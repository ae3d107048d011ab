//! The ackproxy binary as a child process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::{free_port, wait_for_ping, wait_until_ready, TempFile};
use super::{Client, Redis};

/// The built ackproxy binary, killed on drop, with the files it was
/// started with (removed after it).
pub struct Proxy {
    pub port: u16,
    child: Child,
    files: Vec<TempFile>,
}

impl Proxy {
    /// ackproxy in front of `upstream_port` with extra command-line flags.
    pub fn start(upstream_port: u16, extra: &[&str]) -> Proxy {
        Proxy::start_on(free_port(), upstream_port, extra)
    }

    pub fn start_on(port: u16, upstream_port: u16, extra: &[&str]) -> Proxy {
        let (listen, upstream) = (
            format!("127.0.0.1:{port}"),
            format!("127.0.0.1:{upstream_port}"),
        );
        let mut args = vec!["--listen", &listen, "--upstream", &upstream];
        args.extend_from_slice(extra);
        let mut child = Proxy::spawn(&args);
        wait_for_ping(port, "ackproxy", &mut child);
        Proxy::running(port, child)
    }

    /// ackproxy with exactly these arguments, up once `ready` holds: for
    /// one that answers no plain PING on `port` (TLS only).
    pub fn start_when(port: u16, args: &[&str], ready: impl FnMut() -> bool) -> Proxy {
        let mut child = Proxy::spawn(args);
        wait_until_ready(port, "ackproxy", &mut child, ready);
        Proxy::running(port, child)
    }

    fn spawn(args: &[&str]) -> Child {
        Proxy::spawn_limited(args, None)
    }

    /// With `nofile`, the process may open that many descriptors at most.
    fn spawn_limited(args: &[&str], nofile: Option<u64>) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ackproxy"));
        cmd.args(args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null());
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd.spawn().expect("ackproxy binary")
    }

    /// Like [`Proxy::start_with_config`], with the proxy's open-file limit
    /// at `nofile`: running out of descriptors without opening thousands.
    pub fn start_with_config_nofile(
        upstream_port: u16,
        toml: &str,
        extra: &[&str],
        nofile: u64,
    ) -> Proxy {
        let file = TempFile::new("ackproxy-test", "toml", toml);
        let port = free_port();
        let (listen, upstream) = (
            format!("127.0.0.1:{port}"),
            format!("127.0.0.1:{upstream_port}"),
        );
        let mut args = vec![
            "--listen",
            &listen,
            "--upstream",
            &upstream,
            "--config",
            file.as_arg(),
        ];
        args.extend_from_slice(extra);
        let mut child = Proxy::spawn_limited(&args, Some(nofile));
        wait_for_ping(port, "ackproxy", &mut child);
        Proxy::running(port, child).owning(file)
    }

    /// ackproxy in front of `upstream_port` reading the configuration file
    /// `config` (which the test may rewrite), logging at `info` into `log`.
    pub fn start_logged(upstream_port: u16, config: &Path, log: &Path) -> Proxy {
        let port = free_port();
        let (listen, upstream) = (
            format!("127.0.0.1:{port}"),
            format!("127.0.0.1:{upstream_port}"),
        );
        let mut child = Command::new(env!("CARGO_BIN_EXE_ackproxy"))
            .args(["--listen", &listen, "--upstream", &upstream, "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("ackproxy binary");
        wait_for_ping(port, "ackproxy", &mut child);
        Proxy::running(port, child)
    }

    /// [`Proxy::start_logged`] with the configuration file
    /// `<temp dir>/<prefix>-<id>.toml` written from `toml`, and the log
    /// `<prefix>-<id>.log` beside it; returns the two paths too, which the
    /// caller removes.
    pub fn start_reloadable(
        upstream_port: u16,
        prefix: &str,
        toml: &str,
    ) -> (Proxy, PathBuf, PathBuf) {
        let id = free_port();
        let dir = std::env::temp_dir();
        let config = dir.join(format!("{prefix}-{id}.toml"));
        let log = dir.join(format!("{prefix}-{id}.log"));
        std::fs::write(&config, toml).unwrap();
        let proxy = Proxy::start_logged(upstream_port, &config, &log);
        (proxy, config, log)
    }

    /// SIGHUP: the proxy reloads its configuration.
    pub fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// ackproxy with a TOML config file written from `toml`.
    pub fn start_with_config(upstream_port: u16, toml: &str, extra: &[&str]) -> Proxy {
        let file = TempFile::new("ackproxy-test", "toml", toml);
        let mut args = vec!["--config", file.as_arg()];
        args.extend_from_slice(extra);
        Proxy::start(upstream_port, &args).owning(file)
    }

    /// A fresh redis-server, and ackproxy in front of it configured by
    /// `toml`.
    pub fn with_redis(toml: &str) -> (Redis, Proxy) {
        let redis = Redis::start();
        let proxy = Proxy::start_with_config(redis.port, toml, &[]);
        (redis, proxy)
    }

    /// [`Proxy::start_with_config`] with the metrics and admin endpoint
    /// on a free port of its own; returns that port too.
    pub fn start_with_metrics(upstream_port: u16, toml: &str) -> (Proxy, u16) {
        let m = free_port();
        let proxy = Proxy::start_with_config(
            upstream_port,
            toml,
            &["--metrics", &format!("127.0.0.1:{m}")],
        );
        (proxy, m)
    }

    fn running(port: u16, child: Child) -> Proxy {
        Proxy {
            port,
            child,
            files: Vec::new(),
        }
    }

    /// Keeps `file` until the proxy is dropped, and removes it then.
    pub fn owning(mut self, file: TempFile) -> Proxy {
        self.files.push(file);
        self
    }

    /// ackproxy with exactly `--listen` and these arguments, up once it
    /// answers PING (through its upstream): for one that finds Redis
    /// through the sentinels.
    pub fn start_args(args: &[&str]) -> Proxy {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut all = vec!["--listen", &listen];
        all.extend_from_slice(args);
        let mut child = Proxy::spawn(&all);
        wait_for_ping(port, "ackproxy", &mut child);
        Proxy::running(port, child)
    }

    pub fn client(&self) -> Client {
        Client::connect(self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, no clean-up: what a crash looks like.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for exit; returns whether it exited successfully.
    pub fn terminate(&mut self) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill9();
    }
}
