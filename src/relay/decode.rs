//! Decoding a compressed provider response (gzip, deflate) for the client, bounded per
//! response and across the process.
//!
//! abridge asks for `Accept-Encoding: identity` on the routes it reads; a provider that
//! compresses anyway is decoded so usage can still be read. A gzip bomb must not grow
//! abridge's memory with every response that carries one, so:
//! - compressed bytes go to the decoder [`STEP`] at a time (deflate inflates at most
//!   ~1,032:1, so a step yields at most ~260 KB), and decoding stops once a chunk holds
//!   [`CHUNK`] bytes: the rest of a frame waits, compressed, until the client has taken
//!   that chunk. One response holds at most one decoded chunk (about half a megabyte)
//!   besides its compressed input;
//! - a response decodes to `limits.max_decoded_bytes` at most (beyond: an error, the
//!   client sees an incomplete body);
//! - decoded chunks in flight, process-wide, hold a slot of [`DecodeBudget`]
//!   (`limits.max_inflight_decoded_bytes` / [`SLOT`] slots) from when they are decoded
//!   until the client's connection asks for the next one. A response that finds no slot
//!   waits for one, reading nothing more from the provider meanwhile.

use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, header};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

/// Compressed bytes given to the decoder at a time.
pub const STEP: usize = 256;
/// Decoding stops once a chunk holds this many bytes.
pub const CHUNK: usize = 256 * 1024;
/// What a decoded chunk may come to: [`CHUNK`], plus one step's output.
pub const SLOT: usize = 2 * CHUNK;

/// The process's slots for decoded chunks in flight (see the module docs). Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct DecodeBudget {
    slots: Arc<Semaphore>,
}

impl DecodeBudget {
    /// Slots for `bytes` of decoded chunks at once (one at least).
    pub fn new(bytes: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(
                (bytes / SLOT).clamp(1, Semaphore::MAX_PERMITS),
            )),
        }
    }

    /// Slots free now.
    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }
}

type Acquire = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

enum Kind {
    Gzip(flate2::write::GzDecoder<Vec<u8>>),
    Deflate(flate2::write::ZlibDecoder<Vec<u8>>),
}

/// One response's decoding (see the module docs).
pub struct Decoding {
    kind: Kind,
    /// Compressed input not decoded yet.
    pending: Bytes,
    /// Decoded bytes still allowed (`limits.max_decoded_bytes` at the start).
    left: usize,
    budget: DecodeBudget,
    /// The slot of the chunk handed on last.
    slot: Option<OwnedSemaphorePermit>,
    /// Waiting for a slot.
    waiting: Option<Acquire>,
}

impl Decoding {
    /// The decoding `headers`' `Content-Encoding` asks for: `Ok(None)` for identity,
    /// `Err(encoding)` for one abridge cannot decode.
    pub fn for_encoding(
        headers: &HeaderMap,
        max_decoded: usize,
        budget: DecodeBudget,
    ) -> Result<Option<Self>, String> {
        let Some(value) = headers.get(header::CONTENT_ENCODING) else {
            return Ok(None);
        };
        let encoding = value.to_str().unwrap_or("").trim().to_ascii_lowercase();
        let kind = match encoding.as_str() {
            "" | "identity" => return Ok(None),
            "gzip" | "x-gzip" => Kind::Gzip(flate2::write::GzDecoder::new(Vec::new())),
            "deflate" => Kind::Deflate(flate2::write::ZlibDecoder::new(Vec::new())),
            _ => return Err(encoding),
        };
        Ok(Some(Self {
            kind,
            pending: Bytes::new(),
            left: max_decoded,
            budget,
            slot: None,
            waiting: None,
        }))
    }

    /// Queues a frame of compressed input.
    pub fn push(&mut self, data: Bytes) {
        if self.pending.is_empty() {
            self.pending = data;
        } else {
            self.pending = Bytes::from([self.pending.as_ref(), data.as_ref()].concat());
        }
    }

    /// Whether compressed input waits to be decoded.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The chunk handed on last was taken: its slot goes back.
    pub fn taken(&mut self) {
        self.slot = None;
    }

