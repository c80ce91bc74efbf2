"""What each client method does, written once and without I/O.

Every method of :class:`palisade.Client` and :class:`palisade.aio.Client` (and of their
leases, sessions and namespaces) that talks to the server is an *operation* here: a
generator that yields each :class:`Call` to send (``_protocol`` builds it), takes the
answer, and returns the result (``_protocol`` reads it) or raises the typed error. The
two clients turn each operation into a method with :func:`blocking` or
:func:`asynchronous`; all they do themselves is send (``_run``), with ``httpx.Client``
or ``httpx.AsyncClient``, and keep leases renewed (a thread, or a task).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
import weakref
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, Generic, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

from . import _protocol as proto
from ._attrs import Forward
from ._errors import LeaseLostError, SessionExpiredError, StaleTokenError
from ._failover import Call, Endpoints, Op
from ._lease import LeaseBase, Scheduled
from ._paths import normalise_bases
from ._protocol import CertArg, WriteOptions
from ._renewal import Deadlines, Renewal
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

if TYPE_CHECKING:  # pragma: no cover - typing only; the package runs on 3.9 without it
    from typing_extensions import Concatenate, ParamSpec

    P = ParamSpec("P")

T = TypeVar("T")
S = TypeVar("S")
HttpT = TypeVar("HttpT")
TransportT = TypeVar("TransportT")
LeaseT = TypeVar("LeaseT")
SessionT = TypeVar("SessionT")
LockT = TypeVar("LockT")
ContextT = TypeVar("ContextT")
SelfT = TypeVar("SelfT")

#: A lock value: bytes, or str sent as UTF-8.
Value = Union[bytes, str]


def _named(method: Any, op: Callable[..., Any]) -> Any:
    """``method`` with the name and documentation of ``op``, less its leading ``_``."""
    functools.update_wrapper(method, op)
    # The operation's parameters; what the method returns is the operation's result.
    del method.__wrapped__
    method.__signature__ = inspect.signature(op).replace(return_annotation=inspect.Signature.empty)
    method.__name__ = op.__name__.lstrip("_")
    method.__qualname__ = method.__qualname__.rsplit(".", 1)[0] + "." + method.__name__
    return method


def blocking(op: "Callable[Concatenate[S, P], Op[T]]") -> "Callable[Concatenate[S, P], T]":
    """The blocking method of an operation: runs it with its object's ``_run``."""

    def method(self: Any, /, *args: "P.args", **kwargs: "P.kwargs") -> T:
        result: T = self._run(op(self, *args, **kwargs))
        return result

    named: "Callable[Concatenate[S, P], T]" = _named(method, op)
    return named


def asynchronous(op: "Callable[Concatenate[S, P], Op[T]]") -> "Callable[Concatenate[S, P], Awaitable[T]]":
    """The asyncio method of an operation: awaits it with its object's ``_run``."""

    async def method(self: Any, /, *args: "P.args", **kwargs: "P.kwargs") -> T:
        result: T = await self._run(op(self, *args, **kwargs))
        return result

    named: "Callable[Concatenate[S, P], Awaitable[T]]" = _named(method, op)
    return named


def lost_reason(e: LeaseLostError) -> str:
    """Why a renewal ended it all, as ``lost_reason`` says it."""
    if isinstance(e, SessionExpiredError):
        return "the server says the session expired or was closed"
    return "the server says the lease expired or was released"


@contextlib.contextmanager
def ending(body_failed: bool) -> Iterator[None]:
    """Around the release (or close) at the end of a ``with`` block. One that already
    ended is no error here (the lock is not ours either way); another failure is raised
    only if the block itself succeeded, so it never hides the block's own exception."""
    try:
        yield
    except LeaseLostError:
        pass
    except Exception:
        if not body_failed:
            raise


class Ends:
    """A blocking context manager's exit that ends (releases, closes) what it holds,
    within :func:`ending`."""

    def _end(self) -> object:
        raise NotImplementedError

    def __exit__(self, *exc: object) -> None:
        with ending(exc[1] is not None):
            self._end()


class Scoped(Ends):
    """``with obj:`` ends ``obj`` on exit."""

    def __enter__(self: SelfT) -> SelfT:
        return self


class AsyncEnds:
    """:class:`Ends` for ``async with``."""

    async def _end(self) -> object:
        raise NotImplementedError

    async def __aexit__(self, *exc: object) -> None:
        with ending(exc[1] is not None):
            await self._end()


