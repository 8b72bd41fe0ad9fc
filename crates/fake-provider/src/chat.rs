//! Chat completions (JSON and SSE), summaries and embeddings of the fake provider.

use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};

use crate::prompt_cache::{AutoCache, Cuts, prompt_start};
use crate::transport::{Answer, frame};
use crate::{Behavior, SummaryMode, error};

/// The `created` time of every answer (a fixed instant, so answers compare equal).
pub(crate) const CREATED: u64 = 1_700_000_000;
const ROLES: [&str; 6] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// Prompt tokens as the fake counts them: 3 per request, and per message 4 + ⌈bytes/4⌉
/// of its text content, name, tool-call names and arguments.
pub fn count_tokens(messages: &[Value]) -> u64 {
    let tokens = |s: &str| (s.len() as u64).div_ceil(4);
    3 + messages
        .iter()
        .map(|m| {
            let mut n = 4 + tokens(&text_of(m)) + m["name"].as_str().map_or(0, tokens);
            if let Some(calls) = m["tool_calls"].as_array() {
                for call in calls {
                    n += call["function"]["name"].as_str().map_or(0, tokens);
                    n += call["function"]["arguments"].as_str().map_or(0, tokens);
                }
            }
            n
        })
        .sum::<u64>()
}

/// The text of a message: a string content, or its text parts joined by newlines.
pub(crate) fn text_of(message: &Value) -> String {
    text_of_content(&message["content"])
}

