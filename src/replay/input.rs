//! What `abridge replay` reads: an input file's format, found by itself, and the
//! requests its client sent (or would have sent) turn by turn. An input is request
//! bodies — chat completions, Responses or Messages, JSON (one request, replayed growing
//! one turn at a time) or JSONL (one body per turn, as sent) — or an agent's own session
//! file, which [`sessions`] turns into the requests the agent made: a Claude Code
//! transcript (`~/.claude/projects/*/*.jsonl`) or a Codex CLI rollout
//! (`~/.codex/sessions/**/rollout-*.jsonl`).
//!
//! A growing history is kept once and each turn's body is built when it is sent, so
//! what replay holds stays linear in the input.

use serde_json::{Map, Value};

use super::sessions;
use crate::formats::Format;

/// One conversation to replay.
#[derive(Debug, Clone)]
pub struct Input {
    pub format: Format,
    /// What the file was: `chat`, `responses`, `messages`, `claude-code`, `codex`.
    pub kind: &'static str,
    turns: Turns,
    /// What the provider billed for each request, where the session file recorded it
    /// (empty: nothing recorded).
    bills: Vec<Option<crate::prices::Tokens>>,
}

#[derive(Debug, Clone)]
enum Turns {
    /// Request bodies as sent, one per turn.
    Bodies(Vec<Value>),
    /// One request whose list grows: turn `k` sends `items[..cuts[k]]` as `key`. Each
    /// item's JSON text is made once (a turn's body is their concatenation) with its
    /// hash (what the simulated prompt cache knows it by).
    Growing {
        base: Map<String, Value>,
        /// `base` as a value.
        rest: Value,
        key: &'static str,
        items: Vec<Value>,
        texts: Vec<String>,
        keys: Vec<u64>,
        cuts: Vec<usize>,
        /// The client marks its newest message as a cache breakpoint, as Claude Code
        /// does (its transcripts do not keep the marks).
        marks_newest: bool,
    },
}

/// One turn's request as the client sent it: its bytes, its history items and their
/// keys (see [`super::cache`]).
pub struct Sent<'a> {
    pub bytes: bytes::Bytes,
    pub items: &'a [Value],
    pub keys: std::borrow::Cow<'a, [u64]>,
    /// The newest item as sent, when the client marked it (`items` holds it unmarked).
    pub newest: Option<Value>,
}

/// A message with a cache breakpoint on its last content block.
fn marked(message: &Value) -> Value {
    let mut m = message.clone();
    let blocks = match m["content"].take() {
        Value::String(text) => vec![serde_json::json!({"type": "text", "text": text})],
        Value::Array(blocks) => blocks,
        other => {
            m["content"] = other;
            return m;
        }
    };
    let mut blocks = blocks;
    if let Some(last) = blocks.last_mut().and_then(Value::as_object_mut) {
        last.insert(
            "cache_control".into(),
            serde_json::json!({"type": "ephemeral"}),
        );
    }
    m["content"] = Value::Array(blocks);
    m
}

impl Input {
    /// A request of `format` whose `key` list grows: a turn per cut.
    pub(super) fn growing(
        format: Format,
        kind: &'static str,
        base: Map<String, Value>,
        items: Vec<Value>,
        cuts: Vec<usize>,
    ) -> Self {
        let key = list_key(format);
        let texts: Vec<String> = items.iter().map(Value::to_string).collect();
        let keys = texts.iter().map(|t| super::cache::key(t)).collect();
        Self {
            format,
            kind,
            turns: Turns::Growing {
                rest: Value::Object(base.clone()),
                base,
                key,
                items,
                texts,
                keys,
                cuts,
                marks_newest: kind == "claude-code",
            },
            bills: Vec::new(),
        }
    }

    /// With what the provider billed for each request (one per request, in order).
    pub(super) fn with_bills(mut self, bills: Vec<Option<crate::prices::Tokens>>) -> Self {
        if bills.iter().any(Option::is_some) {
            self.bills = bills;
        }
        self
    }

