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
            ("ABRIDGE_ADMIN__TOKEN", "0070070070070070"),
            ("ABRIDGE_TIMEOUTS__CONNECT_MS", "250"),
            ("ABRIDGE_LOG__ANSI", "true"),
            ("OTHER_VAR", "ignored"),
        ],
    )
    .unwrap();
    assert_eq!(config.listen, "0.0.0.0:8081".parse().unwrap());
    assert_eq!(
        config.admin.token.as_ref().map(Secret::expose),
        Some("0070070070070070")
    );
    assert_eq!(config.timeouts.connect_ms, 250);
    assert!(config.log.ansi);
}

#[test]
fn store_settings_from_env_and_cross_key_checks() {
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
    assert!(load("", &[("ABRIDGE_ADMIN__TOKEN", "0123456789abcdef")]).is_ok());
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
