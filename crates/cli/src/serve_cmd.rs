//! `palisade serve`: run a server node. Every flag is also an environment variable and a
//! key of the `--config` file (see `config_file.rs`); flags win over the environment,
//! which wins over the file.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::exit::{chain_text, Exit, Failure};

/// Where `serve` keeps its state (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// One redb file in --data-dir, one node.
    Embedded,
    /// Stateless nodes sharing an etcd cluster (a build with `--features etcd`).
    Etcd,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Read settings from this TOML file: each key is a flag of `serve` without its
    /// leading `--` (`data-dir = "/var/lib/palisade"`). Flags and environment variables
    /// override it. A commented sample: contrib/palisade.toml.
    #[arg(long, env = "PALISADE_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the settings in effect (config file, environment and flags combined) as a
    /// config file, and exit without starting.
    #[arg(long)]
    print_config: bool,
    /// Address to listen on: IP:PORT or HOST:PORT (port 0 picks a free port). A host name
    /// binds its first address; without --auth-file, every address it resolves to must be
    /// a loopback address.
    #[arg(
        help_heading = "Listening and storage",
        long,
        env = "PALISADE_LISTEN",
        default_value = "127.0.0.1:7700"
    )]
    listen: String,
    /// Also serve the hot routes (acquire, keepalive, release, and the store's get, put
    /// and delete) over RESP, the Redis protocol, on this address (IP:PORT or HOST:PORT):
    /// same authentication, TLS, limits and errors as HTTP (docs/api.md, "The hot routes
    /// over RESP"). Off unless given.
    #[arg(
        help_heading = "Listening and storage",
        long,
        env = "PALISADE_RESP_LISTEN",
        value_name = "ADDR"
    )]
    resp_listen: Option<String>,
    /// Directory holding the database and the key set: created if missing (mode 0700);
    /// an existing one must be empty or a Palisade data directory, anything else is
    /// refused and left untouched. With --backend etcd it holds only the node's epoch
    /// ledger (unless --etcd-epoch-ledger puts it elsewhere).
    #[arg(
        help_heading = "Listening and storage",
        long,
        env = "PALISADE_DATA_DIR",
        default_value = "./palisade-data"
    )]
    data_dir: PathBuf,
    #[command(flatten)]
    witness: crate::admin_cmd::WitnessArgs,
    /// After a lease expires without release, keep its lock ungrantable this long (ms).
    #[arg(
        help_heading = "Leases",
        long,
        env = "PALISADE_LOCK_DELAY_MS",
        default_value_t = palisade_server::DEFAULT_LOCK_DELAY_MS
    )]
    lock_delay_ms: u64,
    /// Longest lock-delay an acquisition may choose for its own lease (ms); a longer one
    /// is refused with quota_exceeded. After a crash (embedded backend) a lock whose lease
    /// chose a delay above --lock-delay-ms waits that much longer.
    #[arg(help_heading = "Leases", long, env = "PALISADE_MAX_LOCK_DELAY_MS", default_value_t = palisade_api::recipes::DEFAULT_MAX_LOCK_DELAY_MS)]
    max_lock_delay_ms: u64,
    /// Most sessions the embedded issuer keeps at once (each also counts as one lease of
    /// its principal's quota).
    #[arg(
        help_heading = "Leases",
        long,
        env = "PALISADE_MAX_SESSIONS",
        default_value_t = palisade_server::Limits::default().max_sessions
    )]
    max_sessions: usize,
    /// A released lock taken again within this many ms is granted without waiting for a
    /// disk write (its durable reservation still covers it). After a crash, the locks
    /// released within this window before it wait one TTL, like the locks that were held.
    /// Embedded backend only.
    #[arg(help_heading = "Leases", long, env = "PALISADE_IDLE_GRACE_MS", default_value_t = palisade_server::DEFAULT_IDLE_GRACE_MS)]
    idle_grace_ms: u64,
    /// Largest value accepted by the store, in bytes.
    #[arg(help_heading = "Fenced store", long, env = "PALISADE_MAX_VALUE_BYTES", default_value_t = palisade_server::DEFAULT_MAX_VALUE_BYTES)]
    max_value_bytes: usize,
    /// Gate policy per namespace: NAME=epoch|sequence or PREFIX*=epoch|sequence.
    /// Repeat the flag, or give a comma-separated list in the environment variable.
    #[arg(
        help_heading = "Fenced store",
        long = "policy",
        env = "PALISADE_POLICIES",
        value_delimiter = ','
    )]
    policies: Vec<String>,
    /// How many verified tokens to cache.
    #[arg(
        help_heading = "Fenced store",
        long,
        env = "PALISADE_TOKEN_CACHE",
        default_value_t = palisade_server::DEFAULT_TOKEN_CACHE
    )]
    token_cache: usize,
    /// Page cache of the embedded database, in MiB (the embedded backend only).
    #[arg(help_heading = "Fenced store", long, env = "PALISADE_DB_CACHE_MB", default_value_t = (palisade_storage::redb_backend::DEFAULT_CACHE_BYTES >> 20) as u64, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    db_cache_mb: u64,
    /// Where state lives: `embedded` (one redb file in --data-dir, one node) or `etcd`
    /// (several stateless nodes sharing an etcd cluster; needs a build with `--features
    /// etcd`, --etcd-endpoints and --signing-key-file). See docs/deployment.md.
    #[arg(help_heading = "Listening and storage", long, env = "PALISADE_BACKEND", value_enum, default_value_t = Backend::Embedded)]
    backend: Backend,
    /// etcd client URLs, comma-separated, e.g. http://10.0.0.1:2379,http://10.0.0.2:2379.
    #[arg(
        help_heading = "etcd backend",
        long,
        env = "PALISADE_ETCD_ENDPOINTS",
        value_delimiter = ','
    )]
    etcd_endpoints: Vec<String>,
    /// Prefix of every etcd key Palisade writes (must end with '/').
    #[arg(
        help_heading = "etcd backend",
        long,
        env = "PALISADE_ETCD_PREFIX",
        default_value = palisade_server::DEFAULT_ETCD_PREFIX
    )]
    etcd_prefix: String,
    /// Longest wait for one etcd call (ms); past it the request fails with 503
    /// storage_failed. Calls etcd never received are resent until then.
    #[arg(
        help_heading = "etcd backend",
        long,
        env = "PALISADE_ETCD_TIMEOUT_MS",
        default_value_t = palisade_server::DEFAULT_ETCD_TIMEOUT_MS
    )]
    etcd_timeout_ms: u64,
    /// Talk TLS to etcd, trusting the CA certificates in this PEM file; every
    /// --etcd-endpoints URL must then be https://.
    #[arg(
        help_heading = "etcd backend",
        long,
        env = "PALISADE_ETCD_CA_FILE",
        value_name = "FILE"
    )]
    etcd_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for etcd members started with --client-cert-auth; needs
    /// --etcd-key and --etcd-ca-file.
    #[arg(
        help_heading = "etcd backend",
        long,
        env = "PALISADE_ETCD_CERT",
        value_name = "FILE",
        requires = "etcd_key"
    )]
    etcd_cert: Option<PathBuf>,
    /// Private key (PEM) of --etcd-cert.
    #[arg(
        help_heading = "etcd backend",
        long,
        env = "PALISADE_ETCD_KEY",
        value_name = "FILE",
        requires = "etcd_cert"
    )]
    etcd_key: Option<PathBuf>,
    /// Authenticate to etcd as this user (etcd with `auth enable`); needs
    /// --etcd-password-file.
    #[arg(
        help_heading = "etcd backend",
        long,
        env = "PALISADE_ETCD_USER",
        requires = "etcd_password_file"
    )]
    etcd_user: Option<String>,
    /// File holding the etcd user's password (mode 0600: a file group or others may read
    /// is refused).
    #[arg(
        help_heading = "etcd backend",
        long,
        env = "PALISADE_ETCD_PASSWORD_FILE",
        value_name = "FILE",
        requires = "etcd_user"
    )]
    etcd_password_file: Option<PathBuf>,
    /// This node's epoch ledger, kept outside etcd (created if missing): a small fsynced
    /// file bounding every epoch the node hands out, raised before a token leaves it.
    /// After an etcd snapshot restore, `palisade admin etcd-raise --ledger FILE` reads
    /// every node's ledger to put epochs and marks above anything ever issued. Default:
    /// etcd-epoch-ledger.json in --data-dir. One node per ledger: a second node given the
    /// same file refuses to start. See docs/operations.md.
    #[arg(
        help_heading = "etcd backend",
        long,
        env = "PALISADE_ETCD_EPOCH_LEDGER",
        value_name = "FILE"
    )]
    etcd_epoch_ledger: Option<PathBuf>,
    /// Create the key set from this key file (64 hex characters, mode 0600) instead of a
    /// new random key: read only when there is no key set yet (DATA_DIR/signing-keys.json,
    /// or the one in etcd). With --backend etcd the first node needs it.
    #[arg(help_heading = "Signing keys", long, env = "PALISADE_SIGNING_KEY_FILE")]
    signing_key_file: Option<PathBuf>,
    /// Also accept tokens signed by this key: a file holding a public key in base64url (as
    /// GET /v1/keys shows it) or a secret key file. Repeat the flag for several keys.
    #[arg(
        help_heading = "Signing keys",
        long = "trust-key-file",
        env = "PALISADE_TRUST_KEY_FILES",
        value_delimiter = ','
    )]
    trust_key_files: Vec<PathBuf>,
    /// Turn authentication on: principals, their bearer-key digests and grants (TOML; see
    /// docs/security.md). Reloaded on SIGHUP. Without it every caller may do everything,
    /// so the server then listens only on loopback addresses.
    #[arg(
        help_heading = "Authentication and audit",
        long,
        env = "PALISADE_AUTH_FILE"
    )]
    auth_file: Option<PathBuf>,
    /// Listen on a non-loopback address without --auth-file anyway (warns on every start).
    #[arg(
        help_heading = "Authentication and audit",
        long,
        env = "PALISADE_INSECURE_NO_AUTH"
    )]
    insecure_no_auth: bool,
    /// Append an audit log (JSON lines) of authentication failures, permission denials,
    /// admin actions, leases released by others and stale-token rejections.
    #[arg(
        help_heading = "Authentication and audit",
        long,
        env = "PALISADE_AUDIT_LOG"
    )]
    audit_log: Option<PathBuf>,
    /// Size at which the audit log rotates to FILE.1 (MiB).
    #[arg(help_heading = "Authentication and audit", long, env = "PALISADE_AUDIT_LOG_MAX_MB", default_value_t = palisade_server::DEFAULT_AUDIT_LOG_MAX_BYTES >> 20, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    audit_log_max_mb: u64,
    /// Longest lease TTL a client may ask for (ms); a principal's max_ttl_ms may lower it.
    #[arg(help_heading = "Leases", long, env = "PALISADE_MAX_TTL_MS", default_value_t = palisade_server::Limits::default().max_ttl_ms, value_parser = clap::value_parser!(u64).range(50..))]
    max_ttl_ms: u64,
    /// Live leases one principal may hold at once (with --auth-file).
    #[arg(help_heading = "Quotas", long, env = "PALISADE_MAX_LEASES_PER_PRINCIPAL", default_value_t = palisade_server::Limits::default().max_leases_per_principal)]
    max_leases_per_principal: u32,
    /// Acquisitions one principal may have waiting at once (with --auth-file).
    #[arg(help_heading = "Quotas", long, env = "PALISADE_MAX_WAITERS_PER_PRINCIPAL", default_value_t = palisade_server::Limits::default().max_waiters_per_principal)]
    max_waiters_per_principal: u32,
    /// Acquisitions that may wait in line for one lock.
    #[arg(help_heading = "Quotas", long, env = "PALISADE_MAX_WAITERS_PER_LOCK", default_value_t = palisade_server::Limits::default().max_waiters_per_lock)]
    max_waiters_per_lock: u32,
    /// Locks the server keeps in memory at once; idle locks whose state is on disk make
    /// room, and a new lock that finds no room is refused with 429 quota_exceeded.
    #[arg(help_heading = "Quotas", long, env = "PALISADE_MAX_LOCKS", default_value_t = palisade_server::Limits::default().max_locks as u64, value_parser = clap::value_parser!(u64).range(1..))]
    max_locks: u64,
    /// Keys one namespace of the store may hold.
    #[arg(help_heading = "Fenced store", long, env = "PALISADE_MAX_KEYS_PER_NAMESPACE", default_value_t = palisade_storage::DEFAULT_MAX_KEYS_PER_NAMESPACE, value_parser = clap::value_parser!(u64).range(1..))]
    max_keys_per_namespace: u64,
    /// Bytes of keys plus values one namespace of the store may hold.
    #[arg(help_heading = "Fenced store", long, env = "PALISADE_MAX_BYTES_PER_NAMESPACE", default_value_t = palisade_storage::DEFAULT_MAX_BYTES_PER_NAMESPACE, value_parser = clap::value_parser!(u64).range(1..))]
    max_bytes_per_namespace: u64,
    /// How long an idempotency key is remembered (seconds); after it a request with the
    /// same key is applied afresh, and the record is purged.
    #[arg(help_heading = "Fenced store", long, env = "PALISADE_IDEMPOTENCY_RETENTION_S", default_value_t = palisade_storage::DEFAULT_IDEMPOTENCY_RETENTION.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    idempotency_retention_s: u64,
    /// Events kept for clients that resume an events stream with Last-Event-ID (GET
    /// /v1/events); a client that asks for an older one gets a `reset` event instead.
    #[arg(help_heading = "Events", long, env = "PALISADE_EVENTS_BUFFER", default_value_t = palisade_server::observe::DEFAULT_EVENTS_BUFFER as u64, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    events_buffer: u64,
    /// Events streams open at once; more are refused with 429 quota_exceeded.
    #[arg(help_heading = "Events", long, env = "PALISADE_MAX_EVENT_SUBSCRIBERS", default_value_t = palisade_server::observe::DEFAULT_MAX_SUBSCRIBERS as u64, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    max_event_subscribers: u64,
    /// Events streams one principal may have open at once (with --auth-file; a
    /// principal's max_event_subscribers may change it).
    #[arg(help_heading = "Quotas", long, env = "PALISADE_MAX_EVENT_SUBSCRIBERS_PER_PRINCIPAL", default_value_t = palisade_server::Limits::default().max_event_subscribers_per_principal)]
    max_event_subscribers_per_principal: u32,
    #[command(flatten)]
    transport: TransportArgs,
    #[command(flatten)]
    pub runtime: crate::runtime::RuntimeArgs,
}

