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
//! prepared for the provider: they name the tenant (identity), the payer (the
//! credential the route's [`Provider`] authenticates: whose summaries and budget), and
//! authorise summary calls to that provider on the client's behalf.

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

/// Whose API a request speaks, by its credential style and route: Anthropic's (it
/// goes to `anthropic_upstream` when that is set), or the main upstream's
/// (OpenAI-compatible, Azure). Decides where it goes (see `upstream::Upstream::route`)
/// and which credential is its payer ([`Credentials::payer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Provider {
    #[default]
    Main,
    Anthropic,
}

/// Anthropic's API key header.
static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
/// Sent by every Anthropic client (SDKs, Claude Code), with an API key or OAuth.
static ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");
/// Azure OpenAI's API key header.
static API_KEY: HeaderName = HeaderName::from_static("api-key");

/// Whether a request carries Anthropic's credential style: `x-api-key`, or the
/// `anthropic-version` every Anthropic client sends beside its credential (Claude Code
/// signed in with OAuth sends `Authorization: Bearer` with it).
pub fn anthropic_style(headers: &HeaderMap) -> bool {
    headers.contains_key(&X_API_KEY)
        || headers.contains_key(&ANTHROPIC_VERSION)
        || headers
            .get(header::AUTHORIZATION)
            .is_some_and(|v| bearer(v.as_bytes()).is_some_and(|t| t.starts_with(b"sk-ant-")))
}

/// The token of a `Bearer` credential (the scheme in any case, spaces around it).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    let (scheme, token) = value.split_at(value.iter().position(|b| *b == b' ')?);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| token.trim_ascii())
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
    /// Anthropic's protocol headers (`anthropic-version`, `anthropic-beta`): not part of
    /// the tenant, but a summary asked of Anthropic's API needs them as the client sent
    /// them (OAuth is a beta).
    protocol: HeaderMap,
}

/// Anthropic's protocol headers kept for summary calls (see [`Credentials`]).
static PROTOCOL_HEADERS: [HeaderName; 2] = [
    HeaderName::from_static("anthropic-version"),
    HeaderName::from_static("anthropic-beta"),
];

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
        let copy = |names: &mut dyn Iterator<Item = &HeaderName>| {
            let mut out = HeaderMap::new();
            for name in names {
                for value in headers.get_all(name) {
                    out.append(name.clone(), owned(value));
                }
            }
            out
        };
        Self {
            headers: copy(&mut tenant_headers.into_iter().chain(&ACCOUNT_HEADERS)),
            protocol: copy(&mut PROTOCOL_HEADERS.iter()),
        }
    }

    /// The protocol headers a summary asked of Anthropic's API carries (see
    /// [`Credentials`]).
    pub fn protocol(&self) -> &HeaderMap {
        &self.protocol
    }

    /// Whether the request carried none.
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty()
    }

    /// Whether the credential is a Claude subscription's OAuth sign-in (an
    /// `sk-ant-oat…` bearer token and no API key), which Anthropic accepts only for
    /// Claude Code's own requests.
    pub fn is_subscription_sign_in(&self) -> bool {
        !self.headers.contains_key(&X_API_KEY)
            && self
                .headers
                .get(header::AUTHORIZATION)
                .and_then(|v| bearer(v.as_bytes()))
                .is_some_and(|t| t.starts_with(b"sk-ant-oat"))
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
        for name in names {
            for value in self.headers.get_all(name) {
                frame(&mut out, name.as_str().as_bytes());
                frame(&mut out, value.as_bytes());
            }
        }
        out
    }

    /// The credential header `provider` reads, and its first value (see
    /// [`Credentials::payer`]).
    fn read_by(&self, provider: Provider, azure: bool) -> Option<(&HeaderName, &HeaderValue)> {
        let names: &[&HeaderName] = match provider {
            Provider::Anthropic => &[&X_API_KEY, &header::AUTHORIZATION],
            Provider::Main if azure => &[&API_KEY, &header::AUTHORIZATION],
            Provider::Main => &[&header::AUTHORIZATION],
        };
        names
            .iter()
            .find_map(|name| Some((*name, self.headers.get(*name)?)))
    }

    /// Only the credential `provider` reads (see [`Credentials::payer`]), for a request
    /// abridge makes on the client's behalf to that same provider (a window ask): no
    /// other header the client sent goes along.
    pub fn for_provider(&self, provider: Provider, azure: bool) -> HeaderMap {
        self.read_by(provider, azure)
            .map(|(name, value)| (name.clone(), value.clone()))
            .into_iter()
            .collect()
    }

    /// The payer's bytes: the credential `provider` authenticates a request by — for
    /// Anthropic `x-api-key`, else `Authorization` (OAuth); for Azure (`azure`) `api-key`,
    /// else `Authorization`; for any other upstream `Authorization` — its first value,
    /// framed as in [`Credentials::tenant`]. A header the provider does not read is not
    /// part of it, so adding one never makes a new payer (with a fresh summary budget).
    /// A request that carries none of them has its tenant (every credential header it
    /// has) as its payer: empty only for a request without any credential.
    pub fn payer(&self, provider: Provider, azure: bool) -> Vec<u8> {
        let mut out = Vec::new();
        match self.read_by(provider, azure) {
            Some((name, value)) => {
                frame(&mut out, name.as_str().as_bytes());
                // `Bearer K`, `bearer K` and `Bearer  K` are one key.
                match bearer(value.as_bytes()) {
                    Some(token) if *name == header::AUTHORIZATION => {
                        frame(&mut out, &[b"Bearer ".as_slice(), token].concat())
                    }
                    _ => frame(&mut out, value.as_bytes()),
                }
            }
            // None of the headers the provider reads: the credentials it was sent with
            // are the payer (never one shared by every such request).
            None => return self.tenant(),
        }
        out
    }
}

