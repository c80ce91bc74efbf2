"""Live events through the Python clients, against a real server: typed events in the
server's order, a stale write seen as a ``rejected`` event, resuming with
``Last-Event-ID`` after a dropped connection, a ``reset`` when the events cannot be
resumed, prefixes, a bearer key over TLS, failover, and the election observer learning
of changes from the stream (and polling when the stream is refused). The SSE parser's
bounds are tested on their own."""

from __future__ import annotations

import asyncio
import queue
import select
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, List, Optional, Tuple, Type, TypeVar

import httpx
import pytest

import palisade.aio
from palisade import (
    Client,
    Election,
    Event,
    LeaderInfo,
    Observer,
    EventStream,
    ExpiredEvent,
    FencedEvent,
    GrantedEvent,
    PermissionDeniedError,
    RejectedEvent,
    ReleasedEvent,
    ResetEvent,
    StaleTokenError,
)
from palisade._events import MAX_LINE, SseParser, parse_event

from servers import PalisadeServer, auth_file, free_port, principal

E = TypeVar("E", bound=Event)
#: Bounds a hang (a failure), never a speed.
WITHIN = 30.0


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Collector:
    """Reads a stream on a thread of its own into a queue, so that the test can wait for
    each event with a bound."""

    def __init__(self, stream: EventStream, connect: bool = True) -> None:
        self.stream = stream
        self.events: "queue.Queue[Event]" = queue.Queue()
        if connect:
            stream.connect()  # subscribed before the test acts
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for event in self.stream:
                self.events.put(event)
        except Exception:  # noqa: BLE001 - closed under the reader
            pass

    def next(self, of: Type[E] = Event) -> E:  # type: ignore[assignment]
        event = self.events.get(timeout=WITHIN)
        assert isinstance(event, of), f"expected {of.__name__}, got {event!r}"
        return event

    def close(self) -> None:
        self.stream.close()
        self.thread.join(timeout=WITHIN)
        assert not self.thread.is_alive(), "closing the stream ends the iteration"


