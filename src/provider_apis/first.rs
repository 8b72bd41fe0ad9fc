//! The answer to a request abridge compacted for the client (Responses
//! `context_management`, see [`super::context`]): the provider's answer with abridge's
//! `compaction` item first, as OpenAI answers one. Whole: prepended to `output`.
//! Streamed: `response.output_item.added` and `response.output_item.done` for the item
//! at `output_index` 0 before the provider's first output event, the provider's
//! `output_index`es one later, `sequence_number`s counted afresh, and the final response
//! object (`response.completed`, `.incomplete`, `.failed`) with the item first in its
//! `output`. An error answer passes as it is (the client compacts again on its retry);
//! an event stream abridge cannot read (an event over the relay's bound) passes on
//! untouched from there.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, header};
use http_body_util::{BodyExt, Limited};
use serde_json::{Value, json};

use super::rewriting::{Rewriter, Rewritten};
use crate::error::Error;
use crate::relay::events::next_event;
use crate::relay::sse::MAX_EVENT_BYTES;

/// Largest whole answer read to put the item in.
const MAX_WHOLE: usize = 64 * 1024 * 1024;

/// The events before which nothing is output yet.
const OPENING: &[&str] = &[
    "response.created",
    "response.in_progress",
    "response.queued",
];
/// The events that carry the final response object.
const FINAL: &[&str] = &[
    "response.completed",
    "response.incomplete",
    "response.failed",
];

/// The `compaction` item to put first in an answer.
#[derive(Debug, Clone)]
pub struct First {
    item: Value,
}

impl First {
    pub(super) fn new(item: Value) -> Self {
        Self { item }
    }

    /// The item the answer carries first.
    pub fn item(&self) -> &Value {
        &self.item
    }

    /// `response` with the item first (see the module docs).
    pub async fn onto(self, response: Response) -> Response {
        if !response.status().is_success() {
            return response;
        }
        let streamed = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let (mut parts, body) = response.into_parts();
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.insert(
            "x-abridge-compaction",
            HeaderValue::from_static("served by abridge"),
        );
        if streamed {
            let events = Events {
                held: BytesMut::new(),
                item: self.item,
                inserted: false,
                sequence: 0,
                untouched: false,
            };
            return Response::from_parts(parts, Rewritten::body(body, events));
        }
        match Limited::new(body, MAX_WHOLE).collect().await {
            Ok(collected) => {
                let bytes = collected.to_bytes();
                let body = whole(&bytes, &self.item).unwrap_or(bytes);
                Response::from_parts(parts, Body::from(body))
            }
            Err(e) => Error::UpstreamUnreachable(format!("reading the provider's answer: {e}"))
                .into_response(),
        }
    }
}

/// A whole response object with `item` first in its `output` (`None`: not one).
fn whole(bytes: &[u8], item: &Value) -> Option<Bytes> {
    let mut response: Value = serde_json::from_slice(bytes).ok()?;
    response
        .get_mut("output")?
        .as_array_mut()?
        .insert(0, item.clone());
    serde_json::to_vec(&response).ok().map(Bytes::from)
}

/// The provider's event stream with the item's events put in (see the module docs).
struct Events {
    /// An event not yet complete.
    held: BytesMut,
    item: Value,
    inserted: bool,
    sequence: u64,
    /// Passing bytes on as they come (an event over the bound was met).
    untouched: bool,
}

impl Rewriter for Events {
    fn finish(&mut self) -> Bytes {
        self.held.split().freeze()
    }

    fn feed(&mut self, data: Bytes) -> Bytes {
        if self.untouched {
            return data;
        }
        self.held.extend_from_slice(&data);
        let mut out = Vec::new();
        while let Some((taken, event)) = next_event(&self.held) {
            let name = event.name.map(str::to_owned);
            let parsed = serde_json::from_str::<Value>(&event.data()).ok();
            let raw = self.held.split_to(taken);
            match parsed.filter(|v| v["type"].is_string()) {
                Some(data) => self.rewrite(name.as_deref(), data, &mut out),
                None => out.extend_from_slice(&raw),
            }
        }
        if self.held.len() > MAX_EVENT_BYTES {
            self.untouched = true;
            out.extend_from_slice(&self.held.split());
        }
        Bytes::from(out)
    }
}

impl Events {
    /// One event of the provider's, with the item's before it when it is the first
    /// output event.
    fn rewrite(&mut self, name: Option<&str>, mut data: Value, out: &mut Vec<u8>) {
        let kind = data["type"].as_str().unwrap_or_default().to_owned();
        if !self.inserted && !OPENING.contains(&kind.as_str()) && kind != "error" {
            self.inserted = true;
            for ours in ["response.output_item.added", "response.output_item.done"] {
                let event = json!({"type": ours, "sequence_number": self.sequence,
                    "output_index": 0, "item": self.item});
                self.sequence += 1;
                write(out, Some(ours), &event);
            }
        }
        if let Some(index) = data.get_mut("output_index")
            && let Some(n) = index.as_u64().filter(|_| self.inserted)
        {
            *index = (n + 1).into();
        }
        if FINAL.contains(&kind.as_str())
            && let Some(output) = data["response"]
                .get_mut("output")
                .and_then(Value::as_array_mut)
        {
            output.insert(0, self.item.clone());
        }
        if let Some(sequence) = data.get_mut("sequence_number") {
            *sequence = self.sequence.into();
        }
        self.sequence += 1;
        write(out, name, &data);
    }
}

fn write(out: &mut Vec<u8>, name: Option<&str>, data: &Value) {
    if let Some(name) = name {
        out.extend_from_slice(format!("event: {name}\n").as_bytes());
    }
    out.extend_from_slice(format!("data: {data}\n\n").as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item() -> Value {
        json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "abridge.v1.x"})
    }

    #[test]
    fn a_whole_answer_gets_the_item_first() {
        let answer = br#"{"id":"resp_1","output":[{"type":"message","role":"assistant"}]}"#;
        let out: Value = serde_json::from_slice(&whole(answer, &item()).unwrap()).unwrap();
        assert_eq!(out["output"][0], item());
        assert_eq!(out["output"][1]["type"], "message");
    }

    #[test]
    fn a_stream_gets_the_items_events_and_shifted_indexes_across_chunks() {
        let mut events = Events {
            held: BytesMut::new(),
            item: item(),
            inserted: false,
            sequence: 0,
            untouched: false,
        };
        let stream = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"output\":[]}}\n\n",
            "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":1,\"output_index\":0,\"item\":{}}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"output\":[{\"type\":\"message\"}]}}\n\n",
            "data: [DONE]\n\n",
        );
        let (a, b) = stream.split_at(100);
        let mut out = events.feed(Bytes::copy_from_slice(a.as_bytes())).to_vec();
        out.extend_from_slice(&events.feed(Bytes::copy_from_slice(b.as_bytes())));
        let text = String::from_utf8(out).unwrap();
        let data: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect();
        let kinds: Vec<&str> = data.iter().map(|d| d["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.output_item.added",
                "response.output_item.done",
                "response.output_item.added",
                "response.completed"
            ]
        );
        let sequence: Vec<u64> = data
            .iter()
            .map(|d| d["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(sequence, [0, 1, 2, 3, 4]);
        assert_eq!(data[1]["item"], item());
        assert_eq!(data[3]["output_index"], 1);
        assert_eq!(data[4]["response"]["output"][0], item());
        assert!(text.ends_with("data: [DONE]\n\n"));
    }
}
