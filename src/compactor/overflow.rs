//! Recognising a provider's "the prompt does not fit the context window" answer, for
//! compact-and-retry, and reading the window from it where the provider states it.
//!
//! The families abridge is put in front of say it differently (see `docs/src/windows.md`
//! for each one's exact text):
//! - structured: OpenAI, Azure and Groq's `code: "context_length_exceeded"`
//!   (Responses' stream puts it in `response.error`); llama-server's
//!   `type: "exceed_context_size_error"` with `n_ctx`;
//! - in the message only: vLLM (wrapped in `error`, or flat with `"object": "error"`),
//!   Anthropic ("prompt is too long: N tokens > M maximum"), Mistral and SGLang (flat),
//!   Gemini's OpenAI-compatible endpoint (an array around the error), LM Studio (the
//!   error as a string), OpenRouter (the provider's own body as a string in
//!   `error.metadata.raw`), Ollama (llama-server's body as its message), Together and
//!   Fireworks (whose window is stated one short).
//!
//! Only the error body's code, type and message are read; nothing else of it is kept.
//!
//! Every overflow is retried, compacted harder; a window is learned only from what
//! proves one ([`Overflow::proves`]): the family's own overflow error, never a bare 413
//! (a gateway's byte limit needs no credential). A window read from the message's words
//! comes with those words ([`Overflow::evidence`]), so that the caller can refuse a
//! number the client's own request carries (a provider's "invalid value" error quotes
//! the client's value back).

use std::sync::OnceLock;

use http::StatusCode;
use regex::Regex;
use serde_json::Value;

/// What an overflow answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overflow {
    /// The model's context window, when the provider stated it.
    pub window: Option<u64>,
    /// The words the window was read from (lower case, short), when it was read from a
    /// message rather than a structured field (`n_ctx`).
    pub evidence: Option<String>,
    /// A family's own overflow error, which a window may be learned from (not a bare
    /// 413, which is retried but teaches nothing).
    pub proves: bool,
}

impl Overflow {
    /// An overflow `body` reports (a family's own error).
    fn of(body: &Value) -> Self {
        let (window, evidence) = window_in(body).unzip();
        Self {
            window,
            evidence: evidence.flatten(),
            proves: true,
        }
    }
}

/// Phrases providers use in the message of a context overflow (lower case).
const PHRASES: &[&str] = &[
    "context_length_exceeded",
    "maximum context length",
    "context length exceeded",
    "exceeds the available context size",
    "exceed_context_size",
    "prompt is too long",
    "input is too long",
    "reduce the length of the messages",
    "exceeds the context window",
    "exceed context limit",
    "request size exceeds model context window",
    "longer than the context length",
    "input length exceeds the context length",
    "exceeds maximum context length",
    "does not fit in context length",
    "context size has been exceeded",
    "longer than the model's context length",
    "too large for model with",
    "exceeds the maximum number of tokens allowed",
    "longer than the maximum model length",
    "context length is only",
    "greater than the context length",
    "when context the overflows",
    "context length of only",
    "`max_new_tokens` must be <=",
];

/// Windows read from the text: (pattern, what to add to the number). Fireworks states
/// the window one short.
const WINDOW_PATTERNS: &[(&str, u64)] = &[
    (r"maximum context length is (\d+)", 0),
    (r"context length is only (\d+)", 0),
    (r"available context size \((\d+) tokens\)", 0),
    (r"tokens > (\d+) maximum", 0),
    (r"exceed context limit: \d+ \+ \d+ > (\d+)", 0),
    (r"maximum number of tokens allowed \((\d+)\)", 0),
    (r"too large for model with (\d+) maximum context length", 0),
    (
        r"longer than the model's context length \((\d+) tokens\)",
        0,
    ),
    (r"maximum model length of (\d+)", 0),
    (r"context length only supports (\d+) tokens", 0),
    (r"context length of only (\d+) tokens", 0),
    (r"n_ctx:? \(?(\d+)", 0),
    (r"configured limit of (\d+) tokens", 0),
    (r"max_new_tokens` must be <= (\d+)", 0),
    (r"model maximum context length: (\d+)", 1),
];

/// [`WINDOW_PATTERNS`], compiled once.
fn window_patterns() -> &'static [(Regex, u64)] {
    static P: OnceLock<Vec<(Regex, u64)>> = OnceLock::new();
    P.get_or_init(|| {
        let patterns: Vec<&str> = WINDOW_PATTERNS.iter().map(|(p, _)| *p).collect();
        crate::strategies::text::compile(&patterns)
            .into_iter()
            .zip(WINDOW_PATTERNS.iter().map(|(_, add)| *add))
            .collect()
    })
}

