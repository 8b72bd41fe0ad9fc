//! Serving one listener: accept, bound, deadline, drain. Both listeners (proxy and
//! admin) go through [`serve`], each with its own [`Bounds`].
//!
//! - **Connection cap.** At `max_connections` open connections a new one is answered
//!   at once with a `503` and `Retry-After` and closed, so the process never holds more
//!   sockets (and their buffers) than that — unless the listener has a [`Reserve`]
//!   with room: the admin listener keeps a few connections for `/healthz` and
//!   `/readyz`, so a full cap never makes a liveness probe restart a healthy abridge.
//! - **In-flight cap.** At `max_inflight` requests whose response has not finished, a
//!   new request is answered `503` with `Retry-After` in OpenAI's error shape.
//! - **Deadlines** (on each connection, by [`Deadlines`] around its socket): a new
//!   connection must send its first byte within `header`; between requests a
//!   connection may stay silent for `idle` (keep-alive), and once the first byte of a
//!   request head has arrived, the whole head must arrive within `header` (slowloris); a response the client stops reading is dropped after `idle` without
//!   progress. Request bodies have their own deadline where they are read (see
//!   `proxy`), so a long generation the client waits for is never cut. A connection
//!   that switched protocols (a WebSocket, see [`crate::websocket`]) has no read
//!   deadline here from then on: the session keeps its own. It keeps its place under
//!   the connection cap as long as its socket is open.
//! - **Request ids.** Every request gets an id and a log span (see
//!   [`crate::request_log`]), and every response an `x-request-id` (see
//!   [`crate::request_id`]).
//! - **Drain.** When `stop` fires, accepting stops and every connection is told to
//!   finish its current request and close; [`serve`] returns once all have. A
//!   connection that switched protocols is no longer hyper's: its handler takes the
//!   request's [`Drain`] with the upgrade, which tells it of the stop and keeps it among
//!   the connections [`serve`] waits for until it is dropped.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tower_service::Service;
use tracing::Instrument;

use crate::error::Error;
use crate::request_id::RequestId;
use crate::request_log;

/// One listener's bounds (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub header: Duration,
    pub idle: Duration,
    pub max_connections: usize,
    pub max_inflight: usize,
}

/// The answer to a connection over the cap: written without waiting, then closed.
const OVER_CAPACITY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 140\r\n\r\n{\"error\":{\"message\":\"abridge is at its connection limit (limits.max_connections); retry shortly\",\"type\":\"server_error\",\"param\":null,\"code\":\"overloaded\"}}";

/// Connections kept apart from the cap for what must answer even when the cap is full
/// (the admin listener's health and readiness probes): their own router, few of them,
/// one request each, and a short deadline for it.
#[derive(Clone)]
pub struct Reserve {
    pub router: Router,
    pub connections: usize,
}

/// How long a reserve connection may take to send its request head, from its accept.
/// Probes send theirs at once; a silent connection holds a reserve slot no longer.
const RESERVE_HEADER: Duration = Duration::from_secs(2);

/// One pool of connections: the router they are served by, their bounds and caps.
#[derive(Clone)]
struct Pool {
    router: Router,
    bounds: Bounds,
    connections: Arc<Semaphore>,
    inflight: Arc<Semaphore>,
    keep_alive: bool,
}

impl Pool {
    fn new(router: Router, bounds: Bounds, keep_alive: bool) -> Self {
        Self {
            router,
            connections: Arc::new(Semaphore::new(bounds.max_connections.max(1))),
            inflight: Arc::new(Semaphore::new(bounds.max_inflight.max(1))),
            bounds,
            keep_alive,
        }
    }
}

/// Serves `router` on `listener` within `bounds` until `stop` changes (or its sender
/// is dropped), then drains (see the module docs). Over the connection cap, a
/// connection is served by `reserve` while it has room, else answered 503.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    bounds: Bounds,
    reserve: Option<Reserve>,
    mut stop: watch::Receiver<()>,
) -> io::Result<()> {
    // Every connection's task holds a sender: all dropped, all connections have ended.
    let (open, mut ended) = tokio::sync::mpsc::channel::<()>(1);
    let main = Pool::new(router, bounds, true);
    let reserve = reserve.map(|r| {
        let header = bounds.header.min(RESERVE_HEADER);
        let reserved = Bounds {
            header,
            idle: header,
            max_connections: r.connections,
            max_inflight: r.connections,
        };
        Pool::new(r.router, reserved, false)
    });
    loop {
        let accepted = tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: wait a moment instead of
                // spinning; a connection the peer reset before accept is nothing.
                if !matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                ) {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let admitted = std::iter::once(&main)
            .chain(&reserve)
            .find_map(|pool| Some((pool, pool.connections.clone().try_acquire_owned().ok()?)));
        let Some((pool, permit)) = admitted else {
            // Best effort and without waiting: the socket buffer takes it.
            let _ = tcp.try_write(OVER_CAPACITY);
            continue;
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "set_nodelay failed");
        }
        let stop = stop.clone();
        spawn_connection(tcp, peer, (pool, permit), (open.clone(), stop));
    }
    drop((listener, open));
    let _ = ended.recv().await;
    Ok(())
}

