//! What the bench reads about processes from `/proc` (Linux): CPU time, context switches
//! and resident memory. Elsewhere these read as unknown (`None`) rather than failing a run.

use std::time::Instant;

/// The CPU counters of one process, in clock ticks.
struct Stat {
    ppid: u32,
    /// User + system time of the process (all its threads).
    own: u64,
    /// User + system time of its children that have exited and been waited for.
    reaped_children: u64,
}

fn stat(pid: &str) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after it are plain.
    let fields: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // Fields 4 (ppid) and 14 to 17 (utime, stime, cutime, cstime) of the whole line.
    Some(Stat {
        ppid: field(1)? as u32,
        own: field(11)? + field(12)?,
        reaped_children: field(13)? + field(14)?,
    })
}

fn ticks_per_second() -> Option<f64> {
    // SAFETY: sysconf reads a constant of the system and has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then_some(hz as f64)
}

/// CPU time (user + system) this process has used so far, in seconds.
pub fn own_cpu_seconds() -> Option<f64> {
    Some(stat("self")?.own as f64 / ticks_per_second()?)
}

/// The pids of the live children of process `pid`.
fn children(pid: u32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        .filter(|name| stat(name).is_some_and(|s| s.ppid == pid))
        .collect()
}

/// CPU time used so far by process `pid` and its children, in seconds. Children count
/// because some servers (PostgreSQL) serve each connection from a child process.
pub fn tree_cpu_seconds(pid: u32) -> Option<f64> {
    let root = stat(&pid.to_string())?;
    let mut ticks = root.own + root.reaped_children;
    for child in children(pid) {
        ticks += stat(&child).map_or(0, |s| s.own);
    }
    Some(ticks as f64 / ticks_per_second()?)
}

/// Context switches (voluntary and not) of every live thread of process `pid`.
fn thread_switches(pid: &str) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        total += status
            .lines()
            .filter(|l| {
                l.starts_with("voluntary_ctxt_switches:")
                    || l.starts_with("nonvoluntary_ctxt_switches:")
            })
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Some(total)
}

/// Context switches so far of every live thread of process `pid` and of its children: how
/// often the server's threads gave up or lost a processor (a sleep on a lock, a queue or
/// a socket, and the wake-up that follows). Threads that ended are not counted, so compare
/// two readings of servers whose threads live for the whole run.
pub fn tree_switches(pid: u32) -> Option<u64> {
    let mut total = thread_switches(&pid.to_string())?;
    for child in children(pid) {
        total += thread_switches(&child).unwrap_or(0);
    }
    Some(total)
}

/// Resident memory of a process (`VmRSS`), in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A CPU-time reading of the bench itself and (if known) the server, with the server's
/// context switches, at one instant.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    at: Instant,
    own: Option<f64>,
    server: Option<f64>,
    server_switches: Option<u64>,
}

impl CpuSample {
    pub fn now(server_pid: Option<u32>) -> Self {
        CpuSample {
            at: Instant::now(),
            own: own_cpu_seconds(),
            server: server_pid.and_then(tree_cpu_seconds),
            server_switches: server_pid.and_then(tree_switches),
        }
    }

    /// The server's context switches between `self` and `later`.
    pub fn switches_until(&self, later: &CpuSample) -> Option<u64> {
        Some(later.server_switches?.saturating_sub(self.server_switches?))
    }

    /// Percent of one core used by (the bench, the server) between `self` and `later`.
    pub fn percent_until(&self, later: &CpuSample) -> (Option<f64>, Option<f64>) {
        let wall = later.at.duration_since(self.at).as_secs_f64();
        let pct = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if wall > 0.0 => Some(100.0 * (b - a) / wall),
            _ => None,
        };
        (pct(self.own, later.own), pct(self.server, later.server))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            return;
        }
        assert!(own_cpu_seconds().is_some());
        assert!(tree_cpu_seconds(std::process::id()).is_some());
        let before = tree_switches(std::process::id()).unwrap();
        // A sleep gives up the processor: one voluntary switch at least.
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(tree_switches(std::process::id()).unwrap() > before);
        assert!(rss_bytes(std::process::id()).is_some_and(|b| b > 0));
    }
}
