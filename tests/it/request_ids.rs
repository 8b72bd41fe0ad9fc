//! `x-request-id` on every response: the provider's when it sent one (OpenAI's
//! `x-request-id`, Anthropic's `request-id`), else the request's own — the client's
//! when it sent a usable one, else abridge's 16 hex characters — on proxied and
//! streamed successes and on abridge's own errors; the request's id goes upstream. (That
//! the request's log lines carry it is checked on the binary, in `lifecycle`.)

use fake_provider::{Behavior, FakeProvider};

use crate::common::{Proxy, chat_body, client, closed_port, config_for, setup};

fn id_of(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("x-request-id")
        .expect("every response carries x-request-id")
        .to_str()
        .unwrap()
        .to_owned()
}

fn is_own(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

async fn chat(proxy: &Proxy, stream: bool, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-ids")
        .body(chat_body(stream));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn proxied_and_streamed_successes_carry_the_providers_id() {
    let (provider, proxy) = setup().await;
    let plain = chat(&proxy, false, &[]).await;
    assert_eq!(plain.status(), 200);
    let theirs = id_of(&plain);
    assert!(theirs.parse::<u64>().is_ok(), "the fake's id: {theirs}");
    // abridge's own id went upstream with the request.
    let sent = provider.last_request().unwrap();
    assert!(is_own(sent.headers["x-request-id"].to_str().unwrap()));

    let streamed = chat(&proxy, true, &[]).await;
    assert_eq!(streamed.status(), 200);
    let id = id_of(&streamed);
    assert!(id.parse::<u64>().is_ok() && id != theirs, "{id}");
    assert!(streamed.text().await.unwrap().contains("[DONE]"));

    let models = client().get(proxy.url("/v1/models")).send().await.unwrap();
    assert_eq!(models.status(), 200);
    assert!(id_of(&models).parse::<u64>().is_ok());
}

#[tokio::test]
async fn a_provider_without_an_id_gets_the_requests_own() {
    let (provider, proxy) = setup().await;
    let response = chat(&proxy, false, &[("x-fake-request-id", "none")]).await;
    assert_eq!(response.status(), 200);
    let id = id_of(&response);
    assert!(is_own(&id), "{id}");
    assert_eq!(provider.last_request().unwrap().headers["x-request-id"], id);
    let other = chat(&proxy, true, &[("x-fake-request-id", "none")]).await;
    assert_ne!(id_of(&other), id, "one per request");
}

#[tokio::test]
async fn anthropics_request_id_becomes_x_request_id() {
    let (_provider, proxy) = setup().await;
    let response = client()
        .post(proxy.url("/v1/messages"))
        .header("x-api-key", "sk-ant-ids")
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .body(r#"{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"Hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let theirs = response.headers()["request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(theirs.starts_with("req_"), "{theirs}");
    assert_eq!(id_of(&response), theirs);
}

#[tokio::test]
async fn abridges_own_errors_carry_its_id() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let mut config = config_for(&provider.url());
    config.limits.max_body_bytes = 1024;
    let proxy = Proxy::start_with(config).await;
    let unknown = client().get(proxy.url("/nowhere")).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    assert!(is_own(&id_of(&unknown)));
    let large = client()
        .post(proxy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
            "x".repeat(4096)
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(large.status(), 413);
    assert!(is_own(&id_of(&large)));
    assert!(provider.requests().is_empty());

    let gone = Proxy::start(&format!("http://{}/v1", closed_port().await)).await;
    let unreachable = chat(&gone, false, &[]).await;
    assert_eq!(unreachable.status(), 502);
    assert!(is_own(&id_of(&unreachable)));
}

/// A client's own id (a gateway's) is the request's id: it goes upstream as it came and
/// comes back on abridge's own answers; the provider's id still wins on the provider's.
#[tokio::test]
async fn a_clients_id_is_propagated_and_echoed_and_the_providers_wins() {
    let (provider, proxy) = setup().await;
    let mine = [("x-request-id", "gw-2c9e:0017")];
    let proxied = chat(&proxy, false, &mine).await;
    assert_eq!(proxied.status(), 200);
    assert!(
        id_of(&proxied).parse::<u64>().is_ok(),
        "the provider's wins"
    );
    assert_eq!(
        provider.last_request().unwrap().headers["x-request-id"],
        "gw-2c9e:0017"
    );
    let unnamed = chat(&proxy, false, &[mine[0], ("x-fake-request-id", "none")]).await;
    assert_eq!(id_of(&unnamed), "gw-2c9e:0017");
    let unknown = client()
        .get(proxy.url("/nowhere"))
        .header("x-request-id", "gw-2c9e:0018")
        .send()
        .await
        .unwrap();
    assert_eq!(id_of(&unknown), "gw-2c9e:0018");
    // One that is not a usable id is replaced, upstream too.
    let spaced = chat(
        &proxy,
        false,
        &[
            ("x-request-id", "has a space"),
            ("x-fake-request-id", "none"),
        ],
    )
    .await;
    let id = id_of(&spaced);
    assert!(is_own(&id), "{id}");
    assert_eq!(provider.last_request().unwrap().headers["x-request-id"], id);
    // A second value (never checked) does not pass upstream beside the first.
    let twice = chat(
        &proxy,
        false,
        &[
            ("x-request-id", "gw-2c9e:0019"),
            ("x-request-id", "injected\tvalue"),
        ],
    )
    .await;
    assert_eq!(twice.status(), 200);
    let sent: Vec<_> = provider
        .last_request()
        .unwrap()
        .headers
        .get_all("x-request-id")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    assert_eq!(sent, ["gw-2c9e:0019"]);
}
