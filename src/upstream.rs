//! The upstream: a pooled HTTP/1.1 client (hyper, rustls with Mozilla's roots) for the
//! configured provider base URL (and, for Anthropic's routes, `anthropic_upstream` when
//! set), with connect and first-byte timeouts.
//!
//! The target is fixed by configuration: a client's path is appended to the base path (or,
//! for Azure's classic `/openai/…` paths, to the base's classic root: see [`crate::azure`])
//! and nothing in a request can change scheme, host or port. Which of the two bases is
//! decided by whose API the request speaks ([`Provider`]): with `anthropic_upstream`
//! set, a request in Anthropic's credential style (`x-api-key`, `anthropic-version`)
//! goes there whatever its path — `/v1/models`, `/v1/files`, `/v1/complete` alike — and
//! so does every `/v1/messages…` path; an Anthropic key never reaches the other
//! provider.

use std::time::Duration;

use axum::body::Body;
use http::uri::{PathAndQuery, Uri};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::azure::{self, Mapped};
use crate::config::{Config, UpstreamBase};
use crate::error::{Error, Shape};
use crate::headers::{self, Provider};

#[derive(Clone)]
pub struct Upstream {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    base: UpstreamBase,
    /// Anthropic's routes go here when set.
    anthropic: Option<UpstreamBase>,
    first_byte: Duration,
}

impl Upstream {
    pub fn new(config: &Config) -> Result<Self, rustls::Error> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(config.timeouts.connect()));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(https);
        Ok(Self {
            client,
            base: config.upstream.clone(),
            anthropic: config.anthropic_upstream.clone(),
            first_byte: config.timeouts.first_byte(),
        })
    }

    pub fn base(&self) -> &UpstreamBase {
        &self.base
    }

    /// Where Anthropic's routes go, when `anthropic_upstream` is set.
    pub fn anthropic_base(&self) -> Option<&UpstreamBase> {
        self.anthropic.as_ref()
    }

    /// Another upstream (e.g. a cheaper summary provider) on the same connection pool.
    pub fn with_base(&self, base: UpstreamBase, first_byte: Duration) -> Self {
        Self {
            client: self.client.clone(),
            base,
            anthropic: None,
            first_byte,
        }
    }

    /// `<base><path>`, for requests abridge makes itself (`path` starts with `/`).
    pub fn endpoint(&self, path: &str) -> Result<Uri, Error> {
        build(&self.base, format!("{}{path}", self.base.path))
    }

    /// The base `provider`'s requests go to.
    fn base_of(&self, provider: Provider) -> &UpstreamBase {
        match (&self.anthropic, provider) {
            (Some(anthropic), Provider::Anthropic) => anthropic,
            _ => &self.base,
        }
    }

    /// `<provider's base><path>`, for requests abridge makes itself.
    pub fn on_base(&self, provider: Provider, path: &str) -> Result<Uri, Error> {
        let base = self.base_of(provider);
        build(base, format!("{}{path}", base.path))
    }

    /// A server's own endpoint beside its API (llama-server's `/props`, Ollama's
    /// `/api/show`): `provider`'s base without its trailing `/v1`, then `path` — so a
    /// server the configuration reaches under a prefix (`http://gw/llama/v1`) is asked
    /// under that prefix (`http://gw/llama/props`), never at the host's root.
    pub fn beside_api(&self, provider: Provider, path: &str) -> Result<Uri, Error> {
        let base = self.base_of(provider);
        let prefix = base.path.trim_end_matches('/');
        let prefix = match prefix.len().checked_sub(3) {
            Some(at) if prefix[at..].eq_ignore_ascii_case("/v1") => &prefix[..at],
            _ => prefix,
        };
        build(base, format!("{prefix}{path}"))
    }

    /// `<classic root><path>` (`path` starts with `/`), for requests abridge makes itself
    /// on Azure's classic API; an error when the base is not an Azure v1 base.
    pub fn classic_endpoint(&self, path: &str) -> Result<Uri, Error> {
        let root = azure::classic_root(&self.base.path).ok_or(Error::NotAzure {
            method: "POST".to_owned(),
            path: path.to_owned(),
        })?;
        build(&self.base, format!("{root}{path}"))
    }

    /// Whether the main upstream is an Azure v1 base (its credential is `api-key`).
    pub fn is_azure(&self) -> bool {
        azure::classic_root(&self.base.path).is_some()
    }

    /// Whose API a request speaks: Anthropic's on its routes (`/v1/messages…`) or in its
    /// credential style, else the main upstream's.
    pub fn provider_of(path: &str, request: &http::HeaderMap) -> Provider {
        if Shape::for_path(path) == Shape::Anthropic || headers::anthropic_style(request) {
            Provider::Anthropic
        } else {
            Provider::Main
        }
    }

    /// Where a client request goes (see the module docs) and whose API it speaks.
    pub fn route(
        &self,
        method: &http::Method,
        uri: &Uri,
        request: &http::HeaderMap,
    ) -> Result<(Uri, Provider), Error> {
        let provider = Self::provider_of(uri.path(), request);
        Ok((self.uri_on(self.base_of(provider), method, uri)?, provider))
    }

    /// The upstream URI on `base` for a client request URI: `/v1/<rest>?<query>` (or
    /// Azure's `/openai/v1/<rest>`) becomes `<base>/<rest>?<query>`, and Azure's classic
    /// `/openai/<rest>` becomes `<classic root>/<rest>?<query>` (see [`crate::azure`]).
    /// Other paths are unknown (404); segments that could climb out of the base path or
    /// be read differently upstream are refused (400; see [`is_unsafe_segment`]).
    fn uri_on(&self, base: &UpstreamBase, method: &http::Method, uri: &Uri) -> Result<Uri, Error> {
        let path = uri.path();
        let (root, rest) = match azure::map(path) {
            Mapped::Base(rest) => (base.path.as_str(), rest),
            Mapped::Classic(rest) => match azure::classic_root(&base.path) {
                Some(root) => (root, rest),
                None => {
                    return Err(Error::NotAzure {
                        method: method.to_string(),
                        path: path.to_owned(),
                    });
                }
            },
            Mapped::Unknown => {
                return Err(Error::NotFound {
                    method: method.to_string(),
                    path: path.to_owned(),
                });
            }
        };
        if !is_safe_rest(rest) {
            return Err(Error::BadPath);
        }
        let mut target =
            String::with_capacity(root.len() + rest.len() + 1 + uri.query().map_or(0, str::len));
        target.push_str(root);
        target.push_str(rest);
        if target.is_empty() {
            target.push('/');
        }
        if let Some(query) = uri.query() {
            target.push('?');
            target.push_str(query);
        }
        build(base, target)
    }

    /// Sends a request and waits for the response headers, at most
    /// `timeouts.first_byte_ms`. Dropping the returned future (client gone) drops the
    /// upstream connection with it.
    pub async fn send(&self, request: Request<Body>) -> Result<Response<Incoming>, Error> {
        match tokio::time::timeout(self.first_byte, self.client.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(Error::UpstreamUnreachable(error_chain(&e))),
            Err(_) => Err(Error::UpstreamTimeout(self.first_byte)),
        }
    }
}

