"""Driving a generator that does no I/O for a caller that does: the one loop under the
clients' :class:`~palisade._failover.Exchange` and the gates' drivers."""

from __future__ import annotations

from typing import Callable, Generator, Generic, Iterator, Optional, TypeVar

Y = TypeVar("Y")
S = TypeVar("S")
R = TypeVar("R")


class Stepper(Generic[Y, S, R]):
    """Iterate it for what to do next; tell it the outcome with :meth:`got`; ``value``
    is what the generator returned. What the generator raises is raised from here::

        steps = Stepper(gen)
        for todo in steps:
            steps.got(do(todo))
        return steps.value
    """

    def __init__(self, gen: Generator[Y, S, R]) -> None:
        self._gen = gen
        self._next: Optional[Y] = None
        self._step(lambda: next(gen))

    def _step(self, step: Callable[[], Y]) -> None:
        try:
            self._next = step()
        except StopIteration as done:
            self._next = None
            self.value: R = done.value

    def __iter__(self) -> Iterator[Y]:
        while self._next is not None:
            todo, self._next = self._next, None
            yield todo
            if self._next is None and not hasattr(self, "value"):
                raise RuntimeError("a step was taken without telling its outcome (got)")

    def got(self, outcome: S) -> None:
        """What doing the last thing yielded came back with."""
        self._step(lambda: self._gen.send(outcome))
