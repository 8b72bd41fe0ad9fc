//! Agents' own session files as the requests the agent sent, and what the provider
//! billed for each: a Claude Code transcript becomes Messages requests ([`claude`]), a
//! Codex CLI rollout Responses requests ([`codex`]), a request per answer the model
//! gave. What the files do not keep is left out: Claude Code's system prompt and tools,
//! Codex's tools (its `base_instructions` are kept); replay sizes them from the bill of
//! the first request (see `super::calibrate`). One stand-in tool of the agent's (Claude
//! Code's `Bash`, Codex's `shell`) stands for its tools, so abridge sees an agent's
//! requests, as it would (`recall.offer` counts on it).

mod claude;
mod codex;

use serde_json::{Map, Value};

use super::input::{Input, cuts, is_output};
use crate::formats::Format;
use crate::prices::Tokens;

pub use claude::claude_code;
pub use codex::codex;

/// One conversation of a session file: the request's other members, its history, and
/// the bills the file recorded, one per answer in order (`None`: that answer's was not
/// recorded). Both agents record one bill per answer: a Claude Code answer carries its
/// own `usage`; Codex writes a `token_count` after each answer, but where depends on its
/// version (before the answer's items, after them, or after the tool outputs that
/// follow), so it is matched to the answers by order, not by place.
#[derive(Debug, Default)]
pub struct Answers {
    pub base: Map<String, Value>,
    pub items: Vec<Value>,
    pub bills: Vec<Option<Tokens>>,
}

impl Answers {
    /// The conversation as replay's input: a request per answer, each with its bill.
    pub fn into_input(self, format: Format, kind: &'static str) -> Option<Input> {
        let cuts = cuts(&self.items, |item| is_output(format, item));
        if cuts.is_empty() {
            return None;
        }
        let billed = (0..cuts.len())
            .map(|k| self.bills.get(k).copied().flatten())
            .collect();
        let mut base = self.base;
        base.entry("tools")
            .or_insert_with(|| stand_in_tools(format));
        let input = Input::growing(format, kind, base, self.items, cuts);
        Some(input.with_bills(billed))
    }
}

/// The agent's tools as its session file does not keep them: one of each agent's own,
/// as it writes it (the rest of their size is the head replay pads, see the module docs).
fn stand_in_tools(format: Format) -> Value {
    let command = serde_json::json!({"type": "object",
        "properties": {"command": {"type": "string", "description": "The command to run"}},
        "required": ["command"]});
    let (name, description) = ("shell", "Runs a shell command and returns its output.");
    match format {
        Format::Messages => serde_json::json!([{"name": "Bash",
            "description": "Executes a bash command.", "input_schema": command}]),
        Format::Responses => serde_json::json!([{"type": "function", "name": name,
            "description": description, "parameters": command}]),
        Format::Chat => serde_json::json!([{"type": "function", "function": {"name": name,
            "description": description, "parameters": command}}]),
    }
}

/// Whether a line is a Codex rollout's.
pub fn is_codex(line: &Value) -> bool {
    let envelope = matches!(
        line["type"].as_str(),
        Some("session_meta" | "response_item" | "turn_context" | "event_msg" | "compacted")
    ) && line.get("payload").is_some();
    // Before the envelope (2025-08): a first line of the session's id and instructions.
    let bare_meta = line.get("id").is_some()
        && line.get("timestamp").is_some()
        && line.get("instructions").is_some()
        && line.get("type").is_none();
    envelope || bare_meta
}

/// Whether a line is a Claude Code transcript's.
pub fn is_claude_code(line: &Value) -> bool {
    matches!(line["type"].as_str(), Some("user" | "assistant"))
        && line["message"].is_object()
        && line.get("uuid").is_some()
}

#[cfg(test)]
mod tests;
