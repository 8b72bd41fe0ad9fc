//! The `[provider_apis]` section: which provider APIs the main upstream has itself and
//! which abridge serves for it (see `provider_apis`).

use serde::{Deserialize, Serialize};

/// Who answers OpenAI's compaction APIs (`POST /v1/responses/compact`, Codex's
/// `compaction_trigger`, `compaction` items) for the main upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compaction {
    /// `native` when the upstream is OpenAI's or Azure OpenAI's own host, else `serve`.
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
}
