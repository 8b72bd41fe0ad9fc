//! Relay: the provider's response to the client, byte for byte as it arrives, with the
//! usage tee on the side.
//!
//! [`respond`] turns the upstream response into the client's: hop-by-hop and
//! `x-abridge-*` headers removed, the body wrapped in [`RelayBody`], which forwards
//! what arrives as soon as the upstream has nothing more ready (frames that arrived
//! together go in one write: [`burst`]), cuts the stream after
//! `timeouts.stream_idle_ms` of silence (and, when set, after `timeouts.max_stream_ms`
//! in all), and feeds a [`Tap`] that reads `usage`:
//! - JSON bodies: the chunks are kept as cheap `Bytes` clones and parsed once at the end;
//! - SSE bodies: [`sse::SseTap`] scans events as they pass (and strips what abridge added).
//!
//! What a tap buffers (a JSON body up to 16 MB, an unfinished event up to 4 MB) counts
//! against `limits.max_inflight_body_bytes` with the request bodies; when the process
//! holds too much, the tap stops buffering and that response's usage is not read — the
//! response itself is never failed for it.
//!
//! Compressed responses: abridge asks for `Accept-Encoding: identity` on the routes it
//! reads, and if a provider compresses anyway (gzip or deflate) the relay decodes the
//! stream for the client and drops `Content-Encoding`, so usage is still read and the
//! client gets what its HTTP library would have decoded. Decoding is bounded per
//! response and across the process ([`decode`]): a chunk at a time, at most
//! `limits.max_decoded_bytes` a response (beyond: cut as an upstream error) and
//! `limits.max_inflight_decoded_bytes` in flight in all. Other encodings pass untouched
//! and their usage is not read (counted as `usage_unreadable`).
//!
//! When the body ends, errors or is dropped (client gone) the `on_done` callback gets
//! the [`Outcome`] once — the "record" stage of the request path.

mod burst;
pub mod decode;
pub mod events;
pub mod sse;
mod tap;
pub mod usage;

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, header};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::headers;
use crate::ingress::BodyBudget;
use burst::Burst;
use decode::{DecodeBudget, Decoding};
use tap::Tap;
pub use usage::Usage;

/// What the relay should look for in a successful response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// Nothing: a plain pass-through route.
    Nothing,
    /// A conversation route: read usage (wherever the format puts it, see
    /// [`usage::Envelope`]); `strip` when abridge asked for it on the client's behalf and
    /// must remove it again.
    Usage { strip: bool },
}

impl Watch {
    /// Whether the relay removes usage abridge asked for.
    pub fn strips(self) -> bool {
        self == Watch::Usage { strip: true }
    }
}

/// How a relayed response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub usage: Option<Usage>,
    pub end: End,
    /// The response carried usage abridge could not read (unknown content encoding).
    pub usage_unreadable: bool,
    /// Events removed in strip mode.
    pub stripped_events: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The provider finished the body and the client received all of it.
    Complete,
    /// The client went away first; the upstream connection was dropped with it.
    ClientGone,
    /// The provider's body failed (reset, bad encoding).
    UpstreamError,
    /// No byte for `timeouts.stream_idle_ms`.
    IdleTimeout,
}

pub type OnDone = Box<dyn FnOnce(Outcome) + Send>;

/// The relay's bounds: `timeouts.stream_idle_ms`, `timeouts.max_stream_ms`,
/// `limits.max_decoded_bytes`, the process's budget for what the taps buffer
/// (`limits.max_inflight_body_bytes`, shared with the request bodies) and for decoded
/// chunks in flight (`limits.max_inflight_decoded_bytes`).
#[derive(Debug, Clone)]
pub struct Bounds {
    pub idle: Duration,
    pub max_stream: Option<Duration>,
    pub max_decoded: usize,
    pub budget: BodyBudget,
    pub decoded: DecodeBudget,
}

/// Builds the client's response from the provider's.
pub fn respond(
    upstream: http::Response<Incoming>,
    watch: Watch,
    bounds: Bounds,
    on_done: OnDone,
) -> Response {
    respond_after(upstream, Bytes::new(), watch, bounds, on_done)
}

