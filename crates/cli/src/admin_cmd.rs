//! `palisade admin`: offline maintenance of a data directory (the server must be stopped;
//! every such command refuses to touch a database a running server has open), and
//! `raise-marks`, which brings restored databases of the gates back above the issuer
//! (`raise_marks.rs`).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use palisade_datadir::keys::{self, offline};
use palisade_datadir::recovery::{self, RestoreOptions, DEFAULT_EPOCH_GAP};

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Copy the database into a new backup file (one consistent snapshot) and print the
    /// backup's metadata as JSON. With --server, of a running server (admins only; the
    /// key and TLS flags are those of the other client commands), which keeps serving;
    /// without it, of the stopped server of --data-dir.
    Backup(BackupArgs),
    /// Put a backup in place (server stopped) with every lock's epoch counter and every
    /// namespace's high-water mark raised above every epoch that may have been issued, so
    /// that no epoch is issued twice and no old token is admitted again. Prints a JSON
    /// report; warnings go to stderr. See docs/operations.md.
    Restore(RestoreArgs),
    /// After a PostgreSQL, Redis or SQLite database a gate protects was restored (or a
    /// replica promoted): raise its fence marks to the issuer's bound of every lock, in one
    /// transaction per database, so that no token it had fenced out passes again. Prints a
    /// JSON report. See docs/protecting-your-database.md.
    RaiseMarks(crate::raise_marks::RaiseMarksArgs),
    /// Protect a PostgreSQL table inside the database: from now on PostgreSQL itself
    /// refuses every INSERT, UPDATE, DELETE or TRUNCATE on it unless a gate (of any
    /// language) admitted a token for --lock earlier in the same transaction, so a writer
    /// that skips the gate is refused with the lock named. Idempotent. Prints JSON. See
    /// docs/protecting-your-database.md.
    Protect(crate::protect::ProtectArgs),
    /// Remove a table's protection (`admin protect`): its writes are no longer checked.
    Unprotect(crate::protect::UnprotectArgs),
    /// The issuer's signing keys (server stopped; a running server's change through
    /// /v1/admin/keys). See docs/security.md.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// After an etcd snapshot restore (nodes stopped): raise etcd's epoch floor above
    /// every epoch any node ever handed out, read from the nodes' epoch ledgers
    /// (`serve --etcd-epoch-ledger`), so that no epoch is issued twice and no token from
    /// before the restore is admitted again. Never lowers the floor; safe to run twice.
    /// Prints a JSON report. See docs/operations.md.
    #[cfg(feature = "etcd")]
    EtcdRaise(EtcdRaiseArgs),
}

#[cfg(feature = "etcd")]
#[derive(Args)]
pub struct EtcdRaiseArgs {
    /// etcd client URLs, comma-separated (plain http; run it where etcd's client port
    /// answers without TLS or user, e.g. on a member).
    #[arg(
        long,
        env = "PALISADE_ETCD_ENDPOINTS",
        value_delimiter = ',',
        required = true
    )]
    etcd_endpoints: Vec<String>,
    /// Prefix of the deployment's etcd keys.
    #[arg(long, env = "PALISADE_ETCD_PREFIX", default_value = "/palisade/")]
    etcd_prefix: String,
    /// Longest wait for one etcd call (ms).
    #[arg(long, default_value_t = 5000)]
    etcd_timeout_ms: u64,
    /// A node's epoch ledger (its --etcd-epoch-ledger file). Give every node's: a
    /// missing or unreadable file is an error, since the epochs of that node would be
    /// unknown. Repeat the flag for several.
    #[arg(long = "ledger", value_name = "FILE")]
    ledgers: Vec<PathBuf>,
    /// A bound you know: no epoch above N was ever handed out. For a node whose ledger
    /// is lost; the floor goes above the larger of this and every ledger's ceiling.
    #[arg(long, value_name = "N")]
    at_least: Option<u64>,
}

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Print every key of the set with its state and times, as JSON.
    List(KeysArgs),
    /// Make a new key active; the active key keeps verifying its tokens until retired.
    /// With the key set lost or damaged, start a new one: every token issued before
    /// stops verifying.
    Rotate(KeysArgs),
    /// Retire a verifying key: its tokens answer invalid_token from the next start on.
    Retire {
        /// The key's id (as `palisade admin keys list` shows it).
        key_id: String,
        #[command(flatten)]
        args: KeysArgs,
    },
}

