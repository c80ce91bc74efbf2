"""The HTTP protocol without I/O: what each call sends and how answers are read.

The operations of both clients (``_ops``) build each :class:`Call` here and read its
answer here; the blocking client (``palisade.Client``) and the asyncio client
(``palisade.aio.Client``) only send it, with httpx, where ``_failover.Exchange`` says.
So the two clients cannot disagree about headers, error codes or retries.

Every call says how freely it may be resent (:class:`Retry`). A fenced write or barrier
sent by a client with several endpoints carries an ``Idempotency-Key`` (a fresh one,
unless the caller gave one), which is what makes resending it to another node safe.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar, Union

import httpx

from ._errors import BadRequestError, DecodeError, InvalidTokenError, NotFoundError, decode_error
from ._failover import Call, Retry
from ._paths import key_path, segment
from ._types import Entry, WriteResult, parse_json
from ._version import __version__

#: Bound on every call that is not a queued acquire, in seconds. A server that does not
#: answer within this is treated as unreachable rather than waited on forever.
REQUEST_TIMEOUT = 10.0
#: Bound on establishing a connection, well inside :data:`REQUEST_TIMEOUT`.
CONNECT_TIMEOUT = 3.0
#: Extra time granted to an acquire that waits in the server's queue, on top of its
#: ``wait_ms``, so the server's own ``lock_held`` at the end of the wait arrives first.
WAIT_MARGIN = 5.0
#: The largest page the server returns for a listing.
LIST_LIMIT = 10_000
#: Longest idempotency key the server accepts.
MAX_IDEMPOTENCY_KEY_LEN = 128
#: The server's fixed bounds on an acquire (docs/api.md); checked here too, so a mistake
#: fails before any request.
MIN_TTL_MS, MAX_WAIT_MS = 50, 300_000
#: Largest lock value, in bytes (the server's bound; sent as base64).
MAX_LOCK_VALUE_BYTES = 4096
_U64_MAX = 2**64 - 1

T = TypeVar("T")

FENCING_TOKEN = "Fencing-Token"
FENCING_SEQ = "Fencing-Seq"
FENCING_EPOCH = "Fencing-Epoch"
IDEMPOTENCY_KEY = "Idempotency-Key"
IDEMPOTENT_REPLAYED = "Idempotent-Replayed"


def new_idempotency_key() -> str:
    """A fresh key for one logical write: 128 random bits, visible ASCII."""
    return "py-" + uuid.uuid4().hex


def _u64(name: str, value: Optional[int]) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64_MAX:
        raise BadRequestError(f"{name} must be an integer from 0 to 2^64-1, not {value!r}")
    return value


def _header_text(name: str, value: str) -> str:
    if not isinstance(value, str) or not value or value != value.strip() or not all(
        0x20 <= ord(c) <= 0x7E for c in value
    ):
        raise BadRequestError(f"{name} must be visible ASCII without surrounding spaces")
    return value


def _json_body(value: Dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


# ---- locks and leases (the issuer) ---------------------------------------------------


def _value_text(value: Any) -> Optional[str]:
    """A lock value as the API carries it: standard base64 of at most 4096 bytes."""
    if value is None:
        return None
    raw = _value_bytes(value)
    if len(raw) > MAX_LOCK_VALUE_BYTES:
        raise BadRequestError(f"a lock value may be at most {MAX_LOCK_VALUE_BYTES} bytes, not {len(raw)}")
    return base64.b64encode(raw).decode("ascii")


def acquire(
    lock: str,
    holder: Optional[str],
    ttl_ms: int,
    wait_ms: int,
    value: Any = None,
    lock_delay_ms: Optional[int] = None,
    session: Optional[str] = None,
) -> Call:
    """``holder=None`` sends no holder: with authentication on, the lease's holder is
    then the caller's principal (with a label, ``<principal>/<label>``). In a
    ``session`` the session's TTL applies and ``ttl_ms`` is not sent."""
    ttl_ms = _u64("ttl_ms", ttl_ms) or 0
    wait_ms = _u64("wait_ms", wait_ms) or 0
    # The upper bound of a TTL is the server's (per principal with authentication on):
    # it answers quota_exceeded.
    if session is None and ttl_ms < MIN_TTL_MS:
        raise BadRequestError(f"ttl_ms must be at least {MIN_TTL_MS}")
    if wait_ms > MAX_WAIT_MS:
        raise BadRequestError(f"wait_ms must be at most {MAX_WAIT_MS}")
    if holder is not None and not isinstance(holder, str):
        raise BadRequestError("holder must be a string")
    body: Dict[str, Any] = {}
    if session is None:
        body["ttl_ms"] = ttl_ms
    else:
        if not isinstance(session, str) or not session:
            raise BadRequestError("session must be a session id (a non-empty string)")
        body["session"] = session
    if holder is not None:
        body["holder"] = holder
    if wait_ms:
        body["wait_ms"] = wait_ms
    text = _value_text(value)
    if text is not None:
        body["value"] = text
    delay = _u64("lock_delay_ms", lock_delay_ms)
    if delay is not None:
        body["lock_delay_ms"] = delay
    return Call(
        "POST",
        f"/v1/locks/{segment('lock name', lock)}/acquire",
        {"Content-Type": "application/json"},
        _json_body(body),
        timeout=wait_ms / 1000 + WAIT_MARGIN if wait_ms else None,
        retry=Retry.UNLESS_UNKNOWN,
    )


