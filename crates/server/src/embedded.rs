//! Start-up on the embedded database (the default backend): the data directory claimed,
//! the database opened and checked against its ledger, the key set loaded, the issuer
//! started on the database's records, then served.

use std::sync::Arc;

use palisade_core::lock_table::TableConfig;
use palisade_issuer::Issuer;
use palisade_storage::redb_backend::{RedbBackend, RedbOptions};
use palisade_storage::{FencedStore, IssuerLog};

use crate::config::ServerConfig;
use crate::keys::{self, KeyRegistry, KeyStore};
use crate::recovery;
use crate::run::{bind, listen_and_serve, Front, RunningServer, ServerError, DB_FILE};

/// Binds the port, claims the data directory ([`crate::data_dir`]), loads state and
/// starts serving.
pub(crate) async fn serve(
    config: ServerConfig,
    front: Front,
) -> Result<RunningServer, ServerError> {
    let dir = &config.data_dir;
    let found = crate::data_dir::inspect(dir)?;
    let listener = bind(&config).await?;
    let claimed = crate::data_dir::DataDir::claim(dir, found)?;
    let front = front.start(&config)?;
    let trusted = keys::trusted_keys(&config.trust_key_files).map_err(ServerError::Key)?;
    // Before the database is opened (which creates it): only a directory without state
    // may get a new key.
    let fresh = !keys::has_database(dir);
    keys::refuse_keys_without_epochs(dir).map_err(ServerError::Key)?;
    let witness = config.witness.path(dir)?;
    // A first start that fails before its state is whole leaves the directory as it was.
    let first_start = fresh
        .then(|| crate::data_dir::FirstStart::begin(dir, witness.as_deref()))
        .transpose()?;
    recovery::check_before_open(dir).map_err(ServerError::Recovery)?;
    let db_path = dir.join(DB_FILE);
    let options = RedbOptions {
        cache_bytes: config.db_cache_bytes,
        limits: config.store_limits,
        commit_hook: palisade_storage::observe::CommitHook::new(front.observe.clone()),
        witness: witness.clone(),
        ..RedbOptions::default()
    };
    match &witness {
        Some(path) => {
            tracing::info!(witness = %path.display(), "witness outside the data directory")
        }
        None => tracing::warn!(
            "no witness (--no-witness): a data directory put back from an older copy will \
             serve, issue epochs a second time and admit tokens it had fenced out"
        ),
    }
    let redb = tokio::task::spawn_blocking(move || RedbBackend::open(&db_path, options))
        .await
        .map_err(|e| ServerError::Serve(std::io::Error::other(e)))?
        .map_err(|e| {
            if fresh {
                // Nothing to recover: what this start made is taken back (`FirstStart`).
                return ServerError::Recovery(format!(
                    "{e}. Nothing was served. This was the directory's first start: the files \
                     it made were removed, so fix the cause (free space on the volume, for \
                     one) and start again"
                ));
            }
            // Refused: damaged, older than its log, or not a Palisade database. Serving it
            // could lose acknowledged writes; say what recovers it.
            ServerError::Recovery(format!(
                "{e}. Nothing was served. If the database or its log was damaged or replaced, \
                 restore a backup with `palisade admin restore --data-dir {} --from <backup>` \
                 (docs/operations.md)",
                dir.display()
            ))
        })?;
    let found = redb.recovery();
    if let Some(floor) = found.raised_to {
        tracing::warn!(
            replayed = found.replayed,
            commit_seq = found.commit_seq,
            floor,
            "the log ended with a record recovery could not vouch for (torn by a crash, or \
             zeroed since by a bad sector or a lost write); it was dropped, and every lock's \
             epoch and every namespace's mark raised to {floor}: every token issued before is \
             refused, and every holder must release and acquire again (docs/guarantees.md)"
        );
    } else {
        tracing::info!(
            replayed = found.replayed,
            commit_seq = found.commit_seq,
            "database opened"
        );
    }
    let seed_file = config.signing_key_file.as_deref();
    let state = match recovery::check_and_refresh(dir, &redb).await {
        Ok(()) => keys::open_for_serving(dir, seed_file, fresh, keys::now_unix())
            .map_err(ServerError::Key),
        Err(e) => Err(ServerError::Recovery(e)),
    };
    let (key_set, origin) = match state {
        Ok(keys) => keys,
        Err(e) => {
            // Closed before anything of a failed first start is taken back.
            redb.close().await;
            return Err(e);
        }
    };
    log_key_origin(&key_set, origin, seed_file);
    if let Some(first_start) = first_start {
        first_start.complete();
    }
    let backend: Arc<dyn FencedStore> = Arc::new(redb.clone());
    let issuer_log: Arc<dyn IssuerLog> = Arc::new(redb.clone());
    let keys = KeyRegistry::new(
        key_set,
        0,
        trusted,
        KeyStore::Dir(dir.clone()),
        config.token_cache,
    );
    let issuer = Issuer::start(
        issuer_log,
        keys.signer(),
        TableConfig {
            lock_delay_ms: config.lock_delay_ms,
            idle_grace_ms: config.idle_grace_ms,
            max_locks: config.limits.max_locks,
            max_waiters_per_lock: config.limits.max_waiters_per_lock,
            max_sessions: config.limits.max_sessions,
            ..Default::default()
        },
    )
    .await?;
    log_recovery(&issuer.recovered());
    let mut state = front.state(&config, Arc::new(issuer), backend.clone(), keys);
    state.backup = Some(Arc::new(recovery::online::OnlineBackup::new(
        dir.clone(),
        redb.clone(),
    )));
    let data_dir = dir.clone();
    let ledger_refresh = recovery::spawn_ledger_refresh(data_dir.clone(), redb.clone());
    let stop_refresh = ledger_refresh.abort_handle();
    let on_stop = async move {
        // Let the writer answer what is queued and release the file.
        ledger_refresh.abort();
        recovery::refresh(&data_dir, &redb).await;
        backend.close().await;
        // The directory stays locked until the database is closed.
        drop(claimed);
    };
    let what = format!("embedded, data dir {}", dir.display());
    listen_and_serve(listener, state, what, on_stop)
        .await
        .inspect_err(|_| stop_refresh.abort())
}

