//! Results: the per-run summary, the terminal table, JSON files, and the Markdown
//! comparison of several result files (`--merge`) with the Palisade/peer ratios.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{BenchError, Job, ScaleReport, Target};

/// One run: one job against one target at one client count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub target: Target,
    /// The configuration's name (`--variant`), if it is not the default one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    pub job: Job,
    pub clients: usize,
    pub duration_s: f64,
    /// Operations done in the measured window (for `contended`: acquisitions).
    pub ops: u64,
    pub ops_per_s: f64,
    /// `contended`: attempts that found the lock taken.
    pub refused: u64,
    pub refused_per_s: f64,
    /// Failed operations by code, warm-up included.
    pub errors: BTreeMap<String, u64>,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub mean_us: f64,
    /// CPU used by the bench process, in percent of one core.
    pub bench_cpu_pct: Option<f64>,
    /// CPU used by the server (with `--server-pid`), in percent of one core.
    pub server_cpu_pct: Option<f64>,
    /// Context switches of the server's threads (and its children's) per operation, in the
    /// measured window (with `--server-pid`).
    #[serde(default)]
    pub server_switches_per_op: Option<f64>,
    pub value_size: usize,
}

impl Summary {
    pub fn error_total(&self) -> u64 {
        self.errors.values().sum()
    }

    /// The server's CPU time per operation, in µs.
    pub fn server_cpu_us_per_op(&self) -> Option<f64> {
        let pct = self.server_cpu_pct?;
        (self.ops_per_s > 0.0).then(|| pct / 100.0 * 1e6 / self.ops_per_s)
    }
}

/// What one `palisade bench` invocation produced; the JSON file holds exactly this.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub target: Option<Target>,
    pub url: String,
    /// The command line, for reproduction.
    pub command: String,
    pub runs: Vec<Summary>,
    pub scale: Option<ScaleReport>,
}

impl Results {
    pub fn error_total(&self) -> u64 {
        let scale = self.scale.as_ref().map_or(0, |s| s.error_total());
        self.runs.iter().map(Summary::error_total).sum::<u64>() + scale
    }
}

pub fn read_all(paths: &[PathBuf]) -> Result<Vec<Results>, BenchError> {
    paths
        .iter()
        .map(|path| {
            let fail = |message: String| BenchError::File {
                path: path.clone(),
                message,
            };
            let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
            serde_json::from_str(&text).map_err(|e| fail(e.to_string()))
        })
        .collect()
}

pub fn ms(us: u64) -> String {
    let ms = us as f64 / 1000.0;
    if ms < 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.1}")
    }
}

