"""Every error this package raises: one class per case a caller branches on.

The server answers every failure as ``{"error": {"code", "message", ...extra}}`` with a
stable ``code`` (docs/api.md). Each code a caller is expected to handle has its own class
carrying the extra fields as typed attributes: "you are fenced" is
``StaleTokenError(high_water, epoch)``, not a string to grep. The gates
(``palisade.gates``) raise the same classes with the same codes, so a refusal reads the
same whether Palisade's store or your own database made it.

Codes this version does not know become :class:`ApiError`, so a newer server never makes
an older client fail to decode its answers.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "PalisadeError",
    "FencedError",
    "StaleTokenError",
    "StaleSequenceError",
    "LockHeldError",
    "LeaseLostError",
    "SessionExpiredError",
    "NotFoundError",
    "MissingTokenError",
    "InvalidTokenError",
    "MalformedTokenError",
    "UnknownKeyError",
    "BadSignatureError",
    "WrongLockError",
    "RevisionMismatchError",
    "ConflictError",
    "PayloadTooLargeError",
    "IdempotencyConflictError",
    "StorageFailedError",
    "BadRequestError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "QuotaExceededError",
    "UnavailableError",
    "ApiError",
    "TransportError",
    "DecodeError",
]


class PalisadeError(Exception):
    """Base of every error raised by this package.

    ``code`` is the stable machine code (the server's, or ``"transport"`` / ``"decode"``
    for failures on this side); ``status`` is the HTTP status when a server answered,
    ``None`` when the error was raised locally (by the client before sending, or by a
    gate inside your database).
    """

    code: str = "error"

    def __init__(self, message: str, *, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class FencedError(PalisadeError):
    """The resource has admitted a newer holder: this holder is fenced off. Stop; do not
    retry with the same token."""


class StaleTokenError(FencedError):
    """``stale_token``: the token's epoch is below the resource's high-water mark."""

    code = "stale_token"

    def __init__(self, high_water: int, epoch: int, *, status: Optional[int] = None) -> None:
        super().__init__(
            f"stale token: epoch {epoch} is below the high-water mark {high_water}",
            status=status,
        )
        self.high_water = high_water
        self.epoch = epoch


class StaleSequenceError(FencedError):
    """``stale_sequence``: under the sequence policy, (epoch, seq) did not strictly exceed
    the mark (a delayed or replayed operation of the current holder)."""

    code = "stale_sequence"

    def __init__(
        self,
        high_water: int,
        high_water_seq: int,
        epoch: int,
        seq: int,
        *,
        status: Optional[int] = None,
    ) -> None:
        super().__init__(
            f"stale sequence: ({epoch}, {seq}) does not exceed "
            f"({high_water}, {high_water_seq})",
            status=status,
        )
        self.high_water = high_water
        self.high_water_seq = high_water_seq
        self.epoch = epoch
        self.seq = seq


class LockHeldError(PalisadeError):
    """``lock_held``: someone else holds the lock. ``holder`` is ``None`` while the lock
    sits in its lock-delay after an expiry."""

    code = "lock_held"

    def __init__(
        self, holder: Optional[str], retry_after_ms: int, *, status: Optional[int] = None
    ) -> None:
        who = holder if holder is not None else "nobody (lock-delay)"
        super().__init__(
            f"lock held by {who}; retry after {retry_after_ms} ms", status=status
        )
        self.holder = holder
        self.retry_after_ms = retry_after_ms


class LeaseLostError(PalisadeError):
    """The lease is gone: the server answered ``lease_expired`` (expired or released), or
    the client saw no successful renewal before the lease's local deadline, or a write
    was refused as stale. A new lease would be a new epoch; the client never takes one
    behind your back."""

    code = "lease_expired"


class SessionExpiredError(LeaseLostError):
    """``session_expired``: the session expired or was closed, and every lease in it
    ended with it. A :class:`LeaseLostError`, since that is what it means for each of
    the session's locks."""

    code = "session_expired"


class NotFoundError(PalisadeError):
    """``not_found``: no such key (only raised where absence is an error)."""

    code = "not_found"


class MissingTokenError(PalisadeError):
    """``missing_token``: a mutation without a fencing token."""

    code = "missing_token"


