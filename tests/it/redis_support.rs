//! The Redis test support itself: real servers start on ephemeral ports, and on another
//! when the one they were offered is taken (by a plain listener, by another Redis, or a
//! cluster node's bus port); a real 3-node cluster forms, a stopped server comes back on
//! the same port, and the TLS-only servers speak nothing but TLS.

use std::net::TcpListener;

use crate::common::redis::{
    RedisServer, command, shared, shared_cluster, shared_tls, shared_tls_cluster,
};

#[test]
fn a_real_redis_answers_on_an_ephemeral_port() {
    let redis = shared();
    assert_eq!(command(redis.port, &["PING"]).unwrap(), "PONG");
    assert_eq!(
        command(redis.port, &["SET", "abridge:test", "v", "EX", "60"]).unwrap(),
        "OK"
    );
    assert_eq!(command(redis.port, &["GET", "abridge:test"]).unwrap(), "v");
    let ttl: i64 = command(redis.port, &["TTL", "abridge:test"])
        .unwrap()
        .parse()
        .unwrap();
    assert!(ttl > 0 && ttl <= 60);
    assert!(redis.url().starts_with("redis://127.0.0.1:"));
}

/// The race a free port loses on a busy machine, made certain: the port offered first is
/// held, and the server comes up on another.
#[test]
fn a_server_offered_a_taken_port_starts_on_another() {
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().port();
    let redis = RedisServer::start_trying(taken);
    assert_ne!(redis.port, taken);
    assert_eq!(command(redis.port, &["PING"]).unwrap(), "PONG");
    assert!(
        command(taken, &["PING"]).is_err(),
        "still the test's listener"
    );

    // Another Redis on it: its answers are not taken for the new server's.
    let other = shared();
    let redis = RedisServer::start_trying(other.port);
    assert_ne!(redis.port, other.port);
    command(redis.port, &["SET", "only-here", "1"]).unwrap();
    assert_eq!(command(other.port, &["EXISTS", "only-here"]).unwrap(), "0");
}

/// A cluster node needs its bus port (+10000) too: with that one held, the node starts
/// on another pair.
#[test]
fn a_cluster_node_whose_bus_port_is_taken_starts_on_another() {
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let bus = held.local_addr().unwrap().port();
    let node = RedisServer::start_cluster_node_trying(bus - 10_000);
    assert_ne!(node.port, bus - 10_000);
    let info = command(node.port, &["CLUSTER", "INFO"]).unwrap();
    assert!(info.contains("cluster_state:"), "a cluster node: {info}");
}

#[test]
fn a_real_three_node_cluster_covers_every_slot() {
    let cluster = shared_cluster();
    assert_eq!(cluster.nodes.len(), 3);
    let info = command(cluster.nodes[0].port, &["CLUSTER", "INFO"]).unwrap();
    assert!(info.contains("cluster_state:ok"), "{info}");
    assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    assert!(info.contains("cluster_known_nodes:3"), "{info}");
    // A key is served by exactly one node; the others redirect.
    let answers: Vec<Result<String, String>> = cluster
        .nodes
        .iter()
        .map(|n| command(n.port, &["SET", "k", "1"]))
        .collect();
    assert_eq!(
        answers.iter().filter(|a| a.is_ok()).count(),
        1,
        "{answers:?}"
    );
    assert!(
        answers
            .iter()
            .filter_map(|a| a.as_ref().err())
            .all(|e| e.starts_with("MOVED"))
    );
}

#[test]
fn a_stopped_server_is_down_until_restarted_on_the_same_port() {
    let mut redis = RedisServer::start();
    let port = redis.port;
    command(port, &["SET", "k", "v"]).unwrap();
    redis.stop();
    assert!(command(port, &["PING"]).is_err());
    redis.restart();
    assert_eq!(redis.port, port);
    assert_eq!(command(port, &["PING"]).unwrap(), "PONG");
    // No persistence: a restarted server starts empty.
    assert_eq!(command(port, &["GET", "k"]).unwrap(), "");
}

#[test]
fn tls_only_servers_answer_over_tls_and_not_in_plain() {
    let redis = shared_tls();
    assert!(redis.url().starts_with("rediss://127.0.0.1:"));
    assert_eq!(redis.command(&["PING"]).unwrap(), "PONG");
    assert!(command(redis.port, &["PING"]).is_err(), "no plain port");
    let cluster = shared_tls_cluster();
    for node in &cluster.nodes {
        assert!(command(node.port, &["PING"]).is_err(), "no plain port");
        let info = node.command(&["CLUSTER", "INFO"]).unwrap();
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_known_nodes:3"), "{info}");
    }
}