    /// Adds `text` to what every request carries besides its history, where the format
    /// keeps it: Messages' `system` (a block of its own, marked for the cache as Claude
    /// Code marks its system prompt), Responses' `instructions`, a leading chat system
    /// message's content. (For replay's calibration: see `super::calibrate`.)
    pub(super) fn pad(&mut self, text: &str) {
        let format = self.format;
        let (base, rest) = match &mut self.turns {
            Turns::Growing { base, rest, .. } => (base, Some(rest)),
            Turns::Bodies(_) => return,
        };
        match format {
            Format::Messages => {
                let block = serde_json::json!({"type": "text", "text": text,
                    "cache_control": {"type": "ephemeral"}});
                let system = match base.remove("system") {
                    Some(Value::String(s)) => {
                        vec![serde_json::json!({"type": "text", "text": s}), block]
                    }
                    Some(Value::Array(mut blocks)) => {
                        blocks.push(block);
                        blocks
                    }
                    _ => vec![block],
                };
                base.insert("system".into(), Value::Array(system));
            }
            Format::Responses => {
                let before = base
                    .get("instructions")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let joined = if before.is_empty() {
                    text.to_owned()
                } else {
                    format!("{before}\n\n{text}")
                };
                base.insert("instructions".into(), Value::from(joined));
            }
            Format::Chat => return,
        }
        if let Some(rest) = rest {
            *rest = Value::Object(base.clone());
        }
    }

    /// What the provider billed for request `k`, when the session recorded it.
    pub fn bill(&self, k: usize) -> Option<crate::prices::Tokens> {
        self.bills.get(k).copied().flatten()
    }

    /// How many requests it replays.
    pub fn len(&self) -> usize {
        match &self.turns {
            Turns::Bodies(bodies) => bodies.len(),
            Turns::Growing { cuts, .. } => cuts.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Turn `k`'s request body.
    pub fn body(&self, k: usize) -> Value {
        match &self.turns {
            Turns::Bodies(bodies) => bodies[k].clone(),
            Turns::Growing {
                base,
                key,
                items,
                cuts,
                ..
            } => {
                let mut body = base.clone();
                body.insert((*key).to_owned(), Value::from(items[..cuts[k]].to_vec()));
                Value::Object(body)
            }
        }
    }

    /// What turn `k` sends besides its history (model, tools, system…): a body's own,
    /// or the growing request's, the same for every turn. (A body is given whole: its
    /// history is there too, and ignored.)
    pub fn rest(&self, k: usize) -> &Value {
        match &self.turns {
            Turns::Bodies(bodies) => &bodies[k],
            Turns::Growing { rest, .. } => rest,
        }
    }

    /// Turn `k` as the client sends it: built from the items' texts made once, so a
    /// growing history costs a copy of its bytes per turn, not a copy of its values.
    pub fn sent(&self, k: usize) -> Sent<'_> {
        match &self.turns {
            Turns::Bodies(bodies) => {
                let items = bodies[k][list_key(self.format)]
                    .as_array()
                    .map_or(&[][..], Vec::as_slice);
                Sent {
                    bytes: bytes::Bytes::from(bodies[k].to_string()),
                    keys: items
                        .iter()
                        .map(|i| super::cache::key(&i.to_string()))
                        .collect(),
                    items,
                    newest: None,
                }
            }
            Turns::Growing {
                base,
                rest,
                key,
                items,
                texts,
                keys,
                cuts,
                marks_newest,
            } => {
                let n = cuts[k];
                let marked = marks_newest.then(|| marked(&items[n - 1]).to_string());
                let texts: Vec<&str> = texts[..n]
                    .iter()
                    .enumerate()
                    .map(|(i, t)| match &marked {
                        Some(m) if i + 1 == n => m.as_str(),
                        _ => t.as_str(),
                    })
                    .collect();
                let mut body = rest.to_string();
                // `{…}` → `{…,"key":[items]}` (the base has members: `model` at least).
                body.pop();
                let size: usize = texts.iter().map(|t| t.len() + 1).sum();
                body.reserve(size + key.len() + 8);
                let comma = if base.is_empty() { "" } else { "," };
                body.push_str(&format!("{comma}\"{key}\":["));
                for (i, text) in texts.iter().enumerate() {
                    if i > 0 {
                        body.push(',');
                    }
                    body.push_str(text);
                }
                body.push_str("]}");
                match marked {
                    // The marked newest message: sent as such, known by its own key.
                    Some(m) => {
                        let mut keys = keys[..n].to_vec();
                        keys[n - 1] = super::cache::key(&m);
                        Sent {
                            bytes: bytes::Bytes::from(body),
                            items: &items[..n],
                            keys: std::borrow::Cow::Owned(keys),
                            newest: serde_json::from_str(&m).ok(),
                        }
                    }
                    None => Sent {
                        bytes: bytes::Bytes::from(body),
                        items: &items[..n],
                        keys: std::borrow::Cow::Borrowed(&keys[..n]),
                        newest: None,
                    },
                }
            }
        }
    }
}

/// The member holding a format's history.
pub fn list_key(format: Format) -> &'static str {
    match format {
        Format::Responses => "input",
        Format::Chat | Format::Messages => "messages",
    }
}

