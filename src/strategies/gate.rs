//! The summary gate: a summary is judged by what it loses or invents, and its form is
//! repaired, never a reason to throw it away. Missing or renamed sections of the
//! template are put in place (a missing one as "(none recorded)"); identifiers of the
//! covered messages the summary dropped, and the latest ask when it is not reflected,
//! are appended verbatim; a summary is rejected only when it invents — most of the paths
//! and URLs it names appear nowhere in what it summarises. The score (the share of the
//! covered messages' most frequent identifiers the summarizer kept itself) and the
//! repairs travel with the plan into the checkpoint.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::Fidelity;
use super::text::{identifiers, keywords, mentions, paths, truncate_chars, without_spaces};

/// The sections every summary has, as (heading, what a heading line starts with once
/// Markdown markers are stripped, lower-cased).
pub(super) const SECTIONS: [(&str, &str); 7] = [
    ("Goal", "goal"),
    ("Constraints & Preferences", "constraints"),
    ("Progress", "progress"),
    ("Key Decisions", "key decisions"),
    ("Relevant Files", "relevant files"),
    ("Next Steps", "next steps"),
    ("Critical Context", "critical context"),
];

/// Identifiers of what the user and the assistant wrote the gate looks for at most (the
/// most frequent), and of tool outputs.
pub(super) const MAX_SAID: usize = 60;
pub(super) const MAX_OBSERVED: usize = 20;
/// Keywords of the latest request considered at most.
const MAX_KEYWORDS: usize = 12;
/// Fewest invented paths and URLs that can reject a summary.
const MIN_INVENTED: usize = 4;

/// What the gate found and did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Share of the covered messages' identifiers the summariser kept itself (1 when
    /// there were none).
    pub score: f32,
    /// What was repaired: `sections: …`, `identifiers: N appended`, `latest ask`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repaired: Vec<String>,
}

/// What the summary is judged against: the covered messages as the summariser saw them.
pub(super) struct Covered<'t> {
    /// Their text, for telling kept identifiers from invented ones.
    pub text: &'t str,
    /// Identifiers of what the user and the assistant wrote there, repeats included, in
    /// order (the most frequent are looked for).
    pub said: &'t [String],
    /// Identifiers of the tool outputs there, the same way (fewer are looked for: a
    /// search's hundred paths are not a hundred facts).
    pub observed: &'t [String],
    /// Identifiers the previous summary carried: an update keeps every one.
    pub carried: &'t [String],
    /// The last user message among them.
    pub latest_ask: Option<&'t str>,
}

/// What the summary should name and does not — every identifier the previous summary
/// carried, then the covered messages' most frequent ones in order of appearance — and
/// how many it should name.
pub(super) fn dropped(body: &str, covered: &Covered<'_>) -> (Vec<String>, usize) {
    let compact = without_spaces(body);
    let mut wanted: Vec<&str> = covered.carried.iter().map(String::as_str).collect();
    wanted.extend(most_frequent(covered.said, MAX_SAID));
    wanted.extend(most_frequent(covered.observed, MAX_OBSERVED));
    let mut unique = std::collections::HashSet::new();
    wanted.retain(|id| unique.insert(*id));
    let of = wanted.len();
    let missing = wanted
        .into_iter()
        .filter(|id| !mentions(&compact, id))
        .map(str::to_owned)
        .collect();
    (missing, of)
}

/// The `max` most frequent of `ids` (ties by first appearance), in order of appearance.
fn most_frequent(ids: &[String], max: usize) -> Vec<&str> {
    let mut seen: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (at, id) in ids.iter().enumerate() {
        seen.entry(id).or_insert((0, at)).0 += 1;
    }
    let mut counted: Vec<(&str, usize, usize)> =
        seen.into_iter().map(|(id, (n, at))| (id, n, at)).collect();
    counted.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
    counted.truncate(max);
    counted.sort_by_key(|&(_, _, at)| at);
    counted.into_iter().map(|(id, _, _)| id).collect()
}

/// A summary through the gate.
#[derive(Debug, PartialEq)]
pub(super) struct Judged {
    /// The summary with its sections repaired.
    pub body: String,
    /// What the gate appends to it (dropped identifiers, the latest ask); empty when
    /// nothing was missing. The caller drops it if the summary would not fit with it.
    pub appendix: String,
    pub verdict: Verdict,
}

