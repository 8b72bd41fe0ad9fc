//! Fitting a summary to the room it has. A summary is never thrown away for its size:
//! one that would not fit is trimmed by section, the least needed detail first —
//! a line said twice (the copy in the section that goes sooner), then Progress,
//! Relevant Files, Critical Context and Next Steps, then Key Decisions and the user's
//! Constraints & Preferences, the Goal last; each section's latest lines before its
//! first. What the gate appends (the identifiers the summary does not name, the latest
//! ask) is worked out again for the trimmed summary, so an identifier a trimmed line
//! held comes back in one line of its own; that list goes last, its least frequent
//! items first. An answer the summariser cut at its token cap keeps its complete lines
//! (the gate then repairs the sections it never reached).
//!
//! (Critical Context goes before Key Decisions and Constraints: the gate re-appends
//! every identifier it must keep, while what the user stated and decided has no other
//! way back.)

use std::collections::HashSet;

/// The body's sections in the order they give up lines (the first first).
const TRIM_ORDER: [&str; 8] = [
    PREAMBLE,
    "Progress",
    "Relevant Files",
    "Critical Context",
    "Next Steps",
    "Key Decisions",
    "Constraints & Preferences",
    "Goal",
];
/// Text before the first heading.
const PREAMBLE: &str = "";

/// What an emptied section says.
const TRIMMED: &str = "(trimmed to fit)";

/// The complete lines of an answer cut at the token cap: everything before its last
/// line break (the unfinished line is dropped), or the answer itself when it is one
/// unfinished line.
pub(super) fn complete_lines(answer: &str) -> &str {
    let text = answer.trim_end_matches([' ', '\t']);
    if text.ends_with('\n') {
        return text.trim_end();
    }
    match text.rfind('\n') {
        Some(end) if !text[..end].trim().is_empty() => text[..end].trim_end(),
        _ => text.trim_end(),
    }
}

/// One section of a summary: its heading line and the lines under it.
struct Section {
    name: String,
    heading: String,
    lines: Vec<String>,
    trimmed: usize,
}

/// A body after [`trim_body`]: what is left, and the lines taken, by section.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Trimmed {
    pub body: String,
    pub taken: Vec<(String, usize)>,
}

/// `body` (its `## ` sections, see `gate::sections`) with about `over` tokens (as
/// `tokens` counts them) trimmed; `None` when nothing is left to trim.
pub(super) fn trim_body(body: &str, over: u64, tokens: &dyn Fn(&str) -> u64) -> Option<Trimmed> {
    let mut sections = split(body);
    let mut left = over;
    let before = left;
    // A line said twice goes first: the copy in the section that would give it up
    // sooner (a path under Relevant Files and again under Critical Context).
    let keep_rank = |name: &str| TRIM_ORDER.iter().position(|n| *n == name);
    let mut order: Vec<usize> = (0..sections.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(keep_rank(&sections[i].name)));
    let mut seen = HashSet::new();
    for i in order {
        let section = &mut sections[i];
        let mut taken = 0;
        section.lines.retain(|line| {
            let key = line.trim().trim_start_matches("- ").to_owned();
            if key.is_empty() || seen.insert(key) {
                return true;
            }
            left = left.saturating_sub(tokens(line) + 1);
            taken += 1;
            false
        });
        section.trimmed += taken;
    }
    for name in TRIM_ORDER {
        if left == 0 {
            break;
        }
        let Some(section) = sections.iter_mut().find(|s| s.name == name) else {
            continue;
        };
        while left > 0 {
            let Some(line) = section.lines.pop() else {
                break;
            };
            // Blank lines are dropped when the summary is put together anyway.
            if line.trim().is_empty() {
                continue;
            }
            // A line break's worth besides the line itself.
            left = left.saturating_sub(tokens(&line) + 1);
            section.trimmed += 1;
        }
    }
    if left == before {
        return None;
    }
    let taken = sections
        .iter()
        .filter(|s| s.trimmed > 0)
        .map(|s| {
            let name = if s.name.is_empty() {
                "the preamble"
            } else {
                &s.name
            };
            (name.to_owned(), s.trimmed)
        })
        .collect();
    Some(Trimmed {
        body: join(&sections),
        taken,
    })
}

/// The gate's appendix with about `over` tokens trimmed: the identifiers it lists from
/// the end (the least frequent go first), then the latest ask; `None` when nothing is
/// left to trim.
pub(super) fn trim_appendix(
    appendix: &str,
    over: u64,
    tokens: &dyn Fn(&str) -> u64,
) -> Option<String> {
    const LISTED: &str = "Also mentioned: ";
    let mut parts: Vec<String> = appendix
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .map(str::to_owned)
        .collect();
    let mut left = over;
    if let Some(list) = parts.iter_mut().find(|p| p.starts_with(LISTED)) {
        let mut items: Vec<&str> = list[LISTED.len()..].split(", ").collect();
        while left > 0 {
            let Some(item) = items.pop() else {
                break;
            };
            left = left.saturating_sub(tokens(item) + 1);
        }
        *list = if items.is_empty() {
            String::new()
        } else {
            format!("{LISTED}{}", items.join(", "))
        };
    }
    while left > 0 {
        let Some(last) = parts.iter().rposition(|p| !p.is_empty()) else {
            break;
        };
        let part = std::mem::take(&mut parts[last]);
        left = left.saturating_sub(tokens(&part));
    }
    if left == over {
        return None;
    }
    Some(
        parts
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| format!("\n\n{p}"))
            .collect(),
    )
}

