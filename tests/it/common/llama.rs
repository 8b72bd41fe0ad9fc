//! A real OpenAI-compatible provider for the tests that need one: llama.cpp's
//! `llama-server` with SmolLM2-135M, built and fetched by `scripts/setup-llama` (cached
//! in target/llama, or `ABRIDGE_LLAMA_DIR`), on a port it chose itself.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::client;

pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// SmolLM2-135M's training context: llama-server caps a slot's context at it unless
/// told the model's is larger ([`LlamaServer::start`] does, for a larger window).
const TRAINED_WINDOW: u64 = 8192;

pub fn llama_dir() -> PathBuf {
    std::env::var_os("ABRIDGE_LLAMA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/llama"))
}

/// `llama-server` on a port it chose itself, killed when dropped.
pub struct LlamaServer {
    child: tokio::process::Child,
    /// Its base URL, with `/v1`.
    pub url: String,
}

impl LlamaServer {
    /// Served with a context of `window` tokens and `extra` arguments, on port 0: the
    /// port it bound is read from its log, so no other process can take it first. A
    /// window over the model's training context is one slot of that size (the model's
    /// `context_length` overridden: the answers degrade, the serving does not).
    pub async fn start(window: u64, extra: &[&str]) -> Self {
        let dir = llama_dir();
        let (binary, model) = (
            dir.join("bin/llama-server"),
            dir.join("models").join(MODEL_FILE),
        );
        assert!(
            binary.exists() && model.exists(),
            "run scripts/setup-llama (scripts/test does) to build llama-server"
        );
        let mut command = tokio::process::Command::new(binary);
        command
            .arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", "0"])
            // One thread for generation, two for the prompt: stable timings on 2 cores.
            .args([
                "-c",
                &window.to_string(),
                "-t",
                "1",
                "-tb",
                "2",
                "--no-webui",
            ]);
        if window > TRAINED_WINDOW {
            let trained = format!("llama.context_length=int:{window}");
            command.args(["-np", "1", "--override-kv", &trained]);
        }
        let mut child = command
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (sender, mut lines) = tokio::sync::mpsc::unbounded_channel();
        forward(child.stdout.take().unwrap(), sender.clone());
        forward(child.stderr.take().unwrap(), sender);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = String::new();
        let port = loop {
            match tokio::time::timeout_at(deadline.into(), lines.recv()).await {
                Ok(Some(line)) => match listening_port(&line) {
                    Some(port) => break port,
                    None => seen.push_str(&(line + "\n")),
                },
                Ok(None) => panic!("llama-server exited:\n{seen}"),
                Err(_) => panic!("llama-server named no port within 60 s:\n{seen}"),
            }
        };
        wait_healthy(port, deadline).await;
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/v1"),
        }
    }
}

async fn wait_healthy(port: u16, deadline: Instant) {
    let health = format!("http://127.0.0.1:{port}/health");
    loop {
        if client()
            .get(&health)
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "llama-server did not become healthy"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Sends `pipe`'s lines to `lines` until it closes; reading on after nobody listens
/// keeps the server from blocking on a full pipe.
fn forward(
    pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    lines: tokio::sync::mpsc::UnboundedSender<String>,
) {
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut reader = tokio::io::BufReader::new(pipe).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            let _ = lines.send(line);
        }
    });
}

/// The port in llama-server's line saying it listens: `HTTP server is listening,
/// hostname: 127.0.0.1, port: 41234, ...` (its versions all print it once bound, the
/// port chosen for port 0), or `server is listening on http://127.0.0.1:41234 - ...`.
pub fn listening_port(line: &str) -> Option<u16> {
    if !line.contains("listening") {
        return None;
    }
    let (_, rest) = line
        .split_once("port: ")
        .or_else(|| line.split_once("http://127.0.0.1:"))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|&port| port != 0)
}
