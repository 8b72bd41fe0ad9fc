//! Chat's side of a streamed round: `choices[0].delta` chunks (text, then tool calls by
//! index), the usage chunk, `[DONE]`.

use serde_json::{Value, json};

use super::{Event, Kind, Part, Round};

impl Round {
    pub(super) fn read_chat(&mut self, event: &Event) -> Kind {
        let Some(chunk) = &event.value else {
            return Kind::Pass;
        };
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        for key in ["id", "model", "created"] {
            if let (Some(v), Some(top)) = (chunk.get(key), self.answer.as_object_mut()) {
                top.insert(key.to_owned(), v.clone());
            }
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return Kind::Pass;
        };
        if let Some(finish) = choice.get("finish_reason").filter(|f| !f.is_null()) {
            self.answer["finish_reason"] = finish.clone();
        }
        if let Some(text) = choice.pointer("/delta/content").and_then(Value::as_str)
            && !self.given_up
        {
            if self.parts.first().is_none_or(|p| !p.block.is_null()) {
                self.parts.insert(0, Part::default());
            }
            self.parts[0].text.push_str(text);
        }
        let Some(deltas) = choice
            .pointer("/delta/tool_calls")
            .and_then(Value::as_array)
        else {
            return Kind::Pass;
        };
        for delta in deltas {
            let index = delta["index"].as_u64().unwrap_or(0);
            if self.given_up {
                // Only which calls are abridge's, to take them out.
                if let Some(name) = delta.pointer("/function/name").and_then(Value::as_str) {
                    self.called(name, index);
                }
                continue;
            }
            let known = self.parts.iter().position(|p| p.block["index"] == index);
            let at = known.unwrap_or_else(|| {
                self.parts.push(Part {
                    block: json!({"id": "", "type": "function", "function": {"name": ""}, "index": index}),
                    ..Part::default()
                });
                self.parts.len() - 1
            });
            let call = &mut self.parts[at];
            if let Some(id) = delta["id"].as_str() {
                call.block["id"] = Value::from(id);
            }
            if let Some(name) = delta.pointer("/function/name").and_then(Value::as_str) {
                call.block["function"]["name"] = Value::from(name);
                self.called(name, index);
            }
            if let Some(more) = delta.pointer("/function/arguments").and_then(Value::as_str) {
                self.parts[at].text.push_str(more);
            }
        }
        Kind::Hold
    }

    /// A call of `name` starts at `index`: abridge's, or a client's.
    fn called(&mut self, name: &str, index: u64) {
        if name == self.carry.name {
            self.recalls.push(index);
        } else {
            self.client_calls = true;
        }
    }

    /// `Some(changed)`, or `None` when nothing is left of the chunk.
    pub(super) fn out_chat(&mut self, chunk: &mut Value) -> Option<bool> {
        let mut changed = false;
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object())
            && let Some(total) = self.summed(usage)
        {
            chunk["usage"] = total;
            changed = true;
        }
        let Some(choice) = chunk.pointer_mut("/choices/0") else {
            return Some(changed);
        };
        if !self.recalls.is_empty() && !self.client_calls && choice["finish_reason"] == "tool_calls"
        {
            choice["finish_reason"] = Value::from("stop");
            changed = true;
        }
        let Some(deltas) = choice
            .pointer_mut("/delta/tool_calls")
            .and_then(Value::as_array_mut)
        else {
            return Some(changed);
        };
        if self.recalls.is_empty() {
            return Some(changed);
        }
        let recalls = &self.recalls;
        deltas.retain(|d| !recalls.contains(&d["index"].as_u64().unwrap_or(0)));
        for delta in deltas.iter_mut() {
            let index = delta["index"].as_u64().unwrap_or(0);
            let before = recalls.iter().filter(|r| **r < index).count() as u64;
            delta["index"] = Value::from(index - before);
        }
        if deltas.is_empty() {
            let delta = choice["delta"].as_object_mut()?;
            delta.remove("tool_calls");
            let empty = delta.values().all(|v| v.is_null() || v == "");
            if empty && choice["finish_reason"].is_null() {
                return None;
            }
        }
        Some(true)
    }
}
