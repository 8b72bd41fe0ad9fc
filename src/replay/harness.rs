//! abridge serving on loopback for one input of `abridge replay`: the real request path,
//! with the run's configuration, in front of the simulated provider ([`Simulated`]); a
//! client that sends the input's turns; and the wait, between turns, for abridge to finish
//! with the last one (its usage recorded, background compactions done), as a user's think
//! time would allow.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::net::TcpListener;

use super::provider::Simulated;
use crate::config::Config;
use crate::formats::Format;
use crate::prices::Prices;
use crate::secret::Secret;
use crate::{AppState, Listeners};

/// abridge and the simulated provider, running.
pub(super) struct Harness {
    pub provider: Simulated,
    pub prices: Prices,
    /// `summary.model`, when set (else the request's model summarises).
    pub summary_model: Option<String>,
    pub max_tokens: u64,
    state: AppState,
    url: String,
    client: Client<HttpConnector, Full<Bytes>>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Answers that carried usage: abridge reads each one's after the client has it.
    answered: AtomicU64,
}

/// What abridge answered a turn.
pub(super) struct Answer {
    pub status: u16,
    pub compacted: bool,
    /// Why the cost policy compacted the request, or did not (`x-abridge-reason`).
    pub reason: Option<String>,
    /// What abridge told the client beside the answer (`x-abridge-note`).
    pub note: Option<String>,
    pub body: Value,
}

impl Harness {
    /// The hard threshold abridge applies to `model` (the run's `--threshold`, else its
    /// share of the model's window).
    pub fn threshold(&self, model: &str) -> u64 {
        let provider = crate::headers::Provider::Main;
        self.state.compactor().threshold(provider, model, None)
    }

    /// abridge with `config`, its upstream the simulated provider (counting as `scale`
    /// says: see `provider::count`), its store in-process, admin off; requests of
    /// `format` go to its route.
    pub async fn start(config: &Config, format: Format, scale: f64) -> Result<Self, String> {
        let provider = Simulated::start(scale).await.map_err(|e| e.to_string())?;
        let mut config = config.clone();
        config.upstream = provider.url.parse()?;
        config.anthropic_upstream = None;
        config.store = Default::default();
        config.identity.secret = Some(Secret::new("abridge replay: a fixed, local identity key"));
        config.admin.token = None;
        let prices = Prices::new(&config.prices)?;
        let summary_model = Some(config.summary.model.clone()).filter(|m| !m.is_empty());
        let max_tokens = config.recall.max_tokens;
        let state = AppState::new(config).map_err(|e| e.to_string())?;
        let bind = || TcpListener::bind("127.0.0.1:0");
        let (proxy, admin) = (
            bind().await.map_err(|e| e.to_string())?,
            bind().await.map_err(|e| e.to_string())?,
        );
        let url = format!(
            "http://{}{}",
            proxy.local_addr().map_err(|e| e.to_string())?,
            path(format)
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(crate::run(
            Listeners { proxy, admin },
            state.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(Self {
            provider,
            prices,
            summary_model,
            max_tokens,
            state,
            url,
            client: Client::builder(TokioExecutor::new()).build_http(),
            stop,
            server,
            answered: Default::default(),
        })
    }

    /// Where the proxy learned the conversations it served ended.
    pub fn horizons(&self) -> &crate::compactor::horizon::Horizons {
        self.state.compactor().horizons()
    }

    /// Sends one request body; abridge's answer.
    pub async fn send(&self, body: Bytes) -> Result<Answer, String> {
        let request = http::Request::post(&self.url)
            .header("content-type", "application/json")
            .header("authorization", "Bearer replay")
            .header("anthropic-version", "2023-06-01")
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let compacted = response
            .headers()
            .get("x-abridge-compacted")
            .is_some_and(|v| v == "true");
        let header = |name: &str| {
            let value = response.headers().get(name)?.to_str().ok();
            value.map(str::to_owned)
        };
        let (reason, note) = (header("x-abridge-reason"), header("x-abridge-note"));
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if body.get("usage").is_some_and(Value::is_object) {
            self.answered.fetch_add(1, Ordering::SeqCst);
        }
        Ok(Answer {
            status,
            compacted,
            reason,
            note,
            body,
        })
    }

    /// Lets abridge finish with the last turn before the next, as a user's think time
    /// would (at most a few seconds): the usage of every answer read and recorded (the
    /// client can have the last bytes before the relay sees the end), and background
    /// compactions done. Waiting for background jobs alone, a busy machine could let
    /// the next turn be decided before the last one's usage was recorded.
    pub async fn wait_idle(&self) {
        let answered = self.answered.load(Ordering::SeqCst);
        for _ in 0..500 {
            let reported = self.state.stats().snapshot().usage_reports;
            if reported >= answered && self.state.compactor().settled() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Stops abridge; the compactions it ran.
    pub async fn finish(self) -> u64 {
        let compactions = self.state.stats().snapshot().compactions_total();
        let _ = self.stop.send(());
        let _ = self.server.await;
        compactions
    }
}

/// Where a format's requests go.
fn path(format: Format) -> &'static str {
    match format {
        Format::Chat => "/v1/chat/completions",
        Format::Responses => "/v1/responses",
        Format::Messages => "/v1/messages",
    }
}
