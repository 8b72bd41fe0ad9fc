//! OpenAI's Responses API (`POST /v1/responses`), as a stateless client sends it: the
//! whole conversation in `input` every turn (`store: false`), the system prompt in
//! `instructions` or in leading `developer`/`system` items.
//!
//! Items and their neutral view:
//! - `message` (also an item without `type` but with a `role`): its role; content a
//!   string or parts, `input_text`/`output_text` read as text, everything else
//!   (`input_image`, `input_file`, `refusal`) kept raw;
//! - `function_call` {`call_id`, `name`, `arguments`}, `custom_tool_call` {`call_id`,
//!   `name`, `input`}, `local_shell_call` {`call_id`, `action`}: an assistant's call;
//! - `function_call_output` / `custom_tool_call_output` / `local_shell_call_output`
//!   {`call_id`, `output`}: the result of that call (paired by `call_id`);
//! - `reasoning` {`id`, `summary`, `encrypted_content`}: travels with the item after it,
//!   never edited;
//! - `compaction` (the provider's own, encrypted): nothing before it is moved;
//! - anything else (`web_search_call`, `image_generation_call`, …): kept verbatim,
//!   its bytes part of identity.
//!
//! Requests that keep state on the provider (`previous_response_id`, `conversation`,
//! `item_reference` items) or ask for its own compaction (`context_management`, a
//! `compaction_trigger` item) are forwarded untouched: see [`Request::untouchable`].
//!
//! What abridge writes: a `message` item of role `user` (or `developer` for the system
//! role) with one `input_text` part; a digest replaces a result's `output`.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::Author;
use super::splice::{Edit, apply, array, span_of};
use crate::conversation::{Item, Opaque};
use crate::json::{self, Raw};

mod item;

use item::{ItemFields, Kind, item_of};
pub use item::{item, item_by_serde};

/// The top level of a Responses request, of which abridge reads only this.
#[derive(Debug, Deserialize)]
pub struct Fields<'a> {
    #[serde(borrow, default)]
    pub model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub input: Option<Raw<'a>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(borrow, default)]
    pub previous_response_id: Option<Raw<'a>>,
    #[serde(borrow, default)]
    pub conversation: Option<Raw<'a>>,
    #[serde(borrow, default)]
    pub context_management: Option<Raw<'a>>,
    #[serde(borrow, default)]
    pub prompt_cache_key: Option<Cow<'a, str>>,
    /// The client's tools (`null` included, to replace it) and `tool_choice`, as
    /// written (see [`crate::recall`]).
    #[serde(borrow, default, deserialize_with = "super::present")]
    pub tools: Option<Raw<'a>>,
    #[serde(borrow, default)]
    pub tool_choice: Option<Raw<'a>>,
}

/// A parsed request: the top level and the `input` items (empty when `input` is a
/// string or absent: nothing to compact).
#[derive(Debug)]
pub struct Parsed<'a> {
    pub fields: Fields<'a>,
    pub raw_items: Vec<Raw<'a>>,
    pub items: Vec<Item<'a>>,
    /// Why the request is forwarded untouched, if it is (see [`Request::untouchable`]).
    pub untouchable: Option<&'static str>,
}

/// Why a body is not a Responses request abridge understands.
#[derive(Debug, thiserror::Error)]
pub enum Unparseable {
    #[error("request body is not a Responses request: {0}")]
    Body(serde_json::Error),
    #[error("input item {index} is not understood: {error}")]
    Item {
        index: usize,
        error: serde_json::Error,
    },
}

/// The body parsed: its top level and the `input` items found by the validating pass
/// (serde reads what that leaves to it, and gives the errors), then every item read by
/// its walk.
pub fn parse(body: &[u8]) -> Result<Parsed<'_>, Unparseable> {
    with_items(super::read_top(body, walked, by_serde)?)
}

/// [`parse`] with the top level read by serde alone: what the validating pass must agree
/// with (tests and fuzzing compare them).
#[doc(hidden)]
pub fn parse_by_serde(body: &[u8]) -> Result<Parsed<'_>, Unparseable> {
    with_items(by_serde(body)?)
}

