"""The Python gates under their database's own faults: ``palisade verify --target
postgres-gate | sqlite-gate --gate-lang python`` (S16), run with this interpreter, so the
package under test is the one installed here.

Five worker processes take locks from a real ``palisade serve`` and write through
``gate_app.py``, an application that admits with ``palisade.gates`` in the same
transaction as each write, while the harness kills and pauses the database (for SQLite,
the Python process holding the file), cuts and delays the connections to it, pauses
workers and crashes the lock server. With the settings the preflight insists on, the
checkers must find nothing and the gate must have refused a late write; with
``synchronous_commit=off`` (``--unsafe-db``) a crash of PostgreSQL must lose
acknowledged writes, and the report must name the setting. The Rust gates' runs are in
``crates/cli/tests/verify_gates.rs``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

from servers import palisade_bin

#: Every fault of the gate targets; 25 s runs see each at least once.
ALL_FAULTS = ["pause", "kill", "delay", "drop", "partition", "db-kill", "db-pause", "db-drop", "db-delay"]


def verify(tmp_path: Path, *args: str) -> Tuple[int, str, Dict[str, Any], str]:
    """Runs ``palisade verify ARGS`` with this interpreter's Python gate: the exit code,
    stdout, the summary and the HTML report."""
    out = tmp_path / "out"
    run = subprocess.run(
        [str(palisade_bin()), "verify", "--gate-lang", "python", "--python", sys.executable,
         "--seed", "7", "--out", str(out), *args],
        capture_output=True, text=True, timeout=600,
    )
    summary_file = out / "summary.json"
    assert summary_file.exists(), f"no summary ({run.returncode}):\n{run.stdout}\n{run.stderr}"
    summary = json.loads(summary_file.read_text())
    return run.returncode, run.stdout, summary, (out / "report.html").read_text()


def assert_clean(code: int, stdout: str, summary: Dict[str, Any], faults: List[str]) -> None:
    assert code == 0, stdout
    assert summary["violations"] == 0, stdout
    for fault in faults:
        assert summary["faults"].get(fault, 0) >= 1, f"{fault} was never injected: {stdout}"
    assert summary["fail_codes"].get("stale_token", 0) >= 1, (
        f"no late write was refused by the Python gate, so the clean run proves little: {stdout}"
    )


def test_the_python_sqlite_gate_holds_when_its_process_is_killed_and_paused(tmp_path: Path) -> None:
    code, stdout, summary, report = verify(tmp_path, "--target", "sqlite-gate", "--time", "25")
    assert_clean(code, stdout, summary, ALL_FAULTS)
    assert summary["ops_by_kind"]["add"]["ok"] >= 5, stdout
    assert "through the Python gate" in report and "gate_app.py" in report
    assert "--gate-lang python" in stdout, "the rerun command drops the gate's language"


def test_the_python_postgres_gate_holds_under_database_faults(tmp_path: Path) -> None:
    code, stdout, summary, report = verify(tmp_path, "--target", "postgres-gate", "--time", "25")
    assert_clean(code, stdout, summary, ALL_FAULTS)
    assert "through the Python gate" in report and "UNSAFE" not in report


def test_the_python_postgres_gate_loses_writes_when_commits_are_async(tmp_path: Path) -> None:
    code, stdout, summary, report = verify(
        tmp_path, "--target", "postgres-gate", "--time", "20", "--faults", "db-kill,pause", "--unsafe-db",
    )
    # 1: violations found (2 would mean the run itself failed).
    assert code == 1, stdout
    assert summary["violations"] > 0, f"synchronous_commit=off lost nothing: {stdout}"
    assert summary["faults"]["db-kill"] >= 1, stdout
    assert "UNSAFE" in report and "synchronous_commit" in report


def test_the_python_gate_has_no_redis_target(tmp_path: Path) -> None:
    run = subprocess.run(
        [str(palisade_bin()), "verify", "--gate-lang", "python", "--target", "redis-gate",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 2, run.stdout
    assert "postgres-gate and sqlite-gate" in run.stderr, run.stderr
