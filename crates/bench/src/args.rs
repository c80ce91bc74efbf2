//! The flags of `palisade bench`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

/// The system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Palisade,
    Redis,
    Postgres,
    Etcd,
}

impl Target {
    /// Where the target listens when `--url` is not given (the services' default ports).
    pub fn default_url(self) -> &'static str {
        match self {
            Target::Palisade => "http://127.0.0.1:7700",
            Target::Redis => "redis://127.0.0.1:6379",
            Target::Postgres => "postgresql://postgres@127.0.0.1:5432/postgres",
            Target::Etcd => "http://127.0.0.1:2379",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Target::Palisade => "palisade",
            Target::Redis => "redis",
            Target::Postgres => "postgres",
            Target::Etcd => "etcd",
        }
    }
}

/// A job: what each client does in a loop. See the crate docs for each target's recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Job {
    /// Acquire + release with a durable fencing epoch (one operation = both).
    J1,
    /// Fenced durable write: compare with the high-water mark, advance it, write a value.
    J2,
    /// Unfenced durable write, for reference (peers only).
    Plain,
    /// All clients on one lock; counts acquisitions/s and failed attempts/s.
    Contended,
    /// Read one value.
    Read,
    /// Palisade only: many locks, then many live leases renewed every second.
    Scale,
}

impl Job {
    pub fn name(self) -> &'static str {
        match self {
            Job::J1 => "j1",
            Job::J2 => "j2",
            Job::Plain => "plain",
            Job::Contended => "contended",
            Job::Read => "read",
            Job::Scale => "scale",
        }
    }
}

/// `palisade bench`: measure Palisade, or one of its peers, under N concurrent clients.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// System under test.
    #[arg(long, value_enum, default_value = "palisade")]
    pub target: Target,
    /// Where it listens. Default: the target's usual local address
    /// (`http://127.0.0.1:7700`, `redis://127.0.0.1:6379`,
    /// `postgresql://postgres@127.0.0.1:5432/postgres`, `http://127.0.0.1:2379`).
    #[arg(long)]
    pub url: Option<String>,
    /// Job(s) to run, comma-separated: j1, j2, plain, contended, read, scale.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "j2")]
    pub job: Vec<Job>,
    /// Concurrent clients, each with its own connection; a list sweeps (e.g. 1,16,64).
    #[arg(long, value_delimiter = ',', default_value = "16")]
    pub clients: Vec<usize>,
    /// Measured time per run (e.g. 10s, 500ms, 2m; a bare number is seconds). For
    /// `scale`: how long the leases are kept alive.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub duration: Duration,
    /// Unmeasured time before each run.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub warmup: Duration,
    /// Distinct locks in all, shared out among the clients [default: one per client;
    /// 1000000 for `scale`].
    #[arg(long)]
    pub locks: Option<usize>,
    /// Size of each written value, in bytes.
    #[arg(long, default_value_t = 128)]
    pub value_size: usize,
    /// `contended`: how long a Palisade acquire waits in the lock's queue (ms). With 0 a
    /// refused client sleeps 1 ms and tries again, as the peers' clients do.
    #[arg(long, default_value_t = 1000)]
    pub wait_ms: u64,
    /// A name for this configuration (e.g. `retry`, `auth`, `grace0`), kept in the JSON
    /// results: `--merge` shows each variant as its own row, compared with the peers'
    /// plain rows.
    #[arg(long, value_parser = parse_variant)]
    pub variant: Option<String>,
    /// Lease time-to-live of each acquisition (ms).
    #[arg(long, default_value_t = 10_000)]
    pub ttl_ms: u64,
    /// `scale`: live leases kept renewing once a second.
    #[arg(long, default_value_t = 10_000)]
    pub leases: usize,
    /// Process id of the server, to report its CPU use and (for `scale`) its memory.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write a chart (throughput and p99 by client count) as SVG to this file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Run nothing: read these JSON result files and print a Markdown comparison (with
    /// Palisade/peer ratios). `--svg` then charts them all.
    #[arg(long, value_name = "JSON", num_args = 1..)]
    pub merge: Vec<PathBuf>,
    /// No progress bar (it is hidden anyway when stderr is not a terminal).
    #[arg(long)]
    pub quiet: bool,
    /// Bearer key for a Palisade server started with --auth-file (every request carries
    /// it; give the principal every verb on the benchmark's locks, or `admin = true`).
    #[arg(long, env = "PALISADE_KEY", hide_env_values = true)]
    pub key: Option<String>,
}

impl BenchArgs {
    pub fn url(&self) -> &str {
        self.url
            .as_deref()
            .unwrap_or_else(|| self.target.default_url())
    }
}

/// Parses `10s`, `500ms`, `2m` or a bare number of seconds (fractions allowed).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("not a duration: {text:?} (try 10s, 500ms or 2m)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("not a duration: {text:?}"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

/// A variant name: short, and safe in a Markdown table.
fn parse_variant(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= 32
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(text.to_owned())
    } else {
        Err("1 to 32 characters from A-Z a-z 0-9 - _ .".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn variant_names() {
        assert_eq!(parse_variant("retry"), Ok("retry".to_owned()));
        assert!(parse_variant("").is_err());
        assert!(parse_variant("a|b").is_err());
        assert!(parse_variant(&"x".repeat(33)).is_err());
    }
}
