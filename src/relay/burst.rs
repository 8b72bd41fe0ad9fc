//! A burst: the bytes for the client from upstream frames that arrived together, sent
//! in one write.
//!
//! hyper's client hands the relay one chunk at a time through a channel that holds
//! one, so when a provider's events arrive in one read (a fast model, a replayed
//! stream) the relay used to get them one task switch apart and hyper's server wrote
//! each on its own: one `writev` per SSE event, most of the relay's CPU per event.
//! The relay now gathers: when the upstream has nothing ready right after a frame, it
//! lets the connection task run ([`yield_once`], see [`TURNS`]) and takes whatever came
//! meanwhile; only when that brings nothing new does it hand the burst to hyper. Events
//! that arrive apart (a model's pace) cost two extra polls each (no wait on a timer:
//! they are sent as soon as the scheduler comes back). An error that ends the stream
//! goes after a pending poll of its own, so hyper writes the burst before it (hyper
//! closes the connection on a body error without flushing what it buffered). A burst is bounded ([`MAX_BYTES`], [`MAX_PARTS`]): it never
//! holds more than one write's worth.

use std::future::Future;
use std::pin::pin;
use std::task::Context;

use bytes::{Bytes, BytesMut};

/// A burst is sent when it holds this many bytes…
pub const MAX_BYTES: usize = 64 * 1024;
/// …or this many frames.
pub const MAX_PARTS: usize = 64;
/// What the joined buffer starts with, when a second frame comes.
const JOINED_START: usize = 4096;
/// Waits after a frame before the relay sends what it has. hyper's server polls a body
/// again at once when it returned pending and there was nothing to flush, which takes
/// the first; the second is a turn of the scheduler, in which the connection task runs.
const TURNS: u8 = 2;

/// The bytes gathered so far (see the module docs). A single frame is kept as it came
/// (nothing allocated: the common case of a whole JSON answer or one event); a second
/// one starts the joined buffer.
#[derive(Debug, Default)]
pub struct Burst {
    first: Option<Bytes>,
    joined: BytesMut,
    /// Frames gathered.
    parts: usize,
    /// How often the relay let the connection task run since the last frame.
    yielded: u8,
}

impl Burst {
    /// Adds the bytes of one frame (nothing when empty).
    pub fn push(&mut self, bytes: Bytes) {
        // A frame that gave nothing to send (an event the tap still holds) does not
        // restart the wait: a provider dribbling fragments cannot hold a burst back.
        if bytes.is_empty() {
            return;
        }
        self.yielded = 0;
        self.parts += 1;
        match self.first.take() {
            None if self.joined.is_empty() => self.first = Some(bytes),
            Some(first) => {
                // Room for a burst of small events without growing step by step.
                self.joined
                    .reserve((first.len() + bytes.len()).max(JOINED_START));
                self.joined.extend_from_slice(&first);
                self.joined.extend_from_slice(&bytes);
            }
            None => self.joined.extend_from_slice(&bytes),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.parts == 0
    }

    /// Whether the burst is as large as one is allowed to grow.
    pub fn is_full(&self) -> bool {
        let len = self.first.as_ref().map_or(self.joined.len(), Bytes::len);
        len >= MAX_BYTES || self.parts >= MAX_PARTS
    }

    /// When the upstream has nothing ready: `true` (and the task is woken again after
    /// the others ready to run) for the first [`TURNS`] times since the last frame,
    /// `false` when they brought nothing new and the burst should go.
    pub fn wait_once(&mut self, cx: &mut Context<'_>) -> bool {
        if self.yielded >= TURNS {
            return false;
        }
        self.yielded += 1;
        yield_once(cx);
        true
    }

    /// The gathered bytes as one buffer (a single frame's without a copy); `None` when
    /// there are none.
    pub fn take(&mut self) -> Option<Bytes> {
        self.yielded = 0;
        self.parts = 0;
        match self.first.take() {
            Some(first) => Some(first),
            None if self.joined.is_empty() => None,
            // The buffer goes with the bytes: a stream between bursts holds none (a
            // paced stream would otherwise keep its first burst's 4 KiB for its life).
            None => Some(std::mem::take(&mut self.joined).freeze()),
        }
    }
}

/// Arranges for the current task to be polled again after the other tasks that are
/// ready to run (tokio's `yield_now`, whose wake-up is deferred until the scheduler has
/// run them), without waiting on anything.
fn yield_once(cx: &mut Context<'_>) {
    let mut yielding = pin!(tokio::task::yield_now());
    // The first poll registers the deferred wake-up and is always pending.
    let _ = yielding.as_mut().poll(cx);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_joins_its_frames_and_keeps_a_single_one_as_it_came() {
        let mut burst = Burst::default();
        assert!(burst.take().is_none());
        let one = Bytes::from_static(b"data: 1\n\n");
        burst.push(one.clone());
        burst.push(Bytes::new());
        let taken = burst.take().unwrap();
        assert_eq!(taken.as_ptr(), one.as_ptr(), "no copy of a single frame");
        burst.push(Bytes::from_static(b"data: 1\n\n"));
        burst.push(Bytes::from_static(b"data: 2\n\n"));
        assert_eq!(&burst.take().unwrap()[..], b"data: 1\n\ndata: 2\n\n");
        assert!(burst.is_empty());
        assert_eq!(burst.joined.capacity(), 0, "no buffer held between bursts");
    }

    #[test]
    fn a_burst_is_bounded() {
        let mut burst = Burst::default();
        for _ in 0..MAX_PARTS - 1 {
            burst.push(Bytes::from_static(b"x"));
        }
        assert!(!burst.is_full());
        burst.push(Bytes::from_static(b"x"));
        assert!(burst.is_full());
        burst.take();
        burst.push(Bytes::from(vec![b'y'; MAX_BYTES]));
        assert!(burst.is_full());
    }

    #[tokio::test]
    async fn it_waits_one_turn_per_frame_then_lets_the_burst_go() {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut burst = Burst::default();
        burst.push(Bytes::from_static(b"a"));
        for turn in 0..TURNS {
            assert!(
                burst.wait_once(&mut cx),
                "turn {turn}: let the connection run"
            );
        }
        assert!(!burst.wait_once(&mut cx), "nothing came: send");
        burst.push(Bytes::new());
        assert!(
            !burst.wait_once(&mut cx),
            "an empty frame does not restart the wait"
        );
        burst.push(Bytes::from_static(b"b"));
        assert!(burst.wait_once(&mut cx), "a new frame: wait again");
    }
}
