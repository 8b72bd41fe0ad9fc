//! The label sets of abridge's metrics and how each value is written: closed enums (a
//! client never creates a series), except a model name, which is escaped as the text
//! format requires.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

use crate::outcome::{Trigger, Uncompactable, Why};
use crate::strategies::Strategy;

/// Which handler served a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST /v1/chat/completions`, which abridge reads.
    Chat,
    /// `POST /v1/responses`, which abridge reads.
    Responses,
    /// `POST /v1/messages` (Anthropic), which abridge reads.
    Messages,
    /// Everything else under `/v1`.
    Passthrough,
}

/// The class of a response status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Success,
    Redirect,
    ClientError,
    ServerError,
    Other,
}

impl Class {
    pub fn of(status: http::StatusCode) -> Self {
        match status.as_u16() {
            200..=299 => Class::Success,
            300..=399 => Class::Redirect,
            400..=499 => Class::ClientError,
            500..=599 => Class::ServerError,
            _ => Class::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Class::Success => "2xx",
            Class::Redirect => "3xx",
            Class::ClientError => "4xx",
            Class::ServerError => "5xx",
            Class::Other => "other",
        }
    }
}

/// A strategy as a label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct StrategyLabel(pub(super) Strategy);

impl From<Strategy> for StrategyLabel {
    fn from(s: Strategy) -> Self {
        StrategyLabel(s)
    }
}

impl StrategyLabel {
    pub(super) fn as_str(self) -> &'static str {
        self.0.as_str()
    }
}

/// Label values are the lower-case names used everywhere else (`chat`, `2xx`,
/// `structured`, `background`...).
macro_rules! label_value {
    ($($t:ty),*) => {$(
        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
                std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    )*};
}

label_value!(
    Trigger,
    Route,
    Class,
    StrategyLabel,
    Phase,
    Uncompactable,
    Why
);

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Chat => "chat",
            Route::Responses => "responses",
            Route::Messages => "messages",
            Route::Passthrough => "passthrough",
        }
    }
}

impl Phase {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Phase::Before => "before",
            Phase::After => "after",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct RequestLabels {
    pub(super) route: Route,
    pub(super) class: Class,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct RouteLabel {
    pub(super) route: Route,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct CompactionLabels {
    pub(super) strategy: StrategyLabel,
    pub(super) trigger: Trigger,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct CaseLabel {
    pub(super) case: Uncompactable,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ModelLabel {
    pub(super) model: Escaped,
}

/// A label value a client chose (a model name): escaped as the text format requires
/// (prometheus-client writes label values as they are), so no name can end the value
/// and write lines of its own into `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Escaped(pub(super) String);

impl EncodeLabelValue for Escaped {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub(super) reason: Why,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct CompactedLabel {
    pub(super) compacted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Phase {
    Before,
    After,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct PhaseLabel {
    pub(super) phase: Phase,
}
