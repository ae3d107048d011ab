//! Polling until something holds, with limits that a loaded machine
//! slows but does not break.

use std::time::{Duration, Instant};

use super::info;

/// Polls `done` until it holds, failing after `what` did not happen for
/// 20 seconds.
pub fn wait_until(what: &str, done: impl FnMut() -> bool) {
    wait_until_within(what, Duration::from_secs(20), done);
}

/// [`wait_until`] with a limit of its own, for what takes long on a loaded
/// machine (a cluster forming, a failover).
pub fn wait_until_within(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `state` until it says done (`None`), failing only once what it
/// says (`Some(state)`) has not changed for 20 seconds, or after `cap`: a
/// wait that follows what it waits for, which a loaded machine slows but
/// does not stop.
pub fn wait_following(what: &str, cap: Duration, mut state: impl FnMut() -> Option<String>) {
    let started = Instant::now();
    let mut last = String::new();
    let mut moved = Instant::now();
    while let Some(now) = state() {
        if now != last {
            (last, moved) = (now, Instant::now());
        }
        assert!(
            moved.elapsed() < Duration::from_secs(20) && started.elapsed() < cap,
            "timed out waiting for {what}, at: {last}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the replica on `port` is in sync with its primary, for as
/// long as its synchronisation makes progress.
pub fn wait_replica_in_sync(port: u16, what: &str) {
    wait_following(what, Duration::from_secs(180), || {
        let info = info(port, "replication");
        if info.contains("master_link_status:up") {
            return None;
        }
        // The link, the transfer and the offset: any of them moving is
        // progress.
        let progress: Vec<&str> = info
            .lines()
            .filter(|l| {
                [
                    "master_link_status:",
                    "master_sync_in_progress:",
                    "master_sync_read_bytes:",
                    "slave_read_repl_offset:",
                ]
                .iter()
                .any(|k| l.starts_with(k))
            })
            .collect();
        Some(progress.join(" "))
    });
}

/// Polls `read` every `every` until it gives `Ok`, and returns that;
/// fails after `limit` with the last `Err` as the message.
pub fn poll_until<T>(
    limit: Duration,
    every: Duration,
    mut read: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match read() {
            Ok(v) => return v,
            Err(why) => assert!(Instant::now() < deadline, "{why}"),
        }
        std::thread::sleep(every);
    }
}
