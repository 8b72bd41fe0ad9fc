//! What only TLS shows: the server's certificate is verified (a CA that did not sign
//! it, or the built-in roots, are refused, and `insecure` is the one way around it), on
//! a single server and a Cluster alike; mutual TLS needs abridge's client certificate;
//! a TLS-only server has no plain port; sentinels over TLS share one set of
//! credentials. Every refusal is a store error, returned quickly (the request path
//! fails open).

use std::time::{Duration, Instant};

use abridge::config::{PemFile, RedisTls, StoreConfig};
use abridge::secret::Secret;
use abridge::store::{Saved, Store, StoreError};

use super::{checkpoint, conversation, fingerprint, unique_prefix};
use crate::common::redis::{RedisServer, shared_tls, shared_tls_cluster};
use crate::common::redis_tls::{ServerTls, pki};

fn store(url: String, tls: RedisTls) -> Store {
    Store::from_config(&StoreConfig {
        redis_url: Some(Secret::new(url)),
        tls,
        key_prefix: unique_prefix(),
        response_timeout_ms: 3000,
        connect_timeout_ms: 3000,
        ..StoreConfig::default()
    })
    .unwrap()
}

/// A checkpoint saved and loaded back: the store works over this connection.
async fn round_trip(store: &Store) {
    let conv = conversation("Bearer sk-tls", 1);
    let saved = store
        .save_checkpoint(&conv, &checkpoint(3, fingerprint(3), "over tls"), &[])
        .await
        .unwrap();
    assert_eq!(saved, Saved::Stored);
    let loaded = store.load(&conv).await.unwrap();
    assert_eq!(loaded.checkpoints.len(), 1);
    assert_eq!(
        loaded.checkpoints[0].summary.as_deref(),
        Some("summary: over tls")
    );
}

/// A load that must fail: the error, which came well before the response timeout.
async fn refused(store: &Store) -> String {
    let started = Instant::now();
    let err = store
        .load(&conversation("Bearer sk-tls", 2))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    assert!(!store.is_healthy());
    err.to_string()
}

#[tokio::test]
async fn the_servers_certificate_is_verified() {
    let server = shared_tls();
    let other = RedisTls {
        ca_file: Some(PemFile::read(&pki().other_ca).unwrap()),
        ..RedisTls::default()
    };
    let err = refused(&store(server.url(), other)).await;
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // Without ca_file, Mozilla's roots: they do not know the test CA either.
    let err = refused(&store(server.url(), RedisTls::default())).await;
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // Trusting the test CA, the same server works.
    round_trip(&store(server.url(), pki().store_tls(false))).await;
}

#[tokio::test]
async fn insecure_accepts_a_certificate_nobody_vouches_for() {
    let insecure = RedisTls {
        insecure: true,
        ..RedisTls::default()
    };
    round_trip(&store(shared_tls().url(), insecure)).await;
}

#[tokio::test]
async fn a_tls_only_server_has_no_plain_port() {
    let server = shared_tls();
    let plain = format!("redis://127.0.0.1:{}", server.port);
    refused(&store(plain, RedisTls::default())).await;
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let server = RedisServer::start_with(Some(ServerTls { auth_clients: true }));
    round_trip(&store(server.url(), pki().store_tls(true))).await;
    // The server verified, but abridge without a certificate: the server hangs up.
    refused(&store(server.url(), pki().store_tls(false))).await;
}

/// A store on the shared TLS cluster with `tls`.
fn cluster_store(tls: RedisTls) -> Store {
    let nodes = shared_tls_cluster().urls().into_iter().map(Secret::new);
    Store::from_config(&StoreConfig {
        redis_cluster: nodes.collect(),
        tls,
        key_prefix: unique_prefix(),
        response_timeout_ms: 3000,
        connect_timeout_ms: 3000,
        ..StoreConfig::default()
    })
    .unwrap()
}

#[tokio::test]
async fn a_cluster_is_verified_too_and_insecure_works_there() {
    let other = RedisTls {
        ca_file: Some(PemFile::read(&pki().other_ca).unwrap()),
        ..RedisTls::default()
    };
    refused(&cluster_store(other)).await;
    let insecure = RedisTls {
        insecure: true,
        ..RedisTls::default()
    };
    round_trip(&cluster_store(insecure)).await;
}

#[test]
fn tls_sentinels_must_share_their_credentials() {
    let config = StoreConfig {
        sentinel: abridge::config::SentinelConfig {
            nodes: vec![
                Secret::new("rediss://:first-Pw1@127.0.0.1:26379"),
                Secret::new("rediss://:second-Pw2@127.0.0.1:26380"),
            ],
            ..Default::default()
        },
        tls: pki().store_tls(false),
        ..StoreConfig::default()
    };
    let err = Store::from_config(&config).err().unwrap().to_string();
    assert!(err.contains("same username and password"), "{err}");
    assert!(!err.contains("Pw1") && !err.contains("Pw2"), "{err}");
}
