"""The renewal schedule of one lease, as a state machine with time passed in, and the
deadlines a holder can trust (:class:`Deadlines`).

Both clients drive it (a thread in the blocking client, a task in the asyncio one); the
decisions live here so they can be tested with made-up clocks, like the Rust client's
paused-time tests.

- A renewal is due every ``ttl / 3`` after the last success; a failed renewal is retried
  after ``ttl / 10`` (at least 10 ms) until the renewal deadline.
- With ``s`` the time the last renewal the server confirmed was *sent* and ``t`` the TTL
  it granted: the holder is **safe until** ``s + t * (1 - clock_drift)``, and the
  **renewal deadline** is ``s + t * renew_deadline``. Counting from the send, not the
  answer, means the client believes in its lease for less time than the server grants it,
  never more, within the clock drift allowed for.
- The lease is lost when the server says ``lease_expired``, when a write is refused as
  stale (a newer epoch exists), or when the renewal deadline passes without a success,
  even if a renewal request is stuck: the client then gives the lease up itself (as
  Kubernetes' leader election does at its ``renewDeadline``). Lost is final: the schedule
  never re-acquires, since a new lease is a new epoch and the holder must see that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Deadlines:
    """How a client derives a holder's deadlines from the TTL (``docs/guarantees.md``).

    ``renew_deadline``: the fraction of the TTL after the last confirmed renewal's send at
    which the client gives the lease up if no renewal has succeeded since; more than 1/3
    (a renewal is sent every TTL/3) and at most ``1 - clock_drift``. Default 2/3, as
    Kubernetes' 10 s of 15 s.

    ``clock_drift``: the largest clock-rate difference assumed between this host and the
    server, as a fraction, 0 to 0.5; the safe deadline is the TTL less this share. Default
    0.01 (1 %), twenty times the 500 ppm NTP allows a disciplined clock.

    The deadlines narrow the window in which an old holder can still act; only a resource
    that checks the token closes it.
    """

    renew_deadline: float = 2 / 3
    clock_drift: float = 0.01

    def __post_init__(self) -> None:
        if not 0.0 <= self.clock_drift <= 0.5:
            raise ValueError(f"clock_drift {self.clock_drift} is outside 0 ..= 0.5 (a fraction: 0.01 is 1 %)")
        if not 1 / 3 < self.renew_deadline <= 1.0 - self.clock_drift:
            raise ValueError(
                f"renew_deadline {self.renew_deadline} (a fraction of the TTL) must be more than 1/3, when "
                f"the first renewal is sent, and at most 1 - clock_drift = {1.0 - self.clock_drift}"
            )


class Renewal:
    """When to renew, until when the holder may act, and whether the lease is lost.

    Times are seconds on a monotonic clock, passed in by the caller.
    """

    def __init__(self, ttl_ms: int, sent_at: float, deadlines: Deadlines = Deadlines()) -> None:
        self.ttl = ttl_ms / 1000
        self.deadlines = deadlines
        self.period = self.ttl / 3
        self.retry_after = max(self.ttl / 10, 0.01)
        self.renew_by = sent_at + self.ttl * deadlines.renew_deadline
        self.safe_until = sent_at + self.ttl * (1.0 - deadlines.clock_drift)
        self.next_at = sent_at + self.period
        self.lost_reason: Optional[str] = None

    def due(self) -> float:
        """When the next renewal should be sent."""
        return min(self.next_at, self.renew_by)

    def is_lost(self, now: float) -> bool:
        return self.lost_reason is not None or now >= self.renew_by

    def reason(self, now: float) -> Optional[str]:
        """Why the lease is lost, or ``None`` while it is believed alive."""
        if self.lost_reason is not None:
            return self.lost_reason
        if now >= self.renew_by:
            return "no renewal succeeded before the renewal deadline"
        return None

    def timeout(self, now: float) -> float:
        """How long a renewal sent at ``now`` may take: past the renewal deadline it is
        moot."""
        return max(self.renew_by - now, 0.001)

    def renewed(self, sent_at: float, ttl_ms: int) -> None:
        """A renewal sent at ``sent_at`` succeeded; the server granted ``ttl_ms``."""
        if self.lost_reason is not None:
            return
        granted = min(ttl_ms / 1000, self.ttl)
        self.renew_by = max(self.renew_by, sent_at + granted * self.deadlines.renew_deadline)
        self.safe_until = max(self.safe_until, sent_at + granted * (1.0 - self.deadlines.clock_drift))
        self.next_at = sent_at + self.period

    def failed(self, now: float) -> None:
        """A renewal failed in a way that leaves the lease possibly alive (timeout,
        unreachable server, 503): retry soon, until the renewal deadline."""
        self.next_at = now + self.retry_after

    def lose(self, reason: str, ended_by: Optional[float] = None) -> None:
        """The lease is lost for ``reason``. ``ended_by``: a time by which the lease is
        known to be over at the server (it said so, or it was released, or a newer epoch
        wrote): nothing may act after it."""
        if self.lost_reason is None:
            self.lost_reason = reason
        if ended_by is not None:
            self.safe_until = min(self.safe_until, ended_by)
