//! What a decision says of a request ([`Decided`]: its [`Action`] and what it was based
//! on) — made by [`super::decide`], read by the cost policy's weighing, the shell and the
//! record stage ([`Decision::carry`]).

use crate::outcome::{Figures, Trigger};
use crate::store::{Checkpoint, Usage};

use super::cost::Why;
use super::estimate::to_record;
use super::turn::{Decision, Record, Turn};

/// What to do with a request.
#[derive(Debug, Clone, Copy)]
pub enum Action<'c> {
    /// Under the threshold (or not forced): forward with the checkpoint in force.
    Forward,
    /// Apply a checkpoint prepared ahead; `estimate` is the request with it applied.
    Apply {
        checkpoint: &'c Checkpoint,
        estimate: u64,
    },
    /// Compact now to `budget` (in abridge's estimate).
    Compact { budget: u64, trigger: Trigger },
}

/// The decision and what it was based on.
#[derive(Debug, Clone, Copy)]
pub struct Decided<'c> {
    pub action: Action<'c>,
    pub threshold: u64,
    pub soft: u64,
    /// Predicted prompt tokens of the request as it would go (the provider's count).
    pub predicted: u64,
    /// abridge's estimate of the head (leading system messages).
    pub head_tokens: u64,
    /// abridge's estimate of what was appended since the usage record.
    pub appended: u64,
    /// Tokens the history grows by per turn.
    pub growth: u64,
    /// The pace it keeps, for forecasts (see [`super::growth::pace`]).
    pub pace: u64,
    /// The provider's count over abridge's estimate for this conversation (1 without a
    /// report, or when no compaction is considered).
    pub ratio: f64,
    /// The usage record the prediction came from.
    pub usage: Option<Usage>,
    /// The checkpoint in force: the one this history's last request was sent with.
    pub active: Option<&'c Checkpoint>,
    /// Checkpoints of this history that can apply, deepest first.
    pub deepest: Option<&'c Checkpoint>,
    /// The operator's scheduled compaction and its focus (empty: none).
    pub scheduled: Option<&'c str>,
    /// Under the cost policy, what was weighed and why it did, or did not, compact.
    pub why: Option<Why>,
    /// Whether a compaction is expected when the history reaches the threshold (so a
    /// checkpoint built ahead will be used): always under the size policy.
    pub expects: bool,
    /// What the cost model weighed (`None`: nothing was).
    pub figures: Option<Figures>,
}

impl Decided<'_> {
    /// The request as the client sent it (the provider's count), for the horizon (see
    /// [`super::horizon`]): as predicted when it goes as sent; compacted, the client's
    /// last request the usage record counted, grown by a turn (abridge sees the whole
    /// history still); [`super::horizon::FAR`] when the record does not know it.
    pub fn as_the_client_sent(&self) -> u64 {
        let compacted = self.active.is_some() || !matches!(self.action, Action::Forward);
        match self.usage {
            _ if !compacted => self.predicted,
            Some(u) if u.client_tokens > 0 => u
                .client_tokens
                .saturating_add(self.growth)
                .max(self.predicted),
            _ => super::horizon::FAR,
        }
    }
}

impl Decision {
    /// What the record stage needs of a request's prediction: its figures and the usage
    /// record it came from.
    pub(super) fn carry(&mut self, decided: &Decided<'_>, turn: &Turn<'_, '_>) {
        self.estimate = decided.predicted;
        if let Some(beside) = to_record(turn) {
            self.beside = beside;
        }
        self.head_tokens = decided.head_tokens;
        self.appended = decided.appended;
        self.growth = decided.growth;
        self.usage = decided.usage.map(|u| u.prefix);
        self.previous = decided.usage.map(|u| Record {
            tokens: u.tokens,
            ratio_permille: u.ratio_permille,
            applied: u.applied,
            growth: u.growth,
        });
        self.previous_at_ms = decided.usage.map(|u| u.at_ms);
        self.previous_client_tokens = decided.usage.map_or(0, |u| u.client_tokens);
        self.expects = decided.expects;
        self.verdict.why = decided.why;
        self.verdict.figures = decided.figures;
    }
}
