//! Text helpers shared by the strategies: character-safe truncation, first lines, and
//! the identifiers (file paths, URLs, IDs, numbers with units, ports, names) a summary
//! must keep.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::OnceLock;

use regex::Regex;

/// At most `max` characters of `s` (cut at a character boundary), with `…` when cut.
pub fn truncate_chars(s: &str, max: usize) -> Cow<'_, str> {
    match s.char_indices().nth(max) {
        None => Cow::Borrowed(s),
        Some((at, _)) => Cow::Owned(format!("{}…", &s[..at])),
    }
}

/// The byte index where the last `n` characters of `s` start.
fn last_chars_start(s: &str, n: usize) -> usize {
    if n == 0 {
        return s.len();
    }
    s.char_indices().rev().nth(n - 1).map_or(0, |(i, _)| i)
}

/// `s` kept whole when it has at most `head + tail` characters; otherwise its first
/// `head` and last `tail` characters around a note of how many were left out. `clean` is
/// applied to each kept piece with a margin of 256 characters around the cut, so that a
/// secret crossing a cut is still recognised and redacted.
pub fn head_tail(
    s: &str,
    head: usize,
    tail: usize,
    clean: impl Fn(&str) -> Cow<'_, str>,
) -> String {
    const MARGIN: usize = 256;
    let total = s.chars().count();
    if total <= head + tail {
        return clean(s).into_owned();
    }
    let head_end = s
        .char_indices()
        .nth(head + MARGIN)
        .map_or(s.len(), |(i, _)| i);
    let tail_start = last_chars_start(s, tail + MARGIN);
    let first = clean(&s[..head_end]);
    let last = clean(&s[tail_start..]);
    let first = match first.char_indices().nth(head) {
        Some((i, _)) => &first[..i],
        None => &first[..],
    };
    let last = &last[last_chars_start(&last, tail)..];
    format!(
        "{first}\n[… {} characters omitted …]\n{last}",
        total.saturating_sub(head + tail)
    )
}

/// The first non-blank line of `s`, trimmed and cut to `max` characters.
pub fn first_line(s: &str, max: usize) -> Cow<'_, str> {
    let line = s
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    truncate_chars(line, max)
}

/// Most characters of a message scanned for paths, identifiers and cues, from its start
/// and its end (bounds the cost on huge tool outputs).
const SCAN_HEAD: usize = 16 * 1024;
const SCAN_TAIL: usize = 4 * 1024;

/// A message's text as scanned: the start and end of long ones.
pub fn scanned(text: &str) -> (&str, &str) {
    if text.len() <= SCAN_HEAD + SCAN_TAIL {
        return (text, "");
    }
    let mut a = SCAN_HEAD;
    while !text.is_char_boundary(a) {
        a -= 1;
    }
    let mut b = text.len() - SCAN_TAIL;
    while !text.is_char_boundary(b) {
        b += 1;
    }
    (&text[..a], &text[b..])
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A constant pattern, compiled once. The patterns are literals covered by the tests.
#[expect(
    clippy::expect_used,
    reason = "constant patterns, compiled by the unit tests"
)]
pub(crate) fn compile(patterns: &[&str]) -> Vec<Regex> {
    patterns
        .iter()
        .map(|p| Regex::new(p).expect("constant pattern compiles"))
        .collect()
}

/// File paths: at least one `/` between name characters, or a bare name with a common
/// source or config extension.
fn path_patterns() -> &'static [Regex] {
    static P: OnceLock<Vec<Regex>> = OnceLock::new();
    P.get_or_init(|| {
        compile(&[
            r"(?:~|\.{1,2})?/?(?:[A-Za-z0-9_.@+-]+/)+[A-Za-z0-9_.@+-]*[A-Za-z0-9_]",
            r"\b[A-Za-z0-9_-]+\.(?:rs|py|ts|tsx|js|jsx|mjs|go|java|kt|rb|php|c|h|cc|cpp|hpp|cs|swift|md|toml|yaml|yml|json|txt|sh|sql|html|css|lock|cfg|ini|xml|proto)\b",
        ])
    })
}

/// The longest file name most file systems allow, and the longest path Linux takes, in
/// bytes: a longer "name" between slashes, or a longer "path", is data (base64 has
/// slashes), not a path.
const NAME_MAX: usize = 255;
const PATH_MAX: usize = 4096;

