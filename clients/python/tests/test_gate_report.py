"""A gate that reports to the server: the SQLite gate counts into a ``GateTally``
(``admit(..., tally=)``) and a ``Reporter`` sends it to a real ``palisade serve``. The
stale writer the database refused shows in ``/metrics`` by kind and code and as a
``gate_refused`` event; with the server away the counts are put back, not lost, and go
with the next report once it is back. And the tally's own rules: what it counts, its
bounds, the merge of a report put back."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Dict, Iterator

import httpx
import pytest

from palisade import Client, ConflictError, StaleTokenError, TransportError, WrongLockError
from palisade.gates import sqlite as sqlite_gate
from palisade.gates.report import MAX_REPORTED_MARKS, MAX_REPORTED_REFUSALS, GateTally, Reporter
from palisade.tokens import KeyRing, Verifier

from servers import PalisadeServer

ADMITS = 'palisade_gate_admits_total{resource="sqlite"}'
STALE = 'palisade_gate_refusals_total{code="stale_token",resource="sqlite"}'
WRONG = 'palisade_gate_refusals_total{code="wrong_lock",resource="sqlite"}'


def stale(epoch: int) -> StaleTokenError:
    return StaleTokenError(high_water=100, epoch=epoch)


def test_the_tally_counts_decisions_by_kind_and_code_and_is_taken_once() -> None:
    tally = GateTally()
    tally.admitted("postgres", "orders", 100)
    tally.refused("postgres", "orders", stale(7))
    # Neither a lost race nor anything that is not a gate's refusal is counted.
    tally.refused("postgres", "orders", ConflictError("lost a race"))
    tally.refused("postgres", "orders", ValueError("a bad seq"))
    tally.refused("sqlite", "orders", WrongLockError("payments", "orders"))
    assert tally.take() == [
        {
            "resource": "postgres",
            "admitted": 1,
            "refused": {"stale_token": 1},
            "recent": [{"lock": "orders", "code": "stale_token", "epoch": 7, "high_water": 100}],
            "marks": [{"lock": "orders", "high_water": 100}],
        },
        {
            "resource": "sqlite",
            "admitted": 0,
            "refused": {"wrong_lock": 1},
            "recent": [{"lock": "orders", "code": "wrong_lock", "epoch": None, "high_water": None}],
            "marks": [],
        },
    ]
    assert tally.take() == []
    with pytest.raises(ValueError):
        tally.admitted("oracle", "orders", 1)


def test_the_tally_keeps_the_newest_refusals_and_every_count_however_long_it_waits() -> None:
    tally = GateTally()
    for epoch in range(250):
        tally.refused("sqlite", "orders", stale(epoch))
    (report,) = tally.take()
    assert report["refused"] == {"stale_token": 250}
    assert len(report["recent"]) == MAX_REPORTED_REFUSALS
    assert report["recent"][0]["epoch"] == 150, "the oldest were dropped"
    for epoch in range(250, 260):
        tally.refused("sqlite", "orders", stale(epoch))
    tally.admitted("sqlite", "orders", 100)
    tally.put_back(report)
    (merged,) = tally.take()
    assert merged["refused"] == {"stale_token": 260}
    assert merged["admitted"] == 1
    assert [r["epoch"] for r in merged["recent"]] == list(range(160, 260))


def test_marks_keep_the_highest_per_lock_for_the_locks_seen_last() -> None:
    tally = GateTally()
    tally.admitted("postgres", "orders", 8)
    tally.refused("postgres", "orders", StaleTokenError(high_water=5, epoch=4))
    for i in range(MAX_REPORTED_MARKS):
        tally.admitted("postgres", f"other.{i}", 1)
        if i == 0:
            tally.admitted("postgres", "orders", 8)
    (report,) = tally.take()
    marks = {m["lock"]: m["high_water"] for m in report["marks"]}
    assert len(marks) == MAX_REPORTED_MARKS
    assert marks["orders"] == 8, "the highest, kept"
    assert "other.0" not in marks, "the lock seen longest ago went"
    # Put back under newer marks: the newer ones win the room.
    tally.admitted("postgres", "orders", 9)
    tally.put_back(report)
    (merged,) = tally.take()
    marks = {m["lock"]: m["high_water"] for m in merged["marks"]}
    assert len(marks) == MAX_REPORTED_MARKS
    assert marks["orders"] == 9


def scrape(url: str) -> Dict[str, float]:
    samples = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def gate_refused(url: str, lock: str) -> Dict[str, object]:
    """The first ``gate_refused`` event among the lock's newest 50, read from the stream."""
    with httpx.stream("GET", f"{url}/v1/locks/{lock}/events?backlog=50", timeout=10) as stream:
        kind = ""
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: ") and kind == "gate_refused":
                event = json.loads(line[len("data: "):])
                return {k: event[k] for k in ("lock", "resource", "code", "epoch", "high_water")}
    raise AssertionError("no gate_refused event")


