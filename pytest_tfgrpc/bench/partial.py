"""Results measured before a failure: kept on the error, so the caller records them.

A sweep that fails at its third size has measured two: the error that ends it carries a
result of those two (its settings say what interrupted it), and the driver records that
result on the test before the failure propagates, so JUnit and the results file keep it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import MappingProxyType
from typing import TypeVar

from pytest_tfgrpc.results import BenchmarkResult, SizeResult

_ATTRIBUTE = "tfgrpc_partial_result"
R = TypeVar("R", bound=BenchmarkResult)


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, for a settings value."""
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


@contextmanager
def keeping_partial(
    points: Sequence[SizeResult] | Callable[[], Sequence[SizeResult]],
    build: Callable[[tuple[SizeResult, ...]], R],
) -> Iterator[None]:
    """On an exception inside, attach ``build(points so far)`` to it (if any were measured),
    its settings marked ``interrupted`` with the cause, and let it propagate. ``points`` is
    the list the sweep appends to, or a function that returns the points measured so far."""
    try:
        yield
    except Exception as error:
        measured = tuple(points() if callable(points) else points)
        if measured and partial_result(error) is None:
            result = build(measured)
            settings = MappingProxyType({**result.settings, "interrupted": first_line(error)[:300]})
            setattr(error, _ATTRIBUTE, replace(result, settings=settings))
        raise


def partial_result(error: BaseException) -> BenchmarkResult | None:
    """The result measured before ``error`` ended a sweep, if any."""
    result = getattr(error, _ATTRIBUTE, None)
    return result if isinstance(result, BenchmarkResult) else None
