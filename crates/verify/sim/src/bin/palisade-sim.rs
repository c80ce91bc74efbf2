//! Runs simulation seeds from the command line; see the crate docs.
//!
//! ```text
//! palisade-sim [--seeds N] [--first S] [--seed S] [--bug NAME] [--no-lockset-fence]
//!              [--epoch-block N]
//! ```
//! `--seed S` replays one seed and prints its trace, history and final state; otherwise
//! a sweep of N seeds (default 1000) starting at S (default 0) runs and every failing
//! seed is printed. Exits 1 when any seed failed.

use std::process::ExitCode;

use palisade_sim::{run, sweep, Bug, Config};

fn main() -> ExitCode {
    match main_inner() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("palisade-sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn main_inner() -> Result<bool, String> {
    let mut config = Config::default();
    let (mut seeds, mut first, mut one) = (1000u64, 0u64, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{arg} {v}: {e}"));
        match arg.as_str() {
            "--seeds" => seeds = number(value()?)?,
            "--first" => first = number(value()?)?,
            "--seed" => one = Some(number(value()?)?),
            "--bug" => config.bug = Some(value()?.parse::<Bug>()?),
            "--no-lockset-fence" => config.lockset_fences = false,
            "--epoch-block" => config.epoch_block = Some(number(value()?)?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if let Some(seed) = one {
        config.trace = true;
        let outcome = run(seed, &config);
        for line in &outcome.trace {
            println!("{line}");
        }
        for op in outcome.history.ops() {
            println!("{op}");
        }
        println!("final state: {:?}", outcome.final_state);
        println!("{:?}", outcome.scenario);
        println!("{:?}", outcome.stats);
        for note in &outcome.undecided {
            println!("undecided: {note}");
        }
        println!("{}", outcome.report());
        return Ok(outcome.passed());
    }
    let report = sweep(&config, first, seeds, false);
    for failure in &report.failures {
        println!("{}", failure.report());
    }
    for (seed, note) in &report.undecided {
        println!("seed {seed} undecided: {note}");
    }
    println!("{}", report.summary());
    Ok(report.failures.is_empty())
}
