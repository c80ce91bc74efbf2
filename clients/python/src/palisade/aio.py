"""The asyncio client: the same surface as :mod:`palisade`, with ``await``.

::

    from palisade.aio import Client, StaleTokenError

    async with Client("http://127.0.0.1:7700") as client:
        async with client.lock("orders", holder="w1", ttl_ms=5000, wait_ms=2000) as lease:
            await lease.fence()
            await lease.kv.put("invoice-17", b"paid")

The same shell as the blocking client over the same ``_protocol``, ``_failover`` and
``_renewal`` modules, so both send the same requests, raise the same errors and fail
over by the same rule. A lease is renewed by one task on the event loop that acquired it; its state
is touched only from that loop, so nothing is locked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from types import TracebackType
from typing import Any, Awaitable, Callable, List, Optional, Sequence, Type, Union

import httpx

from . import _protocol as proto
from ._errors import *  # noqa: F401,F403 - the same error classes, importable from here
from ._errors import LeaseLostError, SessionExpiredError, StaleTokenError
from ._events import AsyncEventStream as EventStream
from ._events import (
    Event,
    ExpiredEvent,
    FencedEvent,
    GrantedEvent,
    RejectedEvent,
    ReleasedEvent,
    ResetEvent,
    lock_events_path,
    prefix_events_path,
)
from ._failover import Attempts, Call, Endpoints
from ._errors import __all__ as _error_names
from ._lease import LeaseBase
from ._paths import normalise_bases
from ._protocol import CertArg, WriteOptions
from ._renewal import Renewal
from ._types import (
    Entry,
    FenceStatus,
    Grant,
    KeepaliveInfo,
    LockStatus,
    Proclaimed,
    PublicKey,
    SessionInfo,
    TokenCheck,
    WriteResult,
)

__all__ = [
    "Client",
    "Lease",
    "LockContext",
    "Kv",
    "FencedKv",
    "Session",
    "SessionLock",
    "EventStream",
    "Event",
    "GrantedEvent",
    "ReleasedEvent",
    "ExpiredEvent",
    "FencedEvent",
    "RejectedEvent",
    "ResetEvent",
    "Election",
    "Leader",
    "Observer",
    "Proclaimed",
    "SessionInfo",
    "Grant",
    "KeepaliveInfo",
    "LockStatus",
    "PublicKey",
    "TokenCheck",
    "FenceStatus",
    "Entry",
    "WriteResult",
    *_error_names,
]


def _gone(e: LeaseLostError) -> str:
    """Why a renewal ended it all, as ``lost_reason`` says it."""
    if isinstance(e, SessionExpiredError):
        return "the server says the session expired or was closed"
    return "the server says the lease expired or was released"

class Client:
    """The asyncio twin of :class:`palisade.Client`; same arguments, same failover.

    Use it from one event loop; ``await client.aclose()`` (or ``async with``) stops the
    renewals of its leases and closes its connections.
    """

    def __init__(
        self,
        url: Union[str, Sequence[str]] = "http://127.0.0.1:7700",
        *,
        key: Optional[str] = None,
        ca: Optional[str] = None,
        cert: Optional[CertArg] = None,
        timeout: float = proto.REQUEST_TIMEOUT,
        connect_timeout: float = proto.CONNECT_TIMEOUT,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self._endpoints = Endpoints(normalise_bases(url))
        self._authenticated = key is not None or cert is not None
        settings = proto.http_settings(key, ca, cert, timeout, connect_timeout)
        self._http = httpx.AsyncClient(transport=transport, **settings)
        self._leases: "weakref.WeakSet[Lease]" = weakref.WeakSet()

    @property
    def urls(self) -> List[str]:
        return self._endpoints.bases

    async def _send(self, call: Call) -> httpx.Response:
        attempts = Attempts(self._endpoints, call)
        timeout: Any = httpx.USE_CLIENT_DEFAULT if call.timeout is None else call.timeout
        for base in attempts:
            try:
                response = await self._http.request(
                    call.method, base + call.path, headers=call.headers, content=call.body, timeout=timeout
                )
            except httpx.TransportError as e:
                attempts.failed(base, e)
                continue
            if attempts.answered(base, response):
                return response
        raise attempts.exhausted()

    def lock(
        self,
        name: str,
        *,
        holder: Optional[str] = None,
        ttl_ms: int = 10_000,
        wait_ms: int = 0,
        value: Optional[Union[bytes, str]] = None,
        lock_delay_ms: Optional[int] = None,
    ) -> "LockContext":
        """``async with client.lock(...) as lease``: acquires on entry, renews in the
        background, releases on exit."""
        return LockContext(self, name, holder, ttl_ms, wait_ms, value, lock_delay_ms)

    async def acquire(
        self,
        name: str,
        *,
        holder: Optional[str] = None,
        ttl_ms: int = 10_000,
        wait_ms: int = 0,
        value: Optional[Union[bytes, str]] = None,
        lock_delay_ms: Optional[int] = None,
    ) -> "Lease":
        """Acquires ``name`` and starts renewing it in a task on the running loop."""
        sent_at = time.monotonic()
        grant = await self.acquire_grant(
            name, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms, value=value, lock_delay_ms=lock_delay_ms
        )
        if time.monotonic() - sent_at > grant.ttl_ms / 3000:
            # After a wait in line: renew once now (see the blocking client).
            renewed_at = time.monotonic()
            await self.keepalive(grant.lease_id)
            sent_at = renewed_at
        lease = Lease(self, grant, sent_at)
        self._leases.add(lease)
        return lease

    async def acquire_grant(
        self,
        name: str,
        *,
        holder: Optional[str] = None,
        ttl_ms: int = 10_000,
        wait_ms: int = 0,
        value: Optional[Union[bytes, str]] = None,
        lock_delay_ms: Optional[int] = None,
        session: Optional[str] = None,
    ) -> Grant:
        """Acquires ``name`` without background renewal (in ``session``, if given)."""
        holder = proto.holder_for(holder, self._authenticated)
        call = proto.acquire(name, holder, ttl_ms, wait_ms, value, lock_delay_ms, session)
        return proto.grant(await self._send(call))

    async def proclaim(self, lease_id: str, value: Optional[Union[bytes, str]]) -> Proclaimed:
        return proto.proclaimed(await self._send(proto.proclaim(lease_id, value)))

    async def session(self, *, ttl_ms: int = 10_000, holder: Optional[str] = None) -> "Session":
        """Creates a session renewed by a task every ``ttl_ms / 3`` (see
        :meth:`palisade.Client.session`); ``async with`` closes it."""
        sent_at = time.monotonic()
        info = await self.create_session(ttl_ms=ttl_ms, holder=holder)
        return Session(self, info, sent_at)

    async def create_session(self, *, ttl_ms: int = 10_000, holder: Optional[str] = None) -> SessionInfo:
        holder = proto.holder_for(holder, self._authenticated)
        return proto.session_of(await self._send(proto.create_session(holder, ttl_ms)))

    async def keepalive_session(self, session_id: str, *, timeout: Optional[float] = None) -> SessionInfo:
        return proto.session_of(await self._send(proto.keepalive_session(session_id, timeout)))

    async def session_info(self, session_id: str) -> SessionInfo:
        return proto.session_of(await self._send(proto.session_info(session_id)))

    async def close_session(self, session_id: str) -> SessionInfo:
        return proto.session_of(await self._send(proto.close_session(session_id)))

    async def keepalive(self, lease_id: str, *, timeout: Optional[float] = None) -> KeepaliveInfo:
        return proto.keepalive_info(await self._send(proto.keepalive(lease_id, timeout)))

    async def release(self, lease_id: str) -> None:
        proto.expect_ok(await self._send(proto.release(lease_id)))

    async def lock_status(self, name: str) -> LockStatus:
        return proto.lock_status_of(await self._send(proto.lock_status(name)))

    async def locks(self) -> List[LockStatus]:
        return proto.lock_list(await self._send(proto.locks()))

    async def keys(self) -> List[PublicKey]:
        return proto.public_keys(await self._send(proto.keys()))

    async def check_token(self, token: str) -> TokenCheck:
        return proto.token_check(await self._send(proto.check_token(token)))

    async def high_water(self, name: str) -> FenceStatus:
        return proto.fence_status(await self._send(proto.high_water(name)))

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

    async def health(self) -> None:
        proto.healthy(await self._send(proto.health()))

    async def aclose(self) -> None:
        """Stops the renewals of this client's leases (they end after their TTL) and
        closes its connections."""
        for lease in list(self._leases):
            lease._stop_renewing("the client was closed")
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
                renewal.lose(_gone(e))
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


class Lease(LeaseBase):
    """A lease held by this process, renewed by a task every ``ttl / 3``; see
    :class:`palisade.Lease` for what it does and does not promise."""

    def __init__(self, client: Client, grant: Grant, sent_at: float) -> None:
        super().__init__(grant, sent_at, contextlib.nullcontext())
        self._client = client
        self._changed = asyncio.Event()
        loop = asyncio.get_running_loop()
        lease_id = grant.lease_id

        async def keepalive(timeout: float) -> int:
            return (await client.keepalive(lease_id, timeout=timeout)).ttl_ms

        self._task = loop.create_task(_renew(keepalive, self._renewal, self._changed))
        weakref.finalize(self, _cancel, loop, self._task)

    async def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Waits until the lease is lost (True) or ``timeout`` seconds pass (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            now = time.monotonic()
            if self._renewal.is_lost(now):
                return True
            wait = self._renewal.deadline - now
            if end is not None:
                if now >= end:
                    return False
                wait = min(wait, end - now)
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), wait)
            except asyncio.TimeoutError:
                pass

    def _stop_renewing(self, reason: str) -> None:
        self._task.cancel()
        self._renewal.lose(reason)
        self._changed.set()

    @property
    def kv(self) -> "FencedKv":
        return FencedKv(self._client, self.lock, self.token, self)

    async def fence(self, *, seq: Optional[int] = None) -> int:
        return await self.kv.fence(seq=seq)

    async def check(self) -> TokenCheck:
        self.ensure_alive()
        return await self._client.check_token(self.token)

    async def proclaim(self, value: Optional[Union[bytes, str]]) -> Proclaimed:
        """Replaces what this lease advertises (``None`` clears it)."""
        self.ensure_alive()
        return await self._client.proclaim(self.lease_id, value)

    async def release(self) -> None:
        self._stop_renewing("released")
        await self._client.release(self.lease_id)

    async def __aenter__(self) -> "Lease":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await _release_on_exit(self, exc is not None)


async def _release_on_exit(lease: Lease, body_failed: bool) -> None:
    try:
        await lease.release()
    except LeaseLostError:
        pass
    except Exception:
        if not body_failed:
            raise


class LockContext:
    """``async with client.lock(...) as lease``."""

    def __init__(
        self,
        client: Client,
        name: str,
        holder: Optional[str],
        ttl_ms: int,
        wait_ms: int,
        value: Optional[Union[bytes, str]] = None,
        lock_delay_ms: Optional[int] = None,
    ) -> None:
        self._client = client
        self._args = (name, holder, ttl_ms, wait_ms, value, lock_delay_ms)
        self._lease: Optional[Lease] = None

    async def __aenter__(self) -> Lease:
        name, holder, ttl_ms, wait_ms, value, lock_delay_ms = self._args
        self._lease = await self._client.acquire(
            name, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms, value=value, lock_delay_ms=lock_delay_ms
        )
        return self._lease

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._lease is not None:
            await _release_on_exit(self._lease, exc is not None)


class Kv:
    """Read access to one namespace (no token needed)."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.lock = name

    async def get(self, key: str) -> Optional[bytes]:
        entry = await self.entry(key)
        return None if entry is None else entry.value

    async def entry(self, key: str) -> Optional[Entry]:
        return proto.entry(await self._client._send(proto.kv_get(self.lock, key)))

    async def list(self, prefix: str = "") -> List[str]:
        return proto.key_list(await self._client._send(proto.kv_list(self.lock, prefix)))


