//! The Responses API over WebSocket, as OpenAI serves it, when
//! [`Behavior::responses_websocket`](crate::Behavior) is on (off: a server without it,
//! whose `GET …/responses` is whatever the other routes make of it).
//!
//! `GET …/responses` with `Upgrade: websocket` is accepted (`101`); each
//! `response.create` text frame (a Responses request and its `type`) is answered with the
//! events its SSE stream would carry, one JSON object per text frame, after the
//! behaviour's latency and with its pause between events. A frame whose
//! `previous_response_id` names the connection's last response continues it: that
//! response's input and output go before the frame's input, as OpenAI's
//! connection-local cache does; an id the connection does not know is an `error` event
//! (`previous_response_not_found`). Errors are `{"type": "error", "status": …, "error":
//! {…}}`. The handshake is recorded as a request with an empty body, and every
//! `response.create` as one with the frame as its body (method `GET`, the handshake's
//! URI and headers). Other frames are ignored.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::transport::Answer;
use crate::{Completion, Recorded, Shared, lock};

/// Whether `request` is a Responses WebSocket handshake.
pub(crate) fn asked(request: &Request) -> bool {
    let upgrade = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    upgrade && request.uri().path().ends_with("/responses")
}

/// The handshake, recorded (an empty body): refused as any request is by the key list
/// ([`crate::faults`]), else accepted and the connection behind it served.
pub(crate) fn handshake(shared: Arc<Shared>, mut request: Request) -> Response {
    shared.record(Recorded {
        method: request.method().clone(),
        uri: request.uri().clone(),
        headers: request.headers().clone(),
        body: Bytes::new(),
    });
    let behavior = lock(&shared.behavior).for_request(request.headers());
    let path = request.uri().path().to_owned();
    if let Some(refusal) = crate::faults::respond(
        &behavior.faults,
        request.headers(),
        &path,
        &Bytes::new(),
        "req_websocket",
    ) {
        return refusal;
    }
    let Some(key) = request.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        let mut response = Response::new(Body::from("missing Sec-WebSocket-Key"));
        *response.status_mut() = StatusCode::BAD_REQUEST;
        return response;
    };
    let upgrade = hyper::upgrade::on(&mut request);
    let (parts, _) = request.into_parts();
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let socket =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        serve(shared, parts, socket).await;
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert("x-models-etag", HeaderValue::from_static("fake-etag"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    response
}

/// The connection's last response: its id, and its input and output items.
type Last = Option<(String, Vec<Value>)>;

async fn serve<S>(shared: Arc<Shared>, parts: http::request::Parts, mut socket: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut last: Last = None;
    while let Some(Ok(message)) = socket.next().await {
        let Message::Text(text) = message else {
            continue;
        };
        let Ok(Value::Object(mut frame)) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        if frame.get("type").and_then(Value::as_str) != Some("response.create") {
            continue;
        }
        shared.record(Recorded {
            method: http::Method::GET,
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
            body: Bytes::from(text.as_bytes().to_vec()),
        });
        let behavior = lock(&shared.behavior).for_request(&parts.headers);
        frame.remove("type");
        frame.insert("stream".to_owned(), Value::Bool(true));
        let completion = Completion::new(&shared);
        let events = match continued(frame, &last) {
            Ok(request) => {
                let body = Bytes::from(serde_json::to_vec(&request).unwrap_or_default());
                let answer = crate::responses::answer(&behavior, &shared.auto_cache, &body);
                shared.reported(parts.uri.path(), &body, &answer);
                let events = payloads(&answer);
                last = remembered(&request, &events).or(last);
                events
            }
            Err(error) => vec![error],
        };
        if !behavior.latency.is_zero() {
            tokio::time::sleep(behavior.latency).await;
        }
        for (i, event) in events.into_iter().enumerate() {
            if i > 0 && !behavior.chunk_delay.is_zero() {
                tokio::time::sleep(behavior.chunk_delay).await;
            }
            if socket.send(Message::Text(event.into())).await.is_err() {
                return;
            }
        }
        completion.complete();
    }
}

/// The request a frame stands for: with `previous_response_id`, the connection's last
/// response's items before its own input.
fn continued(mut frame: serde_json::Map<String, Value>, last: &Last) -> Result<Value, String> {
    let Some(previous) = frame.remove("previous_response_id") else {
        return Ok(Value::Object(frame));
    };
    let Some(previous) = previous.as_str() else {
        return Ok(Value::Object(frame));
    };
    let Some((_, items)) = last.as_ref().filter(|(id, _)| id == previous) else {
        return Err(json!({"type": "error", "status": 400, "error": {
            "type": "invalid_request_error", "code": "previous_response_not_found",
            "message": format!("Previous response with id '{previous}' not found."),
            "param": "previous_response_id",
        }})
        .to_string());
    };
    let mut input = items.clone();
    match frame.remove("input") {
        Some(Value::Array(more)) => input.extend(more),
        Some(Value::String(text)) => input.push(json!({"role": "user", "content": text})),
        _ => {}
    }
    frame.insert("input".to_owned(), Value::Array(input));
    Ok(Value::Object(frame))
}

/// The JSON of each event of `answer`, or an `error` event for an error answer.
fn payloads(answer: &Answer) -> Vec<String> {
    match answer {
        Answer::Events(events) => events
            .iter()
            .map(|event| {
                String::from_utf8_lossy(event)
                    .lines()
                    .filter_map(|line| line.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect(),
        Answer::Whole(status, body) => {
            let error = serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|v| v.get("error").cloned())
                .unwrap_or(Value::Null);
            vec![json!({"type": "error", "status": status.as_u16(), "error": error}).to_string()]
        }
    }
}

/// What a later frame may continue: the completed response's id, and the request's input
/// with the response's output after it.
fn remembered(request: &Value, events: &[String]) -> Last {
    let done = events.iter().rev().find_map(|e| {
        let event: Value = serde_json::from_str(e).ok()?;
        (event["type"] == "response.completed").then_some(event)
    })?;
    let id = done["response"]["id"].as_str()?.to_owned();
    let mut items = match &request["input"] {
        Value::Array(items) => items.clone(),
        Value::String(text) => vec![json!({"role": "user", "content": text})],
        _ => Vec::new(),
    };
    if let Value::Array(output) = &done["response"]["output"] {
        items.extend(output.iter().cloned());
    }
    Some((id, items))
}
