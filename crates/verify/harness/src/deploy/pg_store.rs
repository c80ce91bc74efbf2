//! [`PgStore`]: the gate targets' store in PostgreSQL, written through the Rust gate
//! (`palisade_adapters::postgres`) exactly as `docs/protecting-your-database.md` tells
//! users to.
//!
//! Each write is one transaction: `admit` (the token verified with the issuer's keys, the
//! lock's mark compared and raised in `palisade_fence`), then the write to `verify_kv`,
//! then `COMMIT`. A refused admit rolls everything back; a lost race on a lock's first
//! admit (`Conflict`) is retried, as the docs say. Revisions come from one sequence,
//! taken after the admit (which holds the lock's fence row), so that the mutations of a
//! lock are numbered in the order they commit.
//!
//! Every request opens its own connection: after the database is killed or frozen, no
//! pooled connection can carry a stale session into the next request, and a connection
//! that never came back costs nothing. That is slower than a pool and irrelevant here.
//!
//! At start, the gate's preflight runs on the database: with PostgreSQL's durability
//! settings it passes and the tables are installed by `migrate`, which refuses an unsafe
//! database. For the negative control the preflight must refuse, its reason is kept for
//! the report ([`PgStore::preflight_refusal`]), and the tables are installed anyway
//! (`migrate_unchecked`), as a user who skipped the check would.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use palisade_adapters::{postgres, AdmitError};
use palisade_api::wire::{FenceAnswer, WriteAnswer};
use palisade_token::Verifier;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Transaction};

use super::gate_store::{failed_read, signed, unsigned, Entry, GatedDb, Mutation, StoreError};
use crate::VerifyError;

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS verify_kv (
        lock text NOT NULL,
        key text NOT NULL,
        value bytea NOT NULL,
        revision bigint NOT NULL,
        epoch bigint NOT NULL,
        PRIMARY KEY (lock, key)
    );
    CREATE SEQUENCE IF NOT EXISTS verify_revision;
";
const UPSERT: &str = "INSERT INTO verify_kv (lock, key, value, revision, epoch) \
     VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (lock, key) DO UPDATE \
     SET value = excluded.value, revision = excluded.revision, epoch = excluded.epoch";
const DELETE: &str = "DELETE FROM verify_kv WHERE lock = $1 AND key = $2";
const NEXT_REVISION: &str = "SELECT nextval('verify_revision')";
const READ: &str = "SELECT value, revision, epoch FROM verify_kv WHERE lock = $1 AND key = $2";
const LIST: &str =
    "SELECT key FROM verify_kv WHERE lock = $1 AND starts_with(key, $2) ORDER BY key";

/// How many times a write retries a lost race on a lock's first admit.
const CONFLICT_RETRIES: usize = 5;

/// The gate's store in one PostgreSQL database.
pub struct PgStore {
    config: String,
    verifier: Arc<Verifier>,
    preflight_refusal: Option<String>,
}

impl PgStore {
    /// Runs the preflight and installs the tables. `expect_unsafe`: the database was
    /// started with a setting the preflight refuses (the control); anything else is an
    /// error, so a control that is not one cannot pass for one.
    pub async fn install(
        config: String,
        verifier: Arc<Verifier>,
        expect_unsafe: bool,
    ) -> Result<PgStore, VerifyError> {
        let client = connect(&config).await.map_err(deploy)?;
        let preflight_refusal = match postgres::preflight(&client).await {
            Ok(()) if expect_unsafe => {
                return Err(VerifyError::Deploy(
                    "the gate's preflight accepted a database started with an unsafe setting"
                        .into(),
                ))
            }
            Ok(()) => None,
            Err(AdmitError::UnsafeDatabase(why)) if expect_unsafe => Some(why.to_string()),
            Err(e) => return Err(VerifyError::Deploy(format!("the gate's preflight: {e}"))),
        };
        if expect_unsafe {
            postgres::migrate_unchecked(&client).await
        } else {
            postgres::migrate(&client).await
        }
        .map_err(|e| VerifyError::Deploy(format!("cannot install the gate's table: {e}")))?;
        // The checkpoint makes the tables durable whatever the settings: the control is
        // about the marks and writes of the run, not about losing the schema.
        client
            .batch_execute(SCHEMA)
            .await
            .and(client.batch_execute("CHECKPOINT").await)
            .map_err(|e| VerifyError::Deploy(format!("cannot create verify_kv: {e}")))?;
        Ok(PgStore {
            config,
            verifier,
            preflight_refusal,
        })
    }

    /// What the preflight said of the database, when it refused it.
    pub fn preflight_refusal(&self) -> Option<&str> {
        self.preflight_refusal.as_deref()
    }

