//! Real PostgreSQL, Redis and MariaDB servers for the tests: each in its own temp dir, on a free
//! loopback port, stopped by process id when dropped. A missing server binary is a test
//! failure with instructions, never a silent skip.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

const HOW_TO_INSTALL: &str = "run scripts/adapter-services (installs redis-server, \
     PostgreSQL and MariaDB with apt-get) before `cargo test -p palisade-adapters --all-features`";

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// A running server process. Dropping it stops the process (by its id) and removes its
/// directory.
pub struct Server {
    pub port: u16,
    child: Child,
    dir: TempDir,
    stop_signal: i32,
}

impl Server {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on the pid of a child we spawned and have not yet reaped.
        unsafe { libc::kill(pid, self.stop_signal) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns `command` logging to `dir/server.log`, and waits until `ready(port)`.
fn spawn(
    mut command: Command,
    dir: TempDir,
    port: u16,
    stop_signal: i32,
    ready: impl Fn(u16) -> bool,
) -> Result<Server, String> {
    let log = File::create(dir.path().join("server.log")).map_err(|e| e.to_string())?;
    let log2 = log.try_clone().map_err(|e| e.to_string())?;
    command.stdin(Stdio::null()).stdout(log).stderr(log2);
    let child = command
        .spawn()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    let mut server = Server {
        port,
        child,
        dir,
        stop_signal,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = server.child.try_wait() {
            return Err(format!("server exited with {status}:\n{}", server.log()));
        }
        if ready(port) {
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("server not ready within 60 s:\n{}", server.log()))
}

/// Tries a few ports: another process may take the free port before the server binds it.
fn start_with_retries(mut attempt: impl FnMut(u16) -> Result<Server, String>) -> Server {
    let mut last = String::new();
    for _ in 0..3 {
        match attempt(free_port()) {
            Ok(server) => return server,
            Err(e) => last = e,
        }
    }
    panic!("could not start the server: {last}");
}

/// Starts `redis-server` with the durability settings the docs require.
pub fn redis() -> Server {
    redis_with(&[])
}

/// [`redis`] with more arguments (`--enable-debug-command local`, say).
pub fn redis_with(extra: &[&str]) -> Server {
    let binary = std::env::var_os("PALISADE_REDIS_SERVER")
        .map(PathBuf::from)
        .or_else(|| on_path("redis-server"))
        .unwrap_or_else(|| panic!("redis-server not found on PATH: {HOW_TO_INSTALL}"));
    start_with_retries(|port| {
        let dir = TempDir::with_prefix("palisade-redis-").map_err(|e| e.to_string())?;
        let mut command = Command::new(&binary);
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .args(extra)
            .arg("--dir")
            .arg(dir.path())
            .current_dir(dir.path());
        spawn(command, dir, port, libc::SIGTERM, redis_ready)
    })
}

fn redis_ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let mut reply = [0u8; 5];
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .is_ok()
        && stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG"
}

/// Where PostgreSQL's server binaries are: `PALISADE_PG_BIN`, the newest
/// `/usr/lib/postgresql/<version>/bin`, or `PATH`.
pub fn pg_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PALISADE_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return bin;
    }
    match (on_path("postgres"), on_path("initdb")) {
        (Some(postgres), Some(_)) => postgres.parent().map(Path::to_path_buf).unwrap_or_default(),
        _ => panic!("PostgreSQL server binaries (initdb, postgres) not found: {HOW_TO_INSTALL}"),
    }
}

/// PostgreSQL refuses to run as root. As root (CI), the cluster belongs to `nobody` and
/// the server runs as `nobody`; otherwise as the current user.
fn pg_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions; getpwnam returns null or a pointer to a static
    // record that we copy from immediately, on this thread.
    unsafe {
        if libc::geteuid() != 0 {
            return None;
        }
        let pw = libc::getpwnam(c"nobody".as_ptr());
        assert!(
            !pw.is_null(),
            "running as root needs a `nobody` user for PostgreSQL"
        );
        Some(((*pw).pw_uid, (*pw).pw_gid))
    }
}

