"""What the gates admitted and refused, counted so that a refusal inside your database
shows where operators look: the server's ``/metrics`` and events stream, through
``POST /v1/gates/report`` (the same reports as the Rust gates' ``GateTally``).

Give a :class:`GateTally` to the gates (``admit(..., tally=tally)``): each admit counts as
admitted, or as refused by its error code, by the kind of database that decided
(``postgres``, ``mysql``, ``sqlite``), and the database's mark for the lock, as the admit
saw it, is kept for the server's view of each resource's marks (``GET /v1/gates/marks``).
Counting takes a short lock and sends nothing on the write's path. The tally holds
counters, the newest :data:`MAX_REPORTED_REFUSALS` refusals and at most
:data:`MAX_REPORTED_MARKS` marks of each kind, so it stays bounded however long the
server is away. A :class:`Reporter` sends it from a thread of its own.

What is counted:

- **admitted**: an admit that passed. In a SQL transaction the caller may still roll
  back; the count is of admits, not of commits.
- **refused**, by code: ``missing_token``, ``invalid_token``, ``wrong_lock``, and the
  stale ones, ``stale_token`` and ``stale_sequence``, with the writer's epoch and the
  database's mark.
- Not counted: lost races (``write_conflict``, which the caller retries) and database
  failures (``storage_failed``): neither is a decision about the writer.
- **marks**: for each lock, the highest mark an admit stored with its write or a stale
  refusal read. A transaction the caller rolled back after its admit leaves the
  database's mark lower than the one reported.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional

from .._errors import (
    InvalidTokenError,
    MissingTokenError,
    PalisadeError,
    StaleSequenceError,
    StaleTokenError,
    StorageFailedError,
    TransportError,
    UnavailableError,
    WrongLockError,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .._sync import Client

__all__ = ["GateTally", "Reporter", "MAX_REPORTED_REFUSALS", "MAX_REPORTED_MARKS", "RESOURCE_KINDS"]

#: Most refusals one report carries (the server refuses more).
MAX_REPORTED_REFUSALS = 100

#: Most marks one report carries (the server refuses more).
MAX_REPORTED_MARKS = 100

#: The kinds of resource a report may name.
RESOURCE_KINDS = ("postgres", "mysql", "redis", "sqlite", "object_store", "other")

# The refusals a report counts: decisions about the writer.
_REFUSALS = (MissingTokenError, InvalidTokenError, WrongLockError, StaleTokenError, StaleSequenceError)


class _Counts:
    def __init__(self) -> None:
        self.admitted = 0
        self.refused: Dict[str, int] = {}
        self.recent: Deque[Dict[str, Any]] = deque(maxlen=MAX_REPORTED_REFUSALS)
        # Each lock's highest mark since the last take, in the order last seen (a dict
        # keeps insertion order: a lock seen again moves to the end), so the one seen
        # longest ago goes first past MAX_REPORTED_MARKS.
        self.marks: Dict[str, int] = {}

    def see_mark(self, lock: str, mark: int) -> None:
        high = max(mark, self.marks.pop(lock, mark))
        if len(self.marks) >= MAX_REPORTED_MARKS:
            del self.marks[next(iter(self.marks))]
        self.marks[lock] = high


class GateTally:
    """Admits and refusals by kind of resource since the last :meth:`take`. Thread-safe:
    share one between every gate of a process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kinds: Dict[str, _Counts] = {}

    def _counts(self, resource: str) -> _Counts:
        if resource not in RESOURCE_KINDS:
            raise ValueError(f"unknown resource kind {resource!r}")
        return self._kinds.setdefault(resource, _Counts())

    def admitted(self, resource: str, lock: str, mark: int) -> None:
        """Counts one admit of ``lock``'s data that passed in a ``resource``, its mark
        now at epoch ``mark``."""
        with self._lock:
            counts = self._counts(resource)
            counts.admitted += 1
            counts.see_mark(lock, mark)

    def refused(self, resource: str, lock: str, error: BaseException) -> None:
        """Counts ``error`` raised by an admit of ``lock``'s data, if it is a refusal of
        the writer (see the module docs); anything else is ignored."""
        if not isinstance(error, _REFUSALS):
            return
        epoch: Optional[int] = None
        high_water: Optional[int] = None
        if isinstance(error, (StaleTokenError, StaleSequenceError)):
            epoch, high_water = error.epoch, error.high_water
        code = error.code
        with self._lock:
            counts = self._counts(resource)
            counts.refused[code] = counts.refused.get(code, 0) + 1
            if high_water is not None:
                counts.see_mark(lock, high_water)
            counts.recent.append({"lock": lock, "code": code, "epoch": epoch, "high_water": high_water})

    def take(self) -> List[Dict[str, Any]]:
        """Everything counted so far, one report (the body of ``POST /v1/gates/report``)
        per kind of resource that saw anything; starts again from zero."""
        with self._lock:
            kinds, self._kinds = self._kinds, {}
        return [
            {
                "resource": kind,
                "admitted": c.admitted,
                "refused": dict(c.refused),
                "recent": list(c.recent),
                "marks": [{"lock": lock, "high_water": mark} for lock, mark in sorted(c.marks.items())],
            }
            for kind, c in sorted(kinds.items())
        ]

    def put_back(self, report: Dict[str, Any]) -> None:
        """Puts back a report that could not be sent: its counts are added to what was
        counted since, its refusals kept before the newer ones (the newest
        :data:`MAX_REPORTED_REFUSALS` in all), its marks as if seen before the newer
        ones."""
        with self._lock:
            counts = self._counts(report["resource"])
            counts.admitted += int(report.get("admitted", 0))
            for code, n in report.get("refused", {}).items():
                counts.refused[code] = counts.refused.get(code, 0) + int(n)
            newer = list(counts.recent)
            counts.recent.clear()
            counts.recent.extend(list(report.get("recent", [])) + newer)
            newer_marks, counts.marks = counts.marks, {}
            for m in report.get("marks", []):
                counts.see_mark(m["lock"], int(m["high_water"]))
            for lock, mark in newer_marks.items():
                counts.see_mark(lock, mark)


