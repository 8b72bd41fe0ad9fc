//! The OpenAI Responses API (`POST …/responses`) of the fake provider.
//!
//! Requests: `model`, `instructions`, `input` (a string — one user message — or a list of
//! items: `message` (an item with a `role` and no `type` is one), `function_call`,
//! `function_call_output`, `custom_tool_call(_output)`, `reasoning`; other
//! types are accepted as they are), `stream`, `tools`, `tool_choice`, `max_output_tokens`,
//! `previous_response_id`, `store`, `include`.
//!
//! Validation, as OpenAI answers it (HTTP 400, `invalid_request_error`, `param: "input"`,
//! `code: null` unless said):
//! - no `model` / no `input`: `Missing required parameter: 'model'.` (`'input'`), code
//!   `missing_required_parameter`; an `input` neither string nor list: `invalid_type`;
//! - a message whose role is not user/assistant/system/developer: `Invalid value: …`,
//!   param `input[i].role`, code `invalid_value`;
//! - a `function_call` with no later `function_call_output` of its `call_id`:
//!   `No tool output found for function call {call_id}.` (`custom tool call` for
//!   `custom_tool_call`);
//! - a `function_call_output` with no earlier `function_call` of its `call_id`:
//!   `No tool call found for function call output with call_id {call_id}.` (`custom tool
//!   call output` likewise); not checked when `previous_response_id` is given (the call
//!   may be in the earlier response);
//! - a `reasoning` item (or a run of them: the model writes several in one answer, and
//!   OpenAI takes them back so) not followed by an item of the assistant it belongs to
//!   (an assistant message, or an item whose type ends in `_call`):
//!   `Item '{id}' of type 'reasoning' was provided without its required following item.`;
//! - a `compaction` or `compaction_trigger` item (OpenAI's compaction APIs, which this
//!   fake, like llama-server or vLLM, does not have): `Invalid value: '{type}'. …`,
//!   param `input[i].type`, code `invalid_value`; `POST …/responses/compact` is a 404;
//! - more prompt tokens than the context window (`x-fake-window`): `Your input exceeds the
//!   context window of this model. Please adjust your input and try again.`, code
//!   `context_length_exceeded`.
//!
//! Token counting ([`count_tokens`]): 3 per request, 4 + ⌈bytes/4⌉ for `instructions`, and
//! per input item 4 + ⌈bytes/4⌉ of each of its texts: a message's text (string content,
//! or its parts' `text` joined by newlines), a function call's `name` and `arguments`, a
//! custom tool call's `name` and `input`, an output's `output` (string, or its parts'
//! `text` joined by newlines), a reasoning or compaction item's `encrypted_content`;
//! other items count 4. Times `token_scale`, rounded up.
//!
//! Answers: a `function_call` item (`call_…`, arguments `{"path":"/tmp/fake.txt"}`) when
//! the request has a function tool, the last input item is a user message and
//! `tool_choice` is not `none` (chat's rule); otherwise a message with chat's reply text,
//! cut to `max_output_tokens` words with status `incomplete`. With `x-fake-thinking: 1`
//! a `reasoning` item (summary text, `encrypted_content` when `include` asks for it)
//! comes first; its words are `reasoning_tokens`. Streamed (`stream: true`) as typed SSE
//! events with `sequence_number`s, ending with `response.completed` (or
//! `response.incomplete`), no `[DONE]`.

use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};

use crate::Behavior;
use crate::chat::{CREATED, fnv, reply_text, text_of, text_of_content};
use crate::prompt_cache::{AutoCache, Cuts, prompt_start};
use crate::transport::{Answer, event_json, typed};

const ROLES: [&str; 4] = ["user", "assistant", "system", "developer"];

/// Prompt tokens of a Responses request body as the fake counts them (see the module
/// doc), before `token_scale`.
pub fn count_tokens(request: &Value) -> u64 {
    let tokens = |s: &str| (s.len() as u64).div_ceil(4);
    let instructions = request["instructions"]
        .as_str()
        .map_or(0, |s| 4 + tokens(s));
    let input = match &request["input"] {
        Value::String(s) => 4 + tokens(s),
        Value::Array(items) => items.iter().map(item_tokens).sum(),
        _ => 0,
    };
    3 + instructions + input
}

