"""The blocking client: :class:`Client`, :class:`Lease`, :class:`Kv`, :class:`FencedKv`.

A thin shell over ``_ops`` (what each method does, without I/O), ``_protocol`` (what to
send, how to read it), ``_failover`` (which node next) and ``_renewal`` (when to renew,
when the lease is lost): it only sends, with ``httpx.Client``, and runs the renewal
threads. The asyncio client in ``aio.py`` is the same shell over the same modules.

Threads: one ``httpx.Client`` (a pool of keep-alive connections) per :class:`Client`,
shared by the caller's threads and one renewal thread per live lease. A lease's renewal
state is guarded by one condition variable; nothing holds it across a request.
"""

from __future__ import annotations

import threading
import time
import weakref
from types import TracebackType
from typing import Any, Callable, Optional, Type, TypeVar

import httpx

from ._errors import LeaseLostError
from ._events import EventStream, lock_events_path, prefix_events_path
from ._failover import Exchange, Op, request_args
from ._ops import (
    ClientOps,
    Ends,
    FencedKvOps,
    HeldOps,
    KvOps,
    LockArgs,
    LockContextBase,
    Scoped,
    SessionLockOps,
    SessionOps,
    blocking,
    lost_reason,
    waiting,
)
from ._renewal import Renewal
from ._types import Grant, SessionInfo

__all__ = ["Client", "Lease", "LockContext", "Kv", "FencedKv", "Session", "SessionLock"]

T = TypeVar("T")


class Client(ClientOps[httpx.Client, httpx.BaseTransport, "Lease", "Session", "LockContext"]):
    """A handle to one Palisade deployment: one server URL, or several for failover.

    ``Client("http://127.0.0.1:7700")``, or ``Client([url1, url2, url3])`` for the nodes of
    a three-node deployment: a call that cannot reach a node, or gets 503, moves on to the
    next (see ``docs/python.md`` for exactly which calls are resent). With several URLs
    every fenced write carries an ``Idempotency-Key`` so that a resent write is never
    applied twice.

    ``key``, ``ca`` and ``cert`` are for servers with authentication and TLS: a bearer key
    sent as ``Authorization: Bearer <key>``, the CA file that signed the servers'
    certificates, and a client certificate (one PEM file, or a ``(cert, key)`` pair).

    ``deadlines`` (:class:`Deadlines`) sets how its leases and sessions derive their
    renewal deadline and safe deadline from the TTL (default: 2/3 of the TTL, 1 % drift).

    Thread-safe; close it (or use it as a context manager) to release its connections and
    stop the renewals of the leases it still holds.
    """

    def _open(self, transport: Optional[httpx.BaseTransport], settings: Any) -> httpx.Client:
        return httpx.Client(transport=transport, **settings)

    def _run(self, op: Op[T]) -> T:
        exchange = Exchange(self._endpoints, op)
        for url, call in exchange:
            try:
                outcome: Any = self._http.request(call.method, url, **request_args(call))
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

    acquire = blocking(ClientOps._acquire)
    acquire_grant = blocking(ClientOps._acquire_grant)
    proclaim = blocking(ClientOps._proclaim)
    session = blocking(ClientOps._session)
    create_session = blocking(ClientOps._create_session)
    keepalive_session = blocking(ClientOps._keepalive_session)
    session_info = blocking(ClientOps._session_info)
    close_session = blocking(ClientOps._close_session)
    keepalive = blocking(ClientOps._keepalive)
    release = blocking(ClientOps._release)
    lock_status = blocking(ClientOps._lock_status)
    locks = blocking(ClientOps._locks)
    keys = blocking(ClientOps._keys)
    check_token = blocking(ClientOps._check_token)
    report_gate = blocking(ClientOps._report_gate)
    high_water = blocking(ClientOps._high_water)
    health = blocking(ClientOps._health)

    def kv(self, name: str) -> "Kv":
        """Read-only access to namespace ``name``: reads need no token."""
        return Kv(self, name)

    def fenced_kv(self, name: str, token: str) -> "FencedKv":
        """Fenced access to namespace ``name`` with a token obtained elsewhere. Holders
        that acquired through this client use :attr:`Lease.kv`."""
        return FencedKv(self, name, token, None)

    def watch(self, lock: str, *, last_event_id: Optional[int] = None) -> EventStream:
        """The events of ``lock`` (grants, releases, expiries, mark advances, refusals) as
        they happen, or after event ``last_event_id``: an iterator of typed events that
        reconnects and resumes by itself (see :class:`palisade.EventStream`). Nothing is
        sent until it is iterated (or :meth:`EventStream.connect` is called)."""
        return EventStream(self, lock_events_path(lock), last_event_id)

    def events(self, prefix: str = "", *, last_event_id: Optional[int] = None) -> EventStream:
        """Like :meth:`watch`, for every lock whose name starts with ``prefix`` (every lock
        the key may read without one)."""
        return EventStream(self, prefix_events_path(prefix), last_event_id)

    def close(self) -> None:
        """Stops the renewals of this client's leases and closes its connections. The
        leases are not released: they end after their TTL."""
        self._stop_all()
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()


