//! `POST /v1/messages/count_tokens` where abridge serves Anthropic's compaction and
//! context editing: the body counted is what `/v1/messages` forwards, short of a
//! compaction of its own — a `compaction` block sent back expanded into its summary
//! (everything before it dropped), `clear_thinking_20251015` and
//! `clear_tool_uses_20250919` applied, `context_management` withheld — and, when the request had `context_management`, the
//! upstream's `{"input_tokens": N}` given Anthropic's
//! `"context_management": {"original_input_tokens": M}` ([`amended`]).
//!
//! Counting makes no summary: `compact_20260112` is not applied (Anthropic's
//! count_tokens does not compact either). An invalid `context_management` gets the
//! same 400 as on `/v1/messages`; a body abridge cannot parse goes on untouched.
//!
//! M is not asked of the upstream a second time: it is the upstream's count scaled by
//! abridge's estimate ([`crate::tokens::approx_text`]) of the prompt before the edits
//! over its estimate of the prompt counted — the upstream's own count when no edit
//! changed anything. A `compaction` block is expanded in both (the upstream never sees
//! one on `/v1/messages`), so M is the count before context editing.

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;

use super::edits::Edits;
use super::{
    After, asks, changes_nothing, clear_edits, entries, estimate, forwarded, requested, untouched,
    without_management,
};
use crate::compactor::Reason;
use crate::formats::messages::Parsed;
use crate::formats::{self, Format, splice};
use crate::identity::IdentityKey;
use crate::json::Raw;
use crate::prepare::parse;
use crate::state::AppState;
use crate::strategies::SummaryRole;

/// The largest upstream answer read to add `original_input_tokens` (a count is a few
/// dozen bytes); a larger one is relayed as it comes.
pub const MAX_ANSWER: usize = 64 * 1024;

/// What a count request comes to.
pub enum Count {
    /// abridge's answer (an invalid `context_management`): nothing is forwarded.
    Refused(axum::response::Response),
    /// This body goes to the upstream's count_tokens; with a [`Scale`], the request had
    /// `context_management` and the answer is to be [`amended`].
    Send(Bytes, Option<Scale>),
}

/// abridge's estimates of the prompt before the edits and of the prompt counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    before: u64,
    counted: u64,
}

impl Scale {
    /// Nothing edited: the upstream's count is the original one.
    const SAME: Scale = Scale {
        before: 1,
        counted: 1,
    };

    /// The count before the edits, for the upstream's count `n` of the edited prompt
    /// (rounded to the nearest token).
    pub fn original(self, n: u64) -> u64 {
        if self.before == self.counted || self.counted == 0 {
            return n;
        }
        let scaled = (u128::from(n) * u128::from(self.before) * 2 + u128::from(self.counted))
            / (u128::from(self.counted) * 2);
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }
}

/// The body of a count request (read whole, bounded, by the caller) as it is to be
/// counted: parsed once, off the async workers.
pub async fn body(state: &AppState, body: Bytes) -> Count {
    let request = match parse(state, Reason::Request, Format::Messages, body).await {
        Ok(request) => request,
        Err((body, reason)) => {
            tracing::debug!(%reason, "counting a body abridge does not understand untouched");
            return Count::Send(body, None);
        }
    };
    let formats::Request::Messages(messages) = &*request else {
        return Count::Send(request.body().clone(), None);
    };
    let (body, parsed) = (messages.body(), messages.parsed());
    if !asks(body, parsed) {
        return Count::Send(body.clone(), None);
    }
    let key = state.identity_key().await;
    let role = state.config().strategies.summary_role;
    let permit = state.cpu().permit_for(body.len()).await;
    state
        .cpu()
        .run_with(&permit, || counted(key.as_deref(), (body, parsed), role))
}

