"""Wire types: frozen mirrors of the JSON bodies in docs/api.md.

Parsing is strict about the fields it reads (a wrong type is a :class:`DecodeError`, never
a guessed value) and ignores fields it does not know, so a newer server can add fields
(lock values, sessions) without breaking this client.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import json
import typing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Tuple, Type, TypeVar, Union

from ._errors import DecodeError

T = TypeVar("T")

__all__ = [
    "Grant",
    "Proclaimed",
    "SessionInfo",
    "SessionLease",
    "KeepaliveInfo",
    "LockStatus",
    "PublicKey",
    "TokenCheck",
    "FenceStatus",
    "Entry",
    "WriteResult",
]


def parse_json(content: bytes) -> Dict[str, Any]:
    """The body as a JSON object, or :class:`DecodeError`."""
    try:
        value = json.loads(content.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise DecodeError(f"answer is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise DecodeError("answer is not a JSON object")
    return value


def _uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


#: Each scalar type a wire field may have: the check of its JSON value, and what a
#: mismatch says the value is not. ``bytes`` travel as standard base64 text.
_CHECKS: Dict[type, Tuple[Callable[[Any], bool], str]] = {
    int: (_uint, "an unsigned integer"),
    str: (lambda v: isinstance(v, str), "a string"),
    bool: (lambda v: isinstance(v, bool), "a boolean"),
    bytes: (lambda v: isinstance(v, str), "a string"),
}


class _Fields:
    """Typed reads from one decoded JSON object; every mismatch is a DecodeError."""

    def __init__(self, what: str, body: Mapping[str, Any]) -> None:
        self.what = what
        self.body = body

    def _bad(self, name: str, expected: str) -> DecodeError:
        return DecodeError(f"{self.what}: field {name!r} is not {expected}")

    def read(self, name: str, kind: type, optional: bool) -> Any:
        """Field ``name`` as a ``kind`` (a key of ``_CHECKS``); ``None`` if it is absent
        or null and ``optional``."""
        value = self.body.get(name)
        if value is None and optional:
            return None
        check, expected = _CHECKS[kind]
        if not check(value):
            raise self._bad(name, expected)
        if kind is bytes:
            try:
                return base64.b64decode(str(value), validate=True)
            except (binascii.Error, ValueError):
                raise self._bad(name, "base64") from None
        return value

    def items(self, name: str) -> List[Any]:
        value = self.body.get(name)
        if isinstance(value, list):
            return value
        raise self._bad(name, "a list")

    def obj(self, value: Any, what: str) -> "_Fields":
        if not isinstance(value, dict):
            raise DecodeError(f"{self.what}: an item of {what} is not an object")
        return _Fields(what, value)


#: Field metadata of a required field that servers before it leave out: read as 0 then.
_ABSENT_IS_0 = {"absent": 0}


@functools.lru_cache(maxsize=None)
def _field_kinds(cls: type) -> Tuple[Tuple[str, type, bool, Any, bool], ...]:
    """Each field of the dataclass ``cls``: its name, its type (for a list, its items'),
    whether it may be absent, its default, and whether it is a list."""
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        origin = typing.get_origin(kind)
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        default = field.metadata.get("absent", field.default)
        optional = origin is Union or default is not dataclasses.MISSING
        out.append((field.name, args[0] if origin in (Union, list) else kind, optional, default, origin is list))
    return tuple(out)


def read_fields(cls: Type[T], what: str, body: Mapping[str, Any], **given: Any) -> T:
    """An instance of the dataclass ``cls`` from the JSON object ``body`` (``what`` names
    it in errors), each field read by its type: a string, an unsigned integer, a boolean,
    base64 bytes, or a list of objects of another such dataclass. An ``Optional`` field
    may be absent or null; a field with a default takes it then. ``given`` fields are
    not read."""
    f = _Fields(what, body)
    values = dict(given)
    kinds: Any = cls
    for name, kind, optional, default, many in _field_kinds(kinds):
        if name in values:
            continue
        if many:
            values[name] = [read_fields(kind, name, f.obj(x, name).body) for x in f.items(name)]
            continue
        value = f.read(name, kind, optional)
        values[name] = default if value is None and default is not dataclasses.MISSING else value
    return cls(**values)


W = TypeVar("W", bound="_Wire")


class _Wire:
    """A wire type read from a JSON object by :func:`read_fields`."""

    #: What the object is called in a :class:`DecodeError`.
    _what: ClassVar[str] = ""

    @classmethod
    def parse(cls: Type[W], body: Mapping[str, Any]) -> W:
        return read_fields(cls, cls._what, body)


@dataclass(frozen=True)
class Grant(_Wire):
    """A granted lease, from ``POST /v1/locks/{lock}/acquire``."""

    _what: ClassVar[str] = "acquire answer"

    lock: str
    holder: str
    #: The ownership generation: 1, 2, 3, ... per lock, never repeated.
    epoch: int
    #: The signed fencing token to attach to every mutation.
    token: str
    lease_id: str
    ttl_ms: int
    #: What the lease advertises (lock values), if anything.
    value: Optional[bytes] = None
    #: The lock-delay that applies if the lease expires (0 from servers before it).
    lock_delay_ms: int = 0
    #: The session the lease belongs to, if any.
    session: Optional[str] = None


@dataclass(frozen=True)
class KeepaliveInfo(_Wire):
    """A renewed lease: it runs ``ttl_ms`` from when the server handled the renewal."""

    _what: ClassVar[str] = "keepalive answer"

    lease_id: str
    lock: str
    epoch: int
    ttl_ms: int


@dataclass(frozen=True)
class LockStatus(_Wire):
    """One lock's status. ``epoch`` is the last epoch issued (0 if never acquired);
    ``holder``, ``lease_id`` and ``remaining_ms`` are ``None`` while the lock is free."""

    _what: ClassVar[str] = "lock status"

    lock: str
    epoch: int
    holder: Optional[str]
    lease_id: Optional[str]
    remaining_ms: Optional[int]
    #: How many acquirers are queued.
    waiters: int
    #: The live lease's own epoch (its token's), equal to ``epoch``; None while the lock
    #: is free, when ``epoch`` is the last one granted (never a reservation's ceiling).
    lease_epoch: Optional[int] = None
    #: What the holder advertises, if anything.
    value: Optional[bytes] = None
    #: The lock-delay that applies if the live lease expires.
    lock_delay_ms: Optional[int] = None
    #: The live lease's session (shown to its owner only).
    session: Optional[str] = None
    #: No epoch above this was granted for the lock: ``epoch``, or more where grants may
    #: have gone unrecorded (after a restart of the embedded issuer, the reservation's
    #: ceiling). None from servers before it.
    epoch_bound: Optional[int] = None

    @staticmethod
    def parse_list(body: Mapping[str, Any]) -> List["LockStatus"]:
        f = _Fields("lock list", body)
        return [LockStatus.parse(f.obj(item, "locks").body) for item in f.items("locks")]

    @staticmethod
    def parse_page(body: Mapping[str, Any]) -> "Tuple[List[LockStatus], Optional[str]]":
        """One page of ``GET /v1/locks``: its locks, and the name to pass as ``after`` for
        the next page (``None`` on the last)."""
        return LockStatus.parse_list(body), _Fields("lock list", body).read("next", str, True)


@dataclass(frozen=True)
class PublicKey:
    """An issuer public key, from ``GET /v1/keys``."""

    key_id: str
    #: ``"Ed25519"`` today.
    alg: str
    #: base64url (no padding) of the 32-byte key.
    public_key: str
    #: ``"active"`` (signs new tokens) or ``"verifying"`` (its tokens still verify); None
    #: from servers before key rotation. :class:`palisade.tokens.KeyRing` trusts no key
    #: listed with any other status (``"retired"``, or one this version does not know).
    status: Optional[str] = None

    @staticmethod
    def parse_list(body: Mapping[str, Any]) -> List["PublicKey"]:
        f = _Fields("key list", body)
        return [read_fields(PublicKey, "keys", f.obj(item, "keys").body) for item in f.items("keys")]


@dataclass(frozen=True)
class TokenCheck(_Wire):
    """The issuer's online verdict on a token (Chubby's CheckSequencer).

    When ``genuine`` is false only ``reason`` is set. ``current and lease_alive`` is a
    snapshot that can be out of date when it arrives: only a resource's high-water check
    at the moment of the write fences.
    """

    _what: ClassVar[str] = "token check"

    genuine: bool
    lock: Optional[str] = None
    epoch: Optional[int] = None
    holder: Optional[str] = None
    key_id: Optional[str] = None
    current_epoch: Optional[int] = None
    current: Optional[bool] = None
    lease_alive: Optional[bool] = None
    reason: Optional[str] = None


@dataclass(frozen=True)
class FenceStatus(_Wire):
    """A namespace's fence state, from ``GET /v1/fences/{lock}``."""

    _what: ClassVar[str] = "fence status"

    lock: str
    #: The largest epoch admitted (0 if nothing ever was).
    high_water: int
    #: The sequence number admitted with ``high_water`` (sequence namespaces).
    seq: int = dataclasses.field(metadata=_ABSENT_IS_0)
    #: ``"epoch"`` or ``"sequence"``.
    policy: str


