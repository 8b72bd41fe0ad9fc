//! The command line an operator scripts against: `--version`; `--check-config`,
//! which validates the file and environment as startup does, prints the effective
//! configuration with secrets masked and exits 0 or 2; and `--addr-file`, which tells
//! where listeners on port 0 were bound.

use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use fake_provider::{Behavior, FakeProvider};

use crate::common::{chat_body, client};

fn abridge(args: &[&str], env: &[(&str, &str)], file: Option<&str>) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_abridge"));
    command.args(args).env_clear().envs(env.iter().copied());
    if let Some(text) = file {
        let path = dir.path().join("abridge.toml");
        std::fs::write(&path, text).unwrap();
        command.arg("--config").arg(path);
    }
    command.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn version_names_the_store_backends() {
    let out = abridge(&["--version"], &[], None);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with(&format!("abridge {}\n", env!("CARGO_PKG_VERSION"))),
        "{stdout}"
    );
    for backend in abridge::store::BACKENDS {
        assert!(stdout.contains(backend), "{stdout}");
    }
    assert!(stdout.contains("rediss://"), "{stdout}");
}

#[test]
fn check_config_prints_the_effective_configuration_with_secrets_masked() {
    let file = "upstream = \"http://127.0.0.1:9/v1\"\n\
                [admin]\ntoken = \"adm1n-token-0123456789\"\n\
                [summary]\nupstream = \"http://127.0.0.1:9/v1\"\nmodel = \"gpt-4o-mini\"\napi_key = \"sk-summary-Secret77\"\n";
    let env = [
        (
            "ABRIDGE_STORE__REDIS_URL",
            "rediss://default:pa55-Secret@cache.example:6380/0",
        ),
        ("ABRIDGE_IDENTITY__SECRET", "identity-Secret-99"),
        ("ABRIDGE_COMPACTION__STRATEGY", "structured"),
    ];
    let out = abridge(&["--check-config"], &env, Some(file));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let shown: toml::Table = toml::from_str(&stdout).unwrap_or_else(|e| panic!("{e}\n{stdout}"));
    // The file and the environment both took effect; defaults fill the rest.
    assert_eq!(shown["upstream"].as_str(), Some("http://127.0.0.1:9/v1"));
    assert_eq!(shown["compaction"]["strategy"].as_str(), Some("structured"));
    assert_eq!(shown["listen"].as_str(), Some("127.0.0.1:8080"));
    // Where Redis is stays visible; what opens it does not.
    assert_eq!(
        shown["store"]["redis_url"].as_str(),
        Some("rediss://default:*****@cache.example:6380/0")
    );
    assert_eq!(shown["admin"]["token"].as_str(), Some("*****"));
    for secret in ["adm1n-token", "Secret77", "pa55-Secret", "identity-Secret"] {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "{secret} shown:\n{stdout}"
        );
    }
}

#[test]
fn check_config_exits_2_naming_what_is_wrong() {
    // A key that does not exist, from the file.
    let out = abridge(
        &["--check-config"],
        &[],
        Some("[timeouts]\nconect_ms = 5\n"),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("timeouts.conect_ms"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        out.stdout.is_empty(),
        "nothing printed as effective: {}",
        text(&out.stdout)
    );
    // Valid TOML and types, refused by what startup builds from it (the store).
    let out = abridge(
        &["--check-config"],
        &[("ABRIDGE_STORE__REDIS_URL", "notaurl")],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("store.redis_url"),
        "{}",
        text(&out.stderr)
    );
    // Modes exclude each other; an address file is for serving only.
    let out = abridge(&["--check-config", "--healthcheck"], &[], None);
    assert_eq!(out.status.code(), Some(2));
    let out = abridge(&["--check-config", "--addr-file", "addrs"], &[], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--addr-file"));
}

/// Both listeners on port 0: `--addr-file` names the ports the system chose, in its two
/// lines, and there the proxy and the admin API answer (each only its own routes); the
/// ready line names them too.
#[tokio::test]
async fn on_port_0_the_addr_file_tells_where_each_listener_answers() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("abridge.toml");
    let toml = format!(
        "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\n",
        provider.url()
    );
    std::fs::write(&config, toml).unwrap();
    let file = dir.path().join("addrs");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_abridge"))
        .arg("--config")
        .arg(&config)
        .arg("--addr-file")
        .arg(&file)
        .env_clear()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !file.exists() {
        assert!(child.try_wait().unwrap().is_none(), "abridge exited");
        assert!(Instant::now() < deadline, "no address file");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let written = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = written.lines().collect();
    let [listen, admin] = lines[..] else {
        panic!("two lines: {written:?}")
    };
    let listen: SocketAddr = listen.strip_prefix("listen ").unwrap().parse().unwrap();
    let admin: SocketAddr = admin.strip_prefix("admin ").unwrap().parse().unwrap();
    for addr in [listen, admin] {
        assert_eq!(addr.ip().to_string(), "127.0.0.1");
        assert_ne!(addr.port(), 0, "the bound port, not the configured one");
    }
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["abridge.toml", "addrs"], "no temporary file left");

    let get = |url: String| async move { client().get(url).send().await.unwrap().status() };
    assert_eq!(get(format!("http://{admin}/healthz")).await, 200);
    assert_eq!(get(format!("http://{listen}/healthz")).await, 404);
    let answer = client()
        .post(format!("http://{listen}/v1/chat/completions"))
        .body(chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(provider.requests().len(), 1, "proxied to the provider");

    let kill = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().unwrap().to_string())
        .status()
        .unwrap();
    assert!(kill.success());
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("abridge exits on SIGTERM")
        .unwrap();
    let logs = text(&out.stderr);
    let ready = logs
        .lines()
        .find(|l| l.contains("abridge ready"))
        .unwrap_or_else(|| panic!("no ready line:\n{logs}"));
    assert!(
        ready.contains(&format!("http://{listen}/v1")) && ready.contains(&format!("admin={admin}")),
        "{ready}"
    );
}
