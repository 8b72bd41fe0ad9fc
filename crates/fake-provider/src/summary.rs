//! The fake provider's summaries: what a model asked for abridge's structured template
//! writes — every section, the transcript's identifiers, its stated decisions and
//! constraints, its first and latest asks — or, as told, a summary missing sections or
//! an empty one.

use serde_json::Value;

use crate::SummaryMode;
use crate::chat::text_of;

/// The bodies of the `[USER]` blocks of a transcript: a label line (`[USER]`,
/// `[ASSISTANT]`, `[TOOL ...]`) starts a block, the lines up to the next label are its
/// body (text on the label line itself counts too).
fn user_blocks(transcript: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<(bool, String)> = None;
    for line in transcript.lines() {
        let t = line.trim();
        let label = ["[USER", "[ASSISTANT", "[TOOL"]
            .iter()
            .find(|l| t.starts_with(**l));
        if let (Some(label), Some(close)) = (label, t.find(']')) {
            if let Some((true, body)) = current.take() {
                blocks.push(body.trim().to_owned());
            }
            current = Some((*label == "[USER", t[close + 1..].trim().to_owned()));
        } else if let Some((_, body)) = &mut current {
            body.push(' ');
            body.push_str(t);
        }
    }
    if let Some((true, body)) = current {
        blocks.push(body.trim().to_owned());
    }
    blocks.retain(|b| !b.is_empty());
    blocks
}

/// A summary in the structured template, built from the transcript in the last message.
pub(crate) fn summarise(messages: &[Value], mode: SummaryMode) -> String {
    let transcript = messages.last().map(text_of).unwrap_or_default();
    let asks = user_blocks(&transcript);
    let short = |s: &str| s.chars().take(300).collect::<String>();
    let goal = asks
        .first()
        .map_or_else(|| "continue the conversation".to_owned(), |a| short(a));
    let latest = asks.last().map_or_else(|| goal.clone(), |a| short(a));
    let user_lines = &asks;
    let mut identifiers: Vec<String> = Vec::new();
    for token in transcript.split_whitespace() {
        let t = token.trim_matches(|c: char| ",.;:()[]{}\"'`".contains(c));
        let looks_like_id = t.contains('/')
            || t.contains('_')
            || t.contains("://")
            || t.chars().any(|c| c.is_ascii_digit());
        // The prompt's own fences (`<transcript-…>`) are not the conversation's.
        if looks_like_id
            && !t.starts_with('<')
            && t.len() > 1
            && !identifiers.iter().any(|i| i == t)
            && identifiers.len() < 120
        {
            identifiers.push(t.to_owned());
        }
    }
    let files: Vec<&String> = identifiers
        .iter()
        .filter(|i| i.contains('/') && !i.contains("://"))
        .collect();
    let list = |items: &[&String]| {
        if items.is_empty() {
            "- none".to_owned()
        } else {
            items
                .iter()
                .map(|i| format!("- {i}"))
                .collect::<Vec<_>>()
                .join("\n")
        }
    };
    // As a model following the template does: sentences that state a decision or a
    // constraint go under their sections.
    let stated = |cues: &[&str]| {
        let found: Vec<String> = transcript
            .split(['.', '\n'])
            .map(str::trim)
            .filter(|l| !l.starts_with('[') && l.len() > 8)
            .filter(|l| {
                let lower = l.to_lowercase();
                cues.iter().any(|c| lower.contains(c))
            })
            .take(10)
            .map(|l| format!("- {}", l.chars().take(200).collect::<String>()))
            .collect();
        if found.is_empty() {
            "- none recorded".to_owned()
        } else {
            found.join("\n")
        }
    };
    let constraints = stated(&["must", "never", "do not", "only ", "constraint", "exclude"]);
    let decisions = stated(&["decided", "agreed", "going with", "we will", "we'll"]);
    match mode {
        SummaryMode::Empty => String::new(),
        SummaryMode::MissingSections => format!("## Goal\n{goal}\n"),
        SummaryMode::Good | SummaryMode::Error => format!(
            "## Goal\n{goal}\n\n## Constraints & Preferences\n{constraints}\n\n## Progress\n### Done\n- {} user requests handled\n### In Progress\n- {latest}\n### Blocked\n- none\n\n## Key Decisions\n{decisions}\n\n## Relevant Files\n{}\n\n## Next Steps\n- {latest}\n\n## Critical Context\n{}\n",
            user_lines.len(),
            list(&files),
            list(&identifiers.iter().collect::<Vec<_>>()),
        ),
    }
}
