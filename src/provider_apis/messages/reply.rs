//! What a Messages answer carries when abridge served the request's compaction or
//! context editing, in Anthropic's shapes: the `compaction` block first (streamed as
//! `content_block_start` with `content: null`, one `compaction_delta`, and
//! `content_block_stop`, the upstream's blocks shifted one index on),
//! `context_management.applied_edits` (top level of the message; of the `message_delta`
//! event when streamed) and `usage.iterations` (the compaction, then the message; the
//! top-level usage stays the message's, as Anthropic reports it; the compaction's are
//! its summary call's, none when the digest made it). Also the answer when paused after
//! the compaction (`stop_reason: "compaction"`, the block only), and Anthropic's 400 for
//! an invalid edit. The rewriting of the upstream's answer is [`rewrite`]'s.

mod rewrite;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use crate::prices::Tokens;

/// What the answer to a served request must carry.
#[derive(Debug, Clone)]
pub struct After {
    /// `context_management.applied_edits`, when the request had `context_management`.
    pub(super) applied: Option<Vec<Value>>,
    /// The `compaction` block that comes first.
    pub(super) block: Option<Value>,
    /// What the compaction's summary call spent (`None`: no model was asked, or its
    /// provider did not say).
    spent: Option<Tokens>,
    note: Option<&'static str>,
}

impl After {
    pub(super) fn new(managed: bool, note: Option<&'static str>) -> Self {
        After {
            applied: managed.then(Vec::new),
            block: None,
            spent: None,
            note,
        }
    }

    /// An edit that applied (`None`: it had nothing to do).
    pub(super) fn add(&mut self, edit: Option<Value>) {
        if let (Some(list), Some(edit)) = (&mut self.applied, edit) {
            list.push(edit);
        }
    }

    /// The compaction made: its block, and what its summary call spent.
    pub(super) fn compacted(&mut self, block: Value, spent: Option<Tokens>) {
        self.block = Some(block);
        self.spent = spent;
    }

    /// `note` for the client, unless one is there already.
    pub(super) fn noted(&mut self, note: &'static str) {
        self.note = self.note.or(Some(note));
    }

    /// What the client is told beside the answer.
    pub fn note(&self) -> Option<&'static str> {
        self.note
    }

    /// The relayed answer with what it must carry; an answer that is not a success, or
    /// has nothing to add, as it came.
    pub fn wrap(self, response: Response) -> Response {
        if response.status() != StatusCode::OK || (self.applied.is_none() && self.block.is_none()) {
            return response;
        }
        let stream = crate::relay::is_event_stream(response.headers());
        let (mut head, body) = response.into_parts();
        head.headers.remove(header::CONTENT_LENGTH);
        if self.block.is_some() {
            head.headers.insert(
                "x-abridge-compaction",
                HeaderValue::from_static("served by abridge"),
            );
        }
        Response::from_parts(head, rewrite::Rewrite::body(body, self, stream))
    }

    /// The answer when paused after the compaction: the block alone, whole or streamed.
    pub(super) fn paused(self, model: &str, stream: bool) -> Response {
        let id = format!("msg_abridge_{}", crate::store::now_ms());
        let usage = json!({"input_tokens": 0, "output_tokens": 0,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0});
        let message = json!({"id": id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage});
        let (body, kind) = match stream {
            false => {
                let mut whole = message;
                whole["stop_reason"] = "compaction".into();
                self.finish_message(&mut whole);
                (whole.to_string(), "application/json")
            }
            true => {
                let mut out = rewrite::event(
                    "message_start",
                    &json!({"type": "message_start", "message": message}),
                );
                out.push_str(&self.block_events());
                let mut delta = json!({"type": "message_delta",
                    "delta": {"stop_reason": "compaction", "stop_sequence": null},
                    "usage": {"output_tokens": 0}});
                self.finish_delta(&mut delta, (0, None));
                out.push_str(&rewrite::event("message_delta", &delta));
                out.push_str(&rewrite::event(
                    "message_stop",
                    &json!({"type": "message_stop"}),
                ));
                (out, "text/event-stream")
            }
        };
        crate::provider_apis::respond(Bytes::from(body), kind, self.note)
    }

    /// A whole message (`type: "message"`) given the block, the iterations and the
    /// applied edits.
    fn finish_message(&self, message: &mut Value) {
        if let Some(block) = &self.block
            && let Some(content) = message["content"].as_array_mut()
        {
            content.insert(0, block.clone());
            let usage = &mut message["usage"];
            let input = usage["input_tokens"].as_u64().unwrap_or(0);
            let iterations = iterations(self.spent.as_ref(), usage, input);
            usage["iterations"] = iterations;
        }
        if let Some(applied) = &self.applied {
            message["context_management"] = json!({"applied_edits": applied});
        }
    }

    /// A `message_delta` event given the iterations and the applied edits; `input`: the
    /// message's input tokens (its `message_start`'s), and the usage it reported there.
    fn finish_delta(&self, delta: &mut Value, (input, start): (u64, Option<&Value>)) {
        if self.block.is_some() {
            let mut usage = start.cloned().unwrap_or_else(|| json!({}));
            if let Some(fields) = delta["usage"].as_object() {
                for (k, v) in fields {
                    usage[k] = v.clone();
                }
            }
            delta["usage"]["iterations"] = iterations(self.spent.as_ref(), &usage, input);
        }
        if let Some(applied) = &self.applied {
            delta["context_management"] = json!({"applied_edits": applied});
        }
    }

    /// The block's three events, at index 0.
    fn block_events(&self) -> String {
        let Some(block) = &self.block else {
            return String::new();
        };
        let start = json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "compaction", "content": null}});
        let delta = json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "compaction_delta", "content": block["content"],
                "encrypted_content": block["encrypted_content"]}});
        let stop = json!({"type": "content_block_stop", "index": 0});
        [
            ("content_block_start", start),
            ("content_block_delta", delta),
            ("content_block_stop", stop),
        ]
        .iter()
        .map(|(name, data)| rewrite::event(name, data))
        .collect()
    }
}

/// `usage.iterations`: the compaction (its summary call's counts, `spent`; none when no
/// model was asked), then the message with `usage`'s counts (`input`: its input tokens).
fn iterations(spent: Option<&Tokens>, usage: &Value, input: u64) -> Value {
    let count = |k: &str| usage[k].as_u64().unwrap_or(0);
    let spent = spent.copied().unwrap_or_default();
    let uncached = spent.input.saturating_sub(spent.cached + spent.cache_write);
    json!([
        {"type": "compaction", "input_tokens": uncached, "output_tokens": spent.output,
            "cache_creation_input_tokens": spent.cache_write,
            "cache_read_input_tokens": spent.cached},
        {"type": "message", "input_tokens": input, "output_tokens": count("output_tokens"),
            "cache_creation_input_tokens": count("cache_creation_input_tokens"),
            "cache_read_input_tokens": count("cache_read_input_tokens")},
    ])
}

/// Anthropic's 400 for an invalid request (`message` as Anthropic words it).
pub(super) fn invalid(message: &str) -> Response {
    let body = json!({"type": "error",
        "error": {"type": "invalid_request_error", "message": message}});
    let mut response = (StatusCode::BAD_REQUEST, Bytes::from(body.to_string())).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
