//! The Anthropic Messages API of the fake provider: `POST …/messages` (a query such as
//! `?beta=true` is fine) and `POST …/messages/count_tokens` (`{"input_tokens": N}`).
//!
//! Requests: `model`, `max_tokens`, `system` (a string or text blocks), `messages` (roles
//! `user`, `assistant`, and `system` as Claude Code sends mid-conversation; content a
//! string or blocks: text, image, document, tool_use, tool_result, thinking,
//! redacted_thinking, others accepted), `tools`, `tool_choice`, `thinking`, `stream`.
//!
//! Errors are in Anthropic's shape, `{"type":"error","error":{"type":…,"message":…},
//! "request_id":"req_…"}`, with a `request-id` header. Each of these is a 400
//! `invalid_request_error`, checked in this order:
//! - `anthropic-version: header is required`;
//! - `model: Field required`, `max_tokens: Field required` (not for count_tokens),
//!   `messages: Field required`, `messages: at least one message is required`,
//!   `messages.{N}.role: Input should be 'user', 'assistant' or 'system'`;
//! - `messages: first message must use the "user" role`;
//! - with `x-fake-strict-alternation: 1` (`Behavior::strict_alternation`; Anthropic
//!   itself merges consecutive turns): `messages: roles must alternate between "user" and
//!   "assistant"` (`system` messages are skipped);
//! - `messages.{N}.content.{i}: Input tag 'compaction' found using 'type' does not match
//!   any of the expected tags: …` for a `compaction` block (a server without Anthropic's
//!   compaction; `context_management` is ignored, as such servers ignore it);
//! - `messages.{N}: `tool_use` ids were found without `tool_result` blocks immediately
//!   after: {ids}. Each `tool_use` block must have a corresponding `tool_result` block in
//!   the next message.` (ids joined by `, `);
//! - `messages.{N}.content.{i}: unexpected `tool_use_id` found in `tool_result` blocks:
//!   {id}. Each `tool_result` block must have a corresponding `tool_use` block in the
//!   previous message.`;
//! - `messages.{N}.content.{i}.thinking.signature: Field required`, and
//!   `messages.{N}.content.{i}: Invalid `signature` in `thinking` block` when the
//!   signature is not [`thinking_signature`] of the block's thinking text;
//! - `A maximum of 4 blocks with cache_control may be provided. Found {n}.` (top-level
//!   blocks of `system` and of the messages, and tools);
//! - `prompt is too long: {n} tokens > {window} maximum` (not for count_tokens).
//!
//! Tokens are counted as [`crate::prompt_cache`] documents ([`count_tokens`]), times
//! `token_scale`; `x-fake-prompt-tokens: N` reports `input_tokens: N` and no cache
//! tokens. Prompt caching is simulated as documented there.
//!
//! Answers: a `tool_use` block (`stop_reason: "tool_use"`, input `{"path":"/tmp/fake.txt"}`)
//! when the request has a named tool, `tool_choice` is not `none` and the last message that
//! is not `system` is a user message without `tool_result` blocks (chat's rule); otherwise
//! chat's reply text, cut to `max_tokens` words (`stop_reason: "max_tokens"`). A `thinking`
//! block comes first when the request asks `thinking: {"type": "enabled"}` or with
//! `x-fake-thinking: 1` (its text empty when `thinking.display` is `omitted`), signed with
//! [`thinking_signature`]. Output tokens: the reply's words (a tool call ⌈(name + input
//! JSON)/4⌉) plus the thinking's words. Streamed as `message_start`, then per block
//! `content_block_start` (a `ping` after the first), deltas, `content_block_stop`, then
//! `message_delta` (usage cumulative: output tokens with the input and cache counts
//! repeated) and `message_stop`; no `[DONE]`.

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};

use crate::Behavior;
use crate::chat::{fnv, reply_text, text_of};
use crate::prompt_cache::{Prompt, PromptCache, Split, has_cache_control};
use crate::transport::{Answer, event_json, typed};

/// The signature the fake gives a thinking block of this text (and expects back).
pub fn thinking_signature(text: &str) -> String {
    format!("fakesig{:016x}", fnv(text.as_bytes()))
}

