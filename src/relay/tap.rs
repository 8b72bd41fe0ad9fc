//! What the relay reads of a successful response on a conversation route: the usage
//! taps (a JSON body kept aside and read once at the end, an SSE stream scanned as it
//! passes) and what they buffer, counted against the process's budget
//! (`limits.max_inflight_body_bytes`): over it, a tap stops buffering and that
//! response's usage is not read; the response itself flows on.

use bytes::Bytes;
use http::{HeaderMap, header};
use tokio::sync::OwnedSemaphorePermit;

use super::join;
use super::sse::SseTap;
use super::usage::{self, Usage};
use crate::ingress::BodyBudget;

/// Largest non-streaming response kept aside to read its `usage`; larger bodies are
/// relayed without it.
const MAX_JSON_TAP_BYTES: usize = 16 * 1024 * 1024;

pub(super) enum Tap {
    None,
    Json {
        chunks: Vec<Bytes>,
        size: usize,
        held: Held,
    },
    Sse(SseTap, Held),
}

/// What a tap buffers, counted against the process's budget. Over it, the tap stops
/// buffering (usage is not read for that response); the response itself flows on.
#[derive(Default)]
pub(super) struct Held {
    pub(super) budget: Option<BodyBudget>,
    permit: Option<OwnedSemaphorePermit>,
    /// Bytes the permit covers.
    covered: usize,
}

impl Held {
    const FREE: usize = 64 * 1024;

    /// Gives back what the tap held (it buffers nothing more) and stops counting.
    fn release(&mut self) {
        self.permit = None;
        self.covered = 0;
        self.budget = None;
    }

    /// Whether `bytes` buffered at once fit: the permit grows to cover them. The first
    /// [`Held::FREE`] bytes are not counted, so an ordinary stream (events of a few
    /// kilobytes) never touches the budget.
    fn cover(&mut self, bytes: usize) -> bool {
        if bytes <= self.covered.max(Self::FREE) {
            return true;
        }
        let Some(budget) = &self.budget else {
            return true;
        };
        // Grown in steps of 64 KiB, so a stream takes the budget's lock rarely.
        let want = bytes.next_multiple_of(64 * 1024);
        if budget.take(&mut self.permit, want - self.covered).is_err() {
            return false;
        }
        self.covered = want;
        true
    }
}

impl Tap {
    /// The buffer accounting of a tap that buffers.
    pub(super) fn buffering(&mut self) -> Option<&mut Held> {
        match self {
            Tap::None => None,
            Tap::Json { held, .. } | Tap::Sse(_, held) => Some(held),
        }
    }

    /// Whether an SSE tap is still reading events (it stops at an oversized one).
    pub(super) fn scanning(&self) -> bool {
        match self {
            Tap::Sse(sse, _) => sse.scanning(),
            Tap::None | Tap::Json { .. } => false,
        }
    }

    pub(super) fn for_content_type(headers: &HeaderMap, strip: bool) -> Tap {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let mime = content_type.split(';').next().unwrap_or("").trim();
        if mime.eq_ignore_ascii_case("text/event-stream") {
            Tap::Sse(SseTap::new(strip), Held::default())
        } else if mime.eq_ignore_ascii_case("application/json") {
            Tap::Json {
                chunks: Vec::new(),
                size: 0,
                held: Held::default(),
            }
        } else {
            Tap::None
        }
    }

    /// Whether the tap may change the bytes (so `Content-Length` no longer holds).
    pub(super) fn rewrites(&self) -> bool {
        matches!(self, Tap::Sse(sse, _) if sse.strips())
    }

    pub(super) fn feed(&mut self, data: Bytes) -> Bytes {
        match self {
            Tap::None => data,
            Tap::Json { chunks, size, held } => {
                *size += data.len();
                if *size <= MAX_JSON_TAP_BYTES && held.cover(*size) {
                    chunks.push(data.clone());
                } else {
                    // Not read: over the tap's own limit or the process's budget; what
                    // it held goes back.
                    *size = MAX_JSON_TAP_BYTES + 1;
                    *chunks = Vec::new();
                    held.release();
                }
                data
            }
            Tap::Sse(sse, held) => {
                let out = sse.feed(data);
                if held.cover(sse.buffered()) {
                    out
                } else {
                    let out = join(out, sse.release());
                    held.release();
                    out
                }
            }
        }
    }

    /// The usage seen so far (for a body that did not end normally).
    pub(super) fn usage_so_far(&self) -> (Option<Usage>, u32) {
        match self {
            Tap::Sse(sse, _) => (sse.usage(), sse.dropped_events()),
            Tap::None | Tap::Json { .. } => (None, 0),
        }
    }

    /// End of body: the usage found, and any bytes still held back.
    pub(super) fn finish(&mut self) -> (Option<Usage>, Bytes, u32) {
        match self {
            Tap::None => (None, Bytes::new(), 0),
            Tap::Json { chunks, size, .. } => {
                if *size > MAX_JSON_TAP_BYTES {
                    return (None, Bytes::new(), 0);
                }
                let usage = match chunks.as_slice() {
                    [one] => usage::from_json(one),
                    many => usage::from_json(&many.concat()),
                };
                (usage, Bytes::new(), 0)
            }
            Tap::Sse(sse, _) => {
                let tail = sse.finish();
                (sse.usage(), tail, sse.dropped_events())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tap(content_type: &'static str, strip: bool, budget: usize) -> Tap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, content_type.parse().unwrap());
        let mut tap = Tap::for_content_type(&headers, strip);
        if let Some(held) = tap.buffering() {
            held.budget = Some(BodyBudget::new(budget));
        }
        tap
    }

    /// A JSON answer kept aside to read its usage takes from the process's budget; one
    /// that does not fit is relayed whole all the same, its usage unread.
    #[test]
    fn a_json_answer_over_the_budget_flows_on_unread() {
        let usage = br#"{"usage":{"prompt_tokens":7,"completion_tokens":1}}"#;
        let mut small = tap("application/json", false, 1 << 20);
        assert_eq!(&small.feed(Bytes::from_static(usage))[..], usage);
        assert_eq!(small.finish().0.map(|u| u.prompt_tokens), Some(7));

        let padding = format!(r#"{{"pad":"{}","#, "x".repeat(300 * 1024));
        let mut big = tap("application/json", false, 128 * 1024);
        let mut relayed = Vec::new();
        relayed.extend_from_slice(&big.feed(Bytes::from(padding.clone())));
        relayed.extend_from_slice(&big.feed(Bytes::from_static(&usage[1..])));
        assert_eq!(
            relayed.len(),
            padding.len() + usage.len() - 1,
            "every byte relayed"
        );
        assert_eq!(big.finish().0, None, "not held, so not read");
    }

    /// An event that grows past what the process can hold stops the scan: what strip
    /// mode held back goes out in order, and the rest flows untouched.
    #[test]
    fn an_sse_event_over_the_budget_is_released_in_order() {
        for strip in [false, true] {
            let mut sse = tap("text/event-stream", strip, 128 * 1024);
            let first = Bytes::from_static(b"data: {\"a\":1}\n\n");
            let huge = Bytes::from(format!("data: {}", "y".repeat(200 * 1024)));
            let rest = Bytes::from_static(b"\n\ndata: [DONE]\n\n");
            let mut out = Vec::new();
            for chunk in [first.clone(), huge.clone(), rest.clone()] {
                out.extend_from_slice(&sse.feed(chunk));
            }
            out.extend_from_slice(&sse.finish().1);
            assert_eq!(out, [first, huge, rest].concat(), "strip {strip}");
            assert!(!sse.scanning());
        }
    }
}
