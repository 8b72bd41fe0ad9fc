//! Summaries that ride the prompt cache: when the conversation's own model on its own
//! provider makes the summary, it is asked after the conversation itself — the request
//! as it was last forwarded (the same tools, system or instructions, and messages, with
//! the checkpoint in force applied, the client's `cache_control` breakpoints included),
//! cut after the last message the summary covers, with the ask appended as the final
//! user message — so the provider bills that prefix as cached input, as Claude Code and
//! Codex make their own summaries. The body is the forwarded body's bytes with `stream`
//! and the client's output cap taken out and the summary's cap put in; every other
//! member (the client's `tool_choice`, `prompt_cache_key`, reasoning settings) stays as
//! it was, since some of them are part of what the provider caches.
//!
//! Not used — the transcript is asked as before — when the request forces a tool (the
//! summary would be a tool call), asks for several answers, is on an Azure deployment's
//! classic path in an API other than chat, or when the forwarded conversation does not
//! hold what the transcript would (a checkpoint in force other than the summary being
//! updated).

use serde_json::json;

use super::forwarded;
use crate::formats::{Author, Format, Request};
use crate::json::{self, Raw};
use crate::store::Checkpoint;
use crate::strategies::InContext;

/// Anthropic's most cache breakpoints in one request.
const MAX_BREAKPOINTS: usize = 4;

/// Top-level members the summary does not keep: streaming, and the client's caps.
const DROPPED: [&str; 6] = [
    "\"stream\"",
    "\"stream_options\"",
    "\"max_tokens\"",
    "\"max_completion_tokens\"",
    "\"max_output_tokens\"",
    "\"n\"",
];

/// What the summary is asked after: the request, the checkpoint its last forwarded
/// request went with, and whether that request carried the recall tool.
pub(super) struct Forwarded<'r> {
    pub request: &'r Request,
    pub checkpoint: Option<&'r Checkpoint>,
    pub recall_tool: bool,
    /// …offered from the conversation's first request (`recall.offer = "always"`).
    pub recall_always: bool,
}

/// The summary request's body (`None`: ask the transcript instead, see the module doc).
/// `completion_tokens`: a chat model takes `max_completion_tokens` (used when the client
/// named neither cap).
pub(super) fn body(
    f: &Forwarded<'_>,
    ask: &InContext,
    (max_tokens, completion_tokens): (u32, bool),
) -> Option<Vec<u8>> {
    let request = f.request;
    if !request.lets_the_model_choose_tools() || request.asks_several_answers() {
        return None;
    }
    // The forwarded conversation holds the summary being updated, or no checkpoint.
    let holds = match f.checkpoint {
        None => ask.updates.is_none(),
        Some(c) => c.summary.is_some() && ask.updates == Some(c.through as usize),
    };
    let messages = request.items().get(..=ask.through)?;
    if !holds
        || f.checkpoint
            .is_some_and(|c| c.through as usize > ask.through)
    {
        return None;
    }
    let mut items: Vec<Raw<'_>> = match f.checkpoint {
        Some(c) => forwarded(messages, c),
        None => messages.iter().map(|m| m.raw).collect(),
    };
    let format = request.format();
    let tool = f
        .recall_tool
        .then(|| {
            let tools = request.tools().map(Raw::get);
            crate::recall::Tool::for_request(format, tools, f.recall_always)
        })
        .flatten()
        .map(|t| t.definition(format));
    // The client's own breakpoints in what is kept: the body's, less those of the
    // messages it does not keep.
    let count = |text: &[u8]| memchr::memmem::find_iter(text, b"\"cache_control\"").count();
    let in_items = |items: &mut dyn Iterator<Item = Raw<'_>>| {
        items.map(|m| count(m.get().as_bytes())).sum::<usize>()
    };
    let breakpoints = (count(request.body()) + in_items(&mut items.iter().copied()))
        .saturating_sub(in_items(&mut request.items().iter().map(|m| m.raw)));
    let instruction = authored(format, &ask.instruction, breakpoints < MAX_BREAKPOINTS);
    items.push(Raw::from(&*instruction));
    let outgoing = request.outgoing(Some(&items), tool.as_deref(), false).body;
    let text = std::str::from_utf8(&outgoing).ok()?;
    capped(text, format, (max_tokens, completion_tokens))
}

