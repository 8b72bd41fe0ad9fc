//! Redis behind Sentinel, and the one connection type the backend uses: [`Conn`] is a
//! single server's, a cluster's or the current master's connection; the last notes a
//! failure that means the master must be asked of the sentinels again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisConnectionInfo, RedisError, RedisFuture,
    ServerErrorKind, Value,
};

use super::tls::Transport;
use crate::config::StoreConfig;
use crate::secret::Secret;
use crate::store::StoreError;

/// Either connection, usable wherever `redis` takes a connection.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(MasterConn),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => {
                let failed = c.failed.clone();
                let reply = c.conn.req_packed_command(cmd);
                Box::pin(async move {
                    let reply = reply.await;
                    if reply.as_ref().is_err_and(wrong_master) {
                        failed.store(true, Ordering::Relaxed);
                    }
                    reply
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Sentinel(c) => {
                let failed = c.failed.clone();
                let replies = c.conn.req_packed_commands(cmd, offset, count);
                Box::pin(async move {
                    let replies = replies.await;
                    let wrong = match &replies {
                        // A pipeline reports each command's error among the values.
                        Ok(values) => values.iter().any(demoted),
                        Err(e) => wrong_master(e),
                    };
                    if wrong {
                        failed.store(true, Ordering::Relaxed);
                    }
                    replies
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.conn.get_db(),
        }
    }
}

/// An error after which the master must be asked of the sentinels again: the connection
/// broke (the master died or moved) or the server is no longer the master (READONLY).
fn wrong_master(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_unrecoverable_error()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

/// A reply of a server that is no longer the master.
fn demoted(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::ReadOnly))
}

/// Redis behind Sentinel: the master is asked of the sentinels on first use and again
/// once its connection has failed (see [`wrong_master`]).
pub(super) struct Sentinel {
    /// Asks the sentinels (and checks the answer with `ROLE`); one caller at a time.
    client: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
    /// The master's connection while it works. A std mutex: never held across an await.
    current: Mutex<Option<MasterConn>>,
}

/// A connection to the master and whether it failed in a way that means "ask again".
#[derive(Clone)]
pub(super) struct MasterConn {
    conn: MultiplexedConnection,
    failed: Arc<AtomicBool>,
}

impl Sentinel {
    /// The sentinels of `store.sentinel`, not asked yet (connected lazily).
    pub(super) fn new(config: &StoreConfig, transport: &Transport) -> Result<Self, StoreError> {
        let sentinel = &config.sentinel;
        let failed = |e: String| StoreError::Backend(format!("store.sentinel: {e}"));
        let client = if transport.is_tls() {
            let mut builder = transport
                .sentinel(&sentinel.nodes, &sentinel.master)
                .map_err(failed)?;
            if let Some(user) = &sentinel.username {
                builder = builder.set_client_to_redis_username(user);
            }
            if let Some(password) = &sentinel.password {
                builder = builder.set_client_to_redis_password(password.expose());
            }
            builder.build()
        } else {
            let mut master = RedisConnectionInfo::default();
            if let Some(user) = &sentinel.username {
                master = master.set_username(user);
            }
            if let Some(password) = &sentinel.password {
                master = master.set_password(password.expose());
            }
            SentinelClient::build(
                sentinel.nodes.iter().map(Secret::expose).collect(),
                sentinel.master.clone(),
                Some(SentinelNodeConnectionInfo::default().set_redis_connection_info(master)),
                SentinelServerType::Master,
            )
        }
        .map_err(|e| failed(e.to_string()))?;
        Ok(Self {
            client: tokio::sync::Mutex::new(client),
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(config.connect_timeout()))
                .set_response_timeout(Some(config.response_timeout())),
            current: Mutex::new(None),
        })
    }

    fn usable(&self) -> Option<MasterConn> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .filter(|c| !c.failed.load(Ordering::Relaxed))
            .cloned()
    }

    pub(super) async fn conn(self: &Arc<Self>) -> Result<MasterConn, StoreError> {
        if let Some(conn) = self.usable() {
            return Ok(conn);
        }
        // Spawned: a caller that stops waiting (store.response_timeout_ms) must not
        // cancel the search halfway, or a slow sentinel would be asked forever.
        let me = self.clone();
        tokio::spawn(async move { me.find_master().await })
            .await
            .map_err(|e| StoreError::Backend(format!("asking the sentinels: {e}")))?
    }

    async fn find_master(&self) -> Result<MasterConn, StoreError> {
        let mut client = self.client.lock().await;
        // Someone else may have found it while this one waited for the lock.
        if let Some(conn) = self.usable() {
            return Ok(conn);
        }
        let conn = client
            .get_async_connection_with_config(&self.config)
            .await?;
        let conn = MasterConn {
            conn,
            failed: Arc::default(),
        };
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(conn.clone());
        Ok(conn)
    }
}