/// [`respond`] for a provider's response whose first bytes, `read`, were already read
/// from its body (identity-encoded): they go to the client first, through the tap.
pub fn respond_after(
    upstream: http::Response<Incoming>,
    read: Bytes,
    watch: Watch,
    bounds: Bounds,
    on_done: OnDone,
) -> Response {
    let (mut parts, body) = upstream.into_parts();
    headers::strip_response(&mut parts.headers);

    let mut tap = Tap::None;
    let mut decoder = None;
    let mut usage_unreadable = false;
    if let Watch::Usage { strip } = watch
        && parts.status.is_success()
    {
        match Decoding::for_encoding(&parts.headers, bounds.max_decoded, bounds.decoded.clone()) {
            Ok(d) => {
                decoder = d;
                tap = Tap::for_content_type(&parts.headers, strip);
            }
            Err(encoding) => {
                tracing::warn!(%encoding, "response encoding abridge cannot decode; usage not read");
                usage_unreadable = true;
            }
        }
    }
    if decoder.is_some() {
        parts.headers.remove(header::CONTENT_ENCODING);
    }
    if decoder.is_some() || tap.rewrites() {
        parts.headers.remove(header::CONTENT_LENGTH);
    }

    if let Some(tap) = tap.buffering() {
        tap.budget = Some(bounds.budget.clone());
    }
    let mut relay = RelayBody {
        inner: body,
        idle: bounds.idle,
        lifetime: bounds
            .max_stream
            .map(|d| (d, Box::pin(tokio::time::sleep(d)))),
        last_data: Instant::now(),
        timer: None,
        decoder,
        tap,
        ended: false,
        usage_unreadable,
        on_done: Some(on_done),
        span: tracing::Span::current(),
        burst: Burst::default(),
        then: None,
        flush_first: false,
    };
    if !read.is_empty() {
        // Already read whole (the peek saw the end): `on_data` finishes the relay.
        match relay.on_data(read) {
            Ok(out) => relay.burst.push(out),
            Err(e) => relay.then = Some(Err(e)),
        }
    }
    // A response without a body (HEAD, 204, 304) may never be polled: it is complete now.
    if !relay.ended && relay.inner.is_end_stream() && !relay.decoding() {
        let _ = relay.finish();
    }
    Response::from_parts(parts, Body::new(relay))
}

/// The client's response for a provider answer already read whole (a small error body
/// abridge inspected): the same status, headers (hop-by-hop and `x-abridge-*` removed)
/// and bytes.
pub fn respond_buffered(mut head: http::response::Parts, body: Bytes, on_done: OnDone) -> Response {
    headers::strip_response(&mut head.headers);
    head.headers
        .insert(header::CONTENT_LENGTH, http::HeaderValue::from(body.len()));
    on_done(Outcome {
        usage: None,
        end: End::Complete,
        usage_unreadable: false,
        stripped_events: 0,
    });
    Response::from_parts(head, Body::from(body))
}

/// The client's response for a provider's whole answer abridge read (and may have
/// rewritten: the recall rounds' last answer), with the usage to record for it; `held`
/// (its share of the body budget) is given back when the body is dropped.
pub fn respond_whole(
    mut head: http::response::Parts,
    (body, held): (Bytes, crate::ingress::Held),
    usage: Option<Usage>,
    on_done: OnDone,
) -> Response {
    headers::strip_response(&mut head.headers);
    head.headers.remove(header::CONTENT_ENCODING);
    head.headers
        .insert(header::CONTENT_LENGTH, http::HeaderValue::from(body.len()));
    on_done(Outcome {
        usage,
        end: End::Complete,
        usage_unreadable: false,
        stripped_events: 0,
    });
    let body =
        http_body_util::BodyExt::map_err(http_body_util::Full::new(body), |never| match never {});
    Response::from_parts(head, Body::new(Holding { body, held }))
}

/// A body and the share of the budget its bytes hold, given back with it.
struct Holding<B> {
    body: B,
    #[allow(dead_code, reason = "held for its Drop")]
    held: crate::ingress::Held,
}

