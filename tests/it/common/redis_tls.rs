//! TLS for the test Redis servers: a certificate authority and certificates made with
//! rcgen once per test binary (in a temporary directory), the `redis-server` flags of a
//! TLS-only server (no plain port), and a TLS client for the support's own commands.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use abridge::config::{PemFile, RedisTls};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// How a test server speaks TLS.
#[derive(Debug, Clone, Copy)]
pub struct ServerTls {
    /// `--tls-auth-clients`: only clients with a certificate of the test CA get in.
    pub auth_clients: bool,
}

/// The test certificates, as PEM files.
pub struct Pki {
    _dir: tempfile::TempDir,
    /// The CA that signed the server's and the client's certificates.
    pub ca: PathBuf,
    /// The servers' certificate (127.0.0.1 and localhost), also their client
    /// certificate towards each other (replication, the cluster bus, a sentinel).
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// A client certificate for abridge (mutual TLS).
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed nothing here: trusting it instead must fail verification.
    pub other_ca: PathBuf,
}

/// The certificates of this test binary, made on first use.
pub fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(Pki::generate)
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params
}

impl Pki {
    fn generate() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, pem: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let ca_key = KeyPair::generate().unwrap();
        let params = ca_params("abridge test CA");
        let ca = write("ca.pem", params.self_signed(&ca_key).unwrap().pem());
        let issuer = Issuer::new(params, ca_key);
        let leaf = |names: Vec<String>, cn: &str| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, cn);
            let cert = params.signed_by(&key, &issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (cert, key) = leaf(
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            "redis",
        );
        let (server_cert, server_key) = (write("server.pem", cert), write("server.key", key));
        let (cert, key) = leaf(Vec::new(), "abridge");
        let (client_cert, client_key) = (write("client.pem", cert), write("client.key", key));
        let other_key = KeyPair::generate().unwrap();
        let other = ca_params("another CA").self_signed(&other_key).unwrap();
        let other_ca = write("other-ca.pem", other.pem());
        Self {
            _dir: dir,
            ca,
            server_cert,
            server_key,
            client_cert,
            client_key,
            other_ca,
        }
    }

    /// abridge's `store.tls`: trusting the test CA, with the client certificate when
    /// `client` (mutual TLS).
    pub fn store_tls(&self, client: bool) -> RedisTls {
        let read = |p: &PathBuf| Some(PemFile::read(p).unwrap());
        RedisTls {
            ca_file: read(&self.ca),
            cert_file: if client {
                read(&self.client_cert)
            } else {
                None
            },
            key_file: if client { read(&self.client_key) } else { None },
            insecure: false,
        }
    }
}

/// The flags of a TLS-only server on `port`: no plain port, TLS for the cluster bus
/// and for replication (a sentinel's connections to the master too).
pub(super) fn server_args(tls: ServerTls, port: u16) -> Vec<String> {
    let pki = pki();
    let path = |p: &PathBuf| p.display().to_string();
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_owned();
    vec![
        "--port".into(),
        "0".into(),
        "--tls-port".into(),
        port.to_string(),
        "--tls-cert-file".into(),
        path(&pki.server_cert),
        "--tls-key-file".into(),
        path(&pki.server_key),
        "--tls-ca-cert-file".into(),
        path(&pki.ca),
        "--tls-auth-clients".into(),
        yes_no(tls.auth_clients),
        "--tls-replication".into(),
        "yes".into(),
    ]
}

/// `redis-cli`'s flags for a TLS server of the test CA (with the client certificate).
pub(super) fn cli_args() -> Vec<String> {
    let pki = pki();
    [
        "--tls",
        "--cacert",
        &pki.ca.display().to_string(),
        "--cert",
        &pki.client_cert.display().to_string(),
        "--key",
        &pki.client_key.display().to_string(),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A client of the TLS server on `port`, trusting the test CA, with the client
/// certificate (accepted whether or not the server asks for one).
pub fn client(port: u16) -> redis::Client {
    let pki = pki();
    let read = |p: &PathBuf| std::fs::read(p).unwrap();
    redis::Client::build_with_tls(
        format!("rediss://127.0.0.1:{port}"),
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read(&pki.client_cert),
                client_key: read(&pki.client_key),
            }),
            root_cert: Some(read(&pki.ca)),
        },
    )
    .unwrap()
}

/// One command over TLS; a simple reply as text, like `redis::command`.
pub fn command(port: u16, args: &[&str]) -> Result<String, String> {
    match query(port, args)? {
        redis::Value::Array(items) => Err(format!("an array reply: {items:?}")),
        value => text(value),
    }
}

/// One command over TLS whose reply is an array of strings, like `redis::command_list`.
pub fn command_list(port: u16, args: &[&str]) -> Vec<String> {
    match query(port, args).unwrap() {
        redis::Value::Array(items) => items.into_iter().map(|v| text(v).unwrap()).collect(),
        value => vec![text(value).unwrap()],
    }
}

fn query(port: u16, args: &[&str]) -> Result<redis::Value, String> {
    let (name, rest) = args.split_first().ok_or("no command")?;
    let mut con = client(port)
        .get_connection_with_timeout(Duration::from_secs(2))
        .map_err(|e| e.to_string())?;
    redis::cmd(name)
        .arg(rest)
        .query(&mut con)
        .map_err(|e| e.to_string())
}

fn text(value: redis::Value) -> Result<String, String> {
    match value {
        redis::Value::Nil => Ok(String::new()),
        redis::Value::Okay => Ok("OK".to_owned()),
        redis::Value::Int(n) => Ok(n.to_string()),
        redis::Value::SimpleString(s) => Ok(s),
        redis::Value::BulkString(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        redis::Value::VerbatimString { text, .. } => Ok(text),
        other => Err(format!("unexpected reply {other:?}")),
    }
}
