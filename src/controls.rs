//! abridge's own headers: the per-request controls a client may send, and the report
//! abridge adds to every chat-completions response.
//!
//! Request (all removed before forwarding; an invalid value is a 400 that names the
//! header and the values it takes):
//! - `x-abridge-compact: auto | force | off` — `force` compacts now even under the
//!   threshold (to half the predicted size, at most the soft threshold); `off` forwards
//!   the request byte for byte, no checkpoint applied;
//! - `x-abridge-strategy: deterministic | recency | structured | llm_replace`;
//! - `x-abridge-conversation: <id>` — separates conversations that share an opening
//!   (part of the conversation's namespace; 1–256 visible ASCII characters).
//!
//! An operator may refuse clients the costly controls (`compaction.client_strategy`,
//! `compaction.client_force`): the header is then ignored, and the report says so.
//!
//! Response: `x-abridge-compacted: true|false`, `x-abridge-strategy`,
//! `x-abridge-tokens-before`, `x-abridge-tokens-after` (estimates),
//! `x-abridge-messages-replaced`, `x-abridge-conversation` (the conversation key),
//! `x-abridge-reason` (why the cost policy compacted or not: `window`, `threshold`,
//! `pays`, `cache-cold`, `not-worth-it`; `size-no-price` when a model without a price
//! was compacted by size), and
//! `x-abridge-note` when something deserves saying (observe mode, anti-thrash, a
//! fallback, the store being unavailable).

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::error::Error;
use crate::identity::Fingerprint;
use crate::strategies::Strategy;

pub const COMPACT: &str = "x-abridge-compact";
pub const STRATEGY: &str = "x-abridge-strategy";
pub const CONVERSATION: &str = "x-abridge-conversation";
pub const RECALL: &str = "x-abridge-recall";

/// What the client asked for with `x-abridge-compact`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compact {
    #[default]
    Auto,
    Force,
    Off,
}

/// The per-request controls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Controls {
    pub compact: Compact,
    pub strategy: Option<Strategy>,
    pub conversation: Option<String>,
    /// `x-abridge-recall: off`: no recall tool for this request.
    pub recall_off: bool,
    /// Controls the operator does not allow clients, ignored (for the report).
    pub ignored: Vec<&'static str>,
}

/// Which controls clients may use (`compaction.client_strategy`, `client_force`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    pub strategy: bool,
    pub force: bool,
}

impl Default for Allowed {
    fn default() -> Self {
        Self {
            strategy: true,
            force: true,
        }
    }
}

impl Controls {
    /// The controls a request's headers ask for, within what is `allowed`.
    pub fn from_headers(headers: &HeaderMap, allowed: Allowed) -> Result<Self, Error> {
        let mut controls = Self::requested(headers)?;
        if controls.strategy.is_some() && !allowed.strategy {
            controls.strategy = None;
            controls.ignored.push(
                "x-abridge-strategy ignored: the operator does not let clients choose (compaction.client_strategy)",
            );
        }
        if controls.compact == Compact::Force && !allowed.force {
            controls.compact = Compact::Auto;
            controls.ignored.push(
                "x-abridge-compact: force ignored: the operator does not let clients force (compaction.client_force)",
            );
        }
        Ok(controls)
    }

    fn requested(headers: &HeaderMap) -> Result<Self, Error> {
        let text = |name: &'static str, expected: &'static str| -> Result<Option<&str>, Error> {
            match headers.get(name) {
                None => Ok(None),
                Some(v) => v
                    .to_str()
                    .map(|s| Some(s.trim()))
                    .map_err(|_| bad(name, "(not text)", expected)),
            }
        };
        let compact = match text(COMPACT, "auto, force or off")? {
            None => Compact::Auto,
            Some(v) if v.eq_ignore_ascii_case("auto") => Compact::Auto,
            Some(v) if v.eq_ignore_ascii_case("force") => Compact::Force,
            Some(v) if v.eq_ignore_ascii_case("off") => Compact::Off,
            Some(v) => return Err(bad(COMPACT, v, "auto, force or off")),
        };
        let expected = "deterministic, recency, structured or llm_replace";
        let strategy = match text(STRATEGY, expected)? {
            None => None,
            Some(v) => Some(
                v.to_ascii_lowercase()
                    .parse::<Strategy>()
                    .map_err(|_| bad(STRATEGY, v, expected))?,
            ),
        };
        let expected = "1 to 256 visible ASCII characters";
        let conversation = match text(CONVERSATION, expected)? {
            None => None,
            Some(v) if (1..=256).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_graphic()) => {
                Some(v.to_owned())
            }
            Some(v) => return Err(bad(CONVERSATION, v, expected)),
        };
        let recall_off = match text(RECALL, "on or off")? {
            None => false,
            Some(v) if v.eq_ignore_ascii_case("on") => false,
            Some(v) if v.eq_ignore_ascii_case("off") => true,
            Some(v) => return Err(bad(RECALL, v, "on or off")),
        };
        Ok(Self {
            compact,
            strategy,
            conversation,
            recall_off,
            ignored: Vec::new(),
        })
    }
}

fn bad(header: &'static str, value: &str, expected: &'static str) -> Error {
    let shown: String = value.chars().take(64).collect();
    Error::BadHeader {
        header,
        value: shown,
        expected,
    }
}

