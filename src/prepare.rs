//! The first stages of a conversation request, shared by the proxy's handler and the
//! admin preview: parse (once; a large body off the async workers), identify (tenant,
//! conversation, prefix hashes), load what the store has (one round trip). What comes
//! out, [`Prepared`], owns everything the later stages borrow a [`Turn`] from.

use std::sync::Arc;

use bytes::Bytes;

use crate::azure::{self, Deployment};
use crate::compactor::{Reason, Turn};
use crate::config::{Anonymous, CompactionMode, RecallOffer};
use crate::controls::{Compact, Controls};
use crate::formats::{Format, Request, Unparseable};
use crate::headers::{Credentials, Provider};
use crate::identity::{self, Identified, IdentityKey};
use crate::state::AppState;
use crate::store::Loaded;

/// A request parsed, identified and loaded.
pub struct Prepared {
    pub request: Arc<Request>,
    pub controls: Controls,
    pub credentials: Credentials,
    /// The Azure deployment the request's path named (`None`: not a classic Azure path).
    pub deployment: Option<Deployment>,
    /// Whose API the request speaks: where it and its summaries go, who pays.
    pub provider: Provider,
    /// `None`: no user message, no identity key (store down), or no credential while
    /// anonymous requests get no state.
    pub identified: Option<Identified>,
    /// `None`: the store did not answer (or nothing to load).
    pub loaded: Option<Loaded>,
    /// Why it was not identified, when the client should know.
    pub note: Option<&'static str>,
    /// The recall tool a compacted request gets, named for it (see [`recall_tool`]).
    pub recall_tool: Option<crate::recall::Tool>,
    /// What a provider-API compaction item or block the request carried replaced (its
    /// archive: see [`crate::recall::archive`]), for recall; `None`: it carried none.
    pub archive: Option<crate::recall::Archive>,
    /// The strategies' `tool_prune_chars` when it was prepared (see [`Turn`]).
    pub tool_prune_chars: usize,
}

impl Prepared {
    /// The model the request is for (the deployment's name when the body names none).
    pub fn model(&self) -> &str {
        azure::model_of(self.request.model(), self.deployment.as_ref())
    }

    /// Every request of its conversation carries the recall tool, compacted or not
    /// (`recall.offer = "always"`, see [`crate::recall::Tool::always`]).
    pub fn recall_always(&self) -> bool {
        self.recall_tool.as_ref().is_some_and(|t| t.always)
    }

    /// The view the compactor decides on.
    pub fn turn(&self) -> Turn<'_, '_> {
        Turn {
            messages: self.request.items(),
            prefixes: self
                .identified
                .as_ref()
                .map_or(&[][..], |i| &i.hashes.prefixes),
            conversation: self.identified.as_ref().map(|i| i.conversation),
            loaded: self.loaded.as_ref(),
            controls: &self.controls,
            model: self.model(),
            deployment: self.deployment.as_ref(),
            credentials: &self.credentials,
            provider: self.provider,
            payer: self.identified.as_ref().map(|i| i.payer),
            size: self.request.body().len(),
            body: self.request.body(),
            request: Some(&self.request),
            format: self.request.format(),
            recall_tool: self.recall_tool.is_some(),
            recall_always: self.recall_always(),
            beside: Default::default(),
            tool_prune_chars: self.tool_prune_chars,
        }
    }
}

/// The recall tool `request` gets once compacted (or from the first, see
/// [`crate::recall::Tool::always`] and [`RecallOffer`]), if any: recall is on,
/// compaction acts, the client did not turn recall off, the request lets the model
/// choose its tools and asks for one answer, the provider has not lately refused the
/// tool for the same tenant (`payer`; see [`crate::tenants`]), and there is room for one
/// more tool (named apart from a client's own tool of the same name: see
/// [`crate::recall::Tool`]).
fn recall_tool(
    state: &AppState,
    (controls, request): (&Controls, &Request),
    (provider, model): (Provider, &str),
    payer: Option<identity::Fingerprint>,
) -> Option<crate::recall::Tool> {
    let config = state.config();
    let wanted = config.recall.enabled
        && config.recall.max_rounds > 0
        && config.compaction.mode == CompactionMode::On
        && !controls.recall_off
        && request.lets_the_model_choose_tools()
        && !request.asks_several_answers()
        && !payer.is_some_and(|p| state.tenants().refuses_recall(p));
    if !wanted {
        return None;
    }
    let tools = request.tools().map(crate::json::Raw::get);
    // An agent's requests carry it from the first (`always`, or `auto` for a
    // conversation that starts at half the operator's threshold or more), unless this
    // one says compaction is off.
    let always = controls.compact != Compact::Off
        && match config.recall.offer {
            RecallOffer::Always => true,
            RecallOffer::Compacted => false,
            // Only an agent's (tools of its own) gets it early: the opening, a pass over
            // the body, is worked out for nothing else.
            RecallOffer::Auto => {
                tools.is_some()
                    && config.compaction.threshold_tokens > 0
                    && crate::compactor::opening(request).saturating_mul(2)
                        >= state.compactor().threshold(provider, model, payer)
            }
        };
    crate::recall::Tool::for_request(request.format(), tools, always)
}

