"""The blocking client against a real ``palisade serve``: leases, renewal and loss, the
fenced store with every write option, typed errors, and bad input refused before sending."""

from __future__ import annotations

import gc
import json
import threading
import time
from pathlib import Path
from typing import Callable

import httpx
import pytest

from palisade import (
    BadRequestError,
    PermissionDeniedError,
    QuotaExceededError,
    UnauthenticatedError,
    UnavailableError,
    Client,
    IdempotencyConflictError,
    InvalidTokenError,
    LeaseLostError,
    LockHeldError,
    MissingTokenError,
    NotFoundError,
    PayloadTooLargeError,
    RevisionMismatchError,
    StaleSequenceError,
    StaleTokenError,
    WrongLockError,
)
from palisade.tokens import KeyRing, Verifier

from servers import PalisadeServer, auth_file, free_port, principal


def refused_by_a_fresh_client(client: Client, call: Callable[[Client], object], error: type) -> None:
    """Runs ``call`` on a new client and expects ``error``.

    The server answers a write it refuses on its headers (missing or invalid token, too
    large) before reading the body, and then may close the keep-alive connection without
    saying so; the next request on that connection then fails with ``TransportError``.
    Reads and other calls that are safe to resend recover by themselves (see
    ``Attempts``); an acquire or a write without an idempotency key cannot, so these
    deliberate refusals use a connection of their own.
    """
    with Client(client.urls) as fresh:
        with pytest.raises(error):
            call(fresh)


def test_a_taken_lock_is_lock_held_with_holder_and_retry_hint(client: Client, lock_name: str) -> None:
    with client.lock(lock_name, holder="first", ttl_ms=5000):
        with pytest.raises(LockHeldError) as held:
            client.acquire(lock_name, holder="second", ttl_ms=5000)
        assert held.value.holder == "first"
        assert held.value.retry_after_ms > 0
        assert held.value.code == "lock_held" and held.value.status == 409


def test_a_waiting_acquire_gets_the_lock_when_it_is_released(client: Client, lock_name: str) -> None:
    first = client.acquire(lock_name, holder="first", ttl_ms=10_000)
    got = []

    def waiter() -> None:
        with client.lock(lock_name, holder="second", ttl_ms=5000, wait_ms=20_000) as lease:
            got.append(lease.epoch)

    t = threading.Thread(target=waiter)
    t.start()
    # Poll until the waiter is queued, then hand the lock over.
    deadline = time.monotonic() + 10
    while client.lock_status(lock_name).waiters == 0:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.01)
    first.release()
    t.join(timeout=20)
    assert got == [2]


def test_renewals_keep_a_short_lease_alive_past_its_ttl(client: Client, lock_name: str) -> None:
    with client.lock(lock_name, holder="renewed", ttl_ms=1000) as lease:
        # Bounded wait: two and a half TTLs without losing the lease means renewals
        # happened (the schedule itself is tested with made-up clocks in test_protocol).
        assert lease.wait_lost(timeout=2.5) is False
        assert client.lock_status(lock_name).lease_id == lease.lease_id
        assert lease.kv.put("k", b"still mine").epoch == lease.epoch


def test_a_lease_released_behind_its_back_is_lost_and_refuses_the_next_call(
    client: Client, lock_name: str
) -> None:
    lease = client.acquire(lock_name, holder="h", ttl_ms=300)
    client.release(lease.lease_id)  # the server forgets it; the next renewal hears so
    assert lease.wait_lost(timeout=5) is True
    assert "expired or was released" in (lease.lost_reason or "")
    assert lease.safe_for == 0.0  # the lease is over at the server: no time left to act
    with pytest.raises(LeaseLostError):
        lease.kv.put("k", b"v")
    with pytest.raises(LeaseLostError):
        lease.fence()
    # Leaving a block whose lease is gone is not an error.
    with lease:
        pass