impl<B: HttpBody + Unpin> HttpBody for Holding<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Whether a response is a server-sent-events stream.
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// The body sent to the client. See the module docs.
pub struct RelayBody {
    inner: Incoming,
    idle: Duration,
    /// `timeouts.max_stream_ms` and its deadline, when set.
    lifetime: Option<(Duration, Pin<Box<Sleep>>)>,
    /// When the upstream last sent a frame. The idle timer is not reset per frame (a
    /// timer-wheel update for every SSE event); when it fires it checks this and, if
    /// something came meanwhile, sleeps again until `last_data + idle`.
    last_data: Instant,
    /// Created the first time the upstream keeps the relay waiting.
    timer: Option<Pin<Box<Sleep>>>,
    decoder: Option<Decoding>,
    tap: Tap,
    ended: bool,
    usage_unreadable: bool,
    on_done: Option<OnDone>,
    /// The request's log span (the one current when the relay was built), entered only
    /// to report the end: entering it on every poll cost the streams ~1,700
    /// instructions per event in the subscriber.
    span: tracing::Span,
    /// What goes to the client next, gathered from frames that arrived together.
    burst: Burst,
    /// What comes after the burst: trailers, or the error that ended the body.
    then: Option<Result<Frame<Bytes>, RelayError>>,
    /// The burst before `then`'s error went out: one pending poll first, so hyper
    /// flushes it (a body error closes the connection without a flush).
    flush_first: bool,
}

/// What [`RelayBody::poll_frame`] answers.
type Polled = Poll<Option<Result<Frame<Bytes>, RelayError>>>;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("upstream body failed: {0}")]
    Upstream(#[from] hyper::Error),
    #[error("upstream response could not be decoded: {0}")]
    Decode(#[from] std::io::Error),
    #[error("upstream sent nothing for {0:?} (timeouts.stream_idle_ms)")]
    Idle(Duration),
    #[error("upstream stream lasted longer than {0:?} (timeouts.max_stream_ms)")]
    TooLong(Duration),
}

impl RelayBody {
    fn report(&mut self, end: End, usage: Option<Usage>, stripped_events: u32) {
        self.ended = true;
        if let Some(on_done) = self.on_done.take() {
            let _entered = self.span.enter();
            on_done(Outcome {
                usage,
                end,
                usage_unreadable: self.usage_unreadable,
                stripped_events,
            });
        }
    }

    /// The body stopped early: report what was seen up to here.
    fn abort(&mut self, end: End) {
        let (usage, stripped) = self.tap.usage_so_far();
        self.report(end, usage, stripped);
    }

    /// The provider's body is complete: flush the decoder and the tap, report, and return
    /// the bytes still to send.
    fn finish(&mut self) -> Result<Bytes, RelayError> {
        let mut tail = Bytes::new();
        if let Some(decoder) = &mut self.decoder {
            match decoder.finish() {
                Ok(rest) => tail = self.tap.feed(rest),
                Err(e) => {
                    self.abort(End::UpstreamError);
                    return Err(e.into());
                }
            }
        }
        let (usage, held, stripped) = self.tap.finish();
        self.report(End::Complete, usage, stripped);
        Ok(join(tail, held))
    }

    /// Whether compressed input waits to be decoded.
    fn decoding(&self) -> bool {
        self.decoder.as_ref().is_some_and(Decoding::has_pending)
    }

    /// One data frame from the provider → the bytes for the client (compressed input
    /// is only queued: the poll decodes it a chunk at a time, see [`decode`]).
    fn on_data(&mut self, data: Bytes) -> Result<Bytes, RelayError> {
        if let Some(decoder) = &mut self.decoder {
            decoder.push(data);
            return Ok(Bytes::new());
        }
        self.on_decoded(data)
    }

    /// Decoded bytes → the bytes for the client, through the tap.
    fn on_decoded(&mut self, data: Bytes) -> Result<Bytes, RelayError> {
        let scanning = self.tap.scanning();
        let out = self.tap.feed(data);
        if scanning && !self.tap.scanning() {
            let _entered = self.span.enter();
            tracing::debug!(
                "SSE event over {} bytes; usage scanning stopped",
                sse::MAX_EVENT_BYTES
            );
        }
        // With a known length the last frame is known: finish now, so usage is recorded
        // even if the server never polls again.
        if self.inner.is_end_stream() && !self.decoding() {
            return Ok(join(out, self.finish()?));
        }
        Ok(out)
    }

    /// What goes to the client when compressed input waits: the next decoded chunk
    /// (after what was gathered), or — no slot free — what was gathered, else pending.
    /// `None`: nothing waits (or it decoded to nothing); read from the provider.
    fn poll_decoded_frame(&mut self, cx: &mut Context<'_>) -> Option<Polled> {
        match self.poll_decoded(cx)? {
            Poll::Ready(Ok(out)) => {
                self.burst.push(out);
                let bytes = self.burst.take()?;
                Some(Poll::Ready(Some(Ok(Frame::data(bytes)))))
            }
            Poll::Ready(Err(e)) => Some(self.after_burst(Err(e))),
            Poll::Pending => Some(match self.burst.take() {
                Some(bytes) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
                None => Poll::Pending,
            }),
        }
    }

    /// The next decoded chunk, when compressed input waits: `None` when none waits;
    /// `Some(Pending)` while no slot is free.
    fn poll_decoded(&mut self, cx: &mut Context<'_>) -> Option<Poll<Result<Bytes, RelayError>>> {
        let decoder = self.decoder.as_mut().filter(|d| d.has_pending())?;
        Some(match decoder.poll_chunk(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(chunk)) => Poll::Ready(self.on_decoded(chunk)),
            Poll::Ready(Err(e)) => {
                self.abort(End::UpstreamError);
                Poll::Ready(Err(e.into()))
            }
        })
    }
}

