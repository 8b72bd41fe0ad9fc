//! What a request's compaction came to, as values: the compactor decides them, the
//! metrics count them, the admin API lists them. Below both, so neither imports the
//! other for them.

/// What started a compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// A request predicted over the hard threshold.
    Threshold,
    /// `x-abridge-compact: force` (or an operator's scheduled compaction).
    Forced,
    /// The provider answered "context length exceeded"; compacted and retried.
    Retry,
    /// Prepared after a response, ahead of the crossing.
    Background,
}

impl Trigger {
    pub const ALL: [Trigger; 4] = [
        Trigger::Threshold,
        Trigger::Forced,
        Trigger::Retry,
        Trigger::Background,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Threshold => "threshold",
            Trigger::Forced => "forced",
            Trigger::Retry => "retry",
            Trigger::Background => "background",
        }
    }
}

/// Why even the minimal plan (the head, a marker, the final turn) does not fit the
/// threshold: the anti-thrash case, for the note and the metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Uncompactable {
    /// The leading system messages (and tools) take most of the threshold.
    Head,
    /// The final turn is too big (an agent's large tool output): usually gone from the
    /// final turn next time.
    FinalTurn,
}

impl Uncompactable {
    pub const ALL: [Uncompactable; 2] = [Uncompactable::Head, Uncompactable::FinalTurn];

    pub fn as_str(self) -> &'static str {
        match self {
            Uncompactable::Head => "head",
            Uncompactable::FinalTurn => "final_turn",
        }
    }

    /// Which part takes the room, for the client's note.
    pub fn why(self) -> &'static str {
        match self {
            Uncompactable::Head => "the system prompt takes most of it",
            Uncompactable::FinalTurn => "the final turn takes most of it",
        }
    }
}

/// Why a request was, or was not, compacted under the cost policy (`compactor::cost`):
/// the `x-abridge-reason` header and the `cost_decisions` metric's label.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Why {
    /// It would not fit the model's window for long: compacted whatever it costs.
    Window,
    /// Over the operator's `threshold_tokens`: a bound they chose.
    Threshold,
    /// Over the threshold, or past the soft one under it, and compacting pays before
    /// the window forces it.
    Pays,
    /// The provider's cache had expired: compacting now costs nearly nothing more.
    CacheCold,
    /// Over the threshold, but compacting would cost more than it saves.
    NotWorthIt,
}

impl Why {
    /// As the `x-abridge-reason` header and the metric's label say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Window => "window",
            Why::Threshold => "threshold",
            Why::Pays => "pays",
            Why::CacheCold => "cache-cold",
            Why::NotWorthIt => "not-worth-it",
        }
    }

    /// Whether it says to compact.
    pub fn compacts(self) -> bool {
        !matches!(self, Why::NotWorthIt)
    }
}

/// What the cost policy weighed for one request, as the admin API shows the latest of a
/// conversation: numbers only (dollars in millionths), stored with the conversation's
/// account, every field defaulted so a record written before one was added still loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Figures {
    /// The request as it would go (the provider's count, with the estimate's margin).
    pub prompt: u64,
    /// The expected cost of the requests still to come sent as they are, and compacted
    /// now (the summary included): the cost model's two totals.
    pub as_is_micros: u64,
    pub compacted_micros: u64,
    /// After how many requests a compaction now would have paid for itself (`None`:
    /// not within the requests the model counts at most).
    pub break_even: Option<u64>,
    /// Requests the conversation was expected to still make, this one included.
    pub remaining: u64,
    /// The provider's cache was taken to have expired, and how long since the
    /// conversation's previous request (`None`: no report of one).
    pub cold: bool,
    pub since_ms: Option<u64>,
    /// The hard threshold, and where a compaction aims (the provider's count).
    pub threshold: u64,
    pub target: u64,
}

/// What was decided for a conversation's latest request: under which policy, whether it
/// was compacted and why, and what the cost model weighed (stored with its account).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Verdict {
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// `compaction.policy = "cost"` was configured; with a price for the model
    /// (`priced`) the cost policy decided, else the size policy did.
    pub cost: bool,
    pub priced: bool,
    pub compacted: bool,
    /// Why the cost policy compacted, or did not (`None`: under every bound, nothing
    /// weighed, or the size policy).
    pub why: Option<Why>,
    /// What the cost model weighed (`None`: nothing was).
    pub figures: Option<Figures>,
}