/// Judges and repairs `body`: the summary to use, and what was found and done.
pub(super) fn judge(body: &str, covered: &Covered<'_>) -> Result<Judged, Fidelity> {
    if let Some((invented, of)) = invented(body, covered.text) {
        return Err(Fidelity::Invented { invented, of });
    }
    let mut repaired = Vec::new();
    let (repaired_body, filled) = sections(body);
    if !filled.is_empty() {
        repaired.push(format!("sections: {}", filled.join(", ")));
    }
    let (out, missing, of, ask) = appendix(body, covered);
    let score = if of == 0 {
        1.0
    } else {
        (of - missing) as f32 / of as f32
    };
    if missing > 0 {
        repaired.push(format!("identifiers: {missing} appended"));
    }
    if ask {
        repaired.push("latest ask".to_owned());
    }
    Ok(Judged {
        body: repaired_body,
        appendix: out,
        verdict: Verdict { score, repaired },
    })
}

/// What the gate appends to `body`: the identifiers it should name and does not (see
/// [`dropped`]), and the latest ask when it does not reflect it. Also how many were
/// missing of how many, and whether the ask was appended. (Worked out again for a
/// summary trimmed to fit, so what trimming took of them comes back here.)
pub(super) fn appendix(body: &str, covered: &Covered<'_>) -> (String, usize, usize, bool) {
    let mut out = String::new();
    let (missing, of) = dropped(body, covered);
    if !missing.is_empty() {
        let _ = write!(out, "\n\nAlso mentioned: {}", missing.join(", "));
    }
    let ask = covered.latest_ask.filter(|ask| !reflects(body, ask));
    if let Some(ask) = ask {
        let _ = write!(
            out,
            "\n\nThe latest request in these messages: {}",
            truncate_chars(ask.trim(), 300)
        );
    }
    (out, missing.len(), of, ask.is_some())
}

/// Whether the summary reflects the request: a quarter of its keywords (their first five
/// letters, so inflections match) appear in it.
fn reflects(body: &str, ask: &str) -> bool {
    let words = keywords(ask, MAX_KEYWORDS);
    if words.is_empty() {
        return true;
    }
    let lower = body.to_lowercase();
    let found = words
        .iter()
        .filter(|w| lower.contains(&w[..w.len().min(5)]))
        .count();
    found > 0 && found * 4 >= words.len()
}

/// Paths and URLs of the summary that the covered text never mentions, when they are
/// most of them: `(invented, of)`.
fn invented(body: &str, covered: &str) -> Option<(usize, usize)> {
    let compact = without_spaces(covered);
    let named: Vec<String> = identifiers(body)
        .into_iter()
        .filter(|id| id.contains('/'))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let invented = named.iter().filter(|id| !mentions(&compact, id)).count();
    (invented >= MIN_INVENTED && invented * 2 > named.len()).then_some((invented, named.len()))
}

/// The body with every section of the template under its own heading, in template order:
/// headings written another way (`**Goal:**`, `1. Next steps`) normalised, missing ones
/// added as "(none recorded)"; text before the first heading kept first. Also the names
/// of the sections that were added.
pub(super) fn sections(body: &str) -> (String, Vec<&'static str>) {
    let mut preamble = String::new();
    let mut found: [Option<String>; 7] = Default::default();
    let mut current: Option<usize> = None;
    // A summariser that repeats itself (the previous summary written out again) adds
    // nothing the first copy did not say: a line said before, a heading met again.
    let mut seen = std::collections::HashSet::new();
    for line in body.lines() {
        let key = line.trim();
        if !key.is_empty() && !key.starts_with('#') && !seen.insert(key.to_owned()) {
            continue;
        }
        match heading(line) {
            Some((i, rest)) if found[i].is_none() => {
                found[i] = Some(rest.to_owned());
                current = Some(i);
            }
            Some((i, rest)) => {
                current = Some(i);
                let text = found[i].get_or_insert_with(String::new);
                if !rest.is_empty() && !text.contains(rest) {
                    text.push('\n');
                    text.push_str(rest);
                }
            }
            _ => {
                let target = match current {
                    Some(i) => found[i].get_or_insert_with(String::new),
                    None => &mut preamble,
                };
                if !target.is_empty() {
                    target.push('\n');
                }
                target.push_str(line);
            }
        }
    }
    let mut out = preamble.trim().to_owned();
    let mut filled = Vec::new();
    for ((name, _), text) in SECTIONS.iter().zip(found) {
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        let text = text.map(|t| t.trim().to_owned()).unwrap_or_else(|| {
            filled.push(*name);
            "(none recorded)".to_owned()
        });
        let _ = write!(out, "## {name}\n{text}");
    }
    (out, filled)
}