/// The sections of a body: text before the first heading ([`PREAMBLE`]), then one per
/// `## ` heading, named by the heading's text.
fn split(body: &str) -> Vec<Section> {
    let mut sections = vec![Section {
        name: PREAMBLE.to_owned(),
        heading: String::new(),
        lines: Vec::new(),
        trimmed: 0,
    }];
    for line in body.lines() {
        if let Some(name) = line.strip_prefix("## ") {
            sections.push(Section {
                name: name.trim().to_owned(),
                heading: line.to_owned(),
                lines: Vec::new(),
                trimmed: 0,
            });
        } else if line.trim() == TRIMMED {
            // An earlier round's mark: put back by `join` while the section is empty.
        } else if let Some(last) = sections.last_mut() {
            last.lines.push(line.to_owned());
        }
    }
    sections
}

/// The sections put together again: blank lines between them, none inside, an emptied
/// one saying so.
fn join(sections: &[Section]) -> String {
    let mut out = String::new();
    for section in sections {
        let lines: Vec<&str> = section
            .lines
            .iter()
            .map(String::as_str)
            .filter(|l| !l.trim().is_empty())
            .collect();
        if section.heading.is_empty() && lines.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(&section.heading);
        if lines.is_empty() {
            out.push('\n');
            out.push_str(TRIMMED);
        } else {
            if !section.heading.is_empty() {
                out.push('\n');
            }
            out.push_str(&lines.join("\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> u64 {
        text.split_whitespace().count() as u64
    }

    const BODY: &str = "## Goal\nship the parser fix for WEB-12\n\n## Constraints & Preferences\n\
        - no new dependencies\n\n## Progress\n### Done\n- read src/parse.rs\n- ran cargo test: 3 failures\n\
        - fixed the lexer\n### In Progress\n- the error path\n\n## Key Decisions\n- keep the old API\n\n\
        ## Relevant Files\n- src/parse.rs: the parser\n- src/lex.rs: the lexer\n\n## Next Steps\n\
        - fix the error path\n\n## Critical Context\n- port 8443, ticket WEB-12\n- src/lex.rs: the lexer";

    #[test]
    fn trimming_takes_the_least_needed_lines_first() {
        let t = trim_body(BODY, 8, &words).unwrap();
        // The line said twice went first, from Relevant Files; then Progress, from
        // its latest lines. Goal, Constraints and Decisions stay.
        assert_eq!(
            t.taken,
            [("Progress".to_owned(), 1), ("Relevant Files".to_owned(), 1)]
        );
        assert!(
            t.body
                .contains("## Relevant Files\n- src/parse.rs: the parser\n\n"),
            "{}",
            t.body
        );
        assert!(
            t.body.contains("- src/lex.rs: the lexer"),
            "the copy that stays"
        );
        assert!(!t.body.contains("the error path\n\n## Key"), "{}", t.body);
        assert!(t.body.contains("ship the parser fix for WEB-12"));
        assert!(t.body.contains("- no new dependencies"));
        // Much more: everything but the last sections goes, each heading stays.
        let t = trim_body(BODY, 40, &words).unwrap();
        assert!(
            t.body.contains("## Progress\n(trimmed to fit)"),
            "{}",
            t.body
        );
        assert!(
            t.body.contains("## Relevant Files\n(trimmed to fit)"),
            "{}",
            t.body
        );
        assert!(
            t.body.contains("## Goal\nship the parser fix"),
            "{}",
            t.body
        );
        // Nothing left to take: the headings alone.
        let bare = trim_body(BODY, 10_000, &words).unwrap();
        assert_eq!(trim_body(&bare.body, 10, &words), None);
    }

    #[test]
    fn the_appendix_loses_its_last_items_first() {
        let appendix = "\n\nAlso mentioned: WEB-12, src/a.rs, 42 ms\n\nThe latest request in these messages: fix it";
        let out = trim_appendix(appendix, 3, &words).unwrap();
        assert_eq!(
            out,
            "\n\nAlso mentioned: WEB-12, src/a.rs\n\nThe latest request in these messages: fix it"
        );
        let out = trim_appendix(appendix, 5, &words).unwrap();
        assert!(out.starts_with("\n\nAlso mentioned: WEB-12\n\n"), "{out}");
        let out = trim_appendix(appendix, 100, &words).unwrap();
        assert_eq!(out, "");
        assert_eq!(trim_appendix("", 5, &words), None);
    }

    #[test]
    fn a_cut_answer_keeps_its_complete_lines() {
        assert_eq!(
            complete_lines("## Goal\nfix it\n## Progress\n- ran the te"),
            "## Goal\nfix it\n## Progress"
        );
        assert_eq!(complete_lines("## Goal\nfix it\n"), "## Goal\nfix it");
        assert_eq!(complete_lines("one unfinished li"), "one unfinished li");
    }
}
