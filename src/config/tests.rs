//! Unit tests of the configuration: the documented file, unknown keys, errors that name
//! the key and its origin, environment overrides.

use std::path::Path;

use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn load(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::from_sources(Some((Path::new("/etc/abridge.toml"), text)), env(vars))
}

#[test]
fn the_documented_file_lists_exactly_the_defaults() {
    let text = include_str!("../../config/abridge.toml");
    let config = load(text, &[]).unwrap();
    assert_eq!(config, Config::default());
    // Every key of the defaults appears in the file (and unknown keys would fail).
    let documented: toml::Table = toml::from_str(text).unwrap();
    let defaults = toml::Table::try_from(Config::default()).unwrap();
    fn keys(t: &toml::Table, prefix: &str, out: &mut Vec<String>) {
        for (k, v) in t {
            let k = format!("{prefix}{k}");
            match v {
                toml::Value::Table(inner) => keys(inner, &format!("{k}."), out),
                _ => out.push(k),
            }
        }
    }
    let (mut a, mut b) = (vec![], vec![]);
    keys(&documented, "", &mut a);
    keys(&defaults, "", &mut b);
    a.sort();
    b.sort();
    assert_eq!(
        a, b,
        "config/abridge.toml must list every key with its default"
    );
}

#[test]
fn unknown_key_names_key_and_file() {
    let err = load("[admin]\ntokn = \"x\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("admin.tokn"), "{err}");
    assert!(err.contains("/etc/abridge.toml"), "{err}");
    assert!(err.contains("unknown field"), "{err}");
}

#[test]
fn unknown_top_level_key_is_named() {
    let err = load("lisen = \"127.0.0.1:1\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("`lisen`"), "{err}");
}

#[test]
fn unknown_env_key_names_the_variable() {
    let err = load("", &[("ABRIDGE_ADMIN__TOKN", "x")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("ABRIDGE_ADMIN__TOKN"), "{err}");
    assert!(err.contains("admin.tokn"), "{err}");
}

#[test]
fn bad_value_names_key_and_file() {
    let err = load("[timeouts]\nconnect_ms = \"soon\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("timeouts.connect_ms"), "{err}");
    assert!(err.contains("/etc/abridge.toml"), "{err}");
    let err = load("upstream = \"ftp://x/v1\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("upstream") && err.contains("http"), "{err}");
    let err = load("", &[("ABRIDGE_TIMEOUTS__CONNECT_MS", "soon")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("ABRIDGE_TIMEOUTS__CONNECT_MS"), "{err}");
    assert!(err.contains("not an integer"), "{err}");
    let err = load("[log]\nfilter = \"info,abridge=loud\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("log.filter"), "{err}");
}

#[test]
fn syntax_error_names_the_file() {
    let err = load("listen = \n", &[]).unwrap_err().to_string();
    assert!(err.contains("/etc/abridge.toml"), "{err}");
}

#[test]
fn environment_overrides_file_and_keeps_strings_exact() {
    let config = load(
        "listen = \"127.0.0.1:1\"\n[admin]\ntoken = \"from-the-file-0123\"\n",
        &[
            ("ABRIDGE_LISTEN", "0.0.0.0:8081"),
            ("ABRIDGE_ADMIN__TOKEN", "48173062591384072695"),
            ("ABRIDGE_TIMEOUTS__CONNECT_MS", "250"),
            ("ABRIDGE_LOG__ANSI", "true"),
            ("OTHER_VAR", "ignored"),
        ],
    )
    .unwrap();
    assert_eq!(config.listen, "0.0.0.0:8081".parse().unwrap());
    assert_eq!(
        config.admin.token.as_ref().map(Secret::expose),
        Some("48173062591384072695")
    );
    assert_eq!(config.timeouts.connect_ms, 250);
    assert!(config.log.ansi);
}

#[test]
fn store_settings_from_env() {
    let config = load(
        "",
        &[
            ("ABRIDGE_REDIS_URL", "redis://:pw@127.0.0.1:6379"),
            ("ABRIDGE_STORE__TTL_SECS", "60"),
            ("ABRIDGE_IDENTITY__TENANT_HEADERS", "X-Api-Key, x-tenant"),
        ],
    )
    .unwrap();
    assert_eq!(
        config.store.redis_url.as_ref().map(Secret::expose),
        Some("redis://:pw@127.0.0.1:6379")
    );
    assert_eq!(config.store.ttl_secs, 60);
    let tenants: Vec<&str> = config
        .identity
        .tenant_headers
        .iter()
        .map(|h| h.0.as_str())
        .collect();
    assert_eq!(tenants, ["x-api-key", "x-tenant"]);
    assert!(
        !format!("{config:?}").contains(":pw@"),
        "store URLs may carry passwords"
    );
}

#[test]
fn cluster_and_sentinel_settings_from_env() {
    let cluster = load(
        "",
        &[("ABRIDGE_STORE__REDIS_CLUSTER", "redis://a:1, redis://b:2")],
    )
    .unwrap();
    assert_eq!(cluster.store.redis_cluster.len(), 2);
    assert_eq!(cluster.store.redis_cluster[1].expose(), "redis://b:2");

    let sentinel = load(
        "",
        &[
            (
                "ABRIDGE_STORE__SENTINEL__NODES",
                "redis://s1:26379,redis://s2:26379",
            ),
            ("ABRIDGE_STORE__SENTINEL__MASTER", "cache"),
            ("ABRIDGE_STORE__SENTINEL__PASSWORD", "12345"),
        ],
    )
    .unwrap();
    assert_eq!(sentinel.store.sentinel.nodes.len(), 2);
    assert_eq!(sentinel.store.sentinel.master, "cache");
    assert_eq!(
        sentinel
            .store
            .sentinel
            .password
            .as_ref()
            .map(Secret::expose),
        Some("12345"),
        "a password of digits stays text"
    );
    assert!(!format!("{sentinel:?}").contains("12345"));
}

#[test]
fn conflicting_store_settings_are_errors_naming_their_keys() {
    let err = load(
        "[store.sentinel]\nnodes = [\"redis://s1:26379\"]\n",
        &[("ABRIDGE_REDIS_URL", "redis://a")],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("store.sentinel.nodes"), "{err}");

    let err = load(
        "[store]\nredis_url = \"redis://a\"\nredis_cluster = [\"redis://b\"]\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("store.redis_cluster") && err.contains("/etc/abridge.toml"),
        "{err}"
    );
    let err = load("", &[("ABRIDGE_STORE__KEY_PREFIX", "a{b}")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("ABRIDGE_STORE__KEY_PREFIX"), "{err}");
    let err = load("[identity]\ntenant_headers = [\"bad header\"]\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("identity.tenant_headers"), "{err}");
}

#[test]
fn recall_bounds_are_checked_and_it_turns_off_by_environment() {
    let off = load("", &[("ABRIDGE_RECALL__ENABLED", "false")]).unwrap();
    assert!(!off.recall.enabled);
    for (text, key) in [
        ("[recall]\nmax_tokens = 10\n", "recall.max_tokens"),
        ("[recall]\nmax_rounds = 0\n", "recall.max_rounds"),
        (
            "[recall]\nmax_calls_per_answer = 0\n",
            "recall.max_calls_per_answer",
        ),
        (
            "[recall]\nmax_round_tokens = 500\n",
            "recall.max_round_tokens",
        ),
        (
            "[recall]\nmax_answer_bytes = 1000\n",
            "recall.max_answer_bytes",
        ),
        ("[recall]\nmax_hold_ms = 10\n", "recall.max_hold_ms"),
    ] {
        let err = load(text, &[]).unwrap_err().to_string();
        assert!(err.contains(key), "{err}");
    }
    // Off, its bounds do not matter.
    assert!(load("[recall]\nenabled = false\nmax_rounds = 0\n", &[]).is_ok());
}

#[test]
fn upstream_keeps_its_path_prefix() {
    let config = load("upstream = \"https://openrouter.ai/api/v1/\"\n", &[]).unwrap();
    assert_eq!(config.upstream.path, "/api/v1");
    assert_eq!(config.upstream.authority.as_str(), "openrouter.ai");
    assert_eq!(config.upstream.to_string(), "https://openrouter.ai/api/v1");
    let bare: UpstreamBase = "http://127.0.0.1:9000".parse().unwrap();
    assert_eq!(bare.path, "");
    assert!("https://user:pw@host/v1".parse::<UpstreamBase>().is_err());
    assert!("host/v1".parse::<UpstreamBase>().is_err());
}

#[test]
fn an_empty_admin_token_is_refused_not_taken_as_a_password() {
    for (text, vars) in [
        ("[admin]\ntoken = \"\"\n", &[][..]),
        ("", &[("ABRIDGE_ADMIN__TOKEN", "  ")][..]),
    ] {
        let err = load(text, vars).unwrap_err().to_string();
        assert!(
            err.contains("admin.token") && err.contains("empty"),
            "{err}"
        );
    }
}

#[test]
fn a_short_admin_token_is_refused() {
    for short in ["007", "admin-token-123"] {
        let err = load("", &[("ABRIDGE_ADMIN__TOKEN", short)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("admin.token") && err.contains("16"), "{err}");
    }
    assert!(load("", &[("ABRIDGE_ADMIN__TOKEN", "9f3ac07e51d2b846")]).is_ok());
}

#[test]
fn an_admin_token_easy_to_guess_is_refused_whatever_its_length() {
    for weak in [
        "aaaaaaaaaaaaaaaa",
        "passwordpassword",
        "0123456789abcdef",
        "abcdefghijklmnopqrstuvwxyz",
        "ab12cd34ab12cd34ab12cd34",
        "1111111111111111111111112",
    ] {
        let err = load("", &[("ABRIDGE_ADMIN__TOKEN", weak)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("admin.token") && err.contains("easy to guess"),
            "{weak}: {err}"
        );
    }
    // What `openssl rand -hex 16`, `-base64 24` and a long passphrase give.
    for strong in [
        "4f1c9a7e2b3d8065e1a9c4f7b2d30e68",
        "q2Vn8Zs+Lk0pWx7/Jr4tYb3H",
        "correct-horse-battery-staple-42",
    ] {
        assert!(
            load("", &[("ABRIDGE_ADMIN__TOKEN", strong)]).is_ok(),
            "{strong}"
        );
    }
}

#[test]
fn debug_output_hides_the_admin_token() {
    let config = load("[admin]\ntoken = \"s3cret-admin-token\"\n", &[]).unwrap();
    assert!(!format!("{config:?}").contains("s3cret-admin-token"));
}

#[test]
fn anthropic_routes_may_name_their_own_upstream() {
    let config = load(
        "",
        &[("ABRIDGE_ANTHROPIC_UPSTREAM", "https://api.anthropic.com/v1")],
    )
    .unwrap();
    let base = config.anthropic_upstream.unwrap();
    assert_eq!(base.path, "/v1");
    let config = load("anthropic_upstream = \"http://127.0.0.1:8001/v1\"\n", &[]).unwrap();
    assert!(config.anthropic_upstream.is_some());
    assert!(load("anthropic_upstream = \"ftp://x/v1\"\n", &[]).is_err());
    assert!(
        Config::default().anthropic_upstream.is_none(),
        "one upstream by default"
    );
}

/// A self-signed certificate and its key, written to `dir` as `<name>.pem`/`<name>.key`.
fn pem_pair(dir: &Path, name: &str) -> (String, String) {
    let pair = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&cert, pair.cert.pem()).unwrap();
    std::fs::write(&key, pair.signing_key.serialize_pem()).unwrap();
    (cert.display().to_string(), key.display().to_string())
}

#[test]
fn redis_tls_files_are_read_at_load_and_their_contents_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pem_pair(dir.path(), "client");
    let (ca, _) = pem_pair(dir.path(), "ca");
    let text = format!(
        "[store]\nredis_url = \"rediss://:hunter2@cache.example:6380\"\n[store.tls]\nca_file = {ca:?}\ncert_file = {cert:?}\n"
    );
    let config = load(&text, &[("ABRIDGE_STORE__TLS__KEY_FILE", &key)]).unwrap();
    let tls = &config.store.tls;
    assert_eq!(tls.ca_file.as_ref().unwrap().path(), Path::new(&ca));
    let key_pem = std::fs::read_to_string(&key).unwrap();
    assert_eq!(tls.key_file.as_ref().unwrap().pem(), key_pem.as_bytes());
    let shown = format!("{config:?}");
    assert!(shown.contains(&key), "the path is shown: {shown}");
    assert!(
        !shown.contains("PRIVATE KEY") && !shown.contains(":hunter2@"),
        "{shown}"
    );
    let serialised = toml::to_string(&config).unwrap();
    assert!(!serialised.contains("PRIVATE KEY"), "{serialised}");
    // `insecure` from the environment is a boolean.
    let insecure = load(
        "[store]\nredis_url = \"rediss://h:6380\"\n",
        &[("ABRIDGE_STORE__TLS__INSECURE", "true")],
    )
    .unwrap();
    assert!(insecure.store.tls.insecure);
    assert!(load("[store]\nredis_url = \"rediss://h:6380\"\n", &[]).is_ok());
}

#[test]
fn bad_redis_ca_files_are_config_errors_naming_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = TlsFiles::in_dir(dir.path());
    let (url, missing, not_pem, garbled) = (TLS_URL, &f.missing, &f.not_pem, &f.garbled);
    refused(&[
        (
            format!("{url}ca_file = {missing:?}\n"),
            &[],
            "store.tls.ca_file",
            "cannot read",
        ),
        (
            String::new(),
            &[
                ("ABRIDGE_REDIS_URL", "rediss://h"),
                ("ABRIDGE_STORE__TLS__CA_FILE", missing),
            ],
            "ABRIDGE_STORE__TLS__CA_FILE",
            "missing.pem",
        ),
        (
            format!("{url}ca_file = {not_pem:?}\n"),
            &[],
            "store.tls.ca_file",
            "no PEM certificate",
        ),
        (
            format!("{url}ca_file = {garbled:?}\n"),
            &[],
            "store.tls.ca_file",
            "not a usable CA certificate",
        ),
    ]);
}

#[test]
fn bad_redis_client_certificates_are_config_errors_naming_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = TlsFiles::in_dir(dir.path());
    let (url, cert, key) = (TLS_URL, &f.cert, &f.key);
    let (other_cert, other_key, not_pem) = (&f.other_cert, &f.other_key, &f.not_pem);
    refused(&[
        (
            format!("{url}cert_file = {cert:?}\n"),
            &[],
            "store.tls.key_file",
            "is needed",
        ),
        (
            format!("{url}cert_file = {cert:?}\nkey_file = {other_key:?}\n"),
            &[],
            "store.tls.key_file",
            "cannot be used",
        ),
        (
            format!("{url}key_file = {not_pem:?}\ncert_file = {other_cert:?}\n"),
            &[],
            "store.tls.key_file",
            "no PEM private key",
        ),
        (
            format!("{url}insecure = true\nca_file = {cert:?}\n"),
            &[],
            "store.tls.insecure",
            "cannot go with",
        ),
    ]);
    assert!(
        load(
            &format!("{url}cert_file = {cert:?}\nkey_file = {key:?}\n"),
            &[]
        )
        .is_ok()
    );
}

/// A Redis URL with a password, and the start of its TLS section.
const TLS_URL: &str = "[store]\nredis_url = \"rediss://:hunter2@h:6380\"\n[store.tls]\n";

/// The files of the TLS cases: two key pairs, a file that is not PEM, a garbled
/// certificate and a path with no file.
struct TlsFiles {
    cert: String,
    key: String,
    other_cert: String,
    other_key: String,
    not_pem: String,
    garbled: String,
    missing: String,
}

impl TlsFiles {
    fn in_dir(dir: &std::path::Path) -> Self {
        let (cert, key) = pem_pair(dir, "client");
        let (other_cert, other_key) = pem_pair(dir, "other");
        let not_pem = dir.join("notes.txt");
        std::fs::write(&not_pem, "not a certificate").unwrap();
        let garbled = dir.join("garbled.pem");
        std::fs::write(
            &garbled,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        Self {
            cert,
            key,
            other_cert,
            other_key,
            not_pem: not_pem.display().to_string(),
            garbled: garbled.display().to_string(),
            missing: dir.join("missing.pem").display().to_string(),
        }
    }
}

/// The file's text, the environment, the key (or variable) and the message named.
type Refused<'a> = (String, &'a [(&'a str, &'a str)], &'a str, &'a str);

/// Each case is refused with an error naming its key and saying why, never the password.
fn refused(cases: &[Refused<'_>]) {
    for (text, vars, key_or_var, message) in cases {
        let err = load(text, vars).unwrap_err().to_string();
        assert!(err.contains(key_or_var) && err.contains(message), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}

#[test]
fn redis_tls_settings_need_rediss_urls_all_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = pem_pair(dir.path(), "ca");
    let cases: [(String, &str, &str); 5] = [
        (
            format!("[store]\nredis_url = \"redis://:hunter2@h:6379\"\n[store.tls]\nca_file = {ca:?}\n"),
            "store.tls.ca_file",
            "not rediss://",
        ),
        // The in-process store has no URL at all.
        ("[store.tls]\ninsecure = true\n".to_owned(), "store.tls.insecure", "not rediss://"),
        (
            "[store]\nredis_cluster = [\"rediss://:hunter2@a:1\", \"redis://:hunter2@b:2\"]\n".to_owned(),
            "store.redis_cluster",
            "mixes",
        ),
        (
            "[store.sentinel]\nnodes = [\"redis://:hunter2@s1:26379\", \"rediss://:hunter2@s2:26379\"]\n"
                .to_owned(),
            "store.sentinel.nodes",
            "mixes",
        ),
        (
            "[store]\nredis_url = \"rediss://:hunter2@h:6380/#insecure\"\n".to_owned(),
            "store.redis_url",
            "store.tls.insecure",
        ),
    ];
    for (text, key, message) in cases {
        let err = load(&text, &[]).unwrap_err().to_string();
        assert!(err.contains(key) && err.contains(message), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
    let sentinel = load(
        "[store.sentinel]\nnodes = [\"rediss://s1:26379\", \"rediss://s2:26379\"]\n[store.tls]\ninsecure = true\n",
        &[],
    )
    .unwrap();
    assert!(sentinel.store.tls.insecure);
}