/// The request's input as items: a string `input` is one user message.
fn input_items(request: &Value) -> std::borrow::Cow<'_, [Value]> {
    match &request["input"] {
        Value::String(s) => vec![json!({"role": "user", "content": s})].into(),
        Value::Array(items) => items.as_slice().into(),
        _ => (&[][..]).into(),
    }
}

/// The request's prompt cut after its instructions and each input item (see
/// [`crate::prompt_cache`]).
fn cuts(request: &Value) -> Cuts {
    let tokens = |s: &str| (s.len() as u64).div_ceil(4);
    let instructions = request["instructions"]
        .as_str()
        .map(|s| (4 + tokens(s), &request["instructions"]));
    let items = input_items(request);
    let start = prompt_start(request);
    Cuts::of(
        (3, &start),
        instructions
            .into_iter()
            .chain(items.iter().map(|i| (item_tokens(i), i))),
    )
}

fn item_tokens(item: &Value) -> u64 {
    let tokens = |s: &str| (s.len() as u64).div_ceil(4);
    let field = |k: &str| item[k].as_str().map_or(0, tokens);
    4 + match kind(item) {
        "message" => tokens(&text_of(item)),
        "function_call" => field("name") + field("arguments"),
        "custom_tool_call" => field("name") + field("input"),
        "function_call_output" | "custom_tool_call_output" => {
            tokens(&text_of_content(&item["output"]))
        }
        "reasoning" | "compaction" => field("encrypted_content"),
        _ => 0,
    }
}

/// An item's type: its `type`, else `message` when it has a `role`.
fn kind(item: &Value) -> &str {
    match item["type"].as_str() {
        Some(t) => t,
        None if item.get("role").is_some() => "message",
        None => "item_reference",
    }
}

/// A 400 in OpenAI's shape, as an [`Answer`].
fn invalid(message: &str, param: Option<&str>, code: Option<&str>) -> Answer {
    Answer::Whole(
        StatusCode::BAD_REQUEST,
        crate::error_body(message, "invalid_request_error", param, code),
    )
}

/// The answer to a Responses body under behaviour `b`.
pub(crate) fn answer(b: &Behavior, cache: &AutoCache, body: &Bytes) -> Answer {
    let request: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return invalid(
                "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly.)",
                None,
                None,
            );
        }
    };
    if let Err(answer) = validate(&request) {
        return answer;
    }
    if b.summary == crate::SummaryMode::Error
        && crate::chat::is_summary_request(&input_items(&request))
    {
        return Answer::Whole(
            StatusCode::INTERNAL_SERVER_ERROR,
            crate::error_body(
                "The summariser failed (as told).",
                "server_error",
                None,
                None,
            ),
        );
    }
    let prompt_tokens = (count_tokens(&request) as f64 * b.token_scale).ceil() as u64;
    if let Some(window) = b.context_window
        && prompt_tokens > window
    {
        if b.overflow_in_stream && request["stream"] == Value::Bool(true) {
            let model = request["model"].as_str().unwrap_or_default();
            let id = format!("resp_{:016x}", fnv(body));
            return Answer::Events(crate::overflow::responses_stream(&id, model));
        }
        return invalid(
            "Your input exceeds the context window of this model. Please adjust your input and try again.",
            Some("input"),
            Some("context_length_exceeded"),
        );
    }
    let cached = match b.reported_prompt_tokens {
        Some(_) => 0,
        None => cache.cached(&cuts(&request), b.token_scale),
    };
    let reply = Reply::to(
        b,
        &request,
        (b.reported_prompt_tokens.unwrap_or(prompt_tokens), cached),
    );
    if request["stream"] == Value::Bool(true) {
        Answer::Events(reply.events(b.multiline_data))
    } else {
        let body = reply.response(reply.status(), reply.output(), reply.usage());
        Answer::Whole(
            StatusCode::OK,
            Bytes::from(serde_json::to_vec(&body).unwrap_or_default()),
        )
    }
}