class InvalidTokenError(PalisadeError):
    """``invalid_token``: the token is malformed, signed by an unknown key, or its
    signature does not verify. The subclasses say which, when the check ran here."""

    code = "invalid_token"


class MalformedTokenError(InvalidTokenError):
    """Not ``pal1.<payload>.<signature>`` with a canonical claims payload."""


class UnknownKeyError(InvalidTokenError):
    """Signed by a key id the key ring does not hold (refresh it from ``GET /v1/keys``
    after a key rotation)."""

    def __init__(self, key_id: str) -> None:
        super().__init__(f"token signed by unknown key {key_id!r}")
        self.key_id = key_id


class BadSignatureError(InvalidTokenError):
    """The signature does not match the payload: the token was edited or forged."""

    def __init__(self) -> None:
        super().__init__("token signature does not verify")


class WrongLockError(PalisadeError):
    """``wrong_lock``: a genuine token, but for another lock than the one guarding the
    resource. ``expected`` is known only when a gate raised it."""

    code = "wrong_lock"

    def __init__(
        self,
        token_lock: str,
        expected: Optional[str] = None,
        *,
        status: Optional[int] = None,
    ) -> None:
        where = f"{expected!r}" if expected is not None else "this namespace"
        super().__init__(f"token is for lock {token_lock!r}, not {where}", status=status)
        self.token_lock = token_lock
        self.expected = expected


class RevisionMismatchError(PalisadeError):
    """``revision_mismatch``: an ``If-Match`` / ``If-None-Match`` precondition failed.
    ``current_revision`` is ``None`` when the key does not exist."""

    code = "revision_mismatch"

    def __init__(self, current_revision: Optional[int], *, status: Optional[int] = None) -> None:
        now = (
            f"the key is at revision {current_revision}"
            if current_revision is not None
            else "the key does not exist"
        )
        super().__init__(f"revision mismatch: {now}", status=status)
        self.current_revision = current_revision


class ConflictError(PalisadeError):
    """``write_conflict``: another writer changed the guarded resource between read and
    write (a gate's serialisation failure, deadlock or busy database). Nothing of the
    operation committed; retrying the whole transaction is safe as far as fencing is
    concerned. Same code as the Rust gates' ``Conflict``."""

    code = "write_conflict"


class PayloadTooLargeError(PalisadeError):
    """``payload_too_large``: the value exceeds the server's limit (``limit`` bytes)."""

    code = "payload_too_large"

    def __init__(self, message: str, limit: Optional[int], *, status: Optional[int] = None) -> None:
        super().__init__(message, status=status)
        self.limit = limit


class IdempotencyConflictError(PalisadeError):
    """``idempotency_conflict``: the idempotency key was used before for another request."""

    code = "idempotency_conflict"


class StorageFailedError(PalisadeError):
    """``storage_failed``: the server's store (or, from a gate, your database) failed.
    Treat the operation as not done; from a gate, roll back."""

    code = "storage_failed"


class BadRequestError(PalisadeError):
    """``bad_request``: refused by the server, or locally before sending (a key that
    cannot be expressed in a URL, an option out of range)."""

    code = "bad_request"


class UnauthenticatedError(PalisadeError):
    """``unauthenticated`` (401): no valid bearer key or client certificate."""

    code = "unauthenticated"


class PermissionDeniedError(PalisadeError):
    """``permission_denied`` (403): this principal may not use this verb on this lock."""

    code = "permission_denied"


class QuotaExceededError(PalisadeError):
    """``quota_exceeded`` (429): a server limit would be exceeded: ``resource`` (for
    example ``ttl_ms``, ``leases``, ``keys_per_namespace``) may be at most ``limit``."""

    code = "quota_exceeded"

    def __init__(self, message: str, resource: str, limit: int, *, status: Optional[int] = None) -> None:
        super().__init__(message, status=status)
        self.resource = resource
        self.limit = limit


class UnavailableError(PalisadeError):
    """``unavailable`` (503): the server is shutting down and did not take the request.
    A client with several URLs sends it to the next one."""

    code = "unavailable"