def _renew(
    keepalive: Callable[[float], int], renewal: Renewal, cond: threading.Condition, stop: threading.Event
) -> None:
    """The renewal thread of one lease (or session): the only writer of its schedule
    besides :meth:`Lease._stop_renewing`. ``keepalive(timeout)`` renews and answers the TTL
    granted. Holds no reference to the :class:`Lease` itself, so a lease nobody holds any
    more is collected, and its finaliser stops this thread."""
    while True:
        with cond:
            wait = renewal.due() - time.monotonic()
        if stop.wait(max(wait, 0.0)):
            return
        sent = time.monotonic()
        with cond:
            reason = renewal.reason(sent)
            if reason is not None:
                renewal.lose(reason)
                cond.notify_all()
                return
            timeout = renewal.timeout(sent)
        try:
            ttl_ms = keepalive(timeout)
        except LeaseLostError as e:
            with cond:
                renewal.lose(lost_reason(e), ended_by=sent)
                cond.notify_all()
            return
        except Exception:  # noqa: BLE001 - any failure leaves the lease possibly alive
            with cond:
                renewal.failed(time.monotonic())
            continue
        with cond:
            renewal.renewed(sent, ttl_ms)
            cond.notify_all()


def _lease_keepalive(client: Client, lease_id: str) -> Callable[[float], int]:
    return lambda timeout: client.keepalive(lease_id, timeout=timeout).ttl_ms


def _start(
    keepalive: Callable[[float], int], renewal: Renewal, cond: threading.Condition, stop: threading.Event, name: str
) -> threading.Thread:
    """Starts the renewal thread of a lease or session; set ``stop`` to stop it."""
    thread = threading.Thread(target=_renew, args=(keepalive, renewal, cond, stop), name=name, daemon=True)
    thread.start()
    return thread


def _halt(stop: threading.Event, cond: threading.Condition, renewal: Renewal, reason: str, ended: bool) -> None:
    stop.set()
    with cond:
        renewal.lose(reason, time.monotonic() if ended else None)
        cond.notify_all()


class _Held(HeldOps):
    """What :class:`Lease` and :class:`SessionLock` share."""

    @property
    def kv(self) -> "FencedKv":
        """The namespace guarded by this lock, every write carrying this lease's token."""
        return FencedKv(self._client, self.lock, self.token, self)

    fence = blocking(HeldOps._fence)
    proclaim = blocking(HeldOps._proclaim)
    release = blocking(HeldOps._release)