/// The checks of the module doc, in input order; the first failure is the answer.
fn validate(request: &Value) -> Result<(), Answer> {
    let missing = |name: &str| {
        invalid(
            &format!("Missing required parameter: '{name}'."),
            Some(name),
            Some("missing_required_parameter"),
        )
    };
    if request["model"].as_str().is_none_or(str::is_empty) {
        return Err(missing("model"));
    }
    let items = match &request["input"] {
        Value::Null => return Err(missing("input")),
        Value::String(_) => return Ok(()),
        Value::Array(items) => items,
        _ => {
            return Err(invalid(
                "Invalid type for 'input': expected one of a string or an array of input items.",
                Some("input"),
                Some("invalid_type"),
            ));
        }
    };
    let chained = request["previous_response_id"].is_string();
    for (i, item) in items.iter().enumerate() {
        if !item.is_object() {
            return Err(invalid(
                &format!("Invalid type for 'input[{i}]': expected an input item object."),
                Some(&format!("input[{i}]")),
                Some("invalid_type"),
            ));
        }
        // A server without OpenAI's compaction APIs (llama-server, vLLM, …) knows neither.
        if let k @ ("compaction" | "compaction_trigger") = kind(item) {
            return Err(invalid(
                &format!(
                    "Invalid value: '{k}'. Supported values are: 'message', 'function_call', 'function_call_output', 'custom_tool_call', 'custom_tool_call_output' and 'reasoning'."
                ),
                Some(&format!("input[{i}].type")),
                Some("invalid_value"),
            ));
        }
        let call_id = item["call_id"].as_str().unwrap_or("");
        let pair = |kind_wanted: &str, o: &Value| kind(o) == kind_wanted && o["call_id"] == call_id;
        let problem = match kind(item) {
            "message" => {
                let role = item["role"].as_str().unwrap_or("");
                if !ROLES.contains(&role) {
                    return Err(invalid(
                        &format!(
                            "Invalid value: '{role}'. Supported values are: 'assistant', 'system', 'developer', and 'user'."
                        ),
                        Some(&format!("input[{i}].role")),
                        Some("invalid_value"),
                    ));
                }
                None
            }
            k @ ("function_call" | "custom_tool_call") => {
                let output = format!("{k}_output");
                let answered = items[i + 1..].iter().any(|o| pair(&output, o));
                (!answered).then(|| {
                    format!("No tool output found for {} {call_id}.", k.replace('_', " "))
                })
            }
            k @ ("function_call_output" | "custom_tool_call_output") => {
                let call = k.trim_end_matches("_output");
                let asked = chained || items[..i].iter().any(|c| pair(call, c));
                (!asked).then(|| {
                    format!(
                        "No tool call found for {} with call_id {call_id}.",
                        k.replace('_', " ")
                    )
                })
            }
            // A run of reasoning items (the model writes several in one answer) is
            // judged at its last one.
            "reasoning" => (!items.get(i + 1).is_some_and(|next| {
                kind(next) == "reasoning" || follows_reasoning(next)
            }))
            .then(|| {
                format!(
                    "Item '{}' of type 'reasoning' was provided without its required following item.",
                    item["id"].as_str().unwrap_or("")
                )
            }),
            _ => None,
        };
        if let Some(message) = problem {
            return Err(invalid(&message, Some("input"), None));
        }
    }
    Ok(())
}

/// An item a reasoning item can belong to: what the assistant produced after thinking.
fn follows_reasoning(item: &Value) -> bool {
    match kind(item) {
        "message" => item["role"] == "assistant",
        k => k.ends_with("_call"),
    }
}

/// What the fake answers: an optional reasoning summary, then a message or a call.
struct Reply<'a> {
    request: &'a Value,
    id: String,
    reasoning: Option<Reasoning>,
    content: Content,
    /// Input tokens, and of which the prompt cache served.
    input_tokens: u64,
    cached_tokens: u64,
}

