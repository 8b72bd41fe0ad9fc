//! Request ids: one per request, so an operator can find a client's complaint in the
//! logs. What is decided here is pure (which id, which header); [`crate::serve`] applies
//! it to every request of both listeners and opens the request's log span.
//!
//! - **The request's id** is the client's `x-request-id` when it sent a usable one (1 to
//!   128 visible ASCII characters: a gateway in front of abridge keeps its own id end to
//!   end), else abridge's own: 16 random hex characters. It is the `request_id` field of
//!   the request's log span, so every line logged for the request carries it.
//! - **Upstream**, the request carries `x-request-id: <the request's id>` (the client's
//!   passes as it came, and only that one value; abridge's own is added, replacing an
//!   unusable one), so a provider or gateway that logs it can be joined with abridge's
//!   logs.
//! - **The response** carries `x-request-id`: the provider's when it sent one — its own
//!   `x-request-id` (OpenAI, Azure), or Anthropic's `request-id`, copied — since that is
//!   the id the provider's support asks for; else the request's id (abridge's own
//!   errors, providers that send none). The provider's id is recorded in the span as
//!   `upstream_request_id`, so both ids appear on the lines logged after the answer.

use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderName, HeaderValue};

/// The header, both directions.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Anthropic's name for its request id.
static REQUEST_ID: HeaderName = HeaderName::from_static("request-id");

/// The longest client id adopted.
const MAX_LEN: usize = 128;

/// The request's id (see the module docs): the client's, or abridge's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(HeaderValue);

impl RequestId {
    /// The id of a request with `headers`.
    pub fn of(headers: &HeaderMap) -> Self {
        match headers.get(&X_REQUEST_ID) {
            Some(value) if usable(value) => Self(value.clone()),
            _ => Self::generate(),
        }
    }

    /// abridge's own: 16 hex characters, unique within the process and unlikely to
    /// repeat across processes. A process-wide counter, offset by a random seed drawn
    /// once, through a bijective mixer (splitmix64's finaliser) so that ids do not look
    /// sequential: no system call and no formatting per request (a `getrandom` call and
    /// `format!` per request showed in the profile). An id names a request in logs; it
    /// is not a secret, and nothing is authorised by it.
    pub fn generate() -> Self {
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let seed = *SEED.get_or_init(|| {
            let mut bytes = [0u8; 8];
            // Without the OS's randomness, the clock: ids still differ across restarts.
            getrandom::fill(&mut bytes).map_or_else(
                |_| {
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos() as u64)
                },
                |()| u64::from_le_bytes(bytes),
            )
        });
        let n = mix(seed.wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed)));
        let mut digits = [0u8; 16];
        // 8 bytes are 16 hex digits.
        let _ = hex::encode_to_slice(n.to_be_bytes(), &mut digits);
        // Hex digits are always a valid header value.
        Self(
            HeaderValue::from_bytes(&digits)
                .unwrap_or_else(|_| HeaderValue::from_static("0000000000000000")),
        )
    }

    pub fn as_str(&self) -> &str {
        // Usable ids and generated ones are visible ASCII.
        self.0.to_str().unwrap_or_default()
    }

    /// The request's headers for the upstream: `x-request-id` is this id, once. A
    /// second value the client sent never passes unchecked (`insert` replaces them all).
    pub fn propagate(&self, headers: &mut HeaderMap) {
        let mut sent = headers.get_all(&X_REQUEST_ID).iter();
        let only_ours = sent.next() == Some(&self.0) && sent.next().is_none();
        if !only_ours {
            headers.insert(X_REQUEST_ID.clone(), self.0.clone());
        }
    }

    /// The response's `x-request-id` (see the module docs); returns the provider's id
    /// when the response carries one.
    pub fn stamp(&self, headers: &mut HeaderMap) -> Option<HeaderValue> {
        if let Some(theirs) = headers.get(&X_REQUEST_ID) {
            return Some(theirs.clone());
        }
        if let Some(theirs) = headers.get(&REQUEST_ID).cloned() {
            headers.insert(X_REQUEST_ID.clone(), theirs.clone());
            return Some(theirs);
        }
        headers.insert(X_REQUEST_ID.clone(), self.0.clone());
        None
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// splitmix64's finaliser: a bijection on `u64`, so distinct counters give distinct ids.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether a client's id is adopted: 1 to [`MAX_LEN`] visible ASCII characters (no
/// spaces or control characters, so it reads as one token in a log line).
fn usable(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= MAX_LEN && bytes.iter().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn generated_ids_are_16_hex_and_differ() {
        let a = RequestId::generate();
        let b = RequestId::generate();
        assert_eq!(a.as_str().len(), 16);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn generated_ids_are_unique_and_do_not_look_sequential() {
        let ids: Vec<String> = (0..10_000)
            .map(|_| RequestId::generate().as_str().to_owned())
            .collect();
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        // Consecutive ids share no long common prefix, as counters' hex would.
        let shared =
            |a: &str, b: &str| a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        let long_prefixes = ids.windows(2).filter(|w| shared(&w[0], &w[1]) >= 8).count();
        assert!(
            long_prefixes < 10,
            "{long_prefixes} of 9,999 pairs share 8 digits"
        );
    }

    #[test]
    fn a_usable_client_id_is_adopted_and_propagated() {
        let id = RequestId::of(&headers(&[("x-request-id", "gw-7f3a:42")]));
        assert_eq!(id.as_str(), "gw-7f3a:42");
        let mut upstream = headers(&[("x-request-id", "gw-7f3a:42")]);
        id.propagate(&mut upstream);
        assert_eq!(upstream.get_all("x-request-id").iter().count(), 1);
        for unusable in ["", "has space", "x".repeat(129).leak()] {
            let sent = HeaderValue::from_str(unusable).unwrap();
            let mut h = HeaderMap::new();
            h.insert(X_REQUEST_ID.clone(), sent.clone());
            let id = RequestId::of(&h);
            assert_eq!(id.as_str().len(), 16, "{unusable:?}");
            id.propagate(&mut h);
            assert_eq!(h[&X_REQUEST_ID], id.as_str(), "replaced upstream");
        }
        // A second value (unchecked: it could be anything) never reaches the upstream.
        let mut two = headers(&[("x-request-id", "gw-1"), ("x-request-id", "evil\tvalue")]);
        let id = RequestId::of(&two);
        assert_eq!(id.as_str(), "gw-1");
        id.propagate(&mut two);
        let sent: Vec<_> = two.get_all(&X_REQUEST_ID).iter().collect();
        assert_eq!(sent, ["gw-1"]);
        let mut none = HeaderMap::new();
        let id = RequestId::of(&none);
        id.propagate(&mut none);
        assert_eq!(none[&X_REQUEST_ID], id.as_str());
    }

    #[test]
    fn the_providers_id_wins_in_the_response() {
        let ours = RequestId::of(&HeaderMap::new());
        let mut openai = headers(&[("x-request-id", "req_abc")]);
        assert_eq!(ours.stamp(&mut openai).unwrap(), "req_abc");
        assert_eq!(openai[&X_REQUEST_ID], "req_abc");
        let mut anthropic = headers(&[("request-id", "req_011")]);
        assert_eq!(ours.stamp(&mut anthropic).unwrap(), "req_011");
        assert_eq!(anthropic[&X_REQUEST_ID], "req_011");
        assert_eq!(anthropic["request-id"], "req_011", "theirs is kept");
        let mut own = HeaderMap::new();
        assert_eq!(ours.stamp(&mut own), None);
        assert_eq!(own[&X_REQUEST_ID], ours.as_str());
    }
}
