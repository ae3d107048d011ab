//! A file that does not deserialize, said as the checks say theirs: one
//! line naming where (`file:line`) and the key, then what is wrong, in the
//! configuration's terms rather than serde's.

use std::ops::Range;

use toml::de::{DeTable, DeValue};

/// The tables of the configuration, each written once (`[limits]`).
const TABLES: [&str; 3] = ["limits", "embedded", "reaper"];

/// `error`, from deserializing `text` (read from `file`, if named), as one
/// line: `file:line: key: what`, the key as a dotted path
/// (`limits.maxclients`, `queue.lease_ms`).
pub(super) fn describe(error: &toml::de::Error, text: &str, file: Option<&str>) -> String {
    let message = error.message().trim_end();
    let Some(span) = error.span() else {
        return match file {
            Some(f) => format!("{f}: {message}"),
            None => message.to_string(),
        };
    };
    let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
    let place = match file {
        Some(f) => format!("{f}:{line}"),
        None => format!("line {line}"),
    };
    let key = key_at(text, &span);
    let message = match &key {
        Some(key) => explain(message, key, text),
        None => message.to_string(),
    };
    match key {
        Some(key) => format!("{place}: {key}: {message}"),
        None => format!("{place}: {message}"),
    }
}

/// Serde's message, where the configuration can say more: the nearest
/// known key for an unknown one, the table syntax a table needs.
fn explain(message: &str, key: &str, text: &str) -> String {
    if let Some(unknown) = unknown_key(message) {
        return unknown;
    }
    let written_as_array = || {
        DeTable::parse(text)
            .ok()
            .and_then(|doc| doc.get_ref().get(key).map(|v| v.get_ref().is_array()))
            .unwrap_or(false)
    };
    if key == "queue" && message.starts_with("invalid type: map, expected a sequence") {
        return "`[queue]` is one table; queue rules are an array of tables: write `[[queue]]`"
            .into();
    }
    if TABLES.contains(&key) && written_as_array() {
        return format!("`[[{key}]]` is an array of tables; {key} is one table: write `[{key}]`");
    }
    message.to_string()
}

/// For serde's "unknown field `x`, expected one of `a`, `b`, …": the
/// known key nearest to `x`, when one is close enough to be what was
/// meant; not the whole list (the top level has over 40).
fn unknown_key(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    let (name, rest) = rest.split_once('`')?;
    let known = rest.split('`').skip(1).step_by(2);
    let nearest = known
        .map(|k| (edit_distance(name, k), k))
        .min_by_key(|(d, _)| *d)
        .filter(|(d, k)| *d <= (name.len().max(k.len()) / 3).max(1));
    Some(match nearest {
        Some((_, k)) => format!("unknown key, did you mean `{k}`?"),
        None => "unknown key (config/ackproxy.toml, the commented example, \
                 shows every setting)"
            .to_string(),
    })
}

/// Levenshtein distance: insertions, deletions and substitutions.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(above + 1)
                .min(row[j] + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The dotted path of the innermost key whose name or value holds `span`
/// (rules' keys as `queue.key`: the line tells which rule).
fn key_at(text: &str, span: &Range<usize>) -> Option<String> {
    let doc = DeTable::parse(text).ok()?;
    let mut path = Vec::new();
    in_table(doc.get_ref(), span, &mut path).then(|| path.join("."))
}

fn in_table(table: &DeTable<'_>, span: &Range<usize>, path: &mut Vec<String>) -> bool {
    let holds = |s: Range<usize>| s.start <= span.start && span.end <= s.end;
    for (key, value) in table.iter() {
        path.push(key.get_ref().to_string());
        if holds(key.span()) || in_value(value.get_ref(), span, path) || holds(value.span()) {
            return true;
        }
        path.pop();
    }
    false
}

fn in_value(value: &DeValue<'_>, span: &Range<usize>, path: &mut Vec<String>) -> bool {
    match value {
        DeValue::Table(t) => in_table(t, span, path),
        DeValue::Array(a) => a.iter().any(|v| in_value(v.get_ref(), span, path)),
        _ => false,
    }
}
