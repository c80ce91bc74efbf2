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
- Observers read the lock's status again whenever its events stream
  (``GET /v1/locks/{lock}/events``) reports a grant, a release, an expiry or a ``reset``,
  and at least every ``poll_interval`` seconds (0.5 by default) in any case. A new value
  from :meth:`Leader.proclaim` is no event, and a server whose stream is unavailable (too
  many streams, an older server, an etcd node, which reports no lease events) sends none:
  those changes are seen by polling, at most one interval late. Either way an observer
  may miss a leader that came and went between two reads (the epochs show the gap).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, Optional, TypeVar, Union

from ._attrs import Forward
from ._errors import LockHeldError, PalisadeError
from ._events import AsyncEventStream, Event, EventStream, FencedEvent, RejectedEvent, lock_events_path
from ._failover import Op
from ._lease import LeaseBase
from ._ops import ClientOps, asynchronous, blocking
from ._types import LockStatus, Proclaimed

if TYPE_CHECKING:  # pragma: no cover
    from . import aio
    from ._sync import Client, FencedKv, Lease

__all__ = ["Election", "Leader", "LeaderInfo", "Observer"]

T = TypeVar("T")
ClientT = TypeVar("ClientT", bound="ClientOps[Any, Any, Any, Any, Any]")
LeaseT = TypeVar("LeaseT", bound=LeaseBase)
LeaderT = TypeVar("LeaderT")
ObserverT = TypeVar("ObserverT")

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


def _wakes(event: Event) -> bool:
    """Whether an event may mean another leadership: a lease event or a reset, not the
    namespace's marks and refusals."""
    return not isinstance(event, (FencedEvent, RejectedEvent))


def _wait_ms(deadline: Optional[float]) -> int:
    """The next round's wait in line: what is left before ``deadline``, at most the
    server's bound."""
    if deadline is None:
        return _MAX_WAIT_MS
    return max(0, min(_MAX_WAIT_MS, int((deadline - time.monotonic()) * 1000)))


class _ElectionOps(Generic[ClientT, LeaderT, ObserverT]):
    """Both elections: their settings, and what campaigning and asking who leads do."""

    def __init__(
        self,
        client: ClientT,
        name: str,
        *,
        ttl_ms: int = 10_000,
        lock_delay_ms: Optional[int] = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        use_events: bool = True,
    ) -> None:
        self._client = client
        self.name = name
        self.ttl_ms = ttl_ms
        self.lock_delay_ms = lock_delay_ms
        #: Seconds between status reads when the events stream reports nothing.
        self.poll_interval = max(poll_interval, 0.01)
        #: Whether observers use the lock's events stream (False: they poll only).
        self.use_events = use_events

    def _run(self, op: Op[T]) -> Any:
        return self._client._run(op)  # type: ignore[attr-defined]

    #: The leader and observer types of this client.
    _leader_type: Callable[[Any], LeaderT]
    _observer_type: Callable[[Any, str, float, bool], ObserverT]

    def _campaign(
        self, value: Union[bytes, str], *, candidate: Optional[str] = None, timeout: Optional[float] = None
    ) -> Op[LeaderT]:
        """Waits in line until this candidate leads, advertising ``value``; with
        ``timeout`` (seconds), raises :class:`LockHeldError` once it has passed. Other
        errors are raised as they come: an acquire whose answer was lost is not resent."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                lease = yield from self._client._acquire(
                    self.name, holder=candidate, ttl_ms=self.ttl_ms, wait_ms=_wait_ms(deadline),
                    value=value, lock_delay_ms=self.lock_delay_ms,
                )
                return self._leader_type(lease)
            except LockHeldError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    def _leader(self) -> Op[Optional[LeaderInfo]]:
        """Who leads now, if anyone."""
        return LeaderInfo.of((yield from self._client._lock_status(self.name)))

    def observe(self) -> ObserverT:
        """An observer of this election's leadership changes (close it, or use it as a
        context manager, to end its events stream)."""
        return self._observer_type(self._client, self.name, self.poll_interval, self.use_events)


class _LeaderBase(Generic[LeaseT]):
    """What both leaders read from their lease."""

    def __init__(self, lease: LeaseT) -> None:
        self.lease = lease

    epoch = Forward[int]("lease", "The term: also the fencing token's epoch.")
    token = Forward[str]("lease", "The fencing token to attach to every write this leader makes.")
    lost = Forward[bool]("lease", "True once leadership is known or presumed lost; False is no promise.")


class Leader(_LeaderBase["Lease"]):
    """This candidate leads: a lease on the election's lock, renewed in the background."""

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


class _Watching(Generic[T]):
    """What both observers keep (their lock, the last leadership returned) and decide
    (whether a read is news, how long to wait for the next)."""

    def __init__(self, client: T, lock: str, poll_interval: float, use_events: bool) -> None:
        self._client = client
        self._lock = lock
        self._poll = poll_interval
        self._use_events = use_events
        self._seen: Any = _NOTHING

    def _news(self, now: Optional[LeaderInfo]) -> bool:
        """Whether ``now`` differs from what was returned last (always, the first time)."""
        if self._seen is not _NOTHING and now == self._seen:
            return False
        self._seen = now
        return True

    def _wait(self, deadline: Optional[float], timeout: Optional[float]) -> float:
        """How long to wait before the next read; :class:`TimeoutError` past ``deadline``."""
        if deadline is None:
            return self._poll
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no leadership change of {self._lock!r} within {timeout} s")
        return min(self._poll, left)