/// The text of a content: a string, or its parts' `text` joined by newlines.
pub fn text_of_content(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A summarisation prompt: the last message asks to summarise a transcript.
pub fn is_summary_request(messages: &[Value]) -> bool {
    messages.last().is_some_and(|m| {
        let text = text_of(m).to_lowercase();
        text.contains("summar")
            && (text.contains("transcript") || text.contains("previous summary"))
    })
}

enum Reply {
    Text { text: String, finish: &'static str },
    ToolCalls(Vec<Call>),
}

/// One tool call of a reply.
struct Call {
    id: String,
    name: String,
    arguments: String,
}

impl Reply {
    /// A text reply's text (empty for calls).
    fn text(&self) -> &str {
        match self {
            Reply::Text { text, .. } => text,
            Reply::ToolCalls(_) => "",
        }
    }

    fn completion_tokens(&self) -> u64 {
        match self {
            Reply::Text { text, .. } => text.split_whitespace().count() as u64,
            Reply::ToolCalls(calls) => calls
                .iter()
                .map(|c| ((c.name.len() + c.arguments.len()) as u64).div_ceil(4))
                .sum(),
        }
    }
}

/// Whether `model` is one of the reasoning models that refuse `max_tokens` and any
/// `temperature` but the default, as OpenAI's gpt-5 and o-series do (also any model
/// whose name says `reasoning`, so tests can use a name abridge cannot guess).
pub fn is_reasoning_model(model: &str) -> bool {
    let m = model.rsplit('/').next().unwrap_or(model);
    let o_series = m.len() > 1 && m.starts_with('o') && m.as_bytes()[1].is_ascii_digit();
    m.starts_with("gpt-5") || o_series || m.contains("reasoning")
}

/// OpenAI's refusals of what reasoning models do not accept.
fn reasoning_refusal(request: &Value) -> Option<Answer> {
    if !is_reasoning_model(request["model"].as_str().unwrap_or("")) {
        return None;
    }
    if !request["max_tokens"].is_null() {
        return Some(error_answer(
            StatusCode::BAD_REQUEST,
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
            "invalid_request_error",
            Some("max_tokens"),
            Some("unsupported_parameter"),
        ));
    }
    match request["temperature"].as_f64() {
        Some(t) if t != 1.0 => Some(error_answer(
            StatusCode::BAD_REQUEST,
            &format!(
                "Unsupported value: 'temperature' does not support {t} with this model. Only the default (1) value is supported."
            ),
            "invalid_request_error",
            Some("temperature"),
            Some("unsupported_value"),
        )),
        _ => None,
    }
}

/// The answer to a chat-completions body under behaviour `b`.
pub(crate) fn answer(b: &Behavior, cache: &AutoCache, body: &Bytes) -> Answer {
    let request: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return error_answer(
                StatusCode::BAD_REQUEST,
                "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly.)",
                "invalid_request_error",
                None,
                None,
            );
        }
    };
    let Some(messages) = request["messages"].as_array() else {
        return error_answer(
            StatusCode::BAD_REQUEST,
            "Invalid type for 'messages': expected an array of objects.",
            "invalid_request_error",
            Some("messages"),
            Some("invalid_type"),
        );
    };
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or("");
        if !ROLES.contains(&role) {
            return error_answer(
                StatusCode::BAD_REQUEST,
                &format!(
                    "Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'."
                ),
                "invalid_request_error",
                Some(&format!("messages[{i}].role")),
                Some("invalid_value"),
            );
        }
    }
    if let Some(refusal) = reasoning_refusal(&request) {
        return refusal;
    }
    if let Some((status, message)) = b.shapes.refuse_tools(&request) {
        return error_answer(
            status,
            &message,
            "invalid_request_error",
            Some("tools"),
            None,
        );
    }
    let prompt_tokens = (count_tokens(messages) as f64 * b.token_scale).ceil() as u64;
    if let Some(window) = b.context_window
        && prompt_tokens > window
    {
        if b.overflow_in_stream && request["stream"] == Value::Bool(true) {
            return Answer::Events(b.overflow.chat_stream(window, prompt_tokens));
        }
        let (status, body) = b.overflow.answer(window, prompt_tokens);
        return Answer::Whole(status, body);
    }

    let summary = is_summary_request(messages);
    if summary && b.summary == SummaryMode::Error {
        return error_answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            "The summariser failed (as told).",
            "server_error",
            None,
            None,
        );
    }
    let max_tokens = request["max_completion_tokens"]
        .as_u64()
        .or(request["max_tokens"].as_u64());
    let reply = if summary {
        // Like a model, it stops at max_tokens (about four characters a token).
        let mut text = crate::summary::summarise(messages, b.summary);
        let limit = max_tokens.map_or(usize::MAX, |t| usize::try_from(t * 4).unwrap_or(usize::MAX));
        let finish = match text.char_indices().nth(limit) {
            Some((at, _)) => {
                text.truncate(at);
                "length"
            }
            None => "stop",
        };
        Reply::Text { text, finish }
    } else if let Some(recalled) = recall_move(&request, messages).filter(|_| b.uses_recall) {
        match recalled {
            crate::recall::Move::Call(query) => {
                let hash = fnv(request["messages"].to_string().as_bytes()) as u32;
                let name = recall_name(&request);
                let calls = (0..b.shapes.recall_calls.unwrap_or(1))
                    .map(|i| Call {
                        id: match i {
                            0 => format!("call_r{hash:08x}"),
                            i => format!("call_r{hash:08x}_{i}"),
                        },
                        name: name.clone(),
                        arguments: b.shapes.pad(json!({ "query": query }).to_string()),
                    })
                    .collect();
                Reply::ToolCalls(calls)
            }
            crate::recall::Move::Answer(text) => Reply::Text {
                text,
                finish: "stop",
            },
        }
    } else if wants_tool_call(&request, messages) {
        let name = client_tools(&request)
            .next()
            .and_then(|t| t["function"]["name"].as_str())
            .unwrap_or("tool")
            .to_owned();
        Reply::ToolCalls(vec![Call {
            id: format!(
                "call_{:08x}",
                fnv(request["messages"].to_string().as_bytes()) as u32
            ),
            name,
            arguments: b.shapes.pad(r#"{"path":"/tmp/fake.txt"}"#.to_owned()),
        }])
    } else {
        text_reply(messages, b.reply_words, max_tokens)
    };

    let model = request["model"].as_str().unwrap_or("fake-model").to_owned();
    let id = format!(
        "chatcmpl-fake-{:016x}",
        fnv(request["messages"].to_string().as_bytes())
    );
    let cached = match b.reported_prompt_tokens {
        Some(_) => 0,
        None => {
            let own = |m: &Value| count_tokens(std::slice::from_ref(m)) - 3;
            let start = prompt_start(&request);
            let cuts = Cuts::of((3, &start), messages.iter().map(|m| (own(m), m)));
            cache.cached(&cuts, b.token_scale)
        }
    };
    let usage = usage(
        (b.reported_prompt_tokens.unwrap_or(prompt_tokens), cached),
        reply.completion_tokens(),
        b.input_tokens_naming,
    );
    if request["stream"] == Value::Bool(true) {
        let include_usage = request["stream_options"]["include_usage"] == Value::Bool(true);
        let chunks = Chunks {
            id,
            model,
            reply,
            usage,
            include_usage,
            shapes: b.shapes.clone(),
        };
        let mut events: Vec<Bytes> = chunks
            .payloads()
            .iter()
            .map(|p| Bytes::from(frame(p, b.multiline_data)))
            .collect();
        events.push(Bytes::from_static(b"data: [DONE]\n\n"));
        Answer::Events(events)
    } else {
        let message = match &reply {
            Reply::Text { text, .. } => {
                json!({"role": "assistant", "content": text, "refusal": null, "annotations": []})
            }
            Reply::ToolCalls(calls) => {
                let calls: Vec<Value> = calls
                    .iter()
                    .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                    .collect();
                json!({"role": "assistant", "content": null, "refusal": null, "tool_calls": calls})
            }
        };
        let finish = match &reply {
            Reply::Text { finish, .. } => *finish,
            Reply::ToolCalls(_) => "tool_calls",
        };
        // Samples differ: with `n`, a recall call is the last choice's; the others answer.
        let n = crate::shapes::choices(&request);
        let recalls = matches!(&reply, Reply::ToolCalls(c) if c.iter().any(|c| crate::recall::proxy_tool(&request["tools"]).as_deref() == Some(c.name.as_str())));
        let other = json!({"role": "assistant", "content": text_reply(messages, b.reply_words, max_tokens).text(), "refusal": null, "annotations": []});
        let choices: Vec<Value> = (0..n)
            .map(|i| match recalls && i + 1 < n {
                true => json!({"index": i, "message": other, "logprobs": null, "finish_reason": "stop"}),
                false => json!({"index": i, "message": message, "logprobs": null, "finish_reason": finish}),
            })
            .collect();
        let body = json!({
            "id": id, "object": "chat.completion", "created": CREATED, "model": model,
            "choices": choices,
            "usage": usage, "service_tier": "default", "system_fingerprint": "fp_fake",
        });
        Answer::Whole(
            StatusCode::OK,
            Bytes::from(serde_json::to_vec(&body).unwrap_or_default()),
        )
    }
}