    /// The next decoded chunk of the pending input (at most about [`CHUNK`] bytes), once
    /// a slot is free. An error once the response decodes to more than allowed.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<Bytes>> {
        if self.slot.is_none() {
            let waiting = self
                .waiting
                .get_or_insert_with(|| Box::pin(self.budget.slots.clone().acquire_owned()));
            match waiting.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(permit) => {
                    self.waiting = None;
                    // The semaphore is never closed.
                    self.slot = permit.ok();
                }
            }
        }
        let mut out: Vec<u8> = Vec::new();
        while !self.pending.is_empty() && out.len() < CHUNK {
            let step = self.pending.split_to(self.pending.len().min(STEP));
            let produced = self.write(&step)?;
            self.take(produced.len())?;
            if out.is_empty() {
                out = produced;
            } else {
                out.extend_from_slice(&produced);
            }
        }
        Poll::Ready(Ok(Bytes::from(out)))
    }

    /// The next decoded chunk, its slot given back at once: for a caller that keeps
    /// what it decodes (within a budget of its own) rather than handing it on.
    pub async fn next_chunk(&mut self) -> std::io::Result<Bytes> {
        let chunk = std::future::poll_fn(|cx| self.poll_chunk(cx)).await;
        self.taken();
        chunk
    }

    fn write(&mut self, step: &[u8]) -> std::io::Result<Vec<u8>> {
        Ok(match &mut self.kind {
            Kind::Gzip(d) => {
                d.write_all(step)?;
                d.flush()?;
                std::mem::take(d.get_mut())
            }
            Kind::Deflate(d) => {
                d.write_all(step)?;
                d.flush()?;
                std::mem::take(d.get_mut())
            }
        })
    }

    /// The end of the input: what the decoder still holds (a few bytes: its input was
    /// flushed step by step).
    pub fn finish(&mut self) -> std::io::Result<Bytes> {
        let out = match &mut self.kind {
            Kind::Gzip(d) => {
                d.try_finish()?;
                std::mem::take(d.get_mut())
            }
            Kind::Deflate(d) => {
                d.try_finish()?;
                std::mem::take(d.get_mut())
            }
        };
        self.take(out.len())?;
        Ok(Bytes::from(out))
    }

    /// Takes `n` bytes of what the response may decode to, or fails when there are not
    /// that many left.
    fn take(&mut self, n: usize) -> std::io::Result<()> {
        self.left = self.left.checked_sub(n).ok_or_else(|| {
            std::io::Error::other("the response decodes to more than limits.max_decoded_bytes")
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip(bytes: &[u8]) -> Bytes {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(bytes).unwrap();
        Bytes::from(e.finish().unwrap())
    }

    fn gzipped() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, "gzip".parse().unwrap());
        h
    }

    fn ready(d: &mut Decoding) -> Poll<std::io::Result<Bytes>> {
        let waker = std::task::Waker::noop();
        d.poll_chunk(&mut Context::from_waker(waker))
    }

    #[test]
    fn a_frame_is_decoded_a_chunk_at_a_time_and_whole() {
        let text: Vec<u8> = (0..3_000_000u32)
            .map(|i| b"abcdefgh"[(i % 7) as usize])
            .collect();
        let mut d = Decoding::for_encoding(&gzipped(), 64 << 20, DecodeBudget::new(8 << 20))
            .unwrap()
            .unwrap();
        d.push(gzip(&text));
        let mut out = Vec::new();
        while d.has_pending() {
            let Poll::Ready(Ok(chunk)) = ready(&mut d) else {
                panic!("a slot is free")
            };
            assert!(chunk.len() <= SLOT, "{}", chunk.len());
            out.extend_from_slice(&chunk);
            d.taken();
        }
        out.extend_from_slice(&d.finish().unwrap());
        assert_eq!(out, text);
    }

    #[test]
    fn a_bomb_is_cut_at_the_responses_bound() {
        let bomb = gzip(&vec![0u8; 8 << 20]);
        let mut d = Decoding::for_encoding(&gzipped(), 1 << 20, DecodeBudget::new(8 << 20))
            .unwrap()
            .unwrap();
        d.push(bomb);
        let mut decoded = 0;
        loop {
            match ready(&mut d) {
                Poll::Ready(Ok(chunk)) => decoded += chunk.len(),
                Poll::Ready(Err(_)) => break,
                Poll::Pending => panic!("a slot is free"),
            }
            d.taken();
        }
        assert!(decoded <= 1 << 20);
    }

    #[test]
    fn chunks_in_flight_across_responses_wait_for_a_slot() {
        let budget = DecodeBudget::new(2 * SLOT);
        let open = || {
            let mut d = Decoding::for_encoding(&gzipped(), 64 << 20, budget.clone())
                .unwrap()
                .unwrap();
            d.push(gzip(&vec![7u8; 4 << 20]));
            d
        };
        let (mut a, mut b, mut c) = (open(), open(), open());
        assert!(matches!(ready(&mut a), Poll::Ready(Ok(_))));
        assert!(matches!(ready(&mut b), Poll::Ready(Ok(_))));
        assert_eq!(budget.available(), 0);
        assert!(ready(&mut c).is_pending(), "no slot: it waits");
        a.taken();
        assert!(
            matches!(ready(&mut c), Poll::Ready(Ok(_))),
            "a's slot went to c"
        );
    }
}
