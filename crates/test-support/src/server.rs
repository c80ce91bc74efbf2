//! A `palisade serve` process, read up to its start-up line.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running server process. Dropping it kills it (SIGKILL) and reaps it.
pub struct ServerProcess {
    pub child: Child,
    /// The URL from its start-up line.
    pub url: String,
    /// The RESP URL from its start-up line (`--resp-listen`).
    pub resp_url: Option<String>,
    pub port: u16,
}

impl ServerProcess {
    /// Spawns `command` (a `palisade serve ...`) with piped stdout and stderr and reads
    /// its start-up line. Err with the server's stderr if it exits or prints something
    /// else first.
    pub fn spawn(mut command: Command) -> Result<ServerProcess, String> {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("read: {e}"))?;
        let Some(url) = palisade_api::listening::parse(&line) else {
            let mut err = String::new();
            if let Some(mut stderr) = child.stderr.take() {
                let _ = stderr.read_to_string(&mut err);
            }
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("server did not start: {line:?} {err}"));
        };
        let url = url.to_owned();
        let resp_url = palisade_api::listening::parse_resp(&line).map(str::to_owned);
        let port = url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or("no port in the start-up line")?;
        Ok(ServerProcess {
            child,
            url,
            resp_url,
            port,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process with SIGKILL (a crash: nothing gets flushed) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `limit` for the process to exit; its status, or None if it still runs.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's stderr, read line by line on a thread into the returned buffer (so the
    /// process never blocks on a full pipe). Call at most once.
    pub fn capture_stderr(&mut self) -> Arc<Mutex<String>> {
        let captured = Arc::new(Mutex::new(String::new()));
        if let Some(stderr) = self.child.stderr.take() {
            let sink = captured.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut text = sink.lock().unwrap_or_else(|e| e.into_inner());
                    text.push_str(&line);
                    text.push('\n');
                }
            });
        }
        captured
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
