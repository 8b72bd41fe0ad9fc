//! The forms a summary is asked in, and what comes back: a chat completion, or — for a
//! conversation that speaks Anthropic's API, on its own upstream — a Messages request
//! (an Anthropic-only gateway has no chat completions; the client's Messages route is
//! known to work); a Responses request only for a summary asked after the conversation
//! itself (see `super::in_context`). Each gives the summary's text and whether the
//! model stopped at the token cap (`finish_reason: "length"`, `stop_reason:
//! "max_tokens"`, `status: "incomplete"`): a cut answer is still used (see
//! `strategies::fit`).

use serde::Deserialize;
use serde_json::{Value, json};

use super::params::Params;
use crate::strategies::{Answer, SummaryRequest};

/// Anthropic's API version a summary asks for when the client named none.
pub(super) const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Which API a summary is asked of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wire {
    Chat,
    Messages,
    Responses,
}

impl Wire {
    /// The path below the upstream's base.
    pub(super) fn path(self) -> &'static str {
        match self {
            Wire::Chat => "/chat/completions",
            Wire::Messages => "/messages",
            Wire::Responses => "/responses",
        }
    }

    /// The request body for `model` (`params`: the form a chat model accepts).
    pub(super) fn body(
        self,
        (model, params): (&str, Params),
        call: &SummaryRequest,
        temperature: f64,
    ) -> Value {
        let max_tokens = call.max_tokens.max(1);
        match self {
            Wire::Chat => {
                let mut body = json!({
                    "model": model,
                    "messages": [
                        {"role": "system", "content": call.system},
                        {"role": "user", "content": call.prompt},
                    ],
                    "stream": false,
                });
                let cap = if params.completion_tokens {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                };
                body[cap] = json!(max_tokens);
                if !params.default_temperature {
                    body["temperature"] = json!(temperature);
                }
                body
            }
            Wire::Messages => {
                let mut body = json!({
                    "model": model,
                    "max_tokens": max_tokens,
                    "system": call.system,
                    "messages": [{"role": "user", "content": call.prompt}],
                    "stream": false,
                });
                // Anthropic takes a temperature from 0 to 1.
                if !params.default_temperature {
                    body["temperature"] = json!(temperature.clamp(0.0, 1.0));
                }
                body
            }
            Wire::Responses => {
                let mut body = json!({
                    "model": model,
                    "instructions": call.system,
                    "input": [{"role": "user", "content": call.prompt}],
                    "max_output_tokens": max_tokens,
                    "stream": false,
                });
                if !params.default_temperature {
                    body["temperature"] = json!(temperature);
                }
                body
            }
        }
    }

    /// Whether the request body differs between two forms (Messages has no
    /// `max_completion_tokens`: only the temperature can change).
    pub(super) fn sends_differently(self, a: Params, b: Params) -> bool {
        match self {
            Wire::Chat => a != b,
            Wire::Messages | Wire::Responses => a.default_temperature != b.default_temperature,
        }
    }

    /// The summary in a successful answer (`None`: not an answer of this API).
    /// With what the call cost, as the provider reported it.
    pub(super) fn answer(self, body: &[u8]) -> Option<Answer> {
        let mut answer = match self {
            Wire::Chat => chat_answer(body),
            Wire::Messages => messages_answer(body),
            Wire::Responses => responses_answer(body),
        }?;
        answer.spent =
            crate::relay::usage::from_json(body).map(|u| crate::accounting::reported(&u));
        Some(answer)
    }
}

/// `choices[0].message.content` of a chat completion, and whether it stopped at the cap.
fn chat_answer(body: &[u8]) -> Option<Answer> {
    #[derive(Deserialize)]
    struct Completion {
        choices: Vec<Choice>,
    }
    #[derive(Deserialize)]
    struct Choice {
        message: Message,
        #[serde(default)]
        finish_reason: Option<String>,
    }
    #[derive(Deserialize)]
    struct Message {
        content: Option<String>,
    }
    let completion: Completion = serde_json::from_slice(body).ok()?;
    let choice = completion.choices.into_iter().next()?;
    Some(Answer {
        text: choice.message.content.unwrap_or_default(),
        cut: choice.finish_reason.as_deref() == Some("length"),
        spent: None,
    })
}

/// The text blocks of a Messages answer, and whether it stopped at `max_tokens`.
fn messages_answer(body: &[u8]) -> Option<Answer> {
    #[derive(Deserialize)]
    struct Message {
        content: Vec<Block>,
        #[serde(default)]
        stop_reason: Option<String>,
    }
    #[derive(Deserialize)]
    struct Block {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        text: String,
    }
    let message: Message = serde_json::from_slice(body).ok()?;
    let text: Vec<&str> = message
        .content
        .iter()
        .filter(|b| b.kind == "text")
        .map(|b| b.text.as_str())
        .collect();
    Some(Answer {
        text: text.concat(),
        cut: message.stop_reason.as_deref() == Some("max_tokens"),
        spent: None,
    })
}

