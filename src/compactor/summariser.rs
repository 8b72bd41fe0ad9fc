//! The summariser: one non-streaming chat completion that turns a transcript into a
//! summary, for the `structured` and `llm_replace` strategies.
//!
//! By default it calls the same upstream with the client's own credentials and the
//! request's model (so it needs no configuration and bills the same account): for a
//! request that speaks Anthropic's API (its route or its credential style, see
//! `upstream`), that is `anthropic_upstream` when it is set, so a client's credential
//! only ever goes to the provider it was meant for; for a
//! conversation on Azure's classic deployment path, that is the same deployment (or the
//! deployment `summary.model` names) with the request's `api-version`, so the summary is
//! asked in the form the client's own request was. The client's credential headers go
//! as they came (Azure's `api-key` stays `api-key`). With
//! `summary.upstream` it calls that provider instead with `summary.api_key`, and the
//! client's credentials are never sent there. A low temperature and a token cap keep
//! summaries faithful and bounded — in the form each model accepts (see
//! [`super::params`]: reasoning models get `max_completion_tokens` and their default
//! temperature, and a 400 naming either is retried once in the other form and
//! remembered); any failure is reported so the strategy can fall back.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Uri, header};
use http_body_util::{BodyExt, Limited};

use super::params::Learned;
use super::summary_wire::{ANTHROPIC_VERSION, Wire, error_message};
use crate::azure::Deployment;
use crate::config::SummaryConfig;
use crate::formats::Format;
use crate::headers::{Credentials, Provider};
use crate::secret::Secret;
use crate::strategies::{Answer, SummaryError, SummaryRequest};
use crate::upstream::Upstream;

/// Largest summary response read.
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

#[derive(Clone)]
pub struct Summariser {
    upstream: Upstream,
    /// Without `summary.upstream`: where summaries of Anthropic-route conversations go
    /// (`anthropic_upstream`), when it is set.
    anthropic: Option<Upstream>,
    /// Set when summaries go to a separate provider.
    separate: Option<Option<Secret>>,
    model: String,
    timeout: Duration,
    temperature: f64,
    /// The form each model accepts, as learned from its refusals.
    learned: Arc<Learned>,
}

/// What went wrong with a summary call. `Status` keeps the provider's message for the
/// operator's debug log only; what reaches clients and the store is the
/// [`SummaryError`] class it converts to.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SummaryFailure {
    #[error("summariser did not answer within {0:?}")]
    Timeout(Duration),
    #[error("summariser answered {status}")]
    Status { status: u16, message: String },
    #[error("summariser returned an empty summary")]
    Empty,
    #[error("summariser unreachable: {0}")]
    Unreachable(String),
    #[error("summariser answer unreadable: {0}")]
    Unreadable(String),
}

impl From<SummaryFailure> for SummaryError {
    fn from(failure: SummaryFailure) -> Self {
        match failure {
            SummaryFailure::Timeout(_) => SummaryError::TimedOut,
            SummaryFailure::Status { status, .. } => SummaryError::Status(status),
            SummaryFailure::Empty => SummaryError::Empty,
            SummaryFailure::Unreachable(_) => SummaryError::Unreachable,
            SummaryFailure::Unreadable(_) => SummaryError::Unreadable,
        }
    }
}

impl Summariser {
    pub fn new(config: &SummaryConfig, main: &Upstream) -> Self {
        let upstream = match &config.upstream {
            Some(base) => main.with_base(base.clone(), config.timeout()),
            None => main.with_base(main.base().clone(), config.timeout()),
        };
        let anthropic = match (&config.upstream, main.anthropic_base()) {
            (None, Some(base)) => Some(main.with_base(base.clone(), config.timeout())),
            _ => None,
        };
        Self {
            upstream,
            anthropic,
            separate: config.upstream.as_ref().map(|_| config.api_key.clone()),
            model: config.model.clone(),
            timeout: config.timeout(),
            temperature: config.temperature,
            learned: Arc::new(Learned::default()),
        }
    }