class AsyncScoped(AsyncEnds):
    """``async with obj:`` ends ``obj`` on exit."""

    async def __aenter__(self: SelfT) -> SelfT:
        return self


class ClientOps(Generic[HttpT, TransportT, LeaseT, SessionT, ContextT]):
    """Both clients: their settings, endpoints and leases, and every call they make."""

    def __init__(
        self,
        url: Union[str, Sequence[str]] = "http://127.0.0.1:7700",
        *,
        key: Optional[str] = None,
        ca: Optional[str] = None,
        cert: Optional[CertArg] = None,
        timeout: float = proto.REQUEST_TIMEOUT,
        connect_timeout: float = proto.CONNECT_TIMEOUT,
        transport: Optional[TransportT] = None,
        deadlines: Deadlines = Deadlines(),
    ) -> None:
        self._endpoints = Endpoints(normalise_bases(url))
        self._deadlines = deadlines
        self._authenticated = key is not None or cert is not None
        settings = proto.http_settings(key, ca, cert, timeout, connect_timeout)
        self._http = self._open(transport, settings)
        self._leases: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def _open(self, transport: Optional[TransportT], settings: Any) -> HttpT:
        raise NotImplementedError

    def _adopt(self, grant: Grant, sent_at: float) -> LeaseT:
        """The lease object of a grant, renewed from now on."""
        raise NotImplementedError

    def _adopt_session(self, info: SessionInfo, sent_at: float) -> SessionT:
        raise NotImplementedError

    def _context(self, args: "LockArgs") -> ContextT:
        raise NotImplementedError

    @property
    def urls(self) -> List[str]:
        """The base URLs, in the order given."""
        return self._endpoints.bases

    def _stop_all(self) -> None:
        for lease in list(self._leases):
            lease._stop_renewing("the client was closed", ended=False)

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
    ) -> ContextT:
        """A context manager that acquires ``name`` on entry (waiting in the server's queue
        up to ``wait_ms``), renews the lease in the background every ``ttl_ms / 3``, and
        releases it on exit (``async with`` in :mod:`palisade.aio`)::

            with client.lock("orders", holder="w1", ttl_ms=5000, wait_ms=2000) as lease:
                lease.fence()
                lease.kv.put("invoice-17", b"paid")

        ``value`` (at most 4 KiB) is what the lease advertises in lock status (see
        :meth:`Lease.proclaim`); ``lock_delay_ms`` is this lease's own lock-delay.
        Raises :class:`LockHeldError` on entry if the lock stays taken.
        """
        return self._context((name, holder, ttl_ms, wait_ms, value, lock_delay_ms))

    def _acquire(
        self,
        name: str,
        *,
        holder: Optional[str] = None,
        ttl_ms: int = 10_000,
        wait_ms: int = 0,
        value: Optional[Value] = None,
        lock_delay_ms: Optional[int] = None,
    ) -> Op[LeaseT]:
        """Acquires ``name`` and starts renewing it; release it with :meth:`Lease.release`
        (or use the lease as a context manager)."""
        # The lease's local deadline counts from before the request: the server's lease
        # started somewhere between send and answer, so this errs towards "lost" early.
        sent_at = time.monotonic()
        grant = yield from self._acquire_grant(
            name, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms, value=value, lock_delay_ms=lock_delay_ms
        )
        if time.monotonic() - sent_at > grant.ttl_ms / 3000:
            # After a wait in line the grant may have come long after the send: renew
            # once now, so the deadline counts from this renewal instead.
            renewed_at = time.monotonic()
            yield from self._keepalive(grant.lease_id)
            sent_at = renewed_at
        lease = self._adopt(grant, sent_at)
        self._leases.add(lease)
        return lease

    def _acquire_grant(
        self,
        name: str,
        *,
        holder: Optional[str] = None,
        ttl_ms: int = 10_000,
        wait_ms: int = 0,
        value: Optional[Value] = None,
        lock_delay_ms: Optional[int] = None,
        session: Optional[str] = None,
    ) -> Op[Grant]:
        """Acquires ``name`` without background renewal: call :meth:`keepalive` yourself,
        or the lease ends after ``ttl_ms``. With ``session`` (an id) the lease is the
        session's: its TTL, renewed and ended with it (prefer :meth:`Session.acquire`)."""
        holder = proto.holder_for(holder, self._authenticated)
        call = proto.acquire(name, holder, ttl_ms, wait_ms, value, lock_delay_ms, session)
        return proto.read(Grant.parse, (yield call))

    def _proclaim(self, lease_id: str, value: Optional[Value]) -> Op[Proclaimed]:
        """Replaces what lease ``lease_id`` advertises (``None`` clears it); its owner only."""
        return proto.read(Proclaimed.parse, (yield proto.proclaim(lease_id, value)))

    def _keepalive(self, lease_id: str, *, timeout: Optional[float] = None) -> Op[KeepaliveInfo]:
        """Renews a lease for a full TTL from now; :class:`LeaseLostError` once it is gone."""
        return proto.read(KeepaliveInfo.parse, (yield proto.keepalive(lease_id, timeout)))

    def _release(self, lease_id: str) -> Op[None]:
        """Releases a lease; the lock passes to the next waiter at once."""
        proto.expect_ok((yield proto.release(lease_id)))

    def _lock_status(self, name: str) -> Op[LockStatus]:
        """One lock's status; a lock never acquired answers epoch 0."""
        return proto.read(LockStatus.parse, (yield proto.lock_status(name)))

    def _locks(self) -> Op[List[LockStatus]]:
        """Every known lock, sorted by name: every page of ``GET /v1/locks`` in turn (with
        authentication on, the ones the caller may see)."""
        out: List[LockStatus] = []
        after: Optional[str] = None
        while True:
            page, after = proto.read(LockStatus.parse_page, (yield proto.locks(after)))
            out.extend(page)
            if after is None:
                return out

    # ---- sessions --------------------------------------------------------------------

    def _session(self, *, ttl_ms: int = 10_000, holder: Optional[str] = None) -> Op[SessionT]:
        """Creates a session, renewed in the background every ``ttl_ms / 3``: one keepalive
        for every lock acquired in it (:meth:`Session.acquire`). When it expires or is
        closed, every lock in it is released at once. A context manager that closes it::

            with client.session(ttl_ms=5000) as session:
                a = session.acquire("a")
                b = session.acquire("b")
        """
        sent_at = time.monotonic()
        info = yield from self._create_session(ttl_ms=ttl_ms, holder=holder)
        return self._adopt_session(info, sent_at)

    def _create_session(self, *, ttl_ms: int = 10_000, holder: Optional[str] = None) -> Op[SessionInfo]:
        """Creates a session without background renewal."""
        holder = proto.holder_for(holder, self._authenticated)
        return proto.read(SessionInfo.parse, (yield proto.create_session(holder, ttl_ms)))

    def _keepalive_session(self, session_id: str, *, timeout: Optional[float] = None) -> Op[SessionInfo]:
        """Renews a session and every lock in it; :class:`SessionExpiredError` once gone."""
        return proto.read(SessionInfo.parse, (yield proto.keepalive_session(session_id, timeout)))

    def _session_info(self, session_id: str) -> Op[SessionInfo]:
        """A live session and its locks."""
        return proto.read(SessionInfo.parse, (yield proto.session_info(session_id)))

    def _close_session(self, session_id: str) -> Op[SessionInfo]:
        """Ends a session: every lock in it is released at once. Answers those locks."""
        return proto.read(SessionInfo.parse, (yield proto.close_session(session_id)))

    # ---- keys, tokens, the store, health ---------------------------------------------

    def _keys(self) -> Op[List[PublicKey]]:
        """The issuer's public keys, for verifying tokens offline (``palisade.tokens``)."""
        return proto.read(PublicKey.parse_list, (yield proto.keys()))

    def _check_token(self, token: str) -> Op[TokenCheck]:
        """Asks the issuer whether ``token`` is genuine, current and its lease alive."""
        return proto.read(TokenCheck.parse, (yield proto.check_token(token)))

    def _high_water(self, name: str) -> Op[FenceStatus]:
        """The store's high-water mark for namespace ``name``."""
        return proto.read(FenceStatus.parse, (yield proto.high_water(name)))

    def _report_gate(self, report: Dict[str, Any]) -> Op[Dict[str, int]]:
        """Sends a gate's report of what it admitted and refused (``POST
        /v1/gates/report``; :class:`palisade.gates.report.GateTally` makes them): the
        server counts it in ``/metrics`` and puts its refusals on the events stream.
        Returns ``{"published": n, "dropped": m}``, the refusals that became events and
        those dropped by the server's rate limit."""
        answer = proto.body((yield proto.report_gate(report)))
        return {"published": int(answer["published"]), "dropped": int(answer["dropped"])}

    def _health(self) -> Op[None]:
        """Returns if a server answers and its store has not latched a failure
        (:class:`StorageFailedError` if it has)."""
        proto.healthy((yield proto.health()))