struct Reasoning {
    id: String,
    summary: String,
    encrypted: Option<String>,
}

enum Content {
    Text {
        id: String,
        text: String,
        truncated: bool,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

impl<'a> Reply<'a> {
    fn to(b: &Behavior, request: &'a Value, (input_tokens, cached_tokens): (u64, u64)) -> Self {
        let items = input_items(request);
        let hash = fnv(request["input"].to_string().as_bytes());
        let asked = items
            .iter()
            .rev()
            .find(|i| kind(i) == "message" && i["role"] == "user")
            .map(text_of)
            .unwrap_or_default();
        let last_is_user = items
            .last()
            .is_some_and(|i| kind(i) == "message" && i["role"] == "user");
        let tool = request["tools"]
            .as_array()
            .and_then(|tools| {
                tools.iter().find(|t| {
                    t["type"] == "function"
                        && t["name"].is_string()
                        && !crate::recall::is_proxy_tool(t)
                })
            })
            .and_then(|t| t["name"].as_str());
        // A summary, as chat's (see `crate::summary`), answered in text.
        let summary = crate::chat::is_summary_request(&items);
        let recalled = recall_move(request, &items).filter(|_| b.uses_recall && !summary);
        let tool = tool.filter(|_| !summary);
        let content = match (recalled, tool) {
            (Some(crate::recall::Move::Call(query)), _) => Content::Call {
                id: format!("fc_r{hash:016x}"),
                call_id: format!("call_r{:08x}", hash as u32),
                name: crate::recall::NAME.to_owned(),
                arguments: json!({ "query": query }).to_string(),
            },
            (Some(crate::recall::Move::Answer(text)), _) => Content::Text {
                id: format!("msg_{hash:016x}"),
                text,
                truncated: false,
            },
            (None, Some(name)) if last_is_user && request["tool_choice"] != "none" => {
                Content::Call {
                    id: format!("fc_{hash:016x}"),
                    call_id: format!("call_{:08x}", hash as u32),
                    name: name.to_owned(),
                    arguments: r#"{"path":"/tmp/fake.txt"}"#.to_owned(),
                }
            }
            _ if summary => {
                let limit = request["max_output_tokens"]
                    .as_u64()
                    .map_or(usize::MAX, |t| usize::try_from(t * 4).unwrap_or(usize::MAX));
                let mut text = crate::summary::summarise(&items, b.summary);
                let truncated = match text.char_indices().nth(limit) {
                    Some((at, _)) => {
                        text.truncate(at);
                        true
                    }
                    None => false,
                };
                Content::Text {
                    id: format!("msg_{hash:016x}"),
                    text,
                    truncated,
                }
            }
            _ => {
                let max = request["max_output_tokens"].as_u64();
                let (text, truncated) = reply_text(&asked, b.reply_words, max);
                Content::Text {
                    id: format!("msg_{hash:016x}"),
                    text,
                    truncated,
                }
            }
        };
        let wants_encrypted = request["include"]
            .as_array()
            .is_some_and(|i| i.iter().any(|v| v == "reasoning.encrypted_content"));
        let reasoning = b.thinking.then(|| {
            let summary = format!(
                "Thinking about: {}",
                asked
                    .split_whitespace()
                    .take(6)
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            Reasoning {
                id: format!("rs_{hash:016x}"),
                encrypted: wants_encrypted
                    .then(|| format!("gAAAAfake{:016x}", fnv(summary.as_bytes()))),
                summary,
            }
        });
        Self {
            request,
            id: format!("resp_{hash:016x}"),
            reasoning,
            content,
            input_tokens,
            cached_tokens,
        }
    }

    fn status(&self) -> &'static str {
        match self.content {
            Content::Text {
                truncated: true, ..
            } => "incomplete",
            _ => "completed",
        }
    }

    fn usage(&self) -> Value {
        let reasoning = self
            .reasoning
            .as_ref()
            .map_or(0, |r| r.summary.split_whitespace().count() as u64);
        let output = reasoning
            + match &self.content {
                Content::Text { text, .. } => text.split_whitespace().count() as u64,
                Content::Call {
                    name, arguments, ..
                } => ((name.len() + arguments.len()) as u64).div_ceil(4),
            };
        json!({
            "input_tokens": self.input_tokens, "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": self.input_tokens.saturating_add(output),
        })
    }

    /// The output items, complete.
    fn output(&self) -> Vec<Value> {
        let mut out: Vec<Value> = self.reasoning.iter().map(Reasoning::item).collect();
        out.push(self.content.item(self.status()));
        out
    }

    /// The Response object, with the request's settings echoed as OpenAI does.
    fn response(&self, status: &str, output: Vec<Value>, usage: Value) -> Value {
        let r = self.request;
        let echo = |key: &str, default: Value| match &r[key] {
            Value::Null => default,
            v => v.clone(),
        };
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id, "object": "response", "created_at": CREATED, "status": status,
            "background": false, "error": null, "incomplete_details": incomplete,
            "instructions": echo("instructions", Value::Null),
            "max_output_tokens": echo("max_output_tokens", Value::Null),
            "model": r["model"], "output": output,
            "parallel_tool_calls": echo("parallel_tool_calls", json!(true)),
            "previous_response_id": echo("previous_response_id", Value::Null),
            "reasoning": {"effort": r["reasoning"]["effort"], "summary": r["reasoning"]["summary"]},
            "store": echo("store", json!(true)),
            "temperature": echo("temperature", json!(1.0)),
            "text": echo("text", json!({"format": {"type": "text"}})),
            "tool_choice": echo("tool_choice", json!("auto")),
            "tools": echo("tools", json!([])),
            "top_p": echo("top_p", json!(1.0)),
            "truncation": echo("truncation", json!("disabled")),
            "usage": usage, "user": null, "metadata": echo("metadata", json!({})),
        })
    }

