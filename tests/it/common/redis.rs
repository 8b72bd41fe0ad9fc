//! Real Redis for tests: a `redis-server` (or a 3-node Redis Cluster, or a master with a
//! replica and a sentinel) on ephemeral loopback ports, in a temporary directory,
//! without persistence. redis-server cannot bind port 0 and say which it got, so a
//! server is offered a port found free and, should another process take it first, is
//! stopped and offered another (checked by its log and by the pid `INFO` answers with).
//! [`resp`] speaks to a server by hand.
//!
//! Each server runs under a tiny `sh` watchdog that holds our end of a pipe: when the
//! test binary exits for any reason, the pipe closes and the watchdog kills the server,
//! so nothing is left running. [`shared`] and [`shared_cluster`] start one per test
//! binary on first use; tests that stop or pause Redis start their own with
//! [`RedisServer::start`]. Each can be TLS-only instead ([`super::redis_tls`]).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::redis_tls::{self, ServerTls};

mod resp;

pub use resp::{command, command_calls, command_list, contents};

pub struct RedisServer {
    pub port: u16,
    pid: u32,
    watchdog: Child,
    stdin: Option<ChildStdin>,
    dir: tempfile::TempDir,
    mode: Mode,
    /// TLS-only (no plain port) when set.
    pub tls: Option<ServerTls>,
}

/// What a server is started as.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Standalone,
    ClusterNode,
    /// A replica of the server on this port.
    Replica(u16),
    /// A sentinel monitoring the master on this port as [`SENTINEL_MASTER`].
    Sentinel(u16),
}

/// The name the test sentinel monitors its master under.
pub const SENTINEL_MASTER: &str = "abridge-test";

/// How many ports a server is offered before the support gives up.
const ATTEMPTS: usize = 10;

/// What a server that did not get its port says: it cannot listen there (the port, or a
/// cluster node's bus port, is another process's).
const BIND_FAILED: [&str; 2] = ["Address already in use", "Failed listening on port"];

/// A server that did not get its port: why, and the directory, for the next attempt.
struct Refused {
    why: String,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// A standalone server on a free port.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A standalone server on a free port, TLS-only when `tls` is set.
    pub fn start_with(tls: Option<ServerTls>) -> Self {
        Self::launch(None, Mode::Standalone, tls)
    }

    /// A standalone server offered `port` first (the support's own test of a taken one).
    pub fn start_trying(port: u16) -> Self {
        Self::launch(Some(port), Mode::Standalone, None)
    }

    /// A cluster node offered `port` first (its bus port is `port` + 10000).
    pub fn start_cluster_node_trying(port: u16) -> Self {
        Self::launch(Some(port), Mode::ClusterNode, None)
    }

    /// A cluster-enabled node (its bus port, +10000, is free too).
    fn start_cluster_node(tls: Option<ServerTls>) -> Self {
        Self::launch(None, Mode::ClusterNode, tls)
    }

    /// A server of `mode` on the first port it gets: `first`, then free ones. A port found
    /// free can be taken by another process before the server binds it, so a server
    /// that does not get its port is stopped and started on another, [`ATTEMPTS`] times.
    fn launch(first: Option<u16>, mode: Mode, tls: Option<ServerTls>) -> Self {
        let cluster = matches!(mode, Mode::ClusterNode);
        let mut dir = tempfile::tempdir().unwrap();
        let mut refused = Vec::new();
        for attempt in 0..ATTEMPTS {
            let port = match first {
                Some(port) if attempt == 0 => port,
                _ => free_port(cluster),
            };
            match Self::spawn(port, mode, dir, tls) {
                Ok(server) => return server,
                Err(r) => {
                    refused.push(format!("port {port}: {}", r.why));
                    dir = r.dir;
                }
            }
        }
        panic!(
            "redis-server ({mode:?}) got none of {ATTEMPTS} ports:\n{}",
            refused.join("\n")
        );
    }

