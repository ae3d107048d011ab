//! Redis's glob patterns (`KEYS`, `SCAN MATCH`, `PSUBSCRIBE`) as queue
//! rules use them: the matcher, and the check that a configured pattern
//! reads as its writer meant.

/// Whether a rule's pattern is a glob rather than an exact key name.
pub fn is_glob(p: &[u8]) -> bool {
    p.iter().any(|c| matches!(c, b'*' | b'?' | b'[' | b'\\'))
}

/// Redis's `stringmatchlen`, case-sensitive, in O(len(pattern) * len(s)):
/// Redis's own recursion (like a naive one) is quadratic or worse in the key
/// length for patterns with several `*`, and the proxy matches keys of up to
/// hundreds of KB on its single thread.
pub fn glob_match(pattern: &[u8], s: &[u8]) -> bool {
    glob_match_steps(pattern, s).0
}

/// The match and the number of steps it took, so tests can bound the cost
/// without timing it.
fn glob_match_steps(pattern: &[u8], s: &[u8]) -> (bool, u64) {
    // Redis compares only while both pattern and string are left, so an
    // empty string matches nothing but the empty pattern, not even `*`.
    if s.is_empty() {
        return (pattern.is_empty(), 0);
    }
    let mut steps = 0u64;
    let (mut p, mut i) = (0usize, 0usize);
    // The latest `*`: where the pattern after it starts, and where in `s`
    // that rest is being tried. Backtracking only to the latest star is
    // enough: a later star can absorb whatever an earlier one would have.
    let mut star: Option<(usize, usize)> = None;
    loop {
        steps += 1;
        if i == s.len() {
            while pattern.get(p) == Some(&b'*') {
                p += 1;
                steps += 1;
            }
            // Every token but `*` consumes exactly one byte, so running out of
            // string here means the rest after the star cannot fit from any
            // later start either.
            return (p == pattern.len(), steps);
        }
        if pattern.get(p) == Some(&b'*') {
            while pattern.get(p + 1) == Some(&b'*') {
                p += 1;
                steps += 1;
            }
            if p + 1 == pattern.len() {
                return (true, steps);
            }
            p += 1;
            star = Some((p, i));
            continue;
        }
        if p < pattern.len() {
            if let Some(next) = match_token(pattern, p, s[i], &mut steps) {
                p = next;
                i += 1;
                continue;
            }
        }
        match star {
            Some((rest, from)) => {
                star = Some((rest, from + 1));
                p = rest;
                i = from + 1;
            }
            None => return (false, steps),
        }
    }
}

/// Whether the single-byte token (not `*`) at `pattern[p]` matches `c`, and
/// if so where the next token starts.
fn match_token(pattern: &[u8], p: usize, c: u8, steps: &mut u64) -> Option<usize> {
    match pattern[p] {
        b'?' => Some(p + 1),
        b'[' => {
            let mut q = p + 1;
            let not = pattern.get(q) == Some(&b'^');
            if not {
                q += 1;
            }
            let mut matched = false;
            loop {
                *steps += 1;
                if q >= pattern.len() {
                    // Unterminated: the class runs to the end of the pattern.
                    q -= 1;
                    break;
                }
                if pattern[q] == b'\\' && q + 1 < pattern.len() {
                    q += 1;
                    matched |= pattern[q] == c;
                } else if pattern[q] == b']' {
                    break;
                } else if q + 2 < pattern.len() && pattern[q + 1] == b'-' {
                    matched |= in_range(pattern[q], pattern[q + 2], c);
                    q += 2;
                } else {
                    matched |= pattern[q] == c;
                }
                q += 1;
            }
            (matched != not).then_some(q + 1)
        }
        b'\\' if p + 1 < pattern.len() => (pattern[p + 1] == c).then_some(p + 2),
        b => (b == c).then_some(p + 1),
    }
}

/// Redis compares range bounds as C `char`, which is signed on the x86-64
/// builds it is deployed on: `[a-\xff]` is the range -1..=97 and does not
/// contain `b`.
fn in_range(a: u8, b: u8, c: u8) -> bool {
    let (a, b, c) = (a as i8, b as i8, c as i8);
    a.min(b) <= c && c <= a.max(b)
}