/// How connections are accepted and served (see docs/security.md, "Limits on connections").
#[derive(Args)]
pub struct TransportArgs {
    /// Most connections open at once. At the cap, a new connection closes the one idle (or
    /// slow to send its request head) for longest; connections with a request in progress
    /// are never closed for it.
    #[arg(help_heading = "Connections", long, env = "PALISADE_MAX_CONNECTIONS", default_value_t = palisade_server::transport::DEFAULT_MAX_CONNECTIONS as u64, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections: u64,
    /// A request head (request line and headers; for a new connection also the TLS
    /// handshake) must arrive in full within this many ms, or the connection is closed.
    #[arg(help_heading = "Connections", long, env = "PALISADE_HEADER_TIMEOUT_MS", default_value_t = palisade_server::transport::DEFAULT_HEADER_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout_ms: u64,
    /// Close a keep-alive connection with no request in progress after this many ms.
    #[arg(help_heading = "Connections", long, env = "PALISADE_IDLE_TIMEOUT_MS", default_value_t = palisade_server::transport::DEFAULT_IDLE_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout_ms: u64,
    /// Largest request head (request line and headers) in bytes; larger ones get 431
    /// headers_too_large. At least 8192.
    #[arg(help_heading = "Connections", long, env = "PALISADE_MAX_HEADER_BYTES", default_value_t = palisade_server::transport::DEFAULT_MAX_HEADER_BYTES as u64, value_parser = clap::value_parser!(u64).range(8192..=1_048_576))]
    max_header_bytes: u64,
    /// On SIGTERM, requests in progress get this many ms to finish; then every connection
    /// is closed. Queued acquisitions are answered 503 at once.
    #[arg(help_heading = "Connections", long, env = "PALISADE_SHUTDOWN_GRACE_MS", default_value_t = palisade_server::transport::DEFAULT_SHUTDOWN_GRACE_MS)]
    shutdown_grace_ms: u64,
    /// Serve HTTPS with this certificate chain (PEM, leaf first); needs --tls-key.
    /// Reloaded, with the key, on SIGHUP.
    #[arg(
        help_heading = "TLS",
        long,
        env = "PALISADE_TLS_CERT",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(
        help_heading = "TLS",
        long,
        env = "PALISADE_TLS_KEY",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: require every client to present a certificate signed by a CA in this
    /// PEM file. Needs --tls-cert.
    #[arg(
        help_heading = "TLS",
        long,
        env = "PALISADE_TLS_CLIENT_CA",
        requires = "tls_cert"
    )]
    tls_client_ca: Option<PathBuf>,
}

