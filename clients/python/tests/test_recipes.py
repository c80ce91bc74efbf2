"""The recipes through the Python clients, against a real server: lock values and
proclaim, a lock-delay per lock, sessions (one keepalive for many locks, expiring and
closing together), and leader election (campaign, observe, proclaim, resign, fencing by
the new leader). The same for ``palisade.aio``."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Callable, List, Optional, TypeVar

import pytest

import palisade.aio
from palisade import (
    BadRequestError,
    Client,
    Election,
    LeaderInfo,
    LeaseLostError,
    LockHeldError,
    PayloadTooLargeError,
    QuotaExceededError,
    SessionExpiredError,
    StaleTokenError,
)

from servers import PalisadeServer

T = TypeVar("T")


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def until(check: Callable[[], Optional[T]], within: float, what: str) -> T:
    """Polls ``check`` every 20 ms until it returns something (at most ``within`` s)."""
    deadline = time.monotonic() + within
    while True:
        found = check()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        time.sleep(0.02)


def test_a_value_is_shown_and_replaced_by_its_holder(client: Client) -> None:
    lock = name("svc")
    with client.lock(lock, holder="a", ttl_ms=10_000, value=b"10.0.0.1:7700") as lease:
        assert lease.grant.value == b"10.0.0.1:7700"
        status = client.lock_status(lock)
        assert (status.holder, status.value, status.lease_epoch) == ("a", b"10.0.0.1:7700", lease.epoch)
        done = lease.proclaim("10.0.0.1:7700 ready")
        assert (done.epoch, done.value) == (lease.epoch, b"10.0.0.1:7700 ready")
        assert client.lock_status(lock).value == b"10.0.0.1:7700 ready"
        lease.proclaim(None)
        assert client.lock_status(lock).value is None
        # Too large fails here, before anything is sent; the server refuses it too.
        with pytest.raises(BadRequestError):
            lease.proclaim(b"x" * 4097)
    with pytest.raises(LeaseLostError):
        client.proclaim(lease.lease_id, b"late")
    assert client.lock_status(lock).value is None


def test_a_value_too_large_for_the_server_is_payload_too_large(server: PalisadeServer) -> None:
    import base64

    import httpx

    lock = name("big")
    too_large = base64.b64encode(b"x" * 4097).decode()
    answer = httpx.post(
        f"{server.url}/v1/locks/{lock}/acquire",
        json={"holder": "a", "ttl_ms": 1000, "value": too_large},
    )
    assert answer.status_code == 413, answer.text
    with Client(server.url) as c:
        assert c.lock_status(lock).holder is None


def test_each_lock_brings_its_own_lock_delay(client: Client) -> None:
    lock = name("delay")
    with pytest.raises(QuotaExceededError) as refused:
        client.acquire_grant(lock, holder="a", ttl_ms=200, lock_delay_ms=60_001)
    assert (refused.value.resource, refused.value.limit) == ("lock_delay_ms", 60_000)
    grant = client.acquire_grant(lock, holder="a", ttl_ms=200, lock_delay_ms=2000)
    assert grant.lock_delay_ms == 2000
    assert client.lock_status(lock).lock_delay_ms == 2000

    # Left to expire: the lock-delay keeps it free of holders, and refused.
    def in_delay() -> Optional[LockHeldError]:
        try:
            client.acquire_grant(lock, holder="b", ttl_ms=1000)
        except LockHeldError as e:
            return e if e.holder is None else None
        pytest.fail("granted inside the lock-delay")

    refusal = until(in_delay, 10, "the lease expires")
    assert refusal.retry_after_ms > 0
    again = until(lambda: _try(lambda: client.acquire_grant(lock, holder="b", ttl_ms=1000)), 10, "the delay ends")
    assert again.epoch == grant.epoch + 1


def _try(call: Callable[[], T]) -> Optional[T]:
    try:
        return call()
    except LockHeldError:
        return None


def test_a_session_renews_its_locks_at_once_and_closing_releases_them(client: Client) -> None:
    a, b = name("a"), name("b")
    with client.session(ttl_ms=600, holder="s") as session:
        la = session.acquire(a, value=b"one")
        lb = session.acquire(b, lock_delay_ms=30_000)
        assert la.grant.session == session.session_id
        # Kept alive for several TTLs by the session's one keepalive.
        time.sleep(1.5)
        assert not session.lost
        for lock in (a, b):
            assert client.lock_status(lock).holder == "s"
        assert {l.lock for l in session.info().leases} == {a, b}
        la.kv.put("k", b"v")
    # Closed: both released at once (no lock-delay for a release).
    for lock in (a, b):
        client.acquire_grant(lock, holder="n", ttl_ms=1000)
    assert lb.lost
    with pytest.raises(LeaseLostError):
        lb.kv.put("k", b"late")


def test_a_session_that_stops_renewing_takes_its_locks_with_it(client: Client) -> None:
    a, b = name("a"), name("b")
    info = client.create_session(ttl_ms=500, holder="s")
    for lock in (a, b):
        client.acquire_grant(lock, holder="s", session=info.session_id)
    with pytest.raises(BadRequestError):
        client.acquire_grant(a, holder="s", ttl_ms=0, session="")
    until(lambda: True if client.lock_status(a).holder is None else None, 10, "the session expires")
    assert client.lock_status(b).holder is None
    with pytest.raises(SessionExpiredError):
        client.keepalive_session(info.session_id)
    with pytest.raises(SessionExpiredError):
        client.acquire_grant(a, holder="s", session=info.session_id)


def test_an_election(client: Client, server: PalisadeServer) -> None:
    election_name = name("primary")
    election = Election(client, election_name, ttl_ms=2000, poll_interval=0.05)
    observer = election.observe()
    assert observer.changed() is None
    first = election.campaign(b"10.0.0.1", candidate="a")
    assert observer.changed() == LeaderInfo("a", first.epoch, b"10.0.0.1")
    assert first.fence() == first.epoch

    # The second waits in line, on another client.
    results: List[object] = []
    other = Client(server.url)
    waiting = threading.Thread(
        target=lambda: results.append(Election(other, election_name, ttl_ms=2000).campaign(b"10.0.0.2", candidate="b", timeout=30)),
        daemon=True,
    )
    waiting.start()
    until(lambda: True if client.lock_status(election_name).waiters == 1 else None, 10, "b waits")
    first.proclaim(b"10.0.0.1 draining")
    seen = observer.changed(timeout=10)
    assert seen is not None and (seen.epoch, seen.value) == (first.epoch, b"10.0.0.1 draining")
    old_token = first.token
    first.resign()
    waiting.join(30)
    second = results[0]
    assert isinstance(second, palisade.Leader)
    assert second.epoch == first.epoch + 1
    seen = observer.changed(timeout=10)
    assert seen is not None and (seen.holder, seen.epoch) == ("b", second.epoch)
    # The new leader fences before it acts; the old one's writes are refused after that.
    second.fence()
    with pytest.raises(StaleTokenError):
        client.fenced_kv(election_name, old_token).put("config", b"late")
    second.resign()
    assert observer.changed(timeout=10) is None
    with pytest.raises(LockHeldError):
        # Someone else holds it: a bounded campaign gives up.
        holder = client.acquire(election_name, holder="z", ttl_ms=10_000)
        try:
            election.campaign(b"x", candidate="c", timeout=0.3)
        finally:
            holder.release()
    other.close()


def test_the_asyncio_recipes(server: PalisadeServer) -> None:
    async def scenario() -> None:
        async with palisade.aio.Client(server.url) as client:
            lock = name("aio")
            async with client.lock(lock, holder="a", ttl_ms=5000, value=b"v1") as lease:
                await lease.proclaim(b"v2")
                assert (await client.lock_status(lock)).value == b"v2"
            async with await client.session(ttl_ms=600, holder="s") as session:
                x = await session.acquire(name("x"))
                await asyncio.sleep(1.2)
                assert not session.lost
                assert (await client.lock_status(x.lock)).holder == "s"
            assert (await client.lock_status(x.lock)).holder is None
            election = palisade.aio.Election(client, name("aio-primary"), ttl_ms=2000, poll_interval=0.05)
            observer = election.observe()
            assert await observer.changed() is None
            leader = await election.campaign(b"me", candidate="a")
            seen = await observer.changed(timeout=10)
            assert seen is not None and (seen.holder, seen.epoch, seen.value) == ("a", leader.epoch, b"me")
            await leader.fence()
            await leader.resign()
            assert await observer.changed(timeout=10) is None

    asyncio.run(scenario())
