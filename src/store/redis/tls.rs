//! TLS to Redis: the store's URLs (`rediss://`) and `store.tls` turned into the `redis`
//! crate's settings — certificates for a verified connection (rustls with Mozilla's
//! roots or the configured CA, an optional client certificate), or no verification when
//! `store.tls.insecure` says so — applied alike to a single server, a Cluster, and
//! Sentinel (the sentinels and the master they name). The configuration has checked the
//! files and that the URLs use TLS all or none.

use redis::cluster::ClusterClientBuilder;
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{
    ClientTlsConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult,
    TlsCertificates, TlsMode,
};

use crate::config::{StoreConfig, is_tls_url};
use crate::secret::Secret;

/// How the store's connections are made.
#[derive(Clone)]
pub(super) enum Transport {
    /// `redis://`: plain TCP.
    Plain,
    /// `rediss://`: TLS, the server's certificate verified against the configured CA
    /// (or the built-in roots), with abridge's client certificate when one is set.
    Verified(TlsCertificates),
    /// `rediss://` with `store.tls.insecure`: TLS without any verification.
    Insecure,
}

impl Transport {
    /// The transport the configuration asks for; warns once about `insecure`.
    pub(super) fn new(config: &StoreConfig) -> Self {
        let urls = config.redis_url.iter().chain(&config.redis_cluster);
        let tls = urls
            .chain(&config.sentinel.nodes)
            .any(|url| is_tls_url(url.expose()));
        let settings = &config.tls;
        if !tls {
            return Transport::Plain;
        }
        if settings.insecure {
            tracing::warn!(
                "store.tls.insecure: the Redis server's certificate is not verified; anyone on the network path can read and change abridge's state"
            );
            return Transport::Insecure;
        }
        let client_tls = settings
            .cert_file
            .as_ref()
            .zip(settings.key_file.as_ref())
            .map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.pem().to_vec(),
                client_key: key.pem().to_vec(),
            });
        Transport::Verified(TlsCertificates {
            client_tls,
            root_cert: settings.ca_file.as_ref().map(|ca| ca.pem().to_vec()),
        })
    }

    pub(super) fn is_tls(&self) -> bool {
        !matches!(self, Transport::Plain)
    }

    /// A client of the single server at `url`.
    pub(super) fn client(&self, url: &str) -> RedisResult<redis::Client> {
        match self {
            Transport::Plain => redis::Client::open(url),
            Transport::Verified(certs) => redis::Client::build_with_tls(url, certs.clone()),
            Transport::Insecure => redis::Client::open(insecure(url.into_connection_info()?)),
        }
    }

    /// The cluster client's TLS settings (the nodes it discovers get the same).
    pub(super) fn cluster(&self, builder: ClusterClientBuilder) -> ClusterClientBuilder {
        match self {
            Transport::Plain => builder,
            Transport::Verified(certs) => builder.tls(TlsMode::Secure).certs(certs.clone()),
            Transport::Insecure => builder.tls(TlsMode::Insecure),
        }
    }

    /// A sentinel client over TLS: to the sentinels and to the master they name, with
    /// the same trust settings. One username and password go to every sentinel (the
    /// `redis` crate's builder takes one set), so the URLs must agree on them.
    pub(super) fn sentinel(
        &self,
        nodes: &[Secret],
        master: &str,
    ) -> Result<SentinelClientBuilder, String> {
        let infos = nodes
            .iter()
            .map(|url| url.expose().into_connection_info())
            .collect::<RedisResult<Vec<ConnectionInfo>>>()
            .map_err(|e| e.to_string())?;
        let credentials = |info: &ConnectionInfo| {
            let redis = info.redis_settings();
            (
                redis.username().map(str::to_owned),
                redis.password().map(str::to_owned),
            )
        };
        let (username, password) = infos.first().map(credentials).unwrap_or_default();
        if infos
            .iter()
            .any(|info| credentials(info) != (username.clone(), password.clone()))
        {
            return Err(
                "over TLS every sentinel URL must carry the same username and password (one set is sent to all sentinels)".to_owned(),
            );
        }
        let addrs = infos.iter().map(|info| info.addr().clone());
        let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
            .map_err(|e| e.to_string())?;
        if let Some(username) = username {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        Ok(match self {
            Transport::Plain => builder,
            Transport::Verified(certs) => builder
                .set_client_to_sentinel_certificates(certs.clone())
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_redis_certificates(certs.clone()),
            Transport::Insecure => builder
                .set_client_to_sentinel_tls_mode(TlsMode::Insecure)
                .set_client_to_redis_tls_mode(TlsMode::Insecure),
        })
    }
}

/// `info` with certificate verification off (its address is a TLS one: `rediss://`).
fn insecure(info: ConnectionInfo) -> ConnectionInfo {
    match info.addr().clone() {
        ConnectionAddr::TcpTls { host, port, .. } => info.set_addr(ConnectionAddr::TcpTls {
            host,
            port,
            insecure: true,
            tls_params: None,
        }),
        _ => info,
    }
}