impl TransportArgs {
    fn config(self) -> anyhow::Result<palisade_server::TransportConfig> {
        use std::time::Duration;
        let tls = match (self.tls_cert, self.tls_key) {
            (Some(cert_file), Some(key_file)) => Some(palisade_server::TlsConfig {
                cert_file,
                key_file,
                client_ca_file: self.tls_client_ca,
            }),
            _ => None,
        };
        Ok(palisade_server::TransportConfig {
            max_connections: usize::try_from(self.max_connections)
                .context("--max-connections is too large for this machine")?,
            header_timeout: Duration::from_millis(self.header_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            max_header_bytes: usize::try_from(self.max_header_bytes)
                .context("--max-header-bytes is too large for this machine")?,
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
            tls,
        })
    }
}

impl ServeArgs {
    /// The server's settings from the flags, with `--listen` (and `--resp-listen`)
    /// already resolved. The one place flags become a [`palisade_server::ServerConfig`]:
    /// every default of a flag is the server's own (checked by
    /// `no_flags_give_the_servers_defaults`).
    fn into_config(
        self,
        listen: palisade_server::listen::ListenAddrs,
        resp_listen: Option<palisade_server::listen::ListenAddrs>,
    ) -> anyhow::Result<palisade_server::ServerConfig> {
        let policies =
            palisade_server::NamespacePolicies::parse(self.policies.iter().map(String::as_str))
                .map_err(anyhow::Error::msg)
                .context("bad --policy")?;
        let mut config = palisade_server::ServerConfig::new(listen.bind, self.data_dir);
        config.witness = self.witness.choice();
        config.listen_resolved = listen.all;
        if let Some(resp) = resp_listen {
            config.resp_listen = Some(resp.bind);
            config.listen_resolved.extend(resp.all);
        }
        config.lock_delay_ms = self.lock_delay_ms;
        config.idle_grace_ms = self.idle_grace_ms;
        config.max_value_bytes = self.max_value_bytes;
        config.policies = policies;
        config.token_cache = self.token_cache;
        config.db_cache_bytes = usize::try_from(self.db_cache_mb * 1024 * 1024)
            .context("--db-cache-mb is too large for this machine")?;
        config.signing_key_file = self.signing_key_file;
        config.trust_key_files = self.trust_key_files;
        config.transport = self.transport.config()?;
        config.auth_file = self.auth_file;
        config.insecure_no_auth = self.insecure_no_auth;
        config.audit_log = self.audit_log;
        config.audit_log_max_bytes = self.audit_log_max_mb * 1024 * 1024;
        config.limits = palisade_server::Limits {
            max_ttl_ms: self.max_ttl_ms,
            max_leases_per_principal: self.max_leases_per_principal,
            max_waiters_per_principal: self.max_waiters_per_principal,
            max_waiters_per_lock: self.max_waiters_per_lock,
            max_locks: usize::try_from(self.max_locks).context("--max-locks is too large")?,
            max_lock_delay_ms: self.max_lock_delay_ms,
            max_sessions: self.max_sessions,
            max_event_subscribers_per_principal: self.max_event_subscribers_per_principal,
        };
        config.store_limits = palisade_storage::StoreLimits {
            max_keys_per_namespace: self.max_keys_per_namespace,
            max_bytes_per_namespace: self.max_bytes_per_namespace,
            idempotency_retention: std::time::Duration::from_secs(self.idempotency_retention_s),
        };
        config.events_buffer =
            usize::try_from(self.events_buffer).context("--events-buffer is too large")?;
        config.max_event_subscribers = usize::try_from(self.max_event_subscribers)
            .context("--max-event-subscribers is too large")?;
        if self.backend == Backend::Etcd {
            config.backend = palisade_server::BackendConfig::Etcd {
                endpoints: self.etcd_endpoints,
                prefix: self.etcd_prefix,
                request_timeout: std::time::Duration::from_millis(self.etcd_timeout_ms),
                epoch_ledger: self.etcd_epoch_ledger,
                access: Box::new(palisade_server::EtcdAccess {
                    ca_file: self.etcd_ca_file,
                    cert_file: self.etcd_cert,
                    key_file: self.etcd_key,
                    user: self.etcd_user,
                    password_file: self.etcd_password_file,
                }),
            };
        }
        Ok(config)
    }
}

/// Runs `palisade serve` until SIGINT or SIGTERM.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.print_config {
        // Printed by `main`, which has the parsed flags; nothing to start.
        return Ok(());
    }
    let listen = tokio::task::spawn_blocking({
        let text = args.listen.clone();
        move || palisade_server::listen::resolve(&text)
    })
    .await
    .context("resolving --listen")?
    .map_err(|e| Failure::new(Exit::Usage, e))?;
    let resp_listen = match args.resp_listen.clone() {
        Some(text) => Some(
            tokio::task::spawn_blocking(move || palisade_server::listen::resolve(&text))
                .await
                .context("resolving --resp-listen")?
                .map_err(|e| Failure::new(Exit::Usage, format!("--resp-listen: {e}")))?,
        ),
        None => None,
    };
    let config = args.into_config(listen, resp_listen)?;
    let server = palisade_server::serve(config)
        .await
        .map_err(start_failure)?;
    crate::return_freed_memory();
    // Scripts and tests read this line to learn the URL (https:// with TLS) and port.
    // A reader that closed stdout after the first line (most do) is no error: the server
    // serves on.
    let started = format!(
        "{}\n{}\n",
        palisade_api::listening::line(&server.url(), server.resp_url().as_deref()),
        palisade_api::listening::dashboard_line(&server.url())
    );
    crate::output::write_stdout(started.as_bytes())?;
    server.run_until_signal().await?;
    Ok(())
}

