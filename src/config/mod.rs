//! Configuration: one TOML file (optional) overlaid by `ABRIDGE_*` environment variables,
//! deserialised once and validated once.
//!
//! Every key has a default, so abridge starts with no file at all. `config/abridge.toml`
//! in the repository lists every key with its default and a comment; a unit test keeps
//! that file and [`Config::default`] equal.
//!
//! Environment variables: `ABRIDGE_` + the key path in upper case, `__` between levels,
//! e.g. `ABRIDGE_ADMIN__TOKEN`, `ABRIDGE_TIMEOUTS__CONNECT_MS`. An environment value is
//! read as text and converted to the type of the key it sets (the defaults tell which),
//! so a token of digits stays the exact string it was and a port is checked as a number.
//!
//! Unknown keys are errors that name the key and where it came from (the file or the
//! variable): a typo must not silently run with a default.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use http::uri::{Authority, Scheme, Uri};
use serde::{Deserialize, Serialize};

use crate::secret::Secret;

mod compaction;
mod load;
mod log;
mod provider_apis;
mod recall;
#[cfg(test)]
mod tests;
mod tls;

pub use compaction::{CompactionConfig, CompactionMode, Policy};
pub use load::ConfigError;
pub use log::{LogConfig, LogFilter, LogFormat};
pub use provider_apis::{Compaction as ProviderCompaction, ProviderApisConfig};
pub use recall::{Offer as RecallOffer, RecallConfig};
pub use tls::{PemFile, RedisTls, is_tls_url};

/// Prefix of every environment variable abridge reads as configuration.
pub const ENV_PREFIX: &str = "ABRIDGE_";

/// The shortest admin token accepted.
pub const MIN_ADMIN_TOKEN: usize = 16;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address the proxy listens on. Clients use `http://<listen>/v1` as their base URL.
    pub listen: SocketAddr,
    /// The provider's base URL as its SDKs know it, including `/v1`. For Azure OpenAI,
    /// the resource's v1 base, `https://RESOURCE.openai.azure.com/openai/v1`: then
    /// Azure's classic `/openai/deployments/…` paths are served too (see `azure`).
    pub upstream: UpstreamBase,
    /// Where Anthropic's routes (`/v1/messages` and below) go instead, including `/v1`
    /// (e.g. `https://api.anthropic.com/v1`), so one abridge serves OpenAI-compatible
    /// clients and Claude Code at once. Unset: every route goes to `upstream`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anthropic_upstream: Option<UpstreamBase>,
    pub admin: AdminConfig,
    pub timeouts: Timeouts,
    pub limits: Limits,
    pub log: LogConfig,
    pub identity: IdentityConfig,
    pub store: StoreConfig,
    pub compaction: CompactionConfig,
    /// Parameters of the strategies (see `compact::Settings`).
    pub strategies: crate::strategies::Settings,
    pub summary: SummaryConfig,
    pub recall: RecallConfig,
    /// Which provider APIs abridge serves for an upstream that lacks them.
    pub provider_apis: ProviderApisConfig,
    /// Prices by model name prefix, US dollars per million tokens, overriding and
    /// extending the built-in table (see `prices`).
    pub prices: std::collections::BTreeMap<String, crate::prices::Price>,
}

/// The summariser used by the `structured` and `llm_replace` strategies.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SummaryConfig {
    /// Model for summaries. Empty: the model of the request being compacted.
    pub model: String,
    /// A separate (e.g. cheaper) provider for summaries, base URL with `/v1`. Unset: the
    /// main upstream, called with the client's own credentials. When set, the client's
    /// credentials are never sent there; `api_key` is used instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamBase>,
    /// Bearer key for `upstream` (unset: no Authorization, e.g. a local server).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<Secret>,
    /// Longest wait for a summary; then the strategy falls back.
    pub timeout_ms: u64,
    /// Sampling temperature for summaries (low: faithful, repeatable).
    pub temperature: f64,
    /// Summary tokens (prompt bytes / 4 plus the answer's cap) per tenant (credential)
    /// and minute, per process. A conversation's first summary is not refused for what
    /// the tenant's other conversations spent (up to a second minute's overdraft); a
    /// refused update is built in the background once the budget refills.
    pub max_tokens_per_tenant_per_minute: u64,
    /// Summary calls per tenant and minute, per process, besides the tokens (0: not
    /// counted).
    pub max_per_tenant_per_minute: u32,
}

