"""Gates: the fencing check inside databases you already run, in your own transaction.

The same two steps as the Rust ``palisade-adapters`` crate, on the same tables, so Rust
and Python writers can guard one database together:

1. verify the token offline (:class:`palisade.tokens.Verifier`, keys from
   ``GET /v1/keys``) and check that it names the lock guarding the data;
2. inside the caller's transaction, read the lock's high-water mark from
   ``palisade_fence``, apply the gate rule (:func:`decide`), and store the new mark, so
   the mark and the caller's writes commit together or not at all (S6).

=================  ==========================  ========================================
module             atomic unit                 concurrent admits serialise on
=================  ==========================  ========================================
``postgres``       the caller's transaction    a row lock on ``palisade_fence``
``mysql``          the caller's transaction    a row lock on ``palisade_fence`` (InnoDB)
``sqlite``         the caller's transaction    ``BEGIN IMMEDIATE`` (one writer)
=================  ==========================  ========================================

Refusals raise the package's error classes with the server's codes:
:class:`MissingTokenError`, :class:`InvalidTokenError` (and its subclasses),
:class:`WrongLockError`, :class:`StaleTokenError` (``.high_water``, ``.epoch``),
:class:`StaleSequenceError`, :class:`ConflictError` (a lost race: retry the whole
transaction), :class:`StorageFailedError` (the database failed).

Every admit takes ``tally=`` (a :class:`palisade.gates.report.GateTally`): it then counts
as admitted or refused by code, for :class:`palisade.gates.report.Reporter` to send to the
server (``POST /v1/gates/report``), so that a refusal here shows in its ``/metrics`` and
events.

Invariants (as in the Rust crate):

- Nothing is read or written before the token verified and named the right lock (S12).
- The comparison, the advance of the mark and the guarded writes commit together (S6).
  A refused admit commits nothing: PostgreSQL's transaction is aborted by the gate
  itself; SQLite's must be rolled back by the caller (``sqlite.transaction`` does).
- The mark never decreases and no epoch below it is admitted (S5), however admits race.

What the gates do not guarantee: they do not deduplicate retries (S9; use the sequence
policy, ``admit_sequenced``, or idempotent writes), they do not cancel in-flight work
(S10; a new holder that needs older ones cut off first makes a barrier admit with no
data), they protect only writes that go through them (S2), they are as durable as your
database (S11), and they are not access control (S14).
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator, Optional, Sequence, Tuple, Type

from .._errors import (
    MissingTokenError,
    StaleSequenceError,
    StaleTokenError,
    StorageFailedError,
    WrongLockError,
)
from ..tokens import Claims, Verifier

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .report import GateTally

__all__ = ["HighWater", "Policy", "Admitted", "decide", "verify_for_lock", "I64_MAX", "migration"]

#: SQL integers are signed 64-bit; epochs and sequence numbers past this are refused
#: rather than wrapped, since a wrapped mark would compare wrongly.
I64_MAX = 2**63 - 1

# Rust's `str::trim` removes the characters with Unicode's White_Space property; Python's
# `str.strip()` removes a few more (U+001C..U+001F). The gate must trim exactly like the
# Rust gate, or a token padded with such a character would pass here and fail there.
_WHITE_SPACE = (
    "\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


class Policy(enum.Enum):
    """How a lock's mark orders the operations it admits."""

    #: Equal or larger epochs are admitted; smaller ones are refused (S8).
    EPOCH = "epoch"
    #: (epoch, seq) must strictly increase with every operation.
    SEQUENCE = "sequence"


@dataclass(frozen=True, order=True)
class HighWater:
    """The largest (epoch, seq) a resource has admitted for one lock; (0, 0) if none."""

    epoch: int = 0
    seq: int = 0


@dataclass(frozen=True)
class Admitted:
    """What an admitted operation may rely on; returned only after the new mark was
    written inside the caller's transaction."""

    #: The verified claims of the token.
    claims: Claims
    #: The mark before this operation.
    previous: HighWater
    #: The mark this operation commits together with the caller's writes.
    high_water: HighWater

    @property
    def epoch(self) -> int:
        return self.claims.epoch


def decide(current: HighWater, policy: Policy, epoch: int, seq: Optional[int]) -> HighWater:
    """The gate rule of ``palisade-core``: the new mark to store, or the refusal.

    Reject ``epoch < current.epoch`` (:class:`StaleTokenError`). Under the epoch policy
    admit and raise the mark to ``(epoch, 0)``; under the sequence policy (epoch, seq)
    must also strictly exceed the mark (:class:`StaleSequenceError`). Correct only when
    the caller reads ``current`` and stores the result in one transaction with the write.
    """
    if epoch < current.epoch:
        raise StaleTokenError(current.epoch, epoch)
    if policy is Policy.EPOCH:
        return HighWater(epoch, 0)
    if seq is None:
        raise ValueError("the sequence policy needs a sequence number")
    if epoch == current.epoch and seq <= current.seq:
        raise StaleSequenceError(current.epoch, current.seq, epoch, seq)
    return HighWater(epoch, seq)


