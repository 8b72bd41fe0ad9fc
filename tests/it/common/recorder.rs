//! A recording relay: between abridge and a real provider (llama-server), it keeps
//! every request it passes on — method, path, headers, body — so a test can say what
//! reached the provider, and streams each answer back as it comes.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use tokio::net::TcpListener;

/// One request the relay passed on.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: http::Method,
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: bytes::Bytes,
}

impl Recorded {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

#[derive(Clone)]
struct Relay {
    origin: String,
    seen: Arc<Mutex<Vec<Recorded>>>,
    client: reqwest::Client,
}

/// The relay on `127.0.0.1:0` in front of `origin` (scheme and host, no path), until
/// dropped.
pub struct Recorder {
    seen: Arc<Mutex<Vec<Recorded>>>,
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    pub async fn start(origin: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let relay = Relay {
            origin: origin.trim_end_matches('/').to_owned(),
            seen: Arc::default(),
            // No overall timeout: a real model's answer takes what it takes.
            client: reqwest::Client::new(),
        };
        let seen = relay.seen.clone();
        let app = axum::Router::new().fallback(pass_on).with_state(relay);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { seen, addr, task }
    }

    /// `http://<relay><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// What it passed on so far, oldest first.
    pub fn requests(&self) -> Vec<Recorded> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pass_on(State(relay): State<Relay>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    relay.seen.lock().unwrap().push(Recorded {
        method: parts.method.clone(),
        path: parts.uri.path().to_owned(),
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    let mut headers = parts.headers;
    headers.remove(http::header::HOST);
    headers.remove(http::header::CONTENT_LENGTH);
    let answer = relay
        .client
        .request(parts.method, format!("{}{path}", relay.origin))
        .headers(headers)
        .body(body)
        .send()
        .await;
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => {
            return Response::builder()
                .status(502)
                .body(Body::from(format!("relay: {e}")))
                .unwrap();
        }
    };
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if name != http::header::CONTENT_LENGTH && name != http::header::TRANSFER_ENCODING {
            response = response.header(name, value);
        }
    }
    response
        .body(Body::from_stream(answer.bytes_stream()))
        .unwrap()
}