impl Default for SummaryConfig {
    fn default() -> Self {
        Self {
            model: String::new(),
            upstream: None,
            api_key: None,
            timeout_ms: 60_000,
            temperature: 0.2,
            max_tokens_per_tenant_per_minute: 400_000,
            max_per_tenant_per_minute: 0,
        }
    }
}

impl SummaryConfig {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdentityConfig {
    /// Server secret that keys conversation namespaces. Unset: abridge creates one and
    /// keeps it in the store, so every replica sharing the store uses the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret>,
    /// The request headers that carry a tenant's credential, whichever a client uses
    /// (`Authorization`, Anthropic's `x-api-key`, Azure's `api-key`, Google's
    /// `x-goog-api-key`); all that are present, with their names, make the tenant. Read
    /// after hop-by-hop headers are removed.
    pub tenant_headers: Vec<HeaderName>,
    /// What a request with none of them gets: `shared` — one namespace for all such
    /// requests (a single-user local provider that takes no key), or `none` — no
    /// conversation state at all (forwarded as sent, never compacted).
    pub anonymous: Anonymous,
}

/// See [`IdentityConfig::anonymous`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Anonymous {
    Shared,
    None,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// A Redis URL (`redis://[:password@]host:port[/db]`, `rediss://` for TLS: see
    /// `tls`). With none of this, `redis_cluster` and `sentinel.nodes`, the in-process
    /// store is used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<Secret>,
    /// Redis Cluster node URLs (any subset of the nodes; the rest is discovered).
    pub redis_cluster: Vec<Secret>,
    /// Redis behind Sentinel: the master is found through the sentinels.
    pub sentinel: SentinelConfig,
    /// TLS to Redis, for `rediss://` URLs (single, Cluster, Sentinel alike).
    pub tls: RedisTls,
    /// Prefix of every key abridge writes.
    pub key_prefix: String,
    /// Lifetime of a conversation's keys, refreshed whenever it is used.
    pub ttl_secs: u64,
    /// Checkpoints kept per conversation (the shallowest go first).
    pub max_checkpoints: usize,
    /// Longest wait for a store answer before the request goes on without it.
    pub response_timeout_ms: u64,
    /// Longest wait for a connection to the store.
    pub connect_timeout_ms: u64,
    /// In-process store only: conversations kept at most (least recently used go first).
    pub memory_max_conversations: usize,
    /// In-process store only: bytes of checkpoints kept at most (least recently used
    /// conversations go first).
    pub memory_max_bytes: usize,
}

/// Redis behind Sentinel (`store.sentinel`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SentinelConfig {
    /// Sentinel URLs (`redis://host:26379`, with credentials when the sentinels need
    /// them). `rediss://`: TLS to the sentinels and to the master they name, and then
    /// every URL carries the same credentials. Empty: Sentinel is not used.
    pub nodes: Vec<Secret>,
    /// The name the sentinels monitor the master under (`sentinel monitor <name> …`).
    pub master: String,
    /// The master's own ACL user, when it needs one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// The master's own password (`requirepass` or the ACL user's), when it needs one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<Secret>,
}