/// An error in OpenAI's shape, as an [`Answer`].
fn error_answer(
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Answer {
    Answer::Whole(status, crate::error_body(message, kind, param, code))
}

/// The client's tools: those of the request but a proxy's recall tool.
fn client_tools(request: &Value) -> impl Iterator<Item = &Value> {
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| !crate::recall::is_proxy_tool(t))
}

/// The name of the proxy's recall tool in `request` ([`crate::recall::NAME`] when it
/// offers none).
fn recall_name(request: &Value) -> String {
    crate::recall::proxy_tool(&request["tools"]).unwrap_or_else(|| crate::recall::NAME.to_owned())
}

/// What the fake does with a proxy's recall tool (see [`crate::recall`]).
fn recall_move(request: &Value, messages: &[Value]) -> Option<crate::recall::Move> {
    let asked = messages.iter().rposition(|m| m["role"] == "user")?;
    let name = recall_name(request);
    let recall_calls: Vec<&str> = messages[asked..]
        .iter()
        .filter_map(|m| m["tool_calls"].as_array())
        .flatten()
        .filter(|c| c["function"]["name"] == name.as_str())
        .filter_map(|c| c["id"].as_str())
        .collect();
    let results: Vec<String> = messages[asked..]
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter(|m| {
            m["tool_call_id"]
                .as_str()
                .is_some_and(|id| recall_calls.contains(&id))
        })
        .map(text_of)
        .collect();
    let callable = crate::recall::offered(&request["tools"]) && request["tool_choice"] != "none";
    let texts: Vec<String> = messages.iter().map(text_of).collect();
    crate::recall::decide_at((asked, &texts), &results, None, callable)
}