/// File-path mentions in `s`, in order, each once (URLs are not paths; nor is a run with a
/// name over [`NAME_MAX`] between its slashes or over [`PATH_MAX`] in all, such as an
/// image in base64). Linear in `s`: the matches of one pattern never overlap, so a match
/// is checked against the URLs and the earlier pattern's paths by binary search.
pub fn paths(s: &str) -> Vec<&str> {
    let urls: Vec<(usize, usize)> = url_pattern()
        .find_iter(s)
        .map(|m| (m.start(), m.end()))
        .collect();
    let mut found: Vec<(usize, &str)> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    // Spans taken by each earlier pattern, in order and disjoint.
    let mut taken: Vec<Vec<(usize, usize)>> = Vec::new();
    for re in path_patterns() {
        let mut spans = Vec::new();
        for m in re.find_iter(s) {
            let (a, b) = (m.start(), m.end());
            let text = m.as_str().trim_end_matches('.');
            if overlaps(&urls, a, b) || taken.iter().any(|t| overlaps(t, a, b)) || text.len() <= 2 {
                continue;
            }
            spans.push((a, b));
            if text.len() <= PATH_MAX
                && text.split('/').all(|part| part.len() <= NAME_MAX)
                && seen.insert(text)
            {
                found.push((a, text));
            }
        }
        taken.push(spans);
    }
    found.sort_by_key(|&(at, _)| at);
    found.into_iter().map(|(_, t)| t).collect()
}

/// Whether `a..b` overlaps one of `spans` (sorted, disjoint).
fn overlaps(spans: &[(usize, usize)], a: usize, b: usize) -> bool {
    // The first span that ends after `a` is the only one that can overlap.
    let i = spans.partition_point(|&(_, end)| end <= a);
    spans.get(i).is_some_and(|&(start, _)| start < b)
}

fn url_pattern() -> &'static Regex {
    static P: OnceLock<Vec<Regex>> = OnceLock::new();
    &P.get_or_init(|| compile(&[r#"[a-z][a-z0-9+.-]*://[^\s<>"'`)\]]+"#]))[0]
}

/// Identifiers other than paths: URLs, UUIDs, hex hashes, ticket-like IDs (`ABC-123`),
/// numbers with units, amounts of money, DOIs, model codes (`R290`, `H100`),
/// account-style IDs (`acct_7Q2ZK9`: a prefix, then letters and digits mixed) and
/// resource names in kebab case of three parts or more (`backup-nightly-eu`).
fn identifier_patterns() -> &'static [Regex] {
    static P: OnceLock<Vec<Regex>> = OnceLock::new();
    P.get_or_init(|| {
        compile(&[
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
            r"\b[0-9a-f]*[0-9][0-9a-f]*[a-f][0-9a-f]*\b|\b[0-9a-f]*[a-f][0-9a-f]*[0-9][0-9a-f]*\b",
            r"\b[A-Z][A-Z0-9]+-[0-9]+\b",
            r"\b[0-9]+(?:\.[0-9]+)?(?:%| ?(?:ms|s|sec|secs|seconds|min|mins|minutes|h|hours|days|B|KB|MB|GB|TB|KiB|MiB|GiB|k|K|M|px|tokens|dB|Hz|kHz|MHz|GHz|W|kW|MW|kWh|V|mA|°C|°F)\b)",
            r"[$€£] ?[0-9][0-9,]*(?:\.[0-9]+)?\b|\b[0-9][0-9,]*(?:\.[0-9]+)? ?(?:EUR|USD|GBP|CHF|JPY)\b",
            r"\bdoi:10\.[0-9]{4,9}/[A-Za-z0-9._;()/:-]*[A-Za-z0-9]",
            r"\b[A-Z]{1,4}[0-9]{2,6}\b",
            r"\b[a-z]{2,}_[A-Za-z0-9]*(?:[0-9][A-Za-z0-9]*[A-Z]|[A-Z][A-Za-z0-9]*[0-9])[A-Za-z0-9]*\b",
            r"\b[a-z][a-z0-9]*(?:-[a-z0-9]+){2,}\b",
            // Dotted configuration keys and feature flags (`payments.release_lock_early`).
            r"\b[a-z][a-z0-9_]*\.[a-z][a-z0-9]*_[a-z0-9_]*[a-z0-9]\b",
            // Chat channels (`#payments-oncall`), not `#include` or a heading.
            r"\B#[a-z][a-z0-9]*(?:[-_][a-z0-9]+)+",
            // Ports (`port 8443`).
            r"\b[Pp]ort [0-9]{2,5}\b",
        ])
    })
}

/// Names of people, places and products: two or three capitalised words after another
/// word (`ask Amara Okafor`, `Ask Amara Okafor`, `at Northwind Cloud`), the word before
/// in group 1, the name in group 2. A name after an article or a determiner (`The
/// Indexer Node`) is a capitalised phrase, not taken.
fn name_pattern() -> &'static Regex {
    static P: OnceLock<Vec<Regex>> = OnceLock::new();
    &P.get_or_init(|| compile(&[r"\b([A-Za-z]+)[,;:]? ((?:[A-Z][a-z]+ ){1,2}[A-Z][a-z]+)\b"]))[0]
}

