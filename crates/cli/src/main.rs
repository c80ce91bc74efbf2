//! `palisade`: one binary for the server, the lock and store commands, and the demo.
//!
//! Thin by design: parse flags (each also settable by an environment variable; `serve`'s
//! also by a config file), build the pieces from the library crates, run. Logic lives in
//! the libraries. One module per command group; `exit.rs` holds the exit codes and the
//! one-line error messages every command shares (docs/cli.md).

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod admin_cmd;
mod auth_cmd;
mod config_file;
mod demo;
mod docs_cmd;
mod exit;
mod fence_cmd;
mod kv_cmd;
mod lock_cmd;
mod lock_run;
mod output;
mod protect;
mod raise_marks;
mod runtime;
mod serve_cmd;
mod target;
mod token_cmd;
mod verify_cmd;

use exit::Exit;
use target::Target;

#[derive(Parser)]
#[command(
    name = "palisade",
    version,
    about = "A lock service whose fencing tokens are enforced where the writes land"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format on stderr: `text` (one line per event, colours only on a terminal) or
    /// `json` (one JSON object per line). Which events: RUST_LOG (e.g. `debug`,
    /// `palisade_server=debug`; PALISADE_LOG is an older name for it), by default `info`
    /// for `serve` and `warn` for everything else.
    #[arg(long, env = "PALISADE_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"], global = true)]
    log_format: String,
}

#[derive(Subcommand)]
enum Command {
    /// Run a server node (issuer + fenced store).
    Serve(Box<serve_cmd::ServeArgs>),
    /// Acquire, renew, release and inspect locks; run a command under a lock.
    Lock {
        #[command(flatten)]
        target: Target,
        #[command(subcommand)]
        command: lock_cmd::LockCommand,
    },
    /// Read and write the fenced key-value store (every write needs a token).
    Kv {
        #[command(flatten)]
        target: Target,
        #[command(subcommand)]
        command: kv_cmd::KvCommand,
    },
    /// The barrier: make a namespace admit the holder's epoch now, fencing off every older
    /// holder before any data is written (`fence LOCK`); or show its high-water mark
    /// (`fence status LOCK`).
    Fence {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        args: fence_cmd::FenceArgs,
    },
    /// Ask the issuer about a token (is it genuine, current, its lease alive).
    Token {
        #[command(flatten)]
        target: Target,
        #[command(subcommand)]
        command: token_cmd::TokenCommand,
    },
    /// Print the issuer's public keys (GET /v1/keys), for verifying tokens offline.
    Keys {
        #[command(flatten)]
        target: Target,
    },
    /// Run the stale-leader story with real processes and show the timeline.
    Demo(demo::DemoArgs),
    /// Bearer keys for an auth file: make one, or hash one you have.
    Auth {
        #[command(subcommand)]
        command: auth_cmd::AuthCommand,
    },
    /// Offline maintenance of a data directory: backup, restore and signing keys (server
    /// stopped).
    Admin {
        #[command(subcommand)]
        command: admin_cmd::AdminCommand,
    },
    /// Measure Palisade (or Redis, PostgreSQL, etcd) under concurrent clients.
    Bench(palisade_bench::BenchArgs),
    /// One worker of the demo (started by `palisade demo`).
    #[command(hide = true)]
    DemoWorker(demo::WorkerArgs),
    /// Run a workload under injected faults and check the recorded history.
    ///
    /// Faults: pauses (SIGSTOP), server kills and restarts, delayed requests, dropped
    /// connections, partitions; on --topology etcd3 also etcd leader kills and pauses and
    /// a node cut off from etcd; --faults disk damages the embedded store's newest commit.
    /// Exit code 0: no violation; 1: violations found; 2: the run could not complete.
    /// See docs/verification.md.
    Verify(palisade_verify::VerifyArgs),
    /// One worker process of `palisade verify` (started by it).
    #[command(hide = true)]
    VerifyWorker(palisade_verify::WorkerArgs),
    /// The application holding the SQLite file of `palisade verify --target sqlite-gate`
    /// (started by it).
    #[command(hide = true)]
    VerifySqliteApp(palisade_verify::SqliteAppArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page palisade.1 (or write every page with --dir).
    Man(docs_cmd::ManArgs),
}

// mimalloc: the request path allocates and frees many small buffers (HTTP, JSON,
// tokens); the system allocator spent about a tenth of the server's CPU on them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = parse(std::env::args_os().collect());
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    };
    init_logging(&cli.log_format, default_level);
    if let Command::Serve(_) = cli.command {
        no_huge_pages();
    }
    let runtime = match &cli.command {
        Command::Serve(args) => args.runtime.build(),
        _ => runtime::default(),
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(Exit::Failure.code());
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let (code, line) = exit::report(&e);
            eprintln!("error: {line}");
            ExitCode::from(code)
        }
    }
}

/// The server opts out of transparent huge pages, as Redis does. The allocator asks for
/// them on its arena, and a 2 MiB page stays resident as long as one allocation on it
/// lives: with a million locks, about 12 MiB of the resident set after a restart was pages
/// held only that way. Best effort: where the kernel has no such switch, nothing changes.
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        tracing::debug!(error = %e, "transparent huge pages stay as the kernel has them");
    }
}