def _server_away(error: PalisadeError) -> bool:
    """Whether the report may go through later (the server was not reached or could not
    take it now), as opposed to a refusal of the report itself."""
    if isinstance(error, (TransportError, UnavailableError, StorageFailedError)):
        return True
    status = getattr(error, "status", None)
    return status is not None and status >= 500


class Reporter:
    """Sends a :class:`GateTally` to the server behind ``client`` (a blocking
    :class:`palisade.Client`, whose credentials need a ``write`` grant on every lock a
    refusal names) every ``every`` seconds, from a daemon thread, so a write never waits
    for it. :meth:`close` stops it (``with Reporter(...):`` does); :meth:`flush` sends at
    once.

    When the server is away (no connection, a 5xx answer) the report is put back into the
    tally, which stays bounded, and goes with the next one; a report whose answer was lost
    on the way may so be counted twice. A report the server refuses (a 4xx) is dropped
    rather than sent again for ever; :attr:`refused_reports` counts those."""

    def __init__(self, client: "Client", tally: GateTally, every: float = 10.0) -> None:
        self._client = client
        self._tally = tally
        self._every = max(0.1, float(every))
        self._stop = threading.Event()
        self._sending = threading.Lock()
        self.put_back_reports = 0
        self.refused_reports = 0
        self._thread = threading.Thread(target=self._loop, name="palisade-gate-reporter", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self.flush()
            except PalisadeError:
                pass  # put back or dropped, and counted, by flush

    def flush(self) -> None:
        """Sends what was counted since the last report now; raises the first error if a
        report did not go through (it was put back or dropped as the class docs say)."""
        first: Optional[PalisadeError] = None
        with self._sending:
            for report in self._tally.take():
                try:
                    self._client.report_gate(report)
                except PalisadeError as e:
                    if _server_away(e):
                        self._tally.put_back(report)
                        self.put_back_reports += 1
                    else:
                        self.refused_reports += 1
                    first = first or e
        if first is not None:
            raise first

    def close(self) -> None:
        """Stops the thread (what was not sent stays in the tally)."""
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
