"""The asyncio client: the same surface as :mod:`palisade`, with ``await``.

::

    from palisade.aio import Client, StaleTokenError

    async with Client("http://127.0.0.1:7700") as client:
        async with client.lock("orders", holder="w1", ttl_ms=5000, wait_ms=2000) as lease:
            await lease.fence()
            await lease.kv.put("invoice-17", b"paid")

The same shell as the blocking client over the same ``_ops``, ``_protocol``,
``_failover`` and ``_renewal`` modules, so both send the same requests, raise the same
errors and fail over by the same rule; it sends with ``httpx.AsyncClient``. A lease is
renewed by one task on the event loop that acquired it; its state is touched only from
that loop, so nothing is locked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from types import TracebackType
from typing import Any, Awaitable, Callable, Optional, Type, TypeVar

import httpx

from ._errors import *  # noqa: F401,F403 - the same error classes, importable from here
from ._errors import LeaseLostError
from ._events import *  # noqa: F401,F403 - the event classes
from ._events import AsyncEventStream as EventStream
from ._events import __all__ as _event_names
from ._events import lock_events_path, prefix_events_path
from ._failover import Exchange, Op, request_args
from ._errors import __all__ as _error_names
from ._ops import (
    AsyncEnds,
    AsyncScoped,
    ClientOps,
    FencedKvOps,
    HeldOps,
    KvOps,
    LockArgs,
    LockContextBase,
    SessionLockOps,
    SessionOps,
    asynchronous,
    lost_reason,
    waiting,
)
from ._renewal import Renewal
from ._types import *  # noqa: F401,F403 - the wire types, importable from here
from ._types import Grant, SessionInfo
from ._types import __all__ as _type_names

__all__ = [
    "Client",
    "Lease",
    "LockContext",
    "Kv",
    "FencedKv",
    "Session",
    "SessionLock",
    "EventStream",
    *_event_names,
    "Election",
    "Leader",
    "Observer",
    *_type_names,
    *_error_names,
]


T = TypeVar("T")


class Client(ClientOps[httpx.AsyncClient, httpx.AsyncBaseTransport, "Lease", "Session", "LockContext"]):
    """The asyncio twin of :class:`palisade.Client`; same arguments, same failover.

    Use it from one event loop; ``await client.aclose()`` (or ``async with``) stops the
    renewals of its leases and closes its connections.
    """

    def _open(self, transport: Optional[httpx.AsyncBaseTransport], settings: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=transport, **settings)

    async def _run(self, op: Op[T]) -> T:
        exchange = Exchange(self._endpoints, op)
        for url, call in exchange:
            try:
                outcome: Any = await self._http.request(call.method, url, **request_args(call))
            except httpx.TransportError as e:
                outcome = e
            exchange.got(outcome)
        return exchange.value

    def _adopt(self, grant: Grant, sent_at: float) -> "Lease":
        return Lease(self, grant, sent_at)

    def _adopt_session(self, info: SessionInfo, sent_at: float) -> "Session":
        return Session(self, info, sent_at)

    def _context(self, args: LockArgs) -> "LockContext":
        return LockContext(self, *args)

    acquire = asynchronous(ClientOps._acquire)
    acquire_grant = asynchronous(ClientOps._acquire_grant)
    proclaim = asynchronous(ClientOps._proclaim)
    session = asynchronous(ClientOps._session)
    create_session = asynchronous(ClientOps._create_session)
    keepalive_session = asynchronous(ClientOps._keepalive_session)
    session_info = asynchronous(ClientOps._session_info)
    close_session = asynchronous(ClientOps._close_session)
    keepalive = asynchronous(ClientOps._keepalive)
    release = asynchronous(ClientOps._release)
    lock_status = asynchronous(ClientOps._lock_status)
    locks = asynchronous(ClientOps._locks)
    keys = asynchronous(ClientOps._keys)
    check_token = asynchronous(ClientOps._check_token)
    report_gate = asynchronous(ClientOps._report_gate)
    high_water = asynchronous(ClientOps._high_water)
    health = asynchronous(ClientOps._health)

    def kv(self, name: str) -> "Kv":
        return Kv(self, name)

    def fenced_kv(self, name: str, token: str) -> "FencedKv":
        return FencedKv(self, name, token, None)

    def watch(self, lock: str, *, last_event_id: Optional[int] = None) -> "EventStream":
        """The events of ``lock``, as :meth:`palisade.Client.watch`: ``async for event in
        client.watch("orders")``."""
        return EventStream(self, lock_events_path(lock), last_event_id)

    def events(self, prefix: str = "", *, last_event_id: Optional[int] = None) -> "EventStream":
        """The events of every lock whose name starts with ``prefix``."""
        return EventStream(self, prefix_events_path(prefix), last_event_id)

    async def aclose(self) -> None:
        """Stops the renewals of this client's leases (they end after their TTL) and
        closes its connections."""
        self._stop_all()
        await self._http.aclose()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.aclose()


async def _renew(
    keepalive: Callable[[float], Awaitable[int]], renewal: Renewal, changed: asyncio.Event
) -> None:
    """The renewal task of one lease or session (see the blocking client's ``_renew``)."""
    try:
        while True:
            await asyncio.sleep(max(renewal.due() - time.monotonic(), 0.0))
            sent = time.monotonic()
            reason = renewal.reason(sent)
            if reason is not None:
                renewal.lose(reason)
                return
            try:
                ttl_ms = await keepalive(renewal.timeout(sent))
            except LeaseLostError as e:
                renewal.lose(lost_reason(e), ended_by=sent)
                return
            except Exception:  # noqa: BLE001 - any failure leaves the lease possibly alive
                renewal.failed(time.monotonic())
                continue
            renewal.renewed(sent, ttl_ms)
            changed.set()
    finally:
        changed.set()


def _cancel(loop: asyncio.AbstractEventLoop, task: "asyncio.Task[None]") -> None:
    if not loop.is_closed():
        loop.call_soon_threadsafe(task.cancel)


class _Renewed:
    """A lease or session renewed by a task on the running loop."""

    _renewal: Renewal

    def _start(self, keepalive: Callable[[float], Awaitable[int]]) -> None:
        self._changed = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(_renew(keepalive, self._renewal, self._changed))
        weakref.finalize(self, _cancel, loop, self._task)

    def _stop_renewing(self, reason: str, ended: bool = True) -> None:
        self._task.cancel()
        self._renewal.lose(reason, time.monotonic() if ended else None)
        self._changed.set()


class _Held(HeldOps):
    """What :class:`Lease` and :class:`SessionLock` share."""

    @property
    def kv(self) -> "FencedKv":
        return FencedKv(self._client, self.lock, self.token, self)

    fence = asynchronous(HeldOps._fence)
    proclaim = asynchronous(HeldOps._proclaim)
    release = asynchronous(HeldOps._release)


class Lease(AsyncScoped, _Renewed, _Held):
    """A lease held by this process, renewed by a task every ``ttl / 3``; see
    :class:`palisade.Lease` for what it does and does not promise."""

    def __init__(self, client: Client, grant: Grant, sent_at: float) -> None:
        super().__init__(grant, sent_at, contextlib.nullcontext(), client._deadlines)
        self._client = client
        lease_id = grant.lease_id

        async def keepalive(timeout: float) -> int:
            return (await client.keepalive(lease_id, timeout=timeout)).ttl_ms

        self._start(keepalive)

    async def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Waits until the lease is lost (True) or ``timeout`` seconds pass (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            verdict, wait = waiting(self._renewal, end)
            if verdict is not None:
                return verdict
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), wait)
            except asyncio.TimeoutError:
                pass

    check = asynchronous(HeldOps._check)

    async def _end(self) -> None:
        await self.release()


