//! The Responses shapes abridge answers a compaction with: the `compaction` item,
//! `POST /responses/compact`'s answer, and a `POST /responses` answer whose one output
//! item is the compaction — the JSON response object, or its stream of typed events
//! (`response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.output_item.done`, `response.completed`, numbered by `sequence_number`).
//! Nothing was asked of a model, so `usage` is zeros.

use bytes::Bytes;
use serde_json::{Value, json};

/// The answer's identity: its ids and when it was made.
pub(super) struct Made<'a> {
    /// The compaction item's id (`cmp_…`).
    pub id: &'a str,
    pub created_at: u64,
    pub model: &'a str,
}

/// The `compaction` output item.
pub(super) fn item(id: &str, encrypted_content: &str) -> Value {
    json!({"type": "compaction", "id": id, "encrypted_content": encrypted_content})
}

fn usage() -> Value {
    json!({
        "input_tokens": 0, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    })
}

/// `POST /responses/compact`'s answer: `output` is the kept user messages and the item.
pub(super) fn compacted(made: &Made<'_>, output: Vec<Value>) -> Value {
    json!({
        "id": made.id, "object": "response.compaction", "created_at": made.created_at,
        "output": output, "usage": usage(),
    })
}

/// The response object of a `POST /responses` answered with `output`.
pub(super) fn response(made: &Made<'_>, status: &str, output: Vec<Value>) -> Value {
    let id = format!("resp_{}", made.id.trim_start_matches("cmp_"));
    let usage = (status == "completed").then(usage);
    json!({
        "id": id, "object": "response", "created_at": made.created_at, "status": status,
        "background": false, "error": null, "incomplete_details": null,
        "model": made.model, "output": output, "parallel_tool_calls": true,
        "store": false, "tool_choice": "auto", "tools": [], "usage": usage,
    })
}

/// The same answer as the stream a client asked for with `stream: true`.
pub(super) fn stream(made: &Made<'_>, item: &Value) -> Bytes {
    let mut out = String::new();
    let started = response(made, "in_progress", Vec::new());
    let done = response(made, "completed", vec![item.clone()]);
    let events = [
        ("response.created", json!({"response": started})),
        ("response.in_progress", json!({"response": started})),
        (
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        ),
        (
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
        ),
        ("response.completed", json!({"response": done})),
    ];
    for (sequence, (kind, mut event)) in events.into_iter().enumerate() {
        if let Some(fields) = event.as_object_mut() {
            fields.insert("type".into(), kind.into());
            fields.insert("sequence_number".into(), sequence.into());
        }
        out.push_str(&format!("event: {kind}\ndata: {event}\n\n"));
    }
    Bytes::from(out)
}