def verify_for_lock(verifier: Verifier, token: Any, lock: str) -> Claims:
    """Checks that ``token`` is present, genuine and names ``lock``. Touches no resource,
    so a refusal here has written nothing.

    ``None`` and blank text are :class:`MissingTokenError`; anything else that is not a
    genuine token (the string ``"2"``, the boolean ``True``) is
    :class:`InvalidTokenError`.
    """
    if token is None:
        raise MissingTokenError("this operation needs a fencing token")
    if isinstance(token, str):
        token = token.strip(_WHITE_SPACE)
        if token == "":
            raise MissingTokenError("this operation needs a fencing token")
    claims = verifier.verify(token)
    if claims.lock != lock:
        raise WrongLockError(claims.lock, lock)
    return claims


def to_sql_int(value: int, what: str) -> int:
    if value > I64_MAX:
        raise StorageFailedError(f"{what} {value} exceeds the SQL integer range")
    return value


def from_sql_mark(epoch: Any, seq: Any) -> HighWater:
    """A stored mark read back; anything but two non-negative integers means the fence
    table was edited by hand, and the gate refuses to guess."""
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (epoch, seq))
    if not ok:
        raise StorageFailedError(f"unreadable fence record: mark ({epoch!r}, {seq!r})")
    return HighWater(epoch, seq)


def migration(name: str) -> str:
    """The SQL of ``crates/adapters/migrations/<name>.sql``, shipped with this package."""
    from importlib import resources

    return resources.files(__package__).joinpath(f"{name}.sql").read_text(encoding="utf-8")


@contextlib.contextmanager
def mapped(driver_error: Type[BaseException], to_gate_error: Callable[[Any], Exception]) -> Iterator[None]:
    """A database driver's failures (``driver_error``) as the gate's errors."""
    try:
        yield
    except driver_error as e:
        raise to_gate_error(e) from e


@contextlib.contextmanager
def committing(conn: Any, begin: Callable[[], None], driver_error: Type[BaseException],
               to_gate_error: Callable[[Any], Exception]) -> Iterator[Any]:
    """The body of a gate's ``transaction()``: ``begin()``, then commit when the block
    succeeds and roll back when it raises (a refused admit included) or the commit fails."""
    begin()
    try:
        yield conn
    except BaseException:
        conn.rollback()
        raise
    try:
        conn.commit()
    except driver_error as e:
        conn.rollback()
        raise to_gate_error(e) from e


@dataclass(frozen=True)
class Step:
    """One SQL statement of an admit; ``fetch`` asks for its first row back."""

    sql: str
    params: Tuple[Any, ...]
    fetch: bool


#: An admit as a sequence of statements: it yields :class:`Step` objects, is sent each
#: statement's first row (or ``None``), and returns the :class:`Admitted` outcome. The
#: decision lives here once; the blocking and asyncio drivers only run the statements.
AdmitSteps = Generator[Step, Optional[Sequence[Any]], Admitted]


@dataclass(frozen=True)
class Ask:
    """One admit as a gate carries it out: the token, the lock it must be for, the policy
    with its sequence number, and the tally that counts the outcome (if any) under the
    gate's kind of ``resource`` (``postgres``, ``mysql``, ``sqlite``)."""

    verifier: Verifier
    token: Any
    lock: str
    policy: Policy
    seq: Optional[int]
    tally: "Optional[GateTally]"
    resource: str


def admit_steps(
    ask: Ask,
    read_mark: Step,
    create_mark: Optional[Step],
    store_mark: Callable[[HighWater], Step],
) -> AdmitSteps:
    """Verify, read the mark (creating its row first if ``create_mark`` is given and the
    row is missing), decide, store. Every gate runs this order. The tally, if any, counts
    the decision: a refusal when it is raised, an admit once the mark is stored."""
    try:
        claims = verify_for_lock(ask.verifier, ask.token, ask.lock)
        policy, seq = ask.policy, ask.seq
        if policy is Policy.SEQUENCE and (
            seq is None or isinstance(seq, bool) or not isinstance(seq, int) or seq < 0
        ):
            raise ValueError(f"the sequence policy needs a sequence number >= 0, not {seq!r}")
        row = yield read_mark
        if row is None and create_mark is not None:
            yield create_mark
            row = yield read_mark
        current = HighWater() if row is None else from_sql_mark(row[0], row[1])
        high_water = decide(current, policy, claims.epoch, seq)
    except Exception as e:
        if ask.tally is not None:
            ask.tally.refused(ask.resource, ask.lock, e)
        raise
    to_sql_int(high_water.epoch, "epoch")
    to_sql_int(high_water.seq, "sequence number")
    yield store_mark(high_water)
    if ask.tally is not None:
        ask.tally.admitted(ask.resource, ask.lock, high_water.epoch)
    return Admitted(claims, current, high_water)


def row_locked_steps(ask: Ask, lock_mark: str, create_mark: str, store_mark: str) -> AdmitSteps:
    """:func:`admit_steps` for a fence table of one row per lock that is read under its row
    lock and created first when missing (the PostgreSQL and MySQL gates): ``lock_mark``
    and ``create_mark`` take the lock's name, ``store_mark`` the new epoch, sequence
    number and the lock's name."""
    lock = ask.lock
    return admit_steps(
        ask,
        read_mark=Step(lock_mark, (lock,), fetch=True),
        create_mark=Step(create_mark, (lock,), fetch=False),
        store_mark=lambda hw: Step(store_mark, (hw.epoch, hw.seq, lock), fetch=False),
    )
