//! Reading what a client sends, within bounds: the whole body of a request abridge
//! parses (its size, `limits.max_body_bytes`; its deadline, `timeouts.client_body_ms`;
//! its share of `limits.max_inflight_body_bytes`, held until abridge is done with it),
//! and the deadlines of a body streamed through to the provider: between its chunks
//! (`timeouts.client_body_ms`) and for all of it (`timeouts.passthrough_body_ms`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, header};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::error::Error;

/// Budget units are kibibytes: a semaphore's permits are counted in `u32` at once.
const UNIT: usize = 1024;

/// The bytes of request bodies abridge holds at once, and of the response buffers its
/// relay keeps to read usage (`limits.max_inflight_body_bytes`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    units: Arc<Semaphore>,
}

/// A body's share of the budget, given back when dropped (with the last holder of the
/// body: the request, the recall rounds that send it on, or the background compaction
/// it was queued for). A clone is the same share, not a new one: it is given back when
/// the last clone is dropped.
#[derive(Debug, Clone, Default)]
pub struct Held(
    #[allow(dead_code, reason = "held for its Drop")] Option<Arc<OwnedSemaphorePermit>>,
);

impl Held {
    /// The share `permit` holds (taken with [`BodyBudget::take`]).
    pub(crate) fn of(permit: Option<OwnedSemaphorePermit>) -> Self {
        Self(permit.map(Arc::new))
    }
}

impl BodyBudget {
    pub fn new(bytes: usize) -> Self {
        Self {
            units: Arc::new(Semaphore::new(
                (bytes / UNIT).clamp(1, Semaphore::MAX_PERMITS),
            )),
        }
    }

    /// Takes `bytes` more of the budget into `held`, without waiting.
    pub(crate) fn take(
        &self,
        held: &mut Option<OwnedSemaphorePermit>,
        bytes: usize,
    ) -> Result<(), Error> {
        let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX);
        if units == 0 {
            return Ok(());
        }
        let more = self
            .units
            .clone()
            .try_acquire_many_owned(units)
            .map_err(|_| Error::Overloaded("limits.max_inflight_body_bytes"))?;
        match held {
            Some(permit) => permit.merge(more),
            None => *held = Some(more),
        }
        Ok(())
    }

    /// A share of `bytes` of the budget, of its own, without waiting: for what abridge
    /// holds beside a request's body (the answers and follow-ups of recall).
    pub fn hold(&self, bytes: usize) -> Result<Held, Error> {
        let mut held = None;
        self.take(&mut held, bytes)?;
        Ok(Held::of(held))
    }
}

/// Reads a request body whole: at most `limit` bytes (413 beyond), within `deadline`
/// (408 after), each chunk counted against `budget` as it arrives (503 when the
/// process holds too much already).
pub async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    deadline: Duration,
    budget: &BodyBudget,
) -> Result<(Bytes, Held), Error> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(Error::BodyTooLarge { limit });
    }
    let mut held = None;
    // Announced: take it all now, so a body that cannot be held is refused unread.
    if let Some(len) = declared {
        budget.take(&mut held, len as usize)?;
    }
    let read = async {
        let mut body = body;
        // Allocated only when a second chunk comes (a one-chunk body never needs it).
        let mut out = BytesMut::new();
        let mut first: Option<Bytes> = None;
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame.map_err(|e| Error::ClientBody(e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let total = out.len() + first.as_ref().map_or(0, Bytes::len) + data.len();
            if total > limit {
                return Err(Error::BodyTooLarge { limit });
            }
            if declared.is_none() || total as u64 > declared.unwrap_or(0) {
                budget.take(&mut held, data.len())?;
            }
            // One chunk (the common case) is kept as it came, without a copy.
            match first.take() {
                None if out.is_empty() => first = Some(data),
                Some(f) => {
                    out.reserve((declared.unwrap_or(0) as usize).max(f.len() + data.len()));
                    out.extend_from_slice(&f);
                    out.extend_from_slice(&data);
                }
                None => out.extend_from_slice(&data),
            }
        }
        Ok(first.map_or_else(|| out.freeze(), own_small))
    };
    let bytes = tokio::time::timeout(deadline, read)
        .await
        .map_err(|_| Error::BodyTimeout {
            after: deadline,
            key: "client_body_ms",
        })??;
    Ok((bytes, Held::of(held)))
}

/// A body of one chunk is kept as it came when large, copied when small: a small chunk
/// is most likely a slice of the connection's read buffer (hyper reads 8 KiB at a time),
/// which it would keep alive for as long as the request is held — a stream's whole
/// life, ~8 KiB per open stream for a 2 KB request. Copying 16 KiB costs well under a
/// microsecond.
fn own_small(chunk: Bytes) -> Bytes {
    const SMALL: usize = 16 * 1024;
    if chunk.len() < SMALL {
        Bytes::copy_from_slice(&chunk)
    } else {
        chunk
    }
}