/// Prompt tokens of a Messages request body as the fake counts them (see
/// [`crate::prompt_cache`]), before `token_scale`.
pub fn count_tokens(request: &Value) -> u64 {
    Prompt::of(request).total
}

/// Whether a path is one of this module's.
pub(crate) fn is_route(path: &str) -> bool {
    path.ends_with("/messages") || path.ends_with("/messages/count_tokens")
}

/// Anthropic's error type for an HTTP status.
fn error_kind(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        409 => "conflict_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

fn error_body(status: StatusCode, message: &str, request_id: &str) -> Bytes {
    let value = json!({"type": "error", "error": {"type": error_kind(status), "message": message},
        "request_id": request_id});
    Bytes::from(serde_json::to_vec(&value).unwrap_or_default())
}

/// An error in Anthropic's shape (its type from the status).
pub(crate) fn error(status: StatusCode, message: &str, request_id: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        error_body(status, message, request_id),
    )
        .into_response()
}

/// The answer to a Messages (or, with `count_only`, count_tokens) request.
pub(crate) fn answer(
    b: &Behavior,
    cache: &PromptCache,
    headers: &HeaderMap,
    body: &Bytes,
    request_id: &str,
    count_only: bool,
) -> Answer {
    let fail = |message: &str| {
        Answer::Whole(
            StatusCode::BAD_REQUEST,
            error_body(StatusCode::BAD_REQUEST, message, request_id),
        )
    };
    if !headers.contains_key("anthropic-version") {
        return fail("anthropic-version: header is required");
    }
    let request: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return fail("There was an issue with the request body: it is not a JSON object."),
    };
    if let Err(message) = validate(&request, b.strict_alternation, count_only) {
        return fail(&message);
    }
    let summary = request["messages"]
        .as_array()
        .is_some_and(|m| crate::chat::is_summary_request(m));
    if summary && b.summary == crate::SummaryMode::Error {
        let status = StatusCode::INTERNAL_SERVER_ERROR;
        return Answer::Whole(
            status,
            error_body(status, "The summariser failed (as told).", request_id),
        );
    }
    let prompt = Prompt::of(&request);
    let total = (prompt.total as f64 * b.token_scale).ceil() as u64;
    let whole = |value: Value| {
        Answer::Whole(
            StatusCode::OK,
            Bytes::from(serde_json::to_vec(&value).unwrap_or_default()),
        )
    };
    if count_only {
        return whole(json!({"input_tokens": b.reported_prompt_tokens.unwrap_or(total)}));
    }
    if let Some(window) = b.context_window
        && total > window
    {
        if b.overflow_in_stream && request["stream"] == Value::Bool(true) {
            let model = request["model"].as_str().unwrap_or_default();
            let id = format!("msg_{:016x}", crate::chat::fnv(body));
            return Answer::Events(crate::overflow::messages_stream(&id, model, window, total));
        }
        return fail(&format!(
            "prompt is too long: {total} tokens > {window} maximum"
        ));
    }
    let mut split = cache.split(&prompt, b.token_scale);
    if let Some(n) = b.reported_prompt_tokens {
        split = Split {
            input: n,
            cache_creation: 0,
            cache_read: 0,
        };
    }
    let reply = Reply::to(b, &request, split);
    if request["stream"] == Value::Bool(true) {
        Answer::Events(reply.events(b.multiline_data))
    } else {
        whole(reply.message(
            reply.blocks(),
            reply.stop,
            reply.usage(reply.output_tokens()),
        ))
    }
}

/// A message's content blocks (none for a string content).
fn blocks(message: &Value) -> &[Value] {
    message["content"].as_array().map_or(&[], Vec::as_slice)
}

/// The `tool_use` ids of a message.
fn tool_use_ids(message: &Value) -> Vec<&str> {
    blocks(message)
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .filter_map(|b| b["id"].as_str())
        .collect()
}

