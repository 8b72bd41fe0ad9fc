//! A conversation driven through abridge turn by turn (one tenant, the fake provider's
//! replies appended): what each answer said about compaction, and what was forwarded.

use fake_provider::FakeProvider;
use serde_json::{Value, json};

use super::{Proxy, client};

/// What abridge answered a turn with.
pub struct Answer {
    pub status: u16,
    pub compacted: bool,
    pub note: Option<String>,
    pub conversation: Option<String>,
    pub reply: Value,
}

/// One turn: `messages` sent as a chat completion by one tenant.
pub async fn send(proxy: &Proxy, messages: &[Value]) -> Answer {
    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-turns")
        .body(json!({"model": "fake-model", "messages": messages}).to_string())
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (compacted, note, conversation) = (
        header("x-abridge-compacted").as_deref() == Some("true"),
        header("x-abridge-note"),
        header("x-abridge-conversation"),
    );
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    Answer {
        status,
        compacted,
        note,
        conversation,
        reply: body["choices"][0]["message"].clone(),
    }
}

/// The raw messages the provider received last.
pub fn last_forwarded(provider: &FakeProvider) -> Vec<String> {
    let last = provider.last_request().unwrap();
    abridge::formats::chat::parse(&last.body)
        .unwrap()
        .messages
        .iter()
        .map(|m| m.raw.get().to_owned())
        .collect()
}

/// A conversation until it is compacted (so a checkpoint is on the master); its id.
pub async fn until_compacted(proxy: &Proxy, messages: &mut Vec<Value>) -> String {
    messages.push(json!({"role": "system", "content": "Be brief."}));
    for turn in 1..30 {
        messages.push(json!({"role": "user", "content": format!(
            "Turn {turn}: {}", "Tell me more about the harbour and its old lighthouse. ".repeat(20)
        )}));
        let answer = send(proxy, messages).await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.note, None, "turn {turn}");
        messages.push(answer.reply.clone());
        if answer.compacted {
            return answer.conversation.unwrap();
        }
    }
    panic!("never compacted");
}
