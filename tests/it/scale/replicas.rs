//! The moving parts of the scale-out run: the `abridge` processes (started, killed,
//! restarted; each life on ports it chose itself, so a restarted replica is reached at
//! new addresses, as a rescheduled container would be) and the clients that drive the
//! conversations through them round-robin, retrying on the next replica as a load
//! balancer would.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::common::binary::{Binary, Launch};

use super::{MODEL, REPLICAS, TURNS};

/// One of the `abridge` processes, through its lives.
pub(super) struct Replica {
    pub(super) index: usize,
    pub(super) env: Vec<(String, String)>,
    /// The running process, with the addresses it bound; `None` while killed.
    pub(super) binary: Option<Binary>,
    /// 1 for the first process, 2 after a restart.
    pub(super) life: usize,
    /// stderr of every life, each line tagged with replica and life.
    pub(super) logs: Arc<Mutex<String>>,
}

impl Replica {
    pub(super) fn new(index: usize, env: Vec<(String, String)>) -> Self {
        Self {
            index,
            env,
            binary: None,
            life: 0,
            logs: Arc::default(),
        }
    }

    /// The summariser key of a life: the fake provider records it, so every summary
    /// call says which process made it.
    pub(super) fn summary_key(index: usize, life: usize) -> String {
        format!("summary-r{index}-life{life}")
    }

    /// Starts its next life and waits until it has bound its listeners.
    pub(super) async fn start(&mut self) {
        self.life += 1;
        let mut env = self.env.clone();
        env.push((
            "ABRIDGE_SUMMARY__API_KEY".to_owned(),
            Self::summary_key(self.index, self.life),
        ));
        let mut launch = Launch::new(env!("CARGO_BIN_EXE_abridge"), env);
        launch.logs = self.logs.clone();
        launch.tag = format!("[r{} life{}] ", self.index, self.life);
        self.binary = Some(launch.start().await);
    }

    /// Where the load balancer sends this replica's share now: the current life's
    /// proxy listener.
    pub(super) fn route(&self) -> Route {
        let binary = self.binary.as_ref().expect("a running replica");
        Route {
            url: format!("http://{}/v1/chat/completions", binary.listen),
            life: self.life,
            down: false,
        }
    }

    /// Waits until the current life answers `/healthz` (it has agreed on the identity
    /// secret and serves).
    pub(super) async fn wait_ready(&self) {
        let admin = self.binary.as_ref().expect("a running replica").admin;
        let url = format!("http://{admin}/healthz");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = reqwest::get(&url).await
                && r.status() == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "replica {} did not become healthy:\n{}",
                self.index,
                self.logs.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: no drain, no goodbye; in-flight requests on it are lost to their clients.
    pub(super) fn kill(&mut self) {
        if let Some(mut binary) = self.binary.take() {
            binary.kill();
        }
    }
}

/// A replica as the load balancer knows it: the address of its current life, and
/// whether it is known to be down (killed, or restarted but not yet ready).
pub(super) struct Route {
    pub(super) url: String,
    pub(super) life: usize,
    pub(super) down: bool,
}

/// One request a client got an HTTP answer to.
pub(super) struct Served {
    pub(super) conv: usize,
    pub(super) turn: usize,
    pub(super) attempt: usize,
    pub(super) replica: usize,
    pub(super) life: usize,
    pub(super) status: u16,
    pub(super) compacted: bool,
    pub(super) conversation: Option<String>,
    pub(super) note: Option<String>,
    pub(super) sent: String,
}

/// A request that failed below HTTP (refused, reset, cut short).
pub(super) struct Failure {
    pub(super) replica: usize,
    /// The replica was being killed, dead or not yet back when the request was sent or
    /// when it failed, or the life it was sent to has been replaced since.
    pub(super) during_outage: bool,
    pub(super) error: String,
}

/// What the conversation tasks share.
pub(super) struct Clients {
    pub(super) http: reqwest::Client,
    /// Per replica; a restart gives it a new address.
    pub(super) routes: Vec<Mutex<Route>>,
    pub(super) in_flight: Semaphore,
    pub(super) answered: AtomicUsize,
    pub(super) served: Mutex<Vec<Served>>,
    pub(super) failures: Mutex<Vec<Failure>>,
}

impl Clients {
    /// Sends one turn to its replica (round-robin by conversation and turn); on a failure
    /// below HTTP, to the next one, as a load balancer would.
    pub(super) async fn send(&self, conv: usize, turn: usize, body: String) -> Value {
        for attempt in 0..2 * REPLICAS {
            let replica = (conv + turn + attempt) % REPLICAS;
            let (url, life, down) = {
                let route = self.routes[replica].lock().unwrap();
                (route.url.clone(), route.life, route.down)
            };
            let _permit = self.in_flight.acquire().await.unwrap();
            let result = async {
                let response = self
                    .http
                    .post(&url)
                    .header("authorization", format!("Bearer sk-scale-{conv}"))
                    .header("content-type", "application/json")
                    .header("x-test-tag", format!("{conv}/{turn}/{attempt}"))
                    .body(body.clone())
                    .send()
                    .await?;
                let headers = response.headers().clone();
                let status = response.status().as_u16();
                let bytes = response.bytes().await?;
                Ok::<_, reqwest::Error>((status, headers, bytes))
            }
            .await;
            match result {
                Ok((status, headers, bytes)) => {
                    let header =
                        |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
                    self.served.lock().unwrap().push(Served {
                        conv,
                        turn,
                        attempt,
                        replica,
                        life,
                        status,
                        compacted: header("x-abridge-compacted").as_deref() == Some("true"),
                        conversation: header("x-abridge-conversation"),
                        note: header("x-abridge-note"),
                        sent: body,
                    });
                    self.answered.fetch_add(1, Ordering::SeqCst);
                    let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                    return answer["choices"][0]["message"].clone();
                }
                Err(e) => {
                    let now = self.routes[replica].lock().unwrap();
                    let during_outage = down || now.down || now.life != life;
                    drop(now);
                    self.failures.lock().unwrap().push(Failure {
                        replica,
                        during_outage,
                        error: format!("{e:?}"),
                    });
                }
            }
        }
        panic!("conversation {conv} turn {turn}: no replica answered");
    }
}

/// A user turn: the conversation's marker, then prose heavy enough that a conversation
/// crosses the threshold in a few turns (about 600 tokens a turn).
pub(super) fn user_message(conv: usize, turn: usize) -> Value {
    json!({"role": "user", "content": format!(
        "[sc-{conv:03}] Turn {turn}: {}",
        "Please review the next part of the design carefully and keep every constraint we agreed on earlier. "
            .repeat(24)
    )})
}

/// Drives one conversation turn by turn, resending the whole history each time.
pub(super) async fn converse(clients: Arc<Clients>, conv: usize) {
    let mut messages = vec![json!({"role": "system", "content": format!(
        "You are a patient design reviewer for project number {conv}. Answer briefly."
    )})];
    for turn in 1..=TURNS {
        messages.push(user_message(conv, turn));
        let body = json!({"model": MODEL, "messages": messages}).to_string();
        let reply = clients.send(conv, turn, body).await;
        assert_eq!(
            reply["role"], "assistant",
            "conversation {conv} turn {turn}"
        );
        messages.push(reply);
    }
}