fn with_items<'a>(
    (fields, raw_items): (Fields<'a>, Vec<Raw<'a>>),
) -> Result<Parsed<'a>, Unparseable> {
    let present = |v: Option<Raw<'_>>| v.is_some_and(|v| v.get() != "null");
    let mut untouchable = if present(fields.previous_response_id) {
        Some(
            "previous_response_id: the conversation's state lives on the provider; forwarded untouched",
        )
    } else if present(fields.conversation) {
        Some("conversation: the conversation's state lives on the provider; forwarded untouched")
    } else if present(fields.context_management) {
        Some(
            "context_management: the provider compacts this conversation itself; forwarded untouched",
        )
    } else {
        None
    };
    let mut items = Vec::with_capacity(raw_items.len());
    for (index, raw) in raw_items.iter().enumerate() {
        let (item, kind) = item_of(*raw).map_err(|error| Unparseable::Item { index, error })?;
        match kind {
            Kind::Reference if untouchable.is_none() => {
                untouchable =
                    Some("item_reference: items stored on the provider; forwarded untouched");
            }
            Kind::Trigger if untouchable.is_none() => {
                untouchable = Some(
                    "compaction_trigger: the provider compacts this conversation itself; forwarded untouched",
                );
            }
            _ => {}
        }
        items.push(item);
    }
    drop_earlier_reasoning(&mut items);
    Ok(Parsed {
        fields,
        raw_items,
        items,
        untouchable,
    })
}

/// Marks the reasoning items before the last ask as [`Item::dropped`]: OpenAI drops an
/// earlier turn's reasoning from the prompt, so the provider counts none of it (replay,
/// counting so, comes within 2 % of fifteen real Codex rollouts' bills). Counted, they
/// made abridge's estimate of a Codex history larger than the provider's count by a
/// share that changes with every ask, and the ratio of the two scales every budget.
fn drop_earlier_reasoning(items: &mut [Item<'_>]) {
    let Some(last_ask) = items.iter().rposition(Item::is_ask) else {
        return;
    };
    for item in &mut items[..last_ask] {
        item.dropped = item.opaque == Opaque::WithNext;
    }
}

/// The top level and the `input` items as the validating pass found them; `None` for
/// whatever serde should read.
pub(super) fn walked<'a>(top: &json::Top<'a>) -> Option<(Fields<'a>, Vec<Raw<'a>>)> {
    let [
        model,
        input,
        stream,
        previous_response_id,
        conversation,
        context_management,
        prompt_cache_key,
        tools,
        tool_choice,
    ] = top.fields([
        "model",
        "input",
        "stream",
        "previous_response_id",
        "conversation",
        "context_management",
        "prompt_cache_key",
        "tools",
        "tool_choice",
    ])?;
    let items = input.and_then(|i| i.elements).unwrap_or_default().to_vec();
    let fields = Fields {
        model: json::optional_text(model)?,
        input: json::optional_raw(input),
        stream: json::optional_flag(stream)?,
        previous_response_id: json::optional_raw(previous_response_id),
        conversation: json::optional_raw(conversation),
        context_management: json::optional_raw(context_management),
        prompt_cache_key: json::optional_text(prompt_cache_key)?,
        tools: tools.map(|v| v.raw),
        tool_choice: json::optional_raw(tool_choice),
    };
    Some((fields, items))
}

/// The same read by serde (the reference, and the errors).
fn by_serde(body: &[u8]) -> Result<(Fields<'_>, Vec<Raw<'_>>), Unparseable> {
    let fields: Fields<'_> = super::from_body(body).map_err(Unparseable::Body)?;
    let items = match fields.input {
        Some(input) if input.get().starts_with('[') => {
            serde_json::from_str(input.get()).map_err(Unparseable::Body)?
        }
        _ => Vec::new(),
    };
    Ok((fields, items))
}

/// A message item abridge writes: one `input_text` part (the system role is
/// `developer`, as the Responses API names the operator's voice).
pub fn authored(role: Author, text: &str) -> Box<RawValue> {
    let role = match role {
        Author::User => "user",
        Author::System => "developer",
    };
    let json = serde_json::json!({
        "type": "message",
        "role": role,
        "content": [{"type": "input_text", "text": text}],
    });
    RawValue::from_string(json.to_string())
        .unwrap_or_else(|_| unreachable!("serde_json wrote valid JSON"))
}

/// The result item `raw` with its `output` replaced by the string `text`.
pub fn with_output(raw: Raw<'_>, text: &str) -> Option<Box<RawValue>> {
    let f: ItemFields<'_> = serde_json::from_str(raw.get()).ok()?;
    super::splice::with_string(raw, f.output?, text)
}

/// Whether two items are the same JSON object apart from `output`.
pub fn same_but_output(a: Raw<'_>, b: Raw<'_>) -> bool {
    super::splice::same_except(a, b, "output")
}

