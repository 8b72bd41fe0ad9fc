//! The conversation stages for a Responses request that arrives as a WebSocket
//! `response.create` frame instead of a POST (see [`crate::websocket`]): the same
//! prepare → plan → rewrite as [`super::responses`], and the same record stage once the
//! provider's terminal event has brought the usage.
//!
//! What a frame does not get, and why: no compact-and-retry on an overflow and no
//! recall rounds (both read the provider's answer before the client does, and over a
//! WebSocket the events go to the client as they come); no `stream_options` ask (the
//! Responses API reports usage in its terminal event anyway); no report headers (a
//! frame has none: what was done is logged and counted). The provider compaction APIs
//! are the provider's here: frames are relayed only where the upstream has them.

use bytes::Bytes;
use http::{HeaderMap, Method, Uri};

use super::{Billing, Exchange, record};
use crate::azure::Deployment;
use crate::compactor::{Followup, Reason};
use crate::controls::Controls;
use crate::error::Error;
use crate::formats::Format;
use crate::headers::{self, Credentials, Provider};
use crate::prepare::{parse, prepare_parsed};
use crate::relay::{End, Outcome, Usage};
use crate::state::AppState;
use crate::stats::{InFlight, Route};

/// What every frame of one WebSocket connection shares, read once from its handshake:
/// the `x-abridge-*` controls, the credentials (after hop-by-hop stripping, as a POST's),
/// whose API it speaks and the Azure deployment its path names.
#[derive(Clone)]
pub struct Context {
    controls: Controls,
    credentials: Credentials,
    provider: Provider,
    deployment: Option<Deployment>,
}

impl Context {
    /// The context of a handshake, and where its upgrade goes upstream. `headers` leave
    /// stripped as a POST's are (hop-by-hop and `x-abridge-*` gone); an invalid control
    /// or a path that does not map onto the upstream is the error a POST would get.
    pub fn of(state: &AppState, headers: &mut HeaderMap, uri: &Uri) -> Result<(Self, Uri), Error> {
        let controls = Controls::from_headers(headers, state.config().compaction.allowed())?;
        headers::strip_request(headers);
        let (target, provider) = state.upstream().route(&Method::GET, uri, headers)?;
        let credentials = Credentials::from_headers(
            headers,
            state.config().identity.tenant_headers.iter().map(|h| &h.0),
        );
        let context = Self {
            controls,
            credentials,
            provider,
            deployment: Deployment::of(uri.path(), uri.query()),
        };
        Ok((context, target))
    }
}

/// The bookkeeping of the handshake itself, as an exchange on the Responses route.
pub struct Handshake(Exchange);

impl Handshake {
    pub fn start(state: &AppState) -> Self {
        Self(Exchange::start(state))
    }

    /// The handshake answered `response` (a 101, or the provider's or abridge's refusal).
    pub fn finish(self, state: &AppState, response: &axum::response::Response) {
        self.0.finish(state, Route::Responses, response);
    }
}

/// One frame's request, staged: the body to send and what to record once it is answered.
pub struct Staged {
    /// The body to send upstream: the one received unless it was rewritten.
    pub body: Bytes,
    pub rewritten: bool,
    pub pending: Pending,
}

/// What the record stage needs of a frame's request until its terminal event.
pub struct Pending {
    followup: Option<Followup>,
    billing: Billing,
    inflight: Option<InFlight>,
}

impl Pending {
    /// The provider ended the answer (`usage` from its terminal event, if any), or the
    /// session ended before it did.
    pub fn done(self, state: &AppState, usage: Option<Usage>, end: End) {
        if let (Some(followup), Some(_), End::Complete) = (&self.followup, usage, end) {
            state.tenants().accepted(followup.payer);
        }
        let outcome = Outcome {
            usage,
            end,
            usage_unreadable: false,
            stripped_events: 0,
        };
        record(state, &outcome, self.followup, &self.billing);
        drop(self.inflight);
    }
}

/// prepare → plan → rewrite for a `response.create` frame's request (`body`: the frame
/// without its `type`). Never fails: a body abridge does not understand, one whose state
/// lives on the provider (`previous_response_id`) or one over the body budget goes as
/// received.
pub async fn stage(state: &AppState, context: &Context, body: Bytes) -> Staged {
    let inflight = Some(state.stats().request_started());
    let untouched = |body: Bytes, inflight| Staged {
        body,
        rewritten: false,
        pending: Pending {
            followup: None,
            billing: Billing::default(),
            inflight,
        },
    };
    let held = match state.body_budget().hold(body.len()) {
        Ok(held) => held,
        Err(_) => return untouched(body, inflight),
    };
    let request = match parse(state, Reason::Request, Format::Responses, body).await {
        Ok(request) => request,
        Err((body, reason)) => {
            tracing::debug!(%reason, "a response.create abridge does not understand: sent as received");
            return untouched(body, inflight);
        }
    };
    let credentials = context.credentials.clone();
    let mut prepared = prepare_parsed(
        state,
        Reason::Request,
        (context.controls.clone(), credentials),
        // Native only: no compaction item of abridge's to open, so no archive.
        (request, None),
        (context.deployment.clone(), context.provider),
    )
    .await;
    if let Some(note) = prepared.request.untouchable() {
        tracing::debug!(
            note,
            "a response.create left to the provider: sent as received"
        );
        return untouched(prepared.request.body().clone(), inflight);
    }
    // No recall tool: its rounds read the answer before the client does.
    prepared.recall_tool = None;
    let turn = prepared.turn();
    super::conversation::ask_window(state, &turn);
    let decision = state.compactor().plan(&turn, Reason::Request).await;
    let request = &*prepared.request;
    let items = decision
        .apply
        .as_ref()
        .map(|c| crate::compactor::forwarded(request.items(), c));
    let outgoing = request.outgoing(items.as_deref(), None, false);
    let rewritten = items.is_some();
    let followup = super::conversation::followup(&prepared, &decision).map(|mut f| {
        f.held = Some(held);
        f
    });
    let billing = Billing::of(state, request, &decision);
    if let Some((e, _)) = billing.compacted {
        state
            .stats()
            .estimated_saving(e.client.saturating_sub(e.forwarded));
    }
    tracing::debug!(
        compacted = decision.report.compacted,
        "a response.create staged"
    );
    Staged {
        body: outgoing.body,
        rewritten,
        pending: Pending {
            followup,
            billing,
            inflight,
        },
    }
}
