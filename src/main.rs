//! The `abridge` binary: read arguments and configuration, set up logging, bind the
//! listeners and serve until SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use abridge::{AppState, Config, Listeners};
use tokio::net::TcpListener;

const USAGE: &str = "\
abridge — OpenAI-compatible proxy that keeps long conversations inside the context window

USAGE:
    abridge [--config FILE] [--addr-file FILE] [--healthcheck | --check-config]
    abridge replay [--strategy S ...] [--threshold TOKENS] [--prices FILE] [--json] FILE...
                        (abridge replay --help says more)

OPTIONS:
    -c, --config FILE   TOML configuration (see config/abridge.toml for every key)
        --addr-file FILE
                        once both listeners are bound, write their addresses to FILE
                        (replaced atomically), two lines: `listen ADDR` and
                        `admin ADDR`; with port 0 in listen or admin.listen, the
                        port the system chose
        --check-config  validate the file and the environment as startup does, print
                        the effective configuration (secrets masked) and exit: 0 when
                        it is valid, 2 when not (like nginx -t)
        --healthcheck   ask the running abridge's admin listener for /healthz; exit 0
                        when it answers 200 (for container health checks)
    -h, --help          print this help
    -V, --version       print the version and the store backends built in

Every key can also be set from the environment: ABRIDGE_<KEY>, with __ between levels,
e.g. ABRIDGE_UPSTREAM=http://127.0.0.1:8000/v1 or ABRIDGE_ADMIN__TOKEN=...";

/// What the command line asks for.
enum Command {
    Run {
        config: Option<PathBuf>,
        mode: Mode,
        addr_file: Option<PathBuf>,
    },
    Help,
    Version,
}

/// What to do with a loaded configuration.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Serve,
    Healthcheck,
    CheckConfig,
}

fn parse_args() -> Result<Command, lexopt::Error> {
    use lexopt::prelude::*;
    let mut config = None;
    let mut mode = Mode::Serve;
    let mut addr_file = None;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Short('c') | Long("config") => config = Some(PathBuf::from(parser.value()?)),
            Long("addr-file") => addr_file = Some(PathBuf::from(parser.value()?)),
            Long("healthcheck") if mode == Mode::Serve => mode = Mode::Healthcheck,
            Long("check-config") if mode == Mode::Serve => mode = Mode::CheckConfig,
            Long("healthcheck") | Long("check-config") => {
                return Err("--healthcheck and --check-config exclude each other".into());
            }
            Short('h') | Long("help") => return Ok(Command::Help),
            Short('V') | Long("version") => return Ok(Command::Version),
            _ => return Err(arg.unexpected()),
        }
    }
    if addr_file.is_some() && mode != Mode::Serve {
        return Err("--addr-file is for serving, not --healthcheck or --check-config".into());
    }
    Ok(Command::Run {
        config,
        mode,
        addr_file,
    })
}

