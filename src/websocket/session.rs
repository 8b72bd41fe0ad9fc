//! One relayed Responses WebSocket session, from both upgrades to both closes: frames go
//! both ways as they come; a client's `response.create` is staged through the
//! conversation stages ([`crate::proxy::frame`]) before it goes on, and each provider
//! terminal event records the request it ends (in order: the Responses WebSocket answers
//! one `response.create` at a time). Every other frame passes untouched.
//!
//! Bounds: a message (and a frame) at most `limits.max_body_bytes`, as a POST body; no
//! frame either way for `timeouts.stream_idle_ms` closes the session. When either side
//! closes or fails, the other is sent a close frame, and both closing handshakes get
//! [`CLOSE_GRACE`] to finish.

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::frames;
use crate::proxy::frame::{Context, Pending, stage};
use crate::relay::End;
use crate::state::AppState;

/// The most `response.create` frames a session holds unanswered: the provider answers one
/// at a time, so a client past this is not waiting for answers; the session is closed
/// (`1008`) rather than keep an account per frame without end.
pub const MAX_IN_FLIGHT: usize = 64;

/// How long the closing handshakes may take once the session is over.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

type Side = WebSocketStream<TokioIo<Upgraded>>;

/// What one frame did to the session.
enum Step {
    Go,
    /// Over: how the answers still in flight ended.
    Over(End),
    /// The client broke a bound: the session is closed with a policy close, and why.
    Refused(&'static str),
}

/// Relays the session until either side ends it (see the module docs).
pub async fn run(
    state: AppState,
    context: Context,
    (client, provider): (TokioIo<Upgraded>, TokioIo<Upgraded>),
) {
    let max = state.config().limits.max_body_bytes;
    let config = WebSocketConfig::default()
        .max_message_size(Some(max))
        .max_frame_size(Some(max));
    let mut client = WebSocketStream::from_raw_socket(client, Role::Server, Some(config)).await;
    let mut provider = WebSocketStream::from_raw_socket(provider, Role::Client, Some(config)).await;
    let mut pending = VecDeque::new();
    let idle = state.config().timeouts.stream_idle();
    let over = loop {
        let step = tokio::select! {
            message = client.next() => {
                from_client(&state, &context, message, &mut provider, &mut pending).await
            }
            message = provider.next() => {
                from_provider(&state, message, &mut client, &mut pending).await
            }
            () = tokio::time::sleep(idle) => {
                let frame = || close(CloseCode::Away, "idle: no frame within timeouts.stream_idle_ms");
                let _ = client.send(frame()).await;
                let _ = provider.send(frame()).await;
                Step::Over(End::IdleTimeout)
            }
        };
        match step {
            Step::Go => {}
            Step::Over(end) => break (end, None),
            Step::Refused(why) => break (End::ClientGone, Some(why)),
        }
    };
    let (over, refused) = over;
    for answer in pending.drain(..) {
        answer.done(&state, None, over);
    }
    // Each side is sent a close unless it was already (then this one is refused, and
    // nothing is lost): the client learns of a provider gone without one.
    let to_client = match refused {
        Some(why) => close(CloseCode::Policy, why),
        None => close(CloseCode::Error, "the provider's connection ended"),
    };
    let _ = client.send(to_client).await;
    let _ = provider.send(close(CloseCode::Away, "client gone")).await;
    let drained = tokio::time::timeout(CLOSE_GRACE, async {
        tokio::join!(drain(&mut client), drain(&mut provider))
    })
    .await;
    if drained.is_err() {
        tracing::debug!("a WebSocket close did not finish in time: dropped");
    }
}

/// A client frame: a `response.create` staged and sent on, anything else sent as is.
async fn from_client(
    state: &AppState,
    context: &Context,
    message: Option<Result<Message, WsError>>,
    provider: &mut Side,
    pending: &mut VecDeque<Pending>,
) -> Step {
    let message = match message {
        Some(Ok(Message::Close(frame))) => {
            let _ = provider.send(Message::Close(frame)).await;
            return Step::Over(End::ClientGone);
        }
        Some(Ok(message)) => message,
        Some(Err(e)) => {
            tracing::debug!(error = %e, "the client's WebSocket failed");
            let _ = provider.send(close(CloseCode::Away, "client gone")).await;
            return Step::Over(End::ClientGone);
        }
        None => {
            let _ = provider.send(close(CloseCode::Away, "client gone")).await;
            return Step::Over(End::ClientGone);
        }
    };
    let message = match message {
        Message::Text(text) => match frames::request(&text) {
            Some(_) if pending.len() >= MAX_IN_FLIGHT => {
                let _ = provider.send(close(CloseCode::Away, "client gone")).await;
                return Step::Refused("too many response.create frames unanswered");
            }
            Some(body) => {
                let staged = stage(state, context, body).await;
                pending.push_back(staged.pending);
                let rewritten = staged
                    .rewritten
                    .then(|| frames::reframe(&staged.body))
                    .flatten();
                Message::Text(rewritten.map_or(text, Into::into))
            }
            None => Message::Text(text),
        },
        other => other,
    };
    match provider.send(message).await {
        Ok(()) => Step::Go,
        Err(e) => {
            tracing::debug!(error = %e, "the provider's WebSocket failed");
            Step::Over(End::UpstreamError)
        }
    }
}

/// A provider frame: sent to the client as it is; a terminal event records the answer
/// it ends.
async fn from_provider(
    state: &AppState,
    message: Option<Result<Message, WsError>>,
    client: &mut Side,
    pending: &mut VecDeque<Pending>,
) -> Step {
    let message = match message {
        Some(Ok(Message::Close(frame))) => {
            let _ = client.send(Message::Close(frame)).await;
            return Step::Over(End::UpstreamError);
        }
        Some(Ok(message)) => message,
        Some(Err(_)) | None => {
            let _ = client
                .send(close(CloseCode::Error, "the provider's connection ended"))
                .await;
            return Step::Over(End::UpstreamError);
        }
    };
    let ended = match &message {
        Message::Text(text) => frames::terminal(text),
        _ => None,
    };
    if client.send(message).await.is_err() {
        return Step::Over(End::ClientGone);
    }
    if let Some((usage, end)) = ended
        && let Some(answer) = pending.pop_front()
    {
        answer.done(state, usage, end);
    }
    Step::Go
}

fn close(code: CloseCode, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// Reads a side until its close completes (or it fails): what lets the closing
/// handshake that tungstenite answers on its own go out.
async fn drain(side: &mut Side) {
    while let Some(Ok(_)) = side.next().await {}
}
