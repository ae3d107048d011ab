//! Fixed-bucket histograms recorded with two relaxed atomic adds and
//! rendered in the Prometheus text format next to the exporter's output.
//!
//! The exporter's histograms keep every sample until the next scrape (a
//! lock-free list of blocks, sorted into buckets when rendered); on the
//! request path that cost about 160 instructions per request, 1.5% of a
//! passthrough GET. Request latency is recorded once per written batch of
//! every client, so it gets buckets counted as they happen instead.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts of values per bucket and their sum, in an integer unit (`per_second`
/// of them make a second), so that recording is two atomic adds.
pub struct Histogram {
    /// Upper bounds of the buckets, inclusive, ascending, in the unit.
    bounds: &'static [u64],
    /// One count per bound, and the last for values above every bound
    /// (not cumulative: summed when rendered).
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
    per_second: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [u64], per_second: u64) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            per_second: per_second as f64,
        }
    }

    /// Records `n` values of `value` (in the histogram's unit).
    pub fn record_many(&self, value: u64, n: u64) {
        // Most values fall in the first few buckets: a linear search ends
        // sooner than a binary one.
        let i = self
            .bounds
            .iter()
            .position(|&b| value <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(n, Ordering::Relaxed);
        self.sum
            .fetch_add(value.saturating_mul(n), Ordering::Relaxed);
    }

    pub fn record(&self, value: u64) {
        self.record_many(value, 1);
    }

    /// How many values were recorded.
    #[cfg(test)]
    fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// The `_bucket`, `_sum` and `_count` lines of this histogram as the
    /// series of `name` with `label`. `_count` is the `+Inf` bucket, so the
    /// two agree even while values are recorded during the rendering.
    pub fn render(&self, out: &mut String, name: &str, label: (&str, &str)) {
        let (key, value) = label;
        let value = escape_label(value);
        let mut total = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            total += c.load(Ordering::Relaxed);
            match self.bounds.get(i) {
                Some(&b) => {
                    let le = b as f64 / self.per_second;
                    let _ = writeln!(
                        out,
                        "{name}_bucket{{{key}=\"{value}\",le=\"{le}\"}} {total}"
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "{name}_bucket{{{key}=\"{value}\",le=\"+Inf\"}} {total}"
                    );
                }
            }
        }
        let sum = self.sum.load(Ordering::Relaxed) as f64 / self.per_second;
        let _ = writeln!(out, "{name}_sum{{{key}=\"{value}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{{key}=\"{value}\"}} {total}");
    }
}

/// The `# HELP` and `# TYPE` lines of a histogram family.
pub fn render_header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
}

/// A label value as the text format writes it.
fn escape_label(v: &str) -> std::borrow::Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return v.into();
    }
    let mut s = String::with_capacity(v.len() + 2);
    for ch in v.chars() {
        match ch {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: &[u64] = &[50, 100, 250_000];

    #[test]
    fn values_count_in_the_first_bucket_that_holds_them_and_render_cumulatively() {
        let h = Histogram::new(BOUNDS, 1_000_000);
        h.record(0);
        h.record(50); // bounds are inclusive, as `le` says
        h.record_many(51, 3);
        h.record(250_001);
        assert_eq!(h.count(), 6);
        let mut out = String::new();
        render_header(&mut out, "t_seconds", "Test.");
        h.render(&mut out, "t_seconds", ("route", "shared"));
        assert_eq!(
            out,
            "# HELP t_seconds Test.\n\
             # TYPE t_seconds histogram\n\
             t_seconds_bucket{route=\"shared\",le=\"0.00005\"} 2\n\
             t_seconds_bucket{route=\"shared\",le=\"0.0001\"} 5\n\
             t_seconds_bucket{route=\"shared\",le=\"0.25\"} 5\n\
             t_seconds_bucket{route=\"shared\",le=\"+Inf\"} 6\n\
             t_seconds_sum{route=\"shared\"} 0.250204\n\
             t_seconds_count{route=\"shared\"} 6\n"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let h = Histogram::new(BOUNDS, 1000);
        let mut out = String::new();
        h.render(&mut out, "t", ("rule", "a\"b\\c\nd"));
        assert!(
            out.starts_with("t_bucket{rule=\"a\\\"b\\\\c\\nd\",le=\"0.05\"} 0\n"),
            "{out}"
        );
    }

    #[test]
    fn the_inf_bucket_and_the_count_agree_and_buckets_never_fall() {
        let h = Histogram::new(BOUNDS, 1_000_000);
        h.record_many(75, 4);
        let mut out = String::new();
        render_header(&mut out, "t_seconds", "Test.");
        h.render(&mut out, "t_seconds", ("rule", "jobs:*"));
        let values: Vec<f64> = out
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(values, [0.0, 4.0, 4.0, 4.0, 0.0003, 4.0]);
    }
}