#[expect(clippy::print_stdout, reason = "--help and --version answer on stdout")]
#[expect(
    clippy::print_stderr,
    reason = "errors before logging is set up go to stderr"
)]
fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == "replay") {
        return replay();
    }
    let (config_path, mode, addr_file) = match parse_args() {
        Ok(Command::Run {
            config,
            mode,
            addr_file,
        }) => (config, mode, addr_file),
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!(
                "abridge {}\nstore backends: {}\nstore TLS: rediss:// (rustls)",
                env!("CARGO_PKG_VERSION"),
                abridge::store::BACKENDS.join(", ")
            );
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
    match mode {
        Mode::CheckConfig => check_config(config),
        Mode::Healthcheck => match check_health(&config) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("abridge: unhealthy: {e}");
                ExitCode::FAILURE
            }
        },
        Mode::Serve => {
            init_logging(&config);
            match runtime() {
                Ok(runtime) => runtime.block_on(serve(config, addr_file.as_deref())),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the async runtime");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `abridge replay …`: its figures on stdout; 2 for bad arguments, 1 when it failed.
#[expect(clippy::print_stdout, reason = "the report is the answer")]
#[expect(clippy::print_stderr, reason = "logging is not set up in this mode")]
fn replay() -> ExitCode {
    let parser = lexopt::Parser::from_args(std::env::args_os().skip(2));
    let options = match abridge::replay::parse_args(parser) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{}", abridge::replay::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("abridge replay: {e}\n\n{}", abridge::replay::USAGE);
            return ExitCode::from(2);
        }
    };
    let result = runtime().map_err(|e| e.to_string()).and_then(|rt| {
        let notify = |line: &str| eprintln!("abridge replay: {line}");
        rt.block_on(abridge::replay::run(options, &notify))
    });
    match result {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("abridge replay: {e}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// `--check-config`: everything startup does short of binding the listeners and
/// connecting anywhere (the upstream's TLS set-up, the store's configuration), then the
/// effective configuration on stdout, secrets masked.
#[expect(
    clippy::print_stdout,
    reason = "the effective configuration is the answer"
)]
#[expect(clippy::print_stderr, reason = "logging is not set up in this mode")]
fn check_config(config: Config) -> ExitCode {
    let shown = match toml::to_string(&config) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("abridge: cannot print the configuration: {e}");
            return ExitCode::FAILURE;
        }
    };
    let built = runtime()
        .map_err(|e| e.to_string())
        .and_then(|rt| rt.block_on(async { AppState::new(config).map_err(|e| e.to_string()) }));
    match built {
        Ok(_) => {
            println!(
                "# abridge {}: configuration OK\n{shown}",
                env!("CARGO_PKG_VERSION")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("abridge: {e}");
            ExitCode::from(2)
        }
    }
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
    use abridge::config::LogFormat;
    use abridge::request_log::Lazy;
    use tracing_subscriber::fmt;
    use tracing_subscriber::prelude::*;
    let filter = config.log.filter.targets();
    // The request span's fields are formatted when a line is written (`request_log`).
    let layer = fmt::layer().with_writer(std::io::stderr);
    match config.log.format {
        LogFormat::Text => tracing_subscriber::registry()
            .with(
                layer
                    .event_format(Lazy(fmt::format()))
                    .with_ansi(config.log.ansi)
                    .with_filter(filter),
            )
            .init(),
        LogFormat::Json => {
            let format = fmt::format()
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(false);
            tracing_subscriber::registry()
                .with(layer.json().event_format(Lazy(format)).with_filter(filter))
                .init()
        }
    }
}

async fn serve(config: Config, addr_file: Option<&Path>) -> ExitCode {
    let Some((proxy, admin, bound)) = bind(&config).await else {
        return ExitCode::FAILURE;
    };
    tracing::info!(
        listen = %bound.listen,
        admin = %bound.admin,
        upstream = %config.upstream,
        "abridge ready: point your SDK's base URL at http://{}/v1",
        bound.listen
    );
    let state = match AppState::new(config) {
        Ok(state) => state,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = addr_file
        && let Err(e) = bound.write(path)
    {
        tracing::error!(path = %path.display(), error = %e, "cannot write the address file (--addr-file)");
        return ExitCode::FAILURE;
    }
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

/// Where the listeners were bound: the configured addresses, with the port the system
/// chose where one asked for port 0.
struct Bound {
    listen: SocketAddr,
    admin: SocketAddr,
}

impl Bound {
    /// `--addr-file`: `listen ADDR` and `admin ADDR` on two lines, written beside `path`
    /// under a temporary name and renamed over it, so a reader sees all of it or none.
    fn write(&self, path: &Path) -> std::io::Result<()> {
        let name = path.file_name().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name")
        })?;
        let mut temp = std::ffi::OsString::from(".");
        temp.push(name);
        temp.push(format!(".{}.tmp", std::process::id()));
        let temp = path.with_file_name(temp);
        let text = format!("listen {}\nadmin {}\n", self.listen, self.admin);
        std::fs::write(&temp, text)?;
        std::fs::rename(&temp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&temp);
        })
    }
}

/// Binds the proxy and the admin listeners; `None` (logged) when either cannot be.
async fn bind(config: &Config) -> Option<(TcpListener, TcpListener, Bound)> {
    let proxy = match TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(listen = %config.listen, error = %e, "cannot bind the proxy listener (listen)");
            return None;
        }
    };
    let admin = match TcpListener::bind(config.admin.listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(listen = %config.admin.listen, error = %e, "cannot bind the admin listener (admin.listen)");
            return None;
        }
    };
    match (proxy.local_addr(), admin.local_addr()) {
        (Ok(listen), Ok(admin_addr)) => Some((
            proxy,
            admin,
            Bound {
                listen,
                admin: admin_addr,
            },
        )),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot read the listeners' bound addresses");
            None
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