LockArgs = Tuple[str, Optional[str], int, int, Optional[Value], Optional[int]]


class LockContextBase:
    """``with client.lock(...) as lease``: acquires on entry, releases on exit."""

    def __init__(
        self,
        client: Any,
        name: str,
        holder: Optional[str],
        ttl_ms: int,
        wait_ms: int,
        value: Optional[Value] = None,
        lock_delay_ms: Optional[int] = None,
    ) -> None:
        self._client = client
        self._args = (name, holder, ttl_ms, wait_ms, value, lock_delay_ms)

    def _acquire(self) -> Op[Any]:
        name, holder, ttl_ms, wait_ms, value, lock_delay_ms = self._args
        return (
            yield from self._client._acquire(
                name, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms, value=value, lock_delay_ms=lock_delay_ms
            )
        )


class KvOps:
    """The operations of :class:`palisade.Kv` and ``palisade.aio.Kv``."""

    def __init__(self, client: Any, name: str) -> None:
        self._client = client
        self.lock = name

    def _run(self, op: Op[T]) -> Any:
        return self._client._run(op)

    def _check(self) -> None:
        """Before any call: nothing to check without a lease."""

    def _get(self, key: str) -> Op[Optional[bytes]]:
        """The value at ``key``, or ``None`` if absent."""
        entry = yield from self._entry(key)
        return None if entry is None else entry.value

    def _entry(self, key: str) -> Op[Optional[Entry]]:
        """The value with its revision (for ``if_match``) and the epoch that wrote it."""
        self._check()
        return proto.entry((yield proto.kv_get(self.lock, key)))

    def _list(self, prefix: str = "") -> Op[List[str]]:
        """Keys starting with ``prefix``, in key order, at most 10,000."""
        self._check()
        return proto.key_list((yield proto.kv_list(self.lock, prefix)))