class FencedKv(Kv):
    """Read and fenced-write access to one namespace with one token."""

    def __init__(self, client: Client, name: str, token: str, lease: Optional[Lease]) -> None:
        super().__init__(client, name)
        self.token = token
        self._lease = lease

    async def _mutate(self, call: Call) -> httpx.Response:
        if self._lease is not None:
            self._lease.ensure_alive()
        try:
            return proto.expect_ok(await self._client._send(call))
        except StaleTokenError:
            if self._lease is not None:
                self._lease._stop_renewing("a write was refused as stale: a newer epoch exists")
            raise

    def _auto_key(self) -> bool:
        return self._client._endpoints.several

    async def put(
        self,
        key: str,
        value: Union[bytes, str],
        *,
        if_match: Optional[int] = None,
        if_absent: bool = False,
        idempotency_key: Optional[str] = None,
        seq: Optional[int] = None,
    ) -> WriteResult:
        opts = WriteOptions(if_match, if_absent, idempotency_key, seq)
        call = proto.kv_put(self.lock, key, value, self.token, opts, self._auto_key())
        return proto.write_result(await self._mutate(call))

    async def delete(
        self,
        key: str,
        *,
        if_match: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        seq: Optional[int] = None,
    ) -> WriteResult:
        opts = WriteOptions(if_match, False, idempotency_key, seq)
        call = proto.kv_delete(self.lock, key, self.token, opts, self._auto_key())
        return proto.write_result(await self._mutate(call))

    async def fence(self, *, seq: Optional[int] = None) -> int:
        call = proto.fence(self.lock, self.token, seq, self._auto_key())
        return proto.high_water_of_fence(await self._mutate(call))

    async def entry(self, key: str) -> Optional[Entry]:
        if self._lease is not None:
            self._lease.ensure_alive()
        return await super().entry(key)

    async def list(self, prefix: str = "") -> List[str]:
        if self._lease is not None:
            self._lease.ensure_alive()
        return await super().list(prefix)