/// Windows smaller than this or larger than that, read from an error, are not believed.
const PLAUSIBLE: std::ops::RangeInclusive<u64> = 256..=100_000_000;

/// The overflow a provider's error response reports, if it is one.
pub fn read(status: StatusCode, body: &[u8]) -> Option<Overflow> {
    let value: Option<Value> = serde_json::from_slice(body).ok();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        // A gateway's byte limit is an overflow too; a rate limit said with 413 is not.
        if value.as_ref().is_some_and(is_rate_limit) {
            return None;
        }
        return Some(match value.filter(is_overflow_body) {
            Some(value) => Overflow::of(&value),
            None => Overflow {
                window: None,
                evidence: None,
                proves: false,
            },
        });
    }
    if !matches!(status.as_u16(), 400 | 422) {
        return None;
    }
    let value = value?;
    is_overflow_body(&value).then(|| Overflow::of(&value))
}

/// An error event inside a 200 stream (`response.failed`, `event: error`, llama-server's
/// `data: {"error": …}`), when it reports an overflow: its `data` parsed.
pub fn in_event(data: &Value) -> Option<Overflow> {
    let error = data
        .pointer("/response/error")
        .filter(|e| !e.is_null())
        .or_else(|| data.get("error"))
        .or_else(|| (data["type"] == "error").then_some(data))?;
    let wrapped = serde_json::json!({ "error": error });
    is_overflow_body(&wrapped).then(|| Overflow::of(&wrapped))
}

fn is_rate_limit(value: &Value) -> bool {
    let error = &value["error"];
    error["code"] == "rate_limit_exceeded" || error["type"] == "tokens"
}

/// The error objects of a body, whatever its family's envelope: `error` (an object or a
/// string), the body itself (flat), the first element of an array (Gemini), and a
/// provider's own body carried as a string (OpenRouter's `metadata.raw`, Ollama's
/// message), one level deep.
fn errors(value: &Value) -> Vec<Value> {
    let mut out = Vec::with_capacity(3);
    let top = match value {
        Value::Array(items) => items.first().cloned().unwrap_or(Value::Null),
        other => other.clone(),
    };
    match &top["error"] {
        Value::Object(_) => out.push(top["error"].clone()),
        Value::String(s) => out.push(serde_json::json!({ "message": s })),
        _ => {}
    }
    if top.get("message").is_some() || top.get("object").is_some() {
        out.push(top.clone());
    }
    let nested: Vec<Value> = out
        .iter()
        .filter_map(|e| {
            e.pointer("/metadata/raw")
                .or_else(|| e.get("message"))
                .and_then(Value::as_str)
                .filter(|s| s.trim_start().starts_with('{'))
                .and_then(|s| serde_json::from_str::<Value>(s).ok())
        })
        .collect();
    for inner in nested {
        match &inner["error"] {
            Value::Object(_) => out.push(inner["error"].clone()),
            _ => out.push(inner),
        }
    }
    out
}

fn message(error: &Value) -> String {
    error["message"].as_str().unwrap_or_default().to_lowercase()
}

fn is_overflow_body(value: &Value) -> bool {
    errors(value).iter().any(|error| {
        error["code"] == "context_length_exceeded"
            || error["type"] == "exceed_context_size_error"
            || {
                let message = message(error);
                PHRASES.iter().any(|p| message.contains(p))
            }
    })
}

/// The window an overflow body states: llama-server's `n_ctx`, else the first number a
/// family's text gives it by, with the words it was read from.
fn window_in(value: &Value) -> Option<(u64, Option<String>)> {
    let errors = errors(value);
    let stated = errors
        .iter()
        .find_map(|e| e["n_ctx"].as_u64().map(|n| (n, None)))
        .or_else(|| {
            errors.iter().find_map(|e| {
                let message = message(e);
                window_patterns().iter().find_map(|(re, add)| {
                    let found = re.captures(&message)?;
                    let n: u64 = found.get(1)?.as_str().parse().ok()?;
                    Some((n + add, Some(found.get(0)?.as_str().to_owned())))
                })
            })
        })?;
    PLAUSIBLE.contains(&stated.0).then_some(stated)
}

/// Whether `evidence` (lower case) is in the client's own `body`, in any case: then the
/// provider may be quoting the client, and the number proves nothing.
pub fn echoed(evidence: &str, body: &[u8]) -> bool {
    regex::bytes::RegexBuilder::new(&regex::escape(evidence))
        .case_insensitive(true)
        .unicode(false)
        .build()
        .map_or(true, |re| re.is_match(body))
}

#[cfg(test)]
mod tests;
