"""Failover between endpoints (client side): a call that cannot reach a node, or gets
503, moves to the next; a write is resent only with the idempotency key it was first
sent with; an acquire whose answer was lost is not resent. Against scripted stub
servers (to see exactly what each node received) and against real servers, one of them
killed under the client."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

import palisade.aio
from palisade import Client, StaleTokenError, StorageFailedError, TransportError

from servers import EtcdMember, PalisadeServer, free_port

WRITE_OK = (200, {"revision": 7, "epoch": 1})
UNAVAILABLE = (503, {"error": {"code": "storage_failed", "message": "etcd is unavailable"}})
DROP = (0, {})  # read the request, then close the connection without an answer


class Stub:
    """A scripted HTTP node on a free loopback port: answers each request with the next
    scripted reply and records what it received."""

    def __init__(self, *replies: Tuple[int, dict]) -> None:
        self.replies = list(replies)
        self.seen: List[Dict[str, object]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                stub.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body})
                status, answer = stub.replies.pop(0) if stub.replies else (500, {})
                if status == 0:
                    self.close_connection = True
                    return
                raw = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_PUT = do_POST = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stubs() -> Iterator[List[Stub]]:
    made: List[Stub] = []
    yield made
    for s in made:
        s.close()


def stub(stubs: List[Stub], *replies: Tuple[int, dict]) -> Stub:
    s = Stub(*replies)
    stubs.append(s)
    return s


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused


def test_a_503_write_is_resent_to_the_next_node_with_the_same_idempotency_key(stubs: List[Stub]) -> None:
    first, second = stub(stubs, UNAVAILABLE), stub(stubs, WRITE_OK)
    with Client([first.url, second.url]) as client:
        result = client.fenced_kv("orders", "pal1.t.s").put("k", b"v")
    assert (result.revision, result.epoch) == (7, 1)
    a, b = first.seen[0]["headers"], second.seen[0]["headers"]
    assert a["Idempotency-Key"] == b["Idempotency-Key"] and a["Idempotency-Key"].startswith("py-")  # type: ignore[index]
    assert a["Fencing-Token"] == b["Fencing-Token"] == "pal1.t.s"  # type: ignore[index]
    assert first.seen[0]["body"] == second.seen[0]["body"] == b"v"
    # The node that answered is tried first from now on.
    assert client._endpoints.order()[0] == second.url


def test_a_lost_answer_to_a_write_is_resent_only_with_its_key(stubs: List[Stub]) -> None:
    first, second = stub(stubs, DROP), stub(stubs, WRITE_OK)
    with Client([first.url, second.url]) as client:
        client.fenced_kv("orders", "t").delete("k")
    keys = [s.seen[0]["headers"]["Idempotency-Key"] for s in (first, second)]  # type: ignore[index]
    assert keys[0] == keys[1]
    assert [s.seen[0]["method"] for s in (first, second)] == ["DELETE", "DELETE"]


def test_a_single_node_client_neither_adds_keys_nor_retries_writes(stubs: List[Stub]) -> None:
    only = stub(stubs, UNAVAILABLE, DROP)
    with Client(only.url) as client:
        with pytest.raises(StorageFailedError):
            client.fenced_kv("orders", "t").put("k", b"v")
        with pytest.raises(TransportError) as lost:
            client.fenced_kv("orders", "t").put("k", b"v")
    assert lost.value.outcome_unknown is True
    assert len(only.seen) == 2 and all("Idempotency-Key" not in s["headers"] for s in only.seen)  # type: ignore[operator]


def test_an_acquire_whose_answer_was_lost_is_not_resent(stubs: List[Stub]) -> None:
    first, second = stub(stubs, DROP), stub(stubs)
    with Client([first.url, second.url]) as client:
        with pytest.raises(TransportError) as lost:
            client.acquire_grant("orders", holder="h", ttl_ms=1000)
    assert lost.value.outcome_unknown is True
    assert (len(first.seen), second.seen) == (1, [])


def test_an_acquire_is_resent_after_a_503_or_an_unreachable_node(stubs: List[Stub], server: PalisadeServer) -> None:
    unavailable = stub(stubs, UNAVAILABLE)
    with Client([dead_url(), unavailable.url, server.url]) as client:
        grant = client.acquire_grant("failover-acquire", holder="h", ttl_ms=5000)
        assert grant.epoch == 1
        client.release(grant.lease_id)
    assert [s["method"] for s in unavailable.seen] == ["POST"]


def test_reads_fail_over_and_every_node_failing_is_one_error(stubs: List[Stub]) -> None:
    dead1, dead2 = dead_url(), dead_url()
    with Client([dead1, dead2]) as client:
        with pytest.raises(TransportError) as down:
            client.lock_status("orders")
    assert down.value.outcome_unknown is False
    assert dead1 in str(down.value) and dead2 in str(down.value)


def test_a_node_killed_under_the_client(tmp_path: Path) -> None:
    """Two real nodes that trust one signing key. The client works through the first;
    the first is killed (SIGKILL); the next write and read go to the second, and a write
    resent there carries the key it was first sent with."""
    key_file = tmp_path / "signing.key"
    key_file.write_text("11" * 32)
    key_file.chmod(0o600)
    a = PalisadeServer(["--signing-key-file", str(key_file)])
    b = PalisadeServer(["--signing-key-file", str(key_file)])
    try:
        with Client([a.url, b.url]) as client:
            grant = client.acquire_grant("killed", holder="h", ttl_ms=30_000)
            kv = client.fenced_kv("killed", grant.token)
            kv.put("k", b"on a")
            assert client._endpoints.order()[0] == a.url
            a.kill()
            written = kv.put("k", b"on b")
            assert written.epoch == grant.epoch
            assert client._endpoints.order()[0] == b.url
            assert client.kv("killed").get("k") == b"on b"
            # The same key on b replays instead of applying twice.
            first = kv.put("k2", b"once", idempotency_key="op-after-kill")
            again = kv.put("k2", b"once", idempotency_key="op-after-kill")
            assert (again.revision, again.replayed) == (first.revision, True)
    finally:
        a.stop()
        b.stop()


def test_three_nodes_over_etcd_one_killed_under_the_client(tmp_path: Path) -> None:
    """The deployment failover is for: three stateless nodes sharing leases, epochs and
    marks in etcd. A node is SIGKILLed under a client holding a lease; its writes and
    renewals carry on through the next node, and a write resent to another node with the
    same idempotency key is answered from the first outcome, not applied twice."""
    key_file = tmp_path / "signing.key"
    key_file.write_text("22" * 32)
    key_file.chmod(0o600)
    etcd = EtcdMember()
    prefix = f"/py-{uuid.uuid4().hex[:8]}/"
    flags = ["--backend", "etcd", "--etcd-endpoints", etcd.url, "--etcd-prefix", prefix,
             "--signing-key-file", str(key_file), "--etcd-timeout-ms", "2000"]
    nodes: List[PalisadeServer] = []
    try:
        nodes = [PalisadeServer(flags) for _ in range(3)]
        lock = "etcd-failover"
        with Client([n.url for n in nodes]) as client, Client(nodes[2].url) as third:
            with client.lock(lock, holder="h", ttl_ms=2000) as lease:
                assert lease.fence() == lease.epoch
                lease.kv.put("k", b"before")
                assert client._endpoints.order()[0] == nodes[0].url
                nodes[0].kill()
                after = lease.kv.put("k", b"after")  # node 0 refuses the connection
                assert after.epoch == lease.epoch
                assert client._endpoints.order()[0] == nodes[1].url
                # Renewals go on through node 1: the lease outlives its TTL.
                assert lease.wait_lost(timeout=lease.ttl_ms / 1000 * 1.5) is False
                status = third.lock_status(lock)
                assert (status.lease_id, status.epoch) == (lease.lease_id, lease.epoch)
                assert third.kv(lock).get("k") == b"after"
                # A resend to another node with the same key is not applied twice.
                first = lease.kv.put("once", b"x", idempotency_key="op-across-nodes")
                again = third.fenced_kv(lock, lease.token).put("once", b"x", idempotency_key="op-across-nodes")
                assert (again.revision, again.replayed) == (first.revision, True)
                old_token = lease.token
            # Released through a live node; the next holder fences the old one off everywhere.
            with third.lock(lock, holder="next", ttl_ms=2000) as newer:
                newer.fence()
                with pytest.raises(StaleTokenError):
                    client.fenced_kv(lock, old_token).put("k", b"late")
            assert third.kv(lock).get("k") == b"after"
    finally:
        for n in nodes:
            n.stop()
        etcd.stop()


def test_asyncio_client_fails_over_by_the_same_rule(stubs: List[Stub]) -> None:
    first, second = stub(stubs, UNAVAILABLE), stub(stubs, WRITE_OK)
    dropped, spare = stub(stubs, DROP), stub(stubs)

    async def main() -> None:
        async with palisade.aio.Client([dead_url(), first.url, second.url]) as client:
            result = await client.fenced_kv("orders", "t").put("k", b"v")
            assert result.revision == 7
        async with palisade.aio.Client([dropped.url, spare.url]) as client:
            with pytest.raises(palisade.aio.TransportError):
                await client.acquire_grant("orders", holder="h", ttl_ms=1000)

    asyncio.run(main())
    assert first.seen[0]["headers"]["Idempotency-Key"] == second.seen[0]["headers"]["Idempotency-Key"]  # type: ignore[index]
    assert spare.seen == []
