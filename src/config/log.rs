//! The `[log]` section: the filter, colours, and the line format.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Log filter: a level (`info`) or per-target directives (`warn,abridge=debug`).
    pub filter: LogFilter,
    /// Colour codes in log lines (stderr; `text` only).
    pub ansi: bool,
    /// `text` (human-readable lines) or `json` (one object per line, for log shippers).
    pub format: LogFormat,
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            filter: LogFilter("info".to_owned()),
            ansi: false,
            format: LogFormat::Text,
        }
    }
}

/// A tracing filter (`info`, `warn,abridge=debug`), checked at load time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct LogFilter(String);

impl LogFilter {
    pub fn targets(&self) -> tracing_subscriber::filter::Targets {
        // Checked in `Deserialize`; the default is valid.
        self.0.parse().unwrap_or_default()
    }
}

impl<'de> Deserialize<'de> for LogFilter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<tracing_subscriber::filter::Targets>()
            .map_err(|e| serde::de::Error::custom(format!("invalid log filter `{s}`: {e}")))?;
        Ok(Self(s))
    }
}
