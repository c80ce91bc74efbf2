"""Wire types: frozen mirrors of the JSON bodies in docs/api.md.

Parsing is strict about the fields it reads (a wrong type is a :class:`DecodeError`, never
a guessed value) and ignores fields it does not know, so a newer server can add fields
(lock values, sessions) without breaking this client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from ._errors import DecodeError

__all__ = [
    "Grant",
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


class _Fields:
    """Typed reads from one decoded JSON object; every mismatch is a DecodeError."""

    def __init__(self, what: str, body: Mapping[str, Any]) -> None:
        self.what = what
        self.body = body

    def _bad(self, name: str, expected: str) -> DecodeError:
        return DecodeError(f"{self.what}: field {name!r} is not {expected}")

    def num(self, name: str) -> int:
        value = self.body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise self._bad(name, "an unsigned integer")

    def opt_num(self, name: str) -> Optional[int]:
        return None if self.body.get(name) is None else self.num(name)

    def text(self, name: str) -> str:
        value = self.body.get(name)
        if isinstance(value, str):
            return value
        raise self._bad(name, "a string")

    def opt_text(self, name: str) -> Optional[str]:
        return None if self.body.get(name) is None else self.text(name)

    def flag(self, name: str) -> bool:
        value = self.body.get(name)
        if isinstance(value, bool):
            return value
        raise self._bad(name, "a boolean")

    def opt_flag(self, name: str) -> Optional[bool]:
        return None if self.body.get(name) is None else self.flag(name)

    def items(self, name: str) -> List[Any]:
        value = self.body.get(name)
        if isinstance(value, list):
            return value
        raise self._bad(name, "a list")

    def obj(self, value: Any, what: str) -> "_Fields":
        if not isinstance(value, dict):
            raise DecodeError(f"{self.what}: an item of {what} is not an object")
        return _Fields(what, value)


@dataclass(frozen=True)
class Grant:
    """A granted lease, from ``POST /v1/locks/{lock}/acquire``."""

    lock: str
    holder: str
    #: The ownership generation: 1, 2, 3, ... per lock, never repeated.
    epoch: int
    #: The signed fencing token to attach to every mutation.
    token: str
    lease_id: str
    ttl_ms: int

    @staticmethod
    def parse(body: Mapping[str, Any]) -> "Grant":
        f = _Fields("acquire answer", body)
        return Grant(
            lock=f.text("lock"),
            holder=f.text("holder"),
            epoch=f.num("epoch"),
            token=f.text("token"),
            lease_id=f.text("lease_id"),
            ttl_ms=f.num("ttl_ms"),
        )


@dataclass(frozen=True)
class KeepaliveInfo:
    """A renewed lease: it runs ``ttl_ms`` from when the server handled the renewal."""

    lease_id: str
    lock: str
    epoch: int
    ttl_ms: int

    @staticmethod
    def parse(body: Mapping[str, Any]) -> "KeepaliveInfo":
        f = _Fields("keepalive answer", body)
        return KeepaliveInfo(f.text("lease_id"), f.text("lock"), f.num("epoch"), f.num("ttl_ms"))


@dataclass(frozen=True)
class LockStatus:
    """One lock's status. ``epoch`` is the last epoch issued (0 if never acquired);
    ``holder``, ``lease_id`` and ``remaining_ms`` are ``None`` while the lock is free."""

    lock: str
    epoch: int
    holder: Optional[str]
    lease_id: Optional[str]
    remaining_ms: Optional[int]
    #: How many acquirers are queued.
    waiters: int

    @staticmethod
    def parse(body: Mapping[str, Any]) -> "LockStatus":
        f = _Fields("lock status", body)
        return LockStatus(
            lock=f.text("lock"),
            epoch=f.num("epoch"),
            holder=f.opt_text("holder"),
            lease_id=f.opt_text("lease_id"),
            remaining_ms=f.opt_num("remaining_ms"),
            waiters=f.num("waiters"),
        )

    @staticmethod
    def parse_list(body: Mapping[str, Any]) -> List["LockStatus"]:
        f = _Fields("lock list", body)
        return [LockStatus.parse(f.obj(item, "locks").body) for item in f.items("locks")]


@dataclass(frozen=True)
class PublicKey:
    """An issuer public key, from ``GET /v1/keys``."""

    key_id: str
    #: ``"Ed25519"`` today.
    alg: str
    #: base64url (no padding) of the 32-byte key.
    public_key: str

    @staticmethod
    def parse_list(body: Mapping[str, Any]) -> List["PublicKey"]:
        f = _Fields("key list", body)
        keys = []
        for item in f.items("keys"):
            k = f.obj(item, "keys")
            keys.append(PublicKey(k.text("key_id"), k.text("alg"), k.text("public_key")))
        return keys


@dataclass(frozen=True)
class TokenCheck:
    """The issuer's online verdict on a token (Chubby's CheckSequencer).

    When ``genuine`` is false only ``reason`` is set. ``current and lease_alive`` is a
    snapshot that can be out of date when it arrives: only a resource's high-water check
    at the moment of the write fences.
    """

    genuine: bool
    lock: Optional[str] = None
    epoch: Optional[int] = None
    holder: Optional[str] = None
    key_id: Optional[str] = None
    current_epoch: Optional[int] = None
    current: Optional[bool] = None
    lease_alive: Optional[bool] = None
    reason: Optional[str] = None

    @staticmethod
    def parse(body: Mapping[str, Any]) -> "TokenCheck":
        f = _Fields("token check", body)
        return TokenCheck(
            genuine=f.flag("genuine"),
            lock=f.opt_text("lock"),
            epoch=f.opt_num("epoch"),
            holder=f.opt_text("holder"),
            key_id=f.opt_text("key_id"),
            current_epoch=f.opt_num("current_epoch"),
            current=f.opt_flag("current"),
            lease_alive=f.opt_flag("lease_alive"),
            reason=f.opt_text("reason"),
        )


@dataclass(frozen=True)
class FenceStatus:
    """A namespace's fence state, from ``GET /v1/fences/{lock}``."""

    lock: str
    #: The largest epoch admitted (0 if nothing ever was).
    high_water: int
    #: The sequence number admitted with ``high_water`` (sequence namespaces).
    seq: int
    #: ``"epoch"`` or ``"sequence"``.
    policy: str

    @staticmethod
    def parse(body: Mapping[str, Any]) -> "FenceStatus":
        f = _Fields("fence status", body)
        return FenceStatus(f.text("lock"), f.num("high_water"), f.opt_num("seq") or 0, f.text("policy"))


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
        f = _Fields("write answer", body)
        return WriteResult(f.num("revision"), f.num("epoch"), replayed)