/// The conversations of one file's `text` (an agent's session file can hold several:
/// one per compaction it made itself). Errors name the line.
pub fn read(text: &str) -> Result<Vec<Input>, String> {
    if let Ok(whole @ Value::Object(_)) = serde_json::from_str::<Value>(text)
        && ["request", "messages", "input"]
            .iter()
            .any(|k| whole.get(k).is_some())
    {
        let request = match whole.get("request") {
            Some(request) => request.clone(),
            None => whole,
        };
        return Ok(vec![one_request(request)?]);
    }
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line).map_err(|e| at_line(n + 1, &e))?;
        lines.push((n + 1, value));
    }
    let Some((_, first)) = lines.first() else {
        return Err("empty: no request in it".into());
    };
    if lines.iter().any(|(_, l)| sessions::is_codex(l)) {
        let answers = sessions::codex(&lines)?;
        return Ok(inputs(answers, Format::Responses, "codex"));
    }
    if lines.iter().any(|(_, l)| sessions::is_claude_code(l)) {
        let answers = sessions::claude_code(&lines)?;
        return Ok(inputs(answers, Format::Messages, "claude-code"));
    }
    let format = format_of(first).ok_or_else(|| {
        "line 1: neither a request body (chat completions, Responses, Messages), a Claude \
         Code transcript line nor a Codex rollout line"
            .to_owned()
    })?;
    for (n, body) in &lines {
        if format_of(body).is_none() {
            return Err(format!(
                "line {n}: not a request body like line 1 (no messages or input)"
            ));
        }
    }
    Ok(vec![Input {
        format,
        kind: format.name(),
        turns: Turns::Bodies(lines.into_iter().map(|(_, v)| v).collect()),
        bills: Vec::new(),
    }])
}

/// A session file's conversations as inputs (those with a request to replay).
fn inputs(answers: Vec<sessions::Answers>, format: Format, kind: &'static str) -> Vec<Input> {
    answers
        .into_iter()
        .filter_map(|a| a.into_input(format, kind))
        .collect()
}

/// A JSON error at line `n` of the file, its column kept (serde's own "line 1" is the
/// line's, not the file's).
fn at_line(n: usize, e: &serde_json::Error) -> String {
    let message = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = message.strip_suffix(&suffix).unwrap_or(&message);
    format!("line {n}, column {}: not JSON: {message}", e.column())
}

/// A request body's format: Responses by `input`; Messages by what only Anthropic's
/// format has (a top-level `system`, content blocks of its own types); chat otherwise.
fn format_of(body: &Value) -> Option<Format> {
    if body.get("messages").is_none() {
        return body.get("input").map(|_| Format::Responses);
    }
    let anthropic_block = |m: &Value| {
        m["content"].as_array().is_some_and(|blocks| {
            blocks.iter().any(|b| {
                matches!(
                    b["type"].as_str(),
                    Some("tool_use" | "tool_result" | "thinking" | "redacted_thinking")
                )
            })
        })
    };
    let messages = body["messages"].as_array()?;
    let anthropic = body.get("system").is_some() || messages.iter().any(anthropic_block);
    Some(if anthropic {
        Format::Messages
    } else {
        Format::Chat
    })
}

/// One request, replayed growing: a turn per request the model answered (before each
/// run of its output) — an agent's trajectory sends one request per answer, not one per
/// user message.
fn one_request(request: Value) -> Result<Input, String> {
    let format = format_of(&request).ok_or("the request has no messages or input")?;
    let key = list_key(format);
    let Value::Object(mut base) = request else {
        return Err("the request is not a JSON object".into());
    };
    let items = match base.remove(key) {
        Some(Value::Array(items)) => items,
        _ => return Err(format!("the request's {key} is not an array")),
    };
    base.insert("stream".into(), Value::Bool(false));
    let cuts = cuts(&items, |item| is_output(format, item));
    Ok(Input::growing(format, format.name(), base, items, cuts))
}

