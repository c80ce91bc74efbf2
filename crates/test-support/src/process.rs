//! Signals and liveness by process id, through `nix` (no `unsafe` in the tests).

use nix::unistd::Pid;

pub use nix::sys::signal::Signal;

fn pid(id: u32) -> Pid {
    Pid::from_raw(i32::try_from(id).expect("a process id fits in i32"))
}

/// Sends `sig` to process `id`; panics if it cannot (the process is gone).
pub fn signal(id: u32, sig: Signal) {
    nix::sys::signal::kill(pid(id), sig).unwrap_or_else(|e| panic!("kill({id}, {sig}): {e}"));
}

/// Sends `sig` to process group `id`; a group that is gone is fine.
pub fn signal_group(id: u32, sig: Signal) {
    let _ = nix::sys::signal::killpg(pid(id), sig);
}

/// True while process `id` exists and is not a zombie (exited, not yet reaped: in a
/// container whose init does not reap, orphans stay zombies).
pub fn alive(id: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{id}/stat")) {
        // The state follows the command name in parentheses, which may contain spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Raises this process's soft open-files limit to its hard limit (children inherit it).
pub fn raise_open_files() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}