class FencedKvOps(KvOps):
    """The operations of :class:`palisade.FencedKv` and ``palisade.aio.FencedKv``."""

    def __init__(self, client: Any, name: str, token: str, lease: "Optional[HeldOps]") -> None:
        super().__init__(client, name)
        self.token = token
        self._lease = lease

    def _check(self) -> None:
        if self._lease is not None:
            self._lease.ensure_alive()

    def _mutate(self, call: Call) -> Op[Any]:
        self._check()
        try:
            return proto.expect_ok((yield call))
        except StaleTokenError:
            if self._lease is not None:
                self._lease._stop_renewing("a write was refused as stale: a newer epoch exists")
            raise

    def _auto_key(self) -> bool:
        return bool(self._client._endpoints.several)

    def _put(
        self,
        key: str,
        value: Value,
        *,
        if_match: Optional[int] = None,
        if_absent: bool = False,
        idempotency_key: Optional[str] = None,
        seq: Optional[int] = None,
    ) -> Op[WriteResult]:
        """Writes ``value`` (bytes, or str sent as UTF-8) at ``key``, fenced by the token.

        ``if_match``: only if the key is at this revision; ``if_absent``: only if it does
        not exist (:class:`RevisionMismatchError` otherwise). ``idempotency_key``: a retry
        with the same key returns the first outcome. ``seq``: ``Fencing-Seq`` for
        ``sequence`` namespaces.
        """
        opts = WriteOptions(if_match, if_absent, idempotency_key, seq)
        call = proto.kv_put(self.lock, key, value, self.token, opts, self._auto_key())
        return proto.write_result((yield from self._mutate(call)))

    def _delete(
        self,
        key: str,
        *,
        if_match: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        seq: Optional[int] = None,
    ) -> Op[WriteResult]:
        """Deletes ``key``, fenced like a put; :class:`NotFoundError` if it is absent."""
        opts = WriteOptions(if_match, False, idempotency_key, seq)
        call = proto.kv_delete(self.lock, key, self.token, opts, self._auto_key())
        return proto.write_result((yield from self._mutate(call)))

    def _fence(self, *, seq: Optional[int] = None) -> Op[int]:
        """Barrier: advances the namespace's mark to this token's epoch without writing
        data, so every older holder is refused from now on. Returns the mark."""
        call = proto.fence(self.lock, self.token, seq, self._auto_key())
        return proto.high_water_of_fence((yield from self._mutate(call)))


