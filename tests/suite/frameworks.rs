//! Real job frameworks, unchanged, through ackproxy with the shipped
//! `config/frameworks/*.toml` and nothing else: their own enqueue API,
//! their real workers, SIGKILL of the whole worker process tree at least
//! eight times while a job runs (ten kills), then a restart. A job is lost when the
//! line it appends (fsync'd) at its end never appears. The same harness
//! against plain Redis, in the same test, must lose jobs: it proves the
//! test can see a loss.
//!
//! The harness and the framework adapters are in `tests/frameworks/`;
//! `tests/frameworks/setup.sh` installs the frameworks at pinned versions
//! (tests/run.sh calls it).

use std::process::Command;

use crate::common::*;

/// Kills per run: at least 8 must land while a job runs, and now and then
/// one lands just as its job writes its last line.
const KILLS: u64 = 10;

/// What one run of the harness counted.
struct Outcome {
    jobs: u64,
    done: u64,
    lost: u64,
    duplicates: u64,
    max_runs: u64,
    kills_mid_job: u64,
    /// The harness's own account (kills, jobs in flight), shown when an
    /// assertion fails.
    log: String,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "jobs {} done {} lost {} duplicates {} max_runs {} kills_mid_job {}",
            self.jobs, self.done, self.lost, self.duplicates, self.max_runs, self.kills_mid_job
        )
    }
}