@dataclass(frozen=True)
class Entry:
    """A stored value with its metadata, from ``GET /v1/kv/{lock}/{key}``."""

    value: bytes
    #: The key's revision (the ``ETag``), for ``if_match``.
    revision: int
    #: The epoch of the holder that wrote this value (``Fencing-Epoch``).
    epoch: int


@dataclass(frozen=True)
class WriteResult:
    """The outcome of an admitted mutation."""

    revision: int
    #: The epoch the write was admitted under.
    epoch: int
    #: True if this is the stored outcome of an earlier request with the same
    #: idempotency key, not a fresh application.
    replayed: bool = False

    @staticmethod
    def parse(body: Mapping[str, Any], replayed: bool) -> "WriteResult":
        return read_fields(WriteResult, "write answer", body, replayed=replayed)


@dataclass(frozen=True)
class Proclaimed(_Wire):
    """A lease's new value, from ``POST /v1/leases/{lease_id}/proclaim``."""

    _what: ClassVar[str] = "proclaim answer"

    lease_id: str
    lock: str
    epoch: int
    value: Optional[bytes]


@dataclass(frozen=True)
class SessionLease:
    """One lease of a session, as :class:`SessionInfo` lists it."""

    lease_id: str
    lock: str
    epoch: int


@dataclass(frozen=True)
class SessionInfo(_Wire):
    """A session: its holder, TTL, time left and live leases (for a close: the leases
    it released)."""

    _what: ClassVar[str] = "session"

    session_id: str
    holder: str
    ttl_ms: int
    remaining_ms: int
    leases: List[SessionLease]

