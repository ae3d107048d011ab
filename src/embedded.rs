//! The embedded default: with no upstream configured, a private
//! redis-server child on a free loopback port, stopped with the proxy.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStderr, Command};
use tokio::task::JoinHandle;

use crate::config::EmbeddedConfig;
use crate::error::StartError;

/// Where `redis-server` (or the configured binary) would be run from, if
/// it can be: a path as given, or the first match on PATH.
pub fn find_binary(bin: &str) -> Option<PathBuf> {
    let is_exe = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if bin.contains('/') {
        let p = PathBuf::from(bin);
        return is_exe(&p).then_some(p);
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(bin))
        .find(|p| is_exe(p))
}

/// How long the private redis-server has to stop when asked to.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct EmbeddedRedis {
    pub addr: String,
    child: Child,
    scratch: Option<PathBuf>,
    /// Passes what the server writes to stderr on to the log.
    stderr: Option<JoinHandle<()>>,
}

impl EmbeddedRedis {
    pub async fn start(cfg: &EmbeddedConfig) -> Result<EmbeddedRedis, StartError> {
        let port = free_port().map_err(|e| StartError::Embedded(e.to_string()))?;
        let (dir, scratch) = match &cfg.dir {
            Some(d) => (d.clone(), None),
            None => {
                remove_stale_scratch();
                let d =
                    std::env::temp_dir().join(format!("{SCRATCH_PREFIX}{}", std::process::id()));
                (d.clone(), Some(d))
            }
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| StartError::Embedded(format!("{}: {e}", dir.display())))?;
        let mut cmd = Command::new(&cfg.redis_server);
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&dir)
            .args(["--save", ""])
            .args(["--appendonly", if cfg.persistence { "yes" } else { "no" }])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Through the log rather than inherited: with JSON logs every
            // line of the proxy's stderr is JSON.
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // kill_on_drop covers a clean exit only; a proxy killed with
        // SIGKILL would leave the server running, reparented to init.
        // SAFETY: prctl and getppid are async-signal-safe, as pre_exec needs.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The proxy may have died between fork and prctl.
                if libc::getppid() == 1 {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                StartError::RedisServerMissing(cfg.redis_server.clone())
            } else {
                StartError::Embedded(format!("{}: {e}", cfg.redis_server))
            }
        })?;
        let stderr = child.stderr.take().map(|s| tokio::spawn(relay_stderr(s)));
        let mut me = EmbeddedRedis {
            addr: format!("127.0.0.1:{port}"),
            child,
            scratch,
            stderr,
        };
        me.wait_ready().await?;
        tracing::info!(addr = %me.addr, persistence = cfg.persistence, "started private redis-server");
        Ok(me)
    }

    async fn wait_ready(&mut self) -> Result<(), StartError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                // Its last words first: they say why.
                if let Some(relay) = self.stderr.take() {
                    let _ = tokio::time::timeout(Duration::from_secs(1), relay).await;
                }
                return Err(StartError::Embedded(format!("exited at start: {status}")));
            }
            if ping(&self.addr).await {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(StartError::Embedded(
                    "did not answer PING within 10 s".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM first: with persistence on, Redis writes and syncs what its
    /// append-only file still lacks before it exits (SIGKILL would lose the
    /// last writes, acknowledged to clients); SIGKILL only if it takes
    /// longer than [`STOP_TIMEOUT`].
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on the child's pid, which is ours until it is
            // waited for below.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
            if tokio::time::timeout(STOP_TIMEOUT, self.child.wait())
                .await
                .is_err()
            {
                tracing::warn!("redis-server did not stop within {STOP_TIMEOUT:?}; killed");
            }
        }
        let _ = self.child.kill().await;
        if let Some(d) = self.scratch.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The default directory of the private server is this followed by the
/// proxy's pid, in the temporary directory.
const SCRATCH_PREFIX: &str = "ackproxy-redis-";

/// Removes the default directories of proxies that no longer run. A proxy
/// removes its own when it stops, but one killed with SIGKILL cannot; the
/// next one to start clears what it left.
fn remove_stale_scratch() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SCRATCH_PREFIX))
            .and_then(|p| p.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Each line the server writes to stderr, as a warning of the proxy's.
async fn relay_stderr(stderr: ChildStderr) {
    let mut lines = tokio::io::BufReader::new(stderr).split(b'\n');
    while let Ok(Some(line)) = lines.next_segment().await {
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end();
        if !line.is_empty() {
            tracing::warn!("redis-server: {line}");
        }
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn ping(addr: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return false;
    };
    if s.write_all(b"PING\r\n").await.is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    matches!(
        tokio::time::timeout(Duration::from_secs(1), s.read_exact(&mut buf)).await,
        Ok(Ok(_)) if &buf == b"+PONG\r\n"
    )
}
