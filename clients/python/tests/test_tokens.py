"""Offline verification (``palisade.tokens``): the Rust verifier's own unit cases, and the
key ring's refusals. The byte-for-byte agreement with Rust is test_cross_language.py."""

from __future__ import annotations

import base64
import json

import nacl.signing
import pytest

from palisade import BadSignatureError, MalformedTokenError, PublicKey, UnknownKeyError
from palisade.tokens import MAX_TOKEN_LEN, Claims, KeyRing, Verifier, canonical_payload, key_id_of

from conftest import Issuer, b64


def test_genuine_token_verifies_with_its_claims(issuer: Issuer) -> None:
    token = issuer.token("orders", 7, "worker-a")
    claims = issuer.verifier.verify(token)
    assert claims == Claims("orders", 7, "worker-a", issuer.key_id)
    assert issuer.verifier.verify(token) == claims  # from the cache, the same answer


def test_edited_epoch_is_a_bad_signature_even_after_the_genuine_one_was_cached(issuer: Issuer) -> None:
    token = issuer.token("orders", 1, "a")
    issuer.verifier.verify(token)
    head, payload, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["e"] = 1_000_000
    forged = f"{head}.{b64(json.dumps(claims, separators=(',', ':')).encode())}.{sig}"
    with pytest.raises(BadSignatureError):
        issuer.verifier.verify(forged)


def test_other_key_is_unknown_and_same_key_id_with_other_key_is_bad_signature(issuer: Issuer) -> None:
    stranger = Issuer()
    with pytest.raises(UnknownKeyError) as unknown:
        issuer.verifier.verify(stranger.token("orders", 1))
    assert unknown.value.key_id == stranger.key_id
    # Claim the trusted key's id, sign with another key.
    payload = canonical_payload(Claims("orders", 9, "m", issuer.key_id))
    signed = "pal1." + b64(payload)
    with pytest.raises(BadSignatureError):
        issuer.verifier.verify(signed + "." + b64(stranger.key.sign(signed.encode()).signature))


def test_longest_legal_claims_fit_the_limit(issuer: Issuer) -> None:
    token = issuer.token("l" * 128, 2**64 - 1, "\u0001" * 256)
    assert len(token) <= MAX_TOKEN_LEN
    assert issuer.verifier.verify(token).epoch == 2**64 - 1


def test_malformed_tokens(issuer: Issuer) -> None:
    good = issuer.token("a", 1, "h")
    for bad in ["", "2", "true", "pal1", "pal1..", "pal2.e30.AAAA", "pal1.!!!.AAAA", "pal1.e30.AAAA",
                good + ".x", "a" * (MAX_TOKEN_LEN + 1), "pal1.\ud800.x"]:
        with pytest.raises(MalformedTokenError):
            issuer.verifier.verify(bad)
    for not_text in [None, 2, True, b"pal1.a.b"]:
        with pytest.raises(MalformedTokenError):
            issuer.verifier.verify(not_text)  # type: ignore[arg-type]


def test_the_cache_is_bounded() -> None:
    issuer = Issuer()
    verifier = Verifier(issuer.verifier.keys, capacity=3)
    for epoch in range(1, 10):
        verifier.verify(issuer.token("orders", epoch))
    assert len(verifier._cache) == 3


def test_key_ring_computes_ids_and_refuses_bad_keys() -> None:
    key = nacl.signing.SigningKey.generate().verify_key
    raw = bytes(key)
    listed = PublicKey(key_id_of(raw), "Ed25519", b64(raw))
    ring = KeyRing.from_public_keys([listed])
    assert ring.key_ids() == [key_id_of(raw)] and len(ring) == 1
    assert KeyRing.from_json({"keys": [{"key_id": listed.key_id, "alg": "Ed25519", "public_key": listed.public_key}]}).key_ids() == ring.key_ids()
    for bad in [
        PublicKey("0000000000000000", "Ed25519", b64(raw)),  # id does not match the key
        PublicKey(listed.key_id, "RSA", b64(raw)),
        PublicKey(listed.key_id, "Ed25519", b64(raw) + "="),
        PublicKey(listed.key_id, "Ed25519", b64(raw[:31])),
    ]:
        with pytest.raises(ValueError):
            KeyRing().add_listed(bad)
    with pytest.raises(ValueError):
        KeyRing().add(bytes(32))  # the identity point has small order
