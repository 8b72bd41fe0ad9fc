//! Each format's side of recall: the tool as it writes tools (one constant each, so the
//! bytes are the same in every request of a conversation and the provider's prompt cache
//! keeps hitting), the recall calls in a provider's whole answer, the follow-up request
//! that carries their results, and the answer the client gets (the last round's, with the
//! usage of every round summed: the client pays for them all).
//!
//! Everything here takes the name the tool goes by in the request (`name`: [`NAME`], or
//! the name it was given apart from a client's own tool, see [`super::Tool`]): only calls
//! of that name are abridge's.

use std::borrow::Cow;

use serde_json::{Value, json};

use super::NAME;
use crate::formats::Format;
use crate::formats::splice::{Edit, apply, span_of};
use crate::json::Raw;

const DESCRIPTION: &str = "The earlier part of this conversation was condensed to fit the context window: a summary or an index stands in for the original messages, which are named by ids such as m12. Call this tool to read the exact original text of what was condensed, when you need a detail that is no longer in full view (a path, a command, a number, an error, what the user asked). Give `id` (an id from the summary or index, or a range such as m3-m9) or `query` (words to search the condensed messages for).";

/// The description offered before anything is condensed too (`recall.offer = "always"`):
/// true from a conversation's first request, so the model has no reason to call it until
/// a summary or an index names ids. The same bytes every request, as [`DESCRIPTION`].
const DESCRIPTION_ALWAYS: &str = "When this conversation grows too long for the context window, its earlier part is condensed: a summary or an index then stands in for the original messages, which it names by ids such as m12. Call this tool to read the exact original text of what was condensed, when you need a detail that is no longer in full view (a path, a command, a number, an error, what the user asked). Give `id` (an id from the summary or index, or a range such as m3-m9) or `query` (words to search the condensed messages for). Until the conversation is condensed there is nothing to read.";

/// The parameters' JSON schema, as written in every format.
const PARAMETERS: &str = r#"{"type":"object","properties":{"query":{"type":"string","description":"Words to search the condensed messages for."},"id":{"type":"string","description":"An id shown in the summary or index (m12), or a range (m3-m9)."}}}"#;

/// The tool in `format`'s shape, named `name` (`always`: offered from the first request,
/// see [`DESCRIPTION_ALWAYS`]): for [`NAME`], the same bytes every time.
pub fn tool(format: Format, name: &str, always: bool) -> Cow<'static, str> {
    use std::sync::OnceLock;
    static TOOLS: OnceLock<[[String; 3]; 2]> = OnceLock::new();
    if name != NAME {
        return Cow::Owned(definition(format, name, always));
    }
    let tools = TOOLS.get_or_init(|| {
        [false, true].map(|always| {
            [Format::Chat, Format::Responses, Format::Messages].map(|f| definition(f, NAME, always))
        })
    });
    let tools = &tools[usize::from(always)];
    Cow::Borrowed(match format {
        Format::Chat => &tools[0],
        Format::Responses => &tools[1],
        Format::Messages => &tools[2],
    })
}

fn definition(format: Format, name: &str, always: bool) -> String {
    let text = if always {
        DESCRIPTION_ALWAYS
    } else {
        DESCRIPTION
    };
    let description = Value::from(text).to_string();
    let name = Value::from(name).to_string();
    match format {
        Format::Chat => format!(
            r#"{{"type":"function","function":{{"name":{name},"description":{description},"parameters":{PARAMETERS}}}}}"#
        ),
        Format::Responses => format!(
            r#"{{"type":"function","name":{name},"description":{description},"parameters":{PARAMETERS}}}"#
        ),
        Format::Messages => {
            format!(r#"{{"name":{name},"description":{description},"input_schema":{PARAMETERS}}}"#)
        }
    }
}

/// abridge's estimate of the tool's tokens in `format` (`always`: its description when
/// offered from the first request): what a provider counts for its definition in every
/// request that carries it.
pub fn tool_tokens(format: Format, always: bool) -> u64 {
    crate::tokens::approx_text(&tool(format, NAME, always))
}

/// The names of a client's `tools` (as written) in `format`: each tool's `name` (chat's
/// `function.name`); `None` when they are not an array of objects.
pub fn tool_names(format: Format, tools: &str) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Named {
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        function: Option<Function>,
    }
    #[derive(serde::Deserialize)]
    struct Function {
        #[serde(default)]
        name: Option<String>,
    }
    let tools: Vec<Named> = serde_json::from_str(tools).ok()?;
    Some(
        tools
            .into_iter()
            .map(|t| match format {
                Format::Chat => t.function.and_then(|f| f.name).or(t.name),
                Format::Responses | Format::Messages => t.name,
            })
            .map(Option::unwrap_or_default)
            .collect(),
    )
}