impl Default for SentinelConfig {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            master: "mymaster".to_owned(),
            username: None,
            password: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Address of the admin listener (health, readiness, metrics, admin API). Keep it private.
    pub listen: SocketAddr,
    /// Bearer token for `/admin/*` (at least 16 characters, and not easy to guess: see
    /// `load::weak_token`). Unset means the admin API answers 403.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// Wrong admin tokens one client address may present per minute; beyond it, its
    /// further wrong tokens are answered 429 until the minute is over (the right token
    /// is always let in).
    pub auth_failures_per_minute: u32,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// TCP (and TLS) connect to the provider.
    pub connect_ms: u64,
    /// From sending the request to the provider's response headers. Non-streaming
    /// completions send headers only when generation is done, so this is generous.
    pub first_byte_ms: u64,
    /// Longest silence between two chunks of a response body before the stream is cut.
    pub stream_idle_ms: u64,
    /// On SIGTERM/SIGINT: how long in-flight requests may take to finish.
    pub shutdown_grace_ms: u64,
    /// A client's request head must arrive within this, from its first byte (both
    /// listeners).
    pub client_header_ms: u64,
    /// A keep-alive connection may wait this long for its next request; a response the
    /// client stops reading is dropped after this long without progress.
    pub client_idle_ms: u64,
    /// A request body abridge reads whole must arrive within this; a body streamed
    /// through may pause this long between two chunks.
    pub client_body_ms: u64,
    /// A body streamed through (an upload to `/v1/files`, …) must arrive whole within
    /// this, however steadily it trickles.
    pub passthrough_body_ms: u64,
    /// A response stream abridge relays lasts at most this long, then it is cut as an
    /// upstream error (0: no limit; `stream_idle_ms` still cuts a silent one).
    pub max_stream_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest chat request body abridge reads (it must read it whole to parse it).
    /// Other routes stream their bodies and leave limits to the provider.
    pub max_body_bytes: usize,
    /// Most bytes a compressed provider response may decode to on the routes abridge
    /// reads; beyond it the response is cut as an upstream error.
    pub max_decoded_bytes: usize,
    /// Decoded chunks of compressed provider responses in flight at once, in all (each
    /// response holds at most one, about half a megabyte, until the client takes it);
    /// a response that finds none free waits for one.
    pub max_inflight_decoded_bytes: usize,
    /// Request bodies abridge holds at once (read whole, or kept for a background
    /// compaction), in bytes; beyond it, a request is answered 503.
    pub max_inflight_body_bytes: usize,
    /// Open connections on the proxy listener at most; beyond it, 503.
    pub max_connections: usize,
    /// Requests being served on the proxy listener at most; beyond it, 503.
    pub max_inflight_requests: usize,
    /// The same two for the admin listener.
    pub admin_max_connections: usize,
    pub admin_max_inflight_requests: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            upstream: UpstreamBase::from_str("https://api.openai.com/v1")
                .unwrap_or_else(|e| unreachable!("default upstream is valid: {e}")),
            anthropic_upstream: None,
            admin: AdminConfig::default(),
            timeouts: Timeouts::default(),
            limits: Limits::default(),
            log: LogConfig::default(),
            identity: IdentityConfig::default(),
            store: StoreConfig::default(),
            compaction: CompactionConfig::default(),
            strategies: crate::strategies::Settings::default(),
            summary: SummaryConfig::default(),
            recall: RecallConfig::default(),
            provider_apis: ProviderApisConfig::default(),
            prices: std::collections::BTreeMap::new(),
        }
    }
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            secret: None,
            tenant_headers: ["authorization", "x-api-key", "api-key", "x-goog-api-key"]
                .into_iter()
                .map(|h| HeaderName(http::HeaderName::from_static(h)))
                .collect(),
            anonymous: Anonymous::Shared,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            redis_url: None,
            redis_cluster: Vec::new(),
            sentinel: SentinelConfig::default(),
            tls: RedisTls::default(),
            key_prefix: "abridge".to_owned(),
            ttl_secs: 7 * 24 * 3600,
            max_checkpoints: 8,
            response_timeout_ms: 200,
            connect_timeout_ms: 1000,
            memory_max_conversations: 100_000,
            memory_max_bytes: 256 * 1024 * 1024,
        }
    }
}