/// Hands the memory the start freed back to the system now. The start reads every lock's
/// state (~100 MB at a million locks) to build the lock table and frees it; the allocator
/// returns freed pages only at its next page allocation after a delay, which on an idle
/// server is the first housekeeping tick 10 s later. Called once, when serving begins.
pub(crate) fn return_freed_memory() {
    // SAFETY: `mi_collect` has no preconditions; it may be called from any thread at any
    // time (it only returns memory that is already free).
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// Logs go to stderr (stdout carries only the start-up line and command output), as text
/// or JSON lines, filtered by RUST_LOG, or PALISADE_LOG, or `default_level`. Colour codes
/// only when stderr is a terminal and NO_COLOR is not set.
fn init_logging(format: &str, default_level: &str) {
    use std::io::IsTerminal;
    let (filter, bad) = ["RUST_LOG", "PALISADE_LOG"]
        .iter()
        .find_map(|var| {
            let text = std::env::var(var).ok().filter(|t| !t.trim().is_empty())?;
            Some(match tracing_subscriber::EnvFilter::try_new(&text) {
                Ok(filter) => (filter, None),
                Err(e) => (
                    tracing_subscriber::EnvFilter::new(default_level),
                    Some(format!(
                        "{var}={text:?} is not a log filter ({e}); using {default_level}"
                    )),
                ),
            })
        })
        .unwrap_or_else(|| (tracing_subscriber::EnvFilter::new(default_level), None));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    if format == "json" {
        builder.json().with_ansi(false).init();
    } else {
        let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        builder.with_ansi(colour).init();
    }
    if let Some(message) = bad {
        tracing::warn!("{message}");
    }
}

/// Parses the command line; for `serve --config FILE`, with the file's settings below the
/// flags and environment. Usage errors exit 2 here, as clap does.
fn parse(argv: Vec<OsString>) -> Cli {
    let command = command();
    let mut matches = command.clone().get_matches_from(argv.clone());
    if let Some(("serve", given)) = matches.subcommand() {
        let serve = command
            .find_subcommand("serve")
            .expect("the serve subcommand is defined above");
        if let Some(path) = given.get_one::<std::path::PathBuf>("config") {
            let extra = config_file::flags_from_file(path, serve, given).unwrap_or_else(|e| {
                eprintln!("error: {e}");
                std::process::exit(Exit::Usage.code().into())
            });
            let mut full = argv;
            full.extend(extra);
            matches = command
                .clone()
                .try_get_matches_from(full)
                .unwrap_or_else(|e| {
                    let text = e.render().to_string();
                    let first = text.lines().next().unwrap_or_default();
                    eprintln!("{first} (from the config file {})", path.display());
                    std::process::exit(Exit::Usage.code().into())
                });
        }
        if let Some(("serve", given)) = matches.subcommand() {
            if given.get_flag("print_config") {
                print!("{}", config_file::render(serve, given));
                std::process::exit(0);
            }
        }
    }
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The command line's definition, with the exit codes in `--help`.
pub fn command() -> clap::Command {
    Cli::command().after_help(exit::summary())
}

/// Runs the command; the exit code, or the error that ends it.
async fn run(cli: Cli) -> anyhow::Result<u8> {
    let done = match cli.command {
        Command::Serve(args) => serve_cmd::run(*args).await,
        Command::Lock { target, command } => {
            return lock_cmd::run(target.connect()?, command).await
        }
        Command::Kv { target, command } => kv_cmd::run(target.connect()?, command).await,
        Command::Fence { target, args } => fence_cmd::run(target.connect()?, args).await,
        Command::Token { target, command } => token_cmd::run(target.connect()?, command).await,
        Command::Keys { target } => token_cmd::keys(target.connect()?).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Admin { command } => admin_cmd::run(command).await,
        Command::Auth { command } => auth_cmd::run(command),
        Command::DemoWorker(args) => demo::run_worker(args).await,
        Command::Verify(args) => verify_cmd::run(args).await,
        Command::VerifyWorker(args) => verify_cmd::run_worker(args).await,
        Command::VerifySqliteApp(args) => verify_cmd::run_sqlite_app(args).await,
        Command::Bench(args) => palisade_bench::run(args)
            .await
            .map(drop)
            .map_err(bench_failure),
        Command::Completions { shell } => docs_cmd::completions(shell),
        Command::Man(args) => docs_cmd::man(args),
    };
    done.map(|()| Exit::Ok.code())
}

/// Bench errors; a driver left out of this build names the feature of *this* crate
/// that brings it in.
fn bench_failure(err: palisade_bench::BenchError) -> anyhow::Error {
    match err {
        palisade_bench::BenchError::NotBuilt { target, feature } => {
            let feature = match feature {
                "peers" => "bench-peers",
                "peer-etcd" => "bench-etcd",
                other => other,
            };
            exit::Failure::new(
                Exit::Usage,
                format!(
                    "the {target:?} driver is not built into this palisade: rebuild it with \
                     `cargo install --locked --path crates/cli --features {feature}`"
                ),
            )
            .into()
        }
        palisade_bench::BenchError::Args(message) => {
            exit::Failure::new(Exit::Usage, message).into()
        }
        other => other.into(),
    }
}
