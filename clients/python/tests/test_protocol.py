"""The pure parts: error decoding, path encoding, the failover rule and the renewal
schedule (with made-up clocks, like the Rust client's paused-time tests)."""

from __future__ import annotations

import json

import httpx
import pytest

from palisade import (
    ApiError,
    BadRequestError,
    ConflictError,
    DecodeError,
    IdempotencyConflictError,
    InvalidTokenError,
    LeaseLostError,
    LockHeldError,
    MissingTokenError,
    NotFoundError,
    PayloadTooLargeError,
    QuotaExceededError,
    RevisionMismatchError,
    StaleSequenceError,
    StaleTokenError,
    StorageFailedError,
    UnauthenticatedError,
    UnavailableError,
    WrongLockError,
)
from palisade import _protocol as proto
from palisade._errors import decode_error
from palisade._paths import key_path, normalise_base, segment
from palisade import _failover
from palisade._failover import Failure, Retry, may_try_next
from palisade._renewal import Deadlines, Renewal


def decode(status: int, body: object) -> Exception:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return decode_error(status, raw)


def err(code: str, **extra: object) -> dict:
    return {"error": {"code": code, "message": "m", **extra}}


# ---- errors --------------------------------------------------------------------------


def test_stale_token_carries_high_water_and_epoch() -> None:
    e = decode(409, err("stale_token", high_water=2, epoch=1))
    assert isinstance(e, StaleTokenError) and (e.high_water, e.epoch, e.code, e.status) == (2, 1, "stale_token", 409)


def test_stale_sequence_carries_all_four_fields() -> None:
    e = decode(409, err("stale_sequence", high_water=3, high_water_seq=9, epoch=3, seq=9))
    assert isinstance(e, StaleSequenceError) and (e.high_water, e.high_water_seq, e.epoch, e.seq) == (3, 9, 3, 9)


def test_lock_held_with_and_without_holder() -> None:
    e = decode(409, err("lock_held", holder="h1", retry_after_ms=250))
    assert isinstance(e, LockHeldError) and (e.holder, e.retry_after_ms) == ("h1", 250)
    e = decode(409, err("lock_held", holder=None, retry_after_ms=5))
    assert isinstance(e, LockHeldError) and e.holder is None and "lock-delay" in str(e)


def test_revision_mismatch_null_and_number() -> None:
    e = decode(412, err("revision_mismatch", current_revision=None))
    assert isinstance(e, RevisionMismatchError) and e.current_revision is None
    e = decode(412, err("revision_mismatch", current_revision=7))
    assert isinstance(e, RevisionMismatchError) and e.current_revision == 7


def test_simple_codes_map_to_their_classes() -> None:
    for status, code, cls in [
        (404, "lease_expired", LeaseLostError),
        (404, "not_found", NotFoundError),
        (400, "missing_token", MissingTokenError),
        (400, "invalid_token", InvalidTokenError),
        (413, "payload_too_large", PayloadTooLargeError),
        (422, "idempotency_conflict", IdempotencyConflictError),
        (503, "storage_failed", StorageFailedError),
        (400, "bad_request", BadRequestError),
        (401, "unauthenticated", UnauthenticatedError),
        (409, "write_conflict", ConflictError),
        (503, "unavailable", UnavailableError),
        (403, "wrong_lock", ApiError),  # without token_lock: not invented
        (429, "quota_exceeded", ApiError),  # without resource and limit: not invented
    ]:
        e = decode(status, err(code))
        assert type(e) is cls, code
        assert e.code == code  # type: ignore[attr-defined]


def test_quota_exceeded_carries_resource_and_limit() -> None:
    e = decode(429, err("quota_exceeded", resource="ttl_ms", limit=60000))
    assert isinstance(e, QuotaExceededError) and (e.resource, e.limit, e.status) == ("ttl_ms", 60000, 429)


def test_wrong_lock_carries_the_tokens_lock() -> None:
    e = decode(403, err("wrong_lock", token_lock="a"))
    assert isinstance(e, WrongLockError) and e.token_lock == "a"


def test_unknown_code_is_api_error_with_status() -> None:
    e = decode(405, err("method_not_allowed"))
    assert isinstance(e, ApiError) and (e.status, e.code, e.message) == (405, "method_not_allowed", "m")


