//! The `abridge` binary: read arguments and configuration, set up logging, bind the
//! listeners and serve until SIGTERM/SIGINT.

use std::path::PathBuf;
use std::process::ExitCode;

use abridge::{AppState, Config, Listeners};
use tokio::net::TcpListener;

const USAGE: &str = "\
abridge — OpenAI-compatible proxy that keeps long conversations inside the context window

USAGE:
    abridge [--config FILE] [--healthcheck]

OPTIONS:
    -c, --config FILE   TOML configuration (see config/abridge.toml for every key)
        --healthcheck   ask the running abridge's admin listener for /healthz; exit 0
                        when it answers 200 (for container health checks)
    -h, --help          print this help
    -V, --version       print the version

Every key can also be set from the environment: ABRIDGE_<KEY>, with __ between levels,
e.g. ABRIDGE_UPSTREAM=http://127.0.0.1:8000/v1 or ABRIDGE_ADMIN__TOKEN=...";

enum Command {
    Run {
        config: Option<PathBuf>,
        healthcheck: bool,
    },
    Help,
    Version,
}

fn parse_args() -> Result<Command, lexopt::Error> {
    use lexopt::prelude::*;
    let mut config = None;
    let mut healthcheck = false;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Short('c') | Long("config") => config = Some(PathBuf::from(parser.value()?)),
            Long("healthcheck") => healthcheck = true,
            Short('h') | Long("help") => return Ok(Command::Help),
            Short('V') | Long("version") => return Ok(Command::Version),
            _ => return Err(arg.unexpected()),
        }
    }
    Ok(Command::Run {
        config,
        healthcheck,
    })
}

#[expect(clippy::print_stdout, reason = "--help and --version answer on stdout")]
#[expect(
    clippy::print_stderr,
    reason = "errors before logging is set up go to stderr"
)]
fn main() -> ExitCode {
    let (config_path, healthcheck) = match parse_args() {
        Ok(Command::Run {
            config,
            healthcheck,
        }) => (config, healthcheck),
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("abridge {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("abridge: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let config = match Config::load(config_path.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("abridge: {e}");
            return ExitCode::from(2);
        }
    };
    if healthcheck {
        return match check_health(&config) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("abridge: unhealthy: {e}");
                ExitCode::FAILURE
            }
        };
    }
    init_logging(&config);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve(config))
}

/// `GET /healthz` on the admin listener of a running abridge (same configuration).
fn check_health(config: &Config) -> Result<(), String> {
    use std::io::{Read, Write};
    use std::time::Duration;
    let mut addr = config.admin.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let timeout = Duration::from_secs(3);
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{addr}: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).map_err(|e| e.to_string())?;
    match &head[9..12] {
        b"200" => Ok(()),
        status => Err(format!(
            "{addr} answered {}",
            String::from_utf8_lossy(status)
        )),
    }
}

fn init_logging(config: &Config) {
    use tracing_subscriber::prelude::*;
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(config.log.ansi)
                .with_filter(config.log.filter.targets()),
        )
        .init();
}

async fn serve(config: Config) -> ExitCode {
    let proxy = match TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(listen = %config.listen, error = %e, "cannot bind the proxy listener (listen)");
            return ExitCode::FAILURE;
        }
    };
    let admin = match TcpListener::bind(config.admin.listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(listen = %config.admin.listen, error = %e, "cannot bind the admin listener (admin.listen)");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        listen = %config.listen,
        admin = %config.admin.listen,
        upstream = %config.upstream,
        "abridge ready: point your SDK's base URL at http://{}/v1",
        config.listen
    );
    let state = match AppState::new(config) {
        Ok(state) => state,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    // Agree on the identity secret now rather than on the first request; if the store
    // is down this is retried per request, which go on uncompacted meanwhile.
    let identity = match (&state.config().identity.secret, state.identity_key().await) {
        (Some(_), _) => "configured",
        (None, Some(_)) => "shared through the store",
        (None, None) => "pending: store unavailable",
    };
    tracing::info!(store = state.store().backend_name(), identity, "state");
    match abridge::run(Listeners { proxy, admin }, state, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received"),
        () = term => tracing::info!("SIGTERM received"),
    }
}
