//! What the compactor is given about a request ([`Turn`], [`Reason`]), what it decides
//! for it ([`Decision`]), and what the record stage hands back after the response
//! ([`Followup`]).

use std::sync::{Arc, OnceLock};

use crate::azure::Deployment;
use crate::controls::{Controls, Report};
use crate::conversation::Item;
use crate::formats::{self, Format};
use crate::headers::{Credentials, Provider};
use crate::identity::Fingerprint;
use crate::ingress::Held;
use crate::outcome::Verdict;
use crate::store::{Checkpoint, Loaded};
use crate::strategies::Strategy;

pub use super::estimate::Beside;

/// Everything the plan stage needs to know about one request.
pub struct Turn<'t, 'a> {
    pub messages: &'t [Item<'a>],
    /// The request's rolling prefix hashes (`prefixes[i]` = h(i)).
    pub prefixes: &'t [Fingerprint],
    /// `None`: not identified (no user message, or no identity key: store down).
    pub conversation: Option<Fingerprint>,
    /// `None`: the store did not answer (or nothing to load for an unidentified request).
    pub loaded: Option<&'t Loaded>,
    pub controls: &'t Controls,
    /// The model (the Azure deployment's name when the body names none).
    pub model: &'t str,
    /// The Azure deployment the path named: summaries go to the same deployment.
    pub deployment: Option<&'t Deployment>,
    /// The client's credentials (for the summariser on the main upstream).
    pub credentials: &'t Credentials,
    /// Whose API the request speaks: where its summaries go.
    pub provider: Provider,
    /// The payer's id (`None`: not identified); summaries are asked for only for a
    /// payer the provider has accepted (see [`crate::tenants`]).
    pub payer: Option<Fingerprint>,
    /// Bytes of the request body: how heavy its estimates and compaction are.
    pub size: usize,
    /// The request body, for what it carries besides its items (see
    /// `decide::beside`).
    pub body: &'t [u8],
    /// The request as parsed (`None` in the unit tests): a summary on the request's own
    /// model is asked after its forwarded conversation (see `super::in_context`).
    pub request: Option<&'t formats::Request>,
    /// The wire format the request came in.
    pub format: Format,
    /// A compacted request gets the recall tool, which the provider counts: compactions
    /// aim lower by its tokens (see `decide::added`).
    pub recall_tool: bool,
    /// Every request of the conversation carries it, compacted or not
    /// (`recall.offer = "always"`): a first compaction leaves the cached head as it is.
    pub recall_always: bool,
    /// What the request carries beside its items, once worked out (`decide::beside`,
    /// asked several times a decision): start with `Default::default()`.
    pub beside: OnceLock<Beside>,
    /// The strategies' `tool_prune_chars`: the tool results of the final turn longer
    /// than it are what a compaction may clear when that turn does not fit whole, so
    /// what every plan keeps ([`super::estimate::essential`]) depends on it.
    pub tool_prune_chars: usize,
}

/// Why the plan stage is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A request arriving.
    Request,
    /// `POST /admin/preview`: decide as for a request, store and count nothing.
    Preview,
    /// The provider answered "context length exceeded" to a request estimated at
    /// `sent` tokens: compact harder and retry once.
    Overflow { sent: u64 },
}

/// What the plan stage decided, and what the record stage will need of it.
#[derive(Debug, Clone)]
pub struct Decision {
    /// The checkpoint to apply (`None`: forward the messages as sent).
    pub apply: Option<Checkpoint>,
    pub report: Report,
    /// Predicted prompt tokens of what will be forwarded (the provider's count).
    pub estimate: u64,
    /// The hard threshold for this request's model.
    pub threshold: u64,
    /// The soft threshold: over it after the response, the next checkpoint is prepared.
    pub soft: u64,
    /// Compaction may act on this request (not off, not observe).
    pub active: bool,
    /// The strategy this request asked for (or the configured one).
    pub strategy: Strategy,
    /// The usage record the prediction came from (its history's prefix hash), which
    /// this request's report supersedes.
    pub usage: Option<Fingerprint>,
    /// Tokens this history grows by per turn, as observed.
    pub growth: u64,
    /// abridge's estimate of the request's head (leading system messages).
    pub head_tokens: u64,
    /// abridge's estimate of what was appended since the usage record (0: no record).
    pub appended: u64,
    /// What the request carries beside its items as the provider counts it, learned
    /// (0: not yet), for the next record.
    pub beside: u64,
    /// The usage record the prediction came from, to measure the next ratio.
    pub previous: Option<Record>,
    /// When the record was reported (ms since the epoch): how long ago the client's
    /// previous request of this history went; and that request as the client sent it,
    /// counted as the provider counts (0: not known).
    pub previous_at_ms: Option<u64>,
    pub previous_client_tokens: u64,
    /// When the conversation was last seen (from the store; 0: new).
    pub last_seen_ms: u64,
    /// A compaction is expected once the history reaches the threshold, so a checkpoint
    /// built ahead would be used (the cost policy may expect none).
    pub expects: bool,
    /// Under which policy it was decided, why, and what the cost model weighed (its
    /// `compacted` is the report's).
    pub verdict: Verdict,
}

/// What a request's usage record said, for the next: the provider's count, the ratio
/// appended messages were scaled by, the checkpoint applied, the history's growth per
/// turn (the provider's count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub tokens: u64,
    pub ratio_permille: u32,
    pub applied: Option<u32>,
    pub growth: u64,
}

/// What the record stage needs about a request, built by the request path.
pub struct Followup {
    pub conversation: Fingerprint,
    /// Messages in the client's request, and the prefix hash through the last of them.
    pub messages: u32,
    pub prefix: Fingerprint,
    /// `through` of the checkpoint applied to the forwarded request.
    pub applied: Option<u32>,
    pub threshold: u64,
    pub soft: u64,
    /// Compaction may act on this conversation (see [`Decision::active`]).
    pub active: bool,
    pub strategy: Strategy,
    /// The usage record this request's report supersedes, and what goes into the new
    /// one (see [`Decision`]).
    pub replaces: Option<Fingerprint>,
    pub growth: u64,
    pub head_tokens: u64,
    pub appended: u64,
    pub beside: u64,
    pub previous: Option<Record>,
    /// When the conversation was last seen, per the store (0: new).
    pub last_seen_ms: u64,
    /// A checkpoint built ahead would be used (see [`Decision::expects`]).
    pub expects: bool,
    /// What was decided, for the conversation's account (see [`Decision::verdict`]).
    pub verdict: Verdict,
    /// For a background build: the request as parsed at ingress (never parsed again),
    /// its prefix hashes, and the credentials and tenant for the summariser.
    pub request: Arc<formats::Request>,
    pub prefixes: Vec<Fingerprint>,
    pub credentials: Credentials,
    pub deployment: Option<Deployment>,
    pub provider: Provider,
    /// Its compacted requests get the recall tool.
    pub recall_tool: bool,
    /// …and so do the others (`recall.offer = "always"`).
    pub recall_always: bool,
    pub payer: Fingerprint,
    /// The body's share of `limits.max_inflight_body_bytes`, kept while a background
    /// job holds the body.
    pub held: Option<Held>,
}
