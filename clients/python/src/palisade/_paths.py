"""Building request paths from caller-supplied names, the same way the Rust client does.

Every byte outside RFC 3986's unreserved set (``A-Z a-z 0-9 - . _ ~``) is sent as
``%XX``. A key keeps ``/`` as its segment separator, so ``a/b c`` is sent as ``a/b%20c``
and the server sees the key it was given. URL parsers remove the dot segments ``.`` and
``..`` before a request leaves, which would silently address another key or endpoint;
such names are refused here with :class:`BadRequestError` instead of being sent altered.
"""

from __future__ import annotations

from typing import List, Sequence, Union
from urllib.parse import quote, urlsplit

from ._errors import BadRequestError

_UNRESERVED = "-._~"  # plus ASCII letters and digits, which quote() never escapes


def _encode(segment: str) -> str:
    try:
        raw = segment.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequestError(f"{segment!r} is not valid Unicode text") from None
    return quote(raw, safe=_UNRESERVED)


def segment(what: str, value: str) -> str:
    """Encodes a name that must be exactly one path segment (a lock name, a lease id)."""
    if not isinstance(value, str):
        raise BadRequestError(f"{what} must be a string, not {type(value).__name__}")
    if value == "":
        raise BadRequestError(f"{what} must not be empty")
    if value in (".", ".."):
        raise BadRequestError(f"{what} {value!r} cannot be sent in a URL path")
    return _encode(value)


def key_path(key: str) -> str:
    """Encodes a key: each ``/``-separated segment on its own, separators kept."""
    if not isinstance(key, str):
        raise BadRequestError(f"key must be a string, not {type(key).__name__}")
    if key == "":
        raise BadRequestError("key must not be empty")
    parts = key.split("/")
    for part in parts:
        if part in (".", ".."):
            raise BadRequestError(
                f"key {key!r} has a {part!r} segment, which URL normalisation would remove"
            )
    return "/".join(_encode(part) for part in parts)


def normalise_base(url: str) -> str:
    """Checks one base URL (http or https, no query or fragment) and drops a trailing
    ``/`` so that paths can be appended as ``{base}/v1/...``."""
    if not isinstance(url, str):
        raise BadRequestError(f"server URL must be a string, not {type(url).__name__}")
    try:
        parts = urlsplit(url)
    except ValueError as e:
        raise BadRequestError(f"invalid server URL {url!r}: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadRequestError(f"server URL {url!r} is not http(s)://host[:port]")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise BadRequestError(f"server URL {url!r} must not have a query or fragment")
    return url.rstrip("/")


def normalise_bases(urls: Union[str, Sequence[str]]) -> List[str]:
    """One or several base URLs, in the order they should be tried."""
    if isinstance(urls, str):
        urls = [urls]
    bases = [normalise_base(u) for u in urls]
    if not bases:
        raise BadRequestError("at least one server URL is needed")
    if len(set(bases)) != len(bases):
        raise BadRequestError("server URLs must not repeat")
    return bases
