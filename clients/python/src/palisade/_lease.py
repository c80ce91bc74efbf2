"""What the blocking and the asyncio lease share: the grant, its renewal schedule read
under the lease's guard, and sequence numbers. Renewing is each client's own business
(a thread, or a task); deciding when the lease is lost is ``_renewal``'s."""

from __future__ import annotations

import itertools
import time
from typing import ContextManager, Optional

from ._attrs import Forward
from ._errors import LeaseLostError
from ._renewal import Deadlines, Renewal
from ._types import Grant


class Scheduled:
    """Something kept alive by a renewal schedule: a lease, or a session.

    ``guard`` protects the schedule: the blocking client's condition variable (its renewal
    thread writes the schedule while callers read it), or a no-op for the asyncio client,
    whose task runs on the caller's loop.
    """

    def __init__(self, ttl_ms: int, sent_at: float, guard: ContextManager[object], deadlines: Deadlines) -> None:
        self._renewal = Renewal(ttl_ms, sent_at, deadlines)
        self._guard = guard

    def _name(self) -> str:
        raise NotImplementedError

    @property
    def lost(self) -> bool:
        """True once it is known or presumed lost (a session: with every lock in it).
        ``False`` is not permission to write: the process can pause right after asking."""
        with self._guard:
            return self._renewal.is_lost(time.monotonic())

    @property
    def safe_until(self) -> float:
        """Until when the holder may act, on the ``time.monotonic()`` clock: the send time of
        the last renewal the server confirmed plus the TTL less the clock-drift margin
        (:class:`Deadlines`). In the past once the server said it ended. After the client
        gave up at the renewal deadline it still says how long what already runs may go on."""
        with self._guard:
            return self._renewal.safe_until

    @property
    def safe_for(self) -> float:
        """Seconds from now the holder may still act: 0 once ``safe_until`` has passed."""
        return max(0.0, self.safe_until - time.monotonic())

    @property
    def renew_deadline(self) -> float:
        """When the client gives up unless a renewal succeeds first (``time.monotonic()``
        clock): the last confirmed renewal's send plus ``renew_deadline`` of the TTL."""
        with self._guard:
            return self._renewal.renew_by

    @property
    def lost_reason(self) -> Optional[str]:
        """Why it is lost, or ``None`` while it is believed alive."""
        with self._guard:
            return self._renewal.reason(time.monotonic())

    def ensure_alive(self) -> None:
        """Raises :class:`LeaseLostError` if it is known or presumed lost."""
        reason = self.lost_reason
        if reason is not None:
            raise LeaseLostError(f"{self._name()} is lost: {reason}")


class LeaseBase(Scheduled):
    """A granted lease and its renewal schedule."""

    def __init__(self, grant: Grant, sent_at: float, guard: ContextManager[object], deadlines: Deadlines) -> None:
        super().__init__(grant.ttl_ms, sent_at, guard, deadlines)
        self._grant = grant
        self._seq = itertools.count(1)

    def _name(self) -> str:
        return f"lease {self.lease_id} on {self.lock!r}"

    @property
    def grant(self) -> Grant:
        """The lease as granted."""
        return self._grant

    lock = Forward[str]("_grant")
    holder = Forward[str]("_grant")
    epoch = Forward[int]("_grant", "This holder's ownership generation.")
    token = Forward[str]("_grant", "The fencing token to attach to every mutation of this lock's resources.")
    lease_id = Forward[str]("_grant")
    ttl_ms = Forward[int]("_grant")

    def next_seq(self) -> int:
        """1, 2, 3, ...: sequence numbers for this lease's writes to a ``sequence``
        namespace, where (epoch, seq) must strictly increase."""
        with self._guard:
            return next(self._seq)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lock={self.lock!r}, epoch={self.epoch}, lease_id={self.lease_id!r})"
