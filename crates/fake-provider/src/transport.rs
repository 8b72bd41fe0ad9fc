//! How the fake's answers go out, whatever the wire format: a JSON body (gzipped when
//! told), or SSE events one write each, honouring the delay, split, stall, reset and gzip
//! knobs of [`Behavior`]. Also the framing of events: `data:`-only (chat completions) and
//! typed (`event: <type>` then `data:`, the Responses and Messages APIs). And the
//! request id header each API answers with.

use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use http::{HeaderMap, StatusCode, header};
use serde_json::Value;

use crate::{Behavior, Completion, Stall};

/// The request id, as each API names it: OpenAI's (and Azure's) `x-request-id: <id>`,
/// or Anthropic's `request-id` alone (`anthropic`, its value); none when the request
/// says `x-fake-request-id: none`.
pub(crate) fn name_request(
    headers: &mut HeaderMap,
    request: &HeaderMap,
    id: u64,
    anthropic: Option<String>,
) {
    if request
        .get("x-fake-request-id")
        .is_some_and(|v| v == "none")
    {
        return;
    }
    match anthropic {
        Some(theirs) => {
            if let Ok(v) = header::HeaderValue::from_str(&theirs) {
                headers.insert("request-id", v);
            }
        }
        None => {
            headers.insert("x-request-id", header::HeaderValue::from(id));
        }
    }
}

/// What the fake answers to one request, worked out before anything is sent: the same
/// body and behaviour always give the same chat answer, so the bench mode can keep it
/// (see `Shared::bench`).
pub(crate) enum Answer {
    /// A complete response: an error or a JSON body.
    Whole(StatusCode, Bytes),
    /// The SSE events of a streamed answer, each framed (chat's `[DONE]` included).
    Events(Vec<Bytes>),
}

/// The `usage` an answer reports to the client: a 200 body's, or a stream's last (its
/// Messages `message_start` usage updated by each `message_delta`'s); `None` for an
/// error or an answer without one.
pub(crate) fn usage_of(answer: &Answer) -> Option<Value> {
    let events = match answer {
        Answer::Whole(status, body) if status.is_success() => {
            let v: Value = serde_json::from_slice(body).ok()?;
            return v.get("usage").filter(|u| u.is_object()).cloned();
        }
        Answer::Whole(..) => return None,
        Answer::Events(events) => events,
    };
    let mut usage: Option<Value> = None;
    for event in events {
        let text = String::from_utf8_lossy(event);
        let data: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim_start)
            .collect::<Vec<_>>()
            .join("\n");
        let Ok(v) = serde_json::from_str::<Value>(&data) else {
            continue;
        };
        let found = [&v["message"]["usage"], &v["response"]["usage"], &v["usage"]]
            .into_iter()
            .find(|u| u.is_object());
        match (found, &mut usage) {
            (Some(delta), Some(Value::Object(total))) if v["type"] == "message_delta" => {
                for (k, n) in delta.as_object().into_iter().flatten() {
                    if !n.is_null() {
                        total.insert(k.clone(), n.clone());
                    }
                }
            }
            (Some(found), _) => usage = Some(found.clone()),
            (None, _) => {}
        }
    }
    usage
}

/// Sends an answer: a JSON body (gzipped when told), or its events one write each.
pub(crate) fn send(b: &Behavior, answer: &Answer, completion: Completion) -> Response {
    match answer {
        Answer::Whole(status, bytes) => {
            completion.complete();
            if b.gzip && status.is_success() {
                let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
                let compressed = std::io::Write::write_all(&mut gz, bytes)
                    .and_then(|()| gz.finish())
                    .unwrap_or_default();
                (
                    *status,
                    [
                        (header::CONTENT_TYPE, "application/json"),
                        (header::CONTENT_ENCODING, "gzip"),
                    ],
                    compressed,
                )
                    .into_response()
            } else {
                (
                    *status,
                    [(header::CONTENT_TYPE, "application/json")],
                    bytes.clone(),
                )
                    .into_response()
            }
        }
        Answer::Events(events) => stream(b, events.clone(), completion),
    }
}