def keepalive(lease_id: str, timeout: Optional[float] = None) -> Call:
    return Call("POST", f"/v1/leases/{segment('lease id', lease_id)}/keepalive", timeout=timeout)


def release(lease_id: str) -> Call:
    return Call("POST", f"/v1/leases/{segment('lease id', lease_id)}/release")


def proclaim(lease_id: str, value: Any) -> Call:
    """Replacing a value twice leaves what replacing it once does: safe to resend."""
    return Call(
        "POST",
        f"/v1/leases/{segment('lease id', lease_id)}/proclaim",
        {"Content-Type": "application/json"},
        _json_body({"value": _value_text(value)}),
    )


def create_session(holder: Optional[str], ttl_ms: int) -> Call:
    """Like an acquire, a creation whose answer was lost is not resent (it would make a
    second session)."""
    ttl_ms = _u64("ttl_ms", ttl_ms) or 0
    if ttl_ms < MIN_TTL_MS:
        raise BadRequestError(f"ttl_ms must be at least {MIN_TTL_MS}")
    body: Dict[str, Any] = {"ttl_ms": ttl_ms}
    if holder is not None:
        body["holder"] = holder
    return Call(
        "POST", "/v1/sessions", {"Content-Type": "application/json"}, _json_body(body),
        retry=Retry.UNLESS_UNKNOWN,
    )


def keepalive_session(session_id: str, timeout: Optional[float] = None) -> Call:
    return Call("POST", f"/v1/sessions/{segment('session id', session_id)}/keepalive", timeout=timeout)


def session_info(session_id: str) -> Call:
    return Call("GET", f"/v1/sessions/{segment('session id', session_id)}")


def close_session(session_id: str) -> Call:
    return Call("POST", f"/v1/sessions/{segment('session id', session_id)}/close")


def lock_status(lock: str) -> Call:
    return Call("GET", f"/v1/locks/{segment('lock name', lock)}")


def locks(after: Optional[str] = None) -> Call:
    """One page of ``GET /v1/locks`` (the largest the server gives), after lock ``after``."""
    query = httpx.QueryParams({"limit": LOCK_PAGE, **({"after": after} if after is not None else {})})
    return Call("GET", f"/v1/locks?{query}")


#: The largest page of ``GET /v1/locks`` the server answers.
LOCK_PAGE = 10_000


# ---- keys, tokens, health -------------------------------------------------------------


def keys() -> Call:
    return Call("GET", "/v1/keys")


def check_token(token: str) -> Call:
    if not isinstance(token, str):
        raise BadRequestError("token must be a string")
    return Call(
        "POST", "/v1/tokens/check", {"Content-Type": "application/json"}, _json_body({"token": token})
    )