/// The body with its `input` array replaced by `items`, every other byte kept.
pub fn with_input(body: &Bytes, parsed: &Parsed<'_>, items: &[Raw<'_>]) -> Option<Bytes> {
    apply(body, vec![input_edit(body, parsed, items)?])
}

/// The edit [`with_input`] makes.
pub fn input_edit(body: &[u8], parsed: &Parsed<'_>, items: &[Raw<'_>]) -> Option<Edit> {
    let input = parsed.fields.input?;
    Some(Edit {
        span: span_of(body, input.get())?,
        bytes: array(items),
    })
}

owned_request!("Responses");

impl Request {
    /// Why this request keeps its state on the provider (or asks for the provider's own
    /// compaction), and so is forwarded untouched.
    pub fn untouchable(&self) -> Option<&'static str> {
        self.parsed().untouchable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{Opaque, Role};

    const BODY: &str = r#"{"model":"gpt-5","store":false,"stream":true,"instructions":"Be brief.",
        "input":[
        {"type":"message","role":"developer","content":[{"type":"input_text","text":"You are a coding agent."}]},
        {"type":"message","role":"user","content":[{"type":"input_text","text":"Run echo"}]},
        {"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAA"},
        {"type":"function_call","id":"fc_1","call_id":"call_1","name":"exec","arguments":"{\"cmd\":\"echo hi\"}"},
        {"type":"function_call_output","call_id":"call_1","output":"hi"},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Done."}]},
        {"role":"user","content":"Thanks"}],
        "tools":[{"type":"function","name":"exec"}],"prompt_cache_key":"thread-1"}"#;

    #[test]
    fn bytes_that_are_not_utf8_are_read_as_serde_reads_them() {
        let skipped = b"{\"input\":[{\"role\":\"user\",\"content\":\"hi\"}],\"x_vendor\":\"\xff\"}";
        assert_eq!(parse(skipped).unwrap().items.len(), 1);
        let in_item = b"{\"input\":[{\"role\":\"user\",\"content\":\"\xff\"}]}";
        assert!(parse(in_item).is_err());
    }

    #[test]
    fn items_have_their_neutral_view() {
        let parsed = parse(BODY.as_bytes()).unwrap();
        let items = &parsed.items;
        assert_eq!(items.len(), 7);
        assert_eq!(items[0].role, Role::Developer);
        assert!(items[0].is_instruction());
        assert_eq!(items[1].content.as_text().as_deref(), Some("Run echo"));
        assert!(items[1].is_ask());
        assert_eq!(items[2].opaque, Opaque::WithNext);
        assert_eq!(items[3].calls[0].id, "call_1");
        assert_eq!(items[3].calls[0].name, "exec");
        assert_eq!(items[4].results, ["call_1"]);
        assert!(items[4].is_result());
        assert_eq!(items[5].content.as_text().as_deref(), Some("Done."));
        assert!(items[6].is_ask(), "an item without type is a message");
        assert_eq!(parsed.fields.prompt_cache_key.as_deref(), Some("thread-1"));
        assert!(parsed.untouchable.is_none());
    }

    #[test]
    fn reasoning_counts_what_it_carries_and_nothing_once_a_later_ask_drops_it() {
        let estimator = crate::tokens::Estimator::approx();
        let parsed = parse(BODY.as_bytes()).unwrap();
        // Before the last ask ("Thanks"): the provider drops it.
        let reasoning = &parsed.items[2];
        assert!(reasoning.dropped);
        assert_eq!(estimator.message(reasoning), 0);
        assert!(estimator.read(reasoning) > 0);
        assert!(parsed.items.iter().filter(|i| i.dropped).count() == 1);
        // In the turn that made it: read, for the reasoning its ciphertext carries (a
        // token per 5.9 characters past 950), not for the ciphertext's length as text.
        let base64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let cipher = base64.repeat(1_000)[..4_000].to_owned();
        let current = BODY
            .replace(
                r#"{"role":"user","content":"Thanks"}"#,
                r#"{"type":"function_call_output","call_id":"call_0","output":"x"}"#,
            )
            .replace("\"gAAA\"", &format!("\"{cipher}\""));
        let parsed = parse(current.as_bytes()).unwrap();
        let reasoning = &parsed.items[2];
        assert!(!reasoning.dropped);
        assert_eq!(
            reasoning.reasoning,
            Some(((4_000 - 950) as f64 / 5.9) as u64)
        );
        let tokens = estimator.message(reasoning);
        assert!(tokens > 500 && tokens < 530, "{tokens}");
        // The same item counted as text (no reasoning read from it) comes to more than
        // twice that: the count is the reasoning's, not the ciphertext's.
        let as_text = Item {
            reasoning: None,
            ..reasoning.clone()
        };
        assert!(
            estimator.message(&as_text) > 2 * tokens,
            "as text it came to more"
        );
    }

    #[test]
    fn state_on_the_provider_is_left_alone() {
        for (body, why) in [
            (
                r#"{"previous_response_id":"resp_1","input":[{"role":"user","content":"hi"}]}"#,
                "previous_response_id",
            ),
            (r#"{"conversation":"conv_1","input":"hi"}"#, "conversation"),
            (
                r#"{"context_management":[{"type":"compaction"}],"input":[]}"#,
                "context_management",
            ),
            (
                r#"{"input":[{"type":"item_reference","id":"msg_1"},{"role":"user","content":"x"}]}"#,
                "item_reference",
            ),
            (
                r#"{"input":[{"role":"user","content":"x"},{"type":"compaction_trigger"}]}"#,
                "compaction_trigger",
            ),
        ] {
            let parsed = parse(body.as_bytes()).unwrap();
            assert!(
                parsed.untouchable.is_some_and(|u| u.contains(why)),
                "{body}"
            );
        }
        assert!(
            parse(br#"{"previous_response_id":null,"input":"hi"}"#)
                .unwrap()
                .untouchable
                .is_none()
        );
    }

    #[test]
    fn the_input_is_replaced_and_everything_else_kept() {
        let body = Bytes::from_static(BODY.as_bytes());
        let parsed = parse(&body).unwrap();
        let keep = [parsed.raw_items[0], parsed.raw_items[6]];
        let out = with_input(&body, &parsed, &keep).unwrap();
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.starts_with(
            r#"{"model":"gpt-5","store":false,"stream":true,"instructions":"Be brief.","#
        ));
        assert!(text.ends_with(
            r#""tools":[{"type":"function","name":"exec"}],"prompt_cache_key":"thread-1"}"#
        ));
        let again = parse(&out).unwrap();
        assert_eq!(again.items.len(), 2);
        // Digests replace the output only.
        let digest = with_output(parsed.raw_items[4], "[elided]").unwrap();
        assert!(same_but_output(Raw::from(&*digest), parsed.raw_items[4]));
        assert_eq!(
            item(Raw::from(&*digest))
                .unwrap()
                .content
                .as_text()
                .as_deref(),
            Some("[elided]")
        );
        let authored = authored(Author::User, "summary");
        assert!(item(Raw::from(&*authored)).unwrap().is_ask());
    }

    /// A value of an item field, in the shapes clients send and a few they should not.
    fn field_value() -> impl proptest::strategy::Strategy<Value = String> {
        use crate::formats::walk_check::{escaped_text, one_of};
        use proptest::prelude::*;
        prop_oneof![
            one_of(&[
                "null",
                "3",
                r#""\ud800""#,
                r#"[{"type":"input_text","text":"a\nb"},{"type":"input_image","image_url":"x"}]"#,
                r#"[{"type":"output_text","text":"ok","annotations":[]}]"#,
                r#"[{"type":"input_text","text":5}]"#,
                r#"[{"type":"input_text","type":"text","text":"dup"}]"#,
                r#"{"type":"exec","command":["ls"]}"#,
            ])
            .prop_map(str::to_owned),
            one_of(&[
                "message",
                "function_call",
                "function_call_output",
                "custom_tool_call",
                "local_shell_call",
                "reasoning",
                "user",
                "developer",
                "mess\\u0061ge",
            ])
            .prop_map(|r| format!("\"{r}\"")),
            escaped_text(),
        ]
    }

    proptest::proptest! {
        /// The walk reads every item as serde reads it: the same item, or the same
        /// refusal — whatever the fields hold, duplicated, escaped or odd.
        #[test]
        fn the_walk_reads_items_as_serde_does(
            members in proptest::collection::vec(
                (
                    crate::formats::walk_check::one_of(&[
                        "type", "role", "content", "call_id", "name", "arguments", "input",
                        "output", "action", "id",
                    ]),
                    field_value(),
                ),
                1..5,
            ),
        ) {
            let text = crate::formats::walk_check::object(&members);
            crate::formats::walk_check::agree(&text, item, item_by_serde)?;
        }
    }
}