def test_a_lease_without_renewals_is_lost_at_its_deadline(client: Client, lock_name: str) -> None:
    grant = client.acquire_grant(lock_name, holder="h", ttl_ms=200)
    lease_client = Client(f"http://127.0.0.1:{free_port()}")  # nothing listens: renewals fail
    from palisade import Lease

    sent = time.monotonic()
    lease = Lease(lease_client, grant, sent)
    assert lease.renew_deadline == pytest.approx(sent + 0.2 * 2 / 3)
    assert lease.safe_until == pytest.approx(sent + 0.2 * 0.99)
    assert lease.wait_lost(timeout=5) is True
    # Given up at the renewal deadline, before the safe deadline.
    assert time.monotonic() < lease.safe_until + 0.05
    assert "renewal deadline" in (lease.lost_reason or "")
    with pytest.raises(LeaseLostError):
        lease.kv.put("k", b"v")
    lease_client.close()


def test_dropping_a_lease_stops_its_renewals_and_the_lease_runs_out(client: Client, lock_name: str) -> None:
    lease = client.acquire(lock_name, holder="dropped", ttl_ms=300)
    renewer = lease._thread
    del lease
    gc.collect()
    renewer.join(timeout=5)
    assert not renewer.is_alive()
    deadline = time.monotonic() + 10
    while client.lock_status(lock_name).holder is not None:
        assert time.monotonic() < deadline, "the dropped lease was still renewed"
        time.sleep(0.05)


def test_fencing_py_scenario_through_the_store(client: Client, lock_name: str) -> None:
    """The source article's scenario on Palisade's own store, through the client."""
    old = client.acquire(lock_name, holder="old-leader", ttl_ms=30_000)
    client.release(old.lease_id)  # the old leader does not know: it is "paused"
    new = client.acquire(lock_name, holder="new-leader", ttl_ms=30_000)
    assert (old.epoch, new.epoch) == (1, 2)
    key = "fencing-py"
    # 2. The old leader writes first and is admitted: the store has not seen epoch 2 (S10).
    assert old.kv.put(key, b"old-leader-1").epoch == 1
    # 3. The new leader writes with epoch 2.
    new.kv.put(key, b"new-leader")
    # 4. The old leader again: refused with the mark and its epoch; nothing changes.
    with pytest.raises(StaleTokenError) as stale:
        old.kv.put(key, b"old-leader-late")
    assert (stale.value.high_water, stale.value.epoch) == (2, 1)
    assert client.kv(lock_name).get(key) == b"new-leader"
    # ...and the old lease now knows it is lost: the next call is refused locally.
    with pytest.raises(LeaseLostError):
        old.kv.put(key, b"again")
    # 5. Equal epoch again: admitted (S8).
    new.kv.put(key, b"new-leader-again")
    # 6. Missing, "2" and the boolean true are refused (S12), nothing changes. Each from
    # a client of its own: see refused_by_a_fresh_client.
    refused_by_a_fresh_client(client, lambda c: c.fenced_kv(lock_name, "").put(key, b"missing"), MissingTokenError)
    refused_by_a_fresh_client(client, lambda c: c.fenced_kv(lock_name, "2").put(key, b"2"), InvalidTokenError)
    with pytest.raises(InvalidTokenError):
        client.fenced_kv(lock_name, True).put(key, b"true")  # type: ignore[arg-type]
    assert client.kv(lock_name).get(key) == b"new-leader-again"
    # 7. A third acquisition: epoch 3 admitted, epoch 2 refused.
    new.release()
    with client.lock(lock_name, holder="newest", ttl_ms=30_000) as newest:
        newest.kv.put(key, b"newest")
        with pytest.raises(StaleTokenError) as stale:
            client.fenced_kv(lock_name, new.token).put(key, b"too-late")
        assert (stale.value.high_water, stale.value.epoch) == (3, 2)
    # 8. Final state.
    assert client.high_water(lock_name).high_water == 3
    assert client.kv(lock_name).get(key) == b"newest"