class Proxy:
    """A loopback TCP proxy whose connections the test can cut, and whose new connections
    it can hold back, to make a client reconnect when and where the test wants."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.open = threading.Event()
        self.open.set()
        self.sockets: List[socket.socket] = []
        self.accepted = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            self.open.wait()
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.sockets += [client, upstream]
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut_and_hold(self) -> None:
        """Closes every connection; new ones wait in the listen queue until release()."""
        self.open.clear()
        with self.lock:
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.sockets.clear()

    def release(self) -> None:
        self.open.set()

    def close(self) -> None:
        self.cut_and_hold()
        self.listener.close()
        self.open.set()


# ---- the stream against a real server ------------------------------------------------


def test_a_lock_s_events_come_typed_and_in_order_with_a_stale_write_rejected(
    client: Client, lock_name: str
) -> None:
    events = Collector(client.watch(lock_name))
    try:
        with client.lock(lock_name, holder="w1", ttl_ms=10_000) as first:
            first.fence()
            first.kv.put("invoice-17", b"paid")
            old = first.token
        granted = events.next(GrantedEvent)
        assert (granted.lock, granted.holder, granted.epoch, granted.ttl_ms) == (lock_name, "w1", first.epoch, 10_000)
        fenced = events.next(FencedEvent)
        assert (fenced.lock, fenced.high_water, fenced.seq) == (lock_name, first.epoch, 0)
        released = events.next(ReleasedEvent)
        assert (released.epoch, released.holder, released.cause) == (first.epoch, "w1", "release")
        assert granted.id < fenced.id < released.id
        assert granted.at_ms > 0 and granted.type == "granted"

        with client.lock(lock_name, holder="w2", ttl_ms=10_000) as second:
            second.fence()
            with pytest.raises(StaleTokenError):
                client.fenced_kv(lock_name, old).put("invoice-17", b"late")
        assert events.next(GrantedEvent).epoch == second.epoch
        assert events.next(FencedEvent).high_water == second.epoch
        rejected = events.next(RejectedEvent)
        assert (rejected.lock, rejected.code, rejected.epoch, rejected.high_water) == (
            lock_name, "stale_token", first.epoch, second.epoch,
        )
        assert events.next(ReleasedEvent).epoch == second.epoch
        # Nothing of other locks on this lock's stream.
        with client.lock(name("other"), ttl_ms=1000):
            pass
        with client.lock(lock_name, ttl_ms=200) as lease:
            pass
        assert events.next(GrantedEvent).epoch == lease.epoch
        assert events.stream.connections == 1
    finally:
        events.close()


def test_a_lease_that_runs_out_is_an_expired_event(client: Client, lock_name: str) -> None:
    events = Collector(client.watch(lock_name))
    try:
        grant = client.acquire_grant(lock_name, holder="w1", ttl_ms=100)
        assert events.next(GrantedEvent).epoch == grant.epoch
        expired = events.next(ExpiredEvent)
        assert (expired.epoch, expired.holder) == (grant.epoch, "w1")
    finally:
        events.close()


def test_a_dropped_connection_resumes_after_the_last_event(server: PalisadeServer, client: Client, lock_name: str) -> None:
    proxy = Proxy(server.port)
    try:
        with Client(proxy.url) as through:
            events = Collector(through.watch(lock_name))
            try:
                held = client.acquire_grant(lock_name, holder="w1", ttl_ms=10_000)
                first = events.next(GrantedEvent)
                assert events.stream.last_event_id == first.id
                # Cut the stream and hold its reconnection back while events happen: only
                # Last-Event-ID can bring them.
                proxy.cut_and_hold()
                client.release(held.lease_id)
                again = client.acquire_grant(lock_name, holder="w2", ttl_ms=10_000)
                proxy.release()
                released = events.next(ReleasedEvent)
                granted = events.next(GrantedEvent)
                assert (released.epoch, granted.epoch) == (first.epoch, again.epoch)
                assert first.id < released.id < granted.id
                assert events.stream.connections == 2, "one reconnection"
                assert proxy.accepted == 2
                assert events.events.empty(), "no reset, nothing twice"
                client.release(again.lease_id)
                assert events.next(ReleasedEvent).epoch == again.epoch
            finally:
                events.close()
    finally:
        proxy.close()


def test_a_new_stream_resumes_after_an_id_or_gets_a_reset(server: PalisadeServer, client: Client, lock_name: str) -> None:
    events = Collector(client.watch(lock_name))
    try:
        grant = client.acquire_grant(lock_name, ttl_ms=10_000)
        first = events.next(GrantedEvent)
    finally:
        events.close()
    client.release(grant.lease_id)
    resumed = Collector(client.watch(lock_name, last_event_id=first.id))
    try:
        assert resumed.next(ReleasedEvent).epoch == grant.epoch
    finally:
        resumed.close()
    # An id the server never issued in this run (another run, another node): a reset.
    other = PalisadeServer()
    try:
        with Client(other.url) as elsewhere:
            reset = Collector(elsewhere.watch(lock_name, last_event_id=first.id))
            try:
                assert reset.next(ResetEvent).reason == "unknown_last_event_id"
            finally:
                reset.close()
    finally:
        other.stop()


def test_a_prefix_stream_carries_only_its_locks(client: Client) -> None:
    prefix = name("pfx") + "-"
    events = Collector(client.events(prefix=prefix))
    try:
        with client.lock(name("elsewhere"), ttl_ms=1000):
            pass
        with client.lock(prefix + "a", ttl_ms=1000):
            pass
        assert events.next(GrantedEvent).lock == prefix + "a"
        assert events.next(ReleasedEvent).lock == prefix + "a"
    finally:
        events.close()


def test_the_stream_fails_over_to_the_next_endpoint(server: PalisadeServer, client: Client, lock_name: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with Client([dead, server.url]) as failing_over:
        events = Collector(failing_over.watch(lock_name))
        try:
            with client.lock(lock_name, ttl_ms=1000) as lease:
                pass
            assert events.next(GrantedEvent).epoch == lease.epoch
        finally:
            events.close()


def test_too_many_streams_is_retried_until_a_place_frees() -> None:
    server = PalisadeServer(["--max-event-subscribers", "1"])
    try:
        with Client(server.url) as client:
            holding = client.watch("a")
            holding.connect()
            # Too many streams is worth retrying: the stream waits for a place.
            waiting = Collector(client.watch("a"), connect=False)
            deadline = time.monotonic() + WITHIN
            while waiting.stream.last_error is None:
                assert time.monotonic() < deadline, "the second stream was refused"
                time.sleep(0.02)
            assert waiting.stream.last_error.code == "quota_exceeded"
            assert not waiting.stream.connected
            holding.close()
            # The place comes back: the waiting stream connects by itself.
            while not waiting.stream.connected:
                assert time.monotonic() < deadline, "the second stream got the freed place"
                time.sleep(0.02)
            with client.lock("a", ttl_ms=1000) as lease:
                pass
            assert waiting.next(GrantedEvent).epoch == lease.epoch
            waiting.close()
    finally:
        server.stop()


# ---- authentication and TLS ----------------------------------------------------------


def _pki(dir: Path) -> Tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1, made with openssl."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=dir, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr")
    (dir / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "ext.cnf", "-out", "server.pem")
    return dir / "ca.pem", dir / "server.pem", dir / "server.key"


def test_a_bearer_key_over_tls_sees_only_the_locks_it_may_read(tmp_path: Path) -> None:
    ca, cert, key = _pki(tmp_path)
    reader_key, writer_key = "pal_reader-" + "r" * 20, "pal_writer-" + "w" * 20
    auth = auth_file(
        tmp_path,
        principal("writer", writer_key, "*", ["acquire", "read", "write"]),
        principal("reader", reader_key, "orders*", ["read"]),
    )
    server = PalisadeServer(["--auth-file", str(auth), "--tls-cert", str(cert), "--tls-key", str(key)])
    try:
        assert server.url.startswith("https://")
        with Client(server.url, key=reader_key, ca=str(ca)) as reader, Client(
            server.url, key=writer_key, ca=str(ca)
        ) as writer:
            with pytest.raises(PermissionDeniedError):
                next(reader.watch("payroll"))  # refused for good: raised, not retried
            events = Collector(reader.events())
            try:
                with writer.lock("payroll", ttl_ms=1000):
                    pass
                with writer.lock("orders-1", ttl_ms=1000) as lease:
                    pass
                granted = events.next(GrantedEvent)
                assert (granted.lock, granted.epoch, granted.holder) == ("orders-1", lease.epoch, "writer")
            finally:
                events.close()
    finally:
        server.stop()


# ---- the election observer -----------------------------------------------------------


def until(check: Callable[[], bool], what: str) -> None:
    """Polls ``check`` every 20 ms until it holds, for at most WITHIN seconds."""
    deadline = time.monotonic() + WITHIN
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {WITHIN} s"
        time.sleep(0.02)


def status_reads(url: str) -> int:
    """How many lock status reads the server has answered (its own metrics): a read
    counts once its answer is decided."""
    prefix = 'palisade_request_duration_seconds_count{route="/v1/locks/{lock}"} '
    for line in httpx.get(url + "/metrics", timeout=WITHIN).text.splitlines():
        if line.startswith(prefix):
            return int(line[len(prefix):])
    return 0


def waiting(url: str, observer: Observer) -> "queue.Queue[Optional[LeaderInfo]]":
    """Runs ``observer.changed()`` on a thread, and returns once the server has answered
    the status read it makes before it waits: from then on only something that tells it
    to look again can make it answer. Its answer goes into the queue returned."""
    before = status_reads(url)
    answer: "queue.Queue[Optional[LeaderInfo]]" = queue.Queue()
    # No timeout of its own: the test's wait on the queue is the bound (a timeout would
    # end in one more read, which would find the change without being told to look).
    threading.Thread(target=lambda: answer.put(observer.changed()), daemon=True).start()
    deadline = time.monotonic() + WITHIN
    while status_reads(url) <= before:
        assert time.monotonic() < deadline, "the observer read the status"
        time.sleep(0.02)
    return answer


def test_the_observer_learns_of_changes_from_the_stream(server: PalisadeServer, client: Client, lock_name: str) -> None:
    # An hour between polls: only the stream can make a waiting observer look again.
    with Election(client, lock_name, ttl_ms=5000, poll_interval=3600).observe() as observer:
        assert observer.changed(timeout=WITHIN) is None
        until(lambda: observer.streaming, "the observer's stream opened")
        election = Election(client, lock_name, ttl_ms=5000)
        answer = waiting(server.url, observer)
        leader = election.campaign(b"10.0.0.1:7700", candidate="node-a")
        seen = answer.get(timeout=WITHIN)
        assert seen is not None and (seen.holder, seen.epoch, seen.value) == ("node-a", leader.epoch, b"10.0.0.1:7700")
        answer = waiting(server.url, observer)
        leader.resign()
        assert answer.get(timeout=WITHIN) is None
        assert observer.streaming
    assert not observer.streaming


def test_the_observer_polls_when_the_stream_is_refused() -> None:
    server = PalisadeServer(["--max-event-subscribers", "0"])
    try:
        with Client(server.url) as client:
            election = Election(client, "primary", ttl_ms=5000, poll_interval=0.05)
            with election.observe() as observer:
                assert observer.changed(timeout=WITHIN) is None
                leader = election.campaign(b"a", candidate="node-a")
                seen = observer.changed(timeout=WITHIN)
                assert seen is not None and seen.epoch == leader.epoch
                leader.proclaim(b"a2")
                seen = observer.changed(timeout=WITHIN)
                assert seen is not None and seen.value == b"a2"
                assert not observer.streaming
                leader.resign()
                assert observer.changed(timeout=WITHIN) is None
    finally:
        server.stop()


# ---- asyncio -------------------------------------------------------------------------


def test_async_watch_and_observer(server: PalisadeServer, lock_name: str) -> None:
    async def main() -> None:
        async with palisade.aio.Client(server.url) as client:
            stream = client.watch(lock_name)
            await stream.connect()
            async with client.lock(lock_name, holder="w1", ttl_ms=5000) as lease:
                await lease.fence()

            async def first_three() -> List[Event]:
                got: List[Event] = []
                async for event in stream:
                    got.append(event)
                    if len(got) == 3:
                        return got
                return got

            got = await asyncio.wait_for(first_three(), WITHIN)
            assert [type(e) for e in got] == [GrantedEvent, FencedEvent, ReleasedEvent]
            assert stream.last_event_id == got[-1].id
            await stream.aclose()

            election = palisade.aio.Election(client, lock_name, ttl_ms=5000, poll_interval=3600)
            async with election.observe() as observer:
                assert await observer.changed(timeout=WITHIN) is None
                deadline = time.monotonic() + WITHIN
                while not observer.streaming:
                    assert time.monotonic() < deadline, "the observer's stream opened"
                    await asyncio.sleep(0.02)
                before = status_reads(server.url)
                answer = asyncio.ensure_future(observer.changed())  # bounded by wait_for below
                while status_reads(server.url) <= before:  # its read answered: it waits
                    assert time.monotonic() < deadline, "the observer read the status"
                    await asyncio.sleep(0.02)
                leader = await election.campaign(b"v", candidate="node-a")
                seen = await asyncio.wait_for(answer, WITHIN)
                assert seen is not None and (seen.holder, seen.epoch) == ("node-a", leader.epoch)
                assert observer.streaming
                await leader.resign()
                assert await observer.changed(timeout=WITHIN) is None

    asyncio.run(main())


# ---- the parser ----------------------------------------------------------------------


def test_the_parser_splits_anywhere_and_skips_comments_and_unknown_types() -> None:
    text = (
        b": keep-alive\n\nevent: granted\nid: 7\n"
        b'data: {"id":7,"at_ms":1,"type":"granted","lock":"a","epoch":1,"holder":"h","ttl_ms":50}\n\n'
        b'event: future\r\nid: 8\r\ndata: {"id":8,"at_ms":1,"type":"future"}\r\n\r\n'
        b'id: 9\ndata: {"id":9,"at_ms":2,"type":"rejected","lock":"a","code":"missing_token","epoch":null,"high_water":null}\n\n'
    )
    for size in (1, 5, len(text)):
        parser = SseParser()
        data: List[str] = []
        for i in range(0, len(text), size):
            data += parser.feed(text[i : i + size])
        events = [parse_event(d) for d in data]
        assert events[0] == GrantedEvent(id=7, at_ms=1, lock="a", epoch=1, holder="h", ttl_ms=50)
        assert events[1] is None  # a type this version does not know
        assert events[2] == RejectedEvent(id=9, at_ms=2, lock="a", code="missing_token", epoch=None, high_water=None)
    # Wrong field types are not events.
    assert parse_event('{"id":1,"at_ms":1,"type":"reset","reason":5}') is None
    assert parse_event('{"id":-1,"at_ms":1,"type":"reset","reason":"x"}') is None
    assert parse_event('{"id":true,"at_ms":1,"type":"reset","reason":"x"}') is None
    assert parse_event("[1]") is None and parse_event("not json") is None


def test_a_line_longer_than_the_bound_is_dropped_not_accumulated() -> None:
    parser = SseParser(max_line=1024)
    assert parser.feed(b'data: {"x":"') == []
    for _ in range(100):
        assert parser.feed(b"a" * 1000) == []
        assert len(parser._buf) <= 2048
    # The long line's tail and end go with it; the next event is whole.
    assert parser.feed(b'aa"}\n\nid: 3\ndata: {"ok":1}\n\n') == ['{"ok":1}']
    # An event whose data lines add up past the bound is dropped too.
    many = b"".join(b"data: " + b"b" * 100 + b"\n" for _ in range(20)) + b"\n"
    assert parser.feed(many + b"data: small\n\n") == ["small"]
    assert MAX_LINE == 1 << 20
