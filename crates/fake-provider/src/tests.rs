//! The routes end to end over HTTP: dispatch, error shapes per API, recording.

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

/// One HTTP/1.1 request on its own connection; a chunked body is put back together.
async fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    let body = body.to_string();
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: fake\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(format!("{head}\r\n{body}").as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, mut rest) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v == "chunked");
    let body = if chunked {
        let mut out = String::new();
        loop {
            let (size, after) = rest.split_once("\r\n").unwrap();
            let size = usize::from_str_radix(size, 16).unwrap();
            if size == 0 {
                break;
            }
            out.push_str(&after[..size]);
            rest = &after[size + 2..];
        }
        out
    } else {
        rest.to_owned()
    };
    Reply {
        status,
        headers,
        body,
    }
}

const VERSION: (&str, &str) = ("anthropic-version", "2023-06-01");

fn messages_body(stream: bool) -> Value {
    json!({"model": "claude-x", "max_tokens": 100, "stream": stream,
        "messages": [{"role": "user", "content": "hello"}]})
}

#[tokio::test]
async fn a_streamed_response_is_typed_sse_without_done() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let body = json!({"model": "m", "input": "hello", "stream": true});
    let reply = post(
        provider.addr(),
        "/v1/responses",
        &[("x-fake-split", "1")],
        &body,
    )
    .await;
    assert_eq!(reply.status, 200);
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    assert!(!reply.body.contains("[DONE]"));
    let events: Vec<&str> = reply.body.split_terminator("\n\n").collect();
    assert!(events.iter().all(|e| e.starts_with("event: response.")));
    assert!(
        events
            .last()
            .unwrap()
            .starts_with("event: response.completed\n")
    );
    let recorded = provider.last_request().unwrap();
    assert_eq!(recorded.uri.path(), "/v1/responses");
    assert_eq!(recorded.json(), body);
    assert!(
        provider
            .wait_until(Duration::from_secs(5), |p| p.completed() == 1)
            .await
    );
}

#[tokio::test]
async fn messages_routes_answer_in_anthropics_shape() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let addr = provider.addr();
    let reply = post(addr, "/v1/messages?beta=true", &[], &messages_body(false)).await;
    assert_eq!(reply.status, 400);
    let v = reply.json();
    assert_eq!(v["type"], "error");
    assert_eq!(
        v["error"]["message"],
        "anthropic-version: header is required"
    );
    assert_eq!(reply.header("request-id"), v["request_id"].as_str());
    let reply = post(
        addr,
        "/v1/messages?beta=true",
        &[VERSION],
        &messages_body(true),
    )
    .await;
    assert_eq!(reply.status, 200);
    assert!(reply.body.starts_with("event: message_start\n"));
    assert!(
        reply
            .body
            .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
    );
    let reply = post(
        addr,
        "/v1/messages/count_tokens",
        &[VERSION],
        &messages_body(false),
    )
    .await;
    assert_eq!(reply.json(), json!({"input_tokens": 3 + 4 + 2}));
    let failing = [VERSION, ("x-fake-status", "529")];
    let reply = post(addr, "/v1/messages", &failing, &messages_body(false)).await;
    assert_eq!(reply.status, 529);
    assert_eq!(reply.json()["error"]["type"], "overloaded_error");
    assert_eq!(provider.requests().len(), 4);
    assert_eq!(provider.requests()[0].uri.query(), Some("beta=true"));
}

#[tokio::test]
async fn the_key_list_answers_401_in_each_apis_shape() {
    let provider = FakeProvider::start(Behavior {
        faults: faults::Faults {
            api_keys: vec!["sk-good".into()],
            ..faults::Faults::default()
        },
        ..Behavior::default()
    })
    .await
    .unwrap();
    let addr = provider.addr();
    let body = messages_body(false);
    let reply = post(addr, "/v1/messages", &[VERSION], &body).await;
    assert_eq!(reply.status, 401);
    assert_eq!(reply.json()["error"]["type"], "authentication_error");
    assert_eq!(
        reply.json()["error"]["message"],
        "x-api-key header is required"
    );
    let reply = post(
        addr,
        "/v1/messages",
        &[VERSION, ("x-api-key", "sk-bad")],
        &body,
    )
    .await;
    assert_eq!(reply.json()["error"]["message"], "invalid x-api-key");
    for auth in [
        ("x-api-key", "sk-good"),
        ("authorization", "Bearer sk-good"),
    ] {
        let reply = post(addr, "/v1/messages", &[VERSION, auth], &body).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let reply = post(
        addr,
        "/v1/responses",
        &[],
        &json!({"model": "m", "input": "x"}),
    )
    .await;
    assert_eq!(reply.status, 401);
    assert_eq!(reply.json()["error"]["code"], "invalid_api_key");
}