/// `path_and_query` on `base`'s scheme and authority.
fn build(base: &UpstreamBase, path_and_query: String) -> Result<Uri, Error> {
    let path_and_query = PathAndQuery::try_from(path_and_query).map_err(|_| Error::BadPath)?;
    Uri::builder()
        .scheme(base.scheme.clone())
        .authority(base.authority.clone())
        .path_and_query(path_and_query)
        .build()
        .map_err(|e| Error::Internal(format!("building upstream URI: {e}")))
}

/// Whether the part of a path appended to the base is safe to send: no segment is
/// unsafe (see [`is_unsafe_segment`]) and none is empty but a trailing one (`a//b` is
/// read as `a/b` by some servers and as a different resource by others).
fn is_safe_rest(rest: &str) -> bool {
    let mut segments = rest.split('/').skip(1).peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        if (segment.is_empty() && !last) || is_unsafe_segment(segment) {
            return false;
        }
    }
    true
}

/// Whether a path segment could climb out of the base path or be read differently by
/// the upstream than by abridge: `.`/`..` once percent-decoded (`%2e%2e`), a segment
/// holding an encoded `/` or `\` (`..%2f`, `%5c`), a raw backslash, a `;` parameter
/// (`..;` reaches the parent on servlet-style servers), an encoded NUL, an escape that
/// is not two hex digits, or one that decodes to another escape (`%252e`: a server or
/// gateway that decodes twice reads `.`). An ordinary segment costs one scan and no
/// allocation.
fn is_unsafe_segment(segment: &str) -> bool {
    let bytes = segment.as_bytes();
    if !bytes
        .iter()
        .any(|b| matches!(b, b'.' | b'%' | b'\\' | b';'))
    {
        return false;
    }
    if bytes.iter().any(|b| matches!(b, b'\\' | b';')) {
        return true;
    }
    // Percent-decode (once, as a server would) and look at what it spells.
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |b: u8| (b as char).to_digit(16);
            let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            ) else {
                return true;
            };
            decoded.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    let escape_left = decoded
        .windows(3)
        .any(|w| w[0] == b'%' && w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit());
    decoded == b"."
        || decoded == b".."
        || escape_left
        || decoded.iter().any(|b| matches!(b, b'/' | b'\\' | b';' | 0))
}