/// The checks of the module doc after the header, in order; the first failure's message.
fn validate(request: &Value, strict: bool, count_only: bool) -> Result<(), String> {
    if !request["model"].is_string() {
        return Err("model: Field required".into());
    }
    if !count_only && !request["max_tokens"].is_u64() {
        return Err("max_tokens: Field required".into());
    }
    let Some(messages) = request["messages"].as_array() else {
        return Err("messages: Field required".into());
    };
    if messages.is_empty() {
        return Err("messages: at least one message is required".into());
    }
    for (n, m) in messages.iter().enumerate() {
        if !["user", "assistant", "system"].contains(&m["role"].as_str().unwrap_or("")) {
            return Err(format!(
                "messages.{n}.role: Input should be 'user', 'assistant' or 'system'"
            ));
        }
    }
    if messages[0]["role"] != "user" {
        return Err(r#"messages: first message must use the "user" role"#.into());
    }
    if strict {
        let turns: Vec<&Value> = messages.iter().filter(|m| m["role"] != "system").collect();
        if turns.windows(2).any(|w| w[0]["role"] == w[1]["role"]) {
            return Err(r#"messages: roles must alternate between "user" and "assistant""#.into());
        }
    }
    check_compaction(messages)?;
    check_tools(messages)?;
    check_thinking(messages)?;
    let marked = |list: &Value| {
        list.as_array()
            .map_or(0, |l| l.iter().filter(|b| has_cache_control(b)).count())
    };
    let n = marked(&request["system"])
        + marked(&request["tools"])
        + messages
            .iter()
            .map(|m| marked(&m["content"]))
            .sum::<usize>();
    if n > 4 {
        return Err(format!(
            "A maximum of 4 blocks with cache_control may be provided. Found {n}."
        ));
    }
    Ok(())
}

/// Every `tool_use` answered in the next message, every `tool_result` asked in the
/// previous one.
fn check_tools(messages: &[Value]) -> Result<(), String> {
    for (n, m) in messages.iter().enumerate() {
        if m["role"] == "assistant" {
            let uses = tool_use_ids(m);
            let answered: Vec<&str> = messages
                .get(n + 1)
                .filter(|next| next["role"] == "user")
                .map(|next| {
                    blocks(next)
                        .iter()
                        .filter(|b| b["type"] == "tool_result")
                        .filter_map(|b| b["tool_use_id"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            let missing: Vec<&str> = uses
                .into_iter()
                .filter(|id| !answered.contains(id))
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "messages.{n}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                    missing.join(", ")
                ));
            }
        } else if m["role"] == "user" {
            let asked = match n.checked_sub(1).map(|p| &messages[p]) {
                Some(prev) if prev["role"] == "assistant" => tool_use_ids(prev),
                _ => Vec::new(),
            };
            for (i, b) in blocks(m).iter().enumerate() {
                let id = b["tool_use_id"].as_str().unwrap_or("");
                if b["type"] == "tool_result" && !asked.contains(&id) {
                    return Err(format!(
                        "messages.{n}.content.{i}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                    ));
                }
            }
        }
    }
    Ok(())
}

/// No `compaction` block: Anthropic's compaction is not this server's (llama-server's
/// and vLLM's Anthropic surfaces refuse a block type they do not know).
fn check_compaction(messages: &[Value]) -> Result<(), String> {
    for (n, m) in messages.iter().enumerate() {
        if let Some(i) = blocks(m).iter().position(|b| b["type"] == "compaction") {
            return Err(format!(
                "messages.{n}.content.{i}: Input tag 'compaction' found using 'type' does not match any of the expected tags: 'text', 'image', 'document', 'tool_use', 'tool_result', 'thinking', 'redacted_thinking'"
            ));
        }
    }
    Ok(())
}

/// Every thinking block comes back with the signature the fake gave it.
fn check_thinking(messages: &[Value]) -> Result<(), String> {
    for (n, m) in messages.iter().enumerate() {
        for (i, b) in blocks(m).iter().enumerate() {
            if b["type"] != "thinking" {
                continue;
            }
            let Some(signature) = b["signature"].as_str() else {
                return Err(format!(
                    "messages.{n}.content.{i}.thinking.signature: Field required"
                ));
            };
            if signature != thinking_signature(b["thinking"].as_str().unwrap_or("")) {
                return Err(format!(
                    "messages.{n}.content.{i}: Invalid `signature` in `thinking` block"
                ));
            }
        }
    }
    Ok(())
}

/// What the fake answers: an optional thinking block, then text or a tool call.
struct Reply {
    id: String,
    model: Value,
    thinking: Option<String>,
    content: Content,
    stop: &'static str,
    split: Split,
}

enum Content {
    Text(String),
    Tool {
        id: String,
        name: String,
        input: Value,
    },
}

/// What the fake does with a proxy's recall tool (see [`crate::recall`]): the question
/// is the last user message with text of its own.
fn recall_move(request: &Value, messages: &[Value]) -> Option<crate::recall::Move> {
    let is_result = |b: &Value| b["type"] == "tool_result";
    let asked = messages.iter().rposition(|m| {
        m["role"] == "user" && !blocks(m).iter().any(is_result) && !text_of(m).is_empty()
    })?;
    let calls: Vec<&str> = messages[asked..]
        .iter()
        .filter(|m| m["role"] == "assistant")
        .flat_map(blocks)
        .filter(|b| b["type"] == "tool_use" && b["name"] == crate::recall::NAME)
        .filter_map(|b| b["id"].as_str())
        .collect();
    let results: Vec<String> = messages[asked..]
        .iter()
        .filter(|m| m["role"] == "user")
        .flat_map(blocks)
        .filter(|b| {
            is_result(b)
                && b["tool_use_id"]
                    .as_str()
                    .is_some_and(|id| calls.contains(&id))
        })
        .map(|b| match &b["content"] {
            Value::String(s) => s.clone(),
            other => other
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        })
        .collect();
    let callable =
        crate::recall::offered(&request["tools"]) && request["tool_choice"]["type"] != "none";
    let texts: Vec<String> = messages.iter().map(text_of).collect();
    crate::recall::decide_at(
        (asked, &texts),
        &results,
        request["system"].as_str(),
        callable,
    )
}

/// The input of every tool call the fake makes.
fn tool_input() -> Value {
    json!({"path": "/tmp/fake.txt"})
}

impl Reply {
    fn to(b: &Behavior, request: &Value, split: Split) -> Self {
        let messages = request["messages"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        let hash = fnv(request["messages"].to_string().as_bytes());
        let is_result = |b: &Value| b["type"] == "tool_result";
        let last_asks = messages
            .iter()
            .rev()
            .find(|m| m["role"] != "system")
            .is_some_and(|m| m["role"] == "user" && !blocks(m).iter().any(is_result));
        let tool = request["tools"].as_array().and_then(|t| {
            t.iter()
                .filter(|t| !crate::recall::is_proxy_tool(t))
                .find_map(|t| t["name"].as_str())
        });
        let asked = messages
            .iter()
            .rev()
            .filter(|m| m["role"] == "user")
            .map(text_of)
            .find(|t| !t.is_empty())
            .unwrap_or_default();
        // A summary asked after the conversation is answered in text, as a model told
        // not to call tools does.
        let summary = crate::chat::is_summary_request(messages);
        let recalled = recall_move(request, messages).filter(|_| b.uses_recall && !summary);
        let tool = tool.filter(|_| !summary);
        let (content, stop) = match (recalled, tool) {
            (Some(crate::recall::Move::Call(query)), _) => (
                Content::Tool {
                    id: format!("toolu_recall{hash:016x}"),
                    name: crate::recall::NAME.to_owned(),
                    input: json!({ "query": query }),
                },
                "tool_use",
            ),
            (Some(crate::recall::Move::Answer(text)), _) => (Content::Text(text), "end_turn"),
            (None, Some(name)) if last_asks && request["tool_choice"]["type"] != "none" => (
                Content::Tool {
                    id: format!("toolu_fake{hash:016x}"),
                    name: name.to_owned(),
                    input: tool_input(),
                },
                "tool_use",
            ),
            // A summary asked in the Messages API: the same summariser as chat's, which
            // stops at max_tokens (about four characters a token) like a model.
            _ if crate::chat::is_summary_request(messages) => {
                let limit = request["max_tokens"]
                    .as_u64()
                    .map_or(usize::MAX, |t| usize::try_from(t * 4).unwrap_or(usize::MAX));
                let mut text = crate::summary::summarise(messages, b.summary);
                let stop = match text.char_indices().nth(limit) {
                    Some((at, _)) => {
                        text.truncate(at);
                        "max_tokens"
                    }
                    None => "end_turn",
                };
                (Content::Text(text), stop)
            }
            _ => {
                let max = request["max_tokens"].as_u64();
                let (text, truncated) = reply_text(&asked, b.reply_words, max);
                let stop = if truncated { "max_tokens" } else { "end_turn" };
                (Content::Text(text), stop)
            }
        };
        let thinking = (b.thinking || request["thinking"]["type"] == "enabled").then(|| {
            if request["thinking"]["display"] == "omitted" {
                String::new()
            } else {
                let words: Vec<&str> = asked.split_whitespace().take(6).collect();
                format!("Thinking about: {}", words.join(" "))
            }
        });
        Self {
            id: format!("msg_fake{hash:016x}"),
            model: request["model"].clone(),
            thinking,
            content,
            stop,
            split,
        }
    }

    fn output_tokens(&self) -> u64 {
        let thinking = self
            .thinking
            .as_deref()
            .map_or(0, |t| t.split_whitespace().count() as u64);
        thinking
            + match &self.content {
                Content::Text(text) => text.split_whitespace().count() as u64,
                Content::Tool { name, input, .. } => {
                    ((name.len() + input.to_string().len()) as u64).div_ceil(4)
                }
            }
    }

    fn usage(&self, output_tokens: u64) -> Value {
        json!({"input_tokens": self.split.input,
            "cache_creation_input_tokens": self.split.cache_creation,
            "cache_read_input_tokens": self.split.cache_read, "output_tokens": output_tokens})
    }

    /// The content blocks, complete.
    fn blocks(&self) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(t) = &self.thinking {
            out.push(
                json!({"type": "thinking", "thinking": t, "signature": thinking_signature(t)}),
            );
        }
        out.push(match &self.content {
            Content::Text(text) => json!({"type": "text", "text": text}),
            Content::Tool { id, name, input } => {
                json!({"type": "tool_use", "id": id, "name": name, "input": input})
            }
        });
        out
    }

    fn message(&self, content: Vec<Value>, stop: impl Into<Value>, usage: Value) -> Value {
        json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": content, "stop_reason": stop.into(), "stop_sequence": null, "usage": usage})
    }

    /// The stream of the module doc.
    fn events(&self, multiline: bool) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut push = |kind: &str, rest: Value| {
            out.push(typed(kind, &event_json(kind, None, &rest), multiline));
        };
        let start = self.message(Vec::new(), Value::Null, self.usage(1));
        push("message_start", json!({"message": start}));
        for (index, block) in self.blocks().into_iter().enumerate() {
            let mut opening = block.clone();
            let deltas: Vec<Value> = match block["type"].as_str().unwrap_or("") {
                "thinking" => {
                    opening["thinking"] = json!("");
                    opening["signature"] = json!("");
                    vec![
                        json!({"type": "thinking_delta", "thinking": block["thinking"]}),
                        json!({"type": "signature_delta", "signature": block["signature"]}),
                    ]
                }
                "tool_use" => {
                    opening["input"] = json!({});
                    let input = block["input"].to_string();
                    let (a, b) = input.split_at(input.len() / 2);
                    [a, b]
                        .iter()
                        .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                        .collect()
                }
                _ => {
                    opening["text"] = json!("");
                    let text = block["text"].as_str().unwrap_or("");
                    let words: Vec<&str> = text.split(' ').collect();
                    let last = words.len().saturating_sub(1);
                    words
                        .iter()
                        .enumerate()
                        .map(|(i, w)| {
                            let piece = if i < last {
                                format!("{w} ")
                            } else {
                                (*w).to_owned()
                            };
                            json!({"type": "text_delta", "text": piece})
                        })
                        .collect()
                }
            };
            push(
                "content_block_start",
                json!({"index": index, "content_block": opening}),
            );
            if index == 0 {
                push("ping", json!({}));
            }
            for delta in deltas {
                push(
                    "content_block_delta",
                    json!({"index": index, "delta": delta}),
                );
            }
            push("content_block_stop", json!({"index": index}));
        }
        let delta = json!({"stop_reason": self.stop, "stop_sequence": null});
        push(
            "message_delta",
            json!({"delta": delta, "usage": self.usage(self.output_tokens())}),
        );
        push("message_stop", json!({}));
        out
    }
}

#[cfg(test)]
mod tests;