class Observer(_Watching["Client"]):
    """Watches an election: :meth:`changed` returns each new leadership.

    At its first :meth:`changed` it starts a thread that reads the lock's events stream;
    each grant, release, expiry or reset on it (and each (re)connection) makes the
    observer read the status again at once. Between those it reads every
    ``poll_interval`` seconds, which is all it does while the stream is unavailable.
    """

    def __init__(self, client: "Client", lock: str, poll_interval: float, use_events: bool = True) -> None:
        super().__init__(client, lock, poll_interval, use_events)
        self._wake = threading.Condition()
        self._woken = False
        self._stream: Optional[EventStream] = None
        self._reader: Optional[threading.Thread] = None
        self._closed = False

    @property
    def streaming(self) -> bool:
        """Whether the events stream is open now (False while the observer only polls)."""
        stream = self._stream
        return stream is not None and stream.connected and not stream.closed

    def _signal(self) -> None:
        with self._wake:
            self._woken = True
            self._wake.notify_all()

    def _start(self) -> None:
        if self._reader is not None or not self._use_events or self._closed:
            return
        self._stream = EventStream(self._client, lock_events_path(self._lock), on_connect=self._signal)
        self._reader = threading.Thread(target=self._read, args=(self._stream,), daemon=True,
                                        name=f"palisade-observer-{self._lock}")
        self._reader.start()

    def _read(self, stream: EventStream) -> None:
        try:
            for event in stream:
                if _wakes(event):
                    self._signal()
        except PalisadeError:
            pass  # refused for good (a server without events, a key that may not read): poll
        except Exception:  # noqa: BLE001 - e.g. the client was closed: the status reads
            pass  # raise it to the caller; the stream just ends
        finally:
            stream.close()

    def changed(self, timeout: Optional[float] = None) -> Optional[LeaderInfo]:
        """The leadership now, at the first call; after that, blocks until it differs from
        what was returned last (another leader, epoch or value, or nobody) and returns it.
        With ``timeout`` (seconds), raises :class:`TimeoutError` when nothing changed.
        Errors of the status reads are raised; the stream's are not (the observer polls
        until it is back)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._start()
        while True:
            with self._wake:
                # Cleared before the read: anything the stream reports after it wakes us.
                self._woken = False
            now = LeaderInfo.of(self._client.lock_status(self._lock))
            if self._news(now):
                return now
            wait = self._wait(deadline, timeout)
            with self._wake:
                self._wake.wait_for(lambda: self._woken, timeout=wait)

    def __iter__(self) -> Iterator[Optional[LeaderInfo]]:
        while True:
            yield self.changed()

    def close(self) -> None:
        """Ends the events stream (its thread ends with it)."""
        self._closed = True
        if self._stream is not None:
            self._stream.close()

    def __enter__(self) -> "Observer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Election(_ElectionOps["Client", "Leader", "Observer"]):
    """An election on the lock ``name``: candidates campaign, observers watch."""

    _leader_type = Leader
    _observer_type = Observer
    campaign = blocking(_ElectionOps._campaign)
    leader = blocking(_ElectionOps._leader)


_NOTHING = object()


class AsyncLeader(_LeaderBase["aio.Lease"]):
    """The asyncio twin of :class:`Leader`."""

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


class AsyncObserver(_Watching["aio.Client"]):
    """The asyncio twin of :class:`Observer`: the events stream is read by a task on the
    loop of the first :meth:`changed`."""

    def __init__(self, client: "aio.Client", lock: str, poll_interval: float, use_events: bool = True) -> None:
        super().__init__(client, lock, poll_interval, use_events)
        self._wake: Optional[asyncio.Event] = None
        self._stream: Optional[AsyncEventStream] = None
        self._reader: Optional["asyncio.Task[None]"] = None

    @property
    def streaming(self) -> bool:
        stream = self._stream
        return stream is not None and stream.connected and self._reader is not None and not self._reader.done()

    def _signal(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _read(self, stream: AsyncEventStream) -> None:
        try:
            async for event in stream:
                if _wakes(event):
                    self._signal()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - refused for good, or the client was closed: poll
            pass
        finally:
            await stream.aclose()

    async def changed(self, timeout: Optional[float] = None) -> Optional[LeaderInfo]:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._wake is None:
            self._wake = asyncio.Event()
        if self._reader is None and self._use_events:
            self._stream = AsyncEventStream(self._client, lock_events_path(self._lock), on_connect=self._signal)
            self._reader = asyncio.get_running_loop().create_task(self._read(self._stream))
        while True:
            self._wake.clear()
            now = LeaderInfo.of(await self._client.lock_status(self._lock))
            if self._news(now):
                return now
            wait = self._wait(deadline, timeout)
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                pass

    async def aclose(self) -> None:
        """Ends the events stream and its task."""
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
        if self._stream is not None:
            await self._stream.aclose()

    async def __aenter__(self) -> "AsyncObserver":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncElection(_ElectionOps["aio.Client", "AsyncLeader", "AsyncObserver"]):
    """The asyncio twin of :class:`Election` (``palisade.aio.Election``)."""

    _leader_type = AsyncLeader
    _observer_type = AsyncObserver
    campaign = asynchronous(_ElectionOps._campaign)
    leader = asynchronous(_ElectionOps._leader)
