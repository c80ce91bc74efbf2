"""The preflight vectors (``vectors/preflight.json``, made from the Rust rules in
``crates/adapters/src/preflight.rs``): this package's PostgreSQL rule gives the same
verdict on every case, each unsafe setting named with its value and what it needs, in
the same order. A rule changed here and not in the other gates fails this test. (The
file's Redis cases are the Rust gate's only: this package has no Redis gate.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from palisade.gates.preflight import UnsafeDatabaseError, check_postgres

FILE = Path(__file__).resolve().parents[3] / "vectors" / "preflight.json"


def postgres_cases() -> List[Dict[str, Any]]:
    data: Dict[str, Any] = json.loads(FILE.read_text(encoding="utf-8"))
    cases: List[Dict[str, Any]] = data["postgres"]
    return cases


def case_id(case: Dict[str, Any]) -> str:
    return ",".join(s["name"] for s in case["unsafe"]) or "safe"


@pytest.mark.parametrize("case", postgres_cases(), ids=case_id)
def test_the_postgres_rule_gives_every_vectors_verdict(case: Dict[str, Any]) -> None:
    try:
        check_postgres(
            case["fsync"],
            case["synchronous_commit"],
            case["full_page_writes"],
            case["synchronous_standby_names"],
            case["replicas"],
        )
        found: List[Dict[str, str]] = []
    except UnsafeDatabaseError as e:
        found = [{"name": s.name, "value": s.value, "needs": s.needs} for s in e.settings]
    assert found == case["unsafe"]


def test_the_vectors_have_safe_and_unsafe_cases() -> None:
    cases = postgres_cases()
    assert any(not c["unsafe"] for c in cases)
    assert len({s["name"] for c in cases for s in c["unsafe"]}) == 4
