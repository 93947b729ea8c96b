"""The order in which queued units are offered to the scheduler.

``fifo``: first come, first served. ``longest_first`` (the default): the units with the
longest ``runtime`` hint first, the others after them in the order they came (the sort is
stable: without hints it is ``fifo``). Started first, the long units of a wave no longer
end it alone on nodes the short ones left idle: the wave ends together and its nodes go
back sooner (the longest-processing-time rule; docs/manager-policy.md has the figures).
The unit service keeps its queue by :func:`rank`; the elasticity simulation
(``bench/elastic``) places its units with :func:`ordered`, the same rule.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

ORDERS = ("longest_first", "fifo")


def check_order(order: object, where: str = "order") -> str:
    """``order`` if it is one of :data:`ORDERS`; else one line saying what is wrong."""
    from troy.errors import BadParameter
    if order not in ORDERS:
        raise BadParameter(f"{where} {order!r}: expected one of {', '.join(ORDERS)}")
    return str(order)


def rank(runtime: float | None) -> float:
    """The sort key of a runtime hint, longest first (None: counted as 0)."""
    return -(runtime or 0.0)


def longest_first(items: Iterable[T], runtime: Callable[[T], float | None]) -> list[T]:
    """``items`` with the longest ``runtime(item)`` first; ties and items without one
    (None: counted as 0) keep their order."""
    return sorted(items, key=lambda item: rank(runtime(item)))


def ordered(items: Iterable[T], runtime: Callable[[T], float | None], order: str) -> list[T]:
    """``items`` in ``order`` (one of :data:`ORDERS`)."""
    return longest_first(items, runtime) if order == "longest_first" else list(items)
