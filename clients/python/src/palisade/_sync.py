"""The blocking client: :class:`Client`, :class:`Lease`, :class:`Kv`, :class:`FencedKv`.

A thin shell over ``_protocol`` (what to send, how to read it), ``_failover`` (which node
next) and ``_renewal`` (when to renew, when the lease is lost). The asyncio client in
``aio.py`` is the same shell over the same modules.

Threads: one ``httpx.Client`` (a pool of keep-alive connections) per :class:`Client`,
shared by the caller's threads and one renewal thread per live lease. A lease's renewal
state is guarded by one condition variable; nothing holds it across a request.
"""

from __future__ import annotations

import threading
import time
import weakref
from types import TracebackType
from typing import Any, Callable, List, Optional, Sequence, Type, Union

import httpx

from . import _protocol as proto
from ._errors import LeaseLostError, SessionExpiredError, StaleTokenError
from ._events import EventStream, lock_events_path, prefix_events_path
from ._failover import Attempts, Call, Endpoints
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

__all__ = ["Client", "Lease", "LockContext", "Kv", "FencedKv", "Session", "SessionLock"]

#: A lock value: bytes, or str sent as UTF-8.
Value = Union[bytes, str]


def _gone(e: LeaseLostError) -> str:
    """Why a renewal ended it all, as ``lost_reason`` says it."""
    if isinstance(e, SessionExpiredError):
        return "the server says the session expired or was closed"
    return "the server says the lease expired or was released"