fn wants_tool_call(request: &Value, messages: &[Value]) -> bool {
    let has_tools = client_tools(request).next().is_some();
    let last_is_user = messages.last().is_some_and(|m| m["role"] == "user");
    has_tools && last_is_user && request["tool_choice"] != "none"
}

fn text_reply(messages: &[Value], words: usize, max_tokens: Option<u64>) -> Reply {
    let asked = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(text_of)
        .unwrap_or_default();
    let (text, truncated) = reply_text(&asked, words, max_tokens);
    Reply::Text {
        text,
        finish: if truncated { "length" } else { "stop" },
    }
}

/// A normal reply to the user text `asked`: "Fake reply to:", its first six words, then
/// filler up to `words` words; cut to `max_tokens` words (one token a word), and then
/// whether it was cut.
pub(crate) fn reply_text(asked: &str, words: usize, max_tokens: Option<u64>) -> (String, bool) {
    let mut out: Vec<String> = ["Fake", "reply", "to:"].map(str::to_owned).to_vec();
    out.extend(asked.split_whitespace().take(6).map(str::to_owned));
    let filler = ["lorem", "ipsum", "dolor", "sit", "amet"];
    let mut i = 0;
    while out.len() < words {
        out.push(filler[i % filler.len()].to_owned());
        i += 1;
    }
    out.truncate(words.max(1));
    let mut truncated = false;
    if let Some(max) = max_tokens
        && (out.len() as u64) > max
    {
        out.truncate(max.max(1) as usize);
        truncated = true;
    }
    (out.join(" "), truncated)
}