/// A `data:`-only SSE event (chat completions); with `multiline` the JSON is spread over
/// two `data:` lines (cut after its first comma).
pub(crate) fn frame(payload: &str, multiline: bool) -> String {
    match (multiline, payload.find(',')) {
        (true, Some(i)) => format!("data: {}\ndata: {}\n\n", &payload[..=i], &payload[i + 1..]),
        _ => format!("data: {payload}\n\n"),
    }
}

/// Sends the events of a stream, one write each (two with `split_events`).
fn stream(b: &Behavior, events: Vec<Bytes>, completion: Completion) -> Response {
    let (tx, body) = channel_body();
    let b = b.clone();
    tokio::spawn(async move {
        let mut gz = b
            .gzip
            .then(|| GzEncoder::new(Vec::new(), Compression::fast()));
        for (i, event) in events.iter().enumerate() {
            if i > 0 && !b.chunk_delay.is_zero() {
                tokio::select! {
                    () = tx.closed() => return,
                    () = tokio::time::sleep(b.chunk_delay) => {}
                }
            }
            let pieces: Vec<Bytes> = if b.split_events {
                let half = event.len() / 2;
                vec![event.slice(..half), event.slice(half..)]
            } else {
                vec![event.clone()]
            };
            for piece in pieces {
                let bytes = match &mut gz {
                    None => piece,
                    Some(gz) => {
                        use std::io::Write;
                        if gz.write_all(&piece).and_then(|()| gz.flush()).is_err() {
                            return;
                        }
                        Bytes::from(std::mem::take(gz.get_mut()))
                    }
                };
                // An empty chunk would reset the stream (see `ChannelBody`).
                if !bytes.is_empty() && tx.send(bytes).await.is_err() {
                    return;
                }
                if b.split_events {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            if i == 0 && b.faults.reset {
                let _ = tx.send(Bytes::new()).await;
                return;
            }
            if (i == 0 && b.stall == Some(Stall::AfterFirstEvent))
                || (i + 2 == events.len() && b.stall == Some(Stall::BeforeLastEvent))
            {
                tx.closed().await;
                return;
            }
        }
        let rest = gz.and_then(|gz| gz.finish().ok()).filter(|r| !r.is_empty());
        if let Some(rest) = rest
            && tx.send(Bytes::from(rest)).await.is_err()
        {
            return;
        }
        completion.complete();
    });
    let mut response = (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response();
    if b.gzip {
        response.headers_mut().insert(
            header::CONTENT_ENCODING,
            header::HeaderValue::from_static("gzip"),
        );
    }
    response
}

/// A typed SSE event: `event: <kind>` then the `data:` line(s) of `payload`.
pub(crate) fn typed(kind: &str, payload: &str, multiline: bool) -> Bytes {
    Bytes::from(format!("event: {kind}\n{}", frame(payload, multiline)))
}

/// An event's JSON as the providers write it: `"type"` first, then `"sequence_number"`
/// when given, then the members of `rest` (an object without those two).
pub(crate) fn event_json(kind: &str, sequence: Option<u64>, rest: &Value) -> String {
    let mut out = format!("{{\"type\":{}", Value::from(kind));
    if let Some(n) = sequence {
        out.push_str(&format!(",\"sequence_number\":{n}"));
    }
    let members = serde_json::to_string(rest).unwrap_or_default();
    match members.strip_prefix('{') {
        Some(inner) if inner != "}" => {
            out.push(',');
            out.push_str(inner);
        }
        _ => out.push('}'),
    }
    out
}

/// A response body fed by a channel, so the producer learns when the client is gone.
/// An empty chunk is the producer's way to fail the body (the connection is reset, as a
/// provider that crashed mid-stream would).
struct ChannelBody {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.rx.poll_recv(cx).map(|o| {
            o.map(|b| {
                if b.is_empty() {
                    Err(std::io::Error::other("the fake provider reset the stream"))
                } else {
                    Ok(http_body::Frame::data(b))
                }
            })
        })
    }
}

fn channel_body() -> (tokio::sync::mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    (tx, Body::new(ChannelBody { rx }))
}
