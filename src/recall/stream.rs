//! Recall in a streamed answer: each format's events read as they pass, so that a recall
//! call never reaches the client and the rounds make one well-formed stream.
//!
//! A round relays its events as they come until the first tool call of any kind starts
//! (chat's first `tool_calls` delta, a Responses `function_call` item, a Messages
//! `tool_use` block); from there the round's events are held until it ends. A round that
//! called `abridge_recall` (and may be followed by another) is dropped from that point:
//! the caller asks the provider again and relays the next round as its continuation.
//! Otherwise what was held is relayed, any recall call taken out. Text the model wrote
//! before a call thus reaches the client as it came, and a client's own tool calls come
//! whole at the end of the round, as they would have.
//!
//! A continuation drops what opens a stream (Responses' `response.created`,
//! `…in_progress` and `…queued`, Messages' `message_start`), numbers its items and blocks
//! after those already relayed (and Responses' `sequence_number` after the last sent);
//! its last usage is every round's, summed (the client pays for them all). A Responses
//! event that echoes the request (its `response` object) shows the client's own tools
//! and `tool_choice`, and the final response lists every item the client was sent.
//!
//! **Bounded.** What a round keeps to serve recall — the events it holds (as they came,
//! not parsed) and the text it gathers for the follow-up — is counted in bytes of the
//! events it read to keep it ([`Round::kept`]); past `recall.max_answer_bytes` (and past
//! `recall.max_hold_ms` of holding, which the caller times), the round gives recall up
//! ([`Round::give_up`]): what was held is relayed as it came, any call of abridge's tool
//! taken out, and every later event passes at once, read only to take such calls out;
//! nothing more is gathered and no round follows. The bytes of the stream are split
//! into events by [`reader::Reader`], linearly, within the same bound.
//!
//! What is common is here, with Responses' side; chat's and Messages' are in [`chat`]
//! and [`messages`]. Events are parsed here only for compacted streams that carry the
//! tool.

use serde_json::{Value, json};

use std::borrow::Cow;

use super::wire::{Answer, add_usage};
use crate::formats::Format;
use crate::relay::events::next_event;

mod chat;
mod messages;
pub mod reader;

/// One complete event, as it came and as JSON (`None`: not JSON, such as `[DONE]`).
#[derive(Debug)]
pub struct Event {
    name: Option<String>,
    raw: Vec<u8>,
    value: Option<Value>,
}

impl Event {
    /// The first complete event of `bytes` and the bytes it took.
    pub fn read(bytes: &[u8]) -> Option<(usize, Event)> {
        let (len, event) = next_event(bytes)?;
        let data = event.data();
        let value = serde_json::from_str(&data).ok();
        let name = event.name.map(str::to_owned);
        Some((
            len,
            Event {
                name,
                raw: bytes[..len].to_vec(),
                value,
            },
        ))
    }

    /// The event's type: its name, or the data's `type`.
    fn kind(&self) -> &str {
        self.name
            .as_deref()
            .filter(|n| !n.is_empty())
            .or_else(|| self.value.as_ref()?.get("type")?.as_str())
            .unwrap_or("")
    }

    fn write(&self, value: &Value) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.raw.len() + 16);
        if let Some(name) = &self.name {
            out.extend_from_slice(format!("event: {name}\n").as_bytes());
        }
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(value.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
        out
    }
}

/// What the rounds of one client request carry from one to the next.
#[derive(Debug)]
pub struct Carry {
    format: Format,
    /// Rounds relayed before this one.
    round: u32,
    /// Responses: the next `sequence_number`.
    seq: u64,
    /// Items (Responses) or blocks (Messages) relayed in earlier rounds.
    offset: u64,
    /// Responses: the output items relayed in earlier rounds.
    items: Vec<Value>,
    /// Every earlier round's usage, summed.
    usage: Option<Value>,
    /// The client's `tool_choice`, as a Responses answer echoes it.
    choice: Value,
    /// The name abridge's tool goes by in the request (see [`super::Tool`]).
    name: Cow<'static, str>,
    /// Bytes of the events whose items `items` holds.
    kept: usize,
}

