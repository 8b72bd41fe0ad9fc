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
//!
//! Shutdown: when the listener drains ([`Drain`]), a session with no answer in flight is
//! closed at once, both sides sent `1001` (going away); one with an answer in flight is
//! closed so once the answer's terminal event has been relayed, or when the shutdown
//! grace is all but over ([`in_flight_grace`]), whichever comes first. Frames go both
//! ways as usual meanwhile, but for a new `response.create`, which is not sent on. The server waits for the session (it holds its [`Drain`])
//! no longer than the grace.

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::frames;
use crate::proxy::frame::{Context, Pending, stage};
use crate::relay::End;
use crate::serve::Drain;
use crate::state::AppState;

/// The most `response.create` frames a session holds unanswered: the provider answers one
/// at a time, so a client past this is not waiting for answers; the session is closed
/// (`1008`) rather than keep an account per frame without end.
pub const MAX_IN_FLIGHT: usize = 64;

/// How long the closing handshakes may take once the session is over.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

type Side = WebSocketStream<TokioIo<Upgraded>>;

/// The reason of the close frames a shutdown sends.
const SHUTTING_DOWN: &str = "abridge is shutting down";

/// What one frame did to the session.
enum Step {
    Go,
    /// Over: how the answers still in flight ended.
    Over(End),
    /// abridge ends the session: how the answers still in flight ended, and the client's
    /// close (a policy close when it broke a bound, going away at shutdown).
    Closed(End, CloseCode, &'static str),
}

/// Relays the session until either side ends it, or the `listener` drains (see
/// the module docs).
pub async fn run(
    state: AppState,
    context: Context,
    (client, provider): (TokioIo<Upgraded>, TokioIo<Upgraded>),
    mut listener: Option<Drain>,
) {
    let max = state.config().limits.max_body_bytes;
    let config = WebSocketConfig::default()
        .max_message_size(Some(max))
        .max_frame_size(Some(max));
    let mut client = WebSocketStream::from_raw_socket(client, Role::Server, Some(config)).await;
    let mut provider = WebSocketStream::from_raw_socket(provider, Role::Client, Some(config)).await;
    let mut pending = VecDeque::new();
    let idle = state.config().timeouts.stream_idle();
    // Set once the drain began: when an answer still in flight is cut.
    let mut cut: Option<Instant> = None;
    let (over, to_client) = loop {
        let step = tokio::select! {
            message = client.next() => {
                let session = (&mut provider, &mut pending, cut.is_some());
                from_client(&state, &context, message, session).await
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
            () = stopped(&mut listener), if cut.is_none() => {
                let grace = in_flight_grace(state.config().timeouts.shutdown_grace());
                cut = Some(Instant::now() + grace);
                Step::Go
            }
            () = tokio::time::sleep_until(cut.unwrap_or_else(Instant::now)), if cut.is_some() => {
                Step::Closed(End::ClientGone, CloseCode::Away, SHUTTING_DOWN)
            }
        };
        match step {
            // Draining, and nothing in flight (any more): the session ends here.
            Step::Go if cut.is_some() && pending.is_empty() => {
                break (End::Complete, close(CloseCode::Away, SHUTTING_DOWN));
            }
            Step::Go => {}
            Step::Over(end) => break (end, close(CloseCode::Error, PROVIDER_GONE)),
            Step::Closed(end, code, why) => break (end, close(code, why)),
        }
    };
    for answer in pending.drain(..) {
        answer.done(&state, None, over);
    }
    // Each side is sent a close unless it was already (then this one is refused, and
    // nothing is lost): the client learns of a provider gone without one.
    let _ = client.send(to_client).await;
    let why = if cut.is_some() {
        SHUTTING_DOWN
    } else {
        "client gone"
    };
    let _ = provider.send(close(CloseCode::Away, why)).await;
    let drained = tokio::time::timeout(CLOSE_GRACE, async {
        tokio::join!(drain(client), drain(provider))
    })
    .await;
    if drained.is_err() {
        tracing::debug!("a WebSocket close did not finish in time: dropped");
    }
}

/// A client frame: a `response.create` staged and sent on — not once the listener
/// drains (`draining`): no new answer is begun then, as no new request is accepted; the
/// session closes going away when the answer in flight has ended, and the client asks
/// again elsewhere — anything else sent as is.
async fn from_client(
    state: &AppState,
    context: &Context,
    message: Option<Result<Message, WsError>>,
    (provider, pending, draining): (&mut Side, &mut VecDeque<Pending>, bool),
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
            Some(_) if draining => {
                tracing::debug!("a response.create after the drain began: not sent on");
                return Step::Go;
            }
            Some(_) if pending.len() >= MAX_IN_FLIGHT => {
                let _ = provider.send(close(CloseCode::Away, "client gone")).await;
                let why = "too many response.create frames unanswered";
                return Step::Closed(End::ClientGone, CloseCode::Policy, why);
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
            let _ = client.send(close(CloseCode::Error, PROVIDER_GONE)).await;
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

/// The reason of the close a client is sent when the provider's side ended.
const PROVIDER_GONE: &str = "the provider's connection ended";

/// Resolves once `drain` began (never without one).
async fn stopped(drain: &mut Option<Drain>) {
    match drain {
        Some(drain) => drain.stopped().await,
        None => std::future::pending().await,
    }
}

/// Of the shutdown grace, what an answer in flight gets: all but a tenth of it (at most
/// a second), left for the close frames to go out before the server stops waiting.
fn in_flight_grace(grace: Duration) -> Duration {
    grace.saturating_sub((grace / 10).min(Duration::from_secs(1)))
}

fn close(code: CloseCode, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// Reads a side until its close completes (or it fails): what lets the closing
/// handshake that tungstenite answers on its own go out. The side's connection ends
/// then, whatever the other's does.
async fn drain(mut side: Side) {
    while let Some(Ok(_)) = side.next().await {}
}
