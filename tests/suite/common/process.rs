//! Child processes: free ports, temporary files, waiting for a server to
//! answer, and ending a process by its PID.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use super::Client;

/// A loopback port nothing listens on, below Linux's ephemeral range
/// (32768–60999): a port the kernel hands out for `bind(0)` can be taken by
/// any outgoing connection between this call and the server's bind.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    // Each process starts elsewhere in 10000–31999; threads take turns.
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 10_000 + (start.wrapping_add(n) % 22_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// `dir`, created empty: whatever an earlier run left there is removed.
pub(super) fn fresh_dir(dir: PathBuf) -> PathBuf {
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A file in the temporary directory, removed when dropped: the
/// configuration files and logs tests write would otherwise pile up in
/// /tmp, a few hundred per run.
pub struct TempFile(PathBuf);

impl TempFile {
    /// `<temp dir>/<prefix>-<free port>.<ext>`, holding `contents`.
    pub fn new(prefix: &str, ext: &str, contents: &str) -> TempFile {
        let path = std::env::temp_dir().join(format!("{prefix}-{}.{ext}", free_port()));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }

    /// The path as a command-line argument.
    pub fn as_arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl std::ops::Deref for TempFile {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub(super) fn wait_for_ping(port: u16, what: &str, child: &mut Child) {
    wait_until_ready(port, what, child, || {
        let Ok(mut c) = Client::try_connect(port) else {
            return false;
        };
        c.send(&["PING"]);
        // A server still starting may accept and then close; one that
        // wants a login first is up too.
        c.try_read_raw()
            .is_ok_and(|r| r == b"+PONG\r\n" || r == b"-NOAUTH Authentication required.\r\n")
    });
}

/// Polls `ready` until it holds, failing if `child` exits first.
pub(super) fn wait_until_ready(
    port: u16,
    what: &str,
    child: &mut Child,
    mut ready: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if ready() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} on port {port} exited early: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "{what} on port {port} never became ready"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ends a child by its PID: SIGTERM, then SIGKILL if it is still there
/// after `grace`.
pub fn stop_child(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    // A stopped process (SIGSTOP) handles SIGTERM only once continued.
    for signal in ["-CONT", "-TERM"] {
        let _ = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status();
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A process's resident memory, in kB.
pub fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Whether python3 with redis-py is installed; when it is not, says that
/// the test calling it is skipped.
pub fn redis_py_installed() -> bool {
    let has = std::process::Command::new("python3")
        .args(["-c", "import redis"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        println!("skipped: python3 with redis-py not found (pip install redis)");
    }
    has
}

/// Fails, with what the command printed, unless it exited successfully.
pub fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `python3 -c script args...`, which must succeed.
pub fn python(script: &str, args: &[&str]) -> Output {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3");
    assert_success(&out, "python3");
    out
}
