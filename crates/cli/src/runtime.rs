//! The async runtime each command runs on: for `serve`, fitted by `--worker-threads` and
//! `--blocking-threads`; for every other command, tokio's defaults.
//!
//! Why the server's threads are a setting (bench/analysis.md, "The runtime"): a request
//! that a worker wakes while another worker sleeps wakes that one too, to look for work to
//! steal. On two cores with one busy connection that second wake-up is a context switch per
//! request for nothing; with many connections the second worker earns its keep. Where the
//! load is light or one core is all the server gets, `--worker-threads 1` removes it.

use clap::Args;

/// Threads of the server's runtime.
#[derive(Args, Clone, Debug)]
pub struct RuntimeArgs {
    /// Threads that run requests (the async runtime's workers). Default: one per CPU core
    /// the process may use. One worker wakes no idle sibling: fewer context switches per
    /// request at light load, less throughput with many busy connections
    /// (docs/benchmarks.md, "The runtime").
    #[arg(help_heading = "Runtime", long, env = "PALISADE_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    worker_threads: Option<u16>,
    /// Most threads for blocking work at once: reads of keys not in memory, key-file and
    /// backup I/O. Idle ones exit after 10 s. Requests beyond it wait in line.
    #[arg(help_heading = "Runtime", long, env = "PALISADE_BLOCKING_THREADS", default_value_t = 512, value_parser = clap::value_parser!(u16).range(1..=4096))]
    blocking_threads: u16,
}

impl RuntimeArgs {
    /// The server's runtime, with the threads these settings ask for.
    pub fn build(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if let Some(workers) = self.worker_threads {
            builder.worker_threads(usize::from(workers));
        }
        builder
            .max_blocking_threads(usize::from(self.blocking_threads))
            .thread_name("palisade-rt")
            .enable_all()
            .build()
    }
}

/// The runtime of every command but `serve`: tokio's defaults.
pub fn default() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Runtime::new()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::RuntimeArgs;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        runtime: RuntimeArgs,
    }

    fn runtime(args: &[&str]) -> tokio::runtime::Runtime {
        let flags = Flags::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .expect("flags parse");
        flags.runtime.build().expect("runtime builds")
    }

    #[test]
    fn the_worker_count_is_the_flag_or_one_per_core() {
        assert_eq!(
            runtime(&["--worker-threads", "3"]).metrics().num_workers(),
            3
        );
        assert_eq!(
            runtime(&["--worker-threads", "1"]).metrics().num_workers(),
            1
        );
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(runtime(&[]).metrics().num_workers(), cores);
    }

    #[test]
    fn zero_threads_is_refused() {
        for flag in ["--worker-threads", "--blocking-threads"] {
            let parsed = Flags::try_parse_from(["serve", flag, "0"]);
            assert!(parsed.is_err(), "{flag} 0 was accepted");
        }
    }
}
