//! Shapes of chat answers for a proxy's bound tests (recall above all), each set for the
//! instance ([`Shapes`] in `Behavior`) or per request with an `x-fake-*` header:
//!
//! - `x-fake-recall-calls: N` — a call of a proxy's recall tool is N calls in one answer
//!   (the same query, ids numbered).
//! - `x-fake-call-bytes: N` — every tool call's arguments padded to about N bytes (a
//!   `pad` member of `x`s).
//! - `x-fake-call-chunk: N` — a streamed call's arguments in deltas of N bytes each;
//!   `0`: in one delta (one event as long as the arguments). Unset: two halves.
//! - `x-fake-follow-up-latency-ms: N` — a wait before answering a request that carries
//!   the result of a proxy's recall call (a slow follow-up, and only that).
//! - `x-fake-duplicate-tools: 1` — accept tools that repeat a name. Unset, a chat request
//!   whose `tools` repeat a name, or hold more than [`MAX_TOOLS`], is refused with a 400
//!   as OpenAI refuses it.
//!
//! And the request's own `n`: a whole chat answer has `n` choices, the same message in
//! each, except that a call of a proxy's recall tool is made in the last choice only
//! (the others answer in text: samples differ).

use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde_json::Value;

/// Most tools a chat request may carry (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;

#[derive(Debug, Clone, Default)]
pub struct Shapes {
    pub recall_calls: Option<usize>,
    pub call_bytes: Option<usize>,
    pub call_chunk: Option<usize>,
    pub follow_up_latency: Option<Duration>,
    pub duplicate_tools: bool,
}

impl Shapes {
    pub(crate) fn apply_headers(&mut self, headers: &HeaderMap) {
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let number = |name: &str| get(name).and_then(|v| v.parse::<usize>().ok());
        if let Some(n) = number("x-fake-recall-calls") {
            self.recall_calls = Some(n.max(1));
        }
        if let Some(n) = number("x-fake-call-bytes") {
            self.call_bytes = Some(n);
        }
        if let Some(n) = number("x-fake-call-chunk") {
            self.call_chunk = Some(n);
        }
        if let Some(ms) = get("x-fake-follow-up-latency-ms").and_then(|v| v.parse().ok()) {
            self.follow_up_latency = Some(Duration::from_millis(ms));
        }
        if get("x-fake-duplicate-tools").is_some_and(|v| v == "1" || v == "true") {
            self.duplicate_tools = true;
        }
    }

    /// `arguments` padded to about `call_bytes`, when set.
    pub(crate) fn pad(&self, arguments: String) -> String {
        let Some(bytes) = self.call_bytes else {
            return arguments;
        };
        let mut value: Value = serde_json::from_str(&arguments).unwrap_or(Value::Null);
        let Some(object) = value.as_object_mut() else {
            return arguments;
        };
        let fill = bytes.saturating_sub(arguments.len() + 10);
        object.insert("pad".to_owned(), Value::from("x".repeat(fill)));
        value.to_string()
    }

    /// `arguments` as the deltas a stream carries them in.
    pub(crate) fn pieces<'a>(&self, arguments: &'a str) -> Vec<&'a str> {
        match self.call_chunk {
            None => {
                let (a, b) = arguments.split_at(arguments.len() / 2);
                vec![a, b]
            }
            Some(0) => vec![arguments],
            Some(n) => {
                let mut out = Vec::new();
                let mut rest = arguments;
                while !rest.is_empty() {
                    let mut at = n.min(rest.len());
                    while !rest.is_char_boundary(at) {
                        at += 1;
                    }
                    let (piece, more) = rest.split_at(at);
                    out.push(piece);
                    rest = more;
                }
                out
            }
        }
    }

    /// The 400 a chat request's tools earn (OpenAI's words): too many, or a name twice.
    pub(crate) fn refuse_tools(&self, request: &Value) -> Option<(StatusCode, String)> {
        let tools = request["tools"].as_array()?;
        if tools.len() > MAX_TOOLS {
            return Some((
                StatusCode::BAD_REQUEST,
                format!(
                    "Invalid 'tools': array too long. Expected an array with maximum length {MAX_TOOLS}, but got an array with length {} instead.",
                    tools.len()
                ),
            ));
        }
        if self.duplicate_tools {
            return None;
        }
        let mut names: Vec<&str> = tools
            .iter()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect();
        names.sort_unstable();
        let twice = names.windows(2).find(|w| w[0] == w[1])?[0];
        Some((
            StatusCode::BAD_REQUEST,
            format!("Invalid 'tools': tool names must be unique; '{twice}' is given twice."),
        ))
    }
}

/// How many choices a chat request asks for (`n`, 1 when absent).
pub(crate) fn choices(request: &Value) -> usize {
    request["n"]
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(1)
        .clamp(1, 8)
}
