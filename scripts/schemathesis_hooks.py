"""Schemathesis hooks for scripts/api-schema-check.

- An acquisition may wait up to `wait_ms` (at most 300 s) in a lock's queue, which is the
  documented behaviour, but a bounded run cannot afford it: generated examples reuse
  simple lock names, so a later acquisition of a held lock would sit out its whole wait.
  Every acquisition is sent with `wait_ms` 0; waiting is covered by the Rust tests.
- A schema cannot generate a genuine signed token, so every fenced mutation would stop
  at `invalid_token`. Every other mutation gets a real token for the lock in its path
  (acquired once per lock, as the principal whose key the run sends, if any), so
  admitted writes, stale tokens, preconditions and idempotency replays are checked
  against the document too.
"""

import itertools
from urllib.parse import quote

import requests
import schemathesis

_tokens = {}
_turn = itertools.count()


def _token_for(base, lock, authorization):
    if lock not in _tokens:
        try:
            answer = requests.post(
                f"{base}/v1/locks/{quote(lock, safe='')}/acquire",
                json={"holder": "schemathesis", "ttl_ms": 3_600_000},
                headers={"Authorization": authorization} if authorization else {},
                timeout=5,
            )
            _tokens[lock] = answer.json().get("token") if answer.status_code == 200 else None
        except (requests.RequestException, ValueError):
            _tokens[lock] = None
    return _tokens[lock]


@schemathesis.hook
def before_call(ctx, case, kwargs):
    body = getattr(case, "body", None)
    wait = body.get("wait_ms") if isinstance(body, dict) else None
    if isinstance(wait, int) and not isinstance(wait, bool) and wait > 0:
        body["wait_ms"] = 0

    operation = case.operation
    fenced = operation.path.startswith(("/v1/kv/{lock}/", "/v1/fences/"))
    if not fenced or operation.method.upper() not in ("PUT", "DELETE", "POST"):
        return
    lock = (case.path_parameters or {}).get("lock")
    headers = case.headers if isinstance(case.headers, dict) else None
    if not isinstance(lock, str) or headers is None or "Fencing-Token" not in headers:
        return
    if next(_turn) % 2 == 0:
        # With an auth file the run sends a principal's key: acquire as that principal,
        # so that its writes carry its own token.
        sent = kwargs.get("headers") or {}
        authorization = sent.get("Authorization") or headers.get("Authorization")
        token = _token_for(operation.base_url.rstrip("/"), lock, authorization)
        if token:
            headers["Fencing-Token"] = token
