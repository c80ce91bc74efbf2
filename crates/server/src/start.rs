//! Starting a server: the settings checked once, then the backend's own start-up.

use crate::config::{BackendConfig, ServerConfig};
use crate::run::{Front, RunningServer, ServerError};

/// Checks the settings, then starts the backend the configuration names: the embedded
/// database (`embedded.rs`) or an etcd cluster (`cluster.rs`).
///
/// Nothing is written anywhere before the port is bound and (embedded) the data directory
/// is locked: a start refused for its settings, its directory or a port in use leaves no
/// trace.
pub async fn serve(config: ServerConfig) -> Result<RunningServer, ServerError> {
    if config.lock_delay_ms > config.limits.max_lock_delay_ms {
        return Err(ServerError::Config(format!(
            "--lock-delay-ms {} is above --max-lock-delay-ms {}: the default lock-delay must \
             be one an acquisition could choose",
            config.lock_delay_ms, config.limits.max_lock_delay_ms
        )));
    }
    let front = Front::prepare(&config)?;
    if let BackendConfig::Etcd { .. } = config.backend {
        #[cfg(feature = "etcd")]
        {
            let listener = crate::run::bind(&config).await?;
            let front = front.start(&config)?;
            return crate::cluster::serve(config, front, listener).await;
        }
        #[cfg(not(feature = "etcd"))]
        return Err(ServerError::Config(
            "this palisade was built without the etcd backend; rebuild with `--features etcd`"
                .to_owned(),
        ));
    }
    crate::embedded::serve(config, front).await
}