impl Carry {
    /// Before the first round of a request whose tool is named `name`.
    pub fn new(format: Format, choice: Value, name: Cow<'static, str>) -> Self {
        Self {
            format,
            round: 0,
            seq: 0,
            offset: 0,
            items: Vec::new(),
            usage: None,
            choice,
            name,
            kept: 0,
        }
    }
}

/// One round's stream, read as it passes.
#[derive(Debug)]
pub struct Round {
    carry: Carry,
    holding: bool,
    /// The events held, as they came (parsed again when relayed).
    held: Vec<u8>,
    /// Bytes of the events read to keep what the round keeps (see the module docs),
    /// the items carried from earlier rounds included.
    kept: usize,
    /// Recall is given up for the round (see [`Round::give_up`]).
    given_up: bool,
    /// Bytes of the events of the items carried and relayed this round (Responses).
    kept_items: usize,
    /// Indices of the recall calls (chat's tool call index, Responses' `output_index`,
    /// Messages' block `index`), as the provider numbered them.
    recalls: Vec<u64>,
    /// Whether the round calls a client's tool too.
    client_calls: bool,
    /// The next item or block index after those relayed, in the client's numbering.
    next_index: u64,
    /// Responses: output items relayed this round.
    items: Vec<Value>,
    usage: Option<Value>,
    /// What a whole answer would say besides its parts (Responses: the whole answer,
    /// from the terminal event).
    answer: Value,
    /// Chat's text (a part with no block) and tool calls; Messages' blocks.
    parts: Vec<Part>,
}

/// A part of the answer, its text gathered as it streams (in one buffer each, so the
/// work stays linear in the answer's size).
#[derive(Debug, Default)]
struct Part {
    /// The block (Messages) or tool call (chat) as it started.
    block: Value,
    /// Text, thinking, or (chat) a call's arguments.
    text: String,
    signature: String,
    /// A tool call's input JSON (Messages).
    input: String,
}

enum Kind {
    /// Relayed now, or held when holding.
    Pass,
    /// A tool call starts: held from here.
    Hold,
    /// An opening event of a continuation.
    Drop,
}

impl Round {
    pub fn new(carry: Carry) -> Self {
        let answer = match carry.format {
            Format::Chat | Format::Messages => json!({}),
            Format::Responses => Value::Null,
        };
        let kept = carry.kept;
        Self {
            kept,
            carry,
            holding: false,
            held: Vec::new(),
            given_up: false,
            kept_items: kept,
            recalls: Vec::new(),
            client_calls: false,
            next_index: 0,
            items: Vec::new(),
            usage: None,
            answer,
            parts: Vec::new(),
        }
    }

    /// One event from the provider: the bytes for the client now.
    pub fn event(&mut self, event: Event) -> Vec<u8> {
        let kind = match self.carry.format {
            Format::Chat => self.read_chat(&event),
            Format::Responses => self.read_responses(&event),
            Format::Messages => self.read_messages(&event),
        };
        if !self.given_up {
            self.kept += event.raw.len();
        }
        match kind {
            Kind::Drop => Vec::new(),
            _ if self.given_up => self.out(event),
            Kind::Hold => {
                self.holding = true;
                self.held.extend_from_slice(&event.raw);
                Vec::new()
            }
            Kind::Pass if self.holding => {
                self.held.extend_from_slice(&event.raw);
                Vec::new()
            }
            Kind::Pass => self.out(event),
        }
    }

    /// The round's stream ended: when it called the recall tool and `more` rounds may
    /// follow, the answer whose calls to serve (what was held is then dropped).
    pub fn recalled(&self, more: bool) -> Option<Answer> {
        if !more || self.given_up || self.recalls.is_empty() || self.answer.is_null() {
            return None;
        }
        let answer = Answer::of(self.carry.format, self.whole(), &self.carry.name);
        (!answer.calls.is_empty()).then_some(answer)
    }

    /// What was held, for the client: any recall call taken out.
    pub fn flush(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        let mut at = 0;
        while let Some((len, event)) = Event::read(&held[at..]) {
            at += len;
            out.extend(self.out(event));
        }
        out
    }

    /// Bytes of the events read to keep what the round keeps (see the module docs).
    pub fn kept(&self) -> usize {
        self.kept
    }

