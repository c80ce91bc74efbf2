//! After the run: merge the workers' histories, write every artefact to `--out`, run the
//! checkers, print the summary and write the HTML report.
//!
//! Files written:
//! - `history.jsonl`: the merged history, in the checker crate's format;
//! - `final.json`: the store's final state;
//! - `faults.jsonl`: one line per injected fault;
//! - `summary.json`: counts and verdicts ([`Summary`]);
//! - `report.html`: the self-contained report with the timeline;
//! - `server.log` (embedded), `etcd.log` and `node0.log`.. (etcd3), `workers/`: raw
//!   material for debugging a run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_checker::{check_all, FinalState, Op, OpKind, Outcome as OpOutcome};

use crate::args::{GateLang, Target, Topology, VerifyArgs};
use crate::nemesis::FaultRecord;
use crate::procs::Reaped;
use crate::record::merge;
use crate::run::Plan;
use crate::summary::{RunFacts, Summary};
use crate::{report, Outcome, VerifyError};

/// What the run produced, before judging.
pub struct Collected {
    pub history_files: Vec<PathBuf>,
    pub faults: Vec<FaultRecord>,
    pub restarts: Vec<u64>,
    pub final_state: FinalState,
    pub reaped: Reaped,
    /// One line per process of the deployment.
    pub description: Vec<String>,
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), VerifyError> {
    std::fs::write(path, bytes)
        .map_err(|e| VerifyError::io(format!("cannot write {}", path.display()), e))
}

/// The command line that repeats this run's schedule.
fn command(args: &VerifyArgs, plan: &Plan) -> String {
    let mut cmd = String::from("palisade verify");
    if plan.topology != Topology::Embedded {
        cmd.push_str(&format!(" --topology {}", plan.topology.as_str()));
    }
    if args.target != Target::Palisade {
        cmd.push_str(&format!(" --target {}", args.target.as_str()));
    }
    cmd.push_str(&format!(
        " --time {} --workers {} --seed {} --workload {} --faults {} --ttl-ms {}",
        args.time,
        args.workers,
        plan.seed,
        args.workload.as_str(),
        args.faults,
        args.ttl_ms
    ));
    if args.auth {
        cmd.push_str(" --auth");
    }
    if args.unsafe_db {
        cmd.push_str(" --unsafe-db");
    }
    if args.gate_lang != GateLang::Rust {
        cmd.push_str(&format!(
            " --gate-lang {} --python {}",
            args.gate_lang.as_str(),
            args.python.display()
        ));
    }
    cmd
}

/// How the workers reach the nodes, for the summary and the report.
fn client_note(plan: &Plan, args: &VerifyArgs, nodes: usize) -> String {
    let lock = if args.target.uses_etcd_lock() {
        "etcd's lock recipe over etcd's JSON gateway"
    } else {
        "palisade-client"
    };
    let lock = if args.auth {
        format!("{lock}, each with its own principal's key (an auth file is on)")
    } else {
        lock.to_owned()
    };
    if nodes <= 1 && plan.topology == Topology::Embedded {
        return format!(
            "workers: {} processes using {lock}, one proxy each to the server",
            args.workers
        );
    }
    format!(
        "workers: {} processes using {lock}, spread over the {} nodes (worker i starts with \
         node (i-1) mod {}); failover is the workers' own (the client has none yet): on a \
         transport error or a 5xx the same call goes to the next node, fenced writes carry \
         an Idempotency-Key kept across attempts, and an operation with an unanswered \
         attempt is recorded as unknown",
        args.workers, nodes, nodes
    )
}

/// Merges, checks, reports. Violations are a verdict, not an error.
pub async fn judge(
    args: &VerifyArgs,
    plan: &Plan,
    collected: Collected,
    out: &Path,
) -> Result<Outcome, VerifyError> {
    let seed = plan.seed;
    let mut notes = Vec::new();
    if let Some((id, why)) = collected.reaped.failed.first() {
        return Err(VerifyError::Worker(format!(
            "worker {id} failed ({why}); see {}",
            out.join("workers").join(format!("w{id}.log")).display()
        )));
    }
    if !collected.reaped.killed.is_empty() {
        notes.push(format!(
            "workers {:?} were still running at the end and were killed; their last operations are recorded as unknown",
            collected.reaped.killed
        ));
    }
    let markers = collected.restarts.iter().map(|&t| {
        let mut op = Op::new(0, OpKind::Restart, t);
        op.outcome = OpOutcome::Info;
        op
    });
    let (history, merge_notes) = merge(&collected.history_files, markers.collect())?;
    if merge_notes.unreadable_lines > 0 {
        notes.push(format!(
            "{} unreadable history line(s) skipped",
            merge_notes.unreadable_lines
        ));
    }

    let mut jsonl = Vec::new();
    history.to_jsonl(&mut jsonl)?;
    write_file(&out.join("history.jsonl"), &jsonl)?;
    let mut final_json = Vec::new();
    collected.final_state.to_json(&mut final_json)?;
    write_file(&out.join("final.json"), &final_json)?;
    let mut faults_jsonl = String::new();
    for f in &collected.faults {
        let line = serde_json::to_string(f)
            .map_err(|e| VerifyError::Internal(format!("cannot encode a fault: {e}")))?;
        faults_jsonl.push_str(&line);
        faults_jsonl.push('\n');
    }
    write_file(&out.join("faults.jsonl"), faults_jsonl.as_bytes())?;

    let budget = Duration::from_secs(args.check_secs);
    let (history, reports) = {
        let final_state = collected.final_state.clone();
        tokio::task::spawn_blocking(move || {
            let reports = check_all(&history, &final_state, budget);
            (history, reports)
        })
        .await
        .map_err(|e| VerifyError::Internal(format!("the checkers panicked: {e}")))?
    };

    let nodes = match plan.topology {
        Topology::Embedded => 1,
        Topology::Etcd3 => 3,
    };
    let mut deployment = collected.description.clone();
    deployment.push(client_note(plan, args, nodes));
    let facts = RunFacts {
        command: command(args, plan),
        workload: args.workload.as_str().to_owned(),
        topology: plan.topology.as_str().to_owned(),
        target: args.target.as_str().to_owned(),
        deployment,
        seed,
        time_secs: args.time,
        workers: args.workers,
        ttl_ms: args.ttl_ms,
        notes,
    };
    let summary = Summary::new(facts, &history, &collected.faults, &reports);
    let json = serde_json::to_vec_pretty(&summary)
        .map_err(|e| VerifyError::Internal(format!("cannot encode the summary: {e}")))?;
    write_file(&out.join("summary.json"), &json)?;
    let html = report::render(&summary, &history, &collected.faults, &reports);
    let report_path = out.join("report.html");
    write_file(&report_path, html.as_bytes())?;

    print!("{}", summary.render());
    println!("report: {}", report_path.display());
    Ok(Outcome {
        violations: summary.violations,
        lost_updates: summary.lost_updates,
        summary,
    })
}
