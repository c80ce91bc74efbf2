"""Offline token verification, byte for byte the rules of the Rust ``palisade-token`` crate.

A token is ``pal1.<payload>.<signature>``: base64url without padding of the claims JSON
``{"l":<lock>,"e":<epoch>,"h":<holder>,"k":<key id>}`` and of an Ed25519 signature over
the ASCII bytes ``pal1.<payload>``. A resource verifies it with the issuer's public keys
(``GET /v1/keys``), with no call to the issuer. :class:`Verifier` accepts exactly the
tokens the Rust ``Verifier`` accepts, checked in the same order so a refusal names the
same reason:

1. at most 4096 bytes; exactly three ``.``-separated parts; the prefix ``pal1``;
2. the payload is strict base64url (no padding, no stray bits) of UTF-8 JSON holding the
   four claims and nothing else, with the right types;
3. the claims' shape: a legal lock name (``[A-Za-z0-9._-]{1,128}``, not ``.``/``..``), an
   epoch from 1 to 2^64-1, a holder of at most 256 bytes;
4. **canonical form**: re-encoding the claims as the issuer does must give the payload
   bytes back exactly, so a re-encoded (but validly signed) variant of a token cannot slip
   past bookkeeping keyed by the token text;
5. the key id names a trusted key; the signature is 64 bytes of strict base64url and
   verifies under libsodium's rules, which like ed25519-dalek's ``verify_strict`` refuse
   small-order and non-canonical points and a non-canonical ``s``.

Verified tokens are cached by their full text, signature included, so the cache cannot
make an edited or forged token pass.

What this module does not do: it does not know whether an epoch is still current (a
genuine token stays genuine forever; staleness is the resource's high-water decision,
see ``palisade.gates``), and it is not access control (S14).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional

import nacl.bindings
import nacl.exceptions
import nacl.signing

from ._errors import BadSignatureError, MalformedTokenError, UnknownKeyError
from ._types import PublicKey

__all__ = [
    "TOKEN_PREFIX",
    "MAX_TOKEN_LEN",
    "MAX_HOLDER_LEN",
    "Claims",
    "KeyRing",
    "Verifier",
    "canonical_payload",
    "key_id_of",
    "valid_lock_name",
]

#: The prefix of every token of this format version.
TOKEN_PREFIX = "pal1"
#: Longest token text accepted (bytes); longer text is refused before any decoding.
MAX_TOKEN_LEN = 4096
#: Longest holder accepted in a token (bytes of UTF-8).
MAX_HOLDER_LEN = 256
_U64_MAX = 2**64 - 1
_LOCK_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_SIGNATURE_LEN = 64


def valid_lock_name(name: str) -> bool:
    """The one definition of a legal lock name: ``[A-Za-z0-9._-]{1,128}``, not ``.``/``..``."""
    return bool(_LOCK_NAME.fullmatch(name)) and name not in (".", "..")


@dataclass(frozen=True)
class Claims:
    """What a token says: the lock, the epoch given to this acquisition, who acquired it
    (free text, for logs), and the id of the key that signed it."""

    lock: str
    epoch: int
    holder: str
    key_id: str


# serde_json's escapes for strings: the two-character forms for these five control
# characters, ``\\u00xx`` (lowercase hex) for the other control characters, and ``\\"``
# and ``\\\\``. Everything else, DEL and all non-ASCII included, is written as UTF-8.
_SHORT_ESCAPES = {
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
    '"': '\\"',
    "\\": "\\\\",
}


def _json_string(text: str) -> str:
    out = ['"']
    for ch in text:
        escaped = _SHORT_ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def canonical_payload(claims: Claims) -> bytes:
    """The claims as the issuer encodes them (compact JSON in field order l, e, h, k).
    Raises ``UnicodeEncodeError`` for text that is not valid Unicode (lone surrogates)."""
    text = (
        '{"l":' + _json_string(claims.lock)
        + ',"e":' + str(claims.epoch)
        + ',"h":' + _json_string(claims.holder)
        + ',"k":' + _json_string(claims.key_id)
        + "}"
    )
    return text.encode("utf-8")


def _b64_decode(text: str, what: str) -> bytes:
    """Strict base64url without padding: the alphabet only, no ``=``, and the unused low
    bits of the last character zero (the Rust ``base64`` crate's default decoder)."""
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise MalformedTokenError(f"{what} is not base64url")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise MalformedTokenError(f"{what} is not base64url") from None
    if _b64_encode(raw) != text:
        raise MalformedTokenError(f"{what} is not base64url")
    return raw


def _b64_encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _reject_duplicates(pairs: List[Any]) -> Dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate field")
    return dict(pairs)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_claims(payload: bytes) -> Claims:
    """The claims object, strictly: exactly the four fields, each of its type."""
    not_claims = MalformedTokenError("payload is not a claims object")
    try:
        value = json.loads(
            payload.decode("utf-8"),
            object_pairs_hook=_reject_duplicates,
            parse_constant=_reject_constant,
        )
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise not_claims from None
    if not isinstance(value, dict) or set(value) != {"l", "e", "h", "k"}:
        raise not_claims
    lock, epoch, holder, key_id = value["l"], value["e"], value["h"], value["k"]
    if not (isinstance(lock, str) and isinstance(holder, str) and isinstance(key_id, str)):
        raise not_claims
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= _U64_MAX:
        raise not_claims
    return Claims(lock, epoch, holder, key_id)


def _check_shape(claims: Claims) -> None:
    if not valid_lock_name(claims.lock):
        raise MalformedTokenError("illegal lock name")
    if claims.epoch == 0:
        raise MalformedTokenError("epoch must be at least 1")
    if len(claims.holder.encode("utf-8", "surrogatepass")) > MAX_HOLDER_LEN:
        raise MalformedTokenError("holder too long")


def key_id_of(public_key: bytes) -> str:
    """A key id: the first 8 bytes of SHA-256 of the 32-byte public key, in hex."""
    return hashlib.sha256(public_key).digest()[:8].hex()


class KeyRing:
    """The issuer public keys a resource trusts, by key id.

    Build it from the issuer's ``GET /v1/keys`` (``KeyRing.from_public_keys(client.keys())``)
    or from raw 32-byte keys. Each key's id is computed from the key itself, never taken
    on trust: a listed ``key_id`` that does not match its key is refused.
    """

    def __init__(self) -> None:
        self._keys: Dict[str, nacl.signing.VerifyKey] = {}

    def add(self, public_key: bytes) -> str:
        """Trusts a raw 32-byte Ed25519 public key; returns its id."""
        if not isinstance(public_key, (bytes, bytearray)) or len(public_key) != 32:
            raise ValueError("an Ed25519 public key is 32 bytes")
        raw = bytes(public_key)
        if not nacl.bindings.crypto_core_ed25519_is_valid_point(raw):
            raise ValueError("not a usable Ed25519 public key (invalid or small-order point)")
        key_id = key_id_of(raw)
        self._keys[key_id] = nacl.signing.VerifyKey(raw)
        return key_id

    def add_listed(self, key: PublicKey) -> str:
        """Trusts one key as ``GET /v1/keys`` lists it."""
        if key.alg != "Ed25519":
            raise ValueError(f"key {key.key_id!r} uses {key.alg!r}; only Ed25519 is supported")
        try:
            raw = _b64_decode(key.public_key, "public key")
        except MalformedTokenError:
            raise ValueError(f"key {key.key_id!r} is not base64url") from None
        key_id = self.add(raw)
        if key_id != key.key_id:
            del self._keys[key_id]
            raise ValueError(f"listed key id {key.key_id!r} does not match its key ({key_id})")
        return key_id

    @classmethod
    def from_public_keys(cls, keys: Iterable[PublicKey]) -> "KeyRing":
        ring = cls()
        for key in keys:
            ring.add_listed(key)
        return ring

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "KeyRing":
        """From the decoded JSON body of ``GET /v1/keys``."""
        return cls.from_public_keys(PublicKey.parse_list(body))

    def get(self, key_id: str) -> Optional[nacl.signing.VerifyKey]:
        return self._keys.get(key_id)

    def key_ids(self) -> List[str]:
        return sorted(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class Verifier:
    """Verifies tokens against a :class:`KeyRing`, remembering up to ``capacity`` that
    passed (an Ed25519 verification costs tens of microseconds; a holder sends the same
    token with every write of its epoch). Thread-safe."""

    def __init__(self, keys: KeyRing, capacity: int = 10_000) -> None:
        self.keys = keys
        self._capacity = max(capacity, 1)
        self._cache: "OrderedDict[str, Claims]" = OrderedDict()
        self._lock = threading.Lock()

    def verify(self, token: str) -> Claims:
        """The claims of a genuine token; raises :class:`MalformedTokenError`,
        :class:`UnknownKeyError` or :class:`BadSignatureError` (all
        :class:`InvalidTokenError`, code ``invalid_token``) otherwise."""
        with self._lock:
            cached = self._cache.get(token) if isinstance(token, str) else None
            if cached is not None:
                self._cache.move_to_end(token)
                return cached
        claims = self.verify_uncached(token)
        with self._lock:
            self._cache[token] = claims
            if len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
        return claims

    def verify_uncached(self, token: str) -> Claims:
        """Verifies without looking at or filling the cache."""
        if not isinstance(token, str):
            raise MalformedTokenError(f"a token is text, not {type(token).__name__}")
        try:
            raw = token.encode("utf-8")
        except UnicodeEncodeError:
            raise MalformedTokenError("token is not valid Unicode text") from None
        if len(raw) > MAX_TOKEN_LEN:
            raise MalformedTokenError("token too long")
        parts = token.split(".")
        if len(parts) != 3:
            raise MalformedTokenError("expected pal1.<payload>.<signature>")
        prefix, payload_b64, sig_b64 = parts
        if prefix != TOKEN_PREFIX:
            raise MalformedTokenError("unknown token version")
        payload = _b64_decode(payload_b64, "payload")
        claims = _parse_claims(payload)
        _check_shape(claims)
        try:
            canonical = canonical_payload(claims)
        except UnicodeEncodeError:
            canonical = b""
        if canonical != payload:
            raise MalformedTokenError("payload is not in canonical form")
        key = self.keys.get(claims.key_id)
        if key is None:
            raise UnknownKeyError(claims.key_id)
        signature = _b64_decode(sig_b64, "signature")
        if len(signature) != _SIGNATURE_LEN:
            raise MalformedTokenError("signature has the wrong length")
        signed = raw[: len(prefix) + 1 + len(payload_b64)]
        try:
            key.verify(signed, signature)
        except nacl.exceptions.BadSignatureError:
            raise BadSignatureError() from None
        return claims