    /// Whether summaries are asked with the client's own credentials (no separate
    /// summary provider): then the provider's refusal of a summary is its refusal of
    /// the client's credential.
    pub fn uses_client_credentials(&self) -> bool {
        self.separate.is_none()
    }

    /// Whether a summary for a request of `request_model` is counted as that request is:
    /// the same model, on the same upstream (no separate summary provider).
    pub fn counts_like(&self, request_model: &str) -> bool {
        self.uses_client_credentials() && self.model_for(request_model) == request_model
    }

    /// The model a summary for a request of `request_model` uses.
    pub fn model_for<'a>(&'a self, request_model: &'a str) -> &'a str {
        if self.model.is_empty() {
            request_model
        } else {
            &self.model
        }
    }

    /// Asks for a summary. `client` are the credentials of the request being compacted
    /// (used only with the main upstream, or the Anthropic one for a request that speaks
    /// that `provider`'s API); `deployment`, the Azure deployment its path named. A 400
    /// that names a parameter the model does not accept is retried once in the other
    /// form (per parameter), and the model's form is remembered.
    pub async fn summarise(
        &self,
        (client, provider, format, deployment): (
            &Credentials,
            Provider,
            Format,
            Option<&Deployment>,
        ),
        request_model: &str,
        call: &SummaryRequest,
    ) -> Result<Answer, SummaryFailure> {
        let upstream = self.upstream_for(provider);
        // A Messages conversation is summarised in the Messages API, on its own
        // upstream (which may serve nothing else); every other one in chat completions.
        let wire = match (format, &self.separate) {
            (Format::Messages, None) => Wire::Messages,
            _ => Wire::Chat,
        };
        let model = self.model_for(request_model);
        let uri = self
            .endpoint(upstream, wire, deployment)
            .map_err(|e| SummaryFailure::Unreachable(e.to_string()))?;
        let mut params = self.learned.for_model(model);
        // At most one retry per parameter abridge can change (providers name one
        // refused parameter at a time).
        let mut retries = 2;
        loop {
            let body = wire.body((model, params), call, self.temperature);
            let result = match serde_json::to_vec(&body) {
                Ok(body) => self.ask((upstream, uri.clone(), wire), client, body).await,
                Err(e) => Err(SummaryFailure::Unreadable(e.to_string())),
            };
            // Retried only in a form that changes what is sent.
            let next = match &result {
                Err(SummaryFailure::Status {
                    status: 400,
                    message,
                }) if retries > 0 => params
                    .after_refusal(message)
                    .filter(|next| wire.sends_differently(params, *next)),
                _ => None,
            };
            match next {
                Some(next) => {
                    params = next;
                    retries -= 1;
                }
                None => {
                    if result.is_ok() && retries < 2 {
                        self.learned.remember(model, params);
                    }
                    return result;
                }
            }
        }
    }

    /// Asks for the summary after the conversation itself, on the request's own model
    /// and upstream with the client's credentials, so the provider reads the forwarded
    /// prefix from its cache (see [`super::in_context`]). `None`: not asked so (another
    /// model or provider summarises, or the request does not allow it).
    pub(super) async fn summarise_in_context(
        &self,
        (client, provider, deployment): (&Credentials, Provider, Option<&Deployment>),
        request_model: &str,
        forwarded: &super::in_context::Forwarded<'_>,
        call: &SummaryRequest,
    ) -> Option<Result<Answer, SummaryFailure>> {
        let format = forwarded.request.format();
        let ask = call.in_context.as_ref()?;
        if !self.counts_like(request_model) || (deployment.is_some() && format != Format::Chat) {
            return None;
        }
        let wire = match format {
            Format::Chat => Wire::Chat,
            Format::Messages => Wire::Messages,
            Format::Responses => Wire::Responses,
        };
        let params = self.learned.for_model(request_model);
        let body =
            super::in_context::body(forwarded, ask, (call.max_tokens, params.completion_tokens))?;
        let upstream = self.upstream_for(provider);
        Some(match self.endpoint(upstream, wire, deployment) {
            Ok(uri) => self.ask((upstream, uri, wire), client, body).await,
            Err(e) => Err(SummaryFailure::Unreachable(e.to_string())),
        })
    }