/// What an upgraded connection keeps of its listener's drain: found in the extensions
/// of a request that asks to switch protocols (it has an `Upgrade` header), for the
/// handler that takes the upgrade (a WebSocket, see [`crate::websocket`]). While it is
/// held, [`serve`] counts the connection as open; [`Drain::stopped`] says when the
/// drain began.
#[derive(Clone)]
pub struct Drain {
    stop: watch::Receiver<()>,
    _open: tokio::sync::mpsc::Sender<()>,
}

impl Drain {
    /// Resolves once the listener has stopped accepting and drains (at once if it
    /// already has).
    pub async fn stopped(&mut self) {
        // Only ever dropped, never sent: `changed` resolves with the sender's drop.
        let _ = self.stop.changed().await;
    }
}

/// Serves one accepted connection in its own task, HTTP/1.1 with upgrades, until it
/// ends or `stop` changes (then it finishes the request at hand and closes). The
/// connection's place under the cap lives as long as its socket: past an upgrade (a
/// WebSocket, see [`crate::websocket`]) too. `open` is dropped when the task ends, and
/// a [`Drain`] taken with an upgrade holds a copy of it.
fn spawn_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    (pool, permit): (&Pool, OwnedSemaphorePermit),
    (open, mut stop): (tokio::sync::mpsc::Sender<()>, watch::Receiver<()>),
) {
    let state = Arc::new(ConnState {
        permit: Some(permit),
        ..ConnState::default()
    });
    let io = TokioIo::new(Deadlines::new(tcp, state.clone(), pool.bounds));
    let service = ConnService {
        router: pool.router.clone(),
        peer,
        state,
        inflight: pool.inflight.clone(),
        drain: Drain {
            stop: stop.clone(),
            _open: open.clone(),
        },
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(pool.keep_alive)
        .serve_connection(io, service)
        .with_upgrades();
    tokio::spawn(async move {
        let mut conn = std::pin::pin!(conn);
        let ended = tokio::select! {
            ended = conn.as_mut() => ended,
            _ = stop.changed() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = ended {
            tracing::debug!(error = %e, %peer, "connection ended with an error");
        }
        drop(open);
    });
}

/// What a connection's socket wrapper and its service share: whether a request is
/// being served (its deadlines are then the handler's, not the connection's).
#[derive(Debug, Default)]
struct ConnState {
    /// Requests whose response has not finished (0 or 1: HTTP/1.1 serves one at a time).
    busy: AtomicUsize,
    /// Bumped when a response finishes: the connection is idle from then on.
    finished: AtomicUsize,
    /// The connection's task, as last seen reading while busy: woken when the response
    /// finishes, so the idle deadline is set even if no byte ever comes (std mutex, no
    /// `.await` under it).
    reader: std::sync::Mutex<Option<std::task::Waker>>,
    /// The connection switched protocols (a WebSocket, see [`crate::websocket`]): its
    /// reads have no deadline here from then on, the session keeps its own.
    upgraded: std::sync::atomic::AtomicBool,
    /// The connection's place under the cap, held as long as its socket.
    #[allow(dead_code, reason = "held for its Drop")]
    permit: Option<OwnedSemaphorePermit>,
}

/// The per-connection service: the router, with the peer's address for the handlers
/// (and the [`Drain`] for one that asks to switch protocols), the in-flight cap, and
/// the bookkeeping the deadlines need.
#[derive(Clone)]
struct ConnService {
    router: Router,
    peer: SocketAddr,
    state: Arc<ConnState>,
    inflight: Arc<Semaphore>,
    drain: Drain,
}

impl hyper::service::Service<http::Request<Incoming>> for ConnService {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, mut request: http::Request<Incoming>) -> Self::Future {
        let state = self.state.clone();
        state.busy.fetch_add(1, Ordering::AcqRel);
        let guard = Finished(state);
        let id = RequestId::of(request.headers());
        let span = request_log::span(&id, request.method(), request.uri().path());
        let Ok(permit) = self.inflight.clone().try_acquire_owned() else {
            let mut response =
                span.in_scope(|| Error::Overloaded("limits.max_inflight_requests").into_response());
            id.stamp(response.headers_mut());
            return Box::pin(async move { Ok(tracked(response, guard, None)) });
        };
        id.propagate(request.headers_mut());
        request.extensions_mut().insert(ConnectInfo(self.peer));
        if request.headers().contains_key(http::header::UPGRADE) {
            request.extensions_mut().insert(self.drain.clone());
        }
        let mut router = self.router.clone();
        let conn = self.state.clone();
        Box::pin(async move {
            let mut response = match router
                .call(request.map(Body::new))
                .instrument(span.clone())
                .await
            {
                Ok(response) => response,
                Err(never) => match never {},
            };
            if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                conn.upgraded.store(true, Ordering::Release);
            }
            if let Some(theirs) = id.stamp(response.headers_mut())
                && theirs.as_bytes() != id.as_str().as_bytes()
            {
                request_log::record_upstream(&span, &String::from_utf8_lossy(theirs.as_bytes()));
            }
            Ok(tracked(response, guard, Some(permit)))
        })
    }
}

