//! Durations in the configuration: a plain number is in the key's own unit
//! (`lease_ms = 30000`, `idle_timeout_secs = 300`), as it always was; a
//! string carries its unit (`"250ms"`, `"30s"`, `"5m"`, `"1h"`). Each key
//! keeps one meaning: what it holds is in its unit, whichever was written.

use serde::de::{self, Deserializer, Visitor};

/// The unit of a key's plain numbers, and of what it holds.
#[derive(Clone, Copy)]
enum Unit {
    Millis,
    Secs,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Millis => "milliseconds",
            Unit::Secs => "seconds",
        }
    }
}

/// A `*_ms` key.
pub(super) fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(Duration(Unit::Millis))
}

/// An optional `*_ms` key (with `#[serde(default)]`: absent is `None`).
pub(super) fn opt_millis<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    millis(d).map(Some)
}

/// A `*_secs` key.
pub(super) fn secs<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(Duration(Unit::Secs))
}

struct Duration(Unit);

impl Visitor<'_> for Duration {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "a whole number of {}, or a duration with a unit (\"250ms\", \"30s\", \"5m\", \"1h\")",
            self.0.name()
        )
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<u64, E> {
        Ok(n)
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<u64, E> {
        u64::try_from(n).map_err(|_| E::custom(format!("a duration cannot be negative, got {n}")))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
        parse(s, self.0).map_err(E::custom)
    }
}

/// `"<whole number><unit>"`, in `unit`.
fn parse(s: &str, unit: Unit) -> Result<u64, String> {
    let bad = || {
        format!(
            "{s:?} is not a duration: write a whole number with a unit, ms, s, m or h \
             (\"250ms\", \"30s\", \"5m\", \"1h\"), or a plain number of {}",
            unit.name()
        )
    };
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    let per_unit: u64 = match suffix.trim_start() {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(bad()),
    };
    if number.is_empty() {
        return Err(bad());
    }
    let ms = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(per_unit))
        .ok_or_else(|| format!("{s:?} is longer than any duration the proxy can hold"))?;
    match unit {
        Unit::Millis => Ok(ms),
        Unit::Secs if ms % 1_000 == 0 => Ok(ms / 1_000),
        Unit::Secs => Err(format!(
            "{s:?} is not a whole number of seconds, which this key holds"
        )),
    }
}