#[derive(Args)]
pub struct KeysArgs {
    /// Data directory of the stopped server.
    #[arg(long, env = "PALISADE_DATA_DIR", default_value = "./palisade-data")]
    data_dir: PathBuf,
}

#[derive(Args)]
pub struct BackupArgs {
    /// Data directory of the stopped server (without --server).
    #[arg(long, env = "PALISADE_DATA_DIR", default_value = "./palisade-data")]
    data_dir: PathBuf,
    /// Back up this running server instead (its base URL), over the API.
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    #[command(flatten)]
    connection: crate::target::Connection,
    /// Backup file to create (must not exist).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct RestoreArgs {
    /// Data directory of the stopped server (created if missing).
    #[arg(long, env = "PALISADE_DATA_DIR", default_value = "./palisade-data")]
    data_dir: PathBuf,
    #[command(flatten)]
    witness: WitnessArgs,
    /// Backup file made by `palisade admin backup`.
    #[arg(long)]
    from: PathBuf,
    /// A bound you know: no epoch above N was ever issued by this service. Needed for a
    /// safe restore when the database being replaced is lost or unreadable and the gap
    /// may not cover what was issued since the ledger's last update.
    #[arg(long, value_name = "N")]
    epoch_floor: Option<u64>,
    /// Margin added above the highest known epoch.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_EPOCH_GAP)]
    epoch_gap: u64,
}

/// Where the data directory's witness is: the same flags for `serve` and `admin restore`.
#[derive(Debug, clap::Args)]
pub struct WitnessArgs {
    /// The witness file: the newest commit and an upper bound of every epoch the store
    /// wrote, kept outside the data directory, so that a directory put back from an older
    /// copy is refused instead of issuing epochs again. Default: DATA_DIR.witness, beside
    /// the data directory (on another volume when the data directory is a volume of its
    /// own). It must be outside the data directory; one server per witness.
    #[arg(
        help_heading = "Listening and storage",
        long,
        env = "PALISADE_WITNESS",
        value_name = "PATH",
        conflicts_with = "no_witness"
    )]
    witness: Option<PathBuf>,
    /// Keep no witness: a data directory put back from an older copy then serves, issues
    /// epochs a second time and admits tokens it had fenced out.
    #[arg(
        help_heading = "Listening and storage",
        long,
        env = "PALISADE_NO_WITNESS"
    )]
    no_witness: bool,
}

impl WitnessArgs {
    pub fn choice(&self) -> palisade_datadir::data_dir::Witness {
        use palisade_datadir::data_dir::Witness;
        match (&self.witness, self.no_witness) {
            (_, true) => Witness::Off,
            (Some(path), false) => Witness::At(path.clone()),
            (None, false) => Witness::Beside,
        }
    }
}

pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::RaiseMarks(args) => crate::raise_marks::run(args).await?,
        AdminCommand::Protect(args) => crate::protect::protect(args).await?,
        AdminCommand::Unprotect(args) => crate::protect::unprotect(args).await?,
        AdminCommand::Backup(BackupArgs {
            server: Some(server),
            connection,
            out,
            ..
        }) => {
            let connected = connection.connect(&server)?;
            let file = connected
                .client
                .backup_to(&out)
                .await
                .map_err(|e| connected.fail(e))?;
            // Read back what was written: a file that does not open as a backup is an
            // error here, not at restore time.
            let info = palisade_storage::redb_backend::offline::read_backup_info(&out)?;
            anyhow::ensure!(
                info.backup_id == file.backup_id,
                "{} holds backup {}, not the backup {} the server sent",
                out.display(),
                info.backup_id,
                file.backup_id
            );
            println!("{}", serde_json::to_string_pretty(&info)?);
            eprintln!(
                "backup {} of {server} written to {} ({} bytes, epochs up to {}); the key set \
                 is not in it (docs/operations.md)",
                info.backup_id,
                out.display(),
                file.bytes,
                info.epoch_bound
            );
        }
        AdminCommand::Backup(args) => {
            let info = recovery::backup(&args.data_dir, &args.out)?;
            println!("{}", serde_json::to_string_pretty(&info)?);
            eprintln!(
                "backup {} of {} written to {} (epochs up to {})",
                info.backup_id,
                args.data_dir.display(),
                args.out.display(),
                info.epoch_bound
            );
        }
        AdminCommand::Restore(args) => {
            let options = RestoreOptions {
                from: args.from,
                epoch_floor: args.epoch_floor,
                epoch_gap: args.epoch_gap,
                witness: args.witness.choice().path(&args.data_dir)?,
            };
            let report = recovery::restore(&args.data_dir, &options)?;
            for warning in &report.warnings {
                eprintln!("WARNING: {warning}");
            }
            println!("{}", serde_json::to_string_pretty(&report)?);
            eprintln!(
                "restored backup {} into {}: every known lock continues at epoch {}, and every \
                 token issued before now is refused by the store",
                report.backup.backup_id,
                args.data_dir.display(),
                report.next_epoch
            );
        }
        AdminCommand::Keys { command } => keys_command(command)?,
        #[cfg(feature = "etcd")]
        AdminCommand::EtcdRaise(args) => etcd_raise(args).await?,
    }
    Ok(())
}

