//! PostgreSQL: locks as rows, taken by a conditional `UPDATE ... RETURNING epoch`, and
//! the gate as one statement (fence `UPDATE` feeding a value upsert).
//!
//! The server runs with `fsync=on` and `synchronous_commit=on`: each statement is its
//! own transaction, and its commit is flushed to the WAL before the reply.

use std::sync::Arc;

use async_trait::async_trait;
use tokio_postgres::{Client, NoTls, Statement};

use super::{Peer, Recipes};
use crate::driver::{Plan, KEYS_PER_LOCK};
use crate::{BenchError, Job, OpError, Worker};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS bench_locks (
    name text PRIMARY KEY, epoch bigint NOT NULL DEFAULT 0, holder text, expires timestamptz);
CREATE TABLE IF NOT EXISTS bench_fences (name text PRIMARY KEY, hw bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS bench_kv (
    ns text NOT NULL, key text NOT NULL, value bytea NOT NULL, epoch bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, key));";

const ACQUIRE: &str = "UPDATE bench_locks
    SET epoch = epoch + 1, holder = $1, expires = now() + make_interval(secs => $3::float8 / 1000)
    WHERE name = $2 AND (holder IS NULL OR expires < now()) RETURNING epoch";
const RELEASE: &str =
    "UPDATE bench_locks SET holder = NULL, expires = NULL WHERE name = $1 AND holder = $2";
/// The fence and the write commit together, or neither happens (no row from `f`).
const FENCED_WRITE: &str = "WITH f AS (
        UPDATE bench_fences SET hw = $1 WHERE name = $2 AND hw <= $1 RETURNING name)
    INSERT INTO bench_kv (ns, key, value, epoch) SELECT name, $3, $4, $1 FROM f
    ON CONFLICT (ns, key) DO UPDATE SET value = EXCLUDED.value, epoch = EXCLUDED.epoch";
const PLAIN_WRITE: &str = "INSERT INTO bench_kv (ns, key, value) VALUES ($1, $2, $3)
    ON CONFLICT (ns, key) DO UPDATE SET value = EXCLUDED.value";
const READ: &str = "SELECT value FROM bench_kv WHERE ns = $1 AND key = $2";

fn code(e: tokio_postgres::Error) -> OpError {
    match e.code() {
        Some(state) => OpError::new(format!("pg_{}", state.code())),
        None if e.is_closed() => OpError::new("io"),
        None => OpError::new("pg_error"),
    }
}

async fn connect(plan: &Plan) -> Result<Client, BenchError> {
    let (client, connection) = tokio_postgres::connect(&plan.url, NoTls)
        .await
        .map_err(|e| plan.setup_error(format!("{}: {e}", plan.url)))?;
    // The connection task ends when the client is dropped.
    tokio::spawn(connection);
    Ok(client)
}

/// Creates the tables and the rows of this run's locks and fences.
pub async fn prepare(plan: &Plan) -> Result<(), BenchError> {
    let client = connect(plan).await?;
    client
        .batch_execute(SCHEMA)
        .await
        .map_err(|e| plan.setup_error(e))?;
    let names: Vec<String> = match plan.job {
        Job::Contended => vec![plan.contended_lock()],
        _ => (0..plan.clients).flat_map(|c| plan.locks_of(c)).collect(),
    };
    for table in ["bench_locks", "bench_fences"] {
        let sql =
            format!("INSERT INTO {table} (name) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING");
        client
            .execute(&sql, &[&names])
            .await
            .map_err(|e| plan.setup_error(e))?;
    }
    Ok(())
}

struct Statements {
    acquire: Statement,
    release: Statement,
    fenced_write: Statement,
    plain_write: Statement,
    read: Statement,
}

struct PostgresWorker {
    client: Client,
    sql: Statements,
    /// (lock name, epoch held for `j2`).
    locks: Vec<(String, i64)>,
    keys: Vec<String>,
    holder: String,
    ttl_ms: f64,
    value: Vec<u8>,
}

pub async fn worker(plan: Arc<Plan>, client: usize) -> Result<Box<dyn Worker>, BenchError> {
    let conn = connect(&plan).await?;
    let prepare = |sql: &'static str| conn.prepare(sql);
    let sql = async {
        Ok::<_, tokio_postgres::Error>(Statements {
            acquire: prepare(ACQUIRE).await?,
            release: prepare(RELEASE).await?,
            fenced_write: prepare(FENCED_WRITE).await?,
            plain_write: prepare(PLAIN_WRITE).await?,
            read: prepare(READ).await?,
        })
    }
    .await
    .map_err(|e| plan.setup_error(e))?;
    let names = plan.worker_locks(client);
    let worker = PostgresWorker {
        client: conn,
        sql,
        locks: names.into_iter().map(|n| (n, 0)).collect(),
        keys: (0..KEYS_PER_LOCK).map(|k| format!("k{k}")).collect(),
        holder: plan.holder(client),
        ttl_ms: plan.ttl_ms as f64,
        value: plan.value.to_vec(),
    };
    Peer::prepared(worker, &plan, client).await
}

#[async_trait]
impl Recipes for PostgresWorker {
    async fn acquire(&mut self, i: usize, seq: usize) -> Result<bool, OpError> {
        let holder = format!("{}-{seq}", self.holder);
        let row = self
            .client
            .query_opt(
                &self.sql.acquire,
                &[&holder, &self.locks[i].0, &self.ttl_ms],
            )
            .await
            .map_err(code)?;
        let Some(row) = row else {
            return Ok(false);
        };
        self.locks[i].1 = row.try_get::<_, i64>(0).map_err(code)?;
        Ok(true)
    }

    async fn release(&mut self, i: usize, seq: usize) -> Result<(), OpError> {
        let holder = format!("{}-{seq}", self.holder);
        let rows = self
            .client
            .execute(&self.sql.release, &[&self.locks[i].0, &holder])
            .await
            .map_err(code)?;
        match rows {
            1 => Ok(()),
            _ => Err(OpError::new("lease_lost")),
        }
    }

    async fn write_plain(&mut self, i: usize, key: usize) -> Result<(), OpError> {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&self.locks[i].0, &self.keys[key], &self.value];
        self.client
            .execute(&self.sql.plain_write, &params)
            .await
            .map(drop)
            .map_err(code)
    }

    async fn fenced_write(&mut self, i: usize, key: usize) -> Result<bool, OpError> {
        let (name, epoch) = &self.locks[i];
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [epoch, name, &self.keys[key], &self.value];
        match self.client.execute(&self.sql.fenced_write, &params).await {
            Ok(rows) => Ok(rows == 1),
            Err(e) => Err(code(e)),
        }
    }

    async fn read(&mut self, i: usize) -> Result<bool, OpError> {
        let row = self
            .client
            .query_opt(&self.sql.read, &[&self.locks[i].0, &self.keys[0]])
            .await
            .map_err(code)?;
        Ok(matches!(
            row.map(|r| r.try_get::<_, Vec<u8>>(0)),
            Some(Ok(v)) if v.len() == self.value.len()
        ))
    }

    fn locks(&self) -> usize {
        self.locks.len()
    }
}