@pytest.fixture
def own_server() -> Iterator[PalisadeServer]:
    srv = PalisadeServer()
    yield srv
    srv.stop()


def test_a_gates_refusal_reaches_metrics_and_events_and_waits_out_the_server_being_away(
    own_server: PalisadeServer, tmp_path: Path
) -> None:
    db = str(tmp_path / "app.db")
    with sqlite3.connect(db, isolation_level=None) as conn:
        sqlite_gate.migrate(conn)
        conn.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    tally = GateTally()
    client = Client(own_server.url)
    verifier = Verifier(KeyRing.from_public_keys(client.keys()))

    def write(token: str, value: str) -> None:
        with sqlite3.connect(db, isolation_level=None) as conn, sqlite_gate.transaction(conn):
            sqlite_gate.admit(conn, verifier, token, "L", tally=tally)
            conn.execute("INSERT INTO kv VALUES ('k', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", (value,))

    first = client.acquire("L", holder="a", ttl_ms=60_000)
    old = first.token
    write(old, "one")
    first.release()
    second = client.acquire("L", holder="b", ttl_ms=60_000)
    write(second.token, "two")
    with pytest.raises(StaleTokenError):
        write(old, "late")
    other = client.acquire("M", holder="c", ttl_ms=60_000)
    with pytest.raises(WrongLockError):
        write(other.token, "x")

    with Reporter(client, tally, every=60) as reporter:
        reporter.flush()
        now = scrape(own_server.url)
        assert (now.get(ADMITS), now.get(STALE), now.get(WRONG)) == (2.0, 1.0, 1.0)
        # The gate's refusal on the lock's events (read raw: the client skips this type).
        assert gate_refused(own_server.url, "L") == {
            "lock": "L", "resource": "sqlite", "code": "stale_token", "epoch": 1, "high_water": 2,
        }
        # The database's mark beside the store's (nothing written to the store: null).
        (marks,) = httpx.get(own_server.url + "/v1/gates/marks?prefix=L", timeout=10).json()["locks"]
        assert (marks["lock"], marks["store"]) == ("L", None)
        assert [(m["resource"], m["high_water"]) for m in marks["resources"]] == [("sqlite", 2)]

        # The server away: the report is put back into the tally, not lost.
        own_server.kill()
        with pytest.raises(StaleTokenError):
            write(old, "later")
        write(second.token, "three")
        with pytest.raises(TransportError):
            reporter.flush()
        assert reporter.put_back_reports == 1
        own_server.restart()
        deadline = time.monotonic() + 20
        while True:
            try:
                client.health()
                break
            except TransportError:
                assert time.monotonic() < deadline, "the server never came back"
                time.sleep(0.05)
        with pytest.raises(StaleTokenError):
            write(old, "even later")
        reporter.flush()
        now = scrape(own_server.url)
        # A restarted server counts from zero: what came while it was away, and since.
        assert (now.get(ADMITS), now.get(STALE)) == (1.0, 2.0)
        assert reporter.refused_reports == 0
    assert tally.take() == []
    client.close()
