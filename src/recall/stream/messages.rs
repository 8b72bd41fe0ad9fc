//! Messages' side of a streamed round: `message_start`, blocks by `index`,
//! `message_delta`, `message_stop`.

use serde_json::Value;

use super::{Event, Kind, Part, Round};

impl Round {
    pub(super) fn read_messages(&mut self, event: &Event) -> Kind {
        let Some(value) = &event.value else {
            return Kind::Pass;
        };
        let index = value["index"].as_u64().unwrap_or(0);
        let at = usize::try_from(index).unwrap_or(usize::MAX);
        match event.kind() {
            "message_start" => {
                let message = &value["message"];
                self.usage = message.get("usage").filter(|u| u.is_object()).cloned();
                for key in ["id", "model", "role"] {
                    self.answer[key] = message[key].clone();
                }
                if self.continuation() {
                    return Kind::Drop;
                }
            }
            "content_block_start" => {
                let block = value["content_block"].clone();
                if at == self.parts.len() && !self.given_up {
                    self.parts.push(Part {
                        block: block.clone(),
                        ..Part::default()
                    });
                }
                if block["type"] == "tool_use" {
                    if block["name"] == *self.carry.name {
                        self.recalls.push(index);
                    } else {
                        self.client_calls = true;
                    }
                    return Kind::Hold;
                }
            }
            "content_block_delta" => {
                if let Some(part) = self.parts.get_mut(at) {
                    part.delta(&value["delta"]);
                }
            }
            "message_delta" => {
                self.answer["stop_reason"] = value["delta"]["stop_reason"].clone();
                if let (Some(Value::Object(usage)), Some(more)) = (
                    self.usage.as_mut(),
                    value.get("usage").and_then(Value::as_object),
                ) {
                    for (key, v) in more {
                        usage.insert(key.clone(), v.clone());
                    }
                }
            }
            _ => {}
        }
        Kind::Pass
    }

    pub(super) fn out_messages(&mut self, value: &mut Value) -> Option<bool> {
        let mut changed = false;
        if let Some(provider) = value.get("index").and_then(Value::as_u64) {
            let index = self.index(provider, self.carry.offset)?;
            if index != provider {
                value["index"] = Value::from(index);
                changed = true;
            }
        }
        if value["type"] == "message_delta" {
            if !self.recalls.is_empty()
                && !self.client_calls
                && value["delta"]["stop_reason"] == "tool_use"
            {
                value["delta"]["stop_reason"] = Value::from("end_turn");
                changed = true;
            }
            if let Some(total) = self.usage.as_ref().and_then(|u| self.summed(u)) {
                value["usage"] = total;
                changed = true;
            }
        }
        Some(changed)
    }
}

impl Part {
    /// A Messages delta, gathered.
    fn delta(&mut self, delta: &Value) {
        let more = |key: &str| delta[key].as_str().unwrap_or_default();
        match delta["type"].as_str() {
            Some("text_delta") => self.text.push_str(more("text")),
            Some("thinking_delta") => self.text.push_str(more("thinking")),
            Some("signature_delta") => self.signature.push_str(more("signature")),
            Some("input_json_delta") => self.input.push_str(more("partial_json")),
            _ => {}
        }
    }

    /// The Messages block, whole.
    pub(super) fn block(&self) -> Value {
        let mut block = self.block.clone();
        match block["type"].as_str() {
            Some("text") => block["text"] = Value::from(self.text.as_str()),
            Some("thinking") => {
                block["thinking"] = Value::from(self.text.as_str());
                block["signature"] = Value::from(self.signature.as_str());
            }
            _ => {}
        }
        if !self.input.is_empty()
            && let Ok(input) = serde_json::from_str::<Value>(&self.input)
        {
            block["input"] = input;
        }
        block
    }
}