class Lease(Scoped, _Held):
    """A lease held by this process, renewed in the background every ``ttl / 3``.

    The renewals notice loss; they cannot prevent it. After a pause longer than the TTL
    the lock may belong to someone else, and a write through :attr:`kv` is refused with
    :class:`StaleTokenError`, which is the point of fencing. Once the lease is known or
    presumed lost, every call through it raises :class:`LeaseLostError` before sending.

    ``lost`` returning ``False`` is not permission to write: the process can pause right
    after asking. Only the resource's answer is authoritative.
    """

    def __init__(self, client: Client, grant: Grant, sent_at: float) -> None:
        self._cond = threading.Condition()
        super().__init__(grant, sent_at, self._cond, client._deadlines)
        self._client = client
        keepalive = _lease_keepalive(client, grant.lease_id)
        self._stop = threading.Event()
        self._thread = _start(keepalive, self._renewal, self._cond, self._stop, f"palisade-renew-{grant.lock}")
        # Dropping the lease stops the renewals (like the Rust guard); the lease then
        # ends after its TTL.
        weakref.finalize(self, self._stop.set)

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the lease is lost (True) or ``timeout`` seconds pass (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                verdict, wait = waiting(self._renewal, end)
                if verdict is not None:
                    return verdict
                self._cond.wait(wait)

    def _stop_renewing(self, reason: str, ended: bool = True) -> None:
        _halt(self._stop, self._cond, self._renewal, reason, ended)

    check = blocking(HeldOps._check)

    def _end(self) -> None:
        self.release()


class LockContext(Ends, LockContextBase):
    """``with client.lock(...) as lease``: acquires on entry, releases on exit."""

    _lease: Optional[Lease] = None

    def __enter__(self) -> Lease:
        self._lease = self._client._run(self._acquire())
        return self._lease

    def _end(self) -> None:
        if self._lease is not None:
            self._lease.release()


class Kv(KvOps):
    """Read access to one namespace. Reads are not fenced: a stale holder may read, it
    just cannot write."""

    get = blocking(KvOps._get)
    entry = blocking(KvOps._entry)
    list = blocking(KvOps._list)


class FencedKv(FencedKvOps, Kv):
    """Read and fenced-write access to one namespace with one token.

    There is no unfenced write handle: every mutation sent from here carries the token in
    ``Fencing-Token``. The handle does not know whether its epoch is still current; only
    the server's answer (:class:`StaleTokenError`) says so.
    """

    put = blocking(FencedKvOps._put)
    delete = blocking(FencedKvOps._delete)
    fence = blocking(FencedKvOps._fence)


class Session(Scoped, SessionOps["SessionLock"]):
    """A session held by this process, renewed in the background every ``ttl / 3``: one
    keepalive for every lock acquired in it.

    When the session expires (the process paused, the network failed) or is closed, every
    lock in it is released at once, on the server; :attr:`lost` says so here, and every
    call through its locks then raises :class:`LeaseLostError`. Dropping the session
    stops the renewals without closing it: its locks then end after its TTL.
    """

    def __init__(self, client: Client, info: SessionInfo, sent_at: float) -> None:
        self._cond = threading.Condition()
        super().__init__(client, info, sent_at, self._cond)
        session_id = info.session_id
        keepalive = lambda timeout: client.keepalive_session(session_id, timeout=timeout).ttl_ms  # noqa: E731
        self._stop = threading.Event()
        self._thread = _start(keepalive, self._renewal, self._cond, self._stop, f"palisade-session-{session_id[:8]}")
        weakref.finalize(self, self._stop.set)

    def _adopt(self, grant: Grant) -> "SessionLock":
        return SessionLock(self, grant)

    def _stop_renewing(self, reason: str, ended: bool = True) -> None:
        _halt(self._stop, self._cond, self._renewal, reason, ended)

    acquire = blocking(SessionOps._acquire)
    info = blocking(SessionOps._session_info)
    close = blocking(SessionOps._close)

    def _end(self) -> SessionInfo:
        return self.close()


class SessionLock(SessionLockOps[Session], _Held):
    """A lock held in a :class:`Session`: renewed by the session, ended with it. Its
    ``lost`` is the session's."""