#[cfg(feature = "etcd")]
async fn etcd_raise(args: EtcdRaiseArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    use palisade_etcd::{Etcd, EtcdConfig, LedgerFile};

    anyhow::ensure!(
        !args.ledgers.is_empty() || args.at_least.is_some(),
        "give every node's --ledger FILE (or --at-least N when they are lost)"
    );
    let mut bound = args.at_least.unwrap_or(0);
    let mut read = Vec::new();
    for path in &args.ledgers {
        let file = LedgerFile::read(path)?.with_context(|| {
            format!(
                "epoch ledger {} does not exist: without it the epochs of its node are \
                 unknown (if it is lost, give --at-least N with a bound you know)",
                path.display()
            )
        })?;
        anyhow::ensure!(
            file.prefix == args.etcd_prefix,
            "epoch ledger {} belongs to etcd prefix {:?}, not {:?}",
            path.display(),
            file.prefix,
            args.etcd_prefix
        );
        bound = bound.max(file.ceiling);
        read.push(serde_json::json!({
            "ledger": path.display().to_string(),
            "ceiling": file.ceiling,
            "revision": file.revision,
            "updated_at_unix": file.updated_at_unix,
        }));
    }
    let mut config = EtcdConfig::new(args.etcd_endpoints);
    config.prefix = args.etcd_prefix;
    config.request_timeout = std::time::Duration::from_millis(args.etcd_timeout_ms);
    let etcd = Etcd::connect(&config).await?;
    let raised = palisade_etcd::ledger::raise_floor(&etcd, bound).await?;
    let report = serde_json::json!({
        "bound": bound,
        "previous_floor": raised.previous,
        "floor": raised.floor,
        "ledgers": read,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    eprintln!(
        "etcd's epoch floor is {}: every lock continues above it, and every token below \
         it is refused by the store",
        raised.floor
    );
    Ok(())
}

fn print_set(set: &keys::KeySet) -> anyhow::Result<()> {
    let body = palisade_api::wire::AdminKeys {
        active: set.active().key_id.clone(),
        keys: keys::views(set),
    };
    // Through a `Value` (sorted keys): the output this command has always printed.
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::to_value(body)?)?
    );
    Ok(())
}

fn keys_command(command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::List(args) => print_set(&offline::list(&args.data_dir)?)?,
        KeysCommand::Rotate(args) => {
            let rotated = offline::rotate(&args.data_dir, palisade_datadir::now_unix())?;
            print_set(&rotated.set)?;
            let active = &rotated.set.active().key_id;
            match (&rotated.previous, &rotated.started_over) {
                (Some(previous), _) => eprintln!(
                    "key {active} is active; {previous} keeps verifying its tokens until you \
                     retire it (palisade admin keys retire {previous})"
                ),
                (None, Some(kept)) => {
                    eprintln!(
                        "WARNING: started a new key set with key {active}: every token issued \
                         before no longer verifies, and its holders must acquire again"
                    );
                    if let Some(kept) = kept {
                        eprintln!("the unreadable key file was kept as {kept}");
                    }
                }
                (None, None) => eprintln!("key {active} is active"),
            }
        }
        KeysCommand::Retire { key_id, args } => {
            let (set, changed) =
                offline::retire(&args.data_dir, &key_id, palisade_datadir::now_unix())?;
            print_set(&set)?;
            if changed {
                eprintln!("key {key_id} retired: its tokens answer invalid_token");
            } else {
                eprintln!("key {key_id} was already retired; nothing changed");
            }
        }
    }
    Ok(())
}
