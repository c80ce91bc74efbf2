"""Leader election on one lock, for both clients (docs/election.md is the guide).

The election *is* the lock named after it: a candidate campaigns by acquiring it with its
value (what it advertises, e.g. its address), waiting in the server's first-come
first-served line; the holder leads, its lease's epoch is its term and its fencing token,
and lock status shows who leads, with which value and epoch. Resigning releases the lock
and the next candidate in line leads at once.

What a leader must do, and what this does not do:

- **Fence before acting (S10).** Winning notifies no resource. A former leader that
  paused may still have writes in flight, and they pass until the resource has seen the
  new epoch. A new leader calls :meth:`Leader.fence` (or writes with its token) on every
  resource it guards before it acts; the resource, not this module, refuses the old one.
- ``leader.lost`` being false is not permission to act: leadership ends at the server
  when the lease expires, whatever the leader believes.
- Observers poll (every ``poll_interval`` seconds, 0.5 by default): they see a change at
  most one interval late and may miss a leader that came and went within one interval
  (the epochs show the gap). The events stream (``GET /v1/locks/{lock}/events``) is the
  second source to plug in here: :class:`_Poll` is the seam.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional, Union

from ._errors import LockHeldError
from ._types import LockStatus, Proclaimed

if TYPE_CHECKING:  # pragma: no cover
    from . import aio
    from ._sync import Client, FencedKv, Lease

__all__ = ["Election", "Leader", "LeaderInfo", "Observer"]

#: How often an observer looks, in seconds, unless told.
DEFAULT_POLL_INTERVAL = 0.5
#: The longest one wait in line may be (the server's bound); campaigns wait in rounds.
_MAX_WAIT_MS = 300_000


@dataclass(frozen=True)
class LeaderInfo:
    """Who leads: the holder, its term (its lease's epoch, which is also its fencing
    token's) and what it advertises."""

    holder: str
    epoch: int
    value: Optional[bytes]

    @staticmethod
    def of(status: LockStatus) -> Optional["LeaderInfo"]:
        if status.holder is None:
            return None
        epoch = status.lease_epoch if status.lease_epoch is not None else status.epoch
        return LeaderInfo(status.holder, epoch, status.value)


class _Poll:
    """Where an observer learns of changes today: the lock's status, every ``every``
    seconds. An events-stream source would offer the same ``next_wait`` contract."""

    def __init__(self, every: float) -> None:
        self.every = every


def _wait_ms(deadline: Optional[float]) -> int:
    """The next round's wait in line: what is left before ``deadline``, at most the
    server's bound."""
    if deadline is None:
        return _MAX_WAIT_MS
    return max(0, min(_MAX_WAIT_MS, int((deadline - time.monotonic()) * 1000)))


class Election:
    """An election on the lock ``name``: candidates campaign, observers watch."""

    def __init__(
        self,
        client: "Client",
        name: str,
        *,
        ttl_ms: int = 10_000,
        lock_delay_ms: Optional[int] = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        self._client = client
        self.name = name
        self.ttl_ms = ttl_ms
        self.lock_delay_ms = lock_delay_ms
        self.poll_interval = max(poll_interval, 0.01)

    def campaign(
        self, value: Union[bytes, str], *, candidate: Optional[str] = None, timeout: Optional[float] = None
    ) -> "Leader":
        """Waits in line until this candidate leads, advertising ``value``; with
        ``timeout`` (seconds), raises :class:`LockHeldError` once it has passed. Other
        errors are raised as they come: an acquire whose answer was lost is not resent."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                lease = self._client.acquire(
                    self.name, holder=candidate, ttl_ms=self.ttl_ms, wait_ms=_wait_ms(deadline),
                    value=value, lock_delay_ms=self.lock_delay_ms,
                )
                return Leader(lease)
            except LockHeldError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    def leader(self) -> Optional[LeaderInfo]:
        """Who leads now, if anyone."""
        return LeaderInfo.of(self._client.lock_status(self.name))

    def observe(self) -> "Observer":
        """An observer of this election's leadership changes."""
        return Observer(self._client, self.name, _Poll(self.poll_interval))


class Leader:
    """This candidate leads: a lease on the election's lock, renewed in the background."""

    def __init__(self, lease: "Lease") -> None:
        self.lease = lease

    @property
    def epoch(self) -> int:
        """The term: also the fencing token's epoch."""
        return self.lease.epoch

    @property
    def token(self) -> str:
        """The fencing token to attach to every write this leader makes."""
        return self.lease.token

    @property
    def lost(self) -> bool:
        """True once leadership is known or presumed lost; False is no promise."""
        return self.lease.lost

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        return self.lease.wait_lost(timeout)

    def proclaim(self, value: Union[bytes, str]) -> Proclaimed:
        """Replaces what this leader advertises."""
        return self.lease.proclaim(value)

    @property
    def kv(self) -> "FencedKv":
        """The namespace named after the election, writes carrying this term's token."""
        return self.lease.kv

    def fence(self) -> int:
        """Barrier on the namespace named after the election: from now on it refuses every
        earlier leader's writes (S10). Call it, on every resource led, before acting."""
        return self.lease.fence()

    def resign(self) -> None:
        """Steps down: the next candidate in line leads at once."""
        self.lease.release()

    def __enter__(self) -> "Leader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.resign()


class Observer:
    """Watches an election: :meth:`changed` returns each new leadership."""

    def __init__(self, client: "Client", lock: str, source: _Poll) -> None:
        self._client = client
        self._lock = lock
        self._source = source
        self._seen: Any = _NOTHING

    def changed(self, timeout: Optional[float] = None) -> Optional[LeaderInfo]:
        """The leadership now, at the first call; after that, blocks until it differs from
        what was returned last (another leader, epoch or value, or nobody) and returns it.
        With ``timeout`` (seconds), raises :class:`TimeoutError` when nothing changed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            now = LeaderInfo.of(self._client.lock_status(self._lock))
            if self._seen is _NOTHING or now != self._seen:
                self._seen = now
                return now
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no leadership change of {self._lock!r} within {timeout} s")
            time.sleep(self._source.every)

    def __iter__(self) -> Iterator[Optional[LeaderInfo]]:
        while True:
            yield self.changed()


_NOTHING = object()


class AsyncElection:
    """The asyncio twin of :class:`Election` (``palisade.aio.Election``)."""

    def __init__(
        self,
        client: "aio.Client",
        name: str,
        *,
        ttl_ms: int = 10_000,
        lock_delay_ms: Optional[int] = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        self._client = client
        self.name = name
        self.ttl_ms = ttl_ms
        self.lock_delay_ms = lock_delay_ms
        self.poll_interval = max(poll_interval, 0.01)

    async def campaign(
        self, value: Union[bytes, str], *, candidate: Optional[str] = None, timeout: Optional[float] = None
    ) -> "AsyncLeader":
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                lease = await self._client.acquire(
                    self.name, holder=candidate, ttl_ms=self.ttl_ms, wait_ms=_wait_ms(deadline),
                    value=value, lock_delay_ms=self.lock_delay_ms,
                )
                return AsyncLeader(lease)
            except LockHeldError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    async def leader(self) -> Optional[LeaderInfo]:
        return LeaderInfo.of(await self._client.lock_status(self.name))

    def observe(self) -> "AsyncObserver":
        return AsyncObserver(self._client, self.name, _Poll(self.poll_interval))


class AsyncLeader:
    """The asyncio twin of :class:`Leader`."""

    def __init__(self, lease: "aio.Lease") -> None:
        self.lease = lease

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    @property
    def token(self) -> str:
        return self.lease.token

    @property
    def lost(self) -> bool:
        return self.lease.lost

    async def wait_lost(self, timeout: Optional[float] = None) -> bool:
        return await self.lease.wait_lost(timeout)

    async def proclaim(self, value: Union[bytes, str]) -> Proclaimed:
        return await self.lease.proclaim(value)

    @property
    def kv(self) -> "aio.FencedKv":
        return self.lease.kv

    async def fence(self) -> int:
        return await self.lease.fence()

    async def resign(self) -> None:
        await self.lease.release()


class AsyncObserver:
    """The asyncio twin of :class:`Observer`."""

    def __init__(self, client: "aio.Client", lock: str, source: _Poll) -> None:
        self._client = client
        self._lock = lock
        self._source = source
        self._seen: Any = _NOTHING

    async def changed(self, timeout: Optional[float] = None) -> Optional[LeaderInfo]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            now = LeaderInfo.of(await self._client.lock_status(self._lock))
            if self._seen is _NOTHING or now != self._seen:
                self._seen = now
                return now
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no leadership change of {self._lock!r} within {timeout} s")
            await asyncio.sleep(self._source.every)