    /// Whether the round holds its events (from its first tool call on, until it ends
    /// or gives recall up).
    pub fn holding(&self) -> bool {
        self.holding && !self.given_up
    }

    /// Gives recall up for the round (see the module docs): what was held, for the
    /// client now, any call of abridge's tool taken out.
    pub fn give_up(&mut self) -> Vec<u8> {
        if self.given_up {
            return Vec::new();
        }
        let out = self.flush();
        self.given_up = true;
        self.parts = Vec::new();
        self.answer = Value::Null;
        out
    }

    /// Whether an event too large to read may pass to the client unread, once recall is
    /// given up: when none of its bytes can be a call of abridge's tool's (the round
    /// started none; the reader looks for the name in the event's bytes) and the client
    /// gets it as the provider wrote it (a first round, or a chat one: no renumbering).
    fn may_pass_unread(&self) -> bool {
        self.given_up
            && self.recalls.is_empty()
            && (self.carry.format == Format::Chat || !self.continuation())
    }

    /// The event that ends the client's stream when the round can neither read an event
    /// nor let it pass: the format's error event (it names no tool).
    fn error_event(&self) -> Vec<u8> {
        const MESSAGE: &str = "The answer could not be relayed: one of its events was larger than the proxy reads (recall.max_answer_bytes).";
        let event = match self.carry.format {
            Format::Chat => {
                json!({"error": {"message": MESSAGE, "type": "server_error", "param": null, "code": "answer_too_large"}})
            }
            Format::Responses => {
                json!({"type": "error", "sequence_number": self.carry.seq, "code": "answer_too_large", "message": MESSAGE, "param": null})
            }
            Format::Messages => {
                json!({"type": "error", "error": {"type": "api_error", "message": MESSAGE}})
            }
        };
        let name = (self.carry.format != Format::Chat).then_some("error");
        let mut out = Vec::new();
        if let Some(name) = name {
            out.extend_from_slice(format!("event: {name}\n").as_bytes());
        }
        out.extend_from_slice(format!("data: {event}\n\n").as_bytes());
        out
    }

    /// The round's own usage, as the provider reported it (once the stream ended).
    pub fn usage(&self) -> Option<&Value> {
        self.usage.as_ref()
    }

    /// What the next round carries, this one dropped where it was held.
    pub fn into_carry(self) -> Carry {
        let mut carry = self.carry;
        carry.round += 1;
        carry.kept = self.kept_items;
        carry.offset = self.next_index;
        carry.items.extend(self.items);
        if let Some(usage) = self.usage {
            match &mut carry.usage {
                Some(total) => add_usage(total, &usage),
                None => carry.usage = Some(usage),
            }
        }
        carry
    }

    /// The answer as a whole (non-streamed) answer would have it.
    fn whole(&self) -> Value {
        let mut answer = self.answer.clone();
        match self.carry.format {
            Format::Responses => {}
            Format::Chat => {
                let mut message = json!({"role": "assistant", "content": null});
                let mut calls = Vec::new();
                for part in &self.parts {
                    if part.block.is_null() {
                        message["content"] = Value::from(part.text.as_str());
                    } else {
                        let mut call = part.block.clone();
                        if let Some(call) = call.as_object_mut() {
                            call.remove("index");
                        }
                        call["function"]["arguments"] = Value::from(part.text.as_str());
                        calls.push(call);
                    }
                }
                if !calls.is_empty() {
                    message["tool_calls"] = Value::from(calls);
                }
                let finish = answer["finish_reason"].take();
                answer["choices"] =
                    json!([{"index": 0, "message": message, "finish_reason": finish}]);
            }
            Format::Messages => {
                let blocks: Vec<Value> = self.parts.iter().map(Part::block).collect();
                answer["content"] = Value::from(blocks);
            }
        }
        answer
    }

    fn continuation(&self) -> bool {
        self.carry.round > 0
    }

    /// Every round's usage with this round's `usage`, when there were earlier rounds.
    fn summed(&self, usage: &Value) -> Option<Value> {
        let mut total = self.carry.usage.clone()?;
        add_usage(&mut total, usage);
        Some(total)
    }

