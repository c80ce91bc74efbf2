"""The renewal schedule of one lease, as a state machine with time passed in.

Both clients drive it (a thread in the blocking client, a task in the asyncio one); the
decisions live here so they can be tested with made-up clocks, like the Rust client's
paused-time tests.

- A renewal is due every ``ttl / 3`` after the last success; a failed renewal is retried
  after ``ttl / 10`` (at least 10 ms) until the deadline.
- The local deadline is *the time the last successful renewal was sent* + ttl. Counting
  from the send, not the answer, means the client believes in its lease for less time
  than the server grants it, never more (clock rates aside).
- The lease is lost when the server says ``lease_expired``, when a write is refused as
  stale (a newer epoch exists), or when the deadline passes without a success, even if
  a renewal request is stuck. Lost is final: the schedule never re-acquires, since a new
  lease is a new epoch and the holder must see that.
"""

from __future__ import annotations

from typing import Optional


class Renewal:
    """When to renew, until when the lease is believed alive, and whether it is lost.

    Times are seconds on a monotonic clock, passed in by the caller.
    """

    def __init__(self, ttl_ms: int, sent_at: float) -> None:
        self.ttl = ttl_ms / 1000
        self.period = self.ttl / 3
        self.retry_after = max(self.ttl / 10, 0.01)
        self.deadline = sent_at + self.ttl
        self.next_at = sent_at + self.period
        self.lost_reason: Optional[str] = None

    def due(self) -> float:
        """When the next renewal should be sent."""
        return min(self.next_at, self.deadline)

    def is_lost(self, now: float) -> bool:
        return self.lost_reason is not None or now >= self.deadline

    def reason(self, now: float) -> Optional[str]:
        """Why the lease is lost, or ``None`` while it is believed alive."""
        if self.lost_reason is not None:
            return self.lost_reason
        if now >= self.deadline:
            return "no renewal succeeded before the lease's deadline"
        return None

    def timeout(self, now: float) -> float:
        """How long a renewal sent at ``now`` may take: past the deadline it is moot."""
        return max(self.deadline - now, 0.001)

    def renewed(self, sent_at: float, ttl_ms: int) -> None:
        """A renewal sent at ``sent_at`` succeeded; the server granted ``ttl_ms``."""
        if self.lost_reason is not None:
            return
        self.deadline = max(self.deadline, sent_at + min(ttl_ms / 1000, self.ttl))
        self.next_at = sent_at + self.period

    def failed(self, now: float) -> None:
        """A renewal failed in a way that leaves the lease possibly alive (timeout,
        unreachable server, 503): retry soon, until the deadline."""
        self.next_at = now + self.retry_after

    def lose(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
