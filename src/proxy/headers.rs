//! Header hygiene for both directions.
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and every header it names,
//! `Proxy-Connection`, `Keep-Alive`, `TE`, `Transfer-Encoding`, `Upgrade`, plus the
//! proxy-authentication pair, which addresses a proxy and not the provider) describe one
//! connection and never cross abridge. `x-abridge-*` headers are abridge's own interface:
//! the client's are consumed here, and a provider cannot inject any into a response.
//! `Host` is set from the upstream URL by the HTTP client.

use http::{HeaderMap, HeaderName, header};

const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// Prefix of abridge's own request and response headers.
pub const ABRIDGE_PREFIX: &str = "x-abridge-";

/// Headers of a request before it goes to the provider.
pub fn strip_request(headers: &mut HeaderMap) {
    headers.remove(header::HOST);
    strip_common(headers);
}

/// Headers of a provider response before it goes to the client.
pub fn strip_response(headers: &mut HeaderMap) {
    headers.remove(header::PROXY_AUTHENTICATE);
    strip_common(headers);
}

fn strip_common(headers: &mut HeaderMap) {
    // Headers listed in `Connection` are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if headers.keys().any(is_abridge) {
        let ours: Vec<HeaderName> = headers.keys().filter(|n| is_abridge(n)).cloned().collect();
        for name in ours {
            headers.remove(name);
        }
    }
}

fn is_abridge(name: &HeaderName) -> bool {
    name.as_str().starts_with(ABRIDGE_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn removes_hop_by_hop_named_and_abridge_headers() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, X-Custom-Hop"),
            ("keep-alive", "timeout=5"),
            ("x-custom-hop", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("proxy-authorization", "Basic abc"),
            ("host", "127.0.0.1:8080"),
            ("x-abridge-compact", "off"),
            ("x-abridge-conversation", "c1"),
            ("authorization", "Bearer sk-test"),
            ("x-stainless-lang", "python"),
            ("content-type", "application/json"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        strip_request(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "content-type", "x-stainless-lang"]);
        assert_eq!(h["authorization"], "Bearer sk-test");
    }
}
