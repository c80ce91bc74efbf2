"""The error vectors (``vectors/errors.json``, made from the server's own definitions:
``palisade_api::ErrorDetail``): every error answer the server can send, one per code and
shape. Each decodes into its typed class carrying the answer's fields, so a field the
server renames or adds fails here rather than turning a typed error into a generic one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from palisade import ApiError, PalisadeError
from palisade._errors import decode_error

FILE = Path(__file__).resolve().parents[3] / "vectors" / "errors.json"

#: Codes this client reads as the generic ApiError on purpose (nothing to branch on).
GENERIC = {"method_not_allowed", "uri_too_long", "headers_too_large", "key_active"}

_MISSING = object()


def answers() -> List[Dict[str, Any]]:
    data: Dict[str, Any] = json.loads(FILE.read_text(encoding="utf-8"))
    found: List[Dict[str, Any]] = data["answers"]
    return found


def test_every_error_the_server_can_send_decodes_with_its_fields() -> None:
    codes = set()
    for answer in answers():
        error = answer["body"]["error"]
        code = error["code"]
        codes.add(code)
        decoded = decode_error(answer["status"], json.dumps(answer["body"]).encode())
        assert isinstance(decoded, PalisadeError)
        assert (decoded.code, decoded.status) == (code, answer["status"]), answer
        if code in GENERIC:
            assert type(decoded) is ApiError, f"{code} has a class now: update GENERIC"
            continue
        assert type(decoded) is not ApiError, f"{code} decoded as generic: {answer}"
        for name, value in error.items():
            if name in ("code", "message"):
                continue
            carried = getattr(decoded, name, _MISSING)
            # A field the class does not carry (the principal of permission_denied, the
            # key id of not_found) stays in the message; one it carries must match.
            assert carried is _MISSING or carried == value, f"{name} of {answer}"
        # Every field a class carries is the answer's, absent ones included.
        for name in ("high_water", "high_water_seq", "epoch", "seq", "holder", "retry_after_ms",
                     "current_revision", "token_lock", "resource", "limit"):
            if hasattr(decoded, name):
                assert getattr(decoded, name) == error.get(name), f"{name} of {answer}"
    assert {"stale_token", "lock_held", "quota_exceeded", "unavailable"} <= codes
