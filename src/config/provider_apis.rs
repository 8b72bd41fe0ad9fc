//! The `[provider_apis]` section: which provider APIs the main upstream has itself and
//! which abridge serves for it (see `provider_apis`).

use serde::{Deserialize, Serialize};

/// Who answers a provider's compaction APIs: OpenAI's (`POST /v1/responses/compact`,
/// Codex's `compaction_trigger`, `compaction` items) for the main upstream, or
/// Anthropic's (`compact_20260112`, context editing, `compaction` blocks) for the
/// Messages route's upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compaction {
    /// `native` when the upstream is the provider's own host (OpenAI's or Azure
    /// OpenAI's; Anthropic's), else `serve`.
    #[default]
    Auto,
    /// The upstream has them: forwarded untouched.
    Native,
    /// abridge answers them with its own strategies.
    Serve,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderApisConfig {
    /// OpenAI's Responses compaction (see [`Compaction`]).
    pub responses_compaction: Compaction,
    /// Anthropic's Messages compaction and context editing (see [`Compaction`]), for
    /// `anthropic_upstream` when set, else `upstream`.
    pub messages_compaction: Compaction,
}
