//! `palisade`: one binary for the server, the lock and store commands, and the demo.
//!
//! Thin by design: parse flags (each also settable by an environment variable), build
//! the pieces from the library crates, run. Logic lives in the libraries.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

mod demo;
mod kv_cmd;
mod lock_cmd;

#[derive(Parser)]
#[command(
    name = "palisade",
    version,
    about = "A lock service whose fencing tokens are enforced where the writes land"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (issuer + fenced store) on one node.
    Serve(ServeArgs),
    /// Acquire, renew, release and inspect locks.
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
    /// Run the stale-leader story with real processes and show the timeline.
    Demo(demo::DemoArgs),
    /// One worker of the demo (started by `palisade demo`).
    #[command(hide = true)]
    DemoWorker(demo::WorkerArgs),
}

#[derive(Args)]
struct Target {
    /// Base URL of the Palisade server.
    #[arg(
        long,
        env = "PALISADE_SERVER",
        default_value = "http://127.0.0.1:7700",
        global = true
    )]
    server: String,
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "PALISADE_LISTEN", default_value = "127.0.0.1:7700")]
    listen: SocketAddr,
    /// Directory holding the database file and the issuer key.
    #[arg(long, env = "PALISADE_DATA_DIR", default_value = "./palisade-data")]
    data_dir: PathBuf,
    /// After a lease expires without release, keep its lock ungrantable this long (ms).
    #[arg(long, env = "PALISADE_LOCK_DELAY_MS", default_value_t = 0)]
    lock_delay_ms: u64,
    /// Largest value accepted by the store, in bytes.
    #[arg(long, env = "PALISADE_MAX_VALUE_BYTES", default_value_t = 1024 * 1024)]
    max_value_bytes: usize,
    /// Gate policy per namespace: NAME=epoch|sequence or PREFIX*=epoch|sequence.
    /// Repeat the flag, or give a comma-separated list in the environment variable.
    #[arg(long = "policy", env = "PALISADE_POLICIES", value_delimiter = ',')]
    policies: Vec<String>,
    /// How many verified tokens to cache.
    #[arg(long, env = "PALISADE_TOKEN_CACHE", default_value_t = 65_536)]
    token_cache: usize,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PALISADE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Lock { target, command } => lock_cmd::run(&target.server, command).await,
        Command::Kv { target, command } => kv_cmd::run(&target.server, command).await,
        Command::Demo(args) => demo::run(args).await,
        Command::DemoWorker(args) => demo::run_worker(args).await,
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let policies =
        palisade_server::NamespacePolicies::parse(args.policies.iter().map(String::as_str))
            .map_err(anyhow::Error::msg)
            .context("bad --policy")?;
    let mut config = palisade_server::ServerConfig::new(args.listen, args.data_dir);
    config.lock_delay_ms = args.lock_delay_ms;
    config.max_value_bytes = args.max_value_bytes;
    config.policies = policies;
    config.token_cache = args.token_cache;
    let server = palisade_server::serve(config).await?;
    // Scripts and tests read this line to learn the port.
    println!("palisade listening on http://{}", server.addr());
    server.run_until_signal().await?;
    Ok(())
}
