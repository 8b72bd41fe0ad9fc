//! abridge as a child process (this build's binary, or the release one): started with
//! both listeners on `127.0.0.1:0` and `--addr-file`, so no port is picked before the
//! process binds it, and ready once it has written the addresses it got. Its stderr is
//! captured; it is killed when dropped.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running abridge and the addresses it bound.
pub struct Binary {
    child: Child,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    logs: Arc<Mutex<String>>,
    /// Holds the address file.
    _dir: tempfile::TempDir,
}

/// How to start one: the environment starts empty.
pub struct Launch<'a> {
    pub program: &'a Path,
    pub env: Vec<(String, String)>,
    /// Where its stderr lines go, each after `tag` (several lives can share one log).
    pub logs: Arc<Mutex<String>>,
    pub tag: String,
    /// How long it may take to write its addresses (a debug build on a busy machine).
    pub timeout: Duration,
}

impl<'a> Launch<'a> {
    /// `program` with `env`, its own log, 30 s to start.
    pub fn new<K: AsRef<str>, V: AsRef<str>>(
        program: &'a (impl AsRef<OsStr> + ?Sized),
        env: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            program: Path::new(program),
            env: env
                .into_iter()
                .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
                .collect(),
            logs: Arc::default(),
            tag: String::new(),
            timeout: Duration::from_secs(30),
        }
    }

    /// Spawns it and waits until it has written its addresses; panics with its log if
    /// it exits first or takes longer than `timeout`.
    pub async fn start(self) -> Binary {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("addrs");
        let mut child = Command::new(self.program)
            .arg("--addr-file")
            .arg(&file)
            .env_clear()
            .envs(self.env)
            .env("ABRIDGE_LISTEN", "127.0.0.1:0")
            .env("ABRIDGE_ADMIN__LISTEN", "127.0.0.1:0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", self.program.display()));
        let pipe = child.stderr.take().unwrap();
        let (sink, tag) = (self.logs.clone(), self.tag);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut logs = sink.lock().unwrap();
                logs.push_str(&tag);
                logs.push_str(&line);
                logs.push('\n');
            }
        });
        let deadline = Instant::now() + self.timeout;
        let (listen, admin) = loop {
            if let Some(bound) = std::fs::read_to_string(&file).ok().and_then(parse) {
                break bound;
            }
            if let Some(status) = child.try_wait().unwrap() {
                // Let the reader thread take the last lines.
                std::thread::sleep(Duration::from_millis(50));
                panic!(
                    "abridge exited ({status}) before it was ready:\n{}",
                    self.logs.lock().unwrap()
                );
            }
            assert!(
                Instant::now() < deadline,
                "abridge wrote no addresses within {:?}:\n{}",
                self.timeout,
                self.logs.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Binary {
            child,
            listen,
            admin,
            logs: self.logs,
            _dir: dir,
        }
    }
}

/// The two lines of an address file: `listen ADDR` and `admin ADDR`.
pub fn parse(text: String) -> Option<(SocketAddr, SocketAddr)> {
    let mut lines = text.lines();
    let listen = lines.next()?.strip_prefix("listen ")?.parse().ok()?;
    let admin = lines.next()?.strip_prefix("admin ")?.parse().ok()?;
    Some((listen, admin))
}

impl Binary {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends signal `name` (`TERM`, `KILL`…) with `kill`.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for exit, at most `timeout`; `None` if still running.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Let the reader thread take the last lines.
                std::thread::sleep(Duration::from_millis(50));
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// SIGKILL, and waits for it to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its stderr so far (with every other life sharing the log).
    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        self.kill();
    }
}