def test_known_code_with_missing_or_mistyped_fields_does_not_invent_values() -> None:
    for body in [err("stale_token"), err("stale_token", high_water="2", epoch=1), err("stale_token", high_water=True, epoch=1)]:
        e = decode(409, body)
        assert type(e) is ApiError and e.code == "stale_token"


def test_non_json_bodies_are_decode_errors() -> None:
    for body in [b"", b"<html>bad gateway</html>", b'{"code":"not_found"}', b"\xff\xfe", b'{"error":{"code":5}}']:
        e = decode(404, body)
        assert isinstance(e, DecodeError) and e.code == "decode", body


# ---- paths ---------------------------------------------------------------------------


def test_paths_are_encoded_like_the_rust_client() -> None:
    assert segment("lock", "Az09-._~") == "Az09-._~"
    assert segment("lock", "a b/c?d#e%f") == "a%20b%2Fc%3Fd%23e%25f"
    assert segment("lock", "\u00e9") == "%C3%A9"
    assert segment("lock", "+&=:@") == "%2B%26%3D%3A%40"
    assert key_path("a/b c/d") == "a/b%20c/d"
    assert key_path("users/\u00fc?x") == "users/%C3%BC%3Fx"
    assert key_path("a//b/") == "a//b/"
    assert key_path("a/.hidden/b..c") == "a/.hidden/b..c"
    for key in [".", "..", "a/../b", "a/./b", "a/..", "", "\ud800"]:
        with pytest.raises(BadRequestError):
            key_path(key)
    for name in ["", ".", ".."]:
        with pytest.raises(BadRequestError):
            segment("lock", name)


def test_encoded_paths_survive_httpx_unchanged() -> None:
    url = httpx.URL("http://h:1" + proto.kv_path("l", "dir/a b/..x/%2e/\u00fc"))
    assert url.raw_path == b"/v1/kv/l/dir/a%20b/..x/%252e/%C3%BC"


def test_base_urls() -> None:
    assert normalise_base("http://127.0.0.1:7700/") == "http://127.0.0.1:7700"
    assert normalise_base("https://h/prefix/") == "https://h/prefix"
    for bad in ["127.0.0.1:7700", "ftp://h", "http://h/?x=1", "http://h/#f", "http://"]:
        with pytest.raises(BadRequestError):
            normalise_base(bad)


# ---- calls and failover --------------------------------------------------------------


def test_mutations_carry_the_token_and_every_option() -> None:
    opts = proto.WriteOptions(if_match=5, idempotency_key="op-1", seq=9)
    call = proto.kv_put("orders", "a/b c", b"v", "pal1.abc.def", opts, auto_key=False)
    assert (call.method, call.path, call.body) == ("PUT", "/v1/kv/orders/a/b%20c", b"v")
    assert call.headers == {
        "Fencing-Token": "pal1.abc.def",
        "Fencing-Seq": "9",
        "If-Match": '"5"',
        "Idempotency-Key": "op-1",
        "Content-Type": "application/octet-stream",
    }
    assert call.retry is Retry.SAFE
    plain = proto.kv_delete("orders", "k", "t", proto.WriteOptions(), auto_key=False)
    assert plain.headers == {"Fencing-Token": "t"} and plain.retry is Retry.ONLY_UNREACHABLE
    absent = proto.kv_put("orders", "k", "\u00e9", "t", proto.WriteOptions(if_absent=True), auto_key=False)
    assert absent.headers["If-None-Match"] == "*" and absent.body == "\u00e9".encode()


def test_several_endpoints_put_a_fresh_key_on_every_write() -> None:
    first = proto.kv_put("l", "k", b"v", "t", proto.WriteOptions(), auto_key=True)
    second = proto.kv_put("l", "k", b"v", "t", proto.WriteOptions(), auto_key=True)
    fence = proto.fence("l", "t", None, auto_key=True)
    keys = {first.headers["Idempotency-Key"], second.headers["Idempotency-Key"], fence.headers["Idempotency-Key"]}
    assert len(keys) == 3 and all(k.startswith("py-") and len(k) <= 128 for k in keys)
    assert first.retry is second.retry is fence.retry is Retry.SAFE
    mine = proto.kv_put("l", "k", b"v", "t", proto.WriteOptions(idempotency_key="mine"), auto_key=True)
    assert mine.headers["Idempotency-Key"] == "mine"