def test_the_barrier_fences_off_an_older_holder_before_any_data(client: Client, lock_name: str) -> None:
    old = client.acquire(lock_name, holder="old", ttl_ms=30_000)
    client.release(old.lease_id)
    with client.lock(lock_name, holder="new", ttl_ms=30_000) as new:
        assert new.fence() == 2
        with pytest.raises(StaleTokenError):
            old.kv.put("k", b"late")
        assert client.kv(lock_name).get("k") is None


def test_conditional_writes_and_entries(client: Client, lock_name: str) -> None:
    with client.lock(lock_name, holder="h", ttl_ms=10_000) as lease:
        first = lease.kv.put("doc", "v1", if_absent=True)  # str values are sent as UTF-8
        with pytest.raises(RevisionMismatchError) as exists:
            lease.kv.put("doc", b"again", if_absent=True)
        assert exists.value.current_revision == first.revision
        entry = lease.kv.entry("doc")
        assert entry is not None and (entry.value, entry.revision, entry.epoch) == (b"v1", first.revision, 1)
        second = lease.kv.put("doc", b"v2", if_match=first.revision)
        with pytest.raises(RevisionMismatchError) as moved:
            lease.kv.put("doc", b"v3", if_match=first.revision)
        assert moved.value.current_revision == second.revision
        with pytest.raises(RevisionMismatchError) as absent:
            lease.kv.put("nothing", b"x", if_match=1)
        assert absent.value.current_revision is None
        lease.kv.delete("doc", if_match=second.revision)
        assert lease.kv.get("doc") is None
        with pytest.raises(NotFoundError):
            lease.kv.delete("doc")


def test_idempotency_keys_replay_the_first_outcome(client: Client, lock_name: str) -> None:
    with client.lock(lock_name, holder="h", ttl_ms=10_000) as lease:
        first = lease.kv.put("k", b"once", idempotency_key="op-1")
        again = lease.kv.put("k", b"once", idempotency_key="op-1")
        assert (again.revision, again.replayed, first.replayed) == (first.revision, True, False)
        with pytest.raises(IdempotencyConflictError):
            lease.kv.put("k", b"different", idempotency_key="op-1")
        # A single-endpoint client adds no key of its own: plain writes apply each time.
        assert lease.kv.put("k", b"once").revision > first.revision


def test_listing_and_reading_without_a_token(client: Client, lock_name: str) -> None:
    with client.lock(lock_name, holder="h", ttl_ms=10_000) as lease:
        for key in ["a/1", "a/2 x", "b/ü"]:
            lease.kv.put(key, key.encode())
    reader = client.kv(lock_name)
    assert reader.list() == ["a/1", "a/2 x", "b/ü"]
    assert reader.list("a/") == ["a/1", "a/2 x"]
    assert reader.get("b/ü") == "b/ü".encode()


def test_sequence_namespace_orders_writes_inside_one_epoch(client: Client) -> None:
    name = "seq-client"
    with client.lock(name, holder="h", ttl_ms=10_000) as lease:
        assert lease.fence(seq=lease.next_seq()) == 1
        lease.kv.put("k", b"a", seq=lease.next_seq())
        late = 1
        with pytest.raises(StaleSequenceError) as replay:
            lease.kv.put("k", b"replayed", seq=late)
        assert (replay.value.high_water, replay.value.high_water_seq, replay.value.seq) == (1, 2, 1)
        with pytest.raises(BadRequestError):
            lease.kv.put("k", b"no seq")
        assert not lease.lost  # a stale sequence is not a newer epoch
    status = client.high_water(name)
    assert (status.policy, status.high_water, status.seq) == ("sequence", 1, 2)


def test_token_check_and_offline_verification(client: Client, lock_name: str) -> None:
    with client.lock(lock_name, holder="checker", ttl_ms=10_000) as lease:
        check = lease.check()
        assert (check.genuine, check.lock, check.epoch, check.holder) == (True, lock_name, 1, "checker")
        assert (check.current, check.lease_alive) == (True, True)
        verifier = Verifier(KeyRing.from_public_keys(client.keys()))
        claims = verifier.verify(lease.token)
        assert (claims.lock, claims.epoch, claims.holder, claims.key_id) == (lock_name, 1, "checker", check.key_id)
    after = client.check_token(lease.token)
    assert (after.current, after.lease_alive) == (True, False)
    forged = client.check_token(lease.token[:-4] + ("AAAA" if not lease.token.endswith("AAAA") else "BBBB"))
    assert forged.genuine is False and forged.reason