/// Marks the request finished (busy −1, idle from now) when dropped: with the response
/// body, however it ends.
struct Finished(Arc<ConnState>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Ordering::AcqRel);
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
        let reader = self
            .0
            .reader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(waker) = reader {
            waker.wake();
        }
    }
}

fn tracked(response: Response, guard: Finished, permit: Option<OwnedSemaphorePermit>) -> Response {
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(Tracked {
            inner: body,
            _held: (guard, permit),
        }),
    )
}

/// A response body that holds the request's in-flight permit and its [`Finished`]
/// guard until it ends or is dropped. It is not read in the request's span: the relay
/// enters that span itself where it logs and records at the end (entering it on every
/// poll of a stream cost more than the relay's own work per event).
struct Tracked {
    inner: Body,
    _held: (Finished, Option<OwnedSemaphorePermit>),
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's socket with its deadlines (see the module docs). Reads: between
/// requests, `idle` of silence ends the connection; from a head's first byte, the
/// head must be complete within `header`. Writes: `idle` without progress ends it.
struct Deadlines {
    io: TcpStream,
    state: Arc<ConnState>,
    bounds: Bounds,
    /// The `finished` count the read deadline was set for, and whether a head started.
    read_for: Option<(usize, bool)>,
    read_timer: Option<Pin<Box<Sleep>>>,
    write_timer: Option<Pin<Box<Sleep>>>,
}

impl Deadlines {
    fn new(io: TcpStream, state: Arc<ConnState>, bounds: Bounds) -> Self {
        Self {
            io,
            state,
            bounds,
            read_for: None,
            read_timer: None,
            write_timer: None,
        }
    }

    /// Sets the read deadline for the wait at hand, unless it is already set: `idle`
    /// from the start of a wait between requests, `header` from the first byte of a
    /// head (which then stands until the request is served) — and `header` for the
    /// first byte of a new connection, which has no request to be idle after: a silent
    /// connection must not hold a place under the cap for the keep-alive time.
    fn arm(&mut self, head: bool) {
        let finished = self.state.finished.load(Ordering::Acquire);
        if self.read_for == Some((finished, true)) || self.read_for == Some((finished, head)) {
            return;
        }
        self.read_for = Some((finished, head));
        let fresh = finished == 0 && !self.serving();
        let deadline = Instant::now()
            + if head || fresh {
                self.bounds.header
            } else {
                self.bounds.idle
            };
        match &mut self.read_timer {
            Some(t) => t.as_mut().reset(deadline),
            None => self.read_timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    fn serving(&self) -> bool {
        self.state.busy.load(Ordering::Acquire) > 0
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("client {what} deadline passed"),
    )
}

impl AsyncRead for Deadlines {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.state.upgraded.load(Ordering::Acquire) {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before && !this.serving() {
                    this.arm(true);
                }
                Poll::Ready(result)
            }
            Poll::Pending if this.serving() => {
                *this
                    .state
                    .reader
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cx.waker().clone());
                // The response may have finished just before the waker was left: then
                // nobody will wake this task, and the idle deadline is set now.
                if this.serving() {
                    return Poll::Pending;
                }
                this.poll_idle(cx)
            }
            Poll::Pending => this.poll_idle(cx),
        }
    }
}

impl Deadlines {
    /// Waiting between requests or for the rest of a head: the connection ends when
    /// its deadline passes.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.arm(false);
        let head = self.read_for.is_some_and(|(_, head)| head);
        if let Some(timer) = &mut self.read_timer {
            ready!(timer.as_mut().poll(cx));
            let what = if head {
                "header-read"
            } else if self.state.finished.load(Ordering::Acquire) == 0 {
                "first-byte"
            } else {
                "keep-alive idle"
            };
            return Poll::Ready(Err(timed_out(what)));
        }
        Poll::Pending
    }
}

impl AsyncWrite for Deadlines {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_write(cx, data) {
            Poll::Ready(result) => {
                this.write_timer = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let idle = this.bounds.idle;
                let timer = this
                    .write_timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                ready!(timer.as_mut().poll(cx));
                Poll::Ready(Err(timed_out("write")))
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(result) => {
                this.write_timer = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let idle = this.bounds.idle;
                let timer = this
                    .write_timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                ready!(timer.as_mut().poll(cx));
                Poll::Ready(Err(timed_out("write")))
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
