"""Failover between the endpoints of one deployment: which failures may move a call to
the next node, and the loop both clients run over the nodes.

The rule (:func:`may_try_next`): a call moves to the next endpoint when the current one
could not be reached, or answered 503; a call whose request may already have been
applied moves on only if resending it cannot apply it twice. Reads, renewals, releases
and token checks are safe to resend. A fenced write or barrier is safe to resend only
with an ``Idempotency-Key``, so a client given several endpoints puts a fresh key on
every write it sends (``_protocol``); a resend of the same write carries the same key,
and the server answers it with the first outcome instead of applying it again. An
acquire whose answer was lost is not resent: a second acquire would be a second lease.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Generator, Iterator, List, Optional, Sequence, Set, Tuple, TypeVar, Union

import httpx

from ._errors import PalisadeError, TransportError, decode_error
from ._stepper import Stepper

T = TypeVar("T")


class Retry(enum.Enum):
    """How freely a call may be resent to the next endpoint."""

    #: Resending cannot change the outcome: reads, renewals, releases, token checks, and
    #: writes carrying an idempotency key.
    SAFE = "safe"
    #: Resent when no node got it or a node answered 503, but not when the answer was
    #: lost (an acquire: resending could take a second lease).
    UNLESS_UNKNOWN = "unless_unknown"
    #: Resent only when it surely reached no node (a write without an idempotency key:
    #: a 503 from a replicated backend may come after the write was applied).
    ONLY_UNREACHABLE = "only_unreachable"


class Failure(enum.Enum):
    """How one attempt on one endpoint failed."""

    #: The request was never sent: connection refused or timed out.
    UNREACHABLE = "unreachable"
    #: The node answered 503 (its storage failed, or it lost its backend).
    UNAVAILABLE = "unavailable"
    #: The request was sent and no answer came back: it may have been applied.
    UNKNOWN = "unknown"


def may_try_next(retry: Retry, failure: Failure) -> bool:
    """Whether a call with this retry class may move to the next endpoint."""
    if failure is Failure.UNREACHABLE:
        return True
    if failure is Failure.UNAVAILABLE:
        return retry is not Retry.ONLY_UNREACHABLE
    return retry is Retry.SAFE


def classify(exc: httpx.TransportError) -> Optional[Failure]:
    """What an httpx failure says about the request, or ``None`` for a local mistake
    (an unsupported URL scheme, an invalid header) that no other endpoint would fix."""
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return Failure.UNREACHABLE
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.ProxyError)):
        return None
    return Failure.UNKNOWN


@dataclass(frozen=True)
class Call:
    """One API call, ready to send to any endpoint: ``{base}{path}``."""

    method: str
    path: str
    headers: Dict[str, str] = field(default_factory=dict)
    body: Optional[bytes] = None
    #: Read timeout for this call (seconds); ``None`` uses the client's default.
    timeout: Optional[float] = None
    retry: Retry = Retry.SAFE


class Endpoints:
    """The base URLs of one deployment, tried in order starting from the last one that
    answered (so a dead node costs one failed connect, not one per call)."""

    def __init__(self, bases: Sequence[str]) -> None:
        self._bases = list(bases)
        self._preferred = 0
        self._lock = threading.Lock()

    @property
    def bases(self) -> List[str]:
        return list(self._bases)

    @property
    def several(self) -> bool:
        return len(self._bases) > 1

    def order(self) -> List[str]:
        with self._lock:
            start = self._preferred
        return self._bases[start:] + self._bases[:start]

    def prefer(self, base: str) -> None:
        with self._lock:
            self._preferred = self._bases.index(base)


class Attempts:
    """The endpoint loop of one call, shared by both clients::

        attempts = Attempts(endpoints, call)
        for base in attempts:
            try:
                response = send(base + call.path)
            except httpx.TransportError as e:
                attempts.failed(base, e)        # raises if the call may not move on
                continue
            if attempts.answered(base, response):
                return response
        raise attempts.exhausted()

    Each endpoint is tried once, in :meth:`Endpoints.order`. A call that is safe to
    resend gets one more try on an endpoint that lost an answer, after the others: a
    keep-alive connection the server closed between two requests fails exactly that way
    (RFC 9112 9.3.1 lets a client resend an idempotent request then), and the retry goes
    out on a new connection.
    """

    def __init__(self, endpoints: Endpoints, call: Call) -> None:
        self._endpoints = endpoints
        self._call = call
        self._queue = endpoints.order()
        self._resent: Set[str] = set()
        self._tried: List[str] = []
        self._last: Optional[PalisadeError] = None
        self._unknown = False

    def __iter__(self) -> Iterator[str]:
        while self._queue:
            yield self._queue.pop(0)

    def failed(self, base: str, exc: httpx.TransportError) -> None:
        failure = classify(exc)
        self._unknown = self._unknown or failure is Failure.UNKNOWN
        self._tried.append(f"{base}: {type(exc).__name__}: {exc}".rstrip(": "))
        error = TransportError(
            f"{self._call.method} {self._call.path} failed: " + "; ".join(self._tried),
            outcome_unknown=self._unknown,
        )
        error.__cause__ = exc
        self._last = error
        if failure is None or not may_try_next(self._call.retry, failure):
            raise error
        if failure is Failure.UNKNOWN and base not in self._resent:
            # After the other endpoints: a node that lost one answer may be going down.
            self._resent.add(base)
            self._queue.append(base)

    def answered(self, base: str, response: httpx.Response) -> bool:
        """True if this answer is the call's outcome; False to try the next endpoint."""
        if (
            response.status_code == 503
            and self._queue
            and may_try_next(self._call.retry, Failure.UNAVAILABLE)
        ):
            self._tried.append(f"{base}: HTTP 503")
            self._last = decode_error(503, response.content)
            return False
        self._endpoints.prefer(base)
        return True

    def exhausted(self) -> PalisadeError:
        if self._last is None:  # pragma: no cover - there is always at least one base
            return TransportError("no endpoint to send to", outcome_unknown=False)
        return self._last