def test_other_locks_token_is_wrong_lock(client: Client, lock_name: str) -> None:
    with client.lock(lock_name + "-other", holder="h", ttl_ms=10_000) as other:
        with Client(client.urls) as fresh:
            with pytest.raises(WrongLockError) as wrong:
                fresh.fenced_kv(lock_name, other.token).put("k", b"v")
        assert wrong.value.token_lock == lock_name + "-other"


def test_server_limits_come_back_typed(client: Client, lock_name: str) -> None:
    with client.lock(lock_name, holder="h", ttl_ms=10_000) as lease:
        with Client(client.urls) as fresh:
            with pytest.raises(PayloadTooLargeError) as big:
                fresh.fenced_kv(lock_name, lease.token).put("k", b"x" * 4097)
        assert big.value.limit == 4096
        with pytest.raises(BadRequestError):
            client.acquire(lock_name + "-b", holder="bad\nholder", ttl_ms=1000)
        assert lease.kv.get("k") is None


def test_bad_input_is_refused_before_sending(server: PalisadeServer) -> None:
    sent = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    with Client("http://127.0.0.1:1", transport=httpx.MockTransport(record)) as c:
        kv = c.fenced_kv("orders", "pal1.a.b")
        for bad in [
            lambda: kv.put("a/../b", b"v"),
            lambda: kv.put("", b"v"),
            lambda: kv.put("k", 17),  # type: ignore[arg-type]
            lambda: kv.put("k", b"v", if_match=1, if_absent=True),
            lambda: kv.put("k", b"v", seq=-1),
            lambda: kv.put("k", b"v", idempotency_key="no\nnewlines"),
            lambda: kv.put("k", b"v", idempotency_key="x" * 129),
            lambda: c.acquire("..", holder="h"),
            lambda: c.acquire("orders", holder="h", ttl_ms=10),
            lambda: c.acquire("orders", holder="h", wait_ms=300_001),
            lambda: c.keepalive(""),
        ]:
            with pytest.raises(BadRequestError):
                bad()
        with pytest.raises(InvalidTokenError):
            c.fenced_kv("orders", "tok\u00e9n").put("k", b"v")
    assert sent == []
    with pytest.raises(BadRequestError):
        Client("127.0.0.1:7700")
    with pytest.raises(BadRequestError):
        Client(["http://a:1", "http://a:1/"])


def test_keys_principals_and_grants_against_an_auth_server(tmp_path: Path) -> None:
    """A server with ``--auth-file``: the bearer key names the principal, the principal
    becomes the holder (a label after it), grants and quotas refuse with typed errors."""
    writer_key, reader_key = "pal_writer-" + "w" * 20, "pal_reader-" + "r" * 20
    auth = auth_file(
        tmp_path,
        principal("billing", writer_key, "orders*", ["acquire", "read", "write", "check"], max_ttl_ms=60000),
        principal("auditor", reader_key, "orders*", ["read"]),
    )
    server = PalisadeServer(["--auth-file", str(auth)])
    try:
        with Client(server.url) as anonymous:
            assert anonymous.keys()  # public keys are public
            with pytest.raises(UnauthenticatedError) as no_key:
                anonymous.locks()
            assert no_key.value.status == 401
        with Client(server.url, key=writer_key) as billing:
            with billing.lock("orders-auth", ttl_ms=5000) as lease:
                assert lease.holder == "billing"  # no label: the principal itself
                lease.kv.put("k", b"v")
                verifier = Verifier(KeyRing.from_public_keys(billing.keys()))
                assert verifier.verify(lease.token).holder == "billing"
                token = lease.token
            with billing.lock("orders-auth", holder="w1", ttl_ms=5000) as labelled:
                assert labelled.holder == "billing/w1"
            with pytest.raises(QuotaExceededError) as quota:
                billing.acquire("orders-long", ttl_ms=120_000)
            assert (quota.value.resource, quota.value.limit) == ("ttl_ms", 60000)
            with pytest.raises(PermissionDeniedError):
                billing.acquire("payroll", ttl_ms=5000)
        with Client(server.url, key=reader_key) as auditor:
            assert auditor.kv("orders-auth").get("k") == b"v"
            with pytest.raises(PermissionDeniedError):
                auditor.acquire("orders-auth", ttl_ms=5000)
            with pytest.raises(PermissionDeniedError):
                auditor.fenced_kv("orders-auth", token).put("k", b"stolen token")
    finally:
        server.stop()


