//! `fake-provider`: the fake LLM provider (OpenAI chat completions and Responses,
//! Anthropic Messages) as a standalone server, for trying abridge offline:
//! `cargo run -p fake-provider -- --listen 127.0.0.1:8000`, then
//! `ABRIDGE_UPSTREAM=http://127.0.0.1:8000/v1 cargo run --release`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::serve::ListenerExt;
use fake_provider::{Behavior, Shared, nodelay, router};

const USAGE: &str = "\
fake-provider — an offline LLM provider (OpenAI chat completions and Responses,
Anthropic Messages) for trying and testing abridge

USAGE:
    fake-provider [--listen ADDR] [--window TOKENS] [--overflow FAMILY] [--delay-ms MS] [--words N] [--bench]

OPTIONS:
    --listen ADDR      address to serve on (default 127.0.0.1:8000)
    --window TOKENS    context window: larger prompts get context_length_exceeded
    --overflow FAMILY  whose overflow answer and window endpoint: openai (default),
                       llama-server, vllm, vllm-renderer, ollama, lm-studio, openrouter,
                       gemini, mistral, groq, together, fireworks
    --delay-ms MS      pause between streamed events (default 0)
    --words N          words per reply (default 12)
    --bench            load-benchmark mode: record no requests (flat memory) and answer a
                       chat body seen recently from a cache (the fake's own CPU stays
                       small); x-fake-* request headers bypass the cache";

#[expect(clippy::print_stdout, reason = "--help answers on stdout")]
#[expect(
    clippy::print_stderr,
    reason = "argument errors before logging is set up"
)]
fn main() -> ExitCode {
    let mut listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 8000));
    let mut behavior = Behavior::default();
    let mut bench = false;
    let parsed = (|| -> Result<bool, lexopt::Error> {
        use lexopt::prelude::*;
        let mut parser = lexopt::Parser::from_env();
        while let Some(arg) = parser.next()? {
            match arg {
                Long("listen") => listen = parser.value()?.parse()?,
                Long("window") => behavior.context_window = Some(parser.value()?.parse()?),
                Long("overflow") => {
                    let name: String = parser.value()?.parse()?;
                    behavior.overflow = fake_provider::overflow::Family::from_name(&name)
                        .ok_or_else(|| format!("--overflow: no family named {name}"))?;
                }
                Long("delay-ms") => {
                    behavior.chunk_delay = Duration::from_millis(parser.value()?.parse()?)
                }
                Long("words") => behavior.reply_words = parser.value()?.parse()?,
                Long("bench") => bench = true,
                Short('h') | Long("help") => return Ok(false),
                _ => return Err(arg.unexpected()),
            }
        }
        Ok(true)
    })();
    match parsed {
        Ok(true) => {}
        Ok(false) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("fake-provider: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        tracing::error!("cannot start the runtime");
        return ExitCode::FAILURE;
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(%listen, error = %e, "cannot bind");
                return ExitCode::FAILURE;
            }
        };
        // The bound address: with port 0 the one the system chose.
        let bound = listener.local_addr().unwrap_or(listen);
        tracing::info!("fake provider on http://{bound}/v1");
        let shared = if bench {
            Shared::for_bench(behavior)
        } else {
            Shared::new(behavior)
        };
        let app = router(shared);
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        match axum::serve(listener.tap_io(nodelay), app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "server failed");
                ExitCode::FAILURE
            }
        }
    })
}