def test_the_failover_rule() -> None:
    table = {
        (Retry.SAFE, Failure.UNREACHABLE): True,
        (Retry.SAFE, Failure.UNAVAILABLE): True,
        (Retry.SAFE, Failure.UNKNOWN): True,
        (Retry.UNLESS_UNKNOWN, Failure.UNREACHABLE): True,
        (Retry.UNLESS_UNKNOWN, Failure.UNAVAILABLE): True,
        (Retry.UNLESS_UNKNOWN, Failure.UNKNOWN): False,
        (Retry.ONLY_UNREACHABLE, Failure.UNREACHABLE): True,
        (Retry.ONLY_UNREACHABLE, Failure.UNAVAILABLE): False,
        (Retry.ONLY_UNREACHABLE, Failure.UNKNOWN): False,
    }
    for (retry, failure), expected in table.items():
        assert may_try_next(retry, failure) is expected, (retry, failure)
    assert proto.acquire("l", "h", 1000, 0).retry is Retry.UNLESS_UNKNOWN
    for call in [proto.keepalive("id"), proto.release("id"), proto.kv_get("l", "k"), proto.check_token("t"), proto.keys()]:
        assert call.retry is Retry.SAFE


def test_httpx_failures_are_classified() -> None:
    req = httpx.Request("GET", "http://h")
    assert _failover.classify(httpx.ConnectError("refused", request=req)) is Failure.UNREACHABLE
    assert _failover.classify(httpx.ConnectTimeout("slow", request=req)) is Failure.UNREACHABLE
    assert _failover.classify(httpx.ReadTimeout("slow", request=req)) is Failure.UNKNOWN
    assert _failover.classify(httpx.RemoteProtocolError("closed", request=req)) is Failure.UNKNOWN
    assert _failover.classify(httpx.UnsupportedProtocol("gopher", request=req)) is None


def test_endpoints_start_from_the_last_that_answered() -> None:
    ends = _failover.Endpoints(["a", "b", "c"])
    assert ends.order() == ["a", "b", "c"]
    ends.prefer("b")
    assert ends.order() == ["b", "c", "a"]


def test_acquire_sends_wait_and_a_longer_timeout() -> None:
    call = proto.acquire("orders", "w1", 5000, 2000)
    assert json.loads(call.body or b"") == {"holder": "w1", "ttl_ms": 5000, "wait_ms": 2000}
    assert call.timeout == 2.0 + proto.WAIT_MARGIN
    assert proto.acquire("orders", "w1", 5000, 0).timeout is None


# ---- the renewal schedule ------------------------------------------------------------


def test_renewals_are_due_every_third_of_the_ttl_and_move_both_deadlines() -> None:
    r = Renewal(900, sent_at=100.0)
    assert (r.due(), r.renew_by, r.safe_until) == pytest.approx((100.3, 100.6, 100.891))
    r.renewed(sent_at=100.3, ttl_ms=900)
    assert (r.due(), r.renew_by, r.safe_until) == pytest.approx((100.6, 100.9, 101.191))
    assert not r.is_lost(100.89) and r.is_lost(100.9)


def test_the_deadlines_count_from_the_send_and_never_trust_a_longer_ttl() -> None:
    r = Renewal(900, sent_at=0.0)
    r.renewed(sent_at=0.3, ttl_ms=60_000)  # a server granting more is not believed
    assert (r.renew_by, r.safe_until) == pytest.approx((0.9, 1.191))


def test_failed_renewals_retry_quickly_until_the_renewal_deadline() -> None:
    r = Renewal(1500, sent_at=0.0)
    r.failed(now=0.5)
    assert r.due() == pytest.approx(0.65)
    r.failed(now=0.95)
    assert r.due() == pytest.approx(1.0)  # never past the renewal deadline
    assert r.reason(1.0) == "no renewal succeeded before the renewal deadline"
    assert r.timeout(0.95) == pytest.approx(0.05)
    # Given up, but what already runs may go on until the safe deadline.
    assert r.safe_until == pytest.approx(1.485)