/// A refused start: bad settings are usage errors (exit 2), the rest (a data directory
/// refused or in use, a port in use, a damaged database) plain failures (exit 1).
fn start_failure(err: palisade_server::ServerError) -> Failure {
    let exit = match err {
        palisade_server::ServerError::Config(_) | palisade_server::ServerError::Tls(_) => {
            Exit::Usage
        }
        _ => Exit::Failure,
    };
    Failure::new(exit, chain_text(&err))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    /// `palisade serve` with no flags runs with exactly the server's own defaults: a flag's
    /// default is never a second copy that could drift from `ServerConfig::new`'s.
    #[test]
    fn no_flags_give_the_servers_defaults() {
        let args = Serve::try_parse_from(["serve"])
            .expect("no flags parse")
            .args;
        let listen = palisade_server::listen::resolve(&args.listen).expect("the default");
        let (bind, all) = (listen.bind, listen.all.clone());
        let data_dir = args.data_dir.clone();
        let config = args.into_config(listen, None).expect("a config");
        let mut expected = palisade_server::ServerConfig::new(bind, data_dir);
        expected.listen_resolved = all;
        assert_eq!(format!("{config:#?}"), format!("{expected:#?}"));
    }

    /// Flags reach the settings they name (a few of each kind: a number, a size in MiB,
    /// a list, the backend with its own settings).
    #[test]
    fn flags_reach_their_settings() {
        let args = Serve::try_parse_from([
            "serve",
            "--lock-delay-ms",
            "250",
            "--db-cache-mb",
            "3",
            "--policy",
            "audit=sequence",
            "--backend",
            "etcd",
            "--etcd-endpoints",
            "http://127.0.0.1:2379,http://127.0.0.1:22379",
            "--etcd-timeout-ms",
            "700",
        ])
        .expect("the flags parse")
        .args;
        let listen = palisade_server::listen::resolve(&args.listen).expect("the default");
        let config = args.into_config(listen, None).expect("a config");
        assert_eq!(config.lock_delay_ms, 250);
        assert_eq!(config.db_cache_bytes, 3 << 20);
        assert_eq!(
            config.policies.policy("audit"),
            palisade_core::gate::Policy::Sequence
        );
        match config.backend {
            palisade_server::BackendConfig::Etcd {
                endpoints,
                prefix,
                request_timeout,
                ..
            } => {
                assert_eq!(endpoints.len(), 2);
                assert_eq!(prefix, palisade_server::DEFAULT_ETCD_PREFIX);
                assert_eq!(request_timeout, std::time::Duration::from_millis(700));
            }
            other => panic!("expected the etcd backend, got {other:?}"),
        }
    }
}