fn usage((prompt, cached): (u64, u64), completion: u64, input_naming: bool) -> Value {
    if input_naming {
        json!({"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt.saturating_add(completion)})
    } else {
        json!({
            "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt.saturating_add(completion),
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
        })
    }
}

struct Chunks {
    id: String,
    model: String,
    reply: Reply,
    usage: Value,
    include_usage: bool,
    shapes: crate::shapes::Shapes,
}

impl Chunks {
    /// The `data:` payloads of the stream, in order, as OpenAI sends them.
    fn payloads(&self) -> Vec<String> {
        let chunk = |choices: Value, usage: Option<&Value>| {
            /// Members in OpenAI's order; `usage` only with `include_usage`, then last.
            #[derive(serde::Serialize)]
            struct Chunk<'a> {
                id: &'a str,
                object: &'a str,
                created: u64,
                model: &'a str,
                service_tier: &'a str,
                system_fingerprint: &'a str,
                choices: Value,
                #[serde(skip_serializing_if = "Option::is_none")]
                usage: Option<Option<&'a Value>>,
            }
            serde_json::to_string(&Chunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: CREATED,
                model: &self.model,
                service_tier: "default",
                system_fingerprint: "fp_fake",
                choices,
                usage: self.include_usage.then_some(usage),
            })
            .unwrap_or_default()
        };
        let choice = |delta: Value, finish: Value| json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]);
        let mut out = Vec::new();
        match &self.reply {
            Reply::Text { text, finish } => {
                out.push(chunk(
                    choice(
                        json!({"role": "assistant", "content": "", "refusal": null}),
                        Value::Null,
                    ),
                    None,
                ));
                let words: Vec<&str> = text.split(' ').collect();
                for (i, w) in words.iter().enumerate() {
                    let piece = if i + 1 < words.len() {
                        format!("{w} ")
                    } else {
                        (*w).to_owned()
                    };
                    out.push(chunk(choice(json!({"content": piece}), Value::Null), None));
                }
                out.push(chunk(choice(json!({}), json!(finish)), None));
            }
            Reply::ToolCalls(calls) => {
                for (index, call) in calls.iter().enumerate() {
                    let start = json!([{"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}]);
                    let delta = match index {
                        0 => json!({"role": "assistant", "content": null, "tool_calls": start}),
                        _ => json!({"tool_calls": start}),
                    };
                    out.push(chunk(choice(delta, Value::Null), None));
                    for part in self.shapes.pieces(&call.arguments) {
                        out.push(chunk(
                            choice(
                                json!({"tool_calls": [{"index": index, "function": {"arguments": part}}]}),
                                Value::Null,
                            ),
                            None,
                        ));
                    }
                }
                out.push(chunk(choice(json!({}), json!("tool_calls")), None));
            }
        }
        if self.include_usage {
            out.push(chunk(json!([]), Some(&self.usage)));
        }
        out
    }
}

pub(crate) fn embeddings(body: &Bytes) -> Response {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let inputs: Vec<String> = match &request["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
            .collect(),
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "'input' is a required property",
                "invalid_request_error",
                Some("input"),
                None,
            );
        }
    };
    let tokens: u64 = inputs.iter().map(|s| (s.len() as u64).div_ceil(4)).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let h = fnv(s.as_bytes());
            let embedding: Vec<f64> = (0..8)
                .map(|k| ((h >> (k * 8)) & 0xff) as f64 / 255.0)
                .collect();
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let model = request["model"].as_str().unwrap_or("fake-embedding");
    crate::json(
        StatusCode::OK,
        &json!({"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
    )
}

/// FNV-1a: a stable id for identical requests, so two streams can be compared byte for byte.
pub(crate) fn fnv(bytes: &[u8]) -> u64 {
    fnv_extend(0xcbf2_9ce4_8422_2325, bytes)
}

/// FNV-1a of `bytes` continued from the hash `h` (of the bytes before them).
pub(crate) fn fnv_extend(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_tokens_as_documented() {
        let messages = vec![
            json!({"role": "system", "content": "12345678"}),
            json!({"role": "user", "content": [{"type": "text", "text": "abc"}]}),
        ];
        assert_eq!(count_tokens(&messages), 3 + (4 + 2) + (4 + 1));
    }

    #[test]
    fn stream_payloads_carry_usage_only_when_asked() {
        let mut chunks = Chunks {
            id: "x".into(),
            model: "m".into(),
            reply: Reply::Text {
                text: "a b".into(),
                finish: "stop",
            },
            usage: usage((5, 0), 2, false),
            include_usage: false,
            shapes: crate::shapes::Shapes::default(),
        };
        let plain = chunks.payloads();
        assert!(plain.iter().all(|p| !p.contains("usage")));
        chunks.include_usage = true;
        let with = chunks.payloads();
        assert_eq!(with.len(), plain.len() + 1);
        assert!(
            with[..plain.len()]
                .iter()
                .all(|p| p.ends_with(r#","usage":null}"#))
        );
        assert!(with.last().unwrap().contains(r#""choices":[]"#));
        // Removing the member gives back exactly the plain stream.
        let stripped: Vec<String> = with[..plain.len()]
            .iter()
            .map(|p| p.replace(r#","usage":null"#, ""))
            .collect();
        assert_eq!(stripped, plain);
    }

    #[test]
    fn summary_has_every_section_and_the_identifiers() {
        let prompt = "Summarise this transcript.\n[USER] fix src/main.rs line 42\n[ASSISTANT] done\n[USER] now deploy to https://example.com/v2";
        let s = crate::summary::summarise(
            &[json!({"role": "user", "content": prompt})],
            SummaryMode::Good,
        );
        for section in [
            "## Goal",
            "## Constraints & Preferences",
            "## Progress",
            "## Key Decisions",
            "## Relevant Files",
            "## Next Steps",
            "## Critical Context",
        ] {
            assert!(s.contains(section), "{section} missing in {s}");
        }
        assert!(
            s.contains("src/main.rs") && s.contains("42") && s.contains("https://example.com/v2")
        );
        assert!(s.contains("- now deploy to https://example.com/v2"));
    }
}
