//! The command line an operator scripts against: `--version`, and `--check-config`,
//! which validates the file and environment as startup does, prints the effective
//! configuration with secrets masked and exits 0 or 2.

use std::process::{Command, Output};

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
    // Modes exclude each other.
    let out = abridge(&["--check-config", "--healthcheck"], &[], None);
    assert_eq!(out.status.code(), Some(2));
}