/// Whether an item is the model's (an answer, a call, reasoning) rather than the client's.
pub(super) fn is_output(format: Format, item: &Value) -> bool {
    match format {
        Format::Chat | Format::Messages => item["role"] == "assistant",
        Format::Responses => match item["type"].as_str() {
            Some("message") | None => item["role"] == "assistant",
            Some(kind) => matches!(
                kind,
                "reasoning"
                    | "function_call"
                    | "custom_tool_call"
                    | "local_shell_call"
                    | "web_search_call"
                    | "image_generation_call"
            ),
        },
    }
}

/// Where each request ends: before every run of the model's output, and at the end when
/// the client spoke last.
pub(super) fn cuts(items: &[Value], output: impl Fn(&Value) -> bool) -> Vec<usize> {
    let mut cuts = Vec::new();
    let mut last_was_input = false;
    for (k, item) in items.iter().enumerate() {
        let out = output(item);
        if out && last_was_input {
            cuts.push(k);
        }
        last_was_input = !out;
    }
    if last_was_input {
        cuts.push(items.len());
    }
    cuts
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_bad_line_is_named_by_its_line_in_the_file() {
        let text = format!(
            "{}\n\n{}\n{{\"model\": \n",
            json!({"messages": [{"role": "user", "content": "a"}]}),
            json!({"messages": [{"role": "user", "content": "b"}]}),
        );
        let e = read(&text).unwrap_err();
        assert!(e.starts_with("line 4, column "), "{e}");
        assert!(!e.contains("line 1"), "{e}");
    }

    #[test]
    fn each_body_format_is_found_by_itself() {
        let chat = json!({"model": "m", "messages": [{"role": "system", "content": "s"},
                                                   {"role": "user", "content": "hi"}]});
        let messages = json!({"model": "m", "max_tokens": 9, "system": "s",
                              "messages": [{"role": "user", "content": "hi"}]});
        let responses = json!({"model": "m", "input": "hi"});
        for (body, format) in [
            (chat, Format::Chat),
            (messages, Format::Messages),
            (responses, Format::Responses),
        ] {
            let inputs = read(&format!("{body}\n{body}\n")).unwrap();
            assert_eq!((inputs[0].format, inputs[0].len()), (format, 2), "{body}");
        }
    }

    #[test]
    fn a_responses_request_grows_a_turn_per_answered_request() {
        let request = json!({"model": "m", "stream": true, "input": [
            {"type": "message", "role": "user", "content": "fix it"},
            {"type": "reasoning", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            {"type": "message", "role": "assistant", "content": "done"},
            {"type": "message", "role": "user", "content": "thanks"},
        ]});
        let inputs = read(&request.to_string()).unwrap();
        let input = &inputs[0];
        assert_eq!((input.format, input.len()), (Format::Responses, 3));
        let sizes: Vec<usize> = (0..3)
            .map(|k| input.body(k)["input"].as_array().unwrap().len())
            .collect();
        assert_eq!(sizes, [1, 4, 6]);
        assert_eq!(input.body(0)["stream"], false);
        // What is sent is that body, byte for byte as JSON.
        for (k, size) in sizes.into_iter().enumerate() {
            let sent: Value = serde_json::from_slice(&input.sent(k).bytes).unwrap();
            assert_eq!(sent, input.body(k));
            assert_eq!(input.sent(k).items.len(), size);
        }
    }

    #[test]
    fn a_claude_code_history_marks_its_newest_message_as_claude_code_does() {
        let items = vec![
            json!({"role": "user", "content": "fix it"}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "done"}]}),
            json!({"role": "user", "content": [{"type": "text", "text": "thanks"}]}),
        ];
        let base = json!({"model": "claude-sonnet-4-5"})
            .as_object()
            .unwrap()
            .clone();
        let input = Input::growing(Format::Messages, "claude-code", base, items, vec![1, 3]);
        for (k, newest) in [(0, 0), (1, 2)] {
            let sent: Value = serde_json::from_slice(&input.sent(k).bytes).unwrap();
            let messages = sent["messages"].as_array().unwrap();
            let marked: Vec<usize> = (0..messages.len())
                .filter(|&i| messages[i].to_string().contains("cache_control"))
                .collect();
            assert_eq!(marked, [newest], "{sent}");
            assert_eq!(messages[newest]["content"].as_array().unwrap().len(), 1);
        }
        // A plain Messages history is sent as it is.
        let base = json!({"model": "m"}).as_object().unwrap().clone();
        let plain = Input::growing(
            Format::Messages,
            "messages",
            base,
            vec![json!({"role": "user", "content": "a"})],
            vec![1],
        );
        assert!(!String::from_utf8_lossy(&plain.sent(0).bytes).contains("cache_control"));
    }
}