class LockContext(AsyncEnds, LockContextBase):
    """``async with client.lock(...) as lease``."""

    _lease: Optional[Lease] = None

    async def __aenter__(self) -> Lease:
        self._lease = await self._client._run(self._acquire())
        return self._lease

    async def _end(self) -> None:
        if self._lease is not None:
            await self._lease.release()


class Kv(KvOps):
    """Read access to one namespace (no token needed)."""

    get = asynchronous(KvOps._get)
    entry = asynchronous(KvOps._entry)
    list = asynchronous(KvOps._list)


class FencedKv(FencedKvOps, Kv):
    """Read and fenced-write access to one namespace with one token."""

    put = asynchronous(FencedKvOps._put)
    delete = asynchronous(FencedKvOps._delete)
    fence = asynchronous(FencedKvOps._fence)


class Session(AsyncScoped, _Renewed, SessionOps["SessionLock"]):
    """The asyncio twin of :class:`palisade.Session`: one keepalive (a task on the loop
    that created it) for every lock acquired in it; ``async with`` closes it."""

    def __init__(self, client: Client, info: SessionInfo, sent_at: float) -> None:
        super().__init__(client, info, sent_at, contextlib.nullcontext())
        session_id = info.session_id

        async def keepalive(timeout: float) -> int:
            return (await client.keepalive_session(session_id, timeout=timeout)).ttl_ms

        self._start(keepalive)

    def _adopt(self, grant: Grant) -> "SessionLock":
        return SessionLock(self, grant)

    acquire = asynchronous(SessionOps._acquire)
    info = asynchronous(SessionOps._session_info)
    close = asynchronous(SessionOps._close)

    async def _end(self) -> SessionInfo:
        return await self.close()


class SessionLock(SessionLockOps[Session], _Held):
    """A lock held in a :class:`Session`; its ``lost`` is the session's."""


from ._election import AsyncElection as Election  # noqa: E402 - needs the classes above
from ._election import AsyncLeader as Leader  # noqa: E402
from ._election import AsyncObserver as Observer  # noqa: E402