class Session:
    """The asyncio twin of :class:`palisade.Session`: one keepalive (a task on the loop
    that created it) for every lock acquired in it; ``async with`` closes it."""

    def __init__(self, client: Client, info: SessionInfo, sent_at: float) -> None:
        self._client = client
        self._info = info
        self._renewal = Renewal(info.ttl_ms, sent_at)
        self._changed = asyncio.Event()
        session_id = info.session_id

        async def keepalive(timeout: float) -> int:
            return (await client.keepalive_session(session_id, timeout=timeout)).ttl_ms

        loop = asyncio.get_running_loop()
        self._task = loop.create_task(_renew(keepalive, self._renewal, self._changed))
        weakref.finalize(self, _cancel, loop, self._task)

    @property
    def session_id(self) -> str:
        return self._info.session_id

    @property
    def ttl_ms(self) -> int:
        return self._info.ttl_ms

    @property
    def lost(self) -> bool:
        return self._renewal.is_lost(time.monotonic())

    def ensure_alive(self) -> None:
        reason = self._renewal.reason(time.monotonic())
        if reason is not None:
            raise LeaseLostError(f"session {self.session_id} is lost: {reason}")

    async def acquire(
        self,
        name: str,
        *,
        holder: Optional[str] = None,
        wait_ms: int = 0,
        value: Optional[Union[bytes, str]] = None,
        lock_delay_ms: Optional[int] = None,
    ) -> "SessionLock":
        self.ensure_alive()
        if holder is None and not self._client._authenticated:
            # The session's own holder (with authentication on the server names it).
            holder = self._info.holder
        grant = await self._client.acquire_grant(
            name, holder=holder, wait_ms=wait_ms, value=value, lock_delay_ms=lock_delay_ms,
            session=self.session_id,
        )
        return SessionLock(self, grant)

    async def info(self) -> SessionInfo:
        return await self._client.session_info(self.session_id)

    async def close(self) -> SessionInfo:
        self._task.cancel()
        self._renewal.lose("closed")
        self._changed.set()
        return await self._client.close_session(self.session_id)

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            await self.close()
        except LeaseLostError:
            pass
        except Exception:
            if exc is None:
                raise


class SessionLock(LeaseBase):
    """A lock held in a :class:`Session`; its ``lost`` is the session's."""

    def __init__(self, session: Session, grant: Grant) -> None:
        super().__init__(grant, time.monotonic(), contextlib.nullcontext())
        self._renewal = session._renewal
        self._session = session

    @property
    def session(self) -> Session:
        return self._session

    @property
    def kv(self) -> "FencedKv":
        return FencedKv(self._session._client, self.lock, self.token, self)  # type: ignore[arg-type]

    async def fence(self, *, seq: Optional[int] = None) -> int:
        return await self.kv.fence(seq=seq)

    async def proclaim(self, value: Optional[Union[bytes, str]]) -> Proclaimed:
        self.ensure_alive()
        return await self._session._client.proclaim(self.lease_id, value)

    async def release(self) -> None:
        await self._session._client.release(self.lease_id)

    def _stop_renewing(self, reason: str) -> None:
        """The schedule is the session's: a stale write stops nothing here."""


from ._election import AsyncElection as Election  # noqa: E402 - needs the classes above
from ._election import AsyncLeader as Leader  # noqa: E402
from ._election import AsyncObserver as Observer  # noqa: E402