/// Parses, identifies and loads. A body abridge does not understand is handed back,
/// with the reason, to be forwarded untouched; one it must leave to the provider
/// ([`Request::untouchable`]) is parsed only. For [`Reason::Preview`] nothing is counted
/// in the stats. `deployment`: the Azure deployment the path named; `provider`: whose
/// API the request speaks.
pub async fn prepare(
    state: &AppState,
    reason: Reason,
    (controls, credentials): (Controls, Credentials),
    (format, body): (Format, Bytes),
    (deployment, provider): (Option<Deployment>, Provider),
) -> Result<Prepared, (Bytes, Unparseable)> {
    let request = parse(state, reason, format, body).await?;
    Ok(prepare_parsed(
        state,
        reason,
        (controls, credentials),
        (request, None),
        (deployment, provider),
    )
    .await)
}

/// The parse stage alone (a large body off the async workers): the request, or the body
/// handed back with the reason it is not understood.
pub async fn parse(
    state: &AppState,
    reason: Reason,
    format: Format,
    body: Bytes,
) -> Result<Arc<Request>, (Bytes, Unparseable)> {
    let permit = state.cpu().permit_for(body.len()).await;
    match state
        .cpu()
        .run_with(&permit, || Request::parse(format, body))
    {
        Ok(request) => Ok(Arc::new(request)),
        Err(unparsed) => {
            if reason != Reason::Preview {
                state.stats().unparseable();
            }
            Err(unparsed)
        }
    }
}

/// [`prepare`] after the parse: identifies and loads `request`, which carries
/// `archive` (see [`Prepared::archive`]).
pub async fn prepare_parsed(
    state: &AppState,
    reason: Reason,
    (controls, credentials): (Controls, Credentials),
    (request, archive): (Arc<Request>, Option<crate::recall::Archive>),
    (deployment, provider): (Option<Deployment>, Provider),
) -> Prepared {
    let counted = reason != Reason::Preview;
    let key = state.identity_key().await;
    if key.is_none() && counted {
        state.stats().store_unavailable();
    }
    let permit = state.cpu().permit_for(request.body().len()).await;
    let refused = credentials.is_empty() && state.config().identity.anonymous == Anonymous::None;
    // A request left to the provider (its state lives there) is neither identified nor
    // loaded: nothing of abridge's applies to it.
    let untouchable = request.untouchable().is_some();
    let identified = match (&key, refused || untouchable) {
        (Some(key), false) => state.cpu().run_with(&permit, || {
            let payer = credentials.payer(provider, state.upstream().is_azure());
            identify(key, (&credentials, &payer), &controls, &request)
        }),
        _ => None,
    };
    drop(permit);
    if identified.is_some() && counted {
        state.stats().identified();
    }
    let loaded = match &identified {
        Some(i) => match state.store().load(&i.conversation).await {
            Ok(loaded) => Some(loaded),
            Err(_) => {
                if counted {
                    state.stats().store_unavailable();
                }
                None
            }
        },
        None => None,
    };
    let note = (refused && key.is_some()).then_some(
        "no credential: forwarded without conversation state (identity.anonymous = none)",
    );
    Prepared {
        recall_tool: recall_tool(
            state,
            (&controls, &request),
            (
                provider,
                azure::model_of(request.model(), deployment.as_ref()),
            ),
            identified.as_ref().map(|i| i.payer),
        ),
        request,
        controls,
        credentials,
        deployment,
        provider,
        identified,
        loaded,
        note,
        archive,
        tool_prune_chars: state.config().strategies.tool_prune_chars,
    }
}

/// The conversation of a request, from its credentials (the tenant), its format, the
/// optional `x-abridge-conversation` header (or the format's hint) and the items;
/// `None` without a user message.
fn identify(
    key: &IdentityKey,
    (credentials, payer): (&Credentials, &[u8]),
    controls: &Controls,
    request: &Request,
) -> Option<Identified> {
    // The client's explicit id wins; the format's own hint (a Responses
    // `prompt_cache_key`) is used otherwise. Either only within the tenant's namespace.
    let explicit = controls.conversation.as_deref().or(request.hint());
    let scope = identity::Scope {
        format: request.format().domain(),
        conversation: explicit.map(str::as_bytes),
    };
    identity::identify(key, (&credentials.tenant(), payer), scope, request.items())
}
