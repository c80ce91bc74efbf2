//! Start-up over an etcd cluster (`--backend etcd`, cargo feature `etcd`).
//!
//! A node keeps no state of its own: the fenced store ([`palisade_etcd::EtcdStore`]) and
//! the lock service ([`palisade_etcd::EtcdIssuer`]) both live in etcd, so any number of
//! nodes can serve the same locks and namespaces, and a node can be killed and restarted
//! (or replaced) at any time. The data directory is not used.
//!
//! The key set is shared through etcd (`palisade_etcd::EtcdKeySet`): the first node to
//! start creates it from its `--signing-key-file` (a compare-and-create, so nodes starting
//! together agree); later nodes read it, and need the flag only if none exists yet.
//! Rotations and retirements through any node's API reach every node (see
//! [`crate::keys`]). Trusted keys (`--trust-key-file`) are per node. Lock-delay is kept
//! by a second etcd lease per lease (see `palisade_etcd`), in whole seconds.

use palisade_etcd::{
    EpochLedger, Etcd, EtcdConfig, EtcdIssuer, EtcdKeySet, EtcdStore, EtcdTls, EtcdUser,
};
use palisade_storage::observe::CommitHook;
use palisade_storage::FencedStore;
use std::sync::Arc;

use crate::config::{BackendConfig, EtcdAccess, ServerConfig};
use crate::keys::{self, KeyRegistry, KeyStore};
use crate::run::{listen_and_serve, Front, RunningServer, ServerError};
use crate::transport::Listener;

/// The epoch ledger's file in the node's `--data-dir` when `--etcd-epoch-ledger` is not
/// given.
pub const DEFAULT_LEDGER: &str = "etcd-epoch-ledger.json";

/// Creates the node's data directory (mode 0700) if it is missing: over etcd it holds
/// only the epoch ledger.
fn create_private_dir(dir: &std::path::Path) -> Result<(), ServerError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| {
        ServerError::Config(format!(
            "cannot create the data directory {} for the epoch ledger: {e}",
            dir.display()
        ))
    })
}

/// Connects to etcd and starts serving.
pub(crate) async fn serve(
    config: ServerConfig,
    front: Front,
    listener: Listener,
) -> Result<RunningServer, ServerError> {
    let BackendConfig::Etcd {
        endpoints,
        prefix,
        request_timeout,
        epoch_ledger,
        access,
    } = &config.backend
    else {
        return Err(ServerError::Config("not an etcd configuration".to_owned()));
    };
    if endpoints.is_empty() {
        return Err(ServerError::Config(
            "the etcd backend needs --etcd-endpoints (comma-separated client URLs)".to_owned(),
        ));
    }
    let seed = match config.signing_key_file.as_deref() {
        Some(path) => Some(keys::load_secret(path).map_err(ServerError::Key)?),
        None => None,
    };
    let trusted = keys::trusted_keys(&config.trust_key_files).map_err(ServerError::Key)?;
    let etcd = Etcd::connect(&EtcdConfig {
        endpoints: endpoints.clone(),
        prefix: prefix.clone(),
        request_timeout: *request_timeout,
        tls: etcd_tls(access)?,
        user: etcd_user(access)?,
    })
    .await?
    .with_commit_hook(CommitHook::new(front.observe.clone()));
    // The ledger is on by default: DATA_DIR/etcd-epoch-ledger.json.
    let path = match epoch_ledger {
        Some(path) => path.clone(),
        None => {
            create_private_dir(&config.data_dir)?;
            config.data_dir.join(DEFAULT_LEDGER)
        }
    };
    let ledger = EpochLedger::open(&path, prefix)?;
    // An etcd that came back older than this ledger saw is not served until
    // `palisade admin etcd-raise` has put its epochs above the ledgers.
    match ledger.check_against(&etcd).await {
        Ok(Ok(())) => {}
        Ok(Err(why)) => return Err(ServerError::Config(why)),
        Err(e) => tracing::warn!(
            error = %e,
            "etcd does not answer: the epoch ledger could not be checked against it"
        ),
    }
    tracing::info!(
        ledger = %path.display(),
        ceiling = ledger.file().ceiling,
        "epoch ledger: no epoch above the ceiling was handed out by this node"
    );
    let backend: Arc<dyn FencedStore> = Arc::new(EtcdStore::with_limits(
        etcd.clone(),
        config.store_limits,
        palisade_storage::WallClock::system(),
    ));
    let key_store = EtcdKeySet::new(etcd.clone());
    let stored = key_store
        .load_or_create(seed.clone(), keys::now_unix())
        .await?
        .ok_or_else(|| {
            ServerError::Config(
                "etcd holds no key set yet: the first node of a deployment needs \
                 --signing-key-file (64 hex characters, mode 0600) to create it"
                    .to_owned(),
            )
        })?;
    if let Some(seed) = &seed {
        if stored.set.active().key_id != seed.key_id() {
            tracing::warn!(
                active = %stored.set.active().key_id,
                "--signing-key-file is not the active key of the shared key set: it is read \
                 only to create the set; the set's active key signs"
            );
        }
    }
    let keys = KeyRegistry::new(
        stored.set,
        stored.revision,
        trusted,
        KeyStore::Etcd(Box::new(key_store)),
        config.token_cache,
    );
    keys.spawn_poll();
    let issuer = EtcdIssuer::new(etcd, keys.signer())
        .with_lock_delay(config.lock_delay_ms)
        .with_ledger(ledger);
    let state = front.state(&config, Arc::new(issuer), backend, keys);
    let what = format!("etcd, endpoints {}, prefix {prefix}", endpoints.join(","));
    listen_and_serve(listener, state, what, async {}).await
}

fn etcd_tls(access: &EtcdAccess) -> Result<Option<EtcdTls>, ServerError> {
    let Some(ca_file) = &access.ca_file else {
        if access.cert_file.is_some() || access.key_file.is_some() {
            return Err(ServerError::Config(
                "--etcd-cert and --etcd-key need --etcd-ca-file (TLS to etcd)".to_owned(),
            ));
        }
        return Ok(None);
    };
    if access.cert_file.is_some() != access.key_file.is_some() {
        return Err(ServerError::Config(
            "--etcd-cert and --etcd-key go together".to_owned(),
        ));
    }
    Ok(Some(EtcdTls {
        ca_file: ca_file.clone(),
        cert_file: access.cert_file.clone(),
        key_file: access.key_file.clone(),
    }))
}

fn etcd_user(access: &EtcdAccess) -> Result<Option<EtcdUser>, ServerError> {
    let (name, file) = match (&access.user, &access.password_file) {
        (None, None) => return Ok(None),
        (Some(name), Some(file)) => (name, file),
        _ => {
            return Err(ServerError::Config(
                "--etcd-user and --etcd-password-file go together".to_owned(),
            ))
        }
    };
    let password = std::fs::read_to_string(file).map_err(|e| {
        ServerError::Config(format!(
            "cannot read etcd password file {}: {e}",
            file.display()
        ))
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(file)
            .map_err(|e| ServerError::Config(format!("{}: {e}", file.display())))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(ServerError::Config(format!(
                "etcd password file {} may be read by group or others (mode {:o}); run chmod \
                 600 on it",
                file.display(),
                mode & 0o777
            )));
        }
    }
    Ok(Some(EtcdUser {
        name: name.clone(),
        password: password.trim().to_owned(),
    }))
}