class Client:
    """A handle to one Palisade deployment: one server URL, or several for failover.

    ``Client("http://127.0.0.1:7700")``, or ``Client([url1, url2, url3])`` for the nodes of
    a three-node deployment: a call that cannot reach a node, or gets 503, moves on to the
    next (see ``docs/python.md`` for exactly which calls are resent). With several URLs
    every fenced write carries an ``Idempotency-Key`` so that a resent write is never
    applied twice.

    ``key``, ``ca`` and ``cert`` are for servers with authentication and TLS: a bearer key
    sent as ``Authorization: Bearer <key>``, the CA file that signed the servers'
    certificates, and a client certificate (one PEM file, or a ``(cert, key)`` pair).

    Thread-safe; close it (or use it as a context manager) to release its connections and
    stop the renewals of the leases it still holds.
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
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self._endpoints = Endpoints(normalise_bases(url))
        self._authenticated = key is not None or cert is not None
        settings = proto.http_settings(key, ca, cert, timeout, connect_timeout)
        self._http = httpx.Client(transport=transport, **settings)
        self._leases: "weakref.WeakSet[Lease]" = weakref.WeakSet()

    @property
    def urls(self) -> List[str]:
        """The base URLs, in the order given."""
        return self._endpoints.bases

    def _send(self, call: Call) -> httpx.Response:
        attempts = Attempts(self._endpoints, call)
        timeout: Any = httpx.USE_CLIENT_DEFAULT if call.timeout is None else call.timeout
        for base in attempts:
            try:
                response = self._http.request(
                    call.method, base + call.path, headers=call.headers, content=call.body, timeout=timeout
                )
            except httpx.TransportError as e:
                attempts.failed(base, e)
                continue
            if attempts.answered(base, response):
                return response
        raise attempts.exhausted()

    # ---- locks and leases ------------------------------------------------------------

    def lock(
        self,
        name: str,
        *,
        holder: Optional[str] = None,
        ttl_ms: int = 10_000,
        wait_ms: int = 0,
        value: Optional[Value] = None,
        lock_delay_ms: Optional[int] = None,
    ) -> "LockContext":
        """A context manager that acquires ``name`` on entry (waiting in the server's queue
        up to ``wait_ms``), renews the lease in the background every ``ttl_ms / 3``, and
        releases it on exit::

            with client.lock("orders", holder="w1", ttl_ms=5000, wait_ms=2000) as lease:
                lease.fence()
                lease.kv.put("invoice-17", b"paid")

        ``value`` (at most 4 KiB) is what the lease advertises in lock status (see
        :meth:`Lease.proclaim`); ``lock_delay_ms`` is this lease's own lock-delay.
        Raises :class:`LockHeldError` on entry if the lock stays taken.
        """
        return LockContext(self, name, holder, ttl_ms, wait_ms, value, lock_delay_ms)

    def acquire(
        self,
        name: str,
        *,
        holder: Optional[str] = None,
        ttl_ms: int = 10_000,
        wait_ms: int = 0,
        value: Optional[Value] = None,
        lock_delay_ms: Optional[int] = None,
    ) -> "Lease":
        """Acquires ``name`` and starts renewing it; release it with :meth:`Lease.release`
        (or use the lease as a context manager)."""
        # The lease's local deadline counts from before the request: the server's lease
        # started somewhere between send and answer, so this errs towards "lost" early.
        sent_at = time.monotonic()
        grant = self.acquire_grant(
            name, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms, value=value, lock_delay_ms=lock_delay_ms
        )
        if time.monotonic() - sent_at > grant.ttl_ms / 3000:
            # After a wait in line the grant may have come long after the send: renew
            # once now, so the deadline counts from this renewal instead.
            renewed_at = time.monotonic()
            self.keepalive(grant.lease_id)
            sent_at = renewed_at
        lease = Lease(self, grant, sent_at)
        self._leases.add(lease)
        return lease

    def acquire_grant(
        self,
        name: str,
        *,
        holder: Optional[str] = None,
        ttl_ms: int = 10_000,
        wait_ms: int = 0,
        value: Optional[Value] = None,
        lock_delay_ms: Optional[int] = None,
        session: Optional[str] = None,
    ) -> Grant:
        """Acquires ``name`` without background renewal: call :meth:`keepalive` yourself,
        or the lease ends after ``ttl_ms``. With ``session`` (an id) the lease is the
        session's: its TTL, renewed and ended with it (prefer :meth:`Session.acquire`)."""
        holder = proto.holder_for(holder, self._authenticated)
        call = proto.acquire(name, holder, ttl_ms, wait_ms, value, lock_delay_ms, session)
        return proto.grant(self._send(call))

    def proclaim(self, lease_id: str, value: Optional[Value]) -> Proclaimed:
        """Replaces what lease ``lease_id`` advertises (``None`` clears it); its owner only."""
        return proto.proclaimed(self._send(proto.proclaim(lease_id, value)))

    # ---- sessions ------------------------------------------------------------------

    def session(self, *, ttl_ms: int = 10_000, holder: Optional[str] = None) -> "Session":
        """Creates a session, renewed in the background every ``ttl_ms / 3``: one keepalive
        for every lock acquired in it (:meth:`Session.acquire`). When it expires or is
        closed, every lock in it is released at once. A context manager that closes it::

            with client.session(ttl_ms=5000) as session:
                a = session.acquire("a")
                b = session.acquire("b")
        """
        sent_at = time.monotonic()
        info = self.create_session(ttl_ms=ttl_ms, holder=holder)
        return Session(self, info, sent_at)

    def create_session(self, *, ttl_ms: int = 10_000, holder: Optional[str] = None) -> SessionInfo:
        """Creates a session without background renewal."""
        holder = proto.holder_for(holder, self._authenticated)
        return proto.session_of(self._send(proto.create_session(holder, ttl_ms)))

    def keepalive_session(self, session_id: str, *, timeout: Optional[float] = None) -> SessionInfo:
        """Renews a session and every lock in it; :class:`SessionExpiredError` once gone."""
        return proto.session_of(self._send(proto.keepalive_session(session_id, timeout)))

    def session_info(self, session_id: str) -> SessionInfo:
        """A live session and its locks."""
        return proto.session_of(self._send(proto.session_info(session_id)))

    def close_session(self, session_id: str) -> SessionInfo:
        """Ends a session: every lock in it is released at once. Answers those locks."""
        return proto.session_of(self._send(proto.close_session(session_id)))

    def keepalive(self, lease_id: str, *, timeout: Optional[float] = None) -> KeepaliveInfo:
        """Renews a lease for a full TTL from now; :class:`LeaseLostError` once it is gone."""
        return proto.keepalive_info(self._send(proto.keepalive(lease_id, timeout)))

    def release(self, lease_id: str) -> None:
        """Releases a lease; the lock passes to the next waiter at once."""
        proto.expect_ok(self._send(proto.release(lease_id)))

    def lock_status(self, name: str) -> LockStatus:
        """One lock's status; a lock never acquired answers epoch 0."""
        return proto.lock_status_of(self._send(proto.lock_status(name)))

    def locks(self) -> List[LockStatus]:
        """Every known lock, sorted by name."""
        return proto.lock_list(self._send(proto.locks()))

    # ---- keys and tokens -------------------------------------------------------------

    def keys(self) -> List[PublicKey]:
        """The issuer's public keys, for verifying tokens offline (``palisade.tokens``)."""
        return proto.public_keys(self._send(proto.keys()))

    def check_token(self, token: str) -> TokenCheck:
        """Asks the issuer whether ``token`` is genuine, current and its lease alive."""
        return proto.token_check(self._send(proto.check_token(token)))

    # ---- the fenced store ------------------------------------------------------------

    def high_water(self, name: str) -> FenceStatus:
        """The store's high-water mark for namespace ``name``."""
        return proto.fence_status(self._send(proto.high_water(name)))

    def kv(self, name: str) -> "Kv":
        """Read-only access to namespace ``name``: reads need no token."""
        return Kv(self, name)

    def fenced_kv(self, name: str, token: str) -> "FencedKv":
        """Fenced access to namespace ``name`` with a token obtained elsewhere. Holders
        that acquired through this client use :attr:`Lease.kv`."""
        return FencedKv(self, name, token, None)

    # ---- events ----------------------------------------------------------------------

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

    def health(self) -> None:
        """Returns if a server answers and its store has not latched a failure
        (:class:`StorageFailedError` if it has)."""
        proto.healthy(self._send(proto.health()))

    def close(self) -> None:
        """Stops the renewals of this client's leases and closes its connections. The
        leases are not released: they end after their TTL."""
        for lease in list(self._leases):
            lease._stop_renewing("the client was closed")
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
    besides :meth:`Lease._lose`. ``keepalive(timeout)`` renews and answers the TTL
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
                renewal.lose(_gone(e))
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


