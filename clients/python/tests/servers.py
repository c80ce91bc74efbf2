"""Real servers for the tests: ``palisade serve`` and PostgreSQL, each in its own temp dir
on a free loopback port, stopped by process id. A missing binary is a test failure with
instructions, never a silent skip."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

import httpx

REPO = Path(__file__).resolve().parents[3]
HOW_TO_BUILD = "run scripts/python-test (it builds the server and the Rust writer first)"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def binary(env: str, default: Path) -> Path:
    path = Path(os.environ.get(env) or default)
    if not path.is_file():
        raise RuntimeError(f"{path} not found ({env}): {HOW_TO_BUILD}")
    return path


def palisade_bin() -> Path:
    return binary("PALISADE_BIN", REPO / "target" / "debug" / "palisade")


def fenced_writer_bin() -> Path:
    return binary("PALISADE_FENCED_WRITER", REPO / "target" / "debug" / "examples" / "fenced_writer")


def _stop(proc: "subprocess.Popen[bytes]", sig: int, grace: float = 15.0) -> None:
    """Signals the process by its pid and reaps it; SIGKILL if it outlives ``grace``."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)


class PalisadeServer:
    """One ``palisade serve`` process. ``url`` is read from its first stdout line."""

    LISTENING = "palisade listening on "

    def __init__(self, extra: Sequence[str] = (), data_dir: Optional[Path] = None, port: int = 0) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="palisade-py-")
        self.data_dir = data_dir or Path(self._tmp.name) / "data"
        self.extra = list(extra)
        self.log_path = Path(self._tmp.name) / "server.log"
        self.proc, self.url = self._spawn(port)

    def _spawn(self, port: int) -> Tuple["subprocess.Popen[bytes]", str]:
        log = open(self.log_path, "ab")
        proc = subprocess.Popen(
            [str(palisade_bin()), "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(self.data_dir), *self.extra],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        log.close()
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline().decode() if ready else ""
        if not line.startswith(self.LISTENING):
            _stop(proc, signal.SIGKILL)
            raise RuntimeError(f"palisade did not start: {line!r}\n{self.log_path.read_text()}")
        return proc, line[len(self.LISTENING):].strip()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed."""
        _stop(self.proc, signal.SIGKILL)

    def restart(self) -> None:
        """Starts the server again on its data directory and port (after :meth:`kill`)."""
        self.proc, self.url = self._spawn(self.port)

    def stop(self) -> None:
        _stop(self.proc, signal.SIGTERM)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._tmp.cleanup()


def _pg_bin() -> Path:
    if os.environ.get("PALISADE_PG_BIN"):
        return Path(os.environ["PALISADE_PG_BIN"])
    versions = sorted(
        (int(p.name), p / "bin") for p in Path("/usr/lib/postgresql").glob("*") if p.name.isdigit() and (p / "bin" / "postgres").is_file()
    )
    if versions:
        return versions[-1][1]
    found = shutil.which("postgres")
    if found and shutil.which("initdb"):
        return Path(found).parent
    raise RuntimeError("PostgreSQL server binaries (initdb, postgres) not found: run scripts/adapter-services")


def _on_a_free_port(start: Callable[[int], None], what: str) -> None:
    """``start(port)`` on a free port, three tries: another process may take it first."""
    last = ""
    for _ in range(3):
        try:
            start(free_port())
            return
        except RuntimeError as e:
            last = str(e)
    raise RuntimeError(f"could not start {what}: {last}")


def _launch(
    what: str, argv: List[str], log_path: Path, ready: Callable[[], bool], stop_signal: int, **popen: Any
) -> "subprocess.Popen[bytes]":
    """Starts ``argv`` (its output appended to ``log_path``) and polls ``ready()`` for 60 s
    at most: a database server's start shared by PostgreSQL and MariaDB. A process that
    exits first, or is not ready by then (stopped with ``stop_signal``), raises."""
    log = open(log_path, "ab")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, **popen)
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited:\n{log_path.read_text(errors='replace')}")
        if ready():
            return proc
        time.sleep(0.05)
    _stop(proc, stop_signal)
    raise RuntimeError(f"{what} not ready within 60 s")


class PostgresServer:
    """A throwaway PostgreSQL cluster (fsync on). PostgreSQL refuses to run as root, so as
    root the cluster belongs to ``nobody`` and the server runs as ``nobody``."""

    def __init__(self) -> None:
        self.bin = _pg_bin()
        self.user: Optional[Tuple[int, int]] = None
        if os.geteuid() == 0:
            pw = pwd.getpwnam("nobody")
            self.user = (pw.pw_uid, pw.pw_gid)
        _on_a_free_port(self._start, "PostgreSQL")

    def _as_user(self) -> dict:
        if self.user is None:
            return {}
        return {"user": self.user[0], "group": self.user[1], "extra_groups": []}

    def _start(self, port: int) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="palisade-pg-", dir="/tmp")
        if self.user is not None:
            os.chown(self.dir.name, *self.user)
        data = Path(self.dir.name) / "data"
        env = {**os.environ, "LC_ALL": "C"}
        init = subprocess.run(
            [str(self.bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
            cwd=self.dir.name, env=env, capture_output=True, **self._as_user(),
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr.decode(errors='replace')}")
        self.log_path = Path(self.dir.name) / "server.log"
        self.port = port

        def ready() -> bool:
            return subprocess.run(
                [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ).returncode == 0

        self.proc = _launch(
            "postgres",
            [str(self.bin / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1",
             "-c", "unix_socket_directories=", "-c", "max_connections=100"],
            self.log_path, ready, signal.SIGINT, cwd=self.dir.name, env=env, **self._as_user(),
        )

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def stop(self) -> None:
        _stop(self.proc, signal.SIGINT)  # PostgreSQL's fast shutdown
        self.dir.cleanup()


class MariaDBServer:
    """A throwaway MariaDB (InnoDB, ``innodb_flush_log_at_trx_commit = 1``): ``root`` with
    no password on 127.0.0.1 only. As root, the server runs as root (``--user=root``)."""

    def __init__(self) -> None:
        def find(*names: str) -> str:
            for name in names:
                found = shutil.which(name) or shutil.which(name, path="/usr/sbin")
                if found:
                    return found
            raise RuntimeError(f"{names[0]} not found: run scripts/adapter-services")

        self.server = find("mariadbd", "mysqld")
        self.install = find("mariadb-install-db", "mysql_install_db")
        self.client = find("mariadb", "mysql")
        _on_a_free_port(self._start, "MariaDB")

    def _start(self, port: int) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="palisade-mariadb-", dir="/tmp")
        data = Path(self.dir.name) / "data"
        user = ["--user=root"] if os.geteuid() == 0 else []
        init = subprocess.run(
            [self.install, "--no-defaults", f"--datadir={data}",
             "--auth-root-authentication-method=normal", "--skip-test-db", *user],
            capture_output=True,
        )
        if init.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {init.stderr.decode(errors='replace')}")
        self.log_path = Path(self.dir.name) / "server.log"
        self.port = port
        self.proc = _launch(
            "mariadbd",
            [self.server, "--no-defaults", f"--datadir={data}", f"--socket={self.dir.name}/sock",
             f"--pid-file={self.dir.name}/pid", "--bind-address=127.0.0.1", f"--port={port}",
             "--skip-name-resolve", "--max-connections=200", *user],
            self.log_path, lambda: self.sql("SELECT 1").returncode == 0, signal.SIGKILL,
        )

    def sql(self, statement: str) -> "subprocess.CompletedProcess[bytes]":
        """Runs ``statement`` as root with the command-line client."""
        return subprocess.run(
            [self.client, "--no-defaults", "-h", "127.0.0.1", "-P", str(self.port), "-u", "root",
             "-e", statement],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        _stop(self.proc, signal.SIGTERM)
        self.dir.cleanup()


class EtcdMember:
    """A one-member etcd cluster for the three-node tests: client and peer ports free on
    loopback, data in a temp dir, short election settings (as the Rust etcd tests use),
    stopped by process id."""

    def __init__(self) -> None:
        etcd = os.environ.get("ETCD_BIN") or shutil.which("etcd")
        if etcd is None:
            raise RuntimeError("etcd not found: install Debian's etcd-server (scripts/python-test does)")
        self.dir = tempfile.TemporaryDirectory(prefix="palisade-etcd-")
        client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
        self.url = client
        self.proc = subprocess.Popen(
            [etcd, "--name", "m0", "--data-dir", str(Path(self.dir.name) / "m0"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"m0={peer}", "--initial-cluster-state", "new",
             "--heartbeat-interval", "50", "--election-timeout", "500",
             "--logger", "zap", "--log-level", "error"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}")
            try:
                if '"true"' in httpx.get(client + "/health", timeout=1).text:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("etcd did not become healthy within 30 s")

    def stop(self) -> None:
        _stop(self.proc, signal.SIGKILL)
        self.dir.cleanup()


def run_writer(args: List[str], stdin: Optional[str] = None) -> List[str]:
    """Runs the Rust writer; its stdout lines (each an outcome). Exit 2 is a failure."""
    done = subprocess.run(
        [str(fenced_writer_bin()), *args], input=stdin, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise AssertionError(f"fenced_writer {args[0]} failed ({done.returncode}): {done.stderr}")
    return done.stdout.splitlines()


def principal(name: str, key: str, locks: str, allow: Sequence[str], max_ttl_ms: Optional[int] = None) -> str:
    """One ``[[principal]]`` of an ``--auth-file`` with one grant; its bearer key is
    stored as the key's SHA-256, as the server reads it."""
    lines = ["[[principal]]", f'name = "{name}"', f'key_sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"']
    if max_ttl_ms is not None:
        lines.append(f"max_ttl_ms = {max_ttl_ms}")
    lines += ["[[principal.grant]]", f'locks = "{locks}"', f"allow = {json.dumps(list(allow))}"]
    return "\n".join(lines) + "\n"


def auth_file(dir: Path, *principals: str) -> Path:
    """An ``--auth-file`` in ``dir`` listing ``principals`` (see :func:`principal`)."""
    path = dir / "auth.toml"
    path.write_text("\n".join(principals))
    return path