/// A `[...]` class that the matcher (`glob_match`, Redis's
/// `stringmatchlen`) would not read as written. An unclosed `[` does not
/// fail there: the class runs to the end of the pattern, so `jobs[` matches
/// no key at all, and `jobs[12` matches `jobs1` but not `jobs[12`. An empty
/// `[]` matches no character.
pub fn check_glob(pattern: &str) -> Result<(), String> {
    let p = pattern.as_bytes();
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            // Escapes the next byte (a trailing `\` is itself).
            b'\\' => i += 2,
            b'[' => {
                let open = i;
                let mut q = i + 1;
                if p.get(q) == Some(&b'^') {
                    q += 1;
                }
                let first = q;
                // The class's tokens as the matcher reads them: `\x`, a
                // range `a-z` (whose end may be `]`), or one byte.
                loop {
                    if q >= p.len() {
                        return Err(format!(
                            "the [ at character {} is not closed by a ], so {}; for a literal [ \
                             write \\[ (in TOML \"\\\\[\" or '\\[')",
                            pattern[..open].chars().count() + 1,
                            match (first >= p.len(), first > open + 1) {
                                (true, false) => "the rule would match no key",
                                (true, true) => "it would match any one character",
                                (false, _) => {
                                    "all that follows it would be one class matching one character"
                                }
                            }
                        ));
                    }
                    if p[q] == b'\\' && q + 1 < p.len() {
                        q += 2;
                    } else if p[q] == b']' {
                        break;
                    } else if q + 2 < p.len() && p[q + 1] == b'-' {
                        q += 3;
                    } else {
                        q += 1;
                    }
                }
                if q == first && first == open + 1 {
                    return Err(format!(
                        "the [] at character {} matches no character, so the rule would \
                         match no key; for a literal [] write \\[]",
                        pattern[..open].chars().count() + 1
                    ));
                }
                i = q + 1;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The straightforward recursive matcher the proxy used before, kept as
    /// the reference for the iterative one; it counts its steps so the
    /// blow-up it suffers from can be shown without timing.
    fn reference(pattern: &[u8], s: &[u8], steps: &mut u64) -> bool {
        if s.is_empty() {
            return pattern.is_empty();
        }
        reference_rest(pattern, s, steps)
    }

    fn reference_rest(pattern: &[u8], s: &[u8], steps: &mut u64) -> bool {
        let (mut p, mut i) = (0usize, 0usize);
        while p < pattern.len() {
            *steps += 1;
            match pattern[p] {
                b'*' => {
                    while p + 1 < pattern.len() && pattern[p + 1] == b'*' {
                        p += 1;
                    }
                    if p + 1 == pattern.len() {
                        return true;
                    }
                    return (i..=s.len())
                        .any(|j| reference_rest(&pattern[p + 1..], &s[j..], steps));
                }
                b'?' => {
                    if i >= s.len() {
                        return false;
                    }
                    i += 1;
                }
                b'[' => {
                    if i >= s.len() {
                        return false;
                    }
                    p += 1;
                    let not = pattern.get(p) == Some(&b'^');
                    if not {
                        p += 1;
                    }
                    let mut matched = false;
                    loop {
                        if p >= pattern.len() {
                            p -= 1;
                            break;
                        }
                        if pattern[p] == b'\\' && p + 1 < pattern.len() {
                            p += 1;
                            if pattern[p] == s[i] {
                                matched = true;
                            }
                        } else if pattern[p] == b']' {
                            break;
                        } else if p + 2 < pattern.len() && pattern[p + 1] == b'-' {
                            let (mut lo, mut hi) = (pattern[p] as i8, pattern[p + 2] as i8);
                            if lo > hi {
                                std::mem::swap(&mut lo, &mut hi);
                            }
                            p += 2;
                            if s[i] as i8 >= lo && s[i] as i8 <= hi {
                                matched = true;
                            }
                        } else if pattern[p] == s[i] {
                            matched = true;
                        }
                        p += 1;
                    }
                    if matched == not {
                        return false;
                    }
                    i += 1;
                }
                b'\\' if p + 1 < pattern.len() => {
                    p += 1;
                    if i >= s.len() || pattern[p] != s[i] {
                        return false;
                    }
                    i += 1;
                }
                c => {
                    if i >= s.len() || c != s[i] {
                        return false;
                    }
                    i += 1;
                }
            }
            p += 1;
        }
        i == s.len()
    }

    fn reference_match(pattern: &[u8], s: &[u8]) -> bool {
        reference(pattern, s, &mut 0)
    }

    /// (pattern, key, whether `KEYS pattern` returns the key) as observed on
    /// redis-server 7.0.15 (x86-64). `*` alone is left out: `KEYS` and `SCAN`
    /// short-cut it to "everything", bypassing the matcher.
    const REDIS_CASES: &[(&[u8], &[u8], bool)] = &[
        (b"**", b"", false),
        (b"?*", b"", false),
        (b"", b"", true),
        (b"a*", b"a", true),
        (b"a**", b"a", true),
        (b"*a", b"a", true),
        (b"[a-\xff]", b"b", false),
        (b"[a-\xff]", b"\x80", false),
        (b"[\x80-\xff]", b"\x90", true),
        (b"[\x80-a]", b"b", false),
        (b"[\x80-a]", b"\xff", true),
        (b"[z-a]", b"m", true),
        (b"[^", b"x", true),
        (b"[", b"[", false),
        (b"[abc", b"b", true),
        (b"a[b", b"ab", true),
        (b"a\\", b"a\\", true),
        (b"[a-]", b"b", false),
        (b"[a-]", b"]", true),
        (b"[]", b"]", false),
        (b"[^]", b"x", true),
        (b"[\\", b"\\", true),
        (b"[]a]", b"a]", false),
    ];

    #[test]
    fn quirks_match_redis() {
        for &(p, s, want) in REDIS_CASES {
            assert_eq!(
                glob_match(p, s),
                want,
                "{:?} vs {:?}",
                p.escape_ascii().to_string(),
                s.escape_ascii().to_string()
            );
            assert_eq!(
                reference_match(p, s),
                want,
                "reference: {:?} vs {:?}",
                p.escape_ascii().to_string(),
                s.escape_ascii().to_string()
            );
        }
    }

    /// A key of `:jobs:` repeated to 60 KB against `*:jobs:*:pending`, which
    /// took the recursive matcher over a second.
    fn jobs_key(len: usize) -> Vec<u8> {
        b":jobs:".iter().copied().cycle().take(len).collect()
    }

    const JOBS_PATTERN: &[u8] = b"*:jobs:*:pending";

    fn step_bound(p: &[u8], s: &[u8]) -> u64 {
        (p.len() as u64 + 1) * (s.len() as u64 + 1)
    }

    #[test]
    fn long_key_costs_at_most_pattern_times_key() {
        let key = jobs_key(60_000);
        let (matched, steps) = glob_match_steps(JOBS_PATTERN, &key);
        assert!(!matched);
        assert!(steps <= step_bound(JOBS_PATTERN, &key), "{steps} steps");
        let mut hit = key.clone();
        hit.extend_from_slice(b":pending");
        let (matched, steps) = glob_match_steps(JOBS_PATTERN, &hit);
        assert!(matched);
        assert!(steps <= step_bound(JOBS_PATTERN, &hit), "{steps} steps");
    }

    #[test]
    fn the_recursive_reference_is_past_the_bound() {
        // Shows the step bound above is meaningful: the old matcher exceeds it
        // many times over, already on a key a tenth as long.
        let key = jobs_key(6_000);
        let mut steps = 0;
        assert!(!reference(JOBS_PATTERN, &key, &mut steps));
        assert!(steps > 10 * step_bound(JOBS_PATTERN, &key), "{steps} steps");
    }

    fn glob_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(proptest::sample::select(b"*?[]^-\\abc:".to_vec()), 0..max)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        #[test]
        fn iterative_agrees_with_reference(p in glob_bytes(9), s in glob_bytes(9)) {
            let (matched, steps) = glob_match_steps(&p, &s);
            prop_assert_eq!(matched, reference_match(&p, &s));
            prop_assert!(steps <= step_bound(&p, &s), "{} steps", steps);
        }
    }

    #[test]
    fn globs_follow_redis() {
        assert!(glob_match(b"tasks:*", b"tasks:a"));
        assert!(glob_match(b"tasks:*", b"tasks:"));
        assert!(!glob_match(b"tasks:*", b"task"));
        assert!(glob_match(b"q?", b"q1"));
        assert!(!glob_match(b"q?", b"q"));
        assert!(glob_match(b"q[0-9]", b"q5"));
        assert!(!glob_match(b"q[^0-9]", b"q5"));
        assert!(glob_match(b"q[abc]x", b"qbx"));
        assert!(glob_match(b"a\\*b", b"a*b"));
        assert!(!glob_match(b"a\\*b", b"axb"));
        assert!(glob_match(b"*:jobs:*", b"eu:jobs:mail"));
    }
}
