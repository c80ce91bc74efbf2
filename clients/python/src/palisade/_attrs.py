"""A read-only attribute that forwards to an attribute of another one, for the many
properties that only read a field of what an object wraps (a lease's grant, a session's
info, a leader's lease, a stream's state)."""

from __future__ import annotations

from typing import Any, Generic, Optional, TypeVar, overload

T = TypeVar("T")


class Forward(Generic[T]):
    """``lock = Forward[str]("_grant")`` in a class body reads ``self._grant.lock``."""

    def __init__(self, via: str, doc: Optional[str] = None) -> None:
        self._via = via
        self._name = ""
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: Optional[type] = None) -> "Forward[T]": ...

    @overload
    def __get__(self, obj: object, owner: Optional[type] = None) -> T: ...

    def __get__(self, obj: Any, owner: Optional[type] = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self._via), self._name)