/// What abridge did with a chat request, for the response headers and the logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The forwarded messages differ from the client's.
    pub compacted: bool,
    pub strategy: Option<Strategy>,
    pub tokens_before: Option<u64>,
    pub tokens_after: Option<u64>,
    pub messages_replaced: Option<usize>,
    pub conversation: Option<Fingerprint>,
    /// Something the client should know (observe mode, anti-thrash, a fallback...).
    pub note: Option<String>,
    /// Recall calls abridge answered for this request (`None`: no recall tool added).
    pub recalls: Option<u32>,
    /// Why the cost policy compacted this request, or did not (`window`, `threshold`,
    /// `pays`, `cache-cold`, `not-worth-it`; `size-no-price`: compacted by size, the
    /// model having no price).
    pub reason: Option<&'static str>,
}

impl Report {
    /// Adds a note; several are joined with "; " (none is lost to a later one).
    pub fn add_note(&mut self, note: impl Into<String>) {
        let note = note.into();
        self.note = Some(match self.note.take() {
            Some(earlier) if earlier != note => format!("{earlier}; {note}"),
            _ => note,
        });
    }

    pub fn write(&self, headers: &mut HeaderMap) {
        let mut put = |name: &'static str, value: String| {
            if let Ok(value) = HeaderValue::try_from(value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        };
        put("x-abridge-compacted", self.compacted.to_string());
        if let Some(reason) = self.reason {
            put("x-abridge-reason", reason.to_owned());
        }
        if let Some(s) = self.strategy {
            put("x-abridge-strategy", s.to_string());
        }
        if let Some(n) = self.tokens_before {
            put("x-abridge-tokens-before", n.to_string());
        }
        if let Some(n) = self.tokens_after {
            put("x-abridge-tokens-after", n.to_string());
        }
        if let Some(n) = self.messages_replaced {
            put("x-abridge-messages-replaced", n.to_string());
        }
        if let Some(c) = self.conversation {
            put("x-abridge-conversation", c.to_hex());
        }
        if let Some(n) = self.recalls {
            put("x-abridge-recalls", n.to_string());
        }
        if let Some(note) = &self.note {
            // Header values are visible ASCII; a note is plain English.
            let clean: String = note
                .chars()
                .map(|c| {
                    if c.is_ascii_graphic() || c == ' ' {
                        c
                    } else {
                        '?'
                    }
                })
                .collect();
            put("x-abridge-note", clean);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn parses_valid_controls() {
        assert_eq!(
            Controls::from_headers(&HeaderMap::new(), Allowed::default()).unwrap(),
            Controls::default()
        );
        let c = Controls::from_headers(
            &headers(&[
                (COMPACT, "Force"),
                (STRATEGY, "llm_replace"),
                (CONVERSATION, "ticket-42"),
            ]),
            Allowed::default(),
        )
        .unwrap();
        assert_eq!(c.compact, Compact::Force);
        assert_eq!(c.strategy, Some(Strategy::LlmReplace));
        assert_eq!(c.conversation.as_deref(), Some("ticket-42"));
        assert_eq!(
            Controls::from_headers(&headers(&[(COMPACT, " off ")]), Allowed::default())
                .unwrap()
                .compact,
            Compact::Off
        );
    }

    #[test]
    fn an_operator_can_refuse_clients_force_and_strategies() {
        let refused = Allowed {
            strategy: false,
            force: false,
        };
        let c = Controls::from_headers(
            &headers(&[(COMPACT, "force"), (STRATEGY, "structured")]),
            refused,
        )
        .unwrap();
        assert_eq!((c.compact, c.strategy), (Compact::Auto, None));
        assert_eq!(c.ignored.len(), 2);
        // `off` is always the client's to choose.
        let off = Controls::from_headers(&headers(&[(COMPACT, "off")]), refused).unwrap();
        assert_eq!(off.compact, Compact::Off);
        assert!(off.ignored.is_empty());
    }

    #[test]
    fn invalid_values_are_clear_errors() {
        for (name, value) in [
            (COMPACT, "sometimes"),
            (STRATEGY, "magic"),
            (CONVERSATION, "has space"),
        ] {
            let err =
                Controls::from_headers(&headers(&[(name, value)]), Allowed::default()).unwrap_err();
            assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
            let text = err.to_string();
            assert!(text.contains(name) && text.contains(value), "{text}");
        }
        let long = "x".repeat(300);
        let mut h = HeaderMap::new();
        h.insert(CONVERSATION, HeaderValue::from_str(&long).unwrap());
        assert!(Controls::from_headers(&h, Allowed::default()).is_err());
    }

    #[test]
    fn report_headers() {
        let mut h = HeaderMap::new();
        Report {
            compacted: true,
            strategy: Some(Strategy::Recency),
            tokens_before: Some(9000),
            tokens_after: Some(2000),
            messages_replaced: Some(30),
            conversation: None,
            note: Some("fallback: summariser timed out".into()),
            recalls: Some(2),
            reason: Some("pays"),
        }
        .write(&mut h);
        assert_eq!(h["x-abridge-reason"], "pays");
        assert_eq!(h["x-abridge-compacted"], "true");
        assert_eq!(h["x-abridge-strategy"], "recency");
        assert_eq!(h["x-abridge-tokens-before"], "9000");
        assert_eq!(h["x-abridge-messages-replaced"], "30");
        assert_eq!(h["x-abridge-note"], "fallback: summariser timed out");
        assert_eq!(h["x-abridge-recalls"], "2");
        assert!(h.get("x-abridge-conversation").is_none());
    }
}
