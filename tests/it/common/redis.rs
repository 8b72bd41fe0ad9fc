//! Real Redis for tests: a `redis-server` (or a 3-node Redis Cluster, or a master with a
//! replica and a sentinel) on ephemeral loopback ports, in a temporary directory,
//! without persistence.
//!
//! Each server runs under a tiny `sh` watchdog that holds our end of a pipe: when the
//! test binary exits for any reason, the pipe closes and the watchdog kills the server,
//! so nothing is left running. [`shared`] and [`shared_cluster`] start one per test
//! binary on first use; tests that stop or pause Redis start their own with
//! [`RedisServer::start`]. Each can be TLS-only instead ([`super::redis_tls`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::redis_tls::{self, ServerTls};

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

impl RedisServer {
    /// A standalone server on a free port.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A standalone server on a free port, TLS-only when `tls` is set.
    pub fn start_with(tls: Option<ServerTls>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::spawn(free_port(false), Mode::Standalone, dir, tls)
    }

    /// A cluster-enabled node (its bus port, +10000, is free too).
    fn start_cluster_node(tls: Option<ServerTls>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::spawn(free_port(true), Mode::ClusterNode, dir, tls)
    }

    fn spawn(port: u16, mode: Mode, dir: tempfile::TempDir, tls: Option<ServerTls>) -> Self {
        let server = which("redis-server");
        let mut args: Vec<String> = Vec::new();
        if let Mode::Sentinel(master) = mode {
            // Sentinel rewrites its configuration file, so it lives in the directory.
            let conf = dir.path().join("sentinel.conf");
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
            dir.path().display().to_string(),
            "--logfile".into(),
            dir.path().join("redis.log").display().to_string(),
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
        // Prints the server's pid, then kills it when our end of stdin closes.
        let script = r#"server="$1"; shift; "$server" "$@" & pid=$!; echo "$pid"; read -r _; kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; exit 0"#;
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(&server)
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
        let server = Self {
            port,
            pid,
            watchdog,
            stdin,
            dir,
            mode,
            tls,
        };
        server.wait_ready();
        server
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

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.command(&["PING"]).as_deref() == Ok("PONG") {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        panic!("redis-server on port {} did not start:\n{log}", self.port);
    }

    /// Stops the server (as if it crashed: no goodbye to clients) and waits for it.
    pub fn stop(&mut self) {
        signal(self.pid, "KILL");
        self.stdin.take();
        let _ = self.watchdog.wait();
    }

    /// Starts it again on the same port and data directory.
    pub fn restart(&mut self) {
        self.stop();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        *self = Self::spawn(self.port, self.mode, dir, self.tls);
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
        let replica = RedisServer::spawn(
            free_port(false),
            Mode::Replica(master.port),
            tempfile::tempdir().unwrap(),
            tls,
        );
        let sentinel = RedisServer::spawn(
            free_port(false),
            Mode::Sentinel(master.port),
            tempfile::tempdir().unwrap(),
            tls,
        );
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

/// Sends one command over RESP; the reader is at the start of the reply.
fn send(port: u16, args: &[&str]) -> Result<BufReader<TcpStream>, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let mut request = format!("*{}\r\n", args.len());
    for a in args {
        request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    Ok(BufReader::new(stream))
}

fn read_line(reader: &mut BufReader<TcpStream>) -> Result<String, String> {
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    Ok(line.trim_end().to_owned())
}

/// The body of a bulk string whose header line (`$<len>`) was just read.
fn read_bulk(reader: &mut BufReader<TcpStream>, len: &str) -> Result<String, String> {
    if len == "-1" {
        return Ok(String::new());
    }
    let len: usize = len.parse().map_err(|_| format!("bad length {len}"))?;
    let mut buf = vec![0; len + 2];
    reader.read_exact(&mut buf).map_err(|e| e.to_string())?;
    buf.truncate(len);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Sends one command over RESP and returns a simple reply as text (status, integer or
/// bulk string); `Err` for an error reply, an array reply (see [`command_list`]) or an
/// I/O failure. Enough to check the support itself; store code uses the `redis` crate.
pub fn command(port: u16, args: &[&str]) -> Result<String, String> {
    let mut reader = send(port, args)?;
    let line = read_line(&mut reader)?;
    match line.split_at(1.min(line.len())) {
        ("+", rest) | (":", rest) => Ok(rest.to_owned()),
        ("-", rest) => Err(rest.to_owned()),
        ("$", len) => read_bulk(&mut reader, len),
        _ => Err(format!("unexpected reply {line:?}")),
    }
}

/// Sends one command whose reply is an array of bulk strings (KEYS, HGETALL, ZRANGE…)
/// and returns its elements; a single bulk string comes back as one element. Panics on
/// anything else, so a test cannot mistake a failed call for an empty answer.
pub fn command_list(port: u16, args: &[&str]) -> Vec<String> {
    let mut reader = send(port, args).unwrap();
    let line = read_line(&mut reader).unwrap();
    match line.split_at(1.min(line.len())) {
        ("$", len) => vec![read_bulk(&mut reader, len).unwrap()],
        ("*", n) => (0..n.parse::<usize>().unwrap())
            .map(|_| {
                let header = read_line(&mut reader).unwrap();
                let len = header.strip_prefix('$').expect("an array of bulk strings");
                read_bulk(&mut reader, len).unwrap()
            })
            .collect(),
        _ => panic!("{args:?}: unexpected reply {line:?}"),
    }
}

/// Every key with its contents as text (hash fields and values, sorted-set members, list
/// elements, string values, and the raw DUMP): for checking what the store keeps.
pub fn contents(port: u16) -> Vec<(String, String)> {
    command_list(port, &["KEYS", "*"])
        .into_iter()
        .map(|key| {
            let values = match command(port, &["TYPE", &key]).unwrap().as_str() {
                "hash" => command_list(port, &["HGETALL", &key]).join(" "),
                "zset" => command_list(port, &["ZRANGE", &key, "0", "-1"]).join(" "),
                "list" => command_list(port, &["LRANGE", &key, "0", "-1"]).join(" "),
                _ => command(port, &["GET", &key]).unwrap(),
            };
            let dump = command_list(port, &["DUMP", &key]).join("");
            (key.clone(), format!("{values}\n{dump}"))
        })
        .collect()
}

/// Calls of every Redis command so far, from `INFO commandstats` (without INFO itself,
/// which reading them adds to).
pub fn command_calls(port: u16) -> Vec<(String, u64)> {
    command(port, &["INFO", "commandstats"])
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .filter(|(name, _)| name != "info")
        .collect()
}
