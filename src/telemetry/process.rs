//! The process's own series, under the names Prometheus's client libraries
//! give them, read when `/metrics` is scraped: CPU time and the open-file
//! limit from the kernel's calls, memory and descriptors from
//! `/proc/self`. Rendered as text here: CPU seconds are fractional, which a
//! `metrics` counter (whole numbers) cannot hold.

use std::fmt::Write as _;

/// Appends the process series to `out`; one that cannot be read is left
/// out, not reported as 0.
pub(super) fn render(out: &mut String) {
    let mut series = |name: &str, kind: &str, help: &str, value: Option<f64>| {
        if let Some(v) = value {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n\n"
            );
        }
    };
    series(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        cpu_seconds(),
    );
    let (virt, resident) = memory().unzip();
    series(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        resident,
    );
    series(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        virt,
    );
    series(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as f64),
    );
    series(
        "process_max_fds",
        "gauge",
        "Maximum number of open file descriptors.",
        max_fds(),
    );
    series(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        start_time(),
    );
}

fn cpu_seconds() -> Option<f64> {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(secs(usage.ru_utime) + secs(usage.ru_stime))
}

/// Virtual and resident size, in bytes (`/proc/self/statm` counts pages).
fn memory() -> Option<(f64, f64)> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut pages = statm.split_whitespace().map(|p| p.parse::<f64>().ok());
    let (size, resident) = (pages.next()??, pages.next()??);
    // SAFETY: sysconf only reads a setting.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    Some((size * page, resident * page))
}

fn max_fds() -> Option<f64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    Some(limit.rlim_cur as f64)
}

/// When the process started: its start in clock ticks after boot (field
/// 22 of `/proc/self/stat`) plus the boot time (`btime` of `/proc/stat`).
fn start_time() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The name (field 2) is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let ticks: f64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
    let boot: f64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf only reads a setting.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(boot + ticks / per_second)
}