/// The ask as the conversation's final user message. In the Messages API it carries a
/// breakpoint (when the client's leave room for one): Anthropic reads its cache only
/// up to a breakpoint, and the client's last one was on a message the summary drops.
fn authored(format: Format, text: &str, breakpoint: bool) -> Box<serde_json::value::RawValue> {
    if format != Format::Messages || !breakpoint {
        return format.authored(Author::User, text);
    }
    let message = json!({
        "role": "user",
        "content": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}],
    });
    serde_json::value::RawValue::from_string(message.to_string())
        .unwrap_or_else(|_| unreachable!("serde_json wrote valid JSON"))
}

/// `body` (a top-level object) without [`DROPPED`], with the summary's cap in the
/// format's name for it (chat: the one the client used). In Messages with extended
/// thinking and a budget, the cap is on top of the budget, which it must exceed.
fn capped(
    body: &str,
    format: Format,
    (max_tokens, completion_tokens): (u32, bool),
) -> Option<Vec<u8>> {
    let top = json::top(body)?;
    let mut cap = match format {
        Format::Chat if completion_tokens => "max_completion_tokens",
        Format::Chat => "max_tokens",
        Format::Responses => "max_output_tokens",
        Format::Messages => "max_tokens",
    };
    let mut tokens = u64::from(max_tokens.max(1));
    let mut out = Vec::with_capacity(body.len() + 32);
    out.push(b'{');
    for (key, value) in top.members() {
        if format == Format::Chat && value.get() != "null" {
            match key {
                "\"max_tokens\"" => cap = "max_tokens",
                "\"max_completion_tokens\"" => cap = "max_completion_tokens",
                _ => {}
            }
        }
        if format == Format::Messages && key == "\"thinking\"" {
            tokens += thinking_budget(value.get());
        }
        if DROPPED.contains(&key) {
            continue;
        }
        out.extend_from_slice(key.as_bytes());
        out.push(b':');
        out.extend_from_slice(value.get().as_bytes());
        out.push(b',');
    }
    out.extend_from_slice(format!("\"{cap}\":{tokens},\"stream\":false}}").as_bytes());
    Some(out)
}

/// The `budget_tokens` of an enabled extended thinking (0 otherwise).
fn thinking_budget(thinking: &str) -> u64 {
    let value: serde_json::Value = serde_json::from_str(thinking).unwrap_or_default();
    match value["type"].as_str() {
        Some("enabled") => value["budget_tokens"].as_u64().unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_replaces_the_clients_and_the_stream_goes() {
        let body = r#"{"model":"m","stream":true,"max_completion_tokens":9000,"messages":[1],"stream_options":{"include_usage":true}}"#;
        let out = capped(body, Format::Chat, (300, false)).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"m","messages":[1],"max_completion_tokens":300,"stream":false}"#
        );
        let body = r#"{"model":"c","max_tokens":32000,"thinking":{"type":"enabled","budget_tokens":8000},"messages":[]}"#;
        let out: serde_json::Value =
            serde_json::from_slice(&capped(body, Format::Messages, (300, false)).unwrap()).unwrap();
        assert_eq!(out["max_tokens"], 8300);
        assert_eq!(out["thinking"]["budget_tokens"], 8000);
        let body = r#"{"model":"g","input":[],"max_output_tokens":5}"#;
        let out: serde_json::Value =
            serde_json::from_slice(&capped(body, Format::Responses, (300, true)).unwrap()).unwrap();
        assert_eq!(out["max_output_tokens"], 300);
    }
}