/// The `output_text` parts of a Responses answer's messages, and whether it is
/// `incomplete` (its cap reached).
fn responses_answer(body: &[u8]) -> Option<Answer> {
    #[derive(Deserialize)]
    struct Response {
        output: Vec<Item>,
        #[serde(default)]
        status: Option<String>,
    }
    #[derive(Deserialize)]
    struct Item {
        #[serde(rename = "type", default)]
        kind: String,
        #[serde(default)]
        content: Vec<Part>,
    }
    #[derive(Deserialize)]
    struct Part {
        #[serde(rename = "type", default)]
        kind: String,
        #[serde(default)]
        text: String,
    }
    let response: Response = serde_json::from_slice(body).ok()?;
    let text: Vec<&str> = response
        .output
        .iter()
        .filter(|i| i.kind == "message")
        .flat_map(|i| &i.content)
        .filter(|p| p.kind == "output_text")
        .map(|p| p.text.as_str())
        .collect();
    Some(Answer {
        text: text.concat(),
        cut: response.status.as_deref() == Some("incomplete"),
        spent: None,
    })
}

/// The provider's error message (OpenAI's and Anthropic's shapes both have
/// `error.message`), or the start of its body.
pub(super) fn error_message(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Envelope {
        error: Inner,
    }
    #[derive(Deserialize)]
    struct Inner {
        message: String,
    }
    match serde_json::from_slice::<Envelope>(body) {
        Ok(e) => e.error.message,
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_answers_and_whether_the_cap_cut_them() {
        let chat = br###"{"choices":[{"index":0,"message":{"role":"assistant","content":"## Goal\nx"},"finish_reason":"stop"}]}"###;
        let answer = Wire::Chat.answer(chat).unwrap();
        assert_eq!((answer.text.as_str(), answer.cut), ("## Goal\nx", false));
        let cut = br###"{"choices":[{"message":{"content":"## Goal\nthe us"},"finish_reason":"length"}]}"###;
        assert!(Wire::Chat.answer(cut).unwrap().cut);
        assert_eq!(
            Wire::Chat
                .answer(br#"{"choices":[{"message":{"content":null}}]}"#)
                .unwrap()
                .text,
            ""
        );
        assert_eq!(Wire::Chat.answer(b"nope"), None);
        let messages = br###"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"text","text":"## Goal\n"},{"type":"text","text":"fix it"}],"stop_reason":"max_tokens"}"###;
        let answer = Wire::Messages.answer(messages).unwrap();
        assert_eq!(answer.text, "## Goal\nfix it");
        assert!(answer.cut);
        assert_eq!(Wire::Messages.answer(chat), None);
        let responses = br###"{"status":"incomplete","output":[{"type":"reasoning","summary":[]},{"type":"message","content":[{"type":"output_text","text":"## Goal\nx"}]}]}"###;
        let answer = Wire::Responses.answer(responses).unwrap();
        assert_eq!((answer.text.as_str(), answer.cut), ("## Goal\nx", true));
    }

    #[test]
    fn reads_error_messages_of_either_shape() {
        assert_eq!(
            error_message(br#"{"error":{"message":"bad key","type":"x"}}"#),
            "bad key"
        );
        assert_eq!(
            error_message(br#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#),
            "invalid x-api-key"
        );
        assert_eq!(error_message(b"plain"), "plain");
    }

    #[test]
    fn a_messages_summary_has_no_tools_and_a_cap() {
        let call = SummaryRequest {
            system: "s".into(),
            prompt: "p".into(),
            max_tokens: 300,
            in_context: None,
        };
        let body = Wire::Messages.body(("claude-x", Params::default()), &call, 1.5);
        assert_eq!(body["max_tokens"], 300);
        assert_eq!(body["temperature"], 1.0, "within Anthropic's range");
        let learned = Params {
            default_temperature: true,
            ..Params::default()
        };
        assert!(Wire::Messages.body(("claude-x", learned), &call, 0.2)["temperature"].is_null());
        // A refusal of max_tokens changes nothing a Messages request sends: no retry.
        let completion = Params {
            completion_tokens: true,
            ..Params::default()
        };
        assert!(!Wire::Messages.sends_differently(Params::default(), completion));
        assert!(Wire::Messages.sends_differently(Params::default(), learned));
        assert!(Wire::Chat.sends_differently(Params::default(), completion));
        assert_eq!(body["system"], "s");
        assert_eq!(body["messages"][0]["content"], "p");
        assert!(body.get("tools").is_none());
    }
}
