"""The token test vectors (``vectors/tokens.json``, made by the Rust signer; the format is
``docs/token-format.md``): the Python verifier must reach the outcome every vector
expects. Every vector in the file is run, so a vector added there is run here too; a class
of outcome this test does not know fails it."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from palisade import BadSignatureError, MalformedTokenError, UnknownKeyError
from palisade.tokens import KeyRing, Verifier

FILE = Path(__file__).resolve().parents[3] / "vectors" / "tokens.json"
KNOWN = {"valid", "malformed", "unknown_key", "bad_signature", "wrong_lock"}


def load() -> Dict[str, Any]:
    data: Dict[str, Any] = json.loads(FILE.read_text(encoding="utf-8"))
    return data


def ring_of(data: Dict[str, Any]) -> KeyRing:
    ring = KeyRing()
    for key in data["keys"]:
        if key["trusted"]:
            raw = base64.urlsafe_b64decode(key["public_key"] + "=" * (-len(key["public_key"]) % 4))
            assert ring.add(raw) == key["key_id"]
    return ring


def outcome(verifier: Verifier, token: str, lock: str) -> Tuple[str, Optional[Dict[str, Any]]]:
    try:
        claims = verifier.verify_uncached(token)
    except MalformedTokenError:
        return "malformed", None
    except UnknownKeyError:
        return "unknown_key", None
    except BadSignatureError:
        return "bad_signature", None
    if claims.lock != lock:
        return "wrong_lock", None
    return "valid", {"lock": claims.lock, "epoch": claims.epoch, "holder": claims.holder, "key_id": claims.key_id}


def test_every_class_is_known_here() -> None:
    data = load()
    assert set(data["classes"]) == KNOWN, "a new class of outcome: teach this test (and the verifier) about it"
    assert {v["expect"] for v in data["vectors"]} <= KNOWN


def test_the_python_verifier_agrees_with_every_vector() -> None:
    data = load()
    verifier = Verifier(ring_of(data))
    assert len(data["vectors"]) >= 20
    for v in data["vectors"]:
        got, claims = outcome(verifier, v["token"], v["lock"])
        assert got == v["expect"], v["name"]
        if claims is not None:
            assert claims == v["claims"], v["name"]