    /// Starts a server on `port` and waits until it answers as itself; `Err` (the server
    /// stopped) when the port turned out to be another process's.
    fn spawn(
        port: u16,
        mode: Mode,
        dir: tempfile::TempDir,
        tls: Option<ServerTls>,
    ) -> Result<Self, Refused> {
        let args = server_args(port, mode, dir.path(), tls);
        // What an earlier life in the same directory logged is not this one's.
        let log_from = std::fs::metadata(dir.path().join("redis.log")).map_or(0, |m| m.len());
        // Prints the server's pid, then kills it when our end of stdin closes.
        let script = r#"server="$1"; shift; "$server" "$@" & pid=$!; echo "$pid"; read -r _; kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; exit 0"#;
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(which("redis-server"))
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server watchdog");
        let stdin = watchdog.stdin.take();
        let mut line = String::new();
        BufReader::new(watchdog.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid: u32 = line.trim().parse().expect("redis-server pid");
        let mut server = Self {
            port,
            pid,
            watchdog,
            stdin,
            dir,
            mode,
            tls,
        };
        match server.wait_ready(log_from) {
            Ok(()) => Ok(server),
            Err(why) => {
                server.stop();
                let dir = std::mem::replace(&mut server.dir, tempfile::tempdir().unwrap());
                Err(Refused { why, dir })
            }
        }
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// One command, as [`command`] sends it (over TLS to a TLS server).
    pub fn command(&self, args: &[&str]) -> Result<String, String> {
        match self.tls {
            Some(_) => redis_tls::command(self.port, args),
            None => command(self.port, args),
        }
    }

    /// A client of this server (trusting the test CA, for a TLS server).
    pub fn client(&self) -> redis::Client {
        match self.tls {
            Some(_) => redis_tls::client(self.port),
            None => redis::Client::open(self.url()).unwrap(),
        }
    }

    pub fn log_path(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until the server answers as itself (`INFO server` gives its pid). `Err`
    /// when it did not get its port: its log says so, or another process answers there.
    /// Panics when it exits for another reason or does not answer within 10 s.
    fn wait_ready(&self, log_from: u64) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let gone = exited(self.pid);
            let log = self.log_since(log_from);
            if let Some(line) = log
                .lines()
                .find(|l| BIND_FAILED.iter().any(|m| l.contains(m)))
            {
                return Err(line.to_owned());
            }
            assert!(!gone, "redis-server on port {} exited:\n{log}", self.port);
            if let Ok(info) = self.command(&["INFO", "server"]) {
                let answering = info
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("process_id:"))
                    .and_then(|p| p.parse::<u32>().ok());
                return match answering {
                    Some(pid) if pid == self.pid => Ok(()),
                    other => Err(format!(
                        "process {other:?} answers there, not ours ({})",
                        self.pid
                    )),
                };
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not start:\n{log}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the server logged from byte `from` of its log on.
    fn log_since(&self, from: u64) -> String {
        let log = std::fs::read(self.dir.path().join("redis.log")).unwrap_or_default();
        let from = usize::try_from(from).unwrap_or(usize::MAX).min(log.len());
        String::from_utf8_lossy(&log[from..]).into_owned()
    }

    /// Stops the server (as if it crashed: no goodbye to clients) and waits for it.
    pub fn stop(&mut self) {
        signal(self.pid, "KILL");
        self.stdin.take();
        let _ = self.watchdog.wait();
    }

    /// Starts it again on the same port and data directory. The port was free a moment
    /// ago, but another process may have taken it meanwhile (an outgoing connection's
    /// local port, soon closed): tried again for up to 10 s.
    pub fn restart(&mut self) {
        self.stop();
        let mut dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Self::spawn(self.port, self.mode, dir, self.tls) {
                Ok(server) => {
                    *self = server;
                    return;
                }
                Err(r) => {
                    assert!(
                        Instant::now() < deadline,
                        "port {} stayed taken: {}",
                        self.port,
                        r.why
                    );
                    dir = r.dir;
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// Starts it again on the same port and data directory, as a replica of `master`.
    pub fn restart_as_replica_of(&mut self, master: u16) {
        self.mode = Mode::Replica(master);
        self.restart();
    }

    /// SIGSTOP: the server keeps its sockets open but answers nothing.
    pub fn pause(&self) {
        signal(self.pid, "STOP");
    }

    pub fn resume(&self) {
        signal(self.pid, "CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume();
        self.stdin.take();
        let _ = self.watchdog.wait();
    }
}

/// A 3-node Redis Cluster (masters only) on free ports.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A cluster of TLS-only nodes (TLS on the cluster bus too) when `tls` is set.
    pub fn start_with(tls: Option<ServerTls>) -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_cluster_node(tls))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new(which("redis-cli"))
            .args(tls.map(|_| redis_tls::cli_args()).unwrap_or_default())
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &nodes {
            loop {
                let info = node.command(&["CLUSTER", "INFO"]).unwrap_or_default();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "cluster did not become ready: {info}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Self { nodes }
    }

    /// Node URLs, as a cluster client takes them.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

/// A master, a replica of it and one sentinel watching them (quorum 1, the master down
/// after 1 s without answers), so a killed master is replaced by its replica within a
/// few seconds.
pub struct RedisSentinel {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinel: RedisServer,
}

impl RedisSentinel {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// All three TLS-only (replication and the sentinel's connections too) when `tls`
    /// is set.
    pub fn start_with(tls: Option<ServerTls>) -> Self {
        let master = RedisServer::start_with(tls);
        let replica = RedisServer::launch(None, Mode::Replica(master.port), tls);
        let sentinel = RedisServer::launch(None, Mode::Sentinel(master.port), tls);
        let this = Self {
            master,
            replica,
            sentinel,
        };
        // Ready when the master streams to the replica (until it is "online" the master
        // holds writes back) and the sentinel knows the replica (it can fail over).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let synced = (this.master)
                .command(&["INFO", "replication"])
                .unwrap_or_default()
                .contains("state=online");
            let known = this.sentinel_replicas() > 0;
            if synced && known {
                return this;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinel setup did not become ready"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The sentinel's URL, as abridge's `store.sentinel.nodes` takes it.
    pub fn url(&self) -> String {
        self.sentinel.url()
    }

    /// The port of the master according to the sentinel.
    pub fn master_port(&self) -> Option<u16> {
        let mut con = self.sentinel.client().get_connection().ok()?;
        let addr: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(SENTINEL_MASTER)
            .query(&mut con)
            .ok()?;
        addr?.1.parse().ok()
    }

    /// `SENTINEL FAILOVER`: promotes the replica while the master runs (a switchover).
    pub fn switchover(&self) -> Result<(), String> {
        let mut con = (self.sentinel.client().get_connection()).map_err(|e| e.to_string())?;
        redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(SENTINEL_MASTER)
            .query::<()>(&mut con)
            .map_err(|e| e.to_string())
    }

    fn sentinel_replicas(&self) -> usize {
        let Ok(mut con) = self.sentinel.client().get_connection() else {
            return 0;
        };
        redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(SENTINEL_MASTER)
            .query::<Vec<redis::Value>>(&mut con)
            .map_or(0, |r| r.len())
    }
}

/// The server's command line: `mode` on `port`, in `dir`, without persistence.
fn server_args(port: u16, mode: Mode, dir: &Path, tls: Option<ServerTls>) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    if let Mode::Sentinel(master) = mode {
        // Sentinel rewrites its configuration file, so it lives in the directory.
        let conf = dir.join("sentinel.conf");
        if !conf.exists() {
            std::fs::write(
                &conf,
                format!(
                    "sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master} 1\n\
                     sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                     sentinel failover-timeout {SENTINEL_MASTER} 5000\n"
                ),
            )
            .unwrap();
        }
        args.extend([conf.display().to_string(), "--sentinel".into()]);
    }
    match tls {
        Some(tls) => args.extend(redis_tls::server_args(tls, port)),
        None => args.extend(["--port".into(), port.to_string()]),
    }
    if tls.is_some() && matches!(mode, Mode::ClusterNode) {
        args.extend(["--tls-cluster".into(), "yes".into()]);
    }
    args.extend([
        "--bind".into(),
        "127.0.0.1".into(),
        "--dir".into(),
        dir.display().to_string(),
        "--logfile".into(),
        dir.join("redis.log").display().to_string(),
    ]);
    if !matches!(mode, Mode::Sentinel(_)) {
        // No persistence; a replica's first sync starts at once (not after 5 s).
        args.extend(
            [
                "--save",
                "",
                "--appendonly",
                "no",
                "--repl-diskless-sync-delay",
                "0",
            ]
            .map(String::from),
        );
    }
    if let Mode::Replica(master) = mode {
        args.extend(["--replicaof".into(), "127.0.0.1".into(), master.to_string()]);
    }
    if let Mode::ClusterNode = mode {
        args.extend(
            [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ]
            .map(String::from),
        );
    }
    args
}

/// Whether the process is gone: no longer there, or a zombie its parent (the
/// watchdog, waiting on its stdin) has not reaped.
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Sends a signal; a process that is already gone is fine.
fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// One standalone Redis per test binary, started on first use.
pub fn shared() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// One Redis Cluster per test binary, started on first use.
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

/// One TLS-only standalone Redis per test binary (no client certificate needed).
pub fn shared_tls() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    let tls = ServerTls {
        auth_clients: false,
    };
    SERVER.get_or_init(|| RedisServer::start_with(Some(tls)))
}

/// One TLS-only Redis Cluster per test binary (no client certificate needed).
pub fn shared_tls_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    let tls = ServerTls {
        auth_clients: false,
    };
    CLUSTER.get_or_init(|| RedisCluster::start_with(Some(tls)))
}

fn which(program: &str) -> String {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|p| p.is_file());
    match found {
        Some(p) => p.display().to_string(),
        None => panic!(
            "{program} not found: run scripts/test (it installs it) or `apt-get install redis-server redis-tools`"
        ),
    }
}

/// A free loopback port; for cluster nodes, one whose bus port (+10000) is free too.
fn free_port(cluster: bool) -> u16 {
    for _ in 0..1000 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !cluster {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}