    async fn connect(&self) -> Result<Client, StoreError> {
        connect(&self.config).await.map_err(StoreError::Failed)
    }
}

/// What a request writes after its admit.
enum Write<'a> {
    Put(&'a str, &'a [u8]),
    Delete(&'a str),
    /// Nothing: the barrier, which only raises the mark.
    Barrier,
}

impl PgStore {
    /// One transaction: `admit`, then `write`, then `COMMIT`, begun again when the lock's
    /// first admit lost a race (`Conflict`). The admitted epoch, and the revision of the
    /// write (none for the barrier).
    async fn transact(
        &self,
        lock: &str,
        token: &str,
        write: Write<'_>,
    ) -> Result<(u64, Option<u64>), StoreError> {
        let mut client = self.connect().await?;
        for _ in 0..CONFLICT_RETRIES {
            // Dropping the transaction without a commit rolls it back.
            let tx = client.transaction().await.map_err(failed)?;
            let epoch = match postgres::admit(&tx, &self.verifier, token, lock).await {
                Ok(admitted) => admitted.epoch(),
                Err(AdmitError::Conflict) => continue,
                Err(e) => return Err(e.into()),
            };
            let revision = match write {
                Write::Barrier => None,
                Write::Put(key, value) => {
                    let revision = next_revision(&tx).await?;
                    let row: [&(dyn ToSql + Sync); 5] =
                        [&lock, &key, &value, &revision, &signed(epoch)?];
                    tx.execute(UPSERT, &row).await.map_err(failed)?;
                    Some(revision)
                }
                Write::Delete(key) => {
                    let revision = next_revision(&tx).await?;
                    if tx.execute(DELETE, &[&lock, &key]).await.map_err(failed)? == 0 {
                        // A missing key: nothing is committed, the mark included.
                        return Err(StoreError::NotFound);
                    }
                    Some(revision)
                }
            };
            tx.commit().await.map_err(failed)?;
            return Ok((epoch, revision.map(unsigned).transpose()?));
        }
        Err(StoreError::Refused(AdmitError::Conflict))
    }
}

/// The next store revision, taken after the admit: the admit holds the lock's fence row
/// until the commit, so a lock's mutations are numbered in the order they commit.
async fn next_revision(tx: &Transaction<'_>) -> Result<i64, StoreError> {
    let row = tx.query_one(NEXT_REVISION, &[]).await.map_err(failed)?;
    Ok(row.get(0))
}

#[async_trait]
impl GatedDb for PgStore {
    async fn mutate(&self, m: Mutation<'_>) -> Result<WriteAnswer, StoreError> {
        let write = match &m.value {
            Some(value) => Write::Put(m.key, value),
            None => Write::Delete(m.key),
        };
        let (epoch, revision) = self.transact(m.lock, m.token, write).await?;
        Ok(WriteAnswer {
            revision: revision.unwrap_or_default(),
            epoch,
        })
    }

    async fn fence(&self, lock: &str, token: &str) -> Result<FenceAnswer, StoreError> {
        let (epoch, _) = self.transact(lock, token, Write::Barrier).await?;
        // Admitted: the mark is now this epoch.
        Ok(FenceAnswer {
            lock: lock.to_owned(),
            high_water: epoch,
            epoch,
        })
    }

    async fn read(&self, lock: &str, key: &str) -> Result<Option<Entry>, StoreError> {
        let client = self.connect().await?;
        let Some(row) = client
            .query_opt(READ, &[&lock, &key])
            .await
            .map_err(failed)?
        else {
            return Ok(None);
        };
        let value: Vec<u8> = row.get(0);
        Ok(Some(Entry {
            value: Bytes::from(value),
            revision: unsigned(row.get(1))?,
            epoch: unsigned(row.get(2))?,
        }))
    }

    async fn list(&self, lock: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        let client = self.connect().await?;
        let rows = client
            .query(LIST, &[&lock, &prefix])
            .await
            .map_err(failed)?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    async fn high_water(&self, lock: &str) -> Result<u64, StoreError> {
        let client = self.connect().await?;
        let mark = postgres::high_water(&client, lock)
            .await
            .map_err(failed_read)?;
        Ok(mark.epoch)
    }
}

async fn connect(config: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(config, NoTls)
        .await
        .map_err(|e| format!("cannot connect to PostgreSQL: {e}"))?;
    tokio::spawn(connection);
    Ok(client)
}

fn failed(e: tokio_postgres::Error) -> StoreError {
    StoreError::Failed(format!("PostgreSQL: {e}"))
}

fn deploy(why: String) -> VerifyError {
    VerifyError::Deploy(why)
}