    /// An index as the client sees it (`None`: a recall call's, not relayed).
    fn index(&mut self, provider: u64, offset: u64) -> Option<u64> {
        if self.recalls.contains(&provider) {
            return None;
        }
        let before = self.recalls.iter().filter(|r| **r < provider).count() as u64;
        let index = offset + provider - before;
        self.next_index = self.next_index.max(index + 1);
        Some(index)
    }

    /// `event` as the client gets it (empty: not relayed).
    fn out(&mut self, mut event: Event) -> Vec<u8> {
        let kind = match self.carry.format {
            Format::Responses => event.kind().to_owned(),
            Format::Chat | Format::Messages => String::new(),
        };
        if kind == "response.output_item.done" && !self.given_up {
            self.kept_items += event.raw.len();
        }
        let Some(mut value) = event.value.take() else {
            return event.raw;
        };
        let changed = match self.carry.format {
            Format::Chat => self.out_chat(&mut value),
            Format::Responses => self.out_responses(&kind, &mut value),
            Format::Messages => self.out_messages(&mut value),
        };
        match changed {
            None => Vec::new(),
            Some(false) => event.raw,
            Some(true) => event.write(&value),
        }
    }
}

/// Responses: named events with `sequence_number`, items by `output_index`.
impl Round {
    fn read_responses(&mut self, event: &Event) -> Kind {
        let Some(value) = &event.value else {
            return Kind::Pass;
        };
        match event.kind() {
            "response.created" | "response.in_progress" | "response.queued"
                if self.continuation() =>
            {
                Kind::Drop
            }
            "response.output_item.added" if value["item"]["type"] == "function_call" => {
                if value["item"]["name"] == *self.carry.name {
                    self.recalls
                        .push(value["output_index"].as_u64().unwrap_or(0));
                } else {
                    self.client_calls = true;
                }
                Kind::Hold
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                if !self.given_up {
                    self.answer = value["response"].clone();
                }
                self.usage = value["response"]
                    .get("usage")
                    .filter(|u| u.is_object())
                    .cloned();
                Kind::Pass
            }
            _ => Kind::Pass,
        }
    }

    fn out_responses(&mut self, kind: &str, value: &mut Value) -> Option<bool> {
        let mut changed = false;
        if let Some(provider) = value.get("output_index").and_then(Value::as_u64) {
            let index = self.index(provider, self.carry.offset)?;
            if index != provider {
                value["output_index"] = Value::from(index);
                changed = true;
            }
        }
        if let Some(seq) = value.get("sequence_number").and_then(Value::as_u64) {
            if self.continuation() {
                value["sequence_number"] = Value::from(self.carry.seq);
                changed = true;
            }
            self.carry.seq = if self.continuation() {
                self.carry.seq + 1
            } else {
                seq + 1
            };
        }
        if kind == "response.output_item.done" && !self.given_up {
            self.items.push(value["item"].clone());
        }
        if let Some(response) = value.get_mut("response").filter(|r| r.is_object()) {
            self.echo(response, is_terminal(kind));
            changed = true;
        }
        Some(changed)
    }

    /// A `response` object as the client sees it: its own tools and `tool_choice`; at
    /// the end, every item it was sent and every round's usage.
    fn echo(&self, response: &mut Value, terminal: bool) {
        if let Some(tools) = response.get_mut("tools").and_then(Value::as_array_mut) {
            tools.retain(|t| t["name"] != *self.carry.name);
        }
        if let Some(echoed) = response.get_mut("tool_choice") {
            *echoed = self.carry.choice.clone();
        }
        if !terminal {
            return;
        }
        if let Some(output) = response.get_mut("output").and_then(Value::as_array_mut) {
            output.retain(|o| !(o["type"] == "function_call" && o["name"] == *self.carry.name));
            let mut all = self.carry.items.clone();
            all.append(output);
            *output = all;
        }
        if let Some(total) = response.get("usage").and_then(|u| self.summed(u)) {
            response["usage"] = total;
        }
    }
}

fn is_terminal(kind: &str) -> bool {
    matches!(
        kind,
        "response.completed" | "response.incomplete" | "response.failed"
    )
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
