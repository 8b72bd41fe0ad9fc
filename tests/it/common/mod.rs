//! Shared test support: abridge in-process on ephemeral ports in front of the fake
//! provider, real HTTP clients, and real Redis servers (see [`redis`]), plain or TLS
//! ([`redis_tls`]).

#![allow(
    dead_code,
    reason = "each test module uses a different part of the support"
)]

pub mod agent;
pub mod binary;
pub mod claude;
pub mod llama;
pub mod recorder;
pub mod redis;
pub mod redis_tls;
pub mod responses;
pub mod turns;

use std::net::SocketAddr;
use std::time::Duration;

use abridge::stats::Snapshot;
use abridge::{AppState, Config, Listeners};
use fake_provider::{Behavior, FakeProvider};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// abridge running in this process, on `127.0.0.1:0` for both listeners.
pub struct Proxy {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub state: AppState,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl Proxy {
    /// abridge with default settings in front of `upstream` (a base URL with `/v1`).
    pub async fn start(upstream: &str) -> Self {
        Self::start_with(config_for(upstream)).await
    }

    pub async fn start_with(config: Config) -> Self {
        let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = proxy.local_addr().unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let state = AppState::new(config).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(abridge::run(
            Listeners { proxy, admin },
            state.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            addr,
            admin: admin_addr,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// `http://<proxy>/<path>`; `path` starts with `/`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn stats(&self) -> Snapshot {
        self.state.stats().snapshot()
    }

    /// `GET http://<admin><path>` with the admin `token`, as JSON.
    pub async fn admin_json(&self, path: &str, token: &str) -> serde_json::Value {
        client()
            .get(format!("http://{}{path}", self.admin))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Signals shutdown and waits for `run` to return.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.unwrap(),
            None => Ok(()),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The default configuration pointed at `upstream`.
pub fn config_for(upstream: &str) -> Config {
    Config {
        upstream: upstream.parse().unwrap(),
        ..Config::default()
    }
}

/// The configuration the compaction tests share: a small absolute threshold and
/// `strategy`, for a provider at `url`.
pub fn compacting(url: &str, strategy: abridge::strategies::Strategy, threshold: u64) -> Config {
    let mut config = config_for(url);
    config.compaction.threshold_tokens = threshold;
    config.compaction.strategy = strategy;
    config.summary.timeout_ms = 5000;
    config
}

/// A fake provider with default behaviour and abridge in front of it.
pub async fn setup() -> (FakeProvider, Proxy) {
    setup_with(Behavior::default()).await
}

pub async fn setup_with(behavior: Behavior) -> (FakeProvider, Proxy) {
    let provider = FakeProvider::start(behavior).await.unwrap();
    let proxy = Proxy::start(&provider.url()).await;
    (provider, proxy)
}

/// A real HTTP client, as an app would use (no pooling surprises across tests).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// A request sent and its whole answer read, for tests that only need it to happen.
pub trait Fetch {
    async fn fetch(self) -> bytes::Bytes;
}

impl Fetch for reqwest::RequestBuilder {
    async fn fetch(self) -> bytes::Bytes {
        self.send().await.unwrap().bytes().await.unwrap()
    }
}

/// A small chat request body.
pub fn chat_body(stream: bool) -> String {
    format!(
        r#"{{"model":"gpt-4o-mini","messages":[{{"role":"system","content":"Be brief."}},{{"role":"user","content":"Hello there, how are you?"}}],"stream":{stream}}}"#
    )
}

/// Waits until `check` holds, polling, at most `timeout`.
pub async fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}

/// A local address nothing listens on: to connect to and be refused (a dead upstream).
/// Never give it to a process that must listen on it: another process may take the
/// port first (start such a process on port 0, or see [`redis`] for one that cannot).
pub async fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}
