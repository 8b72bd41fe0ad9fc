//! The start of a provider's 200 event stream, read before anything reaches the client,
//! so that an overflow reported inside the stream is answered like a 400: compacted and
//! retried.
//!
//! What is held back is only what streams open with and what says nothing of the
//! answer: Responses' `response.created`, `response.in_progress` and `response.queued`,
//! Messages' `message_start` and `ping`, comments. The first other event ends the hold:
//! an error event that reports an overflow (`response.failed` with
//! `context_length_exceeded`, an `error` event, llama-server's `data: {"error": …}` or its
//! older non-standard `error:` field) makes the stream an overflow; anything else is
//! relayed at once, after what was held. A chat stream's first event is a chunk of the
//! answer, so a chat stream is held for one event at most.
//!
//! Bounded: at most [`MAX_HELD`] bytes and [`HOLD_FOR`] (never past the stream's idle
//! timeout); past either, what was read is relayed first and the stream goes on as it
//! comes. A stream that fails while held fails the request as unreachable (nothing was
//! relayed, so the client gets an honest error rather than a cut stream). A frame that
//! is not data (trailers, which SSE streams do not send) ends the hold and is dropped.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use memchr::memmem;
use serde_json::Value;

use crate::compactor::overflow::{self, Overflow};
use crate::error::Error;
use crate::relay::events::{Event, next_event};

/// Most bytes held back.
pub const MAX_HELD: usize = 64 * 1024;
/// Longest hold: an overflow is reported as the request is validated, before the model
/// runs, so well within this; a slow first token is not held for longer.
pub const HOLD_FOR: Duration = Duration::from_secs(2);

/// What was read of a stream's start.
pub struct Peeked {
    /// The provider's response, its body after `read`.
    pub response: http::Response<Incoming>,
    /// What was read, to be relayed first.
    pub read: Bytes,
    /// The overflow the stream reported, if it did.
    pub overflow: Option<Overflow>,
}

/// Reads the start of `response` (a 200 event stream) as the module docs say, waiting
/// at most `hold`.
pub async fn peek(response: http::Response<Incoming>, hold: Duration) -> Result<Peeked, Error> {
    let (head, mut body) = response.into_parts();
    let deadline = tokio::time::Instant::now() + hold.min(HOLD_FOR);
    let mut read = BytesMut::new();
    let mut scanned = 0;
    let mut overflow = None;
    while read.len() < MAX_HELD && overflow.is_none() {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) | Ok(None) => break,
            Ok(Some(Err(e))) => {
                tracing::warn!(error = %e, "the provider's stream failed before anything was relayed");
                return Err(Error::UpstreamUnreachable(
                    "the provider's stream failed before anything was relayed".to_owned(),
                ));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            break;
        };
        read.extend_from_slice(&data);
        match scan(&read[scanned..]) {
            Scanned::Held(n) => scanned += n,
            Scanned::Other => break,
            Scanned::Overflow(o) => overflow = Some(o),
        }
    }
    Ok(Peeked {
        response: http::Response::from_parts(head, body),
        read: read.freeze(),
        overflow,
    })
}

/// What the complete events of a stretch of stream say.
#[derive(Debug, PartialEq)]
enum Scanned {
    /// Only held events: this many bytes of them (an unfinished event after them).
    Held(usize),
    /// An event that is not held and not an overflow.
    Other,
    /// An overflow.
    Overflow(Overflow),
}

fn scan(bytes: &[u8]) -> Scanned {
    let mut at = 0;
    while let Some((len, event)) = next_event(&bytes[at..]) {
        at += len;
        match classify(&event) {
            Kind::Held => {}
            Kind::Other => return Scanned::Other,
            Kind::Overflow(o) => return Scanned::Overflow(o),
        }
    }
    Scanned::Held(at)
}

enum Kind {
    Held,
    Other,
    Overflow(Overflow),
}

/// Events a stream opens with that say nothing of the answer.
const HELD: &[&str] = &[
    "response.created",
    "response.in_progress",
    "response.queued",
    "message_start",
    "ping",
];