/// `12345.6` as `12,346`.
pub fn count(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn pct(value: Option<f64>) -> String {
    value.map_or("-".to_string(), |v| format!("{v:.0}%"))
}

fn errors(summary: &Summary) -> String {
    if summary.errors.is_empty() {
        return "0".to_string();
    }
    let list: Vec<String> = summary
        .errors
        .iter()
        .map(|(code, n)| format!("{code}:{n}"))
        .collect();
    list.join(" ")
}

/// The header of the terminal table, in the widths of [`row`].
pub fn header() -> String {
    format!(
        "{:<16} {:<9} {:>7} {:>11} {:>10} {:>8} {:>8} {:>8} {:>9} {:>10} {:>9}  errors\n",
        "target",
        "job",
        "clients",
        "ops/s",
        "refused/s",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "bench cpu",
        "server cpu",
        "switch/op"
    )
}

/// One line of the terminal table.
pub fn row(r: &Summary) -> String {
    format!(
        "{:<16} {:<9} {:>7} {:>11} {:>10} {:>8} {:>8} {:>8} {:>9} {:>10} {:>9}  {}\n",
        match &r.variant {
            Some(v) => format!("{}/{v}", r.target.name()),
            None => r.target.name().to_string(),
        },
        r.job.name(),
        r.clients,
        count(r.ops_per_s),
        count(r.refused_per_s),
        ms(r.p50_us),
        ms(r.p99_us),
        ms(r.p999_us),
        pct(r.bench_cpu_pct),
        pct(r.server_cpu_pct),
        r.server_switches_per_op
            .map_or("-".to_string(), |n| format!("{n:.2}")),
        errors(r)
    )
}

/// The terminal table of some runs.
pub fn table(runs: &[Summary]) -> String {
    let mut out = header();
    for r in runs {
        out.push_str(&row(r));
    }
    out
}

/// The Markdown comparison of several result files: throughput, ratios, latencies, and
/// every run in detail.
///
/// A Palisade run made with `--variant` gets its own row (`contended (retry)`), beside the
/// peers' runs of the same job and client count, which have no variants.
pub fn markdown(results: &[Results]) -> String {
    let mut runs: Vec<&Summary> = results.iter().flat_map(|r| &r.runs).collect();
    runs.sort_by(|a, b| {
        (a.target, a.job, &a.variant, a.clients).cmp(&(b.target, b.job, &b.variant, b.clients))
    });
    let mut targets: Vec<Target> = runs.iter().map(|r| r.target).collect();
    targets.sort();
    targets.dedup();
    let mut rows: Vec<(Job, Option<&str>, usize)> = runs
        .iter()
        .map(|r| (r.job, r.variant.as_deref(), r.clients))
        .collect();
    rows.sort();
    rows.dedup();
    // Peers have no variants: a variant row compares with their plain run.
    let find = |t: Target, job: Job, variant: Option<&str>, clients: usize| {
        let variant = if t == Target::Palisade { variant } else { None };
        runs.iter().find(|r| {
            r.target == t && r.job == job && r.variant.as_deref() == variant && r.clients == clients
        })
    };
    let label = |job: Job, variant: Option<&str>| match variant {
        Some(v) => format!("{} ({v})", job.name()),
        None => job.name().to_string(),
    };
    // A table of `rows` by target: `cell` of the target's run, `-` where it has none.
    let by_target = |out: &mut String, cell: &dyn Fn(Job, &Summary) -> String| {
        let names: Vec<&str> = targets.iter().map(|t| t.name()).collect();
        let _ = writeln!(out, "| job | clients | {} |", names.join(" | "));
        let _ = writeln!(out, "|---|---:|{}", "---:|".repeat(targets.len()));
        for &(job, variant, clients) in &rows {
            let cells: Vec<String> = targets
                .iter()
                .map(|&t| match find(t, job, variant, clients) {
                    Some(r) => cell(job, r),
                    None => "-".to_string(),
                })
                .collect();
            let _ = writeln!(
                out,
                "| {} | {clients} | {} |",
                label(job, variant),
                cells.join(" | ")
            );
        }
    };
    let mut out = String::from(
        "### Throughput (operations/s; contended: acquisitions/s, failed attempts/s)\n\n",
    );
    by_target(&mut out, &|job, r| match job {
        Job::Contended => format!("{} ({} failed)", count(r.ops_per_s), count(r.refused_per_s)),
        _ => count(r.ops_per_s),
    });
    let peers: Vec<Target> = targets
        .iter()
        .copied()
        .filter(|&t| t != Target::Palisade)
        .collect();
    if targets.contains(&Target::Palisade) && !peers.is_empty() {
        out.push_str("\n### Palisade / peer, throughput ratio (above 1: Palisade is faster)\n\n");
        let names: Vec<String> = peers.iter().map(|t| format!("/ {}", t.name())).collect();
        let _ = writeln!(out, "| job | clients | {} |", names.join(" | "));
        let _ = writeln!(out, "|---|---:|{}", "---:|".repeat(peers.len()));
        for &(job, variant, clients) in &rows {
            // Palisade has no unfenced write: its fenced write stands against `plain`.
            let (own_job, name) = match job {
                Job::Plain => (
                    Job::J2,
                    format!("palisade {} vs peer plain", label(Job::J2, variant)),
                ),
                _ => (job, label(job, variant)),
            };
            let Some(own) = find(Target::Palisade, own_job, variant, clients) else {
                continue;
            };
            let cells: Vec<String> = peers
                .iter()
                .map(|&p| match find(p, job, variant, clients) {
                    Some(r) if r.ops_per_s > 0.0 => format!("{:.2}x", own.ops_per_s / r.ops_per_s),
                    _ => "-".to_string(),
                })
                .collect();
            let _ = writeln!(out, "| {name} | {clients} | {} |", cells.join(" | "));
        }
    }
    out.push_str(
        "\n### The server's cost per operation: CPU µs / context switches (all its threads)\n\n",
    );
    by_target(&mut out, &|_, r| {
        let cpu = r
            .server_cpu_us_per_op()
            .map_or("-".to_string(), |us| format!("{us:.1}"));
        let switches = r
            .server_switches_per_op
            .map_or("-".to_string(), |n| format!("{n:.2}"));
        format!("{cpu} / {switches}")
    });
    out.push_str("\n### Latency per operation, p50 / p99 / p999 (ms)\n\n");
    by_target(&mut out, &|_, r| {
        format!("{} / {} / {}", ms(r.p50_us), ms(r.p99_us), ms(r.p999_us))
    });
    out.push_str("\n### Every run\n\n```text\n");
    let all: Vec<Summary> = runs.iter().map(|r| (*r).clone()).collect();
    out.push_str(&table(&all));
    out.push_str("```\n");
    for r in results {
        if let Some(scale) = &r.scale {
            let _ = write!(out, "\n### Scale\n\n```text\n{scale}```\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_millis() {
        assert_eq!(count(0.0), "0");
        assert_eq!(count(999.4), "999");
        assert_eq!(count(1234.0), "1,234");
        assert_eq!(count(1234567.0), "1,234,567");
        assert_eq!(ms(1500), "1.50");
        assert_eq!(ms(25_000), "25.0");
    }

    fn run(target: Target, job: Job, variant: Option<&str>, ops_per_s: f64) -> Summary {
        Summary {
            target,
            variant: variant.map(str::to_owned),
            job,
            clients: 64,
            duration_s: 1.0,
            ops: ops_per_s as u64,
            ops_per_s,
            refused: 0,
            refused_per_s: 0.0,
            errors: BTreeMap::new(),
            p50_us: 1000,
            p99_us: 2000,
            p999_us: 3000,
            max_us: 4000,
            mean_us: 1100.0,
            bench_cpu_pct: None,
            server_cpu_pct: Some(150.0),
            server_switches_per_op: Some(0.5),
            value_size: 128,
        }
    }

    /// A Palisade variant gets its own row, its ratio taken against the peer's plain run.
    #[test]
    fn a_variant_row_is_compared_with_the_peers_plain_run() {
        let results = Results {
            runs: vec![
                run(Target::Palisade, Job::Contended, None, 3000.0),
                run(Target::Palisade, Job::Contended, Some("retry"), 500.0),
                run(Target::Redis, Job::Contended, None, 1000.0),
            ],
            ..Results::default()
        };
        let md = markdown(&[results]);
        assert!(md.contains("| contended | 64 | 3.00x |"), "{md}");
        assert!(md.contains("| contended (retry) | 64 | 0.50x |"), "{md}");
        // 150% of a core over 3000/s is 500 µs an operation; over 500/s, 3000 µs.
        assert!(
            md.contains("| contended | 64 | 500.0 / 0.50 | 1500.0 / 0.50 |"),
            "{md}"
        );
        assert!(
            md.contains("| contended (retry) | 64 | 3000.0 / 0.50 | 1500.0 / 0.50 |"),
            "{md}"
        );
        // The old result files, without the field, still read.
        let old = r#"{"target":"redis","job":"j2","clients":1,"duration_s":1.0,"ops":1,
            "ops_per_s":1.0,"refused":0,"refused_per_s":0.0,"errors":{},"p50_us":1,"p99_us":1,
            "p999_us":1,"max_us":1,"mean_us":1.0,"bench_cpu_pct":null,"server_cpu_pct":null,
            "value_size":1}"#;
        let parsed: Summary = serde_json::from_str(old).unwrap();
        assert_eq!(
            (parsed.variant, parsed.server_switches_per_op),
            (None, None)
        );
    }
}
