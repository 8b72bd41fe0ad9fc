//! Loading the configuration: the file's text and the `ABRIDGE_*` environment merged
//! into one TOML table (environment values converted to the type of the key they set),
//! deserialised into [`Config`], then checked across keys; every error a [`ConfigError`]
//! naming the key and where its value came from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{Config, ENV_PREFIX, MIN_ADMIN_TOKEN};

/// A check that failed: the key it names and the message.
type Invalid = (&'static str, String);

/// Short environment names for keys people set most (`ABRIDGE_REDIS_URL`).
const ENV_ALIASES: [(&str, &str); 1] = [("ABRIDGE_REDIS_URL", "store.redis_url")];

/// A configuration error, naming the key and where its value came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{origin}: key `{key}`: {message}")]
    Key {
        key: String,
        origin: String,
        message: String,
    },
}

impl Config {
    /// Loads the configuration: defaults, then the file (if given), then the process
    /// environment's `ABRIDGE_*` variables.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let text = match file {
            Some(path) => {
                Some(
                    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                        path: path.to_owned(),
                        source,
                    })?,
                )
            }
            None => None,
        };
        let source = text.as_deref().zip(file);
        Self::from_sources(source.map(|(t, p)| (p, t)), std::env::vars())
    }

    /// Loads from a file's text (with its path, for messages) and an environment.
    pub fn from_sources(
        file: Option<(&Path, &str)>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut table = match file {
            Some((path, text)) => {
                toml::from_str::<toml::Table>(text).map_err(|e| ConfigError::Syntax {
                    path: path.to_owned(),
                    message: e.to_string(),
                })?
            }
            None => toml::Table::new(),
        };
        let file_origin = match file {
            Some((path, _)) => format!("config file {}", path.display()),
            None => "configuration".to_owned(),
        };

        // Which key paths the environment set, to name the variable in errors.
        let mut env_keys: BTreeMap<String, String> = BTreeMap::new();
        let schema = toml::Table::try_from(Config::default()).unwrap_or_default();
        for (var, value) in env {
            let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let path: Vec<String> = match ENV_ALIASES.iter().find(|(alias, _)| *alias == var) {
                Some((_, key)) => key.split('.').map(str::to_owned).collect(),
                None => rest.split("__").map(str::to_ascii_lowercase).collect(),
            };
            let key = path.join(".");
            let origin = format!("environment variable {var}");
            let value =
                typed_env_value(&schema, &path, &value).map_err(|message| ConfigError::Key {
                    key: key.clone(),
                    origin: origin.clone(),
                    message,
                })?;
            insert_path(&mut table, &path, value).map_err(|message| ConfigError::Key {
                key: key.clone(),
                origin: origin.clone(),
                message,
            })?;
            env_keys.insert(key, var);
        }

        let origin_of = |key: &str| {
            env_keys
                .iter()
                .find(|(k, _)| key == k.as_str() || key.starts_with(&format!("{k}.")))
                .map(|(_, var)| format!("environment variable {var}"))
                .unwrap_or_else(|| file_origin.clone())
        };
        let config = serde_path_to_error::deserialize::<_, Config>(table).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Key {
                origin: origin_of(&key),
                key,
                message: e.into_inner().message().to_owned(),
            }
        })?;
        config
            .validate()
            .map_err(|(key, message)| ConfigError::Key {
                origin: origin_of(key),
                key: key.to_owned(),
                message,
            })?;
        Ok(config)
    }

    /// Checks that span several keys (single values are checked as they are read).
    fn validate(&self) -> Result<(), Invalid> {
        self.validate_admin()?;
        self.validate_store_backend()?;
        self.validate_compaction()?;
        if let Err(message) = self.strategies.check() {
            return Err(("strategies", message));
        }
        self.validate_summary()?;
        self.recall.check()?;
        if let Err(message) = crate::prices::Prices::new(&self.prices) {
            return Err(("prices", message));
        }
        let store = &self.store;
        if store.ttl_secs == 0 || store.max_checkpoints == 0 || store.response_timeout_ms == 0 {
            let key = if store.ttl_secs == 0 {
                "store.ttl_secs"
            } else if store.max_checkpoints == 0 {
                "store.max_checkpoints"
            } else {
                "store.response_timeout_ms"
            };
            return Err((key, "must be greater than 0".to_owned()));
        }
        Ok(())
    }

    /// `admin.token`: present means non-empty and long enough.
    fn validate_admin(&self) -> Result<(), Invalid> {
        if let Some(token) = &self.admin.token {
            let token = token.expose().trim();
            if token.is_empty() {
                return Err((
                    "admin.token",
                    "is empty: an empty token would let a request without credentials in; set a long random string, or leave the key out to disable the admin API".to_owned(),
                ));
            }
            if token.chars().count() < MIN_ADMIN_TOKEN {
                return Err((
                    "admin.token",
                    format!(
                        "is shorter than {MIN_ADMIN_TOKEN} characters: a short token can be guessed; use a long random string (e.g. `openssl rand -hex 32`)"
                    ),
                ));
            }
            if let Some(why) = weak_token(token) {
                return Err((
                    "admin.token",
                    format!(
                        "is too easy to guess ({why}); use a long random string (e.g. `openssl rand -hex 32`)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The store: one backend, and a key prefix safe for Redis Cluster.
    fn validate_store_backend(&self) -> Result<(), Invalid> {
        let store = &self.store;
        if store.redis_url.is_some() && !store.redis_cluster.is_empty() {
            return Err((
                "store.redis_cluster",
                "set either store.redis_url or store.redis_cluster, not both".to_owned(),
            ));
        }
        if !store.sentinel.nodes.is_empty() {
            if store.redis_url.is_some() || !store.redis_cluster.is_empty() {
                return Err((
                    "store.sentinel.nodes",
                    "set one of store.redis_url, store.redis_cluster and store.sentinel.nodes"
                        .to_owned(),
                ));
            }
            if store.sentinel.master.is_empty() {
                return Err((
                    "store.sentinel.master",
                    "must name the master the sentinels monitor".to_owned(),
                ));
            }
        }
        super::tls::check(store)?;
        if store.key_prefix.is_empty() || store.key_prefix.contains(['{', '}']) {
            return Err((
                "store.key_prefix",
                "must be non-empty and contain no braces (they would break Redis Cluster hash tags)".to_owned(),
            ));
        }
        Ok(())
    }

    /// Compaction: ratios, the default window, background workers.
    fn validate_compaction(&self) -> Result<(), Invalid> {
        let c = &self.compaction;
        for (key, ratio) in [
            ("compaction.threshold_ratio", c.threshold_ratio),
            ("compaction.soft_ratio", c.soft_ratio),
            ("compaction.target_ratio", c.target_ratio),
        ] {
            if !(ratio > 0.0 && ratio <= 1.0) {
                return Err((key, format!("must be in (0, 1], not {ratio}")));
            }
        }
        if c.default_context_window == 0 {
            return Err((
                "compaction.default_context_window",
                "must be greater than 0".to_owned(),
            ));
        }
        if c.background && (c.background_workers == 0 || c.background_queue == 0) {
            return Err((
                "compaction.background_workers",
                "background compaction needs at least one worker and a queue of at least one"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// The summariser's own provider: it needs a model, and an API key is only for it.
    fn validate_summary(&self) -> Result<(), Invalid> {
        if self.summary.upstream.is_some() && self.summary.model.trim().is_empty() {
            return Err((
                "summary.model",
                "must name the summary provider's model when summary.upstream is set: a model name a client chose is never sent to a provider abridge pays for".to_owned(),
            ));
        }
        if self.summary.api_key.is_some() && self.summary.upstream.is_none() {
            return Err((
                "summary.api_key",
                "is only used with summary.upstream; the main upstream gets the client's own credentials".to_owned(),
            ));
        }
        Ok(())
    }
}

/// Bits a token of random characters of its classes (lower, upper, digits, other)
/// would carry at least; a token a person typed carries less, so the bar is high.
const MIN_TOKEN_BITS: f64 = 64.0;

/// Why an admin token of the right length is still easy to guess, if it is: few
/// distinct characters (`aaaaaaaaaaaaaaaa`, `passwordpassword`), a run of neighbours
/// (`0123456789abcdef`, `qwertyuiop…` is not caught: no dictionary here), a repeated
/// pattern, or too few bits for its length and character classes.
pub(super) fn weak_token(token: &str) -> Option<&'static str> {
    let bytes = token.as_bytes();
    let mut distinct = bytes.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < 8 {
        return Some("fewer than 8 distinct characters");
    }
    // Steps of 0 or ±1 between neighbours: `aaaa`, `abcd`, `9876`.
    let steps = bytes
        .windows(2)
        .filter(|w| w[0].abs_diff(w[1]) <= 1)
        .count();
    if steps * 2 > bytes.len().saturating_sub(1) {
        return Some("mostly a run of neighbouring characters");
    }
    if (1..=bytes.len() / 2).any(|p| bytes.len() % p == 0 && bytes[p..] == bytes[..bytes.len() - p])
    {
        return Some("a repeated pattern");
    }
    // The size of each character class the token uses: lower, upper, digits, other.
    let class = |b: u8| match b {
        b'a'..=b'z' => 0,
        b'A'..=b'Z' => 1,
        b'0'..=b'9' => 2,
        _ => 3,
    };
    let mut used = [false; 4];
    for &b in bytes {
        used[class(b)] = true;
    }
    let alphabet: f64 = [26.0, 26.0, 10.0, 33.0]
        .iter()
        .zip(used)
        .filter_map(|(size, used)| used.then_some(size))
        .sum();
    // A character cannot carry more than its class allows, nor more than the token's
    // own variety shows.
    let per_char = alphabet.min(distinct.len() as f64 * 2.0).log2();
    if per_char * (bytes.len() as f64) < MIN_TOKEN_BITS {
        return Some("too few bits for its length and characters");
    }
    None
}

/// Converts an environment value (text) to the TOML type of the key it sets. Keys the
/// defaults do not show (unset optionals) are taken as text; unknown keys are rejected
/// later by `deny_unknown_fields` with the variable named.
fn typed_env_value(
    schema: &toml::Table,
    path: &[String],
    raw: &str,
) -> Result<toml::Value, String> {
    let mut node: Option<&toml::Value> = None;
    let mut table = Some(schema);
    for part in path {
        node = table.and_then(|t| t.get(part));
        table = node.and_then(toml::Value::as_table);
    }
    let bad = |what: &str| format!("`{raw}` is not {what}");
    Ok(match node {
        Some(toml::Value::Integer(_)) => {
            toml::Value::Integer(raw.trim().parse().map_err(|_| bad("an integer"))?)
        }
        Some(toml::Value::Float(_)) => {
            toml::Value::Float(raw.trim().parse().map_err(|_| bad("a number"))?)
        }
        Some(toml::Value::Boolean(_)) => {
            toml::Value::Boolean(raw.trim().parse().map_err(|_| bad("true or false"))?)
        }
        Some(toml::Value::Array(_)) => {
            // A TOML array literal (`["a", "b"]`) or a comma-separated list.
            let literal = format!("v = {raw}");
            match toml::from_str::<toml::Table>(&literal)
                .ok()
                .and_then(|mut t| t.remove("v"))
            {
                Some(v @ toml::Value::Array(_)) => v,
                _ => toml::Value::Array(
                    raw.split(',')
                        .map(|s| toml::Value::String(s.trim().to_owned()))
                        .filter(|v| v.as_str() != Some(""))
                        .collect(),
                ),
            }
        }
        Some(toml::Value::Table(_)) => {
            return Err("is a section; set its keys (with `__` between levels)".to_owned());
        }
        _ => toml::Value::String(raw.to_owned()),
    })
}

fn insert_path(table: &mut toml::Table, path: &[String], value: toml::Value) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else {
        return Err("empty key".to_owned());
    };
    let mut cur = table;
    for part in parents {
        let entry = cur
            .entry(part.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry
            .as_table_mut()
            .ok_or_else(|| format!("`{part}` is not a section"))?;
    }
    cur.insert(last.clone(), value);
    Ok(())
}
