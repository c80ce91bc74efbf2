//! `palisade verify` and its hidden processes (a worker, the SQLite application): thin
//! wrappers over `palisade-verify`.
//!
//! Exit codes: 0 when the run completed and no checker found a violation, 1 when
//! violations were found, 2 when the run could not be completed. Everything the run
//! started has been stopped by the time the library returns, so exiting here at once
//! leaves nothing behind.

pub async fn run(args: palisade_verify::VerifyArgs) -> anyhow::Result<()> {
    match palisade_verify::run(args).await {
        Ok(outcome) if outcome.violations == 0 => Ok(()),
        Ok(outcome) => {
            eprintln!("verify: {} violation(s) found", outcome.violations);
            std::process::exit(1)
        }
        Err(e) => {
            eprintln!("error: verify could not complete: {e}");
            std::process::exit(2)
        }
    }
}

pub async fn run_worker(args: palisade_verify::WorkerArgs) -> anyhow::Result<()> {
    Ok(palisade_verify::run_worker(args).await?)
}

pub async fn run_sqlite_app(args: palisade_verify::SqliteAppArgs) -> anyhow::Result<()> {
    Ok(palisade_verify::run_sqlite_app(args).await?)
}