def report_gate(report: Dict[str, Any]) -> Call:
    """A resent report would count twice: sent again only if it never left."""
    return Call(
        "POST",
        "/v1/gates/report",
        {"Content-Type": "application/json"},
        _json_body(report),
        retry=Retry.UNLESS_UNKNOWN,
    )


def health() -> Call:
    return Call("GET", "/healthz")


# ---- the fenced store -----------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    """Conditions and metadata of one fenced mutation."""

    #: Apply only if the key's current revision equals this (``If-Match``).
    if_match: Optional[int] = None
    #: Apply only if the key does not exist (``If-None-Match: *``).
    if_absent: bool = False
    #: Makes retries safe: a repeat with the same key returns the first outcome instead of
    #: applying twice. Fencing alone does not deduplicate (S9).
    idempotency_key: Optional[str] = None
    #: ``Fencing-Seq``, required in ``sequence`` namespaces.
    seq: Optional[int] = None


def _mutation(
    method: str, path: str, token: str, opts: WriteOptions, auto_key: bool, body: Optional[bytes]
) -> Call:
    # An empty token is sent as it is: the server answers ``missing_token``, the same
    # refusal every other client gets. Only what cannot travel in a header fails here.
    if not isinstance(token, str):
        raise InvalidTokenError(f"a token is text, not {type(token).__name__}")
    if not all(0x20 <= ord(c) <= 0x7E for c in token):
        raise InvalidTokenError("token contains characters not allowed in an HTTP header")
    headers = {FENCING_TOKEN: token}
    seq = _u64("seq", opts.seq)
    if seq is not None:
        headers[FENCING_SEQ] = str(seq)
    if opts.if_match is not None and opts.if_absent:
        raise BadRequestError("use if_match or if_absent, not both")
    if_match = _u64("if_match", opts.if_match)
    if if_match is not None:
        headers["If-Match"] = f'"{if_match}"'
    if opts.if_absent:
        headers["If-None-Match"] = "*"
    key = opts.idempotency_key
    if key is None and auto_key:
        key = new_idempotency_key()
    if key is not None:
        if len(key) > MAX_IDEMPOTENCY_KEY_LEN:
            raise BadRequestError(f"idempotency key is longer than {MAX_IDEMPOTENCY_KEY_LEN}")
        headers[IDEMPOTENCY_KEY] = _header_text("idempotency key", key)
    if body is not None:
        headers["Content-Type"] = "application/octet-stream"
    retry = Retry.SAFE if key is not None else Retry.ONLY_UNREACHABLE
    return Call(method, path, headers, body, retry=retry)


def _value_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise BadRequestError(f"value must be bytes or str, not {type(value).__name__}")


def kv_path(lock: str, key: str) -> str:
    return f"/v1/kv/{segment('lock name', lock)}/{key_path(key)}"


def kv_put(lock: str, key: str, value: Any, token: str, opts: WriteOptions, auto_key: bool) -> Call:
    return _mutation("PUT", kv_path(lock, key), token, opts, auto_key, _value_bytes(value))


def kv_delete(lock: str, key: str, token: str, opts: WriteOptions, auto_key: bool) -> Call:
    return _mutation("DELETE", kv_path(lock, key), token, opts, auto_key, None)


def fence(lock: str, token: str, seq: Optional[int], auto_key: bool) -> Call:
    opts = WriteOptions(seq=seq)
    return _mutation("POST", f"/v1/fences/{segment('lock name', lock)}", token, opts, auto_key, None)


def kv_get(lock: str, key: str) -> Call:
    return Call("GET", kv_path(lock, key))


def kv_list(lock: str, prefix: str) -> Call:
    if not isinstance(prefix, str):
        raise BadRequestError("prefix must be a string")
    query = httpx.QueryParams({"limit": LIST_LIMIT, **({"prefix": prefix} if prefix else {})})
    return Call("GET", f"/v1/kv/{segment('lock name', lock)}?{query}")


def high_water(lock: str) -> Call:
    return Call("GET", f"/v1/fences/{segment('lock name', lock)}")


# ---- reading answers ------------------------------------------------------------------


def expect_ok(response: httpx.Response) -> httpx.Response:
    """The response if it is a success; otherwise raises the matching typed error."""
    if 200 <= response.status_code < 300:
        return response
    raise decode_error(response.status_code, response.content)