#: What one HTTP request to one endpoint came back with.
Outcome = Union[httpx.Response, httpx.TransportError]
#: An operation without I/O: it yields the :class:`Call` objects to send, takes each
#: answer, and returns the result (or raises the typed error).
Op = Generator[Call, httpx.Response, T]


def _attempt(endpoints: Endpoints, call: Call) -> Generator[Tuple[str, Call], Outcome, httpx.Response]:
    """One call over the endpoints (:class:`Attempts`): yields the URL to send it to and
    takes what came back; returns the answer that is the call's outcome."""
    attempts = Attempts(endpoints, call)
    for base in attempts:
        outcome = yield base + call.path, call
        if isinstance(outcome, httpx.TransportError):
            attempts.failed(base, outcome)
            continue
        if attempts.answered(base, outcome):
            return outcome
    raise attempts.exhausted()


def _over(endpoints: Endpoints, op: Op[T]) -> Generator[Tuple[str, Call], Outcome, T]:
    """Runs ``op``, sending each of its calls over the endpoints; a call that fails on
    every endpoint is raised inside ``op``, where it was made."""
    try:
        call = next(op)
        while True:
            try:
                response = yield from _attempt(endpoints, call)
            except PalisadeError as e:
                call = op.throw(e)
            else:
                call = op.send(response)
    except StopIteration as done:
        result: T = done.value
        return result


class Exchange(Stepper[Tuple[str, Call], Outcome, T]):
    """One operation run over the endpoints, for a client that does the sending::

        exchange = Exchange(endpoints, op)
        for url, call in exchange:
            try:
                outcome = http.request(call.method, url, ...)
            except httpx.TransportError as e:
                outcome = e
            exchange.got(outcome)
        return exchange.value
    """

    def __init__(self, endpoints: Endpoints, op: Op[T]) -> None:
        super().__init__(_over(endpoints, op))


def request_args(call: Call) -> Dict[str, Any]:
    """The keyword arguments of ``request`` for ``call`` (its URL aside)."""
    timeout: Any = httpx.USE_CLIENT_DEFAULT if call.timeout is None else call.timeout
    return {"headers": call.headers, "content": call.body, "timeout": timeout}