/// Runs the kill harness for `framework` against the Redis (or proxy) on
/// `port`.
fn killtest(framework: &str, port: u16, jobs: u64, settle_s: u64) -> Outcome {
    let workdir = std::env::temp_dir().join(format!("ackproxy-killtest-{}", free_port()));
    let out = Command::new("python3")
        .args([
            "tests/frameworks/killtest.py",
            framework,
            "--url",
            &format!("redis://127.0.0.1:{port}/0"),
            "--jobs",
            &jobs.to_string(),
            "--kills",
            &KILLS.to_string(),
            "--settle-s",
            &settle_s.to_string(),
            "--workdir",
        ])
        .arg(&workdir)
        .output()
        .expect("python3");
    let _ = std::fs::remove_dir_all(&workdir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "killtest {framework} failed ({}); is it installed (bash tests/frameworks/setup.sh)?\n{stderr}",
        out.status
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .unwrap_or_else(|e| panic!("killtest {framework}: {e}: {line}\n{stderr}"));
    let n = |k: &str| {
        v[k].as_u64()
            .unwrap_or_else(|| panic!("killtest {framework}: no {k} in {line}"))
    };
    Outcome {
        jobs: n("jobs"),
        done: n("done"),
        lost: n("lost"),
        duplicates: n("duplicates"),
        max_runs: n("max_runs"),
        kills_mid_job: n("kills_mid_job"),
        log: stderr
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// What plain Redis must show for a framework setting.
#[derive(Clone, Copy, PartialEq)]
enum Control {
    /// It loses jobs: the proxy's 0 means something.
    Loses,
    /// The framework recovers by itself (a stalled-job checker): not run.
    NotNeeded,
}

/// `framework` through a proxy with `config`, then (see [`Control`]) on
/// plain Redis. `in_flight`: the most jobs one worker holds at once
/// (concurrency × prefetch), which bounds the jobs one kill may make run
/// twice. Returns the run through the proxy.
fn compare(
    framework: &str,
    config: &str,
    jobs: u64,
    in_flight: u64,
    settle_s: u64,
    control: Control,
) -> Outcome {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port, &["--config", config]);
    let through = killtest(framework, proxy.port, jobs, settle_s);
    drop(proxy);
    drop(redis);
    eprintln!("{framework}: through ackproxy {through:?}\n{}", through.log);
    assert!(
        through.kills_mid_job >= 8,
        "{framework}: kills mid-job: {through:?}"
    );
    // Each kill may make the jobs its worker held run again, no more.
    assert!(
        through.duplicates <= KILLS * in_flight && through.max_runs <= 1 + KILLS,
        "{framework}: more jobs ran twice than the kills explain: {through:?}"
    );
    if control == Control::Loses {
        let plain_redis = Redis::start();
        let plain = killtest(framework, plain_redis.port, jobs, 10);
        eprintln!("{framework}: plain Redis {plain:?}\n{}", plain.log);
        // Plain Redis loses each killed worker's prefetched jobs, so the
        // queue can run dry before the last kills (Celery with prefetch 4
        // had 6 or 7 of 10 kills land mid-job): one is enough to show the
        // loss the proxy prevents.
        assert!(
            plain.kills_mid_job >= 1,
            "{framework}: kills mid-job: {plain:?}"
        );
        assert!(
            plain.lost >= 1,
            "{framework}: plain Redis lost nothing, so the test cannot see a loss: {plain:?}"
        );
    }
    through
}

/// A framework setting the shipped file protects: nothing lost.
fn protected(framework: &str, config: &str, in_flight: u64, control: Control) {
    let through = compare(framework, config, 200, in_flight, 30, control);
    assert_eq!(
        through.lost, 0,
        "{framework}: lost through ackproxy: {through:?}"
    );
    assert_eq!(through.done, through.jobs);
}

#[test]
fn rq_on_one_queue_loses_nothing() {
    protected("rq", "config/frameworks/rq.toml", 1, Control::Loses);
}

#[test]
fn celery_with_early_ack_and_a_result_backend_loses_nothing() {
    // The default concurrency (the cores) × the default prefetch of 4.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u64);
    protected(
        "celery:early",
        "config/frameworks/celery.toml",
        4 * cores,
        Control::Loses,
    );
}

#[test]
fn celery_acks_late_with_four_processes_and_prefetch_four_loses_nothing() {
    protected(
        "celery:late4",
        "config/frameworks/celery.toml",
        16,
        Control::Loses,
    );
}

/// Without a result backend Celery writes nothing when a task ends but
/// kombu's own ack, which `acks_late` puts after the task.
#[test]
fn celery_acks_late_without_a_result_backend_loses_nothing() {
    protected(
        "celery:late4-nobackend",
        "config/frameworks/celery-acks-late.toml",
        16,
        Control::Loses,
    );
}

#[test]
fn hotqueue_loses_nothing() {
    protected(
        "hotqueue",
        "config/frameworks/hotqueue.toml",
        1,
        Control::Loses,
    );
}

#[test]
fn bee_queue_without_its_stall_checker_loses_nothing() {
    protected(
        "bee_queue:nochecker",
        "config/frameworks/bee-queue.toml",
        2,
        Control::Loses,
    );
}

#[test]
fn bee_queue_with_its_stall_checker_loses_nothing() {
    protected(
        "bee_queue:checker",
        "config/frameworks/bee-queue.toml",
        2,
        Control::NotNeeded,
    );
}

/// Bull recovers a killed worker's jobs with its own stalled-job checker
/// (30 s locks): through the proxy, with no rule, it must do as well, and
/// run no job more often than the kills explain.
#[test]
fn bull_with_its_stall_checker_loses_nothing_and_runs_nothing_twice() {
    let through = compare(
        "bull",
        "config/frameworks/bull.toml",
        200,
        2,
        150,
        Control::NotNeeded,
    );
    // (A job that finished but was killed before Bull recorded it runs
    // again: its own checker's doing, within the bound `compare` checks.)
    assert_eq!(through.lost, 0, "bull: {through:?}");
}

/// Sidekiq's basic fetch gives no signal a job ended: its shipped file has
/// no rule, so it must fare as on plain Redis: every lost job one a kill
/// interrupted (at most its 10 threads' jobs per kill), and none run twice.
#[test]
fn sidekiq_is_no_worse_off_than_on_plain_redis() {
    let through = compare(
        "sidekiq",
        "config/frameworks/sidekiq.toml",
        1000,
        10,
        15,
        Control::Loses,
    );
    assert_eq!(through.duplicates, 0, "sidekiq: {through:?}");
    assert!(through.lost <= KILLS * 10, "sidekiq: {through:?}");
}
