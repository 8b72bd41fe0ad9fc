//! The first stages of a conversation request, shared by the proxy's handler and the
//! admin preview: parse (once; a large body off the async workers), identify (tenant,
//! conversation, prefix hashes), load what the store has (one round trip). What comes
//! out, [`Prepared`], owns everything the later stages borrow a [`Turn`] from.

use std::sync::Arc;

use bytes::Bytes;

use crate::chat::{self, Unparseable};
use crate::compactor::Turn;
use crate::config::Anonymous;
use crate::controls::Controls;
use crate::formats::Format;
use crate::headers::Credentials;
use crate::identity::{self, Identified, IdentityKey};
use crate::state::AppState;
use crate::store::Loaded;

/// A request parsed, identified and loaded.
pub struct Prepared {
    pub request: Arc<chat::Request>,
    pub controls: Controls,
    pub credentials: Credentials,
    /// `None`: no user message, no identity key (store down), or no credential while
    /// anonymous requests get no state.
    pub identified: Option<Identified>,
    /// `None`: the store did not answer (or nothing to load).
    pub loaded: Option<Loaded>,
    /// Why it was not identified, when the client should know.
    pub note: Option<&'static str>,
}

impl Prepared {
    /// The view the compactor decides on.
    pub fn turn(&self) -> Turn<'_, '_> {
        let parsed = self.request.parsed();
        Turn {
            messages: &parsed.messages,
            prefixes: self
                .identified
                .as_ref()
                .map_or(&[][..], |i| &i.hashes.prefixes),
            conversation: self.identified.as_ref().map(|i| i.conversation),
            loaded: self.loaded.as_ref(),
            controls: &self.controls,
            model: parsed.request.model.as_deref().unwrap_or_default(),
            credentials: &self.credentials,
            tenant: self.identified.as_ref().map(|i| i.tenant),
            size: self.request.body().len(),
            format: Format::Chat,
        }
    }
}

/// Parses, identifies and loads. A body abridge does not understand is handed back,
/// with the reason, to be forwarded untouched.
pub async fn prepare(
    state: &AppState,
    controls: Controls,
    credentials: Credentials,
    body: Bytes,
) -> Result<Prepared, (Bytes, Unparseable)> {
    let key = identity_key(state).await;
    let permit = state.cpu().permit_for(body.len()).await;
    let request = match state.cpu().run_with(&permit, || chat::Request::parse(body)) {
        Ok(request) => Arc::new(request),
        Err(unparsed) => {
            state.stats().unparseable();
            return Err(unparsed);
        }
    };
    let refused = credentials.is_empty() && state.config().identity.anonymous == Anonymous::None;
    let identified = match (&key, refused) {
        (Some(key), false) => state.cpu().run_with(&permit, || {
            identify(key, &credentials, &controls, &request.parsed().messages)
        }),
        _ => None,
    };
    drop(permit);
    if identified.is_some() {
        state.stats().identified();
    }
    let loaded = match &identified {
        Some(i) => match state.store().load(&i.conversation).await {
            Ok(loaded) => Some(loaded),
            Err(_) => {
                state.stats().store_unavailable();
                None
            }
        },
        None => None,
    };
    let note = (refused && key.is_some()).then_some(
        "no credential: forwarded without conversation state (identity.anonymous = none)",
    );
    Ok(Prepared {
        request,
        controls,
        credentials,
        identified,
        loaded,
        note,
    })
}

/// The identity key, or `None` while the store has never answered (fail-open: the
/// request goes on unidentified, and that is counted).
async fn identity_key(state: &AppState) -> Option<Arc<IdentityKey>> {
    let key = state.identity_key().await;
    if key.is_none() {
        state.stats().store_unavailable();
    }
    key
}

/// The conversation of a request, from its credentials (the tenant), the optional
/// `x-abridge-conversation` header and the messages; `None` without a user message.
fn identify(
    key: &IdentityKey,
    credentials: &Credentials,
    controls: &Controls,
    messages: &[crate::conversation::Item<'_>],
) -> Option<Identified> {
    let explicit = controls.conversation.as_deref().map(str::as_bytes);
    identity::identify(key, &credentials.tenant(), explicit, messages)
}