class Lease(LeaseBase):
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
        super().__init__(grant, sent_at, self._cond)
        self._client = client
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_renew,
            args=(_lease_keepalive(client, grant.lease_id), self._renewal, self._cond, self._stop),
            name=f"palisade-renew-{grant.lock}",
            daemon=True,
        )
        self._thread.start()
        # Dropping the lease stops the renewals (like the Rust guard); the lease then
        # ends after its TTL.
        weakref.finalize(self, self._stop.set)

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the lease is lost (True) or ``timeout`` seconds pass (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                if self._renewal.is_lost(now):
                    return True
                wait = self._renewal.deadline - now
                if end is not None:
                    if now >= end:
                        return False
                    wait = min(wait, end - now)
                # The deadline is waited for here too, so a stuck renewal request cannot
                # delay the verdict.
                self._cond.wait(wait)

    def _lose(self, reason: str) -> None:
        with self._cond:
            self._renewal.lose(reason)
            self._cond.notify_all()

    def _stop_renewing(self, reason: str) -> None:
        self._stop.set()
        self._lose(reason)

    @property
    def kv(self) -> "FencedKv":
        """The namespace guarded by this lock, every write carrying this lease's token."""
        return FencedKv(self._client, self.lock, self.token, self)

    def fence(self, *, seq: Optional[int] = None) -> int:
        """Barrier: makes this lock's namespace admit this epoch now, fencing off every
        older holder before any data is written (S10). Returns the high-water mark."""
        return self.kv.fence(seq=seq)

    def proclaim(self, value: Optional[Value]) -> Proclaimed:
        """Replaces what this lease advertises (``None`` clears it); lock status shows it
        from now on. Nothing else about the lease changes."""
        self.ensure_alive()
        return self._client.proclaim(self.lease_id, value)

    def check(self) -> TokenCheck:
        """The issuer's view of this lease's token (genuine, current, lease alive)."""
        self.ensure_alive()
        return self._client.check_token(self.token)

    def release(self) -> None:
        """Stops the renewals and releases the lease so the next waiter gets the lock.
        :class:`LeaseLostError` if it had already run out."""
        self._stop_renewing("released")
        self._client.release(self.lease_id)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        _release_on_exit(self, exc is not None)


def _release_on_exit(lease: Lease, body_failed: bool) -> None:
    """Releases at the end of a ``with`` block. A lease that already ended is no error
    here (the lock is not ours either way); another failure to release is raised only
    if the block itself succeeded, so it never hides the block's own exception."""
    try:
        lease.release()
    except LeaseLostError:
        pass
    except Exception:
        if not body_failed:
            raise


class LockContext:
    """``with client.lock(...) as lease``: acquires on entry, releases on exit."""

    def __init__(
        self,
        client: Client,
        name: str,
        holder: Optional[str],
        ttl_ms: int,
        wait_ms: int,
        value: Optional[Value] = None,
        lock_delay_ms: Optional[int] = None,
    ) -> None:
        self._client = client
        self._args = (name, holder, ttl_ms, wait_ms, value, lock_delay_ms)
        self._lease: Optional[Lease] = None

    def __enter__(self) -> Lease:
        name, holder, ttl_ms, wait_ms, value, lock_delay_ms = self._args
        self._lease = self._client.acquire(
            name, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms, value=value, lock_delay_ms=lock_delay_ms
        )
        return self._lease

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._lease is not None:
            _release_on_exit(self._lease, exc is not None)


class Kv:
    """Read access to one namespace. Reads are not fenced: a stale holder may read, it
    just cannot write."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.lock = name

    def get(self, key: str) -> Optional[bytes]:
        """The value at ``key``, or ``None`` if absent."""
        entry = self.entry(key)
        return None if entry is None else entry.value

    def entry(self, key: str) -> Optional[Entry]:
        """The value with its revision (for ``if_match``) and the epoch that wrote it."""
        return proto.entry(self._client._send(proto.kv_get(self.lock, key)))

    def list(self, prefix: str = "") -> List[str]:
        """Keys starting with ``prefix``, in key order, at most 10,000."""
        return proto.key_list(self._client._send(proto.kv_list(self.lock, prefix)))


class FencedKv(Kv):
    """Read and fenced-write access to one namespace with one token.

    There is no unfenced write handle: every mutation sent from here carries the token in
    ``Fencing-Token``. The handle does not know whether its epoch is still current; only
    the server's answer (:class:`StaleTokenError`) says so.
    """

    def __init__(self, client: Client, name: str, token: str, lease: Optional[Lease]) -> None:
        super().__init__(client, name)
        self.token = token
        self._lease = lease

    def _mutate(self, call: Call) -> httpx.Response:
        if self._lease is not None:
            self._lease.ensure_alive()
        try:
            return proto.expect_ok(self._client._send(call))
        except StaleTokenError:
            if self._lease is not None:
                self._lease._stop_renewing("a write was refused as stale: a newer epoch exists")
            raise

    def _auto_key(self) -> bool:
        return self._client._endpoints.several

    def put(
        self,
        key: str,
        value: Union[bytes, str],
        *,
        if_match: Optional[int] = None,
        if_absent: bool = False,
        idempotency_key: Optional[str] = None,
        seq: Optional[int] = None,
    ) -> WriteResult:
        """Writes ``value`` (bytes, or str sent as UTF-8) at ``key``, fenced by the token.

        ``if_match``: only if the key is at this revision; ``if_absent``: only if it does
        not exist (:class:`RevisionMismatchError` otherwise). ``idempotency_key``: a retry
        with the same key returns the first outcome. ``seq``: ``Fencing-Seq`` for
        ``sequence`` namespaces.
        """
        opts = WriteOptions(if_match, if_absent, idempotency_key, seq)
        call = proto.kv_put(self.lock, key, value, self.token, opts, self._auto_key())
        return proto.write_result(self._mutate(call))

    def delete(
        self,
        key: str,
        *,
        if_match: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        seq: Optional[int] = None,
    ) -> WriteResult:
        """Deletes ``key``, fenced like a put; :class:`NotFoundError` if it is absent."""
        opts = WriteOptions(if_match, False, idempotency_key, seq)
        call = proto.kv_delete(self.lock, key, self.token, opts, self._auto_key())
        return proto.write_result(self._mutate(call))

    def fence(self, *, seq: Optional[int] = None) -> int:
        """Barrier: advances the namespace's mark to this token's epoch without writing
        data, so every older holder is refused from now on. Returns the mark."""
        call = proto.fence(self.lock, self.token, seq, self._auto_key())
        return proto.high_water_of_fence(self._mutate(call))

    def entry(self, key: str) -> Optional[Entry]:
        if self._lease is not None:
            self._lease.ensure_alive()
        return super().entry(key)

    def list(self, prefix: str = "") -> List[str]:
        if self._lease is not None:
            self._lease.ensure_alive()
        return super().list(prefix)


class Session:
    """A session held by this process, renewed in the background every ``ttl / 3``: one
    keepalive for every lock acquired in it.

    When the session expires (the process paused, the network failed) or is closed, every
    lock in it is released at once, on the server; :attr:`lost` says so here, and every
    call through its locks then raises :class:`LeaseLostError`. Dropping the session
    stops the renewals without closing it: its locks then end after its TTL.
    """

    def __init__(self, client: Client, info: SessionInfo, sent_at: float) -> None:
        self._client = client
        self._info = info
        self._cond = threading.Condition()
        self._renewal = Renewal(info.ttl_ms, sent_at)
        self._stop = threading.Event()
        session_id = info.session_id
        keepalive = lambda timeout: client.keepalive_session(session_id, timeout=timeout).ttl_ms  # noqa: E731
        self._thread = threading.Thread(
            target=_renew,
            args=(keepalive, self._renewal, self._cond, self._stop),
            name=f"palisade-session-{session_id[:8]}",
            daemon=True,
        )
        self._thread.start()
        weakref.finalize(self, self._stop.set)

    @property
    def session_id(self) -> str:
        return self._info.session_id

    @property
    def ttl_ms(self) -> int:
        """The TTL the server granted (etcd rounds up to whole seconds)."""
        return self._info.ttl_ms

    @property
    def lost(self) -> bool:
        """True once the session is known or presumed lost, and every lock in it with it."""
        with self._cond:
            return self._renewal.is_lost(time.monotonic())

    def ensure_alive(self) -> None:
        with self._cond:
            reason = self._renewal.reason(time.monotonic())
        if reason is not None:
            raise LeaseLostError(f"session {self.session_id} is lost: {reason}")

    def acquire(
        self,
        name: str,
        *,
        holder: Optional[str] = None,
        wait_ms: int = 0,
        value: Optional[Value] = None,
        lock_delay_ms: Optional[int] = None,
    ) -> "SessionLock":
        """Acquires ``name`` in this session: it needs no renewal of its own."""
        self.ensure_alive()
        if holder is None and not self._client._authenticated:
            # The session's own holder (with authentication on the server names it).
            holder = self._info.holder
        grant = self._client.acquire_grant(
            name, holder=holder, wait_ms=wait_ms, value=value, lock_delay_ms=lock_delay_ms,
            session=self.session_id,
        )
        return SessionLock(self, grant)

    def info(self) -> SessionInfo:
        """The session's live locks, as the server sees them now."""
        return self._client.session_info(self.session_id)

    def close(self) -> SessionInfo:
        """Stops the renewals and closes the session: every lock in it is released at
        once (no lock-delay). Answers the released locks."""
        self._stop.set()
        with self._cond:
            self._renewal.lose("closed")
            self._cond.notify_all()
        return self._client.close_session(self.session_id)

    def __enter__(self) -> "Session":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.close()
        except LeaseLostError:
            pass
        except Exception:
            if exc is None:
                raise


class SessionLock(LeaseBase):
    """A lock held in a :class:`Session`: renewed by the session, ended with it. Its
    ``lost`` is the session's."""

    def __init__(self, session: Session, grant: Grant) -> None:
        # The session's schedule is this lock's: one keepalive for all of them.
        super().__init__(grant, time.monotonic(), session._cond)
        self._renewal = session._renewal
        self._session = session

    @property
    def session(self) -> Session:
        return self._session

    @property
    def kv(self) -> "FencedKv":
        """The namespace guarded by this lock, every write carrying this lock's token."""
        return FencedKv(self._session._client, self.lock, self.token, self)  # type: ignore[arg-type]

    def fence(self, *, seq: Optional[int] = None) -> int:
        """Barrier: fences off every older holder of this lock's namespace (S10)."""
        return self.kv.fence(seq=seq)

    def proclaim(self, value: Optional[Value]) -> Proclaimed:
        """Replaces what this lock advertises."""
        self.ensure_alive()
        return self._session._client.proclaim(self.lease_id, value)

    def release(self) -> None:
        """Releases this one lock; the session and its other locks live on."""
        self._session._client.release(self.lease_id)

    def _stop_renewing(self, reason: str) -> None:
        """A write through this lock was refused as stale: only this lock is lost, but
        the schedule is the session's, so nothing is stopped here."""
