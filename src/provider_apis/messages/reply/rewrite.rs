//! The rewriting of a relayed Messages answer as it reaches the client: a whole JSON
//! message read (within a bound) and given what [`After`] carries; an event stream
//! rewritten event by event (the block's events after `message_start`, content block
//! indices shifted, `message_delta` completed), every other event's bytes as they came.
//! Past its bounds (an answer or an unfinished event too large) it passes the rest
//! untouched: abridge's machinery never fails an answer.

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use serde_json::Value;

use super::After;
use crate::provider_apis::rewriting::{Rewriter, Rewritten};
use crate::relay::events::{Event, next_event};

/// Bytes of a whole answer read to be rewritten; a larger one passes as it is.
const MAX_WHOLE: usize = 16 * 1024 * 1024;
/// Bytes of one unfinished event held.
const MAX_EVENT: usize = 4 * 1024 * 1024;

/// One event, as it is written.
pub(super) fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// The client's body: the upstream's, rewritten.
pub(super) struct Rewrite {
    after: After,
    stream: bool,
    held: BytesMut,
    /// Past a bound: the rest goes as it comes.
    passing: bool,
    /// The stream's `message_start` usage, for its iterations.
    start: Option<Value>,
}

impl Rewrite {
    /// The client's body: `inner` rewritten.
    pub(super) fn body(inner: Body, after: After, stream: bool) -> Body {
        let rewrite = Rewrite {
            after,
            stream,
            held: BytesMut::new(),
            passing: false,
            start: None,
        };
        Rewritten::body(inner, rewrite)
    }
}

impl Rewriter for Rewrite {
    fn feed(&mut self, data: Bytes) -> Bytes {
        if self.passing {
            return data;
        }
        self.held.extend_from_slice(&data);
        if !self.stream {
            if self.held.len() > MAX_WHOLE {
                self.passing = true;
                return self.held.split().freeze();
            }
            return Bytes::new();
        }
        let mut out = BytesMut::new();
        let mut at = 0;
        while let Some((n, event)) = next_event(&self.held[at..]) {
            match rewritten(&self.after, &mut self.start, &event) {
                Some(text) => out.extend_from_slice(text.as_bytes()),
                None => out.extend_from_slice(&self.held[at..at + n]),
            }
            at += n;
        }
        let _ = self.held.split_to(at);
        if self.held.len() > MAX_EVENT {
            self.passing = true;
            out.extend_from_slice(&self.held.split());
        }
        out.freeze()
    }

    /// What is left when the upstream's body ends.
    fn finish(&mut self) -> Bytes {
        let held = self.held.split().freeze();
        if self.stream || self.passing {
            return held;
        }
        match serde_json::from_slice::<Value>(&held) {
            Ok(mut message) if message["type"] == "message" => {
                self.after.finish_message(&mut message);
                Bytes::from(message.to_string())
            }
            _ => held,
        }
    }
}

/// An event rewritten (`None`: its bytes go as they came).
fn rewritten(after: &After, start: &mut Option<Value>, read: &Event<'_>) -> Option<String> {
    let mut data: Value = serde_json::from_str(&read.data()).ok()?;
    let kind = data["type"].as_str()?.to_owned();
    match kind.as_str() {
        "message_start" => {
            *start = Some(data["message"]["usage"].clone());
            after.block.as_ref()?;
            Some(event(&kind, &data) + &after.block_events())
        }
        "content_block_start" | "content_block_delta" | "content_block_stop" => {
            after.block.as_ref()?;
            let index = data["index"].as_u64()?;
            data["index"] = (index + 1).into();
            Some(event(&kind, &data))
        }
        "message_delta" => {
            let input = start
                .as_ref()
                .and_then(|s| s["input_tokens"].as_u64())
                .unwrap_or(0);
            after.finish_delta(&mut data, (input, start.as_ref()));
            Some(event(&kind, &data))
        }
        _ => None,
    }
}