fn classify(event: &Event<'_>) -> Kind {
    if event.comment_only {
        return Kind::Held;
    }
    if let Some(error) = event.error {
        // `error: {"code":400,"message":…}`: the error object itself.
        let value = serde_json::from_str::<Value>(error).unwrap_or(Value::Null);
        return overflow_in(&serde_json::json!({ "error": value }));
    }
    let data = event.data();
    let named = event.name.filter(|n| !n.is_empty());
    let says_error = memmem::find(data.as_bytes(), b"error").is_some();
    if !says_error {
        return match named {
            Some(name) if HELD.contains(&name) => Kind::Held,
            None if data.is_empty() => Kind::Held,
            _ => Kind::Other,
        };
    }
    let Ok(value) = serde_json::from_str::<Value>(&data) else {
        return Kind::Other;
    };
    let kind = named.or_else(|| value["type"].as_str()).unwrap_or("");
    if HELD.contains(&kind) {
        return Kind::Held;
    }
    overflow_in(&value)
}

fn overflow_in(value: &Value) -> Kind {
    overflow::in_event(value).map_or(Kind::Other, Kind::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overflowed(stream: &str) -> bool {
        matches!(scan(stream.as_bytes()), Scanned::Overflow(_))
    }

    #[test]
    fn the_opening_events_are_held_and_the_answer_is_not() {
        let created = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"error\":null}}\n\n";
        let start = "event: message_start\r\ndata: {\"type\":\"message_start\"}\r\n\r\n: keep-alive\r\n\r\nevent: ping\r\ndata: {\"type\": \"ping\"}\r\n\r\n";
        assert_eq!(scan(created.as_bytes()), Scanned::Held(created.len()));
        assert_eq!(scan(start.as_bytes()), Scanned::Held(start.len()));
        // An unfinished event is not counted; a CR at the end may be half a CRLF.
        let partial = format!("{created}event: response.in_progress\r");
        assert_eq!(scan(partial.as_bytes()), Scanned::Held(created.len()));
        let text = "event: content_block_start\ndata: {\"type\":\"content_block_start\"}\n\n";
        assert_eq!(scan(format!("{start}{text}").as_bytes()), Scanned::Other);
        let chunk =
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
        assert_eq!(scan(chunk.as_bytes()), Scanned::Other);
        // An error that is not an overflow is not held either: it is the answer.
        let overloaded = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        assert_eq!(scan(overloaded.as_bytes()), Scanned::Other);
    }

    #[test]
    fn an_overflow_inside_a_stream_is_read_in_each_shape() {
        // Responses (what Codex reads): after the opening events.
        assert!(overflowed(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"status\":\"in_progress\",\"error\":null}}\n\nevent: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"Your input exceeds the context window of this model.\"}}}\n\n"
        ));
        // Responses' separate error event, with the error nested.
        assert!(overflowed(
            "event: error\ndata: {\"type\":\"error\",\"sequence_number\":2,\"error\":{\"type\":\"invalid_request_error\",\"code\":\"context_length_exceeded\",\"message\":\"\"}}\n\n"
        ));
        // Messages, after message_start and ping.
        assert!(overflowed(
            "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"prompt is too long: 9000 tokens > 8192 maximum\"}}\n\n"
        ));
        // LM Studio 0.4, and llama-server's `data: {"error": …}` and older `error:` field.
        assert!(overflowed(
            "event: error\ndata: {\"error\":{\"message\":\"Input does not fit in context length. The input has 9000 tokens, but the context length only supports 8192 tokens.\"}}\n\n"
        ));
        assert!(overflowed(
            "data: {\"error\":{\"code\":400,\"type\":\"exceed_context_size_error\",\"n_ctx\":8192,\"message\":\"request exceeds the available context size\"}}\n\n"
        ));
        assert!(overflowed(
            "error: {\"code\":400,\"message\":\"the request exceeds the available context size. try increasing the context size or enable context shift\",\"type\":\"invalid_request_error\"}\n\n"
        ));
    }
}