/// An error with its causes, for a message that says what actually happened
/// ("connection refused") and not only the outermost layer ("client error (Connect)").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn upstream(base: &str) -> Upstream {
        let config = Config {
            upstream: base.parse().unwrap(),
            ..Config::default()
        };
        Upstream::new(&config).unwrap()
    }

    fn target(base: &str, uri: &str) -> Result<String, Error> {
        upstream(base)
            .route(
                &Method::POST,
                &uri.parse().unwrap(),
                &http::HeaderMap::new(),
            )
            .map(|(u, _)| u.to_string())
    }

    /// An upstream with an Anthropic base of its own, and where it sends `uri` with
    /// the headers `pairs`.
    fn routed(
        uri: &str,
        pairs: &[(&'static str, &'static str)],
    ) -> Result<(String, Provider), Error> {
        let config = Config {
            upstream: "https://api.openai.com/v1".parse().unwrap(),
            anthropic_upstream: Some("https://api.anthropic.com/v1".parse().unwrap()),
            ..Config::default()
        };
        let upstream = Upstream::new(&config).unwrap();
        let mut headers = http::HeaderMap::new();
        for (k, v) in pairs {
            headers.insert(*k, http::HeaderValue::from_static(v));
        }
        upstream
            .route(&Method::POST, &uri.parse().unwrap(), &headers)
            .map(|(u, p)| (u.to_string(), p))
    }

    #[test]
    fn anthropic_credentials_go_to_anthropic_whatever_the_path() {
        // Anthropic's credential style goes to Anthropic whatever the path: its key never
        // reaches the other provider.
        for (uri, pairs) in [
            ("/v1/models", &[("x-api-key", "sk-ant")][..]),
            ("/v1/models/claude-x", &[("x-api-key", "sk-ant")]),
            ("/v1/files", &[("x-api-key", "sk-ant")]),
            ("/v1/complete", &[("x-api-key", "sk-ant")]),
            ("/v1/%6dessages", &[("x-api-key", "sk-ant")]),
            ("/v1/chat/completions", &[("x-api-key", "sk-ant")]),
            (
                "/v1/models",
                &[
                    ("authorization", "Bearer oat"),
                    ("anthropic-version", "2023-06-01"),
                ],
            ),
        ] {
            let (to, provider) = routed(uri, pairs).unwrap();
            assert!(
                to.starts_with("https://api.anthropic.com/v1/"),
                "{uri}: {to}"
            );
            assert_eq!(provider, Provider::Anthropic);
        }
        assert!(matches!(
            routed("/v1//messages", &[("x-api-key", "k")]),
            Err(Error::BadPath)
        ));
        // Azure's classic paths are not Anthropic's: refused rather than sent.
        assert!(
            routed(
                "/openai/deployments/d/chat/completions",
                &[("x-api-key", "k")]
            )
            .is_err()
        );
        assert_eq!(
            routed("/v1/models", &[("authorization", "Bearer sk")]).unwrap(),
            (
                "https://api.openai.com/v1/models".to_owned(),
                Provider::Main
            )
        );
    }

    #[test]
    fn anthropic_routes_go_to_their_own_upstream_when_set() {
        let target = |uri: &str| routed(uri, &[]).unwrap().0;
        assert_eq!(
            target("/v1/messages?beta=true"),
            "https://api.anthropic.com/v1/messages?beta=true"
        );
        assert_eq!(
            target("/v1/messages/count_tokens"),
            "https://api.anthropic.com/v1/messages/count_tokens"
        );
        assert_eq!(
            target("/v1/responses"),
            "https://api.openai.com/v1/responses"
        );
        assert_eq!(
            target("/v1/messagesx"),
            "https://api.openai.com/v1/messagesx"
        );
        // Unset, everything goes to the one upstream.
        assert_eq!(
            super::tests::target("https://api.openai.com/v1", "/v1/messages").unwrap(),
            "https://api.openai.com/v1/messages"
        );
    }

    #[test]
    fn a_servers_own_endpoints_are_beside_its_api_under_the_configured_prefix() {
        let beside = |base: &str| {
            upstream(base)
                .beside_api(Provider::Main, "/props")
                .unwrap()
                .to_string()
        };
        assert_eq!(
            beside("http://127.0.0.1:8080/v1"),
            "http://127.0.0.1:8080/props"
        );
        assert_eq!(
            beside("http://127.0.0.1:8080/v1/"),
            "http://127.0.0.1:8080/props"
        );
        assert_eq!(
            beside("http://gw:8080/llama/v1"),
            "http://gw:8080/llama/props"
        );
        assert_eq!(beside("http://gw:8080/llama"), "http://gw:8080/llama/props");
        assert_eq!(beside("http://gw:8080"), "http://gw:8080/props");
    }

    #[test]
    fn appends_the_path_after_v1_to_the_base() {
        assert_eq!(
            target("https://api.openai.com/v1", "/v1/chat/completions").unwrap(),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            target("https://openrouter.ai/api/v1", "/v1/models?limit=2").unwrap(),
            "https://openrouter.ai/api/v1/models?limit=2"
        );
        assert_eq!(
            target("http://127.0.0.1:9/", "/v1/models").unwrap(),
            "http://127.0.0.1:9/models"
        );
        assert_eq!(
            target("http://127.0.0.1:9/v1", "/v1").unwrap(),
            "http://127.0.0.1:9/v1"
        );
    }

    #[test]
    fn azure_paths_keep_their_path_below_an_azure_v1_base() {
        let azure = "https://res.openai.azure.com/openai/v1";
        assert_eq!(
            target(
                azure,
                "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"
            )
            .unwrap(),
            "https://res.openai.azure.com/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(
            target(azure, "/openai/v1/chat/completions").unwrap(),
            "https://res.openai.azure.com/openai/v1/chat/completions"
        );
        assert_eq!(
            target(azure, "/v1/responses?api-version=preview").unwrap(),
            "https://res.openai.azure.com/openai/v1/responses?api-version=preview"
        );
        assert_eq!(
            target(
                "https://gw.example/team/openai/v1",
                "/openai/models?api-version=1"
            )
            .unwrap(),
            "https://gw.example/team/openai/models?api-version=1"
        );
        // The v1 base is another spelling of /v1 on any upstream; the classic paths
        // need an Azure base.
        assert_eq!(
            target("https://api.openai.com/v1", "/openai/v1/models").unwrap(),
            "https://api.openai.com/v1/models"
        );
        assert!(matches!(
            target(
                "https://api.openai.com/v1",
                "/openai/deployments/d/chat/completions"
            ),
            Err(Error::NotAzure { .. })
        ));
        assert!(matches!(
            target(azure, "/openai/deployments/..%2f..%2fx/chat/completions"),
            Err(Error::BadPath)
        ));
        assert!(matches!(
            target(azure, "/openai"),
            Err(Error::NotFound { .. })
        ));
        assert_eq!(
            upstream(azure)
                .classic_endpoint("/deployments/d/chat/completions?api-version=v")
                .unwrap()
                .to_string(),
            "https://res.openai.azure.com/openai/deployments/d/chat/completions?api-version=v"
        );
    }

    #[test]
    fn refuses_paths_outside_v1_and_dot_segments() {
        assert!(matches!(
            target("https://a/v1", "/v2/models"),
            Err(Error::NotFound { .. })
        ));
        assert!(matches!(
            target("https://a/v1", "/v1models"),
            Err(Error::NotFound { .. })
        ));
        assert!(matches!(
            target("https://a/v1", "/admin"),
            Err(Error::NotFound { .. })
        ));
        assert!(matches!(
            target("https://a/v1", "/v1/../admin"),
            Err(Error::BadPath)
        ));
        for bad in [
            "/v1/%2E%2e/x",
            "/v1/..;/admin",
            "/v1/models;jsessionid=1",
            "/v1/..%2fadmin",
            "/v1/%2e%2e%2fadmin",
            "/v1/..%5cadmin",
            "/v1/a%2Fb",
            "/v1/a\\b",
            "/v1/%00",
            "/v1/%zz",
            "/v1/%2",
            "/v1/.",
        ] {
            assert!(
                matches!(target("https://a/v1", bad), Err(Error::BadPath)),
                "{bad}"
            );
        }
        // Ordinary dots and escapes pass unchanged.
        for good in [
            "/v1/files/report.v2.json",
            "/v1/models/ft%3Agpt-4o%3Aacme",
            "/v1/a...b",
            "/v1/.well-known",
        ] {
            assert!(target("https://a/v1", good).is_ok(), "{good}");
        }
        // Double encodings and empty segments are refused; a trailing slash is not.
        for bad in [
            "/v1/%252e%252e/admin",
            "/v1/%252E",
            "/v1/files/%25%32%65",
            "/v1//messages",
            "/v1//evil.example/x",
            "/v1/models//x",
        ] {
            assert!(
                matches!(target("https://a/v1", bad), Err(Error::BadPath)),
                "{bad}"
            );
        }
        for good in ["/v1/models/", "/v1/files/100%25", "/v1/a%25zz"] {
            assert!(target("https://a/v1", good).is_ok(), "{good}");
        }
    }
}