/// Words before a capitalised phrase that make it not a name.
const DETERMINERS: &[&str] = &[
    "the", "a", "an", "this", "that", "these", "those", "our", "my", "your", "their", "its", "his",
    "her", "each", "every", "some", "any", "no",
];

/// Every identifier in `s`, in order of appearance, repeats included.
pub fn identifiers(s: &str) -> Vec<String> {
    let mut found: Vec<(usize, String)> = Vec::new();
    for m in url_pattern().find_iter(s) {
        let url = m.as_str().trim_end_matches(['.', ',', ';', ':']);
        found.push((m.start(), url.to_owned()));
    }
    for p in paths(s) {
        // Positions of repeated paths do not matter for counting.
        let at = p.as_ptr() as usize - s.as_ptr() as usize;
        found.push((at, p.to_owned()));
    }
    for (i, re) in identifier_patterns().iter().enumerate() {
        for m in re.find_iter(s) {
            let t = m.as_str();
            // Hex hashes: at least 7 characters (a short git hash).
            if i == 1 && t.len() < 7 {
                continue;
            }
            found.push((m.start(), t.to_owned()));
        }
    }
    for c in name_pattern().captures_iter(s) {
        let (Some(before), Some(name)) = (c.get(1), c.get(2)) else {
            continue;
        };
        if !DETERMINERS
            .iter()
            .any(|d| before.as_str().eq_ignore_ascii_case(d))
        {
            found.push((name.start(), name.as_str().to_owned()));
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    found.into_iter().map(|(_, t)| t).collect()
}

/// Whether `summary` contains `identifier` (spaces ignored, so `200 ms` matches `200ms`).
pub fn mentions(summary_compact: &str, identifier: &str) -> bool {
    let compact: String = identifier.chars().filter(|c| !c.is_whitespace()).collect();
    summary_compact.contains(&compact)
}

/// `s` without whitespace, for [`mentions`].
pub fn without_spaces(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

/// Words of a request that carry its meaning: ASCII words of four letters or more that
/// are not common function words, lower-cased, distinct, in order; at most `max`.
pub fn keywords(s: &str, max: usize) -> Vec<String> {
    const STOP: &[&str] = &[
        "about", "after", "again", "also", "been", "before", "being", "could", "does", "done",
        "each", "from", "have", "here", "into", "just", "like", "make", "more", "much", "need",
        "only", "other", "please", "should", "some", "such", "than", "that", "them", "then",
        "there", "these", "they", "this", "those", "very", "want", "what", "when", "where",
        "which", "will", "with", "would", "your", "thanks", "thank", "okay", "sure", "know",
        "think", "well", "into", "onto", "because",
    ];
    let mut out: Vec<String> = Vec::new();
    for word in s.split(|c: char| !c.is_ascii_alphanumeric()) {
        if out.len() == max {
            break;
        }
        if word.len() < 4 || word.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let w = word.to_ascii_lowercase();
        // `out` holds at most `max` words: a scan of it is constant work.
        if !STOP.contains(&w.as_str()) && !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(s: &str) -> Cow<'_, str> {
        Cow::Borrowed(s)
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncate_chars("héllo", 2), "hé…");
        assert_eq!(truncate_chars("héllo", 5), "héllo");
        assert_eq!(first_line("\n\n  first \nsecond", 10), "first");
        let s = "ab🦀cd".repeat(100);
        let t = head_tail(&s, 10, 5, same);
        assert!(t.starts_with("ab🦀cdab🦀cd"), "{t}");
        assert!(t.ends_with("🦀cdab🦀cd") || t.ends_with("b🦀cd"), "{t}");
        assert!(t.contains("[… 485 characters omitted …]"), "{t}");
        assert_eq!(head_tail("short", 10, 5, same), "short");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(thousands(12), "12");
    }

    #[test]
    fn finds_paths_and_identifiers() {
        let text = "Edit src/compact/mod.rs and Cargo.toml, see https://example.com/a/b.html. \
                    Build 3f2a9c1 took 250 ms and 1.5 GB; ticket ABC-123, id \
                    123e4567-e89b-12d3-a456-426614174000.";
        let p = paths(text);
        assert_eq!(p, vec!["src/compact/mod.rs", "Cargo.toml"]);
        let ids = identifiers(text);
        for want in [
            "src/compact/mod.rs",
            "Cargo.toml",
            "https://example.com/a/b.html",
            "3f2a9c1",
            "250 ms",
            "1.5 GB",
            "ABC-123",
            "123e4567-e89b-12d3-a456-426614174000",
        ] {
            assert!(ids.iter().any(|i| i == want), "{want} in {ids:?}");
        }
        let ids = identifiers(
            "It cost 11,400 EUR ($12,300.50), see doi:10.5555/hp.2023.118; uses R290; 4.2% \
             fail; 48 dB at 1.8 kW for acct_7Q2ZK9 (not call_1_a) in backup-nightly-eu.",
        );
        assert!(!ids.iter().any(|i| i.contains("call_1_a")), "{ids:?}");
        for want in [
            "48 dB",
            "1.8 kW",
            "acct_7Q2ZK9",
            "backup-nightly-eu",
            "11,400 EUR",
            "$12,300.50",
            "doi:10.5555/hp.2023.118",
            "R290",
            "4.2%",
        ] {
            assert!(ids.iter().any(|i| i == want), "{want} in {ids:?}");
        }
        // Feature flags and config keys, chat channels; not headings or directives.
        let ids = identifiers(
            "Use the flag payments.release_lock_early; alert #payments-oncall, not ## Goal, \
             #include or main.rs.",
        );
        for want in ["payments.release_lock_early", "#payments-oncall"] {
            assert!(ids.iter().any(|i| i == want), "{want} in {ids:?}");
        }
        assert!(
            !ids.iter()
                .any(|i| i.contains("include") || i.contains("Goal")),
            "{ids:?}"
        );
        // Ports, and names in the middle of a sentence; not a sentence's first words.
        let ids = identifiers(
            "Ask Amara Okafor before the move, then Tomasz Wrona. The Indexer Node listens \
             on port 4100.\n## Key Decisions",
        );
        for want in ["Amara Okafor", "Tomasz Wrona", "port 4100"] {
            assert!(ids.iter().any(|i| i == want), "{want} in {ids:?}");
        }
        assert!(
            !ids.iter()
                .any(|i| i.contains("Ask") || i.contains("Indexer") || i.contains("Key")),
            "{ids:?}"
        );
        assert!(mentions(&without_spaces("took 250ms"), "250 ms"));
        // A path inside a URL is not a path; one after it is, once.
        assert_eq!(
            paths("see https://x.io/a/b.rs then a/b.rs and a/b.rs"),
            vec!["a/b.rs"]
        );
        // Base64 has slashes; a name longer than a file system allows is not a path, and
        // nothing inside it is one either.
        let image = format!("data /9j/4AAQSkZJRg/{}/2wBD and src/x.rs", "A".repeat(300));
        assert_eq!(paths(&image), vec!["src/x.rs"]);
        let image = format!("data /9j/{} and src/x.rs", "4AAQSkZJRg/".repeat(400));
        assert_eq!(paths(&image), vec!["src/x.rs"]);
    }

    #[test]
    fn keywords_skip_function_words() {
        assert_eq!(
            keywords(
                "Please refactor the parser so that it uses nom, and add tests!",
                12
            ),
            vec!["refactor", "parser", "uses", "tests"]
        );
        assert_eq!(keywords("alpha beta gamma delta", 2), vec!["alpha", "beta"]);
        assert!(keywords("日本語のテキスト", 12).is_empty());
    }
}