/// A body streamed through to the provider, ended with an error when the client pauses
/// longer than `idle` between two chunks, or has not finished it within `total` (an
/// upload that trickles a byte now and then must not hold a connection for ever).
pub struct IdleBody {
    inner: Body,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    total: Duration,
    /// Set at the first poll: the body's time runs from when it is first read.
    whole: Option<Pin<Box<Sleep>>>,
}

impl IdleBody {
    pub fn new(inner: Body, idle: Duration, total: Duration) -> Self {
        Self {
            inner,
            idle,
            timer: None,
            total,
            whole: None,
        }
    }
}

impl HttpBody for IdleBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let total = this.total;
        let whole = this
            .whole
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + total)));
        if whole.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(axum::Error::new(Error::BodyTimeout {
                after: total,
                key: "passthrough_body_ms",
            }))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.timer = None;
                Poll::Ready(frame)
            }
            Poll::Pending => {
                let idle = this.idle;
                let timer = this.timer.get_or_insert_with(|| {
                    Box::pin(tokio::time::sleep_until(Instant::now() + idle))
                });
                ready!(timer.as_mut().poll(cx));
                Poll::Ready(Some(Err(axum::Error::new(Error::BodyTimeout {
                    after: idle,
                    key: "client_body_ms",
                }))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bodies_are_bounded_by_size_and_by_what_the_process_holds() {
        let budget = BodyBudget::new(10 * 1024);
        let headers = HeaderMap::new();
        let t = Duration::from_secs(5);
        let (a, held_a) = read_body(Body::from(vec![b'a'; 6000]), &headers, 1 << 20, t, &budget)
            .await
            .unwrap();
        assert_eq!(a.len(), 6000);
        // 6 KiB held: another 6 KB does not fit in 10 KiB until the first is let go.
        let refused = read_body(Body::from(vec![b'b'; 6000]), &headers, 1 << 20, t, &budget).await;
        assert!(matches!(refused, Err(Error::Overloaded(_))), "{refused:?}");
        drop(held_a);
        assert!(
            read_body(Body::from(vec![b'b'; 6000]), &headers, 1 << 20, t, &budget)
                .await
                .is_ok()
        );
        let too_big = read_body(Body::from(vec![b'c'; 2000]), &headers, 1000, t, &budget).await;
        assert!(matches!(too_big, Err(Error::BodyTooLarge { .. })));
    }

    /// A small body read as one slice of a larger buffer (as hyper's read buffer is)
    /// does not keep that buffer alive.
    #[tokio::test]
    async fn a_small_body_does_not_pin_the_buffer_it_was_read_into() {
        let budget = BodyBudget::new(1 << 20);
        let t = Duration::from_secs(5);
        let buffer = Bytes::from(vec![b'x'; 8192]);
        let (small, _held) = read_body(
            Body::from(buffer.slice(100..2100)),
            &HeaderMap::new(),
            1 << 20,
            t,
            &budget,
        )
        .await
        .unwrap();
        assert_eq!(small.len(), 2000);
        assert!(small.is_unique(), "a copy of its own");
        // A large one is kept as it came (no copy of a big body).
        let big = Bytes::from(vec![b'y'; 64 * 1024]);
        let (kept, _held) = read_body(
            Body::from(big.clone()),
            &HeaderMap::new(),
            1 << 20,
            t,
            &budget,
        )
        .await
        .unwrap();
        assert_eq!(kept.as_ptr(), big.as_ptr());
    }

    #[test]
    fn a_share_is_given_back_with_its_last_clone() {
        let budget = BodyBudget::new(10 * 1024);
        let held = budget.hold(6 * 1024).unwrap();
        let shared = held.clone();
        assert!(budget.hold(6 * 1024).is_err());
        drop(held);
        assert!(budget.hold(6 * 1024).is_err(), "the clone still holds it");
        drop(shared);
        assert!(budget.hold(6 * 1024).is_ok());
    }

    #[tokio::test]
    async fn a_body_in_several_chunks_is_joined_in_order() {
        let budget = BodyBudget::new(1 << 20);
        let chunks = ["{\"a\":", "[1,2", ",3]}"].map(|c| Ok::<_, std::io::Error>(Bytes::from(c)));
        let body = Body::from_stream(futures_util::stream::iter(chunks));
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, http::HeaderValue::from_static("14"));
        let (joined, _held) = read_body(body, &headers, 1 << 20, Duration::from_secs(5), &budget)
            .await
            .unwrap();
        assert_eq!(&joined[..], b"{\"a\":[1,2,3]}");
    }
}
