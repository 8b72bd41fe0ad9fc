//! The `[recall]` section: the `abridge_recall` tool (see `recall`) and the bounds of
//! serving it — rounds, answer sizes, calls per answer, and what one provider answer may
//! make abridge hold (bytes and time).

use serde::{Deserialize, Serialize};

/// The `abridge_recall` tool (see `recall`): the model reads back what was condensed.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecallConfig {
    /// Add the tool to compacted requests abridge can serve it for.
    pub enabled: bool,
    /// Which requests get the tool: every request of an agent — one that carries tools
    /// of its own — from its conversation's first when the conversation starts at half
    /// its threshold or more (`"auto"`, the default), only compacted ones
    /// (`"compacted"`), or every request of an agent (`"always"`; see [`Offer`]).
    pub offer: Offer,
    /// Longest answer to one call, in tokens.
    pub max_tokens: u64,
    /// Recall rounds per client request at most; the last follow-up asks for an answer
    /// without tools.
    pub max_rounds: u32,
    /// Calls served per provider answer at most; the calls past it are answered with a
    /// short "too many recall calls in one answer; ask again" instead of the text.
    pub max_calls_per_answer: u32,
    /// Tokens of recalled text one round adds to the follow-up at most, all its calls
    /// together (each call still within `max_tokens`).
    pub max_round_tokens: u64,
    /// Bytes of one provider answer abridge holds to serve recall at most: a whole answer
    /// read for its calls, or what a streamed round holds from its first tool call on.
    /// Past it, that answer is not read for recall (see the recall page).
    pub max_answer_bytes: usize,
    /// Longest a streamed round holds the events after its first tool call, in
    /// milliseconds; past it, what was held is relayed and recall is given up for it.
    pub max_hold_ms: u64,
}

/// Which requests get the recall tool (`recall.offer`).
///
/// The tools lead the provider's cached prefix (Anthropic caches tools, then system,
/// then messages; OpenAI matches the prompt from its start), so the compaction that
/// first adds the tool has the provider write the whole prompt again, the agent's
/// 15–50 K tokens of tools and system included, at the cache-write price. Offered from
/// a conversation's first request, the tool is part of the prefix the provider has
/// cached all along, and the first compaction rewrites only what follows the head; every
/// request pays for the tool's ~220 tokens instead, read from the cache.
///
/// Which is cheaper depends on the conversation: the rewrite costs its start (what the
/// break makes the provider write again) once, if it is ever compacted; the tool costs
/// its tokens on every request, compacted or not. A conversation that starts at half its
/// threshold or more (Claude Code's 40–47 K tokens of tools, system and first message
/// against a threshold of 60,000) is nearly sure to be compacted and its start is large:
/// `auto` offers it the tool from the first. One that starts small pays little for the
/// rewrite and may never be compacted: `auto` adds the tool when it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Offer {
    /// From the first request of an agent's conversation that starts at half its
    /// threshold or more (see [`Offer`]); else as [`Offer::Compacted`].
    #[default]
    Auto,
    /// Only to compacted requests (and those carrying a compaction abridge served).
    Compacted,
    /// To every request that carries tools of its own and lets the model choose them.
    Always,
}

impl Default for RecallConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            offer: Offer::Auto,
            max_tokens: 2000,
            max_rounds: 3,
            max_calls_per_answer: 8,
            max_round_tokens: 16_000,
            max_answer_bytes: 8 * 1024 * 1024,
            max_hold_ms: 30_000,
        }
    }
}

impl RecallConfig {
    /// The checks of the section: the key at fault and why.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        if !self.enabled {
            return Ok(());
        }
        if !(100..=100_000).contains(&self.max_tokens) {
            return Err((
                "recall.max_tokens",
                "must be between 100 and 100000 (an answer shorter than 100 tokens holds almost nothing)".to_owned(),
            ));
        }
        if !(1..=10).contains(&self.max_rounds) {
            return Err((
                "recall.max_rounds",
                "must be between 1 and 10 (set recall.enabled = false to turn recall off)"
                    .to_owned(),
            ));
        }
        if !(1..=64).contains(&self.max_calls_per_answer) {
            return Err((
                "recall.max_calls_per_answer",
                "must be between 1 and 64".to_owned(),
            ));
        }
        if !(self.max_tokens..=1_000_000).contains(&self.max_round_tokens) {
            return Err((
                "recall.max_round_tokens",
                "must be at least recall.max_tokens (one whole answer) and at most 1000000"
                    .to_owned(),
            ));
        }
        if !(64 * 1024..=1024 * 1024 * 1024).contains(&self.max_answer_bytes) {
            return Err((
                "recall.max_answer_bytes",
                "must be between 65536 (64 KiB) and 1073741824 (1 GiB)".to_owned(),
            ));
        }
        if !(100..=600_000).contains(&self.max_hold_ms) {
            return Err((
                "recall.max_hold_ms",
                "must be between 100 and 600000 (ten minutes)".to_owned(),
            ));
        }
        Ok(())
    }
}