impl RelayBody {
    /// `next` for the client, after the burst gathered so far when there is one.
    fn after_burst(
        &mut self,
        next: Result<Frame<Bytes>, RelayError>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        match self.burst.take() {
            Some(bytes) => {
                self.flush_first = next.is_err();
                self.then = Some(next);
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            None => Poll::Ready(Some(next)),
        }
    }

    /// Nothing gathered and nothing ready: wait, at most `idle` after the last frame.
    fn poll_idle(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let (last_data, idle) = (self.last_data, self.idle);
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(last_data + idle)));
        loop {
            ready!(timer.as_mut().poll(cx));
            let deadline = last_data + idle;
            if timer.deadline() >= deadline {
                break;
            }
            // Data came after the timer was set: wait out the rest.
            timer.as_mut().reset(deadline);
        }
        self.abort(End::IdleTimeout);
        Poll::Ready(Some(Err(RelayError::Idle(self.idle))))
    }
}

fn join(a: Bytes, b: Bytes) -> Bytes {
    match (a.is_empty(), b.is_empty()) {
        (_, true) => a,
        (true, false) => b,
        (false, false) => Bytes::from([a, b].concat()),
    }
}

impl HttpBody for RelayBody {
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let this = &mut *self;
        // hyper asks again: the chunk handed on last was taken.
        if let Some(decoder) = &mut this.decoder {
            decoder.taken();
        }
        loop {
            if std::mem::take(&mut this.flush_first) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if let Some(next) = this.then.take() {
                return Poll::Ready(Some(next));
            }
            if this.ended {
                return Poll::Ready(this.burst.take().map(|b| Ok(Frame::data(b))));
            }
            if let Some((limit, deadline)) = &mut this.lifetime
                && deadline.as_mut().poll(cx).is_ready()
            {
                let limit = *limit;
                this.abort(End::UpstreamError);
                this.span
                    .in_scope(|| tracing::warn!(?limit, "stream cut at timeouts.max_stream_ms"));
                return this.after_burst(Err(RelayError::TooLong(limit)));
            }
            if let Some(decoded) = this.poll_decoded_frame(cx) {
                return decoded;
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    this.last_data = Instant::now();
                    match frame.into_data() {
                        Ok(data) => match this.on_data(data) {
                            Ok(out) => this.burst.push(out),
                            Err(e) => return this.after_burst(Err(e)),
                        },
                        Err(trailers) => return this.after_burst(Ok(trailers)),
                    }
                    if this.burst.is_full()
                        && let Some(bytes) = this.burst.take()
                    {
                        return Poll::Ready(Some(Ok(Frame::data(bytes))));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    this.abort(End::UpstreamError);
                    return this.after_burst(Err(e.into()));
                }
                Poll::Ready(None) => match this.finish() {
                    // Ended: the next turn of the loop sends what is left.
                    Ok(tail) => this.burst.push(tail),
                    Err(e) => return this.after_burst(Err(e)),
                },
                Poll::Pending if !this.burst.is_empty() => {
                    if this.burst.wait_once(cx) {
                        return Poll::Pending;
                    }
                    if let Some(bytes) = this.burst.take() {
                        return Poll::Ready(Some(Ok(Frame::data(bytes))));
                    }
                }
                Poll::Pending => return this.poll_idle(cx),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.burst.is_empty() && self.then.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.decoder.is_none() && !self.tap.rewrites() {
            self.inner.size_hint()
        } else {
            SizeHint::default()
        }
    }
}

impl Drop for RelayBody {
    fn drop(&mut self) {
        if !self.ended {
            self.abort(End::ClientGone);
        }
    }
}