/// `bytes`, length-prefixed, onto `out`.
fn frame(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
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
    fn a_request_on_the_clients_behalf_carries_only_the_credential_the_provider_reads() {
        let both = credentials(&[("authorization", "Bearer K"), ("x-api-key", "A")]);
        let main = both.for_provider(Provider::Main, false);
        assert_eq!(main.len(), 1);
        assert_eq!(main["authorization"], "Bearer K");
        let claude = both.for_provider(Provider::Anthropic, false);
        assert_eq!(claude.len(), 1);
        assert_eq!(claude["x-api-key"], "A");
        let azure = credentials(&[("api-key", "Z"), ("x-api-key", "A")]);
        assert_eq!(azure.for_provider(Provider::Main, true)["api-key"], "Z");
        assert!(azure.for_provider(Provider::Main, false).is_empty());
    }

    #[test]
    fn the_payer_is_the_credential_the_provider_reads_and_nothing_else() {
        let key = credentials(&[("authorization", "Bearer K")]);
        let noisy = credentials(&[("authorization", "Bearer K"), ("api-key", "v1")]);
        let noisier = credentials(&[("authorization", "Bearer K"), ("x-api-key", "v2")]);
        let main = |c: &Credentials| c.payer(Provider::Main, false);
        // Different tenants (their state never mixes), one payer.
        assert_ne!(key.tenant(), noisy.tenant());
        assert_eq!(main(&key), main(&noisy));
        assert_eq!(main(&key), main(&noisier));
        // The common case keeps its tenant as its payer (no mark is lost on upgrade).
        assert_eq!(main(&key), key.tenant());
        assert_ne!(
            main(&key),
            main(&credentials(&[("authorization", "Bearer L")]))
        );
        // Anthropic reads x-api-key (else OAuth's Authorization); Azure reads api-key.
        let anthropic = credentials(&[("x-api-key", "A"), ("api-key", "v3")]);
        let other = credentials(&[
            ("x-api-key", "A"),
            ("api-key", "v4"),
            ("authorization", "x"),
        ]);
        let claude = |c: &Credentials| c.payer(Provider::Anthropic, false);
        assert_eq!(claude(&anthropic), claude(&other));
        assert!(!claude(&anthropic).is_empty());
        let oauth = credentials(&[("authorization", "Bearer sk-ant-oat01-1")]);
        assert!(!claude(&oauth).is_empty());
        assert_ne!(claude(&oauth), claude(&anthropic));
        assert_ne!(
            anthropic.payer(Provider::Main, true),
            other.payer(Provider::Main, true)
        );
        // None of the headers the provider reads: not one payer shared by all such.
        assert_eq!(anthropic.payer(Provider::Main, false), anthropic.tenant());
        assert_ne!(
            other.payer(Provider::Main, false),
            anthropic.payer(Provider::Main, false)
        );
        assert!(credentials(&[]).payer(Provider::Main, false).is_empty());
        // One key however the scheme is spelled.
        let spelled = credentials(&[("authorization", "bearer   K")]);
        assert_eq!(main(&spelled), main(&key));
        // Claude subscriptions' OAuth tokens are told apart; an OpenAI-style bearer
        // with an Anthropic key is Anthropic's.
        assert!(oauth.is_subscription_sign_in());
        assert!(!anthropic.is_subscription_sign_in());
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            HeaderValue::from_static("Bearer sk-ant-api03-x"),
        );
        assert!(anthropic_style(&h));
        h.insert(
            "authorization",
            HeaderValue::from_static("Bearer sk-proj-x"),
        );
        assert!(!anthropic_style(&h));
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