impl StoreConfig {
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_secs)
    }
    pub fn response_timeout(&self) -> Duration {
        Duration::from_millis(self.response_timeout_ms)
    }
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            token: None,
            auth_failures_per_minute: 10,
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect_ms: 10_000,
            first_byte_ms: 600_000,
            stream_idle_ms: 300_000,
            shutdown_grace_ms: 30_000,
            client_header_ms: 15_000,
            client_idle_ms: 75_000,
            client_body_ms: 60_000,
            passthrough_body_ms: 900_000,
            max_stream_ms: 0,
        }
    }
}

impl Timeouts {
    pub fn connect(&self) -> Duration {
        Duration::from_millis(self.connect_ms)
    }
    pub fn first_byte(&self) -> Duration {
        Duration::from_millis(self.first_byte_ms)
    }
    pub fn stream_idle(&self) -> Duration {
        Duration::from_millis(self.stream_idle_ms)
    }
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }
    pub fn client_header(&self) -> Duration {
        Duration::from_millis(self.client_header_ms)
    }
    pub fn client_idle(&self) -> Duration {
        Duration::from_millis(self.client_idle_ms)
    }
    pub fn client_body(&self) -> Duration {
        Duration::from_millis(self.client_body_ms)
    }
    pub fn passthrough_body(&self) -> Duration {
        Duration::from_millis(self.passthrough_body_ms)
    }
    /// `None`: streams are not limited in length.
    pub fn max_stream(&self) -> Option<Duration> {
        (self.max_stream_ms > 0).then(|| Duration::from_millis(self.max_stream_ms))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 32 * 1024 * 1024,
            max_decoded_bytes: 64 * 1024 * 1024,
            max_inflight_decoded_bytes: 32 * 1024 * 1024,
            max_inflight_body_bytes: 512 * 1024 * 1024,
            max_connections: 8192,
            max_inflight_requests: 4096,
            admin_max_connections: 64,
            admin_max_inflight_requests: 32,
        }
    }
}

/// The provider base URL, split once at load time: scheme, authority and the path prefix
/// (without trailing slash) that the part of a client's path after `/v1` is appended to.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamBase {
    pub scheme: Scheme,
    pub authority: Authority,
    /// e.g. `/v1`, `/api/v1`, or empty.
    pub path: String,
}

impl FromStr for UpstreamBase {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let uri: Uri = s.parse().map_err(|e| format!("`{s}` is not a URL: {e}"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| format!("`{s}` has no scheme; write e.g. https://api.openai.com/v1"))?;
        if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
            return Err(format!(
                "`{s}`: only http and https upstreams are supported"
            ));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("`{s}` has no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!(
                "`{s}`: credentials in the upstream URL are not supported; clients send their own"
            ));
        }
        if uri.query().is_some() {
            return Err(format!("`{s}`: the upstream base URL cannot carry a query"));
        }
        let path = uri.path().trim_end_matches('/').to_owned();
        Ok(Self {
            scheme,
            authority,
            path,
        })
    }
}

impl fmt::Display for UpstreamBase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.path)
    }
}

impl fmt::Debug for UpstreamBase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

impl<'de> Deserialize<'de> for UpstreamBase {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for UpstreamBase {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// An HTTP header name, checked at load time (stored lower-case).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderName(pub http::HeaderName);

impl<'de> Deserialize<'de> for HeaderName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        http::HeaderName::from_bytes(s.trim().as_bytes())
            .map(HeaderName)
            .map_err(|_| serde::de::Error::custom(format!("`{s}` is not a valid header name")))
    }
}

impl Serialize for HeaderName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.as_str())
    }
}

impl Serialize for Secret {
    /// A serialised config is for types (see [`Config::from_sources`]) and for showing the
    /// effective configuration (`--check-config`): the value stays masked.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.masked())
    }
}
