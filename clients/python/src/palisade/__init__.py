"""Palisade for Python: the holder's client, and gates for your own databases.

Palisade is a lock service whose fencing tokens are enforced where the writes land. This
package is the Python side of it:

- :class:`Client` (blocking) and :class:`palisade.aio.Client` (asyncio): acquire a lock,
  keep the lease alive in the background, attach the fencing token to every write of the
  fenced store, and get "you are fenced" as :class:`StaleTokenError` (``.high_water``,
  ``.epoch``), not a string::

      from palisade import Client, StaleTokenError, LockHeldError, LeaseLostError

      client = Client("http://127.0.0.1:7700")
      with client.lock("orders", holder="w1", ttl_ms=5000, wait_ms=2000) as lease:
          lease.fence()                              # the barrier (S10)
          lease.kv.put("invoice-17", b"paid")        # fenced write
          lease.kv.get("invoice-17")                 # -> b"paid" (None if absent)

- Recipes: lock values (``value=``, :meth:`Lease.proclaim`), a lock-delay per lock
  (``lock_delay_ms=``), sessions (:meth:`Client.session`: one keepalive for many locks)
  and leader election (:class:`Election`); the same under :mod:`palisade.aio`.
- Live events: :meth:`Client.watch` (one lock) and :meth:`Client.events` (a prefix)
  iterate typed events (:class:`GrantedEvent`, :class:`RejectedEvent`, ...) as the
  server publishes them, reconnecting and resuming with ``Last-Event-ID`` by themselves.
- :mod:`palisade.tokens`: offline verification of tokens with the issuer's public keys,
  byte for byte the Rust verifier's rules.
- :mod:`palisade.gates`: the gate inside PostgreSQL (psycopg 3) and SQLite (``sqlite3``),
  on the same tables and rules as the Rust adapters, so Rust and Python writers can guard
  one database.

What this package does not guarantee:

- **Fencing does not deduplicate retries (S9).** A write that failed with
  :class:`TransportError` (``outcome_unknown=True``) may have been applied; resending it
  with the same token is admitted again. Pass ``idempotency_key=`` (or ``if_match=``)
  when a retry must not apply twice. With several server URLs the client does this for
  its own retries.
- **It does not cancel in-flight requests (S10).** Losing a lease stops renewals, not
  writes already on the wire. A new holder that needs older writes refused before it
  starts calls :meth:`Lease.fence` first.
- **A resource that never checks the token is not protected (S2, S13).** Use the gates,
  or another concurrency control, for writes outside Palisade's store.
- ``lease.lost`` being false is not permission to write: only the resource decides.
- It is not access control (S14): a token proves an ownership generation, not identity.
"""

from ._errors import *  # noqa: F403 - every error class is part of the surface
from ._errors import __all__ as _error_names
from ._protocol import CONNECT_TIMEOUT, LIST_LIMIT, REQUEST_TIMEOUT, WAIT_MARGIN
from ._election import Election, Leader, LeaderInfo, Observer
from ._renewal import Deadlines
from ._events import *  # noqa: F403 - the event classes
from ._events import EventStream
from ._events import __all__ as _event_names
from ._sync import *  # noqa: F403 - the client, its leases, sessions and namespaces
from ._sync import __all__ as _client_names
from ._types import *  # noqa: F403 - the wire types
from ._types import __all__ as _type_names
from ._version import __version__

__all__ = [
    "__version__",
    *_client_names,
    "Deadlines",
    "Election",
    "Leader",
    "LeaderInfo",
    "Observer",
    "EventStream",
    *_event_names,
    *_type_names,
    "REQUEST_TIMEOUT",
    "CONNECT_TIMEOUT",
    "WAIT_MARGIN",
    "LIST_LIMIT",
    *_error_names,
]