/// What [`body`] makes of a parsed request: see the module docs.
fn counted(
    key: Option<&IdentityKey>,
    (body, parsed): (&Bytes, &Parsed<'_>),
    role: SummaryRole,
) -> Count {
    let untouched_body = || Count::Send(body.clone(), None);
    let edits = match requested(parsed) {
        // Counting makes no summary.
        Ok(edits) => edits.map(|edits| Edits {
            compact: None,
            ..edits
        }),
        Err(refusal) => return Count::Refused(*refusal),
    };
    if let Some(edits) = &edits
        && changes_nothing(body, parsed, edits)
    {
        return match without_management(body, parsed) {
            Some(cut) => Count::Send(cut, Some(Scale::SAME)),
            None => untouched_body(),
        };
    }
    let Some((mut entries, _)) = entries(key, parsed, role) else {
        return untouched_body();
    };
    if edits.is_none() && untouched(&entries) {
        return untouched_body();
    }
    let before = estimate(body, parsed, &entries);
    if let Some(edits) = &edits {
        // What was applied is not reported: a count's answer has no `applied_edits`.
        let mut applied = After::new(true, None);
        clear_edits(edits, (body, parsed), &mut entries, &mut applied);
    }
    let scale = edits.map(|_| Scale {
        before,
        counted: estimate(body, parsed, &entries),
    });
    match forwarded(body, parsed, &entries) {
        Some(edited) => Count::Send(edited, scale),
        None => untouched_body(),
    }
}

/// The upstream's answer to a count (read whole) with
/// `"context_management": {"original_input_tokens": M}`, every other byte of it kept:
/// added after its members, or in place of a `context_management` of the upstream's
/// own (vLLM's count_tokens reports one for the body it was sent, which abridge
/// edited). `None` (relay it as it came) unless it is a JSON object with a
/// whole-number `input_tokens`.
pub fn amended(answer: &[u8], scale: Scale) -> Option<Bytes> {
    let text = std::str::from_utf8(answer).ok()?;
    let object: BTreeMap<Cow<'_, str>, Raw<'_>> = serde_json::from_str(text).ok()?;
    let n: u64 = object.get("input_tokens")?.get().parse().ok()?;
    let original = format!(r#"{{"original_input_tokens":{}}}"#, scale.original(n));
    let (span, value) = match object.get("context_management") {
        Some(own) => (splice::span_of(answer, own.get())?, original),
        // A JSON object's text ends with its closing brace (and perhaps whitespace).
        None => {
            let close = text.trim_end().len().checked_sub(1)?;
            (close..close, format!(r#","context_management":{original}"#))
        }
    };
    let edit = splice::Edit {
        span,
        bytes: value.into_bytes(),
    };
    splice::apply(answer, vec![edit])
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::secret::Secret;

    fn key() -> IdentityKey {
        IdentityKey::new(Secret::new("count"))
    }

    /// What is sent for `body` (its scale), or the refusal's status.
    fn count_of(body: &Value, key: Option<&IdentityKey>) -> Result<(Value, Option<Scale>), u16> {
        let text = Bytes::from(body.to_string());
        let request = formats::Request::parse(Format::Messages, text).unwrap();
        let formats::Request::Messages(messages) = &request else {
            unreachable!("parsed as Messages")
        };
        let parsed = (messages.body(), messages.parsed());
        match counted(key, parsed, SummaryRole::User) {
            Count::Send(sent, scale) => Ok((serde_json::from_slice(&sent).unwrap(), scale)),
            Count::Refused(response) => Err(response.status().as_u16()),
        }
    }

    fn ask(text: &str) -> Value {
        json!({"role": "user", "content": text})
    }

    fn tool_rounds(n: u32, output: &str) -> Vec<Value> {
        let mut messages = vec![ask("read them")];
        for n in 1..=n {
            let id = format!("toolu_{n}");
            messages.push(json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": id, "name": "read", "input": {"path": format!("/f{n}")}}]}));
            messages.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": output}]}));
        }
        messages
    }

    #[test]
    fn the_original_count_is_the_upstreams_scaled_by_the_estimates() {
        assert_eq!(Scale::SAME.original(1234), 1234);
        let scale = Scale {
            before: 300,
            counted: 100,
        };
        assert_eq!(scale.original(41), 123);
        // Rounded to the nearest token; nothing counted by abridge: the upstream's.
        assert_eq!(scale.original(1), 3);
        let third = Scale {
            before: 2,
            counted: 3,
        };
        assert_eq!(third.original(10), 7);
        let empty = Scale {
            before: 5,
            counted: 0,
        };
        assert_eq!(empty.original(9), 9);
        assert_eq!(scale.original(u64::MAX), u64::MAX, "saturates");
    }

    #[test]
    fn a_count_gets_original_input_tokens_and_keeps_its_bytes() {
        let scale = Scale {
            before: 2,
            counted: 1,
        };
        let amended = |text: &str| amended(text.as_bytes(), scale);
        assert_eq!(
            amended("{\"input_tokens\": 10}\n").unwrap(),
            "{\"input_tokens\": 10,\"context_management\":{\"original_input_tokens\":20}}\n"
        );
        // The upstream's own (vLLM's), of the body abridge edited: replaced.
        assert_eq!(
            amended(
                "{\"context_management\": {\"original_input_tokens\": 10}, \"input_tokens\": 10}"
            )
            .unwrap(),
            "{\"context_management\": {\"original_input_tokens\":20}, \"input_tokens\": 10}"
        );
        assert_eq!(
            amended("{\"input_tokens\":10,\"context_management\":null}").unwrap(),
            "{\"input_tokens\":10,\"context_management\":{\"original_input_tokens\":20}}"
        );
        for relayed in [
            "{\"input_tokens\": \"10\"}",
            "{\"input_tokens\": 1.5}",
            "{\"input_tokens\": -1}",
            "{\"tokens\": 10}",
            "[10]",
            "{\"type\": \"error\"}",
            "not json",
        ] {
            assert_eq!(amended(relayed), None, "{relayed}");
        }
    }

    #[test]
    fn a_sealed_block_is_counted_expanded() {
        let key = key();
        let block = super::super::tests::sealed_block(&key, 2);
        let body = json!({"model": "m", "messages": [ask("old ask"),
            {"role": "assistant", "content": [block]}, ask("now")]});
        let (sent, scale) = count_of(&body, Some(&key)).unwrap();
        let text = sent.to_string();
        assert!(!text.contains("old ask") && !text.contains("\"compaction\""));
        assert!(text.contains("fixing the parser"), "{text}");
        assert_eq!(
            sent["messages"].as_array().unwrap().last(),
            Some(&ask("now"))
        );
        assert_eq!(scale, None, "no context_management: nothing to add");
    }

    #[test]
    fn cleared_tool_uses_are_counted_cleared_and_scaled_back() {
        let messages = tool_rounds(4, &"output ".repeat(200));
        let clear = json!({"type": "clear_tool_uses_20250919",
            "trigger": {"type": "tool_uses", "value": 2}, "keep": {"type": "tool_uses", "value": 1}});
        // Over its trigger, and a compaction over its own: counting makes no summary.
        let compact = json!({"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50000}});
        let body = json!({"model": "m", "messages": messages,
            "context_management": {"edits": [clear, compact]}});
        let (sent, scale) = count_of(&body, Some(&key())).unwrap();
        assert!(sent.get("context_management").is_none());
        let sent = sent["messages"].as_array().unwrap();
        assert_eq!(sent.len(), messages.len(), "nothing summarised");
        let cleared = sent
            .iter()
            .filter(|m| m.to_string().contains(super::super::clear::PLACEHOLDER));
        assert_eq!(cleared.count(), 3);
        let scale = scale.unwrap();
        assert!(scale.before > 2 * scale.counted, "{scale:?}");
        assert!(scale.original(100) > 200);
    }

    #[test]
    fn edits_that_change_nothing_only_withhold_the_field() {
        let body = json!({"model": "m", "messages": tool_rounds(2, "short"),
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"},
                {"type": "clear_tool_uses_20250919"}]}});
        let (sent, scale) = count_of(&body, None).unwrap();
        let mut expected = body.clone();
        expected
            .as_object_mut()
            .unwrap()
            .remove("context_management");
        assert_eq!(sent, expected);
        assert_eq!(scale, Some(Scale::SAME));
        // Nothing asked: the body as it came.
        let plain = json!({"model": "m", "messages": [ask("compaction, in a word")]});
        assert_eq!(count_of(&plain, None).unwrap(), (plain.clone(), None));
    }

    #[test]
    fn an_invalid_edit_is_refused() {
        let body = json!({"model": "m", "messages": [ask("hi")],
            "context_management": {"edits": [{"type": "clear_everything"}]}});
        assert_eq!(count_of(&body, None), Err(400));
    }
}