    /// The stream: created, in progress, each item's events, then the terminal event.
    fn events(&self, multiline: bool) -> Vec<Bytes> {
        let mut ev = Events {
            sequence: 0,
            out: Vec::new(),
            multiline,
        };
        let started = self.response("in_progress", Vec::new(), Value::Null);
        ev.push("response.created", json!({"response": started}));
        ev.push("response.in_progress", json!({"response": started}));
        let mut index = 0;
        if let Some(r) = &self.reasoning {
            r.events(&mut ev, index);
            index += 1;
        }
        self.content.events(&mut ev, index, self.status());
        let status = self.status();
        let done = self.response(status, self.output(), self.usage());
        let terminal = if status == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        ev.push(terminal, json!({"response": done}));
        ev.out
    }
}

/// What the fake does with a proxy's recall tool (see [`crate::recall`]).
fn recall_move(request: &Value, items: &[Value]) -> Option<crate::recall::Move> {
    let asked = items
        .iter()
        .rposition(|i| kind(i) == "message" && i["role"] == "user")?;
    let calls: Vec<&str> = items[asked..]
        .iter()
        .filter(|i| kind(i) == "function_call" && i["name"] == crate::recall::NAME)
        .filter_map(|i| i["call_id"].as_str())
        .collect();
    let results: Vec<String> = items[asked..]
        .iter()
        .filter(|i| kind(i) == "function_call_output")
        .filter(|i| i["call_id"].as_str().is_some_and(|id| calls.contains(&id)))
        .map(|i| i["output"].as_str().unwrap_or_default().to_owned())
        .collect();
    let callable = crate::recall::offered(&request["tools"]) && request["tool_choice"] != "none";
    let texts: Vec<String> = items.iter().map(text_of).collect();
    crate::recall::decide_at(
        (asked, &texts),
        &results,
        request["instructions"].as_str(),
        callable,
    )
}