/// A recall call in a provider's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub id: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// A provider's whole (non-streamed) answer, read for recall.
#[derive(Debug)]
pub struct Answer {
    pub value: Value,
    /// The recall calls it makes.
    pub calls: Vec<Call>,
}

impl Answer {
    /// `body` as `format`'s answer; `None` when it is not JSON.
    pub fn read(format: Format, body: &[u8], name: &str) -> Option<Self> {
        let value: Value = serde_json::from_slice(body).ok()?;
        Some(Self::of(format, value, name))
    }

    /// `value` as `format`'s whole answer (a streamed one, gathered: see [`super::stream`]).
    pub fn of(format: Format, value: Value, name: &str) -> Self {
        let calls = calls(format, &value, name);
        Self { value, calls }
    }
}

/// The calls of `name` in `answer` (chat: in its first choice, the one the rounds
/// continue).
fn calls(format: Format, answer: &Value, name: &str) -> Vec<Call> {
    let call = |id: &Value, arguments: String| Call {
        id: id.as_str().unwrap_or_default().to_owned(),
        arguments,
    };
    match format {
        Format::Chat => answer["choices"][0]["message"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["function"]["name"] == name)
            .map(|c| {
                let arguments = c["function"]["arguments"].as_str().unwrap_or("{}");
                call(&c["id"], arguments.to_owned())
            })
            .collect(),
        Format::Responses => answer["output"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|o| o["type"] == "function_call" && o["name"] == name)
            .map(|o| {
                call(
                    &o["call_id"],
                    o["arguments"].as_str().unwrap_or("{}").to_owned(),
                )
            })
            .collect(),
        Format::Messages => answer["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["type"] == "tool_use" && b["name"] == name)
            .map(|b| call(&b["id"], b["input"].to_string()))
            .collect(),
    }
}

/// The items to append to the conversation for one round: the answer's assistant turn
/// with only its recall calls (the client's own calls are dropped: the client would
/// have to answer them, and the model asks again once it has read what it recalled),
/// then each call's result.
pub fn round_items(
    format: Format,
    answer: &Answer,
    results: &[(Call, String)],
    name: &str,
) -> Vec<Value> {
    let mut out = Vec::new();
    match format {
        Format::Chat => {
            let mut message = answer.value["choices"][0]["message"].clone();
            if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
                calls.retain(|c| c["function"]["name"] == name);
            }
            // Fields of an answer a request does not take.
            if let Some(m) = message.as_object_mut() {
                for key in ["refusal", "annotations", "audio", "reasoning_content"] {
                    m.remove(key);
                }
            }
            out.push(message);
            out.extend(results.iter().map(|(call, result)| {
                json!({"role": "tool", "tool_call_id": call.id, "content": result})
            }));
        }
        Format::Responses => {
            for item in answer.value["output"].as_array().into_iter().flatten() {
                let client_call = item["type"] == "function_call" && item["name"] != name;
                if !client_call {
                    out.push(item.clone());
                }
            }
            out.extend(results.iter().map(|(call, result)| {
                json!({"type": "function_call_output", "call_id": call.id, "output": result})
            }));
        }
        Format::Messages => {
            let content: Vec<Value> = answer.value["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|b| b["type"] != "tool_use" || b["name"] == name)
                .cloned()
                .collect();
            out.push(json!({"role": "assistant", "content": content}));
            let results: Vec<Value> = results
                .iter()
                .map(|(call, result)| {
                    json!({"type": "tool_result", "tool_use_id": call.id, "content": result})
                })
                .collect();
            out.push(json!({"role": "user", "content": results}));
        }
    }
    out
}

/// The follow-up request: `forwarded` (the body sent last) with `items` appended to its
/// conversation, and — for the last round — the model told to answer without tools.
/// Every other byte is kept as it was sent (the tools above all: the provider's prompt
/// cache covers them). `None` when the body is not one abridge can extend.
pub fn follow_up(format: Format, forwarded: &[u8], items: &[Value], last: bool) -> Option<Vec<u8>> {
    #[derive(serde::Deserialize)]
    struct Top<'a> {
        #[serde(borrow, default)]
        messages: Option<Raw<'a>>,
        #[serde(borrow, default)]
        input: Option<Raw<'a>>,
        #[serde(borrow, default)]
        tool_choice: Option<Raw<'a>>,
    }
    let text = std::str::from_utf8(forwarded).ok()?;
    let top: Top<'_> = serde_json::from_str(text).ok()?;
    let conversation = match format {
        Format::Chat | Format::Messages => top.messages?,
        Format::Responses => top.input?,
    };
    let array = conversation.get();
    let inner = array.strip_prefix('[')?.strip_suffix(']')?;
    let mut extended = String::with_capacity(array.len() + 256);
    extended.push('[');
    extended.push_str(inner);
    for item in items {
        if !extended.ends_with('[') {
            extended.push(',');
        }
        extended.push_str(&item.to_string());
    }
    extended.push(']');
    let mut edits = vec![Edit {
        span: span_of(forwarded, array)?,
        bytes: extended.into_bytes(),
    }];
    if last {
        let none = match format {
            Format::Messages => r#"{"type":"none"}"#,
            Format::Chat | Format::Responses => r#""none""#,
        };
        edits.push(match top.tool_choice {
            Some(choice) => Edit {
                span: span_of(forwarded, choice.get())?,
                bytes: none.as_bytes().to_vec(),
            },
            None => {
                let close = forwarded.iter().rposition(|b| !b.is_ascii_whitespace())?;
                Edit {
                    span: close..close,
                    bytes: format!(r#","tool_choice":{none}"#).into_bytes(),
                }
            }
        });
    }
    apply(forwarded, edits).map(|b| b.to_vec())
}

/// The answer the client gets: the last round's, any call of `name` still in it removed
/// (an answer that then calls nothing says it stopped), with `usage` — every round's,
/// summed — in place of its own. A Responses answer echoes the request's tools and
/// `tool_choice`: the client sees its own (`choice`: the client's `tool_choice`, `auto`
/// when it sent none).
pub fn finish(
    format: Format,
    mut answer: Value,
    usage: Option<Value>,
    choice: &Value,
    name: &str,
) -> Vec<u8> {
    if format == Format::Responses {
        if let Some(tools) = answer.get_mut("tools").and_then(Value::as_array_mut) {
            tools.retain(|t| t["name"] != name);
        }
        if let Some(echoed) = answer.get_mut("tool_choice") {
            *echoed = choice.clone();
        }
    }
    strip(format, &mut answer, name);
    if let (Some(usage), Some(top)) = (usage, answer.as_object_mut()) {
        top.insert("usage".to_owned(), usage);
    }
    serde_json::to_vec(&answer).unwrap_or_default()
}

/// `answer` without its calls of `name` (chat: in every choice).
fn strip(format: Format, answer: &mut Value, name: &str) {
    match format {
        // `get_mut`, not indexing: indexing a missing member adds it as `null`.
        Format::Chat => {
            let choices = answer.get_mut("choices").and_then(Value::as_array_mut);
            for choice in choices.into_iter().flatten() {
                let emptied = choice
                    .pointer_mut("/message/tool_calls")
                    .and_then(Value::as_array_mut)
                    .map(|calls| {
                        calls.retain(|c| c["function"]["name"] != name);
                        calls.is_empty()
                    });
                if emptied == Some(true) {
                    if let Some(m) = choice.get_mut("message").and_then(Value::as_object_mut) {
                        m.remove("tool_calls");
                    }
                    if choice["finish_reason"] == "tool_calls" {
                        choice["finish_reason"] = json!("stop");
                    }
                }
            }
        }
        Format::Responses => {
            if let Some(output) = answer.get_mut("output").and_then(Value::as_array_mut) {
                output.retain(|o| !(o["type"] == "function_call" && o["name"] == name));
            }
        }
        Format::Messages => {
            let calls = answer
                .get_mut("content")
                .and_then(Value::as_array_mut)
                .map(|content| {
                    content.retain(|b| !(b["type"] == "tool_use" && b["name"] == name));
                    content.iter().any(|b| b["type"] == "tool_use")
                });
            if calls == Some(false) && answer["stop_reason"] == "tool_use" {
                answer["stop_reason"] = json!("end_turn");
            }
        }
    }
}

/// Adds the numbers of `more`'s usage to `into`'s, member by member (nested objects
/// too): what the client is told it used is every round's.
pub fn add_usage(into: &mut Value, more: &Value) {
    match (into, more) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in b {
                match a.get_mut(key) {
                    Some(existing) => add_usage(existing, value),
                    None => {
                        a.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (a @ Value::Number(_), Value::Number(b)) => {
            if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
                *a = Value::from(x.saturating_add(y));
            }
        }
        _ => {}
    }
}

/// Whether a 400 or 422 body says the provider refused the added tool, named `name` (a
/// server without tool support: llama-server without `--jinja`, a model whose template
/// has no tools).
pub fn refused(body: &[u8], name: &str) -> bool {
    let text = String::from_utf8_lossy(&body[..body.len().min(64 * 1024)]).to_ascii_lowercase();
    text.contains(name)
        || text.contains("tools")
        || text.contains("tool_choice")
        || text.contains("jinja")
        || text.contains("function calling")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_is_valid_json_in_each_format_and_the_same_bytes_every_time() {
        for (format, always) in [Format::Chat, Format::Responses, Format::Messages]
            .into_iter()
            .flat_map(|f| [(f, false), (f, true)])
        {
            for wanted in [NAME, "abridge_recall_2"] {
                let value: Value = serde_json::from_str(&tool(format, wanted, always)).unwrap();
                let name = match format {
                    Format::Chat => &value["function"]["name"],
                    _ => &value["name"],
                };
                assert_eq!(name, wanted);
                let text = tool(format, wanted, always);
                let names = tool_names(format, &format!("[{text}]"));
                assert_eq!(names, Some(vec![wanted.to_owned()]));
                // Offered from the first request, it does not say something was condensed.
                assert_eq!(text.contains("was condensed to fit"), !always, "{text}");
            }
            assert!(std::ptr::eq(
                tool(format, NAME, always).as_ptr(),
                tool(format, NAME, always).as_ptr()
            ));
        }
    }

    #[test]
    fn a_clients_tool_of_the_same_name_stays_its_own() {
        let tool_of =
            |tools: &str| super::super::Tool::for_request(Format::Chat, Some(tools), false);
        let shell = r#"{"type":"function","function":{"name":"shell"}}"#;
        let own = r#"{"type":"function","function":{"name":"abridge_recall"}}"#;
        let second = r#"{"type":"function","function":{"name":"abridge_recall_2"}}"#;
        assert_eq!(tool_of(&format!("[{shell}]")).unwrap().name, NAME);
        assert_eq!(
            tool_of(&format!("[{own}]")).unwrap().name,
            "abridge_recall_2"
        );
        assert_eq!(
            tool_of(&format!("[{second},{own}]")).unwrap().name,
            "abridge_recall_3"
        );
        let many = vec![shell; crate::recall::MAX_TOOLS].join(",");
        assert_eq!(tool_of(&format!("[{many}]")), None, "no room for one more");
        assert_eq!(tool_of("{}"), None, "tools abridge cannot read");
        assert_eq!(
            super::super::Tool::for_request(Format::Chat, None, false)
                .unwrap()
                .name,
            NAME
        );
        // Offered from the first request only beside tools of the client's own.
        let always =
            |tools: Option<&str>| super::super::Tool::for_request(Format::Chat, tools, true);
        assert!(always(Some(&format!("[{shell}]"))).unwrap().always);
        assert!(!always(Some("[]")).unwrap().always);
        assert!(!always(None).unwrap().always);
        // The client's own call of its `abridge_recall` is not abridge's.
        let answer = br#"{"choices": [{"message": {"tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "abridge_recall", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "abridge_recall_2", "arguments": "{}"}}]},
            "finish_reason": "tool_calls"}]}"#;
        let read = Answer::read(Format::Chat, answer, "abridge_recall_2").unwrap();
        assert_eq!(read.calls.len(), 1);
        assert_eq!(read.calls[0].id, "c2");
        let finished: Value = serde_json::from_slice(&finish(
            Format::Chat,
            read.value,
            None,
            &json!("auto"),
            "abridge_recall_2",
        ))
        .unwrap();
        let calls = &finished["choices"][0]["message"]["tool_calls"];
        assert_eq!(calls.as_array().unwrap().len(), 1);
        assert_eq!(calls[0]["function"]["name"], "abridge_recall");
    }

    #[test]
    fn no_choice_keeps_a_call_of_the_tool() {
        let call = r#"{"id": "c", "type": "function", "function": {"name": "abridge_recall", "arguments": "{}"}}"#;
        let answer = format!(
            r#"{{"choices": [{{"index": 0, "message": {{"content": "hi"}}, "finish_reason": "stop"}},
            {{"index": 1, "message": {{"content": null, "tool_calls": [{call}]}}, "finish_reason": "tool_calls"}}]}}"#
        );
        let read = Answer::read(Format::Chat, answer.as_bytes(), NAME).unwrap();
        let finished = finish(Format::Chat, read.value, None, &json!("auto"), NAME);
        let finished: Value = serde_json::from_slice(&finished).unwrap();
        assert!(!finished.to_string().contains(NAME), "{finished}");
        assert_eq!(finished["choices"][1]["finish_reason"], "stop");
    }

    #[test]
    fn usage_of_every_round_is_summed() {
        let mut usage = json!({"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}});
        add_usage(
            &mut usage,
            &json!({"prompt_tokens": 150, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 96}, "total_tokens": 157}),
        );
        assert_eq!(
            usage,
            json!({"prompt_tokens": 250, "completion_tokens": 12, "prompt_tokens_details": {"cached_tokens": 160}, "total_tokens": 157})
        );
    }

    #[test]
    fn a_round_keeps_only_the_recall_calls_and_answers_each() {
        let answer = Answer::read(
            Format::Messages,
            br#"{"content": [{"type": "text", "text": "Let me check."}, {"type": "tool_use", "id": "toolu_1", "name": "abridge_recall", "input": {"query": "port"}}, {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"cmd": "ls"}}]}"#,
            NAME,
        )
        .unwrap();
        assert_eq!(answer.calls.len(), 1);
        let results = vec![(answer.calls[0].clone(), "port 6543".to_owned())];
        let items = round_items(Format::Messages, &answer, &results, NAME);
        assert_eq!(
            items[0]["content"].as_array().unwrap().len(),
            2,
            "{items:?}"
        );
        assert_eq!(items[1]["content"][0]["tool_use_id"], "toolu_1");
        let body =
            br#"{"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}"#;
        let next: Value =
            serde_json::from_slice(&follow_up(Format::Messages, body, &items, true).unwrap())
                .unwrap();
        assert_eq!(next["messages"].as_array().unwrap().len(), 3);
        assert_eq!(next["tool_choice"], json!({"type": "none"}));
    }
}