def test_auth_arguments_are_checked_when_the_client_is_made(tmp_path: Path) -> None:
    # A CA or certificate file that does not exist fails at construction, not at the
    # first request; so does a key that cannot travel in a header.
    with pytest.raises(OSError):
        Client("https://h:1", ca=str(tmp_path / "missing-ca.pem"))
    with pytest.raises(OSError):
        Client("https://h:1", cert=(str(tmp_path / "missing.pem"), str(tmp_path / "missing.key")))
    with pytest.raises(BadRequestError):
        Client("https://h:1", key="line\nbreak")
    seen = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers.get("authorization"), json.loads(request.content)))
        return httpx.Response(503, json={"error": {"code": "unavailable", "message": "shutting down"}})

    with Client("http://h:1", key="k-123", transport=httpx.MockTransport(record)) as c:
        with pytest.raises(UnavailableError):
            c.acquire_grant("orders", ttl_ms=1000)
    # With a key and no holder, no holder is sent: the server makes it the principal.
    assert seen == [("Bearer k-123", {"ttl_ms": 1000})]


def test_health(client: Client) -> None:
    client.health()


def test_a_lock_shows_one_epoch_before_and_after_a_crash(lock_name: str) -> None:
    """The Python client reads the lock's one epoch (docs/guarantees.md): the holder's, or
    the last one granted; never the reservation's ceiling, also after a crash, where the
    ceiling is ``epoch_bound``."""
    first = PalisadeServer(extra=["--idle-grace-ms", "0"])
    try:
        with Client(first.url) as client:
            lease = client.acquire(lock_name, holder="a", ttl_ms=60_000)
            status = client.lock_status(lock_name)
            assert (status.epoch, status.lease_epoch, status.epoch_bound) == (lease.epoch,) * 3
            lease.kv.put("k", b"v")  # durable, and the grant's record rides with it
            lease.release()
            listed = [(s.epoch, s.lease_epoch) for s in client.locks() if s.lock == lock_name]
            assert listed == [(lease.epoch, None)]
        first.kill()
        second = PalisadeServer(extra=["--idle-grace-ms", "0"], data_dir=first.data_dir)
        try:
            with Client(second.url) as client:
                status = client.lock_status(lock_name)
                assert (status.epoch, status.lease_epoch) == (lease.epoch, None)
                assert status.epoch_bound is not None and status.epoch_bound > status.epoch
                again = client.acquire(lock_name, holder="b", ttl_ms=60_000)
                assert again.epoch > status.epoch_bound
                status = client.lock_status(lock_name)
                assert (status.epoch, status.lease_epoch, status.epoch_bound) == (again.epoch,) * 3
                again.release()
        finally:
            second.stop()
    finally:
        first.stop()


def test_locks_reads_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """``client.locks()`` follows ``next`` through every page of ``GET /v1/locks``, not only
    the first (pages of two here, so five locks take three pages)."""
    import palisade._protocol

    monkeypatch.setattr(palisade._protocol, "LOCK_PAGE", 2)
    server = PalisadeServer()
    try:
        with Client(server.url) as client:
            names = [f"page-{i}" for i in range(5)]
            for name in names:
                client.acquire(name, holder="a", ttl_ms=60_000)
            assert [s.lock for s in client.locks()] == names
            assert all(s.holder == "a" for s in client.locks())
    finally:
        server.stop()