def body(response: httpx.Response) -> Dict[str, Any]:
    return parse_json(expect_ok(response).content)


def read(parse: Callable[[Dict[str, Any]], T], response: httpx.Response) -> T:
    """A success's JSON body, read by ``parse`` (a wire type's ``parse``, say)."""
    return parse(body(response))


def write_result(response: httpx.Response) -> WriteResult:
    replayed = response.headers.get(IDEMPOTENT_REPLAYED, "").strip().lower() == "true"
    return WriteResult.parse(body(response), replayed)


def high_water_of_fence(response: httpx.Response) -> int:
    b = body(response)
    value = b.get("high_water")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise DecodeError("fence answer: field 'high_water' is not an unsigned integer")


def key_list(response: httpx.Response) -> List[str]:
    b = body(response)
    keys = b.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise DecodeError("key list: field 'keys' is not a list of strings")
    return keys


def _header_u64(response: httpx.Response, name: str) -> int:
    raw = response.headers.get(name)
    if raw is None:
        raise DecodeError(f"response lacks the {name} header")
    text = raw.strip()
    if text.startswith("W/"):
        text = text[2:]
    text = text.strip('"')
    if not text.isdigit() or not text.isascii():
        raise DecodeError(f"{name} header {raw!r} is not a number")
    return int(text)


def entry(response: httpx.Response) -> Optional[Entry]:
    """The stored entry, or ``None`` for ``not_found``."""
    try:
        expect_ok(response)
    except NotFoundError:
        return None
    return Entry(
        value=response.content,
        revision=_header_u64(response, "ETag"),
        epoch=_header_u64(response, FENCING_EPOCH),
    )


def healthy(response: httpx.Response) -> None:
    expect_ok(response)


# ---- client settings ------------------------------------------------------------------


def holder_for(holder: Optional[str], authenticated: bool) -> Optional[str]:
    """The holder an acquire sends. A server without authentication needs one, so a
    missing holder becomes ``<hostname>/<pid>``; with credentials the holder is the
    principal and a label is only sent when the caller gave one."""
    if holder is not None or authenticated:
        return holder
    return default_holder()


def default_holder() -> str:
    """``<hostname>/<pid>``: a holder label that tells operators where a lease lives."""
    label = f"{socket.gethostname()}/{os.getpid()}"
    label = "".join(c for c in label if c.isprintable())
    return label.encode("utf-8")[:200].decode("utf-8", "ignore") or f"pid-{os.getpid()}"


CertArg = Union[str, "os.PathLike[str]", Tuple[str, str]]


def http_settings(
    key: Optional[str],
    ca: Optional[Union[str, "os.PathLike[str]"]],
    cert: Optional[CertArg],
    timeout: float,
    connect_timeout: float,
) -> Dict[str, Any]:
    """The keyword arguments for ``httpx.Client`` / ``httpx.AsyncClient``.

    - ``key``: a bearer key, sent as ``Authorization: Bearer <key>`` on every request
      (servers with authentication on answer 401 ``unauthenticated`` without one).
    - ``ca``: a PEM file of the CA that signed the servers' certificates (https URLs).
    - ``cert``: a client certificate: one PEM file holding certificate and private key,
      or a ``(certificate file, key file)`` pair.
    """
    headers = {"User-Agent": f"palisade-python/{__version__}"}
    if key is not None:
        headers["Authorization"] = "Bearer " + _header_text("key", key)
    verify: Union[bool, ssl.SSLContext] = True
    if ca is not None or cert is not None:
        context = ssl.create_default_context(cafile=os.fspath(ca) if ca is not None else None)
        if cert is not None:
            if isinstance(cert, tuple):
                context.load_cert_chain(cert[0], cert[1])
            else:
                context.load_cert_chain(os.fspath(cert))
        verify = context
    if timeout <= 0 or connect_timeout <= 0:
        raise BadRequestError("timeouts must be positive")
    return {
        "headers": headers,
        "verify": verify,
        "timeout": httpx.Timeout(timeout, connect=min(connect_timeout, timeout)),
        "follow_redirects": False,
    }