def test_a_lease_known_to_have_ended_is_safe_no_longer() -> None:
    r = Renewal(1000, sent_at=0.0)
    r.lose("the server says the lease expired or was released", ended_by=0.4)
    assert r.safe_until == 0.4
    r.lose("later", ended_by=0.7)  # never moves later
    assert r.safe_until == 0.4


def test_the_deadlines_follow_the_settings_and_refuse_what_cannot_hold() -> None:
    r = Renewal(1000, sent_at=0.0, deadlines=Deadlines(renew_deadline=0.5, clock_drift=0.1))
    assert (r.renew_by, r.safe_until) == pytest.approx((0.5, 0.9))
    for renew, drift in [(1 / 3, 0.01), (1.0, 0.01), (0.7, 0.6), (0.7, -0.1), (float("nan"), 0.01)]:
        with pytest.raises(ValueError):
            Deadlines(renew_deadline=renew, clock_drift=drift)


def test_lost_is_final() -> None:
    r = Renewal(1000, sent_at=0.0)
    r.lose("the server says the lease expired or was released")
    r.renewed(sent_at=0.1, ttl_ms=1000)
    r.lose("something later")
    assert r.is_lost(0.2) and r.reason(0.2) == "the server says the lease expired or was released"


# ---- operations run without I/O ------------------------------------------------------


def _answer(status: int, body: object) -> httpx.Response:
    return httpx.Response(status, content=json.dumps(body).encode(), request=httpx.Request("GET", "http://x"))


def test_an_exchange_moves_past_an_unreachable_node_and_a_503_to_the_answer() -> None:
    def op() -> _failover.Op[str]:
        response = yield proto.lock_status("orders")
        return str(proto.body(response)["lock"])

    ends = _failover.Endpoints(["http://a", "http://b", "http://c"])
    exchange = _failover.Exchange(ends, op())
    sent = []
    outcomes = [
        httpx.ConnectError("refused", request=httpx.Request("GET", "http://a")),
        _answer(503, err("unavailable")),
        _answer(200, {"lock": "orders"}),
    ]
    for (url, call), outcome in zip(exchange, outcomes):
        sent.append(url)
        exchange.got(outcome)
    assert sent == ["http://a/v1/locks/orders", "http://b/v1/locks/orders", "http://c/v1/locks/orders"]
    assert exchange.value == "orders"
    assert ends.order()[0] == "http://c"  # the node that answered is tried first next time


def test_an_exchange_raises_the_failure_inside_the_operation() -> None:
    caught = []

    def op() -> _failover.Op[None]:
        try:
            yield proto.acquire("orders", "h", 1000, 0)
        except Exception as e:
            caught.append(e)
            raise

    exchange = _failover.Exchange(_failover.Endpoints(["http://a"]), op())
    url, _ = next(iter(exchange))
    with pytest.raises(Exception) as raised:
        exchange.got(httpx.ReadTimeout("lost", request=httpx.Request("POST", url)))
    assert caught == [raised.value] and raised.value.outcome_unknown is True  # type: ignore[attr-defined]


def test_wire_types_fill_what_older_servers_leave_out() -> None:
    from palisade import FenceStatus, Grant

    grant = Grant.parse({"lock": "l", "holder": "h", "epoch": 1, "token": "t", "lease_id": "i", "ttl_ms": 5})
    assert (grant.lock_delay_ms, grant.value, grant.session) == (0, None, None)
    assert FenceStatus.parse({"lock": "l", "high_water": 2, "policy": "epoch"}).seq == 0
    with pytest.raises(DecodeError, match="fence status: field 'high_water' is not an unsigned integer"):
        FenceStatus.parse({"lock": "l", "high_water": True, "policy": "epoch"})


def test_an_event_without_its_optional_fields_is_read_not_raised() -> None:
    from palisade import RejectedEvent
    from palisade._events import parse_event

    event = parse_event(json.dumps({"type": "rejected", "id": 3, "at_ms": 1, "lock": "l", "code": "missing_token"}))
    assert event == RejectedEvent(id=3, at_ms=1, lock="l", code="missing_token", epoch=None, high_water=None)
    assert parse_event(json.dumps({"type": "granted", "id": 3, "at_ms": 1, "lock": "l"})) is None
