//! `store.tls`: how abridge trusts a Redis reached over TLS (`rediss://`) — the
//! certificate authorities, an optional client certificate for mutual TLS, or no
//! verification at all as an explicit opt-in — and the checks that make a wrong setting
//! fail at start-up: files are read and their PEM parsed as the configuration loads, the
//! key must belong to the certificate, and the store's URLs must all use TLS when any
//! TLS setting is given (and all or none of them otherwise).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

use super::StoreConfig;
use crate::secret::Secret;

/// A check that failed: the key it names and the message (as in `load`).
type Invalid = (&'static str, String);

/// TLS to Redis (`store.tls`). Used when the store's URLs are `rediss://`; without
/// `ca_file`, the server's certificate is checked against Mozilla's root certificates
/// (compiled in, as for the upstream).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisTls {
    /// PEM file of the certificate authorities to trust instead of the built-in roots
    /// (a private CA, a self-signed server certificate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PemFile>,
    /// PEM file of abridge's client certificate (chain), for mutual TLS; needs `key_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PemFile>,
    /// PEM file of the private key of `cert_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PemFile>,
    /// Accept any server certificate (no verification at all). Only for a test setup:
    /// anyone on the path can read and change what abridge stores. Logged as a warning.
    pub insecure: bool,
}

impl RedisTls {
    fn any_set(&self) -> Option<&'static str> {
        if self.ca_file.is_some() {
            Some("store.tls.ca_file")
        } else if self.cert_file.is_some() {
            Some("store.tls.cert_file")
        } else if self.key_file.is_some() {
            Some("store.tls.key_file")
        } else if self.insecure {
            Some("store.tls.insecure")
        } else {
            None
        }
    }
}

/// A PEM file named in the configuration, read when the configuration loads (so a wrong
/// path is a configuration error, not a failure at the first request). `Debug` and
/// `Serialize` show the path only: a key file's contents are a credential.
#[derive(Clone, PartialEq)]
pub struct PemFile {
    path: PathBuf,
    text: Secret,
}

impl PemFile {
    /// Reads the file at `path` (its contents are checked with the rest of the
    /// configuration).
    pub fn read(path: impl Into<PathBuf>) -> std::io::Result<Self> {
        let path = path.into();
        let text = std::fs::read_to_string(&path)?;
        Ok(Self {
            path,
            text: Secret::new(text),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's contents (PEM text). For a key file, a credential leaving its box.
    pub fn pem(&self) -> &[u8] {
        self.text.expose().as_bytes()
    }
}

impl fmt::Debug for PemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.path)
    }
}

impl<'de> Deserialize<'de> for PemFile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let path = PathBuf::from(String::deserialize(d)?);
        Self::read(&path)
            .map_err(|e| serde::de::Error::custom(format!("cannot read {}: {e}", path.display())))
    }
}

impl Serialize for PemFile {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.path.display())
    }
}

/// Whether a Redis URL asks for TLS (`rediss://`, or Valkey's `valkeys://`).
pub fn is_tls_url(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys")
}

/// The store's URLs with the keys they come from (never printed: they may carry
/// passwords).
fn urls(store: &StoreConfig) -> Vec<(&'static str, &str)> {
    let single = store.redis_url.iter().map(|u| ("store.redis_url", u));
    let cluster = store
        .redis_cluster
        .iter()
        .map(|u| ("store.redis_cluster", u));
    let sentinel = store
        .sentinel
        .nodes
        .iter()
        .map(|u| ("store.sentinel.nodes", u));
    single
        .chain(cluster)
        .chain(sentinel)
        .map(|(key, url)| (key, url.expose()))
        .collect()
}

/// The store's URLs against `store.tls`: all TLS or none, no `#insecure` behind the
/// configuration's back, TLS settings only for TLS URLs, and usable PEM files.
pub(super) fn check(store: &StoreConfig) -> Result<(), Invalid> {
    let urls = urls(store);
    for (key, url) in &urls {
        if url.contains('#') {
            return Err((
                key,
                "contains `#`, which starts a URL fragment: write a `#` in a password as %23; abridge does not take #insecure (to skip certificate verification, set store.tls.insecure = true)".to_owned(),
            ));
        }
    }
    let tls = urls.iter().any(|(_, url)| is_tls_url(url));
    if let Some((key, _)) = urls.iter().find(|(_, url)| tls && !is_tls_url(url)) {
        return Err((
            key,
            "mixes rediss:// (TLS) and redis:// URLs: the store's URLs use TLS all or none"
                .to_owned(),
        ));
    }
    let config = &store.tls;
    if !tls {
        return match config.any_set() {
            Some(key) => Err((
                key,
                "is set, but the store's URLs are not rediss:// (TLS): write rediss://host:port, or remove the store.tls settings".to_owned(),
            )),
            None => Ok(()),
        };
    }
    check_files(config)
}

/// The files of `store.tls`: which go together, and that they hold what they should.
fn check_files(config: &RedisTls) -> Result<(), Invalid> {
    if config.insecure && (config.ca_file.is_some() || config.cert_file.is_some()) {
        return Err((
            "store.tls.insecure",
            "turns certificate verification off, so it cannot go with ca_file or cert_file: remove insecure to verify the server".to_owned(),
        ));
    }
    if let Some(ca) = &config.ca_file {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates(ca).map_err(|m| ("store.tls.ca_file", m))? {
            roots.add(cert).map_err(|e| {
                (
                    "store.tls.ca_file",
                    format!("{}: not a usable CA certificate: {e}", ca.path().display()),
                )
            })?;
        }
    }
    match (&config.cert_file, &config.key_file) {
        (None, None) => Ok(()),
        (Some(_), None) => Err((
            "store.tls.key_file",
            "is needed with store.tls.cert_file (the client certificate's private key)".to_owned(),
        )),
        (None, Some(_)) => Err((
            "store.tls.cert_file",
            "is needed with store.tls.key_file (the client certificate)".to_owned(),
        )),
        (Some(cert), Some(key)) => {
            let chain = certificates(cert).map_err(|m| ("store.tls.cert_file", m))?;
            let key_der = PrivateKeyDer::from_pem_slice(key.pem()).map_err(|e| {
                (
                    "store.tls.key_file",
                    format!("{}: no PEM private key: {e}", key.path().display()),
                )
            })?;
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .and_then(|b| {
                    b.with_root_certificates(rustls::RootCertStore::empty())
                        .with_client_auth_cert(chain, key_der)
                })
                .map(drop)
                .map_err(|e| {
                    (
                        "store.tls.key_file",
                        format!(
                            "{} cannot be used with the certificate of {}: {e}",
                            key.path().display(),
                            cert.path().display()
                        ),
                    )
                })
        }
    }
}

/// The certificates of a PEM file: at least one.
fn certificates(file: &PemFile) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(file.pem())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: bad PEM: {e}", file.path().display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            file.path().display()
        ));
    }
    Ok(certs)
}
