//! Header hygiene for both directions.
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and every header it names,
//! `Proxy-Connection`, `Keep-Alive`, `TE`, `Transfer-Encoding`, `Upgrade`, plus the
//! proxy-authentication pair, which addresses a proxy and not the provider) describe one
//! connection and never cross abridge. `x-abridge-*` headers are abridge's own interface:
//! the client's are consumed here, and a provider cannot inject any into a response.
//! `Host` is set from the upstream URL by the HTTP client.
//!
//! [`Credentials`] are what is left of a request's credential headers once it has been
//! prepared for the provider: they name the tenant (identity) and authorise summary
//! calls to the main upstream on the client's behalf.

use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue, header};

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

/// Headers that select an account under a credential: part of the tenant, and sent
/// with summary calls to the main upstream (never to a separate summary provider).
static ACCOUNT_HEADERS: [HeaderName; 2] = [
    HeaderName::from_static("openai-organization"),
    HeaderName::from_static("openai-project"),
];

/// The credential headers of a request (the configured tenant headers and the account
/// headers), read after hop-by-hop stripping so that `Connection: authorization` cannot
/// change who a request belongs to. `Debug` shows header names, never values.
#[derive(Clone, Default)]
pub struct Credentials {
    headers: HeaderMap,
}

/// A copy of `value` in an allocation of its own. A parsed header's value is a slice
/// of the connection's read buffer (8 KiB); credentials are kept for as long as the
/// request's response streams (for the summary call that may follow), and a clone
/// would keep that buffer alive with them.
fn owned(value: &HeaderValue) -> HeaderValue {
    let mut copy = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
    copy.set_sensitive(value.is_sensitive());
    copy
}

impl Credentials {
    /// The credentials among `headers` (already stripped for the upstream), looking for
    /// `tenant_headers`.
    pub fn from_headers<'n>(
        headers: &HeaderMap,
        tenant_headers: impl IntoIterator<Item = &'n HeaderName>,
    ) -> Self {
        let mut out = HeaderMap::new();
        for name in tenant_headers.into_iter().chain(&ACCOUNT_HEADERS) {
            for value in headers.get_all(name) {
                out.append(name.clone(), owned(value));
            }
        }
        Self { headers: out }
    }

    /// Whether the request carried none.
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty()
    }

    /// The headers, to send with a summary call to the main upstream.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The tenant's bytes: every credential header's name and value, length-framed, in
    /// a fixed order (so `x-api-key: K` and `Authorization: K` are different tenants,
    /// and no two sets of headers frame to the same bytes). Empty without credentials.
    pub fn tenant(&self) -> Vec<u8> {
        let mut names: Vec<&HeaderName> = self.headers.keys().collect();
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        let mut out = Vec::new();
        let mut frame = |bytes: &[u8]| {
            out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            out.extend_from_slice(bytes);
        };
        for name in names {
            for value in self.headers.get_all(name) {
                frame(name.as_str().as_bytes());
                frame(value.as_bytes());
            }
        }
        out
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.headers.keys().map(|k| format!("{k}: *****")))
            .finish()
    }
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

    fn credentials(pairs: &[(&'static str, &'static str)]) -> Credentials {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let names = ["authorization", "x-api-key", "api-key"].map(HeaderName::from_static);
        Credentials::from_headers(&h, &names)
    }

    #[test]
    fn the_tenant_is_every_credential_header_whichever_carries_it() {
        let bearer = credentials(&[("authorization", "Bearer K")]);
        let anthropic = credentials(&[("x-api-key", "K")]);
        let azure = credentials(&[("api-key", "K")]);
        let other = credentials(&[("x-api-key", "L")]);
        let tenants = [&bearer, &anthropic, &azure, &other].map(Credentials::tenant);
        for (i, a) in tenants.iter().enumerate() {
            assert!(!a.is_empty());
            for b in &tenants[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // Other headers are not part of it; the account headers are.
        let with_noise = credentials(&[("x-api-key", "K"), ("user-agent", "sdk/1")]);
        assert_eq!(with_noise.tenant(), anthropic.tenant());
        let with_org = credentials(&[("x-api-key", "K"), ("openai-organization", "org-1")]);
        assert_ne!(with_org.tenant(), anthropic.tenant());
        assert!(credentials(&[("user-agent", "x")]).is_empty());
        assert!(credentials(&[]).tenant().is_empty());
        // Values never print.
        assert!(!format!("{anthropic:?}").contains('K'));
    }

    #[test]
    fn a_connection_header_cannot_change_the_tenant_after_stripping() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer K"));
        h.insert("connection", HeaderValue::from_static("authorization"));
        strip_request(&mut h);
        let names = [HeaderName::from_static("authorization")];
        // The provider will not see the credential either: no tenant.
        assert!(Credentials::from_headers(&h, &names).is_empty());
    }
}