/// The members of `base`, then those of `extra` (both objects).
fn merged(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Value::Object(extra)) = (base.as_object_mut(), extra) {
        b.extend(extra);
    }
    base
}

/// The typed events of a stream as they are built, numbered.
struct Events {
    sequence: u64,
    out: Vec<Bytes>,
    multiline: bool,
}

impl Events {
    fn push(&mut self, kind: &str, rest: Value) {
        let payload = event_json(kind, Some(self.sequence), &rest);
        self.out.push(typed(kind, &payload, self.multiline));
        self.sequence += 1;
    }
}

impl Reasoning {
    fn item(&self) -> Value {
        json!({"id": self.id, "type": "reasoning", "encrypted_content": self.encrypted,
            "summary": [{"type": "summary_text", "text": self.summary}]})
    }

    fn events(&self, ev: &mut Events, index: usize) {
        let started = json!({"id": self.id, "type": "reasoning", "encrypted_content": self.encrypted, "summary": []});
        ev.push(
            "response.output_item.added",
            json!({"output_index": index, "item": started}),
        );
        let at = |extra| {
            merged(
                json!({"item_id": self.id, "output_index": index, "summary_index": 0}),
                extra,
            )
        };
        let part = |text: &str| json!({"type": "summary_text", "text": text});
        ev.push(
            "response.reasoning_summary_part.added",
            at(json!({"part": part("")})),
        );
        ev.push(
            "response.reasoning_summary_text.delta",
            at(json!({"delta": self.summary})),
        );
        ev.push(
            "response.reasoning_summary_text.done",
            at(json!({"text": self.summary})),
        );
        ev.push(
            "response.reasoning_summary_part.done",
            at(json!({"part": part(&self.summary)})),
        );
        ev.push(
            "response.output_item.done",
            json!({"output_index": index, "item": self.item()}),
        );
    }
}

impl Content {
    /// The item as it stands at the end (`status` of the response: completed or incomplete).
    fn item(&self, status: &str) -> Value {
        match self {
            Content::Text { id, text, .. } => json!({"id": id, "type": "message", "status": status,
                "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
                "role": "assistant"}),
            Content::Call {
                id,
                call_id,
                name,
                arguments,
            } => json!({"id": id, "type": "function_call", "status": status,
                "arguments": arguments, "call_id": call_id, "name": name}),
        }
    }

    fn events(&self, ev: &mut Events, index: usize, status: &str) {
        let mut started = self.item("in_progress");
        match self {
            Content::Text { id, text, .. } => {
                started["content"] = json!([]);
                ev.push(
                    "response.output_item.added",
                    json!({"output_index": index, "item": started}),
                );
                let part = |text: &str| json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text});
                let at = |extra| {
                    merged(
                        json!({"item_id": id, "output_index": index, "content_index": 0}),
                        extra,
                    )
                };
                ev.push("response.content_part.added", at(json!({"part": part("")})));
                let words: Vec<&str> = text.split(' ').collect();
                for (i, w) in words.iter().enumerate() {
                    let piece = if i + 1 < words.len() {
                        format!("{w} ")
                    } else {
                        (*w).to_owned()
                    };
                    ev.push(
                        "response.output_text.delta",
                        at(json!({"delta": piece, "logprobs": []})),
                    );
                }
                ev.push(
                    "response.output_text.done",
                    at(json!({"text": text, "logprobs": []})),
                );
                ev.push(
                    "response.content_part.done",
                    at(json!({"part": part(text)})),
                );
            }
            Content::Call { id, arguments, .. } => {
                started["arguments"] = json!("");
                ev.push(
                    "response.output_item.added",
                    json!({"output_index": index, "item": started}),
                );
                let (a, b) = arguments.split_at(arguments.len() / 2);
                for delta in [a, b] {
                    ev.push(
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": index, "delta": delta}),
                    );
                }
                ev.push(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "arguments": arguments}),
                );
            }
        }
        ev.push(
            "response.output_item.done",
            json!({"output_index": index, "item": self.item(status)}),
        );
    }
}

#[cfg(test)]
mod tests;
