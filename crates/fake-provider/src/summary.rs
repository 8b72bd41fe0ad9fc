//! The fake provider's summaries: what a model asked for abridge's structured template
//! writes — every section, the transcript's identifiers, its stated decisions and
//! constraints, its first and latest asks — or, as told, a summary missing sections or
//! an empty one.

use serde_json::Value;

use crate::SummaryMode;
use crate::chat::text_of;

/// The blocks of a transcript, each with its label (`[USER]`, `[ASSISTANT]`,
/// `[TOOL CALL …]`, `[TOOL RESULT …]`) and body: a label line starts a block, the lines
/// up to the next label are its body (text on the label line itself counts too).
fn blocks(transcript: &str) -> Vec<(&str, String)> {
    let mut out: Vec<(&str, String)> = Vec::new();
    for line in transcript.lines() {
        let t = line.trim();
        let label = ["[USER", "[ASSISTANT", "[TOOL RESULT", "[TOOL"]
            .into_iter()
            .find(|l| t.starts_with(l));
        match (label, t.find(']')) {
            (Some(label), Some(close)) => out.push((label, t[close + 1..].trim().to_owned())),
            _ => {
                if let Some((_, body)) = out.last_mut() {
                    body.push(' ');
                    body.push_str(t);
                }
            }
        }
    }
    out
}

/// The bodies of the `[USER]` blocks of a transcript.
fn user_blocks(transcript: &str) -> Vec<String> {
    blocks(transcript)
        .into_iter()
        .filter(|(label, body)| *label == "[USER" && !body.trim().is_empty())
        .map(|(_, body)| body.trim().to_owned())
        .collect()
}

/// The text a model reads identifiers from, in the order it weighs them: what the
/// previous summary carried, what the user and the assistant said (and the calls they
/// made), then what the tools returned.
fn by_weight(previous: &str, quoted: &str) -> String {
    let blocks = blocks(quoted);
    let (results, said): (Vec<_>, Vec<_>) = blocks
        .iter()
        .partition(|(label, _)| *label == "[TOOL RESULT");
    let mut out = previous.to_owned();
    for (_, body) in said.iter().chain(&results) {
        out.push('\n');
        out.push_str(body);
    }
    if blocks.is_empty() {
        out.push('\n');
        out.push_str(quoted);
    }
    out
}

/// The text between `<name-…>` and its closing `</name-…>` in a prompt (abridge fences
/// what it quotes so the transcript cannot close it), or `None`.
fn fenced<'p>(prompt: &'p str, name: &str) -> Option<&'p str> {
    let open = format!("<{name}-");
    let start = prompt.find(&open)?;
    let tag_end = start + prompt[start..].find('>')? + 1;
    let tag = &prompt[start + 1..tag_end - 1];
    let close = format!("</{tag}>");
    let end = prompt[tag_end..].find(&close)? + tag_end;
    Some(&prompt[tag_end..end])
}

/// The messages before a summary's ask as a transcript (`[USER]`, `[ASSISTANT]`,
/// `[TOOL CALL]`, `[TOOL RESULT]` blocks), and the latest summary among them (a message
/// that starts a summary in the template), which is not part of the transcript.
fn conversation_above(messages: &[Value]) -> (String, String) {
    let mut previous = String::new();
    let mut out = String::new();
    for m in messages {
        let role = m["role"].as_str().unwrap_or("");
        let kind = m["type"].as_str().unwrap_or("message");
        let text = text_of(m);
        if text.contains("## Goal") {
            previous = text;
            continue;
        }
        let results = m["content"]
            .as_array()
            .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result"));
        let label = match (kind, role) {
            ("function_call" | "custom_tool_call", _) => "[TOOL CALL]",
            ("function_call_output" | "custom_tool_call_output", _) | (_, "tool") => {
                "[TOOL RESULT]"
            }
            (_, "user") if results => "[TOOL RESULT]",
            (_, "user") => "[USER]",
            (_, "assistant") => "[ASSISTANT]",
            _ => continue,
        };
        let mut body = text;
        for part in [&m["arguments"], &m["output"]] {
            if let Some(s) = part.as_str() {
                body.push_str(s);
            }
        }
        for block in m["content"].as_array().into_iter().flatten() {
            match block["type"].as_str() {
                Some("tool_use") => body.push_str(&block["input"].to_string()),
                Some("tool_result") => {
                    body.push_str(&crate::chat::text_of_content(&block["content"]))
                }
                _ => {}
            }
        }
        for call in m["tool_calls"].as_array().into_iter().flatten() {
            body.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
        }
        out.push_str(&format!("{label}\n{body}\n"));
    }
    (previous, out)
}

/// The section `name` of a summary in the template (its lines after `## name`).
fn section<'s>(summary: &'s str, name: &str) -> Option<&'s str> {
    let heading = format!("## {name}");
    let start = summary.find(&heading)? + heading.len();
    let rest = &summary[start..];
    Some(rest[..rest.find("\n## ").unwrap_or(rest.len())].trim())
}

/// A summary in the structured template, built from what the prompt in the last message
/// quotes — the transcript, or for an update the previous summary and the new messages
/// — as a model following the template does: the previous summary's goal and what it
/// carried stay, the new messages add to them. A prompt without fences that asks for a
/// summary of "the conversation above" is answered from the messages before it (chat
/// messages, Messages blocks or Responses items; an earlier summary among them is the
/// previous one); any other prompt without fences is read whole.
pub(crate) fn summarise(messages: &[Value], mode: SummaryMode) -> String {
    let prompt = messages.last().map(text_of).unwrap_or_default();
    let fences = fenced(&prompt, "transcript").or_else(|| fenced(&prompt, "new-messages"));
    let (above_previous, above) = match fences {
        None if prompt.contains("conversation above") => {
            conversation_above(&messages[..messages.len().saturating_sub(1)])
        }
        _ => (String::new(), String::new()),
    };
    let previous = fenced(&prompt, "previous-summary").unwrap_or(&above_previous);
    let quoted = fences.unwrap_or(if above.is_empty() { &prompt } else { &above });
    let transcript = format!("{previous}\n{quoted}");
    let asks = user_blocks(quoted);
    let short = |s: &str| s.chars().take(300).collect::<String>();
    let goal = section(previous, "Goal")
        .filter(|g| !g.is_empty() && !g.starts_with('('))
        .map(short)
        .or_else(|| asks.first().map(|a| short(a)))
        .unwrap_or_else(|| "continue the conversation".to_owned());
    let latest = asks.last().map_or_else(|| goal.clone(), |a| short(a));
    let user_lines = &asks;
    let mut identifiers: Vec<String> = Vec::new();
    for token in by_weight(previous, quoted).split_whitespace() {
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
            .map(|l| l.trim().trim_start_matches("- ").trim())
            .filter(|l| !l.starts_with('[') && !l.starts_with('#') && l.len() > 8)
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
