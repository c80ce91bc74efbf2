//! CI smoke test of `palisade bench`: a few seconds of each Palisade job against a fresh
//! server, asserting only that every run completes with zero errors (never a timing: CI
//! machines are shared and noisy).
//!
//! The server runs in this test process (the `palisade-server` library on a free port in
//! a temp dir): the bench crate cannot name the `palisade` binary of another package,
//! and the server is the same code either way.

use clap::Parser;
use palisade_bench::{BenchArgs, Job};
use palisade_server::{serve, ServerConfig};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn args(url: &str, extra: &[&str]) -> BenchArgs {
    let base = ["bench", "--url", url, "--quiet", "--warmup", "500ms"];
    Cli::try_parse_from(base.iter().chain(extra))
        .expect("valid flags")
        .bench
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn palisade_jobs_complete_without_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let listen = "127.0.0.1:0".parse().expect("address");
    let server = serve(ServerConfig::new(listen, dir.path().join("data")))
        .await
        .expect("server starts");
    let url = format!("http://{}", server.addr());

    // The CI step of the brief: J2 and J1, 8 clients, 3 s each.
    let results = palisade_bench::run(args(
        &url,
        &["--job", "j2,j1", "--clients", "8", "--duration", "3s"],
    ))
    .await
    .expect("no errors");
    assert_eq!(results.runs.len(), 2);
    for run in &results.runs {
        assert_eq!(run.error_total(), 0, "{run:?}");
        assert!(run.ops > 0, "{run:?}");
        assert!(
            run.p50_us <= run.p99_us && run.p99_us <= run.max_us,
            "{run:?}"
        );
    }

    // The other jobs, briefly: reads, a contended lock with queued waiters, and a tiny
    // scale run (its memory read from this process, which hosts the server).
    let pid = std::process::id().to_string();
    let results = palisade_bench::run(args(
        &url,
        &[
            "--job",
            "read,contended,scale",
            "--clients",
            "4",
            "--duration",
            "1s",
            "--locks",
            "200",
            "--leases",
            "20",
            "--server-pid",
            &pid,
        ],
    ))
    .await
    .expect("no errors");
    let jobs: Vec<Job> = results.runs.iter().map(|r| r.job).collect();
    assert_eq!(jobs, [Job::Read, Job::Contended]);
    assert!(results.runs.iter().all(|r| r.ops > 0), "{:?}", results.runs);
    let scale = results.scale.expect("scale report");
    assert_eq!((scale.locks, scale.leases, scale.lost), (200, 20, 0));
    assert!(scale.keepalives > 0 && scale.rss_max_renewing.is_some());

    // Palisade has no unfenced write; asking for one is refused, not faked.
    let refused = palisade_bench::run(args(&url, &["--job", "plain", "--duration", "1s"])).await;
    assert!(refused.is_err());

    server.shutdown().await.expect("clean shutdown");
}
