//! One clock for every process of a run.
//!
//! Histories from several worker processes are merged and compared in real time, so all
//! of them read `CLOCK_MONOTONIC` (system-wide on Linux, unaffected by wall-clock steps,
//! and still ticking while a process is stopped by SIGSTOP) and count microseconds from
//! one origin that the harness picks and hands to every worker.

/// Raw `CLOCK_MONOTONIC`, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on the
    // platforms we build for, so the call cannot fail and needs no other precondition.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Microseconds since a shared origin: the time unit of every history line.
#[derive(Debug, Clone, Copy)]
pub struct RunClock {
    origin_ns: u64,
}

impl RunClock {
    /// A clock whose time 0 is now.
    pub fn start() -> RunClock {
        RunClock {
            origin_ns: monotonic_ns(),
        }
    }

    /// A clock sharing another process's origin.
    pub fn from_origin(origin_ns: u64) -> RunClock {
        RunClock { origin_ns }
    }

    pub fn origin_ns(&self) -> u64 {
        self.origin_ns
    }

    /// Microseconds since the origin.
    pub fn now_us(&self) -> u64 {
        monotonic_ns().saturating_sub(self.origin_ns) / 1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_sharing_an_origin_agree() {
        let a = RunClock::start();
        let b = RunClock::from_origin(a.origin_ns());
        let (x, y) = (a.now_us(), b.now_us());
        assert!(y >= x && y - x < 1_000_000);
    }
}
