"""The server's live events (``GET /v1/locks/{lock}/events``, ``GET /v1/events``) as
typed objects, for both clients: :class:`EventStream` (blocking iterator) and
:class:`AsyncEventStream` (``async for``).

A stream reconnects by itself when its connection drops or goes quiet (the server sends
a keep-alive comment every 15 s; nothing for :data:`IDLE_LIMIT` seconds counts as a dead
connection), sending the id of the last event it delivered as ``Last-Event-ID``, so that
nothing is skipped while the server still holds it. When the server no longer holds it
(or it restarted, or the stream failed over to another node) the stream yields a
:class:`ResetEvent` first: whatever the caller derived from earlier events should be
read again. Each connection goes through the client's endpoints in order, like any read.

Failures that may pass (the network, 429 too many streams, 503) are retried after a
pause (0.1 s, doubling to 5 s); the last one is kept in ``last_error``. A refusal that
retrying will not change (401, 403, 400, 404 from a server without events) is raised and
ends the stream.

Memory is bounded whatever the server sends: a line longer than :data:`MAX_LINE` bytes
(far above any event the server sends) is dropped whole, not accumulated, and so is an
event whose data would exceed it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, ClassVar, Deque, Dict, Generic, Iterator, List, Optional, Tuple, Type, TypeVar
from urllib.parse import quote

import httpx

from ._attrs import Forward
from ._errors import (
    DecodeError,
    PalisadeError,
    QuotaExceededError,
    StorageFailedError,
    TransportError,
    decode_error,
)
from ._failover import Call, Exchange, Op, Retry
from ._paths import segment
from ._types import read_fields

if TYPE_CHECKING:  # pragma: no cover
    from . import aio
    from ._sync import Client

#: The event classes (both clients export them; the streams are their own).
__all__ = [
    "Event",
    "GrantedEvent",
    "ReleasedEvent",
    "ExpiredEvent",
    "FencedEvent",
    "RejectedEvent",
    "ResetEvent",
]

ClientT = TypeVar("ClientT")

#: Seconds without a byte (not even the server's keep-alive comment, sent every 15 s)
#: after which a connection is treated as dead and reopened.
IDLE_LIMIT = 45.0
#: Longest line, and longest event data, a stream keeps (bytes).
MAX_LINE = 1 << 20
_FIRST_PAUSE, _MAX_PAUSE = 0.1, 5.0

# ---- the events -------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One event. ``id`` increases from event to event (resume with it); ``at_ms`` is
    the server's wall clock, in milliseconds since the Unix epoch."""

    #: The wire name of the event's type (``"granted"``, ``"rejected"``, ...).
    type: ClassVar[str] = ""

    id: int
    at_ms: int


@dataclass(frozen=True)
class _LeaseEvent(Event):
    """An event of one lease: ``holder``'s lease of ``epoch`` on ``lock``."""

    lock: str
    epoch: int
    holder: str


@dataclass(frozen=True)
class GrantedEvent(_LeaseEvent):
    """A lease was granted: ``holder`` got ``epoch`` of ``lock`` for ``ttl_ms``."""

    type: ClassVar[str] = "granted"
    ttl_ms: int


@dataclass(frozen=True)
class ReleasedEvent(_LeaseEvent):
    """The lease of ``epoch`` ended by release (``cause`` ``"release"``), or, over etcd,
    through another node by a release or an expiry the server cannot tell apart
    (``"unknown"``)."""

    type: ClassVar[str] = "released"
    cause: str


@dataclass(frozen=True)
class ExpiredEvent(_LeaseEvent):
    """The lease of ``epoch`` ran out without renewal."""

    type: ClassVar[str] = "expired"


@dataclass(frozen=True)
class FencedEvent(Event):
    """The namespace's high-water mark advanced to ``high_water`` (and ``seq``, with the
    sequence policy; 0 otherwise)."""

    type: ClassVar[str] = "fenced"
    lock: str
    high_water: int
    seq: int