    /// The upstream a summary of a request speaking `provider`'s API goes to.
    fn upstream_for(&self, provider: Provider) -> &Upstream {
        match (&self.anthropic, provider) {
            (Some(anthropic), Provider::Anthropic) => anthropic,
            _ => &self.upstream,
        }
    }

    /// Where a summary goes: the chat completions (or Messages) of the upstream, or —
    /// on the main upstream, for a conversation on Azure's classic path — the chat
    /// completions of the request's deployment (`summary.model`'s, when set), with the
    /// request's `api-version`.
    fn endpoint(
        &self,
        upstream: &Upstream,
        wire: Wire,
        deployment: Option<&Deployment>,
    ) -> Result<Uri, crate::error::Error> {
        match deployment {
            Some(d) if self.separate.is_none() && wire == Wire::Chat => {
                let name = if self.model.is_empty() {
                    &d.name
                } else {
                    &self.model
                };
                upstream.classic_endpoint(&d.path_for(name, "/chat/completions"))
            }
            _ => upstream.endpoint(wire.path()),
        }
    }

    /// One summary request, `body` to `uri` on `upstream`, its answer read as `wire`'s.
    async fn ask(
        &self,
        (upstream, uri, wire): (&Upstream, Uri, Wire),
        client: &Credentials,
        body: Vec<u8>,
    ) -> Result<Answer, SummaryFailure> {
        let request = self.request((uri, wire), client, body)?;
        let exchange = async {
            let response = upstream.send(request).await.map_err(|e| match e {
                crate::error::Error::UpstreamTimeout(after) => SummaryFailure::Timeout(after),
                e => SummaryFailure::Unreachable(e.to_string()),
            })?;
            let status = response.status();
            let bytes: Bytes = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| SummaryFailure::Unreadable(e.to_string()))?
                .to_bytes();
            Ok::<_, SummaryFailure>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| SummaryFailure::Timeout(self.timeout))??;
        if !status.is_success() {
            return Err(SummaryFailure::Status {
                status: status.as_u16(),
                message: error_message(&bytes),
            });
        }
        let answer = wire.answer(&bytes).ok_or_else(|| {
            SummaryFailure::Unreadable("the response is not an answer of the API asked".into())
        })?;
        if answer.text.trim().is_empty() {
            return Err(SummaryFailure::Empty);
        }
        Ok(answer)
    }

    /// The summary request: `body`, and the credentials it carries.
    fn request(
        &self,
        (uri, wire): (Uri, Wire),
        client: &Credentials,
        body: Vec<u8>,
    ) -> Result<Request<Body>, SummaryFailure> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT_ENCODING, "identity")
            .body(Body::from(body))
            .map_err(|e| SummaryFailure::Unreachable(e.to_string()))?;
        let headers = request.headers_mut();
        match &self.separate {
            None => {
                for (name, value) in client.headers() {
                    headers.append(name.clone(), value.clone());
                }
                if wire == Wire::Messages {
                    for (name, value) in client.protocol() {
                        headers.append(name.clone(), value.clone());
                    }
                    if !headers.contains_key("anthropic-version") {
                        headers.insert(
                            "anthropic-version",
                            HeaderValue::from_static(ANTHROPIC_VERSION),
                        );
                    }
                }
            }
            Some(Some(key)) => {
                let value =
                    HeaderValue::try_from(format!("Bearer {}", key.expose())).map_err(|_| {
                        SummaryFailure::Unreachable(
                            "summary.api_key is not a valid header value".into(),
                        )
                    })?;
                headers.insert(header::AUTHORIZATION, value);
            }
            Some(None) => {}
        }
        Ok(request)
    }
}