/// Initialises a throwaway cluster and starts PostgreSQL on it (fsync stays on).
pub fn postgres() -> Server {
    let bin = pg_bin_dir();
    if !bin.join("initdb").is_file() || !bin.join("postgres").is_file() {
        panic!("no initdb/postgres in {}: {HOW_TO_INSTALL}", bin.display());
    }
    let user = pg_user();
    let as_user = |program: &str, dir: &Path| {
        let mut command = Command::new(bin.join(program));
        command.current_dir(dir).env("LC_ALL", "C");
        if let Some((uid, gid)) = user {
            command.uid(uid).gid(gid);
        }
        command
    };
    start_with_retries(|port| {
        // Under /tmp: `nobody` must be able to reach the directory.
        let dir = TempDir::with_prefix_in("palisade-pg-", "/tmp").map_err(|e| e.to_string())?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| e.to_string())?;
        }
        let data = dir.path().join("data");
        let init = as_user("initdb", dir.path())
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .map_err(|e| format!("cannot run initdb: {e}"))?;
        if !init.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&init.stderr)
            ));
        }
        let mut command = as_user("postgres", dir.path());
        command
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-h", "127.0.0.1"])
            .args(["-c", "unix_socket_directories=", "-c", "max_connections=50"]);
        let isready = bin.join("pg_isready");
        // SIGINT is PostgreSQL's "fast shutdown".
        spawn(command, dir, port, libc::SIGINT, move |port| {
            Command::new(&isready)
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    })
}

impl Server {
    /// The tokio-postgres connection string for a server started by [`postgres`].
    pub fn pg_config(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// The redis URL for a server started by [`redis`].
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// Initialises a throwaway MariaDB (or MySQL) data directory and starts the server on it,
/// with `extra` arguments (`--innodb-flush-log-at-trx-commit=2`, say). `root` has no
/// password on 127.0.0.1; the database `palisade` exists.
pub fn mariadb(extra: &[&str]) -> Server {
    let find = |names: &[&str]| names.iter().find_map(|n| on_path(n));
    let server = find(&["mariadbd", "mysqld"])
        .unwrap_or_else(|| panic!("mariadbd not found: {HOW_TO_INSTALL}"));
    let install = find(&["mariadb-install-db", "mysql_install_db"])
        .unwrap_or_else(|| panic!("mariadb-install-db not found: {HOW_TO_INSTALL}"));
    let client = find(&["mariadb", "mysql"])
        .unwrap_or_else(|| panic!("the mariadb client not found: {HOW_TO_INSTALL}"));
    // SAFETY: geteuid has no preconditions.
    let as_root = unsafe { libc::geteuid() } == 0;
    let user = |command: &mut Command| {
        if as_root {
            command.arg("--user=root");
        }
    };
    start_with_retries(|port| {
        let dir =
            TempDir::with_prefix_in("palisade-mariadb-", "/tmp").map_err(|e| e.to_string())?;
        let data = dir.path().join("data");
        let mut init = Command::new(&install);
        init.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        user(&mut init);
        let done = init
            .output()
            .map_err(|e| format!("cannot run {}: {e}", install.display()))?;
        if !done.status.success() {
            return Err(format!(
                "mariadb-install-db failed: {}",
                String::from_utf8_lossy(&done.stderr)
            ));
        }
        let mut command = Command::new(&server);
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", dir.path().join("sock").display()))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .args(["--bind-address=127.0.0.1", &format!("--port={port}")])
            .args(["--skip-name-resolve", "--max-connections=200"])
            .args(extra);
        user(&mut command);
        let client = client.clone();
        spawn(command, dir, port, libc::SIGTERM, move |port| {
            Command::new(&client)
                .args([
                    "--no-defaults",
                    "-h",
                    "127.0.0.1",
                    "-P",
                    &port.to_string(),
                    "-u",
                    "root",
                ])
                .args(["-e", "CREATE DATABASE IF NOT EXISTS palisade"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    })
}

impl Server {
    /// The mysql_async URL of the `palisade` database of a server started by [`mariadb`].
    pub fn mysql_url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/palisade", self.port)
    }
}