/// The start-up summary of what the records made the issuer honour.
fn log_recovery(r: &palisade_issuer::embedded::Recovered) {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    tracing::info!(
        locks = r.locks,
        leases_honoured = r.leases,
        reservations_blocked = r.blocked_locks,
        blocked_for_ms = r.blocked_for_ms,
        blocked_until_unix_ms = now_ms.saturating_add(r.blocked_for_ms),
        max_epoch_ceiling = r.max_ceiling,
        epoch_floor = r.epoch_floor,
        "recovered: {} lease(s) honoured for a full TTL; {} lock(s) ungrantable for up to {} ms \
         (a lease granted before the stop may still be live); epochs continue above {}",
        r.leases,
        r.blocked_locks,
        r.blocked_for_ms,
        r.max_ceiling.max(r.epoch_floor)
    );
}

impl palisade_storage::observe::CommitObserver for crate::observe::Observe {
    fn committed(&self, report: palisade_storage::observe::CommitReport) {
        self.metrics.committed(report);
    }
}

/// Says where the key set came from when that is news, and warns when
/// `--signing-key-file` no longer names the key that signs.
fn log_key_origin(
    set: &palisade_token::KeySet,
    origin: keys::Origin,
    seed: Option<&std::path::Path>,
) {
    let active = &set.active().key_id;
    match origin {
        keys::Origin::Migrated => tracing::info!(
            key_id = %active,
            "{} became the key set {} (its key stays active)",
            keys::LEGACY_KEY_FILE,
            keys::KEY_SET_FILE
        ),
        keys::Origin::Seeded | keys::Origin::Created => {
            tracing::info!(key_id = %active, "new key set {}", keys::KEY_SET_FILE)
        }
        keys::Origin::Loaded => {}
    }
    if let Some(seed) = seed {
        match keys::load_secret(seed) {
            Ok(signer) if signer.key_id() == active => {}
            _ => tracing::warn!(
                file = %seed.display(),
                active = %active,
                "--signing-key-file is not the active key of the key set: it is read only to \
                 create a key set; the set's active key signs"
            ),
        }
    }
}
