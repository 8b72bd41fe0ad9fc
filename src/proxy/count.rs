//! `POST /v1/messages/count_tokens`, routed only where abridge serves Anthropic's
//! compaction and context editing ([`crate::provider_apis::messages::serves`]): the
//! pass-through's stages with the body read whole (within `limits.max_body_bytes`) and
//! made into what `/v1/messages` would forward
//! ([`crate::provider_apis::messages::count`]), the served beta values withheld from
//! `anthropic-beta`; the upstream's count given `original_input_tokens` when the
//! request had `context_management` (its answer read whole within
//! [`count::MAX_ANSWER`]; any other answer relayed as it comes).

use std::time::Instant;

use axum::extract::{Request, State};
use axum::response::Response;
use bytes::BytesMut;
use http::{HeaderValue, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::error::{Error, Shape};
use crate::headers;
use crate::provider_apis::messages::{self, count};
use crate::relay::{self, Watch};
use crate::state::AppState;
use crate::stats::Route;

use super::{Exchange, passed, relay_bounds, send};

/// `POST /v1/messages/count_tokens` in serve mode: see the module docs.
pub async fn count_tokens(State(state): State<AppState>, request: Request) -> Response {
    let mut exchange = Exchange::start(&state);
    let response = stages(&state, request, &mut exchange)
        .await
        .unwrap_or_else(|e| e.response_in(Shape::Anthropic));
    exchange.finish(&state, Route::Passthrough, &response);
    response
}

async fn stages(
    state: &AppState,
    request: Request,
    exchange: &mut Exchange,
) -> Result<Response, Error> {
    let (mut parts, body) = request.into_parts();
    headers::strip_request(&mut parts.headers);
    messages::upstream_betas(state.config(), &mut parts.headers);
    let (target, _) = state
        .upstream()
        .route(&parts.method, &parts.uri, &parts.headers)?;
    let (body, held) = state.read_body(body, &parts.headers).await?;
    exchange.held = Some(held);
    let (body, scale) = match count::body(state, body).await {
        count::Count::Refused(response) => return Ok(response),
        count::Count::Send(body, scale) => (body, scale),
    };
    // The body is here whole; an answer to amend is read, so asked for uncompressed.
    parts.headers.remove(header::EXPECT);
    if scale.is_some() {
        parts.headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    let response = send(state, &parts, &target, body, exchange).await?;
    match scale {
        Some(scale) => amended(state, response, scale, exchange).await,
        None => Ok(relay::respond(
            response,
            Watch::Nothing,
            relay_bounds(state),
            passed(state, exchange),
        )),
    }
}

/// The upstream's count with `original_input_tokens` added: a 200, uncompressed, not an
/// event stream, read whole within [`count::MAX_ANSWER`] and `timeouts.stream_idle_ms`
/// a frame. Anything else goes on as it came (what was read of a longer answer first).
async fn amended(
    state: &AppState,
    response: http::Response<Incoming>,
    scale: count::Scale,
    exchange: &mut Exchange,
) -> Result<Response, Error> {
    let on_done = passed(state, exchange);
    let announced = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if response.status() != StatusCode::OK
        || relay::is_event_stream(response.headers())
        || response.headers().contains_key(header::CONTENT_ENCODING)
        || announced.is_some_and(|n| n > count::MAX_ANSWER)
    {
        return Ok(relay::respond(
            response,
            Watch::Nothing,
            relay_bounds(state),
            on_done,
        ));
    }
    let (head, mut body) = response.into_parts();
    let idle = state.config().timeouts.stream_idle();
    let mut read = BytesMut::new();
    let waiting = Instant::now();
    let whole = loop {
        match tokio::time::timeout(idle, body.frame()).await {
            Ok(None) => break true,
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                }
                if read.len() > count::MAX_ANSWER {
                    break false;
                }
            }
            // Nothing reached the client yet: an honest error rather than a cut answer.
            Ok(Some(Err(_))) | Err(_) => {
                return Err(Error::UpstreamUnreachable(
                    "the provider's answer could not be read".to_owned(),
                ));
            }
        }
    };
    exchange.upstream_wait += waiting.elapsed();
    let read = read.freeze();
    if !whole {
        let response = http::Response::from_parts(head, body);
        let bounds = relay_bounds(state);
        return Ok(relay::respond_after(
            response,
            read,
            Watch::Nothing,
            bounds,
            on_done,
        ));
    }
    let answer = count::amended(&read, scale).unwrap_or(read);
    Ok(relay::respond_buffered(head, answer, on_done))
}
