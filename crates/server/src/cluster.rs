//! Start-up over an etcd cluster (`--backend etcd`, cargo feature `etcd`).
//!
//! A node keeps no state of its own: the fenced store ([`palisade_etcd::EtcdStore`]) and
//! the lock service ([`palisade_etcd::EtcdIssuer`]) both live in etcd, so any number of
//! nodes can serve the same locks and namespaces, and a node can be killed and restarted
//! (or replaced) at any time. The data directory is not used.
//!
//! What must be the same on every node, and is therefore configured rather than created:
//! the signing key (`--signing-key-file`, required) and the trusted keys. Refused here:
//! `--lock-delay-ms > 0`, which etcd's leases cannot express (see `palisade_etcd`).

use palisade_etcd::{Etcd, EtcdConfig, EtcdIssuer, EtcdStore};
use palisade_storage::FencedStore;
use palisade_token::Verifier;
use std::sync::Arc;

use crate::config::{BackendConfig, ServerConfig};
use crate::keys;
use crate::run::{listen_and_serve, Front, RunningServer, ServerError};

/// Connects to etcd and starts serving.
pub(crate) async fn serve(
    config: ServerConfig,
    front: Front,
) -> Result<RunningServer, ServerError> {
    let BackendConfig::Etcd {
        endpoints,
        prefix,
        request_timeout,
    } = &config.backend
    else {
        return Err(ServerError::Config("not an etcd configuration".to_owned()));
    };
    if endpoints.is_empty() {
        return Err(ServerError::Config(
            "the etcd backend needs --etcd-endpoints (comma-separated client URLs)".to_owned(),
        ));
    }
    if config.lock_delay_ms > 0 {
        return Err(ServerError::Config(
            "--lock-delay-ms is not supported with the etcd backend: etcd does not say whether \
             a lease expired or was released, so the delay cannot be applied; use 0"
                .to_owned(),
        ));
    }
    let key_file = config.signing_key_file.as_deref().ok_or_else(|| {
        ServerError::Config(
            "the etcd backend needs --signing-key-file: every node must sign with the same \
             configured key (64 hex characters, mode 0600)"
                .to_owned(),
        )
    })?;
    let signer = keys::load_secret(key_file).map_err(ServerError::Key)?;
    let ring = keys::trusted_ring(&signer, &config.trust_key_files).map_err(ServerError::Key)?;
    let etcd = Etcd::connect(&EtcdConfig {
        endpoints: endpoints.clone(),
        prefix: prefix.clone(),
        request_timeout: *request_timeout,
    })
    .await?;
    let backend: Arc<dyn FencedStore> = Arc::new(EtcdStore::with_limits(
        etcd.clone(),
        config.store_limits,
        palisade_storage::WallClock::system(),
    ));
    let state = front.state(
        &config,
        Arc::new(EtcdIssuer::new(etcd, signer)),
        backend,
        Arc::new(Verifier::new(ring, config.token_cache)),
    );
    listen_and_serve(config.listen, state, async {}).await
}