class HeldOps(LeaseBase):
    """What a lease and a lock held in a session both do through their client."""

    _client: "ClientOps[Any, Any, Any, Any, Any]"

    def _run(self, op: Op[T]) -> Any:
        return self._client._run(op)  # type: ignore[attr-defined]

    def _stop_renewing(self, reason: str, ended: bool = True) -> None:
        raise NotImplementedError

    def _fence(self, *, seq: Optional[int] = None) -> Op[int]:
        """Barrier: makes this lock's namespace admit this epoch now, fencing off every
        older holder before any data is written (S10). Returns the high-water mark."""
        return (yield from FencedKvOps(self._client, self.lock, self.token, self)._fence(seq=seq))

    def _proclaim(self, value: Optional[Value]) -> Op[Proclaimed]:
        """Replaces what this lease advertises (``None`` clears it); lock status shows it
        from now on. Nothing else about the lease changes."""
        self.ensure_alive()
        return (yield from self._client._proclaim(self.lease_id, value))

    def _check(self) -> Op[TokenCheck]:
        """The issuer's view of this lease's token (genuine, current, lease alive)."""
        self.ensure_alive()
        return (yield from self._client._check_token(self.token))

    def _release(self) -> Op[None]:
        """Stops the renewals and releases the lease so the next waiter gets the lock.
        :class:`LeaseLostError` if it had already run out."""
        self._stop_renewing("released")
        yield from self._client._release(self.lease_id)


class SessionOps(Scheduled, Generic[LockT]):
    """The operations of :class:`palisade.Session` and ``palisade.aio.Session``."""

    def __init__(self, client: "ClientOps[Any, Any, Any, Any, Any]", info: SessionInfo, sent_at: float, guard: Any) -> None:
        super().__init__(info.ttl_ms, sent_at, guard, client._deadlines)
        self._client = client
        self._info = info

    def _name(self) -> str:
        return f"session {self.session_id}"

    def _run(self, op: Op[T]) -> Any:
        return self._client._run(op)  # type: ignore[attr-defined]

    def _adopt(self, grant: Grant) -> LockT:
        raise NotImplementedError

    def _stop_renewing(self, reason: str, ended: bool = True) -> None:
        raise NotImplementedError

    session_id = Forward[str]("_info")
    ttl_ms = Forward[int]("_info", "The TTL the server granted (etcd rounds up to whole seconds).")

    def _acquire(
        self,
        name: str,
        *,
        holder: Optional[str] = None,
        wait_ms: int = 0,
        value: Optional[Value] = None,
        lock_delay_ms: Optional[int] = None,
    ) -> Op[LockT]:
        """Acquires ``name`` in this session: it needs no renewal of its own."""
        self.ensure_alive()
        if holder is None and not self._client._authenticated:
            # The session's own holder (with authentication on the server names it).
            holder = self._info.holder
        grant = yield from self._client._acquire_grant(
            name, holder=holder, wait_ms=wait_ms, value=value, lock_delay_ms=lock_delay_ms,
            session=self.session_id,
        )
        return self._adopt(grant)

    def _session_info(self) -> Op[SessionInfo]:
        """The session's live locks, as the server sees them now."""
        return (yield from self._client._session_info(self.session_id))

    def _close(self) -> Op[SessionInfo]:
        """Stops the renewals and closes the session: every lock in it is released at
        once (no lock-delay). Answers the released locks."""
        self._stop_renewing("closed")
        return (yield from self._client._close_session(self.session_id))


class SessionLockOps(HeldOps, Generic[S]):
    """What :class:`palisade.SessionLock` and ``palisade.aio.SessionLock`` share."""

    def __init__(self, session: "SessionOps[Any]", grant: Grant) -> None:
        # The session's schedule is this lock's: one keepalive for all of them.
        super().__init__(grant, time.monotonic(), session._guard, session._renewal.deadlines)
        self._renewal = session._renewal
        self._session: Any = session
        self._client = session._client

    @property
    def session(self) -> S:
        result: S = self._session
        return result

    def _stop_renewing(self, reason: str, ended: bool = True) -> None:
        """A write through this lock was refused as stale: only this lock is lost, but
        the schedule is the session's, so nothing is stopped here."""


def waiting(renewal: Renewal, end: Optional[float]) -> Tuple[Optional[bool], float]:
    """One step of ``wait_lost``: ``(True, _)`` once the lease is lost, ``(False, _)``
    once ``end`` has passed, else ``(None, seconds to wait)``. The deadline is waited
    for too, so a stuck renewal request cannot delay the verdict."""
    now = time.monotonic()
    if renewal.is_lost(now):
        return True, 0.0
    wait = renewal.renew_by - now
    if end is not None:
        if now >= end:
            return False, 0.0
        wait = min(wait, end - now)
    return None, wait