/// The section a line heads, and what follows the heading on it (`Goal: fix x` → `fix
/// x`): a line that starts with the section's name once Markdown markers (`#`, `*`,
/// numbering) are stripped, and is short (a heading, not prose that happens to start so).
fn heading(line: &str) -> Option<(usize, &str)> {
    let stripped = line.trim_start_matches(|c: char| {
        c.is_whitespace() || matches!(c, '#' | '*' | '_' | '-' | '.' | ')') || c.is_ascii_digit()
    });
    let lower = stripped.to_lowercase();
    let i = SECTIONS
        .iter()
        .position(|(_, key)| lower.starts_with(key))?;
    let name_end = stripped
        .char_indices()
        .find(|&(_, c)| c == ':' || c == '\n')
        .map_or(stripped.len(), |(at, _)| at);
    let rest = stripped[name_end..]
        .trim_start_matches(':')
        .trim_matches(|c: char| c.is_whitespace() || c == '*' || c == '_');
    // A heading names its section in a few words; "Progress is slow because …" is prose.
    let name_words = stripped[..name_end].split_whitespace().count();
    (name_words <= 5 && paths(&stripped[..name_end]).is_empty()).then_some((i, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered<'t>(text: &'t str, ids: &'t [String], ask: Option<&'t str>) -> Covered<'t> {
        Covered {
            text,
            said: ids,
            observed: &[],
            carried: &[],
            latest_ask: ask,
        }
    }

    #[test]
    fn a_summary_missing_a_heading_is_repaired_and_used() {
        let text = "[USER] fix src/app.rs (ticket WEB-12), it takes 300 ms";
        let ids = identifiers(text);
        let body = "**Goal:** fix src/app.rs for WEB-12\n\nProgress\n- measured 300 ms\n\
                    ## Key Decisions\nnone\n## Relevant Files\n- src/app.rs\n## Next Steps\n- patch\n\
                    ## Critical Context\nWEB-12";
        let judged = judge(body, &covered(text, &ids, Some("fix src/app.rs"))).unwrap();
        let (out, verdict) = (judged.body + &judged.appendix, judged.verdict);
        assert_eq!(
            sections(&out).1,
            Vec::<&str>::new(),
            "every section now: {out}"
        );
        assert!(out.contains("## Goal\nfix src/app.rs for WEB-12"), "{out}");
        assert!(
            out.contains("## Constraints & Preferences\n(none recorded)"),
            "{out}"
        );
        assert!(out.find("## Goal").unwrap() < out.find("## Constraints").unwrap());
        assert_eq!(verdict.repaired, ["sections: Constraints & Preferences"]);
        assert_eq!(verdict.score, 1.0);
    }

    #[test]
    fn what_a_summary_dropped_is_appended_and_scored() {
        let text = "[USER] deploy to https://ops.example.com/run/7 with OPS-77 in 5 min\n\
                    [USER] Please migrate the schema to PostgreSQL";
        let ids = identifiers(text);
        let body = "## Goal\nDeploy.\n## Next Steps\nmore";
        let ask = "Please migrate the schema to PostgreSQL";
        let judged = judge(body, &covered(text, &ids, Some(ask))).unwrap();
        let (out, verdict) = (judged.body + &judged.appendix, judged.verdict);
        for id in ["https://ops.example.com/run/7", "OPS-77", "5 min"] {
            assert!(out.contains(id), "{id}: {out}");
        }
        assert!(out.contains("The latest request in these messages: Please migrate"));
        assert_eq!(verdict.score, 0.0);
        assert_eq!(verdict.repaired.len(), 3, "{:?}", verdict.repaired);
    }

    #[test]
    fn a_summary_that_invents_paths_is_rejected() {
        let text = "[USER] fix src/app.rs";
        let ids = identifiers(text);
        let body = "## Goal\nfix src/app.rs, lib/a.rs, lib/b.rs, lib/c.rs and lib/d.rs";
        assert_eq!(
            judge(body, &covered(text, &ids, None)),
            Err(Fidelity::Invented { invented: 4, of: 5 })
        );
        // Naming what was there is not inventing.
        let body = "## Goal\nfix src/app.rs";
        assert!(judge(body, &covered(text, &ids, None)).is_ok());
    }

    #[test]
    fn prose_that_starts_like_a_section_is_not_a_heading() {
        assert_eq!(heading("## Next steps"), Some((5, "")));
        assert_eq!(heading("Goal: ship it"), Some((0, "ship it")));
        assert_eq!(
            heading("Progress is slow because the tests in src/a.rs fail"),
            None
        );
    }
}
