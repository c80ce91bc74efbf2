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
use tokio_postgres::{Client, NoTls};

use super::gate_store::{failed_read, Entry, GatedDb, StoreError};
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

/// What an admit means for the request: the admitted epoch, a retry (`None`: the lock's
/// first admit lost a race, the transaction is to be dropped and begun again), or the
/// answer to send.
fn admitted(
    result: Result<palisade_adapters::Admitted, AdmitError>,
) -> Result<Option<u64>, StoreError> {
    match result {
        Ok(admitted) => Ok(Some(admitted.epoch())),
        Err(AdmitError::Conflict) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[async_trait]
impl GatedDb for PgStore {
    async fn mutate(
        &self,
        lock: &str,
        key: &str,
        value: Option<Bytes>,
        token: &str,
    ) -> Result<WriteAnswer, StoreError> {
        let mut client = self.connect().await?;
        for _ in 0..CONFLICT_RETRIES {
            // Dropping the transaction without a commit rolls it back.
            let tx = client.transaction().await.map_err(failed)?;
            let Some(epoch) = admitted(postgres::admit(&tx, &self.verifier, token, lock).await)?
            else {
                continue;
            };
            let revision: i64 = tx
                .query_one(NEXT_REVISION, &[])
                .await
                .map_err(failed)?
                .get(0);
            let changed = match &value {
                Some(value) => tx
                    .execute(
                        UPSERT,
                        &[&lock, &key, &&value[..], &revision, &signed(epoch)?],
                    )
                    .await
                    .map_err(failed)?,
                None => tx.execute(DELETE, &[&lock, &key]).await.map_err(failed)?,
            };
            if changed == 0 {
                // A delete of a missing key: nothing is committed, the mark included.
                return Err(StoreError::NotFound);
            }
            tx.commit().await.map_err(failed)?;
            return Ok(WriteAnswer {
                revision: unsigned(revision)?,
                epoch,
            });
        }
        Err(StoreError::Refused(AdmitError::Conflict))
    }

    async fn fence(&self, lock: &str, token: &str) -> Result<FenceAnswer, StoreError> {
        let mut client = self.connect().await?;
        for _ in 0..CONFLICT_RETRIES {
            let tx = client.transaction().await.map_err(failed)?;
            let Some(epoch) = admitted(postgres::admit(&tx, &self.verifier, token, lock).await)?
            else {
                continue;
            };
            tx.commit().await.map_err(failed)?;
            // Admitted: the mark is now this epoch.
            return Ok(FenceAnswer {
                lock: lock.to_owned(),
                high_water: epoch,
                epoch,
            });
        }
        Err(StoreError::Refused(AdmitError::Conflict))
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

fn signed(n: u64) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|_| StoreError::Failed(format!("epoch {n} does not fit a bigint")))
}

fn unsigned(n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| StoreError::Failed(format!("negative number {n} in verify_kv")))
}