@dataclass(frozen=True)
class RejectedEvent(Event):
    """A mutation of the namespace was refused with error ``code``: ``epoch`` is the
    token's (``None`` when none verified), ``high_water`` the mark that refused it
    (``None`` unless ``stale_token`` or ``stale_sequence``)."""

    type: ClassVar[str] = "rejected"
    lock: str
    code: str
    epoch: Optional[int]
    high_water: Optional[int]


@dataclass(frozen=True)
class ResetEvent(Event):
    """Events may have been missed: read the state again. ``reason`` is
    ``unknown_last_event_id``, ``lagged`` or ``gap``."""

    type: ClassVar[str] = "reset"
    reason: str


_TYPES: Dict[str, Type[Event]] = {
    cls.type: cls
    for cls in (GrantedEvent, ReleasedEvent, ExpiredEvent, FencedEvent, RejectedEvent, ResetEvent)
}


def parse_event(data: str) -> Optional[Event]:
    """The event an SSE ``data`` field carries; ``None`` for a type this version does not
    know, or data that is not an event (skipped, as docs/api.md asks)."""
    try:
        raw = json.loads(data)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in _TYPES:
        return None
    try:
        return read_fields(_TYPES[kind], "event", raw)
    except DecodeError:
        return None


class SseParser:
    """Splits a ``text/event-stream`` byte stream into events' ``data``; comments and
    fields other than ``data`` are ignored. Holds at most :data:`MAX_LINE` bytes of an
    unfinished line and of an unfinished event's data."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._max = max_line
        self._buf = bytearray()
        self._scanned = 0
        self._data: List[str] = []
        self._data_len = 0
        self._skipping = False
        self._oversized = False

    def feed(self, chunk: bytes) -> List[str]:
        """Feeds bytes; returns the data of the events they complete, in order."""
        self._buf += chunk
        out: List[str] = []
        while True:
            end = self._buf.find(b"\n", self._scanned)
            if end < 0:
                break
            line = bytes(self._buf[:end])
            del self._buf[: end + 1]
            self._scanned = 0
            if self._skipping:  # the end of a line too long to keep
                self._skipping = False
                continue
            self._line(line.rstrip(b"\r").decode("utf-8", errors="replace"), out)
        self._scanned = len(self._buf)
        if len(self._buf) > self._max:
            # No event the server sends is this long: drop the line, and its rest too.
            self._buf.clear()
            self._scanned = 0
            self._skipping = True
        return out

    def _line(self, line: str, out: List[str]) -> None:
        if line == "":
            if self._data and not self._oversized:
                out.append("\n".join(self._data))
            self._data, self._data_len, self._oversized = [], 0, False
            return
        if line.startswith(":"):
            return
        field, _, value = line.partition(":")
        if field != "data":
            return
        value = value[1:] if value.startswith(" ") else value
        self._data_len += len(value) + 1
        if self._data_len > self._max:
            self._data, self._oversized = [], True
        elif not self._oversized:
            self._data.append(value)


# ---- the streams ------------------------------------------------------------------------


def worth_retrying(e: PalisadeError) -> bool:
    """Whether a refused or failed connection may succeed later: the network, too many
    streams, a node shutting down or without its storage."""
    return isinstance(e, (TransportError, QuotaExceededError, StorageFailedError)) or e.code == "unavailable"


def lock_events_path(lock: str) -> str:
    return f"/v1/locks/{segment('lock name', lock)}/events"


def prefix_events_path(prefix: str) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a string, not {type(prefix).__name__}")
    return "/v1/events" + (f"?prefix={quote(prefix, safe='')}" if prefix else "")


def _headers(last_id: Optional[int]) -> Dict[str, str]:
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
    if last_id is not None:
        headers["Last-Event-ID"] = str(last_id)
    return headers


class _State:
    """What both streams share: the path, the last id, the parser, the events parsed and
    not yet returned, the pause before the next retry."""

    def __init__(self, path: str, last_event_id: Optional[int], on_connect: Optional[Callable[[], None]]) -> None:
        if last_event_id is not None and (
            isinstance(last_event_id, bool) or not isinstance(last_event_id, int) or last_event_id < 0
        ):
            raise TypeError("last_event_id must be a non-negative integer")
        self.path = path
        self.last_event_id = last_event_id
        self.on_connect = on_connect
        self.parser = SseParser()
        self.ready: Deque[Event] = collections.deque()
        self.pause = _FIRST_PAUSE
        self.last_error: Optional[PalisadeError] = None
        self.connections = 0
        self.received = False

    def open(self) -> Op[httpx.Response]:
        """Opens a connection (over the endpoints, like any read): the answer if it is
        the stream, the typed error if it is not."""
        response = yield Call("GET", self.path, _headers(self.last_event_id), retry=Retry.SAFE)
        if response.status_code != 200:
            raise decode_error(response.status_code, response.content)
        return response

    def connected(self) -> None:
        self.parser = SseParser()
        self.ready.clear()
        self.received = False
        self.connections += 1
        if self.on_connect is not None:
            self.on_connect()

    def feed(self, chunk: bytes) -> None:
        self.pause = _FIRST_PAUSE
        self.received = True
        for data in self.parser.feed(chunk):
            event = parse_event(data)
            if event is not None:
                self.ready.append(event)

    def pop(self) -> Event:
        event = self.ready.popleft()
        self.last_event_id = event.id
        return event

    def ended(self, e: PalisadeError) -> float:
        """Records the end of a connection; the pause before reopening it: none after a
        connection that carried something, the retry pause after one that did not (so a
        server that accepts and closes at once is not asked again and again)."""
        self.last_error = e
        return 0.0 if self.received else self.failed(e)

    def failed(self, e: PalisadeError) -> float:
        """Records a failure worth retrying; the pause before the next try."""
        self.last_error = e
        pause, self.pause = self.pause, min(self.pause * 2, _MAX_PAUSE)
        return pause


def _broke(e: Exception) -> TransportError:
    return TransportError(f"events stream broke: {type(e).__name__}: {e}", outcome_unknown=False)


def _timeout(http: Any) -> httpx.Timeout:
    connect = http.timeout.connect
    return httpx.Timeout(IDLE_LIMIT, connect=connect if connect is not None else IDLE_LIMIT)


class _Stream(Generic[ClientT]):
    """What both streams share: their client, state, open response and whether they
    were closed (an event only read and set, never waited on, by the asyncio stream)."""

    _chunks: Any

    def __init__(
        self,
        client: ClientT,
        path: str,
        last_event_id: Optional[int] = None,
        on_connect: Optional[Callable[[], None]] = None,
    ) -> None:
        self._client = client
        self._state = _State(path, last_event_id, on_connect)
        self._response: Optional[httpx.Response] = None
        self._chunks = None
        self._closed = threading.Event()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    last_event_id = Forward[Optional[int]]("_state", "The id of the last event delivered.")
    last_error = Forward[Optional[PalisadeError]]("_state", "The last failure that was retried (``None`` if none was).")
    connections = Forward[int]("_state", "How many connections the stream has opened (1 + reconnections).")

    @property
    def connected(self) -> bool:
        return self._response is not None

    def _exchange(self) -> "Tuple[Exchange[httpx.Response], Any]":
        """The opening of a connection, and the HTTP client to send it with."""
        client: Any = self._client
        return Exchange(client._endpoints, self._state.open()), client._http

    def _request(self, http: Any, url: str, call: Call) -> httpx.Request:
        return http.build_request("GET", url, headers=call.headers, timeout=_timeout(http))  # type: ignore[no-any-return]


class EventStream(_Stream["Client"]):
    """A blocking iterator of :class:`Event` objects (see the module docs); made by
    :meth:`palisade.Client.watch` and :meth:`palisade.Client.events`::

        with client.watch("orders") as events:
            for event in events:
                if isinstance(event, RejectedEvent):
                    print(event.code, event.epoch, event.high_water)

    ``last_event_id`` is the id of the last event delivered (resume a new stream after it
    with ``watch(..., last_event_id=...)``). Close it to end the connection; iteration
    then stops. Use one stream from one thread (:meth:`close` may come from another).
    """

    _chunks: Optional[Iterator[bytes]]

    def connect(self) -> None:
        """Opens the connection now (iterating opens it otherwise): every event after this
        returns reaches the stream. Raises what opening it raised."""
        if self._response is not None:
            return
        exchange, http = self._exchange()
        for url, call in exchange:
            try:
                response = http.send(self._request(http, url, call), stream=True)
            except httpx.TransportError as e:
                exchange.got(e)
                continue
            if response.status_code != 200:
                response.read()
                response.close()
            exchange.got(response)
        self._response = exchange.value
        self._chunks = self._response.iter_bytes()
        self._state.connected()

    def _drop(self) -> None:
        response, self._response, self._chunks = self._response, None, None
        if response is not None:
            response.close()

    def __iter__(self) -> "EventStream":
        return self

    def __next__(self) -> Event:
        state = self._state
        while True:
            if self._closed.is_set():
                self._drop()
                raise StopIteration
            if state.ready:
                return state.pop()
            if self._chunks is None:
                try:
                    self.connect()
                except PalisadeError as e:
                    if not worth_retrying(e):
                        self.close()
                        raise
                    self._closed.wait(state.failed(e))
                continue
            try:
                chunk = next(self._chunks)
            except StopIteration:  # the server ended the stream (shutting down)
                self._drop()
                self._closed.wait(state.ended(TransportError("the server ended the events stream", outcome_unknown=False)))
                continue
            except (httpx.TransportError, httpx.StreamError) as e:
                # Broken, or silent for IDLE_LIMIT: reopen, resuming after the last id.
                self._drop()
                self._closed.wait(state.ended(_broke(e)))
                continue
            state.feed(chunk)

    def close(self) -> None:
        """Ends the stream; from another thread too, where it wakes a blocked read."""
        self._closed.set()
        response = self._response
        if response is not None:
            # Closing the response does not wake a read blocked in another thread; shutting
            # the socket down does (the read then fails, and the iteration stops).
            stream = response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(sock, socket.socket):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        try:
            self._drop()
        except Exception:  # pragma: no cover - closing from another thread mid-read
            pass

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncEventStream(_Stream["aio.Client"]):
    """The asyncio twin of :class:`EventStream` (``async for event in client.watch(...)``),
    made by :meth:`palisade.aio.Client.watch` and :meth:`palisade.aio.Client.events`."""

    _chunks: Optional[AsyncIterator[bytes]]

    async def connect(self) -> None:
        """Opens the connection now; see :meth:`EventStream.connect`."""
        if self._response is not None:
            return
        exchange, http = self._exchange()
        for url, call in exchange:
            try:
                response = await http.send(self._request(http, url, call), stream=True)
            except httpx.TransportError as e:
                exchange.got(e)
                continue
            if response.status_code != 200:
                await response.aread()
                await response.aclose()
            exchange.got(response)
        self._response = exchange.value
        self._chunks = self._response.aiter_bytes()
        self._state.connected()

    async def _drop(self) -> None:
        response, self._response, self._chunks = self._response, None, None
        if response is not None:
            await response.aclose()

    def __aiter__(self) -> "AsyncEventStream":
        return self

    async def __anext__(self) -> Event:
        state = self._state
        while True:
            if self._closed.is_set():
                await self._drop()
                raise StopAsyncIteration
            if state.ready:
                return state.pop()
            if self._chunks is None:
                try:
                    await self.connect()
                except PalisadeError as e:
                    if not worth_retrying(e):
                        await self.aclose()
                        raise
                    await asyncio.sleep(state.failed(e))
                continue
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                await self._drop()
                await asyncio.sleep(state.ended(TransportError("the server ended the events stream", outcome_unknown=False)))
                continue
            except (httpx.TransportError, httpx.StreamError) as e:
                await self._drop()
                await asyncio.sleep(state.ended(_broke(e)))
                continue
            state.feed(chunk)

    async def aclose(self) -> None:
        self._closed.set()
        await self._drop()

    async def __aenter__(self) -> "AsyncEventStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