class ApiError(PalisadeError):
    """Any other well-formed error answer: a code newer than this client, or a known code
    whose extra fields were missing (the client does not invent values)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code} (HTTP {status}): {message}", status=status)
        self.code = code
        self.message = message


class TransportError(PalisadeError):
    """The request did not complete on any endpoint: connection refused, timeout, reset.

    ``outcome_unknown`` is ``True`` when a request was sent and no answer came back: a
    mutation may then have been applied. Retrying it is safe only with the same
    idempotency key.
    """

    code = "transport"

    def __init__(self, message: str, *, outcome_unknown: bool) -> None:
        super().__init__(message)
        self.outcome_unknown = outcome_unknown


class DecodeError(PalisadeError):
    """The server answered something this client cannot read."""

    code = "decode"


#: The errors whose answer carries nothing beyond the message, by their code.
_SIMPLE: Dict[str, Type[PalisadeError]] = {
    cls.code: cls
    for cls in (
        LeaseLostError,
        SessionExpiredError,
        NotFoundError,
        MissingTokenError,
        InvalidTokenError,
        IdempotencyConflictError,
        StorageFailedError,
        BadRequestError,
        UnauthenticatedError,
        PermissionDeniedError,
        ConflictError,
        UnavailableError,
    )
}


def _int_field(extra: Mapping[str, Any], name: str) -> Optional[int]:
    value = extra.get(name)
    # bool is an int in Python; a JSON true is not a number.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _decode_known(status: int, code: str, message: str, extra: Mapping[str, Any]) -> Optional[PalisadeError]:
    """The typed error for a known code, or ``None`` if its extra fields are missing."""

    def num(name: str) -> Optional[int]:
        return _int_field(extra, name)

    if code == "stale_token":
        hw, epoch = num("high_water"), num("epoch")
        if hw is None or epoch is None:
            return None
        return StaleTokenError(hw, epoch, status=status)
    if code == "stale_sequence":
        fields = [num(n) for n in ("high_water", "high_water_seq", "epoch", "seq")]
        if any(f is None for f in fields):
            return None
        hw, hw_seq, epoch, seq = (int(f) for f in fields if f is not None)
        return StaleSequenceError(hw, hw_seq, epoch, seq, status=status)
    if code == "lock_held":
        holder = extra.get("holder")
        retry = num("retry_after_ms")
        if retry is None or not (holder is None or isinstance(holder, str)):
            return None
        return LockHeldError(holder, retry, status=status)
    if code == "revision_mismatch":
        current = extra.get("current_revision")
        if current is None:
            return RevisionMismatchError(None, status=status)
        rev = num("current_revision")
        return RevisionMismatchError(rev, status=status) if rev is not None else None
    if code == "wrong_lock":
        token_lock = extra.get("token_lock")
        return WrongLockError(token_lock, status=status) if isinstance(token_lock, str) else None
    if code == "payload_too_large":
        return PayloadTooLargeError(message, num("limit"), status=status)
    if code == "quota_exceeded":
        resource, limit = extra.get("resource"), num("limit")
        if not isinstance(resource, str) or limit is None:
            return None
        return QuotaExceededError(message, resource, limit, status=status)
    cls = _SIMPLE.get(code)
    return cls(message, status=status) if cls is not None else None


#: The longest slice of a non-JSON error body quoted back in a :class:`DecodeError`.
SNIPPET_LEN = 200


def decode_error(status: int, body: bytes) -> PalisadeError:
    """Turns a non-success answer into the matching error.

    A body that is not the documented envelope (a proxy's HTML page, an empty 404 from a
    wrong base URL) is a :class:`DecodeError`, never a guessed code: an empty 404 must not
    read as "key not found".
    """
    try:
        envelope = json.loads(body.decode("utf-8"))
        error = envelope["error"]
        code = error["code"]
        if not isinstance(code, str):
            raise TypeError("code is not a string")
        message = error.get("message", "")
        if not isinstance(message, str):
            message = str(message)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        snippet = body.decode("utf-8", "replace")[:SNIPPET_LEN]
        return DecodeError(f"HTTP {status} with a non-JSON error body: {snippet!r}", status=status)
    extra = {k: v for k, v in error.items() if k not in ("code", "message")}
    decoded = _decode_known(status, code, message, extra)
    return decoded if decoded is not None else ApiError(status, code, message)
